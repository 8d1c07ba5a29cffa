//! Idempotent-producer bookkeeping for one partition: a pure state machine.
//!
//! For each producer id it remembers the epoch and the last few batches' sequence ranges and
//! offsets, which is what Kafka's semantics need: a retried batch is recognised and answered
//! with its original offset, a gap in sequences is refused.
//!
//! Memory stays bounded two ways, in memory and in snapshots alike:
//! * expiry (Kafka's `producer.id.expiration.ms`): [`ProducerStates::expire`], called
//!   periodically with the wall-clock time, forgets producers that wrote nothing for that
//!   long. Appends only mark a producer as seen, so the append path reads no clock; the next
//!   pass stamps it with the time. A producer is therefore forgotten between the expiration
//!   and the expiration plus one pass interval after its last batch.
//! * a cap on producers per partition: recording a new producer beyond it forgets the least
//!   recently used one.
//!
//! A forgotten producer that writes again with a sequence other than 0 gets
//! UNKNOWN_PRODUCER_ID, which clients answer by resetting their sequence (KIP-360).

use std::collections::{BTreeMap, HashMap, VecDeque};

use spate_protocol::batch::{BatchHeader, ControlKind, ControlRecord};
use spate_protocol::ResponseError;

/// How many recent batches per producer are remembered, as in Kafka (max.in.flight = 5).
pub const BATCHES_PER_PRODUCER: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BatchMeta {
    first_seq: i32,
    last_seq: i32,
    base_offset: i64,
    last_offset: i64,
}

/// Kafka's default `producer.id.expiration.ms`: one day.
pub const DEFAULT_PRODUCER_ID_EXPIRATION_MS: i64 = 86_400_000;
/// Default cap on producer ids remembered per partition.
pub const DEFAULT_MAX_PRODUCERS_PER_PARTITION: usize = 10_000;

/// "Seen since the last expiry pass, which has not stamped it with a time yet."
const UNSTAMPED: i64 = i64::MIN;

/// How many producers a partition remembers, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerLimits {
    /// Forget producers idle this long (milliseconds of wall-clock time).
    pub expiration_ms: i64,
    /// Forget the least recently used producer beyond this many.
    pub max_producers: usize,
}

impl Default for ProducerLimits {
    fn default() -> Self {
        Self {
            expiration_ms: DEFAULT_PRODUCER_ID_EXPIRATION_MS,
            max_producers: DEFAULT_MAX_PRODUCERS_PER_PARTITION,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Producer {
    epoch: i16,
    batches: VecDeque<BatchMeta>,
    /// First offset of its open transaction in this partition, or -1.
    txn_first_offset: i64,
    /// Epoch of the coordinator that wrote its last marker here (-1: none): markers of an
    /// older coordinator are refused.
    coordinator_epoch: i32,
    /// Max timestamp of its last batch (DescribeProducers).
    last_timestamp: i64,
    /// Wall time an expiry pass last saw it active, or UNSTAMPED when seen since.
    last_seen_ms: i64,
    /// Position in the recency order (`ProducerStates::by_use`).
    last_use: u64,
}

/// The verdict on an incoming idempotent batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceCheck {
    /// New data in order: append it.
    Append,
    /// A retry of a batch already stored at `base_offset`: answer success, append nothing.
    Duplicate {
        /// Where the original landed.
        base_offset: i64,
        /// Its last offset, which must be durable before the retry is acknowledged.
        last_offset: i64,
    },
    /// Refuse with this error.
    Reject(ResponseError),
}

/// The sequence that follows `seq`, wrapping at i32::MAX as Kafka does.
fn next_seq(seq: i32) -> i32 {
    if seq == i32::MAX {
        0
    } else {
        seq + 1
    }
}

/// A transaction that aborted in this partition: read_committed consumers drop the records
/// of its producer between its first offset and its marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    /// Its producer.
    pub producer_id: i64,
    /// Its first record here.
    pub first_offset: i64,
    /// Its abort marker.
    pub last_offset: i64,
}

/// One producer as DescribeProducers shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerView {
    /// Producer id.
    pub producer_id: i64,
    /// Its epoch.
    pub epoch: i16,
    /// Sequence of its last record (-1 when none is remembered).
    pub last_sequence: i32,
    /// Max timestamp of its last batch (-1 when unknown).
    pub last_timestamp: i64,
    /// Epoch of the coordinator of its last marker (-1: none).
    pub coordinator_epoch: i32,
    /// First offset of its open transaction here, or -1.
    pub txn_start_offset: i64,
}

/// Producer states of one partition.
#[derive(Debug, Default, Clone)]
pub struct ProducerStates {
    producers: HashMap<i64, Producer>,
    /// Open transactions by first offset: the smallest bounds the last stable offset.
    ongoing: BTreeMap<i64, i64>,
    /// Aborted transactions, by marker offset (appended in log order).
    aborted: VecDeque<AbortedTxn>,
    /// Producer ids by last use, oldest first.
    by_use: BTreeMap<u64, i64>,
    next_use: u64,
    limits: ProducerLimits,
}

impl ProducerStates {
    /// Judges a batch from `producer_id`/`epoch` carrying sequences `first_seq..=last_seq`.
    pub fn check(
        &self,
        producer_id: i64,
        epoch: i16,
        first_seq: i32,
        last_seq: i32,
    ) -> SequenceCheck {
        if first_seq < 0 {
            // No sequence: a transactional batch the coordinator writes itself (offset commits
            // in a transaction). Only its epoch is checked.
            return match self.producers.get(&producer_id) {
                Some(p) if epoch < p.epoch => {
                    SequenceCheck::Reject(ResponseError::InvalidProducerEpoch)
                }
                _ => SequenceCheck::Append,
            };
        }
        let Some(p) = self.producers.get(&producer_id) else {
            return if first_seq == 0 {
                SequenceCheck::Append
            } else {
                // No state (new broker, or expired by retention): the client must reset.
                SequenceCheck::Reject(ResponseError::UnknownProducerId)
            };
        };
        if epoch < p.epoch {
            return SequenceCheck::Reject(ResponseError::InvalidProducerEpoch);
        }
        if epoch > p.epoch {
            return if first_seq == 0 {
                SequenceCheck::Append
            } else {
                SequenceCheck::Reject(ResponseError::OutOfOrderSequenceNumber)
            };
        }
        if let Some(b) = p
            .batches
            .iter()
            .find(|b| b.first_seq == first_seq && b.last_seq == last_seq)
        {
            return SequenceCheck::Duplicate {
                base_offset: b.base_offset,
                last_offset: b.last_offset,
            };
        }
        let Some(last) = p.batches.back() else {
            return SequenceCheck::Append;
        };
        if first_seq == next_seq(last.last_seq) {
            return SequenceCheck::Append;
        }
        let oldest = p.batches.front().map_or(last.first_seq, |b| b.first_seq);
        if first_seq < oldest && last.last_seq >= oldest {
            // Older than anything remembered: a retry of data long since stored.
            return SequenceCheck::Reject(ResponseError::DuplicateSequenceNumber);
        }
        SequenceCheck::Reject(ResponseError::OutOfOrderSequenceNumber)
    }

    /// Applies new limits (the broker's, from `BrokerConfig::producer_limits`); a lower cap
    /// takes effect at once.
    // The partition applies the broker's limits and runs `expire` from the retention pass
    // once it takes the broker's clock (issue 14, partition side); until then the defaults
    // and the cap apply, and only tests call these.
    #[allow(dead_code)]
    pub fn set_limits(&mut self, limits: ProducerLimits) {
        self.limits = limits;
        self.enforce_cap();
    }

    /// True when a snapshot would carry nothing: no producer, no open or aborted transaction.
    pub fn is_empty(&self) -> bool {
        self.producers.is_empty() && self.ongoing.is_empty() && self.aborted.is_empty()
    }

    /// Number of producers remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.producers.len()
    }

    /// Records a stored batch's producer, sequences and offsets, as its header gives them
    /// (replicated or replayed batches), and for a transaction marker (`marker`, read from a
    /// control batch) the end of its transaction. Returns the transaction it aborted, if any.
    pub fn record_batch(
        &mut self,
        h: &BatchHeader,
        marker: Option<ControlRecord>,
    ) -> Option<AbortedTxn> {
        if !h.has_producer_id() {
            return None;
        }
        if h.is_control() {
            let m = marker?;
            return self.end_txn(h.producer_id, h.producer_epoch, m, h.base_offset);
        }
        self.record_data(h, h.base_offset, h.last_offset());
        None
    }

    /// Records a data batch stored at `base_offset..=last_offset`: its sequences, and the
    /// start of a transaction when it is the producer's first transactional batch here.
    pub fn record_data(&mut self, h: &BatchHeader, base_offset: i64, last_offset: i64) {
        self.record(
            h.producer_id,
            h.producer_epoch,
            h.base_sequence,
            h.last_sequence(),
            base_offset,
            last_offset,
        );
        if let Some(p) = self.producers.get_mut(&h.producer_id) {
            p.last_timestamp = h.max_timestamp;
            if h.is_transactional() && p.txn_first_offset < 0 {
                p.txn_first_offset = base_offset;
                self.ongoing.insert(base_offset, h.producer_id);
            }
        }
    }

    /// Whether a marker from a coordinator at `coordinator_epoch` for `producer_id` at `epoch`
    /// may be written: not for an older producer epoch, not from an older coordinator.
    pub fn check_marker(
        &self,
        producer_id: i64,
        epoch: i16,
        coordinator_epoch: i32,
    ) -> Result<(), ResponseError> {
        let Some(p) = self.producers.get(&producer_id) else {
            return Ok(());
        };
        if epoch < p.epoch {
            return Err(ResponseError::InvalidProducerEpoch);
        }
        if coordinator_epoch < p.coordinator_epoch {
            return Err(ResponseError::TransactionCoordinatorFenced);
        }
        Ok(())
    }

    /// Ends `producer_id`'s transaction with a marker stored at `offset`; returns the
    /// transaction when it aborted one that wrote here. A marker with a newer producer epoch
    /// (a coordinator fencing the producer) moves the producer to that epoch.
    pub fn end_txn(
        &mut self,
        producer_id: i64,
        epoch: i16,
        marker: ControlRecord,
        offset: i64,
    ) -> Option<AbortedTxn> {
        let used = self.next_use;
        self.next_use += 1;
        let p = self
            .producers
            .entry(producer_id)
            .or_insert_with(|| Producer {
                epoch,
                batches: VecDeque::new(),
                txn_first_offset: -1,
                coordinator_epoch: -1,
                last_timestamp: -1,
                last_seen_ms: UNSTAMPED,
                last_use: used,
            });
        if p.last_use != used {
            self.by_use.remove(&p.last_use);
            p.last_use = used;
        }
        self.by_use.insert(used, producer_id);
        p.last_seen_ms = UNSTAMPED;
        if epoch > p.epoch {
            p.epoch = epoch;
            p.batches.clear();
        }
        p.coordinator_epoch = p.coordinator_epoch.max(marker.coordinator_epoch);
        let first = std::mem::replace(&mut p.txn_first_offset, -1);
        if first < 0 {
            return None;
        }
        self.ongoing.remove(&first);
        if marker.kind != ControlKind::Abort {
            return None;
        }
        let a = AbortedTxn {
            producer_id,
            first_offset: first,
            last_offset: offset,
        };
        self.aborted.push_back(a);
        Some(a)
    }

    /// The first offset of the oldest open transaction: nothing from it on is stable.
    pub fn first_unstable_offset(&self) -> Option<i64> {
        self.ongoing.keys().next().copied()
    }

    /// The first offset of `producer_id`'s open transaction here.
    pub fn open_txn(&self, producer_id: i64) -> Option<i64> {
        self.producers
            .get(&producer_id)
            .map(|p| p.txn_first_offset)
            .filter(|o| *o >= 0)
    }

    /// Aborted transactions that may hold records in `from..upto`: their marker is at or past
    /// `from` and they began before `upto`. As Kafka answers them: producer id, first offset.
    pub fn aborted_in(&self, from: i64, upto: i64) -> Vec<AbortedTxn> {
        let start = self.aborted.partition_point(|a| a.last_offset < from);
        self.aborted
            .range(start..)
            .filter(|a| a.first_offset < upto)
            .copied()
            .collect()
    }

    /// Forgets aborted transactions wholly below the log start.
    pub fn forget_aborted_below(&mut self, log_start: i64) {
        while self
            .aborted
            .front()
            .is_some_and(|a| a.last_offset < log_start)
        {
            self.aborted.pop_front();
        }
    }

    /// Every producer, for DescribeProducers.
    pub fn views(&self) -> Vec<ProducerView> {
        let mut out: Vec<ProducerView> = self
            .producers
            .iter()
            .map(|(id, p)| ProducerView {
                producer_id: *id,
                epoch: p.epoch,
                last_sequence: p.batches.back().map_or(-1, |b| b.last_seq),
                last_timestamp: p.last_timestamp,
                coordinator_epoch: p.coordinator_epoch,
                txn_start_offset: p.txn_first_offset,
            })
            .collect();
        out.sort_by_key(|v| v.producer_id);
        out
    }

    /// Records an appended batch (or one found during recovery).
    pub fn record(
        &mut self,
        producer_id: i64,
        epoch: i16,
        first_seq: i32,
        last_seq: i32,
        base_offset: i64,
        last_offset: i64,
    ) {
        // The usual case, one producer writing batch after batch, leaves the order as it is.
        let newest = self.by_use.last_key_value().map(|(_, id)| *id) == Some(producer_id);
        let used = if newest {
            None
        } else {
            let used = self.next_use;
            self.next_use += 1;
            if let Some(p) = self.producers.get(&producer_id) {
                self.by_use.remove(&p.last_use);
            }
            self.by_use.insert(used, producer_id);
            Some(used)
        };
        let p = self
            .producers
            .entry(producer_id)
            .or_insert_with(|| Producer {
                epoch,
                batches: VecDeque::with_capacity(BATCHES_PER_PRODUCER),
                txn_first_offset: -1,
                coordinator_epoch: -1,
                last_timestamp: -1,
                last_seen_ms: UNSTAMPED,
                last_use: 0,
            });
        if let Some(used) = used {
            p.last_use = used;
        }
        p.last_seen_ms = UNSTAMPED;
        if epoch != p.epoch {
            p.epoch = epoch;
            p.batches.clear();
        }
        if first_seq < 0 {
            // Nothing to recognise a retry by.
            self.enforce_cap();
            return;
        }
        if p.batches.len() == BATCHES_PER_PRODUCER {
            p.batches.pop_front();
        }
        p.batches.push_back(BatchMeta {
            first_seq,
            last_seq,
            base_offset,
            last_offset,
        });
        self.enforce_cap();
    }

    /// Forgets producers idle for the expiration as of wall time `now_ms`, and stamps those
    /// seen since the last pass with `now_ms`. Returns how many were forgotten.
    pub fn expire(&mut self, now_ms: i64) -> usize {
        let expiration = self.limits.expiration_ms;
        let mut gone = Vec::new();
        for (id, p) in self.producers.iter_mut() {
            if p.last_seen_ms == UNSTAMPED {
                p.last_seen_ms = now_ms;
            } else if p.txn_first_offset < 0 && now_ms.saturating_sub(p.last_seen_ms) >= expiration
            {
                // A producer with an open transaction is kept: its marker must find it.
                gone.push(*id);
            }
        }
        for id in &gone {
            self.forget(*id);
        }
        gone.len()
    }

    fn forget(&mut self, producer_id: i64) {
        if let Some(p) = self.producers.remove(&producer_id) {
            self.by_use.remove(&p.last_use);
        }
    }

    /// Forgets the least recently used producers beyond the cap.
    fn enforce_cap(&mut self) {
        // Each round removes one producer, and there are finitely many.
        // Producers with open transactions are never evicted; they are skipped over.
        let mut kept = Vec::new();
        while self.producers.len() - kept.len() > self.limits.max_producers {
            let Some((used, oldest)) = self.by_use.pop_first() else {
                break;
            };
            if self
                .producers
                .get(&oldest)
                .is_some_and(|p| p.txn_first_offset >= 0)
            {
                kept.push((used, oldest));
                continue;
            }
            self.producers.remove(&oldest);
        }
        self.by_use.extend(kept);
    }
}

/// Why a producer-state snapshot was not usable.
#[derive(Debug, PartialEq, Eq)]
pub struct SnapshotError(&'static str);

/// Version 3 adds each producer's open transaction, coordinator epoch and last timestamp,
/// and the aborted transactions.
const SNAPSHOT_VERSION: u8 = 3;
/// Version 2 added each producer's last-seen time and lists producers oldest use first.
const SNAPSHOT_VERSION_2: u8 = 2;
/// Snapshots from before expiry: no times, any order.
const SNAPSHOT_VERSION_1: u8 = 1;

impl ProducerStates {
    /// Serialises the states as they are once the log holds everything below `offset`:
    /// version, offset, producers (least recently used first), each with its epoch, last-seen
    /// time and remembered batches, then a CRC-32C.
    pub fn snapshot(&self, offset: i64) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.producers.len() * 72);
        out.push(SNAPSHOT_VERSION);
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&(self.producers.len() as u32).to_be_bytes());
        for pid in self.by_use.values() {
            let Some(p) = self.producers.get(pid) else {
                continue;
            };
            out.extend_from_slice(&pid.to_be_bytes());
            out.extend_from_slice(&p.epoch.to_be_bytes());
            out.extend_from_slice(&p.last_seen_ms.to_be_bytes());
            out.extend_from_slice(&p.txn_first_offset.to_be_bytes());
            out.extend_from_slice(&p.coordinator_epoch.to_be_bytes());
            out.extend_from_slice(&p.last_timestamp.to_be_bytes());
            out.push(p.batches.len() as u8);
            for b in &p.batches {
                out.extend_from_slice(&b.first_seq.to_be_bytes());
                out.extend_from_slice(&b.last_seq.to_be_bytes());
                out.extend_from_slice(&b.base_offset.to_be_bytes());
                out.extend_from_slice(&b.last_offset.to_be_bytes());
            }
        }
        out.extend_from_slice(&(self.aborted.len() as u32).to_be_bytes());
        for a in &self.aborted {
            out.extend_from_slice(&a.producer_id.to_be_bytes());
            out.extend_from_slice(&a.first_offset.to_be_bytes());
            out.extend_from_slice(&a.last_offset.to_be_bytes());
        }
        let crc = crc32c_of(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    /// Reads a snapshot back: the offset it covers up to, and the states (with default limits;
    /// see [`ProducerStates::set_limits`]).
    pub fn from_snapshot(bytes: &[u8]) -> Result<(i64, Self), SnapshotError> {
        let (body, crc) = bytes.split_at(
            bytes
                .len()
                .checked_sub(4)
                .ok_or(SnapshotError("too short"))?,
        );
        if crc32c_of(body).to_be_bytes() != crc {
            return Err(SnapshotError("checksum mismatch"));
        }
        let mut r = Reader(body);
        let version = r.take::<1>()?[0];
        if !matches!(
            version,
            SNAPSHOT_VERSION | SNAPSHOT_VERSION_2 | SNAPSHOT_VERSION_1
        ) {
            return Err(SnapshotError("unknown version"));
        }
        let offset = i64::from_be_bytes(r.take()?);
        let count = u32::from_be_bytes(r.take()?);
        let mut states = Self::default();
        // Bounded by `count`, and each round consumes bytes or fails.
        for _ in 0..count {
            let pid = i64::from_be_bytes(r.take()?);
            let epoch = i16::from_be_bytes(r.take()?);
            // Version 1 had no times: those producers start a fresh lease.
            let last_seen_ms = if version == SNAPSHOT_VERSION_1 {
                UNSTAMPED
            } else {
                i64::from_be_bytes(r.take()?)
            };
            let (txn_first_offset, coordinator_epoch, last_timestamp) =
                if version >= SNAPSHOT_VERSION {
                    (
                        i64::from_be_bytes(r.take()?),
                        i32::from_be_bytes(r.take()?),
                        i64::from_be_bytes(r.take()?),
                    )
                } else {
                    (-1, -1, -1)
                };
            let n = r.take::<1>()?[0] as usize;
            if n > BATCHES_PER_PRODUCER {
                return Err(SnapshotError("too many batches for a producer"));
            }
            let mut batches = VecDeque::with_capacity(BATCHES_PER_PRODUCER);
            for _ in 0..n {
                batches.push_back(BatchMeta {
                    first_seq: i32::from_be_bytes(r.take()?),
                    last_seq: i32::from_be_bytes(r.take()?),
                    base_offset: i64::from_be_bytes(r.take()?),
                    last_offset: i64::from_be_bytes(r.take()?),
                });
            }
            let used = states.next_use;
            states.next_use += 1;
            let p = Producer {
                epoch,
                batches,
                txn_first_offset,
                coordinator_epoch,
                last_timestamp,
                last_seen_ms,
                last_use: used,
            };
            if let Some(dup) = states.producers.insert(pid, p) {
                states.by_use.remove(&dup.last_use);
                if dup.txn_first_offset >= 0 {
                    states.ongoing.remove(&dup.txn_first_offset);
                }
            }
            if txn_first_offset >= 0 {
                states.ongoing.insert(txn_first_offset, pid);
            }
            states.by_use.insert(used, pid);
        }
        if version >= SNAPSHOT_VERSION {
            let n = u32::from_be_bytes(r.take()?);
            // Bounded by `n`, and each round consumes bytes or fails.
            for _ in 0..n {
                let a = AbortedTxn {
                    producer_id: i64::from_be_bytes(r.take()?),
                    first_offset: i64::from_be_bytes(r.take()?),
                    last_offset: i64::from_be_bytes(r.take()?),
                };
                if states
                    .aborted
                    .back()
                    .is_some_and(|b| b.last_offset >= a.last_offset)
                {
                    return Err(SnapshotError("aborted transactions out of order"));
                }
                states.aborted.push_back(a);
            }
        }
        // A snapshot written under a larger cap keeps its most recently used producers.
        states.enforce_cap();
        if !r.0.is_empty() {
            return Err(SnapshotError("trailing bytes"));
        }
        Ok((offset, states))
    }
}

fn crc32c_of(bytes: &[u8]) -> u32 {
    spate_protocol::batch::crc32c(bytes)
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        if self.0.len() < N {
            return Err(SnapshotError("truncated"));
        }
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        let mut out = [0u8; N];
        out.copy_from_slice(head);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_round_trips_and_rejects_damage() {
        let s = with(&[(0, 4, 100), (5, 9, 105)]);
        let bytes = s.snapshot(110);
        let (offset, back) = ProducerStates::from_snapshot(&bytes).unwrap();
        assert_eq!(offset, 110);
        assert_eq!(back.check(1, 0, 5, 9), s.check(1, 0, 5, 9));
        assert_eq!(back.check(1, 0, 10, 12), SequenceCheck::Append);
        let mut bad = bytes.clone();
        bad[10] ^= 1;
        assert!(ProducerStates::from_snapshot(&bad).is_err());
        assert!(ProducerStates::from_snapshot(&bytes[..bytes.len() - 5]).is_err());
        assert!(ProducerStates::from_snapshot(&[]).is_err());
    }

    fn with(batches: &[(i32, i32, i64)]) -> ProducerStates {
        let mut s = ProducerStates::default();
        for &(f, l, off) in batches {
            s.record(1, 0, f, l, off, off + (l - f) as i64);
        }
        s
    }

    #[test]
    fn first_batch_of_unknown_producer_must_start_at_zero() {
        let s = ProducerStates::default();
        assert_eq!(s.check(1, 0, 0, 4), SequenceCheck::Append);
        assert_eq!(
            s.check(1, 0, 5, 9),
            SequenceCheck::Reject(ResponseError::UnknownProducerId)
        );
    }

    #[test]
    fn in_order_batch_is_appended_and_gap_is_out_of_order() {
        let s = with(&[(0, 4, 100)]);
        assert_eq!(s.check(1, 0, 5, 9), SequenceCheck::Append);
        assert_eq!(
            s.check(1, 0, 6, 9),
            SequenceCheck::Reject(ResponseError::OutOfOrderSequenceNumber)
        );
    }

    #[test]
    fn retry_of_a_remembered_batch_is_a_duplicate_with_its_offset() {
        let s = with(&[(0, 4, 100), (5, 9, 105)]);
        assert_eq!(
            s.check(1, 0, 0, 4),
            SequenceCheck::Duplicate {
                base_offset: 100,
                last_offset: 104
            }
        );
        assert_eq!(
            s.check(1, 0, 5, 9),
            SequenceCheck::Duplicate {
                base_offset: 105,
                last_offset: 109
            }
        );
    }

    #[test]
    fn only_five_batches_are_remembered() {
        let s = with(&[
            (0, 0, 0),
            (1, 1, 1),
            (2, 2, 2),
            (3, 3, 3),
            (4, 4, 4),
            (5, 5, 5),
        ]);
        assert_eq!(
            s.check(1, 0, 0, 0),
            SequenceCheck::Reject(ResponseError::DuplicateSequenceNumber)
        );
        assert_eq!(
            s.check(1, 0, 1, 1),
            SequenceCheck::Duplicate {
                base_offset: 1,
                last_offset: 1
            }
        );
    }

    #[test]
    fn epochs_fence_and_reset_sequences() {
        let mut s = with(&[(0, 4, 100)]);
        assert_eq!(s.check(1, 1, 0, 2), SequenceCheck::Append);
        assert_eq!(
            s.check(1, 1, 3, 4),
            SequenceCheck::Reject(ResponseError::OutOfOrderSequenceNumber)
        );
        s.record(1, 1, 0, 2, 105, 107);
        assert_eq!(
            s.check(1, 0, 5, 9),
            SequenceCheck::Reject(ResponseError::InvalidProducerEpoch)
        );
        assert_eq!(s.check(1, 1, 3, 4), SequenceCheck::Append);
    }

    #[test]
    fn sequence_wraps_at_i32_max() {
        let s = with(&[(i32::MAX - 1, i32::MAX, 10)]);
        assert_eq!(s.check(1, 0, 0, 3), SequenceCheck::Append);
    }

    use crate::time::{Clock, ManualClock};

    fn limited(expiration_ms: i64, max_producers: usize) -> ProducerStates {
        let mut s = ProducerStates::default();
        s.set_limits(ProducerLimits {
            expiration_ms,
            max_producers,
        });
        s
    }

    /// Records producer `pid`'s next batch of one record at sequence `seq`.
    fn write(s: &mut ProducerStates, pid: i64, seq: i32) {
        s.record(pid, 0, seq, seq, seq as i64, seq as i64);
    }

    fn known(s: &ProducerStates, pid: i64) -> bool {
        // A producer that is remembered has its next sequence accepted; a forgotten one is
        // asked to reset.
        s.check(pid, 0, 1, 1) == SequenceCheck::Append
    }

    #[test]
    fn an_idle_producer_is_forgotten_after_the_expiration_and_an_active_one_is_kept() {
        let clock = ManualClock::new(1_700_000_000_000);
        let mut s = limited(1_000, 100);
        write(&mut s, 1, 0);
        write(&mut s, 2, 0);
        assert_eq!(s.expire(clock.now_ms()), 0, "the first pass only stamps");
        clock.advance(600);
        s.record(2, 0, 1, 1, 1, 1);
        assert_eq!(s.expire(clock.now_ms()), 0);
        clock.advance(500);
        assert_eq!(s.expire(clock.now_ms()), 1, "producer 1 idle for 1100 ms");
        assert_eq!(
            s.check(1, 0, 1, 1),
            SequenceCheck::Reject(ResponseError::UnknownProducerId)
        );
        assert_eq!(
            s.check(1, 0, 0, 0),
            SequenceCheck::Append,
            "it may start over"
        );
        assert_eq!(
            s.check(2, 0, 2, 2),
            SequenceCheck::Append,
            "producer 2 is kept"
        );
        clock.advance(1_000);
        assert_eq!(s.expire(clock.now_ms()), 1);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn a_wall_clock_step_back_forgets_nobody() {
        let clock = ManualClock::new(1_700_000_000_000);
        let mut s = limited(1_000, 100);
        write(&mut s, 1, 0);
        s.expire(clock.now_ms());
        clock.step_wall(-3_600_000);
        assert_eq!(s.expire(clock.now_ms()), 0);
        assert!(known(&s, 1));
    }

    #[test]
    fn past_the_cap_the_least_recently_used_producer_is_forgotten() {
        let mut s = limited(DEFAULT_PRODUCER_ID_EXPIRATION_MS, 3);
        write(&mut s, 1, 0);
        write(&mut s, 2, 0);
        write(&mut s, 3, 0);
        s.record(1, 0, 1, 1, 1, 1);
        write(&mut s, 4, 0);
        assert_eq!(s.len(), 3);
        assert!(!known(&s, 2), "least recently used");
        assert_eq!(s.check(1, 0, 2, 2), SequenceCheck::Append);
        assert!(known(&s, 3) && known(&s, 4));
        // Many new producers never grow it past the cap.
        for pid in 100..10_100 {
            write(&mut s, pid, 0);
        }
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn snapshots_keep_last_seen_times_and_recency_and_obey_the_cap_on_load() {
        let clock = ManualClock::new(1_700_000_000_000);
        let mut s = limited(1_000, 100);
        for pid in 1..=4 {
            write(&mut s, pid, 0);
        }
        s.expire(clock.now_ms());
        clock.advance(700);
        write(&mut s, 5, 0);
        let (offset, mut back) = ProducerStates::from_snapshot(&s.snapshot(42)).unwrap();
        assert_eq!((offset, back.len()), (42, 5));
        back.set_limits(ProducerLimits {
            expiration_ms: 1_000,
            max_producers: 100,
        });
        clock.advance(400);
        // 1..=4 were stamped 1100 ms ago; 5 was seen since and gets stamped now.
        assert_eq!(back.expire(clock.now_ms()), 4);
        assert!(known(&back, 5));
        // A lower cap on load keeps the most recently used.
        let (_, mut capped) = ProducerStates::from_snapshot(&s.snapshot(42)).unwrap();
        capped.set_limits(ProducerLimits {
            expiration_ms: 1_000,
            max_producers: 2,
        });
        assert_eq!(capped.len(), 2);
        assert!(known(&capped, 4) && known(&capped, 5));
    }

    #[test]
    fn version_1_snapshots_still_load_with_a_fresh_lease() {
        let mut v1 = vec![SNAPSHOT_VERSION_1];
        v1.extend_from_slice(&10i64.to_be_bytes());
        v1.extend_from_slice(&1u32.to_be_bytes());
        v1.extend_from_slice(&7i64.to_be_bytes());
        v1.extend_from_slice(&0i16.to_be_bytes());
        v1.push(1);
        for v in [0i32, 0] {
            v1.extend_from_slice(&v.to_be_bytes());
        }
        for v in [9i64, 9] {
            v1.extend_from_slice(&v.to_be_bytes());
        }
        let crc = crc32c_of(&v1);
        v1.extend_from_slice(&crc.to_be_bytes());
        let (offset, mut s) = ProducerStates::from_snapshot(&v1).unwrap();
        assert_eq!(offset, 10);
        assert_eq!(
            s.check(7, 0, 0, 0),
            SequenceCheck::Duplicate {
                base_offset: 9,
                last_offset: 9
            }
        );
        s.set_limits(ProducerLimits {
            expiration_ms: 1_000,
            max_producers: 10,
        });
        assert_eq!(
            s.expire(5_000_000),
            0,
            "stamped on the first pass, not expired"
        );
        assert_eq!(s.expire(5_000_999), 0);
        assert_eq!(s.expire(5_001_000), 1);
    }

    #[test]
    fn a_snapshot_claiming_more_producers_than_it_holds_is_refused() {
        let mut bytes = vec![SNAPSHOT_VERSION];
        bytes.extend_from_slice(&0i64.to_be_bytes());
        bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        let crc = crc32c_of(&bytes);
        bytes.extend_from_slice(&crc.to_be_bytes());
        assert_eq!(
            ProducerStates::from_snapshot(&bytes).unwrap_err(),
            SnapshotError("truncated")
        );
    }

    fn txn_header(pid: i64, seq: i32, base_offset: i64, n: i32) -> BatchHeader {
        let mut b = vec![0u8; spate_protocol::batch::HEADER_LEN];
        b[8..12].copy_from_slice(&((spate_protocol::batch::HEADER_LEN - 12) as i32).to_be_bytes());
        b[16] = 2;
        b[0..8].copy_from_slice(&base_offset.to_be_bytes());
        b[21..23].copy_from_slice(&0x10i16.to_be_bytes());
        b[23..27].copy_from_slice(&(n - 1).to_be_bytes());
        b[43..51].copy_from_slice(&pid.to_be_bytes());
        b[53..57].copy_from_slice(&seq.to_be_bytes());
        b[57..61].copy_from_slice(&n.to_be_bytes());
        BatchHeader::parse(&b).unwrap()
    }

    fn abort() -> ControlRecord {
        ControlRecord {
            kind: ControlKind::Abort,
            coordinator_epoch: 3,
        }
    }

    #[test]
    fn producers_with_open_transactions_are_neither_expired_nor_evicted() {
        let mut s = limited(1_000, 2);
        s.record_data(&txn_header(1, 0, 0, 1), 0, 0);
        write(&mut s, 2, 0);
        write(&mut s, 3, 0);
        assert!(
            known(&s, 1),
            "the open transaction's producer stays past the cap"
        );
        assert_eq!(s.expire(0), 0);
        assert_eq!(
            s.expire(5_000),
            2,
            "the idle producers without a transaction go"
        );
        assert!(known(&s, 1));
        assert_eq!(s.first_unstable_offset(), Some(0));
        s.end_txn(1, 0, abort(), 9);
        assert_eq!(s.first_unstable_offset(), None);
        s.expire(5_000);
        assert_eq!(s.expire(10_000), 1, "expires once its transaction ended");
    }

    #[test]
    fn snapshots_keep_open_transactions_aborted_ones_and_coordinator_epochs() {
        let mut s = ProducerStates::default();
        s.record_data(&txn_header(1, 0, 0, 2), 0, 1);
        s.end_txn(1, 0, abort(), 2);
        s.record_data(&txn_header(2, 0, 3, 2), 3, 4);
        let (offset, back) = ProducerStates::from_snapshot(&s.snapshot(5)).unwrap();
        assert_eq!(offset, 5);
        assert_eq!(back.first_unstable_offset(), Some(3));
        assert_eq!(back.aborted_in(0, 5), s.aborted_in(0, 5));
        assert_eq!(back.views(), s.views());
        assert_eq!(
            back.check_marker(1, 0, 2),
            Err(ResponseError::TransactionCoordinatorFenced),
            "the coordinator epoch of the last marker survives"
        );
        let mut forgotten = back.clone();
        forgotten.forget_aborted_below(3);
        assert!(forgotten.aborted_in(0, 5).is_empty());
    }
}
