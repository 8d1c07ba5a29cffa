//! What a searchable topic's fields are, in Elasticsearch's terms: the answer to `_mapping`
//! and `_field_caps`, which query editors (Grafana's, Kibana's, OpenSearch Dashboards')
//! read to offer fields and to find the time field.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};
use spate_broker::search_config::{FieldKind, SearchSettings};
use tantivy::schema::OwnedValue;
use tantivy::DateTime;

use crate::dates::parse_date;

/// Longest string also indexed as an exact term (Elasticsearch's `ignore_above` of the
/// keyword sub-field it maps strings with).
pub const KEYWORD_IGNORE_ABOVE: usize = 256;

/// A field type as Elasticsearch names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EsType {
    /// Analysed full text.
    Text,
    /// One exact term.
    Keyword,
    /// A 64-bit integer.
    Long,
    /// A 32-bit integer.
    Integer,
    /// A floating-point number.
    Double,
    /// A date (epoch milliseconds).
    Date,
    /// true or false.
    Boolean,
}

impl EsType {
    /// Elasticsearch's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            EsType::Text => "text",
            EsType::Keyword => "keyword",
            EsType::Long => "long",
            EsType::Integer => "integer",
            EsType::Double => "double",
            EsType::Date => "date",
            EsType::Boolean => "boolean",
        }
    }

    /// Whether terms aggregations and sorts may use it (text fields need their keyword
    /// sub-field, as in Elasticsearch).
    pub fn aggregatable(self) -> bool {
        self != EsType::Text
    }
}

/// One field of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldMapping {
    /// Its type.
    pub ty: EsType,
    /// A text field also indexed exactly as `<path>.keyword`.
    pub keyword: bool,
}

/// The fields of one topic, by dotted path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicMapping {
    /// Path -> field.
    pub fields: BTreeMap<String, FieldMapping>,
}

/// A document's leaves by dotted path: exact forms and text.
#[derive(Default)]
struct Flat {
    exact: Vec<(String, OwnedValue)>,
    text: Vec<(String, OwnedValue)>,
}

/// What one document adds to the index under dynamic mapping.
#[derive(Debug, Default)]
pub struct Indexed {
    /// The exact values by path (keyword, number, date, boolean; strings of text fields too).
    pub exact: Option<OwnedValue>,
    /// The text of text fields by path.
    pub text: Option<OwnedValue>,
    /// Paths that got a value with no exact form (text over the keyword limit): `exists`
    /// finds the others in their columns.
    pub paths: Vec<String>,
    /// Values left out because the mapping was full.
    pub unmapped: u64,
    /// Values left out because they did not fit their path's type.
    pub conflicts: u64,
}

/// Whether a string is a date to dynamic mapping: an ISO 8601 / RFC 3339 date with or
/// without a time (Elasticsearch's `strict_date_optional_time`), not digits.
fn looks_like_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 10
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[7] == b'-'
        && parse_date(&Value::from(s), 0).is_some()
}

/// Whether a number at `path` is taken for epoch milliseconds: a time-like name and a value
/// between 2000 and 2100.
fn epoch_millis_at(path: &str, n: f64) -> bool {
    let leaf = path.rsplit('.').next().unwrap_or(path);
    let named = matches!(leaf, "@timestamp" | "timestamp" | "time" | "ts")
        || leaf.ends_with("_at")
        || leaf.ends_with("_time")
        || leaf.ends_with("_ts");
    named && (946_684_800_000.0..=4_102_444_800_000.0).contains(&n)
}

/// The type dynamic mapping gives a first value (`None` for nulls, objects and arrays).
fn infer(path: &str, v: &Value) -> Option<FieldMapping> {
    let plain = |ty| FieldMapping { ty, keyword: false };
    Some(match v {
        Value::String(s) if looks_like_date(s) => plain(EsType::Date),
        Value::String(_) => FieldMapping {
            ty: EsType::Text,
            keyword: true,
        },
        Value::Bool(_) => plain(EsType::Boolean),
        Value::Number(n) => match n.as_f64() {
            Some(f) if epoch_millis_at(path, f) => plain(EsType::Date),
            _ if n.is_i64() || n.is_u64() => plain(EsType::Long),
            _ => plain(EsType::Double),
        },
        _ => return None,
    })
}

impl TopicMapping {
    /// Maps and converts a JSON document for indexing: each leaf path keeps the type its
    /// first value gave it; new paths are added while the mapping has fewer than
    /// `max_fields`. `record_ms` anchors `now` in date strings.
    pub fn index_document(&mut self, doc: Value, max_fields: usize, record_ms: i64) -> Indexed {
        let mut out = Indexed::default();
        if let Value::Object(_) = doc {
            // Flat objects keyed by dotted path: the fields are indexed with dots expanded, so
            // `{"a.b": 1}` is `{"a": {"b": 1}}` to tantivy, and a flat object costs no nested
            // vectors and no key copies per level.
            let mut flat = Flat::default();
            let mut path = String::new();
            self.walk(&mut path, doc, max_fields, record_ms, &mut out, &mut flat);
            let obj =
                |v: Vec<(String, OwnedValue)>| (!v.is_empty()).then_some(OwnedValue::Object(v));
            out.exact = obj(flat.exact);
            out.text = obj(flat.text);
        }
        out
    }

    /// Adds the leaves of `v` (at `path`, a buffer the walk extends and cuts back) to `flat`.
    fn walk(
        &mut self,
        path: &mut String,
        v: Value,
        max: usize,
        now: i64,
        out: &mut Indexed,
        flat: &mut Flat,
    ) {
        match v {
            Value::Null => {}
            Value::Object(m) => {
                for (k, child) in m {
                    if k.is_empty() {
                        continue;
                    }
                    let len = path.len();
                    if len > 0 {
                        path.push('.');
                    }
                    path.push_str(&k);
                    self.walk(path, child, max, now, out, flat);
                    path.truncate(len);
                }
            }
            Value::Array(items) => {
                for item in items {
                    self.walk(path, item, max, now, out, flat);
                }
            }
            leaf => {
                let (exact, text) = self.typed(path, leaf, max, now, out);
                if let Some(e) = exact {
                    flat.exact.push((path.clone(), e));
                }
                if let Some(t) = text {
                    flat.text.push((path.clone(), t));
                }
            }
        }
    }

    /// One leaf's exact and text forms under the type its path has (mapped now if new).
    fn typed(
        &mut self,
        path: &str,
        leaf: Value,
        max: usize,
        now: i64,
        out: &mut Indexed,
    ) -> (Option<OwnedValue>, Option<OwnedValue>) {
        let f = match self.fields.get(path) {
            Some(f) => *f,
            None if self.fields.len() >= max => {
                out.unmapped += 1;
                return (None, None);
            }
            None => match infer(path, &leaf) {
                Some(f) => {
                    self.fields.insert(path.to_string(), f);
                    f
                }
                None => return (None, None),
            },
        };
        let as_text = |leaf: Value| match leaf {
            Value::String(s) => s,
            other => other.to_string(),
        };
        let converted = match f.ty {
            EsType::Text => {
                let s = as_text(leaf);
                let exact = (s.len() <= KEYWORD_IGNORE_ABOVE).then(|| OwnedValue::Str(s.clone()));
                Some((exact, Some(OwnedValue::Str(s))))
            }
            EsType::Keyword => Some((Some(OwnedValue::Str(as_text(leaf))), None)),
            EsType::Boolean => match leaf {
                Value::Bool(b) => Some((Some(OwnedValue::Str(b.to_string())), None)),
                Value::String(s) if s == "true" || s == "false" => {
                    Some((Some(OwnedValue::Str(s)), None))
                }
                _ => None,
            },
            EsType::Long | EsType::Integer | EsType::Double => {
                let n = match &leaf {
                    Value::Number(n) => n.as_f64(),
                    Value::String(s) => s.trim().parse::<f64>().ok(),
                    _ => None,
                };
                n.filter(|n| n.is_finite())
                    .map(|n| (Some(OwnedValue::F64(n)), None))
            }
            EsType::Date => parse_date(&leaf, now).map(|ms| {
                (
                    Some(OwnedValue::Date(DateTime::from_timestamp_millis(ms))),
                    None,
                )
            }),
        };
        match converted {
            Some(pair) => {
                // A value with an exact form is found by `exists` in its column; only one
                // without (text longer than the keyword limit) is named for it. Naming every
                // path took a third of the indexing time.
                if pair.0.is_none() {
                    out.paths.push(path.to_string());
                }
                pair
            }
            None => {
                out.conflicts += 1;
                (None, None)
            }
        }
    }

    /// The mapping as stored in an index's commit: path -> type name (`text+keyword` for a
    /// text field with its keyword sub-field).
    pub fn to_stored(&self) -> BTreeMap<String, String> {
        self.fields
            .iter()
            .map(|(p, f)| {
                let t = if f.keyword {
                    format!("{}+keyword", f.ty.name())
                } else {
                    f.ty.name().to_string()
                };
                (p.clone(), t)
            })
            .collect()
    }

    /// Reads back [`TopicMapping::to_stored`]; unknown type names are left out.
    pub fn from_stored(stored: &BTreeMap<String, String>) -> Self {
        let fields = stored
            .iter()
            .filter_map(|(p, t)| {
                let (name, keyword) = match t.strip_suffix("+keyword") {
                    Some(n) => (n, true),
                    None => (t.as_str(), false),
                };
                let ty = [
                    EsType::Text,
                    EsType::Keyword,
                    EsType::Long,
                    EsType::Integer,
                    EsType::Double,
                    EsType::Date,
                    EsType::Boolean,
                ]
                .into_iter()
                .find(|ty| ty.name() == name)?;
                Some((p.clone(), FieldMapping { ty, keyword }))
            })
            .collect();
        Self { fields }
    }

    /// The fields every searchable topic has (the record's own), and those its settings
    /// declare (`search.fields`), which win over anything else of the same path.
    pub fn declared(settings: &SearchSettings) -> Self {
        let mut fields = BTreeMap::new();
        let plain = |ty| FieldMapping { ty, keyword: false };
        fields.insert("@timestamp".to_string(), plain(EsType::Date));
        fields.insert("key".to_string(), plain(EsType::Keyword));
        fields.insert("value".to_string(), plain(EsType::Text));
        fields.insert("offset".to_string(), plain(EsType::Long));
        fields.insert("partition".to_string(), plain(EsType::Integer));
        for f in &settings.fields {
            let ty = match f.kind {
                FieldKind::Text => EsType::Text,
                FieldKind::Keyword => EsType::Keyword,
                FieldKind::Number => EsType::Double,
                FieldKind::Date => EsType::Date,
            };
            fields.insert(f.path.clone(), plain(ty));
        }
        Self { fields }
    }

    /// Adds `other`'s fields that this mapping does not have (a field keeps the type it was
    /// first given, as Elasticsearch's dynamic mapping does).
    pub fn merge(&mut self, other: &TopicMapping) {
        for (path, f) in &other.fields {
            self.fields.entry(path.clone()).or_insert(*f);
        }
    }

    /// `{"properties": ...}` as `_mapping` answers it: dotted paths become nested objects.
    pub fn to_es(&self) -> Value {
        let mut root = Map::new();
        for (path, f) in &self.fields {
            let mut leaf = json!({"type": f.ty.name()});
            if f.keyword {
                leaf["fields"] = json!({"keyword": {"type": "keyword", "ignore_above": 256}});
            }
            insert_nested(&mut root, path, leaf);
        }
        json!({ "properties": Value::Object(root) })
    }

    /// Every searchable name with its type, keyword sub-fields included (`_field_caps`).
    pub fn flat(&self) -> Vec<(String, EsType)> {
        let mut v = Vec::new();
        for (path, f) in &self.fields {
            v.push((path.clone(), f.ty));
            if f.keyword {
                v.push((format!("{path}.keyword"), EsType::Keyword));
            }
        }
        v
    }
}

/// Puts `leaf` at a dotted `path` of nested `properties` objects.
fn insert_nested(root: &mut Map<String, Value>, path: &str, leaf: Value) {
    match path.split_once('.') {
        None => {
            // A path that is also an object's prefix keeps both (the object wins the name).
            root.entry(path.to_string()).or_insert(leaf);
        }
        Some((head, rest)) => {
            let node = root
                .entry(head.to_string())
                .or_insert_with(|| json!({"properties": {}}));
            if node.get("properties").is_none() {
                // A leaf already holds this name: nest the object's fields beside its type.
                node["properties"] = json!({});
            }
            if let Some(Value::Object(props)) = node.get_mut("properties") {
                insert_nested(props, rest, leaf);
            }
        }
    }
}

/// `_field_caps`' `fields` object for topics' mappings: each name with every type it has
/// across the topics, and which topics give it which type when they differ.
pub fn field_caps(mappings: &[(String, TopicMapping)], wanted: &[String]) -> Value {
    let mut by_name: BTreeMap<String, BTreeMap<EsType, Vec<String>>> = BTreeMap::new();
    for (topic, m) in mappings {
        for (name, ty) in m.flat() {
            by_name
                .entry(name)
                .or_default()
                .entry(ty)
                .or_default()
                .push(topic.clone());
        }
    }
    let keep = |name: &str| {
        wanted.is_empty()
            || wanted
                .iter()
                .any(|w| w == "*" || w == name || glob_prefix(w, name))
    };
    let mut fields = Map::new();
    for (name, types) in by_name.into_iter().filter(|(n, _)| keep(n)) {
        let several = types.len() > 1;
        let mut caps = Map::new();
        for (ty, topics) in types {
            let mut c = json!({
                "type": ty.name(),
                "metadata_field": false,
                "searchable": true,
                "aggregatable": ty.aggregatable(),
            });
            if several {
                c["indices"] = json!(topics);
            }
            caps.insert(ty.name().to_string(), c);
        }
        fields.insert(name, Value::Object(caps));
    }
    Value::Object(fields)
}

/// `logs.*`-style patterns: a trailing `*` matches any rest.
fn glob_prefix(pattern: &str, name: &str) -> bool {
    pattern
        .strip_suffix('*')
        .is_some_and(|prefix| name.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_broker::search_config::SearchField;

    fn settings(fields: &[(&str, FieldKind)]) -> SearchSettings {
        SearchSettings {
            enabled: true,
            format: spate_broker::search_config::ValueFormat::Json,
            fields: fields
                .iter()
                .map(|(p, k)| SearchField {
                    path: p.to_string(),
                    kind: *k,
                })
                .collect(),
            store_value: false,
            max_fields: 1000,
            time_field: "@timestamp".into(),
        }
    }

    #[test]
    fn dynamic_mapping_types_fields_from_their_first_values() {
        let mut m = TopicMapping::default();
        let doc = json!({
            "@timestamp": "2024-05-01T10:00:00.123Z",
            "message": "GET /x",
            "status": 200,
            "took": 1.5,
            "ok": true,
            "created_at": 1_700_000_000_000i64,
            "count_at_start": 12,
            "http": {"method": "GET", "tags": ["a", "b"]},
            "nothing": null,
            "day": "2024-05-01",
            "version": "2024",
        });
        let out = m.index_document(doc, 1000, 0);
        let ty = |p: &str| m.fields.get(p).map(|f| (f.ty, f.keyword));
        assert_eq!(ty("@timestamp"), Some((EsType::Date, false)));
        assert_eq!(ty("message"), Some((EsType::Text, true)));
        assert_eq!(ty("status"), Some((EsType::Long, false)));
        assert_eq!(ty("took"), Some((EsType::Double, false)));
        assert_eq!(ty("ok"), Some((EsType::Boolean, false)));
        assert_eq!(
            ty("created_at"),
            Some((EsType::Date, false)),
            "epoch ms at a time-like name"
        );
        assert_eq!(
            ty("count_at_start"),
            Some((EsType::Long, false)),
            "a small number stays one"
        );
        assert_eq!(ty("http.method"), Some((EsType::Text, true)));
        assert_eq!(ty("http.tags"), Some((EsType::Text, true)));
        assert_eq!(ty("day"), Some((EsType::Date, false)));
        assert_eq!(
            ty("version"),
            Some((EsType::Text, true)),
            "digits are not a date"
        );
        assert_eq!(ty("nothing"), None);
        assert_eq!(out.conflicts, 0);
        // Every value here has an exact form (a column `exists` reads): none is named.
        assert!(out.paths.is_empty(), "{:?}", out.paths);
        let long = "word ".repeat(60);
        let out = m.index_document(json!({"message": long}), 1000, 0);
        assert_eq!(
            out.paths,
            vec!["message".to_string()],
            "text over the keyword limit"
        );
        // A later value of another type is left out of that document, counted; the type stays.
        let out = m.index_document(json!({"status": "not a number", "ok": "yes"}), 1000, 0);
        assert_eq!(out.conflicts, 2);
        assert_eq!(m.fields.get("status").map(|f| f.ty), Some(EsType::Long));
        let stored = m.to_stored();
        assert_eq!(TopicMapping::from_stored(&stored), m);
    }

    #[test]
    fn fields_past_the_limit_are_not_mapped_and_are_counted() {
        let mut m = TopicMapping::default();
        let out = m.index_document(json!({"a": 1, "b": 2, "c": 3}), 2, 0);
        assert_eq!(m.fields.len(), 2);
        assert_eq!(out.unmapped, 1);
        // Known fields keep being indexed at the limit.
        let out = m.index_document(json!({"a": 4, "z": 5}), 2, 0);
        assert_eq!(out.unmapped, 1);
        assert!(out.exact.is_some(), "a is indexed");
    }

    #[test]
    fn dotted_paths_nest_as_elasticsearch_properties() {
        let m = TopicMapping::declared(&settings(&[
            ("http.status", FieldKind::Number),
            ("http.method", FieldKind::Keyword),
            ("message", FieldKind::Text),
        ]));
        let es = m.to_es();
        assert_eq!(es["properties"]["@timestamp"]["type"], "date");
        assert_eq!(
            es["properties"]["http"]["properties"]["status"]["type"],
            "double"
        );
        assert_eq!(
            es["properties"]["http"]["properties"]["method"]["type"],
            "keyword"
        );
        assert_eq!(es["properties"]["message"]["type"], "text");
    }

    #[test]
    fn field_caps_lists_types_per_name_and_the_topics_where_they_differ() {
        let a = TopicMapping::declared(&settings(&[("level", FieldKind::Keyword)]));
        let b = TopicMapping::declared(&settings(&[("level", FieldKind::Text)]));
        let caps = field_caps(&[("a".into(), a), ("b".into(), b)], &[]);
        assert_eq!(caps["level"]["keyword"]["indices"], json!(["a"]));
        assert_eq!(caps["level"]["text"]["aggregatable"], false);
        assert_eq!(caps["@timestamp"]["date"]["aggregatable"], true);
        assert!(caps["@timestamp"]["date"].get("indices").is_none());
        let only = field_caps(
            &[(
                "a".into(),
                TopicMapping::declared(&settings(&[("level", FieldKind::Keyword)])),
            )],
            &["@timestamp".to_string()],
        );
        assert_eq!(only.as_object().map(|o| o.len()), Some(1));
    }
}
