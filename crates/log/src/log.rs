//! The partition log: segments in offset order, the last one active.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use spate_protocol::batch::{self, BatchHeader, Batches, ControlRecord, HEADER_LEN};
use spate_protocol::records::RecordBatchDecoder;
use tokio::sync::watch;

use crate::config::LogConfig;
use crate::durability::{Durability, Flusher, SyncState};
use crate::epochs::{EpochEntry, LeaderEpochCache};
use crate::error::{IoContext, LogError};
use crate::segment::{self, SealJob, SealedIndexes, Segment};
use crate::start_offset::StartCheckpoint;
use crate::storage::{FsStorage, OpenMode, Storage};

/// Where an append landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    /// Offset of the first record.
    pub base_offset: i64,
    /// Offset of the last record.
    pub last_offset: i64,
}

/// Bytes returned by a read: whole batches, possibly starting before the requested offset
/// (clients skip records below the offset they asked for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadResult {
    /// Whole RecordBatches, empty when nothing is available.
    pub records: Bytes,
}

/// An offset found by timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampLookup {
    /// Offset of the record.
    pub offset: i64,
    /// Its timestamp.
    pub timestamp: i64,
}

/// One partition's log.
pub struct Log {
    dir: PathBuf,
    config: LogConfig,
    segments: Vec<Segment>,
    sync: Arc<SyncState>,
    flusher: Flusher,
    storage: Arc<dyn Storage>,
    /// Segments rolled but not yet sealed by the flusher thread.
    seals: Vec<Arc<SealSlot>>,
    epochs: LeaderEpochCache,
    /// The first offset served when DeleteRecords moved it past the first segment's base;
    /// never below that base (see [`Log::start_offset`]).
    start: i64,
    start_checkpoint: StartCheckpoint,
}

/// When deleting old segments fsyncs the log's directory.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DirSync {
    /// After each deletion: nothing durable hides the segments, so no hole may show.
    EachDeletion,
    /// Once after the last: a durable log start already hides them.
    Once,
}

/// A roll's sealing work, run by the flusher thread or, when the log needs it done now
/// (truncation, close), by whoever gets to it first.
struct SealSlot {
    base_offset: i64,
    state: Mutex<SealState>,
    done: Condvar,
    sync: Arc<SyncState>,
}

enum SealState {
    Queued(SealJob),
    Running,
    Done(Result<SealedIndexes, LogError>),
    Taken,
}

impl SealSlot {
    /// Runs the job unless someone already did.
    fn run(&self) {
        let job = {
            let mut st = self.state.lock();
            match std::mem::replace(&mut *st, SealState::Running) {
                SealState::Queued(job) => job,
                other => {
                    *st = other;
                    return;
                }
            }
        };
        let result = job.run();
        match &result {
            Err(e) if e.is_storage_full() => {
                // Only the index files could not be written; the data is on disk.
                tracing::warn!(error = %e, "sealing a segment: no space for its index files; they are rebuilt at the next start");
            }
            Err(e) => {
                // The job fsyncs the segment: a failure there may have dropped its pages, so
                // a later fsync of the same file proves nothing.
                tracing::error!(error = %e, "sealing a segment failed; the log is out of service until restart");
                self.sync.fail();
            }
            Ok(_) => {}
        }
        *self.state.lock() = SealState::Done(result);
        self.done.notify_all();
    }

    /// Runs the job here if it is still queued, waits if it is running, and returns its result
    /// once (later calls get `None`).
    fn finish(&self) -> Option<Result<SealedIndexes, LogError>> {
        self.run();
        let mut st = self.state.lock();
        while matches!(*st, SealState::Running) {
            self.done.wait(&mut st);
        }
        match std::mem::replace(&mut *st, SealState::Taken) {
            SealState::Done(r) => Some(r),
            _ => None,
        }
    }

    fn is_done(&self) -> bool {
        matches!(*self.state.lock(), SealState::Done(_))
    }
}

impl Log {
    /// Opens (or creates) the log in `dir` on the real file system; see [`Log::open_on`].
    pub fn open(
        dir: &Path,
        config: LogConfig,
        flusher: Flusher,
        now_ms: i64,
    ) -> Result<(Self, Vec<String>), LogError> {
        Self::open_on(FsStorage::shared(), dir, config, flusher, now_ms)
    }

    /// Opens (or creates) the log in `dir` on `storage`, recovering it: sealed segments keep
    /// their indexes when sound, the active segment is scanned and cut at the first invalid
    /// batch. Returns the log and a line for each repair made.
    pub fn open_on(
        storage: Arc<dyn Storage>,
        dir: &Path,
        config: LogConfig,
        flusher: Flusher,
        now_ms: i64,
    ) -> Result<(Self, Vec<String>), LogError> {
        storage.create_dir_all(dir).ctx("create log dir", dir)?;
        let mut bases = Vec::new();
        for name in storage.list_dir(dir).ctx("list log dir", dir)? {
            if name.ends_with(CLEANED_SUFFIX) {
                // A clean that stopped before its swap: the segment it copied is intact.
                let path = dir.join(&name);
                storage
                    .remove_file(&path)
                    .ctx("remove unfinished clean", &path)?;
                continue;
            }
            if let Some(stem) = name.strip_suffix(".log") {
                if let Ok(base) = stem.parse::<i64>() {
                    bases.push(base);
                }
            }
        }
        bases.sort_unstable();
        let interval = config.index_interval_bytes as u64;
        let mut notes = Vec::new();
        let mut segments = Vec::with_capacity(bases.len().max(1));
        // Per segment: whether recovery cut damaged data off its end.
        let mut cut = Vec::with_capacity(bases.len());
        let clean = read_clean_marker(&*storage, dir);
        for (i, &base) in bases.iter().enumerate() {
            let (seg, note) = match bases.get(i + 1) {
                Some(&next) => {
                    let (seg, note, was_cut) =
                        Segment::open_sealed(&storage, dir, base, next, interval, now_ms)?;
                    cut.push(was_cut);
                    (seg, note)
                }
                None => {
                    let trusted = match clean {
                        Some((next, len)) => Segment::open_after_clean_shutdown(
                            &storage, dir, base, next, len, now_ms,
                        )?,
                        None => None,
                    };
                    match trusted {
                        Some(seg) => (seg, None),
                        None => Segment::recover(&storage, dir, base, interval, now_ms)?,
                    }
                }
            };
            notes.extend(note);
            segments.push(seg);
        }
        // The marker describes one shutdown only: from now on the log may change again.
        spend_clean_marker(&*storage, dir)?;
        // A sealed segment that recovery shortened leaves a gap before its successor; the data
        // after such a gap cannot be trusted to follow on, so drop it. (A gap compaction left,
        // after whole batches at a segment's end were removed, is no damage.)
        let mut keep = segments.len();
        for i in 1..segments.len() {
            let shortened = cut.get(i - 1).copied().unwrap_or(false);
            if shortened && segments[i - 1].next_offset != segments[i].base_offset {
                keep = i;
                break;
            }
        }
        for seg in segments.drain(keep..) {
            notes.push(format!(
                "removed segment {} after a gap in offsets",
                seg.path.display()
            ));
            seg.delete()?;
        }
        if segments.is_empty() {
            segments.push(Segment::create(&storage, dir, 0, now_ms)?);
        }
        // What a crashed process wrote may still be only in the page cache: make it durable
        // before it is reported durable (a retried produce is acknowledged on that report).
        if let Some(active) = segments.last() {
            active.file.sync_data().ctx("fsync segment", &active.path)?;
        }
        storage.sync_dir(dir).ctx("fsync log dir", dir)?;
        let end = segments.last().map_or(0, |s| s.next_offset);
        let epochs = match LeaderEpochCache::load(&storage, dir, end)? {
            Some(c) => c,
            None => {
                let found = epochs_from_headers(&segments)?;
                if !found.is_empty() {
                    notes.push(format!(
                        "rebuilt the leader epoch checkpoint from {} epoch(s) in the log",
                        found.len()
                    ));
                }
                LeaderEpochCache::rebuilt(&storage, dir, found)?
            }
        };
        let start_checkpoint = StartCheckpoint::new(&storage, dir);
        let first = segments[0].base_offset;
        // A checkpoint past the end means the log lost its tail (a power loss before the
        // segments' fsync): serve what is left rather than nothing.
        let start = start_checkpoint.load()?.unwrap_or(first).clamp(first, end);
        let mut log = Self {
            dir: dir.to_path_buf(),
            config,
            segments,
            sync: SyncState::new(storage.clone(), dir.to_path_buf(), end),
            flusher,
            storage,
            seals: Vec::new(),
            epochs,
            start,
            start_checkpoint,
        };
        // Segments wholly below a durable start are what a DeleteRecords that crashed
        // mid-deletion left (possibly with holes between them): never served, so they go.
        log.remove_segments_below(start)?;
        Ok((log, notes))
    }

    /// The storage the log's files live on (real files, or a simulated disk).
    pub fn storage(&self) -> Arc<dyn Storage> {
        self.storage.clone()
    }

    /// The directory holding this log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Current settings.
    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    /// Replaces the settings; they apply from the next append or retention pass.
    pub fn set_config(&mut self, config: LogConfig) {
        self.config = config;
    }

    fn active(&self) -> &Segment {
        // `open` guarantees at least one segment and nothing removes the last one.
        &self.segments[self.segments.len() - 1]
    }

    /// First offset served: the first segment's base, or further on where DeleteRecords
    /// moved it.
    pub fn start_offset(&self) -> i64 {
        self.start.max(self.segments[0].base_offset)
    }

    /// Moves the log start to `offset` (DeleteRecords): records below it are no longer
    /// served, and every segment wholly below it is deleted. The new start is on disk before
    /// this returns. Returns the log start afterwards; an offset at or below the current start
    /// changes nothing, one past the end is refused.
    pub fn advance_start(&mut self, offset: i64) -> Result<i64, LogError> {
        if self.sync.failed() {
            return Err(LogError::Failed {
                path: self.dir.clone(),
            });
        }
        let (start, end) = (self.start_offset(), self.end_offset());
        if offset > end {
            return Err(LogError::OffsetOutOfRange { offset, start, end });
        }
        if offset <= start {
            return Ok(start);
        }
        if let Err(e) = self.start_checkpoint.store(offset) {
            if !e.is_storage_full() {
                return Err(e);
            }
            // A full disk must not block the very call that frees it: the whole segments
            // below go first, each durably before the next, then the checkpoint is written in
            // the space they left. If it still cannot be, the answer is this error and the log
            // starts at its first remaining segment's base, the same as a restart shows.
            self.delete_oldest(self.segments_below(offset), DirSync::EachDeletion)?;
            self.start_checkpoint.store(offset)?;
        }
        self.start = offset;
        // The durable checkpoint hides these already, so their order does not matter here
        // (a crash leaves the rest below the start, and the next open deletes them).
        self.remove_segments_below(offset)?;
        self.assert_invariants(true);
        Ok(offset)
    }

    /// How many segments, oldest first and never the active one (appends continue in it),
    /// hold only offsets below `offset`.
    fn segments_below(&self, offset: i64) -> usize {
        let last = self.segments.len() - 1;
        self.segments[..last]
            .iter()
            .take_while(|s| s.next_offset <= offset)
            .count()
    }

    /// Deletes every segment but the active one that holds only offsets below `offset`, with
    /// one directory fsync: only for segments already below a durable log start.
    fn remove_segments_below(&mut self, offset: i64) -> Result<(), LogError> {
        self.delete_oldest(self.segments_below(offset), DirSync::Once)
    }

    /// Deletes the `n` oldest segments (never the active one), oldest first. Segments that no
    /// durable checkpoint hides need [`DirSync::EachDeletion`]: each deletion is durable
    /// before the next and before the log stops serving it, so a crash leaves the log
    /// starting at a segment base with no hole after it, never further on than it served.
    /// A failure takes the log out of service: what the directory holds is unknown until
    /// recovery looks.
    fn delete_oldest(&mut self, n: usize, sync: DirSync) -> Result<(), LogError> {
        // A seal still queued for a segment about to go would fail on its deleted file and
        // take the log out of service: finish them first, as truncation does.
        self.finish_seals();
        let n = n.min(self.segments.len() - 1);
        for i in 0..n {
            let synced = sync == DirSync::EachDeletion || i + 1 == n;
            let result = self.segments[0].delete().and_then(|()| match synced {
                true => self
                    .storage
                    .sync_dir(&self.dir)
                    .ctx("fsync log dir", &self.dir),
                false => Ok(()),
            });
            if result.is_err() {
                self.sync.fail();
            }
            result?;
            self.segments.remove(0);
        }
        Ok(())
    }

    /// Offset the next record will get.
    pub fn end_offset(&self) -> i64 {
        self.active().next_offset
    }

    /// Bytes stored across all segments.
    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size).sum()
    }

    /// Base offset of the segment appends go to.
    pub fn active_base_offset(&self) -> i64 {
        self.active().base_offset
    }

    /// Number of segment files.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// True once a write or fsync failed: the log refuses appends until it is reopened.
    pub fn is_failed(&self) -> bool {
        self.sync.failed()
    }

    fn check_usable(&self, batch: &[u8]) -> Result<(), LogError> {
        if self.sync.failed() {
            return Err(LogError::Failed {
                path: self.dir.clone(),
            });
        }
        if batch.len() < HEADER_LEN {
            return Err(LogError::InvalidBatch {
                size: batch.len(),
                reason: format!("shorter than the {HEADER_LEN}-byte batch header"),
            });
        }
        if batch.len() as u64 > u32::MAX as u64 {
            return Err(LogError::BatchTooLarge { size: batch.len() });
        }
        Ok(())
    }

    /// Appends one validated batch as the leader: assigns its offsets and leader epoch,
    /// optionally stamps it with the log append time, and writes it to the active segment
    /// (rolling first if due). The batch is copied only as far as its 61-byte header; the
    /// records go to the file as they arrived.
    pub fn append(
        &mut self,
        batch: &[u8],
        leader_epoch: i32,
        log_append_time: Option<i64>,
        now_ms: i64,
    ) -> Result<AppendInfo, LogError> {
        self.check_usable(batch)?;
        let (head_in, body) = batch.split_at(HEADER_LEN);
        let mut head = [0u8; HEADER_LEN];
        head.copy_from_slice(head_in);
        let base_offset = self.end_offset();
        batch::assign(&mut head, base_offset, leader_epoch);
        if let Some(ts) = log_append_time {
            batch::set_log_append_time(&mut head, body, ts);
        }
        let header = BatchHeader::parse(&head).map_err(|e| LogError::InvalidBatch {
            size: batch.len(),
            reason: e.to_string(),
        })?;
        self.write(&head, body, &header, now_ms)
    }

    /// Appends a batch copied from the leader as a replica: its offsets and leader epoch are
    /// kept as the leader assigned them, and it must start at this log's end.
    pub fn append_replica(&mut self, batch: &[u8], now_ms: i64) -> Result<AppendInfo, LogError> {
        self.check_usable(batch)?;
        let header = BatchHeader::parse(batch).map_err(|e| LogError::InvalidBatch {
            size: batch.len(),
            reason: e.to_string(),
        })?;
        if header.total_len() != batch.len() {
            return Err(LogError::InvalidBatch {
                size: batch.len(),
                reason: format!("its header says {} bytes", header.total_len()),
            });
        }
        let end = self.end_offset();
        // A batch past the end is a gap the leader's cleaner left (compaction removes whole
        // batches, offsets stay): taken as it is. One before the end is refused, except below.
        if header.base_offset < end {
            // An empty replica started at the leader's log start, which DeleteRecords put
            // inside a batch: the leader sends that whole batch. Take it from its base and
            // keep the start where it was, or the replica could never rejoin (KAFKA-6975).
            let starts_inside =
                self.start == end && header.base_offset < end && header.last_offset() >= end;
            if !starts_inside {
                return Err(LogError::OffsetMismatch {
                    expected: end,
                    found: header.base_offset,
                });
            }
            // The start goes to disk before the log holds anything below it: a checkpoint
            // that cannot be written (a full disk) then refuses the batch with nothing
            // changed, instead of serving, then and after a restart, records the leader
            // deleted.
            self.start_checkpoint.store(end)?;
            self.reset_to(header.base_offset, now_ms)?;
            let (head, body) = batch.split_at(HEADER_LEN);
            let info = self.write(head, body, &header, now_ms)?;
            self.start = end;
            self.assert_invariants(true);
            return Ok(info);
        }
        let (head, body) = batch.split_at(HEADER_LEN);
        self.write(head, body, &header, now_ms)
    }

    /// Records that `epoch` writes from `start_offset` on, persisting the checkpoint (an
    /// fsync) when the epoch is new. A leader calls it when it takes the epoch, on the
    /// blocking pool, so the first produce of the epoch does not fsync on an async worker.
    pub fn begin_epoch(&mut self, epoch: i32) -> Result<(), LogError> {
        let end = self.end_offset();
        self.record_epoch(epoch, end)
    }

    /// Whether appending a batch of `epoch` would first write the epoch checkpoint.
    pub fn epoch_is_new(&self, epoch: i32) -> bool {
        self.epochs.latest().is_none_or(|e| e.epoch != epoch)
    }

    fn record_epoch(&mut self, epoch: i32, start_offset: i64) -> Result<(), LogError> {
        if !self.epoch_is_new(epoch) {
            return Ok(());
        }
        if let Err(e) = self.epochs.assign(epoch, start_offset) {
            if matches!(e, LogError::Io { .. }) {
                self.sync.fail();
            }
            return Err(e);
        }
        Ok(())
    }

    /// Writes a batch whose offsets and epoch are final, recording a new epoch first.
    fn write(
        &mut self,
        head: &[u8],
        body: &[u8],
        header: &BatchHeader,
        now_ms: i64,
    ) -> Result<AppendInfo, LogError> {
        self.adopt_finished_seals();
        self.record_epoch(header.partition_leader_epoch, header.base_offset)?;
        self.maybe_roll((head.len() + body.len()) as u64, now_ms)?;
        let interval = self.config.index_interval_bytes as u64;
        let n = self.segments.len();
        let seg = &mut self.segments[n - 1];
        if let Err(e) = seg.append(head, body, header, interval) {
            // A full disk: the segment cut what reached it, the log stays in service.
            if !e.is_storage_full() {
                // What reached the file is unknown; the log must be recovered before use.
                self.sync.fail();
            }
            return Err(e);
        }
        self.sync.written(&seg.file, header.next_offset());
        self.flusher.mark_dirty(&self.sync);
        self.assert_invariants(false);
        Ok(AppendInfo {
            base_offset: header.base_offset,
            last_offset: header.last_offset(),
        })
    }

    /// The latest leader epoch that wrote to this log.
    pub fn latest_epoch(&self) -> Option<i32> {
        self.epochs.latest().map(|e| e.epoch)
    }

    /// Every leader epoch that wrote to this log and where it started, oldest first.
    pub fn epochs(&self) -> &[EpochEntry] {
        self.epochs.entries()
    }

    /// OffsetForLeaderEpoch: the largest epoch at most `epoch` that wrote here and the offset
    /// where it ended (the next epoch's start, or the log end for the latest epoch).
    pub fn end_offset_for_epoch(&self, epoch: i32) -> Option<(i32, i64)> {
        self.epochs.end_offset_for(epoch, self.end_offset())
    }

    /// Takes the results of seal jobs the flusher finished.
    fn adopt_finished_seals(&mut self) {
        if self.seals.is_empty() || !self.seals.iter().any(|s| s.is_done()) {
            return;
        }
        let (done, pending): (Vec<_>, Vec<_>) = self.seals.drain(..).partition(|s| s.is_done());
        self.seals = pending;
        for slot in done {
            self.adopt_seal(&slot);
        }
    }

    /// Finishes every pending seal now (before truncation or shutdown).
    fn finish_seals(&mut self) {
        for slot in std::mem::take(&mut self.seals) {
            self.adopt_seal(&slot);
        }
    }

    fn adopt_seal(&mut self, slot: &SealSlot) {
        // A failure was logged where it ran; the in-memory indexes keep serving.
        if let Some(Ok(sealed)) = slot.finish() {
            let i = self
                .segments
                .partition_point(|s| s.base_offset < slot.base_offset);
            if let Some(seg) = self.segments.get_mut(i) {
                if seg.base_offset == slot.base_offset {
                    seg.adopt(sealed);
                }
            }
        }
    }

    fn maybe_roll(&mut self, incoming: u64, now_ms: i64) -> Result<(), LogError> {
        let active = self.active();
        if active.size == 0 {
            return Ok(());
        }
        let full = active.size + incoming > self.config.segment_bytes;
        // Positions in the offset index are 32-bit.
        let positions_exhausted = active.size + incoming > u32::MAX as u64;
        let old =
            self.config.segment_ms >= 0 && now_ms - active.created_ms >= self.config.segment_ms;
        if full || old || positions_exhausted {
            self.roll(now_ms)?;
        }
        Ok(())
    }

    /// Starts a new active segment at the log end. The old one is sealed (fsync, index files
    /// written and mapped) by the flusher thread, not here: a roll under the partition's write
    /// lock costs one file creation. The new file's directory entry is synced by the flusher
    /// before any of its data is reported durable.
    pub fn roll(&mut self, now_ms: i64) -> Result<(), LogError> {
        let old = self.active();
        if old.size == 0 {
            // An empty active segment is already what a roll would create; a second segment
            // with the same base offset would share its file names.
            return Ok(());
        }
        let base = self.end_offset();
        let job = old.seal_job();
        let old_base = old.base_offset;
        let seg = Segment::create(&self.storage, &self.dir, base, now_ms)?;
        self.segments.push(seg);
        self.sync.dir_changed();
        self.flusher.mark_dirty(&self.sync);
        let slot = Arc::new(SealSlot {
            base_offset: old_base,
            state: Mutex::new(SealState::Queued(job)),
            done: Condvar::new(),
            sync: self.sync.clone(),
        });
        self.seals.push(slot.clone());
        self.flusher.submit(Box::new(move || slot.run()));
        Ok(())
    }

    /// How far the log is on disk now (no subscription: for a look on every append).
    pub fn durable_now(&self) -> Durability {
        self.sync.durable_now()
    }

    /// Subscribes to how far the log is on disk.
    pub fn durable_offset(&self) -> watch::Receiver<Durability> {
        self.sync.subscribe()
    }

    /// Reads whole batches starting with the one holding `offset`, at most `max_bytes`
    /// (but at least one batch when `min_one`, so a large batch never blocks a consumer), and
    /// only batches starting below `max_offset` (the high watermark).
    pub fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one: bool,
    ) -> Result<ReadResult, LogError> {
        let (start, end) = (self.start_offset(), self.end_offset());
        if offset < start || offset > end {
            return Err(LogError::OffsetOutOfRange { offset, start, end });
        }
        let empty = ReadResult {
            records: Bytes::new(),
        };
        if offset >= max_offset.min(end) || (max_bytes == 0 && !min_one) {
            return Ok(empty);
        }
        let idx = self.segments.partition_point(|s| s.base_offset <= offset) - 1;
        for seg in &self.segments[idx..] {
            let pos = seg.position_of(offset)?;
            if pos >= seg.size {
                continue;
            }
            let available = (seg.size - pos) as usize;
            let chunk = seg.read(pos, available.min(max_bytes.max(HEADER_LEN)))?;
            let mut whole = 0;
            let mut batches = Batches::new(&chunk);
            for (at, h) in batches.by_ref() {
                if h.base_offset >= max_offset || at + h.total_len() > max_bytes {
                    break;
                }
                whole = at + h.total_len();
            }
            if whole > 0 {
                return Ok(ReadResult {
                    records: chunk.slice(..whole),
                });
            }
            if !min_one {
                return Ok(empty);
            }
            let Ok(h) = BatchHeader::parse(&chunk) else {
                return Ok(empty);
            };
            if h.base_offset >= max_offset || h.total_len() > available {
                return Ok(empty);
            }
            return Ok(ReadResult {
                records: seg.read(pos, h.total_len())?,
            });
        }
        Ok(empty)
    }

    /// Calls `visit` with the header of every batch holding offsets at or after `from`, and
    /// for a control batch its transaction marker (read from the file: headers alone do not
    /// say commit or abort).
    pub fn for_each_batch(
        &self,
        from: i64,
        mut visit: impl FnMut(&BatchHeader, Option<ControlRecord>),
    ) -> Result<(), LogError> {
        let idx = self
            .segments
            .partition_point(|s| s.base_offset <= from)
            .saturating_sub(1);
        for (i, seg) in self.segments[idx..].iter().enumerate() {
            // Only the first segment starts part-way, at the batch holding `from`.
            let start = if i == 0 { seg.position_of(from)? } else { 0 };
            let mut failed = None;
            segment::walk_headers(&*seg.file, &seg.path, start, seg.size, |pos, h| {
                let marker = if h.is_control() {
                    let mut buf = [0u8; batch::CONTROL_BATCH_LEN + 16];
                    let n = h.total_len().min(buf.len());
                    if let Err(e) = seg.file.read_exact_at(&mut buf[..n], pos) {
                        failed = Some(e);
                        return ControlFlow::Break(());
                    }
                    batch::control_record(&buf[..n])
                } else {
                    None
                };
                visit(h, marker);
                ControlFlow::Continue(())
            })?;
            if let Some(e) = failed {
                return Err(e).ctx("read segment", &seg.path);
            }
        }
        Ok(())
    }

    /// The first record whose timestamp is at or after `ts`, as ListOffsets wants it.
    pub fn offset_for_timestamp(&self, ts: i64) -> Result<Option<TimestampLookup>, LogError> {
        let Some(seg) = self.segments.iter().find(|s| s.max_timestamp >= ts) else {
            return Ok(None);
        };
        let start = seg.search_start_for_timestamp(ts)?;
        let mut found = None;
        let mut failure = None;
        segment::scan(
            &*seg.file,
            &seg.path,
            start,
            seg.size,
            None,
            false,
            |_, h, bytes| {
                if h.max_timestamp < ts {
                    return ControlFlow::Continue(());
                }
                match first_record_at_or_after(h, bytes, ts) {
                    Ok(hit) => found = hit,
                    Err(e) => failure = Some(e),
                }
                ControlFlow::Break(())
            },
        )?;
        if let Some(e) = failure {
            return Err(e);
        }
        // A record below a start moved by DeleteRecords is no longer served: the first one
        // that is comes next.
        let start_offset = self.start_offset();
        Ok(found.map(|f: TimestampLookup| TimestampLookup {
            offset: f.offset.max(start_offset),
            ..f
        }))
    }

    /// The record with the largest timestamp (ListOffsets MAX_TIMESTAMP); the earliest such
    /// record when several share it.
    pub fn max_timestamp(&self) -> Result<Option<TimestampLookup>, LogError> {
        let Some(max) = self.segments.iter().map(|s| s.max_timestamp).max() else {
            return Ok(None);
        };
        if max < 0 {
            return Ok(None);
        }
        self.offset_for_timestamp(max)
    }

    /// Deletes whole segments past the retention limits (never the active one). Returns how
    /// many were removed.
    pub fn enforce_retention(&mut self, now_ms: i64) -> Result<usize, LogError> {
        self.adopt_finished_seals();
        let mut total = self.size_bytes() as i64;
        let mut remove = 0;
        if !self.config.delete {
            // compact only: records go by key, through the cleaner, never by age or size.
            return Ok(0);
        }
        for seg in &self.segments[..self.segments.len() - 1] {
            let expired = self.config.retention_ms >= 0
                && seg.max_timestamp >= 0
                && now_ms - seg.max_timestamp > self.config.retention_ms;
            let oversize = self.config.retention_bytes >= 0
                && total - seg.size as i64 >= self.config.retention_bytes;
            if !(expired || oversize) {
                break;
            }
            total -= seg.size as i64;
            remove += 1;
        }
        // No checkpoint hides them: oldest first, each durably (a crash never leaves a hole).
        self.delete_oldest(remove, DirSync::EachDeletion)?;
        Ok(remove)
    }

    /// Removes everything at or after `offset` (a replica whose tail diverged from the
    /// leader's). The log ends on a batch boundary: when `offset` falls inside a batch, that
    /// whole batch goes and the log ends at its base offset. Returns the new end offset. The
    /// truncation is on disk when this returns, so a power loss cannot bring the removed tail
    /// back. An offset past the end is refused.
    pub fn truncate_to(&mut self, offset: i64, now_ms: i64) -> Result<i64, LogError> {
        if self.sync.failed() {
            return Err(LogError::Failed {
                path: self.dir.clone(),
            });
        }
        let end = self.end_offset();
        if offset > end {
            return Err(LogError::TruncationPastEnd { offset, end });
        }
        if offset == end {
            return Ok(end);
        }
        // Seal jobs must not write index files for segments about to change.
        self.finish_seals();
        let offset = offset.max(self.start_offset());
        let result = self.truncate_segments(offset, now_ms);
        if result.is_err() {
            self.sync.fail();
        }
        let new_end = result?;
        self.epochs.truncate_from_end(new_end)?;
        self.sync.reset(new_end);
        self.assert_invariants(true);
        Ok(new_end)
    }

    /// The invariants of the log's shape, asserted in debug builds (the tests and the
    /// replication simulation): the start is within the log, segments follow each other in
    /// offset order, and leader epochs grow with their start offsets, none starting past the
    /// end. `full` checks every segment and epoch; otherwise only the last two of each (the
    /// append path stays O(1)).
    fn assert_invariants(&self, full: bool) {
        if !cfg!(debug_assertions) {
            return;
        }
        let end = self.end_offset();
        debug_assert!(
            self.start <= end,
            "{}: log start {} past the end {end}",
            self.dir.display(),
            self.start
        );
        let skip_segments = if full {
            0
        } else {
            self.segments.len().saturating_sub(2)
        };
        for pair in self.segments[skip_segments..].windows(2) {
            debug_assert!(
                pair[0].next_offset <= pair[1].base_offset,
                "{}: segment {} ends at {}, after the next one's base {}",
                self.dir.display(),
                pair[0].base_offset,
                pair[0].next_offset,
                pair[1].base_offset
            );
        }
        let epochs = self.epochs.entries();
        let skip_epochs = if full {
            0
        } else {
            epochs.len().saturating_sub(2)
        };
        for pair in epochs[skip_epochs..].windows(2) {
            debug_assert!(
                pair[0].epoch < pair[1].epoch && pair[0].start_offset <= pair[1].start_offset,
                "{}: leader epochs out of order: {:?} then {:?}",
                self.dir.display(),
                pair[0],
                pair[1]
            );
        }
        if let Some(last) = epochs.last() {
            debug_assert!(
                last.start_offset <= end,
                "{}: epoch {} starts at {}, past the end {end}",
                self.dir.display(),
                last.epoch,
                last.start_offset
            );
        }
    }

    /// Empties the log and starts it over at `offset`: a follower whose log ends before the
    /// leader's first offset (retention removed what it lacks) cannot fetch the gap, so it
    /// starts where the leader's log starts (Kafka's truncate-fully-and-start-at). Durable
    /// when this returns.
    pub fn reset_to(&mut self, offset: i64, now_ms: i64) -> Result<(), LogError> {
        if self.sync.failed() {
            return Err(LogError::Failed {
                path: self.dir.clone(),
            });
        }
        self.finish_seals();
        let result = (|| {
            for seg in self.segments.drain(..) {
                seg.delete()?;
            }
            self.segments
                .push(Segment::create(&self.storage, &self.dir, offset, now_ms)?);
            self.storage
                .sync_dir(&self.dir)
                .ctx("fsync log dir", &self.dir)?;
            self.start = offset;
            self.epochs.clear()
        })();
        if result.is_err() {
            self.sync.fail();
        }
        result?;
        self.sync.reset(offset);
        self.assert_invariants(true);
        Ok(())
    }

    fn truncate_segments(&mut self, offset: i64, now_ms: i64) -> Result<i64, LogError> {
        let mut removed = false;
        while self.segments.len() > 1 && self.active().base_offset >= offset {
            if let Some(seg) = self.segments.pop() {
                seg.delete()?;
                removed = true;
            }
        }
        let new_end = if self.active().base_offset >= offset {
            // Everything goes: start an empty segment where the log starts.
            let base = self.active().base_offset;
            if let Some(seg) = self.segments.pop() {
                seg.delete()?;
            }
            self.segments
                .push(Segment::create(&self.storage, &self.dir, base, now_ms)?);
            removed = true;
            base
        } else {
            let n = self.segments.len();
            self.segments[n - 1].truncate_to(offset)?
        };
        if removed {
            self.storage
                .sync_dir(&self.dir)
                .ctx("fsync log dir", &self.dir)?;
        }
        Ok(new_end)
    }

    /// Prepares for a clean shutdown: the active segment and its indexes go to disk with a
    /// marker of its end, so the next start can skip scanning it. Appends after this make the
    /// marker stale, which the next start detects (the size no longer matches) and scans.
    pub fn close(&mut self) -> Result<(), LogError> {
        self.finish_seals();
        if self.sync.failed() {
            // Leave no marker: the next start must recover the log by scanning it.
            return Ok(());
        }
        let active = self.active();
        active.save_for_shutdown()?;
        write_clean_marker(&*self.storage, &self.dir, active.next_offset, active.size)
    }

    /// Removes the whole log directory.
    pub fn delete(mut self) -> Result<(), LogError> {
        self.finish_seals();
        self.storage
            .remove_dir_all(&self.dir)
            .ctx("delete log dir", &self.dir)
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        // A seal job left running would write index files after the log is gone, possibly
        // while a new instance opens the same directory.
        self.finish_seals();
    }
}

/// Every epoch change found in the batch headers, for a log without a usable checkpoint.
fn epochs_from_headers(segments: &[Segment]) -> Result<Vec<EpochEntry>, LogError> {
    let mut found: Vec<EpochEntry> = Vec::new();
    for seg in segments {
        segment::walk_headers(&*seg.file, &seg.path, 0, seg.size, |_, h| {
            let epoch = h.partition_leader_epoch;
            if found.last().is_none_or(|e| epoch > e.epoch) {
                found.push(EpochEntry {
                    epoch,
                    start_offset: h.base_offset,
                });
            }
            ControlFlow::Continue(())
        })?;
    }
    Ok(found)
}

/// Marks a log whose active segment was saved by a clean shutdown.
const CLEAN_MARKER: &str = "clean_shutdown";

/// The marker's text: the active segment's end offset and size, and a digest of both so
/// that a marker torn by a crash while it was written is not taken for a valid one.
fn clean_marker_text(next_offset: i64, size: u64) -> String {
    let fields = format!("{next_offset} {size}");
    let digest = xxhash_rust::xxh3::xxh3_64(fields.as_bytes());
    format!("{fields} {digest:016x}\n")
}

/// Writes the shutdown marker after the active segment and its indexes are on disk. It is
/// rewritten in place rather than renamed into place: the marker only says "scan or not", a
/// torn one fails its digest, and a new inode per partition per shutdown made ext4's inode
/// allocation most of a stop with thousands of partitions.
fn write_clean_marker(
    storage: &dyn Storage,
    dir: &Path,
    next_offset: i64,
    size: u64,
) -> Result<(), LogError> {
    let path = dir.join(CLEAN_MARKER);
    let existed = storage.open(&path, OpenMode::Existing).is_ok();
    let f = storage
        .open(&path, OpenMode::CreateTruncate)
        .ctx("create shutdown marker", &path)?;
    f.write_all_at(clean_marker_text(next_offset, size).as_bytes(), 0)
        .and_then(|()| f.sync_data())
        .ctx("write shutdown marker", &path)?;
    if !existed {
        storage.sync_dir(dir).ctx("fsync log dir", dir)?;
    }
    Ok(())
}

/// The active segment's end offset and size as the last clean shutdown saved them; `None`
/// for a spent, torn or missing marker (and for one in the format before the digest).
fn read_clean_marker(storage: &dyn Storage, dir: &Path) -> Option<(i64, u64)> {
    let bytes = storage.read(&dir.join(CLEAN_MARKER)).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let mut parts = text.split_whitespace();
    let next = parts.next()?.parse().ok()?;
    let size = parts.next()?.parse().ok()?;
    (clean_marker_text(next, size) == text).then_some((next, size))
}

/// Spends the marker: it describes one shutdown only. It is emptied, not removed, so the next
/// shutdown writes into the same file.
fn spend_clean_marker(storage: &dyn Storage, dir: &Path) -> Result<(), LogError> {
    let path = dir.join(CLEAN_MARKER);
    let f = match storage.open(&path, OpenMode::Existing) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).ctx("open shutdown marker", &path),
    };
    if f.len().ctx("read shutdown marker", &path)? > 0 {
        f.set_len(0)
            .and_then(|()| f.sync_data())
            .ctx("empty shutdown marker", &path)?;
    }
    Ok(())
}

/// Decodes one batch to find its first record with a timestamp at or after `ts`.
fn first_record_at_or_after(
    h: &BatchHeader,
    bytes: &[u8],
    ts: i64,
) -> Result<Option<TimestampLookup>, LogError> {
    if h.is_log_append_time() {
        return Ok(Some(TimestampLookup {
            offset: h.base_offset,
            timestamp: h.max_timestamp,
        }));
    }
    let mut buf = Bytes::copy_from_slice(bytes);
    let set = RecordBatchDecoder::decode(&mut buf).map_err(|e| LogError::Decode {
        offset: h.base_offset,
        reason: e.to_string(),
    })?;
    Ok(set
        .records
        .iter()
        .find(|r| r.timestamp >= ts)
        .map(|r| TimestampLookup {
            offset: r.offset,
            timestamp: r.timestamp,
        }))
}

/// The suffix of a segment's compacted copy before it is swapped in.
const CLEANED_SUFFIX: &str = ".log.cleaned";

/// A sealed segment's compacted copy, written and synced beside it, not yet in its place.
pub struct CleanedSegment {
    base_offset: i64,
    path: PathBuf,
    /// The segment's size when its copy was made: a segment that changed meanwhile (it
    /// cannot, once sealed, but a truncation may have removed it) is not replaced.
    source_size: u64,
}

impl Log {
    /// The sealed segments (every one but the active one), for the cleaner's schedule.
    pub fn sealed_spans(&self) -> Vec<crate::compaction::SegmentSpan> {
        let n = self.segments.len().saturating_sub(1);
        self.segments[..n]
            .iter()
            .map(|s| crate::compaction::SegmentSpan {
                base_offset: s.base_offset,
                next_offset: s.next_offset,
                size: s.size,
                max_timestamp: s.max_timestamp,
            })
            .collect()
    }

    /// The whole content of sealed segment `base`, and its size (the cleaner's input). The
    /// bytes are read without the log's lock held by the caller being needed afterwards.
    pub fn read_sealed(&self, base: i64) -> Result<Option<(Bytes, u64)>, LogError> {
        let n = self.segments.len().saturating_sub(1);
        let Some(seg) = self.segments[..n].iter().find(|s| s.base_offset == base) else {
            return Ok(None);
        };
        Ok(Some((seg.read(0, seg.size as usize)?, seg.size)))
    }

    /// Writes `bytes` (whole batches) as the compacted copy of sealed segment `base` of the log
    /// in `dir` and syncs it. Needs no lock on the log: the copy is a file of its own until
    /// [`Log::swap_cleaned`] puts it in place.
    pub fn write_cleaned(
        storage: &Arc<dyn Storage>,
        dir: &Path,
        base: i64,
        source_size: u64,
        bytes: &[u8],
    ) -> Result<CleanedSegment, LogError> {
        let path = dir.join(segment::file_name(base, &CLEANED_SUFFIX[1..]));
        let file = storage
            .open(&path, crate::storage::OpenMode::CreateTruncate)
            .ctx("create cleaned segment", &path)?;
        file.write_all_at(bytes, 0)
            .ctx("write cleaned segment", &path)?;
        file.sync_data().ctx("fsync cleaned segment", &path)?;
        Ok(CleanedSegment {
            base_offset: base,
            path,
            source_size,
        })
    }

    /// Puts a compacted copy in place of its segment: the segment's index files are removed,
    /// the copy renamed over its data file and the directory synced, then the indexes are
    /// rebuilt. A crash at any point leaves the old segment whole (with indexes rebuilt at the
    /// next start) or the new one. `false` when the segment is gone or changed (the copy is
    /// thrown away).
    pub fn swap_cleaned(&mut self, cleaned: CleanedSegment, now_ms: i64) -> Result<bool, LogError> {
        let n = self.segments.len().saturating_sub(1);
        let Some(i) = self.segments[..n]
            .iter()
            .position(|s| s.base_offset == cleaned.base_offset && s.size == cleaned.source_size)
        else {
            let _ = self.storage.remove_file(&cleaned.path);
            return Ok(false);
        };
        let base = cleaned.base_offset;
        let next = self.segments[i + 1].base_offset;
        // A seal still queued for this segment would write (or fail to find) the index files
        // being replaced and take the log out of service.
        self.finish_seals();
        segment::remove_files(
            &*self.storage,
            &self.dir,
            base,
            segment::INDEX_EXTS,
            "remove indexes of a cleaned segment",
        )?;
        self.storage
            .sync_dir(&self.dir)
            .ctx("fsync log dir", &self.dir)?;
        let data = self.dir.join(segment::file_name(base, "log"));
        self.storage
            .rename(&cleaned.path, &data)
            .ctx("swap in a cleaned segment", &data)?;
        self.storage
            .sync_dir(&self.dir)
            .ctx("fsync log dir", &self.dir)?;
        let interval = self.config.index_interval_bytes as u64;
        let (seg, _, _) =
            Segment::open_sealed(&self.storage, &self.dir, base, next, interval, now_ms)?;
        self.segments[i] = seg;
        self.assert_invariants(true);
        Ok(true)
    }
}

#[cfg(test)]
mod contract;
#[cfg(test)]
mod tests;
