//! The share group assignor ("simple", in the spirit of Kafka's `SimpleAssignor`).
//!
//! In a share group a partition may be assigned to several members at once: records, not
//! partitions, are what members hold exclusively. The assignment balances both ways:
//!
//! - with no more members than partitions, every partition goes to exactly one member and
//!   each member gets `⌊P/M⌋` or `⌈P/M⌉` partitions;
//! - with more members than partitions, every member gets exactly one partition and each
//!   partition is shared by `⌊M/P⌋` or `⌈M/P⌉` members.
//!
//! Balance comes first, then stickiness: a member keeps what it had as long as that fits the
//! quotas. When all members subscribe to the same topics, all their partitions are balanced
//! together; otherwise each topic is balanced among its own subscribers. Everything is
//! ordered (member ids, topic names, partition indexes), so the result is deterministic.

use std::collections::{BTreeMap, BTreeSet};

use uuid::Uuid;

/// Existing topics by name: topic id and partition count.
pub type TopicsView = BTreeMap<String, (Uuid, i32)>;

/// Partitions by topic id.
pub type Assignment = BTreeMap<Uuid, BTreeSet<i32>>;

/// What the assignor knows of a member.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberSpec {
    /// Subscribed topic names (topics that do not exist are ignored).
    pub subscribed: BTreeSet<String>,
    /// The member's current assignment, kept where the quotas allow.
    pub current: Assignment,
}

type Part = (String, Uuid, i32);

/// Computes the target assignment of every member (members with nothing to get are present
/// with an empty assignment).
pub fn assign(
    members: &BTreeMap<String, MemberSpec>,
    topics: &TopicsView,
) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members
        .keys()
        .map(|m| (m.clone(), Assignment::new()))
        .collect();
    let subscribers: Vec<&String> = members
        .iter()
        .filter(|(_, s)| s.subscribed.iter().any(|t| topics.contains_key(t)))
        .map(|(m, _)| m)
        .collect();
    let Some(first) = subscribers.first() else {
        return out;
    };
    let existing = |m: &String| -> BTreeSet<&String> {
        members[m]
            .subscribed
            .iter()
            .filter(|t| topics.contains_key(*t))
            .collect()
    };
    let first_topics = existing(first);
    let homogeneous = subscribers.iter().all(|m| existing(m) == first_topics);
    let partitions_of = |names: &BTreeSet<&String>| -> Vec<Part> {
        names
            .iter()
            .flat_map(|t| {
                let (id, n) = topics[*t];
                (0..n.max(0)).map(move |p| ((*t).clone(), id, p))
            })
            .collect()
    };
    let mut pairs: Vec<(String, Uuid, i32)> = Vec::new();
    if homogeneous {
        pairs.extend(balance(
            &subscribers,
            &partitions_of(&first_topics),
            members,
        ));
    } else {
        let all: BTreeSet<&String> = subscribers.iter().flat_map(|m| existing(m)).collect();
        for topic in all {
            let subs: Vec<&String> = subscribers
                .iter()
                .copied()
                .filter(|m| members[*m].subscribed.contains(topic))
                .collect();
            let one: BTreeSet<&String> = [topic].into_iter().collect();
            pairs.extend(balance(&subs, &partitions_of(&one), members));
        }
    }
    for (m, id, p) in pairs {
        if let Some(a) = out.get_mut(&m) {
            a.entry(id).or_default().insert(p);
        }
    }
    out
}

/// Whether `member` currently has `part`.
fn has(members: &BTreeMap<String, MemberSpec>, member: &str, part: &Part) -> bool {
    members
        .get(member)
        .and_then(|s| s.current.get(&part.1))
        .is_some_and(|ps| ps.contains(&part.2))
}

/// Quotas: `base` each, and `extra` of them may have one more.
struct Quota {
    base: usize,
    extra_left: usize,
}

impl Quota {
    fn can_take(&self, count: usize) -> bool {
        count < self.base || (count == self.base && self.extra_left > 0)
    }

    fn took(&mut self, count_after: usize) {
        if count_after > self.base {
            self.extra_left -= 1;
        }
    }
}

/// Balances `parts` among `ms` (see the module docs); returns (member, topic id, partition).
// Indexes into parallel vectors (takers, givers, counts, owners) read better as ranges.
#[allow(clippy::needless_range_loop)]
fn balance(
    ms: &[&String],
    parts: &[Part],
    members: &BTreeMap<String, MemberSpec>,
) -> Vec<(String, Uuid, i32)> {
    if ms.is_empty() || parts.is_empty() {
        return Vec::new();
    }
    // "Givers" are the side with one each: partitions when members are fewer, else members.
    // "Takers" get `base` or `base + 1` givers each.
    let members_fewer = ms.len() <= parts.len();
    let (takers, givers) = if members_fewer {
        (ms.len(), parts.len())
    } else {
        (parts.len(), ms.len())
    };
    let mut quota = Quota {
        base: givers / takers,
        extra_left: givers % takers,
    };
    let holds = |t: usize, g: usize| -> bool {
        if members_fewer {
            has(members, ms[t], &parts[g])
        } else {
            has(members, ms[g], &parts[t])
        }
    };
    let mut count = vec![0usize; takers];
    let mut owner: Vec<Option<usize>> = vec![None; givers];
    // Stickiness, up to the base quota, then one extra each while extras remain.
    for pass in 0..2 {
        for t in 0..takers {
            for g in 0..givers {
                if owner[g].is_some() || !holds(t, g) {
                    continue;
                }
                let fits = if pass == 0 {
                    count[t] < quota.base
                } else {
                    count[t] == quota.base && quota.extra_left > 0
                };
                if fits {
                    owner[g] = Some(t);
                    count[t] += 1;
                    quota.took(count[t]);
                    if pass == 1 {
                        break;
                    }
                }
            }
        }
    }
    // The rest go to the least loaded taker that can take one (the first on ties).
    for slot in owner.iter_mut() {
        if slot.is_some() {
            continue;
        }
        let t = (0..takers)
            .filter(|&t| quota.can_take(count[t]))
            .min_by_key(|&t| count[t]);
        if let Some(t) = t {
            *slot = Some(t);
            count[t] += 1;
            quota.took(count[t]);
        }
    }
    owner
        .iter()
        .enumerate()
        .filter_map(|(g, t)| t.map(|t| (g, t)))
        .map(|(g, t)| {
            let (m, p) = if members_fewer { (t, g) } else { (g, t) };
            (ms[m].clone(), parts[p].1, parts[p].2)
        })
        .collect()
}
