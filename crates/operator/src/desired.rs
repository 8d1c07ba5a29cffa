//! The objects a SpateCluster should own, computed from its spec alone (pure): the
//! StatefulSet, the headless and client Services, the PodDisruptionBudget, the ConfigMap with
//! spate's TOML config and the ServiceMonitor.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    RollingUpdateStatefulSetStrategy, StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy,
    StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar,
    EnvVarSource, HTTPGetAction, ObjectFieldSelector, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, SecretKeySelector, SecretVolumeSource, SecurityContext, Service,
    ServicePort, ServiceSpec, TopologySpreadConstraint, Volume, VolumeMount,
    VolumeResourceRequirements, WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use serde::Serialize;

use crate::crd::{
    allowed_config_keys, AntiAffinity, ClientAuth, Fsync, KafkaProtocol, ListenersSpec,
    ProduceProfile, SecretKeyRef, SecuritySpec, SpateCluster, TlsSpec, TYPED_CONFIG_KEYS,
};

/// Annotation holding the hash of the desired object an owned object was written from; equal
/// hashes mean nothing to write.
pub const DESIRED_HASH: &str = "spate.io/desired-hash";
/// StatefulSet annotation: how many nodes founded the cluster (they are every node's peers).
pub const FOUNDING_REPLICAS: &str = "spate.io/founding-replicas";
/// StatefulSet annotation: hash of the pod template, to tell a new template from a roll step.
pub const TEMPLATE_HASH: &str = "spate.io/template-hash";
/// Label telling the client Service from the headless one.
pub const CLIENT_SERVICE_LABEL: &str = "spate.io/service";
/// Where each node's volume is mounted.
pub const DATA_MOUNT: &str = "/var/lib/spate";

/// Where the `security.tls` Secret is mounted. Beside /etc/spate rather than inside it: a
/// mount nested in the ConfigMap's volume depends on the runtime creating its mount point in
/// a read-only volume.
pub const TLS_MOUNT: &str = "/etc/spate-tls";
/// Keys of the TLS Secret (cert-manager's layout): chain, private key, CA bundle.
pub const TLS_CERT_KEY: &str = "tls.crt";
/// See [`TLS_CERT_KEY`].
pub const TLS_KEY_KEY: &str = "tls.key";
/// See [`TLS_CERT_KEY`].
pub const TLS_CA_KEY: &str = "ca.crt";

/// The pod's entrypoint: spate's node id is the StatefulSet ordinal + 1, its peers are the
/// founding nodes (plus itself when it joined later), all named through the headless Service.
/// A shell script because a StatefulSet gives every pod the same template.
const ENTRYPOINT_SETUP: &str = r#"set -eu
ord="${POD_NAME##*-}"
id=$((ord + 1))
dom="${SPATE_HEADLESS}.${POD_NAMESPACE}.svc"
peers=""
i=0
while [ "$i" -lt "$SPATE_FOUNDING_REPLICAS" ]; do
  peers="${peers}${peers:+,}$((i + 1))=${SPATE_STS}-${i}.${dom}:${SPATE_CLUSTER_PORT}"
  i=$((i + 1))
done
if [ "$ord" -ge "$SPATE_FOUNDING_REPLICAS" ]; then
  peers="${peers},${id}=${POD_NAME}.${dom}:${SPATE_CLUSTER_PORT}"
fi
export SPATE_NODE_ID="$id" SPATE_CLUSTER_PEERS="$peers"
export SPATE_CLUSTER_LISTEN="0.0.0.0:${SPATE_CLUSTER_PORT}"
export SPATE_ADVERTISED_ADDRESS="${POD_NAME}.${dom}:${SPATE_KAFKA_PORT}"
export SPATE_ADVERTISED_HTTP_ADDRESS="${POD_NAME}.${dom}:${SPATE_HTTP_PORT}"
"#;
/// With `listeners` in the config, each pod advertises its own stable DNS name under the
/// listener's protocol (per pod, so not in the shared ConfigMap; the environment wins over
/// the config file).
const ENTRYPOINT_ADVERTISED_LISTENERS: &str = r#"export SPATE_ADVERTISED_LISTENERS="${SPATE_KAFKA_PROTOCOL}://${POD_NAME}.${dom}:${SPATE_KAFKA_PORT}"
"#;
const ENTRYPOINT_EXEC: &str = "exec /usr/local/bin/spate --config /etc/spate/spate.toml\n";

/// The entrypoint script; without `listeners` it is the script operators before
/// `spec.security.tls` wrote, so upgrading the operator restarts no pod.
fn entrypoint(listeners: bool) -> String {
    let advertise = if listeners {
        ENTRYPOINT_ADVERTISED_LISTENERS
    } else {
        ""
    };
    format!("{ENTRYPOINT_SETUP}{advertise}{ENTRYPOINT_EXEC}")
}

/// A spec the operator cannot turn into objects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// A `broker.config` key spate does not know, or one the operator owns.
    #[error("broker.config key `{0}` is not a spate setting the operator lets you set")]
    InvalidConfigKey(String),
    /// The resource has no name or namespace.
    #[error("the resource has no name or namespace")]
    Unnamed,
    /// A `broker.config` key that a `security` field sets too.
    #[error("broker.config key `{key}` is set by security.{field}: remove it from broker.config")]
    ConfigKeySetBySecurity {
        /// The key.
        key: String,
        /// The security field that sets it.
        field: &'static str,
    },
    /// A Kafka protocol over TLS without a certificate.
    #[error("security.kafkaProtocol {0} needs security.tls (a Secret holding tls.crt, tls.key and ca.crt)")]
    ProtocolNeedsTls(&'static str),
    /// Client certificates asked for on a listener that is not SSL.
    #[error("security.tls.clientAuth applies to kafkaProtocol SSL only (SASL_SSL clients authenticate with SASL)")]
    ClientAuthWithoutSsl,
    /// A super user that is not `Type:name`.
    #[error("security.authorizer.superUsers entry `{0}` is not Type:name without commas (e.g. User:admin)")]
    InvalidSuperUser(String),
}

/// Names of the objects one SpateCluster owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The SpateCluster, the StatefulSet, the client Service and the PDB.
    pub name: String,
    /// Namespace of all of them.
    pub namespace: String,
    /// The headless Service naming each pod.
    pub headless: String,
    /// The ConfigMap.
    pub config: String,
}

impl Names {
    /// Names for a SpateCluster.
    pub fn of(c: &SpateCluster) -> Result<Self, SpecError> {
        let name = c.metadata.name.clone().ok_or(SpecError::Unnamed)?;
        let namespace = c.metadata.namespace.clone().ok_or(SpecError::Unnamed)?;
        Ok(Self {
            headless: format!("{name}-nodes"),
            config: format!("{name}-config"),
            name,
            namespace,
        })
    }

    /// Inter-node address of spate node `id` (StatefulSet ordinal `id - 1`).
    pub fn node_addr(&self, id: u64, port: i32) -> String {
        format!(
            "{}-{}.{}.{}.svc:{port}",
            self.name,
            id.saturating_sub(1),
            self.headless,
            self.namespace
        )
    }

    /// The admin API through the client Service.
    pub fn admin_addr(&self, port: i32) -> String {
        format!("{}:{port}", self.admin_host())
    }

    /// DNS name of the client Service (the name the nodes' certificate must carry for the
    /// operator's HTTPS calls).
    pub fn admin_host(&self) -> String {
        format!("{}.{}.svc", self.name, self.namespace)
    }
}

/// Labels every owned object carries; the selector is the instance's subset.
pub fn labels(name: &str) -> BTreeMap<String, String> {
    let mut l = selector(name);
    l.insert(
        "app.kubernetes.io/managed-by".into(),
        "spate-operator".into(),
    );
    l.insert("app.kubernetes.io/component".into(), "broker".into());
    l
}

/// Labels selecting one cluster's pods.
pub fn selector(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "spate".to_string()),
        ("app.kubernetes.io/instance".to_string(), name.to_string()),
    ])
}

/// Stable 64-bit FNV-1a of a value's JSON: the "nothing changed" test for owned objects.
pub fn hash_of<T: Serialize>(v: &T) -> String {
    let text = serde_json::to_string(v).unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn toml_string(v: &str) -> String {
    let mut out = String::with_capacity(v.len() + 2);
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn enum_name<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Checks `broker.config`'s keys and `security` (the CRD's schema does too; this catches a
/// CRD installed without its rules, and tells the status why).
pub fn validate(c: &SpateCluster) -> Result<(), SpecError> {
    let allowed = allowed_config_keys();
    for k in c.spec.broker.config.keys() {
        if !allowed.contains(&k.as_str()) {
            return Err(SpecError::InvalidConfigKey(k.clone()));
        }
    }
    let Some(sec) = &c.spec.security else {
        return Ok(());
    };
    if let Some(p) = sec.kafka_protocol {
        if p.uses_tls() && sec.tls.is_none() {
            return Err(SpecError::ProtocolNeedsTls(p.as_str()));
        }
    }
    if let Some(tls) = &sec.tls {
        if tls.client_auth != ClientAuth::None && sec.kafka_protocol != Some(KafkaProtocol::Ssl) {
            return Err(SpecError::ClientAuthWithoutSsl);
        }
    }
    if let Some(a) = &sec.authorizer {
        // A comma would split one entry into two in spate's comma-separated list.
        if let Some(bad) = a.super_users.iter().find(|p| {
            p.contains(',')
                || !p
                    .split_once(':')
                    .is_some_and(|(kind, name)| !kind.is_empty() && !name.is_empty())
        }) {
            return Err(SpecError::InvalidSuperUser(bad.clone()));
        }
    }
    for (key, _, field) in security_config(sec, &c.spec.listeners) {
        if c.spec.broker.config.contains_key(key) {
            return Err(SpecError::ConfigKeySetBySecurity {
                key: key.into(),
                field,
            });
        }
    }
    Ok(())
}

/// The Kafka listener's protocol when the config names it with `listeners` (a TLS Secret or
/// a protocol is given); None keeps the `listen` shorthand older specs rendered.
pub fn listener_protocol(c: &SpateCluster) -> Option<KafkaProtocol> {
    c.spec.security.as_ref().and_then(protocol_of)
}

fn protocol_of(sec: &SecuritySpec) -> Option<KafkaProtocol> {
    match (sec.kafka_protocol, &sec.tls) {
        (Some(p), _) => Some(p),
        (None, Some(_)) => Some(KafkaProtocol::Plaintext),
        (None, None) => None,
    }
}

/// The config keys `spec.security` sets, each with its value and the field it comes from.
fn security_config(
    sec: &SecuritySpec,
    l: &ListenersSpec,
) -> Vec<(&'static str, String, &'static str)> {
    let mut kv = Vec::new();
    if let Some(p) = protocol_of(sec) {
        kv.push((
            "listeners",
            format!("{}://0.0.0.0:{}", p.as_str(), l.kafka),
            "kafkaProtocol",
        ));
    }
    if let Some(tls) = &sec.tls {
        kv.push(("ssl-cert", format!("{TLS_MOUNT}/{TLS_CERT_KEY}"), "tls"));
        kv.push(("ssl-key", format!("{TLS_MOUNT}/{TLS_KEY_KEY}"), "tls"));
        kv.push(("ssl-ca", format!("{TLS_MOUNT}/{TLS_CA_KEY}"), "tls"));
        kv.push(("ssl-client-auth", tls.client_auth.as_str().into(), "tls"));
        if tls.inter_node {
            kv.push(("cluster-tls", "true".into(), "tls"));
        }
        if tls.http {
            kv.push(("http-tls", "true".into(), "tls"));
        }
    }
    if let Some(sasl) = &sec.sasl {
        if !sasl.mechanisms.is_empty() {
            let names: Vec<&str> = sasl.mechanisms.iter().map(|m| m.as_str()).collect();
            kv.push(("sasl-mechanisms", names.join(","), "sasl.mechanisms"));
        }
    }
    if let Some(a) = &sec.authorizer {
        let on = if a.enabled { "acl" } else { "none" };
        kv.push(("authorizer", on.into(), "authorizer"));
        if !a.super_users.is_empty() {
            kv.push(("super-users", a.super_users.join(","), "authorizer"));
        }
        kv.push((
            "allow-everyone-if-no-acl-found",
            a.allow_everyone_if_no_acl_found.to_string(),
            "authorizer",
        ));
    }
    kv
}

/// Whether the HTTP port serves HTTPS.
pub fn http_tls(c: &SpateCluster) -> Option<&TlsSpec> {
    c.spec
        .security
        .as_ref()
        .and_then(|s| s.tls.as_ref())
        .filter(|t| t.http)
}

/// spate's TOML config file for every node of the cluster.
pub fn config_toml(c: &SpateCluster) -> Result<String, SpecError> {
    validate(c)?;
    let s = &c.spec;
    let mut kv: BTreeMap<String, String> = BTreeMap::new();
    kv.insert("data-dir".into(), format!("{DATA_MOUNT}/data"));
    if listener_protocol(c).is_none() {
        kv.insert("listen".into(), format!("0.0.0.0:{}", s.listeners.kafka));
    }
    kv.insert(
        "http-listen".into(),
        format!("0.0.0.0:{}", s.listeners.http),
    );
    if let Some(sec) = &s.security {
        for (k, v, _) in security_config(sec, &s.listeners) {
            kv.insert(k.into(), v);
        }
    }
    if let Some(f) = s.broker.fsync {
        kv.insert("fsync".into(), enum_name::<Fsync>(&f));
    }
    if let Some(p) = s.broker.produce_profile {
        kv.insert("produce-profile".into(), enum_name::<ProduceProfile>(&p));
    }
    if let Some(rf) = s.broker.default_replication_factor {
        kv.insert("default-replication-factor".into(), rf.to_string());
    }
    for (k, v) in &s.broker.config {
        debug_assert!(!TYPED_CONFIG_KEYS.contains(&k.as_str()));
        kv.insert(k.clone(), v.clone());
    }
    let mut out =
        String::from("# Written by spate-operator from the SpateCluster; edits are overwritten.\n");
    for (k, v) in kv {
        out.push_str(&format!("{k} = {}\n", toml_string(&v)));
    }
    Ok(out)
}

fn owner_ref(c: &SpateCluster) -> Option<OwnerReference> {
    c.controller_owner_ref(&())
}

fn meta(c: &SpateCluster, name: &str, ns: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        labels: Some(labels(c.metadata.name.as_deref().unwrap_or_default())),
        owner_references: owner_ref(c).map(|o| vec![o]),
        ..Default::default()
    }
}

/// Stamps an object's desired hash into its annotations (computed without the annotation).
pub fn stamp<T: Serialize + Resource>(mut obj: T) -> T {
    let h = hash_of(&obj);
    obj.meta_mut()
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(DESIRED_HASH.into(), h);
    obj
}

/// The ConfigMap holding `spate.toml`.
pub fn config_map(c: &SpateCluster) -> Result<ConfigMap, SpecError> {
    let n = Names::of(c)?;
    Ok(stamp(ConfigMap {
        metadata: meta(c, &n.config, &n.namespace),
        data: Some(BTreeMap::from([(
            "spate.toml".to_string(),
            config_toml(c)?,
        )])),
        ..Default::default()
    }))
}

fn port(name: &str, p: i32) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port: p,
        target_port: Some(IntOrString::String(name.into())),
        ..Default::default()
    }
}

/// The headless Service: a DNS name per pod (published before readiness, since a node must
/// reach its peers to become ready).
pub fn headless_service(c: &SpateCluster) -> Result<Service, SpecError> {
    let n = Names::of(c)?;
    let l = &c.spec.listeners;
    Ok(stamp(Service {
        metadata: meta(c, &n.headless, &n.namespace),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector(&n.name)),
            ports: Some(vec![
                port("kafka", l.kafka),
                port("cluster", l.cluster),
                port("http", l.http),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }))
}

/// The client Service: bootstrap for Kafka clients, the admin API and metrics.
pub fn client_service(c: &SpateCluster) -> Result<Service, SpecError> {
    let n = Names::of(c)?;
    let l = &c.spec.listeners;
    let mut m = meta(c, &n.name, &n.namespace);
    // The ServiceMonitor selects this label, so the headless Service is not scraped twice.
    m.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(CLIENT_SERVICE_LABEL.into(), "client".into());
    Ok(stamp(Service {
        metadata: m,
        spec: Some(ServiceSpec {
            selector: Some(selector(&n.name)),
            ports: Some(vec![port("kafka", l.kafka), port("http", l.http)]),
            ..Default::default()
        }),
        ..Default::default()
    }))
}

/// At most one node down for voluntary disruptions (drains), as a rolling update.
pub fn pdb(c: &SpateCluster) -> Result<PodDisruptionBudget, SpecError> {
    let n = Names::of(c)?;
    Ok(stamp(PodDisruptionBudget {
        metadata: meta(c, &n.name, &n.namespace),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector(&n.name)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }))
}

/// The Prometheus operator's ServiceMonitor for the client Service's http port.
pub fn service_monitor(c: &SpateCluster) -> Result<serde_json::Value, SpecError> {
    let n = Names::of(c)?;
    let mut endpoint = serde_json::json!({"port": "http", "path": "/metrics"});
    if let Some(i) = &c.spec.metrics.interval {
        endpoint["interval"] = serde_json::json!(i);
    }
    if let Some(tls) = http_tls(c) {
        // Prometheus scrapes pod addresses: the name checked is the client Service's, which
        // the certificate carries for the operator anyway.
        endpoint["scheme"] = serde_json::json!("https");
        endpoint["tlsConfig"] = serde_json::json!({
            "ca": {"secret": {"name": tls.secret_name, "key": TLS_CA_KEY}},
            "serverName": n.admin_host(),
        });
    }
    let mut client_labels = selector(&n.name);
    client_labels.insert(CLIENT_SERVICE_LABEL.into(), "client".into());
    let mut v = serde_json::json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": serde_json::to_value(meta(c, &n.name, &n.namespace)).unwrap_or_default(),
        "spec": {
            "selector": {"matchLabels": client_labels},
            "namespaceSelector": {"matchNames": [n.namespace]},
            "endpoints": [endpoint],
        }
    });
    let h = hash_of(&v);
    v["metadata"]["annotations"] = serde_json::json!({ DESIRED_HASH: h });
    Ok(v)
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

fn secret_env(name: &str, key: &SecretKeyRef) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: key.name.clone(),
                key: key.key.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn http_probe(path: &str, period: i32, failures: i32, https: bool) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            // The kubelet does not verify the certificate; it only needs to speak TLS.
            scheme: https.then(|| "HTTPS".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

/// The pod template; `founding` is the number of nodes that founded the cluster.
pub fn pod_template(c: &SpateCluster, founding: i32) -> Result<PodTemplateSpec, SpecError> {
    let n = Names::of(c)?;
    let s = &c.spec;
    let l = &s.listeners;
    let config_hash = hash_of(&config_toml(c)?);
    let mut envs = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        env("SPATE_STS", n.name.clone()),
        env("SPATE_HEADLESS", n.headless.clone()),
        env("SPATE_FOUNDING_REPLICAS", founding.to_string()),
        env("SPATE_KAFKA_PORT", l.kafka.to_string()),
        env("SPATE_CLUSTER_PORT", l.cluster.to_string()),
        env("SPATE_HTTP_PORT", l.http.to_string()),
        env("SPATE_LOG_FORMAT", "json"),
    ];
    let protocol = listener_protocol(c);
    if let Some(sec) = &s.security {
        envs.push(secret_env("SPATE_ADMIN_TOKEN", &sec.admin_token_secret));
        if let Some(p) = protocol {
            envs.push(env("SPATE_KAFKA_PROTOCOL", p.as_str()));
        }
        if let Some(users) = sec
            .sasl
            .as_ref()
            .and_then(|s| s.bootstrap_users_secret.as_ref())
        {
            // From the Secret, so passwords stay out of the ConfigMap and the pod spec.
            envs.push(secret_env("SPATE_BOOTSTRAP_USERS", users));
        }
    }
    let tls = s.security.as_ref().and_then(|sec| sec.tls.as_ref());
    let https = http_tls(c).is_some();
    let term = PodAffinityTerm {
        label_selector: Some(LabelSelector {
            match_labels: Some(selector(&n.name)),
            ..Default::default()
        }),
        topology_key: "kubernetes.io/hostname".into(),
        ..Default::default()
    };
    let anti = match s.anti_affinity {
        AntiAffinity::Required => Some(PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![term]),
            ..Default::default()
        }),
        AntiAffinity::Preferred => Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: term,
                },
            ]),
            ..Default::default()
        }),
        AntiAffinity::None => None,
    };
    let spread = s.topology_spread.as_ref().map(|t| {
        vec![TopologySpreadConstraint {
            max_skew: t.max_skew,
            topology_key: t.topology_key.clone(),
            when_unsatisfiable: t.when_unsatisfiable.clone(),
            label_selector: Some(LabelSelector {
                match_labels: Some(selector(&n.name)),
                ..Default::default()
            }),
            ..Default::default()
        }]
    });
    let mut volume_mounts = vec![
        VolumeMount {
            name: "data".into(),
            mount_path: DATA_MOUNT.into(),
            ..Default::default()
        },
        VolumeMount {
            name: "config".into(),
            mount_path: "/etc/spate".into(),
            read_only: Some(true),
            ..Default::default()
        },
    ];
    let mut volumes = vec![Volume {
        name: "config".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: n.config.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }];
    if let Some(tls) = tls {
        volume_mounts.push(VolumeMount {
            name: "tls".into(),
            mount_path: TLS_MOUNT.into(),
            read_only: Some(true),
            ..Default::default()
        });
        volumes.push(Volume {
            name: "tls".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(tls.secret_name.clone()),
                // Owner and group only: the group is the pod's fsGroup, spate's group.
                default_mode: Some(0o440),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let container = Container {
        name: "spate".into(),
        image: Some(s.image.clone()),
        image_pull_policy: s.image_pull_policy.clone(),
        command: Some(vec![
            "/bin/sh".into(),
            "-c".into(),
            entrypoint(protocol.is_some()),
        ]),
        env: Some(envs),
        ports: Some(vec![
            container_port("kafka", l.kafka),
            container_port("cluster", l.cluster),
            container_port("http", l.http),
        ]),
        readiness_probe: Some(http_probe("/ready", 5, 3, https)),
        liveness_probe: Some(http_probe("/health", 10, 6, https)),
        resources: s.resources.clone(),
        // As the chart's: no capability is needed (ports above 1024, files owned by fsGroup).
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_string()]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(volume_mounts),
        ..Default::default()
    };
    // No hash of the Secret's content here: a rotated certificate reaches the mounted files
    // and spate reloads them, so rotation restarts no pod.
    let mut annotations = BTreeMap::from([("spate.io/config-hash".to_string(), config_hash)]);
    annotations.insert("prometheus.io/port".into(), l.http.to_string());
    if https {
        annotations.insert("prometheus.io/scheme".into(), "https".into());
    }
    Ok(PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(&n.name)),
            annotations: Some(annotations),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: vec![container],
            // SIGTERM moves the node's leaderships away first; give it time.
            termination_grace_period_seconds: Some(60),
            security_context: Some(PodSecurityContext {
                run_as_user: Some(10001),
                run_as_group: Some(10001),
                fs_group: Some(10001),
                run_as_non_root: Some(true),
                ..Default::default()
            }),
            affinity: anti.map(|a| Affinity {
                pod_anti_affinity: Some(a),
                ..Default::default()
            }),
            topology_spread_constraints: spread,
            volumes: Some(volumes),
            ..Default::default()
        }),
    })
}

fn container_port(name: &str, p: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: p,
        ..Default::default()
    }
}

/// The StatefulSet with `replicas` pods, pods below ordinal `partition` kept on the old
/// template (the operator steps it down one pod at a time), `founding` nodes as every pod's
/// peers, and `storage_size` as the claim template's size (a claim template cannot change
/// once created, so an existing StatefulSet's size is passed back).
pub fn statefulset(
    c: &SpateCluster,
    founding: i32,
    replicas: i32,
    partition: i32,
    storage_size: &str,
) -> Result<StatefulSet, SpecError> {
    let n = Names::of(c)?;
    let template = pod_template(c, founding)?;
    let mut m = meta(c, &n.name, &n.namespace);
    m.annotations = Some(BTreeMap::from([
        (FOUNDING_REPLICAS.to_string(), founding.to_string()),
        (TEMPLATE_HASH.to_string(), hash_of(&template)),
    ]));
    let retain = |delete: bool| if delete { "Delete" } else { "Retain" };
    Ok(stamp(StatefulSet {
        metadata: m,
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some(n.headless.clone()),
            // Parallel: a node becomes ready only with a quorum, so pods must not wait for
            // each other's readiness to start.
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector {
                match_labels: Some(selector(&n.name)),
                ..Default::default()
            },
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateStatefulSetStrategy {
                    partition: Some(partition),
                    ..Default::default()
                }),
            }),
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some(retain(c.spec.storage.delete_claims_with_cluster).into()),
                    // A decommissioned node's volume stays: scaling out again re-adds it.
                    when_scaled: Some("Retain".into()),
                },
            ),
            template,
            volume_claim_templates: Some(vec![PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some("data".into()),
                    labels: Some(selector(&n.name)),
                    ..Default::default()
                },
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    storage_class_name: c.spec.storage.storage_class_name.clone(),
                    resources: Some(VolumeResourceRequirements {
                        requests: Some(BTreeMap::from([(
                            "storage".to_string(),
                            Quantity(storage_size.to_string()),
                        )])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::crd::SpateClusterSpec;

    pub(crate) fn cluster(replicas: i32) -> SpateCluster {
        let spec: SpateClusterSpec = serde_json::from_value(serde_json::json!({
            "replicas": replicas,
            "image": "spate:test",
            "storage": {"size": "10Gi"},
            "broker": {"fsync": "medium", "config": {"retention-check-interval-ms": "60000"}},
        }))
        .expect("spec");
        let mut c = SpateCluster::new("demo", spec);
        c.metadata.namespace = Some("ns".into());
        c.metadata.uid = Some("uid-1".into());
        c
    }

    #[test]
    fn config_toml_holds_typed_and_free_settings_sorted() {
        let toml = config_toml(&cluster(3)).expect("toml");
        assert!(toml.contains("fsync = \"medium\"\n"));
        assert!(toml.contains("retention-check-interval-ms = \"60000\"\n"));
        assert!(toml.contains("listen = \"0.0.0.0:9092\"\n"));
        let keys: Vec<&str> = toml
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(" = ").next())
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn config_toml_escapes_quotes_and_newlines() {
        let mut c = cluster(3);
        c.spec
            .broker
            .config
            .insert("log-level".into(), "a\"b\nc".into());
        let toml = config_toml(&c).expect("toml");
        assert!(toml.contains("log-level = \"a\\\"b\\nc\"\n"));
    }

    #[test]
    fn reserved_and_unknown_config_keys_are_refused() {
        for key in [
            "node-id",
            "no-such-setting",
            "fsync",
            "cluster-tls",
            "http-tls",
        ] {
            let mut c = cluster(3);
            c.spec.broker.config.insert(key.into(), "1".into());
            assert_eq!(
                config_toml(&c),
                Err(SpecError::InvalidConfigKey(key.into()))
            );
        }
    }

    #[test]
    fn statefulset_names_its_headless_service_and_owner() {
        let c = cluster(3);
        let s = statefulset(&c, 3, 3, 0, "10Gi").expect("sts");
        let spec = s.spec.as_ref().expect("spec");
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(spec.service_name.as_deref(), Some("demo-nodes"));
        assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
        let owner = &s.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(owner.kind, "SpateCluster");
        assert_eq!(owner.controller, Some(true));
        let pvc = &spec.volume_claim_templates.as_ref().expect("vct")[0];
        let size = &pvc
            .spec
            .as_ref()
            .expect("pvc spec")
            .resources
            .as_ref()
            .expect("res")
            .requests
            .as_ref()
            .expect("req")["storage"];
        assert_eq!(size.0, "10Gi");
        assert_eq!(
            spec.persistent_volume_claim_retention_policy
                .as_ref()
                .and_then(|p| p.when_deleted.as_deref()),
            Some("Retain")
        );
    }

    #[test]
    fn founding_replicas_reach_the_pods_environment_unchanged_by_scaling() {
        let c = cluster(5);
        let a = statefulset(&c, 3, 5, 0, "10Gi").expect("sts");
        let b = statefulset(&c, 3, 3, 0, "10Gi").expect("sts");
        let env = a
            .spec
            .as_ref()
            .expect("spec")
            .template
            .spec
            .as_ref()
            .expect("pod")
            .containers[0]
            .env
            .clone()
            .expect("env");
        assert!(env
            .iter()
            .any(|e| e.name == "SPATE_FOUNDING_REPLICAS" && e.value.as_deref() == Some("3")));
        // Scaling changes replicas only, never the template: no pod restarts.
        assert_eq!(
            a.metadata.annotations.as_ref().expect("a")[TEMPLATE_HASH],
            b.metadata.annotations.as_ref().expect("b")[TEMPLATE_HASH]
        );
    }

    #[test]
    fn a_config_change_changes_the_template_hash() {
        let a = statefulset(&cluster(3), 3, 3, 0, "10Gi").expect("sts");
        let mut c = cluster(3);
        c.spec.broker.fsync = Some(Fsync::Always);
        let b = statefulset(&c, 3, 3, 0, "10Gi").expect("sts");
        assert_ne!(
            a.metadata.annotations.as_ref().expect("a")[TEMPLATE_HASH],
            b.metadata.annotations.as_ref().expect("b")[TEMPLATE_HASH]
        );
    }

    #[test]
    fn an_image_change_changes_the_template_hash_but_not_the_config() {
        let a = statefulset(&cluster(3), 3, 3, 0, "10Gi").expect("sts");
        let mut c = cluster(3);
        c.spec.image = "spate:next".into();
        let b = statefulset(&c, 3, 3, 0, "10Gi").expect("sts");
        assert_ne!(
            a.metadata.annotations.as_ref().expect("a")[TEMPLATE_HASH],
            b.metadata.annotations.as_ref().expect("b")[TEMPLATE_HASH]
        );
        assert_eq!(config_map(&cluster(3)), config_map(&c));
    }

    #[test]
    fn the_admin_token_comes_from_the_secret_not_the_spec() {
        let mut c = cluster(3);
        c.spec.security = Some(crate::crd::SecuritySpec {
            admin_token_secret: crate::crd::SecretKeyRef {
                name: "s".into(),
                key: "k".into(),
            },
            tls: None,
            kafka_protocol: None,
            sasl: None,
            authorizer: None,
        });
        let t = pod_template(&c, 3).expect("t");
        let env = t.spec.expect("pod").containers[0].env.clone().expect("env");
        let token = env
            .iter()
            .find(|e| e.name == "SPATE_ADMIN_TOKEN")
            .expect("token env");
        assert!(token.value.is_none());
        let sel = token
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            .expect("ref");
        assert_eq!((sel.name.as_str(), sel.key.as_str()), ("s", "k"));
    }

    #[test]
    fn anti_affinity_required_and_preferred_map_to_pod_anti_affinity() {
        let mut c = cluster(3);
        let anti = |c: &SpateCluster| {
            pod_template(c, 3)
                .expect("template")
                .spec
                .expect("pod")
                .affinity
                .and_then(|a| a.pod_anti_affinity)
        };
        c.spec.anti_affinity = AntiAffinity::Required;
        let a = anti(&c).expect("required");
        assert!(a
            .required_during_scheduling_ignored_during_execution
            .is_some());
        c.spec.anti_affinity = AntiAffinity::Preferred;
        let a = anti(&c).expect("preferred");
        assert!(a
            .preferred_during_scheduling_ignored_during_execution
            .is_some());
        c.spec.anti_affinity = AntiAffinity::None;
        assert!(anti(&c).is_none());
    }

    #[test]
    fn services_and_pdb_select_the_clusters_pods() {
        let c = cluster(3);
        let h = headless_service(&c).expect("h");
        let hs = h.spec.expect("spec");
        assert_eq!(hs.cluster_ip.as_deref(), Some("None"));
        assert_eq!(hs.publish_not_ready_addresses, Some(true));
        assert_eq!(hs.selector, Some(selector("demo")));
        let p = pdb(&c).expect("pdb").spec.expect("spec");
        assert_eq!(p.max_unavailable, Some(IntOrString::Int(1)));
        let sm = service_monitor(&c).expect("sm");
        assert_eq!(sm["spec"]["endpoints"][0]["port"], "http");
    }

    #[test]
    fn the_desired_hash_is_stable_and_tracks_content() {
        let a = config_map(&cluster(3)).expect("cm");
        let b = config_map(&cluster(3)).expect("cm");
        assert_eq!(a.metadata.annotations, b.metadata.annotations);
        let mut c = cluster(3);
        c.spec.broker.fsync = Some(Fsync::Never);
        let d = config_map(&c).expect("cm");
        assert_ne!(a.metadata.annotations, d.metadata.annotations);
    }

    fn with_security(security: serde_json::Value) -> SpateCluster {
        let mut c = cluster(3);
        c.spec.security = Some(serde_json::from_value(security).expect("security"));
        c
    }

    /// Every security field set: SASL_SSL with HTTPS, users from a Secret and ACLs.
    fn secured() -> SpateCluster {
        with_security(serde_json::json!({
            "adminTokenSecret": {"name": "admin", "key": "token"},
            "tls": {"secretName": "demo-tls", "http": true},
            "kafkaProtocol": "SASL_SSL",
            "sasl": {
                "mechanisms": ["SCRAM-SHA-512"],
                "bootstrapUsersSecret": {"name": "demo-users", "key": "users"},
            },
            "authorizer": {"superUsers": ["User:admin", "User:CN=spate-node"]},
        }))
    }

    fn container(c: &SpateCluster) -> Container {
        pod_template(c, 3)
            .expect("template")
            .spec
            .expect("pod")
            .containers[0]
            .clone()
    }

    fn desired_hashes(c: &SpateCluster) -> [String; 3] {
        let hash =
            |m: &ObjectMeta| m.annotations.as_ref().expect("annotations")[DESIRED_HASH].clone();
        [
            hash(&statefulset(c, 3, 3, 0, "10Gi").expect("sts").metadata),
            hash(&config_map(c).expect("cm").metadata),
            service_monitor(c).expect("sm")["metadata"]["annotations"][DESIRED_HASH]
                .as_str()
                .expect("sm hash")
                .to_string(),
        ]
    }

    #[test]
    fn specs_without_the_new_security_fields_render_what_older_operators_rendered() {
        // Hashes of the StatefulSet, ConfigMap and ServiceMonitor the operator wrote before
        // spec.security.tls existed. A change here rolls every pod of every existing cluster
        // when the operator is upgraded: keep them unless that is intended.
        let mut plain = cluster(3);
        plain.spec.metrics.service_monitor = true;
        assert_eq!(
            desired_hashes(&plain),
            ["77c90d689c148c5c", "251ccc8bba57f5d5", "84945fde4cdd2d6b"]
        );
        let token_only =
            with_security(serde_json::json!({"adminTokenSecret": {"name": "s", "key": "k"}}));
        assert_eq!(
            desired_hashes(&token_only),
            ["04d5a759aefcb2ae", "251ccc8bba57f5d5", "84945fde4cdd2d6b"]
        );
        let toml = config_toml(&token_only).expect("toml");
        assert!(toml.contains("listen = \"0.0.0.0:9092\"\n"));
        assert!(!toml.contains("listeners"));
        assert!(!toml.contains("ssl-"));
    }

    #[test]
    fn a_secured_spec_writes_listeners_ssl_paths_cluster_tls_and_acls_to_the_config() {
        let toml = config_toml(&secured()).expect("toml");
        for line in [
            "listeners = \"SASL_SSL://0.0.0.0:9092\"",
            "ssl-cert = \"/etc/spate-tls/tls.crt\"",
            "ssl-key = \"/etc/spate-tls/tls.key\"",
            "ssl-ca = \"/etc/spate-tls/ca.crt\"",
            "ssl-client-auth = \"none\"",
            "cluster-tls = \"true\"",
            "http-tls = \"true\"",
            "sasl-mechanisms = \"SCRAM-SHA-512\"",
            "authorizer = \"acl\"",
            "super-users = \"User:admin,User:CN=spate-node\"",
            "allow-everyone-if-no-acl-found = \"false\"",
        ] {
            assert!(
                toml.contains(&format!("{line}\n")),
                "{line} missing from\n{toml}"
            );
        }
        // `listeners` replaces the shorthand (spate refuses neither, but would bind twice).
        assert!(!toml.lines().any(|l| l.starts_with("listen ")), "{toml}");
        // Passwords and per-pod names never reach the shared ConfigMap.
        assert!(!toml.contains("demo-users"));
        assert!(!toml.contains("advertised"));
    }

    #[test]
    fn tls_alone_keeps_plaintext_clients_and_turns_on_inter_node_tls() {
        let c = with_security(serde_json::json!({
            "adminTokenSecret": {"name": "s", "key": "k"},
            "tls": {"secretName": "demo-tls"},
        }));
        let toml = config_toml(&c).expect("toml");
        assert!(toml.contains("listeners = \"PLAINTEXT://0.0.0.0:9092\"\n"));
        assert!(toml.contains("cluster-tls = \"true\"\n"));
        assert!(!toml.contains("http-tls"));
        let off = with_security(serde_json::json!({
            "adminTokenSecret": {"name": "s", "key": "k"},
            "tls": {"secretName": "demo-tls", "interNode": false},
        }));
        assert!(!config_toml(&off).expect("toml").contains("cluster-tls"));
    }

    #[test]
    fn a_secured_pod_advertises_its_dns_name_under_the_listeners_protocol() {
        let c = container(&secured());
        let envs = c.env.expect("env");
        let protocol = envs
            .iter()
            .find(|e| e.name == "SPATE_KAFKA_PROTOCOL")
            .and_then(|e| e.value.clone());
        assert_eq!(protocol.as_deref(), Some("SASL_SSL"));
        // Run the entrypoint with spate swapped for a print of what it would be given.
        let script = c.command.expect("command")[2].replace(
            "exec /usr/local/bin/spate --config /etc/spate/spate.toml",
            "echo \"$SPATE_ADVERTISED_LISTENERS $SPATE_ADVERTISED_ADDRESS\"",
        );
        let out = std::process::Command::new("/bin/sh")
            .args(["-c", &script])
            .env("POD_NAME", "demo-1")
            .env("POD_NAMESPACE", "ns")
            .envs(
                envs.iter()
                    .filter_map(|e| Some((e.name.clone(), e.value.clone()?))),
            )
            .output()
            .expect("sh");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "SASL_SSL://demo-1.demo-nodes.ns.svc:9092 demo-1.demo-nodes.ns.svc:9092\n"
        );
    }

    #[test]
    fn the_bootstrap_users_come_from_a_secret_key_ref() {
        let envs = container(&secured()).env.expect("env");
        let users = envs
            .iter()
            .find(|e| e.name == "SPATE_BOOTSTRAP_USERS")
            .expect("users env");
        assert!(users.value.is_none());
        let sel = users
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            .expect("secretKeyRef");
        assert_eq!(
            (sel.name.as_str(), sel.key.as_str()),
            ("demo-users", "users")
        );
    }

    #[test]
    fn the_tls_secret_is_mounted_read_only_and_not_hashed_into_the_pod() {
        let t = pod_template(&secured(), 3).expect("template");
        let pod = t.spec.expect("pod");
        let volume = pod
            .volumes
            .as_ref()
            .expect("volumes")
            .iter()
            .find(|v| v.name == "tls")
            .expect("tls volume");
        let secret = volume.secret.as_ref().expect("secret volume");
        assert_eq!(secret.secret_name.as_deref(), Some("demo-tls"));
        let mount = pod.containers[0]
            .volume_mounts
            .as_ref()
            .expect("mounts")
            .iter()
            .find(|m| m.name == "tls")
            .expect("tls mount");
        assert_eq!(mount.mount_path, TLS_MOUNT);
        assert_eq!(mount.read_only, Some(true));
        // Rotation must not restart pods: nothing in the template follows the Secret's data.
        let annotations = t.metadata.expect("meta").annotations.expect("annotations");
        let keys: Vec<&str> = annotations.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "prometheus.io/port",
                "prometheus.io/scheme",
                "spate.io/config-hash"
            ]
        );
    }

    #[test]
    fn http_tls_makes_the_probes_and_the_service_monitor_use_https() {
        let scheme = |p: Option<Probe>| p.and_then(|p| p.http_get).and_then(|h| h.scheme);
        let c = container(&secured());
        assert_eq!(scheme(c.readiness_probe).as_deref(), Some("HTTPS"));
        assert_eq!(scheme(c.liveness_probe).as_deref(), Some("HTTPS"));
        let sm = service_monitor(&secured()).expect("sm");
        let endpoint = &sm["spec"]["endpoints"][0];
        assert_eq!(endpoint["scheme"], "https");
        assert_eq!(endpoint["tlsConfig"]["ca"]["secret"]["name"], "demo-tls");
        assert_eq!(endpoint["tlsConfig"]["serverName"], "demo.ns.svc");
        let plain = container(&cluster(3));
        assert_eq!(scheme(plain.readiness_probe), None);
    }

    #[test]
    fn ssl_protocols_without_tls_are_refused() {
        for (protocol, name) in [("SSL", "SSL"), ("SASL_SSL", "SASL_SSL")] {
            let c = with_security(serde_json::json!({
                "adminTokenSecret": {"name": "s", "key": "k"},
                "kafkaProtocol": protocol,
            }));
            assert_eq!(validate(&c), Err(SpecError::ProtocolNeedsTls(name)));
            assert!(config_toml(&c).is_err());
            assert!(pod_template(&c, 3).is_err());
        }
        let sasl = with_security(serde_json::json!({
            "adminTokenSecret": {"name": "s", "key": "k"},
            "kafkaProtocol": "SASL_PLAINTEXT",
        }));
        assert_eq!(validate(&sasl), Ok(()));
    }

    #[test]
    fn client_auth_without_the_ssl_protocol_is_refused() {
        let c = with_security(serde_json::json!({
            "adminTokenSecret": {"name": "s", "key": "k"},
            "tls": {"secretName": "t", "clientAuth": "required"},
            "kafkaProtocol": "SASL_SSL",
        }));
        assert_eq!(validate(&c), Err(SpecError::ClientAuthWithoutSsl));
        let ssl = with_security(serde_json::json!({
            "adminTokenSecret": {"name": "s", "key": "k"},
            "tls": {"secretName": "t", "clientAuth": "required"},
            "kafkaProtocol": "SSL",
        }));
        assert!(config_toml(&ssl)
            .expect("toml")
            .contains("ssl-client-auth = \"required\"\n"));
    }

    #[test]
    fn a_broker_config_key_a_security_field_sets_is_refused() {
        let mut c = secured();
        c.spec
            .broker
            .config
            .insert("super-users".into(), "User:x".into());
        assert_eq!(
            validate(&c),
            Err(SpecError::ConfigKeySetBySecurity {
                key: "super-users".into(),
                field: "authorizer",
            })
        );
        // Without the typed field the key stays settable, as before.
        let mut old = cluster(3);
        old.spec
            .broker
            .config
            .insert("authorizer".into(), "acl".into());
        assert_eq!(validate(&old), Ok(()));
    }

    #[test]
    fn super_users_must_be_type_colon_name_without_commas() {
        for bad in ["admin", "User:a,User:b", ":x"] {
            let c = with_security(serde_json::json!({
                "adminTokenSecret": {"name": "s", "key": "k"},
                "authorizer": {"superUsers": [bad]},
            }));
            assert_eq!(validate(&c), Err(SpecError::InvalidSuperUser(bad.into())));
        }
    }

    #[test]
    fn the_crds_security_rules_cover_every_key_a_security_field_writes() {
        let c = secured();
        let sec = c.spec.security.as_ref().expect("security");
        let mut written: Vec<&str> = security_config(sec, &c.spec.listeners)
            .into_iter()
            .map(|(k, _, _)| k)
            .filter(|k| !crate::crd::RESERVED_CONFIG_KEYS.contains(k))
            .collect();
        written.sort();
        let mut ruled: Vec<&str> = crate::crd::SECURITY_OWNED_CONFIG_KEYS
            .iter()
            .flat_map(|(_, _, keys)| keys.iter().copied())
            .collect();
        ruled.sort();
        assert_eq!(written, ruled);
    }

    #[test]
    fn node_addresses_follow_the_ordinal_and_headless_service() {
        let n = Names::of(&cluster(3)).expect("names");
        assert_eq!(n.node_addr(4, 9093), "demo-3.demo-nodes.ns.svc:9093");
    }
}
