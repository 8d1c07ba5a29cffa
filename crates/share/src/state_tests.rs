use uuid::Uuid;

use crate::state::*;

fn key(kind: fn(ShareStateKey) -> ShareRecordKey) -> ShareRecordKey {
    kind(ShareStateKey {
        group_id: "g1".to_string(),
        topic_id: Uuid::from_u128(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10),
        partition: 7,
    })
}

fn batch(first: i64, last: i64, state: DeliveryState, count: i16) -> StateBatch {
    StateBatch {
        first_offset: first,
        last_offset: last,
        delivery_state: state.code(),
        delivery_count: count,
    }
}

fn snapshot() -> ShareSnapshot {
    ShareSnapshot {
        snapshot_epoch: 2,
        state_epoch: 1,
        leader_epoch: 5,
        start_offset: 100,
        delivery_complete_count: -1,
        create_timestamp: 1_000,
        write_timestamp: 2_000,
        state_batches: vec![
            batch(100, 104, DeliveryState::Available, 1),
            batch(105, 105, DeliveryState::Archived, 5),
        ],
    }
}

#[test]
fn keys_are_encoded_as_kafka_coordinator_keys() {
    let bytes = key(ShareRecordKey::Snapshot).encode().unwrap();
    let mut expect = vec![0, 0, 0, 2, b'g', b'1'];
    expect.extend(1u8..=16);
    expect.extend([0, 0, 0, 7]);
    assert_eq!(bytes, expect);
    let update = key(ShareRecordKey::Update).encode().unwrap();
    assert_eq!(&update[..2], &[0, 1]);
    assert_eq!(&update[2..], &expect[2..]);
    for k in [key(ShareRecordKey::Snapshot), key(ShareRecordKey::Update)] {
        assert_eq!(ShareRecordKey::decode(&k.encode().unwrap()), Ok(k));
    }
}

#[test]
fn a_snapshot_value_is_encoded_with_kafkas_flexible_version_0_layout() {
    let bytes = snapshot().encode();
    let mut expect: Vec<u8> = vec![0, 0]; // version 0
    expect.extend(2i32.to_be_bytes());
    expect.extend(1i32.to_be_bytes());
    expect.extend(5i32.to_be_bytes());
    expect.extend(100i64.to_be_bytes());
    expect.extend(1_000i64.to_be_bytes());
    expect.extend(2_000i64.to_be_bytes());
    expect.push(3); // compact array of 2
    for (f, l, s, c) in [(100i64, 104i64, 0u8, 1i16), (105, 105, 4, 5)] {
        expect.extend(f.to_be_bytes());
        expect.extend(l.to_be_bytes());
        expect.push(s);
        expect.extend(c.to_be_bytes());
        expect.push(0); // no tagged fields
    }
    expect.push(0); // no tagged fields (DeliveryCompleteCount is the default -1)
    assert_eq!(bytes, expect);
    assert_eq!(ShareSnapshot::decode(&bytes), Ok(snapshot()));
}

#[test]
fn the_delivery_complete_count_is_a_tagged_field_written_only_when_known() {
    let mut s = snapshot();
    s.delivery_complete_count = 3;
    let bytes = s.encode();
    assert_eq!(&bytes[bytes.len() - 7..], &[1, 0, 4, 0, 0, 0, 3]);
    assert_eq!(ShareSnapshot::decode(&bytes), Ok(s));
    let u = ShareUpdate {
        snapshot_epoch: 2,
        leader_epoch: 5,
        start_offset: -1,
        delivery_complete_count: 9,
        state_batches: vec![batch(1, 2, DeliveryState::Acknowledged, 1)],
    };
    assert_eq!(ShareUpdate::decode(&u.encode()), Ok(u));
}

#[test]
fn an_update_value_is_encoded_with_kafkas_layout() {
    let u = ShareUpdate {
        snapshot_epoch: 2,
        leader_epoch: 5,
        start_offset: -1,
        delivery_complete_count: -1,
        state_batches: vec![],
    };
    let mut expect: Vec<u8> = vec![0, 0];
    expect.extend(2i32.to_be_bytes());
    expect.extend(5i32.to_be_bytes());
    expect.extend((-1i64).to_be_bytes());
    expect.extend([1, 0]); // empty compact array, no tagged fields
    assert_eq!(u.encode(), expect);
    assert_eq!(ShareUpdate::decode(&expect), Ok(u));
}

#[test]
fn unknown_tagged_fields_are_skipped() {
    let mut bytes = snapshot().encode();
    bytes.pop();
    // Two tagged fields: an unknown tag 5 of 2 bytes, then tag 0 (delivery complete count).
    bytes.extend([2, 5, 2, 0xaa, 0xbb, 0, 4, 0, 0, 0, 8]);
    let s = ShareSnapshot::decode(&bytes).unwrap();
    assert_eq!(s.delivery_complete_count, 8);
}

#[test]
fn every_truncation_of_a_record_is_a_typed_error() {
    let mut s = snapshot();
    s.delivery_complete_count = 4;
    let value = s.encode();
    for n in 0..value.len() {
        assert!(ShareSnapshot::decode(&value[..n]).is_err(), "prefix {n}");
    }
    let u = ShareUpdate {
        snapshot_epoch: 1,
        leader_epoch: 1,
        start_offset: 3,
        delivery_complete_count: -1,
        state_batches: s.state_batches.clone(),
    }
    .encode();
    for n in 0..u.len() {
        assert!(ShareUpdate::decode(&u[..n]).is_err(), "prefix {n}");
    }
    let k = key(ShareRecordKey::Update).encode().unwrap();
    for n in 0..k.len() {
        assert!(
            matches!(
                ShareRecordKey::decode(&k[..n]),
                Err(DecodeError::Truncated(_))
            ),
            "prefix {n}"
        );
    }
}

#[test]
fn malformed_records_are_typed_errors() {
    let mut v = snapshot().encode();
    v[1] = 1;
    assert_eq!(
        ShareSnapshot::decode(&v),
        Err(DecodeError::UnsupportedVersion(1))
    );
    let mut v = snapshot().encode();
    v.push(0);
    assert_eq!(
        ShareSnapshot::decode(&v),
        Err(DecodeError::TrailingBytes(1))
    );
    // A null state batches array.
    let mut v = ShareUpdate {
        snapshot_epoch: 0,
        leader_epoch: 0,
        start_offset: 0,
        delivery_complete_count: -1,
        state_batches: vec![],
    }
    .encode();
    let n = v.len();
    v[n - 2] = 0;
    assert!(matches!(
        ShareUpdate::decode(&v),
        Err(DecodeError::InvalidLength(_))
    ));
    // A huge array length with few bytes behind it does not allocate, and fails.
    v[n - 2] = 0xff;
    v.insert(n - 1, 0x7f);
    assert!(ShareUpdate::decode(&v).is_err());
    // A varint longer than five bytes.
    let mut v = snapshot().encode();
    let tail = v.len() - 1;
    v.truncate(tail);
    v.extend([0x80, 0x80, 0x80, 0x80, 0x80, 0x01]);
    assert!(matches!(
        ShareSnapshot::decode(&v),
        Err(DecodeError::BadVarint(_))
    ));
    // Tag 0 with a size other than 4.
    let mut v = snapshot().encode();
    v.pop();
    v.extend([1, 0, 2, 0, 0]);
    assert_eq!(
        ShareSnapshot::decode(&v),
        Err(DecodeError::BadTaggedField { tag: 0, size: 2 })
    );
    // Keys: unknown record type, negative length, invalid UTF-8.
    let mut k = key(ShareRecordKey::Snapshot).encode().unwrap();
    k[1] = 2;
    assert_eq!(
        ShareRecordKey::decode(&k),
        Err(DecodeError::UnknownRecordType(2))
    );
    let mut k = key(ShareRecordKey::Snapshot).encode().unwrap();
    k[2] = 0xff;
    assert_eq!(
        ShareRecordKey::decode(&k),
        Err(DecodeError::InvalidLength("group id"))
    );
    let mut k = key(ShareRecordKey::Snapshot).encode().unwrap();
    k[4] = 0xff;
    assert_eq!(ShareRecordKey::decode(&k), Err(DecodeError::NotUtf8));
    let long = ShareRecordKey::Snapshot(ShareStateKey {
        group_id: "x".repeat(40_000),
        topic_id: Uuid::nil(),
        partition: 0,
    });
    assert_eq!(long.encode(), Err(EncodeError::GroupIdTooLong));
}

#[test]
fn random_bytes_never_panic_the_decoders() {
    let mut rng = crate::test_rng::Rng::new(7);
    let base = snapshot().encode();
    for _ in 0..5_000 {
        let mut v = base.clone();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(v.len() as u64) as usize;
            v[i] = rng.next() as u8;
        }
        let _ = ShareSnapshot::decode(&v);
        let _ = ShareUpdate::decode(&v);
        let _ = ShareRecordKey::decode(&v);
        let len = rng.below(40) as usize;
        let junk: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let _ = ShareSnapshot::decode(&junk);
        let _ = ShareUpdate::decode(&junk);
        let _ = ShareRecordKey::decode(&junk);
    }
}

#[test]
fn an_update_applied_to_a_snapshot_replaces_the_offsets_it_covers() {
    let base = ShareSnapshot {
        state_batches: vec![batch(100, 109, DeliveryState::Available, 1)],
        ..snapshot()
    };
    let update = ShareUpdate {
        snapshot_epoch: 2,
        leader_epoch: 6,
        start_offset: 102,
        delivery_complete_count: -1,
        state_batches: vec![batch(104, 105, DeliveryState::Acknowledged, 1)],
    };
    let next = base.apply(&update);
    assert_eq!(next.start_offset, 102);
    assert_eq!(next.leader_epoch, 6);
    assert_eq!(
        next.state_batches,
        vec![
            batch(102, 103, DeliveryState::Available, 1),
            batch(104, 105, DeliveryState::Acknowledged, 1),
            batch(106, 109, DeliveryState::Available, 1),
        ]
    );
    let unchanged_start = ShareUpdate {
        start_offset: -1,
        ..update
    };
    assert_eq!(base.apply(&unchanged_start).start_offset, 100);
}

#[test]
fn a_snapshot_carries_a_partition_state_unchanged() {
    let state = PartitionState {
        state_epoch: 4,
        leader_epoch: 9,
        start_offset: 12,
        batches: vec![batch(12, 20, DeliveryState::Available, 2)],
    };
    let s = ShareSnapshot::of(&state, 3, 100, 200);
    assert_eq!((s.create_timestamp, s.write_timestamp), (100, 200));
    let back = ShareSnapshot::decode(&s.encode()).unwrap();
    assert_eq!(back.partition_state(), state);
}

#[test]
fn the_delivery_complete_count_counts_acknowledged_and_archived_offsets() {
    let state = PartitionState {
        state_epoch: 0,
        leader_epoch: 0,
        start_offset: 10,
        batches: vec![
            batch(10, 14, DeliveryState::Available, 1),
            batch(15, 16, DeliveryState::Acknowledged, 1),
            batch(17, 19, DeliveryState::Archived, 5),
        ],
    };
    assert_eq!(state.delivery_complete_count(), 5);
    assert_eq!(
        ShareSnapshot::of(&state, 0, 0, 0).delivery_complete_count,
        5
    );
    assert_eq!(PartitionState::default().delivery_complete_count(), 0);
}
