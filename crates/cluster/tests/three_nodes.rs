//! Three metadata nodes in one process on real loopback TCP ports: election, proposals from
//! any node, leader loss and failover (with the controller fencing the dead broker and moving
//! its partitions), and the old leader's return from its data dir.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{follower_of, run_bounded, Cluster, STEP_DEADLINE};
use spate_cluster::controller::create_topic_command;
use spate_cluster::metadata::{CommandOutcome, MetadataCommand};
use tokio::net::TcpListener;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_replicate_fail_over_and_catch_up() {
    run_bounded(scenario()).await;
}

async fn scenario() {
    let mut cluster = Cluster::start(true, |_| {}).await;

    // 1. A leader is elected and every broker registers through it.
    let leader = cluster.agreed_leader().await;
    for m in cluster.members.values() {
        let session = m.session.as_ref().unwrap();
        assert!(session.registered(STEP_DEADLINE).await.is_some());
    }
    cluster
        .converged("three live brokers on every node", |i| {
            i.live_brokers().count() == 3
        })
        .await;

    // 2. Commands proposed through a follower and through the leader apply identically.
    let follower = follower_of(&cluster, leader);
    let image = cluster.node(follower).image();
    let topic_id = Uuid::new_v4();
    let create = create_topic_command(&image, "events", topic_id, 3, 3, BTreeMap::new()).unwrap();
    let outcome = cluster.node(follower).propose(create).await.unwrap();
    assert_eq!(outcome, CommandOutcome::TopicCreated { topic_id });
    let broker_epoch = image.broker(follower as i32).unwrap().epoch;
    let ids = cluster
        .node(leader)
        .propose(MetadataCommand::AllocateProducerIds {
            broker_id: follower as i32,
            broker_epoch,
        })
        .await
        .unwrap();
    assert!(matches!(ids, CommandOutcome::ProducerIdsAllocated(b) if b.first == 0));
    // A refusal comes back typed, from any node.
    let err = cluster
        .node(follower)
        .propose(MetadataCommand::DeleteTopic {
            name: "missing".to_owned(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.kafka_error_code(), 3, "{err}");
    let image = cluster
        .converged("the topic on every node", |i| i.topic("events").is_some())
        .await;
    let leaders: BTreeSet<i32> = image
        .topic("events")
        .unwrap()
        .partitions
        .iter()
        .filter_map(|p| p.leader)
        .collect();
    assert_eq!(
        leaders,
        BTreeSet::from([1, 2, 3]),
        "preferred leaders are spread"
    );

    // 3. The leader goes away: a new one is elected, the controller fences the dead broker
    //    and moves its partitions to in-sync replicas, and proposals still work.
    let old = leader;
    let old_listen: SocketAddr = cluster.peers[&old].parse().unwrap();
    cluster.stop(old).await;
    let leader = cluster.agreed_leader().await;
    assert_ne!(leader, old);
    let dead = old as i32;
    let image = cluster
        .converged("the dead broker fenced and its partitions moved", |i| {
            i.broker(dead).is_some_and(|b| b.fenced)
                && i.topic("events").unwrap().partitions.iter().all(|p| {
                    p.leader.is_some_and(|l| l != dead && p.isr.contains(&l))
                        && !p.isr.contains(&dead)
                })
        })
        .await;
    assert!(image
        .topic("events")
        .unwrap()
        .partitions
        .iter()
        .any(|p| p.leader_epoch > 0));
    let follower = follower_of(&cluster, leader);
    cluster
        .node(follower)
        .propose(MetadataCommand::AlterTopicConfigs {
            name: "events".to_owned(),
            set: BTreeMap::from([("retention.ms".to_owned(), "60000".to_owned())]),
            remove: vec![],
        })
        .await
        .unwrap();
    cluster
        .node(leader)
        .propose(MetadataCommand::DeleteTopic {
            name: "events".to_owned(),
        })
        .await
        .unwrap();
    let create = create_topic_command(
        &cluster.node(leader).image(),
        "after",
        Uuid::new_v4(),
        2,
        2,
        BTreeMap::new(),
    )
    .unwrap();
    cluster.node(follower).propose(create).await.unwrap();

    // 4. The old leader restarts from its data dir, catches up to the same image and
    //    registers again: unfenced, but in no ISR until a partition leader adds it.
    let listener = TcpListener::bind(old_listen).await.unwrap();
    cluster.start_member(old, listener).await;
    let image = cluster
        .converged("the restarted node caught up and re-registered", |i| {
            i.topic("after").is_some()
                && i.topic("events").is_none()
                && i.broker(dead).is_some_and(|b| !b.fenced)
        })
        .await;
    assert!(image
        .topics()
        .values()
        .flat_map(|t| &t.partitions)
        .all(|p| !p.isr.contains(&dead)));
    let restarted = cluster.node(old).clone();
    let deadline = Instant::now() + STEP_DEADLINE;
    let metrics = loop {
        let m = restarted.metrics().await;
        if m.caught_up() {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "restarted node never caught up: {m:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(metrics.term >= 2, "{metrics:?}");
    assert!(metrics.commit_index.is_some() && metrics.applied_index.is_some());
    // And it can propose too (forwarded to the current leader).
    restarted
        .propose(MetadataCommand::AlterTopicConfigs {
            name: "after".to_owned(),
            set: BTreeMap::from([("cleanup.policy".to_owned(), "compact".to_owned())]),
            remove: vec![],
        })
        .await
        .unwrap();
    cluster
        .converged("the last change on every node", |i| {
            i.topic("after")
                .is_some_and(|t| t.configs.contains_key("cleanup.policy"))
        })
        .await;

    for id in [1, 2, 3] {
        cluster.stop(id).await;
    }
}
