//! The kube I/O around the pure decisions: reconcilers for SpateCluster and SpateTopic.
//! Every write goes through [`Ctx::apply`] or a status patch that first compares with what
//! is there, and is counted in `spate_operator_api_writes_total`, so a pass with nothing
//! changed writes nothing.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::controller::Action;
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;

use crate::conditions::{merge, Want};
use crate::crd::{DeletionPolicy, SpateCluster, SpateClusterStatus, SpateTopic};
use crate::desired::{self, Names, SpecError, DESIRED_HASH, FOUNDING_REPLICAS, TEMPLATE_HASH};
use crate::metrics::Metrics;
use crate::plan::{self, PodState, SpateAction, SpateView, StsState, TopicOp};
use crate::spate::{SpateClient, SpateError};

/// Field manager of the operator's server-side applies.
pub const MANAGER: &str = "spate-operator";
/// SpateCluster annotation: the admin API's host:port, instead of the client Service (for
/// clusters whose pods cannot be reached from the operator, e.g. tests under kwok).
pub const ADMIN_ENDPOINT: &str = "spate.io/admin-endpoint";
/// SpateCluster annotation: `id=host:port,...` inter-node addresses used when adding nodes,
/// instead of the headless Service's names.
pub const NODE_ADDRESSES: &str = "spate.io/node-addresses";
/// Annotation overriding the nodes' HTTP addresses (`1=host:port,2=...`), as NODE_ADDRESSES
/// does the inter-node ones: the operator reads each node's `/health` there.
pub const NODE_HTTP_ADDRESSES: &str = "spate.io/node-http-addresses";
/// Finalizer on SpateTopics whose deletion policy is Delete.
pub const TOPIC_FINALIZER: &str = "spate.io/topic-deletion";

/// A failed reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    /// The spec cannot be turned into objects.
    #[error("{0}")]
    Spec(#[from] SpecError),
    /// spate's admin API failed.
    #[error("{0}")]
    Spate(#[from] SpateError),
    /// A value could not be serialized.
    #[error("serialization: {0}")]
    Json(#[from] serde_json::Error),
}

/// What every reconcile shares.
pub struct Ctx {
    /// The Kubernetes client.
    pub client: Client,
    /// The operator's metrics.
    pub metrics: Metrics,
}

impl Ctx {
    /// Writes `desired` with server-side apply unless the object there carries the same
    /// desired-hash; answers whether it wrote.
    async fn apply<K>(&self, api: &Api<K>, desired: &K) -> Result<bool, Error>
    where
        K: Resource + Clone + Serialize + DeserializeOwned + Debug,
        K::DynamicType: Default,
    {
        let name = desired.meta().name.clone().unwrap_or_default();
        let want = desired
            .meta()
            .annotations
            .as_ref()
            .and_then(|a| a.get(DESIRED_HASH));
        if let Some(existing) = api.get_opt(&name).await? {
            if existing
                .meta()
                .annotations
                .as_ref()
                .and_then(|a| a.get(DESIRED_HASH))
                == want
            {
                return Ok(false);
            }
        }
        api.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(desired),
        )
        .await?;
        self.metrics
            .write(&K::kind(&K::DynamicType::default()), "apply");
        Ok(true)
    }

    async fn apply_dynamic(
        &self,
        api: &Api<DynamicObject>,
        desired: &serde_json::Value,
    ) -> Result<bool, Error> {
        let name = desired["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if let Some(existing) = api.get_opt(&name).await? {
            if existing.annotations().get(DESIRED_HASH).map(String::as_str)
                == desired["metadata"]["annotations"][DESIRED_HASH].as_str()
            {
                return Ok(false);
            }
        }
        api.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(desired),
        )
        .await?;
        self.metrics.write("ServiceMonitor", "apply");
        Ok(true)
    }
}

/// The admin API client of a SpateCluster (annotation override, else its client Service),
/// with the admin token from its Secret when it has one, over HTTPS trusting the `ca.crt` of
/// the TLS Secret when the HTTP port serves TLS.
async fn admin_client(ctx: &Ctx, c: &SpateCluster) -> Result<SpateClient, Error> {
    let n = Names::of(c)?;
    let addr = c
        .annotations()
        .get(ADMIN_ENDPOINT)
        .cloned()
        .unwrap_or_else(|| n.admin_addr(c.spec.listeners.http));
    let mut token = None;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &n.namespace);
    if let Some(sec) = &c.spec.security {
        if let Some(s) = secrets.get_opt(&sec.admin_token_secret.name).await? {
            token = s
                .data
                .and_then(|d| d.get(&sec.admin_token_secret.key).cloned())
                .and_then(|b| String::from_utf8(b.0).ok());
        }
    }
    let Some(tls) = desired::http_tls(c) else {
        return Ok(SpateClient::new(addr, token));
    };
    // Read on every reconcile, so a rotated CA is picked up like the nodes pick up theirs.
    let ca = secrets
        .get_opt(&tls.secret_name)
        .await?
        .and_then(|s| s.data)
        .and_then(|mut d| d.remove(desired::TLS_CA_KEY));
    let Some(ca) = ca else {
        // Not fatal: the owned objects are still applied and the status says what is missing
        // (cert-manager may not have issued the certificate yet).
        return Ok(SpateClient::unusable(
            addr,
            format!(
                "Secret {} has no {} to trust the nodes' certificate with",
                tls.secret_name,
                desired::TLS_CA_KEY
            ),
        ));
    };
    // The certificate is checked against the client Service's name even when the address is
    // overridden (a port-forward, a test endpoint): that is the name the nodes present.
    Ok(
        match SpateClient::https(addr.clone(), token, &ca.0, &n.admin_host()) {
            Ok(client) => client,
            Err(SpateError::Https { what, .. }) => SpateClient::unusable(addr, what),
            Err(e) => SpateClient::unusable(addr, e.to_string()),
        },
    )
}

/// HTTP address of node `id`: the annotation's override, else the headless DNS name.
fn node_http_addr(c: &SpateCluster, n: &Names, id: u64) -> String {
    if let Some(a) = c
        .annotations()
        .get(NODE_HTTP_ADDRESSES)
        .and_then(|l| parse_node_addresses(l).remove(&id))
    {
        return a;
    }
    n.node_addr(id, c.spec.listeners.http)
}

/// Every node's `/health` (ids 1..=`replicas`), asked concurrently.
async fn nodes_health(
    admin: &SpateClient,
    c: &SpateCluster,
    n: &Names,
    replicas: i32,
) -> Vec<(u64, Result<crate::plan::NodeHealth, String>)> {
    let ids: Vec<u64> = (1..=u64::try_from(replicas).unwrap_or(0)).collect();
    let calls = ids.iter().map(|&id| {
        let client = admin.at(node_http_addr(c, n, id));
        async move {
            // Short: an unreachable node must not hold the reconcile for the admin timeout.
            let h = tokio::time::timeout(Duration::from_secs(5), client.health()).await;
            let h = match h {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(_) => Err("no /health answer within 5 s".to_owned()),
            };
            (id, h)
        }
    });
    futures::future::join_all(calls).await
}

/// Inter-node address of node `id`: the annotation's override, else the headless DNS name.
fn node_addr(c: &SpateCluster, n: &Names, id: u64) -> String {
    if let Some(a) = c
        .annotations()
        .get(NODE_ADDRESSES)
        .and_then(|l| parse_node_addresses(l).remove(&id))
    {
        return a;
    }
    n.node_addr(id, c.spec.listeners.cluster)
}

fn sts_storage_size(s: &StatefulSet) -> Option<String> {
    s.spec
        .as_ref()?
        .volume_claim_templates
        .as_ref()?
        .first()?
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .map(|q| q.0.clone())
}

fn pod_state(p: &Pod) -> Option<PodState> {
    let name = p.metadata.name.as_deref()?;
    let ordinal = name.rsplit_once('-')?.1.parse().ok()?;
    let ready = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    Some(PodState {
        ordinal,
        revision: p.labels().get("controller-revision-hash").cloned(),
        ready,
    })
}

/// Whether the Prometheus operator's ServiceMonitor CRD is installed.
async fn has_service_monitor_crd(ctx: &Ctx) -> bool {
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    matches!(
        crds.get_opt("servicemonitors.monitoring.coreos.com").await,
        Ok(Some(_))
    )
}

/// Reconciles one SpateCluster: owned objects, scaling, rolling, status.
pub async fn reconcile_cluster(c: Arc<SpateCluster>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    ctx.metrics.reconcile("SpateCluster");
    let n = Names::of(&c)?;
    let client = ctx.client.clone();
    let clusters: Api<SpateCluster> = Api::namespaced(client.clone(), &n.namespace);
    let previous = c.status.clone().unwrap_or_default();
    if let Err(e) = desired::validate(&c) {
        // Nothing is touched: the running cluster keeps its last good config.
        let wants = [
            Want::new("Ready", false, "InvalidSpec", e.to_string()),
            Want::new(
                "Progressing",
                false,
                "InvalidSpec",
                "the spec is not applied",
            ),
            Want::new("Degraded", true, "InvalidConfig", e.to_string()),
        ];
        let mut status = previous.clone();
        status.conditions = merge(&previous.conditions, &wants, c.metadata.generation, now());
        patch_status(&ctx, &clusters, &c, c.status.is_some(), &previous, status).await?;
        return Ok(Action::requeue(Duration::from_secs(300)));
    }

    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), &n.namespace);
    let existing = sts_api.get_opt(&n.name).await?;
    let founding = existing
        .as_ref()
        .and_then(|s| s.annotations().get(FOUNDING_REPLICAS))
        .and_then(|v| v.parse().ok())
        .unwrap_or(c.spec.replicas);
    let size = existing
        .as_ref()
        .and_then(sts_storage_size)
        .unwrap_or_else(|| c.spec.storage.size.clone());

    let admin = admin_client(&ctx, &c).await?;
    let (view, spate_error) = match admin.cluster().await {
        Ok(v) => (Some(v), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let sts_replicas = existing
        .as_ref()
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.replicas);
    let step = plan::scale_step(
        c.spec.replicas,
        sts_replicas,
        view.as_ref(),
        previous.balanced_replicas,
    );
    let mut balanced = previous.balanced_replicas;
    let mut action_error = None;
    if let Some(action) = &step.action {
        let r = match action {
            SpateAction::AddNode(id) => admin.add_node(*id, &node_addr(&c, &n, *id)).await,
            SpateAction::Decommission(id) => admin.decommission(*id).await,
            SpateAction::Balance => admin.balance().await,
        };
        ctx.metrics.spate_call(
            match action {
                SpateAction::AddNode(_) => "add_node",
                SpateAction::Decommission(_) => "decommission",
                SpateAction::Balance => "balance",
            },
            r.is_ok(),
        );
        match r {
            Ok(()) => tracing::info!(cluster = %n.name, ?action, "spate operation started"),
            Err(e) => {
                tracing::warn!(cluster = %n.name, ?action, error = %e, "spate operation failed");
                action_error = Some(e.to_string());
            }
        }
        if matches!(action, SpateAction::Balance) && action_error.is_none() {
            balanced = Some(c.spec.replicas);
        }
    } else if step.balanced {
        balanced = Some(c.spec.replicas);
    }
    if sts_replicas.is_none() {
        // A new cluster's founding nodes need no balancing.
        balanced = Some(c.spec.replicas);
    }

    // Rolling updates: a new template holds every pod back, then one pod at a time.
    let template = desired::pod_template(&c, founding)?;
    let template_hash = desired::hash_of(&template);
    let template_changed = existing
        .as_ref()
        .is_some_and(|s| s.annotations().get(TEMPLATE_HASH) != Some(&template_hash));
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &n.namespace);
    let selector = desired::selector(&n.name)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods: Vec<PodState> = pods_api
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .iter()
        .filter_map(pod_state)
        .collect();
    let sts_state = existing.as_ref().map(|s| StsState {
        partition: s
            .spec
            .as_ref()
            .and_then(|sp| sp.update_strategy.as_ref())
            .and_then(|u| u.rolling_update.as_ref())
            .and_then(|r| r.partition)
            .unwrap_or(0),
        update_revision: s.status.as_ref().and_then(|st| st.update_revision.clone()),
        observed: s.status.as_ref().and_then(|st| st.observed_generation) == s.metadata.generation,
    });
    let all_nodes_in = view
        .as_ref()
        .is_some_and(|v| (1..=step.sts_replicas as u64).all(|id| v.has_node(id)));
    let spate_healthy = view.as_ref().is_some_and(SpateView::healthy) && all_nodes_in;
    let roll = plan::roll_step(
        step.sts_replicas,
        template_changed,
        &sts_state.clone().unwrap_or_default(),
        &pods,
        spate_healthy,
    );

    // Owned objects, the ConfigMap first so rolled pods read the new config.
    let ns = &n.namespace;
    ctx.apply(
        &Api::<ConfigMap>::namespaced(client.clone(), ns),
        &desired::config_map(&c)?,
    )
    .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    ctx.apply(&services, &desired::headless_service(&c)?)
        .await?;
    ctx.apply(&services, &desired::client_service(&c)?).await?;
    ctx.apply(
        &Api::<PodDisruptionBudget>::namespaced(client.clone(), ns),
        &desired::pdb(&c)?,
    )
    .await?;
    let sts = desired::statefulset(&c, founding, step.sts_replicas, roll.partition, &size)?;
    if ctx.apply(&sts_api, &sts).await? && (roll.rolling || template_changed) {
        tracing::info!(cluster = %n.name, partition = roll.partition, "rolling update step");
    }
    // A claim template cannot change: a larger storage.size is applied to each claim.
    let resize_error = if size != c.spec.storage.size {
        resize_claims(&ctx, &n, step.sts_replicas, &c.spec.storage.size)
            .await
            .err()
            .map(|e| e.to_string())
    } else {
        None
    };
    if c.spec.metrics.service_monitor && has_service_monitor_crd(&ctx).await {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
            "servicemonitors",
        );
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
        ctx.apply_dynamic(&api, &desired::service_monitor(&c)?)
            .await?;
    }

    // Status.
    let sts_status = existing.as_ref().and_then(|s| s.status.clone());
    let ready_replicas = sts_status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let mut wants = Vec::new();
    let progress = step.progress.clone().or_else(|| {
        roll.rolling.then(|| {
            (
                "RollingUpdate",
                roll.waiting
                    .clone()
                    .unwrap_or_else(|| format!("updating pods from ordinal {}", roll.partition)),
            )
        })
    });
    match &progress {
        Some((reason, msg)) => wants.push(Want::new("Progressing", true, *reason, msg.clone())),
        None => wants.push(Want::new(
            "Progressing",
            false,
            "Stable",
            "nothing in progress",
        )),
    }
    let degraded = if let Some((reason, msg)) = &step.refusal {
        Some((reason.to_string(), msg.clone()))
    } else if let Some(e) = &resize_error {
        Some((
            "StorageResizeFailed".to_string(),
            format!("growing the volumes to {}: {e}", c.spec.storage.size),
        ))
    } else if let Some(e) = &action_error {
        Some(("SpateOperationFailed".to_string(), e.clone()))
    } else if let Some(e) = &spate_error {
        Some(("AdminApiUnreachable".to_string(), e.clone()))
    } else if view
        .as_ref()
        .is_some_and(|v| v.under_replicated > 0 || v.offline > 0)
    {
        let v = view
            .as_ref()
            .map(|v| (v.under_replicated, v.offline))
            .unwrap_or_default();
        Some((
            "UnderReplicatedPartitions".to_string(),
            format!("{} under-replicated, {} offline partitions", v.0, v.1),
        ))
    } else {
        None
    };
    match &degraded {
        Some((reason, msg)) => wants.push(Want::new("Degraded", true, reason.clone(), msg.clone())),
        None => wants.push(Want::new("Degraded", false, "Healthy", "no problem seen")),
    }
    // A node below its free-space watermark still serves (Ready stays), but refuses produce.
    let health = nodes_health(&admin, &c, &n, step.sts_replicas).await;
    let (disk_full, reason, message) = plan::disk_full_condition(&health);
    wants.push(Want::new("DiskFull", disk_full, reason, message));
    let ready = progress.is_none() && degraded.is_none() && ready_replicas >= c.spec.replicas;
    wants.insert(
        0,
        if ready {
            Want::new(
                "Ready",
                true,
                "Ready",
                format!("{} nodes ready", c.spec.replicas),
            )
        } else {
            let (reason, msg) = degraded
                .clone()
                .or_else(|| progress.clone().map(|(r, m)| (r.to_string(), m)))
                .unwrap_or_else(|| {
                    (
                        "PodsNotReady".into(),
                        format!("{ready_replicas}/{} pods ready", c.spec.replicas),
                    )
                });
            Want::new("Ready", false, reason, msg)
        },
    );
    let status = SpateClusterStatus {
        observed_generation: c.metadata.generation,
        replicas: sts_status.as_ref().map(|s| s.replicas).unwrap_or(0),
        ready_replicas,
        nodes: view
            .as_ref()
            .map(|v| v.nodes.keys().map(|i| *i as i64).collect())
            .unwrap_or_else(|| previous.nodes.clone()),
        controller: view.as_ref().and_then(|v| v.controller),
        under_replicated_partitions: view.as_ref().map(|v| v.under_replicated),
        balanced_replicas: balanced,
        conditions: merge(&previous.conditions, &wants, c.metadata.generation, now()),
    };
    patch_status(&ctx, &clusters, &c, c.status.is_some(), &previous, status).await?;
    // A full disk is looked at again soon too, so the condition clears once space is back.
    let busy =
        progress.is_some() || degraded.is_some() || disk_full || ready_replicas < c.spec.replicas;
    Ok(Action::requeue(Duration::from_secs(if busy {
        3
    } else {
        60
    })))
}

/// Merge patches name the operator as field manager too, so the audit log tells its writes.
fn merge_params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    }
}

/// Asks for `size` on every data claim of the first `replicas` pods that has less (the
/// volume's storage class must allow expansion).
async fn resize_claims(ctx: &Ctx, n: &Names, replicas: i32, size: &str) -> Result<(), Error> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &n.namespace);
    for i in 0..replicas {
        let name = format!("data-{}-{i}", n.name);
        let Some(pvc) = pvcs.get_opt(&name).await? else {
            continue;
        };
        let current = pvc
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map(|q| q.0.as_str());
        if !plan::claim_needs_resize(current, size) {
            continue;
        }
        let patch = json!({"spec": {"resources": {"requests": {"storage": size}}}});
        pvcs.patch(&name, &merge_params(), &Patch::Merge(patch))
            .await?;
        ctx.metrics.write("PersistentVolumeClaim", "patch");
        tracing::info!(claim = %name, size, "volume resize requested");
    }
    Ok(())
}

fn now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

/// Writes a resource's status when it differs from what was read (one counted write).
async fn patch_status<K, S>(
    ctx: &Ctx,
    api: &Api<K>,
    resource: &K,
    had_status: bool,
    previous: &S,
    status: S,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    S: Serialize + PartialEq,
{
    if &status == previous && had_status {
        return Ok(());
    }
    api.patch_status(
        &resource.name_any(),
        &merge_params(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await?;
    ctx.metrics.write(&K::kind(&()), "status");
    Ok(())
}

/// What to do after a failed reconcile: try again soon.
pub fn error_policy<K>(_obj: Arc<K>, e: &Error, ctx: Arc<Ctx>) -> Action {
    tracing::warn!(error = %e, "reconcile failed");
    ctx.metrics.reconcile_error();
    Action::requeue(Duration::from_secs(5))
}

/// Reconciles one SpateTopic into its cluster.
pub async fn reconcile_topic(t: Arc<SpateTopic>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    ctx.metrics.reconcile("SpateTopic");
    let ns = t.namespace().unwrap_or_default();
    let topics: Api<SpateTopic> = Api::namespaced(ctx.client.clone(), &ns);
    let has_finalizer = t.finalizers().iter().any(|f| f == TOPIC_FINALIZER);
    let wants_finalizer = t.spec.deletion_policy == DeletionPolicy::Delete;
    let deleting = t.metadata.deletion_timestamp.is_some();
    let clusters: Api<SpateCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let cluster = clusters.get_opt(&t.spec.cluster).await?;

    if deleting {
        if has_finalizer {
            if let (Some(c), DeletionPolicy::Delete) = (&cluster, t.spec.deletion_policy) {
                admin_client(&ctx, c)
                    .await?
                    .delete_topic(&t.topic_name())
                    .await?;
                ctx.metrics.spate_call("delete_topic", true);
                tracing::info!(topic = %t.topic_name(), "deleted topic (deletion policy Delete)");
            }
            set_finalizers(&ctx, &topics, &t, false).await?;
        }
        return Ok(Action::await_change());
    }
    if wants_finalizer != has_finalizer {
        set_finalizers(&ctx, &topics, &t, wants_finalizer).await?;
    }
    let previous = t.status.clone().unwrap_or_default();
    let mut status = previous.clone();
    status.observed_generation = t.metadata.generation;
    let Some(cluster) = cluster else {
        let w = [Want::new(
            "Ready",
            false,
            "ClusterNotFound",
            format!("SpateCluster {} does not exist", t.spec.cluster),
        )];
        status.conditions = merge(&previous.conditions, &w, t.metadata.generation, now());
        patch_status(&ctx, &topics, &t, t.status.is_some(), &previous, status).await?;
        return Ok(Action::requeue(Duration::from_secs(30)));
    };
    let admin = admin_client(&ctx, &cluster).await?;
    let topic = t.topic_name();
    let outcome: Result<Option<plan::TopicDiffError>, SpateError> = async {
        let mut actual = admin.topic(&topic).await?;
        if let Some(a) = actual.as_mut() {
            a.replication_factor = admin
                .cluster()
                .await
                .ok()
                .and_then(|v| v.topic_rf.get(&topic).copied());
        }
        let ops = match plan::topic_diff(
            t.spec.partitions,
            t.spec.replication_factor,
            &t.spec.config,
            actual.as_ref(),
        ) {
            Ok(ops) => ops,
            Err(e) => {
                if let Some(a) = &actual {
                    status.partitions = Some(a.partitions);
                    status.replication_factor = a.replication_factor;
                    status.topic_id = a.id.clone();
                }
                return Ok(Some(e));
            }
        };
        for op in &ops {
            match op {
                TopicOp::Create {
                    partitions,
                    replication_factor,
                    configs,
                } => {
                    admin
                        .create_topic(&topic, *partitions, *replication_factor, configs)
                        .await?;
                    ctx.metrics.spate_call("create_topic", true);
                }
                TopicOp::AddPartitions(n) => {
                    admin.add_partitions(&topic, *n).await?;
                    ctx.metrics.spate_call("add_partitions", true);
                }
                TopicOp::AlterConfigs(changes) => {
                    admin.alter_configs(&topic, changes).await?;
                    ctx.metrics.spate_call("alter_configs", true);
                }
            }
            tracing::info!(topic = %topic, ?op, "topic changed");
        }
        let after = if ops.is_empty() {
            actual
        } else {
            admin.topic(&topic).await?
        };
        if let Some(a) = after {
            status.partitions = Some(a.partitions);
            status.topic_id = a.id;
            status.replication_factor = a
                .replication_factor
                .or_else(|| Some(t.spec.replication_factor));
        }
        Ok(None)
    }
    .await;
    let (want, requeue) = match &outcome {
        Ok(None) => (
            Want::new(
                "Ready",
                true,
                "Reconciled",
                format!("topic {topic} matches the spec"),
            ),
            120,
        ),
        Ok(Some(e @ plan::TopicDiffError::PartitionDecrease { .. })) => (
            Want::new("Ready", false, "PartitionDecreaseRefused", e.to_string()),
            60,
        ),
        Ok(Some(e)) => (
            Want::new(
                "Ready",
                false,
                "ReplicationFactorChangeRefused",
                e.to_string(),
            ),
            60,
        ),
        Err(e) => (Want::new("Ready", false, "SpateError", e.to_string()), 10),
    };
    status.conditions = merge(&previous.conditions, &[want], t.metadata.generation, now());
    patch_status(&ctx, &topics, &t, t.status.is_some(), &previous, status).await?;
    Ok(Action::requeue(Duration::from_secs(requeue)))
}

async fn set_finalizers(
    ctx: &Ctx,
    api: &Api<SpateTopic>,
    t: &SpateTopic,
    on: bool,
) -> Result<(), Error> {
    let mut fs: Vec<String> = t
        .finalizers()
        .iter()
        .filter(|f| *f != TOPIC_FINALIZER)
        .cloned()
        .collect();
    if on {
        fs.push(TOPIC_FINALIZER.into());
    }
    // The resourceVersion makes this fail rather than drop another controller's finalizer.
    let patch = json!({"metadata": {"finalizers": fs, "resourceVersion": t.resource_version()}});
    api.patch(&t.name_any(), &merge_params(), &Patch::Merge(patch))
        .await?;
    ctx.metrics.write("SpateTopic", "finalizer");
    Ok(())
}

/// Node ids (1-based) to inter-node addresses parsed from the NODE_ADDRESSES annotation.
pub fn parse_node_addresses(list: &str) -> BTreeMap<u64, String> {
    list.split(',')
        .filter_map(|e| e.trim().split_once('='))
        .filter_map(|(i, a)| Some((i.trim().parse().ok()?, a.trim().to_string())))
        .collect()
}
