//! The replication core of one partition, as pure logic: Kafka's ISR design.
//!
//! A leader tracks what each follower has ([`LeaderState`]): the log end offset its last
//! fetch reported and when it was last caught up. From that it moves the high watermark (the
//! smallest log end among the in-sync replicas), decides when a follower has fallen out of
//! the ISR (no catch-up for `replica.lag.time.max.ms`) or may join it again (it has reached
//! the high watermark and the current epoch), and tells when an acks=all produce is done.
//! A follower that starts following a new leader finds where its log diverges
//! ([`resolve_divergence`]) from the leader's answers to OffsetForLeaderEpoch.
//!
//! Nothing here reads a clock or does I/O: the broker feeds in fetches, appends, metadata and
//! the time, and acts on what comes back (proposing an ISR change, waking produces). The same
//! code runs in the deterministic simulation under `tests/`.

use std::collections::{BTreeMap, BTreeSet};

use crate::metadata::BrokerId;

/// How a follower is doing, as its leader sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerProgress {
    /// Log end offset the follower's last fetch reported; -1 until it fetched under this
    /// leader.
    pub log_end_offset: i64,
    /// Last time the follower had everything the leader had (Kafka's lastCaughtUpTime).
    pub last_caught_up_ms: u64,
    /// When the last fetch arrived.
    pub last_fetch_ms: u64,
    /// The leader's log end when the last fetch arrived.
    last_fetch_leader_end: i64,
}

/// An ISR change the leader wants committed to the metadata quorum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsrChange {
    /// The leader epoch it is proposed under.
    pub leader_epoch: i32,
    /// The partition epoch it was decided on.
    pub partition_epoch: i32,
    /// The proposed ISR, the leader first.
    pub isr: Vec<BrokerId>,
}

/// What the leader learnt from a follower's fetch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FetchOutcome {
    /// The high watermark moved to this.
    pub high_watermark: Option<i64>,
    /// The follower caught up and should join the ISR.
    pub expand: Option<IsrChange>,
}

/// Where an acks=all produce stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckState {
    /// Not yet replicated to every in-sync replica.
    Pending,
    /// Committed, with at least min.insync.replicas in the ISR.
    Done,
    /// Committed, but the ISR shrank below min.insync.replicas meanwhile
    /// (NOT_ENOUGH_REPLICAS_AFTER_APPEND).
    TooFewReplicas,
}

/// Why a follower fetch was not taken into account.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaError {
    /// The fetching broker holds no replica of this partition.
    #[error("broker {0} is not a replica of this partition")]
    NotAReplica(BrokerId),
}

/// The leader's view of one partition's replication.
#[derive(Debug, Clone)]
pub struct LeaderState {
    local: BrokerId,
    leader_epoch: i32,
    partition_epoch: i32,
    replicas: Vec<BrokerId>,
    isr: Vec<BrokerId>,
    /// An ISR change proposed and not yet seen committed. While it is out, the high
    /// watermark counts the union of both ISRs (KIP-497's "maximal ISR"), so neither the
    /// committed nor the proposed ISR can ever hold less than the high watermark.
    pending: Option<Vec<BrokerId>>,
    fenced: BTreeSet<BrokerId>,
    followers: BTreeMap<BrokerId, FollowerProgress>,
    high_watermark: i64,
    /// The leader's log end when it took this epoch: a follower joins the ISR only once it
    /// has reached it, so it holds everything earlier leaders committed.
    epoch_start_offset: i64,
    lag_time_max_ms: u64,
}

impl LeaderState {
    /// Becomes leader of a partition at `leader_epoch`. Followers get a full lag period of
    /// grace before they can be dropped from the ISR, as in Kafka.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        local: BrokerId,
        leader_epoch: i32,
        partition_epoch: i32,
        replicas: Vec<BrokerId>,
        isr: Vec<BrokerId>,
        log_end_offset: i64,
        high_watermark: i64,
        now_ms: u64,
        lag_time_max_ms: u64,
    ) -> Self {
        let followers = replicas
            .iter()
            .filter(|&&r| r != local)
            .map(|&r| {
                (
                    r,
                    FollowerProgress {
                        log_end_offset: -1,
                        last_caught_up_ms: now_ms,
                        last_fetch_ms: now_ms,
                        last_fetch_leader_end: log_end_offset,
                    },
                )
            })
            .collect();
        let mut s = Self {
            local,
            leader_epoch,
            partition_epoch,
            replicas,
            isr,
            pending: None,
            fenced: BTreeSet::new(),
            followers,
            high_watermark: high_watermark.min(log_end_offset),
            epoch_start_offset: log_end_offset,
            lag_time_max_ms,
        };
        s.maybe_advance(log_end_offset);
        s
    }

    /// The leader epoch this state was built for.
    pub fn leader_epoch(&self) -> i32 {
        self.leader_epoch
    }

    /// The partition epoch last seen committed.
    pub fn partition_epoch(&self) -> i32 {
        self.partition_epoch
    }

    /// The committed ISR.
    pub fn isr(&self) -> &[BrokerId] {
        &self.isr
    }

    /// The assigned replicas.
    pub fn replicas(&self) -> &[BrokerId] {
        &self.replicas
    }

    /// The proposed ISR not yet committed, if any.
    pub fn pending_isr(&self) -> Option<&[BrokerId]> {
        self.pending.as_deref()
    }

    /// Offset below which every in-sync replica has the records.
    pub fn high_watermark(&self) -> i64 {
        self.high_watermark
    }

    /// Each follower's progress.
    pub fn followers(&self) -> &BTreeMap<BrokerId, FollowerProgress> {
        &self.followers
    }

    /// Whether an acks=all produce may be appended now: the committed ISR has at least
    /// `min_isr` members (else NOT_ENOUGH_REPLICAS, before anything is written).
    pub fn accepts_acks_all(&self, min_isr: usize) -> bool {
        self.isr.len() >= min_isr
    }

    /// Where an acks=all produce whose last record is `last_offset` stands.
    pub fn ack_state(&self, last_offset: i64, min_isr: usize) -> AckState {
        if self.high_watermark <= last_offset {
            AckState::Pending
        } else if self.isr.len() >= min_isr {
            AckState::Done
        } else {
            AckState::TooFewReplicas
        }
    }

    /// The leader appended; with no other in-sync replica that alone commits.
    pub fn on_leader_append(&mut self, log_end_offset: i64) -> Option<i64> {
        self.maybe_advance(log_end_offset)
    }

    /// A follower fetched from `fetch_offset`: it has everything below it. `log_end_offset` is
    /// the leader's log end when the fetch arrived.
    pub fn on_follower_fetch(
        &mut self,
        follower: BrokerId,
        fetch_offset: i64,
        log_end_offset: i64,
        now_ms: u64,
    ) -> Result<FetchOutcome, ReplicaError> {
        let p = self
            .followers
            .get_mut(&follower)
            .ok_or(ReplicaError::NotAReplica(follower))?;
        // Kafka's rule: caught up now if it has all the leader has; caught up as of its
        // previous fetch if it has all the leader had then.
        if fetch_offset >= log_end_offset {
            p.last_caught_up_ms = p.last_caught_up_ms.max(now_ms);
        } else if fetch_offset >= p.last_fetch_leader_end {
            p.last_caught_up_ms = p.last_caught_up_ms.max(p.last_fetch_ms);
        }
        p.log_end_offset = fetch_offset.min(log_end_offset);
        p.last_fetch_ms = now_ms;
        p.last_fetch_leader_end = log_end_offset;
        let mut out = FetchOutcome {
            high_watermark: self.maybe_advance(log_end_offset),
            expand: None,
        };
        if self.pending.is_none()
            && !self.isr.contains(&follower)
            && self.may_join(follower, fetch_offset)
        {
            let mut isr = self.isr.clone();
            isr.push(follower);
            out.expand = Some(self.propose(isr));
        }
        Ok(out)
    }

    /// The followers in the ISR that have not caught up for `replica.lag.time.max.ms`: the
    /// ISR without them, to propose. None when all keep up or a change is already out.
    pub fn check_lagging(&mut self, now_ms: u64) -> Option<IsrChange> {
        if self.pending.is_some() {
            return None;
        }
        let lagging: Vec<BrokerId> = self
            .isr
            .iter()
            .copied()
            .filter(|&r| r != self.local)
            .filter(|r| {
                self.followers.get(r).is_none_or(|p| {
                    now_ms.saturating_sub(p.last_caught_up_ms) > self.lag_time_max_ms
                })
            })
            .collect();
        if lagging.is_empty() {
            return None;
        }
        let isr = self
            .isr
            .iter()
            .copied()
            .filter(|r| !lagging.contains(r))
            .collect();
        Some(self.propose(isr))
    }

    /// The metadata quorum committed a new state for this partition (same leader epoch):
    /// takes its ISR and partition epoch and drops any pending proposal it settles. A
    /// proposal that was refused is dropped too (the caller sees the partition epoch move,
    /// or calls [`LeaderState::on_isr_change_failed`]). A state with an older partition
    /// epoch than the last one taken (a late image) is ignored.
    pub fn on_metadata(
        &mut self,
        partition_epoch: i32,
        replicas: Vec<BrokerId>,
        isr: Vec<BrokerId>,
        fenced: BTreeSet<BrokerId>,
        log_end_offset: i64,
        now_ms: u64,
    ) -> Option<i64> {
        // A state older than the one already taken (a late or replayed image) says nothing
        // new, and taking its ISR would undo a committed expansion: the high watermark would
        // stop counting a replica that is in the committed ISR.
        if partition_epoch < self.partition_epoch {
            return None;
        }
        if partition_epoch > self.partition_epoch {
            self.pending = None;
        }
        self.partition_epoch = partition_epoch;
        for &r in &replicas {
            if r != self.local {
                self.followers.entry(r).or_insert(FollowerProgress {
                    log_end_offset: -1,
                    last_caught_up_ms: now_ms,
                    last_fetch_ms: now_ms,
                    last_fetch_leader_end: log_end_offset,
                });
            }
        }
        self.followers.retain(|r, _| replicas.contains(r));
        self.replicas = replicas;
        self.isr = isr;
        self.fenced = fenced;
        self.maybe_advance(log_end_offset)
    }

    /// A proposed ISR change was refused in a way that proves it was never applied (an
    /// invalid or ineligible ISR at the current partition epoch): the next check may propose
    /// again. Not for a timeout, nor for a stale-partition-epoch answer, which may answer a
    /// retry of a proposal that was applied: dropping an applied expansion would let the high
    /// watermark pass the joiner. Those wait for the image ([`LeaderState::on_metadata`]).
    ///
    /// Only `change` itself is dropped: a refusal that arrives after the image settled it and
    /// the leader proposed another must not clear the newer one (which would let the high
    /// watermark stop counting a replica that the newer proposal may already have added).
    /// Returns whether the pending change was dropped.
    pub fn on_isr_change_failed(&mut self, change: &IsrChange) -> bool {
        let same = change.leader_epoch == self.leader_epoch
            && change.partition_epoch == self.partition_epoch
            && self.pending.as_deref() == Some(change.isr.as_slice());
        if same {
            self.pending = None;
        }
        same
    }

    /// The leader's log end when it took this epoch. Until the high watermark reaches it, the
    /// high watermark is not known (it may be below what an earlier leader exposed, KIP-207).
    pub fn epoch_start_offset(&self) -> i64 {
        self.epoch_start_offset
    }

    /// Whether the high watermark has reached the epoch start: only then does it say at least
    /// as much as any earlier leader of the partition said.
    pub fn high_watermark_known(&self) -> bool {
        self.high_watermark >= self.epoch_start_offset
    }

    fn propose(&mut self, isr: Vec<BrokerId>) -> IsrChange {
        self.pending = Some(isr.clone());
        IsrChange {
            leader_epoch: self.leader_epoch,
            partition_epoch: self.partition_epoch,
            isr,
        }
    }

    /// A follower outside the ISR may join once it is live and holds everything below the
    /// high watermark and everything of earlier epochs.
    fn may_join(&self, follower: BrokerId, fetch_offset: i64) -> bool {
        !self.fenced.contains(&follower)
            && self.replicas.contains(&follower)
            && fetch_offset >= self.high_watermark
            && fetch_offset >= self.epoch_start_offset
    }

    /// Moves the high watermark up to the smallest log end of the (maximal) ISR. It never
    /// moves back: what was exposed stays exposed.
    /// The invariants every step keeps, asserted in debug builds (the tests and the
    /// replication simulation run them after every step): the leader is in its ISR and in
    /// any ISR it proposes, and its high watermark is never past its own log end (it only
    /// rises, by the minimum over the ISR, and the leader's end only grows).
    fn assert_invariants(&self, log_end_offset: i64) {
        debug_assert!(
            self.isr.contains(&self.local),
            "leader {} not in its ISR {:?}",
            self.local,
            self.isr
        );
        debug_assert!(
            self.pending
                .as_ref()
                .is_none_or(|p| p.contains(&self.local)),
            "leader {} proposed an ISR without itself: {:?}",
            self.local,
            self.pending
        );
        debug_assert!(
            self.high_watermark <= log_end_offset,
            "high watermark {} past the leader's end {log_end_offset}",
            self.high_watermark
        );
    }

    fn maybe_advance(&mut self, log_end_offset: i64) -> Option<i64> {
        let before = self.high_watermark;
        let advanced = self.advance(log_end_offset);
        debug_assert!(
            self.high_watermark >= before,
            "the high watermark moved back"
        );
        self.assert_invariants(log_end_offset);
        advanced
    }

    fn advance(&mut self, log_end_offset: i64) -> Option<i64> {
        let mut hw = log_end_offset;
        let members = self
            .isr
            .iter()
            .chain(self.pending.iter().flatten())
            .filter(|&&r| r != self.local);
        for r in members {
            let leo = self.followers.get(r).map_or(-1, |p| p.log_end_offset);
            hw = hw.min(leo);
        }
        if hw > self.high_watermark {
            self.high_watermark = hw;
            Some(hw)
        } else {
            None
        }
    }
}

/// The next step of a follower looking for where its log leaves the leader's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Divergence {
    /// Cut the log at this offset (everything at or after it goes), then fetch from there.
    TruncateTo(i64),
    /// The leader's answer named an epoch this follower does not have: ask again for this
    /// (smaller) epoch.
    AskAgain(i32),
}

/// Resolves one OffsetForLeaderEpoch round (KIP-101 and KIP-279).
///
/// The follower asked for the latest epoch it holds (or, on a later round, what the previous
/// one said to ask). `leader_answer` is the leader's largest epoch at most that one with the
/// offset where that epoch ends in its log, or `None` when it has no such epoch. `local_end_for` is the follower's own lookup of the same kind
/// (`end_offset_for_epoch`), `local_end` its log end and `local_first_epoch_start` where the
/// first epoch in its log starts.
///
/// Records of one epoch come from one leader, so where both logs hold an epoch they agree up
/// to the smaller of its two ends; past that, or in an epoch the leader never saw, the
/// follower's records are divergent.
pub fn resolve_divergence(
    leader_answer: Option<(i32, i64)>,
    local_end_for: impl Fn(i32) -> Option<(i32, i64)>,
    local_end: i64,
    local_first_epoch_start: i64,
) -> Divergence {
    let Some((leader_epoch, leader_end)) = leader_answer else {
        // The leader has nothing from our epochs: none of them is shared.
        return Divergence::TruncateTo(local_first_epoch_start.min(local_end));
    };
    match local_end_for(leader_epoch) {
        Some((epoch, end)) if epoch == leader_epoch => {
            Divergence::TruncateTo(leader_end.min(end).min(local_end))
        }
        // We hold only an older epoch than the one the leader named (never a newer one: the
        // lookup returns epochs at most what it is given). Asking again for it strictly
        // lowers the epoch each round, so the search ends.
        Some((epoch, _)) => Divergence::AskAgain(epoch),
        // Every epoch we hold is newer than anything the leader shares.
        None => Divergence::TruncateTo(leader_end.min(local_first_epoch_start).min(local_end)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAG: u64 = 30_000;

    fn leader(isr: &[BrokerId], leo: i64, hw: i64) -> LeaderState {
        LeaderState::new(1, 5, 10, vec![1, 2, 3], isr.to_vec(), leo, hw, 0, LAG)
    }

    #[test]
    fn high_watermark_is_the_smallest_log_end_of_the_isr() {
        let mut l = leader(&[1, 2, 3], 100, 0);
        assert_eq!(l.high_watermark(), 0, "followers have not fetched yet");
        let o = l.on_follower_fetch(2, 80, 100, 1).unwrap();
        assert_eq!(o.high_watermark, None, "follower 3 is still unknown");
        let o = l.on_follower_fetch(3, 60, 100, 2).unwrap();
        assert_eq!(o.high_watermark, Some(60));
        let o = l.on_follower_fetch(3, 100, 100, 3).unwrap();
        assert_eq!(o.high_watermark, Some(80));
    }

    #[test]
    fn high_watermark_never_moves_back() {
        let mut l = leader(&[1, 2], 100, 0);
        l.on_follower_fetch(2, 90, 100, 1).unwrap();
        assert_eq!(l.high_watermark(), 90);
        // A follower restarted after losing its unsynced tail reports less.
        let o = l.on_follower_fetch(2, 50, 100, 2).unwrap();
        assert_eq!(o.high_watermark, None);
        assert_eq!(l.high_watermark(), 90);
    }

    #[test]
    fn a_leader_alone_in_the_isr_commits_its_own_appends() {
        let mut l = leader(&[1], 10, 10);
        assert_eq!(l.on_leader_append(15), Some(15));
        assert_eq!(l.ack_state(14, 1), AckState::Done);
        assert_eq!(l.ack_state(14, 2), AckState::TooFewReplicas);
        assert!(!l.accepts_acks_all(2));
    }

    #[test]
    fn acks_all_waits_for_every_in_sync_replica() {
        let mut l = leader(&[1, 2, 3], 0, 0);
        l.on_leader_append(10);
        assert_eq!(l.ack_state(9, 2), AckState::Pending);
        l.on_follower_fetch(2, 10, 10, 1).unwrap();
        assert_eq!(l.ack_state(9, 2), AckState::Pending, "3 is in the ISR");
        l.on_follower_fetch(3, 10, 10, 1).unwrap();
        assert_eq!(l.ack_state(9, 2), AckState::Done);
    }

    #[test]
    fn a_follower_that_stops_catching_up_is_proposed_out_after_the_lag_time() {
        let mut l = leader(&[1, 2, 3], 0, 0);
        l.on_leader_append(10);
        l.on_follower_fetch(2, 10, 10, 1_000).unwrap();
        l.on_follower_fetch(3, 10, 10, 1_000).unwrap();
        l.on_leader_append(20);
        // 2 keeps fetching but never reaches the end; 3 keeps up.
        for t in (2_000..=31_000).step_by(1_000) {
            l.on_follower_fetch(2, 10, 20 + t as i64, t).unwrap();
            l.on_follower_fetch(3, 20 + t as i64, 20 + t as i64, t)
                .unwrap();
        }
        assert_eq!(l.check_lagging(30_000), None, "not yet past the lag time");
        let change = l.check_lagging(31_001).expect("2 lags");
        assert_eq!(change.isr, vec![1, 3]);
        assert_eq!((change.leader_epoch, change.partition_epoch), (5, 10));
        assert_eq!(l.check_lagging(40_000), None, "one change at a time");
    }

    #[test]
    fn while_a_shrink_is_pending_the_high_watermark_still_counts_the_old_isr() {
        let mut l = leader(&[1, 2, 3], 10, 10);
        l.on_follower_fetch(2, 10, 10, 0).unwrap();
        l.on_follower_fetch(3, 10, 10, 0).unwrap();
        l.on_leader_append(20);
        l.on_follower_fetch(3, 20, 20, 40_000).unwrap();
        let change = l.check_lagging(40_000).unwrap();
        assert_eq!(change.isr, vec![1, 3]);
        assert_eq!(
            l.high_watermark(),
            10,
            "2 is still counted until the change commits"
        );
        let hw = l.on_metadata(11, vec![1, 2, 3], vec![1, 3], BTreeSet::new(), 20, 40_001);
        assert_eq!(hw, Some(20));
        assert_eq!(l.pending_isr(), None);
    }

    #[test]
    fn a_follower_rejoins_once_it_reaches_the_high_watermark_and_the_epoch_start() {
        let mut l = leader(&[1, 3], 50, 40);
        l.on_follower_fetch(3, 50, 50, 0).unwrap();
        assert_eq!(l.high_watermark(), 50);
        let o = l.on_follower_fetch(2, 45, 50, 1).unwrap();
        assert_eq!(o.expand, None, "below the high watermark");
        let o = l.on_follower_fetch(2, 50, 50, 2).unwrap();
        let change = o.expand.expect("caught up");
        assert_eq!(change.isr, vec![1, 3, 2]);
        // While the expansion is pending, the joiner already holds back the high watermark.
        l.on_leader_append(60);
        l.on_follower_fetch(3, 60, 60, 3).unwrap();
        assert_eq!(l.high_watermark(), 50);
    }

    #[test]
    fn a_late_image_with_an_older_partition_epoch_does_not_undo_a_committed_expansion() {
        let mut l = leader(&[1, 3], 50, 50);
        l.on_follower_fetch(3, 50, 50, 0).unwrap();
        let change = l.on_follower_fetch(2, 50, 50, 1).unwrap().expand.unwrap();
        assert_eq!(change.isr, vec![1, 3, 2]);
        // The expansion commits at partition epoch 11; then the image of epoch 10 arrives.
        l.on_metadata(11, vec![1, 2, 3], vec![1, 3, 2], BTreeSet::new(), 50, 2);
        assert_eq!(
            l.on_metadata(10, vec![1, 2, 3], vec![1, 3], BTreeSet::new(), 60, 3),
            None
        );
        assert_eq!(l.isr(), &[1, 3, 2]);
        assert_eq!(l.partition_epoch(), 11);
        // 2 is in the committed ISR: the high watermark waits for it.
        l.on_follower_fetch(3, 60, 60, 4).unwrap();
        assert_eq!(l.high_watermark(), 50);
    }

    #[test]
    fn a_fenced_broker_does_not_rejoin() {
        let mut l = leader(&[1, 3], 50, 50);
        l.on_metadata(10, vec![1, 2, 3], vec![1, 3], BTreeSet::from([2]), 50, 0);
        let o = l.on_follower_fetch(2, 50, 50, 1).unwrap();
        assert_eq!(o.expand, None);
    }

    #[test]
    fn a_fetch_from_a_broker_without_a_replica_is_refused() {
        let mut l = leader(&[1, 2, 3], 0, 0);
        assert_eq!(
            l.on_follower_fetch(7, 0, 0, 0),
            Err(ReplicaError::NotAReplica(7))
        );
    }

    #[test]
    fn a_refused_change_can_be_proposed_again() {
        let mut l = leader(&[1, 2], 0, 0);
        let change = l.check_lagging(LAG + 1).expect("a shrink");
        assert!(l.check_lagging(LAG + 2).is_none());
        assert!(l.on_isr_change_failed(&change));
        assert!(l.check_lagging(LAG + 3).is_some());
    }

    #[test]
    fn a_late_refusal_clears_only_the_change_it_refused_not_a_newer_one() {
        let mut l = leader(&[1, 2], 10, 0);
        let first = l.check_lagging(LAG + 1).expect("shrink of 2");
        assert_eq!(first.isr, vec![1]);
        // The image settles the shrink at partition epoch 11; 2 catches up and is proposed
        // back in at that epoch.
        l.on_metadata(11, vec![1, 2, 3], vec![1], BTreeSet::new(), 10, LAG + 2);
        let second = l
            .on_follower_fetch(2, 10, 10, LAG + 3)
            .unwrap()
            .expand
            .expect("expansion");
        assert_eq!(second.isr, vec![1, 2]);
        // The first proposal's retry is refused late: that says nothing about the second.
        assert!(!l.on_isr_change_failed(&first));
        assert_eq!(l.pending_isr(), Some(&[1, 2][..]));
        // While the expansion is out, the high watermark waits for 2 as well.
        assert_eq!(l.on_leader_append(20), None);
        assert!(l.on_isr_change_failed(&second));
        assert_eq!(l.pending_isr(), None);
    }

    #[test]
    fn the_high_watermark_is_unknown_until_it_reaches_the_epoch_start() {
        let mut l = leader(&[1, 2, 3], 100, 40);
        assert_eq!(l.epoch_start_offset(), 100);
        assert!(!l.high_watermark_known());
        l.on_follower_fetch(2, 100, 100, 1).unwrap();
        assert!(!l.high_watermark_known(), "3 has not fetched");
        l.on_follower_fetch(3, 100, 100, 2).unwrap();
        assert!(l.high_watermark_known());
    }

    /// Epoch lookups over a list of (epoch, start offset) with log end `end`.
    fn lookup(epochs: &'static [(i32, i64)], end: i64) -> impl Fn(i32) -> Option<(i32, i64)> {
        move |e| {
            let i = epochs.iter().rposition(|(ep, _)| *ep <= e)?;
            let next = epochs.get(i + 1).map_or(end, |(_, s)| *s);
            Some((epochs[i].0, next))
        }
    }

    #[test]
    fn same_latest_epoch_truncates_to_the_shorter_end() {
        // Follower: epoch 3 from 0, end 120. Leader: epoch 3 ends at 100 (epoch 4 from 100).
        let d = resolve_divergence(Some((3, 100)), lookup(&[(3, 0)], 120), 120, 0);
        assert_eq!(d, Divergence::TruncateTo(100));
        let d = resolve_divergence(Some((3, 100)), lookup(&[(3, 0)], 90), 90, 0);
        assert_eq!(d, Divergence::TruncateTo(90), "nothing to cut");
    }

    #[test]
    fn an_epoch_the_leader_never_saw_is_cut_whole() {
        // Follower led epoch 4 alone from 100 to 130; the leader went from 3 to 5 at 100.
        let d = resolve_divergence(Some((3, 100)), lookup(&[(3, 0), (4, 100)], 130), 130, 0);
        assert_eq!(d, Divergence::TruncateTo(100));
    }

    #[test]
    fn an_older_shared_epoch_asks_again() {
        // Follower: epochs 1@0, 4@50, end 80. Leader's largest epoch <= 4 is 3 ending at 70;
        // the follower has no 3, so it asks again for 1.
        let d = resolve_divergence(Some((3, 70)), lookup(&[(1, 0), (4, 50)], 80), 80, 0);
        assert_eq!(d, Divergence::AskAgain(1));
        // Leader's epoch 1 ended at 40: the follower's 40..50 of epoch 1 was never committed.
        let d = resolve_divergence(Some((1, 40)), lookup(&[(1, 0), (4, 50)], 80), 80, 0);
        assert_eq!(d, Divergence::TruncateTo(40));
    }

    #[test]
    fn a_leader_with_none_of_our_epochs_cuts_everything() {
        let d = resolve_divergence(None, lookup(&[(2, 10)], 30), 30, 10);
        assert_eq!(d, Divergence::TruncateTo(10));
        let d = resolve_divergence(Some((0, 5)), lookup(&[(2, 10)], 30), 30, 10);
        assert_eq!(d, Divergence::TruncateTo(5));
    }
}
