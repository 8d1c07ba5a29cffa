//! The `search.*` topic configs parsed into what an indexer needs. Parsing lives here, beside
//! the other topic configs, so that validation at CreateTopics / AlterConfigs time and the
//! indexer read one definition.

/// How record values are read for indexing (`search.value.format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueFormat {
    /// The value is text (lossily decoded when not UTF-8).
    Text,
    /// The value is a JSON document; one that does not parse is indexed as text.
    Json,
    /// JSON when it parses as an object or array; a value in the schema registry's wire
    /// format (magic byte 0, a known schema id) decoded with its schema; text otherwise.
    Auto,
    /// The schema registry's wire format (magic byte 0, schema id, payload), decoded with the
    /// registered schema; a value that cannot be is indexed as text.
    Schema,
}

impl ValueFormat {
    /// Parses `text`, `json`, `auto` or `schema`.
    pub fn parse(v: &str) -> Result<Self, String> {
        match v.trim() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            "auto" => Ok(Self::Auto),
            "schema" => Ok(Self::Schema),
            other => Err(format!(
                "'{other}' is not a value format (text, json, auto, schema)"
            )),
        }
    }

    /// The config spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Json => "json",
            Self::Auto => "auto",
            Self::Schema => "schema",
        }
    }
}

/// How one JSON field is indexed (`search.fields`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldKind {
    /// Analysed full text (match, match_phrase).
    Text,
    /// One exact term (term, terms, prefix, wildcard, terms aggregation).
    Keyword,
    /// A number (range, sort, histograms).
    Number,
    /// A date: RFC 3339 text or epoch milliseconds (range, sort, date_histogram).
    Date,
}

impl FieldKind {
    /// Parses `text`, `keyword`, `number` or `date`.
    pub fn parse(v: &str) -> Result<Self, String> {
        match v.trim() {
            "text" => Ok(Self::Text),
            "keyword" => Ok(Self::Keyword),
            "number" => Ok(Self::Number),
            "date" => Ok(Self::Date),
            other => Err(format!(
                "'{other}' is not a field type (text, keyword, number, date)"
            )),
        }
    }

    /// The config spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Keyword => "keyword",
            Self::Number => "number",
            Self::Date => "date",
        }
    }
}

/// One configured JSON field: a dotted path into the value and its type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SearchField {
    /// Dotted path, e.g. `user.name`.
    pub path: String,
    /// How it is indexed.
    pub kind: FieldKind,
}

/// Names the search DSL keeps for the record itself; a JSON field may not take them.
pub const RESERVED_FIELDS: &[&str] = &[
    "offset",
    "partition",
    "timestamp",
    "key",
    "value",
    "headers",
    "_id",
    "_score",
];

/// Parses `search.fields`: comma-separated `path:type` entries, e.g.
/// `user.name:keyword,msg:text,amount:number,at:date`. Empty means none.
pub fn parse_fields(v: &str) -> Result<Vec<SearchField>, String> {
    let mut fields: Vec<SearchField> = Vec::new();
    for entry in v.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (path, kind) = entry
            .rsplit_once(':')
            .ok_or_else(|| format!("'{entry}' is not path:type"))?;
        let path = path.trim();
        let valid_segment = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '@')
        };
        if !path.split('.').all(valid_segment) {
            return Err(format!(
                "'{path}' is not a dotted path of letters, digits, '_', '-' and '@'"
            ));
        }
        if RESERVED_FIELDS.contains(&path) || path.starts_with("headers.") {
            return Err(format!("'{path}' is a built-in search field"));
        }
        if fields.iter().any(|f| f.path == path) {
            return Err(format!("'{path}' is listed twice"));
        }
        fields.push(SearchField {
            path: path.to_string(),
            kind: FieldKind::parse(kind)?,
        });
    }
    if fields.len() > 64 {
        return Err(format!(
            "{} fields; at most 64 can be indexed",
            fields.len()
        ));
    }
    Ok(fields)
}

/// Parses a boolean config value.
pub fn parse_bool(v: &str) -> Result<bool, String> {
    match v.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(format!("'{other}' is not true or false")),
    }
}

/// A topic's search settings.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SearchSettings {
    /// `search.enabled`.
    pub enabled: bool,
    /// `search.value.format`.
    pub format: ValueFormat,
    /// `search.fields`.
    pub fields: Vec<SearchField>,
    /// `search.store.value`: keep key, value and headers in the index instead of reading them
    /// back from the log for `_source`.
    pub store_value: bool,
    /// `search.max.fields`: most JSON fields one partition maps dynamically.
    pub max_fields: usize,
    /// `search.time.field`: the document field (dotted path) that is its time.
    pub time_field: String,
}

/// `search.max.fields` when unset (Elasticsearch's default total fields limit).
pub const DEFAULT_MAX_FIELDS: usize = 1000;

/// `search.time.field` when unset: what Elasticsearch tools (Grafana, Kibana) expect.
pub const DEFAULT_TIME_FIELD: &str = "@timestamp";

impl SearchSettings {
    /// Everything that shapes the index's contents, as one line: an index built under another
    /// fingerprint is rebuilt.
    pub fn fingerprint(&self) -> String {
        let fields: Vec<String> = self
            .fields
            .iter()
            .map(|f| format!("{}:{}", f.path, f.kind.as_str()))
            .collect();
        // v2: every JSON field is indexed by its path (dynamic mapping). v3: a JSON object's
        // raw text is no longer indexed and exact values are columns only.
        let mut f = format!(
            "v3 format={} store={} fields={} max_fields={}",
            self.format.as_str(),
            self.store_value,
            fields.join(","),
            self.max_fields
        );
        // Only when set: indexes built before the setting existed keep their fingerprint.
        if self.time_field != DEFAULT_TIME_FIELD {
            f.push_str(&format!(" time_field={}", self.time_field));
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_parse_paths_and_types() {
        let f = parse_fields(" user.name:keyword, msg:text,amount:number,at:date ").unwrap();
        assert_eq!(f.len(), 4);
        assert_eq!(f[0].path, "user.name");
        assert_eq!(f[0].kind, FieldKind::Keyword);
        assert_eq!(f[3].kind, FieldKind::Date);
        assert!(parse_fields("").unwrap().is_empty());
    }

    #[test]
    fn fields_refuse_bad_types_paths_and_built_in_names() {
        assert!(parse_fields("a:blob").is_err());
        assert!(parse_fields("a").is_err());
        assert!(parse_fields("a..b:text").is_err());
        assert!(parse_fields("offset:number").is_err());
        assert!(parse_fields("a:text,a:keyword").is_err());
    }
}
