//! Running a [`SearchRequest`] over partitions: the partitions of one topic index are
//! searched in one pass (each is like an Elasticsearch shard), then hits are merged by their sort values with partition and
//! offset breaking ties, aggregations merged from their intermediate results, and `_source`
//! read back from the log (or the index, under `search.store.value`).

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use spate_broker::Partition;
use tantivy::aggregation::agg_req::Aggregations;
use tantivy::aggregation::intermediate_agg_result::{IntermediateAggregationResults, PruneMode};
use tantivy::aggregation::{
    AggContextParams, AggregationLimitsGuard, DistributedAggregationCollector,
};
use tantivy::collector::sort_key::{SortByErasedType, SortByStaticFastValue, SortKeyComputer};
use tantivy::collector::{Count, MultiCollector, TopDocs};
use tantivy::query::{Query as TQuery, TermQuery};
use tantivy::schema::{IndexRecordOption, OwnedValue, Value as _};
use tantivy::snippet::SnippetGenerator;
use tantivy::{DocAddress, Order, Searcher, TantivyDocument, Term};

use crate::dsl::{compile, Bound, Limits, Query};
use crate::error::SearchError;
use crate::index::{PartitionIndex, TopicIndex};
use crate::record::{decode_batches, decode_stored, kafka_meta, lossy, values_at, LogRecord};
use crate::request::{filter_source, Direction, SearchRequest, SortKey, MAX_SORT_KEYS};
use crate::schema::{FieldRole, IndexSchema};

/// One partition to search: its index, and its log for `_source`.
#[derive(Clone)]
pub struct Target {
    /// The index.
    pub index: Arc<PartitionIndex>,
    /// The partition.
    pub partition: Arc<Partition>,
}

/// Merged results before they become JSON.
struct Candidate {
    key: OwnedValue,
    /// The values of the sort's keys after the primary one.
    then: Vec<OwnedValue>,
    partition: i32,
    offset: i64,
    score: Option<f32>,
    target: usize,
}

fn owned_to_json(v: &OwnedValue) -> Value {
    match v {
        OwnedValue::Null => Value::Null,
        OwnedValue::Str(s) => Value::from(s.as_str()),
        OwnedValue::I64(i) => Value::from(*i),
        OwnedValue::U64(u) => Value::from(*u),
        OwnedValue::F64(f) => Value::from(*f),
        OwnedValue::Bool(b) => Value::from(*b),
        OwnedValue::Date(d) => Value::from(d.into_timestamp_millis()),
        _ => Value::Null,
    }
}

/// The sort field's index name in `schema`, checked to be sortable.
fn sort_field(schema: &IndexSchema, name: &str) -> Result<Option<String>, SearchError> {
    let Some(r) = schema.resolve(name) else {
        return Ok(None);
    };
    match r.role {
        FieldRole::Offset | FieldRole::Partition | FieldRole::Timestamp | FieldRole::Key => Ok(Some(r.name)),
        FieldRole::Json(k) if k != spate_broker::search_config::FieldKind::Text => Ok(Some(r.name)),
        // A mapped field sorts on its exact column (text fields by their keyword form).
        FieldRole::Dynamic(_) => Ok(Some(r.name)),
        _ => Err(SearchError::illegal(format!(
            "[sort] cannot sort on [{name}]: text fields are not sortable; use a keyword, number or date field"
        ))),
    }
}

/// The query narrowed to hits after `search_after` in this partition of `topic`: after on
/// the first sort key, or equal on it and after on the next, and so on; hits equal on every
/// key are ordered by partition, offset, then topic (the hit's `sort` array carries them after
/// the keys' values), so paging over several topics skips nothing. A missing value sorts
/// after every value, in either direction, as Elasticsearch's default `missing: _last`.
fn after_query(req: &SearchRequest, topic: &str) -> Result<Option<Query>, SearchError> {
    let Some(after) = &req.search_after else {
        return Ok(None);
    };
    if after.is_empty() {
        return Err(SearchError::parsing("[search_after] is empty"));
    }
    let mut keys: Vec<(&str, bool)> = Vec::new();
    for (k, d) in std::iter::once((&req.sort.key, req.sort.direction))
        .chain(req.sort.then.iter().map(|(k, d)| (k, *d)))
    {
        match k {
            SortKey::Field(f) => keys.push((f, d == Direction::Asc)),
            // Refused before (check_window): scores cannot be ranged over.
            SortKey::Score => return Ok(None),
        }
    }
    if after.len() < keys.len() {
        return Err(SearchError::parsing(format!(
            "[search_after] has {} values; the sort has {} keys",
            after.len(),
            keys.len()
        )));
    }
    let all = |must: Vec<Query>| Query::Bool {
        must,
        should: vec![],
        must_not: vec![],
        filter: vec![],
        minimum_should_match: None,
    };
    let any = |should: Vec<Query>| Query::Bool {
        must: vec![],
        should,
        must_not: vec![],
        filter: vec![],
        minimum_should_match: None,
    };
    let missing = |field: &str| Query::Bool {
        must: vec![Query::MatchAll],
        should: vec![],
        must_not: vec![Query::Exists {
            field: field.into(),
        }],
        filter: vec![],
        minimum_should_match: None,
    };
    let range = |field: &str, v: Value, asc: bool, inclusive: bool| {
        let b = Some(Bound {
            value: v,
            inclusive,
        });
        if asc {
            Query::Range {
                field: field.into(),
                lower: b,
                upper: None,
            }
        } else {
            Query::Range {
                field: field.into(),
                lower: None,
                upper: b,
            }
        }
    };
    // Strictly after `v` on one key: a later value, or none (missing sorts last).
    let strictly = |field: &str, v: &Value, asc: bool| match v {
        Value::Null => Query::MatchNone,
        v => any(vec![range(field, v.clone(), asc, false), missing(field)]),
    };
    let equal = |field: &str, v: &Value| match v {
        Value::Null => missing(field),
        v => Query::Term {
            field: field.into(),
            value: v.clone(),
        },
    };
    let mut should = Vec::new();
    for (i, (field, asc)) in keys.iter().enumerate() {
        let mut must: Vec<Query> = keys[..i]
            .iter()
            .zip(after)
            .map(|((f, _), v)| equal(f, v))
            .collect();
        must.push(strictly(field, &after[i], *asc));
        should.push(all(must));
    }
    let n = keys.len();
    let equal_on_all = || -> Vec<Query> {
        keys.iter()
            .zip(after)
            .map(|((f, _), v)| equal(f, v))
            .collect()
    };
    // Ties go by partition, offset and topic in the first key's direction.
    let asc = keys[0].1;
    if let (Some(p), Some(o)) = (
        after.get(n).and_then(Value::as_i64),
        after.get(n + 1).and_then(Value::as_i64),
    ) {
        // A later partition...
        let mut must = equal_on_all();
        must.push(range("partition", Value::from(p), asc, false));
        should.push(all(must));
        // ...or the same one at a later offset; the same partition and offset in a later
        // topic is still after.
        let topic_after = after.get(n + 2).and_then(Value::as_str).is_some_and(|t| {
            if asc {
                topic > t
            } else {
                topic < t
            }
        });
        let mut must = equal_on_all();
        must.push(Query::Term {
            field: "partition".into(),
            value: Value::from(p),
        });
        must.push(range("offset", Value::from(o), asc, topic_after));
        should.push(all(must));
    }
    Ok(Some(any(should)))
}

const ALLOWED_AGGS: &[&str] = &[
    "terms",
    "date_histogram",
    "histogram",
    "range",
    "avg",
    "min",
    "max",
    "sum",
    "stats",
    "extended_stats",
    "value_count",
    "percentiles",
    "cardinality",
    "top_hits",
    "top_metrics",
    "composite",
];

/// The buckets of a `filters` aggregation: named (`{"errors": query}`) or a list (named by
/// position, as Elasticsearch answers an anonymous list).
fn filter_buckets(name: &str, body: &Value) -> Result<Vec<(String, Value)>, SearchError> {
    let filters = body.get("filters").unwrap_or(body);
    match filters {
        Value::Object(m) => Ok(m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        Value::Array(list) => Ok(list
            .iter()
            .enumerate()
            .map(|(i, v)| (i.to_string(), v.clone()))
            .collect()),
        _ => Err(SearchError::parsing(format!(
            "[aggs] [{name}] [filters] must name its filters in an object or a list"
        ))),
    }
}

/// A `filters` bucket's query for tantivy's `filter` aggregation: any query of the DSL,
/// compiled per partition (see [`crate::filter_agg`]); `match_all` and an empty or `*`
/// query string (Grafana's filters) as tantivy's "everything".
fn filter_query_string(name: &str, query: &Value) -> Result<String, SearchError> {
    if query.get("match_all").is_some() {
        return Ok("*".into());
    }
    match query.get("query_string").and_then(|q| q.get("query")) {
        Some(Value::String(q)) if q.trim().is_empty() || q.trim() == "*" => Ok("*".into()),
        _ => crate::filter_agg::mark(name, query),
    }
}

/// `top_metrics` as a `top_hits` of the index's fields, in the same order as the metrics (so
/// the answer can be named back in `es_shape_aggs`).
fn top_metrics_as_top_hits(
    name: &str,
    body: &Map<String, Value>,
    schema: &IndexSchema,
) -> Result<Value, SearchError> {
    let field = |f: &str| {
        schema
            .resolve(f)
            .map(|r| r.name)
            .unwrap_or_else(|| format!("unmapped_{f}"))
    };
    let metrics: Vec<String> = match body.get("metrics") {
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(|m| m.get("field").and_then(Value::as_str))
            .map(field)
            .collect(),
        Some(Value::Object(m)) => m
            .get("field")
            .and_then(Value::as_str)
            .map(field)
            .into_iter()
            .collect(),
        _ => Vec::new(),
    };
    if metrics.is_empty() {
        return Err(SearchError::parsing(format!(
            "[aggs] [{name}] [top_metrics] needs [metrics] with a [field]"
        )));
    }
    let size = match body.get("size") {
        None => 1,
        Some(Value::Number(n)) => n.as_u64().unwrap_or(1),
        Some(Value::String(s)) => s.trim().parse().unwrap_or(1),
        Some(_) => 1,
    };
    let sort: Vec<Value> = match body.get("sort") {
        Some(Value::Array(list)) => list.clone(),
        Some(one @ Value::Object(_)) => vec![one.clone()],
        _ => Vec::new(),
    }
    .into_iter()
    .filter_map(|s| {
        let (f, order) = s.as_object()?.iter().next()?;
        let order = order
            .as_str()
            .or_else(|| order.get("order").and_then(Value::as_str))
            .unwrap_or("asc");
        Some(json!({ field(f): order }))
    })
    .collect();
    Ok(json!({"sort": sort, "size": size, "docvalue_fields": metrics}))
}

/// A composite date_histogram source's `calendar_interval` as tantivy takes it: the units
/// with a fixed length (second, minute, hour, day) as that `fixed_interval` (UTC days start at
/// the epoch's multiples, as Elasticsearch's do), weeks, months and years by their names.
/// Quarters are refused: tantivy's composite has no such unit, and folding months into
/// quarters would break paging.
fn composite_calendar_interval(spec: &mut Map<String, Value>) -> Result<(), SearchError> {
    let Some(ci) = spec.remove("calendar_interval") else {
        return Ok(());
    };
    let (key, unit) = match ci.as_str().unwrap_or("") {
        "1s" | "second" => ("fixed_interval", "1s"),
        "1m" | "minute" => ("fixed_interval", "1m"),
        "1h" | "hour" => ("fixed_interval", "1h"),
        "1d" | "day" => ("fixed_interval", "1d"),
        "1w" | "week" => ("calendar_interval", "week"),
        "1M" | "month" => ("calendar_interval", "month"),
        "1y" | "year" => ("calendar_interval", "year"),
        other => {
            return Err(SearchError::illegal(format!(
                "[composite] [date_histogram] calendar_interval [{other}] is not supported (1s, 1m, 1h, 1d, 1w, 1M, 1y)"
            )))
        }
    };
    spec.insert(key.into(), Value::from(unit));
    Ok(())
}

/// One value of a composite's `after` (Elasticsearch's: the key as answered, a string for a
/// keyword, epoch milliseconds for a date histogram) in tantivy's encoding (`str:gateway`,
/// `dt:<nanoseconds>`). `kind` is the source's (`terms`, `histogram`, `date_histogram`).
fn composite_after_to_tantivy(
    name: &str,
    kind: Option<&str>,
    v: &Value,
) -> Result<String, SearchError> {
    let bad = || {
        SearchError::parsing(format!(
            "[aggs] [{name}] [composite] [after] value {v} does not fit its source"
        ))
    };
    if kind == Some("date_histogram") {
        let ms = match v {
            Value::Null => return Ok("null:".into()),
            Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
            Value::String(_) => crate::dates::parse_date(v, 0),
            _ => None,
        }
        .ok_or_else(bad)?;
        let ns = ms.checked_mul(1_000_000).ok_or_else(bad)?;
        return Ok(format!("dt:{ns}"));
    }
    Ok(match v {
        Value::Null => "null:".into(),
        // Booleans are held as their words (see BOOLEAN_TERMS).
        Value::Bool(b) => format!("str:{b}"),
        Value::String(s) => format!("str:{s}"),
        Value::Number(n) if kind == Some("histogram") => {
            format!("f64:{}", n.as_f64().ok_or_else(bad)?)
        }
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => format!("i64:{i}"),
            (None, Some(u), _) => format!("u64:{u}"),
            (None, None, Some(f)) => format!("f64:{f}"),
            _ => return Err(bad()),
        },
        _ => return Err(bad()),
    })
}

/// A value of tantivy's composite `after_key` (`str:gateway`, `dt:<nanoseconds>`, ...) as
/// Elasticsearch answers it: the bucket key's own value, dates in epoch milliseconds.
fn composite_after_from_tantivy(v: &Value) -> Value {
    let Some((kind, text)) = v.as_str().and_then(|s| s.split_once(':')) else {
        return v.clone();
    };
    let number = |n: Option<Value>| n.unwrap_or_else(|| v.clone());
    match kind {
        "str" | "ip" => Value::from(text),
        "null" => Value::Null,
        "bool" => number(text.parse::<bool>().ok().map(Value::from)),
        "i64" => number(text.parse::<i64>().ok().map(Value::from)),
        "u64" => number(text.parse::<u64>().ok().map(Value::from)),
        "f64" => number(text.parse::<f64>().ok().map(Value::from)),
        "dt" => number(
            text.parse::<i64>()
                .ok()
                .map(|ns| Value::from(ns.div_euclid(1_000_000))),
        ),
        _ => v.clone(),
    }
}

/// Marks a top_hits hit (in the shaped aggregations) whose record is still to be read:
/// `[partition, offset]`, replaced by the rendered hit in [`answer`].
const TOP_HIT_AT: &str = "\u{1e}at";

/// Elasticsearch's `top_hits` as tantivy's: tantivy's answers only fast-field values, so
/// each hit carries its partition and offset (its record is read in the fetch phase like a
/// normal hit's) and the values of its sort fields. Tantivy's top_hits cannot order by score
/// (its aggregations see no scores): without a sort, hits come in index order (partition,
/// then offset), which is Elasticsearch's order among equal scores. Partition and offset also
/// break ties after the sort fields.
fn top_hits_request(
    name: &str,
    body: &Map<String, Value>,
    schema: &IndexSchema,
) -> Result<Value, SearchError> {
    let number = |k: &str, default: u64| {
        match body.get(k) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Number(n)) => n.as_u64().ok_or(()),
            Some(Value::String(s)) => s.trim().parse().map_err(|_| ()),
            Some(_) => Err(()),
        }
        .map_err(|()| {
            SearchError::parsing(format!(
                "[aggs] [{name}] [top_hits] [{k}] must be a whole number"
            ))
        })
    };
    // Elasticsearch's defaults.
    let size = number("size", 3)?;
    let from = number("from", 0)?;
    let entries: Vec<Value> = match body.get("sort") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list.clone(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                let mut one = Map::new();
                one.insert(k.clone(), v.clone());
                Value::Object(one)
            })
            .collect(),
        Some(one) => vec![one.clone()],
    };
    let mut sort = Vec::new();
    let mut fields = vec![Value::from("partition"), Value::from("offset")];
    let mut dates = Vec::new();
    for e in &entries {
        let parsed = crate::request::parse_sort_entry(e)?;
        let SortKey::Field(f) = parsed.key else {
            // `_score`: index order stands in for it (see above).
            continue;
        };
        if f == "offset" {
            // `_doc`: the tie-breakers below.
            continue;
        }
        let field = sort_field(schema, &f)?.unwrap_or_else(|| format!("unmapped_{f}"));
        let order = match parsed.direction {
            Direction::Asc => "asc",
            Direction::Desc => "desc",
        };
        use spate_broker::search_config::FieldKind;
        let date = schema.resolve(&f).is_some_and(|r| {
            matches!(
                r.role,
                FieldRole::Timestamp
                    | FieldRole::Json(FieldKind::Date)
                    | FieldRole::Dynamic(FieldKind::Date)
            )
        });
        sort.push(json!({ field.clone(): order }));
        fields.push(Value::from(field));
        dates.push(Value::from(date));
    }
    sort.push(json!({"partition": "asc"}));
    sort.push(json!({"offset": "asc"}));
    // The `sort` answered for each hit: the docvalue_fields after partition and offset, dates
    // among them (marked here; tantivy ignores the key) in epoch milliseconds.
    Ok(json!({
        "sort": sort,
        "size": size,
        "from": from,
        "docvalue_fields": fields,
        "spate_sort_dates": dates,
    }))
}

/// A tantivy top_hits answer (`hits: [{sort, docvalue_fields}]`) in Elasticsearch's shape,
/// each hit marked with [`TOP_HIT_AT`] for its record to be read; `doc_count` is the hits'
/// total (its bucket's).
fn shape_top_hits(mapped: Option<&Value>, doc_count: Option<&Value>, out: &mut Value) {
    let fields: Vec<&str> = mapped
        .and_then(|m| m["top_hits"]["docvalue_fields"].as_array())
        .map(|l| l.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let dates: Vec<bool> = mapped
        .and_then(|m| m["top_hits"]["spate_sort_dates"].as_array())
        .map(|l| l.iter().map(|d| d.as_bool().unwrap_or(false)).collect())
        .unwrap_or_default();
    let hits: Vec<Value> = out
        .get("hits")
        .and_then(Value::as_array)
        .map(|hits| {
            hits.iter()
                .map(|h| {
                    let values = &h["docvalue_fields"];
                    let partition = first_value(&values["partition"]);
                    let offset = first_value(&values["offset"]);
                    let sort: Vec<Value> = fields
                        .iter()
                        .skip(2)
                        .zip(dates.iter().chain(std::iter::repeat(&false)))
                        .map(|(f, date)| {
                            let v = first_value(&values[*f]);
                            match (date, &v) {
                                (true, Value::String(_)) => crate::dates::parse_date(&v, 0)
                                    .map(Value::from)
                                    .unwrap_or(v),
                                _ => v,
                            }
                        })
                        .collect();
                    let mut hit = Map::new();
                    hit.insert("_id".into(), Value::from(format!("{partition}-{offset}")));
                    hit.insert("_score".into(), Value::Null);
                    if !sort.is_empty() {
                        hit.insert("sort".into(), Value::Array(sort));
                    }
                    hit.insert(TOP_HIT_AT.into(), json!([partition, offset]));
                    Value::Object(hit)
                })
                .collect()
        })
        .unwrap_or_default();
    *out = json!({"hits": {
        "total": {"value": doc_count.cloned().unwrap_or(Value::from(0)), "relation": "eq"},
        "max_score": Value::Null,
        "hits": hits,
    }});
}

/// Maps field names in an aggregation request to the index's names and checks the types.
fn map_aggs(
    aggs: &Map<String, Value>,
    schema: &IndexSchema,
) -> Result<Map<String, Value>, SearchError> {
    map_aggs_at(aggs, schema, true)
}

/// [`map_aggs`] at one level: `foldable` while no bucket aggregation other than a histogram
/// encloses it (calendar months, quarters and years are folded from days only there).
fn map_aggs_at(
    aggs: &Map<String, Value>,
    schema: &IndexSchema,
    foldable: bool,
) -> Result<Map<String, Value>, SearchError> {
    let mut out = Map::new();
    for (name, spec) in aggs {
        let spec_obj = spec
            .as_object()
            .ok_or_else(|| SearchError::parsing(format!("[aggs] [{name}] must be an object")))?;
        if let Some(filters) = spec_obj.get("filters") {
            // One tantivy `filter` aggregation per bucket, named `<name>\u{1f}<bucket>`;
            // the answer is put back into Elasticsearch's `filters` shape (`es_shape_aggs`).
            let sub = match spec_obj
                .get("aggs")
                .or_else(|| spec_obj.get("aggregations"))
            {
                Some(Value::Object(s)) => Some(Value::Object(map_aggs_at(s, schema, false)?)),
                Some(_) => {
                    return Err(SearchError::parsing(format!(
                        "[aggs] [{name}] sub-aggregations must be an object"
                    )))
                }
                None => None,
            };
            for (bucket, query) in filter_buckets(name, filters)? {
                let q = filter_query_string(name, &query)?;
                let mut f = Map::new();
                f.insert("filter".into(), Value::from(q));
                if let Some(s) = &sub {
                    f.insert("aggs".into(), s.clone());
                }
                out.insert(format!("{name}\u{1f}{bucket}"), Value::Object(f));
            }
            continue;
        }
        let mut mapped = Map::new();
        let mut tagged = name.clone();
        // Sub-aggregations stay foldable only under histograms (see `fold_calendar`).
        let histogram =
            spec_obj.contains_key("date_histogram") || spec_obj.contains_key("histogram");
        for (kind, body) in spec_obj {
            if kind == "aggs" || kind == "aggregations" {
                let sub = body.as_object().ok_or_else(|| {
                    SearchError::parsing(format!(
                        "[aggs] [{name}] sub-aggregations must be an object"
                    ))
                })?;
                let sub = map_aggs_at(sub, schema, foldable && histogram)?;
                mapped.insert(kind.clone(), Value::Object(sub));
                continue;
            }
            if !ALLOWED_AGGS.contains(&kind.as_str()) {
                return Err(SearchError::parsing(format!(
                    "[aggs] [{name}]: aggregation type [{kind}] is not supported ({})",
                    ALLOWED_AGGS.join(", ")
                )));
            }
            let mut body = body.as_object().cloned().ok_or_else(|| {
                SearchError::parsing(format!("[aggs] [{name}] [{kind}] must be an object"))
            })?;
            // An unknown field aggregates nothing; tantivy answers empty for a missing column.
            let index_name = |field: &str| {
                schema
                    .resolve(field)
                    .map(|r| r.name)
                    .unwrap_or_else(|| format!("unmapped_{field}"))
            };
            // The field asked for, resolved once: its index name, and its type for the tags
            // below.
            let resolved = body
                .get("field")
                .and_then(Value::as_str)
                .and_then(|f| schema.resolve(f));
            if let Some(field) = body.get("field").and_then(Value::as_str) {
                let named = resolved
                    .as_ref()
                    .map(|r| r.name.clone())
                    .unwrap_or_else(|| format!("unmapped_{field}"));
                body.insert("field".into(), Value::from(named));
            }
            if kind == "composite" {
                // Elasticsearch's default page; tantivy requires one.
                body.entry("size").or_insert_with(|| Value::from(10));
                // Each source names its own field: `sources: [{"name": {"terms": {"field"}}}]`.
                let mut names = Vec::new();
                let mut kinds = Vec::new();
                if let Some(Value::Array(sources)) = body.get_mut("sources") {
                    for source in sources.iter_mut().filter_map(Value::as_object_mut) {
                        names.extend(source.keys().cloned());
                        for inner in source.values_mut().filter_map(Value::as_object_mut) {
                            for (source_kind, spec) in inner.iter_mut() {
                                let Some(spec) = spec.as_object_mut() else {
                                    continue;
                                };
                                if let Some(f) = spec.get("field").and_then(Value::as_str) {
                                    let mapped = index_name(f);
                                    spec.insert("field".into(), Value::from(mapped));
                                }
                                if source_kind == "date_histogram" {
                                    composite_calendar_interval(spec)?;
                                }
                                kinds.push(source_kind.clone());
                            }
                        }
                    }
                }
                if let Some(Value::Object(after)) = body.get_mut("after") {
                    for (source, v) in after.iter_mut() {
                        let kind = names
                            .iter()
                            .position(|n| n == source)
                            .and_then(|i| kinds.get(i))
                            .map(String::as_str);
                        *v = Value::from(composite_after_to_tantivy(name, kind, v)?);
                    }
                }
            }
            if kind == "date_histogram" {
                let zone = match body.remove("time_zone") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(text)) => {
                        let zone = crate::zone::parse(&text)?;
                        (!crate::zone::is_utc(&zone)).then_some((text, zone))
                    }
                    Some(other) => {
                        return Err(SearchError::parsing(format!(
                            "[date_histogram] time_zone must be a string, got {other}"
                        )))
                    }
                };
                if let Some((text, zone)) = zone {
                    if let Some(tag) = zoned_histogram(&mut body, &text, &zone, foldable)? {
                        tagged = format!("{name}\u{1e}{tag}");
                    }
                } else if let Some(ci) = body.remove("calendar_interval") {
                    // Fixed lengths for the calendar units that have one.
                    let ci = ci.as_str().unwrap_or("");
                    let fixed = match ci {
                        "1s" | "second" => "1s",
                        "1m" | "minute" => "1m",
                        "1h" | "hour" => "1h",
                        "1d" | "day" => "1d",
                        "1w" | "week" => {
                            // Weeks start on Monday; the epoch was a Thursday.
                            body.entry("offset").or_insert_with(|| Value::from("4d"));
                            "7d"
                        }
                        other => match CalendarUnit::parse(other) {
                            Some(_) if !foldable => {
                                return Err(SearchError::illegal(format!(
                                    "[date_histogram] calendar_interval [{other}] is supported at the top level and under other histograms, not under terms, filters or ranges; use fixed_interval there"
                                )))
                            }
                            Some(unit) => {
                                // Counted by day, folded into calendar units after the merge
                                // (tantivy knows only fixed lengths); gaps are filled then.
                                tagged = format!("{name}\u{1e}{}", unit.tag());
                                for k in ["extended_bounds", "offset", "min_doc_count"] {
                                    body.remove(k);
                                }
                                body.insert("min_doc_count".into(), Value::from(1));
                                "1d"
                            }
                            None => {
                                return Err(SearchError::illegal(format!(
                                    "[date_histogram] calendar_interval [{other}] is not a calendar unit (1m, 1h, 1d, 1w, 1M, 1q, 1y)"
                                )))
                            }
                        },
                    };
                    body.insert("fixed_interval".into(), Value::from(fixed));
                }
                // Keys are epoch milliseconds either way (what Grafana's `epoch_millis` asks
                // for); `key_as_string` stays RFC 3339 whatever format is named.
                body.remove("format");
            }
            if matches!(kind.as_str(), "min" | "max" | "stats") {
                // Tantivy answers a date column's values in nanoseconds; the tag has them
                // answered in milliseconds with their text (`es_shape_aggs`).
                use spate_broker::search_config::FieldKind;
                let date = resolved.as_ref().is_some_and(|r| {
                    matches!(
                        r.role,
                        FieldRole::Timestamp
                            | FieldRole::Json(FieldKind::Date)
                            | FieldRole::Dynamic(FieldKind::Date)
                    )
                });
                if date {
                    tagged = format!("{name}{DATE_METRIC}");
                }
            }
            if kind == "terms" {
                // Booleans are held as the words "true" and "false"; the tag has their buckets
                // keyed 1 and 0 as Elasticsearch keys them (`es_shape_aggs`).
                let boolean = resolved
                    .as_ref()
                    .and_then(|r| r.path.as_ref())
                    .is_some_and(|p| {
                        schema.dynamic.load().fields.get(p).map(|f| f.ty)
                            == Some(crate::mapping::EsType::Boolean)
                    });
                if boolean {
                    tagged = format!("{name}{BOOLEAN_TERMS}");
                }
            }
            if kind == "top_hits" {
                mapped.insert("top_hits".into(), top_hits_request(name, &body, schema)?);
                continue;
            }
            if kind == "top_metrics" {
                // top_hits holds the same: the metrics of the first hits in an order.
                mapped.insert(
                    "top_hits".into(),
                    top_metrics_as_top_hits(name, &body, schema)?,
                );
                continue;
            }
            if kind == "terms"
                && !body.contains_key("shard_size")
                && !body.contains_key("split_size")
            {
                // Each node answers more terms than asked, as Elasticsearch's shards do
                // (size * 1.5 + 10): with only `size`, a term just below each node's cut is
                // missed and the counts merged are wrong (the cut is made in `partial`).
                let size = body.get("size").and_then(Value::as_u64).unwrap_or(10);
                body.insert("shard_size".into(), Value::from(size * 3 / 2 + 10));
            }
            if kind == "percentiles" {
                // Grafana sends percents as strings ("95"); Elasticsearch reads them as numbers.
                if let Some(Value::Array(list)) = body.get_mut("percents") {
                    for p in list.iter_mut() {
                        if let Some(n) = p.as_str().and_then(|s| s.trim().parse::<f64>().ok()) {
                            *p = Value::from(n);
                        }
                    }
                }
            }
            mapped.insert(kind.clone(), Value::Object(body));
        }
        out.insert(tagged, Value::Object(mapped));
    }
    Ok(out)
}

/// Terms a segment keeps at most (tantivy cuts each segment's terms at `segment_size`): as
/// many as an answer may hold buckets, so that a partition counts its terms over all its
/// segments, not the top few of each.
const SEGMENT_TERMS: u64 = 65_000;

/// Has every `terms` in `mapped` (sub-aggregations too) keep [`SEGMENT_TERMS`] per segment,
/// or its own shard_size if larger. Elasticsearch counts a shard's terms exactly over all its
/// segments and cuts only the shard's answer at shard_size; tantivy cuts each segment, and a
/// partition holds many, so a term ranked just below the cut in some segments was counted
/// short (issue 26). The cut at shard_size is made on the node's merged answer ([`partial`]).
fn widen_segment_cut(mapped: &mut Map<String, Value>) {
    for spec in mapped.values_mut() {
        let Some(spec) = spec.as_object_mut() else {
            continue;
        };
        if let Some(Value::Object(terms)) = spec.get_mut("terms") {
            let asked = ["shard_size", "split_size", "segment_size"]
                .iter()
                .filter_map(|k| terms.remove(*k))
                .filter_map(|v| v.as_u64())
                .max()
                .unwrap_or(0);
            terms.insert("segment_size".into(), Value::from(asked.max(SEGMENT_TERMS)));
        }
        for k in ["aggs", "aggregations"] {
            if let Some(Value::Object(sub)) = spec.get_mut(k) {
                widen_segment_cut(sub);
            }
        }
    }
}

/// Whether some histogram in `mapped` (or under it) is counted finely and folded into
/// calendar units after the final merge (see [`fold_calendar`]).
fn has_calendar_fold(mapped: &Map<String, Value>) -> bool {
    mapped.iter().any(|(name, spec)| {
        name.split_once('\u{1e}')
            .is_some_and(|(_, tag)| fold_of(tag).is_some())
            || ["aggs", "aggregations"].iter().any(|k| {
                spec.get(*k)
                    .and_then(Value::as_object)
                    .is_some_and(has_calendar_fold)
            })
    })
}

/// Whether `mapped` holds a `percentiles` aggregation (sub-aggregations too).
fn asks_percentiles(mapped: &Map<String, Value>) -> bool {
    mapped.values().any(|spec| {
        spec.get("percentiles").is_some()
            || ["aggs", "aggregations"].iter().any(|k| {
                spec.get(*k)
                    .and_then(Value::as_object)
                    .is_some_and(asks_percentiles)
            })
    })
}

/// The percents each `percentiles` in `mapped` asks for, by its name (sub-aggregations too).
fn percents_by_name(mapped: &Map<String, Value>, out: &mut HashMap<String, Vec<f64>>) {
    for (name, spec) in mapped {
        if let Some(p) = spec.get("percentiles") {
            let percents = match p.get("percents").and_then(Value::as_array) {
                Some(list) => list.iter().filter_map(Value::as_f64).collect(),
                // Elasticsearch's and tantivy's default.
                None => vec![1.0, 5.0, 25.0, 50.0, 75.0, 95.0, 99.0],
            };
            out.insert(name.clone(), percents);
        }
        for k in ["aggs", "aggregations"] {
            if let Some(sub) = spec.get(k).and_then(Value::as_object) {
                percents_by_name(sub, out);
            }
        }
    }
}

/// Has every percentiles in the merged `results` answer what Elasticsearch's t-digest
/// answers over values it holds apart, as it holds few values (and the tails of many) one per
/// centroid: for n values v[0] <= .. <= v[n-1], each standing at i + 0.5 on a scale of 0 to
/// n, the q-quantile is read at q * n on that scale, linearly between the two values around
/// it, v[0] before the first and v[n-1] past the last. Tantivy's DDSketch takes
/// v[floor(q * (n - 1))], the lower neighbour: over 24.37 and 30.25 its p50 and p75 were
/// 24.37 where Elasticsearch answers 27.31 and 30.25 (issue 26; the rule matched OpenSearch
/// 2.19 to its digits over buckets of 12 to 165 values). The values of each rank still come
/// from the sketch (1 % accurate), so large counts keep its bounded memory. Tantivy reads the answer from the sketch at the request's percents only, so each
/// sketch is replaced by one holding just the answers at the ranks those percents fall on.
/// Results that cannot be walked are left as they are.
fn tdigest_ranks(mapped: &Map<String, Value>, results: &mut IntermediateAggregationResults) {
    let mut percents = HashMap::new();
    percents_by_name(mapped, &mut percents);
    // Walked in the form results travel between nodes in (MessagePack: some results hold
    // bytes that only its decoder reads back as they were written).
    let rewritten = rmp_serde::to_vec_named(&*results)
        .map_err(|e| e.to_string())
        .and_then(|bytes| {
            rmp_serde::from_slice::<serde_value::Value>(&bytes).map_err(|e| e.to_string())
        })
        .and_then(|mut tree| {
            rewrite_sketches(&mut tree, &percents)?;
            let bytes = rmp_serde::to_vec_named(&tree).map_err(|e| e.to_string())?;
            rmp_serde::from_slice::<IntermediateAggregationResults>(&bytes)
                .map_err(|e| e.to_string())
        });
    match rewritten {
        Ok(r) => *results = r,
        Err(e) => tracing::warn!("percentiles answered at the sketch's ranks: {e}"),
    }
}

/// Values a rewritten sketch holds (see [`answering_sketch`]): the finer, the closer two
/// percents may be and still fall on different ranks.
const ANSWER_RANKS: u64 = 1_000_001;

/// The q-quantile (q in [0, 1]) of the values `sketch` holds, by [`tdigest_ranks`]' rule.
fn tdigest_quantile(sketch: &sketches_ddsketch::DDSketch, q: f64) -> Option<f64> {
    let n = sketch.count();
    let (min, max) = (sketch.min()?, sketch.max()?);
    let at = |rank: usize| -> Option<f64> {
        if rank == 0 {
            Some(min)
        } else if rank + 1 >= n {
            Some(max)
        } else {
            // The sketch takes rank floor(q * (n - 1)); half a rank up keeps rounding off it.
            let q = (rank as f64 + 0.5) / (n - 1) as f64;
            sketch.quantile(q.min(1.0)).ok().flatten()
        }
    };
    // Where q falls among the values' positions (v[k] at k + 0.5).
    let at_scale = q * n as f64 - 0.5;
    if n == 1 || at_scale <= 0.0 {
        Some(min)
    } else if at_scale >= (n - 1) as f64 {
        Some(max)
    } else {
        let k = at_scale as usize;
        let f = at_scale - k as f64;
        let low = at(k)?;
        if f == 0.0 {
            return Some(low);
        }
        Some(low + f * (at(k + 1)? - low))
    }
}

/// A sketch whose quantile at each of `percents` (as tantivy reads it: rank
/// floor(q * (count - 1)), min at 0, max at 100) is `original`'s by [`tdigest_quantile`].
fn answering_sketch(
    original: &sketches_ddsketch::DDSketch,
    percents: &[f64],
) -> Option<sketches_ddsketch::DDSketch> {
    let mut wanted: Vec<(u64, f64)> = Vec::new();
    let mut sorted: Vec<f64> = percents
        .iter()
        .copied()
        .filter(|p| (0.0..=100.0).contains(p))
        .collect();
    sorted.sort_by(f64::total_cmp);
    for p in sorted {
        let q = p / 100.0;
        // Tantivy's own rank arithmetic, so that each percent lands on its block.
        let rank = (q * (ANSWER_RANKS as f64 - 1.0)) as u64;
        wanted.push((rank, tdigest_quantile(original, q)?));
    }
    let mut out = sketches_ddsketch::DDSketch::new(sketches_ddsketch::Config::defaults());
    let mut next = 0;
    let last = wanted.len().checked_sub(1)?;
    for (j, &(rank, value)) in wanted.iter().enumerate() {
        // Ranks from `next` up to this percent's (the last's: to the end) hold its answer.
        let upto = if j == last { ANSWER_RANKS - 1 } else { rank };
        if upto + 1 > next {
            out.add_with_count(value, upto + 1 - next);
            next = upto + 1;
        }
    }
    Some(out)
}

/// [`tdigest_ranks`] on a generic form of tantivy's results: each percentiles result, found
/// under its name, gets its answering sketch.
fn rewrite_sketches(
    v: &mut serde_value::Value,
    percents: &HashMap<String, Vec<f64>>,
) -> Result<(), String> {
    use serde_value::Value as V;
    let key = |s: &str| V::String(s.into());
    match v {
        V::Map(m) => {
            for (k, child) in m.iter_mut() {
                let asked = match k {
                    V::String(name) => percents.get(name),
                    _ => None,
                };
                let sketch = match (asked, &mut *child) {
                    (Some(asked), V::Map(metric)) => metric
                        .get_mut(&key("Metric"))
                        .and_then(|m| match m {
                            V::Map(m) => m.get_mut(&key("Percentiles")),
                            _ => None,
                        })
                        .and_then(|p| match p {
                            V::Map(p) => p.get_mut(&key("sketch")),
                            _ => None,
                        })
                        .map(|s| (asked, s)),
                    _ => None,
                };
                match sketch {
                    Some((asked, sketch)) => {
                        let original: sketches_ddsketch::DDSketch = sketch
                            .clone()
                            .deserialize_into()
                            .map_err(|e| e.to_string())?;
                        if let Some(answering) = answering_sketch(&original, asked) {
                            *sketch =
                                serde_value::to_value(&answering).map_err(|e| e.to_string())?;
                        }
                    }
                    None => rewrite_sketches(child, percents)?,
                }
            }
        }
        V::Seq(list) => {
            for item in list {
                rewrite_sketches(item, percents)?;
            }
        }
        V::Option(Some(inner)) | V::Newtype(inner) => rewrite_sketches(inner, percents)?,
        _ => {}
    }
    Ok(())
}

/// `extended_stats` over one value or none as Elasticsearch answers it (Grafana reads the
/// bounds): over one value the variances are 0 (the sampling ones undefined, "NaN") and the
/// bounds are the value; over none every figure is null but the bounds are still an object.
fn shape_extended_stats(out: &mut Value) {
    let Some(m) = out.as_object_mut() else {
        return;
    };
    let bound_names = [
        "upper",
        "lower",
        "upper_population",
        "lower_population",
        "upper_sampling",
        "lower_sampling",
    ];
    match m.get("count").and_then(Value::as_u64) {
        Some(1) => {
            for k in [
                "variance",
                "variance_population",
                "std_deviation",
                "std_deviation_population",
            ] {
                m.insert(k.into(), Value::from(0.0));
            }
            for k in ["variance_sampling", "std_deviation_sampling"] {
                m.insert(k.into(), Value::from("NaN"));
            }
            let avg = m.get("avg").cloned().unwrap_or(Value::Null);
            let bounds: Map<String, Value> = bound_names
                .iter()
                .map(|k| {
                    let v = if k.ends_with("_sampling") {
                        Value::from("NaN")
                    } else {
                        avg.clone()
                    };
                    (k.to_string(), v)
                })
                .collect();
            m.insert("std_deviation_bounds".into(), Value::Object(bounds));
        }
        Some(0) if !m.get("std_deviation_bounds").is_some_and(Value::is_object) => {
            let bounds: Map<String, Value> = bound_names
                .iter()
                .map(|k| (k.to_string(), Value::Null))
                .collect();
            m.insert("std_deviation_bounds".into(), Value::Object(bounds));
        }
        _ => {}
    }
}

/// Tags the mapped name of a `terms` of a boolean field.
const BOOLEAN_TERMS: &str = "\u{1e}bool";

/// A boolean `terms` answer as Elasticsearch gives it: buckets keyed 1 and 0, with
/// `key_as_string` "true" and "false".
fn shape_boolean_terms(out: &mut Value) {
    let Some(Value::Array(buckets)) = out.get_mut("buckets") else {
        return;
    };
    for b in buckets.iter_mut() {
        let key = match b.get("key").and_then(Value::as_str) {
            Some("true") => 1,
            Some("false") => 0,
            _ => continue,
        };
        b["key_as_string"] = Value::from(if key == 1 { "true" } else { "false" });
        b["key"] = Value::from(key);
    }
}

/// Tags the mapped name of a `min`, `max` or `stats` of a date field.
const DATE_METRIC: &str = "\u{1e}date";

/// A date metric's values (nanoseconds from tantivy) as Elasticsearch answers them: epoch
/// milliseconds, each with its text (`value_as_string`, `min_as_string`, ...).
fn shape_date_metric(out: &mut Value) {
    let Some(m) = out.as_object_mut() else {
        return;
    };
    for k in ["value", "min", "max", "avg"] {
        let Some(ns) = m.get(k).and_then(Value::as_f64) else {
            continue;
        };
        let ms = (ns / 1e6).round();
        m.insert(k.into(), Value::from(ms));
        if let Some(text) = crate::dates::rfc3339_millis(ms as i64) {
            m.insert(format!("{k}_as_string"), Value::from(text));
        }
    }
    // A sum of instants is no instant.
    if m.contains_key("sum") {
        if let Some(sum) = m.get("sum").and_then(Value::as_f64) {
            m.insert("sum".into(), Value::from((sum / 1e6).round()));
        }
    }
}

/// A date_histogram in a zone other than UTC, as tantivy (which knows UTC and fixed lengths
/// only) can count it. Buckets start at the start of their local unit (local midnight for
/// days), keyed by that instant, as Elasticsearch's are:
/// - a fixed length that divides an hour (so calendar seconds, minutes, hours): local starts
///   are UTC ones shifted by the zone's offset modulo the length, which DST changes (whole
///   hours) keep: tantivy's `offset` does it;
/// - any unit in a zone of one fixed offset: the same, days and weeks as fixed lengths, months,
///   quarters and years folded from such days;
/// - otherwise (days, weeks, months... in a zone with DST): counted by hour (shifted by the
///   zone's offset modulo an hour) and folded into local units after the merge, where folding
///   is done (not under terms, filters or ranges). There, a zone's offset at the histogram's
///   lower bound (or now) is taken as fixed: exact unless the buckets cross a DST change.
///
/// Answers the tag of a folded histogram (see [`fold_of`]).
fn zoned_histogram(
    body: &mut Map<String, Value>,
    zone_text: &str,
    zone: &jiff::tz::TimeZone,
    foldable: bool,
) -> Result<Option<String>, SearchError> {
    use crate::zone::Unit;
    const HOUR: i64 = 3_600_000;
    const DAY: i64 = 24 * HOUR;
    let unit = match (body.remove("calendar_interval"), body.get("fixed_interval")) {
        (Some(ci), _) => {
            let ci = ci.as_str().unwrap_or("");
            Unit::calendar(ci).ok_or_else(|| {
                SearchError::illegal(format!(
                    "[date_histogram] calendar_interval [{ci}] is not a calendar unit (1m, 1h, 1d, 1w, 1M, 1q, 1y)"
                ))
            })?
        }
        (None, Some(fi)) => {
            let fi = fi.as_str().unwrap_or("");
            match crate::zone::duration_ms(fi) {
                Some(ms) if ms > 0 => Unit::Fixed(ms),
                _ => {
                    return Err(SearchError::illegal(format!(
                        "[date_histogram] fixed_interval [{fi}] is not a duration"
                    )))
                }
            }
        }
        // No interval: tantivy says what is missing.
        (None, None) => return Ok(None),
    };
    let user_offset = match body.remove("offset") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_str()
            .and_then(crate::zone::duration_ms)
            .or_else(|| v.as_i64())
            .ok_or_else(|| {
                SearchError::illegal(format!("[date_histogram] offset {v} is not a duration"))
            })?,
    };
    // The zone's offset where the histogram starts (its lower bound, else now).
    let at = body
        .get("extended_bounds")
        .or_else(|| body.get("hard_bounds"))
        .and_then(|b| b.get("min"))
        .and_then(|v| crate::dates::parse_date(v, 0))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0)
        });
    let zone_offset = crate::zone::offset_ms(zone, at);
    let fixed_zone = zone.to_fixed_offset().is_ok();
    // Bucket starts of a length as tantivy's `offset`: local starts in UTC terms.
    let direct = |body: &mut Map<String, Value>, len: i64, extra: i64| {
        let shift = (extra + user_offset - zone_offset).rem_euclid(len);
        body.insert("fixed_interval".into(), Value::from(format!("{len}ms")));
        body.insert("offset".into(), Value::from(format!("{shift}ms")));
    };
    let length = match unit {
        Unit::Fixed(len) => Some((len, 0)),
        Unit::Day => Some((DAY, 0)),
        // Weeks start on Monday; the epoch was a Thursday.
        Unit::Week => Some((7 * DAY, 4 * DAY)),
        _ => None,
    };
    match length {
        Some((len, extra)) if HOUR % len == 0 || fixed_zone => {
            direct(body, len, extra);
            return Ok(None);
        }
        Some((len, extra)) if !foldable => {
            direct(body, len, extra);
            return Ok(None);
        }
        None if !foldable => {
            return Err(SearchError::illegal(format!(
                "[date_histogram] calendar_interval [{}] is supported at the top level and under other histograms, not under terms, filters or ranges; use fixed_interval there",
                unit.tag()
            )))
        }
        _ => {}
    }
    // Counted on a grid whose buckets never straddle a local unit's start, folded after the
    // merge (see `fold_calendar`); gaps are filled then.
    let grid = if fixed_zone { DAY } else { HOUR };
    for k in ["extended_bounds", "hard_bounds", "min_doc_count"] {
        body.remove(k);
    }
    body.insert("min_doc_count".into(), Value::from(1));
    direct(body, grid, 0);
    Ok(Some(format!("{}@{user_offset}@{zone_text}", unit.tag())))
}

/// The rounding a folded histogram's tag names: `M`, `q`, `y` (UTC months, quarters, years),
/// or `<unit>@<offset ms>@<time zone>` ([`zoned_histogram`]).
fn fold_of(tag: &str) -> Option<crate::zone::Rounding> {
    let mut parts = tag.splitn(3, '@');
    let unit = crate::zone::Unit::from_tag(parts.next()?)?;
    let offset_ms = match parts.next() {
        Some(o) => o.parse().ok()?,
        None => 0,
    };
    let zone = match parts.next() {
        Some(z) => crate::zone::parse(z).ok()?,
        None => jiff::tz::TimeZone::UTC,
    };
    Some(crate::zone::Rounding {
        unit,
        zone,
        offset_ms,
    })
}

/// The calendar units longer than a day, which have no fixed length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CalendarUnit {
    Month,
    Quarter,
    Year,
}

impl CalendarUnit {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "1M" | "month" => Some(Self::Month),
            "1q" | "quarter" => Some(Self::Quarter),
            "1y" | "year" => Some(Self::Year),
            _ => None,
        }
    }

    /// The mark in the name of a mapped aggregation that holds this unit's days.
    fn tag(self) -> &'static str {
        match self {
            Self::Month => "M",
            Self::Quarter => "q",
            Self::Year => "y",
        }
    }
}

/// Folds the buckets of date histograms counted on a finer grid (named with their rounding's
/// tag by `map_aggs`, see [`fold_of`]) into their units: UTC months, quarters or years, or
/// local units of a time zone; merging their sub-aggregations, in the merged intermediate
/// results of `mapped`; nested ones under histograms too.
fn fold_calendar(
    mapped: &Map<String, Value>,
    results: &mut IntermediateAggregationResults,
) -> Result<(), SearchError> {
    use tantivy::aggregation::intermediate_agg_result::{
        IntermediateAggregationResult as R, IntermediateBucketResult as B,
        IntermediateHistogramBucketEntry,
    };
    for (name, spec) in mapped {
        if !(spec.get("date_histogram").is_some() || spec.get("histogram").is_some()) {
            continue;
        }
        let unit = name.split_once('\u{1e}').and_then(|(_, tag)| fold_of(tag));
        let sub = spec
            .get("aggs")
            .or_else(|| spec.get("aggregations"))
            .and_then(Value::as_object);
        let Some(found) = results.remove(name) else {
            continue;
        };
        let found = match found {
            R::Bucket(B::Histogram {
                is_date_agg,
                mut buckets,
            }) => {
                if let Some(sub) = sub {
                    for b in &mut buckets {
                        fold_calendar(sub, &mut b.sub_aggregation)?;
                    }
                }
                if let Some(unit) = unit {
                    // Date keys are nanoseconds; a numeric field's are its own (ms).
                    let scale = if is_date_agg { 1_000_000.0 } else { 1.0 };
                    let mut folded: std::collections::BTreeMap<
                        i64,
                        IntermediateHistogramBucketEntry,
                    > = std::collections::BTreeMap::new();
                    for b in buckets {
                        let ms = (b.key / scale) as i64;
                        let Some(start) = unit.start(ms) else {
                            continue;
                        };
                        match folded.entry(start) {
                            std::collections::btree_map::Entry::Vacant(v) => {
                                let mut b = b;
                                b.key = start as f64 * scale;
                                v.insert(b);
                            }
                            std::collections::btree_map::Entry::Occupied(mut o) => {
                                let into = o.get_mut();
                                into.doc_count += b.doc_count;
                                into.sub_aggregation.merge_fruits(b.sub_aggregation)?;
                            }
                        }
                    }
                    buckets = folded.into_values().collect();
                }
                R::Bucket(B::Histogram {
                    is_date_agg,
                    buckets,
                })
            }
            other => other,
        };
        results.push(name.clone(), found)?;
    }
    Ok(())
}

/// A calendar-unit histogram's answer as Elasticsearch gives it: under its own name, with the
/// empty units between its first and last (and across `extended_bounds`) filled in unless
/// `min_doc_count` is above 0.
fn shape_calendar(spec: &Map<String, Value>, unit: &crate::zone::Rounding, out: &mut Value) {
    let body = &spec["date_histogram"];
    let min_doc_count = body
        .get("min_doc_count")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let Some(Value::Array(buckets)) = out.get_mut("buckets") else {
        return;
    };
    buckets.retain(|b| b["doc_count"].as_u64().unwrap_or(0) >= min_doc_count.max(1));
    if min_doc_count > 0 {
        return;
    }
    let bound = |k: &str| {
        body.get("extended_bounds")
            .and_then(|b| b.get(k))
            .and_then(|v| crate::dates::parse_date(v, 0))
            .and_then(|ms| unit.start(ms))
    };
    let keys: Vec<i64> = buckets.iter().filter_map(|b| b["key"].as_i64()).collect();
    let first = keys.first().copied().into_iter().chain(bound("min")).min();
    let last = keys.last().copied().into_iter().chain(bound("max")).max();
    let (Some(mut at), Some(last)) = (first, last) else {
        return;
    };
    let mut filled = Vec::new();
    let mut existing = std::mem::take(buckets).into_iter().peekable();
    // Bounded: ten thousand units is 833 years of months.
    for _ in 0..10_000 {
        if at > last {
            break;
        }
        match existing.peek() {
            Some(b) if b["key"].as_i64() == Some(at) => filled.extend(existing.next()),
            _ => filled.push(json!({
                "key": at,
                "key_as_string": date_key_string(spec, at),
                "doc_count": 0,
            })),
        }
        match unit.next(at) {
            Some(n) => at = n,
            None => break,
        }
    }
    filled.extend(existing);
    *buckets = filled;
}

/// A hit's `fields`: each asked-for field's values, as Elasticsearch lists them (always a
/// list; dates as RFC 3339). `@timestamp` is the document's own when it has one, else the
/// record's timestamp; fields a record does not have are left out.
fn field_values(r: &LogRecord, index: &PartitionIndex, names: &[String]) -> Value {
    let doc = r.value.as_ref().and_then(|v| index.parse_value(v));
    let mut out = Map::new();
    for name in names {
        let own: Vec<Value> = doc
            .as_ref()
            .map(|d| values_at(d, name).into_iter().cloned().collect())
            .unwrap_or_default();
        let values = match name.as_str() {
            "@timestamp" | "timestamp" | "_timestamp" => {
                let ms = own
                    .first()
                    .filter(|_| name == "@timestamp")
                    .and_then(|v| crate::dates::parse_date(v, r.timestamp))
                    .unwrap_or(r.timestamp);
                crate::dates::rfc3339_millis(ms)
                    .map(|s| vec![Value::from(s)])
                    .unwrap_or_default()
            }
            _ => own,
        };
        if !values.is_empty() {
            out.insert(name.clone(), Value::Array(values));
        }
    }
    Value::Object(out)
}

/// Brings tantivy's aggregation answer to Elasticsearch's shape where clients notice:
/// date_histogram keys are integers (epoch milliseconds), not floats.
fn es_shape_aggs(request: &Map<String, Value>, mapped: Option<&Value>, result: &mut Value) {
    // The bucket's count: the total of a top_hits in it.
    let doc_count = result.get("doc_count").cloned();
    let sub_of = |m: Option<&Value>, name: &str| -> Option<Value> {
        let a = m?.get(name)?;
        a.get("aggs").or_else(|| a.get("aggregations")).cloned()
    };
    for (name, spec) in request {
        let Some(spec) = spec.as_object() else {
            continue;
        };
        if let (Some(filters), Some(all)) = (spec.get("filters"), result.as_object_mut()) {
            let Ok(buckets) = filter_buckets(name, filters) else {
                continue;
            };
            let keyed = filters.get("filters").unwrap_or(filters).is_object();
            let mut named = Map::new();
            let mut listed = Vec::new();
            for (bucket, _) in buckets {
                let mut b = all
                    .remove(&format!("{name}\u{1f}{bucket}"))
                    .unwrap_or_else(|| json!({"doc_count": 0}));
                if let Some(sub) = spec
                    .get("aggs")
                    .or_else(|| spec.get("aggregations"))
                    .and_then(Value::as_object)
                {
                    let m = sub_of(mapped, &format!("{name}\u{1f}{bucket}"));
                    es_shape_aggs(sub, m.as_ref(), &mut b);
                }
                if keyed {
                    named.insert(bucket, b);
                } else {
                    listed.push(b);
                }
            }
            let buckets = if keyed {
                Value::Object(named)
            } else {
                Value::Array(listed)
            };
            all.insert(name.clone(), json!({ "buckets": buckets }));
            continue;
        }
        // The mapped name of a folded histogram carries its rounding (see `fold_of`).
        let folded = spec
            .get("date_histogram")
            .and(mapped)
            .and_then(Value::as_object)
            .and_then(|m| {
                let prefix = format!("{name}\u{1e}");
                m.keys().find_map(|k| {
                    let rounding = fold_of(k.strip_prefix(&prefix)?)?;
                    Some((k.clone(), rounding))
                })
            })
            .or_else(|| {
                // Without the mapped request: UTC months, quarters and years.
                let unit = spec
                    .get("date_histogram")
                    .and_then(|d| d.get("calendar_interval"))
                    .and_then(Value::as_str)
                    .and_then(CalendarUnit::parse)?;
                Some((format!("{name}\u{1e}{}", unit.tag()), fold_of(unit.tag())?))
            });
        let boolean = format!("{name}{BOOLEAN_TERMS}");
        let (mapped_name, calendar) = match folded {
            Some((n, rounding)) => (n, Some(rounding)),
            None if mapped.and_then(|m| m.get(&boolean)).is_some() => (boolean, None),
            None => (name.clone(), None),
        };
        if let (Some(_), Some(all)) = (&calendar, result.as_object_mut()) {
            if let Some(v) = all.remove(&mapped_name) {
                all.insert(name.clone(), v);
            }
        }
        if let Some(all) = result.as_object_mut() {
            if let Some(mut v) = all.remove(&format!("{name}{DATE_METRIC}")) {
                shape_date_metric(&mut v);
                all.insert(name.clone(), v);
                continue;
            }
            if let Some(mut v) = all.remove(&format!("{name}{BOOLEAN_TERMS}")) {
                shape_boolean_terms(&mut v);
                all.insert(name.clone(), v);
            }
        }
        let Some(out) = result.get_mut(name) else {
            continue;
        };
        if spec.contains_key("composite") {
            if let Some(Value::Object(after)) = out.get_mut("after_key") {
                for v in after.values_mut() {
                    *v = composite_after_from_tantivy(v);
                }
            }
        }
        if spec.contains_key("top_hits") {
            shape_top_hits(mapped.and_then(|m| m.get(name)), doc_count.as_ref(), out);
            continue;
        }
        if let Some(tm) = spec.get("top_metrics") {
            // top_hits answered `hits: [{sort, docvalue_fields: {index name: value}}]`, the
            // fields in the order of the metrics.
            let names: Vec<String> = match tm.get("metrics") {
                Some(Value::Array(list)) => list
                    .iter()
                    .filter_map(|m| m.get("field").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect(),
                Some(Value::Object(m)) => m
                    .get("field")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .into_iter()
                    .collect(),
                _ => Vec::new(),
            };
            let index_names: Vec<String> = mapped
                .and_then(|m| m.get(name))
                .and_then(|a| a["top_hits"]["docvalue_fields"].as_array())
                .map(|l| {
                    l.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            let top: Vec<Value> = out
                .get("hits")
                .and_then(Value::as_array)
                .map(|hits| {
                    hits.iter()
                        .map(|h| {
                            let fields = &h["docvalue_fields"];
                            let metrics: Map<String, Value> = names
                                .iter()
                                .zip(&index_names)
                                .map(|(n, i)| (n.clone(), first_value(&fields[i.as_str()])))
                                .collect();
                            json!({"sort": h.get("sort").cloned().unwrap_or(json!([])), "metrics": metrics})
                        })
                        .collect()
                })
                .unwrap_or_default();
            *out = json!({ "top": top });
            continue;
        }
        let sub = spec
            .get("aggs")
            .or_else(|| spec.get("aggregations"))
            .and_then(Value::as_object);
        if let Some(terms) = spec.get("terms") {
            add_missing_bucket(terms, sub_of(mapped, &mapped_name), out);
        }
        if spec.contains_key("extended_stats") {
            shape_extended_stats(out);
        }
        let date = spec.contains_key("date_histogram");
        let buckets = match out.get_mut("buckets") {
            Some(Value::Array(list)) => list.iter_mut().collect::<Vec<_>>(),
            // Keyed buckets (ranges, filters) are an object of buckets.
            Some(Value::Object(map)) => map.values_mut().collect(),
            _ => Vec::new(),
        };
        for b in buckets {
            if date {
                if let Some(k) = b.get("key").and_then(Value::as_f64) {
                    b["key"] = Value::from(k as i64);
                    b["key_as_string"] = Value::from(date_key_string(spec, k as i64));
                }
            }
            if let Some(sub) = sub {
                es_shape_aggs(sub, sub_of(mapped, &mapped_name).as_ref(), b);
            }
        }
        if let Some(rounding) = &calendar {
            shape_calendar(spec, rounding, out);
        }
        if let Some(range) = spec.get("range") {
            shape_ranges(range, out);
        }
    }
}

/// `terms` with `missing` and `min_doc_count: 0`: Elasticsearch lists the missing-value
/// bucket even when every document has the field (Grafana's logs volume asks for it), with its
/// sub-aggregations empty (a date histogram with `extended_bounds` still has its zero buckets).
/// Tantivy leaves it out, so it is added here, its sub-aggregations computed over no document.
fn add_missing_bucket(terms: &Value, mapped_sub: Option<Value>, out: &mut Value) {
    let Some(missing) = terms.get("missing").filter(|m| !m.is_null()) else {
        return;
    };
    if terms.get("min_doc_count").and_then(Value::as_u64) != Some(0) {
        return;
    }
    let Some(Value::Array(buckets)) = out.get_mut("buckets") else {
        return;
    };
    let key_str = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let want = key_str(missing);
    if buckets
        .iter()
        .any(|b| b.get("key").map(key_str).as_deref() == Some(want.as_str()))
    {
        return;
    }
    let mut bucket = json!({"key": missing, "doc_count": 0});
    if let Some(Value::Object(sub)) = mapped_sub {
        let empty = parse_aggs(sub).ok().and_then(|req| {
            IntermediateAggregationResults::default()
                .into_final_result(
                    req,
                    AggregationLimitsGuard::new(Some(200_000_000), Some(65_000)),
                )
                .ok()
        });
        if let Some(Value::Object(results)) = empty.and_then(|r| serde_json::to_value(r).ok()) {
            if let Value::Object(b) = &mut bucket {
                b.extend(results);
            }
        }
    }
    buckets.push(bucket);
}

/// A date histogram key as the request's `format` renders it: epoch milliseconds or seconds
/// as Grafana asks (`epoch_millis`), else Elasticsearch's default (RFC 3339 with milliseconds).
fn date_key_string(spec: &Map<String, Value>, ms: i64) -> String {
    match spec["date_histogram"].get("format").and_then(Value::as_str) {
        Some("epoch_millis") => ms.to_string(),
        Some("epoch_second") => (ms.div_euclid(1000)).to_string(),
        // In the request's time zone, as Elasticsearch writes it (`+01:00`, `Z`).
        _ => match spec["date_histogram"]
            .get("time_zone")
            .and_then(Value::as_str)
        {
            Some(tz) => crate::zone::parse(tz)
                .ok()
                .and_then(|z| crate::zone::format(&z, ms))
                .unwrap_or_default(),
            None => crate::dates::rfc3339_millis(ms).unwrap_or_default(),
        },
    }
}

/// A `range` answer as Elasticsearch gives it: only the ranges asked for (tantivy adds the
/// gaps between them), keyed `from-to` with numbers as doubles (`*-10.0`) unless named.
fn shape_ranges(range: &Value, out: &mut Value) {
    let Some(asked) = range.get("ranges").and_then(Value::as_array) else {
        return;
    };
    let bound = |v: Option<&Value>| v.and_then(Value::as_f64);
    let wanted: Vec<(Option<f64>, Option<f64>, Option<&str>)> = asked
        .iter()
        .map(|r| {
            (
                bound(r.get("from")),
                bound(r.get("to")),
                r.get("key").and_then(Value::as_str),
            )
        })
        .collect();
    let double = |v: Option<f64>| match v {
        None => "*".to_string(),
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{f:.1}"),
        Some(f) => f.to_string(),
    };
    let keep = |b: &Value| {
        let (from, to) = (bound(b.get("from")), bound(b.get("to")));
        wanted
            .iter()
            .find(|(f, t, _)| *f == from && *t == to)
            .map(|(f, t, key)| {
                key.map(str::to_string)
                    .unwrap_or_else(|| format!("{}-{}", double(*f), double(*t)))
            })
    };
    match out.get_mut("buckets") {
        Some(Value::Array(list)) => {
            list.retain_mut(|b| match keep(b) {
                Some(k) => {
                    b["key"] = Value::from(k);
                    true
                }
                None => false,
            });
        }
        Some(Value::Object(map)) => {
            let kept: Map<String, Value> = std::mem::take(map)
                .into_iter()
                .filter_map(|(_, mut b)| {
                    let k = keep(&b)?;
                    b["key"] = Value::from(k.clone());
                    Some((k, b))
                })
                .collect();
            *map = kept;
        }
        _ => {}
    }
}

/// A doc value as one value: tantivy lists a field's values, top_metrics names one.
fn first_value(v: &Value) -> Value {
    match v {
        Value::Array(list) => list.first().cloned().unwrap_or(Value::Null),
        other => other.clone(),
    }
}

fn parse_aggs(v: Map<String, Value>) -> Result<Aggregations, SearchError> {
    serde_json::from_value(Value::Object(v))
        .map_err(|e| SearchError::parsing(format!("[aggs] {e}")))
}

fn agg_context() -> AggContextParams {
    AggContextParams::new(
        AggregationLimitsGuard::new(Some(200_000_000), Some(65_000)),
        tantivy::tokenizer::TokenizerManager::default(),
    )
}

/// What one partition contributed.
struct PartResult {
    total: usize,
    hits: Vec<Candidate>,
    aggs: Option<IntermediateAggregationResults>,
}

/// Aggregation errors are the request's fault (a bad field or interval), answered as 400.
fn aggregation_error(e: tantivy::TantivyError) -> SearchError {
    match e {
        tantivy::TantivyError::AggregationError(a) => SearchError::illegal(format!("[aggs] {a}")),
        tantivy::TantivyError::InvalidArgument(a) => SearchError::illegal(format!("[aggs] {a}")),
        other => other.into(),
    }
}

/// Targets that are partitions of one topic index, searched in one pass.
struct Group {
    index: Arc<TopicIndex>,
    /// Each partition's place in the targets.
    members: std::collections::BTreeMap<i32, usize>,
    /// The members searched: those the query's time range does not rule out.
    searched: std::collections::BTreeMap<i32, usize>,
}

/// The targets grouped by the topic index they are part of, in order of first appearance.
fn groups(targets: &[Target]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        match groups
            .iter_mut()
            .find(|g| Arc::ptr_eq(&g.index, &t.index.index))
        {
            Some(g) => {
                g.members.insert(t.index.partition, i);
            }
            None => groups.push(Group {
                index: t.index.index.clone(),
                members: std::collections::BTreeMap::from([(t.index.partition, i)]),
                searched: std::collections::BTreeMap::new(),
            }),
        }
    }
    for g in &mut groups {
        g.searched = g.members.clone();
    }
    groups
}

/// The partitions `searcher`'s documents belong to.
fn partitions_in(searcher: &Searcher, field: tantivy::schema::Field) -> Option<Vec<i64>> {
    let mut found = std::collections::BTreeSet::new();
    for segment in searcher.segment_readers() {
        let inverted = segment.inverted_index(field).ok()?;
        let mut terms = inverted.terms().stream().ok()?;
        while terms.advance() {
            let bytes: [u8; 8] = terms.key().try_into().ok()?;
            found.insert(tantivy::u64_to_i64(u64::from_be_bytes(bytes)));
        }
    }
    Some(found.into_iter().collect())
}

/// `query` limited to the group's partitions, unless the index holds no others. Members
/// left out of the search by time need no filter: the query's time range rules their
/// documents out already.
fn only_members(query: Box<dyn TQuery>, g: &Group, searcher: &Searcher) -> Box<dyn TQuery> {
    let field = g.index.schema.partition;
    let all_members = partitions_in(searcher, field)
        .is_some_and(|held| held.iter().all(|p| g.members.contains_key(&(*p as i32))));
    if all_members {
        return query;
    }
    let terms = g
        .members
        .keys()
        .map(|p| Term::from_field_i64(field, i64::from(*p)));
    Box::new(tantivy::query::BooleanQuery::intersection(vec![
        query,
        Box::new(tantivy::query::TermSetQuery::new(terms)),
    ]))
}

/// Searches the partitions of one topic index (`g`) in one pass over it.
fn search_group(
    g: &Group,
    req: &SearchRequest,
    limits: &Limits,
    now_ms: i64,
    count_only: bool,
) -> Result<PartResult, SearchError> {
    let schema = &g.index.schema;
    let searcher = g.index.searcher();
    let mut query = compile(&req.query, schema, limits, now_ms)?;
    let sort_name = match &req.sort.key {
        SortKey::Score => None,
        SortKey::Field(f) => match sort_field(schema, f)? {
            Some(n) => Some(n),
            None => Some(String::new()),
        },
    };
    // The keys after the primary one: each field's index name, `None` for one this index has
    // no column of (every hit misses it: it orders nothing), or the score.
    let then: Vec<(Option<SortByErasedType>, Order)> = req
        .sort
        .then
        .iter()
        .map(|(k, d)| {
            let order = match d {
                Direction::Asc => Order::Asc,
                Direction::Desc => Order::Desc,
            };
            Ok(match k {
                SortKey::Score => (Some(SortByErasedType::for_score()), order),
                SortKey::Field(f) => (
                    sort_field(schema, f)?.map(SortByErasedType::for_field),
                    order,
                ),
            })
        })
        .collect::<Result<_, SearchError>>()?;
    if let (Some(_), SortKey::Field(_)) = (&req.search_after, &req.sort.key) {
        if let Some(after) = after_query(req, &g.index.topic)? {
            let narrowed = compile(&after, schema, limits, now_ms)?;
            query = Box::new(tantivy::query::BooleanQuery::intersection(vec![
                query, narrowed,
            ]));
        }
    }
    let query = only_members(query, g, &searcher);
    let window = if count_only { 0 } else { req.from + req.size };
    let by_score_desc =
        sort_name.is_none() && req.sort.direction == Direction::Desc && then.is_empty();
    let aggregations = match (&req.aggs, count_only) {
        (Some(a), false) => {
            let mut mapped = map_aggs(a, schema)?;
            widen_segment_cut(&mut mapped);
            let mut aggs = parse_aggs(mapped)?;
            crate::filter_agg::bind(&mut aggs, schema, limits, now_ms)?;
            Some(DistributedAggregationCollector::from_aggs(
                aggs,
                agg_context(),
            ))
        }
        _ => None,
    };
    let column_of = |name: &str, address: DocAddress| {
        searcher
            .segment_reader(address.segment_ord)
            .fast_fields()
            .i64(name)
            .ok()
            .and_then(|c| c.first(address.doc_id))
            .unwrap_or(-1)
    };
    // A hit's partition, and its place in the targets.
    let member = |address: DocAddress| {
        let p = column_of("partition", address) as i32;
        g.searched.get(&p).map(|ti| (p, *ti))
    };
    let by_score = |score: f32, address: DocAddress| {
        member(address).map(|(partition, target)| Candidate {
            key: OwnedValue::F64(f64::from(score)),
            then: Vec::new(),
            partition,
            offset: column_of("offset", address),
            score: Some(score),
            target,
        })
    };
    let mut hits = Vec::new();
    let mut aggs = None;
    let total;
    if count_only || (by_score_desc && aggregations.is_none()) {
        // Counting alone takes tantivy's fast path (often no scan at all), and plain top-k by
        // score lets it skip blocks that cannot reach the top (block-max WAND); a tie-breaking
        // order would score every match. Ties keep tantivy's order (the doc address), as
        // Elasticsearch keeps its internal doc order; offsets are read after.
        total = searcher.search(&*query, &Count)?;
        if window > 0 && total > 0 {
            let top = TopDocs::with_limit(window).order_by_score();
            for (score, address) in searcher.search(&*query, &top)? {
                hits.extend(by_score(score, address));
            }
        }
    } else {
        // Everything else visits every match anyway: the count, the top hits and the
        // aggregations are collected in that one pass.
        let mut pass = MultiCollector::new();
        let counted = pass.add_collector(Count);
        let aggregated = aggregations.map(|c| pass.add_collector(c));
        let mut fruits;
        if by_score_desc {
            let top = (window > 0)
                .then(|| pass.add_collector(TopDocs::with_limit(window).order_by_score()));
            fruits = searcher.search(&*query, &pass).map_err(aggregation_error)?;
            for (score, address) in top.map(|h| h.extract(&mut fruits)).unwrap_or_default() {
                hits.extend(by_score(score, address));
            }
        } else {
            let order = match req.sort.direction {
                Direction::Asc => Order::Asc,
                Direction::Desc => Order::Desc,
            };
            let primary = match &sort_name {
                None => SortByErasedType::for_score(),
                // An unmapped sort field: every hit has no value; order by offset alone.
                Some(n) if n.is_empty() => SortByErasedType::for_field("offset"),
                Some(n) => SortByErasedType::for_field(n),
            };
            let top = if window > 0 {
                Some(add_sorted_top(&mut pass, window, (primary, order), &then)?)
            } else {
                None
            };
            fruits = searcher.search(&*query, &pass).map_err(aggregation_error)?;
            let found = top.map(|extract| extract(&mut fruits)).unwrap_or_default();
            for (mut keys, offset, address) in found {
                let Some((partition, target)) = member(address) else {
                    continue;
                };
                // Keys of columns this index lacks were left out of the sort: put back as
                // missing, in place.
                let mut mapped = keys.drain(..).collect::<std::collections::VecDeque<_>>();
                let key = mapped.pop_front().unwrap_or(OwnedValue::Null);
                let then_values = then
                    .iter()
                    .map(|(s, _)| match s {
                        Some(_) => mapped.pop_front().unwrap_or(OwnedValue::Null),
                        None => OwnedValue::Null,
                    })
                    .collect();
                let score = match (&sort_name, &key) {
                    (None, OwnedValue::F64(f)) => Some(*f as f32),
                    _ => None,
                };
                hits.push(Candidate {
                    key,
                    then: then_values,
                    partition,
                    offset: offset.unwrap_or(-1),
                    score,
                    target,
                });
            }
        }
        total = counted.extract(&mut fruits);
        aggs = aggregated.map(|h| h.extract(&mut fruits));
    }
    Ok(PartResult { total, hits, aggs })
}

/// The sort keys and offset of one hit, from [`add_sorted_top`]'s collector.
type SortedHit = (Vec<OwnedValue>, Option<i64>);

/// Takes the fruit of [`add_sorted_top`]'s collector out of a search's fruits: each hit's
/// sort keys, offset and address.
type SortedTop = Box<
    dyn FnOnce(
        &mut tantivy::collector::MultiFruit,
    ) -> Vec<(Vec<OwnedValue>, Option<i64>, DocAddress)>,
>;

/// Adds to `pass` a collector of the top `window` hits by `sorter`, giving back how to take
/// its hits out of the fruits, each flattened by `flatten`.
fn add_sorter<S: SortKeyComputer + Send + 'static>(
    pass: &mut MultiCollector<'_>,
    window: usize,
    sorter: S,
    flatten: fn(S::SortKey) -> SortedHit,
) -> SortedTop {
    let handle = pass.add_collector(TopDocs::with_limit(window).order_by(sorter));
    Box::new(move |fruits| {
        handle
            .extract(fruits)
            .into_iter()
            .map(|(k, address)| {
                let (keys, offset) = flatten(k);
                (keys, offset, address)
            })
            .collect()
    })
}

/// Adds to `pass` the top `window` hits by `primary`, then by each key of `then` that this
/// index has a column for, then by offset in the primary key's direction. Tantivy's sort keys
/// are tuples, so each number of keys is its own type (up to [`MAX_SORT_KEYS`]).
fn add_sorted_top(
    pass: &mut MultiCollector<'_>,
    window: usize,
    primary: (SortByErasedType, Order),
    then: &[(Option<SortByErasedType>, Order)],
) -> Result<SortedTop, SearchError> {
    let offset = (SortByStaticFastValue::<i64>::for_field("offset"), primary.1);
    let mut keys: Vec<(SortByErasedType, Order)> = then
        .iter()
        .filter_map(|(s, o)| s.clone().map(|s| (s, *o)))
        .collect();
    keys.insert(0, primary);
    let mut keys = keys.into_iter();
    let (a, b, c, d) = (keys.next(), keys.next(), keys.next(), keys.next());
    if keys.next().is_some() {
        return Err(SearchError::illegal(format!(
            "[sort] at most {MAX_SORT_KEYS} keys are supported"
        )));
    }
    Ok(match (a, b, c, d) {
        (Some(a), None, _, _) => add_sorter(pass, window, (a, offset), |(a, o)| (vec![a], o)),
        (Some(a), Some(b), None, _) => add_sorter(pass, window, (a, (b, offset)), |(a, (b, o))| {
            (vec![a, b], o)
        }),
        (Some(a), Some(b), Some(c), None) => {
            add_sorter(pass, window, (a, (b, (c, offset))), |(a, (b, (c, o)))| {
                (vec![a, b, c], o)
            })
        }
        (Some(a), Some(b), Some(c), Some(d)) => add_sorter(
            pass,
            window,
            (a, (b, (c, (d, offset)))),
            |(a, (b, (c, (d, o))))| (vec![a, b, c, d], o),
        ),
        _ => return Err(SearchError::illegal("[sort] needs a key to sort on")),
    })
}

/// The record at `offset` of target `ti`: from the index when it stores records, else from the
/// log. The last batch decoded per partition is kept in `cache`, as neighbouring hits often
/// share it.
fn fetch_record(
    t: &Target,
    ti: usize,
    searcher: &Searcher,
    offset: i64,
    cache: &mut std::collections::HashMap<usize, Vec<LogRecord>>,
) -> Option<LogRecord> {
    if let Some(f) = t.index.schema.stored_record {
        let term = |field, v: i64| -> Box<dyn TQuery> {
            Box::new(TermQuery::new(
                Term::from_field_i64(field, v),
                IndexRecordOption::Basic,
            ))
        };
        let exact = tantivy::query::BooleanQuery::intersection(vec![
            term(t.index.schema.offset, offset),
            term(t.index.schema.partition, i64::from(t.index.partition)),
        ]);
        let (_, address) = *searcher
            .search(&exact, &TopDocs::with_limit(1).order_by_score())
            .ok()?
            .first()?;
        let doc: TantivyDocument = searcher.doc(address).ok()?;
        let bytes = doc.get_first(f).and_then(|v| v.as_bytes())?.to_vec();
        return decode_stored(offset, &bytes).ok();
    }
    let find = |records: &Vec<LogRecord>| {
        records
            .binary_search_by_key(&offset, |r| r.offset)
            .ok()
            .map(|i| records[i].clone())
    };
    if let Some(r) = cache.get(&ti).and_then(find) {
        return Some(r);
    }
    let read = t.partition.read(offset, 64 * 1024, true).ok()?;
    let records = decode_batches(&read.records, offset).records;
    let found = find(&records);
    cache.insert(ti, records);
    found
}

fn highlight(
    t: &Target,
    searcher: &Searcher,
    query: &dyn TQuery,
    r: &LogRecord,
    h: &crate::request::Highlight,
) -> Option<Value> {
    let schema = &t.index.schema;
    let mut out = Map::new();
    let parsed = r.value.as_ref().and_then(|v| t.index.parse_value(v));
    let mut words: Option<QueryWords> = None;
    for name in &h.fields {
        // Fields the documents brought are highlighted with the query's words on them; `*`
        // (what Grafana asks) names every field of the document, each highlighted apart.
        let pattern = name.contains('*');
        let dynamic = matches!(
            schema.resolve(name).map(|r| r.role),
            Some(FieldRole::Dynamic(_))
        );
        if let (true, Some(doc)) = (pattern || dynamic, &parsed) {
            let words = words.get_or_insert_with(|| QueryWords::of(schema, query));
            let analyzer = t.index.tantivy().tokenizer_for_field(schema.doc).ok();
            for (path, text) in string_leaves(doc) {
                let selected = if pattern {
                    crate::request::path_matches(name, &path)
                } else {
                    path == *name || name.strip_suffix(".keyword") == Some(path.as_str())
                };
                if !selected || out.contains_key(&path) {
                    continue;
                }
                let fragments: Vec<Value> = text
                    .iter()
                    .filter_map(|s| words.mark(analyzer.clone(), &path, s, h))
                    .map(Value::from)
                    .collect();
                if !fragments.is_empty() {
                    out.insert(path, Value::Array(fragments));
                }
            }
            continue;
        }
        let Some(res) = schema.resolve(name) else {
            continue;
        };
        let texts: Vec<String> = match res.role {
            FieldRole::Value => r.value.as_ref().map(|v| vec![lossy(v)]).unwrap_or_default(),
            FieldRole::Key => r.key.as_ref().map(|v| vec![lossy(v)]).unwrap_or_default(),
            FieldRole::Json(_) => {
                let path = schema
                    .json
                    .iter()
                    .find(|(_, _, f, _)| *f == res.field)
                    .map(|(p, ..)| p.clone());
                match (&parsed, path) {
                    (Some(doc), Some(p)) => values_at(doc, &p)
                        .into_iter()
                        .map(|v| {
                            v.as_str()
                                .map(str::to_string)
                                .unwrap_or_else(|| v.to_string())
                        })
                        .collect(),
                    _ => Vec::new(),
                }
            }
            _ => Vec::new(),
        };
        let Ok(mut generator) = SnippetGenerator::create(searcher, query, res.field) else {
            continue;
        };
        generator.set_max_num_chars(h.fragment_size);
        let fragments: Vec<Value> = texts
            .iter()
            .filter_map(|text| {
                let mut s = generator.snippet(text);
                if s.highlighted().is_empty() {
                    return None;
                }
                s.set_snippet_prefix_postfix(&h.pre_tag, &h.post_tag);
                Some(Value::from(s.to_html()))
            })
            .collect();
        if !fragments.is_empty() {
            // `*` on a value that is not a JSON document: its `_source` field.
            let key = if pattern {
                "value".to_string()
            } else {
                name.clone()
            };
            out.insert(key, Value::Array(fragments));
        }
    }
    (!out.is_empty()).then_some(Value::Object(out))
}

/// Every string (or string list) leaf of a document, by dotted path.
fn string_leaves(doc: &Value) -> Vec<(String, Vec<String>)> {
    fn walk(v: &Value, path: &mut String, out: &mut Vec<(String, Vec<String>)>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    let len = path.len();
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(k);
                    walk(v, path, out);
                    path.truncate(len);
                }
            }
            Value::String(s) => out.push((path.clone(), vec![s.clone()])),
            Value::Array(items) => {
                let strings: Vec<String> = items
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect();
                if !strings.is_empty() {
                    out.push((path.clone(), strings));
                }
                for item in items.iter().filter(|i| i.is_object()) {
                    walk(item, path, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(doc, &mut String::new(), &mut out);
    out
}

/// The words a query looks for, per dynamic field path (and on the whole value, which every
/// field of the document is part of): what a hit's fields are highlighted with.
struct QueryWords {
    by_path: std::collections::HashMap<String, std::collections::HashSet<String>>,
    anywhere: std::collections::HashSet<String>,
}

impl QueryWords {
    fn of(schema: &IndexSchema, query: &dyn TQuery) -> Self {
        let mut words = Self {
            by_path: Default::default(),
            anywhere: Default::default(),
        };
        query.query_terms(&mut |term, _| {
            if term.field() == schema.value {
                if let Some(s) = term.value().as_str() {
                    words.anywhere.insert(s.to_string());
                }
                return;
            }
            if term.field() != schema.doc && term.field() != schema.doc_kw {
                return;
            }
            // A JSON term: the path (segments split by 0x01), 0x00, then the typed value.
            let raw = term.serialized_value_bytes();
            let Some(end) = raw.iter().position(|b| *b == 0) else {
                return;
            };
            let path = String::from_utf8_lossy(&raw[..end]).replace('\u{1}', ".");
            if let Some(s) = tantivy::schema::ValueBytes::wrap(&raw[end + 1..]).as_str() {
                words.by_path.entry(path).or_default().insert(s.to_string());
            }
        });
        words
    }

    /// `text` of field `path` with the words it holds wrapped in the tags (tokenized as the
    /// documents' text is, so stems and case match as they did in the search); `None` when
    /// it holds none. Long texts are cut to a fragment around the first word.
    fn mark(
        &self,
        analyzer: Option<tantivy::tokenizer::TextAnalyzer>,
        path: &str,
        text: &str,
        h: &crate::request::Highlight,
    ) -> Option<String> {
        let on_path = self.by_path.get(path);
        let wanted = |w: &str| self.anywhere.contains(w) || on_path.is_some_and(|p| p.contains(w));
        // An exact (keyword) term matches the whole text.
        if wanted(text) {
            return Some(format!("{}{text}{}", h.pre_tag, h.post_tag));
        }
        let mut analyzer = analyzer?;
        let mut marks: Vec<(usize, usize)> = Vec::new();
        let mut stream = analyzer.token_stream(text);
        while stream.advance() {
            let t = stream.token();
            if wanted(&t.text) {
                marks.push((t.offset_from, t.offset_to));
            }
        }
        if marks.is_empty() {
            return None;
        }
        // The fragment: from shortly before the first word, at most `fragment_size` bytes,
        // on character boundaries.
        let lead = h.fragment_size / 4;
        let mut start = marks[0].0.saturating_sub(lead);
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = start.saturating_add(h.fragment_size).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        let mut out = String::with_capacity(end - start + 32);
        let mut at = start;
        for (from, to) in marks {
            if from < at || to > end {
                continue;
            }
            out.push_str(&text[at..from]);
            out.push_str(&h.pre_tag);
            out.push_str(&text[from..to]);
            out.push_str(&h.post_tag);
            at = to;
        }
        out.push_str(&text[at..end]);
        Some(out)
    }
}

/// One hit as a node hands it to the node that merges results: rendered, with what it sorts by.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartialHit {
    /// The primary sort value (the score when sorting by score); null when missing.
    pub key: Value,
    /// The values of the sort's keys after the primary one (null when missing).
    #[serde(default)]
    pub then: Vec<Value>,
    /// Topic, the last tie-breaker between searches of several topics.
    pub topic: String,
    /// Partition, the first tie-breaker.
    pub partition: i32,
    /// Offset, the second tie-breaker.
    pub offset: i64,
    /// Score, when sorting by score.
    pub score: Option<f32>,
    /// The hit in Elasticsearch's shape: `_index`, `_id`, `_score` and `sort` once searched,
    /// the record's parts (`_source`, `_kafka`, `highlight`, `fields`) once [`render`]ed.
    pub hit: Value,
    /// Which answer the hit came in (the merging node's bookkeeping: who renders it).
    #[serde(skip)]
    pub answer: usize,
}

/// What some partitions answer to a search before it is merged with the rest: the top
/// `from + size` hits, the total, and aggregations in their mergeable intermediate form.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Partial {
    /// Hits matched.
    pub total: usize,
    /// Partitions searched.
    pub shards: usize,
    /// The best `from + size` hits, rendered.
    pub hits: Vec<PartialHit>,
    /// Tantivy's intermediate aggregation results, MessagePack-encoded then base64 (they do
    /// not survive JSON).
    pub aggs: Option<String>,
    /// The aggregation request with field names mapped to the index's, to finish `aggs` with.
    pub aggs_request: Option<Value>,
    /// Partitions not searched: none of their records lies in the query's time range.
    #[serde(default)]
    pub skipped: usize,
    /// The partitions (topic, partition) these hits and aggregations are of: where the
    /// records of top_hits hits are read.
    #[serde(default)]
    pub partitions: Vec<(String, i32)>,
}

fn encode_aggs(aggs: &IntermediateAggregationResults) -> Result<String, SearchError> {
    use base64::Engine as _;
    let bytes = rmp_serde::to_vec_named(aggs).map_err(|e| SearchError::Index {
        reason: format!("encoding aggregations: {e}"),
    })?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

fn decode_aggs(text: &str) -> Result<IntermediateAggregationResults, SearchError> {
    use base64::Engine as _;
    let bad = |e: String| SearchError::Index {
        reason: format!("decoding a node's aggregations: {e}"),
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| bad(e.to_string()))?;
    rmp_serde::from_slice(&bytes).map_err(|e| bad(e.to_string()))
}

/// Orders sort values as Elasticsearch does: numbers by value, strings lexically, missing last.
fn compare_json(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Null, Value::Null) => Ordering::Equal,
        (Value::Null, _) => Ordering::Greater,
        (_, Value::Null) => Ordering::Less,
        (Value::String(x), Value::String(y)) => x.cmp(y),
        _ => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
            _ => Ordering::Equal,
        },
    }
}

/// Hit order for `req`: the primary sort value (missing last in either direction), then
/// partition, offset and topic.
fn hit_order(req: &SearchRequest, x: &PartialHit, y: &PartialHit) -> Ordering {
    // Missing values last in either direction.
    let by = |a: &Value, b: &Value, d: Direction| match (a, b) {
        (Value::Null, _) | (_, Value::Null) => compare_json(a, b),
        _ if d == Direction::Desc => compare_json(b, a),
        _ => compare_json(a, b),
    };
    let desc = req.sort.direction == Direction::Desc;
    let mut order = by(&x.key, &y.key, req.sort.direction);
    for (i, (_, d)) in req.sort.then.iter().enumerate() {
        if order != Ordering::Equal {
            break;
        }
        let null = Value::Null;
        order = by(
            x.then.get(i).unwrap_or(&null),
            y.then.get(i).unwrap_or(&null),
            *d,
        );
    }
    let tie = (x.partition, x.offset, &x.topic).cmp(&(y.partition, y.offset, &y.topic));
    order.then(if desc { tie.reverse() } else { tie })
}

/// Searches `targets` (partitions of this node) and keeps the best `from + size` hits, not
/// rendered yet, for [`merge_page`] to combine with other nodes' partials; only the final
/// page's records are then read, by [`render`] (as Elasticsearch's query and fetch phases: a
/// deep page reads `size` records, not `from + size` per node).
pub fn partial(
    targets: &[Target],
    req: &SearchRequest,
    limits: &Limits,
    now_ms: i64,
    count_only: bool,
) -> Result<Partial, SearchError> {
    // Partitions whose records all lie outside the query's time range are not searched
    // (Elasticsearch's skipped shards); one always is, so aggregations keep their shape.
    let mut groups = groups(targets);
    let mut skipped = 0;
    let mut first = None;
    for g in &mut groups {
        let Some(range) = time_bounds(&req.query, &g.index.schema.time_field, now_ms) else {
            continue;
        };
        let index = g.index.clone();
        let before = g.members.len();
        first = first.or_else(|| g.members.iter().next().map(|(p, t)| (*p, *t)));
        g.searched
            .retain(|p, _| index.span(*p).is_some_and(|span| overlaps(span, range)));
        skipped += before - g.searched.len();
    }
    if groups.iter().all(|g| g.searched.is_empty()) {
        if let (Some(g), Some((p, t))) = (groups.first_mut(), first) {
            g.searched.insert(p, t);
            skipped -= 1;
        }
    }
    let parts = groups
        .iter()
        .filter(|g| !g.searched.is_empty())
        .map(|g| search_group(g, req, limits, now_ms, count_only))
        .collect::<Result<Vec<_>, _>>()?;
    let total: usize = parts.iter().map(|p| p.total).sum();
    if count_only {
        return Ok(Partial {
            total,
            shards: targets.len(),
            skipped,
            ..Partial::default()
        });
    }
    let field_sort = matches!(req.sort.key, SortKey::Field(_));
    let mut all: Vec<(usize, usize, PartialHit)> = Vec::new();
    for (pi, p) in parts.iter().enumerate() {
        for (ci, c) in p.hits.iter().enumerate() {
            let key = owned_to_json(&c.key);
            all.push((
                pi,
                ci,
                PartialHit {
                    key,
                    then: c.then.iter().map(owned_to_json).collect(),
                    topic: targets[c.target].index.topic.clone(),
                    partition: c.partition,
                    offset: c.offset,
                    score: c.score,
                    hit: Value::Null,
                    answer: 0,
                },
            ));
        }
    }
    all.sort_by(|a, b| hit_order(req, &a.2, &b.2));
    all.truncate(req.from + req.size);
    let mut hits = Vec::with_capacity(all.len());
    for (pi, ci, mut h) in all {
        let c = &parts[pi].hits[ci];
        let mut hit = Map::new();
        hit.insert("_index".into(), Value::from(h.topic.as_str()));
        hit.insert(
            "_id".into(),
            Value::from(format!("{}-{}", c.partition, c.offset)),
        );
        hit.insert(
            "_score".into(),
            c.score
                .map(|s| Value::from(s as f64))
                .unwrap_or(Value::Null),
        );
        if field_sort {
            let mut sort = vec![h.key.clone()];
            sort.extend(h.then.iter().cloned());
            sort.extend([json!(c.partition), json!(c.offset), json!(h.topic)]);
            hit.insert("sort".into(), Value::Array(sort));
        }
        h.hit = Value::Object(hit);
        hits.push(h);
    }
    let (aggs, aggs_request) = match (&req.aggs, targets.first()) {
        (Some(a), Some(t)) => {
            let mut merged: Option<IntermediateAggregationResults> = None;
            for p in parts {
                if let Some(r) = p.aggs {
                    match &mut merged {
                        None => merged = Some(r),
                        Some(m) => m.merge_fruits(r)?,
                    }
                }
            }
            let mapped = map_aggs(a, &t.index.schema)?;
            if let Some(m) = &mut merged {
                // This node's partitions were merged whole, as one Elasticsearch shard
                // counts over all its segments; only what leaves the node is cut, at each
                // terms' shard_size. Calendar-folded histograms are left whole: their
                // buckets are merged into larger ones only after every node answered.
                if !has_calendar_fold(&mapped) {
                    m.prune_intermediate_results(
                        &parse_aggs(mapped.clone())?,
                        PruneMode::Intermediate,
                    )
                    .map_err(aggregation_error)?;
                }
            }
            let encoded = merged.as_ref().map(encode_aggs).transpose()?;
            (encoded, Some(Value::Object(mapped)))
        }
        _ => (None, None),
    };
    Ok(Partial {
        total,
        shards: targets.len(),
        hits,
        aggs,
        aggs_request,
        skipped,
        partitions: targets
            .iter()
            .map(|t| (t.index.topic.clone(), t.index.partition))
            .collect(),
    })
}

/// The time range (epoch ms, inclusive) every hit of `query` must lie in, from the ranges on
/// the documents' time field among its required clauses; `None` when it has none.
fn time_bounds(query: &Query, time_field: &str, now_ms: i64) -> Option<(i64, i64)> {
    let mut range: Option<(i64, i64)> = None;
    let mut narrow = |lo: i64, hi: i64| {
        range = Some(match range {
            Some((a, b)) => (a.max(lo), b.min(hi)),
            None => (lo, hi),
        });
    };
    fn walk(q: &Query, field: &str, now_ms: i64, narrow: &mut dyn FnMut(i64, i64)) {
        match q {
            Query::Range {
                field: f,
                lower,
                upper,
            } if f == field => {
                let at = |b: &Option<Bound>| {
                    b.as_ref()
                        .and_then(|b| crate::dates::parse_date(&b.value, now_ms))
                };
                // Exclusive bounds are taken as inclusive: a partition is kept, never lost.
                narrow(at(lower).unwrap_or(i64::MIN), at(upper).unwrap_or(i64::MAX));
            }
            Query::Bool { must, filter, .. } => {
                for c in must.iter().chain(filter) {
                    walk(c, field, now_ms, narrow);
                }
            }
            Query::ConstantScore { filter, .. } => walk(filter, field, now_ms, narrow),
            _ => {}
        }
    }
    walk(query, time_field, now_ms, &mut narrow);
    range
}

fn overlaps((a, b): (i64, i64), (lo, hi): (i64, i64)) -> bool {
    a <= hi && b >= lo
}

/// Reads the records of `hits` that belong to `targets` and adds their parts to each hit
/// (`_source` and `_kafka`, `highlight`, `fields`, as `req` asks); answers how many records
/// were read. A record gone meanwhile (retention) leaves its hit without them.
pub fn render(
    targets: &[Target],
    req: &SearchRequest,
    limits: &Limits,
    now_ms: i64,
    hits: &mut [PartialHit],
) -> Result<usize, SearchError> {
    // Without _source, highlights or fields the record itself is not needed.
    if req.source.disabled && req.highlight.is_none() && req.fields.is_empty() {
        return Ok(0);
    }
    let mut cache = std::collections::HashMap::new();
    let mut opened: std::collections::HashMap<usize, (Searcher, Option<Box<dyn TQuery>>)> =
        std::collections::HashMap::new();
    let mut read = 0;
    for h in hits.iter_mut() {
        let Some(ti) = targets
            .iter()
            .position(|t| t.index.topic == h.topic && t.index.partition == h.partition)
        else {
            continue;
        };
        let t = &targets[ti];
        let (searcher, query) = match opened.entry(ti) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let query = match &req.highlight {
                    Some(_) => Some(compile(&req.query, &t.index.schema, limits, now_ms)?),
                    None => None,
                };
                v.insert((t.index.searcher(), query))
            }
        };
        let Some(r) = fetch_record(t, ti, searcher, h.offset, &mut cache) else {
            continue;
        };
        read += 1;
        let Value::Object(hit) = &mut h.hit else {
            continue;
        };
        let src = t.index.source(&r);
        if let Some(s) = filter_source(src, &req.source) {
            hit.insert("_source".into(), s);
            hit.insert("_kafka".into(), kafka_meta(&r, &t.index.topic, h.partition));
        }
        if let (Some(h), Some(q)) = (&req.highlight, query.as_deref()) {
            if let Some(hl) = highlight(t, searcher, q, &r, h) {
                hit.insert("highlight".into(), hl);
            }
        }
        if !req.fields.is_empty() {
            let values = field_values(&r, &t.index, &req.fields);
            hit.insert("fields".into(), values);
        }
    }
    Ok(read)
}

/// Partials merged: the total, the final page's hits (not rendered yet when the partials were
/// not) and the finished aggregations.
pub struct Merged {
    /// Hits matched.
    pub total: usize,
    /// The hits of the page asked for, in order, then the hits of top_hits aggregations (so
    /// that one fetch phase reads all their records).
    pub page: Vec<PartialHit>,
    /// How many of `page` are the page's own hits.
    hits_on_page: usize,
    /// Where in `aggregations` (a JSON pointer) each top_hits hit of `page` goes.
    agg_hits: Vec<String>,
    aggregations: Option<Value>,
    max_score: Option<f32>,
}

/// The answer in Elasticsearch's shape (without `took` and `_shards`) of merged partials.
pub fn answer(merged: Merged, req: &SearchRequest) -> Value {
    let field_sort = matches!(req.sort.key, SortKey::Field(_));
    let mut page = merged.page;
    let agg_hits = page.split_off(merged.hits_on_page.min(page.len()));
    let mut aggregations = merged.aggregations;
    if let Some(a) = &mut aggregations {
        for (at, h) in merged.agg_hits.iter().zip(agg_hits) {
            let mut hit = h.hit;
            if let Some(m) = hit.as_object_mut() {
                // The search's highlight and fields are its own hits', not top_hits'.
                m.remove("highlight");
                m.remove("fields");
            }
            if let Some(slot) = a.pointer_mut(at) {
                *slot = hit;
            }
        }
    }
    let hits: Vec<Value> = page.into_iter().map(|h| h.hit).collect();
    let mut body = json!({
        "timed_out": false,
        "hits": {
            "total": {"value": merged.total, "relation": "eq"},
            "max_score": if field_sort { Value::Null } else { merged.max_score.map(|s| Value::from(s as f64)).unwrap_or(Value::Null) },
            "hits": hits,
        },
    });
    if let Some(a) = aggregations {
        body["aggregations"] = a;
    }
    body
}

/// The top_hits hits in shaped aggregations `a`: where each is (a JSON pointer), and its
/// partition and offset.
fn top_hits_marks(a: &Value) -> Vec<(String, i32, i64)> {
    fn walk(v: &Value, at: &mut String, out: &mut Vec<(String, i32, i64)>) {
        match v {
            Value::Object(m) => {
                if let Some(mark) = m.get(TOP_HIT_AT) {
                    if let (Some(p), Some(o)) = (mark[0].as_i64(), mark[1].as_i64()) {
                        out.push((at.clone(), p as i32, o));
                    }
                    return;
                }
                for (k, v) in m {
                    let len = at.len();
                    at.push('/');
                    at.push_str(&k.replace('~', "~0").replace('/', "~1"));
                    walk(v, at, out);
                    at.truncate(len);
                }
            }
            Value::Array(list) => {
                for (i, v) in list.iter().enumerate() {
                    let len = at.len();
                    at.push_str(&format!("/{i}"));
                    walk(v, at, out);
                    at.truncate(len);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(a, &mut String::new(), &mut out);
    out
}

/// The answer (its index) that searched `partition`, and its topic. Tantivy's top_hits
/// answers fast-field values only, and the index holds no topic: with several topics searched,
/// a partition number may name several, and which one a hit is of is not known.
fn owner_of(
    partitions: &[(usize, String, i32)],
    partition: i32,
) -> Result<(usize, String), SearchError> {
    let mut found = partitions.iter().filter(|(_, _, n)| *n == partition);
    let Some((answer, topic, _)) = found.next() else {
        return Ok((0, String::new()));
    };
    if found.any(|(_, t, _)| t != topic) {
        return Err(SearchError::illegal(
            "[top_hits] is supported over one topic at a time, not over several",
        ));
    }
    Ok((*answer, topic.clone()))
}

/// Combines partials: orders their hits and keeps the page `req` asks for, and finishes the
/// aggregations.
pub fn merge_page(partials: Vec<Partial>, req: &SearchRequest) -> Result<Merged, SearchError> {
    let total: usize = partials.iter().map(|p| p.total).sum();
    let mut all: Vec<PartialHit> = Vec::new();
    let mut merged: Option<IntermediateAggregationResults> = None;
    let mut aggs_request = None;
    // Which answer searched which partitions (for the records of top_hits hits).
    let mut partitions: Vec<(usize, String, i32)> = Vec::new();
    for (i, p) in partials.into_iter().enumerate() {
        partitions.extend(p.partitions.into_iter().map(|(t, n)| (i, t, n)));
        all.extend(p.hits);
        if let Some(a) = &p.aggs {
            let r = decode_aggs(a)?;
            match &mut merged {
                None => merged = Some(r),
                Some(m) => m.merge_fruits(r)?,
            }
        }
        if aggs_request.is_none() {
            aggs_request = p.aggs_request;
        }
    }
    all.sort_by(|a, b| hit_order(req, a, b));
    let page: Vec<PartialHit> = all.into_iter().skip(req.from).take(req.size).collect();
    let max_score = page
        .iter()
        .filter_map(|h| h.score)
        .fold(None, |m: Option<f32>, s| Some(m.map_or(s, |m| m.max(s))));
    let mut aggregations = None;
    if let Some(a) = &req.aggs {
        let mapped_request = aggs_request.clone();
        let request = match aggs_request {
            Some(Value::Object(m)) => parse_aggs(m)?,
            _ => parse_aggs(a.clone())?,
        };
        if let (Some(m), Some(Value::Object(mapped))) = (&mut merged, &mapped_request) {
            fold_calendar(mapped, m)?;
            if asks_percentiles(mapped) {
                tdigest_ranks(mapped, m);
            }
        }
        let mut result = match merged {
            Some(m) => serde_json::to_value(
                m.into_final_result(
                    request,
                    AggregationLimitsGuard::new(Some(200_000_000), Some(65_000)),
                )
                .map_err(|e| SearchError::illegal(format!("[aggs] {e}")))?,
            )
            .map_err(|e| SearchError::Index {
                reason: e.to_string(),
            })?,
            None => json!({}),
        };
        // A top_hits at the top level counts every hit.
        if let Some(m) = result.as_object_mut() {
            m.insert("doc_count".into(), Value::from(total));
        }
        es_shape_aggs(a, mapped_request.as_ref(), &mut result);
        if let Some(m) = result.as_object_mut() {
            m.remove("doc_count");
        }
        aggregations = Some(result);
    }
    let hits_on_page = page.len();
    let mut page = page;
    let mut agg_hits = Vec::new();
    if let Some(a) = &aggregations {
        for (at, partition, offset) in top_hits_marks(a) {
            let (answer, topic) = owner_of(&partitions, partition)?;
            let mut hit = json!({
                "_index": topic,
                "_id": format!("{partition}-{offset}"),
                "_score": Value::Null,
            });
            if let Some(sort) = a.pointer(&at).and_then(|h| h.get("sort")) {
                hit["sort"] = sort.clone();
            }
            page.push(PartialHit {
                key: Value::Null,
                then: Vec::new(),
                topic,
                partition,
                offset,
                score: None,
                hit,
                answer,
            });
            agg_hits.push(at);
        }
    }
    Ok(Merged {
        total,
        page,
        hits_on_page,
        agg_hits,
        aggregations,
        max_score,
    })
}

/// Runs `req` over `targets` of this node alone and answers in Elasticsearch's shape
/// (without `took`).
pub fn run(
    targets: &[Target],
    req: &SearchRequest,
    limits: &Limits,
    now_ms: i64,
) -> Result<Value, SearchError> {
    let p = partial(targets, req, limits, now_ms, false)?;
    let shards = p.shards;
    let mut merged = merge_page(vec![p], req)?;
    render(targets, req, limits, now_ms, &mut merged.page)?;
    let mut body = answer(merged, req);
    body["_shards"] = json!({"total": shards, "successful": shards, "skipped": 0, "failed": 0});
    Ok(body)
}

/// Counts the hits of `req` over `targets`.
pub fn count(
    targets: &[Target],
    req: &SearchRequest,
    limits: &Limits,
    now_ms: i64,
) -> Result<usize, SearchError> {
    groups(targets)
        .iter()
        .map(|g| search_group(g, req, limits, now_ms, true).map(|p| p.total))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Six documents over two partitions: `d0`..`d5`, a minute apart, services `a` and `b`
    /// alternating, `n` counting down, `g` cycling 0, 1, 2.
    fn six_docs(dir: &tempfile::TempDir) -> Vec<Target> {
        let doc = |i: i64| {
            json!({
                "@timestamp": crate::dates::rfc3339_millis(1_700_000_000_000 + i * 60_000),
                "doc_id": format!("d{i}"),
                "service": if i % 2 == 0 { "a" } else { "b" },
                "n": 10 - i,
                "g": i % 3,
            })
            .to_string()
        };
        let docs: Vec<String> = (0..6).map(doc).collect();
        let p0: Vec<&str> = docs.iter().step_by(2).map(String::as_str).collect();
        let p1: Vec<&str> = docs.iter().skip(1).step_by(2).map(String::as_str).collect();
        crate::testing::indexed(dir, "events", &[&p0, &p1])
    }

    fn search(targets: &[Target], body: Value) -> Value {
        let req = crate::request::parse_request(Some(&body)).unwrap();
        run(targets, &req, &Limits::default(), 0).unwrap()
    }

    fn source_ids(hits: &Value) -> Vec<&str> {
        hits["hits"]
            .as_array()
            .map(|l| {
                l.iter()
                    .filter_map(|h| h["_source"]["doc_id"].as_str())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn top_hits_answers_the_sorted_first_hits_with_their_source_alone_and_under_terms() {
        let dir = tempfile::tempdir().unwrap();
        let targets = six_docs(&dir);
        let alone = search(
            &targets,
            json!({"size": 0, "aggs": {"h": {"top_hits": {"size": 3, "sort": [{"@timestamp": "desc"}]}}}}),
        );
        let h = &alone["aggregations"]["h"]["hits"];
        assert_eq!(source_ids(h), ["d5", "d4", "d3"], "{alone}");
        assert_eq!(h["total"]["value"], json!(6));
        let under = search(
            &targets,
            json!({"size": 0, "aggs": {"t": {"terms": {"field": "service.keyword"},
                "aggs": {"h": {"top_hits": {"size": 2, "sort": [{"n": {"order": "asc"}}]}}}}}}),
        );
        let buckets = &under["aggregations"]["t"]["buckets"];
        assert_eq!(buckets[0]["key"], json!("a"), "{under}");
        assert_eq!(source_ids(&buckets[0]["h"]["hits"]), ["d4", "d2"]);
        assert_eq!(source_ids(&buckets[1]["h"]["hits"]), ["d5", "d3"]);
        assert_eq!(buckets[1]["h"]["hits"]["total"]["value"], json!(3));
    }

    #[test]
    fn top_hits_without_a_sort_or_size_answers_three_hits_in_index_order() {
        let dir = tempfile::tempdir().unwrap();
        let targets = six_docs(&dir);
        let v = search(
            &targets,
            json!({"size": 0, "aggs": {"h": {"top_hits": {}}}}),
        );
        // Partition 0 holds d0, d2, d4; ties (no sort) go by partition, then offset.
        assert_eq!(
            source_ids(&v["aggregations"]["h"]["hits"]),
            ["d0", "d2", "d4"],
            "{v}"
        );
    }

    #[test]
    fn composite_without_size_answers_ten_buckets_as_elasticsearch_does() {
        let dir = tempfile::tempdir().unwrap();
        let docs: Vec<String> = (0..12)
            .map(|i| json!({"doc_id": format!("d{i:02}")}).to_string())
            .collect();
        let values: Vec<&str> = docs.iter().map(String::as_str).collect();
        let targets = crate::testing::indexed(&dir, "events", &[&values]);
        let v = search(
            &targets,
            json!({"size": 0, "aggs": {"c": {"composite": {"sources": [{"id": {"terms": {"field": "doc_id.keyword"}}}]}}}}),
        );
        let buckets = v["aggregations"]["c"]["buckets"].as_array().cloned();
        assert_eq!(buckets.map(|b| b.len()), Some(10), "{v}");
    }

    #[test]
    fn composite_date_histogram_takes_every_calendar_interval_elasticsearch_names() {
        let dir = tempfile::tempdir().unwrap();
        let targets = six_docs(&dir);
        // 2023-11-14T22:13:20Z and the next five minutes.
        for (interval, first, count) in [
            ("1m", 1_699_999_980_000_i64, 6),
            ("minute", 1_699_999_980_000, 6),
            ("1h", 1_699_999_200_000, 1),
            ("1d", 1_699_920_000_000, 1),
            ("day", 1_699_920_000_000, 1),
            ("1w", 1_699_833_600_000, 1),
            ("1M", 1_698_796_800_000, 1),
            ("1y", 1_672_531_200_000, 1),
        ] {
            let v = search(
                &targets,
                json!({"size": 0, "aggs": {"c": {"composite": {"sources": [
                    {"d": {"date_histogram": {"field": "@timestamp", "calendar_interval": interval}}}]}}}}),
            );
            let buckets = &v["aggregations"]["c"]["buckets"];
            assert_eq!(buckets[0]["key"]["d"], json!(first), "{interval}: {v}");
            assert_eq!(
                buckets.as_array().map(Vec::len),
                Some(count),
                "{interval}: {v}"
            );
        }
        let fixed = search(
            &targets,
            json!({"size": 0, "aggs": {"c": {"composite": {"sources": [
                {"d": {"date_histogram": {"field": "@timestamp", "fixed_interval": "1d"}}}]}}}}),
        );
        assert_eq!(
            fixed["aggregations"]["c"]["buckets"][0]["key"]["d"],
            json!(1_699_920_000_000_i64)
        );
    }

    #[test]
    fn composite_after_key_and_after_are_plain_values_as_in_elasticsearch() {
        let dir = tempfile::tempdir().unwrap();
        let targets = six_docs(&dir);
        let composite = |after: Option<Value>| {
            let mut c = json!({"size": 1, "sources": [
                {"s": {"terms": {"field": "service.keyword"}}},
                {"d": {"date_histogram": {"field": "@timestamp", "fixed_interval": "1m"}}},
                {"n": {"terms": {"field": "n"}}}]});
            if let Some(a) = after {
                c["after"] = a;
            }
            search(
                &targets,
                json!({"size": 0, "aggs": {"c": {"composite": c}}}),
            )
        };
        let first = composite(None);
        let after_key = first["aggregations"]["c"]["after_key"].clone();
        // d0: service a, 22:13:00 (its minute), n 10.
        assert_eq!(
            after_key,
            json!({"s": "a", "d": 1_699_999_980_000_i64, "n": 10}),
            "{first}"
        );
        let next = composite(Some(after_key));
        let c = &next["aggregations"]["c"];
        assert_eq!(
            c["buckets"][0]["key"],
            json!({"s": "a", "d": 1_700_000_100_000_i64, "n": 8}),
            "{next}"
        );
        assert_eq!(c["after_key"], c["buckets"][0]["key"]);
    }

    #[test]
    fn a_sort_on_several_fields_orders_by_each_in_turn_across_partitions_and_pages() {
        let dir = tempfile::tempdir().unwrap();
        let targets = six_docs(&dir);
        let sort = json!([{"g": "asc"}, {"n": {"order": "asc"}}, {"_doc": "asc"}]);
        let v = search(&targets, json!({"size": 10, "sort": sort}));
        let want = ["d3", "d0", "d4", "d1", "d5", "d2"];
        assert_eq!(source_ids(&v["hits"]), want, "{v}");
        let first = &v["hits"]["hits"][0]["sort"];
        assert_eq!(first[0].as_f64(), Some(0.0), "{first}");
        assert_eq!(first[1].as_f64(), Some(7.0), "{first}");
        // Paging with each page's last sort values visits the same order.
        let mut seen = Vec::new();
        let mut after: Option<Value> = None;
        for _ in 0..4 {
            let mut body = json!({"size": 2, "sort": sort});
            if let Some(a) = after.take() {
                body["search_after"] = a;
            }
            let page = search(&targets, body);
            let hits = page["hits"]["hits"].as_array().cloned().unwrap_or_default();
            seen.extend(source_ids(&page["hits"]).into_iter().map(str::to_string));
            match hits.last() {
                Some(h) => after = Some(h["sort"].clone()),
                None => break,
            }
        }
        assert_eq!(seen, want);
        // Descending on the second key, a missing field (all missing) in between.
        let v = search(
            &targets,
            json!({"sort": [{"service.keyword": "desc"}, {"nothing": "asc"}, {"n": "desc"}]}),
        );
        assert_eq!(
            source_ids(&v["hits"]),
            ["d1", "d3", "d5", "d0", "d2", "d4"],
            "{v}"
        );
    }

    #[test]
    fn nested_dotted_and_arrayed_fields_are_found_by_the_same_path() {
        let dir = tempfile::tempdir().unwrap();
        let docs = [
            json!({"a": {"b": "x y"}, "list": [{"c": 1}, {"c": 2}]}).to_string(),
            json!({"a.b": "x z", "list": [{"c": 3}]}).to_string(),
            json!({"list": [[{"c": 2, "w": "quick brown"}], {"w": "fox"}]}).to_string(),
        ];
        let values: Vec<&str> = docs.iter().map(String::as_str).collect();
        let targets = crate::testing::indexed(&dir, "paths", &[&values]);
        let total =
            |q: Value| search(&targets, json!({"query": q}))["hits"]["total"]["value"].clone();
        assert_eq!(total(json!({"match": {"a.b": "x"}})), 2);
        assert_eq!(total(json!({"term": {"a.b.keyword": "x z"}})), 1);
        assert_eq!(total(json!({"term": {"list.c": 2}})), 2);
        assert_eq!(total(json!({"range": {"list.c": {"gte": 3}}})), 1);
        // Words of one value stay adjacent; values of an array are not one phrase.
        assert_eq!(total(json!({"match_phrase": {"list.w": "quick brown"}})), 1);
        assert_eq!(total(json!({"match_phrase": {"list.w": "brown fox"}})), 0);
    }

    #[test]
    fn one_partition_of_a_topic_index_answers_only_its_own_hits_counts_and_buckets() {
        let dir = tempfile::tempdir().unwrap();
        let targets = six_docs(&dir);
        assert!(
            Arc::ptr_eq(&targets[0].index.index, &targets[1].index.index),
            "both partitions share the topic's index"
        );
        // Partition 1 alone (as a node asked for the partitions it leads): d1, d3, d5.
        let only_1 = &targets[1..];
        let body = json!({"size": 10, "sort": [{"n": "asc"}],
            "aggs": {"by_service": {"terms": {"field": "service.keyword"}}}});
        let v = search(only_1, body.clone());
        assert_eq!(v["hits"]["total"]["value"], 3, "{v}");
        assert_eq!(source_ids(&v["hits"]), ["d5", "d3", "d1"], "{v}");
        let buckets = &v["aggregations"]["by_service"]["buckets"];
        assert_eq!(buckets.as_array().map(Vec::len), Some(1), "{v}");
        assert_eq!(buckets[0]["key"], "b", "{v}");
        assert_eq!(buckets[0]["doc_count"], 3, "{v}");
        for hit in v["hits"]["hits"].as_array().unwrap() {
            assert!(hit["_id"].as_str().unwrap().starts_with("1-"), "{hit}");
        }
        // By score, and a count: the other partition's documents never show.
        let v = search(only_1, json!({"query": {"match": {"service": "a"}}}));
        assert_eq!(v["hits"]["total"]["value"], 0, "{v}");
        let req = crate::request::parse_request(Some(&json!({}))).unwrap();
        assert_eq!(count(only_1, &req, &Limits::default(), 0).unwrap(), 3);
        // Both partitions: every document once.
        let v = search(&targets, body);
        assert_eq!(v["hits"]["total"]["value"], 6, "{v}");
    }

    #[test]
    fn a_time_range_prunes_the_partitions_of_a_topic_index_whose_documents_lie_outside_it() {
        let dir = tempfile::tempdir().unwrap();
        // Partition 0 holds 2023, partition 1 holds 2024, in one index.
        let at = |t: &str| json!({"@timestamp": t}).to_string();
        let (old, new) = (at("2023-06-01T00:00:00Z"), at("2024-06-01T00:00:00Z"));
        let targets = crate::testing::indexed(&dir, "years", &[&[old.as_str()], &[new.as_str()]]);
        let in_2024 = json!({"query": {"range": {"@timestamp": {
            "gte": "2024-01-01T00:00:00Z", "lte": "2024-12-31T23:59:59Z"}}}});
        let req = crate::request::parse_request(Some(&in_2024)).unwrap();
        let p = partial(&targets, &req, &Limits::default(), 0, false).unwrap();
        assert_eq!((p.total, p.skipped, p.shards), (1, 1, 2));
        // A range neither holds: one partition is still searched (the answer's shape).
        let none = json!({"query": {"range": {"@timestamp": {"gte": "2030-01-01"}}}});
        let req = crate::request::parse_request(Some(&none)).unwrap();
        let p = partial(&targets, &req, &Limits::default(), 0, false).unwrap();
        assert_eq!((p.total, p.skipped), (0, 1));
    }

    #[test]
    fn date_histogram_buckets_start_at_local_midnight_in_the_time_zone_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let at = |ms: i64| json!({"@timestamp": crate::dates::rfc3339_millis(ms)}).to_string();
        // 2023-11-12T23:30Z (00:30 in Paris), 2023-11-13T12:00Z, 2023-11-13T23:30Z; and noon
        // UTC on 2023-03-25 and 2023-03-26, the day Paris moves to summer time.
        let docs: Vec<String> = [
            1_699_831_800_000,
            1_699_876_800_000,
            1_699_918_200_000,
            1_679_745_600_000,
            1_679_832_000_000,
        ]
        .into_iter()
        .map(at)
        .collect();
        let values: Vec<&str> = docs.iter().map(String::as_str).collect();
        let targets = crate::testing::indexed(&dir, "events", &[&values[..2], &values[2..]]);
        let november = json!({"range": {"@timestamp": {"gte": 1_699_800_000_000_i64}}});
        let histogram = |h: Value, query: &Value| {
            let v = search(
                &targets,
                json!({"size": 0, "query": query, "aggs": {"h": {"date_histogram": h}}}),
            );
            let buckets = v["aggregations"]["h"]["buckets"].as_array().cloned();
            buckets
                .unwrap_or_default()
                .iter()
                .map(|b| {
                    (
                        b["key"].clone(),
                        b["doc_count"].clone(),
                        b["key_as_string"].clone(),
                    )
                })
                .collect::<Vec<_>>()
        };
        let paris_days = vec![
            (
                json!(1_699_830_000_000_i64),
                json!(2),
                json!("2023-11-13T00:00:00.000+01:00"),
            ),
            (
                json!(1_699_916_400_000_i64),
                json!(1),
                json!("2023-11-14T00:00:00.000+01:00"),
            ),
        ];
        for tz in ["Europe/Paris", "+01:00"] {
            let days = histogram(
                json!({"field": "@timestamp", "calendar_interval": "1d", "time_zone": tz, "min_doc_count": 0}),
                &november,
            );
            assert_eq!(days, paris_days, "{tz}");
        }
        let fixed_days = histogram(
            json!({"field": "@timestamp", "fixed_interval": "1d", "time_zone": "Europe/Paris"}),
            &november,
        );
        assert_eq!(fixed_days, paris_days);
        let months = histogram(
            json!({"field": "@timestamp", "calendar_interval": "1M", "time_zone": "Europe/Paris"}),
            &november,
        );
        assert_eq!(months[0].0, json!(1_698_793_200_000_i64)); // 2023-10-31T23:00Z
        assert_eq!(months[0].1, json!(3));
        let india_hours = histogram(
            json!({"field": "@timestamp", "calendar_interval": "1h", "time_zone": "+05:30", "min_doc_count": 1}),
            &november,
        );
        // Local hours start at half past in UTC: 23:30Z is 05:00 there.
        assert_eq!(india_hours[0].0, json!(1_699_831_800_000_i64));
        assert_eq!(india_hours[0].2, json!("2023-11-13T05:00:00.000+05:30"));
        assert_eq!(india_hours[1].0, json!(1_699_875_000_000_i64)); // 12:00Z in 11:30Z..12:30Z
                                                                    // Across the change to summer time: 2023-03-26 (Paris) starts at 23:00Z the day
                                                                    // before, 2023-03-27 at 22:00Z.
        let march = json!({"range": {"@timestamp": {"lt": 1_690_000_000_000_i64}}});
        let dst = histogram(
            json!({"field": "@timestamp", "calendar_interval": "1d", "time_zone": "Europe/Paris",
                   "extended_bounds": {"min": 1_679_745_600_000_i64, "max": 1_679_900_000_000_i64}}),
            &march,
        );
        let keys: Vec<Value> = dst.iter().map(|b| b.0.clone()).collect();
        assert_eq!(
            keys,
            [
                json!(1_679_698_800_000_i64),
                json!(1_679_785_200_000_i64),
                json!(1_679_868_000_000_i64)
            ],
            "{dst:?}"
        );
        assert_eq!(dst[2].2, json!("2023-03-27T00:00:00.000+02:00"));
    }

    #[test]
    fn extended_stats_over_one_value_has_zero_variance_and_bounds_at_the_value() {
        let mut out = json!({"count": 1, "avg": 5.0, "variance": null, "std_deviation": null,
                             "std_deviation_bounds": null});
        shape_extended_stats(&mut out);
        assert_eq!(out["variance"], json!(0.0));
        assert_eq!(out["std_deviation_sampling"], json!("NaN"));
        assert_eq!(out["std_deviation_bounds"]["upper"], json!(5.0));
        assert_eq!(out["std_deviation_bounds"]["lower_sampling"], json!("NaN"));
        let mut none = json!({"count": 0, "avg": null, "std_deviation_bounds": null});
        shape_extended_stats(&mut none);
        assert!(none["std_deviation_bounds"].is_object());
        assert_eq!(none["std_deviation_bounds"]["upper"], Value::Null);
    }

    #[test]
    fn boolean_terms_are_keyed_1_and_0_with_their_words_as_text() {
        let mut out =
            json!({"buckets": [{"key": "true", "doc_count": 2}, {"key": "false", "doc_count": 1}]});
        shape_boolean_terms(&mut out);
        assert_eq!(out["buckets"][0]["key"], json!(1));
        assert_eq!(out["buckets"][0]["key_as_string"], json!("true"));
        assert_eq!(out["buckets"][1]["key"], json!(0));
    }

    #[test]
    fn a_date_metric_is_answered_in_milliseconds_with_its_text() {
        let mut out = json!({"value": 1_699_833_818_917_000_000.0});
        shape_date_metric(&mut out);
        assert_eq!(out["value"], json!(1_699_833_818_917.0));
        assert_eq!(out["value_as_string"], json!("2023-11-13T00:03:38.917Z"));
    }

    #[test]
    fn terms_with_missing_and_min_doc_count_0_lists_the_missing_bucket_with_empty_sub_aggs() {
        let terms = json!({"field": "level", "missing": "unknown", "min_doc_count": 0});
        let sub = json!({"3": {"date_histogram": {"field": "event_time", "fixed_interval": "1h",
            "min_doc_count": 0, "extended_bounds": {"min": 0, "max": 7_200_000}}}});
        let mut out = json!({"buckets": [{"key": "error", "doc_count": 3}]});
        add_missing_bucket(&terms, Some(sub.clone()), &mut out);
        let buckets = out["buckets"].as_array().unwrap();
        assert_eq!(buckets.len(), 2);
        assert_eq!(buckets[1]["key"], json!("unknown"));
        assert_eq!(buckets[1]["doc_count"], json!(0));
        assert_eq!(buckets[1]["3"]["buckets"].as_array().map(Vec::len), Some(3));
        // Present already, or not asked for with min_doc_count 0: nothing added.
        add_missing_bucket(&terms, Some(sub), &mut out);
        assert_eq!(out["buckets"].as_array().map(Vec::len), Some(2));
        let mut other = json!({"buckets": []});
        add_missing_bucket(&json!({"field": "level", "missing": "x"}), None, &mut other);
        assert_eq!(other["buckets"].as_array().map(Vec::len), Some(0));
    }

    #[test]
    fn terms_count_a_term_cut_in_one_partition_whole_as_elasticsearch_counts_a_shard() {
        // Partition 0: twelve hosts twice each and `x` once, so `x` ranks below the default
        // shard_size of size 1 (11) there; partition 1: `x` three times. `x` has 4 in all.
        let dir = tempfile::tempdir().unwrap();
        let doc = |h: &str| json!({"host": h}).to_string();
        let mut p0: Vec<String> = "abcdefghijkl"
            .chars()
            .flat_map(|c| [doc(&c.to_string()), doc(&c.to_string())])
            .collect();
        p0.push(doc("x"));
        let p1: Vec<String> = (0..3).map(|_| doc("x")).collect();
        let p0: Vec<&str> = p0.iter().map(String::as_str).collect();
        let p1: Vec<&str> = p1.iter().map(String::as_str).collect();
        let targets = crate::testing::indexed(&dir, "hosts", &[&p0, &p1]);
        let out = search(
            &targets,
            json!({"size": 0, "aggs": {"t": {"terms": {"field": "host.keyword", "size": 1}}}}),
        );
        let t = &out["aggregations"]["t"];
        assert_eq!(t["buckets"][0]["key"], json!("x"), "{t}");
        assert_eq!(t["buckets"][0]["doc_count"], json!(4), "{t}");
        assert_eq!(t["sum_other_doc_count"], json!(24), "{t}");
    }

    #[test]
    fn percentiles_over_few_values_answer_as_tdigest_not_the_lower_neighbour() {
        // OpenSearch (t-digest) over 24.37 and 30.25: p25 24.37, p50 the mean 27.31, p75
        // and above 30.25.
        let dir = tempfile::tempdir().unwrap();
        let a = json!({"latency": 24.37}).to_string();
        let b = json!({"latency": 30.25}).to_string();
        let targets = crate::testing::indexed(&dir, "few", &[&[&a], &[&b]]);
        let out = search(
            &targets,
            // Beside a cardinality, whose results hold bytes.
            json!({"size": 0, "aggs": {"p": {"percentiles": {"field": "latency",
                "percents": [25, 50, 75, 99]}}, "c": {"cardinality": {"field": "latency"}}}}),
        );
        let values = &out["aggregations"]["p"]["values"];
        let near = |k: &str, want: f64| {
            let got = values[k].as_f64().unwrap_or(f64::NAN);
            assert!(
                (got - want).abs() <= want * 0.011,
                "{k}: {got} vs {want}: {values}"
            );
        };
        near("25.0", 24.37);
        near("50.0", 27.31);
        near("75.0", 30.25);
        near("99.0", 30.25);
        // Five values 1..5 under a terms bucket, at 0.5, 1.5, .. 4.5 on a scale to 5: p65 is
        // read at 3.25, a quarter of the way from 3 to 4. (Within the sketch's 1 %.)
        let docs: Vec<String> = (1..=5)
            .map(|i| json!({"s": "a", "latency": i}).to_string())
            .collect();
        let docs: Vec<&str> = docs.iter().map(String::as_str).collect();
        let dir = tempfile::tempdir().unwrap();
        let targets = crate::testing::indexed(&dir, "five", &[&docs]);
        let out = search(
            &targets,
            json!({"size": 0, "aggs": {"t": {"terms": {"field": "s.keyword"}, "aggs": {
                "p": {"percentiles": {"field": "latency", "percents": [10, 20, 40, 50, 65, 90]}}}}}}),
        );
        let values = &out["aggregations"]["t"]["buckets"][0]["p"]["values"];
        let near = |k: &str, want: f64| {
            let got = values[k].as_f64().unwrap_or(f64::NAN);
            assert!(
                (got - want).abs() <= want * 0.011,
                "{k}: {got} vs {want}: {values}"
            );
        };
        near("10.0", 1.0);
        near("20.0", 1.5);
        near("40.0", 2.5);
        near("50.0", 3.0);
        near("65.0", 3.75);
        near("90.0", 5.0);
    }
}
