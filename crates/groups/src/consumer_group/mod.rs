//! KIP-848 consumer groups (the "consumer" rebalance protocol) as a pure state machine.
//!
//! Members heartbeat (ConsumerGroupHeartbeat) with their member epoch and, when it changed,
//! their subscription and the partitions they own; the coordinator answers with their epoch
//! and assignment. The group epoch moves whenever membership, subscriptions or the subscribed
//! topics change; the server-side assignor then computes a target assignment, and each member
//! is reconciled towards its target on its own heartbeats, revoking before anyone else gains
//! (see [`reconcile`]). Time comes in as `now_ms` (monotonic); nothing here touches a clock,
//! a socket or a disk. Every durable change is returned as [`StateRecord`]s for the offsets
//! log, and [`ConsumerGroups::replay`] rebuilds the groups from them.

mod assignor;
mod group;
mod member;
mod reconcile;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use spate_protocol::ResponseError;
use uuid::Uuid;

pub use assignor::{Assignor, TopicPartitions};
pub use group::{ConsumerGroupState, Group};
pub use member::{Member, Subscription};
pub use reconcile::{Current, MemberState};

/// The member epoch with which a member leaves for good.
pub const LEAVE_EPOCH: i32 = -1;
/// The member epoch with which a static member leaves for now (it keeps its assignment until
/// its session times out).
pub const LEAVE_STATIC_EPOCH: i32 = -2;

/// The heartbeat interval of a member in the middle of a reconciliation (revoking, or waiting
/// for partitions others still own), when shorter than the configured one: it learns that the
/// partitions are free within this long instead of a whole interval later, which is most of a
/// rebalance's duration. Members with nothing pending keep the configured interval.
pub const RECONCILING_HEARTBEAT_INTERVAL_MS: i32 = 500;

/// Existing topics by name: id and partition count.
pub type TopicsView = BTreeMap<String, (Uuid, i32)>;

/// Consumer group settings (Kafka's `group.consumer.*`).
#[derive(Debug, Clone)]
pub struct ConsumerGroupConfig {
    /// A member without a heartbeat for this long is removed.
    pub session_timeout_ms: i32,
    /// How often members heartbeat (sent to them in every answer).
    pub heartbeat_interval_ms: i32,
    /// Most members one group may have.
    pub max_size: usize,
}

impl Default for ConsumerGroupConfig {
    fn default() -> Self {
        Self {
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
            max_size: 1_000,
        }
    }
}

/// A ConsumerGroupHeartbeat, stripped of wire details.
#[derive(Debug, Clone, Default)]
pub struct HeartbeatRequest {
    /// Request version (from v1 the client makes up its member id).
    pub version: i16,
    /// Group.
    pub group_id: String,
    /// Member id; empty on a v0 join.
    pub member_id: String,
    /// 0 to join, -1 to leave, -2 for a static member to leave for now.
    pub member_epoch: i32,
    /// Static membership id.
    pub instance_id: Option<String>,
    /// Rack.
    pub rack_id: Option<String>,
    /// -1 when unchanged.
    pub rebalance_timeout_ms: i32,
    /// `None` when unchanged.
    pub subscribed_topic_names: Option<Vec<String>>,
    /// `None` when unchanged.
    pub subscribed_topic_regex: Option<String>,
    /// `None` when unchanged.
    pub server_assignor: Option<String>,
    /// Partitions the member owns; `None` when unchanged.
    pub owned: Option<TopicPartitions>,
    /// Reported by describe.
    pub client_id: String,
    /// Reported by describe.
    pub client_host: String,
}

/// A successful heartbeat's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatResponse {
    /// The member's id.
    pub member_id: String,
    /// Its epoch now.
    pub member_epoch: i32,
    /// When to heartbeat next.
    pub heartbeat_interval_ms: i32,
    /// Its assignment, when the member needs it (joined, changed, or sent a full request).
    pub assignment: Option<TopicPartitions>,
}

/// A refused heartbeat: Kafka's error code and a message (of consumer and share groups).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error:?}: {message}")]
pub struct HeartbeatError {
    /// Error code.
    pub error: ResponseError,
    /// Why.
    pub message: String,
}

/// A heartbeat refused with `error` and `message`.
pub fn refuse<T>(error: ResponseError, message: impl Into<String>) -> Result<T, HeartbeatError> {
    Err(HeartbeatError {
        error,
        message: message.into(),
    })
}

/// The durable part of a member, as written to the offsets log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRecord {
    /// Member id.
    pub member_id: String,
    /// Static id.
    pub instance_id: Option<String>,
    /// Rack.
    pub rack_id: Option<String>,
    /// Client id.
    pub client_id: String,
    /// Client host.
    pub client_host: String,
    /// Revocation timeout.
    pub rebalance_timeout_ms: i32,
    /// Subscribed names.
    pub topic_names: Vec<String>,
    /// Subscribed regex.
    pub topic_regex: Option<String>,
    /// Requested assignor.
    pub server_assignor: Option<String>,
    /// Reconciliation state.
    pub state: MemberState,
    /// Member epoch.
    pub epoch: i32,
    /// Previous member epoch.
    pub previous_epoch: i32,
    /// Assigned partitions.
    pub assigned: TopicPartitions,
    /// Partitions being revoked.
    pub revoking: TopicPartitions,
}

impl MemberRecord {
    fn of(m: &Member) -> Self {
        Self {
            member_id: m.id.clone(),
            instance_id: m.instance_id.clone(),
            rack_id: m.rack_id.clone(),
            client_id: m.client_id.clone(),
            client_host: m.client_host.clone(),
            rebalance_timeout_ms: m.rebalance_timeout_ms,
            topic_names: m.subscription.names.clone(),
            topic_regex: m.subscription.regex.clone(),
            server_assignor: m.server_assignor.clone(),
            state: m.current.state,
            epoch: m.current.epoch,
            previous_epoch: m.current.previous_epoch,
            assigned: m.current.assigned.clone(),
            revoking: m.current.revoking.clone(),
        }
    }
}

/// A durable change to the consumer groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateRecord {
    /// A group exists at this epoch.
    Group {
        /// Group id.
        group: String,
        /// Group epoch.
        epoch: i32,
    },
    /// A group is gone.
    GroupDeleted {
        /// Group id.
        group: String,
    },
    /// A member joined or changed.
    Member {
        /// Group id.
        group: String,
        /// The member.
        member: Box<MemberRecord>,
    },
    /// A member left or was removed.
    MemberRemoved {
        /// Group id.
        group: String,
        /// Member id.
        member_id: String,
    },
}

impl StateRecord {
    /// The group the record is about.
    pub fn group(&self) -> &str {
        match self {
            Self::Group { group, .. }
            | Self::GroupDeleted { group }
            | Self::Member { group, .. }
            | Self::MemberRemoved { group, .. } => group,
        }
    }
}

/// ConsumerGroupDescribe output for one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberDescription {
    /// The durable state.
    pub member: MemberRecord,
    /// Its target assignment.
    pub target: TopicPartitions,
}

/// ConsumerGroupDescribe output for one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    /// State.
    pub state: ConsumerGroupState,
    /// Group epoch.
    pub epoch: i32,
    /// Target assignment epoch.
    pub assignment_epoch: i32,
    /// The assignor in use.
    pub assignor: Assignor,
    /// Members.
    pub members: Vec<MemberDescription>,
}

/// Whether an offset commit or fetch of a consumer group may proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetCheck {
    /// Go ahead.
    Accept,
    /// Refuse with this error.
    Reject(ResponseError),
}

/// Every consumer group of this coordinator.
#[derive(Debug, Default)]
pub struct ConsumerGroups {
    config: ConsumerGroupConfig,
    groups: BTreeMap<String, Group>,
    /// Distinguishes coordinator-made member ids (v0 joins) across runs.
    nonce: u64,
    next_member: u64,
}

impl ConsumerGroups {
    /// No groups yet. `nonce` should differ between runs.
    pub fn new(config: ConsumerGroupConfig, nonce: u64) -> Self {
        Self {
            config,
            groups: BTreeMap::new(),
            nonce,
            next_member: 0,
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &ConsumerGroupConfig {
        &self.config
    }

    /// Handles a heartbeat at `now_ms` with the topics that exist now. Returns the answer and
    /// the durable changes it made.
    pub fn heartbeat(
        &mut self,
        now_ms: i64,
        topics: &TopicsView,
        req: HeartbeatRequest,
    ) -> (Result<HeartbeatResponse, HeartbeatError>, Vec<StateRecord>) {
        let mut records = Vec::new();
        let result = self.heartbeat_inner(now_ms, topics, req, &mut records);
        (result, records)
    }

    fn heartbeat_inner(
        &mut self,
        now_ms: i64,
        topics: &TopicsView,
        mut req: HeartbeatRequest,
        records: &mut Vec<StateRecord>,
    ) -> Result<HeartbeatResponse, HeartbeatError> {
        let subscription = validate(&req)?;
        if req.member_epoch == LEAVE_EPOCH || req.member_epoch == LEAVE_STATIC_EPOCH {
            return self.leave(&req, records);
        }
        let joining = req.member_epoch == 0;
        if req.member_id.is_empty() {
            self.next_member += 1;
            req.member_id = Uuid::from_u64_pair(self.nonce, self.next_member).to_string();
        }
        let max_size = self.config.max_size;
        let group = match self.groups.get_mut(&req.group_id) {
            Some(g) => g,
            None if joining => self
                .groups
                .entry(req.group_id.clone())
                .or_insert_with(|| Group::new(&req.group_id)),
            None => {
                return refuse(
                    ResponseError::GroupIdNotFound,
                    format!("Consumer group {} not found.", req.group_id),
                )
            }
        };
        let epoch_before = group.epoch;
        let id = req.member_id.clone();
        if !group.members.contains_key(&id) && group.members.len() >= max_size {
            let static_rejoin = req
                .instance_id
                .as_deref()
                .is_some_and(|i| group.by_instance(i).is_some());
            if !static_rejoin {
                return refuse(
                    ResponseError::GroupMaxSizeReached,
                    format!("The consumer group has reached its maximum capacity of {max_size} members."),
                );
            }
        }
        let before = find_member(group, &req, now_ms, records)?;
        let Some(m) = group.members.get_mut(&id) else {
            return refuse(ResponseError::UnknownServerError, "member vanished");
        };
        if let Some(i) = &req.instance_id {
            m.instance_id = Some(i.clone());
        }
        if req.rack_id.is_some() {
            m.rack_id = req.rack_id.clone();
        }
        if req.rebalance_timeout_ms != -1 {
            m.rebalance_timeout_ms = req.rebalance_timeout_ms;
        }
        m.client_id = req.client_id.clone();
        m.client_host = req.client_host.clone();
        let mut changed = before.is_none();
        if let Some(s) = subscription {
            changed |= m.subscription != s;
            m.subscription = s;
        }
        if req.server_assignor.is_some() && m.server_assignor != req.server_assignor {
            m.server_assignor = req.server_assignor.clone();
            changed = true;
        }
        m.last_heartbeat_ms = now_ms;
        let old_assigned = m.current.assigned.clone();
        if changed {
            group.epoch += 1;
            group.subscriptions_changed();
        }
        // Refreshing also catches topics created, deleted or grown since the last heartbeat.
        let resolved = group.resolve(topics);
        if resolved != group.subscribed {
            group.subscribed = resolved;
            if !changed {
                group.epoch += 1;
            }
        }
        group.update_target();
        group.reconcile(&id, req.owned.as_ref(), now_ms);
        let Some(m) = group.members.get(&id) else {
            return refuse(ResponseError::UnknownServerError, "member vanished");
        };
        let after = MemberRecord::of(m);
        if group.epoch != epoch_before {
            records.push(StateRecord::Group {
                group: group.id.clone(),
                epoch: group.epoch,
            });
        }
        if before.as_ref() != Some(&after) {
            records.push(StateRecord::Member {
                group: group.id.clone(),
                member: Box::new(after.clone()),
            });
        }
        // A full request (a join, or a member resending everything after an error) always
        // gets its assignment; otherwise only a changed one is sent.
        let full = joining
            || (req.rebalance_timeout_ms != -1
                && (req.subscribed_topic_names.is_some() || req.subscribed_topic_regex.is_some())
                && req.owned.is_some());
        let interval = match after.state {
            MemberState::Stable => self.config.heartbeat_interval_ms,
            _ => self
                .config
                .heartbeat_interval_ms
                .min(RECONCILING_HEARTBEAT_INTERVAL_MS),
        };
        Ok(HeartbeatResponse {
            member_id: id,
            member_epoch: after.epoch,
            heartbeat_interval_ms: interval,
            assignment: (full || old_assigned != after.assigned).then_some(after.assigned),
        })
    }

    fn leave(
        &mut self,
        req: &HeartbeatRequest,
        records: &mut Vec<StateRecord>,
    ) -> Result<HeartbeatResponse, HeartbeatError> {
        let Some(group) = self.groups.get_mut(&req.group_id) else {
            return refuse(
                ResponseError::GroupIdNotFound,
                format!("Consumer group {} not found.", req.group_id),
            );
        };
        let id = match &req.instance_id {
            None => {
                if !group.members.contains_key(&req.member_id) {
                    return unknown_member(&req.member_id, &req.group_id);
                }
                req.member_id.clone()
            }
            Some(instance) => {
                let Some(m) = group.by_instance(instance) else {
                    return refuse(
                        ResponseError::UnknownMemberId,
                        format!("Instance id {instance} is unknown."),
                    );
                };
                if m.id != req.member_id {
                    return fenced_instance(&req.member_id, instance, &m.id);
                }
                m.id.clone()
            }
        };
        if req.member_epoch == LEAVE_STATIC_EPOCH && req.instance_id.is_some() {
            // Away for now: it keeps its partitions until it returns or its session ends.
            if let Some(m) = group.members.get_mut(&id) {
                m.current.epoch = LEAVE_STATIC_EPOCH;
                m.current.revoking.clear();
                m.current.state = MemberState::Stable;
                m.revocation_deadline_ms = None;
                records.push(StateRecord::Member {
                    group: group.id.clone(),
                    member: Box::new(MemberRecord::of(m)),
                });
            }
        } else {
            remove_member(group, &id, records);
        }
        Ok(HeartbeatResponse {
            member_id: req.member_id.clone(),
            member_epoch: req.member_epoch,
            heartbeat_interval_ms: 0,
            assignment: None,
        })
    }

    /// Advances time: members whose session ended, or that did not revoke within their
    /// rebalance timeout, are removed. Returns the durable changes.
    pub fn tick(&mut self, now_ms: i64) -> Vec<StateRecord> {
        let session = i64::from(self.config.session_timeout_ms);
        let mut records = Vec::new();
        for group in self.groups.values_mut() {
            let gone: Vec<String> = group
                .members
                .values()
                .filter(|m| {
                    m.last_heartbeat_ms + session <= now_ms
                        || m.revocation_deadline_ms.is_some_and(|d| d <= now_ms)
                })
                .map(|m| m.id.clone())
                .collect();
            for id in gone {
                remove_member(group, &id, &mut records);
            }
        }
        records
    }

    /// Judges an OffsetCommit's member id and epoch (Kafka's rules for consumer groups:
    /// epoch -1 without a member id is an admin commit, allowed only while the group is
    /// empty; otherwise the member must exist and the epoch be its current one).
    pub fn check_commit(
        &self,
        group_id: &str,
        member_id: &str,
        member_epoch: i32,
        version: i16,
    ) -> OffsetCheck {
        let Some(g) = self.groups.get(group_id) else {
            return OffsetCheck::Accept;
        };
        if member_epoch < 0 && g.members.is_empty() {
            return OffsetCheck::Accept;
        }
        let Some(m) = g.members.get(member_id) else {
            return OffsetCheck::Reject(ResponseError::UnknownMemberId);
        };
        if version < 9 {
            return OffsetCheck::Reject(ResponseError::UnsupportedVersion);
        }
        if member_epoch != m.current.epoch {
            return OffsetCheck::Reject(ResponseError::StaleMemberEpoch);
        }
        OffsetCheck::Accept
    }

    /// Judges an OffsetFetch's member id and epoch (neither given: an admin fetch).
    pub fn check_fetch(
        &self,
        group_id: &str,
        member_id: Option<&str>,
        member_epoch: i32,
    ) -> OffsetCheck {
        let Some(g) = self.groups.get(group_id) else {
            return OffsetCheck::Accept;
        };
        if member_id.is_none() && member_epoch < 0 {
            return OffsetCheck::Accept;
        }
        match member_id.and_then(|id| g.members.get(id)) {
            None => OffsetCheck::Reject(ResponseError::UnknownMemberId),
            Some(m) if m.current.epoch != member_epoch => {
                OffsetCheck::Reject(ResponseError::StaleMemberEpoch)
            }
            Some(_) => OffsetCheck::Accept,
        }
    }

    /// Describes a group.
    pub fn describe(&self, group_id: &str) -> Option<GroupDescription> {
        let g = self.groups.get(group_id)?;
        Some(GroupDescription {
            state: g.state(),
            epoch: g.epoch,
            assignment_epoch: g.assignment_epoch,
            assignor: g.assignor(),
            members: g
                .members
                .values()
                .map(|m| MemberDescription {
                    member: MemberRecord::of(m),
                    target: g.target.get(&m.id).cloned().unwrap_or_default(),
                })
                .collect(),
        })
    }

    /// Every group with its state and member count, in id order.
    pub fn list(&self) -> Vec<(String, ConsumerGroupState, usize)> {
        self.groups
            .values()
            .map(|g| (g.id.clone(), g.state(), g.members.len()))
            .collect()
    }

    /// True when a consumer group of this id exists.
    pub fn contains(&self, group_id: &str) -> bool {
        self.groups.contains_key(group_id)
    }

    /// True when the group has members.
    pub fn has_members(&self, group_id: &str) -> bool {
        self.groups
            .get(group_id)
            .is_some_and(|g| !g.members.is_empty())
    }

    /// Topics the group's members subscribe to (OffsetDelete's GROUP_SUBSCRIBED_TO_TOPIC).
    pub fn subscribed_topics(&self, group_id: &str) -> Vec<String> {
        self.groups
            .get(group_id)
            .map(|g| g.subscribed_names().into_iter().collect())
            .unwrap_or_default()
    }

    /// Deletes an empty group (DeleteGroups, or a classic group taking the id over).
    pub fn delete(&mut self, group_id: &str) -> Result<Vec<StateRecord>, ResponseError> {
        match self.groups.get(group_id) {
            None => Err(ResponseError::GroupIdNotFound),
            Some(g) if !g.members.is_empty() => Err(ResponseError::NonEmptyGroup),
            Some(_) => {
                self.groups.remove(group_id);
                Ok(vec![StateRecord::GroupDeleted {
                    group: group_id.to_string(),
                }])
            }
        }
    }

    /// Drops every group `which` names (another coordinator has them now).
    pub fn forget(&mut self, which: impl Fn(&str) -> bool) {
        self.groups.retain(|id, _| !which(id));
    }

    /// Takes in the groups of `other` (rebuilt from an offsets partition this coordinator
    /// just took over), replacing any of the same id.
    pub fn absorb(&mut self, other: ConsumerGroups) {
        self.groups.extend(other.groups);
    }

    /// Every durable record that rebuilds the groups as they are now (for rewriting the
    /// offsets log).
    pub fn records(&self) -> Vec<StateRecord> {
        self.records_of(|_| true)
    }

    /// [`ConsumerGroups::records`] of the groups `which` names.
    pub fn records_of(&self, which: impl Fn(&str) -> bool) -> Vec<StateRecord> {
        let mut out = Vec::new();
        for g in self.groups.values().filter(|g| which(&g.id)) {
            out.push(StateRecord::Group {
                group: g.id.clone(),
                epoch: g.epoch,
            });
            for m in g.members.values() {
                out.push(StateRecord::Member {
                    group: g.id.clone(),
                    member: Box::new(MemberRecord::of(m)),
                });
            }
        }
        out
    }

    /// Applies a record read back from the offsets log. Call [`ConsumerGroups::restored`]
    /// once every record is applied.
    pub fn replay(&mut self, record: StateRecord) {
        match record {
            StateRecord::Group { group, epoch } => {
                let g = self
                    .groups
                    .entry(group.clone())
                    .or_insert_with(|| Group::new(&group));
                g.epoch = epoch;
                g.assignment_epoch = epoch;
            }
            StateRecord::GroupDeleted { group } => {
                self.groups.remove(&group);
            }
            StateRecord::Member { group, member } => {
                let r = *member;
                let g = self
                    .groups
                    .entry(group.clone())
                    .or_insert_with(|| Group::new(&group));
                let mut m = Member::new(r.member_id.clone(), 0);
                m.instance_id = r.instance_id;
                m.rack_id = r.rack_id;
                m.client_id = r.client_id;
                m.client_host = r.client_host;
                m.rebalance_timeout_ms = r.rebalance_timeout_ms;
                m.subscription = match &r.topic_regex {
                    Some(re) => Subscription::regex(re).unwrap_or_default(),
                    None => Subscription::names(r.topic_names),
                };
                m.server_assignor = r.server_assignor;
                m.current = Current {
                    state: r.state,
                    epoch: r.epoch,
                    previous_epoch: r.previous_epoch,
                    assigned: r.assigned,
                    revoking: r.revoking,
                };
                g.members.insert(r.member_id, m);
                g.subscriptions_changed();
            }
            StateRecord::MemberRemoved { group, member_id } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    g.members.remove(&member_id);
                    g.subscriptions_changed();
                }
            }
        }
    }

    /// Finishes a rebuild at `now_ms`: every member gets a fresh session, and each group's
    /// epoch moves on so a new target is computed from what members own (the target itself
    /// is not persisted).
    pub fn restored(&mut self, now_ms: i64) {
        for g in self.groups.values_mut() {
            for m in g.members.values_mut() {
                m.last_heartbeat_ms = now_ms;
                if m.current.state == MemberState::UnrevokedPartitions {
                    m.revocation_deadline_ms =
                        Some(now_ms + i64::from(m.rebalance_timeout_ms.max(0)));
                }
            }
            g.target = g
                .members
                .values()
                .map(|m| (m.id.clone(), m.current.assigned.clone()))
                .collect();
            if !g.members.is_empty() {
                // Past every epoch in use (a member's may be ahead of the last group record
                // written), so every member reconciles towards the new target.
                let newest = g
                    .members
                    .values()
                    .map(|m| m.current.epoch)
                    .max()
                    .unwrap_or(0);
                g.epoch = g.epoch.max(newest) + 1;
            }
        }
    }
}

fn unknown_member<T>(member_id: &str, group_id: &str) -> Result<T, HeartbeatError> {
    refuse(
        ResponseError::UnknownMemberId,
        format!("Member {member_id} is not a member of group {group_id}."),
    )
}

fn fenced_instance<T>(member_id: &str, instance: &str, by: &str) -> Result<T, HeartbeatError> {
    refuse(
        ResponseError::FencedInstanceId,
        format!("Static member {member_id} with instance id {instance} was fenced by member {by}."),
    )
}

fn remove_member(group: &mut Group, id: &str, records: &mut Vec<StateRecord>) {
    if group.remove(id).is_some() {
        records.push(StateRecord::MemberRemoved {
            group: group.id.clone(),
            member_id: id.to_string(),
        });
        records.push(StateRecord::Group {
            group: group.id.clone(),
            epoch: group.epoch,
        });
    }
}

/// Finds (or, on a join, creates) the heartbeating member and checks its epoch. Returns the
/// member's durable state before this heartbeat (`None` when it is new).
fn find_member(
    group: &mut Group,
    req: &HeartbeatRequest,
    now_ms: i64,
    records: &mut Vec<StateRecord>,
) -> Result<Option<MemberRecord>, HeartbeatError> {
    let joining = req.member_epoch == 0;
    let id = &req.member_id;
    if let Some(instance) = &req.instance_id {
        let existing = group
            .by_instance(instance)
            .map(|m| (m.id.clone(), m.is_away()));
        match existing {
            Some((old, away)) if joining && old != *id => {
                if !away {
                    return refuse(
                        ResponseError::UnreleasedInstanceId,
                        format!("Static member {id} with instance id {instance} cannot join the group because the instance id is owned by {old} member."),
                    );
                }
                // The instance is back under a new member id: it takes over the old
                // member's assignment, starting again from epoch 0.
                let Some(mut m) = group.members.remove(&old) else {
                    return unknown_member(&old, &group.id);
                };
                records.push(StateRecord::MemberRemoved {
                    group: group.id.clone(),
                    member_id: old.clone(),
                });
                m.id = id.clone();
                m.current.epoch = 0;
                m.current.previous_epoch = 0;
                if let Some(t) = group.target.remove(&old) {
                    group.target.insert(id.clone(), t);
                }
                let before = MemberRecord::of(&m);
                group.members.insert(id.clone(), m);
                return Ok(Some(before));
            }
            Some((old, _)) if old != *id => return fenced_instance(id, instance, &old),
            None if !joining => {
                return refuse(
                    ResponseError::UnknownMemberId,
                    format!("Instance id {instance} is unknown."),
                )
            }
            _ => {}
        }
    }
    match group.members.get_mut(id) {
        Some(m) if joining => {
            // A rejoin (after fencing, or a lost join answer): the client owns nothing now.
            let before = MemberRecord::of(m);
            m.current = Current::joining();
            m.revocation_deadline_ms = None;
            Ok(Some(before))
        }
        Some(m) => {
            let epoch = m.current.epoch;
            let lost_answer = req.member_epoch == m.current.previous_epoch
                && req
                    .owned
                    .as_ref()
                    .is_some_and(|o| is_subset(o, &m.current.assigned));
            if req.member_epoch > epoch || (req.member_epoch < epoch && !lost_answer) {
                return refuse(
                    ResponseError::FencedMemberEpoch,
                    format!("The consumer group member has a member epoch ({}) other than the one known by the group coordinator ({epoch}). The member must abandon all its partitions and rejoin.", req.member_epoch),
                );
            }
            Ok(Some(MemberRecord::of(m)))
        }
        None if joining => {
            group
                .members
                .insert(id.clone(), Member::new(id.clone(), now_ms));
            Ok(None)
        }
        None => unknown_member(id, &group.id),
    }
}

fn is_subset(a: &TopicPartitions, b: &TopicPartitions) -> bool {
    a.iter()
        .all(|(t, ps)| ps.is_empty() || b.get(t).is_some_and(|q| ps.is_subset(q)))
}

/// Kafka's request checks; returns the new subscription when the request carries one.
fn validate(req: &HeartbeatRequest) -> Result<Option<Subscription>, HeartbeatError> {
    let invalid = |m: &str| refuse(ResponseError::InvalidRequest, m);
    if req.group_id.is_empty() {
        return invalid("GroupId can't be empty.");
    }
    if req.instance_id.as_deref() == Some("") {
        return invalid("InstanceId can't be empty.");
    }
    if req.rack_id.as_deref() == Some("") {
        return invalid("RackId can't be empty.");
    }
    if req.version >= 1 && req.member_id.is_empty() {
        return invalid("MemberId can't be empty.");
    }
    match req.member_epoch {
        e if e > 0 || e == LEAVE_EPOCH => {
            if req.member_id.is_empty() {
                return invalid("MemberId can't be empty.");
            }
        }
        0 => {
            if req.rebalance_timeout_ms == -1 {
                return invalid("RebalanceTimeoutMs must be provided in first request.");
            }
            if req.owned.as_ref().is_none_or(|o| !o.is_empty()) {
                return invalid("TopicPartitions must be empty when (re-)joining.");
            }
            if req.subscribed_topic_names.is_none() && req.subscribed_topic_regex.is_none() {
                return invalid("Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when (re-)joining.");
            }
        }
        LEAVE_STATIC_EPOCH => {
            if req.member_id.is_empty() {
                return invalid("MemberId can't be empty.");
            }
            if req.instance_id.is_none() {
                return invalid("InstanceId can't be null.");
            }
        }
        _ => return invalid("MemberEpoch is invalid."),
    }
    if let Some(a) = &req.server_assignor {
        if Assignor::parse(a).is_none() {
            let names: Vec<&str> = Assignor::ALL.iter().map(|a| a.name()).collect();
            return refuse(
                ResponseError::UnsupportedAssignor,
                format!(
                    "ServerAssignor {a} is not supported. Supported assignors: {}.",
                    names.join(", ")
                ),
            );
        }
    }
    match (&req.subscribed_topic_regex, &req.subscribed_topic_names) {
        (Some(re), _) if re.is_empty() => invalid("SubscribedTopicRegex must not be empty."),
        (Some(re), _) => Subscription::regex(re)
            .map(Some)
            .map_err(|why| HeartbeatError {
                error: ResponseError::InvalidRegularExpression,
                message: format!("SubscribedTopicRegex {re} is invalid: {why}"),
            }),
        (None, Some(names)) => Ok(Some(Subscription::names(names.clone()))),
        (None, None) => Ok(None),
    }
}
