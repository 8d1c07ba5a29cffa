use super::*;

const SESSION: i32 = 10_000;
const REBALANCE: i32 = 30_000;
const DELAY: i64 = 3_000;

fn coordinator() -> Coordinator {
    Coordinator::new(CoordinatorConfig::default(), 1)
}

fn join_req(member: &str, protocols: &[&str]) -> JoinRequest {
    JoinRequest {
        group_id: "g".into(),
        member_id: member.into(),
        group_instance_id: None,
        session_timeout_ms: SESSION,
        rebalance_timeout_ms: REBALANCE,
        protocol_type: "consumer".into(),
        protocols: protocols
            .iter()
            .map(|p| (p.to_string(), Bytes::from(format!("meta-{p}"))))
            .collect(),
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        require_known_member_id: true,
    }
}

fn join_of(replies: &[Reply], token: Token) -> Option<&JoinResponse> {
    replies.iter().find_map(|r| match r {
        Reply::Join(t, j) if *t == token => Some(j),
        _ => None,
    })
}

fn sync_of(replies: &[Reply], token: Token) -> Option<&SyncResponse> {
    replies.iter().find_map(|r| match r {
        Reply::Sync(t, s) if *t == token => Some(s),
        _ => None,
    })
}

/// Joins a new dynamic member through MEMBER_ID_REQUIRED; returns its id and the replies of
/// the second join (parked under `token`).
fn join_new(c: &mut Coordinator, now: i64, token: Token) -> (String, Vec<Reply>) {
    let first = c.join(now, token, join_req("", &["range"]));
    let j = join_of(&first, token).unwrap();
    assert_eq!(j.error, Some(ResponseError::MemberIdRequired));
    let id = j.member_id.clone();
    (id.clone(), c.join(now, token, join_req(&id, &["range"])))
}

fn sync(
    c: &mut Coordinator,
    now: i64,
    token: Token,
    member: &str,
    generation: i32,
    assignments: Vec<(String, Bytes)>,
) -> Vec<Reply> {
    c.sync(
        now,
        token,
        SyncRequest {
            group_id: "g".into(),
            generation_id: generation,
            member_id: member.into(),
            assignments,
            ..SyncRequest::default()
        },
    )
}

/// Two members joined, synced and stable at generation 1; returns (leader, follower).
fn stable_pair(c: &mut Coordinator) -> (String, String) {
    let (a, r) = join_new(c, 0, 1);
    assert!(r.is_empty(), "the first join waits for the initial delay");
    let (b, r) = join_new(c, 100, 2);
    assert!(r.is_empty());
    let r = c.tick(DELAY + 100);
    let ja = join_of(&r, 1).unwrap();
    let jb = join_of(&r, 2).unwrap();
    assert_eq!((ja.generation_id, ja.leader.as_str()), (1, a.as_str()));
    assert_eq!(ja.members.len(), 2, "the leader sees every member");
    assert!(jb.members.is_empty());
    assert_eq!(ja.protocol_name.as_deref(), Some("range"));
    let r = sync(c, DELAY + 200, 4, &b, 1, vec![]);
    assert!(r.is_empty(), "followers wait for the leader's assignment");
    let r = sync(
        c,
        DELAY + 300,
        3,
        &a,
        1,
        vec![
            (a.clone(), Bytes::from_static(b"A")),
            (b.clone(), Bytes::from_static(b"B")),
        ],
    );
    assert_eq!(sync_of(&r, 3).unwrap().assignment, Bytes::from_static(b"A"));
    assert_eq!(sync_of(&r, 4).unwrap().assignment, Bytes::from_static(b"B"));
    assert_eq!(c.describe("g").unwrap().state, GroupState::Stable);
    (a, b)
}

#[test]
fn new_dynamic_member_must_rejoin_with_the_id_it_is_given() {
    let mut c = coordinator();
    let r = c.join(0, 1, join_req("", &["range"]));
    let j = join_of(&r, 1).unwrap();
    assert_eq!(j.error, Some(ResponseError::MemberIdRequired));
    assert!(!j.member_id.is_empty());
    // Older clients (JoinGroup < v4) join at once.
    let mut old = join_req("", &["range"]);
    old.require_known_member_id = false;
    old.group_id = "g2".into();
    assert!(c.join(0, 2, old).is_empty());
    assert_eq!(c.describe("g2").unwrap().members.len(), 1);
}

#[test]
fn members_join_sync_and_become_stable() {
    let mut c = coordinator();
    stable_pair(&mut c);
}

#[test]
fn first_rebalance_waits_for_the_initial_delay() {
    let mut c = coordinator();
    let (_, r) = join_new(&mut c, 0, 1);
    assert!(r.is_empty());
    assert!(c.tick(DELAY - 1).is_empty());
    assert!(join_of(&c.tick(DELAY), 1).is_some());
}

#[test]
fn a_newcomer_rebalances_a_stable_group() {
    let mut c = coordinator();
    let (a, b) = stable_pair(&mut c);
    let (d, r) = join_new(&mut c, 5_000, 5);
    assert!(r.is_empty());
    assert_eq!(
        c.heartbeat(5_100, "g", 1, &a, None),
        Some(ResponseError::RebalanceInProgress)
    );
    assert!(c.join(5_200, 6, join_req(&a, &["range"])).is_empty());
    let r = c.join(5_300, 7, join_req(&b, &["range"]));
    let generations: Vec<i32> = [5, 6, 7]
        .iter()
        .map(|t| join_of(&r, *t).unwrap().generation_id)
        .collect();
    assert_eq!(generations, vec![2, 2, 2]);
    assert_eq!(
        join_of(&r, 6).unwrap().members.len(),
        3,
        "the leader stays the leader"
    );
    assert!(!d.is_empty());
    // A commit from the old generation is refused.
    assert_eq!(
        c.check_commit(5_400, "g", 1, &a, None),
        CommitCheck::Reject(ResponseError::IllegalGeneration)
    );
    assert_eq!(
        c.check_commit(5_400, "g", 2, &a, None),
        CommitCheck::Reject(ResponseError::RebalanceInProgress)
    );
}

#[test]
fn a_silent_member_is_evicted_after_its_session_timeout() {
    let mut c = coordinator();
    let (a, b) = stable_pair(&mut c);
    let t0 = DELAY + 300;
    // a keeps heartbeating, b goes quiet.
    for now in (t0..t0 + SESSION as i64 + 1_000).step_by(1_000) {
        assert_eq!(c.heartbeat(now, "g", 1, &a, None), None);
        c.tick(now);
    }
    let d = c.describe("g").unwrap();
    assert_eq!(d.state, GroupState::PreparingRebalance);
    assert!(d.members.iter().all(|m| m.member_id != b));
    let r = c.join(t0 + 12_000, 9, join_req(&a, &["range"]));
    let j = join_of(&r, 9).unwrap();
    assert_eq!((j.generation_id, j.members.len()), (2, 1));
    assert_eq!(
        c.heartbeat(t0 + 12_100, "g", 1, &b, None),
        Some(ResponseError::UnknownMemberId)
    );
}

#[test]
fn members_that_do_not_rejoin_in_time_are_dropped_from_the_rebalance() {
    let mut c = coordinator();
    let (a, b) = stable_pair(&mut c);
    let now = 10_000;
    assert!(c.join(now, 8, join_req(&a, &["range"])).is_empty());
    // b keeps heartbeating but never rejoins.
    for t in (now..now + REBALANCE as i64).step_by(2_000) {
        c.heartbeat(t, "g", 1, &b, None);
        assert!(c.tick(t).is_empty());
    }
    let r = c.tick(now + REBALANCE as i64);
    let j = join_of(&r, 8).unwrap();
    assert_eq!((j.generation_id, j.members.len()), (2, 1));
}

#[test]
fn sync_and_heartbeat_refuse_strangers_and_stale_generations() {
    let mut c = coordinator();
    let (a, _) = stable_pair(&mut c);
    let r = sync(&mut c, 5_000, 9, &a, 0, vec![]);
    assert_eq!(
        sync_of(&r, 9).unwrap().error,
        Some(ResponseError::IllegalGeneration)
    );
    let r = sync(&mut c, 5_000, 9, "nobody", 1, vec![]);
    assert_eq!(
        sync_of(&r, 9).unwrap().error,
        Some(ResponseError::UnknownMemberId)
    );
    assert_eq!(
        c.heartbeat(5_000, "g", 0, &a, None),
        Some(ResponseError::IllegalGeneration)
    );
    assert_eq!(c.heartbeat(5_000, "g", 1, &a, None), None);
    assert_eq!(
        c.heartbeat(5_000, "nope", 1, &a, None),
        Some(ResponseError::UnknownMemberId)
    );
    let r = c.join(5_000, 10, join_req("stranger", &["range"]));
    assert_eq!(
        join_of(&r, 10).unwrap().error,
        Some(ResponseError::UnknownMemberId)
    );
}

#[test]
fn leaving_rebalances_and_the_last_one_out_empties_the_group() {
    let mut c = coordinator();
    let (a, b) = stable_pair(&mut c);
    let (res, _) = c.leave(5_000, "g", &[(b.clone(), None), ("ghost".into(), None)]);
    assert_eq!(
        res.unwrap(),
        vec![None, Some(ResponseError::UnknownMemberId)]
    );
    assert_eq!(
        c.describe("g").unwrap().state,
        GroupState::PreparingRebalance
    );
    let r = c.join(5_100, 11, join_req(&a, &["range"]));
    assert_eq!(join_of(&r, 11).unwrap().generation_id, 2);
    let (res, _) = c.leave(5_200, "g", &[(a, None)]);
    assert_eq!(res.unwrap(), vec![None]);
    assert_eq!(c.describe("g").unwrap().state, GroupState::Empty);
    assert_eq!(
        c.check_commit(5_300, "g", -1, "", None),
        CommitCheck::Accept
    );
    assert!(c.delete("g").is_ok());
    assert_eq!(c.delete("g"), Err(ResponseError::GroupIdNotFound));
}

#[test]
fn static_member_rejoining_with_a_new_id_keeps_its_assignment_and_fences_the_old_id() {
    let mut c = coordinator();
    let mut s = join_req("", &["range"]);
    s.group_instance_id = Some("instance-1".into());
    assert!(
        c.join(0, 1, s.clone()).is_empty(),
        "static members skip MEMBER_ID_REQUIRED"
    );
    let r = c.tick(DELAY);
    let first = join_of(&r, 1).unwrap().clone();
    let r = sync(
        &mut c,
        DELAY,
        2,
        &first.member_id,
        1,
        vec![(first.member_id.clone(), Bytes::from_static(b"P0"))],
    );
    assert_eq!(
        sync_of(&r, 2).unwrap().assignment,
        Bytes::from_static(b"P0")
    );
    // The process restarts: same instance id, no member id.
    let r = c.join(DELAY + 100, 3, s.clone());
    let again = join_of(&r, 3).unwrap();
    assert_ne!(again.member_id, first.member_id);
    assert_eq!(
        c.describe("g").unwrap().state,
        GroupState::Stable,
        "no rebalance"
    );
    assert_eq!(again.generation_id, 1);
    let r = sync(&mut c, DELAY + 200, 4, &again.member_id, 1, vec![]);
    assert_eq!(
        sync_of(&r, 4).unwrap().assignment,
        Bytes::from_static(b"P0")
    );
    assert_eq!(
        c.heartbeat(DELAY + 300, "g", 1, &first.member_id, Some("instance-1")),
        Some(ResponseError::FencedInstanceId)
    );
}

#[test]
fn joins_without_a_usable_protocol_are_refused() {
    let mut c = coordinator();
    let r = c.join(0, 1, join_req("", &[]));
    assert_eq!(
        join_of(&r, 1).unwrap().error,
        Some(ResponseError::InconsistentGroupProtocol)
    );
    let mut bad = join_req("", &["range"]);
    bad.session_timeout_ms = 10;
    assert_eq!(
        join_of(&c.join(0, 2, bad), 2).unwrap().error,
        Some(ResponseError::InvalidSessionTimeout)
    );
    let mut bad = join_req("", &["range"]);
    bad.group_id.clear();
    assert_eq!(
        join_of(&c.join(0, 3, bad), 3).unwrap().error,
        Some(ResponseError::InvalidGroupId)
    );
    stable_pair(&mut c);
    let (_, r) = (0, c.join(9_000, 4, join_req("", &["roundrobin"])));
    assert_eq!(
        join_of(&r, 4).unwrap().error,
        Some(ResponseError::InconsistentGroupProtocol)
    );
}

#[test]
fn the_protocol_most_members_prefer_wins() {
    let mut c = coordinator();
    let mut ids = Vec::new();
    for (token, prefs) in [
        (1, ["range", "cooperative-sticky"]),
        (2, ["cooperative-sticky", "range"]),
        (3, ["cooperative-sticky", "range"]),
    ] {
        let r = c.join(0, token, join_req("", &prefs));
        let id = join_of(&r, token).unwrap().member_id.clone();
        c.join(0, token, join_req(&id, &prefs));
        ids.push(id);
    }
    let r = c.tick(DELAY);
    assert_eq!(
        join_of(&r, 1).unwrap().protocol_name.as_deref(),
        Some("cooperative-sticky")
    );
}

#[test]
fn commits_follow_membership() {
    let mut c = coordinator();
    assert_eq!(
        c.check_commit(0, "fresh", -1, "", None),
        CommitCheck::Accept
    );
    assert_eq!(
        c.check_commit(0, "fresh", 3, "m", None),
        CommitCheck::Reject(ResponseError::IllegalGeneration)
    );
    let (a, _) = stable_pair(&mut c);
    assert_eq!(c.check_commit(9_000, "g", 1, &a, None), CommitCheck::Accept);
    assert_eq!(
        c.check_commit(9_000, "g", -1, "", None),
        CommitCheck::Reject(ResponseError::UnknownMemberId)
    );
    assert_eq!(
        c.check_commit(9_000, "g", 1, "who", None),
        CommitCheck::Reject(ResponseError::UnknownMemberId)
    );
    assert_eq!(c.delete("g"), Err(ResponseError::NonEmptyGroup));
}

#[test]
fn subscriptions_are_read_from_consumer_metadata() {
    let mut meta = vec![0u8, 1, 0, 0, 0, 2];
    for t in ["orders", "users"] {
        meta.extend_from_slice(&(t.len() as i16).to_be_bytes());
        meta.extend_from_slice(t.as_bytes());
    }
    meta.extend_from_slice(&[0, 0, 0, 0]);
    assert_eq!(
        subscription_topics(&Bytes::from(meta)),
        vec!["orders", "users"]
    );
    assert!(
        subscription_topics(&Bytes::from_static(&[0, 1, 0x7f, 0xff, 0xff, 0xff, 0, 50])).is_empty()
    );
}
