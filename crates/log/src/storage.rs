//! The log's file operations behind a small trait: real files in production, a simulated disk
//! in tests (see [`crate::sim::SimDisk`]) that can lose unsynced bytes and inject I/O errors.
//!
//! The contract every implementation keeps, and the log relies on:
//! - bytes written are readable through any handle of the file as soon as `write_at` returns;
//! - bytes and lengths survive a power loss only once `sync_data` of the file returned `Ok`;
//! - a file's existence, creation, rename or removal survives a power loss only once
//!   `sync_dir` of its directory returned `Ok`;
//! - after a failed `sync_data` nothing written since the last good one may be trusted.

use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Deref;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

/// How to open a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// The file must exist.
    Existing,
    /// Create it empty, replacing any existing content.
    CreateTruncate,
}

/// The whole content of a file, readable in place (a memory map for real files).
pub struct Mapped(Box<dyn Deref<Target = [u8]> + Send + Sync>);

impl Mapped {
    /// Wraps any byte container.
    pub fn new(bytes: impl Deref<Target = [u8]> + Send + Sync + 'static) -> Self {
        Self(Box::new(bytes))
    }
}

impl Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// An open file.
pub trait StorageFile: Send + Sync + 'static {
    /// Fills `buf` from `pos`; an error when the file ends first.
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()>;
    /// Writes all of `buf` at `pos`.
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()>;
    /// Writes `head` then `body` at `pos`, contiguously; one system call for real files.
    fn write_two_at(&self, head: &[u8], body: &[u8], pos: u64) -> io::Result<()> {
        self.write_all_at(head, pos)?;
        self.write_all_at(body, pos + head.len() as u64)
    }
    /// Cuts or extends the file to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Forces the file's bytes and length to stable storage.
    fn sync_data(&self) -> io::Result<()>;
    /// Current length.
    fn len(&self) -> io::Result<u64>;
    /// True when the file holds no bytes.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Last modification time in ms since the epoch, when known.
    fn modified_ms(&self) -> Option<i64>;
    /// The whole file, readable in place; `None` when it is empty. The caller promises the
    /// file is no longer written.
    fn map(&self) -> io::Result<Option<Mapped>>;
}

/// A file system.
pub trait Storage: Send + Sync + 'static {
    /// Opens a file for reading and writing.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>>;
    /// Reads a whole file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Renames a file, replacing `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Removes a directory and everything under it.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Creates a directory and its parents.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Makes the directory's entries (creations, renames, removals) durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Names of the entries of a directory.
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>>;
}

/// Removes a file if it exists; `Ok(true)` when it did.
pub fn remove_if_exists(storage: &dyn Storage, path: &Path) -> io::Result<bool> {
    match storage.remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Writes `bytes` to `path` so that a reader sees the old or the new content and the new
/// content survives a power loss once this returns: a temporary file, fsync, rename, fsync of
/// the directory.
pub fn write_atomically(storage: &dyn Storage, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let f = storage.open(&tmp, OpenMode::CreateTruncate)?;
    if let Err(e) = f.write_all_at(bytes, 0).and_then(|()| f.sync_data()) {
        // The old content is untouched; a partial temporary file would only hold space (a
        // full disk is the usual cause).
        drop(f);
        let _ = remove_if_exists(storage, &tmp);
        return Err(e);
    }
    drop(f);
    storage.rename(&tmp, path)?;
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => storage.sync_dir(dir),
        _ => Ok(()),
    }
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct FsStorage;

impl FsStorage {
    /// A shared handle to the real file system.
    pub fn shared() -> Arc<dyn Storage> {
        Arc::new(FsStorage)
    }
}

struct FsFile(File);

/// `pwritev` of two buffers, continued after a short write: a produced batch's rewritten
/// header and its records go to the file in one system call instead of two.
fn write_two_at(f: &File, head: &[u8], body: &[u8], pos: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let total = head.len() + body.len();
    let mut done = 0usize;
    while done < total {
        let (h, b) = if done < head.len() {
            (&head[done..], body)
        } else {
            (&head[..0], &body[done - head.len()..])
        };
        let iov = [
            libc::iovec {
                iov_base: h.as_ptr() as *mut libc::c_void,
                iov_len: h.len(),
            },
            libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            },
        ];
        let at = libc::off_t::try_from(pos + done as u64)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file offset too large"))?;
        // SAFETY: both iovecs point into live slices of the stated lengths, and the
        // descriptor is open for as long as `f` is borrowed.
        let n = unsafe { libc::pwritev(f.as_raw_fd(), iov.as_ptr(), 2, at) };
        match n {
            n if n > 0 => done += n as usize,
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "pwritev wrote nothing",
                ))
            }
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

impl StorageFile for FsFile {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, pos)
    }

    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.0.write_all_at(buf, pos)
    }

    fn write_two_at(&self, head: &[u8], body: &[u8], pos: u64) -> io::Result<()> {
        write_two_at(&self.0, head, body, pos)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn modified_ms(&self) -> Option<i64> {
        let t = self.0.metadata().ok()?.modified().ok()?;
        let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
        Some(d.as_millis() as i64)
    }

    fn map(&self) -> io::Result<Option<Mapped>> {
        if self.0.metadata()?.len() == 0 {
            return Ok(None);
        }
        // SAFETY: callers map only files that are complete and never written again (sealed
        // indexes); such files are only unlinked, which keeps an existing mapping valid.
        let m = unsafe { Mmap::map(&self.0) }?;
        Ok(Some(Mapped::new(m)))
    }
}

impl Storage for FsStorage {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        let mut o = OpenOptions::new();
        o.read(true).write(true);
        if mode == OpenMode::CreateTruncate {
            o.create(true).truncate(true);
        }
        Ok(Arc::new(FsFile(o.open(path)?)))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir_all(path)
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path)? {
            if let Some(name) = entry?.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_two_at_puts_head_then_body_at_the_position() {
        let dir = tempfile::tempdir().unwrap();
        let f = FsStorage
            .open(&dir.path().join("f"), OpenMode::CreateTruncate)
            .unwrap();
        f.write_all_at(b"0123456789", 0).unwrap();
        f.write_two_at(b"ab", b"cdef", 3).unwrap();
        f.write_two_at(b"", b"XY", 10).unwrap();
        let mut all = vec![0u8; 12];
        f.read_exact_at(&mut all, 0).unwrap();
        assert_eq!(&all, b"012abcdef9XY");
        assert_eq!(f.len().unwrap(), 12);
    }
}
