//! JSON -> [`Query`]: the shapes Elasticsearch accepts for each supported clause, with a
//! `parsing_exception` naming the clause for anything else.

use serde_json::{Map, Value};

use super::{Bound, MinimumShouldMatch, Operator, Query};
use crate::error::SearchError;

/// Parses one query clause (`{"match": {...}}` and so on).
pub fn parse_query(v: &Value) -> Result<Query, SearchError> {
    let mut clauses = 0usize;
    parse_counted(v, &mut clauses)
}

const MAX_CLAUSES: usize = 1024;
const MAX_DEPTH_NOTE: &str = "the query has more than 1024 clauses";

fn parse_counted(v: &Value, clauses: &mut usize) -> Result<Query, SearchError> {
    *clauses += 1;
    if *clauses > MAX_CLAUSES {
        return Err(SearchError::illegal(MAX_DEPTH_NOTE));
    }
    let obj = v
        .as_object()
        .ok_or_else(|| SearchError::parsing("a query must be an object like {\"match\": {...}}"))?;
    let mut it = obj.iter();
    let (kind, body) = match (it.next(), it.next()) {
        (Some(one), None) => one,
        (None, _) => return Err(SearchError::parsing("query is empty")),
        (Some((a, _)), Some((b, _))) => {
            return Err(SearchError::parsing(format!(
                "[{a}] malformed query, expected [END_OBJECT] but found [{b}]"
            )))
        }
    };
    match kind.as_str() {
        "match_all" => Ok(Query::MatchAll),
        "match_none" => Ok(Query::MatchNone),
        "match" => parse_match(body),
        "match_phrase" => parse_phrase(body),
        "multi_match" => parse_multi_match(body),
        "term" => {
            let (field, inner) = single_field(kind, body)?;
            let value = match inner {
                Value::Object(m) => m
                    .get("value")
                    .cloned()
                    .ok_or_else(|| SearchError::parsing("[term] query needs a [value]"))?,
                other => other.clone(),
            };
            scalar(kind, &value)?;
            Ok(Query::Term { field, value })
        }
        "terms" => {
            let m = object(kind, body)?;
            let mut fields = m.iter().filter(|(k, _)| k.as_str() != "boost");
            let (field, values) = match (fields.next(), fields.next()) {
                (Some(one), None) => one,
                _ => {
                    return Err(SearchError::parsing(
                        "[terms] query needs exactly one field",
                    ))
                }
            };
            let values = values
                .as_array()
                .ok_or_else(|| SearchError::parsing("[terms] query needs an array of values"))?;
            for v in values {
                scalar(kind, v)?;
            }
            Ok(Query::Terms {
                field: field.clone(),
                values: values.clone(),
            })
        }
        "range" => parse_range(body),
        "exists" => {
            let m = object(kind, body)?;
            let field = m
                .get("field")
                .and_then(Value::as_str)
                .ok_or_else(|| SearchError::parsing("[exists] query needs a [field]"))?;
            Ok(Query::Exists {
                field: field.to_string(),
            })
        }
        "prefix" | "wildcard" | "regexp" => {
            let (field, inner) = single_field(kind, body)?;
            let text = match inner {
                Value::String(s) => s.clone(),
                Value::Object(m) => m
                    .get("value")
                    .or_else(|| m.get("wildcard"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| SearchError::parsing(format!("[{kind}] query needs a [value]")))?
                    .to_string(),
                _ => {
                    return Err(SearchError::parsing(format!(
                        "[{kind}] query needs a string value"
                    )))
                }
            };
            Ok(match kind.as_str() {
                "prefix" => Query::Prefix { field, value: text },
                "wildcard" => Query::Wildcard {
                    field,
                    pattern: text,
                },
                _ => Query::Regexp {
                    field,
                    pattern: text,
                },
            })
        }
        "ids" => {
            let m = object(kind, body)?;
            let values = m
                .get("values")
                .and_then(Value::as_array)
                .ok_or_else(|| SearchError::parsing("[ids] query needs [values]"))?;
            let ids = values
                .iter()
                .map(|v| {
                    v.as_str().and_then(parse_id).ok_or_else(|| {
                        SearchError::parsing(format!(
                            "[ids] {v} is not an _id of the form partition-offset"
                        ))
                    })
                })
                .collect::<Result<_, _>>()?;
            Ok(Query::Ids { ids })
        }
        "query_string" | "simple_query_string" => {
            let m = object(kind, body)?;
            let query = m
                .get("query")
                .and_then(Value::as_str)
                .ok_or_else(|| SearchError::parsing(format!("[{kind}] needs a [query] string")))?
                .to_string();
            let mut fields = string_list(kind, m.get("fields"))?;
            if let Some(f) = m.get("default_field").and_then(Value::as_str) {
                fields.push(f.to_string());
            }
            Ok(Query::QueryString {
                query,
                fields,
                operator: operator(kind, m.get("default_operator"))?,
            })
        }
        "bool" => {
            let m = object(kind, body)?;
            let mut list = |key: &str| -> Result<Vec<Query>, SearchError> {
                match m.get(key) {
                    None => Ok(Vec::new()),
                    Some(Value::Array(items)) => {
                        items.iter().map(|q| parse_counted(q, clauses)).collect()
                    }
                    Some(one) => Ok(vec![parse_counted(one, clauses)?]),
                }
            };
            let (must, should, must_not, filter) = (
                list("must")?,
                list("should")?,
                list("must_not")?,
                list("filter")?,
            );
            for k in m.keys() {
                if !matches!(
                    k.as_str(),
                    "must"
                        | "should"
                        | "must_not"
                        | "filter"
                        | "minimum_should_match"
                        | "boost"
                        | "_name"
                ) {
                    return Err(SearchError::parsing(format!(
                        "[bool] query does not support [{k}]"
                    )));
                }
            }
            Ok(Query::Bool {
                must,
                should,
                must_not,
                filter,
                minimum_should_match: minimum_should_match(m.get("minimum_should_match"))?,
            })
        }
        "constant_score" => {
            let m = object(kind, body)?;
            let filter = m
                .get("filter")
                .ok_or_else(|| SearchError::parsing("[constant_score] needs a [filter]"))?;
            let boost = m.get("boost").and_then(Value::as_f64).unwrap_or(1.0) as f32;
            Ok(Query::ConstantScore {
                filter: Box::new(parse_counted(filter, clauses)?),
                boost,
            })
        }
        other => Err(SearchError::parsing(format!("unknown query [{other}]"))),
    }
}

/// Parses an `_id`: `partition-offset`.
pub fn parse_id(s: &str) -> Option<(i32, i64)> {
    let (p, o) = s.split_once('-')?;
    Some((p.parse().ok()?, o.parse().ok()?))
}

fn object<'a>(kind: &str, v: &'a Value) -> Result<&'a Map<String, Value>, SearchError> {
    v.as_object().ok_or_else(|| {
        SearchError::parsing(format!("[{kind}] query malformed, expected an object"))
    })
}

/// `{"field": inner}` (ignoring `boost` and `_name`).
fn single_field<'a>(kind: &str, v: &'a Value) -> Result<(String, &'a Value), SearchError> {
    let m = object(kind, v)?;
    let mut it = m
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "boost" | "_name"));
    match (it.next(), it.next()) {
        (Some((f, inner)), None) => Ok((f.clone(), inner)),
        (None, _) => Err(SearchError::parsing(format!(
            "[{kind}] query needs a field"
        ))),
        (Some(_), Some((f, _))) => Err(SearchError::parsing(format!(
            "[{kind}] query doesn't support multiple fields, found [{f}]"
        ))),
    }
}

fn scalar(kind: &str, v: &Value) -> Result<(), SearchError> {
    match v {
        Value::String(_) | Value::Number(_) | Value::Bool(_) => Ok(()),
        _ => Err(SearchError::parsing(format!(
            "[{kind}] query needs a string, number or boolean value, got {v}"
        ))),
    }
}

fn text_of(kind: &str, v: &Value) -> Result<String, SearchError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(SearchError::parsing(format!(
            "[{kind}] query needs text, got {v}"
        ))),
    }
}

fn operator(kind: &str, v: Option<&Value>) -> Result<Operator, SearchError> {
    match v
        .and_then(Value::as_str)
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("or") => Ok(Operator::Or),
        Some("and") => Ok(Operator::And),
        Some(other) => Err(SearchError::parsing(format!(
            "[{kind}] unknown operator [{other}], expected and or or"
        ))),
    }
}

fn minimum_should_match(v: Option<&Value>) -> Result<Option<MinimumShouldMatch>, SearchError> {
    let bad = |v: &Value| {
        SearchError::parsing(format!(
            "[minimum_should_match] {v} is not a count or a percentage"
        ))
    };
    match v {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .map(|n| Some(MinimumShouldMatch::Count(n)))
            .ok_or_else(|| bad(&Value::Number(n.clone()))),
        Some(Value::String(s)) => {
            let s = s.trim();
            if let Some(p) = s.strip_suffix('%') {
                p.trim()
                    .parse()
                    .map(|p| Some(MinimumShouldMatch::Percent(p)))
                    .map_err(|_| bad(&Value::from(s)))
            } else {
                s.parse()
                    .map(|n| Some(MinimumShouldMatch::Count(n)))
                    .map_err(|_| bad(&Value::from(s)))
            }
        }
        Some(other) => Err(bad(other)),
    }
}

fn string_list(kind: &str, v: Option<&Value>) -> Result<Vec<String>, SearchError> {
    match v {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(|s| s.split('^').next().unwrap_or(s).to_string())
                    .ok_or_else(|| {
                        SearchError::parsing(format!("[{kind}] [fields] must be strings"))
                    })
            })
            .collect(),
        Some(_) => Err(SearchError::parsing(format!(
            "[{kind}] [fields] must be an array of strings"
        ))),
    }
}

fn parse_match(body: &Value) -> Result<Query, SearchError> {
    let (field, inner) = single_field("match", body)?;
    match inner {
        Value::Object(m) => {
            let text = text_of(
                "match",
                m.get("query")
                    .ok_or_else(|| SearchError::parsing("[match] query needs a [query]"))?,
            )?;
            Ok(Query::Match {
                field,
                text,
                operator: operator("match", m.get("operator"))?,
                minimum_should_match: minimum_should_match(m.get("minimum_should_match"))?,
            })
        }
        other => Ok(Query::Match {
            field,
            text: text_of("match", other)?,
            operator: Operator::Or,
            minimum_should_match: None,
        }),
    }
}

fn parse_phrase(body: &Value) -> Result<Query, SearchError> {
    let (field, inner) = single_field("match_phrase", body)?;
    let (text, slop) = match inner {
        Value::Object(m) => (
            text_of(
                "match_phrase",
                m.get("query")
                    .ok_or_else(|| SearchError::parsing("[match_phrase] query needs a [query]"))?,
            )?,
            m.get("slop").and_then(Value::as_u64).unwrap_or(0).min(100) as u32,
        ),
        other => (text_of("match_phrase", other)?, 0),
    };
    Ok(Query::MatchPhrase { field, text, slop })
}

fn parse_multi_match(body: &Value) -> Result<Query, SearchError> {
    let m = object("multi_match", body)?;
    let text = text_of(
        "multi_match",
        m.get("query")
            .ok_or_else(|| SearchError::parsing("[multi_match] query needs a [query]"))?,
    )?;
    let phrase = match m.get("type").and_then(Value::as_str) {
        None | Some("best_fields") | Some("most_fields") => false,
        Some("phrase") => true,
        Some(other) => {
            return Err(SearchError::parsing(format!(
                "[multi_match] type [{other}] is not supported (best_fields, most_fields, phrase)"
            )))
        }
    };
    Ok(Query::MultiMatch {
        fields: string_list("multi_match", m.get("fields"))?,
        text,
        phrase,
        operator: operator("multi_match", m.get("operator"))?,
    })
}

fn parse_range(body: &Value) -> Result<Query, SearchError> {
    let (field, inner) = single_field("range", body)?;
    let m = object("range", inner)?;
    let mut lower = None;
    let mut upper = None;
    for (k, v) in m {
        if !matches!(v, Value::String(_) | Value::Number(_)) && !v.is_null() {
            return Err(SearchError::parsing(format!(
                "[range] bound [{k}] must be a number or a string, got {v}"
            )));
        }
        let b = (!v.is_null()).then(|| v.clone());
        match k.as_str() {
            "gt" => {
                lower = b.map(|value| Bound {
                    value,
                    inclusive: false,
                })
            }
            "gte" | "from" => {
                lower = b.map(|value| Bound {
                    value,
                    inclusive: true,
                })
            }
            "lt" => {
                upper = b.map(|value| Bound {
                    value,
                    inclusive: false,
                })
            }
            "lte" | "to" => {
                upper = b.map(|value| Bound {
                    value,
                    inclusive: true,
                })
            }
            "format" | "boost" | "time_zone" | "relation" => {}
            other => {
                return Err(SearchError::parsing(format!(
                    "[range] query does not support [{other}]"
                )))
            }
        }
    }
    Ok(Query::Range {
        field,
        lower,
        upper,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> String {
        parse_query(&v).unwrap_err().to_string()
    }

    #[test]
    fn match_accepts_the_short_and_the_long_form() {
        assert_eq!(
            parse_query(&json!({"match": {"value": "a b"}})).unwrap(),
            Query::Match {
                field: "value".into(),
                text: "a b".into(),
                operator: Operator::Or,
                minimum_should_match: None
            }
        );
        let q = parse_query(
            &json!({"match": {"msg": {"query": "a b", "operator": "AND", "minimum_should_match": "50%"}}}),
        )
        .unwrap();
        assert!(matches!(
            q,
            Query::Match {
                operator: Operator::And,
                minimum_should_match: Some(MinimumShouldMatch::Percent(50)),
                ..
            }
        ));
    }

    #[test]
    fn unknown_query_types_are_named_in_the_error() {
        assert_eq!(
            err(json!({"fuzzy_thing": {}})),
            "unknown query [fuzzy_thing]"
        );
    }

    #[test]
    fn bool_takes_single_clauses_and_lists_and_refuses_unknown_keys() {
        let q = parse_query(&json!({"bool": {
            "must": {"term": {"key": "a"}},
            "should": [{"match": {"value": "x"}}, {"match": {"value": "y"}}],
            "minimum_should_match": 1
        }}))
        .unwrap();
        let Query::Bool {
            must,
            should,
            minimum_should_match,
            ..
        } = q
        else {
            panic!()
        };
        assert_eq!((must.len(), should.len()), (1, 2));
        assert_eq!(minimum_should_match, Some(MinimumShouldMatch::Count(1)));
        assert!(err(json!({"bool": {"musts": []}})).contains("[musts]"));
    }

    #[test]
    fn range_reads_every_bound_form() {
        let q = parse_query(&json!({"range": {"offset": {"gt": 1, "lte": 5}}})).unwrap();
        let Query::Range { lower, upper, .. } = q else {
            panic!()
        };
        assert_eq!(
            lower,
            Some(Bound {
                value: json!(1),
                inclusive: false
            })
        );
        assert_eq!(
            upper,
            Some(Bound {
                value: json!(5),
                inclusive: true
            })
        );
        assert!(err(json!({"range": {"offset": {"near": 1}}})).contains("[near]"));
    }

    #[test]
    fn two_query_types_in_one_object_are_refused() {
        assert!(err(json!({"match": {"a": "b"}, "term": {"a": "b"}})).contains("malformed"));
    }

    #[test]
    fn minimum_should_match_counts_and_percentages() {
        assert_eq!(MinimumShouldMatch::Count(2).required(3), 2);
        assert_eq!(MinimumShouldMatch::Count(-1).required(3), 2);
        assert_eq!(MinimumShouldMatch::Percent(50).required(4), 2);
        assert_eq!(MinimumShouldMatch::Percent(-25).required(4), 3);
        assert_eq!(MinimumShouldMatch::Count(9).required(3), 3);
    }

    #[test]
    fn ids_are_partition_dash_offset() {
        assert_eq!(parse_id("2-17"), Some((2, 17)));
        assert_eq!(parse_id("x"), None);
        assert!(err(json!({"ids": {"values": ["nope"]}})).contains("partition-offset"));
    }

    #[test]
    fn a_clause_bomb_is_refused() {
        let many: Vec<Value> = (0..2000).map(|_| json!({"match_all": {}})).collect();
        assert!(err(json!({"bool": {"should": many}})).contains("1024"));
    }
}
