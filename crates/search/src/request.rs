//! A search request body (and the `?q=` / `from` / `size` / `sort` URL parameters): everything
//! around the query.

use serde_json::{Map, Value};

use crate::dsl::{parse_query, Query};
use crate::error::SearchError;

/// Elasticsearch's `index.max_result_window`: from + size may not exceed it.
pub const MAX_RESULT_WINDOW: usize = 10_000;

/// Sort direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Smallest first.
    Asc,
    /// Largest first.
    Desc,
}

/// What hits are ordered by; ties break by partition, then offset, in the same direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SortKey {
    /// Relevance.
    Score,
    /// A field (`timestamp`, `offset`, `key`, or a keyword, number or date JSON field).
    Field(String),
}

/// The sort of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sort {
    /// Primary key.
    pub key: SortKey,
    /// Direction.
    pub direction: Direction,
    /// The keys after the primary one, each with its direction, in turn; hits equal on all
    /// of them are ordered by partition and offset.
    pub then: Vec<(SortKey, Direction)>,
}

/// `_source` filtering.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SourceFilter {
    /// No `_source` at all.
    pub disabled: bool,
    /// Paths (with `*` wildcards) to keep; empty keeps everything.
    pub includes: Vec<String>,
    /// Paths to drop.
    pub excludes: Vec<String>,
}

/// `highlight`.
#[derive(Debug, Clone, PartialEq)]
pub struct Highlight {
    /// Fields to highlight.
    pub fields: Vec<String>,
    /// Tag before a highlighted term.
    pub pre_tag: String,
    /// Tag after it.
    pub post_tag: String,
    /// Longest fragment in characters.
    pub fragment_size: usize,
}

/// A whole search request.
#[derive(Debug, Clone)]
pub struct SearchRequest {
    /// The query.
    pub query: Query,
    /// Hits skipped.
    pub from: usize,
    /// Hits returned.
    pub size: usize,
    /// Order; `None` means by score.
    pub sort: Sort,
    /// Sort values of the last hit of the previous page.
    pub search_after: Option<Vec<Value>>,
    /// `_source` filtering.
    pub source: SourceFilter,
    /// Highlighting.
    pub highlight: Option<Highlight>,
    /// Aggregations (Elasticsearch syntax; field names not yet mapped).
    pub aggs: Option<Map<String, Value>>,
    /// Fields whose values each hit lists under `fields` (`fields` and `docvalue_fields`).
    pub fields: Vec<String>,
}

impl Default for SearchRequest {
    fn default() -> Self {
        Self {
            query: Query::MatchAll,
            from: 0,
            size: 10,
            sort: Sort {
                key: SortKey::Score,
                direction: Direction::Desc,
                then: Vec::new(),
            },
            search_after: None,
            fields: Vec::new(),
            source: SourceFilter::default(),
            highlight: None,
            aggs: None,
        }
    }
}

fn usize_of(key: &str, v: &Value) -> Result<usize, SearchError> {
    match v {
        Value::Number(n) => n.as_u64().map(|n| n as usize),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .ok_or_else(|| SearchError::parsing(format!("[{key}] must be a non-negative integer, got {v}")))
}

/// Parses a request body (`None`: match everything).
pub fn parse_request(body: Option<&Value>) -> Result<SearchRequest, SearchError> {
    let mut req = SearchRequest::default();
    let Some(body) = body else {
        return Ok(req);
    };
    let m = body
        .as_object()
        .ok_or_else(|| SearchError::parsing("the request body must be a JSON object"))?;
    for (k, v) in m {
        match k.as_str() {
            "query" => req.query = parse_query(v)?,
            "from" => req.from = usize_of("from", v)?,
            "size" => req.size = usize_of("size", v)?,
            "sort" => req.sort = parse_sort(v)?,
            "search_after" => {
                req.search_after = Some(
                    v.as_array()
                        .cloned()
                        .ok_or_else(|| SearchError::parsing("[search_after] must be an array"))?,
                )
            }
            "_source" => req.source = parse_source(v)?,
            "highlight" => req.highlight = Some(parse_highlight(v)?),
            "aggs" | "aggregations" => {
                req.aggs = Some(
                    v.as_object()
                        .cloned()
                        .ok_or_else(|| SearchError::parsing("[aggs] must be an object"))?,
                )
            }
            "fields" | "docvalue_fields" => {
                for f in v.as_array().ok_or_else(|| {
                    SearchError::parsing(format!("[{k}] must be a list of fields"))
                })? {
                    let name = match f {
                        Value::String(s) => s.clone(),
                        Value::Object(o) => o
                            .get("field")
                            .and_then(Value::as_str)
                            .map(str::to_string)
                            .ok_or_else(|| {
                                SearchError::parsing(format!("[{k}] entry {f} has no [field]"))
                            })?,
                        other => {
                            return Err(SearchError::parsing(format!(
                                "[{k}] entry {other} is not a field name"
                            )))
                        }
                    };
                    if !req.fields.contains(&name) {
                        req.fields.push(name);
                    }
                }
            }
            // Scripts do not run here; an empty list (what Grafana sends) asks for nothing.
            "script_fields" => {
                if v.as_object().is_none_or(|o| !o.is_empty()) {
                    return Err(SearchError::illegal(
                        "[script_fields] are not supported: spate runs no scripts",
                    ));
                }
            }
            // Accepted and ignored: spate always counts hits exactly and never times out early.
            "track_total_hits"
            | "timeout"
            | "track_scores"
            | "version"
            | "seq_no_primary_term"
            | "stored_fields"
            | "explain"
            | "min_score"
            | "profile" => {}
            other => {
                return Err(SearchError::parsing(format!(
                    "unknown key [{other}] in the search request"
                )))
            }
        }
    }
    check_window(&req)?;
    Ok(req)
}

/// Refuses result windows past [`MAX_RESULT_WINDOW`], as Elasticsearch does.
pub fn check_window(req: &SearchRequest) -> Result<(), SearchError> {
    let window = req.from.saturating_add(req.size);
    if window > MAX_RESULT_WINDOW {
        return Err(SearchError::illegal(format!(
            "Result window is too large, from + size must be less than or equal to: [{MAX_RESULT_WINDOW}] but was [{window}]. Use search_after to page through more hits."
        )));
    }
    let by_score =
        req.sort.key == SortKey::Score || req.sort.then.iter().any(|(k, _)| *k == SortKey::Score);
    if req.search_after.is_some() && by_score {
        return Err(SearchError::illegal(
            "[search_after] needs a sort on a field (e.g. timestamp or offset), not _score",
        ));
    }
    if req.search_after.is_some() && req.from > 0 {
        return Err(SearchError::illegal(
            "[from] parameter must be set to 0 when [search_after] is used",
        ));
    }
    Ok(())
}

/// Parses `sort`: `"field"`, `{"field": "desc"}`, `{"field": {"order": "desc"}}` or a list
/// whose first entry is the key (a trailing `offset` / `_id` / `_doc` tiebreaker is implied).
pub fn parse_sort(v: &Value) -> Result<Sort, SearchError> {
    // An object of several keys (Grafana's `{"@timestamp": ..., "_doc": ...}`) is a list of
    // one-key objects; tiebreakers go last (the JSON map does not keep the keys' order).
    let split: Vec<Value>;
    let entries: Vec<&Value> = match v {
        Value::Array(a) => a.iter().collect(),
        Value::Object(m) if m.len() > 1 => {
            let tiebreak = |k: &str| matches!(k, "_doc" | "_id" | "offset");
            let mut keys: Vec<(&String, &Value)> = m.iter().collect();
            keys.sort_by_key(|(k, _)| tiebreak(k));
            split = keys
                .into_iter()
                .map(|(k, v)| {
                    let mut one = Map::new();
                    one.insert(k.clone(), v.clone());
                    Value::Object(one)
                })
                .collect();
            split.iter().collect()
        }
        one => vec![one],
    };
    let parsed = entries
        .iter()
        .map(|e| parse_sort_entry(e))
        .collect::<Result<Vec<_>, _>>()?;
    let mut it = parsed.into_iter();
    let mut first = it.next().unwrap_or(Sort {
        key: SortKey::Score,
        direction: Direction::Desc,
        then: Vec::new(),
    });
    for extra in it {
        let tiebreak =
            matches!(&extra.key, SortKey::Field(f) if f == "offset" || f == "_id" || f == "_doc");
        if tiebreak {
            // Partition and offset break the remaining ties; a key after them never decides.
            break;
        }
        first.then.push((extra.key, extra.direction));
    }
    if first.then.len() + 1 > MAX_SORT_KEYS {
        return Err(SearchError::illegal(format!(
            "[sort] at most {MAX_SORT_KEYS} keys are supported before the implied tie-breakers (partition, offset)"
        )));
    }
    Ok(first)
}

/// Most sort keys in one request (tantivy's sort keys are tuples of a fixed arity).
pub const MAX_SORT_KEYS: usize = 4;

/// One entry of a `sort`: a field name (`"f"`, `"f:desc"`) or `{"f": "desc"}` / `{"f": {"order": ..}}`.
pub(crate) fn parse_sort_entry(v: &Value) -> Result<Sort, SearchError> {
    let direction = |d: &str| match d.to_ascii_lowercase().as_str() {
        "asc" => Ok(Direction::Asc),
        "desc" => Ok(Direction::Desc),
        other => Err(SearchError::parsing(format!(
            "[sort] order [{other}] is not asc or desc"
        ))),
    };
    let key = |name: &str| match name {
        "_score" => SortKey::Score,
        "_doc" | "_id" => SortKey::Field("offset".into()),
        other => SortKey::Field(other.to_string()),
    };
    let default_dir = |k: &SortKey| match k {
        SortKey::Score => Direction::Desc,
        SortKey::Field(_) => Direction::Asc,
    };
    match v {
        Value::String(s) => {
            let (name, dir) = match s.split_once(':') {
                Some((n, d)) => (n, Some(direction(d)?)),
                None => (s.as_str(), None),
            };
            let k = key(name);
            let d = dir.unwrap_or_else(|| default_dir(&k));
            Ok(Sort {
                key: k,
                direction: d,
                then: Vec::new(),
            })
        }
        Value::Object(m) if m.len() == 1 => {
            let (name, spec) = m
                .iter()
                .next()
                .ok_or_else(|| SearchError::parsing("[sort] entry is empty"))?;
            let k = key(name);
            let d = match spec {
                Value::String(d) => direction(d)?,
                Value::Object(o) => match o.get("order").and_then(Value::as_str) {
                    Some(d) => direction(d)?,
                    None => default_dir(&k),
                },
                _ => {
                    return Err(SearchError::parsing(format!(
                        "[sort] [{name}] has a bad order"
                    )))
                }
            };
            Ok(Sort {
                key: k,
                direction: d,
                then: Vec::new(),
            })
        }
        other => Err(SearchError::parsing(format!(
            "[sort] entry {other} is not understood"
        ))),
    }
}

fn parse_source(v: &Value) -> Result<SourceFilter, SearchError> {
    let list = |v: &Value| -> Result<Vec<String>, SearchError> {
        match v {
            Value::String(s) => Ok(s.split(',').map(|s| s.trim().to_string()).collect()),
            Value::Array(a) => a
                .iter()
                .map(|i| {
                    i.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| SearchError::parsing("[_source] patterns must be strings"))
                })
                .collect(),
            _ => Err(SearchError::parsing("[_source] patterns must be strings")),
        }
    };
    match v {
        Value::Bool(b) => Ok(SourceFilter {
            disabled: !b,
            ..SourceFilter::default()
        }),
        Value::String(_) | Value::Array(_) => Ok(SourceFilter {
            includes: list(v)?,
            ..SourceFilter::default()
        }),
        Value::Object(m) => Ok(SourceFilter {
            disabled: false,
            includes: m
                .get("includes")
                .or(m.get("include"))
                .map(list)
                .transpose()?
                .unwrap_or_default(),
            excludes: m
                .get("excludes")
                .or(m.get("exclude"))
                .map(list)
                .transpose()?
                .unwrap_or_default(),
        }),
        _ => Err(SearchError::parsing(
            "[_source] must be a boolean, a pattern list or an object",
        )),
    }
}

fn parse_highlight(v: &Value) -> Result<Highlight, SearchError> {
    let m = v
        .as_object()
        .ok_or_else(|| SearchError::parsing("[highlight] must be an object"))?;
    let fields = match m.get("fields") {
        Some(Value::Object(f)) => f.keys().cloned().collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|i| i.as_object().and_then(|o| o.keys().next().cloned()))
            .collect(),
        _ => return Err(SearchError::parsing("[highlight] needs [fields]")),
    };
    let tag = |k: &str, d: &str| {
        m.get(k)
            .and_then(|v| v.as_array().and_then(|a| a.first()).or(Some(v)))
            .and_then(Value::as_str)
            .unwrap_or(d)
            .to_string()
    };
    Ok(Highlight {
        fields,
        pre_tag: tag("pre_tags", "<em>"),
        post_tag: tag("post_tags", "</em>"),
        fragment_size: m
            .get("fragment_size")
            .and_then(Value::as_u64)
            .unwrap_or(150)
            .clamp(10, 10_000) as usize,
    })
}

/// True when `path` (dotted) is selected by `pattern` (dotted, `*` matches any run).
pub(crate) fn path_matches(pattern: &str, path: &str) -> bool {
    fn glob(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => glob(&p[1..], s) || (!s.is_empty() && glob(p, &s[1..])),
            (Some(a), Some(b)) if a == b => glob(&p[1..], &s[1..]),
            _ => false,
        }
    }
    glob(pattern.as_bytes(), path.as_bytes())
}

/// Applies `_source` filtering to a hit's source.
pub fn filter_source(src: Value, f: &SourceFilter) -> Option<Value> {
    if f.disabled {
        return None;
    }
    fn walk(v: Value, prefix: &str, f: &SourceFilter) -> Option<Value> {
        match v {
            Value::Object(m) => {
                let mut out = Map::new();
                for (k, child) in m {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    if f.excludes.iter().any(|p| path_matches(p, &path)) {
                        continue;
                    }
                    let included = f.includes.is_empty()
                        || f.includes.iter().any(|p| {
                            path_matches(p, &path) || path_matches(&format!("{p}.*"), &path)
                        });
                    if included {
                        // Excludes may still reach inside.
                        if let Some(c) = walk(child, &path, f) {
                            out.insert(k, c);
                        }
                    } else if f
                        .includes
                        .iter()
                        .any(|p| p.starts_with(&format!("{path}.")))
                    {
                        // An include reaches deeper: keep the parts it names.
                        if let Some(c) = walk(child, &path, f) {
                            out.insert(k, c);
                        }
                    }
                }
                Some(Value::Object(out))
            }
            other => Some(other),
        }
    }
    walk(src, "", f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_result_window_of_ten_million_is_refused_with_elasticsearchs_message() {
        let e = parse_request(Some(&json!({"size": 10_000_000}))).unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(e.to_string().contains("Result window is too large"), "{e}");
        assert!(parse_request(Some(&json!({"from": 9990, "size": 10}))).is_ok());
    }

    #[test]
    fn sort_accepts_every_elasticsearch_spelling() {
        let s = parse_sort(&json!([{"timestamp": {"order": "desc"}}, "_id"])).unwrap();
        assert_eq!(
            s,
            Sort {
                key: SortKey::Field("timestamp".into()),
                direction: Direction::Desc,
                then: Vec::new(),
            }
        );
        assert_eq!(
            parse_sort(&json!("offset")).unwrap().direction,
            Direction::Asc
        );
        assert_eq!(parse_sort(&json!("_score")).unwrap().key, SortKey::Score);
        let two = parse_sort(&json!([{"a": "asc"}, {"b": "desc"}, "_doc", "c"])).unwrap();
        assert_eq!(
            two.then,
            vec![(SortKey::Field("b".into()), Direction::Desc)],
            "keys after _doc never decide"
        );
        assert!(parse_sort(&json!(["a", "b", "c", "d", "e"])).is_err());
    }

    #[test]
    fn search_after_needs_a_field_sort() {
        assert!(parse_request(Some(&json!({"search_after": [1]}))).is_err());
        assert!(parse_request(Some(&json!({"search_after": [1], "sort": ["offset"]}))).is_ok());
    }

    #[test]
    fn source_filtering_keeps_includes_and_drops_excludes() {
        let src = json!({"key": "k", "value": {"user": {"name": "ann", "age": 3}, "msg": "hi"}, "offset": 1});
        let f = parse_source(&json!(["value.user.name", "offset"])).unwrap();
        assert_eq!(
            filter_source(src.clone(), &f).unwrap(),
            json!({"value": {"user": {"name": "ann"}}, "offset": 1})
        );
        let f = parse_source(&json!({"excludes": ["value.*"]})).unwrap();
        assert_eq!(
            filter_source(src.clone(), &f).unwrap(),
            json!({"key": "k", "value": {}, "offset": 1})
        );
        assert!(filter_source(src, &parse_source(&json!(false)).unwrap()).is_none());
    }

    #[test]
    fn unknown_request_keys_are_named() {
        let e = parse_request(Some(&json!({"qurey": {}}))).unwrap_err();
        assert!(e.to_string().contains("[qurey]"));
    }
}
