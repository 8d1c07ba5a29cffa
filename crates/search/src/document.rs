//! Record -> tantivy document for a partition's schema.

use serde_json::Value;
use spate_broker::search_config::{FieldKind, SearchSettings};
use tantivy::{DateTime, TantivyDocument};

use crate::dates::parse_date;
use crate::mapping::TopicMapping;
use crate::record::{encode_stored, lossy, read_value, values_at, LogRecord, ValueDecoder};
use crate::schema::IndexSchema;

/// What building a document found: what dynamic mapping left out (for the metrics), and
/// the document's event time.
#[derive(Debug, Default, Clone, Copy)]
pub struct Built {
    /// Values of new fields past `search.max.fields`.
    pub unmapped: u64,
    /// Values that did not fit their field's type.
    pub conflicts: u64,
    /// Schema'd values that could not be decoded (indexed as text).
    pub undecodable: u64,
    /// The event time (epoch ms): the time field's value, else the record's timestamp.
    pub event_ms: i64,
}

/// Builds the document of one record. Values that are not UTF-8 are indexed as far as they
/// decode; a JSON field whose value has the wrong type is left out of that record. Every
/// field of a JSON object is indexed by its path, typed by dynamic mapping.
pub fn build(
    schema: &IndexSchema,
    settings: &SearchSettings,
    partition: i32,
    r: &LogRecord,
) -> TantivyDocument {
    // Maps into a copy published after: callers of this convenience index one at a time.
    let mut mapping = TopicMapping::clone(&schema.dynamic.load());
    let doc = build_counted(schema, &mut mapping, settings, None, partition, r).0;
    schema.dynamic.store(std::sync::Arc::new(mapping));
    doc
}

/// [`build`] with the schema registry's decoder, mapping new fields in `mapping` (the
/// indexer's own copy, published to queries after each step), also saying what dynamic
/// mapping left out.
pub fn build_counted(
    schema: &IndexSchema,
    mapping: &mut TopicMapping,
    settings: &SearchSettings,
    decoder: Option<&dyn ValueDecoder>,
    partition: i32,
    r: &LogRecord,
) -> (TantivyDocument, Built) {
    let mut skipped = Built::default();
    // Room for the value's strings twice (text and exact forms), their paths and the fixed
    // fields: growing the document's buffer on the way moved every byte again.
    let value_len = r.value.as_ref().map_or(0, |v| v.len());
    let mut doc = TantivyDocument::with_capacity(3 * value_len + 512);
    doc.add_i64(schema.offset, r.offset);
    doc.add_i64(schema.partition, partition as i64);
    doc.add_date(
        schema.timestamp,
        DateTime::from_timestamp_millis(r.timestamp),
    );
    if let Some(k) = &r.key {
        doc.add_text(schema.key, lossy(k));
        doc.add_text(schema.present, "key");
    }
    for (name, v) in &r.headers {
        let v = v.as_deref().map(lossy).unwrap_or_default();
        doc.add_text(schema.headers, format!("{name}={v}"));
        doc.add_text(schema.present, format!("headers.{name}"));
    }
    let mut event_ms = r.timestamp;
    if let Some(v) = &r.value {
        doc.add_text(schema.present, "value");
        let json = read_value(v, settings.format, decoder).unwrap_or_else(|_| {
            skipped.undecodable = 1;
            None
        });
        // A JSON object's words are indexed by path (`doc`), and a search without a field
        // looks in every path (`IndexSchema::unqualified_fields`): indexing the raw text too
        // would index every word twice.
        if !matches!(json, Some(Value::Object(_))) {
            doc.add_text(schema.value, lossy(v));
        }
        if let Some(json) = json {
            if !schema.json.is_empty() {
                add_json_fields(&mut doc, schema, &json, r.timestamp);
            }
            if let Some(ms) = crate::record::values_at(&json, &schema.time_field)
                .first()
                .and_then(|t| parse_date(t, r.timestamp))
            {
                event_ms = ms;
            }
            let indexed = mapping.index_document(json, schema.max_fields, r.timestamp);
            if let Some(exact) = &indexed.exact {
                doc.add_field_value(schema.doc_kw, exact);
            }
            if let Some(text) = &indexed.text {
                doc.add_field_value(schema.doc, text);
            }
            for p in &indexed.paths {
                doc.add_text(schema.present, p);
            }
            skipped.unmapped = indexed.unmapped;
            skipped.conflicts = indexed.conflicts;
        }
    }
    doc.add_date(schema.event_time, DateTime::from_timestamp_millis(event_ms));
    skipped.event_ms = event_ms;
    if let Some(f) = schema.stored_record {
        doc.add_bytes(f, &encode_stored(r));
    }
    (doc, skipped)
}

fn add_json_fields(doc: &mut TantivyDocument, schema: &IndexSchema, json: &Value, ts: i64) {
    for (path, kind, field, _) in &schema.json {
        let mut any = false;
        for v in values_at(json, path) {
            let added = match (kind, v) {
                (FieldKind::Text, Value::String(s)) => {
                    doc.add_text(*field, s);
                    true
                }
                (FieldKind::Text, Value::Number(_) | Value::Bool(_)) => {
                    doc.add_text(*field, v.to_string());
                    true
                }
                (FieldKind::Keyword, Value::String(s)) => {
                    doc.add_text(*field, s);
                    true
                }
                (FieldKind::Keyword, Value::Number(_) | Value::Bool(_)) => {
                    doc.add_text(*field, v.to_string());
                    true
                }
                (FieldKind::Number, Value::Number(n)) => match n.as_f64() {
                    Some(f) => {
                        doc.add_f64(*field, f);
                        true
                    }
                    None => false,
                },
                (FieldKind::Number, Value::String(s)) => match s.trim().parse::<f64>() {
                    Ok(f) if f.is_finite() => {
                        doc.add_f64(*field, f);
                        true
                    }
                    _ => false,
                },
                // `now` in a stored value means the record's own time.
                (FieldKind::Date, _) => match parse_date(v, ts) {
                    Some(ms) => {
                        doc.add_date(*field, DateTime::from_timestamp_millis(ms));
                        true
                    }
                    None => false,
                },
                _ => false,
            };
            any |= added;
        }
        if any {
            doc.add_text(schema.present, path);
        }
    }
}
