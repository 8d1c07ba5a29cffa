//! Producer id allocation that never hands out the same id twice, across restarts.
//!
//! Ids are reserved in blocks: the end of the current block is written (and fsynced) before
//! any id from it is used, so after a crash allocation resumes past every id ever issued.

use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::error::{io, BrokerError};

const BLOCK: i64 = 1000;

struct State {
    next: i64,
    block_end: i64,
}

/// Hands out producer ids.
pub struct ProducerIds {
    path: PathBuf,
    state: Mutex<State>,
}

impl ProducerIds {
    /// Loads the reservation file in `dir` (starting at 0 when there is none).
    pub fn open(dir: &Path) -> Result<Self, BrokerError> {
        let path = dir.join("producer_ids");
        let reserved = match std::fs::read_to_string(&path) {
            Ok(s) => s
                .trim()
                .parse::<i64>()
                .map_err(|e| BrokerError::CorruptMetadata {
                    path: path.clone(),
                    reason: e.to_string(),
                })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(io("read", &path)(e)),
        };
        Ok(Self {
            path,
            state: Mutex::new(State {
                next: reserved,
                block_end: reserved,
            }),
        })
    }

    /// The next unused producer id.
    pub fn allocate(&self) -> Result<i64, BrokerError> {
        let mut s = self.state.lock();
        if s.next >= s.block_end {
            let end = s.next + BLOCK;
            crate::registry::write_atomically(&self.path, end.to_string().as_bytes())?;
            s.block_end = end;
        }
        let id = s.next;
        s.next += 1;
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let ids = ProducerIds::open(dir.path()).unwrap();
        let a = ids.allocate().unwrap();
        let b = ids.allocate().unwrap();
        assert_eq!((a, b), (0, 1));
        drop(ids);
        let ids = ProducerIds::open(dir.path()).unwrap();
        assert!(ids.allocate().unwrap() > b);
    }
}
