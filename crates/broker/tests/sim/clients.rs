//! One sequential acks=all producer and one consumer, both finding the leader through the
//! (delayed) images they receive, as clients do through Metadata requests.

use std::collections::BTreeMap;
use std::rc::Rc;

use spate_cluster::metadata::{BrokerId, MetadataImage};

use super::log::{is_marker, Record};
use super::net::{KafkaError, Msg, Out, Timer, Write};
use super::*;

fn leader_of(image: &Option<Rc<MetadataImage>>) -> Option<BrokerId> {
    image
        .as_ref()
        .and_then(|i| i.partition(TOPIC, 0))
        .and_then(|p| p.leader)
}

#[derive(Default)]
pub struct Producer {
    image: Option<Rc<MetadataImage>>,
    version: u64,
    next_payload: u64,
    next_req: u64,
    /// (request, payload): one produce at a time, so acknowledgements come in send order.
    inflight: Option<(u64, u64)>,
    pub producing: bool,
    /// (payload, offset) in acknowledgement order.
    pub acked: Vec<(u64, i64)>,
    pub errors: BTreeMap<String, u64>,
    /// Every payload id handed to some leader (acknowledged or not).
    pub sent: u64,
    /// Transactional mode: every payload is written inside a transaction.
    pub txn: Option<Txn>,
}

/// The transactional producer and its coordinator, in one: a transaction of one to three
/// records, written one at a time with acks=all, then a marker the coordinator writes until
/// the partition's leader acknowledges it. The decision is the coordinator's durable state
/// (it survives the coordinator's failover); a marker that goes unanswered is sent again by
/// the next coordinator, under the next coordinator epoch, while the old one's may still be
/// on its way. A write that fails aborts the transaction under the next producer epoch, so a
/// record still in flight is fenced instead of opening a transaction nobody ends.
#[derive(Default)]
pub struct Txn {
    epoch: i16,
    seq: i32,
    /// Records left to write in the open transaction (0: none open).
    left: u32,
    /// Acknowledged records of the open transaction.
    payloads: Vec<u64>,
    /// The decision whose marker is being written: (commit, marker epoch).
    deciding: Option<(bool, i16)>,
    coordinator_epoch: i32,
    count: u64,
    /// Decided transactions, in decision order: (acknowledged payloads, committed).
    pub decided: Vec<(Vec<u64>, bool)>,
    /// Transactions the coordinator aborted, whatever the marker's fate so far.
    pub aborting: Vec<Vec<u64>>,
    /// Coordinator failovers (a marker sent again under a new coordinator epoch).
    pub failovers: u64,
}

impl Txn {
    /// Whether nothing is left to write: no record of an open transaction, no marker.
    pub fn is_done(&self) -> bool {
        self.deciding.is_none() && self.left == 0
    }

    fn decide(&mut self, commit: bool, fence: bool) {
        let marker_epoch = if fence { self.epoch + 1 } else { self.epoch };
        if !commit {
            self.aborting.push(self.payloads.clone());
        }
        self.deciding = Some((commit, marker_epoch));
        self.left = 0;
    }
}

impl Producer {
    pub fn start(&mut self, out: &mut Out) {
        self.producing = true;
        out.timer(5, Timer::ProduceNext);
    }

    pub fn is_idle(&self) -> bool {
        self.inflight.is_none()
    }

    pub fn error_count(&self, e: KafkaError) -> u64 {
        self.errors.get(&format!("{e:?}")).copied().unwrap_or(0)
    }

    pub fn handle(&mut self, msg: Msg, out: &mut Out, next_delay_ms: u64) {
        match msg {
            Msg::Image { version, image } if version > self.version => {
                self.version = version;
                self.image = Some(image);
            }
            Msg::ProduceResult { req, result } => {
                let Some((r, payload)) = self.inflight else {
                    return;
                };
                if r != req {
                    return;
                }
                self.inflight = None;
                if let Some(t) = self.txn.as_mut() {
                    txn_result(t, payload, result, out, &mut self.acked, &mut self.errors);
                    out.timer(next_delay_ms, Timer::ProduceNext);
                    return;
                }
                match result {
                    Ok(offset) => {
                        self.acked.push((payload, offset));
                        out.acked.push((payload, offset));
                    }
                    Err(e) => *self.errors.entry(format!("{e:?}")).or_default() += 1,
                }
                out.timer(next_delay_ms, Timer::ProduceNext);
            }
            _ => {}
        }
    }

    pub fn timer(&mut self, timer: Timer, out: &mut Out) {
        match timer {
            Timer::ProduceNext => {
                // Once producing stops, an open transaction is aborted; a decided
                // transaction's marker is written even then.
                if let Some(t) = self.txn.as_mut() {
                    if !self.producing
                        && self.inflight.is_none()
                        && t.deciding.is_none()
                        && t.left > 0
                    {
                        t.decide(false, true);
                    }
                }
                let marker_due = self.txn.as_ref().is_some_and(|t| t.deciding.is_some());
                if (!self.producing && !marker_due) || self.inflight.is_some() {
                    return;
                }
                let Some(leader) = leader_of(&self.image) else {
                    out.timer(20, Timer::ProduceNext);
                    return;
                };
                self.next_req += 1;
                let req = self.next_req;
                let (payload, write) = match self.txn.as_mut() {
                    None => {
                        self.next_payload += 1;
                        (self.next_payload, Write::Plain)
                    }
                    Some(t) => match t.deciding {
                        Some((commit, epoch)) => (
                            0,
                            Write::Marker {
                                epoch,
                                commit,
                                coordinator_epoch: t.coordinator_epoch,
                            },
                        ),
                        None => {
                            if t.left == 0 {
                                t.left = 1 + (t.count % 3) as u32;
                                t.payloads.clear();
                            }
                            self.next_payload += 1;
                            let write = Write::TxnData {
                                epoch: t.epoch,
                                seq: t.seq,
                            };
                            (self.next_payload, write)
                        }
                    },
                };
                if payload != 0 {
                    self.sent += 1;
                }
                // A payload is sent once and never retried, so it can be in a log only once.
                self.inflight = Some((req, payload));
                out.send(
                    leader,
                    None,
                    Msg::Produce {
                        req,
                        payload,
                        write,
                    },
                );
                out.timer(PRODUCER_TIMEOUT_MS, Timer::ProduceTimeout { req });
            }
            Timer::ProduceTimeout { req } if self.inflight.is_some_and(|(r, _)| r == req) => {
                let payload = self.inflight.map_or(0, |(_, p)| p);
                self.inflight = None;
                *self.errors.entry("ClientTimeout".to_owned()).or_default() += 1;
                if let Some(t) = self.txn.as_mut() {
                    if payload == 0 {
                        // The marker went unanswered: the coordinator fails over and the next
                        // one writes it again under its own epoch.
                        t.coordinator_epoch += 1;
                        t.failovers += 1;
                    } else {
                        t.decide(false, true);
                    }
                }
                out.timer(1, Timer::ProduceNext);
            }
            _ => {}
        }
    }
}

/// The transactional producer's view of a produce answer.
fn txn_result(
    t: &mut Txn,
    payload: u64,
    result: Result<i64, KafkaError>,
    out: &mut Out,
    acked: &mut Vec<(u64, i64)>,
    errors: &mut BTreeMap<String, u64>,
) {
    if let Err(e) = &result {
        *errors.entry(format!("{e:?}")).or_default() += 1;
    }
    if payload == 0 {
        // The marker: written and committed ends the transaction; refused as stale (an older
        // coordinator's, or a fencing one already written) too, as the coordinator learns
        // the partition moved on; anything else is written again.
        match result {
            Ok(_)
            | Err(KafkaError::InvalidProducerEpoch)
            | Err(KafkaError::TransactionCoordinatorFenced) => {
                if let Some((commit, epoch)) = t.deciding.take() {
                    t.decided.push((std::mem::take(&mut t.payloads), commit));
                    t.epoch = epoch + 1;
                    t.seq = 0;
                    t.count += 1;
                }
            }
            Err(_) => {}
        }
        return;
    }
    match result {
        Ok(offset) => {
            acked.push((payload, offset));
            out.acked.push((payload, offset));
            t.payloads.push(payload);
            t.seq += 1;
            t.left = t.left.saturating_sub(1);
            if t.left == 0 {
                // Every fourth transaction is aborted by its producer.
                t.decide(t.count % 4 != 3, false);
            }
        }
        Err(_) => t.decide(false, true),
    }
}

#[derive(Default)]
pub struct Consumer {
    image: Option<Rc<MetadataImage>>,
    version: u64,
    next_req: u64,
    outstanding: Option<u64>,
    pub consumed: Vec<Record>,
    /// read_committed: reads up to the last stable offset and drops markers and the records
    /// of aborted transactions, as clients do.
    pub committed: bool,
    /// The next offset to read (read_committed skips offsets).
    position: i64,
    /// Payloads a read_committed consumer kept, in order.
    pub kept: Vec<u64>,
}

impl Consumer {
    /// A read_committed consumer.
    pub fn read_committed() -> Self {
        Consumer {
            committed: true,
            ..Consumer::default()
        }
    }

    /// The next offset it reads.
    pub fn position(&self) -> i64 {
        if self.committed {
            self.position
        } else {
            self.consumed.len() as i64
        }
    }
}

impl Consumer {
    pub fn start(&mut self, out: &mut Out) {
        out.timer(CONSUMER_POLL_MS, Timer::ConsumerPoll);
    }

    pub fn handle(&mut self, msg: Msg, out: &mut Out) {
        match msg {
            Msg::Image { version, image } if version > self.version => {
                self.version = version;
                self.image = Some(image);
            }
            Msg::ConsumerFetchResult {
                req,
                records,
                aborted,
            } => {
                if self.outstanding != Some(req) {
                    return;
                }
                self.outstanding = None;
                if self.committed {
                    if records.first().is_some_and(|r| r.offset == self.position) {
                        for r in &records {
                            self.position = r.offset + 1;
                            let dropped = is_marker(r.payload)
                                || aborted
                                    .iter()
                                    .any(|(first, last)| (*first..*last).contains(&r.offset));
                            if !dropped {
                                self.kept.push(r.payload);
                            }
                        }
                        out.consumed.extend(records.iter().copied());
                        self.consumed.extend(records);
                    }
                    return;
                }
                let position = self.consumed.len() as i64;
                if records.first().is_some_and(|r| r.offset == position) {
                    out.consumed.extend(records.iter().copied());
                    self.consumed.extend(records);
                }
            }
            _ => {}
        }
    }

    pub fn timer(&mut self, timer: Timer, out: &mut Out) {
        if timer != Timer::ConsumerPoll {
            return;
        }
        if let Some(leader) = leader_of(&self.image) {
            self.next_req += 1;
            self.outstanding = Some(self.next_req);
            out.send(
                leader,
                None,
                Msg::ConsumerFetch {
                    req: self.next_req,
                    offset: self.position(),
                    committed: self.committed,
                },
            );
        }
        out.timer(CONSUMER_POLL_MS, Timer::ConsumerPoll);
    }
}
