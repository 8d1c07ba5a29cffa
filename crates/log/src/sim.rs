//! A simulated disk for tests: every file keeps what was written (the page cache) apart from
//! what was synced (the platter), so a test can crash the process (the page cache survives),
//! lose power (unsynced bytes are lost, the last unsynced write may be torn) and inject I/O
//! errors on write or fsync.
//!
//! Directory entries follow the same rule as file bytes: a file created, renamed or removed
//! is durable once its directory was synced. Directories themselves are durable at once.
//! A failed fsync behaves as Linux does: the dirty pages it could not write are marked clean,
//! so a later successful fsync does not write them either (they are lost at power loss).

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::storage::{Mapped, OpenMode, Storage, StorageFile};

#[derive(Default)]
struct Node {
    /// What readers see.
    written: Vec<u8>,
    /// What survives a power loss.
    synced: Vec<u8>,
    /// Byte ranges whose writes a failed fsync dropped: never reach `synced`.
    dropped: Vec<(usize, usize)>,
    /// Byte ranges written since the last sync.
    dirty: Vec<(usize, usize)>,
}

#[derive(Default)]
struct State {
    /// The namespace processes see.
    live: HashMap<PathBuf, Arc<Mutex<Node>>>,
    /// The namespace as of the last directory syncs.
    durable: HashMap<PathBuf, Arc<Mutex<Node>>>,
    dirs: BTreeSet<PathBuf>,
    /// Incremented by every crash: handles from before it stop working.
    generation: u64,
    fail_fsync: bool,
    /// Fsyncs of files subject to `full_only_for` fail with ENOSPC.
    fsync_enospc: bool,
    fail_write: bool,
    /// Bytes the disk holds across every live file; `None`: unlimited.
    capacity: Option<u64>,
    /// When set, only files whose name ends so are subject to `capacity`.
    full_only_for: Option<String>,
    fsyncs: u64,
    bytes_read: u64,
    rng: u64,
}

/// A simulated disk shared by every handle opened on it.
#[derive(Clone, Default)]
pub struct SimDisk {
    state: Arc<Mutex<State>>,
}

/// How a power loss treats the bytes written but not synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tear {
    /// All unsynced bytes are lost.
    LoseAll,
    /// A seeded random prefix of each file's unsynced tail reached the disk (the kernel
    /// wrote some pages back on its own), cutting the last write anywhere.
    RandomPrefix(u64),
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("simulated I/O error: {what}"))
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

impl SimDisk {
    /// An empty disk.
    pub fn new() -> Self {
        Self::default()
    }

    /// This disk as a `Storage` handle.
    pub fn storage(&self) -> Arc<dyn Storage> {
        Arc::new(self.clone())
    }

    /// Makes every following fsync fail (`true`) or succeed again.
    pub fn fail_fsync(&self, fail: bool) {
        self.state.lock().fail_fsync = fail;
    }

    /// Makes every following fsync of a file the capacity applies to (see
    /// [`SimDisk::full_only_for`]) fail with ENOSPC (`true`), as file systems that allocate
    /// blocks at writeback report a full disk, or succeed again. The pages it could not write
    /// are dropped, as with [`SimDisk::fail_fsync`].
    pub fn enospc_on_fsync(&self, fail: bool) {
        self.state.lock().fsync_enospc = fail;
    }

    /// Makes every following write fail (`true`) or succeed again.
    pub fn fail_writes(&self, fail: bool) {
        self.state.lock().fail_write = fail;
    }

    /// Limits the bytes every live file holds together (`None`: unlimited). A write that
    /// would go past it writes what fits, then fails with ENOSPC, as a file system that fills
    /// in the middle of a write does (the write is torn).
    pub fn set_capacity(&self, capacity: Option<u64>) {
        self.state.lock().capacity = capacity;
    }

    /// Applies the capacity only to files whose name ends with `suffix` (`None`: to all), so
    /// a test can make one kind of write meet ENOSPC.
    pub fn full_only_for(&self, suffix: Option<&str>) {
        self.state.lock().full_only_for = suffix.map(str::to_owned);
    }

    /// Bytes every live file holds together.
    pub fn used_bytes(&self) -> u64 {
        let st = self.state.lock();
        st.live
            .values()
            .map(|n| n.lock().written.len() as u64)
            .sum()
    }

    /// Fsyncs that succeeded so far.
    pub fn fsync_count(&self) -> u64 {
        self.state.lock().fsyncs
    }

    /// Bytes read through file handles so far.
    pub fn bytes_read(&self) -> u64 {
        self.state.lock().bytes_read
    }

    /// A process crash: open handles stop working, every written byte stays (the page cache
    /// belongs to the kernel, which did not crash).
    pub fn crash_process(&self) {
        self.state.lock().generation += 1;
    }

    /// A power loss: open handles stop working; files keep only their synced bytes (plus a
    /// torn part of the unsynced tail with [`Tear::RandomPrefix`]), and the namespace goes
    /// back to what directory syncs made durable.
    pub fn power_loss(&self, tear: Tear) {
        let mut st = self.state.lock();
        st.generation += 1;
        if let Tear::RandomPrefix(seed) = tear {
            st.rng = seed | 1;
        }
        let durable: Vec<_> = st
            .durable
            .iter()
            .map(|(p, n)| (p.clone(), n.clone()))
            .collect();
        st.live.clear();
        for (path, node) in durable {
            {
                let mut n = node.lock();
                let mut kept = n.synced.clone();
                if let Tear::RandomPrefix(_) = tear {
                    let grows = n.written.len() > kept.len()
                        && n.written[..kept.len()] == kept[..]
                        && n.dropped.is_empty();
                    if grows {
                        let extra = n.written.len() - kept.len();
                        let take = (next_rand(&mut st.rng) % (extra as u64 + 1)) as usize;
                        let from = kept.len();
                        kept.extend_from_slice(&n.written[from..from + take]);
                    }
                }
                n.written = kept.clone();
                n.synced = kept;
                n.dirty.clear();
                n.dropped.clear();
            }
            st.live.insert(path, node);
        }
    }

    /// The synced bytes of a file, as a power loss would leave them (for assertions).
    pub fn synced_len(&self, path: &Path) -> Option<usize> {
        let st = self.state.lock();
        st.live.get(path).map(|n| n.lock().synced.len())
    }
}

fn next_rand(x: &mut u64) -> u64 {
    // xorshift64*: deterministic per seed, good enough to pick tear points.
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

struct SimFile {
    disk: SimDisk,
    node: Arc<Mutex<Node>>,
    path: PathBuf,
    generation: u64,
}

impl SimFile {
    fn check(&self) -> io::Result<()> {
        if self.disk.state.lock().generation != self.generation {
            return Err(eio("handle from before a crash"));
        }
        Ok(())
    }
}

impl StorageFile for SimFile {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        self.check()?;
        self.disk.state.lock().bytes_read += buf.len() as u64;
        let n = self.node.lock();
        let start = pos as usize;
        let end = start
            .checked_add(buf.len())
            .filter(|&e| e <= n.written.len())
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"))?;
        buf.copy_from_slice(&n.written[start..end]);
        Ok(())
    }

    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.check()?;
        let room = {
            let st = self.disk.state.lock();
            if st.fail_write {
                return Err(eio("write"));
            }
            let name = self.path.to_string_lossy();
            let limited = st
                .full_only_for
                .as_deref()
                .is_none_or(|suffix| name.ends_with(suffix));
            match st.capacity.filter(|_| limited) {
                Some(cap) => {
                    let used: u64 = st
                        .live
                        .values()
                        .map(|n| n.lock().written.len() as u64)
                        .sum();
                    Some(cap.saturating_sub(used))
                }
                None => None,
            }
        };
        let mut n = self.node.lock();
        let start = pos as usize;
        let mut end = start + buf.len();
        let mut buf = buf;
        let mut enospc = false;
        if let Some(room) = room {
            let may_end = n.written.len() + room as usize;
            if end > may_end {
                // Write what fits, then fail: a torn write.
                enospc = true;
                end = may_end.max(start);
                buf = &buf[..end - start];
            }
        }
        if n.written.len() < end {
            n.written.resize(end, 0);
        }
        n.written[start..end].copy_from_slice(buf);
        n.dirty.push((start, end));
        if enospc {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.check()?;
        let mut n = self.node.lock();
        let len = len as usize;
        let old = n.written.len();
        n.written.resize(len, 0);
        if len > old {
            n.dirty.push((old, len));
        }
        // A length change is metadata: durable only with the next sync.
        n.dirty.push((len, len));
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.check()?;
        let fail = {
            let mut st = self.disk.state.lock();
            let name = self.path.to_string_lossy();
            let enospc = st.fsync_enospc
                && st
                    .full_only_for
                    .as_deref()
                    .is_none_or(|suffix| name.ends_with(suffix));
            let fail = if st.fail_fsync {
                Some(eio("fsync"))
            } else if enospc {
                Some(io::Error::from_raw_os_error(libc::ENOSPC))
            } else {
                None
            };
            if fail.is_none() {
                st.fsyncs += 1;
            }
            fail
        };
        let mut n = self.node.lock();
        if let Some(e) = fail {
            // Linux marks the pages it failed to write clean: they are gone for good.
            let dirty = std::mem::take(&mut n.dirty);
            n.dropped.extend(dirty);
            return Err(e);
        }
        let mut synced = n.written.clone();
        for &(a, b) in &n.dropped {
            let (a, b) = (a.min(synced.len()), b.min(synced.len()));
            // What the disk held there before, or zeros where it held nothing.
            for (i, byte) in synced.iter_mut().enumerate().take(b).skip(a) {
                *byte = n.synced.get(i).copied().unwrap_or(0);
            }
        }
        n.synced = synced;
        n.dirty.clear();
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        self.check()?;
        Ok(self.node.lock().written.len() as u64)
    }

    fn modified_ms(&self) -> Option<i64> {
        None
    }

    fn map(&self) -> io::Result<Option<Mapped>> {
        self.check()?;
        let n = self.node.lock();
        if n.written.is_empty() {
            return Ok(None);
        }
        Ok(Some(Mapped::new(n.written.clone())))
    }
}

impl Storage for SimDisk {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        let mut st = self.state.lock();
        let parent_exists = path.parent().is_none_or(|p| st.dirs.contains(p));
        let node = match (st.live.get(path).cloned(), mode) {
            (Some(node), OpenMode::Existing) => node,
            (None, OpenMode::Existing) => return Err(not_found(path)),
            (_, OpenMode::CreateTruncate) if !parent_exists => return Err(not_found(path)),
            (Some(node), OpenMode::CreateTruncate) => {
                {
                    let mut n = node.lock();
                    n.written.clear();
                    n.dirty.push((0, 0));
                }
                node
            }
            (None, OpenMode::CreateTruncate) => {
                let node = Arc::new(Mutex::new(Node::default()));
                st.live.insert(path.to_path_buf(), node.clone());
                node
            }
        };
        Ok(Arc::new(SimFile {
            disk: self.clone(),
            node,
            path: path.to_path_buf(),
            generation: st.generation,
        }))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let st = self.state.lock();
        let node = st.live.get(path).ok_or_else(|| not_found(path))?;
        let bytes = node.lock().written.clone();
        Ok(bytes)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        let node = st.live.remove(from).ok_or_else(|| not_found(from))?;
        st.live.insert(to.to_path_buf(), node);
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        st.live
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        if !st.dirs.contains(path) {
            return Err(not_found(path));
        }
        st.live.retain(|p, _| !p.starts_with(path));
        // Removing a tree is made durable by its parent's sync in real file systems; the
        // simulation makes it durable at once, which is the conservative side for recovery.
        st.durable.retain(|p, _| !p.starts_with(path));
        st.dirs.retain(|d| !d.starts_with(path));
        Ok(())
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        for a in path.ancestors() {
            if !a.as_os_str().is_empty() {
                st.dirs.insert(a.to_path_buf());
            }
        }
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        if st.generation > 0 && !st.dirs.contains(path) {
            return Err(not_found(path));
        }
        if st.fail_fsync {
            return Err(eio("fsync of a directory"));
        }
        let live: Vec<_> = st
            .live
            .iter()
            .filter(|(p, _)| p.parent() == Some(path))
            .map(|(p, n)| (p.clone(), n.clone()))
            .collect();
        st.durable.retain(|p, _| p.parent() != Some(path));
        st.durable.extend(live);
        Ok(())
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let st = self.state.lock();
        if !st.dirs.contains(path) {
            return Err(not_found(path));
        }
        let mut names: BTreeSet<String> = st
            .live
            .keys()
            .filter(|p| p.parent() == Some(path))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_string))
            .collect();
        names.extend(
            st.dirs
                .iter()
                .filter(|d| d.parent() == Some(path))
                .filter_map(|d| d.file_name()?.to_str().map(str::to_string)),
        );
        Ok(names.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk_with_dir() -> (SimDisk, PathBuf) {
        let d = SimDisk::new();
        let dir = PathBuf::from("/d");
        d.create_dir_all(&dir).unwrap();
        (d, dir)
    }

    #[test]
    fn unsynced_bytes_survive_a_process_crash_but_not_a_power_loss() {
        let (d, dir) = disk_with_dir();
        let p = dir.join("f");
        let f = d.open(&p, OpenMode::CreateTruncate).unwrap();
        d.sync_dir(&dir).unwrap();
        f.write_all_at(b"synced", 0).unwrap();
        f.sync_data().unwrap();
        f.write_all_at(b"-lost", 6).unwrap();
        d.crash_process();
        assert!(f.len().is_err(), "old handles die with the process");
        assert_eq!(d.read(&p).unwrap(), b"synced-lost");
        d.power_loss(Tear::LoseAll);
        assert_eq!(d.read(&p).unwrap(), b"synced");
    }

    #[test]
    fn a_file_whose_directory_was_never_synced_vanishes_at_power_loss() {
        let (d, dir) = disk_with_dir();
        let f = d.open(&dir.join("f"), OpenMode::CreateTruncate).unwrap();
        f.write_all_at(b"x", 0).unwrap();
        f.sync_data().unwrap();
        d.power_loss(Tear::LoseAll);
        assert!(d.read(&dir.join("f")).is_err());
    }

    #[test]
    fn pages_dropped_by_a_failed_fsync_are_not_written_by_the_next_one() {
        let (d, dir) = disk_with_dir();
        let p = dir.join("f");
        let f = d.open(&p, OpenMode::CreateTruncate).unwrap();
        d.sync_dir(&dir).unwrap();
        f.write_all_at(b"aaaa", 0).unwrap();
        d.fail_fsync(true);
        assert!(f.sync_data().is_err());
        d.fail_fsync(false);
        f.sync_data().unwrap();
        d.power_loss(Tear::LoseAll);
        assert_eq!(d.read(&p).unwrap(), vec![0u8; 4]);
    }

    #[test]
    fn a_torn_tail_is_a_prefix_of_what_was_written() {
        for seed in 1..20 {
            let (d, dir) = disk_with_dir();
            let p = dir.join("f");
            let f = d.open(&p, OpenMode::CreateTruncate).unwrap();
            d.sync_dir(&dir).unwrap();
            f.write_all_at(b"0123", 0).unwrap();
            f.sync_data().unwrap();
            f.write_all_at(b"456789", 4).unwrap();
            d.power_loss(Tear::RandomPrefix(seed));
            let got = d.read(&p).unwrap();
            assert!(got.len() >= 4 && b"0123456789".starts_with(&got), "{got:?}");
        }
    }

    #[test]
    fn a_truncation_is_undone_by_a_power_loss_before_the_sync() {
        let (d, dir) = disk_with_dir();
        let p = dir.join("f");
        let f = d.open(&p, OpenMode::CreateTruncate).unwrap();
        d.sync_dir(&dir).unwrap();
        f.write_all_at(b"abcdef", 0).unwrap();
        f.sync_data().unwrap();
        f.set_len(2).unwrap();
        d.power_loss(Tear::LoseAll);
        assert_eq!(d.read(&p).unwrap(), b"abcdef");
    }
}
