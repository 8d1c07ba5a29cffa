//! One topic's index on this node (`<data>/search/<topic id>/`): the documents of every
//! partition of the topic this node holds a replica of, in one tantivy index with one writer.
//! A writer per partition did not scale: with hundreds of partitions each commit made a
//! segment per partition, writers were opened and closed in turn for a few records each, and
//! freshness fell to tens of seconds. Each partition's progress, the offset after the last
//! record it holds, travels in each commit's payload, so a commit makes documents and progress
//! durable together: after a crash indexing resumes exactly where the last commit ended, with
//! no record missing or indexed twice. A [`PartitionIndex`] is one partition's view of it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use spate_broker::search_config::SearchSettings;
use tantivy::indexer::IndexWriterOptions;
use tantivy::query::{BooleanQuery, Occur, Query, RangeQuery, TermQuery};
use tantivy::schema::IndexRecordOption;
use tantivy::{
    Directory, Index, IndexReader, IndexSettings, IndexWriter, ReloadPolicy, TantivyDocument, Term,
};

use crate::directory::IndexDirectory;
use crate::error::SearchError;
use crate::record::{LogRecord, ValueDecoder};
use crate::schema::IndexSchema;

/// Smallest indexing memory tantivy accepts for its one indexing thread.
pub const MIN_WRITER_MEMORY_BYTES: usize = 15_000_000;

/// What each commit records beside the documents.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Progress {
    /// Per partition, the offset of the next record to index.
    pub partitions: BTreeMap<i32, i64>,
    /// The settings the index was built under; another fingerprint means rebuild.
    pub fingerprint: String,
    /// The dynamic mapping of the documents committed (path -> type).
    #[serde(default)]
    pub mapping: BTreeMap<String, String>,
    /// Per partition, bounds of its documents' event times (epoch ms), for pruning.
    #[serde(default)]
    pub spans: BTreeMap<i32, (i64, i64)>,
}

/// A topic's index on this node: the searchable side (reader, schema) shared with queries,
/// and each partition's committed progress.
pub struct TopicIndex {
    /// Topic name (for `_index` in hits).
    pub topic: String,
    /// The settings it was built under.
    pub settings: SearchSettings,
    /// Fields.
    pub schema: IndexSchema,
    /// Where it lives.
    pub dir: PathBuf,
    index: Index,
    reader: IndexReader,
    /// Per partition, the offset after the last committed (searchable) record. This and the
    /// spans are swapped whole by the indexer, never locked: its threads run at idle
    /// priority, and a reader (the lag sampler on the runtime, searches) must never wait
    /// behind one.
    committed: ArcSwap<BTreeMap<i32, i64>>,
    /// Per partition, bounds of the event times of the documents it has had: only ever
    /// widened (retention and cuts leave them wide), so a search that prunes a partition by
    /// them never misses a document. A partition with none has no documents.
    spans: ArcSwap<BTreeMap<i32, (i64, i64)>>,
    /// Indexing memory of each writer made for it.
    writer_memory_bytes: usize,
    /// Woken at each commit (for `refresh=wait_for`).
    committed_notify: tokio::sync::Notify,
    /// Reads values in the schema registry's wire format (`search.value.format` schema or
    /// auto), when a registry runs in this process.
    pub decoder: Option<Arc<dyn ValueDecoder>>,
}

/// One partition of a [`TopicIndex`]: what a search of that partition reads.
pub struct PartitionIndex {
    /// Topic name.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The topic's index it is part of.
    pub index: Arc<TopicIndex>,
}

impl std::ops::Deref for PartitionIndex {
    type Target = TopicIndex;

    fn deref(&self) -> &TopicIndex {
        &self.index
    }
}

impl PartitionIndex {
    /// Offset after the last searchable record of this partition (-1 before its first
    /// commit).
    pub fn committed_offset(&self) -> i64 {
        self.index.committed_offset_of(self.partition)
    }

    /// Waits until the record at `offset` of this partition is searchable, at most `limit`;
    /// answers whether it is.
    pub async fn wait_searchable(&self, offset: i64, limit: std::time::Duration) -> bool {
        self.index
            .wait_searchable(self.partition, offset, limit)
            .await
    }
}

/// How an index was opened.
pub struct Opened {
    /// The index.
    pub index: TopicIndex,
    /// Where indexing of each partition resumes (partitions not named start at the log
    /// start).
    pub progress: BTreeMap<i32, i64>,
    /// Why it was rebuilt, if it was.
    pub rebuilt: Option<String>,
}

/// Whether an error opening an index says the index itself is damaged (rebuild it) rather
/// than that it could not be read now (keep it, try again).
fn is_damage(e: &tantivy::TantivyError) -> bool {
    use tantivy::TantivyError as E;
    matches!(
        e,
        E::DataCorruption(_) | E::SchemaError(_) | E::IncompatibleIndex(_)
    )
}

/// Whether an index's last commit is whole: every file it names opens and passes its
/// checksum; what is wrong if not.
fn torn(index: &Index) -> Option<String> {
    match index.validate_checksum() {
        Ok(bad) if !bad.is_empty() => {
            return Some(format!("{} files fail their checksums", bad.len()))
        }
        Ok(_) => {}
        Err(e) => return Some(e.to_string()),
    }
    // Opening a searcher opens every component file of every segment.
    let reader: tantivy::Result<IndexReader> = index
        .reader_builder()
        .reload_policy(ReloadPolicy::Manual)
        .try_into();
    reader.err().map(|e| e.to_string())
}

/// The progress of an index's last commit: `Ok(None)` when it has none.
fn progress_of(index: &Index) -> Result<Option<Progress>, String> {
    let metas = index.load_metas().map_err(|e| e.to_string())?;
    match metas.payload.as_deref() {
        None => Ok(None),
        Some(p) => serde_json::from_str(p)
            .map(Some)
            .map_err(|e| format!("reading the last commit's progress: {e}")),
    }
}

impl TopicIndex {
    /// A value read the way the topic's format says, schema'd values decoded with the
    /// registry's decoder: `Err` (why) for one that should have decoded and did not.
    pub fn read_value(&self, v: &[u8]) -> Result<Option<serde_json::Value>, String> {
        crate::record::read_value(v, self.settings.format, self.decoder.as_deref())
    }

    /// [`TopicIndex::read_value`], a value that did not decode read as text (`None`).
    pub fn parse_value(&self, v: &[u8]) -> Option<serde_json::Value> {
        self.read_value(v).unwrap_or(None)
    }

    /// The `_source` of a hit on record `r`.
    pub fn source(&self, r: &LogRecord) -> serde_json::Value {
        crate::record::source_decoded(r, self.settings.format, self.decoder.as_deref())
    }

    /// Partition `p`'s view of this index.
    pub fn partition(self: &Arc<Self>, p: i32) -> PartitionIndex {
        PartitionIndex {
            topic: self.topic.clone(),
            partition: p,
            index: self.clone(),
        }
    }

    /// Opens the index in `dir`, or creates it; an index that cannot be opened, has another
    /// schema or was built under other settings is deleted and created empty (the indexer then
    /// rebuilds it from the log).
    /// With `verify` (the broker did not stop cleanly: unsynced index files may be torn) an
    /// existing index is checked first: every file of its last commit must open and pass its
    /// checksum, else it is rebuilt.
    pub fn open(
        dir: &Path,
        topic: &str,
        settings: &SearchSettings,
        writer_memory_bytes: usize,
        verify: bool,
    ) -> Result<Opened, SearchError> {
        Self::open_on(dir, topic, settings, writer_memory_bytes, verify, &|d| {
            Ok(Box::new(IndexDirectory::open(d)?))
        })
    }

    /// [`TopicIndex::open`] with the files behind `directory` (tests put faults there).
    pub(crate) fn open_on(
        dir: &Path,
        topic: &str,
        settings: &SearchSettings,
        writer_memory_bytes: usize,
        verify: bool,
        directory: &dyn Fn(&Path) -> tantivy::Result<Box<dyn Directory>>,
    ) -> Result<Opened, SearchError> {
        let schema = IndexSchema::build(settings);
        let fingerprint = settings.fingerprint();
        let mut rebuilt = None;
        let mut existing = None;
        if dir.join("meta.json").exists() {
            match directory(dir).and_then(Index::open) {
                Ok(index) if index.schema() != schema.schema => {
                    rebuilt = Some("its schema differs from the topic's settings".to_string())
                }
                Ok(index) if verify && torn(&index).is_some() => {
                    let why = torn(&index).unwrap_or_default();
                    rebuilt = Some(format!("it is damaged after an unclean stop ({why})"))
                }
                Ok(index) => match progress_of(&index) {
                    Ok(Some(p)) if p.fingerprint == fingerprint => existing = Some((index, p)),
                    Ok(Some(_)) => rebuilt = Some("the topic's search settings changed".into()),
                    Ok(None)
                        if index
                            .searchable_segment_metas()
                            .map(|m| m.is_empty())
                            .unwrap_or(false) =>
                    {
                        existing = None
                    }
                    Ok(None) => rebuilt = Some("its progress record is missing".into()),
                    // Another layout's payload (an index per partition, before an index per
                    // topic) or a damaged one.
                    Err(e) => rebuilt = Some(e),
                },
                // Damage is rebuilt from the log; a failure to read (too many open files, an
                // I/O error) is not damage: the index stays, and opening is tried again later.
                Err(e) if is_damage(&e) => rebuilt = Some(format!("it cannot be opened ({e})")),
                Err(e) => {
                    return Err(SearchError::Index {
                        reason: format!("opening {}: {e}", dir.display()),
                    })
                }
            }
        } else if dir.exists()
            && std::fs::read_dir(dir)
                .map(|mut d| d.next().is_some())
                .unwrap_or(false)
        {
            rebuilt = Some("its metadata file is missing".into());
        }
        if existing.is_none() && dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|e| SearchError::Index {
                reason: format!("removing {}: {e}", dir.display()),
            })?;
        }
        let (index, progress, spans) = match existing {
            Some((index, p)) => {
                schema
                    .dynamic
                    .store(Arc::new(crate::mapping::TopicMapping::from_stored(
                        &p.mapping,
                    )));
                (index, p.partitions, p.spans)
            }
            None => {
                std::fs::create_dir_all(dir).map_err(|e| SearchError::Index {
                    reason: format!("creating {}: {e}", dir.display()),
                })?;
                let index = Index::create(
                    directory(dir)?,
                    schema.schema.clone(),
                    IndexSettings::default(),
                )?;
                (index, BTreeMap::new(), BTreeMap::new())
            }
        };
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        Ok(Opened {
            index: TopicIndex {
                topic: topic.to_string(),
                settings: settings.clone(),
                schema,
                dir: dir.to_path_buf(),
                index,
                reader,
                committed: ArcSwap::from_pointee(progress.clone()),
                spans: ArcSwap::from_pointee(spans),
                writer_memory_bytes,
                committed_notify: tokio::sync::Notify::new(),
                decoder: None,
            },
            progress,
            rebuilt,
        })
    }

    /// A searcher over the last commit.
    pub fn searcher(&self) -> tantivy::Searcher {
        self.reader.searcher()
    }

    /// The tantivy index (tokenizers, schema).
    pub fn tantivy(&self) -> &Index {
        &self.index
    }

    /// Offset after the last searchable record of partition `p` (-1 before its first
    /// commit).
    pub fn committed_offset_of(&self, p: i32) -> i64 {
        self.committed.load().get(&p).copied().unwrap_or(-1)
    }

    /// Widens each partition's event time bounds to hold the given ones (before the
    /// documents are committed, so a search never sees a document outside them). One writer:
    /// the topic's indexer.
    pub fn widen_spans(&self, widen: &BTreeMap<i32, (i64, i64)>) {
        if widen.is_empty() {
            return;
        }
        let mut spans = BTreeMap::clone(&self.spans.load());
        for (p, (lo, hi)) in widen {
            let span = spans.entry(*p).or_insert((*lo, *hi));
            *span = (span.0.min(*lo), span.1.max(*hi));
        }
        self.spans.store(Arc::new(spans));
    }

    /// Partition `p`'s event time bounds; `None` when it has had no documents.
    pub fn span(&self, p: i32) -> Option<(i64, i64)> {
        self.spans.load().get(&p).copied()
    }

    /// Partitions with committed progress.
    pub fn committed_partitions(&self) -> Vec<i32> {
        self.committed.load().keys().copied().collect()
    }

    /// Commits what `writer` holds with `progress` (per partition, the offset of the next
    /// record to index) and makes it searchable.
    pub fn commit(
        &self,
        writer: &mut IndexWriter,
        progress: BTreeMap<i32, i64>,
    ) -> Result<(), SearchError> {
        // A partition gone from the progress had its documents deleted with this commit.
        let mut spans = BTreeMap::clone(&self.spans.load());
        spans.retain(|p, _| progress.contains_key(p));
        let payload = serde_json::to_string(&Progress {
            partitions: progress.clone(),
            fingerprint: self.settings.fingerprint(),
            mapping: self.schema.dynamic.load().to_stored(),
            spans: spans.clone(),
        })
        .map_err(|e| SearchError::Index {
            reason: e.to_string(),
        })?;
        let mut prepared = writer.prepare_commit()?;
        prepared.set_payload(&payload);
        prepared.commit()?;
        self.spans.store(Arc::new(spans));
        self.reader.reload()?;
        self.committed.store(Arc::new(progress));
        self.committed_notify.notify_waiters();
        Ok(())
    }

    /// Waits until the record at `offset` of partition `p` is searchable, at most `limit`;
    /// answers whether it is.
    pub async fn wait_searchable(&self, p: i32, offset: i64, limit: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let woken = self.committed_notify.notified();
            tokio::pin!(woken);
            // Registered before the check, so a commit in between still wakes it.
            woken.as_mut().enable();
            if self.committed_offset_of(p) > offset {
                return true;
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                return self.committed_offset_of(p) > offset;
            }
        }
    }

    /// A writer for the indexer: one indexing thread and one merge thread (tantivy's default
    /// of four merge threads per writer does not scale to many topics).
    pub fn new_writer(&self) -> Result<IndexWriter, SearchError> {
        let options = IndexWriterOptions::builder()
            .memory_budget_per_thread(self.writer_memory_bytes.max(MIN_WRITER_MEMORY_BYTES))
            .num_worker_threads(1)
            .num_merge_threads(1)
            .build();
        Ok(self.index.writer_with_options(options)?)
    }

    /// After a writer failed and was rolled back: the progress of the last commit on disk,
    /// from which indexing must go on, made the searchable state again. It is read back from
    /// the disk rather than trusted from memory: a commit that failed after writing its
    /// metadata did commit.
    pub fn reload_progress(&self) -> Result<BTreeMap<i32, i64>, SearchError> {
        let progress = progress_of(&self.index)
            .map_err(|reason| SearchError::Index { reason })?
            .map(|p| p.partitions)
            .unwrap_or_default();
        self.reader.reload()?;
        self.committed.store(Arc::new(progress.clone()));
        self.committed_notify.notify_waiters();
        Ok(progress)
    }

    /// Partition `p`'s documents whose offset lies in `offsets`.
    fn of_partition(&self, p: i32, offsets: Option<RangeQuery>) -> Box<dyn Query> {
        let partition: Box<dyn Query> = Box::new(TermQuery::new(
            Term::from_field_i64(self.schema.partition, i64::from(p)),
            IndexRecordOption::Basic,
        ));
        match offsets {
            None => partition,
            Some(r) => Box::new(BooleanQuery::new(vec![
                (Occur::Must, partition),
                (Occur::Must, Box::new(r)),
            ])),
        }
    }

    /// Queues the deletion of every document of partition `p` with an offset below `offset`
    /// (retention).
    pub fn delete_below(
        &self,
        writer: &IndexWriter,
        p: i32,
        offset: i64,
    ) -> Result<(), SearchError> {
        let q = RangeQuery::new(
            std::ops::Bound::Unbounded,
            std::ops::Bound::Excluded(Term::from_field_i64(self.schema.offset, offset)),
        );
        writer.delete_query(self.of_partition(p, Some(q)))?;
        Ok(())
    }

    /// Queues the deletion of every document of partition `p` at or above `offset` (a
    /// truncated log).
    pub fn delete_from(
        &self,
        writer: &IndexWriter,
        p: i32,
        offset: i64,
    ) -> Result<(), SearchError> {
        let q = RangeQuery::new(
            std::ops::Bound::Included(Term::from_field_i64(self.schema.offset, offset)),
            std::ops::Bound::Unbounded,
        );
        writer.delete_query(self.of_partition(p, Some(q)))?;
        Ok(())
    }

    /// Queues the deletion of every document of partition `p` (its replica left this node).
    pub fn delete_partition(&self, writer: &IndexWriter, p: i32) -> Result<(), SearchError> {
        writer.delete_query(self.of_partition(p, None))?;
        Ok(())
    }

    /// Adds one document.
    pub fn add(&self, writer: &IndexWriter, doc: TantivyDocument) -> Result<(), SearchError> {
        writer.add_document(doc)?;
        Ok(())
    }

    /// Bytes the index takes on disk.
    pub fn size_bytes(&self) -> u64 {
        std::fs::read_dir(&self.dir)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> SearchSettings {
        crate::testing::json_settings()
    }

    /// Knows schema 1: its payload is JSON text after the header.
    struct JsonAfterHeader;

    impl ValueDecoder for JsonAfterHeader {
        fn decode(&self, value: &[u8]) -> Option<Result<serde_json::Value, String>> {
            (value.get(..5) == Some(&[0, 0, 0, 0, 1]))
                .then(|| serde_json::from_slice(&value[5..]).map_err(|e| e.to_string()))
        }
    }

    #[test]
    fn schema_values_are_mapped_by_field_and_undecodable_ones_counted_as_text() {
        let dir = tempfile::tempdir().unwrap();
        let settings = SearchSettings {
            format: spate_broker::search_config::ValueFormat::Schema,
            ..settings()
        };
        let mut opened = TopicIndex::open(
            &dir.path().join("p0"),
            "t",
            &settings,
            MIN_WRITER_MEMORY_BYTES,
            false,
        )
        .unwrap();
        opened.index.decoder = Some(std::sync::Arc::new(JsonAfterHeader));
        let index = opened.index;
        let record = |value: &[u8]| LogRecord {
            offset: 0,
            timestamp: 0,
            key: None,
            value: Some(bytes::Bytes::copy_from_slice(value)),
            headers: Vec::new(),
        };
        let mut mapping = crate::mapping::TopicMapping::default();
        let mut build = |r: &LogRecord| {
            crate::document::build_counted(
                &index.schema,
                &mut mapping,
                &index.settings,
                index.decoder.as_deref(),
                0,
                r,
            )
            .1
        };
        let good = record(b"\0\0\0\0\x01{\"user\": {\"name\": \"ann\"}, \"n\": 3}");
        assert_eq!(build(&good).undecodable, 0);
        assert_eq!(
            index.source(&good),
            serde_json::json!({"user": {"name": "ann"}, "n": 3})
        );
        for bad in [
            &b"\0\0\0\0\x02{}"[..],
            b"\0\0\0\0\x01{cut",
            b"no header",
            b"\0\x01",
        ] {
            assert_eq!(build(&record(bad)).undecodable, 1, "{bad:?}");
        }
        assert!(mapping.fields.contains_key("user.name"));
    }

    #[test]
    fn after_an_unclean_stop_a_torn_index_file_is_found_and_the_index_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("p0");
        let open = |verify| {
            TopicIndex::open(&at, "t", &settings(), MIN_WRITER_MEMORY_BYTES, verify).unwrap()
        };
        let opened = open(false);
        let mut w = opened.index.new_writer().unwrap();
        for i in 0..50 {
            let r = crate::record::LogRecord {
                offset: i,
                timestamp: 0,
                key: None,
                value: Some(bytes::Bytes::from(format!(
                    "{{\"n\": {i}, \"msg\": \"word{i}\"}}"
                ))),
                headers: Vec::new(),
            };
            let doc = crate::document::build(&opened.index.schema, &settings(), 0, &r);
            opened.index.add(&w, doc).unwrap();
        }
        opened
            .index
            .commit(&mut w, BTreeMap::from([(0, 50)]))
            .unwrap();
        drop(w);
        drop(opened);
        // What an OS crash can leave of unsynced writes: a file of the last commit with other
        // bytes than were written.
        let victim = std::fs::read_dir(&at)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "idx" || x == "term"))
            .max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
            .expect("a segment file");
        let mut bytes = std::fs::read(&victim).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(&victim, &bytes).unwrap();
        // After a clean stop nothing is checked; after an unclean one the damage is found.
        assert!(open(false).rebuilt.is_none());
        let reopened = open(true);
        assert!(
            reopened
                .rebuilt
                .as_deref()
                .is_some_and(|w| w.contains("unclean")),
            "{:?}",
            reopened.rebuilt
        );
        assert!(
            reopened.progress.is_empty(),
            "indexed again from the log start"
        );
    }

    #[test]
    fn an_index_that_cannot_be_read_now_is_kept_and_a_damaged_one_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("p0");
        // An I/O failure opening it (here: meta.json is a directory, EISDIR; in life EMFILE
        // or EIO): an error, and nothing deleted.
        std::fs::create_dir_all(at.join("meta.json")).unwrap();
        std::fs::write(at.join("keep"), b"x").unwrap();
        let err = TopicIndex::open(&at, "t", &settings(), MIN_WRITER_MEMORY_BYTES, false)
            .err()
            .expect("an error");
        assert!(err.to_string().contains("opening"), "{err}");
        assert!(at.join("keep").exists(), "the index directory was deleted");
        // Damage (meta.json that is not an index's): rebuilt empty.
        std::fs::remove_dir_all(&at).unwrap();
        std::fs::create_dir_all(&at).unwrap();
        std::fs::write(at.join("meta.json"), b"{not json").unwrap();
        let opened = TopicIndex::open(&at, "t", &settings(), MIN_WRITER_MEMORY_BYTES, false)
            .expect("rebuilt");
        assert!(opened.rebuilt.is_some());
        assert!(opened.progress.is_empty());
    }
}
