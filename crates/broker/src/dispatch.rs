//! From a request frame to a response: header, version check, decode, handler, encode.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;
use serde::{Deserialize, Serialize};
use spate_log::Flusher;
use spate_metrics::Registry;
use spate_protocol::codec::{encode_bare_error, encode_response, CodecError};
use spate_protocol::header::RawPrefix;
use spate_protocol::messages::{ApiKey, MetadataRequest};
use spate_protocol::request::{DecodeError, Decoded, Request};
use spate_protocol::{Encodable, ResponseError};
use thiserror::Error;

use crate::budget::{MemoryBudget, Permit};
use crate::config::BrokerConfig;
use crate::error::{io, BrokerError};
use crate::groups::GroupService;
use crate::handlers;
use crate::partition::Partition;
use crate::producer_ids::ProducerIds;
use crate::quotas::{Mute, QuotaKind, ANONYMOUS};
use crate::registry::{side_by_side, write_atomically, Topic, TopicRegistry};
use crate::throttle::{RequestCharge, Throttled};
use crate::time::{SharedClock, SystemClock};
use crate::topology::Work;

/// What to send back for one request.
pub enum Reply {
    /// Nothing: acks=0 produce.
    None,
    /// A complete response frame.
    Now(Bytes),
    /// A response frame that becomes ready later; responses still go out in request order.
    Later(Pin<Box<dyn Future<Output = Bytes> + Send + 'static>>),
    /// A response whose work runs on the blocking pool (directories, files, fsyncs) and must
    /// finish before the connection handles its next request: pipelined requests then see
    /// its effect (a created topic) as they did when such work ran inline.
    Serial(Pin<Box<dyn Future<Output = Bytes> + Send + 'static>>),
    /// A fetch: the connection first takes `memory` bytes from the budget when asked to
    /// (waiting, and reading no further request, while the budget is spent), then calls
    /// `start` with that permit and the milliseconds it waited. The frame comes back with the
    /// memory it holds, to be released once the frame has been written.
    Held {
        /// Memory to take before starting, if any.
        memory: Option<usize>,
        /// Starts the work.
        start: Box<dyn FnOnce(Option<Permit>, i32) -> HeldFrame + Send + 'static>,
    },
}

/// A response frame on its way, with the memory its contents hold.
pub type HeldFrame = Pin<Box<dyn Future<Output = (Bytes, Option<Permit>)> + Send + 'static>>;

/// A request the connection cannot continue after: the stream is out of step or hostile.
#[derive(Debug, Error)]
pub enum RequestError {
    /// The frame could not be decoded.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A response could not be encoded.
    #[error(transparent)]
    Encode(#[from] CodecError),
    /// A request the connection's SASL state does not allow.
    #[error("API key {api_key}: {why}")]
    Unauthenticated {
        /// The request's API key.
        api_key: i16,
        /// Why it closes the connection.
        why: &'static str,
    },
}

/// What the connection knows about a request besides its bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestContext<'a> {
    /// Client address as Kafka reports it ("/127.0.0.1").
    pub peer: &'a str,
    /// How long the request waited for memory before it was read; reported back as
    /// throttle_time_ms on produce and fetch responses.
    pub throttle_ms: i32,
    /// The connection's mute: a client over its quota is read no further until it ends.
    pub mute: Option<&'a Arc<Mute>>,
    /// The connection's security state: its listener, SASL exchange and principal (`None`:
    /// a PLAINTEXT connection of a caller that keeps none, as tests).
    pub session: Option<&'a Arc<crate::security::Session>>,
}

#[derive(Serialize, Deserialize)]
struct NodeFile {
    cluster_id: String,
    node_id: i32,
}

/// How often the data dir's free space is sampled.
const DISK_SAMPLE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// The broker: configuration, topics and producer ids, shared by every connection.
pub struct Broker {
    /// How the broker was started.
    pub config: BrokerConfig,
    /// Topics and partitions.
    pub topics: Arc<TopicRegistry>,
    /// Cluster id, fixed when the data dir was first used.
    pub cluster_id: String,
    /// Consumer groups and committed offsets.
    pub groups: Arc<GroupService>,
    /// Transactions: the coordinator of the transactional ids this node holds.
    pub txns: Arc<crate::transactions::TxnService>,
    /// Share groups (KIP-932): membership, in-flight records, durable share state.
    pub(crate) shares: Arc<crate::share::ShareService>,
    /// What the log cleaner did.
    pub cleaner: CleanerMetrics,
    /// SCRAM credentials: what SASL checks passwords against.
    pub credentials: Arc<crate::security::CredentialStore>,
    /// Authentication outcomes.
    pub auth: crate::security::AuthMetrics,
    /// ACLs and the decisions made with them.
    pub authorizer: Arc<crate::security::Authorizer>,
    /// Broker-wide metrics.
    pub metrics: Arc<Registry>,
    /// Client quotas and their usage.
    pub quotas: Arc<crate::quotas::ClientQuotas>,
    /// Metrics clients push (KIP-714).
    pub telemetry: spate_telemetry::TelemetryStore,
    /// Memory for requests and responses in flight.
    pub budget: Arc<MemoryBudget>,
    /// Free space of the data dir: produce is refused while it is below the watermark.
    pub disk: Arc<crate::disk::DiskSpace>,
    /// A standalone broker's dynamic configs (the disk watermark set at run time).
    pub(crate) dynamic: crate::dynamic_configs::DynamicConfigs,
    /// Where every part of the broker reads time: wall time for timestamps and retention,
    /// monotonic time for timeouts and sessions.
    pub clock: SharedClock,
    pub(crate) producer_ids: ProducerIds,
    /// Incremental fetch sessions (KIP-227).
    pub(crate) fetch_sessions: crate::fetch_sessions::FetchSessions,
    flusher: Flusher,
    /// Set once the broker joins a cluster (cluster mode); standalone otherwise.
    pub(crate) cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
    /// What else may slow producers of a topic (search indexing), set once by it.
    back_pressure: std::sync::OnceLock<Arc<dyn crate::throttle::TopicBackPressure>>,
}

impl Broker {
    /// Lets `b` slow producers of the topics it names (once; later calls are ignored).
    pub fn set_back_pressure(&self, b: Arc<dyn crate::throttle::TopicBackPressure>) {
        let _ = self.back_pressure.set(b);
    }

    /// How long producers of these topics should wait before sending more, in milliseconds.
    fn back_pressure_ms<'a>(&self, topics: impl Iterator<Item = &'a str>) -> u64 {
        match self.back_pressure.get() {
            Some(b) => topics.map(|t| b.produce_throttle_ms(t)).max().unwrap_or(0),
            None => 0,
        }
    }

    /// Opens the data dir, recovering every log, on the system clock. Returns the broker and
    /// one line per repair.
    pub fn open(config: BrokerConfig) -> Result<(Arc<Self>, Vec<String>), BrokerError> {
        Self::open_with_clock(config, SystemClock::shared())
    }

    /// Opens the data dir like [`Broker::open`], reading time from `clock`.
    pub fn open_with_clock(
        config: BrokerConfig,
        clock: SharedClock,
    ) -> Result<(Arc<Self>, Vec<String>), BrokerError> {
        let dir = config.data_dir.clone();
        std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        let cluster_id = load_or_create_cluster_id(&dir, config.node_id)?;
        let metrics = Arc::new(Registry::default());
        let budget = MemoryBudget::new(config.memory_limit_bytes, metrics.clone());
        let flusher = Flusher::with_metrics(config.fsync, metrics.clone()).map_err(|source| {
            BrokerError::StartThread {
                name: "spate-flusher",
                source,
            }
        })?;
        let (topics, notes) = TopicRegistry::open(&dir, flusher.clone())?;
        let producer_ids = ProducerIds::open(&dir)?;
        let quotas = Arc::new(crate::quotas::ClientQuotas::open(&dir)?);
        let telemetry = spate_telemetry::TelemetryStore::new(
            config.telemetry_metrics.clone(),
            config.telemetry_push_interval_ms,
            TELEMETRY_MAX_BYTES,
        );
        let groups = Arc::new(if config.cluster_mode {
            // The offsets topic comes from the cluster's metadata.
            GroupService::new(config.groups.clone(), flusher.clone(), clock.clone())
        } else {
            GroupService::open_standalone(
                &dir,
                &topics,
                config.groups.clone(),
                flusher.clone(),
                clock.clone(),
            )?
        });
        let txns = Arc::new(if config.cluster_mode {
            crate::transactions::TxnService::new(
                config.txns.clone(),
                flusher.clone(),
                clock.clone(),
            )
        } else {
            crate::transactions::TxnService::open_standalone(
                &topics,
                config.txns.clone(),
                flusher.clone(),
                clock.clone(),
            )?
        });
        let shares = Arc::new(crate::share::ShareService::open(
            &topics,
            config.share,
            crate::share::group_configs::GroupConfigs::open(&config.data_dir)?,
            clock.clone(),
            config.fsync.acks_wait_for_fsync(),
            config.cluster_mode,
        )?);
        // A cluster keeps both in its replicated metadata (see `cluster::security`).
        let (credentials, authorizer) = if config.cluster_mode {
            (
                crate::security::CredentialStore::replicated(&config.data_dir),
                crate::security::Authorizer::replicated(
                    &config.data_dir,
                    config.security.authorizer,
                    config.security.acl.clone(),
                ),
            )
        } else {
            (
                crate::security::CredentialStore::open(
                    &config.data_dir,
                    &config.security.bootstrap_users,
                )?,
                crate::security::Authorizer::open(
                    &config.data_dir,
                    config.security.authorizer,
                    config.security.acl.clone(),
                )?,
            )
        };
        let (credentials, authorizer) = (Arc::new(credentials), Arc::new(authorizer));
        let dynamic = crate::dynamic_configs::DynamicConfigs::open(&dir)?;
        // Values set at run time (kafka-configs) win over the flags; a cluster keeps them in
        // its metadata instead, applied by the sampler.
        let watermark = if config.cluster_mode {
            config.disk_watermark
        } else {
            let set = dynamic.values();
            crate::dynamic_configs::watermark(config.disk_watermark, |k| {
                set.get(k).map(String::as_str)
            })
        };
        let disk = Arc::new(crate::disk::DiskSpace::new(dir.clone(), watermark));
        // The first sample before any produce; the server's sampler keeps it current.
        if let Err(e) = disk.sample() {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot read the data dir's free space");
        }
        // A deleted topic's files go on a thread of their own: sample when they are gone, so
        // produce resumes then rather than at the next periodic sample.
        let freed = Arc::downgrade(&disk);
        topics.on_space_freed(Arc::new(move || {
            if let Some(d) = freed.upgrade() {
                d.resample();
            }
        }));
        let broker = Arc::new(Self {
            config,
            topics: Arc::new(topics),
            cluster_id,
            groups,
            txns,
            shares,
            cleaner: CleanerMetrics::default(),
            credentials,
            auth: Default::default(),
            authorizer,
            metrics,
            quotas,
            telemetry,
            budget,
            disk,
            dynamic,
            clock,
            producer_ids,
            fetch_sessions: Default::default(),
            flusher,
            cluster: std::sync::OnceLock::new(),
            back_pressure: std::sync::OnceLock::new(),
        });
        Ok((broker, notes))
    }

    /// Each share group's records on this broker (for /metrics).
    pub fn share_group_stats(&self) -> Vec<crate::ShareGroupStats> {
        self.shares.group_stats()
    }

    /// Flushes outstanding writes and saves producer states and logs so the next start is
    /// quick; call before exit.
    pub fn shutdown(&self) {
        self.flusher.shutdown();
        let partitions: Vec<(Arc<Topic>, Arc<Partition>)> = self
            .topics
            .list()
            .into_iter()
            .flat_map(|t| t.partitions().into_iter().map(move |p| (t.clone(), p)))
            .collect();
        // Each partition's part is a few fsyncs, which run side by side here. What stays
        // serial is ext4 allocating inodes for the new index and marker files: a stop of
        // 2,000 busy partitions spends most of its time there (perf), not in fsync.
        side_by_side(&partitions, |(topic, p)| {
            if let Err(e) = p.write_producer_snapshot() {
                tracing::warn!(topic = %topic.name, partition = p.index, error = %e, "cannot save producer state");
            }
            if let Err(e) = p.close() {
                tracing::warn!(topic = %topic.name, partition = p.index, error = %e, "clean shutdown of log failed; it will be scanned on start");
            }
        });
        self.groups.close();
    }

    /// Saves every partition's producer states (see `Partition::write_producer_snapshot`).
    pub fn snapshot_producer_states(&self) {
        for topic in self.topics.list() {
            for p in topic.partitions() {
                if let Err(e) = p.write_producer_snapshot() {
                    tracing::warn!(topic = %topic.name, partition = p.index, error = %e, "cannot save producer state");
                }
            }
        }
    }

    /// Starts the background work: the group coordinator's clock, and retention on every
    /// partition (and offset expiry) every `retention_check_interval`, until the runtime stops.
    pub fn spawn_background(self: &Arc<Self>) {
        self.spawn_cleaner();
        self.groups.spawn_ticker();
        self.shares.spawn_ticker(self.topics.clone());
        self.txns.spawn_ticker(self);
        // Transactions that were ending when the broker stopped get their markers now.
        self.txns.attach(self);
        self.txns.resume();
        let broker = Arc::downgrade(self);
        let every = self.config.retention_check_interval;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(b) = broker.upgrade() else { return };
                let b2 = b.clone();
                let _ = tokio::task::spawn_blocking(move || b2.enforce_retention()).await;
            }
        });
        self.spawn_disk_sampler();
    }

    /// Samples the data dir's free space every [`DISK_SAMPLE_INTERVAL`] into the atomics the
    /// produce path reads, so a full disk refuses produce and freed space resumes it without
    /// a system call per request.
    fn spawn_disk_sampler(self: &Arc<Self>) {
        let disk = Arc::downgrade(&self.disk);
        let broker = Arc::downgrade(self);
        let in_flight = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(DISK_SAMPLE_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut warned = false;
            loop {
                tick.tick().await;
                let Some(d) = disk.upgrade() else { return };
                if let Some(b) = broker.upgrade() {
                    if let Some(c) = b.cluster.get() {
                        // A cluster's dynamic broker configs are in its metadata: a change
                        // made through any node applies here from this sample on.
                        let image = c.image();
                        let me = c.broker_id();
                        d.set_limits(crate::dynamic_configs::watermark(
                            b.config.disk_watermark,
                            |k| image.broker_config(Some(me), k),
                        ));
                    }
                }
                // statvfs may block on a slow file system: off the async workers.
                let sampled = tokio::task::spawn_blocking(move || d.sample()).await;
                match sampled {
                    Ok(Ok(_)) => warned = false,
                    Ok(Err(e)) if !warned => {
                        warned = true;
                        tracing::warn!(error = %e, "cannot read the data dir's free space");
                    }
                    _ => {}
                }
                if let Some(b) = broker.upgrade() {
                    b.report_disk_state(&in_flight);
                }
            }
        });
    }

    /// In a cluster, tells the quorum when this node's disk state differs from what the
    /// metadata says (a crossing either way), so the controller moves leaderships off a full
    /// disk and lets them come back; one proposal at a time, off the sampler (a quorum that
    /// does not answer must not stop the sampling that produce depends on).
    fn report_disk_state(&self, in_flight: &Arc<std::sync::atomic::AtomicBool>) {
        use std::sync::atomic::Ordering;
        let Some(c) = self.cluster.get().cloned() else {
            return;
        };
        let full = self.disk.is_full();
        let me = c.broker_id();
        let Some(epoch) = c
            .image()
            .broker(me)
            .filter(|r| r.disk_full != full)
            .map(|r| r.epoch)
        else {
            return;
        };
        if in_flight.swap(true, Ordering::SeqCst) {
            return;
        }
        let in_flight = in_flight.clone();
        tokio::spawn(async move {
            let cmd = spate_cluster::metadata::MetadataCommand::SetBrokerDiskFull {
                broker_id: me,
                broker_epoch: epoch,
                full,
            };
            match c.propose(cmd).await {
                Ok(_) => tracing::info!(
                    full,
                    "told the controller this node's disk is {}",
                    if full {
                        "full"
                    } else {
                        "above its watermark again"
                    }
                ),
                // Retried from the next sample while the metadata still differs.
                Err(e) => {
                    tracing::debug!(error = %e, "cannot record the disk state in the metadata")
                }
            }
            in_flight.store(false, Ordering::SeqCst);
        });
    }

    /// Starts the log cleaner: its own thread (never the request path), which every
    /// `log.cleaner.backoff.ms` cleans the compacted partitions that are due, until the broker
    /// is dropped. Each replica cleans its own log, as Kafka's do.
    fn spawn_cleaner(self: &Arc<Self>) {
        let broker = Arc::downgrade(self);
        let every = self.config.cleaner_backoff;
        let started = std::thread::Builder::new()
            .name("spate-cleaner".into())
            .spawn(move || {
                // As Kafka's cleaner: it waits log.cleaner.backoff.ms only when a pass found
                // nothing to clean; after work it looks again at once (a log may have more
                // dirty segments than one pass's key map covered, or got dirtier meanwhile).
                let mut idle = true;
                loop {
                    if idle {
                        std::thread::sleep(every);
                    }
                    let Some(b) = broker.upgrade() else { return };
                    idle = b.clean_compacted() == 0;
                }
            });
        if let Err(e) = started {
            tracing::error!(error = %e, "cannot start the log cleaner; compacted topics are not cleaned");
        }
    }

    /// One pass of the log cleaner over every compacted partition; how many it cleaned.
    pub fn clean_compacted(&self) -> usize {
        let mut cleaned = 0;
        let now = self.clock.now_ms();
        for topic in self.topics.list() {
            if !topic.with_config(|c| c.compacted()) {
                continue;
            }
            for p in topic.partitions() {
                let started = std::time::Instant::now();
                let outcome = p.clean(
                    now,
                    self.config.cleaner_buffer_bytes,
                    self.config.cleaner_io_bytes_per_sec,
                );
                if let Ok(Some(s)) = &outcome {
                    cleaned += 1;
                    let m = &self.cleaner;
                    m.passes.inc();
                    m.bytes_read.add(s.bytes_read);
                    m.bytes_removed.add(s.bytes_removed);
                    m.segments.add(s.segments as u64);
                    m.duration.observe(started.elapsed().as_micros() as u64);
                }
                if outcome.is_err() {
                    self.cleaner.failures.inc();
                }
                match outcome {
                    Ok(None) => {}
                    Ok(Some(s)) => tracing::info!(
                        topic = %topic.name,
                        partition = p.index,
                        segments = s.segments,
                        read = s.bytes_read,
                        removed = s.bytes_removed,
                        clean_point = s.clean_point,
                        "cleaned a compacted partition"
                    ),
                    Err(e) => {
                        tracing::error!(topic = %topic.name, partition = p.index, error = %e, "cleaning failed; retried at the next pass")
                    }
                }
            }
        }
        if cleaned > 0 {
            // Cleaning shrinks segments: produce refused for a full disk resumes at once.
            self.disk.resample();
        }
        cleaned
    }

    /// One retention pass over every partition, then offset expiry and producer-state
    /// snapshots.
    pub fn enforce_retention(&self) {
        self.groups.maintain();
        self.snapshot_producer_states();
        let now = self.clock.now_ms();
        let mut deleted = 0;
        for topic in self.topics.list() {
            for p in topic.partitions() {
                p.expire_producers(now);
                match p.enforce_retention(now) {
                    Ok(0) => {}
                    Ok(n) => {
                        deleted += n;
                        tracing::info!(topic = %topic.name, partition = p.index, segments = n, "retention deleted segments")
                    }
                    Err(e) => {
                        tracing::error!(topic = %topic.name, partition = p.index, error = %e, "retention failed")
                    }
                }
            }
        }
        if deleted > 0 {
            // Produce refused for a full disk resumes now, not at the next periodic sample.
            self.disk.resample();
        }
    }

    /// Handles one request frame (without its length prefix).
    pub fn handle(
        self: &Arc<Self>,
        frame: Bytes,
        rc: RequestContext<'_>,
    ) -> Result<Reply, RequestError> {
        let frame_len = frame.len();
        let started = std::time::Instant::now();
        // Before authentication only ApiVersions and the SASL exchange are read; anything else
        // closes the connection, its body never decoded (Kafka does the same).
        if let Some(s) = rc.session {
            let api_key = RawPrefix::peek(&frame).map_or(-1, |p| p.api_key);
            if let crate::security::Gate::Close(why) = s.gate(api_key) {
                self.auth.closed_unauthenticated.inc();
                return Err(RequestError::Unauthenticated { api_key, why });
            }
        }
        let (key, header, req) = match Request::decode(frame)? {
            Decoded::Request {
                key,
                header,
                request,
            } => (key, header, request),
            Decoded::Unsupported(prefix) => return Ok(Reply::Now(unsupported(prefix)?)),
        };
        let version = header.request_api_version;
        let ctx = Ctx {
            key,
            version,
            correlation_id: header.correlation_id,
        };
        // Answers naming brokers use the addresses of the listener the client came through.
        let listener = rc
            .session
            .map(|s| s.protocol())
            .filter(|_| !self.config.listeners.is_empty());
        // Quotas by user apply to the connection's principal (Kafka's user quota entity).
        let quota_user: std::borrow::Cow<'static, str> = match rc.session {
            Some(s) if self.quotas.is_active() => s.principal().name.into(),
            _ => ANONYMOUS.into(),
        };
        let charge = RequestCharge::new(
            self,
            started,
            header.client_id.as_deref().unwrap_or(""),
            quota_user.clone(),
            rc.mute.map(|m| &**m),
        );
        // A client over its controller mutation rate changes no topics (KIP-599).
        if let handlers::mutation_quota::Gate::Refuse(refusal) =
            handlers::mutation_quota::gate(self, &header, &req, rc.mute)
        {
            use handlers::mutation_quota::Refusal;
            return Ok(match refusal {
                Refusal::CreateTopics(r) => ctx.now(&charge, r)?,
                Refusal::CreatePartitions(r) => ctx.now(&charge, r)?,
                Refusal::DeleteTopics(r) => ctx.now(&charge, r)?,
            });
        }
        // Handlers that change topics or reserve producer ids touch the disk: they run on the
        // blocking pool so async workers never wait for it.
        // ACLs (a no-op without --authorizer acl): who the client is.
        let who = rc.session.map(|s| &**s);
        use crate::security::enforce;
        use spate_auth::acl::Operation as Op;
        let group_denied = |op: Op, group: &str| !enforce::group(self, who, op, group);
        let refused = ResponseError::GroupAuthorizationFailed.code();
        let txn_denied = |id: &str| {
            !self.authorizer.allows(
                who,
                Op::Write,
                spate_auth::acl::ResourceType::TransactionalId,
                id,
            )
        };
        let txn_refused = ResponseError::TransactionalIdAuthorizationFailed.code();
        let cluster_denied = |op: Op| {
            !self.authorizer.allows(
                who,
                op,
                spate_auth::acl::ResourceType::Cluster,
                spate_auth::acl::CLUSTER_NAME,
            )
        };
        let reply = match req {
            Request::ApiVersions(r) => ctx.now(&charge, handlers::api_versions::handle(version, r)),
            Request::Metadata(mut r) => {
                let all = r.topics.is_none()
                    || (version == 0 && r.topics.as_ref().is_some_and(|t| t.is_empty()));
                enforce::metadata_request(self, who, &mut r);
                let work = self.topology().metadata(self, version, r);
                let work = if self.authorizer.enabled() {
                    let (b, s) = (self.clone(), rc.session.cloned());
                    work.map(move |resp| enforce::metadata_response(&b, s.as_deref(), all, resp))
                } else {
                    work
                };
                let work = match listener {
                    Some(p) => {
                        let b = self.clone();
                        work.map(move |resp| crate::security::addresses::metadata(&b, p, resp))
                    }
                    None => work,
                };
                ctx.work(self, &charge, work)
            }
            Request::Produce(r)
                if r.acks != 0 && {
                    let asks = handlers::produce::txn_asks(self, version, &r);
                    !asks.is_empty()
                } =>
            {
                // Transactional batches to settle with the coordinator first (on another node,
                // or added on the producer's behalf): the connection reads nothing further
                // meanwhile, so pipelined batches of the same producer still land in order.
                let asks = handlers::produce::txn_asks(self, version, &r);
                let txn_id = r
                    .transactional_id
                    .as_ref()
                    .map(|t| t.to_string())
                    .unwrap_or_default();
                let b = self.clone();
                let throttle_ms = rc.throttle_ms;
                let ctx2 = ctx;
                let s = rc.session.cloned();
                Ok(Reply::Serial(Box::pin(async move {
                    let answers =
                        handlers::produce::settle_txn_asks(b.clone(), version, txn_id, asks).await;
                    let resp = handlers::produce::produce_verified(
                        &b,
                        s.as_deref(),
                        version,
                        throttle_ms,
                        r,
                        true,
                        handlers::produce::Verified::Asked(answers),
                    )
                    .await;
                    ctx2.encode(&resp)
                })))
            }
            Request::Produce(r) => {
                // Kafka counts the whole request against the producer byte rate.
                let client_id = header.client_id.as_deref().unwrap_or("");
                let quota_ms = self.quotas.record(
                    QuotaKind::Produce,
                    &quota_user,
                    client_id,
                    frame_len as f64,
                );
                // A topic's search index further behind than it allows slows its producers
                // as a quota does: a throttle time in the answer, and nothing read from the
                // connection meanwhile (KIP-219).
                let quota_ms = quota_ms
                    .max(self.back_pressure_ms(r.topic_data.iter().map(|t| t.name.as_str())));
                if let Some(m) = rc.mute {
                    m.mute_for(quota_ms);
                }
                let throttle_ms = rc.throttle_ms.max(clamp_ms(quota_ms));
                if r.acks != 0 && handlers::produce::recompresses(self, &r) {
                    // Recompressing into a topic's compression.type is CPU work: it runs on
                    // the blocking pool, and the connection reads nothing further meanwhile,
                    // so appends stay in request order.
                    let b = self.clone();
                    let version = header.request_api_version;
                    let s = rc.session.cloned();
                    Ok(Reply::Serial(Box::pin(async move {
                        let appended = tokio::task::spawn_blocking(move || {
                            handlers::produce::produce_by(&b, s.as_deref(), version, throttle_ms, r)
                        })
                        .await;
                        match appended {
                            Ok(answer) => ctx.encode(&answer.await),
                            Err(e) => {
                                tracing::error!(error = %e, "produce handler failed");
                                encode_bare_error(
                                    ctx.correlation_id,
                                    ResponseError::UnknownServerError.code(),
                                )
                            }
                        }
                    })))
                } else {
                    match handlers::produce::handle(
                        self,
                        rc.session.map(|s| &**s),
                        &header,
                        throttle_ms,
                        r,
                    ) {
                        Some(fut) => ctx.later(fut),
                        None => Ok(Reply::None),
                    }
                }
            }
            Request::Fetch(r) => {
                let r_is_consumer = r.replica_id.0 < 0 && r.replica_state.replica_id.0 < 0;
                let fetch = handlers::fetch::prepare(self, rc.session.map(|s| &**s), version, r);
                let b = self.clone();
                let throttle_ms = rc.throttle_ms;
                // Consumers' fetches count against their byte rate once their size is known;
                // followers' fetches have replication throttles instead.
                let quota = (self.quotas.is_active() && r_is_consumer).then(|| {
                    let client = header.client_id.as_deref().unwrap_or("").to_owned();
                    (client, quota_user.clone(), rc.mute.cloned())
                });
                Ok(Reply::Held {
                    memory: fetch.memory_wanted(),
                    start: Box::new(move |memory, waited_ms| -> HeldFrame {
                        let quotas = b.clone();
                        let served = handlers::fetch::serve(
                            b,
                            fetch,
                            memory,
                            throttle_ms.saturating_add(waited_ms),
                        );
                        Box::pin(served.map(move |(mut resp, memory)| {
                            if let Some((client, user, mute)) = quota {
                                let bytes = handlers::fetch::records_bytes(&resp);
                                let ms = quotas.quotas.record(
                                    QuotaKind::Fetch,
                                    &user,
                                    &client,
                                    bytes as f64,
                                );
                                if let Some(m) = mute {
                                    m.mute_for(ms);
                                }
                                resp.throttle_time_ms = resp.throttle_time_ms.max(clamp_ms(ms));
                            }
                            (ctx.encode(&resp), memory)
                        }))
                    }),
                })
            }
            Request::ListOffsets(r) => {
                let mut resp = handlers::list_offsets::handle(self, version, r);
                enforce::list_offsets_response(self, who, &mut resp);
                ctx.now(&charge, resp)
            }
            Request::CreateTopics(mut r) => {
                let denied = enforce::create_topics_request(self, who, &mut r);
                let work = self.topology().create_topics(self, version, r);
                let work = if denied.is_empty() {
                    work
                } else {
                    work.map(move |resp| enforce::create_topics_response(denied, resp))
                };
                ctx.work(self, &charge, work)
            }
            Request::DeleteTopics(mut r) => {
                let denied = enforce::delete_topics_request(self, who, &mut r);
                let work = self.topology().delete_topics(self, version, r);
                let work = if denied.is_empty() {
                    work
                } else {
                    work.map(move |resp| enforce::delete_topics_response(denied, resp))
                };
                ctx.work(self, &charge, work)
            }
            Request::CreatePartitions(mut r) => {
                let denied = enforce::create_partitions_request(self, who, &mut r);
                let work = self.topology().create_partitions(self, r);
                let work = if denied.is_empty() {
                    work
                } else {
                    work.map(move |resp| enforce::create_partitions_response(denied, resp))
                };
                ctx.work(self, &charge, work)
            }
            Request::DescribeConfigs(mut r) => {
                let denied = enforce::describe_configs_request(self, who, &mut r);
                let mut resp = handlers::configs::describe(self, version, r);
                enforce::describe_configs_response(denied, &mut resp);
                ctx.now(&charge, resp)
            }
            Request::AlterConfigs(mut r) => {
                let denied = enforce::alter_configs_request(self, who, &mut r);
                Ok(ctx.serial(self, move |b| {
                    let mut resp = handlers::configs::alter(b, r);
                    enforce::alter_configs_response(denied, &mut resp);
                    resp
                }))
            }
            Request::IncrementalAlterConfigs(mut r) => {
                let denied = enforce::incremental_alter_configs_request(self, who, &mut r);
                Ok(ctx.serial(self, move |b| {
                    let mut resp = handlers::configs::incremental_alter(b, r);
                    enforce::incremental_alter_configs_response(denied, &mut resp);
                    resp
                }))
            }
            Request::DescribeCluster(_) if cluster_denied(Op::Describe) => ctx.now(
                &charge,
                spate_protocol::messages::DescribeClusterResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            ),
            Request::DescribeQuorum(_) if cluster_denied(Op::Describe) => ctx.now(
                &charge,
                spate_protocol::messages::DescribeQuorumResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            ),
            Request::ElectLeaders(_) if version >= 1 && cluster_denied(Op::Alter) => ctx.now(
                &charge,
                spate_protocol::messages::ElectLeadersResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            ),
            Request::AlterPartitionReassignments(_) if cluster_denied(Op::Alter) => ctx.now(
                &charge,
                spate_protocol::messages::AlterPartitionReassignmentsResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            ),
            Request::ListPartitionReassignments(_) if cluster_denied(Op::Describe) => ctx.now(
                &charge,
                spate_protocol::messages::ListPartitionReassignmentsResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            ),
            Request::DescribeLogDirs(_) if version >= 3 && cluster_denied(Op::Describe) => {
                let resp = spate_protocol::messages::DescribeLogDirsResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code());
                if version >= 5 {
                    ctx.now(&charge, spate_protocol::newer::DescribeLogDirsV5(resp))
                } else {
                    ctx.now(&charge, resp)
                }
            }
            Request::DescribeClientQuotas(_) if cluster_denied(Op::DescribeConfigs) => ctx.now(
                &charge,
                spate_protocol::messages::DescribeClientQuotasResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            ),
            Request::DeleteRecords(mut r) if self.authorizer.enabled() => {
                let denied = enforce::delete_records_request(self, who, &mut r);
                let work = self
                    .topology()
                    .delete_records(self, r)
                    .map(move |resp| enforce::delete_records_response(denied, resp));
                ctx.work(self, &charge, work)
            }
            Request::DescribeCluster(r) => {
                let mut resp = handlers::cluster::describe(self, version, r);
                if self.authorizer.enabled()
                    && resp.cluster_authorized_operations != handlers::OPERATIONS_OMITTED
                {
                    resp.cluster_authorized_operations = enforce::authorized_operations(
                        self,
                        who,
                        spate_auth::acl::ResourceType::Cluster,
                        spate_auth::acl::CLUSTER_NAME,
                        &enforce::CLUSTER_OPS,
                    );
                }
                if let Some(p) = listener {
                    crate::security::addresses::describe_cluster(self, p, &mut resp);
                }
                ctx.now(&charge, resp)
            }
            Request::DescribeQuorum(r) => {
                ctx.later(handlers::quorum::describe(self.clone(), version, r))
            }
            Request::InitProducerId(r)
                if r.transactional_id
                    .as_deref()
                    .is_some_and(|id| txn_denied(id)) =>
            {
                ctx.now(
                    &charge,
                    spate_protocol::messages::InitProducerIdResponse::default()
                        .with_producer_id((-1).into())
                        .with_producer_epoch(-1)
                        .with_error_code(txn_refused),
                )
            }
            Request::InitProducerId(r)
                if r.transactional_id.is_none()
                    && self.authorizer.enabled()
                    && !self.authorizer.allows_idempotence(who) =>
            {
                ctx.now(
                    &charge,
                    spate_protocol::messages::InitProducerIdResponse::default()
                        .with_producer_id((-1).into())
                        .with_producer_epoch(-1)
                        .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
                )
            }
            Request::AddPartitionsToTxn(r)
                if version < 4 && txn_denied(&r.v3_and_below_transactional_id) =>
            {
                use spate_protocol::messages::add_partitions_to_txn_response::{
                    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
                };
                let mut resp = spate_protocol::messages::AddPartitionsToTxnResponse::default();
                for t in &r.v3_and_below_topics {
                    let mut rt = AddPartitionsToTxnTopicResult::default();
                    rt.name = t.name.clone();
                    for p in &t.partitions {
                        let mut rp = AddPartitionsToTxnPartitionResult::default();
                        rp.partition_index = *p;
                        rp.partition_error_code = txn_refused;
                        rt.results_by_partition.push(rp);
                    }
                    resp.results_by_topic_v3_and_below.push(rt);
                }
                ctx.now(&charge, resp)
            }
            Request::AddOffsetsToTxn(r) if txn_denied(&r.transactional_id) => ctx.now(
                &charge,
                spate_protocol::messages::AddOffsetsToTxnResponse::default()
                    .with_error_code(txn_refused),
            ),
            Request::EndTxn(r) if txn_denied(&r.transactional_id) => ctx.now(
                &charge,
                spate_protocol::messages::EndTxnResponse::default()
                    .with_producer_id((-1).into())
                    .with_producer_epoch(-1)
                    .with_error_code(txn_refused),
            ),
            Request::TxnOffsetCommit(r)
                if txn_denied(&r.transactional_id) || group_denied(Op::Read, &r.group_id) =>
            {
                use spate_protocol::messages::txn_offset_commit_response::{
                    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
                };
                let code = if txn_denied(&r.transactional_id) {
                    txn_refused
                } else {
                    refused
                };
                let mut resp = spate_protocol::messages::TxnOffsetCommitResponse::default();
                for t in &r.topics {
                    let mut rt = TxnOffsetCommitResponseTopic::default();
                    rt.name = t.name.clone();
                    for p in &t.partitions {
                        let mut rp = TxnOffsetCommitResponsePartition::default();
                        rp.partition_index = p.partition_index;
                        rp.error_code = code;
                        rt.partitions.push(rp);
                    }
                    resp.topics.push(rt);
                }
                ctx.now(&charge, resp)
            }
            Request::InitProducerId(r) if r.transactional_id.is_some() => {
                ctx.later(handlers::transactions::init_producer_id(self, version, r))
            }
            Request::InitProducerId(r) => {
                Ok(Reply::Later(ctx.on_blocking_pool(self, move |b| {
                    handlers::producer_ids::init(b, r)
                })))
            }
            // v4+ is sent by brokers only (KIP-890's verification).
            Request::AddPartitionsToTxn(_) if version >= 4 && cluster_denied(Op::ClusterAction) => {
                ctx.now(
                    &charge,
                    spate_protocol::messages::AddPartitionsToTxnResponse::default()
                        .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
                )
            }
            Request::AddPartitionsToTxn(r) => {
                ctx.later(handlers::transactions::add_partitions(self, version, r))
            }
            Request::AddOffsetsToTxn(r) => {
                ctx.later(handlers::transactions::add_offsets(self, version, r))
            }
            Request::EndTxn(r) => ctx.later(handlers::transactions::end_txn(self, version, r)),
            Request::TxnOffsetCommit(r) => {
                ctx.later(handlers::transactions::txn_offset_commit(self, version, r))
            }
            // Its answer has no throttle field, so it goes out as a ready future.
            Request::WriteTxnMarkers(r) if cluster_denied(Op::ClusterAction) => {
                ctx.later(std::future::ready(
                    crate::security::enforce_cluster::write_txn_markers_refused(&r),
                ))
            }
            Request::WriteTxnMarkers(r) => {
                ctx.later(handlers::transactions::write_txn_markers(self, r))
            }
            Request::DescribeTransactions(r) => {
                let mut resp = handlers::transactions::describe_transactions(self, r);
                for s in &mut resp.transaction_states {
                    if self.authorizer.enabled()
                        && !self.authorizer.allows(
                            who,
                            Op::Describe,
                            spate_auth::acl::ResourceType::TransactionalId,
                            &s.transactional_id,
                        )
                    {
                        let mut d = spate_protocol::messages::describe_transactions_response::TransactionState::default();
                        d.transactional_id = s.transactional_id.clone();
                        d.error_code = txn_refused;
                        *s = d;
                    }
                }
                ctx.now(&charge, resp)
            }
            Request::ListTransactions(r) => {
                let mut resp = handlers::transactions::list_transactions(self, version, r);
                if self.authorizer.enabled() {
                    resp.transaction_states.retain(|s| {
                        self.authorizer.allows(
                            who,
                            Op::Describe,
                            spate_auth::acl::ResourceType::TransactionalId,
                            &s.transactional_id,
                        )
                    });
                }
                ctx.now(&charge, resp)
            }
            Request::DescribeProducers(r) => {
                let mut resp = handlers::transactions::describe_producers(self, r);
                for t in &mut resp.topics {
                    if self.authorizer.enabled()
                        && !self.authorizer.allows(
                            who,
                            Op::Read,
                            spate_auth::acl::ResourceType::Topic,
                            &t.name,
                        )
                    {
                        for p in &mut t.partitions {
                            p.error_code = ResponseError::TopicAuthorizationFailed.code();
                            p.active_producers.clear();
                        }
                    }
                }
                ctx.now(&charge, resp)
            }
            Request::FindCoordinator(r) => {
                // Describe on the group (key type 0) or transactional id (1) is needed.
                let (rt, code) = if r.key_type == 1 {
                    (spate_auth::acl::ResourceType::TransactionalId, txn_refused)
                } else {
                    (spate_auth::acl::ResourceType::Group, refused)
                };
                let hidden = |key: &str| !self.authorizer.allows(who, Op::Describe, rt, key);
                let single_key = r.key.to_string();
                let mut resp = handlers::groups::find_coordinator(self, version, r);
                if self.authorizer.enabled() {
                    if resp.coordinators.is_empty() && hidden(&single_key) {
                        resp.error_code = code;
                        resp.node_id = (-1).into();
                        resp.host = Default::default();
                        resp.port = -1;
                    }
                    for c in &mut resp.coordinators {
                        if hidden(&c.key) {
                            c.error_code = code;
                            c.node_id = (-1).into();
                            c.host = Default::default();
                            c.port = -1;
                        }
                    }
                }
                if let Some(p) = listener {
                    crate::security::addresses::find_coordinator(self, p, &mut resp);
                }
                ctx.now(&charge, resp)
            }
            Request::JoinGroup(r) if group_denied(Op::Read, &r.group_id) => ctx.now(
                &charge,
                spate_protocol::messages::JoinGroupResponse::default().with_error_code(refused),
            ),
            Request::SyncGroup(r) if group_denied(Op::Read, &r.group_id) => ctx.now(
                &charge,
                spate_protocol::messages::SyncGroupResponse::default().with_error_code(refused),
            ),
            Request::Heartbeat(r) if group_denied(Op::Read, &r.group_id) => ctx.now(
                &charge,
                spate_protocol::messages::HeartbeatResponse::default().with_error_code(refused),
            ),
            Request::LeaveGroup(r) if group_denied(Op::Read, &r.group_id) => ctx.now(
                &charge,
                spate_protocol::messages::LeaveGroupResponse::default().with_error_code(refused),
            ),
            Request::OffsetCommit(r) if group_denied(Op::Read, &r.group_id) => {
                ctx.now(&charge, enforce::offset_commit_refused(&r))
            }
            Request::ConsumerGroupHeartbeat(r) if group_denied(Op::Read, &r.group_id) => ctx.now(
                &charge,
                spate_protocol::messages::ConsumerGroupHeartbeatResponse::default()
                    .with_error_code(refused),
            ),
            // A share group's id cannot be used by a consumer or classic group.
            Request::ConsumerGroupHeartbeat(r) if self.shares.has_group(&r.group_id) => {
                let mut resp = spate_protocol::messages::ConsumerGroupHeartbeatResponse::default()
                    .with_error_code(spate_protocol::ResponseError::GroupIdNotFound.code());
                resp.error_message = Some(spate_protocol::StrBytes::from_string(format!(
                    "Group {} is not a consumer group.",
                    &*r.group_id
                )));
                ctx.now(&charge, resp)
            }
            Request::JoinGroup(r) if self.shares.has_group(&r.group_id) => ctx.now(
                &charge,
                spate_protocol::messages::JoinGroupResponse::default().with_error_code(
                    spate_protocol::ResponseError::InconsistentGroupProtocol.code(),
                ),
            ),
            Request::ShareGroupHeartbeat(r) if group_denied(Op::Read, &r.group_id) => ctx.now(
                &charge,
                spate_protocol::messages::ShareGroupHeartbeatResponse::default()
                    .with_error_code(refused),
            ),
            Request::ShareFetch(r)
                if r.group_id
                    .as_ref()
                    .is_some_and(|g| group_denied(Op::Read, g)) =>
            {
                ctx.now(
                    &charge,
                    spate_protocol::messages::ShareFetchResponse::default()
                        .with_error_code(refused),
                )
            }
            Request::ShareAcknowledge(r)
                if r.group_id
                    .as_ref()
                    .is_some_and(|g| group_denied(Op::Read, g)) =>
            {
                ctx.now(
                    &charge,
                    spate_protocol::messages::ShareAcknowledgeResponse::default()
                        .with_error_code(refused),
                )
            }
            Request::OffsetFetch(r) if version < 8 && group_denied(Op::Describe, &r.group_id) => {
                let mut resp = spate_protocol::messages::OffsetFetchResponse::default();
                if version >= 2 {
                    resp.error_code = refused;
                } else {
                    use spate_protocol::messages::offset_fetch_response::{
                        OffsetFetchResponsePartition, OffsetFetchResponseTopic,
                    };
                    for t in r.topics.iter().flatten() {
                        let mut rt = OffsetFetchResponseTopic::default();
                        rt.name = t.name.clone();
                        for p in &t.partition_indexes {
                            let mut rp = OffsetFetchResponsePartition::default();
                            rp.partition_index = *p;
                            rp.committed_offset = -1;
                            rp.error_code = refused;
                            rt.partitions.push(rp);
                        }
                        resp.topics.push(rt);
                    }
                }
                ctx.now(&charge, resp)
            }
            Request::OffsetFetch(mut r) if version >= 8 && self.authorizer.enabled() => {
                let denied = enforce::offset_fetch_request(self, who, &mut r);
                let mut resp = handlers::offsets::fetch(self, version, r);
                enforce::offset_fetch_response(denied, &mut resp);
                ctx.now(&charge, resp)
            }
            Request::DescribeGroups(r) if self.authorizer.enabled() => {
                let mut resp = handlers::groups::describe(self, version, r);
                for g in &mut resp.groups {
                    if group_denied(Op::Describe, &g.group_id) {
                        let mut d = spate_protocol::messages::describe_groups_response::DescribedGroup::default();
                        d.group_id = g.group_id.clone();
                        d.error_code = refused;
                        *g = d;
                    }
                }
                ctx.now(&charge, resp)
            }
            Request::ListGroups(r) if self.authorizer.enabled() => {
                let mut resp = handlers::groups::list(self, version, r);
                enforce::list_groups_response(self, who, &mut resp);
                ctx.now(&charge, resp)
            }
            Request::DeleteGroups(mut r) if self.authorizer.enabled() => {
                let mut denied = Vec::new();
                r.groups_names.retain(|g| {
                    let ok = !group_denied(Op::Delete, g);
                    if !ok {
                        denied.push(g.clone());
                    }
                    ok
                });
                let mut resp = handlers::groups::delete(self, r);
                for g in denied {
                    let mut d = spate_protocol::messages::delete_groups_response::DeletableGroupResult::default();
                    d.group_id = g;
                    d.error_code = refused;
                    resp.results.push(d);
                }
                ctx.now(&charge, resp)
            }
            Request::JoinGroup(r) => {
                let client_id = header.client_id.as_deref().unwrap_or("");
                ctx.later(handlers::groups::join(self, version, client_id, rc.peer, r))
            }
            Request::SyncGroup(r) => ctx.later(handlers::groups::sync(self, version, r)),
            Request::Heartbeat(r) => ctx.now(&charge, handlers::groups::heartbeat(self, r)),
            Request::LeaveGroup(r) => ctx.now(&charge, handlers::groups::leave(self, version, r)),
            Request::OffsetCommit(mut r) if self.authorizer.enabled() => {
                use crate::security::enforce_cluster as ec;
                let denied = ec::offset_commit_request(self, who, &mut r);
                let commit = handlers::offsets::commit(self, version, r);
                ctx.later(async move {
                    let mut resp = commit.await;
                    ec::offset_commit_response(denied, &mut resp);
                    resp
                })
            }
            Request::OffsetCommit(r) => ctx.later(handlers::offsets::commit(self, version, r)),
            Request::OffsetFetch(r) => ctx.now(&charge, handlers::offsets::fetch(self, version, r)),
            Request::DescribeGroups(r) => {
                ctx.now(&charge, handlers::groups::describe(self, version, r))
            }
            Request::ListGroups(r) => ctx.now(&charge, handlers::groups::list(self, version, r)),
            Request::DeleteGroups(r) => ctx.now(&charge, handlers::groups::delete(self, r)),
            Request::OffsetDelete(r) if group_denied(Op::Delete, &r.group_id) => ctx.now(
                &charge,
                spate_protocol::messages::OffsetDeleteResponse::default().with_error_code(refused),
            ),
            Request::OffsetDelete(r) => ctx.now(&charge, handlers::offsets::delete(self, r)),
            Request::ConsumerGroupHeartbeat(r) => {
                let client_id = header.client_id.as_deref().unwrap_or("");
                ctx.later(handlers::consumer_groups::heartbeat(
                    self, version, client_id, rc.peer, r,
                ))
            }
            Request::ShareGroupHeartbeat(r) => {
                let client_id = header.client_id.as_deref().unwrap_or("");
                ctx.later(handlers::share_groups::heartbeat(
                    self, client_id, rc.peer, r,
                ))
            }
            Request::ShareGroupDescribe(r) => {
                let mut resp = handlers::share_groups::describe(self, r);
                for g in &mut resp.groups {
                    if group_denied(Op::Describe, &g.group_id) {
                        let mut d = spate_protocol::messages::share_group_describe_response::DescribedGroup::default();
                        d.group_id = g.group_id.clone();
                        d.error_code = refused;
                        *g = d;
                    }
                }
                ctx.now(&charge, resp)
            }
            Request::ShareFetch(r) => ctx.later(handlers::share_groups::fetch(self, r)),
            Request::AlterShareGroupOffsets(r) if group_denied(Op::Read, &r.group_id) => ctx.now(
                &charge,
                spate_protocol::messages::AlterShareGroupOffsetsResponse::default()
                    .with_error_code(refused),
            ),
            Request::AlterShareGroupOffsets(r) => {
                ctx.later(handlers::share_groups::alter_offsets(self, r))
            }
            Request::DeleteShareGroupOffsets(r) if group_denied(Op::Delete, &r.group_id) => ctx
                .now(
                    &charge,
                    spate_protocol::messages::DeleteShareGroupOffsetsResponse::default()
                        .with_error_code(refused),
                ),
            Request::DeleteShareGroupOffsets(r) => {
                ctx.later(handlers::share_groups::delete_offsets(self, r))
            }
            Request::DescribeShareGroupOffsets(r) => {
                let denied: Vec<_> = r
                    .groups
                    .iter()
                    .filter(|g| group_denied(Op::Describe, &g.group_id))
                    .map(|g| g.group_id.clone())
                    .collect();
                let work = handlers::share_groups::describe_offsets(self, r);
                ctx.later(async move {
                    let mut resp = work.await;
                    for g in &mut resp.groups {
                        if denied.contains(&g.group_id) {
                            g.topics.clear();
                            g.error_code = refused;
                        }
                    }
                    resp
                })
            }
            Request::ShareAcknowledge(r) => ctx.later(handlers::share_groups::acknowledge(self, r)),
            // The share coordinator's APIs are the cluster's own traffic: without ClusterAction
            // every share-partition is refused. Their answers have no throttle field, so they
            // go out as futures.
            Request::InitializeShareGroupState(r) => {
                let allowed = !cluster_denied(Op::ClusterAction);
                ctx.later(handlers::share_state::initialize(self, allowed, r))
            }
            Request::ReadShareGroupState(r) => {
                let allowed = !cluster_denied(Op::ClusterAction);
                ctx.later(std::future::ready(handlers::share_state::read(
                    self, allowed, r,
                )))
            }
            Request::WriteShareGroupState(r) => {
                let allowed = !cluster_denied(Op::ClusterAction);
                ctx.later(handlers::share_state::write(self, allowed, r))
            }
            Request::DeleteShareGroupState(r) => {
                let allowed = !cluster_denied(Op::ClusterAction);
                ctx.later(handlers::share_state::delete(self, allowed, r))
            }
            Request::ReadShareGroupStateSummary(r) => {
                let allowed = !cluster_denied(Op::ClusterAction);
                ctx.later(std::future::ready(handlers::share_state::summary(
                    self, allowed, r,
                )))
            }
            Request::ConsumerGroupDescribe(r) => {
                let mut resp = handlers::consumer_groups::describe(self, version, r);
                for g in &mut resp.groups {
                    if group_denied(Op::Describe, &g.group_id) {
                        let mut d = spate_protocol::messages::consumer_group_describe_response::DescribedGroup::default();
                        d.group_id = g.group_id.clone();
                        d.error_code = refused;
                        *g = d;
                    }
                }
                ctx.now(&charge, resp)
            }
            Request::OffsetForLeaderEpoch(mut r) if self.authorizer.enabled() => {
                use crate::security::enforce_cluster as ec;
                let denied = ec::offset_for_leader_epoch_request(self, who, &mut r);
                let mut resp = handlers::leader_epochs::handle(self, version, r);
                ec::offset_for_leader_epoch_response(denied, &mut resp);
                ctx.now(&charge, resp)
            }
            Request::OffsetForLeaderEpoch(r) => {
                ctx.now(&charge, handlers::leader_epochs::handle(self, version, r))
            }
            Request::AlterPartitionReassignments(r) => ctx.work(
                self,
                &charge,
                self.topology().alter_reassignments(self, version, r),
            ),
            Request::ListPartitionReassignments(r) => {
                ctx.now(&charge, self.topology().list_reassignments(r))
            }
            Request::DescribeLogDirs(r) if version >= 5 => ctx.now(
                &charge,
                spate_protocol::newer::DescribeLogDirsV5(handlers::log_dirs::handle(self, r)),
            ),
            Request::DescribeLogDirs(r) => ctx.now(&charge, handlers::log_dirs::handle(self, r)),
            Request::AlterReplicaLogDirs(r) if cluster_denied(Op::Alter) => ctx.now(
                &charge,
                crate::security::enforce_cluster::alter_replica_log_dirs_refused(&r),
            ),
            Request::AlterReplicaLogDirs(r) => ctx.now(&charge, handlers::log_dirs::alter(self, r)),
            Request::DeleteRecords(r) => {
                ctx.work(self, &charge, self.topology().delete_records(self, r))
            }
            Request::DescribeTopicPartitions(r) => {
                let listing = r.topics.is_empty();
                let mut resp = handlers::topic_partitions::handle(self, r);
                if self.authorizer.enabled() {
                    let denied = |name: &str| {
                        !self.authorizer.allows(
                            who,
                            Op::Describe,
                            spate_auth::acl::ResourceType::Topic,
                            name,
                        )
                    };
                    if listing {
                        resp.topics
                            .retain(|t| t.name.as_ref().is_none_or(|n| !denied(n)));
                    } else {
                        for t in &mut resp.topics {
                            if t.name.as_ref().is_some_and(|n| denied(n)) {
                                t.error_code = ResponseError::TopicAuthorizationFailed.code();
                                t.partitions.clear();
                                t.topic_id = Default::default();
                            }
                        }
                    }
                }
                ctx.now(&charge, resp)
            }
            Request::DescribeClientQuotas(r) => {
                ctx.now(&charge, handlers::client_quotas::describe(self, r))
            }
            Request::GetTelemetrySubscriptions(r) => {
                ctx.now(&charge, handlers::telemetry::subscriptions(self, r))
            }
            Request::PushTelemetry(r) => ctx.now(&charge, handlers::telemetry::push(self, r)),
            Request::DescribeUserScramCredentials(_) if cluster_denied(Op::Describe) => ctx.now(
                &charge,
                spate_protocol::messages::DescribeUserScramCredentialsResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code())
                    .with_error_message(Some(spate_protocol::StrBytes::from_static_str(
                        "Describe on the cluster is needed to describe SCRAM credentials",
                    ))),
            ),
            Request::AlterUserScramCredentials(r) if cluster_denied(Op::Alter) => {
                use spate_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
                let mut resp =
                    spate_protocol::messages::AlterUserScramCredentialsResponse::default();
                let users: std::collections::BTreeSet<String> = r
                    .deletions
                    .iter()
                    .map(|d| d.name.to_string())
                    .chain(r.upsertions.iter().map(|u| u.name.to_string()))
                    .collect();
                for user in users {
                    let mut u = AlterUserScramCredentialsResult::default();
                    u.user = spate_protocol::StrBytes::from_string(user);
                    u.error_code = ResponseError::ClusterAuthorizationFailed.code();
                    resp.results.push(u);
                }
                ctx.now(&charge, resp)
            }
            Request::DescribeUserScramCredentials(r) => {
                ctx.now(&charge, handlers::scram_credentials::describe(self, r))
            }
            Request::AlterUserScramCredentials(r) => {
                Ok(ctx.serial(self, move |b| handlers::scram_credentials::alter(b, r)))
            }
            Request::DescribeAcls(r) => ctx.now(
                &charge,
                handlers::acls::describe(self, rc.session.map(|s| &**s), r),
            ),
            Request::CreateAcls(r) => {
                let s = rc.session.cloned();
                Ok(ctx.serial(self, move |b| handlers::acls::create(b, s.as_deref(), r)))
            }
            Request::DeleteAcls(r) => {
                let s = rc.session.cloned();
                Ok(ctx.serial(self, move |b| handlers::acls::delete(b, s.as_deref(), r)))
            }
            Request::SaslHandshake(r) => {
                let s = session_or_plaintext(rc.session);
                ctx.now(&charge, handlers::sasl::handshake(self, &s, version, r))
            }
            Request::SaslAuthenticate(r) => {
                // PBKDF2 for PLAIN, HMACs for SCRAM: CPU work for the blocking pool; the
                // connection reads nothing further until it is answered.
                let s = session_or_plaintext(rc.session);
                Ok(ctx.serial(self, move |b| {
                    handlers::sasl::authenticate(b, &s, version, r)
                }))
            }
            Request::AlterClientQuotas(r) if cluster_denied(Op::AlterConfigs) => ctx.now(
                &charge,
                crate::security::enforce_cluster::alter_client_quotas_refused(&r),
            ),
            Request::AlterClientQuotas(r) => {
                Ok(ctx.serial(self, move |b| handlers::client_quotas::alter(b, r)))
            }
            Request::ListConfigResources(r) => ctx.now(
                &charge,
                handlers::config_resources::handle(self, version, r),
            ),
            Request::ElectLeaders(r) => ctx.work(
                self,
                &charge,
                self.topology().elect_leaders(self, version, r),
            ),
        };
        // Replies built later (on the blocking pool, or after waits) are charged for the time
        // spent here; the throttle reaches the client through the mute.
        charge.charge();
        Ok(reply?)
    }

    /// Whether answering this Metadata request may auto-create a topic (the rule
    /// `handlers::metadata` applies), which makes directories and fsyncs.
    pub(crate) fn metadata_may_create(&self, version: i16, r: &MetadataRequest) -> bool {
        let allowed =
            self.config.auto_create_topics && (version < 4 || r.allow_auto_topic_creation);
        allowed
            && r.topics.as_ref().is_some_and(|ts| {
                ts.iter()
                    .filter_map(|t| t.name.as_ref())
                    .any(|n| self.topics.get(n).is_none())
            })
    }
}

/// The log cleaner's work, for the Prometheus endpoint.
#[derive(Debug)]
pub struct CleanerMetrics {
    /// Cleans of a partition that ran.
    pub passes: spate_metrics::Counter,
    /// Cleans that failed (retried at the next pass).
    pub failures: spate_metrics::Counter,
    /// Bytes of segments read by cleans.
    pub bytes_read: spate_metrics::Counter,
    /// Bytes cleans removed.
    pub bytes_removed: spate_metrics::Counter,
    /// Segments rewritten.
    pub segments: spate_metrics::Counter,
    /// Time per clean of a partition (µs).
    pub duration: spate_metrics::Histogram,
}

impl Default for CleanerMetrics {
    fn default() -> Self {
        Self {
            passes: Default::default(),
            failures: Default::default(),
            bytes_read: Default::default(),
            bytes_removed: Default::default(),
            segments: Default::default(),
            duration: spate_metrics::Histogram::latency(),
        }
    }
}

/// Largest telemetry push accepted (Kafka's default `telemetry.max.bytes`).
const TELEMETRY_MAX_BYTES: u32 = 1 << 20;

/// A throttle time as the protocol's i32 milliseconds.
/// The connection's session, or (for callers without one: tests, internal calls) that of an
/// unauthenticated PLAINTEXT connection, on which SASL requests are refused.
fn session_or_plaintext(
    session: Option<&Arc<crate::security::Session>>,
) -> Arc<crate::security::Session> {
    session.cloned().unwrap_or_else(|| {
        Arc::new(crate::security::Session::new(
            crate::security::SecurityProtocol::Plaintext,
            None,
            None,
        ))
    })
}

fn clamp_ms(ms: u64) -> i32 {
    i32::try_from(ms).unwrap_or(i32::MAX)
}

/// The answer to a key or version we do not serve.
fn unsupported(prefix: RawPrefix) -> Result<Bytes, CodecError> {
    tracing::debug!(
        api_key = prefix.api_key,
        version = prefix.api_version,
        "unsupported API or version"
    );
    if prefix.api_key == ApiKey::ApiVersions as i16 {
        // KIP-511: answer in v0 with the error and our ranges so the client can retry.
        let resp = handlers::api_versions::unsupported();
        return encode_response(ApiKey::ApiVersions, 0, prefix.correlation_id, &resp);
    }
    Ok(encode_bare_error(
        prefix.correlation_id,
        ResponseError::UnsupportedVersion.code(),
    ))
}

/// What the encoder needs to frame a response.
#[derive(Clone, Copy)]
struct Ctx {
    key: ApiKey,
    version: i16,
    correlation_id: i32,
}

impl Ctx {
    /// Encodes an answer ready now, carrying the request quota's throttle.
    fn now<T: Encodable + Throttled>(
        &self,
        charge: &RequestCharge<'_>,
        mut body: T,
    ) -> Result<Reply, CodecError> {
        body.raise_throttle(charge.charge());
        encode_response(self.key, self.version, self.correlation_id, &body).map(Reply::Now)
    }

    fn later<T, F>(&self, fut: F) -> Result<Reply, CodecError>
    where
        T: Encodable + Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let ctx = *self;
        Ok(Reply::Later(Box::pin(
            fut.map(move |body| ctx.encode(&body)),
        )))
    }

    /// Answers `work` the way it asks: now, on the blocking pool, or once the quorum answers
    /// (the last two before the connection's next request; see [`Reply::Serial`]).
    fn work<T>(
        &self,
        b: &Arc<Broker>,
        charge: &RequestCharge<'_>,
        work: Work<T>,
    ) -> Result<Reply, CodecError>
    where
        T: Encodable + Throttled + Send + 'static,
    {
        match work {
            Work::Now(body) => self.now(charge, body),
            Work::Blocking(f) => Ok(self.serial(b, f)),
            Work::Quorum(fut) => Ok(self.serial_async(fut)),
        }
    }

    /// Runs `f` on the blocking pool; see [`Reply::Serial`].
    fn serial<T, F>(&self, b: &Arc<Broker>, f: F) -> Reply
    where
        T: Encodable + Send + 'static,
        F: FnOnce(&Broker) -> T + Send + 'static,
    {
        Reply::Serial(self.on_blocking_pool(b, f))
    }

    /// A future whose answer must come before the connection's next request (a topic change
    /// through the quorum); see [`Reply::Serial`].
    fn serial_async<T, F>(&self, fut: F) -> Reply
    where
        T: Encodable + Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let ctx = *self;
        Reply::Serial(Box::pin(fut.map(move |body| ctx.encode(&body))))
    }

    /// The encoded answer of `f`, run on the blocking pool.
    fn on_blocking_pool<T, F>(&self, b: &Arc<Broker>, f: F) -> LaterFrame
    where
        T: Encodable + Send + 'static,
        F: FnOnce(&Broker) -> T + Send + 'static,
    {
        let ctx = *self;
        let b = b.clone();
        Box::pin(async move {
            match tokio::task::spawn_blocking(move || f(&b)).await {
                Ok(body) => ctx.encode(&body),
                Err(e) => {
                    tracing::error!(api = ?ctx.key, error = %e, "request handler failed");
                    encode_bare_error(ctx.correlation_id, ResponseError::UnknownServerError.code())
                }
            }
        })
    }

    fn encode<T: Encodable>(&self, body: &T) -> Bytes {
        encode_response(self.key, self.version, self.correlation_id, body).unwrap_or_else(|e| {
            // A handler built a response its version cannot carry: a bug, but the client
            // still gets an answer rather than a silent hang.
            tracing::error!(error = %e, "cannot encode response");
            encode_bare_error(
                self.correlation_id,
                ResponseError::UnknownServerError.code(),
            )
        })
    }
}

/// A response frame on its way.
type LaterFrame = Pin<Box<dyn Future<Output = Bytes> + Send + 'static>>;

/// Kafka prints cluster ids as 22 characters of URL-safe base64 of a UUID.
fn load_or_create_cluster_id(dir: &Path, node_id: i32) -> Result<String, BrokerError> {
    let path = dir.join("node.json");
    match std::fs::read(&path) {
        Ok(raw) => {
            let f: NodeFile =
                serde_json::from_slice(&raw).map_err(|e| BrokerError::CorruptMetadata {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            Ok(f.cluster_id)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = crate::topology::cluster_id_text(uuid::Uuid::new_v4().as_bytes());
            let f = NodeFile {
                cluster_id: id.clone(),
                node_id,
            };
            let json = serde_json::to_vec_pretty(&f).map_err(|e| BrokerError::CorruptMetadata {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            write_atomically(&path, &json)?;
            Ok(id)
        }
        Err(e) => Err(io("read", &path)(e)),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use bytes::Buf;
    use spate_protocol::messages::create_topics_request::CreatableTopic;
    use spate_protocol::messages::metadata_request::MetadataRequestTopic;
    use spate_protocol::messages::{
        CreateTopicsRequest, CreateTopicsResponse, RequestHeader, ResponseHeader, TopicName,
    };
    use spate_protocol::{Decodable, StrBytes};

    /// A broker on a fresh data dir (kept alive by the returned guard).
    pub(crate) fn broker() -> (Arc<Broker>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let config = BrokerConfig::new(dir.path().join("data"), "127.0.0.1", 9092);
        let (b, _) = Broker::open(config).unwrap();
        (b, dir)
    }

    /// A request frame (without its length prefix).
    pub(crate) fn frame<T: Encodable>(key: ApiKey, version: i16, body: &T) -> Bytes {
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(11);
        spate_protocol::codec::encode_request(&header, body).unwrap()
    }

    /// Runs a reply to its response frame.
    pub(crate) async fn response(reply: Reply) -> Bytes {
        match reply {
            Reply::Now(b) => b,
            Reply::Later(f) | Reply::Serial(f) => f.await,
            Reply::Held { memory, start } => {
                assert!(memory.is_none(), "test fetches read nothing");
                start(None, 0).await.0
            }
            Reply::None => panic!("no response"),
        }
    }

    /// Decodes a response frame (with its length prefix).
    pub(crate) fn decode<T: Decodable>(key: ApiKey, version: i16, mut frame: Bytes) -> T {
        frame.advance(4);
        ResponseHeader::decode(&mut frame, key.response_header_version(version)).unwrap();
        T::decode(&mut frame, version).unwrap()
    }

    fn create_topics(name: &str) -> CreateTopicsRequest {
        let mut t = CreatableTopic::default();
        t.name = TopicName(StrBytes::from_string(name.to_string()));
        t.num_partitions = 3;
        t.replication_factor = 1;
        let mut r = CreateTopicsRequest::default();
        r.topics = vec![t];
        r.timeout_ms = 10_000;
        r
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_create_topics_of_one_name_answer_once_created_and_else_already_exists() {
        let (b, _dir) = broker();
        let replies: Vec<Reply> = (0..8)
            .map(|_| {
                let f = frame(ApiKey::CreateTopics, 7, &create_topics("dup"));
                b.handle(f, RequestContext::default()).unwrap()
            })
            .collect();
        assert!(
            replies.iter().all(|r| matches!(r, Reply::Serial(_))),
            "topic creation runs on the blocking pool, in order with the connection's requests"
        );
        let answers = futures::future::join_all(replies.into_iter().map(response)).await;
        let codes: Vec<i16> = answers
            .into_iter()
            .map(|f| {
                decode::<CreateTopicsResponse>(ApiKey::CreateTopics, 7, f).topics[0].error_code
            })
            .collect();
        let ok = codes.iter().filter(|c| **c == 0).count();
        let exists = codes
            .iter()
            .filter(|c| **c == ResponseError::TopicAlreadyExists.code())
            .count();
        assert_eq!((ok, exists), (1, 7), "{codes:?}");
        assert_eq!(b.topics.get("dup").unwrap().partition_count(), 3);
    }

    #[tokio::test]
    async fn metadata_goes_to_the_blocking_pool_only_when_it_may_create_a_topic() {
        let (b, _dir) = broker();
        let ask = |name: &str| {
            let mut t = MetadataRequestTopic::default();
            t.name = Some(TopicName(StrBytes::from_string(name.to_string())));
            let mut r = MetadataRequest::default();
            r.topics = Some(vec![t]);
            r.allow_auto_topic_creation = true;
            frame(ApiKey::Metadata, 12, &r)
        };
        let reply = b.handle(ask("fresh"), RequestContext::default()).unwrap();
        assert!(matches!(reply, Reply::Serial(_)));
        response(reply).await;
        assert!(b.topics.get("fresh").is_some(), "auto-created");
        let reply = b.handle(ask("fresh"), RequestContext::default()).unwrap();
        assert!(
            matches!(reply, Reply::Now(_)),
            "a known topic is answered inline"
        );
    }

    /// Produces one record to partition 0 of `topic`; the partition's error code.
    async fn produce_one(b: &Arc<Broker>, topic: &str) -> i16 {
        produce_value(b, topic, b"v").await
    }

    /// Produces one record of `value` to `topic`-0 with acks=1; the partition's error code.
    async fn produce_value(b: &Arc<Broker>, topic: &str, value: &'static [u8]) -> i16 {
        use spate_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
        use spate_protocol::messages::{ProduceRequest, ProduceResponse};
        let records = spate_protocol::batch::build(
            &[spate_protocol::batch::NewRecord {
                key: None,
                value: Some(Bytes::from_static(value)),
                timestamp: 1,
            }],
            None,
            spate_protocol::records::Compression::None,
        )
        .unwrap();
        let mut pd = PartitionProduceData::default();
        pd.index = 0;
        pd.records = Some(records);
        let mut td = TopicProduceData::default();
        td.name = TopicName(StrBytes::from_string(topic.to_string()));
        td.partition_data = vec![pd];
        let mut r = ProduceRequest::default();
        r.acks = 1;
        r.timeout_ms = 10_000;
        r.topic_data = vec![td];
        let reply = b
            .handle(frame(ApiKey::Produce, 9, &r), RequestContext::default())
            .unwrap();
        let resp: ProduceResponse = decode(ApiKey::Produce, 9, response(reply).await);
        resp.responses[0].partition_responses[0].error_code
    }

    /// Commits offset 1 of `topic`-0 for a simple (memberless) group; the partition's code.
    async fn commit_one(b: &Arc<Broker>, topic: &str) -> i16 {
        use spate_protocol::messages::offset_commit_request::{
            OffsetCommitRequestPartition, OffsetCommitRequestTopic,
        };
        use spate_protocol::messages::{OffsetCommitRequest, OffsetCommitResponse};
        let mut p = OffsetCommitRequestPartition::default();
        p.partition_index = 0;
        p.committed_offset = 1;
        let mut t = OffsetCommitRequestTopic::default();
        t.name = TopicName(StrBytes::from_string(topic.to_string()));
        t.partitions = vec![p];
        let mut r = OffsetCommitRequest::default();
        r.group_id = spate_protocol::messages::GroupId(StrBytes::from_static_str("g"));
        r.generation_id_or_member_epoch = -1;
        r.topics = vec![t];
        let reply = b
            .handle(
                frame(ApiKey::OffsetCommit, 8, &r),
                RequestContext::default(),
            )
            .unwrap();
        let resp: OffsetCommitResponse = decode(ApiKey::OffsetCommit, 8, response(reply).await);
        resp.topics[0].partitions[0].error_code
    }

    #[tokio::test]
    async fn below_the_disk_watermark_produce_is_refused_unwritten_commits_work_and_it_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = BrokerConfig::new(dir.path().join("data"), "127.0.0.1", 9092);
        config.disk_watermark = crate::disk::DiskWatermark {
            min_free_bytes: 1 << 20,
            min_free_percent: 0,
        };
        let (b, _) = Broker::open(config).unwrap();
        response(
            b.handle(
                frame(ApiKey::CreateTopics, 7, &create_topics("t")),
                RequestContext::default(),
            )
            .unwrap(),
        )
        .await;
        // The real disk of the test machine is not what is tested: samples are fed in.
        b.disk.observe(10 << 20, 100 << 20);
        assert_eq!(produce_one(&b, "t").await, 0);
        let end = |b: &Broker| {
            b.topics
                .get("t")
                .unwrap()
                .partition(0)
                .unwrap()
                .log_end_offset()
        };
        assert_eq!(end(&b), 1);

        b.disk.observe(512 << 10, 100 << 20);
        assert_eq!(
            produce_one(&b, "t").await,
            ResponseError::KafkaStorageError.code()
        );
        assert_eq!(end(&b), 1, "a refused produce wrote nothing");
        assert!(
            ResponseError::KafkaStorageError.is_retriable(),
            "clients retry the refusal (Kafka's error table)"
        );
        assert_eq!(commit_one(&b, "t").await, 0, "offset commits keep working");

        b.disk.observe(2 << 20, 100 << 20);
        assert_eq!(produce_one(&b, "t").await, 0, "produce resumes by itself");
        assert_eq!(end(&b), 2);
    }

    /// Bytes of every file under `dir`.
    fn dir_bytes(dir: &Path) -> u64 {
        std::fs::read_dir(dir).map_or(0, |entries| {
            entries
                .flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => dir_bytes(&e.path()),
                    _ => e.metadata().map_or(0, |m| m.len()),
                })
                .sum()
        })
    }

    #[tokio::test]
    async fn delete_records_retention_and_delete_topics_lift_a_full_disk_at_once_without_the_sampler(
    ) {
        use spate_protocol::messages::create_topics_request::CreatableTopicConfig;
        use spate_protocol::messages::delete_records_request::{
            DeleteRecordsPartition, DeleteRecordsTopic,
        };
        use spate_protocol::messages::{
            DeleteRecordsRequest, DeleteRecordsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
        };
        use std::sync::atomic::{AtomicU64, Ordering};
        const WATERMARK: u64 = 4096;
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut config = BrokerConfig::new(data.clone(), "127.0.0.1", 9092);
        config.disk_watermark = crate::disk::DiskWatermark {
            min_free_bytes: WATERMARK,
            min_free_percent: 0,
        };
        let (b, _) = Broker::open(config).unwrap();
        // A small disk (no periodic sampler runs in this test): a capacity less what the data
        // dir holds, so deleted files free space as on a real file system.
        let capacity = Arc::new(AtomicU64::new(u64::MAX / 2));
        let (cap, root) = (capacity.clone(), data.clone());
        b.disk.set_probe(Arc::new(move |_| {
            let c = cap.load(Ordering::Relaxed);
            Ok((c.saturating_sub(dir_bytes(&root)), c))
        }));
        for (topic, retention_ms) in [("gone", "-1"), ("kept", "1000")] {
            let mut req = create_topics(topic);
            // One batch per segment; records stamped 1 are long past a retention of 1 s.
            for (k, v) in [("segment.bytes", "100"), ("retention.ms", retention_ms)] {
                let mut c = CreatableTopicConfig::default();
                c.name = StrBytes::from_static_str(k);
                c.value = Some(StrBytes::from_static_str(v));
                req.topics[0].configs.push(c);
            }
            let resp: CreateTopicsResponse = decode(
                ApiKey::CreateTopics,
                7,
                response(
                    b.handle(
                        frame(ApiKey::CreateTopics, 7, &req),
                        RequestContext::default(),
                    )
                    .unwrap(),
                )
                .await,
            );
            assert_eq!(resp.topics[0].error_code, 0);
            for _ in 0..10 {
                assert_eq!(produce_value(&b, topic, &[7u8; 1024]).await, 0);
            }
        }
        // Fills the disk to one byte below the watermark, as a sample sees it.
        let fill = |b: &Broker| {
            capacity.store(dir_bytes(&data) + WATERMARK - 1, Ordering::Relaxed);
            b.disk.sample().unwrap();
            assert!(b.disk.is_full());
        };

        fill(&b);
        assert_eq!(
            produce_one(&b, "kept").await,
            ResponseError::KafkaStorageError.code()
        );
        let mut p = DeleteRecordsPartition::default();
        p.partition_index = 0;
        p.offset = -1;
        let mut t = DeleteRecordsTopic::default();
        t.name = TopicName(StrBytes::from_static_str("gone"));
        t.partitions = vec![p];
        let mut req = DeleteRecordsRequest::default();
        req.topics = vec![t];
        req.timeout_ms = 10_000;
        let resp: DeleteRecordsResponse = decode(
            ApiKey::DeleteRecords,
            2,
            response(
                b.handle(
                    frame(ApiKey::DeleteRecords, 2, &req),
                    RequestContext::default(),
                )
                .unwrap(),
            )
            .await,
        );
        assert_eq!(resp.topics[0].partitions[0].error_code, 0);
        assert!(
            !b.disk.is_full(),
            "DeleteRecords freed space: produce resumes at once"
        );
        assert_eq!(produce_one(&b, "kept").await, 0);

        fill(&b);
        b.enforce_retention();
        assert!(
            !b.disk.is_full(),
            "retention freed space: produce resumes at once"
        );

        fill(&b);
        let mut req = DeleteTopicsRequest::default();
        req.topic_names = vec![TopicName(StrBytes::from_static_str("gone"))];
        req.timeout_ms = 10_000;
        let resp: DeleteTopicsResponse = decode(
            ApiKey::DeleteTopics,
            4,
            response(
                b.handle(
                    frame(ApiKey::DeleteTopics, 4, &req),
                    RequestContext::default(),
                )
                .unwrap(),
            )
            .await,
        );
        assert_eq!(resp.responses[0].error_code, 0);
        // Its files go on a thread of their own; the sample follows their removal.
        b.topics.finish_removals();
        assert!(
            !b.disk.is_full(),
            "DeleteTopics freed space: produce resumes at once"
        );
    }

    #[test]
    fn cluster_id_is_22_url_safe_characters() {
        let id = crate::topology::cluster_id_text(&[0xffu8; 16]);
        assert_eq!(id.len(), 22);
        assert!(id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    }
}
