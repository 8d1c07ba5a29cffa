//! Delivery of encoded batches: the local produce handler for partitions this node leads (all
//! of them standalone), a Kafka Produce to the leader for the others.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use spate_broker::cluster::{PeerError, PeerPool};
use spate_broker::handlers::produce;
use spate_broker::quotas::{QuotaKind, ANONYMOUS};
use spate_broker::Broker;
use spate_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use spate_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse, TopicName};
use spate_protocol::{ResponseError, StrBytes};

/// Produce request version used for local and forwarded produces (error messages from v8).
const PRODUCE_VERSION: i16 = 9;
/// Longest wait for a connection to a leader.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Idle connections kept per leader: about the number of requests forwarded to it at once.
const IDLE_PER_LEADER: usize = 16;

/// Why a forwarded produce has no answer.
enum ForwardError {
    /// No connection to the leader: nothing was sent.
    Unreachable(PeerError),
    /// Sent, but the answer never came: the records may or may not have been written.
    Lost(PeerError),
}

/// Connections to partition leaders, kept for the next forwarded produce.
pub(super) struct LeaderConnections {
    pool: PeerPool,
}

impl Default for LeaderConnections {
    fn default() -> Self {
        Self {
            pool: PeerPool::new("spate-ingest", IDLE_PER_LEADER),
        }
    }
}

impl LeaderConnections {
    /// Sends `req` to the broker at `addr` on an idle connection, or a new one, and keeps the
    /// connection for the next call when the exchange completed.
    async fn produce(
        &self,
        transport: &spate_broker::cluster::Transport,
        addr: &str,
        client_id: &str,
        req: &ProduceRequest,
        limit: Duration,
    ) -> Result<ProduceResponse, ForwardError> {
        // A leader that does not accept within seconds is treated as unreachable, so the
        // records can be retried elsewhere within the request's timeout.
        let mut conn = self
            .pool
            .connection(transport, addr, limit.min(CONNECT_TIMEOUT))
            .await
            .map_err(ForwardError::Unreachable)?;
        // Under the HTTP client's id: the leader counts the bytes against its quota.
        let resp: ProduceResponse = conn
            .call_as(client_id, ApiKey::Produce, PRODUCE_VERSION, req, limit)
            .await
            .map_err(ForwardError::Lost)?;
        let throttle = Duration::from_millis(resp.throttle_time_ms.max(0) as u64);
        if !throttle.is_zero() {
            // Over its quota on the leader, which mutes this connection for the throttle time:
            // it is not kept for other clients' records, and the answer waits out the
            // throttle as a Kafka client waits before its next request.
            drop(conn);
            tokio::time::sleep(throttle.min(limit)).await;
            return Ok(resp);
        }
        self.pool.put_back(conn);
        Ok(resp)
    }
}

/// One encoded batch: `count` records of one partition, `order[first..first + count]`.
#[derive(Clone)]
pub(super) struct Batch {
    pub(super) partition: i32,
    pub(super) bytes: Bytes,
    pub(super) first: usize,
    pub(super) count: usize,
}

/// Where a request's batches go, and whose produce quota they count against.
#[derive(Clone, Copy)]
pub(super) struct Target<'a> {
    pub(super) topic: &'a str,
    pub(super) client_id: &'a str,
}

/// One batch's outcome.
pub(super) struct Delivery {
    pub(super) base_offset: i64,
    pub(super) error_code: i16,
    pub(super) error: String,
    /// Nothing was written and another attempt may succeed (the leader moved, or could not
    /// be reached before anything was sent).
    retry: bool,
}

impl Delivery {
    fn failed(code: ResponseError, why: impl Into<String>) -> Self {
        Self {
            base_offset: -1,
            error_code: code.code(),
            error: format!("{code:?}: {}", why.into()),
            retry: false,
        }
    }

    /// A failure after which the batch was certainly not written and may be sent again.
    fn not_written(code: ResponseError, why: impl Into<String>) -> Self {
        Self {
            retry: true,
            ..Self::failed(code, why)
        }
    }
}

/// Errors a leader answers when it wrote nothing and the partition's leadership or its ISR is
/// changing: a Kafka producer retries these, and so does ingest within the request's timeout.
fn retriable(code: Option<ResponseError>) -> bool {
    matches!(
        code,
        Some(
            ResponseError::NotLeaderOrFollower
                | ResponseError::LeaderNotAvailable
                | ResponseError::NotEnoughReplicas
                | ResponseError::FencedLeaderEpoch
                | ResponseError::UnknownLeaderEpoch
        )
    )
}

/// First pause before sending failed batches again; it doubles up to `RETRY_BACKOFF_MAX`.
const RETRY_BACKOFF: Duration = Duration::from_millis(50);
const RETRY_BACKOFF_MAX: Duration = Duration::from_millis(800);

fn produce_request(topic: &str, batches: &[&Batch], acks: i16, timeout_ms: i32) -> ProduceRequest {
    let mut td = TopicProduceData::default();
    td.name = TopicName(StrBytes::from_string(topic.to_owned()));
    td.partition_data = batches
        .iter()
        .map(|b| {
            let mut pd = PartitionProduceData::default();
            pd.index = b.partition;
            pd.records = Some(b.bytes.clone());
            pd
        })
        .collect();
    let mut req = ProduceRequest::default();
    req.acks = acks;
    req.timeout_ms = timeout_ms;
    req.topic_data = vec![td];
    req
}

fn outcomes(resp: &ProduceResponse, n: usize) -> Vec<Delivery> {
    let parts = resp.responses.first().map(|t| &t.partition_responses[..]);
    (0..n)
        .map(|i| match parts.and_then(|p| p.get(i)) {
            Some(pr) if pr.error_code == 0 => Delivery {
                base_offset: pr.base_offset,
                error_code: 0,
                error: String::new(),
                retry: false,
            },
            Some(pr) => {
                let code = ResponseError::try_from_code(pr.error_code);
                Delivery {
                    base_offset: -1,
                    error_code: pr.error_code,
                    retry: retriable(code),
                    error: format!(
                        "{}: {}",
                        code.map_or_else(
                            || format!("error {}", pr.error_code),
                            |c| format!("{c:?}")
                        ),
                        pr.error_message.as_deref().unwrap_or("")
                    ),
                }
            }
            None => Delivery::failed(
                ResponseError::UnknownServerError,
                "no answer for this partition",
            ),
        })
        .collect()
}

/// Counts `batches`' bytes against `client_id`'s produce quota on this node, which writes
/// them, as the Kafka listener counts a produce request's.
fn charge(b: &Broker, client_id: &str, batches: &[&Batch]) {
    let bytes: usize = batches.iter().map(|x| x.bytes.len()).sum();
    b.quotas
        .record(QuotaKind::Produce, ANONYMOUS, client_id, bytes as f64);
}

/// Produces `batches` of `topic` with `acks` (0: answered once appended, without waiting),
/// here for partitions this node leads and with a Kafka Produce to the leader for the
/// others; one outcome per batch, in order. Batches refused without being written while a
/// leadership moves are sent again, to the new leader, until `timeout_ms` has passed.
pub(super) async fn deliver(
    b: &Arc<Broker>,
    leaders: &LeaderConnections,
    to: Target<'_>,
    batches: &[Batch],
    acks: i16,
    timeout_ms: i32,
) -> Vec<Delivery> {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms.max(0) as u64);
    let all: Vec<&Batch> = batches.iter().collect();
    let mut results = attempt(b, leaders, to, &all, acks, timeout_ms).await;
    let mut backoff = RETRY_BACKOFF;
    loop {
        let again: Vec<usize> = (0..results.len()).filter(|&i| results[i].retry).collect();
        let left = deadline.saturating_duration_since(Instant::now());
        if again.is_empty() || left <= backoff {
            break;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
        let left = deadline.saturating_duration_since(Instant::now());
        let left_ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        let subset: Vec<&Batch> = again.iter().map(|&i| &batches[i]).collect();
        let answers = attempt(b, leaders, to, &subset, acks, left_ms).await;
        for (i, d) in again.into_iter().zip(answers) {
            results[i] = d;
        }
    }
    results
}

/// One attempt at every batch in `batches`.
async fn attempt(
    b: &Arc<Broker>,
    leaders: &LeaderConnections,
    to: Target<'_>,
    batches: &[&Batch],
    acks: i16,
    timeout_ms: i32,
) -> Vec<Delivery> {
    let topic = to.topic;
    // acks=0 still wants the offsets: append as acks=1 and do not wait.
    let (wire_acks, wait) = if acks == 0 { (1, false) } else { (acks, true) };
    let Some(cluster) = b.cluster().cloned() else {
        charge(b, to.client_id, batches);
        let req = produce_request(topic, batches, wire_acks, timeout_ms);
        let resp = produce::produce(b, PRODUCE_VERSION, 0, req, wait).await;
        return outcomes(&resp, batches.len());
    };
    let image = cluster.image();
    let me = cluster.broker_id();
    let mut results: Vec<Option<Delivery>> = (0..batches.len()).map(|_| None).collect();
    // Leader -> indexes of its batches.
    let mut by_leader: HashMap<i32, Vec<usize>> = HashMap::new();
    for (i, batch) in batches.iter().enumerate() {
        match image
            .partition(topic, batch.partition)
            .and_then(|s| s.leader)
        {
            Some(l) => by_leader.entry(l).or_default().push(i),
            None => {
                results[i] = Some(Delivery::not_written(
                    ResponseError::LeaderNotAvailable,
                    format!("partition {} has no leader now; retry", batch.partition),
                ))
            }
        }
    }
    let calls = by_leader.into_iter().map(|(leader, idx)| {
        let refs: Vec<&Batch> = idx.iter().map(|&i| batches[i]).collect();
        let req = produce_request(topic, &refs, wire_acks, timeout_ms);
        if leader == me {
            charge(b, to.client_id, &refs);
        }
        let addr = image
            .broker(leader)
            .filter(|r| !r.fenced)
            .map(|r| r.inter_node_addr.clone());
        let b = b.clone();
        let transport = cluster.transport().clone();
        async move {
            let n = idx.len();
            if leader == me {
                let resp = produce::produce(&b, PRODUCE_VERSION, 0, req, wait).await;
                return (idx, outcomes(&resp, n));
            }
            let Some(addr) = addr else {
                let d = (0..n)
                    .map(|_| {
                        Delivery::not_written(
                            ResponseError::NotLeaderOrFollower,
                            format!("the leader, node {leader}, is not reachable now; retry"),
                        )
                    })
                    .collect();
                return (idx, d);
            };
            // Waits for the leader's acks, plus the time to reach it.
            let limit = Duration::from_millis(timeout_ms.max(0) as u64) + Duration::from_secs(5);
            let d = match leaders
                .produce(&transport, &addr, to.client_id, &req, limit)
                .await
            {
                Ok(resp) => outcomes(&resp, n),
                Err(ForwardError::Unreachable(e)) => {
                    let why = format!("the leader, node {leader}, is not reachable ({e}); retry");
                    (0..n)
                        .map(|_| Delivery::not_written(ResponseError::NotLeaderOrFollower, why.clone()))
                        .collect()
                }
                Err(ForwardError::Lost(e)) => {
                    let why = format!(
                        "forwarding to the leader, node {leader}, failed ({e}); the records may or may not have been written"
                    );
                    (0..n)
                        .map(|_| Delivery::failed(ResponseError::RequestTimedOut, why.clone()))
                        .collect()
                }
            };
            (idx, d)
        }
    });
    for (idx, d) in futures::future::join_all(calls).await {
        for (i, d) in idx.into_iter().zip(d) {
            results[i] = Some(d);
        }
    }
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| Delivery::failed(ResponseError::UnknownServerError, "not sent"))
        })
        .collect()
}
