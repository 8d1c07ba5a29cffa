//! librdkafka client construction and the admin calls every mode needs (preflight, topic
//! creation and deletion, watermarks). Every blocking call here is bounded by a timeout.

use std::future::Future;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::{Acks, RunConfig};
use crate::error::{BenchError, Result};

/// librdkafka version string, e.g. "2.12.1".
pub fn librdkafka_version() -> String {
    rdkafka::util::get_rdkafka_version().1
}

/// The stable name of a client error for counting, e.g. `MessageTimedOut`.
pub fn error_code_name(e: &KafkaError) -> String {
    match e.rdkafka_error_code() {
        Some(code) => format!("{code:?}"),
        None => {
            // Errors without a code (e.g. configuration) are named by their variant.
            let s = format!("{e:?}");
            s.split(['(', ' ', '{'])
                .next()
                .unwrap_or("Unknown")
                .to_string()
        }
    }
}

/// Properties shared by every client of a run.
pub fn base_config(cfg: &RunConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &cfg.bootstrap);
    c.set("client.id", "spate-bench");
    // Fail fast on a dead address instead of retrying for the default 30 s per attempt.
    let connect_ms = cfg.timeout.as_millis().clamp(1_000, 30_000).to_string();
    c.set("socket.connection.setup.timeout.ms", &connect_ms);
    c
}

fn apply_extra(c: &mut ClientConfig, cfg: &RunConfig) {
    for (k, v) in &cfg.extra {
        c.set(k, v);
    }
}

/// Producer properties: acks, codec, batching; `-X` properties are applied last and win.
pub fn producer_config(cfg: &RunConfig) -> ClientConfig {
    let mut c = base_config(cfg);
    c.set("acks", cfg.acks.as_str());
    c.set("compression.codec", cfg.compression.as_str());
    if let Some(l) = cfg.linger_ms {
        c.set("linger.ms", l.to_string());
    }
    if let Some(b) = cfg.batch_size {
        c.set("batch.size", b.to_string());
    }
    // Validation needs a producer whose semantics exclude duplicates and reordering;
    // idempotence gives that, and it requires acks=all.
    let user_set = cfg.extra.iter().any(|(k, _)| k == "enable.idempotence");
    if cfg.validate && cfg.acks == Acks::All && !user_set {
        c.set("enable.idempotence", "true");
    }
    apply_extra(&mut c, cfg);
    c
}

/// Consumer properties: manual assignment, no commits, no group coordination needed.
pub fn consumer_config(cfg: &RunConfig) -> ClientConfig {
    let mut c = base_config(cfg);
    c.set("enable.auto.commit", "false");
    c.set("enable.auto.offset.store", "false");
    c.set("auto.offset.reset", "earliest");
    c.set("enable.partition.eof", "false");
    // librdkafka refuses assign() without a group id even though we never join or commit.
    c.set("group.id", format!("spate-bench-{}", std::process::id()));
    apply_extra(&mut c, cfg);
    c
}

/// True when the producer of this run is idempotent.
pub fn producer_is_idempotent(cfg: &RunConfig) -> bool {
    producer_config(cfg).get("enable.idempotence") == Some("true")
}

/// True for properties every client needs to reach the cluster (security, sockets).
fn is_connection_property(key: &str) -> bool {
    [
        "security.",
        "sasl.",
        "ssl.",
        "socket.",
        "broker.",
        "api.version",
    ]
    .iter()
    .any(|p| key.starts_with(p))
}

/// Base properties plus only the connection-related `-X` ones: metadata and admin clients
/// would log warnings about producer- or consumer-only properties otherwise.
fn connection_config(cfg: &RunConfig) -> ClientConfig {
    let mut c = base_config(cfg);
    for (k, v) in cfg.extra.iter().filter(|(k, _)| is_connection_property(k)) {
        c.set(k, v);
    }
    c
}

/// A consumer used only for metadata and watermark queries.
pub fn metadata_client(cfg: &RunConfig) -> Result<BaseConsumer> {
    connection_config(cfg)
        .create()
        .map_err(|e| BenchError::Client(e.to_string()))
}

/// An admin client for CreateTopics / DeleteTopics.
pub fn admin_client(cfg: &RunConfig) -> Result<AdminClient<DefaultClientContext>> {
    connection_config(cfg)
        .create()
        .map_err(|e| BenchError::Client(e.to_string()))
}

/// Runs a future to completion on a private single-thread runtime, bounded by `timeout`.
pub fn block_on<F: Future>(fut: F, timeout: Duration) -> Option<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .ok()?;
    rt.block_on(async { tokio::time::timeout(timeout, fut).await.ok() })
}

/// What the first Metadata request told us about the cluster.
#[derive(Clone, Debug)]
pub struct ClusterInfo {
    /// (id, "host:port") of every broker.
    pub brokers: Vec<(i32, String)>,
    /// Cluster id, when the broker reports one.
    pub cluster_id: Option<String>,
}

/// Checks the bootstrap servers answer; a one-line error instead of a hang when they do not.
pub fn preflight(cfg: &RunConfig) -> Result<ClusterInfo> {
    let client = metadata_client(cfg)?;
    let md = client
        .fetch_metadata(None, cfg.timeout)
        .map_err(|e| BenchError::Unreachable {
            bootstrap: cfg.bootstrap.clone(),
            reason: e.to_string(),
        })?;
    let brokers = md
        .brokers()
        .iter()
        .map(|b| (b.id(), format!("{}:{}", b.host(), b.port())))
        .collect();
    let cluster_id = client.client().fetch_cluster_id(Duration::from_secs(5));
    Ok(ClusterInfo {
        brokers,
        cluster_id,
    })
}

/// The partition ids of `topic`, or `None` when it does not exist.
pub fn topic_partitions(
    client: &BaseConsumer,
    topic: &str,
    timeout: Duration,
) -> Result<Option<Vec<i32>>> {
    let md = client
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| BenchError::Client(format!("metadata for '{topic}': {e}")))?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    if t.error().is_some() || t.partitions().is_empty() {
        return Ok(None);
    }
    let mut ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
    ids.sort_unstable();
    Ok(Some(ids))
}

/// Creates `topic` and waits until every partition has a leader.
/// An existing topic is accepted (returns false) so repeated runs can reuse it.
pub fn create_topic(cfg: &RunConfig, topic: &str, partitions: i32, rf: i32) -> Result<bool> {
    let fail = |reason: String| BenchError::TopicCreate {
        topic: topic.to_string(),
        reason,
    };
    let admin = admin_client(cfg)?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(rf));
    let opts = AdminOptions::new()
        .operation_timeout(Some(cfg.timeout))
        .request_timeout(Some(cfg.timeout));
    let results = block_on(
        admin.create_topics([&new], &opts),
        cfg.timeout + Duration::from_secs(5),
    )
    .ok_or_else(|| fail(format!("no answer within {:?}", cfg.timeout)))?
    .map_err(|e| fail(e.to_string()))?;
    let mut created = true;
    for r in results {
        match r {
            Ok(_) => {}
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => created = false,
            Err((_, code)) => return Err(fail(format!("{code:?} ({code})"))),
        }
    }
    wait_for_leaders(cfg, topic)?;
    Ok(created)
}

/// Polls metadata until every partition of `topic` has a leader (bounded by the timeout).
pub fn wait_for_leaders(cfg: &RunConfig, topic: &str) -> Result<()> {
    let client = metadata_client(cfg)?;
    let deadline = Instant::now() + cfg.timeout;
    loop {
        if let Ok(md) = client.fetch_metadata(Some(topic), Duration::from_secs(5)) {
            let ready = md.topics().iter().any(|t| {
                t.name() == topic
                    && t.error().is_none()
                    && !t.partitions().is_empty()
                    && t.partitions()
                        .iter()
                        .all(|p| p.leader() >= 0 && p.error().is_none())
            });
            if ready {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            return Err(BenchError::TopicCreate {
                topic: topic.to_string(),
                reason: format!("partitions have no leader after {:?}", cfg.timeout),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Deletes `topic`.
pub fn delete_topic(cfg: &RunConfig, topic: &str) -> Result<()> {
    let fail = |reason: String| BenchError::TopicDelete {
        topic: topic.to_string(),
        reason,
    };
    let admin = admin_client(cfg)?;
    let opts = AdminOptions::new()
        .operation_timeout(Some(cfg.timeout))
        .request_timeout(Some(cfg.timeout));
    let results = block_on(
        admin.delete_topics(&[topic], &opts),
        cfg.timeout + Duration::from_secs(5),
    )
    .ok_or_else(|| fail(format!("no answer within {:?}", cfg.timeout)))?
    .map_err(|e| fail(e.to_string()))?;
    for r in results {
        if let Err((_, code)) = r {
            return Err(fail(format!("{code:?} ({code})")));
        }
    }
    Ok(())
}

/// (low, high) watermarks of every partition, in partition order.
pub fn watermarks(
    client: &BaseConsumer,
    topic: &str,
    partitions: &[i32],
    timeout: Duration,
) -> Result<Vec<(i32, i64, i64)>> {
    partitions
        .iter()
        .map(|&p| {
            client
                .fetch_watermarks(topic, p, timeout)
                .map(|(lo, hi)| (p, lo, hi))
                .map_err(|e| BenchError::Client(format!("ListOffsets {topic}/{p}: {e}")))
        })
        .collect()
}
