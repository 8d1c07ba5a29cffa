//! Request bodies: the Confluent REST Proxy v2 shape (`{"records": [...]}`, embedded format
//! from the content type) and the `/produce` shape (`{"topic", "records"}` or one record),
//! parsed without copying keys and values that need no unescaping or decoding.

use std::borrow::Cow;

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::batch::Rec;
use super::schemas::SchemaFormat;
use super::IngestError;

/// How keys, values and header values are written in the JSON body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `application/vnd.kafka.json.v2+json`: each key and value is a JSON value, stored as its
    /// JSON text (a string keeps its quotes), as the REST Proxy does.
    Json,
    /// `application/vnd.kafka.binary.v2+json`: base64 strings.
    Binary,
    /// `application/json`: a string is stored as its UTF-8 text, anything else as JSON text.
    Plain,
    /// `application/vnd.kafka.{avro,jsonschema,protobuf}.v2+json`: keys and values are JSON
    /// values encoded with a registered schema (kept as their JSON text until then).
    Schema(SchemaFormat),
}

/// The embedded format a content type names; `None` is a 415.
pub fn format_of(content_type: &str) -> Option<Format> {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "application/vnd.kafka.json.v2+json" | "application/vnd.kafka.json.v1+json" => {
            Some(Format::Json)
        }
        // v1 without an embedded format meant binary: base64 keys and values.
        "application/vnd.kafka.binary.v2+json"
        | "application/vnd.kafka.binary.v1+json"
        | "application/vnd.kafka.v1+json" => Some(Format::Binary),
        "application/json" | "application/vnd.kafka.v2+json" => Some(Format::Plain),
        "application/vnd.kafka.avro.v2+json" | "application/vnd.kafka.avro.v1+json" => {
            Some(Format::Schema(SchemaFormat::Avro))
        }
        "application/vnd.kafka.jsonschema.v2+json" => {
            Some(Format::Schema(SchemaFormat::JsonSchema))
        }
        "application/vnd.kafka.protobuf.v2+json" => Some(Format::Schema(SchemaFormat::Protobuf)),
        _ => None,
    }
}

/// The content type of a REST Proxy path's answer: the API version the request was in.
pub fn answer_type(content_type: &str) -> &'static str {
    if content_type.to_ascii_lowercase().contains(".v1+json") {
        "application/vnd.kafka.v1+json"
    } else {
        "application/vnd.kafka.v2+json"
    }
}

/// Content types accepted, for the 415 message.
pub const ACCEPTED_TYPES: &str = "application/vnd.kafka.json.v2+json, application/vnd.kafka.binary.v2+json, application/json, application/vnd.kafka.avro.v2+json, application/vnd.kafka.jsonschema.v2+json, application/vnd.kafka.protobuf.v2+json, or the REST Proxy's v1 types (application/vnd.kafka.v1+json, binary.v1, json.v1, avro.v1)";

/// Base64 as the REST Proxy writes it; padding optional.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default)]
    topic: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    records: Option<Vec<WireRecord<'a>>>,
    // The one-record form of `/produce`.
    #[serde(borrow, default)]
    key: Option<&'a RawValue>,
    #[serde(borrow, default)]
    value: Option<&'a RawValue>,
    #[serde(borrow, default)]
    headers: Option<&'a RawValue>,
    #[serde(default)]
    partition: Option<i64>,
    #[serde(borrow, default)]
    key_schema: Option<&'a RawValue>,
    #[serde(borrow, default)]
    value_schema: Option<&'a RawValue>,
    #[serde(borrow, default)]
    key_schema_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    value_schema_id: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireRecord<'a> {
    #[serde(borrow, default)]
    key: Option<&'a RawValue>,
    #[serde(borrow, default)]
    value: Option<&'a RawValue>,
    #[serde(borrow, default)]
    headers: Option<&'a RawValue>,
    #[serde(default)]
    partition: Option<i64>,
}

/// The schemas a schema'd body names for its keys and values.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SchemaFields {
    /// `key_schema`: schema text.
    pub key_schema: Option<String>,
    /// `key_schema_id`.
    pub key_schema_id: Option<i32>,
    /// `value_schema`: schema text.
    pub value_schema: Option<String>,
    /// `value_schema_id`.
    pub value_schema_id: Option<i32>,
}

/// A parsed body: the topic it names (if any) and its records.
pub struct Parsed<'a> {
    /// `"topic"` from the body.
    pub topic: Option<Cow<'a, str>>,
    /// The records, in body order.
    pub records: Vec<Rec<'a>>,
    /// The key and value schemas (schema'd formats only).
    pub schemas: SchemaFields,
}

/// A schema given as a string (the REST Proxy's shape) or, for JSON-based schema types, as
/// the JSON itself.
fn schema_text(field: &str, raw: Option<&RawValue>) -> Result<Option<String>, IngestError> {
    let Some(raw) = raw else { return Ok(None) };
    let text = raw.get();
    if text == "null" {
        return Ok(None);
    }
    if text.starts_with('"') {
        return serde_json::from_str::<String>(text)
            .map(Some)
            .map_err(|e| unprocessable(format!("{field}: {e}")));
    }
    if text.starts_with('{') {
        return Ok(Some(text.to_string()));
    }
    Err(unprocessable(format!(
        "{field}: a schema is a string (or a JSON object)"
    )))
}

fn schema_id(field: &str, raw: Option<&RawValue>) -> Result<Option<i32>, IngestError> {
    let Some(raw) = raw else { return Ok(None) };
    if raw.get() == "null" {
        return Ok(None);
    }
    serde_json::from_str::<i32>(raw.get())
        .ok()
        .filter(|id| *id > 0)
        .map(Some)
        .ok_or_else(|| unprocessable(format!("{field}: a schema id is a positive integer")))
}

fn unprocessable(msg: String) -> IngestError {
    IngestError::Unprocessable(msg)
}

/// Parses a body; `single_allowed` accepts one record at the top level (`/produce`).
pub fn parse(body: &[u8], format: Format, single_allowed: bool) -> Result<Parsed<'_>, IngestError> {
    // One UTF-8 check of the whole body: parsing a `str` spares serde_json a check per value.
    let body = std::str::from_utf8(body).map_err(|e| {
        IngestError::BadRequest(format!(
            "malformed JSON body: not UTF-8 at byte {}",
            e.valid_up_to()
        ))
    })?;
    let wire: Wire<'_> = serde_json::from_str(body).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Syntax | Category::Eof | Category::Io => {
                IngestError::BadRequest(format!("malformed JSON body: {e}"))
            }
            Category::Data => unprocessable(format!("invalid body: {e}")),
        }
    })?;
    let schemas = if matches!(format, Format::Schema(_)) {
        SchemaFields {
            key_schema: schema_text("key_schema", wire.key_schema)?,
            key_schema_id: schema_id("key_schema_id", wire.key_schema_id)?,
            value_schema: schema_text("value_schema", wire.value_schema)?,
            value_schema_id: schema_id("value_schema_id", wire.value_schema_id)?,
        }
    } else {
        if wire.key_schema.is_some()
            || wire.value_schema.is_some()
            || wire.key_schema_id.is_some()
            || wire.value_schema_id.is_some()
        {
            return Err(unprocessable(
                "key_schema / value_schema: schemas go with the avro, jsonschema or protobuf embedded formats (application/vnd.kafka.avro.v2+json, ...)".into(),
            ));
        }
        SchemaFields::default()
    };
    let mut records = Vec::new();
    match wire.records {
        Some(list) => {
            if wire.key.is_some() || wire.value.is_some() {
                return Err(unprocessable(
                    "key / value: give either \"records\" or one record's fields, not both".into(),
                ));
            }
            records.reserve_exact(list.len());
            for (i, r) in list.into_iter().enumerate() {
                records.push(record(i, r, format)?);
            }
        }
        None if single_allowed && (wire.value.is_some() || wire.key.is_some()) => {
            let r = WireRecord {
                key: wire.key,
                value: wire.value,
                headers: wire.headers,
                partition: wire.partition,
            };
            records.push(record(0, r, format)?);
        }
        None => {
            return Err(unprocessable(
                "records: missing (the body is {\"records\": [{\"key\", \"value\", \"headers\", \"partition\"}, ...]})".into(),
            ))
        }
    }
    Ok(Parsed {
        topic: wire.topic,
        records,
        schemas,
    })
}

fn record<'a>(i: usize, r: WireRecord<'a>, format: Format) -> Result<Rec<'a>, IngestError> {
    let partition =
        match r.partition {
            None => None,
            Some(p) if p < 0 => {
                return Err(unprocessable(format!(
                    "records[{i}].partition: must be 0 or more, got {p}"
                )))
            }
            Some(p) => Some(i32::try_from(p).map_err(|_| {
                unprocessable(format!("records[{i}].partition: {p} is out of range"))
            })?),
        };
    Ok(Rec {
        key: bytes_of(r.key, format)
            .map_err(|e| unprocessable(format!("records[{i}].key: {e}")))?,
        value: bytes_of(r.value, format)
            .map_err(|e| unprocessable(format!("records[{i}].value: {e}")))?,
        headers: match r.headers {
            None => Vec::new(),
            Some(h) => headers(h, format)
                .map_err(|e| unprocessable(format!("records[{i}].headers: {e}")))?,
        },
        partition,
    })
}

/// A key or value in `format`; JSON `null` (or absent) is a null.
fn bytes_of(raw: Option<&RawValue>, format: Format) -> Result<Option<Cow<'_, [u8]>>, String> {
    let Some(raw) = raw else { return Ok(None) };
    let text = raw.get();
    if text == "null" {
        return Ok(None);
    }
    match format {
        Format::Json | Format::Schema(_) => Ok(Some(Cow::Borrowed(text.as_bytes()))),
        Format::Binary => {
            let s = string_of(text).ok_or("the binary format wants a base64 string")?;
            BASE64
                .decode(s.as_bytes())
                .map(|b| Some(Cow::Owned(b)))
                .map_err(|e| format!("invalid base64: {e}"))
        }
        Format::Plain => Ok(Some(match string_of(text) {
            Some(Cow::Borrowed(s)) => Cow::Borrowed(s.as_bytes()),
            Some(Cow::Owned(s)) => Cow::Owned(s.into_bytes()),
            None => Cow::Borrowed(text.as_bytes()),
        })),
    }
}

/// The string a JSON string literal holds, borrowed when it has no escapes; `None` when
/// `text` is not a string.
fn string_of(text: &str) -> Option<Cow<'_, str>> {
    if !text.starts_with('"') || text.len() < 2 {
        return None;
    }
    // The parser has validated the literal: without a backslash its content is the string
    // itself, found with one scan instead of a second parse.
    let inner = &text[1..text.len() - 1];
    if !inner.as_bytes().contains(&b'\\') {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(text).ok().map(Cow::Owned)
}

type Headers<'a> = Vec<super::batch::Header<'a>>;

/// Headers as an object (`{"name": "value"}`) or a list (`[{"key"|"name": ..., "value": ...}]`);
/// values are strings (base64 in the binary format) or null.
fn headers(raw: &RawValue, format: Format) -> Result<Headers<'static>, String> {
    let v: serde_json::Value =
        serde_json::from_str(raw.get()).map_err(|e| format!("invalid JSON: {e}"))?;
    let value = |name: &str, v: serde_json::Value| -> Result<Option<Cow<'static, [u8]>>, String> {
        match v {
            serde_json::Value::Null => Ok(None),
            serde_json::Value::String(s) => match format {
                Format::Binary => BASE64
                    .decode(s.as_bytes())
                    .map(|b| Some(Cow::Owned(b)))
                    .map_err(|e| format!("{name}: invalid base64: {e}")),
                _ => Ok(Some(Cow::Owned(s.into_bytes()))),
            },
            _ => Err(format!("{name}: a header value is a string or null")),
        }
    };
    let mut out = Vec::new();
    match v {
        serde_json::Value::Null => {}
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let val = value(&k, v)?;
                out.push((Cow::Owned(k), val));
            }
        }
        serde_json::Value::Array(list) => {
            for (j, h) in list.into_iter().enumerate() {
                let serde_json::Value::Object(mut h) = h else {
                    return Err(format!(
                        "[{j}]: a header is {{\"key\": ..., \"value\": ...}}"
                    ));
                };
                let name = match h.remove("key").or_else(|| h.remove("name")) {
                    Some(serde_json::Value::String(s)) => s,
                    _ => return Err(format!("[{j}].key: a header needs a string key")),
                };
                let val = value(
                    &format!("[{j}].value"),
                    h.remove("value").unwrap_or_default(),
                )?;
                out.push((Cow::Owned(name), val));
            }
        }
        _ => return Err("an object of name: value or a list of {\"key\", \"value\"}".into()),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(body: &str, format: Format) -> Result<Parsed<'_>, IngestError> {
        parse(body.as_bytes(), format, true)
    }

    #[test]
    fn each_format_decodes_keys_and_values_its_own_way() {
        let b = r#"{"records":[{"key":"k","value":{"a":1},"partition":2}]}"#;
        let p = one(b, Format::Json).unwrap();
        assert_eq!(p.records[0].key.as_deref(), Some(&b"\"k\""[..]));
        assert_eq!(p.records[0].value.as_deref(), Some(&br#"{"a":1}"#[..]));
        assert_eq!(p.records[0].partition, Some(2));
        let p = one(b, Format::Plain).unwrap();
        assert_eq!(p.records[0].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(p.records[0].value.as_deref(), Some(&br#"{"a":1}"#[..]));
        let b = r#"{"records":[{"key":"AP8=","value":null,"headers":{"h":"dg=="}}]}"#;
        let p = one(b, Format::Binary).unwrap();
        assert_eq!(p.records[0].key.as_deref(), Some(&[0u8, 255][..]));
        assert!(p.records[0].value.is_none());
        assert_eq!(p.records[0].headers[0].0, "h");
        assert_eq!(p.records[0].headers[0].1.as_deref(), Some(&b"v"[..]));
    }

    #[test]
    fn whitespace_around_values_is_not_part_of_them() {
        let p = one(
            "{ \"records\" : [ { \"key\" :  \"k\" ,\n \"value\"\t: {\"a\": 1} } ] }",
            Format::Plain,
        )
        .unwrap();
        assert_eq!(p.records[0].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(p.records[0].value.as_deref(), Some(&br#"{"a": 1}"#[..]));
    }

    #[test]
    fn escaped_strings_are_unescaped_in_the_plain_format() {
        let p = one(r#"{"value":"a\"b\u00e9"}"#, Format::Plain).unwrap();
        assert_eq!(p.records[0].value.as_deref(), Some("a\"bé".as_bytes()));
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let cases: [(&str, Format, &str); 7] = [
            (
                r#"{"records":[{"value":"%%%"}]}"#,
                Format::Binary,
                "records[0].value: invalid base64",
            ),
            (
                r#"{"records":[{"value":"eA=="},{"key":5}]}"#,
                Format::Binary,
                "records[1].key",
            ),
            (
                r#"{"records":[{"value":"x","partition":-1}]}"#,
                Format::Plain,
                "records[0].partition",
            ),
            (
                r#"{"records":[{"vaule":"x"}]}"#,
                Format::Plain,
                "unknown field `vaule`",
            ),
            (
                r#"{"records":[{"value":"x","headers":[{"value":"v"}]}]}"#,
                Format::Plain,
                "records[0].headers: [0].key",
            ),
            (
                r#"{"records":[]  , "value_schema": "{}"}"#,
                Format::Json,
                "value_schema",
            ),
            (r#"{"topic":"t"}"#, Format::Plain, "records: missing"),
        ];
        for (body, format, want) in cases {
            match one(body, format) {
                Err(IngestError::Unprocessable(m)) => assert!(m.contains(want), "{m} lacks {want}"),
                Err(e) => panic!("{body}: {e:?}"),
                Ok(_) => panic!("{body} was accepted"),
            }
        }
        assert!(matches!(
            one("{\"records\": [", Format::Plain),
            Err(IngestError::BadRequest(_))
        ));
    }

    #[test]
    fn schemad_bodies_carry_their_schemas_and_keep_values_as_json_text() {
        let body = r#"{"value_schema": "{\"type\": \"string\"}", "key_schema_id": 4,
            "records": [{"key": 1, "value": "a"}, {"value": null}]}"#;
        let p = one(body, Format::Schema(SchemaFormat::Avro)).unwrap();
        assert_eq!(
            p.schemas,
            SchemaFields {
                key_schema: None,
                key_schema_id: Some(4),
                value_schema: Some(r#"{"type": "string"}"#.into()),
                value_schema_id: None,
            }
        );
        assert_eq!(p.records[0].value.as_deref(), Some(&br#""a""#[..]));
        assert!(p.records[1].value.is_none());
        // A schema as a JSON object is taken as its text.
        let body = r#"{"value_schema": {"type": "object"}, "records": [{"value": {}}]}"#;
        let p = one(body, Format::Schema(SchemaFormat::JsonSchema)).unwrap();
        assert_eq!(
            p.schemas.value_schema.as_deref(),
            Some(r#"{"type": "object"}"#)
        );
        for (bad, want) in [
            (
                r#"{"value_schema_id": "x", "records": []}"#,
                "value_schema_id",
            ),
            (
                r#"{"value_schema_id": 0, "records": []}"#,
                "value_schema_id",
            ),
            (r#"{"key_schema": 5, "records": []}"#, "key_schema"),
        ] {
            match one(bad, Format::Schema(SchemaFormat::Avro)) {
                Err(IngestError::Unprocessable(m)) => assert!(m.contains(want), "{m}"),
                Err(e) => panic!("{bad}: {e:?}"),
                Ok(_) => panic!("{bad} was accepted"),
            }
        }
    }

    #[test]
    fn a_body_that_is_not_utf8_is_a_bad_request_naming_the_byte() {
        let body = b"{\"records\": [{\"value\": \"ok\xff\"}]}";
        match parse(body, Format::Plain, false) {
            Err(IngestError::BadRequest(m)) => assert!(m.contains("not UTF-8 at byte 26"), "{m}"),
            Err(e) => panic!("{e:?}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn content_types_pick_the_format() {
        assert_eq!(
            format_of("application/vnd.kafka.binary.v2+json"),
            Some(Format::Binary)
        );
        assert_eq!(
            format_of("Application/JSON; charset=utf-8"),
            Some(Format::Plain)
        );
        assert_eq!(
            format_of("application/vnd.kafka.json.v2+json"),
            Some(Format::Json)
        );
        assert_eq!(
            format_of("application/vnd.kafka.v1+json"),
            Some(Format::Binary),
            "the v1 API's default embedded format"
        );
        assert_eq!(
            format_of("application/vnd.kafka.json.v1+json"),
            Some(Format::Json)
        );
        assert_eq!(
            answer_type("application/vnd.kafka.binary.v1+json"),
            "application/vnd.kafka.v1+json"
        );
        assert_eq!(
            answer_type("application/vnd.kafka.binary.v2+json"),
            "application/vnd.kafka.v2+json"
        );
        assert_eq!(format_of("text/plain"), None);
        assert_eq!(
            format_of("application/vnd.kafka.avro.v2+json"),
            Some(Format::Schema(SchemaFormat::Avro))
        );
        assert_eq!(
            format_of("application/vnd.kafka.protobuf.v2+json"),
            Some(Format::Schema(SchemaFormat::Protobuf))
        );
        assert_eq!(
            format_of("application/vnd.kafka.jsonschema.v2+json"),
            Some(Format::Schema(SchemaFormat::JsonSchema))
        );
    }
}
