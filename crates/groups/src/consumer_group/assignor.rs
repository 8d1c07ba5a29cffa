//! Server-side assignors: the target assignment, which member should own which partition.
//!
//! Both are deterministic (members and partitions are visited in a fixed order), so every
//! coordinator computes the same target from the same group. `uniform` starts from the
//! previous target and moves as few partitions as it takes to balance the members (Kafka's
//! default assignor is sticky the same way); `range` gives each member of a topic a contiguous
//! range of its partitions, as the classic range assignor does.

use std::collections::{BTreeMap, BTreeSet};

use uuid::Uuid;

/// Partitions by topic id.
pub type TopicPartitions = BTreeMap<Uuid, BTreeSet<i32>>;

/// The assignors this coordinator offers, by the names clients ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Assignor {
    /// Balanced and sticky (Kafka's default).
    Uniform,
    /// Contiguous ranges per topic.
    Range,
}

impl Assignor {
    /// Every assignor, the default first (Kafka's `group.consumer.assignors`).
    pub const ALL: [Assignor; 2] = [Assignor::Uniform, Assignor::Range];

    /// The name clients use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Uniform => "uniform",
            Self::Range => "range",
        }
    }

    /// The assignor called `name`, if this coordinator has it.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// One member as an assignor sees it.
#[derive(Debug, Clone)]
pub struct MemberSpec {
    /// Member id (the order members are visited in).
    pub id: String,
    /// Topics the member subscribes to that exist.
    pub topics: BTreeSet<Uuid>,
    /// Its previous target, the starting point for stickiness.
    pub previous: TopicPartitions,
}

/// Computes the target assignment of `members` over `topics` (id -> partition count).
pub fn assign(
    assignor: Assignor,
    members: &[MemberSpec],
    topics: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, TopicPartitions> {
    let mut members: Vec<&MemberSpec> = members.iter().collect();
    members.sort_by(|a, b| a.id.cmp(&b.id));
    match assignor {
        Assignor::Uniform => uniform(&members, topics),
        Assignor::Range => range(&members, topics),
    }
}

fn range(
    members: &[&MemberSpec],
    topics: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, TopicPartitions> {
    let mut out: BTreeMap<String, TopicPartitions> = members
        .iter()
        .map(|m| (m.id.clone(), TopicPartitions::new()))
        .collect();
    for (&topic, &count) in topics {
        let subscribers: Vec<&str> = members
            .iter()
            .filter(|m| m.topics.contains(&topic))
            .map(|m| m.id.as_str())
            .collect();
        if subscribers.is_empty() || count <= 0 {
            continue;
        }
        let n = subscribers.len() as i32;
        let (each, extra) = (count / n, count % n);
        let mut next = 0;
        for (i, id) in subscribers.iter().enumerate() {
            let take = each + i32::from((i as i32) < extra);
            if take > 0 {
                if let Some(m) = out.get_mut(*id) {
                    m.entry(topic).or_default().extend(next..next + take);
                }
            }
            next += take;
        }
    }
    out
}

fn uniform(
    members: &[&MemberSpec],
    topics: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, TopicPartitions> {
    let n = members.len();
    let mut owned: Vec<Vec<(Uuid, i32)>> = vec![Vec::new(); n];
    let mut taken: BTreeSet<(Uuid, i32)> = BTreeSet::new();
    let valid = |m: &MemberSpec, t: &Uuid, p: i32| {
        m.topics.contains(t) && topics.get(t).is_some_and(|&c| p >= 0 && p < c)
    };
    // 1. Stickiness: every member keeps what it had that is still valid and unclaimed.
    for (i, m) in members.iter().enumerate() {
        for (t, ps) in &m.previous {
            for &p in ps {
                if valid(m, t, p) && taken.insert((*t, p)) {
                    owned[i].push((*t, p));
                }
            }
        }
    }
    // 2. Every partition nobody kept goes to the least loaded member subscribed to it
    // (an ordered set of (load, member) finds it in log time).
    for (&t, &count) in topics {
        let mut eligible: BTreeSet<(usize, usize)> = (0..n)
            .filter(|&i| members[i].topics.contains(&t))
            .map(|i| (owned[i].len(), i))
            .collect();
        for p in 0..count.max(0) {
            if taken.contains(&(t, p)) {
                continue;
            }
            let Some((load, i)) = eligible.pop_first() else {
                break;
            };
            owned[i].push((t, p));
            taken.insert((t, p));
            eligible.insert((load + 1, i));
        }
    }
    // 3. Balance: move a partition from a member to one holding at least two fewer that
    // subscribes to its topic, until no such move exists. Each move lowers the sum of squared
    // loads, so this ends; the cap is a guard.
    let cap = taken.len().saturating_mul(n.max(1)) + 1;
    for _ in 0..cap {
        if !balance_once(members, &mut owned) {
            break;
        }
    }
    members
        .iter()
        .zip(owned)
        .map(|(m, parts)| {
            let mut tp = TopicPartitions::new();
            for (t, p) in parts {
                tp.entry(t).or_default().insert(p);
            }
            (m.id.clone(), tp)
        })
        .collect()
}

/// Makes one balancing move, if any is possible; returns whether it did.
fn balance_once(members: &[&MemberSpec], owned: &mut [Vec<(Uuid, i32)>]) -> bool {
    let mut by_load: Vec<usize> = (0..members.len()).collect();
    by_load.sort_by_key(|&i| (owned[i].len(), i));
    for &donor in by_load.iter().rev() {
        for &receiver in &by_load {
            if owned[receiver].len() + 1 >= owned[donor].len() {
                break;
            }
            // The most recently gained partition moves first: it is the least settled.
            if let Some(at) = owned[donor]
                .iter()
                .rposition(|(t, _)| members[receiver].topics.contains(t))
            {
                let tp = owned[donor].remove(at);
                owned[receiver].push(tp);
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(n: u8) -> Uuid {
        Uuid::from_bytes([n; 16])
    }

    fn spec(id: &str, topics: &[Uuid], previous: TopicPartitions) -> MemberSpec {
        MemberSpec {
            id: id.into(),
            topics: topics.iter().copied().collect(),
            previous,
        }
    }

    fn count(a: &TopicPartitions) -> usize {
        a.values().map(BTreeSet::len).sum()
    }

    fn every_partition_once(out: &BTreeMap<String, TopicPartitions>, topics: &BTreeMap<Uuid, i32>) {
        let mut seen = BTreeSet::new();
        for a in out.values() {
            for (t, ps) in a {
                for p in ps {
                    assert!(seen.insert((*t, *p)), "{t}/{p} assigned twice");
                }
            }
        }
        let all: usize = topics.values().map(|&c| c as usize).sum();
        assert_eq!(seen.len(), all, "every partition is assigned");
    }

    #[test]
    fn uniform_balances_partitions_within_one_and_assigns_each_once() {
        let topics = BTreeMap::from([(topic(1), 7), (topic(2), 3)]);
        let members: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|id| spec(id, &[topic(1), topic(2)], TopicPartitions::new()))
            .collect();
        let out = assign(Assignor::Uniform, &members, &topics);
        every_partition_once(&out, &topics);
        let loads: Vec<usize> = out.values().map(count).collect();
        assert!(
            loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 1,
            "{loads:?}"
        );
    }

    #[test]
    fn uniform_moves_only_what_a_new_member_needs() {
        let topics = BTreeMap::from([(topic(1), 6)]);
        let two: Vec<_> = ["a", "b"]
            .iter()
            .map(|id| spec(id, &[topic(1)], TopicPartitions::new()))
            .collect();
        let before = assign(Assignor::Uniform, &two, &topics);
        let mut three: Vec<_> = two
            .iter()
            .map(|m| spec(&m.id, &[topic(1)], before[&m.id].clone()))
            .collect();
        three.push(spec("c", &[topic(1)], TopicPartitions::new()));
        let after = assign(Assignor::Uniform, &three, &topics);
        every_partition_once(&after, &topics);
        for id in ["a", "b"] {
            let kept = after[id][&topic(1)]
                .intersection(&before[id][&topic(1)])
                .count();
            assert_eq!(kept, 2, "{id} keeps two of its three partitions");
        }
        assert_eq!(count(&after["c"]), 2);
    }

    #[test]
    fn uniform_gives_a_topic_only_to_its_subscribers() {
        let topics = BTreeMap::from([(topic(1), 4), (topic(2), 4)]);
        let members = vec![
            spec("a", &[topic(1)], TopicPartitions::new()),
            spec("b", &[topic(1), topic(2)], TopicPartitions::new()),
        ];
        let out = assign(Assignor::Uniform, &members, &topics);
        every_partition_once(&out, &topics);
        assert!(!out["a"].contains_key(&topic(2)));
        assert_eq!(
            count(&out["a"]),
            4,
            "a takes all of topic 1, b all of topic 2"
        );
    }

    #[test]
    fn uniform_is_deterministic_whatever_the_member_order() {
        let topics = BTreeMap::from([(topic(1), 5), (topic(2), 2)]);
        let mut members: Vec<_> = ["x", "y", "z"]
            .iter()
            .map(|id| spec(id, &[topic(1), topic(2)], TopicPartitions::new()))
            .collect();
        let first = assign(Assignor::Uniform, &members, &topics);
        members.reverse();
        assert_eq!(assign(Assignor::Uniform, &members, &topics), first);
    }

    #[test]
    fn uniform_drops_partitions_of_topics_no_longer_subscribed() {
        let topics = BTreeMap::from([(topic(1), 2), (topic(2), 2)]);
        let previous = TopicPartitions::from([(topic(2), BTreeSet::from([0, 1]))]);
        let out = assign(
            Assignor::Uniform,
            &[spec("a", &[topic(1)], previous)],
            &topics,
        );
        assert_eq!(
            out["a"],
            TopicPartitions::from([(topic(1), BTreeSet::from([0, 1]))])
        );
    }

    #[test]
    fn range_gives_contiguous_ranges_extra_partitions_to_the_first_members() {
        let topics = BTreeMap::from([(topic(1), 5)]);
        let members: Vec<_> = ["b", "a"]
            .iter()
            .map(|id| spec(id, &[topic(1)], TopicPartitions::new()))
            .collect();
        let out = assign(Assignor::Range, &members, &topics);
        assert_eq!(out["a"][&topic(1)], BTreeSet::from([0, 1, 2]));
        assert_eq!(out["b"][&topic(1)], BTreeSet::from([3, 4]));
    }

    #[test]
    fn range_leaves_members_without_partitions_when_there_are_too_few() {
        let topics = BTreeMap::from([(topic(1), 1)]);
        let members: Vec<_> = ["a", "b"]
            .iter()
            .map(|id| spec(id, &[topic(1)], TopicPartitions::new()))
            .collect();
        let out = assign(Assignor::Range, &members, &topics);
        every_partition_once(&out, &topics);
        assert!(out["b"].is_empty());
    }

    #[test]
    fn assignor_names_are_kafkas() {
        assert_eq!(Assignor::parse("uniform"), Some(Assignor::Uniform));
        assert_eq!(Assignor::parse("range"), Some(Assignor::Range));
        assert_eq!(Assignor::parse("sticky"), None);
    }
}
