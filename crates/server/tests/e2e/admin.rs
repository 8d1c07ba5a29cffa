use rdkafka::admin::{
    AdminOptions, AlterConfig, NewPartitions, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::consumer::Consumer;
use rdkafka::types::RDKafkaErrorCode;
use std::time::Duration;

use crate::harness::{admin, consumer, Spate};

fn config_value(r: &rdkafka::admin::ConfigResource, key: &str) -> Option<String> {
    r.entries
        .iter()
        .find(|e| e.name == key)
        .and_then(|e| e.value.clone())
}

#[tokio::test]
async fn topics_are_created_altered_expanded_and_deleted_through_the_admin_client() {
    let spate = Spate::start(&[]);
    let a = admin(&spate.addr);
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));

    // validate_only creates nothing.
    let dry = NewTopic::new("orders", 3, TopicReplication::Fixed(1));
    let r = a
        .create_topics(&[dry], &AdminOptions::new().validate_only(true))
        .await
        .unwrap();
    assert!(r[0].is_ok());
    let md = consumer(&spate.addr, "x", &[], 0)
        .fetch_metadata(None, Duration::from_secs(10))
        .unwrap();
    assert!(md.topics().iter().all(|t| t.name() != "orders"));

    let t = NewTopic::new("orders", 3, TopicReplication::Fixed(1))
        .set("retention.ms", "3600000")
        .set("segment.bytes", "1048576");
    let r = a.create_topics(&[t], &opts).await.unwrap();
    assert!(r[0].is_ok(), "{r:?}");

    let again = NewTopic::new("orders", 1, TopicReplication::Fixed(1));
    let r = a.create_topics(&[again], &opts).await.unwrap();
    assert_eq!(
        r[0].as_ref().unwrap_err().1,
        RDKafkaErrorCode::TopicAlreadyExists
    );

    let described = a
        .describe_configs(&[ResourceSpecifier::Topic("orders")], &opts)
        .await
        .unwrap();
    let res = described[0].as_ref().unwrap();
    assert_eq!(
        config_value(res, "retention.ms").as_deref(),
        Some("3600000")
    );
    assert_eq!(
        config_value(res, "cleanup.policy").as_deref(),
        Some("delete")
    );

    let alter =
        AlterConfig::new(ResourceSpecifier::Topic("orders")).set("retention.bytes", "10485760");
    let r = a.alter_configs(&[alter], &opts).await.unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    let described = a
        .describe_configs(&[ResourceSpecifier::Topic("orders")], &opts)
        .await
        .unwrap();
    let res = described[0].as_ref().unwrap();
    assert_eq!(
        config_value(res, "retention.bytes").as_deref(),
        Some("10485760")
    );
    // AlterConfigs replaces the whole set: retention.ms went back to its default.
    assert_eq!(
        config_value(res, "retention.ms").as_deref(),
        Some("604800000")
    );

    let r = a
        .create_partitions(&[NewPartitions::new("orders", 5)], &opts)
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    let r = a
        .create_partitions(&[NewPartitions::new("orders", 2)], &opts)
        .await
        .unwrap();
    assert_eq!(
        r[0].as_ref().unwrap_err().1,
        RDKafkaErrorCode::InvalidPartitions
    );
    let md = consumer(&spate.addr, "x", &[], 0)
        .fetch_metadata(Some("orders"), Duration::from_secs(10))
        .unwrap();
    assert_eq!(md.topics()[0].partitions().len(), 5);

    let r = a.delete_topics(&["orders"], &opts).await.unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    let r = a.delete_topics(&["orders"], &opts).await.unwrap();
    assert_eq!(
        r[0].as_ref().unwrap_err().1,
        RDKafkaErrorCode::UnknownTopicOrPartition
    );
}

#[tokio::test]
async fn bad_topic_requests_get_kafka_error_codes() {
    let spate = Spate::start(&[]);
    let a = admin(&spate.addr);
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let cases = [
        (
            NewTopic::new("bad/name", 1, TopicReplication::Fixed(1)),
            RDKafkaErrorCode::InvalidTopic,
        ),
        (
            NewTopic::new("zero", 0, TopicReplication::Fixed(1)),
            RDKafkaErrorCode::InvalidPartitions,
        ),
        (
            NewTopic::new("rf3", 1, TopicReplication::Fixed(3)),
            RDKafkaErrorCode::InvalidReplicationFactor,
        ),
        (
            NewTopic::new("cfg", 1, TopicReplication::Fixed(1)).set("retention.ms", "forever"),
            RDKafkaErrorCode::InvalidConfig,
        ),
        (
            NewTopic::new("cfg2", 1, TopicReplication::Fixed(1)).set("no.such.config", "1"),
            RDKafkaErrorCode::InvalidConfig,
        ),
    ];
    for (topic, expected) in cases {
        let name = topic.name.to_string();
        let r = a.create_topics(&[topic], &opts).await.unwrap();
        assert_eq!(r[0].as_ref().unwrap_err().1, expected, "{name}");
    }
    // The rdkafka crate drops per-resource AlterConfigs errors, so ask in raw protocol.
    use kafka_protocol::messages::alter_configs_request::{AlterConfigsResource, AlterableConfig};
    use kafka_protocol::messages::{AlterConfigsRequest, AlterConfigsResponse, ApiKey};
    use kafka_protocol::protocol::StrBytes;
    let mut cfg = AlterableConfig::default();
    cfg.name = StrBytes::from_static_str("retention.ms");
    cfg.value = Some(StrBytes::from_static_str("1"));
    let mut res = AlterConfigsResource::default();
    res.resource_type = 2;
    res.resource_name = StrBytes::from_static_str("missing");
    res.configs = vec![cfg];
    let mut req = AlterConfigsRequest::default();
    req.resources = vec![res];
    let resp: AlterConfigsResponse =
        crate::harness::Raw::connect(&spate.addr).call(ApiKey::AlterConfigs, 2, &req);
    assert_eq!(resp.responses[0].error_code, 3);
}

#[tokio::test]
async fn retention_by_bytes_deletes_old_segments() {
    use rdkafka::producer::FutureRecord;
    let spate = Spate::start(&["--retention-check-interval-ms", "200"]);
    crate::produce_consume::create_topic(
        &spate.addr,
        "small",
        1,
        &[("segment.bytes", "4096"), ("retention.bytes", "8192")],
    )
    .await;
    let p = crate::harness::producer(&spate.addr, &[("linger.ms", "0")]);
    for i in 0..200 {
        p.send(
            FutureRecord::to("small")
                .key("k")
                .payload(&vec![b'x'; 200])
                .timestamp(1_000 + i),
            Duration::from_secs(20),
        )
        .await
        .expect("delivery");
    }
    let c = consumer(&spate.addr, "small", &[0], 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (lo, hi) = c
            .fetch_watermarks("small", 0, Duration::from_secs(10))
            .unwrap();
        assert_eq!(hi, 200);
        if lo > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "retention never advanced the log start"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
