//! A three-node cluster whose nodes each live in their own network namespace, so the links
//! between nodes can be cut for real (not just processes killed) while the test, in the root
//! namespace, still reaches every node. See `netns.rs` for the plumbing; needs root.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::future::join_all;
use kafka_protocol::messages::{ApiKey, ProduceResponse};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use serde_json::Value;

use crate::bad_input::{batch, produce};
use crate::harness::{admin, client_config, consumer, producer, Raw};
use crate::netns::{self, Net, NsProcess};

const KAFKA_PORT: u16 = 9092;
const PEER_PORT: u16 = 9093;
const HTTP_PORT: u16 = 9644;
const TOPIC: &str = "isolated-leader";

/// One spate node running in its namespace; killed when dropped (its log printed if the test
/// panicked).
struct Node {
    id: u8,
    kafka: String,
    http: String,
    process: NsProcess,
    dir: tempfile::TempDir,
}

impl Node {
    fn start(net: &Net, id: u8, nodes: u8) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let peers: Vec<String> = (1..=nodes)
            .map(|m| format!("{m}={}:{PEER_PORT}", net.addr(m)))
            .collect();
        let kafka = format!("{}:{KAFKA_PORT}", net.addr(id));
        let http = format!("{}:{HTTP_PORT}", net.addr(id));
        let mut cmd = net.command(id, Path::new(env!("CARGO_BIN_EXE_spate")));
        cmd.args(["--node-id", &id.to_string()])
            .args(["--cluster-peers", &peers.join(",")])
            .args(["--listen", &kafka, "--advertised-address", &kafka])
            .args(["--http-listen", &http])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--broker-session-timeout-ms", "2000"])
            .args(["--broker-heartbeat-interval-ms", "300"])
            .args(["--replica-lag-time-max-ms", "3000"])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1");
        let process = NsProcess::spawn(cmd, &dir.path().join("spate.log"));
        Self {
            id,
            kafka,
            http,
            process,
            dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("spate.log")).unwrap_or_default()
    }

    fn ready(&self) -> bool {
        netns::node_ready(&self.http)
    }

    /// This node's `/admin/cluster`.
    fn status(&self) -> Result<Value, String> {
        netns::node_status(&self.http, self.id)
    }

    /// This node's view of the test partition in `/admin/cluster`.
    fn partition(&self) -> Result<Value, String> {
        partition_of(&self.status()?).ok_or_else(|| format!("node {}: no {TOPIC}-0 yet", self.id))
    }
}

fn partition_of(status: &Value) -> Option<Value> {
    status["partitions"].as_array().and_then(|ps| {
        ps.iter()
            .find(|p| p["topic"] == TOPIC && p["partition"] == 0)
            .cloned()
    })
}

/// Brokers `/admin/cluster` lists as fenced.
fn fenced(status: &Value) -> Vec<u8> {
    status["nodes"]
        .as_array()
        .map(|ns| {
            ns.iter()
                .filter(|n| n["fenced"] == true)
                .filter_map(|n| field_u8(n, "id"))
                .collect()
        })
        .unwrap_or_default()
}

impl Drop for Node {
    fn drop(&mut self) {
        self.process.kill();
        // SPATE_NETNS_LOGS=1 prints them after a passing run too.
        if std::thread::panicking() || std::env::var("SPATE_NETNS_LOGS").as_deref() == Ok("1") {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let from = lines.len().saturating_sub(150);
            // The test only ever SIGKILLs its nodes: a clean shutdown came from elsewhere.
            let signalled = if log.contains("spate: shutting down") {
                " [NOTE: this node got SIGTERM/SIGINT from outside the test]"
            } else {
                ""
            };
            eprintln!(
                "---- node {} log (last {} of {} lines){signalled} ----\n{}",
                self.id,
                lines.len() - from,
                lines.len(),
                lines[from..].join("\n")
            );
        }
    }
}

/// Waits (at most 60 s) until every node answers /ready.
fn wait_all_ready(nodes: &[Node]) {
    wait_for(
        "every node to be ready",
        Duration::from_secs(60),
        || match nodes.iter().find(|n| !n.ready()) {
            None => Ok(()),
            Some(n) => Err(format!("node {} not ready", n.id)),
        },
    );
}

/// Polls `probe` every 100 ms until it gives a value (see `netns::wait_for`).
fn wait_for<T>(what: &str, within: Duration, probe: impl FnMut() -> Result<T, String>) -> T {
    netns::wait_for(what, within, Duration::from_millis(100), probe)
}

fn field_u8(v: &Value, key: &str) -> Option<u8> {
    v[key].as_u64().and_then(|x| u8::try_from(x).ok())
}

fn isr(v: &Value) -> Vec<u8> {
    v["isr"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64().and_then(|x| u8::try_from(x).ok()))
                .collect()
        })
        .unwrap_or_default()
}

/// Sends `value` to partition 0; the offset it got, or the error.
async fn send(p: &FutureProducer, value: &str) -> Result<i64, String> {
    p.send(
        FutureRecord::to(TOPIC).partition(0).key("k").payload(value),
        Duration::from_secs(5),
    )
    .await
    .map(|d| d.offset)
    .map_err(|(e, _)| e.to_string())
}

/// Fails with the reason, unless SPATE_SKIP_NETNS=1 asks to skip.
fn skip_or_fail(why: &str) {
    if std::env::var("SPATE_SKIP_NETNS").as_deref() == Ok("1") {
        eprintln!("SKIPPED (SPATE_SKIP_NETNS=1): {why}");
        return;
    }
    panic!(
        "{why}\nThis test gives each node its own Linux network namespace and cuts veth links \
         between them, which needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2. Run it \
         as root, or set SPATE_SKIP_NETNS=1 to skip it."
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_stops_acknowledging_acks_all_and_truncates_its_divergent_tail_after_heal(
) {
    if let Some(why) = netns::unavailable() {
        return skip_or_fail(&why);
    }
    let net = match Net::create(3) {
        Ok(net) => net,
        Err(e) => return skip_or_fail(&format!("cannot create network namespaces: {e}")),
    };
    let t0 = Instant::now();
    let phase = |what: &str| eprintln!("[{:6.1}s] {what}", t0.elapsed().as_secs_f64());
    // Declared after `net`, so dropped (killed) before the namespaces go.
    let nodes: Vec<Node> = (1..=3).map(|id| Node::start(&net, id, 3)).collect();
    let node = |id: u8| &nodes[usize::from(id) - 1];
    let bootstrap = |ids: &[u8]| {
        ids.iter()
            .map(|&id| node(id).kafka.clone())
            .collect::<Vec<_>>()
            .join(",")
    };
    let all = bootstrap(&[1, 2, 3]);

    // 1. A healthy cluster, a topic on all three nodes, some acks=all records.
    wait_all_ready(&nodes);
    phase("all three nodes ready");
    let topic = NewTopic::new(TOPIC, 1, TopicReplication::Fixed(3)).set("min.insync.replicas", "2");
    let created = admin(&all)
        .create_topics(&[topic], &AdminOptions::new())
        .await
        .expect("create_topics");
    assert!(created[0].is_ok(), "create topic: {created:?}");
    let (leader, epoch) = wait_for(
        "every node to see the partition led with all three replicas in sync",
        Duration::from_secs(30),
        || {
            let views = nodes
                .iter()
                .map(Node::partition)
                .collect::<Result<Vec<_>, _>>()?;
            let l = field_u8(&views[0], "leader").ok_or("no leader yet")?;
            let e = views[0]["leader_epoch"].as_i64().ok_or("no epoch")?;
            let agreed = views.iter().all(|v| {
                field_u8(v, "leader") == Some(l)
                    && v["leader_epoch"].as_i64() == Some(e)
                    && isr(v).len() == 3
            });
            agreed.then_some((l, e)).ok_or_else(|| format!("{views:?}"))
        },
    );
    // Every acks=all record acknowledged, in acknowledgement order: (value, offset).
    let mut acked_all: Vec<(String, i64)> = Vec::new();
    let healthy = producer(&all, &[("message.timeout.ms", "20000")]);
    for i in 0..5 {
        let v = format!("pre-{i}");
        let offset = send(&healthy, &v)
            .await
            .unwrap_or_else(|e| panic!("acks=all {v} on the healthy cluster: {e}"));
        acked_all.push((v, offset));
    }
    let md = healthy
        .client()
        .fetch_metadata(Some(TOPIC), Duration::from_secs(10))
        .expect("metadata");
    assert_eq!(
        md.topics()[0].partitions()[0].leader(),
        i32::from(leader),
        "metadata and /admin/cluster disagree on the leader"
    );
    drop(healthy);
    let l = node(leader);
    let survivors: Vec<u8> = (1..=3).filter(|&n| n != leader).collect();
    phase(&format!(
        "topic created, 5 acks=all records in; leader {leader} at epoch {epoch}"
    ));

    // Clients that only know L: an idempotent acks=all producer (warmed up while healthy, so
    // it holds a producer id) and a plain acks=1 one.
    let strict = producer(
        &l.kafka,
        &[
            ("message.timeout.ms", "5000"),
            ("request.timeout.ms", "3000"),
        ],
    );
    let warm = send(&strict, "warm-0")
        .await
        .unwrap_or_else(|e| panic!("acks=all to the leader before the cut: {e}"));
    acked_all.push(("warm-0".into(), warm));
    let loose: FutureProducer = client_config(&l.kafka)
        .set("acks", "1")
        .set("enable.idempotence", "false")
        .set("retries", "0")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "5000")
        .create()
        .expect("acks=1 producer");
    loose
        .client()
        .fetch_metadata(Some(TOPIC), Duration::from_secs(10))
        .expect("acks=1 producer metadata");

    // 2. Cut L off from both other nodes; the test still reaches L.
    for &m in &survivors {
        net.cut(leader, m);
    }
    phase(&format!("cut node {leader} off from {survivors:?}"));
    let raw_addr = l.kafka.clone();
    let raw = tokio::task::spawn_blocking(move || {
        let mut raw = Raw::connect(&raw_addr);
        let mut req = produce(TOPIC, batch(-1, 0, 1), -1);
        req.timeout_ms = 3_000;
        let resp: ProduceResponse = raw.call(ApiKey::Produce, 9, &req);
        let p = &resp.responses[0].partition_responses[0];
        (p.error_code, p.base_offset)
    });
    let strict_sends = join_all((0..5).map(|i| {
        let p = &strict;
        async move {
            let v = format!("cut-all-{i}");
            (send(p, &v).await, v)
        }
    }));
    let loose_sends = join_all((0..5).map(|i| {
        let p = &loose;
        async move {
            let v = format!("one-{i}");
            (send(p, &v).await, v)
        }
    }));
    let (strict_results, loose_results) = tokio::join!(strict_sends, loose_sends);
    let (raw_code, raw_offset) = raw.await.expect("raw produce task");
    // The isolated leader acknowledges no acks=all record: the raw request, which only it
    // can answer, is refused. Once its session lease runs out it steps down and answers
    // NOT_LEADER_OR_FOLLOWER, so the idempotent producer (which reaches every node) may
    // move to the new leader: what it had acknowledged there must be in the final log at
    // its offset like any acks=all record.
    for (r, v) in &strict_results {
        if let Ok(offset) = r {
            acked_all.push((v.clone(), *offset));
        }
    }
    assert_ne!(
        raw_code, 0,
        "the isolated leader acknowledged a raw acks=all Produce (offset {raw_offset})"
    );
    let divergent_acks_1: Vec<(String, i64)> = loose_results
        .iter()
        .filter_map(|(r, v)| r.as_ref().ok().map(|&o| (v.clone(), o)))
        .collect();
    phase(&format!(
        "isolated leader: acks=all refused ({:?}; raw Produce error {raw_code}); acks=1 acked {divergent_acks_1:?}",
        strict_results.iter().map(|(r, _)| r.as_ref().err()).collect::<Vec<_>>()
    ));
    // Nothing may retry these onto the new leader after the heal.
    drop(strict);
    drop(loose);

    // 3. The other two elect a new leader and take acks=all records.
    // Survivors the quorum ever fenced while it watched: they kept heartbeating, so none.
    let mut fenced_survivors = std::collections::BTreeSet::new();
    let watcher = node(survivors[0]);
    let (new_leader, new_epoch) = wait_for(
        "the survivors to elect a new leader",
        Duration::from_secs(30),
        || {
            let status = watcher.status()?;
            fenced_survivors.extend(fenced(&status).into_iter().filter(|f| *f != leader));
            let v = partition_of(&status).ok_or("no partition")?;
            match (field_u8(&v, "leader"), v["leader_epoch"].as_i64()) {
                (Some(nl), Some(e)) if nl != leader && e > epoch => Ok((nl, e)),
                _ => Err(format!("{v}")),
            }
        },
    );
    assert!(survivors.contains(&new_leader));
    phase(&format!("new leader {new_leader} at epoch {new_epoch}"));
    let after = producer(&bootstrap(&survivors), &[("message.timeout.ms", "20000")]);
    for i in 0..5 {
        let v = format!("post-{i}");
        let offset = send(&after, &v)
            .await
            .unwrap_or_else(|e| panic!("acks=all {v} through the survivors: {e}"));
        acked_all.push((v, offset));
    }
    drop(after);
    if let Ok(status) = watcher.status() {
        fenced_survivors.extend(fenced(&status).into_iter().filter(|f| *f != leader));
    }
    assert!(
        fenced_survivors.is_empty(),
        "live, connected survivors {fenced_survivors:?} were fenced while node {leader} was cut off"
    );
    assert_eq!(
        new_epoch,
        epoch + 1,
        "one election should move the leadership from the isolated node to a survivor"
    );
    match l.partition() {
        Ok(v) => phase(&format!(
            "5 acks=all records through the survivors; the isolated node's view: {v}"
        )),
        Err(e) => phase(&format!(
            "5 acks=all records through the survivors; the isolated node: {e}"
        )),
    }

    // 4. Heal: L follows the new leader, cuts its divergent tail and rejoins the ISR.
    for &m in &survivors {
        net.heal(leader, m);
    }
    phase("links healed");
    let x = node(new_leader);
    let end = wait_for(
        "the old leader to follow the new one, caught up and back in the ISR",
        Duration::from_secs(45),
        || {
            let xv = x.partition()?;
            let lv = l.partition()?;
            let x_end = xv["log_end_offset"].as_i64().ok_or("no leader log end")?;
            let f = &lv["following"];
            let ok = field_u8(&xv, "leader") == Some(new_leader)
                && isr(&xv).contains(&leader)
                && field_u8(f, "leader") == Some(new_leader)
                && f["truncating"] == false
                && f["log_end_offset"].as_i64() == Some(x_end)
                && lv["leader_epoch"] == xv["leader_epoch"];
            ok.then_some(x_end)
                .ok_or_else(|| format!("leader view {xv}; old leader view {lv}"))
        },
    );
    let log = l.log();
    let truncated: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("truncated divergent tail"))
        .collect();
    assert!(
        !truncated.is_empty(),
        "node {leader} never logged \"truncated divergent tail\""
    );
    phase(&format!(
        "node {leader} follows {new_leader} again, in the ISR, log end {end}; {}",
        truncated.join(" | ")
    ));

    // 5. What the new leader serves: every acks=all record once, in order; nothing of the
    // isolated leader's tail.
    let c = consumer(&all, TOPIC, &[0], 0);
    // The high watermark reaches the log end once the returning follower's next fetch is
    // counted (under load that can lag the status this waited on); it never goes past it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (low, high) = loop {
        let (low, high) = c
            .fetch_watermarks(TOPIC, 0, Duration::from_secs(10))
            .expect("watermarks");
        assert!(high <= end, "high watermark {high} past the log end {end}");
        if high == end || Instant::now() > deadline {
            break (low, high);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!((low, high), (0, end), "watermarks on the new leader");
    let mut log_records: Vec<(i64, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while log_records.last().is_none_or(|(o, _)| *o < high - 1) {
        assert!(
            Instant::now() < deadline,
            "consumed only {log_records:?} of {high}"
        );
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.expect("consume");
        let value = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
        log_records.push((m.offset(), value));
    }
    let offsets: Vec<i64> = log_records.iter().map(|(o, _)| *o).collect();
    assert_eq!(
        offsets,
        (0..high).collect::<Vec<_>>(),
        "offsets served by the new leader"
    );
    for (v, offset) in &acked_all {
        let at: Vec<i64> = log_records
            .iter()
            .filter(|(_, value)| value == v)
            .map(|(o, _)| *o)
            .collect();
        assert_eq!(
            at,
            vec![*offset],
            "acks=all record {v} acknowledged at offset {offset}; the log has it at {at:?}: {log_records:?}"
        );
    }
    assert!(
        acked_all.windows(2).all(|w| w[0].1 < w[1].1),
        "acks=all acknowledgements out of order: {acked_all:?}"
    );
    // Records only the isolated leader ever held (it could send them nowhere): all cut.
    let survived: Vec<_> = log_records
        .iter()
        .filter(|(_, v)| {
            v.starts_with("one-")
                || v == "value-0"
                || (v.starts_with("cut-all-") && !acked_all.iter().any(|(a, _)| a == v))
        })
        .collect();
    assert!(
        survived.is_empty(),
        "records written only to the isolated leader survived the heal: {survived:?} (acks=1 acked: {divergent_acks_1:?})"
    );
    assert_eq!(
        log_records.len(),
        acked_all.len(),
        "the log holds exactly the acks=all records: {log_records:?}"
    );
    phase(&format!(
        "done: {} acks=all records once and in order, {} divergent acks=1 records gone",
        acked_all.len(),
        divergent_acks_1.len()
    ));
}

/// The metadata quorum's (leader, term) as node `n` reports it.
fn quorum_of(n: &Node) -> Result<(u64, u64), String> {
    let s = n.status()?;
    let leader = s["quorum"]["leader"].as_u64().ok_or("no quorum leader")?;
    let term = s["quorum"]["term"].as_u64().ok_or("no term")?;
    Ok((leader, term))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_returning_from_isolation_does_not_force_a_metadata_election() {
    if let Some(why) = netns::unavailable() {
        return skip_or_fail(&why);
    }
    let net = match Net::create(3) {
        Ok(net) => net,
        Err(e) => return skip_or_fail(&format!("cannot create network namespaces: {e}")),
    };
    let nodes: Vec<Node> = (1..=3).map(|id| Node::start(&net, id, 3)).collect();
    wait_all_ready(&nodes);
    let (leader, term) = wait_for("a stable quorum", Duration::from_secs(30), || {
        let views = nodes.iter().map(quorum_of).collect::<Result<Vec<_>, _>>()?;
        let first = views[0];
        views
            .iter()
            .all(|v| *v == first)
            .then_some(first)
            .ok_or_else(|| format!("{views:?}"))
    });
    let follower = (1..=3u8)
        .find(|&n| u64::from(n) != leader)
        .expect("a follower");
    let others: Vec<u8> = (1..=3).filter(|&n| n != follower).collect();
    for &m in &others {
        net.cut(follower, m);
    }
    // Several election timeouts (1-2 s each): the follower campaigns alone.
    std::thread::sleep(Duration::from_secs(8));
    for &m in &others {
        net.heal(follower, m);
    }
    // It rejoins under the same leader and term: its lone campaigns must not depose a
    // leader that kept its quorum all along.
    wait_for(
        "the returned follower to follow the same leader",
        Duration::from_secs(30),
        || {
            let v = quorum_of(&nodes[usize::from(follower) - 1])?;
            (v.0 == leader)
                .then_some(())
                .ok_or_else(|| format!("{v:?}"))
        },
    );
    std::thread::sleep(Duration::from_secs(3));
    let views = nodes
        .iter()
        .map(quorum_of)
        .collect::<Result<Vec<_>, _>>()
        .expect("quorum views");
    assert!(
        views.iter().all(|&v| v == (leader, term)),
        "leader {leader} at term {term} before the isolation, after: {views:?}"
    );
}
