//! Moving one member from its current assignment towards its target, never letting two
//! members own a partition at once: a partition is given to its new owner only once the
//! previous owner has revoked it, which the previous owner acknowledges by leaving it out of
//! the partitions it reports owning in a later heartbeat.

use std::collections::BTreeSet;

use uuid::Uuid;

use super::assignor::TopicPartitions;

/// Where a member is in its reconciliation (Kafka's member states).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// Owns exactly its target at the target's epoch.
    Stable,
    /// Must revoke partitions before it moves on.
    UnrevokedPartitions,
    /// At the target epoch, waiting for partitions other members still own.
    UnreleasedPartitions,
}

impl MemberState {
    /// The name Kafka's records and tools use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Stable => "stable",
            Self::UnrevokedPartitions => "unrevoked_partitions",
            Self::UnreleasedPartitions => "unreleased_partitions",
        }
    }
}

/// A member's current assignment and epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    /// Reconciliation state.
    pub state: MemberState,
    /// The member's epoch.
    pub epoch: i32,
    /// Its epoch before the last bump (a heartbeat with it is accepted once).
    pub previous_epoch: i32,
    /// Partitions it owns and may use.
    pub assigned: TopicPartitions,
    /// Partitions it still owns but must give up.
    pub revoking: TopicPartitions,
}

impl Current {
    /// A member that owns nothing yet.
    pub fn joining() -> Self {
        Self {
            state: MemberState::Stable,
            epoch: 0,
            previous_epoch: 0,
            assigned: TopicPartitions::new(),
            revoking: TopicPartitions::new(),
        }
    }
}

/// True when `owned` (what the member reports owning; `None` when it did not say) may still
/// include one of `partitions`.
fn still_owns(owned: Option<&TopicPartitions>, partitions: &TopicPartitions) -> bool {
    let Some(owned) = owned else {
        return true;
    };
    partitions
        .iter()
        .any(|(t, ps)| owned.get(t).is_some_and(|o| !o.is_disjoint(ps)))
}

/// The member's next state given its target (`target_epoch`, `target`), what it reports
/// owning, and `owned_by_other`: whether another member still holds a partition.
pub fn reconcile(
    current: &Current,
    target_epoch: i32,
    target: &TopicPartitions,
    owned: Option<&TopicPartitions>,
    owned_by_other: impl Fn(Uuid, i32) -> bool,
) -> Current {
    match current.state {
        MemberState::Stable if current.epoch == target_epoch => current.clone(),
        MemberState::Stable | MemberState::UnreleasedPartitions => next(
            current,
            current.epoch,
            &current.assigned,
            target_epoch,
            target,
            owned,
            owned_by_other,
        ),
        MemberState::UnrevokedPartitions => {
            if still_owns(owned, &current.revoking) {
                return current.clone();
            }
            next(
                current,
                current.epoch + 1,
                &current.assigned,
                target_epoch,
                target,
                owned,
                owned_by_other,
            )
        }
    }
}

fn next(
    current: &Current,
    epoch: i32,
    assigned: &TopicPartitions,
    target_epoch: i32,
    target: &TopicPartitions,
    owned: Option<&TopicPartitions>,
    owned_by_other: impl Fn(Uuid, i32) -> bool,
) -> Current {
    let empty = BTreeSet::new();
    let topics: BTreeSet<Uuid> = target.keys().chain(assigned.keys()).copied().collect();
    let mut keep = TopicPartitions::new();
    let mut revoke = TopicPartitions::new();
    let mut gain = TopicPartitions::new();
    let mut unreleased = false;
    for t in topics {
        let want = target.get(&t).unwrap_or(&empty);
        let have = assigned.get(&t).unwrap_or(&empty);
        let kept: BTreeSet<i32> = have.intersection(want).copied().collect();
        let gone: BTreeSet<i32> = have.difference(want).copied().collect();
        let mut new: BTreeSet<i32> = want.difference(have).copied().collect();
        let before = new.len();
        new.retain(|&p| !owned_by_other(t, p));
        unreleased |= new.len() != before;
        for (set, out) in [(kept, &mut keep), (gone, &mut revoke), (new, &mut gain)] {
            if !set.is_empty() {
                out.insert(t, set);
            }
        }
    }
    let bumped = |state, assigned| Current {
        state,
        epoch: target_epoch,
        previous_epoch: current.epoch,
        assigned,
        revoking: TopicPartitions::new(),
    };
    if !revoke.is_empty() && still_owns(owned, &revoke) {
        // Revoke first, at the current epoch; nothing new until the member confirms.
        return Current {
            state: MemberState::UnrevokedPartitions,
            epoch,
            previous_epoch: if epoch == current.epoch {
                current.previous_epoch
            } else {
                current.epoch
            },
            assigned: keep,
            revoking: revoke,
        };
    }
    for (t, ps) in gain {
        keep.entry(t).or_default().extend(ps);
    }
    let state = if unreleased {
        MemberState::UnreleasedPartitions
    } else {
        MemberState::Stable
    };
    bumped(state, keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> Uuid {
        Uuid::from_bytes([7; 16])
    }

    fn tp(ps: &[i32]) -> TopicPartitions {
        if ps.is_empty() {
            return TopicPartitions::new();
        }
        TopicPartitions::from([(t(), ps.iter().copied().collect())])
    }

    fn stable(epoch: i32, ps: &[i32]) -> Current {
        Current {
            state: MemberState::Stable,
            epoch,
            previous_epoch: epoch - 1,
            assigned: tp(ps),
            revoking: TopicPartitions::new(),
        }
    }

    #[test]
    fn a_member_gains_free_partitions_and_the_target_epoch_at_once() {
        let next = reconcile(&stable(1, &[0]), 2, &tp(&[0, 1]), None, |_, _| false);
        assert_eq!(next.state, MemberState::Stable);
        assert_eq!(next.epoch, 2);
        assert_eq!(next.previous_epoch, 1);
        assert_eq!(next.assigned, tp(&[0, 1]));
    }

    #[test]
    fn a_member_revokes_before_it_moves_to_the_new_epoch() {
        let next = reconcile(&stable(3, &[0, 1, 2]), 4, &tp(&[0]), None, |_, _| false);
        assert_eq!(next.state, MemberState::UnrevokedPartitions);
        assert_eq!(next.epoch, 3, "the epoch waits for the revocation");
        assert_eq!(next.assigned, tp(&[0]));
        assert_eq!(next.revoking, tp(&[1, 2]));
    }

    #[test]
    fn revocation_completes_only_when_the_member_reports_the_partitions_gone() {
        let revoking = reconcile(&stable(3, &[0, 1]), 4, &tp(&[0]), None, |_, _| false);
        let silent = reconcile(&revoking, 4, &tp(&[0]), None, |_, _| false);
        assert_eq!(
            silent, revoking,
            "no owned partitions reported: still revoking"
        );
        let still = reconcile(&revoking, 4, &tp(&[0]), Some(&tp(&[0, 1])), |_, _| false);
        assert_eq!(still, revoking, "partition 1 still reported owned");
        let done = reconcile(&revoking, 4, &tp(&[0]), Some(&tp(&[0])), |_, _| false);
        assert_eq!(done.state, MemberState::Stable);
        assert_eq!(done.epoch, 4);
        assert!(done.revoking.is_empty());
    }

    #[test]
    fn partitions_another_member_still_owns_wait_until_released() {
        let next = reconcile(&stable(1, &[]), 2, &tp(&[0, 1]), None, |_, p| p == 1);
        assert_eq!(next.state, MemberState::UnreleasedPartitions);
        assert_eq!(next.epoch, 2);
        assert_eq!(next.assigned, tp(&[0]));
        let later = reconcile(&next, 2, &tp(&[0, 1]), None, |_, _| false);
        assert_eq!(later.state, MemberState::Stable);
        assert_eq!(later.assigned, tp(&[0, 1]));
    }

    #[test]
    fn a_member_that_already_dropped_the_partitions_skips_the_revocation_step() {
        let next = reconcile(
            &stable(1, &[0, 1]),
            2,
            &tp(&[0]),
            Some(&tp(&[0])),
            |_, _| false,
        );
        assert_eq!(next.state, MemberState::Stable);
        assert_eq!(next.epoch, 2);
    }

    #[test]
    fn a_reconciled_member_stays_as_it_is() {
        let s = stable(5, &[0, 1]);
        assert_eq!(reconcile(&s, 5, &tp(&[0, 1]), None, |_, _| true), s);
    }
}
