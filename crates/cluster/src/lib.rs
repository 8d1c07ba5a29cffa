#![warn(missing_docs)]
//! spate's metadata quorum: KRaft's combined mode on openraft.
//!
//! Every node is a broker and a voter. Layers, bottom up:
//! - [`metadata`]: the pure, deterministic state machine (brokers, topics, partitions, ISR,
//!   producer-id blocks) and the commands that change it;
//! - [`controller`]: pure decisions the Raft leader takes (placement, liveness, elections);
//! - [`replication`]: the pure ISR core of one partition (high watermark, ISR changes,
//!   acks=all, divergence after a leader change);
//! - [`raft`]: the openraft type config and the on-disk log and state-machine storage;
//! - [`network`]: the quorum's RPCs (length-prefixed frames) and their server;
//! - [`transport`]: inter-node connections, plain or mutual TLS, shared by the quorum and
//!   the Kafka requests brokers send each other;
//! - [`node`]: [`node::MetadataNode`], which wires it all and is what a broker uses.

pub mod controller;
pub mod heartbeat;
pub mod membership;
pub mod metadata;
pub mod network;
pub mod node;
pub mod pre_vote;
pub mod raft;
pub mod reassignment;
pub mod replication;
pub mod transport;
