//! How committed offsets are written to the internal offsets log: one record per partition,
//! keyed so that the latest record for a key is the current value and an empty value deletes.
//!
//! Commits are written in Kafka's own record format, so Kafka's console consumer with its
//! offsets formatter reads `__consumer_offsets` on spate as on Kafka:
//!
//! Key:   i16 version (1) | i16 len + group | i16 len + topic | i32 partition
//! Value: i16 version (3) | i64 offset | i32 leader epoch | i16 len + metadata | i64 commit time
//!
//! Logs written by earlier spate versions hold commits in spate's first format, which is still
//! read: key `u8 1 | u8 1 | ...` (u16 lengths), value `u8 1 | i64 offset | i32 epoch | i64 time |
//! i32 len + metadata`.
//!
//! KIP-848 consumer groups live in the same log (see [`consumer`]): kind 2 is a group's
//! epoch, kind 3 one member's subscription, epoch and assignment.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use thiserror::Error;

use crate::offsets::Committed;

/// spate's own record formats start with this byte (offsets only in logs of earlier versions).
const VERSION: u8 = 1;
/// Kafka's OffsetCommitKey version written.
const KAFKA_KEY_VERSION: i16 = 1;
/// Kafka's OffsetCommitValue version written.
const KAFKA_VALUE_VERSION: i16 = 3;
const KIND_OFFSET: u8 = 1;
const KIND_CONSUMER_GROUP: u8 = 2;
const KIND_CONSUMER_MEMBER: u8 = 3;

pub mod consumer;

/// A record in the offsets log that cannot be read.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("unreadable offsets record: {0}")]
pub struct RecordError(pub(crate) &'static str);

/// Which partition's offset a record is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetKey {
    /// Group id.
    pub group: String,
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
}

pub(crate) fn put_str16(buf: &mut BytesMut, s: &str) -> Result<(), RecordError> {
    let len = u16::try_from(s.len()).map_err(|_| RecordError("string longer than 65535 bytes"))?;
    buf.put_u16(len);
    buf.put_slice(s.as_bytes());
    Ok(())
}

pub(crate) fn get_str16(buf: &mut Bytes) -> Result<String, RecordError> {
    if buf.remaining() < 2 {
        return Err(RecordError("truncated string length"));
    }
    let len = buf.get_u16() as usize;
    if buf.remaining() < len {
        return Err(RecordError("truncated string"));
    }
    String::from_utf8(buf.split_to(len).to_vec()).map_err(|_| RecordError("string is not UTF-8"))
}

impl OffsetKey {
    /// Encodes the key (Kafka's OffsetCommitKey, version 1).
    pub fn encode(&self) -> Result<Bytes, RecordError> {
        // Kafka's strings have a signed 16-bit length.
        if self.group.len() > i16::MAX as usize || self.topic.len() > i16::MAX as usize {
            return Err(RecordError("string longer than 32767 bytes"));
        }
        let mut buf = BytesMut::with_capacity(10 + self.group.len() + self.topic.len());
        buf.put_i16(KAFKA_KEY_VERSION);
        put_str16(&mut buf, &self.group)?;
        put_str16(&mut buf, &self.topic)?;
        buf.put_i32(self.partition);
        Ok(buf.freeze())
    }

    /// Decodes a key in Kafka's format (versions 0 and 1) or spate's first one.
    pub fn decode(mut buf: Bytes) -> Result<Self, RecordError> {
        match buf.get(..2) {
            Some([0, 0 | 1]) | Some([VERSION, KIND_OFFSET]) => buf.advance(2),
            _ => return Err(RecordError("unknown key version or kind")),
        }
        let group = get_str16(&mut buf)?;
        let topic = get_str16(&mut buf)?;
        if buf.remaining() != 4 {
            return Err(RecordError("bad partition field"));
        }
        Ok(Self {
            group,
            topic,
            partition: buf.get_i32(),
        })
    }
}

/// Encodes a committed offset (Kafka's OffsetCommitValue, version 3). Kafka's metadata is
/// not nullable: no metadata is stored as the empty string, as Kafka does.
pub fn encode_value(c: &Committed) -> Bytes {
    let meta = c.metadata.as_deref().unwrap_or("");
    // Metadata longer than an i16 length is refused before a commit gets here
    // (offset.metadata.max.bytes); cut rather than write a record Kafka's tools cannot read.
    let meta = &meta.as_bytes()[..meta.len().min(i16::MAX as usize)];
    let mut buf = BytesMut::with_capacity(24 + meta.len());
    buf.put_i16(KAFKA_VALUE_VERSION);
    buf.put_i64(c.offset);
    buf.put_i32(c.leader_epoch);
    buf.put_i16(meta.len() as i16);
    buf.put_slice(meta);
    buf.put_i64(c.commit_timestamp_ms);
    buf.freeze()
}

/// Decodes a committed offset: Kafka's OffsetCommitValue versions 0 to 3, or spate's first
/// format.
pub fn decode_value(mut buf: Bytes) -> Result<Committed, RecordError> {
    if buf.first() == Some(&VERSION) {
        return decode_first_value(buf);
    }
    if buf.remaining() < 2 {
        return Err(RecordError("truncated value version"));
    }
    let version = buf.get_i16();
    if !(0..=3).contains(&version) {
        return Err(RecordError("unknown value version"));
    }
    let need = |buf: &Bytes, n: usize| {
        if buf.remaining() < n {
            Err(RecordError("truncated value"))
        } else {
            Ok(())
        }
    };
    need(&buf, 8)?;
    let offset = buf.get_i64();
    let leader_epoch = if version >= 3 {
        need(&buf, 4)?;
        buf.get_i32()
    } else {
        -1
    };
    let metadata = get_str16(&mut buf)?;
    need(&buf, 8)?;
    let commit_timestamp_ms = buf.get_i64();
    if version == 1 {
        // The expire timestamp of version 1: retention is the broker's setting now.
        need(&buf, 8)?;
        buf.advance(8);
    }
    if buf.has_remaining() {
        return Err(RecordError("trailing bytes after the value"));
    }
    Ok(Committed {
        offset,
        leader_epoch,
        metadata: Some(metadata),
        commit_timestamp_ms,
    })
}

/// spate's first value format, still found in logs written before the Kafka format.
fn decode_first_value(mut buf: Bytes) -> Result<Committed, RecordError> {
    if buf.remaining() < 25 || buf.get_u8() != VERSION {
        return Err(RecordError("unknown value version"));
    }
    let offset = buf.get_i64();
    let leader_epoch = buf.get_i32();
    let commit_timestamp_ms = buf.get_i64();
    let len = buf.get_i32();
    let metadata = if len < 0 {
        None
    } else if buf.remaining() != len as usize {
        return Err(RecordError("bad metadata length"));
    } else {
        Some(String::from_utf8(buf.to_vec()).map_err(|_| RecordError("metadata is not UTF-8"))?)
    };
    Ok(Committed {
        offset,
        leader_epoch,
        metadata,
        commit_timestamp_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_and_value_round_trip() {
        let k = OffsetKey {
            group: "g1".into(),
            topic: "orders".into(),
            partition: 7,
        };
        assert_eq!(OffsetKey::decode(k.encode().unwrap()).unwrap(), k);
        for (metadata, read_back) in [
            (None, Some(String::new())),
            (Some(String::new()), Some(String::new())),
            (Some("meta".to_string()), Some("meta".to_string())),
        ] {
            let c = Committed {
                offset: 42,
                leader_epoch: 3,
                metadata,
                commit_timestamp_ms: 1_700_000_000_000,
            };
            let back = decode_value(encode_value(&c)).unwrap();
            assert_eq!(back.metadata, read_back);
            assert_eq!(
                (back.offset, back.leader_epoch, back.commit_timestamp_ms),
                (42, 3, 1_700_000_000_000)
            );
        }
    }

    #[test]
    fn records_are_in_kafkas_offset_commit_format() {
        let k = OffsetKey {
            group: "g".into(),
            topic: "t".into(),
            partition: 2,
        };
        assert_eq!(
            &k.encode().unwrap()[..],
            &[0, 1, 0, 1, b'g', 0, 1, b't', 0, 0, 0, 2]
        );
        let v = encode_value(&Committed {
            offset: 5,
            leader_epoch: 1,
            metadata: Some("m".into()),
            commit_timestamp_ms: 9,
        });
        let mut want = vec![0, 3];
        want.extend(5i64.to_be_bytes());
        want.extend(1i32.to_be_bytes());
        want.extend([0, 1, b'm']);
        want.extend(9i64.to_be_bytes());
        assert_eq!(&v[..], &want[..]);
    }

    #[test]
    fn commits_in_spates_first_format_are_still_read() {
        let mut key = vec![1, 1, 0, 2, b'g', b'1', 0, 1, b't'];
        key.extend(4i32.to_be_bytes());
        assert_eq!(
            OffsetKey::decode(Bytes::from(key)).unwrap(),
            OffsetKey {
                group: "g1".into(),
                topic: "t".into(),
                partition: 4
            }
        );
        let mut value = vec![1];
        value.extend(10i64.to_be_bytes());
        value.extend(2i32.to_be_bytes());
        value.extend(77i64.to_be_bytes());
        value.extend((-1i32).to_be_bytes());
        let c = decode_value(Bytes::from(value)).unwrap();
        assert_eq!(
            (c.offset, c.leader_epoch, c.metadata, c.commit_timestamp_ms),
            (10, 2, None, 77)
        );
    }

    #[test]
    fn kafkas_older_value_versions_are_read() {
        // Version 1 carries an expire timestamp after the commit time.
        let mut v1 = vec![0, 1];
        v1.extend(8i64.to_be_bytes());
        v1.extend([0, 0]);
        v1.extend(3i64.to_be_bytes());
        v1.extend(4i64.to_be_bytes());
        let c = decode_value(Bytes::from(v1)).unwrap();
        assert_eq!(
            (c.offset, c.leader_epoch, c.commit_timestamp_ms),
            (8, -1, 3)
        );
    }

    #[test]
    fn damaged_records_are_errors() {
        assert!(OffsetKey::decode(Bytes::from_static(&[1, 1, 0, 9, b'g'])).is_err());
        assert!(OffsetKey::decode(Bytes::from_static(&[2, 1])).is_err());
        assert!(OffsetKey::decode(Bytes::from_static(&[0, 1, 0, 9, b'g'])).is_err());
        assert!(decode_value(Bytes::from_static(&[1, 0, 0])).is_err());
        assert!(decode_value(Bytes::from_static(&[0, 3, 0, 0])).is_err());
        assert!(decode_value(Bytes::from_static(&[0, 9, 0, 0, 0, 0, 0, 0, 0, 0])).is_err());
    }
}
