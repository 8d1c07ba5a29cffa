//! KIP-932 share groups through raw ShareGroupHeartbeat / ShareFetch / ShareAcknowledge
//! requests: RELEASE, REJECT, the delivery count limit and lock expiry as a member sees them,
//! Kafka's error codes for bad input, and share state that survives kill -9.

use std::time::Duration;

use kafka_protocol::messages::share_acknowledge_request::{
    AcknowledgePartition, AcknowledgeTopic, AcknowledgementBatch as AckBatchAck,
};
use kafka_protocol::messages::share_fetch_request::{
    AcknowledgementBatch, FetchPartition, FetchTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rdkafka::producer::FutureRecord;
use spate_protocol::ResponseError;
use uuid::Uuid;

use crate::harness::{producer, Raw, Spate};
use crate::produce_consume::create_topic;

const ACCEPT: i8 = 1;
const RELEASE: i8 = 2;
const REJECT: i8 = 3;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A broker whose share-partitions start at the log start and whose locks last `lock_ms`.
fn start(lock_ms: u64) -> Spate {
    Spate::start_with_env(
        &[],
        &[
            ("SPATE_SHARE_AUTO_OFFSET_RESET", "earliest"),
            (
                "SPATE_GROUP_SHARE_RECORD_LOCK_DURATION_MS",
                &lock_ms.to_string(),
            ),
        ],
    )
}

async fn produce(addr: &str, topic: &str, n: usize) {
    let p = producer(addr, &[]);
    for i in 0..n {
        let v = format!("v-{i}");
        p.send(
            FutureRecord::<(), _>::to(topic).partition(0).payload(&v),
            Duration::from_secs(10),
        )
        .await
        .expect("produce");
    }
}

fn heartbeat(
    raw: &mut Raw,
    group: &str,
    member: &str,
    epoch: i32,
    topics: Option<&[&str]>,
) -> ShareGroupHeartbeatResponse {
    let mut r = ShareGroupHeartbeatRequest::default();
    r.group_id = s(group).into();
    r.member_id = s(member);
    r.member_epoch = epoch;
    r.subscribed_topic_names = topics.map(|ts| ts.iter().map(|t| s(t).into()).collect());
    raw.call(ApiKey::ShareGroupHeartbeat, 1, &r)
}

/// A member of a share group on one topic, with its share session.
struct Member {
    raw: Raw,
    group: String,
    id: String,
    epoch: i32,
    session: i32,
    /// Which topic (its id) the member fetches.
    topic: FetchTopic,
}

impl Member {
    /// Joins `group` subscribed to `topic`; returns once it is assigned partition 0.
    fn join(addr: &str, group: &str, id: &str, topic: &str) -> Self {
        let mut raw = Raw::connect(addr);
        let resp = heartbeat(&mut raw, group, id, 0, Some(&[topic]));
        assert_eq!(resp.error_code, 0, "join: {:?}", resp.error_message);
        let mut epoch = resp.member_epoch;
        let mut assignment = resp.assignment;
        for _ in 0..50 {
            if assignment
                .as_ref()
                .is_some_and(|a| !a.topic_partitions.is_empty())
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
            let r = heartbeat(&mut raw, group, id, epoch, None);
            assert_eq!(r.error_code, 0, "heartbeat: {:?}", r.error_message);
            epoch = r.member_epoch;
            assignment = r.assignment.or(assignment);
        }
        let mut topic = FetchTopic::default();
        topic.topic_id = assignment.expect("an assignment").topic_partitions[0].topic_id;
        Self {
            raw,
            group: group.into(),
            id: id.into(),
            epoch,
            session: 0,
            topic,
        }
    }

    fn request(&self, wait_ms: i32, acks: &[(i64, i64, i8)]) -> ShareFetchRequest {
        let mut r = ShareFetchRequest::default();
        r.group_id = Some(s(&self.group).into());
        r.member_id = Some(s(&self.id));
        r.share_session_epoch = self.session;
        r.max_wait_ms = wait_ms;
        r.min_bytes = 1;
        r.max_bytes = 1 << 20;
        r.max_records = 500;
        r.batch_size = 500;
        let mut p = FetchPartition::default();
        p.partition_index = 0;
        p.acknowledgement_batches = acks
            .iter()
            .map(|(first, last, t)| {
                let mut b = AcknowledgementBatch::default();
                b.first_offset = *first;
                b.last_offset = *last;
                b.acknowledge_types = vec![*t];
                b
            })
            .collect();
        let mut t = self.topic.clone();
        t.partitions = vec![p];
        r.topics = vec![t];
        r
    }

    /// ShareFetch of partition 0 with these acknowledgements; the session epoch advances.
    fn fetch(&mut self, wait_ms: i32, acks: &[(i64, i64, i8)]) -> ShareFetchResponse {
        let req = self.request(wait_ms, acks);
        let resp: ShareFetchResponse = self.raw.call(ApiKey::ShareFetch, 1, &req);
        if resp.error_code == 0 {
            self.session += 1;
        }
        resp
    }

    /// ShareAcknowledge of partition 0; returns the partition's error code.
    fn acknowledge(&mut self, acks: &[(i64, i64, i8)]) -> i16 {
        let mut r = ShareAcknowledgeRequest::default();
        r.group_id = Some(s(&self.group).into());
        r.member_id = Some(s(&self.id));
        r.share_session_epoch = self.session;
        let mut p = AcknowledgePartition::default();
        p.partition_index = 0;
        p.acknowledgement_batches = acks
            .iter()
            .map(|(first, last, t)| {
                let mut b = AckBatchAck::default();
                b.first_offset = *first;
                b.last_offset = *last;
                b.acknowledge_types = vec![*t];
                b
            })
            .collect();
        let mut t = AcknowledgeTopic::default();
        t.topic_id = self.topic.topic_id;
        t.partitions = vec![p];
        r.topics = vec![t];
        let resp: ShareAcknowledgeResponse = self.raw.call(ApiKey::ShareAcknowledge, 1, &r);
        assert_eq!(resp.error_code, 0, "{:?}", resp.error_message);
        self.session += 1;
        resp.responses[0].partitions[0].error_code
    }
}

/// The acquired (first, last, delivery count) ranges of partition 0.
fn acquired(resp: &ShareFetchResponse) -> Vec<(i64, i64, i16)> {
    assert_eq!(resp.error_code, 0, "{:?}", resp.error_message);
    resp.responses
        .iter()
        .flat_map(|t| &t.partitions)
        .flat_map(|p| &p.acquired_records)
        .map(|a| (a.first_offset, a.last_offset, a.delivery_count))
        .collect()
}

fn ack_error(resp: &ShareFetchResponse) -> i16 {
    resp.responses[0].partitions[0].acknowledge_error_code
}

#[tokio::test]
async fn share_fetch_hands_out_records_once_and_accept_completes_them() {
    let spate = start(30_000);
    create_topic(&spate.addr, "sq-accept", 1, &[]).await;
    produce(&spate.addr, "sq-accept", 5).await;
    let mut a = Member::join(&spate.addr, "g-accept", "a", "sq-accept");
    let mut b = Member::join(&spate.addr, "g-accept", "b", "sq-accept");
    let got = a.fetch(5_000, &[]);
    assert_eq!(acquired(&got), vec![(0, 4, 1)]);
    let records = got.responses[0].partitions[0]
        .records
        .clone()
        .unwrap_or_default();
    assert!(
        !records.is_empty(),
        "the acquired records come with their batches"
    );
    // Locked by a: b gets nothing.
    assert!(acquired(&b.fetch(300, &[])).is_empty());
    assert_eq!(a.acknowledge(&[(0, 4, ACCEPT)]), 0);
    assert!(
        acquired(&b.fetch(300, &[])).is_empty(),
        "accepted records are done"
    );
    produce(&spate.addr, "sq-accept", 1).await;
    assert_eq!(acquired(&b.fetch(5_000, &[])), vec![(5, 5, 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_fetch_waits_for_records_produced_during_its_max_wait() {
    let spate = start(30_000);
    create_topic(&spate.addr, "sq-wait", 1, &[]).await;
    let mut a = Member::join(&spate.addr, "g-wait", "a", "sq-wait");
    assert!(acquired(&a.fetch(0, &[])).is_empty());
    let addr = spate.addr.clone();
    let producing = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        produce(&addr, "sq-wait", 1).await;
    });
    let started = std::time::Instant::now();
    let got = tokio::task::block_in_place(|| a.fetch(10_000, &[]));
    producing.await.expect("producer task");
    assert_eq!(acquired(&got), vec![(0, 0, 1)]);
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "answered when the record came"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_redelivers_with_the_delivery_count_plus_one_and_reject_archives() {
    let spate = start(30_000);
    create_topic(&spate.addr, "sq-release", 1, &[]).await;
    produce(&spate.addr, "sq-release", 2).await;
    let mut a = Member::join(&spate.addr, "g-release", "a", "sq-release");
    assert_eq!(acquired(&a.fetch(5_000, &[])), vec![(0, 1, 1)]);
    // Piggybacked on the next fetch: 0 rejected, 1 released; only 1 comes back, delivered twice.
    let again = a.fetch(5_000, &[(0, 0, REJECT), (1, 1, RELEASE)]);
    assert_eq!(ack_error(&again), 0);
    assert_eq!(acquired(&again), vec![(1, 1, 2)]);
    // /metrics counts them for the group.
    let metric = |name: &str| -> f64 {
        let (_, body) = crate::harness::http(&spate.http, "GET", "/metrics", &[], "");
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{group=\"g-release\"}} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} for g-release in /metrics"))
    };
    assert_eq!(metric("spate_share_group_redeliveries_total"), 1.0);
    assert_eq!(metric("spate_share_group_records_archived_total"), 1.0);
    assert_eq!(metric("spate_share_group_records_acquired"), 1.0);
    assert_eq!(metric("spate_share_group_records_accepted_total"), 0.0);
    assert_eq!(a.acknowledge(&[(1, 1, ACCEPT)]), 0);
    assert_eq!(metric("spate_share_group_records_accepted_total"), 1.0);
    assert_eq!(metric("spate_share_group_records_acquired"), 0.0);
}

/// Record 0 is delivered `limit` times, released each time, and then never again.
fn release_until_archived(a: &mut Member, limit: i16) {
    for delivery in 1..=limit {
        assert_eq!(acquired(&a.fetch(5_000, &[])), vec![(0, 0, delivery)]);
        assert_eq!(a.acknowledge(&[(0, 0, RELEASE)]), 0);
    }
    assert!(
        acquired(&a.fetch(300, &[])).is_empty(),
        "archived after {limit} deliveries"
    );
}

#[tokio::test]
async fn the_delivery_count_limit_archives_a_poison_record() {
    let spate = start(30_000);
    create_topic(&spate.addr, "sq-poison", 1, &[]).await;
    produce(&spate.addr, "sq-poison", 1).await;
    let mut a = Member::join(&spate.addr, "g-poison", "a", "sq-poison");
    // Kafka's default group.share.delivery.count.limit is 5.
    release_until_archived(&mut a, 5);
    produce(&spate.addr, "sq-poison", 1).await;
    assert_eq!(acquired(&a.fetch(5_000, &[])), vec![(1, 1, 1)]);
}

#[tokio::test]
async fn the_group_share_flags_set_the_delivery_limit_and_describe_configs_shows_them() {
    let spate = Spate::start_with_env(
        &[
            "--group-share-delivery-count-limit",
            "2",
            "--group-share-record-lock-duration-ms",
            "20000",
        ],
        &[("SPATE_SHARE_AUTO_OFFSET_RESET", "earliest")],
    );
    create_topic(&spate.addr, "sq-flags", 1, &[]).await;
    produce(&spate.addr, "sq-flags", 1).await;
    let mut a = Member::join(&spate.addr, "g-flags", "a", "sq-flags");
    release_until_archived(&mut a, 2);
    let mut raw = Raw::connect(&spate.addr);
    let configs = describe_configs(&mut raw, 4, "0");
    let value = |name: &str| {
        configs
            .iter()
            .find(|(n, ..)| n == name)
            .map(|(_, v, source)| (v.clone(), *source))
            .unwrap_or_else(|| panic!("{name} not described"))
    };
    const STATIC_BROKER_CONFIG: i8 = 4;
    assert_eq!(
        value("group.share.delivery.count.limit"),
        ("2".into(), STATIC_BROKER_CONFIG)
    );
    assert_eq!(
        value("group.share.record.lock.duration.ms"),
        ("20000".into(), STATIC_BROKER_CONFIG)
    );
    assert_eq!(value("group.share.session.timeout.ms").0, "45000");
    assert_eq!(value("group.share.max.size").0, "200");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lock_redelivers_to_another_member_and_the_late_ack_is_refused() {
    let spate = start(1_000);
    create_topic(&spate.addr, "sq-expiry", 1, &[]).await;
    produce(&spate.addr, "sq-expiry", 3).await;
    let mut a = Member::join(&spate.addr, "g-expiry", "a", "sq-expiry");
    let mut b = Member::join(&spate.addr, "g-expiry", "b", "sq-expiry");
    assert_eq!(acquired(&a.fetch(5_000, &[])), vec![(0, 2, 1)]);
    // b's fetch parks until a's lock runs out (1 s), then gets the records.
    let got = tokio::task::block_in_place(|| b.fetch(10_000, &[]));
    assert_eq!(acquired(&got), vec![(0, 2, 2)]);
    assert_eq!(
        a.acknowledge(&[(0, 2, ACCEPT)]),
        ResponseError::InvalidRecordState.code()
    );
}

#[tokio::test]
async fn acknowledging_a_record_not_acquired_is_invalid_record_state() {
    let spate = start(30_000);
    create_topic(&spate.addr, "sq-notacq", 1, &[]).await;
    produce(&spate.addr, "sq-notacq", 2).await;
    let mut a = Member::join(&spate.addr, "g-notacq", "a", "sq-notacq");
    let mut b = Member::join(&spate.addr, "g-notacq", "b", "sq-notacq");
    assert_eq!(acquired(&a.fetch(5_000, &[])), vec![(0, 1, 1)]);
    assert!(acquired(&b.fetch(0, &[])).is_empty());
    // Held by a, not b.
    assert_eq!(
        b.acknowledge(&[(0, 0, ACCEPT)]),
        ResponseError::InvalidRecordState.code()
    );
    // Past anything ever acquired.
    assert_eq!(
        a.acknowledge(&[(7, 7, ACCEPT)]),
        ResponseError::InvalidRequest.code()
    );
    // Nothing of a refused request is applied: a still holds 0 and 1 and can accept them.
    assert_eq!(a.acknowledge(&[(0, 1, ACCEPT)]), 0);
}

#[tokio::test]
async fn wrong_member_epochs_and_unknown_members_are_refused() {
    let spate = start(30_000);
    create_topic(&spate.addr, "sq-epochs", 1, &[]).await;
    let mut a = Member::join(&spate.addr, "g-epochs", "a", "sq-epochs");
    let mut raw = Raw::connect(&spate.addr);
    let wrong = heartbeat(&mut raw, "g-epochs", "a", a.epoch + 5, None);
    assert_eq!(wrong.error_code, ResponseError::FencedMemberEpoch.code());
    let unknown = heartbeat(&mut raw, "g-epochs", "nobody", 3, None);
    assert_eq!(unknown.error_code, ResponseError::UnknownMemberId.code());
    // ShareFetch from a member that never joined.
    let mut req = a.request(0, &[]);
    req.member_id = Some(s("nobody"));
    let resp: ShareFetchResponse = raw.call(ApiKey::ShareFetch, 1, &req);
    assert_eq!(resp.error_code, ResponseError::UnknownMemberId.code());
    // Share session epochs: a session must be opened with 0 and followed one by one.
    let mut req = a.request(0, &[]);
    req.share_session_epoch = 3;
    let resp: ShareFetchResponse = raw.call(ApiKey::ShareFetch, 1, &req);
    assert_eq!(resp.error_code, ResponseError::ShareSessionNotFound.code());
    assert_eq!(a.fetch(0, &[]).error_code, 0);
    let mut req = a.request(0, &[]);
    req.share_session_epoch = 7;
    let resp: ShareFetchResponse = raw.call(ApiKey::ShareFetch, 1, &req);
    assert_eq!(
        resp.error_code,
        ResponseError::InvalidShareSessionEpoch.code()
    );
    assert_eq!(
        a.fetch(0, &[]).error_code,
        0,
        "the session still expects epoch 1"
    );
}

#[tokio::test]
async fn a_share_fetch_for_a_topic_not_subscribed_is_refused() {
    let spate = start(30_000);
    create_topic(&spate.addr, "sq-mine", 1, &[]).await;
    create_topic(&spate.addr, "sq-other", 1, &[]).await;
    produce(&spate.addr, "sq-other", 1).await;
    let other = Member::join(&spate.addr, "g-other", "x", "sq-other").topic;
    let mut a = Member::join(&spate.addr, "g-mine", "a", "sq-mine");
    a.topic = other;
    let resp = a.fetch(0, &[]);
    assert_eq!(resp.error_code, 0);
    let p = &resp.responses[0].partitions[0];
    assert_eq!(p.error_code, ResponseError::InvalidRequest.code());
    assert!(p.acquired_records.is_empty());
}

#[tokio::test]
async fn a_group_id_is_either_a_share_group_or_a_consumer_group() {
    let spate = start(30_000);
    create_topic(&spate.addr, "sq-kind", 1, &[]).await;
    // A consumer group first: the id is not a share group.
    let mut raw = Raw::connect(&spate.addr);
    let mut c = ConsumerGroupHeartbeatRequest::default();
    c.group_id = s("g-consumer").into();
    c.member_id = s("c1");
    c.member_epoch = 0;
    c.rebalance_timeout_ms = 30_000;
    c.subscribed_topic_names = Some(vec![s("sq-kind").into()]);
    c.topic_partitions = Some(Vec::new());
    let joined: ConsumerGroupHeartbeatResponse = raw.call(ApiKey::ConsumerGroupHeartbeat, 1, &c);
    assert_eq!(joined.error_code, 0);
    let share = heartbeat(&mut raw, "g-consumer", "s1", 0, Some(&["sq-kind"]));
    assert_eq!(share.error_code, ResponseError::GroupIdNotFound.code());
    // A share group first: the id is not a consumer group.
    Member::join(&spate.addr, "g-share", "s1", "sq-kind");
    c.group_id = s("g-share").into();
    let refused: ConsumerGroupHeartbeatResponse = raw.call(ApiKey::ConsumerGroupHeartbeat, 1, &c);
    assert_eq!(refused.error_code, ResponseError::GroupIdNotFound.code());
}

#[tokio::test]
async fn kill_9_keeps_accepted_records_accepted_and_redelivers_what_was_in_flight() {
    let mut spate = start(30_000);
    create_topic(&spate.addr, "sq-crash", 1, &[]).await;
    produce(&spate.addr, "sq-crash", 10).await;
    let mut a = Member::join(&spate.addr, "g-crash", "a", "sq-crash");
    assert_eq!(acquired(&a.fetch(5_000, &[])), vec![(0, 9, 1)]);
    assert_eq!(a.acknowledge(&[(0, 4, ACCEPT)]), 0);
    spate.restart();
    // Membership and sessions are not durable: the member joins again.
    let mut a = Member::join(&spate.addr, "g-crash", "a", "sq-crash");
    assert_eq!(
        acquired(&a.fetch(5_000, &[])),
        vec![(5, 9, 2)],
        "0..=4 stay accepted; 5..=9 were in flight and come back, delivered once before"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_committed_share_groups_stop_at_the_lso_and_never_see_aborted_records() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let spate = Spate::start_with_env(
        &[],
        &[
            ("SPATE_SHARE_AUTO_OFFSET_RESET", "earliest"),
            ("SPATE_SHARE_ISOLATION_LEVEL", "read_committed"),
        ],
    );
    create_topic(&spate.addr, "sq-txn", 1, &[]).await;
    let t = Duration::from_secs(30);
    let p: BaseProducer = crate::harness::client_config(&spate.addr)
        .set("transactional.id", "share-tx")
        .create()
        .expect("transactional producer");
    let send = |v: &str| {
        p.send(BaseRecord::<(), str>::to("sq-txn").partition(0).payload(v))
            .expect("send");
        p.flush(t).expect("flush");
    };
    tokio::task::block_in_place(|| {
        p.init_transactions(t).expect("init");
        // Offsets: 0 aborted, 1 its marker, 2 committed, 3 its marker, 4 still open.
        p.begin_transaction().expect("begin");
        send("aborted");
        p.abort_transaction(t).expect("abort");
        p.begin_transaction().expect("begin");
        send("committed");
        p.commit_transaction(t).expect("commit");
        p.begin_transaction().expect("begin");
        send("open");
    });
    let mut a = Member::join(&spate.addr, "g-txn", "a", "sq-txn");
    assert_eq!(acquired(&a.fetch(5_000, &[])), vec![(2, 2, 1)]);
    assert!(
        acquired(&a.fetch(300, &[])).is_empty(),
        "offset 4 is past the last stable offset"
    );
    tokio::task::block_in_place(|| p.commit_transaction(t).expect("commit"));
    assert_eq!(acquired(&a.fetch(5_000, &[])), vec![(4, 4, 1)]);
}

/// IncrementalAlterConfigs of group `group`'s configs: the resource's error code.
pub(crate) fn alter_group_configs(raw: &mut Raw, group: &str, set: &[(&str, Option<&str>)]) -> i16 {
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    let mut res = AlterConfigsResource::default();
    res.resource_type = 32;
    res.resource_name = s(group);
    res.configs = set
        .iter()
        .map(|(k, v)| {
            let mut c = AlterableConfig::default();
            c.name = s(k);
            c.config_operation = if v.is_some() { 0 } else { 1 };
            c.value = v.map(s);
            c
        })
        .collect();
    let mut r = IncrementalAlterConfigsRequest::default();
    r.resources = vec![res];
    let resp: IncrementalAlterConfigsResponse = raw.call(ApiKey::IncrementalAlterConfigs, 1, &r);
    resp.responses[0].error_code
}

/// DescribeConfigs of group `group`: (name, value, source) of each config.
pub(crate) fn describe_group_configs(raw: &mut Raw, group: &str) -> Vec<(String, String, i8)> {
    describe_configs(raw, 32, group)
}

/// DescribeConfigs of one resource (a group: 32, a broker: 4): (name, value, source) of each
/// config.
fn describe_configs(raw: &mut Raw, resource_type: i8, name: &str) -> Vec<(String, String, i8)> {
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    let mut res = DescribeConfigsResource::default();
    res.resource_type = resource_type;
    res.resource_name = s(name);
    res.configuration_keys = None;
    let mut r = DescribeConfigsRequest::default();
    r.resources = vec![res];
    let resp: DescribeConfigsResponse = raw.call(ApiKey::DescribeConfigs, 4, &r);
    assert_eq!(
        resp.results[0].error_code, 0,
        "{:?}",
        resp.results[0].error_message
    );
    resp.results[0]
        .configs
        .iter()
        .map(|c| {
            (
                c.name.to_string(),
                c.value.as_ref().map(|v| v.to_string()).unwrap_or_default(),
                c.config_source,
            )
        })
        .collect()
}

#[tokio::test]
async fn group_configs_set_where_a_group_starts_are_checked_and_survive_a_restart() {
    // Kafka's defaults: share-partitions start at the log end.
    let mut spate = Spate::start(&[]);
    create_topic(&spate.addr, "sq-configs", 1, &[]).await;
    produce(&spate.addr, "sq-configs", 4).await;
    let mut raw = Raw::connect(&spate.addr);
    let invalid = ResponseError::InvalidConfig.code();
    // Kafka's rules: a known key, a valid value, a lock duration from 15 to 60 s.
    assert_eq!(
        alter_group_configs(
            &mut raw,
            "g-early",
            &[("share.auto.offset.reset", Some("soon"))]
        ),
        invalid
    );
    assert_eq!(
        alter_group_configs(
            &mut raw,
            "g-early",
            &[("share.record.lock.duration.ms", Some("10"))]
        ),
        invalid
    );
    assert_eq!(
        alter_group_configs(&mut raw, "g-early", &[("no.such.config", Some("1"))]),
        invalid
    );
    assert_eq!(
        alter_group_configs(
            &mut raw,
            "g-early",
            &[
                ("share.auto.offset.reset", Some("earliest")),
                ("share.record.lock.duration.ms", Some("20000")),
            ]
        ),
        0
    );
    let described = describe_group_configs(&mut raw, "g-early");
    assert!(described.contains(&("share.auto.offset.reset".into(), "earliest".into(), 8)));
    assert!(described.contains(&("share.record.lock.duration.ms".into(), "20000".into(), 8)));
    assert!(described.contains(&("share.isolation.level".into(), "read_uncommitted".into(), 5)));
    // Kept across a restart, set before the group exists: it reads what was produced before.
    spate.kill9();
    spate.restart();
    let mut early = Member::join(&spate.addr, "g-early", "a", "sq-configs");
    assert_eq!(acquired(&early.fetch(2000, &[])), vec![(0, 3, 1)]);
    // A group without configs starts at the end.
    let mut late = Member::join(&spate.addr, "g-late", "b", "sq-configs");
    assert_eq!(acquired(&late.fetch(300, &[])), vec![]);
    // DELETE returns a key to its default.
    let mut raw = Raw::connect(&spate.addr);
    assert_eq!(
        alter_group_configs(&mut raw, "g-early", &[("share.auto.offset.reset", None)]),
        0
    );
    assert!(describe_group_configs(&mut raw, "g-early").contains(&(
        "share.auto.offset.reset".into(),
        "latest".into(),
        5
    )));
}

/// One share-partition of a state API request.
fn state_summary(raw: &mut Raw, group: &str, topic: Uuid, p: i32) -> (i16, i32, i64) {
    use kafka_protocol::messages::read_share_group_state_summary_request::{
        PartitionData, ReadStateSummaryData,
    };
    let mut part = PartitionData::default();
    part.partition = p;
    let mut t = ReadStateSummaryData::default();
    t.topic_id = topic;
    t.partitions = vec![part];
    let mut r = ReadShareGroupStateSummaryRequest::default();
    r.group_id = s(group);
    r.topics = vec![t];
    let resp: ReadShareGroupStateSummaryResponse =
        raw.call(ApiKey::ReadShareGroupStateSummary, 0, &r);
    let p = &resp.results[0].partitions[0];
    (p.error_code, p.state_epoch, p.start_offset)
}

/// A state batch: first and last offset, delivery state and count.
type Batch = (i64, i64, i8, i16);

/// ReadShareGroupState: the error, start offset and state batches.
fn state_read(
    raw: &mut Raw,
    group: &str,
    topic: Uuid,
    leader_epoch: i32,
) -> (i16, i64, Vec<Batch>) {
    use kafka_protocol::messages::read_share_group_state_request::{PartitionData, ReadStateData};
    let mut part = PartitionData::default();
    part.partition = 0;
    part.leader_epoch = leader_epoch;
    let mut t = ReadStateData::default();
    t.topic_id = topic;
    t.partitions = vec![part];
    let mut r = ReadShareGroupStateRequest::default();
    r.group_id = s(group);
    r.topics = vec![t];
    let resp: ReadShareGroupStateResponse = raw.call(ApiKey::ReadShareGroupState, 0, &r);
    let p = &resp.results[0].partitions[0];
    let batches = p
        .state_batches
        .iter()
        .map(|b| {
            (
                b.first_offset,
                b.last_offset,
                b.delivery_state,
                b.delivery_count,
            )
        })
        .collect();
    (p.error_code, p.start_offset, batches)
}

/// WriteShareGroupState of partition `p`; the partition's error code.
fn state_write(
    raw: &mut Raw,
    group: &str,
    topic: Uuid,
    p: i32,
    epochs: (i32, i32),
    batches: &[Batch],
) -> i16 {
    use kafka_protocol::messages::write_share_group_state_request::{
        PartitionData, StateBatch, WriteStateData,
    };
    let mut part = PartitionData::default();
    part.partition = p;
    (part.state_epoch, part.leader_epoch) = epochs;
    part.start_offset = -1;
    part.state_batches = batches
        .iter()
        .map(|(f, l, st, c)| {
            let mut b = StateBatch::default();
            (
                b.first_offset,
                b.last_offset,
                b.delivery_state,
                b.delivery_count,
            ) = (*f, *l, *st, *c);
            b
        })
        .collect();
    let mut t = WriteStateData::default();
    t.topic_id = topic;
    t.partitions = vec![part];
    let mut r = WriteShareGroupStateRequest::default();
    r.group_id = s(group);
    r.topics = vec![t];
    let resp: WriteShareGroupStateResponse = raw.call(ApiKey::WriteShareGroupState, 0, &r);
    resp.results[0].partitions[0].error_code
}

#[tokio::test]
async fn the_share_state_apis_serve_what_the_leader_wrote_and_a_reset_fences_older_writes() {
    use kafka_protocol::messages::delete_share_group_state_request::{
        DeleteStateData, PartitionData as DeletePartition,
    };
    use kafka_protocol::messages::initialize_share_group_state_request::{
        InitializeStateData, PartitionData as InitPartition,
    };
    const AVAILABLE: i8 = 0;
    const ACKNOWLEDGED: i8 = 2;
    let mut spate = start(30_000);
    create_topic(&spate.addr, "sq-state", 1, &[]).await;
    produce(&spate.addr, "sq-state", 10).await;
    let mut a = Member::join(&spate.addr, "g-state", "a", "sq-state");
    let topic = a.topic.topic_id;
    assert_eq!(acquired(&a.fetch(5_000, &[])), vec![(0, 9, 1)]);
    assert_eq!(a.acknowledge(&[(0, 4, ACCEPT)]), 0);
    let mut raw = Raw::connect(&spate.addr);
    // What the share-partition leader wrote: 0..=4 done, 5..=9 delivered once.
    assert_eq!(state_summary(&mut raw, "g-state", topic, 0), (0, 0, 5));
    assert_eq!(
        state_read(&mut raw, "g-state", topic, 0),
        (0, 5, vec![(5, 9, AVAILABLE, 1)])
    );
    // Another writer acknowledges 5..=6; the leader takes that state on at its next fetch.
    assert_eq!(
        state_write(
            &mut raw,
            "g-state",
            topic,
            0,
            (0, 0),
            &[(5, 6, ACKNOWLEDGED, 1)]
        ),
        0
    );
    assert_eq!(acquired(&a.fetch(5_000, &[])), vec![(7, 9, 2)]);
    // A reset (AlterShareGroupOffsets' way): a new state epoch from offset 8.
    let mut part = InitPartition::default();
    (part.partition, part.state_epoch, part.start_offset) = (0, 1, 8);
    let mut init_topic = InitializeStateData::default();
    init_topic.topic_id = topic;
    init_topic.partitions = vec![part];
    let mut init = InitializeShareGroupStateRequest::default();
    init.group_id = s("g-state");
    init.topics = vec![init_topic];
    let resp: InitializeShareGroupStateResponse =
        raw.call(ApiKey::InitializeShareGroupState, 0, &init);
    assert_eq!(resp.results[0].partitions[0].error_code, 0);
    assert_eq!(
        state_write(
            &mut raw,
            "g-state",
            topic,
            0,
            (0, 0),
            &[(8, 8, ACKNOWLEDGED, 1)]
        ),
        ResponseError::FencedStateEpoch.code(),
        "a write from before the reset"
    );
    assert_eq!(acquired(&a.fetch(5_000, &[])), vec![(8, 9, 1)]);
    // Bad input changes nothing.
    assert_eq!(
        state_write(&mut raw, "g-state", topic, 0, (1, 1), &[]),
        ResponseError::UnknownLeaderEpoch.code(),
        "a leader epoch the partition never had"
    );
    assert_eq!(
        state_write(
            &mut raw,
            "g-state",
            topic,
            0,
            (1, 0),
            &[(9, 8, ACKNOWLEDGED, 1)]
        ),
        ResponseError::InvalidRequest.code()
    );
    assert_eq!(
        state_write(&mut raw, "g-state", topic, -1, (1, 0), &[]),
        ResponseError::InvalidRequest.code()
    );
    assert_eq!(
        state_write(&mut raw, "g-state", Uuid::from_u128(42), 0, (1, 0), &[]),
        ResponseError::UnknownTopicOrPartition.code()
    );
    assert_eq!(
        state_summary(&mut raw, "g-state", topic, 1).0,
        ResponseError::UnknownTopicOrPartition.code()
    );
    // The state survives kill -9; a delete removes it for good.
    spate.restart();
    let mut raw = Raw::connect(&spate.addr);
    assert_eq!(state_summary(&mut raw, "g-state", topic, 0), (0, 1, 8));
    let mut dp = DeletePartition::default();
    dp.partition = 0;
    let mut dt = DeleteStateData::default();
    dt.topic_id = topic;
    dt.partitions = vec![dp];
    let mut del = DeleteShareGroupStateRequest::default();
    del.group_id = s("g-state");
    del.topics = vec![dt];
    let resp: DeleteShareGroupStateResponse = raw.call(ApiKey::DeleteShareGroupState, 0, &del);
    assert_eq!(resp.results[0].partitions[0].error_code, 0);
    assert_eq!(state_summary(&mut raw, "g-state", topic, 0), (0, 0, -1));
    spate.restart();
    let mut raw = Raw::connect(&spate.addr);
    assert_eq!(state_summary(&mut raw, "g-state", topic, 0), (0, 0, -1));
}
