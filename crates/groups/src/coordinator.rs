//! The classic group membership protocol as a pure state machine.
//!
//! States follow Kafka's: Empty -> PreparingRebalance (members (re)join) -> CompletingRebalance
//! (the leader computes assignments) -> Stable, and back to PreparingRebalance whenever
//! membership or subscriptions change. JoinGroup and SyncGroup requests are parked with a
//! [`Token`] until the group can answer them; every call returns the [`Reply`]s it released.

use std::collections::HashMap;

use bytes::Bytes;
use spate_protocol::ResponseError;

/// Identifies a parked request so its answer can find its way back.
pub type Token = u64;

/// Group-wide settings (Kafka's group.* broker configs).
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// Shortest session timeout a member may ask for.
    pub min_session_timeout_ms: i32,
    /// Longest session timeout a member may ask for.
    pub max_session_timeout_ms: i32,
    /// How long the first rebalance of an empty group waits for more members.
    pub initial_rebalance_delay_ms: i64,
    /// Most members a group may have.
    pub max_group_size: usize,
    /// Largest total protocol metadata one member may send (the default max.message.bytes).
    pub max_member_metadata_bytes: usize,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            min_session_timeout_ms: 6_000,
            max_session_timeout_ms: 1_800_000,
            initial_rebalance_delay_ms: 3_000,
            max_group_size: usize::MAX,
            max_member_metadata_bytes: 1 << 20,
        }
    }
}

/// Where a group is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    /// No members (offsets may remain).
    Empty,
    /// Waiting for members to (re)join.
    PreparingRebalance,
    /// Waiting for the leader's assignment.
    CompletingRebalance,
    /// Everyone has an assignment.
    Stable,
}

impl GroupState {
    /// The name Kafka's tools print.
    pub fn name(self) -> &'static str {
        match self {
            Self::Empty => "Empty",
            Self::PreparingRebalance => "PreparingRebalance",
            Self::CompletingRebalance => "CompletingRebalance",
            Self::Stable => "Stable",
        }
    }
}

/// A JoinGroup, stripped of wire details.
#[derive(Debug, Clone, Default)]
pub struct JoinRequest {
    /// Group to join.
    pub group_id: String,
    /// Empty on first join.
    pub member_id: String,
    /// Static membership id (KIP-345).
    pub group_instance_id: Option<String>,
    /// Member is evicted after this long without a heartbeat.
    pub session_timeout_ms: i32,
    /// How long a rebalance waits for this member to rejoin.
    pub rebalance_timeout_ms: i32,
    /// "consumer" for consumers.
    pub protocol_type: String,
    /// Assignors the member supports, in preference order, each with its metadata.
    pub protocols: Vec<(String, Bytes)>,
    /// Reported by DescribeGroups.
    pub client_id: String,
    /// Reported by DescribeGroups.
    pub client_host: String,
    /// JoinGroup v4+: a new dynamic member first gets an id and must rejoin with it.
    pub require_known_member_id: bool,
}

/// One member as the leader sees it in its JoinGroup answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinedMember {
    /// Member id.
    pub member_id: String,
    /// Static id, if any.
    pub group_instance_id: Option<String>,
    /// The member's metadata for the chosen protocol.
    pub metadata: Bytes,
}

/// The answer to a JoinGroup.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JoinResponse {
    /// Failure, if any (MEMBER_ID_REQUIRED still carries `member_id`).
    pub error: Option<ResponseError>,
    /// Generation the member joined.
    pub generation_id: i32,
    /// The group's protocol type.
    pub protocol_type: Option<String>,
    /// The chosen assignor.
    pub protocol_name: Option<String>,
    /// The leader's member id.
    pub leader: String,
    /// This member's id.
    pub member_id: String,
    /// Everyone, for the leader; empty for the others.
    pub members: Vec<JoinedMember>,
}

/// A SyncGroup, stripped of wire details.
#[derive(Debug, Clone, Default)]
pub struct SyncRequest {
    /// Group.
    pub group_id: String,
    /// Generation the member believes in.
    pub generation_id: i32,
    /// Member id.
    pub member_id: String,
    /// Static id, if any.
    pub group_instance_id: Option<String>,
    /// v5+: must match the group's.
    pub protocol_type: Option<String>,
    /// v5+: must match the group's.
    pub protocol_name: Option<String>,
    /// The leader's assignment per member; empty from followers.
    pub assignments: Vec<(String, Bytes)>,
}

/// The answer to a SyncGroup.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SyncResponse {
    /// Failure, if any.
    pub error: Option<ResponseError>,
    /// The group's protocol type.
    pub protocol_type: Option<String>,
    /// The chosen assignor.
    pub protocol_name: Option<String>,
    /// This member's assignment.
    pub assignment: Bytes,
}

/// An answer released by a call, for a request parked under `Token`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Answer a JoinGroup.
    Join(Token, JoinResponse),
    /// Answer a SyncGroup.
    Sync(Token, SyncResponse),
}

/// Whether an OffsetCommit may proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitCheck {
    /// Commit.
    Accept,
    /// Refuse every partition with this error.
    Reject(ResponseError),
}

/// DescribeGroups output for one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberDescription {
    /// Member id.
    pub member_id: String,
    /// Static id.
    pub group_instance_id: Option<String>,
    /// Client id.
    pub client_id: String,
    /// Client address.
    pub client_host: String,
    /// Metadata for the chosen protocol.
    pub metadata: Bytes,
    /// Current assignment.
    pub assignment: Bytes,
}

/// DescribeGroups output for one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    /// State.
    pub state: GroupState,
    /// Protocol type ("" when none).
    pub protocol_type: String,
    /// Chosen assignor ("" unless stable or completing).
    pub protocol: String,
    /// Members.
    pub members: Vec<MemberDescription>,
}

#[derive(Debug)]
struct Member {
    id: String,
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout_ms: i64,
    rebalance_timeout_ms: i64,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    join_waiting: Option<Token>,
    sync_waiting: Option<Token>,
    last_heartbeat_ms: i64,
}

impl Member {
    fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

#[derive(Debug)]
struct Group {
    state: GroupState,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    /// Members in join order: the first becomes leader when there is none.
    members: Vec<Member>,
    /// Dynamic members told MEMBER_ID_REQUIRED, with the time they must rejoin by.
    pending: HashMap<String, i64>,
    rebalance_deadline_ms: i64,
    /// Empty groups wait this long for company before the first rebalance completes.
    initial_delay_until_ms: i64,
    rebalance_started_ms: i64,
}

impl Group {
    fn new() -> Self {
        Self {
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: Vec::new(),
            pending: HashMap::new(),
            rebalance_deadline_ms: 0,
            initial_delay_until_ms: 0,
            rebalance_started_ms: 0,
        }
    }

    fn member(&self, id: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.id == id)
    }

    fn member_mut(&mut self, id: &str) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.id == id)
    }

    fn by_instance(&self, instance: &str) -> Option<usize> {
        self.members
            .iter()
            .position(|m| m.instance_id.as_deref() == Some(instance))
    }

    /// Checks a request's member id against the group, honouring static membership fencing.
    fn check_member(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<(), ResponseError> {
        if let Some(instance) = instance_id {
            if let Some(i) = self.by_instance(instance) {
                return if self.members[i].id == member_id {
                    Ok(())
                } else {
                    Err(ResponseError::FencedInstanceId)
                };
            }
        }
        match self.member(member_id) {
            Some(_) => Ok(()),
            None => Err(ResponseError::UnknownMemberId),
        }
    }

    /// Protocols every member (and `extra`) supports, in the order of the first member's list.
    fn common_protocols(&self, extra: Option<&[(String, Bytes)]>) -> Vec<String> {
        let mut lists: Vec<&[(String, Bytes)]> = self
            .members
            .iter()
            .map(|m| m.protocols.as_slice())
            .collect();
        if let Some(e) = extra {
            lists.push(e);
        }
        let Some(first) = lists.first() else {
            return Vec::new();
        };
        first
            .iter()
            .map(|(n, _)| n.clone())
            .filter(|n| lists.iter().all(|l| l.iter().any(|(m, _)| m == n)))
            .collect()
    }

    /// Kafka's choice: each member votes for its most preferred common protocol.
    fn select_protocol(&self) -> Option<String> {
        let candidates = self.common_protocols(None);
        let mut votes: Vec<(String, usize)> = candidates.iter().map(|c| (c.clone(), 0)).collect();
        for m in &self.members {
            if let Some((name, _)) = m.protocols.iter().find(|(n, _)| candidates.contains(n)) {
                if let Some(v) = votes.iter_mut().find(|(c, _)| c == name) {
                    v.1 += 1;
                }
            }
        }
        // Ties go to the earlier candidate.
        votes
            .iter()
            .enumerate()
            .max_by_key(|(i, (_, n))| (*n, std::cmp::Reverse(*i)))
            .map(|(_, (c, _))| c.clone())
    }
}

/// All groups of this broker.
#[derive(Debug)]
pub struct Coordinator {
    config: CoordinatorConfig,
    groups: HashMap<String, Group>,
    /// Distinguishes member ids across broker restarts.
    nonce: u64,
    next_member: u64,
}

impl Coordinator {
    /// A coordinator with no groups. `nonce` should differ between broker runs.
    pub fn new(config: CoordinatorConfig, nonce: u64) -> Self {
        Self {
            config,
            groups: HashMap::new(),
            nonce,
            next_member: 0,
        }
    }

    fn new_member_id(&mut self, client_id: &str) -> String {
        self.next_member += 1;
        format!("{client_id}-{:016x}-{}", self.nonce, self.next_member)
    }

    /// Handles a JoinGroup parked under `token`.
    pub fn join(&mut self, now: i64, token: Token, req: JoinRequest) -> Vec<Reply> {
        let fail =
            |e: ResponseError, member_id: &str| vec![Reply::Join(token, join_error(e, member_id))];
        if req.group_id.is_empty() {
            return fail(ResponseError::InvalidGroupId, &req.member_id);
        }
        if req.session_timeout_ms < self.config.min_session_timeout_ms
            || req.session_timeout_ms > self.config.max_session_timeout_ms
        {
            return fail(ResponseError::InvalidSessionTimeout, &req.member_id);
        }
        if req.protocol_type.is_empty() || req.protocols.is_empty() {
            return fail(ResponseError::InconsistentGroupProtocol, &req.member_id);
        }
        if req
            .protocols
            .iter()
            .map(|(n, m)| n.len() + m.len())
            .sum::<usize>()
            > self.config.max_member_metadata_bytes
        {
            return fail(ResponseError::InvalidRequest, &req.member_id);
        }
        if !req.member_id.is_empty() && !self.groups.contains_key(&req.group_id) {
            return fail(ResponseError::UnknownMemberId, &req.member_id);
        }
        let new_id = req
            .member_id
            .is_empty()
            .then(|| self.new_member_id(&req.client_id));
        let max_size = self.config.max_group_size;
        let initial_delay = self.config.initial_rebalance_delay_ms;
        let group = self
            .groups
            .entry(req.group_id.clone())
            .or_insert_with(Group::new);
        if !group.members.is_empty() {
            let compatible = group.protocol_type.as_deref() == Some(req.protocol_type.as_str())
                && !group.common_protocols(Some(&req.protocols)).is_empty();
            // A known member changing its own protocols is judged without its old entry.
            let replacing_self = group.members.len() == 1 && group.member(&req.member_id).is_some();
            if !compatible && !replacing_self {
                return fail(ResponseError::InconsistentGroupProtocol, &req.member_id);
            }
        }
        let mut replies = Vec::new();
        let member_id = match new_id {
            Some(id) => {
                if let Some(instance) = req.group_instance_id.clone() {
                    if let Some(i) = group.by_instance(&instance) {
                        // A static member restarted: it takes over its old identity; the old
                        // id is fenced.
                        let old = &mut group.members[i];
                        if let Some(t) = old.join_waiting.take() {
                            replies.push(Reply::Join(
                                t,
                                join_error(ResponseError::FencedInstanceId, &old.id),
                            ));
                        }
                        if let Some(t) = old.sync_waiting.take() {
                            replies
                                .push(Reply::Sync(t, sync_error(ResponseError::FencedInstanceId)));
                        }
                        let old_id = std::mem::replace(&mut old.id, id.clone());
                        let unchanged = old.protocols == req.protocols;
                        old.protocols = req.protocols.clone();
                        old.session_timeout_ms = req.session_timeout_ms as i64;
                        old.rebalance_timeout_ms = req.rebalance_timeout_ms as i64;
                        old.last_heartbeat_ms = now;
                        if group.leader.as_deref() == Some(old_id.as_str()) {
                            group.leader = Some(id.clone());
                        }
                        if group.state == GroupState::Stable && unchanged {
                            replies.push(Reply::Join(token, join_answer(group, &id)));
                            return replies;
                        }
                        if let Some(m) = group.member_mut(&id) {
                            m.join_waiting = Some(token);
                        }
                        prepare_rebalance(group, now, initial_delay, &mut replies);
                        maybe_complete_join(group, now, &mut replies);
                        return replies;
                    }
                } else if req.require_known_member_id {
                    group
                        .pending
                        .insert(id.clone(), now + req.session_timeout_ms as i64);
                    replies.push(Reply::Join(
                        token,
                        JoinResponse {
                            error: Some(ResponseError::MemberIdRequired),
                            generation_id: -1,
                            member_id: id,
                            ..JoinResponse::default()
                        },
                    ));
                    return replies;
                }
                id
            }
            None => {
                let id = req.member_id.clone();
                if group.pending.remove(&id).is_none() {
                    if let Err(e) = group.check_member(&id, req.group_instance_id.as_deref()) {
                        return fail(e, &id);
                    }
                }
                id
            }
        };
        let is_new = group.member(&member_id).is_none();
        if is_new && group.members.len() >= max_size {
            return fail(ResponseError::GroupMaxSizeReached, &member_id);
        }
        if is_new {
            group.members.push(Member {
                id: member_id.clone(),
                instance_id: req.group_instance_id.clone(),
                client_id: req.client_id.clone(),
                client_host: req.client_host.clone(),
                session_timeout_ms: req.session_timeout_ms as i64,
                rebalance_timeout_ms: req.rebalance_timeout_ms as i64,
                protocols: req.protocols.clone(),
                assignment: Bytes::new(),
                join_waiting: Some(token),
                sync_waiting: None,
                last_heartbeat_ms: now,
            });
            group.protocol_type = Some(req.protocol_type.clone());
            prepare_rebalance(group, now, initial_delay, &mut replies);
            maybe_complete_join(group, now, &mut replies);
            return replies;
        }
        let is_leader = group.leader.as_deref() == Some(member_id.as_str());
        let state = group.state;
        let Some(m) = group.member_mut(&member_id) else {
            return fail(ResponseError::UnknownMemberId, &member_id);
        };
        let unchanged = m.protocols == req.protocols;
        m.protocols = req.protocols;
        m.session_timeout_ms = req.session_timeout_ms as i64;
        m.rebalance_timeout_ms = req.rebalance_timeout_ms as i64;
        m.last_heartbeat_ms = now;
        if let Some(old) = m.join_waiting.replace(token) {
            replies.push(Reply::Join(
                old,
                join_error(ResponseError::RebalanceInProgress, &member_id),
            ));
        }
        let answer_now = match state {
            GroupState::CompletingRebalance => unchanged,
            GroupState::Stable => unchanged && !is_leader,
            _ => false,
        };
        if answer_now {
            if let Some(m) = group.member_mut(&member_id) {
                m.join_waiting = None;
            }
            replies.push(Reply::Join(token, join_answer(group, &member_id)));
            return replies;
        }
        prepare_rebalance(group, now, initial_delay, &mut replies);
        maybe_complete_join(group, now, &mut replies);
        replies
    }

    /// Handles a SyncGroup parked under `token`.
    pub fn sync(&mut self, now: i64, token: Token, req: SyncRequest) -> Vec<Reply> {
        let fail = |e| vec![Reply::Sync(token, sync_error(e))];
        let Some(group) = self.groups.get_mut(&req.group_id) else {
            return fail(ResponseError::UnknownMemberId);
        };
        if let Err(e) = group.check_member(&req.member_id, req.group_instance_id.as_deref()) {
            return fail(e);
        }
        if req.generation_id != group.generation {
            return fail(ResponseError::IllegalGeneration);
        }
        let mismatch =
            |given: &Option<String>, ours: &Option<String>| given.is_some() && given != ours;
        if mismatch(&req.protocol_type, &group.protocol_type)
            || mismatch(&req.protocol_name, &group.protocol)
        {
            return fail(ResponseError::InconsistentGroupProtocol);
        }
        match group.state {
            GroupState::Empty => fail(ResponseError::UnknownMemberId),
            GroupState::PreparingRebalance => fail(ResponseError::RebalanceInProgress),
            GroupState::Stable => {
                let assignment = group
                    .member(&req.member_id)
                    .map(|m| m.assignment.clone())
                    .unwrap_or_default();
                if let Some(m) = group.member_mut(&req.member_id) {
                    m.last_heartbeat_ms = now;
                }
                vec![Reply::Sync(token, sync_ok(group, assignment))]
            }
            GroupState::CompletingRebalance => {
                let is_leader = group.leader.as_deref() == Some(req.member_id.as_str());
                if let Some(m) = group.member_mut(&req.member_id) {
                    m.last_heartbeat_ms = now;
                    if let Some(old) = m.sync_waiting.replace(token) {
                        return vec![Reply::Sync(
                            old,
                            sync_error(ResponseError::RebalanceInProgress),
                        )];
                    }
                }
                if !is_leader {
                    return Vec::new();
                }
                for m in &mut group.members {
                    m.assignment = req
                        .assignments
                        .iter()
                        .find(|(id, _)| *id == m.id)
                        .map(|(_, a)| a.clone())
                        .unwrap_or_default();
                }
                group.state = GroupState::Stable;
                let waiting: Vec<(Token, Bytes)> = group
                    .members
                    .iter_mut()
                    .filter_map(|m| m.sync_waiting.take().map(|t| (t, m.assignment.clone())))
                    .collect();
                waiting
                    .into_iter()
                    .map(|(t, a)| Reply::Sync(t, sync_ok(group, a)))
                    .collect()
            }
        }
    }

    /// Handles a Heartbeat; the answer is immediate.
    pub fn heartbeat(
        &mut self,
        now: i64,
        group_id: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Option<ResponseError> {
        let Some(group) = self.groups.get_mut(group_id) else {
            return Some(ResponseError::UnknownMemberId);
        };
        if let Err(e) = group.check_member(member_id, instance_id) {
            return Some(e);
        }
        let state = group.state;
        let current = group.generation;
        if let Some(m) = group.member_mut(member_id) {
            m.last_heartbeat_ms = now;
        }
        match state {
            GroupState::Empty => Some(ResponseError::UnknownMemberId),
            GroupState::PreparingRebalance => Some(ResponseError::RebalanceInProgress),
            GroupState::CompletingRebalance | GroupState::Stable if generation != current => {
                Some(ResponseError::IllegalGeneration)
            }
            _ => None,
        }
    }

    /// Handles a LeaveGroup for several members; returns each member's error and the replies
    /// the departure released.
    pub fn leave(
        &mut self,
        now: i64,
        group_id: &str,
        members: &[(String, Option<String>)],
    ) -> (
        Result<Vec<Option<ResponseError>>, ResponseError>,
        Vec<Reply>,
    ) {
        let initial_delay = self.config.initial_rebalance_delay_ms;
        let Some(group) = self.groups.get_mut(group_id) else {
            return (Err(ResponseError::UnknownMemberId), Vec::new());
        };
        let mut replies = Vec::new();
        let mut results = Vec::with_capacity(members.len());
        let mut left = false;
        for (member_id, instance) in members {
            // A static member may leave by instance id alone.
            let id = match (member_id.is_empty(), instance) {
                (true, Some(i)) => group.by_instance(i).map(|x| group.members[x].id.clone()),
                _ => Some(member_id.clone()),
            };
            let checked = id
                .ok_or(ResponseError::UnknownMemberId)
                .and_then(|id| group.check_member(&id, instance.as_deref()).map(|()| id));
            match checked {
                Ok(id) => {
                    remove_member(group, &id, &mut replies);
                    left = true;
                    results.push(None);
                }
                Err(e) => results.push(Some(e)),
            }
        }
        if left {
            if group.members.is_empty() {
                become_empty(group);
            } else {
                prepare_rebalance(group, now, initial_delay, &mut replies);
                maybe_complete_join(group, now, &mut replies);
            }
        }
        (Ok(results), replies)
    }

    /// Advances time: evicts members whose sessions expired, drops pending members that never
    /// rejoined, and completes rebalances whose wait is over.
    pub fn tick(&mut self, now: i64) -> Vec<Reply> {
        let initial_delay = self.config.initial_rebalance_delay_ms;
        let mut replies = Vec::new();
        for group in self.groups.values_mut() {
            group.pending.retain(|_, deadline| *deadline > now);
            let expired: Vec<String> = group
                .members
                .iter()
                .filter(|m| {
                    m.join_waiting.is_none() && m.last_heartbeat_ms + m.session_timeout_ms <= now
                })
                .map(|m| m.id.clone())
                .collect();
            if !expired.is_empty() {
                for id in &expired {
                    remove_member(group, id, &mut replies);
                }
                if group.members.is_empty() {
                    become_empty(group);
                } else {
                    prepare_rebalance(group, now, initial_delay, &mut replies);
                }
            }
            if group.state == GroupState::PreparingRebalance {
                if now >= group.rebalance_deadline_ms {
                    // Whoever has not rejoined by now is out.
                    let absent: Vec<String> = group
                        .members
                        .iter()
                        .filter(|m| m.join_waiting.is_none())
                        .map(|m| m.id.clone())
                        .collect();
                    for id in &absent {
                        remove_member(group, id, &mut replies);
                    }
                    complete_join(group, now, &mut replies);
                } else {
                    maybe_complete_join(group, now, &mut replies);
                }
            }
        }
        replies
    }

    /// Judges an OffsetCommit's membership fields (and counts it as a heartbeat).
    pub fn check_commit(
        &mut self,
        now: i64,
        group_id: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> CommitCheck {
        let Some(group) = self.groups.get_mut(group_id) else {
            return if generation < 0 {
                CommitCheck::Accept
            } else {
                CommitCheck::Reject(ResponseError::IllegalGeneration)
            };
        };
        if generation < 0 && member_id.is_empty() {
            // A consumer committing without group management (assign()).
            return if group.members.is_empty() {
                CommitCheck::Accept
            } else {
                CommitCheck::Reject(ResponseError::UnknownMemberId)
            };
        }
        if let Err(e) = group.check_member(member_id, instance_id) {
            return CommitCheck::Reject(e);
        }
        if generation != group.generation {
            return CommitCheck::Reject(ResponseError::IllegalGeneration);
        }
        if group.state == GroupState::CompletingRebalance {
            return CommitCheck::Reject(ResponseError::RebalanceInProgress);
        }
        if let Some(m) = group.member_mut(member_id) {
            m.last_heartbeat_ms = now;
        }
        CommitCheck::Accept
    }

    /// Describes a group, or `None` when it has no members and the coordinator forgot it.
    pub fn describe(&self, group_id: &str) -> Option<GroupDescription> {
        let g = self.groups.get(group_id)?;
        let protocol = match g.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                g.protocol.clone().unwrap_or_default()
            }
            _ => String::new(),
        };
        let show_members = matches!(
            g.state,
            GroupState::Stable | GroupState::CompletingRebalance
        );
        Some(GroupDescription {
            state: g.state,
            protocol_type: g.protocol_type.clone().unwrap_or_default(),
            members: g
                .members
                .iter()
                .map(|m| MemberDescription {
                    member_id: m.id.clone(),
                    group_instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: if show_members {
                        m.metadata_for(&protocol)
                    } else {
                        Bytes::new()
                    },
                    assignment: if g.state == GroupState::Stable {
                        m.assignment.clone()
                    } else {
                        Bytes::new()
                    },
                })
                .collect(),
            protocol,
        })
    }

    /// Every group the coordinator tracks, with state and protocol type.
    pub fn list(&self) -> Vec<(String, GroupState, String)> {
        let mut v: Vec<_> = self
            .groups
            .iter()
            .map(|(id, g)| {
                (
                    id.clone(),
                    g.state,
                    g.protocol_type.clone().unwrap_or_default(),
                )
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// True when the group has live members.
    pub fn has_members(&self, group_id: &str) -> bool {
        self.groups
            .get(group_id)
            .is_some_and(|g| !g.members.is_empty())
    }

    /// Topics the members of a consumer group subscribe to (from their subscription
    /// metadata), for OffsetDelete's GROUP_SUBSCRIBED_TO_TOPIC check.
    pub fn subscribed_topics(&self, group_id: &str) -> Vec<String> {
        let Some(g) = self.groups.get(group_id) else {
            return Vec::new();
        };
        if g.protocol_type.as_deref() != Some("consumer") {
            return Vec::new();
        }
        let mut topics: Vec<String> = g
            .members
            .iter()
            .flat_map(|m| {
                m.protocols
                    .first()
                    .map(|(_, meta)| subscription_topics(meta))
                    .unwrap_or_default()
            })
            .collect();
        topics.sort();
        topics.dedup();
        topics
    }

    /// Drops every group `which` names (another coordinator has them now). Returns the
    /// tokens of their parked joins and syncs, which will get no answer from here.
    pub fn forget(&mut self, which: impl Fn(&str) -> bool) -> Vec<Token> {
        let mut parked = Vec::new();
        self.groups.retain(|id, g| {
            if !which(id) {
                return true;
            }
            for m in &g.members {
                parked.extend(m.join_waiting);
                parked.extend(m.sync_waiting);
            }
            false
        });
        parked
    }

    /// Forgets an empty group (DeleteGroups).
    pub fn delete(&mut self, group_id: &str) -> Result<(), ResponseError> {
        match self.groups.get(group_id) {
            Some(g) if !g.members.is_empty() => Err(ResponseError::NonEmptyGroup),
            Some(_) => {
                self.groups.remove(group_id);
                Ok(())
            }
            None => Err(ResponseError::GroupIdNotFound),
        }
    }
}

/// Topic names from a ConsumerProtocolSubscription (int16 version, then an array of strings).
fn subscription_topics(meta: &Bytes) -> Vec<String> {
    let b = meta.as_ref();
    let read_i16 = |at: usize| b.get(at..at + 2).map(|x| i16::from_be_bytes([x[0], x[1]]));
    let mut topics = Vec::new();
    let (Some(_version), Some(count)) = (
        read_i16(0),
        b.get(2..6)
            .map(|x| i32::from_be_bytes([x[0], x[1], x[2], x[3]])),
    ) else {
        return topics;
    };
    let mut at = 6;
    for _ in 0..count.clamp(0, 10_000) {
        let Some(len) = read_i16(at) else { break };
        let Some(name) = b.get(at + 2..at + 2 + len.max(0) as usize) else {
            break;
        };
        topics.push(String::from_utf8_lossy(name).into_owned());
        at += 2 + len.max(0) as usize;
    }
    topics
}

fn join_error(e: ResponseError, member_id: &str) -> JoinResponse {
    JoinResponse {
        error: Some(e),
        generation_id: -1,
        member_id: member_id.to_string(),
        ..JoinResponse::default()
    }
}

fn sync_error(e: ResponseError) -> SyncResponse {
    SyncResponse {
        error: Some(e),
        ..SyncResponse::default()
    }
}

fn sync_ok(group: &Group, assignment: Bytes) -> SyncResponse {
    SyncResponse {
        error: None,
        protocol_type: group.protocol_type.clone(),
        protocol_name: group.protocol.clone(),
        assignment,
    }
}

/// The JoinGroup answer for `member_id` in the current generation.
fn join_answer(group: &Group, member_id: &str) -> JoinResponse {
    let leader = group.leader.clone().unwrap_or_default();
    let protocol = group.protocol.clone().unwrap_or_default();
    let members = if leader == member_id {
        group
            .members
            .iter()
            .map(|m| JoinedMember {
                member_id: m.id.clone(),
                group_instance_id: m.instance_id.clone(),
                metadata: m.metadata_for(&protocol),
            })
            .collect()
    } else {
        Vec::new()
    };
    JoinResponse {
        error: None,
        generation_id: group.generation,
        protocol_type: group.protocol_type.clone(),
        protocol_name: group.protocol.clone(),
        leader,
        member_id: member_id.to_string(),
        members,
    }
}

fn remove_member(group: &mut Group, id: &str, replies: &mut Vec<Reply>) {
    let Some(i) = group.members.iter().position(|m| m.id == id) else {
        return;
    };
    let m = group.members.remove(i);
    if let Some(t) = m.join_waiting {
        replies.push(Reply::Join(
            t,
            join_error(ResponseError::UnknownMemberId, &m.id),
        ));
    }
    if let Some(t) = m.sync_waiting {
        replies.push(Reply::Sync(t, sync_error(ResponseError::UnknownMemberId)));
    }
    if group.leader.as_deref() == Some(id) {
        group.leader = None;
    }
}

fn become_empty(group: &mut Group) {
    group.state = GroupState::Empty;
    group.generation += 1;
    group.protocol = None;
    group.leader = None;
}

fn prepare_rebalance(group: &mut Group, now: i64, initial_delay: i64, replies: &mut Vec<Reply>) {
    let timeout = group
        .members
        .iter()
        .map(|m| m.rebalance_timeout_ms)
        .max()
        .unwrap_or(0);
    match group.state {
        GroupState::Empty => {
            group.rebalance_started_ms = now;
            group.initial_delay_until_ms = now + initial_delay.min(timeout);
        }
        GroupState::PreparingRebalance => {
            // Still gathering the first members: each newcomer extends the wait, within the
            // rebalance timeout.
            if group.initial_delay_until_ms > now {
                group.initial_delay_until_ms =
                    (now + initial_delay).min(group.rebalance_started_ms + timeout);
            }
        }
        GroupState::CompletingRebalance | GroupState::Stable => {
            group.rebalance_started_ms = now;
            group.initial_delay_until_ms = now;
            for m in &mut group.members {
                if let Some(t) = m.sync_waiting.take() {
                    replies.push(Reply::Sync(
                        t,
                        sync_error(ResponseError::RebalanceInProgress),
                    ));
                }
            }
        }
    }
    if group.state != GroupState::PreparingRebalance {
        group.rebalance_deadline_ms = now + timeout;
    }
    group.state = GroupState::PreparingRebalance;
}

fn maybe_complete_join(group: &mut Group, now: i64, replies: &mut Vec<Reply>) {
    if group.state == GroupState::PreparingRebalance
        && now >= group.initial_delay_until_ms
        && group.members.iter().all(|m| m.join_waiting.is_some())
        && group.pending.is_empty()
    {
        complete_join(group, now, replies);
    }
}

fn complete_join(group: &mut Group, now: i64, replies: &mut Vec<Reply>) {
    if group.members.is_empty() {
        become_empty(group);
        return;
    }
    group.generation += 1;
    group.protocol = group.select_protocol();
    if group
        .leader
        .as_ref()
        .is_none_or(|l| group.member(l).is_none())
    {
        group.leader = group.members.first().map(|m| m.id.clone());
    }
    group.state = GroupState::CompletingRebalance;
    group.pending.clear();
    let waiting: Vec<(Token, String)> = group
        .members
        .iter_mut()
        .filter_map(|m| {
            m.last_heartbeat_ms = now;
            m.join_waiting.take().map(|t| (t, m.id.clone()))
        })
        .collect();
    for (t, id) in waiting {
        replies.push(Reply::Join(t, join_answer(group, &id)));
    }
}

#[cfg(test)]
mod tests;
