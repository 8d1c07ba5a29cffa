//! What a searchable topic's fields are, in Elasticsearch's terms: the answer to `_mapping`
//! and `_field_caps`, which query editors (Grafana's, Kibana's, OpenSearch Dashboards')
//! read to offer fields and to find the time field.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};
use spate_broker::search_config::{FieldKind, SearchSettings};

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

impl TopicMapping {
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
        }
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
