//! Shared harness for the multi-node tests: real `MetadataNode`s on loopback TCP ports with
//! temp data dirs, and polling with deadlines instead of sleeps.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use spate_cluster::metadata::MetadataImage;
use spate_cluster::node::{BrokerInfo, BrokerSession, MetadataNode, NodeConfig, RaftTimings};
use tempfile::TempDir;
use tokio::net::TcpListener;

pub const STEP_DEADLINE: Duration = Duration::from_secs(20);
pub const HEARTBEAT: Duration = Duration::from_millis(200);

/// Polls `check` every 50 ms until it returns `Some`, or panics after `STEP_DEADLINE`.
pub async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + STEP_DEADLINE;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub struct Member {
    pub node: MetadataNode,
    pub session: Option<BrokerSession>,
}

pub struct Cluster {
    pub peers: BTreeMap<u64, String>,
    pub dirs: BTreeMap<u64, TempDir>,
    pub members: BTreeMap<u64, Member>,
    /// Run a broker session (registration + heartbeats) on every node.
    pub with_brokers: bool,
    /// Applied to every node's configuration.
    pub tweak: fn(&mut NodeConfig),
}

impl Cluster {
    fn config(&self, id: u64, listen: SocketAddr) -> NodeConfig {
        let mut config = NodeConfig::new(
            id,
            self.peers.clone(),
            listen,
            self.dirs[&id].path().to_path_buf(),
        )
        .unwrap();
        // Fast, but not so fast that a busy 2-core machine triggers spurious elections.
        config.timings = RaftTimings {
            heartbeat_ms: 100,
            election_min_ms: 500,
            election_max_ms: 1000,
        };
        config.session_timeout = Duration::from_secs(2);
        config.controller_interval = Duration::from_millis(100);
        config.propose_timeout = Duration::from_secs(10);
        (self.tweak)(&mut config);
        config
    }

    pub async fn start_member(&mut self, id: u64, listener: TcpListener) {
        let addr = listener.local_addr().unwrap();
        let node = MetadataNode::start_with_listener(self.config(id, addr), listener)
            .await
            .unwrap();
        let session = self.with_brokers.then(|| {
            node.start_broker_session(
                BrokerInfo {
                    kafka_host: "127.0.0.1".to_owned(),
                    kafka_port: 19092 + id as u16,
                    rack: None,
                    http_addr: None,
                    listeners: vec![],
                },
                HEARTBEAT,
            )
        });
        self.members.insert(id, Member { node, session });
    }

    pub async fn start(with_brokers: bool, tweak: fn(&mut NodeConfig)) -> Cluster {
        let mut listeners = BTreeMap::new();
        for id in 1..=3u64 {
            listeners.insert(id, TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let peers = listeners
            .iter()
            .map(|(&id, l)| (id, l.local_addr().unwrap().to_string()))
            .collect();
        let mut cluster = Cluster {
            peers,
            dirs: (1..=3)
                .map(|id| (id, tempfile::tempdir().unwrap()))
                .collect(),
            members: BTreeMap::new(),
            with_brokers,
            tweak,
        };
        for (id, listener) in listeners {
            cluster.start_member(id, listener).await;
        }
        cluster
    }

    pub fn node(&self, id: u64) -> &MetadataNode {
        &self.members[&id].node
    }

    /// The leader every running node agrees on.
    pub async fn agreed_leader(&self) -> u64 {
        eventually("all running nodes to agree on a leader", || {
            let leaders: BTreeSet<Option<u64>> =
                self.members.values().map(|m| m.node.leader_id()).collect();
            match leaders.into_iter().collect::<Vec<_>>().as_slice() {
                [Some(l)] if self.members.contains_key(l) && self.node(*l).is_leader() => Some(*l),
                _ => None,
            }
        })
        .await
    }

    /// The image once every running node has applied the same one and `ok` holds for it.
    pub async fn converged(
        &self,
        what: &str,
        ok: impl Fn(&MetadataImage) -> bool,
    ) -> Arc<MetadataImage> {
        eventually(what, || {
            let images: Vec<Arc<MetadataImage>> =
                self.members.values().map(|m| m.node.image()).collect();
            let first = images[0].clone();
            (images.iter().all(|i| **i == *first) && ok(&first)).then_some(first)
        })
        .await
    }

    pub async fn stop(&mut self, id: u64) {
        let member = self.members.remove(&id).unwrap();
        if let Some(session) = member.session {
            session.stop(false).await;
        }
        member.node.shutdown().await;
    }
}

pub fn follower_of(cluster: &Cluster, leader: u64) -> u64 {
    *cluster.members.keys().find(|&&id| id != leader).unwrap()
}

/// Runs a test scenario with logs going to the test output (RUST_LOG), bounded in time.
pub async fn run_bounded(scenario: impl std::future::Future<Output = ()>) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    tokio::time::timeout(std::time::Duration::from_secs(120), scenario)
        .await
        .expect("the scenario took too long");
}
