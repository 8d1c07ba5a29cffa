//! Nodes beyond the voters: observers follow the metadata log without voting, hold replicas
//! like any broker, and DescribeQuorum lists them apart from the voters.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kafka_protocol::messages::describe_quorum_request::{PartitionData, TopicData};
use kafka_protocol::messages::{ApiKey, DescribeQuorumRequest, DescribeQuorumResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::producer::FutureRecord;

use crate::cluster::{find_partition, ids, read_values, ThreeNodes};
use crate::harness::{admin, consumer, producer, Raw};

const PARTITIONS: i32 = 10;

fn describe_quorum(addr: &str) -> DescribeQuorumResponse {
    let mut p = PartitionData::default();
    p.partition_index = 0;
    let mut t = TopicData::default();
    t.topic_name = TopicName(StrBytes::from_static_str("__cluster_metadata"));
    t.partitions = vec![p];
    let mut req = DescribeQuorumRequest::default();
    req.topics = vec![t];
    Raw::connect(addr).call(ApiKey::DescribeQuorum, 2, &req)
}

/// Produces `values` with acks=all, each to partition `value % PARTITIONS`; all must be
/// acknowledged.
async fn produce_all(bootstrap: &str, values: std::ops::Range<u64>) {
    let prod = producer(
        bootstrap,
        &[("acks", "all"), ("message.timeout.ms", "60000")],
    );
    let mut pending = Vec::new();
    for v in values {
        let payload = v.to_string();
        let record = FutureRecord::<(), _>::to("wide")
            .partition((v % PARTITIONS as u64) as i32)
            .payload(&payload);
        pending.push((v, prod.send_result(record).expect("queue")));
    }
    for (v, f) in pending {
        let r = f.await.expect("delivery future");
        assert!(r.is_ok(), "record {v} not acknowledged: {r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_hold_replicas_without_voting_and_acknowledged_records_survive_kill_9_of_a_voter_and_an_observer(
) {
    voters_and_observers(2).await;
}

/// Three voters and six observers as real processes; long on two cores, so run on demand:
/// `cargo test -p spate-server --test e2e nine_nodes -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "nine processes: cargo test -p spate-server --test e2e nine_nodes -- --ignored"]
async fn nine_nodes_three_voters_six_observers_survive_kill_9_of_a_voter_and_an_observer() {
    voters_and_observers(6).await;
}

/// Starts `observer_count` observers beside three voters, checks DescribeQuorum, spreads a
/// topic over every node, kills a voter and an observer with kill -9 and reads back every
/// acknowledged record.
async fn voters_and_observers(observer_count: u64) {
    let mut c = ThreeNodes::start(&[]);
    let observer_ids: Vec<u64> = (4..4 + observer_count).collect();
    for &id in &observer_ids {
        c.start_observer(id, &[]);
    }
    c.wait_ready(&observer_ids);

    // Asked of an observer, answered by the quorum leader: three voters, two observers.
    let q = describe_quorum(&c.node(4).addr.clone());
    let p = &q.topics[0].partitions[0];
    assert_eq!(p.error_code, 0, "{q:?}");
    let voters: BTreeSet<i32> = p.current_voters.iter().map(|r| r.replica_id.0).collect();
    let observers: BTreeSet<i32> = p.observers.iter().map(|r| r.replica_id.0).collect();
    assert_eq!(voters, BTreeSet::from([1, 2, 3]), "{q:?}");
    let expected: BTreeSet<i32> = observer_ids.iter().map(|&id| id as i32).collect();
    assert_eq!(observers, expected, "{q:?}");
    assert!(voters.contains(&p.leader_id.0), "{q:?}");
    assert!(p.high_watermark > 0, "{q:?}");
    assert!(
        p.observers.iter().all(|r| r.log_end_offset > 0),
        "observers follow the log: {q:?}"
    );
    let listed: BTreeSet<i32> = q.nodes.iter().map(|n| n.node_id.0).collect();
    let all: BTreeSet<u64> = (1..4 + observer_count).collect();
    assert_eq!(
        listed,
        all.iter().map(|&id| id as i32).collect::<BTreeSet<i32>>(),
        "{q:?}"
    );

    let t = NewTopic::new("wide", PARTITIONS, TopicReplication::Fixed(3))
        .set("min.insync.replicas", "1");
    let r = admin(&c.bootstrap())
        .create_topics(&[t], &AdminOptions::new())
        .await
        .expect("create_topics");
    assert!(r[0].is_ok(), "{r:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let s = c.status(1).expect("status");
        let full = (0..PARTITIONS as i64)
            .all(|i| find_partition(&s, "wide", i).is_some_and(|p| ids(&p["isr"]).len() == 3));
        if full {
            break s;
        }
        assert!(Instant::now() < deadline, "ISRs of three: {s}");
        std::thread::sleep(Duration::from_millis(100));
    };
    // Placement balances load over every broker, the offsets topic's replicas included:
    // together the topics use every node, and "wide" uses the observers.
    let holders: BTreeSet<u64> = status["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| ids(&p["replicas"]))
        .collect();
    let wide: BTreeSet<u64> = (0..PARTITIONS as i64)
        .filter_map(|i| find_partition(&status, "wide", i))
        .flat_map(|p| ids(&p["replicas"]))
        .collect();
    assert!(
        observer_ids.iter().all(|id| wide.contains(id)),
        "every observer holds replicas of the topic: {status}"
    );
    assert_eq!(
        holders, all,
        "replicas spread over voters and observers: {status}"
    );

    produce_all(&c.bootstrap(), 0..200).await;
    let last_observer = *observer_ids.last().expect("an observer");
    c.node(last_observer).kill9();
    c.node(3).kill9();
    produce_all(&c.bootstrap(), 200..300).await;

    let mut seen = BTreeSet::new();
    for partition in 0..PARTITIONS {
        let cons = consumer(&c.bootstrap(), "wide", &[partition], 0);
        let got = read_values(&cons, 30);
        assert_eq!(got.len(), 30, "partition {partition}: {got:?}");
        seen.extend(got);
    }
    assert_eq!(seen, (0..300).collect::<BTreeSet<u64>>());
}
