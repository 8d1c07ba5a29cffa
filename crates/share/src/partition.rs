//! One share-partition: the delivery state of the records of one topic-partition for one share
//! group, between the share-partition start offset (SPSO) and end offset (SPEO).
//!
//! The in-flight window `[start_offset, end_offset)` is kept as a map of batches keyed by
//! their first offset; each batch is a run of consecutive offsets in the same state with the
//! same delivery count. The batches always cover the window exactly, without holes, so a
//! window of 2,000 records acquired in a few fetches is a handful of map entries. An operation
//! on part of a batch splits it; neighbours that end up equal are merged again.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use kafka_protocol::error::ResponseError;
use thiserror::Error;

use crate::state::{DeliveryState, PartitionState, StateBatch};

/// A record offset in the topic-partition.
pub type Offset = i64;

/// Kafka's `group.share.partition.max.record.locks` default: most records in flight at once.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 2_000;
/// Kafka's `group.share.delivery.count.limit` default: most delivery attempts of a record.
pub const DEFAULT_DELIVERY_COUNT_LIMIT: i16 = 5;
/// Kafka's `group.share.record.lock.duration.ms` default.
pub const DEFAULT_LOCK_DURATION_MS: i64 = 30_000;

/// Limits of one share-partition (the group's share configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharePartitionConfig {
    /// Most records in the in-flight window; beyond it no new record is acquired.
    pub max_in_flight: u32,
    /// A record delivered this many times is archived instead of being made available again.
    pub delivery_count_limit: i16,
}

impl Default for SharePartitionConfig {
    fn default() -> Self {
        Self {
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            delivery_count_limit: DEFAULT_DELIVERY_COUNT_LIMIT,
        }
    }
}

/// The state of one in-flight record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordState {
    /// May be acquired (never delivered, released, or its lock expired).
    Available,
    /// Delivered to `member`, which holds it until `deadline_ms`.
    Acquired {
        /// Holder of the lock.
        member: String,
        /// The lock is lost at this time (ms).
        deadline_ms: i64,
    },
    /// Processed successfully (ACCEPT).
    Acknowledged,
    /// Will never be delivered again (REJECT, GAP, or the delivery count limit was reached).
    Archived,
}

impl RecordState {
    fn is_done(&self) -> bool {
        matches!(self, RecordState::Acknowledged | RecordState::Archived)
    }
}

/// How a consumer acknowledges a record (ShareAcknowledge/ShareFetch `AcknowledgeTypes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckType {
    /// 0: the offset is a gap in the log (no record there); archived.
    Gap,
    /// 1: processed; acknowledged.
    Accept,
    /// 2: not processed; available again for another delivery.
    Release,
    /// 3: unprocessable; archived.
    Reject,
}

impl AckType {
    /// The type for a wire value, `None` for an unknown one.
    pub fn from_code(code: i8) -> Option<Self> {
        match code {
            0 => Some(AckType::Gap),
            1 => Some(AckType::Accept),
            2 => Some(AckType::Release),
            3 => Some(AckType::Reject),
            _ => None,
        }
    }

    /// The wire value.
    pub fn code(self) -> i8 {
        match self {
            AckType::Gap => 0,
            AckType::Accept => 1,
            AckType::Release => 2,
            AckType::Reject => 3,
        }
    }
}

/// One acknowledgement batch: `first..=last` with one type for all of it or one per offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckBatch {
    /// First offset.
    pub first: Offset,
    /// Last offset (inclusive).
    pub last: Offset,
    /// One type for the whole batch, or `last - first + 1` types.
    pub types: Vec<AckType>,
}

impl AckBatch {
    /// A batch acknowledged with one type.
    pub fn new(first: Offset, last: Offset, ack: AckType) -> Self {
        Self {
            first,
            last,
            types: vec![ack],
        }
    }

    fn type_at(&self, offset: Offset) -> AckType {
        if self.types.len() == 1 {
            self.types[0]
        } else {
            self.types[(offset - self.first) as usize]
        }
    }
}

/// Records handed to a member by [`SharePartition::acquire`] (ShareFetch `AcquiredRecords`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquiredRange {
    /// First offset.
    pub first: Offset,
    /// Last offset (inclusive).
    pub last: Offset,
    /// How many times these records have been delivered, this delivery included.
    pub delivery_count: i16,
}

/// Why an acknowledgement was refused. Nothing of the request is applied then.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AckError {
    /// The batch itself is malformed (first after last, wrong number of types, overlaps).
    #[error("invalid acknowledgement batch {first}..={last}: {reason}")]
    InvalidBatch {
        /// First offset of the batch.
        first: Offset,
        /// Last offset of the batch.
        last: Offset,
        /// What is wrong.
        reason: &'static str,
    },
    /// The offset was never acquired: it is at or past the end of the in-flight window.
    #[error("offset {offset} is past the acquired records (end offset {end_offset})")]
    OutsideWindow {
        /// Offending offset.
        offset: Offset,
        /// The share-partition end offset (exclusive).
        end_offset: Offset,
    },
    /// The record is not acquired by this member (someone else holds it, or nobody does).
    #[error("offset {offset} is not acquired by member {member}")]
    NotAcquired {
        /// Offending offset.
        offset: Offset,
        /// The acknowledging member.
        member: String,
    },
    /// The member's lock on the record expired before the acknowledgement arrived.
    #[error("the acquisition lock on offset {offset} expired")]
    LockExpired {
        /// Offending offset.
        offset: Offset,
    },
}

impl AckError {
    /// The Kafka error code for the partition in ShareAcknowledge/ShareFetch.
    pub fn error(&self) -> ResponseError {
        match self {
            AckError::InvalidBatch { .. } | AckError::OutsideWindow { .. } => {
                ResponseError::InvalidRequest
            }
            AckError::NotAcquired { .. } | AckError::LockExpired { .. } => {
                ResponseError::InvalidRecordState
            }
        }
    }
}

/// Why a start-offset reset was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ResetError {
    /// Members still hold acquired records (Kafka requires the group to be empty).
    #[error("{0} records are still acquired by members")]
    RecordsAcquired(u64),
    /// A negative offset.
    #[error("invalid start offset {0}")]
    InvalidOffset(Offset),
}

impl ResetError {
    /// The Kafka error code (AlterShareGroupOffsets answers NON_EMPTY_GROUP for a group with
    /// members).
    pub fn error(&self) -> ResponseError {
        match self {
            ResetError::RecordsAcquired(_) => ResponseError::NonEmptyGroup,
            ResetError::InvalidOffset(_) => ResponseError::InvalidRequest,
        }
    }
}

/// Why a durable state could not be loaded into a share-partition.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LoadError {
    /// A batch with first > last, or a negative offset.
    #[error("invalid state batch {first}..={last}")]
    InvalidBatch {
        /// First offset.
        first: Offset,
        /// Last offset.
        last: Offset,
    },
    /// A batch starts below the start offset (Kafka refuses such a state too).
    #[error("state batch at {first} is below the start offset {start_offset}")]
    BelowStart {
        /// First offset of the batch.
        first: Offset,
        /// The state's start offset.
        start_offset: Offset,
    },
    /// Two batches overlap.
    #[error("state batches overlap at offset {0}")]
    Overlap(Offset),
    /// A delivery state Kafka does not persist.
    #[error("unknown delivery state {0}")]
    UnknownDeliveryState(i8),
}

/// How the start offset of a share-partition without state is chosen
/// (`share.auto.offset.reset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AutoOffsetReset {
    /// The log end offset (Kafka's default): only records produced from now on.
    #[default]
    Latest,
    /// The log start offset.
    Earliest,
    /// `by_duration:`: the first record at or after now minus this many ms; the broker looks
    /// the offset up by timestamp.
    ByDuration(i64),
}

impl AutoOffsetReset {
    /// Parses Kafka's config value: `latest`, `earliest` or `by_duration:<ISO-8601 duration>`
    /// (only the `PnDTnHnMnS` forms with whole numbers are understood).
    pub fn parse(value: &str) -> Option<Self> {
        let v = value.trim().to_ascii_lowercase();
        match v.as_str() {
            "latest" => Some(Self::Latest),
            "earliest" => Some(Self::Earliest),
            _ => v
                .strip_prefix("by_duration:")
                .and_then(parse_iso_duration_ms)
                .map(Self::ByDuration),
        }
    }

    /// The start offset for a new share-partition: `offset_at_time` is the broker's answer for
    /// the first offset with a timestamp at or after `now - duration` (only for
    /// [`AutoOffsetReset::ByDuration`]; `None` when there is none, which means the log end).
    pub fn start_offset(
        self,
        log_start: Offset,
        log_end: Offset,
        offset_at_time: Option<Offset>,
    ) -> Offset {
        match self {
            Self::Latest => log_end,
            Self::Earliest => log_start,
            Self::ByDuration(_) => offset_at_time.unwrap_or(log_end).clamp(log_start, log_end),
        }
    }
}

fn parse_iso_duration_ms(s: &str) -> Option<i64> {
    let rest = s.strip_prefix('p')?;
    let (date, time) = match rest.split_once('t') {
        Some((d, t)) => (d, Some(t)),
        None => (rest, None),
    };
    let mut total: i64 = 0;
    let mut parse_part = |part: &str, units: &[(char, i64)]| -> Option<()> {
        let mut num = String::new();
        for c in part.chars() {
            if c.is_ascii_digit() {
                num.push(c);
            } else {
                let unit = units.iter().find(|(u, _)| *u == c)?.1;
                let n: i64 = num.parse().ok()?;
                total = total.checked_add(n.checked_mul(unit)?)?;
                num.clear();
            }
        }
        num.is_empty().then_some(())
    };
    parse_part(date, &[('d', 86_400_000)])?;
    if let Some(t) = time {
        if t.is_empty() {
            return None;
        }
        parse_part(t, &[('h', 3_600_000), ('m', 60_000), ('s', 1_000)])?;
    }
    (s.len() > 1).then_some(total)
}

/// Cumulative counters of a share-partition, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShareMetrics {
    /// Acquisition locks that ran out before the record was acknowledged or released.
    pub lock_expiries: u64,
    /// Records delivered again (acquired with a delivery count above zero).
    pub redeliveries: u64,
    /// Records archived (rejected, gaps, or at the delivery count limit).
    pub archived: u64,
    /// Records acknowledged with ACCEPT.
    pub accepted: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Batch {
    last: Offset,
    state: RecordState,
    delivery_count: i16,
}

/// The delivery state of one share-partition. Every operation takes the current time (ms);
/// a lock whose deadline is at or before `now` is expired before the operation runs.
#[derive(Debug, Clone)]
pub struct SharePartition {
    config: SharePartitionConfig,
    start: Offset,
    end: Offset,
    state_epoch: i32,
    leader_epoch: i32,
    batches: BTreeMap<Offset, Batch>,
    metrics: ShareMetrics,
    /// Offset ranges whose durable state changed since [`SharePartition::take_changes`].
    dirty: Vec<(Offset, Offset)>,
    /// The start offset as of the last [`SharePartition::take_changes`].
    written_start: Offset,
    /// The state was reset since: the next write must be a whole snapshot.
    reset: bool,
}

/// What must be written to `__share_group_state` after some operations
/// ([`SharePartition::take_changes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateChange {
    /// Nothing durable changed.
    Unchanged,
    /// A `ShareUpdate`: the new start offset if it moved, and the durable state of the offsets
    /// that changed (acquired records written as available, as in a snapshot).
    Update {
        /// The new start offset, `None` if unchanged.
        start_offset: Option<Offset>,
        /// The changed batches, at or above the start offset.
        batches: Vec<StateBatch>,
    },
    /// The state was reset (new state epoch): a whole `ShareSnapshot` must be written.
    Snapshot(PartitionState),
}

impl SharePartition {
    /// A share-partition without state that starts at `start_offset` (see
    /// [`AutoOffsetReset::start_offset`]).
    pub fn new(config: SharePartitionConfig, start_offset: Offset) -> Self {
        let start = start_offset.max(0);
        Self {
            config,
            start,
            end: start,
            state_epoch: 0,
            leader_epoch: 0,
            batches: BTreeMap::new(),
            metrics: ShareMetrics::default(),
            dirty: Vec::new(),
            written_start: start,
            reset: false,
        }
    }

    /// Resumes from a durable state (a new leader, or a restart). Locks are not durable:
    /// records that were acquired come back available with their delivery count, or archived
    /// if that count reached the limit. Offsets between batches that the state does not
    /// mention were never delivered: they come back available with a delivery count of 0.
    pub fn from_state(
        config: SharePartitionConfig,
        state: &PartitionState,
    ) -> Result<Self, LoadError> {
        let start = state.start_offset.max(0);
        let mut sorted: Vec<&StateBatch> = state.batches.iter().collect();
        sorted.sort_by_key(|b| b.first_offset);
        let mut p = Self::new(config, start);
        p.state_epoch = state.state_epoch;
        p.leader_epoch = state.leader_epoch;
        for b in sorted {
            if b.first_offset > b.last_offset || b.first_offset < 0 || b.last_offset == Offset::MAX
            {
                return Err(LoadError::InvalidBatch {
                    first: b.first_offset,
                    last: b.last_offset,
                });
            }
            if b.first_offset < start {
                return Err(LoadError::BelowStart {
                    first: b.first_offset,
                    start_offset: start,
                });
            }
            if b.first_offset < p.end {
                return Err(LoadError::Overlap(b.first_offset));
            }
            let ds = DeliveryState::from_code(b.delivery_state)
                .ok_or(LoadError::UnknownDeliveryState(b.delivery_state))?;
            if b.first_offset > p.end {
                let hole = Batch {
                    last: b.first_offset - 1,
                    state: RecordState::Available,
                    delivery_count: 0,
                };
                p.batches.insert(p.end, hole);
            }
            let count = b.delivery_count.max(0);
            let state = match ds {
                DeliveryState::Available | DeliveryState::Acquired => {
                    if count >= config.delivery_count_limit {
                        RecordState::Archived
                    } else {
                        RecordState::Available
                    }
                }
                DeliveryState::Acknowledged => RecordState::Acknowledged,
                DeliveryState::Archived => RecordState::Archived,
            };
            p.batches.insert(
                b.first_offset,
                Batch {
                    last: b.last_offset,
                    state,
                    delivery_count: count,
                },
            );
            p.end = b.last_offset + 1;
        }
        let (lo, hi) = (p.start, p.end);
        p.coalesce(lo, hi);
        p.advance_start();
        p.written_start = p.start;
        Ok(p)
    }

    /// The durable view: start offset and the state of every in-flight record, as Kafka
    /// persists it. An acquired record is written as it would be after its lock expired
    /// (available, or archived at the delivery count limit), since locks are not durable; so
    /// `from_state(snapshot())` gives back the same snapshot.
    pub fn snapshot(&self) -> PartitionState {
        let (start_offset, batches) = self.snapshot_batches(self.start, self.end - 1);
        PartitionState {
            state_epoch: self.state_epoch,
            leader_epoch: self.leader_epoch,
            start_offset,
            batches,
        }
    }

    /// The share-partition start offset (SPSO): every record below it is done.
    pub fn start_offset(&self) -> Offset {
        self.start
    }

    /// The share-partition end offset, exclusive: the first offset never acquired. (Kafka's
    /// SPEO is the last in-flight offset, this minus one.)
    pub fn end_offset(&self) -> Offset {
        self.end
    }

    /// Where the broker should read the log from for the next acquisition: the first available
    /// record in the window, or the end offset.
    pub fn next_fetch_offset(&self) -> Offset {
        self.batches
            .iter()
            .find(|(_, b)| b.state == RecordState::Available)
            .map(|(&f, _)| f)
            .unwrap_or(self.end)
    }

    /// Records in the in-flight window (`end_offset - start_offset`), whatever their state.
    pub fn in_flight_count(&self) -> u64 {
        (self.end - self.start) as u64
    }

    /// Offsets in the window whose delivery is complete, as written durably
    /// (`DeliveryCompleteCount`).
    pub fn delivery_complete_count(&self) -> i32 {
        self.snapshot().delivery_complete_count()
    }

    /// Records currently acquired by some member.
    pub fn acquired_count(&self) -> u64 {
        self.count_where(|s| matches!(s, RecordState::Acquired { .. }))
    }

    /// The state epoch (bumped by [`SharePartition::reset_to`]).
    pub fn state_epoch(&self) -> i32 {
        self.state_epoch
    }

    /// Sets the leader epoch of the partition, written with the durable state.
    pub fn set_leader_epoch(&mut self, epoch: i32) {
        self.leader_epoch = epoch;
    }

    /// Cumulative counters.
    pub fn metrics(&self) -> ShareMetrics {
        self.metrics
    }

    /// Number of internal batches (for tests of the compact storage).
    pub fn batch_count(&self) -> usize {
        self.batches.len()
    }

    /// The state and delivery count of one offset, `None` outside the window.
    pub fn record(&self, offset: Offset) -> Option<(RecordState, i16)> {
        if offset < self.start || offset >= self.end {
            return None;
        }
        let (_, b) = self.batches.range(..=offset).next_back()?;
        Some((b.state.clone(), b.delivery_count))
    }

    /// Acquires records for `member` from what a log read returned: `fetched` are the offset
    /// ranges of the records the log holds (from a read at [`Self::next_fetch_offset`]);
    /// offsets inside their span that no range covers have no record (compacted, control
    /// records) and are archived. Available records below the end offset are re-acquired
    /// first, then new ones from the end offset on, at most `max_records` in all and no new
    /// ones beyond `max_in_flight`. Records acquired by anyone are skipped.
    pub fn acquire(
        &mut self,
        member: &str,
        fetched: &[RangeInclusive<Offset>],
        max_records: u32,
        lock_duration_ms: i64,
        now: i64,
    ) -> Vec<AcquiredRange> {
        self.expire(now);
        let ranges = normalize(fetched, self.start);
        let mut out: Vec<AcquiredRange> = Vec::new();
        let (Some(span_lo), Some(span_hi)) = (
            ranges.first().map(|r| *r.start()),
            ranges.last().map(|r| *r.end()),
        ) else {
            return out;
        };
        let mut budget = max_records as i64;
        let acquired = RecordState::Acquired {
            member: member.to_string(),
            deadline_ms: now.saturating_add(lock_duration_ms),
        };

        // Holes in the span inside the window: records that do not exist.
        let window_hi = span_hi.min(self.end - 1);
        let mut cursor = span_lo;
        for r in &ranges {
            if *r.start() > cursor && cursor <= window_hi {
                let hole_hi = (*r.start() - 1).min(window_hi);
                self.archive_available(cursor, hole_hi);
            }
            cursor = cursor.max(r.end().saturating_add(1));
        }

        // Redelivery: available records already in the window.
        for r in &ranges {
            if budget == 0 || *r.start() >= self.end {
                break;
            }
            let hi = (*r.end()).min(self.end - 1);
            let segments: Vec<(Offset, Offset, i16)> = self
                .segments(*r.start(), hi)
                .into_iter()
                .filter(|(_, _, b)| b.state == RecordState::Available)
                .map(|(f, l, b)| (f, l, b.delivery_count))
                .collect();
            for (f, l, count) in segments {
                if budget == 0 {
                    break;
                }
                let l = l.min(f.saturating_add(budget - 1));
                let n = l - f + 1;
                budget -= n;
                if count > 0 {
                    self.metrics.redeliveries += n as u64;
                }
                let new_count = count.saturating_add(1);
                self.set(f, l, |_, b| {
                    b.state = acquired.clone();
                    b.delivery_count = new_count;
                });
                out.push(AcquiredRange {
                    first: f,
                    last: l,
                    delivery_count: new_count,
                });
            }
        }

        // New records from the end offset on.
        let max_end = self.start.saturating_add(self.config.max_in_flight as i64);
        for r in &ranges {
            if budget == 0 || self.end >= max_end {
                break;
            }
            if *r.end() < self.end {
                continue;
            }
            let f = (*r.start()).max(self.end);
            let l = (*r.end())
                .min(f.saturating_add(budget - 1))
                .min(max_end - 1);
            if f > l {
                break;
            }
            self.mark(self.end, l);
            if f > self.end {
                let gap_first = self.end;
                self.batches.insert(
                    gap_first,
                    Batch {
                        last: f - 1,
                        state: RecordState::Archived,
                        delivery_count: 0,
                    },
                );
                self.metrics.archived += (f - gap_first) as u64;
            }
            self.batches.insert(
                f,
                Batch {
                    last: l,
                    state: acquired.clone(),
                    delivery_count: 1,
                },
            );
            self.end = l + 1;
            budget -= l - f + 1;
            out.push(AcquiredRange {
                first: f,
                last: l,
                delivery_count: 1,
            });
        }
        let (lo, hi) = (self.start, self.end);
        self.coalesce(lo, hi);
        self.advance_start();
        merge_ranges(out)
    }

    /// Applies `member`'s acknowledgements, all or nothing. Offsets below the start offset are
    /// already done and ignored. ACCEPT acknowledges; RELEASE makes a record available again
    /// (archived at the delivery count limit); REJECT and GAP archive it.
    pub fn acknowledge(
        &mut self,
        member: &str,
        batches: &[AckBatch],
        now: i64,
    ) -> Result<(), AckError> {
        let result = self.validate_acks(member, batches, now);
        self.expire(now);
        result?;
        let limit = self.config.delivery_count_limit;
        for batch in batches {
            let first = batch.first.max(self.start);
            if batch.last < first {
                continue;
            }
            let per_offset = batch.types.len() > 1;
            if per_offset {
                // Apply runs of equal types together.
                let mut o = first;
                while o <= batch.last {
                    let t = batch.type_at(o);
                    let mut l = o;
                    while l < batch.last && batch.type_at(l + 1) == t {
                        l += 1;
                    }
                    self.apply_ack(o, l, t, limit);
                    o = l + 1;
                }
            } else {
                self.apply_ack(first, batch.last, batch.types[0], limit);
            }
        }
        let (lo, hi) = (self.start, self.end);
        self.coalesce(lo, hi);
        self.advance_start();
        Ok(())
    }

    /// Expires the locks whose deadline is at or before `now`: those records become
    /// available again, or archived at the delivery count limit. Returns how many expired.
    pub fn expire_locks(&mut self, now: i64) -> u64 {
        self.expire(now)
    }

    /// Releases every record `member` holds (it left the group or was fenced): available
    /// again with its delivery count, or archived at the limit. Returns how many.
    pub fn release_member(&mut self, member: &str, now: i64) -> u64 {
        self.expire(now);
        let n = self
            .release_where(|s| matches!(s, RecordState::Acquired { member: m, .. } if m == member));
        if n > 0 {
            let (lo, hi) = (self.start, self.end);
            self.coalesce(lo, hi);
            self.advance_start();
        }
        n
    }

    /// The log start offset moved to `log_start` (retention, DeleteRecords): records below it
    /// are gone, so the start offset moves up to it and their state is dropped.
    pub fn update_log_start(&mut self, log_start: Offset) {
        if log_start <= self.start {
            return;
        }
        if log_start >= self.end {
            self.batches.clear();
            self.start = log_start;
            self.end = log_start;
            return;
        }
        self.split_at(log_start);
        self.batches = self.batches.split_off(&log_start);
        self.start = log_start;
        self.advance_start();
    }

    /// Moves the start offset to `offset` and forgets all in-flight state
    /// (AlterShareGroupOffsets, or a reset of the share-partition). Refused while any record
    /// is acquired: Kafka requires the group to have no members. Bumps the state epoch.
    pub fn reset_to(&mut self, offset: Offset, now: i64) -> Result<(), ResetError> {
        self.expire(now);
        if offset < 0 {
            return Err(ResetError::InvalidOffset(offset));
        }
        let acquired = self.acquired_count();
        if acquired > 0 {
            return Err(ResetError::RecordsAcquired(acquired));
        }
        self.batches.clear();
        self.start = offset;
        self.end = offset;
        self.state_epoch += 1;
        self.dirty.clear();
        self.reset = true;
        Ok(())
    }

    /// What changed durably since the last call: what to write to `__share_group_state`.
    pub fn take_changes(&mut self) -> StateChange {
        if std::mem::take(&mut self.reset) {
            self.dirty.clear();
            self.written_start = self.start;
            return StateChange::Snapshot(self.snapshot());
        }
        let mut ranges = std::mem::take(&mut self.dirty);
        ranges.sort_unstable();
        let start = self.durable_start();
        let mut batches: Vec<StateBatch> = Vec::new();
        let mut covered = start - 1;
        for (f, l) in ranges {
            let f = f.max(covered + 1).max(start);
            let l = l.min(self.end - 1);
            if f > l {
                continue;
            }
            batches.extend(self.durable_batches(f, l));
            covered = l;
        }
        let moved = start != self.written_start;
        self.written_start = start;
        if !moved && batches.is_empty() {
            return StateChange::Unchanged;
        }
        StateChange::Update {
            start_offset: moved.then_some(start),
            batches,
        }
    }

    /// The start offset as written durably (see [`Self::snapshot`]).
    fn durable_start(&self) -> Offset {
        self.snapshot_batches(self.start, self.end - 1).0
    }

    /// The durable batches of `first..=last`, merged.
    fn durable_batches(&self, first: Offset, last: Offset) -> Vec<StateBatch> {
        let mut out: Vec<StateBatch> = Vec::new();
        for (f, l, b) in self.segments(first, last) {
            let sb = StateBatch {
                first_offset: f,
                last_offset: l,
                delivery_state: self.durable_state(&b).code(),
                delivery_count: b.delivery_count,
            };
            match out.last_mut() {
                Some(prev)
                    if prev.last_offset + 1 == f
                        && prev.delivery_state == sb.delivery_state
                        && prev.delivery_count == sb.delivery_count =>
                {
                    prev.last_offset = l;
                }
                _ => out.push(sb),
            }
        }
        out
    }

    fn durable_state(&self, b: &Batch) -> DeliveryState {
        match &b.state {
            RecordState::Available => DeliveryState::Available,
            RecordState::Acquired { .. } => {
                if b.delivery_count >= self.config.delivery_count_limit {
                    DeliveryState::Archived
                } else {
                    DeliveryState::Available
                }
            }
            RecordState::Acknowledged => DeliveryState::Acknowledged,
            RecordState::Archived => DeliveryState::Archived,
        }
    }

    /// The durable start offset and batches of the window part `first..=last`: leading
    /// batches that are durably done are skipped.
    fn snapshot_batches(&self, first: Offset, last: Offset) -> (Offset, Vec<StateBatch>) {
        let mut batches = self.durable_batches(first, last);
        let done = |b: &StateBatch| {
            b.delivery_state == DeliveryState::Acknowledged.code()
                || b.delivery_state == DeliveryState::Archived.code()
        };
        let lead = batches.iter().take_while(|b| done(b)).count();
        let mut start = self.start;
        if let Some(b) = batches[..lead].last() {
            start = b.last_offset + 1;
        }
        batches.drain(..lead);
        (start, batches)
    }

    fn mark(&mut self, first: Offset, last: Offset) {
        if first > last {
            return;
        }
        self.dirty.push((first, last));
        if self.dirty.len() > 4_096 {
            // Keep the list bounded between writes: merge overlapping ranges.
            self.dirty.sort_unstable();
            let mut merged: Vec<(Offset, Offset)> = Vec::with_capacity(self.dirty.len());
            for (f, l) in self.dirty.drain(..) {
                match merged.last_mut() {
                    Some((_, pl)) if f <= pl.saturating_add(1) => *pl = (*pl).max(l),
                    _ => merged.push((f, l)),
                }
            }
            self.dirty = merged;
        }
    }

    fn validate_acks(&self, member: &str, batches: &[AckBatch], now: i64) -> Result<(), AckError> {
        let mut sorted: Vec<&AckBatch> = batches.iter().collect();
        sorted.sort_by_key(|b| b.first);
        let mut prev_last: Option<Offset> = None;
        for b in &sorted {
            let invalid = |reason| AckError::InvalidBatch {
                first: b.first,
                last: b.last,
                reason,
            };
            if b.first > b.last || b.first < 0 {
                return Err(invalid("first offset after last offset"));
            }
            let len = (b.last - b.first).saturating_add(1);
            if b.types.is_empty() || (b.types.len() != 1 && b.types.len() as i64 != len) {
                return Err(invalid("acknowledge types must be one or one per offset"));
            }
            if prev_last.is_some_and(|p| b.first <= p) {
                return Err(invalid("overlaps another batch"));
            }
            prev_last = Some(b.last);
        }
        for b in sorted {
            let first = b.first.max(self.start);
            if b.last < first {
                continue;
            }
            if b.last >= self.end {
                return Err(AckError::OutsideWindow {
                    offset: b.last.max(self.end),
                    end_offset: self.end,
                });
            }
            for (f, l, batch) in self.segments(first, b.last) {
                for o in f..=l {
                    let t = b.type_at(o);
                    match &batch.state {
                        RecordState::Acquired {
                            member: m,
                            deadline_ms,
                        } if m == member => {
                            if *deadline_ms <= now {
                                return Err(AckError::LockExpired { offset: o });
                            }
                        }
                        RecordState::Archived if t == AckType::Gap => {}
                        _ => {
                            return Err(AckError::NotAcquired {
                                offset: o,
                                member: member.to_string(),
                            })
                        }
                    }
                    if b.types.len() == 1 {
                        // Same type over the whole segment: one check is enough.
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    fn apply_ack(&mut self, first: Offset, last: Offset, t: AckType, limit: i16) {
        let mut archived = 0u64;
        let mut accepted = 0u64;
        self.set(first, last, |f, b| {
            if b.state == RecordState::Archived {
                return; // a GAP for an offset already known to have no record
            }
            let n = (b.last - f + 1) as u64;
            b.state = match t {
                AckType::Accept => {
                    accepted += n;
                    RecordState::Acknowledged
                }
                AckType::Release if b.delivery_count < limit => RecordState::Available,
                _ => {
                    archived += n;
                    RecordState::Archived
                }
            };
        });
        self.metrics.accepted += accepted;
        self.metrics.archived += archived;
    }

    fn expire(&mut self, now: i64) -> u64 {
        let n = self.release_where(
            |s| matches!(s, RecordState::Acquired { deadline_ms, .. } if *deadline_ms <= now),
        );
        if n > 0 {
            self.metrics.lock_expiries += n;
            let (lo, hi) = (self.start, self.end);
            self.coalesce(lo, hi);
            self.advance_start();
        }
        n
    }

    /// Makes the acquired batches matching `pred` available (or archived at the limit). Their
    /// durable state does not change: an acquired record is already written as it would be
    /// after its lock is gone.
    fn release_where(&mut self, pred: impl Fn(&RecordState) -> bool) -> u64 {
        let limit = self.config.delivery_count_limit;
        let mut n = 0u64;
        let mut archived = 0u64;
        for (&first, b) in self.batches.iter_mut() {
            if pred(&b.state) {
                let len = (b.last - first + 1) as u64;
                n += len;
                if b.delivery_count >= limit {
                    b.state = RecordState::Archived;
                    archived += len;
                } else {
                    b.state = RecordState::Available;
                }
            }
        }
        self.metrics.archived += archived;
        n
    }

    fn archive_available(&mut self, first: Offset, last: Offset) {
        let avail: Vec<(Offset, Offset)> = self
            .segments(first, last)
            .into_iter()
            .filter(|(_, _, b)| b.state == RecordState::Available)
            .map(|(f, l, _)| (f, l))
            .collect();
        for (f, l) in avail {
            self.metrics.archived += (l - f + 1) as u64;
            self.set(f, l, |_, b| b.state = RecordState::Archived);
        }
    }

    fn count_where(&self, pred: impl Fn(&RecordState) -> bool) -> u64 {
        self.batches
            .iter()
            .filter(|(_, b)| pred(&b.state))
            .map(|(&f, b)| (b.last - f + 1) as u64)
            .sum()
    }

    /// The parts of batches inside `first..=last`, clipped, with their batch.
    fn segments(&self, first: Offset, last: Offset) -> Vec<(Offset, Offset, Batch)> {
        let mut out = Vec::new();
        if first > last {
            return out;
        }
        let lo = self
            .batches
            .range(..=first)
            .next_back()
            .map(|(&f, _)| f)
            .unwrap_or(first);
        for (&f, b) in self.batches.range(lo..=last) {
            if b.last < first {
                continue;
            }
            out.push((f.max(first), b.last.min(last), b.clone()));
        }
        out
    }

    /// Makes `offset` the first offset of a batch if it lies inside one.
    fn split_at(&mut self, offset: Offset) {
        let Some((&f, b)) = self.batches.range_mut(..offset).next_back() else {
            return;
        };
        if b.last >= offset {
            let tail = Batch {
                last: b.last,
                state: b.state.clone(),
                delivery_count: b.delivery_count,
            };
            b.last = offset - 1;
            debug_assert!(f < offset);
            self.batches.insert(offset, tail);
        }
    }

    /// Applies `f` to every batch of `first..=last`, splitting batches at both ends.
    fn set(&mut self, first: Offset, last: Offset, mut f: impl FnMut(Offset, &mut Batch)) {
        self.mark(first, last);
        self.split_at(first);
        self.split_at(last + 1);
        for (&k, b) in self.batches.range_mut(first..=last) {
            f(k, b);
        }
    }

    /// Merges neighbouring batches in `lo..hi` (and at its edges) that are equal.
    fn coalesce(&mut self, lo: Offset, hi: Offset) {
        let from = self
            .batches
            .range(..=lo)
            .next_back()
            .map(|(&f, _)| f)
            .unwrap_or(lo);
        let keys: Vec<Offset> = self.batches.range(from..=hi).map(|(&f, _)| f).collect();
        let mut current: Option<Offset> = None;
        for k in keys {
            if let Some(c) = current {
                let (merge, next_last) = {
                    let a = &self.batches[&c];
                    let b = &self.batches[&k];
                    (
                        a.last + 1 == k
                            && a.state == b.state
                            && a.delivery_count == b.delivery_count,
                        b.last,
                    )
                };
                if merge {
                    self.batches.remove(&k);
                    if let Some(a) = self.batches.get_mut(&c) {
                        a.last = next_last;
                    }
                    continue;
                }
            }
            current = Some(k);
        }
    }

    /// Moves the start offset over the leading acknowledged and archived records.
    fn advance_start(&mut self) {
        while let Some(entry) = self.batches.first_entry() {
            if entry.get().state.is_done() {
                let b = entry.remove();
                self.start = b.last + 1;
            } else {
                break;
            }
        }
        if self.batches.is_empty() {
            self.start = self.start.max(self.end);
            self.end = self.start;
        }
    }

    /// Checks the storage invariants (tests).
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let mut expect = self.start;
        for (&f, b) in &self.batches {
            assert_eq!(f, expect, "batches must cover the window without holes");
            assert!(b.last >= f, "empty batch at {f}");
            expect = b.last + 1;
        }
        assert_eq!(expect, self.end, "batches must end at the end offset");
        if let Some((_, b)) = self.batches.first_key_value() {
            assert!(
                !b.state.is_done(),
                "start offset must pass completed records"
            );
        }
        let mut prev: Option<&Batch> = None;
        for b in self.batches.values() {
            if let Some(p) = prev {
                assert!(
                    !(p.state == b.state && p.delivery_count == b.delivery_count),
                    "equal neighbours must be merged"
                );
            }
            prev = Some(b);
        }
    }
}

/// Sorts, clips below `start` and merges overlapping or adjacent ranges.
fn normalize(fetched: &[RangeInclusive<Offset>], start: Offset) -> Vec<RangeInclusive<Offset>> {
    let mut v: Vec<(Offset, Offset)> = fetched
        .iter()
        .filter(|r| r.start() <= r.end() && *r.end() >= start)
        .map(|r| ((*r.start()).max(start), *r.end()))
        .collect();
    v.sort();
    let mut out: Vec<(Offset, Offset)> = Vec::new();
    for (f, l) in v {
        match out.last_mut() {
            Some((_, pl)) if f <= pl.saturating_add(1) => *pl = (*pl).max(l),
            _ => out.push((f, l)),
        }
    }
    out.into_iter().map(|(f, l)| f..=l).collect()
}

fn merge_ranges(mut v: Vec<AcquiredRange>) -> Vec<AcquiredRange> {
    v.sort_by_key(|r| r.first);
    let mut out: Vec<AcquiredRange> = Vec::new();
    for r in v {
        match out.last_mut() {
            Some(p) if p.last + 1 == r.first && p.delivery_count == r.delivery_count => {
                p.last = r.last
            }
            _ => out.push(r),
        }
    }
    out
}
