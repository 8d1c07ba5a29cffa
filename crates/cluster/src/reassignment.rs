//! Moving replicas: how the metadata image applies reassignments, unclean elections and
//! broker removal, and the pure plans the controller and the admin API derive from an image
//! (decommissioning moves, preferred-leader rebalancing, an even spread of replicas).
//!
//! A reassignment follows Kafka's KIP-455 shape: the replica set becomes target + (original
//! minus target) at once, so the new replicas start fetching; the controller completes it when
//! every target replica is in the ISR, and only then are the old replicas dropped. Nothing
//! here waits or does I/O: each step is a command applied through Raft, so a controller
//! failover in the middle of a move resumes from the image.

use std::collections::{BTreeMap, BTreeSet};

use crate::metadata::{
    check_partition_epoch, validate_config_keys, BrokerId, CommandError, CommandOutcome,
    CommandResult, MetadataCommand, MetadataImage, PartitionState,
};

impl MetadataImage {
    /// Brokers new replicas may be placed on: live and not being decommissioned.
    pub fn placeable_brokers(&self) -> impl Iterator<Item = BrokerId> + '_ {
        self.brokers
            .values()
            .filter(|b| !b.fenced && !b.decommissioning)
            .map(|b| b.id)
    }

    /// Every partition with a reassignment in progress, as `(topic, partition, state)`.
    pub fn reassignments(&self) -> impl Iterator<Item = (&str, i32, &PartitionState)> {
        self.partitions_iter()
            .filter(|(_, _, p)| p.is_reassigning())
    }

    /// Every partition as `(topic, partition, state)`.
    pub fn partitions_iter(&self) -> impl Iterator<Item = (&str, i32, &PartitionState)> {
        self.topics.values().flat_map(|t| {
            t.partitions
                .iter()
                .enumerate()
                .filter_map(move |(i, p)| Some((t.name.as_str(), i32::try_from(i).ok()?, p)))
        })
    }

    pub(crate) fn alter_reassignment(
        &mut self,
        topic: &str,
        partition: i32,
        target: Option<&[BrokerId]>,
    ) -> CommandResult {
        let state = self.partition_ref(topic, partition)?.clone();
        let Some(target) = target else {
            return self.cancel_reassignment(topic, partition, state);
        };
        let bad = |reason: String| CommandError::InvalidReplicaAssignment { reason };
        if target.is_empty() {
            return Err(bad(format!(
                "{topic}-{partition}: the replica list is empty"
            )));
        }
        let mut seen = BTreeSet::new();
        for &b in target {
            if !seen.insert(b) {
                return Err(bad(format!(
                    "{topic}-{partition}: broker {b} is listed twice in {target:?}"
                )));
            }
            match self.brokers.get(&b) {
                None => {
                    return Err(bad(format!(
                        "{topic}-{partition}: broker {b} does not exist (registered brokers: {:?})",
                        self.brokers.keys().collect::<Vec<_>>()
                    )))
                }
                Some(reg) if reg.decommissioning && !state.replicas.contains(&b) => {
                    return Err(bad(format!(
                        "{topic}-{partition}: broker {b} is being decommissioned"
                    )))
                }
                Some(_) => {}
            }
        }
        // A new reassignment replaces one in progress: it starts again from the original set.
        let original = state.original_replicas();
        let adding: Vec<BrokerId> = target
            .iter()
            .copied()
            .filter(|b| !original.contains(b))
            .collect();
        let removing: Vec<BrokerId> = original
            .iter()
            .copied()
            .filter(|b| !target.contains(b))
            .collect();
        let replicas: Vec<BrokerId> = target.iter().chain(&removing).copied().collect();
        let Some(next) = self.with_replicas(&state, replicas.clone(), adding, removing) else {
            return Err(bad(format!(
                "{topic}-{partition}: no replica of {replicas:?} would be left in sync (ISR {:?})",
                state.isr
            )));
        };
        // Nothing to copy (a reorder, or only replicas leaving whose remaining ones are in
        // sync): done in the same step, as Kafka does.
        let done = if next.target_replicas().iter().all(|b| next.isr.contains(b)) {
            self.completed(next)
        } else {
            next
        };
        *self.partition_mut(topic, partition)? = done.clone();
        Ok(CommandOutcome::Reassigned(done))
    }

    fn cancel_reassignment(
        &mut self,
        topic: &str,
        partition: i32,
        state: PartitionState,
    ) -> CommandResult {
        if !state.is_reassigning() {
            return Err(CommandError::NoReassignmentInProgress {
                topic: topic.to_owned(),
                partition,
            });
        }
        let replicas = state.original_replicas();
        let Some(next) = self.with_replicas(&state, replicas.clone(), Vec::new(), Vec::new())
        else {
            return Err(CommandError::InvalidReplicaAssignment {
                reason: format!(
                    "{topic}-{partition}: cannot cancel, none of the original replicas {replicas:?} is in sync (ISR {:?})",
                    state.isr
                ),
            });
        };
        *self.partition_mut(topic, partition)? = next.clone();
        Ok(CommandOutcome::Reassigned(next))
    }

    pub(crate) fn complete_reassignment(
        &mut self,
        topic: &str,
        partition: i32,
        partition_epoch: i32,
    ) -> CommandResult {
        let state = self.partition_ref(topic, partition)?.clone();
        check_partition_epoch(topic, partition, &state, partition_epoch)?;
        if !state.is_reassigning() {
            return Err(CommandError::NoReassignmentInProgress {
                topic: topic.to_owned(),
                partition,
            });
        }
        let lagging: Vec<BrokerId> = state
            .target_replicas()
            .into_iter()
            .filter(|b| !state.isr.contains(b))
            .collect();
        if !lagging.is_empty() {
            return Err(CommandError::InvalidReplicaAssignment {
                reason: format!("{topic}-{partition}: replicas {lagging:?} have not caught up yet"),
            });
        }
        let done = self.completed(state);
        *self.partition_mut(topic, partition)? = done.clone();
        Ok(CommandOutcome::Reassigned(done))
    }

    /// The state once a reassignment whose target is fully in sync ends.
    fn completed(&self, state: PartitionState) -> PartitionState {
        let replicas = state.target_replicas();
        let isr: Vec<BrokerId> = state
            .isr
            .iter()
            .copied()
            .filter(|b| replicas.contains(b))
            .collect();
        let leader = self.keep_or_elect(state.leader, &replicas, &isr);
        let changed = state.replicas != replicas || state.isr != isr || leader != state.leader;
        PartitionState {
            leader_epoch: bump_if(state.leader_epoch, leader != state.leader),
            partition_epoch: bump_if(state.partition_epoch, changed),
            replicas,
            leader,
            isr,
            adding: Vec::new(),
            removing: Vec::new(),
        }
    }

    /// `state` with a new replica set (and reassignment sets): the ISR keeps only members of
    /// it and the leader moves if it left; the partition epoch is bumped. `None` when no ISR
    /// member would remain.
    fn with_replicas(
        &self,
        state: &PartitionState,
        replicas: Vec<BrokerId>,
        adding: Vec<BrokerId>,
        removing: Vec<BrokerId>,
    ) -> Option<PartitionState> {
        let isr: Vec<BrokerId> = state
            .isr
            .iter()
            .copied()
            .filter(|b| replicas.contains(b))
            .collect();
        if isr.is_empty() {
            return None;
        }
        let leader = self.keep_or_elect(state.leader, &replicas, &isr);
        Some(PartitionState {
            leader_epoch: bump_if(state.leader_epoch, leader != state.leader),
            partition_epoch: state.partition_epoch.saturating_add(1),
            replicas,
            leader,
            isr,
            adding,
            removing,
        })
    }

    /// The current leader if it stays a live replica, else the first live in-sync replica
    /// in preference order (`None`: the partition goes offline until one returns).
    fn keep_or_elect(
        &self,
        leader: Option<BrokerId>,
        replicas: &[BrokerId],
        isr: &[BrokerId],
    ) -> Option<BrokerId> {
        if leader.is_some_and(|l| replicas.contains(&l) && isr.contains(&l) && self.is_live(l)) {
            return leader;
        }
        replicas
            .iter()
            .copied()
            .find(|b| isr.contains(b) && self.is_live(*b))
    }

    pub(crate) fn elect_unclean(&mut self, topic: &str, partition: i32) -> CommandResult {
        let state = self.partition_ref(topic, partition)?.clone();
        if state.leader.is_some_and(|l| self.is_live(l)) {
            return Err(CommandError::ElectionNotNeeded {
                topic: topic.to_owned(),
                partition,
            });
        }
        // An in-sync replica is still preferred; only without one does an out-of-sync
        // replica lead, alone in the ISR.
        let clean = state
            .replicas
            .iter()
            .copied()
            .find(|b| state.isr.contains(b) && self.is_live(*b));
        let (leader, isr) = match clean {
            Some(l) => (
                l,
                state
                    .isr
                    .iter()
                    .copied()
                    .filter(|b| self.is_live(*b))
                    .collect(),
            ),
            None => {
                let any = state
                    .original_replicas()
                    .into_iter()
                    .find(|b| self.is_live(*b))
                    .ok_or_else(|| CommandError::EligibleLeadersNotAvailable {
                        topic: topic.to_owned(),
                        partition,
                    })?;
                (any, vec![any])
            }
        };
        let p = self.partition_mut(topic, partition)?;
        p.leader = Some(leader);
        p.isr = isr;
        p.leader_epoch = p.leader_epoch.saturating_add(1);
        p.partition_epoch = p.partition_epoch.saturating_add(1);
        Ok(CommandOutcome::LeaderChanged {
            leader: Some(leader),
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch,
        })
    }

    pub(crate) fn unregister(&mut self, broker_id: BrokerId) -> CommandResult {
        if !self.brokers.contains_key(&broker_id) {
            return Err(CommandError::BrokerNotRegistered { broker_id });
        }
        let held: Vec<String> = self
            .partitions_iter()
            .filter(|(_, _, p)| p.replicas.contains(&broker_id))
            .map(|(t, i, _)| format!("{t}-{i}"))
            .collect();
        if let Some(first) = held.first() {
            return Err(CommandError::BrokerInUse {
                broker_id,
                reason: format!(
                    "it still holds {} replica(s), e.g. {first}; move them away first (decommission does)",
                    held.len()
                ),
            });
        }
        self.brokers.remove(&broker_id);
        self.broker_configs.remove(&broker_id.to_string());
        self.retired.insert(broker_id);
        Ok(CommandOutcome::BrokerUnregistered)
    }

    pub(crate) fn alter_broker_configs(
        &mut self,
        resource: &str,
        set: &BTreeMap<String, String>,
        remove: &[String],
    ) -> CommandResult {
        if !resource.is_empty() && resource.parse::<u32>().is_err() {
            return Err(CommandError::InvalidRequest {
                reason: format!("broker resource {resource:?} is neither \"\" nor a broker id"),
            });
        }
        alter_configs(&mut self.broker_configs, resource, set, remove)?;
        Ok(CommandOutcome::BrokerConfigsAltered)
    }

    pub(crate) fn alter_group_configs(
        &mut self,
        group: &str,
        set: &BTreeMap<String, String>,
        remove: &[String],
    ) -> CommandResult {
        if group.is_empty() {
            return Err(CommandError::InvalidRequest {
                reason: "the group id is empty".into(),
            });
        }
        alter_configs(&mut self.group_configs, group, set, remove)?;
        Ok(CommandOutcome::GroupConfigsAltered)
    }
}

/// Sets and removes keys of one entry of a config table (broker or group configs): keys are
/// checked, none both set and removed, and an entry left empty goes.
fn alter_configs(
    table: &mut BTreeMap<String, BTreeMap<String, String>>,
    name: &str,
    set: &BTreeMap<String, String>,
    remove: &[String],
) -> Result<(), CommandError> {
    validate_config_keys(set.keys().chain(remove.iter()))?;
    if let Some(key) = remove.iter().find(|k| set.contains_key(k.as_str())) {
        return Err(CommandError::InvalidConfig {
            reason: format!("key {key:?} is both set and removed"),
        });
    }
    let configs = table.entry(name.to_owned()).or_default();
    for key in remove {
        configs.remove(key);
    }
    for (k, v) in set {
        configs.insert(k.clone(), v.clone());
    }
    if configs.is_empty() {
        table.remove(name);
    }
    Ok(())
}

fn bump_if(epoch: i32, changed: bool) -> i32 {
    if changed {
        epoch.saturating_add(1)
    } else {
        epoch
    }
}

/// Replicas per broker and preferred leaderships per broker, counting every placeable
/// broker (zero when it holds nothing).
fn loads(image: &MetadataImage) -> (BTreeMap<BrokerId, usize>, BTreeMap<BrokerId, usize>) {
    let mut replicas: BTreeMap<BrokerId, usize> =
        image.placeable_brokers().map(|b| (b, 0)).collect();
    let mut preferred = replicas.clone();
    for (_, _, p) in image.partitions_iter() {
        for b in p.target_replicas() {
            *replicas.entry(b).or_default() += 1;
        }
        if let Some(&first) = p.target_replicas().first() {
            *preferred.entry(first).or_default() += 1;
        }
    }
    (replicas, preferred)
}

/// Commands completing every reassignment whose target replicas are all in sync.
pub fn complete_reassignments(image: &MetadataImage) -> Vec<MetadataCommand> {
    image
        .reassignments()
        .filter(|(_, _, p)| p.target_replicas().iter().all(|b| p.isr.contains(b)))
        .map(
            |(topic, partition, p)| MetadataCommand::CompleteReassignment {
                topic: topic.to_owned(),
                partition,
                partition_epoch: p.partition_epoch,
            },
        )
        .collect()
}

/// Partitions moving off decommissioned brokers at once: one, so a decommission copies one
/// replica at a time and never floods the remaining brokers (or the network) with catch-up
/// traffic, as the operations guide promises.
const DECOMMISSION_MOVES_AT_ONCE: usize = 1;

/// Reassignments moving replicas off brokers being decommissioned, at most
/// [`DECOMMISSION_MOVES_AT_ONCE`] in flight: the replica is replaced, in the same position, by
/// the least-loaded placeable broker not yet holding the partition. A partition with no such
/// broker waits.
pub fn decommission_moves(image: &MetadataImage) -> Vec<MetadataCommand> {
    let leaving: BTreeSet<BrokerId> = image
        .brokers()
        .values()
        .filter(|b| b.decommissioning)
        .map(|b| b.id)
        .collect();
    if leaving.is_empty() {
        return Vec::new();
    }
    let in_flight = image
        .partitions_iter()
        .filter(|(_, _, p)| p.is_reassigning() && p.removing.iter().any(|b| leaving.contains(b)))
        .count();
    let room = DECOMMISSION_MOVES_AT_ONCE.saturating_sub(in_flight);
    if room == 0 {
        return Vec::new();
    }
    let (mut load, _) = loads(image);
    let mut cmds = Vec::new();
    for (topic, partition, p) in image.partitions_iter() {
        if cmds.len() == room {
            break;
        }
        if p.is_reassigning() || !p.replicas.iter().any(|b| leaving.contains(b)) {
            continue;
        }
        let mut target = p.replicas.clone();
        let mut complete = true;
        for slot in target.iter_mut() {
            if !leaving.contains(slot) {
                continue;
            }
            let taken: BTreeSet<BrokerId> = p.replicas.iter().copied().collect();
            let Some(replacement) = load
                .iter()
                .filter(|(b, _)| !taken.contains(b))
                .min_by_key(|(&b, &n)| (n, b))
                .map(|(&b, _)| b)
            else {
                complete = false;
                break;
            };
            *load.entry(replacement).or_default() += 1;
            *slot = replacement;
        }
        if complete {
            cmds.push(MetadataCommand::AlterReassignment {
                topic: topic.to_owned(),
                partition,
                target: Some(target),
            });
        }
    }
    cmds
}

/// Kafka's automatic preferred-leader rebalance: for each broker whose share of partitions it
/// should lead but does not exceeds `imbalance_percent`, move those leaderships back where the
/// preferred replica is live and in sync.
pub fn preferred_leader_elections(
    image: &MetadataImage,
    imbalance_percent: u32,
) -> Vec<MetadataCommand> {
    let mut should: BTreeMap<BrokerId, usize> = BTreeMap::new();
    let mut not: BTreeMap<BrokerId, Vec<(&str, i32)>> = BTreeMap::new();
    for (topic, partition, p) in image.partitions_iter() {
        if p.is_reassigning() {
            continue;
        }
        let Some(&preferred) = p.replicas.first() else {
            continue;
        };
        *should.entry(preferred).or_default() += 1;
        // Never back onto a full disk: the controller moved leadership off it on purpose.
        let has_space = !image.broker(preferred).is_some_and(|b| b.disk_full);
        if p.leader != Some(preferred)
            && p.isr.contains(&preferred)
            && image.is_live(preferred)
            && has_space
        {
            not.entry(preferred).or_default().push((topic, partition));
        }
    }
    let mut cmds = Vec::new();
    for (broker, parts) in not {
        let total = should.get(&broker).copied().unwrap_or(0).max(1);
        if parts.len() * 100 > total * imbalance_percent as usize {
            cmds.extend(parts.into_iter().map(|(topic, partition)| {
                MetadataCommand::ElectPreferredLeader {
                    topic: topic.to_owned(),
                    partition,
                }
            }));
        }
    }
    cmds
}

/// A plan spreading replicas and preferred leaderships evenly over the placeable brokers with
/// few moves: replicas move from the most to the least loaded broker until no two differ by
/// more than one, then replica lists are reordered so preferred leaderships spread the same
/// way (a reorder copies no data). Returns `(topic, partition, target)` for each partition
/// whose replica list changes; partitions being reassigned are left alone.
pub fn balance_plan(image: &MetadataImage) -> Vec<(String, i32, Vec<BrokerId>)> {
    let (mut load, mut lead) = loads(image);
    if load.len() < 2 {
        return Vec::new();
    }
    let mut plan: BTreeMap<(String, i32), Vec<BrokerId>> = image
        .partitions_iter()
        .filter(|(_, _, p)| !p.is_reassigning())
        .map(|(t, i, p)| ((t.to_owned(), i), p.replicas.clone()))
        .collect();
    // Bounded: each move lowers the spread between the fullest and emptiest broker.
    for _ in 0..plan.len().saturating_mul(4) {
        let Some((max_b, min_b)) = uneven(&load) else {
            break;
        };
        // Prefer moving a follower replica, so leadership does not move with the data.
        let pick = plan
            .iter()
            .filter(|(_, r)| r.contains(&max_b) && !r.contains(&min_b))
            .min_by_key(|(_, r)| r.first() == Some(&max_b))
            .map(|(k, _)| k.clone());
        let Some(key) = pick else { break };
        if let Some(r) = plan.get_mut(&key) {
            for b in r.iter_mut() {
                if *b == max_b {
                    *b = min_b;
                }
            }
            if r.first() == Some(&min_b) {
                *lead.entry(max_b).or_default() -= 1;
                *lead.entry(min_b).or_default() += 1;
            }
        }
        *load.entry(max_b).or_default() -= 1;
        *load.entry(min_b).or_default() += 1;
    }
    for _ in 0..plan.len().saturating_mul(4) {
        let Some((max_b, min_b)) = uneven(&lead) else {
            break;
        };
        let pick = plan
            .iter()
            .find(|(_, r)| r.first() == Some(&max_b) && r.contains(&min_b))
            .map(|(k, _)| k.clone());
        let Some(key) = pick else { break };
        if let Some(r) = plan.get_mut(&key) {
            if let Some(pos) = r.iter().position(|&b| b == min_b) {
                r.swap(0, pos);
            }
        }
        *lead.entry(max_b).or_default() -= 1;
        *lead.entry(min_b).or_default() += 1;
    }
    plan.into_iter()
        .filter(|((t, i), r)| image.partition(t, *i).is_some_and(|p| &p.replicas != r))
        .map(|((t, i), r)| (t, i, r))
        .collect()
}

/// The most and the least loaded broker of `counts` while they differ by more than one.
fn uneven(counts: &BTreeMap<BrokerId, usize>) -> Option<(BrokerId, BrokerId)> {
    let (&max_b, &max_n) = counts
        .iter()
        .max_by_key(|(&b, &n)| (n, std::cmp::Reverse(b)))?;
    let (&min_b, &min_n) = counts.iter().min_by_key(|(&b, &n)| (n, b))?;
    (max_n > min_n + 1).then_some((max_b, min_b))
}

/// Why removing `leaving` would hurt the cluster, if it would: a partition that could not
/// keep its replication factor (or its `min.insync.replicas`) on the brokers that remain, or
/// a metadata quorum left without a live majority. `voters` are the quorum's voters.
pub fn removal_blocker(
    image: &MetadataImage,
    voters: &BTreeSet<BrokerId>,
    leaving: &BTreeSet<BrokerId>,
) -> Option<String> {
    for &b in leaving {
        if image.broker(b).is_none() && !voters.contains(&b) {
            return Some(format!("broker {b} is not a member of the cluster"));
        }
    }
    let remaining: BTreeSet<BrokerId> = image
        .placeable_brokers()
        .filter(|b| !leaving.contains(b))
        .collect();
    for t in image.topics().values() {
        let min_isr: usize = t
            .configs
            .get("min.insync.replicas")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        for (i, p) in t.partitions.iter().enumerate() {
            let rf = p.target_replicas().len();
            if !p.replicas.iter().any(|b| leaving.contains(b)) {
                continue;
            }
            if remaining.len() < rf.max(min_isr) {
                return Some(format!(
                    "{}-{i} needs {} brokers (replication factor {rf}, min.insync.replicas {min_isr}) but only {} would remain: {remaining:?}",
                    t.name,
                    rf.max(min_isr),
                    remaining.len()
                ));
            }
        }
    }
    let leaving_voters = voters.intersection(leaving).count();
    if leaving_voters == 0 {
        return None;
    }
    let majority_now = voters.len() / 2 + 1;
    if leaving_voters >= majority_now {
        return Some(format!(
            "it would remove {leaving_voters} of the {} metadata quorum voters at once, a majority; remove them one at a time",
            voters.len()
        ));
    }
    let rest: Vec<BrokerId> = voters.difference(leaving).copied().collect();
    let live = rest.iter().filter(|b| image.is_live(**b)).count();
    let majority = rest.len() / 2 + 1;
    if live < majority {
        return Some(format!(
            "the metadata quorum would keep voters {rest:?} of which only {live} are live, fewer than the majority of {majority}"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::create_topic_command;
    use crate::controller::tests::{image_with_brokers as image_with, register_command};
    use uuid::Uuid;

    fn topic(image: &mut MetadataImage, name: &str, assignment: Vec<Vec<BrokerId>>) {
        image
            .apply(&MetadataCommand::CreateTopic {
                name: name.to_owned(),
                topic_id: Uuid::from_u128(name.len() as u128 + 99),
                configs: BTreeMap::new(),
                assignment,
            })
            .unwrap();
    }

    fn reassign(image: &mut MetadataImage, target: Option<Vec<BrokerId>>) -> CommandResult {
        image.apply(&MetadataCommand::AlterReassignment {
            topic: "t".to_owned(),
            partition: 0,
            target,
        })
    }

    fn join_isr(image: &mut MetadataImage, broker: BrokerId) {
        let p = image.partition("t", 0).unwrap().clone();
        let mut isr = p.isr.clone();
        isr.push(broker);
        image
            .apply(&MetadataCommand::AlterIsr {
                topic: "t".to_owned(),
                partition: 0,
                leader: p.leader.unwrap(),
                leader_epoch: p.leader_epoch,
                partition_epoch: p.partition_epoch,
                isr,
            })
            .unwrap();
    }

    fn set_fenced(image: &mut MetadataImage, id: BrokerId) {
        let epoch = image.broker(id).unwrap().epoch;
        image
            .apply(&MetadataCommand::FenceBroker {
                broker_id: id,
                broker_epoch: epoch,
            })
            .unwrap();
    }

    #[test]
    fn reassignment_adds_new_replicas_first_and_drops_old_ones_only_once_they_are_in_sync() {
        let mut image = image_with(&[1, 2, 3, 4]);
        topic(&mut image, "t", vec![vec![1, 2, 3]]);
        reassign(&mut image, Some(vec![4, 2, 3])).unwrap();
        let p = image.partition("t", 0).unwrap().clone();
        assert_eq!(p.replicas, vec![4, 2, 3, 1]);
        assert_eq!((p.adding.clone(), p.removing.clone()), (vec![4], vec![1]));
        assert_eq!(
            p.leader,
            Some(1),
            "the old leader leads until the move completes"
        );
        assert!(
            complete_reassignments(&image).is_empty(),
            "4 is not in sync yet"
        );
        let refused = image.apply(&MetadataCommand::CompleteReassignment {
            topic: "t".to_owned(),
            partition: 0,
            partition_epoch: p.partition_epoch,
        });
        assert!(refused.is_err());
        assert_eq!(
            image.partition("t", 0).unwrap(),
            &p,
            "a refusal changes nothing"
        );

        join_isr(&mut image, 4);
        let cmds = complete_reassignments(&image);
        assert_eq!(cmds.len(), 1);
        image.apply(&cmds[0]).unwrap();
        let done = image.partition("t", 0).unwrap();
        assert_eq!(done.replicas, vec![4, 2, 3]);
        assert!(!done.isr.contains(&1) && done.isr.contains(&4));
        assert_eq!(
            done.leader,
            Some(4),
            "the removed leader hands over to the first target"
        );
        assert_eq!(done.leader_epoch, p.leader_epoch + 1);
        assert!(!done.is_reassigning());
    }

    #[test]
    fn cancelling_a_reassignment_returns_to_the_original_replicas() {
        let mut image = image_with(&[1, 2, 3, 4]);
        topic(&mut image, "t", vec![vec![1, 2, 3]]);
        reassign(&mut image, Some(vec![4, 2, 3])).unwrap();
        join_isr(&mut image, 4);
        reassign(&mut image, None).unwrap();
        let p = image.partition("t", 0).unwrap();
        // As in Kafka, the original replicas come back in the merged list's order.
        assert_eq!(p.replicas, vec![2, 3, 1]);
        assert!(!p.isr.contains(&4));
        assert!(!p.is_reassigning());
        let again = reassign(&mut image, None).unwrap_err();
        assert_eq!(again.kafka_error_code(), 85, "NO_REASSIGNMENT_IN_PROGRESS");
    }

    #[test]
    fn bad_targets_are_refused_with_kafka_codes_and_change_nothing() {
        let mut image = image_with(&[1, 2, 3]);
        topic(&mut image, "t", vec![vec![1, 2, 3]]);
        let before = image.clone();
        for (target, what) in [
            (vec![1, 1, 2], "listed twice"),
            (vec![1, 2, 9], "does not exist"),
            (vec![], "empty"),
        ] {
            let e = reassign(&mut image, Some(target)).unwrap_err();
            assert_eq!(e.kafka_error_code(), 39, "INVALID_REPLICA_ASSIGNMENT: {e}");
            assert!(e.to_string().contains(what), "{e}");
        }
        let e = image
            .apply(&MetadataCommand::AlterReassignment {
                topic: "gone".to_owned(),
                partition: 0,
                target: Some(vec![1]),
            })
            .unwrap_err();
        assert_eq!(e.kafka_error_code(), 3, "UNKNOWN_TOPIC_OR_PARTITION");
        assert_eq!(image, before);
    }

    #[test]
    fn a_reorder_completes_at_once_and_changes_the_preferred_leader() {
        let mut image = image_with(&[1, 2, 3]);
        topic(&mut image, "t", vec![vec![1, 2, 3]]);
        reassign(&mut image, Some(vec![2, 1, 3])).unwrap();
        let p = image.partition("t", 0).unwrap();
        assert_eq!(p.replicas, vec![2, 1, 3]);
        assert!(!p.is_reassigning());
        assert_eq!(
            p.leader,
            Some(1),
            "leadership moves by election, not by reordering"
        );
        let cmds = preferred_leader_elections(&image, 10);
        assert_eq!(cmds.len(), 1);
        image.apply(&cmds[0]).unwrap();
        assert_eq!(image.partition("t", 0).unwrap().leader, Some(2));
    }

    #[test]
    fn unclean_election_prefers_the_isr_and_otherwise_takes_any_live_replica() {
        let mut image = image_with(&[1, 2, 3]);
        topic(&mut image, "t", vec![vec![1, 2, 3]]);
        let e = image
            .apply(&MetadataCommand::ElectUncleanLeader {
                topic: "t".to_owned(),
                partition: 0,
            })
            .unwrap_err();
        assert_eq!(
            e.kafka_error_code(),
            84,
            "ELECTION_NOT_NEEDED while the leader is live"
        );
        // 2 and 3 fall out of the ISR, then 1 dies: the partition goes offline.
        let p = image.partition("t", 0).unwrap().clone();
        image
            .apply(&MetadataCommand::AlterIsr {
                topic: "t".to_owned(),
                partition: 0,
                leader: 1,
                leader_epoch: p.leader_epoch,
                partition_epoch: p.partition_epoch,
                isr: vec![1],
            })
            .unwrap();
        let cmds = crate::controller::fence_broker_commands(&image, 1);
        image.apply(&MetadataCommand::Batch(cmds)).unwrap();
        assert_eq!(image.partition("t", 0).unwrap().leader, None);
        image
            .apply(&MetadataCommand::ElectUncleanLeader {
                topic: "t".to_owned(),
                partition: 0,
            })
            .unwrap();
        let p = image.partition("t", 0).unwrap();
        assert_eq!((p.leader, p.isr.clone()), (Some(2), vec![2]));
    }

    #[test]
    fn decommissioning_moves_each_replica_to_the_least_loaded_other_broker() {
        let mut image = image_with(&[1, 2, 3, 4]);
        topic(&mut image, "t", vec![vec![1, 2, 3]]);
        image
            .apply(&MetadataCommand::SetDecommissioning {
                broker_id: 1,
                decommissioning: true,
            })
            .unwrap();
        let cmds = decommission_moves(&image);
        assert_eq!(
            cmds,
            vec![MetadataCommand::AlterReassignment {
                topic: "t".to_owned(),
                partition: 0,
                target: Some(vec![4, 2, 3]),
            }]
        );
        // One move at a time: a second partition waits until the first completes.
        topic(&mut image, "uu", vec![vec![1, 2, 3]]);
        assert_eq!(decommission_moves(&image).len(), 1);
        image.apply(&cmds[0]).unwrap();
        assert_eq!(decommission_moves(&image), vec![]);
        // New topics avoid the broker being emptied.
        let create =
            create_topic_command(&image, "new", Uuid::from_u128(7), 4, 3, BTreeMap::new()).unwrap();
        let MetadataCommand::CreateTopic { assignment, .. } = create else {
            panic!("not a creation");
        };
        assert!(assignment.iter().all(|r| !r.contains(&1)), "{assignment:?}");
    }

    #[test]
    fn a_broker_holding_replicas_cannot_be_unregistered_and_a_retired_one_cannot_register() {
        let mut image = image_with(&[1, 2, 3, 4]);
        topic(&mut image, "t", vec![vec![1, 2, 3]]);
        let e = image
            .apply(&MetadataCommand::UnregisterBroker { broker_id: 1 })
            .unwrap_err();
        assert!(e.to_string().contains("t-0"), "{e}");
        image
            .apply(&MetadataCommand::UnregisterBroker { broker_id: 4 })
            .unwrap();
        let again = image.apply(&register_command(4, 44));
        assert!(matches!(
            again,
            Err(CommandError::BrokerRetired { broker_id: 4 })
        ));
        image
            .apply(&MetadataCommand::ReadmitBroker { broker_id: 4 })
            .unwrap();
        assert!(image.apply(&register_command(4, 44)).is_ok());
    }

    #[test]
    fn removal_is_refused_when_partitions_or_the_quorum_would_suffer() {
        let mut image = image_with(&[1, 2, 3, 4]);
        topic(&mut image, "t", vec![vec![1, 2, 3]]);
        let voters: BTreeSet<BrokerId> = [1, 2, 3, 4].into();
        assert_eq!(removal_blocker(&image, &voters, &[4].into()), None);
        assert_eq!(removal_blocker(&image, &voters, &[1].into()), None);
        let two = removal_blocker(&image, &voters, &[1, 2].into()).unwrap();
        assert!(two.contains("replication factor 3"), "{two}");
        let three: BTreeSet<BrokerId> = [1, 2, 3].into();
        let majority = removal_blocker(&image_with(&[1, 2, 3]), &three, &[1, 2].into()).unwrap();
        assert!(majority.contains("majority"), "{majority}");
        // With 4 voters and one already down, removing a live one leaves 2 live of 3.
        set_fenced(&mut image, 3);
        assert_eq!(removal_blocker(&image, &voters, &[4].into()), None);
        set_fenced(&mut image, 2);
        let quorum = removal_blocker(&image, &voters, &[4].into()).unwrap();
        assert!(
            quorum.contains("replication factor") || quorum.contains("majority"),
            "{quorum}"
        );
        let unknown = removal_blocker(&image, &voters, &[9].into()).unwrap();
        assert!(unknown.contains("not a member"), "{unknown}");
    }

    #[test]
    fn balance_plan_spreads_replicas_and_preferred_leaders_onto_a_new_broker() {
        let mut image = image_with(&[1, 2, 3]);
        topic(
            &mut image,
            "t",
            vec![
                vec![1, 2, 3],
                vec![2, 3, 1],
                vec![3, 1, 2],
                vec![1, 3, 2],
                vec![2, 1, 3],
                vec![3, 2, 1],
            ],
        );
        let mut image = {
            let mut with4 = image.clone();
            with4.apply(&register_command(4, 4)).unwrap();
            with4
        };
        let plan = balance_plan(&image);
        assert!(!plan.is_empty());
        for (t, i, target) in &plan {
            image
                .apply(&MetadataCommand::AlterReassignment {
                    topic: t.clone(),
                    partition: *i,
                    target: Some(target.clone()),
                })
                .unwrap();
        }
        let (load, lead) = loads(&image);
        let spread =
            |m: &BTreeMap<BrokerId, usize>| m.values().max().unwrap() - m.values().min().unwrap();
        assert!(spread(&load) <= 1, "replicas per broker: {load:?}");
        assert!(spread(&lead) <= 1, "preferred leaders per broker: {lead:?}");
        assert_eq!(
            load.values().sum::<usize>(),
            18,
            "the replication factor is kept"
        );
    }
}
