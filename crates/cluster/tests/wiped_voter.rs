//! A voter whose metadata log was wiped must not help elect a leader that lacks entries it
//! had acknowledged: it grants no vote until it has caught up with a leader again.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::{run_bounded, Cluster};
use spate_cluster::controller::create_topic_command;
use spate_cluster::metadata::MetadataImage;
use tokio::net::TcpListener;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_voter_grants_no_vote_until_caught_up_so_no_stale_leader_loses_commits() {
    run_bounded(scenario()).await;
}

fn listen_of(cluster: &Cluster, id: u64) -> SocketAddr {
    cluster.peers[&id].parse().expect("peer address")
}

async fn scenario() {
    let mut cluster = Cluster::start(true, |_| {}).await;
    let a = cluster.agreed_leader().await;
    cluster
        .converged("three brokers registered", |i| {
            i.live_brokers().count() == 3
        })
        .await;
    let mut others = cluster.members.keys().copied().filter(|&id| id != a);
    let (b, c) = (others.next().expect("b"), others.next().expect("c"));

    // C falls behind: the topics below are committed by A and B alone.
    let c_listen = listen_of(&cluster, c);
    cluster.stop(c).await;
    for i in 0..5 {
        let image = cluster.node(a).image();
        let cmd = create_topic_command(
            &image,
            &format!("t{i}"),
            Uuid::new_v4(),
            1,
            1,
            BTreeMap::new(),
        )
        .expect("topic command");
        cluster
            .node(a)
            .propose(cmd)
            .await
            .expect("committed by A and B");
    }
    let has_all = |image: &MetadataImage| (0..5).all(|i| image.topic(&format!("t{i}")).is_some());

    // B loses its metadata log, A goes down, C (stale) and B (wiped) come back. C's log is
    // at least as long as B's empty one, so B would vote for C: a leader without the five
    // committed topics, which would then overwrite them on A.
    let b_listen = listen_of(&cluster, b);
    let a_listen = listen_of(&cluster, a);
    cluster.stop(b).await;
    cluster.stop(a).await;
    let b_dir = cluster.dirs[&b].path().join("metadata");
    std::fs::remove_dir_all(&b_dir).expect("wipe B's metadata log");
    cluster
        .start_member(c, TcpListener::bind(c_listen).await.expect("bind C"))
        .await;
    cluster
        .start_member(b, TcpListener::bind(b_listen).await.expect("bind B"))
        .await;
    // Many election timeouts (0.5-1 s): no leader may emerge without the committed topics.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    while tokio::time::Instant::now() < deadline {
        for id in [b, c] {
            let node = cluster.node(id);
            if node.is_leader() {
                assert!(
                    has_all(&node.image()),
                    "node {id} leads without the committed topics"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A returns: a leader with everything is elected, B catches up and votes again.
    cluster
        .start_member(a, TcpListener::bind(a_listen).await.expect("bind A"))
        .await;
    cluster.agreed_leader().await;
    cluster
        .converged("every node holds the committed topics", has_all)
        .await;
}
