//! The openraft glue: the type configuration of the metadata quorum and its on-disk storage
//! (a Raft log and a state machine that applies [`MetadataCommand`]s to a
//! [`MetadataImage`](crate::metadata::MetadataImage)).

mod files;
mod log_store;
mod state_machine;

use std::io::Cursor;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use log_store::{LogReader, LogStore};
pub use state_machine::{MetadataSnapshotBuilder, MetadataStateMachine};

use crate::metadata::{CommandResult, MetadataCommand};

/// Raft node id: the broker id widened to openraft's `u64`.
pub type NodeId = u64;

/// What the quorum knows about a voter: where to reach it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerNode {
    /// Inter-node address (`host:port`) the peer's [`crate::network::serve`] listens on.
    pub addr: String,
}

openraft::declare_raft_types!(
    /// The openraft type configuration of spate's metadata quorum.
    pub TypeConfig:
        D = MetadataCommand,
        R = CommandResult,
        NodeId = NodeId,
        Node = PeerNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
        Responder = openraft::impls::OneshotResponder<TypeConfig>,
);

/// The Raft handle of the metadata quorum.
pub type MetadataRaft = openraft::Raft<TypeConfig>;

/// Storage errors as openraft wants them.
pub type StorageError = openraft::StorageError<NodeId>;

/// Writes `dir/name` atomically and durably (content fsync'd, then renamed, then the
/// directory fsync'd).
pub fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    files::write_atomic(dir, name, bytes, true)
}

/// Opens (creating if needed) the log and state machine kept under `dir`.
///
/// The log recovers from a crash by dropping a torn tail (the first record whose length or
/// CRC does not check out, and everything after it); the state machine starts from the last
/// snapshot and openraft re-applies the committed log after it.
pub async fn open_storage(dir: &Path) -> Result<(LogStore, MetadataStateMachine), StorageError> {
    let log = LogStore::open(dir.join("log")).await?;
    let sm = MetadataStateMachine::open(dir.join("state-machine")).await?;
    Ok((log, sm))
}

#[cfg(test)]
mod tests {
    use openraft::testing::{StoreBuilder, Suite};
    use openraft::StorageIOError;
    use tempfile::TempDir;

    use super::*;

    /// Builds a fresh on-disk store in a temp dir (removed when the guard drops).
    struct DiskStoreBuilder;

    impl StoreBuilder<TypeConfig, LogStore, MetadataStateMachine, TempDir> for DiskStoreBuilder {
        async fn build(&self) -> Result<(TempDir, LogStore, MetadataStateMachine), StorageError> {
            let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(&e))?;
            let (log, sm) = open_storage(dir.path()).await?;
            Ok((dir, log, sm))
        }
    }

    /// openraft's own storage test suite, against our on-disk log and state machine. It
    /// builds its own tokio runtimes, hence a plain `#[test]`.
    #[test]
    fn storage_passes_openraft_storage_suite() {
        // Show the suite's own progress lines with `--nocapture` (RUST_LOG overrides).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "openraft::testing=info".into()),
            )
            .with_ansi(false)
            .with_test_writer()
            .try_init();
        Suite::test_all(DiskStoreBuilder).unwrap();
    }
}
