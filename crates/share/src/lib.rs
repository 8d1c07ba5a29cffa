//! Share groups (KIP-932, "queues on Kafka topics") as pure state machines.
//!
//! In a share group, consumers do not own partitions: every member may read every partition
//! it is assigned, possibly together with other members, and the broker hands out individual
//! records under time-limited acquisition locks. Consumers acknowledge each record (accept,
//! release for redelivery, reject); a record not acknowledged before its lock expires is
//! delivered again, up to a delivery count limit, after which it is archived.
//!
//! - [`SharePartition`] is the delivery state of one share-partition (group, topic-partition):
//!   the share-partition start offset (SPSO), below which every record is done, the end offset,
//!   and between them the in-flight records, each available, acquired (by a member, until a
//!   deadline), acknowledged or archived, with a delivery count. ShareFetch turns into
//!   [`SharePartition::acquire`], ShareAcknowledge into [`SharePartition::acknowledge`].
//! - [`state`] is its durable form: the `ShareSnapshot` and `ShareUpdate` records of Kafka's
//!   `__share_group_state`, encoded as Kafka encodes them. A new leader resumes a
//!   share-partition with [`SharePartition::from_state`]; locks are not durable, so acquired
//!   records come back available.
//! - [`ShareGroup`] is the membership of one share group (ShareGroupHeartbeat): members join
//!   with epoch 0, heartbeat, leave with epoch -1 or time out; the group epoch moves with
//!   membership and subscriptions, and the simple assignor shares partitions among members.
//!   Members that go away come out as [`GroupEvent`]s so the broker releases their locks.
//!
//! Nothing here reads a clock, a socket or a disk: the current time (ms) comes in with every
//! call, answers and records to persist come out.
//!
//! ```
//! use spate_share::{AckBatch, AckType, SharePartition, SharePartitionConfig, StateChange};
//!
//! // A share-partition starting at offset 0 (share.auto.offset.reset=earliest on an empty log).
//! let mut p = SharePartition::new(SharePartitionConfig::default(), 0);
//! // ShareFetch: the broker read offsets 0..=9 from the log at `p.next_fetch_offset()`.
//! let acquired = p.acquire("member-1", &[0..=9], 500, 30_000, 1_000);
//! assert_eq!((acquired[0].first, acquired[0].last, acquired[0].delivery_count), (0, 9, 1));
//! // ShareAcknowledge: 0..=7 processed, 8..=9 released for another delivery.
//! p.acknowledge(
//!     "member-1",
//!     &[AckBatch::new(0, 7, AckType::Accept), AckBatch::new(8, 9, AckType::Release)],
//!     2_000,
//! )
//! .unwrap();
//! assert_eq!(p.start_offset(), 8);
//! // What to write to __share_group_state: a ShareUpdate with the new start offset.
//! assert!(matches!(p.take_changes(), StateChange::Update { start_offset: Some(8), .. }));
//! // The next delivery of 8..=9 is their second.
//! let again = p.acquire("member-2", &[8..=9], 500, 30_000, 3_000);
//! assert_eq!(again[0].delivery_count, 2);
//! ```

mod assignor;
#[cfg(test)]
mod assignor_tests;
mod group;
#[cfg(test)]
mod group_tests;
mod partition;
#[cfg(test)]
mod partition_tests;
#[cfg(test)]
mod prop_tests;
pub mod state;
#[cfg(test)]
mod state_tests;
#[cfg(test)]
mod test_rng;

pub use assignor::{assign, Assignment, MemberSpec, TopicsView};
pub use group::{
    GroupDescription, GroupEvent, HeartbeatError, HeartbeatReply, HeartbeatRequest,
    MemberDescription, RemovalReason, ShareGroup, ShareGroupConfig, ShareGroupState, LEAVE_EPOCH,
};
pub use partition::{
    AckBatch, AckError, AckType, AcquiredRange, AutoOffsetReset, LoadError, Offset, RecordState,
    ResetError, ShareMetrics, SharePartition, SharePartitionConfig, StateChange,
    DEFAULT_DELIVERY_COUNT_LIMIT, DEFAULT_LOCK_DURATION_MS, DEFAULT_MAX_IN_FLIGHT,
};
pub use state::{PartitionState, StateBatch};
