//! The seam between HTTP ingest and a schema registry in the same process: records in the
//! REST Proxy's schema'd formats (`application/vnd.kafka.{avro,jsonschema,protobuf}.v2+json`)
//! are handed to a [`RecordSchemas`] that registers or finds their schema and encodes them in
//! the registry's wire format. The registry crate does not depend on this one: the binary
//! wires an implementation in with [`crate::HttpState::set_record_schemas`].

use std::future::Future;
use std::pin::Pin;

/// The schema type a content type names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaFormat {
    /// `application/vnd.kafka.avro.v2+json`: Avro, records in Avro's JSON encoding.
    Avro,
    /// `application/vnd.kafka.jsonschema.v2+json`: JSON Schema, records as JSON.
    JsonSchema,
    /// `application/vnd.kafka.protobuf.v2+json`: Protobuf, records in Protobuf's JSON mapping.
    Protobuf,
}

impl SchemaFormat {
    /// The registry's name for the type (`schemaType`).
    pub fn registry_name(self) -> &'static str {
        match self {
            SchemaFormat::Avro => "AVRO",
            SchemaFormat::JsonSchema => "JSON",
            SchemaFormat::Protobuf => "PROTOBUF",
        }
    }
}

/// Keys or values of one request, to encode with one schema.
#[derive(Debug)]
pub struct EncodeRequest<'a> {
    /// The schema type.
    pub format: SchemaFormat,
    /// The subject (`<topic>-key` or `<topic>-value`, the TopicNameStrategy).
    pub subject: String,
    /// The schema text to register (or find) under the subject.
    pub schema: Option<String>,
    /// The id of a registered schema, when no text is given.
    pub schema_id: Option<i32>,
    /// The records' JSON texts, in body order.
    pub values: Vec<&'a str>,
    /// The ingest caller's `Authorization` header: a registry that must hand the registration
    /// to another node passes it on, and that node checks it again.
    pub authorization: Option<axum::http::HeaderValue>,
}

/// The encoded records.
#[derive(Debug)]
pub struct Encoded {
    /// The id of the schema they were written with.
    pub schema_id: i32,
    /// Each record in the wire format (magic byte, schema id, payload), in request order.
    pub values: Vec<Vec<u8>>,
}

/// Why records could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The registry refused the schema, or has no schema with the id (422 with the registry's
    /// error code).
    #[error("{message}")]
    Schema {
        /// The registry's error code (42201 invalid, 409 incompatible, 40403 unknown id, ...).
        code: u32,
        /// The registry's message.
        message: String,
    },
    /// The `index`-th record of the request does not fit the schema (422, 42203).
    #[error("{message}")]
    Record {
        /// Its position among the values handed over.
        index: usize,
        /// Why.
        message: String,
    },
    /// The registry cannot answer now (its store, or another node takes writes): 503.
    #[error("{0}")]
    Unavailable(String),
}

/// A future of the encoded records.
pub type EncodeFuture<'a> = Pin<Box<dyn Future<Output = Result<Encoded, SchemaError>> + Send + 'a>>;

/// A schema registry that HTTP ingest can register schemas with and encode records through.
pub trait RecordSchemas: Send + Sync {
    /// Registers (or finds) the request's schema under its subject, or takes the schema with
    /// its id, and encodes every value with it.
    fn encode<'a>(&'a self, request: EncodeRequest<'a>) -> EncodeFuture<'a>;
}
