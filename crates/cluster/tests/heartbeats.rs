//! Broker heartbeats reach the active controller as messages, out of the Raft log: live
//! brokers stay unfenced through many session timeouts while the metadata log does not grow
//! with their heartbeats, and a broker that falls silent is still fenced.

mod common;

use std::time::Duration;

use common::{follower_of, run_bounded, Cluster, STEP_DEADLINE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_brokers_live_without_growing_the_metadata_log() {
    run_bounded(scenario()).await;
}

async fn scenario() {
    let mut cluster = Cluster::start(true, |_| {}).await;
    let leader = cluster.agreed_leader().await;
    for m in cluster.members.values() {
        let session = m.session.as_ref().expect("broker session");
        assert!(session.registered(STEP_DEADLINE).await.is_some());
    }
    cluster
        .converged("three live brokers on every node", |i| {
            i.live_brokers().count() == 3
        })
        .await;
    let before = cluster.node(leader).metrics().await.last_log_index;
    // Three session timeouts (2 s each) of 200 ms heartbeats: 90 heartbeats in all.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let image = cluster.node(leader).image();
    assert_eq!(image.live_brokers().count(), 3, "{:?}", image.brokers());
    let after = cluster.node(leader).metrics().await.last_log_index;
    let grew = after.unwrap_or(0) - before.unwrap_or(0);
    assert!(
        grew <= 3,
        "the metadata log grew by {grew} entries while brokers only heartbeated"
    );
    for m in cluster.members.values() {
        let session = m.session.as_ref().expect("broker session");
        assert!(session.lease_valid(), "every heartbeat is acknowledged");
    }

    // A broker that stops heartbeating (its process hangs) is fenced after its session.
    let silent = follower_of(&cluster, leader);
    let session = cluster
        .members
        .get_mut(&silent)
        .and_then(|m| m.session.take())
        .expect("session");
    session.stop(false).await;
    cluster
        .converged("the silent broker fenced", |i| {
            i.broker(silent as i32).is_some_and(|b| b.fenced)
        })
        .await;
}
