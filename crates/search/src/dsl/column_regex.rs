//! A regex (or wildcard) over a string column: the exact values of the documents' fields
//! are columns without an inverted index (see `IndexSchema::doc_kw`), so the pattern walks
//! the column's dictionary (sorted, like a term dictionary) for the ordinals it matches, and
//! one pass over the column finds the documents holding one of them. Tantivy's `RegexQuery`
//! walks only inverted-index term dictionaries.

use tantivy::query::{
    BitSetDocSet, ConstScorer, EmptyScorer, EnableScoring, Explanation, Query, Scorer, Weight,
};
use tantivy::{BitSet, DocId, DocSet, Score, SegmentReader, TantivyError};
use tantivy_fst::Regex;

/// Documents whose string column `column` (a fast-field name, `doc_kw.<path>`) holds a value
/// the whole of which matches `pattern`.
#[derive(Debug, Clone)]
pub struct ColumnRegexQuery {
    column: String,
    pattern: String,
}

impl ColumnRegexQuery {
    /// The query, with the pattern checked now (a bad pattern is the request's error).
    pub fn new(column: String, pattern: String) -> Result<Self, TantivyError> {
        Regex::new(&pattern).map_err(|e| TantivyError::InvalidArgument(e.to_string()))?;
        Ok(Self { column, pattern })
    }
}

impl Query for ColumnRegexQuery {
    fn weight(&self, _scoring: EnableScoring<'_>) -> tantivy::Result<Box<dyn Weight>> {
        let regex =
            Regex::new(&self.pattern).map_err(|e| TantivyError::InvalidArgument(e.to_string()))?;
        Ok(Box::new(ColumnRegexWeight {
            column: self.column.clone(),
            regex,
        }))
    }
}

struct ColumnRegexWeight {
    column: String,
    regex: Regex,
}

impl Weight for ColumnRegexWeight {
    fn scorer(&self, reader: &SegmentReader, boost: Score) -> tantivy::Result<Box<dyn Scorer>> {
        let Some(column) = reader.fast_fields().str(&self.column)? else {
            return Ok(Box::new(EmptyScorer));
        };
        let (dictionary, ords) = column.into_parts();
        let mut matching = BitSet::with_max_value(dictionary.num_terms() as u32);
        let mut any = false;
        let mut terms = dictionary.search(&self.regex).into_stream()?;
        while terms.advance() {
            matching.insert(terms.term_ord() as u32);
            any = true;
        }
        if !any {
            return Ok(Box::new(EmptyScorer));
        }
        let mut docs = BitSet::with_max_value(reader.max_doc());
        for doc in 0..reader.max_doc() {
            if ords
                .values_for_doc(doc)
                .any(|ord| matching.contains(ord as u32))
            {
                docs.insert(doc);
            }
        }
        Ok(Box::new(ConstScorer::new(BitSetDocSet::from(docs), boost)))
    }

    fn explain(&self, reader: &SegmentReader, doc: DocId) -> tantivy::Result<Explanation> {
        let mut scorer = self.scorer(reader, 1.0)?;
        if scorer.seek(doc) != doc {
            return Err(TantivyError::InvalidArgument(format!(
                "document {doc} does not match"
            )));
        }
        Ok(Explanation::new("ColumnRegexQuery", 1.0))
    }
}
