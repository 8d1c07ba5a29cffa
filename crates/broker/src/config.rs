use std::path::PathBuf;
use std::time::Duration;

use spate_log::FsyncPolicy;

use crate::groups::GroupSettings;
use crate::producer_state::ProducerLimits;

/// Kafka's default `fetch.max.bytes`: 55 MiB.
pub const DEFAULT_FETCH_MAX_BYTES: usize = 55 << 20;

/// Everything the broker needs to know about how it was started.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// This broker's id in Metadata responses.
    pub node_id: i32,
    /// Host clients are told to connect to.
    pub advertised_host: String,
    /// Port clients are told to connect to.
    pub advertised_port: i32,
    /// Root of all stored data.
    pub data_dir: PathBuf,
    /// When data reaches disk and whether acks wait for it.
    pub fsync: FsyncPolicy,
    /// Partitions for auto-created topics and CreateTopics with -1.
    pub default_partitions: i32,
    /// Whether Metadata requests may create unknown topics.
    pub auto_create_topics: bool,
    /// How often retention runs.
    pub retention_check_interval: Duration,
    /// Largest request frame accepted.
    pub max_frame_bytes: usize,
    /// Most record bytes in one fetch response, whatever the client asks (Kafka's broker-side
    /// `fetch.max.bytes`); KIP-74 lets the first partition exceed it by one batch.
    pub fetch_max_bytes: usize,
    /// Consumer group timeouts and offset retention.
    pub groups: GroupSettings,
    /// Transaction settings.
    pub txns: crate::transactions::TxnSettings,
    /// How often the log cleaner looks for compacted partitions due a clean
    /// (`log.cleaner.backoff.ms`).
    pub cleaner_backoff: Duration,
    /// The cleaner's key map size (`log.cleaner.dedupe.buffer.size`).
    pub cleaner_buffer_bytes: usize,
    /// The cleaner's read and write rate limit (`log.cleaner.io.max.bytes.per.second`); `None`:
    /// unlimited.
    pub cleaner_io_bytes_per_sec: Option<u64>,
    /// The broker will join a cluster: `__consumer_offsets` then comes from the cluster's
    /// metadata instead of being created locally.
    pub cluster_mode: bool,
    /// Idempotent producers idle this long are forgotten (Kafka's
    /// `producer.id.expiration.ms`), at the next retention pass.
    pub producer_id_expiration_ms: i64,
    /// Most producer ids remembered per partition; beyond it the least recently used one is
    /// forgotten.
    pub max_producer_ids_per_partition: usize,
    /// Share groups' broker-wide settings (`group.share.*`).
    pub share: crate::share::ShareSettings,
    /// Bytes of requests and responses in flight before connections stop reading.
    pub memory_limit_bytes: usize,
    /// Per-connection buffer for outgoing responses.
    pub write_buffer_bytes: usize,
    /// Connections accepted at once; more are closed with a log line.
    pub max_connections: usize,
    /// Connections accepted at once from one IP address.
    pub max_connections_per_ip: usize,
    /// Client telemetry (KIP-714): metric name prefixes clients are asked to push (`""` for
    /// all, none for no pushes).
    pub telemetry_metrics: Vec<String>,
    /// How often clients push their telemetry.
    pub telemetry_push_interval_ms: u32,
    /// SASL mechanisms, re-authentication and bootstrap users.
    pub security: crate::security::SecuritySettings,
    /// The advertised address of each listener, for Metadata answers to clients of that
    /// listener; empty: one PLAINTEXT listener at `advertised_host:advertised_port`.
    pub listeners: Vec<crate::security::Listener>,
    /// Free space of the data dir below which produce is refused (`--disk-min-free-bytes`,
    /// `--disk-min-free-percent`); disabled by default here so tests do not depend on the
    /// host's disk, the server sets its own defaults.
    pub disk_watermark: crate::disk::DiskWatermark,
}

/// A named trade-off between latency and throughput for producers (`--produce-profile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProduceProfile {
    /// Small buffers, fsync rounds start at once: lowest latency, least memory.
    LowLatency,
    /// The default.
    Balanced,
    /// Larger buffers and short fsync windows: more throughput per core.
    HighThroughput,
    /// Largest buffers and windows: throughput first.
    Extreme,
}

impl ProduceProfile {
    /// Every profile with its name.
    pub const ALL: [(&'static str, ProduceProfile); 4] = [
        ("low-latency", Self::LowLatency),
        ("balanced", Self::Balanced),
        ("high-throughput", Self::HighThroughput),
        ("extreme", Self::Extreme),
    ];

    /// Looks a profile up by name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, p)| *p == self)
            .map_or("balanced", |(n, _)| n)
    }

    /// Memory for requests and responses in flight.
    pub fn memory_limit_bytes(self) -> usize {
        match self {
            Self::LowLatency => 16 << 20,
            Self::Balanced => 64 << 20,
            Self::HighThroughput => 256 << 20,
            Self::Extreme => 512 << 20,
        }
    }

    /// How long an fsync round under `--fsync always` waits to gather more writes.
    pub fn group_commit_window(self) -> Duration {
        Duration::from_millis(match self {
            Self::LowLatency | Self::Balanced => 0,
            Self::HighThroughput => 2,
            Self::Extreme => 10,
        })
    }

    /// Per-connection response buffer (fetch buffering).
    pub fn write_buffer_bytes(self) -> usize {
        match self {
            Self::LowLatency => 16 << 10,
            Self::Balanced => 64 << 10,
            Self::HighThroughput => 256 << 10,
            Self::Extreme => 1 << 20,
        }
    }
}

impl BrokerConfig {
    /// The limits every partition applies to its producer states.
    pub fn producer_limits(&self) -> ProducerLimits {
        ProducerLimits {
            expiration_ms: self.producer_id_expiration_ms,
            max_producers: self.max_producer_ids_per_partition,
        }
    }

    /// Defaults for a broker storing in `data_dir` and reachable at `host:port`.
    pub fn new(data_dir: PathBuf, host: impl Into<String>, port: i32) -> Self {
        Self {
            node_id: 0,
            advertised_host: host.into(),
            advertised_port: port,
            data_dir,
            fsync: FsyncPolicy::Never,
            default_partitions: 1,
            auto_create_topics: true,
            retention_check_interval: Duration::from_secs(30),
            max_frame_bytes: spate_protocol::frame::DEFAULT_MAX_FRAME_BYTES,
            fetch_max_bytes: DEFAULT_FETCH_MAX_BYTES,
            groups: GroupSettings::default(),
            txns: crate::transactions::TxnSettings::default(),
            cleaner_backoff: Duration::from_secs(15),
            cleaner_buffer_bytes: 128 << 20,
            cleaner_io_bytes_per_sec: None,
            cluster_mode: false,
            producer_id_expiration_ms: ProducerLimits::default().expiration_ms,
            max_producer_ids_per_partition: ProducerLimits::default().max_producers,
            share: crate::share::ShareSettings::default(),
            memory_limit_bytes: ProduceProfile::Balanced.memory_limit_bytes(),
            write_buffer_bytes: ProduceProfile::Balanced.write_buffer_bytes(),
            max_connections: 10_000,
            max_connections_per_ip: 10_000,
            telemetry_metrics: vec![
                "org.apache.kafka.producer.".into(),
                "org.apache.kafka.consumer.".into(),
            ],
            telemetry_push_interval_ms: 300_000,
            security: crate::security::SecuritySettings::default(),
            listeners: Vec::new(),
            disk_watermark: crate::disk::DiskWatermark::DISABLED,
        }
    }
}
