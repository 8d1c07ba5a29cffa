//! [`Query`] -> tantivy query for one partition's schema. A field the schema does not know
//! matches nothing, as an unmapped field does in Elasticsearch.

use std::ops::Bound as RangeBound;

use serde_json::Value;
use spate_broker::search_config::FieldKind;
use tantivy::query::{
    AllQuery, BooleanQuery, ConstScoreQuery, DisjunctionMaxQuery, EmptyQuery, Occur, PhraseQuery,
    Query as TQuery, QueryParser, RangeQuery, RegexQuery, TermQuery,
};
use tantivy::schema::{Field, IndexRecordOption};
use tantivy::tokenizer::TokenizerManager;
use tantivy::{DateTime, Term};

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

/// A query string with field names replaced by the index's (for tantivy's own parser, as in
/// the `filter` aggregation).
pub fn index_query_string(schema: &IndexSchema, query: &str) -> String {
    Compiler {
        schema,
        limits: &Limits::default(),
        now_ms: 0,
        tokenizers: TokenizerManager::default(),
    }
    .rewrite_field_names(query)
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

fn term_query(t: Term) -> Boxed {
    Box::new(TermQuery::new(t, IndexRecordOption::WithFreqs))
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
                        self.schema
                            .default_text_fields()
                            .into_iter()
                            .map(|f| Resolved {
                                field: f,
                                name: String::new(),
                                role: FieldRole::Value,
                                header: None,
                                path: None,
                            })
                            .collect()
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
                    Some(r) => self.regex(&r, &format!("{}.*", escape_regex(value)), "prefix")?,
                }
            }
            Query::Wildcard { field, pattern } => {
                let wild = pattern.chars().filter(|c| *c == '*' || *c == '?').count();
                self.check_pattern("wildcard", pattern, wild)?;
                let mut re = String::new();
                for c in pattern.chars() {
                    match c {
                        '*' => re.push_str(".*"),
                        '?' => re.push('.'),
                        c => re.push_str(&escape_regex(&c.to_string())),
                    }
                }
                match self.schema.resolve(field) {
                    None => none(),
                    Some(r) => self.regex(&r, &re, "wildcard")?,
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
        let terms: Vec<Boxed> = self
            .tokens(text)
            .into_iter()
            .map(|(_, t)| {
                Box::new(TermQuery::new(
                    Self::text_term(r, &t),
                    IndexRecordOption::WithFreqs,
                )) as Boxed
            })
            .collect();
        if terms.is_empty() {
            return Ok(none());
        }
        let n = terms.len();
        if n == 1 {
            // One token: the term query itself, which tantivy scores top-k with block-max
            // pruning; a one-clause boolean would score every match.
            if let Some(only) = terms.into_iter().next() {
                return Ok(only);
            }
            return Ok(none());
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

    fn phrase(&self, r: &Resolved, text: &str, slop: u32) -> Result<Boxed, SearchError> {
        if !Self::analysed(r) {
            return self.match_field(r, text, Operator::Or, None);
        }
        let terms: Vec<(usize, Term)> = self
            .tokens(text)
            .into_iter()
            .map(|(p, t)| (p, Self::text_term(r, &t)))
            .collect();
        Ok(match terms.len() {
            0 => none(),
            1 => term_query(terms[0].1.clone()),
            _ => Box::new(PhraseQuery::new_with_offset_and_slop(terms, slop)),
        })
    }

    /// The one term an exact value stands for in `r` (`None`: cannot match, e.g. text in a
    /// number field, which Elasticsearch also refuses).
    /// The query for one exact value of `r`. A number in a field the documents brought may be
    /// stored as an integer or as a float (JSON does not say which a value is, and documents
    /// differ): a whole number matches either.
    fn exact_query(&self, r: &Resolved, v: &Value, kind: &str) -> Result<Boxed, SearchError> {
        let Some(t) = self.exact(r, v, kind)? else {
            return Ok(none());
        };
        if r.role != FieldRole::Dynamic(FieldKind::Number) {
            return Ok(term_query(t));
        }
        let n = match v {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse::<f64>().ok(),
            _ => None,
        };
        match n.filter(|n| n.fract() == 0.0 && n.abs() < 9.0e15) {
            Some(whole) => {
                let path = r.path.as_deref().unwrap_or_default();
                let mut int = Term::from_field_json_path(r.field, path, true);
                int.append_type_and_fast_value(whole as i64);
                Ok(Box::new(BooleanQuery::union(vec![
                    term_query(t),
                    term_query(int),
                ])))
            }
            None => Ok(term_query(t)),
        }
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

    fn regex(&self, r: &Resolved, pattern: &str, kind: &str) -> Result<Boxed, SearchError> {
        let (field, pattern) = match r.role {
            FieldRole::Key | FieldRole::Value | FieldRole::Json(FieldKind::Text | FieldKind::Keyword) => {
                (r.field, pattern.to_string())
            }
            FieldRole::Header => (
                r.field,
                format!("{}={pattern}", escape_regex(r.header.as_deref().unwrap_or(""))),
            ),
            _ => {
                return Err(SearchError::parsing(format!(
                    "[{kind}] can only be used on key, value, headers, text and keyword fields, not [{}]",
                    r.name
                )))
            }
        };
        let q = RegexQuery::from_pattern(&pattern, field).map_err(|e| SearchError::BadRequest {
            kind: "too_complex_to_determinize_exception",
            reason: format!("[{kind}] pattern is too complex or invalid: {e}"),
        })?;
        Ok(Box::new(q))
    }

    fn query_string(
        &self,
        query: &str,
        fields: &[String],
        op: Operator,
    ) -> Result<Boxed, SearchError> {
        let defaults: Vec<Field> = if fields.is_empty() {
            self.schema.default_text_fields()
        } else {
            fields
                .iter()
                .filter_map(|f| self.schema.resolve(f).map(|r| r.field))
                .collect()
        };
        let mut parser = QueryParser::new(
            self.schema.schema.clone(),
            defaults,
            TokenizerManager::default(),
        );
        if op == Operator::And {
            parser.set_conjunction_by_default();
        }
        let rewritten = self.rewrite_field_names(query);
        let parsed = match parser.parse_query(&rewritten) {
            // Lucene reads a query of exclusions only (`NOT level:debug`, Grafana's filters)
            // as everything but them; tantivy wants the "everything" said.
            Err(tantivy::query::QueryParserError::AllButQueryForbidden) => {
                match tantivy::query_grammar::parse_query(&rewritten) {
                    Ok(ast) => parser.build_query_from_user_input_ast(with_all(ast)),
                    Err(_) => Err(tantivy::query::QueryParserError::AllButQueryForbidden),
                }
            }
            other => other,
        };
        parsed.map_err(|e| {
            SearchError::parsing(format!(
                "[query_string] failed to parse query [{query}]: {e}"
            ))
        })
    }

    /// Replaces `path:` of configured JSON fields with their index names in a query string.
    /// (See [`with_all`] for queries of exclusions only.)
    fn rewrite_field_names(&self, query: &str) -> String {
        let mut out = String::with_capacity(query.len());
        let mut rest = query;
        let boundary = |c: char| c.is_whitespace() || "()+-!".contains(c);
        let mut at_boundary = true;
        while let Some(c) = rest.chars().next() {
            if at_boundary && !boundary(c) {
                let name_len = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || "._@-".contains(c)))
                    .unwrap_or(rest.len());
                let (name, after) = rest.split_at(name_len);
                if after.starts_with(':') {
                    let mapped = self
                        .schema
                        .json
                        .iter()
                        .find(|(p, ..)| p == name || format!("{p}.keyword") == name)
                        .map(|(_, _, _, n)| n.clone());
                    // A field the documents brought: its text at `doc.<path>`, its exact
                    // value at `doc_kw.<path>`.
                    let dynamic = || {
                        let r = self.schema.resolve(name)?;
                        let path = r.path?;
                        Some(match r.role {
                            FieldRole::Dynamic(FieldKind::Text) => format!("doc.{path}"),
                            _ => format!("doc_kw.{path}"),
                        })
                    };
                    let fixed = match name {
                        n if n == self.schema.time_field => Some("event_time".to_string()),
                        "_timestamp" => Some("timestamp".to_string()),
                        _ => None,
                    };
                    let replaced = mapped.or(fixed).or_else(dynamic);
                    out.push_str(replaced.as_deref().unwrap_or(name));
                    rest = after;
                    at_boundary = false;
                    continue;
                }
            }
            at_boundary = boundary(c) || c == ':';
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_broker::search_config::{SearchField, SearchSettings, ValueFormat};
    use tantivy::collector::Count;

    /// An in-memory index of JSON records with a keyword `level`.
    fn index(levels: &[&str]) -> (IndexSchema, tantivy::Index) {
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
        for (i, l) in levels.iter().enumerate() {
            let r = crate::record::LogRecord {
                offset: i as i64,
                timestamp: 0,
                key: None,
                value: Some(bytes::Bytes::from(format!("{{\"level\":\"{l}\"}}"))),
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
        let compiled = compile(&query, schema, &Limits::default(), 0).unwrap();
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
}
