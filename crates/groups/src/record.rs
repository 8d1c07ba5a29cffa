//! How committed offsets are written to the internal offsets log: one record per partition,
//! keyed so that the latest record for a key is the current value and an empty value deletes.
//!
//! Key:   u8 version (1) | u8 kind (1 = offset) | u16 len + group | u16 len + topic | i32 partition
//! Value: u8 version (1) | i64 offset | i32 leader epoch | i64 commit time | i32 len + metadata (-1 = null)
//!
//! KIP-848 consumer groups live in the same log (see [`consumer`]): kind 2 is a group's
//! epoch, kind 3 one member's subscription, epoch and assignment.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use thiserror::Error;

use crate::offsets::Committed;

const VERSION: u8 = 1;
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
    /// Encodes the key.
    pub fn encode(&self) -> Result<Bytes, RecordError> {
        let mut buf = BytesMut::with_capacity(10 + self.group.len() + self.topic.len());
        buf.put_u8(VERSION);
        buf.put_u8(KIND_OFFSET);
        put_str16(&mut buf, &self.group)?;
        put_str16(&mut buf, &self.topic)?;
        buf.put_i32(self.partition);
        Ok(buf.freeze())
    }

    /// Decodes a key.
    pub fn decode(mut buf: Bytes) -> Result<Self, RecordError> {
        if buf.remaining() < 2 || buf.get_u8() != VERSION || buf.get_u8() != KIND_OFFSET {
            return Err(RecordError("unknown key version or kind"));
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

/// Encodes a committed offset.
pub fn encode_value(c: &Committed) -> Bytes {
    let meta = c.metadata.as_deref();
    let mut buf = BytesMut::with_capacity(25 + meta.map_or(0, str::len));
    buf.put_u8(VERSION);
    buf.put_i64(c.offset);
    buf.put_i32(c.leader_epoch);
    buf.put_i64(c.commit_timestamp_ms);
    match meta {
        Some(m) => {
            buf.put_i32(m.len() as i32);
            buf.put_slice(m.as_bytes());
        }
        None => buf.put_i32(-1),
    }
    buf.freeze()
}

/// Decodes a committed offset.
pub fn decode_value(mut buf: Bytes) -> Result<Committed, RecordError> {
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
        for metadata in [None, Some(String::new()), Some("meta".to_string())] {
            let c = Committed {
                offset: 42,
                leader_epoch: 3,
                metadata,
                commit_timestamp_ms: 1_700_000_000_000,
            };
            assert_eq!(decode_value(encode_value(&c)).unwrap(), c);
        }
    }

    #[test]
    fn damaged_records_are_errors() {
        assert!(OffsetKey::decode(Bytes::from_static(&[1, 1, 0, 9, b'g'])).is_err());
        assert!(OffsetKey::decode(Bytes::from_static(&[2, 1])).is_err());
        assert!(decode_value(Bytes::from_static(&[1, 0, 0])).is_err());
    }
}
