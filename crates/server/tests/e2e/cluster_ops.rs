//! Changing a running cluster with real processes: a fourth node joins and takes partitions
//! through AlterPartitionReassignments while an idempotent acks=all producer runs, it is then
//! decommissioned, a move survives kill -9 of the controller, every node is restarted in
//! turn, and bad operations are refused with Kafka's codes. After each change every
//! acknowledged record is read back: nothing lost, duplicated or reordered.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_protocol::messages::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, ApiKey, BrokerId,
    ElectLeadersRequest, ElectLeadersResponse, ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use serde_json::Value;

use crate::cluster::{create_replicated, find_partition, ids, ThreeNodes};
use crate::harness::{alter_config, consumer, http, producer, Raw};

const TOPIC_PARTITIONS: i32 = 3;

/// What a background producer saw: acknowledged values per partition, and failures.
#[derive(Default)]
struct Acked {
    by_partition: BTreeMap<i32, Vec<u64>>,
    failures: Vec<String>,
}

/// An idempotent acks=all producer writing increasing values round-robin over the
/// partitions until stopped (at most `max` records, paced so the test data stays small).
struct Load {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Acked>>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(bootstrap: &str, topic: &str, max: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Acked::default()));
        let p = producer(
            bootstrap,
            &[
                ("message.timeout.ms", "60000"),
                ("retries", "2147483647"),
                ("max.in.flight.requests.per.connection", "5"),
            ],
        );
        let (s, a, t) = (stop.clone(), acked.clone(), topic.to_owned());
        let task = tokio::spawn(async move {
            let mut pending = Vec::new();
            let mut value = 0u64;
            while !s.load(Ordering::SeqCst) && value < max {
                let partition = (value % TOPIC_PARTITIONS as u64) as i32;
                let payload = value.to_string();
                let f = p.send_result(
                    FutureRecord::<(), _>::to(&t)
                        .payload(&payload)
                        .partition(partition),
                );
                match f {
                    Ok(f) => pending.push((partition, value, f)),
                    Err((e, _)) => a.lock().unwrap().failures.push(format!("enqueue: {e}")),
                }
                value += 1;
                if pending.len() >= 50 {
                    drain(&a, &mut pending).await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            drain(&a, &mut pending).await;
        });
        Self { stop, acked, task }
    }

    async fn finish(self) -> Acked {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("producer task");
        Arc::try_unwrap(self.acked)
            .ok()
            .expect("sole owner")
            .into_inner()
            .expect("lock")
    }

    fn count(&self) -> usize {
        self.acked
            .lock()
            .unwrap()
            .by_partition
            .values()
            .map(Vec::len)
            .sum()
    }
}

type Pending = Vec<(i32, u64, rdkafka::producer::DeliveryFuture)>;

async fn drain(acked: &Mutex<Acked>, pending: &mut Pending) {
    for (partition, value, f) in pending.drain(..) {
        match f.await {
            Ok(Ok(_)) => acked
                .lock()
                .unwrap()
                .by_partition
                .entry(partition)
                .or_default()
                .push(value),
            Ok(Err((e, _))) => acked
                .lock()
                .unwrap()
                .failures
                .push(format!("value {value}: {e}")),
            Err(_) => acked
                .lock()
                .unwrap()
                .failures
                .push(format!("value {value}: delivery dropped")),
        }
    }
}

/// Reads every partition from the start and checks it holds exactly the acknowledged values
/// in the order they were sent: nothing lost, duplicated or reordered.
fn check_read_back(bootstrap: &str, topic: &str, acked: &Acked) {
    for partition in 0..TOPIC_PARTITIONS {
        let want = acked
            .by_partition
            .get(&partition)
            .cloned()
            .unwrap_or_default();
        let c = consumer(bootstrap, topic, &[partition], 0);
        let mut got: Vec<u64> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while got.len() < want.len() && Instant::now() < deadline {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
                got.push(
                    m.payload()
                        .and_then(|p| std::str::from_utf8(p).ok())
                        .and_then(|s| s.parse().ok())
                        .expect("numeric payload"),
                );
            }
        }
        // A record whose acknowledgement was lost to a failure may be present once more than
        // acked; none was (failures are asserted empty), so the log must equal what was acked.
        assert_eq!(
            got.len(),
            want.len(),
            "partition {partition}: read {} records, {} were acknowledged",
            got.len(),
            want.len()
        );
        assert_eq!(got, want, "partition {partition}: records differ from the acknowledged ones (lost, duplicated or reordered)");
    }
}

fn post(addr: &str, path: &str, body: &str) -> (u16, Value) {
    let (code, text) = http(addr, "POST", path, &[], body);
    (code, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn reassign_request(moves: &[(&str, i32, Option<Vec<i32>>)]) -> AlterPartitionReassignmentsRequest {
    let mut by_topic: BTreeMap<&str, Vec<ReassignablePartition>> = BTreeMap::new();
    for (topic, partition, replicas) in moves {
        let mut p = ReassignablePartition::default();
        p.partition_index = *partition;
        p.replicas = replicas
            .as_ref()
            .map(|r| r.iter().map(|&b| BrokerId(b)).collect());
        by_topic.entry(topic).or_default().push(p);
    }
    let mut req = AlterPartitionReassignmentsRequest::default();
    req.timeout_ms = 30_000;
    req.topics = by_topic
        .into_iter()
        .map(|(t, partitions)| {
            let mut rt = ReassignableTopic::default();
            rt.name = TopicName(StrBytes::from_string(t.to_owned()));
            rt.partitions = partitions;
            rt
        })
        .collect();
    req
}

fn alter(addr: &str, moves: &[(&str, i32, Option<Vec<i32>>)]) -> Vec<(i32, i16, String)> {
    let mut raw = Raw::connect(addr);
    let resp: AlterPartitionReassignmentsResponse = raw.call(
        ApiKey::AlterPartitionReassignments,
        0,
        &reassign_request(moves),
    );
    assert_eq!(resp.error_code, 0, "{resp:?}");
    resp.responses
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                (
                    p.partition_index,
                    p.error_code,
                    p.error_message
                        .as_ref()
                        .map(|m| m.to_string())
                        .unwrap_or_default(),
                )
            })
        })
        .collect()
}

fn moving(addr: &str) -> usize {
    let mut raw = Raw::connect(addr);
    let resp: ListPartitionReassignmentsResponse = raw.call(
        ApiKey::ListPartitionReassignments,
        0,
        &ListPartitionReassignmentsRequest::default(),
    );
    resp.topics.iter().map(|t| t.partitions.len()).sum()
}

/// Waits until `check` holds for the cluster status node `observer` reports.
fn wait_status(c: &ThreeNodes, observer: u64, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(s) = c.status(observer) {
            if check(&s) {
                return s;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within 90 s; last {:?}",
            c.status(observer)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn holds(status: &Value, broker: u64) -> Vec<i64> {
    status["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["topic"] == "moving" && ids(&p["replicas"]).contains(&broker))
        .filter_map(|p| p["partition"].as_i64())
        .collect()
}

/// Starts node 4, adds it through the admin API of node 1, and waits until it is a live
/// broker and a voter; returns node 1's status then.
fn add_fourth_node(c: &mut ThreeNodes) -> Value {
    let addr4 = c.start_new_node(4, &[]);
    let http1 = c.node(1).http.clone();
    let (code, body) = post(
        &http1,
        "/admin/cluster/nodes",
        &format!(r#"{{"node_id":4,"addr":"{addr4}"}}"#),
    );
    assert_eq!(code, 200, "{body}");
    wait_status(c, 1, "node 4 registered", |s| {
        s["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|n| n["id"] == 4 && n["fenced"] == false)
            && ids(&s["voters"]).contains(&4)
    })
}

/// Three nodes and the topic "moving" (RF 3, min.insync.replicas 2) fully in sync.
async fn three_nodes_with_moving_topic() -> (ThreeNodes, String) {
    let c = ThreeNodes::start(&[]);
    let bootstrap = c.bootstrap();
    create_replicated(&bootstrap, "moving", TOPIC_PARTITIONS, "2").await;
    for p in 0..TOPIC_PARTITIONS {
        c.wait_partition(1, "moving", p.into(), "ISR of three", |p| {
            ids(&p["isr"]).len() == 3
        });
    }
    (c, bootstrap)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_node_joins_takes_partitions_and_is_decommissioned_while_producing_loses_nothing()
{
    let (mut c, bootstrap) = three_nodes_with_moving_topic().await;
    let load = Load::start(&bootstrap, "moving", 20_000);
    // The moves below happen under a producer that is known to be delivering.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while load.count() == 0 {
        assert!(
            std::time::Instant::now() < deadline && !load.task.is_finished(),
            "the producer never got an acknowledgement"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Grow: node 4 starts, is added through the admin API, and registers as a broker.
    let status = add_fourth_node(&mut c);
    let http1 = c.node(1).http.clone();
    // Move a third of the partitions onto node 4 with the Kafka API.
    let p0 = find_partition(&status, "moving", 0).expect("partition 0");
    let mut target = ids(&p0["replicas"]);
    let replaced = target[0];
    target[0] = 4;
    let target: Vec<i32> = target.iter().map(|&b| b as i32).collect();
    let results = alter(&c.node(1).addr, &[("moving", 0, Some(target.clone()))]);
    assert_eq!(results, vec![(0, 0, String::new())]);
    wait_status(&c, 1, "the move onto node 4 completed", |s| {
        find_partition(s, "moving", 0).is_some_and(|p| {
            ids(&p["replicas"]) == target.iter().map(|&b| b as u64).collect::<Vec<_>>()
                && ids(&p["isr"]).len() == 3
        })
    });
    assert_eq!(moving(&c.node(2).addr), 0, "no move left in progress");

    // Shrink: decommission node 4; its replica moves back to the others and it leaves.
    let (code, body) = post(&http1, "/admin/cluster/nodes/4/decommission", "");
    assert_eq!(code, 200, "{body}");
    let status = wait_status(&c, 1, "node 4 left the cluster", |s| {
        !s["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|n| n["id"] == 4)
            && !ids(&s["voters"]).contains(&4)
    });
    assert!(
        holds(&status, 4).is_empty(),
        "node 4 still holds replicas: {status}"
    );
    assert!(holds(&status, replaced).len() + holds(&status, 4).len() <= TOPIC_PARTITIONS as usize);
    assert!(
        c.node(4).wait_for_log("decommissioned"),
        "node 4 says it was decommissioned:\n{}",
        c.node(4).log()
    );

    let acked = load.finish().await;
    assert!(
        acked.failures.is_empty(),
        "failed deliveries: {:?}",
        acked.failures
    );
    check_read_back(&c.bootstrap(), "moving", &acked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reassignment_completes_after_kill_9_of_the_controller_mid_move() {
    let (mut c, bootstrap) = three_nodes_with_moving_topic().await;
    // Some data to copy, then a slow follower throttle on node 4 so the move is still in
    // progress when the controller dies.
    let load = Load::start(&bootstrap, "moving", 3_000);
    while load.count() < 3_000 && !load.task.is_finished() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let acked = load.finish().await;
    assert!(acked.failures.is_empty(), "{:?}", acked.failures);
    add_fourth_node(&mut c);
    let mut admin = Raw::connect(&c.node(1).addr);
    // Both sides, as kafka-reassign-partitions --throttle sets them: node 4 fetches at most
    // 2000 B/s, and every leader serves throttled replicas at most 4000 B/s.
    throttle(
        &mut admin,
        "4",
        "follower.replication.throttled.rate",
        "2000",
    );
    throttle(&mut admin, "", "leader.replication.throttled.rate", "4000");
    throttle_topic(
        &mut admin,
        "moving",
        "follower.replication.throttled.replicas",
        "*",
    );
    throttle_topic(
        &mut admin,
        "moving",
        "leader.replication.throttled.replicas",
        "*",
    );

    let status = c.status(1).expect("status");
    let controller = status["controller"].as_u64().expect("controller");
    let p1 = find_partition(&status, "moving", 1).expect("partition 1");
    let mut target: Vec<i32> = ids(&p1["replicas"]).iter().map(|&b| b as i32).collect();
    // Move the controller's replica to node 4: the target must not include the node about
    // to die, since a move completes only once every target replica is in sync.
    let slot = target
        .iter()
        .position(|&b| b as u64 == controller)
        .expect("the controller holds a replica");
    target[slot] = 4;
    let observer = c
        .running()
        .into_iter()
        .find(|&id| id != controller && id != 4)
        .expect("observer");
    let results = alter(
        &c.node(observer).addr,
        &[("moving", 1, Some(target.clone()))],
    );
    assert_eq!(results, vec![(1, 0, String::new())]);
    wait_status(&c, observer, "the move is in progress", |s| {
        find_partition(s, "moving", 1).is_some_and(|p| !p["adding"].is_null())
    });
    // The throttles are in force: node 4 counts throttled fetch bytes, and some leader counts
    // throttled bytes served.
    let counter = |c: &mut ThreeNodes, id: u64, name: &str| -> f64 {
        let addr = c.node(id).http.clone();
        let (_, text) = http(&addr, "GET", "/metrics", &[], "");
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let fetched = counter(&mut c, 4, "spate_cluster_throttled_replication_bytes_total");
        let mut served = 0.0;
        for id in c.running() {
            served += counter(
                &mut c,
                id,
                "spate_cluster_leader_throttled_replication_bytes_total",
            );
        }
        if fetched > 0.0 && served > 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "throttled bytes: fetched {fetched}, served {served}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    c.node(controller).kill9();
    // Lift the throttle through a surviving node: the move may now finish, and only a new
    // controller can complete it.
    let mut admin = Raw::connect(&c.node(observer).addr);
    throttle(&mut admin, "4", "follower.replication.throttled.rate", "");
    throttle(&mut admin, "", "leader.replication.throttled.rate", "");
    wait_status(
        &c,
        observer,
        "the move completed under a new controller",
        |s| {
            s["controller"].as_u64().is_some_and(|k| k != controller)
                && find_partition(s, "moving", 1).is_some_and(|p| {
                    ids(&p["replicas"]) == target.iter().map(|&b| b as u64).collect::<Vec<_>>()
                        && p["adding"].is_null()
                        && ids(&p["isr"]).contains(&4)
                })
        },
    );
    check_read_back(&c.bootstrap(), "moving", &acked);
}

fn throttle(raw: &mut Raw, broker: &str, key: &str, value: &str) {
    let (code, message) = alter_config(raw, 4, broker, key, value);
    assert_eq!(code, 0, "{key}={value} on broker {broker}: {message}");
}

fn throttle_topic(raw: &mut Raw, topic: &str, key: &str, value: &str) {
    let (code, message) = alter_config(raw, 2, topic, key, value);
    assert_eq!(code, 0, "{key}={value} on {topic}: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_operations_get_kafka_codes_or_clear_errors_and_change_nothing() {
    let mut c = ThreeNodes::start(&[]);
    let bootstrap = c.bootstrap();
    create_replicated(&bootstrap, "moving", TOPIC_PARTITIONS, "2").await;
    c.wait_partition(1, "moving", 0, "ISR of three", |p| {
        ids(&p["isr"]).len() == 3
    });
    let before = c.status(1).expect("status")["partitions"].clone();
    let addr = c.node(1).addr.clone();

    let bad = alter(
        &addr,
        &[
            ("moving", 0, Some(vec![1, 2, 9])),
            ("moving", 1, Some(vec![1, 1, 2])),
            ("moving", 2, None),
        ],
    );
    assert_eq!(bad[0].1, 39, "a broker that does not exist: {:?}", bad[0]);
    assert!(bad[0].2.contains("does not exist"), "{:?}", bad[0]);
    assert_eq!(bad[1].1, 39, "a replica listed twice: {:?}", bad[1]);
    assert_eq!(bad[2].1, 85, "cancelling nothing: {:?}", bad[2]);
    let gone = alter(&addr, &[("no-such-topic", 0, Some(vec![1, 2, 3]))]);
    assert_eq!(
        gone[0].1, 3,
        "a topic that does not exist (or is being deleted)"
    );
    let rf = {
        let mut raw = Raw::connect(&addr);
        let mut req = reassign_request(&[("moving", 0, Some(vec![1, 2]))]);
        req.allow_replication_factor_change = false;
        let resp: AlterPartitionReassignmentsResponse =
            raw.call(ApiKey::AlterPartitionReassignments, 1, &req);
        resp.responses[0].partitions[0].error_code
    };
    assert_eq!(
        rf, 38,
        "changing the replication factor without allowing it"
    );

    // Preferred leaders already lead: ELECTION_NOT_NEEDED.
    let mut raw = Raw::connect(&addr);
    let mut req = ElectLeadersRequest::default();
    req.election_type = 0;
    let mut tp = TopicPartitions::default();
    tp.topic = TopicName(StrBytes::from_static_str("moving"));
    tp.partitions = vec![0, 7];
    req.topic_partitions = Some(vec![tp]);
    req.timeout_ms = 10_000;
    let resp: ElectLeadersResponse = raw.call(ApiKey::ElectLeaders, 2, &req);
    let codes: Vec<i16> = resp.replica_election_results[0]
        .partition_result
        .iter()
        .map(|p| p.error_code)
        .collect();
    assert_eq!(codes, vec![84, 3], "{resp:?}");

    // Decommissioning: RF 3 on three nodes cannot lose one; two at once is a majority; an
    // unknown node is named.
    let http1 = c.node(1).http.clone();
    let (code, body) = post(&http1, "/admin/cluster/nodes/3/decommission", "");
    assert_eq!(code, 400, "{body}");
    assert!(body.to_string().contains("replication factor 3"), "{body}");
    let (code, body) = post(&http1, "/admin/cluster/nodes/9/decommission", "");
    assert_eq!(code, 400, "{body}");
    assert!(body.to_string().contains("not registered"), "{body}");
    // Adding a node nobody runs does not hang: it names the address it could not reach.
    let (code, body) = post(&http1, "/admin/cluster/nodes", r#"{"node_id":7}"#);
    assert_eq!(code, 400, "a body without addr: {body}");
    let (code, body) = post(
        &http1,
        "/admin/cluster/elect-leaders",
        r#"{"type":"sideways"}"#,
    );
    assert_eq!(code, 400, "{body}");
    // A dynamic broker config that does not exist, and a bad value.
    let (code, message) = alter_config(&mut raw, 4, "1", "log.dirs", "/tmp");
    assert_eq!(code, 40, "{message}");
    let (code, message) = alter_config(&mut raw, 4, "1", "leader.replication.throttled.rate", "-1");
    assert_eq!(code, 40, "{message}");

    // The same refusals through `spate cluster`: a non-zero exit and the reason.
    let (ok, out) = cli(&["decommission", "3", "--http", &http1]);
    assert!(!ok && out.contains("replication factor 3"), "{out}");
    let (ok, out) = cli(&[
        "reassign",
        "plan",
        "--http",
        &http1,
        "--topics",
        "moving",
        "--brokers",
        "1,9",
    ]);
    assert!(!ok && out.contains("broker 9 is not a node"), "{out}");
    let (ok, out) = cli(&["reassign", "status", "--http", &http1]);
    assert!(ok && out.contains("no reassignment in progress"), "{out}");
    let (ok, out) = cli(&["balance", "--dry-run", "--http", &http1]);
    assert!(
        ok && out.contains("\"partitions\": []"),
        "balanced already: {out}"
    );
    let (ok, out) = cli(&["elect-leaders", "--http", &http1, "--partition", "moving"]);
    assert!(!ok && out.contains("topic:partition"), "{out}");

    assert_eq!(
        c.status(1).expect("status")["partitions"]
            .as_array()
            .map(|a| a
                .iter()
                .map(|p| (p["replicas"].clone(), p["leader"].clone()))
                .collect::<Vec<_>>()),
        before.as_array().map(|a| a
            .iter()
            .map(|p| (p["replicas"].clone(), p["leader"].clone()))
            .collect::<Vec<_>>()),
        "refused operations changed nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_every_node_fails_no_acks_all_delivery_and_leaders_return_to_preferred(
) {
    let (mut c, bootstrap) = three_nodes_with_moving_topic().await;
    // Check for leader imbalance every second instead of Kafka's 300 s default.
    let mut raw = Raw::connect(&c.node(1).addr);
    throttle(&mut raw, "", "leader.imbalance.check.interval.seconds", "1");
    let load = Load::start(&bootstrap, "moving", 30_000);
    for id in [1u64, 2, 3] {
        // SIGTERM: a controlled shutdown moves the node's leaderships away first.
        c.node(id).stop();
        c.node(id).restart();
        c.wait_ready(&[id]);
        // What a rolling restart waits for before the next node: no under-replicated partition.
        wait_status(&c, id, "healthy again", |s| s["healthy"] == true);
    }
    // Automatic preferred-leader rebalancing gave every partition back to its first replica.
    wait_status(&c, 1, "every partition led by its preferred replica", |s| {
        s["partitions"].as_array().into_iter().flatten().all(|p| {
            p["leader"].as_u64().is_some()
                && ids(&p["replicas"]).first() == p["leader"].as_u64().as_ref()
        })
    });
    let acked = load.finish().await;
    assert!(
        acked.failures.is_empty(),
        "failed deliveries: {:?}",
        acked.failures
    );
    assert!(acked.by_partition.values().map(Vec::len).sum::<usize>() > 0);
    check_read_back(&c.bootstrap(), "moving", &acked);
}

/// Runs `spate cluster <args>`; returns whether it exited 0, and its stdout and stderr.
fn cli(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
        .arg("cluster")
        .args(args)
        .output()
        .expect("run spate cluster");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_throttles_never_slow_replicas_in_the_isr() {
    let mut c = ThreeNodes::start(&[]);
    create_replicated(&c.bootstrap(), "steady", 1, "3").await;
    let p = c.wait_partition(1, "steady", 0, "ISR of three", |p| {
        ids(&p["isr"]).len() == 3
    });
    let leader = p["leader"].as_u64().expect("leader");
    // Throttles on both sides, far below what the load needs, for every replica of the
    // topic: as kafka-reassign-partitions --throttle would leave them during a move.
    let mut admin = Raw::connect(&c.node(1).addr);
    for node in ["1", "2", "3"] {
        throttle(
            &mut admin,
            node,
            "follower.replication.throttled.rate",
            "1000",
        );
        throttle(
            &mut admin,
            node,
            "leader.replication.throttled.rate",
            "1000",
        );
    }
    throttle_topic(
        &mut admin,
        "steady",
        "follower.replication.throttled.replicas",
        "*",
    );
    throttle_topic(
        &mut admin,
        "steady",
        "leader.replication.throttled.replicas",
        "*",
    );
    // 100 records of 1 KB with min.insync.replicas=3: at 1000 B/s this would take 100 s per
    // follower, past the 30 s delivery timeout, if in-sync followers were throttled.
    let prod = producer(
        &c.bootstrap(),
        &[
            ("acks", "all"),
            ("linger.ms", "0"),
            ("message.timeout.ms", "30000"),
        ],
    );
    let value = "v".repeat(1000);
    for _ in 0..100 {
        prod.send(
            FutureRecord::<(), _>::to("steady").payload(&value),
            Duration::from_secs(30),
        )
        .await
        .expect("acks=all delivery with every replica in sync");
    }
    let p = c.wait_partition(leader, "steady", 0, "all records committed", |p| {
        p["high_watermark"].as_i64() == Some(100)
    });
    assert_eq!(ids(&p["isr"]).len(), 3, "{p}");
    for id in [1, 2, 3] {
        let (_, text) = http(&c.node(id).http.clone(), "GET", "/metrics", &[], "");
        for name in [
            "spate_cluster_throttled_replication_bytes_total",
            "spate_cluster_leader_throttled_replication_bytes_total",
        ] {
            let value: f64 = text
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().last())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            assert_eq!(
                value, 0.0,
                "node {id} throttled in-sync replication: {name}"
            );
        }
    }
}
