//! A zero-copy view of Kafka's RecordBatch v2 (magic 2).
//!
//! spate stores batches exactly as producers sent them; only the base offset, the partition
//! leader epoch and (for LogAppendTime topics) the max timestamp are rewritten. Those fields
//! sit at fixed positions, so a batch is handled as bytes with a parsed header beside it.

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use thiserror::Error;

/// Bytes before the records: everything up to and including the record count.
pub const HEADER_LEN: usize = 61;
/// Bytes of base offset plus batch length: what precedes the part `batch_length` counts.
pub const LOG_OVERHEAD: usize = 12;

const BASE_OFFSET: usize = 0;
const BATCH_LENGTH: usize = 8;
const LEADER_EPOCH: usize = 12;
const MAGIC: usize = 16;
const CRC: usize = 17;
const ATTRIBUTES: usize = 21;
const LAST_OFFSET_DELTA: usize = 23;
const BASE_TIMESTAMP: usize = 27;
const MAX_TIMESTAMP: usize = 35;
const PRODUCER_ID: usize = 43;
const PRODUCER_EPOCH: usize = 51;
const BASE_SEQUENCE: usize = 53;
const RECORDS_COUNT: usize = 57;
/// CRC-32C covers everything from the attributes to the end of the batch.
const CRC_START: usize = ATTRIBUTES;

const COMPRESSION_MASK: i16 = 0x07;
const TIMESTAMP_TYPE_BIT: i16 = 0x08;
const TRANSACTIONAL_BIT: i16 = 0x10;
const CONTROL_BIT: i16 = 0x20;

/// Why bytes are not an acceptable RecordBatch.
#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum BatchError {
    /// Fewer bytes than a header, or than the batch length claims.
    #[error("record batch truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes the batch needs.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A length field that cannot be right.
    #[error("invalid record batch length {0}")]
    InvalidLength(i32),
    /// Message format v0 or v1.
    #[error("message format magic {0} is not supported; send RecordBatch v2 (magic 2)")]
    UnsupportedMagic(i8),
    /// The stored CRC does not match the bytes.
    #[error("record batch CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch {
        /// CRC in the batch.
        stored: u32,
        /// CRC of the bytes.
        computed: u32,
    },
    /// Header fields that contradict each other.
    #[error("invalid record batch: {0}")]
    Invalid(&'static str),
    /// Bytes after the batch where exactly one was expected (Kafka allows one per partition).
    #[error(
        "bytes follow the record batch; a produce request carries exactly one batch per partition"
    )]
    TrailingBytes,
    /// A batch could not be built.
    #[error("cannot encode record batch: {0}")]
    Encode(String),
    /// A batch's records could not be decompressed or parsed.
    #[error("cannot decode the records of the batch: {0}")]
    Decode(String),
}

/// The parsed header of one RecordBatch v2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    /// Offset of the first record.
    pub base_offset: i64,
    /// Bytes after the length field; the whole batch is `LOG_OVERHEAD + batch_length`.
    pub batch_length: i32,
    /// Leader epoch when the batch was appended.
    pub partition_leader_epoch: i32,
    /// Format version; 2 for everything spate stores.
    pub magic: i8,
    /// Stored CRC-32C.
    pub crc: u32,
    /// Compression, timestamp type, transactional and control bits.
    pub attributes: i16,
    /// Offset of the last record relative to the base offset.
    pub last_offset_delta: i32,
    /// Timestamp of the first record.
    pub base_timestamp: i64,
    /// Largest record timestamp (or the append time for LogAppendTime).
    pub max_timestamp: i64,
    /// Idempotent producer id, or -1.
    pub producer_id: i64,
    /// Idempotent producer epoch, or -1.
    pub producer_epoch: i16,
    /// Sequence number of the first record, or -1.
    pub base_sequence: i32,
    /// Number of records in the batch.
    pub records_count: i32,
}

fn i16_at(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn i64_at(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

impl BatchHeader {
    /// Parses the header at the start of `b`. Checks lengths and magic, not the CRC.
    pub fn parse(b: &[u8]) -> Result<Self, BatchError> {
        if b.len() < LOG_OVERHEAD + 5 {
            return Err(BatchError::Truncated {
                need: LOG_OVERHEAD + 5,
                have: b.len(),
            });
        }
        let magic = b[MAGIC] as i8;
        if magic != 2 {
            return Err(BatchError::UnsupportedMagic(magic));
        }
        if b.len() < HEADER_LEN {
            return Err(BatchError::Truncated {
                need: HEADER_LEN,
                have: b.len(),
            });
        }
        let batch_length = i32_at(b, BATCH_LENGTH);
        if batch_length < (HEADER_LEN - LOG_OVERHEAD) as i32 {
            return Err(BatchError::InvalidLength(batch_length));
        }
        Ok(Self {
            base_offset: i64_at(b, BASE_OFFSET),
            batch_length,
            partition_leader_epoch: i32_at(b, LEADER_EPOCH),
            magic,
            crc: u32::from_be_bytes([b[CRC], b[CRC + 1], b[CRC + 2], b[CRC + 3]]),
            attributes: i16_at(b, ATTRIBUTES),
            last_offset_delta: i32_at(b, LAST_OFFSET_DELTA),
            base_timestamp: i64_at(b, BASE_TIMESTAMP),
            max_timestamp: i64_at(b, MAX_TIMESTAMP),
            producer_id: i64_at(b, PRODUCER_ID),
            producer_epoch: i16_at(b, PRODUCER_EPOCH),
            base_sequence: i32_at(b, BASE_SEQUENCE),
            records_count: i32_at(b, RECORDS_COUNT),
        })
    }

    /// Size of the whole batch in bytes.
    pub fn total_len(&self) -> usize {
        LOG_OVERHEAD + self.batch_length as usize
    }
    /// Offset of the last record.
    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }
    /// Offset after the last record.
    pub fn next_offset(&self) -> i64 {
        self.last_offset() + 1
    }
    /// Compression codec id: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.
    pub fn compression(&self) -> i16 {
        self.attributes & COMPRESSION_MASK
    }
    /// True for LogAppendTime batches.
    pub fn is_log_append_time(&self) -> bool {
        self.attributes & TIMESTAMP_TYPE_BIT != 0
    }
    /// True when the batch belongs to a transaction.
    pub fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL_BIT != 0
    }
    /// True for control (commit/abort marker) batches.
    pub fn is_control(&self) -> bool {
        self.attributes & CONTROL_BIT != 0
    }
    /// True when the batch came from an idempotent producer.
    pub fn has_producer_id(&self) -> bool {
        self.producer_id >= 0
    }
    /// Sequence of the last record, wrapping as Kafka does at i32::MAX.
    pub fn last_sequence(&self) -> i32 {
        if self.base_sequence < 0 {
            return -1;
        }
        let last = self.base_sequence as i64 + self.last_offset_delta as i64;
        (last % (i32::MAX as i64 + 1)) as i32
    }
}

/// CRC-32C of any bytes (the checksum RecordBatch v2 uses), for other files that want one.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Computes the CRC-32C a batch should carry.
pub fn compute_crc(batch: &[u8]) -> u32 {
    crc32c::crc32c(&batch[CRC_START..])
}

/// Parses and fully validates one batch that must fill `b` exactly, as a produce request
/// carries it: length, magic, CRC and record-count consistency.
pub fn validate(b: &[u8]) -> Result<BatchHeader, BatchError> {
    let h = BatchHeader::parse(b)?;
    if h.total_len() != b.len() {
        return Err(if h.total_len() > b.len() {
            BatchError::Truncated {
                need: h.total_len(),
                have: b.len(),
            }
        } else {
            BatchError::TrailingBytes
        });
    }
    let computed = compute_crc(b);
    if computed != h.crc {
        return Err(BatchError::CrcMismatch {
            stored: h.crc,
            computed,
        });
    }
    if h.records_count <= 0 {
        return Err(BatchError::Invalid("record batch holds no records"));
    }
    if h.last_offset_delta != h.records_count - 1 {
        return Err(BatchError::Invalid(
            "last offset delta does not match the record count",
        ));
    }
    Ok(h)
}

/// Stamps the offsets and epoch the log assigned. The CRC does not cover these fields.
pub fn assign(batch: &mut [u8], base_offset: i64, leader_epoch: i32) {
    batch[BASE_OFFSET..BASE_OFFSET + 8].copy_from_slice(&base_offset.to_be_bytes());
    batch[LEADER_EPOCH..LEADER_EPOCH + 4].copy_from_slice(&leader_epoch.to_be_bytes());
}

/// Marks a batch as LogAppendTime with `now_ms` as its timestamp and re-seals the CRC. The
/// batch is given as its first [`HEADER_LEN`] bytes (modified in place) and the rest, so the
/// record bytes never need copying.
pub fn set_log_append_time(head: &mut [u8], body: &[u8], now_ms: i64) {
    let attributes = i16_at(head, ATTRIBUTES) | TIMESTAMP_TYPE_BIT;
    head[ATTRIBUTES..ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    head[MAX_TIMESTAMP..MAX_TIMESTAMP + 8].copy_from_slice(&now_ms.to_be_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&head[CRC_START..HEADER_LEN]), body);
    head[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

/// A record for [`build`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewRecord {
    /// Record key.
    pub key: Option<Bytes>,
    /// Record value; `None` is a tombstone.
    pub value: Option<Bytes>,
    /// Create time (ms).
    pub timestamp: i64,
}

/// The idempotent-producer fields of a batch built with [`build`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerFields {
    /// Producer id.
    pub id: i64,
    /// Producer epoch.
    pub epoch: i16,
    /// Sequence of the first record.
    pub base_sequence: i32,
    /// Part of a transaction (the coordinator's offset commits in one).
    pub transactional: bool,
}

/// Encodes `records` as one RecordBatch v2 with offsets from 0, as a producer would send it.
pub fn build(
    records: &[NewRecord],
    producer: Option<ProducerFields>,
    compression: Compression,
) -> Result<Bytes, BatchError> {
    let (id, epoch, base_sequence, transactional) = producer.map_or((-1, -1, -1, false), |p| {
        (p.id, p.epoch, p.base_sequence, p.transactional)
    });
    let records: Vec<Record> = records
        .iter()
        .enumerate()
        .map(|(i, r)| Record {
            transactional,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: id,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // The encoder starts a new batch whenever offset - sequence changes, so the
            // sequence advances with the offset even when there is none (-1 for the first).
            sequence: base_sequence.wrapping_add(i as i32),
            timestamp: r.timestamp,
            key: r.key.clone(),
            value: r.value.clone(),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .map_err(|e| BatchError::Encode(e.to_string()))?;
    Ok(buf.freeze())
}

/// The codec a batch's attributes name (`None` for an id Kafka does not define).
pub fn codec_of(h: &BatchHeader) -> Option<Compression> {
    match h.compression() {
        0 => Some(Compression::None),
        1 => Some(Compression::Gzip),
        2 => Some(Compression::Snappy),
        3 => Some(Compression::Lz4),
        4 => Some(Compression::Zstd),
        _ => None,
    }
}

/// Re-encodes one validated batch with `codec` (a topic's `compression.type`): the same
/// records, offset deltas, timestamps, headers, producer fields and attributes, the same base
/// offset and leader epoch; only the codec and so the bytes change.
pub fn recompress(batch: &Bytes, codec: Compression) -> Result<Bytes, BatchError> {
    let h = BatchHeader::parse(batch)?;
    let mut buf = batch.clone();
    let set =
        RecordBatchDecoder::decode(&mut buf).map_err(|e| BatchError::Decode(e.to_string()))?;
    let mut out = BytesMut::with_capacity(batch.len());
    RecordBatchEncoder::encode(
        &mut out,
        &set.records,
        &RecordEncodeOptions {
            version: 2,
            compression: codec,
        },
    )
    .map_err(|e| BatchError::Encode(e.to_string()))?;
    let mut out = out.to_vec();
    // The encoder stamps the records' epoch; the batch keeps the one it came with.
    assign(&mut out, h.base_offset, h.partition_leader_epoch);
    match validate(&out) {
        Ok(_) => Ok(Bytes::from(out)),
        // The records of one batch share every batch field, so they encode as one batch.
        Err(_) => Err(BatchError::Encode(
            "records did not encode as one batch".into(),
        )),
    }
}

/// Walks the whole batches at the start of a buffer read from a log, stopping at the first
/// incomplete or invalid one.
pub struct Batches<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Batches<'a> {
    /// Starts at the beginning of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    /// Bytes consumed by the whole batches yielded so far.
    pub fn position(&self) -> usize {
        self.pos
    }
}

impl Iterator for Batches<'_> {
    type Item = (usize, BatchHeader);
    fn next(&mut self) -> Option<Self::Item> {
        let rest = &self.buf[self.pos..];
        let h = BatchHeader::parse(rest).ok()?;
        if h.total_len() > rest.len() {
            return None;
        }
        let at = self.pos;
        self.pos += h.total_len();
        Some((at, h))
    }
}

/// What a control batch marks (the type in its record key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlKind {
    /// The producer's transaction aborted: its records in this partition are dropped by
    /// read_committed consumers.
    Abort,
    /// The producer's transaction committed.
    Commit,
}

/// A transaction marker: the record of a control batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlRecord {
    /// Commit or abort.
    pub kind: ControlKind,
    /// The epoch of the transaction coordinator that wrote it (fences older coordinators).
    pub coordinator_epoch: i32,
}

/// Bytes of a marker batch: the header and one 17-byte record.
pub const CONTROL_BATCH_LEN: usize = HEADER_LEN + 17;

/// Builds a transaction marker batch for `producer_id`/`producer_epoch` at base offset 0 (the
/// log assigns the real one), stamped with `now_ms`, as Kafka writes them: transactional and
/// control attributes, no sequence, one record whose key is (version 0, type) and whose value
/// is (version 0, coordinator epoch).
pub fn control_batch(
    producer_id: i64,
    producer_epoch: i16,
    marker: ControlRecord,
    now_ms: i64,
) -> Vec<u8> {
    let mut b = vec![0u8; CONTROL_BATCH_LEN];
    let put = |b: &mut Vec<u8>, at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
    put(
        &mut b,
        BATCH_LENGTH,
        &((CONTROL_BATCH_LEN - LOG_OVERHEAD) as i32).to_be_bytes(),
    );
    put(&mut b, LEADER_EPOCH, &(-1i32).to_be_bytes());
    b[MAGIC] = 2;
    put(
        &mut b,
        ATTRIBUTES,
        &(TRANSACTIONAL_BIT | CONTROL_BIT).to_be_bytes(),
    );
    put(&mut b, BASE_TIMESTAMP, &now_ms.to_be_bytes());
    put(&mut b, MAX_TIMESTAMP, &now_ms.to_be_bytes());
    put(&mut b, PRODUCER_ID, &producer_id.to_be_bytes());
    put(&mut b, PRODUCER_EPOCH, &producer_epoch.to_be_bytes());
    put(&mut b, BASE_SEQUENCE, &(-1i32).to_be_bytes());
    put(&mut b, RECORDS_COUNT, &1i32.to_be_bytes());
    let kind: i16 = match marker.kind {
        ControlKind::Abort => 0,
        ControlKind::Commit => 1,
    };
    // Varints are zigzag-encoded: 16 -> 32, 4 -> 8, 6 -> 12; every one fits a byte.
    let mut r = vec![32u8, 0, 0, 0, 8, 0, 0];
    r.extend_from_slice(&kind.to_be_bytes());
    r.push(12);
    r.extend_from_slice(&0i16.to_be_bytes());
    r.extend_from_slice(&marker.coordinator_epoch.to_be_bytes());
    r.push(0);
    debug_assert_eq!(r.len(), 17);
    b[HEADER_LEN..].copy_from_slice(&r);
    let crc = compute_crc(&b);
    put(&mut b, CRC, &crc.to_be_bytes());
    b
}

/// Reads the marker of a control batch from its first bytes (the header and at least the
/// start of its record); `None` when the batch is not a control batch or its record is not a
/// marker this version knows.
pub fn control_record(batch: &[u8]) -> Option<ControlRecord> {
    let h = BatchHeader::parse(batch).ok()?;
    if !h.is_control() || h.compression() != 0 {
        return None;
    }
    let mut r = batch.get(HEADER_LEN..)?;
    let _len = read_varint(&mut r)?;
    let _attributes = take(&mut r, 1)?;
    let _ts_delta = read_varint(&mut r)?;
    let _offset_delta = read_varint(&mut r)?;
    if read_varint(&mut r)? < 4 {
        return None;
    }
    let key = take(&mut r, 4)?;
    let kind = match i16::from_be_bytes([key[2], key[3]]) {
        0 => ControlKind::Abort,
        1 => ControlKind::Commit,
        _ => return None,
    };
    // A value too short for the coordinator epoch (older writers) reads as epoch 0.
    let coordinator_epoch = match read_varint(&mut r) {
        Some(n) if n >= 6 => {
            take(&mut r, 6).map_or(0, |v| i32::from_be_bytes([v[2], v[3], v[4], v[5]]))
        }
        _ => 0,
    };
    Some(ControlRecord {
        kind,
        coordinator_epoch,
    })
}

fn take<'a>(r: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if r.len() < n {
        return None;
    }
    let (head, rest) = r.split_at(n);
    *r = rest;
    Some(head)
}

/// A zigzag varint (at most 5 bytes, as record fields are i32).
fn read_varint(r: &mut &[u8]) -> Option<i64> {
    read_zigzag(r, 5)
}

/// A zigzag varint of at most `max_bytes` bytes (5 for i32 fields, 10 for i64 ones).
fn read_zigzag(r: &mut &[u8], max_bytes: u32) -> Option<i64> {
    let mut v: u64 = 0;
    for i in 0..max_bytes {
        let byte = *take(r, 1)?.first()?;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(((v >> 1) as i64) ^ -((v & 1) as i64));
        }
    }
    None
}

/// One record of an uncompressed batch, as log compaction looks at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// Its offset (the batch's base offset plus its offset delta).
    pub offset: i64,
    /// Its timestamp (the batch's base timestamp plus its delta).
    pub timestamp: i64,
    /// Its key.
    pub key: Option<&'a [u8]>,
    /// Whether it has a value (false: a tombstone).
    pub has_value: bool,
    /// The record's bytes, length prefix included.
    pub raw: &'a [u8],
}

/// The records of an uncompressed batch; `None` for a compressed one (decode it first) or
/// for records that do not parse.
pub fn records(batch: &[u8]) -> Option<Vec<RecordView<'_>>> {
    let h = BatchHeader::parse(batch).ok()?;
    if h.compression() != 0 {
        return None;
    }
    let mut rest = batch.get(HEADER_LEN..h.total_len())?;
    let mut out = Vec::with_capacity(h.records_count.max(0) as usize);
    for _ in 0..h.records_count.max(0) {
        let start = rest;
        let len = usize::try_from(read_varint(&mut rest)?).ok()?;
        let prefix = start.len() - rest.len();
        let mut body = take(&mut rest, len)?;
        let raw = &start[..prefix + len];
        let _attributes = take(&mut body, 1)?;
        let ts_delta = read_zigzag(&mut body, 10)?;
        let offset_delta = read_varint(&mut body)?;
        let key = match read_varint(&mut body)? {
            n if n < 0 => None,
            n => Some(take(&mut body, usize::try_from(n).ok()?)?),
        };
        let has_value = read_varint(&mut body)? >= 0;
        out.push(RecordView {
            offset: h.base_offset + offset_delta,
            timestamp: h.base_timestamp.saturating_add(ts_delta),
            key,
            has_value,
            raw,
        });
    }
    rest.is_empty().then_some(out)
}

/// An uncompressed batch holding only `kept` of its records (in order), as log compaction
/// rewrites it: the base offset, the last offset delta, the timestamps and the producer fields
/// stay, so the kept records keep their offsets and the batch still tells its producer's last
/// sequence; the length, the record count and the CRC are the new ones.
pub fn retain(batch: &[u8], kept: &[RecordView<'_>]) -> Vec<u8> {
    let body: usize = kept.iter().map(|r| r.raw.len()).sum();
    let mut out = Vec::with_capacity(HEADER_LEN + body);
    out.extend_from_slice(&batch[..HEADER_LEN]);
    for r in kept {
        out.extend_from_slice(r.raw);
    }
    let len = (out.len() - LOG_OVERHEAD) as i32;
    out[BATCH_LENGTH..BATCH_LENGTH + 4].copy_from_slice(&len.to_be_bytes());
    out[RECORDS_COUNT..RECORDS_COUNT + 4].copy_from_slice(&(kept.len() as i32).to_be_bytes());
    let crc = compute_crc(&out);
    out[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recompress_changes_only_the_codec_and_keeps_every_record_and_field() {
        let mut records: Vec<NewRecord> = (0..50)
            .map(|i| NewRecord {
                key: Some(Bytes::from(format!("k{i}"))),
                value: (i % 7 != 0).then(|| Bytes::from(format!("value {i} ").repeat(20))),
                timestamp: 5_000 + i as i64 * 3,
            })
            .collect();
        records[3].value = None;
        let producer = ProducerFields {
            id: 42,
            epoch: 3,
            base_sequence: 100,
            transactional: true,
        };
        let codecs = [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ];
        for from in codecs {
            let mut original = build(&records, Some(producer), from).unwrap().to_vec();
            assign(&mut original, 0, 9);
            let original = Bytes::from(original);
            let before = validate(&original).unwrap();
            for to in codecs {
                let out = recompress(&original, to).unwrap();
                let after = validate(&out).expect("a valid batch with its CRC");
                assert_eq!(codec_of(&after), Some(to), "{from:?} -> {to:?}");
                assert_eq!(after.base_offset, before.base_offset);
                assert_eq!(after.partition_leader_epoch, 9);
                assert_eq!(after.last_offset_delta, before.last_offset_delta);
                assert_eq!(after.records_count, before.records_count);
                assert_eq!(after.producer_id, 42);
                assert_eq!(after.producer_epoch, 3);
                assert_eq!(after.base_sequence, 100);
                assert!(after.is_transactional());
                assert_eq!(after.max_timestamp, before.max_timestamp);
                let decode = |b: &Bytes| {
                    let mut b = b.clone();
                    RecordBatchDecoder::decode(&mut b).unwrap().records
                };
                let (a, b) = (decode(&original), decode(&out));
                assert_eq!(a.len(), b.len());
                for (x, y) in a.iter().zip(&b) {
                    assert_eq!(
                        (x.offset, x.timestamp, &x.key, &x.value, x.sequence),
                        (y.offset, y.timestamp, &y.key, &y.value, y.sequence)
                    );
                }
            }
        }
    }

    #[test]
    fn recompress_refuses_records_that_do_not_decompress() {
        let mut b = build(
            &[NewRecord {
                key: None,
                value: Some(Bytes::from_static(b"x")),
                timestamp: 1,
            }],
            None,
            Compression::Lz4,
        )
        .unwrap()
        .to_vec();
        // Garble the compressed body, then re-seal the CRC so only decompression fails.
        let n = b.len();
        for byte in &mut b[HEADER_LEN..n] {
            *byte ^= 0x5a;
        }
        let crc = compute_crc(&b);
        b[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
        let b = Bytes::from(b);
        assert!(validate(&b).is_ok());
        assert!(matches!(
            recompress(&b, Compression::Zstd),
            Err(BatchError::Decode(_))
        ));
    }

    pub(crate) fn encoded(n: i32, compression: Compression) -> Vec<u8> {
        let records: Vec<NewRecord> = (0..n)
            .map(|i| NewRecord {
                key: Some(Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(vec![b'v'; 100])),
                timestamp: 1_000 + i as i64,
            })
            .collect();
        let producer = ProducerFields {
            id: 7,
            epoch: 0,
            base_sequence: 0,
            transactional: false,
        };
        build(&records, Some(producer), compression)
            .unwrap()
            .to_vec()
    }

    #[test]
    fn validate_reads_header_of_encoded_batch() {
        let b = encoded(5, Compression::None);
        let h = validate(&b).unwrap();
        assert_eq!(h.records_count, 5);
        assert_eq!(h.last_offset_delta, 4);
        assert_eq!(h.producer_id, 7);
        assert_eq!(h.base_sequence, 0);
        assert_eq!(h.last_sequence(), 4);
        assert_eq!(h.max_timestamp, 1_004);
        assert_eq!(h.total_len(), b.len());
    }

    #[test]
    fn validate_accepts_every_codec() {
        for c in [
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let b = encoded(20, c);
            let h = validate(&b).unwrap();
            assert_eq!(h.compression(), c as i16, "{c:?}");
        }
    }

    #[test]
    fn validate_detects_flipped_byte() {
        let mut b = encoded(3, Compression::None);
        let last = b.len() - 1;
        b[last] ^= 0x40;
        assert!(matches!(validate(&b), Err(BatchError::CrcMismatch { .. })));
    }

    #[test]
    fn validate_rejects_truncation_and_trailing_bytes() {
        let b = encoded(3, Compression::None);
        assert!(matches!(
            validate(&b[..b.len() - 1]),
            Err(BatchError::Truncated { .. })
        ));
        let mut longer = b.clone();
        longer.push(0);
        assert_eq!(validate(&longer), Err(BatchError::TrailingBytes));
        assert!(matches!(
            validate(&b[..10]),
            Err(BatchError::Truncated { .. })
        ));
    }

    #[test]
    fn validate_rejects_legacy_magic() {
        let mut b = encoded(1, Compression::None);
        b[MAGIC] = 1;
        assert_eq!(validate(&b), Err(BatchError::UnsupportedMagic(1)));
    }

    #[test]
    fn assign_keeps_crc_valid() {
        let mut b = encoded(2, Compression::None);
        assign(&mut b, 1234, 9);
        let h = validate(&b).unwrap();
        assert_eq!((h.base_offset, h.partition_leader_epoch), (1234, 9));
        assert_eq!(h.last_offset(), 1235);
    }

    #[test]
    fn log_append_time_reseals_crc() {
        let mut b = encoded(2, Compression::Lz4);
        let (head, body) = b.split_at_mut(HEADER_LEN);
        set_log_append_time(head, body, 99_999);
        let h = validate(&b).unwrap();
        assert!(h.is_log_append_time());
        assert_eq!(h.max_timestamp, 99_999);
        assert_eq!(h.compression(), 3);
    }

    #[test]
    fn batches_stops_at_partial_tail() {
        let a = encoded(2, Compression::None);
        let b = encoded(3, Compression::None);
        let mut buf = a.clone();
        buf.extend_from_slice(&b);
        buf.extend_from_slice(&b[..20]);
        let mut it = Batches::new(&buf);
        let found: Vec<_> = it.by_ref().map(|(at, h)| (at, h.records_count)).collect();
        assert_eq!(found, vec![(0, 2), (a.len(), 3)]);
        assert_eq!(it.position(), a.len() + b.len());
    }

    #[test]
    fn a_control_batch_is_valid_and_reads_back_its_marker() {
        for kind in [ControlKind::Commit, ControlKind::Abort] {
            let m = ControlRecord {
                kind,
                coordinator_epoch: 7,
            };
            let b = control_batch(42, 3, m, 1_000);
            let h = validate(&b).unwrap();
            assert!(h.is_control() && h.is_transactional());
            assert_eq!(
                (h.producer_id, h.producer_epoch, h.records_count),
                (42, 3, 1)
            );
            assert_eq!(control_record(&b), Some(m));
        }
        let data = encoded(3, Compression::None);
        assert_eq!(control_record(&data), None, "a data batch holds no marker");
        let b = control_batch(
            1,
            0,
            ControlRecord {
                kind: ControlKind::Commit,
                coordinator_epoch: 0,
            },
            0,
        );
        assert_eq!(
            control_record(&b[..HEADER_LEN + 3]),
            None,
            "truncated record"
        );
    }

    #[test]
    fn records_of_a_batch_read_back_and_a_retained_batch_keeps_offsets_and_validates() {
        let records: Vec<NewRecord> = (0..5)
            .map(|i| NewRecord {
                key: (i != 2).then(|| Bytes::from(format!("k{i}"))),
                value: (i != 3).then(|| Bytes::from(format!("v{i}"))),
                timestamp: 1_000 + i,
            })
            .collect();
        let mut b = build(&records, None, Compression::None).unwrap().to_vec();
        assign(&mut b, 100, 0);
        let views = super::records(&b).unwrap();
        assert_eq!(views.len(), 5);
        assert_eq!(views[1].offset, 101);
        assert_eq!(views[4].timestamp, 1_004);
        assert_eq!(views[1].key, Some(&b"k1"[..]));
        assert_eq!(views[2].key, None);
        assert!(!views[3].has_value && views[4].has_value);
        let kept = [views[1], views[4]];
        let r = retain(&b, &kept);
        let h = validate_stored(&r);
        assert_eq!(
            (h.base_offset, h.last_offset(), h.records_count),
            (100, 104, 2)
        );
        let again = super::records(&r).unwrap();
        assert_eq!(
            again.iter().map(|v| (v.offset, v.key)).collect::<Vec<_>>(),
            vec![(101, Some(&b"k1"[..])), (104, Some(&b"k4"[..]))]
        );
        let compressed = build(&records, None, Compression::Lz4).unwrap();
        assert!(
            super::records(&compressed).is_none(),
            "compressed: decode first"
        );
        assert!(super::records(&b[..b.len() - 1]).is_none(), "truncated");
    }

    /// Parses a stored batch and checks its CRC (a retained batch's record count no longer
    /// matches its last offset delta, which `validate` demands of produced batches).
    fn validate_stored(b: &[u8]) -> BatchHeader {
        let h = BatchHeader::parse(b).unwrap();
        assert_eq!(h.total_len(), b.len());
        assert_eq!(compute_crc(b), h.crc);
        h
    }
}
