//! The world: nodes, the event queue, the network and its faults, and the invariant check
//! after every event.

use std::collections::{BTreeMap, VecDeque};

use spate_cluster::metadata::BrokerId;

use super::broker::Broker;
use super::check::Checker;
use super::clients::{Consumer, Producer};
use super::controller::Controller;
use super::net::{Event, Links, Msg, NodeId, Out, Queue, Timer, CONSUMER, CONTROLLER, PRODUCER};
use super::rng::Rng;
use super::*;

/// The world's own timers (faults and heals) run on this node.
pub const WORLD: NodeId = -1;
const TRACE_LEN: usize = 50;
/// Every this many events the checker's views are compared with the logs on the disks.
const VERIFY_EVERY: u64 = 500;
/// Bound on the events the heal-and-settle phase may take.
const SETTLE_MAX_EVENTS: u64 = 60_000;

#[derive(Clone, Debug)]
pub struct Config {
    pub seed: u64,
    /// Mode A ("synced acks", power loss allowed) when true; mode B ("page cache", process
    /// crashes only) when false.
    pub synced_acks: bool,
    /// Random faults every few hundred ms.
    pub chaos: bool,
    pub loss_per_mille: u64,
    pub slow_per_mille: u64,
    pub slow_max_ms: u64,
    /// How long a leader waits for an answer to an ISR change before asking again: below
    /// the image publication period, retries race the image that settles the change.
    pub alter_isr_retry_ms: u64,
    /// Chance that an answer to an ISR change is delivered twice.
    pub duplicate_isr_answers_per_mille: u64,
    /// The producer writes transactions (and its coordinator their markers); the consumer
    /// reads committed.
    pub txn: bool,
}

impl Config {
    /// Random faults, lossy and reordering network.
    pub fn chaos(seed: u64, synced_acks: bool) -> Self {
        let mut rng = Rng::new(seed.wrapping_mul(31));
        Config {
            seed,
            synced_acks,
            chaos: true,
            loss_per_mille: rng.range(0, 50),
            slow_per_mille: rng.range(0, 200),
            slow_max_ms: rng.range(10, 150),
            alter_isr_retry_ms: if rng.chance(500) {
                rng.range(20, PUBLISH_MS)
            } else {
                ALTER_ISR_RETRY_MS
            },
            duplicate_isr_answers_per_mille: rng.range(0, 300),
            txn: false,
        }
    }

    /// No random faults and no loss: for scripted scenarios.
    pub fn calm(seed: u64, synced_acks: bool) -> Self {
        Config {
            seed,
            synced_acks,
            chaos: false,
            loss_per_mille: 0,
            slow_per_mille: 0,
            slow_max_ms: 10,
            alter_isr_retry_ms: ALTER_ISR_RETRY_MS,
            duplicate_isr_answers_per_mille: 0,
            txn: false,
        }
    }
}

/// What one run did, for deep-run reports.
#[derive(Debug, Default, Clone, Copy)]
pub struct Summary {
    pub events: u64,
    pub sim_ms: u64,
    pub sent: u64,
    pub acked: usize,
    pub committed: usize,
    pub leader_epochs: usize,
    pub chaos_ms: u64,
    pub consumed: usize,
}

pub struct World {
    pub cfg: Config,
    rng: Rng,
    pub now: u64,
    pub step: u64,
    queue: Queue,
    pub links: Links,
    pub brokers: BTreeMap<BrokerId, Broker>,
    pub controller: Controller,
    pub producer: Producer,
    pub consumer: Consumer,
    pub checker: Checker,
    trace: VecDeque<String>,
    chaos_on: bool,
    /// Brokers that hear no image until the given time.
    blackouts: BTreeMap<BrokerId, u64>,
}

impl World {
    pub fn new(cfg: Config) -> Self {
        let (controller, epochs) = Controller::new(&BROKERS);
        let mut w = World {
            rng: Rng::new(cfg.seed),
            now: 0,
            step: 0,
            queue: Queue::default(),
            links: Links::new(cfg.loss_per_mille, cfg.slow_per_mille, cfg.slow_max_ms),
            brokers: BTreeMap::new(),
            controller,
            producer: Producer::default(),
            consumer: Consumer::default(),
            checker: Checker::default(),
            trace: VecDeque::new(),
            chaos_on: cfg.chaos,
            blackouts: BTreeMap::new(),
            cfg,
        };
        let mut out = Out::default();
        w.controller.start(&mut out);
        w.apply_out(CONTROLLER, 0, out);
        for id in BROKERS {
            let mut b = Broker::new(id, w.cfg.synced_acks, w.cfg.alter_isr_retry_ms);
            b.set_broker_epoch(epochs[&id]);
            let mut out = Out::default();
            b.start(&mut out);
            w.brokers.insert(id, b);
            w.apply_out(id, 0, out);
        }
        if w.cfg.txn {
            w.producer.txn = Some(Default::default());
            w.consumer = Consumer::read_committed();
        }
        let mut out = Out::default();
        w.producer.start(&mut out);
        w.apply_out(PRODUCER, 0, out);
        let mut out = Out::default();
        w.consumer.start(&mut out);
        w.apply_out(CONSUMER, 0, out);
        if w.chaos_on {
            w.queue.push(
                300,
                Event::Timer {
                    node: WORLD,
                    incarnation: 0,
                    timer: Timer::Chaos,
                },
            );
        }
        w
    }

    /// The leader the controller's image names.
    pub fn image_leader(&self) -> Option<BrokerId> {
        self.controller
            .image
            .partition(TOPIC, 0)
            .and_then(|p| p.leader)
    }

    pub fn image_isr(&self) -> Vec<BrokerId> {
        self.controller
            .image
            .partition(TOPIC, 0)
            .map(|p| p.isr.clone())
            .unwrap_or_default()
    }

    fn note(&mut self, line: String) {
        if self.trace.len() == TRACE_LEN {
            self.trace.pop_front();
        }
        self.trace
            .push_back(format!("  #{} t={} {line}", self.step, self.now));
    }

    /// Stops the run with everything needed to replay it.
    pub fn fail(&self, what: &str) -> ! {
        let trace: Vec<&str> = self.trace.iter().map(String::as_str).collect();
        panic!(
            "replication sim: {what}\n  seed {} ({} mode), step {}, t={} ms; replay with SPATE_SEED={}\n  last events:\n{}",
            self.cfg.seed,
            if self.cfg.synced_acks { "synced-acks" } else { "page-cache" },
            self.step,
            self.now,
            self.cfg.seed,
            trace.join("\n")
        );
    }

    fn apply_out(&mut self, node: NodeId, incarnation: u64, out: Out) {
        for (to, to_incarnation, msg) in out.sends {
            if self.rng.chance(self.links.loss_per_mille) {
                continue;
            }
            let delay = if self.rng.chance(self.links.slow_per_mille) {
                self.rng.range(5, self.links.slow_max_ms.max(5))
            } else {
                self.rng.range(1, 4)
            };
            if matches!(msg, Msg::AlterIsrResult { .. })
                && self.rng.chance(self.cfg.duplicate_isr_answers_per_mille)
            {
                // The same answer twice, the copy possibly overtaking the original or
                // arriving after the leader asked again.
                let again = self.rng.range(1, 400);
                self.queue.push(
                    self.now + again,
                    Event::Deliver {
                        from: node,
                        from_incarnation: incarnation,
                        to,
                        to_incarnation,
                        msg: msg.clone(),
                    },
                );
            }
            self.queue.push(
                self.now + delay,
                Event::Deliver {
                    from: node,
                    from_incarnation: incarnation,
                    to,
                    to_incarnation,
                    msg,
                },
            );
        }
        for (delay, timer) in out.timers {
            self.queue.push(
                self.now + delay,
                Event::Timer {
                    node,
                    incarnation,
                    timer,
                },
            );
        }
        if let Some(v) = out.violations.first() {
            self.fail(v);
        }
        for (epoch, _) in out.appended {
            if let Err(e) = self.checker.on_append(node, epoch, &self.controller) {
                self.fail(&e);
            }
        }
        // The acknowledgements and reads are judged against the committed history as of the
        // previous check, which already saw the high watermarks they came from.
        for (payload, offset) in out.acked {
            if let Err(e) = self.checker.on_acked(payload, offset) {
                self.fail(&e);
            }
        }
        for rec in out.consumed {
            if let Err(e) = self.checker.on_consumed(rec) {
                self.fail(&e);
            }
        }
    }

    /// Runs one event and checks every invariant. False when nothing is left to run.
    pub fn step(&mut self) -> bool {
        let Some((at, event)) = self.queue.pop() else {
            return false;
        };
        self.now = at;
        self.step += 1;
        let now = self.now;
        let mut out = Out::default();
        let (node, incarnation) = match event {
            Event::Deliver {
                from,
                from_incarnation,
                to,
                to_incarnation,
                msg,
            } => {
                let summary = msg.summary();
                if self.links.is_cut(from, to) {
                    self.note(format!("{from}->{to} cut: {summary}"));
                    return true;
                }
                match to {
                    CONTROLLER => {
                        self.note(format!("{from}->C {summary}"));
                        self.controller
                            .handle(now, from, from_incarnation, msg, &mut out);
                        (CONTROLLER, 0)
                    }
                    PRODUCER => {
                        self.note(format!("{from}->producer {summary}"));
                        let next = self.rng.range(1, 10);
                        self.producer.handle(msg, &mut out, next);
                        (PRODUCER, 0)
                    }
                    CONSUMER => {
                        self.consumer.handle(msg, &mut out);
                        (CONSUMER, 0)
                    }
                    b => {
                        let Some(broker) = self.brokers.get_mut(&b) else {
                            return true;
                        };
                        let live =
                            broker.up && to_incarnation.is_none_or(|i| i == broker.incarnation);
                        if !live {
                            self.note(format!("{from}->{to} dropped (process gone): {summary}"));
                            return true;
                        }
                        let dark = self.blackouts.get(&b).is_some_and(|&until| now < until);
                        if dark && matches!(msg, Msg::Image { .. }) {
                            self.note(format!("{from}->{to} dropped (image blackout): {summary}"));
                            return true;
                        }
                        let inc = broker.incarnation;
                        broker.handle(now, from, from_incarnation, msg, &mut out);
                        let refreshed = broker.refresh_view();
                        self.note(format!("{from}->{to} {summary}"));
                        if let Err(e) = refreshed {
                            self.fail(&e);
                        }
                        (b, inc)
                    }
                }
            }
            Event::Timer {
                node,
                incarnation,
                timer,
            } => {
                match node {
                    WORLD => {
                        self.world_timer(timer);
                        return true;
                    }
                    CONTROLLER => self.controller.timer(now, timer, &mut out),
                    PRODUCER => self.producer.timer(timer, &mut out),
                    CONSUMER => self.consumer.timer(timer, &mut out),
                    b => {
                        let Some(broker) = self.brokers.get_mut(&b) else {
                            return true;
                        };
                        if !broker.up || broker.incarnation != incarnation {
                            return true;
                        }
                        broker.timer(now, timer, &mut out);
                        if let Err(e) = broker.refresh_view() {
                            self.fail(&e);
                        }
                    }
                }
                if !matches!(timer, Timer::ConsumerPoll | Timer::Flush) {
                    self.note(format!("{node} timer {timer:?}"));
                }
                (node, incarnation)
            }
        };
        self.check();
        self.apply_out(node, incarnation, out);
        true
    }

    fn check(&mut self) {
        if self.step.is_multiple_of(VERIFY_EVERY) {
            self.verify_views();
        }
        if let Err(e) =
            self.checker
                .check(&mut self.brokers, &self.controller, self.cfg.synced_acks)
        {
            self.fail(&e);
        }
        if self.cfg.txn {
            if let Err(e) = super::check::txn_step(&self.brokers, &self.producer, &self.consumer) {
                self.fail(&e);
            }
        }
    }

    /// Runs every event up to `ms` from now (bounded by the events that fit in that time).
    pub fn run_for(&mut self, ms: u64) {
        let until = self.now + ms;
        // Far more than any run produces per ms; a runaway feedback loop stops here.
        let max_steps = ms.saturating_mul(100).max(1_000);
        for _ in 0..max_steps {
            match self.queue.peek_time() {
                Some(t) if t <= until => {
                    self.step();
                }
                _ => {
                    self.now = self.now.max(until);
                    return;
                }
            }
        }
        self.fail(&format!("more than {max_steps} events in {ms} ms"));
    }

    /// Runs until `done` holds (checked between events), at most `max_steps` events.
    pub fn run_until(&mut self, max_steps: u64, mut done: impl FnMut(&World) -> bool) -> bool {
        for _ in 0..max_steps {
            if done(self) {
                return true;
            }
            if !self.step() {
                return false;
            }
        }
        done(self)
    }

    // ---- faults ----

    fn world_timer(&mut self, timer: Timer) {
        match timer {
            Timer::Chaos => self.chaos(),
            Timer::Heal { link: (a, b) } => {
                self.note(format!("heal {a}-{b}"));
                self.links.heal(a, b);
            }
            Timer::Restart { broker } => self.restart(broker),
            _ => {}
        }
    }

    fn later(&mut self, delay_ms: u64, timer: Timer) {
        self.queue.push(
            self.now + delay_ms,
            Event::Timer {
                node: WORLD,
                incarnation: 0,
                timer,
            },
        );
    }

    pub fn crash(&mut self, id: BrokerId) {
        self.note(format!("CRASH broker {id}"));
        if let Some(b) = self.brokers.get_mut(&id) {
            b.crash();
        }
    }

    /// Power loss: the unsynced bytes are lost; `torn` keeps a seeded prefix of them (the
    /// page cache wrote some back), cutting the last write anywhere.
    pub fn power_loss(&mut self, id: BrokerId, torn: bool) {
        let seed = self.rng.range(1, u64::MAX / 2);
        self.note(format!("POWER LOSS broker {id} (torn: {torn})"));
        if let Some(b) = self.brokers.get_mut(&id) {
            b.power_loss(super::broker::tear(torn, seed));
        }
    }

    /// An image blackout: `id` hears no image for `ms` (its heartbeats still go through, so
    /// it stays registered and unfenced while its world goes stale).
    pub fn blackout(&mut self, id: BrokerId, ms: u64) {
        self.note(format!("IMAGE BLACKOUT broker {id} for {ms} ms"));
        self.blackouts.insert(id, self.now + ms);
    }

    pub fn restart(&mut self, id: BrokerId) {
        let Some(b) = self.brokers.get_mut(&id) else {
            return;
        };
        if b.up {
            return;
        }
        let mut out = Out::default();
        b.restart(&mut out);
        let inc = b.incarnation;
        self.note(format!("RESTART broker {id} (process {inc})"));
        self.apply_out(id, inc, out);
    }

    /// Cuts `id` off from the other brokers and the controller (and the clients too when
    /// `clients`).
    pub fn isolate(&mut self, id: BrokerId, clients: bool) -> Vec<(NodeId, NodeId)> {
        self.note(format!("ISOLATE broker {id} (clients too: {clients})"));
        let mut others: Vec<NodeId> = BROKERS.iter().copied().filter(|&b| b != id).collect();
        others.push(CONTROLLER);
        if clients {
            others.extend([PRODUCER, CONSUMER]);
        }
        others
            .into_iter()
            .map(|o| {
                self.links.cut(id, o);
                (id, o)
            })
            .collect()
    }

    pub fn cut(&mut self, a: NodeId, b: NodeId) {
        self.note(format!("CUT {a}-{b}"));
        self.links.cut(a, b);
    }

    pub fn heal_all(&mut self) {
        self.note("HEAL all".to_owned());
        self.links.heal_all();
    }

    fn chaos(&mut self) {
        if !self.chaos_on {
            return;
        }
        let b = self.rng.pick(&BROKERS);
        let up = self.brokers[&b].up;
        let roll = self.rng.range(0, 99);
        match roll {
            0..=17 if up => {
                self.crash(b);
                let d = self.rng.range(50, 1500);
                self.later(d, Timer::Restart { broker: b });
            }
            18..=31 if up && self.cfg.synced_acks => {
                let torn = self.rng.chance(500);
                self.power_loss(b, torn);
                let d = self.rng.range(50, 1500);
                self.later(d, Timer::Restart { broker: b });
            }
            32..=34 if self.cfg.synced_acks => {
                // The whole rack goes dark.
                for id in BROKERS {
                    if self.brokers[&id].up {
                        let torn = self.rng.chance(500);
                        self.power_loss(id, torn);
                    }
                    let d = self.rng.range(50, 1000);
                    self.later(d, Timer::Restart { broker: id });
                }
            }
            35..=54 => {
                let clients = self.rng.chance(500);
                let d = self.rng.range(100, 2000);
                for link in self.isolate(b, clients) {
                    self.later(d, Timer::Heal { link });
                }
            }
            55..=69 => {
                let nodes = [CONTROLLER, 1, 2, 3, PRODUCER, CONSUMER];
                let a = self.rng.pick(&nodes);
                let c = self.rng.pick(&nodes);
                if a != c {
                    self.cut(a, c);
                    let d = self.rng.range(100, 2000);
                    self.later(d, Timer::Heal { link: (a, c) });
                }
            }
            70..=74 => self.heal_all(),
            75..=80 if up => {
                let d = self.rng.range(100, 1500);
                self.blackout(b, d);
            }
            85..=89 if up && self.cfg.synced_acks => {
                let d = self.rng.range(50, 800);
                self.note(format!("SLOW DISK broker {b} for {d} ms"));
                let until = self.now + d;
                if let Some(broker) = self.brokers.get_mut(&b) {
                    broker.slow_disk(until);
                }
            }
            81..=84 if up => {
                // Back before any image arrives: the new process must not act on its
                // predecessor's world.
                self.crash(b);
                let d = self.rng.range(1, 10);
                self.later(d, Timer::Restart { broker: b });
            }
            _ => {}
        }
        let next = self.rng.range(100, 700);
        self.later(next, Timer::Chaos);
    }

    // ---- whole runs ----

    /// Stops the faults, heals the network, restarts every broker and stops producing; then
    /// runs until all replicas agree (bounded).
    pub fn settle(&mut self) {
        self.chaos_on = false;
        self.links.heal_all();
        self.links.loss_per_mille = 0;
        self.links.slow_per_mille = 0;
        self.producer.producing = false;
        self.note("SETTLE: heal all, restart all, stop producing".to_owned());
        for id in BROKERS {
            self.restart(id);
        }
        if !self.run_until(SETTLE_MAX_EVENTS, World::settled) {
            self.fail("did not settle after healing everything");
        }
    }

    /// One leader with every replica in its ISR, every log equal, everything committed.
    pub fn settled(&self) -> bool {
        let Some(p) = self.controller.image.partition(TOPIC, 0) else {
            return false;
        };
        let Some(l) = p.leader else { return false };
        let leader = &self.brokers[&l];
        let leads = leader
            .leading()
            .is_some_and(|(epoch, _, isr)| epoch == p.leader_epoch && isr.len() == 3);
        let txn_done = self.producer.txn.as_ref().is_none_or(|t| t.is_done())
            && (!self.consumer.committed || self.consumer.position() == leader.log.end());
        leads
            && p.isr.len() == 3
            && self.producer.is_idle()
            && txn_done
            && self.brokers.values().all(|b| {
                b.up && b.log.records() == leader.log.records() && b.hw() == leader.log.end()
            })
    }

    /// Re-reads every live broker's whole log: the incremental views did not drift.
    fn verify_views(&self) {
        for b in self.brokers.values() {
            if let Err(e) = b.verify_view() {
                self.fail(&format!("broker {}: {e}", b.id));
            }
        }
    }

    pub fn final_check(&self) {
        self.verify_views();
        if let Err(e) = self.checker.final_check(&self.brokers) {
            self.fail(&e);
        }
        if let Some(t) = &self.producer.txn {
            if let Err(e) = self
                .checker
                .final_txn_check(&self.brokers, t, &self.consumer)
            {
                self.fail(&e);
            }
        }
    }

    pub fn summary(&self) -> Summary {
        Summary {
            events: self.step,
            sim_ms: self.now,
            sent: self.producer.sent,
            acked: self.checker.acked.len(),
            committed: self.checker.committed.len(),
            leader_epochs: self.controller.epoch_leaders.len(),
            chaos_ms: 0,
            consumed: self.checker.consumed.len(),
        }
    }
}

/// One seed: `chaos_events` events of random faults, then heal, settle and the final check.
pub fn run_seed(seed: u64, synced_acks: bool, chaos_events: u64) -> Summary {
    run_config(Config::chaos(seed, synced_acks), chaos_events)
}

/// [`run_seed`] with transactions.
pub fn run_txn_seed(seed: u64, synced_acks: bool, chaos_events: u64) -> Summary {
    let mut cfg = Config::chaos(seed, synced_acks);
    cfg.txn = true;
    run_config(cfg, chaos_events)
}

fn run_config(cfg: Config, chaos_events: u64) -> Summary {
    let seed = cfg.seed;
    let mut w = World::new(cfg);
    for _ in 0..chaos_events {
        if !w.step() {
            break;
        }
    }
    let chaos_ms = w.now;
    if std::env::var_os("SPATE_SIM_VERBOSE").is_some() {
        eprintln!("seed {seed} producer errors: {:?}", w.producer.errors);
    }
    w.settle();
    w.final_check();
    Summary {
        chaos_ms,
        ..w.summary()
    }
}
