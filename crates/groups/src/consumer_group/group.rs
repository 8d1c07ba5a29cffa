//! One consumer group: its epochs, members, the target assignment and the topics it was
//! computed for.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use uuid::Uuid;

use super::assignor::{self, Assignor, MemberSpec, TopicPartitions};
use super::member::{Member, Subscription};
use super::reconcile::{self, MemberState};
use super::TopicsView;

/// Where a consumer group is (Kafka's ConsumerGroupState names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerGroupState {
    /// No members.
    Empty,
    /// The group epoch moved past the target assignment's.
    Assigning,
    /// Some member has not reached its target yet.
    Reconciling,
    /// Every member owns its target.
    Stable,
}

impl ConsumerGroupState {
    /// The name Kafka's tools print.
    pub fn name(self) -> &'static str {
        match self {
            Self::Empty => "Empty",
            Self::Assigning => "Assigning",
            Self::Reconciling => "Reconciling",
            Self::Stable => "Stable",
        }
    }
}

/// A consumer group.
#[derive(Debug, Clone)]
pub struct Group {
    /// Group id.
    pub id: String,
    /// Bumped whenever membership, subscriptions or subscribed topics change.
    pub epoch: i32,
    /// The group epoch the target assignment was computed at.
    pub assignment_epoch: i32,
    /// Members by id.
    pub members: BTreeMap<String, Member>,
    /// Target assignment by member id.
    pub target: BTreeMap<String, TopicPartitions>,
    /// The subscribed topics (name -> id, partitions) the epoch reflects.
    pub subscribed: TopicsView,
    /// The members' subscriptions merged (every name once, each distinct regex once), so a
    /// heartbeat resolves them without visiting every member; `None` after a change.
    union: Option<(BTreeSet<String>, Vec<Subscription>)>,
}

impl Group {
    /// A group without members.
    pub fn new(id: &str) -> Self {
        Self {
            id: id.to_string(),
            epoch: 0,
            assignment_epoch: 0,
            members: BTreeMap::new(),
            target: BTreeMap::new(),
            subscribed: TopicsView::new(),
            union: None,
        }
    }

    /// The group's state.
    pub fn state(&self) -> ConsumerGroupState {
        if self.members.is_empty() {
            ConsumerGroupState::Empty
        } else if self.epoch > self.assignment_epoch {
            ConsumerGroupState::Assigning
        } else if self.members.values().any(|m| {
            m.current.state != MemberState::Stable || m.current.epoch != self.assignment_epoch
        }) {
            ConsumerGroupState::Reconciling
        } else {
            ConsumerGroupState::Stable
        }
    }

    /// The member holding static id `instance`.
    pub fn by_instance(&self, instance: &str) -> Option<&Member> {
        self.members
            .values()
            .find(|m| m.instance_id.as_deref() == Some(instance))
    }

    /// Partitions held (assigned or being revoked) by members other than `except`.
    pub fn held_by_others(&self, except: &str) -> HashSet<(Uuid, i32)> {
        self.members
            .values()
            .filter(|m| m.id != except)
            .flat_map(|m| m.current.assigned.iter().chain(m.current.revoking.iter()))
            .flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))
            .collect()
    }

    /// Forgets the merged subscriptions: a member joined, left or changed its subscription.
    pub fn subscriptions_changed(&mut self) {
        self.union = None;
    }

    /// The subscribed topics as they exist in `topics` now.
    pub fn resolve(&mut self, topics: &TopicsView) -> TopicsView {
        let members = &self.members;
        let (names, regexes) = self.union.get_or_insert_with(|| {
            let mut names = BTreeSet::new();
            let mut regexes: Vec<Subscription> = Vec::new();
            for m in members.values() {
                names.extend(m.subscription.names.iter().cloned());
                if m.subscription.regex.is_some()
                    && !regexes.iter().any(|r| r.regex == m.subscription.regex)
                {
                    regexes.push(m.subscription.clone());
                }
            }
            (names, regexes)
        });
        let mut out = TopicsView::new();
        for n in names.iter() {
            if let Some((name, meta)) = topics.get_key_value(n) {
                out.insert(name.clone(), *meta);
            }
        }
        for r in regexes.iter() {
            for (name, meta) in r.resolve(topics) {
                out.insert(name.clone(), *meta);
            }
        }
        out
    }

    /// The assignor most members ask for; the default when none does (ties go to the
    /// earlier in [`Assignor::ALL`]).
    pub fn assignor(&self) -> Assignor {
        let mut votes: BTreeMap<Assignor, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(a) = m.server_assignor.as_deref().and_then(Assignor::parse) {
                *votes.entry(a).or_default() += 1;
            }
        }
        votes
            .into_iter()
            .max_by_key(|(a, n)| (*n, std::cmp::Reverse(*a)))
            .map_or(Assignor::Uniform, |(a, _)| a)
    }

    /// Recomputes the target assignment when the group epoch moved past it.
    pub fn update_target(&mut self) {
        if self.epoch <= self.assignment_epoch {
            return;
        }
        let ids: BTreeMap<Uuid, i32> = self.subscribed.values().copied().collect();
        let specs: Vec<MemberSpec> = self
            .members
            .values()
            .map(|m| MemberSpec {
                id: m.id.clone(),
                topics: m
                    .subscription
                    .resolve(&self.subscribed)
                    .map(|(_, (id, _))| *id)
                    .collect(),
                previous: self.target.get(&m.id).cloned().unwrap_or_default(),
            })
            .collect();
        self.target = assignor::assign(self.assignor(), &specs, &ids);
        self.assignment_epoch = self.epoch;
    }

    /// Moves member `id` towards its target; `owned` is what it reports owning.
    pub fn reconcile(&mut self, id: &str, owned: Option<&TopicPartitions>, now_ms: i64) {
        let reconciled = self.members.get(id).is_none_or(|m| {
            m.current.state == MemberState::Stable && m.current.epoch == self.assignment_epoch
        });
        if reconciled {
            // The common heartbeat: nothing to move, so no need to collect who holds what.
            return;
        }
        let held = self.held_by_others(id);
        let empty = TopicPartitions::new();
        let target = self.target.get(id).unwrap_or(&empty);
        let epoch = self.assignment_epoch;
        let Some(m) = self.members.get(id) else {
            return;
        };
        let next = reconcile::reconcile(&m.current, epoch, target, owned, |t, p| {
            held.contains(&(t, p))
        });
        let Some(m) = self.members.get_mut(id) else {
            return;
        };
        match (m.current.state, next.state) {
            (MemberState::UnrevokedPartitions, MemberState::UnrevokedPartitions) => {}
            (_, MemberState::UnrevokedPartitions) => {
                m.revocation_deadline_ms = Some(now_ms + i64::from(m.rebalance_timeout_ms.max(0)));
            }
            _ => m.revocation_deadline_ms = None,
        }
        m.current = next;
    }

    /// Removes member `id`; the group epoch moves on so the others rebalance.
    pub fn remove(&mut self, id: &str) -> Option<Member> {
        let m = self.members.remove(id)?;
        self.target.remove(id);
        self.union = None;
        self.epoch += 1;
        if self.members.is_empty() {
            // Nothing to assign: the target is trivially up to date.
            self.assignment_epoch = self.epoch;
            self.subscribed.clear();
        }
        Some(m)
    }

    /// Topic names the members subscribe to now.
    pub fn subscribed_names(&self) -> BTreeSet<String> {
        self.subscribed.keys().cloned().collect()
    }
}
