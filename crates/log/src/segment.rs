//! One segment: a file of whole RecordBatches starting at `base_offset`, plus its indexes.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use spate_protocol::batch::{self, BatchError, BatchHeader, HEADER_LEN};

use crate::error::{IoContext, LogError};
use crate::index::{self, Kind, SparseIndex};
use crate::storage::{self, Mapped, OpenMode, Storage, StorageFile};

/// Bytes read per step when scanning a segment.
const SCAN_CHUNK: usize = 1 << 20;

/// Bytes read per step when walking batch headers: enough to hold the headers of several small
/// batches, small enough that a lookup costs a page or two, not a megabyte.
const WALK_WINDOW: usize = 4096;

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

/// Walks whole batches of `file` from `start` to `end`, checking structure, offsets growing
/// from `expect_offset` (gaps allowed: compaction makes them) and (when `verify_crc`) the CRC
/// of each. `visit` sees each batch's
/// position, header and bytes.
pub(crate) fn scan(
    file: &dyn StorageFile,
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
                // Offsets only grow; a compacted log has gaps where its cleaner removed whole
                // batches.
                if h.base_offset < expected {
                    return Ok(ScanEnd::Invalid {
                        at,
                        why: format!(
                            "batch offset {} where {expected} or later was expected",
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

/// Walks the batch headers of `file` from `start` (a batch boundary) to `end` with small reads,
/// never reading the records: for position lookups and header-only passes over a segment whose
/// batches were validated when written or recovered.
pub(crate) fn walk_headers(
    file: &dyn StorageFile,
    path: &Path,
    start: u64,
    end: u64,
    mut visit: impl FnMut(u64, &BatchHeader) -> ControlFlow<()>,
) -> Result<(), LogError> {
    let mut buf = [0u8; WALK_WINDOW];
    let (mut win_start, mut win_len) = (0u64, 0usize);
    let mut pos = start;
    while pos < end {
        let in_window = pos >= win_start && pos + HEADER_LEN as u64 <= win_start + win_len as u64;
        if !in_window {
            let n = ((end - pos) as usize).min(WALK_WINDOW);
            if n < HEADER_LEN {
                return Err(LogError::Corrupt {
                    path: path.to_path_buf(),
                    position: pos,
                    reason: format!("{n} bytes at the end of the segment are not a batch"),
                });
            }
            file.read_exact_at(&mut buf[..n], pos)
                .ctx("read segment", path)?;
            (win_start, win_len) = (pos, n);
        }
        let off = (pos - win_start) as usize;
        let h = BatchHeader::parse(&buf[off..win_len]).map_err(|e| LogError::Corrupt {
            path: path.to_path_buf(),
            position: pos,
            reason: e.to_string(),
        })?;
        if visit(pos, &h).is_break() {
            return Ok(());
        }
        pos += h.total_len() as u64;
    }
    Ok(())
}

/// Opens an existing segment file; returns its path, handle and size.
fn open_existing(
    storage: &dyn Storage,
    dir: &Path,
    base_offset: i64,
) -> Result<(PathBuf, Arc<dyn StorageFile>, u64), LogError> {
    let path = dir.join(file_name(base_offset, "log"));
    let file = storage
        .open(&path, OpenMode::Existing)
        .ctx("open segment", &path)?;
    let len = file.len().ctx("stat segment", &path)?;
    Ok((path, file, len))
}

/// The index files of a segment that stopped being active, written off the append path.
pub(crate) struct SealedIndexes {
    offset: Option<Mapped>,
    time: Option<Mapped>,
}

/// The work of sealing a segment, taken out of the append path: fsync its data, then write,
/// fsync and map its index files, then make their directory entries durable. The data goes
/// first so an index file on disk never describes bytes that a power loss could take away.
pub(crate) struct SealJob {
    storage: Arc<dyn Storage>,
    file: Arc<dyn StorageFile>,
    path: PathBuf,
    dir: PathBuf,
    base_offset: i64,
    offset_entries: Vec<u8>,
    time_entries: Vec<u8>,
}

impl SealJob {
    /// Does the sealing I/O.
    pub(crate) fn run(self) -> Result<SealedIndexes, LogError> {
        self.file.sync_data().ctx("fsync segment", &self.path)?;
        let st = &*self.storage;
        let offset_path = self.dir.join(file_name(self.base_offset, "index"));
        let time_path = self.dir.join(file_name(self.base_offset, "timeindex"));
        let written = index::write_and_map(st, &offset_path, &self.offset_entries)
            .and_then(|offset| {
                index::write_and_map(st, &time_path, &self.time_entries).map(|t| (offset, t))
            })
            .and_then(|both| {
                // The directory entries of index files only: their data is synced, and losing
                // them at a power loss costs a rebuild, so ENOSPC here is only "full".
                st.sync_dir(&self.dir).map_err(|source| {
                    let (op, path) = ("sync log dir for index files", self.dir.clone());
                    if crate::error::is_enospc(&source) {
                        LogError::StorageFull { op, path, source }
                    } else {
                        LogError::Io { op, path, source }
                    }
                })?;
                Ok(both)
            });
        match written {
            Ok((offset, time)) => Ok(SealedIndexes { offset, time }),
            Err(e) if e.is_storage_full() => {
                // The segment's data is intact (fsynced above); only its index files are
                // missing. The in-memory indexes keep serving, and a restart rebuilds the
                // files: remove partial ones so they cannot pass for whole.
                let _ = crate::storage::remove_if_exists(st, &offset_path);
                let _ = crate::storage::remove_if_exists(st, &time_path);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
}

/// One segment of a partition log.
pub(crate) struct Segment {
    pub(crate) base_offset: i64,
    pub(crate) next_offset: i64,
    pub(crate) size: u64,
    pub(crate) file: Arc<dyn StorageFile>,
    pub(crate) path: PathBuf,
    dir: PathBuf,
    storage: Arc<dyn Storage>,
    offset_index: SparseIndex,
    time_index: SparseIndex,
    /// Largest batch max timestamp in the segment, -1 when empty.
    pub(crate) max_timestamp: i64,
    /// Wall-clock time the segment was created, for segment.ms.
    pub(crate) created_ms: i64,
    bytes_since_entry: u64,
}

impl Segment {
    /// Creates a new, empty segment file. Its directory entry is not yet durable: the caller
    /// syncs the directory before anything in the file is reported durable.
    pub(crate) fn create(
        storage: &Arc<dyn Storage>,
        dir: &Path,
        base_offset: i64,
        now_ms: i64,
    ) -> Result<Self, LogError> {
        let path = dir.join(file_name(base_offset, "log"));
        let file = storage
            .open(&path, OpenMode::CreateTruncate)
            .ctx("create segment", &path)?;
        // Index files of an earlier segment with this base (before a truncation) would
        // describe other bytes.
        remove_files(
            &**storage,
            dir,
            base_offset,
            INDEX_EXTS,
            "remove stale index",
        )?;
        Ok(Self::empty(storage, dir, base_offset, path, file, now_ms))
    }

    fn empty(
        storage: &Arc<dyn Storage>,
        dir: &Path,
        base_offset: i64,
        path: PathBuf,
        file: Arc<dyn StorageFile>,
        now_ms: i64,
    ) -> Self {
        Self {
            base_offset,
            next_offset: base_offset,
            size: 0,
            file,
            path,
            dir: dir.to_path_buf(),
            storage: storage.clone(),
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
        storage: &Arc<dyn Storage>,
        dir: &Path,
        base_offset: i64,
        index_interval: u64,
        now_ms: i64,
    ) -> Result<(Self, Option<String>), LogError> {
        let (path, file, len) = open_existing(&**storage, dir, base_offset)?;
        let mut seg = Self::empty(storage, dir, base_offset, path.clone(), file, now_ms);
        let mut valid_end = 0u64;
        let end = scan(
            &*seg.file.clone(),
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
                seg.file.sync_data().ctx("fsync segment", &path)?;
                Some(format!(
                    "truncated {} at byte {at} of {len} (offset {}): {why}",
                    path.display(),
                    seg.next_offset
                ))
            }
            _ => None,
        };
        if let Some(modified) = seg.file.modified_ms() {
            seg.created_ms = seg.created_ms.min(modified);
        }
        Ok((seg, problem))
    }

    /// Opens a segment through its index files without reading it; `None` when they are
    /// missing or fail the sanity checks. `active` keeps the indexes in memory to grow.
    fn open_indexed(
        storage: &Arc<dyn Storage>,
        dir: &Path,
        base_offset: i64,
        next_offset: i64,
        active: bool,
        now_ms: i64,
    ) -> Result<Option<Self>, LogError> {
        let (path, file, len) = open_existing(&**storage, dir, base_offset)?;
        let ix_path = dir.join(file_name(base_offset, "index"));
        let tix_path = dir.join(file_name(base_offset, "timeindex"));
        let st = &**storage;
        let oi = SparseIndex::load(
            st,
            Kind::Offset,
            base_offset,
            &ix_path,
            len,
            next_offset,
            active,
        )?;
        let ti = SparseIndex::load(
            st,
            Kind::Time,
            base_offset,
            &tix_path,
            len,
            next_offset,
            active,
        )?;
        let (Some(oi), Some(ti)) = (oi, ti) else {
            return Ok(None);
        };
        let modified_ms = file.modified_ms().unwrap_or(now_ms);
        let mut seg = Self::empty(
            storage,
            dir,
            base_offset,
            path,
            file,
            now_ms.min(modified_ms),
        );
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
        storage: &Arc<dyn Storage>,
        dir: &Path,
        base_offset: i64,
        next_offset: i64,
        len: u64,
        now_ms: i64,
    ) -> Result<Option<Self>, LogError> {
        Ok(
            Self::open_indexed(storage, dir, base_offset, next_offset, true, now_ms)?
                .filter(|s| s.size == len),
        )
    }

    /// Opens a sealed segment whose end offset is known (the next segment's base), using its
    /// index files when they are sound and rebuilding them otherwise. The flag says whether
    /// recovery had to cut damaged data off its end.
    pub(crate) fn open_sealed(
        storage: &Arc<dyn Storage>,
        dir: &Path,
        base_offset: i64,
        next_offset: i64,
        index_interval: u64,
        now_ms: i64,
    ) -> Result<(Self, Option<String>, bool), LogError> {
        if let Some(seg) =
            Self::open_indexed(storage, dir, base_offset, next_offset, false, now_ms)?
        {
            return Ok((seg, None, false));
        }
        let (mut seg, problem) = Self::recover(storage, dir, base_offset, index_interval, now_ms)?;
        let cut = problem.is_some();
        let rebuilt = match seg.seal_job().run() {
            Ok(sealed) => {
                seg.adopt(sealed);
                "rebuilt indexes of".to_string()
            }
            // A full disk must not keep the log from opening: the indexes just rebuilt in
            // memory serve, and the next start writes the files if there is room then.
            Err(e) if e.is_storage_full() => {
                format!("no space for index files ({e}); indexes kept in memory for")
            }
            Err(e) => return Err(e),
        };
        let note = format!(
            "{rebuilt} {}{}",
            seg.path.display(),
            problem.map(|p| format!("; {p}")).unwrap_or_default()
        );
        Ok((seg, Some(note), cut))
    }

    /// Saves the active segment's data and indexes for a clean shutdown.
    pub(crate) fn save_for_shutdown(&self) -> Result<(), LogError> {
        self.file.sync_data().ctx("fsync segment", &self.path)?;
        let st = &*self.storage;
        self.offset_index
            .save(st, &self.dir.join(file_name(self.base_offset, "index")))?;
        self.time_index
            .save(st, &self.dir.join(file_name(self.base_offset, "timeindex")))
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
        // Offsets only grow within a segment, and a segment holds only its own.
        debug_assert!(
            h.base_offset >= self.next_offset && h.base_offset >= self.base_offset,
            "{}: batch at {} appended after offset {}",
            self.path.display(),
            h.base_offset,
            self.next_offset
        );
        let at = self.size;
        if let Err(e) = self
            .file
            .write_two_at(head, body, at)
            .ctx("write segment", &self.path)
        {
            if e.is_storage_full() {
                // Part of the batch may be in the file: cut it so nothing torn stays behind a
                // log that remains in service. Shrinking needs no space.
                self.file
                    .set_len(at)
                    .ctx("cut a partial write off segment", &self.path)
                    .map_err(|e| match e {
                        // A failed cut leaves bytes we cannot account for: the log must fail.
                        LogError::StorageFull { op, path, source } => {
                            LogError::Io { op, path, source }
                        }
                        e => e,
                    })?;
            }
            return Err(e);
        }
        self.size += (head.len() + body.len()) as u64;
        self.track(at, h, index_interval);
        debug_assert!(self.next_offset > self.base_offset && self.size > 0);
        Ok(())
    }

    /// The I/O that seals this segment once it stops being active, to run off the append
    /// path; until [`Segment::adopt`] takes its result the in-memory indexes keep serving.
    pub(crate) fn seal_job(&self) -> SealJob {
        SealJob {
            storage: self.storage.clone(),
            file: self.file.clone(),
            path: self.path.clone(),
            dir: self.dir.clone(),
            base_offset: self.base_offset,
            offset_entries: self.offset_index.to_bytes(),
            time_entries: self.time_index.to_bytes(),
        }
    }

    /// Switches to the memory-mapped index files a seal job wrote (unless the segment changed
    /// since, e.g. a truncation made it active again).
    pub(crate) fn adopt(&mut self, sealed: SealedIndexes) {
        self.offset_index.adopt(sealed.offset);
        self.time_index.adopt(sealed.time);
    }

    /// File position and header of the batch holding `offset` (or the first batch after it);
    /// `None` when no batch of this segment does.
    pub(crate) fn batch_at(&self, offset: i64) -> Result<Option<(u64, BatchHeader)>, LogError> {
        let start = self
            .offset_index
            .floor(offset, false)
            .map(|(_, pos)| pos as u64)
            .unwrap_or(0);
        let mut found = None;
        walk_headers(&*self.file, &self.path, start, self.size, |at, h| {
            if h.last_offset() >= offset {
                found = Some((at, *h));
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        Ok(found)
    }

    /// File position of the batch holding `offset` (or the first batch after it), or the end
    /// of the segment when no batch does.
    pub(crate) fn position_of(&self, offset: i64) -> Result<u64, LogError> {
        Ok(self.batch_at(offset)?.map_or(self.size, |(at, _)| at))
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

    /// Cuts the segment before the batch holding `offset`, so it ends on a batch boundary;
    /// returns the new next offset (the removed batch's base offset, or the segment's end when
    /// `offset` is past it). The cut is synced before this returns: a power loss must not bring
    /// a removed (divergent) tail back. The segment becomes active again: its index files, if
    /// any, are removed because they describe the old length.
    pub(crate) fn truncate_to(&mut self, offset: i64) -> Result<i64, LogError> {
        self.reactivate()?;
        let Some((pos, h)) = self.batch_at(offset)? else {
            return Ok(self.next_offset);
        };
        self.file.set_len(pos).ctx("truncate segment", &self.path)?;
        self.file.sync_data().ctx("fsync segment", &self.path)?;
        let new_end = h.base_offset;
        self.size = pos;
        self.offset_index.truncate_to_offset(new_end);
        self.time_index.truncate_to_offset(new_end);
        self.next_offset = new_end;
        self.max_timestamp = self.time_index.last().map_or(-1, |(ts, _)| ts);
        if self.size > 0 && self.max_timestamp < 0 {
            self.max_timestamp = self.recompute_max_timestamp()?;
        }
        // Start a new index interval so the next entry is at most one interval away.
        self.bytes_since_entry = self.size;
        Ok(new_end)
    }

    /// Makes a sealed segment the active one again (after a truncation removed the segments
    /// after it): its indexes move back into memory and its index files go, since they would
    /// no longer describe it once it grows.
    fn reactivate(&mut self) -> Result<(), LogError> {
        self.offset_index.truncate_to_offset(i64::MAX);
        self.time_index.truncate_to_offset(i64::MAX);
        remove_files(
            &*self.storage,
            &self.dir,
            self.base_offset,
            INDEX_EXTS,
            "remove stale index",
        )
    }

    /// The largest batch timestamp, read from the batch headers.
    fn recompute_max_timestamp(&self) -> Result<i64, LogError> {
        let mut max = -1;
        walk_headers(&*self.file, &self.path, 0, self.size, |_, h| {
            max = max.max(h.max_timestamp);
            ControlFlow::Continue(())
        })?;
        Ok(max)
    }

    /// Removes the segment's files. Readers holding the file handle keep reading safely.
    pub(crate) fn delete(&self) -> Result<(), LogError> {
        remove_files(
            &*self.storage,
            &self.dir,
            self.base_offset,
            &["log", "index", "timeindex"],
            "delete segment",
        )
    }
}

/// The extensions of a segment's index files.
pub(crate) const INDEX_EXTS: &[&str] = &["index", "timeindex"];

/// Removes the files of the segment at `base` with these extensions, where they exist.
pub(crate) fn remove_files(
    storage: &dyn Storage,
    dir: &Path,
    base: i64,
    exts: &[&str],
    op: &'static str,
) -> Result<(), LogError> {
    for ext in exts {
        let p = dir.join(file_name(base, ext));
        storage::remove_if_exists(storage, &p).ctx(op, &p)?;
    }
    Ok(())
}
