//! The log start checkpoint: the first offset a log still serves when it is above the first
//! segment's base offset (DeleteRecords moved it into a segment that cannot be deleted yet).
//!
//! The file (`log-start-offset`) is written before the new start is served, so a restart
//! never brings back records a DeleteRecords answered as deleted. Retention moves the start
//! by deleting whole segments and needs no checkpoint: the first segment's base says it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{IoContext, LogError};
use crate::storage::{self, Storage};

/// File name of the checkpoint inside a partition's directory.
pub const START_FILE: &str = "log-start-offset";

const VERSION: &str = "0";

/// The persisted log start.
pub(crate) struct StartCheckpoint {
    path: PathBuf,
    storage: Arc<dyn Storage>,
}

impl StartCheckpoint {
    /// The checkpoint of the log in `dir`.
    pub(crate) fn new(storage: &Arc<dyn Storage>, dir: &Path) -> Self {
        Self {
            path: dir.join(START_FILE),
            storage: storage.clone(),
        }
    }

    /// The stored start, `None` when there is no file or it does not parse (a torn write
    /// cannot happen, the file is replaced atomically; a damaged one falls back to the
    /// segments, which never serves less than the checkpoint allowed before it).
    pub(crate) fn load(&self) -> Result<Option<i64>, LogError> {
        let bytes = match self.storage.read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).ctx("read log start checkpoint", &self.path),
        };
        Ok(parse(&bytes))
    }

    /// Stores `start`; on disk when this returns.
    pub(crate) fn store(&self, start: i64) -> Result<(), LogError> {
        let text = format!("{VERSION}\n{start}\n");
        storage::write_atomically(&*self.storage, &self.path, text.as_bytes())
            .ctx("write log start checkpoint", &self.path)
    }
}

fn parse(bytes: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut lines = text.lines();
    if lines.next()? != VERSION {
        return None;
    }
    let start = lines.next()?.trim().parse::<i64>().ok()?;
    (start >= 0 && lines.next().is_none()).then_some(start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimDisk;

    #[test]
    fn a_stored_start_survives_power_loss() {
        let disk = SimDisk::new();
        let storage = disk.storage();
        let dir = Path::new("/p");
        storage.create_dir_all(dir).unwrap();
        let cp = StartCheckpoint::new(&storage, dir);
        assert_eq!(cp.load().unwrap(), None);
        cp.store(42).unwrap();
        disk.power_loss(crate::sim::Tear::LoseAll);
        assert_eq!(
            StartCheckpoint::new(&storage, dir).load().unwrap(),
            Some(42)
        );
    }

    #[test]
    fn a_damaged_checkpoint_is_not_trusted() {
        assert_eq!(parse(b"0\n17\n"), Some(17));
        assert_eq!(parse(b"1\n17\n"), None);
        assert_eq!(parse(b"0\n-3\n"), None);
        assert_eq!(parse(b"0\nx\n"), None);
        assert_eq!(parse(b"0\n1\n2\n"), None);
        assert_eq!(parse(&[0xff, 0xfe]), None);
    }
}
