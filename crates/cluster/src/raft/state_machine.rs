//! The Raft state machine: applies committed [`MetadataCommand`]s to the [`MetadataImage`]
//! and publishes every new image on a watch channel.
//!
//! The image lives in memory; durability comes from the log plus snapshots. A snapshot is the
//! encoded image with openraft's snapshot meta (last applied log id, membership), written to
//! one file atomically and fsync'd before it is reported built or installed. On start the
//! state machine loads that file and openraft re-applies the committed entries after it.
//!
//! Snapshot file layout: `b"SPATESN1" | u32 LE meta length | u32 LE CRC-32C of meta+data |
//! meta (JSON) | data`.
//!
//! The data, which is also what a leader ships to a lagging node, is the image in a versioned
//! binary format: `0x89 | format version | body`. Version 1's body is the image in
//! MessagePack with structs as arrays (rmp-serde's default). Data starting with `{` is a JSON
//! image, as spate wrote before the binary format, and still loads; any other version or first
//! byte is refused with an error that names it (`decode_image`).
//!
//! Why MessagePack (rmp-serde): a 3,000-partition image (3 brokers, RF 3) is 46 KB instead
//! of 256 KB of JSON, and encodes and decodes in about half the time. It stays
//! self-describing (every value carries its type, every array its length): damaged data
//! mostly fails to decode rather than shifting every value after it (the file's CRC covers
//! the rest), and a struct that gained trailing `#[serde(default)]` fields still reads the
//! shorter arrays of older snapshots. postcard (used elsewhere in spate) is as small and a
//! little faster but not self-describing: it could not read the image back at all
//! (`#[serde(skip_serializing_if)]`, then on `PartitionState`, shifted every value after it:
//! `DeserializeBadOption`), and every field added to the image would need a new format
//! version to read older snapshots; bincode has the same limits. Struct fields are not named
//! in the body (named, the image is 242 KB), hence the serde rules on [`MetadataImage`]: no
//! `skip_serializing_if`, `flatten` or `untagged`; new fields go last with
//! `#[serde(default)]`.

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
use serde::Deserialize;
use tokio::sync::watch;

use super::files::{corrupt, read_optional, write_atomic};
use super::{NodeId, PeerNode, StorageError, TypeConfig};
use crate::metadata::{CommandOutcome, CommandResult, MetadataImage};

const SNAPSHOT_FILE: &str = "snapshot";
const SNAPSHOT_MAGIC: &[u8; 8] = b"SPATESN1";

/// First byte of a binary image. It never starts a JSON text (nor any UTF-8 text: it is a
/// continuation byte), which tells it from the JSON images older spates wrote.
const IMAGE_MAGIC: u8 = 0x89;
/// The binary image format this spate writes; it reads this one and JSON.
/// 1: MessagePack, structs as arrays of their fields in declaration order.
const IMAGE_FORMAT_VERSION: u8 = 1;

type Meta = SnapshotMeta<NodeId, PeerNode>;

/// Why snapshot data does not load as an image (or an image does not encode).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ImageCodecError {
    /// No byte at all.
    #[error("the snapshot data is empty")]
    Empty,
    /// The magic byte and nothing after it.
    #[error("the snapshot data ends after its first byte (no format version)")]
    NoVersion,
    /// A binary format this spate does not know (written by a newer one, or damaged).
    #[error(
        "snapshot format version {0} is unknown to this spate, which reads version {reads} and \
         JSON: written by a newer spate?",
        reads = IMAGE_FORMAT_VERSION
    )]
    UnknownVersion(u8),
    /// Neither the binary magic byte nor a JSON object.
    #[error("not a metadata image: first byte {0:#04x} (expected {magic:#04x} or '{{')", magic = IMAGE_MAGIC)]
    UnknownFormat(u8),
    /// A JSON image (from an older spate) that does not parse.
    #[error("JSON image does not parse: {0}")]
    Json(#[from] serde_json::Error),
    /// A binary image that does not decode (truncated or damaged).
    #[error("binary image does not decode: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
    /// Bytes left over after a complete binary image.
    #[error("{0} unexpected byte(s) after the binary image")]
    Trailing(usize),
    /// The image does not encode (not expected: every value it holds has an encoding).
    #[error("image does not encode: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
}

/// Encodes `image` as snapshot data in the current binary format.
pub(crate) fn encode_image(image: &MetadataImage) -> Result<Vec<u8>, ImageCodecError> {
    let mut out = vec![IMAGE_MAGIC, IMAGE_FORMAT_VERSION];
    rmp_serde::encode::write(&mut out, image)?;
    Ok(out)
}

/// Decodes snapshot data: the binary format or, from an older spate, a JSON image. Never
/// panics on damaged data.
pub(crate) fn decode_image(data: &[u8]) -> Result<MetadataImage, ImageCodecError> {
    match *data {
        [] => Err(ImageCodecError::Empty),
        [b'{', ..] => Ok(serde_json::from_slice(data)?),
        [IMAGE_MAGIC] => Err(ImageCodecError::NoVersion),
        [IMAGE_MAGIC, IMAGE_FORMAT_VERSION, ref body @ ..] => {
            let mut rest = body;
            let image = MetadataImage::deserialize(&mut rmp_serde::Deserializer::new(&mut rest))?;
            if !rest.is_empty() {
                return Err(ImageCodecError::Trailing(rest.len()));
            }
            Ok(image)
        }
        [IMAGE_MAGIC, version, ..] => Err(ImageCodecError::UnknownVersion(version)),
        [first, ..] => Err(ImageCodecError::UnknownFormat(first)),
    }
}

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
                Some(s) => decode_image(&s.data).map_err(|e| {
                    corrupt(
                        &dir.join(SNAPSHOT_FILE),
                        format!("image does not load: {e}"),
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
        let data = encode_image(&self.image).map_err(|e| StorageIOError::read_state_machine(&e))?;
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
        let image = decode_image(&data)
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

    use spate_quotas::{EntityName, QuotaEntity, QuotaKey, QuotaValue};

    use super::*;
    use crate::metadata::{BrokerId, MetadataCommand};

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
                listeners: vec![],
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

    fn apply_ok(image: &mut MetadataImage, cmd: MetadataCommand) {
        if let Err(e) = image.apply(&cmd) {
            panic!("{cmd:?} was refused: {e}");
        }
    }

    fn register_broker(id: BrokerId, rack: Option<&str>) -> MetadataCommand {
        MetadataCommand::RegisterBroker {
            broker_id: id,
            incarnation: Uuid::from_u128(0x5eed_0000 + id as u128),
            inter_node_addr: format!("10.0.0.{id}:9093"),
            kafka_host: format!("broker-{id}.spate.svc.cluster.local"),
            kafka_port: 9092,
            rack: rack.map(str::to_owned),
            http_addr: (id <= 3).then(|| format!("10.0.0.{id}:8080")),
            now_ms: 1_700_000_000_000,
            listeners: vec![],
        }
    }

    /// Brokers `1..=brokers`, then `topics` topics of `partitions` partitions with RF 3 placed
    /// round robin, each with a few config overrides.
    fn cluster_image(brokers: BrokerId, topics: usize, partitions: usize) -> MetadataImage {
        let mut image = MetadataImage::new();
        for id in 1..=brokers {
            let rack = ["eu-west-1a", "eu-west-1b", "zone-é"][id as usize % 3];
            apply_ok(&mut image, register_broker(id, Some(rack)));
        }
        for t in 0..topics {
            let configs: BTreeMap<String, String> = [
                ("retention.ms", "604800000"),
                ("cleanup.policy", if t == 0 { "compact" } else { "delete" }),
                ("min.insync.replicas", "2"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
            let assignment = (0..partitions)
                .map(|p| {
                    (0..3)
                        .map(|r| ((p + r) % brokers as usize) as BrokerId + 1)
                        .collect()
                })
                .collect();
            apply_ok(
                &mut image,
                MetadataCommand::CreateTopic {
                    name: format!("topic-{t:02}"),
                    topic_id: Uuid::from_u128(0x70_0000 + t as u128),
                    configs,
                    assignment,
                },
            );
        }
        image
    }

    /// Every kind of state the image holds: fenced, shutting-down, decommissioning and retired
    /// brokers, reassignments that only add, only remove and do both, offline partitions,
    /// broker configs, client quotas, a cluster id and handed-out producer ids.
    fn realistic_image(partitions: usize) -> MetadataImage {
        assert!(partitions >= 4);
        let mut image = cluster_image(5, 3, partitions);
        let strings = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let cmds = vec![
            // topic-00-0 on [1, 2, 3]: 3 leaves the ISR, then a move to [1, 3] waits on it:
            // removing [2], adding nothing.
            MetadataCommand::AlterIsr {
                topic: "topic-00".into(),
                partition: 0,
                leader: 1,
                leader_epoch: 0,
                partition_epoch: 0,
                isr: vec![1, 2],
            },
            MetadataCommand::AlterReassignment {
                topic: "topic-00".into(),
                partition: 0,
                target: Some(vec![1, 3]),
            },
            // topic-00-1 on [2, 3, 4] grows to RF 4: adding [5], removing nothing.
            MetadataCommand::AlterReassignment {
                topic: "topic-00".into(),
                partition: 1,
                target: Some(vec![2, 3, 4, 5]),
            },
            // topic-00-2 on [3, 4, 5] moves to [1, 2, 5]: adding and removing.
            MetadataCommand::AlterReassignment {
                topic: "topic-00".into(),
                partition: 2,
                target: Some(vec![1, 2, 5]),
            },
            // topic-01-0 goes offline; topic-01-1 gets a new leader.
            MetadataCommand::ChangeLeader {
                topic: "topic-01".into(),
                partition: 0,
                partition_epoch: 0,
                leader: None,
                isr: vec![2],
            },
            MetadataCommand::ChangeLeader {
                topic: "topic-01".into(),
                partition: 1,
                partition_epoch: 0,
                leader: Some(3),
                isr: vec![3, 4],
            },
            MetadataCommand::CreatePartitions {
                name: "topic-01".into(),
                assignment: vec![vec![4, 5, 1], vec![5, 1, 2]],
            },
            MetadataCommand::AlterTopicConfigs {
                name: "topic-02".into(),
                set: strings(&[("retention.bytes", "-1"), ("segment.ms", "3600000")]),
                remove: vec!["min.insync.replicas".into()],
            },
            MetadataCommand::BrokerHeartbeat {
                broker_id: 2,
                broker_epoch: 2,
                now_ms: 1_700_000_004_000,
                shutting_down: false,
            },
            MetadataCommand::BrokerHeartbeat {
                broker_id: 3,
                broker_epoch: 3,
                now_ms: 1_700_000_005_000,
                shutting_down: true,
            },
            MetadataCommand::FenceBroker {
                broker_id: 4,
                broker_epoch: 4,
            },
            MetadataCommand::SetDecommissioning {
                broker_id: 5,
                decommissioning: true,
            },
            register_broker(6, None),
            MetadataCommand::UnregisterBroker { broker_id: 6 },
            MetadataCommand::AlterBrokerConfigs {
                resource: String::new(),
                set: strings(&[("log.retention.hours", "72")]),
                remove: vec![],
            },
            MetadataCommand::AlterBrokerConfigs {
                resource: "1".into(),
                set: strings(&[("log.cleaner.threads", "2"), ("num.io.threads", "16")]),
                remove: vec![],
            },
            MetadataCommand::SetClusterId {
                cluster_id: "MkU3OEVBNTcwNTJENDM2Qk".into(),
            },
            MetadataCommand::AllocateProducerIds {
                broker_id: 1,
                broker_epoch: 1,
            },
            MetadataCommand::AllocateProducerIds {
                broker_id: 2,
                broker_epoch: 2,
            },
            MetadataCommand::AlterClientQuotas {
                entity: QuotaEntity {
                    user: Some(EntityName::Named("alice".into())),
                    client_id: None,
                    ip: None,
                },
                set: vec![(QuotaKey::ProducerByteRate, QuotaValue(1_048_576.0))],
                remove: vec![],
            },
            MetadataCommand::AlterClientQuotas {
                entity: QuotaEntity {
                    user: Some(EntityName::Default),
                    client_id: Some(EntityName::Named("billing-app".into())),
                    ip: None,
                },
                set: vec![
                    (QuotaKey::RequestPercentage, QuotaValue(12.5)),
                    (QuotaKey::ConsumerByteRate, QuotaValue(2_097_152.0)),
                ],
                remove: vec![],
            },
            MetadataCommand::AlterClientQuotas {
                entity: QuotaEntity {
                    user: None,
                    client_id: None,
                    ip: Some(EntityName::Default),
                },
                set: vec![(QuotaKey::ConnectionCreationRate, QuotaValue(30.0))],
                remove: vec![],
            },
            MetadataCommand::BootstrapScramUsers {
                records: vec![spate_auth::CredentialRecord::new(
                    "admin",
                    spate_auth::ScramAlgorithm::Sha512,
                    &spate_auth::ScramCredential::derive(
                        spate_auth::ScramAlgorithm::Sha512,
                        b"secret",
                        b"salt",
                        4096,
                    ),
                )],
            },
            MetadataCommand::CreateAcls {
                bindings: vec![spate_auth::acl::AclBinding {
                    resource_type: spate_auth::acl::ResourceType::Topic,
                    name: "orders-".into(),
                    pattern: spate_auth::acl::PatternType::Prefixed,
                    principal: "User:alice".into(),
                    host: "*".into(),
                    operation: spate_auth::acl::Operation::Read,
                    permission: spate_auth::acl::Permission::Allow,
                }],
            },
        ];
        for cmd in cmds {
            apply_ok(&mut image, cmd);
        }
        image
    }

    #[test]
    fn binary_image_round_trips_a_realistic_image() {
        let image = realistic_image(64);
        // The image holds what the test says it does.
        let p = |t: &str, i| image.partition(t, i).unwrap();
        assert!(p("topic-00", 0).adding.is_empty() && p("topic-00", 0).removing == [2]);
        assert!(p("topic-00", 1).adding == [5] && p("topic-00", 1).removing.is_empty());
        assert!(!p("topic-00", 2).adding.is_empty() && !p("topic-00", 2).removing.is_empty());
        assert_eq!(p("topic-01", 0).leader, None);
        assert!(image.broker(4).unwrap().fenced);
        assert!(image.broker(3).unwrap().shutting_down);
        assert!(image.broker(5).unwrap().decommissioning);
        assert!(image.retired.contains(&6));
        assert_eq!(image.client_quotas().entries().count(), 3);
        assert_eq!(image.scram_credentials().len(), 1);
        assert_eq!(image.acls().len(), 1);
        assert_eq!(image.next_producer_id(), 2000);
        assert!(image.cluster_id().is_some());

        let data = encode_image(&image).unwrap();
        assert_eq!(data[..2], [IMAGE_MAGIC, IMAGE_FORMAT_VERSION]);
        let back = decode_image(&data).unwrap();
        assert_eq!(back, image);
        // Byte-identical when encoded again: nothing was lost or reordered.
        assert_eq!(encode_image(&back).unwrap(), data);
        let json = serde_json::to_vec(&image).unwrap();
        assert!(
            data.len() * 3 < json.len(),
            "binary {} bytes, JSON {} bytes",
            data.len(),
            json.len()
        );
    }

    #[test]
    fn json_images_from_older_spates_still_load() {
        // Written by a spate from before broker configs, retirement, cluster ids, quotas,
        // decommissioning and HTTP addresses existed, with no reassignment fields.
        let old = br#"{"brokers":{"1":{"id":1,"incarnation":"00000000-0000-0000-0000-000000000007","epoch":1,"inter_node_addr":"10.0.0.1:9093","kafka_host":"b1","kafka_port":9092,"rack":null,"fenced":false,"shutting_down":false,"last_heartbeat_ms":5,"heartbeat_count":2}},"topics":{"t":{"name":"t","id":"00000000-0000-0000-0000-000000000064","configs":{"retention.ms":"1000"},"partitions":[{"replicas":[1],"leader":1,"leader_epoch":0,"partition_epoch":3,"isr":[1]}]}},"next_producer_id":1000,"next_broker_epoch":2}"#;
        let image = decode_image(old).unwrap();
        assert_eq!(image.broker(1).unwrap().kafka_host, "b1");
        assert_eq!(image.broker(1).unwrap().http_addr, None);
        assert_eq!(image.partition("t", 0).unwrap().partition_epoch, 3);
        assert!(!image.partition("t", 0).unwrap().is_reassigning());
        assert_eq!(image.next_producer_id(), 1000);
        assert_eq!(image.cluster_id(), None);

        // The JSON a spate wrote just before the binary format: empty reassignment fields
        // left out, everything else present.
        let image = realistic_image(8);
        let json = String::from_utf8(serde_json::to_vec(&image).unwrap())
            .unwrap()
            .replace(r#","adding":[]"#, "")
            .replace(r#","removing":[]"#, "");
        assert_eq!(decode_image(json.as_bytes()).unwrap(), image);
    }

    #[test]
    fn a_field_added_last_with_a_default_still_reads_older_binary_images() {
        // The rule on `MetadataImage`'s fields, checked on the codec itself.
        #[derive(serde::Serialize)]
        struct Before {
            a: u32,
            b: Vec<String>,
        }
        #[derive(Debug, PartialEq, Deserialize)]
        struct After {
            a: u32,
            b: Vec<String>,
            #[serde(default)]
            c: Option<u64>,
        }
        let old = rmp_serde::to_vec(&Before {
            a: 7,
            b: vec!["x".into()],
        })
        .unwrap();
        let new: After = rmp_serde::from_slice(&old).unwrap();
        assert_eq!(
            new,
            After {
                a: 7,
                b: vec!["x".into()],
                c: None
            }
        );
    }

    fn write_snapshot_file(dir: &std::path::Path, data: Vec<u8>) {
        let snap = StoredSnapshot {
            meta: SnapshotMeta {
                last_log_id: Some(log_id(1, 1, 40)),
                last_membership: StoredMembership::default(),
                snapshot_id: "1-1-40-0".into(),
            },
            data,
        };
        std::fs::write(dir.join(SNAPSHOT_FILE), encode_snapshot(&snap).unwrap()).unwrap();
    }

    #[tokio::test]
    async fn a_json_snapshot_file_loads_and_the_next_snapshot_is_binary() {
        let dir = tempfile::tempdir().unwrap();
        let image = realistic_image(8);
        write_snapshot_file(dir.path(), serde_json::to_vec(&image).unwrap());
        let mut sm = MetadataStateMachine::open(dir.path().to_path_buf())
            .await
            .unwrap();
        assert_eq!(*sm.image(), image);
        assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(1, 1, 40)));

        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        drop(sm);
        let bytes = std::fs::read(dir.path().join(SNAPSHOT_FILE)).unwrap();
        let stored = decode_snapshot(&bytes, dir.path()).unwrap();
        assert_eq!(stored.data[..2], [IMAGE_MAGIC, IMAGE_FORMAT_VERSION]);
        let sm = MetadataStateMachine::open(dir.path().to_path_buf())
            .await
            .unwrap();
        assert_eq!(*sm.image(), image);
    }

    #[tokio::test]
    async fn a_json_snapshot_from_an_older_leader_installs() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = MetadataStateMachine::open(dir.path().to_path_buf())
            .await
            .unwrap();
        let image = realistic_image(8);
        let meta = SnapshotMeta {
            last_log_id: Some(log_id(2, 1, 90)),
            last_membership: StoredMembership::default(),
            snapshot_id: "2-1-90-0".into(),
        };
        let data = Box::new(Cursor::new(serde_json::to_vec(&image).unwrap()));
        sm.install_snapshot(&meta, data).await.unwrap();
        assert_eq!(*sm.image(), image);
    }

    #[test]
    fn truncated_or_damaged_binary_images_are_errors_not_panics() {
        let image = realistic_image(4);
        let data = encode_image(&image).unwrap();
        for len in 0..data.len() {
            let err = decode_image(&data[..len]).expect_err("a truncated image decoded");
            assert!(
                !err.to_string().is_empty(),
                "truncated to {len} bytes: {err}"
            );
        }
        // Every byte of the body damaged in turn: an error or (say, a changed number) some
        // other image, never a panic. (On disk the file's CRC catches the latter.)
        for at in 2..data.len() {
            for mask in [0x01, 0x80, 0xff] {
                let mut bad = data.clone();
                bad[at] ^= mask;
                let _ = decode_image(&bad);
            }
        }
        // A length prefix claiming 4 GiB of elements fails without allocating them.
        let mut huge = vec![
            IMAGE_MAGIC,
            IMAGE_FORMAT_VERSION,
            0xdd,
            0xff,
            0xff,
            0xff,
            0xff,
        ];
        huge.extend_from_slice(&data[3..]);
        assert!(matches!(
            decode_image(&huge),
            Err(ImageCodecError::Decode(_))
        ));
        let mut trailing = data.clone();
        trailing.push(0xc0);
        assert!(matches!(
            decode_image(&trailing),
            Err(ImageCodecError::Trailing(1))
        ));
        assert!(matches!(
            decode_image(b"{\"brokers\":"),
            Err(ImageCodecError::Json(_))
        ));
    }

    #[tokio::test]
    async fn a_truncated_binary_snapshot_is_refused_on_load_and_on_install() {
        let dir = tempfile::tempdir().unwrap();
        let data = encode_image(&realistic_image(8)).unwrap();
        let cut = data[..data.len() / 2].to_vec();
        // A valid file (CRC over the cut data) around a cut image.
        write_snapshot_file(dir.path(), cut.clone());
        let err = MetadataStateMachine::open(dir.path().to_path_buf())
            .await
            .err()
            .unwrap();
        assert!(err.to_string().contains("image does not load"), "{err}");

        let other = tempfile::tempdir().unwrap();
        let mut sm = MetadataStateMachine::open(other.path().to_path_buf())
            .await
            .unwrap();
        let meta = SnapshotMeta {
            last_log_id: Some(log_id(2, 1, 90)),
            last_membership: StoredMembership::default(),
            snapshot_id: "2-1-90-0".into(),
        };
        assert!(sm
            .install_snapshot(&meta, Box::new(Cursor::new(cut)))
            .await
            .is_err());
        assert_eq!(*sm.image(), MetadataImage::new());
        assert_eq!(sm.applied_state().await.unwrap().0, None);
        assert!(sm.get_current_snapshot().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn an_unknown_format_version_is_refused() {
        let mut data = encode_image(&realistic_image(4)).unwrap();
        data[1] = IMAGE_FORMAT_VERSION + 1;
        let err = decode_image(&data).unwrap_err();
        assert!(matches!(err, ImageCodecError::UnknownVersion(2)));
        let text = err.to_string();
        assert!(
            text.contains("version 2") && text.contains("newer spate"),
            "{text}"
        );
        assert!(matches!(
            decode_image(&[IMAGE_MAGIC, 0]),
            Err(ImageCodecError::UnknownVersion(0))
        ));
        assert!(matches!(
            decode_image(&[IMAGE_MAGIC]),
            Err(ImageCodecError::NoVersion)
        ));
        assert!(matches!(decode_image(&[]), Err(ImageCodecError::Empty)));
        let unknown = decode_image(b"[1,2]").unwrap_err();
        assert!(matches!(unknown, ImageCodecError::UnknownFormat(b'[')));
        assert!(unknown.to_string().contains("0x5b"), "{unknown}");

        // The same through the snapshot file and through installation.
        let dir = tempfile::tempdir().unwrap();
        write_snapshot_file(dir.path(), data.clone());
        let err = MetadataStateMachine::open(dir.path().to_path_buf())
            .await
            .err()
            .unwrap();
        assert!(err.to_string().contains("format version 2"), "{err}");
        let other = tempfile::tempdir().unwrap();
        let mut sm = MetadataStateMachine::open(other.path().to_path_buf())
            .await
            .unwrap();
        let meta = SnapshotMeta {
            last_log_id: Some(log_id(2, 1, 90)),
            last_membership: StoredMembership::default(),
            snapshot_id: "2-1-90-0".into(),
        };
        let err = sm
            .install_snapshot(&meta, Box::new(Cursor::new(data)))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("format version 2"), "{err}");
    }

    /// Size and speed of a 3,000-partition image (3 brokers, RF 3), JSON against binary:
    /// `cargo test -p spate-cluster --release --lib snapshot_codec_size_and_speed -- --ignored --nocapture`
    #[test]
    #[ignore = "a measurement; run it in --release"]
    fn snapshot_codec_size_and_speed() {
        use std::time::{Duration, Instant};

        let image = cluster_image(3, 30, 100);
        let partitions: usize = image.topics().values().map(|t| t.partitions.len()).sum();
        assert_eq!(partitions, 3000);
        // The best of 10 batches of 50: the machine may be busy with other work.
        fn time<T>(mut f: impl FnMut() -> T) -> Duration {
            (0..10)
                .map(|_| {
                    let start = Instant::now();
                    for _ in 0..50 {
                        std::hint::black_box(f());
                    }
                    start.elapsed() / 50
                })
                .min()
                .unwrap()
        }
        let json = serde_json::to_vec(&image).unwrap();
        // As spates before the binary format wrote it: empty reassignment fields left out.
        let older_json = String::from_utf8(json.clone())
            .unwrap()
            .replace(r#","adding":[],"removing":[]"#, "")
            .into_bytes();
        let binary = encode_image(&image).unwrap();
        for data in [&json, &older_json, &binary] {
            assert_eq!(decode_image(data).unwrap(), image);
        }
        let encode_json = || serde_json::to_vec(&image).unwrap();
        let encode_binary = || encode_image(&image).unwrap();
        for (name, data, encode) in [
            ("JSON", &json, &encode_json as &dyn Fn() -> Vec<u8>),
            ("older JSON", &older_json, &encode_json),
            ("binary", &binary, &encode_binary),
        ] {
            let enc = time(encode);
            let dec = time(|| decode_image(data).unwrap());
            println!(
                "{partitions} partitions, {name:>10}: {:>7} bytes, encode {enc:>9.1?}, \
                 decode {dec:>9.1?}, both {:>9.1?}",
                data.len(),
                enc + dec
            );
        }
    }
}
