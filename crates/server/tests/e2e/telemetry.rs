//! Client telemetry (KIP-714): a real client (librdkafka) subscribes and pushes its metrics,
//! which /metrics then exports; bad pushes get KIP-714's error codes.

use std::time::{Duration, Instant};

use kafka_protocol::messages::{
    ApiKey, GetTelemetrySubscriptionsRequest, GetTelemetrySubscriptionsResponse,
    PushTelemetryRequest, PushTelemetryResponse,
};
use rdkafka::producer::FutureRecord;

use crate::harness::{http, producer, Raw, Spate};
use crate::produce_consume::create_topic;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_pushes_its_producer_metrics_and_metrics_exports_them() {
    let spate = Spate::start(&["--client-telemetry-push-interval-ms", "1000"]);
    create_topic(&spate.addr, "telemetry", 1, &[]).await;
    let p = producer(&spate.addr, &[("enable.metrics.push", "true")]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut found = String::new();
    while Instant::now() < deadline && found.is_empty() {
        p.send(
            FutureRecord::to("telemetry").key("k").payload("v"),
            Duration::from_secs(10),
        )
        .await
        .expect("delivery");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (_, text) = http(&spate.http, "GET", "/metrics", &[], "");
        found = text
            .lines()
            .filter(|l| l.starts_with("spate_client_org_apache_kafka_producer_"))
            .collect::<Vec<_>>()
            .join("\n");
    }
    assert!(
        found.contains("client_instance_id=\""),
        "no pushed producer metric on /metrics within 30 s"
    );
}

#[test]
fn bad_pushes_get_kip_714_error_codes() {
    let spate = Spate::start(&[]);
    let mut raw = Raw::connect(&spate.addr);
    let sub: GetTelemetrySubscriptionsResponse = raw.call(
        ApiKey::GetTelemetrySubscriptions,
        0,
        &GetTelemetrySubscriptionsRequest::default(),
    );
    assert_eq!(sub.error_code, 0);
    assert!(!sub.client_instance_id.is_nil(), "an id is assigned");
    assert_eq!(sub.accepted_compression_types, vec![0]);
    assert!(!sub.requested_metrics.is_empty());
    let mut push = |subscription_id: i32, compression_type: i8, metrics: &[u8]| {
        let mut req = PushTelemetryRequest::default();
        req.client_instance_id = sub.client_instance_id;
        req.subscription_id = subscription_id;
        req.compression_type = compression_type;
        req.metrics = bytes::Bytes::copy_from_slice(metrics);
        let resp: PushTelemetryResponse = raw.call(ApiKey::PushTelemetry, 0, &req);
        resp.error_code
    };
    assert_eq!(
        push(sub.subscription_id + 1, 0, &[]),
        117,
        "UNKNOWN_SUBSCRIPTION_ID"
    );
    assert_eq!(
        push(sub.subscription_id, 3, &[]),
        76,
        "UNSUPPORTED_COMPRESSION_TYPE"
    );
    assert_eq!(
        push(sub.subscription_id, 0, &[0x0a, 0xff, 0x01]),
        87,
        "INVALID_RECORD"
    );
    assert_eq!(
        push(sub.subscription_id, 0, &[]),
        0,
        "an empty MetricsData is valid"
    );
    assert_eq!(
        push(sub.subscription_id, 0, &[]),
        89,
        "too soon: THROTTLING_QUOTA_EXCEEDED"
    );
}
