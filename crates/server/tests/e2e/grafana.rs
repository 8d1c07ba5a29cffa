//! What Grafana's Elasticsearch data source sends, replayed against spate: the requests are
//! the fixtures in crates/search/tests/fixtures/grafana/ (each names the Grafana source that
//! builds it), and every answer is checked against a brute-force scan of what was produced.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::producer::FutureRecord;
use serde_json::{json, Value};

use crate::harness::{admin, http, producer, try_http_full, Spate};

/// The fixtures' time range (epoch milliseconds) and histogram step.
const FROM: i64 = 1_700_000_000_000;
const TO: i64 = 1_700_003_600_000;
const STEP: i64 = 2_000;
const LEVELS: [&str; 4] = ["error", "warn", "info", "debug"];

/// One produced log line as the scan sees it.
struct Line {
    at: i64,
    level: &'static str,
    latency: f64,
    message: String,
}

fn fixture(name: &str) -> String {
    let path = format!(
        "{}/../search/tests/fixtures/grafana/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

async fn logs_topic(spate: &Spate) -> Vec<Line> {
    let t = NewTopic::new("logs", 2, TopicReplication::Fixed(1))
        .set("search.enabled", "true")
        .set("search.value.format", "json");
    let r = admin(&spate.addr)
        .create_topics(&[t], &AdminOptions::new())
        .await
        .expect("create");
    assert!(r[0].is_ok(), "{r:?}");
    let p = producer(&spate.addr, &[]);
    let mut lines = Vec::new();
    for n in 0..240i64 {
        // Spread over the hour, some outside it (before and after) to be filtered out.
        let at = FROM - 60_000 + n * 15_517;
        let level = LEVELS[(n % 4) as usize];
        let latency = (n % 37) as f64 * 3.5;
        let message = if n % 5 == 0 {
            format!("request {n} failed: timeout after {latency} ms")
        } else {
            format!("request {n} served")
        };
        let value = json!({
            "@timestamp": chrono_rfc3339(at),
            "level": level,
            "latency_ms": latency,
            "message": message,
        })
        .to_string();
        p.send(
            FutureRecord::to("logs")
                .partition((n % 2) as i32)
                .key(&n.to_string())
                .payload(&value)
                .timestamp(at),
            Duration::from_secs(20),
        )
        .await
        .expect("acknowledged");
        lines.push(Line {
            at,
            level,
            latency,
            message,
        });
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, text) = http(&spate.http, "GET", "/logs/_count", &[], "");
        if serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["count"].as_u64())
            == Some(240)
        {
            break;
        }
        assert!(Instant::now() < deadline, "not indexed: {text}");
        std::thread::sleep(Duration::from_millis(50));
    }
    lines
}

/// RFC 3339 in UTC with milliseconds, as log shippers write `@timestamp`.
fn chrono_rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms.rem_euclid(1000)
    )
}

fn msearch(spate: &Spate, name: &str) -> Vec<Value> {
    let (status, text) = http(
        &spate.http,
        "POST",
        "/_msearch?max_concurrent_shard_requests=5",
        &[("Content-Type", "application/x-ndjson")],
        &fixture(name),
    );
    assert_eq!(status, 200, "{name}: {text}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{name}: {text}"));
    let responses = v["responses"].as_array().cloned().unwrap_or_default();
    for (i, r) in responses.iter().enumerate() {
        assert_eq!(r["status"], 200, "{name} search {i}: {r}");
        assert!(r["hits"]["total"].is_object(), "{name} search {i}: {r}");
    }
    responses
}

#[tokio::test]
async fn grafanas_health_check_field_list_and_queries_answer_what_a_scan_says() {
    let spate = Spate::start(&[]);
    let lines = logs_topic(&spate).await;
    let in_range: Vec<&Line> = lines
        .iter()
        .filter(|l| l.at >= FROM && l.at <= TO)
        .collect();

    // Who answers: a version Grafana accepts, and the header the official clients check.
    let (status, head, body) =
        try_http_full(&spate.http, "GET", "/", &[], "", Duration::from_secs(10)).unwrap();
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("x-elastic-product: elasticsearch"),
        "{head}"
    );
    let root: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(root["version"]["number"], "8.15.0");
    assert_ne!(root["version"]["build_flavor"], "serverless");

    // The data source test (Grafana 11.6+).
    let (status, text) = http(
        &spate.http,
        "GET",
        "/_cluster/health?wait_for_status=yellow",
        &[],
        "",
    );
    assert_eq!(status, 200, "{text}");
    let health: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(health["status"], "green", "{health}");

    // The query editor's field list and the time field check of older Grafanas.
    let (status, text) = http(&spate.http, "GET", "/logs/_mapping", &[], "");
    assert_eq!(status, 200, "{text}");
    let mapping: Value = serde_json::from_str(&text).unwrap();
    let props = &mapping["logs"]["mappings"]["properties"];
    assert_eq!(props["@timestamp"]["type"], "date", "{mapping}");
    // Nothing was declared: every field is mapped from the documents, strings as text
    // with a keyword sub-field, numbers as numbers.
    assert_eq!(props["level"]["type"], "text", "{mapping}");
    assert_eq!(
        props["level"]["fields"]["keyword"]["type"], "keyword",
        "{mapping}"
    );
    assert_eq!(props["message"]["type"], "text", "{mapping}");
    assert_eq!(props["latency_ms"]["type"], "double", "{mapping}");
    let (status, text) = http(
        &spate.http,
        "GET",
        "/logs/_field_caps?fields=@timestamp",
        &[],
        "",
    );
    assert_eq!(status, 200, "{text}");
    let caps: Value = serde_json::from_str(&text).unwrap();
    assert!(caps["fields"]["@timestamp"]["date"].is_object(), "{caps}");

    // A metrics query: date_histogram of 2 s buckets over the hour with avg latency.
    let r = msearch(&spate, "msearch_metrics_date_histogram_avg.ndjson");
    let buckets = r[0]["aggregations"]["2"]["buckets"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        buckets.len() as i64,
        (TO - FROM) / STEP + 1,
        "extended_bounds with min_doc_count 0 gives every bucket of the range"
    );
    let mut want: BTreeMap<i64, (u64, f64)> = BTreeMap::new();
    for l in &in_range {
        let e = want.entry(l.at - l.at.rem_euclid(STEP)).or_default();
        e.0 += 1;
        e.1 += l.latency;
    }
    for b in &buckets {
        let key = b["key"].as_i64().expect("a numeric key");
        let (n, sum) = want.get(&key).copied().unwrap_or_default();
        assert_eq!(b["doc_count"].as_u64(), Some(n), "bucket {key}");
        if n > 0 {
            let avg = b["1"]["value"].as_f64().expect("avg");
            assert!((avg - sum / n as f64).abs() < 1e-9, "bucket {key}: {avg}");
        } else {
            assert!(b["1"]["value"].is_null(), "empty bucket {key}: {b}");
        }
    }

    // Terms by level (NOT level:debug), ordered by key descending, then by avg latency.
    let r = msearch(&spate, "msearch_terms.ndjson");
    let terms: Vec<(String, u64)> = r[0]["aggregations"]["3"]["buckets"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|b| {
            (
                b["key"].as_str().unwrap_or_default().to_string(),
                b["doc_count"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let count = |lvl: &str| in_range.iter().filter(|l| l.level == lvl).count() as u64;
    assert_eq!(
        terms,
        vec![
            ("warn".to_string(), count("warn")),
            ("info".to_string(), count("info")),
            ("error".to_string(), count("error")),
        ],
        "{}",
        r[0]
    );

    // A logs query: newest first, message:timeout, the time field as written.
    let r = msearch(&spate, "msearch_logs.ndjson");
    let hits = r[0]["hits"]["hits"].as_array().cloned().unwrap_or_default();
    let mut want: Vec<&Line> = in_range
        .iter()
        .copied()
        .filter(|l| l.message.contains("timeout"))
        .collect();
    want.sort_by_key(|l| std::cmp::Reverse(l.at));
    assert_eq!(hits.len(), want.len(), "{}", r[0]);
    assert_eq!(
        r[0]["hits"]["total"]["value"].as_u64(),
        Some(want.len() as u64)
    );
    for (h, l) in hits.iter().zip(&want) {
        assert_eq!(h["sort"][0].as_i64(), Some(l.at), "{h}");
        // The document as written (what the logs view lists), its time as written, and the
        // time field Grafana asked for as RFC 3339.
        assert_eq!(h["_source"]["message"], l.message.as_str(), "{h}");
        assert_eq!(
            h["_source"]["@timestamp"],
            chrono_rfc3339(l.at).as_str(),
            "{h}"
        );
        assert_eq!(
            h["fields"]["@timestamp"][0],
            chrono_rfc3339(l.at).as_str(),
            "{h}"
        );
        assert_eq!(h["_kafka"]["topic"], "logs", "{h}");
    }

    // Filters of query strings, and per 2 s bucket the sum, max and the latest value.
    let r = msearch(&spate, "msearch_filters_sum_min_max_top_metrics.ndjson");
    let filters = &r[0]["aggregations"]["3"]["buckets"];
    for (bucket, level) in [("errors", "error"), ("level:warn", "warn")] {
        let b = &filters[bucket];
        assert_eq!(b["doc_count"].as_u64(), Some(count(level)), "{bucket}: {b}");
        let mut want: BTreeMap<i64, Vec<&Line>> = BTreeMap::new();
        for l in in_range.iter().filter(|l| l.level == level) {
            want.entry(l.at - l.at.rem_euclid(STEP))
                .or_default()
                .push(l);
        }
        for h in b["2"]["buckets"].as_array().cloned().unwrap_or_default() {
            let key = h["key"].as_i64().expect("key");
            let Some(ls) = want.get(&key) else {
                assert_eq!(h["doc_count"], 0, "{h}");
                continue;
            };
            let sum: f64 = ls.iter().map(|l| l.latency).sum();
            let max = ls.iter().map(|l| l.latency).fold(f64::MIN, f64::max);
            let latest = ls.iter().max_by_key(|l| l.at).map(|l| l.latency);
            assert_eq!(h["1"]["value"].as_f64(), Some(sum), "{h}");
            assert_eq!(h["4"]["value"].as_f64(), Some(max), "{h}");
            assert_eq!(
                h["6"]["top"][0]["metrics"]["latency_ms"].as_f64(),
                latest,
                "{h}"
            );
        }
    }

    // composite (paging through every level) over mapped fields, as dashboards' variables do.
    let (status, text) = http(
        &spate.http,
        "POST",
        "/logs/_search",
        &[("Content-Type", "application/json")],
        r#"{"size":0,"aggs":{"c":{"composite":{"size":10,"sources":[{"level":{"terms":{"field":"level.keyword"}}}]}}}}"#,
    );
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let got: Vec<(String, u64)> = v["aggregations"]["c"]["buckets"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|b| {
            (
                b["key"]["level"].as_str().unwrap_or_default().to_string(),
                b["doc_count"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let mut want: Vec<(String, u64)> = LEVELS
        .iter()
        .map(|l| {
            (
                l.to_string(),
                lines.iter().filter(|x| x.level == *l).count() as u64,
            )
        })
        .collect();
    want.sort();
    assert_eq!(got, want, "{v}");

    // The other panels' shapes answer (status 200 each, checked in `msearch`).
    for name in [
        "msearch_logs_volume.ndjson",
        "msearch_raw_data.ndjson",
        "msearch_percentiles_cardinality_extended_stats.ndjson",
        "msearch_terms_variable.ndjson",
        "msearch_annotations.ndjson",
    ] {
        msearch(&spate, name);
    }
}

#[test]
fn malformed_msearch_bodies_get_elasticsearch_errors_and_the_broker_keeps_serving() {
    let spate = Spate::start(&[]);
    for (body, want) in [
        ("{}\n", 400),
        ("not json\n{}\n", 400),
        ("{\"index\":5}\n{}\n", 400),
    ] {
        let (status, text) = http(
            &spate.http,
            "POST",
            "/_msearch",
            &[("Content-Type", "application/x-ndjson")],
            body,
        );
        assert_eq!(status, want, "{body:?}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(v["error"]["root_cause"][0]["reason"].is_string(), "{v}");
    }
    // A search of a topic that does not exist fails alone, in its place.
    let (status, text) = http(
        &spate.http,
        "POST",
        "/_msearch",
        &[("Content-Type", "application/x-ndjson")],
        "{\"index\":\"nope\"}\n{}\n",
    );
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["responses"][0]["status"], 404, "{v}");
    let (status, _) = http(&spate.http, "GET", "/health", &[], "");
    assert_eq!(status, 200);
}
