//! Client quotas: set and described over the Kafka API, refused with Kafka's codes when bad,
//! kept across restarts and cluster nodes, and enforced: a producer over its byte rate is
//! throttled until its throughput converges to the quota.

use std::time::{Duration, Instant};

use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, ApiKey, DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::producer::FutureRecord;

use crate::cluster::ThreeNodes;
use crate::harness::{producer, Raw, Spate};
use crate::operations::scrape;
use crate::produce_consume::create_topic;

/// A quota entity as (type, name) parts; `None` names the default.
type Entity<'a> = &'a [(&'a str, Option<&'a str>)];

fn alter(
    raw: &mut Raw,
    entity: Entity,
    ops: &[(&str, f64, bool)],
    validate_only: bool,
) -> (i16, Option<String>) {
    let mut e = EntryData::default();
    e.entity = entity
        .iter()
        .map(|(ty, name)| {
            let mut d = EntityData::default();
            d.entity_type = StrBytes::from_string(ty.to_string());
            d.entity_name = name.map(|n| StrBytes::from_string(n.to_string()));
            d
        })
        .collect();
    e.ops = ops
        .iter()
        .map(|(k, v, remove)| {
            let mut o = OpData::default();
            o.key = StrBytes::from_string(k.to_string());
            o.value = *v;
            o.remove = *remove;
            o
        })
        .collect();
    let mut req = AlterClientQuotasRequest::default();
    req.entries = vec![e];
    req.validate_only = validate_only;
    let resp: AlterClientQuotasResponse = raw.call(ApiKey::AlterClientQuotas, 1, &req);
    let r = &resp.entries[0];
    (
        r.error_code,
        r.error_message.as_ref().map(|m| m.to_string()),
    )
}

/// Sets `client_id`'s producer_byte_rate through the broker at `addr`.
pub(crate) fn limit_producer(addr: &str, client_id: &str, bytes_per_second: f64) {
    let mut raw = Raw::connect(addr);
    let (code, why) = alter(
        &mut raw,
        &[("client-id", Some(client_id))],
        &[("producer_byte_rate", bytes_per_second, false)],
        false,
    );
    assert_eq!(code, 0, "{why:?}");
}

/// Every configured (entity, key, value), as "type=name" parts joined by ",".
fn describe_all(raw: &mut Raw) -> Vec<(String, String, f64)> {
    let resp: DescribeClientQuotasResponse = raw.call(
        ApiKey::DescribeClientQuotas,
        1,
        &DescribeClientQuotasRequest::default(),
    );
    assert_eq!(resp.error_code, 0, "{:?}", resp.error_message);
    let mut out = Vec::new();
    for e in resp.entries.unwrap_or_default() {
        let entity = e
            .entity
            .iter()
            .map(|d| {
                format!(
                    "{}={}",
                    d.entity_type.as_str(),
                    d.entity_name.as_ref().map_or("<default>", |n| n.as_str())
                )
            })
            .collect::<Vec<_>>()
            .join(",");
        for v in e.values {
            out.push((entity.clone(), v.key.to_string(), v.value));
        }
    }
    out
}

#[tokio::test]
async fn quotas_are_set_described_refused_when_bad_and_kept_across_a_restart() {
    let mut spate = Spate::start(&[]);
    let mut raw = Raw::connect(&spate.addr);
    let app = [("client-id", Some("app"))];
    assert_eq!(
        alter(
            &mut raw,
            &app,
            &[("producer_byte_rate", 1024.0, false)],
            false
        )
        .0,
        0
    );
    assert_eq!(
        alter(
            &mut raw,
            &[("user", None), ("client-id", None)],
            &[("consumer_byte_rate", 2048.0, false)],
            false
        )
        .0,
        0
    );
    // Bad input: Kafka's INVALID_REQUEST (42) with a reason, and nothing changes.
    let bad: [(Entity, (&str, f64)); 5] = [
        (&app, ("no_such_rate", 1.0)),
        (&app, ("producer_byte_rate", -5.0)),
        (&app, ("producer_byte_rate", 1.5)),
        (
            &[("ip", Some("10.0.0.1")), ("user", Some("u"))],
            ("connection_creation_rate", 1.0),
        ),
        (&[("group", Some("g"))], ("producer_byte_rate", 1.0)),
    ];
    for (entity, (key, value)) in bad {
        let (code, why) = alter(&mut raw, entity, &[(key, value, false)], false);
        assert_eq!(code, 42, "{entity:?} {key}={value}");
        assert!(why.is_some_and(|w| !w.is_empty()));
    }
    // validate_only changes nothing.
    assert_eq!(
        alter(&mut raw, &app, &[("producer_byte_rate", 9.0, false)], true).0,
        0
    );
    let want = vec![
        (
            "client-id=app".to_string(),
            "producer_byte_rate".to_string(),
            1024.0,
        ),
        (
            "user=<default>,client-id=<default>".to_string(),
            "consumer_byte_rate".to_string(),
            2048.0,
        ),
    ];
    assert_eq!(describe_all(&mut raw), want);
    // A filter: the default user, any client id, strictly those two types.
    let mut req = DescribeClientQuotasRequest::default();
    req.components = [("user", 1i8), ("client-id", 2)]
        .iter()
        .map(|(ty, m)| {
            let mut c = ComponentData::default();
            c.entity_type = StrBytes::from_string(ty.to_string());
            c.match_type = *m;
            c
        })
        .collect();
    req.strict = true;
    let resp: DescribeClientQuotasResponse = raw.call(ApiKey::DescribeClientQuotas, 1, &req);
    assert_eq!(resp.error_code, 0);
    assert_eq!(resp.entries.as_ref().map(Vec::len), Some(1));
    // A filter naming a type twice is INVALID_REQUEST.
    req.components.push(req.components[0].clone());
    let resp: DescribeClientQuotasResponse = raw.call(ApiKey::DescribeClientQuotas, 1, &req);
    assert_eq!(resp.error_code, 42);
    drop(raw);
    spate.kill9();
    spate.restart();
    let mut raw = Raw::connect(&spate.addr);
    assert_eq!(
        describe_all(&mut raw),
        want,
        "quotas are on disk before the answer"
    );
    // Removing the last key removes the entity.
    assert_eq!(
        alter(&mut raw, &app, &[("producer_byte_rate", 0.0, true)], false).0,
        0
    );
    assert_eq!(describe_all(&mut raw), want[1..].to_vec());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_over_its_byte_rate_is_throttled_to_the_quota() {
    const QUOTA: f64 = 64.0 * 1024.0;
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "metered", 1, &[]).await;
    limit_producer(&spate.addr, "metered-app", QUOTA);
    // Small batches, so one request is far below a second's quota and the rate can settle.
    let p = producer(
        &spate.addr,
        &[
            ("client.id", "metered-app"),
            ("batch.size", "16384"),
            ("linger.ms", "5"),
        ],
    );
    let value = vec![b'q'; 1024];
    let started = Instant::now();
    let run = Duration::from_secs(20);
    let mut acked = 0usize;
    let mut in_flight = Vec::new();
    // Offered load far above the quota, bounded in count and time.
    for _ in 0..200_000 {
        if started.elapsed() >= run {
            break;
        }
        in_flight.push(p.send(
            FutureRecord::<(), _>::to("metered").payload(&value),
            Duration::from_secs(60),
        ));
        if in_flight.len() >= 64 {
            for d in futures::future::join_all(in_flight.drain(..)).await {
                assert!(
                    d.is_ok(),
                    "a throttled producer is slowed, not refused: {d:?}"
                );
                acked += value.len();
            }
        }
    }
    for d in futures::future::join_all(in_flight.drain(..)).await {
        assert!(d.is_ok(), "{d:?}");
        acked += value.len();
    }
    let rate = acked as f64 / started.elapsed().as_secs_f64();
    eprintln!("produced {rate:.0} B/s against a quota of {QUOTA} B/s");
    // Kafka's quota system test allows the client's rate a 100 % deviation from the quota;
    // without enforcement this producer runs at many megabytes per second.
    assert!(
        rate <= 2.0 * QUOTA,
        "produced {rate:.0} B/s against a quota of {QUOTA} B/s"
    );
    assert!(
        rate >= 0.5 * QUOTA,
        "throttled far below the quota: {rate:.0} B/s against {QUOTA} B/s"
    );
    let m = scrape(&spate.http);
    let throttled = m
        .iter()
        .find(|(k, _)| {
            k.starts_with("spate_quota_throttle_time_ms_total")
                && k.contains("client_id=\"metered-app\"")
        })
        .map(|(_, v)| *v)
        .unwrap_or(0.0);
    assert!(throttled > 0.0, "responses carried throttle times: {m:?}");
}

#[test]
fn a_quota_set_on_one_cluster_node_is_described_and_kept_by_every_node() {
    let c = ThreeNodes::start(&[]);
    c.wait_ready(&[1, 2, 3]);
    let addrs = c.bootstrap();
    let addrs: Vec<&str> = addrs.split(',').collect();
    let mut raw = Raw::connect(addrs[0]);
    let (code, why) = alter(
        &mut raw,
        &[("user", Some("alice"))],
        &[("request_percentage", 150.0, false)],
        false,
    );
    assert_eq!(code, 0, "{why:?}");
    for addr in &addrs {
        let mut raw = Raw::connect(addr);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = describe_all(&mut raw);
            if got
                == [(
                    "user=alice".to_string(),
                    "request_percentage".to_string(),
                    150.0,
                )]
            {
                break;
            }
            assert!(Instant::now() < deadline, "{addr} describes {got:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn a_client_over_its_controller_mutation_rate_gets_throttling_quota_exceeded() {
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::{CreateTopicsRequest, CreateTopicsResponse, TopicName};
    let spate = Spate::start(&[]);
    let mut admin = Raw::connect(&spate.addr);
    // Every raw connection is client id "e2e-raw".
    let (code, _) = alter(
        &mut admin,
        &[("client-id", Some("e2e-raw"))],
        &[("controller_mutation_rate", 1.0, false)],
        false,
    );
    assert_eq!(code, 0);
    let create = |raw: &mut Raw, name: &str| {
        let mut t = CreatableTopic::default();
        t.name = TopicName(StrBytes::from_string(name.to_string()));
        t.num_partitions = 20;
        t.replication_factor = 1;
        let mut req = CreateTopicsRequest::default();
        req.topics = vec![t];
        req.timeout_ms = 10_000;
        let resp: CreateTopicsResponse = raw.call(ApiKey::CreateTopics, 7, &req);
        (resp.topics[0].error_code, resp.throttle_time_ms)
    };
    // Within quota when it arrives: created, and 20 partitions put the client over 1/s.
    assert_eq!(create(&mut admin, "mutations-1").0, 0);
    // The first connection is muted now; another one of the same client is refused.
    let mut other = Raw::connect(&spate.addr);
    let (code, throttle_ms) = create(&mut other, "mutations-2");
    assert_eq!(code, 89, "THROTTLING_QUOTA_EXCEEDED");
    assert!(throttle_ms > 0);
    let (status, body) = crate::harness::http(&spate.http, "GET", "/admin/topics", &[], "");
    assert_eq!(status, 200);
    assert!(
        body.contains("mutations-1") && !body.contains("mutations-2"),
        "{body}"
    );
}

#[test]
fn a_client_over_its_request_percentage_sees_throttle_time_in_its_responses() {
    use kafka_protocol::messages::{MetadataRequest, MetadataResponse};
    let spate = Spate::start(&[]);
    let mut admin = Raw::connect(&spate.addr);
    // Every raw connection is client id "e2e-raw"; a thousandth of a percent of one handler
    // thread is exceeded by any request.
    let (code, why) = alter(
        &mut admin,
        &[("client-id", Some("e2e-raw"))],
        &[("request_percentage", 0.001, false)],
        false,
    );
    assert_eq!(code, 0, "{why:?}");
    let mut seen = 0;
    for _ in 0..200 {
        // A fresh connection each time: the used ones are muted for their throttle.
        let mut raw = Raw::connect(&spate.addr);
        let resp: MetadataResponse = raw.call(ApiKey::Metadata, 12, &MetadataRequest::default());
        if resp.throttle_time_ms > 0 {
            seen = resp.throttle_time_ms;
            break;
        }
    }
    assert!(
        seen > 0,
        "no Metadata response carried the request quota's throttle"
    );
    // Another client is not throttled.
    let other = producer(&spate.addr, &[("client.id", "not-throttled")]);
    let md = rdkafka::producer::Producer::client(&other)
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("metadata for another client");
    assert!(!md.topics().is_empty());
}
