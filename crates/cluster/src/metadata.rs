//! The cluster metadata state machine: a pure, deterministic image of brokers, topics,
//! partitions and producer-id blocks, changed only by [`MetadataCommand`]s.
//!
//! Nothing here does I/O or reads a clock: every command carries the values it needs (time
//! included), so applying the same log on any node yields byte-identical images. Every refusal
//! leaves the image untouched, which is what lets the Raft state machine apply a refused
//! command as a no-op with a typed reason.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spate_auth::acl::{AclBinding, AclFilter};
use spate_auth::CredentialRecord;
use spate_quotas::{QuotaEntity, QuotaKey, QuotaTable, QuotaValue};
use uuid::Uuid;

/// A Kafka broker id (the wire type is INT32); in combined mode it equals the Raft node id.
pub type BrokerId = i32;

/// The wire value Kafka uses for "no leader".
pub const NO_LEADER: BrokerId = -1;

/// How many producer ids one [`MetadataCommand::AllocateProducerIds`] hands out (Kafka's 1000).
pub const PRODUCER_ID_BLOCK_SIZE: i64 = 1000;

/// Kafka's limit on topic name length.
const TOPIC_NAME_MAX_LEN: usize = 249;

/// One broker as registered in the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRegistration {
    /// Broker id (equal to the node id in combined mode).
    pub id: BrokerId,
    /// Identifies one process lifetime; a restart registers a new incarnation.
    pub incarnation: Uuid,
    /// Broker epoch: assigned at registration, strictly increasing across the cluster.
    pub epoch: i64,
    /// The address other nodes use for inter-node traffic (Raft and replica fetches).
    pub inter_node_addr: String,
    /// Host advertised to Kafka clients.
    pub kafka_host: String,
    /// Port advertised to Kafka clients.
    pub kafka_port: u16,
    /// Optional rack, reported in Metadata responses.
    pub rack: Option<String>,
    /// A fenced broker leads nothing and is not eligible for the ISR.
    pub fenced: bool,
    /// Set by the broker's heartbeat when it wants a controlled shutdown.
    pub shutting_down: bool,
    /// The time carried by the last heartbeat, as given by the proposer (informational).
    pub last_heartbeat_ms: u64,
    /// Number of heartbeats applied for this registration; the controller's liveness tracker
    /// watches it change, so liveness never compares clocks of different machines.
    pub heartbeat_count: u64,
    /// An operator asked for this broker to be emptied and removed: the controller moves its
    /// replicas away and places nothing new on it.
    #[serde(default)]
    pub decommissioning: bool,
    /// The HTTP address other nodes use for node-to-node HTTP (search fan-out, ingest
    /// routing); absent for brokers registered before it existed.
    #[serde(default)]
    pub http_addr: Option<String>,
    /// Every advertised Kafka listener (`--advertised-listeners`), so each client is told
    /// the addresses of the listener it connected to; empty for brokers registered before
    /// they were recorded (their `kafka_host:kafka_port` stands for all).
    #[serde(default)]
    pub listeners: Vec<ListenerAddress>,
    /// The broker's data dir is below its free-space watermark: it refuses produce, so the
    /// controller moves its leaderships to in-sync replicas with space.
    #[serde(default)]
    pub disk_full: bool,
}

/// One advertised Kafka listener of a broker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerAddress {
    /// The listener's name: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    pub name: String,
    /// Advertised host.
    pub host: String,
    /// Advertised port.
    pub port: u16,
}

impl BrokerRegistration {
    /// The advertised address of the listener named `name`, if the broker has one.
    pub fn listener(&self, name: &str) -> Option<(&str, u16)> {
        self.listeners
            .iter()
            .find(|l| l.name == name)
            .map(|l| (l.host.as_str(), l.port))
    }
}

/// The replication state of one partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionState {
    /// Assigned replicas in preference order; the first is the preferred leader.
    pub replicas: Vec<BrokerId>,
    /// Current leader, `None` when the partition is offline.
    pub leader: Option<BrokerId>,
    /// Bumped on every leader change (including to "no leader").
    pub leader_epoch: i32,
    /// Bumped on every change to this partition's state (leader or ISR).
    pub partition_epoch: i32,
    /// In-sync replicas, in the order they were given.
    pub isr: Vec<BrokerId>,
    /// Replicas a reassignment in progress is adding (also in `replicas`).
    ///
    /// Always written, even empty: snapshots encode structs positionally (see
    /// `raft::state_machine`), where a skipped field would shift the ones after it. `default`
    /// still reads JSON snapshots from before these fields existed.
    #[serde(default)]
    pub adding: Vec<BrokerId>,
    /// Replicas a reassignment in progress will drop once the new ones are in sync (also in
    /// `replicas`).
    #[serde(default)]
    pub removing: Vec<BrokerId>,
}

impl PartitionState {
    /// The leader as Kafka puts it on the wire: -1 when there is none.
    pub fn leader_or_no_leader(&self) -> BrokerId {
        self.leader.unwrap_or(NO_LEADER)
    }

    /// Whether a reassignment is in progress.
    pub fn is_reassigning(&self) -> bool {
        !self.adding.is_empty() || !self.removing.is_empty()
    }

    /// The replica set a reassignment in progress moves to (the current one otherwise).
    pub fn target_replicas(&self) -> Vec<BrokerId> {
        self.replicas
            .iter()
            .copied()
            .filter(|b| !self.removing.contains(b))
            .collect()
    }

    /// The replica set before the reassignment in progress started (the current one
    /// otherwise): what cancelling goes back to.
    pub fn original_replicas(&self) -> Vec<BrokerId> {
        self.replicas
            .iter()
            .copied()
            .filter(|b| !self.adding.contains(b))
            .collect()
    }
}

/// One topic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicImage {
    /// Topic name.
    pub name: String,
    /// Topic id (Kafka's topic UUID).
    pub id: Uuid,
    /// Topic-level config overrides.
    pub configs: BTreeMap<String, String>,
    /// Partitions, indexed by partition number.
    pub partitions: Vec<PartitionState>,
}

impl TopicImage {
    /// The partition with this number, if it exists.
    pub fn partition(&self, partition: i32) -> Option<&PartitionState> {
        usize::try_from(partition)
            .ok()
            .and_then(|p| self.partitions.get(p))
    }
}

/// A block of producer ids: `[first, first + size)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerIdBlock {
    /// First id of the block.
    pub first: i64,
    /// Number of ids in the block.
    pub size: i64,
}

/// The whole cluster metadata at one point of the log.
///
/// Serde rules for this type and everything in it (snapshots are MessagePack with structs as
/// arrays, see `raft::state_machine`): no `skip_serializing_if`, `flatten` or `untagged`;
/// a new field goes at the end of its struct with `#[serde(default)]`, so older snapshots
/// still load.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataImage {
    pub(crate) brokers: BTreeMap<BrokerId, BrokerRegistration>,
    /// Shared with the images before and after a change that leaves them alone: applying a
    /// command copies only the topics it changes (copy-on-write), and comparing two images
    /// skips every topic they share by pointer.
    pub(crate) topics: BTreeMap<String, Arc<TopicImage>>,
    /// Dynamic broker configs (Kafka's `kafka-configs --entity-type brokers`), by resource
    /// name: `""` is the cluster-wide default, `"3"` broker 3.
    #[serde(default)]
    pub(crate) broker_configs: BTreeMap<String, BTreeMap<String, String>>,
    /// Share group configs (Kafka's `kafka-configs --entity-type groups`), by group id: every
    /// node serves share-partitions of any group, so every node needs them.
    #[serde(default)]
    pub(crate) group_configs: BTreeMap<String, BTreeMap<String, String>>,
    /// Brokers removed by decommissioning: they may not register again until re-admitted
    /// (`ReadmitBroker`, which adding a node proposes).
    #[serde(default)]
    pub(crate) retired: BTreeSet<BrokerId>,
    /// The cluster id every node reports, fixed once (see `SetClusterId`): it must not
    /// change when nodes join or leave.
    #[serde(default)]
    cluster_id: Option<String>,
    /// Client quotas (`kafka-configs --entity-type users|clients`), the same on every node.
    #[serde(default)]
    pub(crate) client_quotas: QuotaTable,
    /// Start of the next producer-id block to hand out.
    next_producer_id: i64,
    /// Epoch the next registration gets; starts at 1 so that 0 never names a registration.
    next_broker_epoch: i64,
    /// SCRAM credentials (`kafka-configs --entity-type users`), sorted by user then
    /// mechanism: every node authenticates against the same ones.
    #[serde(default)]
    pub(crate) scram_credentials: Arc<Vec<CredentialRecord>>,
    /// ACLs (`kafka-acls`), in the order they were created: every node authorizes with them.
    #[serde(default)]
    pub(crate) acls: Arc<Vec<AclBinding>>,
}

/// Refuses credentials a node could not use (bad mechanism, encoding or key length): every
/// node would otherwise fail the same way when it loads them.
fn check_credentials(records: &[CredentialRecord]) -> Result<(), CommandError> {
    for r in records {
        if r.user.is_empty() {
            return Err(CommandError::InvalidRequest {
                reason: "a SCRAM credential needs a user name".into(),
            });
        }
        if let Err(e) = r.credential() {
            return Err(CommandError::InvalidRequest {
                reason: format!("SCRAM credential of {}: {e}", r.user),
            });
        }
    }
    Ok(())
}

/// A change to the metadata image, replicated through the Raft log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetadataCommand {
    /// A broker process announces itself. Registers unfenced.
    RegisterBroker {
        /// Broker id.
        broker_id: BrokerId,
        /// Fresh for each process start.
        incarnation: Uuid,
        /// Inter-node address.
        inter_node_addr: String,
        /// Advertised Kafka host.
        kafka_host: String,
        /// Advertised Kafka port.
        kafka_port: u16,
        /// Optional rack.
        rack: Option<String>,
        /// Advertised HTTP address for node-to-node HTTP.
        #[serde(default)]
        http_addr: Option<String>,
        /// Time as given by the proposer.
        now_ms: u64,
        /// Every advertised Kafka listener.
        #[serde(default)]
        listeners: Vec<ListenerAddress>,
    },
    /// A registered broker says it is alive.
    BrokerHeartbeat {
        /// Broker id.
        broker_id: BrokerId,
        /// The epoch returned by its registration.
        broker_epoch: i64,
        /// Time as given by the proposer.
        now_ms: u64,
        /// The broker asks to be fenced and drained (controlled shutdown).
        shutting_down: bool,
    },
    /// A broker's data dir went below (or back above) its free-space watermark.
    SetBrokerDiskFull {
        /// Broker id.
        broker_id: BrokerId,
        /// The registration it applies to (a newer registration is not touched).
        broker_epoch: i64,
        /// Below the watermark: produce is refused there.
        full: bool,
    },
    /// Fence a broker: it leads nothing and is not eligible for the ISR.
    FenceBroker {
        /// Broker id.
        broker_id: BrokerId,
        /// The registration being fenced (a newer registration is not touched).
        broker_epoch: i64,
    },
    /// Unfence a broker that is heartbeating again.
    UnfenceBroker {
        /// Broker id.
        broker_id: BrokerId,
        /// The registration being unfenced.
        broker_epoch: i64,
    },
    /// Create a topic with an explicit assignment (see `controller::create_topic_command`).
    CreateTopic {
        /// Topic name.
        name: String,
        /// Topic id, chosen by the proposer; re-applying the same id is a no-op success.
        topic_id: Uuid,
        /// Topic config overrides.
        configs: BTreeMap<String, String>,
        /// Replicas of each partition, preferred leader first.
        assignment: Vec<Vec<BrokerId>>,
    },
    /// Delete a topic.
    DeleteTopic {
        /// Topic name.
        name: String,
    },
    /// Set and remove topic config overrides.
    AlterTopicConfigs {
        /// Topic name.
        name: String,
        /// Keys to set.
        set: BTreeMap<String, String>,
        /// Keys to remove.
        remove: Vec<String>,
    },
    /// Append partitions to a topic.
    CreatePartitions {
        /// Topic name.
        name: String,
        /// Replicas of each new partition.
        assignment: Vec<Vec<BrokerId>>,
    },
    /// The controller sets leader and ISR; bumps the leader epoch.
    ChangeLeader {
        /// Topic name.
        topic: String,
        /// Partition number.
        partition: i32,
        /// The partition epoch the decision was made on.
        partition_epoch: i32,
        /// New leader, `None` to take the partition offline.
        leader: Option<BrokerId>,
        /// New ISR (never empty: the last in-sync replica stays in it).
        isr: Vec<BrokerId>,
    },
    /// Move leadership back to the preferred replica (Kafka's ElectLeaders, type PREFERRED).
    ElectPreferredLeader {
        /// Topic name.
        topic: String,
        /// Partition number.
        partition: i32,
    },
    /// A partition leader (or the controller on its behalf) changes the ISR.
    AlterIsr {
        /// Topic name.
        topic: String,
        /// Partition number.
        partition: i32,
        /// The proposing leader.
        leader: BrokerId,
        /// Leader epoch the leader believes is current.
        leader_epoch: i32,
        /// Partition epoch the leader believes is current.
        partition_epoch: i32,
        /// Proposed ISR.
        isr: Vec<BrokerId>,
    },
    /// Hand out the next block of producer ids.
    AllocateProducerIds {
        /// Requesting broker.
        broker_id: BrokerId,
        /// Its registration epoch.
        broker_epoch: i64,
    },
    /// Start, change or (with `target: None`) cancel the reassignment of a partition
    /// (Kafka's AlterPartitionReassignments). New replicas join at once, catch up through
    /// replica fetch, and the old ones leave when the controller completes the move.
    AlterReassignment {
        /// Topic name.
        topic: String,
        /// Partition number.
        partition: i32,
        /// The replicas the partition should end with, preferred leader first; `None`
        /// cancels the reassignment in progress.
        target: Option<Vec<BrokerId>>,
    },
    /// The controller ends a reassignment whose target replicas are all in sync: the
    /// replicas become the target, and leadership moves if the leader is being removed.
    CompleteReassignment {
        /// Topic name.
        topic: String,
        /// Partition number.
        partition: i32,
        /// The partition epoch the decision was made on.
        partition_epoch: i32,
    },
    /// Elect a leader outside the ISR because no ISR member is live (Kafka's ElectLeaders,
    /// type UNCLEAN): the first live replica leads, alone in the ISR. Records only it lacks
    /// are lost; an operator asks for this explicitly.
    ElectUncleanLeader {
        /// Topic name.
        topic: String,
        /// Partition number.
        partition: i32,
    },
    /// Start or stop emptying a broker for removal.
    SetDecommissioning {
        /// Broker id.
        broker_id: BrokerId,
        /// Whether it is being decommissioned.
        decommissioning: bool,
    },
    /// Forget a broker that holds no replica (after decommissioning); it may not register
    /// again until re-admitted.
    UnregisterBroker {
        /// Broker id.
        broker_id: BrokerId,
    },
    /// Fix the cluster id; the first one applied wins and later ones change nothing.
    SetClusterId {
        /// The id.
        cluster_id: String,
    },
    /// Let a removed broker id register again (a node added back to the cluster).
    ReadmitBroker {
        /// Broker id.
        broker_id: BrokerId,
    },
    /// Set and remove dynamic broker configs.
    AlterBrokerConfigs {
        /// `""` for the cluster default, or a broker id.
        resource: String,
        /// Keys to set.
        set: BTreeMap<String, String>,
        /// Keys to remove.
        remove: Vec<String>,
    },
    /// Set and remove one share group's configs (values validated by the proposer).
    AlterGroupConfigs {
        /// The group id.
        group: String,
        /// Keys to set.
        set: BTreeMap<String, String>,
        /// Keys to remove.
        remove: Vec<String>,
    },
    /// Set and remove one entity's client quotas (already validated).
    AlterClientQuotas {
        /// Who the quotas are for.
        entity: QuotaEntity,
        /// Keys to set, with their values.
        set: Vec<(QuotaKey, QuotaValue)>,
        /// Keys to remove.
        remove: Vec<QuotaKey>,
    },
    /// Set and remove SCRAM credentials (AlterUserScramCredentials, already checked per
    /// user). Removing a credential that is not there is not an error: two nodes may race.
    AlterScramCredentials {
        /// Credentials to add or replace.
        upserts: Vec<CredentialRecord>,
        /// `(user, mechanism)` pairs to remove.
        deletions: Vec<(String, String)>,
    },
    /// Give users that have no credential at all these ones (the bootstrap users of
    /// `SPATE_BOOTSTRAP_USERS`): a user someone already changed keeps its credentials, so
    /// every node may propose its bootstrap users at every start.
    BootstrapScramUsers {
        /// Credentials of the bootstrap users.
        records: Vec<CredentialRecord>,
    },
    /// Add ACL bindings (CreateAcls); one already there is not added twice.
    CreateAcls {
        /// The bindings, each valid.
        bindings: Vec<AclBinding>,
    },
    /// Remove the ACL bindings each filter matches (DeleteAcls).
    DeleteAcls {
        /// The filters, applied in order.
        filters: Vec<AclFilter>,
    },
    /// Several commands applied atomically: all or none.
    Batch(Vec<MetadataCommand>),
    /// Several independent commands in one entry, each applied or refused on its own (as
    /// Kafka's AlterPartition carries the ISR changes of many partitions): one Raft round
    /// for what would otherwise be one each.
    Each(Vec<MetadataCommand>),
}

/// The typed result of a command that was applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandOutcome {
    /// Registration accepted; heartbeats must carry this epoch.
    BrokerRegistered {
        /// The broker epoch.
        broker_epoch: i64,
    },
    /// Heartbeat recorded.
    HeartbeatAccepted {
        /// Whether the broker is currently fenced.
        fenced: bool,
    },
    /// A broker's disk state recorded.
    BrokerDiskFullSet,
    /// Broker fenced.
    BrokerFenced,
    /// Broker unfenced.
    BrokerUnfenced,
    /// Topic created (or already created by an earlier apply of the same command).
    TopicCreated {
        /// Topic id.
        topic_id: Uuid,
    },
    /// Topic deleted.
    TopicDeleted {
        /// Id of the deleted topic.
        topic_id: Uuid,
    },
    /// Topic configs changed.
    TopicConfigsAltered,
    /// Partitions added.
    PartitionsCreated {
        /// The topic's partition count after the change.
        partition_count: i32,
    },
    /// Leader changed.
    LeaderChanged {
        /// New leader.
        leader: Option<BrokerId>,
        /// New leader epoch.
        leader_epoch: i32,
        /// New partition epoch.
        partition_epoch: i32,
    },
    /// ISR changed.
    IsrAltered {
        /// New ISR.
        isr: Vec<BrokerId>,
        /// New partition epoch.
        partition_epoch: i32,
    },
    /// A fresh producer-id block.
    ProducerIdsAllocated(ProducerIdBlock),
    /// Reassignment started, changed, cancelled or completed: the partition's state after it.
    Reassigned(PartitionState),
    /// Decommissioning flag set.
    DecommissioningSet,
    /// Broker forgotten.
    BrokerUnregistered,
    /// Broker id may register again.
    BrokerReadmitted,
    /// Broker configs changed.
    BrokerConfigsAltered,
    /// A group's configs changed.
    GroupConfigsAltered,
    /// Client quotas changed.
    ClientQuotasAltered,
    /// SCRAM credentials changed (or already as asked).
    ScramCredentialsAltered,
    /// ACL bindings added.
    AclsCreated,
    /// What each DeleteAcls filter removed, in order.
    AclsDeleted(Vec<Vec<AclBinding>>),
    /// Outcomes of a batch, in order.
    Batch(Vec<CommandOutcome>),
    /// The result of each command of an `Each`, in order.
    Each(Vec<Result<CommandOutcome, CommandError>>),
    /// A Raft-internal entry (blank or membership) with no metadata effect.
    Noop,
}

/// Why a command was refused. The image is unchanged when one is returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum CommandError {
    /// A live registration with another incarnation holds this broker id.
    #[error("broker {broker_id} is already registered by a live process (incarnation {existing}); incarnation {requested} can register only after the old one is fenced")]
    DuplicateBrokerRegistration {
        /// Broker id.
        broker_id: BrokerId,
        /// Incarnation holding the id.
        existing: Uuid,
        /// Incarnation that asked.
        requested: Uuid,
    },
    /// The broker id is not registered.
    #[error("broker {broker_id} is not registered")]
    BrokerNotRegistered {
        /// Broker id.
        broker_id: BrokerId,
    },
    /// The command names an older (or unknown) registration of the broker.
    #[error(
        "broker {broker_id}: epoch {given} is stale, the current registration has epoch {current}"
    )]
    StaleBrokerEpoch {
        /// Broker id.
        broker_id: BrokerId,
        /// Epoch in the command.
        given: i64,
        /// Current registration epoch.
        current: i64,
    },
    /// Malformed request (negative id, empty address...).
    #[error("invalid request: {reason}")]
    InvalidRequest {
        /// What is wrong.
        reason: String,
    },
    /// Topic name breaks Kafka's rules.
    #[error("invalid topic name {name:?}: {reason}")]
    InvalidTopicName {
        /// Name given.
        name: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// A topic with this name exists.
    #[error("topic {name:?} already exists")]
    TopicAlreadyExists {
        /// Topic name.
        name: String,
    },
    /// The topic id is nil or used by another topic.
    #[error("topic id {topic_id} is not usable: {reason}")]
    InvalidTopicId {
        /// Topic id.
        topic_id: Uuid,
        /// Why.
        reason: String,
    },
    /// No such topic.
    #[error("unknown topic {name:?}")]
    UnknownTopic {
        /// Topic name.
        name: String,
    },
    /// No such partition.
    #[error("unknown partition {topic:?}-{partition}")]
    UnknownPartition {
        /// Topic name.
        topic: String,
        /// Partition number.
        partition: i32,
    },
    /// Partition count is not acceptable.
    #[error("invalid partition count: {reason}")]
    InvalidPartitions {
        /// Why.
        reason: String,
    },
    /// Replication factor is not acceptable (raised by placement).
    #[error("invalid replication factor {requested}: only {available} live brokers")]
    InvalidReplicationFactor {
        /// Requested factor.
        requested: i32,
        /// Live unfenced brokers.
        available: usize,
    },
    /// The replica assignment is malformed.
    #[error("invalid replica assignment: {reason}")]
    InvalidReplicaAssignment {
        /// Why.
        reason: String,
    },
    /// A config key or change is malformed.
    #[error("invalid config: {reason}")]
    InvalidConfig {
        /// Why.
        reason: String,
    },
    /// The request's leader epoch is older than the partition's.
    #[error("{topic}-{partition}: leader epoch {given} is fenced, the current leader epoch is {current}")]
    FencedLeaderEpoch {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: i32,
        /// Epoch in the request.
        given: i32,
        /// Current epoch.
        current: i32,
    },
    /// The request's leader epoch is newer than the partition's.
    #[error("{topic}-{partition}: leader epoch {given} is unknown, the current leader epoch is {current}")]
    UnknownLeaderEpoch {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: i32,
        /// Epoch in the request.
        given: i32,
        /// Current epoch.
        current: i32,
    },
    /// The proposer is not the partition's leader.
    #[error("{topic}-{partition}: broker {broker_id} is not the leader (leader is {leader:?})")]
    NotLeader {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: i32,
        /// Proposing broker.
        broker_id: BrokerId,
        /// Current leader.
        leader: Option<BrokerId>,
    },
    /// The request's partition epoch is not the current one.
    #[error("{topic}-{partition}: partition epoch {given} is stale, the current partition epoch is {current}")]
    StalePartitionEpoch {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: i32,
        /// Epoch in the request.
        given: i32,
        /// Current epoch.
        current: i32,
    },
    /// The proposed ISR or leader is not acceptable.
    #[error("{topic}-{partition}: invalid ISR {isr:?}: {reason}")]
    InvalidIsr {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: i32,
        /// Proposed ISR.
        isr: Vec<BrokerId>,
        /// Why.
        reason: String,
    },
    /// A broker in the proposed ISR or leader cannot be in sync (fenced, unknown, not a replica).
    #[error("{topic}-{partition}: broker {broker_id} is ineligible: {reason}")]
    IneligibleReplica {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: i32,
        /// The broker.
        broker_id: BrokerId,
        /// Why.
        reason: String,
    },
    /// The preferred replica cannot lead now.
    #[error("{topic}-{partition}: preferred leader {preferred} is not available: {reason}")]
    PreferredLeaderNotAvailable {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: i32,
        /// The preferred replica.
        preferred: BrokerId,
        /// Why.
        reason: String,
    },
    /// The preferred replica already leads.
    #[error("{topic}-{partition}: the preferred leader already leads")]
    ElectionNotNeeded {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: i32,
    },
    /// The producer-id space is used up.
    #[error("producer ids are exhausted")]
    ProducerIdsExhausted,
    /// Cancel of a partition that is not being reassigned.
    #[error("{topic}-{partition}: no reassignment is in progress")]
    NoReassignmentInProgress {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: i32,
    },
    /// The broker was decommissioned and removed from the cluster.
    #[error("broker {broker_id} was decommissioned and removed from the cluster; add the node again to bring it back")]
    BrokerRetired {
        /// Broker id.
        broker_id: BrokerId,
    },
    /// No replica of the partition can lead.
    #[error("{topic}-{partition}: no live replica can lead")]
    EligibleLeadersNotAvailable {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: i32,
    },
    /// The broker still holds replicas or is needed.
    #[error("broker {broker_id} cannot be removed: {reason}")]
    BrokerInUse {
        /// Broker id.
        broker_id: BrokerId,
        /// Why.
        reason: String,
    },
    /// One command of a batch was refused, so none was applied.
    #[error("command {index} of the batch was refused: {source}")]
    InBatch {
        /// Position in the batch.
        index: usize,
        /// The refusal.
        source: Box<CommandError>,
    },
}

impl CommandError {
    /// The Kafka error code a broker should answer with for this refusal.
    pub fn kafka_error_code(&self) -> i16 {
        match self {
            CommandError::DuplicateBrokerRegistration { .. } => 101,
            CommandError::BrokerNotRegistered { .. } => 102,
            CommandError::StaleBrokerEpoch { .. } => 77,
            CommandError::InvalidRequest { .. } => 42,
            CommandError::InvalidTopicName { .. } => 17,
            CommandError::TopicAlreadyExists { .. } => 36,
            CommandError::InvalidTopicId { .. } => 42,
            CommandError::UnknownTopic { .. } | CommandError::UnknownPartition { .. } => 3,
            CommandError::InvalidPartitions { .. } => 37,
            CommandError::InvalidReplicationFactor { .. } => 38,
            CommandError::InvalidReplicaAssignment { .. } => 39,
            CommandError::InvalidConfig { .. } => 40,
            CommandError::FencedLeaderEpoch { .. } => 74,
            CommandError::UnknownLeaderEpoch { .. } => 75,
            CommandError::NotLeader { .. } => 6,
            CommandError::StalePartitionEpoch { .. } => 95,
            CommandError::InvalidIsr { .. } => 42,
            CommandError::IneligibleReplica { .. } => 107,
            CommandError::PreferredLeaderNotAvailable { .. } => 80,
            CommandError::ElectionNotNeeded { .. } => 84,
            CommandError::NoReassignmentInProgress { .. } => 85,
            CommandError::BrokerRetired { .. } => 102,
            CommandError::EligibleLeadersNotAvailable { .. } => 83,
            // BROKER_ID_NOT_REGISTERED is for unknown ids; a broker in use is an invalid request.
            CommandError::BrokerInUse { .. } => 42,
            // UNKNOWN_SERVER_ERROR: Kafka has no dedicated code; it never happens in practice.
            CommandError::ProducerIdsExhausted => -1,
            CommandError::InBatch { source, .. } => source.kafka_error_code(),
        }
    }
}

/// The result a command produces when applied.
pub type CommandResult = Result<CommandOutcome, CommandError>;

/// Checks a topic name against Kafka's rules (legal characters, length, not `.`/`..`).
pub fn validate_topic_name(name: &str) -> Result<(), CommandError> {
    let refuse = |reason: &str| {
        Err(CommandError::InvalidTopicName {
            name: name.to_owned(),
            reason: reason.to_owned(),
        })
    };
    if name.is_empty() {
        return refuse("the name is empty");
    }
    if name == "." || name == ".." {
        return refuse("'.' and '..' are not allowed");
    }
    if name.len() > TOPIC_NAME_MAX_LEN {
        return refuse("longer than 249 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return refuse("only ASCII letters, digits, '.', '_' and '-' are allowed");
    }
    Ok(())
}

impl MetadataImage {
    /// An empty image: no brokers, no topics, producer ids starting at 0.
    pub fn new() -> Self {
        Self {
            brokers: BTreeMap::new(),
            topics: BTreeMap::new(),
            broker_configs: BTreeMap::new(),
            group_configs: BTreeMap::new(),
            retired: BTreeSet::new(),
            cluster_id: None,
            client_quotas: QuotaTable::default(),
            next_producer_id: 0,
            next_broker_epoch: 1,
            scram_credentials: Arc::new(Vec::new()),
            acls: Arc::new(Vec::new()),
        }
    }

    /// The client quotas every node enforces.
    pub fn client_quotas(&self) -> &QuotaTable {
        &self.client_quotas
    }

    /// The SCRAM credentials every node authenticates with, sorted by user and mechanism.
    /// The same `Arc` until a command changes them.
    pub fn scram_credentials(&self) -> &Arc<Vec<CredentialRecord>> {
        &self.scram_credentials
    }

    /// The ACL bindings every node authorizes with. The same `Arc` until a command changes
    /// them.
    pub fn acls(&self) -> &Arc<Vec<AclBinding>> {
        &self.acls
    }

    /// All registered brokers, by id.
    pub fn brokers(&self) -> &BTreeMap<BrokerId, BrokerRegistration> {
        &self.brokers
    }

    /// One registered broker.
    pub fn broker(&self, id: BrokerId) -> Option<&BrokerRegistration> {
        self.brokers.get(&id)
    }

    /// Registered, unfenced brokers in id order: the ones that may lead and be placed on.
    pub fn live_brokers(&self) -> impl Iterator<Item = &BrokerRegistration> {
        self.brokers.values().filter(|b| !b.fenced)
    }

    /// Whether `id` is registered and not fenced.
    pub fn is_live(&self, id: BrokerId) -> bool {
        self.brokers.get(&id).is_some_and(|b| !b.fenced)
    }

    /// All topics, by name. A topic no command changed is the same `Arc` in both images
    /// (`Arc::ptr_eq` tells what changed between two images without comparing contents).
    pub fn topics(&self) -> &BTreeMap<String, Arc<TopicImage>> {
        &self.topics
    }

    /// One topic by name.
    pub fn topic(&self, name: &str) -> Option<&TopicImage> {
        self.topics.get(name).map(|t| &**t)
    }

    /// One topic by id (a scan: topic ids are looked up rarely, by Fetch v13+ and deletes).
    pub fn topic_by_id(&self, id: Uuid) -> Option<&TopicImage> {
        self.topics.values().find(|t| t.id == id).map(|t| &**t)
    }

    /// One partition.
    pub fn partition(&self, topic: &str, partition: i32) -> Option<&PartitionState> {
        self.topics.get(topic).and_then(|t| t.partition(partition))
    }

    /// The cluster id, once fixed.
    pub fn cluster_id(&self) -> Option<&str> {
        self.cluster_id.as_deref()
    }

    /// Dynamic broker configs by resource (`""` cluster default, `"<id>"` one broker).
    pub fn broker_configs(&self) -> &BTreeMap<String, BTreeMap<String, String>> {
        &self.broker_configs
    }

    /// Share group configs by group id.
    pub fn group_configs(&self) -> &BTreeMap<String, BTreeMap<String, String>> {
        &self.group_configs
    }

    /// The dynamic value of broker config `key` for `broker`: its own, else the cluster
    /// default, else `None` (the built-in default applies).
    pub fn broker_config(&self, broker: Option<BrokerId>, key: &str) -> Option<&str> {
        broker
            .and_then(|b| self.broker_configs.get(&b.to_string()))
            .and_then(|m| m.get(key))
            .or_else(|| self.broker_configs.get("").and_then(|m| m.get(key)))
            .map(String::as_str)
    }

    /// Start of the next producer-id block.
    pub fn next_producer_id(&self) -> i64 {
        self.next_producer_id
    }

    /// Applies one command. On `Err` the image is exactly as before.
    pub fn apply(&mut self, cmd: &MetadataCommand) -> CommandResult {
        match cmd {
            MetadataCommand::RegisterBroker {
                broker_id,
                incarnation,
                inter_node_addr,
                kafka_host,
                kafka_port,
                rack,
                http_addr,
                now_ms,
                listeners,
            } => self.register_broker(
                *broker_id,
                *incarnation,
                inter_node_addr,
                kafka_host,
                *kafka_port,
                rack.as_deref(),
                http_addr.as_deref(),
                *now_ms,
                listeners,
            ),
            MetadataCommand::BrokerHeartbeat {
                broker_id,
                broker_epoch,
                now_ms,
                shutting_down,
            } => self.heartbeat(*broker_id, *broker_epoch, *now_ms, *shutting_down),
            MetadataCommand::SetBrokerDiskFull {
                broker_id,
                broker_epoch,
                full,
            } => {
                let broker = self.registration_mut(*broker_id, *broker_epoch)?;
                broker.disk_full = *full;
                Ok(CommandOutcome::BrokerDiskFullSet)
            }
            MetadataCommand::FenceBroker {
                broker_id,
                broker_epoch,
            } => {
                let broker = self.registration_mut(*broker_id, *broker_epoch)?;
                broker.fenced = true;
                Ok(CommandOutcome::BrokerFenced)
            }
            MetadataCommand::UnfenceBroker {
                broker_id,
                broker_epoch,
            } => {
                let broker = self.registration_mut(*broker_id, *broker_epoch)?;
                broker.fenced = false;
                Ok(CommandOutcome::BrokerUnfenced)
            }
            MetadataCommand::CreateTopic {
                name,
                topic_id,
                configs,
                assignment,
            } => self.create_topic(name, *topic_id, configs, assignment),
            MetadataCommand::DeleteTopic { name } => match self.topics.remove(name) {
                Some(topic) => Ok(CommandOutcome::TopicDeleted { topic_id: topic.id }),
                None => Err(CommandError::UnknownTopic { name: name.clone() }),
            },
            MetadataCommand::AlterTopicConfigs { name, set, remove } => {
                self.alter_configs(name, set, remove)
            }
            MetadataCommand::CreatePartitions { name, assignment } => {
                self.create_partitions(name, assignment)
            }
            MetadataCommand::ChangeLeader {
                topic,
                partition,
                partition_epoch,
                leader,
                isr,
            } => self.change_leader(topic, *partition, *partition_epoch, *leader, isr),
            MetadataCommand::ElectPreferredLeader { topic, partition } => {
                self.elect_preferred(topic, *partition)
            }
            MetadataCommand::AlterIsr {
                topic,
                partition,
                leader,
                leader_epoch,
                partition_epoch,
                isr,
            } => self.alter_isr(
                topic,
                *partition,
                *leader,
                *leader_epoch,
                *partition_epoch,
                isr,
            ),
            MetadataCommand::AllocateProducerIds {
                broker_id,
                broker_epoch,
            } => {
                self.registration_mut(*broker_id, *broker_epoch)?;
                let first = self.next_producer_id;
                let next = first
                    .checked_add(PRODUCER_ID_BLOCK_SIZE)
                    .ok_or(CommandError::ProducerIdsExhausted)?;
                self.next_producer_id = next;
                Ok(CommandOutcome::ProducerIdsAllocated(ProducerIdBlock {
                    first,
                    size: PRODUCER_ID_BLOCK_SIZE,
                }))
            }
            MetadataCommand::AlterReassignment {
                topic,
                partition,
                target,
            } => self.alter_reassignment(topic, *partition, target.as_deref()),
            MetadataCommand::CompleteReassignment {
                topic,
                partition,
                partition_epoch,
            } => self.complete_reassignment(topic, *partition, *partition_epoch),
            MetadataCommand::ElectUncleanLeader { topic, partition } => {
                self.elect_unclean(topic, *partition)
            }
            MetadataCommand::SetDecommissioning {
                broker_id,
                decommissioning,
            } => {
                let broker =
                    self.brokers
                        .get_mut(broker_id)
                        .ok_or(CommandError::BrokerNotRegistered {
                            broker_id: *broker_id,
                        })?;
                broker.decommissioning = *decommissioning;
                Ok(CommandOutcome::DecommissioningSet)
            }
            MetadataCommand::UnregisterBroker { broker_id } => self.unregister(*broker_id),
            MetadataCommand::SetClusterId { cluster_id } => {
                if self.cluster_id.is_none() && !cluster_id.is_empty() {
                    self.cluster_id = Some(cluster_id.clone());
                }
                Ok(CommandOutcome::Noop)
            }
            MetadataCommand::ReadmitBroker { broker_id } => {
                self.retired.remove(broker_id);
                Ok(CommandOutcome::BrokerReadmitted)
            }
            MetadataCommand::AlterBrokerConfigs {
                resource,
                set,
                remove,
            } => self.alter_broker_configs(resource, set, remove),
            MetadataCommand::AlterGroupConfigs { group, set, remove } => {
                self.alter_group_configs(group, set, remove)
            }
            MetadataCommand::AlterClientQuotas {
                entity,
                set,
                remove,
            } => {
                let ops: Vec<(QuotaKey, Option<QuotaValue>)> = set
                    .iter()
                    .map(|(k, v)| (*k, Some(*v)))
                    .chain(remove.iter().map(|k| (*k, None)))
                    .collect();
                self.client_quotas.apply(entity, &ops);
                Ok(CommandOutcome::ClientQuotasAltered)
            }
            MetadataCommand::AlterScramCredentials { upserts, deletions } => {
                check_credentials(upserts)?;
                let mut all = (*self.scram_credentials).clone();
                all.retain(|r| {
                    !deletions
                        .iter()
                        .any(|(user, mechanism)| r.user == *user && r.mechanism == *mechanism)
                        && !upserts
                            .iter()
                            .any(|u| u.user == r.user && u.mechanism == r.mechanism)
                });
                all.extend(upserts.iter().cloned());
                all.sort_by(|a, b| (&a.user, &a.mechanism).cmp(&(&b.user, &b.mechanism)));
                self.scram_credentials = Arc::new(all);
                Ok(CommandOutcome::ScramCredentialsAltered)
            }
            MetadataCommand::BootstrapScramUsers { records } => {
                check_credentials(records)?;
                let fresh: Vec<&CredentialRecord> = records
                    .iter()
                    .filter(|r| !self.scram_credentials.iter().any(|c| c.user == r.user))
                    .collect();
                if !fresh.is_empty() {
                    let mut all = (*self.scram_credentials).clone();
                    all.extend(fresh.into_iter().cloned());
                    all.sort_by(|a, b| (&a.user, &a.mechanism).cmp(&(&b.user, &b.mechanism)));
                    self.scram_credentials = Arc::new(all);
                }
                Ok(CommandOutcome::ScramCredentialsAltered)
            }
            MetadataCommand::CreateAcls { bindings } => {
                if let Some(e) = bindings.iter().find_map(|b| b.validate().err()) {
                    return Err(CommandError::InvalidRequest {
                        reason: format!("invalid ACL binding: {e}"),
                    });
                }
                let mut all = (*self.acls).clone();
                for b in bindings {
                    if !all.contains(b) {
                        all.push(b.clone());
                    }
                }
                if all.len() != self.acls.len() {
                    self.acls = Arc::new(all);
                }
                Ok(CommandOutcome::AclsCreated)
            }
            MetadataCommand::DeleteAcls { filters } => {
                let mut all = (*self.acls).clone();
                let removed: Vec<Vec<AclBinding>> = filters
                    .iter()
                    .map(|f| {
                        let (gone, kept): (Vec<_>, Vec<_>) =
                            all.drain(..).partition(|b| f.matches(b));
                        all = kept;
                        gone
                    })
                    .collect();
                if all.len() != self.acls.len() {
                    self.acls = Arc::new(all);
                }
                Ok(CommandOutcome::AclsDeleted(removed))
            }
            MetadataCommand::Batch(cmds) => {
                // All or nothing: work on a copy and keep it only if every command applied.
                // Metadata images are small enough that the copy is cheap next to a Raft round.
                let mut scratch = self.clone();
                let mut outcomes = Vec::with_capacity(cmds.len());
                for (index, cmd) in cmds.iter().enumerate() {
                    match scratch.apply(cmd) {
                        Ok(outcome) => outcomes.push(outcome),
                        Err(source) => {
                            return Err(CommandError::InBatch {
                                index,
                                source: Box::new(source),
                            })
                        }
                    }
                }
                *self = scratch;
                Ok(CommandOutcome::Batch(outcomes))
            }
            // A refused command leaves the image as it was, so the others need no copy.
            MetadataCommand::Each(cmds) => Ok(CommandOutcome::Each(
                cmds.iter().map(|cmd| self.apply(cmd)).collect(),
            )),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn register_broker(
        &mut self,
        broker_id: BrokerId,
        incarnation: Uuid,
        inter_node_addr: &str,
        kafka_host: &str,
        kafka_port: u16,
        rack: Option<&str>,
        http_addr: Option<&str>,
        now_ms: u64,
        listeners: &[ListenerAddress],
    ) -> CommandResult {
        if broker_id < 0 {
            return Err(invalid(format!("broker id {broker_id} is negative")));
        }
        if self.retired.contains(&broker_id) {
            return Err(CommandError::BrokerRetired { broker_id });
        }
        if inter_node_addr.is_empty() || kafka_host.is_empty() || kafka_port == 0 {
            return Err(invalid(format!(
                "broker {broker_id}: inter-node address, Kafka host and Kafka port are all required"
            )));
        }
        if let Some(existing) = self.brokers.get_mut(&broker_id) {
            if existing.incarnation == incarnation {
                // The same process asking again (a retried proposal): idempotent, and it
                // proves the process is alive, so it counts as a heartbeat.
                existing.last_heartbeat_ms = now_ms;
                existing.heartbeat_count = existing.heartbeat_count.saturating_add(1);
                return Ok(CommandOutcome::BrokerRegistered {
                    broker_epoch: existing.epoch,
                });
            }
            if !existing.fenced {
                return Err(CommandError::DuplicateBrokerRegistration {
                    broker_id,
                    existing: existing.incarnation,
                    requested: incarnation,
                });
            }
        }
        // A restart does not end a decommissioning the operator asked for.
        let decommissioning = self
            .brokers
            .get(&broker_id)
            .is_some_and(|b| b.decommissioning);
        let epoch = self.next_broker_epoch;
        self.next_broker_epoch = epoch.saturating_add(1);
        self.brokers.insert(
            broker_id,
            BrokerRegistration {
                id: broker_id,
                incarnation,
                epoch,
                inter_node_addr: inter_node_addr.to_owned(),
                kafka_host: kafka_host.to_owned(),
                kafka_port,
                rack: rack.map(str::to_owned),
                fenced: false,
                shutting_down: false,
                last_heartbeat_ms: now_ms,
                heartbeat_count: 0,
                decommissioning,
                http_addr: http_addr.map(str::to_owned),
                listeners: listeners.to_vec(),
                // A new process samples its disk afresh and says so if it is full.
                disk_full: false,
            },
        );
        Ok(CommandOutcome::BrokerRegistered {
            broker_epoch: epoch,
        })
    }

    fn heartbeat(
        &mut self,
        broker_id: BrokerId,
        broker_epoch: i64,
        now_ms: u64,
        shutting_down: bool,
    ) -> CommandResult {
        let broker = self.registration_mut(broker_id, broker_epoch)?;
        broker.last_heartbeat_ms = now_ms;
        broker.heartbeat_count = broker.heartbeat_count.saturating_add(1);
        broker.shutting_down = shutting_down;
        Ok(CommandOutcome::HeartbeatAccepted {
            fenced: broker.fenced,
        })
    }

    fn registration_mut(
        &mut self,
        broker_id: BrokerId,
        broker_epoch: i64,
    ) -> Result<&mut BrokerRegistration, CommandError> {
        let broker = self
            .brokers
            .get_mut(&broker_id)
            .ok_or(CommandError::BrokerNotRegistered { broker_id })?;
        if broker.epoch != broker_epoch {
            return Err(CommandError::StaleBrokerEpoch {
                broker_id,
                given: broker_epoch,
                current: broker.epoch,
            });
        }
        Ok(broker)
    }

    fn create_topic(
        &mut self,
        name: &str,
        topic_id: Uuid,
        configs: &BTreeMap<String, String>,
        assignment: &[Vec<BrokerId>],
    ) -> CommandResult {
        validate_topic_name(name)?;
        if let Some(existing) = self.topics.get(name) {
            if existing.id == topic_id {
                // A retried proposal of the very same creation: already done.
                return Ok(CommandOutcome::TopicCreated { topic_id });
            }
            return Err(CommandError::TopicAlreadyExists {
                name: name.to_owned(),
            });
        }
        if topic_id.is_nil() {
            return Err(CommandError::InvalidTopicId {
                topic_id,
                reason: "the nil UUID is reserved".to_owned(),
            });
        }
        if let Some(other) = self.topic_by_id(topic_id) {
            return Err(CommandError::InvalidTopicId {
                topic_id,
                reason: format!("already used by topic {:?}", other.name),
            });
        }
        if assignment.is_empty() {
            return Err(CommandError::InvalidPartitions {
                reason: "a topic needs at least one partition".to_owned(),
            });
        }
        validate_config_keys(configs.keys())?;
        let replication_factor = assignment[0].len();
        let partitions = self.new_partitions(assignment, replication_factor)?;
        self.topics.insert(
            name.to_owned(),
            Arc::new(TopicImage {
                name: name.to_owned(),
                id: topic_id,
                configs: configs.clone(),
                partitions,
            }),
        );
        Ok(CommandOutcome::TopicCreated { topic_id })
    }

    fn create_partitions(&mut self, name: &str, assignment: &[Vec<BrokerId>]) -> CommandResult {
        let topic = self
            .topics
            .get(name)
            .ok_or_else(|| CommandError::UnknownTopic {
                name: name.to_owned(),
            })?;
        if assignment.is_empty() {
            return Err(CommandError::InvalidPartitions {
                reason: format!("no new partitions given for topic {name:?}"),
            });
        }
        let replication_factor = topic.partitions.first().map_or(0, |p| p.replicas.len());
        let total = topic.partitions.len() + assignment.len();
        let partition_count =
            i32::try_from(total).map_err(|_| CommandError::InvalidPartitions {
                reason: format!("{total} partitions exceed the INT32 partition numbers"),
            })?;
        let mut new = self.new_partitions(assignment, replication_factor)?;
        if let Some(topic) = self.topics.get_mut(name) {
            Arc::make_mut(topic).partitions.append(&mut new);
        }
        Ok(CommandOutcome::PartitionsCreated { partition_count })
    }

    /// Validates an assignment and builds the initial partition states: the ISR is the live
    /// replicas, the leader the first of them.
    fn new_partitions(
        &self,
        assignment: &[Vec<BrokerId>],
        replication_factor: usize,
    ) -> Result<Vec<PartitionState>, CommandError> {
        if i32::try_from(assignment.len()).is_err() {
            return Err(CommandError::InvalidPartitions {
                reason: "more partitions than INT32 partition numbers".to_owned(),
            });
        }
        let bad = |reason: String| Err(CommandError::InvalidReplicaAssignment { reason });
        let mut partitions = Vec::with_capacity(assignment.len());
        for (index, replicas) in assignment.iter().enumerate() {
            if replicas.is_empty() {
                return bad(format!("partition {index} has no replicas"));
            }
            if replicas.len() != replication_factor {
                return bad(format!(
                    "partition {index} has {} replicas, every partition of a topic needs {replication_factor}",
                    replicas.len()
                ));
            }
            let mut seen = BTreeSet::new();
            for &r in replicas {
                if !seen.insert(r) {
                    return bad(format!("partition {index} names broker {r} twice"));
                }
                if !self.brokers.contains_key(&r) {
                    return bad(format!(
                        "partition {index} names broker {r}, which is not registered"
                    ));
                }
            }
            let isr: Vec<BrokerId> = replicas
                .iter()
                .copied()
                .filter(|&r| self.is_live(r))
                .collect();
            let Some(&leader) = isr.first() else {
                return bad(format!(
                    "every replica of partition {index} is on a fenced broker"
                ));
            };
            partitions.push(PartitionState {
                replicas: replicas.clone(),
                leader: Some(leader),
                leader_epoch: 0,
                partition_epoch: 0,
                isr,
                adding: Vec::new(),
                removing: Vec::new(),
            });
        }
        Ok(partitions)
    }

    fn alter_configs(
        &mut self,
        name: &str,
        set: &BTreeMap<String, String>,
        remove: &[String],
    ) -> CommandResult {
        if !self.topics.contains_key(name) {
            return Err(CommandError::UnknownTopic {
                name: name.to_owned(),
            });
        }
        validate_config_keys(set.keys().chain(remove.iter()))?;
        if let Some(key) = remove.iter().find(|k| set.contains_key(k.as_str())) {
            return Err(CommandError::InvalidConfig {
                reason: format!("key {key:?} is both set and removed"),
            });
        }
        if let Some(topic) = self.topics.get_mut(name).map(Arc::make_mut) {
            for key in remove {
                topic.configs.remove(key);
            }
            for (k, v) in set {
                topic.configs.insert(k.clone(), v.clone());
            }
        }
        Ok(CommandOutcome::TopicConfigsAltered)
    }

    pub(crate) fn partition_mut(
        &mut self,
        topic: &str,
        partition: i32,
    ) -> Result<&mut PartitionState, CommandError> {
        let t = self
            .topics
            .get_mut(topic)
            .map(Arc::make_mut)
            .ok_or_else(|| CommandError::UnknownTopic {
                name: topic.to_owned(),
            })?;
        usize::try_from(partition)
            .ok()
            .and_then(|p| t.partitions.get_mut(p))
            .ok_or_else(|| CommandError::UnknownPartition {
                topic: topic.to_owned(),
                partition,
            })
    }

    pub(crate) fn partition_ref(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<&PartitionState, CommandError> {
        let t = self
            .topics
            .get(topic)
            .ok_or_else(|| CommandError::UnknownTopic {
                name: topic.to_owned(),
            })?;
        t.partition(partition)
            .ok_or_else(|| CommandError::UnknownPartition {
                topic: topic.to_owned(),
                partition,
            })
    }

    /// Checks that `isr` is a non-empty, duplicate-free subset of the partition's replicas
    /// made of registered brokers.
    fn check_isr_members(
        &self,
        topic: &str,
        partition: i32,
        state: &PartitionState,
        isr: &[BrokerId],
    ) -> Result<(), CommandError> {
        let invalid_isr = |reason: &str| CommandError::InvalidIsr {
            topic: topic.to_owned(),
            partition,
            isr: isr.to_vec(),
            reason: reason.to_owned(),
        };
        if isr.is_empty() {
            return Err(invalid_isr("the ISR may not be empty"));
        }
        let mut seen = BTreeSet::new();
        for &b in isr {
            if !seen.insert(b) {
                return Err(invalid_isr("a broker appears twice"));
            }
            let ineligible = |reason: &str| CommandError::IneligibleReplica {
                topic: topic.to_owned(),
                partition,
                broker_id: b,
                reason: reason.to_owned(),
            };
            if !self.brokers.contains_key(&b) {
                return Err(ineligible("not a registered broker"));
            }
            if !state.replicas.contains(&b) {
                return Err(ineligible("not a replica of this partition"));
            }
        }
        Ok(())
    }

    fn change_leader(
        &mut self,
        topic: &str,
        partition: i32,
        partition_epoch: i32,
        leader: Option<BrokerId>,
        isr: &[BrokerId],
    ) -> CommandResult {
        let state = self.partition_ref(topic, partition)?;
        check_partition_epoch(topic, partition, state, partition_epoch)?;
        self.check_isr_members(topic, partition, state, isr)?;
        if let Some(l) = leader {
            if !isr.contains(&l) {
                return Err(CommandError::InvalidIsr {
                    topic: topic.to_owned(),
                    partition,
                    isr: isr.to_vec(),
                    reason: format!("the new leader {l} is not in it"),
                });
            }
            if !self.is_live(l) {
                return Err(CommandError::IneligibleReplica {
                    topic: topic.to_owned(),
                    partition,
                    broker_id: l,
                    reason: "a fenced broker cannot lead".to_owned(),
                });
            }
        }
        let state = self.partition_mut(topic, partition)?;
        state.leader = leader;
        state.isr = isr.to_vec();
        // Saturating: an i32 epoch that has seen 2^31 leader changes has bigger problems, and
        // a panic in apply would stop every node at the same entry.
        state.leader_epoch = state.leader_epoch.saturating_add(1);
        state.partition_epoch = state.partition_epoch.saturating_add(1);
        Ok(CommandOutcome::LeaderChanged {
            leader,
            leader_epoch: state.leader_epoch,
            partition_epoch: state.partition_epoch,
        })
    }

    fn elect_preferred(&mut self, topic: &str, partition: i32) -> CommandResult {
        let state = self.partition_ref(topic, partition)?;
        let preferred = *state
            .replicas
            .first()
            .ok_or_else(|| CommandError::UnknownPartition {
                topic: topic.to_owned(),
                partition,
            })?;
        if state.leader == Some(preferred) {
            return Err(CommandError::ElectionNotNeeded {
                topic: topic.to_owned(),
                partition,
            });
        }
        let unavailable = |reason: &str| CommandError::PreferredLeaderNotAvailable {
            topic: topic.to_owned(),
            partition,
            preferred,
            reason: reason.to_owned(),
        };
        if !state.isr.contains(&preferred) {
            return Err(unavailable("it is not in the ISR"));
        }
        if !self.is_live(preferred) {
            return Err(unavailable("it is fenced"));
        }
        let state = self.partition_mut(topic, partition)?;
        state.leader = Some(preferred);
        state.leader_epoch = state.leader_epoch.saturating_add(1);
        state.partition_epoch = state.partition_epoch.saturating_add(1);
        Ok(CommandOutcome::LeaderChanged {
            leader: Some(preferred),
            leader_epoch: state.leader_epoch,
            partition_epoch: state.partition_epoch,
        })
    }

    fn alter_isr(
        &mut self,
        topic: &str,
        partition: i32,
        leader: BrokerId,
        leader_epoch: i32,
        partition_epoch: i32,
        isr: &[BrokerId],
    ) -> CommandResult {
        let state = self.partition_ref(topic, partition)?;
        if leader_epoch < state.leader_epoch {
            return Err(CommandError::FencedLeaderEpoch {
                topic: topic.to_owned(),
                partition,
                given: leader_epoch,
                current: state.leader_epoch,
            });
        }
        if leader_epoch > state.leader_epoch {
            return Err(CommandError::UnknownLeaderEpoch {
                topic: topic.to_owned(),
                partition,
                given: leader_epoch,
                current: state.leader_epoch,
            });
        }
        if state.leader != Some(leader) {
            return Err(CommandError::NotLeader {
                topic: topic.to_owned(),
                partition,
                broker_id: leader,
                leader: state.leader,
            });
        }
        check_partition_epoch(topic, partition, state, partition_epoch)?;
        if !isr.contains(&leader) {
            return Err(CommandError::InvalidIsr {
                topic: topic.to_owned(),
                partition,
                isr: isr.to_vec(),
                reason: format!("it does not contain the leader {leader}"),
            });
        }
        self.check_isr_members(topic, partition, state, isr)?;
        // A broker joining the ISR must be live: a fenced broker is not fetching, whatever
        // the leader last saw of it.
        if let Some(&b) = isr
            .iter()
            .find(|&&b| !state.isr.contains(&b) && !self.is_live(b))
        {
            return Err(CommandError::IneligibleReplica {
                topic: topic.to_owned(),
                partition,
                broker_id: b,
                reason: "a fenced broker cannot join the ISR".to_owned(),
            });
        }
        let state = self.partition_mut(topic, partition)?;
        state.isr = isr.to_vec();
        state.partition_epoch = state.partition_epoch.saturating_add(1);
        Ok(CommandOutcome::IsrAltered {
            isr: state.isr.clone(),
            partition_epoch: state.partition_epoch,
        })
    }
}

impl Default for MetadataImage {
    fn default() -> Self {
        Self::new()
    }
}

fn invalid(reason: String) -> CommandError {
    CommandError::InvalidRequest { reason }
}

/// Refuses a change decided on another partition epoch than the current one.
pub(crate) fn check_partition_epoch(
    topic: &str,
    partition: i32,
    state: &PartitionState,
    given: i32,
) -> Result<(), CommandError> {
    if state.partition_epoch == given {
        return Ok(());
    }
    Err(CommandError::StalePartitionEpoch {
        topic: topic.to_owned(),
        partition,
        given,
        current: state.partition_epoch,
    })
}

pub(crate) fn validate_config_keys<'a>(
    keys: impl Iterator<Item = &'a String>,
) -> Result<(), CommandError> {
    for key in keys {
        if key.trim().is_empty() {
            return Err(CommandError::InvalidConfig {
                reason: "a config key is empty".to_owned(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuid(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn register(id: BrokerId, incarnation: u128) -> MetadataCommand {
        MetadataCommand::RegisterBroker {
            broker_id: id,
            incarnation: uuid(incarnation),
            inter_node_addr: format!("127.0.0.1:{}", 9100 + id),
            kafka_host: "127.0.0.1".to_owned(),
            kafka_port: 9092,
            rack: None,
            http_addr: None,
            now_ms: 1_000,
            listeners: vec![],
        }
    }

    /// Applies a command that must succeed.
    fn ok(image: &mut MetadataImage, cmd: MetadataCommand) -> CommandOutcome {
        match image.apply(&cmd) {
            Ok(o) => o,
            Err(e) => panic!("{cmd:?} was refused: {e}"),
        }
    }

    /// Applies a command that must be refused, and checks the image did not change.
    fn refused(image: &mut MetadataImage, cmd: MetadataCommand) -> CommandError {
        let before = image.clone();
        match image.apply(&cmd) {
            Ok(o) => panic!("{cmd:?} was applied: {o:?}"),
            Err(e) => {
                assert_eq!(*image, before, "a refused command changed the image");
                e
            }
        }
    }

    fn credential(
        user: &str,
        alg: spate_auth::ScramAlgorithm,
        password: &[u8],
    ) -> CredentialRecord {
        let c = spate_auth::ScramCredential::derive(alg, password, b"salt", 4096);
        CredentialRecord::new(user, alg, &c)
    }

    #[test]
    fn bootstrap_users_are_added_only_where_a_user_has_no_credential() {
        use spate_auth::ScramAlgorithm::{Sha256, Sha512};
        let mut image = MetadataImage::new();
        ok(
            &mut image,
            MetadataCommand::AlterScramCredentials {
                upserts: vec![credential("admin", Sha512, b"changed")],
                deletions: vec![],
            },
        );
        ok(
            &mut image,
            MetadataCommand::BootstrapScramUsers {
                records: vec![
                    credential("admin", Sha256, b"bootstrap"),
                    credential("admin", Sha512, b"bootstrap"),
                    credential("bob", Sha256, b"bootstrap"),
                ],
            },
        );
        let c = image.scram_credentials();
        // admin keeps the one credential someone set; bob gets his.
        assert_eq!(
            c.iter()
                .map(|r| (r.user.as_str(), r.mechanism.as_str()))
                .collect::<Vec<_>>(),
            [("admin", "SCRAM-SHA-512"), ("bob", "SCRAM-SHA-256")]
        );
        assert_eq!(c[0], credential("admin", Sha512, b"changed"));
    }

    #[test]
    fn scram_credentials_are_replaced_removed_and_bad_ones_refused() {
        use spate_auth::ScramAlgorithm::{Sha256, Sha512};
        let mut image = MetadataImage::new();
        ok(
            &mut image,
            MetadataCommand::AlterScramCredentials {
                upserts: vec![
                    credential("bob", Sha256, b"a"),
                    credential("amy", Sha512, b"a"),
                ],
                deletions: vec![],
            },
        );
        ok(
            &mut image,
            MetadataCommand::AlterScramCredentials {
                upserts: vec![credential("bob", Sha256, b"b")],
                deletions: vec![
                    ("amy".into(), "SCRAM-SHA-512".into()),
                    ("nobody".into(), "SCRAM-SHA-256".into()),
                ],
            },
        );
        assert_eq!(
            *image.scram_credentials().as_ref(),
            vec![credential("bob", Sha256, b"b")]
        );
        let mut bad = credential("bob", Sha256, b"c");
        bad.stored_key = "AAAA".into();
        let e = refused(
            &mut image,
            MetadataCommand::AlterScramCredentials {
                upserts: vec![bad],
                deletions: vec![],
            },
        );
        assert!(e.to_string().contains("key length"), "{e}");
    }

    #[test]
    fn acls_are_created_once_deleted_by_filter_and_invalid_ones_refused() {
        use spate_auth::acl::{Operation, PatternType, Permission, ResourceType};
        let read = AclBinding {
            resource_type: ResourceType::Topic,
            name: "t".into(),
            pattern: PatternType::Literal,
            principal: "User:alice".into(),
            host: "*".into(),
            operation: Operation::Read,
            permission: Permission::Allow,
        };
        let write = AclBinding {
            operation: Operation::Write,
            ..read.clone()
        };
        let mut image = MetadataImage::new();
        ok(
            &mut image,
            MetadataCommand::CreateAcls {
                bindings: vec![read.clone(), write.clone(), read.clone()],
            },
        );
        assert_eq!(*image.acls().as_ref(), vec![read.clone(), write.clone()]);
        refused(
            &mut image,
            MetadataCommand::CreateAcls {
                bindings: vec![AclBinding {
                    principal: "alice".into(),
                    ..read.clone()
                }],
            },
        );
        let filter = |op| AclFilter {
            resource_type: ResourceType::Any,
            name: None,
            pattern: PatternType::Any,
            principal: None,
            host: None,
            operation: op,
            permission: Permission::Any,
        };
        let out = ok(
            &mut image,
            MetadataCommand::DeleteAcls {
                filters: vec![filter(Operation::Write), filter(Operation::Describe)],
            },
        );
        assert_eq!(out, CommandOutcome::AclsDeleted(vec![vec![write], vec![]]));
        assert_eq!(*image.acls().as_ref(), vec![read]);
    }

    fn epoch_of(image: &MetadataImage, id: BrokerId) -> i64 {
        image.broker(id).map(|b| b.epoch).unwrap()
    }

    /// Three live brokers 1, 2, 3 and topic "t" with 2 partitions on [1,2,3] and [2,3,1].
    fn cluster() -> MetadataImage {
        let mut image = MetadataImage::new();
        for id in 1..=3 {
            ok(&mut image, register(id, id as u128));
        }
        ok(
            &mut image,
            MetadataCommand::CreateTopic {
                name: "t".to_owned(),
                topic_id: uuid(100),
                configs: BTreeMap::new(),
                assignment: vec![vec![1, 2, 3], vec![2, 3, 1]],
            },
        );
        image
    }

    #[test]
    fn a_change_copies_only_the_topic_it_touches() {
        let mut image = cluster();
        ok(
            &mut image,
            MetadataCommand::CreateTopic {
                name: "u".to_owned(),
                topic_id: uuid(101),
                configs: BTreeMap::new(),
                assignment: vec![vec![1, 2, 3]],
            },
        );
        let before = image.clone();
        ok(&mut image, alter_isr(vec![1, 2], 0, 0));
        let shared = |name: &str| Arc::ptr_eq(&before.topics()[name], &image.topics()[name]);
        assert!(!shared("t"), "the changed topic is a copy");
        assert!(shared("u"), "the other topic is shared, not copied");
        assert_ne!(before.topics()["t"], image.topics()["t"]);
        // A snapshot still round-trips through JSON.
        let json = serde_json::to_vec(&image).unwrap();
        let back: MetadataImage = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, image);
    }

    #[test]
    fn each_applies_or_refuses_its_commands_one_by_one() {
        let mut image = cluster();
        let out = ok(
            &mut image,
            MetadataCommand::Each(vec![
                alter_isr(vec![1, 2], 0, 0),
                // Stale partition epoch: refused alone, the first one stands.
                alter_isr(vec![1], 0, 0),
            ]),
        );
        let CommandOutcome::Each(results) = out else {
            panic!("not an Each outcome: {out:?}");
        };
        assert!(results[0].is_ok(), "{results:?}");
        assert!(
            matches!(results[1], Err(CommandError::StalePartitionEpoch { .. })),
            "{results:?}"
        );
        assert_eq!(image.partition("t", 0).unwrap().isr, vec![1, 2]);
    }

    fn fence(image: &mut MetadataImage, id: BrokerId) {
        let broker_epoch = epoch_of(image, id);
        ok(
            image,
            MetadataCommand::FenceBroker {
                broker_id: id,
                broker_epoch,
            },
        );
    }

    fn alter_isr(isr: Vec<BrokerId>, leader_epoch: i32, partition_epoch: i32) -> MetadataCommand {
        MetadataCommand::AlterIsr {
            topic: "t".to_owned(),
            partition: 0,
            leader: 1,
            leader_epoch,
            partition_epoch,
            isr,
        }
    }

    #[test]
    fn register_broker_assigns_increasing_epochs_and_starts_unfenced() {
        let mut image = MetadataImage::new();
        assert_eq!(
            ok(&mut image, register(1, 1)),
            CommandOutcome::BrokerRegistered { broker_epoch: 1 }
        );
        assert_eq!(
            ok(&mut image, register(2, 2)),
            CommandOutcome::BrokerRegistered { broker_epoch: 2 }
        );
        let b = image.broker(1).unwrap();
        assert!(!b.fenced);
        assert_eq!(b.inter_node_addr, "127.0.0.1:9101");
        assert_eq!(image.live_brokers().count(), 2);
    }

    #[test]
    fn register_broker_again_with_same_incarnation_is_idempotent() {
        let mut image = MetadataImage::new();
        ok(&mut image, register(1, 7));
        assert_eq!(
            ok(&mut image, register(1, 7)),
            CommandOutcome::BrokerRegistered { broker_epoch: 1 }
        );
        assert_eq!(image.broker(1).unwrap().heartbeat_count, 1);
    }

    #[test]
    fn register_duplicate_live_broker_id_with_other_incarnation_is_refused() {
        let mut image = MetadataImage::new();
        ok(&mut image, register(1, 7));
        let err = refused(&mut image, register(1, 8));
        assert!(matches!(
            err,
            CommandError::DuplicateBrokerRegistration { broker_id: 1, .. }
        ));
        assert_eq!(err.kafka_error_code(), 101);
        assert!(err.to_string().contains("already registered"));
    }

    #[test]
    fn register_new_incarnation_replaces_a_fenced_registration_with_a_new_epoch() {
        let mut image = MetadataImage::new();
        ok(&mut image, register(1, 7));
        fence(&mut image, 1);
        assert_eq!(
            ok(&mut image, register(1, 8)),
            CommandOutcome::BrokerRegistered { broker_epoch: 2 }
        );
        let b = image.broker(1).unwrap();
        assert_eq!(b.incarnation, uuid(8));
        assert!(!b.fenced);
    }

    #[test]
    fn register_broker_with_negative_id_or_missing_address_is_refused() {
        let mut image = MetadataImage::new();
        refused(&mut image, register(-1, 1));
        let mut cmd = register(1, 1);
        if let MetadataCommand::RegisterBroker { kafka_port, .. } = &mut cmd {
            *kafka_port = 0;
        }
        let err = refused(&mut image, cmd);
        assert!(matches!(err, CommandError::InvalidRequest { .. }));
    }

    #[test]
    fn heartbeat_records_time_and_counts() {
        let mut image = MetadataImage::new();
        ok(&mut image, register(1, 1));
        let out = ok(
            &mut image,
            MetadataCommand::BrokerHeartbeat {
                broker_id: 1,
                broker_epoch: 1,
                now_ms: 5_000,
                shutting_down: false,
            },
        );
        assert_eq!(out, CommandOutcome::HeartbeatAccepted { fenced: false });
        let b = image.broker(1).unwrap();
        assert_eq!(b.last_heartbeat_ms, 5_000);
        assert_eq!(b.heartbeat_count, 1);
    }

    #[test]
    fn heartbeat_can_request_controlled_shutdown() {
        let mut image = MetadataImage::new();
        ok(&mut image, register(1, 1));
        ok(
            &mut image,
            MetadataCommand::BrokerHeartbeat {
                broker_id: 1,
                broker_epoch: 1,
                now_ms: 5_000,
                shutting_down: true,
            },
        );
        assert!(image.broker(1).unwrap().shutting_down);
    }

    #[test]
    fn heartbeat_with_stale_epoch_or_unknown_broker_is_refused() {
        let mut image = MetadataImage::new();
        ok(&mut image, register(1, 1));
        let err = refused(
            &mut image,
            MetadataCommand::BrokerHeartbeat {
                broker_id: 1,
                broker_epoch: 99,
                now_ms: 5_000,
                shutting_down: false,
            },
        );
        assert!(matches!(
            err,
            CommandError::StaleBrokerEpoch {
                given: 99,
                current: 1,
                ..
            }
        ));
        assert_eq!(err.kafka_error_code(), 77);
        let err = refused(
            &mut image,
            MetadataCommand::BrokerHeartbeat {
                broker_id: 2,
                broker_epoch: 1,
                now_ms: 5_000,
                shutting_down: false,
            },
        );
        assert_eq!(err, CommandError::BrokerNotRegistered { broker_id: 2 });
    }

    #[test]
    fn fence_and_unfence_broker_toggle_liveness() {
        let mut image = cluster();
        fence(&mut image, 2);
        assert!(image.broker(2).unwrap().fenced);
        assert!(!image.is_live(2));
        assert_eq!(image.live_brokers().count(), 2);
        let broker_epoch = epoch_of(&image, 2);
        ok(
            &mut image,
            MetadataCommand::UnfenceBroker {
                broker_id: 2,
                broker_epoch,
            },
        );
        assert!(image.is_live(2));
    }

    #[test]
    fn fence_with_stale_broker_epoch_is_refused() {
        let mut image = cluster();
        let err = refused(
            &mut image,
            MetadataCommand::FenceBroker {
                broker_id: 2,
                broker_epoch: 0,
            },
        );
        assert!(matches!(err, CommandError::StaleBrokerEpoch { .. }));
        let err = refused(
            &mut image,
            MetadataCommand::UnfenceBroker {
                broker_id: 9,
                broker_epoch: 1,
            },
        );
        assert_eq!(err, CommandError::BrokerNotRegistered { broker_id: 9 });
    }

    #[test]
    fn create_topic_sets_leader_to_first_replica_and_isr_to_live_replicas() {
        let mut image = cluster();
        fence(&mut image, 1);
        ok(
            &mut image,
            MetadataCommand::CreateTopic {
                name: "u".to_owned(),
                topic_id: uuid(200),
                configs: BTreeMap::from([("cleanup.policy".to_owned(), "compact".to_owned())]),
                assignment: vec![vec![1, 2, 3]],
            },
        );
        let topic = image.topic("u").unwrap();
        assert_eq!(topic.id, uuid(200));
        assert_eq!(topic.configs["cleanup.policy"], "compact");
        let p = &topic.partitions[0];
        assert_eq!(p.replicas, vec![1, 2, 3]);
        assert_eq!(p.isr, vec![2, 3]);
        assert_eq!(p.leader, Some(2));
        assert_eq!((p.leader_epoch, p.partition_epoch), (0, 0));
        assert_eq!(image.topic_by_id(uuid(200)).unwrap().name, "u");
    }

    #[test]
    fn create_topic_retried_with_same_id_is_idempotent_but_another_id_is_refused() {
        let mut image = cluster();
        let again = MetadataCommand::CreateTopic {
            name: "t".to_owned(),
            topic_id: uuid(100),
            configs: BTreeMap::new(),
            assignment: vec![vec![1]],
        };
        assert_eq!(
            ok(&mut image, again),
            CommandOutcome::TopicCreated {
                topic_id: uuid(100)
            }
        );
        assert_eq!(image.topic("t").unwrap().partitions.len(), 2);
        let err = refused(
            &mut image,
            MetadataCommand::CreateTopic {
                name: "t".to_owned(),
                topic_id: uuid(101),
                configs: BTreeMap::new(),
                assignment: vec![vec![1]],
            },
        );
        assert_eq!(
            err,
            CommandError::TopicAlreadyExists {
                name: "t".to_owned()
            }
        );
        assert_eq!(err.kafka_error_code(), 36);
    }

    #[test]
    fn create_topic_with_bad_name_id_or_assignment_is_refused() {
        let mut image = cluster();
        let create =
            |name: &str, id: u128, assignment: Vec<Vec<BrokerId>>| MetadataCommand::CreateTopic {
                name: name.to_owned(),
                topic_id: uuid(id),
                configs: BTreeMap::new(),
                assignment,
            };
        for name in ["", ".", "..", "has space", "slash/no", &"x".repeat(250)] {
            let err = refused(&mut image, create(name, 300, vec![vec![1]]));
            assert!(
                matches!(err, CommandError::InvalidTopicName { .. }),
                "{name:?}: {err}"
            );
            assert_eq!(err.kafka_error_code(), 17);
        }
        let err = refused(&mut image, create("v", 0, vec![vec![1]]));
        assert!(matches!(err, CommandError::InvalidTopicId { .. }));
        let err = refused(&mut image, create("v", 100, vec![vec![1]]));
        assert!(matches!(err, CommandError::InvalidTopicId { .. }));
        let err = refused(&mut image, create("v", 300, vec![]));
        assert_eq!(err.kafka_error_code(), 37);
        for assignment in [
            vec![vec![]],
            vec![vec![1, 1]],
            vec![vec![1, 9]],
            vec![vec![1, 2], vec![3]],
        ] {
            let err = refused(&mut image, create("v", 300, assignment.clone()));
            assert!(
                matches!(err, CommandError::InvalidReplicaAssignment { .. }),
                "{assignment:?}: {err}"
            );
            assert_eq!(err.kafka_error_code(), 39);
        }
    }

    #[test]
    fn create_topic_entirely_on_fenced_brokers_is_refused() {
        let mut image = cluster();
        fence(&mut image, 1);
        fence(&mut image, 2);
        let err = refused(
            &mut image,
            MetadataCommand::CreateTopic {
                name: "v".to_owned(),
                topic_id: uuid(300),
                configs: BTreeMap::new(),
                assignment: vec![vec![1, 2]],
            },
        );
        assert!(err.to_string().contains("fenced"), "{err}");
    }

    #[test]
    fn delete_topic_removes_it_and_unknown_topic_is_refused() {
        let mut image = cluster();
        assert_eq!(
            ok(
                &mut image,
                MetadataCommand::DeleteTopic {
                    name: "t".to_owned()
                }
            ),
            CommandOutcome::TopicDeleted {
                topic_id: uuid(100)
            }
        );
        assert!(image.topic("t").is_none());
        let err = refused(
            &mut image,
            MetadataCommand::DeleteTopic {
                name: "t".to_owned(),
            },
        );
        assert_eq!(err.kafka_error_code(), 3);
    }

    #[test]
    fn alter_topic_configs_sets_and_removes_keys() {
        let mut image = cluster();
        ok(
            &mut image,
            MetadataCommand::AlterTopicConfigs {
                name: "t".to_owned(),
                set: BTreeMap::from([
                    ("retention.ms".to_owned(), "1000".to_owned()),
                    ("segment.bytes".to_owned(), "1024".to_owned()),
                ]),
                remove: vec![],
            },
        );
        ok(
            &mut image,
            MetadataCommand::AlterTopicConfigs {
                name: "t".to_owned(),
                set: BTreeMap::new(),
                remove: vec!["segment.bytes".to_owned()],
            },
        );
        let configs = &image.topic("t").unwrap().configs;
        assert_eq!(configs.len(), 1);
        assert_eq!(configs["retention.ms"], "1000");
    }

    #[test]
    fn alter_topic_configs_with_unknown_topic_or_bad_keys_is_refused() {
        let mut image = cluster();
        let err = refused(
            &mut image,
            MetadataCommand::AlterTopicConfigs {
                name: "nope".to_owned(),
                set: BTreeMap::new(),
                remove: vec![],
            },
        );
        assert!(matches!(err, CommandError::UnknownTopic { .. }));
        let err = refused(
            &mut image,
            MetadataCommand::AlterTopicConfigs {
                name: "t".to_owned(),
                set: BTreeMap::from([("a".to_owned(), "1".to_owned())]),
                remove: vec!["a".to_owned()],
            },
        );
        assert_eq!(err.kafka_error_code(), 40);
        let err = refused(
            &mut image,
            MetadataCommand::AlterTopicConfigs {
                name: "t".to_owned(),
                set: BTreeMap::from([(" ".to_owned(), "1".to_owned())]),
                remove: vec![],
            },
        );
        assert!(matches!(err, CommandError::InvalidConfig { .. }));
    }

    #[test]
    fn create_partitions_appends_with_the_same_replication_factor() {
        let mut image = cluster();
        let out = ok(
            &mut image,
            MetadataCommand::CreatePartitions {
                name: "t".to_owned(),
                assignment: vec![vec![3, 1, 2]],
            },
        );
        assert_eq!(
            out,
            CommandOutcome::PartitionsCreated { partition_count: 3 }
        );
        let p = image.partition("t", 2).unwrap();
        assert_eq!(p.leader, Some(3));
        assert_eq!(p.isr, vec![3, 1, 2]);
    }

    #[test]
    fn create_partitions_with_other_replication_factor_or_none_or_unknown_topic_is_refused() {
        let mut image = cluster();
        let err = refused(
            &mut image,
            MetadataCommand::CreatePartitions {
                name: "t".to_owned(),
                assignment: vec![vec![1]],
            },
        );
        assert_eq!(err.kafka_error_code(), 39);
        let err = refused(
            &mut image,
            MetadataCommand::CreatePartitions {
                name: "t".to_owned(),
                assignment: vec![],
            },
        );
        assert_eq!(err.kafka_error_code(), 37);
        let err = refused(
            &mut image,
            MetadataCommand::CreatePartitions {
                name: "x".to_owned(),
                assignment: vec![vec![1, 2, 3]],
            },
        );
        assert_eq!(err.kafka_error_code(), 3);
    }

    #[test]
    fn change_leader_bumps_leader_and_partition_epochs() {
        let mut image = cluster();
        fence(&mut image, 1);
        let out = ok(
            &mut image,
            MetadataCommand::ChangeLeader {
                topic: "t".to_owned(),
                partition: 0,
                partition_epoch: 0,
                leader: Some(2),
                isr: vec![2, 3],
            },
        );
        assert_eq!(
            out,
            CommandOutcome::LeaderChanged {
                leader: Some(2),
                leader_epoch: 1,
                partition_epoch: 1
            }
        );
        let p = image.partition("t", 0).unwrap();
        assert_eq!(p.isr, vec![2, 3]);
        assert_eq!(p.leader_or_no_leader(), 2);
    }

    #[test]
    fn change_leader_to_none_takes_the_partition_offline() {
        let mut image = cluster();
        ok(
            &mut image,
            MetadataCommand::ChangeLeader {
                topic: "t".to_owned(),
                partition: 0,
                partition_epoch: 0,
                leader: None,
                isr: vec![1],
            },
        );
        let p = image.partition("t", 0).unwrap();
        assert_eq!(p.leader, None);
        assert_eq!(p.leader_or_no_leader(), NO_LEADER);
        assert_eq!(p.leader_epoch, 1);
    }

    #[test]
    fn change_leader_with_stale_partition_epoch_or_bad_leader_is_refused() {
        let mut image = cluster();
        let change = |partition_epoch, leader, isr: Vec<BrokerId>| MetadataCommand::ChangeLeader {
            topic: "t".to_owned(),
            partition: 0,
            partition_epoch,
            leader,
            isr,
        };
        let err = refused(&mut image, change(5, Some(2), vec![2]));
        assert_eq!(err.kafka_error_code(), 95);
        let err = refused(&mut image, change(0, Some(2), vec![3]));
        assert!(matches!(err, CommandError::InvalidIsr { .. }));
        let err = refused(&mut image, change(0, None, vec![]));
        assert!(matches!(err, CommandError::InvalidIsr { .. }));
        let err = refused(&mut image, change(0, Some(2), vec![2, 4]));
        assert!(matches!(err, CommandError::IneligibleReplica { .. }));
        fence(&mut image, 2);
        let err = refused(&mut image, change(0, Some(2), vec![2]));
        assert!(
            err.to_string().contains("fenced broker cannot lead"),
            "{err}"
        );
        let err = refused(
            &mut image,
            MetadataCommand::ChangeLeader {
                topic: "t".to_owned(),
                partition: 7,
                partition_epoch: 0,
                leader: None,
                isr: vec![1],
            },
        );
        assert!(matches!(err, CommandError::UnknownPartition { .. }));
    }

    #[test]
    fn elect_preferred_leader_moves_leadership_back() {
        let mut image = cluster();
        ok(
            &mut image,
            MetadataCommand::ChangeLeader {
                topic: "t".to_owned(),
                partition: 0,
                partition_epoch: 0,
                leader: Some(2),
                isr: vec![1, 2, 3],
            },
        );
        let elect = MetadataCommand::ElectPreferredLeader {
            topic: "t".to_owned(),
            partition: 0,
        };
        let out = ok(&mut image, elect.clone());
        assert_eq!(
            out,
            CommandOutcome::LeaderChanged {
                leader: Some(1),
                leader_epoch: 2,
                partition_epoch: 2
            }
        );
        let err = refused(&mut image, elect);
        assert_eq!(err.kafka_error_code(), 84);
    }

    #[test]
    fn elect_preferred_leader_out_of_isr_or_fenced_is_refused() {
        let mut image = cluster();
        ok(
            &mut image,
            MetadataCommand::ChangeLeader {
                topic: "t".to_owned(),
                partition: 0,
                partition_epoch: 0,
                leader: Some(2),
                isr: vec![2, 3],
            },
        );
        let elect = MetadataCommand::ElectPreferredLeader {
            topic: "t".to_owned(),
            partition: 0,
        };
        let err = refused(&mut image, elect.clone());
        assert!(err.to_string().contains("not in the ISR"), "{err}");
        ok(&mut image, alter_isr_as(2, vec![2, 3, 1], 1, 1));
        fence(&mut image, 1);
        let err = refused(&mut image, elect);
        assert_eq!(err.kafka_error_code(), 80);
    }

    fn alter_isr_as(
        leader: BrokerId,
        isr: Vec<BrokerId>,
        leader_epoch: i32,
        partition_epoch: i32,
    ) -> MetadataCommand {
        MetadataCommand::AlterIsr {
            topic: "t".to_owned(),
            partition: 0,
            leader,
            leader_epoch,
            partition_epoch,
            isr,
        }
    }

    #[test]
    fn alter_isr_shrinks_and_expands_and_bumps_partition_epoch_only() {
        let mut image = cluster();
        let out = ok(&mut image, alter_isr(vec![1, 2], 0, 0));
        assert_eq!(
            out,
            CommandOutcome::IsrAltered {
                isr: vec![1, 2],
                partition_epoch: 1
            }
        );
        ok(&mut image, alter_isr(vec![1, 2, 3], 0, 1));
        let p = image.partition("t", 0).unwrap();
        assert_eq!(p.isr, vec![1, 2, 3]);
        assert_eq!((p.leader_epoch, p.partition_epoch), (0, 2));
    }

    #[test]
    fn alter_isr_with_stale_leader_epoch_is_refused() {
        let mut image = cluster();
        ok(
            &mut image,
            MetadataCommand::ChangeLeader {
                topic: "t".to_owned(),
                partition: 0,
                partition_epoch: 0,
                leader: Some(1),
                isr: vec![1, 2, 3],
            },
        );
        let err = refused(&mut image, alter_isr(vec![1, 2], 0, 1));
        assert!(matches!(
            err,
            CommandError::FencedLeaderEpoch {
                given: 0,
                current: 1,
                ..
            }
        ));
        assert_eq!(err.kafka_error_code(), 74);
    }

    #[test]
    fn alter_isr_with_future_leader_epoch_is_refused() {
        let mut image = cluster();
        let err = refused(&mut image, alter_isr(vec![1, 2], 3, 0));
        assert_eq!(err.kafka_error_code(), 75);
    }

    #[test]
    fn alter_isr_with_stale_partition_epoch_is_refused() {
        let mut image = cluster();
        ok(&mut image, alter_isr(vec![1, 2], 0, 0));
        let err = refused(&mut image, alter_isr(vec![1], 0, 0));
        assert!(matches!(
            err,
            CommandError::StalePartitionEpoch {
                given: 0,
                current: 1,
                ..
            }
        ));
        assert_eq!(err.kafka_error_code(), 95);
    }

    #[test]
    fn alter_isr_from_a_non_leader_is_refused() {
        let mut image = cluster();
        let err = refused(&mut image, alter_isr_as(2, vec![2, 3], 0, 0));
        assert!(matches!(err, CommandError::NotLeader { broker_id: 2, .. }));
    }

    #[test]
    fn alter_isr_without_the_leader_is_refused() {
        let mut image = cluster();
        let err = refused(&mut image, alter_isr(vec![2, 3], 0, 0));
        assert!(
            err.to_string().contains("does not contain the leader 1"),
            "{err}"
        );
    }

    #[test]
    fn alter_isr_naming_unknown_or_non_replica_brokers_is_refused() {
        let mut image = cluster();
        ok(&mut image, register(4, 4));
        let err = refused(&mut image, alter_isr(vec![1, 9], 0, 0));
        assert!(err.to_string().contains("not a registered broker"), "{err}");
        let err = refused(&mut image, alter_isr(vec![1, 4], 0, 0));
        assert!(err.to_string().contains("not a replica"), "{err}");
        assert_eq!(err.kafka_error_code(), 107);
        let err = refused(&mut image, alter_isr(vec![1, 1], 0, 0));
        assert!(matches!(err, CommandError::InvalidIsr { .. }));
    }

    #[test]
    fn alter_isr_adding_a_fenced_broker_is_refused_but_keeping_one_is_allowed() {
        let mut image = cluster();
        ok(&mut image, alter_isr(vec![1, 2], 0, 0));
        fence(&mut image, 3);
        let err = refused(&mut image, alter_isr(vec![1, 2, 3], 0, 1));
        assert!(
            err.to_string().contains("fenced broker cannot join"),
            "{err}"
        );
        fence(&mut image, 2);
        ok(&mut image, alter_isr(vec![1, 2], 0, 1));
    }

    #[test]
    fn allocate_producer_ids_hands_out_disjoint_blocks() {
        let mut image = cluster();
        let mut blocks = Vec::new();
        for broker in [1, 2, 1] {
            let broker_epoch = epoch_of(&image, broker);
            match ok(
                &mut image,
                MetadataCommand::AllocateProducerIds {
                    broker_id: broker,
                    broker_epoch,
                },
            ) {
                CommandOutcome::ProducerIdsAllocated(b) => blocks.push(b),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(
            blocks.iter().map(|b| b.first).collect::<Vec<_>>(),
            vec![0, 1000, 2000]
        );
        assert!(blocks.iter().all(|b| b.size == PRODUCER_ID_BLOCK_SIZE));
        assert_eq!(image.next_producer_id(), 3000);
    }

    #[test]
    fn allocate_producer_ids_with_stale_epoch_or_when_exhausted_is_refused() {
        let mut image = cluster();
        let err = refused(
            &mut image,
            MetadataCommand::AllocateProducerIds {
                broker_id: 1,
                broker_epoch: 42,
            },
        );
        assert!(matches!(err, CommandError::StaleBrokerEpoch { .. }));
        image.next_producer_id = i64::MAX - 10;
        let err = refused(
            &mut image,
            MetadataCommand::AllocateProducerIds {
                broker_id: 1,
                broker_epoch: 1,
            },
        );
        assert_eq!(err, CommandError::ProducerIdsExhausted);
    }

    #[test]
    fn batch_applies_all_commands_or_none() {
        let mut image = cluster();
        let out = ok(
            &mut image,
            MetadataCommand::Batch(vec![
                MetadataCommand::FenceBroker {
                    broker_id: 1,
                    broker_epoch: 1,
                },
                MetadataCommand::ChangeLeader {
                    topic: "t".to_owned(),
                    partition: 0,
                    partition_epoch: 0,
                    leader: Some(2),
                    isr: vec![2, 3],
                },
            ]),
        );
        assert!(matches!(out, CommandOutcome::Batch(ref v) if v.len() == 2));
        let err = refused(
            &mut image,
            MetadataCommand::Batch(vec![
                MetadataCommand::DeleteTopic {
                    name: "t".to_owned(),
                },
                MetadataCommand::DeleteTopic {
                    name: "t".to_owned(),
                },
            ]),
        );
        assert!(matches!(err, CommandError::InBatch { index: 1, .. }));
        assert_eq!(err.kafka_error_code(), 3);
        assert!(image.topic("t").is_some());
    }

    #[test]
    fn apply_is_deterministic_across_replicas() {
        let cmds = [
            register(1, 1),
            register(2, 2),
            MetadataCommand::CreateTopic {
                name: "a".to_owned(),
                topic_id: uuid(1),
                configs: BTreeMap::new(),
                assignment: vec![vec![1, 2], vec![2, 1]],
            },
            MetadataCommand::AllocateProducerIds {
                broker_id: 2,
                broker_epoch: 2,
            },
        ];
        let mut a = MetadataImage::new();
        let mut b = MetadataImage::new();
        let ra: Vec<_> = cmds.iter().map(|c| a.apply(c)).collect();
        let rb: Vec<_> = cmds.iter().map(|c| b.apply(c)).collect();
        assert_eq!(ra, rb);
        assert_eq!(a, b);
        let json = serde_json::to_string(&a).unwrap();
        let back: MetadataImage = serde_json::from_str(&json).unwrap();
        assert_eq!(back, a);
    }
}
