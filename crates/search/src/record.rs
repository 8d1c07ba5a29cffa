//! Records as search sees them: decoded from stored batches (any codec), and the
//! `_source` object a hit returns.

use bytes::Bytes;
use serde_json::{Map, Value};
use spate_broker::search_config::ValueFormat;
use spate_protocol::batch::Batches;
use spate_protocol::records::RecordBatchDecoder;

use crate::error::SearchError;

/// One record of a partition.
#[derive(Debug, Clone, PartialEq)]
pub struct LogRecord {
    /// Offset.
    pub offset: i64,
    /// Timestamp in epoch milliseconds.
    pub timestamp: i64,
    /// Key bytes.
    pub key: Option<Bytes>,
    /// Value bytes.
    pub value: Option<Bytes>,
    /// Headers in produce order.
    pub headers: Vec<(String, Option<Bytes>)>,
}

/// What decoding a run of stored batches gave.
#[derive(Debug, Default)]
pub struct Decoded {
    /// Data records in offset order (control records of transactions are left out).
    pub records: Vec<LogRecord>,
    /// The offset after the last whole batch seen.
    pub next_offset: Option<i64>,
    /// Batches that could not be decoded, as (base offset, reason); their offsets are skipped.
    pub undecodable: Vec<(i64, String)>,
}

/// Decodes every whole batch in `bytes` (as a log read returns them), decompressing gzip,
/// snappy, lz4 and zstd batches. Records below `from` (the first batch may start earlier)
/// are left out.
pub fn decode_batches(bytes: &Bytes, from: i64) -> Decoded {
    let mut out = Decoded::default();
    let mut batches = Batches::new(bytes);
    for (at, header) in batches.by_ref() {
        out.next_offset = Some(header.next_offset());
        if header.is_control() {
            continue;
        }
        let mut one = bytes.slice(at..at + header.total_len());
        match RecordBatchDecoder::decode(&mut one) {
            Ok(set) => out.records.extend(
                set.records
                    .into_iter()
                    .filter(|r| r.offset >= from && !r.control)
                    .map(|r| LogRecord {
                        offset: r.offset,
                        timestamp: r.timestamp,
                        key: r.key,
                        value: r.value,
                        headers: r
                            .headers
                            .into_iter()
                            .map(|(k, v)| (k.to_string(), v))
                            .collect(),
                    }),
            ),
            Err(e) => out.undecodable.push((header.base_offset, e.to_string())),
        }
    }
    out
}

/// Text of bytes that may not be UTF-8: invalid sequences become U+FFFD, so such values are
/// still indexed as far as they read.
pub fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Decodes values written in a schema registry's wire format (magic byte 0, a 4-byte
/// big-endian schema id, then the payload) with the registered schema. Set on the search
/// service by whoever runs a registry in the process, so this crate needs none.
pub trait ValueDecoder: Send + Sync {
    /// `None` when no schema has the value's id; otherwise the value as JSON, or why it
    /// cannot be read with its schema. Must not panic on any input.
    fn decode(&self, value: &[u8]) -> Option<Result<Value, String>>;

    /// Whether the value names a schema id the registry does not know yet but may soon (a
    /// registration not replicated to this node yet), so that indexing waits for it rather
    /// than index the value as text for good. Cheap: asked of every schema'd value.
    fn awaits_schema(&self, _value: &[u8]) -> bool {
        false
    }
}

/// Whether a value starts like the schema registry's wire format: magic byte 0 and room for
/// a schema id.
pub fn has_schema_header(value: &[u8]) -> bool {
    value.len() >= 5 && value[0] == 0
}

/// The value read the way the topic's format says: `Some(json)` for a JSON document.
pub fn parse_value(value: &[u8], format: ValueFormat) -> Option<Value> {
    read_value(value, format, None).unwrap_or(None)
}

/// [`parse_value`] with the schema registry's decoder: `Err` (why) for a value the format
/// says is schema'd that could not be decoded, which is then indexed as text.
pub fn read_value(
    value: &[u8],
    format: ValueFormat,
    decoder: Option<&dyn ValueDecoder>,
) -> Result<Option<Value>, String> {
    let looks_structured = || {
        value
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|b| *b == b'{' || *b == b'[')
    };
    match format {
        ValueFormat::Text => Ok(None),
        ValueFormat::Json => Ok(serde_json::from_slice(value).ok()),
        // Auto-detected only when the id is a known schema: text may start with a NUL too.
        ValueFormat::Auto if has_schema_header(value) => {
            match decoder.and_then(|d| d.decode(value)) {
                Some(decoded) => decoded.map(Some),
                None => Ok(None),
            }
        }
        ValueFormat::Auto if looks_structured() => Ok(serde_json::from_slice(value).ok()),
        ValueFormat::Auto => Ok(None),
        ValueFormat::Schema if !has_schema_header(value) => {
            Err("no schema header (magic byte 0 and a schema id)".into())
        }
        ValueFormat::Schema => match decoder {
            None => Err("no schema registry runs on this node".into()),
            Some(d) => match d.decode(value) {
                Some(decoded) => decoded.map(Some),
                None => Err(format!(
                    "no schema has id {}",
                    i32::from_be_bytes([value[1], value[2], value[3], value[4]])
                )),
            },
        },
    }
}

/// The value at a dotted path; arrays along the way contribute every element.
pub fn values_at<'a>(doc: &'a Value, path: &str) -> Vec<&'a Value> {
    let mut current = vec![doc];
    for segment in path.split('.') {
        let mut next = Vec::new();
        for v in current {
            match v {
                Value::Object(m) => {
                    if let Some(child) = m.get(segment) {
                        next.push(child);
                    }
                }
                Value::Array(items) => next.extend(
                    items
                        .iter()
                        .filter_map(|i| i.as_object().and_then(|m| m.get(segment))),
                ),
                _ => {}
            }
        }
        current = next;
    }
    // A leaf array stands for its elements.
    current
        .into_iter()
        .flat_map(|v| match v {
            Value::Array(items) => items.iter().collect::<Vec<_>>(),
            other => vec![other],
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// The `_source` of a hit: the document as its producer wrote it when the value is a JSON
/// object (as Elasticsearch returns a document); otherwise `{"value": ...}` with the JSON or
/// text. The record's own fields are in [`kafka_meta`].
pub fn source(r: &LogRecord, format: ValueFormat) -> Value {
    source_decoded(r, format, None)
}

/// [`source`] with the schema registry's decoder: a schema'd value shows as the object it
/// decodes to, as it was indexed.
pub fn source_decoded(
    r: &LogRecord,
    format: ValueFormat,
    decoder: Option<&dyn ValueDecoder>,
) -> Value {
    match &r.value {
        None => Value::Object(Map::new()),
        Some(v) => match read_value(v, format, decoder).unwrap_or(None) {
            Some(doc @ Value::Object(_)) => doc,
            Some(other) => serde_json::json!({ "value": other }),
            None => serde_json::json!({ "value": lossy(v) }),
        },
    }
}

/// A hit's `_kafka`: where the document lives and the record's own fields (topic,
/// partition, offset, timestamp, key, headers).
pub fn kafka_meta(r: &LogRecord, topic: &str, partition: i32) -> Value {
    let headers: Map<String, Value> = r
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_ref()
                    .map(|v| Value::String(lossy(v)))
                    .unwrap_or(Value::Null),
            )
        })
        .collect();
    let mut m = Map::new();
    m.insert(
        "key".into(),
        r.key
            .as_ref()
            .map(|k| Value::String(lossy(k)))
            .unwrap_or(Value::Null),
    );
    m.insert("headers".into(), Value::Object(headers));
    m.insert("timestamp".into(), Value::from(r.timestamp));
    m.insert("topic".into(), Value::from(topic));
    m.insert("partition".into(), Value::from(partition));
    m.insert("offset".into(), Value::from(r.offset));
    Value::Object(m)
}

/// Encodes key, value and headers for the index's stored field (`search.store.value`).
pub fn encode_stored(r: &LogRecord) -> Vec<u8> {
    let b64 = |b: &Option<Bytes>| b.as_ref().map(|b| b.to_vec());
    let v = serde_json::json!({
        "t": r.timestamp,
        "k": b64(&r.key),
        "v": b64(&r.value),
        "h": r.headers.iter().map(|(k, v)| (k.clone(), b64(v))).collect::<Vec<_>>(),
    });
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Reads back what [`encode_stored`] wrote.
pub fn decode_stored(offset: i64, bytes: &[u8]) -> Result<LogRecord, SearchError> {
    #[derive(serde::Deserialize)]
    struct Stored {
        t: i64,
        k: Option<Vec<u8>>,
        v: Option<Vec<u8>>,
        h: Vec<(String, Option<Vec<u8>>)>,
    }
    let s: Stored = serde_json::from_slice(bytes).map_err(|e| SearchError::Index {
        reason: format!("stored record at offset {offset} is unreadable: {e}"),
    })?;
    Ok(LogRecord {
        offset,
        timestamp: s.t,
        key: s.k.map(Bytes::from),
        value: s.v.map(Bytes::from),
        headers: s
            .h
            .into_iter()
            .map(|(k, v)| (k, v.map(Bytes::from)))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_protocol::batch::{build, NewRecord};
    use spate_protocol::records::Compression;

    fn batch(values: &[&str], compression: Compression) -> Bytes {
        let records: Vec<NewRecord> = values
            .iter()
            .map(|v| NewRecord {
                value: Some(Bytes::copy_from_slice(v.as_bytes())),
                ..NewRecord::default()
            })
            .collect();
        build(&records, None, compression).unwrap()
    }

    #[test]
    fn every_codec_decodes_to_the_same_records() {
        for c in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let d = decode_batches(&batch(&["a b", "c"], c), 0);
            let values: Vec<_> = d
                .records
                .iter()
                .map(|r| lossy(r.value.as_ref().unwrap()))
                .collect();
            assert_eq!(values, ["a b", "c"], "{c:?}");
            assert_eq!(d.next_offset, Some(2));
        }
    }

    #[test]
    fn records_before_the_start_offset_are_left_out() {
        let d = decode_batches(&batch(&["a", "b", "c"], Compression::None), 1);
        assert_eq!(
            d.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
            [1, 2]
        );
    }

    #[test]
    fn json_paths_reach_into_objects_and_arrays() {
        let doc: Value = serde_json::json!({"user": {"name": "ann"}, "tags": ["x", "y"], "items": [{"n": 1}, {"n": 2}]});
        assert_eq!(values_at(&doc, "user.name"), [&Value::from("ann")]);
        assert_eq!(values_at(&doc, "tags").len(), 2);
        assert_eq!(values_at(&doc, "items.n").len(), 2);
        assert!(values_at(&doc, "user.age").is_empty());
    }

    #[test]
    fn auto_format_reads_only_objects_and_arrays_as_json() {
        assert!(parse_value(b" {\"a\":1}", ValueFormat::Auto).is_some());
        assert!(parse_value(b"42", ValueFormat::Auto).is_none());
        assert!(parse_value(b"42", ValueFormat::Json).is_some());
        assert!(parse_value(b"{not json", ValueFormat::Json).is_none());
        assert!(parse_value(b"{\"a\":1}", ValueFormat::Text).is_none());
    }

    /// Knows schema 1 only: its values decode to `{"n": <payload length>}`, unless the
    /// payload is `bad`.
    struct OneSchema;

    impl ValueDecoder for OneSchema {
        fn decode(&self, value: &[u8]) -> Option<Result<Value, String>> {
            if value.get(1..5) != Some(&[0, 0, 0, 1]) {
                return None;
            }
            Some(match &value[5..] {
                b"bad" => Err("malformed".into()),
                p => Ok(serde_json::json!({ "n": p.len() })),
            })
        }
    }

    #[test]
    fn schema_format_decodes_known_ids_and_says_why_others_cannot_be() {
        let d: Option<&dyn ValueDecoder> = Some(&OneSchema);
        let read = |v: &[u8]| read_value(v, ValueFormat::Schema, d);
        assert_eq!(
            read(b"\0\0\0\0\x01abc"),
            Ok(Some(serde_json::json!({"n": 3})))
        );
        assert!(read(b"\0\0\0\0\x01bad").is_err(), "malformed payload");
        assert!(read(b"\0\0\0\0\x02abc").is_err(), "unknown id");
        assert!(read(b"\x01\0\0\0\x01abc").is_err(), "wrong magic byte");
        assert!(read(b"\0\0").is_err(), "too short for a header");
        assert!(read(b"{\"a\":1}").is_err(), "plain JSON has no header");
        assert!(read_value(b"\0\0\0\0\x01abc", ValueFormat::Schema, None).is_err());
    }

    #[test]
    fn auto_format_decodes_values_of_known_schemas_only() {
        let d: Option<&dyn ValueDecoder> = Some(&OneSchema);
        let read = |v: &[u8]| read_value(v, ValueFormat::Auto, d);
        assert_eq!(
            read(b"\0\0\0\0\x01ab"),
            Ok(Some(serde_json::json!({"n": 2})))
        );
        assert_eq!(read(b"\0\0\0\0\x09ab"), Ok(None), "unknown id: text");
        assert!(read(b"\0\0\0\0\x01bad").is_err(), "known id, malformed");
        assert_eq!(read(b"{\"a\":1}"), Ok(Some(serde_json::json!({"a": 1}))));
        assert_eq!(
            read_value(b"\0\0\0\0\x01ab", ValueFormat::Auto, None),
            Ok(None)
        );
    }

    #[test]
    fn the_source_of_a_schema_value_is_its_decoded_object() {
        let r = LogRecord {
            offset: 0,
            timestamp: 0,
            key: None,
            value: Some(Bytes::from_static(b"\0\0\0\0\x01abcd")),
            headers: vec![],
        };
        assert_eq!(
            source_decoded(&r, ValueFormat::Schema, Some(&OneSchema)),
            serde_json::json!({"n": 4})
        );
        let garbage = LogRecord {
            value: Some(Bytes::from_static(b"\0\xff\xff\xff\xffzz")),
            ..r
        };
        let shown = source_decoded(&garbage, ValueFormat::Schema, Some(&OneSchema));
        assert!(shown["value"].as_str().unwrap().ends_with("zz"), "{shown}");
    }

    #[test]
    fn stored_records_round_trip() {
        let r = LogRecord {
            offset: 7,
            timestamp: 1,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(&[0xff, 0x00])),
            headers: vec![("h".into(), None)],
        };
        assert_eq!(decode_stored(7, &encode_stored(&r)).unwrap(), r);
    }
}
