//! Share groups (KIP-932) on this broker: the share groups' membership, the in-flight state of
//! every share-partition (the pure state machines of `spate-share`), share sessions, and the
//! durable state in `__share_group_state`.
//!
//! A standalone broker is at once the group coordinator, the leader of every partition and the
//! share coordinator. One service holds the groups and the share-partitions it leads under one
//! lock: the log reads of a ShareFetch are short, and acquiring under the same lock as the read
//! keeps two members from being handed the same record. Their durable state goes through the
//! share coordinator ([`ShareCoordinator`]), with its fencing.
//!
//! In a cluster the three roles are spread as in Kafka: a group's membership is on the leader
//! of its `__consumer_offsets` partition, a share-partition is served by its data partition's
//! leader, and its durable state is kept by the share coordinator leading its
//! `__share_group_state` partition, on this node or another ([`StateRoute`]). The leader sends
//! each share-partition's changes through its own lane, one at a time and in the order they
//! were made, and answers a client only once its change is durable there; a new leader reads
//! the state at its new leader epoch, which fences the old leader's writes.

mod coordinator;
pub mod group_configs;
mod route;
mod sessions;
mod settings;
mod store;

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use spate_protocol::batch::Batches;
use spate_protocol::ResponseError;
use spate_share::{
    AckBatch, AcquiredRange, GroupDescription, GroupEvent, HeartbeatError, HeartbeatReply,
    HeartbeatRequest, ShareGroup, SharePartition, StateChange, TopicsView,
};
use tokio::sync::watch;

pub use coordinator::{ShareCoordinator, StateSummary, StateWrite};
pub use route::{Members, Persisted, StateRoute};
pub use sessions::{Checked, TopicPartition};
pub use settings::ShareSettings;
pub use store::{state_partition_for, SpKey, CLUSTER_PARTITIONS, SHARE_STATE_LOG};

use crate::error::BrokerError;
use crate::groups::Written;
use crate::partition::{Partition, Role};
use crate::registry::TopicRegistry;
use crate::time::SharedClock;

/// How often locks and member sessions are checked for expiry.
const TICK: Duration = Duration::from_millis(100);

/// What one share-partition's part of a ShareFetch got.
#[derive(Debug, Default)]
pub struct Acquired {
    /// Whole batches holding the acquired records (and possibly others the client skips).
    pub records: Bytes,
    /// The acquired offset ranges with their delivery counts.
    pub ranges: Vec<AcquiredRange>,
}

struct Tracked {
    part: SharePartition,
    /// The data partition's leader epoch when this broker took the share-partition on: its
    /// writes to the share coordinator carry it, so a later leader fences them.
    leader_epoch: i32,
    /// In a cluster, the ordered lane its changes go to the share coordinator through.
    lane: Option<route::Lane>,
    /// Tells this taking-on from a later one (a lane's failure drops only its own).
    generation: u64,
}

#[derive(Default)]
struct State {
    groups: HashMap<String, ShareGroup>,
    /// Share-partitions this broker leads and has taken on; the others' durable state is
    /// with the share coordinator until a fetch, acknowledgement or assignment needs them.
    partitions: HashMap<SpKey, Tracked>,
    sessions: sessions::Sessions,
}

/// The most one share fetch reads from a share-partition's log (see `ShareService::acquire`).
const SHARE_READ_MAX_BYTES: usize = 1 << 20;

/// One share group's records across its share-partitions on this broker, for /metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareGroupStats {
    /// The group id.
    pub group: String,
    /// Records between the share-partitions' start and end offsets, whatever their state.
    pub in_flight: u64,
    /// Records under an acquisition lock now.
    pub acquired: u64,
    /// Locks that ran out before their record was acknowledged or released.
    pub lock_expiries: u64,
    /// Records delivered again.
    pub redeliveries: u64,
    /// Records archived (rejected, at the delivery count limit, or gaps).
    pub archived: u64,
    /// Records accepted.
    pub accepted: u64,
}

/// Share groups and their share-partitions.
pub struct ShareService {
    settings: ShareSettings,
    /// Per-group overrides of `settings` (`kafka-configs --entity-type groups`).
    configs: group_configs::GroupConfigs,
    clock: SharedClock,
    /// Whether a durable write waits for fsync (the broker's fsync policy).
    fsync: bool,
    state: Mutex<State>,
    coordinator: Arc<ShareCoordinator>,
    /// Bumped whenever records may have become available again (released, expired, a member
    /// gone): parked ShareFetches look again.
    released: watch::Sender<u64>,
    /// In a cluster, where durable state goes (set once the cluster runs).
    route: std::sync::OnceLock<Arc<dyn StateRoute>>,
    /// This service, for the lanes it spawns.
    me: std::sync::OnceLock<Weak<Self>>,
    /// One taking-on at a time per share-partition (a cluster's reads are remote).
    taking: Mutex<HashMap<SpKey, Arc<tokio::sync::Mutex<()>>>>,
    generations: std::sync::atomic::AtomicU64,
    /// A group's members as its (remote) coordinator last described them, and when.
    members: Mutex<HashMap<String, (std::time::Instant, Arc<Members>)>>,
}

impl ShareService {
    /// A service resuming the durable state in `__share_group_state`, if any. A cluster
    /// node's (`clustered`) holds nothing until it leads partitions and state partitions.
    pub fn open(
        topics: &TopicRegistry,
        settings: ShareSettings,
        configs: group_configs::GroupConfigs,
        clock: SharedClock,
        fsync: bool,
        clustered: bool,
    ) -> Result<Self, BrokerError> {
        let coordinator = Arc::new(if clustered {
            ShareCoordinator::clustered()
        } else {
            ShareCoordinator::open(topics)?
        });
        let durable = coordinator.keys(None);
        if !durable.is_empty() {
            tracing::info!(
                share_partitions = durable.len(),
                "share-group state loaded from {SHARE_STATE_LOG}"
            );
        }
        // Groups with state exist, Empty, until members join again or they are deleted.
        let groups = durable
            .iter()
            .map(|k| (k.0.clone(), ShareGroup::new(&k.0, settings.group)))
            .collect();
        Ok(Self {
            settings,
            configs,
            clock,
            fsync,
            state: Mutex::new(State {
                groups,
                ..State::default()
            }),
            coordinator,
            released: watch::channel(0).0,
            route: std::sync::OnceLock::new(),
            me: std::sync::OnceLock::new(),
            taking: Mutex::new(HashMap::new()),
            generations: std::sync::atomic::AtomicU64::new(1),
            members: Mutex::new(HashMap::new()),
        })
    }

    /// Cluster mode: durable state goes through `route` from now on.
    pub fn set_route(self: &Arc<Self>, route: Arc<dyn StateRoute>) {
        let _ = self.me.set(Arc::downgrade(self));
        let _ = self.route.set(route);
    }

    /// Where durable state goes in a cluster (`None` standalone).
    pub fn route(&self) -> Option<Arc<dyn StateRoute>> {
        self.route.get().cloned()
    }

    /// Whether this service is a cluster node's (state may be on other nodes).
    pub fn clustered(&self) -> bool {
        self.route.get().is_some()
    }

    /// Drops the groups this node no longer coordinates (their offsets partition moved):
    /// members find the new coordinator and join again there.
    pub fn retain_groups(&self, keep: impl Fn(&str) -> bool) {
        let mut st = self.state.lock();
        let before = st.groups.len();
        st.groups.retain(|id, _| keep(id));
        if st.groups.len() != before {
            tracing::info!(
                groups = before - st.groups.len(),
                "share groups handed over to another coordinator"
            );
        }
    }

    /// The share coordinator this broker runs (the share-group state APIs).
    pub fn coordinator(&self) -> &Arc<ShareCoordinator> {
        &self.coordinator
    }

    /// Drops what this broker holds in memory of a share-partition whose durable state was
    /// changed through the share-group state APIs: its next use reads that state. Records it
    /// had acquired come back as the durable state says (available, their delivery counted).
    pub fn forget_tracked(&self, key: &SpKey) {
        if self.state.lock().partitions.remove(key).is_some() {
            self.released.send_modify(|n| *n += 1);
        }
    }

    /// The wall clock of this service, in ms (the timestamps of state records).
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The settings in force for groups that set no config of their own.
    pub fn settings(&self) -> &ShareSettings {
        &self.settings
    }

    /// Each share group's records across its share-partitions, by group id.
    pub fn group_stats(&self) -> Vec<ShareGroupStats> {
        let st = self.state.lock();
        let mut by_group: std::collections::BTreeMap<&str, ShareGroupStats> = st
            .groups
            .keys()
            .map(|g| {
                let stats = ShareGroupStats {
                    group: g.clone(),
                    ..Default::default()
                };
                (g.as_str(), stats)
            })
            .collect();
        for (key, t) in &st.partitions {
            let s = by_group
                .entry(key.0.as_str())
                .or_insert_with(|| ShareGroupStats {
                    group: key.0.clone(),
                    ..Default::default()
                });
            let m = t.part.metrics();
            s.in_flight += t.part.in_flight_count();
            s.acquired += t.part.acquired_count();
            s.lock_expiries += m.lock_expiries;
            s.redeliveries += m.redeliveries;
            s.archived += m.archived;
            s.accepted += m.accepted;
        }
        by_group.into_values().collect()
    }

    /// The per-group configs.
    pub fn group_configs(&self) -> &group_configs::GroupConfigs {
        &self.configs
    }

    /// The settings in force for `group`.
    pub fn settings_for(&self, group: &str) -> ShareSettings {
        self.configs.settings_for(group, &self.settings)
    }

    /// True when a share group of this id exists.
    pub fn has_group(&self, group: &str) -> bool {
        self.state.lock().groups.contains_key(group)
    }

    /// Share group ids and state names, for ListGroups.
    pub fn list(&self) -> Vec<(String, &'static str)> {
        self.state
            .lock()
            .groups
            .values()
            .map(|g| (g.id().to_string(), g.state().name()))
            .collect()
    }

    /// Describes a share group, `None` if it does not exist.
    pub fn describe(&self, group: &str) -> Option<GroupDescription> {
        self.state
            .lock()
            .groups
            .get(group)
            .map(ShareGroup::describe)
    }

    /// The share-partition start offsets of a group with their state epochs, from what is in
    /// memory and, for the rest, the share coordinator; `None` when the group is unknown.
    pub fn start_offsets(&self, group: &str) -> Option<Vec<(SpKey, i64, i32)>> {
        let st = self.state.lock();
        let mut out: Vec<(SpKey, i64, i32)> = st
            .partitions
            .iter()
            .filter(|(k, _)| k.0 == group)
            .map(|(k, t)| (k.clone(), t.part.start_offset(), t.part.state_epoch()))
            .collect();
        for k in self.coordinator.keys(Some(group)) {
            if st.partitions.contains_key(&k) {
                continue;
            }
            if let Some(s) = self.coordinator.summary(&k) {
                out.push((k, s.start_offset, s.state_epoch));
            }
        }
        if out.is_empty() && !st.groups.contains_key(group) {
            return None;
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Some(out)
    }

    /// Whether the group exists and has members: `None` when it does not exist.
    pub fn has_members(&self, group: &str) -> Option<bool> {
        self.state.lock().groups.get(group).map(|g| !g.is_empty())
    }

    /// Moves a share-partition's start offset (AlterShareGroupOffsets); the group must have
    /// no members. A group that does not exist yet is created, Empty.
    pub fn alter_start_offset(
        &self,
        topics: &TopicRegistry,
        key: &SpKey,
        offset: i64,
    ) -> Result<Option<Persisted>, ResponseError> {
        let now = self.clock.monotonic_ms();
        let mut st = self.state.lock();
        let g = st
            .groups
            .entry(key.0.clone())
            .or_insert_with(|| ShareGroup::new(&key.0, self.settings.group));
        if !g.is_empty() {
            return Err(ResponseError::NonEmptyGroup);
        }
        self.tracked(&mut st, topics, key)?;
        let Some(t) = st.partitions.get_mut(key) else {
            return Err(ResponseError::UnknownTopicOrPartition);
        };
        t.part.reset_to(offset, now).map_err(|e| e.error())?;
        self.persist(&mut st, topics, key)
    }

    /// Forgets the share-partition state of one topic in an Empty group
    /// (DeleteShareGroupOffsets): its partitions start afresh at `share.auto.offset.reset`.
    pub fn delete_topic_state(
        &self,
        topics: &TopicRegistry,
        group: &str,
        topic: &uuid::Uuid,
    ) -> Result<(), ResponseError> {
        let mut st = self.state.lock();
        match st.groups.get(group) {
            Some(g) if !g.is_empty() => return Err(ResponseError::NonEmptyGroup),
            Some(_) => {}
            None => return Err(ResponseError::GroupIdNotFound),
        }
        let keys: Vec<SpKey> = self
            .coordinator
            .keys(Some(group))
            .into_iter()
            .chain(st.partitions.keys().cloned())
            .filter(|k| k.0 == group && k.1 == *topic)
            .collect();
        let now = self.clock.now_ms();
        for k in keys {
            st.partitions.remove(&k);
            self.coordinator.delete(topics, &k, now)?;
        }
        Ok(())
    }

    /// Deletes an Empty share group and its share-partition state (DeleteGroups):
    /// NON_EMPTY_GROUP while it has members, GROUP_ID_NOT_FOUND when there is no such group.
    pub fn delete_group(&self, topics: &TopicRegistry, group: &str) -> Result<(), ResponseError> {
        let mut st = self.state.lock();
        match st.groups.get(group) {
            Some(g) if !g.is_empty() => return Err(ResponseError::NonEmptyGroup),
            Some(_) => {}
            None => return Err(ResponseError::GroupIdNotFound),
        }
        st.groups.remove(group);
        let keys: Vec<SpKey> = self
            .coordinator
            .keys(Some(group))
            .into_iter()
            .chain(st.partitions.keys().filter(|k| k.0 == group).cloned())
            .collect();
        let now = self.clock.now_ms();
        for k in keys {
            st.partitions.remove(&k);
            if let Err(e) = self.coordinator.delete(topics, &k, now) {
                tracing::warn!(group, partition = k.2, error = ?e, "cannot delete share-partition state");
            }
        }
        Ok(())
    }

    /// Cluster mode: removes an Empty share group from this coordinator (DeleteGroups); its
    /// share-partitions' state is the caller's to delete from their share coordinators.
    pub fn remove_empty_group(&self, group: &str) -> Result<(), ResponseError> {
        let mut st = self.state.lock();
        match st.groups.get(group) {
            Some(g) if !g.is_empty() => Err(ResponseError::NonEmptyGroup),
            Some(_) => {
                st.groups.remove(group);
                Ok(())
            }
            None => Err(ResponseError::GroupIdNotFound),
        }
    }

    /// Handles a ShareGroupHeartbeat; returns the answer and the durable writes it made
    /// (share-partitions initialized, locks of departed members released).
    pub fn heartbeat(
        &self,
        topics: &TopicRegistry,
        group: &str,
        req: &HeartbeatRequest,
    ) -> (Result<HeartbeatReply, HeartbeatError>, Vec<Persisted>) {
        let view = topics_view(topics);
        let now = self.clock.monotonic_ms();
        let mut st = self.state.lock();
        let existed = st.groups.contains_key(group);
        let g = st
            .groups
            .entry(group.to_string())
            .or_insert_with(|| ShareGroup::new(group, self.settings.group));
        let (reply, events) = g.heartbeat(req, &view, now);
        if !existed && g.is_empty() {
            // A refused join does not create the group. A group whose members all left stays,
            // Empty, as in Kafka.
            st.groups.remove(group);
        }
        let written = self.apply_events(&mut st, topics, group, events);
        (reply, written)
    }

    /// Acts on what a group reported: members gone release their records, newly assigned
    /// partitions get their state.
    fn apply_events(
        &self,
        st: &mut State,
        topics: &TopicRegistry,
        group: &str,
        events: Vec<GroupEvent>,
    ) -> Vec<Persisted> {
        let mut written = Vec::new();
        let now = self.clock.monotonic_ms();
        for e in events {
            match e {
                GroupEvent::MemberRemoved { member_id, .. } => {
                    st.sessions.close(group, &member_id);
                    let keys: Vec<SpKey> = st
                        .partitions
                        .keys()
                        .filter(|k| k.0 == group)
                        .cloned()
                        .collect();
                    let mut released = 0;
                    for k in keys {
                        if let Some(t) = st.partitions.get_mut(&k) {
                            released += t.part.release_member(&member_id, now);
                        }
                        // A failed write was logged; the records are free in memory
                        // and their locks would have run out anyway.
                        written.extend(self.persist(st, topics, &k).ok().flatten());
                    }
                    if released > 0 {
                        self.released.send_modify(|n| *n += 1);
                    }
                }
                // In a cluster the data partitions' leaders take their share-partitions on
                // at the first fetch (their state may be on other nodes).
                GroupEvent::PartitionsAssigned(_) if self.clustered() => {}
                GroupEvent::PartitionsAssigned(assignment) => {
                    for (topic_id, parts) in assignment {
                        for p in parts {
                            let key = (group.to_string(), topic_id, p);
                            if let Ok(w) = self.tracked(st, topics, &key) {
                                written.extend(w);
                            }
                        }
                    }
                }
                GroupEvent::MemberJoined { .. } => {}
            }
        }
        written
    }

    /// The share-partition of `key`, resumed from its durable state or started at
    /// `share.auto.offset.reset` (whose first state is written: returned). In a cluster it
    /// must have been taken on ([`ShareService::take_on`]) at the partition's leader epoch.
    fn tracked(
        &self,
        st: &mut State,
        topics: &TopicRegistry,
        key: &SpKey,
    ) -> Result<Option<Persisted>, ResponseError> {
        let log = data_partition(topics, key)?;
        let leader_epoch = log.leader_epoch();
        if self.clustered() {
            return match st.partitions.get(key) {
                Some(t) if t.leader_epoch == leader_epoch => Ok(None),
                _ => Err(ResponseError::NotLeaderOrFollower),
            };
        }
        if st.partitions.contains_key(key) {
            return Ok(None);
        }
        let stored = self
            .coordinator
            .read(key, leader_epoch)?
            .map(|snap| snap.partition_state());
        let (part, fresh) = self.resume_or_start(key, &log, leader_epoch, stored);
        let written = match fresh {
            Some((state_epoch, start)) => Some(Persisted::Local(self.coordinator.initialize(
                topics,
                key,
                state_epoch,
                start,
                self.clock.now_ms(),
            )?)),
            None => None,
        };
        st.partitions.insert(
            key.clone(),
            Tracked {
                part,
                leader_epoch,
                lane: None,
                generation: 0,
            },
        );
        Ok(written)
    }

    /// The share-partition resumed from `stored`, or started afresh at
    /// `share.auto.offset.reset` with the (state epoch, start offset) to initialize.
    fn resume_or_start(
        &self,
        key: &SpKey,
        log: &Partition,
        leader_epoch: i32,
        stored: Option<spate_share::PartitionState>,
    ) -> (SharePartition, Option<(i32, i64)>) {
        let config = self.settings.partition;
        // A state this broker cannot use is started afresh under the next state epoch, which
        // the coordinator takes over the old one.
        let mut state_epoch = 0;
        if let Some(stored) = stored {
            match SharePartition::from_state(config, &stored) {
                Ok(mut part) => {
                    part.set_leader_epoch(leader_epoch);
                    part.update_log_start(log.log_start_offset());
                    return (part, None);
                }
                Err(e) => {
                    tracing::warn!(group = %key.0, partition = key.2, error = %e, "unusable share-partition state; starting afresh");
                    state_epoch = stored.state_epoch.saturating_add(1);
                }
            }
        }
        let reset = self.settings_for(&key.0).auto_offset_reset;
        // `by_duration`: the first record written at or after now minus the duration, as
        // ListOffsets finds it by timestamp; none (or a log that cannot say) is the log end.
        let at_time = match reset {
            spate_share::AutoOffsetReset::ByDuration(ms) => log
                .offset_for_timestamp(self.clock.now_ms().saturating_sub(ms))
                .unwrap_or_else(|e| {
                    tracing::warn!(partition = key.2, error = %e, "cannot look up an offset by time for share.auto.offset.reset");
                    None
                })
                .map(|found| found.offset),
            _ => None,
        };
        let start = reset.start_offset(log.log_start_offset(), log.high_watermark(), at_time);
        let fresh = spate_share::PartitionState {
            state_epoch,
            leader_epoch,
            start_offset: start,
            batches: Vec::new(),
        };
        // A state without batches always loads.
        let mut part = SharePartition::from_state(config, &fresh)
            .unwrap_or_else(|_| SharePartition::new(config, start));
        part.set_leader_epoch(leader_epoch);
        // The first state is the start offset alone.
        let _ = part.take_changes();
        let init = (part.state_epoch(), part.start_offset());
        (part, Some(init))
    }

    /// Cluster mode: takes the share-partition of `key` on as its data partition's leader,
    /// reading its state from its share coordinator at this leader epoch (which fences any
    /// earlier leader's writes), or initializing it there. Done once per leader epoch;
    /// standalone there is nothing to do.
    pub async fn take_on(&self, topics: &TopicRegistry, key: &SpKey) -> Result<(), ResponseError> {
        let Some(route) = self.route.get().cloned() else {
            return Ok(());
        };
        let log = data_partition(topics, key)?;
        let epoch = log.leader_epoch();
        let taken = |svc: &Self| {
            svc.state
                .lock()
                .partitions
                .get(key)
                .is_some_and(|t| t.leader_epoch == epoch)
        };
        if taken(self) {
            return Ok(());
        }
        let gate = self.taking.lock().entry(key.clone()).or_default().clone();
        let _one = gate.lock().await;
        if taken(self) {
            return Ok(());
        }
        let stored = route.read(key.clone(), epoch).await.map_err(|e| match e {
            // A newer leader has read the state: this node is not the leader any more.
            ResponseError::FencedLeaderEpoch => ResponseError::NotLeaderOrFollower,
            e => e,
        })?;
        let resumed_epoch = stored.as_ref().map(|s| s.state_epoch);
        let (part, fresh) = self.resume_or_start(key, &log, epoch, stored);
        if let (None, Some(state_epoch)) = (fresh, resumed_epoch) {
            // The read fenced older leaders in the coordinator's memory only; a write at this
            // leader epoch keeps them fenced if the coordinator moves before the next change.
            route
                .write(
                    key.clone(),
                    StateWrite {
                        state_epoch,
                        leader_epoch: epoch,
                        start_offset: -1,
                        batches: Vec::new(),
                    },
                )
                .await
                .map_err(|e| match e {
                    ResponseError::FencedLeaderEpoch => ResponseError::NotLeaderOrFollower,
                    e => e,
                })?;
        }
        if let Some((state_epoch, start)) = fresh {
            route
                .initialize(key.clone(), state_epoch, start)
                .await
                .inspect_err(|e| {
                    tracing::warn!(group = %key.0, partition = key.2, error = ?e, "cannot initialize share-partition state");
                })?;
        }
        if log.role() == Role::Follower || log.leader_epoch() != epoch {
            return Err(ResponseError::NotLeaderOrFollower);
        }
        let generation = self
            .generations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let lane = route::Lane::spawn(
            route,
            self.me.get().cloned().unwrap_or_default(),
            key.clone(),
            generation,
        );
        let resumed = fresh.is_none();
        self.state.lock().partitions.insert(
            key.clone(),
            Tracked {
                part,
                leader_epoch: epoch,
                lane: Some(lane),
                generation,
            },
        );
        tracing::info!(group = %key.0, partition = key.2, leader_epoch = epoch, resumed, "share-partition taken on");
        // Records it had in flight under an older leader are available again.
        self.released.send_modify(|n| *n += 1);
        Ok(())
    }

    /// A lane's write failed: what is in memory is no longer what is durable, so the
    /// share-partition is dropped and read again at its next use.
    fn lane_failed(&self, key: &SpKey, generation: u64, error: ResponseError) {
        let mut st = self.state.lock();
        if st
            .partitions
            .get(key)
            .is_some_and(|t| t.generation == generation)
        {
            st.partitions.remove(key);
            tracing::info!(group = %key.0, partition = key.2, error = ?error, "share-partition state not written; reading it again at its next use");
            drop(st);
            self.released.send_modify(|n| *n += 1);
        }
    }

    /// The members of `group` and their subscriptions as the group's coordinator on another
    /// node knows them (`None`: this node coordinates it, or there is no cluster). A member
    /// not in what was last seen, or a view older than a second, asks again.
    pub async fn remote_members(
        &self,
        group: &str,
        member: &str,
        local: bool,
    ) -> Result<Option<Arc<Members>>, ResponseError> {
        let Some(route) = self.route.get().cloned() else {
            return Ok(None);
        };
        if local {
            return Ok(None);
        }
        if let Some((at, m)) = self.members.lock().get(group) {
            if at.elapsed() < Duration::from_secs(1) && m.contains_key(member) {
                return Ok(Some(m.clone()));
            }
        }
        let m = Arc::new(route.members(group.to_string()).await?);
        let mut cache = self.members.lock();
        // Bounded: a node serves the groups whose members fetch from it.
        if cache.len() > 10_000 {
            cache.retain(|_, (at, _)| at.elapsed() < Duration::from_secs(10));
        }
        cache.insert(group.to_string(), (std::time::Instant::now(), m.clone()));
        Ok(Some(m))
    }

    /// Sends what changed in the share-partition's durable state to the share coordinator.
    /// A write the coordinator fences (a newer leader, or the state reset under it) drops the
    /// share-partition from memory: the next use reads the coordinator's state again. The
    /// error is the caller's to answer with: what it changed is not durable. In a cluster the
    /// change goes into the share-partition's lane and its outcome comes later.
    fn persist(
        &self,
        st: &mut State,
        topics: &TopicRegistry,
        key: &SpKey,
    ) -> Result<Option<Persisted>, ResponseError> {
        let Some(t) = st.partitions.get_mut(key) else {
            return Ok(None);
        };
        let now = self.clock.now_ms();
        let change = t.part.take_changes();
        if let Some(lane) = &t.lane {
            let op = match change {
                StateChange::Unchanged => return Ok(None),
                StateChange::Update {
                    start_offset,
                    batches,
                } => route::LaneOp::Write(StateWrite {
                    state_epoch: t.part.state_epoch(),
                    leader_epoch: t.leader_epoch,
                    start_offset: start_offset.unwrap_or(-1),
                    batches,
                }),
                StateChange::Snapshot(state) => route::LaneOp::Reset(StateWrite {
                    state_epoch: state.state_epoch,
                    leader_epoch: t.leader_epoch,
                    start_offset: state.start_offset,
                    batches: state.batches,
                }),
            };
            return Ok(Some(lane.send(op)));
        }
        let outcome = match change {
            StateChange::Unchanged => return Ok(None),
            StateChange::Update {
                start_offset,
                batches,
            } => self.coordinator.write(
                topics,
                key,
                &StateWrite {
                    state_epoch: t.part.state_epoch(),
                    leader_epoch: t.leader_epoch,
                    start_offset: start_offset.unwrap_or(-1),
                    batches,
                },
                now,
            ),
            // A reset: the state starts again under its new state epoch, then takes whatever
            // is in flight already.
            StateChange::Snapshot(state) => self
                .coordinator
                .initialize(topics, key, state.state_epoch, state.start_offset, now)
                .and_then(|w| {
                    if state.batches.is_empty() {
                        return Ok(w);
                    }
                    let write = StateWrite {
                        state_epoch: state.state_epoch,
                        leader_epoch: t.leader_epoch,
                        start_offset: state.start_offset,
                        batches: state.batches,
                    };
                    self.coordinator.write(topics, key, &write, now)
                }),
        };
        match outcome {
            Ok(w) => Ok(Some(Persisted::Local(w))),
            Err(e @ (ResponseError::FencedLeaderEpoch | ResponseError::FencedStateEpoch)) => {
                tracing::info!(group = %key.0, partition = key.2, error = ?e, "share-partition state fenced by the share coordinator; reading it again");
                st.partitions.remove(key);
                Err(e)
            }
            Err(e) => {
                tracing::warn!(group = %key.0, partition = key.2, error = ?e, "cannot write share-partition state");
                Err(e)
            }
        }
    }

    /// Checks a member's share session for a ShareFetch (or, with `ack_only`, a
    /// ShareAcknowledge) and returns what to do and which partitions the session fetches:
    /// `changes` are the partitions the fetch adds and those it forgets. The member is known
    /// to this node's group coordinator, or to `remote` (the group's members on another node).
    pub fn session(
        &self,
        (group, member, epoch): (&str, &str, i32),
        ack_only: bool,
        (added, forgotten): (Vec<TopicPartition>, Vec<TopicPartition>),
        remote: Option<&Members>,
    ) -> Result<(Checked, Vec<TopicPartition>), ResponseError> {
        let mut st = self.state.lock();
        let known = match remote {
            Some(m) => m.contains_key(member),
            None => st
                .groups
                .get(group)
                .is_some_and(|g| g.describe().members.iter().any(|m| m.member_id == member)),
        };
        if !known {
            st.sessions.close(group, member);
            return Err(ResponseError::UnknownMemberId);
        }
        let checked = if ack_only {
            st.sessions.acknowledge(group, member, epoch)?
        } else {
            st.sessions.fetch(group, member, epoch)?
        };
        let partitions = match checked {
            Checked::Serve if !ack_only => st.sessions.update(group, member, added, forgotten),
            _ => Vec::new(),
        };
        Ok((checked, partitions))
    }

    /// Closes a member's share session, releasing what it holds (ShareFetch or
    /// ShareAcknowledge with epoch -1).
    pub fn close_session(
        &self,
        topics: &TopicRegistry,
        group: &str,
        member: &str,
    ) -> Vec<Persisted> {
        let mut st = self.state.lock();
        st.sessions.close(group, member);
        let now = self.clock.monotonic_ms();
        let keys: Vec<SpKey> = st
            .partitions
            .keys()
            .filter(|k| k.0 == group)
            .cloned()
            .collect();
        let mut written = Vec::new();
        let mut released = 0;
        for k in keys {
            if let Some(t) = st.partitions.get_mut(&k) {
                released += t.part.release_member(member, now);
            }
            written.extend(self.persist(&mut st, topics, &k).ok().flatten());
        }
        if released > 0 {
            self.released.send_modify(|n| *n += 1);
        }
        written
    }

    /// True when `member` of `group` subscribes to the topic of this id.
    pub fn subscribed(
        &self,
        topics: &TopicRegistry,
        group: &str,
        member: &str,
        topic: &uuid::Uuid,
        remote: Option<&Members>,
    ) -> bool {
        let Some(name) = topics.get_by_id(topic).map(|t| t.name.clone()) else {
            return false;
        };
        if let Some(m) = remote {
            return m.get(member).is_some_and(|topics| topics.contains(&name));
        }
        let st = self.state.lock();
        st.groups.get(group).is_some_and(|g| {
            g.describe()
                .members
                .iter()
                .any(|m| m.member_id == member && m.subscribed_topic_names.contains(&name))
        })
    }

    /// Applies a member's acknowledgements to one share-partition; returns the durable write.
    pub fn acknowledge(
        &self,
        topics: &TopicRegistry,
        key: &SpKey,
        member: &str,
        batches: &[AckBatch],
    ) -> Result<Option<Persisted>, ResponseError> {
        let now = self.clock.monotonic_ms();
        let mut st = self.state.lock();
        let mut written = self.tracked(&mut st, topics, key)?;
        let Some(t) = st.partitions.get_mut(key) else {
            return Err(ResponseError::UnknownTopicOrPartition);
        };
        t.part
            .acknowledge(member, batches, now)
            .map_err(|e| e.error())?;
        if batches
            .iter()
            .any(|b| b.types.contains(&spate_share::AckType::Release))
        {
            self.released.send_modify(|n| *n += 1);
        }
        if let Some(w) = self.persist(&mut st, topics, key)? {
            written = Some(w);
        }
        Ok(written)
    }

    /// Reads the share-partition's log from its next fetch offset (up to the high watermark)
    /// and acquires at most `max_records` of what is there for `member`.
    pub fn acquire(
        &self,
        topics: &TopicRegistry,
        key: &SpKey,
        member: &str,
        max_records: u32,
        max_bytes: usize,
    ) -> Result<(Acquired, Option<Persisted>), ResponseError> {
        let now = self.clock.monotonic_ms();
        let settings = self.settings_for(&key.0);
        let log = data_partition(topics, key)?;
        let mut st = self.state.lock();
        let mut written = self.tracked(&mut st, topics, key)?;
        let Some(t) = st.partitions.get_mut(key) else {
            return Err(ResponseError::UnknownTopicOrPartition);
        };
        t.part.update_log_start(log.log_start_offset());
        let from = t.part.next_fetch_offset();
        let limit = if settings.read_committed {
            log.last_stable_offset()
        } else {
            log.high_watermark()
        };
        if max_records == 0 || from >= limit {
            return Ok((Acquired::default(), written));
        }
        // A share fetch takes at most `max_records` of what it reads, and the Java client asks
        // for 50 MiB: reading all of that (into a fresh buffer) on every fetch of a backlog
        // made a share group cost ~30-60 us of broker CPU per record, nearly all of it
        // zeroing and copying bytes that were then dropped. The first batch is whole anyway.
        let read = log
            .read_upto(from, max_bytes.min(SHARE_READ_MAX_BYTES), true, limit)
            .map_err(|e| match e {
                spate_log::LogError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
                e => {
                    tracing::error!(partition = key.2, error = %e, "share fetch read failed");
                    ResponseError::KafkaStorageError
                }
            })?;
        let aborted = if settings.read_committed {
            log.aborted_in(from, limit)
        } else {
            Vec::new()
        };
        // (position, length, offsets, left out) of each batch read.
        let batches: Vec<(usize, usize, RangeInclusive<i64>, bool)> = Batches::new(&read.records)
            .map(|(at, h)| {
                let left_out = h.is_control()
                    || (h.is_transactional()
                        && aborted.iter().any(|a| {
                            a.producer_id == h.producer_id
                                && a.first_offset <= h.base_offset
                                && h.last_offset() < a.last_offset
                        }));
                (at, h.total_len(), h.base_offset..=h.last_offset(), left_out)
            })
            .collect();
        // Control batches hold no records for consumers, and a read_committed group never
        // sees aborted ones: they are left out, so their offsets are archived as gaps.
        let fetched: Vec<RangeInclusive<i64>> = batches
            .iter()
            .filter(|(.., control)| !control)
            .map(|(_, _, r, _)| r.clone())
            .collect();
        let ranges = t.part.acquire(
            member,
            &fetched,
            max_records,
            settings.lock_duration_ms,
            now,
        );
        if let Some(w) = self.persist(&mut st, topics, key)? {
            written = Some(w);
        }
        if ranges.is_empty() {
            return Ok((Acquired::default(), written));
        }
        // Only the batches holding acquired records go back.
        let mut records = Vec::new();
        for (at, len, r, control) in &batches {
            if !control
                && ranges
                    .iter()
                    .any(|a| a.first <= *r.end() && *r.start() <= a.last)
            {
                records.extend_from_slice(&read.records[*at..*at + *len]);
            }
        }
        Ok((
            Acquired {
                records: Bytes::from(records),
                ranges,
            },
            written,
        ))
    }

    /// Changes ShareFetches wait on besides appends: records released or locks expired.
    pub fn watch_released(&self) -> watch::Receiver<u64> {
        self.released.subscribe()
    }

    /// Waits until a change is as durable as a produce ack (see `GroupService::durable`):
    /// in the local log, or with the share coordinator on another node.
    pub fn durable(
        &self,
        persisted: Persisted,
    ) -> impl std::future::Future<Output = Result<(), ResponseError>> + Send + 'static {
        let fsync = self.fsync;
        async move {
            match persisted {
                Persisted::Local(w) => crate::groups::wait_committed(&w, fsync).await,
                Persisted::Remote(rx) => rx.await.unwrap_or(Err(ResponseError::UnknownServerError)),
            }
        }
    }

    /// Waits until a write to this broker's own state log is as durable as a produce ack.
    pub fn written_durable(
        &self,
        written: &Written,
    ) -> impl std::future::Future<Output = Result<(), ResponseError>> + Send + 'static {
        crate::groups::wait_committed(written, self.fsync)
    }

    /// Expires member sessions and acquisition locks every 100 ms until the service is
    /// dropped.
    pub fn spawn_ticker(self: &Arc<Self>, topics: Arc<TopicRegistry>) {
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(s) = weak.upgrade() else { return };
                s.tick(&topics);
            }
        });
    }

    /// Acts on the time now: members without heartbeats leave, expired locks free records.
    pub fn tick(&self, topics: &TopicRegistry) {
        let now = self.clock.monotonic_ms();
        let view = topics_view(topics);
        let mut st = self.state.lock();
        let ids: Vec<String> = st.groups.keys().cloned().collect();
        for id in ids {
            let events = match st.groups.get_mut(&id) {
                Some(g) if g.next_deadline().is_some_and(|d| d <= now) => {
                    g.expire_sessions(&view, now)
                }
                _ => continue,
            };
            self.apply_events(&mut st, topics, &id, events);
        }
        if self.clustered() {
            // Share-partitions of partitions this node no longer leads (or leads at a newer
            // epoch, to be taken on again) are the new leader's: their lanes end with them.
            st.partitions.retain(|k, t| {
                data_partition(topics, k).is_ok_and(|p| p.leader_epoch() == t.leader_epoch)
            });
        }
        let keys: Vec<SpKey> = st.partitions.keys().cloned().collect();
        let mut expired = 0;
        for k in keys {
            if let Some(t) = st.partitions.get_mut(&k) {
                expired += t.part.expire_locks(now);
            }
            let _ = self.persist(&mut st, topics, &k);
        }
        if expired > 0 {
            self.released.send_modify(|n| *n += 1);
        }
    }
}

/// The topics that exist now, as the share assignor sees them (internal topics excluded). In a
/// cluster every node holds every topic (with replicas of the partitions assigned to it).
fn topics_view(topics: &TopicRegistry) -> TopicsView {
    topics
        .list()
        .into_iter()
        .filter(|t| !crate::groups::is_internal(&t.name))
        .map(|t| (t.name.clone(), (t.id, t.partition_count())))
        .collect()
}

/// The log of a share-partition, if this broker leads it.
fn data_partition(topics: &TopicRegistry, key: &SpKey) -> Result<Arc<Partition>, ResponseError> {
    let topic = topics
        .get_by_id(&key.1)
        .ok_or(ResponseError::UnknownTopicId)?;
    let p = topic
        .partition(key.2)
        .ok_or(ResponseError::UnknownTopicOrPartition)?;
    if p.role() == Role::Follower {
        return Err(ResponseError::NotLeaderOrFollower);
    }
    Ok(p)
}
#[cfg(test)]
mod tests;
