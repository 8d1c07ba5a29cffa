//! A Schema Registry built into spate, speaking Confluent's Schema Registry REST API so the
//! serializers of every Kafka client library work against it unchanged.
//!
//! State lives in the compacted topic `_schemas` in Confluent's record format
//! ([`records`]); [`store::Store`] is that state rebuilt in memory by applying the records in
//! log order; [`Registry`] decides writes on it and appends them through the broker (acks=all)
//! before applying them like any other record, so a restart (or another node) rebuilds exactly
//! the state that was served. Avro ([`avro`]), JSON Schema ([`json_schema`]) and Protobuf
//! ([`protobuf`]) are parsed and checked for compatibility at the seven Confluent levels ([`compat`]); [`api`] is the HTTP
//! side.

pub mod access;
pub mod api;
pub mod avro;
pub mod compat;
pub mod decode;
pub mod encode;
pub mod error;
pub mod forward;
pub mod json_schema;
pub mod log;
pub mod metrics;
pub mod protobuf;
pub mod records;
pub mod registry;
pub mod schema;
pub mod store;

pub use api::{router, serve};
pub use error::RegistryError;
pub use log::{BrokerLog, MemoryLog, SchemaLog};
pub use registry::{Registry, Settings};

#[cfg(test)]
mod tests;
