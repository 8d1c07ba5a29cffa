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
    // So does the schema registry's listener.
    "schema-registry-listen",
    "advertised-address",
    "advertised-http-address",
    "data-dir",
    "admin-token",
    // Listeners, certificates and TLS on the inter-node and HTTP ports follow the pods' ports
    // and the Secret mounted from `spec.security.tls`: set them there.
    "listeners",
    "advertised-listeners",
    "ssl-cert",
    "ssl-key",
    "ssl-ca",
    "cluster-tls",
    "http-tls",
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

/// Security: the admin token, TLS, the Kafka protocol, SASL users and ACLs.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(
    validation = Rule::new("!has(self.kafkaProtocol) || !(self.kafkaProtocol in ['SSL', 'SASL_SSL']) || has(self.tls)").message("security.kafkaProtocol SSL and SASL_SSL need security.tls (a Secret holding tls.crt, tls.key and ca.crt)"),
    validation = Rule::new("!has(self.tls) || !has(self.tls.clientAuth) || self.tls.clientAuth == 'none' || (has(self.kafkaProtocol) && self.kafkaProtocol == 'SSL')").message("security.tls.clientAuth applies to kafkaProtocol SSL only (SASL_SSL clients authenticate with SASL)")
)]
pub struct SecuritySpec {
    /// Secret (same namespace) holding the bearer token admin mutations must present; the
    /// operator presents it too (spate treats it as a super user).
    pub admin_token_secret: SecretKeyRef,
    /// Certificates of the nodes, from a Secret; TLS on the Kafka, inter-node and HTTP ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// Protocol of the Kafka listener (PLAINTEXT when unset); SSL and SASL_SSL need `tls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka_protocol: Option<KafkaProtocol>,
    /// SASL mechanisms and the users created on first start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl: Option<SaslSpec>,
    /// Kafka ACLs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorizer: Option<AuthorizerSpec>,
}

/// The nodes' certificates and where TLS is used.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsSpec {
    /// Secret (same namespace) in cert-manager's layout: `tls.crt` (chain), `tls.key` and
    /// `ca.crt` (trust for client and peer certificates). It is mounted, not copied: spate
    /// reloads rotated files without a restart. The certificate must name
    /// `*.<cluster>-nodes.<namespace>.svc` (peers, clients) and `<cluster>.<namespace>.svc`
    /// (bootstrap, the operator).
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// Whether the SSL listener asks clients for certificates: required, requested or none.
    #[serde(default)]
    pub client_auth: ClientAuth,
    /// Mutual TLS between the nodes (quorum and replication), on by default.
    #[serde(default = "yes")]
    pub inter_node: bool,
    /// HTTPS on the HTTP port (admin API, metrics, probes); the operator then trusts `ca.crt`.
    #[serde(default)]
    pub http: bool,
}

fn yes() -> bool {
    true
}

/// Whether the SSL listener asks for client certificates (spate's `--ssl-client-auth`).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// Refuse clients without a certificate the CA signed.
    Required,
    /// Ask, and accept clients without one.
    Requested,
    /// Do not ask.
    #[default]
    None,
}

impl ClientAuth {
    /// spate's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientAuth::Required => "required",
            ClientAuth::Requested => "requested",
            ClientAuth::None => "none",
        }
    }
}

/// Security protocol of the Kafka listener (Kafka's names).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum KafkaProtocol {
    /// No TLS, no authentication.
    Plaintext,
    /// TLS; clients are anonymous or named by their certificate.
    Ssl,
    /// SASL authentication without TLS.
    SaslPlaintext,
    /// SASL authentication over TLS.
    SaslSsl,
}

impl KafkaProtocol {
    /// Kafka's name for it, as in `listeners`.
    pub fn as_str(self) -> &'static str {
        match self {
            KafkaProtocol::Plaintext => "PLAINTEXT",
            KafkaProtocol::Ssl => "SSL",
            KafkaProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            KafkaProtocol::SaslSsl => "SASL_SSL",
        }
    }

    /// Whether the listener needs the certificate.
    pub fn uses_tls(self) -> bool {
        matches!(self, KafkaProtocol::Ssl | KafkaProtocol::SaslSsl)
    }
}

/// A SASL mechanism spate offers.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SaslMechanism {
    /// Cleartext password (use it over TLS only).
    #[serde(rename = "PLAIN")]
    Plain,
    /// SCRAM with SHA-256.
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    /// SCRAM with SHA-512.
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl SaslMechanism {
    /// spate's (and Kafka's) name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// SASL settings.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SaslSpec {
    /// Mechanisms offered on SASL listeners; spate's default (all three) when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub mechanisms: Vec<SaslMechanism>,
    /// Secret key holding `user:password[,user:password]`: users created with SCRAM
    /// credentials on a node's first start (passed as an environment variable, never
    /// written to the config file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_users_secret: Option<SecretKeyRef>,
}

/// Kafka ACLs (spate's `--authorizer acl`).
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthorizerSpec {
    /// Enforce ACLs; on by default once this block is given, so a forgotten flag fails closed.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Principals allowed everything, e.g. `User:admin` or `User:CN=spate-client`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 3, max = 256)))]
    #[x_kube(validation = Rule::new("self.all(p, p.matches('^[A-Za-z]+:[^,]+$'))").message("security.authorizer.superUsers entries are Type:name without commas, e.g. User:admin"))]
    pub super_users: Vec<String>,
    /// Whether a resource no ACL names is open to everyone (Kafka's default: false).
    #[serde(default)]
    pub allow_everyone_if_no_acl_found: bool,
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
    if let Some(spec) = schema_at(&mut cluster, &["spec"]) {
        spec.x_kubernetes_validations
            .get_or_insert_with(Vec::new)
            .extend(security_config_rules());
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

/// Keys each typed `security` field writes, so `broker.config` cannot set them a second time
/// (the field wins otherwise, silently); `desired::validate` checks the same.
pub const SECURITY_OWNED_CONFIG_KEYS: &[(&str, &str, &[&str])] = &[
    ("tls", "has(self.security.tls)", &["ssl-client-auth"]),
    (
        "sasl.mechanisms",
        "has(self.security.sasl) && has(self.security.sasl.mechanisms) && size(self.security.sasl.mechanisms) > 0",
        &["sasl-mechanisms"],
    ),
    (
        "authorizer",
        "has(self.security.authorizer)",
        &["authorizer", "super-users", "allow-everyone-if-no-acl-found"],
    ),
];

/// CEL rules refusing a `broker.config` key a typed `security` field sets.
fn security_config_rules() -> Vec<ValidationRule> {
    SECURITY_OWNED_CONFIG_KEYS
        .iter()
        .map(|(field, set, keys)| {
            let list = keys
                .iter()
                .map(|k| format!("'{k}'"))
                .collect::<Vec<_>>()
                .join(", ");
            ValidationRule {
                rule: format!(
                    "!has(self.security) || !({set}) || !has(self.broker) || \
                     !has(self.broker.config) || ![{list}].exists(k, k in self.broker.config)"
                ),
                message: Some(format!(
                    "broker.config cannot set {} while security.{field} is set",
                    keys.join(", ")
                )),
                ..Default::default()
            }
        })
        .collect()
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
    fn security_specs_from_before_tls_still_parse_and_the_new_fields_default() {
        let old: SecuritySpec = serde_json::from_value(
            serde_json::json!({"adminTokenSecret": {"name": "s", "key": "k"}}),
        )
        .expect("old spec");
        assert_eq!(
            (old.tls, old.kafka_protocol, old.sasl, old.authorizer),
            (None, None, None, None)
        );
        let new: SecuritySpec = serde_json::from_value(serde_json::json!({
            "adminTokenSecret": {"name": "s", "key": "k"},
            "tls": {"secretName": "t"},
            "kafkaProtocol": "SASL_SSL",
            "sasl": {"mechanisms": ["PLAIN", "SCRAM-SHA-256"]},
            "authorizer": {},
        }))
        .expect("new spec");
        let tls = new.tls.expect("tls");
        // Inter-node TLS is on by default once there is a certificate; HTTPS is opt-in.
        assert!(tls.inter_node);
        assert!(!tls.http);
        assert_eq!(tls.client_auth, ClientAuth::None);
        assert_eq!(new.kafka_protocol, Some(KafkaProtocol::SaslSsl));
        assert_eq!(
            new.sasl.expect("sasl").mechanisms,
            [SaslMechanism::Plain, SaslMechanism::ScramSha256]
        );
        // A given authorizer block enforces ACLs unless told otherwise (fails closed).
        let a = new.authorizer.expect("authorizer");
        assert!(a.enabled);
        assert!(!a.allow_everyone_if_no_acl_found);
        let bad = serde_json::json!({"adminTokenSecret": {"name": "s", "key": "k"}, "kafkaProtocol": "TLS"});
        assert!(serde_json::from_value::<SecuritySpec>(bad).is_err());
    }

    #[test]
    fn cluster_crd_carries_the_security_rules() {
        // JSON, not YAML: YAML folds long messages over lines.
        let yaml = serde_json::to_string(&crds()).expect("json");
        assert!(yaml.contains("security.kafkaProtocol SSL and SASL_SSL need security.tls"));
        assert!(yaml.contains("security.tls.clientAuth applies to kafkaProtocol SSL only"));
        assert!(yaml.contains("security.authorizer.superUsers entries are Type:name"));
        assert!(yaml.contains(
            "broker.config cannot set authorizer, super-users, allow-everyone-if-no-acl-found while security.authorizer is set"
        ));
        assert!(yaml.contains(
            "broker.config cannot set sasl-mechanisms while security.sasl.mechanisms is set"
        ));
    }

    #[test]
    fn spec_rejects_unknown_fields_when_deserialized() {
        let bad = serde_json::json!({"replicas": 3, "image": "x", "storage": {"size": "1Gi"}, "bogus": 1});
        assert!(serde_json::from_value::<SpateClusterSpec>(bad).is_err());
    }
}
