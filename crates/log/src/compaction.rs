//! Log compaction's decisions, free of I/O: which records of a log a clean keeps.
//!
//! A clean covers the log from its start up to the end of its cleanable section (sealed
//! segments, none newer than `min.compaction.lag.ms`). First every key of the dirty section
//! (from the first offset no clean has covered yet to that end) is mapped to its latest offset
//! ([`OffsetMap`]); then every batch from the log start is walked in order ([`Sweep`]):
//!
//! * a record is kept when no later record of its key exists in the map (it is the key's
//!   latest), or its key is not in the map at all (it was the latest when an earlier clean
//!   covered it);
//! * a tombstone (a record without a value) that is its key's latest is kept until it is
//!   older than `delete.retention.ms`, so consumers that read the key earlier see the delete;
//! * records of aborted transactions are dropped, whatever their keys;
//! * a transaction marker is kept while any record of its transaction is still in the log
//!   (a replica rebuilding its producer state must see the transaction end), and, once none is,
//!   until it is older than `delete.retention.ms`;
//! * a record without a key cannot be compacted: produce refuses them on compacted topics, and
//!   any left from before the topic was compacted are kept.
//!
//! Offsets never change: a kept record keeps its offset, timestamp and headers, so a clean
//! leaves gaps, as Kafka's does.

use std::collections::HashMap;

use spate_protocol::batch::{self, BatchHeader, Batches, ControlKind};
use spate_protocol::records::{
    Compression, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
};

/// Bytes of the dedupe buffer one map entry stands for (a 16-byte key digest and an 8-byte
/// offset, as Kafka's `log.cleaner.dedupe.buffer.size` counts them).
pub const BYTES_PER_ENTRY: usize = 24;

/// The digest a key is mapped by: 128 bits, so two keys collide with negligible probability
/// (Kafka uses MD5's 128 bits for the same purpose).
pub fn key_digest(key: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(key)
}

/// Each key of a dirty section and its latest offset, within a bounded size.
#[derive(Debug, Clone)]
pub struct OffsetMap {
    latest: HashMap<u128, i64>,
    capacity: usize,
    /// The offset after the last record mapped: a clean covers the dirty section only up to
    /// here when the map filled up before its end.
    end: i64,
}

impl OffsetMap {
    /// A map holding at most `buffer_bytes / 24` keys.
    pub fn with_buffer_bytes(buffer_bytes: usize) -> Self {
        let capacity = (buffer_bytes / BYTES_PER_ENTRY).max(1);
        Self {
            latest: HashMap::with_capacity(capacity.min(1 << 20)),
            capacity,
            end: -1,
        }
    }

    /// Maps `key` to `offset` (offsets come in increasing order). `false`, and nothing mapped,
    /// when the map is full and the key is new: the clean stops its dirty section before this
    /// record and a later pass takes the rest.
    pub fn put(&mut self, key: &[u8], offset: i64) -> bool {
        let digest = key_digest(key);
        if self.latest.len() >= self.capacity && !self.latest.contains_key(&digest) {
            return false;
        }
        self.latest.insert(digest, offset);
        self.end = offset + 1;
        true
    }

    /// Records that `offset` was read without a key to map (a control batch, a keyless or
    /// aborted record): the mapped section reaches past it.
    pub fn skip(&mut self, offset: i64) {
        self.end = self.end.max(offset + 1);
    }

    /// The latest offset of `key` in the mapped section.
    pub fn latest(&self, key: &[u8]) -> Option<i64> {
        self.latest.get(&key_digest(key)).copied()
    }

    /// The offset after the last record mapped (-1: none).
    pub fn end(&self) -> i64 {
        self.end
    }

    /// Keys mapped.
    pub fn len(&self) -> usize {
        self.latest.len()
    }

    /// Whether no key is mapped.
    pub fn is_empty(&self) -> bool {
        self.latest.is_empty()
    }
}

/// One batch as the sweep sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchFacts {
    /// Producer id (-1 without one).
    pub producer_id: i64,
    /// Part of a transaction.
    pub transactional: bool,
    /// A transaction marker, and which.
    pub control: Option<ControlKind>,
    /// Its last offset.
    pub last_offset: i64,
    /// Its newest timestamp (a marker's time).
    pub max_timestamp: i64,
}

/// One record of a data batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordFacts<'a> {
    /// Its offset.
    pub offset: i64,
    /// Its timestamp.
    pub timestamp: i64,
    /// Its key.
    pub key: Option<&'a [u8]>,
    /// Whether it has a value (false: a tombstone).
    pub has_value: bool,
}

/// An aborted transaction of the log: its producer, first offset and marker offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aborted {
    /// Producer id.
    pub producer_id: i64,
    /// First record.
    pub first_offset: i64,
    /// Its abort marker.
    pub marker_offset: i64,
}

/// The walk over a log's batches in offset order that decides what a clean keeps.
#[derive(Debug)]
pub struct Sweep<'m> {
    map: &'m OffsetMap,
    aborted: Vec<Aborted>,
    /// Tombstones and markers older than this (ms) go.
    delete_horizon_ms: i64,
    /// Per producer: records of its current transaction the sweep kept so far.
    txn_kept: HashMap<i64, usize>,
    /// The topic's `compression.type` for the batches the sweep rewrites (`None`: each keeps
    /// its own codec).
    codec: Option<Compression>,
}

impl<'m> Sweep<'m> {
    /// A sweep with `map` of the dirty section, the log's aborted transactions, and the time
    /// before which tombstones and finished markers are removed (now − delete.retention.ms).
    pub fn new(map: &'m OffsetMap, aborted: Vec<Aborted>, delete_horizon_ms: i64) -> Self {
        Self {
            map,
            aborted,
            delete_horizon_ms,
            txn_kept: HashMap::new(),
            codec: None,
        }
    }

    /// The sweep writes the batches it rewrites in `codec` (a topic's `compression.type`;
    /// `None` keeps each batch's own). Batches kept whole are copied as they are.
    pub fn writing(mut self, codec: Option<Compression>) -> Self {
        self.codec = codec;
        self
    }

    fn is_aborted(&self, producer_id: i64, offset: i64) -> bool {
        self.aborted.iter().any(|a| {
            a.producer_id == producer_id && (a.first_offset..a.marker_offset).contains(&offset)
        })
    }

    /// Whether to keep `r` of data batch `b`.
    pub fn keep_record(&mut self, b: &BatchFacts, r: &RecordFacts<'_>) -> bool {
        if b.transactional && self.is_aborted(b.producer_id, r.offset) {
            return false;
        }
        let keep = match r.key {
            None => true,
            Some(key) => {
                let latest = self.map.latest(key).is_none_or(|l| l <= r.offset);
                latest && (r.has_value || r.timestamp >= self.delete_horizon_ms)
            }
        };
        if keep && b.transactional {
            *self.txn_kept.entry(b.producer_id).or_default() += 1;
        }
        keep
    }

    /// Whether to keep marker batch `b`: while its transaction still has a record in the log,
    /// and afterwards until the delete horizon.
    pub fn keep_marker(&mut self, b: &BatchFacts) -> bool {
        let kept = self.txn_kept.remove(&b.producer_id).unwrap_or(0);
        kept > 0 || b.max_timestamp >= self.delete_horizon_ms
    }
}

/// Why a section of a log could not be compacted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompactionError {
    /// A batch did not parse (the log's recovery would have cut it: a bug or a damaged disk).
    #[error("batch at offset {offset} cannot be read: {reason}")]
    Unreadable {
        /// Where.
        offset: i64,
        /// What was wrong.
        reason: String,
    },
}

/// The facts of a batch header.
fn batch_facts(h: &BatchHeader, bytes: &[u8]) -> BatchFacts {
    BatchFacts {
        producer_id: h.producer_id,
        transactional: h.is_transactional(),
        control: h
            .is_control()
            .then(|| batch::control_record(bytes).map_or(ControlKind::Abort, |m| m.kind)),
        last_offset: h.last_offset(),
        max_timestamp: h.max_timestamp,
    }
}

fn unreadable(h: &BatchHeader, reason: impl ToString) -> CompactionError {
    CompactionError::Unreadable {
        offset: h.base_offset,
        reason: reason.to_string(),
    }
}

/// Every record of a batch: straight from its bytes when uncompressed, decoded otherwise.
fn for_each_record(
    h: &BatchHeader,
    bytes: &[u8],
    mut visit: impl FnMut(RecordFacts<'_>),
) -> Result<(), CompactionError> {
    if h.compression() == 0 {
        for r in batch::records(bytes).ok_or_else(|| unreadable(h, "records do not parse"))? {
            visit(RecordFacts {
                offset: r.offset,
                timestamp: r.timestamp,
                key: r.key,
                has_value: r.has_value,
            });
        }
        return Ok(());
    }
    let mut buf = bytes::Bytes::copy_from_slice(bytes);
    let set = RecordBatchDecoder::decode(&mut buf).map_err(|e| unreadable(h, e))?;
    for r in &set.records {
        visit(RecordFacts {
            offset: r.offset,
            timestamp: r.timestamp,
            key: r.key.as_deref(),
            has_value: r.value.is_some(),
        });
    }
    Ok(())
}

/// Maps the keys of the dirty section `bytes` (whole batches, in offset order) into `map`,
/// skipping control batches and the records of `aborted` transactions. Stops at the first
/// record whose key does not fit; `map.end()` then says where the section was cut.
pub fn map_section(
    bytes: &[u8],
    map: &mut OffsetMap,
    aborted: &[Aborted],
) -> Result<(), CompactionError> {
    let in_aborted = |pid: i64, offset: i64| {
        aborted
            .iter()
            .any(|a| a.producer_id == pid && (a.first_offset..a.marker_offset).contains(&offset))
    };
    for (pos, h) in Batches::new(bytes) {
        let b = &bytes[pos..pos + h.total_len()];
        if h.is_control() {
            map.skip(h.last_offset());
            continue;
        }
        let mut full = false;
        for_each_record(&h, b, |r| {
            if full {
                return;
            }
            match r.key {
                Some(k) if !(h.is_transactional() && in_aborted(h.producer_id, r.offset)) => {
                    full = !map.put(k, r.offset);
                }
                _ => map.skip(r.offset),
            }
        })?;
        if full {
            return Ok(());
        }
        map.skip(h.last_offset());
    }
    Ok(())
}

/// Compacts whole batches `bytes` (in offset order) with `sweep`: what the clean writes in
/// their place. A batch whose records are all kept is copied as it is; one with none kept is
/// left out; any other is rewritten with the kept records (their bytes copied when the batch
/// is uncompressed and stays so, re-encoded with the sweep's codec, or the batch's own,
/// otherwise), keeping every kept record's offset, timestamp, headers and the batch's producer
/// fields.
pub fn compact_batches(bytes: &[u8], sweep: &mut Sweep<'_>) -> Result<Vec<u8>, CompactionError> {
    let mut out = Vec::with_capacity(bytes.len());
    for (pos, h) in Batches::new(bytes) {
        let b = &bytes[pos..pos + h.total_len()];
        let facts = batch_facts(&h, b);
        if facts.control.is_some() {
            if sweep.keep_marker(&facts) {
                out.extend_from_slice(b);
            }
            continue;
        }
        if h.compression() == 0 && sweep.codec.is_none_or(|c| c == Compression::None) {
            let all = batch::records(b).ok_or_else(|| unreadable(&h, "records do not parse"))?;
            let kept: Vec<batch::RecordView<'_>> = all
                .iter()
                .filter(|r| {
                    sweep.keep_record(
                        &facts,
                        &RecordFacts {
                            offset: r.offset,
                            timestamp: r.timestamp,
                            key: r.key,
                            has_value: r.has_value,
                        },
                    )
                })
                .copied()
                .collect();
            match kept.len() {
                0 => {}
                n if n == all.len() => out.extend_from_slice(b),
                _ => out.extend_from_slice(&batch::retain(b, &kept)),
            }
            continue;
        }
        let mut buf = bytes::Bytes::copy_from_slice(b);
        let set = RecordBatchDecoder::decode(&mut buf).map_err(|e| unreadable(&h, e))?;
        let total = set.records.len();
        let kept: Vec<spate_protocol::records::Record> = set
            .records
            .into_iter()
            .filter(|r| {
                sweep.keep_record(
                    &facts,
                    &RecordFacts {
                        offset: r.offset,
                        timestamp: r.timestamp,
                        key: r.key.as_deref(),
                        has_value: r.value.is_some(),
                    },
                )
            })
            .collect();
        match kept.len() {
            0 => {}
            n if n == total => out.extend_from_slice(b),
            _ => {
                let mut enc = bytes::BytesMut::new();
                RecordBatchEncoder::encode(
                    &mut enc,
                    &kept,
                    &RecordEncodeOptions {
                        version: 2,
                        compression: sweep.codec.unwrap_or(set.compression),
                    },
                )
                .map_err(|e| unreadable(&h, e))?;
                // The encoder stamps epoch 0; the batch keeps the epoch it was written in.
                let mut rewritten = enc.to_vec();
                batch::assign(&mut rewritten, kept[0].offset, h.partition_leader_epoch);
                out.extend_from_slice(&rewritten);
            }
        }
    }
    Ok(out)
}

/// One sealed segment as the cleaner's scheduling sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentSpan {
    /// Its first offset.
    pub base_offset: i64,
    /// The offset after its last batch.
    pub next_offset: i64,
    /// Its size in bytes.
    pub size: u64,
    /// Its newest record's timestamp.
    pub max_timestamp: i64,
}

/// A topic's compaction settings, as Kafka names them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CleanPolicy {
    /// `min.cleanable.dirty.ratio`: clean once this share of the log is dirty.
    pub min_dirty_ratio: f64,
    /// `min.compaction.lag.ms`: a record stays uncompacted at least this long.
    pub min_lag_ms: i64,
    /// `max.compaction.lag.ms`: a dirty record is compacted within this long, whatever the
    /// ratio.
    pub max_lag_ms: i64,
}

/// What a clean of a log would cover.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cleanable {
    /// The offset the clean stops before: the base of the first segment too young to clean.
    pub end: i64,
    /// Bytes of the segments from the first dirty one up to `end`.
    pub dirty_bytes: u64,
    /// Bytes of every segment up to `end`.
    pub total_bytes: u64,
}

impl Cleanable {
    /// Dirty bytes over total bytes.
    pub fn dirty_ratio(&self) -> f64 {
        if self.total_bytes == 0 {
            0.0
        } else {
            self.dirty_bytes as f64 / self.total_bytes as f64
        }
    }
}

/// Whether a log whose sealed segments are `sealed` (in offset order) and whose first
/// uncleaned offset is `first_dirty` should be cleaned at `now_ms`, and up to where: segments
/// holding records younger than `min.compaction.lag.ms` are left for later; the log is due
/// when its dirty share reaches `min.cleanable.dirty.ratio`, or when a dirty segment's newest
/// record is already older than `max.compaction.lag.ms`.
pub fn schedule(
    sealed: &[SegmentSpan],
    first_dirty: i64,
    now_ms: i64,
    policy: &CleanPolicy,
) -> Option<Cleanable> {
    let young = now_ms.saturating_sub(policy.min_lag_ms);
    let end_index = sealed
        .iter()
        .position(|s| s.max_timestamp > young)
        .unwrap_or(sealed.len());
    let cleanable = &sealed[..end_index];
    let end = cleanable.last()?.next_offset;
    if end <= first_dirty {
        return None;
    }
    let total_bytes: u64 = cleanable.iter().map(|s| s.size).sum();
    let dirty: Vec<&SegmentSpan> = cleanable
        .iter()
        .filter(|s| s.next_offset > first_dirty)
        .collect();
    let dirty_bytes: u64 = dirty.iter().map(|s| s.size).sum();
    let c = Cleanable {
        end,
        dirty_bytes,
        total_bytes,
    };
    let overdue = dirty
        .first()
        .is_some_and(|s| s.max_timestamp <= now_ms.saturating_sub(policy.max_lag_ms));
    (c.dirty_ratio() >= policy.min_dirty_ratio || overdue).then_some(c)
}

#[cfg(test)]
mod tests;
