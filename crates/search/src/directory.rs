//! Where a topic index keeps its files: tantivy's memory-mapped directory without its
//! fsyncs. A commit makes documents searchable; making them durable would cost an fsync of
//! every file of every commit (tens of milliseconds each, per partition, several times a
//! second), and the index is derived data: the log is its source. So commits are not synced,
//! a clean shutdown syncs everything and leaves a marker, and an index found after an unclean
//! stop (an OS crash may have torn it) is checked before use and rebuilt from the log when
//! damaged (see [`crate::index::PartitionIndex::open`]).

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tantivy::directory::error::{DeleteError, LockError, OpenReadError, OpenWriteError};
use tantivy::directory::{
    AntiCallToken, DirectoryLock, FileHandle, Lock, MmapDirectory, TerminatingWrite, WatchCallback,
    WatchHandle, WritePtr,
};
use tantivy::Directory;

/// A topic index's directory: reads through tantivy's mmap directory, writes without
/// fsync.
#[derive(Debug, Clone)]
pub struct IndexDirectory {
    inner: MmapDirectory,
    root: PathBuf,
}

impl IndexDirectory {
    /// The directory at `root` (which must exist).
    pub fn open(root: &Path) -> tantivy::Result<Self> {
        Ok(Self {
            inner: MmapDirectory::open(root)?,
            root: root.to_path_buf(),
        })
    }
}

/// A file written without fsync: data reaches the page cache, durability waits for the
/// shutdown sync (or is given up, see the module docs).
struct Unsynced(File);

impl Write for Unsynced {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl TerminatingWrite for Unsynced {
    fn terminate_ref(&mut self, _: AntiCallToken) -> io::Result<()> {
        self.0.flush()
    }
}

impl Directory for IndexDirectory {
    fn get_file_handle(&self, path: &Path) -> Result<Arc<dyn FileHandle>, OpenReadError> {
        self.inner.get_file_handle(path)
    }

    fn delete(&self, path: &Path) -> Result<(), DeleteError> {
        self.inner.delete(path)
    }

    fn exists(&self, path: &Path) -> Result<bool, OpenReadError> {
        self.inner.exists(path)
    }

    fn open_write(&self, path: &Path) -> Result<WritePtr, OpenWriteError> {
        // Files are written once: an existing one is an error, as tantivy expects.
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(self.root.join(path))
            .map_err(|e| {
                if e.kind() == io::ErrorKind::AlreadyExists {
                    OpenWriteError::FileAlreadyExists(path.to_path_buf())
                } else {
                    OpenWriteError::wrap_io_error(e, path.to_path_buf())
                }
            })?;
        Ok(BufWriter::new(Box::new(Unsynced(file))))
    }

    fn atomic_read(&self, path: &Path) -> Result<Vec<u8>, OpenReadError> {
        self.inner.atomic_read(path)
    }

    fn atomic_write(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        // Written aside, then renamed over: a reader sees the old file or the new one whole.
        let target = self.root.join(path);
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let aside = target.with_file_name(format!(".{name}.writing"));
        std::fs::write(&aside, data)?;
        std::fs::rename(&aside, &target)
    }

    fn sync_directory(&self) -> io::Result<()> {
        Ok(())
    }

    fn acquire_lock(&self, lock: &Lock) -> Result<DirectoryLock, LockError> {
        self.inner.acquire_lock(lock)
    }

    fn watch(&self, watch_callback: WatchCallback) -> tantivy::Result<WatchHandle> {
        self.inner.watch(watch_callback)
    }
}

/// Makes everything written under `root` durable: the whole file system's dirty data (one
/// `syncfs`), which at shutdown is cheaper than an fsync per file of every index.
pub fn sync_all(root: &Path) -> io::Result<()> {
    let dir = File::open(root)?;
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a plain syscall on a descriptor `dir` keeps open.
        if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    #[cfg(not(target_os = "linux"))]
    dir.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_files_are_read_back_and_written_only_once() {
        let dir = tempfile::tempdir().unwrap();
        let d = IndexDirectory::open(dir.path()).unwrap();
        let mut w = d.open_write(Path::new("a")).unwrap();
        w.write_all(b"hello").unwrap();
        w.terminate().unwrap();
        assert_eq!(d.atomic_read(Path::new("a")).unwrap(), b"hello");
        assert!(matches!(
            d.open_write(Path::new("a")),
            Err(OpenWriteError::FileAlreadyExists(_))
        ));
        d.atomic_write(Path::new("meta.json"), b"{}").unwrap();
        d.atomic_write(Path::new("meta.json"), b"{\"v\":2}")
            .unwrap();
        assert_eq!(d.atomic_read(Path::new("meta.json")).unwrap(), b"{\"v\":2}");
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.ends_with(".writing")), "{names:?}");
        sync_all(dir.path()).unwrap();
    }
}
