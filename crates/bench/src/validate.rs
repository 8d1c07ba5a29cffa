//! Message-integrity checking: fed the acknowledged sequences from producers and every
//! consumed message, it reports loss, duplicates, per-partition reordering and corruption.
//!
//! Pure logic (no clients, no clocks) so unit tests can feed it doctored streams.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::payload::{Check, MessageFactory};

/// At most this many individual violations are kept for the report; all are counted.
const MAX_LISTED_VIOLATIONS: usize = 50;

/// A dense set of per-producer sequence numbers (they start at 0 and grow by 1).
#[derive(Clone, Debug, Default)]
pub struct SeqSet {
    bits: Vec<u64>,
    len: u64,
}

impl SeqSet {
    /// Inserts `seq`; returns false if it was already present.
    pub fn insert(&mut self, seq: u64) -> bool {
        let (word, bit) = ((seq / 64) as usize, seq % 64);
        if word >= self.bits.len() {
            self.bits.resize(word + 1, 0);
        }
        let mask = 1u64 << bit;
        if self.bits[word] & mask != 0 {
            return false;
        }
        self.bits[word] |= mask;
        self.len += 1;
        true
    }

    /// True if `seq` is present.
    pub fn contains(&self, seq: u64) -> bool {
        self.bits
            .get((seq / 64) as usize)
            .is_some_and(|w| w & (1u64 << (seq % 64)) != 0)
    }

    /// Number of members.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Members of `self` that are not in `other`, ascending.
    pub fn difference<'a>(&'a self, other: &'a SeqSet) -> impl Iterator<Item = u64> + 'a {
        self.bits.iter().enumerate().flat_map(move |(i, &w)| {
            let missing = w & !other.bits.get(i).copied().unwrap_or(0);
            (0..64u64)
                .filter(move |b| missing & (1 << b) != 0)
                .map(move |b| i as u64 * 64 + b)
        })
    }
}

/// What the delivery semantics of the run permit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidationPolicy {
    /// At-least-once (non-idempotent) producers may write a retried message twice.
    pub duplicates_allowed: bool,
    /// Non-idempotent producers with several requests in flight may reorder on retry.
    pub reorder_allowed: bool,
    /// acks=0 promises nothing: an "acknowledged" message may still be lost.
    pub loss_allowed: bool,
}

impl ValidationPolicy {
    /// Exactly-once per partition: what an idempotent producer with acks=all guarantees.
    pub const STRICT: ValidationPolicy = ValidationPolicy {
        duplicates_allowed: false,
        reorder_allowed: false,
        loss_allowed: false,
    };
}

/// The kind of an integrity violation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    /// Acknowledged but never consumed.
    Lost,
    /// Consumed more than once.
    Duplicate,
    /// Consumed after a later sequence of the same producer in the same partition.
    Reordered,
    /// Content differs from what was sent.
    Corrupted,
}

/// One integrity violation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Violation {
    /// What went wrong.
    pub kind: ViolationKind,
    /// Producer id when known.
    pub producer: Option<u32>,
    /// Sequence when known.
    pub seq: Option<u64>,
    /// Partition when known.
    pub partition: Option<i32>,
    /// Offset when known.
    pub offset: Option<i64>,
    /// Human-readable detail.
    pub detail: String,
    /// False when the delivery semantics allow this (reported, but the run still passes).
    pub is_violation: bool,
}

/// The validation section of a report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValidationReport {
    /// True when nothing the semantics forbid happened.
    pub passed: bool,
    /// The policy the run was judged by.
    pub policy: ValidationPolicy,
    /// Messages producers got a successful delivery report for.
    pub acknowledged: u64,
    /// Distinct valid messages of this run consumed.
    pub consumed_unique: u64,
    /// Acknowledged but never consumed.
    pub lost: u64,
    /// Extra copies consumed.
    pub duplicates: u64,
    /// Out-of-order messages within a (producer, partition).
    pub reordered: u64,
    /// Damaged messages.
    pub corrupted: u64,
    /// Messages from other runs or tools (ignored).
    pub foreign: u64,
    /// Consumed although no successful delivery report arrived (e.g. a timed-out ack).
    pub consumed_unacknowledged: u64,
    /// The first violations, in the order found.
    pub violations: Vec<Violation>,
}

/// Accumulates acknowledgements and consumed messages, then judges them.
#[derive(Debug)]
pub struct Validator {
    policy: ValidationPolicy,
    factory: Arc<MessageFactory>,
    acked: Vec<SeqSet>,
    seen: Vec<SeqSet>,
    last_seq: HashMap<(u32, i32), u64>,
    duplicates: u64,
    reordered: u64,
    corrupted: u64,
    foreign: u64,
    listed: Vec<Violation>,
}

impl Validator {
    /// A validator for messages built by `factory`.
    pub fn new(policy: ValidationPolicy, factory: Arc<MessageFactory>) -> Self {
        Self {
            policy,
            factory,
            acked: Vec::new(),
            seen: Vec::new(),
            last_seq: HashMap::new(),
            duplicates: 0,
            reordered: 0,
            corrupted: 0,
            foreign: 0,
            listed: Vec::new(),
        }
    }

    fn slot(sets: &mut Vec<SeqSet>, producer: u32) -> &mut SeqSet {
        let i = producer as usize;
        if i >= sets.len() {
            sets.resize_with(i + 1, SeqSet::default);
        }
        &mut sets[i]
    }

    /// Records that `producer` got a successful delivery report for `seq`.
    pub fn acknowledge(&mut self, producer: u32, seq: u64) {
        Self::slot(&mut self.acked, producer).insert(seq);
    }

    /// Merges a producer's whole acknowledged set (collected without locking during the run).
    pub fn acknowledge_all(&mut self, producer: u32, set: &SeqSet) {
        let mine = Self::slot(&mut self.acked, producer);
        for w in 0..set.bits.len() {
            let mut bits = set.bits[w];
            while bits != 0 {
                let b = bits.trailing_zeros() as u64;
                mine.insert(w as u64 * 64 + b);
                bits &= bits - 1;
            }
        }
    }

    fn note(&mut self, v: Violation) {
        if self.listed.len() < MAX_LISTED_VIOLATIONS {
            self.listed.push(v);
        }
    }

    /// Checks one consumed message.
    pub fn observe(&mut self, partition: i32, offset: i64, key: Option<&[u8]>, value: &[u8]) {
        let header = match self.factory.check(key, value) {
            Check::Foreign => {
                self.foreign += 1;
                return;
            }
            Check::Corrupt { reason, header } => {
                self.corrupted += 1;
                self.note(Violation {
                    kind: ViolationKind::Corrupted,
                    producer: header.map(|h| h.producer),
                    seq: header.map(|h| h.seq),
                    partition: Some(partition),
                    offset: Some(offset),
                    detail: reason,
                    is_violation: true,
                });
                return;
            }
            Check::Valid(h) => h,
        };
        let (producer, seq) = (header.producer, header.seq);
        if !Self::slot(&mut self.seen, producer).insert(seq) {
            self.duplicates += 1;
            let allowed = self.policy.duplicates_allowed;
            self.note(Violation {
                kind: ViolationKind::Duplicate,
                producer: Some(producer),
                seq: Some(seq),
                partition: Some(partition),
                offset: Some(offset),
                detail: "consumed more than once".into(),
                is_violation: !allowed,
            });
            return;
        }
        let last = self.last_seq.entry((producer, partition)).or_insert(seq);
        if seq < *last {
            let prev = *last;
            self.reordered += 1;
            let allowed = self.policy.reorder_allowed;
            self.note(Violation {
                kind: ViolationKind::Reordered,
                producer: Some(producer),
                seq: Some(seq),
                partition: Some(partition),
                offset: Some(offset),
                detail: format!("arrived after seq {prev} of the same producer"),
                is_violation: !allowed,
            });
        } else {
            *last = seq;
        }
    }

    /// Judges everything seen so far.
    pub fn finish(mut self) -> ValidationReport {
        let mut lost = 0u64;
        let mut consumed_unacknowledged = 0u64;
        let producers = self.acked.len().max(self.seen.len());
        self.acked.resize_with(producers, SeqSet::default);
        self.seen.resize_with(producers, SeqSet::default);
        let mut lost_listed = Vec::new();
        for p in 0..producers {
            for seq in self.acked[p].difference(&self.seen[p]) {
                lost += 1;
                if lost_listed.len() < MAX_LISTED_VIOLATIONS {
                    lost_listed.push(Violation {
                        kind: ViolationKind::Lost,
                        producer: Some(p as u32),
                        seq: Some(seq),
                        partition: None,
                        offset: None,
                        detail: "acknowledged but never consumed".into(),
                        is_violation: !self.policy.loss_allowed,
                    });
                }
            }
            consumed_unacknowledged += self.seen[p].difference(&self.acked[p]).count() as u64;
        }
        // Losses first: they are the most serious finding.
        let mut violations = lost_listed;
        violations.extend(self.listed);
        violations.truncate(MAX_LISTED_VIOLATIONS);
        let p = self.policy;
        let passed = self.corrupted == 0
            && (lost == 0 || p.loss_allowed)
            && (self.duplicates == 0 || p.duplicates_allowed)
            && (self.reordered == 0 || p.reorder_allowed);
        ValidationReport {
            passed,
            policy: p,
            acknowledged: self.acked.iter().map(SeqSet::len).sum(),
            consumed_unique: self.seen.iter().map(SeqSet::len).sum(),
            lost,
            duplicates: self.duplicates,
            reordered: self.reordered,
            corrupted: self.corrupted,
            foreign: self.foreign,
            consumed_unacknowledged,
            violations,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{KeyPattern, PayloadPattern};
    use crate::payload::KeyBuf;

    /// One "consumed" message: (partition, offset, key, value).
    type Msg = (i32, i64, Option<Vec<u8>>, Vec<u8>);

    fn factory() -> Arc<MessageFactory> {
        Arc::new(MessageFactory::new(
            42,
            64,
            KeyPattern::Sequential,
            PayloadPattern::Random,
            true,
        ))
    }

    /// Two producers, `n` messages each, alternating into partitions 0 and 1 by producer.
    fn stream(f: &MessageFactory, n: u64) -> Vec<Msg> {
        let mut out = Vec::new();
        for seq in 0..n {
            for producer in 0..2u32 {
                let mut kb = KeyBuf::default();
                let mut scratch = Vec::new();
                let key = f.key(producer, seq, &mut kb).map(|k| k.to_vec());
                let value = f
                    .value(producer, seq, 0, key.as_deref(), &mut scratch)
                    .to_vec();
                out.push((producer as i32, out.len() as i64, key, value));
            }
        }
        out
    }

    fn run(policy: ValidationPolicy, msgs: &[Msg], acked: u64) -> ValidationReport {
        let f = factory();
        let mut v = Validator::new(policy, f);
        for p in 0..2 {
            for s in 0..acked {
                v.acknowledge(p, s);
            }
        }
        for (part, off, key, value) in msgs {
            v.observe(*part, *off, key.as_deref(), value);
        }
        v.finish()
    }

    #[test]
    fn clean_stream_passes() {
        let msgs = stream(&factory(), 100);
        let r = run(ValidationPolicy::STRICT, &msgs, 100);
        assert!(r.passed, "{r:?}");
        assert_eq!((r.acknowledged, r.consumed_unique), (200, 200));
        assert!(r.violations.is_empty());
    }

    #[test]
    fn detects_dropped_message() {
        let mut msgs = stream(&factory(), 100);
        msgs.remove(37);
        let r = run(ValidationPolicy::STRICT, &msgs, 100);
        assert!(!r.passed);
        assert_eq!(r.lost, 1);
        assert_eq!(r.violations[0].kind, ViolationKind::Lost);
        assert_eq!(r.violations[0].producer, Some(1));
        assert_eq!(r.violations[0].seq, Some(18));
    }

    #[test]
    fn detects_duplicate_and_honours_policy() {
        let mut msgs = stream(&factory(), 50);
        let dup = msgs[10].clone();
        msgs.push(dup);
        let strict = run(ValidationPolicy::STRICT, &msgs, 50);
        assert!(!strict.passed);
        assert_eq!(strict.duplicates, 1);
        assert_eq!(strict.reordered, 0, "a duplicate is not also a reorder");
        let lenient = ValidationPolicy {
            duplicates_allowed: true,
            ..ValidationPolicy::STRICT
        };
        let r = run(lenient, &msgs, 50);
        assert!(r.passed);
        assert_eq!(r.duplicates, 1);
        assert!(!r.violations[0].is_violation);
    }

    #[test]
    fn detects_reordering_within_partition() {
        let mut msgs = stream(&factory(), 50);
        // Producer 0 lives at even indexes: swap its seq 5 and seq 6.
        msgs.swap(10, 12);
        let r = run(ValidationPolicy::STRICT, &msgs, 50);
        assert!(!r.passed);
        assert_eq!(r.reordered, 1);
        assert_eq!(r.violations[0].kind, ViolationKind::Reordered);
        assert_eq!(r.violations[0].seq, Some(5));
    }

    #[test]
    fn order_across_partitions_is_free() {
        let f = factory();
        let mut msgs = stream(&f, 10);
        // Same producer, different partitions: any interleaving is legal.
        for m in msgs.iter_mut() {
            m.0 = (m.1 % 3) as i32;
        }
        msgs.reverse();
        let r = run(ValidationPolicy::STRICT, &msgs, 10);
        // Reversal within each partition is still a reorder there.
        assert!(r.reordered > 0);
        let mut ok = stream(&f, 10);
        for m in ok.iter_mut() {
            m.0 = (m.1 % 3) as i32;
        }
        assert!(run(ValidationPolicy::STRICT, &ok, 10).passed);
    }

    #[test]
    fn detects_corruption() {
        let mut msgs = stream(&factory(), 20);
        msgs[3].3[50] ^= 0x80;
        let r = run(ValidationPolicy::STRICT, &msgs, 20);
        assert!(!r.passed);
        assert_eq!(r.corrupted, 1);
        // The corrupted copy does not count as consumed, so it is also reported lost.
        assert_eq!(r.lost, 1);
    }

    #[test]
    fn foreign_messages_are_ignored_and_unacked_are_counted() {
        let mut msgs = stream(&factory(), 10);
        msgs.push((0, 999, None, b"not ours".to_vec()));
        let r = run(ValidationPolicy::STRICT, &msgs, 9);
        assert!(r.passed);
        assert_eq!(r.foreign, 1);
        assert_eq!(r.consumed_unacknowledged, 2);
    }

    #[test]
    fn seqset_basics() {
        let mut a = SeqSet::default();
        assert!(a.insert(0));
        assert!(a.insert(130));
        assert!(!a.insert(130));
        assert!(a.contains(130) && !a.contains(129));
        let mut b = SeqSet::default();
        b.insert(0);
        assert_eq!(a.difference(&b).collect::<Vec<_>>(), vec![130]);
        let mut v = Validator::new(ValidationPolicy::STRICT, factory());
        v.acknowledge_all(3, &a);
        assert_eq!(v.finish().lost, 2);
    }
}
