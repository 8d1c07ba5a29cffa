//! One partition: its log, its producer states and its high watermark.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, Ordering};

use parking_lot::RwLock;
use spate_log::{Flusher, Log, LogConfig, LogError, ReadResult, TimestampLookup};
use spate_protocol::batch::BatchHeader;
use spate_protocol::ResponseError;
use tokio::sync::watch;

use crate::error::BrokerError;
use crate::producer_state::{ProducerStates, SequenceCheck};
use crate::time::now_ms;

struct State {
    log: Log,
    producers: ProducerStates,
}

/// What became of a produced batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Stored at these offsets.
    New {
        /// First offset.
        base_offset: i64,
        /// Last offset.
        last_offset: i64,
    },
    /// A retry of a batch stored earlier at `base_offset`.
    Duplicate {
        /// Where the original landed.
        base_offset: i64,
        /// The original's last offset.
        last_offset: i64,
    },
}

/// Producer states as of some offset, next to the partition's segments.
const SNAPSHOT_FILE: &str = "producer_state.snapshot";

/// A partition of a topic, led by this broker.
pub struct Partition {
    /// Partition index within the topic.
    pub index: i32,
    snapshot_path: PathBuf,
    snapshot_offset: AtomicI64,
    state: RwLock<State>,
    high_watermark: watch::Sender<i64>,
    leader_epoch: AtomicI32,
    deleted: AtomicBool,
}

impl Partition {
    /// Opens the partition's log in `dir` and rebuilds producer state: from the snapshot
    /// written at the last retention pass or clean shutdown when there is a sound one, plus
    /// the batches after it; from every batch otherwise.
    pub fn open(
        dir: &Path,
        index: i32,
        config: LogConfig,
        flusher: Flusher,
    ) -> Result<(Self, Vec<String>), BrokerError> {
        let (log, mut notes) = Log::open(dir, config, flusher, now_ms())?;
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        let (from, mut producers) = match std::fs::read(&snapshot_path) {
            Ok(bytes) => match ProducerStates::from_snapshot(&bytes) {
                Ok((offset, states)) if offset <= log.end_offset() => (offset, states),
                Ok(_) => {
                    notes.push(
                        "producer state snapshot is ahead of the log; rebuilt from the log".into(),
                    );
                    (log.start_offset(), ProducerStates::default())
                }
                Err(e) => {
                    notes.push(format!(
                        "producer state snapshot unreadable ({e:?}); rebuilt from the log"
                    ));
                    (log.start_offset(), ProducerStates::default())
                }
            },
            Err(_) => (log.start_offset(), ProducerStates::default()),
        };
        log.for_each_batch(from.max(log.start_offset()), |h| {
            if h.has_producer_id() && !h.is_control() && h.last_offset() >= from {
                producers.record(
                    h.producer_id,
                    h.producer_epoch,
                    h.base_sequence,
                    h.last_sequence(),
                    h.base_offset,
                    h.last_offset(),
                );
            }
        })?;
        let end = log.end_offset();
        Ok((
            Self {
                index,
                snapshot_path,
                snapshot_offset: AtomicI64::new(from),
                state: RwLock::new(State { log, producers }),
                high_watermark: watch::Sender::new(end),
                leader_epoch: AtomicI32::new(0),
                deleted: AtomicBool::new(false),
            },
            notes,
        ))
    }

    /// Saves the producer states so the next start need not read the whole log to rebuild
    /// them. Does nothing when nothing was appended since the last snapshot.
    pub fn write_producer_snapshot(&self) -> Result<(), BrokerError> {
        let (offset, bytes) = {
            let st = self.state.read();
            let offset = st.log.end_offset();
            if offset == self.snapshot_offset.load(Ordering::Relaxed)
                || self.deleted.load(Ordering::SeqCst)
            {
                return Ok(());
            }
            (offset, st.producers.snapshot(offset))
        };
        crate::registry::write_atomically(&self.snapshot_path, &bytes)?;
        self.snapshot_offset.store(offset, Ordering::Relaxed);
        Ok(())
    }

    /// The leader epoch stamped on appended batches.
    pub fn leader_epoch(&self) -> i32 {
        self.leader_epoch.load(Ordering::Relaxed)
    }

    /// Offset below which records are visible to consumers.
    pub fn high_watermark(&self) -> i64 {
        *self.high_watermark.borrow()
    }

    /// Subscribes to high-watermark changes, for long-poll fetches.
    pub fn watch_high_watermark(&self) -> watch::Receiver<i64> {
        self.high_watermark.subscribe()
    }

    /// First offset still stored.
    pub fn log_start_offset(&self) -> i64 {
        self.state.read().log.start_offset()
    }

    /// Offset the next record gets.
    pub fn log_end_offset(&self) -> i64 {
        self.state.read().log.end_offset()
    }

    /// Bytes stored.
    pub fn size_bytes(&self) -> u64 {
        self.state.read().log.size_bytes()
    }

    /// Subscribes to the offset below which data is on disk.
    pub fn durable_offset(&self) -> watch::Receiver<i64> {
        self.state.read().log.durable_offset()
    }

    /// Marks the partition deleted: later appends are refused.
    pub fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::SeqCst);
    }

    /// Appends a validated batch, applying idempotent-producer checks atomically with the
    /// write.
    pub fn append(
        &self,
        batch: &[u8],
        h: &BatchHeader,
        log_append_time: Option<i64>,
    ) -> Result<Appended, AppendError> {
        let mut st = self.state.write();
        if self.deleted.load(Ordering::SeqCst) {
            return Err(AppendError::Refused(ResponseError::UnknownTopicOrPartition));
        }
        let idempotent = h.has_producer_id();
        if idempotent {
            match st.producers.check(
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.last_sequence(),
            ) {
                SequenceCheck::Append => {}
                SequenceCheck::Duplicate {
                    base_offset,
                    last_offset,
                } => {
                    return Ok(Appended::Duplicate {
                        base_offset,
                        last_offset,
                    })
                }
                SequenceCheck::Reject(e) => return Err(AppendError::Refused(e)),
            }
        }
        let info = st
            .log
            .append(batch, self.leader_epoch(), log_append_time, now_ms())
            .map_err(AppendError::Storage)?;
        if idempotent {
            st.producers.record(
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.last_sequence(),
                info.base_offset,
                info.last_offset,
            );
        }
        // Standalone: the leader is the whole ISR, so everything written is committed.
        self.high_watermark.send_replace(info.last_offset + 1);
        Ok(Appended::New {
            base_offset: info.base_offset,
            last_offset: info.last_offset,
        })
    }

    /// Reads whole batches from `offset`, stopping at the high watermark.
    pub fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
    ) -> Result<ReadResult, LogError> {
        let hw = self.high_watermark();
        self.state.read().log.read(offset, max_bytes, hw, min_one)
    }

    /// ListOffsets by timestamp.
    pub fn offset_for_timestamp(&self, ts: i64) -> Result<Option<TimestampLookup>, LogError> {
        self.state.read().log.offset_for_timestamp(ts)
    }

    /// ListOffsets MAX_TIMESTAMP.
    pub fn max_timestamp(&self) -> Result<Option<TimestampLookup>, LogError> {
        self.state.read().log.max_timestamp()
    }

    /// Saves the log for a clean shutdown (see `Log::close`).
    pub fn close(&self) -> Result<(), LogError> {
        self.state.write().log.close()
    }

    /// Applies new topic settings.
    pub fn set_log_config(&self, config: LogConfig) {
        self.state.write().log.set_config(config);
    }

    /// Deletes segments past retention; returns how many.
    pub fn enforce_retention(&self) -> Result<usize, LogError> {
        self.state.write().log.enforce_retention(now_ms())
    }
}

/// A produce that could not be stored.
#[derive(Debug)]
pub enum AppendError {
    /// Refused with a Kafka error (sequence, epoch, deleted topic).
    Refused(ResponseError),
    /// The disk failed.
    Storage(LogError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_log::FsyncPolicy;
    use spate_protocol::batch::{build, validate, NewRecord, ProducerFields};
    use spate_protocol::records::Compression;

    fn idempotent(first_seq: i32, n: i32) -> Vec<u8> {
        let records: Vec<NewRecord> = (0..n)
            .map(|_| NewRecord {
                value: Some(bytes::Bytes::from_static(b"v")),
                ..NewRecord::default()
            })
            .collect();
        let producer = ProducerFields {
            id: 9,
            epoch: 0,
            base_sequence: first_seq,
        };
        build(&records, Some(producer), Compression::None)
            .unwrap()
            .to_vec()
    }

    fn append(p: &Partition, b: &[u8]) -> Result<Appended, AppendError> {
        p.append(b, &validate(b).unwrap(), None)
    }

    fn open(dir: &Path) -> (Partition, Vec<String>) {
        Partition::open(
            dir,
            0,
            LogConfig::default(),
            Flusher::start(FsyncPolicy::Never),
        )
        .unwrap()
    }

    #[test]
    fn producer_state_survives_reopen_through_the_snapshot_and_the_tail_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = open(dir.path());
        assert!(matches!(
            append(&p, &idempotent(0, 3)),
            Ok(Appended::New { base_offset: 0, .. })
        ));
        p.write_producer_snapshot().unwrap();
        assert!(matches!(
            append(&p, &idempotent(3, 2)),
            Ok(Appended::New { base_offset: 3, .. })
        ));
        drop(p);
        let (p, notes) = open(dir.path());
        assert!(notes.is_empty(), "{notes:?}");
        // The batch after the snapshot was found in the log...
        assert!(matches!(
            append(&p, &idempotent(3, 2)),
            Ok(Appended::Duplicate {
                base_offset: 3,
                last_offset: 4
            })
        ));
        // ...the one before it came from the snapshot...
        assert!(matches!(
            append(&p, &idempotent(0, 3)),
            Ok(Appended::Duplicate { base_offset: 0, .. })
        ));
        // ...and a gap is still refused.
        assert!(matches!(
            append(&p, &idempotent(9, 1)),
            Err(AppendError::Refused(
                ResponseError::OutOfOrderSequenceNumber
            ))
        ));
    }

    #[test]
    fn a_damaged_snapshot_is_ignored_and_the_log_rebuilds_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = open(dir.path());
        append(&p, &idempotent(0, 3)).unwrap();
        p.write_producer_snapshot().unwrap();
        drop(p);
        let snap = dir.path().join(SNAPSHOT_FILE);
        let mut bytes = std::fs::read(&snap).unwrap();
        bytes[5] ^= 0xff;
        std::fs::write(&snap, bytes).unwrap();
        let (p, notes) = open(dir.path());
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(matches!(
            append(&p, &idempotent(0, 3)),
            Ok(Appended::Duplicate { base_offset: 0, .. })
        ));
    }
}
