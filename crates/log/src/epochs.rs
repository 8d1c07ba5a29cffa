//! The leader-epoch checkpoint: for each leader epoch that wrote to the log, the offset of its
//! first batch. A replica that comes back asks the leader where its last epoch ended
//! (OffsetForLeaderEpoch) and truncates what came after, so no divergent tail survives.
//!
//! The file (`leader-epoch-checkpoint`, as Kafka names it) is rewritten before the first batch
//! of a new epoch is appended, so it never misses an epoch the log holds. Leadership changes
//! are rare, so this write stays off the steady-state append path.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{IoContext, LogError};
use crate::storage::{self, Storage};

/// File name of the checkpoint inside a partition's directory.
pub const CHECKPOINT_FILE: &str = "leader-epoch-checkpoint";

const VERSION: &str = "0";

/// One epoch's first offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    /// The leader epoch.
    pub epoch: i32,
    /// Offset of the first batch written in it.
    pub start_offset: i64,
}

/// Epoch -> start offset, in increasing order of both, persisted.
pub(crate) struct LeaderEpochCache {
    entries: Vec<EpochEntry>,
    path: PathBuf,
    storage: Arc<dyn Storage>,
}

impl LeaderEpochCache {
    /// Loads the checkpoint in `dir`, keeping only entries that start below `log_end`. `None`
    /// when there is no usable file (the caller rebuilds from the batch headers).
    pub(crate) fn load(
        storage: &Arc<dyn Storage>,
        dir: &Path,
        log_end: i64,
    ) -> Result<Option<Self>, LogError> {
        let path = dir.join(CHECKPOINT_FILE);
        let bytes = match storage.read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).ctx("read leader epoch checkpoint", &path),
        };
        let Some(mut entries) = parse(&bytes) else {
            return Ok(None);
        };
        entries.retain(|e| e.start_offset < log_end);
        Ok(Some(Self {
            entries,
            path,
            storage: storage.clone(),
        }))
    }

    /// A cache built from the given entries (rebuilt from the log), written to disk.
    pub(crate) fn rebuilt(
        storage: &Arc<dyn Storage>,
        dir: &Path,
        entries: Vec<EpochEntry>,
    ) -> Result<Self, LogError> {
        let cache = Self {
            entries,
            path: dir.join(CHECKPOINT_FILE),
            storage: storage.clone(),
        };
        cache.persist()?;
        Ok(cache)
    }

    /// The entries, oldest first.
    pub(crate) fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    /// The latest epoch that wrote to the log.
    pub(crate) fn latest(&self) -> Option<EpochEntry> {
        self.entries.last().copied()
    }

    /// Notes that `epoch` starts writing at `start_offset`; persists when it is new. An epoch
    /// older than the latest is refused: a leader never goes back in time.
    pub(crate) fn assign(&mut self, epoch: i32, start_offset: i64) -> Result<(), LogError> {
        match self.latest() {
            Some(last) if epoch == last.epoch => return Ok(()),
            Some(last) if epoch < last.epoch || start_offset < last.start_offset => {
                return Err(LogError::StaleEpoch {
                    epoch,
                    latest: last.epoch,
                })
            }
            _ => {}
        }
        self.entries.push(EpochEntry {
            epoch,
            start_offset,
        });
        let persisted = self.persist();
        if persisted.is_err() {
            self.entries.pop();
        }
        persisted
    }

    /// Forgets every epoch (the log was emptied to start over elsewhere).
    pub(crate) fn clear(&mut self) -> Result<(), LogError> {
        if self.entries.is_empty() {
            return Ok(());
        }
        self.entries.clear();
        self.persist()
    }

    /// Drops epochs that start at or after `end` (the log was truncated there).
    pub(crate) fn truncate_from_end(&mut self, end: i64) -> Result<(), LogError> {
        let before = self.entries.len();
        self.entries.retain(|e| e.start_offset < end);
        if self.entries.len() != before {
            self.persist()?;
        }
        Ok(())
    }

    /// OffsetForLeaderEpoch: the largest epoch at most `requested` and the offset where it
    /// ended (the next epoch's start, or `log_end` for the latest epoch). `None` when the log
    /// knows no epoch at or below `requested`... and no later one either (empty log).
    pub(crate) fn end_offset_for(&self, requested: i32, log_end: i64) -> Option<(i32, i64)> {
        let last = self.latest()?;
        if requested >= last.epoch {
            return Some((last.epoch, log_end));
        }
        let higher = self.entries.iter().position(|e| e.epoch > requested)?;
        let end = self.entries[higher].start_offset;
        match higher.checked_sub(1) {
            Some(floor) => Some((self.entries[floor].epoch, end)),
            // Every epoch we know is newer: the requester's epoch ended where ours began.
            None => Some((requested, end)),
        }
    }

    fn persist(&self) -> Result<(), LogError> {
        let mut text = format!("{VERSION}\n{}\n", self.entries.len());
        for e in &self.entries {
            text.push_str(&format!("{} {}\n", e.epoch, e.start_offset));
        }
        storage::write_atomically(&*self.storage, &self.path, text.as_bytes())
            .ctx("write leader epoch checkpoint", &self.path)
    }
}

fn parse(bytes: &[u8]) -> Option<Vec<EpochEntry>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut lines = text.lines();
    if lines.next()? != VERSION {
        return None;
    }
    let count: usize = lines.next()?.parse().ok()?;
    let mut entries: Vec<EpochEntry> = Vec::with_capacity(count.min(1 << 16));
    for line in lines {
        let mut parts = line.split_whitespace();
        let epoch = parts.next()?.parse().ok()?;
        let start_offset = parts.next()?.parse().ok()?;
        if let Some(prev) = entries.last() {
            if epoch <= prev.epoch || start_offset < prev.start_offset {
                return None;
            }
        }
        entries.push(EpochEntry {
            epoch,
            start_offset,
        });
    }
    (entries.len() == count).then_some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimDisk;

    fn cache(entries: &[(i32, i64)]) -> (SimDisk, LeaderEpochCache) {
        let disk = SimDisk::new();
        let storage = disk.storage();
        let dir = Path::new("/p");
        storage.create_dir_all(dir).unwrap();
        let entries = entries
            .iter()
            .map(|&(epoch, start_offset)| EpochEntry {
                epoch,
                start_offset,
            })
            .collect();
        let c = LeaderEpochCache::rebuilt(&storage, dir, entries).unwrap();
        (disk, c)
    }

    #[test]
    fn end_offset_for_an_epoch_is_where_the_next_one_starts() {
        let (_, c) = cache(&[(1, 0), (3, 10), (4, 25)]);
        assert_eq!(c.end_offset_for(4, 40), Some((4, 40)));
        assert_eq!(c.end_offset_for(7, 40), Some((4, 40)));
        assert_eq!(c.end_offset_for(3, 40), Some((3, 25)));
        // Epoch 2 never wrote here: the answer is the epoch below it and where 3 began.
        assert_eq!(c.end_offset_for(2, 40), Some((1, 10)));
        assert_eq!(c.end_offset_for(0, 40), Some((0, 0)));
    }

    #[test]
    fn an_empty_cache_knows_no_epoch() {
        let (_, c) = cache(&[]);
        assert_eq!(c.end_offset_for(5, 0), None);
    }

    #[test]
    fn checkpoint_survives_power_loss_and_truncation_drops_later_epochs() {
        let (disk, mut c) = cache(&[(0, 0)]);
        c.assign(2, 5).unwrap();
        c.assign(2, 9).unwrap();
        assert!(matches!(
            c.assign(1, 12),
            Err(LogError::StaleEpoch {
                epoch: 1,
                latest: 2
            })
        ));
        disk.power_loss(crate::sim::Tear::LoseAll);
        let storage = disk.storage();
        let loaded = LeaderEpochCache::load(&storage, Path::new("/p"), 100)
            .unwrap()
            .unwrap();
        assert_eq!(loaded.entries().len(), 2);
        let mut loaded = loaded;
        loaded.truncate_from_end(5).unwrap();
        assert_eq!(loaded.latest().map(|e| e.epoch), Some(0));
        let reread = LeaderEpochCache::load(&storage, Path::new("/p"), 100)
            .unwrap()
            .unwrap();
        assert_eq!(reread.entries(), loaded.entries());
    }

    #[test]
    fn damaged_checkpoint_is_not_trusted() {
        for bad in [
            "",
            "1\n0\n",
            "0\n2\n1 0\n",
            "0\n2\n3 10\n2 20\n",
            "0\n1\nx y\n",
        ] {
            assert!(parse(bad.as_bytes()).is_none(), "{bad:?}");
        }
    }
}
