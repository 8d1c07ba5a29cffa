//! The records of `__transaction_state`, in Kafka's format so its tools and formatters read
//! them:
//!
//! Key:   i16 version (0) | i16 len + transactional id
//! Value: i16 version (0) | i64 producer id | i16 producer epoch | i32 timeout ms |
//!        i8 status | i32 count (-1: null) of { i16 len + topic | i32 count | i32 partition... } |
//!        i64 last update ms | i64 start ms
//!
//! A record with no value (a tombstone) forgets the id. Hand-written because these are
//! Kafka's internal (non-protocol) schemas, which the protocol crate does not generate.

use std::collections::BTreeSet;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use thiserror::Error;

use crate::state::{TxnMeta, TxnStatus};

const KEY_VERSION: i16 = 0;
const VALUE_VERSION: i16 = 0;

/// A record of the transaction log that cannot be read or written.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("transaction log record: {0}")]
pub struct TxnRecordError(&'static str);

/// The key of a transactional id's record.
pub fn encode_key(txn_id: &str) -> Result<Bytes, TxnRecordError> {
    let mut b = BytesMut::with_capacity(4 + txn_id.len());
    b.put_i16(KEY_VERSION);
    put_str(&mut b, txn_id)?;
    Ok(b.freeze())
}

/// The value of a transactional id's record.
pub fn encode_value(m: &TxnMeta) -> Result<Bytes, TxnRecordError> {
    let mut b = BytesMut::with_capacity(64 + m.partitions.len() * 24);
    b.put_i16(VALUE_VERSION);
    b.put_i64(m.producer_id);
    b.put_i16(m.producer_epoch);
    b.put_i32(m.timeout_ms);
    b.put_i8(m.status as i8);
    // Grouped by topic, as Kafka writes them.
    let mut topics: Vec<(&str, Vec<i32>)> = Vec::new();
    for (t, p) in &m.partitions {
        match topics.last_mut() {
            Some((last, ps)) if *last == t.as_str() => ps.push(*p),
            _ => topics.push((t.as_str(), vec![*p])),
        }
    }
    b.put_i32(topics.len() as i32);
    for (t, ps) in topics {
        put_str(&mut b, t)?;
        b.put_i32(ps.len() as i32);
        for p in ps {
            b.put_i32(p);
        }
    }
    b.put_i64(m.last_update_ms);
    b.put_i64(m.start_ms);
    Ok(b.freeze())
}

/// The transactional id of a record key.
pub fn decode_key(mut b: Bytes) -> Result<String, TxnRecordError> {
    if get_i16(&mut b)? != KEY_VERSION {
        return Err(TxnRecordError("unknown key version"));
    }
    get_str(&mut b)
}

/// A record value back into metadata.
pub fn decode_value(mut b: Bytes) -> Result<TxnMeta, TxnRecordError> {
    let version = get_i16(&mut b)?;
    if version != VALUE_VERSION {
        return Err(TxnRecordError("unknown value version"));
    }
    let producer_id = get_i64(&mut b)?;
    let producer_epoch = get_i16(&mut b)?;
    let timeout_ms = get_i32(&mut b)?;
    let status = need(&b, 1).map(|_| b.get_i8())?;
    let status = TxnStatus::from_i8(status).ok_or(TxnRecordError("unknown status"))?;
    let mut partitions = BTreeSet::new();
    let topics = get_i32(&mut b)?;
    // Each topic takes at least 6 bytes, so a hostile count fails on the bytes, not memory.
    for _ in 0..topics.max(0) {
        let topic = get_str(&mut b)?;
        let n = get_i32(&mut b)?;
        for _ in 0..n.max(0) {
            partitions.insert((topic.clone(), get_i32(&mut b)?));
        }
    }
    let last_update_ms = get_i64(&mut b)?;
    let start_ms = get_i64(&mut b)?;
    Ok(TxnMeta {
        producer_id,
        producer_epoch,
        timeout_ms,
        status,
        partitions,
        last_update_ms,
        start_ms,
    })
}

fn put_str(b: &mut BytesMut, s: &str) -> Result<(), TxnRecordError> {
    let len = i16::try_from(s.len()).map_err(|_| TxnRecordError("string over 32767 bytes"))?;
    b.put_i16(len);
    b.put_slice(s.as_bytes());
    Ok(())
}

fn need(b: &Bytes, n: usize) -> Result<(), TxnRecordError> {
    if b.remaining() < n {
        Err(TxnRecordError("truncated"))
    } else {
        Ok(())
    }
}

fn get_i16(b: &mut Bytes) -> Result<i16, TxnRecordError> {
    need(b, 2).map(|_| b.get_i16())
}

fn get_i32(b: &mut Bytes) -> Result<i32, TxnRecordError> {
    need(b, 4).map(|_| b.get_i32())
}

fn get_i64(b: &mut Bytes) -> Result<i64, TxnRecordError> {
    need(b, 8).map(|_| b.get_i64())
}

fn get_str(b: &mut Bytes) -> Result<String, TxnRecordError> {
    let len = get_i16(b)?;
    let len = usize::try_from(len).map_err(|_| TxnRecordError("negative string length"))?;
    need(b, len)?;
    String::from_utf8(b.split_to(len).to_vec()).map_err(|_| TxnRecordError("string not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_damage_is_an_error() {
        let m = TxnMeta {
            producer_id: 42,
            producer_epoch: 3,
            timeout_ms: 60_000,
            status: TxnStatus::Ongoing,
            partitions: [
                ("a".to_string(), 0),
                ("a".to_string(), 2),
                ("b".to_string(), 1),
            ]
            .into_iter()
            .collect(),
            last_update_ms: 1_000,
            start_ms: 900,
        };
        let v = encode_value(&m).unwrap();
        assert_eq!(decode_value(v.clone()).unwrap(), m);
        assert_eq!(decode_key(encode_key("tx-1").unwrap()).unwrap(), "tx-1");
        for cut in 0..v.len() {
            assert!(decode_value(v.slice(..cut)).is_err(), "cut at {cut}");
        }
        let mut bad = v.to_vec();
        bad[1] = 9;
        assert!(decode_value(Bytes::from(bad)).is_err(), "unknown version");
        assert!(encode_key(&"x".repeat(40_000)).is_err());
    }
}
