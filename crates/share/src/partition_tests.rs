use crate::partition::*;
use crate::state::{DeliveryState, PartitionState, StateBatch};

const LOCK: i64 = 30_000;

fn sp() -> SharePartition {
    SharePartition::new(SharePartitionConfig::default(), 0)
}

fn with(max_in_flight: u32, limit: i16) -> SharePartition {
    SharePartition::new(
        SharePartitionConfig {
            max_in_flight,
            delivery_count_limit: limit,
        },
        0,
    )
}

fn range(first: Offset, last: Offset, delivery_count: i16) -> AcquiredRange {
    AcquiredRange {
        first,
        last,
        delivery_count,
    }
}

fn acquired(member: &str, deadline_ms: i64) -> RecordState {
    RecordState::Acquired {
        member: member.to_string(),
        deadline_ms,
    }
}

#[test]
fn new_records_are_acquired_from_the_end_offset_with_delivery_count_one() {
    let mut p = sp();
    let got = p.acquire("a", &[0..=9], 100, LOCK, 1_000);
    assert_eq!(got, vec![range(0, 9, 1)]);
    assert_eq!(p.start_offset(), 0);
    assert_eq!(p.end_offset(), 10);
    assert_eq!(p.in_flight_count(), 10);
    assert_eq!(p.acquired_count(), 10);
    assert_eq!(p.record(3), Some((acquired("a", 31_000), 1)));
    assert_eq!(p.batch_count(), 1);
    p.check_invariants();
}

#[test]
fn acquisition_is_bounded_by_max_records() {
    let mut p = sp();
    assert_eq!(p.acquire("a", &[0..=99], 10, LOCK, 0), vec![range(0, 9, 1)]);
    assert_eq!(
        p.acquire("b", &[10..=99], 5, LOCK, 0),
        vec![range(10, 14, 1)]
    );
    assert_eq!(p.end_offset(), 15);
    assert!(p.acquire("b", &[15..=99], 0, LOCK, 0).is_empty());
    p.check_invariants();
}

#[test]
fn records_acquired_by_another_member_are_skipped() {
    let mut p = sp();
    p.acquire("a", &[0..=9], 100, LOCK, 0);
    // b reads the same log range: nothing in it is free, the rest is new.
    let got = p.acquire("b", &[0..=14], 100, LOCK, 0);
    assert_eq!(got, vec![range(10, 14, 1)]);
    assert_eq!(p.record(5).map(|r| r.0), Some(acquired("a", LOCK)));
    assert_eq!(p.record(12).map(|r| r.0), Some(acquired("b", LOCK)));
    p.check_invariants();
}

#[test]
fn no_new_records_are_acquired_beyond_max_in_flight() {
    let mut p = with(10, 5);
    assert_eq!(
        p.acquire("a", &[0..=99], 100, LOCK, 0),
        vec![range(0, 9, 1)]
    );
    assert!(p.acquire("b", &[10..=99], 100, LOCK, 0).is_empty());
    assert_eq!(p.end_offset(), 10);
    // Once the head is acknowledged the window slides and new records flow again.
    p.acknowledge("a", &[AckBatch::new(0, 3, AckType::Accept)], 1)
        .unwrap();
    assert_eq!(p.start_offset(), 4);
    assert_eq!(
        p.acquire("b", &[10..=99], 100, LOCK, 1),
        vec![range(10, 13, 1)]
    );
    p.check_invariants();
}

#[test]
fn available_records_are_redelivered_before_new_ones_even_at_the_in_flight_limit() {
    let mut p = with(10, 5);
    p.acquire("a", &[0..=9], 100, LOCK, 0);
    p.acknowledge("a", &[AckBatch::new(5, 9, AckType::Release)], 1)
        .unwrap();
    assert_eq!(p.next_fetch_offset(), 5);
    let got = p.acquire("b", &[5..=20], 100, LOCK, 2);
    assert_eq!(got, vec![range(5, 9, 2)]);
    assert_eq!(p.metrics().redeliveries, 5);
    p.check_invariants();
}

#[test]
fn a_released_record_is_redelivered_with_its_count_incremented() {
    let mut p = sp();
    p.acquire("a", &[0..=4], 100, LOCK, 0);
    p.acknowledge("a", &[AckBatch::new(2, 2, AckType::Release)], 10)
        .unwrap();
    assert_eq!(p.record(2), Some((RecordState::Available, 1)));
    assert_eq!(p.next_fetch_offset(), 2);
    let got = p.acquire("b", &[2..=4], 100, LOCK, 20);
    assert_eq!(got, vec![range(2, 2, 2)]);
    assert_eq!(p.record(2), Some((acquired("b", 20 + LOCK), 2)));
    p.check_invariants();
}

#[test]
fn a_record_at_the_delivery_limit_is_archived_not_redelivered() {
    let mut p = with(100, 2);
    p.acquire("a", &[0..=1], 100, LOCK, 0);
    p.acknowledge("a", &[AckBatch::new(0, 1, AckType::Release)], 1)
        .unwrap();
    assert_eq!(p.acquire("a", &[0..=1], 100, LOCK, 2), vec![range(0, 1, 2)]);
    p.acknowledge("a", &[AckBatch::new(0, 0, AckType::Release)], 3)
        .unwrap();
    // Offset 0 reached the limit: archived; the start offset moves past it.
    assert_eq!(p.start_offset(), 1);
    assert_eq!(p.record(0), None);
    assert_eq!(p.metrics().archived, 1);
    assert_eq!(p.next_fetch_offset(), 2);
    p.check_invariants();
}

#[test]
fn an_expired_lock_at_the_delivery_limit_archives_the_record() {
    let mut p = with(100, 1);
    p.acquire("a", &[0..=4], 100, 100, 0);
    assert_eq!(p.expire_locks(100), 5);
    assert_eq!(p.start_offset(), 5);
    assert_eq!(p.metrics().archived, 5);
    assert_eq!(p.metrics().lock_expiries, 5);
    p.check_invariants();
}

#[test]
fn an_accepted_record_is_acknowledged_and_the_start_offset_moves_over_the_completed_prefix() {
    let mut p = sp();
    p.acquire("a", &[0..=9], 100, LOCK, 0);
    p.acknowledge("a", &[AckBatch::new(3, 5, AckType::Accept)], 1)
        .unwrap();
    assert_eq!(p.start_offset(), 0);
    assert_eq!(p.record(4), Some((RecordState::Acknowledged, 1)));
    p.acknowledge("a", &[AckBatch::new(0, 2, AckType::Reject)], 1)
        .unwrap();
    assert_eq!(p.start_offset(), 6, "0..=2 archived and 3..=5 acknowledged");
    assert_eq!(p.record(4), None);
    assert_eq!(p.metrics().accepted, 3);
    assert_eq!(p.metrics().archived, 3);
    p.check_invariants();
}

#[test]
fn a_fully_acknowledged_window_leaves_no_in_flight_state() {
    let mut p = sp();
    p.acquire("a", &[0..=9], 100, LOCK, 0);
    p.acknowledge("a", &[AckBatch::new(0, 9, AckType::Accept)], 1)
        .unwrap();
    assert_eq!((p.start_offset(), p.end_offset()), (10, 10));
    assert_eq!(p.batch_count(), 0);
    assert_eq!(p.in_flight_count(), 0);
    assert_eq!(p.next_fetch_offset(), 10);
    p.check_invariants();
}

#[test]
fn an_ack_from_a_member_that_does_not_hold_the_lock_is_invalid_record_state() {
    let mut p = sp();
    p.acquire("a", &[0..=9], 100, LOCK, 0);
    let err = p
        .acknowledge("b", &[AckBatch::new(0, 0, AckType::Accept)], 1)
        .unwrap_err();
    assert!(matches!(err, AckError::NotAcquired { offset: 0, .. }));
    assert_eq!(
        err.error(),
        kafka_protocol::error::ResponseError::InvalidRecordState
    );
    assert_eq!(p.record(0), Some((acquired("a", LOCK), 1)));
}

#[test]
fn an_ack_of_an_available_or_acknowledged_record_is_invalid_record_state() {
    let mut p = sp();
    p.acquire("a", &[0..=9], 100, LOCK, 0);
    p.acknowledge("a", &[AckBatch::new(1, 1, AckType::Release)], 1)
        .unwrap();
    p.acknowledge("a", &[AckBatch::new(2, 2, AckType::Accept)], 1)
        .unwrap();
    for o in [1, 2] {
        let err = p
            .acknowledge("a", &[AckBatch::new(o, o, AckType::Accept)], 2)
            .unwrap_err();
        assert_eq!(
            err.error(),
            kafka_protocol::error::ResponseError::InvalidRecordState
        );
    }
}

#[test]
fn an_ack_after_the_lock_expired_is_refused_and_the_record_is_available_again() {
    let mut p = sp();
    p.acquire("a", &[0..=4], 100, 100, 0);
    let err = p
        .acknowledge("a", &[AckBatch::new(0, 4, AckType::Accept)], 100)
        .unwrap_err();
    assert_eq!(err, AckError::LockExpired { offset: 0 });
    assert_eq!(
        err.error(),
        kafka_protocol::error::ResponseError::InvalidRecordState
    );
    assert_eq!(p.record(0), Some((RecordState::Available, 1)));
    assert_eq!(p.metrics().lock_expiries, 5);
    p.check_invariants();
}

#[test]
fn an_ack_past_the_acquired_records_is_invalid_request() {
    let mut p = sp();
    p.acquire("a", &[0..=4], 100, LOCK, 0);
    let err = p
        .acknowledge("a", &[AckBatch::new(3, 7, AckType::Accept)], 1)
        .unwrap_err();
    assert_eq!(
        err,
        AckError::OutsideWindow {
            offset: 7,
            end_offset: 5
        }
    );
    assert_eq!(
        err.error(),
        kafka_protocol::error::ResponseError::InvalidRequest
    );
}

#[test]
fn an_ack_below_the_start_offset_is_ignored() {
    let mut p = sp();
    p.acquire("a", &[0..=9], 100, LOCK, 0);
    p.acknowledge("a", &[AckBatch::new(0, 4, AckType::Accept)], 1)
        .unwrap();
    // A retry of the same acknowledgement, and one that straddles the start offset.
    p.acknowledge("a", &[AckBatch::new(0, 4, AckType::Accept)], 2)
        .unwrap();
    p.acknowledge("a", &[AckBatch::new(2, 6, AckType::Accept)], 2)
        .unwrap();
    assert_eq!(p.start_offset(), 7);
    assert_eq!(p.metrics().accepted, 7);
}

#[test]
fn malformed_ack_batches_are_invalid_request() {
    let mut p = sp();
    p.acquire("a", &[0..=9], 100, LOCK, 0);
    let cases = [
        vec![AckBatch::new(5, 4, AckType::Accept)],
        vec![AckBatch {
            first: 0,
            last: 3,
            types: vec![AckType::Accept, AckType::Reject],
        }],
        vec![AckBatch {
            first: 0,
            last: 3,
            types: vec![],
        }],
        vec![
            AckBatch::new(0, 3, AckType::Accept),
            AckBatch::new(3, 5, AckType::Accept),
        ],
    ];
    for batches in cases {
        let err = p.acknowledge("a", &batches, 1).unwrap_err();
        assert!(matches!(err, AckError::InvalidBatch { .. }), "{err:?}");
        assert_eq!(
            err.error(),
            kafka_protocol::error::ResponseError::InvalidRequest
        );
    }
    assert_eq!(p.acquired_count(), 10, "nothing applied");
}

#[test]
fn a_failed_acknowledgement_applies_none_of_its_batches() {
    let mut p = sp();
    p.acquire("a", &[0..=4], 100, LOCK, 0);
    p.acquire("b", &[5..=9], 100, LOCK, 0);
    let err = p
        .acknowledge(
            "a",
            &[
                AckBatch::new(0, 4, AckType::Accept),
                AckBatch::new(5, 5, AckType::Accept),
            ],
            1,
        )
        .unwrap_err();
    assert!(matches!(err, AckError::NotAcquired { offset: 5, .. }));
    assert_eq!(p.start_offset(), 0);
    assert_eq!(p.acquired_count(), 10);
}

#[test]
fn per_record_ack_types_split_a_batch_and_equal_neighbours_merge_again() {
    let mut p = sp();
    p.acquire("a", &[0..=9], 100, LOCK, 0);
    assert_eq!(p.batch_count(), 1);
    use AckType::*;
    p.acknowledge(
        "a",
        &[AckBatch {
            first: 2,
            last: 7,
            types: vec![Accept, Release, Release, Reject, Accept, Gap],
        }],
        1,
    )
    .unwrap();
    // 0..=1 acquired | 2 acked | 3..=4 available | 5 archived | 6 acked | 7 archived | 8..=9 acquired
    assert_eq!(p.batch_count(), 7);
    assert_eq!(p.record(3), Some((RecordState::Available, 1)));
    assert_eq!(p.record(5), Some((RecordState::Archived, 1)));
    assert_eq!(p.record(7), Some((RecordState::Archived, 1)));
    p.check_invariants();
    // Acknowledging the rest merges neighbours that end up equal; the start offset moves.
    p.acknowledge("a", &[AckBatch::new(0, 1, Accept)], 2)
        .unwrap();
    assert_eq!(p.start_offset(), 3);
    p.acquire("b", &[3..=4], 100, LOCK, 2);
    p.acknowledge("b", &[AckBatch::new(3, 4, Accept)], 3)
        .unwrap();
    assert_eq!(p.start_offset(), 8);
    assert_eq!(p.batch_count(), 1);
    p.check_invariants();
}

#[test]
fn two_thousand_in_flight_records_take_a_few_batches() {
    let mut p = sp();
    for i in 0..20 {
        let first = i * 100;
        p.acquire(&format!("m{}", i % 4), &[first..=first + 99], 100, LOCK, 0);
    }
    assert_eq!(p.in_flight_count(), 2_000);
    assert!(p.batch_count() <= 20, "{} batches", p.batch_count());
    assert!(p.acquire("x", &[2_000..=2_100], 100, LOCK, 0).is_empty());
    p.check_invariants();
}

#[test]
fn releasing_a_member_makes_its_records_available_with_their_count() {
    let mut p = sp();
    p.acquire("a", &[0..=4], 100, LOCK, 0);
    p.acquire("b", &[5..=9], 100, LOCK, 0);
    assert_eq!(p.release_member("a", 1), 5);
    assert_eq!(p.record(0), Some((RecordState::Available, 1)));
    assert_eq!(p.record(5), Some((acquired("b", LOCK), 1)));
    assert_eq!(p.release_member("a", 1), 0);
    assert_eq!(p.metrics().lock_expiries, 0, "a release is not an expiry");
    p.check_invariants();
}

#[test]
fn expire_locks_only_expires_locks_past_their_deadline() {
    let mut p = sp();
    p.acquire("a", &[0..=4], 100, 100, 0);
    p.acquire("b", &[5..=9], 100, 200, 0);
    assert_eq!(p.expire_locks(99), 0);
    assert_eq!(p.expire_locks(100), 5);
    assert_eq!(p.record(0), Some((RecordState::Available, 1)));
    assert_eq!(p.record(5).map(|r| r.0), Some(acquired("b", 200)));
    assert_eq!(p.expire_locks(1_000), 5);
    assert_eq!(p.metrics().lock_expiries, 10);
    assert_eq!(p.batch_count(), 1, "all available with count 1: one batch");
    p.check_invariants();
}

#[test]
fn holes_in_what_the_log_returned_are_archived_as_records_that_do_not_exist() {
    let mut p = sp();
    // Compacted log: 3..=4 and 8 are gone; the read started at 0.
    let got = p.acquire("a", &[0..=2, 5..=7, 9..=9], 100, LOCK, 0);
    assert_eq!(got, vec![range(0, 2, 1), range(5, 7, 1), range(9, 9, 1)]);
    assert_eq!(p.record(3), Some((RecordState::Archived, 0)));
    assert_eq!(p.record(8), Some((RecordState::Archived, 0)));
    // A GAP acknowledgement for an offset already archived is accepted.
    p.acknowledge(
        "a",
        &[
            AckBatch::new(0, 2, AckType::Accept),
            AckBatch::new(3, 4, AckType::Gap),
        ],
        1,
    )
    .unwrap();
    assert_eq!(p.start_offset(), 5);
    p.check_invariants();
}

#[test]
fn a_read_that_starts_past_the_end_offset_archives_the_skipped_offsets() {
    let mut p = SharePartition::new(SharePartitionConfig::default(), 10);
    let got = p.acquire("a", &[15..=19], 100, LOCK, 0);
    assert_eq!(got, vec![range(15, 19, 1)]);
    assert_eq!(p.start_offset(), 15);
    assert_eq!(p.end_offset(), 20);
    p.check_invariants();
}

#[test]
fn fetched_ranges_below_the_start_offset_are_ignored() {
    let mut p = SharePartition::new(SharePartitionConfig::default(), 10);
    let got = p.acquire("a", &[0..=12], 100, LOCK, 0);
    assert_eq!(got, vec![range(10, 12, 1)]);
    assert!(p.acquire("a", &[0..=5], 100, LOCK, 0).is_empty());
}

#[test]
fn the_log_start_moving_up_drops_the_state_below_it() {
    let mut p = sp();
    p.acquire("a", &[0..=9], 100, LOCK, 0);
    p.update_log_start(4);
    assert_eq!(p.start_offset(), 4);
    assert_eq!(p.record(3), None);
    assert_eq!(p.acquired_count(), 6);
    // An acknowledgement that straddles the new start applies to what is left.
    p.acknowledge("a", &[AckBatch::new(0, 9, AckType::Accept)], 1)
        .unwrap();
    assert_eq!((p.start_offset(), p.end_offset()), (10, 10));
    p.update_log_start(50);
    assert_eq!((p.start_offset(), p.end_offset()), (50, 50));
    p.check_invariants();
}

#[test]
fn reset_to_is_refused_while_records_are_acquired_and_bumps_the_state_epoch() {
    let mut p = sp();
    p.acquire("a", &[0..=9], 100, LOCK, 0);
    let err = p.reset_to(100, 1).unwrap_err();
    assert_eq!(err, ResetError::RecordsAcquired(10));
    assert_eq!(
        err.error(),
        kafka_protocol::error::ResponseError::NonEmptyGroup
    );
    p.release_member("a", 1);
    p.reset_to(100, 1).unwrap();
    assert_eq!((p.start_offset(), p.end_offset()), (100, 100));
    assert_eq!(p.state_epoch(), 1);
    assert_eq!(p.reset_to(-1, 1), Err(ResetError::InvalidOffset(-1)));
    // Expired locks do not block a reset.
    p.acquire("a", &[100..=109], 100, 10, 1);
    p.reset_to(0, 11).unwrap();
    assert_eq!(p.start_offset(), 0);
}

#[test]
fn auto_offset_reset_picks_the_start_offset() {
    assert_eq!(
        AutoOffsetReset::parse("latest"),
        Some(AutoOffsetReset::Latest)
    );
    assert_eq!(
        AutoOffsetReset::parse("EARLIEST"),
        Some(AutoOffsetReset::Earliest)
    );
    assert_eq!(
        AutoOffsetReset::parse("by_duration:P1DT2H3M4S"),
        Some(AutoOffsetReset::ByDuration(
            86_400_000 + 2 * 3_600_000 + 3 * 60_000 + 4_000
        ))
    );
    assert_eq!(
        AutoOffsetReset::parse("by_duration:PT15M"),
        Some(AutoOffsetReset::ByDuration(900_000))
    );
    assert_eq!(AutoOffsetReset::parse("by_duration:P"), None);
    assert_eq!(AutoOffsetReset::parse("by_duration:PT"), None);
    assert_eq!(AutoOffsetReset::parse("by_duration:1H"), None);
    assert_eq!(AutoOffsetReset::parse("none"), None);
    assert_eq!(AutoOffsetReset::default(), AutoOffsetReset::Latest);
    assert_eq!(AutoOffsetReset::Latest.start_offset(5, 50, None), 50);
    assert_eq!(AutoOffsetReset::Earliest.start_offset(5, 50, None), 5);
    let d = AutoOffsetReset::ByDuration(1_000);
    assert_eq!(d.start_offset(5, 50, Some(20)), 20);
    assert_eq!(d.start_offset(5, 50, None), 50);
    assert_eq!(d.start_offset(5, 50, Some(0)), 5);
}

#[test]
fn ack_types_round_trip_their_wire_codes() {
    for code in 0..4 {
        assert_eq!(AckType::from_code(code).map(AckType::code), Some(code));
    }
    assert_eq!(AckType::from_code(4), None);
    assert_eq!(AckType::from_code(-1), None);
}

#[test]
fn a_snapshot_writes_acquired_records_as_available_and_merges_equal_neighbours() {
    let mut p = sp();
    p.acquire("a", &[0..=4], 100, LOCK, 0);
    p.acquire("b", &[5..=9], 100, LOCK, 0);
    p.acknowledge("b", &[AckBatch::new(8, 9, AckType::Accept)], 1)
        .unwrap();
    let s = p.snapshot();
    assert_eq!(s.start_offset, 0);
    assert_eq!(
        s.batches,
        vec![
            StateBatch {
                first_offset: 0,
                last_offset: 7,
                delivery_state: DeliveryState::Available.code(),
                delivery_count: 1
            },
            StateBatch {
                first_offset: 8,
                last_offset: 9,
                delivery_state: DeliveryState::Acknowledged.code(),
                delivery_count: 1
            },
        ]
    );
}

#[test]
fn a_new_leader_resumes_with_acquired_records_available_and_their_delivery_count() {
    let mut p = sp();
    p.acquire("a", &[0..=9], 100, LOCK, 0);
    p.acknowledge("a", &[AckBatch::new(5, 6, AckType::Accept)], 1)
        .unwrap();
    let mut q = SharePartition::from_state(SharePartitionConfig::default(), &p.snapshot()).unwrap();
    assert_eq!(q.record(0), Some((RecordState::Available, 1)));
    assert_eq!(q.record(5), Some((RecordState::Acknowledged, 1)));
    assert_eq!(q.end_offset(), 10);
    assert_eq!(q.acquired_count(), 0);
    // The next delivery is the second.
    assert_eq!(
        q.acquire("b", &[0..=12], 100, LOCK, 2),
        vec![range(0, 4, 2), range(7, 9, 2), range(10, 12, 1)]
    );
    q.check_invariants();
}

#[test]
fn recovery_archives_acquired_records_at_the_delivery_limit_and_fills_unmentioned_offsets() {
    let state = PartitionState {
        state_epoch: 3,
        leader_epoch: 7,
        start_offset: 10,
        batches: vec![
            StateBatch {
                first_offset: 10,
                last_offset: 11,
                delivery_state: DeliveryState::Acquired.code(),
                delivery_count: 5,
            },
            StateBatch {
                first_offset: 15,
                last_offset: 19,
                delivery_state: DeliveryState::Available.code(),
                delivery_count: 2,
            },
        ],
    };
    let p = SharePartition::from_state(SharePartitionConfig::default(), &state).unwrap();
    assert_eq!(p.start_offset(), 12, "10..=11 archived at the limit");
    assert_eq!(p.record(12), Some((RecordState::Available, 0)));
    assert_eq!(p.record(16), Some((RecordState::Available, 2)));
    assert_eq!(p.end_offset(), 20);
    assert_eq!(p.state_epoch(), 3);
    assert_eq!(p.snapshot().leader_epoch, 7);
    p.check_invariants();
}

#[test]
fn an_invalid_durable_state_is_refused() {
    let batch = |first, last, state| StateBatch {
        first_offset: first,
        last_offset: last,
        delivery_state: state,
        delivery_count: 1,
    };
    let load = |start, batches| {
        SharePartition::from_state(
            SharePartitionConfig::default(),
            &PartitionState {
                state_epoch: 0,
                leader_epoch: 0,
                start_offset: start,
                batches,
            },
        )
        .map(|_| ())
    };
    assert_eq!(
        load(10, vec![batch(5, 12, 0)]),
        Err(LoadError::BelowStart {
            first: 5,
            start_offset: 10
        })
    );
    assert_eq!(
        load(0, vec![batch(5, 4, 0)]),
        Err(LoadError::InvalidBatch { first: 5, last: 4 })
    );
    assert_eq!(
        load(0, vec![batch(0, 5, 0), batch(5, 6, 2)]),
        Err(LoadError::Overlap(5))
    );
    assert_eq!(
        load(0, vec![batch(0, 5, 3)]),
        Err(LoadError::UnknownDeliveryState(3))
    );
    // Kafka's "no start offset" (-1) loads as 0.
    assert_eq!(load(-1, vec![]), Ok(()));
}

#[test]
fn take_changes_gives_the_share_updates_to_write() {
    let mut p = sp();
    assert_eq!(p.take_changes(), StateChange::Unchanged);
    p.acquire("a", &[0..=9], 100, 100, 0);
    let available = |first, last, count| StateBatch {
        first_offset: first,
        last_offset: last,
        delivery_state: DeliveryState::Available.code(),
        delivery_count: count,
    };
    assert_eq!(
        p.take_changes(),
        StateChange::Update {
            start_offset: None,
            batches: vec![available(0, 9, 1)]
        }
    );
    p.acknowledge("a", &[AckBatch::new(0, 4, AckType::Accept)], 1)
        .unwrap();
    assert_eq!(
        p.take_changes(),
        StateChange::Update {
            start_offset: Some(5),
            batches: vec![]
        }
    );
    p.acknowledge("a", &[AckBatch::new(7, 7, AckType::Reject)], 1)
        .unwrap();
    assert_eq!(
        p.take_changes(),
        StateChange::Update {
            start_offset: None,
            batches: vec![StateBatch {
                first_offset: 7,
                last_offset: 7,
                delivery_state: DeliveryState::Archived.code(),
                delivery_count: 1
            }]
        }
    );
    // A lock expiring changes nothing durable: acquired records are written as available.
    assert_eq!(p.expire_locks(100), 4);
    assert_eq!(p.take_changes(), StateChange::Unchanged);
    p.reset_to(50, 100).unwrap();
    assert_eq!(
        p.take_changes(),
        StateChange::Snapshot(PartitionState {
            state_epoch: 1,
            leader_epoch: 0,
            start_offset: 50,
            batches: vec![]
        })
    );
}

#[test]
fn extreme_offsets_are_handled_without_overflow() {
    let mut p = sp();
    let got = p.acquire("a", &[0..=Offset::MAX], u32::MAX, i64::MAX, i64::MAX - 1);
    assert_eq!(got, vec![range(0, 1_999, 1)]);
    let err = p
        .acknowledge("a", &[AckBatch::new(0, Offset::MAX, AckType::Accept)], 0)
        .unwrap_err();
    assert!(matches!(err, AckError::OutsideWindow { .. }));
    let huge = AckBatch {
        first: 0,
        last: Offset::MAX,
        types: vec![AckType::Accept, AckType::Accept],
    };
    assert!(matches!(
        p.acknowledge("a", &[huge], 0),
        Err(AckError::InvalidBatch { .. })
    ));
    let state = PartitionState {
        state_epoch: 0,
        leader_epoch: 0,
        start_offset: 0,
        batches: vec![StateBatch {
            first_offset: 0,
            last_offset: Offset::MAX,
            delivery_state: 0,
            delivery_count: 0,
        }],
    };
    assert!(SharePartition::from_state(SharePartitionConfig::default(), &state).is_err());
    let mut q = SharePartition::new(SharePartitionConfig::default(), Offset::MAX - 10);
    assert_eq!(
        q.acquire("a", &[Offset::MAX - 10..=Offset::MAX - 1], 5, 10, 0),
        vec![range(Offset::MAX - 10, Offset::MAX - 6, 1)]
    );
    q.update_log_start(Offset::MAX - 1);
    q.check_invariants();
}
