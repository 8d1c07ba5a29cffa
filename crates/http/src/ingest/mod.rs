//! HTTP ingest: produce over HTTP. Blocking batches in the Confluent REST Proxy v2 shape
//! (`POST /topics/{topic}`) and spate's own (`POST /produce`, `/produce/batch`), answered once
//! every record has the requested acks; fire-and-forget batches (`POST /produce/fire/batch`,
//! `?async=true`) that go into a bounded queue and are answered 202 at once, or 429 when the
//! queue is full. Records are batched per partition into RecordBatches and take the Kafka
//! produce path (`handlers::produce`), or, in a cluster, a Kafka Produce to the partition's
//! leader.

mod batch;
mod body;
mod deliver;
pub mod schemas;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::BytesMut;
use http_body_util::BodyExt;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use spate_broker::quotas::{QuotaKind, ANONYMOUS};
use spate_broker::Broker;
use spate_metrics::Histogram;
use spate_protocol::messages::{MetadataRequest, TopicName};
use spate_protocol::StrBytes;
use tokio::sync::{mpsc, Semaphore};

pub use batch::{murmur2, partition_for_key, Codec};
use batch::{Rec, BATCH_OVERHEAD};
use deliver::{deliver, Batch, LeaderConnections, Target};

use crate::HttpState;

/// Metadata request version used to auto-create a topic.
const METADATA_VERSION: i16 = 12;
/// Bytes a record adds to a batch besides its payload, at most (length, attributes,
/// timestamp and offset deltas, key and value lengths, header count), for size checks.
const RECORD_OVERHEAD_MAX: usize = 32;
/// Most queued fire-and-forget jobs one delivery round takes together.
const FIRE_ROUND_JOBS: usize = 64;
/// The header naming the client id that produce quotas apply to.
pub const CLIENT_ID_HEADER: &str = "x-client-id";
/// The client id of requests without that header.
pub const DEFAULT_CLIENT_ID: &str = "spate-http-ingest";

/// Limits and defaults of HTTP ingest.
#[derive(Clone, Debug)]
pub struct IngestConfig {
    /// Largest request body, in bytes (413 above).
    pub max_body_bytes: usize,
    /// Most records in one request (422 above).
    pub max_records: usize,
    /// Longest a client may take to send its body (408 after).
    pub body_timeout: Duration,
    /// Compression of the batches written.
    pub compression: Codec,
    /// Records the fire-and-forget queue holds; a request that does not fit is a 429.
    pub fire_queue_records: usize,
    /// Encoded bytes the fire-and-forget queue holds.
    pub fire_queue_bytes: usize,
    /// Acks fire-and-forget deliveries wait for (-1 all, 1 leader).
    pub fire_acks: i16,
    /// A blocking request's wait for its acks when it names no `timeout_ms`.
    pub default_timeout_ms: i32,
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 32 << 20,
            max_records: 10_000,
            body_timeout: Duration::from_secs(30),
            compression: Codec::None,
            fire_queue_records: 100_000,
            fire_queue_bytes: 64 << 20,
            fire_acks: -1,
            default_timeout_ms: 30_000,
        }
    }
}

/// Why a request was refused as a whole; each maps to one HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// 400: not JSON, or a bad query parameter.
    #[error("{0}")]
    BadRequest(String),
    /// 404: no such topic or partition.
    #[error("{0}")]
    NotFound(String),
    /// 408: the body did not arrive in time.
    #[error("{0}")]
    BodyTimeout(String),
    /// 413: body or record too large.
    #[error("{0}")]
    TooLarge(String),
    /// 415: a content type we do not read.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 422: JSON of the wrong shape; the message names the field.
    #[error("{0}")]
    Unprocessable(String),
    /// 422 with the REST Proxy's or the schema registry's error code: a schema missing
    /// (42201 keys, 42202 values), refused by the registry (its code), or a record that does
    /// not fit its schema (42203).
    #[error("{message}")]
    Schema {
        /// The error code answered.
        code: u32,
        /// What happened, naming the field or record.
        message: String,
    },
    /// 429: memory or the fire-and-forget queue is full; retry after a second.
    #[error("{0}")]
    Busy(String),
    /// 429: the client id is over its producer_byte_rate quota; retry after `retry_after_s`.
    #[error("{message}")]
    OverQuota {
        /// What happened and for how long.
        message: String,
        /// Whole seconds until the quota allows more (at least 1).
        retry_after_s: u64,
    },
    /// 503: not ready, or shutting down.
    #[error("{0}")]
    Unavailable(String),
    /// 507: the data dir is below its free-space watermark (or full); retry once space is
    /// freed.
    #[error("{0}")]
    InsufficientStorage(String),
}

impl IngestError {
    fn status(&self) -> StatusCode {
        match self {
            IngestError::BadRequest(_) => StatusCode::BAD_REQUEST,
            IngestError::NotFound(_) => StatusCode::NOT_FOUND,
            IngestError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            IngestError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            IngestError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            IngestError::Unprocessable(_) | IngestError::Schema { .. } => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            IngestError::Busy(_) | IngestError::OverQuota { .. } => StatusCode::TOO_MANY_REQUESTS,
            IngestError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            IngestError::InsufficientStorage(_) => StatusCode::INSUFFICIENT_STORAGE,
        }
    }
}

impl IntoResponse for IngestError {
    fn into_response(self) -> Response {
        let status = self.status();
        let retry_after = match &self {
            IngestError::OverQuota { retry_after_s, .. } => {
                HeaderValue::from(*retry_after_s.max(&1))
            }
            _ => HeaderValue::from_static("1"),
        };
        // The REST Proxy's error shape: a five-digit code that starts with the status.
        let code = match &self {
            IngestError::Schema { code, .. } => *code,
            _ => u32::from(status.as_u16()) * 100 + 1,
        };
        let body = serde_json::json!({
            "error_code": code,
            "message": self.to_string(),
        });
        let mut resp = (status, axum::Json(body)).into_response();
        if matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS
                | StatusCode::SERVICE_UNAVAILABLE
                | StatusCode::INSUFFICIENT_STORAGE
        ) {
            resp.headers_mut().insert(header::RETRY_AFTER, retry_after);
        }
        resp
    }
}

/// Per-topic counts (records).
#[derive(Default)]
struct TopicCounts {
    fire_accepted: AtomicU64,
    fire_delivered: AtomicU64,
    fire_failed: AtomicU64,
    delivered: AtomicU64,
    failed: AtomicU64,
}

/// A queued fire-and-forget request: its encoded batches and the queue space it holds.
struct Job {
    topic: Arc<str>,
    /// The client id its produce quota is counted against.
    client_id: Arc<str>,
    batches: Vec<Batch>,
    counts: Arc<TopicCounts>,
    _records: tokio::sync::OwnedSemaphorePermit,
    _bytes: tokio::sync::OwnedSemaphorePermit,
}

/// The ingest side of the HTTP listener: limits, the fire-and-forget queue and its worker,
/// and the counts `/produce/stats` and `/metrics` show.
pub struct Ingest {
    config: IngestConfig,
    /// Picks the partition of a request's keyless records (sticky per request, round robin
    /// across requests).
    keyless: AtomicU32,
    counts: Mutex<HashMap<String, Arc<TopicCounts>>>,
    queue_records: Arc<Semaphore>,
    queue_bytes: Arc<Semaphore>,
    queued_records: AtomicU64,
    sender: Mutex<Option<mpsc::UnboundedSender<Job>>>,
    receiver: Mutex<Option<mpsc::UnboundedReceiver<Job>>>,
    closing: AtomicBool,
    drained: tokio::sync::watch::Sender<bool>,
    /// Refused requests by status code.
    refused: Mutex<HashMap<u16, u64>>,
    /// Connections to other nodes' partitions, for records this node forwards.
    leaders: LeaderConnections,
    /// Answered requests by route and HTTP status.
    answered: Mutex<HashMap<(Route, u16), u64>>,
    /// Time from a request's arrival to its answer, by route (indexed by `Route as usize`).
    latency: [Histogram; Route::ALL.len()],
}

impl Ingest {
    /// Ingest with these limits; the fire-and-forget worker starts with [`Ingest::start`].
    pub fn new(config: IngestConfig) -> Arc<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        // Semaphores hold at most usize::MAX >> 3 permits.
        let cap = |n: usize| n.clamp(1, Semaphore::MAX_PERMITS);
        Arc::new(Self {
            queue_records: Arc::new(Semaphore::new(cap(config.fire_queue_records))),
            queue_bytes: Arc::new(Semaphore::new(cap(config.fire_queue_bytes))),
            config,
            keyless: AtomicU32::new(0),
            counts: Mutex::new(HashMap::new()),
            queued_records: AtomicU64::new(0),
            sender: Mutex::new(Some(tx)),
            receiver: Mutex::new(Some(rx)),
            closing: AtomicBool::new(false),
            drained: tokio::sync::watch::channel(false).0,
            refused: Mutex::new(HashMap::new()),
            leaders: LeaderConnections::default(),
            answered: Mutex::new(HashMap::new()),
            latency: std::array::from_fn(|_| Histogram::latency()),
        })
    }

    /// Starts the fire-and-forget worker against the recovered broker.
    pub fn start(self: &Arc<Self>, broker: Arc<Broker>) {
        let Some(rx) = self.receiver.lock().take() else {
            return;
        };
        let me = self.clone();
        tokio::spawn(async move { me.work(broker, rx).await });
    }

    /// Stops taking fire-and-forget requests and waits (at most `limit`) until every queued
    /// record has been delivered or has failed; false when the limit passed first.
    pub async fn shutdown(&self, limit: Duration) -> bool {
        self.closing.store(true, Ordering::SeqCst);
        // Dropping the only sender ends the worker once the queue is empty.
        drop(self.sender.lock().take());
        if self.receiver.lock().take().is_some() {
            // The worker never started: nothing was accepted that it would deliver.
            return self.queued_records.load(Ordering::SeqCst) == 0;
        }
        let mut drained = self.drained.subscribe();
        let done = tokio::time::timeout(limit, drained.wait_for(|d| *d))
            .await
            .is_ok();
        done
    }

    fn counts(&self, topic: &str) -> Arc<TopicCounts> {
        let mut map = self.counts.lock();
        if let Some(c) = map.get(topic) {
            return c.clone();
        }
        let c = Arc::new(TopicCounts::default());
        map.insert(topic.to_owned(), c.clone());
        c
    }

    /// The response to a request that came by `route` at `started`: its answer, or its
    /// refusal, counted with the time it took.
    fn answer(
        &self,
        route: Route,
        started: Instant,
        result: Result<Response, IngestError>,
    ) -> Response {
        let resp = match result {
            Ok(r) => r,
            Err(e) => self.refuse(e),
        };
        *self
            .answered
            .lock()
            .entry((route, resp.status().as_u16()))
            .or_default() += 1;
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.latency[route as usize].observe(micros);
        resp
    }

    fn refuse(&self, e: IngestError) -> Response {
        *self.refused.lock().entry(e.status().as_u16()).or_default() += 1;
        e.into_response()
    }

    async fn work(self: Arc<Self>, broker: Arc<Broker>, mut rx: mpsc::UnboundedReceiver<Job>) {
        while let Some(first) = rx.recv().await {
            // Everything already queued goes in one round: one produce per topic, so the
            // jobs share an fsync or a replication wait.
            let mut jobs = vec![first];
            while jobs.len() < FIRE_ROUND_JOBS {
                match rx.try_recv() {
                    Ok(j) => jobs.push(j),
                    Err(_) => break,
                }
            }
            let mut by_topic: HashMap<(Arc<str>, Arc<str>), Vec<usize>> = HashMap::new();
            for (i, j) in jobs.iter().enumerate() {
                by_topic
                    .entry((j.topic.clone(), j.client_id.clone()))
                    .or_default()
                    .push(i);
            }
            let rounds = by_topic.into_iter().map(|((topic, client_id), idx)| {
                let batches: Vec<Batch> = idx
                    .iter()
                    .flat_map(|&i| jobs[i].batches.iter().cloned())
                    .collect();
                let broker = broker.clone();
                let me = self.clone();
                let acks = self.config.fire_acks;
                let timeout = self.config.default_timeout_ms;
                async move {
                    let to = Target {
                        topic: &topic,
                        client_id: &client_id,
                    };
                    let results = deliver(&broker, &me.leaders, to, &batches, acks, timeout).await;
                    (idx, results)
                }
            });
            for (idx, results) in futures::future::join_all(rounds).await {
                let mut results = results.into_iter();
                for i in idx {
                    let job = &jobs[i];
                    for b in &job.batches {
                        let n = b.count as u64;
                        match results.next() {
                            Some(r) if r.error_code == 0 => {
                                job.counts.fire_delivered.fetch_add(n, Ordering::Relaxed)
                            }
                            _ => job.counts.fire_failed.fetch_add(n, Ordering::Relaxed),
                        };
                        self.queued_records.fetch_sub(n, Ordering::Relaxed);
                    }
                }
            }
            // The jobs' queue permits go back here, after their records were counted.
            drop(jobs);
        }
        self.drained.send_replace(true);
    }
}

/// The ingest routes (also served alone on `--ingest-listen`).
pub fn routes() -> Router<Arc<HttpState>> {
    Router::new()
        .route("/topics/{topic}", post(rest_topic))
        .route(
            "/topics/{topic}/partitions/{partition}",
            post(rest_partition),
        )
        .route("/produce", post(produce_one))
        .route("/produce/batch", post(produce_batch))
        .route("/produce/fire", post(fire_batch))
        .route("/produce/fire/batch", post(fire_batch))
        .route("/produce/stats", get(stats))
}

/// Whether a path is an ingest data-plane call (no admin token needed).
pub fn is_ingest_path(path: &str) -> bool {
    path.starts_with("/topics/") || path == "/produce" || path.starts_with("/produce/")
}

#[derive(Deserialize, Default)]
struct IngestQuery {
    acks: Option<String>,
    timeout_ms: Option<i64>,
    topic: Option<String>,
    #[serde(rename = "async")]
    fire: Option<bool>,
    /// Elasticsearch's `refresh`: `wait_for` (or `true`) answers once the records are
    /// searchable; `false` (the default) as soon as they are written.
    refresh: Option<String>,
}

/// Where a request's topic comes from, and which route it came by.
struct Call {
    topic: Option<String>,
    partition: Option<i32>,
    route: Route,
}

/// The ingest routes; the answer's shape and the request metrics follow from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Route {
    Topic,
    Partition,
    Produce,
    ProduceBatch,
    FireBatch,
}

impl Route {
    /// Fire-and-forget (queued, answered 202).
    fn fire(self) -> bool {
        self == Route::FireBatch
    }

    /// Also takes one record at the top level.
    fn single(self) -> bool {
        matches!(self, Route::Produce | Route::FireBatch)
    }

    /// A REST Proxy path: answered as `application/vnd.kafka.v2+json` (or v1).
    fn rest(self) -> bool {
        matches!(self, Route::Topic | Route::Partition)
    }

    const ALL: [Route; 5] = [
        Route::Topic,
        Route::Partition,
        Route::Produce,
        Route::ProduceBatch,
        Route::FireBatch,
    ];

    /// The path template.
    fn path(self) -> &'static str {
        match self {
            Route::Topic => "/topics/{topic}",
            Route::Partition => "/topics/{topic}/partitions/{partition}",
            Route::Produce => "/produce",
            Route::ProduceBatch => "/produce/batch",
            Route::FireBatch => "/produce/fire/batch",
        }
    }
}

async fn rest_topic(
    State(s): State<Arc<HttpState>>,
    Path(topic): Path<String>,
    req: Request,
) -> Response {
    let call = Call {
        topic: Some(topic),
        partition: None,
        route: Route::Topic,
    };
    run(s, call, req).await
}

async fn rest_partition(
    State(s): State<Arc<HttpState>>,
    Path((topic, partition)): Path<(String, String)>,
    req: Request,
) -> Response {
    let ingest = s.ingest.clone();
    let started = Instant::now();
    let partition = match partition.parse::<i32>() {
        Ok(p) if p >= 0 => p,
        _ => {
            let why = format!("partition: {partition:?} is not a partition number");
            return ingest.answer(
                Route::Partition,
                started,
                Err(IngestError::Unprocessable(why)),
            );
        }
    };
    let call = Call {
        topic: Some(topic),
        partition: Some(partition),
        route: Route::Partition,
    };
    run(s, call, req).await
}

async fn produce_one(State(s): State<Arc<HttpState>>, req: Request) -> Response {
    let call = Call {
        topic: None,
        partition: None,
        route: Route::Produce,
    };
    run(s, call, req).await
}

async fn produce_batch(State(s): State<Arc<HttpState>>, req: Request) -> Response {
    let call = Call {
        topic: None,
        partition: None,
        route: Route::ProduceBatch,
    };
    run(s, call, req).await
}

async fn fire_batch(State(s): State<Arc<HttpState>>, req: Request) -> Response {
    let call = Call {
        topic: None,
        partition: None,
        route: Route::FireBatch,
    };
    run(s, call, req).await
}

async fn run(s: Arc<HttpState>, call: Call, req: Request) -> Response {
    let ingest = s.ingest.clone();
    let started = Instant::now();
    let route = call.route;
    let result = serve(&s, &ingest, call, req).await;
    ingest.answer(route, started, result)
}

/// One record's outcome in the answer (the REST Proxy's `offsets` entry).
struct Offset<'a> {
    partition: i32,
    offset: i64,
    error_code: Option<i16>,
    error: Option<&'a str>,
}

/// Writes the answer: `{"key_schema_id": null, "value_schema_id": null, "offsets": [...],
/// "delivered": n, "failed": n}` (the schema ids of schema'd records). By hand, because
/// serializing a struct per record was 7% of the broker's CPU under load; only error texts go
/// through the JSON string escaper.
fn write_answer(
    offsets: &[Offset<'_>],
    delivered: usize,
    failed: usize,
    schema_ids: (Option<i32>, Option<i32>),
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + offsets.len() * 64);
    let mut n = itoa::Buffer::new();
    out.extend_from_slice(br#"{"key_schema_id":"#);
    match schema_ids.0 {
        Some(id) => out.extend_from_slice(n.format(id).as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(br#","value_schema_id":"#);
    match schema_ids.1 {
        Some(id) => out.extend_from_slice(n.format(id).as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(br#","offsets":["#);
    for (i, o) in offsets.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(br#"{"partition":"#);
        out.extend_from_slice(n.format(o.partition).as_bytes());
        out.extend_from_slice(br#","offset":"#);
        out.extend_from_slice(n.format(o.offset).as_bytes());
        out.extend_from_slice(br#","error_code":"#);
        match o.error_code {
            Some(c) => out.extend_from_slice(n.format(c).as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(br#","error":"#);
        match o.error {
            Some(e) => {
                // Writing into a Vec cannot fail.
                let _ = serde_json::to_writer(&mut out, e);
            }
            None => out.extend_from_slice(b"null"),
        }
        out.push(b'}');
    }
    out.extend_from_slice(br#"],"delivered":"#);
    out.extend_from_slice(n.format(delivered).as_bytes());
    out.extend_from_slice(br#","failed":"#);
    out.extend_from_slice(n.format(failed).as_bytes());
    out.push(b'}');
    out
}

fn acks_of(q: &IngestQuery) -> Result<i16, IngestError> {
    match q.acks.as_deref() {
        None | Some("all") | Some("-1") => Ok(-1),
        Some("1") => Ok(1),
        Some("0") => Ok(0),
        Some(other) => Err(IngestError::BadRequest(format!(
            "acks: must be 0, 1 or all, got {other:?}"
        ))),
    }
}

async fn serve(
    s: &HttpState,
    ingest: &Arc<Ingest>,
    call: Call,
    req: Request,
) -> Result<Response, IngestError> {
    let broker = s.broker.get().cloned().ok_or_else(|| {
        IngestError::Unavailable("the broker is still recovering its logs".into())
    })?;
    let (parts, body) = req.into_parts();
    let q: IngestQuery = match parts.uri.query() {
        None => IngestQuery::default(),
        Some(q) => serde_urlencoded_query(q)?,
    };
    let acks = acks_of(&q)?;
    let fire = call.route.fire() || q.fire == Some(true);
    let refresh = match q.refresh.as_deref() {
        None | Some("false") => false,
        Some("wait_for" | "true" | "") => true,
        Some(other) => {
            return Err(IngestError::BadRequest(format!(
                "refresh: {other:?} is not wait_for, true or false"
            )))
        }
    };
    if refresh && fire {
        return Err(IngestError::BadRequest(
            "refresh: a fire-and-forget request is answered before its records are written".into(),
        ));
    }
    if fire && ingest.closing.load(Ordering::SeqCst) {
        return Err(IngestError::Unavailable(
            "shutting down: not queueing more".into(),
        ));
    }
    let timeout_ms = match q.timeout_ms {
        None => ingest.config.default_timeout_ms,
        Some(t) if (0..=i64::from(i32::MAX)).contains(&t) => t as i32,
        Some(t) => {
            return Err(IngestError::BadRequest(format!(
                "timeout_ms: {t} is out of range"
            )))
        }
    };
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let format = body::format_of(content_type).ok_or_else(|| {
        IngestError::UnsupportedMediaType(format!(
            "content type {content_type:?} is not accepted: use {}",
            body::ACCEPTED_TYPES
        ))
    })?;
    let answer_type = body::answer_type(content_type);
    // Produce quotas apply as to a Kafka producer: by client id, on the encoded bytes, counted
    // by the node that writes them (`deliver`). A client over its rate here gets a 429 before
    // anything is read or written, where a Kafka client would be throttled.
    let client_id = parts
        .headers
        .get(CLIENT_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or(DEFAULT_CLIENT_ID)
        .to_owned();
    let wait_ms = broker
        .quotas
        .throttle_of(QuotaKind::Produce, ANONYMOUS, &client_id);
    if wait_ms > 0 {
        return Err(IngestError::OverQuota {
            message: format!(
                "client id {client_id:?} is over its producer_byte_rate quota; retry in {wait_ms} ms"
            ),
            retry_after_s: wait_ms.div_ceil(1000),
        });
    }
    // A standalone node below its free-space watermark writes nothing: refused before the
    // body is read. (In a cluster the partition's leader decides; its refusal comes back per
    // batch and turns into the same status below.)
    if !broker.topology().replicates() && broker.disk.is_full() {
        return Err(IngestError::InsufficientStorage(broker.disk.refusal()));
    }
    let max = ingest.config.max_body_bytes;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(n) = declared.filter(|n| *n > max) {
        return Err(IngestError::TooLarge(format!(
            "body of {n} bytes exceeds the limit of {max} bytes (--ingest-max-body-bytes)"
        )));
    }
    // Memory first, as the Kafka listener takes a frame's size before reading it: the body,
    // plus about as much again for the batches built from it.
    let hint = declared.unwrap_or(max).min(max).max(1);
    let _memory = broker.budget.try_acquire(hint * 2).ok_or_else(|| {
        IngestError::Busy("the broker's in-flight memory is spent; retry shortly".into())
    })?;
    let limited = http_body_util::Limited::new(body, max);
    let raw = match tokio::time::timeout(ingest.config.body_timeout, limited.collect()).await {
        Err(_) => {
            return Err(IngestError::BodyTimeout(format!(
                "the body did not arrive within {} ms (--ingest-body-timeout-ms)",
                ingest.config.body_timeout.as_millis()
            )))
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(IngestError::TooLarge(format!(
                "body exceeds the limit of {max} bytes (--ingest-max-body-bytes)"
            )))
        }
        Ok(Err(e)) => return Err(IngestError::BadRequest(format!("reading the body: {e}"))),
        Ok(Ok(c)) => c.to_bytes(),
    };
    let parsed = body::parse(&raw, format, call.route.single())?;
    let schema_fields = parsed.schemas;
    let topic: String = match (call.topic, q.topic, parsed.topic) {
        (Some(t), _, _) => t,
        (None, Some(t), _) => t,
        (None, None, Some(t)) => t.into_owned(),
        (None, None, None) => {
            return Err(IngestError::Unprocessable(
                "topic: missing (give it in the body or as ?topic=)".into(),
            ))
        }
    };
    let mut records = parsed.records;
    if records.is_empty() {
        return Err(IngestError::Unprocessable("records: empty".into()));
    }
    if records.len() > ingest.config.max_records {
        return Err(IngestError::Unprocessable(format!(
            "records: {} records exceed the limit of {} per request (--ingest-max-records)",
            records.len(),
            ingest.config.max_records
        )));
    }
    if let Some(p) = call.partition {
        for r in &mut records {
            r.partition = Some(p);
        }
    }
    let meta = topic_meta(&broker, &topic).await?;
    let schema_ids = match format {
        body::Format::Schema(f) => {
            let authorization = parts.headers.get(axum::http::header::AUTHORIZATION);
            encode_with_schemas(s, f, &topic, schema_fields, authorization, &mut records).await?
        }
        _ => (None, None),
    };
    let prepared = prepare(ingest, &topic, &meta, &records, broker.clock.now_ms())?;
    let counts = ingest.counts(&topic);
    if fire {
        let n = records.len();
        let bytes: usize = prepared.batches.iter().map(|b| b.bytes.len()).sum();
        let full = || {
            IngestError::Busy(format!(
                "the fire-and-forget queue is full ({} of {} records queued); retry shortly",
                ingest.queued_records.load(Ordering::Relaxed),
                ingest.config.fire_queue_records
            ))
        };
        let too_big = |what: &str, limit: usize| {
            IngestError::TooLarge(format!(
                "the request's {what} exceed the whole fire-and-forget queue ({limit})"
            ))
        };
        if n > ingest.config.fire_queue_records {
            return Err(too_big("records", ingest.config.fire_queue_records));
        }
        if bytes > ingest.config.fire_queue_bytes {
            return Err(too_big("bytes", ingest.config.fire_queue_bytes));
        }
        let r = ingest
            .queue_records
            .clone()
            .try_acquire_many_owned(u32::try_from(n).unwrap_or(u32::MAX))
            .map_err(|_| full())?;
        let b = ingest
            .queue_bytes
            .clone()
            .try_acquire_many_owned(u32::try_from(bytes.max(1)).unwrap_or(u32::MAX))
            .map_err(|_| full())?;
        let job = Job {
            topic: Arc::from(topic.as_str()),
            client_id: Arc::from(client_id.as_str()),
            batches: prepared.batches,
            counts: counts.clone(),
            _records: r,
            _bytes: b,
        };
        // Counted before it is sent, so the worker never counts a delivery first.
        counts.fire_accepted.fetch_add(n as u64, Ordering::Relaxed);
        ingest.queued_records.fetch_add(n as u64, Ordering::Relaxed);
        let sent = ingest.sender.lock().as_ref().map(|tx| tx.send(job));
        if !matches!(sent, Some(Ok(()))) {
            counts.fire_accepted.fetch_sub(n as u64, Ordering::Relaxed);
            ingest.queued_records.fetch_sub(n as u64, Ordering::Relaxed);
            return Err(IngestError::Unavailable(
                "shutting down: not queueing more".into(),
            ));
        }
        let body = serde_json::json!({"accepted": n});
        return Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response());
    }
    let to = Target {
        topic: &topic,
        client_id: &client_id,
    };
    let results = deliver(
        &broker,
        &ingest.leaders,
        to,
        &prepared.batches,
        acks,
        timeout_ms,
    )
    .await;
    let mut offsets: Vec<Offset<'_>> = (0..records.len())
        .map(|_| Offset {
            partition: -1,
            offset: -1,
            error_code: None,
            error: None,
        })
        .collect();
    let (mut delivered, mut failed) = (0usize, 0usize);
    for (b, r) in prepared.batches.iter().zip(&results) {
        for (j, &i) in prepared.order[b.first..b.first + b.count]
            .iter()
            .enumerate()
        {
            let o = &mut offsets[i as usize];
            o.partition = b.partition;
            if r.error_code == 0 {
                o.offset = r.base_offset + j as i64;
                delivered += 1;
            } else {
                o.error_code = Some(r.error_code);
                o.error = Some(r.error.as_str());
                failed += 1;
            }
        }
    }
    counts
        .delivered
        .fetch_add(delivered as u64, Ordering::Relaxed);
    counts.failed.fetch_add(failed as u64, Ordering::Relaxed);
    let storage_error = spate_protocol::ResponseError::KafkaStorageError.code();
    let status = if failed == 0 {
        StatusCode::OK
    } else if delivered == 0 && results.iter().all(|r| r.error_code == storage_error) {
        // Every batch was refused for want of disk space (a full leader): as a whole refusal.
        StatusCode::INSUFFICIENT_STORAGE
    } else {
        StatusCode::MULTI_STATUS
    };
    let json = write_answer(&offsets, delivered, failed, schema_ids);
    let content_type = if call.route.rest() {
        answer_type
    } else {
        "application/json"
    };
    let mut response = (status, [(header::CONTENT_TYPE, content_type)], json).into_response();
    if refresh && delivered > 0 {
        let searchable = match s.search() {
            Some(search) => {
                // The last record written to each partition.
                let mut last: Vec<(i32, i64)> = Vec::new();
                for o in offsets.iter().filter(|o| o.error_code.is_none()) {
                    match last.iter_mut().find(|(p, _)| *p == o.partition) {
                        Some((_, at)) => *at = (*at).max(o.offset),
                        None => last.push((o.partition, o.offset)),
                    }
                }
                let limit = std::time::Duration::from_millis(timeout_ms.max(0) as u64);
                search.wait_searchable(&topic, &last, limit).await
            }
            None => false,
        };
        // Whether the answer waited its records into the index (false: timed out, or this
        // node holds no replica of some partition to wait on).
        response.headers_mut().insert(
            "spate-searchable",
            header::HeaderValue::from_static(if searchable { "true" } else { "false" }),
        );
    }
    Ok(response)
}

/// Which part of a record a schema is for.
#[derive(Clone, Copy)]
enum Part {
    Key,
    Value,
}

/// Encodes the records' keys and values with their schemas (registered or found under
/// `<topic>-key` and `<topic>-value`) in the registry's wire format, in place; the answer is
/// the key and value schema ids.
async fn encode_with_schemas(
    s: &HttpState,
    format: schemas::SchemaFormat,
    topic: &str,
    fields: body::SchemaFields,
    authorization: Option<&axum::http::HeaderValue>,
    records: &mut [Rec<'_>],
) -> Result<(Option<i32>, Option<i32>), IngestError> {
    let key = encode_part(
        s,
        format,
        topic,
        Part::Key,
        (fields.key_schema, fields.key_schema_id),
        authorization,
        records,
    )
    .await?;
    let value = encode_part(
        s,
        format,
        topic,
        Part::Value,
        (fields.value_schema, fields.value_schema_id),
        authorization,
        records,
    )
    .await?;
    Ok((key, value))
}

async fn encode_part(
    s: &HttpState,
    format: schemas::SchemaFormat,
    topic: &str,
    part: Part,
    (schema, schema_id): (Option<String>, Option<i32>),
    authorization: Option<&axum::http::HeaderValue>,
    records: &mut [Rec<'_>],
) -> Result<Option<i32>, IngestError> {
    let (name, missing_code) = match part {
        Part::Key => ("key", 42201),
        Part::Value => ("value", 42202),
    };
    let slot = |r: &Rec<'_>| match part {
        Part::Key => r.key.is_some(),
        Part::Value => r.value.is_some(),
    };
    // Records without a key (or value) keep a null one; a schema given without records that
    // need it is still registered, as the REST Proxy does.
    let with: Vec<usize> = (0..records.len()).filter(|&i| slot(&records[i])).collect();
    if schema.is_none() && schema_id.is_none() {
        if with.is_empty() {
            return Ok(None);
        }
        return Err(IngestError::Schema {
            code: missing_code,
            message: format!(
                "records[{}].{name}: the request has {name}s but neither {name}_schema nor {name}_schema_id",
                with[0]
            ),
        });
    }
    let Some(registry) = s.record_schemas() else {
        return Err(IngestError::Schema {
            code: missing_code,
            message: format!(
                "{name}_schema: this node runs no schema registry (start it with --schema-registry-listen) to encode {} records with",
                format.registry_name()
            ),
        });
    };
    let encoded = {
        let mut values = Vec::with_capacity(with.len());
        for &i in &with {
            let bytes = match part {
                Part::Key => records[i].key.as_deref(),
                Part::Value => records[i].value.as_deref(),
            };
            // The body was checked as UTF-8 and these are slices of its JSON.
            let text = std::str::from_utf8(bytes.unwrap_or_default()).map_err(|e| {
                IngestError::BadRequest(format!("records[{i}].{name}: not UTF-8: {e}"))
            })?;
            values.push(text);
        }
        let request = schemas::EncodeRequest {
            format,
            subject: format!("{topic}-{name}"),
            schema,
            schema_id,
            values,
            authorization: authorization.cloned(),
        };
        registry.encode(request).await.map_err(|e| match e {
            schemas::SchemaError::Schema { code, message } => IngestError::Schema {
                code,
                message: format!("{name}_schema: {message}"),
            },
            schemas::SchemaError::Record { index, message } => IngestError::Schema {
                code: 42203,
                message: format!(
                    "records[{}].{name}: {message}",
                    with.get(index).copied().unwrap_or(index)
                ),
            },
            schemas::SchemaError::Unavailable(m) => IngestError::Unavailable(m),
        })?
    };
    if encoded.values.len() != with.len() {
        return Err(IngestError::Unavailable(format!(
            "the schema registry encoded {} of {} {name}s",
            encoded.values.len(),
            with.len()
        )));
    }
    for (&i, bytes) in with.iter().zip(encoded.values) {
        let target = match part {
            Part::Key => &mut records[i].key,
            Part::Value => &mut records[i].value,
        };
        *target = Some(std::borrow::Cow::Owned(bytes));
    }
    Ok(Some(encoded.schema_id))
}

fn serde_urlencoded_query(q: &str) -> Result<IngestQuery, IngestError> {
    let uri: axum::http::Uri = format!("/?{q}")
        .parse()
        .map_err(|e| IngestError::BadRequest(format!("query: {e}")))?;
    axum::extract::Query::<IngestQuery>::try_from_uri(&uri)
        .map(|q| q.0)
        .map_err(|e| IngestError::BadRequest(format!("query: {}", e.body_text())))
}

/// What producing to a topic needs to know.
struct TopicMeta {
    partitions: i32,
    max_message_bytes: usize,
}

/// The topic's partition count and record size limit, creating it first when it does not
/// exist and auto-creation is on (the same rule as a Metadata request).
async fn topic_meta(b: &Arc<Broker>, name: &str) -> Result<TopicMeta, IngestError> {
    spate_broker::validate_topic_name(name)
        .map_err(|e| IngestError::Unprocessable(format!("topic: {e}")))?;
    let count = |b: &Broker| -> Option<i32> {
        match b.cluster() {
            Some(c) => c.image().topic(name).map(|t| t.partitions.len() as i32),
            None => b.topics.get(name).map(|t| t.partition_count()),
        }
    };
    let partitions = match count(b) {
        Some(n) => n,
        None if b.config.auto_create_topics => {
            let mut t = spate_protocol::messages::metadata_request::MetadataRequestTopic::default();
            t.name = Some(TopicName(StrBytes::from_string(name.to_owned())));
            let mut req = MetadataRequest::default();
            req.topics = Some(vec![t]);
            req.allow_auto_topic_creation = true;
            if b.cluster().is_some() {
                spate_broker::cluster::metadata(b.clone(), METADATA_VERSION, req).await;
            } else {
                // Creating a topic makes directories and fsyncs.
                let bb = b.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    spate_broker::handlers::metadata::handle(&bb, METADATA_VERSION, req)
                })
                .await;
            }
            count(b).ok_or_else(|| {
                IngestError::NotFound(format!("topic {name:?} could not be created"))
            })?
        }
        None => {
            return Err(IngestError::NotFound(format!(
                "topic {name:?} does not exist (and --auto-create-topics is off)"
            )))
        }
    };
    if partitions <= 0 {
        return Err(IngestError::NotFound(format!(
            "topic {name:?} has no partitions"
        )));
    }
    let max_message_bytes = b
        .topics
        .get(name)
        .map(|t| t.with_config(|c| c.max_message_bytes()))
        .unwrap_or_else(|| spate_broker::TopicConfig::default().max_message_bytes());
    Ok(TopicMeta {
        partitions,
        max_message_bytes,
    })
}

struct Prepared {
    /// Record indexes grouped by partition (body order within a partition).
    order: Vec<u32>,
    batches: Vec<Batch>,
}

/// Picks each record's partition and encodes the records into batches of at most
/// max.message.bytes, one or more per partition.
fn prepare(
    ingest: &Ingest,
    topic: &str,
    meta: &TopicMeta,
    records: &[Rec<'_>],
    now_ms: i64,
) -> Result<Prepared, IngestError> {
    let n = meta.partitions;
    let limit = meta.max_message_bytes;
    // Keyless records of one request go to one partition (one batch), the next request's to
    // the next partition: the Java client's sticky partitioning, per request.
    let sticky = (ingest.keyless.fetch_add(1, Ordering::Relaxed) % n as u32) as i32;
    // Partition, record index and the record's encoded size bound, in body order.
    let mut keyed: Vec<(i32, u32, usize)> = Vec::with_capacity(records.len());
    let mut bound_total = 0usize;
    for (i, r) in records.iter().enumerate() {
        let p = match (r.partition, r.key.as_deref()) {
            (Some(p), _) if p >= n => {
                return Err(IngestError::NotFound(format!(
                    "records[{i}].partition: partition {p} does not exist (topic {topic:?} has {n})"
                )))
            }
            (Some(p), _) => p,
            (None, Some(k)) => partition_for_key(k, n),
            (None, None) => sticky,
        };
        let bound = r.payload_len() + RECORD_OVERHEAD_MAX + 8 * r.headers.len();
        if bound + BATCH_OVERHEAD > limit {
            return Err(IngestError::TooLarge(format!(
                "records[{i}]: {} bytes exceed max.message.bytes ({limit}) of topic {topic:?}",
                r.payload_len()
            )));
        }
        bound_total += bound;
        keyed.push((p, i as u32, bound));
    }
    // Stable: records keep their body order within a partition.
    keyed.sort_by_key(|(p, _, _)| *p);
    let order: Vec<u32> = keyed.iter().map(|(_, i, _)| *i).collect();
    // Room for every batch uncompressed, so encoding never grows (copies) the buffer.
    let mut buf =
        BytesMut::with_capacity(bound_total + BATCH_OVERHEAD * records.len().min(n as usize));
    let mut spans: Vec<(i32, usize, usize, usize)> = Vec::new(); // partition, first, count, bytes end
    let mut start = 0;
    while start < keyed.len() {
        let p = keyed[start].0;
        let mut end = start;
        let mut size = BATCH_OVERHEAD;
        while end < keyed.len() && keyed[end].0 == p {
            let add = keyed[end].2;
            if end > start && size + add > limit {
                break;
            }
            size += add;
            end += 1;
        }
        let recs = order[start..end].iter().map(|&i| &records[i as usize]);
        batch::encode(&mut buf, recs, ingest.config.compression, now_ms)
            .map_err(|e| IngestError::Unavailable(format!("compressing a batch: {e}")))?;
        spans.push((p, start, end - start, buf.len()));
        start = end;
    }
    let all = buf.freeze();
    let mut from = 0;
    let batches = spans
        .into_iter()
        .map(|(partition, first, count, to)| {
            let bytes = all.slice(from..to);
            from = to;
            Batch {
                partition,
                bytes,
                first,
                count,
            }
        })
        .collect();
    Ok(Prepared { order, batches })
}

#[derive(Serialize)]
struct TopicStats {
    accepted: u64,
    delivered: u64,
    failed: u64,
    queued: u64,
    blocking_delivered: u64,
    blocking_failed: u64,
}

/// Accepted, delivered and failed fire-and-forget records per topic (`queued` = accepted -
/// delivered - failed), the queue's use, and blocking counts.
async fn stats(State(s): State<Arc<HttpState>>) -> Response {
    let ingest = &s.ingest;
    let mut topics = serde_json::Map::new();
    let mut snapshot: Vec<(String, Arc<TopicCounts>)> = ingest
        .counts
        .lock()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    snapshot.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, c) in snapshot {
        // Delivered and failed are read before accepted, so queued is never negative.
        let delivered = c.fire_delivered.load(Ordering::SeqCst);
        let failed = c.fire_failed.load(Ordering::SeqCst);
        let accepted = c.fire_accepted.load(Ordering::SeqCst);
        let t = TopicStats {
            accepted,
            delivered,
            failed,
            queued: accepted.saturating_sub(delivered + failed),
            blocking_delivered: c.delivered.load(Ordering::SeqCst),
            blocking_failed: c.failed.load(Ordering::SeqCst),
        };
        topics.insert(name, serde_json::to_value(t).unwrap_or_default());
    }
    let body = serde_json::json!({
        "topics": topics,
        "queue": {
            "records": ingest.queued_records.load(Ordering::SeqCst),
            "capacity_records": ingest.config.fire_queue_records,
            "capacity_bytes": ingest.config.fire_queue_bytes,
            "closing": ingest.closing.load(Ordering::SeqCst),
        },
    });
    axum::Json(body).into_response()
}

/// The ingest families for `/metrics`.
pub fn render_metrics(ingest: &Ingest) -> String {
    let mut w = spate_metrics::text::Writer::default();
    let snapshot: Vec<(String, Arc<TopicCounts>)> = ingest
        .counts
        .lock()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    type Pick = fn(&TopicCounts) -> u64;
    let families: [(&str, &str, Pick); 5] = [
        (
            "spate_ingest_fire_accepted_records_total",
            "Fire-and-forget records accepted into the queue (answered 202).",
            |c| c.fire_accepted.load(Ordering::Relaxed),
        ),
        (
            "spate_ingest_fire_delivered_records_total",
            "Fire-and-forget records written with the configured acks.",
            |c| c.fire_delivered.load(Ordering::Relaxed),
        ),
        (
            "spate_ingest_fire_failed_records_total",
            "Fire-and-forget records accepted but not delivered.",
            |c| c.fire_failed.load(Ordering::Relaxed),
        ),
        (
            "spate_ingest_delivered_records_total",
            "Blocking HTTP records answered as delivered.",
            |c| c.delivered.load(Ordering::Relaxed),
        ),
        (
            "spate_ingest_failed_records_total",
            "Blocking HTTP records answered with an error.",
            |c| c.failed.load(Ordering::Relaxed),
        ),
    ];
    for (name, help, pick) in families {
        w.family(name, "counter", help);
        for (topic, c) in &snapshot {
            w.sample(name, &[("topic", topic)], pick(c) as f64);
        }
    }
    w.family(
        "spate_ingest_fire_queue_records",
        "gauge",
        "Fire-and-forget records queued and not yet delivered or failed.",
    );
    w.sample(
        "spate_ingest_fire_queue_records",
        &[],
        ingest.queued_records.load(Ordering::Relaxed) as f64,
    );
    w.family(
        "spate_ingest_requests_total",
        "counter",
        "Ingest requests answered, by route and HTTP status.",
    );
    let mut answered: Vec<((Route, u16), u64)> = ingest
        .answered
        .lock()
        .iter()
        .map(|(k, v)| (*k, *v))
        .collect();
    answered.sort_by_key(|((r, status), _)| (r.path(), *status));
    for ((route, status), n) in answered {
        let status = status.to_string();
        w.sample(
            "spate_ingest_requests_total",
            &[("route", route.path()), ("status", &status)],
            n as f64,
        );
    }
    w.family(
        "spate_ingest_request_duration_seconds",
        "histogram",
        "Time from an ingest request's arrival to its answer, by route (blocking requests wait \
         for their acks).",
    );
    for (route, h) in Route::ALL.iter().zip(&ingest.latency) {
        if h.snapshot().2 > 0 {
            w.histogram(
                "spate_ingest_request_duration_seconds",
                &[("route", route.path())],
                h,
                1e6,
            );
        }
    }
    w.family(
        "spate_ingest_refused_requests_total",
        "counter",
        "Ingest requests refused as a whole, by HTTP status.",
    );
    let refused: Vec<(u16, u64)> = ingest
        .refused
        .lock()
        .iter()
        .map(|(k, v)| (*k, *v))
        .collect();
    for (status, n) in refused {
        let status = status.to_string();
        w.sample(
            "spate_ingest_refused_requests_total",
            &[("status", &status)],
            n as f64,
        );
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_listed_in_the_order_their_latencies_are_indexed() {
        for (i, r) in Route::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?}");
        }
    }

    #[test]
    fn the_answer_is_the_rest_proxys_json() {
        let offsets = [
            Offset {
                partition: 2,
                offset: 41,
                error_code: None,
                error: None,
            },
            Offset {
                partition: 0,
                offset: -1,
                error_code: Some(7),
                error: Some("RequestTimedOut: \"late\""),
            },
        ];
        let v: serde_json::Value =
            serde_json::from_slice(&write_answer(&offsets, 1, 1, (None, None))).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "key_schema_id": null, "value_schema_id": null,
                "offsets": [
                    {"partition": 2, "offset": 41, "error_code": null, "error": null},
                    {"partition": 0, "offset": -1, "error_code": 7, "error": "RequestTimedOut: \"late\""},
                ],
                "delivered": 1, "failed": 1,
            })
        );
        let v: serde_json::Value =
            serde_json::from_slice(&write_answer(&offsets[..1], 1, 0, (Some(3), Some(12))))
                .unwrap();
        assert_eq!(
            (v["key_schema_id"].as_i64(), v["value_schema_id"].as_i64()),
            (Some(3), Some(12))
        );
    }

    /// Stands in for the registry: ids 3 (keys) and 9 (values), schema "bad" refused, records
    /// containing "wrong" do not fit; every value is framed as magic byte + id + its text.
    struct FakeSchemas;

    impl schemas::RecordSchemas for FakeSchemas {
        fn encode<'a>(&'a self, r: schemas::EncodeRequest<'a>) -> schemas::EncodeFuture<'a> {
            Box::pin(async move {
                if r.schema.as_deref() == Some("bad") {
                    return Err(schemas::SchemaError::Schema {
                        code: 42201,
                        message: "invalid schema: bad".into(),
                    });
                }
                if let Some(index) = r.values.iter().position(|v| v.contains("wrong")) {
                    return Err(schemas::SchemaError::Record {
                        index,
                        message: "does not fit".into(),
                    });
                }
                let id: u8 = if r.subject.ends_with("-key") { 3 } else { 9 };
                Ok(schemas::Encoded {
                    schema_id: i32::from(id),
                    values: r
                        .values
                        .iter()
                        .map(|v| [&[0, 0, 0, 0, id][..], v.as_bytes()].concat())
                        .collect(),
                })
            })
        }
    }

    async fn post(
        state: &Arc<HttpState>,
        content_type: &str,
        body: &str,
    ) -> (StatusCode, serde_json::Value) {
        use tower::ServiceExt;
        let req = axum::http::Request::builder()
            .method("POST")
            .uri("/topics/t")
            .header("content-type", content_type)
            .body(axum::body::Body::from(body.to_string()))
            .unwrap();
        let resp = crate::router(state.clone()).oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or_default())
    }

    fn broker_state(dir: &std::path::Path) -> Arc<HttpState> {
        let (broker, _) = Broker::open(spate_broker::BrokerConfig::new(
            dir.join("data"),
            "127.0.0.1",
            9092,
        ))
        .unwrap();
        let state = HttpState::new(None, serde_json::json!({}));
        state.set_ready(broker);
        state
    }

    const AVRO: &str = "application/vnd.kafka.avro.v2+json";

    #[tokio::test]
    async fn schemad_records_are_encoded_by_the_registry_and_the_answer_names_the_schema_ids() {
        let dir = tempfile::tempdir().unwrap();
        let s = broker_state(dir.path());
        // Without a registry in the process the formats are refused, saying why.
        let (status, v) = post(
            &s,
            AVRO,
            r#"{"value_schema": "s", "records": [{"value": 1}]}"#,
        )
        .await;
        assert_eq!(
            (status, v["error_code"].as_i64()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some(42202))
        );
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("--schema-registry-listen"),
            "{v}"
        );
        s.set_record_schemas(Arc::new(FakeSchemas));
        let (status, v) = post(
            &s,
            AVRO,
            r#"{"key_schema_id": 3, "value_schema": "s", "records": [{"key": "k", "value": {"a": 1}}, {"value": 2}]}"#,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(
            (v["key_schema_id"].as_i64(), v["value_schema_id"].as_i64()),
            (Some(3), Some(9))
        );
        assert_eq!(v["offsets"][1]["offset"], 1);
    }

    #[tokio::test]
    async fn schemad_requests_without_schemas_or_with_refused_ones_are_422_with_the_rest_proxys_codes(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let s = broker_state(dir.path());
        s.set_record_schemas(Arc::new(FakeSchemas));
        let cases = [
            (r#"{"records": [{"value": 1}]}"#, 42202, "records[0].value: the request has values but neither value_schema nor value_schema_id"),
            (r#"{"value_schema_id": 9, "records": [{"key": 1, "value": 1}]}"#, 42201, "records[0].key"),
            (r#"{"value_schema": "bad", "records": [{"value": 1}]}"#, 42201, "value_schema: invalid schema: bad"),
            (r#"{"value_schema": "s", "records": [{"value": 1}, {"value": null}, {"value": "wrong"}]}"#, 42203, "records[2].value: does not fit"),
        ];
        for (body, code, message) in cases {
            let (status, v) = post(&s, AVRO, body).await;
            assert_eq!(
                (status, v["error_code"].as_i64()),
                (StatusCode::UNPROCESSABLE_ENTITY, Some(code)),
                "{body}: {v}"
            );
            assert!(
                v["message"].as_str().unwrap().contains(message),
                "{body}: {v}"
            );
        }
        // Schemas belong with the schema'd formats only.
        let (status, v) = post(
            &s,
            "application/vnd.kafka.json.v2+json",
            r#"{"value_schema": "s", "records": [{"value": 1}]}"#,
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    }
}
