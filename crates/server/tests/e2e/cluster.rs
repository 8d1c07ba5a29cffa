//! Cluster mode with three real `spate` processes on loopback: replication, kill -9 of a
//! leader during an idempotent acks=all produce loop, min.insync.replicas, and the inputs a
//! cluster must refuse.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use rdkafka::types::RDKafkaErrorCode;
use serde_json::Value;

use crate::harness::{admin, consumer, http, producer, Raw, Spate};

/// Partitions of `__consumer_offsets` in test clusters: several, so groups land on different
/// ones, but fewer than Kafka's 50 so three nodes on two cores start quickly.
pub const OFFSETS_PARTITIONS: usize = 5;

/// The `__consumer_offsets` partition of `group`, as Kafka maps it (Java's `String.hashCode`,
/// non-negative, modulo the count).
pub fn offsets_partition_of(group: &str) -> i64 {
    let h = group
        .encode_utf16()
        .fold(0i32, |h, u| h.wrapping_mul(31).wrapping_add(i32::from(u)));
    ((h & 0x7fff_ffff) as usize % OFFSETS_PARTITIONS) as i64
}

/// Short timings so failover happens within seconds in tests.
const FAST: [&str; 8] = [
    "--offsets-topic-num-partitions",
    "5",
    "--broker-session-timeout-ms",
    "2000",
    "--broker-heartbeat-interval-ms",
    "300",
    "--replica-lag-time-max-ms",
    "3000",
];

/// Three nodes of one cluster, each a real `spate` process.
pub struct ThreeNodes {
    nodes: BTreeMap<u64, Spate>,
    peers: String,
}

fn free_ports(n: usize) -> Vec<u16> {
    crate::harness::free_ports(n)
}

impl ThreeNodes {
    /// Starts nodes 1, 2 and 3 and waits until every one is ready.
    pub fn start(extra: &[&str]) -> Self {
        let c = Self::launch(extra);
        c.wait_ready(&[1, 2, 3]);
        c
    }

    /// Starts nodes 1, 2 and 3 without waiting for them.
    pub fn launch(extra: &[&str]) -> Self {
        let ports = free_ports(3);
        let peers = (1..=3)
            .map(|id| format!("{id}=127.0.0.1:{}", ports[id - 1]))
            .collect::<Vec<_>>()
            .join(",");
        let nodes = (1..=3u64)
            .map(|id| {
                let id_text = id.to_string();
                let mut args = vec!["--node-id", &id_text, "--cluster-peers", &peers];
                args.extend(FAST);
                args.extend(extra);
                (id, Spate::start(&args))
            })
            .collect();
        Self { nodes, peers }
    }

    /// Starts node `id` as a new process listing the founding peers and itself; it is not a
    /// member of the cluster until added. Returns its inter-node address.
    pub fn start_new_node(&mut self, id: u64, extra: &[&str]) -> String {
        let port = free_ports(1)[0];
        let addr = format!("127.0.0.1:{port}");
        let peers = format!("{},{id}={addr}", self.peers);
        let id_text = id.to_string();
        let mut args = vec!["--node-id", &id_text, "--cluster-peers", &peers];
        args.extend(FAST);
        args.extend(extra);
        self.nodes.insert(id, Spate::start(&args));
        addr
    }

    /// Starts node `id` as an observer: `--cluster-peers` lists only the voters, and its own
    /// `--cluster-listen` is where they reach it.
    pub fn start_observer(&mut self, id: u64, extra: &[&str]) {
        let listen = format!("127.0.0.1:{}", free_ports(1)[0]);
        let id_text = id.to_string();
        let mut args = vec![
            "--node-id",
            &id_text,
            "--cluster-peers",
            &self.peers,
            "--cluster-listen",
            &listen,
        ];
        args.extend(FAST);
        args.extend(extra);
        self.nodes.insert(id, Spate::start(&args));
    }

    /// Ids of the nodes whose processes run.
    pub fn running(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.pid().is_some())
            .map(|(&id, _)| id)
            .collect()
    }

    /// A node by id.
    pub fn node(&mut self, id: u64) -> &mut Spate {
        self.nodes.get_mut(&id).expect("node id")
    }

    /// Kafka addresses of the running nodes.
    pub fn bootstrap(&self) -> String {
        self.nodes
            .values()
            .filter(|n| n.pid().is_some())
            .map(|n| n.addr.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `/admin/cluster` of a node.
    pub fn status(&self, id: u64) -> Option<Value> {
        let n = self.nodes.get(&id)?;
        n.pid()?;
        let (code, body) =
            std::panic::catch_unwind(|| http(&n.http, "GET", "/admin/cluster", &[], "")).ok()?;
        (code == 200)
            .then(|| serde_json::from_str(&body).ok())
            .flatten()
    }

    /// Waits until every node in `ids` answers /ready with 200.
    pub fn wait_ready(&self, ids: &[u64]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        for id in ids {
            let n = &self.nodes[id];
            loop {
                let ok = std::panic::catch_unwind(|| http(&n.http, "GET", "/ready", &[], ""))
                    .is_ok_and(|(code, _)| code == 200);
                if ok {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "node {id} not ready within 60 s:\n{}",
                    n.log()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Waits until `check` holds for the partition as `observer` sees it.
    pub fn wait_partition(
        &self,
        observer: u64,
        topic: &str,
        partition: i64,
        what: &str,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(p) = self
                .status(observer)
                .and_then(|s| find_partition(&s, topic, partition))
            {
                if check(&p) {
                    return p;
                }
                assert!(
                    Instant::now() < deadline,
                    "{what}: not within 60 s; last seen {p}"
                );
            } else {
                assert!(
                    Instant::now() < deadline,
                    "{what}: node {observer} has no status"
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

pub fn find_partition(status: &Value, topic: &str, partition: i64) -> Option<Value> {
    status["partitions"]
        .as_array()?
        .iter()
        .find(|p| p["topic"] == topic && p["partition"] == partition)
        .cloned()
}

pub fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

pub async fn create_replicated(bootstrap: &str, name: &str, partitions: i32, min_isr: &str) {
    let t = NewTopic::new(name, partitions, TopicReplication::Fixed(3))
        .set("min.insync.replicas", min_isr);
    let r = admin(bootstrap)
        .create_topics(&[t], &AdminOptions::new())
        .await
        .expect("create_topics");
    assert!(r[0].is_ok(), "{r:?}");
}

/// Reads `partition` of `topic` from offset 0 until `want` records or the deadline.
pub fn read_values(c: &BaseConsumer, want: usize) -> Vec<u64> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < want && Instant::now() < deadline {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
            let v = m
                .payload()
                .and_then(|p| std::str::from_utf8(p).ok())
                .and_then(|s| s.parse().ok())
                .expect("numeric payload");
            out.push(v);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_leader_during_idempotent_acks_all_loses_and_duplicates_nothing_and_it_rejoins(
) {
    let mut c = ThreeNodes::start(&[]);
    let bootstrap = c.bootstrap();
    create_replicated(&bootstrap, "orders", 1, "2").await;
    let p = c.wait_partition(1, "orders", 0, "ISR of three", |p| {
        ids(&p["isr"]).len() == 3
    });
    let leader = p["leader"].as_u64().expect("leader");
    let epoch = p["leader_epoch"].as_i64().expect("epoch");

    let prod = producer(
        &bootstrap,
        &[("message.timeout.ms", "60000"), ("retry.backoff.ms", "50")],
    );
    const TOTAL: u64 = 3000;
    let mut acked = Vec::new();
    let mut pending = Vec::new();
    for i in 0..TOTAL {
        let value = i.to_string();
        let f = prod.send_result(FutureRecord::<(), _>::to("orders").payload(&value));
        pending.push((i, f.expect("queue")));
        if i == TOTAL / 3 {
            // Let some settle, then kill the leader while the rest are in flight.
            for (v, f) in pending.drain(..) {
                let r = f.await.expect("delivery future");
                assert!(r.is_ok(), "record {v} before the kill: {r:?}");
                acked.push(v);
            }
            c.node(leader).kill9();
        }
    }
    for (v, f) in pending {
        match f.await.expect("delivery future") {
            Ok(_) => acked.push(v),
            Err((e, _)) => panic!("record {v} after the kill was not delivered: {e:?}"),
        }
    }
    assert_eq!(acked.len() as u64, TOTAL);

    // A new leader in a newer epoch, elected from the ISR.
    let survivor = if leader == 1 { 2 } else { 1 };
    let p = c.wait_partition(survivor, "orders", 0, "new leader", |p| {
        p["leader"].as_u64().is_some_and(|l| l != leader)
            && p["leader_epoch"].as_i64() > Some(epoch)
    });
    assert!(!ids(&p["isr"]).contains(&leader) || ids(&p["isr"]).len() == 3);

    // The killed node returns, catches up and rejoins the ISR.
    c.node(leader).restart();
    c.wait_partition(survivor, "orders", 0, "killed node back in the ISR", |p| {
        ids(&p["isr"]).contains(&leader)
    });
    c.wait_ready(&[leader]);

    let cons = consumer(&c.bootstrap(), "orders", &[0], 0);
    let got = read_values(&cons, acked.len());
    let unique: HashSet<u64> = got.iter().copied().collect();
    assert_eq!(unique.len(), got.len(), "duplicates in the log");
    let missing: Vec<u64> = acked
        .iter()
        .filter(|v| !unique.contains(v))
        .copied()
        .collect();
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
    assert!(got.windows(2).all(|w| w[0] < w[1]), "out of order");

    // Every replica holds the same log: the restarted node's log end equals the leader's.
    let lp = c.wait_partition(survivor, "orders", 0, "replicas equal", |p| {
        p["follower_lag"].is_object() || p["following"].is_object()
    });
    let _ = lp;
    let new_leader = p["leader"].as_u64().expect("leader");
    let lead = c.wait_partition(new_leader, "orders", 0, "all followers at the end", |p| {
        let end = p["log_end_offset"].as_i64();
        p["follower_lag"]
            .as_object()
            .is_some_and(|f| f.values().all(|x| x["log_end_offset"].as_i64() == end))
    });
    assert_eq!(lead["high_watermark"].as_i64(), Some(TOTAL as i64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_all_holds_with_one_node_down_and_is_refused_with_two_down_losing_nothing() {
    let mut c = ThreeNodes::start(&[]);
    create_replicated(&c.bootstrap(), "pay", 1, "2").await;
    let p = c.wait_partition(1, "pay", 0, "ISR of three", |p| ids(&p["isr"]).len() == 3);
    let leader = p["leader"].as_u64().expect("leader");
    let others: Vec<u64> = (1..=3).filter(|&n| n != leader).collect();

    // One follower down: acks=all still succeeds (once the ISR drops it).
    c.node(others[0]).kill9();
    let prod = producer(&c.bootstrap(), &[("message.timeout.ms", "30000")]);
    for i in 0..20u64 {
        let v = i.to_string();
        let r = prod
            .send(
                FutureRecord::<(), _>::to("pay").payload(&v),
                Duration::from_secs(30),
            )
            .await;
        assert!(r.is_ok(), "record {i} with one node down: {r:?}");
    }
    c.wait_partition(leader, "pay", 0, "ISR without the dead node", |p| {
        ids(&p["isr"]).len() == 2
    });

    // The second follower leaves with a controlled shutdown, which the quorum commits while
    // it still has a majority: the ISR is the leader alone, below min.insync.replicas.
    c.node(others[1]).stop();
    c.wait_partition(leader, "pay", 0, "ISR of the leader alone", |p| {
        ids(&p["isr"]) == vec![leader]
    });
    let lone = producer(
        &c.bootstrap(),
        &[
            ("enable.idempotence", "false"),
            ("message.timeout.ms", "5000"),
            ("retries", "0"),
        ],
    );
    let r = lone
        .send(
            FutureRecord::<(), _>::to("pay").payload("refused"),
            Duration::from_secs(10),
        )
        .await;
    match r {
        Err((KafkaError::MessageProduction(code), _)) => assert!(
            matches!(
                code,
                RDKafkaErrorCode::NotEnoughReplicas
                    | RDKafkaErrorCode::NotEnoughReplicasAfterAppend
            ),
            "{code:?}"
        ),
        other => panic!("expected NOT_ENOUGH_REPLICAS, got {other:?}"),
    }

    // Both return: nothing acknowledged was lost, the ISR is whole again.
    c.node(others[0]).restart();
    c.node(others[1]).restart();
    c.wait_partition(leader, "pay", 0, "ISR whole again", |p| {
        ids(&p["isr"]).len() == 3
    });
    let cons = consumer(&c.bootstrap(), "pay", &[0], 0);
    let got = read_values(&cons, 20);
    assert_eq!(got, (0..20).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_fetches_from_strangers_or_stale_epochs_are_refused_and_consumers_read_only_from_leaders(
) {
    let mut c = ThreeNodes::start(&[]);
    create_replicated(&c.bootstrap(), "guarded", 1, "2").await;
    let p = c.wait_partition(1, "guarded", 0, "ISR of three", |p| {
        ids(&p["isr"]).len() == 3
    });
    // A controlled restart of the leader moves leadership: the epoch is past 0, so an older
    // one exists to be fenced.
    let first = p["leader"].as_u64().expect("leader");
    c.node(first).stop();
    c.node(first).restart();
    c.wait_ready(&[first]);
    let p = c.wait_partition(first, "guarded", 0, "ISR of three again", |p| {
        ids(&p["isr"]).len() == 3 && p["leader_epoch"].as_i64() > Some(0)
    });
    let leader = p["leader"].as_u64().expect("leader");
    let epoch = p["leader_epoch"].as_i64().expect("epoch") as i32;
    let follower = (1..=3).find(|&n| n != leader).expect("a follower");

    let fetch = |replica: i32, current_epoch: i32| {
        let mut fp = FetchPartition::default();
        fp.partition = 0;
        fp.current_leader_epoch = current_epoch;
        fp.partition_max_bytes = 1 << 20;
        let mut ft = FetchTopic::default();
        ft.topic = TopicName(StrBytes::from_static_str("guarded"));
        ft.partitions = vec![fp];
        let mut r = FetchRequest::default();
        r.replica_id = replica.into();
        r.max_bytes = 1 << 20;
        r.session_epoch = -1;
        r.topics = vec![ft];
        r
    };
    let code = |resp: FetchResponse| resp.responses[0].partitions[0].error_code;
    let mut raw = Raw::connect(&c.nodes[&leader].addr);
    // A broker id that holds no replica.
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &fetch(42, epoch));
    assert_eq!(
        code(resp),
        6,
        "NOT_LEADER_OR_FOLLOWER for an unknown replica"
    );
    // A follower in an older epoch is fenced; a newer one is unknown to this leader.
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &fetch(follower as i32, epoch - 1));
    assert_eq!(code(resp), 74, "FENCED_LEADER_EPOCH");
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &fetch(follower as i32, epoch + 1));
    assert_eq!(code(resp), 75, "UNKNOWN_LEADER_EPOCH");
    // A consumer fetch from a follower: NOT_LEADER_OR_FOLLOWER, so clients refresh metadata.
    let mut raw = Raw::connect(&c.nodes[&follower].addr);
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &fetch(-1, epoch));
    assert_eq!(code(resp), 6);
    // Every node answers Metadata with all three brokers and the same leader.
    for n in c.nodes.values() {
        let md = admin(&n.addr)
            .inner()
            .fetch_metadata(Some("guarded"), Duration::from_secs(10))
            .expect("metadata");
        assert_eq!(md.brokers().len(), 3);
        assert_eq!(md.topics()[0].partitions()[0].leader() as u64, leader);
        assert_eq!(md.topics()[0].partitions()[0].isr().len(), 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_a_taken_node_id_is_refused_and_the_cluster_keeps_serving() {
    let c = ThreeNodes::start(&[]);
    create_replicated(&c.bootstrap(), "solo", 1, "2").await;
    // Another process claims node id 2 with its own data dir, the same peers and its own
    // inter-node listener.
    let status = c.status(1).expect("status");
    let peers = status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| format!("{}={}", n["id"], n["inter_node"].as_str().unwrap_or("")))
        .collect::<Vec<_>>()
        .join(",");
    let listen = format!("127.0.0.1:{}", free_ports(1)[0]);
    let err = run_refused(&[
        "--node-id",
        "2",
        "--cluster-peers",
        &peers,
        "--cluster-listen",
        &listen,
    ]);
    assert!(err.contains("node id 2 is taken"), "{err}");
    // The cluster still takes acks=all writes with all three in the ISR.
    let prod = producer(&c.bootstrap(), &[]);
    let r = prod
        .send(
            FutureRecord::<(), _>::to("solo").payload("ok"),
            Duration::from_secs(20),
        )
        .await;
    assert!(r.is_ok(), "{r:?}");
    c.wait_partition(1, "solo", 0, "ISR of three", |p| ids(&p["isr"]).len() == 3);
}

/// Runs spate with `args` on a fresh data dir, expecting it to refuse to start; its stderr.
fn run_refused(args: &[&str]) -> String {
    let dir = tempfile::tempdir().expect("tmp");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path())
        .args(args)
        .output()
        .expect("run spate");
    assert!(!out.status.success(), "{args:?} must be refused");
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn inconsistent_cluster_flags_are_refused_with_a_reason() {
    let run = run_refused;
    let e = run(&[
        "--node-id",
        "4",
        "--cluster-peers",
        "1=127.0.0.1:1,2=127.0.0.1:2",
    ]);
    assert!(e.contains("--node-id 4 is not in --cluster-peers"), "{e}");
    let e = run(&["--node-id", "1"]);
    assert!(e.contains("--node-id needs --cluster-peers"), "{e}");
    let e = run(&["--cluster-peers", "1=127.0.0.1:1"]);
    assert!(e.contains("--cluster-peers needs --node-id"), "{e}");
    let e = run(&[
        "--node-id",
        "1",
        "--cluster-peers",
        "1=127.0.0.1:1,1=127.0.0.1:2",
    ]);
    assert!(
        e.to_lowercase().contains("duplicate") || e.contains("twice"),
        "{e}"
    );
}

/// A consumer in group `group` subscribed to `topic`, committing only when told.
fn group_consumer(bootstrap: &str, group: &str, topic: &str) -> BaseConsumer {
    let c: BaseConsumer = crate::harness::client_config(bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("fetch.wait.max.ms", "100")
        .create()
        .expect("group consumer");
    rdkafka::consumer::Consumer::subscribe(&c, &[topic]).expect("subscribe");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_offsets_survive_kill_9_of_the_group_coordinator() {
    use rdkafka::consumer::{CommitMode, Consumer};
    let mut c = ThreeNodes::start(&[]);
    create_replicated(&c.bootstrap(), "events", 1, "2").await;
    let prod = producer(&c.bootstrap(), &[]);
    for i in 0..100u64 {
        let v = i.to_string();
        prod.send(
            FutureRecord::<(), _>::to("events").payload(&v),
            Duration::from_secs(20),
        )
        .await
        .expect("produce");
    }
    // The group's offsets partition exists with three in-sync replicas.
    let offsets_partition = offsets_partition_of("billing");
    let offsets = c.wait_partition(
        1,
        "__consumer_offsets",
        offsets_partition,
        "offsets topic replicated",
        |p| ids(&p["isr"]).len() == 3,
    );
    let first = group_consumer(&c.bootstrap(), "billing", "events");
    let got = read_values(&first, 50);
    assert_eq!(got, (0..50).collect::<Vec<_>>());
    first
        .commit_consumer_state(CommitMode::Sync)
        .expect("commit");
    drop(first);

    // Kill the coordinator: the leader of the group's offsets partition.
    let coordinator = offsets["leader"].as_u64().expect("coordinator");
    let epoch = offsets["leader_epoch"].as_i64().expect("epoch");
    c.node(coordinator).kill9();
    let observer = if coordinator == 1 { 2 } else { 1 };
    c.wait_partition(
        observer,
        "__consumer_offsets",
        offsets_partition,
        "new coordinator",
        |p| {
            p["leader"].as_u64().is_some_and(|l| l != coordinator)
                && p["leader_epoch"].as_i64() > Some(epoch)
        },
    );

    // The group carries on from its committed offset on the new coordinator.
    let second = group_consumer(&c.bootstrap(), "billing", "events");
    let rest = read_values(&second, 50);
    assert_eq!(
        rest.first(),
        Some(&50),
        "resumed at the committed offset: {rest:?}"
    );
    assert_eq!(rest, (50..100).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_with_an_empty_data_dir_catches_up_without_losing_records() {
    let mut c = ThreeNodes::start(&[]);
    create_replicated(&c.bootstrap(), "wiped", 1, "2").await;
    let p = c.wait_partition(1, "wiped", 0, "ISR of three", |p| ids(&p["isr"]).len() == 3);
    let leader = p["leader"].as_u64().expect("leader");
    // A follower that is not the first node (the first one forms the cluster).
    let victim = (2..=3).find(|&n| n != leader).expect("a follower");
    let prod = producer(&c.bootstrap(), &[]);
    for i in 0..50u64 {
        let v = i.to_string();
        prod.send(
            FutureRecord::<(), _>::to("wiped").payload(&v),
            Duration::from_secs(20),
        )
        .await
        .expect("produce");
    }
    let node = c.node(victim);
    node.kill9();
    std::fs::remove_dir_all(node.data_dir()).expect("wipe the data dir");
    node.restart();
    assert!(
        node.wait_for_log("joining"),
        "the wiped node says what it does:\n{}",
        node.log()
    );
    // It registers again once its old registration is fenced, copies the partition from the
    // leader and rejoins the ISR; nothing acknowledged is lost.
    c.wait_partition(leader, "wiped", 0, "wiped node back in the ISR", |p| {
        ids(&p["isr"]).contains(&victim)
            && p["follower_lag"][victim.to_string()]["log_end_offset"].as_i64() == Some(50)
    });
    for i in 50..60u64 {
        let v = i.to_string();
        prod.send(
            FutureRecord::<(), _>::to("wiped").payload(&v),
            Duration::from_secs(20),
        )
        .await
        .expect("produce after the rejoin");
    }
    let cons = consumer(&c.bootstrap(), "wiped", &[0], 0);
    assert_eq!(read_values(&cons, 60), (0..60).collect::<Vec<_>>());
}

#[test]
fn nodes_with_different_peer_lists_do_not_form_a_cluster_and_say_why() {
    let ports = free_ports(4);
    let ours = format!(
        "1=127.0.0.1:{},2=127.0.0.1:{},3=127.0.0.1:{}",
        ports[0], ports[1], ports[2]
    );
    // Node 2 was given another address for node 3.
    let theirs = format!(
        "1=127.0.0.1:{},2=127.0.0.1:{},3=127.0.0.1:{}",
        ports[0], ports[1], ports[3]
    );
    let one = Spate::start(&["--node-id", "1", "--cluster-peers", &ours]);
    let two = Spate::start(&["--node-id", "2", "--cluster-peers", &theirs]);
    assert!(
        one.wait_for_log("--cluster-peers differs between this node and a peer"),
        "node 1 must say why it does not form the cluster:\n{}",
        one.log()
    );
    let (code, body) = http(&one.http, "GET", "/ready", &[], "");
    assert_eq!(code, 503, "not ready without a quorum: {body}");
    drop(two);
}

/// A node that answers /ready while every broker is live already holds the offsets topic: it
/// does not say ready for the moment between the last broker joining and that topic's
/// creation, then go back to catching up its replicas (scripts waiting for "all ready" saw
/// exactly that).
#[test]
fn a_ready_node_with_every_broker_live_already_holds_the_offsets_topic() {
    let c = ThreeNodes::launch(&[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut checked = [false; 3];
    while !checked.iter().all(|&c| c) {
        assert!(
            Instant::now() < deadline,
            "the nodes never became ready with every broker live: checked {checked:?}"
        );
        for id in 1..=3u64 {
            let slot = &mut checked[id as usize - 1];
            if *slot {
                continue;
            }
            // Live brokers first, then readiness, then the topic: brokers do not leave here,
            // so all three live before the /ready answer means all three live at it.
            let Some(before) = c.status(id) else { continue };
            let live = before["nodes"]
                .as_array()
                .map_or(0, |n| n.iter().filter(|n| n["fenced"] == false).count());
            let node = &c.nodes[&id];
            let ready = std::panic::catch_unwind(|| http(&node.http, "GET", "/ready", &[], ""))
                .is_ok_and(|(code, _)| code == 200);
            if live < 3 || !ready {
                continue;
            }
            let after = c.status(id).expect("status of a ready node");
            let offsets = after["partitions"].as_array().map_or(0, |p| {
                p.iter()
                    .filter(|p| p["topic"] == "__consumer_offsets")
                    .count()
            });
            assert_eq!(
                offsets, OFFSETS_PARTITIONS,
                "node {id} said ready with three live brokers before holding __consumer_offsets: {after}"
            );
            *slot = true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_the_leaders_log_start_restarts_there_and_rejoins() {
    let mut c = ThreeNodes::start(&["--retention-check-interval-ms", "200"]);
    let t = NewTopic::new("short", 1, TopicReplication::Fixed(3))
        .set("segment.bytes", "2048")
        .set("retention.bytes", "4096");
    let r = admin(&c.bootstrap())
        .create_topics(&[t], &AdminOptions::new())
        .await
        .expect("create_topics");
    assert!(r[0].is_ok(), "{r:?}");
    let p = c.wait_partition(1, "short", 0, "ISR of three", |p| ids(&p["isr"]).len() == 3);
    let leader = p["leader"].as_u64().expect("leader");
    let victim = (2..=3).find(|&n| n != leader).expect("a follower");
    c.node(victim).kill9();
    // Enough 200-byte records, one batch each, for retention to delete the first segments.
    // The first waits for the ISR to drop the killed follower, which takes longer than the
    // default 20 s delivery timeout on a loaded machine.
    let prod = producer(
        &c.bootstrap(),
        &[("linger.ms", "0"), ("message.timeout.ms", "60000")],
    );
    let value = "x".repeat(200);
    for _ in 0..120 {
        prod.send(
            FutureRecord::<(), _>::to("short").payload(&value),
            Duration::from_secs(20),
        )
        .await
        .expect("produce");
    }
    let started_after_zero = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let start = crate::harness::http(
                &c.nodes[&leader].http,
                "GET",
                "/admin/topics/short",
                &[],
                "",
            )
            .1;
            let v: Value = serde_json::from_str(&start).expect("topic json");
            let s = v["partition_details"][0]["log_start_offset"]
                .as_i64()
                .unwrap_or(0);
            if s > 0 || Instant::now() > deadline {
                break s;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    assert!(
        started_after_zero > 0,
        "retention did not move the leader's log start"
    );
    // The follower returns with an empty log: it cannot fetch from 0 any more.
    let node = c.node(victim);
    std::fs::remove_dir_all(node.data_dir()).expect("wipe");
    node.restart();
    let lead = c.wait_partition(
        leader,
        "short",
        0,
        "follower restarted at the log start and back in the ISR",
        |p| {
            ids(&p["isr"]).contains(&victim)
                && p["follower_lag"][victim.to_string()]["log_end_offset"] == p["log_end_offset"]
        },
    );
    assert_eq!(lead["log_end_offset"].as_i64(), Some(120));
    assert!(
        c.nodes[&victim].wait_for_log("emptied and restarted at it"),
        "{}",
        c.nodes[&victim].log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spate_cluster_status_says_healthy_then_not_when_a_node_is_down() {
    let mut c = ThreeNodes::start(&[]);
    create_replicated(&c.bootstrap(), "shown", 2, "2").await;
    c.wait_partition(1, "shown", 1, "ISR of three", |p| ids(&p["isr"]).len() == 3);
    let status = |http: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
            .args(["cluster", "status", "--http", http])
            .output()
            .expect("run spate cluster status")
    };
    let http = c.nodes[&1].http.clone();
    let ok = status(&http);
    let text = String::from_utf8_lossy(&ok.stdout).to_string();
    assert!(ok.status.success(), "{text}");
    assert!(
        text.contains("healthy: 0 under-replicated, 0 offline"),
        "{text}"
    );
    // Both partitions, each with three replicas and three in sync.
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| l.starts_with("shown "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 2, "{text}");
    for r in &rows {
        assert_eq!(r[4].split(',').count(), 3, "replicas in {r:?}");
        assert_eq!(r[5].split(',').count(), 3, "ISR in {r:?}");
    }
    // One node down: its partitions shrink their ISR, and the command exits 1.
    c.node(3).kill9();
    c.wait_partition(1, "shown", 0, "ISR without node 3", |p| {
        !ids(&p["isr"]).contains(&3)
    });
    let bad = status(&http);
    let text = String::from_utf8_lossy(&bad.stdout).to_string();
    assert_eq!(bad.status.code(), Some(1), "{text}");
    assert!(text.contains("NOT healthy"), "{text}");
}

#[test]
fn the_admin_http_api_changes_topics_through_the_quorum_on_every_node() {
    let mut c = ThreeNodes::start(&[]);
    // Replication factor 3 needs all three brokers registered.
    c.wait_ready(&[1, 2, 3]);
    let json = [("Content-Type", "application/json")];
    let http2 = c.node(2).http.clone();
    let (code, body) = http(
        &http2,
        "POST",
        "/admin/topics",
        &json,
        r#"{"name":"via-http","partitions":2,"replication_factor":3,"configs":{"retention.ms":"3600000"}}"#,
    );
    assert_eq!(code, 201, "{body}");
    for p in 0..2 {
        c.wait_partition(1, "via-http", p, "three replicas, seen from node 1", |p| {
            ids(&p["replicas"]).len() == 3
        });
    }
    // A config change on one node reaches the others through the metadata log.
    let (code, body) = http(
        &c.node(3).http.clone(),
        "PATCH",
        "/admin/topics/via-http/configs",
        &json,
        r#"{"retention.ms":"7200000"}"#,
    );
    assert_eq!(code, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, body) = http(
            &c.node(1).http.clone(),
            "GET",
            "/admin/topics/via-http",
            &[],
            "",
        );
        let v: Value = serde_json::from_str(&body).expect("JSON");
        if v["configs"]["retention.ms"]["value"] == "7200000" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "config never reached node 1: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, body) = http(
        &http2,
        "POST",
        "/admin/topics/via-http/partitions",
        &json,
        r#"{"count":3}"#,
    );
    assert_eq!(code, 200, "{body}");
    c.wait_partition(
        3,
        "via-http",
        2,
        "the new partition, seen from node 3",
        |p| ids(&p["replicas"]).len() == 3,
    );
    // Refusals keep Kafka's meaning.
    let (code, body) = http(
        &http2,
        "POST",
        "/admin/topics",
        &json,
        r#"{"name":"too-wide","partitions":1,"replication_factor":5}"#,
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("INVALID_REPLICATION_FACTOR"), "{body}");
    let (code, body) = http(&http2, "DELETE", "/admin/topics/via-http", &[], "");
    assert_eq!(code, 204, "{body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while c
        .status(1)
        .and_then(|s| find_partition(&s, "via-http", 0))
        .is_some()
    {
        assert!(Instant::now() < deadline, "the topic stayed on node 1");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_records_on_the_leader_moves_every_replicas_start_and_holds_after_kill_9_of_the_leader(
) {
    let mut c = ThreeNodes::start(&[]);
    create_replicated(&c.bootstrap(), "trimmed", 1, "2").await;
    let p = c.wait_partition(1, "trimmed", 0, "ISR of three", |p| {
        ids(&p["isr"]).len() == 3
    });
    let leader = p["leader"].as_u64().expect("leader");
    let prod = producer(&c.bootstrap(), &[]);
    for i in 0..40u64 {
        let v = i.to_string();
        prod.send(
            FutureRecord::<(), _>::to("trimmed").payload(&v),
            Duration::from_secs(20),
        )
        .await
        .expect("produce");
    }
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset("trimmed", 0, rdkafka::Offset::Offset(30))
        .expect("tpl");
    let done = admin(&c.bootstrap())
        .delete_records(&tpl, &AdminOptions::new())
        .await
        .expect("delete_records");
    assert!(done.elements()[0].error().is_ok(), "{:?}", done.elements());
    assert_eq!(done.elements()[0].offset(), rdkafka::Offset::Offset(30));
    // The answer waited for the low watermark: every in-sync follower has moved already.
    for node in (1..=3).filter(|&n| n != leader) {
        let body = http(
            &c.nodes[&node].http,
            "GET",
            "/admin/topics/trimmed",
            &[],
            "",
        )
        .1;
        let v: Value = serde_json::from_str(&body).expect("topic json");
        assert_eq!(
            v["partition_details"][0]["log_start_offset"].as_i64(),
            Some(30),
            "node {node} still starts earlier: {v}"
        );
    }
    c.node(leader).kill9();
    let survivor = (1..=3).find(|&n| n != leader).expect("a survivor");
    c.wait_partition(survivor, "trimmed", 0, "a new leader", |p| {
        p["leader"].as_u64().is_some_and(|l| l != leader)
    });
    // The new leader serves from 30 and still holds every record after it.
    let cons = consumer(&c.bootstrap(), "trimmed", &[0], 30);
    // A node that has not applied the new leadership yet answers NOT_LEADER: a client asks
    // again once its metadata is fresh, and so does this check.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (low, high) = loop {
        match cons.fetch_watermarks("trimmed", 0, Duration::from_secs(10)) {
            Ok(w) => break w,
            Err(e) => {
                assert!(Instant::now() < deadline, "watermarks: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    assert_eq!((low, high), (30, 40));
    assert_eq!(read_values(&cons, 10), (30..40).collect::<Vec<_>>());
}

/// ListOffsets latest for partition 0 of `topic` on one connection: (error code, offset).
fn latest_offset(raw: &mut Raw, topic: &str) -> (i16, i64) {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
    let mut lp = ListOffsetsPartition::default();
    lp.partition_index = 0;
    lp.timestamp = -1;
    lp.current_leader_epoch = -1;
    let mut lt = ListOffsetsTopic::default();
    lt.name = TopicName(StrBytes::from_string(topic.to_string()));
    lt.partitions = vec![lp];
    let mut req = ListOffsetsRequest::default();
    req.replica_id = (-1).into();
    req.topics = vec![lt];
    let resp: ListOffsetsResponse = raw.call(ApiKey::ListOffsets, 7, &req);
    let p = &resp.topics[0].partitions[0];
    (p.error_code, p.offset)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_old_leader_answers_only_once_caught_up_and_takes_no_produce_as_leader() {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{MetadataRequest, MetadataResponse, ProduceResponse};
    let mut c = ThreeNodes::start(&[]);
    create_replicated(&c.bootstrap(), "stale", 1, "1").await;
    let p = c.wait_partition(1, "stale", 0, "ISR of three", |p| ids(&p["isr"]).len() == 3);
    let old = p["leader"].as_u64().expect("leader");
    let observer = (1..=3).find(|&n| n != old).expect("another node");
    let prod = producer(&c.bootstrap(), &[("acks", "all")]);
    for i in 0..5 {
        prod.send(
            FutureRecord::<(), _>::to("stale").payload(&i.to_string()),
            Duration::from_secs(20),
        )
        .await
        .expect("produce");
    }
    drop(prod);
    c.node(old).kill9();
    let moved = c.wait_partition(
        observer,
        "stale",
        0,
        "leadership moved off the killed node",
        |p| p["leader"].as_u64().is_some_and(|l| l != old) && !ids(&p["isr"]).contains(&old),
    );
    let new_leader = moved["leader"].as_u64().expect("new leader");
    c.node(old).restart();
    // The very first request to the restarted node: its local log still says it leads the
    // partition at the old epoch. It must not take the produce as leader (acks=1 would be
    // acknowledged, then truncated away when it follows the new leader).
    let mut raw = Raw::connect(&c.nodes[&old].addr);
    let req = crate::bad_input::produce("stale", crate::bad_input::batch(-1, 0, 1), 1);
    let resp: ProduceResponse = raw.call(ApiKey::Produce, 9, &req);
    let code = resp.responses[0].partition_responses[0].error_code;
    assert_eq!(
        code, 6,
        "a restarted old leader answered a produce with {code}, not NOT_LEADER_OR_FOLLOWER"
    );
    // Its Metadata names the leader the survivors elected, not its pre-crash view.
    let mut md = MetadataRequest::default();
    let mut t = MetadataRequestTopic::default();
    t.name = Some(TopicName(StrBytes::from_static_str("stale")));
    md.topics = Some(vec![t]);
    let resp: MetadataResponse = raw.call(ApiKey::Metadata, 12, &md);
    let leader = resp.topics[0].partitions[0].leader_id.0;
    assert_eq!(
        leader as u64, new_leader,
        "the restarted node answered its stale leadership: {resp:?}"
    );
    // The leader it names answers, and holds exactly the five acknowledged records.
    // OFFSET_NOT_AVAILABLE (retriable) until its high watermark reaches its epoch start.
    let mut to_leader = Raw::connect(&c.nodes[&new_leader].addr);
    let deadline = Instant::now() + Duration::from_secs(20);
    let latest = loop {
        let got = latest_offset(&mut to_leader, "stale");
        if got.0 != 78 || Instant::now() > deadline {
            break got;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(latest, (0, 5));
    let back = c.wait_partition(new_leader, "stale", 0, "old leader back in the ISR", |p| {
        ids(&p["isr"]).contains(&old)
    });
    assert_eq!(back["log_end_offset"].as_i64(), Some(5), "{back}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_could_not_be_created_is_created_once_the_disk_allows_it() {
    let mut c = ThreeNodes::start(&[]);
    // A file where node 3 would make the topic's directory: creating its replica fails, as
    // on a full disk, and nothing else about the topic changes afterwards.
    let blocker = c.node(3).data_dir().join("topics").join("blocked");
    std::fs::write(&blocker, b"in the way").expect("blocker file");
    create_replicated(&c.bootstrap(), "blocked", 1, "1").await;
    assert!(
        c.node(3)
            .wait_for_log("cannot create the local replica of a topic"),
        "{}",
        c.node(3).log()
    );
    std::fs::remove_file(&blocker).expect("remove blocker");
    let prod = producer(
        &c.bootstrap(),
        &[("acks", "all"), ("message.timeout.ms", "30000")],
    );
    prod.send(
        FutureRecord::<(), _>::to("blocked").payload("one"),
        Duration::from_secs(30),
    )
    .await
    .expect("produce");
    c.wait_partition(3, "blocked", 0, "node 3 holds the record", |p| {
        p["log_end_offset"] == 1 || p["following"]["log_end_offset"] == 1
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_that_outlived_its_session_takes_no_produce_when_it_resumes() {
    use kafka_protocol::messages::ProduceResponse;
    let signal = |pid: u32, sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{sig} {pid}");
    };
    let c = ThreeNodes::start(&[]);
    create_replicated(&c.bootstrap(), "paused", 1, "1").await;
    let p = c.wait_partition(1, "paused", 0, "ISR of three", |p| {
        ids(&p["isr"]).len() == 3
    });
    let old = p["leader"].as_u64().expect("leader");
    let observer = (1..=3).find(|&n| n != old).expect("another node");
    let mut raw = Raw::connect(&c.nodes[&old].addr);
    let produce = |first: i32, acks: i16| {
        crate::bad_input::produce("paused", crate::bad_input::batch(-1, first, 1), acks)
    };
    // acks=all: this one is on every replica before the pause, so it must survive it.
    let resp: ProduceResponse = raw.call(ApiKey::Produce, 9, &produce(0, -1));
    assert_eq!(resp.responses[0].partition_responses[0].error_code, 0);
    let pid = c.nodes[&old].pid().expect("pid");
    signal(pid, "STOP");
    c.wait_partition(
        observer,
        "paused",
        0,
        "a new leader while the old one is paused",
        |p| p["leader"].as_u64().is_some_and(|l| l != old),
    );
    // Sent while it is paused: the request waits in its socket, beside the quorum's news.
    raw.send(ApiKey::Produce, 9, &produce(1, 1));
    signal(pid, "CONT");
    let (_, resp): (i32, ProduceResponse) = raw.recv(ApiKey::Produce, 9);
    let code = resp.responses[0].partition_responses[0].error_code;
    assert_eq!(
        code, 6,
        "a leader that outlived its session took a produce ({code}) after resuming"
    );
    let back = c.wait_partition(observer, "paused", 0, "old leader back in the ISR", |p| {
        ids(&p["isr"]).contains(&old)
    });
    let leader = back["leader"].as_u64().expect("leader");
    let mut to_leader = Raw::connect(&c.nodes[&leader].addr);
    assert_eq!(latest_offset(&mut to_leader, "paused"), (0, 1));
}
