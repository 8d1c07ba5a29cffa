//! Randomized tests of [`SharePartition`] against a per-offset reference model.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use crate::partition::*;
use crate::state::{ShareSnapshot, ShareUpdate};
use crate::test_rng::Rng;

/// The obvious implementation: one entry per offset.
#[derive(Debug, Clone)]
struct Model {
    config: SharePartitionConfig,
    start: Offset,
    end: Offset,
    records: BTreeMap<Offset, (RecordState, i16)>,
    metrics: ShareMetrics,
}

impl Model {
    fn new(config: SharePartitionConfig) -> Self {
        Self {
            config,
            start: 0,
            end: 0,
            records: BTreeMap::new(),
            metrics: ShareMetrics::default(),
        }
    }

    fn advance(&mut self) {
        while self.start < self.end {
            match self.records.get(&self.start) {
                Some((RecordState::Acknowledged | RecordState::Archived, _)) => {
                    self.records.remove(&self.start);
                    self.start += 1;
                }
                _ => break,
            }
        }
    }

    fn release(&mut self, pred: impl Fn(&RecordState) -> bool) -> u64 {
        let limit = self.config.delivery_count_limit;
        let mut n = 0;
        for (state, count) in self.records.values_mut() {
            if pred(state) {
                n += 1;
                if *count >= limit {
                    *state = RecordState::Archived;
                    self.metrics.archived += 1;
                } else {
                    *state = RecordState::Available;
                }
            }
        }
        self.advance();
        n
    }

    fn expire(&mut self, now: i64) -> u64 {
        let n = self.release(
            |s| matches!(s, RecordState::Acquired { deadline_ms, .. } if *deadline_ms <= now),
        );
        self.metrics.lock_expiries += n;
        n
    }

    fn acquire(
        &mut self,
        member: &str,
        fetched: &[RangeInclusive<Offset>],
        max: u32,
        lock: i64,
        now: i64,
    ) -> Vec<Offset> {
        self.expire(now);
        let exists = |o: Offset| fetched.iter().any(|r| r.contains(&o));
        let present: Vec<Offset> = fetched
            .iter()
            .flat_map(|r| r.clone())
            .filter(|&o| o >= self.start)
            .collect();
        let mut out = Vec::new();
        let (Some(&lo), Some(&hi)) = (present.iter().min(), present.iter().max()) else {
            return out;
        };
        let st = RecordState::Acquired {
            member: member.to_string(),
            deadline_ms: now + lock,
        };
        for o in lo..=hi.min(self.end - 1) {
            if !exists(o) {
                if let Some((s @ RecordState::Available, _)) = self.records.get_mut(&o) {
                    *s = RecordState::Archived;
                    self.metrics.archived += 1;
                }
            }
        }
        let mut budget = max as i64;
        for o in lo..=hi.min(self.end - 1) {
            if budget == 0 {
                break;
            }
            if !exists(o) {
                continue;
            }
            if let Some((s @ RecordState::Available, c)) = self.records.get_mut(&o) {
                if *c > 0 {
                    self.metrics.redeliveries += 1;
                }
                *s = st.clone();
                *c += 1;
                budget -= 1;
                out.push(o);
            }
        }
        for o in self.end.max(lo)..=hi {
            if budget == 0 {
                break;
            }
            if !exists(o) {
                continue;
            }
            if o >= self.start + self.config.max_in_flight as i64 {
                break;
            }
            for g in self.end..o {
                self.records.insert(g, (RecordState::Archived, 0));
                self.metrics.archived += 1;
            }
            self.records.insert(o, (st.clone(), 1));
            self.end = o + 1;
            budget -= 1;
            out.push(o);
        }
        self.advance();
        out
    }

    fn acknowledge(
        &mut self,
        member: &str,
        batches: &[AckBatch],
        now: i64,
    ) -> Result<(), AckError> {
        // Validation as specified (malformed batches are not generated here).
        let mut sorted: Vec<&AckBatch> = batches.iter().collect();
        sorted.sort_by_key(|b| b.first);
        let mut err = None;
        'outer: for b in &sorted {
            let first = b.first.max(self.start);
            if b.last < first {
                continue;
            }
            if b.last >= self.end {
                err = Some(AckError::OutsideWindow {
                    offset: b.last,
                    end_offset: self.end,
                });
                break;
            }
            for o in first..=b.last {
                let t = if b.types.len() == 1 {
                    b.types[0]
                } else {
                    b.types[(o - b.first) as usize]
                };
                match &self.records[&o].0 {
                    RecordState::Acquired {
                        member: m,
                        deadline_ms,
                    } if m == member => {
                        if *deadline_ms <= now {
                            err = Some(AckError::LockExpired { offset: o });
                            break 'outer;
                        }
                    }
                    RecordState::Archived if t == AckType::Gap => {}
                    _ => {
                        err = Some(AckError::NotAcquired {
                            offset: o,
                            member: member.to_string(),
                        });
                        break 'outer;
                    }
                }
            }
        }
        self.expire(now);
        if let Some(e) = err {
            return Err(e);
        }
        let limit = self.config.delivery_count_limit;
        for b in batches {
            for o in b.first.max(self.start)..=b.last {
                let t = if b.types.len() == 1 {
                    b.types[0]
                } else {
                    b.types[(o - b.first) as usize]
                };
                let (s, c) = self.records.get_mut(&o).expect("validated");
                if *s == RecordState::Archived {
                    continue;
                }
                *s = match t {
                    AckType::Accept => {
                        self.metrics.accepted += 1;
                        RecordState::Acknowledged
                    }
                    AckType::Release if *c < limit => RecordState::Available,
                    _ => {
                        self.metrics.archived += 1;
                        RecordState::Archived
                    }
                };
            }
        }
        self.advance();
        Ok(())
    }

    fn release_member(&mut self, member: &str, now: i64) -> u64 {
        self.expire(now);
        self.release(|s| matches!(s, RecordState::Acquired { member: m, .. } if m == member))
    }

    fn update_log_start(&mut self, log_start: Offset) {
        if log_start <= self.start {
            return;
        }
        self.records = self.records.split_off(&log_start);
        self.start = log_start;
        self.end = self.end.max(log_start);
        self.advance();
    }
}

const MEMBERS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

/// Which member holds each offset, from the answers only: checks exclusivity of locks.
fn check_exclusive(
    holders: &mut BTreeMap<Offset, (String, i64)>,
    member: &str,
    got: &[AcquiredRange],
    now: i64,
    lock: i64,
) {
    for r in got {
        for o in r.first..=r.last {
            if let Some((m, deadline)) = holders.get(&o) {
                assert!(
                    *deadline <= now,
                    "offset {o} acquired by {member} while {m} holds it until {deadline} (now {now})"
                );
            }
            holders.insert(o, (member.to_string(), now + lock));
        }
    }
}

fn run(seed: u64, steps: usize, members: u64, max_lock: u64) {
    let mut rng = Rng::new(seed);
    let config = SharePartitionConfig {
        max_in_flight: 5 + rng.below(40) as u32,
        delivery_count_limit: 1 + rng.below(4) as i16,
    };
    let mut p = SharePartition::new(config, 0);
    let mut m = Model::new(config);
    let mut holders: BTreeMap<Offset, (String, i64)> = BTreeMap::new();
    let mut now = 0i64;
    let mut log_end: Offset = 0;
    // What __share_group_state would hold: the first snapshot, then updates and snapshots.
    let mut durable = ShareSnapshot::of(&p.snapshot(), 0, 0, 0);
    for step in 0..steps {
        now += rng.below(40) as i64;
        log_end += rng.below(6) as i64;
        let member = MEMBERS[rng.below(members) as usize];
        let ctx = format!("seed {seed} step {step}");
        match rng.below(10) {
            0..=3 => {
                let from = p.next_fetch_offset() - rng.below(3) as i64;
                let to = log_end.min(from + rng.below(30) as i64);
                let mut ranges = Vec::new();
                let mut o = from;
                while o <= to {
                    let l = (o + rng.below(8) as i64).min(to);
                    if rng.below(5) != 0 {
                        ranges.push(o..=l);
                    }
                    o = l + 1 + if rng.below(4) == 0 { 1 } else { 0 };
                }
                let max = rng.below(25) as u32;
                let lock = 1 + rng.below(max_lock) as i64;
                let got = p.acquire(member, &ranges, max, lock, now);
                let want = m.acquire(member, &ranges, max, lock, now);
                let flat: Vec<Offset> = got.iter().flat_map(|r| r.first..=r.last).collect();
                assert_eq!(flat, want, "{ctx}: acquired {ranges:?}");
                for r in &got {
                    for o in r.first..=r.last {
                        assert_eq!(p.record(o).map(|x| x.1), Some(r.delivery_count), "{ctx}");
                    }
                }
                holders.retain(|o, _| *o >= p.start_offset());
                check_exclusive(&mut holders, member, &got, now, lock);
            }
            4..=6 => {
                let lo = p.start_offset() - rng.below(3) as i64;
                let mut batches = Vec::new();
                let mut o = lo.max(0);
                for _ in 0..1 + rng.below(3) {
                    let l = o + rng.below(6) as i64;
                    let types = if rng.below(2) == 0 {
                        vec![AckType::from_code(rng.below(4) as i8).unwrap_or(AckType::Accept)]
                    } else {
                        (o..=l)
                            .map(|_| {
                                AckType::from_code(rng.below(4) as i8).unwrap_or(AckType::Accept)
                            })
                            .collect()
                    };
                    batches.push(AckBatch {
                        first: o,
                        last: l,
                        types,
                    });
                    o = l + 1 + rng.below(3) as i64;
                }
                let got = p.acknowledge(member, &batches, now);
                let want = m.acknowledge(member, &batches, now);
                assert_eq!(got, want, "{ctx}: acknowledged {batches:?}");
                if got.is_ok() {
                    for b in &batches {
                        for o in b.first..=b.last {
                            holders.remove(&o);
                        }
                    }
                }
            }
            7 => {
                assert_eq!(
                    p.release_member(member, now),
                    m.release_member(member, now),
                    "{ctx}"
                );
                holders.retain(|_, (h, _)| h != member);
            }
            8 => {
                assert_eq!(p.expire_locks(now), m.expire(now), "{ctx}");
            }
            _ => {
                if rng.below(4) == 0 {
                    let to = p.start_offset() + rng.below(10) as i64;
                    p.update_log_start(to);
                    m.update_log_start(to);
                    log_end = log_end.max(to);
                } else if rng.below(10) == 0 && p.acquired_count() == 0 {
                    let to = rng.below((log_end + 1) as u64) as i64;
                    p.reset_to(to, now).expect("no locks");
                    m = Model::new(config);
                    m.start = to;
                    m.end = to;
                    m.metrics = p.metrics();
                    holders.clear();
                }
            }
        }
        p.check_invariants();
        assert_eq!(
            (p.start_offset(), p.end_offset()),
            (m.start, m.end),
            "{ctx}"
        );
        for o in m.start..m.end {
            assert_eq!(p.record(o).as_ref(), m.records.get(&o), "{ctx}: offset {o}");
        }
        assert_eq!(p.metrics(), m.metrics, "{ctx}");
        assert_eq!(p.in_flight_count(), (m.end - m.start) as u64);
        assert!(p.in_flight_count() <= config.max_in_flight as u64, "{ctx}");
        // Durable view: a restore gives the same snapshot, and it survives the encoding.
        let snap = p.snapshot();
        let restored = SharePartition::from_state(config, &snap).expect("own snapshot loads");
        restored.check_invariants();
        assert_eq!(restored.snapshot(), snap, "{ctx}");
        assert_eq!(restored.acquired_count(), 0);
        let value = ShareSnapshot::of(&snap, 1, 0, now);
        assert_eq!(ShareSnapshot::decode(&value.encode()).as_ref(), Ok(&value));
        // The incremental writes add up to the same durable view.
        match p.take_changes() {
            StateChange::Unchanged => {}
            StateChange::Update {
                start_offset,
                batches,
            } => {
                let update =
                    ShareUpdate::of(start_offset, &batches, p.delivery_complete_count(), 0, 0);
                let bytes = update.encode();
                let update = ShareUpdate::decode(&bytes).expect("own update decodes");
                durable = durable.apply(&update);
            }
            StateChange::Snapshot(s) => durable = ShareSnapshot::of(&s, 0, 0, now),
        }
        let replayed = SharePartition::from_state(config, &durable.partition_state())
            .expect("replayed state loads");
        assert_eq!(replayed.snapshot(), snap, "{ctx}: updates replayed");
        if !matches!(durable.delivery_complete_count, -1) {
            assert_eq!(
                durable.delivery_complete_count,
                snap.delivery_complete_count(),
                "{ctx}"
            );
        }
        assert_eq!(p.take_changes(), StateChange::Unchanged, "{ctx}");
    }
}

#[test]
fn random_operations_match_a_per_offset_model_and_restore_to_the_same_durable_view() {
    for seed in 1..=200 {
        run(seed, 300, 3, 200);
    }
}

#[test]
fn no_record_is_ever_acquired_by_two_members_at_once() {
    // Many members competing for few records with short locks.
    for seed in 1_000..1_100 {
        run(seed, 400, 6, 60);
    }
}

#[test]
fn any_durable_state_loads_consistently_or_is_refused() {
    let mut rng = Rng::new(4242);
    for _ in 0..2_000 {
        let start = rng.below(20) as i64 - 1;
        let mut batches = Vec::new();
        for _ in 0..rng.below(6) {
            let first = rng.below(40) as i64 - 2;
            batches.push(crate::state::StateBatch {
                first_offset: first,
                last_offset: first + rng.below(8) as i64 - 1,
                delivery_state: rng.below(6) as i8,
                delivery_count: rng.below(8) as i16 - 1,
            });
        }
        let state = crate::state::PartitionState {
            state_epoch: 0,
            leader_epoch: 0,
            start_offset: start,
            batches,
        };
        let config = SharePartitionConfig {
            max_in_flight: 50,
            delivery_count_limit: 3,
        };
        if let Ok(p) = SharePartition::from_state(config, &state) {
            p.check_invariants();
            assert_eq!(p.acquired_count(), 0);
            let again = SharePartition::from_state(config, &p.snapshot()).expect("reloads");
            assert_eq!(again.snapshot(), p.snapshot());
        }
    }
}
