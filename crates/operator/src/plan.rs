//! Decisions (pure): what the StatefulSet's replicas and update partition should be, which
//! spate operation comes next when scaling, and how a declared topic differs from spate's.
//! The reconcilers gather observations, call these, and carry out what they return.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// What spate's admin API (`GET /admin/cluster`) says about the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpateView {
    /// Registered brokers: id -> decommissioning.
    pub nodes: BTreeMap<u64, NodeState>,
    /// Members of the metadata quorum (voters and learners).
    pub quorum_members: BTreeSet<u64>,
    /// The controller's node id.
    pub controller: Option<i64>,
    /// Partitions whose ISR is smaller than their replica set.
    pub under_replicated: i64,
    /// Partitions without a leader.
    pub offline: i64,
    /// Partitions being moved.
    pub reassigning: i64,
    /// The largest replication factor of any topic.
    pub max_replication_factor: i32,
    /// Replication factor per topic (of its first partition).
    pub topic_rf: BTreeMap<String, i32>,
}

/// One registered broker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeState {
    /// Being emptied before leaving.
    pub decommissioning: bool,
    /// Fenced by the controller (no heartbeat).
    pub fenced: bool,
}

impl SpateView {
    /// Reads `GET /admin/cluster`'s JSON; `None` when it is not that shape.
    pub fn parse(v: &Value) -> Option<Self> {
        let mut view = SpateView {
            controller: v.get("controller").and_then(Value::as_i64),
            under_replicated: v.get("under_replicated_partitions")?.as_i64()?,
            offline: v
                .get("offline_partitions")
                .and_then(Value::as_i64)
                .unwrap_or(0),
            reassigning: v
                .get("reassigning_partitions")
                .and_then(Value::as_i64)
                .unwrap_or(0),
            ..Default::default()
        };
        for n in v.get("nodes")?.as_array()? {
            let Some(id) = n.get("id").and_then(Value::as_u64) else {
                continue;
            };
            view.nodes.insert(
                id,
                NodeState {
                    decommissioning: n
                        .get("decommissioning")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                    fenced: n.get("fenced").and_then(Value::as_bool).unwrap_or(false),
                },
            );
        }
        if let Some(m) = v.get("quorum_members").and_then(Value::as_array) {
            view.quorum_members = m.iter().filter_map(Value::as_u64).collect();
        }
        if let Some(ps) = v.get("partitions").and_then(Value::as_array) {
            for p in ps {
                let rf = p
                    .get("replicas")
                    .and_then(Value::as_array)
                    .map_or(0, |r| r.len() as i32);
                view.max_replication_factor = view.max_replication_factor.max(rf);
                if let Some(t) = p.get("topic").and_then(Value::as_str) {
                    if p.get("partition").and_then(Value::as_i64) == Some(0) {
                        view.topic_rf.insert(t.to_owned(), rf);
                    }
                }
            }
        }
        Some(view)
    }

    /// True when node `id` is still part of the cluster (registered or a quorum member).
    pub fn has_node(&self, id: u64) -> bool {
        self.nodes.contains_key(&id) || self.quorum_members.contains(&id)
    }

    /// No under-replicated or offline partition, no move in progress, every node unfenced.
    pub fn healthy(&self) -> bool {
        self.under_replicated == 0
            && self.offline == 0
            && self.reassigning == 0
            && self.nodes.values().all(|n| !n.fenced)
    }
}

/// A spate operation the scaling plan asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpateAction {
    /// Add node `id` to the metadata quorum (its pod runs).
    AddNode(u64),
    /// Spread replicas over all nodes (after nodes were added).
    Balance,
    /// Move node `id`'s replicas away and remove it.
    Decommission(u64),
}

/// The outcome of [`scale_step`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleStep {
    /// Replicas the StatefulSet should have now.
    pub sts_replicas: i32,
    /// The spate operation to run, if any.
    pub action: Option<SpateAction>,
    /// What is in progress (Progressing condition's reason and message).
    pub progress: Option<(&'static str, String)>,
    /// Why the spec cannot be applied (Degraded condition's reason and message).
    pub refusal: Option<(&'static str, String)>,
    /// Set once the cluster matches `spec.replicas` and has been balanced for it.
    pub balanced: bool,
}

/// The next scaling step from `spec.replicas`, the StatefulSet's replicas (None: not created
/// yet), what spate says (None: admin API unreachable) and the replicas it was last balanced
/// for. Scale-out grows the StatefulSet first, then adds each new node to the quorum, then
/// balances once. Scale-in decommissions the highest node first and shrinks the StatefulSet
/// by one only once spate no longer has that node.
pub fn scale_step(
    spec_replicas: i32,
    sts_replicas: Option<i32>,
    spate: Option<&SpateView>,
    balanced_for: Option<i32>,
) -> ScaleStep {
    let mut step = ScaleStep {
        sts_replicas: sts_replicas.unwrap_or(spec_replicas),
        action: None,
        progress: None,
        refusal: None,
        balanced: false,
    };
    let Some(current) = sts_replicas else {
        step.progress = Some(("Creating", format!("creating {spec_replicas} nodes")));
        return step;
    };
    if spec_replicas > current {
        step.sts_replicas = spec_replicas;
        step.progress = Some((
            "ScalingOut",
            format!("starting nodes {}..={spec_replicas}", current + 1),
        ));
        return step;
    }
    if spec_replicas < current {
        let Some(view) = spate else {
            step.progress = Some((
                "ScalingIn",
                "waiting for spate's admin API to decommission".into(),
            ));
            return step;
        };
        if view.max_replication_factor > spec_replicas {
            step.refusal = Some((
                "ReplicasBelowReplicationFactor",
                format!(
                    "a topic has replication factor {}: the cluster cannot shrink to {spec_replicas} nodes (still {current})",
                    view.max_replication_factor
                ),
            ));
            return step;
        }
        let id = current as u64;
        if view.has_node(id) {
            let decommissioning = view.nodes.get(&id).is_some_and(|n| n.decommissioning);
            if !decommissioning {
                step.action = Some(SpateAction::Decommission(id));
            }
            step.progress = Some((
                "ScalingIn",
                format!("decommissioning node {id}: moving its replicas away"),
            ));
        } else {
            step.sts_replicas = current - 1;
            step.progress = Some((
                "ScalingIn",
                format!("node {id} left the cluster; removing its pod"),
            ));
        }
        return step;
    }
    // The StatefulSet has the wanted size: every node must be in spate, then balanced once.
    let Some(view) = spate else {
        return step;
    };
    if let Some(missing) = (1..=spec_replicas as u64).find(|id| !view.has_node(*id)) {
        step.action = Some(SpateAction::AddNode(missing));
        step.progress = Some((
            "ScalingOut",
            format!("adding node {missing} to the cluster"),
        ));
        return step;
    }
    if balanced_for != Some(spec_replicas) {
        step.action = Some(SpateAction::Balance);
        step.progress = Some((
            "ScalingOut",
            format!("balancing replicas over {spec_replicas} nodes"),
        ));
    }
    step.balanced = true;
    step
}

/// A pod of the StatefulSet, as far as rolling updates care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodState {
    /// StatefulSet ordinal.
    pub ordinal: i32,
    /// Its `controller-revision-hash` label.
    pub revision: Option<String>,
    /// Ready condition true.
    pub ready: bool,
}

/// What the StatefulSet controller last reported.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StsState {
    /// spec.updateStrategy.rollingUpdate.partition.
    pub partition: i32,
    /// status.updateRevision.
    pub update_revision: Option<String>,
    /// status.observedGeneration == metadata.generation.
    pub observed: bool,
}

/// The outcome of [`roll_step`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollStep {
    /// The partition to write: pods at or above it get the new template.
    pub partition: i32,
    /// Why the roll waits, if it does (None: moved on, or nothing to roll).
    pub waiting: Option<String>,
    /// A roll is in progress.
    pub rolling: bool,
}

/// One step of a rolling update driven through the StatefulSet's partition. A new template
/// starts with the partition at `replicas` (no pod changes yet); each step lowers it by one
/// once every pod at or above it runs the new revision and is ready and spate reports no
/// under-replicated partitions, so pods restart one at a time, highest ordinal first.
pub fn roll_step(
    replicas: i32,
    template_changed: bool,
    sts: &StsState,
    pods: &[PodState],
    spate_healthy: bool,
) -> RollStep {
    if template_changed {
        return RollStep {
            partition: replicas,
            waiting: Some("new template written; no pod restarted yet".into()),
            rolling: true,
        };
    }
    let p = sts.partition.min(replicas);
    if p <= 0 {
        return RollStep {
            partition: 0,
            waiting: None,
            rolling: false,
        };
    }
    let wait = |why: String| RollStep {
        partition: p,
        waiting: Some(why),
        rolling: true,
    };
    if !sts.observed || sts.update_revision.is_none() {
        return wait("the StatefulSet controller has not seen the new template yet".into());
    }
    for o in p..replicas {
        match pods.iter().find(|pod| pod.ordinal == o) {
            None => return wait(format!("pod {o} is not there yet")),
            Some(pod) if pod.revision != sts.update_revision => {
                return wait(format!("pod {o} is being updated"))
            }
            Some(pod) if !pod.ready => return wait(format!("pod {o} is not ready")),
            Some(_) => {}
        }
    }
    if !spate_healthy {
        return wait("spate reports under-replicated partitions (or is unreachable)".into());
    }
    RollStep {
        partition: p - 1,
        waiting: None,
        rolling: true,
    }
}

/// Whether a claim requesting `current` must be patched to `wanted`. Only growth is asked for
/// (the CRD refuses a smaller size); an unparsable or missing request is left alone.
pub fn claim_needs_resize(current: Option<&str>, wanted: &str) -> bool {
    match (current.and_then(quantity_bytes), quantity_bytes(wanted)) {
        (Some(have), Some(want)) => want > have,
        _ => false,
    }
}

/// Bytes of a Kubernetes quantity such as `10Gi`, `500M` or `1073741824` (no fractions).
pub fn quantity_bytes(q: &str) -> Option<u128> {
    let q = q.trim();
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (num, unit) = q.split_at(split);
    let n: u128 = num.parse().ok()?;
    let mult: u128 = match unit {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// What spate has for a topic (from `GET /admin/topics/{name}` and the cluster view).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ActualTopic {
    /// Partition count.
    pub partitions: i32,
    /// Replication factor, when known.
    pub replication_factor: Option<i32>,
    /// Configs set on the topic (source "topic"), name -> value.
    pub overrides: BTreeMap<String, String>,
    /// spate's topic id.
    pub id: Option<String>,
}

impl ActualTopic {
    /// Reads a topic's JSON from the admin API.
    pub fn parse(v: &Value) -> Option<Self> {
        let mut t = ActualTopic {
            partitions: i32::try_from(v.get("partitions")?.as_i64()?).ok()?,
            id: v.get("id").and_then(Value::as_str).map(str::to_owned),
            ..Default::default()
        };
        if let Some(cs) = v.get("configs").and_then(Value::as_object) {
            for (k, c) in cs {
                if c.get("source").and_then(Value::as_str) == Some("topic") {
                    let value = match c.get("value") {
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Null) | None => continue,
                        Some(other) => other.to_string(),
                    };
                    t.overrides.insert(k.clone(), value);
                }
            }
        }
        Some(t)
    }
}

/// A change to bring a topic to its declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicOp {
    /// Create it.
    Create {
        /// Partition count.
        partitions: i32,
        /// Replication factor.
        replication_factor: i32,
        /// Configs.
        configs: BTreeMap<String, String>,
    },
    /// Grow to this many partitions.
    AddPartitions(i32),
    /// Set (Some) or reset (None) configs.
    AlterConfigs(BTreeMap<String, Option<String>>),
}

/// A declaration spate cannot be brought to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicDiffError {
    /// Kafka topics cannot lose partitions.
    #[error("the topic has {have} partitions; partitions cannot decrease to {want}")]
    PartitionDecrease {
        /// In spate.
        have: i32,
        /// Declared.
        want: i32,
    },
    /// Changing the replication factor needs a reassignment, which this operator does not do.
    #[error("the topic has replication factor {have}; changing it to {want} is not supported")]
    ReplicationFactorChange {
        /// In spate.
        have: i32,
        /// Declared.
        want: i32,
    },
}

/// The operations that bring `actual` to the declaration (empty when it matches). Configs
/// are declared in full: an override spate has that the declaration lacks is reset.
pub fn topic_diff(
    partitions: i32,
    replication_factor: i32,
    configs: &BTreeMap<String, String>,
    actual: Option<&ActualTopic>,
) -> Result<Vec<TopicOp>, TopicDiffError> {
    let Some(a) = actual else {
        return Ok(vec![TopicOp::Create {
            partitions,
            replication_factor,
            configs: configs.clone(),
        }]);
    };
    if partitions < a.partitions {
        return Err(TopicDiffError::PartitionDecrease {
            have: a.partitions,
            want: partitions,
        });
    }
    if let Some(rf) = a.replication_factor {
        if rf != replication_factor {
            return Err(TopicDiffError::ReplicationFactorChange {
                have: rf,
                want: replication_factor,
            });
        }
    }
    let mut ops = Vec::new();
    if partitions > a.partitions {
        ops.push(TopicOp::AddPartitions(partitions));
    }
    let mut changes: BTreeMap<String, Option<String>> = BTreeMap::new();
    for (k, v) in configs {
        if a.overrides.get(k) != Some(v) {
            changes.insert(k.clone(), Some(v.clone()));
        }
    }
    for k in a.overrides.keys() {
        if !configs.contains_key(k) {
            changes.insert(k.clone(), None);
        }
    }
    if !changes.is_empty() {
        ops.push(TopicOp::AlterConfigs(changes));
    }
    Ok(ops)
}

/// What one node's `GET /health` says about its data dir.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeHealth {
    /// Below its free-space watermark (or out of space): produce is refused.
    pub disk_full: bool,
    /// spate's explanation when full.
    pub reason: Option<String>,
}

impl NodeHealth {
    /// Reads `/health`'s JSON (`status` is `disk_full` when the disk is; older nodes answer
    /// only `{"status":"ok"}`); `None` when it is not that.
    pub fn parse(v: &Value) -> Option<Self> {
        let status = v.get("status")?.as_str()?;
        let disk = v.get("disk");
        let full = status == "disk_full"
            || disk
                .and_then(|d| d.get("full"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
        Some(Self {
            disk_full: full,
            reason: disk
                .and_then(|d| d.get("reason"))
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
    }
}

/// The DiskFull condition from every node's health (node id, its health or why it could not
/// be read): True while any node refuses produce for a full disk, naming them.
pub fn disk_full_condition(
    nodes: &[(u64, Result<NodeHealth, String>)],
) -> (bool, &'static str, String) {
    let full: Vec<String> = nodes
        .iter()
        .filter_map(|(id, h)| match h {
            Ok(h) if h.disk_full => Some(format!(
                "node {id}: {}",
                h.reason
                    .as_deref()
                    .unwrap_or("data dir below its free-space watermark")
            )),
            _ => None,
        })
        .collect();
    if !full.is_empty() {
        return (true, "DiskFull", full.join("; "));
    }
    let unknown: Vec<String> = nodes
        .iter()
        .filter_map(|(id, h)| h.as_ref().err().map(|e| format!("node {id}: {e}")))
        .collect();
    if !unknown.is_empty() {
        return (false, "HealthUnknown", unknown.join("; "));
    }
    (
        false,
        "SpaceAvailable",
        "every node's data dir is above its free-space watermark".to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn view(ids: &[u64]) -> SpateView {
        SpateView {
            nodes: ids.iter().map(|i| (*i, NodeState::default())).collect(),
            quorum_members: ids.iter().copied().collect(),
            controller: Some(1),
            max_replication_factor: 3,
            ..Default::default()
        }
    }

    #[test]
    fn parse_reads_nodes_quorum_and_replication_factors() {
        let v = json!({
            "controller": 2, "under_replicated_partitions": 1, "offline_partitions": 0,
            "reassigning_partitions": 0, "quorum_members": [1, 2, 3],
            "nodes": [{"id": 1, "decommissioning": false, "fenced": false},
                      {"id": 3, "decommissioning": true, "fenced": false}],
            "partitions": [{"topic": "a", "partition": 0, "replicas": [1, 2, 3]},
                           {"topic": "b", "partition": 0, "replicas": [1]}],
        });
        let s = SpateView::parse(&v).expect("view");
        assert_eq!(s.controller, Some(2));
        assert_eq!(s.under_replicated, 1);
        assert!(s.nodes[&3].decommissioning);
        assert!(s.has_node(2));
        assert_eq!(s.max_replication_factor, 3);
        assert_eq!(s.topic_rf["b"], 1);
        assert!(!s.healthy());
    }

    #[test]
    fn parse_refuses_json_that_is_not_the_cluster_view() {
        assert_eq!(SpateView::parse(&json!({"error": "x"})), None);
    }

    #[test]
    fn a_new_cluster_gets_its_statefulset_at_the_spec_size() {
        let s = scale_step(3, None, None, None);
        assert_eq!(s.sts_replicas, 3);
        assert_eq!(s.action, None);
    }

    #[test]
    fn scale_out_grows_the_statefulset_before_touching_spate() {
        let s = scale_step(5, Some(3), Some(&view(&[1, 2, 3])), Some(3));
        assert_eq!(s.sts_replicas, 5);
        assert_eq!(s.action, None);
        assert_eq!(s.progress.expect("p").0, "ScalingOut");
    }

    #[test]
    fn scale_out_adds_each_missing_node_then_balances_once() {
        let s = scale_step(5, Some(5), Some(&view(&[1, 2, 3])), Some(3));
        assert_eq!(s.action, Some(SpateAction::AddNode(4)));
        let s = scale_step(5, Some(5), Some(&view(&[1, 2, 3, 4])), Some(3));
        assert_eq!(s.action, Some(SpateAction::AddNode(5)));
        let s = scale_step(5, Some(5), Some(&view(&[1, 2, 3, 4, 5])), Some(3));
        assert_eq!(s.action, Some(SpateAction::Balance));
        assert!(s.balanced);
        let s = scale_step(5, Some(5), Some(&view(&[1, 2, 3, 4, 5])), Some(5));
        assert_eq!(s.action, None);
        assert_eq!(s.progress, None);
    }

    #[test]
    fn scale_in_decommissions_the_highest_node_before_shrinking() {
        let s = scale_step(3, Some(5), Some(&view(&[1, 2, 3, 4, 5])), Some(5));
        assert_eq!(s.action, Some(SpateAction::Decommission(5)));
        assert_eq!(s.sts_replicas, 5);
    }

    #[test]
    fn scale_in_waits_while_the_node_is_decommissioning() {
        let mut v = view(&[1, 2, 3, 4, 5]);
        v.nodes.insert(
            5,
            NodeState {
                decommissioning: true,
                fenced: false,
            },
        );
        let s = scale_step(3, Some(5), Some(&v), Some(5));
        assert_eq!(s.action, None);
        assert_eq!(s.sts_replicas, 5);
    }

    #[test]
    fn scale_in_shrinks_by_one_once_the_node_has_left() {
        let s = scale_step(3, Some(5), Some(&view(&[1, 2, 3, 4])), Some(5));
        assert_eq!(s.sts_replicas, 4);
        let s = scale_step(3, Some(4), Some(&view(&[1, 2, 3, 4])), Some(5));
        assert_eq!(s.action, Some(SpateAction::Decommission(4)));
    }

    #[test]
    fn scale_in_below_a_topics_replication_factor_is_refused() {
        let s = scale_step(2, Some(3), Some(&view(&[1, 2, 3])), Some(3));
        assert_eq!(s.sts_replicas, 3);
        assert_eq!(s.action, None);
        assert_eq!(
            s.refusal.expect("refused").0,
            "ReplicasBelowReplicationFactor"
        );
    }

    #[test]
    fn scale_in_without_the_admin_api_does_nothing() {
        let s = scale_step(3, Some(5), None, Some(5));
        assert_eq!(s.sts_replicas, 5);
        assert_eq!(s.action, None);
    }

    fn pods(revs: &[(&str, bool)]) -> Vec<PodState> {
        revs.iter()
            .enumerate()
            .map(|(i, (r, ready))| PodState {
                ordinal: i as i32,
                revision: Some(r.to_string()),
                ready: *ready,
            })
            .collect()
    }

    fn sts(partition: i32) -> StsState {
        StsState {
            partition,
            update_revision: Some("new".into()),
            observed: true,
        }
    }

    #[test]
    fn a_new_template_holds_every_pod_back() {
        let r = roll_step(3, true, &sts(0), &pods(&[("old", true); 3]), true);
        assert_eq!(r.partition, 3);
        assert!(r.rolling);
    }

    #[test]
    fn the_roll_releases_the_highest_pod_first_when_spate_is_healthy() {
        let r = roll_step(3, false, &sts(3), &pods(&[("old", true); 3]), true);
        assert_eq!(r.partition, 2);
    }

    #[test]
    fn the_roll_waits_for_the_updated_pod_to_be_ready() {
        let p = pods(&[("old", true), ("old", true), ("new", false)]);
        let r = roll_step(3, false, &sts(2), &p, true);
        assert_eq!(r.partition, 2);
        assert!(r.waiting.expect("waits").contains("not ready"));
    }

    #[test]
    fn the_roll_waits_for_under_replicated_partitions_to_clear() {
        let p = pods(&[("old", true), ("old", true), ("new", true)]);
        let r = roll_step(3, false, &sts(2), &p, false);
        assert_eq!(r.partition, 2);
        let r = roll_step(3, false, &sts(2), &p, true);
        assert_eq!(r.partition, 1);
    }

    #[test]
    fn the_roll_waits_while_a_pod_still_runs_the_old_revision() {
        let p = pods(&[("old", true), ("old", true), ("old", true)]);
        let r = roll_step(3, false, &sts(2), &p, true);
        assert_eq!(r.partition, 2);
    }

    #[test]
    fn a_finished_roll_stays_at_partition_zero() {
        let r = roll_step(3, false, &sts(0), &pods(&[("new", true); 3]), true);
        assert_eq!(r.partition, 0);
        assert!(!r.rolling);
    }

    #[test]
    fn the_roll_waits_for_the_statefulset_controller_to_observe_the_template() {
        let mut s = sts(3);
        s.observed = false;
        let r = roll_step(3, false, &s, &pods(&[("old", true); 3]), true);
        assert_eq!(r.partition, 3);
    }

    fn cfg(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_missing_topic_is_created_with_its_configs() {
        let ops = topic_diff(3, 3, &cfg(&[("retention.ms", "1000")]), None).expect("ops");
        assert_eq!(
            ops,
            vec![TopicOp::Create {
                partitions: 3,
                replication_factor: 3,
                configs: cfg(&[("retention.ms", "1000")])
            }]
        );
    }

    #[test]
    fn a_matching_topic_needs_nothing() {
        let a = ActualTopic {
            partitions: 3,
            replication_factor: Some(3),
            overrides: cfg(&[("retention.ms", "1000")]),
            id: None,
        };
        assert_eq!(
            topic_diff(3, 3, &cfg(&[("retention.ms", "1000")]), Some(&a)),
            Ok(vec![])
        );
    }

    #[test]
    fn more_partitions_and_changed_configs_are_applied() {
        let a = ActualTopic {
            partitions: 3,
            replication_factor: Some(3),
            overrides: cfg(&[("retention.ms", "1000"), ("cleanup.policy", "compact")]),
            id: None,
        };
        let ops = topic_diff(6, 3, &cfg(&[("retention.ms", "2000")]), Some(&a)).expect("ops");
        assert_eq!(ops[0], TopicOp::AddPartitions(6));
        let TopicOp::AlterConfigs(c) = &ops[1] else {
            panic!("{ops:?}")
        };
        assert_eq!(c["retention.ms"], Some("2000".into()));
        assert_eq!(c["cleanup.policy"], None);
    }

    #[test]
    fn fewer_partitions_is_an_error_not_a_no_op() {
        let a = ActualTopic {
            partitions: 6,
            ..Default::default()
        };
        assert_eq!(
            topic_diff(3, 3, &BTreeMap::new(), Some(&a)),
            Err(TopicDiffError::PartitionDecrease { have: 6, want: 3 })
        );
    }

    #[test]
    fn a_replication_factor_change_is_an_error() {
        let a = ActualTopic {
            partitions: 3,
            replication_factor: Some(1),
            ..Default::default()
        };
        assert!(matches!(
            topic_diff(3, 3, &BTreeMap::new(), Some(&a)),
            Err(TopicDiffError::ReplicationFactorChange { .. })
        ));
    }

    #[test]
    fn claims_are_resized_only_to_grow() {
        assert!(claim_needs_resize(Some("1Gi"), "2Gi"));
        assert!(claim_needs_resize(Some("1000M"), "1Gi"));
        assert!(!claim_needs_resize(Some("2Gi"), "2Gi"));
        assert!(!claim_needs_resize(Some("2Gi"), "1Gi"));
        assert!(!claim_needs_resize(None, "1Gi"));
        assert!(!claim_needs_resize(Some("1.5Gi"), "2Gi"));
    }

    #[test]
    fn actual_topic_reads_only_topic_level_overrides() {
        let v = json!({"name": "t", "id": "abc", "partitions": 4, "configs": {
            "retention.ms": {"value": "5", "source": "topic"},
            "segment.bytes": {"value": "1", "source": "default"}}});
        let a = ActualTopic::parse(&v).expect("topic");
        assert_eq!(a.partitions, 4);
        assert_eq!(a.overrides, cfg(&[("retention.ms", "5")]));
    }

    #[test]
    fn disk_full_is_true_while_any_node_reports_it_and_names_the_nodes() {
        let ok = NodeHealth::parse(&serde_json::json!({"status": "ok"})).unwrap();
        let full = NodeHealth::parse(&serde_json::json!({
            "status": "disk_full",
            "disk": {"full": true, "reason": "the data dir /data has 10 bytes free"}
        }))
        .unwrap();
        assert!(!ok.disk_full && full.disk_full);
        assert_eq!(NodeHealth::parse(&serde_json::json!({"ready": true})), None);
        let (status, reason, message) = disk_full_condition(&[
            (1, Ok(ok.clone())),
            (2, Ok(full)),
            (3, Err("timeout".into())),
        ]);
        assert!(status);
        assert_eq!(reason, "DiskFull");
        assert!(
            message.contains("node 2: the data dir /data has 10 bytes free"),
            "{message}"
        );
        assert!(!message.contains("node 1"), "{message}");
        let (status, reason, message) =
            disk_full_condition(&[(1, Ok(ok.clone())), (3, Err("timeout".into()))]);
        assert_eq!((status, reason), (false, "HealthUnknown"));
        assert!(message.contains("node 3: timeout"), "{message}");
        let (status, reason, _) = disk_full_condition(&[(1, Ok(ok.clone())), (2, Ok(ok))]);
        assert_eq!((status, reason), (false, "SpaceAvailable"));
    }
}
