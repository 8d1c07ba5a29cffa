//! ShareService over a real topic registry in a temp dir, with a clock the tests move.

use super::group_configs::GroupConfigs;
use std::sync::Arc;

use bytes::Bytes;
use spate_log::{Flusher, FsyncPolicy};
use spate_protocol::batch::{self, NewRecord};
use spate_protocol::records::Compression;
use spate_share::{AckBatch, AckType, HeartbeatRequest};

use super::*;
use crate::time::ManualClock;

struct Fixture {
    _dir: tempfile::TempDir,
    topics: TopicRegistry,
    clock: Arc<ManualClock>,
    svc: ShareService,
    topic_id: uuid::Uuid,
}

fn settings() -> ShareSettings {
    ShareSettings {
        lock_duration_ms: 1_000,
        auto_offset_reset: spate_share::AutoOffsetReset::Earliest,
        ..ShareSettings::default()
    }
}

fn fixture(records: usize) -> Fixture {
    fixture_with(&vec![0; records], settings())
}

/// A fixture whose records carry these timestamps, one record each.
fn fixture_with(timestamps: &[i64], settings: ShareSettings) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
    let (topics, _) = TopicRegistry::open(dir.path(), flusher).unwrap();
    let topic = topics
        .create("t", 1, crate::TopicConfig::default(), false)
        .unwrap()
        .unwrap();
    let p = topic.partition(0).unwrap();
    for (i, ts) in timestamps.iter().enumerate() {
        let b = batch::build(
            &[NewRecord {
                key: None,
                value: Some(Bytes::from(format!("v-{i}"))),
                timestamp: *ts,
            }],
            None,
            Compression::None,
        )
        .unwrap();
        let h = batch::validate(&b).unwrap();
        p.append(&b, &h, None).unwrap();
    }
    let clock = ManualClock::new(1_000_000);
    let svc = ShareService::open(
        &topics,
        settings,
        GroupConfigs::in_memory(),
        clock.clone(),
        false,
        false,
    )
    .unwrap();
    Fixture {
        topic_id: topic.id,
        _dir: dir,
        topics,
        clock,
        svc,
    }
}

/// A service opened again over the fixture's topics: what a restart resumes.
fn reopen(f: &Fixture) -> ShareService {
    ShareService::open(
        &f.topics,
        settings(),
        GroupConfigs::in_memory(),
        f.clock.clone(),
        false,
        false,
    )
    .unwrap()
}

fn join(f: &Fixture, member: &str) {
    join_to(&f.svc, f, member);
}

/// `member` joins group g of `svc`, subscribed to t.
fn join_to(svc: &ShareService, f: &Fixture, member: &str) {
    let req = HeartbeatRequest {
        member_id: member.into(),
        member_epoch: 0,
        rack_id: None,
        subscribed_topic_names: Some(vec!["t".into()]),
        client_id: "c".into(),
        client_host: "h".into(),
    };
    let (reply, _) = svc.heartbeat(&f.topics, "g", &req);
    reply.unwrap();
}

fn leave(f: &Fixture, member: &str) {
    let req = HeartbeatRequest {
        member_id: member.into(),
        member_epoch: spate_share::LEAVE_EPOCH,
        rack_id: None,
        subscribed_topic_names: None,
        client_id: "c".into(),
        client_host: "h".into(),
    };
    let (reply, _) = f.svc.heartbeat(&f.topics, "g", &req);
    reply.unwrap();
}

fn key(f: &Fixture) -> SpKey {
    ("g".to_string(), f.topic_id, 0)
}

fn ranges(f: &Fixture, member: &str) -> Vec<(i64, i64, i16)> {
    acquire(&f.svc, f, member)
}

/// What `member` acquires through `svc`: (first, last, delivery count) ranges.
fn acquire(svc: &ShareService, f: &Fixture, member: &str) -> Vec<(i64, i64, i16)> {
    let (got, _) = svc
        .acquire(&f.topics, &key(f), member, 100, 1 << 20)
        .unwrap();
    got.ranges
        .iter()
        .map(|r| (r.first, r.last, r.delivery_count))
        .collect()
}

#[test]
fn acquired_records_come_with_the_batches_that_hold_them() {
    let f = fixture(3);
    join(&f, "a");
    let (got, _) = f.svc.acquire(&f.topics, &key(&f), "a", 2, 1 << 20).unwrap();
    assert_eq!(got.ranges.len(), 1);
    assert_eq!((got.ranges[0].first, got.ranges[0].last), (0, 1));
    let batches: Vec<i64> = Batches::new(&got.records)
        .map(|(_, h)| h.base_offset)
        .collect();
    assert_eq!(batches, vec![0, 1], "only the batches of acquired records");
}

#[test]
fn by_duration_starts_a_new_share_partition_at_the_first_record_that_recent() {
    // The clock reads 1,000,000 ms: 30 s back is 970,000, where the third record is.
    let f = fixture_with(
        &[1_000, 500_000, 970_000, 990_000],
        ShareSettings {
            auto_offset_reset: spate_share::AutoOffsetReset::ByDuration(30_000),
            ..settings()
        },
    );
    join(&f, "a");
    assert_eq!(ranges(&f, "a"), vec![(2, 3, 1)]);
    // Nothing that recent: the log end, as `latest`.
    let old = fixture_with(
        &[1_000, 2_000],
        ShareSettings {
            auto_offset_reset: spate_share::AutoOffsetReset::ByDuration(30_000),
            ..settings()
        },
    );
    join(&old, "a");
    assert!(ranges(&old, "a").is_empty());
}

#[test]
fn a_state_the_broker_cannot_use_starts_afresh_under_a_newer_state_epoch() {
    let f = fixture(3);
    // What another writer left: state epoch 3 and a delivery state no schema defines.
    let bad = spate_share::state::ShareSnapshot {
        snapshot_epoch: 0,
        state_epoch: 3,
        leader_epoch: 0,
        start_offset: 0,
        delivery_complete_count: -1,
        create_timestamp: 0,
        write_timestamp: 0,
        state_batches: vec![spate_share::StateBatch {
            first_offset: 0,
            last_offset: 1,
            delivery_state: 9,
            delivery_count: 1,
        }],
    };
    store::StateStore::new(false)
        .write(&f.topics, &key(&f), &bad, 0)
        .unwrap();
    let svc = reopen(&f);
    join_to(&svc, &f, "a");
    assert_eq!(acquire(&svc, &f, "a"), vec![(0, 2, 1)]);
    assert_eq!(svc.coordinator().summary(&key(&f)).unwrap().state_epoch, 4);
}

#[test]
fn a_member_leaving_releases_its_records_for_the_others() {
    let f = fixture(3);
    join(&f, "a");
    join(&f, "b");
    assert_eq!(ranges(&f, "a"), vec![(0, 2, 1)]);
    assert!(ranges(&f, "b").is_empty());
    leave(&f, "a");
    assert_eq!(ranges(&f, "b"), vec![(0, 2, 2)]);
}

#[test]
fn the_ticker_expires_locks_and_wakes_parked_fetches() {
    let f = fixture(2);
    join(&f, "a");
    join(&f, "b");
    assert_eq!(ranges(&f, "a"), vec![(0, 1, 1)]);
    let mut released = f.svc.watch_released();
    released.borrow_and_update();
    f.clock.advance(1_000);
    f.svc.tick(&f.topics);
    assert!(released.has_changed().unwrap(), "parked fetches are woken");
    assert_eq!(ranges(&f, "b"), vec![(0, 1, 2)]);
}

#[test]
fn a_member_whose_session_times_out_is_removed_and_its_records_released() {
    let f = fixture(1);
    join(&f, "a");
    assert_eq!(ranges(&f, "a"), vec![(0, 0, 1)]);
    // Kafka's default group.share.session.timeout.ms: 45 s.
    f.clock.advance(45_001);
    f.svc.tick(&f.topics);
    assert_eq!(f.svc.has_members("g"), Some(false));
    join(&f, "b");
    assert_eq!(ranges(&f, "b"), vec![(0, 0, 2)]);
}

#[test]
fn the_state_written_is_the_state_a_reopened_service_resumes() {
    let f = fixture(4);
    join(&f, "a");
    assert_eq!(ranges(&f, "a"), vec![(0, 3, 1)]);
    f.svc
        .acknowledge(
            &f.topics,
            &key(&f),
            "a",
            &[AckBatch::new(0, 1, AckType::Accept)],
        )
        .unwrap();
    let reopened = reopen(&f);
    assert_eq!(
        reopened.start_offsets("g").unwrap(),
        vec![(key(&f), 2, 0)],
        "0 and 1 accepted"
    );
    assert_eq!(
        reopened.has_members("g"),
        Some(false),
        "the group is back, Empty"
    );
    assert_eq!(
        acquire(&reopened, &f, "b"),
        vec![(2, 3, 2)],
        "in flight before: delivered once already"
    );
}

#[test]
fn deleting_an_empty_group_forgets_its_state_and_a_busy_one_is_refused() {
    let f = fixture(1);
    join(&f, "a");
    assert_eq!(ranges(&f, "a"), vec![(0, 0, 1)]);
    assert_eq!(
        f.svc.delete_group(&f.topics, "g"),
        Err(ResponseError::NonEmptyGroup)
    );
    leave(&f, "a");
    f.svc.delete_group(&f.topics, "g").unwrap();
    assert_eq!(f.svc.start_offsets("g"), None);
    let reopened = reopen(&f);
    assert_eq!(
        reopened.start_offsets("g"),
        None,
        "the tombstone is replayed"
    );
}
