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

/// The value read the way the topic's format says: `Some(json)` for a JSON document.
pub fn parse_value(value: &[u8], format: ValueFormat) -> Option<Value> {
    let looks_structured = || {
        value
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|b| *b == b'{' || *b == b'[')
    };
    match format {
        ValueFormat::Text => None,
        ValueFormat::Json => serde_json::from_slice(value).ok(),
        ValueFormat::Auto if looks_structured() => serde_json::from_slice(value).ok(),
        ValueFormat::Auto => None,
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
    match &r.value {
        None => Value::Object(Map::new()),
        Some(v) => match parse_value(v, format) {
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
