//! The Raft state machine: applies committed [`MetadataCommand`]s to the [`MetadataImage`]
//! and publishes every new image on a watch channel.
//!
//! The image lives in memory; durability comes from the log plus snapshots. A snapshot is the
//! JSON image with openraft's snapshot meta (last applied log id, membership), written to one
//! file atomically and fsync'd before it is reported built or installed. On start the state
//! machine loads that file and openraft re-applies the committed entries after it.
//!
//! Snapshot file layout: `b"SPATESN1" | u32 LE meta length | u32 LE CRC-32C of meta+data |
//! meta (JSON) | data (JSON image)`.

use std::io::{self, Cursor};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageIOError,
    StoredMembership,
};
use parking_lot::Mutex;
use tokio::sync::watch;

use super::files::{corrupt, read_optional, write_atomic};
use super::{NodeId, PeerNode, StorageError, TypeConfig};
use crate::metadata::{CommandOutcome, CommandResult, MetadataImage};

const SNAPSHOT_FILE: &str = "snapshot";
const SNAPSHOT_MAGIC: &[u8; 8] = b"SPATESN1";

type Meta = SnapshotMeta<NodeId, PeerNode>;

/// A snapshot as kept in memory and on disk.
#[derive(Clone)]
struct StoredSnapshot {
    meta: Meta,
    data: Vec<u8>,
}

/// What the state machine shares with its snapshot builders.
struct Shared {
    dir: PathBuf,
    current: Mutex<Option<StoredSnapshot>>,
    /// Serializes snapshot file writes so an older snapshot never replaces a newer one.
    write_lock: Mutex<()>,
    builds: AtomicU64,
}

/// openraft's `RaftStateMachine` over the [`MetadataImage`].
pub struct MetadataStateMachine {
    image: Arc<MetadataImage>,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, PeerNode>,
    image_tx: watch::Sender<Arc<MetadataImage>>,
    shared: Arc<Shared>,
}

/// Builds a snapshot of the state as it was when the builder was taken.
pub struct MetadataSnapshotBuilder {
    image: Arc<MetadataImage>,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, PeerNode>,
    shared: Arc<Shared>,
}

fn encode_snapshot(snap: &StoredSnapshot) -> io::Result<Vec<u8>> {
    let meta = serde_json::to_vec(&snap.meta).map_err(io::Error::other)?;
    let meta_len = u32::try_from(meta.len()).map_err(io::Error::other)?;
    let mut crc = crc32c::crc32c(&meta);
    crc = crc32c::crc32c_append(crc, &snap.data);
    let mut out = Vec::with_capacity(16 + meta.len() + snap.data.len());
    out.extend_from_slice(SNAPSHOT_MAGIC);
    out.extend_from_slice(&meta_len.to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&meta);
    out.extend_from_slice(&snap.data);
    Ok(out)
}

fn decode_snapshot(bytes: &[u8], path: &std::path::Path) -> io::Result<StoredSnapshot> {
    let bad = |what: &str| corrupt(path, format!("snapshot file is damaged: {what}"));
    if bytes.len() < 16 || &bytes[..8] != SNAPSHOT_MAGIC {
        return Err(bad("missing header"));
    }
    let meta_len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
    let crc = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
    let rest = &bytes[16..];
    if rest.len() < meta_len {
        return Err(bad("truncated"));
    }
    if crc32c::crc32c(rest) != crc {
        return Err(bad("CRC mismatch"));
    }
    let (meta, data) = rest.split_at(meta_len);
    let meta: Meta = serde_json::from_slice(meta).map_err(|e| bad(&e.to_string()))?;
    Ok(StoredSnapshot {
        meta,
        data: data.to_vec(),
    })
}

impl Shared {
    /// Persists `snap` and makes it current, unless a newer snapshot is already current.
    fn save(&self, snap: StoredSnapshot) -> io::Result<()> {
        let _writing = self.write_lock.lock();
        let newer_exists = self
            .current
            .lock()
            .as_ref()
            .is_some_and(|cur| cur.meta.last_log_id > snap.meta.last_log_id);
        if newer_exists {
            return Ok(());
        }
        write_atomic(&self.dir, SNAPSHOT_FILE, &encode_snapshot(&snap)?, true)?;
        *self.current.lock() = Some(snap);
        Ok(())
    }
}

fn snapshot_of(snap: &StoredSnapshot) -> Snapshot<TypeConfig> {
    Snapshot {
        meta: snap.meta.clone(),
        snapshot: Box::new(Cursor::new(snap.data.clone())),
    }
}

impl MetadataStateMachine {
    /// Opens the state machine kept in `dir`, starting from its last snapshot if any.
    pub async fn open(dir: PathBuf) -> Result<Self, StorageError> {
        let loaded = tokio::task::spawn_blocking(move || -> io::Result<_> {
            std::fs::create_dir_all(&dir)?;
            let snap = match read_optional(&dir, SNAPSHOT_FILE)? {
                None => None,
                Some(bytes) => Some(decode_snapshot(&bytes, &dir.join(SNAPSHOT_FILE))?),
            };
            let image = match &snap {
                None => MetadataImage::new(),
                Some(s) => serde_json::from_slice(&s.data).map_err(|e| {
                    corrupt(
                        &dir.join(SNAPSHOT_FILE),
                        format!("image does not parse: {e}"),
                    )
                })?,
            };
            Ok((dir, snap, image))
        })
        .await
        .map_err(|e| StorageIOError::read_snapshot(None, &io::Error::other(e.to_string())))?;
        let (dir, snap, image) = loaded.map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        let (last_applied, membership) = match &snap {
            Some(s) => (s.meta.last_log_id, s.meta.last_membership.clone()),
            None => (None, StoredMembership::default()),
        };
        let image = Arc::new(image);
        let (image_tx, _) = watch::channel(image.clone());
        Ok(Self {
            image,
            last_applied,
            membership,
            image_tx,
            shared: Arc::new(Shared {
                dir,
                current: Mutex::new(snap),
                write_lock: Mutex::new(()),
                builds: AtomicU64::new(0),
            }),
        })
    }

    /// A receiver of every applied image (the current one is available at once).
    pub fn subscribe(&self) -> watch::Receiver<Arc<MetadataImage>> {
        self.image_tx.subscribe()
    }

    /// The image as of the last applied entry.
    pub fn image(&self) -> Arc<MetadataImage> {
        self.image.clone()
    }

    fn publish(&self) {
        self.image_tx.send_replace(self.image.clone());
    }
}

impl RaftSnapshotBuilder<TypeConfig> for MetadataSnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let data =
            serde_json::to_vec(&*self.image).map_err(|e| StorageIOError::read_state_machine(&e))?;
        let n = self.shared.builds.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = match &self.last_applied {
            Some(l) => format!(
                "{}-{}-{}-{n}",
                l.leader_id.term, l.leader_id.node_id, l.index
            ),
            None => format!("empty-{n}"),
        };
        let snap = StoredSnapshot {
            meta: SnapshotMeta {
                last_log_id: self.last_applied,
                last_membership: self.membership.clone(),
                snapshot_id,
            },
            data,
        };
        let signature = snap.meta.signature();
        let shared = self.shared.clone();
        let to_save = snap.clone();
        tokio::task::spawn_blocking(move || shared.save(to_save))
            .await
            .map_err(|e| {
                StorageIOError::write_snapshot(
                    Some(signature.clone()),
                    &io::Error::other(e.to_string()),
                )
            })?
            .map_err(|e| StorageIOError::write_snapshot(Some(signature), &e))?;
        Ok(snapshot_of(&snap))
    }
}

impl RaftStateMachine<TypeConfig> for MetadataStateMachine {
    type SnapshotBuilder = MetadataSnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, PeerNode>), StorageError> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResult>, StorageError>
    where
        I: IntoIterator<Item = openraft::Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut replies = Vec::new();
        let mut changed = false;
        for entry in entries {
            self.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => replies.push(Ok(CommandOutcome::Noop)),
                EntryPayload::Normal(cmd) => {
                    // Copy-on-write: clones only while a subscriber still holds the previous
                    // image, i.e. at most once per batch.
                    let result = Arc::make_mut(&mut self.image).apply(&cmd);
                    changed |= result.is_ok();
                    replies.push(result);
                }
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), m);
                    replies.push(Ok(CommandOutcome::Noop));
                }
            }
        }
        if changed {
            self.publish();
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        MetadataSnapshotBuilder {
            image: self.image.clone(),
            last_applied: self.last_applied,
            membership: self.membership.clone(),
            shared: self.shared.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let image: MetadataImage = serde_json::from_slice(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        let snap = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        let shared = self.shared.clone();
        let signature = meta.signature();
        // On disk first: once installed, the log before it may be purged.
        tokio::task::spawn_blocking(move || shared.save(snap))
            .await
            .map_err(|e| {
                StorageIOError::write_snapshot(
                    Some(signature.clone()),
                    &io::Error::other(e.to_string()),
                )
            })?
            .map_err(|e| StorageIOError::write_snapshot(Some(signature), &e))?;
        self.image = Arc::new(image);
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.publish();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(self.shared.current.lock().as_ref().map(snapshot_of))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use openraft::testing::log_id;
    use openraft::{Entry, Membership};
    use uuid::Uuid;

    use super::*;
    use crate::metadata::MetadataCommand;

    fn register(id: i32) -> Entry<TypeConfig> {
        Entry {
            log_id: log_id(1, 1, id as u64 + 1),
            payload: EntryPayload::Normal(MetadataCommand::RegisterBroker {
                broker_id: id,
                incarnation: Uuid::from_u128(id as u128),
                inter_node_addr: "127.0.0.1:1".to_owned(),
                kafka_host: "localhost".to_owned(),
                kafka_port: 9092,
                rack: None,
                http_addr: None,
                now_ms: 0,
            }),
        }
    }

    fn membership(index: u64) -> Entry<TypeConfig> {
        let nodes: BTreeMap<NodeId, PeerNode> = (1..=3)
            .map(|i| {
                (
                    i,
                    PeerNode {
                        addr: format!("127.0.0.1:{i}"),
                    },
                )
            })
            .collect();
        Entry {
            log_id: log_id(1, 1, index),
            payload: EntryPayload::Membership(Membership::new(
                vec![nodes.keys().copied().collect::<BTreeSet<_>>()],
                nodes,
            )),
        }
    }

    #[tokio::test]
    async fn apply_publishes_the_image_and_replies_per_entry() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = MetadataStateMachine::open(dir.path().to_path_buf())
            .await
            .unwrap();
        let mut rx = sm.subscribe();
        let mut dup = register(1);
        dup.log_id = log_id(1, 1, 3);
        if let EntryPayload::Normal(MetadataCommand::RegisterBroker { incarnation, .. }) =
            &mut dup.payload
        {
            *incarnation = Uuid::from_u128(99);
        }
        let replies = sm
            .apply(vec![membership(0), register(0), register(1), dup])
            .await
            .unwrap();
        assert_eq!(replies.len(), 4);
        assert_eq!(replies[0], Ok(CommandOutcome::Noop));
        assert!(matches!(
            replies[3],
            Err(crate::metadata::CommandError::DuplicateBrokerRegistration { .. })
        ));
        assert!(rx.has_changed().unwrap());
        assert_eq!(rx.borrow_and_update().brokers().len(), 2);
        let (applied, mem) = sm.applied_state().await.unwrap();
        assert_eq!(applied, Some(log_id(1, 1, 3)));
        assert_eq!(mem.log_id(), &Some(log_id(1, 1, 0)));
    }

    #[tokio::test]
    async fn snapshot_is_persisted_and_restores_the_state_machine_on_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let image = {
            let mut sm = MetadataStateMachine::open(dir.path().to_path_buf())
                .await
                .unwrap();
            sm.apply(vec![membership(0), register(0), register(1)])
                .await
                .unwrap();
            let snap = sm
                .get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .unwrap();
            assert_eq!(snap.meta.last_log_id, Some(log_id(1, 1, 2)));
            sm.image()
        };
        let mut sm = MetadataStateMachine::open(dir.path().to_path_buf())
            .await
            .unwrap();
        assert_eq!(sm.image(), image);
        let (applied, mem) = sm.applied_state().await.unwrap();
        assert_eq!(applied, Some(log_id(1, 1, 2)));
        assert_eq!(mem.membership().voter_ids().count(), 3);
        let current = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta.last_log_id, Some(log_id(1, 1, 2)));
    }

    #[tokio::test]
    async fn installed_snapshot_replaces_the_image_and_is_persisted() {
        let src_dir = tempfile::tempdir().unwrap();
        let dst_dir = tempfile::tempdir().unwrap();
        let mut src = MetadataStateMachine::open(src_dir.path().to_path_buf())
            .await
            .unwrap();
        src.apply(vec![membership(0), register(0), register(1)])
            .await
            .unwrap();
        let snap = src
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();

        let mut dst = MetadataStateMachine::open(dst_dir.path().to_path_buf())
            .await
            .unwrap();
        let mut rx = dst.subscribe();
        dst.install_snapshot(&snap.meta, snap.snapshot)
            .await
            .unwrap();
        assert_eq!(dst.image(), src.image());
        assert_eq!(rx.borrow_and_update().brokers().len(), 2);
        drop(dst);
        let dst = MetadataStateMachine::open(dst_dir.path().to_path_buf())
            .await
            .unwrap();
        assert_eq!(dst.image(), src.image());
    }

    #[tokio::test]
    async fn damaged_snapshot_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut sm = MetadataStateMachine::open(dir.path().to_path_buf())
                .await
                .unwrap();
            sm.apply(vec![register(0)]).await.unwrap();
            sm.get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .unwrap();
        }
        let path = dir.path().join(SNAPSHOT_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 3] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let err = MetadataStateMachine::open(dir.path().to_path_buf())
            .await
            .err()
            .unwrap();
        assert!(err.to_string().contains("CRC mismatch"), "{err}");
    }

    #[tokio::test]
    async fn snapshot_of_an_empty_state_machine_does_not_panic() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = MetadataStateMachine::open(dir.path().to_path_buf())
            .await
            .unwrap();
        assert!(sm.get_current_snapshot().await.unwrap().is_none());
        let snap = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert_eq!(snap.meta.last_log_id, None);
        assert_eq!(sm.applied_state().await.unwrap().0, None);
    }
}
