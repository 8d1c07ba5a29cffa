//! The active controller: the authoritative `MetadataImage`, changed only through its real
//! `apply`, and the real liveness and election decisions. It never crashes (the quorum is
//! tested elsewhere); brokers see its image only through delayed, lossy messages.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use spate_cluster::controller::{create_topic_command, reconcile, LivenessTracker, PassOptions};
use spate_cluster::metadata::{BrokerId, MetadataCommand, MetadataImage};
use uuid::Uuid;

use super::broker::incarnation_uuid;
use super::net::{Msg, NodeId, Out, Timer, CONSUMER, PRODUCER};
use super::*;

pub struct Controller {
    pub image: MetadataImage,
    /// Publication number of the image, so receivers can drop one that arrives late.
    pub version: u64,
    tracker: LivenessTracker,
    /// Who each leader epoch was given to (None: the partition went offline).
    pub epoch_leaders: BTreeMap<i32, Option<BrokerId>>,
}

impl Controller {
    /// Registers the brokers and creates the topic; returns each broker's registration epoch.
    pub fn new(brokers: &[BrokerId]) -> (Self, BTreeMap<BrokerId, i64>) {
        let mut image = MetadataImage::new();
        let mut epochs = BTreeMap::new();
        for &id in brokers {
            let cmd = register(id, incarnation_uuid(id, 0), 0);
            match image.apply(&cmd) {
                Ok(spate_cluster::metadata::CommandOutcome::BrokerRegistered { broker_epoch }) => {
                    epochs.insert(id, broker_epoch);
                }
                other => panic!("initial registration of broker {id}: {other:?}"),
            }
        }
        let configs = BTreeMap::from([("min.insync.replicas".to_owned(), MIN_ISR.to_string())]);
        let create = create_topic_command(&image, TOPIC, Uuid::from_u128(7), 1, 3, configs)
            .expect("topic placement");
        image.apply(&create).expect("topic creation");
        let mut c = Controller {
            image,
            version: 0,
            tracker: LivenessTracker::new(),
            epoch_leaders: BTreeMap::new(),
        };
        c.tracker.observe(&c.image, 0);
        c.record_epoch(&mut Vec::new());
        (c, epochs)
    }

    pub fn start(&mut self, out: &mut Out) {
        out.timer(0, Timer::Publish);
        out.timer(CONTROLLER_TICK_MS, Timer::ControllerTick);
    }

    pub fn handle(&mut self, now: u64, from: NodeId, from_inc: u64, msg: Msg, out: &mut Out) {
        match msg {
            Msg::Register { incarnation } => {
                let result = self
                    .image
                    .apply(&register(from, Uuid::from_u128(incarnation), now));
                let answer = match &result {
                    Ok(spate_cluster::metadata::CommandOutcome::BrokerRegistered {
                        broker_epoch,
                    }) => Ok(*broker_epoch),
                    other => Err(format!("{other:?}")),
                };
                out.send(from, Some(from_inc), Msg::RegisterResult { result: answer });
                if result.is_ok() {
                    self.changed(out);
                }
            }
            Msg::Heartbeat { broker_epoch } => {
                // A stale registration's heartbeat is refused by apply; nothing to answer.
                let _ = self.image.apply(&MetadataCommand::BrokerHeartbeat {
                    broker_id: from,
                    broker_epoch,
                    now_ms: now,
                    shutting_down: false,
                });
            }
            Msg::AlterIsr { change } => {
                let result = self
                    .image
                    .apply(&MetadataCommand::AlterIsr {
                        topic: TOPIC.to_owned(),
                        partition: 0,
                        leader: from,
                        leader_epoch: change.leader_epoch,
                        partition_epoch: change.partition_epoch,
                        isr: change.isr.clone(),
                    })
                    .map(|_| ());
                let ok = result.is_ok();
                out.send(from, Some(from_inc), Msg::AlterIsrResult { change, result });
                if ok {
                    self.changed(out);
                }
            }
            _ => {}
        }
    }

    pub fn timer(&mut self, now: u64, timer: Timer, out: &mut Out) {
        match timer {
            Timer::ControllerTick => {
                self.tracker.observe(&self.image, now);
                let cmds = reconcile(
                    &self.image,
                    &self.tracker,
                    now,
                    SESSION_TIMEOUT_MS,
                    PassOptions::default(),
                );
                if !cmds.is_empty() {
                    match self.image.apply(&MetadataCommand::Batch(cmds)) {
                        Ok(_) => self.changed(out),
                        Err(e) => out
                            .violations
                            .push(format!("reconcile's batch did not apply: {e}")),
                    }
                }
                out.timer(CONTROLLER_TICK_MS, Timer::ControllerTick);
            }
            Timer::Publish => {
                // Re-sent now and then so a lost image is not the last word.
                self.publish(out);
                out.timer(PUBLISH_MS, Timer::Publish);
            }
            _ => {}
        }
    }

    fn changed(&mut self, out: &mut Out) {
        self.record_epoch(&mut out.violations);
        self.publish(out);
    }

    fn record_epoch(&mut self, violations: &mut Vec<String>) {
        if let Some(p) = self.image.partition(TOPIC, 0) {
            let prev = self.epoch_leaders.insert(p.leader_epoch, p.leader);
            if prev.is_some_and(|prev| prev != p.leader) {
                violations.push(format!(
                    "leader epoch {} given to {:?} and then {:?}",
                    p.leader_epoch, prev, p.leader
                ));
            }
        }
    }

    fn publish(&mut self, out: &mut Out) {
        self.version += 1;
        let image = Rc::new(self.image.clone());
        let to: BTreeSet<NodeId> = self
            .image
            .brokers()
            .keys()
            .copied()
            .chain([PRODUCER, CONSUMER])
            .collect();
        for node in to {
            out.send(
                node,
                None,
                Msg::Image {
                    version: self.version,
                    image: Rc::clone(&image),
                },
            );
        }
    }
}

fn register(id: BrokerId, incarnation: Uuid, now: u64) -> MetadataCommand {
    MetadataCommand::RegisterBroker {
        broker_id: id,
        incarnation,
        inter_node_addr: format!("b{id}:9093"),
        kafka_host: format!("b{id}"),
        kafka_port: 9092,
        rack: None,
        http_addr: None,
        now_ms: now,
        listeners: vec![],
    }
}
