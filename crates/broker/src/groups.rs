//! The shell around the pure group [`Coordinator`]: parks JoinGroup/SyncGroup requests until
//! their answers are released, ticks the coordinator's clock, and keeps committed offsets
//! durable in an internal log (`<data>/internal/__consumer_offsets`), hidden from topic
//! listings and compacted by rewriting it when it holds mostly superseded commits.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use spate_groups::record::{decode_value, encode_value, OffsetKey};
use spate_groups::{Committed, Coordinator, CoordinatorConfig, OffsetStore, Reply, Token};
use spate_log::{wait_durable, Flusher, Log, LogConfig};
use spate_protocol::batch::{self, NewRecord};
use spate_protocol::records::{Compression, RecordBatchDecoder};
use spate_protocol::ResponseError;
use tokio::sync::oneshot;

use crate::error::{io, BrokerError};
use crate::time::now_ms;

/// Name of the internal offsets log, as in Kafka.
pub const OFFSETS_LOG: &str = "__consumer_offsets";
/// Rewrite the offsets log once it is this large and mostly superseded.
const COMPACT_FROM_BYTES: u64 = 64 << 20;
/// How often the coordinator's clock advances (session and rebalance timeouts resolve to it).
const TICK: Duration = Duration::from_millis(100);

/// Group settings from the broker configuration.
#[derive(Debug, Clone)]
pub struct GroupSettings {
    /// The coordinator's timeouts and limits.
    pub coordinator: CoordinatorConfig,
    /// Committed offsets of groups without members expire after this long.
    pub offsets_retention_ms: i64,
    /// Largest metadata string accepted with a commit (offset.metadata.max.bytes).
    pub max_metadata_bytes: usize,
}

impl Default for GroupSettings {
    fn default() -> Self {
        Self {
            coordinator: CoordinatorConfig::default(),
            offsets_retention_ms: 7 * 24 * 3600 * 1000,
            max_metadata_bytes: 4096,
        }
    }
}

struct OffsetsLog {
    log: Log,
    dir: PathBuf,
}

/// Groups and committed offsets.
pub struct GroupService {
    settings: GroupSettings,
    coordinator: Mutex<Coordinator>,
    waiters: Mutex<HashMap<Token, oneshot::Sender<Reply>>>,
    next_token: AtomicU64,
    offsets: Mutex<OffsetStore>,
    log: Mutex<OffsetsLog>,
    flusher: Flusher,
}

impl GroupService {
    /// Opens the offsets log under `data_dir` and replays it.
    pub fn open(
        data_dir: &Path,
        settings: GroupSettings,
        flusher: Flusher,
    ) -> Result<Self, BrokerError> {
        let dir = data_dir.join("internal").join(OFFSETS_LOG);
        recover_compaction(&dir)?;
        let (log, notes) = Log::open(&dir, offsets_log_config(), flusher.clone(), now_ms())?;
        for n in notes {
            tracing::warn!("recovery: {OFFSETS_LOG}: {n}");
        }
        let mut store = OffsetStore::default();
        replay(&log, &mut store)?;
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Ok(Self {
            coordinator: Mutex::new(Coordinator::new(settings.coordinator.clone(), nonce)),
            settings,
            waiters: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(1),
            offsets: Mutex::new(store),
            log: Mutex::new(OffsetsLog { log, dir }),
            flusher,
        })
    }

    /// The settings in force.
    pub fn settings(&self) -> &GroupSettings {
        &self.settings
    }

    /// Advances the coordinator's clock every 100 ms until the service is dropped.
    pub fn spawn_ticker(self: &Arc<Self>) {
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(s) = weak.upgrade() else { return };
                let replies = s.coordinator.lock().tick(now_ms());
                s.deliver(replies);
            }
        });
    }

    /// Runs a coordinator call that may park a request; resolves with the parked request's
    /// answer.
    pub fn call(
        &self,
        f: impl FnOnce(&mut Coordinator, i64, Token) -> Vec<Reply>,
    ) -> impl std::future::Future<Output = Option<Reply>> + Send + 'static {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().insert(token, tx);
        let replies = f(&mut self.coordinator.lock(), now_ms(), token);
        self.deliver(replies);
        async move { rx.await.ok() }
    }

    /// Reads the coordinator (describe, list...).
    pub fn coordinator<T>(&self, f: impl FnOnce(&Coordinator) -> T) -> T {
        f(&self.coordinator.lock())
    }

    /// Runs a coordinator call that answers at once and may release parked answers
    /// (heartbeat, leave, commit checks).
    pub fn with<T>(&self, f: impl FnOnce(&mut Coordinator, i64) -> (T, Vec<Reply>)) -> T {
        let (out, replies) = f(&mut self.coordinator.lock(), now_ms());
        self.deliver(replies);
        out
    }

    fn deliver(&self, replies: Vec<Reply>) {
        if replies.is_empty() {
            return;
        }
        let mut waiters = self.waiters.lock();
        for r in replies {
            let token = match &r {
                Reply::Join(t, _) | Reply::Sync(t, _) => *t,
            };
            if let Some(tx) = waiters.remove(&token) {
                // The client may have gone; its answer has nowhere to go.
                let _ = tx.send(r);
            }
        }
    }

    /// Every group (with members or only committed offsets): id, state, protocol type and
    /// member count.
    pub fn summaries(&self) -> Vec<(String, &'static str, String, usize)> {
        let coordinator = self.coordinator.lock();
        let mut out: Vec<(String, &'static str, String, usize)> = coordinator
            .list()
            .into_iter()
            .map(|(id, state, ptype)| {
                let members = coordinator.describe(&id).map_or(0, |d| d.members.len());
                (id, state.name(), ptype, members)
            })
            .collect();
        for g in self.offsets.lock().group_ids() {
            if !out.iter().any(|(id, ..)| id == g) {
                out.push((
                    g.to_string(),
                    spate_groups::GroupState::Empty.name(),
                    String::new(),
                    0,
                ));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Deletes a group without members and its committed offsets (DeleteGroups).
    pub fn delete_group(&self, id: &str) -> Result<(), ResponseError> {
        let has_offsets = self.offsets.lock().has_group(id);
        match self.coordinator.lock().delete(id) {
            Err(ResponseError::GroupIdNotFound) if has_offsets => {}
            other => other?,
        }
        let tombstones: Vec<_> = self
            .offsets
            .lock()
            .group(id)
            .into_iter()
            .map(|(t, p, _)| (t.to_string(), p, None))
            .collect();
        self.write(id, &tombstones).map(|_| ())
    }

    /// Committed offsets, read under the store lock.
    pub fn offsets<T>(&self, f: impl FnOnce(&OffsetStore) -> T) -> T {
        f(&self.offsets.lock())
    }

    /// Writes commits (or, with `None` values, deletions) to the offsets log and applies them.
    /// Returns the offset after the written batch, for durability waits.
    pub fn write(
        &self,
        group: &str,
        entries: &[(String, i32, Option<Committed>)],
    ) -> Result<i64, ResponseError> {
        if entries.is_empty() {
            return Ok(self.log.lock().log.end_offset());
        }
        let batch = encode_batch(group, entries).map_err(|e| {
            tracing::warn!(group, error = %e, "cannot encode offsets");
            ResponseError::InvalidCommitOffsetSize
        })?;
        let end = {
            let mut log = self.log.lock();
            let info = log.log.append(&batch, 0, None, now_ms()).map_err(|e| {
                tracing::error!(error = %e, "offsets log append failed");
                ResponseError::KafkaStorageError
            })?;
            // Applied under the log lock so the store and the log agree on order.
            let mut store = self.offsets.lock();
            for (topic, partition, value) in entries {
                store.apply(group, topic, *partition, value.clone());
            }
            info.last_offset + 1
        };
        Ok(end)
    }

    /// Waits until the offsets log is durable up to `end`, as the fsync policy promises acks:
    /// REQUEST_TIMED_OUT when the fsync takes over 30 s, KAFKA_STORAGE_ERROR when it failed.
    pub fn durable(
        &self,
        end: i64,
    ) -> impl std::future::Future<Output = Result<(), ResponseError>> + Send + 'static {
        let wait = self.flusher.policy().acks_wait_for_fsync();
        let mut rx = self.log.lock().log.durable_offset();
        async move {
            if !wait {
                return Ok(());
            }
            match tokio::time::timeout(Duration::from_secs(30), wait_durable(&mut rx, end)).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(_)) => Err(ResponseError::KafkaStorageError),
                Err(_) => Err(ResponseError::RequestTimedOut),
            }
        }
    }

    /// Saves the offsets log for a clean shutdown.
    pub fn close(&self) {
        if let Err(e) = self.log.lock().log.close() {
            tracing::warn!(error = %e, "clean shutdown of {OFFSETS_LOG} failed; it will be scanned on start");
        }
    }

    /// Expires offsets of groups without members (offsets.retention.minutes) and compacts the
    /// offsets log when it is mostly superseded records. Called from the retention pass.
    pub fn maintain(&self) {
        let cutoff = now_ms() - self.settings.offsets_retention_ms;
        let expired = {
            let coordinator = self.coordinator.lock();
            self.offsets
                .lock()
                .expired(cutoff, |g| !coordinator.has_members(g))
        };
        let mut by_group: HashMap<String, Vec<(String, i32, Option<Committed>)>> = HashMap::new();
        for (g, t, p) in expired {
            by_group.entry(g).or_default().push((t, p, None));
        }
        for (g, entries) in by_group {
            match self.write(&g, &entries) {
                Ok(_) => {
                    tracing::info!(group = %g, offsets = entries.len(), "expired committed offsets")
                }
                Err(e) => tracing::warn!(group = %g, error = ?e, "offset expiry failed"),
            }
        }
        if let Err(e) = self.compact_if_worthwhile() {
            tracing::error!(error = %e, "compacting {OFFSETS_LOG} failed");
        }
    }

    fn compact_if_worthwhile(&self) -> Result<(), BrokerError> {
        let mut guard = self.log.lock();
        let size = guard.log.size_bytes();
        let live = self.offsets.lock().len() as u64 * 128;
        if size < COMPACT_FROM_BYTES || size < live * 4 {
            return Ok(());
        }
        let store = self.offsets.lock().clone();
        let dir = guard.dir.clone();
        let fresh = sibling(&dir, "compacting");
        let old = sibling(&dir, "old");
        let _ = std::fs::remove_dir_all(&fresh);
        {
            let (mut log, _) =
                Log::open(&fresh, offsets_log_config(), self.flusher.clone(), now_ms())?;
            let groups: Vec<String> = store.group_ids().map(str::to_string).collect();
            for g in groups {
                let entries: Vec<(String, i32, Option<Committed>)> = store
                    .group(&g)
                    .into_iter()
                    .map(|(t, p, c)| (t.to_string(), p, Some(c.clone())))
                    .collect();
                for chunk in entries.chunks(1000) {
                    let batch =
                        encode_batch(&g, chunk).map_err(|e| BrokerError::CorruptMetadata {
                            path: fresh.clone(),
                            reason: e,
                        })?;
                    log.append(&batch, 0, None, now_ms())?;
                }
            }
            log.roll(now_ms())?;
        }
        std::fs::rename(&dir, &old).map_err(io("rename", &dir))?;
        std::fs::rename(&fresh, &dir).map_err(io("rename", &fresh))?;
        let (log, _) = Log::open(&dir, offsets_log_config(), self.flusher.clone(), now_ms())?;
        guard.log = log;
        std::fs::remove_dir_all(&old).map_err(io("remove", &old))?;
        tracing::info!(
            before = size,
            after = guard.log.size_bytes(),
            "compacted {OFFSETS_LOG}"
        );
        Ok(())
    }
}

fn offsets_log_config() -> LogConfig {
    LogConfig {
        segment_bytes: 16 << 20,
        retention_ms: -1,
        retention_bytes: -1,
        ..LogConfig::default()
    }
}

fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut name = dir
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".{suffix}"));
    dir.with_file_name(name)
}

/// Finishes or undoes a compaction a crash interrupted: a half-written copy is discarded; a
/// swap that renamed the old log aside but not the new one into place is reverted.
fn recover_compaction(dir: &Path) -> Result<(), BrokerError> {
    let fresh = sibling(dir, "compacting");
    let old = sibling(dir, "old");
    if !dir.exists() && old.exists() {
        std::fs::rename(&old, dir).map_err(io("rename", &old))?;
    }
    for leftover in [fresh, old] {
        if leftover.exists() {
            std::fs::remove_dir_all(&leftover).map_err(io("remove", &leftover))?;
        }
    }
    Ok(())
}

fn replay(log: &Log, store: &mut OffsetStore) -> Result<(), BrokerError> {
    let mut offset = log.start_offset();
    let end = log.end_offset();
    let mut skipped = 0usize;
    while offset < end {
        let chunk = log.read(offset, 1 << 20, end, true)?;
        if chunk.records.is_empty() {
            break;
        }
        let mut buf = chunk.records.clone();
        let sets =
            RecordBatchDecoder::decode_all(&mut buf).map_err(|e| BrokerError::CorruptMetadata {
                path: log.dir().to_path_buf(),
                reason: e.to_string(),
            })?;
        for set in sets {
            for r in set.records {
                offset = offset.max(r.offset + 1);
                let Some(key) = r.key.and_then(|k| OffsetKey::decode(k).ok()) else {
                    skipped += 1;
                    continue;
                };
                let value = match r.value {
                    None => None,
                    Some(v) => match decode_value(v) {
                        Ok(c) => Some(c),
                        Err(_) => {
                            skipped += 1;
                            continue;
                        }
                    },
                };
                store.apply(&key.group, &key.topic, key.partition, value);
            }
        }
    }
    if skipped > 0 {
        tracing::warn!(skipped, "unreadable records in {OFFSETS_LOG} were ignored");
    }
    Ok(())
}

fn encode_batch(
    group: &str,
    entries: &[(String, i32, Option<Committed>)],
) -> Result<Bytes, String> {
    let now = now_ms();
    let records = entries
        .iter()
        .map(|(topic, partition, value)| {
            let key = OffsetKey {
                group: group.to_string(),
                topic: topic.clone(),
                partition: *partition,
            }
            .encode()
            .map_err(|e| e.to_string())?;
            Ok(NewRecord {
                key: Some(key),
                value: value.as_ref().map(encode_value),
                timestamp: now,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    batch::build(&records, None, Compression::None).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_log::FsyncPolicy;

    fn committed(offset: i64) -> Option<Committed> {
        Some(Committed {
            offset,
            leader_epoch: 2,
            metadata: Some("m".into()),
            commit_timestamp_ms: now_ms(),
        })
    }

    #[test]
    fn commits_survive_reopen_and_deletes_stick() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let svc =
            GroupService::open(dir.path(), GroupSettings::default(), flusher.clone()).unwrap();
        svc.write(
            "g",
            &[
                ("t".into(), 0, committed(10)),
                ("t".into(), 1, committed(20)),
            ],
        )
        .unwrap();
        svc.write("g", &[("t".into(), 0, committed(11))]).unwrap();
        svc.write("g", &[("t".into(), 1, None)]).unwrap();
        drop(svc);
        let svc = GroupService::open(dir.path(), GroupSettings::default(), flusher).unwrap();
        svc.offsets(|s| {
            assert_eq!(s.get("g", "t", 0).map(|c| c.offset), Some(11));
            assert!(s.get("g", "t", 1).is_none());
            assert_eq!(
                s.get("g", "t", 0)
                    .and_then(|c| c.metadata.clone())
                    .as_deref(),
                Some("m")
            );
        });
    }

    #[test]
    fn interrupted_compaction_is_undone() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let svc =
            GroupService::open(dir.path(), GroupSettings::default(), flusher.clone()).unwrap();
        svc.write("g", &[("t".into(), 0, committed(10))]).unwrap();
        drop(svc);
        let main = dir.path().join("internal").join(OFFSETS_LOG);
        std::fs::rename(&main, sibling(&main, "old")).unwrap();
        std::fs::create_dir_all(sibling(&main, "compacting")).unwrap();
        let svc = GroupService::open(dir.path(), GroupSettings::default(), flusher).unwrap();
        svc.offsets(|s| assert_eq!(s.get("g", "t", 0).map(|c| c.offset), Some(10)));
        assert!(!sibling(&main, "compacting").exists());
    }
}
