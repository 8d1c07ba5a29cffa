//! HTTP ingest's schema'd formats through the schema registry in this process: the one place
//! that knows both crates, so neither depends on the other.

use std::sync::Arc;

use spate_http::ingest::schemas::{
    EncodeFuture, EncodeRequest, Encoded, RecordSchemas, SchemaError, SchemaFormat,
};
use spate_schema_registry::schema::SchemaType;
use spate_schema_registry::{Registry, RegistryError};

/// The registry, as HTTP ingest sees it.
pub struct RegistrySchemas(pub Arc<Registry>);

impl RecordSchemas for RegistrySchemas {
    fn encode<'a>(&'a self, request: EncodeRequest<'a>) -> EncodeFuture<'a> {
        Box::pin(async move {
            let schema_type = match request.format {
                SchemaFormat::Avro => SchemaType::Avro,
                SchemaFormat::JsonSchema => SchemaType::Json,
                SchemaFormat::Protobuf => SchemaType::Protobuf,
            };
            let encoder = self
                .0
                .record_encoder(
                    &request.subject,
                    schema_type,
                    request.schema,
                    request.schema_id,
                )
                .await
                .map_err(refused)?;
            // Encoding thousands of records is CPU work: off the runtime's workers when large.
            let values = if request.values.len() > 256 {
                let owned: Vec<String> = request.values.iter().map(|v| v.to_string()).collect();
                let e = encoder.clone();
                tokio::task::spawn_blocking(move || {
                    let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
                    e.encode_all(&refs)
                })
                .await
                .map_err(|e| SchemaError::Unavailable(format!("encoding failed: {e}")))?
            } else {
                encoder.encode_all(&request.values)
            };
            let values =
                values.map_err(|(index, message)| SchemaError::Record { index, message })?;
            Ok(Encoded {
                schema_id: encoder.id(),
                values,
            })
        })
    }
}

/// A registry refusal as ingest answers it: the store or the leader unavailable is 503,
/// anything else is the registry's verdict on the schema.
fn refused(e: RegistryError) -> SchemaError {
    match e {
        RegistryError::Store(_) | RegistryError::Timeout(_) | RegistryError::NotLeader(_) => {
            SchemaError::Unavailable(format!("schema registry: {e}"))
        }
        e => SchemaError::Schema {
            code: e.error_code(),
            message: e.to_string(),
        },
    }
}
