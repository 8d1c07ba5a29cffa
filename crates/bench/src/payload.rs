//! Message construction: keys, bodies and the 36-byte header that carries the run id,
//! producer id, sequence, send timestamp and a CRC-32C for validation and round-trip latency.
//!
//! Bodies are slices of one pre-generated pool at an offset derived from (producer, seq), so
//! building a message costs at most one memcpy and the consumer can regenerate the exact bytes
//! it expects without the producer having to remember anything.

use crate::config::{KeyPattern, PayloadPattern};

/// Bytes of header at the start of every message when headers are on.
pub const HEADER_LEN: usize = 36;
/// "SPB1": marks messages written by spate-bench with this header layout.
const MAGIC: u32 = 0x5350_4231;
/// Pool size beyond one message: large enough that a batch rarely contains the same bytes
/// twice (which would flatter compressors).
const POOL_EXTRA: usize = 8 * 1024 * 1024;
/// The key used by `KeyPattern::Fixed`.
pub const FIXED_KEY: &[u8] = b"spate-bench-key";

/// splitmix64: a tiny, fast, well-mixed PRNG step (we need speed and determinism, not crypto).
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The decoded message header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Random id of the run that wrote the message (older data in a topic is "foreign").
    pub run_id: u32,
    /// Which producer (0-based) wrote it.
    pub producer: u32,
    /// Total message length, to detect truncation.
    pub total_len: u32,
    /// Per-producer sequence number starting at 0.
    pub seq: u64,
    /// Send time in ns since the run's monotonic epoch.
    pub send_ts_ns: u64,
    /// CRC-32C over header bytes 0..32, the body and the key.
    pub crc: u32,
}

/// What checking a consumed message found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// Byte-exact as written.
    Valid(Header),
    /// Not written by this run (old data, another tool); ignored.
    Foreign,
    /// Written by this run but damaged; the header is included when it was readable.
    Corrupt {
        /// What is wrong.
        reason: String,
        /// The header if it could be parsed.
        header: Option<Header>,
    },
}

/// Builds and checks messages for one run.
#[derive(Debug)]
pub struct MessageFactory {
    pool: Vec<u8>,
    run_id: u32,
    message_size: usize,
    key_pattern: KeyPattern,
    /// With `KeyPattern::Sequential`, keys are `seq % key_space`.
    key_space: Option<u64>,
    with_header: bool,
}

/// Room for the longest key we generate (decimal u64 = 20 digits).
pub type KeyBuf = [u8; 24];

impl MessageFactory {
    /// A factory for `message_size`-byte values; `with_header` embeds the header.
    pub fn new(
        run_id: u32,
        message_size: usize,
        key_pattern: KeyPattern,
        payload_pattern: PayloadPattern,
        with_header: bool,
    ) -> Self {
        let pool = make_pool(payload_pattern, message_size + POOL_EXTRA, run_id);
        Self {
            pool,
            run_id,
            message_size,
            key_pattern,
            key_space: None,
            with_header: with_header && message_size >= HEADER_LEN,
        }
    }

    /// Bounds sequential keys to `key_space` distinct values (`seq % n`); `None` (or 0)
    /// leaves them unbounded.
    pub fn with_key_space(mut self, key_space: Option<u64>) -> Self {
        self.key_space = key_space.filter(|n| *n > 0);
        self
    }

    /// The run id written into headers.
    pub fn run_id(&self) -> u32 {
        self.run_id
    }

    /// True when messages carry the header.
    pub fn with_header(&self) -> bool {
        self.with_header
    }

    /// Message value size.
    pub fn message_size(&self) -> usize {
        self.message_size
    }

    /// The body bytes expected after the header for (producer, seq).
    fn body(&self, producer: u32, seq: u64, len: usize) -> &[u8] {
        let span = (self.pool.len() - len + 1) as u64;
        let start = (mix64(((producer as u64) << 40) ^ seq) % span) as usize;
        &self.pool[start..start + len]
    }

    /// The key of (producer, seq), written into `buf`.
    pub fn key<'a>(&self, producer: u32, seq: u64, buf: &'a mut KeyBuf) -> Option<&'a [u8]> {
        match self.key_pattern {
            KeyPattern::None => None,
            KeyPattern::Fixed => {
                buf[..FIXED_KEY.len()].copy_from_slice(FIXED_KEY);
                Some(&buf[..FIXED_KEY.len()])
            }
            KeyPattern::Random => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let mut v = mix64(seq ^ ((producer as u64) << 48) ^ 0x5EED);
                for slot in buf[..16].iter_mut().rev() {
                    *slot = HEX[(v & 0xF) as usize];
                    v >>= 4;
                }
                Some(&buf[..16])
            }
            KeyPattern::Sequential => {
                let mut v = self.key_space.map_or(seq, |n| seq % n);
                let mut i = buf.len();
                loop {
                    i -= 1;
                    buf[i] = b'0' + (v % 10) as u8;
                    v /= 10;
                    if v == 0 {
                        break;
                    }
                }
                Some(&buf[i..])
            }
        }
    }

    /// The value of (producer, seq) sent at `send_ts_ns`. Without a header this borrows the
    /// pool directly (no copy); with one it is assembled in `scratch`.
    pub fn value<'a>(
        &'a self,
        producer: u32,
        seq: u64,
        send_ts_ns: u64,
        key: Option<&[u8]>,
        scratch: &'a mut Vec<u8>,
    ) -> &'a [u8] {
        if !self.with_header {
            return self.body(producer, seq, self.message_size);
        }
        let body = self.body(producer, seq, self.message_size - HEADER_LEN);
        scratch.clear();
        scratch.extend_from_slice(&MAGIC.to_be_bytes());
        scratch.extend_from_slice(&self.run_id.to_be_bytes());
        scratch.extend_from_slice(&producer.to_be_bytes());
        scratch.extend_from_slice(&(self.message_size as u32).to_be_bytes());
        scratch.extend_from_slice(&seq.to_be_bytes());
        scratch.extend_from_slice(&send_ts_ns.to_be_bytes());
        let crc = checksum(&scratch[..32], body, key);
        scratch.extend_from_slice(&crc.to_be_bytes());
        scratch.extend_from_slice(body);
        scratch
    }

    /// Reads the header if `value` has one written by this run (cheap; no verification).
    pub fn header(&self, value: &[u8]) -> Option<Header> {
        let h = parse_header(value)?;
        (h.run_id == self.run_id).then_some(h)
    }

    /// Verifies a consumed message byte for byte against what (producer, seq) must contain.
    pub fn check(&self, key: Option<&[u8]>, value: &[u8]) -> Check {
        let header = match parse_header(value) {
            Some(h) => h,
            None => {
                // Could be anything; only call it corrupt when it claims to be ours.
                return if value.len() >= 8 && value[4..8] == self.run_id.to_be_bytes() {
                    Check::Corrupt {
                        reason: "bad magic".into(),
                        header: None,
                    }
                } else {
                    Check::Foreign
                };
            }
        };
        if header.run_id != self.run_id {
            return Check::Foreign;
        }
        let corrupt = |reason: String| Check::Corrupt {
            reason,
            header: Some(header),
        };
        if header.total_len as usize != value.len() || value.len() != self.message_size {
            return corrupt(format!(
                "length {} (header says {}, expected {})",
                value.len(),
                header.total_len,
                self.message_size
            ));
        }
        let body = &value[HEADER_LEN..];
        if checksum(&value[..32], body, key) != header.crc {
            return corrupt("checksum mismatch".into());
        }
        if body != self.body(header.producer, header.seq, body.len()) {
            return corrupt("body differs from what was sent".into());
        }
        let mut kb = KeyBuf::default();
        if key != self.key(header.producer, header.seq, &mut kb) {
            return corrupt("key differs from what was sent".into());
        }
        Check::Valid(header)
    }
}

/// CRC-32C over the first 32 header bytes, the body and the key.
fn checksum(head: &[u8], body: &[u8], key: Option<&[u8]>) -> u32 {
    let crc = crc32c::crc32c_append(crc32c::crc32c(head), body);
    match key {
        Some(k) => crc32c::crc32c_append(crc, k),
        None => crc,
    }
}

/// Parses the header fields; `None` when the value is too short or the magic is wrong.
pub fn parse_header(value: &[u8]) -> Option<Header> {
    if value.len() < HEADER_LEN {
        return None;
    }
    let u32_at =
        |i: usize| u32::from_be_bytes([value[i], value[i + 1], value[i + 2], value[i + 3]]);
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&value[i..i + 8]);
        u64::from_be_bytes(b)
    };
    if u32_at(0) != MAGIC {
        return None;
    }
    Some(Header {
        run_id: u32_at(4),
        producer: u32_at(8),
        total_len: u32_at(12),
        seq: u64_at(16),
        send_ts_ns: u64_at(24),
        crc: u32_at(32),
    })
}

/// Words for the `text` pattern: compresses roughly like application logs.
const WORDS: &[&str] = &[
    "the",
    "broker",
    "event",
    "stream",
    "partition",
    "offset",
    "leader",
    "replica",
    "commit",
    "consumer",
    "producer",
    "record",
    "batch",
    "latency",
    "request",
    "response",
    "user",
    "order",
    "payment",
    "shipped",
    "status",
    "ok",
    "error",
    "warn",
    "info",
    "id",
    "value",
    "timestamp",
    "session",
    "checkout",
    "cart",
    "region",
    "eu-west",
    "us-east",
    "200",
    "404",
];

/// Fills the body pool for a pattern, deterministically from the run id.
fn make_pool(pattern: PayloadPattern, len: usize, seed: u32) -> Vec<u8> {
    let mut state = seed as u64 ^ 0xA076_1D64_78BD_642F;
    let mut next = move || {
        state = state.wrapping_add(1);
        mix64(state)
    };
    match pattern {
        PayloadPattern::Zeros => vec![0u8; len],
        PayloadPattern::Random => {
            let mut v = Vec::with_capacity(len + 8);
            while v.len() < len {
                v.extend_from_slice(&next().to_le_bytes());
            }
            v.truncate(len);
            v
        }
        PayloadPattern::Text => {
            let mut v = Vec::with_capacity(len + 16);
            while v.len() < len {
                let w = WORDS[(next() % WORDS.len() as u64) as usize];
                v.extend_from_slice(w.as_bytes());
                v.push(if next() % 12 == 0 { b'\n' } else { b' ' });
            }
            v.truncate(len);
            v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn factory(keys: KeyPattern) -> MessageFactory {
        MessageFactory::new(7, 100, keys, PayloadPattern::Random, true)
    }

    #[test]
    fn roundtrip_header_and_check() {
        for keys in [
            KeyPattern::None,
            KeyPattern::Random,
            KeyPattern::Sequential,
            KeyPattern::Fixed,
        ] {
            let f = factory(keys);
            let mut kb = KeyBuf::default();
            let mut scratch = Vec::new();
            let key = f.key(3, 12345, &mut kb).map(|k| k.to_vec());
            let value = f
                .value(3, 12345, 999, key.as_deref(), &mut scratch)
                .to_vec();
            assert_eq!(value.len(), 100);
            let h = match f.check(key.as_deref(), &value) {
                Check::Valid(h) => h,
                other => panic!("expected valid, got {other:?}"),
            };
            assert_eq!((h.producer, h.seq, h.send_ts_ns), (3, 12345, 999));
        }
    }

    #[test]
    fn detects_corruption_and_foreign() {
        let f = factory(KeyPattern::Sequential);
        let mut kb = KeyBuf::default();
        let mut scratch = Vec::new();
        let key = f.key(0, 5, &mut kb).map(|k| k.to_vec());
        let good = f.value(0, 5, 1, key.as_deref(), &mut scratch).to_vec();

        let mut flipped = good.clone();
        flipped[80] ^= 1;
        assert!(matches!(
            f.check(key.as_deref(), &flipped),
            Check::Corrupt { .. }
        ));
        assert!(matches!(
            f.check(key.as_deref(), &good[..99]),
            Check::Corrupt { .. }
        ));
        assert!(matches!(f.check(Some(b"6"), &good), Check::Corrupt { .. }));
        let other_run = MessageFactory::new(8, 100, KeyPattern::None, PayloadPattern::Zeros, true);
        assert_eq!(other_run.check(key.as_deref(), &good), Check::Foreign);
        assert_eq!(f.check(None, b"hello"), Check::Foreign);
    }

    #[test]
    fn keys_follow_pattern() {
        let mut kb = KeyBuf::default();
        assert_eq!(factory(KeyPattern::None).key(0, 1, &mut kb), None);
        assert_eq!(
            factory(KeyPattern::Sequential).key(0, 1234, &mut kb),
            Some(&b"1234"[..])
        );
        assert_eq!(
            factory(KeyPattern::Fixed).key(9, 1, &mut kb),
            Some(FIXED_KEY)
        );
        let r = factory(KeyPattern::Random)
            .key(0, 1, &mut kb)
            .map(|k| k.to_vec());
        assert_eq!(r.as_ref().map(|k| k.len()), Some(16));
    }

    #[test]
    fn key_space_wraps_sequential_keys() {
        let f = factory(KeyPattern::Sequential).with_key_space(Some(1000));
        let mut kb = KeyBuf::default();
        assert_eq!(f.key(0, 7, &mut kb), Some(&b"7"[..]));
        assert_eq!(f.key(0, 1007, &mut kb), Some(&b"7"[..]));
        assert_eq!(f.key(2, 999_999, &mut kb), Some(&b"999"[..]));
        assert_eq!(f.key(0, 1000, &mut kb), Some(&b"0"[..]));
        let distinct: std::collections::HashSet<Vec<u8>> = (0..5000)
            .map(|seq| f.key(0, seq, &mut kb).expect("keyed").to_vec())
            .collect();
        assert_eq!(distinct.len(), 1000);
        // Messages with wrapped keys still validate (the check regenerates the same key).
        let mut scratch = Vec::new();
        let key = f.key(1, 4321, &mut kb).map(|k| k.to_vec());
        let value = f.value(1, 4321, 5, key.as_deref(), &mut scratch).to_vec();
        assert!(matches!(f.check(key.as_deref(), &value), Check::Valid(_)));
        let unbounded = factory(KeyPattern::Sequential).with_key_space(None);
        assert_eq!(unbounded.key(0, 1007, &mut kb), Some(&b"1007"[..]));
    }

    #[test]
    fn headerless_values_borrow_the_pool() {
        let f = MessageFactory::new(1, 64, KeyPattern::None, PayloadPattern::Zeros, false);
        let mut scratch = Vec::new();
        let v = f.value(0, 0, 0, None, &mut scratch);
        assert_eq!(v, &[0u8; 64][..]);
        assert!(scratch.is_empty());
        let t = MessageFactory::new(1, 64, KeyPattern::None, PayloadPattern::Text, false);
        assert!(t
            .value(0, 0, 0, None, &mut scratch)
            .iter()
            .all(|b| b.is_ascii()));
    }
}
