//! A chaos run against a three-node cluster in network namespaces (issue 8): idempotent
//! acks=all producers and a consumer run for the whole duration while a seeded fault schedule
//! kills (-9), pauses and restarts nodes and cuts and heals links. At the end everything is
//! healed, the cluster must converge, and a checker compares what the clients saw with the
//! final log and the three replicas with each other.
//!
//! The same harness runs against Apache Kafka (issue 22): with `SPATE_CHAOS_TARGET=kafka`
//! each node is a Kafka 4.x KRaft process (broker and controller in one JVM, static quorum of
//! the three namespace addresses) started with `java` from the jars `scripts/kafka/fetch.sh`
//! pins, and killed, paused and restarted exactly like a spate node. Only the replica
//! comparison differs: spate's replicas are read from their segment files after the nodes
//! stop, Kafka's through the protocol while they still run (a Fetch v12 to each replica,
//! followers included, which Kafka serves up to its high watermark since KIP-392).
//!
//! The consumer records its own view of every fetch in the run directory (issue 22, item 12):
//! librdkafka's `fetch`/`msg`/`topic`/`metadata` debug lines (`consumer-debug.log`), one parsed line per
//! fetch reply and partition with the broker, the leader epoch it fetched with, the error and
//! the high watermark (`consumer-fetches.tsv`), and once a second the client's statistics per
//! partition: leader, leader epoch, fetch state, high watermark, positions
//! (`consumer-stats.tsv`). The report sums them up per partition: the lowest and highest high
//! watermark seen, the replies (and episodes) whose high watermark was below one seen before,
//! the longest stretch without progress while the consumer was behind the high watermark and
//! the longest gap between records (up to the end), plus how long the client knew no broker
//! by id (librdkafka 2.10+ forgets every broker a Metadata answer leaves out, bootstrap
//! addresses included) and the producers' acknowledged/failed deliveries per minute.
//!
//! `#[ignore]`d: run it with `scripts/chaos.sh [SECONDS]` or `scripts/chaos.sh --kafka
//! [SECONDS]` (needs root for the namespaces). Environment: `SPATE_CHAOS_SECONDS` (default
//! 300), `SPATE_CHAOS_SEED` (replays a schedule; the same seed gives spate and Kafka the same
//! schedule), `SPATE_CHAOS_KEEP=1` (keep the node directories after a passing run too; a
//! failing run always keeps them), `SPATE_CHAOS_FSYNC` (passed to spate nodes as `--fsync`),
//! `SPATE_CHAOS_MESSAGE_TIMEOUT_MS` (the producers' message.timeout.ms, default 25000),
//! `SPATE_CHAOS_TARGET` (`spate`, the default, or `kafka`), and for Kafka
//! `SPATE_CHAOS_KAFKA_LIB` (the directory of the jars; chaos.sh sets it), `JAVA` (default
//! `java`), `SPATE_CHAOS_KAFKA_HEAP` (default `-Xms512m -Xmx1g`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufWriter, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse,
    MetadataRequest, MetadataResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
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
// What the nodes run: spate, or Apache Kafka from the kit's jars.

/// Kafka's controller listener (its broker listener is `KAFKA_PORT`).
const KAFKA_CONTROLLER_PORT: u16 = 9093;
/// bin/kafka-run-class.sh's JVM flags for servers.
const KAFKA_JVM_OPTS: &[&str] = &[
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
];

/// How to run Kafka: the JVM, the jars and the cluster's id.
struct KafkaKit {
    java: String,
    /// `<lib>/*`.
    classpath: String,
    log4j: PathBuf,
    heap: String,
    cluster_id: String,
    version: String,
}

impl KafkaKit {
    /// From the environment chaos.sh sets (`SPATE_CHAOS_KAFKA_LIB`, `JAVA`).
    fn from_env() -> Self {
        let lib = std::env::var("SPATE_CHAOS_KAFKA_LIB").unwrap_or_else(|_| {
            panic!(
                "SPATE_CHAOS_TARGET=kafka needs SPATE_CHAOS_KAFKA_LIB, the directory of Kafka's \
                 jars: run it through `scripts/chaos.sh --kafka`, which fetches them"
            )
        });
        let version = std::fs::read_dir(&lib)
            .ok()
            .and_then(|d| {
                d.filter_map(Result::ok).find_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.strip_prefix("kafka-clients-")
                        .and_then(|v| v.strip_suffix(".jar"))
                        .map(str::to_owned)
                })
            })
            .unwrap_or_else(|| panic!("no kafka-clients jar in {lib}"));
        // A cluster id is 16 bytes in URL-safe base64; not drawn from the seeded RNG, so
        // the fault schedule of a seed stays the one spate gets.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(7, |d| d.as_nanos());
        let mut id = Rng(nanos as u64 ^ u64::from(std::process::id()));
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&id.next().to_be_bytes());
        raw[8..].copy_from_slice(&id.next().to_be_bytes());
        // Not starting with '-' (as Kafka's own random ids): the tools would take it for a flag.
        raw[0] &= 0x7f;
        use base64::Engine as _;
        Self {
            java: std::env::var("JAVA").unwrap_or_else(|_| "java".into()),
            classpath: format!("{lib}/*"),
            log4j: Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../scripts/kafka/log4j2.properties"),
            heap: std::env::var("SPATE_CHAOS_KAFKA_HEAP")
                .unwrap_or_else(|_| "-Xms512m -Xmx1g".into()),
            cluster_id: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw),
            version,
        }
    }
}

#[derive(Clone)]
enum Target {
    Spate,
    Kafka(Arc<KafkaKit>),
}

impl Target {
    fn from_env() -> Self {
        match std::env::var("SPATE_CHAOS_TARGET").as_deref() {
            Err(_) | Ok("") | Ok("spate") => Target::Spate,
            Ok("kafka") => Target::Kafka(Arc::new(KafkaKit::from_env())),
            Ok(other) => panic!("SPATE_CHAOS_TARGET={other}: expected spate or kafka"),
        }
    }

    fn name(&self) -> String {
        match self {
            Target::Spate => "spate".into(),
            Target::Kafka(kit) => format!("Apache Kafka {} (KRaft)", kit.version),
        }
    }
}

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
    target: Target,
    kafka: String,
    http: String,
    /// Holds `data/` and the node's log (`spate.log`; Kafka: `logs/server.log`).
    dir: PathBuf,
    process: Option<NsProcess>,
    paused: bool,
    starts: u32,
}

impl ChaosNode {
    fn new(net: &Net, target: &Target, id: u8, root: &Path) -> Self {
        let dir = root.join(format!("node{id}"));
        std::fs::create_dir_all(dir.join("logs")).expect("node dir");
        let node = Self {
            id,
            target: target.clone(),
            kafka: format!("{}:{KAFKA_PORT}", net.addr(id)),
            http: format!("{}:{HTTP_PORT}", net.addr(id)),
            dir,
            process: None,
            paused: false,
            starts: 0,
        };
        if let Target::Kafka(_) = target {
            node.write_kafka_properties(net);
        }
        node
    }

    fn log_path(&self) -> PathBuf {
        match self.target {
            Target::Spate => self.dir.join("spate.log"),
            Target::Kafka(_) => self.dir.join("logs/server.log"),
        }
    }

    /// Where the process's stdout and stderr go (for Kafka, log4j writes `log_path`).
    fn stdout_path(&self) -> PathBuf {
        match self.target {
            Target::Spate => self.log_path(),
            Target::Kafka(_) => self.dir.join("logs/stdout.log"),
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Kafka's server.properties: broker and controller in one process, a static quorum of
    /// the three nodes' namespace addresses, and the failure detection spate's nodes get
    /// (session 2 s, heartbeats every 300 ms, a follower out of the ISR after 3 s).
    fn write_kafka_properties(&self, net: &Net) {
        let voters: Vec<String> = (1..=NODES)
            .map(|m| format!("{m}@{}:{KAFKA_CONTROLLER_PORT}", net.addr(m)))
            .collect();
        let addr = net.addr(self.id);
        let props = [
            "process.roles=broker,controller".to_string(),
            format!("node.id={}", self.id),
            format!("controller.quorum.voters={}", voters.join(",")),
            format!("listeners=PLAINTEXT://{addr}:{KAFKA_PORT},CONTROLLER://{addr}:{KAFKA_CONTROLLER_PORT}"),
            format!("advertised.listeners=PLAINTEXT://{addr}:{KAFKA_PORT}"),
            "inter.broker.listener.name=PLAINTEXT".into(),
            "controller.listener.names=CONTROLLER".into(),
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT".into(),
            format!("log.dirs={}", self.data_dir().display()),
            "num.partitions=1".into(),
            format!("default.replication.factor={NODES}"),
            "min.insync.replicas=2".into(),
            format!("offsets.topic.replication.factor={NODES}"),
            format!("transaction.state.log.replication.factor={NODES}"),
            "transaction.state.log.min.isr=2".into(),
            format!("share.coordinator.state.topic.replication.factor={NODES}"),
            "share.coordinator.state.topic.min.isr=2".into(),
            "group.initial.rebalance.delay.ms=0".into(),
            "broker.session.timeout.ms=2000".into(),
            "broker.heartbeat.interval.ms=300".into(),
            "replica.lag.time.max.ms=3000".into(),
            "unclean.leader.election.enable=false".into(),
        ];
        std::fs::write(self.dir.join("server.properties"), props.join("\n") + "\n")
            .expect("server.properties");
    }

    /// `kafka-storage format` for this node (before its first start).
    fn kafka_format(&self, kit: &KafkaKit) -> std::process::Child {
        let out = std::fs::File::create(self.dir.join("logs/format.log")).expect("format log");
        let err = out.try_clone().expect("format log");
        std::process::Command::new(&kit.java)
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                kit.log4j.display()
            ))
            .args(["-Dspate.kafka.appender=STDERR", "-Dspate.kafka.level=WARN"])
            .arg("-cp")
            .arg(&kit.classpath)
            .args([
                "kafka.tools.StorageTool",
                "format",
                "-t",
                &kit.cluster_id,
                "-c",
            ])
            .arg(self.dir.join("server.properties"))
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("run kafka.tools.StorageTool (is java on PATH?)")
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
        let cmd = match &self.target {
            Target::Spate => {
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
                cmd
            }
            Target::Kafka(kit) => {
                let mut cmd = net.command(self.id, Path::new(&kit.java));
                cmd.args(kit.heap.split_whitespace())
                    .args(KAFKA_JVM_OPTS)
                    .arg(format!(
                        "-Dlog4j2.configurationFile={}",
                        kit.log4j.display()
                    ))
                    .arg(format!(
                        "-Dkafka.logs.dir={}",
                        self.dir.join("logs").display()
                    ))
                    .arg("-cp")
                    .arg(&kit.classpath)
                    .arg("kafka.Kafka")
                    .arg(self.dir.join("server.properties"));
                cmd
            }
        };
        self.starts += 1;
        self.mark(&format!("start #{}", self.starts));
        self.process = Some(NsProcess::spawn(cmd, &self.stdout_path()));
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

    /// spate: `/ready` answers 200. Kafka: it answers a Metadata request naming itself
    /// among the brokers (a KRaft broker serves requests only once it has started).
    fn ready(&self) -> bool {
        match self.target {
            Target::Spate => netns::node_ready(&self.http),
            Target::Kafka(_) => kafka_metadata(&self.kafka)
                .is_ok_and(|m| m.brokers.iter().any(|b| b.node_id.0 == i32::from(self.id))),
        }
    }

    /// This node's `/admin/cluster` (spate only).
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
    target: Target,
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

    /// Whether every partition's ISR holds every node (as any node that answers sees it).
    fn isr_whole(&self) -> Result<(), String> {
        match self.target {
            Target::Spate => {
                let s = self.any_status().ok_or("no node answers")?;
                for p in 0..PARTITIONS {
                    let v = partition_view(&s, p).ok_or("no partition")?;
                    if ids(&v["isr"]).len() != usize::from(NODES) {
                        return Err(format!("{v}"));
                    }
                }
                Ok(())
            }
            Target::Kafka(_) => {
                let views = self
                    .nodes
                    .iter()
                    .find_map(|n| kafka_partitions(&n.kafka).ok())
                    .ok_or("no node answers")?;
                match views.iter().find(|v| v.isr.len() != usize::from(NODES)) {
                    None => Ok(()),
                    Some(v) => Err(format!("{v:?}")),
                }
            }
        }
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
    /// Per minute since the chaos phase began: (acknowledged, failed) deliveries resolved in
    /// it, to see when producing stalled.
    per_minute: BTreeMap<u64, (u64, u64)>,
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
    t0: Instant,
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
                let minute = t0.elapsed().as_secs() / 60;
                let counts = report.per_minute.entry(minute).or_default();
                if sent.outcome.is_ok() {
                    counts.0 += 1;
                } else {
                    counts.1 += 1;
                }
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

// ---------------------------------------------------------------------------------------
// The consumer's own record of its fetches (issue 22, item 12). librdkafka gives no hook per
// fetch, but with `debug=fetch,msg` it logs every Fetch request per partition ("Fetch topic
// T [P] at offset O (leader epoch E, current leader epoch C, vN)", on the broker's thread)
// and every reply per partition ("Topic T [P] MessageSet size S, error "E", MaxOffset HW,
// LSO L, ..."): the log callback writes every line to consumer-debug.log and parses these
// two into consumer-fetches.tsv, one line per reply and partition. The statistics callback
// (once a second) adds what the client believes: leader, leader epoch, fetch state, high
// watermark and positions per partition (consumer-stats.tsv).

/// What the consumer's fetches showed for one partition.
#[derive(Default)]
struct PartitionWatch {
    replies: u64,
    /// Replies per answering broker (librdkafka's name, `host:port/id`).
    brokers: BTreeMap<String, u64>,
    /// Leader epochs the consumer fetched with (its current leader epoch).
    epochs: BTreeSet<i32>,
    /// Replies per error (librdkafka's text; "Success" is none).
    errors: BTreeMap<String, u64>,
    hw_min: Option<i64>,
    /// The highest high watermark an error-free reply carried: (hw, t, broker, epoch).
    hw_max: Option<(i64, f64, String, i32)>,
    /// Error-free replies whose high watermark was below the highest seen before.
    hw_decreases: u64,
    /// Distinct episodes of those: (broker, leader epoch, the highest seen before).
    hw_decrease_episodes: BTreeSet<(String, i32, i64)>,
    /// The largest such drop: (records, description).
    hw_largest_drop: (i64, String),
    hw_decrease_examples: Vec<String>,
    /// The next offset the application gets.
    position: i64,
    last_delivery: Option<f64>,
    /// Since when the consumer has been behind the highest high watermark seen without
    /// receiving a record.
    behind_since: Option<f64>,
    /// Longest stretch behind the high watermark without a record: (seconds, from t, at
    /// offset).
    longest_stall: (f64, f64, i64),
    /// Longest time between two records, also when there was nothing to read: (seconds,
    /// from t).
    longest_gap: (f64, f64),
    /// Statistics samples per fetch state.
    fetch_states: BTreeMap<String, u64>,
}

#[derive(Default)]
struct WatchState {
    parts: Vec<PartitionWatch>,
    /// (broker, partition) -> (fetch offset, the position's epoch, current leader epoch) of
    /// the last Fetch request, for pairing with its reply.
    requested: HashMap<(String, i32), (i64, i32, i32)>,
    /// Client-level errors (the error callback).
    client_errors: BTreeMap<String, u64>,
    debug_lines: u64,
    /// Statistics samples, and those in which the client knew no broker by id (only
    /// bootstrap addresses, or nothing: librdkafka drops every broker a Metadata answer
    /// leaves out).
    stats_samples: u64,
    samples_without_brokers: u64,
    /// The longest such stretch: (seconds, from t), and the one still open.
    longest_without_brokers: (f64, f64),
    without_brokers_since: Option<f64>,
}

struct FetchWatch {
    /// Times are seconds since this instant (the start of the chaos phase).
    t0: Instant,
    debug: Mutex<BufWriter<std::fs::File>>,
    fetches: Mutex<BufWriter<std::fs::File>>,
    stats: Mutex<BufWriter<std::fs::File>>,
    state: Mutex<WatchState>,
}

/// The text between `after` and the next `until` in `s`.
fn between<'a>(s: &'a str, after: &str, until: &str) -> Option<&'a str> {
    let rest = &s[s.find(after)? + after.len()..];
    Some(&rest[..rest.find(until)?])
}

impl FetchWatch {
    fn create(dir: &Path, t0: Instant) -> Arc<Self> {
        let open = |name: &str, header: &str| {
            let mut w = BufWriter::new(std::fs::File::create(dir.join(name)).expect(name));
            let _ = writeln!(w, "{header}");
            Mutex::new(w)
        };
        Arc::new(Self {
            t0,
            debug: open(
                "consumer-debug.log",
                "# t (s since the chaos phase began) level facility librdkafka's line",
            ),
            fetches: open(
                "consumer-fetches.tsv",
                "# t\tbroker\tpartition\tfetch_offset\tposition_epoch\tleader_epoch\terror\thigh_watermark\tlast_stable\tbytes",
            ),
            stats: open(
                "consumer-stats.tsv",
                "# t\tpartition\tbroker\tleader\tleader_epoch\tfetch_state\thi_offset\tls_offset\tlo_offset\tnext_offset\tapp_offset\tfetchq_cnt\trxmsgs\n\
                 # t\tbroker\tname\tnodeid (-1: a bootstrap address)\tstate\tstateage_ms\ttx\trx\ttxerrs\trxerrs\treq_timeouts\tdisconnects\tFetch_requests",
            ),
            state: Mutex::new(WatchState {
                parts: (0..PARTITIONS).map(|_| PartitionWatch::default()).collect(),
                ..WatchState::default()
            }),
        })
    }

    fn t(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    /// One librdkafka log line: written as it is, and parsed when it is a Fetch request or
    /// a reply for one partition.
    fn line(&self, level: RDKafkaLogLevel, fac: &str, msg: &str) {
        let t = self.t();
        if let Ok(mut f) = self.debug.lock() {
            let _ = writeln!(f, "{t:10.3} {level:?} {fac} {msg}");
        }
        // "[thrd:NAME]: BROKER: body"; BROKER is librdkafka's `host:port/id`.
        let rest = msg
            .strip_prefix("[thrd:")
            .and_then(|m| m.split_once("]: "))
            .map_or(msg, |(_, r)| r);
        let Some((broker, body)) = rest.split_once(": ") else {
            return;
        };
        if !broker.contains('/') {
            return;
        }
        let mut st = self.state.lock().expect("watch state");
        st.debug_lines += 1;
        if let Some(req) = body.strip_prefix("Fetch topic ") {
            if !req.starts_with(&format!("{TOPIC} [")) {
                return;
            }
            let parsed = (|| {
                Some((
                    between(req, "[", "]")?.parse::<i32>().ok()?,
                    between(req, "at offset ", " ")?.parse::<i64>().ok()?,
                    between(req, "(leader epoch ", ",")?.parse::<i32>().ok()?,
                    between(req, "current leader epoch ", ",")?
                        .parse::<i32>()
                        .ok()?,
                ))
            })();
            if let Some((p, offset, pos_epoch, epoch)) = parsed {
                st.requested
                    .insert((broker.to_string(), p), (offset, pos_epoch, epoch));
            }
            return;
        }
        let Some(reply) = body.strip_prefix(&format!("Topic {TOPIC} [")) else {
            return;
        };
        if !reply.contains("MessageSet size") {
            return;
        }
        let parsed = (|| {
            Some((
                reply[..reply.find(']')?].parse::<i32>().ok()?,
                between(reply, "MessageSet size ", ",")?
                    .parse::<i64>()
                    .ok()?,
                between(reply, "error \"", "\"")?.to_string(),
                between(reply, "MaxOffset ", ",")?.parse::<i64>().ok()?,
                between(reply, "LSO ", ",")?.parse::<i64>().ok()?,
            ))
        })();
        let Some((p, size, error, hw, lso)) = parsed else {
            return;
        };
        if !(0..PARTITIONS).contains(&p) {
            return;
        }
        let (offset, pos_epoch, epoch) = st
            .requested
            .get(&(broker.to_string(), p))
            .copied()
            .unwrap_or((-1, -1, -1));
        if let Ok(mut f) = self.fetches.lock() {
            let _ = writeln!(
                f,
                "{t:.3}\t{broker}\t{p}\t{offset}\t{pos_epoch}\t{epoch}\t{error}\t{hw}\t{lso}\t{size}"
            );
        }
        let w = &mut st.parts[p as usize];
        w.replies += 1;
        *w.brokers.entry(broker.to_string()).or_default() += 1;
        w.epochs.insert(epoch);
        *w.errors.entry(error.clone()).or_default() += 1;
        if error != "Success" || hw < 0 {
            return;
        }
        w.hw_min = Some(w.hw_min.map_or(hw, |m| m.min(hw)));
        match &w.hw_max {
            Some((max, at, from, max_epoch)) if hw < *max => {
                w.hw_decreases += 1;
                let ex = format!(
                    "t={t:.1}s {broker} epoch {epoch} answered high watermark {hw} (fetching at {offset}); {from} epoch {max_epoch} had answered {max} at t={at:.1}s"
                );
                if w.hw_decrease_episodes
                    .insert((broker.to_string(), epoch, *max))
                {
                    // The first reply of each episode, for the first ten.
                    if w.hw_decrease_examples.len() < 10 {
                        w.hw_decrease_examples.push(ex.clone());
                    }
                }
                if *max - hw > w.hw_largest_drop.0 {
                    w.hw_largest_drop = (*max - hw, ex);
                }
            }
            Some((max, ..)) if hw == *max => {}
            _ => w.hw_max = Some((hw, t, broker.to_string(), epoch)),
        }
        if hw > w.position && w.behind_since.is_none() {
            w.behind_since = Some(t);
        }
    }

    /// The application received the record at `offset` of partition `p`.
    fn delivered(&self, p: i32, offset: i64) {
        let t = self.t();
        let mut st = self.state.lock().expect("watch state");
        let Some(w) = st.parts.get_mut(p as usize) else {
            return;
        };
        if let Some(last) = w.last_delivery {
            if t - last > w.longest_gap.0 {
                w.longest_gap = (t - last, last);
            }
        }
        w.last_delivery = Some(t);
        if let Some(since) = w.behind_since {
            if t - since > w.longest_stall.0 {
                w.longest_stall = (t - since, since, w.position);
            }
        }
        w.position = offset + 1;
        let hw = w.hw_max.as_ref().map_or(0, |m| m.0);
        w.behind_since = (w.position < hw).then_some(t);
    }

    /// One statistics emission (JSON).
    fn statistics(&self, json: &[u8]) {
        let t = self.t();
        let Ok(v) = serde_json::from_slice::<Value>(json) else {
            return;
        };
        let mut lines = Vec::new();
        let mut states = Vec::new();
        if let Some(parts) = v["topics"][TOPIC]["partitions"].as_object() {
            for (p, x) in parts {
                let Ok(p) = p.parse::<i32>() else { continue };
                if !(0..PARTITIONS).contains(&p) {
                    continue;
                }
                let state = x["fetch_state"].as_str().unwrap_or("?").to_string();
                lines.push(format!(
                    "{t:.3}\tpartition\t{p}\t{}\t{}\t{}\t{state}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    x["broker"],
                    x["leader"],
                    x["leader_epoch"],
                    x["hi_offset"],
                    x["ls_offset"],
                    x["lo_offset"],
                    x["next_offset"],
                    x["app_offset"],
                    x["fetchq_cnt"],
                    x["rxmsgs"]
                ));
                states.push((p, state));
            }
        }
        let mut learned = 0;
        if let Some(brokers) = v["brokers"].as_object() {
            for (name, b) in brokers {
                learned += usize::from(b["nodeid"].as_i64().unwrap_or(-1) >= 0);
                lines.push(format!(
                    "{t:.3}\tbroker\t{name}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    b["nodeid"],
                    b["state"].as_str().unwrap_or("?"),
                    b["stateage"].as_i64().map_or(-1, |us| us / 1000),
                    b["tx"],
                    b["rx"],
                    b["txerrs"],
                    b["rxerrs"],
                    b["req_timeouts"],
                    b["disconnects"],
                    b["req"]["Fetch"]
                ));
            }
        }
        if let Ok(mut f) = self.stats.lock() {
            for l in lines {
                let _ = writeln!(f, "{l}");
            }
        }
        let mut st = self.state.lock().expect("watch state");
        for (p, state) in states {
            *st.parts[p as usize].fetch_states.entry(state).or_default() += 1;
        }
        st.stats_samples += 1;
        if learned == 0 {
            st.samples_without_brokers += 1;
            let since = *st.without_brokers_since.get_or_insert(t);
            if t - since > st.longest_without_brokers.0 {
                st.longest_without_brokers = (t - since, since);
            }
        } else {
            st.without_brokers_since = None;
        }
    }

    fn client_error(&self, error: &KafkaError, reason: &str) {
        let t = self.t();
        if let Ok(mut f) = self.debug.lock() {
            let _ = writeln!(f, "{t:10.3} ERROR-CALLBACK {error}: {reason}");
        }
        let mut st = self.state.lock().expect("watch state");
        if st.client_errors.len() < 50 {
            *st.client_errors.entry(error.to_string()).or_default() += 1;
        }
    }

    /// Flushes the files and sums up per partition (open stretches end now).
    fn finish(&self) -> Vec<String> {
        let t = self.t();
        for f in [&self.debug, &self.fetches, &self.stats] {
            if let Ok(mut f) = f.lock() {
                let _ = f.flush();
            }
        }
        let st = self.state.lock().expect("watch state");
        let mut out = vec![
            format!(
                "consumer's fetch log: {} librdkafka broker lines; files consumer-debug.log, consumer-fetches.tsv, consumer-stats.tsv in the run directory",
                st.debug_lines
            ),
            format!(
                "  statistics samples {}, of which {} with no broker known by id (longest stretch {:.0}s from t={:.1}s{})",
                st.stats_samples,
                st.samples_without_brokers,
                st.longest_without_brokers.0,
                st.longest_without_brokers.1,
                if st.without_brokers_since.is_some() { ", still so at the end" } else { "" }
            ),
        ];
        for (p, w) in st.parts.iter().enumerate() {
            let mut stall = w.longest_stall;
            // The stretch since the last record counts too (the consumer may never have
            // received another one).
            let mut gap = w.longest_gap;
            if let Some(last) = w.last_delivery {
                if t - last > gap.0 {
                    gap = (t - last, last);
                }
            }
            if let Some(since) = w.behind_since {
                if t - since > stall.0 {
                    stall = (t - since, since, w.position);
                }
            }
            let errors: Vec<String> = w
                .errors
                .iter()
                .filter(|(e, _)| e.as_str() != "Success")
                .map(|(e, n)| format!("{e} x{n}"))
                .collect();
            out.push(format!(
                "  {TOPIC}-{p}: {} fetch replies (by broker {:?}); leader epochs fetched with {:?}; error replies [{}]; high watermark lowest {} highest {}; replies with a high watermark below an earlier one {} in {} episodes (largest drop {} records{}); longest stretch behind the high watermark without progress {:.2}s (from t={:.1}s, at offset {}); longest gap between records, up to the consumer's end at t={t:.0}s {:.2}s (from t={:.1}s); fetch states sampled {:?}",
                w.replies,
                w.brokers,
                w.epochs,
                errors.join(", "),
                w.hw_min.map_or("-".into(), |h| h.to_string()),
                w.hw_max.as_ref().map_or("-".into(), |h| h.0.to_string()),
                w.hw_decreases,
                w.hw_decrease_episodes.len(),
                w.hw_largest_drop.0,
                if w.hw_largest_drop.0 > 0 {
                    format!(": {}", w.hw_largest_drop.1)
                } else {
                    String::new()
                },
                stall.0,
                stall.1,
                stall.2,
                gap.0,
                gap.1,
                w.fetch_states,
            ));
            for ex in &w.hw_decrease_examples {
                out.push(format!(
                    "    high watermark decrease (episode's first reply): {ex}"
                ));
            }
        }
        for (e, n) in &st.client_errors {
            out.push(format!("  consumer client error x{n}: {e}"));
        }
        out
    }
}

/// The chaos consumer's context: every log line, statistics and error go to the watch.
struct Watched(Arc<FetchWatch>);

impl ClientContext for Watched {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.0.line(level, fac, log_message);
    }

    fn stats_raw(&self, statistics: &[u8]) {
        self.0.statistics(statistics);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.0.client_error(&error, reason);
    }
}

impl ConsumerContext for Watched {}

fn consumer_config(bootstrap: &str, group: &str) -> ClientConfig {
    let mut c = client_config(bootstrap);
    c.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100")
        .set("topic.metadata.refresh.interval.ms", "5000");
    c
}

fn assign_all<C: ConsumerContext>(c: &BaseConsumer<C>) {
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(TOPIC, p, rdkafka::Offset::Beginning)
            .expect("assign");
    }
    c.assign(&tpl).expect("assign");
}

/// The continuous consumer, with its fetches recorded by `watch`.
fn chaos_consumer(bootstrap: &str, group: &str, watch: Arc<FetchWatch>) -> BaseConsumer<Watched> {
    let mut config = consumer_config(bootstrap, group);
    config
        .set("debug", "fetch,msg,topic,metadata")
        .set("statistics.interval.ms", "1000")
        .set_log_level(RDKafkaLogLevel::Debug);
    let c: BaseConsumer<Watched> = config
        .create_with_context(Watched(watch))
        .expect("chaos consumer");
    assign_all(&c);
    c
}

/// Polls every partition until `stop` (or `until`, a hard bound), recording what it reads.
fn consume_loop(
    bootstrap: String,
    stop: Arc<AtomicBool>,
    until: Instant,
    log: Arc<Mutex<ConsumerLog>>,
    watch: Arc<FetchWatch>,
) {
    let c = chaos_consumer(&bootstrap, "chaos-reader", watch.clone());
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
                watch.delivered(p, o);
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
    let c: BaseConsumer = consumer_config(bootstrap, "chaos-final-read")
        .create()
        .expect("final reader");
    assign_all(&c);
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
/// epoch, the ISR is all three, and the high watermark, the leader's log end and every
/// follower's log end are equal.
fn converged(c: &Cluster<'_>) -> Result<Vec<(u8, i64, i64)>, String> {
    match c.target {
        Target::Spate => spate_converged(c),
        Target::Kafka(_) => kafka_converged(c),
    }
}

/// `converged` for spate, from every node's `/admin/cluster`.
fn spate_converged(c: &Cluster<'_>) -> Result<Vec<(u8, i64, i64)>, String> {
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

// ---------------------------------------------------------------------------------------
// Kafka's view, through the protocol: a Metadata request to each node for leaders, epochs and
// ISRs; ListOffsets for the high watermark (from the leader) and each replica's log end (the
// debugging replica id -2, which Kafka serves from followers too); Fetch v12 to each replica
// for its batches.

/// One request on a fresh connection with short timeouts.
fn kafka_call<Req: Encodable, Resp: Decodable>(
    addr: &str,
    key: ApiKey,
    version: i16,
    req: &Req,
) -> Result<Resp, String> {
    let sock: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let mut s = TcpStream::connect_timeout(&sock, Duration::from_secs(2))
        .map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .and_then(|()| s.set_write_timeout(Some(Duration::from_secs(5))))
        .map_err(|e| format!("{addr}: {e}"))?;
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(1)
        .with_client_id(Some(StrBytes::from_static_str("spate-chaos")));
    let body = spate_protocol::codec::encode_request(&header, req)
        .map_err(|e| format!("encode {key:?}: {e:?}"))?;
    let mut framed = BytesMut::with_capacity(body.len() + 4);
    framed.put_i32(body.len() as i32);
    framed.extend_from_slice(&body);
    s.write_all(&framed).map_err(|e| format!("{addr}: {e}"))?;
    let mut len = [0u8; 4];
    s.read_exact(&mut len).map_err(|e| format!("{addr}: {e}"))?;
    let mut frame = vec![0u8; i32::from_be_bytes(len).max(0) as usize];
    s.read_exact(&mut frame)
        .map_err(|e| format!("{addr}: {e}"))?;
    let mut frame = Bytes::from(frame);
    ResponseHeader::decode(&mut frame, key.response_header_version(version))
        .map_err(|e| format!("{addr}: {key:?} header: {e}"))?;
    Resp::decode(&mut frame, version).map_err(|e| format!("{addr}: {key:?} body: {e}"))
}

fn topic_name() -> TopicName {
    TopicName(StrBytes::from_static_str(TOPIC))
}

fn kafka_metadata(addr: &str) -> Result<MetadataResponse, String> {
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(topic_name()))
        ]))
        .with_allow_auto_topic_creation(false);
    kafka_call(addr, ApiKey::Metadata, 12, &req)
}

/// A partition as one Kafka node sees it.
#[derive(Debug, PartialEq)]
struct KafkaPartition {
    partition: i32,
    leader: i32,
    epoch: i32,
    isr: Vec<i32>,
}

/// Every partition of the test topic as the node at `addr` sees it.
fn kafka_partitions(addr: &str) -> Result<Vec<KafkaPartition>, String> {
    let m = kafka_metadata(addr)?;
    let t = m
        .topics
        .iter()
        .find(|t| t.name.as_ref() == Some(&topic_name()))
        .ok_or_else(|| format!("{addr}: no topic {TOPIC}"))?;
    if t.error_code != 0 {
        return Err(format!("{addr}: {TOPIC}: error {}", t.error_code));
    }
    let mut out: Vec<KafkaPartition> = t
        .partitions
        .iter()
        .map(|p| {
            let mut isr: Vec<i32> = p.isr_nodes.iter().map(|b| b.0).collect();
            isr.sort_unstable();
            KafkaPartition {
                partition: p.partition_index,
                leader: p.leader_id.0,
                epoch: p.leader_epoch,
                isr,
            }
        })
        .collect();
    out.sort_by_key(|p| p.partition);
    if out.len() != PARTITIONS as usize {
        return Err(format!("{addr}: {} partitions", out.len()));
    }
    Ok(out)
}

/// ListOffsets (latest) for partition `p` at `addr`: as a consumer (replica id -1) the high
/// watermark, from the leader only; as the debugging replica (-2) the replica's log end.
fn kafka_latest(addr: &str, replica_id: i32, p: i32) -> Result<i64, String> {
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(replica_id))
        .with_isolation_level(0)
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(topic_name())
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(p)
                .with_current_leader_epoch(-1)
                .with_timestamp(-1)])]);
    let resp: ListOffsetsResponse = kafka_call(addr, ApiKey::ListOffsets, 7, &req)?;
    let part = resp
        .topics
        .first()
        .and_then(|t| t.partitions.first())
        .ok_or_else(|| format!("{addr}: empty ListOffsets answer"))?;
    if part.error_code != 0 {
        return Err(format!(
            "{addr}: ListOffsets {TOPIC}-{p} (replica id {replica_id}): error {}",
            part.error_code
        ));
    }
    Ok(part.offset)
}

/// Fetch v12 of partition `p` at `offset` from the node at `addr` (leader or follower):
/// (error code, that replica's high watermark, records).
fn kafka_fetch(addr: &str, p: i32, offset: i64) -> Result<(i16, i64, Bytes), String> {
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(0)
        .with_max_bytes(4 << 20)
        .with_isolation_level(0)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(topic_name())
            .with_partitions(vec![FetchPartition::default()
                .with_partition(p)
                .with_current_leader_epoch(-1)
                .with_fetch_offset(offset)
                .with_last_fetched_epoch(-1)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(1 << 20)])])
        .with_rack_id(StrBytes::from_static_str(""));
    let resp: FetchResponse = kafka_call(addr, ApiKey::Fetch, 12, &req)?;
    if resp.error_code != 0 {
        return Err(format!("{addr}: Fetch error {}", resp.error_code));
    }
    let part = resp
        .responses
        .first()
        .and_then(|t| t.partitions.first())
        .ok_or_else(|| format!("{addr}: empty Fetch answer"))?;
    Ok((
        part.error_code,
        part.high_watermark,
        part.records.clone().unwrap_or_default(),
    ))
}

/// `converged` for Kafka: every node's metadata agrees on leader and epoch with the ISR
/// whole; the leader's high watermark equals every replica's log end.
fn kafka_converged(c: &Cluster<'_>) -> Result<Vec<(u8, i64, i64)>, String> {
    let views: Vec<Vec<KafkaPartition>> = c
        .nodes
        .iter()
        .map(|n| kafka_partitions(&n.kafka))
        .collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for p in 0..PARTITIONS {
        let first = &views[0][p as usize];
        if views.iter().any(|v| {
            let x = &v[p as usize];
            (x.leader, x.epoch) != (first.leader, first.epoch)
        }) {
            let seen: Vec<_> = views.iter().map(|v| &v[p as usize]).collect();
            return Err(format!("{TOPIC}-{p}: nodes disagree: {seen:?}"));
        }
        if first.isr.len() != usize::from(NODES) {
            return Err(format!("{TOPIC}-{p}: ISR not whole: {first:?}"));
        }
        let leader = u8::try_from(first.leader)
            .ok()
            .filter(|l| (1..=NODES).contains(l))
            .ok_or_else(|| format!("{TOPIC}-{p}: no leader: {first:?}"))?;
        let hw = kafka_latest(&c.nodes[usize::from(leader) - 1].kafka, -1, p)?;
        for n in &c.nodes {
            let end = kafka_latest(&n.kafka, -2, p)?;
            if end != hw {
                return Err(format!(
                    "{TOPIC}-{p}: node {} log end {end}, high watermark {hw}",
                    n.id
                ));
            }
        }
        out.push((leader, i64::from(first.epoch), hw));
    }
    Ok(out)
}

/// Node `addr`'s copy of partition `p` below `hw`, read through Fetch (a follower answers up
/// to its own high watermark, which reaches `hw` within a replication round or two): its
/// batches and how far they reach.
fn kafka_replica(addr: &str, p: i32, hw: i64) -> Result<(Vec<StoredBatch>, i64), String> {
    let mut batches = Vec::new();
    let mut offset = 0i64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while offset < hw {
        let (err, replica_hw, records) = kafka_fetch(addr, p, offset)?;
        if err != 0 {
            return Err(format!(
                "{addr}: Fetch {TOPIC}-{p} at {offset}: error {err}"
            ));
        }
        let before = offset;
        for (at, h) in Batches::new(&records) {
            if h.base_offset >= hw {
                break;
            }
            if h.last_offset() >= offset {
                batches.push(StoredBatch {
                    base_offset: h.base_offset,
                    last_offset: h.last_offset(),
                    leader_epoch: h.partition_leader_epoch,
                    bytes: records.slice(at..at + h.total_len()),
                });
                offset = h.next_offset();
            }
        }
        if offset == before {
            if Instant::now() > deadline {
                return Ok((batches, replica_hw.min(offset)));
            }
            // Nothing new: this replica's high watermark has not reached `offset` yet.
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok((batches, offset))
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

/// Counts where the replicas of partition `p` differ below `hw`: a replica whose log or
/// batches end below it, and every position in the batch sequence where the copies differ.
fn compare_replicas(
    p: usize,
    hw: i64,
    copies: &[(Vec<StoredBatch>, i64, Vec<String>)],
    differences: &mut u64,
    notes: &mut Vec<String>,
) {
    for (i, (batches, end, repairs)) in copies.iter().enumerate() {
        if !repairs.is_empty() {
            notes.push(format!(
                "node {} {TOPIC}-{p}: recovery repaired {repairs:?}",
                i + 1
            ));
        }
        let covered = batches.last().map_or(0, |b| b.last_offset + 1);
        if *end < hw || covered < hw {
            *differences += 1;
            notes.push(format!(
                "node {} {TOPIC}-{p}: log end {end}, batches cover up to {covered}, below the high watermark {hw}",
                i + 1
            ));
        }
    }
    let longest = copies.iter().map(|c| c.0.len()).max().unwrap_or(0);
    notes.push(format!(
        "{TOPIC}-{p}: batches below the high watermark {hw} per node {:?}",
        copies.iter().map(|c| c.0.len()).collect::<Vec<_>>()
    ));
    for k in 0..longest {
        let at: Vec<Option<&StoredBatch>> = copies.iter().map(|c| c.0.get(k)).collect();
        if at.iter().any(|b| *b != at[0]) {
            *differences += 1;
            if notes.len() < 24 {
                notes.push(format!("{TOPIC}-{p} batch #{k}: {at:?}"));
            }
        }
    }
}

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
    let target = Target::from_env();
    eprintln!("chaos: the nodes run {}", target.name());

    let kind = match target {
        Target::Spate => "spate",
        Target::Kafka(_) => "kafka",
    };
    let root =
        std::env::temp_dir().join(format!("spate-chaos-{kind}-{}-{seed}", std::process::id()));
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
        target: target.clone(),
        nodes: (1..=NODES)
            .map(|id| ChaosNode::new(&net, &target, id, &root))
            .collect(),
    };
    if let Target::Kafka(kit) = &target {
        let formats: Vec<_> = cluster.nodes.iter().map(|n| n.kafka_format(kit)).collect();
        for (mut f, n) in formats.into_iter().zip(&cluster.nodes) {
            let status = f.wait().expect("kafka-storage format");
            assert!(
                status.success(),
                "kafka-storage format for node {} failed: {}",
                n.id,
                std::fs::read_to_string(n.dir.join("logs/format.log")).unwrap_or_default()
            );
        }
    }
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

    // Clients. The chaos phase's clock starts with them.
    let t0 = Instant::now();
    let watch = FetchWatch::create(&root, t0);
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
                t0,
            ))
        })
        .collect();
    let stop_consuming = Arc::new(AtomicBool::new(false));
    let _stop_consuming_guard = StopOnDrop(stop_consuming.clone());
    let consumed = Arc::new(Mutex::new(ConsumerLog::default()));
    let consumer = {
        let (b, stop, log) = (bootstrap.clone(), stop_consuming.clone(), consumed.clone());
        let until = Instant::now() + duration + Duration::from_secs(900);
        let watch = watch.clone();
        std::thread::spawn(move || consume_loop(b, stop, until, log, watch))
    };

    // Faults.
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
        || cluster.isr_whole(),
    );
    schedule.note("final: all nodes ready, every ISR whole; stopping producers".into());
    stop_producing.store(true, Ordering::SeqCst);
    let mut produced = Vec::new();
    let mut replaced = Vec::new();
    let mut enqueue_refusals = 0;
    let mut per_minute: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
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
        for (m, (a, f)) in r.per_minute {
            let e = per_minute.entry(m).or_default();
            e.0 += a;
            e.1 += f;
        }
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
    let fetch_summary = watch.finish();
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
        .filter(|_| matches!(target, Target::Spate))
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

    // Compare the replicas: Kafka's through the protocol while they run, spate's files
    // after the nodes stop.
    let mut replica_differences = 0u64;
    let mut replica_notes = Vec::new();
    if let Target::Kafka(_) = target {
        for (p, &hw) in ends.iter().enumerate() {
            let copies: Vec<(Vec<StoredBatch>, i64, Vec<String>)> = cluster
                .nodes
                .iter()
                .map(|n| {
                    kafka_replica(&n.kafka, p as i32, hw)
                        .map(|(b, end)| (b, end, Vec::new()))
                        .unwrap_or_else(|e| panic!("node {}: {e}", n.id))
                })
                .collect();
            compare_replicas(p, hw, &copies, &mut replica_differences, &mut replica_notes);
        }
    }
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
    if let Target::Spate = target {
        for (p, &hw) in ends.iter().enumerate() {
            let copies: Vec<(Vec<StoredBatch>, i64, Vec<String>)> = cluster
                .nodes
                .iter()
                .map(|n| {
                    read_replica(&n.data_dir().join(format!("topics/{TOPIC}/{p}")), hw)
                        .unwrap_or_else(|e| panic!("node {}: {e}", n.id))
                })
                .collect();
            compare_replicas(p, hw, &copies, &mut replica_differences, &mut replica_notes);
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
    line("==================== chaos report ====================".into());
    line(format!("target: {}", target.name()));
    line(format!(
        "message.timeout.ms {}; --fsync {}",
        message_timeout_ms(),
        match target {
            Target::Spate =>
                std::env::var("SPATE_CHAOS_FSYNC").unwrap_or_else(|_| "(default)".into()),
            Target::Kafka(_) => "n/a (Kafka's defaults: no fsync per write)".into(),
        }
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
        "  deliveries per minute of the run, acknowledged/failed: {}",
        per_minute
            .iter()
            .map(|(m, (a, f))| format!("{m}:{a}/{f}"))
            .collect::<Vec<_>>()
            .join(" ")
    ));
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
    for l in &fetch_summary {
        line(l.clone());
    }
    line(format!(
        "final log: {} records, high watermarks {ends:?}, (leader, epoch, hw) {heads:?}; not written by this test {foreign}",
        final_log.len()
    ));
    line(format!(
        "node stops (id, clean after SIGTERM): {clean_stops:?}"
    ));
    match target {
        Target::Spate => {
            line("errors the brokers answered (a restarted node counts from its restart):".into());
            for a in &answered {
                line(format!("  {a}"));
            }
            line("replicas compared: each node's segment files, opened with spate's log code after the nodes stopped".into());
        }
        Target::Kafka(_) => {
            line("errors the brokers answered: not collected for Kafka (see the nodes' logs/server.log)".into());
            line("replicas compared: each node's batches below the high watermark, read with Fetch v12 from every replica (followers serve them since KIP-392) before the nodes stopped".into());
        }
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

/// The fetch watch parses librdkafka's Fetch request and reply lines, pairs them by broker
/// and partition, and counts a reply whose high watermark is below one seen before.
#[test]
fn the_fetch_watch_reads_librdkafkas_fetch_lines() {
    let dir = tempfile::tempdir().expect("temp dir");
    let w = FetchWatch::create(dir.path(), Instant::now());
    let b1 = "10.77.0.1:9092/1";
    let b2 = "10.77.0.2:9092/2";
    let req = |b: &str, offset: i64, epoch: i32| {
        format!("[thrd:{b}]: {b}: Fetch topic {TOPIC} [0] at offset {offset} (leader epoch {epoch}, current leader epoch {epoch}, v3)")
    };
    let reply = |b: &str, error: &str, hw: i64| {
        format!("[thrd:{b}]: {b}: Topic {TOPIC} [0] MessageSet size 82, error \"{error}\", MaxOffset {hw}, LSO {hw}, Ver 3/3")
    };
    w.line(RDKafkaLogLevel::Debug, "FETCH", &req(b1, 0, 4));
    w.line(RDKafkaLogLevel::Debug, "FETCH", &reply(b1, "Success", 10));
    w.delivered(0, 9);
    w.line(RDKafkaLogLevel::Debug, "FETCH", &req(b2, 10, 5));
    w.line(
        RDKafkaLogLevel::Debug,
        "FETCH",
        &reply(b2, "Broker: Not leader for partition", -1),
    );
    w.line(RDKafkaLogLevel::Debug, "FETCH", &reply(b2, "Success", 8));
    let summary = w.finish().join("\n");
    assert!(summary.contains("3 fetch replies"), "{summary}");
    assert!(
        summary.contains("leader epochs fetched with {4, 5}"),
        "{summary}"
    );
    assert!(
        summary.contains("Broker: Not leader for partition x1"),
        "{summary}"
    );
    assert!(
        summary.contains("high watermark lowest 8 highest 10"),
        "{summary}"
    );
    assert!(
        summary.contains(
            "high watermark below an earlier one 1 in 1 episodes (largest drop 2 records"
        ),
        "{summary}"
    );
    assert!(
        summary.contains(&format!(
            "{b2} epoch 5 answered high watermark 8 (fetching at 10)"
        )),
        "{summary}"
    );
    let tsv = std::fs::read_to_string(dir.path().join("consumer-fetches.tsv")).expect("tsv");
    assert_eq!(tsv.lines().count(), 4, "{tsv}");
    assert!(
        tsv.contains(&format!("{b1}\t0\t0\t4\t4\tSuccess\t10\t10\t82")),
        "{tsv}"
    );
}
