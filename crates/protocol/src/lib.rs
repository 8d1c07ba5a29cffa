//! The Kafka wire protocol as spate speaks it, without any I/O.
//!
//! * [`frame`]: size-prefixed frames and their limits.
//! * [`header`]: request headers, including the raw prefix needed to answer requests we cannot
//!   parse.
//! * [`api`]: which API keys and versions spate implements (what ApiVersions advertises).
//! * [`batch`]: a zero-copy view of a RecordBatch v2 (offsets, counts, CRC-32C, attributes).
//!
//! Message bodies are the `kafka-protocol` crate's generated types, re-exported as [`messages`].

pub mod alloc;
pub mod api;
pub mod batch;
pub mod codec;
pub mod frame;
pub mod header;
pub mod newer;
pub mod request;

pub use kafka_protocol::error::ResponseError;
pub use kafka_protocol::messages;
pub use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
pub use kafka_protocol::records;

/// The partition Kafka places a coordinator key in (a group id, a transactional id):
/// `abs(javaHashCode(key)) % partitions`, with Java's UTF-16 string hash.
pub fn java_hash_partition(key: &str, partitions: usize) -> usize {
    let mut h: i32 = 0;
    for unit in key.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(i32::from(unit));
    }
    (h & 0x7fff_ffff) as usize % partitions.max(1)
}
