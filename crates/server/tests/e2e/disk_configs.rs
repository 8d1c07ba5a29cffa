//! The disk watermark as Kafka-style broker configs (issue 30): DescribeConfigs of the broker
//! shows `disk.min.free.bytes` and `disk.min.free.percent`, IncrementalAlterConfigs changes
//! them at run time (produce is refused or resumes at once), the change survives a restart,
//! and DELETE goes back to the start-up flags.

use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::{ApiKey, DescribeConfigsRequest, DescribeConfigsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::bad_input::{batch, produce};
use crate::harness::{alter_config, Raw, Spate};
use crate::produce_consume::create_topic;

const BROKER: i8 = 4;
const KAFKA_STORAGE_ERROR: i16 = 56;
const DYNAMIC_BROKER_CONFIG: i8 = 2;
const STATIC_BROKER_CONFIG: i8 = 4;

/// (value, config source, read-only) of broker config `key` as DescribeConfigs of this
/// broker (a standalone one is node 0) shows it.
fn describe(raw: &mut Raw, key: &str) -> (String, i8, bool) {
    let mut res = DescribeConfigsResource::default();
    res.resource_type = BROKER;
    res.resource_name = StrBytes::from_static_str("0");
    res.configuration_keys = None;
    let mut req = DescribeConfigsRequest::default();
    req.resources = vec![res];
    let resp: DescribeConfigsResponse = raw.call(ApiKey::DescribeConfigs, 4, &req);
    let r = &resp.results[0];
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let c = r
        .configs
        .iter()
        .find(|c| c.name.as_str() == key)
        .unwrap_or_else(|| panic!("DescribeConfigs of the broker does not list {key}"));
    (
        c.value.as_ref().map(|v| v.to_string()).unwrap_or_default(),
        c.config_source,
        c.read_only,
    )
}

fn produce_code(raw: &mut Raw, seq: i32) -> i16 {
    let resp: kafka_protocol::messages::ProduceResponse =
        raw.call(ApiKey::Produce, 9, &produce("w", batch(-1, seq, 1), 1));
    resp.responses[0].partition_responses[0].error_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disk_watermark_is_a_broker_config_changed_at_run_time_and_kept_across_a_restart() {
    // A byte watermark no disk meets (1 EiB; no percentage limit): every produce is refused.
    let mut spate = Spate::start(&[
        "--disk-min-free-bytes",
        "1152921504606846976",
        "--disk-min-free-percent",
        "0",
    ]);
    create_topic(&spate.addr, "w", 1, &[]).await;
    let mut raw = Raw::connect(&spate.addr);
    assert_eq!(produce_code(&mut raw, 0), KAFKA_STORAGE_ERROR);
    assert_eq!(
        describe(&mut raw, "disk.min.free.bytes"),
        ("1152921504606846976".into(), STATIC_BROKER_CONFIG, false)
    );
    assert_eq!(
        describe(&mut raw, "disk.min.free.percent"),
        ("0".into(), STATIC_BROKER_CONFIG, false)
    );

    // Bad values and keys are refused with the reason, and change nothing.
    let (code, message) = alter_config(&mut raw, BROKER, "", "disk.min.free.percent", "101");
    assert_eq!(code, 40, "INVALID_CONFIG: {message}");
    let (code, message) = alter_config(&mut raw, BROKER, "", "log.dirs", "/tmp");
    assert_eq!(code, 40, "INVALID_CONFIG: {message}");
    assert!(message.contains("disk.min.free.bytes"), "{message}");

    // No limit: produce goes through at once, no sample interval to wait for.
    let (code, message) = alter_config(&mut raw, BROKER, "", "disk.min.free.bytes", "0");
    assert_eq!(code, 0, "{message}");
    assert_eq!(produce_code(&mut raw, 1), 0);
    assert_eq!(
        describe(&mut raw, "disk.min.free.bytes"),
        ("0".into(), DYNAMIC_BROKER_CONFIG, false)
    );

    // Kept in the data dir: the restarted broker (same flags) still takes produce.
    spate.restart();
    let mut raw = Raw::connect(&spate.addr);
    assert_eq!(
        describe(&mut raw, "disk.min.free.bytes"),
        ("0".into(), DYNAMIC_BROKER_CONFIG, false)
    );
    assert_eq!(produce_code(&mut raw, 2), 0);

    // DELETE goes back to the flag: refused again at once.
    let (code, message) = alter_config(&mut raw, BROKER, "", "disk.min.free.bytes", "");
    assert_eq!(code, 0, "{message}");
    assert_eq!(produce_code(&mut raw, 3), KAFKA_STORAGE_ERROR);
    assert_eq!(
        describe(&mut raw, "disk.min.free.bytes"),
        ("1152921504606846976".into(), STATIC_BROKER_CONFIG, false)
    );
    spate.stop();
}
