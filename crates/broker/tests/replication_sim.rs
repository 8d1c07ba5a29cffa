//! Deterministic simulation of one partition on three brokers (RF 3, min.insync.replicas 2)
//! under message loss, delay, reordering, partitions, crashes and power loss, checking the
//! replication invariants after every event. See `sim/mod.rs` for the model.
//!
//! `SPATE_SEEDS=N` runs N seeds per durability mode; `SPATE_SEED=x` runs only seed x.

mod sim;

use std::time::Instant;

use sim::net::{KafkaError, CONSUMER, CONTROLLER, PRODUCER};
use sim::world::{run_seed, run_txn_seed, Config, World};

const DEFAULT_SEEDS: u64 = 64;
/// Events of random faults per seed before everything is healed.
const CHAOS_EVENTS: u64 = 6_000;

fn seeds() -> Vec<u64> {
    if let Some(seed) = std::env::var("SPATE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![seed];
    }
    let n = std::env::var("SPATE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEEDS);
    (0..n).collect()
}

fn run_mode(synced_acks: bool) {
    let started = Instant::now();
    let (mut acked, mut events, mut epochs) = (0, 0, 0);
    let seeds = seeds();
    for &seed in &seeds {
        let s = run_seed(seed, synced_acks, CHAOS_EVENTS);
        if std::env::var_os("SPATE_SIM_VERBOSE").is_some() {
            eprintln!("seed {seed}: {s:?}");
        }
        acked += s.acked;
        events += s.events;
        epochs += s.leader_epochs;
    }
    eprintln!(
        "{} mode: {} seeds, {events} events, {acked} acknowledged records, {epochs} leader epochs, {:?}",
        if synced_acks { "synced-acks" } else { "page-cache" },
        seeds.len(),
        started.elapsed()
    );
    assert!(
        acked > 0,
        "the runs acknowledged nothing: the sim tests nothing"
    );
}

#[test]
fn replication_sim_keeps_every_invariant_over_seeds_in_synced_acks_mode() {
    run_mode(true);
}

#[test]
fn replication_sim_keeps_every_invariant_over_seeds_in_page_cache_mode() {
    run_mode(false);
}

/// Transactions under the same faults: markers replicated like data, the coordinator failing
/// over (a marker sent again under a new coordinator epoch while the old one may still land),
/// fencing markers after failed writes; read_committed sees exactly the committed ones.
#[test]
fn replication_sim_keeps_transactions_atomic_through_faults_and_coordinator_failover() {
    let started = Instant::now();
    let (mut acked, mut events, mut consumed) = (0, 0, 0);
    let seeds = seeds();
    for &seed in &seeds {
        let s = run_txn_seed(seed, seed % 2 == 0, CHAOS_EVENTS);
        acked += s.acked;
        events += s.events;
        consumed += s.consumed;
    }
    eprintln!(
        "transactions: {} seeds, {events} events, {acked} acknowledged records, {consumed} records read committed, {:?}",
        seeds.len(),
        started.elapsed()
    );
    assert!(acked > 0 && consumed > 0, "the runs tested nothing");
}

#[test]
fn an_isolated_leader_cannot_acknowledge_and_truncates_after_heal() {
    let mut w = World::new(Config::calm(11, false));
    w.run_for(1_000);
    let acked_before = w.producer.acked.len();
    assert!(
        acked_before > 10,
        "only {acked_before} acks before the fault"
    );
    let old = w.image_leader().expect("a leader");
    // The leader loses the other brokers and the controller. The clients stay on its side
    // and cannot reach the controller either, so they keep talking to it.
    w.isolate(old, false);
    w.cut(PRODUCER, CONTROLLER);
    w.cut(CONSUMER, CONTROLLER);
    let end_at_cut = w.brokers[&old].log.end() as usize;
    w.run_for(2_000);
    assert_eq!(
        w.producer.acked.len(),
        acked_before,
        "an isolated leader acknowledged a produce"
    );
    let stranded: Vec<u64> = w.brokers[&old].log.records()[end_at_cut..]
        .iter()
        .map(|r| r.payload)
        .collect();
    assert!(
        !stranded.is_empty(),
        "the isolated leader should have appended records it could not commit"
    );
    let new = w.image_leader().expect("a new leader");
    assert_ne!(
        new, old,
        "the controller should have replaced the isolated leader"
    );
    // Once the producer learns the new leader, acknowledgements resume there.
    w.links.heal(PRODUCER, CONTROLLER);
    w.run_for(1_000);
    assert!(w.producer.acked.len() > acked_before);
    w.settle();
    w.final_check();
    for b in w.brokers.values() {
        let held: Vec<u64> = b
            .log
            .records()
            .iter()
            .map(|r| r.payload)
            .filter(|p| stranded.contains(p))
            .collect();
        assert!(
            held.is_empty(),
            "broker {} still holds the isolated leader's uncommitted {held:?}",
            b.id
        );
    }
}

#[test]
fn a_follower_that_lost_its_unsynced_tail_rejoins_without_losing_acknowledged_records() {
    let mut w = World::new(Config::calm(12, true));
    w.run_for(1_000);
    let leader = w.image_leader().expect("a leader");
    let f = sim::BROKERS
        .into_iter()
        .find(|&b| b != leader)
        .expect("a follower");
    // Wait for a moment when the follower holds fetched records it has not synced yet.
    let caught = w.run_until(20_000, |w| {
        let log = &w.brokers[&f].log;
        log.end() > log.synced_end()
    });
    assert!(caught, "the follower never held an unsynced tail");
    let acked_before = w.producer.acked.len();
    let log = &w.brokers[&f].log;
    let (end, synced) = (log.end(), log.synced_end());
    w.power_loss(f, false);
    assert!(synced < end);
    w.run_for(1_000);
    assert!(
        !w.image_isr().contains(&f),
        "the dead follower should have left the ISR"
    );
    w.restart(f);
    // The recovered log is what was on disk: the unsynced tail is gone.
    assert_eq!(w.brokers[&f].log.end(), synced, "the unsynced tail is gone");
    w.run_for(2_000);
    assert!(
        w.image_isr().contains(&f),
        "the follower should be back in the ISR"
    );
    assert!(w.producer.acked.len() > acked_before);
    w.settle();
    w.final_check();
}

#[test]
fn min_isr_refuses_acks_all_with_two_brokers_down() {
    let mut w = World::new(Config::calm(13, false));
    w.run_for(1_000);
    let leader = w.image_leader().expect("a leader");
    let followers: Vec<i32> = sim::BROKERS.into_iter().filter(|&b| b != leader).collect();
    for &f in &followers {
        w.crash(f);
    }
    w.run_for(1_000);
    assert_eq!(w.image_isr(), vec![leader], "the ISR shrinks to the leader");
    let acked = w.producer.acked.len();
    let refused = w.producer.error_count(KafkaError::NotEnoughReplicas);
    w.run_for(1_000);
    assert_eq!(
        w.producer.acked.len(),
        acked,
        "acks=all acknowledged with one replica"
    );
    assert!(
        w.producer.error_count(KafkaError::NotEnoughReplicas) > refused,
        "produces should be refused with NOT_ENOUGH_REPLICAS"
    );
    for &f in &followers {
        w.restart(f);
    }
    w.run_for(2_000);
    assert!(
        w.producer.acked.len() > acked,
        "acks resume once the replicas are back"
    );
    w.settle();
    w.final_check();
}

#[test]
fn every_broker_losing_power_at_once_keeps_every_acknowledged_record_with_synced_acks() {
    let mut w = World::new(Config::calm(14, true));
    w.run_for(1_000);
    assert!(w.producer.acked.len() > 10);
    for b in sim::BROKERS {
        w.power_loss(b, false);
    }
    w.run_for(200);
    for b in sim::BROKERS {
        w.restart(b);
    }
    w.run_for(2_000);
    w.settle();
    w.final_check();
}

#[test]
fn a_restarted_leader_does_not_resume_its_epoch_with_a_shorter_log() {
    let mut w = World::new(Config::calm(15, true));
    w.run_for(1_000);
    let leader = w.image_leader().expect("a leader");
    // Wait until a follower holds records the leader has not synced yet.
    let caught = w.run_until(50_000, |w| {
        let synced = w.brokers[&leader].log.synced_end();
        w.brokers
            .values()
            .any(|b| b.id != leader && b.log.end() > synced)
    });
    assert!(caught, "no follower ever got ahead of the leader's disk");
    w.power_loss(leader, false);
    // Back before the session timeout: the image still names the old process leader.
    w.run_for(20);
    w.restart(leader);
    w.run_for(2_000);
    w.settle();
    w.final_check();
}

#[test]
fn a_follower_cut_off_from_its_leader_alone_leaves_the_isr_and_acks_continue() {
    let mut w = World::new(Config::calm(16, false));
    w.run_for(1_000);
    let leader = w.image_leader().expect("a leader");
    let f = sim::BROKERS
        .into_iter()
        .find(|&b| b != leader)
        .expect("a follower");
    assert_eq!(
        w.image_isr().len(),
        3,
        "every replica in sync before the cut"
    );
    // The follower still heartbeats to the controller (it is not fenced); only the leader
    // sees that it stopped fetching.
    w.cut(leader, f);
    w.run_for(1_500);
    assert!(
        !w.image_isr().contains(&f),
        "the leader should have dropped the follower that stopped fetching: ISR {:?}",
        w.image_isr()
    );
    let acked = w.producer.acked.len();
    w.run_for(1_000);
    assert!(
        w.producer.acked.len() > acked,
        "acks=all should go on with the two replicas left in sync"
    );
    w.heal_all();
    w.run_for(2_000);
    assert!(
        w.image_isr().contains(&f),
        "the follower should be back in the ISR"
    );
    w.settle();
    w.final_check();
}
