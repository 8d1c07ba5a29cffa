//! Sparse indexes over one segment: offset -> file position and timestamp -> offset.
//!
//! The active segment keeps its entries in memory; a sealed segment's index is written to disk
//! once and memory-mapped, so the broker's memory does not grow with the data it stores.

use std::path::Path;

use crate::error::{IoContext, LogError};
use crate::storage::{Mapped, OpenMode, Storage};

enum Entries {
    Active(Vec<u8>),
    Sealed(Option<Mapped>),
}

impl Entries {
    fn bytes(&self) -> &[u8] {
        match self {
            Entries::Active(v) => v,
            Entries::Sealed(Some(m)) => m,
            Entries::Sealed(None) => &[],
        }
    }
}

/// Fixed-width sorted entries, each a key and a value.
pub(crate) struct SparseIndex {
    entries: Entries,
    kind: Kind,
    base_offset: i64,
}

/// Which index: decides the entry layout.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// 4-byte offset relative to the segment base, 4-byte file position.
    Offset,
    /// 8-byte timestamp, 4-byte offset relative to the segment base.
    Time,
}

impl Kind {
    fn width(self) -> usize {
        match self {
            Kind::Offset => 8,
            Kind::Time => 12,
        }
    }
}

fn u32_at(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

impl SparseIndex {
    /// An empty in-memory index for the active segment.
    pub(crate) fn new(kind: Kind, base_offset: i64) -> Self {
        Self {
            entries: Entries::Active(Vec::new()),
            kind,
            base_offset,
        }
    }

    fn entry(&self, i: usize) -> (i64, i64) {
        let w = self.kind.width();
        let e = &self.entries.bytes()[i * w..(i + 1) * w];
        match self.kind {
            Kind::Offset => (
                self.base_offset + u32_at(&e[0..4]) as i64,
                u32_at(&e[4..8]) as i64,
            ),
            Kind::Time => {
                let mut ts = [0u8; 8];
                ts.copy_from_slice(&e[0..8]);
                (
                    i64::from_be_bytes(ts),
                    self.base_offset + u32_at(&e[8..12]) as i64,
                )
            }
        }
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.entries.bytes().len() / self.kind.width()
    }

    /// The last entry, if any.
    pub(crate) fn last(&self) -> Option<(i64, i64)> {
        self.len().checked_sub(1).map(|i| self.entry(i))
    }

    /// Appends an entry. Keys must not decrease. A sealed index becomes active again first
    /// (a truncation can make a sealed segment the active one).
    pub(crate) fn append(&mut self, key: i64, value: i64) {
        let (kind, base) = (self.kind, self.base_offset);
        let v = self.make_active();
        match kind {
            Kind::Offset => {
                v.extend_from_slice(&((key - base) as u32).to_be_bytes());
                v.extend_from_slice(&(value as u32).to_be_bytes());
            }
            Kind::Time => {
                v.extend_from_slice(&key.to_be_bytes());
                v.extend_from_slice(&((value - base) as u32).to_be_bytes());
            }
        }
    }

    /// The last entry whose key is at most `key` (`strict`: below `key`).
    pub(crate) fn floor(&self, key: i64, strict: bool) -> Option<(i64, i64)> {
        let (mut lo, mut hi) = (0usize, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            let k = self.entry(mid).0;
            if k < key || (!strict && k == key) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.checked_sub(1).map(|i| self.entry(i))
    }

    /// Switches a sealed index back to in-memory entries that can grow, and returns them.
    fn make_active(&mut self) -> &mut Vec<u8> {
        if let Entries::Sealed(m) = &self.entries {
            let copy = m.as_deref().map(<[u8]>::to_vec).unwrap_or_default();
            self.entries = Entries::Active(copy);
        }
        match &mut self.entries {
            Entries::Active(v) => v,
            Entries::Sealed(_) => unreachable!("made active just above"),
        }
    }

    /// Drops entries for offsets at or past `next_offset`, for truncation. The index becomes
    /// active (in memory): its file no longer describes the segment.
    pub(crate) fn truncate_to_offset(&mut self, next_offset: i64) {
        let keep = (0..self.len())
            .take_while(|&i| {
                let (k, v) = self.entry(i);
                let offset = if self.kind == Kind::Offset { k } else { v };
                offset < next_offset
            })
            .count();
        let width = self.kind.width();
        self.make_active().truncate(keep * width);
    }

    /// The entries as they would be written to a file.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        self.entries.bytes().to_vec()
    }

    /// Writes the entries to `path` and syncs it, leaving the index as it is (clean shutdown
    /// of the active segment). The file is rewritten in place, keeping its inode: an active
    /// index is held in memory, never mapped, and a new inode per partition per shutdown made
    /// ext4's inode allocation most of a stop with thousands of partitions. A shutdown that
    /// dies half-way leaves no valid shutdown marker, so the next start does not trust this
    /// file.
    pub(crate) fn save(&self, storage: &dyn Storage, path: &Path) -> Result<(), LogError> {
        write_index_file(storage, path, self.entries.bytes(), false)
    }

    /// Switches to reading entries from an index file written with [`write_index`], once the
    /// file holds exactly the entries in memory (anything else means the index changed since).
    pub(crate) fn adopt(&mut self, mapped: Option<Mapped>) {
        let same = match (&self.entries, &mapped) {
            (Entries::Active(v), Some(m)) => v[..] == m[..],
            (Entries::Active(v), None) => v.is_empty(),
            (Entries::Sealed(_), _) => false,
        };
        if same {
            self.entries = Entries::Sealed(mapped);
        }
    }

    /// Loads an index file, returning `None` when it is missing or fails the sanity checks
    /// (so the caller rebuilds it from the segment). A sealed segment's index is memory-mapped;
    /// the active segment's (`active`) is read into memory so it can keep growing.
    pub(crate) fn load(
        storage: &dyn Storage,
        kind: Kind,
        base_offset: i64,
        path: &Path,
        segment_len: u64,
        next_offset: i64,
        active: bool,
    ) -> Result<Option<Self>, LogError> {
        let f = match storage.open(path, OpenMode::Existing) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).ctx("open index", path),
        };
        let entries = if active {
            Entries::Active(storage.read(path).ctx("read index", path)?)
        } else {
            Entries::Sealed(f.map().ctx("map index", path)?)
        };
        let index = Self {
            entries,
            kind,
            base_offset,
        };
        let bytes = index.entries.bytes().len();
        if !bytes.is_multiple_of(kind.width()) || (segment_len > 0 && index.len() == 0) {
            return Ok(None);
        }
        let mut prev = (i64::MIN, i64::MIN);
        for i in 0..index.len() {
            let (k, v) = index.entry(i);
            let (offset, position) = match kind {
                Kind::Offset => (k, v),
                Kind::Time => (v, 0),
            };
            let sorted = k >= prev.0 && v >= prev.1;
            if !sorted
                || offset < base_offset
                || offset >= next_offset
                || position as u64 >= segment_len
            {
                return Ok(None);
            }
            prev = (k, v);
        }
        Ok(Some(index))
    }
}

/// Writes index entries to `path`, as a new file, and syncs them.
pub(crate) fn write_index(
    storage: &dyn Storage,
    path: &Path,
    bytes: &[u8],
) -> Result<(), LogError> {
    write_index_file(storage, path, bytes, true)
}

/// Writes index entries to `path` and syncs them; with `new_inode` the old file is removed
/// first instead of truncated.
fn write_index_file(
    storage: &dyn Storage,
    path: &Path,
    bytes: &[u8],
    new_inode: bool,
) -> Result<(), LogError> {
    // A new inode, never the old one truncated, wherever the old file may be mapped: a live
    // memory map of it (a sealed index still being read) would fault on the truncated pages.
    if new_inode {
        crate::storage::remove_if_exists(storage, path).ctx("remove old index", path)?;
    }
    let f = storage
        .open(path, OpenMode::CreateTruncate)
        .ctx("create index", path)?;
    let written = f
        .write_all_at(bytes, 0)
        .ctx("write index", path)
        .and_then(|()| {
            f.sync_data().map_err(|source| {
                // An index is derived from its segment, whose data is already synced: an
                // ENOSPC from its fsync (a file system allocating blocks at writeback) loses
                // nothing that cannot be rebuilt, so it is a full disk like a failed write,
                // not a failed one.
                if crate::error::is_enospc(&source) {
                    LogError::StorageFull {
                        op: "fsync index",
                        path: path.to_path_buf(),
                        source,
                    }
                } else {
                    LogError::Io {
                        op: "fsync index",
                        path: path.to_path_buf(),
                        source,
                    }
                }
            })
        });
    if written.is_err() {
        // A partial or unsynced index file must not pass for a whole one at the next start
        // (a prefix of entries passes the sanity checks); without it the segment is scanned.
        drop(f);
        let _ = crate::storage::remove_if_exists(storage, path);
    }
    written
}

/// Writes index entries to `path`, syncs them and maps the file for reading; the file is never
/// written again (index files of sealed segments).
pub(crate) fn write_and_map(
    storage: &dyn Storage,
    path: &Path,
    bytes: &[u8],
) -> Result<Option<Mapped>, LogError> {
    write_index(storage, path, bytes)?;
    let f = storage
        .open(path, OpenMode::Existing)
        .ctx("open index", path)?;
    f.map().ctx("map index", path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_finds_greatest_entry_at_or_below() {
        let mut ix = SparseIndex::new(Kind::Offset, 100);
        ix.append(100, 0);
        ix.append(150, 4096);
        ix.append(200, 8192);
        assert_eq!(ix.floor(99, false), None);
        assert_eq!(ix.floor(100, false), Some((100, 0)));
        assert_eq!(ix.floor(199, false), Some((150, 4096)));
        assert_eq!(ix.floor(200, false), Some((200, 8192)));
        assert_eq!(ix.floor(200, true), Some((150, 4096)));
        assert_eq!(ix.floor(10_000, false), Some((200, 8192)));
    }

    #[test]
    fn sealed_index_reads_back_and_rejects_damage() {
        let dir = tempfile::tempdir().unwrap();
        let fs = crate::storage::FsStorage;
        let path = dir.path().join("0.timeindex");
        let mut ix = SparseIndex::new(Kind::Time, 0);
        ix.append(1_000, 0);
        ix.append(2_000, 10);
        let mapped = write_and_map(&fs, &path, &ix.to_bytes()).unwrap();
        ix.adopt(mapped);
        assert!(matches!(ix.entries, Entries::Sealed(Some(_))));
        assert_eq!(ix.floor(1_500, true), Some((1_000, 0)));
        let loaded = SparseIndex::load(&fs, Kind::Time, 0, &path, 4096, 20, false)
            .unwrap()
            .unwrap();
        assert_eq!(loaded.last(), Some((2_000, 10)));
        // An entry beyond the segment's offsets means the file is stale.
        assert!(SparseIndex::load(&fs, Kind::Time, 0, &path, 4096, 5, false)
            .unwrap()
            .is_none());
        std::fs::write(&path, [0u8; 7]).unwrap();
        assert!(
            SparseIndex::load(&fs, Kind::Time, 0, &path, 4096, 20, false)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_sealed_index_accepts_appends_after_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let fs = crate::storage::FsStorage;
        let path = dir.path().join("0.index");
        let mut ix = SparseIndex::new(Kind::Offset, 0);
        ix.append(0, 0);
        ix.append(10, 500);
        ix.append(20, 900);
        let mapped = write_and_map(&fs, &path, &ix.to_bytes()).unwrap();
        ix.adopt(mapped);
        ix.truncate_to_offset(15);
        ix.append(15, 700);
        assert_eq!(ix.last(), Some((15, 700)));
        assert_eq!(ix.floor(12, false), Some((10, 500)));
    }

    #[test]
    fn truncate_drops_entries_past_cut() {
        let mut ix = SparseIndex::new(Kind::Offset, 0);
        ix.append(0, 0);
        ix.append(10, 500);
        ix.append(20, 900);
        ix.truncate_to_offset(15);
        assert_eq!(ix.last(), Some((10, 500)));
    }
}
