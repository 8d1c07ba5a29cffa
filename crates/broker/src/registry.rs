//! The topics this broker holds, on disk and in memory.
//!
//! Layout under the data dir: `topics/<name>/topic.json` (id, partition count, config
//! overrides) and `topics/<name>/<partition>/` (that partition's segments). A topic exists
//! once its topic.json is in place; a directory without one is a creation that crashed half
//! way and is removed on start. Deletion moves the directory to `trash/<id>-<name>` first, so
//! a new topic of the same name can be created at once; start-up empties `trash/`. Nothing
//! under `topics/` is ever removed because of its name: every valid topic name (`x.deleted`
//! included) is just a topic.
//!
//! These operations make directories, write files and fsync: callers on async workers run
//! them on the blocking pool (see `Broker::handle`), never on the worker itself.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use spate_log::Flusher;
use spate_protocol::ResponseError;
use uuid::Uuid;

use crate::error::{io, BrokerError};
use crate::partition::Partition;
use crate::topic_config::TopicConfig;

/// Where deleted topics wait for removal, beside (never inside) `topics/`.
const TRASH_DIR: &str = "trash";
/// How deleted topics were marked before the trash directory: `<name>-<id>.deleted` in
/// `topics/`. Only a directory whose topic.json holds that very id is taken for one.
const LEGACY_DELETED_SUFFIX: &str = ".deleted";

#[derive(Serialize, Deserialize)]
struct TopicFile {
    id: Uuid,
    partitions: i32,
    config: TopicConfig,
    /// The partitions with a replica here, when not all of them: in a cluster a broker holds
    /// only the replicas assigned to it. Absent (standalone) means every partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hosted: Option<Vec<i32>>,
}

/// Traffic counters of one topic.
#[derive(Debug, Default)]
pub struct TopicMetrics {
    /// Bytes of record batches appended.
    pub bytes_in: spate_metrics::Counter,
    /// Records appended.
    pub records_in: spate_metrics::Counter,
    /// Bytes of record batches sent to consumers.
    pub bytes_out: spate_metrics::Counter,
    /// Records sent to consumers (counted per whole batch sent).
    pub records_out: spate_metrics::Counter,
}

/// A topic and its partitions.
pub struct Topic {
    /// Traffic counters.
    pub metrics: TopicMetrics,
    /// Topic name.
    pub name: String,
    /// Topic id (KIP-516), stable for the topic's life.
    pub id: Uuid,
    dir: PathBuf,
    /// Indexed by partition number; `None` where this broker holds no replica (cluster mode).
    partitions: RwLock<Vec<Option<Arc<Partition>>>>,
    /// Whether only some partitions are held here (see [`TopicFile::hosted`]).
    sparse: std::sync::atomic::AtomicBool,
    config: RwLock<TopicConfig>,
}

impl std::fmt::Debug for Topic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topic")
            .field("name", &self.name)
            .field("id", &self.id)
            .field("partitions", &self.partition_count())
            .finish()
    }
}

impl Topic {
    /// The partition with this index, if it exists and has a replica on this broker.
    pub fn partition(&self, index: i32) -> Option<Arc<Partition>> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.partitions.read().get(i).cloned().flatten())
    }

    /// The partition with this index, or the error a client gets for it: a partition number
    /// the topic does not have is UNKNOWN_TOPIC_OR_PARTITION; one that exists but has no
    /// replica here is NOT_LEADER_OR_FOLLOWER, which sends clients to refresh their metadata.
    pub fn lookup(&self, index: i32) -> Result<Arc<Partition>, ResponseError> {
        match self.partition(index) {
            Some(p) => Ok(p),
            None if self.has_partition(index) => Err(ResponseError::NotLeaderOrFollower),
            None => Err(ResponseError::UnknownTopicOrPartition),
        }
    }

    /// Whether the topic has a partition with this number (held here or not).
    pub fn has_partition(&self, index: i32) -> bool {
        index >= 0 && index < self.partition_count()
    }

    /// The partitions held on this broker, in index order.
    pub fn partitions(&self) -> Vec<Arc<Partition>> {
        self.partitions.read().iter().flatten().cloned().collect()
    }

    fn is_sparse(&self) -> bool {
        self.sparse.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The numbers of the partitions held on this broker.
    pub fn hosted(&self) -> std::collections::BTreeSet<i32> {
        self.partitions().iter().map(|p| p.index).collect()
    }

    /// Number of partitions.
    pub fn partition_count(&self) -> i32 {
        self.partitions.read().len() as i32
    }

    /// The topic's configuration.
    pub fn config(&self) -> TopicConfig {
        self.config.read().clone()
    }

    /// Reads the configuration in place (no copy), for the produce path.
    pub fn with_config<T>(&self, f: impl FnOnce(&TopicConfig) -> T) -> T {
        f(&self.config.read())
    }

    fn save(&self) -> Result<(), BrokerError> {
        let file = TopicFile {
            id: self.id,
            partitions: self.partition_count(),
            config: self.config(),
            hosted: self
                .is_sparse()
                .then(|| self.hosted().into_iter().collect()),
        };
        let json = serde_json::to_vec_pretty(&file).map_err(|e| BrokerError::CorruptMetadata {
            path: self.dir.clone(),
            reason: e.to_string(),
        })?;
        write_atomically(&self.dir.join("topic.json"), &json)
    }
}

/// The JSON content of `path`, or the default value when the file does not exist.
pub(crate) fn read_json_or_default<T: serde::de::DeserializeOwned + Default>(
    path: &Path,
) -> Result<T, BrokerError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| BrokerError::CorruptMetadata {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(io("read", path)(e)),
    }
}

/// Threads for per-partition disk work at start-up and shutdown: it waits on fsync, not on
/// the CPU, and the disk completes concurrent fsyncs side by side (ext4 commits them together).
const DISK_THREADS: usize = 16;

/// `f` of every item, computed on up to [`DISK_THREADS`] threads; the results in order.
pub(crate) fn side_by_side<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if items.len() <= 1 {
        return items.iter().map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = items.len().min(DISK_THREADS);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else {
                            return out;
                        };
                        out.push((i, f(item)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| match w.join() {
                Ok(out) => out,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    done.sort_unstable_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// Writes `bytes` to `path` so that readers see either the old or the new content, and the
/// new content survives a crash once this returns.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), BrokerError> {
    // Each write has its own temporary file: two writers of the same path (the periodic
    // producer-state snapshot and the one at shutdown) must not rename each other's away.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{n}"));
    let tmp = PathBuf::from(tmp);
    let written = std::fs::File::create(&tmp)
        .map_err(io("create", &tmp))
        .and_then(|mut f| {
            f.write_all(bytes).map_err(io("write", &tmp))?;
            f.sync_all().map_err(io("fsync", &tmp))
        })
        .and_then(|()| std::fs::rename(&tmp, path).map_err(io("rename", path)));
    if let Err(e) = written {
        // The old content is untouched; the temporary file would only hold space (a full
        // disk is the usual cause) and, with its own number, is never overwritten.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if let Some(parent) = path.parent() {
        std::fs::File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(io("fsync", parent))?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), BrokerError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync", dir))
}

/// Removes a directory tree from the trash; a failure is noted and retried on the next start.
fn remove_quietly(path: &Path, notes: &mut Vec<String>) {
    let removed = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    // Not found: the removal a deletion started in the background got there first.
    if let Err(e) = removed.or_else(not_found_is_done) {
        notes.push(format!(
            "cannot remove deleted topic files {}: {e}",
            path.display()
        ));
    }
}

fn not_found_is_done(e: std::io::Error) -> std::io::Result<()> {
    match e.kind() {
        std::io::ErrorKind::NotFound => Ok(()),
        _ => Err(e),
    }
}

/// True for a directory an older spate renamed aside on deletion: `<name>-<id>.deleted` where
/// `<id>` is the id in its own topic.json. A topic a client named like that has a different,
/// random id, so its data is never taken for a marker.
fn is_legacy_deletion_marker(dir_name: &str, id: &Uuid) -> bool {
    dir_name
        .strip_suffix(LEGACY_DELETED_SUFFIX)
        .and_then(|rest| rest.rsplit_once('-'))
        .is_some_and(|(_, tail)| tail == id.simple().to_string())
}

/// Checks a topic name against Kafka's rules.
pub fn validate_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("topic name is empty".into());
    }
    if name == "." || name == ".." {
        return Err(format!("topic name cannot be '{name}'"));
    }
    if name.len() > 249 {
        return Err(format!(
            "topic name is {} characters; the limit is 249",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "topic name '{name}' contains '{c}'; only ASCII letters, digits, '.', '_' and '-' are allowed"
        ));
    }
    Ok(())
}

/// A refused topic operation: the Kafka error and a message for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicError {
    /// Kafka error code.
    pub code: ResponseError,
    /// Human-readable reason.
    pub message: String,
}

impl TopicError {
    pub(crate) fn new(code: ResponseError, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for TopicError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:?})", self.message, self.code)
    }
}

impl From<BrokerError> for TopicError {
    fn from(e: BrokerError) -> Self {
        tracing::error!(error = %e, "topic operation failed");
        Self::new(ResponseError::KafkaStorageError, e.to_string())
    }
}

/// All topics.
pub struct TopicRegistry {
    root: PathBuf,
    trash: PathBuf,
    flusher: Flusher,
    topics: RwLock<HashMap<String, Arc<Topic>>>,
    by_id: RwLock<HashMap<Uuid, Arc<Topic>>>,
    /// Serialises creations, deletions and partition changes.
    changes: Mutex<()>,
    /// Called once a deleted topic's files are gone (the broker samples free space then).
    on_freed: std::sync::OnceLock<Arc<dyn Fn() + Send + Sync>>,
    /// Threads removing deleted topics' files, not yet joined.
    removals: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl TopicRegistry {
    /// Loads every topic under `data_dir`, recovering each partition log. Returns the registry
    /// and one line per repair made.
    pub fn open(data_dir: &Path, flusher: Flusher) -> Result<(Self, Vec<String>), BrokerError> {
        let root = data_dir.join("topics");
        let trash = data_dir.join(TRASH_DIR);
        std::fs::create_dir_all(&root).map_err(io("create", &root))?;
        std::fs::create_dir_all(&trash).map_err(io("create", &trash))?;
        let reg = Self {
            root: root.clone(),
            trash,
            flusher,
            topics: RwLock::new(HashMap::new()),
            by_id: RwLock::new(HashMap::new()),
            changes: Mutex::new(()),
            on_freed: std::sync::OnceLock::new(),
            removals: Mutex::new(Vec::new()),
        };
        let mut notes = reg.empty_trash();
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&root).map_err(io("list", &root))? {
            let entry = entry.map_err(io("list", &root))?;
            let path = entry.path();
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if !path.is_dir() {
                continue;
            }
            let meta = path.join("topic.json");
            if !meta.exists() {
                std::fs::remove_dir_all(&path).map_err(io("remove", &path))?;
                notes.push(format!(
                    "removed half-created topic directory {}",
                    path.display()
                ));
                continue;
            }
            let raw = std::fs::read(&meta).map_err(io("read", &meta))?;
            let file: TopicFile =
                serde_json::from_slice(&raw).map_err(|e| BrokerError::CorruptMetadata {
                    path: meta.clone(),
                    reason: e.to_string(),
                })?;
            if is_legacy_deletion_marker(&name, &file.id) {
                let aside = reg.trash.join(format!("{}-legacy", file.id.simple()));
                std::fs::rename(&path, &aside).map_err(io("rename", &path))?;
                notes.push(format!(
                    "moved deleted topic directory {} to the trash",
                    path.display()
                ));
                remove_quietly(&aside, &mut notes);
                continue;
            }
            found.push((name, path, file));
        }
        for topic in reg.load_topics(found, &mut notes)? {
            reg.insert(topic);
        }
        Ok((reg, notes))
    }

    /// Removes whatever deletions left in the trash (a crash or a failed removal).
    fn empty_trash(&self) -> Vec<String> {
        let mut notes = Vec::new();
        let entries = match std::fs::read_dir(&self.trash) {
            Ok(e) => e,
            Err(e) => {
                notes.push(format!("cannot list {}: {e}", self.trash.display()));
                return notes;
            }
        };
        for entry in entries.flatten() {
            remove_quietly(&entry.path(), &mut notes);
        }
        notes
    }

    fn load_topic(
        &self,
        name: &str,
        dir: PathBuf,
        file: TopicFile,
        notes: &mut Vec<String>,
    ) -> Result<Arc<Topic>, BrokerError> {
        let mut loaded = self.load_topics(vec![(name.to_string(), dir, file)], notes)?;
        loaded.pop().ok_or_else(|| BrokerError::CorruptMetadata {
            path: self.root.join(name),
            reason: "topic not loaded".to_string(),
        })
    }

    /// Opens (or creates) the hosted partitions of `found` topics, all of them side by side.
    fn load_topics(
        &self,
        found: Vec<(String, PathBuf, TopicFile)>,
        notes: &mut Vec<String>,
    ) -> Result<Vec<Arc<Topic>>, BrokerError> {
        // (topic, partition, whether it is a cluster replica) of every hosted partition.
        let mut jobs: Vec<(usize, i32, bool)> = Vec::new();
        for (t, (name, dir, file)) in found.iter().enumerate() {
            let hosted: Option<std::collections::BTreeSet<i32>> =
                file.hosted.as_ref().map(|h| h.iter().copied().collect());
            for p in 0..file.partitions {
                if hosted.as_ref().is_some_and(|h| !h.contains(&p)) {
                    // Left behind by a crash while the replica was being moved away.
                    let stale = dir.join(p.to_string());
                    if stale.exists() {
                        remove_quietly(&stale, notes);
                        notes.push(format!("{name}-{p}: removed a replica no longer held here"));
                    }
                    continue;
                }
                jobs.push((t, p, hosted.is_some()));
            }
        }
        let configs: Vec<_> = found
            .iter()
            .map(|(_, _, f)| f.config.log_config())
            .collect();
        // Opening a partition costs a few fsyncs (its active segment, its directory, the
        // shutdown marker's removal): one after another, 1,000 partitions took 7 to 12 s to
        // start on this machine's disk.
        let opened = side_by_side(&jobs, |&(t, p, replica)| {
            let open = if replica {
                Partition::open_replica
            } else {
                Partition::open
            };
            open(
                &found[t].1.join(p.to_string()),
                p,
                configs[t].clone(),
                self.flusher.clone(),
            )
        });
        let mut partitions: Vec<Vec<Option<Arc<Partition>>>> = found
            .iter()
            .map(|(_, _, f)| vec![None; f.partitions.max(0) as usize])
            .collect();
        for (&(t, p, _), result) in jobs.iter().zip(opened) {
            let (partition, n) = result?;
            let name = &found[t].0;
            notes.extend(n.into_iter().map(|n| format!("{name}-{p}: {n}")));
            if let Some(slot) = partitions[t].get_mut(p as usize) {
                *slot = Some(Arc::new(partition));
            }
        }
        Ok(found
            .into_iter()
            .zip(partitions)
            .map(|((name, dir, file), partitions)| {
                Arc::new(Topic {
                    metrics: TopicMetrics::default(),
                    sparse: std::sync::atomic::AtomicBool::new(file.hosted.is_some()),
                    name,
                    id: file.id,
                    dir,
                    partitions: RwLock::new(partitions),
                    config: RwLock::new(file.config),
                })
            })
            .collect())
    }

    fn insert(&self, topic: Arc<Topic>) {
        self.by_id.write().insert(topic.id, topic.clone());
        self.topics.write().insert(topic.name.clone(), topic);
    }

    /// A topic by name.
    pub fn get(&self, name: &str) -> Option<Arc<Topic>> {
        self.topics.read().get(name).cloned()
    }

    /// A topic by id.
    pub fn get_by_id(&self, id: &Uuid) -> Option<Arc<Topic>> {
        self.by_id.read().get(id).cloned()
    }

    /// Every topic, sorted by name.
    pub fn list(&self) -> Vec<Arc<Topic>> {
        let mut v: Vec<_> = self.topics.read().values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Creates a topic (or, with `validate_only`, checks that it could be created).
    pub fn create(
        &self,
        name: &str,
        partitions: i32,
        config: TopicConfig,
        validate_only: bool,
    ) -> Result<Option<Arc<Topic>>, TopicError> {
        self.create_with_id(name, Uuid::new_v4(), partitions, config, validate_only)
    }

    /// Creates a topic with a given id, holding every partition.
    pub fn create_with_id(
        &self,
        name: &str,
        id: Uuid,
        partitions: i32,
        config: TopicConfig,
        validate_only: bool,
    ) -> Result<Option<Arc<Topic>>, TopicError> {
        self.create_inner(name, id, partitions, config, validate_only, None)
    }

    /// Creates the local part of a cluster topic: the id the metadata quorum chose, and a
    /// replica of only the `hosted` partitions (possibly none).
    pub fn create_hosting(
        &self,
        name: &str,
        id: Uuid,
        partitions: i32,
        config: TopicConfig,
        hosted: &std::collections::BTreeSet<i32>,
    ) -> Result<Arc<Topic>, TopicError> {
        let hosted = hosted.iter().copied().collect();
        self.create_inner(name, id, partitions, config, false, Some(hosted))?
            .ok_or_else(|| {
                TopicError::new(
                    ResponseError::UnknownServerError,
                    "creation returned no topic",
                )
            })
    }

    fn create_inner(
        &self,
        name: &str,
        id: Uuid,
        partitions: i32,
        config: TopicConfig,
        validate_only: bool,
        hosted: Option<Vec<i32>>,
    ) -> Result<Option<Arc<Topic>>, TopicError> {
        validate_topic_name(name)
            .map_err(|m| TopicError::new(ResponseError::InvalidTopicException, m))?;
        if partitions <= 0 {
            return Err(TopicError::new(
                ResponseError::InvalidPartitions,
                format!("number of partitions must be at least 1, got {partitions}"),
            ));
        }
        if partitions > 100_000 {
            return Err(TopicError::new(
                ResponseError::InvalidPartitions,
                format!("{partitions} partitions is more than this broker allows (100000)"),
            ));
        }
        let _guard = self.changes.lock();
        if self.get(name).is_some() {
            return Err(TopicError::new(
                ResponseError::TopicAlreadyExists,
                format!("topic '{name}' already exists"),
            ));
        }
        if validate_only {
            return Ok(None);
        }
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        let file = TopicFile {
            id,
            partitions,
            config,
            hosted,
        };
        let mut notes = Vec::new();
        let topic = self.load_topic(name, dir, file, &mut notes)?;
        topic.save()?;
        self.insert(topic.clone());
        Ok(Some(topic))
    }

    /// Deletes a topic: it disappears at once, its files shortly after.
    pub fn delete(&self, name: &str) -> Result<Arc<Topic>, TopicError> {
        let _guard = self.changes.lock();
        let topic = self.topics.write().remove(name).ok_or_else(|| {
            TopicError::new(
                ResponseError::UnknownTopicOrPartition,
                format!("topic '{name}' does not exist"),
            )
        })?;
        self.by_id.write().remove(&topic.id);
        for p in topic.partitions() {
            p.mark_deleted();
        }
        // Named by id, so two deletions of topics with the same name never meet.
        let aside = self
            .trash
            .join(format!("{}-{}", topic.id.simple(), topic.name));
        std::fs::rename(&topic.dir, &aside).map_err(io("rename", &topic.dir))?;
        // Both directory entries changed: make the move durable so a crash cannot bring the
        // topic back, or keep it in both places.
        sync_dir(&self.root)?;
        sync_dir(&self.trash)?;
        let on_freed = self.on_freed.get().cloned();
        let removal = std::thread::spawn(move || {
            if let Err(e) = std::fs::remove_dir_all(&aside).or_else(not_found_is_done) {
                tracing::warn!(path = %aside.display(), error = %e, "removing deleted topic files failed; retried on next start");
            }
            if let Some(freed) = on_freed {
                freed();
            }
        });
        let mut removals = self.removals.lock();
        removals.retain(|h| !h.is_finished());
        removals.push(removal);
        Ok(topic)
    }

    /// Sets what to call once a deleted topic's files are gone (once; later calls are ignored).
    pub fn on_space_freed(&self, f: Arc<dyn Fn() + Send + Sync>) {
        let _ = self.on_freed.set(f);
    }

    /// Waits until the files of every topic deleted so far are removed.
    pub fn finish_removals(&self) {
        let pending = std::mem::take(&mut *self.removals.lock());
        for h in pending {
            let _ = h.join();
        }
    }

    /// Raises a topic's partition count to `count`.
    pub fn add_partitions(
        &self,
        topic: &Topic,
        count: i32,
        validate_only: bool,
    ) -> Result<(), TopicError> {
        let _guard = self.changes.lock();
        let current = topic.partition_count();
        if count <= current {
            return Err(TopicError::new(
                ResponseError::InvalidPartitions,
                format!("topic '{}' has {current} partitions; the new count must be larger, got {count}", topic.name),
            ));
        }
        if count > 100_000 {
            return Err(TopicError::new(
                ResponseError::InvalidPartitions,
                format!("{count} partitions is more than this broker allows (100000)"),
            ));
        }
        if validate_only {
            return Ok(());
        }
        let log_config = topic.config().log_config();
        let mut added = Vec::new();
        for p in current..count {
            if topic.is_sparse() {
                // A cluster topic grows first; `set_hosted` then adds the replicas assigned here.
                added.push(None);
                continue;
            }
            let (partition, _) = Partition::open(
                &topic.dir.join(p.to_string()),
                p,
                log_config.clone(),
                self.flusher.clone(),
            )?;
            added.push(Some(Arc::new(partition)));
        }
        topic.partitions.write().extend(added);
        topic.save()?;
        Ok(())
    }

    /// Makes the replicas held here for a cluster topic exactly `hosted`: opens (creating
    /// empty logs for) the new ones and deletes the ones no longer assigned here, whose data
    /// goes to the trash like a deleted topic's. Returns the partitions removed, so callers
    /// can stop whatever served them.
    pub fn set_hosted(
        &self,
        topic: &Topic,
        hosted: &std::collections::BTreeSet<i32>,
    ) -> Result<Vec<Arc<Partition>>, TopicError> {
        let _guard = self.changes.lock();
        let current = topic.hosted();
        if &current == hosted && topic.is_sparse() {
            return Ok(Vec::new());
        }
        // A topic created before brokers held only their assigned replicas becomes sparse.
        topic
            .sparse
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let count = topic.partition_count();
        let log_config = topic.config().log_config();
        let mut opened = Vec::new();
        for &p in hosted.difference(&current) {
            if p < 0 || p >= count {
                return Err(TopicError::new(
                    ResponseError::UnknownTopicOrPartition,
                    format!("topic '{}' has no partition {p}", topic.name),
                ));
            }
            // A replica is a follower until the quorum's roles reach it: a produce arriving
            // in between must not land in a partition that commits on its own.
            let (partition, _) = Partition::open_replica(
                &topic.dir.join(p.to_string()),
                p,
                log_config.clone(),
                self.flusher.clone(),
            )?;
            opened.push(Arc::new(partition));
        }
        let mut removed = Vec::new();
        {
            let mut slots = topic.partitions.write();
            for p in opened {
                let i = p.index as usize;
                slots[i] = Some(p);
            }
            for &p in current.difference(hosted) {
                if let Some(gone) = usize::try_from(p).ok().and_then(|i| slots[i].take()) {
                    gone.mark_deleted();
                    removed.push(gone);
                }
            }
        }
        // Record the new set before moving data away: a crash in between leaves a directory
        // the next start does not open, and the next reconcile removes it again.
        topic.save()?;
        for p in &removed {
            let dir = topic.dir.join(p.index.to_string());
            let aside = self.trash.join(format!(
                "{}-{}-{}-{}",
                topic.id.simple(),
                topic.name,
                p.index,
                Uuid::new_v4().simple()
            ));
            std::fs::rename(&dir, &aside).map_err(io("rename", &dir))?;
            sync_dir(&topic.dir)?;
            std::thread::spawn(move || {
                if let Err(e) = std::fs::remove_dir_all(&aside).or_else(not_found_is_done) {
                    tracing::warn!(path = %aside.display(), error = %e, "removing a moved-away replica failed; retried on next start");
                }
            });
        }
        Ok(removed)
    }

    /// Replaces a topic's configuration and applies it to its logs.
    pub fn set_config(&self, topic: &Topic, config: TopicConfig) -> Result<(), TopicError> {
        let _guard = self.changes.lock();
        let log_config = config.log_config();
        *topic.config.write() = config;
        topic.save()?;
        for p in topic.partitions() {
            p.set_log_config(log_config.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_log::FsyncPolicy;

    #[test]
    fn side_by_side_gives_every_result_in_the_order_of_its_items() {
        let items: Vec<u64> = (0..100).collect();
        let threads = Mutex::new(std::collections::HashSet::new());
        let out = side_by_side(&items, |i| {
            threads.lock().insert(std::thread::current().id());
            // A wait, as an fsync is: the other threads take the next items meanwhile.
            std::thread::sleep(std::time::Duration::from_millis(2));
            i * 2
        });
        assert_eq!(out, items.iter().map(|i| i * 2).collect::<Vec<_>>());
        assert!(threads.lock().len() > 1, "the work ran on one thread");
        assert_eq!(side_by_side(&[7u8], |i| *i), vec![7]);
        assert!(side_by_side(&[] as &[u8], |i| *i).is_empty());
    }

    #[test]
    fn a_failed_atomic_write_leaves_no_temporary_file_behind() {
        let dir = tempfile::tempdir().unwrap();
        // The rename fails: the target is a directory that is not empty.
        let target = dir.path().join("topic.json");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("x"), b"x").unwrap();
        assert!(write_atomically(&target, b"{}").is_err());
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, vec!["topic.json".to_string()]);
        write_atomically(&dir.path().join("other.json"), b"{}").unwrap();
        assert_eq!(std::fs::read(dir.path().join("other.json")).unwrap(), b"{}");
    }

    #[test]
    fn topic_names_follow_kafka_rules() {
        assert!(validate_topic_name("orders.v1_eu-west").is_ok());
        assert!(validate_topic_name("").is_err());
        assert!(validate_topic_name("..").is_err());
        assert!(validate_topic_name("a/b").is_err());
        assert!(validate_topic_name("ünicode").is_err());
        assert!(validate_topic_name(&"x".repeat(250)).is_err());
    }

    #[test]
    fn a_cluster_topic_holds_only_its_assigned_replicas_across_moves_and_reopen() {
        use std::collections::BTreeSet;
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let (reg, _) = TopicRegistry::open(dir.path(), flusher.clone()).unwrap();
        let id = Uuid::new_v4();
        let t = reg
            .create_hosting(
                "moving",
                id,
                3,
                TopicConfig::default(),
                &BTreeSet::from([0]),
            )
            .unwrap();
        assert_eq!(t.hosted(), BTreeSet::from([0]));
        assert!(dir.path().join("topics/moving/0").exists());
        assert!(!dir.path().join("topics/moving/1").exists());
        assert!(reg
            .set_hosted(&t, &BTreeSet::from([0, 2]))
            .unwrap()
            .is_empty());
        assert_eq!(t.hosted(), BTreeSet::from([0, 2]));
        let gone = reg.set_hosted(&t, &BTreeSet::from([2])).unwrap();
        assert_eq!(gone.iter().map(|p| p.index).collect::<Vec<_>>(), vec![0]);
        assert!(
            !dir.path().join("topics/moving/0").exists(),
            "moved to the trash"
        );
        // Not held here: NOT_LEADER_OR_FOLLOWER; not in the topic at all: UNKNOWN.
        assert_eq!(t.lookup(0).err(), Some(ResponseError::NotLeaderOrFollower));
        assert_eq!(
            t.lookup(3).err(),
            Some(ResponseError::UnknownTopicOrPartition)
        );
        assert!(t.lookup(2).is_ok());
        // Growing keeps the new partitions unheld until assigned.
        reg.add_partitions(&t, 4, false).unwrap();
        assert_eq!((t.partition_count(), t.hosted()), (4, BTreeSet::from([2])));
        drop((t, gone, reg));
        let (reg, notes) = TopicRegistry::open(dir.path(), flusher).unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        let t = reg.get("moving").unwrap();
        assert_eq!(
            (t.id, t.partition_count(), t.hosted()),
            (id, 4, BTreeSet::from([2]))
        );
        assert!(
            !dir.path().join("topics/moving/1").exists(),
            "unheld partitions have no files"
        );
    }

    #[test]
    fn topics_survive_reopen_and_deletion_frees_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let (reg, _) = TopicRegistry::open(dir.path(), flusher.clone()).unwrap();
        let mut config = TopicConfig::default();
        config.set("retention.ms", "5000").unwrap();
        let t = reg.create("orders", 3, config, false).unwrap().unwrap();
        let id = t.id;
        reg.add_partitions(&t, 5, false).unwrap();
        assert_eq!(
            reg.create("orders", 1, TopicConfig::default(), false)
                .unwrap_err()
                .code,
            ResponseError::TopicAlreadyExists
        );
        drop(reg);
        let (reg, notes) = TopicRegistry::open(dir.path(), flusher.clone()).unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        let t = reg.get("orders").unwrap();
        assert_eq!((t.id, t.partition_count()), (id, 5));
        assert_eq!(t.config().get("retention.ms"), Some(("5000", true)));
        assert!(reg.get_by_id(&id).is_some());
        assert!(reg.delete("orders").is_ok());
        assert!(reg.get("orders").is_none());
        let again = reg
            .create("orders", 1, TopicConfig::default(), false)
            .unwrap()
            .unwrap();
        assert_ne!(again.id, id);
    }

    fn append_one(t: &Topic, value: &'static [u8]) {
        use spate_protocol::batch::{build, validate, NewRecord};
        use spate_protocol::records::Compression;
        let record = NewRecord {
            value: Some(bytes::Bytes::from_static(value)),
            ..NewRecord::default()
        };
        let batch = build(&[record], None, Compression::None).unwrap();
        let header = validate(&batch).unwrap();
        t.partition(0)
            .unwrap()
            .append(&batch, &header, None)
            .unwrap();
    }

    #[test]
    fn topics_named_like_deletion_markers_survive_delete_recreate_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let (reg, _) = TopicRegistry::open(dir.path(), flusher.clone()).unwrap();
        // The last one looks exactly like the marker older versions left for a deleted topic.
        let lookalike = format!("victim-{}.deleted", Uuid::new_v4().simple());
        let names = [
            "x.deleted",
            ".deleted",
            "a.deleted.deleted",
            "x-deleted",
            lookalike.as_str(),
        ];
        for name in names {
            let t = reg
                .create(name, 1, TopicConfig::default(), false)
                .unwrap()
                .unwrap();
            append_one(&t, b"first");
        }
        // Delete and recreate one of them, and delete a topic whose trash name could clash.
        let old_id = reg.get("x.deleted").unwrap().id;
        reg.delete("x.deleted").unwrap();
        let t = reg
            .create("x.deleted", 1, TopicConfig::default(), false)
            .unwrap()
            .unwrap();
        append_one(&t, b"second");
        append_one(&t, b"third");
        reg.create("x", 1, TopicConfig::default(), false).unwrap();
        reg.delete("x").unwrap();
        drop(reg);
        for _ in 0..2 {
            let (reg, notes) = TopicRegistry::open(dir.path(), flusher.clone()).unwrap();
            assert!(notes.is_empty(), "{notes:?}");
            for name in names {
                let t = reg.get(name).unwrap_or_else(|| panic!("{name} is gone"));
                let expected = if name == "x.deleted" { 2 } else { 1 };
                assert_eq!(t.partition(0).unwrap().log_end_offset(), expected, "{name}");
            }
            assert_ne!(reg.get("x.deleted").unwrap().id, old_id);
            assert!(reg.get("x").is_none());
            assert_eq!(reg.list().len(), names.len());
        }
        let left: Vec<_> = std::fs::read_dir(dir.path().join(TRASH_DIR))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "the trash is emptied on start");
    }

    #[test]
    fn a_deletion_marker_left_by_an_older_version_is_removed_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let (reg, _) = TopicRegistry::open(dir.path(), flusher.clone()).unwrap();
        let t = reg
            .create("old", 1, TopicConfig::default(), false)
            .unwrap()
            .unwrap();
        let id = t.id;
        drop((t, reg));
        let topics = dir.path().join("topics");
        let marker = topics.join(format!("old-{}.deleted", id.simple()));
        std::fs::rename(topics.join("old"), &marker).unwrap();
        let (reg, notes) = TopicRegistry::open(dir.path(), flusher).unwrap();
        assert!(reg.list().is_empty());
        assert!(!marker.exists());
        assert_eq!(notes.len(), 1, "{notes:?}");
    }

    #[test]
    fn concurrent_creations_of_one_name_make_one_topic_and_topic_already_exists() {
        let dir = tempfile::tempdir().unwrap();
        let (reg, _) =
            TopicRegistry::open(dir.path(), Flusher::start(FsyncPolicy::Never).unwrap()).unwrap();
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| reg.create("race", 2, TopicConfig::default(), false)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let created = results.iter().filter(|r| matches!(r, Ok(Some(_)))).count();
        let refused = results
            .iter()
            .filter(|r| matches!(r, Err(e) if e.code == ResponseError::TopicAlreadyExists))
            .count();
        assert_eq!((created, refused), (1, 7));
    }

    #[test]
    fn half_created_topic_is_removed_on_open() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("topics/ghost/0")).unwrap();
        let (reg, notes) =
            TopicRegistry::open(dir.path(), Flusher::start(FsyncPolicy::Never).unwrap()).unwrap();
        assert!(reg.get("ghost").is_none());
        assert_eq!(notes.len(), 1);
    }
}
