//! Encoding JSON records with a registered schema into the registry's wire format, as
//! Confluent's REST Proxy does for HTTP producers: magic byte 0, the schema id (4 bytes, big
//! endian), then for Protobuf the message-index list, then the payload: Avro binary (from
//! Avro's JSON encoding, unions as `{"type": value}`), the JSON text itself once it validates
//! against the JSON Schema, or Protobuf binary (from Protobuf's JSON mapping).

use std::collections::HashMap;

use apache_avro::schema::{InnerDecimalSchema, Name, Schema as AvroSchema, UuidSchema};
use apache_avro::types::Value as AvroValue;
use serde_json::Value;

use crate::protobuf::ProtoSchema;
use crate::schema::{Resolved, SchemaType};

/// Deepest JSON value an Avro record is read from (serde_json refuses deeper input anyway).
const MAX_DEPTH: usize = 128;

/// Encodes records with one registered schema.
pub struct RecordEncoder {
    id: i32,
    kind: Kind,
}

enum Kind {
    Avro {
        schema: AvroSchema,
        /// The schemas it references, referenced ones first.
        references: Vec<AvroSchema>,
    },
    Json(Box<jsonschema::Validator>),
    Protobuf(prost_reflect::MessageDescriptor),
}

/// An Avro schema's text parsed with the texts of the schemas it references (referenced ones
/// first): the schema, and the referenced ones parsed.
pub(crate) fn parse_avro(
    text: &str,
    references: &[Resolved],
) -> Result<(AvroSchema, Vec<AvroSchema>), String> {
    let texts: Vec<&str> = references.iter().map(|r| r.text.as_str()).collect();
    if texts.is_empty() {
        Ok((
            AvroSchema::parse_str(text).map_err(|e| e.to_string())?,
            Vec::new(),
        ))
    } else {
        AvroSchema::parse_str_with_list(text, &texts).map_err(|e| e.to_string())
    }
}

impl std::fmt::Debug for RecordEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordEncoder")
            .field("id", &self.id)
            .field("type", &self.schema_type())
            .finish()
    }
}

impl RecordEncoder {
    /// An encoder for schema `id` of `schema_type` with this text and its (transitively)
    /// referenced schemas, referenced ones first.
    pub fn new(
        id: i32,
        schema_type: SchemaType,
        text: &str,
        references: &[Resolved],
    ) -> Result<Self, String> {
        let kind = match schema_type {
            SchemaType::Avro => {
                let (schema, references) = parse_avro(text, references)?;
                Kind::Avro { schema, references }
            }
            SchemaType::Json => {
                let schema: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
                let mut docs = Vec::with_capacity(references.len());
                for r in references {
                    let doc: Value = serde_json::from_str(&r.text).map_err(|e| e.to_string())?;
                    docs.push((r.name.clone(), doc));
                }
                let validator = jsonschema::options()
                    .with_retriever(References(docs))
                    .build(&schema)
                    .map_err(|e| e.to_string())?;
                Kind::Json(Box::new(validator))
            }
            SchemaType::Protobuf => {
                let parsed = crate::protobuf::parse(text, references)?;
                let message = parsed
                    .first_message()
                    .ok_or("the Protobuf schema defines no message")?;
                Kind::Protobuf(message)
            }
        };
        Ok(Self { id, kind })
    }

    /// The schema's id.
    pub fn id(&self) -> i32 {
        self.id
    }

    /// The schema's type.
    pub fn schema_type(&self) -> SchemaType {
        match self.kind {
            Kind::Avro { .. } => SchemaType::Avro,
            Kind::Json(_) => SchemaType::Json,
            Kind::Protobuf(_) => SchemaType::Protobuf,
        }
    }

    /// Each JSON text encoded in the wire format, or the index of the first that does not fit
    /// the schema and why.
    pub fn encode_all(&self, values: &[&str]) -> Result<Vec<Vec<u8>>, (usize, String)> {
        let mut out = Vec::with_capacity(values.len());
        match &self.kind {
            Kind::Avro { schema, references } => {
                // Referenced schemas first: names resolve in order.
                let all: Vec<&AvroSchema> = references.iter().chain([schema]).collect();
                let writer = apache_avro::writer::datum::GenericDatumWriter::builder(schema)
                    .schemata(all.clone())
                    .and_then(|b| b.build())
                    .map_err(|e| (0, format!("the schema cannot write records: {e}")))?;
                let resolved = apache_avro::schema::ResolvedSchema::new_with_schemata(all)
                    .map_err(|e| (0, format!("the schema cannot write records: {e}")))?;
                let names: HashMap<Name, &AvroSchema> = resolved
                    .get_names()
                    .iter()
                    .map(|(n, s)| (n.clone(), *s))
                    .collect();
                for (i, text) in values.iter().enumerate() {
                    let json: Value = serde_json::from_str(text).map_err(|e| (i, e.to_string()))?;
                    let value = avro_from_json(&json, schema, &names, "", 0).map_err(|e| (i, e))?;
                    let mut buf = self.header();
                    writer
                        .write_value(&mut buf, value)
                        .map_err(|e| (i, format!("does not fit the schema: {e}")))?;
                    out.push(buf);
                }
            }
            Kind::Json(validator) => {
                for (i, text) in values.iter().enumerate() {
                    let json: Value = serde_json::from_str(text).map_err(|e| (i, e.to_string()))?;
                    if let Some(e) = validator.iter_errors(&json).next() {
                        let at = e.instance_path().to_string();
                        let at = if at.is_empty() { "/".to_string() } else { at };
                        return Err((i, format!("does not validate at {at}: {e}")));
                    }
                    let mut buf = self.header();
                    buf.extend_from_slice(text.trim().as_bytes());
                    out.push(buf);
                }
            }
            Kind::Protobuf(message) => {
                for (i, text) in values.iter().enumerate() {
                    let payload = ProtoSchema::encode_json(message, text).map_err(|e| (i, e))?;
                    let mut buf = self.header();
                    // Message indexes [0] (the file's first message) are written as one 0.
                    buf.push(0);
                    buf.extend_from_slice(&payload);
                    out.push(buf);
                }
            }
        }
        Ok(out)
    }

    fn header(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(64);
        buf.push(0);
        buf.extend_from_slice(&self.id.to_be_bytes());
        buf
    }
}

/// Serves a JSON Schema's references by the name they were registered under (a `$ref` to
/// `address.json` resolves against the schema's base URI to `.../address.json`); nothing is
/// fetched from anywhere else.
struct References(Vec<(String, Value)>);

impl jsonschema::Retrieve for References {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        let uri = uri.as_str();
        self.0
            .iter()
            .find(|(name, _)| {
                uri == name
                    || uri
                        .strip_suffix(name.as_str())
                        .is_some_and(|base| base.ends_with('/'))
            })
            .map(|(_, doc)| doc.clone())
            .ok_or_else(|| format!("{uri} is not among the schema's references").into())
    }
}

/// The name a union branch is selected by in Avro's JSON encoding.
fn branch_name(s: &AvroSchema) -> String {
    if let Some(n) = s.name() {
        return n.fullname(None);
    }
    match s {
        AvroSchema::Null => "null",
        AvroSchema::Boolean => "boolean",
        AvroSchema::Int | AvroSchema::Date | AvroSchema::TimeMillis => "int",
        AvroSchema::Long
        | AvroSchema::TimeMicros
        | AvroSchema::TimestampMillis
        | AvroSchema::TimestampMicros
        | AvroSchema::TimestampNanos
        | AvroSchema::LocalTimestampMillis
        | AvroSchema::LocalTimestampMicros
        | AvroSchema::LocalTimestampNanos => "long",
        AvroSchema::Float => "float",
        AvroSchema::Double => "double",
        AvroSchema::Bytes | AvroSchema::BigDecimal => "bytes",
        AvroSchema::String => "string",
        AvroSchema::Array(_) => "array",
        AvroSchema::Map(_) => "map",
        AvroSchema::Uuid(UuidSchema::String) => "string",
        AvroSchema::Uuid(UuidSchema::Bytes) => "bytes",
        AvroSchema::Decimal(d) if matches!(d.inner, InnerDecimalSchema::Bytes) => "bytes",
        _ => "",
    }
    .to_string()
}

fn at(path: &str) -> &str {
    if path.is_empty() {
        "the value"
    } else {
        path
    }
}

fn want(path: &str, what: &str, got: &Value) -> String {
    let kind = match got {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    format!("{}: expected {what}, got {kind}", at(path))
}

/// Avro bytes in JSON: a string of code points 0-255, one per byte.
fn json_bytes(path: &str, v: &Value) -> Result<Vec<u8>, String> {
    let Value::String(s) = v else {
        return Err(want(path, "a string of bytes", v));
    };
    s.chars()
        .map(|c| {
            u8::try_from(u32::from(c)).map_err(|_| {
                format!(
                    "{}: bytes are written as characters U+0000 to U+00FF",
                    at(path)
                )
            })
        })
        .collect()
}

fn json_int(path: &str, v: &Value) -> Result<i32, String> {
    v.as_i64()
        .and_then(|n| i32::try_from(n).ok())
        .ok_or_else(|| want(path, "an int (32-bit integer)", v))
}

fn json_long(path: &str, v: &Value) -> Result<i64, String> {
    v.as_i64()
        .ok_or_else(|| want(path, "a long (64-bit integer)", v))
}

/// Reads Avro's JSON encoding of a value of `schema` (unions as `null` or `{"branch": value}`;
/// a bare value is taken by the first branch it fits, as a convenience), filling record
/// fields left out with their defaults.
fn avro_from_json(
    v: &Value,
    schema: &AvroSchema,
    names: &HashMap<Name, &AvroSchema>,
    path: &str,
    depth: usize,
) -> Result<AvroValue, String> {
    if depth > MAX_DEPTH {
        return Err(format!("{}: nested deeper than {MAX_DEPTH}", at(path)));
    }
    let next = depth + 1;
    Ok(match schema {
        AvroSchema::Ref { name } => {
            let target = names
                .get(name)
                .ok_or_else(|| format!("{}: unknown type {}", at(path), name.fullname(None)))?;
            return avro_from_json(v, target, names, path, next);
        }
        AvroSchema::Null => match v {
            Value::Null => AvroValue::Null,
            _ => return Err(want(path, "null", v)),
        },
        AvroSchema::Boolean => {
            AvroValue::Boolean(v.as_bool().ok_or_else(|| want(path, "a boolean", v))?)
        }
        AvroSchema::Int => AvroValue::Int(json_int(path, v)?),
        AvroSchema::Long => AvroValue::Long(json_long(path, v)?),
        AvroSchema::Float => {
            AvroValue::Float(v.as_f64().ok_or_else(|| want(path, "a float", v))? as f32)
        }
        AvroSchema::Double => {
            AvroValue::Double(v.as_f64().ok_or_else(|| want(path, "a double", v))?)
        }
        AvroSchema::Bytes => AvroValue::Bytes(json_bytes(path, v)?),
        AvroSchema::String => AvroValue::String(
            v.as_str()
                .ok_or_else(|| want(path, "a string", v))?
                .to_string(),
        ),
        AvroSchema::Fixed(f) => {
            let b = json_bytes(path, v)?;
            if b.len() != f.size {
                return Err(format!(
                    "{}: fixed {} holds {} bytes, got {}",
                    at(path),
                    f.name.fullname(None),
                    f.size,
                    b.len()
                ));
            }
            AvroValue::Fixed(f.size, b)
        }
        AvroSchema::Enum(e) => {
            let s = v.as_str().ok_or_else(|| want(path, "an enum symbol", v))?;
            let i = e.symbols.iter().position(|x| x == s).ok_or_else(|| {
                format!(
                    "{}: {s:?} is not a symbol of enum {} ({})",
                    at(path),
                    e.name.fullname(None),
                    e.symbols.join(", ")
                )
            })?;
            AvroValue::Enum(i as u32, s.to_string())
        }
        AvroSchema::Array(a) => {
            let Value::Array(items) = v else {
                return Err(want(path, "an array", v));
            };
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                out.push(avro_from_json(
                    item,
                    &a.items,
                    names,
                    &format!("{path}[{i}]"),
                    next,
                )?);
            }
            AvroValue::Array(out)
        }
        AvroSchema::Map(m) => {
            let Value::Object(entries) = v else {
                return Err(want(path, "an object (map)", v));
            };
            let mut out = HashMap::with_capacity(entries.len());
            for (k, item) in entries {
                out.insert(
                    k.clone(),
                    avro_from_json(item, &m.types, names, &format!("{path}.{k}"), next)?,
                );
            }
            AvroValue::Map(out)
        }
        AvroSchema::Record(r) => {
            let Value::Object(fields) = v else {
                return Err(want(
                    path,
                    &format!("an object (record {})", r.name.fullname(None)),
                    v,
                ));
            };
            for k in fields.keys() {
                if !r.lookup.contains_key(k) {
                    return Err(format!(
                        "{}: record {} has no field {k:?}",
                        at(path),
                        r.name.fullname(None)
                    ));
                }
            }
            let mut out = Vec::with_capacity(r.fields.len());
            for f in &r.fields {
                let fpath = if path.is_empty() {
                    f.name.clone()
                } else {
                    format!("{path}.{}", f.name)
                };
                let value = match (fields.get(&f.name), &f.default) {
                    (Some(x), _) => avro_from_json(x, &f.schema, names, &fpath, next)?,
                    (None, Some(d)) => avro_default(d, &f.schema, names, &fpath, next)?,
                    (None, None) => {
                        return Err(format!("{fpath}: missing, and the field has no default"))
                    }
                };
                out.push((f.name.clone(), value));
            }
            AvroValue::Record(out)
        }
        AvroSchema::Union(u) => {
            let variants = u.variants();
            if v.is_null() {
                let i = variants
                    .iter()
                    .position(|s| matches!(s, AvroSchema::Null))
                    .ok_or_else(|| format!("{}: null is not a branch of the union", at(path)))?;
                return Ok(AvroValue::Union(i as u32, Box::new(AvroValue::Null)));
            }
            // Avro's JSON encoding: {"branch name": value}.
            if let Value::Object(o) = v {
                if o.len() == 1 {
                    if let Some((k, inner)) = o.iter().next() {
                        let found = variants.iter().position(|s| {
                            let n = branch_name(s);
                            n == *k || n.rsplit('.').next() == Some(k.as_str())
                        });
                        if let Some(i) = found {
                            let x = avro_from_json(inner, &variants[i], names, path, next)?;
                            return Ok(AvroValue::Union(i as u32, Box::new(x)));
                        }
                    }
                }
            }
            for (i, s) in variants.iter().enumerate() {
                if matches!(s, AvroSchema::Null) {
                    continue;
                }
                if let Ok(x) = avro_from_json(v, s, names, path, next) {
                    return Ok(AvroValue::Union(i as u32, Box::new(x)));
                }
            }
            let names: Vec<String> = variants.iter().map(branch_name).collect();
            return Err(format!(
                "{}: fits no branch of the union [{}] (write {{\"branch\": value}})",
                at(path),
                names.join(", ")
            ));
        }
        AvroSchema::Date => AvroValue::Date(json_int(path, v)?),
        AvroSchema::TimeMillis => AvroValue::TimeMillis(json_int(path, v)?),
        AvroSchema::TimeMicros => AvroValue::TimeMicros(json_long(path, v)?),
        AvroSchema::TimestampMillis => AvroValue::TimestampMillis(json_long(path, v)?),
        AvroSchema::TimestampMicros => AvroValue::TimestampMicros(json_long(path, v)?),
        AvroSchema::TimestampNanos => AvroValue::TimestampNanos(json_long(path, v)?),
        AvroSchema::LocalTimestampMillis => AvroValue::LocalTimestampMillis(json_long(path, v)?),
        AvroSchema::LocalTimestampMicros => AvroValue::LocalTimestampMicros(json_long(path, v)?),
        AvroSchema::LocalTimestampNanos => AvroValue::LocalTimestampNanos(json_long(path, v)?),
        AvroSchema::Decimal(_) | AvroSchema::BigDecimal => {
            AvroValue::Decimal(apache_avro::Decimal::from(json_bytes(path, v)?))
        }
        AvroSchema::Uuid(UuidSchema::String) => {
            let s = v.as_str().ok_or_else(|| want(path, "a UUID string", v))?;
            AvroValue::Uuid(
                s.parse()
                    .map_err(|e| format!("{}: not a UUID: {e}", at(path)))?,
            )
        }
        AvroSchema::Uuid(_) => {
            let b = json_bytes(path, v)?;
            let b: [u8; 16] = b
                .try_into()
                .map_err(|_| format!("{}: a UUID is 16 bytes", at(path)))?;
            AvroValue::Uuid(uuid::Uuid::from_bytes(b))
        }
        AvroSchema::Duration(_) => {
            let b = json_bytes(path, v)?;
            let b: [u8; 12] = b
                .try_into()
                .map_err(|_| format!("{}: a duration is 12 bytes", at(path)))?;
            AvroValue::Duration(apache_avro::Duration::from(b))
        }
    })
}

/// A field default: written as the field's type, a union's as its first branch.
fn avro_default(
    d: &Value,
    schema: &AvroSchema,
    names: &HashMap<Name, &AvroSchema>,
    path: &str,
    depth: usize,
) -> Result<AvroValue, String> {
    match schema {
        AvroSchema::Union(u) => {
            let first = u
                .variants()
                .first()
                .ok_or_else(|| format!("{path}: the union is empty"))?;
            let x = avro_from_json(d, first, names, path, depth + 1)?;
            Ok(AvroValue::Union(0, Box::new(x)))
        }
        AvroSchema::Ref { name } => match names.get(name) {
            Some(target) => avro_default(d, target, names, path, depth + 1),
            None => Err(format!("{path}: unknown type {}", name.fullname(None))),
        },
        _ => avro_from_json(d, schema, names, path, depth),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(t: SchemaType, schema: &str, values: &[&str]) -> Result<Vec<Vec<u8>>, (usize, String)> {
        RecordEncoder::new(7, t, schema, &[])
            .unwrap()
            .encode_all(values)
    }

    const USER: &str = r#"{"type":"record","name":"User","namespace":"acme","fields":[
        {"name":"id","type":"long"},
        {"name":"email","type":["null","string"],"default":null},
        {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["A","B"]},"default":"A"},
        {"name":"tags","type":{"type":"array","items":"string"},"default":[]}]}"#;

    #[test]
    fn avro_records_are_framed_and_encoded_from_avro_json_with_defaults() {
        let out = enc(
            SchemaType::Avro,
            USER,
            &[
                r#"{"id": 1, "email": {"string": "a@b"}, "kind": "B", "tags": ["x"]}"#,
                r#"{"id": -1}"#,
            ],
        )
        .unwrap();
        // magic, id 7, then long 1 (zigzag 2), union branch 1 (2), "a@b", enum 1 (2), array.
        assert_eq!(
            out[0],
            [&[0u8, 0, 0, 0, 7, 2, 2, 6][..], b"a@b", &[2, 2, 2, b'x', 0]].concat()
        );
        // Defaults: email null (branch 0), kind A (0), tags empty.
        assert_eq!(out[1], vec![0, 0, 0, 0, 7, 1, 0, 0, 0]);
    }

    #[test]
    fn avro_accepts_a_bare_union_value_by_the_first_branch_it_fits() {
        let out = enc(SchemaType::Avro, USER, &[r#"{"id": 1, "email": "a@b"}"#]).unwrap();
        assert_eq!(out[0][5..8], [2, 2, 6]);
    }

    #[test]
    fn avro_records_that_do_not_fit_name_the_record_and_the_field() {
        let cases = [
            (r#"{"email": null}"#, "id: missing"),
            (r#"{"id": "x"}"#, "id: expected a long"),
            (r#"{"id": 1, "kind": "C"}"#, "kind: \"C\" is not a symbol"),
            (r#"{"id": 1, "nope": 2}"#, "has no field \"nope\""),
            (r#"{"id": 1, "tags": [1]}"#, "tags[0]: expected a string"),
            (r#"{"id": 1, "email": {"int": 3}}"#, "email: fits no branch"),
        ];
        for (value, want) in cases {
            let (i, e) = enc(SchemaType::Avro, USER, &[r#"{"id": 0}"#, value]).unwrap_err();
            assert_eq!(i, 1);
            assert!(e.contains(want), "{value}: {e}");
        }
    }

    #[test]
    fn json_schema_records_are_validated_and_written_as_json() {
        let schema = r#"{"type":"object","properties":{"n":{"type":"integer","minimum":1}},"required":["n"]}"#;
        let out = enc(SchemaType::Json, schema, &[r#"{"n": 2}"#]).unwrap();
        assert_eq!(out[0], [&[0u8, 0, 0, 0, 7][..], br#"{"n": 2}"#].concat());
        let (i, e) = enc(SchemaType::Json, schema, &[r#"{"n": 2}"#, r#"{"n": 0}"#]).unwrap_err();
        assert_eq!(i, 1);
        assert!(e.contains("/n"), "{e}");
        assert!(enc(SchemaType::Json, schema, &[r#"{}"#]).is_err());
    }

    #[test]
    fn json_schema_references_resolve_by_name() {
        let address = Resolved {
            name: "address.json".into(),
            schema_type: SchemaType::Json,
            text:
                r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}"#
                    .into(),
        };
        let person = r#"{"type":"object","properties":{"home":{"$ref":"address.json"}}}"#;
        let e = RecordEncoder::new(1, SchemaType::Json, person, &[address]).unwrap();
        assert!(e.encode_all(&[r#"{"home":{"city":"x"}}"#]).is_ok());
        assert!(e.encode_all(&[r#"{"home":{}}"#]).is_err());
    }

    #[test]
    fn protobuf_records_carry_the_first_messages_index_list() {
        let schema = "syntax = \"proto3\"; message M { string a = 1; } message N { int32 b = 1; }";
        let out = enc(SchemaType::Protobuf, schema, &[r#"{"a": "x"}"#]).unwrap();
        assert_eq!(out[0], vec![0, 0, 0, 0, 7, 0, 0x0a, 1, b'x']);
        let (i, e) = enc(SchemaType::Protobuf, schema, &[r#"{"b": 1}"#]).unwrap_err();
        assert_eq!(i, 0);
        assert!(e.contains('b'), "{e}");
    }
}
