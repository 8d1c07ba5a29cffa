//! The log's contract, checked on the real file system and on the simulated disk:
//! - a batch is readable as soon as `append` returns;
//! - it survives a crash once the fsync policy says it is durable (on the simulated disk a
//!   power loss, which also drops the page cache; on real files only a process crash);
//! - offsets have no hole after truncation or recovery, and a truncated tail never returns;
//! - a failed fsync is never followed by a durable report.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use spate_protocol::batch::{build, Batches, NewRecord, HEADER_LEN};
use spate_protocol::records::Compression;

use super::*;
use crate::config::FsyncPolicy;
use crate::durability::{wait_durable, DurabilityError};
use crate::sim::{SimDisk, Tear};
use crate::storage::FsStorage;

/// A disk under test: real files in a temp dir, or the simulated disk.
enum Disk {
    Real(tempfile::TempDir),
    Sim(SimDisk),
}

impl Disk {
    fn storage(&self) -> Arc<dyn Storage> {
        match self {
            Disk::Real(_) => FsStorage::shared(),
            Disk::Sim(d) => d.storage(),
        }
    }

    fn dir(&self) -> PathBuf {
        match self {
            Disk::Real(t) => t.path().join("p"),
            Disk::Sim(_) => PathBuf::from("/data/p"),
        }
    }

    /// The process dies: the page cache survives.
    fn crash(&self) {
        if let Disk::Sim(d) = self {
            d.crash_process();
        }
    }
}

/// Xorshift: seeded, so a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What the log should hold: (base offset, last offset, bytes after the header) per batch.
type Model = Vec<(i64, i64, Vec<u8>)>;

fn make_batch(records: usize, value_len: usize, tag: u64) -> Vec<u8> {
    let recs: Vec<NewRecord> = (0..records)
        .map(|i| NewRecord {
            key: None,
            value: Some(Bytes::from(vec![
                (tag as u8).wrapping_add(i as u8);
                value_len
            ])),
            timestamp: 1_000 + tag as i64,
        })
        .collect();
    build(&recs, None, Compression::None).unwrap().to_vec()
}

fn small() -> LogConfig {
    LogConfig {
        segment_bytes: 2048,
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

fn open_on(disk: &Disk, flusher: &Flusher) -> (Log, Vec<String>) {
    Log::open_on(disk.storage(), &disk.dir(), small(), flusher.clone(), 0).unwrap()
}

/// Every batch in the log, read through the public read path, checked for contiguity.
fn read_all(log: &Log) -> Model {
    let mut out: Model = Vec::new();
    let mut at = log.start_offset();
    while at < log.end_offset() {
        let r = log.read(at, 1 << 16, i64::MAX, true).unwrap();
        assert!(!r.records.is_empty(), "no batch at {at} below the end");
        for (pos, h) in Batches::new(&r.records) {
            assert_eq!(h.base_offset, at, "hole or overlap in offsets");
            let bytes = &r.records[pos + HEADER_LEN..pos + h.total_len()];
            out.push((h.base_offset, h.last_offset(), bytes.to_vec()));
            at = h.next_offset();
        }
    }
    out
}

fn append(log: &mut Log, model: &mut Model, rng: &mut Rng) -> AppendInfo {
    let records = 1 + rng.below(5) as usize;
    let value_len = [1, 30, 200, 900][rng.below(4) as usize];
    let b = make_batch(records, value_len, rng.next());
    let info = log.append(&b, 0, None, 0).unwrap();
    model.push((info.base_offset, info.last_offset, b[HEADER_LEN..].to_vec()));
    info
}

/// A short description of a model for assertion messages: offsets and a checksum per batch.
fn brief(m: &Model) -> Vec<(i64, i64, u32)> {
    m.iter()
        .map(|(b, l, bytes)| (*b, *l, spate_protocol::batch::crc32c(bytes)))
        .collect()
}

fn truncate_model(model: &mut Model, new_end: i64) {
    model.retain(|&(base, _, _)| base < new_end);
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(f)
}

fn wait(log: &Log, offset: i64) -> Result<(), DurabilityError> {
    let mut rx = log.durable_offset();
    block_on(async {
        tokio::time::timeout(Duration::from_secs(10), wait_durable(&mut rx, offset))
            .await
            .expect("durability within 10 s")
    })
}

/// The contract checks shared by both disks.
fn contract_suite(disk: &Disk, seed: u64) {
    let flusher = Flusher::start(FsyncPolicy::Always).unwrap();
    let mut rng = Rng(seed);
    let (mut log, _) = open_on(disk, &flusher);
    let mut model = Model::new();
    for _ in 0..40 {
        let info = append(&mut log, &mut model, &mut rng);
        // Readable when append returns, before any fsync.
        let r = log.read(info.base_offset, 1 << 16, i64::MAX, true).unwrap();
        assert_eq!(
            Batches::new(&r.records).next().unwrap().1.base_offset,
            info.base_offset
        );
    }
    assert!(log.segment_count() > 1, "the test must cross segments");
    wait(&log, log.end_offset()).unwrap();
    assert_eq!(read_all(&log), model);

    // Truncation inside a batch ends the log at that batch's start.
    let (base, last, _) = model[model.len() - 3];
    assert!(last > base || model.len() > 3);
    let new_end = log.truncate_to(last, 0).unwrap();
    let expected = if last == base { last } else { base };
    assert_eq!(new_end, expected);
    truncate_model(&mut model, new_end);
    assert_eq!(read_all(&log), model);

    // The cut survives a crash, and appends continue with no hole.
    disk.crash();
    drop(log);
    let (mut log, _) = open_on(disk, &flusher);
    assert_eq!(read_all(&log), model);
    for _ in 0..5 {
        append(&mut log, &mut model, &mut rng);
    }
    wait(&log, log.end_offset()).unwrap();
    assert_eq!(read_all(&log), model);

    // Truncation to a segment boundary and to the very start.
    let first_sealed_end = log.segments[1].base_offset;
    assert_eq!(
        log.truncate_to(first_sealed_end, 0).unwrap(),
        first_sealed_end
    );
    truncate_model(&mut model, first_sealed_end);
    assert_eq!(read_all(&log), model);
    append(&mut log, &mut model, &mut rng);
    assert_eq!(log.truncate_to(0, 0).unwrap(), 0);
    model.clear();
    assert_eq!(log.end_offset(), 0);
    append(&mut log, &mut model, &mut rng);
    wait(&log, log.end_offset()).unwrap();
    disk.crash();
    drop(log);
    let (log, _) = open_on(disk, &flusher);
    assert_eq!(read_all(&log), model);
    flusher.shutdown();
}

#[test]
fn contract_holds_on_real_files() {
    let disk = Disk::Real(tempfile::tempdir().unwrap());
    contract_suite(&disk, 7);
}

#[test]
fn contract_holds_on_the_simulated_disk() {
    let disk = Disk::Sim(SimDisk::new());
    contract_suite(&disk, 7);
}

/// Random appends, truncations (inside batches, at boundaries, to the start), rolls, clean
/// and unclean reopens, read back against a model after each step.
fn truncation_property(disk: &Disk, seed: u64, power_loss: bool) {
    let flusher = Flusher::start(FsyncPolicy::Always).unwrap();
    let mut rng = Rng(seed);
    let (mut log, _) = open_on(disk, &flusher);
    let mut model = Model::new();
    for step in 0..60 {
        match rng.below(10) {
            0..=5 => {
                append(&mut log, &mut model, &mut rng);
            }
            6 => {
                let (start, end) = (log.start_offset(), log.end_offset());
                let at = start + rng.below((end - start + 1) as u64) as i64;
                let new_end = log.truncate_to(at, 0).unwrap();
                // The end is the start of the batch holding `at`, or `at` on a boundary.
                let expect = model
                    .iter()
                    .find(|&&(b, l, _)| b <= at && at <= l)
                    .map_or(at.min(end), |&(b, _, _)| b);
                assert_eq!(new_end, expect, "seed {seed} step {step}");
                truncate_model(&mut model, new_end);
            }
            7 => log.roll(0).unwrap(),
            8 => {
                log.close().unwrap();
                drop(log);
                log = open_on(disk, &flusher).0;
            }
            _ => {
                wait(&log, log.end_offset()).unwrap();
                drop(log);
                match (disk, power_loss) {
                    (Disk::Sim(d), true) => d.power_loss(Tear::RandomPrefix(rng.next())),
                    _ => disk.crash(),
                }
                log = open_on(disk, &flusher).0;
            }
        }
        assert_eq!(
            brief(&read_all(&log)),
            brief(&model),
            "seed {seed} step {step}"
        );
    }
    flusher.shutdown();
}

#[test]
fn truncation_matches_the_model_on_real_files() {
    for seed in 1..=6 {
        let disk = Disk::Real(tempfile::tempdir().unwrap());
        truncation_property(&disk, seed * 7919, false);
    }
}

#[test]
fn truncation_matches_the_model_across_power_losses() {
    // SPATE_SEEDS runs more (e.g. thousands) for a deeper search.
    let seeds: u64 = std::env::var("SPATE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    for seed in 1..=seeds {
        let disk = Disk::Sim(SimDisk::new());
        truncation_property(&disk, seed * 104_729, true);
    }
}

#[test]
fn truncation_past_the_end_is_refused() {
    let disk = Disk::Sim(SimDisk::new());
    let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
    let (mut log, _) = open_on(&disk, &flusher);
    let mut model = Model::new();
    append(&mut log, &mut model, &mut Rng(3));
    let end = log.end_offset();
    assert!(matches!(
        log.truncate_to(end + 1, 0),
        Err(LogError::TruncationPastEnd { .. })
    ));
    assert_eq!(log.truncate_to(end, 0).unwrap(), end);
    assert_eq!(read_all(&log), model);
}

#[test]
fn a_reset_log_starts_empty_at_the_new_offset_and_stays_so_across_a_power_loss() {
    let sim = SimDisk::new();
    let disk = Disk::Sim(sim.clone());
    let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
    let (mut log, _) = open_on(&disk, &flusher);
    let mut model = Model::new();
    for _ in 0..3 {
        append(&mut log, &mut model, &mut Rng(5));
    }
    log.reset_to(1_000, 0).unwrap();
    assert_eq!((log.start_offset(), log.end_offset()), (1_000, 1_000));
    assert!(log.epochs().is_empty());
    drop(log);
    sim.power_loss(Tear::LoseAll);
    let (log, _) = open_on(&disk, &flusher);
    assert_eq!((log.start_offset(), log.end_offset()), (1_000, 1_000));
    assert!(
        read_all(&log).is_empty(),
        "nothing from before the reset comes back"
    );
}

/// Acknowledged (durable-reported) batches survive a power loss under every policy that
/// makes acks wait for fsync.
#[test]
fn no_acknowledged_batch_is_lost_at_power_loss_under_waiting_policies() {
    // `always` and the four WAL profiles' group-commit windows (low, medium, high, ultra).
    let mut policies = vec![FsyncPolicy::Always];
    for ms in [2, 10, 50, 100] {
        policies.push(FsyncPolicy::GroupCommit {
            window: Duration::from_millis(ms),
        });
    }
    for (i, policy) in policies.into_iter().enumerate() {
        for seed in 1..=3u64 {
            let sim = SimDisk::new();
            let disk = Disk::Sim(sim.clone());
            let flusher = Flusher::start(policy).unwrap();
            let mut rng = Rng(seed * 31 + i as u64);
            let (mut log, _) = open_on(&disk, &flusher);
            let mut acked = Model::new();
            let mut pending = Model::new();
            for _ in 0..30 {
                let info = append(&mut log, &mut pending, &mut rng);
                if rng.below(3) == 0 {
                    wait(&log, info.last_offset + 1).unwrap();
                    acked = pending.clone();
                }
            }
            drop(log);
            sim.power_loss(Tear::RandomPrefix(rng.next()));
            let (log, _) = open_on(&disk, &flusher);
            let got = read_all(&log);
            assert!(
                got.len() >= acked.len(),
                "{policy:?} seed {seed}: lost acks"
            );
            assert_eq!(got[..], pending[..got.len()], "{policy:?}: not a prefix");
            flusher.shutdown();
        }
    }
}

/// With `interval`, a power loss loses at most what was not yet reported durable.
#[test]
fn interval_policy_loses_at_most_the_unsynced_tail() {
    let sim = SimDisk::new();
    let disk = Disk::Sim(sim.clone());
    let flusher = Flusher::start(FsyncPolicy::Interval {
        every: Duration::from_millis(5),
    })
    .unwrap();
    let mut rng = Rng(99);
    let (mut log, _) = open_on(&disk, &flusher);
    let mut model = Model::new();
    for _ in 0..20 {
        append(&mut log, &mut model, &mut rng);
    }
    wait(&log, log.end_offset()).unwrap();
    let durable_before_tail = model.len();
    for _ in 0..10 {
        append(&mut log, &mut model, &mut rng);
    }
    let durable = match *log.durable_offset().borrow() {
        Durability::Synced(o) => o,
        Durability::Failed => panic!("no fsync failed"),
    };
    drop(log);
    flusher.shutdown();
    sim.power_loss(Tear::LoseAll);
    let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
    let (log, _) = open_on(&disk, &flusher);
    let got = read_all(&log);
    assert!(got.len() >= durable_before_tail);
    assert!(log.end_offset() >= durable, "lost data reported durable");
    assert_eq!(got[..], model[..got.len()]);
}

/// Today's kill -9 test cannot tell `never` from `always` (the page cache survives a process
/// crash); a power loss can.
#[test]
fn never_policy_loses_unsynced_data_at_power_loss_but_not_at_process_crash() {
    for power_loss in [false, true] {
        let sim = SimDisk::new();
        let disk = Disk::Sim(sim.clone());
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let (mut log, _) = open_on(&disk, &flusher);
        let mut model = Model::new();
        for _ in 0..5 {
            append(&mut log, &mut model, &mut Rng(5));
        }
        drop(log);
        if power_loss {
            sim.power_loss(Tear::LoseAll);
        } else {
            sim.crash_process();
        }
        let (log, _) = open_on(&disk, &flusher);
        let got = read_all(&log).len();
        if power_loss {
            assert!(got < model.len(), "unsynced data survived a power loss");
        } else {
            assert_eq!(got, model.len());
        }
    }
}

#[test]
fn a_failed_fsync_fails_its_waiters_and_takes_the_log_out_of_service() {
    let sim = SimDisk::new();
    let disk = Disk::Sim(sim.clone());
    let flusher = Flusher::start(FsyncPolicy::Always).unwrap();
    let (mut log, _) = open_on(&disk, &flusher);
    let mut model = Model::new();
    let mut rng = Rng(11);
    let first = append(&mut log, &mut model, &mut rng);
    wait(&log, first.last_offset + 1).unwrap();
    sim.fail_fsync(true);
    let second = append(&mut log, &mut model, &mut rng);
    assert_eq!(
        wait(&log, second.last_offset + 1),
        Err(DurabilityError::FsyncFailed)
    );
    // The disk recovers, but a later fsync proves nothing: the log stays failed.
    sim.fail_fsync(false);
    assert!(log.is_failed());
    let b = make_batch(1, 1, 1);
    assert!(matches!(
        log.append(&b, 0, None, 0),
        Err(LogError::Failed { .. })
    ));
    assert_eq!(
        wait(&log, second.last_offset + 1),
        Err(DurabilityError::FsyncFailed)
    );
    // Restart and recovery bring it back with at least what was acknowledged.
    drop(log);
    sim.power_loss(Tear::LoseAll);
    let (mut log, _) = open_on(&disk, &flusher);
    let got = read_all(&log);
    assert!(!got.is_empty() && got[0] == model[0]);
    let again = append(&mut log, &mut model, &mut rng);
    wait(&log, again.last_offset + 1).unwrap();
    flusher.shutdown();
}

#[test]
fn a_failed_write_takes_the_log_out_of_service() {
    let sim = SimDisk::new();
    let disk = Disk::Sim(sim.clone());
    let flusher = Flusher::start(FsyncPolicy::Always).unwrap();
    let (mut log, _) = open_on(&disk, &flusher);
    sim.fail_writes(true);
    let b = make_batch(2, 10, 1);
    assert!(matches!(
        log.append(&b, 0, None, 0),
        Err(LogError::Io { .. })
    ));
    sim.fail_writes(false);
    assert!(matches!(
        log.append(&b, 0, None, 0),
        Err(LogError::Failed { .. })
    ));
    flusher.shutdown();
}

/// Fix 6: finding a fetch position walks batch headers with small reads instead of reading
/// a megabyte of records first.
#[test]
fn position_lookup_reads_headers_not_records() {
    let sim = SimDisk::new();
    let disk = Disk::Sim(sim.clone());
    let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
    let config = LogConfig {
        segment_bytes: 1 << 30,
        index_interval_bytes: 1 << 30,
        ..LogConfig::default()
    };
    let (mut log, _) =
        Log::open_on(disk.storage(), &disk.dir(), config, flusher.clone(), 0).unwrap();
    for i in 0..32 {
        log.append(&make_batch(1, 32 * 1024, i), 0, None, 0)
            .unwrap();
    }
    let before = sim.bytes_read();
    let r = log.read(30, 100, i64::MAX, true).unwrap();
    let read = sim.bytes_read() - before;
    assert_eq!(Batches::new(&r.records).next().unwrap().1.base_offset, 30);
    // One header window per skipped batch plus the batch itself: far below 1 MiB.
    assert!(read < 31 * 4096 + 64 * 1024, "read {read} bytes");
}

#[test]
fn replica_append_keeps_leader_offsets_and_epochs_and_answers_offset_for_epoch() {
    let disk = Disk::Sim(SimDisk::new());
    let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
    let leader_dir = Path::new("/data/leader");
    let (mut leader, _) =
        Log::open_on(disk.storage(), leader_dir, small(), flusher.clone(), 0).unwrap();
    let (mut follower, _) = open_on(&disk, &flusher);
    for (epoch, n) in [(1, 3), (1, 2), (4, 5), (6, 1)] {
        leader
            .append(&make_batch(n, 10, epoch as u64), epoch, None, 0)
            .unwrap();
    }
    let bytes = leader.read(0, 1 << 20, i64::MAX, true).unwrap().records;
    for (pos, h) in Batches::new(&bytes) {
        follower
            .append_replica(&bytes[pos..pos + h.total_len()], 0)
            .unwrap();
    }
    assert_eq!(follower.end_offset(), 11);
    assert_eq!(follower.latest_epoch(), Some(6));
    assert_eq!(follower.end_offset_for_epoch(1), Some((1, 5)));
    assert_eq!(follower.end_offset_for_epoch(3), Some((1, 5)));
    assert_eq!(follower.end_offset_for_epoch(4), Some((4, 10)));
    assert_eq!(follower.end_offset_for_epoch(6), Some((6, 11)));
    assert_eq!(
        follower.read(0, 1 << 20, i64::MAX, true).unwrap().records,
        bytes,
        "replicas hold the leader's bytes"
    );
    // A batch that does not start at the end, or from an older epoch, is refused.
    let first = &bytes[..Batches::new(&bytes).next().unwrap().1.total_len()];
    assert!(matches!(
        follower.append_replica(first, 0),
        Err(LogError::OffsetMismatch { .. })
    ));
    assert!(matches!(
        follower.append_replica(&bytes[..10], 0),
        Err(LogError::InvalidBatch { .. })
    ));
    // Truncating to where epoch 4 ended drops epoch 6 from the checkpoint, across a restart.
    follower.truncate_to(10, 0).unwrap();
    drop(follower);
    let (follower, _) = open_on(&disk, &flusher);
    assert_eq!(follower.latest_epoch(), Some(4));
    assert_eq!(follower.end_offset_for_epoch(6), Some((4, 10)));
}

/// Appends `b` and records it in `model` when it was acknowledged; a refusal must be "full".
fn append_or_full(log: &mut Log, model: &mut Model, b: &[u8], epoch: i32) {
    match log.append(b, epoch, None, 0) {
        Ok(a) => model.push((a.base_offset, a.last_offset, b[HEADER_LEN..].to_vec())),
        Err(e) => {
            assert!(e.is_storage_full(), "not recognised as a full disk: {e}");
            assert!(!log.is_failed(), "a full disk took the log out of service");
        }
    }
}

/// A log on a fresh simulated disk, with a flusher that never fsyncs on its own.
fn sim_log() -> (SimDisk, Disk, Flusher, Log) {
    let sim = SimDisk::new();
    let disk = Disk::Sim(sim.clone());
    let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
    let (log, _) = open_on(&disk, &flusher);
    (sim, disk, flusher, log)
}

/// Appends `batches` batches of two `value_len`-byte records in `epoch` (tags 0..batches) and
/// returns those acknowledged; a refusal must be "full".
fn fill(log: &mut Log, batches: u64, value_len: usize, epoch: i32) -> Model {
    let mut model = Vec::new();
    for tag in 0..batches {
        append_or_full(log, &mut model, &make_batch(2, value_len, tag), epoch);
    }
    model
}

/// The batches of `model` a read from the log start returns.
fn served(log: &Log, model: &Model) -> Model {
    let start = log.start_offset();
    model.iter().filter(|m| m.1 >= start).cloned().collect()
}

#[test]
fn an_append_meeting_enospc_cuts_its_torn_bytes_and_keeps_the_log_in_service() {
    let (sim, disk, flusher, mut log) = sim_log();
    let mut model = fill(&mut log, 3, 10, 0);
    assert_eq!(model.len(), 3);
    let used = sim.used_bytes();
    let big = make_batch(2, 200, 9);
    // Room for half the batch: the write is torn, then ENOSPC.
    sim.set_capacity(Some(used + big.len() as u64 / 2));
    let e = log.append(&big, 0, None, 0).unwrap_err();
    assert!(e.is_storage_full(), "{e}");
    assert!(!log.is_failed());
    assert_eq!(
        sim.used_bytes(),
        used,
        "the torn part stayed in the segment"
    );
    assert_eq!(log.end_offset(), 6);
    assert_eq!(read_all(&log), model);
    // A crash now finds nothing to repair.
    drop(log);
    disk.crash();
    let (mut log, notes) = open_on(&disk, &flusher);
    assert!(notes.is_empty(), "recovery repaired {notes:?}");
    assert_eq!(read_all(&log), model);
    // Space back: the same batch goes in at the next offset.
    sim.set_capacity(None);
    append_or_full(&mut log, &mut model, &big, 0);
    assert_eq!(model.len(), 4);
    assert_eq!(model[3].0, 6);
    assert_eq!(read_all(&log), model);
    flusher.shutdown();
}

#[test]
fn enospc_at_random_appends_index_writes_and_checkpoints_loses_nothing_acknowledged() {
    let (mut refused, mut accepted) = (0, 0);
    for seed in 1..=24u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let sim = SimDisk::new();
        let disk = Disk::Sim(sim.clone());
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let (mut log, _) = open_on(&disk, &flusher);
        let mut model: Model = Vec::new();
        let mut epoch = 0;
        for tag in 0..150u64 {
            // Often a disk with little room left: the next write may be torn anywhere.
            let room = match rng.below(4) {
                0 => None,
                _ => Some(sim.used_bytes() + rng.below(1500)),
            };
            sim.set_capacity(room);
            if rng.below(10) == 0 {
                // A new epoch rewrites the leader-epoch checkpoint before the batch.
                epoch += 1;
            }
            if rng.below(15) == 0 {
                // DeleteRecords writes the log start checkpoint; refused cleanly when full.
                // To a batch boundary: `read_all` walks whole batches from the start.
                let start = log.start_offset();
                let to = model
                    .iter()
                    .map(|m| m.0)
                    .find(|&b| b > start)
                    .unwrap_or(start);
                match log.advance_start(to) {
                    Ok(_) => {}
                    Err(e) => assert!(e.is_storage_full(), "seed {seed}: {e}"),
                }
            }
            let b = make_batch(1 + rng.below(4) as usize, 20 + rng.below(300) as usize, tag);
            let (end, latest) = (log.end_offset(), log.latest_epoch());
            append_or_full(&mut log, &mut model, &b, epoch);
            if log.end_offset() == end {
                refused += 1;
            } else {
                accepted += 1;
            }
            if log.end_offset() == end && log.latest_epoch() != latest {
                // Refused after its epoch was recorded: the epoch starts at the log end, as a
                // leader's `begin_epoch` leaves it; a refused checkpoint changes nothing.
                let last = log.epochs().last().copied();
                assert_eq!(last.map(|e| (e.epoch, e.start_offset)), Some((epoch, end)));
            }
            assert!(!log.is_failed(), "seed {seed}: log out of service");
        }
        sim.set_capacity(None);
        // Seals (index files) that met ENOSPC on the flusher thread left the log in service.
        log.finish_seals();
        assert!(
            !log.is_failed(),
            "seed {seed}: a seal took the log out of service"
        );
        assert_eq!(read_all(&log), served(&log, &model), "seed {seed}");
        drop(log);
        disk.crash();
        let (log, _) = open_on(&disk, &flusher);
        assert_eq!(
            read_all(&log),
            served(&log, &model),
            "seed {seed}: after recovery"
        );
        flusher.shutdown();
    }
    // The faults happened, and so did appends between them.
    assert!(
        refused > 100 && accepted > 100,
        "{refused} refused, {accepted} accepted"
    );
}

#[test]
fn enospc_writing_index_files_at_a_seal_keeps_the_log_in_service_and_a_restart_rebuilds_them() {
    let (sim, disk, flusher, mut log) = sim_log();
    sim.full_only_for(Some("index"));
    sim.set_capacity(Some(0));
    let model = fill(&mut log, 40, 100, 0);
    assert_eq!(model.len(), 40, "appends do not write index files");
    assert!(log.segment_count() > 2, "the test needs sealed segments");
    log.finish_seals();
    assert!(!log.is_failed());
    assert_eq!(read_all(&log), model);
    // No partial index file stays behind to pass for a whole one.
    let names = sim.list_dir(&disk.dir()).unwrap();
    assert!(
        !names.iter().any(|n| n.ends_with("index")),
        "index files left: {names:?}"
    );
    sim.set_capacity(None);
    drop(log);
    disk.crash();
    let (log, _) = open_on(&disk, &flusher);
    assert_eq!(read_all(&log), model);
    // A read from the middle finds its batch through the rebuilt index.
    let r = log.read(41, 1 << 16, i64::MAX, true).unwrap();
    assert_eq!(Batches::new(&r.records).next().unwrap().1.base_offset, 40);
    flusher.shutdown();
}

#[test]
fn enospc_writing_the_epoch_or_log_start_checkpoint_changes_nothing_and_works_once_space_is_back() {
    let (sim, disk, flusher, mut log) = sim_log();
    let mut model = fill(&mut log, 4, 10, 1);
    sim.full_only_for(Some(".tmp"));
    sim.set_capacity(Some(0));
    // A new epoch's checkpoint cannot be written: the batch is refused, nothing changes.
    let e = log.append(&make_batch(2, 10, 7), 2, None, 0).unwrap_err();
    assert!(e.is_storage_full(), "{e}");
    assert_eq!(log.latest_epoch(), Some(1));
    assert_eq!(log.end_offset(), 8);
    // DeleteRecords' checkpoint cannot be written: the start stays.
    let e = log.advance_start(4).unwrap_err();
    assert!(e.is_storage_full(), "{e}");
    assert_eq!(log.start_offset(), 0);
    assert!(!log.is_failed());
    let names = sim.list_dir(&disk.dir()).unwrap();
    assert!(
        !names.iter().any(|n| n.ends_with(".tmp")),
        "temporary files left: {names:?}"
    );
    sim.set_capacity(None);
    append_or_full(&mut log, &mut model, &make_batch(2, 10, 7), 2);
    assert_eq!(log.latest_epoch(), Some(2));
    assert_eq!(log.advance_start(4).unwrap(), 4);
    drop(log);
    disk.crash();
    let (log, _) = open_on(&disk, &flusher);
    assert_eq!(log.start_offset(), 4);
    assert_eq!(log.latest_epoch(), Some(2));
    assert_eq!(read_all(&log), served(&log, &model));
    flusher.shutdown();
}

#[test]
fn delete_records_on_a_disk_with_no_byte_left_frees_whole_segments_first_then_moves_the_start() {
    let (sim, disk, flusher, mut log) = sim_log();
    let model = fill(&mut log, 40, 100, 0);
    assert!(
        log.segment_count() > 3,
        "the test needs whole segments to free"
    );
    log.finish_seals();
    // Not one byte left: even the checkpoint's few bytes do not fit.
    sim.set_capacity(Some(sim.used_bytes()));
    let used = sim.used_bytes();
    let cut = model[30].0;
    assert_eq!(log.advance_start(cut).unwrap(), cut);
    assert!(sim.used_bytes() < used, "whole segments below were deleted");
    assert_eq!(log.start_offset(), cut);
    assert!(!log.is_failed());
    drop(log);
    disk.crash();
    let (log, _) = open_on(&disk, &flusher);
    assert_eq!(
        log.start_offset(),
        cut,
        "the checkpoint was written in the freed space"
    );
    assert_eq!(read_all(&log), served(&log, &model));
    flusher.shutdown();
}

#[test]
fn enospc_from_an_index_fsync_at_a_seal_keeps_the_log_in_service_and_leaves_no_index_file() {
    let (sim, disk, flusher, mut log) = sim_log();
    // The index files' bytes are written, their fsync says the disk is full.
    sim.full_only_for(Some("index"));
    sim.enospc_on_fsync(true);
    let mut model = fill(&mut log, 40, 100, 0);
    assert_eq!(model.len(), 40, "appends do not fsync index files");
    assert!(log.segment_count() > 2, "the test needs sealed segments");
    log.finish_seals();
    assert!(
        !log.is_failed(),
        "an index fsync's ENOSPC took the log out of service"
    );
    assert_eq!(read_all(&log), model);
    // An unsynced index file must not pass for a whole one after a power loss.
    let names = sim.list_dir(&disk.dir()).unwrap();
    assert!(
        !names.iter().any(|n| n.ends_with("index")),
        "index files left: {names:?}"
    );
    // Appends go on after the refused seals.
    append_or_full(&mut log, &mut model, &make_batch(2, 100, 99), 0);
    assert_eq!(model.len(), 41);
    sim.enospc_on_fsync(false);
    drop(log);
    disk.crash();
    let (log, _) = open_on(&disk, &flusher);
    assert_eq!(read_all(&log), model);
    flusher.shutdown();
}

#[test]
fn a_log_whose_index_files_are_missing_opens_on_a_full_disk_with_indexes_in_memory() {
    let (sim, disk, flusher, mut log) = sim_log();
    // Seals meet a full disk: the sealed segments are left without index files.
    sim.full_only_for(Some("index"));
    sim.set_capacity(Some(0));
    let model = fill(&mut log, 40, 100, 0);
    log.finish_seals();
    assert!(log.segment_count() > 2, "the test needs sealed segments");
    drop(log);
    disk.crash();
    // Still full at the restart: rebuilding the index files fails, opening must not.
    let (log, notes) = Log::open_on(disk.storage(), &disk.dir(), small(), flusher.clone(), 0)
        .expect("a full disk kept the log from opening");
    assert!(
        notes.iter().any(|n| n.contains("no space for index files")),
        "{notes:?}"
    );
    assert!(!log.is_failed());
    assert_eq!(read_all(&log), model);
    let r = log.read(41, 1 << 16, i64::MAX, true).unwrap();
    assert_eq!(Batches::new(&r.records).next().unwrap().1.base_offset, 40);
    // Space back: the next start writes them.
    sim.set_capacity(None);
    drop(log);
    disk.crash();
    let (log, _) = open_on(&disk, &flusher);
    assert_eq!(read_all(&log), model);
    let names = sim.list_dir(&disk.dir()).unwrap();
    assert!(
        names.iter().any(|n| n.ends_with(".index")),
        "index files not rebuilt: {names:?}"
    );
    flusher.shutdown();
}

#[test]
fn an_empty_replica_started_inside_a_batch_on_a_full_disk_refuses_it_and_serves_nothing_below_the_leader_start(
) {
    let sim = SimDisk::new();
    let disk = Disk::Sim(sim.clone());
    let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
    // The leader's log start, moved by DeleteRecords to offset 2, inside its first batch.
    let (mut leader, _) = Log::open_on(
        disk.storage(),
        Path::new("/data/leader"),
        small(),
        flusher.clone(),
        0,
    )
    .unwrap();
    leader.append(&make_batch(5, 10, 1), 0, None, 0).unwrap();
    assert_eq!(leader.advance_start(2).unwrap(), 2);
    let sent = leader.read(2, 1 << 16, i64::MAX, true).unwrap().records;
    let (mut replica, _) = open_on(&disk, &flusher);
    replica.reset_to(2, 0).unwrap();
    // No room for the log start checkpoint.
    sim.full_only_for(Some(".tmp"));
    sim.set_capacity(Some(0));
    let e = replica.append_replica(&sent, 0).unwrap_err();
    assert!(e.is_storage_full(), "{e}");
    assert!(!replica.is_failed());
    assert_eq!(
        (replica.start_offset(), replica.end_offset()),
        (2, 2),
        "records below the leader's start are served"
    );
    drop(replica);
    disk.crash();
    let (mut replica, _) = open_on(&disk, &flusher);
    assert_eq!((replica.start_offset(), replica.end_offset()), (2, 2));
    // Space back: the batch is taken whole and the start stays, across a restart too.
    sim.set_capacity(None);
    replica.append_replica(&sent, 0).unwrap();
    assert_eq!((replica.start_offset(), replica.end_offset()), (2, 5));
    drop(replica);
    disk.crash();
    let (replica, _) = open_on(&disk, &flusher);
    assert_eq!((replica.start_offset(), replica.end_offset()), (2, 5));
    flusher.shutdown();
}

#[test]
fn delete_records_on_a_full_disk_whose_deletions_cannot_be_made_durable_never_serves_from_further_on_than_a_restart(
) {
    let (sim, disk, flusher, mut log) = sim_log();
    let model = fill(&mut log, 40, 100, 0);
    assert!(log.segment_count() > 3, "the test needs whole segments");
    // Everything on disk: a clean close, and the next open syncs the directory.
    log.close().unwrap();
    drop(log);
    let (mut log, _) = open_on(&disk, &flusher);
    // The checkpoint meets a full disk, and the directory fsync that would make the
    // deletion of the whole segments below durable fails.
    sim.full_only_for(Some(".tmp"));
    sim.set_capacity(Some(0));
    sim.fail_fsync(true);
    let cut = model[30].0;
    assert!(log.advance_start(cut).is_err());
    let served_start = log.start_offset();
    sim.fail_fsync(false);
    sim.set_capacity(None);
    drop(log);
    sim.power_loss(Tear::LoseAll);
    let (log, _) = open_on(&disk, &flusher);
    // Either the log stopped serving (out of service until a restart), or it served from no
    // further on than the restart does: nothing answered as gone comes back.
    assert!(
        served_start <= log.start_offset(),
        "served from {served_start}, a restart serves from {}",
        log.start_offset()
    );
    assert_eq!(brief(&read_all(&log)), brief(&served(&log, &model)));
    flusher.shutdown();
}

#[test]
fn retention_deletes_segments_durably_oldest_first_so_a_power_loss_brings_back_nothing_it_stopped_serving(
) {
    let (sim, disk, flusher, mut log) = sim_log();
    let model = fill(&mut log, 40, 100, 0);
    assert!(log.segment_count() > 3, "the test needs whole segments");
    log.close().unwrap();
    drop(log);
    let (mut log, _) = open_on(&disk, &flusher);
    // Every sealed segment is past a retention of 1 ms; no directory fsync succeeds.
    log.set_config(LogConfig {
        retention_ms: 1,
        ..small()
    });
    sim.fail_fsync(true);
    let _ = log.enforce_retention(1_000_000);
    let served_start = log.start_offset();
    sim.fail_fsync(false);
    drop(log);
    sim.power_loss(Tear::LoseAll);
    let (log, _) = open_on(&disk, &flusher);
    assert!(
        served_start <= log.start_offset(),
        "served from {served_start}, a restart serves from {}",
        log.start_offset()
    );
    assert_eq!(brief(&read_all(&log)), brief(&served(&log, &model)));
    flusher.shutdown();
}
