//! Records to a Kafka RecordBatch v2, written straight into one buffer (no per-record
//! allocation), and the Java client's key partitioner, so HTTP and Kafka producers put a key
//! on the same partition.

use bytes::{BufMut, BytesMut};
use kafka_protocol::compression::Compressor;

/// Compression of the batches ingest writes (the codec bits of a batch's attributes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Codec {
    /// Records as they are.
    #[default]
    None,
    /// gzip (attributes 1).
    Gzip,
    /// Snappy, in Kafka's xerial framing (attributes 2).
    Snappy,
    /// LZ4 frames (attributes 3).
    Lz4,
    /// Zstandard (attributes 4).
    Zstd,
}

impl std::str::FromStr for Codec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "none" => Codec::None,
            "gzip" => Codec::Gzip,
            "snappy" => Codec::Snappy,
            "lz4" => Codec::Lz4,
            "zstd" => Codec::Zstd,
            other => {
                return Err(format!(
                    "unknown compression {other:?} (none, gzip, snappy, lz4 or zstd)"
                ))
            }
        })
    }
}

impl Codec {
    fn attribute(self) -> i16 {
        match self {
            Codec::None => 0,
            Codec::Gzip => 1,
            Codec::Snappy => 2,
            Codec::Lz4 => 3,
            Codec::Zstd => 4,
        }
    }
}

/// A header: name and value (`None`: a null value).
pub type Header<'a> = (
    std::borrow::Cow<'a, str>,
    Option<std::borrow::Cow<'a, [u8]>>,
);

/// One record to encode; byte slices borrow from the request body where they can.
#[derive(Debug, Default)]
pub struct Rec<'a> {
    /// Key bytes, `None` for a null key.
    pub key: Option<std::borrow::Cow<'a, [u8]>>,
    /// Value bytes, `None` for a null value (a tombstone).
    pub value: Option<std::borrow::Cow<'a, [u8]>>,
    /// Headers in order: name and value (`None`: null value).
    pub headers: Vec<Header<'a>>,
    /// The partition asked for, if any.
    pub partition: Option<i32>,
}

impl Rec<'_> {
    /// Bytes of key, value and headers: what max.message.bytes is held against per record.
    pub fn payload_len(&self) -> usize {
        self.key.as_ref().map_or(0, |k| k.len())
            + self.value.as_ref().map_or(0, |v| v.len())
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, |v| v.len()))
                .sum::<usize>()
    }
}

/// Size of a RecordBatch v2 header (everything before the first record).
pub const BATCH_OVERHEAD: usize = 61;

/// The Java client's `Utils.murmur2`: Kafka's key hash.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    // Java's switch falls through from case 3 to case 1.
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition the Java client's default partitioner (and librdkafka's
/// `murmur2_random`) picks for a non-null key: positive murmur2 modulo the partition count.
pub fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    ((murmur2(key) & 0x7fff_ffff) as u32 % partitions.max(1) as u32) as i32
}

fn zigzag32(n: i32) -> u64 {
    ((n << 1) ^ (n >> 31)) as u32 as u64
}

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

fn put_varint(buf: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

fn bytes_len(b: Option<&[u8]>) -> usize {
    match b {
        None => 1,
        Some(b) => varint_len(zigzag32(b.len() as i32)) + b.len(),
    }
}

fn put_bytes(buf: &mut BytesMut, b: Option<&[u8]>) {
    match b {
        None => put_varint(buf, zigzag32(-1)),
        Some(b) => {
            put_varint(buf, zigzag32(b.len() as i32));
            buf.put_slice(b);
        }
    }
}

/// Writes one record (offset delta `delta`, all records share the batch's timestamp).
fn put_record(buf: &mut BytesMut, delta: i32, r: &Rec<'_>) {
    let key = r.key.as_deref();
    let value = r.value.as_deref();
    let mut body = 1 // attributes
        + 1 // timestamp delta 0
        + varint_len(zigzag32(delta))
        + bytes_len(key)
        + bytes_len(value)
        + varint_len(zigzag32(r.headers.len() as i32));
    for (k, v) in &r.headers {
        body += bytes_len(Some(k.as_bytes())) + bytes_len(v.as_deref());
    }
    put_varint(buf, zigzag32(body as i32));
    buf.put_i8(0);
    put_varint(buf, 0);
    put_varint(buf, zigzag32(delta));
    put_bytes(buf, key);
    put_bytes(buf, value);
    put_varint(buf, zigzag32(r.headers.len() as i32));
    for (k, v) in &r.headers {
        put_bytes(buf, Some(k.as_bytes()));
        put_bytes(buf, v.as_deref());
    }
}

/// Encodes `records` (in order) as one RecordBatch v2 appended to `out`: no producer id,
/// CreateTime `timestamp_ms` for every record. Fails only when the compressor does.
pub fn encode<'r, 'a: 'r>(
    out: &mut BytesMut,
    records: impl ExactSizeIterator<Item = &'r Rec<'a>> + Clone,
    codec: Codec,
    timestamp_ms: i64,
) -> Result<(), String> {
    let count = records.len();
    let start = out.len();
    out.put_i64(0); // base offset: the broker assigns it
    out.put_i32(0); // batch length, filled in below
    out.put_i32(-1); // partition leader epoch: the broker stamps it
    out.put_i8(2); // magic
    out.put_u32(0); // CRC, filled in below
    let crc_from = out.len();
    out.put_i16(codec.attribute());
    out.put_i32(count.saturating_sub(1) as i32);
    out.put_i64(timestamp_ms);
    out.put_i64(timestamp_ms);
    out.put_i64(-1); // producer id
    out.put_i16(-1); // producer epoch
    out.put_i32(-1); // base sequence
    out.put_i32(count as i32);
    let write = |buf: &mut BytesMut| {
        for (i, r) in records.clone().enumerate() {
            put_record(buf, i as i32, r);
        }
    };
    let compressed: Result<(), String> = match codec {
        Codec::None => {
            write(out);
            Ok(())
        }
        Codec::Gzip => kafka_protocol::compression::Gzip::compress(out, |b: &mut BytesMut| {
            write(b);
            Ok(())
        })
        .map_err(|e| e.to_string()),
        Codec::Snappy => kafka_protocol::compression::Snappy::compress(out, |b: &mut BytesMut| {
            write(b);
            Ok(())
        })
        .map_err(|e| e.to_string()),
        Codec::Lz4 => kafka_protocol::compression::Lz4::compress(out, |b: &mut BytesMut| {
            write(b);
            Ok(())
        })
        .map_err(|e| e.to_string()),
        Codec::Zstd => kafka_protocol::compression::Zstd::compress(out, |b: &mut BytesMut| {
            write(b);
            Ok(())
        })
        .map_err(|e| e.to_string()),
    };
    compressed?;
    let batch_len = (out.len() - start - 12) as i32;
    out[start + 8..start + 12].copy_from_slice(&batch_len.to_be_bytes());
    let crc = crc32c::crc32c(&out[crc_from..]);
    out[crc_from - 4..crc_from].copy_from_slice(&crc.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    #[test]
    fn murmur2_matches_the_java_clients_vectors() {
        // Kafka's UtilsTest.testMurmur2 vectors; kafka-clients 4.3.1's Utils.murmur2 gives the
        // same values (checked with a three-line Java program against the jars
        // scripts/kafka/fetch.sh installs).
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (key, want) in cases {
            assert_eq!(murmur2(key), want, "{:?}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn key_partition_is_positive_murmur2_modulo_the_count() {
        // -973932308 & 0x7fffffff = 1173551340; mod 3 = 0, mod 7 = 6.
        assert_eq!(partition_for_key(b"21", 3), 1_173_551_340 % 3);
        assert_eq!(partition_for_key(b"21", 7), 1_173_551_340 % 7);
        assert_eq!(partition_for_key(b"", 1), 0);
        // Utils.toPositive(Utils.murmur2(key)) % 7 from kafka-clients 4.3.1.
        for (key, p7) in [
            (&b"21"[..], 3),
            (b"foobar", 0),
            (b"a-little-bit-long-string", 1),
            (b"a-little-bit-longer-string", 0),
            (b"abc", 4),
        ] {
            assert_eq!(partition_for_key(key, 7), p7);
        }
    }

    fn decode(bytes: &[u8]) -> Vec<kafka_protocol::records::Record> {
        let mut b = bytes::Bytes::copy_from_slice(bytes);
        kafka_protocol::records::RecordBatchDecoder::decode_all(&mut b)
            .expect("decodes")
            .into_iter()
            .flat_map(|s| s.records)
            .collect()
    }

    fn sample() -> Vec<Rec<'static>> {
        vec![
            Rec {
                key: Some(Cow::Borrowed(b"k1")),
                value: Some(Cow::Borrowed(b"hello")),
                headers: vec![
                    (Cow::Borrowed("h"), Some(Cow::Borrowed(b"v"))),
                    (Cow::Borrowed("n"), None),
                ],
                partition: None,
            },
            Rec {
                key: None,
                value: None,
                headers: vec![],
                partition: None,
            },
            Rec {
                key: Some(Cow::Owned(vec![0, 255, 7])),
                value: Some(Cow::Owned(vec![b'x'; 300])),
                headers: vec![],
                partition: None,
            },
        ]
    }

    #[test]
    fn every_codec_encodes_a_batch_the_broker_accepts_and_clients_decode() {
        for codec in [
            Codec::None,
            Codec::Gzip,
            Codec::Snappy,
            Codec::Lz4,
            Codec::Zstd,
        ] {
            let recs = sample();
            let mut out = BytesMut::new();
            encode(&mut out, recs.iter(), codec, 1_700_000_000_000).unwrap();
            let h = spate_protocol::batch::validate(&out).expect("valid batch");
            assert_eq!(h.records_count, 3, "{codec:?}");
            let got = decode(&out);
            assert_eq!(got.len(), 3);
            assert_eq!(got[0].key.as_deref(), Some(&b"k1"[..]));
            assert_eq!(got[0].value.as_deref(), Some(&b"hello"[..]));
            assert_eq!(got[0].headers.len(), 2);
            assert_eq!(got[0].timestamp, 1_700_000_000_000);
            assert!(got[1].key.is_none() && got[1].value.is_none());
            assert_eq!(got[2].key.as_deref(), Some(&[0u8, 255, 7][..]));
            assert_eq!(got[2].value.as_deref().map(<[u8]>::len), Some(300));
            assert_eq!(got[2].offset, 2);
        }
    }
}
