//! The Raft log on disk: one append-only file of checksummed records, plus small files for
//! the vote, the committed log id and the purge point.
//!
//! Record layout: `u32 LE body length | u32 LE CRC-32C of the body | body` where the body is
//! the serde_json encoding of one `Entry` (JSON for the same reasons as the network: the
//! metadata log is small and a readable log is worth more than the bytes).
//!
//! Contract with openraft (see `RaftLogStorage`): an append is written and fdatasync'd before
//! the flush callback fires (so a vote counted by a leader is on disk); truncation cuts the
//! file at the first removed record and is synced; the vote is replaced atomically and
//! fsync'd. Purging records the purge point durably first and compacts the file only when
//! the dead prefix outweighs the live records, so a crash in between never loses live
//! entries. Recovery stops at the first record that is incomplete or fails its CRC and cuts
//! the file there: that is where an unsynced write was torn.
//!
//! All entries since the last purge are also kept in memory (the metadata log is purged
//! after every snapshot), so reads never touch the disk and never wait for an fsync.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::ops::{Bound, RangeBounds};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogReader, StorageIOError, Vote};
use parking_lot::{Mutex, RwLock};
use serde::de::DeserializeOwned;

use super::files::{corrupt, read_optional, sync_dir, write_atomic};
use super::{NodeId, StorageError, TypeConfig};

const ENTRIES_FILE: &str = "entries";
const VOTE_FILE: &str = "vote.json";
const COMMITTED_FILE: &str = "committed.json";
const PURGED_FILE: &str = "purged.json";
const HEADER_LEN: usize = 8;
/// Upper bound of one record: larger lengths in a header can only be a torn write.
const MAX_RECORD_BYTES: usize = 64 << 20;

type LogEntry = Entry<TypeConfig>;

/// State that changes only under the disk lock, with I/O.
struct Disk {
    dir: PathBuf,
    file: File,
    file_len: u64,
    /// File offset of each live record, by log index.
    offsets: BTreeMap<u64, u64>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
}

/// What readers see: updated after the disk, under a short write lock.
#[derive(Default)]
struct Mem {
    entries: BTreeMap<u64, LogEntry>,
    last_purged: Option<LogId<NodeId>>,
}

struct Shared {
    disk: Mutex<Disk>,
    mem: RwLock<Mem>,
}

/// The on-disk Raft log (openraft's `RaftLogStorage`).
pub struct LogStore {
    shared: Arc<Shared>,
    torn_bytes_dropped: u64,
}

/// A cheap reader of the same log, for openraft's replication tasks.
#[derive(Clone)]
pub struct LogReader {
    shared: Arc<Shared>,
}

impl LogReader {
    /// The id of the last entry (or, in an empty log, the last purged one): what a vote
    /// compares logs by.
    pub fn last_log_id(&self) -> Option<LogId<NodeId>> {
        let mem = self.shared.mem.read();
        mem.entries
            .last_key_value()
            .map(|(_, e)| e.log_id)
            .or(mem.last_purged)
    }
}

enum Decoded {
    Record(Box<LogEntry>, usize),
    End,
    Torn(&'static str),
}

fn decode_record(buf: &[u8], path: &Path) -> io::Result<Decoded> {
    if buf.is_empty() {
        return Ok(Decoded::End);
    }
    if buf.len() < HEADER_LEN {
        return Ok(Decoded::Torn("incomplete record header"));
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let crc = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    // A zeroed header also has a "valid" CRC (of nothing): zero-filled tails are what a
    // filesystem leaves after a crash that extended the file without writing it.
    if len == 0 || len > MAX_RECORD_BYTES {
        return Ok(Decoded::Torn("impossible record length"));
    }
    let Some(body) = buf.get(HEADER_LEN..HEADER_LEN + len) else {
        return Ok(Decoded::Torn("incomplete record body"));
    };
    if crc32c::crc32c(body) != crc {
        return Ok(Decoded::Torn("record CRC mismatch"));
    }
    // A body that passed its CRC but does not parse was written by an incompatible build:
    // refusing to start is the only safe answer.
    let entry: LogEntry = serde_json::from_slice(body)
        .map_err(|e| corrupt(path, format!("a checksummed record does not parse: {e}")))?;
    Ok(Decoded::Record(Box::new(entry), HEADER_LEN + len))
}

fn encode_record(buf: &mut Vec<u8>, entry: &LogEntry) -> io::Result<()> {
    let body = serde_json::to_vec(entry).map_err(io::Error::other)?;
    if body.len() > MAX_RECORD_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "log entry {} is {} bytes, above the {MAX_RECORD_BYTES}-byte record limit",
                entry.log_id,
                body.len()
            ),
        ));
    }
    // The length fits: it is bounded by MAX_RECORD_BYTES just above.
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    buf.extend_from_slice(&body);
    Ok(())
}

fn read_json<T: DeserializeOwned>(dir: &Path, name: &str) -> io::Result<Option<T>> {
    match read_optional(dir, name)? {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| corrupt(&dir.join(name), e)),
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> io::Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(io::Error::other)
}

impl Disk {
    fn open(dir: PathBuf) -> io::Result<(Disk, Mem, u64)> {
        std::fs::create_dir_all(&dir)?;
        let vote = read_json(&dir, VOTE_FILE)?;
        // The committed id is written without fsync (losing it only means re-learning the
        // commit point from the leader), so a damaged file is read as "unknown".
        let committed = read_json(&dir, COMMITTED_FILE).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "ignoring unreadable committed log id");
            None
        });
        let last_purged: Option<LogId<NodeId>> = read_json(&dir, PURGED_FILE)?;
        let path = dir.join(ENTRIES_FILE);
        let existed = path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        if !existed {
            sync_dir(&dir)?;
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;

        let mut mem = Mem {
            entries: BTreeMap::new(),
            last_purged,
        };
        let mut offsets = BTreeMap::new();
        let mut pos = 0usize;
        loop {
            match decode_record(&bytes[pos..], &path)? {
                Decoded::Record(entry, len) => {
                    let index = entry.log_id.index;
                    // Same rule as append: a record at or below the last index replaces the
                    // tail from there on.
                    mem.entries.split_off(&index);
                    offsets.split_off(&index);
                    offsets.insert(index, pos as u64);
                    mem.entries.insert(index, *entry);
                    pos += len;
                }
                Decoded::End => break,
                Decoded::Torn(reason) => {
                    tracing::warn!(
                        file = %path.display(),
                        offset = pos,
                        dropped_bytes = bytes.len() - pos,
                        reason,
                        "raft log: dropping a torn tail left by a crash"
                    );
                    break;
                }
            }
        }
        let torn = (bytes.len() - pos) as u64;
        if torn > 0 {
            file.set_len(pos as u64)?;
            file.sync_data()?;
        }
        if let Some(p) = &mem.last_purged {
            mem.entries = mem.entries.split_off(&(p.index + 1));
            offsets = offsets.split_off(&(p.index + 1));
        }
        let disk = Disk {
            dir,
            file,
            file_len: pos as u64,
            offsets,
            vote,
            committed,
        };
        Ok((disk, mem, torn))
    }

    fn append(&mut self, mem: &RwLock<Mem>, entries: Vec<LogEntry>) -> io::Result<()> {
        let Some(first) = entries.first() else {
            return Ok(());
        };
        if self
            .offsets
            .last_key_value()
            .is_some_and(|(&last, _)| first.log_id.index <= last)
        {
            // openraft truncates before overwriting; this keeps the file's indexes strictly
            // increasing even if it did not.
            self.truncate_from(mem, first.log_id.index)?;
        }
        let mut buf = Vec::new();
        let mut placed = Vec::with_capacity(entries.len());
        for entry in &entries {
            placed.push((entry.log_id.index, self.file_len + buf.len() as u64));
            encode_record(&mut buf, entry)?;
        }
        self.file.write_all_at(&buf, self.file_len)?;
        self.file.sync_data()?;
        self.file_len += buf.len() as u64;
        self.offsets.extend(placed);
        let mut mem = mem.write();
        for entry in entries {
            mem.entries.insert(entry.log_id.index, entry);
        }
        Ok(())
    }

    fn truncate_from(&mut self, mem: &RwLock<Mem>, index: u64) -> io::Result<()> {
        let Some((_, &offset)) = self.offsets.range(index..).next() else {
            return Ok(());
        };
        self.file.set_len(offset)?;
        self.file.sync_data()?;
        self.file_len = offset;
        self.offsets.split_off(&index);
        mem.write().entries.split_off(&index);
        Ok(())
    }

    fn purge(&mut self, mem: &RwLock<Mem>, log_id: LogId<NodeId>) -> io::Result<()> {
        if mem
            .read()
            .last_purged
            .as_ref()
            .is_some_and(|p| p.index >= log_id.index)
        {
            return Ok(());
        }
        // The purge point goes to disk first: from then on recovery ignores what is below it,
        // whether or not the file was compacted yet.
        write_atomic(&self.dir, PURGED_FILE, &to_json(&log_id)?, true)?;
        let keep_from = log_id.index.saturating_add(1);
        {
            let mut mem = mem.write();
            mem.entries = mem.entries.split_off(&keep_from);
            mem.last_purged = Some(log_id);
        }
        self.offsets = self.offsets.split_off(&keep_from);
        let live_start = self
            .offsets
            .first_key_value()
            .map_or(self.file_len, |(_, &o)| o);
        if live_start > 0 && live_start >= self.file_len - live_start {
            self.compact(live_start)?;
        }
        Ok(())
    }

    /// Rewrites the file without its dead prefix `[0, live_start)`.
    fn compact(&mut self, live_start: u64) -> io::Result<()> {
        let live_len = usize::try_from(self.file_len - live_start)
            .map_err(|_| io::Error::other("raft log too large to compact in memory"))?;
        let mut live = vec![0u8; live_len];
        self.file.read_exact_at(&mut live, live_start)?;
        // Written aside and renamed over the log: a crash leaves the old file or the new one.
        write_atomic(&self.dir, ENTRIES_FILE, &live, true)?;
        self.file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.dir.join(ENTRIES_FILE))?;
        self.file_len -= live_start;
        for offset in self.offsets.values_mut() {
            *offset -= live_start;
        }
        Ok(())
    }
}

impl Shared {
    fn read_range<RB: RangeBounds<u64>>(&self, range: RB) -> Vec<LogEntry> {
        // An inverted or empty range is simply empty; BTreeMap::range would panic on it.
        let start = match range.start_bound() {
            Bound::Included(&s) => Some(s),
            Bound::Excluded(&s) => s.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.checked_add(1),
            Bound::Excluded(&e) => Some(e),
            Bound::Unbounded => None,
        };
        let Some(start) = start else {
            return Vec::new();
        };
        let mem = self.mem.read();
        match end {
            Some(end) if end <= start => Vec::new(),
            Some(end) => mem
                .entries
                .range(start..end)
                .map(|(_, e)| e.clone())
                .collect(),
            None => mem.entries.range(start..).map(|(_, e)| e.clone()).collect(),
        }
    }
}

/// Runs a blocking disk operation off the async threads (fsync can take milliseconds).
async fn blocking<T, F>(shared: &Arc<Shared>, f: F) -> io::Result<T>
where
    T: Send + 'static,
    F: FnOnce(&Shared) -> io::Result<T> + Send + 'static,
{
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || f(&shared))
        .await
        .map_err(|e| io::Error::other(format!("raft log task failed: {e}")))?
}

fn write_err(e: io::Error) -> StorageError {
    StorageIOError::write_logs(&e).into()
}

impl LogStore {
    /// Opens the log in `dir`, recovering from a torn tail.
    pub async fn open(dir: PathBuf) -> Result<Self, StorageError> {
        let (disk, mem, torn) = tokio::task::spawn_blocking(move || Disk::open(dir))
            .await
            .map_err(|e| StorageIOError::read_logs(&io::Error::other(e.to_string())))?
            .map_err(|e| StorageIOError::read_logs(&e))?;
        Ok(LogStore {
            shared: Arc::new(Shared {
                disk: Mutex::new(disk),
                mem: RwLock::new(mem),
            }),
            torn_bytes_dropped: torn,
        })
    }

    /// Bytes of a torn tail that recovery cut off when this log was opened.
    pub fn torn_bytes_dropped(&self) -> u64 {
        self.torn_bytes_dropped
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<LogEntry>, StorageError> {
        Ok(self.shared.read_range(range))
    }
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<LogEntry>, StorageError> {
        Ok(self.shared.read_range(range))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let mem = self.shared.mem.read();
        let last_log_id = mem
            .entries
            .last_key_value()
            .map(|(_, e)| e.log_id)
            .or(mem.last_purged);
        Ok(LogState {
            last_purged_log_id: mem.last_purged,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            shared: self.shared.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let vote = *vote;
        blocking(&self.shared, move |s| {
            let mut disk = s.disk.lock();
            write_atomic(&disk.dir, VOTE_FILE, &to_json(&vote)?, true)?;
            disk.vote = Some(vote);
            Ok(())
        })
        .await
        .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        Ok(self.shared.disk.lock().vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError> {
        blocking(&self.shared, move |s| {
            let mut disk = s.disk.lock();
            // Not fsync'd: a lost or older committed id is always safe (it only delays
            // re-applying entries at start-up until the leader says they are committed).
            write_atomic(&disk.dir, COMMITTED_FILE, &to_json(&committed)?, false)?;
            disk.committed = committed;
            Ok(())
        })
        .await
        .map_err(write_err)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError> {
        Ok(self.shared.disk.lock().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = LogEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<LogEntry> = entries.into_iter().collect();
        blocking(&self.shared, move |s| s.disk.lock().append(&s.mem, entries))
            .await
            .map_err(write_err)?;
        // Only now is the write on disk: this is what lets openraft count it.
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        blocking(&self.shared, move |s| {
            s.disk.lock().truncate_from(&s.mem, log_id.index)
        })
        .await
        .map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        blocking(&self.shared, move |s| s.disk.lock().purge(&s.mem, log_id))
            .await
            .map_err(write_err)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use openraft::storage::RaftLogStorageExt;
    use openraft::testing::log_id;
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::metadata::MetadataCommand;

    fn entry(term: u64, index: u64) -> LogEntry {
        Entry {
            log_id: log_id(term, 1, index),
            payload: EntryPayload::Normal(MetadataCommand::DeleteTopic {
                name: format!("t{index}"),
            }),
        }
    }

    /// Appends through the trait and waits for the flush callback, as openraft does.
    async fn append(store: &mut LogStore, entries: Vec<LogEntry>) {
        RaftLogStorageExt::blocking_append(store, entries)
            .await
            .unwrap();
    }

    async fn indexes(store: &mut LogStore) -> Vec<u64> {
        store
            .try_get_log_entries(..)
            .await
            .unwrap()
            .iter()
            .map(|e| e.log_id.index)
            .collect()
    }

    fn entries_path(dir: &Path) -> PathBuf {
        dir.join(ENTRIES_FILE)
    }

    #[tokio::test]
    async fn empty_log_answers_every_query_without_panicking() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, None);
        assert_eq!(state.last_purged_log_id, None);
        assert!(store.try_get_log_entries(0..100).await.unwrap().is_empty());
        #[allow(clippy::reversed_empty_ranges)] // an inverted range is exactly what is tested
        let inverted = 5..3;
        assert!(store
            .try_get_log_entries(inverted)
            .await
            .unwrap()
            .is_empty());
        assert!(store
            .try_get_log_entries(..=u64::MAX)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(store.read_vote().await.unwrap(), None);
        assert_eq!(store.read_committed().await.unwrap(), None);
        store.truncate(log_id(1, 1, 0)).await.unwrap();
        append(&mut store, vec![]).await;
        store.purge(log_id(1, 1, 0)).await.unwrap();
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(1, 1, 0)));
    }

    #[tokio::test]
    async fn log_vote_and_committed_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
            append(&mut store, (1..=5).map(|i| entry(1, i)).collect()).await;
            store.save_vote(&Vote::new_committed(3, 2)).await.unwrap();
            store.save_committed(Some(log_id(1, 1, 4))).await.unwrap();
        }
        let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
        assert_eq!(store.torn_bytes_dropped(), 0);
        assert_eq!(indexes(&mut store).await, vec![1, 2, 3, 4, 5]);
        assert_eq!(
            store.read_vote().await.unwrap(),
            Some(Vote::new_committed(3, 2))
        );
        assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 1, 4)));
        let got = store.try_get_log_entries(3..4).await.unwrap();
        assert_eq!(
            serde_json::to_string(&got[0]).unwrap(),
            serde_json::to_string(&entry(1, 3)).unwrap()
        );
    }

    #[tokio::test]
    async fn truncate_and_purge_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
            append(&mut store, (1..=10).map(|i| entry(1, i)).collect()).await;
            store.truncate(log_id(1, 1, 8)).await.unwrap();
            append(&mut store, vec![entry(2, 8)]).await;
            store.purge(log_id(1, 1, 3)).await.unwrap();
        }
        let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
        assert_eq!(indexes(&mut store).await, vec![4, 5, 6, 7, 8]);
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 3)));
        assert_eq!(state.last_log_id, Some(log_id(2, 1, 8)));
    }

    #[tokio::test]
    async fn purge_compacts_the_file_once_the_dead_prefix_dominates() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
        append(&mut store, (1..=10).map(|i| entry(1, i)).collect()).await;
        let full = std::fs::metadata(entries_path(dir.path())).unwrap().len();
        store.purge(log_id(1, 1, 2)).await.unwrap();
        assert_eq!(
            std::fs::metadata(entries_path(dir.path())).unwrap().len(),
            full
        );
        store.purge(log_id(1, 1, 7)).await.unwrap();
        let compacted = std::fs::metadata(entries_path(dir.path())).unwrap().len();
        assert!(compacted < full / 2, "{compacted} vs {full}");
        append(&mut store, vec![entry(1, 11)]).await;
        store.truncate(log_id(1, 1, 10)).await.unwrap();
        drop(store);
        let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
        assert_eq!(indexes(&mut store).await, vec![8, 9]);
    }

    #[tokio::test]
    async fn purge_beyond_the_last_entry_empties_the_log_but_keeps_the_last_log_id() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
            append(&mut store, (1..=3).map(|i| entry(1, i)).collect()).await;
            store.purge(log_id(2, 1, 20)).await.unwrap();
        }
        let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
        assert!(indexes(&mut store).await.is_empty());
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(2, 1, 20)));
        append(&mut store, vec![entry(2, 21)]).await;
        assert_eq!(indexes(&mut store).await, vec![21]);
    }

    #[tokio::test]
    async fn reopening_after_a_crash_drops_a_torn_last_write() {
        let dir = tempfile::tempdir().unwrap();
        let synced_len;
        {
            let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
            append(&mut store, (1..=5).map(|i| entry(1, i)).collect()).await;
            synced_len = std::fs::metadata(entries_path(dir.path())).unwrap().len();
            append(&mut store, vec![entry(1, 6)]).await;
        }
        // The crash hit while the sixth entry was being written: only part of it is there.
        let f = OpenOptions::new()
            .write(true)
            .open(entries_path(dir.path()))
            .unwrap();
        f.set_len(synced_len + 11).unwrap();
        drop(f);
        let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
        assert_eq!(store.torn_bytes_dropped(), 11);
        assert_eq!(indexes(&mut store).await, vec![1, 2, 3, 4, 5]);
        assert_eq!(
            std::fs::metadata(entries_path(dir.path())).unwrap().len(),
            synced_len
        );
        // The log goes on from the cut.
        append(&mut store, vec![entry(2, 6)]).await;
        drop(store);
        let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
        assert_eq!(indexes(&mut store).await, vec![1, 2, 3, 4, 5, 6]);
        let last = store.get_log_state().await.unwrap().last_log_id;
        assert_eq!(last, Some(log_id(2, 1, 6)));
    }

    #[tokio::test]
    async fn reopening_drops_a_zero_filled_or_corrupted_tail() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
            append(&mut store, (1..=3).map(|i| entry(1, i)).collect()).await;
        }
        let mut f = OpenOptions::new()
            .append(true)
            .open(entries_path(dir.path()))
            .unwrap();
        f.write_all(&[0u8; 64]).unwrap();
        drop(f);
        let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
        assert_eq!(store.torn_bytes_dropped(), 64);
        assert_eq!(indexes(&mut store).await, vec![1, 2, 3]);
        drop(store);

        // Flip one byte in the body of the last record: its CRC no longer matches.
        let path = entries_path(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 2] ^= 0x55;
        std::fs::write(&path, &bytes).unwrap();
        let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
        assert!(store.torn_bytes_dropped() > 0);
        assert_eq!(indexes(&mut store).await, vec![1, 2]);
    }

    #[tokio::test]
    async fn unreadable_vote_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(VOTE_FILE), b"{not json").unwrap();
        let err = LogStore::open(dir.path().to_path_buf())
            .await
            .err()
            .unwrap();
        assert!(err.to_string().contains("vote.json"), "{err}");
    }

    #[tokio::test]
    async fn append_over_existing_indexes_replaces_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
        append(&mut store, (1..=5).map(|i| entry(1, i)).collect()).await;
        append(&mut store, vec![entry(3, 3)]).await;
        assert_eq!(indexes(&mut store).await, vec![1, 2, 3]);
        drop(store);
        let mut store = LogStore::open(dir.path().to_path_buf()).await.unwrap();
        assert_eq!(indexes(&mut store).await, vec![1, 2, 3]);
        let last = store.get_log_state().await.unwrap().last_log_id.unwrap();
        assert_eq!(last.leader_id, CommittedLeaderId::new(3, 1));
    }
}
