//! A seeded, deterministic, single-threaded simulation of one partition replicated on three
//! brokers, running spate's real code: `MetadataImage::apply` for every metadata change and
//! `controller::reconcile` for liveness, fencing and elections on the controller; on each
//! broker the real `Partition` (log, producer state, `LeaderState`) on a simulated disk with
//! a manual flusher, driven through the `replica` steps the cluster's tasks run (the role an
//! image gives, the leader's fetch admission and fencing, the follower's divergence, copy and
//! high watermark steps, the ISR change verdict). Time is a counter in ms; every message and
//! timer is an event in one queue ordered by (time, sequence number).

#![allow(dead_code)] // each test uses a different part of the harness

pub mod broker;
pub mod check;
pub mod clients;
pub mod controller;
pub mod log;
pub mod net;
pub mod rng;
pub mod world;

pub const TOPIC: &str = "t";
/// min.insync.replicas of the topic.
pub const MIN_ISR: usize = 2;
pub const BROKERS: [i32; 3] = [1, 2, 3];

pub const HEARTBEAT_MS: u64 = 50;
pub const SESSION_TIMEOUT_MS: u64 = 300;
/// replica.lag.time.max.ms
pub const LAG_TIME_MAX_MS: u64 = 400;
pub const LAG_CHECK_MS: u64 = 100;
/// A follower's OffsetForLeaderEpoch or Fetch with no answer by then is sent again.
pub const REQUEST_TIMEOUT_MS: u64 = 150;
pub const FETCH_BACKOFF_MS: u64 = 10;
/// The leader answers REQUEST_TIMED_OUT to a produce not committed by then.
pub const PRODUCE_TIMEOUT_MS: u64 = 200;
/// The producer gives up on a request with no answer by then.
pub const PRODUCER_TIMEOUT_MS: u64 = 250;
pub const ALTER_ISR_RETRY_MS: u64 = 300;
pub const CONTROLLER_TICK_MS: u64 = 50;
pub const PUBLISH_MS: u64 = 100;
/// The page cache's periodic write-back.
pub const FLUSH_MS: u64 = 200;
/// Mode A: a leader fsyncs this long after an append (group commit).
pub const GROUP_COMMIT_MS: u64 = 2;
pub const CONSUMER_POLL_MS: u64 = 30;
pub const MAX_FETCH_RECORDS: usize = 16;
