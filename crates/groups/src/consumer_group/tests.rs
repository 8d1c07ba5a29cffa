use std::collections::{BTreeSet, HashMap};

use super::*;

const T1: Uuid = Uuid::from_bytes([1; 16]);
const T2: Uuid = Uuid::from_bytes([2; 16]);

fn topics(list: &[(&str, Uuid, i32)]) -> TopicsView {
    list.iter()
        .map(|(n, id, p)| (n.to_string(), (*id, *p)))
        .collect()
}

fn orders(partitions: i32) -> TopicsView {
    topics(&[("orders", T1, partitions)])
}

fn join_req(member: &str, names: &[&str]) -> HeartbeatRequest {
    HeartbeatRequest {
        version: 1,
        group_id: "g".into(),
        member_id: member.into(),
        member_epoch: 0,
        rebalance_timeout_ms: 60_000,
        subscribed_topic_names: Some(names.iter().map(|s| s.to_string()).collect()),
        owned: Some(TopicPartitions::new()),
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        ..HeartbeatRequest::default()
    }
}

fn beat(member: &str, epoch: i32, owned: Option<TopicPartitions>) -> HeartbeatRequest {
    HeartbeatRequest {
        version: 1,
        group_id: "g".into(),
        member_id: member.into(),
        member_epoch: epoch,
        rebalance_timeout_ms: -1,
        owned,
        ..HeartbeatRequest::default()
    }
}

fn ok(cg: &mut ConsumerGroups, now: i64, t: &TopicsView, r: HeartbeatRequest) -> HeartbeatResponse {
    let (res, _) = cg.heartbeat(now, t, r);
    res.expect("heartbeat accepted")
}

fn err(cg: &mut ConsumerGroups, t: &TopicsView, r: HeartbeatRequest) -> ResponseError {
    cg.heartbeat(0, t, r)
        .0
        .expect_err("heartbeat refused")
        .error
}

fn parts(a: &TopicPartitions) -> BTreeSet<(Uuid, i32)> {
    a.iter()
        .flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))
        .collect()
}

fn count(a: &TopicPartitions) -> usize {
    parts(a).len()
}

fn groups() -> ConsumerGroups {
    ConsumerGroups::new(ConsumerGroupConfig::default(), 1)
}

/// A simulated client: what it believes it owns and its epoch.
#[derive(Default, Clone)]
struct Client {
    epoch: i32,
    owned: TopicPartitions,
}

/// Heartbeats `id` the way the Java consumer does: it adopts the assignment it is given
/// (revoking what was taken away first) and reports what it owns.
fn client_beat(cg: &mut ConsumerGroups, now: i64, t: &TopicsView, id: &str, c: &mut Client) {
    let r = cg
        .heartbeat(now, t, beat(id, c.epoch, Some(c.owned.clone())))
        .0
        .expect("member heartbeat");
    c.epoch = r.member_epoch;
    if let Some(a) = r.assignment {
        c.owned = a;
    }
}

fn assert_no_partition_owned_twice(clients: &HashMap<String, Client>) {
    let mut seen = BTreeSet::new();
    for (id, c) in clients {
        for tp in parts(&c.owned) {
            assert!(seen.insert(tp), "{tp:?} owned twice (also by {id})");
        }
    }
}

#[test]
fn a_first_member_joins_at_epoch_one_with_every_partition() {
    let mut cg = groups();
    let t = orders(3);
    let r = ok(&mut cg, 0, &t, join_req("m1", &["orders"]));
    assert_eq!(r.member_epoch, 1);
    assert_eq!(r.heartbeat_interval_ms, 5_000);
    assert_eq!(count(&r.assignment.unwrap()), 3);
    let d = cg.describe("g").unwrap();
    assert_eq!(d.state, ConsumerGroupState::Stable);
    assert_eq!((d.epoch, d.assignment_epoch), (1, 1));
}

#[test]
fn a_v0_join_without_member_id_gets_one_from_the_coordinator() {
    let mut cg = groups();
    let mut req = join_req("", &["orders"]);
    req.version = 0;
    let r = ok(&mut cg, 0, &orders(1), req);
    assert!(!r.member_id.is_empty());
    let mut v1 = join_req("", &["orders"]);
    v1.version = 1;
    assert_eq!(err(&mut cg, &orders(1), v1), ResponseError::InvalidRequest);
}

#[test]
fn a_newcomer_gets_partitions_only_after_their_owner_revoked_them() {
    let mut cg = groups();
    let t = orders(4);
    let first = ok(&mut cg, 0, &t, join_req("a", &["orders"]));
    let mut a = Client {
        epoch: first.member_epoch,
        owned: first.assignment.unwrap(),
    };
    let second = ok(&mut cg, 10, &t, join_req("b", &["orders"]));
    assert_eq!(second.member_epoch, 2);
    assert_eq!(
        second.heartbeat_interval_ms, RECONCILING_HEARTBEAT_INTERVAL_MS,
        "waiting for partitions: heartbeat sooner"
    );
    assert!(
        second.assignment.unwrap().is_empty(),
        "a still owns everything: b waits"
    );
    // a learns it must revoke two partitions; its epoch stays until it confirms.
    let r = ok(&mut cg, 20, &t, beat("a", a.epoch, Some(a.owned.clone())));
    assert_eq!(r.member_epoch, 1);
    let kept = r.assignment.unwrap();
    assert_eq!(count(&kept), 2);
    // Before a confirms, b still gets nothing.
    let r = ok(&mut cg, 30, &t, beat("b", 2, Some(TopicPartitions::new())));
    assert!(r.assignment.is_none_or(|x| x.is_empty()));
    assert_eq!(
        cg.describe("g").unwrap().state,
        ConsumerGroupState::Reconciling
    );
    a.owned = kept;
    let r = ok(&mut cg, 40, &t, beat("a", a.epoch, Some(a.owned.clone())));
    assert_eq!(
        r.member_epoch, 2,
        "revocation confirmed: a moves to epoch 2"
    );
    let r = ok(&mut cg, 50, &t, beat("b", 2, Some(TopicPartitions::new())));
    assert_eq!(
        r.heartbeat_interval_ms, 5_000,
        "reconciled: the configured interval"
    );
    let b_owned = r.assignment.expect("b's partitions are released now");
    assert_eq!(count(&b_owned), 2);
    assert!(parts(&b_owned).is_disjoint(&parts(&a.owned)));
    assert_eq!(cg.describe("g").unwrap().state, ConsumerGroupState::Stable);
}

#[test]
fn members_joining_and_leaving_in_any_order_never_own_a_partition_twice() {
    let t = topics(&[("orders", T1, 7), ("audit", T2, 3)]);
    for seed in 0..20u64 {
        let mut cg = groups();
        let mut clients: HashMap<String, Client> = HashMap::new();
        let mut rng = seed;
        let mut next = || {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 33) as usize
        };
        let mut now = 0;
        for step in 0..200 {
            now += 100;
            let roll = next() % 10;
            if roll == 0 && clients.len() < 5 {
                let id = format!("m{step}");
                let r = ok(&mut cg, now, &t, join_req(&id, &["orders", "audit"]));
                clients.insert(
                    id,
                    Client {
                        epoch: r.member_epoch,
                        owned: r.assignment.unwrap_or_default(),
                    },
                );
            } else if roll == 1 && clients.len() > 1 {
                let mut ids: Vec<String> = clients.keys().cloned().collect();
                ids.sort();
                let id = ids[next() % ids.len()].clone();
                ok(&mut cg, now, &t, beat(&id, LEAVE_EPOCH, None));
                clients.remove(&id);
            } else if !clients.is_empty() {
                let mut ids: Vec<String> = clients.keys().cloned().collect();
                ids.sort();
                let id = ids[next() % ids.len()].clone();
                let mut c = clients[&id].clone();
                client_beat(&mut cg, now, &t, &id, &mut c);
                clients.insert(id, c);
            }
            assert_no_partition_owned_twice(&clients);
        }
        // Quiesce: everyone heartbeats until the group is stable, then all 10 partitions
        // are owned exactly once.
        for _ in 0..10 {
            let mut ids: Vec<String> = clients.keys().cloned().collect();
            ids.sort();
            for id in ids {
                now += 10;
                let mut c = clients[&id].clone();
                client_beat(&mut cg, now, &t, &id, &mut c);
                clients.insert(id, c);
                assert_no_partition_owned_twice(&clients);
            }
        }
        if !clients.is_empty() {
            assert_eq!(
                cg.describe("g").unwrap().state,
                ConsumerGroupState::Stable,
                "seed {seed}"
            );
            let total: usize = clients.values().map(|c| count(&c.owned)).sum();
            assert_eq!(total, 10, "seed {seed}");
        }
    }
}

#[test]
fn a_member_epoch_ahead_or_behind_the_coordinators_is_fenced() {
    let mut cg = groups();
    let t = orders(2);
    ok(&mut cg, 0, &t, join_req("a", &["orders"]));
    assert_eq!(
        err(&mut cg, &t, beat("a", 7, None)),
        ResponseError::FencedMemberEpoch
    );
    ok(&mut cg, 0, &t, join_req("b", &["orders"]));
    // a is at epoch 1; b moved the group to 2. A heartbeat claiming epoch 2 is ahead.
    assert_eq!(
        err(&mut cg, &t, beat("a", 2, None)),
        ResponseError::FencedMemberEpoch
    );
    assert_eq!(
        err(&mut cg, &t, beat("nobody", 1, None)),
        ResponseError::UnknownMemberId
    );
}

#[test]
fn the_previous_epoch_is_accepted_once_when_the_bump_answer_was_lost() {
    let mut cg = groups();
    let t = orders(2);
    ok(&mut cg, 0, &t, join_req("a", &["orders"]));
    let owned = TopicPartitions::from([(T1, BTreeSet::from([0, 1]))]);
    // The group moves to epoch 2 (a new topic partition), a's answer with epoch 2 is lost.
    let t3 = orders(3);
    let r = ok(&mut cg, 0, &t3, beat("a", 1, Some(owned.clone())));
    assert_eq!(r.member_epoch, 2);
    let again = ok(&mut cg, 0, &t3, beat("a", 1, Some(owned)));
    assert_eq!(
        again.member_epoch, 2,
        "epoch 1 with a subset of the assignment is fine"
    );
    assert_eq!(
        err(&mut cg, &t3, beat("a", 1, None)),
        ResponseError::FencedMemberEpoch
    );
}

#[test]
fn a_fenced_member_may_rejoin_with_epoch_zero_and_owns_nothing_meanwhile() {
    let mut cg = groups();
    let t = orders(2);
    ok(&mut cg, 0, &t, join_req("a", &["orders"]));
    ok(&mut cg, 0, &t, join_req("b", &["orders"]));
    let r = ok(&mut cg, 0, &t, join_req("a", &["orders"]));
    assert_eq!(
        count(&r.assignment.unwrap()),
        1,
        "b's target is not a's to take"
    );
}

#[test]
fn an_unknown_assignor_is_unsupported_and_a_bad_regex_is_invalid() {
    let mut cg = groups();
    let t = orders(1);
    let mut r = join_req("a", &["orders"]);
    r.server_assignor = Some("sticky-ish".into());
    assert_eq!(err(&mut cg, &t, r), ResponseError::UnsupportedAssignor);
    let mut r = join_req("a", &[]);
    r.subscribed_topic_names = None;
    r.subscribed_topic_regex = Some("orders-(".into());
    assert_eq!(err(&mut cg, &t, r), ResponseError::InvalidRegularExpression);
    assert!(!cg.contains("g"), "refused joins leave nothing behind");
}

#[test]
fn malformed_heartbeats_are_invalid_requests() {
    let mut cg = groups();
    let t = orders(1);
    let mut r = join_req("a", &["orders"]);
    r.rebalance_timeout_ms = -1;
    assert_eq!(err(&mut cg, &t, r), ResponseError::InvalidRequest);
    let mut r = join_req("a", &["orders"]);
    r.subscribed_topic_names = None;
    assert_eq!(err(&mut cg, &t, r), ResponseError::InvalidRequest);
    assert_eq!(
        err(&mut cg, &t, beat("a", -3, None)),
        ResponseError::InvalidRequest
    );
    let mut r = join_req("a", &["orders"]);
    r.group_id.clear();
    assert_eq!(err(&mut cg, &t, r), ResponseError::InvalidRequest);
    assert_eq!(
        err(&mut cg, &t, beat("a", -2, None)),
        ResponseError::InvalidRequest
    );
}

#[test]
fn a_heartbeat_to_a_group_that_does_not_exist_is_group_id_not_found() {
    let mut cg = groups();
    assert_eq!(
        err(&mut cg, &orders(1), beat("a", 3, None)),
        ResponseError::GroupIdNotFound
    );
}

#[test]
fn a_regex_subscription_picks_up_a_created_topic_in_a_new_group_epoch() {
    let mut cg = groups();
    let mut r = join_req("a", &[]);
    r.subscribed_topic_names = None;
    r.subscribed_topic_regex = Some("orders-.*".into());
    let before = topics(&[("orders-eu", T1, 2), ("payments", T2, 2)]);
    let first = ok(&mut cg, 0, &before, r);
    assert_eq!(
        count(&first.assignment.unwrap()),
        2,
        "only orders-eu matches"
    );
    let after = topics(&[
        ("orders-eu", T1, 2),
        ("orders-us", T2, 1),
        ("payments", Uuid::nil(), 2),
    ]);
    let owned = TopicPartitions::from([(T1, BTreeSet::from([0, 1]))]);
    let r = ok(&mut cg, 10, &after, beat("a", 1, Some(owned)));
    assert_eq!(r.member_epoch, 2);
    assert_eq!(count(&r.assignment.unwrap()), 3);
    assert_eq!(cg.subscribed_topics("g"), vec!["orders-eu", "orders-us"]);
}

#[test]
fn added_partitions_move_the_group_epoch_and_are_assigned() {
    let mut cg = groups();
    ok(&mut cg, 0, &orders(1), join_req("a", &["orders"]));
    let owned = TopicPartitions::from([(T1, BTreeSet::from([0]))]);
    let r = ok(&mut cg, 10, &orders(4), beat("a", 1, Some(owned)));
    assert_eq!(r.member_epoch, 2);
    assert_eq!(count(&r.assignment.unwrap()), 4);
}

#[test]
fn a_member_leaving_with_epoch_minus_one_frees_its_partitions_for_the_others() {
    let mut cg = groups();
    let t = orders(2);
    ok(&mut cg, 0, &t, join_req("a", &["orders"]));
    let b = ok(&mut cg, 0, &t, join_req("b", &["orders"]));
    let a_owned = ok(&mut cg, 0, &t, beat("a", 1, None)).assignment.unwrap();
    ok(&mut cg, 0, &t, beat("a", 1, Some(a_owned)));
    let b_owned = ok(
        &mut cg,
        0,
        &t,
        beat("b", b.member_epoch, Some(TopicPartitions::new())),
    )
    .assignment
    .unwrap();
    assert_eq!(count(&b_owned), 1);
    let left = ok(&mut cg, 0, &t, beat("a", LEAVE_EPOCH, None));
    assert_eq!(left.member_epoch, LEAVE_EPOCH);
    let r = ok(&mut cg, 0, &t, beat("b", 2, Some(b_owned)));
    assert_eq!(
        count(&r.assignment.unwrap()),
        2,
        "b takes a's partition at once"
    );
    assert_eq!(r.member_epoch, 3);
}

#[test]
fn a_static_member_away_keeps_its_assignment_and_takes_it_back_under_a_new_id() {
    let mut cg = groups();
    let t = orders(2);
    let mut join = join_req("a1", &["orders"]);
    join.instance_id = Some("host-a".into());
    let first = ok(&mut cg, 0, &t, join);
    ok(&mut cg, 0, &t, join_req("b", &["orders"]));
    let a_owned = ok(&mut cg, 0, &t, beat("a1", 1, None)).assignment.unwrap();
    let mut ack = beat("a1", first.member_epoch, Some(a_owned.clone()));
    ack.instance_id = Some("host-a".into());
    ok(&mut cg, 0, &t, ack);
    let mut away = beat("a1", LEAVE_STATIC_EPOCH, None);
    away.instance_id = Some("host-a".into());
    assert_eq!(ok(&mut cg, 0, &t, away).member_epoch, LEAVE_STATIC_EPOCH);
    // b cannot take a's partition while a is away within its session.
    let r = ok(&mut cg, 0, &t, beat("b", 2, Some(TopicPartitions::new())));
    assert!(parts(&r.assignment.unwrap_or_default()).is_disjoint(&parts(&a_owned)));
    let epoch_before = cg.describe("g").unwrap().epoch;
    let mut back = join_req("a2", &["orders"]);
    back.instance_id = Some("host-a".into());
    let r = ok(&mut cg, 100, &t, back);
    assert_eq!(
        r.assignment.unwrap(),
        a_owned,
        "the restarted instance gets its partitions back"
    );
    assert_eq!(
        cg.describe("g").unwrap().epoch,
        epoch_before,
        "no rebalance"
    );
    let ids: Vec<String> = cg
        .describe("g")
        .unwrap()
        .members
        .iter()
        .map(|m| m.member.member_id.clone())
        .collect();
    assert_eq!(ids, vec!["a2", "b"]);
}

#[test]
fn an_instance_id_in_use_by_a_live_member_is_unreleased() {
    let mut cg = groups();
    let t = orders(1);
    let mut a = join_req("a1", &["orders"]);
    a.instance_id = Some("host-a".into());
    ok(&mut cg, 0, &t, a);
    let mut b = join_req("a2", &["orders"]);
    b.instance_id = Some("host-a".into());
    assert_eq!(err(&mut cg, &t, b), ResponseError::UnreleasedInstanceId);
    let mut wrong = beat("zz", 1, None);
    wrong.instance_id = Some("host-a".into());
    assert_eq!(err(&mut cg, &t, wrong), ResponseError::FencedInstanceId);
}

#[test]
fn a_member_silent_for_the_session_timeout_is_removed() {
    let mut cg = groups();
    let t = orders(1);
    ok(&mut cg, 0, &t, join_req("a", &["orders"]));
    assert!(cg.tick(44_999).is_empty());
    let records = cg.tick(45_000);
    assert!(records.contains(&StateRecord::MemberRemoved {
        group: "g".into(),
        member_id: "a".into()
    }));
    assert_eq!(cg.describe("g").unwrap().state, ConsumerGroupState::Empty);
}

#[test]
fn a_member_that_does_not_revoke_within_its_rebalance_timeout_is_removed() {
    let mut cg = groups();
    let t = orders(2);
    ok(&mut cg, 0, &t, join_req("a", &["orders"]));
    ok(&mut cg, 0, &t, join_req("b", &["orders"]));
    // a is told to revoke at t=1000 and never confirms (heartbeats without owned partitions).
    ok(&mut cg, 1_000, &t, beat("a", 1, None));
    ok(&mut cg, 30_000, &t, beat("a", 1, None));
    ok(&mut cg, 30_000, &t, beat("b", 2, None));
    assert!(cg.tick(60_999).is_empty());
    cg.tick(61_000);
    let ids: Vec<String> = cg
        .describe("g")
        .unwrap()
        .members
        .iter()
        .map(|m| m.member.member_id.clone())
        .collect();
    assert_eq!(ids, vec!["b"]);
}

#[test]
fn a_full_group_refuses_new_members_with_group_max_size_reached() {
    let mut cg = ConsumerGroups::new(
        ConsumerGroupConfig {
            max_size: 1,
            ..ConsumerGroupConfig::default()
        },
        1,
    );
    let t = orders(1);
    ok(&mut cg, 0, &t, join_req("a", &["orders"]));
    assert_eq!(
        err(&mut cg, &t, join_req("b", &["orders"])),
        ResponseError::GroupMaxSizeReached
    );
}

#[test]
fn members_asking_for_range_get_contiguous_ranges() {
    let mut cg = groups();
    let t = orders(4);
    for id in ["a", "b"] {
        let mut r = join_req(id, &["orders"]);
        r.server_assignor = Some("range".into());
        ok(&mut cg, 0, &t, r);
    }
    let d = cg.describe("g").unwrap();
    assert_eq!(d.assignor, Assignor::Range);
    assert_eq!(
        d.members[0].target,
        TopicPartitions::from([(T1, BTreeSet::from([0, 1]))])
    );
    assert_eq!(
        d.members[1].target,
        TopicPartitions::from([(T1, BTreeSet::from([2, 3]))])
    );
}

#[test]
fn offset_commits_need_the_members_current_epoch() {
    let mut cg = groups();
    let t = orders(1);
    ok(&mut cg, 0, &t, join_req("a", &["orders"]));
    assert_eq!(cg.check_commit("g", "a", 1, 9), OffsetCheck::Accept);
    assert_eq!(
        cg.check_commit("g", "a", 0, 9),
        OffsetCheck::Reject(ResponseError::StaleMemberEpoch)
    );
    assert_eq!(
        cg.check_commit("g", "x", 1, 9),
        OffsetCheck::Reject(ResponseError::UnknownMemberId)
    );
    assert_eq!(
        cg.check_commit("g", "a", 1, 8),
        OffsetCheck::Reject(ResponseError::UnsupportedVersion)
    );
    assert_eq!(
        cg.check_commit("g", "", -1, 9),
        OffsetCheck::Reject(ResponseError::UnknownMemberId)
    );
    assert_eq!(cg.check_fetch("g", None, -1), OffsetCheck::Accept);
    assert_eq!(
        cg.check_fetch("g", Some("a"), 3),
        OffsetCheck::Reject(ResponseError::StaleMemberEpoch)
    );
    ok(&mut cg, 0, &t, beat("a", LEAVE_EPOCH, None));
    assert_eq!(
        cg.check_commit("g", "", -1, 9),
        OffsetCheck::Accept,
        "admin commits to an empty group"
    );
}

#[test]
fn replayed_records_rebuild_the_group_so_members_keep_their_partitions_and_epochs() {
    let mut cg = groups();
    let t = orders(4);
    let mut log = Vec::new();
    let mut run = |cg: &mut ConsumerGroups, now, r| {
        let (res, records) = cg.heartbeat(now, &t, r);
        log.extend(records);
        res.unwrap()
    };
    let a = run(&mut cg, 0, join_req("a", &["orders"]));
    let b = run(&mut cg, 0, join_req("b", &["orders"]));
    let a_kept = run(&mut cg, 0, beat("a", a.member_epoch, None))
        .assignment
        .unwrap();
    let a2 = run(&mut cg, 0, beat("a", 1, Some(a_kept.clone())));
    let b_owned = run(
        &mut cg,
        0,
        beat("b", b.member_epoch, Some(TopicPartitions::new())),
    )
    .assignment
    .unwrap();
    let mut rebuilt = ConsumerGroups::new(ConsumerGroupConfig::default(), 2);
    for r in log {
        rebuilt.replay(r);
    }
    rebuilt.restored(1_000_000);
    let before = cg.describe("g").unwrap();
    let after = rebuilt.describe("g").unwrap();
    for (x, y) in before.members.iter().zip(&after.members) {
        assert_eq!(x.member, y.member);
    }
    // Both members carry on with their epochs; nobody loses or doubles a partition.
    let ra = ok(
        &mut rebuilt,
        1_000_010,
        &t,
        beat("a", a2.member_epoch, Some(a_kept.clone())),
    );
    let rb = ok(
        &mut rebuilt,
        1_000_020,
        &t,
        beat("b", 2, Some(b_owned.clone())),
    );
    let a_now = ra.assignment.unwrap_or(a_kept);
    let b_now = rb.assignment.unwrap_or(b_owned);
    assert!(parts(&a_now).is_disjoint(&parts(&b_now)));
    assert_eq!(count(&a_now) + count(&b_now), 4);
    assert!(
        rebuilt.tick(1_044_999).is_empty(),
        "sessions restart at the rebuild"
    );
}

#[test]
fn a_deleted_group_is_gone_after_replay_and_a_non_empty_one_cannot_be_deleted() {
    let mut cg = groups();
    let t = orders(1);
    ok(&mut cg, 0, &t, join_req("a", &["orders"]));
    assert_eq!(cg.delete("g"), Err(ResponseError::NonEmptyGroup));
    let (_, mut log) = cg.heartbeat(0, &t, beat("a", LEAVE_EPOCH, None));
    log.extend(cg.delete("g").unwrap());
    let mut rebuilt = groups();
    for r in cg.records().into_iter().chain(log) {
        rebuilt.replay(r);
    }
    assert!(!rebuilt.contains("g"));
}

#[test]
fn a_large_group_joining_one_by_one_ends_balanced_with_every_partition_targeted_once() {
    let mut cg = ConsumerGroups::new(ConsumerGroupConfig::default(), 1);
    let t = orders(3000);
    for i in 0..300 {
        ok(&mut cg, i, &t, join_req(&format!("m{i:03}"), &["orders"]));
    }
    let d = cg.describe("g").unwrap();
    let loads: Vec<usize> = d.members.iter().map(|m| count(&m.target)).collect();
    assert_eq!(loads.len(), 300);
    assert!(
        loads.iter().all(|&l| l == 10),
        "3000 partitions over 300 members: 10 each"
    );
    let all: BTreeSet<(Uuid, i32)> = d.members.iter().flat_map(|m| parts(&m.target)).collect();
    assert_eq!(all.len(), 3000);
}
