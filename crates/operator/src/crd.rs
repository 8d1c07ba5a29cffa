//! The custom resources: `SpateCluster` and `SpateTopic` (group `spate.io`, `v1alpha1`).
//!
//! The CRDs the chart installs are generated from these types (`spate-operator crds`), so the
//! schema and the code cannot drift; a test compares them with the chart's copy.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrBool, ValidationRule, JSON,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Every key of spate's TOML config file (its flag names without dashes); the spate-server
/// crate has a test that this list matches its flags.
pub const SPATE_CONFIG_KEYS: &str = include_str!("spate_config_keys.txt");

/// Keys the operator sets itself (per pod, or fixed by the StatefulSet's layout).
pub const RESERVED_CONFIG_KEYS: &[&str] = &[
    "node-id",
    "cluster-peers",
    "cluster-listen",
    "listen",
    "http-listen",
    // A separate ingest listener needs a container port the StatefulSet does not declare.
    "ingest-listen",
    "advertised-address",
    "advertised-http-address",
    "data-dir",
    "admin-token",
    // Listeners and their certificates follow the pods' ports and mounted Secrets, which the
    // operator does not wire yet.
    "listeners",
    "advertised-listeners",
    "ssl-cert",
    "ssl-key",
    "ssl-ca",
];

/// Keys that have their own typed field in `spec.broker`.
pub const TYPED_CONFIG_KEYS: &[&str] = &["fsync", "produce-profile", "default-replication-factor"];

/// The keys `spec.broker.config` may hold: spate's settings minus the reserved and typed ones.
pub fn allowed_config_keys() -> Vec<&'static str> {
    SPATE_CONFIG_KEYS
        .lines()
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .filter(|k| !RESERVED_CONFIG_KEYS.contains(k) && !TYPED_CONFIG_KEYS.contains(k))
        .collect()
}

/// A replicated spate cluster: a StatefulSet of nodes, each a broker and a quorum voter.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "spate.io",
    version = "v1alpha1",
    kind = "SpateCluster",
    namespaced,
    shortname = "spc",
    status = "SpateClusterStatus",
    scale = r#"{"specReplicasPath":".spec.replicas","statusReplicasPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Controller","type":"integer","jsonPath":".status.controller"}"#,
    printcolumn = r#"{"name":"URP","type":"integer","jsonPath":".status.underReplicatedPartitions"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpateClusterSpec {
    /// Number of spate nodes; every node is a broker and a voter of the metadata quorum.
    #[schemars(range(min = 1, max = 99))]
    pub replicas: i32,
    /// Container image holding the `spate` binary at /usr/local/bin/spate.
    #[schemars(length(min = 1))]
    pub image: String,
    /// Image pull policy (Always, IfNotPresent, Never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Each node's data volume.
    pub storage: StorageSpec,
    /// CPU and memory requests and limits of the spate container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Broker settings written to the nodes' TOML config file.
    #[serde(default)]
    pub broker: BrokerSpec,
    /// Ports the nodes listen on.
    #[serde(default)]
    pub listeners: ListenersSpec,
    /// Admin API security.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<SecuritySpec>,
    /// Whether two nodes may share a Kubernetes node.
    #[serde(default)]
    pub anti_affinity: AntiAffinity,
    /// Spread of the nodes over a topology domain (zones, hosts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread: Option<TopologySpreadSpec>,
    /// Prometheus scraping.
    #[serde(default)]
    pub metrics: MetricsSpec,
}

/// A node's data volume.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(
    validation = Rule::new("quantity(self.size).compareTo(quantity(oldSelf.size)) >= 0").message("storage.size cannot shrink"),
    validation = Rule::new("has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)").message("storage.storageClassName is immutable")
)]
pub struct StorageSpec {
    /// Size of each node's volume, a quantity such as `10Gi`; it may grow (each claim is
    /// patched: its storage class must allow expansion), never shrink.
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new("isQuantity(self)").message("storage.size must be a quantity such as 10Gi"))]
    pub size: String,
    /// Storage class of the volumes (the cluster default when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub storage_class_name: Option<String>,
    /// Delete the volumes when the SpateCluster is deleted (they are kept by default).
    #[serde(default)]
    pub delete_claims_with_cluster: bool,
}

/// fsync policies and WAL profiles (spate's `--fsync`).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Fsync {
    /// fsync before every ack.
    Always,
    /// Ack at once, fsync every fsync-interval-ms.
    Interval,
    /// Ack at once, leave flushing to the OS.
    Never,
    /// WAL profile: 2 ms group commit.
    Low,
    /// WAL profile: 10 ms group commit.
    Medium,
    /// WAL profile: 50 ms group commit.
    High,
    /// WAL profile: 100 ms group commit.
    Ultra,
}

/// Producer trade-offs (spate's `--produce-profile`).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ProduceProfile {
    /// Small in-flight memory and buffers.
    LowLatency,
    /// The default.
    Balanced,
    /// Larger memory and fsync windows.
    HighThroughput,
    /// The largest.
    Extreme,
}

/// Broker settings.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BrokerSpec {
    /// fsync policy or WAL profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fsync: Option<Fsync>,
    /// Produce profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub produce_profile: Option<ProduceProfile>,
    /// Replication factor of topics created without one (capped at the live brokers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 99))]
    pub default_replication_factor: Option<i32>,
    /// Any other spate setting, keyed by flag name without dashes (see `spate --help`),
    /// e.g. `retention-check-interval-ms: "60000"` or `offsets-retention-minutes: "1440"`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, String>,
}

/// Ports of every node.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListenersSpec {
    /// Kafka clients.
    #[serde(default = "default_kafka_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub kafka: i32,
    /// Inter-node (metadata quorum) traffic.
    #[serde(default = "default_cluster_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub cluster: i32,
    /// HTTP: /metrics, /health, /ready and the admin API.
    #[serde(default = "default_http_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub http: i32,
}

fn default_kafka_port() -> i32 {
    9092
}
fn default_cluster_port() -> i32 {
    9093
}
fn default_http_port() -> i32 {
    9644
}

impl Default for ListenersSpec {
    fn default() -> Self {
        Self {
            kafka: default_kafka_port(),
            cluster: default_cluster_port(),
            http: default_http_port(),
        }
    }
}

/// Admin API security.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecuritySpec {
    /// Secret (same namespace) holding the bearer token admin mutations must present.
    pub admin_token_secret: SecretKeyRef,
}

/// A key of a Secret in the resource's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    /// Secret name.
    pub name: String,
    /// Key within the Secret.
    pub key: String,
}

/// Pod anti-affinity between the nodes of one cluster.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum AntiAffinity {
    /// Never two nodes on one Kubernetes node (pods stay Pending otherwise).
    Required,
    /// Spread when possible.
    #[default]
    Preferred,
    /// No anti-affinity.
    None,
}

/// One topology spread constraint over the cluster's pods.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TopologySpreadSpec {
    /// Node label naming the domain, e.g. `topology.kubernetes.io/zone`.
    pub topology_key: String,
    /// Most pods one domain may have beyond another.
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub max_skew: i32,
    /// `DoNotSchedule` or `ScheduleAnyway`.
    #[serde(default = "schedule_anyway")]
    pub when_unsatisfiable: String,
}

fn one() -> i32 {
    1
}
fn schedule_anyway() -> String {
    "ScheduleAnyway".into()
}

/// Prometheus scraping.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricsSpec {
    /// Create a ServiceMonitor (when the Prometheus operator's CRD exists).
    #[serde(default)]
    pub service_monitor: bool,
    /// Scrape interval, e.g. `30s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
}

/// What the operator observed of a SpateCluster.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpateClusterStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Pods of the StatefulSet.
    #[serde(default)]
    pub replicas: i32,
    /// Pods ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Node ids of the spate cluster (from its admin API).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<i64>,
    /// The current controller (metadata quorum leader) node id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<i64>,
    /// Partitions whose ISR is smaller than their replica set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub under_replicated_partitions: Option<i64>,
    /// Replicas the cluster was last balanced for (after nodes were added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balanced_replicas: Option<i32>,
    /// Ready, Progressing and Degraded, each with a reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// What happens to the topic in spate when its SpateTopic is deleted.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DeletionPolicy {
    /// Keep the topic and its data.
    #[default]
    Retain,
    /// Delete the topic.
    Delete,
}

/// A topic of a SpateCluster, declared in Kubernetes.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "spate.io",
    version = "v1alpha1",
    kind = "SpateTopic",
    namespaced,
    shortname = "spt",
    status = "SpateTopicStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.cluster"}"#,
    printcolumn = r#"{"name":"Partitions","type":"integer","jsonPath":".spec.partitions"}"#,
    printcolumn = r#"{"name":"RF","type":"integer","jsonPath":".spec.replicationFactor"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpateTopicSpec {
    /// Name of the SpateCluster (same namespace) holding the topic.
    #[x_kube(validation = Rule::new("self == oldSelf").message("cluster is immutable"))]
    pub cluster: String,
    /// Topic name in spate; the resource's name when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("topicName is immutable"))]
    pub topic_name: Option<String>,
    /// Partition count; it may grow, a decrease is reported in status and not applied.
    #[schemars(range(min = 1, max = 100000))]
    pub partitions: i32,
    /// Replicas of each partition.
    #[schemars(range(min = 1, max = 99))]
    pub replication_factor: i32,
    /// Topic configs (Kafka names, e.g. `retention.ms`); configs not listed return to the default.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, String>,
    /// What deleting this resource does to the topic: Retain (default) or Delete.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
}

/// What the operator observed of a SpateTopic.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpateTopicStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Partitions the topic has in spate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<i32>,
    /// Replicas of its partitions in spate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_factor: Option<i32>,
    /// The topic id spate gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<String>,
    /// Ready, with a reason when not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl SpateTopic {
    /// The topic's name in spate.
    pub fn topic_name(&self) -> String {
        self.spec
            .topic_name
            .clone()
            .or_else(|| self.metadata.name.clone())
            .unwrap_or_default()
    }
}

/// Both CRDs, with the rules serde attributes cannot express added to their schemas.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut cluster = SpateCluster::crd();
    if let Some(config) = schema_at(&mut cluster, &["spec", "broker", "config"]) {
        let keys = allowed_config_keys()
            .iter()
            .map(|k| format!("'{k}'"))
            .collect::<Vec<_>>()
            .join(", ");
        config.max_properties = Some(64);
        config.x_kubernetes_validations = Some(vec![ValidationRule {
            rule: format!("self.all(k, k in [{keys}])"),
            message: Some(
                "broker.config has a key spate does not know, or one the operator sets itself \
                 (see spate --help; fsync, produce-profile and default-replication-factor have \
                 their own fields)"
                    .into(),
            ),
            ..Default::default()
        }]);
        if let Some(JSONSchemaPropsOrBool::Schema(s)) = config.additional_properties.as_mut() {
            s.max_length = Some(4096);
        }
    }
    if let Some(size) = schema_at(&mut cluster, &["spec", "metrics", "interval"]) {
        size.pattern = Some("^[0-9]+(ms|s|m|h)$".into());
    }
    if let Some(policy) = schema_at(&mut cluster, &["spec", "imagePullPolicy"]) {
        policy.enum_ = Some(
            ["Always", "IfNotPresent", "Never"]
                .iter()
                .map(|v| JSON(serde_json::json!(v)))
                .collect(),
        );
    }
    if let Some(when) = schema_at(
        &mut cluster,
        &["spec", "topologySpread", "whenUnsatisfiable"],
    ) {
        when.enum_ = Some(
            ["DoNotSchedule", "ScheduleAnyway"]
                .iter()
                .map(|v| JSON(serde_json::json!(v)))
                .collect(),
        );
    }
    let mut topic = SpateTopic::crd();
    if let Some(config) = schema_at(&mut topic, &["spec", "config"]) {
        config.max_properties = Some(64);
    }
    vec![cluster, topic]
}

/// The schema of a property path under the CRD's first version.
fn schema_at<'a>(
    crd: &'a mut CustomResourceDefinition,
    path: &[&str],
) -> Option<&'a mut JSONSchemaProps> {
    let mut s = crd
        .spec
        .versions
        .first_mut()?
        .schema
        .as_mut()?
        .open_api_v3_schema
        .as_mut()?;
    for p in path {
        s = s.properties.as_mut()?.get_mut(*p)?;
    }
    Some(s)
}

/// The CRDs as one multi-document YAML stream (what `spate-operator crds` prints).
pub fn crds_yaml() -> Result<String, serde_saphyr::ser::Error> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_config_keys_exclude_reserved_and_typed_keys() {
        let keys = allowed_config_keys();
        assert!(keys.contains(&"retention-check-interval-ms"));
        assert!(!keys.contains(&"node-id"));
        assert!(!keys.contains(&"fsync"));
    }

    #[test]
    fn cluster_crd_carries_the_config_key_rule_and_storage_rules() {
        let yaml = crds_yaml().expect("yaml");
        assert!(yaml.contains("self.all(k, k in ["));
        assert!(yaml.contains("storage.size cannot shrink"));
        assert!(yaml.contains("isQuantity(self)"));
        assert!(yaml.contains("cluster is immutable"));
    }

    #[test]
    fn the_charts_crds_are_exactly_what_the_types_generate() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/helm/spate-operator/crds/spate.io.yaml"
        );
        let chart = std::fs::read_to_string(path).expect("chart CRDs");
        assert!(
            chart == crds_yaml().expect("yaml"),
            "deploy/helm/spate-operator/crds/spate.io.yaml is stale: regenerate it with \
             `cargo run -p spate-operator -- crds > deploy/helm/spate-operator/crds/spate.io.yaml`"
        );
    }

    #[test]
    fn the_dashboard_copies_match_deploy_grafana() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy");
        let read = |p: &str| std::fs::read_to_string(format!("{root}/{p}")).expect(p);
        let source: serde_json::Value =
            serde_json::from_str(&read("grafana/spate.json")).expect("dashboard json");
        let chart: serde_json::Value =
            serde_json::from_str(&read("helm/spate/dashboards/spate.json")).expect("chart copy");
        let cm: serde_json::Value =
            serde_saphyr::from_str(&read("examples/grafana-dashboard.yaml")).expect("configmap");
        let embedded: serde_json::Value =
            serde_json::from_str(cm["data"]["spate.json"].as_str().expect("data")).expect("json");
        let hint = "run scripts/k8s/gen-dashboard-configmap.sh";
        assert!(chart == source, "{hint}");
        assert!(embedded == source, "{hint}");
    }

    #[test]
    fn spec_rejects_unknown_fields_when_deserialized() {
        let bad = serde_json::json!({"replicas": 3, "image": "x", "storage": {"size": "1Gi"}, "bogus": 1});
        assert!(serde_json::from_value::<SpateClusterSpec>(bad).is_err());
    }
}
