//! The tantivy schema of a searchable topic's index and the names queries use for its fields.

use std::sync::Arc;

use spate_broker::search_config::{FieldKind, SearchSettings};
use tantivy::schema::{
    DateOptions, DateTimePrecision, Field, IndexRecordOption, JsonObjectOptions, NumericOptions,
    Schema, TextFieldIndexing, TextOptions, FAST, INDEXED, STORED, STRING,
};

use crate::mapping::{EsType, TopicMapping};

/// Tokenizer for analysed text: split on non-alphanumerics, lowercase, drop very long tokens.
pub const TEXT_TOKENIZER: &str = "default";

/// What a query field name stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldRole {
    /// The record's offset (i64).
    Offset,
    /// The record's partition (i64).
    Partition,
    /// The record's timestamp (date, milliseconds).
    Timestamp,
    /// The key as one exact term.
    Key,
    /// The whole value as analysed text.
    Value,
    /// One header, `headers.<name>`, as an exact term.
    Header,
    /// A configured JSON field.
    Json(FieldKind),
    /// A JSON field mapped from the documents (dynamic mapping), with the path in
    /// [`Resolved::path`].
    Dynamic(FieldKind),
}

/// A query field resolved against the schema.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The tantivy field.
    pub field: Field,
    /// Its tantivy name (for fast-field sorts and aggregations).
    pub name: String,
    /// What it holds.
    pub role: FieldRole,
    /// For headers: the header name (terms are `name=value`).
    pub header: Option<String>,
    /// For dynamic fields: the JSON path inside `doc` / `doc_kw`.
    pub path: Option<String>,
}

/// The fields of a topic index.
#[derive(Debug, Clone)]
pub struct IndexSchema {
    /// The tantivy schema.
    pub schema: Schema,
    /// Record offset.
    pub offset: Field,
    /// Partition index.
    pub partition: Field,
    /// Record timestamp.
    pub timestamp: Field,
    /// Key (exact).
    pub key: Field,
    /// Headers as `name=value` terms.
    pub headers: Field,
    /// Value as text.
    pub value: Field,
    /// Names of the fields a record has (`key`, `value`, `headers.<name>`, JSON paths), for
    /// `exists`.
    pub present: Field,
    /// The whole record (key, value, headers) when `search.store.value` is on.
    pub stored_record: Option<Field>,
    /// Configured JSON fields: (path, kind, field, tantivy name).
    pub json: Vec<(String, FieldKind, Field, String)>,
    /// Every JSON field's text, analysed, by path (dynamic mapping).
    pub doc: Field,
    /// Every JSON field's exact value (keyword, number, date, boolean) by path, as columns
    /// only (no inverted index): term, range and prefix queries on it read the column, as do
    /// sorts and aggregations. Indexing every exact value a second time (its term dictionary)
    /// took half the indexing time, and exact-value queries are filters that a column answers.
    pub doc_kw: Field,
    /// The event's time: the document's own `@timestamp`, else the record's timestamp.
    pub event_time: Field,
    /// The document field that is its time (`search.time.field`), held in `event_time`.
    pub time_field: String,
    /// The type each JSON path got from its first value, shared with queries: published
    /// whole by the indexer (a swap, no lock a query could wait on behind an indexing thread
    /// at idle priority).
    pub dynamic: Arc<arc_swap::ArcSwap<TopicMapping>>,
    /// `search.max.fields`.
    pub max_fields: usize,
}

fn text_options(tokenizer: &str, positions: bool) -> TextOptions {
    let option = if positions {
        IndexRecordOption::WithFreqsAndPositions
    } else {
        IndexRecordOption::Basic
    };
    TextOptions::default().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer(tokenizer)
            .set_index_option(option),
    )
}

fn date_options() -> DateOptions {
    DateOptions::default()
        .set_indexed()
        .set_fast()
        .set_precision(DateTimePrecision::Milliseconds)
}

impl IndexSchema {
    /// The schema for a topic's settings. JSON fields get positional names (`json_0`, ...)
    /// so that dotted paths never meet tantivy's own path syntax.
    pub fn build(settings: &SearchSettings) -> Self {
        let mut b = Schema::builder();
        // Not stored: hits are read by their offset column and rendered from the log; a
        // document store compressed for every record (zstd) cost indexing time for nothing.
        let num = NumericOptions::default().set_indexed().set_fast();
        let offset = b.add_i64_field("offset", num.clone());
        let partition = b.add_i64_field("partition", num);
        let timestamp = b.add_date_field("timestamp", date_options());
        let key = b.add_text_field("key", STRING | FAST);
        let headers = b.add_text_field("headers", STRING);
        let value = b.add_text_field("value", text_options(TEXT_TOKENIZER, true));
        let present = b.add_text_field("present", STRING);
        let stored_record = settings
            .store_value
            .then(|| b.add_bytes_field("record", STORED));
        // Dots in a key are paths, as Elasticsearch reads `{"http.status": 200}`.
        let doc = b.add_json_field(
            "doc",
            JsonObjectOptions::default()
                .set_expand_dots_enabled()
                .set_indexing_options(
                    TextFieldIndexing::default()
                        .set_tokenizer(TEXT_TOKENIZER)
                        .set_index_option(IndexRecordOption::WithFreqsAndPositions),
                ),
        );
        let doc_kw = b.add_json_field(
            "doc_kw",
            JsonObjectOptions::default()
                .set_expand_dots_enabled()
                .set_fast("raw"),
        );
        let event_time = b.add_date_field("event_time", date_options());
        let mut json = Vec::new();
        for (i, f) in settings.fields.iter().enumerate() {
            let name = format!("json_{i}");
            let field = match f.kind {
                FieldKind::Text => b.add_text_field(&name, text_options(TEXT_TOKENIZER, true)),
                FieldKind::Keyword => b.add_text_field(&name, STRING | FAST),
                FieldKind::Number => b.add_f64_field(&name, INDEXED | FAST),
                FieldKind::Date => b.add_date_field(&name, date_options()),
            };
            json.push((f.path.clone(), f.kind, field, name));
        }
        Self {
            schema: b.build(),
            offset,
            partition,
            timestamp,
            key,
            headers,
            value,
            present,
            stored_record,
            json,
            doc,
            doc_kw,
            event_time,
            dynamic: Arc::new(arc_swap::ArcSwap::from_pointee(TopicMapping::default())),
            max_fields: settings.max_fields,
            time_field: settings.time_field.clone(),
        }
    }

    /// Resolves a field name from a query (`offset`, `timestamp`, `key`, `value`,
    /// `headers.<name>`, or a configured JSON path); `None` for an unknown field, which
    /// matches nothing (as an unmapped field does in Elasticsearch).
    pub fn resolve(&self, name: &str) -> Option<Resolved> {
        let fixed = |field: Field, n: &str, role| {
            Some(Resolved {
                field,
                name: n.to_string(),
                role,
                header: None,
                path: None,
            })
        };
        // The documents' time field, whatever its name (`event_time`).
        if name == self.time_field {
            return fixed(self.event_time, "event_time", FieldRole::Timestamp);
        }
        match name {
            "offset" | "_offset" => return fixed(self.offset, "offset", FieldRole::Offset),
            "partition" | "_partition" => {
                return fixed(self.partition, "partition", FieldRole::Partition)
            }
            "timestamp" | "_timestamp" => {
                return fixed(self.timestamp, "timestamp", FieldRole::Timestamp)
            }
            "key" | "key.keyword" => return fixed(self.key, "key", FieldRole::Key),
            "value" | "_all" | "*" => return fixed(self.value, "value", FieldRole::Value),
            _ => {}
        }
        if let Some(header) = name.strip_prefix("headers.") {
            return Some(Resolved {
                field: self.headers,
                name: "headers".into(),
                role: FieldRole::Header,
                header: Some(header.to_string()),
                path: None,
            });
        }
        // `path.keyword` is how Elasticsearch users address the exact form of a field.
        let keyword = name.strip_suffix(".keyword");
        let path = keyword.unwrap_or(name);
        if let Some(r) =
            self.json
                .iter()
                .find(|(p, ..)| p == name || p == path)
                .map(|(_, kind, field, n)| Resolved {
                    field: *field,
                    name: n.clone(),
                    role: FieldRole::Json(*kind),
                    header: None,
                    path: None,
                })
        {
            return Some(r);
        }
        // A field the documents brought (dynamic mapping); `.keyword` of a text field is its
        // exact form.
        let mapping = self.dynamic.load();
        let (path, f) = match mapping.fields.get(name) {
            Some(f) => (name, *f),
            None => match (keyword, mapping.fields.get(path)) {
                (Some(_), Some(f)) if f.keyword => (path, *f),
                _ => return None,
            },
        };
        let exact = keyword.is_some() && path != name;
        let kind = match f.ty {
            EsType::Text if exact => FieldKind::Keyword,
            EsType::Text => FieldKind::Text,
            EsType::Keyword | EsType::Boolean => FieldKind::Keyword,
            EsType::Long | EsType::Integer | EsType::Double => FieldKind::Number,
            EsType::Date => FieldKind::Date,
        };
        Some(Resolved {
            field: if kind == FieldKind::Text {
                self.doc
            } else {
                self.doc_kw
            },
            // Aggregations and sorts read the exact column, text fields included.
            name: format!("doc_kw.{path}"),
            role: FieldRole::Dynamic(kind),
            header: None,
            path: Some(path.to_string()),
        })
    }

    /// What a search without a field (`query_string` and `multi_match` naming none, `value`,
    /// `_all`, `*`) looks in, as Elasticsearch's `index.query.default_field: *` does: the
    /// value's own text (held only for values that are not JSON objects), every configured
    /// text field and every text field the documents brought.
    pub fn unqualified_fields(&self) -> Vec<Resolved> {
        let mut v = vec![Resolved {
            field: self.value,
            name: "value".into(),
            role: FieldRole::Value,
            header: None,
            path: None,
        }];
        v.extend(
            self.json
                .iter()
                .filter(|(_, k, ..)| *k == FieldKind::Text)
                .map(|(_, kind, f, n)| Resolved {
                    field: *f,
                    name: n.clone(),
                    role: FieldRole::Json(*kind),
                    header: None,
                    path: None,
                }),
        );
        let mapping = self.dynamic.load();
        v.extend(
            mapping
                .fields
                .iter()
                .filter(|(_, f)| f.ty == EsType::Text)
                .map(|(path, _)| Resolved {
                    field: self.doc,
                    name: format!("doc_kw.{path}"),
                    role: FieldRole::Dynamic(FieldKind::Text),
                    header: None,
                    path: Some(path.clone()),
                }),
        );
        v
    }
}
