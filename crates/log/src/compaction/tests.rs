use std::collections::BTreeMap;

use super::*;

/// A tiny deterministic generator, so the model test needs no dependency.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// One record of a generated log: offset, time, key (None: keyless), value (None: tombstone).
#[derive(Clone, Debug)]
struct Rec {
    offset: i64,
    ts: i64,
    key: Option<Vec<u8>>,
    value: Option<u32>,
}

fn plain() -> BatchFacts {
    BatchFacts {
        producer_id: -1,
        transactional: false,
        control: None,
        last_offset: 0,
        max_timestamp: 0,
    }
}

fn facts(r: &Rec) -> RecordFacts<'_> {
    RecordFacts {
        offset: r.offset,
        timestamp: r.ts,
        key: r.key.as_deref(),
        has_value: r.value.is_some(),
    }
}

/// Cleans `log` whole (every record dirty) at `horizon`, as one pass.
fn clean(log: &[Rec], horizon: i64) -> Vec<i64> {
    let mut map = OffsetMap::with_buffer_bytes(1 << 20);
    for r in log {
        match &r.key {
            Some(k) => assert!(map.put(k, r.offset)),
            None => map.skip(r.offset),
        }
    }
    let mut sweep = Sweep::new(&map, Vec::new(), horizon);
    log.iter()
        .filter(|r| sweep.keep_record(&plain(), &facts(r)))
        .map(|r| r.offset)
        .collect()
}

#[test]
fn a_clean_keeps_exactly_the_latest_value_per_key_and_young_tombstones_over_random_logs() {
    for seed in 0..200 {
        let mut rng = Lcg(seed);
        let keys = 1 + rng.next(20);
        let mut log = Vec::new();
        let mut ts = 0;
        for offset in 0..(50 + rng.next(300) as i64) {
            ts += rng.next(100) as i64;
            let key = (rng.next(10) != 0).then(|| format!("k{}", rng.next(keys)).into_bytes());
            let value = (rng.next(5) != 0).then(|| rng.next(1000) as u32);
            log.push(Rec {
                offset,
                ts,
                key,
                value,
            });
        }
        let horizon = rng.next(ts.max(1) as u64) as i64;
        // The model: per key its last record; a tombstone only when not older than the horizon;
        // keyless records always.
        let mut last: BTreeMap<Vec<u8>, &Rec> = BTreeMap::new();
        for r in &log {
            if let Some(k) = &r.key {
                last.insert(k.clone(), r);
            }
        }
        let mut want: Vec<i64> = last
            .values()
            .filter(|r| r.value.is_some() || r.ts >= horizon)
            .map(|r| r.offset)
            .chain(log.iter().filter(|r| r.key.is_none()).map(|r| r.offset))
            .collect();
        want.sort_unstable();
        let got = clean(&log, horizon);
        assert_eq!(got, want, "seed {seed}");
        // A second clean of the cleaned log changes nothing (at the same horizon).
        let kept: Vec<Rec> = log
            .iter()
            .filter(|r| got.contains(&r.offset))
            .cloned()
            .collect();
        assert_eq!(clean(&kept, horizon), got, "seed {seed}: not idempotent");
    }
}

#[test]
fn a_key_outside_the_mapped_section_keeps_its_record() {
    // An earlier clean covered offsets below 10: its survivors are not in this map.
    let mut map = OffsetMap::with_buffer_bytes(1 << 10);
    map.put(b"b", 11);
    let mut sweep = Sweep::new(&map, Vec::new(), 0);
    let old_a = RecordFacts {
        offset: 3,
        timestamp: 0,
        key: Some(b"a"),
        has_value: true,
    };
    let old_b = RecordFacts {
        key: Some(b"b"),
        offset: 4,
        ..old_a
    };
    assert!(sweep.keep_record(&plain(), &old_a));
    assert!(!sweep.keep_record(&plain(), &old_b), "b has a later record");
}

#[test]
fn a_full_map_refuses_new_keys_and_says_where_the_section_ends() {
    let mut map = OffsetMap::with_buffer_bytes(2 * BYTES_PER_ENTRY);
    assert!(map.put(b"a", 0));
    assert!(map.put(b"b", 1));
    assert!(map.put(b"a", 2), "a known key still updates");
    map.skip(3);
    assert!(!map.put(b"c", 4), "a third key does not fit");
    assert_eq!((map.len(), map.end()), (2, 4));
    assert_eq!(map.latest(b"a"), Some(2));
}

#[test]
fn aborted_records_go_and_markers_stay_while_their_transaction_has_records() {
    let mut map = OffsetMap::with_buffer_bytes(1 << 10);
    // Producer 7: offsets 0-1 aborted (marker 2); offsets 3-4 committed (marker 5), key x
    // rewritten at 6 by a plain producer.
    for (k, o) in [(b"x", 0), (b"y", 1), (b"x", 3), (b"z", 4), (b"x", 6)] {
        map.put(k, o);
    }
    let aborted = vec![Aborted {
        producer_id: 7,
        first_offset: 0,
        marker_offset: 2,
    }];
    let txn = BatchFacts {
        producer_id: 7,
        transactional: true,
        control: None,
        last_offset: 4,
        max_timestamp: 100,
    };
    let marker = |kind, at| BatchFacts {
        control: Some(kind),
        last_offset: at,
        ..txn
    };
    let rec = |offset, key: &'static [u8]| RecordFacts {
        offset,
        timestamp: 100,
        key: Some(key),
        has_value: true,
    };
    let mut sweep = Sweep::new(&map, aborted.clone(), 50);
    assert!(!sweep.keep_record(&txn, &rec(0, b"x")));
    assert!(
        !sweep.keep_record(&txn, &rec(1, b"y")),
        "aborted, though y's latest"
    );
    assert!(
        sweep.keep_marker(&marker(ControlKind::Abort, 2)),
        "the abort marker is younger than the horizon"
    );
    assert!(
        !sweep.keep_record(&txn, &rec(3, b"x")),
        "x is rewritten at 6"
    );
    assert!(sweep.keep_record(&txn, &rec(4, b"z")));
    assert!(
        sweep.keep_marker(&marker(ControlKind::Commit, 5)),
        "z still belongs to the committed transaction"
    );
    // Later, with z rewritten too and past the horizon: nothing of either transaction is
    // left, and both markers go.
    map.put(b"z", 7);
    let mut sweep = Sweep::new(&map, aborted, 1_000);
    for (o, k) in [(0, b"x"), (1, b"y")] {
        assert!(!sweep.keep_record(&txn, &rec(o, k)));
    }
    assert!(!sweep.keep_marker(&marker(ControlKind::Abort, 2)));
    for (o, k) in [(3, b"x"), (4, b"z")] {
        assert!(!sweep.keep_record(&txn, &rec(o, k)));
    }
    assert!(!sweep.keep_marker(&marker(ControlKind::Commit, 5)));
}

fn span(base: i64, next: i64, size: u64, ts: i64) -> SegmentSpan {
    SegmentSpan {
        base_offset: base,
        next_offset: next,
        size,
        max_timestamp: ts,
    }
}

const POLICY: CleanPolicy = CleanPolicy {
    min_dirty_ratio: 0.5,
    min_lag_ms: 1_000,
    max_lag_ms: i64::MAX,
};

#[test]
fn a_log_is_cleaned_once_half_dirty_and_never_past_a_segment_younger_than_the_lag() {
    let sealed = [
        span(0, 100, 100, 10),
        span(100, 200, 100, 20),
        span(200, 300, 100, 5_000),
    ];
    // Cleaned up to 100 before: one dirty segment of two cleanable ones.
    let c = schedule(&sealed, 100, 5_500, &POLICY).unwrap();
    assert_eq!(
        (c.end, c.dirty_bytes, c.total_bytes),
        (200, 100, 200),
        "the young one waits"
    );
    assert_eq!(c.dirty_ratio(), 0.5);
    assert_eq!(
        schedule(
            &sealed,
            100,
            5_500,
            &CleanPolicy {
                min_dirty_ratio: 0.6,
                ..POLICY
            }
        ),
        None,
        "not dirty enough"
    );
    // Later the third segment is old enough too: two dirty of three.
    let c = schedule(
        &sealed,
        100,
        7_000,
        &CleanPolicy {
            min_dirty_ratio: 0.6,
            ..POLICY
        },
    )
    .unwrap();
    assert_eq!(c.end, 300);
    assert_eq!(
        schedule(&sealed, 300, 7_000, &POLICY),
        None,
        "nothing dirty"
    );
    assert_eq!(schedule(&[], 0, 7_000, &POLICY), None, "nothing sealed");
}

#[test]
fn a_dirty_segment_older_than_the_max_lag_is_cleaned_whatever_the_ratio() {
    let sealed = [span(0, 900, 900, 10), span(900, 1000, 100, 20)];
    let lazy = CleanPolicy {
        min_dirty_ratio: 0.9,
        max_lag_ms: 10_000,
        ..POLICY
    };
    assert_eq!(
        schedule(&sealed, 900, 5_000, &lazy),
        None,
        "10% dirty, not overdue"
    );
    let c = schedule(&sealed, 900, 10_020, &lazy).unwrap();
    assert_eq!((c.end, c.dirty_bytes), (1000, 100));
}

/// Batches of (key, value) records at consecutive offsets from `base`, uncompressed or lz4.
fn batch_at(base: i64, recs: &[(&str, Option<&str>)], lz4: bool, ts: i64) -> Vec<u8> {
    use spate_protocol::batch::{build, NewRecord};
    use spate_protocol::records::Compression;
    let records: Vec<NewRecord> = recs
        .iter()
        .map(|(k, v)| NewRecord {
            key: Some(bytes::Bytes::from(k.to_string())),
            value: v.map(|v| bytes::Bytes::from(v.to_string())),
            timestamp: ts,
        })
        .collect();
    let codec = if lz4 {
        Compression::Lz4
    } else {
        Compression::None
    };
    let mut b = build(&records, None, codec).unwrap().to_vec();
    spate_protocol::batch::assign(&mut b, base, 3);
    b
}

/// (offset, key, value) of every record in `bytes`.
fn contents(bytes: &[u8]) -> Vec<(i64, String, Option<String>)> {
    let mut buf = bytes::Bytes::copy_from_slice(bytes);
    spate_protocol::records::RecordBatchDecoder::decode_all(&mut buf)
        .unwrap()
        .into_iter()
        .flat_map(|set| set.records)
        .map(|r| {
            (
                r.offset,
                String::from_utf8(r.key.unwrap().to_vec()).unwrap(),
                r.value.map(|v| String::from_utf8(v.to_vec()).unwrap()),
            )
        })
        .collect()
}

#[test]
fn a_section_of_plain_and_compressed_batches_compacts_to_the_latest_per_key_with_offsets_kept() {
    let mut log = Vec::new();
    log.extend(batch_at(
        0,
        &[("a", Some("1")), ("b", Some("1")), ("c", Some("1"))],
        false,
        10,
    ));
    log.extend(batch_at(3, &[("a", Some("2")), ("d", Some("1"))], true, 20));
    log.extend(batch_at(5, &[("b", None), ("c", Some("2"))], false, 30));
    log.extend(batch_at(7, &[("d", Some("2")), ("e", Some("1"))], true, 40));
    let mut map = OffsetMap::with_buffer_bytes(1 << 10);
    map_section(&log, &mut map, &[]).unwrap();
    assert_eq!((map.len(), map.end()), (5, 9));
    // The tombstone of b (offset 5, time 30) is young enough to stay at horizon 25.
    let mut sweep = Sweep::new(&map, Vec::new(), 25);
    let cleaned = compact_batches(&log, &mut sweep).unwrap();
    assert_eq!(
        contents(&cleaned),
        vec![
            (3, "a".into(), Some("2".into())),
            (5, "b".into(), None),
            (6, "c".into(), Some("2".into())),
            (7, "d".into(), Some("2".into())),
            (8, "e".into(), Some("1".into())),
        ]
    );
    // Every batch left is whole and keeps its epoch; the first (all superseded) is gone.
    let headers: Vec<(i64, i32)> = Batches::new(&cleaned)
        .map(|(_, h)| (h.base_offset, h.partition_leader_epoch))
        .collect();
    assert_eq!(headers, vec![(3, 3), (5, 3), (7, 3)]);
    // Past the horizon the tombstone goes too, and a second clean changes nothing else.
    let mut map = OffsetMap::with_buffer_bytes(1 << 10);
    map_section(&cleaned, &mut map, &[]).unwrap();
    let mut sweep = Sweep::new(&map, Vec::new(), 35);
    let again = compact_batches(&cleaned, &mut sweep).unwrap();
    assert_eq!(
        contents(&again).iter().map(|c| c.0).collect::<Vec<_>>(),
        vec![3, 6, 7, 8]
    );
}

/// One uncompressed batch at `base` of (key, value) records, 10 ms apart.
fn plain_batch(base: i64, recs: &[(&str, &str)]) -> Vec<u8> {
    let records: Vec<batch::NewRecord> = recs
        .iter()
        .enumerate()
        .map(|(i, (k, v))| batch::NewRecord {
            key: Some(bytes::Bytes::from(k.to_string())),
            value: Some(bytes::Bytes::from(v.to_string())),
            timestamp: 1_000 + 10 * i as i64,
        })
        .collect();
    let mut b = batch::build(&records, None, Compression::None)
        .unwrap()
        .to_vec();
    batch::assign(&mut b, base, 0);
    b
}

#[test]
fn a_sweep_writing_the_topics_codec_recompresses_what_it_rewrites_and_copies_whole_batches() {
    let mut log = plain_batch(0, &[("a", "1"), ("b", "1")]);
    log.extend(plain_batch(2, &[("c", "1"), ("d", "1")]));
    log.extend(plain_batch(4, &[("a", "2")]));
    let mut map = OffsetMap::with_buffer_bytes(1 << 10);
    map_section(&log, &mut map, &[]).unwrap();
    let mut sweep = Sweep::new(&map, Vec::new(), 0).writing(Some(Compression::Zstd));
    let out = compact_batches(&log, &mut sweep).unwrap();
    let batches: Vec<BatchHeader> = Batches::new(&out).map(|(_, h)| h).collect();
    assert_eq!(batches.len(), 3);
    // The first lost "a": rewritten, in the topic's codec, "b" at its offset and time.
    assert_eq!((batches[0].base_offset, batches[0].records_count), (1, 1));
    assert_eq!(batch::codec_of(&batches[0]), Some(Compression::Zstd));
    // Kept whole: copied as they are.
    assert_eq!(batch::codec_of(&batches[1]), Some(Compression::None));
    assert_eq!(batch::codec_of(&batches[2]), Some(Compression::None));
    let mut first = bytes::Bytes::copy_from_slice(&out[..batches[0].total_len()]);
    let set = RecordBatchDecoder::decode(&mut first).unwrap();
    assert_eq!(set.records.len(), 1);
    assert_eq!(set.records[0].offset, 1);
    assert_eq!(set.records[0].timestamp, 1_010);
    assert_eq!(set.records[0].key.as_deref(), Some(&b"b"[..]));
}
