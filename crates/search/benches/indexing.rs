//! Indexing throughput of one partition on the realistic log corpus of
//! `scripts/search_corpus.py`: record -> document -> tantivy, then the final commit and the
//! merges it leaves. Prints MB/s of record bytes per second of wall time and per second of
//! process CPU (every tantivy thread included); asserts nothing.
//!
//!   cargo bench -p spate-search --bench indexing          (COUNT, default 200,000 records)
//!
//! The corpus is written once to `target/search-corpus-<COUNT>.ndjson` by the Python
//! generator, so this bench and `scripts/bench-search-capacity.sh` index the same documents.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use bytes::Bytes;
use spate_broker::search_config::{
    SearchSettings, ValueFormat, DEFAULT_MAX_FIELDS, DEFAULT_TIME_FIELD,
};
use spate_search::document;
use spate_search::index::TopicIndex;
use spate_search::record::LogRecord;

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn corpus(count: usize) -> Vec<Bytes> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = root.join(format!("target/search-corpus-{count}.ndjson"));
    if !path.exists() {
        let out = Command::new("python3")
            .arg(root.join("scripts/search_corpus.py"))
            .args(["sample", &count.to_string()])
            .output()
            .expect("python3 scripts/search_corpus.py");
        assert!(out.status.success(), "corpus generator failed");
        std::fs::write(&path, &out.stdout).expect("writing the corpus");
    }
    std::fs::read_to_string(&path)
        .expect("reading the corpus")
        .lines()
        .map(|l| Bytes::copy_from_slice(l.as_bytes()))
        .collect()
}

fn main() {
    let count: usize = std::env::var("COUNT")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(200_000);
    let memory: usize = std::env::var("WRITER_MB")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(32)
        << 20;
    let values = corpus(count);
    let bytes: usize = values.iter().map(|v| v.len()).sum();
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = SearchSettings {
        enabled: true,
        format: ValueFormat::Json,
        fields: Vec::new(),
        store_value: false,
        max_fields: DEFAULT_MAX_FIELDS,
        time_field: DEFAULT_TIME_FIELD.into(),
    };
    let opened = TopicIndex::open(dir.path(), "bench", &settings, memory, false).expect("open");
    let index = opened.index;
    let mut writer = index.new_writer().expect("writer");
    let (c0, t0) = (cpu_seconds(), Instant::now());
    let mut built = std::time::Duration::ZERO;
    for (i, v) in values.into_iter().enumerate() {
        let r = LogRecord {
            offset: i as i64,
            timestamp: 1_700_000_000_000 + i as i64,
            key: None,
            value: Some(v),
            headers: Vec::new(),
        };
        let b = Instant::now();
        let doc = document::build(&index.schema, &settings, 0, &r);
        built += b.elapsed();
        index.add(&writer, doc).expect("add");
    }
    index
        .commit(&mut writer, [(0, count as i64)].into())
        .expect("commit");
    writer.wait_merging_threads().expect("merges");
    let (cpu, wall) = (cpu_seconds() - c0, t0.elapsed().as_secs_f64());
    let mb = bytes as f64 / 1e6;
    let size: u64 = walk(dir.path());
    println!(
        "indexing: {count} records, {mb:.1} MB in {wall:.2} s wall, {cpu:.2} s CPU \
         (building documents {:.2} s)",
        built.as_secs_f64()
    );
    println!(
        "indexing: {:.1} MB/s wall, {:.1} MB/s per core, index {:.2} bytes per record byte",
        mb / wall,
        mb / cpu,
        size as f64 / bytes as f64
    );
}

fn walk(p: &std::path::Path) -> u64 {
    std::fs::read_dir(p)
        .map(|d| {
            d.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => walk(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}
