//! One broker's copy of the partition: records, the leader-epoch cache (Kafka's
//! leader-epoch-checkpoint) and how much of it is on disk.

/// One record: the producer's payload id at an offset, written in a leader epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub offset: i64,
    pub epoch: i32,
    pub payload: u64,
}

#[derive(Clone, Debug, Default)]
pub struct SimLog {
    records: Vec<Record>,
    /// (epoch, start offset), both strictly increasing.
    epochs: Vec<(i32, i64)>,
    /// Records that survive a power loss.
    synced: usize,
    /// Lowest index changed by a truncation since the checker last looked, so the checker
    /// re-verifies only what may have changed.
    low_mark: usize,
}

impl SimLog {
    pub fn end(&self) -> i64 {
        self.records.len() as i64
    }

    pub fn synced_end(&self) -> i64 {
        self.synced as i64
    }

    pub fn records(&self) -> &[Record] {
        &self.records
    }

    pub fn epochs(&self) -> &[(i32, i64)] {
        &self.epochs
    }

    /// The leader appends a client record in its epoch.
    pub fn append(&mut self, epoch: i32, payload: u64) -> Result<i64, String> {
        let offset = self.end();
        self.push(Record {
            offset,
            epoch,
            payload,
        })?;
        Ok(offset)
    }

    /// A follower appends a record fetched from its leader, keeping offset and epoch.
    pub fn append_replicated(&mut self, rec: Record) -> Result<(), String> {
        if rec.offset != self.end() {
            return Err(format!(
                "replicated record at {} appended at log end {}",
                rec.offset,
                self.end()
            ));
        }
        self.push(rec)
    }

    fn push(&mut self, rec: Record) -> Result<(), String> {
        match self.epochs.last() {
            Some(&(e, _)) if e > rec.epoch => {
                return Err(format!(
                    "record {rec:?} has an older epoch than the epoch cache's latest {e}"
                ))
            }
            Some(&(e, _)) if e == rec.epoch => {}
            _ => self.assign_epoch(rec.epoch, rec.offset),
        }
        self.records.push(rec);
        Ok(())
    }

    /// Starts `epoch` at `start` (a new leader does this when it takes the epoch). Epochs
    /// that held no record are replaced, as Kafka's cache does.
    pub fn assign_epoch(&mut self, epoch: i32, start: i64) {
        if self.epochs.last().is_some_and(|&(e, _)| e >= epoch) {
            return;
        }
        self.epochs.retain(|&(_, s)| s < start);
        self.epochs.push((epoch, start));
    }

    pub fn latest_epoch(&self) -> Option<i32> {
        self.epochs.last().map(|&(e, _)| e)
    }

    /// The largest epoch at most `epoch` and the offset where it ends here (the log end for
    /// the latest): what OffsetForLeaderEpoch answers.
    pub fn end_offset_for(&self, epoch: i32) -> Option<(i32, i64)> {
        let i = self.epochs.iter().rposition(|&(e, _)| e <= epoch)?;
        let end = self.epochs.get(i + 1).map_or(self.end(), |&(_, s)| s);
        Some((self.epochs[i].0, end))
    }

    pub fn first_epoch_start(&self) -> i64 {
        self.epochs.first().map_or(self.end(), |&(_, s)| s)
    }

    /// Drops every record at or after `cut`, with the epochs that start there.
    pub fn truncate(&mut self, cut: i64) {
        let cut = usize::try_from(cut.max(0)).unwrap_or(0);
        if cut < self.records.len() {
            self.records.truncate(cut);
            self.low_mark = self.low_mark.min(cut);
        }
        self.synced = self.synced.min(self.records.len());
        self.epochs.retain(|&(_, s)| s < cut as i64);
    }

    pub fn sync(&mut self) {
        self.synced = self.records.len();
    }

    /// Power loss: the unsynced tail is gone except `keep` of its first records (written back
    /// by the page cache before the lights went out).
    pub fn power_loss(&mut self, keep: usize) {
        let survive = (self.synced + keep).min(self.records.len());
        self.truncate(survive as i64);
        self.synced = survive;
        self.reload();
    }

    /// A restart rebuilds the epoch cache from the records on disk (the checkpoint of an
    /// epoch that never got a record may be lost; nothing depends on it).
    pub fn reload(&mut self) {
        self.epochs.clear();
        for r in &self.records {
            if self.epochs.last().is_none_or(|&(e, _)| e < r.epoch) {
                self.epochs.push((r.epoch, r.offset));
            }
        }
    }

    /// The lowest index truncated since the last call (the log length when none was).
    pub fn take_low_mark(&mut self) -> usize {
        let m = self.low_mark;
        self.low_mark = self.records.len();
        m
    }
}
