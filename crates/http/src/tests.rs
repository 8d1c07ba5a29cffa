use super::*;
use axum::body::Body;
use axum::http::Request as HttpRequest;
use spate_broker::BrokerConfig;
use tower::ServiceExt;

fn ready_state(token: Option<&str>) -> (Arc<HttpState>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (broker, _) = Broker::open(BrokerConfig::new(
        dir.path().join("data"),
        "127.0.0.1",
        9092,
    ))
    .unwrap();
    let state = HttpState::new(
        token.map(str::to_string),
        json!({"listen": "127.0.0.1:9092"}),
    );
    state.set_ready(broker);
    (state, dir)
}

async fn call(
    state: &Arc<HttpState>,
    method: &str,
    uri: &str,
    body: &str,
    token: Option<&str>,
) -> (StatusCode, serde_json::Value) {
    let mut req = HttpRequest::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = router(state.clone())
        .oneshot(req.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    )
}

#[tokio::test]
async fn ready_is_false_until_the_broker_is_handed_over() {
    let state = HttpState::new(None, json!({}));
    assert_eq!(
        call(&state, "GET", "/health", "", None).await.0,
        StatusCode::OK
    );
    let (status, body) = call(&state, "GET", "/ready", "", None).await;
    assert_eq!(
        (status, body["ready"].as_bool()),
        (StatusCode::SERVICE_UNAVAILABLE, Some(false))
    );
    assert_eq!(
        call(&state, "GET", "/admin/topics", "", None).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let (ready, _dir) = ready_state(None);
    assert_eq!(
        call(&ready, "GET", "/ready", "", None).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn topics_round_trip_through_the_admin_api() {
    let (s, _dir) = ready_state(None);
    let (status, t) = call(
        &s,
        "POST",
        "/admin/topics",
        r#"{"name": "orders", "partitions": 3, "configs": {"retention.ms": "60000"}}"#,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{t}");
    assert_eq!(t["partitions"], 3);
    assert_eq!(t["configs"]["retention.ms"]["value"], "60000");
    let (status, list) = call(&s, "GET", "/admin/topics", "", None).await;
    assert_eq!(status, StatusCode::OK);
    let listed: Vec<(&str, bool)> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| (t["name"].as_str().unwrap_or(""), t["internal"] == true))
        .collect();
    assert_eq!(listed, [("__consumer_offsets", true), ("orders", false)]);
    let (status, refused) = call(&s, "DELETE", "/admin/topics/__consumer_offsets", "", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    let (status, c) = call(
        &s,
        "PATCH",
        "/admin/topics/orders/configs",
        r#"{"retention.ms": null, "segment.ms": "3600000"}"#,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{c}");
    assert_eq!(c["retention.ms"]["source"], "default");
    assert_eq!(c["segment.ms"]["value"], "3600000");
    let (status, t) = call(
        &s,
        "POST",
        "/admin/topics/orders/partitions",
        r#"{"count": 5}"#,
        None,
    )
    .await;
    assert_eq!(
        (status, t["partitions"].as_i64()),
        (StatusCode::OK, Some(5))
    );
    let (status, t) = call(&s, "GET", "/admin/topics/orders", "", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(t["partition_details"][4]["log_end_offset"], 0);
    assert_eq!(
        call(&s, "DELETE", "/admin/topics/orders", "", None).await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        call(&s, "GET", "/admin/topics/orders", "", None).await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn bad_admin_requests_get_json_errors() {
    let (s, _dir) = ready_state(None);
    for (body, code) in [
        ("{not json", "INVALID_BODY"),
        (r#"{"name": "x", "partitionz": 1}"#, "INVALID_BODY"),
        (r#"{"name": "bad/name"}"#, "INVALID_TOPIC_EXCEPTION"),
        (r#"{"name": "x", "partitions": 0}"#, "INVALID_PARTITIONS"),
        (
            r#"{"name": "x", "configs": {"retention.ms": "soon"}}"#,
            "INVALID_CONFIG",
        ),
    ] {
        let (status, e) = call(&s, "POST", "/admin/topics", body, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {e}");
        assert_eq!(e["error"]["code"], code, "{body}");
        assert!(e["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    call(&s, "POST", "/admin/topics", r#"{"name": "dup"}"#, None).await;
    let (status, e) = call(&s, "POST", "/admin/topics", r#"{"name": "dup"}"#, None).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("TOPIC_ALREADY_EXISTS"))
    );
    let (status, e) = call(&s, "GET", "/admin/groups/nobody", "", None).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("GROUP_ID_NOT_FOUND"))
    );
    assert_eq!(
        call(&s, "GET", "/nowhere", "", None).await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn the_token_guards_mutations_but_not_reads() {
    let (s, _dir) = ready_state(Some("s3cret"));
    let (status, e) = call(&s, "POST", "/admin/topics", r#"{"name": "t"}"#, None).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("UNAUTHORIZED"))
    );
    assert_eq!(
        call(
            &s,
            "POST",
            "/admin/topics",
            r#"{"name": "t"}"#,
            Some("wrong")
        )
        .await
        .0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(
            &s,
            "POST",
            "/admin/topics",
            r#"{"name": "t"}"#,
            Some("s3cret")
        )
        .await
        .0,
        StatusCode::CREATED
    );
    assert_eq!(
        call(&s, "GET", "/admin/topics", "", None).await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&s, "DELETE", "/admin/topics/t", "", None).await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn metrics_render_as_openmetrics_text() {
    let (s, _dir) = ready_state(None);
    call(
        &s,
        "POST",
        "/admin/topics",
        r#"{"name": "m", "partitions": 2}"#,
        None,
    )
    .await;
    let resp = router(s.clone())
        .oneshot(
            HttpRequest::builder()
                .uri("/metrics")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let text = String::from_utf8(
        axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap()
            .to_vec(),
    )
    .unwrap();
    assert!(text.contains("spate_partition_log_end_offset{topic=\"m\",partition=\"1\"} 0"));
    // OpenMetrics names a counter family without `_total`; its samples keep it.
    assert!(text.contains("# TYPE spate_topic_records_in counter"));
    assert!(text.contains("spate_topic_records_in_total{topic=\"m\"} 0"));
    assert!(text.ends_with("# EOF\n"));
    assert_eq!(text.matches("# EOF").count(), 1);
    assert!(text.contains("process_resident_memory_bytes"));
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let value = line.rsplit(' ').next().unwrap();
        assert!(
            value.parse::<f64>().is_ok() || value == "+Inf",
            "bad sample line: {line}"
        );
    }
}

#[tokio::test]
async fn admin_paths_ending_like_search_paths_still_need_the_token() {
    let (state, _dir) = ready_state(Some("secret"));
    // A topic or group named like a search endpoint must not open the admin API.
    for (method, uri) in [
        ("DELETE", "/admin/topics/_search"),
        ("DELETE", "/admin/groups/_count"),
        ("POST", "/admin/topics/_msearch"),
        ("DELETE", "/admin/topics/_field_caps"),
    ] {
        let (status, _) = call(&state, method, uri, "", None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {uri}");
    }
    // Searches themselves stay open to POST without the token.
    let (status, _) = call(&state, "POST", "/_msearch", "{}\n{}\n", None).await;
    assert_ne!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_schema_registry_path_reaches_the_registry_routes_without_the_token_or_outer_params() {
    let (state, _dir) = ready_state(Some("secret"));
    let (status, body) = call(&state, "GET", "/admin/schema-registry", "", None).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"enabled": false})));
    let (status, _) = call(
        &state,
        "POST",
        "/_spate/schema-registry/subjects/s/versions",
        "",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    state.set_schema_registry(SchemaRegistry {
        api: Router::new().route(
            "/subjects/{subject}/versions",
            axum::routing::post(
                |axum::extract::Path(s): axum::extract::Path<String>,
                 q: axum::extract::RawQuery| async move {
                    Json(json!({"subject": s, "query": q.0}))
                },
            ),
        ),
        status: Box::new(|| json!({"enabled": true, "leader": true})),
    });
    // A mutation without the admin token: the registry checks its callers itself.
    let (status, body) = call(
        &state,
        "POST",
        "/_spate/schema-registry/subjects/s-value/versions?normalize=true",
        "",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"subject": "s-value", "query": "normalize=true"})
    );
    let (_, body) = call(&state, "GET", "/admin/broker", "", None).await;
    assert_eq!(
        body["schema_registry"],
        json!({"enabled": true, "leader": true})
    );
}
