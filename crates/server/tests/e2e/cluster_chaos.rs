//! A chaos run against a three-node cluster in network namespaces (issue 8): idempotent
//! acks=all producers and a consumer run for the whole duration while a seeded fault schedule
//! kills (-9), pauses and restarts nodes and cuts and heals links. At the end everything is
//! healed, the cluster must converge, and a checker compares what the clients saw with the
//! final log and the three replicas' files with each other.
//!
//! `#[ignore]`d: run it with `scripts/chaos.sh [SECONDS]` (needs root for the namespaces).
//! Environment: `SPATE_CHAOS_SECONDS` (default 300), `SPATE_CHAOS_SEED` (replays a
//! schedule), `SPATE_CHAOS_KEEP=1` (keep the node directories after a passing run too; a
//! failing run always keeps them), `SPATE_CHAOS_FSYNC` (passed to the nodes as `--fsync`),
//! `SPATE_CHAOS_MESSAGE_TIMEOUT_MS` (the producers' message.timeout.ms, default 25000).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::TopicPartitionList;
use serde_json::Value;
use spate_log::{Flusher, FsyncPolicy, Log, LogConfig};
use spate_protocol::batch::Batches;

use crate::harness::{admin, client_config};
use crate::netns::{self, Net, NsProcess};

const KAFKA_PORT: u16 = 9092;
const PEER_PORT: u16 = 9093;
const HTTP_PORT: u16 = 9644;
const TOPIC: &str = "chaos";
const PARTITIONS: i32 = 3;
const NODES: u8 = 3;
/// Concurrent producers; each sends at most `PRODUCE_RATE_PER_S` records a second.
const PRODUCERS: u32 = 2;
const PRODUCE_RATE_PER_S: u64 = 100;
/// Records a producer may have waiting for an acknowledgement.
const PRODUCER_INFLIGHT_MAX: usize = 1_000;
/// librdkafka gives up on a record after this long (SPATE_CHAOS_MESSAGE_TIMEOUT_MS overrides:
/// a short one makes records fail during faults, exercising the idempotent producer's epoch
/// bumps and retries across failovers).
const MESSAGE_TIMEOUT_MS: u64 = 25_000;

fn message_timeout_ms() -> u64 {
    std::env::var("SPATE_CHAOS_MESSAGE_TIMEOUT_MS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(MESSAGE_TIMEOUT_MS)
}
/// Bounds of the end phase.
const READY_WITHIN: Duration = Duration::from_secs(120);
const CONVERGE_WITHIN: Duration = Duration::from_secs(180);
const READ_WITHIN: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------
// A seeded RNG (splitmix64): the same seed gives the same fault schedule.

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in `lo..=hi` milliseconds.
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }

    /// A node id, 1..=NODES, other than those in `not`.
    fn node(&mut self, not: &[u8]) -> u8 {
        let choices: Vec<u8> = (1..=NODES).filter(|n| !not.contains(n)).collect();
        choices[self.below(choices.len() as u64) as usize]
    }
}

// ---------------------------------------------------------------------------------------
// Nodes that can be killed, paused and restarted on the same data dir and addresses.

struct ChaosNode {
    id: u8,
    kafka: String,
    http: String,
    /// Holds `data/` and `spate.log`.
    dir: PathBuf,
    process: Option<NsProcess>,
    paused: bool,
    starts: u32,
}

impl ChaosNode {
    fn new(net: &Net, id: u8, root: &Path) -> Self {
        let dir = root.join(format!("node{id}"));
        std::fs::create_dir_all(&dir).expect("node dir");
        Self {
            id,
            kafka: format!("{}:{KAFKA_PORT}", net.addr(id)),
            http: format!("{}:{HTTP_PORT}", net.addr(id)),
            dir,
            process: None,
            paused: false,
            starts: 0,
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("spate.log")
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Appends a marker line to the node's log, so restarts and faults show up in it.
    fn mark(&self, what: &str) {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
        {
            let _ = writeln!(f, "==== chaos: {what} ====");
        }
    }

    fn start(&mut self, net: &Net) {
        assert!(self.process.is_none(), "node {} already runs", self.id);
        let peers: Vec<String> = (1..=NODES)
            .map(|m| format!("{m}={}:{PEER_PORT}", net.addr(m)))
            .collect();
        let mut cmd = net.command(self.id, Path::new(env!("CARGO_BIN_EXE_spate")));
        cmd.args(["--node-id", &self.id.to_string()])
            .args(["--cluster-peers", &peers.join(",")])
            .args(["--listen", &self.kafka, "--advertised-address", &self.kafka])
            .args(["--http-listen", &self.http])
            .arg("--data-dir")
            .arg(self.data_dir())
            .args(["--broker-session-timeout-ms", "2000"])
            .args(["--broker-heartbeat-interval-ms", "300"])
            .args(["--replica-lag-time-max-ms", "3000"])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1");
        if let Ok(fsync) = std::env::var("SPATE_CHAOS_FSYNC") {
            cmd.args(["--fsync", &fsync]);
        }
        self.starts += 1;
        self.mark(&format!("start #{}", self.starts));
        self.process = Some(NsProcess::spawn(cmd, &self.log_path()));
        self.paused = false;
    }

    fn kill9(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
        self.paused = false;
    }

    fn pause(&mut self) {
        if let Some(p) = &self.process {
            p.signal("STOP");
            self.paused = true;
        }
    }

    fn resume(&mut self) {
        if let Some(p) = &self.process {
            p.signal("CONT");
        }
        self.paused = false;
    }

    /// True when the process exists (it may have died on its own: see `running`).
    fn is_up(&self) -> bool {
        self.process.is_some()
    }

    fn running(&mut self) -> bool {
        self.process.as_mut().is_some_and(NsProcess::running)
    }

    fn ready(&self) -> bool {
        netns::node_ready(&self.http)
    }

    /// This node's `/admin/cluster`.
    fn status(&self) -> Result<Value, String> {
        netns::node_status(&self.http, self.id)
    }

    fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for ChaosNode {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "---- node {} log (last 80 lines; all of it in {}) ----\n{}",
                self.id,
                self.log_path().display(),
                self.log_tail(80)
            );
        }
    }
}

/// The run's directory: removed on drop after a passing run, kept after a failure (or with
/// SPATE_CHAOS_KEEP=1) so the node logs and data can be examined.
struct RunDir {
    path: PathBuf,
    keep: bool,
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if self.keep
            || std::thread::panicking()
            || std::env::var("SPATE_CHAOS_KEEP").as_deref() == Ok("1")
        {
            eprintln!("chaos: node logs and data kept in {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Sets the flag when dropped, so background loops end also when the test panics.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------------------
// Faults.

#[derive(Debug, Clone, Copy)]
enum Fault {
    Kill(u8),
    Pause(u8),
    Cut(u8, u8),
    Isolate(u8),
    KillTwo(u8, u8),
    KillAndIsolate(u8, u8),
    IsolateTwo(u8, u8),
}

impl Fault {
    fn kind(&self) -> &'static str {
        match self {
            Fault::Kill(_) => "kill -9 one node",
            Fault::Pause(_) => "pause (SIGSTOP) one node",
            Fault::Cut(..) => "cut one link",
            Fault::Isolate(_) => "isolate one node",
            Fault::KillTwo(..) => "kill -9 two nodes",
            Fault::KillAndIsolate(..) => "kill -9 one node, isolate another",
            Fault::IsolateTwo(..) => "isolate two nodes",
        }
    }

    /// Draws the next fault: mostly one node affected; two nodes with `two_pct` percent.
    fn draw(rng: &mut Rng, two_pct: u64) -> Self {
        if rng.below(100) < two_pct {
            let a = rng.node(&[]);
            let b = rng.node(&[a]);
            return match rng.below(3) {
                0 => Fault::KillTwo(a, b),
                1 => Fault::KillAndIsolate(a, b),
                _ => Fault::IsolateTwo(a, b),
            };
        }
        let roll = rng.below(100);
        let a = rng.node(&[]);
        if roll < 35 {
            Fault::Kill(a)
        } else if roll < 50 {
            Fault::Pause(a)
        } else if roll < 75 {
            let b = rng.node(&[a]);
            Fault::Cut(a.min(b), a.max(b))
        } else {
            Fault::Isolate(a)
        }
    }
}

fn others(n: u8) -> Vec<u8> {
    (1..=NODES).filter(|&m| m != n).collect()
}

/// Every fault and repair with its time since the start of the chaos phase.
struct Schedule {
    t0: Instant,
    events: Vec<(f64, String)>,
}

impl Schedule {
    fn note(&mut self, what: String) {
        let t = self.t0.elapsed().as_secs_f64();
        eprintln!("[chaos {t:7.1}s] {what}");
        self.events.push((t, what));
    }
}

struct Cluster<'a> {
    net: &'a Net,
    nodes: Vec<ChaosNode>,
}

impl Cluster<'_> {
    fn node(&mut self, id: u8) -> &mut ChaosNode {
        &mut self.nodes[usize::from(id) - 1]
    }

    fn kill(&mut self, id: u8, s: &mut Schedule) {
        self.node(id).mark("kill -9");
        self.node(id).kill9();
        s.note(format!("kill -9 node {id}"));
    }

    fn restart(&mut self, id: u8, s: &mut Schedule) {
        let net = self.net;
        self.node(id).start(net);
        s.note(format!("restart node {id}"));
    }

    fn cut(&mut self, a: u8, b: u8, s: &mut Schedule) {
        self.net.cut(a, b);
        s.note(format!("cut link {a}-{b}"));
    }

    fn heal(&mut self, a: u8, b: u8, s: &mut Schedule) {
        self.net.heal(a, b);
        s.note(format!("heal link {a}-{b}"));
    }

    fn isolate(&mut self, n: u8, s: &mut Schedule) {
        for m in others(n) {
            self.net.cut(n, m);
        }
        s.note(format!("isolate node {n} (cut {n}-{:?})", others(n)));
    }

    fn unisolate(&mut self, n: u8, s: &mut Schedule) {
        for m in others(n) {
            self.net.heal(n, m);
        }
        s.note(format!("heal node {n}'s links"));
    }

    fn apply(&mut self, f: Fault, s: &mut Schedule) {
        match f {
            Fault::Kill(n) => self.kill(n, s),
            Fault::Pause(n) => {
                self.node(n).pause();
                s.note(format!("pause (SIGSTOP) node {n}"));
            }
            Fault::Cut(a, b) => self.cut(a, b, s),
            Fault::Isolate(n) => self.isolate(n, s),
            Fault::KillTwo(a, b) => {
                self.kill(a, s);
                self.kill(b, s);
            }
            Fault::KillAndIsolate(a, b) => {
                self.kill(a, s);
                self.isolate(b, s);
            }
            Fault::IsolateTwo(a, b) => {
                self.isolate(a, s);
                self.isolate(b, s);
            }
        }
    }

    fn undo(&mut self, f: Fault, s: &mut Schedule) {
        match f {
            Fault::Kill(n) => self.restart(n, s),
            Fault::Pause(n) => {
                self.node(n).resume();
                s.note(format!("resume (SIGCONT) node {n}"));
            }
            Fault::Cut(a, b) => self.heal(a, b, s),
            Fault::Isolate(n) => self.unisolate(n, s),
            Fault::KillTwo(a, b) => {
                self.restart(a, s);
                self.restart(b, s);
            }
            Fault::KillAndIsolate(a, b) => {
                self.unisolate(b, s);
                self.restart(a, s);
            }
            Fault::IsolateTwo(a, b) => {
                self.unisolate(a, s);
                self.unisolate(b, s);
            }
        }
    }

    /// Heals every link, resumes paused nodes and starts the ones that are down (or died).
    fn heal_everything(&mut self, s: &mut Schedule) {
        for a in 1..=NODES {
            for b in a + 1..=NODES {
                self.net.heal(a, b);
            }
        }
        s.note("final: heal every link".into());
        for id in 1..=NODES {
            if self.node(id).paused {
                self.node(id).resume();
                s.note(format!("final: resume node {id}"));
            }
            if self.node(id).is_up() && !self.node(id).running() {
                s.note(format!(
                    "final: node {id} had exited on its own (see its log); starting it"
                ));
                self.node(id).kill9();
            }
            if !self.node(id).is_up() {
                self.restart(id, s);
            }
        }
    }

    fn any_status(&self) -> Option<Value> {
        self.nodes.iter().find_map(|n| n.status().ok())
    }
}

// ---------------------------------------------------------------------------------------
// Clients.

/// What happened to one record a producer sent.
#[derive(Debug, Clone)]
struct Sent {
    payload: String,
    partition: i32,
    /// The offset it was acknowledged at, or why it was not.
    outcome: Result<i64, String>,
}

#[derive(Default)]
struct ProducerReport {
    sent: Vec<Sent>,
    /// Producers replaced after a fatal error (the reason).
    replaced: Vec<String>,
    /// send_result refusals (queue full and the like), retried on the next tick.
    enqueue_refusals: u64,
}

/// A payload: logical producer, incarnation (a new librdkafka producer after a fatal error)
/// and a sequence number per logical producer.
fn payload(producer: u32, incarnation: u32, seq: u64) -> String {
    format!("p{producer}.{incarnation}-{seq:09}")
}

/// (producer, incarnation, seq) of a payload this test wrote.
fn parse_payload(p: &str) -> Option<(u32, u32, u64)> {
    let (who, seq) = p.strip_prefix('p')?.split_once('-')?;
    let (producer, incarnation) = who.split_once('.')?;
    Some((
        producer.parse().ok()?,
        incarnation.parse().ok()?,
        seq.parse().ok()?,
    ))
}

fn chaos_producer(bootstrap: &str) -> FutureProducer {
    client_config(bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", message_timeout_ms().to_string())
        .set("request.timeout.ms", "5000")
        .set("retry.backoff.ms", "100")
        .set("topic.metadata.refresh.interval.ms", "5000")
        .create()
        .expect("chaos producer")
}

type Pending = futures::future::BoxFuture<'static, Sent>;

/// Sends sequenced records round-robin to every partition at a bounded rate until `stop`,
/// then waits for every outstanding acknowledgement (librdkafka times them out).
async fn produce_loop(
    id: u32,
    bootstrap: String,
    stop: Arc<AtomicBool>,
    max_records: u64,
) -> ProducerReport {
    let mut report = ProducerReport::default();
    let mut incarnation = 0u32;
    let mut producer = chaos_producer(&bootstrap);
    let mut pending: FuturesUnordered<Pending> = FuturesUnordered::new();
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / PRODUCE_RATE_PER_S));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0u64;
    loop {
        let sending = !stop.load(Ordering::SeqCst) && seq < max_records;
        tokio::select! {
            Some(sent) = pending.next(), if !pending.is_empty() => {
                report.sent.push(sent);
            }
            _ = tick.tick(), if sending && pending.len() < PRODUCER_INFLIGHT_MAX => {
                if let Some((code, why)) = producer.client().fatal_error() {
                    report.replaced.push(format!("producer {id}.{incarnation}: {code:?} {why}"));
                    incarnation += 1;
                    // The old one's outstanding records resolve (purged) through `pending`.
                    producer = chaos_producer(&bootstrap);
                }
                let partition = (seq % PARTITIONS as u64) as i32;
                let value = payload(id, incarnation, seq);
                let record = FutureRecord::<(), _>::to(TOPIC).partition(partition).payload(&value);
                match producer.send_result(record) {
                    Ok(delivery) => {
                        seq += 1;
                        pending.push(
                            delivery
                                .map(move |r| {
                                    let outcome = match r {
                                        Ok(Ok(d)) => Ok(d.offset),
                                        Ok(Err((e, _))) => Err(e.to_string()),
                                        Err(_) => Err("delivery canceled".to_string()),
                                    };
                                    Sent { payload: value, partition, outcome }
                                })
                                .boxed(),
                        );
                    }
                    Err(_) => report.enqueue_refusals += 1,
                }
            }
            else => break,
        }
    }
    report
}

/// Everything a consumer saw: (partition, offset, payload) in the order it saw them.
#[derive(Default)]
struct ConsumerLog {
    seen: Vec<(i32, i64, String)>,
    /// Times the consumer went back to an offset it had passed (an offset reset).
    rewinds: u64,
    errors: BTreeMap<String, u64>,
    /// Next offset per partition.
    next: [i64; PARTITIONS as usize],
}

fn chaos_consumer(bootstrap: &str, group: &str) -> BaseConsumer {
    let c: BaseConsumer = client_config(bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100")
        .set("topic.metadata.refresh.interval.ms", "5000")
        .create()
        .expect("chaos consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(TOPIC, p, rdkafka::Offset::Beginning)
            .expect("assign");
    }
    c.assign(&tpl).expect("assign");
    c
}

/// Polls every partition until `stop` (or `until`, a hard bound), recording what it reads.
fn consume_loop(
    bootstrap: String,
    stop: Arc<AtomicBool>,
    until: Instant,
    log: Arc<Mutex<ConsumerLog>>,
) {
    let c = chaos_consumer(&bootstrap, "chaos-reader");
    while !stop.load(Ordering::SeqCst) && Instant::now() < until {
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let mut guard = log.lock().expect("consumer log");
        let log = &mut *guard;
        match m {
            Ok(m) => {
                let value = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                let (p, o) = (m.partition(), m.offset());
                let next = &mut log.next[p as usize];
                if o < *next {
                    log.rewinds += 1;
                }
                *next = o + 1;
                log.seen.push((p, o, value));
            }
            Err(e) => {
                let key = e.to_string();
                if log.errors.len() < 50 || log.errors.contains_key(&key) {
                    *log.errors.entry(key).or_default() += 1;
                }
            }
        }
    }
}

/// Reads every partition from offset 0 up to `ends[p]` (exclusive): (partition, offset) ->
/// payload, plus offsets that were read twice with different payloads.
fn read_all(bootstrap: &str, ends: &[i64]) -> (BTreeMap<(i32, i64), String>, u64) {
    let c = chaos_consumer(bootstrap, "chaos-final-read");
    let mut log = BTreeMap::new();
    let mut conflicting = 0;
    let mut next = vec![0i64; ends.len()];
    let deadline = Instant::now() + READ_WITHIN;
    while next.iter().zip(ends).any(|(n, e)| n < e) {
        assert!(
            Instant::now() < deadline,
            "final read: not every partition read to its end within {READ_WITHIN:?}: next offsets {next:?}, ends {ends:?}"
        );
        let Some(Ok(m)) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let (p, o) = (m.partition(), m.offset());
        let value = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
        if let Some(old) = log.insert((p, o), value.clone()) {
            if old != value {
                conflicting += 1;
            }
        }
        next[p as usize] = next[p as usize].max(o + 1);
    }
    (log, conflicting)
}

// ---------------------------------------------------------------------------------------
// Convergence.

fn ids(v: &Value) -> Vec<u8> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64().and_then(|x| u8::try_from(x).ok()))
                .collect()
        })
        .unwrap_or_default()
}

fn partition_view(status: &Value, p: i32) -> Option<Value> {
    status["partitions"]
        .as_array()?
        .iter()
        .find(|v| v["topic"] == TOPIC && v["partition"] == p)
        .cloned()
}

/// Per partition (leader, leader epoch, high watermark) once every node agrees on leader and
/// epoch, the ISR is all three, and on the leader the high watermark, its log end and every
/// follower's log end are equal.
fn converged(c: &Cluster<'_>) -> Result<Vec<(u8, i64, i64)>, String> {
    let views: Vec<Value> = c
        .nodes
        .iter()
        .map(ChaosNode::status)
        .collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for p in 0..PARTITIONS {
        let ps: Vec<Value> = views
            .iter()
            .map(|s| partition_view(s, p).ok_or_else(|| format!("no {TOPIC}-{p}")))
            .collect::<Result<_, _>>()?;
        let leader = ps[0]["leader"]
            .as_u64()
            .and_then(|l| u8::try_from(l).ok())
            .ok_or_else(|| format!("{TOPIC}-{p}: no leader"))?;
        let epoch = ps[0]["leader_epoch"].as_i64().unwrap_or(-1);
        if ps
            .iter()
            .any(|v| v["leader"] != ps[0]["leader"] || v["leader_epoch"] != epoch)
        {
            return Err(format!("{TOPIC}-{p}: nodes disagree: {ps:?}"));
        }
        let lv = &ps[usize::from(leader) - 1];
        if ids(&lv["isr"]).len() != usize::from(NODES) {
            return Err(format!("{TOPIC}-{p}: ISR not whole: {lv}"));
        }
        let hw = lv["high_watermark"].as_i64().ok_or("no high watermark")?;
        let end = lv["log_end_offset"].as_i64().ok_or("no log end")?;
        let followers_at_end = lv["follower_lag"].as_object().is_some_and(|f| {
            f.len() == usize::from(NODES) - 1
                && f.values()
                    .all(|x| x["log_end_offset"].as_i64() == Some(end))
        });
        if hw != end || !followers_at_end {
            return Err(format!("{TOPIC}-{p}: not caught up: {lv}"));
        }
        for (i, v) in ps.iter().enumerate() {
            let id = i as u8 + 1;
            if id != leader && v["following"]["log_end_offset"].as_i64() != Some(end) {
                return Err(format!("{TOPIC}-{p}: node {id} not at {end}: {v}"));
            }
        }
        out.push((leader, epoch, hw));
    }
    Ok(out)
}

/// Polls `probe` every 250 ms until it gives a value (see `netns::wait_for`).
fn wait_for<T>(what: &str, within: Duration, probe: impl FnMut() -> Result<T, String>) -> T {
    netns::wait_for(what, within, Duration::from_millis(250), probe)
}

/// What the checker found; every list must be empty.
#[derive(Debug, Default)]
struct Findings {
    /// Acknowledged records missing from the final log.
    lost: Vec<String>,
    /// Acknowledged records the final log holds at another offset than acknowledged.
    wrong_offset: Vec<String>,
    /// Payloads the final log holds more than once.
    duplicated: Vec<String>,
    /// Records of one producer in one partition whose sequence goes backwards in the log.
    reordered: Vec<String>,
    /// Records a consumer read at an offset that now holds something else or nothing.
    read_then_lost: Vec<String>,
    /// Partitions whose final log does not hold every offset below its end.
    gaps: Vec<String>,
    /// Records in the log this test did not write (counted, not a failure).
    foreign: usize,
    /// Records whose delivery failed but which are in the log anyway (allowed).
    failed_in_log: usize,
}

/// Compares what the producers were told and what the consumer read with the final log
/// ((partition, offset) -> payload, read from the leaders up to `ends`).
fn check(
    produced: &[Sent],
    consumed: &[(i32, i64, String)],
    final_log: &BTreeMap<(i32, i64), String>,
    ends: &[i64],
) -> Findings {
    let mut f = Findings::default();
    let mut where_in_log: HashMap<&str, Vec<(i32, i64)>> = HashMap::new();
    for ((p, o), v) in final_log {
        where_in_log.entry(v.as_str()).or_default().push((*p, *o));
    }
    for s in produced {
        let Ok(&offset) = s.outcome.as_ref() else {
            f.failed_in_log += usize::from(where_in_log.contains_key(s.payload.as_str()));
            continue;
        };
        match where_in_log.get(s.payload.as_str()) {
            None => f
                .lost
                .push(format!("{} (acked at {}-{offset})", s.payload, s.partition)),
            Some(at) if offset >= 0 && !at.contains(&(s.partition, offset)) => {
                f.wrong_offset.push(format!(
                    "{} acked at {}-{offset}, in the log at {at:?}",
                    s.payload, s.partition
                ))
            }
            Some(_) => {}
        }
    }
    f.duplicated = where_in_log
        .iter()
        .filter(|(_, at)| at.len() > 1)
        .map(|(v, at)| format!("{v} at {at:?}"))
        .collect();
    f.duplicated.sort();
    let mut last_seq: HashMap<(i32, u32, u32), (u64, i64)> = HashMap::new();
    for ((p, o), v) in final_log {
        let Some((producer, incarnation, seq)) = parse_payload(v) else {
            f.foreign += 1;
            continue;
        };
        let key = (*p, producer, incarnation);
        if let Some(&(prev, prev_offset)) = last_seq.get(&key) {
            if seq < prev {
                f.reordered.push(format!(
                    "{v} at {p}-{o} after seq {prev} at {p}-{prev_offset}"
                ));
            }
        }
        last_seq.insert(key, (seq, *o));
    }
    for (p, &end) in ends.iter().enumerate() {
        let have = final_log.range((p as i32, 0)..(p as i32, end)).count() as i64;
        if have != end {
            f.gaps
                .push(format!("{TOPIC}-{p}: {have} records at offsets 0..{end}"));
        }
    }
    for (p, o, v) in consumed {
        match final_log.get(&(*p, *o)) {
            Some(now) if now == v => {}
            now => f
                .read_then_lost
                .push(format!("{p}-{o}: read {v}, now {now:?}")),
        }
    }
    f.read_then_lost.sort();
    f.read_then_lost.dedup();
    f
}

// ---------------------------------------------------------------------------------------
// Replica files.

/// One batch of a replica's log: its header fields and bytes.
#[derive(PartialEq, Eq)]
struct StoredBatch {
    base_offset: i64,
    last_offset: i64,
    leader_epoch: i32,
    bytes: Bytes,
}

impl std::fmt::Debug for StoredBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "batch {}..={} epoch {} ({} bytes, crc32c {:08x})",
            self.base_offset,
            self.last_offset,
            self.leader_epoch,
            self.bytes.len(),
            spate_protocol::batch::crc32c(&self.bytes)
        )
    }
}

/// Opens a stopped node's copy of one partition with the real log code (recovering it as a
/// restart would) and returns its batches below `hw`, its log end and any repairs made.
fn read_replica(dir: &Path, hw: i64) -> Result<(Vec<StoredBatch>, i64, Vec<String>), String> {
    let flusher = Flusher::start(FsyncPolicy::Never).map_err(|e| e.to_string())?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let (mut log, repairs) = Log::open(dir, LogConfig::default(), flusher, now_ms)
        .map_err(|e| format!("open {}: {e}", dir.display()))?;
    let end = log.end_offset();
    let mut batches = Vec::new();
    let mut offset = log.start_offset();
    while offset < hw.min(end) {
        let read = log
            .read(offset, 1 << 20, hw, true)
            .map_err(|e| format!("read {} at {offset}: {e}", dir.display()))?;
        let before = offset;
        for (at, h) in Batches::new(&read.records) {
            if h.base_offset >= hw {
                break;
            }
            if h.last_offset() >= offset {
                batches.push(StoredBatch {
                    base_offset: h.base_offset,
                    last_offset: h.last_offset(),
                    leader_epoch: h.partition_leader_epoch,
                    bytes: read.records.slice(at..at + h.total_len()),
                });
                offset = h.next_offset();
            }
        }
        if offset == before {
            break;
        }
    }
    let _ = log.close();
    Ok((batches, end, repairs))
}

// ---------------------------------------------------------------------------------------
// The run.

fn skip_or_fail(why: &str) {
    if std::env::var("SPATE_SKIP_NETNS").as_deref() == Ok("1") {
        eprintln!("SKIPPED (SPATE_SKIP_NETNS=1): {why}");
        return;
    }
    panic!("{why}\nThe chaos run needs root (network namespaces) and iproute2.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long chaos run: scripts/chaos.sh [SECONDS]"]
async fn cluster_chaos_loses_duplicates_and_reorders_nothing_and_replicas_agree() {
    if let Some(why) = netns::unavailable() {
        return skip_or_fail(&why);
    }
    let duration = Duration::from_secs(
        std::env::var("SPATE_CHAOS_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(300),
    );
    let seed: u64 = std::env::var("SPATE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 % 1_000_000_000)
        });
    eprintln!(
        "chaos: seed {seed} (replay with SPATE_CHAOS_SEED={seed}), duration {}s",
        duration.as_secs()
    );
    let mut rng = Rng(seed);

    let root = std::env::temp_dir().join(format!("spate-chaos-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&root).expect("run dir");
    let mut run_dir = RunDir {
        path: root.clone(),
        keep: false,
    };
    let net = match Net::create(NODES) {
        Ok(net) => net,
        Err(e) => return skip_or_fail(&format!("cannot create network namespaces: {e}")),
    };
    // Declared after `net`: the nodes are killed before the namespaces go.
    let mut cluster = Cluster {
        net: &net,
        nodes: (1..=NODES)
            .map(|id| ChaosNode::new(&net, id, &root))
            .collect(),
    };
    for id in 1..=NODES {
        let net = cluster.net;
        cluster.node(id).start(net);
    }
    let bootstrap = cluster
        .nodes
        .iter()
        .map(|n| n.kafka.clone())
        .collect::<Vec<_>>()
        .join(",");
    wait_for("every node to be ready", READY_WITHIN, || {
        match cluster.nodes.iter().find(|n| !n.ready()) {
            None => Ok(()),
            Some(n) => Err(format!("node {} not ready", n.id)),
        }
    });
    let topic = NewTopic::new(TOPIC, PARTITIONS, TopicReplication::Fixed(3))
        .set("min.insync.replicas", "2");
    let created = admin(&bootstrap)
        .create_topics(&[topic], &AdminOptions::new())
        .await
        .expect("create_topics");
    assert!(created[0].is_ok(), "create topic: {created:?}");
    wait_for(
        "the topic replicated on every node",
        CONVERGE_WITHIN,
        || converged(&cluster),
    );
    eprintln!("chaos: cluster ready, topic {TOPIC} with {PARTITIONS} partitions, RF 3, min ISR 2");

    // Clients.
    let stop_producing = Arc::new(AtomicBool::new(false));
    let _stop_producing_guard = StopOnDrop(stop_producing.clone());
    let max_records = PRODUCE_RATE_PER_S * (duration.as_secs() + 600);
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|id| {
            tokio::spawn(produce_loop(
                id,
                bootstrap.clone(),
                stop_producing.clone(),
                max_records,
            ))
        })
        .collect();
    let stop_consuming = Arc::new(AtomicBool::new(false));
    let _stop_consuming_guard = StopOnDrop(stop_consuming.clone());
    let consumed = Arc::new(Mutex::new(ConsumerLog::default()));
    let consumer = {
        let (b, stop, log) = (bootstrap.clone(), stop_consuming.clone(), consumed.clone());
        let until = Instant::now() + duration + Duration::from_secs(900);
        std::thread::spawn(move || consume_loop(b, stop, until, log))
    };

    // Faults.
    let t0 = Instant::now();
    let mut schedule = Schedule {
        t0,
        events: Vec::new(),
    };
    let mut kinds: BTreeMap<&'static str, u32> = BTreeMap::new();
    // Let the clients warm up on a healthy cluster first.
    std::thread::sleep(Duration::from_secs(5).min(duration));
    while t0.elapsed() + Duration::from_secs(3) < duration {
        // Two-node faults only after the first 15 s, and rarely.
        let two_pct = if t0.elapsed() > Duration::from_secs(15) {
            15
        } else {
            0
        };
        let fault = Fault::draw(&mut rng, two_pct);
        let hold = rng.millis(2_000, 10_000);
        let gap = rng.millis(500, 4_000);
        *kinds.entry(fault.kind()).or_default() += 1;
        cluster.apply(fault, &mut schedule);
        std::thread::sleep(hold);
        cluster.undo(fault, &mut schedule);
        std::thread::sleep(gap);
    }
    let chaos_secs = t0.elapsed().as_secs_f64();

    // Convergence: everything healed and up, the ISR whole again while producers still run;
    // then producing stops and every log end must meet.
    cluster.heal_everything(&mut schedule);
    wait_for(
        "every node ready after the final heal",
        READY_WITHIN,
        || match cluster.nodes.iter().find(|n| !n.ready()) {
            None => Ok(()),
            Some(n) => Err(format!("node {} not ready", n.id)),
        },
    );
    wait_for(
        "every partition's ISR to be whole again",
        CONVERGE_WITHIN,
        || {
            let s = cluster.any_status().ok_or("no node answers")?;
            for p in 0..PARTITIONS {
                let v = partition_view(&s, p).ok_or("no partition")?;
                if ids(&v["isr"]).len() != usize::from(NODES) {
                    return Err(format!("{v}"));
                }
            }
            Ok(())
        },
    );
    schedule.note("final: all nodes ready, every ISR whole; stopping producers".into());
    stop_producing.store(true, Ordering::SeqCst);
    let mut produced = Vec::new();
    let mut replaced = Vec::new();
    let mut enqueue_refusals = 0;
    for p in producers {
        let r = tokio::time::timeout(
            Duration::from_millis(message_timeout_ms()) + Duration::from_secs(30),
            p,
        )
        .await
        .expect("producers did not finish within the message timeout")
        .expect("producer task");
        produced.extend(r.sent);
        replaced.extend(r.replaced);
        enqueue_refusals += r.enqueue_refusals;
    }
    let heads = wait_for("every log end to meet", CONVERGE_WITHIN, || {
        converged(&cluster)
    });
    schedule.note(format!(
        "final: converged (leader, epoch, high watermark per partition): {heads:?}"
    ));
    let ends: Vec<i64> = heads.iter().map(|h| h.2).collect();

    // The continuous consumer reads up to the end, then stops.
    let caught_up = {
        let deadline = Instant::now() + READ_WITHIN;
        loop {
            let next = consumed.lock().expect("consumer log").next;
            if next.iter().zip(&ends).all(|(n, e)| n >= e) || Instant::now() > deadline {
                break next.iter().zip(&ends).all(|(n, e)| n >= e);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    stop_consuming.store(true, Ordering::SeqCst);
    consumer.join().expect("consumer thread");
    let consumed = std::mem::take(&mut *consumed.lock().expect("consumer log"));

    // The final log, read from the leaders.
    let (final_log, conflicting_reads) = read_all(&bootstrap, &ends);
    let heads_before_stop = converged(&cluster).expect("still converged before stopping");
    assert_eq!(
        heads_before_stop.iter().map(|h| h.2).collect::<Vec<_>>(),
        ends,
        "high watermarks moved after producing stopped"
    );

    // What each broker answered producers and consumers with, for explaining any anomaly:
    // the error counters of Produce, Fetch and OffsetForLeaderEpoch from /metrics.
    let answered: Vec<String> = cluster
        .nodes
        .iter()
        .flat_map(|n| {
            let text = netns::node_get(&n.http, "/metrics")
                .map(|(_, b)| b)
                .unwrap_or_default();
            text.lines()
                .filter(|l| {
                    l.starts_with("spate_request_errors_total")
                        && ["Produce", "Fetch", "OffsetForLeaderEpoch", "InitProducerId"]
                            .iter()
                            .any(|api| l.contains(&format!("api=\"{api}\"")))
                })
                .map(|l| format!("node {}: {l}", n.id))
                .collect::<Vec<_>>()
        })
        .collect();

    // Stop the nodes and compare their files.
    for n in &cluster.nodes {
        if let Some(p) = &n.process {
            p.signal("TERM");
        }
    }
    let mut clean_stops = Vec::new();
    for n in &mut cluster.nodes {
        let clean = n
            .process
            .as_mut()
            .is_some_and(|p| p.terminate(Duration::from_secs(20)));
        n.process = None;
        clean_stops.push((n.id, clean));
    }
    let mut replica_differences = 0u64;
    let mut replica_notes = Vec::new();
    for (p, &hw) in ends.iter().enumerate() {
        let copies: Vec<(Vec<StoredBatch>, i64, Vec<String>)> = cluster
            .nodes
            .iter()
            .map(|n| {
                read_replica(&n.data_dir().join(format!("topics/{TOPIC}/{p}")), hw)
                    .unwrap_or_else(|e| panic!("node {}: {e}", n.id))
            })
            .collect();
        for (i, (batches, end, repairs)) in copies.iter().enumerate() {
            if !repairs.is_empty() {
                replica_notes.push(format!(
                    "node {} {TOPIC}-{p}: recovery repaired {repairs:?}",
                    i + 1
                ));
            }
            let covered = batches.last().map_or(0, |b| b.last_offset + 1);
            if *end < hw || covered < hw {
                replica_differences += 1;
                replica_notes.push(format!(
                    "node {} {TOPIC}-{p}: log end {end}, batches cover up to {covered}, below the high watermark {hw}",
                    i + 1
                ));
            }
        }
        let longest = copies.iter().map(|c| c.0.len()).max().unwrap_or(0);
        for k in 0..longest {
            let at: Vec<Option<&StoredBatch>> = copies.iter().map(|c| c.0.get(k)).collect();
            if at.iter().any(|b| *b != at[0]) {
                replica_differences += 1;
                if replica_notes.len() < 20 {
                    replica_notes.push(format!("{TOPIC}-{p} batch #{k}: {at:?}"));
                }
            }
        }
    }

    // The checks.
    let acked: Vec<&Sent> = produced.iter().filter(|s| s.outcome.is_ok()).collect();
    let Findings {
        lost,
        wrong_offset,
        duplicated,
        reordered,
        read_then_lost,
        gaps,
        foreign,
        failed_in_log,
    } = check(&produced, &consumed.seen, &final_log, &ends);

    // The report.
    let failed: Vec<&Sent> = produced.iter().filter(|s| s.outcome.is_err()).collect();
    let mut failure_kinds: BTreeMap<&str, u64> = BTreeMap::new();
    for s in &failed {
        if let Err(e) = &s.outcome {
            *failure_kinds.entry(e.as_str()).or_default() += 1;
        }
    }
    let mut r = String::new();
    let mut line = |s: String| {
        r.push_str(&s);
        r.push('\n');
    };
    line("==================== spate chaos report ====================".into());
    line(format!(
        "message.timeout.ms {}; --fsync {}",
        message_timeout_ms(),
        std::env::var("SPATE_CHAOS_FSYNC").unwrap_or_else(|_| "(default)".into())
    ));
    line(format!(
        "seed {seed}; chaos phase {chaos_secs:.0}s (asked {}s); whole run {:.0}s",
        duration.as_secs(),
        t0.elapsed().as_secs_f64()
    ));
    line(format!(
        "faults injected: {} ({})",
        kinds.values().sum::<u32>(),
        kinds
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    line(format!(
        "records produced {} / acknowledged {} / failed {} (of which {failed_in_log} are in the log anyway); enqueue refusals {enqueue_refusals}; producers replaced after fatal errors {}",
        produced.len(),
        acked.len(),
        failed.len(),
        replaced.len()
    ));
    for (e, n) in &failure_kinds {
        line(format!("  delivery failure x{n}: {e}"));
    }
    for why in &replaced {
        line(format!("  replaced: {why}"));
    }
    line(format!(
        "records consumed {} (distinct offsets {}), consumer rewinds {}, caught up to the end: {caught_up}",
        consumed.seen.len(),
        consumed
            .seen
            .iter()
            .map(|(p, o, _)| (*p, *o))
            .collect::<std::collections::HashSet<_>>()
            .len(),
        consumed.rewinds
    ));
    for (e, n) in &consumed.errors {
        line(format!("  consumer error x{n}: {e}"));
    }
    line(format!(
        "final log: {} records, high watermarks {ends:?}, (leader, epoch, hw) {heads:?}; not written by this test {foreign}",
        final_log.len()
    ));
    line(format!(
        "node stops (id, clean after SIGTERM): {clean_stops:?}"
    ));
    line("errors the brokers answered (a restarted node counts from its restart):".into());
    for a in &answered {
        line(format!("  {a}"));
    }
    for n in &replica_notes {
        line(format!("  replicas: {n}"));
    }
    let counts = [
        ("acknowledged-but-lost", lost.len()),
        ("acknowledged-at-another-offset", wrong_offset.len()),
        ("duplicated", duplicated.len()),
        ("reordered", reordered.len()),
        ("read-but-later-lost", read_then_lost.len()),
        (
            "replica-batches-differing-below-hw",
            replica_differences as usize,
        ),
        ("offset-gaps-in-final-log", gaps.len()),
        ("offsets-read-twice-differently", conflicting_reads as usize),
    ];
    line("---- checks (all must be 0) ----".into());
    for (name, n) in counts {
        line(format!("{name:>40}: {n}"));
    }
    for (name, list) in [
        ("lost", &lost),
        ("wrong offset", &wrong_offset),
        ("duplicated", &duplicated),
        ("reordered", &reordered),
        ("read then lost", &read_then_lost),
        ("gaps", &gaps),
    ] {
        for x in list.iter().take(20) {
            line(format!("  {name}: {x}"));
        }
    }
    line("---- fault schedule ----".into());
    for (t, what) in &schedule.events {
        line(format!("[{t:7.1}s] {what}"));
    }
    line("============================================================".into());
    eprintln!("{r}");
    let report_path = root.join("report.txt");
    let _ = std::fs::write(&report_path, &r);

    let bad: Vec<_> = counts.iter().filter(|(_, n)| *n > 0).collect();
    if !bad.is_empty() {
        run_dir.keep = true;
    }
    assert!(
        bad.is_empty(),
        "chaos run with seed {seed} found {bad:?}; report in {}",
        report_path.display()
    );
    assert!(
        !acked.is_empty(),
        "nothing was acknowledged in the whole run: the checks prove nothing"
    );
}

/// The checker itself: each kind of anomaly is counted, a clean history gives nothing.
#[test]
fn the_chaos_checker_counts_every_kind_of_anomaly() {
    let sent = |seq: u64, partition: i32, outcome: Result<i64, String>| Sent {
        payload: payload(0, 0, seq),
        partition,
        outcome,
    };
    let mut log = BTreeMap::new();
    for (o, seq) in [0u64, 1, 2].into_iter().enumerate() {
        log.insert((0, o as i64), payload(0, 0, seq));
    }
    let produced = vec![
        sent(0, 0, Ok(0)),
        sent(1, 0, Ok(1)),
        sent(2, 0, Ok(2)),
        sent(3, 0, Err("timed out".into())),
    ];
    let read = vec![(0, 0, payload(0, 0, 0)), (0, 1, payload(0, 0, 1))];
    let clean = check(&produced, &read, &log, &[3]);
    assert!(
        clean.lost.is_empty()
            && clean.wrong_offset.is_empty()
            && clean.duplicated.is_empty()
            && clean.reordered.is_empty()
            && clean.read_then_lost.is_empty()
            && clean.gaps.is_empty(),
        "{clean:?}"
    );
    assert_eq!((clean.foreign, clean.failed_in_log), (0, 0));

    // Offset 1 overwritten by seq 0 (a duplicate; the read of offset 1 is now lost), seq 1
    // moved to offset 4 (acknowledged elsewhere, and behind seq 2), a hole at offset 3, seq 4
    // acknowledged but nowhere, and the failed seq 3 in partition 1 (allowed).
    let mut bad = log.clone();
    bad.insert((0, 1), payload(0, 0, 0));
    bad.insert((0, 4), payload(0, 0, 1));
    bad.insert((1, 0), payload(0, 0, 3));
    let produced = vec![
        sent(0, 0, Ok(0)),
        sent(1, 0, Ok(1)),
        sent(2, 0, Ok(2)),
        sent(3, 1, Err("timed out".into())),
        sent(4, 0, Ok(5)),
    ];
    let f = check(&produced, &read, &bad, &[5, 1]);
    assert_eq!(f.lost.len(), 1, "{f:?}");
    assert_eq!(f.wrong_offset.len(), 1, "{f:?}");
    assert_eq!(f.duplicated.len(), 1, "{f:?}");
    assert_eq!(f.reordered.len(), 1, "{f:?}");
    assert_eq!(f.read_then_lost.len(), 1, "{f:?}");
    assert_eq!(f.gaps.len(), 1, "{f:?}");
    assert_eq!(f.failed_in_log, 1, "{f:?}");
}
