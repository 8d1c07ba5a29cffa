use std::collections::{BTreeMap, BTreeSet};

use uuid::Uuid;

use crate::assignor::*;
use crate::test_rng::Rng;

fn topic_id(name: &str) -> Uuid {
    Uuid::from_u128(name.bytes().fold(7u128, |h, b| h * 31 + b as u128))
}

fn topics(list: &[(&str, i32)]) -> TopicsView {
    list.iter()
        .map(|(n, p)| (n.to_string(), (topic_id(n), *p)))
        .collect()
}

fn members(list: &[(&str, &[&str])]) -> BTreeMap<String, MemberSpec> {
    list.iter()
        .map(|(m, subs)| {
            (
                m.to_string(),
                MemberSpec {
                    subscribed: subs.iter().map(|s| s.to_string()).collect(),
                    current: Assignment::new(),
                },
            )
        })
        .collect()
}

fn count(a: &Assignment) -> usize {
    a.values().map(BTreeSet::len).sum()
}

/// Members per partition.
fn sharing(result: &BTreeMap<String, Assignment>) -> BTreeMap<(Uuid, i32), usize> {
    let mut out = BTreeMap::new();
    for a in result.values() {
        for (id, ps) in a {
            for p in ps {
                *out.entry((*id, *p)).or_default() += 1;
            }
        }
    }
    out
}

#[test]
fn with_fewer_members_than_partitions_each_partition_has_one_member_and_counts_differ_by_at_most_one(
) {
    let t = topics(&[("orders", 7)]);
    let m = members(&[("a", &["orders"]), ("b", &["orders"]), ("c", &["orders"])]);
    let r = assign(&m, &t);
    let counts: Vec<usize> = r.values().map(count).collect();
    assert_eq!(counts.iter().sum::<usize>(), 7);
    assert!(counts.iter().all(|&c| c == 2 || c == 3), "{counts:?}");
    let s = sharing(&r);
    assert_eq!(s.len(), 7);
    assert!(s.values().all(|&n| n == 1));
}

#[test]
fn with_more_members_than_partitions_partitions_are_shared_evenly() {
    let t = topics(&[("orders", 2)]);
    let m = members(&[
        ("a", &["orders"]),
        ("b", &["orders"]),
        ("c", &["orders"]),
        ("d", &["orders"]),
        ("e", &["orders"]),
    ]);
    let r = assign(&m, &t);
    assert!(r.values().all(|a| count(a) == 1), "{r:?}");
    let mut per: Vec<usize> = sharing(&r).into_values().collect();
    per.sort();
    assert_eq!(per, vec![2, 3]);
}

#[test]
fn a_single_member_gets_every_partition_of_every_subscribed_topic() {
    let t = topics(&[("a", 3), ("b", 2), ("other", 4)]);
    let r = assign(&members(&[("m", &["a", "b", "missing"])]), &t);
    let a = &r["m"];
    assert_eq!(a[&topic_id("a")], BTreeSet::from([0, 1, 2]));
    assert_eq!(a[&topic_id("b")], BTreeSet::from([0, 1]));
    assert!(!a.contains_key(&topic_id("other")));
}

#[test]
fn members_without_existing_subscribed_topics_get_an_empty_assignment() {
    let t = topics(&[("a", 3)]);
    let r = assign(&members(&[("m", &["a"]), ("n", &["nope"]), ("o", &[])]), &t);
    assert_eq!(count(&r["m"]), 3);
    assert!(r["n"].is_empty());
    assert!(r["o"].is_empty());
}

#[test]
fn heterogeneous_subscriptions_balance_each_topic_among_its_subscribers() {
    let t = topics(&[("x", 4), ("y", 1)]);
    let m = members(&[("a", &["x"]), ("b", &["x", "y"]), ("c", &["y"])]);
    let r = assign(&m, &t);
    assert_eq!(r["a"].get(&topic_id("x")).map(BTreeSet::len), Some(2));
    assert_eq!(r["b"].get(&topic_id("x")).map(BTreeSet::len), Some(2));
    // y has one partition and two subscribers: shared.
    assert_eq!(r["b"][&topic_id("y")], BTreeSet::from([0]));
    assert_eq!(r["c"][&topic_id("y")], BTreeSet::from([0]));
    assert!(!r["a"].contains_key(&topic_id("y")));
    assert!(!r["c"].contains_key(&topic_id("x")));
}

#[test]
fn a_member_keeps_its_partitions_when_another_joins_if_the_quotas_allow() {
    let t = topics(&[("t", 6)]);
    let two = members(&[("a", &["t"]), ("b", &["t"])]);
    let first = assign(&two, &t);
    let mut three = members(&[("a", &["t"]), ("b", &["t"]), ("c", &["t"])]);
    for (id, a) in &first {
        three.get_mut(id).unwrap().current = a.clone();
    }
    let second = assign(&three, &t);
    for id in ["a", "b"] {
        let kept = second[id][&topic_id("t")]
            .intersection(&first[id][&topic_id("t")])
            .count();
        assert_eq!(kept, 2, "{id} keeps 2 of its 3");
    }
    assert_eq!(count(&second["c"]), 2);
}

#[test]
fn the_assignment_is_deterministic() {
    let t = topics(&[("t", 5), ("u", 3)]);
    let m = members(&[("a", &["t", "u"]), ("b", &["t", "u"]), ("c", &["t", "u"])]);
    assert_eq!(assign(&m, &t), assign(&m, &t));
}

#[test]
fn random_groups_are_balanced_and_cover_every_partition() {
    let mut rng = Rng::new(99);
    for _ in 0..300 {
        let np = 1 + rng.below(12) as i32;
        let nm = 1 + rng.below(12) as usize;
        let t = topics(&[("t", np)]);
        let mut m: BTreeMap<String, MemberSpec> = (0..nm)
            .map(|i| {
                (
                    format!("m{i}"),
                    MemberSpec {
                        subscribed: BTreeSet::from(["t".to_string()]),
                        current: Assignment::new(),
                    },
                )
            })
            .collect();
        // A random (possibly stale, over-full) current assignment.
        for spec in m.values_mut() {
            for p in 0..np + 2 {
                if rng.below(3) == 0 {
                    spec.current.entry(topic_id("t")).or_default().insert(p);
                }
            }
        }
        let r = assign(&m, &t);
        let s = sharing(&r);
        assert_eq!(s.len(), np as usize, "every partition assigned");
        let (np, nm) = (np as usize, nm);
        if nm <= np {
            assert!(s.values().all(|&n| n == 1));
            for a in r.values() {
                let c = count(a);
                assert!(c == np / nm || c == np.div_ceil(nm), "{c} of {np}/{nm}");
            }
        } else {
            assert!(r.values().all(|a| count(a) == 1));
            for &n in s.values() {
                assert!(n == nm / np || n == nm.div_ceil(np), "{n} of {nm}/{np}");
            }
        }
        for a in r.values() {
            assert!(a[&topic_id("t")].iter().all(|&p| (p as usize) < np));
        }
    }
}

#[test]
fn random_heterogeneous_groups_get_only_subscribed_partitions_and_cover_them_all() {
    let mut rng = Rng::new(5);
    let names = ["t0", "t1", "t2", "t3"];
    for _ in 0..300 {
        let mut t = TopicsView::new();
        for n in names {
            if rng.below(5) != 0 {
                t.insert(n.to_string(), (topic_id(n), rng.below(6) as i32));
            }
        }
        let m: BTreeMap<String, MemberSpec> = (0..1 + rng.below(8))
            .map(|i| {
                let subscribed = names
                    .iter()
                    .filter(|_| rng.below(2) == 0)
                    .map(|n| n.to_string())
                    .collect();
                (
                    format!("m{i}"),
                    MemberSpec {
                        subscribed,
                        current: Assignment::new(),
                    },
                )
            })
            .collect();
        let r = assign(&m, &t);
        assert_eq!(r.len(), m.len());
        let s = sharing(&r);
        for (member, a) in &r {
            for (id, ps) in a {
                let (name, (_, n)) = t
                    .iter()
                    .find(|(_, (tid, _))| tid == id)
                    .expect("existing topic");
                assert!(
                    m[member].subscribed.contains(name),
                    "{member} got unsubscribed {name}"
                );
                assert!(ps.iter().all(|p| *p < *n));
            }
        }
        for (name, (id, n)) in &t {
            if m.values().any(|spec| spec.subscribed.contains(name)) {
                for p in 0..*n {
                    assert!(s.contains_key(&(*id, p)), "{name}-{p} unassigned");
                }
            }
        }
    }
}
