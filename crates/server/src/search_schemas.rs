//! Search's schema'd values (`search.value.format` schema or auto) decoded through the schema
//! registry in this process: the one place that knows both crates, so neither depends on the
//! other.

use std::sync::Arc;

use serde_json::Value;
use spate_schema_registry::decode::schema_id;
use spate_schema_registry::Registry;
use spate_search::ValueDecoder;

/// Largest value decoded: a bigger one is indexed as text rather than expanded into JSON (an
/// Avro array of nulls is a few bytes per thousand items).
const MAX_DECODED_VALUE_BYTES: usize = 8 << 20;

/// How far above the next id this node would hand out an unknown id is still waited for.
const IDS_AHEAD: i32 = 1000;

/// The registry, as search sees it.
pub struct RegistryDecoder(pub Arc<Registry>);

impl ValueDecoder for RegistryDecoder {
    fn decode(&self, value: &[u8]) -> Option<Result<Value, String>> {
        let id = schema_id(value)?;
        let decoder = match self.0.record_decoder(id)? {
            Ok(d) => d,
            Err(e) => return Some(Err(e)),
        };
        if value.len() > MAX_DECODED_VALUE_BYTES {
            return Some(Err(format!(
                "the value is {} bytes, over the {MAX_DECODED_VALUE_BYTES} decoded for search",
                value.len()
            )));
        }
        Some(decoder.decode(value))
    }

    fn awaits_schema(&self, value: &[u8]) -> bool {
        // Ids are handed out in order: an unknown one just above the highest this node knows
        // is a registration whose record has not reached its copy of `_schemas` yet; any
        // other unknown id (below: deleted; far above: not an id at all) will not come.
        schema_id(value).is_some_and(|id| {
            let next = self.0.next_id();
            id >= next && id < next.saturating_add(IDS_AHEAD) && self.0.record_decoder(id).is_none()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_schema_registry::registry::SchemaRequest;
    use spate_schema_registry::{MemoryLog, Settings};

    async fn registry_with(schema: &str) -> (Arc<Registry>, i32) {
        let r = Registry::start(Arc::new(MemoryLog::new()), Settings::default()).await;
        let id = r
            .register(
                "t-value",
                SchemaRequest {
                    schema: Some(schema.to_string()),
                    ..SchemaRequest::default()
                },
                None,
            )
            .await
            .unwrap();
        (r, id)
    }

    #[tokio::test]
    async fn registered_avro_values_decode_and_unknown_ids_are_not_claimed() {
        let (r, id) =
            registry_with(r#"{"type":"record","name":"R","fields":[{"name":"n","type":"int"}]}"#)
                .await;
        let d = RegistryDecoder(r);
        let mut v = vec![0];
        v.extend_from_slice(&id.to_be_bytes());
        v.push(84); // zigzag 42
        assert_eq!(d.decode(&v), Some(Ok(serde_json::json!({"n": 42}))));
        let mut unknown = vec![0];
        unknown.extend_from_slice(&(id + 100).to_be_bytes());
        unknown.push(84);
        assert_eq!(d.decode(&unknown), None);
        assert_eq!(d.decode(b"plain text"), None);
        v.truncate(5);
        assert!(matches!(d.decode(&v), Some(Err(_))), "truncated");
    }

    #[tokio::test]
    async fn only_an_id_just_above_the_known_ones_is_waited_for() {
        let (r, id) =
            registry_with(r#"{"type":"record","name":"R","fields":[{"name":"n","type":"int"}]}"#)
                .await;
        let d = RegistryDecoder(r);
        let value = |id: i32| {
            let mut v = vec![0];
            v.extend_from_slice(&id.to_be_bytes());
            v.push(84);
            v
        };
        assert!(!d.awaits_schema(&value(id)), "known");
        assert!(d.awaits_schema(&value(id + 1)), "the next registration");
        assert!(
            !d.awaits_schema(&value(id + 5000)),
            "not an id this registry will reach soon"
        );
        assert!(!d.awaits_schema(&value(0)), "below the known ids");
        assert!(!d.awaits_schema(b"plain text"));
    }
}
