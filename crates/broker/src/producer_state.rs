//! Idempotent-producer bookkeeping for one partition: a pure state machine.
//!
//! For each producer id it remembers the epoch and the last few batches' sequence ranges and
//! offsets, which is what Kafka's semantics need: a retried batch is recognised and answered
//! with its original offset, a gap in sequences is refused.

use std::collections::{HashMap, VecDeque};

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

#[derive(Debug, Clone, PartialEq, Eq)]
struct Producer {
    epoch: i16,
    batches: VecDeque<BatchMeta>,
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

/// Producer states of one partition.
#[derive(Debug, Default, Clone)]
pub struct ProducerStates {
    producers: HashMap<i64, Producer>,
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
        let p = self
            .producers
            .entry(producer_id)
            .or_insert_with(|| Producer {
                epoch,
                batches: VecDeque::with_capacity(BATCHES_PER_PRODUCER),
            });
        if epoch != p.epoch {
            p.epoch = epoch;
            p.batches.clear();
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
    }
}

/// Why a producer-state snapshot was not usable.
#[derive(Debug, PartialEq, Eq)]
pub struct SnapshotError(&'static str);

const SNAPSHOT_VERSION: u8 = 1;

impl ProducerStates {
    /// Serialises the states as they are once the log holds everything below `offset`:
    /// version, offset, producers, each with its epoch and remembered batches, then a CRC-32C.
    pub fn snapshot(&self, offset: i64) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.producers.len() * 64);
        out.push(SNAPSHOT_VERSION);
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&(self.producers.len() as u32).to_be_bytes());
        for (pid, p) in &self.producers {
            out.extend_from_slice(&pid.to_be_bytes());
            out.extend_from_slice(&p.epoch.to_be_bytes());
            out.push(p.batches.len() as u8);
            for b in &p.batches {
                out.extend_from_slice(&b.first_seq.to_be_bytes());
                out.extend_from_slice(&b.last_seq.to_be_bytes());
                out.extend_from_slice(&b.base_offset.to_be_bytes());
                out.extend_from_slice(&b.last_offset.to_be_bytes());
            }
        }
        let crc = crc32c_of(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    /// Reads a snapshot back: the offset it covers up to, and the states.
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
        if r.take::<1>()?[0] != SNAPSHOT_VERSION {
            return Err(SnapshotError("unknown version"));
        }
        let offset = i64::from_be_bytes(r.take()?);
        let count = u32::from_be_bytes(r.take()?);
        let mut states = Self::default();
        for _ in 0..count {
            let pid = i64::from_be_bytes(r.take()?);
            let epoch = i16::from_be_bytes(r.take()?);
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
            states.producers.insert(pid, Producer { epoch, batches });
        }
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
}
