//! From a metadata image to local state: topics, partitions and each partition's role.
//!
//! Runs on the blocking pool (it makes directories and fsyncs) after each image this node
//! applies. Every step is idempotent, so an image applied twice, or a newer one applied over
//! a half-applied older one, ends in the same place.

use std::sync::Arc;

use spate_cluster::metadata::{MetadataImage, TopicImage};

use super::{Cluster, Local};
use crate::groups::OFFSETS_LOG;
use crate::partition::{Partition, Role};
use crate::registry::Topic;
use crate::replica::{take_role, RoleChange, RoleContext};
use crate::topic_config::TopicConfig;

/// Hands each partition of internal topic `name` this node leads to `take_over` (index,
/// partition count, partition, leader epoch) and each other one to `step_down`; `false` when a
/// take-over failed (the image is applied again).
fn follow_internal_leaders(
    b: &Local,
    name: &str,
    take_over: impl Fn(usize, usize, Arc<Partition>, i32) -> Result<(), crate::BrokerError>,
    step_down: impl Fn(usize),
) -> bool {
    let Some(t) = b.topics.get(name) else {
        return true;
    };
    let count = t.partition_count().max(0) as usize;
    let mut complete = true;
    for index in 0..count {
        match t
            .partition(index as i32)
            .filter(|p| p.role() == Role::Leader)
        {
            Some(p) => {
                let epoch = p.leader_epoch();
                if let Err(e) = take_over(index, count, p, epoch) {
                    tracing::error!(topic = name, partition = index, error = %e, "cannot load the state of an internal partition this node leads; retrying");
                    complete = false;
                }
            }
            None => step_down(index),
        }
    }
    complete
}

/// Whether two images ask the same of local partitions: same topics (ids, configs,
/// assignments, leaders, epochs, ISRs) and same registrations (epochs, fencing). Heartbeat
/// counters and times, which change every second, do not count.
pub(super) fn same_for_replication(a: &MetadataImage, b: &MetadataImage) -> bool {
    // Topics both images share by pointer compare in O(1) each.
    a.topics() == b.topics() && same_registrations(a, b)
}

/// Same brokers with the same registration epochs and fencing.
fn same_registrations(a: &MetadataImage, b: &MetadataImage) -> bool {
    a.brokers().len() == b.brokers().len()
        && a.brokers()
            .values()
            .zip(b.brokers().values())
            .all(|(x, y)| x.id == y.id && x.epoch == y.epoch && x.fenced == y.fenced)
}

/// An image already applied in full, and whether this broker could lead then: topics it
/// shares with the next image (the same `Arc`) need no work if nothing about the brokers
/// changed either.
pub(super) struct Baseline {
    /// The image applied.
    pub image: std::sync::Arc<MetadataImage>,
    /// Whether this broker could lead when it was applied.
    pub may_lead: bool,
}

/// Applies `image` to the local registry and partition roles: every topic, or with a
/// `baseline` only the topics that changed since it (a change costs what it touches, not
/// the whole image). Returns whether every step succeeded (`false` after a full disk
/// creating a replica, a coordinator that could not load: the caller applies the image again,
/// in full, rather than take it as done) and whether this broker could lead.
pub(super) fn apply(
    cluster: &Cluster,
    image: &MetadataImage,
    baseline: Option<&Baseline>,
) -> (bool, bool) {
    let b = &cluster.local;
    let mut complete = true;
    let view = View {
        now: b.clock.monotonic_ms().max(0) as u64,
        fenced: Cluster::fenced(image),
        may_lead: cluster.registered_in(image) && cluster.lease_valid(),
        sync_acks: b.sync_acks,
    };
    let unchanged_brokers = baseline
        .filter(|base| base.may_lead == view.may_lead && same_registrations(&base.image, image));
    for t in image.topics().values() {
        let untouched = unchanged_brokers.is_some_and(|base| {
            base.image
                .topics()
                .get(&t.name)
                .is_some_and(|before| std::sync::Arc::ptr_eq(before, t))
        });
        if untouched {
            continue;
        }
        match ensure_topic(cluster, t) {
            Ok(local) => set_roles(cluster, &view, t, &local),
            Err(e) => {
                tracing::error!(topic = %t.name, error = %e, "cannot create the local replica of a topic; retrying");
                complete = false;
            }
        }
    }
    // Each node coordinates the groups of the offsets partitions it leads, and the
    // transactions of the transaction state partitions it leads (those that were ending there
    // get their markers written again).
    complete &= follow_internal_leaders(
        b,
        OFFSETS_LOG,
        |index, count, p, epoch| b.groups.take_over(index, count, p, epoch),
        |index| b.groups.step_down(index),
    );
    complete &= follow_internal_leaders(
        b,
        spate_txn::TXN_LOG,
        |index, count, p, epoch| b.txns.take_over(index, count, p, epoch),
        |index| b.txns.step_down(index),
    );
    b.txns.resume();
    // The share coordinators of the state partitions this node leads, and the share groups
    // of the offsets partitions it leads.
    complete &= follow_internal_leaders(
        b,
        crate::share::SHARE_STATE_LOG,
        |index, count, p, epoch| b.shares.coordinator().take_over(index, count, p, epoch),
        |index| b.shares.coordinator().step_down(index),
    );
    b.shares.retain_groups(|g| b.groups.is_coordinator(g));
    for local in b.topics.list() {
        let gone = image.topic(&local.name).is_none_or(|t| t.id != local.id);
        if gone {
            for p in local.partitions() {
                cluster.follows.unassign(&local.name, p.index);
            }
            match b.topics.delete(&local.name) {
                Ok(_) => {
                    tracing::info!(topic = %local.name, "deleted: the topic is gone from the cluster metadata")
                }
                Err(e) => {
                    tracing::warn!(topic = %local.name, error = %e, "cannot delete local topic; retrying");
                    complete = false;
                }
            }
        }
    }
    (complete, view.may_lead)
}

/// The partitions of `t` with a replica assigned to `me` (reassignment targets included).
fn assigned_to(t: &TopicImage, me: i32) -> std::collections::BTreeSet<i32> {
    t.partitions
        .iter()
        .enumerate()
        .filter(|(_, p)| p.replicas.contains(&me))
        .filter_map(|(i, _)| i32::try_from(i).ok())
        .collect()
}

/// The local topic matching `t` (same id, at least as many partitions, same configs,
/// replicas of exactly the partitions assigned here), creating or completing it as needed.
fn ensure_topic(cluster: &Cluster, t: &TopicImage) -> Result<std::sync::Arc<Topic>, String> {
    let b = &cluster.local;
    let config = TopicConfig::from_pairs(t.configs.iter().map(|(k, v)| (k.as_str(), Some(v.as_str()))))
        .unwrap_or_else(|e| {
            // The controller validates configs before they enter the log; an unknown key can
            // only come from a newer spate. Keep going with defaults rather than stall.
            tracing::warn!(topic = %t.name, error = %e, "topic config from the cluster not understood; using defaults");
            TopicConfig::default()
        });
    let count = i32::try_from(t.partitions.len()).map_err(|e| e.to_string())?;
    let local = match b.topics.get(&t.name) {
        Some(local) if local.id == t.id => local,
        Some(stale) => {
            // Same name, another topic: a deletion and re-creation this node missed.
            tracing::info!(topic = %t.name, old_id = %stale.id, new_id = %t.id, "replacing a deleted topic of the same name");
            b.topics.delete(&t.name).map_err(|e| e.to_string())?;
            create(b, t, count, config.clone())?
        }
        None => create(b, t, count, config.clone())?,
    };
    if local.partition_count() < count {
        b.topics
            .add_partitions(&local, count, false)
            .map_err(|e| e.to_string())?;
    }
    let hosted = assigned_to(t, cluster.broker_id);
    let dropping: Vec<i32> = local.hosted().difference(&hosted).copied().collect();
    // Stop fetching, and stop leading (waiting acks=all produces learn the leadership is
    // gone), before the replica's files go away.
    for &index in &dropping {
        cluster.follows.unassign(&t.name, index);
        if let Some(p) = local.partition(index) {
            p.set_role(Role::Follower, p.leader_epoch());
        }
    }
    for gone in b
        .topics
        .set_hosted(&local, &hosted)
        .map_err(|e| e.to_string())?
    {
        tracing::info!(topic = %t.name, partition = gone.index, "removed the local replica: no longer assigned here");
    }
    if local.config() != config {
        b.topics
            .set_config(&local, config)
            .map_err(|e| e.to_string())?;
    }
    Ok(local)
}

fn create(
    b: &Local,
    t: &TopicImage,
    count: i32,
    config: TopicConfig,
) -> Result<std::sync::Arc<Topic>, String> {
    // Replicas are added by `set_hosted` right after, so a creation and a later assignment
    // take the same path.
    match b
        .topics
        .create_hosting(&t.name, t.id, count, config, &Default::default())
    {
        Ok(topic) => {
            tracing::info!(topic = %t.name, id = %t.id, partitions = count, "created local part of topic");
            Ok(topic)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// While this broker leads at `epoch`, each fsync may commit records (see
/// `Partition::on_durable`).
fn watch_durability(p: std::sync::Arc<crate::partition::Partition>, epoch: i32) {
    let mut durable = p.durable_offset();
    tokio::spawn(async move {
        while durable.changed().await.is_ok() {
            if p.role() != Role::Leader || p.leader_epoch() != epoch {
                return;
            }
            p.on_durable();
        }
    });
}

/// What every partition's role is decided on, taken once per image.
struct View {
    now: u64,
    fenced: std::collections::BTreeSet<spate_cluster::metadata::BrokerId>,
    may_lead: bool,
    sync_acks: bool,
}

/// Sets each partition's role from the image: leader (with its ISR view), follower of the
/// leader (fetching), or idle follower (no leader, or not a replica here).
fn set_roles(cluster: &Cluster, view: &View, t: &TopicImage, local: &Topic) {
    let cx = RoleContext {
        me: cluster.broker_id,
        may_lead: view.may_lead,
        fenced: &view.fenced,
        now_ms: view.now,
        lag_time_max_ms: cluster.settings.replica_lag_time_max_ms,
        sync_acks: view.sync_acks,
    };
    for (index, ps) in t.partitions.iter().enumerate() {
        let Ok(index) = i32::try_from(index) else {
            continue;
        };
        let Some(p) = local.partition(index) else {
            continue;
        };
        let before = (p.role(), p.leader_epoch());
        let change = take_role(&p, ps, &cx);
        match change {
            RoleChange::Leads { new } => {
                cluster.follows.unassign(&t.name, index);
                if new {
                    tracing::info!(topic = %t.name, partition = index, epoch = ps.leader_epoch, isr = ?ps.isr, "leading");
                    if view.sync_acks {
                        watch_durability(p.clone(), ps.leader_epoch);
                    }
                }
            }
            RoleChange::Follows { leader, epoch } => {
                if before != (Role::Follower, epoch) {
                    tracing::info!(topic = %t.name, partition = index, leader, epoch, "following");
                }
                cluster
                    .follows
                    .assign(&cluster.me, &t.name, t.id, p, leader, epoch);
            }
            RoleChange::Idle => cluster.follows.unassign(&t.name, index),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_cluster::metadata::MetadataCommand;

    use crate::cluster::test_image::register;

    #[test]
    fn heartbeats_alone_do_not_call_for_a_reconcile_but_fencing_does() {
        let mut a = MetadataImage::new();
        register(&mut a, 1);
        register(&mut a, 2);
        let mut b = a.clone();
        b.apply(&MetadataCommand::BrokerHeartbeat {
            broker_id: 1,
            broker_epoch: 1,
            now_ms: 1_000,
            shutting_down: false,
        })
        .unwrap();
        assert_ne!(a, b);
        assert!(same_for_replication(&a, &b));
        b.apply(&MetadataCommand::FenceBroker {
            broker_id: 2,
            broker_epoch: 2,
        })
        .unwrap();
        assert!(!same_for_replication(&a, &b));
    }
}
