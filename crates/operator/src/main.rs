//! `spate-operator`: reconciles SpateCluster and SpateTopic resources (`run`), or prints the
//! CRDs generated from its types (`crds`).

mod conditions;
mod controller;
mod crd;
mod desired;
mod metrics;
mod plan;
mod spate;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use axum::http::StatusCode;
use axum::routing::get;
use clap::{Parser, Subcommand};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::{watcher, Controller};
use kube::{Api, Client, Resource};
use kube_lease_manager::LeaseManagerBuilder;

use crate::controller::Ctx;
use crate::crd::{SpateCluster, SpateTopic};
use crate::metrics::Metrics;

/// The spate Kubernetes operator.
#[derive(Debug, Parser)]
#[command(name = "spate-operator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions (YAML) generated from the operator's types.
    Crds,
    /// Reconcile SpateClusters and SpateTopics (kubeconfig from KUBECONFIG, ~/.kube/config or
    /// the pod's service account).
    Run(RunArgs),
}

#[derive(Debug, Parser)]
struct RunArgs {
    /// Namespace to watch; all namespaces when unset.
    #[arg(long, env = "SPATE_OPERATOR_NAMESPACE")]
    namespace: Option<String>,
    /// Elect one leader among the replicas with a Lease; the others stand by.
    #[arg(long, env = "SPATE_OPERATOR_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,
    /// Name of the leader Lease.
    #[arg(
        long,
        env = "SPATE_OPERATOR_LEASE_NAME",
        default_value = "spate-operator"
    )]
    lease_name: String,
    /// Namespace of the leader Lease (default: POD_NAMESPACE, else --namespace, else `default`).
    #[arg(long, env = "SPATE_OPERATOR_LEASE_NAMESPACE")]
    lease_namespace: Option<String>,
    /// How long a Lease holds without renewal: a standby takes over within this after the
    /// leader dies.
    #[arg(
        long,
        env = "SPATE_OPERATOR_LEASE_DURATION_SECONDS",
        default_value_t = 15
    )]
    lease_duration_seconds: u64,
    /// How long before expiry the leader renews its Lease.
    #[arg(long, env = "SPATE_OPERATOR_LEASE_GRACE_SECONDS", default_value_t = 5)]
    lease_grace_seconds: u64,
    /// Address of the operator's HTTP listener (/health, /ready, /metrics).
    #[arg(
        long,
        env = "SPATE_OPERATOR_HTTP_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    http_listen: String,
    /// Log filter (RUST_LOG wins).
    #[arg(long, env = "SPATE_OPERATOR_LOG_LEVEL", default_value = "info")]
    log_level: String,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crds => {
            print!("{}", crd::crds_yaml().context("writing the CRDs as YAML")?);
            Ok(())
        }
        Command::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the runtime")?
            .block_on(run(args)),
    }
}

/// The Lease holder identity: POD_NAME, else the hostname.
fn identity() -> String {
    if let Ok(p) = std::env::var("POD_NAME") {
        if !p.is_empty() {
            return p;
        }
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("spate-operator-{}", std::process::id()))
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| args.log_level.clone());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .init();
    // One TLS provider for the whole process (kube's rustls with ring).
    let client = Client::try_default()
        .await
        .context("no Kubernetes configuration (KUBECONFIG, ~/.kube/config or in-cluster)")?;
    let metrics = Metrics::new();
    let ready = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind(&args.http_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.http_listen))?;
    tracing::info!(addr = %listener.local_addr()?, "operator http listening");
    let app = {
        let m = metrics.clone();
        let r = ready.clone();
        axum::Router::new()
            .route("/health", get(|| async { "ok" }))
            .route(
                "/ready",
                get(move || {
                    let r = r.clone();
                    async move {
                        if r.load(Ordering::Relaxed) {
                            (StatusCode::OK, "ready")
                        } else {
                            (StatusCode::SERVICE_UNAVAILABLE, "starting")
                        }
                    }
                }),
            )
            .route(
                "/metrics",
                get(move || {
                    let m = m.clone();
                    async move {
                        (
                            [(
                                axum::http::header::CONTENT_TYPE,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            m.encode(),
                        )
                    }
                }),
            )
    };
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "operator http listener failed");
        }
    });
    client
        .apiserver_version()
        .await
        .context("the Kubernetes API server does not answer")?;
    ready.store(true, Ordering::Relaxed);

    let ctx = Arc::new(Ctx {
        client: client.clone(),
        metrics: metrics.clone(),
    });
    if !args.leader_election {
        metrics.set_leader(true);
        tokio::select! {
            _ = controllers(ctx, args.namespace.clone()) => {}
            _ = shutdown_signal() => {}
        }
        return Ok(());
    }
    let id = identity();
    let lease_ns = args
        .lease_namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .or_else(|| args.namespace.clone())
        .unwrap_or_else(|| "default".into());
    let manager = LeaseManagerBuilder::new(client.clone(), &args.lease_name)
        .with_namespace(&lease_ns)
        .with_identity(&id)
        .with_duration(args.lease_duration_seconds)
        .with_grace(args.lease_grace_seconds)
        .build()
        .await
        .context("setting up the leader Lease")?;
    let (mut leading, lease_task) = manager.watch().await;
    tracing::info!(identity = %id, lease = %format!("{lease_ns}/{}", args.lease_name), "standing by for the leader Lease");
    loop {
        if *leading.borrow_and_update() {
            break;
        }
        tokio::select! {
            r = leading.changed() => r.context("the Lease watcher stopped")?,
            _ = shutdown_signal() => return Ok(()),
        }
    }
    tracing::info!(identity = %id, "became leader: reconciling");
    metrics.set_leader(true);
    let outcome = tokio::select! {
        _ = controllers(ctx, args.namespace.clone()) => Ok(()),
        r = async {
            loop {
                leading.changed().await?;
                if !*leading.borrow_and_update() {
                    return Ok::<(), tokio::sync::watch::error::RecvError>(());
                }
            }
        } => {
            // Another replica may already reconcile: stop at once, the Deployment restarts us.
            r.context("the Lease watcher stopped")?;
            Err(anyhow::anyhow!("lost the leader Lease"))
        }
        _ = shutdown_signal() => Ok(()),
    };
    metrics.set_leader(false);
    // Dropping the receiver makes the manager release the Lease, so a standby need not wait
    // for it to expire.
    drop(leading);
    match tokio::time::timeout(std::time::Duration::from_secs(5), lease_task).await {
        Ok(Ok(Ok(_))) => tracing::info!("released the leader Lease"),
        _ => tracing::warn!("could not release the leader Lease; it will expire"),
    }
    outcome
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

fn api<K>(client: &Client, ns: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

async fn controllers(ctx: Arc<Ctx>, ns: Option<String>) {
    let c = &ctx.client;
    let owned = watcher::Config::default().labels("app.kubernetes.io/managed-by=spate-operator");
    let clusters = Controller::new(api::<SpateCluster>(c, &ns), watcher::Config::default())
        .owns(api::<StatefulSet>(c, &ns), owned.clone())
        .owns(api::<Service>(c, &ns), owned.clone())
        .owns(api::<ConfigMap>(c, &ns), owned.clone())
        .owns(api::<PodDisruptionBudget>(c, &ns), owned)
        .run(
            controller::reconcile_cluster,
            controller::error_policy,
            ctx.clone(),
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "cluster reconcile");
            }
        });
    let topics = Controller::new(api::<SpateTopic>(c, &ns), watcher::Config::default())
        .run(
            controller::reconcile_topic,
            controller::error_policy,
            ctx.clone(),
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "topic reconcile");
            }
        });
    futures::join!(clusters, topics);
}
