//! A follower that was down while the leader snapshotted and purged its log catches up by
//! receiving the snapshot over the inter-node transport (chunked InstallSnapshot RPCs).

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{follower_of, run_bounded, Cluster, STEP_DEADLINE};
use spate_cluster::controller::create_topic_command;
use spate_cluster::metadata::MetadataCommand;
use spate_cluster::node::NodeConfig;
use tokio::net::TcpListener;
use uuid::Uuid;

fn snapshot_often(config: &mut NodeConfig) {
    config.snapshot_every_entries = 10;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_behind_a_purged_log_catches_up_from_a_snapshot() {
    run_bounded(scenario()).await;
}

async fn scenario() {
    let mut cluster = Cluster::start(false, snapshot_often).await;
    let leader = cluster.agreed_leader().await;
    let lagging = follower_of(&cluster, leader);
    let lagging_listen: SocketAddr = cluster.peers[&lagging].parse().unwrap();
    for id in 1..=3i32 {
        cluster
            .node(leader)
            .propose(MetadataCommand::RegisterBroker {
                broker_id: id,
                incarnation: Uuid::from_u128(id as u128),
                inter_node_addr: format!("127.0.0.1:{id}"),
                kafka_host: "127.0.0.1".to_owned(),
                kafka_port: 9092,
                rack: None,
                http_addr: None,
                now_ms: 0,
                listeners: vec![],
            })
            .await
            .unwrap();
    }
    cluster
        .converged("brokers everywhere", |i| i.brokers().len() == 3)
        .await;
    let stopped_at = cluster.node(lagging).metrics().await.last_log_index;
    cluster.stop(lagging).await;

    // Enough entries for several snapshots, each followed by a purge of the log before it.
    let active = follower_of(&cluster, leader);
    for n in 0..40 {
        let image = cluster.node(active).image();
        let cmd = create_topic_command(
            &image,
            &format!("t{n}"),
            Uuid::new_v4(),
            1,
            2,
            BTreeMap::new(),
        )
        .unwrap();
        cluster.node(active).propose(cmd).await.unwrap();
    }
    let deadline = Instant::now() + STEP_DEADLINE;
    let purged = loop {
        let m = cluster.node(leader).raft_metrics().borrow().clone();
        let purged = m.purged.map(|p| p.index);
        if purged > stopped_at {
            break purged;
        }
        assert!(
            Instant::now() < deadline,
            "the leader never purged past {stopped_at:?}: {m:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    let listener = TcpListener::bind(lagging_listen).await.unwrap();
    cluster.start_member(lagging, listener).await;
    let image = cluster
        .converged("the lagging node caught up", |i| i.topics().len() == 40)
        .await;
    assert_eq!(image.brokers().len(), 3);
    let m = cluster.node(lagging).metrics().await;
    assert!(
        m.snapshot_index >= purged,
        "the lagging node must have installed a snapshot past the purge point {purged:?}: {m:?}"
    );

    for id in [1, 2, 3] {
        cluster.stop(id).await;
    }
}
