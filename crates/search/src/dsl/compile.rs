//! [`Query`] -> tantivy query for one partition's schema. A field the schema does not know
//! matches nothing, as an unmapped field does in Elasticsearch.

use std::ops::Bound as RangeBound;

use serde_json::Value;
use spate_broker::search_config::FieldKind;
use tantivy::query::{
    AllQuery, BooleanQuery, BoostQuery, ConstScoreQuery, DisjunctionMaxQuery, EmptyQuery,
    ExistsQuery, Occur, PhraseQuery, Query as TQuery, RangeQuery, RegexQuery, TermQuery,
};
use tantivy::query_grammar::{Delimiter, UserInputAst, UserInputBound, UserInputLeaf};
use tantivy::schema::IndexRecordOption;
use tantivy::tokenizer::TokenizerManager;
use tantivy::{DateTime, Term};

use super::column_regex::ColumnRegexQuery;
use super::{Bound, Limits, MinimumShouldMatch, Operator, Query};
use crate::dates::parse_date;
use crate::error::SearchError;
use crate::schema::{FieldRole, IndexSchema, Resolved, TEXT_TOKENIZER};

type Boxed = Box<dyn TQuery>;

/// Compiles `q` for `schema`; `now_ms` anchors `now` in date math.
pub fn compile(
    q: &Query,
    schema: &IndexSchema,
    limits: &Limits,
    now_ms: i64,
) -> Result<Boxed, SearchError> {
    Compiler {
        schema,
        limits,
        now_ms,
        tokenizers: TokenizerManager::default(),
    }
    .query(q)
}

struct Compiler<'a> {
    schema: &'a IndexSchema,
    limits: &'a Limits,
    now_ms: i64,
    tokenizers: TokenizerManager,
}

/// Gives every group made only of exclusions an "everything" clause, so `NOT a`,
/// `NOT a AND NOT b` and `x AND (NOT y)` mean what they mean in Lucene.
fn with_all(ast: tantivy::query_grammar::UserInputAst) -> tantivy::query_grammar::UserInputAst {
    use tantivy::query_grammar::{Occur, UserInputAst, UserInputLeaf};
    match ast {
        UserInputAst::Clause(items) => {
            let mut items: Vec<(Option<Occur>, UserInputAst)> = items
                .into_iter()
                .map(|(occur, sub)| (occur, with_all(sub)))
                .collect();
            if !items.is_empty() && items.iter().all(|(o, _)| *o == Some(Occur::MustNot)) {
                items.push((
                    Some(Occur::Must),
                    UserInputAst::Leaf(Box::new(UserInputLeaf::All)),
                ));
            }
            UserInputAst::Clause(items)
        }
        UserInputAst::Boost(inner, boost) => UserInputAst::Boost(Box::new(with_all(*inner)), boost),
        leaf => leaf,
    }
}

fn none() -> Boxed {
    Box::new(EmptyQuery)
}

/// The best of several fields' queries (Elasticsearch's `dis_max` over the fields a search
/// without a field looks in).
fn any_of(mut parts: Vec<Boxed>) -> Boxed {
    match parts.len() {
        0 => none(),
        1 => parts.pop().unwrap_or_else(none),
        _ => Box::new(DisjunctionMaxQuery::new(parts)),
    }
}

/// Documents whose column (fast field) holds a value in the bounds: exact values of the
/// documents' fields (`doc_kw`) are columns with no inverted index.
fn column_range(lower: RangeBound<Term>, upper: RangeBound<Term>) -> Boxed {
    Box::new(RangeQuery::new(lower, upper))
}

fn term_query(t: Term) -> Boxed {
    Box::new(TermQuery::new(t, IndexRecordOption::WithFreqs))
}

/// A wildcard pattern (`*` any run, `?` one character) as a regex.
fn wildcard_regex(pattern: &str) -> String {
    let mut re = String::new();
    for c in pattern.chars() {
        match c {
            '*' => re.push_str(".*"),
            '?' => re.push('.'),
            c => re.push_str(&escape_regex(&c.to_string())),
        }
    }
    re
}

/// Escapes regex syntax so that `s` matches itself.
fn escape_regex(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~\"<>@".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl Compiler<'_> {
    fn query(&self, q: &Query) -> Result<Boxed, SearchError> {
        Ok(match q {
            Query::MatchAll => Box::new(AllQuery),
            Query::MatchNone => none(),
            Query::Match {
                field,
                text,
                operator,
                minimum_should_match,
            } => match self.schema.resolve(field) {
                None => none(),
                Some(r) => self.match_field(&r, text, *operator, *minimum_should_match)?,
            },
            Query::MatchPhrase { field, text, slop } => match self.schema.resolve(field) {
                None => none(),
                Some(r) => self.phrase(&r, text, *slop)?,
            },
            Query::MultiMatch {
                fields,
                text,
                phrase,
                operator,
            } => {
                let resolved: Vec<Resolved> =
                    if fields.is_empty() || fields.iter().any(|f| f == "*") {
                        self.schema.resolve("*").into_iter().collect()
                    } else {
                        fields
                            .iter()
                            .filter_map(|f| self.schema.resolve(f))
                            .collect()
                    };
                let parts = resolved
                    .iter()
                    .map(|r| {
                        if *phrase {
                            self.phrase(r, text, 0)
                        } else {
                            self.match_field(r, text, *operator, None)
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if parts.is_empty() {
                    none()
                } else {
                    Box::new(DisjunctionMaxQuery::new(parts))
                }
            }
            Query::Term { field, value } => match self.schema.resolve(field) {
                None => none(),
                Some(r) => self.exact_query(&r, value, "term")?,
            },
            Query::Terms { field, values } => match self.schema.resolve(field) {
                None => none(),
                Some(r) => {
                    let mut parts = Vec::new();
                    for v in values {
                        parts.push(self.exact_query(&r, v, "terms")?);
                    }
                    Box::new(BooleanQuery::union(parts))
                }
            },
            Query::Range {
                field,
                lower,
                upper,
            } => match self.schema.resolve(field) {
                None => none(),
                Some(r) => self.range(&r, lower.as_ref(), upper.as_ref())?,
            },
            Query::Exists { field } => match self.schema.resolve(field) {
                None => none(),
                Some(r) => match r.role {
                    FieldRole::Offset | FieldRole::Partition | FieldRole::Timestamp => {
                        Box::new(AllQuery)
                    }
                    // A field the documents brought: its column, or (text too long for an
                    // exact form) its name among the fields present.
                    FieldRole::Dynamic(_) => Box::new(BooleanQuery::union(vec![
                        Box::new(ExistsQuery::new(r.name.clone(), false)) as Boxed,
                        term_query(Term::from_field_text(
                            self.schema.present,
                            &self.present_name(field, &r),
                        )),
                    ])),
                    _ => term_query(Term::from_field_text(
                        self.schema.present,
                        &self.present_name(field, &r),
                    )),
                },
            },
            Query::Prefix { field, value } => {
                self.check_pattern("prefix", value, 0)?;
                match self.schema.resolve(field) {
                    None => none(),
                    Some(r) => self.prefix(&r, value)?,
                }
            }
            Query::Wildcard { field, pattern } => {
                let wild = pattern.chars().filter(|c| *c == '*' || *c == '?').count();
                self.check_pattern("wildcard", pattern, wild)?;
                match self.schema.resolve(field) {
                    None => none(),
                    Some(r) => self.regex(&r, &wildcard_regex(pattern), "wildcard")?,
                }
            }
            Query::Regexp { field, pattern } => {
                self.check_pattern("regexp", pattern, 0)?;
                match self.schema.resolve(field) {
                    None => none(),
                    Some(r) => self.regex(&r, pattern, "regexp")?,
                }
            }
            Query::Ids { ids } => {
                let parts = ids
                    .iter()
                    .map(|(p, o)| {
                        Box::new(BooleanQuery::intersection(vec![
                            term_query(Term::from_field_i64(self.schema.partition, *p as i64)),
                            term_query(Term::from_field_i64(self.schema.offset, *o)),
                        ])) as Boxed
                    })
                    .collect();
                Box::new(BooleanQuery::union(parts))
            }
            Query::QueryString {
                query,
                fields,
                operator,
            } => self.query_string(query, fields, *operator)?,
            Query::Bool {
                must,
                should,
                must_not,
                filter,
                minimum_should_match,
            } => {
                let mut clauses: Vec<(Occur, Boxed)> = Vec::new();
                for q in must {
                    clauses.push((Occur::Must, self.query(q)?));
                }
                for q in filter {
                    clauses.push((
                        Occur::Must,
                        Box::new(ConstScoreQuery::new(self.query(q)?, 0.0)),
                    ));
                }
                let positive = !clauses.is_empty();
                let shoulds = should
                    .iter()
                    .map(|q| self.query(q))
                    .collect::<Result<Vec<_>, _>>()?;
                let required = match minimum_should_match {
                    Some(m) => m.required(shoulds.len()),
                    // Elasticsearch: with no must or filter, at least one should must match.
                    None if !positive && !shoulds.is_empty() => 1,
                    None => 0,
                };
                if required > 0 {
                    clauses.push((
                        Occur::Must,
                        Box::new(BooleanQuery::union_with_minimum_required_clauses(
                            shoulds, required,
                        )),
                    ));
                } else {
                    clauses.extend(shoulds.into_iter().map(|q| (Occur::Should, q)));
                }
                for q in must_not {
                    clauses.push((Occur::MustNot, self.query(q)?));
                }
                // Only must_not (or nothing): everything else matches, as in Elasticsearch.
                if !clauses.iter().any(|(o, _)| *o != Occur::MustNot) {
                    clauses.push((Occur::Must, Box::new(AllQuery)));
                }
                Box::new(BooleanQuery::new(clauses))
            }
            Query::ConstantScore { filter, boost } => {
                Box::new(ConstScoreQuery::new(self.query(filter)?, *boost))
            }
        })
    }

    fn check_pattern(&self, kind: &str, p: &str, wildcards: usize) -> Result<(), SearchError> {
        if p.chars().count() > self.limits.max_pattern_chars {
            return Err(SearchError::illegal(format!(
                "[{kind}] pattern is longer than {} characters",
                self.limits.max_pattern_chars
            )));
        }
        if wildcards > self.limits.max_wildcards {
            return Err(SearchError::illegal(format!(
                "[{kind}] pattern has {wildcards} wildcards; at most {} are allowed",
                self.limits.max_wildcards
            )));
        }
        Ok(())
    }

    fn present_name(&self, asked: &str, r: &Resolved) -> String {
        match r.role {
            FieldRole::Key => "key".into(),
            FieldRole::Value => "value".into(),
            FieldRole::Header => format!("headers.{}", r.header.as_deref().unwrap_or("")),
            FieldRole::Dynamic(_) => r.path.clone().unwrap_or_else(|| asked.to_string()),
            _ => self
                .schema
                .json
                .iter()
                .find(|(_, _, f, _)| *f == r.field)
                .map(|(p, ..)| p.clone())
                .unwrap_or_else(|| asked.to_string()),
        }
    }

    fn tokens(&self, text: &str) -> Vec<(usize, String)> {
        let Some(mut analyzer) = self.tokenizers.get(TEXT_TOKENIZER) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut stream = analyzer.token_stream(text);
        while let Some(t) = stream.next() {
            out.push((t.position, t.text.clone()));
        }
        out
    }

    fn analysed(r: &Resolved) -> bool {
        matches!(
            r.role,
            FieldRole::Value
                | FieldRole::Json(FieldKind::Text)
                | FieldRole::Dynamic(FieldKind::Text)
        )
    }

    /// The term of one token (or exact string) in `r`: at its path for a dynamic field.
    fn text_term(r: &Resolved, text: &str) -> Term {
        match &r.path {
            Some(path) => {
                let mut t = Term::from_field_json_path(r.field, path, true);
                t.append_type_and_str(text);
                t
            }
            None => Term::from_field_text(r.field, text),
        }
    }

    fn match_field(
        &self,
        r: &Resolved,
        text: &str,
        op: Operator,
        msm: Option<MinimumShouldMatch>,
    ) -> Result<Boxed, SearchError> {
        if !Self::analysed(r) {
            // Exact fields match the whole text as one term, numbers and dates as values.
            return self.exact_query(r, &Value::String(text.to_string()), "match");
        }
        // Without a field, each word may be in any text field (as `query_string` over
        // several fields reads a word), and the operator joins the words.
        let fields = self.expanded(r);
        let terms: Vec<Boxed> = self
            .tokens(text)
            .into_iter()
            .map(|(_, t)| {
                any_of(
                    fields
                        .iter()
                        .map(|f| {
                            Box::new(TermQuery::new(
                                Self::text_term(f, &t),
                                IndexRecordOption::WithFreqs,
                            )) as Boxed
                        })
                        .collect(),
                )
            })
            .collect();
        if terms.is_empty() {
            return Ok(none());
        }
        let n = terms.len();
        if n == 1 {
            // One token: the term query itself, which tantivy scores top-k with block-max
            // pruning; a one-clause boolean would score every match.
            return Ok(any_of(terms));
        }
        Ok(match (op, msm) {
            (Operator::And, _) => Box::new(BooleanQuery::intersection(terms)),
            (Operator::Or, Some(m)) => Box::new(BooleanQuery::union_with_minimum_required_clauses(
                terms,
                m.required(n).max(1),
            )),
            (Operator::Or, None) => Box::new(BooleanQuery::union(terms)),
        })
    }

    /// The fields a query on `r` looks in: every text field for the value (a search
    /// without a field), else `r` itself.
    fn expanded(&self, r: &Resolved) -> Vec<Resolved> {
        if r.role == FieldRole::Value {
            self.schema.unqualified_fields()
        } else {
            vec![r.clone()]
        }
    }

    fn phrase(&self, r: &Resolved, text: &str, slop: u32) -> Result<Boxed, SearchError> {
        if !Self::analysed(r) {
            return self.match_field(r, text, Operator::Or, None);
        }
        let tokens = self.tokens(text);
        let one = |f: &Resolved| -> Boxed {
            let terms: Vec<(usize, Term)> = tokens
                .iter()
                .map(|(p, t)| (*p, Self::text_term(f, t)))
                .collect();
            match terms.len() {
                0 => none(),
                1 => term_query(terms[0].1.clone()),
                _ => Box::new(PhraseQuery::new_with_offset_and_slop(terms, slop)),
            }
        };
        Ok(any_of(self.expanded(r).iter().map(one).collect()))
    }

    /// The query for one exact value of `r`. Exact values of the documents' fields are
    /// columns (see [`IndexSchema::doc_kw`]), read by range; a number in them may be stored
    /// as an integer or as a float (JSON does not say which, and documents differ), which
    /// the column range reads either way.
    fn exact_query(&self, r: &Resolved, v: &Value, kind: &str) -> Result<Boxed, SearchError> {
        if r.role == FieldRole::Value {
            let text = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            return Ok(any_of(
                self.expanded(r)
                    .iter()
                    .map(|f| term_query(Self::text_term(f, &text)))
                    .collect(),
            ));
        }
        let Some(t) = self.exact(r, v, kind)? else {
            return Ok(none());
        };
        if r.field == self.schema.doc_kw {
            return Ok(column_range(
                RangeBound::Included(t.clone()),
                RangeBound::Included(t),
            ));
        }
        Ok(term_query(t))
    }

    fn exact(&self, r: &Resolved, v: &Value, kind: &str) -> Result<Option<Term>, SearchError> {
        let text = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let bad = |what: &str| SearchError::BadRequest {
            kind: "query_shard_exception",
            reason: format!("[{kind}] failed to create query: '{text}' is not {what}"),
        };
        Ok(Some(match r.role {
            FieldRole::Offset | FieldRole::Partition => {
                let n = match v {
                    Value::Number(n) => n.as_i64(),
                    _ => text.trim().parse().ok(),
                };
                Term::from_field_i64(r.field, n.ok_or_else(|| bad("an integer"))?)
            }
            FieldRole::Timestamp | FieldRole::Json(FieldKind::Date) => {
                let ms = parse_date(v, self.now_ms).ok_or_else(|| bad("a date"))?;
                Term::from_field_date(r.field, DateTime::from_timestamp_millis(ms))
            }
            FieldRole::Json(FieldKind::Number) => {
                let n = match v {
                    Value::Number(n) => n.as_f64(),
                    _ => text.trim().parse().ok(),
                };
                Term::from_field_f64(r.field, n.ok_or_else(|| bad("a number"))?)
            }
            FieldRole::Header => Term::from_field_text(
                r.field,
                &format!("{}={text}", r.header.as_deref().unwrap_or("")),
            ),
            FieldRole::Key | FieldRole::Value | FieldRole::Json(_) => {
                Term::from_field_text(r.field, &text)
            }
            FieldRole::Dynamic(kind) => {
                let path = r.path.as_deref().unwrap_or_default();
                let mut t = Term::from_field_json_path(r.field, path, true);
                match kind {
                    FieldKind::Date => {
                        let ms = parse_date(v, self.now_ms).ok_or_else(|| bad("a date"))?;
                        t.append_type_and_fast_value(DateTime::from_timestamp_millis(ms));
                    }
                    FieldKind::Number => {
                        let n = match v {
                            Value::Number(n) => n.as_f64(),
                            _ => text.trim().parse().ok(),
                        };
                        t.append_type_and_fast_value(n.ok_or_else(|| bad("a number"))?);
                    }
                    FieldKind::Text | FieldKind::Keyword => t.append_type_and_str(&text),
                }
                t
            }
        }))
    }

    fn range(
        &self,
        r: &Resolved,
        lower: Option<&Bound>,
        upper: Option<&Bound>,
    ) -> Result<Boxed, SearchError> {
        let bound = |b: Option<&Bound>| -> Result<RangeBound<Term>, SearchError> {
            match b {
                None => Ok(RangeBound::Unbounded),
                Some(b) => {
                    let t = self.exact(r, &b.value, "range")?.ok_or_else(|| {
                        SearchError::parsing("[range] bound cannot be used on this field")
                    })?;
                    Ok(if b.inclusive {
                        RangeBound::Included(t)
                    } else {
                        RangeBound::Excluded(t)
                    })
                }
            }
        };
        if Self::analysed(r) || r.role == FieldRole::Header {
            return Err(SearchError::parsing(format!(
                "[range] is not supported on analysed text field [{}]; use a keyword, number or date field",
                r.name
            )));
        }
        Ok(Box::new(RangeQuery::new(bound(lower)?, bound(upper)?)))
    }

    /// `prefix`: on a column (exact values of the documents' fields) a range from the prefix
    /// to the prefix followed by the last character there is; elsewhere a regex.
    fn prefix(&self, r: &Resolved, value: &str) -> Result<Boxed, SearchError> {
        if r.role == FieldRole::Dynamic(FieldKind::Keyword) {
            let path = r.path.as_deref().unwrap_or_default();
            let term = |s: &str| {
                let mut t = Term::from_field_json_path(r.field, path, true);
                t.append_type_and_str(s);
                t
            };
            return Ok(column_range(
                RangeBound::Included(term(value)),
                RangeBound::Included(term(&format!("{value}{}", char::MAX))),
            ));
        }
        self.regex(r, &format!("{}.*", escape_regex(value)), "prefix")
    }

    fn regex(&self, r: &Resolved, pattern: &str, kind: &str) -> Result<Boxed, SearchError> {
        let build = |field, pattern: &str| -> Result<Boxed, SearchError> {
            let q =
                RegexQuery::from_pattern(pattern, field).map_err(|e| SearchError::BadRequest {
                    kind: "too_complex_to_determinize_exception",
                    reason: format!("[{kind}] pattern is too complex or invalid: {e}"),
                })?;
            Ok(Box::new(q))
        };
        match r.role {
            FieldRole::Value => {
                let parts = self
                    .expanded(r)
                    .iter()
                    .filter(|f| f.role != FieldRole::Value)
                    .map(|f| self.regex(f, pattern, kind))
                    .chain(std::iter::once(build(r.field, pattern)))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(any_of(parts))
            }
            FieldRole::Key | FieldRole::Json(FieldKind::Text | FieldKind::Keyword) => {
                build(r.field, pattern)
            }
            FieldRole::Header => build(
                r.field,
                &format!(
                    "{}={pattern}",
                    escape_regex(r.header.as_deref().unwrap_or(""))
                ),
            ),
            // A text field the documents brought: its words are terms of `doc` behind the
            // field's path (segments split by 0x01, then 0x00 and the string type tag).
            FieldRole::Dynamic(FieldKind::Text) => {
                let path = r.path.as_deref().unwrap_or_default();
                let segments: Vec<String> = path.split('.').map(escape_regex).collect();
                build(
                    r.field,
                    &format!("{}\\x00s(?:{pattern})", segments.join("\\x01")),
                )
            }
            // Exact strings of the documents' fields: their column's dictionary.
            FieldRole::Dynamic(FieldKind::Keyword) => {
                let q = ColumnRegexQuery::new(r.name.clone(), pattern.to_string()).map_err(|e| {
                    SearchError::BadRequest {
                        kind: "too_complex_to_determinize_exception",
                        reason: format!("[{kind}] pattern is too complex or invalid: {e}"),
                    }
                })?;
                Ok(Box::new(q))
            }
            _ => Err(SearchError::parsing(format!(
                "[{kind}] can only be used on key, value, headers, text and keyword fields, not [{}]",
                r.name
            ))),
        }
    }

    /// `query_string`: Lucene's query syntax, parsed by tantivy's grammar and compiled here
    /// clause by clause with the same rules as the JSON queries (fields the documents
    /// brought, columns for exact values, a word without a field looked for in every text
    /// field).
    fn query_string(
        &self,
        query: &str,
        fields: &[String],
        op: Operator,
    ) -> Result<Boxed, SearchError> {
        let ast = tantivy::query_grammar::parse_query(query).map_err(|_| {
            SearchError::parsing(format!("[query_string] failed to parse query [{query}]"))
        })?;
        let defaults: Vec<Resolved> = if fields.is_empty() || fields.iter().any(|f| f == "*") {
            self.schema.resolve("*").into_iter().collect()
        } else {
            fields
                .iter()
                .filter_map(|f| self.schema.resolve(f))
                .collect()
        };
        self.user_query(&with_all(ast), &defaults, op)
    }

    fn user_query(
        &self,
        ast: &UserInputAst,
        defaults: &[Resolved],
        op: Operator,
    ) -> Result<Boxed, SearchError> {
        Ok(match ast {
            UserInputAst::Clause(items) => {
                let plain = match op {
                    Operator::And => Occur::Must,
                    Operator::Or => Occur::Should,
                };
                let clauses = items
                    .iter()
                    .map(|(occur, sub)| {
                        Ok((occur.unwrap_or(plain), self.user_query(sub, defaults, op)?))
                    })
                    .collect::<Result<Vec<_>, SearchError>>()?;
                Box::new(BooleanQuery::new(clauses))
            }
            UserInputAst::Boost(inner, boost) => Box::new(BoostQuery::new(
                self.user_query(inner, defaults, op)?,
                boost.into_inner() as f32,
            )),
            UserInputAst::Leaf(leaf) => self.user_leaf(leaf, defaults, op)?,
        })
    }

    fn user_leaf(
        &self,
        leaf: &UserInputLeaf,
        defaults: &[Resolved],
        op: Operator,
    ) -> Result<Boxed, SearchError> {
        let targets = |field: &Option<String>| -> Vec<Resolved> {
            match field.as_deref() {
                None => defaults.to_vec(),
                Some(f) => self.schema.resolve(f).into_iter().collect(),
            }
        };
        let each = |field: &Option<String>,
                    one: &dyn Fn(&Resolved) -> Result<Boxed, SearchError>|
         -> Result<Boxed, SearchError> {
            Ok(any_of(
                targets(field)
                    .iter()
                    .map(one)
                    .collect::<Result<Vec<_>, _>>()?,
            ))
        };
        match leaf {
            UserInputLeaf::All => Ok(Box::new(AllQuery)),
            UserInputLeaf::Literal(l) if l.field_name.as_deref() == Some("_exists_") => {
                self.query(&Query::Exists {
                    field: l.phrase.clone(),
                })
            }
            UserInputLeaf::Literal(l) => each(&l.field_name, &|r| {
                let wild = l.phrase.chars().filter(|c| *c == '*' || *c == '?').count();
                // Words of text fields are lowercase terms; so are patterns on them, as
                // Elasticsearch normalises them.
                let pattern = if Self::analysed(r) {
                    l.phrase.to_lowercase()
                } else {
                    l.phrase.clone()
                };
                if l.delimiter != Delimiter::None {
                    self.phrase(r, &l.phrase, l.slop)
                } else if l.prefix {
                    self.check_pattern("query_string", &pattern, 1)?;
                    self.prefix(r, &pattern)
                } else if wild > 0 {
                    self.check_pattern("query_string", &pattern, wild)?;
                    self.regex(r, &wildcard_regex(&pattern), "query_string")
                } else {
                    self.match_field(r, &l.phrase, op, None)
                }
            }),
            UserInputLeaf::Range {
                field,
                lower,
                upper,
            } => {
                let bound = |b: &UserInputBound| match b {
                    UserInputBound::Inclusive(v) => Some(Bound {
                        value: Value::String(v.clone()),
                        inclusive: true,
                    }),
                    UserInputBound::Exclusive(v) => Some(Bound {
                        value: Value::String(v.clone()),
                        inclusive: false,
                    }),
                    UserInputBound::Unbounded => None,
                };
                let (lower, upper) = (bound(lower), bound(upper));
                each(field, &|r| self.range(r, lower.as_ref(), upper.as_ref()))
            }
            UserInputLeaf::Set { field, elements } => each(field, &|r| {
                let parts = elements
                    .iter()
                    .map(|v| self.exact_query(r, &Value::String(v.clone()), "query_string"))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Box::new(BooleanQuery::union(parts)) as Boxed)
            }),
            UserInputLeaf::Exists { field } => self.query(&Query::Exists {
                field: field.clone(),
            }),
            UserInputLeaf::Regex { field, pattern } => {
                self.check_pattern("regexp", pattern, 0)?;
                each(field, &|r| self.regex(r, pattern, "query_string"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_broker::search_config::{SearchField, SearchSettings, ValueFormat};
    use tantivy::collector::Count;

    /// An in-memory index of JSON records with a keyword `level`.
    fn index(levels: &[&str]) -> (IndexSchema, tantivy::Index) {
        let values: Vec<String> = levels
            .iter()
            .map(|l| format!("{{\"level\":\"{l}\"}}"))
            .collect();
        index_of(&values)
    }

    /// An in-memory index of these record values (JSON fields mapped dynamically, `level`
    /// configured as a keyword).
    fn index_of(values: &[String]) -> (IndexSchema, tantivy::Index) {
        let settings = SearchSettings {
            enabled: true,
            format: ValueFormat::Json,
            fields: vec![SearchField {
                path: "level".into(),
                kind: FieldKind::Keyword,
            }],
            store_value: false,
            max_fields: 1000,
            time_field: "@timestamp".into(),
        };
        let schema = IndexSchema::build(&settings);
        let index = tantivy::Index::create_in_ram(schema.schema.clone());
        let mut w: tantivy::IndexWriter = index.writer(15_000_000).unwrap();
        for (i, v) in values.iter().enumerate() {
            let r = crate::record::LogRecord {
                offset: i as i64,
                timestamp: 0,
                key: None,
                value: Some(bytes::Bytes::from(v.clone())),
                headers: vec![],
            };
            w.add_document(crate::document::build(&schema, &settings, 0, &r))
                .unwrap();
        }
        w.commit().unwrap();
        (schema, index)
    }

    fn count(schema: &IndexSchema, index: &tantivy::Index, q: &str) -> usize {
        let query = Query::QueryString {
            query: q.into(),
            fields: vec![],
            operator: Operator::Or,
        };
        count_of(schema, index, &query)
    }

    fn count_of(schema: &IndexSchema, index: &tantivy::Index, query: &Query) -> usize {
        let compiled = compile(query, schema, &Limits::default(), 0).unwrap();
        index
            .reader()
            .unwrap()
            .searcher()
            .search(&compiled, &Count)
            .unwrap()
    }

    #[test]
    fn a_query_string_of_exclusions_only_matches_everything_else() {
        let (schema, index) = index(&["debug", "info", "warn", "debug"]);
        assert_eq!(count(&schema, &index, "NOT level:debug"), 2);
        assert_eq!(
            count(&schema, &index, "NOT level:debug AND NOT level:info"),
            1
        );
        assert_eq!(count(&schema, &index, "level:debug"), 2);
    }

    fn logs() -> (IndexSchema, tantivy::Index) {
        index_of(&[
            r#"{"message":"disk full on node7","service":"store-api","http":{"status":507}}"#
                .into(),
            r#"{"message":"request served","service":"store-worker","http":{"status":200}}"#.into(),
            r#"{"message":"request failed","service":"auth-api","http":{"status":500}}"#.into(),
            "plain text, not json: full moon".into(),
        ])
    }

    #[test]
    fn words_without_a_field_are_found_in_every_text_field_and_plain_values() {
        let (schema, index) = logs();
        // A JSON object's raw text is not indexed; its words are, by path.
        assert_eq!(count(&schema, &index, "full"), 2);
        assert_eq!(count(&schema, &index, "node7"), 1);
        assert_eq!(count(&schema, &index, "request AND failed"), 1);
        let phrase = Query::MatchPhrase {
            field: "_all".into(),
            text: "request served".into(),
            slop: 0,
        };
        assert_eq!(count_of(&schema, &index, &phrase), 1);
        let multi = Query::MultiMatch {
            fields: vec![],
            text: "moon disk".into(),
            phrase: false,
            operator: Operator::Or,
        };
        assert_eq!(count_of(&schema, &index, &multi), 2);
    }

    #[test]
    fn exact_values_are_read_from_their_columns() {
        let (schema, index) = logs();
        let term = |field: &str, value: Value| Query::Term {
            field: field.into(),
            value,
        };
        assert_eq!(
            count_of(&schema, &index, &term("service.keyword", "auth-api".into())),
            1
        );
        assert_eq!(
            count_of(&schema, &index, &term("service.keyword", "auth".into())),
            0
        );
        assert_eq!(
            count_of(&schema, &index, &term("http.status", 500.into())),
            1
        );
        assert_eq!(
            count_of(&schema, &index, &term("http.status", 500.5.into())),
            0
        );
        let prefix = Query::Prefix {
            field: "service.keyword".into(),
            value: "store-".into(),
        };
        assert_eq!(count_of(&schema, &index, &prefix), 2);
        assert_eq!(count(&schema, &index, "http.status:[500 TO 599]"), 2);
        assert_eq!(count(&schema, &index, "service.keyword:store-worker"), 1);
        assert_eq!(count(&schema, &index, "_exists_:http.status"), 3);
        let wildcard = Query::Wildcard {
            field: "service.keyword".into(),
            pattern: "*-api".into(),
        };
        assert_eq!(count_of(&schema, &index, &wildcard), 2);
        let regexp = Query::Regexp {
            field: "service.keyword".into(),
            pattern: "store-(api|nothing)".into(),
        };
        assert_eq!(count_of(&schema, &index, &regexp), 1);
        assert_eq!(count(&schema, &index, "service.keyword:/auth.*/"), 1);
    }

    #[test]
    fn exists_finds_short_values_in_their_column_and_long_texts_by_name() {
        let long = "word ".repeat(80);
        let (schema, index) = index_of(&[
            r#"{"message":"short"}"#.into(),
            format!(r#"{{"message":"{long}"}}"#),
            r#"{"other":1}"#.into(),
        ]);
        assert_eq!(count(&schema, &index, "_exists_:message"), 2);
        let exists = Query::Exists {
            field: "other".into(),
        };
        assert_eq!(count_of(&schema, &index, &exists), 1);
    }

    #[test]
    fn query_string_wildcards_match_words_of_text_fields_the_documents_brought() {
        let (schema, index) = logs();
        assert_eq!(count(&schema, &index, "message:req*"), 2);
        assert_eq!(count(&schema, &index, "message:fa?led"), 1);
        assert_eq!(count(&schema, &index, "message:/no.e[0-9]/"), 1);
        // Patterns on text fields are lowercased, as the words are.
        assert_eq!(count(&schema, &index, "message:REQ*"), 2);
    }
}
