//! What the checker sees of one broker's real partition log: its records decoded from the
//! batches on the simulated disk. The view follows the log incrementally (new batches are
//! read as they appear, a shorter log cuts the view) and is rebuilt from the disk after a
//! restart; `verify` re-reads everything to prove the view never drifted from the log.

use bytes::Bytes;
use spate_broker::partition::Partition;
use spate_log::Durability;
use spate_protocol::batch::{BatchHeader, Batches};

/// One record: the producer's payload id at an offset, written in a leader epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub offset: i64,
    pub epoch: i32,
    pub payload: u64,
}

/// The payload id travels as the create timestamp of the batch's only record, so it can be
/// read from the batch header without decoding records.
pub fn record_of(h: &BatchHeader) -> Record {
    Record {
        offset: h.base_offset,
        epoch: h.partition_leader_epoch,
        payload: h.base_timestamp as u64,
    }
}

/// The payload a commit marker stands for in the views (markers carry no payload id).
pub const MARKER_COMMIT: u64 = u64::MAX;
/// The payload an abort marker stands for.
pub const MARKER_ABORT: u64 = u64::MAX - 1;

/// Whether a payload is a transaction marker's.
pub fn is_marker(payload: u64) -> bool {
    payload >= MARKER_ABORT
}

/// Decodes the whole batches of a read; a transaction marker reads as [`MARKER_COMMIT`] or
/// [`MARKER_ABORT`] (its timestamp is the wall clock's, not a payload id).
pub fn decode(bytes: &Bytes) -> Vec<Record> {
    Batches::new(bytes)
        .map(|(pos, h)| {
            let mut r = record_of(&h);
            if h.is_control() {
                r.payload = match spate_protocol::batch::control_record(&bytes[pos..]) {
                    Some(m) if m.kind == spate_protocol::batch::ControlKind::Commit => {
                        MARKER_COMMIT
                    }
                    _ => MARKER_ABORT,
                };
            }
            r
        })
        .collect()
}

/// How far the log is on disk, from the flusher's own record (not from the replica code the
/// simulation tests); nothing after a failed fsync.
fn synced_end(p: &Partition) -> i64 {
    match *p.durable_offset().borrow() {
        Durability::Synced(o) => o,
        Durability::Failed => 0,
    }
}

/// Reads every record of `p` from `from` to its log end.
fn read_from(p: &Partition, from: i64) -> Result<Vec<Record>, String> {
    let mut out = Vec::new();
    let mut at = from;
    let end = p.log_end_offset();
    while at < end {
        let read = p
            .read_replica(at, 64 * 1024, true)
            .map_err(|e| format!("read at {at}: {e}"))?;
        let recs = decode(&read.records);
        let Some(last) = recs.last() else {
            return Err(format!(
                "read at {at} below the log end {end} returned nothing"
            ));
        };
        at = last.offset + 1;
        out.extend(recs);
    }
    Ok(out)
}

#[derive(Clone, Debug, Default)]
pub struct ReplicaView {
    records: Vec<Record>,
    /// Records that survive a power loss, as of the last refresh.
    synced: i64,
    /// Lowest index changed by a truncation since the checker last looked, so the checker
    /// re-verifies only what may have changed.
    low_mark: usize,
}

impl ReplicaView {
    pub fn end(&self) -> i64 {
        self.records.len() as i64
    }

    pub fn synced_end(&self) -> i64 {
        self.synced
    }

    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// Follows `p` after an event: a shorter log cuts the view, new batches are appended.
    pub fn refresh(&mut self, p: &Partition) -> Result<(), String> {
        let end = p.log_end_offset();
        if end < self.end() {
            self.records
                .truncate(usize::try_from(end.max(0)).unwrap_or(0));
            self.low_mark = self.low_mark.min(self.records.len());
        }
        if end > self.end() {
            let from = self.end();
            let new = read_from(p, from)?;
            for (i, r) in new.iter().enumerate() {
                if r.offset != from + i as i64 {
                    return Err(format!(
                        "record {r:?} read where offset {} was due",
                        from + i as i64
                    ));
                }
            }
            self.records.extend(new);
        }
        self.synced = synced_end(p).min(self.end());
        Ok(())
    }

    /// Rebuilds the view from the disk (after a restart: the log may have lost its tail).
    pub fn rebuild(&mut self, p: &Partition) -> Result<(), String> {
        let fresh = read_from(p, p.log_start_offset())?;
        let common = self
            .records
            .iter()
            .zip(&fresh)
            .take_while(|(a, b)| a == b)
            .count();
        self.low_mark = self.low_mark.min(common);
        self.records = fresh;
        self.synced = synced_end(p).min(self.end());
        Ok(())
    }

    /// Re-reads the whole log and compares it with the view.
    pub fn verify(&self, p: &Partition) -> Result<(), String> {
        let fresh = read_from(p, p.log_start_offset())?;
        if fresh != self.records {
            return Err(format!(
                "the view of the log drifted: {} records read, {} in the view",
                fresh.len(),
                self.records.len()
            ));
        }
        Ok(())
    }

    /// The lowest index truncated since the last call (the log length when none was).
    pub fn take_low_mark(&mut self) -> usize {
        let m = self.low_mark;
        self.low_mark = self.records.len();
        m
    }
}
