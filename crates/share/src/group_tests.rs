use std::collections::BTreeSet;

use kafka_protocol::error::ResponseError;
use uuid::Uuid;

use crate::assignor::{Assignment, TopicsView};
use crate::group::*;

const SESSION: i64 = 45_000;

fn tid(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

fn topics(list: &[(&str, u128, i32)]) -> TopicsView {
    list.iter()
        .map(|(n, id, p)| (n.to_string(), (tid(*id), *p)))
        .collect()
}

fn join(member: &str, subs: &[&str]) -> HeartbeatRequest {
    HeartbeatRequest {
        member_id: member.to_string(),
        member_epoch: 0,
        rack_id: None,
        subscribed_topic_names: Some(subs.iter().map(|s| s.to_string()).collect()),
        client_id: "client".to_string(),
        client_host: "/127.0.0.1".to_string(),
    }
}

fn beat(member: &str, epoch: i32) -> HeartbeatRequest {
    HeartbeatRequest {
        member_id: member.to_string(),
        member_epoch: epoch,
        ..Default::default()
    }
}

fn group() -> ShareGroup {
    ShareGroup::new("g", ShareGroupConfig::default())
}

fn ok(
    r: (Result<HeartbeatReply, HeartbeatError>, Vec<GroupEvent>),
) -> (HeartbeatReply, Vec<GroupEvent>) {
    (r.0.expect("heartbeat accepted"), r.1)
}

fn err(r: (Result<HeartbeatReply, HeartbeatError>, Vec<GroupEvent>)) -> ResponseError {
    r.0.expect_err("heartbeat refused").error
}

fn parts(a: &Assignment) -> BTreeSet<(Uuid, i32)> {
    a.iter()
        .flat_map(|(id, ps)| ps.iter().map(move |p| (*id, *p)))
        .collect()
}

#[test]
fn a_member_joining_with_epoch_zero_gets_the_group_epoch_and_every_partition() {
    let t = topics(&[("orders", 1, 3)]);
    let mut g = group();
    let (reply, events) = ok(g.heartbeat(&join("m1", &["orders"]), &t, 0));
    assert_eq!(reply.member_id, "m1");
    assert_eq!(reply.member_epoch, 1);
    assert_eq!(reply.heartbeat_interval_ms, 5_000);
    assert_eq!(
        reply.assignment,
        Some(Assignment::from([(tid(1), BTreeSet::from([0, 1, 2]))]))
    );
    assert_eq!(g.group_epoch(), 1);
    assert_eq!(g.assignment_epoch(), 1);
    assert_eq!(
        events,
        vec![
            GroupEvent::MemberJoined {
                member_id: "m1".to_string()
            },
            GroupEvent::PartitionsAssigned(Assignment::from([(tid(1), BTreeSet::from([0, 1, 2]))])),
        ]
    );
    assert_eq!(g.state(), ShareGroupState::Stable);
}

#[test]
fn a_steady_heartbeat_keeps_the_epoch_and_sends_no_assignment() {
    let t = topics(&[("orders", 1, 3)]);
    let mut g = group();
    ok(g.heartbeat(&join("m1", &["orders"]), &t, 0));
    let (reply, events) = ok(g.heartbeat(&beat("m1", 1), &t, 5_000));
    assert_eq!(reply.member_epoch, 1);
    assert_eq!(reply.assignment, None);
    assert!(events.is_empty());
}

#[test]
fn a_second_member_bumps_the_group_epoch_and_both_get_a_balanced_share() {
    let t = topics(&[("orders", 1, 4)]);
    let mut g = group();
    ok(g.heartbeat(&join("m1", &["orders"]), &t, 0));
    let (r2, _) = ok(g.heartbeat(&join("m2", &["orders"]), &t, 10));
    assert_eq!(r2.member_epoch, 2);
    let (r1, _) = ok(g.heartbeat(&beat("m1", 1), &t, 20));
    assert_eq!(r1.member_epoch, 2);
    let a1 = parts(r1.assignment.as_ref().unwrap());
    let a2 = parts(r2.assignment.as_ref().unwrap());
    assert_eq!(a1.len(), 2);
    assert_eq!(a2.len(), 2);
    assert!(a1.is_disjoint(&a2));
    assert_eq!(g.state(), ShareGroupState::Stable);
}

#[test]
fn with_more_members_than_partitions_members_share_partitions() {
    let t = topics(&[("orders", 1, 1)]);
    let mut g = group();
    let (r1, _) = ok(g.heartbeat(&join("m1", &["orders"]), &t, 0));
    let (r2, _) = ok(g.heartbeat(&join("m2", &["orders"]), &t, 0));
    let (r1b, _) = ok(g.heartbeat(&beat("m1", r1.member_epoch), &t, 1));
    let only = Assignment::from([(tid(1), BTreeSet::from([0]))]);
    assert_eq!(r2.assignment, Some(only.clone()));
    // m1's assignment did not change: only its epoch moved.
    assert_eq!(r1b.assignment, None);
    assert_eq!(g.target_assignment("m1"), Some(&only));
}

#[test]
fn a_heartbeat_with_a_stale_or_future_epoch_is_fenced() {
    let t = topics(&[("orders", 1, 4)]);
    let mut g = group();
    ok(g.heartbeat(&join("m1", &["orders"]), &t, 0));
    ok(g.heartbeat(&join("m2", &["orders"]), &t, 0));
    ok(g.heartbeat(&beat("m1", 1), &t, 0)); // 1 -> 2
    ok(g.heartbeat(&join("m3", &["orders"]), &t, 0));
    ok(g.heartbeat(&beat("m1", 2), &t, 0)); // 2 -> 3
    assert_eq!(
        err(g.heartbeat(&beat("m1", 1), &t, 0)),
        ResponseError::FencedMemberEpoch
    );
    assert_eq!(
        err(g.heartbeat(&beat("m1", 4), &t, 0)),
        ResponseError::FencedMemberEpoch
    );
}

#[test]
fn a_heartbeat_with_the_previous_epoch_is_accepted_and_gets_the_assignment_again() {
    let t = topics(&[("orders", 1, 4)]);
    let mut g = group();
    ok(g.heartbeat(&join("m1", &["orders"]), &t, 0));
    ok(g.heartbeat(&join("m2", &["orders"]), &t, 0));
    let (moved, _) = ok(g.heartbeat(&beat("m1", 1), &t, 0));
    assert_eq!(moved.member_epoch, 2);
    // The answer was lost: m1 comes again with epoch 1.
    let (again, _) = ok(g.heartbeat(&beat("m1", 1), &t, 10));
    assert_eq!(again.member_epoch, 2);
    assert_eq!(again.assignment, moved.assignment);
}

#[test]
fn a_heartbeat_from_an_unknown_member_is_unknown_member_id() {
    let t = topics(&[("orders", 1, 2)]);
    let mut g = group();
    assert_eq!(
        err(g.heartbeat(&beat("ghost", 3), &t, 0)),
        ResponseError::UnknownMemberId
    );
    assert_eq!(
        err(g.heartbeat(&beat("ghost", LEAVE_EPOCH), &t, 0)),
        ResponseError::UnknownMemberId
    );
}

#[test]
fn invalid_requests_are_refused() {
    let t = topics(&[("orders", 1, 2)]);
    let mut g = group();
    assert_eq!(
        err(g.heartbeat(&join("", &["orders"]), &t, 0)),
        ResponseError::InvalidRequest
    );
    assert_eq!(
        err(g.heartbeat(&beat("m1", 0), &t, 0)),
        ResponseError::InvalidRequest,
        "no subscription on join"
    );
    assert_eq!(
        err(g.heartbeat(&beat("m1", -2), &t, 0)),
        ResponseError::InvalidRequest
    );
    let mut empty = join("m1", &[]);
    assert_eq!(
        err(g.heartbeat(&empty, &t, 0)),
        ResponseError::InvalidRequest
    );
    empty = join("m1", &["orders"]);
    empty.rack_id = Some(String::new());
    assert_eq!(
        err(g.heartbeat(&empty, &t, 0)),
        ResponseError::InvalidRequest
    );
    assert!(g.is_empty());
}

#[test]
fn a_member_leaving_with_epoch_minus_one_is_removed_and_its_locks_released() {
    let t = topics(&[("orders", 1, 2)]);
    let mut g = group();
    ok(g.heartbeat(&join("m1", &["orders"]), &t, 0));
    ok(g.heartbeat(&join("m2", &["orders"]), &t, 0));
    ok(g.heartbeat(&beat("m2", 2), &t, 10));
    let (reply, events) = ok(g.heartbeat(&beat("m2", LEAVE_EPOCH), &t, 20));
    assert_eq!(reply.member_epoch, LEAVE_EPOCH);
    assert_eq!(
        events,
        vec![GroupEvent::MemberRemoved {
            member_id: "m2".to_string(),
            reason: RemovalReason::Left
        }]
    );
    assert_eq!(g.group_epoch(), 3);
    assert_eq!(g.member_count(), 1);
    assert_eq!(parts(g.target_assignment("m1").unwrap()).len(), 2);
    // m1 never picked up its epoch-2 share: at epoch 3 it keeps both partitions, so only its
    // epoch moves and no assignment is sent.
    let (r1, _) = ok(g.heartbeat(&beat("m1", 1), &t, 30));
    assert_eq!(r1.member_epoch, 3);
    assert_eq!(r1.assignment, None);
}

#[test]
fn a_member_without_heartbeat_for_the_session_timeout_is_removed() {
    let t = topics(&[("orders", 1, 2)]);
    let mut g = group();
    ok(g.heartbeat(&join("m1", &["orders"]), &t, 0));
    ok(g.heartbeat(&join("m2", &["orders"]), &t, 1_000));
    assert_eq!(g.next_deadline(), Some(SESSION));
    assert!(g.expire_sessions(&t, SESSION - 1).is_empty());
    let events = g.expire_sessions(&t, SESSION);
    assert_eq!(
        events,
        vec![GroupEvent::MemberRemoved {
            member_id: "m1".to_string(),
            reason: RemovalReason::SessionExpired
        }]
    );
    assert_eq!(g.member_count(), 1);
    assert_eq!(
        err(g.heartbeat(&beat("m1", 2), &t, SESSION + 1)),
        ResponseError::UnknownMemberId
    );
    // The survivor's target now holds both partitions.
    assert_eq!(parts(g.target_assignment("m2").unwrap()).len(), 2);
    // A heartbeat pushes the deadline.
    ok(g.heartbeat(&beat("m2", 2), &t, 40_000));
    assert!(g.expire_sessions(&t, 1_000 + SESSION).is_empty());
    assert_eq!(g.next_deadline(), Some(40_000 + SESSION));
}

#[test]
fn a_member_rejoining_with_epoch_zero_has_its_locks_released_and_keeps_its_id() {
    let t = topics(&[("orders", 1, 2)]);
    let mut g = group();
    ok(g.heartbeat(&join("m1", &["orders"]), &t, 0));
    let (reply, events) = ok(g.heartbeat(&join("m1", &["orders"]), &t, 10));
    assert_eq!(reply.member_epoch, 1);
    assert!(reply.assignment.is_some());
    assert_eq!(
        events,
        vec![GroupEvent::MemberRemoved {
            member_id: "m1".to_string(),
            reason: RemovalReason::Rejoined
        }]
    );
    assert_eq!(g.member_count(), 1);
}

#[test]
fn a_subscription_change_bumps_the_group_epoch_and_reassigns() {
    let t = topics(&[("a", 1, 1), ("b", 2, 2)]);
    let mut g = group();
    ok(g.heartbeat(&join("m1", &["a"]), &t, 0));
    let mut req = beat("m1", 1);
    req.subscribed_topic_names = Some(vec!["a".to_string(), "b".to_string()]);
    let (reply, events) = ok(g.heartbeat(&req, &t, 10));
    assert_eq!(reply.member_epoch, 2);
    assert_eq!(parts(reply.assignment.as_ref().unwrap()).len(), 3);
    assert_eq!(
        events,
        vec![GroupEvent::PartitionsAssigned(Assignment::from([(
            tid(2),
            BTreeSet::from([0, 1])
        )]))]
    );
    // The same subscription again (in another order) changes nothing.
    let mut same = beat("m1", 2);
    same.subscribed_topic_names = Some(vec!["b".to_string(), "a".to_string()]);
    let (reply, _) = ok(g.heartbeat(&same, &t, 20));
    assert_eq!(reply.member_epoch, 2);
    assert_eq!(reply.assignment, None);
    assert_eq!(g.group_epoch(), 2);
}

#[test]
fn a_subscribed_topic_created_or_grown_later_is_assigned_with_a_new_epoch() {
    let mut g = group();
    let none = topics(&[]);
    let (reply, _) = ok(g.heartbeat(&join("m1", &["later"]), &none, 0));
    assert_eq!(reply.assignment, Some(Assignment::new()));
    assert_eq!(reply.member_epoch, 1);
    let created = topics(&[("later", 9, 1)]);
    let events = g.topics_changed(&created);
    assert_eq!(g.group_epoch(), 2);
    assert_eq!(
        events,
        vec![GroupEvent::PartitionsAssigned(Assignment::from([(
            tid(9),
            BTreeSet::from([0])
        )]))]
    );
    let (reply, _) = ok(g.heartbeat(&beat("m1", 1), &created, 10));
    assert_eq!(reply.member_epoch, 2);
    assert_eq!(
        reply.assignment,
        Some(Assignment::from([(tid(9), BTreeSet::from([0]))]))
    );
    let grown = topics(&[("later", 9, 3)]);
    let (reply, _) = ok(g.heartbeat(&beat("m1", 2), &grown, 20));
    assert_eq!(reply.member_epoch, 3);
    assert_eq!(parts(reply.assignment.as_ref().unwrap()).len(), 3);
    // Topics nobody subscribes to do not move the epoch.
    let other = topics(&[("later", 9, 3), ("unrelated", 5, 8)]);
    ok(g.heartbeat(&beat("m1", 3), &other, 30));
    assert_eq!(g.group_epoch(), 3);
}

#[test]
fn the_group_refuses_members_beyond_its_max_size() {
    let t = topics(&[("orders", 1, 2)]);
    let mut g = ShareGroup::new(
        "g",
        ShareGroupConfig {
            max_size: 2,
            ..Default::default()
        },
    );
    ok(g.heartbeat(&join("m1", &["orders"]), &t, 0));
    ok(g.heartbeat(&join("m2", &["orders"]), &t, 0));
    assert_eq!(
        err(g.heartbeat(&join("m3", &["orders"]), &t, 0)),
        ResponseError::GroupMaxSizeReached
    );
    // A member already in may rejoin.
    ok(g.heartbeat(&join("m2", &["orders"]), &t, 0));
}

#[test]
fn describe_shows_epochs_members_and_assignments() {
    let t = topics(&[("orders", 1, 2)]);
    let mut g = group();
    assert_eq!(g.describe().state, ShareGroupState::Empty);
    let mut req = join("m1", &["orders"]);
    req.rack_id = Some("rack-a".to_string());
    ok(g.heartbeat(&req, &t, 0));
    let d = g.describe();
    assert_eq!(d.group_id, "g");
    assert_eq!(d.state, ShareGroupState::Stable);
    assert_eq!(d.state.name(), "Stable");
    assert_eq!((d.group_epoch, d.assignment_epoch), (1, 1));
    assert_eq!(d.assignor_name, "simple");
    assert_eq!(d.members.len(), 1);
    let m = &d.members[0];
    assert_eq!(m.member_id, "m1");
    assert_eq!(m.rack_id.as_deref(), Some("rack-a"));
    assert_eq!(m.member_epoch, 1);
    assert_eq!(m.client_id, "client");
    assert_eq!(m.subscribed_topic_names, vec!["orders".to_string()]);
    assert_eq!(parts(&m.assignment).len(), 2);
    assert_eq!(
        g.subscribed_topic_names(),
        BTreeSet::from(["orders".to_string()])
    );
}
