//! Searchable topics: a background indexer per searchable topic that tails each partition's
//! log into the topic's tantivy index on this node (never on the produce path, never past the high watermark), and the
//! Elasticsearch query DSL subset answered over HTTP by `spate-http`.
//!
//! * [`record`]: decoding stored batches (every codec) and the `_source` of a hit.
//! * [`schema`] / [`document`]: the index's fields and how a record fills them.
//! * [`mapping`]: a topic's fields in Elasticsearch's terms (`_mapping`, `_field_caps`).
//! * [`dsl`]: the query DSL, parsed and compiled to tantivy queries (pure).
//! * [`request`]: the rest of a search request (from/size, sort, search_after, _source,
//!   highlight, aggregations).
//! * [`index`]: one topic's index on disk, with each partition's progress in the commit
//!   payload.
//! * [`directory`]: the index files, written without fsync (the log is their source).
//! * [`indexer`]: the background task that keeps an index up to date with its partitions.
//! * [`pool`]: the threads every indexer takes its steps on, and the bound on open writers.
//! * [`service`]: every searchable partition of the broker, and searches across them.
//! * [`zone`]: date_histogram's `time_zone` and local calendar units.

pub mod dates;
pub mod directory;
pub mod document;
pub mod dsl;
pub mod error;
pub mod filter_agg;
pub mod index;
pub mod indexer;
pub mod mapping;
pub mod metrics;
pub mod pool;
mod priority;
pub mod record;
pub mod request;
pub mod schema;
pub mod search;
pub mod service;
#[cfg(test)]
mod testing;
pub mod zone;

pub use error::SearchError;
pub use record::ValueDecoder;
pub use service::{SearchConfig, SearchService, SharedDecoder};
