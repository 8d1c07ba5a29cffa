//! KIP-932 share groups on a three-node cluster: membership on the group's coordinator,
//! ShareFetch and ShareAcknowledge on the data partition's leader, the durable state with the
//! share coordinator leading the key's `__share_group_state` partition. Both the share
//! coordinator's node and then the data leader's are killed with kill -9 mid-run; the group
//! starts at the earliest through a group config set on one node and applied by all.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kafka_protocol::messages::share_fetch_request::{
    AcknowledgementBatch, FetchPartition, FetchTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rdkafka::producer::FutureRecord;
use uuid::Uuid;

use crate::cluster::{create_replicated, ThreeNodes};
use crate::harness::{producer, Raw};
use crate::share_groups::{alter_group_configs, describe_group_configs};

const ACCEPT: i8 = 1;
const UNKNOWN_MEMBER_ID: i16 = 25;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// The `__share_group_state` partition of a share-partition, as Kafka maps it: the Java hash
/// of `group:topicId:partition` (the id in URL-safe base64), made non-negative as
/// `Utils.abs`, modulo the topic's 50 partitions.
fn state_partition_of(group: &str, topic: Uuid, partition: i32) -> i64 {
    use base64::Engine;
    let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(topic.as_bytes());
    let h = format!("{group}:{id}:{partition}")
        .encode_utf16()
        .fold(0i32, |h, u| h.wrapping_mul(31).wrapping_add(i32::from(u)));
    let positive = if h == i32::MIN { 0 } else { h.unsigned_abs() };
    (positive % 50) as i64
}

/// The leader of `topic`/`partition` as node `observer` sees it, once it has one.
fn leader_of(c: &ThreeNodes, observer: u64, topic: &str, partition: i64) -> u64 {
    c.wait_partition(observer, topic, partition, "a leader", |p| {
        p["leader"].as_u64().is_some()
    })["leader"]
        .as_u64()
        .expect("leader")
}

/// A ShareFetch's partition 0: acquired (first, last, delivery count) ranges, the
/// acknowledgement's error, the partition's error.
type Fetched = (Vec<(i64, i64, i16)>, i16, i16);

/// The address of `group`'s coordinator now, as node `observer` sees it, from the
/// addresses of the live nodes.
fn coordinator_finder<'a>(
    c: &'a ThreeNodes,
    observer: u64,
    group: &str,
    addrs: BTreeMap<u64, String>,
) -> impl Fn() -> String + 'a {
    let group = group.to_string();
    move || {
        let id = leader_of(
            c,
            observer,
            "__consumer_offsets",
            crate::cluster::offsets_partition_of(&group),
        );
        addrs.get(&id).cloned().expect("coordinator address")
    }
}

/// A share group member talking to the group's coordinator and to the partition's leader.
struct Member {
    coordinator: Raw,
    leader: Raw,
    group: String,
    id: String,
    epoch: i32,
    session: i32,
    topic_id: Uuid,
    /// The topic subscribed to.
    topic: String,
}

impl Member {
    fn heartbeat(&mut self, topics: Option<&[&str]>) -> ShareGroupHeartbeatResponse {
        let mut r = ShareGroupHeartbeatRequest::default();
        r.group_id = s(&self.group).into();
        r.member_id = s(&self.id);
        r.member_epoch = self.epoch;
        r.subscribed_topic_names = topics.map(|ts| ts.iter().map(|t| s(t).into()).collect());
        self.coordinator.call(ApiKey::ShareGroupHeartbeat, 1, &r)
    }

    /// Joins again with the same member id through `coordinator` (epoch 0); the share
    /// session starts again too.
    fn rejoin(&mut self, coordinator: &str) {
        self.coordinator = Raw::connect(coordinator);
        self.epoch = 0;
        self.session = 0;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let topic = self.topic.clone();
            let r = self.heartbeat(Some(&[topic.as_str()]));
            if r.error_code == 0 {
                self.epoch = r.member_epoch;
                return;
            }
            assert!(Instant::now() < deadline, "rejoin: {}", r.error_code);
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Joins `group` through `coordinator` subscribed to `topic`, fetching from `leader`.
    fn join(coordinator: &str, leader: &str, group: &str, id: &str, topic: &str) -> Self {
        let mut m = Self {
            coordinator: Raw::connect(coordinator),
            leader: Raw::connect(leader),
            group: group.into(),
            id: id.into(),
            epoch: 0,
            session: 0,
            topic_id: Uuid::nil(),
            topic: topic.into(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut subscribe = Some([topic]);
        loop {
            let r = m.heartbeat(subscribe.as_ref().map(|t| &t[..]));
            assert_eq!(r.error_code, 0, "heartbeat: {:?}", r.error_message);
            subscribe = None;
            m.epoch = r.member_epoch;
            if let Some(tp) = r
                .assignment
                .as_ref()
                .and_then(|a| a.topic_partitions.first())
            {
                m.topic_id = tp.topic_id;
                return m;
            }
            assert!(Instant::now() < deadline, "no assignment");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// ShareFetch of partition 0 carrying `acks`: (acquired ranges, ack error, partition
    /// error). The session advances on success.
    fn fetch(&mut self, wait_ms: i32, acks: &[(i64, i64)]) -> Fetched {
        self.try_fetch(wait_ms, acks)
            .unwrap_or_else(|e| panic!("share fetch of {}: error {e}", self.id))
    }

    /// [`Member::fetch`], or the whole request's error.
    fn try_fetch(&mut self, wait_ms: i32, acks: &[(i64, i64)]) -> Result<Fetched, i16> {
        let mut r = ShareFetchRequest::default();
        r.group_id = Some(s(&self.group).into());
        r.member_id = Some(s(&self.id));
        r.share_session_epoch = self.session;
        r.max_wait_ms = wait_ms;
        r.min_bytes = 1;
        r.max_bytes = 1 << 20;
        r.max_records = 20;
        r.batch_size = 20;
        let mut p = FetchPartition::default();
        p.partition_index = 0;
        p.acknowledgement_batches = acks
            .iter()
            .map(|(first, last)| {
                let mut b = AcknowledgementBatch::default();
                b.first_offset = *first;
                b.last_offset = *last;
                b.acknowledge_types = vec![ACCEPT];
                b
            })
            .collect();
        let mut t = FetchTopic::default();
        t.topic_id = self.topic_id;
        t.partitions = vec![p];
        r.topics = vec![t];
        let resp: ShareFetchResponse = self.leader.call(ApiKey::ShareFetch, 1, &r);
        if resp.error_code != 0 {
            return Err(resp.error_code);
        }
        self.session += 1;
        let part = &resp.responses[0].partitions[0];
        let ranges = part
            .acquired_records
            .iter()
            .map(|a| (a.first_offset, a.last_offset, a.delivery_count))
            .collect();
        Ok((ranges, part.acknowledge_error_code, part.error_code))
    }
}

/// Fetches and accepts with `m` until `until` offsets are accepted in all or the deadline;
/// every acquisition and acceptance is recorded. A record acquired after it was accepted is
/// a failure: it would be processed twice.
///
/// A member the group's coordinator no longer knows (UNKNOWN_MEMBER_ID: the coordinator
/// moved or lost its lease, and share group membership lives in its memory) joins again
/// through the coordinator `coordinator()` names, with the same member id, as Kafka's
/// clients do.
fn consume(
    m: &mut Member,
    accepted: &mut BTreeMap<i64, u32>,
    until: usize,
    what: &str,
    coordinator: &dyn Fn() -> String,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut pending: Vec<(i64, i64)> = Vec::new();
    while accepted.len() < until {
        assert!(
            Instant::now() < deadline,
            "{what}: {} of {until} accepted within 60 s",
            accepted.len()
        );
        let (ranges, ack_error, error) = match m.try_fetch(500, &pending) {
            Ok(f) => f,
            Err(UNKNOWN_MEMBER_ID) => {
                m.rejoin(&coordinator());
                continue;
            }
            Err(e) => panic!("{what}: share fetch error {e}"),
        };
        if ack_error == 0 {
            for (first, last) in pending.drain(..) {
                for o in first..=last {
                    *accepted.entry(o).or_default() += 1;
                }
            }
        } else {
            // Not durable: the records come back (lock expiry or a new leader's state).
            pending.clear();
        }
        if error != 0 {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        for (first, last, _) in ranges {
            for o in first..=last {
                assert!(
                    !accepted.contains_key(&o),
                    "{what}: offset {o} acquired again after it was accepted"
                );
            }
            pending.push((first, last));
        }
    }
    if !pending.is_empty() {
        let (_, ack_error, _) = m.fetch(0, &pending);
        if ack_error == 0 {
            for (first, last) in pending {
                for o in first..=last {
                    *accepted.entry(o).or_default() += 1;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_groups_in_a_cluster_survive_kill_9_of_the_share_coordinator_and_of_the_leader() {
    let mut c = ThreeNodes::start(&["--group-share-record-lock-duration-ms", "2000"]);
    let bootstrap = c.bootstrap();
    create_replicated(&bootstrap, "shq", 1, "2").await;
    let leader = leader_of(&c, 1, "shq", 0);
    let topic_id: Uuid = {
        let mut raw = Raw::connect(&c.node(leader).addr.clone());
        let mut r = MetadataRequest::default();
        let mut t = metadata_request::MetadataRequestTopic::default();
        t.name = Some(s("shq").into());
        r.topics = Some(vec![t]);
        let resp: MetadataResponse = raw.call(ApiKey::Metadata, 12, &r);
        resp.topics[0].topic_id
    };
    let coordinator_of = |c: &ThreeNodes, observer: u64, g: &str| {
        leader_of(
            c,
            observer,
            "__consumer_offsets",
            crate::cluster::offsets_partition_of(g),
        )
    };
    // A first share fetch creates `__share_group_state` (on first use, as Kafka).
    {
        let probe_gc = coordinator_of(&c, leader, "probe");
        let mut probe = Member::join(
            &c.node(probe_gc).addr.clone(),
            &c.node(leader).addr.clone(),
            "probe",
            "probe-member",
            "shq",
        );
        assert_eq!(probe.fetch(100, &[]).2, 0, "the probe's share fetch");
    }
    // A group whose coordinator, share coordinator and data leader are three different
    // nodes, so each kill below hits one role only.
    let group = (0..300)
        .map(|i| format!("sq-{i}"))
        .find(|g| {
            let gc = coordinator_of(&c, leader, g);
            let state = state_partition_of(g, topic_id, 0);
            let sc = leader_of(&c, leader, "__share_group_state", state);
            gc != leader && sc != leader && sc != gc
        })
        .expect("a group with its three roles on three nodes");
    let gc = coordinator_of(&c, leader, &group);
    let (gc_addr, leader_addr) = (c.node(gc).addr.clone(), c.node(leader).addr.clone());
    // Records produced before the group exists; the group starts at the earliest, a group
    // config set through one node and seen by every other (the cluster's metadata).
    let p = producer(&bootstrap, &[("acks", "all")]);
    for i in 0..200 {
        p.send(
            FutureRecord::<(), _>::to("shq")
                .partition(0)
                .payload(&format!("v-{i}")),
            Duration::from_secs(10),
        )
        .await
        .expect("produce");
    }
    let elsewhere = (1..=3).find(|id| *id != leader).expect("another node");
    let set = alter_group_configs(
        &mut Raw::connect(&c.node(elsewhere).addr.clone()),
        &group,
        &[("share.auto.offset.reset", Some("earliest"))],
    );
    assert_eq!(set, 0, "kafka-configs --alter --entity-type groups");
    for id in 1..=3 {
        let seen = describe_group_configs(&mut Raw::connect(&c.node(id).addr.clone()), &group);
        assert!(
            seen.iter()
                .any(|(k, v, _)| k == "share.auto.offset.reset" && v == "earliest"),
            "node {id} does not show the group config: {seen:?}"
        );
    }
    let mut a = Member::join(&gc_addr, &leader_addr, &group, "member-a", "shq");
    let mut accepted = BTreeMap::new();
    let addrs = |c: &mut ThreeNodes| -> BTreeMap<u64, String> {
        c.running()
            .into_iter()
            .map(|id| (id, c.node(id).addr.clone()))
            .collect()
    };
    let live = addrs(&mut c);
    consume(
        &mut a,
        &mut accepted,
        60,
        "before any kill",
        &coordinator_finder(&c, leader, &group, live),
    );
    // Kill the share coordinator of the share-partition: the leader's writes wait for the
    // new one, which rebuilt the state from its replica of the state partition.
    let state = state_partition_of(&group, topic_id, 0);
    let share_coordinator = leader_of(&c, leader, "__share_group_state", state);
    // FindCoordinator with key type 2 (share) names the same node, from any node.
    {
        use base64::Engine;
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(topic_id.as_bytes());
        let mut r = FindCoordinatorRequest::default();
        r.key_type = 2;
        r.coordinator_keys = vec![s(&format!("{group}:{id}:0"))];
        let resp: FindCoordinatorResponse =
            Raw::connect(&gc_addr).call(ApiKey::FindCoordinator, 6, &r);
        let found = &resp.coordinators[0];
        assert_eq!(found.error_code, 0, "{:?}", found.error_message);
        assert_eq!(i64::from(found.node_id.0), share_coordinator as i64);
    }
    c.node(share_coordinator).kill9();
    let live = addrs(&mut c);
    consume(
        &mut a,
        &mut accepted,
        130,
        "after the share coordinator's kill -9",
        &coordinator_finder(&c, leader, &group, live),
    );
    c.node(share_coordinator).restart();
    c.wait_ready(&[share_coordinator]);
    // Kill the data leader: the new leader reads the state at its new leader epoch. What was
    // accepted is never handed out again; what the old leader had handed out comes back.
    c.node(leader).kill9();
    let observer = if leader == 1 { 2 } else { 1 };
    let new_leader = c.wait_partition(observer, "shq", 0, "a new leader", |p| {
        p["leader"].as_u64().is_some_and(|l| l != leader)
    })["leader"]
        .as_u64()
        .expect("leader");
    let gc_now = coordinator_of(&c, observer, &group);
    let mut b = Member::join(
        &c.node(gc_now).addr.clone(),
        &c.node(new_leader).addr.clone(),
        &group,
        "member-b",
        "shq",
    );
    let live = addrs(&mut c);
    consume(
        &mut b,
        &mut accepted,
        200,
        "after the leader's kill -9",
        &coordinator_finder(&c, observer, &group, live),
    );
    let twice: Vec<_> = accepted.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "accepted more than once: {twice:?}");
    assert_eq!(
        accepted.keys().copied().collect::<Vec<_>>(),
        (0..200).collect::<Vec<_>>(),
        "every record accepted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_coordinator_without_a_replica_of_the_topic_assigns_it_and_its_leader_serves_it() {
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
    let mut c = ThreeNodes::start(&[]);
    let bootstrap = c.bootstrap();
    let created = crate::harness::admin(&bootstrap)
        .create_topics(
            &[NewTopic::new("solo", 1, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .expect("create_topics");
    assert!(created[0].is_ok(), "{created:?}");
    // One replica: the two other nodes know the topic from the metadata only.
    let leader = leader_of(&c, 1, "solo", 0);
    let coordinator = |g: &str| {
        leader_of(
            &c,
            leader,
            "__consumer_offsets",
            crate::cluster::offsets_partition_of(g),
        )
    };
    let group = (0..100)
        .map(|i| format!("solo-{i}"))
        .find(|g| coordinator(g) != leader)
        .expect("a group coordinated off the topic's only replica");
    let gc = coordinator(&group);
    let set = alter_group_configs(
        &mut Raw::connect(&c.node(gc).addr.clone()),
        &group,
        &[("share.auto.offset.reset", Some("earliest"))],
    );
    assert_eq!(set, 0);
    let p = producer(&bootstrap, &[]);
    for i in 0..20 {
        p.send(
            FutureRecord::<(), _>::to("solo")
                .partition(0)
                .payload(&format!("v-{i}")),
            Duration::from_secs(10),
        )
        .await
        .expect("produce");
    }
    let addrs: BTreeMap<u64, String> = (1..=3).map(|id| (id, c.node(id).addr.clone())).collect();
    let (gc_addr, leader_addr) = (addrs[&gc].clone(), addrs[&leader].clone());
    // The group's coordinator holds no replica of the data: the leader checks membership
    // with it (ShareGroupDescribe) before serving the member.
    let mut m = Member::join(&gc_addr, &leader_addr, &group, "solo-member", "solo");
    let mut accepted = BTreeMap::new();
    consume(
        &mut m,
        &mut accepted,
        20,
        "one replica elsewhere",
        &coordinator_finder(&c, leader, &group, addrs),
    );
    assert_eq!(
        accepted.iter().map(|(o, n)| (*o, *n)).collect::<Vec<_>>(),
        (0..20).map(|o| (o, 1)).collect::<Vec<_>>()
    );
}
