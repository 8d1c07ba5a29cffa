//! The transaction coordinator as a pure state machine: requests and the time go in; answers,
//! the records to write to `__transaction_state` and the markers to write to the
//! transaction's partitions come out.
//!
//! Changes are applied in memory when decided. The shell appends each returned [`Write`] and
//! answers the client only once it is durable; since one partition's records become durable in
//! order, an answer that waits for its own record also covers every earlier change. A
//! coordinator that loses its partition drops this state, and the next leader rebuilds it
//! from the log ([`TxnCoordinator::replay`]), so nothing undurable outlives a failover.

use std::collections::{BTreeSet, HashMap};

use spate_protocol::ResponseError;

use crate::state::{TxnMeta, TxnStatus};

/// Kafka's default `transaction.max.timeout.ms`: 15 minutes.
pub const DEFAULT_MAX_TIMEOUT_MS: i32 = 900_000;
/// Kafka's default `transactional.id.expiration.ms`: 7 days.
pub const DEFAULT_ID_EXPIRATION_MS: i64 = 604_800_000;

/// Longest transactional id: what a `__transaction_state` record key can hold.
pub const MAX_TXN_ID_BYTES: usize = i16::MAX as usize;

/// Errors are Kafka's own codes: the handlers answer them as they are.
pub type TxnError = ResponseError;

/// Coordinator settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnConfig {
    /// Largest `transaction.timeout.ms` a producer may ask for.
    pub max_timeout_ms: i32,
    /// Settled transactional ids idle this long are forgotten.
    pub id_expiration_ms: i64,
}

impl Default for TxnConfig {
    fn default() -> Self {
        Self {
            max_timeout_ms: DEFAULT_MAX_TIMEOUT_MS,
            id_expiration_ms: DEFAULT_ID_EXPIRATION_MS,
        }
    }
}

/// A record for `__transaction_state`: the id's new metadata, or `None` to forget it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The transactional id (the record key).
    pub txn_id: String,
    /// Its metadata (the value); `None` is a tombstone.
    pub meta: Option<TxnMeta>,
}

/// Markers to write to every partition of an ending transaction; once all are written the
/// shell calls [`TxnCoordinator::markers_written`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Markers {
    /// The transactional id.
    pub txn_id: String,
    /// Producer id the markers carry.
    pub producer_id: i64,
    /// Producer epoch the markers carry (bumped when the coordinator fenced the producer).
    pub producer_epoch: i16,
    /// Commit, or abort.
    pub commit: bool,
    /// Where to write them.
    pub partitions: Vec<(String, i32)>,
}

/// What InitProducerId decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitAnswer {
    /// Answer with this id and epoch once `write` is durable.
    Ready {
        /// Producer id.
        producer_id: i64,
        /// Producer epoch.
        producer_epoch: i16,
        /// The record to write.
        write: Write,
    },
    /// The id had an open transaction: it is being aborted under a bumped epoch (fencing its
    /// old producer). Answer CONCURRENT_TRANSACTIONS; the client retries.
    Aborting {
        /// The PrepareAbort record.
        write: Write,
        /// The abort markers to write.
        markers: Markers,
    },
}

/// What EndTxn decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Answer once `write` (PrepareCommit/PrepareAbort) is durable, then write `markers`.
    Prepared {
        /// The prepare record.
        write: Write,
        /// The markers.
        markers: Markers,
    },
    /// A retry of an EndTxn that already completed: answer success.
    AlreadyDone,
}

/// Every transactional id of the `__transaction_state` partitions this node leads.
#[derive(Debug, Default)]
pub struct TxnCoordinator {
    config: TxnConfig,
    txns: HashMap<String, TxnMeta>,
    /// The epoch each id had before its last InitProducerId, so a retried InitProducerId
    /// whose answer was lost is answered again instead of fenced (not persisted: after a
    /// failover such a retry is fenced, as the client then starts over).
    previous_epoch: HashMap<String, (i64, i16)>,
    /// The epoch each id's last EndTxn was sent with when it bumped the epoch
    /// (transaction.version 2): a retry of that request, under the epoch before the bump, is
    /// answered again rather than fenced (not persisted: after a failover it is fenced).
    ended_at: HashMap<String, i16>,
}

impl TxnCoordinator {
    /// An empty coordinator.
    pub fn new(config: TxnConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &TxnConfig {
        &self.config
    }

    /// Applies a record read back from `__transaction_state` (start, take-over).
    pub fn replay(&mut self, txn_id: String, meta: Option<TxnMeta>) {
        match meta {
            Some(m) if m.status != TxnStatus::Dead => {
                self.txns.insert(txn_id, m);
            }
            _ => {
                self.txns.remove(&txn_id);
            }
        }
    }

    /// Forgets the ids for which `of` holds (their partition moved to another node).
    pub fn forget(&mut self, of: impl Fn(&str) -> bool) {
        self.txns.retain(|id, _| !of(id));
        self.previous_epoch.retain(|id, _| !of(id));
        self.ended_at.retain(|id, _| !of(id));
    }

    /// Transactions whose markers were not all written when the log was last written:
    /// after a take-over the new coordinator writes them again, then completes them.
    pub fn in_flight(&self) -> Vec<Markers> {
        let mut out: Vec<Markers> = self
            .txns
            .iter()
            .filter(|(_, m)| m.status.is_preparing())
            .map(|(id, m)| markers_of(id, m))
            .collect();
        out.sort_by(|a, b| a.txn_id.cmp(&b.txn_id));
        out
    }

    /// One id's state.
    pub fn describe(&self, txn_id: &str) -> Option<&TxnMeta> {
        self.txns.get(txn_id)
    }

    /// Every id and its state, by id.
    pub fn list(&self) -> Vec<(&str, &TxnMeta)> {
        let mut out: Vec<(&str, &TxnMeta)> =
            self.txns.iter().map(|(id, m)| (id.as_str(), m)).collect();
        out.sort_by(|a, b| a.0.cmp(b.0));
        out
    }

    /// Transactions open now.
    pub fn open_count(&self) -> usize {
        self.txns
            .values()
            .filter(|m| m.status == TxnStatus::Ongoing)
            .count()
    }

    /// InitProducerId with a transactional id. `expected` is the producer id and epoch a
    /// KIP-360 client presents to keep its id; `allocate` reserves a new producer id.
    pub fn init_producer_id(
        &mut self,
        txn_id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
        now_ms: i64,
        allocate: &mut dyn FnMut() -> Result<i64, TxnError>,
    ) -> Result<InitAnswer, TxnError> {
        // Longer ids cannot be a `__transaction_state` record key (an i16-length string).
        if txn_id.is_empty() || txn_id.len() > MAX_TXN_ID_BYTES {
            return Err(ResponseError::InvalidRequest);
        }
        if timeout_ms <= 0 || timeout_ms > self.config.max_timeout_ms {
            return Err(ResponseError::InvalidTransactionTimeout);
        }
        let Some(m) = self.txns.get(txn_id).cloned() else {
            if expected.is_some() {
                // The client believes it holds an id this coordinator never gave this
                // transactional id.
                return Err(ResponseError::InvalidProducerIdMapping);
            }
            let meta = TxnMeta {
                producer_id: allocate()?,
                producer_epoch: 0,
                timeout_ms,
                status: TxnStatus::Empty,
                partitions: BTreeSet::new(),
                last_update_ms: now_ms,
                start_ms: -1,
            };
            return Ok(self.ready(txn_id, meta));
        };
        if m.status.is_preparing() {
            return Err(ResponseError::ConcurrentTransactions);
        }
        if let Some((pid, epoch)) = expected {
            let current = (m.producer_id, m.producer_epoch);
            if (pid, epoch) != current {
                // The answer to this very request may have been lost: answer it again.
                if self.previous_epoch.get(txn_id) == Some(&(pid, epoch))
                    && m.status == TxnStatus::Empty
                {
                    let write = Write {
                        txn_id: txn_id.to_string(),
                        meta: Some(m.clone()),
                    };
                    return Ok(InitAnswer::Ready {
                        producer_id: m.producer_id,
                        producer_epoch: m.producer_epoch,
                        write,
                    });
                }
                return Err(ResponseError::ProducerFenced);
            }
        }
        self.ended_at.remove(txn_id);
        if m.status == TxnStatus::Ongoing {
            let (write, markers) = self.abort_fencing(txn_id, m, now_ms);
            return Ok(InitAnswer::Aborting { write, markers });
        }
        self.previous_epoch
            .insert(txn_id.to_string(), (m.producer_id, m.producer_epoch));
        let (producer_id, producer_epoch) = match bumped(m.producer_epoch) {
            Some(e) => (m.producer_id, e),
            // The epoch is exhausted: a new producer id starts over at 0.
            None => (allocate()?, 0),
        };
        let meta = TxnMeta {
            producer_id,
            producer_epoch,
            timeout_ms,
            status: TxnStatus::Empty,
            partitions: BTreeSet::new(),
            last_update_ms: now_ms,
            start_ms: -1,
        };
        Ok(self.ready(txn_id, meta))
    }

    fn ready(&mut self, txn_id: &str, meta: TxnMeta) -> InitAnswer {
        let (producer_id, producer_epoch) = (meta.producer_id, meta.producer_epoch);
        let write = self.set(txn_id, meta);
        InitAnswer::Ready {
            producer_id,
            producer_epoch,
            write,
        }
    }

    /// Checks that `producer_id`/`epoch` is the current producer of `txn_id`.
    fn current(&self, txn_id: &str, producer_id: i64, epoch: i16) -> Result<&TxnMeta, TxnError> {
        let m = self
            .txns
            .get(txn_id)
            .ok_or(ResponseError::InvalidProducerIdMapping)?;
        if m.producer_id != producer_id {
            return Err(ResponseError::InvalidProducerIdMapping);
        }
        if m.producer_epoch != epoch {
            return Err(ResponseError::ProducerFenced);
        }
        Ok(m)
    }

    /// AddPartitionsToTxn (and AddOffsetsToTxn, with the group's offsets partition): opens the
    /// transaction or widens it. `None` when every partition was already in it (nothing to
    /// write).
    pub fn add_partitions(
        &mut self,
        txn_id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[(String, i32)],
        now_ms: i64,
    ) -> Result<Option<Write>, TxnError> {
        let m = self.current(txn_id, producer_id, epoch)?;
        if m.status.is_preparing() {
            return Err(ResponseError::ConcurrentTransactions);
        }
        if m.status == TxnStatus::Dead {
            return Err(ResponseError::InvalidTxnState);
        }
        if m.status == TxnStatus::Ongoing && partitions.iter().all(|p| m.partitions.contains(p)) {
            return Ok(None);
        }
        let mut next = m.clone();
        if next.status != TxnStatus::Ongoing {
            next.status = TxnStatus::Ongoing;
            next.partitions.clear();
            next.start_ms = now_ms;
        }
        next.partitions.extend(partitions.iter().cloned());
        next.last_update_ms = now_ms;
        Ok(Some(self.set(txn_id, next)))
    }

    /// KIP-890 verification: is `topic`/`partition` part of the open transaction of this
    /// producer? Partitions not added (or a stale producer) are refused, so nothing a producer
    /// writes outside its transaction can hang open.
    pub fn verify(
        &self,
        txn_id: &str,
        producer_id: i64,
        epoch: i16,
        topic: &str,
        partition: i32,
    ) -> Result<(), TxnError> {
        let m = self.current(txn_id, producer_id, epoch).map_err(|e| {
            if e == ResponseError::ProducerFenced {
                ResponseError::InvalidProducerEpoch
            } else {
                e
            }
        })?;
        let added = m.status == TxnStatus::Ongoing
            && m.partitions.contains(&(topic.to_string(), partition));
        if added {
            Ok(())
        } else {
            Err(ResponseError::InvalidTxnState)
        }
    }

    /// EndTxn: commit or abort the open transaction. With `bump` (EndTxn v5, KIP-890 part 2:
    /// transaction.version 2) the producer epoch goes up by one with every transaction: the
    /// markers carry the new epoch, fencing anything the producer still had in flight under
    /// the old one, and the answer tells the producer its new epoch.
    pub fn end_txn(
        &mut self,
        txn_id: &str,
        producer_id: i64,
        epoch: i16,
        commit: bool,
        now_ms: i64,
        bump: bool,
    ) -> Result<Ended, TxnError> {
        if bump && self.ended_at.get(txn_id) == Some(&epoch) {
            // A retry of the EndTxn that bumped the epoch (its answer was lost).
            let m = self
                .txns
                .get(txn_id)
                .ok_or(ResponseError::InvalidProducerIdMapping)?;
            if m.producer_id == producer_id && m.producer_epoch == epoch.saturating_add(1) {
                return match (m.status, commit) {
                    (TxnStatus::CompleteCommit, true) | (TxnStatus::CompleteAbort, false) => {
                        Ok(Ended::AlreadyDone)
                    }
                    (TxnStatus::PrepareCommit, true) | (TxnStatus::PrepareAbort, false) => {
                        Err(ResponseError::ConcurrentTransactions)
                    }
                    _ => Err(ResponseError::InvalidTxnState),
                };
            }
        }
        let m = self.current(txn_id, producer_id, epoch)?.clone();
        match (m.status, commit) {
            (TxnStatus::Ongoing, _) => {
                let mut next = m;
                if bump {
                    match bumped(next.producer_epoch) {
                        Some(e) => {
                            next.producer_epoch = e;
                            self.ended_at.insert(txn_id.to_string(), epoch);
                        }
                        // The epoch space is used up: the producer must start over with
                        // InitProducerId, which gives it a new producer id.
                        None => return Err(ResponseError::ProducerFenced),
                    }
                }
                next.status = if commit {
                    TxnStatus::PrepareCommit
                } else {
                    TxnStatus::PrepareAbort
                };
                next.last_update_ms = now_ms;
                let markers = markers_of(txn_id, &next);
                let write = self.set(txn_id, next);
                Ok(Ended::Prepared { write, markers })
            }
            (TxnStatus::PrepareCommit, true) | (TxnStatus::PrepareAbort, false) => {
                Err(ResponseError::ConcurrentTransactions)
            }
            (TxnStatus::CompleteCommit, true) | (TxnStatus::CompleteAbort, false) => {
                Ok(Ended::AlreadyDone)
            }
            _ => Err(ResponseError::InvalidTxnState),
        }
    }

    /// Every marker of `txn_id`'s ending transaction is written: completes it. `None` when
    /// the id moved on meanwhile (a duplicate completion).
    pub fn markers_written(
        &mut self,
        txn_id: &str,
        producer_id: i64,
        epoch: i16,
        now_ms: i64,
    ) -> Option<Write> {
        let m = self.txns.get(txn_id)?;
        if m.producer_id != producer_id || m.producer_epoch != epoch {
            return None;
        }
        let status = match m.status {
            TxnStatus::PrepareCommit => TxnStatus::CompleteCommit,
            TxnStatus::PrepareAbort | TxnStatus::PrepareEpochFence => TxnStatus::CompleteAbort,
            _ => return None,
        };
        let mut next = m.clone();
        next.status = status;
        next.partitions.clear();
        next.start_ms = -1;
        next.last_update_ms = now_ms;
        Some(self.set(txn_id, next))
    }

    /// Aborts transactions open past their timeout, fencing their producers (the epoch is
    /// bumped, so the zombie's next request fails), and forgets ids settled and idle past
    /// `transactional.id.expiration.ms`.
    pub fn expire(&mut self, now_ms: i64) -> (Vec<(Write, Markers)>, Vec<Write>) {
        let mut timed_out: Vec<(String, TxnMeta)> = self
            .txns
            .iter()
            .filter(|(_, m)| {
                m.open_for_ms(now_ms)
                    .is_some_and(|age| age > i64::from(m.timeout_ms))
            })
            .map(|(id, m)| (id.clone(), m.clone()))
            .collect();
        timed_out.sort_by(|a, b| a.0.cmp(&b.0));
        let aborts = timed_out
            .into_iter()
            .map(|(id, m)| self.abort_fencing(&id, m, now_ms))
            .collect();
        let mut idle: Vec<String> = self
            .txns
            .iter()
            .filter(|(_, m)| {
                m.status.is_settled()
                    && now_ms.saturating_sub(m.last_update_ms) >= self.config.id_expiration_ms
            })
            .map(|(id, _)| id.clone())
            .collect();
        idle.sort();
        let forgotten = idle
            .into_iter()
            .map(|id| {
                self.txns.remove(&id);
                self.previous_epoch.remove(&id);
                Write {
                    txn_id: id,
                    meta: None,
                }
            })
            .collect();
        (aborts, forgotten)
    }

    /// Aborts `m`'s open transaction under the next epoch.
    fn abort_fencing(&mut self, txn_id: &str, m: TxnMeta, now_ms: i64) -> (Write, Markers) {
        self.ended_at.remove(txn_id);
        let mut next = m;
        // At the last epoch the abort keeps it; the next InitProducerId moves to a new id.
        next.producer_epoch = bumped(next.producer_epoch).unwrap_or(next.producer_epoch);
        next.status = TxnStatus::PrepareAbort;
        next.last_update_ms = now_ms;
        let markers = markers_of(txn_id, &next);
        (self.set(txn_id, next), markers)
    }

    fn set(&mut self, txn_id: &str, meta: TxnMeta) -> Write {
        self.txns.insert(txn_id.to_string(), meta.clone());
        Write {
            txn_id: txn_id.to_string(),
            meta: Some(meta),
        }
    }
}

/// The next epoch, unless the epoch space is used up (Kafka keeps i16::MAX unused).
fn bumped(epoch: i16) -> Option<i16> {
    (epoch < i16::MAX - 1).then(|| epoch + 1)
}

fn markers_of(txn_id: &str, m: &TxnMeta) -> Markers {
    Markers {
        txn_id: txn_id.to_string(),
        producer_id: m.producer_id,
        producer_epoch: m.producer_epoch,
        commit: m.status == TxnStatus::PrepareCommit,
        partitions: m.partitions.iter().cloned().collect(),
    }
}

#[cfg(test)]
mod tests;
