//! The partition log: segments in offset order, the last one active.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use spate_protocol::batch::{self, BatchHeader, Batches, HEADER_LEN};
use spate_protocol::records::RecordBatchDecoder;
use tokio::sync::watch;

use crate::config::LogConfig;
use crate::durability::{Flusher, SyncState};
use crate::error::{IoContext, LogError};
use crate::segment::{self, Segment};

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
}

impl Log {
    /// Opens (or creates) the log in `dir`, recovering it: sealed segments keep their indexes
    /// when sound, the active segment is scanned and cut at the first invalid batch. Returns
    /// the log and a line for each repair made.
    pub fn open(
        dir: &Path,
        config: LogConfig,
        flusher: Flusher,
        now_ms: i64,
    ) -> Result<(Self, Vec<String>), LogError> {
        std::fs::create_dir_all(dir).ctx("create log dir", dir)?;
        let mut bases = Vec::new();
        for entry in std::fs::read_dir(dir).ctx("list log dir", dir)? {
            let entry = entry.ctx("list log dir", dir)?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
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
        let clean = read_clean_marker(dir);
        for (i, &base) in bases.iter().enumerate() {
            let (seg, note) = match bases.get(i + 1) {
                Some(&next) => Segment::open_sealed(dir, base, next, interval, now_ms)?,
                None => {
                    let trusted = match clean {
                        Some((next, len)) => {
                            Segment::open_after_clean_shutdown(dir, base, next, len, now_ms)?
                        }
                        None => None,
                    };
                    match trusted {
                        Some(seg) => (seg, None),
                        None => Segment::recover(dir, base, interval, now_ms)?,
                    }
                }
            };
            notes.extend(note);
            segments.push(seg);
        }
        // The marker describes one shutdown only: from now on the log may change again.
        remove_clean_marker(dir)?;
        // A sealed segment that recovery shortened leaves a gap before its successor; the data
        // after a gap cannot be trusted to be contiguous, so drop it.
        let mut keep = segments.len();
        for i in 1..segments.len() {
            if segments[i - 1].next_offset != segments[i].base_offset {
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
            segments.push(Segment::create(dir, 0, now_ms)?);
        }
        let end = segments.last().map_or(0, |s| s.next_offset);
        let log = Self {
            dir: dir.to_path_buf(),
            config,
            segments,
            sync: SyncState::new(dir.to_path_buf(), end),
            flusher,
        };
        Ok((log, notes))
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

    /// First offset still stored.
    pub fn start_offset(&self) -> i64 {
        self.segments[0].base_offset
    }

    /// Offset the next record will get.
    pub fn end_offset(&self) -> i64 {
        self.active().next_offset
    }

    /// Bytes stored across all segments.
    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size).sum()
    }

    /// Number of segment files.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Appends one validated batch: assigns its offsets and leader epoch, optionally stamps it
    /// with the log append time, and writes it to the active segment (rolling first if due).
    /// The batch is copied only as far as its 61-byte header; the records go to the file as
    /// they arrived.
    pub fn append(
        &mut self,
        batch: &[u8],
        leader_epoch: i32,
        log_append_time: Option<i64>,
        now_ms: i64,
    ) -> Result<AppendInfo, LogError> {
        if batch.len() < HEADER_LEN || batch.len() as u64 > u32::MAX as u64 {
            return Err(LogError::BatchTooLarge { size: batch.len() });
        }
        let (head_in, body) = batch.split_at(HEADER_LEN);
        let mut head = [0u8; HEADER_LEN];
        head.copy_from_slice(head_in);
        let base_offset = self.end_offset();
        batch::assign(&mut head, base_offset, leader_epoch);
        if let Some(ts) = log_append_time {
            batch::set_log_append_time(&mut head, body, ts);
        }
        let header =
            BatchHeader::parse(&head).map_err(|_| LogError::BatchTooLarge { size: batch.len() })?;
        self.maybe_roll(batch.len() as u64, now_ms)?;
        let interval = self.config.index_interval_bytes as u64;
        let n = self.segments.len();
        let seg = &mut self.segments[n - 1];
        seg.append(&head, body, &header, interval)?;
        self.sync.written(&seg.file, header.next_offset());
        self.flusher.mark_dirty(&self.sync);
        Ok(AppendInfo {
            base_offset,
            last_offset: header.last_offset(),
        })
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

    /// Seals the active segment and starts a new one at the log end.
    pub fn roll(&mut self, now_ms: i64) -> Result<(), LogError> {
        let base = self.end_offset();
        let n = self.segments.len();
        self.segments[n - 1].seal()?;
        self.segments
            .push(Segment::create(&self.dir, base, now_ms)?);
        // Make the new file's directory entry durable too.
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .ctx("fsync log dir", &self.dir)?;
        Ok(())
    }

    /// Subscribes to the offset below which everything is on disk.
    pub fn durable_offset(&self) -> watch::Receiver<i64> {
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

    /// Calls `visit` with the header of every batch holding offsets at or after `from`.
    pub fn for_each_batch(
        &self,
        from: i64,
        mut visit: impl FnMut(&BatchHeader),
    ) -> Result<(), LogError> {
        let idx = self
            .segments
            .partition_point(|s| s.base_offset <= from)
            .saturating_sub(1);
        for (i, seg) in self.segments[idx..].iter().enumerate() {
            // Only the first segment starts part-way, at the batch holding `from`.
            let start = if i == 0 { seg.position_of(from)? } else { 0 };
            segment::scan(
                &seg.file,
                &seg.path,
                start,
                seg.size,
                None,
                false,
                |_, h, _| {
                    visit(h);
                    ControlFlow::Continue(())
                },
            )?;
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
            &seg.file,
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
        Ok(found)
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
        let mut total = self.size_bytes() as i64;
        let mut remove = 0;
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
        for seg in self.segments.drain(..remove) {
            seg.delete()?;
        }
        Ok(remove)
    }

    /// Removes everything at or after `offset` (used when a replica diverged).
    pub fn truncate_to(&mut self, offset: i64, now_ms: i64) -> Result<(), LogError> {
        let offset = offset.max(self.start_offset());
        while self.segments.len() > 1 && self.active().base_offset >= offset {
            if let Some(seg) = self.segments.pop() {
                seg.delete()?;
            }
        }
        let n = self.segments.len();
        if self.segments[n - 1].base_offset >= offset {
            let seg = self.segments.remove(0);
            seg.delete()?;
            self.segments
                .push(Segment::create(&self.dir, offset, now_ms)?);
        } else {
            self.segments[n - 1].truncate_to(offset)?;
        }
        self.sync.reset(self.end_offset());
        Ok(())
    }

    /// Prepares for a clean shutdown: the active segment and its indexes go to disk with a
    /// marker of its end, so the next start can skip scanning it. Appends after this make the
    /// marker stale, which the next start detects (the size no longer matches) and scans.
    pub fn close(&mut self) -> Result<(), LogError> {
        let active = self.active();
        active.save_for_shutdown()?;
        let marker = format!("{} {}\n", active.next_offset, active.size);
        let path = self.dir.join(CLEAN_MARKER);
        let tmp = self.dir.join(format!("{CLEAN_MARKER}.tmp"));
        std::fs::write(&tmp, marker).ctx("write shutdown marker", &tmp)?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .ctx("fsync shutdown marker", &tmp)?;
        std::fs::rename(&tmp, &path).ctx("rename shutdown marker", &path)?;
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .ctx("fsync log dir", &self.dir)
    }

    /// Removes the whole log directory.
    pub fn delete(self) -> Result<(), LogError> {
        std::fs::remove_dir_all(&self.dir).ctx("delete log dir", &self.dir)
    }
}

/// Marks a log whose active segment was saved by a clean shutdown.
const CLEAN_MARKER: &str = "clean_shutdown";

/// The active segment's end offset and size as the last clean shutdown saved them.
fn read_clean_marker(dir: &Path) -> Option<(i64, u64)> {
    let text = std::fs::read_to_string(dir.join(CLEAN_MARKER)).ok()?;
    let mut parts = text.split_whitespace();
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

fn remove_clean_marker(dir: &Path) -> Result<(), LogError> {
    let path = dir.join(CLEAN_MARKER);
    match std::fs::remove_file(&path) {
        Ok(()) => std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .ctx("fsync log dir", dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).ctx("remove shutdown marker", &path),
    }
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
    let set = RecordBatchDecoder::decode(&mut buf).map_err(|e| LogError::Io {
        op: "decode batch",
        path: PathBuf::from(format!("offset {}", h.base_offset)),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
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

#[cfg(test)]
mod tests;
