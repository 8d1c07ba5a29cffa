//! Schema types, the text forms a schema is stored and compared in, and parsing a schema with
//! its references into the model its compatibility is checked on.

use serde_json::Value;

use crate::error::RegistryError;
use crate::{avro, json_schema, protobuf};

/// The kinds of schema the registry knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SchemaType {
    /// Apache Avro (the default when no type is given).
    Avro,
    /// JSON Schema.
    Json,
    /// Protocol Buffers (`.proto` text, or a base64 `FileDescriptorProto`).
    Protobuf,
}

impl SchemaType {
    /// Reads a `schemaType` as clients send it (`None`: AVRO).
    pub fn parse(name: Option<&str>) -> Result<Self, RegistryError> {
        match name.map(str::to_ascii_uppercase).as_deref() {
            None | Some("AVRO") | Some("") => Ok(SchemaType::Avro),
            Some("JSON") => Ok(SchemaType::Json),
            Some("PROTOBUF") => Ok(SchemaType::Protobuf),
            Some(_) => Err(RegistryError::InvalidSchema(format!(
                "unknown schema type {:?}: use AVRO, JSON or PROTOBUF",
                name.unwrap_or_default()
            ))),
        }
    }

    /// The name the API and the `_schemas` records use.
    pub fn name(self) -> &'static str {
        match self {
            SchemaType::Avro => "AVRO",
            SchemaType::Json => "JSON",
            SchemaType::Protobuf => "PROTOBUF",
        }
    }

    /// How answers and records carry the type: left out for AVRO, as Confluent writes it.
    pub fn wire(self) -> Option<String> {
        (self != SchemaType::Avro).then(|| self.name().to_string())
    }
}

/// A referenced schema, resolved from the store: the name the referencing schema uses for it
/// and its text.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The name it is referenced by.
    pub name: String,
    /// Its type.
    pub schema_type: SchemaType,
    /// Its text.
    pub text: String,
}

/// A schema parsed into the model its compatibility is checked on.
#[derive(Debug)]
pub enum Parsed {
    /// An Avro schema.
    Avro(avro::AvroSchema),
    /// A JSON Schema.
    Json(json_schema::JsonSchema),
    /// A compiled Protobuf file.
    Protobuf(protobuf::ProtoSchema),
}

impl Parsed {
    /// What keeps `writer`'s data from being read with `self` (empty: nothing).
    pub fn incompatibilities(&self, writer: &Parsed) -> Vec<String> {
        match (self, writer) {
            (Parsed::Avro(r), Parsed::Avro(w)) => avro::incompatibilities(r, w),
            (Parsed::Json(r), Parsed::Json(w)) => json_schema::incompatibilities(r, w),
            (Parsed::Protobuf(r), Parsed::Protobuf(w)) => protobuf::incompatibilities(r, w),
            _ => vec!["SCHEMA_TYPE_CHANGED at /: the schema type differs".to_string()],
        }
    }
}

/// A schema ready to be registered or looked up.
#[derive(Debug)]
pub struct Prepared {
    /// Its type.
    pub schema_type: SchemaType,
    /// The text stored and served: the text as given without insignificant whitespace, or
    /// the normalized form when normalizing.
    pub text: String,
    /// The form two schemas are the same schema in: JSON with sorted keys and no whitespace.
    pub canonical: String,
    /// The model compatibility is checked on.
    pub parsed: Parsed,
}

/// Parses `text` as a schema of `schema_type` with its (transitively) referenced schemas,
/// checking it against its type's rules; `normalize` stores the normalized form.
pub fn prepare(
    schema_type: SchemaType,
    text: &str,
    references: &[Resolved],
    normalize: bool,
    max_bytes: usize,
) -> Result<Prepared, RegistryError> {
    if text.len() > max_bytes {
        return Err(RegistryError::InvalidSchema(format!(
            "the schema is {} bytes, over the limit of {max_bytes}",
            text.len()
        )));
    }
    if text.trim().is_empty() {
        return Err(RegistryError::InvalidSchema("the schema is empty".into()));
    }
    // Nesting deeper than serde_json's recursion limit (128) is refused here, which bounds
    // every recursive walk of an Avro or JSON schema.
    let json = || -> Result<Value, RegistryError> {
        serde_json::from_str(text)
            .map_err(|e| RegistryError::InvalidSchema(format!("not JSON: {e}")))
    };
    match schema_type {
        SchemaType::Avro => {
            let value = json()?;
            let (model, normalized) =
                avro::parse(text, &value, references).map_err(RegistryError::InvalidSchema)?;
            let text = if normalize {
                canonical_json(&normalized)
            } else {
                compact_json(text)
            };
            let canonical = if normalize {
                text.clone()
            } else {
                canonical_json(&value)
            };
            Ok(Prepared {
                schema_type,
                text,
                canonical,
                parsed: Parsed::Avro(model),
            })
        }
        SchemaType::Json => {
            let model =
                json_schema::parse(json()?, references).map_err(RegistryError::InvalidSchema)?;
            let canonical = canonical_json(model.root());
            let text = if normalize {
                canonical.clone()
            } else {
                compact_json(text)
            };
            Ok(Prepared {
                schema_type,
                text,
                canonical,
                parsed: Parsed::Json(model),
            })
        }
        SchemaType::Protobuf => {
            // One canonical text, stored and compared, whether normalizing or not: layout,
            // comments and relative type names are not kept.
            let model = protobuf::parse(text, references).map_err(RegistryError::InvalidSchema)?;
            let canonical = model.canonical();
            Ok(Prepared {
                schema_type,
                text: canonical.clone(),
                canonical,
                parsed: Parsed::Protobuf(model),
            })
        }
    }
}

/// The canonical form of a stored schema text: JSON with sorted keys, or the text itself when
/// it is not JSON (a Protobuf schema, stored in its canonical text already).
pub fn canonical_of_text(text: &str) -> String {
    match serde_json::from_str::<Value>(text) {
        Ok(v) => canonical_json(&v),
        Err(_) => text.to_string(),
    }
}

/// `v` as JSON text with object keys sorted and no whitespace, whatever order the map type
/// keeps keys in.
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(child) = m.get(k) {
                    write_canonical(child, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Valid JSON text without the whitespace between tokens, everything else (key order,
/// number spelling, escapes) as written.
pub fn compact_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in text.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_json_drops_whitespace_between_tokens_only() {
        let text = "{ \"a\" : [1, 2],\n\t\"b\": \"x y \\\" z\" }";
        assert_eq!(compact_json(text), r#"{"a":[1,2],"b":"x y \" z"}"#);
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let v: Value =
            serde_json::from_str(r#"{"b":{"d":1,"c":[{"z":1,"y":2}]},"a":"s"}"#).unwrap();
        assert_eq!(
            canonical_json(&v),
            r#"{"a":"s","b":{"c":[{"y":2,"z":1}],"d":1}}"#
        );
    }

    #[test]
    fn schema_types_are_read_case_insensitively_and_avro_by_default() {
        assert_eq!(SchemaType::parse(None).unwrap(), SchemaType::Avro);
        assert_eq!(SchemaType::parse(Some("json")).unwrap(), SchemaType::Json);
        assert_eq!(
            SchemaType::parse(Some("XML")).unwrap_err().error_code(),
            42201
        );
    }

    #[test]
    fn protobuf_is_stored_in_its_canonical_text_and_bad_text_is_42201() {
        let a = prepare(
            SchemaType::Protobuf,
            "syntax = \"proto3\";\n// c\nmessage M {   string a = 1; }",
            &[],
            false,
            1 << 20,
        )
        .unwrap();
        assert_eq!(
            a.text,
            "syntax = \"proto3\";\n\nmessage M {\n  string a = 1;\n}\n"
        );
        assert_eq!(a.text, a.canonical);
        let e = prepare(SchemaType::Protobuf, "message {", &[], false, 1 << 20).unwrap_err();
        assert_eq!(e.error_code(), 42201);
    }

    #[test]
    fn a_schema_over_the_size_limit_is_invalid() {
        let e = prepare(SchemaType::Avro, "\"string\"", &[], false, 4).unwrap_err();
        assert_eq!(e.error_code(), 42201);
    }

    #[test]
    fn the_same_schema_with_other_whitespace_and_key_order_has_one_canonical_form() {
        let a = prepare(
            SchemaType::Avro,
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}"#,
            &[],
            false,
            1 << 20,
        )
        .unwrap();
        let b = prepare(
            SchemaType::Avro,
            "{ \"name\": \"R\",\n \"fields\": [ {\"type\": \"int\", \"name\": \"a\"} ], \"type\": \"record\" }",
            &[],
            false,
            1 << 20,
        )
        .unwrap();
        assert_eq!(a.canonical, b.canonical);
        assert_ne!(a.text, b.text, "each keeps its own key order");
    }
}
