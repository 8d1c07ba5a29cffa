//! The `filters` aggregation's queries. Tantivy's `filter` aggregation parses a query string
//! with its own parser, which knows neither the fields the documents brought nor that their
//! exact values are columns; so each bucket's query (any query of the DSL) travels through
//! the aggregation request as a marked string and is swapped, once the request is parsed for
//! a partition, for the query compiled against that partition's schema.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tantivy::aggregation::agg_req::{AggregationVariants, Aggregations};
use tantivy::aggregation::bucket::{FilterAggregation, QueryBuilder};
use tantivy::query::Query as TQuery;
use tantivy::schema::Schema;
use tantivy::tokenizer::TokenizerManager;

use crate::dsl::{compile, parse_query, Limits};
use crate::error::SearchError;
use crate::schema::IndexSchema;

/// Starts the query string of a `filter` aggregation that holds a DSL query (as JSON).
const MARK: &str = "\u{1}spate-query:";

/// A bucket's query for the aggregation request: checked now (a bad query is the request's
/// error, not a partition's), compiled per partition by [`bind`].
pub fn mark(name: &str, query: &Value) -> Result<String, SearchError> {
    parse_query(query)
        .map_err(|e| SearchError::parsing(format!("[aggs] [{name}] [filters]: {e}")))?;
    Ok(format!("{MARK}{query}"))
}

/// Replaces every marked `filter` aggregation in `aggs` (sub-aggregations included) with its
/// query compiled for `schema`.
pub fn bind(
    aggs: &mut Aggregations,
    schema: &IndexSchema,
    limits: &Limits,
    now_ms: i64,
) -> Result<(), SearchError> {
    for agg in aggs.values_mut() {
        if let AggregationVariants::Filter(f) = &agg.agg {
            // The query string is only reachable through the aggregation's serialisation.
            let marked = serde_json::to_value(f).ok();
            if let Some(json) = marked
                .as_ref()
                .and_then(Value::as_str)
                .and_then(|s| s.strip_prefix(MARK))
            {
                let v: Value = serde_json::from_str(json)
                    .map_err(|e| SearchError::parsing(format!("[aggs] [filters]: {e}")))?;
                let query = compile(&parse_query(&v)?, schema, limits, now_ms)?;
                agg.agg = AggregationVariants::Filter(FilterAggregation::new_with_builder(
                    Box::new(CompiledFilter {
                        query: Some(Arc::from(query)),
                    }),
                ));
            }
        }
        bind(&mut agg.sub_aggregation, schema, limits, now_ms)?;
    }
    Ok(())
}

/// A bucket's query compiled for one partition. It lives only within the partition's
/// search: serialised it is empty, and building it from that is an error.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct CompiledFilter {
    #[serde(skip)]
    query: Option<Arc<dyn TQuery>>,
}

#[typetag::serde]
impl QueryBuilder for CompiledFilter {
    fn build_query(
        &self,
        _schema: &Schema,
        _tokenizers: &TokenizerManager,
    ) -> tantivy::Result<Box<dyn TQuery>> {
        self.query.as_ref().map(|q| q.box_clone()).ok_or_else(|| {
            tantivy::TantivyError::InvalidArgument(
                "a filters aggregation's query was not compiled for this partition".into(),
            )
        })
    }

    fn box_clone(&self) -> Box<dyn QueryBuilder> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_bucket_query_is_the_requests_error() {
        let err = mark("by", &serde_json::json!({"no_such_query": {}})).unwrap_err();
        assert!(err.to_string().contains("[by]"), "{err}");
    }
}
