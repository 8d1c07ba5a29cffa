//! Durable share-partition state, as Kafka writes it to `__share_group_state`.
//!
//! Each record there is keyed by (group id, topic id, partition). A `ShareSnapshot` holds the
//! whole state of a share-partition; a `ShareUpdate` holds the batches that changed since, to
//! be applied on top of the latest snapshot. Both are encoded exactly as Kafka 4.3's
//! `ShareSnapshotKey`/`Value` and `ShareUpdateKey`/`Value` schemas:
//!
//! - key: `i16` record type (0 snapshot, 1 update), then key version 0 (not flexible):
//!   `i16 length + group id`, 16-byte topic id, `i32` partition;
//! - value: `i16` version (0), then the flexible version-0 fields: compact arrays
//!   (unsigned varint length + 1), a tagged-field section after each state batch and after the
//!   value (tag 0: `DeliveryCompleteCount`, Kafka 4.2+, written only when not -1).
//!
//! kafka-protocol 0.18 generates code only for API messages, not for these coordinator
//! records, and its primitive encoders report decode failures as untyped errors; the format is
//! small enough that a dedicated encoder here is shorter than adapting them, and it lets every
//! malformed input surface as a [`DecodeError`] variant.

use thiserror::Error;
use uuid::Uuid;

/// Record type of a snapshot in `__share_group_state` (the key's leading `i16`).
pub const SNAPSHOT_RECORD_TYPE: i16 = 0;
/// Record type of an update in `__share_group_state`.
pub const UPDATE_RECORD_TYPE: i16 = 1;
/// The only value version Kafka defines for both records.
pub const VALUE_VERSION: i16 = 0;

/// The durable delivery state of a batch of records (`DeliveryState` in the schemas).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    /// 0: may be delivered.
    Available,
    /// 1: acquired; Kafka does not persist locks, and such a batch loads as available.
    Acquired,
    /// 2: acknowledged.
    Acknowledged,
    /// 4: archived.
    Archived,
}

impl DeliveryState {
    /// The state for a wire code.
    pub fn from_code(code: i8) -> Option<Self> {
        match code {
            0 => Some(Self::Available),
            1 => Some(Self::Acquired),
            2 => Some(Self::Acknowledged),
            4 => Some(Self::Archived),
            _ => None,
        }
    }

    /// The wire code.
    pub fn code(self) -> i8 {
        match self {
            Self::Available => 0,
            Self::Acquired => 1,
            Self::Acknowledged => 2,
            Self::Archived => 4,
        }
    }
}

/// A run of offsets with one delivery state and count (`StateBatch` in the schemas).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateBatch {
    /// First offset.
    pub first_offset: i64,
    /// Last offset (inclusive).
    pub last_offset: i64,
    /// [`DeliveryState`] code.
    pub delivery_state: i8,
    /// Delivery count.
    pub delivery_count: i16,
}

/// The durable view of one share-partition, as [`crate::SharePartition::snapshot`] gives it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartitionState {
    /// State epoch (bumped when the state is reset).
    pub state_epoch: i32,
    /// Leader epoch of the partition when written.
    pub leader_epoch: i32,
    /// The share-partition start offset.
    pub start_offset: i64,
    /// In-flight batches from the start offset on.
    pub batches: Vec<StateBatch>,
}

impl PartitionState {
    /// Offsets at or after the start offset whose delivery is complete (acknowledged or
    /// archived): the `DeliveryCompleteCount` of Kafka 4.2+ (KIP-1226), for share group lag.
    pub fn delivery_complete_count(&self) -> i32 {
        delivery_complete_count(&self.batches)
    }
}

/// Offsets in `batches` whose delivery is complete (acknowledged or archived), saturating at
/// `i32::MAX`: the `DeliveryCompleteCount` of a state whose batches start at its start offset.
pub fn delivery_complete_count(batches: &[StateBatch]) -> i32 {
    let done: i64 = batches
        .iter()
        .filter(|b| {
            b.delivery_state == DeliveryState::Acknowledged.code()
                || b.delivery_state == DeliveryState::Archived.code()
        })
        .map(|b| (b.last_offset - b.first_offset).saturating_add(1).max(0))
        .fold(0i64, |a, n| a.saturating_add(n));
    i32::try_from(done).unwrap_or(i32::MAX)
}

/// Which share-partition a `__share_group_state` record is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShareStateKey {
    /// Share group id.
    pub group_id: String,
    /// Topic id.
    pub topic_id: Uuid,
    /// Partition index.
    pub partition: i32,
}

/// A record key in `__share_group_state`: which kind of record, for which share-partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ShareRecordKey {
    /// A full snapshot (`ShareSnapshotKey`).
    Snapshot(ShareStateKey),
    /// A delta on top of the latest snapshot (`ShareUpdateKey`).
    Update(ShareStateKey),
}

/// `ShareSnapshotValue` version 0: the whole state of a share-partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareSnapshot {
    /// Snapshot epoch.
    pub snapshot_epoch: i32,
    /// State epoch.
    pub state_epoch: i32,
    /// Leader epoch.
    pub leader_epoch: i32,
    /// The share-partition start offset.
    pub start_offset: i64,
    /// Offsets at or after the start offset whose delivery is complete (tagged; -1 unknown).
    pub delivery_complete_count: i32,
    /// When the state was created (ms).
    pub create_timestamp: i64,
    /// When it was written (ms).
    pub write_timestamp: i64,
    /// State batches.
    pub state_batches: Vec<StateBatch>,
}

/// `ShareUpdateValue` version 0: batches that changed since the last snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareUpdate {
    /// Snapshot epoch it applies to.
    pub snapshot_epoch: i32,
    /// Leader epoch.
    pub leader_epoch: i32,
    /// The new start offset, or -1 if unchanged.
    pub start_offset: i64,
    /// Offsets at or after the start offset whose delivery is complete (tagged; -1 unknown).
    pub delivery_complete_count: i32,
    /// Changed state batches.
    pub state_batches: Vec<StateBatch>,
}

impl ShareUpdate {
    /// The update for a [`crate::StateChange::Update`]; `delivery_complete_count` is
    /// [`crate::SharePartition::delivery_complete_count`] (or -1 if unknown).
    pub fn of(
        start_offset: Option<i64>,
        batches: &[StateBatch],
        delivery_complete_count: i32,
        snapshot_epoch: i32,
        leader_epoch: i32,
    ) -> Self {
        Self {
            snapshot_epoch,
            leader_epoch,
            start_offset: start_offset.unwrap_or(-1),
            delivery_complete_count,
            state_batches: batches.to_vec(),
        }
    }
}

impl ShareSnapshot {
    /// A snapshot of `state` written at `now`; `created` is when the state was first created.
    pub fn of(state: &PartitionState, snapshot_epoch: i32, created: i64, now: i64) -> Self {
        Self {
            snapshot_epoch,
            state_epoch: state.state_epoch,
            leader_epoch: state.leader_epoch,
            start_offset: state.start_offset,
            delivery_complete_count: state.delivery_complete_count(),
            create_timestamp: created,
            write_timestamp: now,
            state_batches: state.batches.clone(),
        }
    }

    /// The partition state this snapshot holds.
    pub fn partition_state(&self) -> PartitionState {
        PartitionState {
            state_epoch: self.state_epoch,
            leader_epoch: self.leader_epoch,
            start_offset: self.start_offset,
            batches: self.state_batches.clone(),
        }
    }

    /// This snapshot with `update` applied: the start offset moves, batches below it are
    /// dropped, and the update's batches replace the offsets they cover.
    pub fn apply(&self, update: &ShareUpdate) -> ShareSnapshot {
        let mut next = self.clone();
        next.leader_epoch = update.leader_epoch;
        if update.start_offset >= 0 {
            next.start_offset = update.start_offset;
        }
        if update.delivery_complete_count >= 0 {
            next.delivery_complete_count = update.delivery_complete_count;
        }
        let mut out: Vec<StateBatch> = Vec::new();
        let mut batches = self.state_batches.clone();
        for u in &update.state_batches {
            let mut rest = Vec::new();
            for b in batches {
                if b.last_offset < u.first_offset || b.first_offset > u.last_offset {
                    rest.push(b);
                    continue;
                }
                if b.first_offset < u.first_offset {
                    rest.push(StateBatch {
                        last_offset: u.first_offset - 1,
                        ..b
                    });
                }
                if b.last_offset > u.last_offset {
                    rest.push(StateBatch {
                        first_offset: u.last_offset + 1,
                        ..b
                    });
                }
            }
            rest.push(*u);
            batches = rest;
        }
        batches.sort_by_key(|b| b.first_offset);
        for b in batches {
            if b.last_offset < next.start_offset {
                continue;
            }
            let b = StateBatch {
                first_offset: b.first_offset.max(next.start_offset),
                ..b
            };
            out.push(b);
        }
        next.state_batches = out;
        next
    }
}

/// Why a `__share_group_state` record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The input ended inside `field`.
    #[error("truncated record: input ended in {0}")]
    Truncated(&'static str),
    /// A record type other than snapshot (0) or update (1).
    #[error("unknown share state record type {0}")]
    UnknownRecordType(i16),
    /// A value version other than 0.
    #[error("unsupported value version {0}")]
    UnsupportedVersion(i16),
    /// A negative length, or a null for a field that cannot be null.
    #[error("invalid length in {0}")]
    InvalidLength(&'static str),
    /// A varint longer than its type allows.
    #[error("malformed varint in {0}")]
    BadVarint(&'static str),
    /// A string that is not UTF-8.
    #[error("group id is not UTF-8")]
    NotUtf8,
    /// Bytes left over after the record.
    #[error("{0} bytes after the end of the record")]
    TrailingBytes(usize),
    /// A known tagged field with the wrong size.
    #[error("tagged field {tag} has size {size}")]
    BadTaggedField {
        /// Tag.
        tag: u32,
        /// Its size on the wire.
        size: usize,
    },
}

/// Why a record could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EncodeError {
    /// The group id does not fit Kafka's 16-bit string length.
    #[error("group id longer than 32767 bytes")]
    GroupIdTooLong,
}

impl ShareRecordKey {
    /// The share-partition the key is about.
    pub fn state_key(&self) -> &ShareStateKey {
        match self {
            Self::Snapshot(k) | Self::Update(k) => k,
        }
    }

    /// Encodes the key: record type, then key version 0.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let (kind, k) = match self {
            Self::Snapshot(k) => (SNAPSHOT_RECORD_TYPE, k),
            Self::Update(k) => (UPDATE_RECORD_TYPE, k),
        };
        let len = i16::try_from(k.group_id.len()).map_err(|_| EncodeError::GroupIdTooLong)?;
        let mut w = Vec::with_capacity(24 + k.group_id.len());
        w.extend_from_slice(&kind.to_be_bytes());
        w.extend_from_slice(&len.to_be_bytes());
        w.extend_from_slice(k.group_id.as_bytes());
        w.extend_from_slice(k.topic_id.as_bytes());
        w.extend_from_slice(&k.partition.to_be_bytes());
        Ok(w)
    }

    /// Decodes a key.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader(bytes);
        let kind = r.i16("record type")?;
        if kind != SNAPSHOT_RECORD_TYPE && kind != UPDATE_RECORD_TYPE {
            return Err(DecodeError::UnknownRecordType(kind));
        }
        let len = r.i16("group id length")?;
        if len < 0 {
            return Err(DecodeError::InvalidLength("group id"));
        }
        let group = r.take(len as usize, "group id")?;
        let group_id = String::from_utf8(group.to_vec()).map_err(|_| DecodeError::NotUtf8)?;
        let id = r.take(16, "topic id")?;
        let mut raw = [0u8; 16];
        raw.copy_from_slice(id);
        let partition = r.i32("partition")?;
        r.finish()?;
        let k = ShareStateKey {
            group_id,
            topic_id: Uuid::from_bytes(raw),
            partition,
        };
        Ok(if kind == SNAPSHOT_RECORD_TYPE {
            Self::Snapshot(k)
        } else {
            Self::Update(k)
        })
    }
}

impl ShareSnapshot {
    /// Encodes the value: version, then `ShareSnapshotValue` v0.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(48 + 22 * self.state_batches.len());
        w.extend_from_slice(&VALUE_VERSION.to_be_bytes());
        w.extend_from_slice(&self.snapshot_epoch.to_be_bytes());
        w.extend_from_slice(&self.state_epoch.to_be_bytes());
        w.extend_from_slice(&self.leader_epoch.to_be_bytes());
        w.extend_from_slice(&self.start_offset.to_be_bytes());
        w.extend_from_slice(&self.create_timestamp.to_be_bytes());
        w.extend_from_slice(&self.write_timestamp.to_be_bytes());
        put_batches(&mut w, &self.state_batches);
        put_delivery_complete_tag(&mut w, self.delivery_complete_count);
        w
    }

    /// Decodes a value.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader(bytes);
        check_version(&mut r)?;
        let snapshot_epoch = r.i32("snapshot epoch")?;
        let state_epoch = r.i32("state epoch")?;
        let leader_epoch = r.i32("leader epoch")?;
        let start_offset = r.i64("start offset")?;
        let create_timestamp = r.i64("create timestamp")?;
        let write_timestamp = r.i64("write timestamp")?;
        let state_batches = get_batches(&mut r)?;
        let delivery_complete_count = get_delivery_complete_tag(&mut r)?;
        r.finish()?;
        Ok(Self {
            snapshot_epoch,
            state_epoch,
            leader_epoch,
            start_offset,
            delivery_complete_count,
            create_timestamp,
            write_timestamp,
            state_batches,
        })
    }
}

impl ShareUpdate {
    /// Encodes the value: version, then `ShareUpdateValue` v0.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(24 + 22 * self.state_batches.len());
        w.extend_from_slice(&VALUE_VERSION.to_be_bytes());
        w.extend_from_slice(&self.snapshot_epoch.to_be_bytes());
        w.extend_from_slice(&self.leader_epoch.to_be_bytes());
        w.extend_from_slice(&self.start_offset.to_be_bytes());
        put_batches(&mut w, &self.state_batches);
        put_delivery_complete_tag(&mut w, self.delivery_complete_count);
        w
    }

    /// Decodes a value.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader(bytes);
        check_version(&mut r)?;
        let snapshot_epoch = r.i32("snapshot epoch")?;
        let leader_epoch = r.i32("leader epoch")?;
        let start_offset = r.i64("start offset")?;
        let state_batches = get_batches(&mut r)?;
        let delivery_complete_count = get_delivery_complete_tag(&mut r)?;
        r.finish()?;
        Ok(Self {
            snapshot_epoch,
            leader_epoch,
            start_offset,
            delivery_complete_count,
            state_batches,
        })
    }
}

fn check_version(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    let version = r.i16("version")?;
    if version != VALUE_VERSION {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    Ok(())
}

fn put_uvarint(w: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        w.push((v as u8) | 0x80);
        v >>= 7;
    }
    w.push(v as u8);
}

fn put_batches(w: &mut Vec<u8>, batches: &[StateBatch]) {
    put_uvarint(w, batches.len() as u32 + 1);
    for b in batches {
        w.extend_from_slice(&b.first_offset.to_be_bytes());
        w.extend_from_slice(&b.last_offset.to_be_bytes());
        w.push(b.delivery_state as u8);
        w.extend_from_slice(&b.delivery_count.to_be_bytes());
        put_uvarint(w, 0); // no tagged fields
    }
}

fn put_delivery_complete_tag(w: &mut Vec<u8>, count: i32) {
    if count == -1 {
        put_uvarint(w, 0);
    } else {
        put_uvarint(w, 1); // one tagged field
        put_uvarint(w, 0); // tag 0
        put_uvarint(w, 4); // its size
        w.extend_from_slice(&count.to_be_bytes());
    }
}

fn get_batches(r: &mut Reader<'_>) -> Result<Vec<StateBatch>, DecodeError> {
    let n = r.uvarint("state batches length")?;
    if n == 0 {
        return Err(DecodeError::InvalidLength("state batches (null)"));
    }
    let n = (n - 1) as usize;
    // Each batch takes at least 20 bytes: do not trust the length for the allocation.
    if n > r.0.len() / 20 {
        return Err(DecodeError::Truncated("state batches"));
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let first_offset = r.i64("first offset")?;
        let last_offset = r.i64("last offset")?;
        let delivery_state = r.i8("delivery state")?;
        let delivery_count = r.i16("delivery count")?;
        skip_tagged_fields(r)?;
        out.push(StateBatch {
            first_offset,
            last_offset,
            delivery_state,
            delivery_count,
        });
    }
    Ok(out)
}

fn skip_tagged_fields(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    let n = r.uvarint("tagged fields count")?;
    for _ in 0..n {
        r.uvarint("tag")?;
        let size = r.uvarint("tagged field size")? as usize;
        r.take(size, "tagged field")?;
    }
    Ok(())
}

fn get_delivery_complete_tag(r: &mut Reader<'_>) -> Result<i32, DecodeError> {
    let mut count = -1;
    let n = r.uvarint("tagged fields count")?;
    for _ in 0..n {
        let tag = r.uvarint("tag")?;
        let size = r.uvarint("tagged field size")? as usize;
        let data = r.take(size, "tagged field")?;
        if tag == 0 {
            let raw: [u8; 4] = data
                .try_into()
                .map_err(|_| DecodeError::BadTaggedField { tag, size })?;
            count = i32::from_be_bytes(raw);
        }
    }
    Ok(count)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated(what));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn i8(&mut self, what: &'static str) -> Result<i8, DecodeError> {
        Ok(i8::from_be_bytes(self.array(what)?))
    }

    fn i16(&mut self, what: &'static str) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.array(what)?))
    }

    fn i32(&mut self, what: &'static str) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array(what)?))
    }

    fn i64(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }

    fn uvarint(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let mut v: u32 = 0;
        for i in 0..5 {
            let b = self.take(1, what)?[0];
            if i == 4 && b > 0x0f {
                return Err(DecodeError::BadVarint(what));
            }
            v |= u32::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError::BadVarint(what))
    }

    fn finish(&self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.0.len()))
        }
    }
}
