//! The Elasticsearch query DSL subset spate answers, parsed into a tree ([`Query`]) that is
//! independent of any index, then compiled against one partition's schema ([`compile`]).
//! Pure: no I/O, so every clause is unit-tested.

pub mod column_regex;
pub mod compile;
pub mod parse;

pub use compile::compile;
pub use parse::parse_query;

use serde_json::Value;

/// `operator` of match-like queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// Any term.
    Or,
    /// Every term.
    And,
}

/// `minimum_should_match`: a count, or a percentage of the optional clauses (negative values
/// count from the total).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinimumShouldMatch {
    /// A number of clauses.
    Count(i64),
    /// A percentage of the clauses.
    Percent(i64),
}

impl MinimumShouldMatch {
    /// How many of `total` optional clauses must match.
    pub fn required(&self, total: usize) -> usize {
        let total = total as i64;
        let n = match *self {
            Self::Count(n) if n < 0 => total + n,
            Self::Count(n) => n,
            Self::Percent(p) if p < 0 => total - (total * -p) / 100,
            Self::Percent(p) => (total * p) / 100,
        };
        n.clamp(0, total) as usize
    }
}

/// One range bound's value and whether it is inclusive.
#[derive(Debug, Clone, PartialEq)]
pub struct Bound {
    /// The JSON value given (number, or string for dates and keywords).
    pub value: Value,
    /// `gte` / `lte` rather than `gt` / `lt`.
    pub inclusive: bool,
}

/// A parsed query clause.
#[derive(Debug, Clone, PartialEq)]
pub enum Query {
    /// `match_all`.
    MatchAll,
    /// `match_none`.
    MatchNone,
    /// `match`: analysed terms in one field.
    Match {
        /// Field name.
        field: String,
        /// Text to analyse.
        text: String,
        /// How the terms combine.
        operator: Operator,
        /// Terms that must match under `Or`.
        minimum_should_match: Option<MinimumShouldMatch>,
    },
    /// `match_phrase`: analysed terms in order.
    MatchPhrase {
        /// Field name.
        field: String,
        /// Text to analyse.
        text: String,
        /// Positions the terms may move.
        slop: u32,
    },
    /// `multi_match`: a match (or phrase) over several fields, best field wins.
    MultiMatch {
        /// Field names; empty means the value and every text field.
        fields: Vec<String>,
        /// Text to analyse.
        text: String,
        /// `phrase` type instead of `best_fields`.
        phrase: bool,
        /// How the terms combine.
        operator: Operator,
    },
    /// `term`: one exact value.
    Term {
        /// Field name.
        field: String,
        /// Exact value.
        value: Value,
    },
    /// `terms`: any of several exact values.
    Terms {
        /// Field name.
        field: String,
        /// Exact values.
        values: Vec<Value>,
    },
    /// `range`.
    Range {
        /// Field name.
        field: String,
        /// Lower bound.
        lower: Option<Bound>,
        /// Upper bound.
        upper: Option<Bound>,
    },
    /// `exists`.
    Exists {
        /// Field name.
        field: String,
    },
    /// `prefix`.
    Prefix {
        /// Field name.
        field: String,
        /// Prefix of the exact term.
        value: String,
    },
    /// `wildcard`: `*` and `?` over the exact term.
    Wildcard {
        /// Field name.
        field: String,
        /// Pattern.
        pattern: String,
    },
    /// `regexp`.
    Regexp {
        /// Field name.
        field: String,
        /// Regular expression over the whole term.
        pattern: String,
    },
    /// `ids`: `_id`s, each `partition-offset`.
    Ids {
        /// (partition, offset) pairs.
        ids: Vec<(i32, i64)>,
    },
    /// `query_string` (and `?q=`): Lucene-like syntax.
    QueryString {
        /// The query text.
        query: String,
        /// Fields searched by unqualified terms; empty means the defaults.
        fields: Vec<String>,
        /// How unqualified terms combine.
        operator: Operator,
    },
    /// `bool`.
    Bool {
        /// Must match, scored.
        must: Vec<Query>,
        /// Should match.
        should: Vec<Query>,
        /// Must not match.
        must_not: Vec<Query>,
        /// Must match, not scored.
        filter: Vec<Query>,
        /// How many `should` clauses must match.
        minimum_should_match: Option<MinimumShouldMatch>,
    },
    /// `constant_score`: a filter with a fixed score.
    ConstantScore {
        /// The filter.
        filter: Box<Query>,
        /// The score.
        boost: f32,
    },
}

/// Limits that keep one query from running away.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest `wildcard`, `prefix` or `regexp` pattern.
    pub max_pattern_chars: usize,
    /// Most `*` / `?` in one wildcard pattern.
    pub max_wildcards: usize,
    /// Most clauses in the whole query.
    pub max_clauses: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_pattern_chars: 256,
            max_wildcards: 8,
            max_clauses: 1024,
        }
    }
}
