//! Every searchable partition of this broker: a reconciler thread watches the topics and their
//! `search.*` configs (creation, config changes, deletion, new partitions) and starts, rebuilds
//! or stops indexers; searches resolve topic expressions (`t1,t2`, `logs-*`) to partition
//! indexes and run on the blocking pool under a time limit.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;
use spate_broker::{Broker, Partition, Topic};
use uuid::Uuid;

use crate::dsl::Limits;
use crate::error::SearchError;
use crate::index::{PartitionIndex, TopicIndex};
use crate::indexer::{Feed, Indexer, IndexerSettings};
use crate::mapping::TopicMapping;
use crate::metrics::{IndexMetrics, SearchMetrics};
use crate::pool::{IndexingPool, PoolSettings};
use crate::record::ValueDecoder;
use crate::request::{parse_request, SearchRequest};
use crate::search::{self, Partial, Target};

/// Settings of the search side of a broker.
#[derive(Debug, Clone)]
pub struct SearchConfig {
    /// Where indexes live (`<data dir>/search`).
    pub root: PathBuf,
    /// Indexing memory of each open writer (at least tantivy's 15 MB minimum); at most
    /// `max_open_writers` are open, which bounds indexing memory as a whole.
    pub writer_memory_bytes: usize,
    /// Threads taking indexing steps for every searchable partition.
    pub indexer_threads: usize,
    /// Index writers open at once over every partition (each is three threads: its indexing
    /// worker, segment updater and merge thread).
    pub max_open_writers: usize,
    /// How indexers run.
    pub indexer: IndexerSettings,
    /// Longest a search may run before it is answered with an error; counted from when it
    /// starts running (it has a slot), as Elasticsearch's timeout counts execution only.
    pub query_timeout: Duration,
    /// Longest a search waits for a slot before it is refused (429, as Elasticsearch refuses
    /// a search its full queue cannot hold); a large `_msearch` queues its searches here.
    pub queue_timeout: Duration,
    /// How often topic and config changes are looked for.
    pub reconcile_interval: Duration,
    /// Niceness of indexing threads (0 = the broker's priority) when not under SCHED_IDLE.
    pub indexer_nice: i32,
    /// Searches that run at once on this node; more wait for a slot, up to `queue_timeout`.
    /// A search past its limit is answered with an error but keeps its slot until its thread
    /// finishes, so abandoned searches cannot pile up on the blocking pool.
    pub max_concurrent_searches: usize,
    /// Run indexing threads under SCHED_IDLE (Linux): CPU only when nothing else wants it.
    pub indexer_idle: bool,
    /// Reads values in the schema registry's wire format (`search.value.format` schema or
    /// auto); `None` when no registry runs in this process.
    pub value_decoder: Option<SharedDecoder>,
}

/// A [`ValueDecoder`] shared by every index of the service.
#[derive(Clone)]
pub struct SharedDecoder(pub Arc<dyn ValueDecoder>);

impl std::fmt::Debug for SharedDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedDecoder")
    }
}

impl SearchConfig {
    /// Defaults for a broker whose data lives in `data_dir`.
    pub fn new(data_dir: &std::path::Path) -> Self {
        Self {
            root: data_dir.join("search"),
            writer_memory_bytes: 32 << 20,
            indexer_threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
                .clamp(1, 8),
            max_open_writers: 16,
            indexer: IndexerSettings::default(),
            query_timeout: Duration::from_secs(10),
            queue_timeout: Duration::from_secs(60),
            reconcile_interval: Duration::from_millis(250),
            indexer_nice: 10,
            indexer_idle: true,
            value_decoder: None,
            max_concurrent_searches: std::thread::available_parallelism()
                .map(|n| n.get() * 2)
                .unwrap_or(4),
        }
    }
}

/// One searchable topic's index on this node, and its partitions here.
struct Entry {
    topic: String,
    fingerprint: String,
    index: Arc<TopicIndex>,
    partitions: BTreeMap<i32, Part>,
    indexer: Option<Indexer>,
}

/// One partition of a searchable topic on this node.
struct Part {
    partition: Arc<Partition>,
    metrics: Arc<IndexMetrics>,
    view: Arc<PartitionIndex>,
}

impl Entry {
    fn feeds(&self) -> Vec<Feed> {
        self.partitions
            .values()
            .map(|p| Feed {
                partition: p.partition.clone(),
                metrics: p.metrics.clone(),
            })
            .collect()
    }
}

/// A topic that should have an index: its name, settings fingerprint, partitions on this
/// node and settings.
type Wanted = (
    String,
    String,
    Vec<Arc<Partition>>,
    spate_broker::search_config::SearchSettings,
);

/// Per-partition figures for `/metrics`.
#[derive(Debug, Clone)]
pub struct PartitionStats {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Records indexed since start.
    pub indexed_records: u64,
    /// Records below the high watermark not yet searchable.
    pub lag_records: i64,
    /// Seconds the index has been behind.
    pub lag_seconds: f64,
    /// Batches that could not be decoded.
    pub undecodable_batches: u64,
    /// Schema'd values that could not be decoded (indexed as text).
    pub undecodable_values: u64,
    /// Waits for a schema id not known yet.
    pub schema_id_waits: u64,
    /// JSON values left out: the mapping was full.
    pub unmapped_fields: u64,
    /// JSON values left out: they did not fit their field's type.
    pub mapping_conflicts: u64,
    /// Times the index writer failed and indexing went back to the last commit.
    pub writer_recoveries: u64,
}

/// Where one partition's part of a search can run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// This node's index.
    Local,
    /// Another node's, at its advertised HTTP address.
    Node {
        /// Broker id.
        id: i32,
        /// HTTP address.
        addr: String,
    },
}

/// Which copies of a partition a search prefers (Elasticsearch's `preference` parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Preference {
    /// The leader's index, the freshest.
    #[default]
    Leader,
    /// This node's index when it has one (`_local`).
    Local,
    /// Only this node's indexes; partitions it does not hold are left out (`_only_local`).
    OnlyLocal,
}

impl Preference {
    /// From the `preference` URL parameter; other values (custom routing strings) are the
    /// default.
    pub fn parse(v: Option<&str>) -> Self {
        match v {
            Some("_local") => Self::Local,
            Some("_only_local") => Self::OnlyLocal,
            _ => Self::Leader,
        }
    }
}

/// One partition a search covers, with where it can be answered, best first.
#[derive(Debug, Clone)]
pub struct PlannedPartition {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Where to ask, best first; empty when no node can answer.
    pub sources: Vec<Source>,
}

/// The search side of a broker.
pub struct SearchService {
    broker: Arc<Broker>,
    config: SearchConfig,
    entries: Mutex<HashMap<Uuid, Entry>>,
    /// Broker-wide search metrics.
    pub metrics: Arc<SearchMetrics>,
    limits: Limits,
    stopping: AtomicBool,
    runtime: tokio::runtime::Handle,
    /// The last stop was not clean: indexes found are checked before use (see
    /// [`crate::directory`]).
    verify: bool,
    /// Where every indexer takes its steps.
    pool: Arc<IndexingPool>,
    /// Producers to slow per topic, in ms (topics whose index is behind `search.max.lag.ms`).
    throttles: Arc<parking_lot::RwLock<HashMap<String, u64>>>,
    /// Slots for searches running at once (see `SearchConfig::max_concurrent_searches`).
    slots: Arc<tokio::sync::Semaphore>,
}

/// How often the age of each partition's oldest unindexed record is taken.
const LAG_SAMPLE: Duration = Duration::from_millis(100);
/// Shortest and longest throttle a lagging index asks of its topic's producers.
const MIN_THROTTLE_MS: u64 = 10;
const MAX_THROTTLE_MS: u64 = 1_000;

/// Slows producers of topics whose index is further behind than `search.max.lag.ms`.
struct LagBackPressure {
    throttles: Arc<parking_lot::RwLock<HashMap<String, u64>>>,
}

impl spate_broker::TopicBackPressure for LagBackPressure {
    fn produce_throttle_ms(&self, topic: &str) -> u64 {
        self.throttles.read().get(topic).copied().unwrap_or(0)
    }
}

/// In the search root after a clean stop: every index was synced.
const CLEAN_MARKER: &str = "clean_shutdown";

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl SearchService {
    /// Starts the service and its reconciler; call from within a tokio runtime.
    pub fn start(broker: Arc<Broker>, config: SearchConfig) -> std::io::Result<Arc<Self>> {
        std::fs::create_dir_all(&config.root)?;
        // From here on index files are written without fsync: the marker goes first, and
        // durably, so that a crash from now on is known as one at the next start.
        let marker = config.root.join(CLEAN_MARKER);
        let clean = marker.exists();
        if clean {
            std::fs::remove_file(&marker)?;
            std::fs::File::open(&config.root)?.sync_all()?;
        }
        let (idle, nice) = (config.indexer_idle, config.indexer_nice);
        let pool = IndexingPool::start(
            PoolSettings {
                threads: config.indexer_threads,
                max_open_writers: config.max_open_writers,
            },
            // Every indexing thread (the pool's, and tantivy's writer and merge threads, which
            // the pool's threads start) runs at a lower priority.
            move || crate::priority::lower(idle, nice),
        )?;
        let service = Arc::new(Self {
            throttles: Arc::default(),
            pool,
            verify: !clean,
            broker,
            entries: Mutex::new(HashMap::new()),
            metrics: Arc::new(SearchMetrics::default()),
            limits: Limits::default(),
            stopping: AtomicBool::new(false),
            runtime: tokio::runtime::Handle::current(),
            slots: Arc::new(tokio::sync::Semaphore::new(
                config.max_concurrent_searches.max(1),
            )),
            config,
        });
        service.remove_orphans();
        let weak = Arc::downgrade(&service);
        // The first pass is waited for, so every index is open (and cut back to its log)
        // before the broker takes clients.
        let (first_pass, first_done) = std::sync::mpsc::channel::<()>();
        let interval = service.config.reconcile_interval;
        std::thread::Builder::new()
            .name("search-reconcile".into())
            .spawn(move || loop {
                let Some(s) = weak.upgrade() else { return };
                if s.stopping.load(Ordering::SeqCst) {
                    return;
                }
                s.reconcile();
                drop(s);
                let _ = first_pass.send(());
                std::thread::sleep(interval);
            })?;
        let _ = first_done.recv();
        service.broker.set_back_pressure(Arc::new(LagBackPressure {
            throttles: service.throttles.clone(),
        }));
        let weak = Arc::downgrade(&service);
        service.runtime.spawn(async move {
            let mut tick = tokio::time::interval(LAG_SAMPLE);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(s) = weak.upgrade() else { return };
                if s.stopping.load(Ordering::SeqCst) {
                    s.throttles.write().clear();
                    return;
                }
                s.sample_lag();
            }
        });
        Ok(service)
    }

    /// Dates every partition's oldest unindexed record (see [`IndexMetrics::observe`]) and
    /// sets which topics' producers to slow: those with `search.max.lag.ms` whose worst
    /// partition is older than that, for as long as it is over (at most a second at a time).
    fn sample_lag(&self) {
        let now = now_ms();
        let mut worst: HashMap<String, i64> = HashMap::new();
        for e in self.entries.lock().values() {
            for (p, part) in &e.partitions {
                let searchable = e
                    .index
                    .committed_offset_of(*p)
                    .max(part.partition.log_start_offset());
                let age = part
                    .metrics
                    .observe(part.partition.high_watermark(), searchable, now);
                let w = worst.entry(e.topic.clone()).or_default();
                *w = (*w).max(age);
            }
        }
        let mut throttles = HashMap::new();
        for (topic, age) in worst {
            let Some(max) = self
                .broker
                .topics
                .get(&topic)
                .and_then(|t| t.with_config(|c| c.search_max_lag_ms()))
            else {
                continue;
            };
            let over = (age.max(0) as u64).saturating_sub(max);
            if over > 0 {
                throttles.insert(topic, over.clamp(MIN_THROTTLE_MS, MAX_THROTTLE_MS));
            }
        }
        *self.throttles.write() = throttles;
    }

    /// Stops every indexer after its last commit: all are asked at once, then joined, so
    /// shutdown takes about one indexing step whatever the number of partitions.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let indexers: Vec<Indexer> = self
            .entries
            .lock()
            .drain()
            .filter_map(|(_, mut e)| e.indexer.take())
            .collect();
        for i in &indexers {
            i.request_stop();
        }
        for i in indexers {
            i.join();
        }
        self.pool.close();
        // Every index committed its last state: made durable, then marked clean.
        let marked = crate::directory::sync_all(&self.config.root).and_then(|_| {
            let marker = self.config.root.join(CLEAN_MARKER);
            std::fs::File::create(&marker)?.sync_all()?;
            std::fs::File::open(&self.config.root)?.sync_all()
        });
        if let Err(e) = marked {
            tracing::warn!(error = %e, "search indexes not marked cleanly stopped; they are checked at the next start");
        }
    }

    fn dir_of(&self, id: &Uuid) -> PathBuf {
        self.config.root.join(id.simple().to_string())
    }

    /// Removes indexes of topics that no longer exist (deleted while the broker was down).
    fn remove_orphans(&self) {
        let Ok(dirs) = std::fs::read_dir(&self.config.root) else {
            return;
        };
        for d in dirs.flatten() {
            let keep = d
                .file_name()
                .to_str()
                .and_then(|n| Uuid::parse_str(n).ok())
                .and_then(|id| self.broker.topics.get_by_id(&id))
                .is_some_and(|t| t.with_config(|c| c.search().enabled));
            if !keep {
                let _ = std::fs::remove_dir_all(d.path());
            }
        }
    }

    /// Brings the indexers in line with the topics: one index per searchable topic with a
    /// replica here, indexing each partition this node holds; rebuilt when the settings
    /// change, removed with the topic or the setting.
    pub fn reconcile(&self) {
        let mut wanted: HashMap<Uuid, Wanted> = HashMap::new();
        for t in self.broker.topics.list() {
            let settings = t.with_config(|c| c.search());
            if !settings.enabled {
                continue;
            }
            let partitions = t.partitions();
            if partitions.is_empty() {
                continue;
            }
            wanted.insert(
                t.id,
                (t.name.clone(), settings.fingerprint(), partitions, settings),
            );
        }
        let mut gone = Vec::new();
        {
            let mut entries = self.entries.lock();
            let stale: Vec<Uuid> = entries
                .iter()
                .filter(|(k, e)| wanted.get(*k).is_none_or(|w| w.1 != e.fingerprint))
                .map(|(k, _)| *k)
                .collect();
            for k in stale {
                if let Some(e) = entries.remove(&k) {
                    gone.push((k, e));
                }
            }
            // Replicas that came to this node or left it: the indexer takes the new set.
            for (id, e) in entries.iter_mut() {
                let Some((_, _, partitions, _)) = wanted.get(id) else {
                    continue;
                };
                let same = partitions.len() == e.partitions.len()
                    && partitions.iter().all(|p| {
                        e.partitions
                            .get(&p.index)
                            .is_some_and(|x| Arc::ptr_eq(&x.partition, p))
                    });
                if same {
                    continue;
                }
                e.partitions = partitions
                    .iter()
                    .map(|p| {
                        let metrics = e
                            .partitions
                            .get(&p.index)
                            .map(|x| x.metrics.clone())
                            .unwrap_or_default();
                        (p.index, part(&e.index, p, metrics))
                    })
                    .collect();
                if let Some(i) = &e.indexer {
                    i.set_feeds(e.feeds());
                }
            }
        }
        for (id, mut e) in gone {
            if let Some(i) = e.indexer.take() {
                i.stop();
            }
            if !wanted.contains_key(&id) {
                let dir = self.dir_of(&id);
                drop(e);
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
        let missing: Vec<_> = {
            let entries = self.entries.lock();
            wanted
                .into_iter()
                .filter(|(k, _)| !entries.contains_key(k))
                .collect()
        };
        for (id, (topic, fingerprint, partitions, settings)) in missing {
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            let dir = self.dir_of(&id);
            let opened = match TopicIndex::open(
                &dir,
                &topic,
                &settings,
                self.config.writer_memory_bytes,
                self.verify,
            ) {
                Ok(o) => o,
                Err(e) => {
                    tracing::error!(%topic, error = %e, "cannot open search index");
                    continue;
                }
            };
            if let Some(why) = &opened.rebuilt {
                tracing::warn!(%topic, "search index rebuilt from the log: {why}");
            }
            let mut opened = opened;
            if let Err(e) = cut_to_logs(&opened.index, &mut opened.progress, &partitions) {
                tracing::error!(%topic, error = %e, "cannot drop documents past the log end; retrying");
                continue;
            }
            opened.index.decoder = self.config.value_decoder.as_ref().map(|d| d.0.clone());
            let index = Arc::new(opened.index);
            let parts: BTreeMap<i32, Part> = partitions
                .iter()
                .map(|p| (p.index, part(&index, p, Arc::default())))
                .collect();
            let mut entry = Entry {
                topic,
                fingerprint,
                index: index.clone(),
                partitions: parts,
                indexer: None,
            };
            entry.indexer = Some(Indexer::start(
                index,
                entry.feeds(),
                self.config.indexer,
                self.metrics.clone(),
                self.pool.clone(),
                &self.runtime,
            ));
            self.entries.lock().insert(id, entry);
        }
    }

    /// Figures of every searchable partition.
    pub fn stats(&self) -> Vec<PartitionStats> {
        let mut v: Vec<PartitionStats> = self
            .entries
            .lock()
            .values()
            .flat_map(|e| {
                e.partitions.iter().map(|(p, part)| {
                    let m = &part.metrics;
                    PartitionStats {
                        topic: e.topic.clone(),
                        partition: *p,
                        indexed_records: m.indexed_records.get(),
                        lag_records: m.lag_records.get(),
                        lag_seconds: m.lag_seconds(),
                        undecodable_batches: m.undecodable_batches.get(),
                        undecodable_values: m.undecodable_values.get(),
                        schema_id_waits: m.schema_id_waits.get(),
                        unmapped_fields: m.unmapped_fields.get(),
                        mapping_conflicts: m.mapping_conflicts.get(),
                        writer_recoveries: m.writer_recoveries.get(),
                    }
                })
            })
            .collect();
        v.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        v
    }

    /// Bytes each searchable topic's index takes on this node's disk, by topic name.
    pub fn index_sizes(&self) -> Vec<(String, u64)> {
        let indexes: Vec<Arc<TopicIndex>> = self
            .entries
            .lock()
            .values()
            .map(|e| e.index.clone())
            .collect();
        let mut v: Vec<(String, u64)> = indexes
            .iter()
            .map(|i| (i.topic.clone(), i.size_bytes()))
            .collect();
        v.sort();
        v
    }

    /// The topics a topic expression names: comma-separated names, `*` wildcards, `_all`.
    /// A named topic that does not exist is a 404, one that is not searchable a 400;
    /// wildcards match only searchable topics.
    fn resolve(&self, expr: &str) -> Result<Vec<Arc<Topic>>, SearchError> {
        let mut topics: Vec<Arc<Topic>> = Vec::new();
        let mut add = |t: Arc<Topic>| {
            if !topics.iter().any(|x| x.id == t.id) {
                topics.push(t);
            }
        };
        for part in expr.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "_all" || part.contains('*') {
                let pattern = if part == "_all" { "*" } else { part };
                for t in self.broker.topics.list() {
                    if glob(pattern, &t.name) && t.with_config(|c| c.search().enabled) {
                        add(t);
                    }
                }
                continue;
            }
            let t = self
                .broker
                .topics
                .get(part)
                .ok_or_else(|| SearchError::NoSuchTopic(part.to_string()))?;
            if !t.with_config(|c| c.search().enabled) {
                return Err(SearchError::NotSearchable(part.to_string()));
            }
            add(t);
        }
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(topics)
    }

    /// The fields of each topic `expr` names, by topic name (`_mapping`, `_field_caps`).
    /// The other live nodes' HTTP addresses (none standalone): where a topic's fields
    /// mapped on partitions this node does not hold are asked for.
    pub fn peers(&self) -> Vec<String> {
        let Some(cluster) = self.broker.cluster() else {
            return Vec::new();
        };
        let image = cluster.image();
        let me = cluster.broker_id();
        image
            .brokers()
            .values()
            .filter(|b| !b.fenced && b.id != me)
            .filter_map(|b| b.http_addr.clone())
            .collect()
    }

    pub fn mappings(&self, expr: &str) -> Result<Vec<(String, TopicMapping)>, SearchError> {
        Ok(self
            .resolve(expr)?
            .into_iter()
            .map(|t| {
                // Declared fields win; then what this node's partitions mapped from the
                // documents (each partition maps on its own; the first type seen stays).
                let mut m = TopicMapping::declared(&t.with_config(|c| c.search()));
                if let Some(e) = self.entries.lock().get(&t.id) {
                    m.merge(&e.index.schema.dynamic.load());
                }
                (t.name.clone(), m)
            })
            .collect())
    }

    /// Searchable partitions `expr` covers and how many of them have a search source: the
    /// figures of `_cluster/health` (a partition without one is an unassigned shard).
    pub fn coverage(&self, expr: &str) -> Result<(usize, usize), SearchError> {
        let plan = self.plan(expr, Preference::Leader)?;
        let answered = plan.iter().filter(|p| !p.sources.is_empty()).count();
        Ok((plan.len(), answered))
    }

    /// Which partitions a search over `expr` covers, each once, and where each can be
    /// answered, best first. Standalone, that is this node's indexes. In a cluster each
    /// replica indexes its own log up to its high watermark, so a partition is answered by
    /// its leader (the freshest index), else another in-sync replica, else this node's copy.
    pub fn plan(
        &self,
        expr: &str,
        preference: Preference,
    ) -> Result<Vec<PlannedPartition>, SearchError> {
        let topics = self.resolve(expr)?;
        let entries = self.entries.lock();
        let indexed = |t: &Topic, p: i32| {
            entries
                .get(&t.id)
                .is_some_and(|e| e.partitions.contains_key(&p))
        };
        let Some(cluster) = self.broker.cluster() else {
            // A partition whose index is not open yet is still planned, with no source: the
            // answer counts it as a failed shard instead of leaving it out unseen.
            return Ok(topics
                .iter()
                .flat_map(|t| {
                    (0..t.partition_count()).map(|p| PlannedPartition {
                        topic: t.name.clone(),
                        partition: p,
                        sources: if indexed(t, p) {
                            vec![Source::Local]
                        } else {
                            Vec::new()
                        },
                    })
                })
                .collect());
        };
        let image = cluster.image();
        let me = cluster.broker_id();
        let node = |id: i32| {
            image
                .broker(id)
                .filter(|b| !b.fenced && id != me)
                .and_then(|b| b.http_addr.clone())
                .map(|addr| Source::Node { id, addr })
        };
        let mut planned = Vec::new();
        for t in &topics {
            for p in 0..t.partition_count() {
                let local = indexed(t, p);
                let state = image.partition(&t.name, p);
                let leader = state.and_then(|s| s.leader);
                let mut sources = Vec::new();
                let local_first = leader == Some(me) || preference != Preference::Leader;
                if preference == Preference::OnlyLocal && !local {
                    continue;
                }
                if local && local_first {
                    sources.push(Source::Local);
                } else {
                    sources.extend(leader.and_then(node));
                    if let Some(s) = state {
                        sources.extend(
                            s.isr
                                .iter()
                                .filter(|r| Some(**r) != leader)
                                .filter_map(|r| node(*r)),
                        );
                    }
                    if local {
                        sources.push(Source::Local);
                    }
                }
                planned.push(PlannedPartition {
                    topic: t.name.clone(),
                    partition: p,
                    sources,
                });
            }
        }
        Ok(planned)
    }

    /// Searches the named partitions of this node and keeps the best `from + size` hits
    /// (see [`search::partial`]; rendered only with `render`); also answers which of them
    /// this node has no index for.
    pub async fn partial(
        &self,
        partitions: Vec<(String, i32)>,
        req: SearchRequest,
        count_only: bool,
        render: bool,
    ) -> Result<(Partial, Vec<(String, i32)>), SearchError> {
        let (targets, missing) = self.targets(partitions);
        let limits = self.limits;
        let metrics = self.metrics.clone();
        let partial = self
            .run_limited(move || {
                let p = search::partial(&targets, &req, &limits, now_ms(), count_only)?;
                if !render {
                    return Ok(p);
                }
                let mut p = p;
                let read = search::render(&targets, &req, &limits, now_ms(), &mut p.hits)?;
                metrics.records_rendered.add(read as u64);
                Ok(p)
            })
            .await?;
        Ok((partial, missing))
    }

    /// Waits until the records of `topic` below each `(partition, offset)` given are
    /// searchable on this node, at most `limit` in all (`refresh=wait_for`); answers whether
    /// they are. A topic that is not searchable has nothing to wait for; a partition this
    /// node holds no replica of cannot be waited for here.
    pub async fn wait_searchable(&self, topic: &str, upto: &[(i32, i64)], limit: Duration) -> bool {
        let Some(t) = self.broker.topics.get(topic) else {
            return false;
        };
        if !t.with_config(|c| c.search().enabled) {
            return true;
        }
        let deadline = Instant::now() + limit;
        for &(p, offset) in upto {
            if t.partition(p).is_none() {
                return false;
            }
            loop {
                // An index opens within a reconcile pass of the topic's creation.
                let index = self
                    .entries
                    .lock()
                    .get(&t.id)
                    .filter(|e| e.partitions.contains_key(&p))
                    .map(|e| e.index.clone());
                let left = deadline.saturating_duration_since(Instant::now());
                match index {
                    Some(i) => {
                        if !i.wait_searchable(p, offset, left).await {
                            return false;
                        }
                        break;
                    }
                    None if left.is_zero() => return false,
                    None => tokio::time::sleep(left.min(Duration::from_millis(20))).await,
                }
            }
        }
        true
    }

    /// Renders the hits (of a merged page) that are in this node's partitions: reads their
    /// records and adds `_source`, `_kafka`, highlights and fields (see [`search::render`]).
    pub async fn render(
        &self,
        mut hits: Vec<search::PartialHit>,
        req: SearchRequest,
    ) -> Result<Vec<search::PartialHit>, SearchError> {
        let wanted = hits
            .iter()
            .map(|h| (h.topic.clone(), h.partition))
            .collect::<std::collections::BTreeSet<_>>();
        let (targets, _) = self.targets(wanted.into_iter().collect());
        let limits = self.limits;
        let metrics = self.metrics.clone();
        self.run_limited(move || {
            let read = search::render(&targets, &req, &limits, now_ms(), &mut hits)?;
            metrics.records_rendered.add(read as u64);
            Ok(hits)
        })
        .await
    }

    /// The indexes of the named partitions this node has, and the names of those it has not.
    fn targets(&self, partitions: Vec<(String, i32)>) -> (Vec<Target>, Vec<(String, i32)>) {
        let mut targets = Vec::new();
        let mut missing = Vec::new();
        {
            let entries = self.entries.lock();
            for (topic, p) in partitions {
                let entry = self
                    .broker
                    .topics
                    .get(&topic)
                    .and_then(|t| entries.get(&t.id))
                    .and_then(|e| e.partitions.get(&p));
                match entry {
                    Some(part) => targets.push(Target {
                        index: part.view.clone(),
                        partition: part.partition.clone(),
                    }),
                    None => missing.push((topic, p)),
                }
            }
        }
        (targets, missing)
    }

    async fn run_limited<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, SearchError> + Send + 'static,
    ) -> Result<T, SearchError> {
        let limit = self.config.query_timeout;
        let queue = self.config.queue_timeout;
        // Waiting for a slot is bounded apart: the time limit starts when the search runs,
        // so searches queued behind others (a large _msearch) are not failed for waiting.
        let permit = match tokio::time::timeout(queue, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => {
                return Err(SearchError::Index {
                    reason: "search is shutting down".into(),
                })
            }
            Err(_) => return Err(SearchError::Rejected(queue.as_millis() as u64)),
        };
        // The slot is held by the thread, not by this future: a search answered as timed
        // out still counts until it really ends.
        let run = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            f()
        });
        match tokio::time::timeout(limit, run).await {
            Ok(r) => r.map_err(|e| SearchError::Index {
                reason: format!("search task failed: {e}"),
            })?,
            Err(_) => Err(SearchError::Timeout(limit.as_millis() as u64)),
        }
    }

    /// How long a search may run; a node asking others waits a little longer than that.
    pub fn query_timeout(&self) -> Duration {
        self.config.query_timeout
    }

    /// How long a search may wait for a slot before it runs.
    pub fn queue_timeout(&self) -> Duration {
        self.config.queue_timeout
    }

    /// Records one answered search (its latency, and whether it failed) in the metrics.
    pub fn observe(&self, started: Instant, failed: bool) {
        self.metrics
            .query_latency_us
            .observe(started.elapsed().as_micros() as u64);
        if failed {
            self.metrics.query_errors.inc();
        }
    }

    /// Parses a body (JSON text, possibly empty) into a request.
    pub fn parse_body(body: &[u8]) -> Result<SearchRequest, SearchError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return parse_request(None);
        }
        let v: Value = serde_json::from_slice(body).map_err(|e| SearchError::BadRequest {
            kind: "x_content_parse_exception",
            reason: format!("the request body is not valid JSON: {e}"),
        })?;
        parse_request(Some(&v))
    }
}

/// Partition `p` of `index` on this node.
fn part(index: &Arc<TopicIndex>, p: &Arc<Partition>, metrics: Arc<IndexMetrics>) -> Part {
    Part {
        partition: p.clone(),
        metrics,
        view: Arc::new(index.partition(p.index)),
    }
}

/// Drops the documents of each partition that the index holds past its log's end (the log
/// lost its tail since the last commit: an OS crash before an fsync), before producers can
/// refill those offsets, and commits the lowered progress.
fn cut_to_logs(
    index: &TopicIndex,
    progress: &mut BTreeMap<i32, i64>,
    partitions: &[Arc<Partition>],
) -> Result<(), SearchError> {
    let ahead: Vec<(i32, i64, i64)> = partitions
        .iter()
        .filter_map(|p| {
            let end = p.log_end_offset();
            progress
                .get(&p.index)
                .filter(|at| **at > end)
                .map(|at| (p.index, *at, end))
        })
        .collect();
    if ahead.is_empty() {
        return Ok(());
    }
    let mut writer = index.new_writer()?;
    for &(p, at, end) in &ahead {
        tracing::warn!(topic = %index.topic, partition = p, indexed_to = at, log_end = end, "search index was ahead of its log; dropping the documents past the log end");
        index.delete_from(&writer, p, end)?;
        progress.insert(p, end);
    }
    index.commit(&mut writer, progress.clone())
}

fn glob(p: &str, s: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], s) || (!s.is_empty() && go(p, &s[1..])),
            (Some(a), Some(b)) if a == b => go(&p[1..], &s[1..]),
            _ => false,
        }
    }
    go(p.as_bytes(), s.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{append, broker};
    use spate_broker::TopicConfig;

    async fn hits(service: &SearchService, word: &str) -> usize {
        let body = format!("{{\"query\":{{\"match\":{{\"value\":\"{word}\"}}}}}}");
        let req = SearchService::parse_body(body.as_bytes()).unwrap();
        let (partial, _) = service
            .partial(vec![("cut".into(), 0)], req, true, false)
            .await
            .unwrap();
        partial.total
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_log_cut_and_refilled_between_indexer_steps_leaves_no_ghost_documents() {
        let dir = tempfile::tempdir().unwrap();
        let broker = broker(&dir);
        let mut config = TopicConfig::default();
        config.set("search.enabled", "true").unwrap();
        let topic = broker
            .topics
            .create("cut", 1, config, false)
            .unwrap()
            .unwrap();
        let p = topic.partition(0).unwrap();
        let service =
            SearchService::start(broker.clone(), SearchConfig::new(&broker.config.data_dir))
                .unwrap();
        // Two batches: a cut at offset 1 keeps the first.
        append(&p, &["ghost a"]);
        append(&p, &["ghost b", "ghost c", "ghost d"]);
        while hits(&service, "ghost").await < 4 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A follower's divergent tail cut, then refilled past where it was, at once.
        p.truncate_to(1).unwrap();
        append(&p, &["fresh b", "fresh c", "fresh d", "fresh e"]);
        // Generous: the records at the refilled offsets must be indexed at all.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while hits(&service, "fresh").await < 4 {
            assert!(
                std::time::Instant::now() < deadline,
                "the records at the cut offsets were never indexed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            hits(&service, "ghost").await,
            1,
            "only the record below the cut"
        );
        service.shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_timed_out_search_keeps_its_slot_until_it_ends() {
        use std::sync::atomic::AtomicUsize;
        let dir = tempfile::tempdir().unwrap();
        let broker = broker(&dir);
        let mut config = SearchConfig::new(&broker.config.data_dir);
        config.max_concurrent_searches = 1;
        config.query_timeout = Duration::from_millis(50);
        config.queue_timeout = Duration::from_millis(50);
        let service = SearchService::start(broker, config).unwrap();
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (release, held) = std::sync::mpsc::channel::<()>();
        let search = |wait: Option<std::sync::mpsc::Receiver<()>>| {
            let (running, most) = (running.clone(), most.clone());
            move || {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                if let Some(w) = wait {
                    let _ = w.recv();
                }
                running.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
        };
        // The first search outlives its limit and is answered as timed out...
        let first = service.run_limited(search(Some(held))).await;
        assert!(matches!(first, Err(SearchError::Timeout(_))), "{first:?}");
        // ...and the next one cannot start while it still runs: refused after its wait.
        let second = service.run_limited(search(None)).await;
        assert!(
            matches!(second, Err(SearchError::Rejected(_))),
            "{second:?}"
        );
        release.send(()).unwrap();
        while service.slots.available_permits() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let third = service.run_limited(search(None)).await;
        assert!(third.is_ok(), "{third:?}");
        assert_eq!(most.load(Ordering::SeqCst), 1, "never two at once");
        service.shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_queued_search_is_timed_from_when_it_runs_not_while_it_waits_for_a_slot() {
        let dir = tempfile::tempdir().unwrap();
        let broker = broker(&dir);
        let mut config = SearchConfig::new(&broker.config.data_dir);
        config.max_concurrent_searches = 1;
        config.query_timeout = Duration::from_millis(250);
        let service = SearchService::start(broker, config).unwrap();
        // Four searches of 100 ms each through one slot: the last waits 300 ms, past the
        // limit, but runs well within it.
        let one = || {
            service.run_limited(|| {
                std::thread::sleep(Duration::from_millis(100));
                Ok(())
            })
        };
        let (a, b, c, d) = tokio::join!(one(), one(), one(), one());
        for r in [a, b, c, d] {
            assert!(r.is_ok(), "{r:?}");
        }
        service.shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_wakes_idle_indexers_instead_of_waiting_out_their_poll() {
        let dir = tempfile::tempdir().unwrap();
        let broker = broker(&dir);
        let mut config = TopicConfig::default();
        config.set("search.enabled", "true").unwrap();
        broker.topics.create("idle", 8, config, false).unwrap();
        let mut search = SearchConfig::new(&broker.config.data_dir);
        // An idle indexer would sleep an hour between looks: stopping must not wait for it.
        search.indexer.idle_poll = Duration::from_secs(3600);
        search.indexer_idle = false;
        let service = SearchService::start(broker.clone(), search).unwrap();
        while service.stats().len() < 8 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Every indexer is past its first step and waiting for records.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let s = service.clone();
        tokio::task::spawn_blocking(move || s.shutdown())
            .await
            .unwrap();
        assert!(service.stats().is_empty());
    }
}
