//! Versions Kafka 4.3 added that the `kafka-protocol` crate (Kafka 4.1 schemas) lacks.
//!
//! * ListOffsets v11 (KIP-1023) only allows a new timestamp sentinel: its request and
//!   response are v10 on the wire, so they are decoded and encoded with v10's schema.
//! * DescribeLogDirs v5 (KIP-1066) has v4's request; its response adds one field,
//!   `IsCordoned`, after each log dir's usable bytes: [`DescribeLogDirsV5`] writes it.
//!
//! Clients that infer the broker's release from ApiVersions (kafka-python) look for exactly
//! these versions to recognise Kafka 4.2 and 4.3.

use anyhow::Result;
use kafka_protocol::messages::{ApiKey, DescribeLogDirsResponse};
use kafka_protocol::protocol::buf::ByteBufMut;
use kafka_protocol::protocol::Encodable;

/// The version whose schema a request or response of `key` at `version` has on the wire.
pub fn schema_version(key: ApiKey, version: i16) -> i16 {
    match (key, version) {
        (ApiKey::ListOffsets, 11) => 10,
        (ApiKey::DescribeLogDirs, 5) => 4,
        _ => version,
    }
}

/// A DescribeLogDirs v5 response: the v4 body with `IsCordoned` (always false: spate has no
/// cordoned dirs) after each result's capacity fields.
#[derive(Debug, Clone, PartialEq)]
pub struct DescribeLogDirsV5(pub DescribeLogDirsResponse);

/// v4's schema, which v5 shares for everything but the new field.
const BASE: i16 = 4;

fn varint_len(mut v: u32) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

fn put_varint<B: ByteBufMut>(buf: &mut B, mut v: u32) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

/// Compact arrays and strings carry their length plus one.
fn compact_len(n: usize) -> Result<u32> {
    u32::try_from(n + 1).map_err(|_| anyhow::anyhow!("{n} elements do not fit a compact length"))
}

impl Encodable for DescribeLogDirsV5 {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, _version: i16) -> Result<()> {
        let r = &self.0;
        buf.put_i32(r.throttle_time_ms);
        buf.put_i16(r.error_code);
        put_varint(buf, compact_len(r.results.len())?);
        for d in &r.results {
            buf.put_i16(d.error_code);
            put_varint(buf, compact_len(d.log_dir.len())?);
            buf.put_slice(d.log_dir.as_bytes());
            put_varint(buf, compact_len(d.topics.len())?);
            for t in &d.topics {
                t.encode(buf, BASE)?;
            }
            buf.put_i64(d.total_bytes);
            buf.put_i64(d.usable_bytes);
            buf.put_u8(0); // IsCordoned
            put_varint(buf, 0); // no tagged fields
        }
        put_varint(buf, 0);
        Ok(())
    }

    fn compute_size(&self, _version: i16) -> Result<usize> {
        let r = &self.0;
        let mut n = 4 + 2 + varint_len(compact_len(r.results.len())?);
        for d in &r.results {
            n += 2 + varint_len(compact_len(d.log_dir.len())?) + d.log_dir.len();
            n += varint_len(compact_len(d.topics.len())?);
            for t in &d.topics {
                n += t.compute_size(BASE)?;
            }
            n += 8 + 8 + 1 + 1;
        }
        Ok(n + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::messages::describe_log_dirs_response::{
        DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
    };
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::StrBytes;

    fn sample() -> DescribeLogDirsResponse {
        let mut p = DescribeLogDirsPartition::default();
        p.partition_index = 3;
        p.partition_size = 1234;
        let mut t = DescribeLogDirsTopic::default();
        t.name = TopicName(StrBytes::from_static_str("orders"));
        t.partitions = vec![p];
        let mut d = DescribeLogDirsResult::default();
        d.log_dir = StrBytes::from_static_str("/data");
        d.topics = vec![t];
        d.total_bytes = 1 << 40;
        d.usable_bytes = 1 << 39;
        let mut r = DescribeLogDirsResponse::default();
        r.results = vec![d];
        r
    }

    #[test]
    fn v5_is_v4_with_is_cordoned_after_each_dirs_capacity() {
        let r = sample();
        let mut v4 = BytesMut::new();
        r.encode(&mut v4, 4).unwrap();
        let mut v5 = BytesMut::new();
        let wrapped = DescribeLogDirsV5(r);
        wrapped.encode(&mut v5, 5).unwrap();
        assert_eq!(wrapped.compute_size(5).unwrap(), v5.len());
        assert_eq!(v5.len(), v4.len() + 1);
        // Identical up to the end of usable_bytes, then the false flag, then the same tail
        // (the result's and the response's empty tagged fields).
        let cut = v4.len() - 2;
        assert_eq!(&v5[..cut], &v4[..cut]);
        assert_eq!(v5[cut], 0);
        assert_eq!(&v5[cut + 1..], &v4[cut..]);
    }

    #[test]
    fn only_the_versions_kafka_added_without_new_fields_are_aliased() {
        assert_eq!(schema_version(ApiKey::ListOffsets, 11), 10);
        assert_eq!(schema_version(ApiKey::ListOffsets, 9), 9);
        assert_eq!(schema_version(ApiKey::DescribeLogDirs, 5), 4);
        assert_eq!(schema_version(ApiKey::Fetch, 18), 18);
    }
}
