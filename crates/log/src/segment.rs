//! One segment: a file of whole RecordBatches starting at `base_offset`, plus its indexes.

use std::fs::{File, OpenOptions};
use std::ops::ControlFlow;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use spate_protocol::batch::{self, BatchError, BatchHeader};

use crate::error::{IoContext, LogError};
use crate::index::{Kind, SparseIndex};

/// Bytes read per step when scanning a segment.
const SCAN_CHUNK: usize = 1 << 20;

/// File names for a segment starting at `base`.
pub(crate) fn file_name(base: i64, ext: &str) -> String {
    format!("{base:020}.{ext}")
}

/// What stopped a scan before the end of the file.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ScanEnd {
    /// Every byte up to the end belonged to a valid batch.
    Clean,
    /// Bytes at `at` are not a whole valid batch.
    Invalid { at: u64, why: String },
    /// The callback asked to stop.
    Stopped,
}

/// Walks whole batches of `file` from `start` to `end`, checking structure, offsets continuity
/// from `expect_offset` and (when `verify_crc`) the CRC of each. `visit` sees each batch's
/// position, header and bytes.
pub(crate) fn scan(
    file: &File,
    path: &Path,
    start: u64,
    end: u64,
    mut expect_offset: Option<i64>,
    verify_crc: bool,
    mut visit: impl FnMut(u64, &BatchHeader, &[u8]) -> ControlFlow<()>,
) -> Result<ScanEnd, LogError> {
    let mut buf: Vec<u8> = Vec::new();
    let mut pos = start;
    while pos < end {
        let want = ((end - pos) as usize).min(SCAN_CHUNK.max(buf.capacity()));
        buf.resize(want, 0);
        file.read_exact_at(&mut buf, pos)
            .ctx("read segment", path)?;
        let mut off = 0usize;
        while off < buf.len() {
            let rest = &buf[off..];
            let at = pos + off as u64;
            let h = match BatchHeader::parse(rest) {
                Ok(h) => h,
                Err(BatchError::Truncated { .. }) if (end - at) as usize > rest.len() => break,
                Err(e) => {
                    return Ok(ScanEnd::Invalid {
                        at,
                        why: e.to_string(),
                    })
                }
            };
            let len = h.total_len();
            if (end - at) < len as u64 {
                return Ok(ScanEnd::Invalid {
                    at,
                    why: format!("batch of {len} bytes runs past the end of the segment"),
                });
            }
            if len > rest.len() {
                if off == 0 {
                    // One batch larger than the buffer: grow to hold it.
                    buf.reserve(len);
                }
                break;
            }
            let bytes = &rest[..len];
            if verify_crc {
                let computed = batch::compute_crc(bytes);
                if computed != h.crc {
                    return Ok(ScanEnd::Invalid {
                        at,
                        why: format!("CRC mismatch in batch at offset {}", h.base_offset),
                    });
                }
            }
            if h.records_count <= 0 || h.last_offset_delta < 0 {
                return Ok(ScanEnd::Invalid {
                    at,
                    why: "batch with no records".into(),
                });
            }
            if let Some(expected) = expect_offset {
                if h.base_offset != expected {
                    return Ok(ScanEnd::Invalid {
                        at,
                        why: format!(
                            "batch offset {} where {expected} was expected",
                            h.base_offset
                        ),
                    });
                }
            }
            expect_offset = Some(h.next_offset());
            if visit(at, &h, bytes).is_break() {
                return Ok(ScanEnd::Stopped);
            }
            off += len;
        }
        if off == 0 && buf.capacity() <= buf.len() {
            // No progress and no growth requested: cannot happen with a sane header, but
            // never loop forever on a file.
            return Ok(ScanEnd::Invalid {
                at: pos,
                why: "unreadable batch".into(),
            });
        }
        pos += off as u64;
    }
    Ok(ScanEnd::Clean)
}

/// Opens an existing segment file for reading and writing; returns its path, handle and size.
fn open_existing(dir: &Path, base_offset: i64) -> Result<(PathBuf, File, u64), LogError> {
    let path = dir.join(file_name(base_offset, "log"));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .ctx("open segment", &path)?;
    let len = file.metadata().ctx("stat segment", &path)?.len();
    Ok((path, file, len))
}

/// One segment of a partition log.
pub(crate) struct Segment {
    pub(crate) base_offset: i64,
    pub(crate) next_offset: i64,
    pub(crate) size: u64,
    pub(crate) file: Arc<File>,
    pub(crate) path: PathBuf,
    dir: PathBuf,
    offset_index: SparseIndex,
    time_index: SparseIndex,
    /// Largest batch max timestamp in the segment, -1 when empty.
    pub(crate) max_timestamp: i64,
    /// Wall-clock time the segment was created, for segment.ms.
    pub(crate) created_ms: i64,
    bytes_since_entry: u64,
}

impl Segment {
    /// Creates a new, empty segment file.
    pub(crate) fn create(dir: &Path, base_offset: i64, now_ms: i64) -> Result<Self, LogError> {
        let path = dir.join(file_name(base_offset, "log"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .ctx("create segment", &path)?;
        Ok(Self::empty(dir, base_offset, path, file, now_ms))
    }

    fn empty(dir: &Path, base_offset: i64, path: PathBuf, file: File, now_ms: i64) -> Self {
        Self {
            base_offset,
            next_offset: base_offset,
            size: 0,
            file: Arc::new(file),
            path,
            dir: dir.to_path_buf(),
            offset_index: SparseIndex::new(Kind::Offset, base_offset),
            time_index: SparseIndex::new(Kind::Time, base_offset),
            max_timestamp: -1,
            created_ms: now_ms,
            bytes_since_entry: 0,
        }
    }

    /// Opens a segment by scanning it: every batch is checked (CRC included) and the file is
    /// cut at the first bad one. Indexes are rebuilt in memory. Used for the active segment
    /// and for any sealed segment whose index files are missing or damaged.
    pub(crate) fn recover(
        dir: &Path,
        base_offset: i64,
        index_interval: u64,
        now_ms: i64,
    ) -> Result<(Self, Option<String>), LogError> {
        let (path, file, len) = open_existing(dir, base_offset)?;
        let mut seg = Self::empty(dir, base_offset, path.clone(), file, now_ms);
        let mut valid_end = 0u64;
        let end = scan(
            &seg.file.clone(),
            &path,
            0,
            len,
            Some(base_offset),
            true,
            |at, h, _| {
                seg.track(at, h, index_interval);
                valid_end = at + h.total_len() as u64;
                ControlFlow::Continue(())
            },
        )?;
        seg.size = valid_end;
        let problem = match end {
            ScanEnd::Invalid { at, why } => {
                seg.file.set_len(at).ctx("truncate segment", &path)?;
                seg.file.sync_all().ctx("fsync segment", &path)?;
                Some(format!(
                    "truncated {} at byte {at} of {len} (offset {}): {why}",
                    path.display(),
                    seg.next_offset
                ))
            }
            _ => None,
        };
        if let Ok(m) = seg.file.metadata() {
            if let Ok(t) = m.modified() {
                if let Ok(d) = t.duration_since(std::time::UNIX_EPOCH) {
                    seg.created_ms = seg.created_ms.min(d.as_millis() as i64);
                }
            }
        }
        Ok((seg, problem))
    }

    /// Opens a segment through its index files without reading it; `None` when they are
    /// missing or fail the sanity checks. `active` keeps the indexes in memory to grow.
    fn open_indexed(
        dir: &Path,
        base_offset: i64,
        next_offset: i64,
        active: bool,
        now_ms: i64,
    ) -> Result<Option<Self>, LogError> {
        let (path, file, len) = open_existing(dir, base_offset)?;
        let ix_path = dir.join(file_name(base_offset, "index"));
        let tix_path = dir.join(file_name(base_offset, "timeindex"));
        let oi = SparseIndex::load(
            Kind::Offset,
            base_offset,
            &ix_path,
            len,
            next_offset,
            active,
        )?;
        let ti = SparseIndex::load(Kind::Time, base_offset, &tix_path, len, next_offset, active)?;
        let (Some(oi), Some(ti)) = (oi, ti) else {
            return Ok(None);
        };
        let modified_ms = file
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(now_ms, |d| d.as_millis() as i64);
        let mut seg = Self::empty(dir, base_offset, path, file, now_ms.min(modified_ms));
        seg.max_timestamp = ti.last().map(|(ts, _)| ts).unwrap_or(-1);
        seg.offset_index = oi;
        seg.time_index = ti;
        seg.size = len;
        seg.next_offset = next_offset;
        Ok(Some(seg))
    }

    /// Opens the active segment as a clean shutdown left it (`next_offset` and `len` from the
    /// shutdown marker), trusting its saved indexes instead of scanning it; `None` when the
    /// file or the indexes do not match what was saved.
    pub(crate) fn open_after_clean_shutdown(
        dir: &Path,
        base_offset: i64,
        next_offset: i64,
        len: u64,
        now_ms: i64,
    ) -> Result<Option<Self>, LogError> {
        Ok(
            Self::open_indexed(dir, base_offset, next_offset, true, now_ms)?
                .filter(|s| s.size == len),
        )
    }

    /// Opens a sealed segment whose end offset is known (the next segment's base), using its
    /// index files when they are sound and rebuilding them otherwise.
    pub(crate) fn open_sealed(
        dir: &Path,
        base_offset: i64,
        next_offset: i64,
        index_interval: u64,
        now_ms: i64,
    ) -> Result<(Self, Option<String>), LogError> {
        if let Some(seg) = Self::open_indexed(dir, base_offset, next_offset, false, now_ms)? {
            return Ok((seg, None));
        }
        let (mut seg, problem) = Self::recover(dir, base_offset, index_interval, now_ms)?;
        seg.seal()?;
        let note = format!(
            "rebuilt indexes of {}{}",
            seg.path.display(),
            problem.map(|p| format!("; {p}")).unwrap_or_default()
        );
        Ok((seg, Some(note)))
    }

    /// Saves the active segment's data and indexes for a clean shutdown.
    pub(crate) fn save_for_shutdown(&self) -> Result<(), LogError> {
        self.file.sync_all().ctx("fsync segment", &self.path)?;
        self.offset_index
            .save(&self.dir.join(file_name(self.base_offset, "index")))?;
        self.time_index
            .save(&self.dir.join(file_name(self.base_offset, "timeindex")))
    }

    /// Records a batch written at `position` in the indexes and bookkeeping.
    fn track(&mut self, position: u64, h: &BatchHeader, index_interval: u64) {
        let first = self.next_offset == self.base_offset;
        if first || self.bytes_since_entry >= index_interval {
            self.offset_index.append(h.base_offset, position as i64);
            self.bytes_since_entry = 0;
        }
        self.bytes_since_entry += h.total_len() as u64;
        if h.max_timestamp > self.max_timestamp {
            let last_ts = self.time_index.last().map(|(ts, _)| ts);
            if first || last_ts.is_none_or(|t| h.max_timestamp > t) {
                self.time_index.append(h.max_timestamp, h.base_offset);
            }
            self.max_timestamp = h.max_timestamp;
        }
        self.next_offset = h.next_offset();
    }

    /// Appends one batch whose offsets are already assigned, given as its header and the
    /// rest so the caller never copies the records.
    pub(crate) fn append(
        &mut self,
        head: &[u8],
        body: &[u8],
        h: &BatchHeader,
        index_interval: u64,
    ) -> Result<(), LogError> {
        let at = self.size;
        self.file
            .write_all_at(head, at)
            .and_then(|()| self.file.write_all_at(body, at + head.len() as u64))
            .ctx("write segment", &self.path)?;
        self.size += (head.len() + body.len()) as u64;
        self.track(at, h, index_interval);
        Ok(())
    }

    /// Writes the indexes to disk and maps them; called when the segment stops being active.
    pub(crate) fn seal(&mut self) -> Result<(), LogError> {
        self.file.sync_all().ctx("fsync segment", &self.path)?;
        self.offset_index
            .seal(&self.dir.join(file_name(self.base_offset, "index")))?;
        self.time_index
            .seal(&self.dir.join(file_name(self.base_offset, "timeindex")))
    }

    /// File position of the batch holding `offset` (or the first batch after it), or the end
    /// of the segment when no batch does.
    pub(crate) fn position_of(&self, offset: i64) -> Result<u64, LogError> {
        let start = self
            .offset_index
            .floor(offset, false)
            .map(|(_, pos)| pos as u64)
            .unwrap_or(0);
        let mut found = self.size;
        scan(
            &self.file,
            &self.path,
            start,
            self.size,
            None,
            false,
            |at, h, _| {
                if h.last_offset() >= offset {
                    found = at;
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            },
        )?;
        Ok(found)
    }

    /// Position from which to search for the first batch with a timestamp at or after `ts`.
    pub(crate) fn search_start_for_timestamp(&self, ts: i64) -> Result<u64, LogError> {
        match self.time_index.floor(ts, true) {
            Some((_, offset)) => self.position_of(offset),
            None => Ok(0),
        }
    }

    /// Reads `len` bytes at `position`.
    pub(crate) fn read(&self, position: u64, len: usize) -> Result<Bytes, LogError> {
        let mut buf = vec![0u8; len];
        self.file
            .read_exact_at(&mut buf, position)
            .ctx("read segment", &self.path)?;
        Ok(Bytes::from(buf))
    }

    /// Cuts the segment so that it ends before `offset`.
    pub(crate) fn truncate_to(&mut self, offset: i64) -> Result<(), LogError> {
        let pos = self.position_of(offset)?;
        self.file.set_len(pos).ctx("truncate segment", &self.path)?;
        self.size = pos;
        self.offset_index.truncate_to_offset(offset);
        self.time_index.truncate_to_offset(offset);
        self.next_offset = offset.max(self.base_offset);
        self.bytes_since_entry = 0;
        Ok(())
    }

    /// Removes the segment's files. Readers holding the file handle keep reading safely.
    pub(crate) fn delete(&self) -> Result<(), LogError> {
        for ext in ["log", "index", "timeindex"] {
            let p = self.dir.join(file_name(self.base_offset, ext));
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).ctx("delete segment", &p),
            }
        }
        Ok(())
    }
}
