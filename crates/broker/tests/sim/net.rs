//! Messages, the event queue ordered by (time, sequence number), and the network's links.

use std::cmp::Ordering;
use std::collections::{BTreeSet, BinaryHeap};
use std::rc::Rc;

use spate_cluster::metadata::{BrokerId, CommandError, MetadataImage};
use spate_cluster::replication::IsrChange;

use bytes::Bytes;
use spate_protocol::ResponseError;

use super::log::Record;

/// What one node's handler asks the world to do, and what it tells the checker.
#[derive(Default)]
pub struct Out {
    /// (to, the process to answer or None, message)
    pub sends: Vec<(NodeId, Option<u64>, Msg)>,
    /// (delay, timer) for the handling node's current process.
    pub timers: Vec<(u64, Timer)>,
    /// (leader epoch, payload) of client records a leader appended.
    pub appended: Vec<(i32, u64)>,
    /// (payload, offset) the producer saw acknowledged.
    pub acked: Vec<(u64, i64)>,
    /// Records a consumer read.
    pub consumed: Vec<Record>,
    /// Broken invariants a handler noticed on its own.
    pub violations: Vec<String>,
}

impl Out {
    pub fn send(&mut self, to: NodeId, to_incarnation: Option<u64>, msg: Msg) {
        self.sends.push((to, to_incarnation, msg));
    }

    pub fn timer(&mut self, delay_ms: u64, timer: Timer) {
        self.timers.push((delay_ms, timer));
    }
}

/// A node of the simulated network: 0 is the controller, brokers are 1..=3.
pub type NodeId = i32;
pub const CONTROLLER: NodeId = 0;
pub const PRODUCER: NodeId = 8;
pub const CONSUMER: NodeId = 9;

/// The Kafka errors the brokers answer with (the real ones).
pub type KafkaError = ResponseError;

/// What a produce writes: a plain record, a record of the transactional producer's open
/// transaction, or the marker that ends it (written by the simulated coordinator).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    Plain,
    TxnData {
        epoch: i16,
        seq: i32,
    },
    Marker {
        epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
    },
}

/// The producer id of the simulation's transactional producer.
pub const TXN_PRODUCER_ID: i64 = 7;

/// A leader's answer to a follower's fetch.
#[derive(Clone, Debug)]
pub struct FetchData {
    /// Whole batches, as read from the leader's log.
    pub records: Bytes,
    pub high_watermark: i64,
    pub log_start: i64,
}

#[derive(Clone, Debug)]
pub enum Msg {
    // Controller -> everyone.
    Image {
        version: u64,
        image: Rc<MetadataImage>,
    },
    RegisterResult {
        result: Result<i64, String>,
    },
    AlterIsrResult {
        change: IsrChange,
        result: Result<(), CommandError>,
    },
    // Broker -> controller.
    Register {
        incarnation: u128,
    },
    Heartbeat {
        broker_epoch: i64,
    },
    AlterIsr {
        change: IsrChange,
    },
    // Follower <-> leader.
    OffsetForEpoch {
        req: u64,
        current_epoch: i32,
        requested: i32,
    },
    OffsetForEpochResult {
        req: u64,
        result: Result<Option<(i32, i64)>, KafkaError>,
    },
    Fetch {
        req: u64,
        current_epoch: i32,
        fetch_offset: i64,
        log_start: i64,
    },
    /// An error carries the leader's log start (a follower behind it starts over there).
    FetchResult {
        req: u64,
        result: Result<FetchData, (KafkaError, i64)>,
    },
    // Clients <-> leader.
    Produce {
        req: u64,
        payload: u64,
        write: Write,
    },
    ProduceResult {
        req: u64,
        result: Result<i64, KafkaError>,
    },
    ConsumerFetch {
        req: u64,
        offset: i64,
        /// read_committed: up to the last stable offset, with the aborted transactions.
        committed: bool,
    },
    ConsumerFetchResult {
        req: u64,
        records: Vec<Record>,
        /// Aborted transactions that may hold records of the answer: (first offset, marker).
        aborted: Vec<(i64, i64)>,
    },
}

impl Msg {
    /// One line for the failure trace (no records, no images).
    pub fn summary(&self) -> String {
        match self {
            Msg::Image { version, image } => {
                let p = image.partition(super::TOPIC, 0);
                format!(
                    "Image v{version} {:?}",
                    p.map(|p| (p.leader, p.leader_epoch, p.partition_epoch, p.isr.clone()))
                )
            }
            Msg::FetchResult { req, result: Ok(d) } => {
                let recs = super::log::decode(&d.records);
                format!(
                    "FetchResult req={req} {} records from {:?} hw={}",
                    recs.len(),
                    recs.first().map(|r| r.offset),
                    d.high_watermark
                )
            }
            Msg::ConsumerFetchResult { req, records, .. } => {
                format!("ConsumerFetchResult req={req} {} records", records.len())
            }
            other => format!("{other:?}"),
        }
    }
}

/// Timers a node sets for itself; they die with the process that set them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    Heartbeat,
    RequestTimeout {
        req: u64,
    },
    FetchBackoff {
        req_gen: u64,
    },
    LagCheck,
    Flush,
    ControllerTick,
    Publish,
    ProduceNext,
    ProduceTimeout {
        req: u64,
    },
    ConsumerPoll,
    GroupCommit,
    /// A follower's copied records reached its disk.
    FollowerSynced {
        req: u64,
    },
    Chaos,
    Heal {
        link: (NodeId, NodeId),
    },
    Restart {
        broker: BrokerId,
    },
}

#[derive(Clone, Debug)]
pub enum Event {
    Deliver {
        from: NodeId,
        from_incarnation: u64,
        to: NodeId,
        /// A response goes to the process that asked; `None` for anyone at that address.
        to_incarnation: Option<u64>,
        msg: Msg,
    },
    Timer {
        node: NodeId,
        incarnation: u64,
        timer: Timer,
    },
}

struct Scheduled {
    at_ms: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at_ms, self.seq) == (other.at_ms, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap and the earliest event goes first.
        (other.at_ms, other.seq).cmp(&(self.at_ms, self.seq))
    }
}

#[derive(Default)]
pub struct Queue {
    heap: BinaryHeap<Scheduled>,
    seq: u64,
}

impl Queue {
    pub fn push(&mut self, at_ms: u64, event: Event) {
        self.seq += 1;
        self.heap.push(Scheduled {
            at_ms,
            seq: self.seq,
            event,
        });
    }

    pub fn pop(&mut self) -> Option<(u64, Event)> {
        self.heap.pop().map(|s| (s.at_ms, s.event))
    }

    pub fn peek_time(&self) -> Option<u64> {
        self.heap.peek().map(|s| s.at_ms)
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }
}

/// Which links are cut, and how lossy and slow the network is.
#[derive(Clone, Debug, Default)]
pub struct Links {
    cut: BTreeSet<(NodeId, NodeId)>,
    pub loss_per_mille: u64,
    /// Chance that a message takes the slow path (and so overtakes nothing / gets overtaken).
    pub slow_per_mille: u64,
    pub slow_max_ms: u64,
}

impl Links {
    pub fn new(loss_per_mille: u64, slow_per_mille: u64, slow_max_ms: u64) -> Self {
        Links {
            cut: BTreeSet::new(),
            loss_per_mille,
            slow_per_mille,
            slow_max_ms,
        }
    }

    pub fn key(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
        (a.min(b), a.max(b))
    }

    pub fn cut(&mut self, a: NodeId, b: NodeId) {
        if a != b {
            self.cut.insert(Self::key(a, b));
        }
    }

    pub fn heal(&mut self, a: NodeId, b: NodeId) {
        self.cut.remove(&Self::key(a, b));
    }

    pub fn heal_all(&mut self) {
        self.cut.clear();
    }

    pub fn is_cut(&self, a: NodeId, b: NodeId) -> bool {
        self.cut.contains(&Self::key(a, b))
    }

    pub fn cut_links(&self) -> impl Iterator<Item = &(NodeId, NodeId)> {
        self.cut.iter()
    }
}
