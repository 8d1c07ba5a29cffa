//! Small durable-file helpers shared by the log and the state machine.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// Replaces `dir/name` with `bytes` atomically: a reader sees the old or the new content,
/// never a mix. With `durable` the content and the rename are fsync'd before returning.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    f.write_all(bytes)?;
    if durable {
        f.sync_all()?;
    }
    drop(f);
    fs::rename(&tmp, dir.join(name))?;
    if durable {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Makes renames and file creations in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Reads `dir/name`, `None` when it does not exist.
pub(crate) fn read_optional(dir: &Path, name: &str) -> io::Result<Option<Vec<u8>>> {
    match fs::read(dir.join(name)) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// An `InvalidData` error with a message naming the file.
pub(crate) fn corrupt(path: &Path, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {what}", path.display()),
    )
}
