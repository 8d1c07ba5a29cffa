//! One sequential acks=all producer and one consumer, both finding the leader through the
//! (delayed) images they receive, as clients do through Metadata requests.

use std::collections::BTreeMap;
use std::rc::Rc;

use spate_cluster::metadata::{BrokerId, MetadataImage};

use super::log::Record;
use super::net::{KafkaError, Msg, Out, Timer};
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
                if !self.producing || self.inflight.is_some() {
                    return;
                }
                let Some(leader) = leader_of(&self.image) else {
                    out.timer(20, Timer::ProduceNext);
                    return;
                };
                self.next_req += 1;
                self.next_payload += 1;
                self.sent += 1;
                let (req, payload) = (self.next_req, self.next_payload);
                // A payload is sent once and never retried, so it can be in a log only once.
                self.inflight = Some((req, payload));
                out.send(leader, None, Msg::Produce { req, payload });
                out.timer(PRODUCER_TIMEOUT_MS, Timer::ProduceTimeout { req });
            }
            Timer::ProduceTimeout { req } if self.inflight.is_some_and(|(r, _)| r == req) => {
                self.inflight = None;
                *self.errors.entry("ClientTimeout".to_owned()).or_default() += 1;
                out.timer(1, Timer::ProduceNext);
            }
            _ => {}
        }
    }
}

#[derive(Default)]
pub struct Consumer {
    image: Option<Rc<MetadataImage>>,
    version: u64,
    next_req: u64,
    outstanding: Option<u64>,
    pub consumed: Vec<Record>,
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
            Msg::ConsumerFetchResult { req, records } => {
                if self.outstanding != Some(req) {
                    return;
                }
                self.outstanding = None;
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
                    offset: self.consumed.len() as i64,
                },
            );
        }
        out.timer(CONSUMER_POLL_MS, Timer::ConsumerPoll);
    }
}
