//! The topics this broker holds, on disk and in memory.
//!
//! Layout under the data dir: `topics/<name>/topic.json` (id, partition count, config
//! overrides) and `topics/<name>/<partition>/` (that partition's segments). A topic exists
//! once its topic.json is in place; a directory without one is a creation that crashed half
//! way and is removed on start. Deletion renames the directory aside first, so a new topic of
//! the same name can be created at once.

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

const DELETED_SUFFIX: &str = ".deleted";

#[derive(Serialize, Deserialize)]
struct TopicFile {
    id: Uuid,
    partitions: i32,
    config: TopicConfig,
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
    partitions: RwLock<Vec<Arc<Partition>>>,
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
    /// The partition with this index, if it exists.
    pub fn partition(&self, index: i32) -> Option<Arc<Partition>> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.partitions.read().get(i).cloned())
    }

    /// All partitions in index order.
    pub fn partitions(&self) -> Vec<Arc<Partition>> {
        self.partitions.read().clone()
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
        };
        let json = serde_json::to_vec_pretty(&file).map_err(|e| BrokerError::CorruptMetadata {
            path: self.dir.clone(),
            reason: e.to_string(),
        })?;
        write_atomically(&self.dir.join("topic.json"), &json)
    }
}

/// Writes `bytes` to `path` so that readers see either the old or the new content, and the
/// new content survives a crash once this returns.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), BrokerError> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io("create", &tmp))?;
    f.write_all(bytes).map_err(io("write", &tmp))?;
    f.sync_all().map_err(io("fsync", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io("rename", path))?;
    if let Some(parent) = path.parent() {
        std::fs::File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(io("fsync", parent))?;
    }
    Ok(())
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

impl From<BrokerError> for TopicError {
    fn from(e: BrokerError) -> Self {
        tracing::error!(error = %e, "topic operation failed");
        Self::new(ResponseError::KafkaStorageError, e.to_string())
    }
}

/// All topics.
pub struct TopicRegistry {
    root: PathBuf,
    flusher: Flusher,
    topics: RwLock<HashMap<String, Arc<Topic>>>,
    by_id: RwLock<HashMap<Uuid, Arc<Topic>>>,
    /// Serialises creations, deletions and partition changes.
    changes: Mutex<()>,
}

impl TopicRegistry {
    /// Loads every topic under `data_dir`, recovering each partition log. Returns the registry
    /// and one line per repair made.
    pub fn open(data_dir: &Path, flusher: Flusher) -> Result<(Self, Vec<String>), BrokerError> {
        let root = data_dir.join("topics");
        std::fs::create_dir_all(&root).map_err(io("create", &root))?;
        let reg = Self {
            root: root.clone(),
            flusher,
            topics: RwLock::new(HashMap::new()),
            by_id: RwLock::new(HashMap::new()),
            changes: Mutex::new(()),
        };
        let mut notes = Vec::new();
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
            if name.ends_with(DELETED_SUFFIX) || !meta.exists() {
                std::fs::remove_dir_all(&path).map_err(io("remove", &path))?;
                if !name.ends_with(DELETED_SUFFIX) {
                    notes.push(format!(
                        "removed half-created topic directory {}",
                        path.display()
                    ));
                }
                continue;
            }
            let raw = std::fs::read(&meta).map_err(io("read", &meta))?;
            let file: TopicFile =
                serde_json::from_slice(&raw).map_err(|e| BrokerError::CorruptMetadata {
                    path: meta.clone(),
                    reason: e.to_string(),
                })?;
            let topic = reg.load_topic(&name, path, file, &mut notes)?;
            reg.insert(topic);
        }
        Ok((reg, notes))
    }

    fn load_topic(
        &self,
        name: &str,
        dir: PathBuf,
        file: TopicFile,
        notes: &mut Vec<String>,
    ) -> Result<Arc<Topic>, BrokerError> {
        let log_config = file.config.log_config();
        let mut partitions = Vec::with_capacity(file.partitions.max(0) as usize);
        for p in 0..file.partitions {
            let (partition, n) = Partition::open(
                &dir.join(p.to_string()),
                p,
                log_config.clone(),
                self.flusher.clone(),
            )?;
            notes.extend(n.into_iter().map(|n| format!("{name}-{p}: {n}")));
            partitions.push(Arc::new(partition));
        }
        Ok(Arc::new(Topic {
            metrics: TopicMetrics::default(),
            name: name.to_string(),
            id: file.id,
            dir,
            partitions: RwLock::new(partitions),
            config: RwLock::new(file.config),
        }))
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
            id: Uuid::new_v4(),
            partitions,
            config,
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
        let aside = self
            .root
            .join(format!("{name}-{}{DELETED_SUFFIX}", topic.id.simple()));
        std::fs::rename(&topic.dir, &aside).map_err(io("rename", &topic.dir))?;
        std::thread::spawn(move || {
            if let Err(e) = std::fs::remove_dir_all(&aside) {
                tracing::warn!(path = %aside.display(), error = %e, "removing deleted topic files failed; retried on next start");
            }
        });
        Ok(topic)
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
            let (partition, _) = Partition::open(
                &topic.dir.join(p.to_string()),
                p,
                log_config.clone(),
                self.flusher.clone(),
            )?;
            added.push(Arc::new(partition));
        }
        topic.partitions.write().extend(added);
        topic.save()?;
        Ok(())
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
    fn topic_names_follow_kafka_rules() {
        assert!(validate_topic_name("orders.v1_eu-west").is_ok());
        assert!(validate_topic_name("").is_err());
        assert!(validate_topic_name("..").is_err());
        assert!(validate_topic_name("a/b").is_err());
        assert!(validate_topic_name("ünicode").is_err());
        assert!(validate_topic_name(&"x".repeat(250)).is_err());
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
