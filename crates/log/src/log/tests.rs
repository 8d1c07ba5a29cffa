use super::*;
use crate::config::FsyncPolicy;
use spate_protocol::batch::{build, Batches, NewRecord};
use spate_protocol::records::Compression;
use std::io::Write;
use std::time::Duration;

fn batch(n: usize, ts: i64, value_len: usize) -> Vec<u8> {
    let records: Vec<NewRecord> = (0..n)
        .map(|i| NewRecord {
            key: None,
            value: Some(Bytes::from(vec![b'x'; value_len])),
            timestamp: ts + i as i64,
        })
        .collect();
    build(&records, None, Compression::None).unwrap().to_vec()
}

fn small_segments() -> LogConfig {
    LogConfig {
        segment_bytes: 1024,
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

/// Opens (or reopens) a log, returning the repairs recovery made.
fn open_with_notes(dir: &Path, config: LogConfig) -> (Log, Vec<String>) {
    Log::open(dir, config, Flusher::start(FsyncPolicy::Never).unwrap(), 0).unwrap()
}

fn open(dir: &Path, config: LogConfig) -> Log {
    open_with_notes(dir, config).0
}

/// Offsets of every batch in a read result.
fn offsets(r: &ReadResult) -> Vec<(i64, i64)> {
    Batches::new(&r.records)
        .map(|(_, h)| (h.base_offset, h.last_offset()))
        .collect()
}

fn fill(log: &mut Log, batches: usize, per_batch: usize) {
    for i in 0..batches {
        let b = batch(per_batch, 1_000 + (i * per_batch) as i64, 50);
        log.append(&b, 3, None, 0).unwrap();
    }
}

#[test]
fn append_assigns_contiguous_offsets_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    let a = log.append(&batch(3, 10, 10), 0, None, 0).unwrap();
    let b = log.append(&batch(2, 20, 10), 0, None, 0).unwrap();
    assert_eq!((a.base_offset, a.last_offset), (0, 2));
    assert_eq!((b.base_offset, b.last_offset), (3, 4));
    assert_eq!(log.end_offset(), 5);
    let r = log.read(0, 1 << 20, 5, true).unwrap();
    assert_eq!(offsets(&r), vec![(0, 2), (3, 4)]);
    // A read from the middle of a batch starts at that batch.
    let r = log.read(4, 1 << 20, 5, true).unwrap();
    assert_eq!(offsets(&r), vec![(3, 4)]);
    // Stored batches still pass CRC: assignment does not touch covered bytes.
    for (at, h) in Batches::new(&r.records) {
        spate_protocol::batch::validate(&r.records[at..at + h.total_len()]).unwrap();
    }
}

#[test]
fn read_honours_max_bytes_but_returns_at_least_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    fill(&mut log, 4, 5);
    let one = log.read(0, 1 << 20, 100, true).unwrap().records.len() / 4;
    let r = log.read(0, one * 2 + 10, 100, true).unwrap();
    assert_eq!(offsets(&r).len(), 2);
    let r = log.read(0, 10, 100, true).unwrap();
    assert_eq!(offsets(&r), vec![(0, 4)]);
    let r = log.read(0, 10, 100, false).unwrap();
    assert!(r.records.is_empty());
}

#[test]
fn read_stops_below_high_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    fill(&mut log, 3, 2);
    let r = log.read(0, 1 << 20, 4, true).unwrap();
    assert_eq!(offsets(&r), vec![(0, 1), (2, 3)]);
    assert!(log.read(4, 1 << 20, 4, true).unwrap().records.is_empty());
}

#[test]
fn read_out_of_range_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    fill(&mut log, 1, 2);
    assert!(matches!(
        log.read(3, 100, 2, true),
        Err(LogError::OffsetOutOfRange {
            offset: 3,
            start: 0,
            end: 2
        })
    ));
    assert!(log.read(2, 100, 2, true).unwrap().records.is_empty());
}

#[test]
fn rolls_by_size_and_reads_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), small_segments());
    fill(&mut log, 40, 3);
    assert!(log.segment_count() > 5, "{} segments", log.segment_count());
    let mut next = 0;
    while next < log.end_offset() {
        let r = log.read(next, 300, i64::MAX, true).unwrap();
        let o = offsets(&r);
        assert!(!o.is_empty());
        assert!(o[0].0 <= next && next <= o[0].1);
        next = o.last().unwrap().1 + 1;
    }
    assert_eq!(next, 120);
}

#[test]
fn rolls_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_ms: 100,
        ..LogConfig::default()
    };
    let mut log = open(dir.path(), config);
    log.append(&batch(1, 0, 1), 0, None, 0).unwrap();
    log.append(&batch(1, 0, 1), 0, None, 50).unwrap();
    assert_eq!(log.segment_count(), 1);
    log.append(&batch(1, 0, 1), 0, None, 150).unwrap();
    assert_eq!(log.segment_count(), 2);
}

#[test]
fn reopen_recovers_every_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), small_segments());
    fill(&mut log, 30, 2);
    let segments = log.segment_count();
    drop(log);
    let (log, notes) = open_with_notes(dir.path(), small_segments());
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(log.end_offset(), 60);
    assert_eq!(log.segment_count(), segments);
    let r = log.read(33, 1 << 20, 60, true).unwrap();
    assert_eq!(offsets(&r)[0], (32, 33));
}

#[test]
fn recovery_cuts_a_batch_torn_in_the_middle() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    fill(&mut log, 3, 4);
    drop(log);
    let path = dir.path().join(segment::file_name(0, "log"));
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 7).unwrap();
    let (log, notes) = open_with_notes(dir.path(), LogConfig::default());
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(log.end_offset(), 8);
    let mut log = log;
    let next = log.append(&batch(1, 0, 1), 3, None, 0).unwrap();
    assert_eq!(next.base_offset, 8);
}

#[test]
fn recovery_cuts_at_a_corrupt_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    fill(&mut log, 3, 4);
    let second = log.read(4, 1 << 20, 12, true).unwrap();
    let first_len = log.read(0, 1 << 20, 12, true).unwrap().records.len() - second.records.len();
    drop(log);
    let path = dir.path().join(segment::file_name(0, "log"));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[first_len + 70] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let (log, notes) = open_with_notes(dir.path(), LogConfig::default());
    assert!(notes[0].contains("CRC"), "{notes:?}");
    assert_eq!(log.end_offset(), 4);
}

#[test]
fn damaged_sealed_index_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), small_segments());
    fill(&mut log, 30, 2);
    drop(log);
    let ix = dir.path().join(segment::file_name(0, "index"));
    std::fs::OpenOptions::new()
        .append(true)
        .open(&ix)
        .unwrap()
        .write_all(&[1, 2, 3])
        .unwrap();
    let (log, notes) = open_with_notes(dir.path(), small_segments());
    assert!(notes.iter().any(|n| n.contains("rebuilt")), "{notes:?}");
    let r = log.read(1, 1 << 20, 60, true).unwrap();
    assert_eq!(offsets(&r)[0], (0, 1));
}

#[test]
fn offset_for_timestamp_finds_first_record_at_or_after() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), small_segments());
    // Batch i holds timestamps 1000 + 3i .. 1000 + 3i + 2 at offsets 3i .. 3i + 2.
    fill(&mut log, 30, 3);
    let hit = log.offset_for_timestamp(1_040).unwrap().unwrap();
    assert_eq!((hit.offset, hit.timestamp), (40, 1_040));
    let hit = log.offset_for_timestamp(0).unwrap().unwrap();
    assert_eq!(hit.offset, 0);
    assert!(log.offset_for_timestamp(5_000).unwrap().is_none());
    let max = log.max_timestamp().unwrap().unwrap();
    assert_eq!((max.offset, max.timestamp), (89, 1_089));
}

#[test]
fn log_append_time_stamps_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    log.append(&batch(2, 5, 1), 0, Some(77_000), 0).unwrap();
    let r = log.read(0, 1 << 20, 2, true).unwrap();
    let h = spate_protocol::batch::validate(&r.records).unwrap();
    assert!(h.is_log_append_time());
    assert_eq!(h.max_timestamp, 77_000);
}

#[test]
fn retention_by_bytes_deletes_oldest_whole_segments() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), small_segments());
    fill(&mut log, 40, 3);
    let before = log.segment_count();
    let mut config = small_segments();
    config.retention_bytes = 2048;
    log.set_config(config);
    let removed = log.enforce_retention(0).unwrap();
    assert!(removed > 0 && removed < before);
    assert!(log.size_bytes() >= 2048 - 1024);
    assert!(log.start_offset() > 0);
    assert!(matches!(
        log.read(0, 100, 200, true),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    let r = log.read(log.start_offset(), 1 << 20, 200, true).unwrap();
    assert_eq!(offsets(&r)[0].0, log.start_offset());
}

#[test]
fn retention_by_time_keeps_the_active_segment() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_segments();
    config.retention_ms = 10;
    let mut log = open(dir.path(), config);
    fill(&mut log, 40, 3);
    let end = log.end_offset();
    log.enforce_retention(1_000_000).unwrap();
    assert_eq!(log.segment_count(), 1);
    assert_eq!(log.end_offset(), end);
}

#[test]
fn truncate_to_removes_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), small_segments());
    fill(&mut log, 40, 3);
    assert_eq!(log.truncate_to(30, 0).unwrap(), 30);
    assert_eq!(log.end_offset(), 30);
    let next = log.append(&batch(2, 0, 1), 3, None, 0).unwrap();
    assert_eq!(next.base_offset, 30);
}

#[test]
fn always_policy_publishes_durable_offset_after_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let flusher = Flusher::start(FsyncPolicy::Always).unwrap();
    let (mut log, _) = Log::open(dir.path(), LogConfig::default(), flusher.clone(), 0).unwrap();
    let mut durable = log.durable_offset();
    let info = log.append(&batch(4, 0, 10), 0, None, 0).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(10),
            crate::wait_durable(&mut durable, info.last_offset + 1),
        )
        .await
        .unwrap()
        .unwrap();
    });
    flusher.shutdown();
}

#[test]
fn clean_shutdown_lets_the_next_start_skip_the_scan() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), small_segments());
    fill(&mut log, 30, 2);
    log.close().unwrap();
    drop(log);
    // Damage a byte inside the last batch: a scan would cut the log there, so an intact end
    // offset shows the scan was skipped and the saved state used.
    damage_last_batch(dir.path());
    let (mut log, notes) = open_with_notes(dir.path(), small_segments());
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(log.end_offset(), 60);
    assert_eq!(
        std::fs::read(dir.path().join(CLEAN_MARKER)).unwrap(),
        b"",
        "the marker is used once"
    );
    let r = log.read(59, 1 << 20, 60, true).unwrap();
    assert_eq!(offsets(&r), vec![(58, 59)]);
    let next = log.append(&batch(1, 0, 1), 3, None, 0).unwrap();
    assert_eq!(next.base_offset, 60);
    // Without a marker the next start scans again and finds the damage.
    drop(log);
    let (log, notes) = open_with_notes(dir.path(), small_segments());
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(log.end_offset(), 58);
}

/// The last `.log` file of `dir` with its last-batch byte flipped: only a scan notices.
fn damage_last_batch(dir: &Path) {
    let active = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .max()
        .unwrap();
    let mut bytes = std::fs::read(&active).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0xff;
    std::fs::write(&active, &bytes).unwrap();
}

#[test]
fn a_torn_or_old_format_shutdown_marker_falls_back_to_the_scan() {
    let marker_text = |dir: &Path| std::fs::read_to_string(dir.join(CLEAN_MARKER)).unwrap();
    for tear in [
        // Fields intact, digest not: a marker this version did not write whole.
        |t: &str| {
            let (fields, digest) = t.trim_end().rsplit_once(' ').unwrap();
            let flipped = if digest.ends_with('0') { '1' } else { '0' };
            format!("{fields} {}{flipped}\n", &digest[..digest.len() - 1])
        },
        // Cut short by a crash mid-write.
        |t: &str| t[..t.len() / 2].to_string(),
        // The format before the digest: end offset and size only.
        |t: &str| t.rsplit_once(' ').unwrap().0.to_string() + "\n",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path(), small_segments());
        fill(&mut log, 30, 2);
        log.close().unwrap();
        drop(log);
        let torn = tear(&marker_text(dir.path()));
        assert_ne!(torn, marker_text(dir.path()));
        std::fs::write(dir.path().join(CLEAN_MARKER), &torn).unwrap();
        damage_last_batch(dir.path());
        let (log, notes) = open_with_notes(dir.path(), small_segments());
        assert_eq!(notes.len(), 1, "{torn:?} was trusted: {notes:?}");
        assert_eq!(log.end_offset(), 58, "{torn:?}: the scan cut the damage");
    }
}

#[test]
fn shutdown_rewrites_the_marker_and_the_active_indexes_in_the_same_files() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), small_segments());
    fill(&mut log, 30, 2);
    log.close().unwrap();
    drop(log);
    let inodes = |dir: &Path| -> Vec<(String, u64)> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                (name, e.metadata().unwrap().ino())
            })
            .collect();
        v.sort();
        v
    };
    let before = inodes(dir.path());
    for _ in 0..3 {
        let mut log = open(dir.path(), small_segments());
        log.close().unwrap();
        drop(log);
    }
    // No file was replaced by a new one: ext4 allocates no inode for a shutdown.
    assert_eq!(inodes(dir.path()), before);
    let (log, notes) = open_with_notes(dir.path(), small_segments());
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(log.end_offset(), 60);
}

#[test]
fn a_stale_shutdown_marker_falls_back_to_the_scan() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    fill(&mut log, 3, 2);
    log.close().unwrap();
    // Written after the marker, as a late request during shutdown would.
    log.append(&batch(2, 0, 1), 3, None, 0).unwrap();
    drop(log);
    let (log, notes) = open_with_notes(dir.path(), LogConfig::default());
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(log.end_offset(), 8, "the scan found the late batch too");
}

#[test]
fn advancing_the_start_hides_records_below_it_deletes_whole_segments_and_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), small_segments());
    fill(&mut log, 20, 5);
    let segments_before = log.segment_count();
    assert!(segments_before > 3);
    // 37 falls inside the batch holding 35..=39.
    assert_eq!(log.advance_start(37).unwrap(), 37);
    assert_eq!(log.start_offset(), 37);
    assert!(log.segment_count() < segments_before);
    assert!(matches!(
        log.read(36, 1 << 20, 100, true),
        Err(LogError::OffsetOutOfRange { start: 37, .. })
    ));
    // A read at the start returns the whole batch holding it; clients skip what is below.
    let r = log.read(37, 1 << 20, 100, true).unwrap();
    assert_eq!(offsets(&r)[0], (35, 39));
    // Moving backwards changes nothing; past the end is refused.
    assert_eq!(log.advance_start(10).unwrap(), 37);
    assert!(matches!(
        log.advance_start(101),
        Err(LogError::OffsetOutOfRange { offset: 101, .. })
    ));
    let ts = log.offset_for_timestamp(0).unwrap().unwrap();
    assert_eq!(ts.offset, 37);
    drop(log);
    let log = open(dir.path(), small_segments());
    assert_eq!(log.start_offset(), 37);
    assert_eq!(log.end_offset(), 100);
}

#[test]
fn advancing_the_start_to_the_end_keeps_the_active_segment_for_appends() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), small_segments());
    fill(&mut log, 10, 5);
    assert_eq!(log.advance_start(50).unwrap(), 50);
    assert_eq!(log.segment_count(), 1);
    assert_eq!(log.read(50, 1 << 20, 50, true).unwrap().records.len(), 0);
    let a = log.append(&batch(2, 5_000, 10), 3, None, 0).unwrap();
    assert_eq!(a.base_offset, 50);
    assert_eq!(
        offsets(&log.read(50, 1 << 20, 52, true).unwrap()),
        vec![(50, 51)]
    );
}

#[test]
fn deleting_segments_whose_seals_are_still_queued_keeps_the_log_in_service() {
    // Many tiny segments rolled back to back leave seals queued on the flusher; deleting
    // those segments (DeleteRecords, retention) must wait for them, not fail them.
    for round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path(), small_segments());
        fill(&mut log, 30, 5);
        if round % 2 == 0 {
            log.advance_start(140).unwrap();
        } else {
            let mut config = small_segments();
            config.retention_bytes = 1;
            log.set_config(config);
            log.enforce_retention(0).unwrap();
        }
        assert!(
            !log.is_failed(),
            "round {round}: the log went out of service"
        );
        let a = log.append(&batch(1, 9_000, 10), 3, None, 0).unwrap();
        assert_eq!(a.base_offset, 150);
    }
}

#[test]
fn an_empty_replica_started_inside_a_batch_takes_the_whole_batch_and_keeps_its_start() {
    let leader_dir = tempfile::tempdir().unwrap();
    let mut leader = open(leader_dir.path(), LogConfig::default());
    leader.append(&batch(5, 10, 10), 2, None, 0).unwrap();
    leader.append(&batch(3, 20, 10), 2, None, 0).unwrap();
    // DeleteRecords to offset 2, inside the first batch.
    assert_eq!(leader.advance_start(2).unwrap(), 2);
    let sent = leader.read(2, 1 << 20, leader.end_offset(), true).unwrap();
    assert_eq!(offsets(&sent), vec![(0, 4), (5, 7)]);

    let dir = tempfile::tempdir().unwrap();
    let mut replica = open(dir.path(), LogConfig::default());
    replica.reset_to(2, 0).unwrap();
    for (pos, h) in Batches::new(&sent.records) {
        replica
            .append_replica(&sent.records[pos..pos + h.total_len()], 0)
            .unwrap();
    }
    assert_eq!((replica.start_offset(), replica.end_offset()), (2, 8));
    assert_eq!(replica.epochs().first().map(|e| e.epoch), Some(2));
    drop(replica);
    let replica = open(dir.path(), LogConfig::default());
    assert_eq!((replica.start_offset(), replica.end_offset()), (2, 8));

    // A batch that does not reach the empty log's start, or a gap, is still refused.
    let dir = tempfile::tempdir().unwrap();
    let mut replica = open(dir.path(), LogConfig::default());
    replica.reset_to(6, 0).unwrap();
    let first = Batches::new(&sent.records).next().unwrap().1.total_len();
    assert!(matches!(
        replica.append_replica(&sent.records[..first], 0),
        Err(LogError::OffsetMismatch {
            expected: 6,
            found: 0
        })
    ));
}

#[test]
fn recovery_keeps_a_log_with_gaps_between_batches_and_reads_across_them() {
    // What compaction leaves: whole batches gone, offsets kept.
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    fill(&mut log, 3, 4);
    let all = log.read(0, 1 << 20, 12, true).unwrap().records;
    drop(log);
    let batches: Vec<&[u8]> = Batches::new(&all)
        .map(|(pos, h)| &all[pos..pos + h.total_len()])
        .collect();
    // Offsets 0-3 and 8-11 stay; the batch of 4-7 is gone.
    let path = dir.path().join(segment::file_name(0, "log"));
    std::fs::write(&path, [batches[0], batches[2]].concat()).unwrap();
    for ext in ["index", "timeindex"] {
        let _ = std::fs::remove_file(dir.path().join(segment::file_name(0, ext)));
    }
    let (log, notes) = open_with_notes(dir.path(), LogConfig::default());
    assert!(notes.iter().all(|n| !n.contains("offset")), "{notes:?}");
    assert_eq!(log.end_offset(), 12);
    let r = log.read(5, 1 << 20, 12, true).unwrap();
    assert_eq!(
        offsets(&r),
        vec![(8, 11)],
        "a read inside the gap starts after it"
    );
    // A batch out of order is still cut: offsets never go back.
    drop(log);
    std::fs::write(&path, [batches[2], batches[0]].concat()).unwrap();
    let (log, notes) = open_with_notes(dir.path(), LogConfig::default());
    assert_eq!(log.end_offset(), 12, "{notes:?}");
    assert_eq!(
        offsets(&log.read(0, 1 << 20, 12, true).unwrap()),
        vec![(8, 11)]
    );
}

/// Segment files of a log directory, by base offset.
fn segment_bases(dir: &Path) -> Vec<i64> {
    let mut bases: Vec<i64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".log")?.parse().ok()
        })
        .collect();
    bases.sort_unstable();
    bases
}

#[test]
fn a_sealed_segment_missing_its_last_batches_keeps_its_successors_but_a_damaged_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), small_segments());
    fill(&mut log, 12, 4);
    let end = log.end_offset();
    drop(log);
    let bases = segment_bases(dir.path());
    assert!(bases.len() >= 3, "{bases:?}");
    // Compaction removed the first segment's last batch: its indexes go, its data ends early.
    let first = dir.path().join(segment::file_name(bases[0], "log"));
    let bytes = std::fs::read(&first).unwrap();
    let cut_at = Batches::new(&bytes).last().map(|(pos, _)| pos).unwrap();
    std::fs::write(&first, &bytes[..cut_at]).unwrap();
    for ext in ["index", "timeindex"] {
        let _ = std::fs::remove_file(dir.path().join(segment::file_name(bases[0], ext)));
    }
    let (log, notes) = open_with_notes(dir.path(), small_segments());
    assert_eq!(log.end_offset(), end, "{notes:?}");
    assert_eq!(segment_bases(dir.path()), bases, "every successor kept");
    drop(log);
    // Damage in the middle of the same segment: recovery cuts it, and what follows the cut
    // cannot be trusted to follow on.
    let bytes = std::fs::read(&first).unwrap();
    let mut damaged = bytes.clone();
    let (second_pos, _) = Batches::new(&bytes).nth(1).unwrap();
    damaged[second_pos + 70] ^= 0xff;
    std::fs::write(&first, &damaged).unwrap();
    for ext in ["index", "timeindex"] {
        let _ = std::fs::remove_file(dir.path().join(segment::file_name(bases[0], ext)));
    }
    let (log, notes) = open_with_notes(dir.path(), small_segments());
    assert!(notes.iter().any(|n| n.contains("after a gap")), "{notes:?}");
    assert_eq!(segment_bases(dir.path()), vec![bases[0]]);
    assert!(log.end_offset() < end);
}

/// A batch of one keyed record per key, at time `ts`.
fn keyed(keys: &[&str], ts: i64) -> Vec<u8> {
    let records: Vec<NewRecord> = keys
        .iter()
        .map(|k| NewRecord {
            key: Some(Bytes::from(k.to_string())),
            value: Some(Bytes::from(vec![b'v'; 40])),
            timestamp: ts,
        })
        .collect();
    build(&records, None, Compression::None).unwrap().to_vec()
}

/// Every batch of the log, read segment after segment (one read stops at a segment's end).
fn whole_log(log: &Log) -> Bytes {
    let mut out = Vec::new();
    let mut at = log.start_offset();
    while at < log.end_offset() {
        let r = log.read(at, 1 << 24, log.end_offset(), true).unwrap();
        let Some((_, last)) = Batches::new(&r.records).last() else {
            break;
        };
        at = last.next_offset();
        out.extend_from_slice(&r.records);
    }
    Bytes::from(out)
}

/// (offset, key) of every record of the log.
fn keys_of(log: &Log) -> Vec<(i64, String)> {
    let mut buf = whole_log(log);
    RecordBatchDecoder::decode_all(&mut buf)
        .unwrap()
        .into_iter()
        .flat_map(|s| s.records)
        .map(|r| {
            (
                r.offset,
                String::from_utf8(r.key.unwrap().to_vec()).unwrap(),
            )
        })
        .collect()
}

/// Compacts the first sealed segment of `log` against every key of the log; returns its
/// base and the cleaned copy (written, not swapped in).
fn clean_first(log: &Log, dir: &Path) -> crate::CleanedSegment {
    use crate::compaction::{compact_batches, map_section, OffsetMap, Sweep};
    let all = whole_log(log);
    let mut map = OffsetMap::with_buffer_bytes(1 << 16);
    map_section(&all, &mut map, &[]).unwrap();
    let base = log.sealed_spans()[0].base_offset;
    let (bytes, size) = log.read_sealed(base).unwrap().unwrap();
    let cleaned = compact_batches(&bytes, &mut Sweep::new(&map, Vec::new(), 0)).unwrap();
    assert!(
        cleaned.len() < bytes.len(),
        "the first segment holds superseded records"
    );
    Log::write_cleaned(&FsStorage::shared(), dir, base, size, &cleaned).unwrap()
}

#[test]
fn a_cleaned_segment_swapped_in_reads_as_compacted_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), small_segments());
    for round in 0..16 {
        log.append(&keyed(&["a", "b", "c"], round), 3, None, 0)
            .unwrap();
    }
    assert!(log.sealed_spans().len() >= 2);
    let before = keys_of(&log);
    let cleaned = clean_first(&log, dir.path());
    assert!(log.swap_cleaned(cleaned, 0).unwrap());
    let after = keys_of(&log);
    assert!(after.len() < before.len());
    // Only superseded records went; the latest of each key, and every offset kept, remain.
    assert!(after.iter().all(|r| before.contains(r)));
    for key in ["a", "b", "c"] {
        let last = before.iter().rev().find(|(_, k)| k == key).unwrap();
        assert!(after.contains(last));
    }
    let end = log.end_offset();
    drop(log);
    let log = open(dir.path(), small_segments());
    assert_eq!(
        (keys_of(&log), log.end_offset()),
        (after, end),
        "the same after a reopen"
    );
}

#[test]
fn a_clean_stopped_before_its_swap_leaves_the_segment_whole_and_its_copy_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), small_segments());
    for round in 0..16 {
        log.append(&keyed(&["a", "b", "c"], round), 3, None, 0)
            .unwrap();
    }
    let before = keys_of(&log);
    let cleaned = clean_first(&log, dir.path());
    drop(cleaned); // the cleaner was killed before it swapped
    drop(log);
    assert!(std::fs::read_dir(dir.path()).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".cleaned")));
    let log = open(dir.path(), small_segments());
    assert_eq!(keys_of(&log), before);
    assert!(!std::fs::read_dir(dir.path()).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".cleaned")));
}

/// A power loss (every unsynced byte lost, or a random prefix kept) at each step of a clean on
/// the simulated disk: the log reads as before the clean or as after it, never a mix, and a
/// later clean completes.
#[test]
fn a_power_loss_at_any_step_of_a_clean_leaves_the_log_as_before_or_after_it() {
    use crate::compaction::{compact_batches, map_section, OffsetMap, Sweep};
    use crate::sim::{SimDisk, Tear};
    let dir = Path::new("/data/t/0");
    for step in 0..4 {
        for tear in [Tear::LoseAll, Tear::RandomPrefix(step as u64 + 7)] {
            let disk = SimDisk::new();
            let flusher = Flusher::manual(FsyncPolicy::Always);
            let open = |flusher: Flusher| {
                Log::open_on(disk.storage(), dir, small_segments(), flusher, 0)
                    .unwrap()
                    .0
            };
            let mut log = open(flusher.clone());
            for round in 0..16 {
                log.append(&keyed(&["a", "b", "c"], round), 3, None, 0)
                    .unwrap();
            }
            flusher.flush_now();
            let before = keys_of(&log);
            // The clean: map, compact the first sealed segment, write its copy, swap it in.
            let all = whole_log(&log);
            let mut map = OffsetMap::with_buffer_bytes(1 << 16);
            map_section(&all, &mut map, &[]).unwrap();
            let base = log.sealed_spans()[0].base_offset;
            let (bytes, size) = log.read_sealed(base).unwrap().unwrap();
            let cleaned = compact_batches(&bytes, &mut Sweep::new(&map, Vec::new(), 0)).unwrap();
            let mut after = None;
            if step >= 1 {
                let copy = Log::write_cleaned(&disk.storage(), dir, base, size, &cleaned).unwrap();
                if step >= 2 {
                    assert!(log.swap_cleaned(copy, 0).unwrap());
                    after = Some(keys_of(&log));
                    if step >= 3 {
                        flusher.flush_now();
                    }
                }
            }
            drop(log);
            disk.power_loss(tear);
            let mut log = open(Flusher::manual(FsyncPolicy::Always));
            let now = keys_of(&log);
            assert!(
                now == before || Some(&now) == after.as_ref(),
                "step {step}: the log is neither as before nor as after the clean"
            );
            // A later clean of the same segment completes.
            let (bytes, size) = log.read_sealed(base).unwrap().unwrap();
            let again = compact_batches(&bytes, &mut Sweep::new(&map, Vec::new(), 0)).unwrap();
            let copy = Log::write_cleaned(&disk.storage(), dir, base, size, &again).unwrap();
            assert!(log.swap_cleaned(copy, 0).unwrap());
            let done = keys_of(&log);
            for key in ["a", "b", "c"] {
                let last = before.iter().rev().find(|(_, k)| k == key).unwrap();
                assert!(done.contains(last), "step {step}: {key}'s latest lost");
            }
        }
    }
}

/// Random keyed writes, updates and tombstones over many segments on the simulated disk,
/// cleaned segment by segment through the log (map, sweep, copy, swap), with a power loss
/// after a random number of swaps: the log then reads as the model's compacted view up to the
/// last synced swap and as written after it, and a second full clean gives exactly the last
/// value per key (tombstones kept, the horizon being before every record).
#[test]
fn random_logs_cleaned_on_the_simulated_disk_match_the_last_value_per_key_through_power_loss() {
    use crate::compaction::{compact_batches, map_section, OffsetMap, Sweep};
    use crate::sim::{SimDisk, Tear};
    let dir = Path::new("/data/t/0");
    for seed in 0..24u64 {
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let disk = SimDisk::new();
        let flusher = Flusher::manual(FsyncPolicy::Always);
        let open = |flusher: Flusher| {
            Log::open_on(disk.storage(), dir, small_segments(), flusher, 0)
                .unwrap()
                .0
        };
        let mut log = open(flusher.clone());
        let mut model: std::collections::BTreeMap<String, (i64, bool)> = Default::default();
        for _ in 0..(20 + next(40)) {
            let n = 1 + next(4) as usize;
            let recs: Vec<NewRecord> = (0..n)
                .map(|_| NewRecord {
                    key: Some(Bytes::from(format!("k{}", next(12)))),
                    value: (next(6) != 0).then(|| Bytes::from(vec![b'v'; 30])),
                    timestamp: 100,
                })
                .collect();
            let b = build(&recs, None, Compression::None).unwrap().to_vec();
            let info = log.append(&b, 3, None, 0).unwrap();
            for (i, r) in recs.iter().enumerate() {
                let key = String::from_utf8(r.key.clone().unwrap().to_vec()).unwrap();
                model.insert(key, (info.base_offset + i as i64, r.value.is_some()));
            }
        }
        flusher.flush_now();
        let clean_all = |log: &mut Log, stop_after: usize| {
            let all = whole_log(log);
            let mut map = OffsetMap::with_buffer_bytes(1 << 16);
            map_section(&all, &mut map, &[]).unwrap();
            let mut sweep = Sweep::new(&map, Vec::new(), 0);
            for (i, span) in log.sealed_spans().into_iter().enumerate() {
                if i == stop_after {
                    return;
                }
                let (bytes, size) = log.read_sealed(span.base_offset).unwrap().unwrap();
                let cleaned = compact_batches(&bytes, &mut sweep).unwrap();
                let copy =
                    Log::write_cleaned(&disk.storage(), dir, span.base_offset, size, &cleaned)
                        .unwrap();
                assert!(log.swap_cleaned(copy, 0).unwrap());
            }
        };
        let swaps = next(log.sealed_spans().len() as u64 + 1) as usize;
        clean_all(&mut log, swaps);
        drop(log);
        disk.power_loss(if seed % 2 == 0 {
            Tear::LoseAll
        } else {
            Tear::RandomPrefix(seed)
        });
        let mut log = open(Flusher::manual(FsyncPolicy::Always));
        clean_all(&mut log, usize::MAX);
        // What the sealed segments hold is the latest per key; the active segment is as written.
        let active = log.sealed_spans().last().map_or(0, |s| s.next_offset);
        let got = keys_of(&log);
        for (key, (offset, _)) in &model {
            assert!(
                got.contains(&(*offset, key.clone())),
                "seed {seed}: {key}'s latest record at {offset} is gone"
            );
        }
        for (offset, key) in got.iter().filter(|(o, _)| *o < active) {
            assert_eq!(
                model.get(key).map(|m| m.0),
                Some(*offset),
                "seed {seed}: an older record of {key} at {offset} survived two cleans"
            );
        }
    }
}
