//! Share group membership (ShareGroupHeartbeat, v1: Kafka 4.1+ semantics) as a pure state
//! machine.
//!
//! A consumer makes up its member id (a UUID) and joins with member epoch 0 and its
//! subscribed topic names; it then heartbeats with the epoch it was given, and leaves with
//! epoch -1. The group epoch moves whenever members join or go, subscriptions change, or the
//! subscribed topics change (created, deleted, partitions added); the assignor then computes
//! the target assignment for that epoch (the assignment epoch). Partitions are shared, so
//! there is nothing to revoke: a member moves to the assignment epoch and gets its new
//! partitions on its next heartbeat. A member that does not heartbeat within the session
//! timeout is removed. Members that go away come out as [`GroupEvent`]s: the broker releases
//! the records they hold in every share-partition.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::error::ResponseError;
use uuid::Uuid;

use crate::assignor::{assign, Assignment, MemberSpec, TopicsView};

/// The member epoch with which a member leaves the group.
pub const LEAVE_EPOCH: i32 = -1;

/// Share group settings (Kafka's `group.share.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareGroupConfig {
    /// A member without a heartbeat for this long is removed (`group.share.session.timeout.ms`).
    pub session_timeout_ms: i64,
    /// How often members heartbeat (`group.share.heartbeat.interval.ms`).
    pub heartbeat_interval_ms: i32,
    /// Most members in the group (`group.share.max.size`).
    pub max_size: usize,
}

impl Default for ShareGroupConfig {
    fn default() -> Self {
        Self {
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
            max_size: 200,
        }
    }
}

/// A ShareGroupHeartbeat request, without wire details.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeartbeatRequest {
    /// The member id the consumer made up; never empty.
    pub member_id: String,
    /// 0 to join, -1 to leave, otherwise the member's current epoch.
    pub member_epoch: i32,
    /// Rack; `None` when not given or unchanged.
    pub rack_id: Option<String>,
    /// Subscribed topic names; `None` when unchanged (required on join).
    pub subscribed_topic_names: Option<Vec<String>>,
    /// Client id (for describe).
    pub client_id: String,
    /// Client host (for describe).
    pub client_host: String,
}

/// A successful heartbeat's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatReply {
    /// The member's id.
    pub member_id: String,
    /// Its epoch now (-1 after leaving).
    pub member_epoch: i32,
    /// When to heartbeat next.
    pub heartbeat_interval_ms: i32,
    /// Its assignment when it joined or when it changed; `None` otherwise.
    pub assignment: Option<Assignment>,
}

// A refused heartbeat is the same for share and consumer groups.
use spate_groups::consumer_group::refuse;
pub use spate_groups::consumer_group::HeartbeatError;

/// Why a member went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemovalReason {
    /// It left (epoch -1).
    Left,
    /// No heartbeat within the session timeout.
    SessionExpired,
    /// It joined again (epoch 0) with the id of a current member: it started over and no
    /// longer processes what it held.
    Rejoined,
}

/// Something the broker acts on after a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupEvent {
    /// A new member joined.
    MemberJoined {
        /// Its id.
        member_id: String,
    },
    /// The member's acquired records must be released in every share-partition of the group
    /// ([`crate::SharePartition::release_member`]).
    MemberRemoved {
        /// Its id.
        member_id: String,
        /// Why.
        reason: RemovalReason,
    },
    /// Partitions that no member had before are now assigned: their share-partition state
    /// must exist (initialized with `share.auto.offset.reset` if new).
    PartitionsAssigned(Assignment),
}

/// The state of a share group (ShareGroupDescribe, ListGroups).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareGroupState {
    /// No members.
    Empty,
    /// Members. (Share groups have nothing to revoke, so Kafka knows no reconciling state.)
    Stable,
}

impl ShareGroupState {
    /// Kafka's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Empty => "Empty",
            Self::Stable => "Stable",
        }
    }
}

#[derive(Debug, Clone)]
struct Member {
    epoch: i32,
    /// The epoch before the last change, still accepted: the answer that moved the member
    /// may have been lost.
    previous_epoch: i32,
    rack_id: Option<String>,
    client_id: String,
    client_host: String,
    subscribed: BTreeSet<String>,
    assignment: Assignment,
    deadline_ms: i64,
}

/// One member, as ShareGroupDescribe shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberDescription {
    /// Member id.
    pub member_id: String,
    /// Rack.
    pub rack_id: Option<String>,
    /// Member epoch.
    pub member_epoch: i32,
    /// Client id.
    pub client_id: String,
    /// Client host.
    pub client_host: String,
    /// Subscribed topic names.
    pub subscribed_topic_names: Vec<String>,
    /// Current assignment.
    pub assignment: Assignment,
}

/// A share group, as ShareGroupDescribe shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    /// Group id.
    pub group_id: String,
    /// State.
    pub state: ShareGroupState,
    /// Group epoch.
    pub group_epoch: i32,
    /// Epoch of the target assignment.
    pub assignment_epoch: i32,
    /// Assignor name.
    pub assignor_name: &'static str,
    /// Members, by id.
    pub members: Vec<MemberDescription>,
}

/// The membership of one share group.
#[derive(Debug, Clone)]
pub struct ShareGroup {
    id: String,
    config: ShareGroupConfig,
    group_epoch: i32,
    assignment_epoch: i32,
    members: BTreeMap<String, Member>,
    target: BTreeMap<String, Assignment>,
    /// The subscribed topics as of the last assignment.
    topics: TopicsView,
    /// Every partition some member's target assignment holds.
    assigned: BTreeSet<(Uuid, i32)>,
}

impl ShareGroup {
    /// An empty group.
    pub fn new(id: &str, config: ShareGroupConfig) -> Self {
        Self {
            id: id.to_string(),
            config,
            group_epoch: 0,
            assignment_epoch: 0,
            members: BTreeMap::new(),
            target: BTreeMap::new(),
            topics: TopicsView::new(),
            assigned: BTreeSet::new(),
        }
    }

    /// Group id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The group epoch.
    pub fn group_epoch(&self) -> i32 {
        self.group_epoch
    }

    /// The epoch of the target assignment.
    pub fn assignment_epoch(&self) -> i32 {
        self.assignment_epoch
    }

    /// Number of members.
    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// Whether the group has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The target assignment of a member.
    pub fn target_assignment(&self, member_id: &str) -> Option<&Assignment> {
        self.target.get(member_id)
    }

    /// The state.
    pub fn state(&self) -> ShareGroupState {
        if self.members.is_empty() {
            ShareGroupState::Empty
        } else {
            ShareGroupState::Stable
        }
    }

    /// The names of all topics some member subscribes to.
    pub fn subscribed_topic_names(&self) -> BTreeSet<String> {
        self.members
            .values()
            .flat_map(|m| m.subscribed.iter().cloned())
            .collect()
    }

    /// Handles a ShareGroupHeartbeat at `now`; `topics` are the topics that exist now.
    pub fn heartbeat(
        &mut self,
        req: &HeartbeatRequest,
        topics: &TopicsView,
        now: i64,
    ) -> (Result<HeartbeatReply, HeartbeatError>, Vec<GroupEvent>) {
        let mut events = Vec::new();
        let reply = self.heartbeat_inner(req, topics, now, &mut events);
        (reply, events)
    }

    fn heartbeat_inner(
        &mut self,
        req: &HeartbeatRequest,
        topics: &TopicsView,
        now: i64,
        events: &mut Vec<GroupEvent>,
    ) -> Result<HeartbeatReply, HeartbeatError> {
        if req.member_id.is_empty() {
            return refuse(ResponseError::InvalidRequest, "MemberId can't be empty.");
        }
        if req.member_epoch < LEAVE_EPOCH {
            return refuse(ResponseError::InvalidRequest, "MemberEpoch is invalid.");
        }
        if req.rack_id.as_deref() == Some("") {
            return refuse(ResponseError::InvalidRequest, "RackId can't be empty.");
        }
        if req.member_epoch == 0
            && req
                .subscribed_topic_names
                .as_ref()
                .is_none_or(|names| names.is_empty())
        {
            return refuse(
                ResponseError::InvalidRequest,
                "SubscribedTopicNames must be set in first request.",
            );
        }
        if req.member_epoch == LEAVE_EPOCH {
            if !self.members.contains_key(&req.member_id) {
                return refuse(
                    ResponseError::UnknownMemberId,
                    format!("member {} is not in group {}", req.member_id, self.id),
                );
            }
            self.remove(&req.member_id, RemovalReason::Left, events);
            self.maybe_reassign(topics, events);
            return Ok(HeartbeatReply {
                member_id: req.member_id.clone(),
                member_epoch: LEAVE_EPOCH,
                heartbeat_interval_ms: self.config.heartbeat_interval_ms,
                assignment: None,
            });
        }
        let joining = req.member_epoch == 0;
        match self.members.get(&req.member_id) {
            None if !joining => {
                return refuse(
                    ResponseError::UnknownMemberId,
                    format!("member {} is not in group {}", req.member_id, self.id),
                )
            }
            None if self.members.len() >= self.config.max_size => {
                return refuse(
                    ResponseError::GroupMaxSizeReached,
                    format!("group {} has reached its maximum size", self.id),
                )
            }
            Some(m)
                if !joining
                    && m.epoch != req.member_epoch
                    && m.previous_epoch != req.member_epoch =>
            {
                return refuse(
                    ResponseError::FencedMemberEpoch,
                    format!(
                        "member epoch {} is not the current epoch {}",
                        req.member_epoch, m.epoch
                    ),
                )
            }
            _ => {}
        }
        let deadline_ms = now.saturating_add(self.config.session_timeout_ms);
        let is_new = !self.members.contains_key(&req.member_id);
        if is_new {
            self.members.insert(
                req.member_id.clone(),
                Member {
                    epoch: 0,
                    previous_epoch: 0,
                    rack_id: None,
                    client_id: String::new(),
                    client_host: String::new(),
                    subscribed: BTreeSet::new(),
                    assignment: Assignment::new(),
                    deadline_ms,
                },
            );
            self.group_epoch += 1;
            events.push(GroupEvent::MemberJoined {
                member_id: req.member_id.clone(),
            });
        } else if joining {
            // A current member started over: whatever it held is no longer processed.
            events.push(GroupEvent::MemberRemoved {
                member_id: req.member_id.clone(),
                reason: RemovalReason::Rejoined,
            });
        }
        let mut bump = false;
        if let Some(m) = self.members.get_mut(&req.member_id) {
            m.deadline_ms = deadline_ms;
            if joining {
                m.previous_epoch = 0;
                m.epoch = 0;
                m.assignment = Assignment::new();
            }
            if req.rack_id.is_some() {
                m.rack_id = req.rack_id.clone();
            }
            m.client_id = req.client_id.clone();
            m.client_host = req.client_host.clone();
            if let Some(names) = &req.subscribed_topic_names {
                let names: BTreeSet<String> = names.iter().cloned().collect();
                if names != m.subscribed {
                    m.subscribed = names;
                    bump = true;
                }
            }
        }
        if bump && !is_new {
            self.group_epoch += 1;
        }
        self.maybe_reassign(topics, events);
        let target_epoch = self.assignment_epoch;
        let target = self.target.get(&req.member_id).cloned().unwrap_or_default();
        let interval = self.config.heartbeat_interval_ms;
        let m = self
            .members
            .get_mut(&req.member_id)
            .ok_or_else(|| HeartbeatError {
                error: ResponseError::UnknownMemberId,
                message: "member vanished".to_string(),
            })?;
        let changed = m.assignment != target;
        let behind = req.member_epoch != m.epoch;
        if m.epoch != target_epoch {
            m.previous_epoch = m.epoch;
            m.epoch = target_epoch;
        }
        m.assignment = target;
        // Kafka sends the assignment to a member that joins and when it changes; also to a
        // member that comes with its previous epoch, which may have missed the change.
        let send = joining || changed || behind;
        Ok(HeartbeatReply {
            member_id: req.member_id.clone(),
            member_epoch: m.epoch,
            heartbeat_interval_ms: interval,
            assignment: send.then(|| m.assignment.clone()),
        })
    }

    /// Removes the members whose session expired by `now`; `topics` are the topics that exist
    /// now. Returns the events (removals, and partitions newly assigned to the others).
    pub fn expire_sessions(&mut self, topics: &TopicsView, now: i64) -> Vec<GroupEvent> {
        let mut events = Vec::new();
        let expired: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| m.deadline_ms <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            self.remove(&id, RemovalReason::SessionExpired, &mut events);
        }
        self.maybe_reassign(topics, &mut events);
        events
    }

    /// The earliest session deadline, for the broker's timer.
    pub fn next_deadline(&self) -> Option<i64> {
        self.members.values().map(|m| m.deadline_ms).min()
    }

    /// Takes the topics that exist now into account (created, deleted, partitions added)
    /// without waiting for a heartbeat.
    pub fn topics_changed(&mut self, topics: &TopicsView) -> Vec<GroupEvent> {
        let mut events = Vec::new();
        self.maybe_reassign(topics, &mut events);
        events
    }

    /// ShareGroupDescribe.
    pub fn describe(&self) -> GroupDescription {
        GroupDescription {
            group_id: self.id.clone(),
            state: self.state(),
            group_epoch: self.group_epoch,
            assignment_epoch: self.assignment_epoch,
            assignor_name: "simple",
            members: self
                .members
                .iter()
                .map(|(id, m)| MemberDescription {
                    member_id: id.clone(),
                    rack_id: m.rack_id.clone(),
                    member_epoch: m.epoch,
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    subscribed_topic_names: m.subscribed.iter().cloned().collect(),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    fn remove(&mut self, id: &str, reason: RemovalReason, events: &mut Vec<GroupEvent>) {
        if self.members.remove(id).is_some() {
            self.target.remove(id);
            self.group_epoch += 1;
            events.push(GroupEvent::MemberRemoved {
                member_id: id.to_string(),
                reason,
            });
        }
    }

    /// Bumps the group epoch if the subscribed topics changed, and recomputes the target
    /// assignment if the group epoch moved past it.
    fn maybe_reassign(&mut self, topics: &TopicsView, events: &mut Vec<GroupEvent>) {
        let names = self.subscribed_topic_names();
        let relevant: TopicsView = topics
            .iter()
            .filter(|(n, _)| names.contains(*n))
            .map(|(n, v)| (n.clone(), *v))
            .collect();
        if relevant != self.topics {
            self.topics = relevant;
            // Only a change in what is assigned matters: a new subscription already bumped it.
            if self.group_epoch == self.assignment_epoch {
                self.group_epoch += 1;
            }
        }
        if self.group_epoch <= self.assignment_epoch {
            return;
        }
        let specs: BTreeMap<String, MemberSpec> = self
            .members
            .iter()
            .map(|(id, m)| {
                (
                    id.clone(),
                    MemberSpec {
                        subscribed: m.subscribed.clone(),
                        current: self.target.get(id).cloned().unwrap_or_default(),
                    },
                )
            })
            .collect();
        self.target = assign(&specs, &self.topics);
        self.assignment_epoch = self.group_epoch;
        let now_assigned = flatten(self.target.values());
        let mut added = Assignment::new();
        for &(id, p) in now_assigned.difference(&self.assigned) {
            added.entry(id).or_default().insert(p);
        }
        self.assigned = now_assigned;
        if !added.is_empty() {
            events.push(GroupEvent::PartitionsAssigned(added));
        }
    }
}

fn flatten<'a>(assignments: impl Iterator<Item = &'a Assignment>) -> BTreeSet<(Uuid, i32)> {
    assignments
        .flat_map(|a| {
            a.iter()
                .flat_map(|(id, ps)| ps.iter().map(move |p| (*id, *p)))
        })
        .collect()
}
