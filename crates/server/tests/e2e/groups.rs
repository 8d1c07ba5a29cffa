//! Consumer groups through librdkafka, and through raw requests where a member must misbehave.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use rdkafka::ClientContext;

use crate::harness::{client_config, producer, Raw, Spate};
use crate::produce_consume::create_topic;

/// Who owns which partition right now, across all members; records any double ownership.
#[derive(Default)]
struct Ownership {
    owners: Mutex<HashMap<i32, String>>,
    violations: Mutex<Vec<String>>,
}

struct Tracking {
    name: String,
    ownership: Arc<Ownership>,
}

impl ClientContext for Tracking {}

impl ConsumerContext for Tracking {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let mut owners = self.ownership.owners.lock().unwrap();
            for e in tpl.elements() {
                owners.remove(&e.partition());
            }
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let mut owners = self.ownership.owners.lock().unwrap();
            for e in tpl.elements() {
                if let Some(other) = owners.insert(e.partition(), self.name.clone()) {
                    if other != self.name {
                        self.ownership.violations.lock().unwrap().push(format!(
                            "partition {} given to {} while {other} owns it",
                            e.partition(),
                            self.name
                        ));
                    }
                }
            }
        }
    }
}

fn member(
    addr: &str,
    group: &str,
    name: &str,
    ownership: Arc<Ownership>,
) -> BaseConsumer<Tracking> {
    let c: BaseConsumer<Tracking> = client_config(addr)
        .set("group.id", group)
        .set("client.id", name)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "200")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("fetch.wait.max.ms", "100")
        .create_with_context(Tracking {
            name: name.to_string(),
            ownership,
        })
        .expect("consumer");
    c.subscribe(&["groups"]).expect("subscribe");
    c
}

async fn produce_n(addr: &str, topic: &str, from: usize, n: usize) {
    let p = producer(addr, &[]);
    let sends = (from..from + n).map(|i| {
        let key = format!("k{i}");
        let value = format!("v{i}");
        let p = &p;
        async move {
            p.send(
                FutureRecord::to(topic).key(&key).payload(&value),
                Duration::from_secs(20),
            )
            .await
            .expect("delivery");
        }
    });
    futures::future::join_all(sends).await;
}

/// Runs a member on its own thread until `stop`, recording every value it consumes.
fn spawn_member(
    addr: String,
    name: &str,
    ownership: Arc<Ownership>,
    seen: Arc<Mutex<HashSet<String>>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let name = name.to_string();
    std::thread::spawn(move || {
        let c = member(&addr, "g-six", &name, ownership);
        let deadline = Instant::now() + Duration::from_secs(120);
        while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                let v = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                seen.lock().unwrap().insert(v);
            }
        }
        drop(c); // Leaves the group.
    })
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_share_partitions_through_joins_and_leaves_without_double_ownership() {
    let spate = Spate::start(&["--group-initial-rebalance-delay-ms", "500"]);
    create_topic(&spate.addr, "groups", 6, &[]).await;
    produce_n(&spate.addr, "groups", 0, 600).await;
    let ownership = Arc::new(Ownership::default());
    let seen: Arc<Mutex<HashSet<String>>> = Arc::default();
    let stops: Vec<Arc<AtomicBool>> = (0..4).map(|_| Arc::default()).collect();
    let mut threads: Vec<_> = (0..3)
        .map(|i| {
            spawn_member(
                spate.addr.clone(),
                &format!("m{i}"),
                ownership.clone(),
                seen.clone(),
                stops[i].clone(),
            )
        })
        .collect();
    let s = seen.clone();
    tokio::task::spawn_blocking(move || {
        wait_until("the first 600 records", Duration::from_secs(60), || {
            s.lock().unwrap().len() >= 600
        })
    })
    .await
    .unwrap();

    // A fourth member joins, then more data.
    threads.push(spawn_member(
        spate.addr.clone(),
        "m3",
        ownership.clone(),
        seen.clone(),
        stops[3].clone(),
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;
    produce_n(&spate.addr, "groups", 600, 600).await;
    // One member leaves, then more data.
    stops[0].store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    produce_n(&spate.addr, "groups", 1200, 600).await;
    let s = seen.clone();
    tokio::task::spawn_blocking(move || {
        wait_until("all 1800 records", Duration::from_secs(60), || {
            s.lock().unwrap().len() >= 1800
        })
    })
    .await
    .unwrap();
    for s in &stops {
        s.store(true, Ordering::SeqCst);
    }
    for t in threads {
        t.join().unwrap();
    }
    let seen = seen.lock().unwrap();
    assert!(
        (0..1800).all(|i| seen.contains(&format!("v{i}"))),
        "every record consumed"
    );
    let violations = ownership.violations.lock().unwrap();
    assert!(violations.is_empty(), "{violations:?}");
}

#[tokio::test]
async fn committed_offsets_survive_kill_9_and_the_member_resumes_there() {
    let mut spate = Spate::start(&[
        "--group-initial-rebalance-delay-ms",
        "0",
        "--fsync",
        "always",
    ]);
    create_topic(&spate.addr, "resume", 1, &[]).await;
    produce_n(&spate.addr, "resume", 0, 100).await;
    let consume = |addr: String, n: usize| {
        std::thread::spawn(move || {
            let c: BaseConsumer = client_config(&addr)
                .set("group.id", "resumers")
                .set("enable.auto.commit", "false")
                .set("auto.offset.reset", "earliest")
                .set("session.timeout.ms", "6000")
                .create()
                .expect("consumer");
            c.subscribe(&["resume"]).unwrap();
            let mut offsets = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(60);
            while offsets.len() < n && Instant::now() < deadline {
                if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                    offsets.push(m.offset());
                    if offsets.len() == n {
                        c.commit_message(&m, rdkafka::consumer::CommitMode::Sync)
                            .expect("commit");
                    }
                }
            }
            offsets
        })
    };
    let first = consume(spate.addr.clone(), 60).join().unwrap();
    assert_eq!(first, (0..60).collect::<Vec<i64>>());
    spate.kill9();
    spate.restart();
    let second = consume(spate.addr.clone(), 40).join().unwrap();
    assert_eq!(
        second,
        (60..100).collect::<Vec<i64>>(),
        "resumes exactly after the committed offset"
    );
}

/// ConsumerProtocolAssignment v0 giving `partitions` of `topic`.
fn assignment(topic: &str, partitions: &[i32]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    b.put_i32(1);
    b.put_i16(topic.len() as i16);
    b.put_slice(topic.as_bytes());
    b.put_i32(partitions.len() as i32);
    for p in partitions {
        b.put_i32(*p);
    }
    b.put_i32(-1);
    b.freeze()
}

/// ConsumerProtocolSubscription v0 for `topic`.
fn subscription(topic: &str) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    b.put_i32(1);
    b.put_i16(topic.len() as i16);
    b.put_slice(topic.as_bytes());
    b.put_i32(-1);
    b.freeze()
}

fn join_request(group: &str, member: &str, metadata: Bytes) -> JoinGroupRequest {
    let mut p = JoinGroupRequestProtocol::default();
    p.name = StrBytes::from_static_str("range");
    p.metadata = metadata;
    let mut r = JoinGroupRequest::default();
    r.group_id = StrBytes::from_string(group.to_string()).into();
    r.session_timeout_ms = 6000;
    r.rebalance_timeout_ms = 6000;
    r.member_id = StrBytes::from_string(member.to_string());
    r.group_instance_id = None;
    r.protocol_type = StrBytes::from_static_str("consumer");
    r.protocols = vec![p];
    r
}

#[tokio::test]
async fn a_member_that_stops_heartbeating_is_evicted_and_its_partitions_move() {
    let spate = Spate::start(&["--group-initial-rebalance-delay-ms", "0"]);
    create_topic(&spate.addr, "groups", 6, &[]).await;
    let addr = spate.addr.clone();
    let result = tokio::task::spawn_blocking(move || {
        let ownership = Arc::new(Ownership::default());
        let live = member(&addr, "g-evict", "live", ownership);
        let assigned = |c: &BaseConsumer<Tracking>| c.assignment().map(|a| a.count()).unwrap_or(0);
        wait_until(
            "the live member to own all 6",
            Duration::from_secs(30),
            || {
                live.poll(Duration::from_millis(50));
                assigned(&live) == 6
            },
        );
        // A raw member joins, gets its share, then falls silent.
        let mut raw = Raw::connect(&addr);
        let first: JoinGroupResponse = raw.call(
            ApiKey::JoinGroup,
            5,
            &join_request("g-evict", "", subscription("groups")),
        );
        assert_eq!(first.error_code, 79, "MEMBER_ID_REQUIRED");
        let member_id = first.member_id.to_string();
        let id = raw.send(
            ApiKey::JoinGroup,
            5,
            &join_request("g-evict", &member_id, subscription("groups")),
        );
        let joined = std::thread::spawn(move || {
            let (got, resp): (i32, JoinGroupResponse) = raw.recv(ApiKey::JoinGroup, 5);
            assert_eq!(got, id);
            (raw, resp)
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while !joined.is_finished() && Instant::now() < deadline {
            live.poll(Duration::from_millis(50));
        }
        let (mut raw, resp) = joined.join().unwrap();
        assert_eq!(resp.error_code, 0);
        let mut sync = SyncGroupRequest::default();
        sync.group_id = StrBytes::from_static_str("g-evict").into();
        sync.generation_id = resp.generation_id;
        sync.member_id = StrBytes::from_string(member_id.clone());
        let id = raw.send(ApiKey::SyncGroup, 3, &sync);
        let synced =
            std::thread::spawn(move || raw.recv::<SyncGroupResponse>(ApiKey::SyncGroup, 3));
        while !synced.is_finished() {
            live.poll(Duration::from_millis(50));
        }
        let (got, sync_resp) = synced.join().unwrap();
        assert_eq!((got, sync_resp.error_code), (id, 0));
        wait_until(
            "the live member to give up half",
            Duration::from_secs(30),
            || {
                live.poll(Duration::from_millis(50));
                assigned(&live) == 3
            },
        );
        // No heartbeats from the raw member: after its 6 s session it is evicted.
        let silent_since = Instant::now();
        wait_until(
            "the live member to own all 6 again",
            Duration::from_secs(40),
            || {
                live.poll(Duration::from_millis(50));
                assigned(&live) == 6
            },
        );
        silent_since.elapsed()
    })
    .await
    .unwrap();
    assert!(
        result >= Duration::from_secs(5),
        "evicted only after the session timeout, took {result:?}"
    );
}

#[test]
fn bad_group_requests_get_kafka_error_codes() {
    let spate = Spate::start(&["--group-initial-rebalance-delay-ms", "0"]);
    let mut raw = Raw::connect(&spate.addr);
    // JoinGroup without protocols.
    let mut empty = join_request("g", "", Bytes::new());
    empty.protocols.clear();
    let r: JoinGroupResponse = raw.call(ApiKey::JoinGroup, 5, &empty);
    assert_eq!(r.error_code, 23, "INCONSISTENT_GROUP_PROTOCOL");
    // Oversized member metadata.
    let r: JoinGroupResponse = raw.call(
        ApiKey::JoinGroup,
        5,
        &join_request("g", "", Bytes::from(vec![0u8; 2 << 20])),
    );
    assert_eq!(r.error_code, 42, "INVALID_REQUEST");
    // A commit from a member nobody knows, and from a stale generation.
    let commit = |generation: i32, member: &str| {
        let mut p = OffsetCommitRequestPartition::default();
        p.partition_index = 0;
        p.committed_offset = 5;
        let mut t = OffsetCommitRequestTopic::default();
        t.name = StrBytes::from_static_str("t").into();
        t.partitions = vec![p];
        let mut r = OffsetCommitRequest::default();
        r.group_id = StrBytes::from_static_str("g").into();
        r.generation_id_or_member_epoch = generation;
        r.member_id = StrBytes::from_string(member.to_string());
        r.topics = vec![t];
        r
    };
    let r: OffsetCommitResponse = raw.call(ApiKey::OffsetCommit, 8, &commit(1, "ghost"));
    assert_eq!(
        r.topics[0].partitions[0].error_code, 22,
        "ILLEGAL_GENERATION for a group that does not exist"
    );
    // A real member at generation 1, then commits with the wrong generation and member.
    let first: JoinGroupResponse = raw.call(
        ApiKey::JoinGroup,
        5,
        &join_request("g", "", subscription("t")),
    );
    let joined: JoinGroupResponse = raw.call(
        ApiKey::JoinGroup,
        5,
        &join_request("g", &first.member_id, subscription("t")),
    );
    assert_eq!(joined.generation_id, 1);
    let r: OffsetCommitResponse = raw.call(ApiKey::OffsetCommit, 8, &commit(1, "ghost"));
    assert_eq!(
        r.topics[0].partitions[0].error_code, 25,
        "UNKNOWN_MEMBER_ID"
    );
    let r: OffsetCommitResponse = raw.call(ApiKey::OffsetCommit, 8, &commit(7, &first.member_id));
    assert_eq!(
        r.topics[0].partitions[0].error_code, 22,
        "ILLEGAL_GENERATION"
    );
    // OffsetFetch for a group that never existed: no offsets, no error.
    let mut t = OffsetFetchRequestTopic::default();
    t.name = StrBytes::from_static_str("t").into();
    t.partition_indexes = vec![0, 1];
    let mut f = OffsetFetchRequest::default();
    f.group_id = StrBytes::from_static_str("never").into();
    f.topics = Some(vec![t]);
    let r: OffsetFetchResponse = raw.call(ApiKey::OffsetFetch, 6, &f);
    assert_eq!(r.error_code, 0);
    assert!(r.topics[0]
        .partitions
        .iter()
        .all(|p| p.committed_offset == -1 && p.error_code == 0));
    // The well-behaved member is unaffected by all of the above.
    let mut hb = HeartbeatRequest::default();
    hb.group_id = StrBytes::from_static_str("g").into();
    hb.generation_id = 1;
    hb.member_id = first.member_id.clone();
    // Between JoinGroup and SyncGroup heartbeats of the current generation are fine, as in Kafka.
    let r: HeartbeatResponse = raw.call(ApiKey::Heartbeat, 3, &hb);
    assert_eq!(r.error_code, 0);
    let mut sync = SyncGroupRequest::default();
    sync.group_id = StrBytes::from_static_str("g").into();
    sync.generation_id = 1;
    sync.member_id = first.member_id.clone();
    let mut a = SyncGroupRequestAssignment::default();
    a.member_id = first.member_id.clone();
    a.assignment = assignment("t", &[0]);
    sync.assignments = vec![a];
    let r: SyncGroupResponse = raw.call(ApiKey::SyncGroup, 3, &sync);
    assert_eq!(r.error_code, 0);
    assert_eq!(r.assignment, assignment("t", &[0]));
    let r: HeartbeatResponse = raw.call(ApiKey::Heartbeat, 3, &hb);
    assert_eq!(r.error_code, 0);
    // A transaction coordinator is found; share group keys (type 2) are refused clearly.
    let mut fc = FindCoordinatorRequest::default();
    fc.key_type = 1;
    fc.coordinator_keys = vec![StrBytes::from_static_str("tx")];
    let r: FindCoordinatorResponse = raw.call(ApiKey::FindCoordinator, 4, &fc);
    assert_eq!(r.coordinators[0].error_code, 0);
    assert!(r.coordinators[0].port > 0);
    fc.key_type = 2;
    let r: FindCoordinatorResponse = raw.call(ApiKey::FindCoordinator, 4, &fc);
    assert_eq!(r.coordinators[0].error_code, 42);
}
