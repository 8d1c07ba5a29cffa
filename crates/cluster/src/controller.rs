//! Pure decisions of the active controller (the Raft leader): where replicas go, which
//! brokers are dead, and who leads a partition when its leader goes away.
//!
//! Everything here reads a [`MetadataImage`] (plus, for liveness, a [`LivenessTracker`] and
//! the current time as an argument) and returns the [`MetadataCommand`]s to propose. Nothing
//! is applied here: the commands go through Raft like any other, and each carries the
//! partition/broker epochs it was decided on, so a decision taken on a stale image is refused
//! on apply instead of undoing a newer change.

use std::collections::{BTreeMap, BTreeSet};

use uuid::Uuid;

use crate::metadata::{
    validate_topic_name, BrokerId, CommandError, MetadataCommand, MetadataImage,
};

/// Replicas for `partitions` new partitions with `replication_factor` replicas each, spread
/// over the live (registered, unfenced) brokers.
///
/// Placement is greedy on load, counting what the image already holds: each new partition's
/// preferred leader is the live broker leading the fewest partitions (then holding the fewest
/// replicas), and its followers are the least-loaded other brokers, taken in ring order after
/// the leader. With equal loads this yields Kafka's familiar `[1,2,3] [2,3,1] [3,1,2]`.
pub fn assign_replicas(
    image: &MetadataImage,
    partitions: i32,
    replication_factor: i16,
) -> Result<Vec<Vec<BrokerId>>, CommandError> {
    // A broker being decommissioned gets nothing new.
    let live: Vec<BrokerId> = image.placeable_brokers().collect();
    if partitions < 1 {
        return Err(CommandError::InvalidPartitions {
            reason: format!("{partitions} partitions requested, at least 1 is needed"),
        });
    }
    let rf = usize::try_from(replication_factor).unwrap_or(0);
    if rf < 1 || rf > live.len() {
        return Err(CommandError::InvalidReplicationFactor {
            requested: i32::from(replication_factor),
            available: live.len(),
        });
    }
    let mut leaders: BTreeMap<BrokerId, usize> = live.iter().map(|&b| (b, 0)).collect();
    let mut replicas: BTreeMap<BrokerId, usize> = leaders.clone();
    for topic in image.topics().values() {
        for p in &topic.partitions {
            if let Some(n) = p.replicas.first().and_then(|b| leaders.get_mut(b)) {
                *n += 1;
            }
            for b in &p.replicas {
                if let Some(n) = replicas.get_mut(b) {
                    *n += 1;
                }
            }
        }
    }
    let load = |map: &BTreeMap<BrokerId, usize>, b: BrokerId| map.get(&b).copied().unwrap_or(0);
    let mut out = Vec::with_capacity(usize::try_from(partitions).unwrap_or(0));
    for _ in 0..partitions {
        // `live` is non-empty because rf >= 1 and rf <= live.len().
        let Some(&leader) = live
            .iter()
            .min_by_key(|&&b| (load(&leaders, b), load(&replicas, b), b))
        else {
            break;
        };
        let leader_pos = live.iter().position(|&b| b == leader).unwrap_or(0);
        let mut followers: Vec<(usize, usize, BrokerId)> = live
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b != leader)
            .map(|(pos, &b)| {
                let ring = (pos + live.len() - leader_pos) % live.len();
                (load(&replicas, b), ring, b)
            })
            .collect();
        followers.sort_unstable();
        let mut assignment = Vec::with_capacity(rf);
        assignment.push(leader);
        assignment.extend(followers.iter().take(rf - 1).map(|&(_, _, b)| b));
        *leaders.entry(leader).or_default() += 1;
        for &b in &assignment {
            *replicas.entry(b).or_default() += 1;
        }
        out.push(assignment);
    }
    Ok(out)
}

/// The command creating topic `name` with a placement from [`assign_replicas`].
pub fn create_topic_command(
    image: &MetadataImage,
    name: &str,
    topic_id: Uuid,
    partitions: i32,
    replication_factor: i16,
    configs: BTreeMap<String, String>,
) -> Result<MetadataCommand, CommandError> {
    validate_topic_name(name)?;
    if image.topic(name).is_some() {
        return Err(CommandError::TopicAlreadyExists {
            name: name.to_owned(),
        });
    }
    let assignment = assign_replicas(image, partitions, replication_factor)?;
    Ok(MetadataCommand::CreateTopic {
        name: name.to_owned(),
        topic_id,
        configs,
        assignment,
    })
}

/// The command growing topic `name` to `new_total` partitions, with the topic's replication
/// factor.
pub fn create_partitions_command(
    image: &MetadataImage,
    name: &str,
    new_total: i32,
) -> Result<MetadataCommand, CommandError> {
    let topic = image
        .topic(name)
        .ok_or_else(|| CommandError::UnknownTopic {
            name: name.to_owned(),
        })?;
    let current = i32::try_from(topic.partitions.len()).unwrap_or(i32::MAX);
    if new_total <= current {
        return Err(CommandError::InvalidPartitions {
            reason: format!(
                "topic {name:?} has {current} partitions; the new count {new_total} must be larger"
            ),
        });
    }
    let rf = topic.partitions.first().map_or(0, |p| p.replicas.len());
    let rf = i16::try_from(rf).unwrap_or(i16::MAX);
    let assignment = assign_replicas(image, new_total - current, rf)?;
    Ok(MetadataCommand::CreatePartitions {
        name: name.to_owned(),
        assignment,
    })
}

/// What the controller has seen of one broker's heartbeats.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    epoch: i64,
    heartbeat_count: u64,
    /// Heartbeats of this registration received as messages (see `heartbeat::Heartbeats`).
    messages: u64,
    first_seen_ms: u64,
    changed_ms: Option<u64>,
    /// Its process is known to be gone (its port refuses connections): expired without
    /// waiting for the session timeout, until a heartbeat shows otherwise.
    down: bool,
}

/// The active controller's view of broker liveness, built from heartbeats as they appear in
/// applied images.
///
/// Times are the controller's own monotonic clock (passed in): a broker is alive while its
/// heartbeat count keeps changing, so liveness never compares timestamps written by different
/// machines. A new controller starts with an empty tracker, which gives every broker a full
/// session timeout of grace from the controller's first observation.
#[derive(Clone, Debug, Default)]
pub struct LivenessTracker {
    brokers: BTreeMap<BrokerId, Seen>,
}

impl LivenessTracker {
    /// An empty tracker (for a controller that just became active).
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the heartbeat counters of `image` as seen at `now_ms`.
    pub fn observe(&mut self, image: &MetadataImage, now_ms: u64) {
        self.brokers.retain(|id, _| image.broker(*id).is_some());
        for b in image.brokers().values() {
            match self.brokers.get_mut(&b.id) {
                Some(seen) if seen.epoch == b.epoch => {
                    if seen.heartbeat_count != b.heartbeat_count {
                        seen.heartbeat_count = b.heartbeat_count;
                        seen.changed_ms = Some(now_ms);
                        seen.down = false;
                    }
                }
                previous => {
                    // First sight of this registration. A registration that replaced one we
                    // were tracking is itself proof of life; one merely found in the image at
                    // start-up is only given grace.
                    let changed_ms = previous.map(|_| now_ms);
                    self.brokers.insert(
                        b.id,
                        Seen {
                            epoch: b.epoch,
                            heartbeat_count: b.heartbeat_count,
                            messages: 0,
                            first_seen_ms: now_ms,
                            changed_ms,
                            down: false,
                        },
                    );
                }
            }
        }
    }

    /// Records heartbeats received as messages (`broker -> (registration epoch, count)`) as
    /// seen at `now_ms`: a count that moved for the registration the tracker knows is a sign
    /// of life, like a heartbeat in the image.
    pub fn observe_heartbeats(&mut self, beats: &BTreeMap<BrokerId, (i64, u64)>, now_ms: u64) {
        for (id, &(epoch, count)) in beats {
            if let Some(seen) = self.brokers.get_mut(id) {
                if seen.epoch == epoch && seen.messages != count {
                    seen.messages = count;
                    seen.changed_ms = Some(now_ms);
                    seen.down = false;
                }
            }
        }
    }

    /// Whether `broker` showed no sign of life for longer than `session_timeout_ms`, or is
    /// known to be down ([`LivenessTracker::mark_down`]). Unknown brokers are not expired:
    /// the tracker has not had a chance to watch them.
    pub fn is_expired(&self, broker: BrokerId, now_ms: u64, session_timeout_ms: u64) -> bool {
        self.brokers.get(&broker).is_some_and(|s| {
            let last = s.changed_ms.unwrap_or(s.first_seen_ms);
            s.down || now_ms.saturating_sub(last) > session_timeout_ms
        })
    }

    /// The broker's process is gone (its inter-node port refuses connections): fence it now
    /// rather than after the session timeout. Fencing a live broker by mistake costs only a
    /// leader move, never data, so hard evidence is enough. A later heartbeat of the same
    /// registration, or a new registration, clears it.
    ///
    /// `refusing_ms` is how long the refusals have lasted as of `now_ms`: a broker that showed
    /// a sign of life since they began is not down (the refusals are stale: a connection that
    /// is never retried keeps its last answer), and `false` says so, so the caller can forget
    /// them instead of fencing and unfencing the broker on every pass.
    pub fn mark_down(&mut self, broker: BrokerId, refusing_ms: u64, now_ms: u64) -> bool {
        let began = now_ms.saturating_sub(refusing_ms);
        match self.brokers.get_mut(&broker) {
            Some(s) if s.changed_ms.is_some_and(|alive| alive >= began) => false,
            Some(s) => {
                s.down = true;
                true
            }
            None => true,
        }
    }

    /// Whether a heartbeat of `broker` was seen within `session_timeout_ms` by this tracker
    /// (grace alone does not count: it is what unfencing requires).
    pub fn heartbeat_is_fresh(
        &self,
        broker: BrokerId,
        now_ms: u64,
        session_timeout_ms: u64,
    ) -> bool {
        // A broker known down is not fresh whatever its last heartbeat: unfencing it would
        // undo the fence on the next pass, and the two would alternate until the session
        // timeout ran out.
        self.brokers.get(&broker).is_some_and(|s| {
            !s.down
                && s.changed_ms
                    .is_some_and(|c| now_ms.saturating_sub(c) <= session_timeout_ms)
        })
    }
}

/// Fencing `broker` and everything that must change with it: partitions it led get a new
/// leader from their ISR (or go leaderless), and it leaves every ISR it was in, except as the
/// last member, where it stays so that it is the one elected when it returns.
///
/// Empty when the broker is unknown or already fenced.
pub fn fence_broker_commands(image: &MetadataImage, broker: BrokerId) -> Vec<MetadataCommand> {
    let Some(reg) = image.broker(broker).filter(|b| !b.fenced) else {
        return Vec::new();
    };
    let fence = MetadataCommand::FenceBroker {
        broker_id: broker,
        broker_epoch: reg.epoch,
    };
    let mut view = image.clone();
    if view.apply(&fence).is_err() {
        return Vec::new();
    }
    let mut cmds = vec![fence];
    for topic in view.topics().values() {
        for (index, p) in topic.partitions.iter().enumerate() {
            if !p.isr.contains(&broker) {
                continue;
            }
            let Ok(partition) = i32::try_from(index) else {
                continue;
            };
            match p.leader {
                Some(l) if l != broker && view.is_live(l) => {
                    // The leader stays; the dead follower leaves the ISR now rather than after
                    // the leader's lag timeout, so acks=all does not wait for it.
                    let isr: Vec<BrokerId> =
                        p.isr.iter().copied().filter(|&b| b != broker).collect();
                    cmds.push(MetadataCommand::AlterIsr {
                        topic: topic.name.clone(),
                        partition,
                        leader: l,
                        leader_epoch: p.leader_epoch,
                        partition_epoch: p.partition_epoch,
                        isr,
                    });
                }
                _ => {
                    if let Some(cmd) = election(&view, &topic.name, partition, p) {
                        cmds.push(cmd);
                    }
                }
            }
        }
    }
    cmds
}

/// The leader change a partition needs, if its leader is missing or not live: the first
/// replica (in preference order) that is in the ISR and live leads, and dead members leave
/// the ISR. With no live ISR member the partition goes leaderless and keeps its ISR: an
/// out-of-sync replica is never elected (unclean election is off).
fn election(
    image: &MetadataImage,
    topic: &str,
    partition: i32,
    p: &crate::metadata::PartitionState,
) -> Option<MetadataCommand> {
    if p.leader.is_some_and(|l| image.is_live(l)) {
        return None;
    }
    let eligible = |b: &BrokerId| p.isr.contains(b) && image.is_live(*b);
    // One with room for the writes first: a broker with a full disk refuses produce.
    let candidate = p
        .replicas
        .iter()
        .copied()
        .find(|b| eligible(b) && !disk_full(image, *b))
        .or_else(|| p.replicas.iter().copied().find(eligible));
    match candidate {
        Some(new_leader) => Some(MetadataCommand::ChangeLeader {
            topic: topic.to_owned(),
            partition,
            partition_epoch: p.partition_epoch,
            leader: Some(new_leader),
            isr: p
                .isr
                .iter()
                .copied()
                .filter(|&b| image.is_live(b))
                .collect(),
        }),
        None if p.leader.is_some() => Some(MetadataCommand::ChangeLeader {
            topic: topic.to_owned(),
            partition,
            partition_epoch: p.partition_epoch,
            leader: None,
            isr: p.isr.clone(),
        }),
        None => None,
    }
}

/// Leader changes for every partition whose leader is missing or fenced.
pub fn elect_leaders(image: &MetadataImage) -> Vec<MetadataCommand> {
    let mut cmds = Vec::new();
    for topic in image.topics().values() {
        for (index, p) in topic.partitions.iter().enumerate() {
            let Ok(partition) = i32::try_from(index) else {
                continue;
            };
            if let Some(cmd) = election(image, &topic.name, partition, p) {
                cmds.push(cmd);
            }
        }
    }
    cmds
}

/// Whether broker `id` reported its data dir below its free-space watermark.
fn disk_full(image: &MetadataImage, id: BrokerId) -> bool {
    image.broker(id).is_some_and(|b| b.disk_full)
}

/// Leader changes for every partition led by a live broker whose disk is full, to the first
/// in-sync, live replica (in preference order) with space: a full leader refuses every
/// produce, an in-sync replica with room takes them. Partitions with no such replica keep
/// their leader (refusing until space is freed).
pub fn move_leaders_off_full_disks(image: &MetadataImage) -> Vec<MetadataCommand> {
    let mut cmds = Vec::new();
    for (topic, partition, p) in image.partitions_iter() {
        let Some(leader) = p.leader else { continue };
        if !image.is_live(leader) || !disk_full(image, leader) {
            continue;
        }
        let with_space = p.replicas.iter().copied().find(|&b| {
            b != leader
                && p.isr.contains(&b)
                && image.is_live(b)
                && !disk_full(image, b)
                && !image.broker(b).is_some_and(|r| r.shutting_down)
        });
        if let Some(new_leader) = with_space {
            cmds.push(MetadataCommand::ChangeLeader {
                topic: topic.to_owned(),
                partition,
                partition_epoch: p.partition_epoch,
                leader: Some(new_leader),
                isr: p.isr.clone(),
            });
        }
    }
    cmds
}

/// What a controller pass does besides liveness and elections.
#[derive(Clone, Copy, Debug, Default)]
pub struct PassOptions {
    /// Move leaderships back to preferred replicas past this imbalance (percent); `None`
    /// when automatic rebalancing is off or not due in this pass.
    pub rebalance_leaders: Option<u32>,
}

/// One controller pass: fence brokers that stopped heartbeating (or asked for a controlled
/// shutdown), unfence brokers that heartbeat again, elect leaders where needed, move
/// leaderships off brokers whose disk is full to in-sync replicas with space, complete
/// reassignments whose new replicas are in sync, move replicas off brokers being
/// decommissioned and, when due, move leaderships back to preferred replicas.
///
/// The commands are meant to be proposed together as one [`MetadataCommand::Batch`]; each was
/// checked to apply on top of the previous ones. A returning broker is only unfenced: it
/// rejoins an ISR when that partition's leader adds it, except where it was the last ISR
/// member of a leaderless partition, which it then leads.
pub fn reconcile(
    image: &MetadataImage,
    tracker: &LivenessTracker,
    now_ms: u64,
    session_timeout_ms: u64,
    options: PassOptions,
) -> Vec<MetadataCommand> {
    let mut scratch = image.clone();
    let mut cmds = Vec::new();
    let mut push = |scratch: &mut MetadataImage, cmd: MetadataCommand| {
        // A command that does not apply here would make the whole batch fail: drop it and
        // let the next pass decide again on a newer image.
        if scratch.apply(&cmd).is_ok() {
            cmds.push(cmd);
        }
    };
    let to_fence: Vec<BrokerId> = image
        .live_brokers()
        .filter(|b| b.shutting_down || tracker.is_expired(b.id, now_ms, session_timeout_ms))
        .map(|b| b.id)
        .collect();
    for id in to_fence {
        for cmd in fence_broker_commands(&scratch, id) {
            push(&mut scratch, cmd);
        }
    }
    let to_unfence: Vec<(BrokerId, i64)> = image
        .brokers()
        .values()
        .filter(|b| {
            b.fenced
                && !b.shutting_down
                && tracker.heartbeat_is_fresh(b.id, now_ms, session_timeout_ms)
        })
        .map(|b| (b.id, b.epoch))
        .collect();
    for (broker_id, broker_epoch) in to_unfence {
        push(
            &mut scratch,
            MetadataCommand::UnfenceBroker {
                broker_id,
                broker_epoch,
            },
        );
    }
    for cmd in elect_leaders(&scratch) {
        push(&mut scratch, cmd);
    }
    for cmd in move_leaders_off_full_disks(&scratch) {
        push(&mut scratch, cmd);
    }
    for cmd in crate::reassignment::complete_reassignments(&scratch) {
        push(&mut scratch, cmd);
    }
    for cmd in crate::reassignment::decommission_moves(&scratch) {
        push(&mut scratch, cmd);
    }
    if let Some(percent) = options.rebalance_leaders {
        for cmd in crate::reassignment::preferred_leader_elections(&scratch, percent) {
            push(&mut scratch, cmd);
        }
    }
    cmds
}

/// Brokers that hold a replica of some partition but are not live: what "offline replicas"
/// in a Metadata response are made of.
pub fn offline_replicas(image: &MetadataImage, replicas: &[BrokerId]) -> Vec<BrokerId> {
    let mut seen = BTreeSet::new();
    replicas
        .iter()
        .copied()
        .filter(|b| !image.is_live(*b) && seen.insert(*b))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::metadata::CommandOutcome;

    const TIMEOUT: u64 = 9_000;

    /// Registration of broker `id` by process `incarnation`, on test addresses.
    pub(crate) fn register_command(id: BrokerId, incarnation: u128) -> MetadataCommand {
        MetadataCommand::RegisterBroker {
            broker_id: id,
            incarnation: Uuid::from_u128(incarnation),
            inter_node_addr: format!("127.0.0.1:{}", 9100 + id),
            kafka_host: "127.0.0.1".to_owned(),
            kafka_port: 9092,
            rack: None,
            http_addr: None,
            now_ms: 0,
            listeners: vec![],
        }
    }

    /// An image with brokers `ids` registered and live.
    pub(crate) fn image_with_brokers(ids: &[BrokerId]) -> MetadataImage {
        let mut image = MetadataImage::new();
        for &id in ids {
            image.apply(&register_command(id, id as u128)).unwrap();
        }
        image
    }

    fn create(image: &mut MetadataImage, name: &str, partitions: i32, rf: i16) {
        let cmd = create_topic_command(
            image,
            name,
            Uuid::from_u128(name.len() as u128 + 1000 * partitions as u128 + 7),
            partitions,
            rf,
            BTreeMap::new(),
        )
        .unwrap();
        image.apply(&cmd).unwrap();
    }

    fn apply_all(image: &mut MetadataImage, cmds: Vec<MetadataCommand>) {
        match image.apply(&MetadataCommand::Batch(cmds)) {
            Ok(CommandOutcome::Batch(_)) => {}
            other => panic!("batch did not apply: {other:?}"),
        }
    }

    fn heartbeat(image: &mut MetadataImage, id: BrokerId, now_ms: u64) {
        let broker_epoch = image.broker(id).unwrap().epoch;
        image
            .apply(&MetadataCommand::BrokerHeartbeat {
                broker_id: id,
                broker_epoch,
                now_ms,
                shutting_down: false,
            })
            .unwrap();
    }

    fn fence(image: &mut MetadataImage, id: BrokerId) {
        let cmds = fence_broker_commands(image, id);
        apply_all(image, cmds);
    }

    fn count_leaders(image: &MetadataImage) -> BTreeMap<BrokerId, usize> {
        let mut out = BTreeMap::new();
        for t in image.topics().values() {
            for p in &t.partitions {
                *out.entry(p.replicas[0]).or_default() += 1;
            }
        }
        out
    }

    fn count_replicas(image: &MetadataImage) -> BTreeMap<BrokerId, usize> {
        let mut out = BTreeMap::new();
        for t in image.topics().values() {
            for p in &t.partitions {
                for &b in &p.replicas {
                    *out.entry(b).or_default() += 1;
                }
            }
        }
        out
    }

    #[test]
    fn placement_spreads_preferred_leaders_over_all_brokers() {
        let image = image_with_brokers(&[1, 2, 3]);
        let a = assign_replicas(&image, 3, 3).unwrap();
        assert_eq!(a, vec![vec![1, 2, 3], vec![2, 3, 1], vec![3, 1, 2]]);
    }

    #[test]
    fn placement_spreads_replicas_evenly() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        create(&mut image, "t", 6, 2);
        assert_eq!(
            count_leaders(&image),
            BTreeMap::from([(1, 2), (2, 2), (3, 2)])
        );
        assert_eq!(
            count_replicas(&image),
            BTreeMap::from([(1, 4), (2, 4), (3, 4)])
        );
    }

    #[test]
    fn placement_balances_against_existing_topics() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        create(&mut image, "a", 1, 1);
        create(&mut image, "bb", 2, 1);
        assert_eq!(
            count_leaders(&image),
            BTreeMap::from([(1, 1), (2, 1), (3, 1)])
        );
    }

    #[test]
    fn placement_skips_fenced_brokers() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        fence(&mut image, 2);
        let a = assign_replicas(&image, 4, 2).unwrap();
        assert!(a.iter().flatten().all(|&b| b != 2), "{a:?}");
    }

    #[test]
    fn placement_with_replication_factor_above_live_brokers_is_refused() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        fence(&mut image, 3);
        let err = assign_replicas(&image, 1, 3).unwrap_err();
        assert_eq!(
            err,
            CommandError::InvalidReplicationFactor {
                requested: 3,
                available: 2
            }
        );
        assert_eq!(err.kafka_error_code(), 38);
        assert_eq!(
            assign_replicas(&image, 1, 0)
                .unwrap_err()
                .kafka_error_code(),
            38
        );
        assert_eq!(
            assign_replicas(&image, 0, 1)
                .unwrap_err()
                .kafka_error_code(),
            37
        );
        let empty = MetadataImage::new();
        assert_eq!(
            assign_replicas(&empty, 1, 1)
                .unwrap_err()
                .kafka_error_code(),
            38
        );
    }

    #[test]
    fn create_topic_command_refuses_an_existing_topic_or_bad_name() {
        let mut image = image_with_brokers(&[1]);
        create(&mut image, "t", 1, 1);
        let err = create_topic_command(&image, "t", Uuid::from_u128(5), 1, 1, BTreeMap::new())
            .unwrap_err();
        assert_eq!(err.kafka_error_code(), 36);
        let err = create_topic_command(&image, "a b", Uuid::from_u128(5), 1, 1, BTreeMap::new())
            .unwrap_err();
        assert_eq!(err.kafka_error_code(), 17);
    }

    #[test]
    fn create_partitions_command_keeps_replication_factor_and_refuses_shrinking() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        create(&mut image, "t", 1, 2);
        let cmd = create_partitions_command(&image, "t", 3).unwrap();
        image.apply(&cmd).unwrap();
        let t = image.topic("t").unwrap();
        assert_eq!(t.partitions.len(), 3);
        assert!(t.partitions.iter().all(|p| p.replicas.len() == 2));
        assert_eq!(
            create_partitions_command(&image, "t", 3)
                .unwrap_err()
                .kafka_error_code(),
            37
        );
        assert_eq!(
            create_partitions_command(&image, "x", 3)
                .unwrap_err()
                .kafka_error_code(),
            3
        );
    }

    #[test]
    fn broker_whose_heartbeat_stops_is_fenced_after_the_session_timeout() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        let mut tracker = LivenessTracker::new();
        tracker.observe(&image, 0);
        for now in [3_000, 6_000, 9_000] {
            heartbeat(&mut image, 1, now);
            heartbeat(&mut image, 2, now);
            tracker.observe(&image, now);
            assert!(reconcile(&image, &tracker, now, TIMEOUT, PassOptions::default()).is_empty());
        }
        heartbeat(&mut image, 1, 9_500);
        heartbeat(&mut image, 2, 9_500);
        tracker.observe(&image, 9_500);
        let cmds = reconcile(&image, &tracker, 9_500, TIMEOUT, PassOptions::default());
        assert_eq!(
            cmds,
            vec![MetadataCommand::FenceBroker {
                broker_id: 3,
                broker_epoch: 3
            }]
        );
    }

    #[test]
    fn a_broker_known_down_is_fenced_at_once_even_in_the_grace_of_a_new_controller() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        let mut tracker = LivenessTracker::new();
        tracker.observe(&image, 100_000);
        assert!(tracker.mark_down(3, 1_000, 100_000));
        let cmds = reconcile(&image, &tracker, 100_001, TIMEOUT, PassOptions::default());
        assert_eq!(
            cmds,
            vec![MetadataCommand::FenceBroker {
                broker_id: 3,
                broker_epoch: 3
            }]
        );
        // A heartbeat of the same registration shows it is alive after all.
        heartbeat(&mut image, 3, 100_002);
        tracker.observe(&image, 100_002);
        assert!(!tracker.is_expired(3, 100_003, TIMEOUT));
    }

    #[test]
    fn a_broker_fenced_as_down_is_not_unfenced_by_its_last_heartbeat() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        let mut tracker = LivenessTracker::new();
        tracker.observe(&image, 0);
        for id in [1, 2, 3] {
            heartbeat(&mut image, id, 5_000);
        }
        tracker.observe(&image, 5_000);
        // Killed right after that heartbeat: its port refuses from t=5_100, and it is fenced.
        assert!(tracker.mark_down(3, 100, 5_200));
        let fence = reconcile(&image, &tracker, 5_200, TIMEOUT, PassOptions::default());
        assert_eq!(fence.len(), 1);
        image.apply(&fence[0]).unwrap();
        // The next passes, within the session timeout of that heartbeat, leave it fenced.
        // Before, its heartbeat still counted as fresh: each pass unfenced it and the one
        // after fenced it again, every 500 ms until the session timeout ran out.
        for now in [5_700, 6_200, 5_000 + TIMEOUT] {
            assert!(!tracker.heartbeat_is_fresh(3, now, TIMEOUT));
            assert_eq!(
                reconcile(&image, &tracker, now, TIMEOUT, PassOptions::default()),
                vec![],
                "at {now}"
            );
        }
        // A new heartbeat of the same registration unfences it.
        heartbeat(&mut image, 3, 7_000);
        tracker.observe(&image, 7_000);
        assert!(matches!(
            reconcile(&image, &tracker, 7_000, TIMEOUT, PassOptions::default())[..],
            [MetadataCommand::UnfenceBroker { broker_id: 3, .. }]
        ));
    }

    #[test]
    fn refusals_older_than_a_heartbeat_do_not_fence_a_live_broker_again() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        let mut tracker = LivenessTracker::new();
        tracker.observe(&image, 0);
        heartbeat(&mut image, 3, 5_000);
        tracker.observe(&image, 5_000);
        // Its port refused connections from t=2_000 to now (t=6_000), but it heartbeated at
        // t=5_000: the refusals are stale, it stays live, and the caller forgets them.
        assert!(!tracker.mark_down(3, 4_000, 6_000));
        assert!(reconcile(&image, &tracker, 6_000, TIMEOUT, PassOptions::default()).is_empty());
        // Refusals that began after its last heartbeat still fence it at once.
        assert!(tracker.mark_down(3, 500, 6_000));
        assert_eq!(
            reconcile(&image, &tracker, 6_000, TIMEOUT, PassOptions::default()).len(),
            1
        );
    }

    #[test]
    fn new_controller_gives_every_broker_a_full_session_of_grace() {
        let image = image_with_brokers(&[1, 2]);
        let mut tracker = LivenessTracker::new();
        // A controller that takes over at t=100_000 must not fence brokers whose last
        // heartbeat it simply never saw.
        tracker.observe(&image, 100_000);
        assert!(reconcile(
            &image,
            &tracker,
            100_000 + TIMEOUT,
            TIMEOUT,
            PassOptions::default()
        )
        .is_empty());
        assert_eq!(
            reconcile(
                &image,
                &tracker,
                100_001 + TIMEOUT,
                TIMEOUT,
                PassOptions::default()
            )
            .len(),
            2
        );
    }

    #[test]
    fn heartbeats_received_as_messages_keep_a_broker_live_and_unfence_it() {
        let mut image = image_with_brokers(&[1, 2]);
        let mut tracker = LivenessTracker::new();
        tracker.observe(&image, 0);
        let epoch_of = |image: &MetadataImage, id| image.broker(id).unwrap().epoch;
        let (e1, e2) = (epoch_of(&image, 1), epoch_of(&image, 2));
        // Broker 1 heartbeats by message every second, broker 2 falls silent: only 2 is
        // fenced, though the image shows no heartbeat of either.
        for t in 1..=10u64 {
            let beats = BTreeMap::from([(1, (e1, t))]);
            tracker.observe_heartbeats(&beats, t * 1_000);
        }
        let cmds = reconcile(&image, &tracker, 10_000, TIMEOUT, PassOptions::default());
        assert_eq!(
            cmds,
            vec![MetadataCommand::FenceBroker {
                broker_id: 2,
                broker_epoch: e2
            }]
        );
        apply_all(&mut image, cmds);
        // A count for another (older) registration of 2 is no sign of life; its own is.
        tracker.observe_heartbeats(&BTreeMap::from([(2, (e2 - 1, 5))]), 11_000);
        assert!(reconcile(&image, &tracker, 11_000, TIMEOUT, PassOptions::default()).is_empty());
        tracker.observe_heartbeats(&BTreeMap::from([(2, (e2, 1))]), 12_000);
        assert_eq!(
            reconcile(&image, &tracker, 12_000, TIMEOUT, PassOptions::default()),
            vec![MetadataCommand::UnfenceBroker {
                broker_id: 2,
                broker_epoch: e2
            }]
        );
    }

    #[test]
    fn fenced_leader_is_replaced_from_the_isr_and_shrunk_out_of_it() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        create(&mut image, "t", 3, 3);
        fence(&mut image, 1);
        let p0 = image.partition("t", 0).unwrap();
        assert_eq!(p0.leader, Some(2));
        assert_eq!(p0.isr, vec![2, 3]);
        assert_eq!(p0.leader_epoch, 1);
        // Partitions 1 and 2 keep their leader; broker 1 leaves their ISR.
        for partition in [1, 2] {
            let p = image.partition("t", partition).unwrap();
            assert_eq!(p.leader_epoch, 0);
            assert!(!p.isr.contains(&1), "{p:?}");
        }
    }

    #[test]
    fn partition_with_no_live_isr_member_goes_leaderless_instead_of_electing_an_out_of_sync_replica(
    ) {
        let mut image = image_with_brokers(&[1, 2, 3]);
        create(&mut image, "t", 1, 3);
        // The leader shrank the ISR to itself: 2 and 3 are out of sync.
        image
            .apply(&MetadataCommand::AlterIsr {
                topic: "t".to_owned(),
                partition: 0,
                leader: 1,
                leader_epoch: 0,
                partition_epoch: 0,
                isr: vec![1],
            })
            .unwrap();
        fence(&mut image, 1);
        let p = image.partition("t", 0).unwrap();
        assert_eq!(p.leader, None);
        assert_eq!(p.isr, vec![1], "the last in-sync replica stays in the ISR");
        assert!(elect_leaders(&image).is_empty());
    }

    #[test]
    fn returning_broker_is_unfenced_but_stays_out_of_the_isr() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        create(&mut image, "t", 1, 3);
        let mut tracker = LivenessTracker::new();
        tracker.observe(&image, 0);
        heartbeat(&mut image, 2, 5_000);
        heartbeat(&mut image, 3, 5_000);
        tracker.observe(&image, 5_000);
        heartbeat(&mut image, 2, 10_000);
        heartbeat(&mut image, 3, 10_000);
        tracker.observe(&image, 10_000);
        let cmds = reconcile(&image, &tracker, 10_000, TIMEOUT, PassOptions::default());
        apply_all(&mut image, cmds);
        assert!(image.broker(1).unwrap().fenced);
        assert_eq!(image.partition("t", 0).unwrap().isr, vec![2, 3]);

        heartbeat(&mut image, 1, 11_000);
        heartbeat(&mut image, 2, 11_000);
        heartbeat(&mut image, 3, 11_000);
        tracker.observe(&image, 11_000);
        let cmds = reconcile(&image, &tracker, 11_000, TIMEOUT, PassOptions::default());
        assert_eq!(
            cmds,
            vec![MetadataCommand::UnfenceBroker {
                broker_id: 1,
                broker_epoch: 1
            }]
        );
        apply_all(&mut image, cmds);
        assert!(!image.broker(1).unwrap().fenced);
        let p = image.partition("t", 0).unwrap();
        assert_eq!(p.isr, vec![2, 3]);
        assert_eq!(p.leader, Some(2));
    }

    #[test]
    fn returning_last_isr_member_leads_its_leaderless_partition_again() {
        let mut image = image_with_brokers(&[1, 2]);
        create(&mut image, "t", 1, 2);
        image
            .apply(&MetadataCommand::AlterIsr {
                topic: "t".to_owned(),
                partition: 0,
                leader: 1,
                leader_epoch: 0,
                partition_epoch: 0,
                isr: vec![1],
            })
            .unwrap();
        fence(&mut image, 1);
        assert_eq!(image.partition("t", 0).unwrap().leader, None);
        let mut tracker = LivenessTracker::new();
        tracker.observe(&image, 0);
        heartbeat(&mut image, 1, 1_000);
        tracker.observe(&image, 1_000);
        let cmds = reconcile(&image, &tracker, 1_000, TIMEOUT, PassOptions::default());
        assert_eq!(cmds.len(), 2, "{cmds:?}");
        apply_all(&mut image, cmds);
        let p = image.partition("t", 0).unwrap();
        assert_eq!(p.leader, Some(1));
        assert_eq!(p.leader_epoch, 2);
    }

    #[test]
    fn controlled_shutdown_fences_the_broker_and_moves_its_leadership() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        create(&mut image, "t", 3, 3);
        let broker_epoch = image.broker(2).unwrap().epoch;
        image
            .apply(&MetadataCommand::BrokerHeartbeat {
                broker_id: 2,
                broker_epoch,
                now_ms: 1,
                shutting_down: true,
            })
            .unwrap();
        let mut tracker = LivenessTracker::new();
        tracker.observe(&image, 1);
        let cmds = reconcile(&image, &tracker, 1, TIMEOUT, PassOptions::default());
        apply_all(&mut image, cmds);
        assert!(image.broker(2).unwrap().fenced);
        for t in image.topics().values() {
            for p in &t.partitions {
                assert_ne!(p.leader, Some(2));
                assert!(!p.isr.contains(&2));
            }
        }
        // It is not unfenced while it keeps heartbeating with the shutdown flag.
        heartbeat_shutting_down(&mut image, 2, 2);
        tracker.observe(&image, 2);
        assert!(reconcile(&image, &tracker, 2, TIMEOUT, PassOptions::default()).is_empty());
    }

    fn set_disk_full(image: &mut MetadataImage, id: BrokerId, full: bool) {
        let broker_epoch = image.broker(id).unwrap().epoch;
        image
            .apply(&MetadataCommand::SetBrokerDiskFull {
                broker_id: id,
                broker_epoch,
                full,
            })
            .unwrap();
    }

    #[test]
    fn a_leader_whose_disk_is_full_hands_leadership_to_an_in_sync_replica_with_space() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        create(&mut image, "t", 3, 3);
        let mut tracker = LivenessTracker::new();
        tracker.observe(&image, 1);
        let before: Vec<_> = image.topics()["t"].partitions.clone();
        let full = before[0].leader.unwrap();
        set_disk_full(&mut image, full, true);
        let cmds = reconcile(&image, &tracker, 1, TIMEOUT, PassOptions::default());
        apply_all(&mut image, cmds);
        for (p, old) in image.topics()["t"].partitions.iter().zip(&before) {
            let leader = p.leader.unwrap();
            assert_ne!(leader, full, "the full broker still leads");
            assert!(!image.broker(leader).unwrap().disk_full);
            if old.leader == Some(full) {
                assert_eq!(p.leader_epoch, old.leader_epoch + 1);
                assert_eq!(p.isr, old.isr, "the ISR is the leader's business");
            } else {
                assert_eq!(p.leader, old.leader, "leaders with space stay");
            }
        }
        // Stable, and a leader rebalance does not move leadership back onto the full disk.
        let options = PassOptions {
            rebalance_leaders: Some(0),
        };
        assert!(reconcile(&image, &tracker, 1, TIMEOUT, options).is_empty());
        // Space back: the preferred leader gets its leaderships back.
        set_disk_full(&mut image, full, false);
        let cmds = reconcile(&image, &tracker, 1, TIMEOUT, options);
        apply_all(&mut image, cmds);
        for (p, old) in image.topics()["t"].partitions.iter().zip(&before) {
            assert_eq!(p.leader, old.leader);
        }
    }

    #[test]
    fn a_full_leader_keeps_leadership_when_no_in_sync_replica_has_space() {
        let mut image = image_with_brokers(&[1, 2]);
        create(&mut image, "t", 1, 2);
        let mut tracker = LivenessTracker::new();
        tracker.observe(&image, 1);
        set_disk_full(&mut image, 1, true);
        set_disk_full(&mut image, 2, true);
        assert!(reconcile(&image, &tracker, 1, TIMEOUT, PassOptions::default()).is_empty());
    }

    #[test]
    fn an_election_prefers_an_in_sync_replica_with_space() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        create(&mut image, "t", 1, 3);
        let p = image.topics()["t"].partitions[0].clone();
        let (leader, next, last) = (p.replicas[0], p.replicas[1], p.replicas[2]);
        set_disk_full(&mut image, next, true);
        let broker_epoch = image.broker(leader).unwrap().epoch;
        image
            .apply(&MetadataCommand::FenceBroker {
                broker_id: leader,
                broker_epoch,
            })
            .unwrap();
        let cmds = elect_leaders(&image);
        apply_all(&mut image, cmds);
        assert_eq!(image.topics()["t"].partitions[0].leader, Some(last));
    }

    fn heartbeat_shutting_down(image: &mut MetadataImage, id: BrokerId, now_ms: u64) {
        let broker_epoch = image.broker(id).unwrap().epoch;
        image
            .apply(&MetadataCommand::BrokerHeartbeat {
                broker_id: id,
                broker_epoch,
                now_ms,
                shutting_down: true,
            })
            .unwrap();
    }

    #[test]
    fn elect_leaders_fixes_partitions_led_by_a_broker_fenced_outside_the_controller() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        create(&mut image, "t", 1, 3);
        image
            .apply(&MetadataCommand::FenceBroker {
                broker_id: 1,
                broker_epoch: 1,
            })
            .unwrap();
        let cmds = elect_leaders(&image);
        apply_all(&mut image, cmds);
        let p = image.partition("t", 0).unwrap();
        assert_eq!(p.leader, Some(2));
        assert_eq!(p.isr, vec![2, 3]);
    }

    #[test]
    fn decision_on_a_stale_image_is_refused_on_apply() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        create(&mut image, "t", 1, 3);
        let decided_on = image.clone();
        image
            .apply(&MetadataCommand::AlterIsr {
                topic: "t".to_owned(),
                partition: 0,
                leader: 1,
                leader_epoch: 0,
                partition_epoch: 0,
                isr: vec![1, 2],
            })
            .unwrap();
        let cmds = fence_broker_commands(&decided_on, 1);
        let err = image.apply(&MetadataCommand::Batch(cmds)).unwrap_err();
        assert_eq!(err.kafka_error_code(), 95, "{err}");
        assert!(!image.broker(1).unwrap().fenced);
    }

    #[test]
    fn offline_replicas_lists_fenced_or_unknown_brokers() {
        let mut image = image_with_brokers(&[1, 2, 3]);
        fence(&mut image, 2);
        assert_eq!(offline_replicas(&image, &[1, 2, 3, 7]), vec![2, 7]);
    }
}
