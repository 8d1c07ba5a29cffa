//! HTTP ingest's schema'd formats through the schema registry in this process: the one place
//! that knows both crates, so neither depends on the other.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderValue, Method};
use spate_http::ingest::schemas::{
    EncodeFuture, EncodeRequest, Encoded, RecordSchemas, SchemaError, SchemaFormat,
};
use spate_schema_registry::forward::{self, Forward, ForwardRequest, Writer};
use spate_schema_registry::schema::SchemaType;
use spate_schema_registry::{Registry, RegistryError};

/// How often a node polls its copy of `_schemas` for a schema another node just registered.
const REPLICATED_POLL: Duration = Duration::from_millis(20);

/// The registry, as HTTP ingest sees it.
pub struct RegistrySchemas {
    /// The registry in this process.
    pub registry: Arc<Registry>,
    /// Sends a registration to the node leading `_schemas` when this one does not (a
    /// standalone node has none).
    pub forward: Option<Arc<dyn Forward>>,
}

impl RegistrySchemas {
    /// Registers `schema` under `subject` on `node`, which leads `_schemas`, with the ingest
    /// caller's credentials (checked again there), and waits until this node's copy of
    /// `_schemas` holds the id it answers, so the records can be encoded here.
    async fn register_on(
        &self,
        forwarder: &dyn Forward,
        node: i32,
        subject: &str,
        schema_type: SchemaType,
        schema: &str,
        authorization: Option<HeaderValue>,
    ) -> Result<i32, SchemaError> {
        let body = serde_json::json!({ "schema": schema, "schemaType": schema_type.name() });
        let request = ForwardRequest {
            method: Method::POST,
            path_and_query: format!("/subjects/{subject}/versions"),
            content_type: Some(HeaderValue::from_static(
                "application/vnd.schemaregistry.v1+json",
            )),
            authorization,
            body: body.to_string().into(),
        };
        self.registry.metrics.forwarded.inc();
        let answer = forwarder
            .forward(node, request, forward::FORWARD_TIMEOUT)
            .await
            .map_err(|why| {
                self.registry.metrics.forward_failures.inc();
                SchemaError::Unavailable(format!(
                    "schema registry: registering with node {node}, which leads the _schemas topic, failed: {why}"
                ))
            })?;
        let json: serde_json::Value = serde_json::from_slice(&answer.body).unwrap_or_default();
        if answer.status != 200 {
            let message = json["message"].as_str().map_or_else(
                || format!("node {node} answered {}", answer.status),
                str::to_string,
            );
            return Err(
                match json["error_code"]
                    .as_u64()
                    .and_then(|c| u32::try_from(c).ok())
                {
                    Some(code) if answer.status < 500 => SchemaError::Schema { code, message },
                    _ => SchemaError::Unavailable(format!("schema registry: {message}")),
                },
            );
        }
        let id = json["id"]
            .as_i64()
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| {
                SchemaError::Unavailable(format!(
                    "schema registry: node {node} registered the schema but answered no id"
                ))
            })?;
        let deadline = Instant::now() + forward::FORWARD_TIMEOUT;
        while self.registry.schema_by_id(id).is_err() {
            if Instant::now() >= deadline {
                return Err(SchemaError::Unavailable(format!(
                    "schema registry: schema {id}, registered on node {node}, has not reached this node's copy of _schemas yet; retry"
                )));
            }
            tokio::time::sleep(REPLICATED_POLL).await;
        }
        Ok(id)
    }
}

impl RecordSchemas for RegistrySchemas {
    fn encode<'a>(&'a self, request: EncodeRequest<'a>) -> EncodeFuture<'a> {
        Box::pin(async move {
            let schema_type = match request.format {
                SchemaFormat::Avro => SchemaType::Avro,
                SchemaFormat::JsonSchema => SchemaType::Json,
                SchemaFormat::Protobuf => SchemaType::Protobuf,
            };
            let found = self
                .registry
                .record_encoder(
                    &request.subject,
                    schema_type,
                    request.schema.clone(),
                    request.schema_id,
                )
                .await;
            let encoder = match (
                found,
                &request.schema,
                &self.forward,
                self.registry.writer(),
            ) {
                // A new schema, and another node assigns ids: registered there, then taken by
                // its id here.
                (
                    Err(RegistryError::NotLeader(_)),
                    Some(text),
                    Some(forwarder),
                    Writer::Node(node),
                ) => {
                    let id = self
                        .register_on(
                            forwarder.as_ref(),
                            node,
                            &request.subject,
                            schema_type,
                            text,
                            request.authorization.clone(),
                        )
                        .await?;
                    self.registry
                        .record_encoder(&request.subject, schema_type, None, Some(id))
                        .await
                        .map_err(refused)?
                }
                (found, ..) => found.map_err(refused)?,
            };
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
