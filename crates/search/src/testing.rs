//! What unit tests of the indexer and the service share: a broker in a temp dir, appending
//! records, and an index directory whose writes can be made to fail.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use spate_broker::{Broker, Partition};
use tantivy::directory::error::{DeleteError, LockError, OpenReadError, OpenWriteError};
use tantivy::directory::{
    DirectoryLock, FileHandle, Lock, MmapDirectory, WatchCallback, WatchHandle, WritePtr,
};
use tantivy::Directory;

/// Search settings of a `json` topic with no declared fields, as most tests index.
pub fn json_settings() -> spate_broker::search_config::SearchSettings {
    spate_broker::search_config::SearchSettings {
        enabled: true,
        format: spate_broker::search_config::ValueFormat::Json,
        fields: Vec::new(),
        store_value: false,
        max_fields: 1000,
        time_field: "@timestamp".into(),
    }
}

/// A standalone broker with its data under `dir`.
pub fn broker(dir: &tempfile::TempDir) -> Arc<Broker> {
    Broker::open(spate_broker::BrokerConfig::new(
        dir.path().join("data"),
        "127.0.0.1",
        9092,
    ))
    .unwrap()
    .0
}

/// Appends one batch of these values to `p`.
pub fn append(p: &Partition, values: &[&str]) {
    let records: Vec<spate_protocol::batch::NewRecord> = values
        .iter()
        .map(|v| spate_protocol::batch::NewRecord {
            value: Some(bytes::Bytes::copy_from_slice(v.as_bytes())),
            ..Default::default()
        })
        .collect();
    let batch =
        spate_protocol::batch::build(&records, None, spate_protocol::records::Compression::None)
            .unwrap();
    let h = spate_protocol::batch::BatchHeader::parse(&batch).unwrap();
    p.append(&batch, &h, None).unwrap();
}

/// An index directory on disk whose writes fail with ENOSPC while `full` is set, as on a
/// full disk (reads and the writer lock keep working).
#[derive(Debug, Clone)]
pub struct FullDisk {
    inner: MmapDirectory,
    /// Writes fail while this is set.
    pub full: Arc<AtomicBool>,
}

impl FullDisk {
    /// The directory at `path`, not full.
    pub fn open(path: &Path, full: Arc<AtomicBool>) -> tantivy::Result<Self> {
        Ok(Self {
            inner: MmapDirectory::open(path)?,
            full,
        })
    }

    fn check(&self) -> io::Result<()> {
        if self.full.load(Ordering::SeqCst) {
            Err(io::Error::from_raw_os_error(28))
        } else {
            Ok(())
        }
    }
}

impl Directory for FullDisk {
    fn get_file_handle(&self, path: &Path) -> Result<Arc<dyn FileHandle>, OpenReadError> {
        self.inner.get_file_handle(path)
    }
    fn delete(&self, path: &Path) -> Result<(), DeleteError> {
        self.inner.delete(path)
    }
    fn exists(&self, path: &Path) -> Result<bool, OpenReadError> {
        self.inner.exists(path)
    }
    fn open_write(&self, path: &Path) -> Result<WritePtr, OpenWriteError> {
        self.check()
            .map_err(|e| OpenWriteError::wrap_io_error(e, PathBuf::from(path)))?;
        self.inner.open_write(path)
    }
    fn atomic_read(&self, path: &Path) -> Result<Vec<u8>, OpenReadError> {
        self.inner.atomic_read(path)
    }
    fn atomic_write(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        self.check()?;
        self.inner.atomic_write(path, data)
    }
    fn sync_directory(&self) -> io::Result<()> {
        self.inner.sync_directory()
    }
    fn acquire_lock(&self, lock: &Lock) -> Result<DirectoryLock, LockError> {
        self.inner.acquire_lock(lock)
    }
    fn watch(&self, watch_callback: WatchCallback) -> tantivy::Result<WatchHandle> {
        self.inner.watch(watch_callback)
    }
}

/// Searchable partitions of a new topic `name` in `dir`: partition `i` holds `partitions[i]`
/// (JSON values, one record each), indexed and committed before this returns.
pub fn indexed(
    dir: &tempfile::TempDir,
    name: &str,
    partitions: &[&[&str]],
) -> Vec<crate::search::Target> {
    let broker = broker(dir);
    let topic = broker
        .topics
        .create(
            name,
            partitions.len() as i32,
            spate_broker::TopicConfig::default(),
            false,
        )
        .unwrap()
        .unwrap();
    let settings = json_settings();
    let index = Arc::new(
        crate::index::TopicIndex::open(
            &dir.path().join(format!("index-{name}")),
            name,
            &settings,
            crate::index::MIN_WRITER_MEMORY_BYTES,
            false,
        )
        .unwrap()
        .index,
    );
    let mut writer = index.new_writer().unwrap();
    let mut progress = std::collections::BTreeMap::new();
    let mut spans = std::collections::BTreeMap::new();
    let mut mapping = crate::mapping::TopicMapping::default();
    let targets = partitions
        .iter()
        .enumerate()
        .map(|(i, values)| {
            let p = topic.partition(i as i32).unwrap();
            append(&p, values);
            let read = p.read(0, 1 << 20, true).unwrap();
            let records = crate::record::decode_batches(&read.records, 0).records;
            for r in &records {
                let (doc, built) = crate::document::build_counted(
                    &index.schema,
                    &mut mapping,
                    &settings,
                    None,
                    i as i32,
                    r,
                );
                let at = built.event_ms;
                let span = spans.entry(i as i32).or_insert((at, at));
                *span = (span.0.min(at), span.1.max(at));
                index.add(&writer, doc).unwrap();
            }
            progress.insert(i as i32, records.len() as i64);
            crate::search::Target {
                index: Arc::new(index.partition(i as i32)),
                partition: p,
            }
        })
        .collect();
    index.schema.dynamic.store(Arc::new(mapping));
    index.widen_spans(&spans);
    index.commit(&mut writer, progress).unwrap();
    targets
}
