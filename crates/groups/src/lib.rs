//! Consumer groups.
//!
//! [`Coordinator`] runs Kafka's classic rebalance protocol (JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup, static membership) as a pure state machine: requests and clock ticks go in with
//! the current time, responses come out, some of them for requests that arrived earlier and
//! were parked (a JoinGroup waits for the rest of the group). Sockets, clocks and storage live
//! in the broker. [`OffsetStore`] holds committed offsets, and [`record`] is their durable
//! encoding in the internal offsets log. [`consumer_group`] runs KIP-848's consumer protocol
//! (ConsumerGroupHeartbeat) the same way: heartbeats and time in, answers and durable records
//! out.

pub mod consumer_group;
mod coordinator;
mod offsets;
pub mod record;

pub use coordinator::{
    CommitCheck, Coordinator, CoordinatorConfig, GroupDescription, GroupState, JoinRequest,
    JoinResponse, JoinedMember, MemberDescription, Reply, SyncRequest, SyncResponse, Token,
};
pub use offsets::{Committed, OffsetStore};
