//! KIP-848 consumer groups through raw ConsumerGroupHeartbeat / ConsumerGroupDescribe
//! requests: Kafka's error codes for bad input, the shared classic/consumer namespace, member
//! epochs in OffsetCommit v9, and group state that survives a restart.

use kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use spate_protocol::ResponseError;

use crate::harness::{Raw, Spate};
use crate::produce_consume::create_topic;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn join(group: &str, member: &str, topics: &[&str]) -> ConsumerGroupHeartbeatRequest {
    let mut r = ConsumerGroupHeartbeatRequest::default();
    r.group_id = s(group).into();
    r.member_id = s(member);
    r.member_epoch = 0;
    r.rebalance_timeout_ms = 30_000;
    r.subscribed_topic_names = Some(topics.iter().map(|t| s(t).into()).collect());
    r.topic_partitions = Some(Vec::new());
    r
}

fn beat(
    group: &str,
    member: &str,
    epoch: i32,
    owned: Option<Vec<TopicPartitions>>,
) -> ConsumerGroupHeartbeatRequest {
    let mut r = ConsumerGroupHeartbeatRequest::default();
    r.group_id = s(group).into();
    r.member_id = s(member);
    r.member_epoch = epoch;
    r.rebalance_timeout_ms = -1;
    r.topic_partitions = owned;
    r
}

fn heartbeat(raw: &mut Raw, req: &ConsumerGroupHeartbeatRequest) -> ConsumerGroupHeartbeatResponse {
    raw.call(ApiKey::ConsumerGroupHeartbeat, 1, req)
}

fn code(e: ResponseError) -> i16 {
    e.code()
}

/// The assignment in a heartbeat answer as the owned partitions of the next heartbeat.
fn owned(resp: &ConsumerGroupHeartbeatResponse) -> Vec<TopicPartitions> {
    resp.assignment
        .as_ref()
        .map(|a| {
            a.topic_partitions
                .iter()
                .map(|tp| {
                    let mut o = TopicPartitions::default();
                    o.topic_id = tp.topic_id;
                    o.partitions = tp.partitions.clone();
                    o
                })
                .collect()
        })
        .unwrap_or_default()
}

fn partitions(resp: &ConsumerGroupHeartbeatResponse) -> usize {
    owned(resp).iter().map(|t| t.partitions.len()).sum()
}

fn describe(raw: &mut Raw, group: &str) -> consumer_group_describe_response::DescribedGroup {
    let mut r = ConsumerGroupDescribeRequest::default();
    r.group_ids = vec![s(group).into()];
    let resp: ConsumerGroupDescribeResponse = raw.call(ApiKey::ConsumerGroupDescribe, 1, &r);
    resp.groups.into_iter().next().expect("one group")
}

#[tokio::test]
async fn bad_heartbeats_get_kafkas_error_codes() {
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "cg-bad", 2, &[]).await;
    let mut raw = Raw::connect(&spate.addr);
    let first = heartbeat(&mut raw, &join("g-bad", "m-1", &["cg-bad"]));
    assert_eq!(first.error_code, 0, "{:?}", first.error_message);
    assert_eq!(first.member_epoch, 1);
    assert_eq!(first.heartbeat_interval_ms, 5000);

    let wrong = heartbeat(&mut raw, &beat("g-bad", "m-1", 9, None));
    assert_eq!(wrong.error_code, code(ResponseError::FencedMemberEpoch));

    let mut assignor = join("g-bad", "m-2", &["cg-bad"]);
    assignor.server_assignor = Some(s("no-such-assignor"));
    let r = heartbeat(&mut raw, &assignor);
    assert_eq!(r.error_code, code(ResponseError::UnsupportedAssignor));
    assert!(r
        .error_message
        .is_some_and(|m| m.contains("uniform, range")));

    let mut regex = join("g-bad", "m-3", &[]);
    regex.subscribed_topic_names = None;
    regex.subscribed_topic_regex = Some(s("cg-(bad"));
    let r = heartbeat(&mut raw, &regex);
    assert_eq!(r.error_code, code(ResponseError::InvalidRegularExpression));

    let unknown = heartbeat(&mut raw, &beat("g-bad", "nobody", 1, None));
    assert_eq!(unknown.error_code, code(ResponseError::UnknownMemberId));
    let mut no_id = join("g-bad", "", &["cg-bad"]);
    no_id.member_id = StrBytes::default();
    let r = heartbeat(&mut raw, &no_id);
    assert_eq!(
        r.error_code,
        code(ResponseError::InvalidRequest),
        "v1 needs a member id"
    );
}

#[tokio::test]
async fn a_second_member_gets_partitions_after_the_first_revokes_and_describe_shows_both() {
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "cg-two", 4, &[]).await;
    let mut raw = Raw::connect(&spate.addr);
    let a = heartbeat(&mut raw, &join("g-two", "a", &["cg-two"]));
    assert_eq!(partitions(&a), 4);
    let b = heartbeat(&mut raw, &join("g-two", "b", &["cg-two"]));
    assert_eq!(
        (b.member_epoch, partitions(&b)),
        (2, 0),
        "a still owns everything"
    );
    let a2 = heartbeat(&mut raw, &beat("g-two", "a", 1, Some(owned(&a))));
    assert_eq!(
        (a2.member_epoch, partitions(&a2)),
        (1, 2),
        "a is told to revoke two"
    );
    let d = describe(&mut raw, "g-two");
    assert_eq!(d.group_state.as_str(), "Reconciling");
    let a3 = heartbeat(&mut raw, &beat("g-two", "a", 1, Some(owned(&a2))));
    assert_eq!(a3.member_epoch, 2);
    let b2 = heartbeat(&mut raw, &beat("g-two", "b", 2, Some(Vec::new())));
    assert_eq!(partitions(&b2), 2);
    let d = describe(&mut raw, "g-two");
    assert_eq!(d.error_code, 0);
    assert_eq!(d.group_state.as_str(), "Stable");
    assert_eq!((d.group_epoch, d.assignment_epoch), (2, 2));
    assert_eq!(d.assignor_name.as_str(), "uniform");
    assert_eq!(d.members.len(), 2);
    let (status, body) = crate::harness::http(&spate.http, "GET", "/admin/groups/g-two", &[], "");
    assert_eq!(status, 200, "{body}");
    let admin: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(admin["protocol_type"], "consumer");
    assert_eq!(admin["protocol"], "uniform");
    assert_eq!(admin["members"][0]["member_epoch"], 2);
    assert_eq!(admin["members"][0]["assignment"][0]["topic"], "cg-two");
    for m in &d.members {
        assert_eq!(m.member_type, 1, "consumer protocol member");
        assert_eq!(m.assignment, m.target_assignment);
        let t = &m.assignment.topic_partitions[0];
        assert_eq!(t.topic_name.as_str(), "cg-two");
        assert_eq!(t.partitions.len(), 2);
    }
}

#[tokio::test]
async fn classic_and_consumer_groups_keep_to_their_own_ids_and_both_are_listed() {
    let spate = Spate::start(&["--group-initial-rebalance-delay-ms", "0"]);
    create_topic(&spate.addr, "cg-mixed", 1, &[]).await;
    let mut raw = Raw::connect(&spate.addr);
    // A classic member joins "classic-g" (v4+: first told its member id, then joins).
    let mut classic = JoinGroupRequest::default();
    classic.group_id = s("classic-g").into();
    classic.session_timeout_ms = 10_000;
    classic.rebalance_timeout_ms = 10_000;
    classic.protocol_type = s("consumer");
    let mut p = join_group_request::JoinGroupRequestProtocol::default();
    p.name = s("range");
    classic.protocols = vec![p];
    let first: JoinGroupResponse = raw.call(ApiKey::JoinGroup, 9, &classic);
    classic.member_id = first.member_id;
    let joined: JoinGroupResponse = raw.call(ApiKey::JoinGroup, 9, &classic);
    assert_eq!(joined.error_code, 0);

    let r = heartbeat(&mut raw, &join("classic-g", "m", &["cg-mixed"]));
    assert_eq!(r.error_code, code(ResponseError::GroupIdNotFound));

    let r = heartbeat(&mut raw, &join("consumer-g", "m", &["cg-mixed"]));
    assert_eq!(r.error_code, 0);
    classic.group_id = s("consumer-g").into();
    classic.member_id = StrBytes::default();
    let refused: JoinGroupResponse = raw.call(ApiKey::JoinGroup, 9, &classic);
    assert_eq!(
        refused.error_code,
        code(ResponseError::InconsistentGroupProtocol)
    );

    let mut describe_classic = DescribeGroupsRequest::default();
    describe_classic.groups = vec![s("consumer-g").into()];
    let dg: DescribeGroupsResponse = raw.call(ApiKey::DescribeGroups, 6, &describe_classic);
    assert_eq!(
        dg.groups[0].error_code,
        code(ResponseError::GroupIdNotFound)
    );
    let d = describe(&mut raw, "classic-g");
    assert_eq!(d.error_code, code(ResponseError::GroupIdNotFound));

    let list: ListGroupsResponse = raw.call(ApiKey::ListGroups, 5, &ListGroupsRequest::default());
    let kinds: Vec<(String, String)> = list
        .groups
        .iter()
        .map(|g| (g.group_id.to_string(), g.group_type.to_string()))
        .collect();
    assert!(
        kinds.contains(&("classic-g".into(), "classic".into())),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("consumer-g".into(), "consumer".into())),
        "{kinds:?}"
    );
    let mut only = ListGroupsRequest::default();
    only.types_filter = vec![s("consumer")];
    let list: ListGroupsResponse = raw.call(ApiKey::ListGroups, 5, &only);
    let ids: Vec<String> = list.groups.iter().map(|g| g.group_id.to_string()).collect();
    assert_eq!(ids, vec!["consumer-g"]);
}

fn commit(member: &str, epoch: i32) -> OffsetCommitRequest {
    let mut p = OffsetCommitRequestPartition::default();
    p.partition_index = 0;
    p.committed_offset = 42;
    let mut t = OffsetCommitRequestTopic::default();
    t.name = s("cg-commit").into();
    t.partitions = vec![p];
    let mut r = OffsetCommitRequest::default();
    r.group_id = s("g-commit").into();
    r.member_id = s(member);
    r.generation_id_or_member_epoch = epoch;
    r.topics = vec![t];
    r
}

#[tokio::test]
async fn offset_commits_of_a_consumer_group_need_the_current_member_epoch() {
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "cg-commit", 1, &[]).await;
    let mut raw = Raw::connect(&spate.addr);
    let r = heartbeat(&mut raw, &join("g-commit", "m", &["cg-commit"]));
    assert_eq!(r.member_epoch, 1);
    let stale: OffsetCommitResponse = raw.call(ApiKey::OffsetCommit, 9, &commit("m", 0));
    assert_eq!(
        stale.topics[0].partitions[0].error_code,
        code(ResponseError::StaleMemberEpoch)
    );
    let ok: OffsetCommitResponse = raw.call(ApiKey::OffsetCommit, 9, &commit("m", 1));
    assert_eq!(ok.topics[0].partitions[0].error_code, 0);
    let old: OffsetCommitResponse = raw.call(ApiKey::OffsetCommit, 8, &commit("m", 1));
    assert_eq!(
        old.topics[0].partitions[0].error_code,
        code(ResponseError::UnsupportedVersion)
    );
}

#[tokio::test]
async fn a_restarted_broker_keeps_members_epochs_and_assignments() {
    let mut spate = Spate::start(&[]);
    create_topic(&spate.addr, "cg-restart", 3, &[]).await;
    let mut raw = Raw::connect(&spate.addr);
    let a = heartbeat(&mut raw, &join("g-restart", "a", &["cg-restart"]));
    assert_eq!(partitions(&a), 3);
    let ok: OffsetCommitResponse = raw.call(ApiKey::OffsetCommit, 9, &{
        let mut c = commit("a", 1);
        c.group_id = s("g-restart").into();
        c.topics[0].name = s("cg-restart").into();
        c
    });
    assert_eq!(ok.topics[0].partitions[0].error_code, 0);
    spate.restart();
    let mut raw = Raw::connect(&spate.addr);
    // The member carries on with its epoch: no rejoin, nothing lost.
    let again = heartbeat(&mut raw, &beat("g-restart", "a", 1, Some(owned(&a))));
    assert_eq!(again.error_code, 0, "{:?}", again.error_message);
    assert!(again.member_epoch >= 1);
    let d = describe(&mut raw, "g-restart");
    assert_eq!(d.members.len(), 1);
    assert_eq!(
        d.members[0].assignment.topic_partitions[0].partitions.len(),
        3
    );
    let mut fetch = OffsetFetchRequest::default();
    let mut g = offset_fetch_request::OffsetFetchRequestGroup::default();
    g.group_id = s("g-restart").into();
    g.member_id = Some(s("a"));
    g.member_epoch = again.member_epoch;
    g.topics = None;
    fetch.groups = vec![g];
    let f: OffsetFetchResponse = raw.call(ApiKey::OffsetFetch, 9, &fetch);
    assert_eq!(f.groups[0].error_code, 0);
    assert_eq!(f.groups[0].topics[0].partitions[0].committed_offset, 42);
}

/// Heartbeats each running node until one coordinates the group (the others answer
/// NOT_COORDINATOR); gives up after 30 s.
fn heartbeat_coordinator(
    c: &mut crate::cluster::ThreeNodes,
    req: &ConsumerGroupHeartbeatRequest,
) -> ConsumerGroupHeartbeatResponse {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        for id in c.running() {
            let addr = c.node(id).addr.clone();
            let r = heartbeat(&mut Raw::connect(&addr), req);
            if r.error_code != code(ResponseError::NotCoordinator) {
                return r;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no node coordinates the group"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_group_survives_kill_9_of_its_coordinator_with_epochs_and_assignments() {
    let mut c = crate::cluster::ThreeNodes::start(&[]);
    crate::cluster::create_replicated(&c.bootstrap(), "cg-failover", 4, "2").await;
    let offsets = c.wait_partition(
        1,
        "__consumer_offsets",
        crate::cluster::offsets_partition_of("g-failover"),
        "offsets topic replicated",
        |p| crate::cluster::ids(&p["isr"]).len() == 3,
    );
    let a = heartbeat_coordinator(&mut c, &join("g-failover", "a", &["cg-failover"]));
    assert_eq!((a.error_code, partitions(&a)), (0, 4));
    let b = heartbeat_coordinator(&mut c, &join("g-failover", "b", &["cg-failover"]));
    assert_eq!((b.error_code, b.member_epoch), (0, 2));
    let a2 = heartbeat_coordinator(&mut c, &beat("g-failover", "a", 1, Some(owned(&a))));
    assert_eq!((a2.member_epoch, partitions(&a2)), (1, 2), "a revokes two");

    let coordinator = offsets["leader"].as_u64().expect("coordinator");
    c.node(coordinator).kill9();

    // The new coordinator knows both members: a confirms its revocation at its old epoch,
    // b then gets the two partitions a gave up, and no partition is given twice.
    let a3 = heartbeat_coordinator(&mut c, &beat("g-failover", "a", 1, Some(owned(&a2))));
    assert_eq!(a3.error_code, 0, "{:?}", a3.error_message);
    assert!(a3.member_epoch > 1);
    let a_parts = owned(&a3);
    let a_parts = if a3.assignment.is_some() {
        a_parts
    } else {
        owned(&a2)
    };
    let b2 = heartbeat_coordinator(&mut c, &beat("g-failover", "b", 2, Some(Vec::new())));
    assert_eq!(b2.error_code, 0, "{:?}", b2.error_message);
    let mut all: Vec<i32> = a_parts
        .iter()
        .chain(owned(&b2).iter())
        .flat_map(|t| t.partitions.clone())
        .collect();
    all.sort();
    assert_eq!(
        all,
        vec![0, 1, 2, 3],
        "each partition owned once across the failover"
    );
}

#[tokio::test]
async fn a_regex_subscription_gets_a_topic_created_later_and_a_static_member_gets_its_partitions_back(
) {
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "cg-re-a", 2, &[]).await;
    let mut raw = Raw::connect(&spate.addr);
    let mut by_regex = join("g-re", "r", &[]);
    by_regex.subscribed_topic_names = None;
    by_regex.subscribed_topic_regex = Some(s("cg-re-.*"));
    by_regex.instance_id = Some(s("host-1"));
    let first = heartbeat(&mut raw, &by_regex);
    assert_eq!((first.error_code, partitions(&first)), (0, 2));
    create_topic(&spate.addr, "cg-re-b", 1, &[]).await;
    let mut next = beat("g-re", "r", 1, Some(owned(&first)));
    next.instance_id = Some(s("host-1"));
    let grown = heartbeat(&mut raw, &next);
    assert_eq!((grown.member_epoch, partitions(&grown)), (2, 3));

    // The static member closes (epoch -2) and comes back under a new member id.
    let mut away = beat("g-re", "r", -2, None);
    away.instance_id = Some(s("host-1"));
    assert_eq!(heartbeat(&mut raw, &away).member_epoch, -2);
    let mut back = by_regex.clone();
    back.member_id = s("r2");
    let again = heartbeat(&mut raw, &back);
    assert_eq!(again.error_code, 0, "{:?}", again.error_message);
    assert_eq!(partitions(&again), 3, "its partitions, no rebalance");
    let d = describe(&mut raw, "g-re");
    assert_eq!(d.group_epoch, 2, "the group epoch did not move");
    assert_eq!(d.members[0].member_id.as_str(), "r2");
    assert_eq!(d.members[0].instance_id.as_deref(), Some("host-1"));
}
