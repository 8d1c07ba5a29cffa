//! Command-line flags, each with an environment twin.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use serde::Serialize;
use spate_broker::security::{parse_listeners, Listener, SecuritySettings};
use spate_broker::{BrokerConfig, ProduceProfile};
use spate_log::FsyncPolicy;

/// spate: a Kafka-compatible event-streaming broker.
///
/// With no arguments it listens on 127.0.0.1:9092 and stores data in ./data. Every flag can
/// also be set through the environment variable shown with it, or as a key of the same name
/// in a TOML file given with --config. Precedence: flag, then environment, then config file,
/// then the default.
#[derive(Debug, Parser, Serialize)]
#[command(name = "spate", version, about, long_about)]
pub struct Args {
    /// TOML file of settings, keyed by flag name without the dashes (e.g. `data-dir = "/var/lib/spate"`).
    #[arg(long, env = "SPATE_CONFIG")]
    pub config: Option<PathBuf>,

    /// Address and port of the HTTP listener (/metrics, /health, /ready, /admin).
    #[arg(long, env = "SPATE_HTTP_LISTEN", default_value = "127.0.0.1:9644")]
    pub http_listen: String,

    /// Bearer token that admin API mutations (POST, PATCH, DELETE) must present.
    #[arg(long, env = "SPATE_ADMIN_TOKEN")]
    #[serde(skip_serializing)]
    pub admin_token: Option<String>,

    /// Address and port to accept Kafka clients on. Port 0 picks a free port (printed on start).
    #[arg(long, env = "SPATE_LISTEN", default_value = "127.0.0.1:9092")]
    pub listen: String,

    /// HOST:PORT clients are told to connect to in Metadata responses. Defaults to the
    /// listening address.
    #[arg(long, env = "SPATE_ADVERTISED_ADDRESS")]
    pub advertised_address: Option<String>,

    /// Kafka listeners in Kafka's form, `NAME://host:port,...`, NAME one of PLAINTEXT, SSL,
    /// SASL_PLAINTEXT, SASL_SSL (each at most once); replaces --listen. Port 0 picks a free
    /// port (printed on start).
    #[arg(long, env = "SPATE_LISTENERS")]
    pub listeners: Option<String>,

    /// What Metadata tells the clients of each listener, in the same form (default: the
    /// listeners as bound). Clients get the addresses of the listener they connected to.
    #[arg(long, env = "SPATE_ADVERTISED_LISTENERS")]
    pub advertised_listeners: Option<String>,

    /// PEM certificate chain of the SSL and SASL_SSL listeners; reloaded when the file
    /// changes (or on SIGHUP), open connections untouched.
    #[arg(long, env = "SPATE_SSL_CERT")]
    pub ssl_cert: Option<PathBuf>,

    /// PEM private key of --ssl-cert.
    #[arg(long, env = "SPATE_SSL_KEY")]
    pub ssl_key: Option<PathBuf>,

    /// PEM CA certificates client certificates are checked against (SSL listener).
    #[arg(long, env = "SPATE_SSL_CA")]
    pub ssl_ca: Option<PathBuf>,

    /// Whether the SSL listener asks for client certificates: required, requested or none.
    /// A client certificate's principal is `User:CN=<common name>`. SASL_SSL listeners never
    /// ask (as in Kafka).
    #[arg(long, env = "SPATE_SSL_CLIENT_AUTH", default_value = "none")]
    pub ssl_client_auth: String,

    /// SASL mechanisms offered on SASL listeners: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512. All
    /// check passwords against one store of salted SCRAM credentials (users come from
    /// SPATE_BOOTSTRAP_USERS=user:password,... on first start, and from kafka-configs).
    #[arg(
        long,
        env = "SPATE_SASL_MECHANISMS",
        default_value = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
    )]
    pub sasl_mechanisms: String,

    /// `basic`: every HTTP call but /health and /ready (and /metrics, see
    /// --http-metrics-auth) needs HTTP Basic credentials of a SASL user (or the admin token,
    /// a super user), and ACLs apply: ingest writes its topic, search reads its topics, the
    /// admin API describes or alters the cluster. `none` (the default): the admin token only.
    #[arg(long, env = "SPATE_HTTP_AUTH", default_value = "none")]
    pub http_auth: String,

    /// With --http-auth basic: /metrics needs credentials too (Describe on the cluster).
    #[arg(long, env = "SPATE_HTTP_METRICS_AUTH", default_value = "false")]
    pub http_metrics_auth: String,

    /// `true`: the HTTP listeners (--http-listen, --ingest-listen, --schema-registry-listen) serve HTTPS with
    /// --ssl-cert and --ssl-key; node-to-node HTTP then uses HTTPS too, trusting --ssl-ca.
    #[arg(long, env = "SPATE_HTTP_TLS", default_value = "false")]
    pub http_tls: String,

    /// `true`: every inter-node connection (the metadata quorum, replica fetches and other
    /// Kafka requests between brokers) uses mutual TLS: each node presents --ssl-cert and
    /// accepts only peers whose certificate --ssl-ca signed, and checks that a peer's
    /// certificate names the host it was reached at (as in --cluster-peers).
    #[arg(long, env = "SPATE_CLUSTER_TLS", default_value = "false")]
    pub cluster_tls: String,

    /// `acl` enforces Kafka ACLs (managed with kafka-acls: CreateAcls, DescribeAcls,
    /// DeleteAcls); `none` (the default) allows every request.
    #[arg(long, env = "SPATE_AUTHORIZER", default_value = "none")]
    pub authorizer: String,

    /// Principals allowed everything whatever the ACLs say, e.g. `User:admin,User:CN=ops`.
    #[arg(long, env = "SPATE_SUPER_USERS", default_value = "")]
    pub super_users: String,

    /// With `--authorizer acl`: whether a resource no ACL names is open to everyone.
    #[arg(
        long,
        env = "SPATE_ALLOW_EVERYONE_IF_NO_ACL_FOUND",
        default_value = "false"
    )]
    pub allow_everyone_if_no_acl_found: String,

    /// An authenticated SASL session lasts this long; clients re-authenticate before it ends
    /// (KIP-368) or are disconnected (connections.max.reauth.ms). 0: sessions never expire.
    #[arg(long, env = "SPATE_CONNECTIONS_MAX_REAUTH_MS", default_value_t = 0)]
    pub connections_max_reauth_ms: u64,

    /// A connection of an SSL or SASL listener that has not finished its TLS handshake and
    /// SASL authentication this long after connecting is closed.
    #[arg(
        long,
        env = "SPATE_CONNECTIONS_AUTH_TIMEOUT_MS",
        default_value_t = 30_000
    )]
    pub connections_auth_timeout_ms: u64,

    /// HOST:PORT other cluster nodes reach this node's HTTP listener at (search fan-out,
    /// ingest routing). Defaults to the HTTP listening address, or the advertised host with
    /// the HTTP port when listening on all interfaces.
    #[arg(long, env = "SPATE_ADVERTISED_HTTP_ADDRESS")]
    pub advertised_http_address: Option<String>,

    /// Directory holding all topics, partitions and broker state.
    #[arg(long, env = "SPATE_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,

    /// When written data is forced to disk, and whether acknowledgements wait for it:
    /// `always` fsyncs before every ack (concurrent writes share an fsync);
    /// `low` / `medium` / `high` / `ultra` are WAL profiles that also fsync before acking but
    /// gather writes for 2 / 10 / 50 / 100 ms per fsync (fewer fsyncs, more latency);
    /// `interval` acks at once and fsyncs every --fsync-interval-ms in the background;
    /// `never` acks at once and leaves flushing to the OS (Kafka's default behaviour).
    #[arg(long, env = "SPATE_FSYNC", default_value = "interval")]
    pub fsync: String,

    /// Background fsync period for `--fsync interval`, in milliseconds.
    #[arg(long, env = "SPATE_FSYNC_INTERVAL_MS", default_value_t = 1000)]
    pub fsync_interval_ms: u64,

    /// Partitions for auto-created topics and for CreateTopics requests that leave it to the broker.
    #[arg(long, env = "SPATE_DEFAULT_PARTITIONS", default_value_t = 1)]
    pub default_partitions: i32,

    /// Create unknown topics when a client asks for their metadata (as Kafka's
    /// auto.create.topics.enable).
    #[arg(long, env = "SPATE_AUTO_CREATE_TOPICS", default_value_t = true, action = clap::ArgAction::Set)]
    pub auto_create_topics: bool,

    /// Largest request accepted, in bytes; larger requests close the connection.
    #[arg(long, env = "SPATE_MAX_REQUEST_BYTES", default_value_t = 100 * 1024 * 1024)]
    pub max_request_bytes: usize,

    /// Most record bytes one fetch response carries, whatever the client asks (Kafka's
    /// broker-side fetch.max.bytes). The first partition may exceed it by one whole batch
    /// (KIP-74). A fetch also never takes more than half of the memory limit.
    #[arg(long, env = "SPATE_FETCH_MAX_BYTES", default_value_t = spate_broker::DEFAULT_FETCH_MAX_BYTES as u64)]
    pub fetch_max_bytes: u64,

    /// How long a share group member holds the records it acquired before they are offered
    /// to others (Kafka's group.share.record.lock.duration.ms; a group's own
    /// share.record.lock.duration.ms overrides it).
    #[arg(
        long,
        env = "SPATE_GROUP_SHARE_RECORD_LOCK_DURATION_MS",
        default_value_t = 30_000
    )]
    pub group_share_record_lock_duration_ms: u64,

    /// A share group record delivered this many times is archived instead of being offered
    /// again (Kafka's group.share.delivery.count.limit, 2 to 10).
    #[arg(
        long,
        env = "SPATE_GROUP_SHARE_DELIVERY_COUNT_LIMIT",
        default_value_t = 5
    )]
    pub group_share_delivery_count_limit: u16,

    /// Most records in flight (acquired or waiting for redelivery) per share-partition
    /// (Kafka's group.share.partition.max.record.locks, 100 to 10,000).
    #[arg(
        long,
        env = "SPATE_GROUP_SHARE_PARTITION_MAX_RECORD_LOCKS",
        default_value_t = 2_000
    )]
    pub group_share_partition_max_record_locks: u32,

    /// A share group member without a heartbeat for this long leaves its group and its
    /// records are released (Kafka's group.share.session.timeout.ms).
    #[arg(
        long,
        env = "SPATE_GROUP_SHARE_SESSION_TIMEOUT_MS",
        default_value_t = 45_000
    )]
    pub group_share_session_timeout_ms: u64,

    /// How often share group members are told to heartbeat (Kafka's
    /// group.share.heartbeat.interval.ms); below the session timeout.
    #[arg(
        long,
        env = "SPATE_GROUP_SHARE_HEARTBEAT_INTERVAL_MS",
        default_value_t = 5_000
    )]
    pub group_share_heartbeat_interval_ms: u64,

    /// Most members of one share group (Kafka's group.share.max.size, 1 to 1,000).
    #[arg(long, env = "SPATE_GROUP_SHARE_MAX_SIZE", default_value_t = 200)]
    pub group_share_max_size: u32,

    /// Idempotent producers that wrote nothing for this long are forgotten, at the next
    /// retention pass (Kafka's producer.id.expiration.ms). A forgotten producer that writes
    /// again gets UNKNOWN_PRODUCER_ID and resets its sequence.
    #[arg(
        long,
        env = "SPATE_PRODUCER_ID_EXPIRATION_MS",
        default_value_t = 86_400_000
    )]
    pub producer_id_expiration_ms: u64,

    /// Most idempotent producer ids remembered per partition; past it the least recently
    /// used one is forgotten.
    #[arg(
        long,
        env = "SPATE_MAX_PRODUCER_IDS_PER_PARTITION",
        default_value_t = 10_000
    )]
    pub max_producer_ids_per_partition: usize,

    /// Produce (Kafka, HTTP ingest, replica copies on a follower) is refused with
    /// KAFKA_STORAGE_ERROR (HTTP 507) while the data dir's file system has fewer free bytes
    /// than this, before anything is written; it resumes by itself above it. Offset commits
    /// keep working on the space below. 0: no byte limit.
    #[arg(long, env = "SPATE_DISK_MIN_FREE_BYTES", default_value_t = 1 << 30)]
    pub disk_min_free_bytes: u64,

    /// The same refusal while less than this percentage of the data dir's file system is
    /// free (the smaller of the two limits set applies). 0: no percentage limit.
    #[arg(long, env = "SPATE_DISK_MIN_FREE_PERCENT", default_value_t = 5)]
    pub disk_min_free_percent: u8,

    /// Indexing memory of each open search index writer, in bytes (at least 15000000,
    /// tantivy's minimum); with --search-max-open-writers it bounds indexing memory.
    #[arg(
        long,
        env = "SPATE_SEARCH_INDEXER_MEMORY_BYTES",
        default_value_t = 32 << 20
    )]
    pub search_indexer_memory_bytes: usize,

    /// Threads that index every searchable topic (0: one per core, at most 8).
    #[arg(long, env = "SPATE_SEARCH_INDEXER_THREADS", default_value_t = 0)]
    pub search_indexer_threads: usize,

    /// Search index writers open at once over every searchable topic (1-256); a topic's
    /// index (one per topic per node, for all its partitions here) holds one only while it
    /// has records to index. Each is three threads and up to --search-indexer-memory-bytes
    /// of memory.
    #[arg(long, env = "SPATE_SEARCH_MAX_OPEN_WRITERS", default_value_t = 16)]
    pub search_max_open_writers: usize,

    /// Longest time indexed records wait for a search index commit, in milliseconds (how
    /// soon a produced record becomes searchable).
    #[arg(long, env = "SPATE_SEARCH_COMMIT_INTERVAL_MS", default_value_t = 200)]
    pub search_commit_interval_ms: u64,

    /// Run search indexing threads under SCHED_IDLE (Linux): they get only CPU time that
    /// producers and consumers leave idle, so under overload the index lags and producers do
    /// not slow down (also as a user without CAP_SYS_NICE: they never hold a lock producers
    /// wait on). `false` nices them by --search-indexer-nice instead.
    #[arg(long, env = "SPATE_SEARCH_INDEXER_IDLE", default_value_t = true, action = clap::ArgAction::Set)]
    pub search_indexer_idle: bool,

    /// Scheduling niceness of search indexing threads when not under SCHED_IDLE (0-19; 0 =
    /// same as the broker).
    #[arg(long, env = "SPATE_SEARCH_INDEXER_NICE", default_value_t = 10)]
    pub search_indexer_nice: i32,

    /// Longest a search may run before it is answered with an error, in milliseconds.
    #[arg(long, env = "SPATE_SEARCH_TIMEOUT_MS", default_value_t = 10_000)]
    pub search_timeout_ms: u64,

    /// How often retention deletes expired segments, in milliseconds.
    #[arg(
        long,
        env = "SPATE_RETENTION_CHECK_INTERVAL_MS",
        default_value_t = 30_000
    )]
    pub retention_check_interval_ms: u64,

    /// How long the first rebalance of an empty consumer group waits for more members
    /// (Kafka's group.initial.rebalance.delay.ms).
    #[arg(
        long,
        env = "SPATE_GROUP_INITIAL_REBALANCE_DELAY_MS",
        default_value_t = 3000
    )]
    pub group_initial_rebalance_delay_ms: u64,

    /// Shortest session timeout a consumer may ask for (group.min.session.timeout.ms).
    #[arg(
        long,
        env = "SPATE_GROUP_MIN_SESSION_TIMEOUT_MS",
        default_value_t = 6000
    )]
    pub group_min_session_timeout_ms: u32,

    /// Longest session timeout a consumer may ask for (group.max.session.timeout.ms).
    #[arg(
        long,
        env = "SPATE_GROUP_MAX_SESSION_TIMEOUT_MS",
        default_value_t = 1_800_000
    )]
    pub group_max_session_timeout_ms: u32,

    /// A KIP-848 consumer group member without a heartbeat for this long is removed
    /// (group.consumer.session.timeout.ms).
    #[arg(
        long,
        env = "SPATE_GROUP_CONSUMER_SESSION_TIMEOUT_MS",
        default_value_t = 45_000
    )]
    pub group_consumer_session_timeout_ms: u32,

    /// How often KIP-848 consumer group members heartbeat
    /// (group.consumer.heartbeat.interval.ms).
    #[arg(
        long,
        env = "SPATE_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS",
        default_value_t = 5_000
    )]
    pub group_consumer_heartbeat_interval_ms: u32,

    /// Most members of one KIP-848 consumer group (group.consumer.max.size).
    #[arg(long, env = "SPATE_GROUP_CONSUMER_MAX_SIZE", default_value_t = 1_000)]
    pub group_consumer_max_size: u32,

    /// Committed offsets of a group without members are deleted after this many minutes
    /// (offsets.retention.minutes).
    #[arg(long, env = "SPATE_OFFSETS_RETENTION_MINUTES", default_value_t = 10080)]
    pub offsets_retention_minutes: u64,

    /// Partitions `__consumer_offsets` is created with (offsets.topic.num.partitions); groups
    /// are spread over them by id. An existing topic keeps its count.
    #[arg(long, env = "SPATE_OFFSETS_TOPIC_NUM_PARTITIONS", default_value_t = 50)]
    pub offsets_topic_num_partitions: u32,

    /// Segment size `__consumer_offsets` is created with (offsets.topic.segment.bytes): the
    /// log cleaner compacts closed segments, so smaller ones are cleaned sooner.
    #[arg(
        long,
        env = "SPATE_OFFSETS_TOPIC_SEGMENT_BYTES",
        default_value_t = 16_777_216
    )]
    pub offsets_topic_segment_bytes: u64,

    /// Segment size `__transaction_state` is created with
    /// (transaction.state.log.segment.bytes).
    #[arg(
        long,
        env = "SPATE_TRANSACTION_STATE_SEGMENT_BYTES",
        default_value_t = 104_857_600
    )]
    pub transaction_state_segment_bytes: u64,

    /// The cleanup policy of topics that do not set cleanup.policy (log.cleanup.policy):
    /// delete, compact or compact,delete.
    #[arg(long, env = "SPATE_LOG_CLEANUP_POLICY", default_value = "delete")]
    pub log_cleanup_policy: String,

    /// How often the log cleaner looks for compacted partitions due a clean
    /// (log.cleaner.backoff.ms).
    #[arg(long, env = "SPATE_LOG_CLEANER_BACKOFF_MS", default_value_t = 15_000)]
    pub log_cleaner_backoff_ms: u64,

    /// Bytes of the cleaner's key map (log.cleaner.dedupe.buffer.size): a dirty section with
    /// more keys than it holds is cleaned over several passes.
    #[arg(
        long,
        env = "SPATE_LOG_CLEANER_DEDUPE_BUFFER_SIZE",
        default_value_t = 134_217_728
    )]
    pub log_cleaner_dedupe_buffer_size: u64,

    /// The log cleaner's read plus write rate limit in bytes per second
    /// (log.cleaner.io.max.bytes.per.second); 0 for no limit.
    #[arg(
        long,
        env = "SPATE_LOG_CLEANER_IO_MAX_BYTES_PER_SECOND",
        default_value_t = 0
    )]
    pub log_cleaner_io_max_bytes_per_second: u64,

    /// Partitions `__transaction_state` is created with (transaction.state.log.num.partitions);
    /// transactional ids are spread over them. An existing topic keeps its count.
    #[arg(long, env = "SPATE_TRANSACTION_STATE_PARTITIONS", default_value_t = 50)]
    pub transaction_state_partitions: u32,

    /// Longest transaction.timeout.ms a producer may ask for (transaction.max.timeout.ms);
    /// InitProducerId with a longer one is INVALID_TRANSACTION_TIMEOUT.
    #[arg(
        long,
        env = "SPATE_TRANSACTION_MAX_TIMEOUT_MS",
        default_value_t = 900_000
    )]
    pub transaction_max_timeout_ms: u32,

    /// Producer trade-off: low-latency, balanced, high-throughput or extreme. Sets the memory
    /// for requests in flight (16 / 64 / 256 / 512 MiB), the fsync window of `--fsync always`
    /// (0 / 0 / 2 / 10 ms) and the per-connection response buffer (16 KiB / 64 KiB / 256 KiB /
    /// 1 MiB).
    #[arg(long, env = "SPATE_PRODUCE_PROFILE", default_value = "balanced")]
    pub produce_profile: String,

    /// Memory for requests and responses in flight, overriding the profile's. At the limit
    /// the broker stops reading from connections (producers are throttled, nothing fails).
    #[arg(long, env = "SPATE_MEMORY_LIMIT_BYTES")]
    pub memory_limit_bytes: Option<u64>,

    /// Most connections open at once; more are closed with a log line.
    #[arg(long, env = "SPATE_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,

    /// Most connections open at once from one IP address.
    #[arg(long, env = "SPATE_MAX_CONNECTIONS_PER_IP", default_value_t = 10_000)]
    pub max_connections_per_ip: usize,

    /// Client telemetry (KIP-714): comma-separated metric name prefixes clients are asked to
    /// push, exported on /metrics as `spate_client_*`; empty asks for nothing, `*` for all.
    #[arg(
        long,
        env = "SPATE_CLIENT_TELEMETRY_METRICS",
        default_value = "org.apache.kafka.producer.,org.apache.kafka.consumer."
    )]
    pub client_telemetry_metrics: String,

    /// How often clients push their telemetry, in milliseconds (Kafka's default: 5 minutes).
    #[arg(
        long,
        env = "SPATE_CLIENT_TELEMETRY_PUSH_INTERVAL_MS",
        default_value_t = 300_000
    )]
    pub client_telemetry_push_interval_ms: u32,

    /// Log line format: text or json (one JSON object per line).
    #[arg(long, env = "SPATE_LOG_FORMAT", default_value = "text")]
    pub log_format: String,

    /// This node's id in a cluster; with --cluster-peers it starts in cluster mode (every
    /// node is a broker and a voter of the metadata quorum). Standalone when unset.
    #[arg(long, env = "SPATE_NODE_ID")]
    pub node_id: Option<u64>,

    /// Every voter of the cluster with its inter-node address:
    /// `1=host:port,2=host:port,3=host:port`. The same list on every node.
    #[arg(long, env = "SPATE_CLUSTER_PEERS")]
    pub cluster_peers: Option<String>,

    /// Address to accept inter-node (metadata quorum) traffic on. Defaults to this node's
    /// address in --cluster-peers.
    #[arg(long, env = "SPATE_CLUSTER_LISTEN")]
    pub cluster_listen: Option<String>,

    /// A follower that has not caught up with its leader for this long leaves the ISR
    /// (Kafka's replica.lag.time.max.ms).
    #[arg(long, env = "SPATE_REPLICA_LAG_TIME_MAX_MS", default_value_t = 30_000)]
    pub replica_lag_time_max_ms: u64,

    /// A broker that sends no heartbeat to the controller for this long is fenced and its
    /// partitions get new leaders (Kafka's broker.session.timeout.ms).
    #[arg(long, env = "SPATE_BROKER_SESSION_TIMEOUT_MS", default_value_t = 9_000)]
    pub broker_session_timeout_ms: u64,

    /// How often a broker heartbeats to the controller (Kafka's broker.heartbeat.interval.ms).
    #[arg(
        long,
        env = "SPATE_BROKER_HEARTBEAT_INTERVAL_MS",
        default_value_t = 1_000
    )]
    pub broker_heartbeat_interval_ms: u64,

    /// Replication factor of auto-created topics and of CreateTopics without one, capped at
    /// the live brokers.
    #[arg(long, env = "SPATE_DEFAULT_REPLICATION_FACTOR", default_value_t = 3)]
    pub default_replication_factor: i16,

    /// A second HTTP listener serving only ingest (`/topics/{topic}`, `/produce/...`) and
    /// `/health`; ingest is on --http-listen as well.
    #[arg(long, env = "SPATE_INGEST_LISTEN")]
    pub ingest_listen: Option<String>,

    /// HOST:PORT of the built-in Schema Registry: Confluent's Schema Registry REST API at the
    /// root of this listener, schemas kept in the compacted topic `_schemas`. Unset: no
    /// registry.
    #[arg(long, env = "SPATE_SCHEMA_REGISTRY_LISTEN")]
    pub schema_registry_listen: Option<String>,

    /// Largest HTTP ingest request body, in bytes; larger ones are answered 413.
    #[arg(long, env = "SPATE_INGEST_MAX_BODY_BYTES", default_value_t = 32 << 20)]
    pub ingest_max_body_bytes: usize,

    /// Most records in one HTTP ingest request; more are answered 422.
    #[arg(long, env = "SPATE_INGEST_MAX_RECORDS", default_value_t = 10_000)]
    pub ingest_max_records: usize,

    /// Longest an HTTP ingest client may take to send its body, in milliseconds (408 after).
    #[arg(long, env = "SPATE_INGEST_BODY_TIMEOUT_MS", default_value_t = 30_000)]
    pub ingest_body_timeout_ms: u64,

    /// Compression of the batches HTTP ingest writes: none, gzip, snappy, lz4 or zstd.
    #[arg(long, env = "SPATE_INGEST_COMPRESSION", default_value = "none")]
    pub ingest_compression: String,

    /// Records the fire-and-forget queue holds; a request that does not fit is answered 429.
    #[arg(long, env = "SPATE_INGEST_QUEUE_RECORDS", default_value_t = 100_000)]
    pub ingest_queue_records: usize,

    /// Encoded bytes the fire-and-forget queue holds.
    #[arg(long, env = "SPATE_INGEST_QUEUE_BYTES", default_value_t = 64 << 20)]
    pub ingest_queue_bytes: usize,

    /// Acks fire-and-forget deliveries wait for: all or 1.
    #[arg(long, env = "SPATE_INGEST_FIRE_ACKS", default_value = "all")]
    pub ingest_fire_acks: String,

    /// Log filter (error, warn, info, debug, trace, or a tracing directive). RUST_LOG wins.
    #[arg(long, env = "SPATE_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

impl Args {
    /// Reads flags and environment, then fills what they leave unset from the --config file.
    pub fn load() -> anyhow::Result<Self> {
        let cli: Vec<std::ffi::OsString> = std::env::args_os().collect();
        let first = Self::try_parse_from(&cli).unwrap_or_else(|e| e.exit());
        let Some(path) = first.config.clone() else {
            return Ok(first);
        };
        let file_args = file_arguments(&path)?;
        let mut all = vec![cli.first().cloned().unwrap_or_else(|| "spate".into())];
        all.extend(file_args.iter().map(Into::into));
        all.extend(cli.into_iter().skip(1));
        let m: ArgMatches = Self::command()
            .args_override_self(true)
            .try_get_matches_from(all)
            .unwrap_or_else(|e| e.exit());
        Ok(Self::from_arg_matches(&m)?)
    }

    /// HTTP ingest's limits from the `--ingest-*` flags.
    pub fn ingest_config(&self) -> anyhow::Result<spate_http::ingest::IngestConfig> {
        let compression = self
            .ingest_compression
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--ingest-compression: {e}"))?;
        let fire_acks = match self.ingest_fire_acks.as_str() {
            "all" | "-1" => -1,
            "1" => 1,
            other => bail!("--ingest-fire-acks: {other:?} is not all or 1"),
        };
        if self.ingest_max_records == 0 || self.ingest_max_body_bytes == 0 {
            bail!("--ingest-max-records and --ingest-max-body-bytes must be at least 1");
        }
        if self.ingest_queue_records == 0 || self.ingest_queue_bytes == 0 {
            bail!("--ingest-queue-records and --ingest-queue-bytes must be at least 1");
        }
        Ok(spate_http::ingest::IngestConfig {
            max_body_bytes: self.ingest_max_body_bytes,
            max_records: self.ingest_max_records,
            body_timeout: Duration::from_millis(self.ingest_body_timeout_ms.max(1)),
            compression,
            fire_queue_records: self.ingest_queue_records,
            fire_queue_bytes: self.ingest_queue_bytes,
            fire_acks,
            ..Default::default()
        })
    }

    /// The settings as JSON, for logs and the admin API (secrets left out).
    pub fn effective_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// Turns a TOML config file into `--key value` arguments, checking every key and value so an
/// error names the file and the key. Keys whose environment variable is set are skipped: the
/// environment wins over the file.
fn file_arguments(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let where_ = path.display();
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {where_}"))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("{where_} is not valid TOML"))?;
    let cmd = Args::command();
    let mut out = Vec::new();
    for (key, value) in &table {
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()) && key != "config")
            .with_context(|| format!("{where_}: unknown key `{key}` (keys are flag names without dashes; see spate --help)"))?;
        let v = match value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Float(f) => f.to_string(),
            _ => bail!("{where_}: `{key}` must be a string, number or boolean"),
        };
        if arg.get_env().is_some_and(|e| std::env::var_os(e).is_some()) {
            continue;
        }
        out.push(format!("--{key}"));
        out.push(v);
    }
    // Check the file's values on their own so the message can name the file.
    let mut alone = vec!["spate".to_string()];
    alone.extend(out.iter().cloned());
    if let Err(e) = Args::command().try_get_matches_from(&alone) {
        let msg = e.to_string();
        let first = msg
            .lines()
            .next()
            .unwrap_or("invalid value")
            .trim_start_matches("error: ");
        bail!("{where_}: {first}");
    }
    Ok(out)
}

/// Parses an fsync policy name.
pub fn parse_fsync(name: &str, interval_ms: u64) -> anyhow::Result<FsyncPolicy> {
    let window = |ms| FsyncPolicy::GroupCommit {
        window: Duration::from_millis(ms),
    };
    Ok(match name {
        "always" => FsyncPolicy::Always,
        "low" => window(2),
        "medium" => window(10),
        "high" => window(50),
        "ultra" => window(100),
        "interval" => {
            if interval_ms == 0 {
                bail!("--fsync-interval-ms must be at least 1");
            }
            FsyncPolicy::Interval {
                every: Duration::from_millis(interval_ms),
            }
        }
        "never" => FsyncPolicy::Never,
        other => bail!(
            "unknown --fsync '{other}': use always, interval, never, or a WAL profile (low, medium, high, ultra)"
        ),
    })
}

/// A flag that takes `true` or `false` (as Kafka's boolean settings are written).
fn parse_bool(flag: &str, value: &str) -> anyhow::Result<bool> {
    match value.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        other => bail!("{flag} is true or false, not '{other}'"),
    }
}

/// `SPATE_BOOTSTRAP_USERS`: `user:password,...` (a password may hold colons, not commas).
fn parse_bootstrap_users(text: &str) -> anyhow::Result<Vec<(String, String)>> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|pair| {
            let (user, password) = pair
                .split_once(':')
                .filter(|(u, p)| !u.is_empty() && !p.is_empty())
                // Never echo the pair: it holds a password.
                .context(
                    "SPATE_BOOTSTRAP_USERS: every entry is user:password with both non-empty",
                )?;
            Ok((user.to_string(), password.to_string()))
        })
        .collect()
}

fn split_host_port(s: &str) -> anyhow::Result<(String, i32)> {
    let (host, port) = s
        .rsplit_once(':')
        .with_context(|| format!("'{s}' is not HOST:PORT"))?;
    let port: u16 = port
        .parse()
        .with_context(|| format!("'{port}' is not a port number"))?;
    if host.is_empty() || port == 0 {
        bail!("'{s}' needs a host and a non-zero port");
    }
    Ok((
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port as i32,
    ))
}

/// What cluster mode needs beyond the broker configuration.
pub struct ClusterArgs {
    /// The metadata quorum node's configuration.
    pub node: spate_cluster::node::NodeConfig,
    /// Replication settings.
    pub settings: spate_broker::cluster::ClusterSettings,
}

impl Args {
    /// Cluster mode's settings, or `None` to run standalone.
    pub fn cluster_args(&self) -> anyhow::Result<Option<ClusterArgs>> {
        let (id, peers) = match (self.node_id, &self.cluster_peers) {
            (None, None) => {
                if self.cluster_listen.is_some() {
                    bail!("--cluster-listen needs --node-id and --cluster-peers");
                }
                return Ok(None);
            }
            (Some(id), Some(peers)) => (id, peers),
            (Some(_), None) => {
                bail!("--node-id needs --cluster-peers (the id=host:port of every node)")
            }
            (None, Some(_)) => {
                bail!("--cluster-peers needs --node-id (this node's id in the list)")
            }
        };
        let peers = spate_cluster::node::parse_peers(peers).context("--cluster-peers")?;
        // A node not among the voters joins as an observer: it needs its own address.
        let observer = !peers.contains_key(&id);
        let listen_text = match (peers.get(&id), &self.cluster_listen) {
            (_, Some(listen)) => listen.clone(),
            (Some(own), None) => own.clone(),
            (None, None) => bail!(
                "--node-id {id} is not in --cluster-peers (ids there: {:?}): list it there to run a voter, or give --cluster-listen to join as an observer (a broker that does not vote)",
                peers.keys().collect::<Vec<_>>()
            ),
        };
        let listen = std::net::ToSocketAddrs::to_socket_addrs(&listen_text)
            .with_context(|| format!("--cluster-listen '{listen_text}' is not HOST:PORT"))?
            .next()
            .with_context(|| format!("--cluster-listen '{listen_text}' resolves to nothing"))?;
        if self.replica_lag_time_max_ms == 0 {
            bail!("--replica-lag-time-max-ms must be at least 1");
        }
        if self.broker_heartbeat_interval_ms == 0
            || self.broker_session_timeout_ms <= self.broker_heartbeat_interval_ms
        {
            bail!("--broker-session-timeout-ms must be larger than --broker-heartbeat-interval-ms (and both at least 1)");
        }
        if self.default_replication_factor < 1 {
            bail!("--default-replication-factor must be at least 1");
        }
        let mut node = if observer {
            if listen.ip().is_unspecified() {
                bail!("--cluster-listen {listen_text}: an observer's address is what the voters connect to; give a specific host, not {}", listen.ip());
            }
            spate_cluster::node::NodeConfig::observer(
                id,
                peers,
                listen,
                listen_text.clone(),
                self.data_dir.clone(),
            )
        } else {
            spate_cluster::node::NodeConfig::new(id, peers, listen, self.data_dir.clone())
        }
        .context("cluster configuration")?;
        node.session_timeout = Duration::from_millis(self.broker_session_timeout_ms);
        let settings = spate_broker::cluster::ClusterSettings {
            replica_lag_time_max_ms: self.replica_lag_time_max_ms,
            default_replication_factor: self.default_replication_factor,
            heartbeat_interval: Duration::from_millis(self.broker_heartbeat_interval_ms),
            ..Default::default()
        };
        Ok(Some(ClusterArgs { node, settings }))
    }

    /// The HTTP address other nodes use, for an HTTP listener bound to `bound`.
    pub fn advertised_http(&self, bound: SocketAddr, advertised_host: &str) -> String {
        match &self.advertised_http_address {
            Some(a) => a.clone(),
            None if bound.ip().is_unspecified() => format!("{advertised_host}:{}", bound.port()),
            None => bound.to_string(),
        }
    }

    /// The broker configuration for a listener bound to `bound`.
    /// The listeners to bind: `--listeners`, or one PLAINTEXT listener at `--listen`.
    pub fn listener_specs(&self) -> anyhow::Result<Vec<Listener>> {
        let listeners = match &self.listeners {
            Some(text) => parse_listeners(text).map_err(|e| anyhow::anyhow!("--listeners: {e}"))?,
            None => parse_listeners(&format!("PLAINTEXT://{}", self.listen))
                .map_err(|e| anyhow::anyhow!("--listen '{}': {e}", self.listen))?,
        };
        if listeners.iter().any(|l| l.protocol.uses_tls())
            && (self.ssl_cert.is_none() || self.ssl_key.is_none())
        {
            bail!("SSL and SASL_SSL listeners need --ssl-cert and --ssl-key");
        }
        Ok(listeners)
    }

    /// What clients of each listener are told, given the addresses bound: `--advertised-listeners`
    /// (every listener must appear there), else the bound address (`--advertised-address`
    /// for the first listener).
    pub fn advertised_listeners(&self, bound: &[Listener]) -> anyhow::Result<Vec<Listener>> {
        if let Some(text) = &self.advertised_listeners {
            let given = parse_listeners(text)
                .map_err(|e| anyhow::anyhow!("--advertised-listeners: {e}"))?;
            return bound
                .iter()
                .map(|b| {
                    given
                        .iter()
                        .find(|g| g.protocol == b.protocol)
                        .cloned()
                        .with_context(|| {
                            format!("--advertised-listeners has no {} listener", b.protocol)
                        })
                })
                .collect();
        }
        bound
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if i == 0 {
                    if let Some(a) = &self.advertised_address {
                        let (host, port) = split_host_port(a).context("--advertised-address")?;
                        return Ok(Listener {
                            protocol: b.protocol,
                            host,
                            port: u16::try_from(port).context("--advertised-address port")?,
                        });
                    }
                }
                let unspecified = b.host.is_empty()
                    || b.host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_unspecified());
                if unspecified {
                    bail!("listener {b} listens on every interface: give --advertised-listeners (or --advertised-address) with the address clients should use");
                }
                Ok(b.clone())
            })
            .collect()
    }

    /// `--cluster-tls`, checked against what it needs.
    pub fn cluster_tls(&self) -> anyhow::Result<bool> {
        let on = parse_bool("--cluster-tls", &self.cluster_tls)?;
        if on && (self.ssl_cert.is_none() || self.ssl_key.is_none() || self.ssl_ca.is_none()) {
            bail!("--cluster-tls true needs --ssl-cert, --ssl-key (this node's certificate) and --ssl-ca (the CA that signs every node's)");
        }
        if on && self.cluster_peers.is_none() {
            bail!("--cluster-tls true is for cluster mode (--node-id and --cluster-peers)");
        }
        Ok(on)
    }

    /// The `--group-share-*` flags against Kafka's bounds for the same configs.
    fn check_share_groups(&self) -> anyhow::Result<()> {
        let within = |flag: &str, v: u64, lo: u64, hi: u64| -> anyhow::Result<()> {
            if !(lo..=hi).contains(&v) {
                bail!("{flag} must be between {lo} and {hi}, got {v}");
            }
            Ok(())
        };
        within(
            "--group-share-record-lock-duration-ms",
            self.group_share_record_lock_duration_ms,
            1_000,
            3_600_000,
        )?;
        within(
            "--group-share-delivery-count-limit",
            self.group_share_delivery_count_limit.into(),
            2,
            10,
        )?;
        within(
            "--group-share-partition-max-record-locks",
            self.group_share_partition_max_record_locks.into(),
            100,
            10_000,
        )?;
        within(
            "--group-share-session-timeout-ms",
            self.group_share_session_timeout_ms,
            1,
            i32::MAX as u64,
        )?;
        within(
            "--group-share-max-size",
            self.group_share_max_size.into(),
            1,
            1_000,
        )?;
        if self.group_share_heartbeat_interval_ms == 0
            || self.group_share_heartbeat_interval_ms >= self.group_share_session_timeout_ms
        {
            bail!(
                "--group-share-heartbeat-interval-ms must be at least 1 and below \
                 --group-share-session-timeout-ms ({}), got {}",
                self.group_share_session_timeout_ms,
                self.group_share_heartbeat_interval_ms
            );
        }
        Ok(())
    }

    /// Share group settings from the `--group-share-*` flags, with the environment's
    /// defaults for groups that set no config of their own (see `ShareSettings::from_env`).
    fn share_settings(&self) -> spate_broker::ShareSettings {
        let mut s = spate_broker::ShareSettings::from_env();
        s.lock_duration_ms = self.group_share_record_lock_duration_ms as i64;
        s.partition.delivery_count_limit = self.group_share_delivery_count_limit as i16;
        s.partition.max_in_flight = self.group_share_partition_max_record_locks;
        s.group.session_timeout_ms = self.group_share_session_timeout_ms as i64;
        s.group.heartbeat_interval_ms = self.group_share_heartbeat_interval_ms as i32;
        s.group.max_size = self.group_share_max_size as usize;
        s
    }

    /// `--http-tls`, checked against what it needs.
    pub fn http_tls(&self) -> anyhow::Result<bool> {
        let on = parse_bool("--http-tls", &self.http_tls)?;
        if on && (self.ssl_cert.is_none() || self.ssl_key.is_none()) {
            bail!("--http-tls true needs --ssl-cert and --ssl-key");
        }
        Ok(on)
    }

    /// How HTTP clients authenticate.
    pub fn http_auth(&self) -> anyhow::Result<spate_http::HttpAuth> {
        let basic = match self.http_auth.trim() {
            "basic" => true,
            "none" | "" => false,
            other => bail!("--http-auth is basic or none, not '{other}'"),
        };
        let metrics = parse_bool("--http-metrics-auth", &self.http_metrics_auth)?;
        Ok(spate_http::HttpAuth { basic, metrics })
    }

    /// SASL settings, with the bootstrap users of `SPATE_BOOTSTRAP_USERS` (an environment
    /// variable, so passwords stay off command lines and out of config files).
    pub fn security_settings(&self) -> anyhow::Result<SecuritySettings> {
        let mut mechanisms = Vec::new();
        for name in self
            .sasl_mechanisms
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let m = spate_auth::Mechanism::parse(name).with_context(|| {
                format!(
                    "--sasl-mechanisms: '{name}' is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"
                )
            })?;
            if !mechanisms.contains(&m) {
                mechanisms.push(m);
            }
        }
        if mechanisms.is_empty() {
            bail!("--sasl-mechanisms lists no mechanism");
        }
        let bootstrap_users = match std::env::var("SPATE_BOOTSTRAP_USERS") {
            Ok(text) => parse_bootstrap_users(&text)?,
            Err(_) => Vec::new(),
        };
        let authorizer = match self.authorizer.trim() {
            "acl" => true,
            "none" | "" => false,
            other => bail!("--authorizer is acl or none, not '{other}'"),
        };
        let allow_if_none = parse_bool(
            "--allow-everyone-if-no-acl-found",
            &self.allow_everyone_if_no_acl_found,
        )?;
        let mut super_users = Vec::new();
        for p in self
            .super_users
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            match p.split_once(':') {
                Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {
                    super_users.push(p.to_string())
                }
                _ => bail!("--super-users: '{p}' is not Type:name (e.g. User:admin)"),
            }
        }
        Ok(SecuritySettings {
            authorizer,
            acl: spate_auth::acl::AuthorizerConfig {
                super_users,
                allow_everyone_if_no_acl_found: allow_if_none,
            },
            mechanisms,
            reauth_ms: i64::try_from(self.connections_max_reauth_ms)
                .context("--connections-max-reauth-ms")?,
            bootstrap_users,
        })
    }

    pub fn broker_config(&self, bound: SocketAddr) -> anyhow::Result<BrokerConfig> {
        let (host, port) = match &self.advertised_address {
            Some(a) => split_host_port(a).context("--advertised-address")?,
            None if bound.ip().is_unspecified() => {
                bail!("listening on {bound}: set --advertised-address to the address clients should use")
            }
            None => (bound.ip().to_string(), bound.port() as i32),
        };
        if self.default_partitions < 1 {
            bail!(
                "--default-partitions must be at least 1, got {}",
                self.default_partitions
            );
        }
        if self.max_request_bytes < 1024 {
            bail!("--max-request-bytes must be at least 1024");
        }
        if !(1024..=i32::MAX as u64).contains(&self.fetch_max_bytes) {
            bail!(
                "--fetch-max-bytes must be between 1024 and {} (a Kafka INT32), got {}",
                i32::MAX,
                self.fetch_max_bytes
            );
        }
        if !(1..=i32::MAX as u64).contains(&self.producer_id_expiration_ms) {
            bail!(
                "--producer-id-expiration-ms must be between 1 and {} (a Kafka INT), got {}",
                i32::MAX,
                self.producer_id_expiration_ms
            );
        }
        self.check_share_groups()?;
        if self.max_producer_ids_per_partition == 0 {
            bail!("--max-producer-ids-per-partition must be at least 1");
        }
        if self.disk_min_free_percent > 100 {
            bail!(
                "--disk-min-free-percent must be between 0 and 100, got {}",
                self.disk_min_free_percent
            );
        }
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms {
            bail!("--group-min-session-timeout-ms is larger than --group-max-session-timeout-ms");
        }
        if self.group_consumer_heartbeat_interval_ms == 0
            || self.group_consumer_heartbeat_interval_ms >= self.group_consumer_session_timeout_ms
            || self.group_consumer_session_timeout_ms > i32::MAX as u32
        {
            bail!("--group-consumer-heartbeat-interval-ms must be at least 1 and below --group-consumer-session-timeout-ms");
        }
        if self.group_consumer_max_size == 0 {
            bail!("--group-consumer-max-size must be at least 1");
        }
        if !(1..=1000).contains(&self.transaction_state_partitions) {
            bail!("--transaction-state-partitions must be between 1 and 1000");
        }
        if self.transaction_max_timeout_ms == 0 {
            bail!("--transaction-max-timeout-ms must be at least 1");
        }
        if !(1..=1000).contains(&self.offsets_topic_num_partitions) {
            bail!("--offsets-topic-num-partitions must be between 1 and 1000");
        }
        for (flag, bytes) in [
            (
                "--offsets-topic-segment-bytes",
                self.offsets_topic_segment_bytes,
            ),
            (
                "--transaction-state-segment-bytes",
                self.transaction_state_segment_bytes,
            ),
        ] {
            if !(1024..=1 << 30).contains(&bytes) {
                bail!("{flag} must be between 1024 and 1073741824");
            }
        }
        if self.offsets_retention_minutes == 0 {
            bail!("--offsets-retention-minutes must be at least 1");
        }
        let profile = ProduceProfile::parse(&self.produce_profile).with_context(|| {
            let names: Vec<&str> = ProduceProfile::ALL.iter().map(|(n, _)| *n).collect();
            format!(
                "unknown --produce-profile '{}': use one of {}",
                self.produce_profile,
                names.join(", ")
            )
        })?;
        let memory = match self.memory_limit_bytes {
            None => profile.memory_limit_bytes(),
            Some(m) if m < (1 << 20) => {
                bail!("--memory-limit-bytes must be at least 1048576 (1 MiB), got {m}")
            }
            Some(m) if m > (1 << 40) => {
                bail!("--memory-limit-bytes of {m} is beyond any machine this runs on")
            }
            Some(m) => m as usize,
        };
        if self.max_connections == 0 || self.max_connections_per_ip == 0 {
            bail!("--max-connections and --max-connections-per-ip must be at least 1");
        }
        if !matches!(self.log_format.as_str(), "text" | "json") {
            bail!(
                "unknown --log-format '{}': use text or json",
                self.log_format
            );
        }
        let mut c = BrokerConfig::new(self.data_dir.clone(), host, port);
        if let Some(id) = self.node_id {
            c.node_id =
                i32::try_from(id).context("--node-id must fit a Kafka broker id (INT32)")?;
        }
        c.memory_limit_bytes = memory;
        c.write_buffer_bytes = profile.write_buffer_bytes();
        c.max_connections = self.max_connections;
        c.max_connections_per_ip = self.max_connections_per_ip;
        c.telemetry_metrics = self
            .client_telemetry_metrics
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                if p == "*" {
                    String::new()
                } else {
                    p.to_owned()
                }
            })
            .collect();
        if self.client_telemetry_push_interval_ms < 100 {
            bail!("--client-telemetry-push-interval-ms must be at least 100");
        }
        c.telemetry_push_interval_ms = self.client_telemetry_push_interval_ms;
        c.groups.coordinator.initial_rebalance_delay_ms =
            self.group_initial_rebalance_delay_ms.min(i64::MAX as u64) as i64;
        c.groups.coordinator.min_session_timeout_ms =
            self.group_min_session_timeout_ms.min(i32::MAX as u32) as i32;
        c.groups.coordinator.max_session_timeout_ms =
            self.group_max_session_timeout_ms.min(i32::MAX as u32) as i32;
        c.groups.consumer.session_timeout_ms = self.group_consumer_session_timeout_ms as i32;
        c.groups.consumer.heartbeat_interval_ms = self.group_consumer_heartbeat_interval_ms as i32;
        c.groups.consumer.max_size = self.group_consumer_max_size as usize;
        c.groups.offsets_partitions = self.offsets_topic_num_partitions as i32;
        c.groups.offsets_segment_bytes = self.offsets_topic_segment_bytes;
        c.txns.segment_bytes = self.transaction_state_segment_bytes;
        c.security = self.security_settings()?;
        spate_broker::set_broker_defaults(
            [(
                "cleanup.policy".to_string(),
                self.log_cleanup_policy.clone(),
            )]
            .into(),
        )
        .map_err(|e| anyhow::anyhow!("--log-cleanup-policy: {e}"))?;
        c.txns.partitions = self.transaction_state_partitions as i32;
        c.cleaner_backoff = Duration::from_millis(self.log_cleaner_backoff_ms.max(1));
        c.cleaner_io_bytes_per_sec = (self.log_cleaner_io_max_bytes_per_second > 0)
            .then_some(self.log_cleaner_io_max_bytes_per_second);
        c.cleaner_buffer_bytes = usize::try_from(self.log_cleaner_dedupe_buffer_size)
            .unwrap_or(usize::MAX)
            .max(1024);
        c.txns.coordinator.max_timeout_ms =
            self.transaction_max_timeout_ms.min(i32::MAX as u32) as i32;
        c.cluster_mode = self.cluster_peers.is_some();
        c.groups.offsets_retention_ms =
            (self.offsets_retention_minutes.min(1 << 40) * 60_000) as i64;
        c.fsync = match parse_fsync(&self.fsync, self.fsync_interval_ms)? {
            FsyncPolicy::Always if !profile.group_commit_window().is_zero() => {
                FsyncPolicy::GroupCommit {
                    window: profile.group_commit_window(),
                }
            }
            other => other,
        };
        c.default_partitions = self.default_partitions;
        c.auto_create_topics = self.auto_create_topics;
        c.max_frame_bytes = self.max_request_bytes;
        c.fetch_max_bytes = self.fetch_max_bytes as usize;
        c.producer_id_expiration_ms = self.producer_id_expiration_ms as i64;
        c.max_producer_ids_per_partition = self.max_producer_ids_per_partition;
        c.share = self.share_settings();
        c.disk_watermark = spate_broker::disk::DiskWatermark {
            min_free_bytes: self.disk_min_free_bytes,
            min_free_percent: self.disk_min_free_percent,
        };
        c.retention_check_interval = Duration::from_millis(self.retention_check_interval_ms.max(1));
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operators_list_of_config_keys_matches_the_flags() {
        // spate-operator validates SpateCluster broker.config keys against this list.
        let listed: std::collections::BTreeSet<&str> =
            include_str!("../../operator/src/spate_config_keys.txt")
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
        let flags: std::collections::BTreeSet<String> = Args::command()
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_owned))
            .filter(|l| l != "config" && l != "help" && l != "version")
            .collect();
        let flags: std::collections::BTreeSet<&str> = flags.iter().map(String::as_str).collect();
        assert_eq!(
            listed, flags,
            "update crates/operator/src/spate_config_keys.txt (and the operator's CRDs)"
        );
    }

    #[test]
    fn defaults_listen_on_9092_with_data_in_dot_data() {
        let a = Args::try_parse_from(["spate"]).unwrap();
        assert_eq!(a.listen, "127.0.0.1:9092");
        assert_eq!(a.data_dir, PathBuf::from("./data"));
        let c = a.broker_config("127.0.0.1:9092".parse().unwrap()).unwrap();
        assert_eq!(
            (c.advertised_host.as_str(), c.advertised_port),
            ("127.0.0.1", 9092)
        );
        assert!(c.auto_create_topics);
    }

    #[test]
    fn group_share_flags_map_to_share_settings_within_kafkas_bounds() {
        let a = Args::try_parse_from(["spate"]).unwrap();
        let c = a.broker_config("127.0.0.1:9092".parse().unwrap()).unwrap();
        assert_eq!(c.share.lock_duration_ms, 30_000);
        assert_eq!(c.share.partition.delivery_count_limit, 5);
        assert_eq!(c.share.partition.max_in_flight, 2_000);
        assert_eq!(c.share.group.session_timeout_ms, 45_000);
        assert_eq!(c.share.group.heartbeat_interval_ms, 5_000);
        assert_eq!(c.share.group.max_size, 200);
        let set = Args::try_parse_from([
            "spate",
            "--group-share-delivery-count-limit",
            "3",
            "--group-share-record-lock-duration-ms",
            "1000",
        ])
        .unwrap();
        let c = set
            .broker_config("127.0.0.1:9092".parse().unwrap())
            .unwrap();
        assert_eq!(
            (
                c.share.partition.delivery_count_limit,
                c.share.lock_duration_ms
            ),
            (3, 1_000)
        );
        for bad in [
            ["--group-share-delivery-count-limit", "11"],
            ["--group-share-delivery-count-limit", "1"],
            ["--group-share-record-lock-duration-ms", "999"],
            ["--group-share-partition-max-record-locks", "99"],
            ["--group-share-max-size", "0"],
            ["--group-share-heartbeat-interval-ms", "45000"],
        ] {
            let a = Args::try_parse_from(["spate", bad[0], bad[1]]).unwrap();
            let e = a
                .broker_config("127.0.0.1:9092".parse().unwrap())
                .expect_err(bad[0])
                .to_string();
            assert!(e.contains(bad[0]), "{e}");
        }
    }

    #[test]
    fn wal_profiles_map_to_group_commit_windows() {
        assert_eq!(
            parse_fsync("medium", 0).unwrap(),
            FsyncPolicy::GroupCommit {
                window: Duration::from_millis(10)
            }
        );
        assert_eq!(parse_fsync("always", 0).unwrap(), FsyncPolicy::Always);
        assert!(parse_fsync("sometimes", 0).is_err());
        assert!(parse_fsync("interval", 0).is_err());
    }

    #[test]
    fn advertised_address_is_validated() {
        let a =
            Args::try_parse_from(["spate", "--advertised-address", "kafka.local:19092"]).unwrap();
        let c = a.broker_config("0.0.0.0:9092".parse().unwrap()).unwrap();
        assert_eq!(
            (c.advertised_host.as_str(), c.advertised_port),
            ("kafka.local", 19092)
        );
        let a = Args::try_parse_from(["spate", "--advertised-address", "nohost"]).unwrap();
        assert!(a.broker_config("127.0.0.1:1".parse().unwrap()).is_err());
        let a = Args::try_parse_from(["spate"]).unwrap();
        assert!(a.broker_config("0.0.0.0:9092".parse().unwrap()).is_err());
    }

    #[test]
    fn produce_profiles_set_memory_and_bad_limits_are_refused() {
        let a = Args::try_parse_from(["spate", "--produce-profile", "extreme"]).unwrap();
        let c = a.broker_config("127.0.0.1:1".parse().unwrap()).unwrap();
        assert_eq!(c.memory_limit_bytes, 512 << 20);
        let a = Args::try_parse_from(["spate", "--produce-profile", "ludicrous"]).unwrap();
        let e = a.broker_config("127.0.0.1:1".parse().unwrap()).unwrap_err();
        assert!(e.to_string().contains("low-latency"), "{e}");
        for bad in ["0", "100", "99999999999999999"] {
            let a = Args::try_parse_from(["spate", "--memory-limit-bytes", bad]).unwrap();
            assert!(
                a.broker_config("127.0.0.1:1".parse().unwrap()).is_err(),
                "{bad}"
            );
        }
        assert!(Args::try_parse_from(["spate", "--memory-limit-bytes", "-5"]).is_err());
        let a =
            Args::try_parse_from(["spate", "--fsync", "always", "--produce-profile", "extreme"])
                .unwrap();
        let c = a.broker_config("127.0.0.1:1".parse().unwrap()).unwrap();
        assert_eq!(
            c.fsync,
            FsyncPolicy::GroupCommit {
                window: Duration::from_millis(10)
            }
        );
    }

    fn write_config(text: &str) -> tempfile::NamedTempFile {
        use std::io::Write;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    #[test]
    fn config_file_values_become_arguments() {
        let f = write_config(
            "data-dir = \"/srv/spate\"\ndefault-partitions = 6\nauto-create-topics = false\n",
        );
        let args = file_arguments(f.path()).unwrap();
        assert_eq!(
            args,
            [
                "--auto-create-topics",
                "false",
                "--data-dir",
                "/srv/spate",
                "--default-partitions",
                "6"
            ]
        );
    }

    #[test]
    fn config_file_errors_name_the_file_and_key() {
        let f = write_config("data-dirr = \"x\"\n");
        let e = file_arguments(f.path()).unwrap_err().to_string();
        assert!(e.contains("unknown key `data-dirr`"), "{e}");
        let f = write_config("default-partitions = \"many\"\n");
        let e = file_arguments(f.path()).unwrap_err().to_string();
        assert!(
            e.contains("many") && e.contains("default-partitions"),
            "{e}"
        );
        let f = write_config("listen = [1, 2]\n");
        assert!(file_arguments(f.path())
            .unwrap_err()
            .to_string()
            .contains("`listen` must be"));
        let f = write_config("this is not toml");
        assert!(file_arguments(f.path())
            .unwrap_err()
            .to_string()
            .contains("not valid TOML"));
        let f = write_config("max-connections = -3\n");
        assert!(file_arguments(f.path()).is_err());
    }

    #[test]
    fn fetch_max_bytes_defaults_to_kafkas_and_refuses_what_a_fetch_cannot_carry() {
        let c = Args::try_parse_from(["spate"])
            .unwrap()
            .broker_config("127.0.0.1:1".parse().unwrap())
            .unwrap();
        assert_eq!(c.fetch_max_bytes, 57_671_680);
        let a = Args::try_parse_from(["spate", "--fetch-max-bytes", "1048576"]).unwrap();
        let c = a.broker_config("127.0.0.1:1".parse().unwrap()).unwrap();
        assert_eq!(c.fetch_max_bytes, 1 << 20);
        for bad in ["0", "1023", "2147483648"] {
            let a = Args::try_parse_from(["spate", "--fetch-max-bytes", bad]).unwrap();
            let e = a.broker_config("127.0.0.1:1".parse().unwrap()).unwrap_err();
            assert!(e.to_string().contains("--fetch-max-bytes"), "{bad}: {e}");
        }
        assert!(Args::try_parse_from(["spate", "--fetch-max-bytes", "-1"]).is_err());
        let f = write_config("fetch-max-bytes = 2097152\n");
        assert_eq!(
            file_arguments(f.path()).unwrap(),
            ["--fetch-max-bytes", "2097152"]
        );
    }

    #[test]
    fn producer_id_limits_default_to_a_day_and_refuse_zero() {
        let c = Args::try_parse_from(["spate"])
            .unwrap()
            .broker_config("127.0.0.1:1".parse().unwrap())
            .unwrap();
        assert_eq!(c.producer_id_expiration_ms, 86_400_000);
        assert_eq!(c.max_producer_ids_per_partition, 10_000);
        let a = Args::try_parse_from([
            "spate",
            "--producer-id-expiration-ms",
            "60000",
            "--max-producer-ids-per-partition",
            "5",
        ])
        .unwrap();
        let c = a.broker_config("127.0.0.1:1".parse().unwrap()).unwrap();
        assert_eq!(
            (
                c.producer_id_expiration_ms,
                c.max_producer_ids_per_partition
            ),
            (60_000, 5)
        );
        for (flag, bad) in [
            ("--producer-id-expiration-ms", "0"),
            ("--producer-id-expiration-ms", "2147483648"),
            ("--max-producer-ids-per-partition", "0"),
        ] {
            let a = Args::try_parse_from(["spate", flag, bad]).unwrap();
            let e = a.broker_config("127.0.0.1:1".parse().unwrap()).unwrap_err();
            assert!(e.to_string().contains(flag), "{flag} {bad}: {e}");
        }
    }

    #[test]
    fn auto_create_takes_an_explicit_boolean() {
        let a = Args::try_parse_from(["spate", "--auto-create-topics", "false"]).unwrap();
        assert!(!a.auto_create_topics);
        assert!(Args::try_parse_from(["spate", "--default-partitions", "x"]).is_err());
    }
}
