//! The invariants, checked after every event. Checks are incremental (each broker's log is
//! re-verified only from where a truncation last changed it) so thousands of events per seed
//! stay cheap in debug builds.

use std::collections::{BTreeMap, HashMap};

use spate_cluster::metadata::BrokerId;

use super::broker::Broker;
use super::controller::Controller;
use super::log::Record;
use super::*;

#[derive(Default)]
pub struct Checker {
    /// The committed history: the longest prefix any broker ever exposed below a high
    /// watermark. Every later exposure must agree with it, and it never shrinks.
    pub committed: Vec<Record>,
    /// (offset, epoch) -> payload over every log ever: one leader per epoch appends each
    /// offset once, so a second payload at the same place means two writers.
    by_position: HashMap<(i64, i32), u64>,
    /// Per broker: how many leading records are known equal to `committed`.
    verified: BTreeMap<BrokerId, usize>,
    /// Per broker: how many leading records went through `by_position`.
    matched: BTreeMap<BrokerId, usize>,
    /// Per broker: (process, leader epoch, high watermark) it last exposed as leader.
    exposed: BTreeMap<BrokerId, (u64, i32, i64)>,
    pub acked: Vec<(u64, i64)>,
    pub consumed: Vec<Record>,
}

impl Checker {
    /// A client record appended by `broker` in `epoch` (invariant 2).
    pub fn on_append(
        &mut self,
        broker: BrokerId,
        epoch: i32,
        controller: &Controller,
    ) -> Result<(), String> {
        match controller.epoch_leaders.get(&epoch) {
            Some(Some(l)) if *l == broker => Ok(()),
            other => Err(format!(
                "broker {broker} appended a client record in epoch {epoch}, which the controller gave to {other:?}"
            )),
        }
    }

    pub fn on_acked(&mut self, payload: u64, offset: i64) -> Result<(), String> {
        self.acked.push((payload, offset));
        match self.committed.get(offset as usize) {
            Some(r) if r.payload == payload => Ok(()),
            other => Err(format!(
                "payload {payload} acknowledged at offset {offset}, committed history has {other:?} (committed length {})",
                self.committed.len()
            )),
        }
    }

    pub fn on_consumed(&mut self, rec: Record) -> Result<(), String> {
        self.consumed.push(rec);
        match self.committed.get(rec.offset as usize) {
            Some(r) if *r == rec => Ok(()),
            other => Err(format!(
                "consumer read {rec:?}, committed history has {other:?}"
            )),
        }
    }

    /// Checks `log[..upto]` of `b` against the committed history, extending the history
    /// when `extend` (the broker exposes that prefix below its high watermark).
    fn verify_prefix(&mut self, b: &Broker, upto: usize, extend: bool) -> Result<(), String> {
        let recs = b.log.records();
        let upto = upto.min(recs.len());
        let v = self.verified.entry(b.id).or_insert(0);
        let common = upto.min(self.committed.len());
        if *v < common {
            for (i, (r, c)) in recs[..common]
                .iter()
                .zip(&self.committed[..common])
                .enumerate()
                .skip(*v)
            {
                if r != c {
                    return Err(format!(
                        "broker {} has {r:?} at {i}, the committed history has {c:?}",
                        b.id
                    ));
                }
            }
            *v = common;
        }
        if extend && upto > self.committed.len() {
            self.committed
                .extend_from_slice(&recs[self.committed.len()..upto]);
            *v = upto;
        }
        Ok(())
    }

    pub fn check(
        &mut self,
        brokers: &mut BTreeMap<BrokerId, Broker>,
        controller: &Controller,
        synced_acks: bool,
    ) -> Result<(), String> {
        let mut leaders: BTreeMap<i32, BrokerId> = BTreeMap::new();
        for b in brokers.values_mut() {
            let low = b.log.take_low_mark();
            let v = self.verified.entry(b.id).or_insert(0);
            *v = (*v).min(low);
            let m = self.matched.entry(b.id).or_insert(0);
            *m = (*m).min(low);
            let start = *m;
            let recs = b.log.records();
            for (i, r) in recs.iter().enumerate().skip(start) {
                if r.offset != i as i64 {
                    return Err(format!("broker {} has {r:?} at index {i}", b.id));
                }
                if i > 0 && recs[i - 1].epoch > r.epoch {
                    return Err(format!(
                        "broker {} log goes back from epoch {} to {} at {i}",
                        b.id,
                        recs[i - 1].epoch,
                        r.epoch
                    ));
                }
                let p = *self
                    .by_position
                    .entry((r.offset, r.epoch))
                    .or_insert(r.payload);
                if p != r.payload {
                    return Err(format!(
                        "two payloads at offset {} epoch {}: {p} and {} (broker {})",
                        r.offset, r.epoch, r.payload, b.id
                    ));
                }
            }
            self.matched.insert(b.id, recs.len());
        }
        for b in brokers.values() {
            if !b.up {
                continue;
            }
            let hw = b.hw();
            if hw < 0 || hw > b.log.end() {
                return Err(format!(
                    "broker {} high watermark {hw} outside its log (end {})",
                    b.id,
                    b.log.end()
                ));
            }
            // Invariants 1 and 3: what a replica exposes below its high watermark is one
            // history, the same on every replica and never rewritten.
            self.verify_prefix(b, hw as usize, true)?;
            if let Some((epoch, hw, _)) = b.leading() {
                // Invariant 2: one leader per epoch, the one the controller named.
                if let Some(other) = leaders.insert(epoch, b.id) {
                    return Err(format!(
                        "brokers {other} and {} both lead epoch {epoch}",
                        b.id
                    ));
                }
                match controller.epoch_leaders.get(&epoch) {
                    Some(Some(l)) if *l == b.id => {}
                    other => {
                        return Err(format!(
                            "broker {} acts as leader of epoch {epoch}, which the controller gave to {other:?}",
                            b.id
                        ))
                    }
                }
                // Invariant 3: a leader's exposed high watermark never moves back.
                if let Some(&(inc, e, prev)) = self.exposed.get(&b.id) {
                    if inc == b.incarnation && e == epoch && hw < prev {
                        return Err(format!(
                            "leader {} of epoch {epoch} moved its high watermark back from {prev} to {hw}",
                            b.id
                        ));
                    }
                }
                self.exposed.insert(b.id, (b.incarnation, epoch, hw));
            }
        }
        // Every member of the committed ISR holds the whole committed history on disk, or an
        // election could pick a replica that lacks acknowledged records.
        if let Some(p) = controller.image.partition(TOPIC, 0) {
            for m in &p.isr {
                let Some(b) = brokers.get(m) else { continue };
                // Mode A may lose power any time: only the synced part counts. Mode B never
                // does, so the whole written log is on disk.
                let durable = if synced_acks {
                    b.log.synced_end()
                } else {
                    b.log.end()
                };
                if (durable as usize) < self.committed.len() {
                    return Err(format!(
                        "ISR member {m} holds {durable} records on disk, {} are committed",
                        self.committed.len()
                    ));
                }
                self.verify_prefix(b, self.committed.len(), false)?;
            }
        }
        Ok(())
    }

    /// After everything healed and settled: every replica holds the committed history and
    /// every acknowledged payload, once, at its offset, in acknowledgement order.
    pub fn final_check(&self, brokers: &BTreeMap<BrokerId, Broker>) -> Result<(), String> {
        let mut last = -1;
        for &(payload, offset) in &self.acked {
            if offset <= last {
                return Err(format!(
                    "payload {payload} acknowledged at {offset} after an earlier one at {last}"
                ));
            }
            last = offset;
        }
        for b in brokers.values() {
            let recs = b.log.records();
            if recs.len() < self.committed.len()
                || recs[..self.committed.len()] != self.committed[..]
            {
                return Err(format!("broker {} lost committed records", b.id));
            }
            let mut seen: HashMap<u64, i64> = HashMap::new();
            // Markers carry no payload id: a transaction's may be written more than once.
            for r in recs.iter().filter(|r| !super::log::is_marker(r.payload)) {
                if let Some(prev) = seen.insert(r.payload, r.offset) {
                    return Err(format!(
                        "broker {} holds payload {} twice ({prev} and {})",
                        b.id, r.payload, r.offset
                    ));
                }
            }
            for &(payload, offset) in &self.acked {
                if seen.get(&payload) != Some(&offset) {
                    return Err(format!(
                        "broker {} lost acknowledged payload {payload} (offset {offset}; has it at {:?})",
                        b.id,
                        seen.get(&payload)
                    ));
                }
            }
            for c in &self.consumed {
                if recs.get(c.offset as usize) != Some(c) {
                    return Err(format!("broker {} lost consumed record {c:?}", b.id));
                }
            }
        }
        Ok(())
    }
}

/// Where the open transaction begins in `records` (the first record after the last marker),
/// if one is open.
fn open_txn_start(records: &[Record]) -> Option<i64> {
    let mut first = None;
    for r in records.iter().rev() {
        if super::log::is_marker(r.payload) {
            break;
        }
        first = Some(r.offset);
    }
    first
}

/// The aborted transactions `records` hold: (first offset, abort marker's offset).
fn aborted_in_history(records: &[Record]) -> Vec<(i64, i64)> {
    let (mut open, mut out) = (None, Vec::new());
    for r in records {
        match r.payload {
            super::log::MARKER_ABORT => {
                if let Some(first) = open.take() {
                    out.push((first, r.offset));
                }
            }
            super::log::MARKER_COMMIT => open = None,
            _ => {
                open.get_or_insert(r.offset);
            }
        }
    }
    out
}

/// After every event, with transactions: no leader's last stable offset is past the start
/// of a transaction open in its log (read_committed would expose undecided records).
pub fn txn_step(
    brokers: &BTreeMap<BrokerId, Broker>,
    _producer: &super::clients::Producer,
    _consumer: &super::clients::Consumer,
) -> Result<(), String> {
    for b in brokers.values() {
        let Some(p) = b.partition() else { continue };
        if !b.up || p.role() != spate_broker::partition::Role::Leader {
            continue;
        }
        let lso = p.last_stable_offset();
        if lso > p.high_watermark() {
            return Err(format!(
                "broker {}: last stable offset {lso} past the high watermark {}",
                b.id,
                p.high_watermark()
            ));
        }
        if let Some(open) = open_txn_start(b.log.records()) {
            if lso > open {
                return Err(format!(
                    "broker {}: last stable offset {lso} past the open transaction at {open}",
                    b.id
                ));
            }
        }
    }
    Ok(())
}

impl Checker {
    /// Once settled, with transactions: every replica has no open transaction and lists
    /// exactly the aborted transactions its log holds (rebuilt across truncations, restarts
    /// and power losses), and the read_committed consumer kept exactly the records of the
    /// committed transactions, in order, once each, and nothing of an aborted one.
    pub fn final_txn_check(
        &self,
        brokers: &BTreeMap<BrokerId, Broker>,
        txn: &super::clients::Txn,
        consumer: &super::clients::Consumer,
    ) -> Result<(), String> {
        let expected = aborted_in_history(&self.committed);
        for b in brokers.values() {
            let Some(p) = b.partition() else { continue };
            let (lso, hw) = (p.last_stable_offset(), p.high_watermark());
            if lso != hw {
                return Err(format!(
                    "broker {}: a transaction is still open after every decision was written (lso {lso}, hw {hw})",
                    b.id
                ));
            }
            let listed: Vec<(i64, i64)> = p
                .aborted_in(p.log_start_offset(), p.log_end_offset())
                .into_iter()
                .map(|a| (a.first_offset, a.last_offset))
                .collect();
            if listed != expected {
                return Err(format!(
                    "broker {}: aborted transactions {listed:?}, its log holds {expected:?}",
                    b.id
                ));
            }
        }
        let committed: Vec<u64> = txn
            .decided
            .iter()
            .filter(|(_, commit)| *commit)
            .flat_map(|(payloads, _)| payloads.iter().copied())
            .collect();
        if consumer.kept != committed {
            let aborted: Vec<u64> = txn.aborting.iter().flatten().copied().collect();
            let leaked: Vec<&u64> = consumer
                .kept
                .iter()
                .filter(|p| aborted.contains(p))
                .collect();
            return Err(format!(
                "read_committed kept {} records, the committed transactions hold {}; aborted ones kept: {leaked:?}",
                consumer.kept.len(),
                committed.len()
            ));
        }
        Ok(())
    }
}
