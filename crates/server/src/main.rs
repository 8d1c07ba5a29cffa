//! `spate`: a Kafka-compatible broker in one binary.

#[global_allocator]
static ALLOCATOR: spate_protocol::alloc::HostileLengthAllocator =
    spate_protocol::alloc::HostileLengthAllocator;

mod cluster_cli;
mod config;
mod connection;
mod limits;
mod record_schemas;
mod registry_hooks;
mod search_schemas;
mod tls;

use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::config::Args;

fn main() -> anyhow::Result<()> {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == "cluster") {
        // `spate cluster ...`: a client of a running node's admin API, not a broker.
        let code = cluster_cli::run(argv.into_iter().skip(1))?;
        std::process::exit(code);
    }
    let args = Args::load()?;
    init_logging(&args.log_level, args.log_format == "json");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("spate-worker")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run(args))
}

fn init_logging(level: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let specs = args.listener_specs()?;
    let mut listeners = Vec::new();
    let mut bound_listeners = Vec::new();
    for spec in &specs {
        let addr = if spec.host.is_empty() {
            format!("0.0.0.0:{}", spec.port)
        } else {
            spec.address()
        };
        let l = TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {spec}"))?;
        let at = l.local_addr().context("reading the bound address")?;
        bound_listeners.push(spate_broker::security::Listener {
            protocol: spec.protocol,
            host: at.ip().to_string(),
            port: at.port(),
        });
        listeners.push((spec.protocol, l));
    }
    let bound = listeners[0]
        .1
        .local_addr()
        .context("reading the bound address")?;
    let advertised = args.advertised_listeners(&bound_listeners)?;
    let mut config = args.broker_config(bound)?;
    config.advertised_host = advertised[0].host.clone();
    config.advertised_port = i32::from(advertised[0].port);
    if args.listeners.is_some() {
        config.listeners = advertised.clone();
    }
    let server_cert = match (&args.ssl_cert, &args.ssl_key) {
        (Some(cert), Some(key)) => {
            let cert = tls::ServerCert::load(cert, key)?;
            cert.watch();
            Some(cert)
        }
        _ => None,
    };
    let tls = match &server_cert {
        Some(cert) => {
            let client_auth = tls::ClientAuth::parse(&args.ssl_client_auth)?;
            Some((
                tls::acceptor(cert.clone(), args.ssl_ca.as_deref(), client_auth)?,
                tls::acceptor(cert.clone(), None, tls::ClientAuth::None)?,
            ))
        }
        None => None,
    };
    // HTTPS shares the Kafka listeners' certificate (and its reloading).
    let https = match (&server_cert, args.http_tls()?) {
        (Some(cert), true) => Some(tls::acceptor(cert.clone(), None, tls::ClientAuth::None)?),
        _ => None,
    };
    let mut cluster_args = args.cluster_args()?;
    if let Some(c) = cluster_args.as_mut() {
        if args.cluster_tls()? {
            if let (Some(cert), Some(ca)) = (&server_cert, &args.ssl_ca) {
                c.node.transport = tls::inter_node(cert.clone(), ca)?;
            }
        } else if args.authorizer.trim() == "acl" {
            tracing::warn!("ACLs are on but inter-node traffic is plain TCP: whoever reaches --cluster-listen acts as a node; turn on --cluster-tls, or keep that port on a network only the nodes reach");
        }
    }
    let effective = args.effective_json();
    tracing::debug!(config = %effective, "effective configuration");
    // HTTP first, so /health answers and /ready says "not yet" while logs recover.
    let http = TcpListener::bind(&args.http_listen)
        .await
        .with_context(|| format!("cannot listen for HTTP on {}", args.http_listen))?;
    let http_bound = http.local_addr().context("reading the HTTP address")?;
    if let Some(c) = cluster_args.as_mut() {
        c.settings.advertised_http =
            Some(args.advertised_http(http_bound, &config.advertised_host));
    }
    let http_state = spate_http::HttpState::with_ingest(
        args.admin_token.clone(),
        effective,
        args.ingest_config()?,
    );
    http_state.set_auth(args.http_auth()?);
    if https.is_some() && cluster_args.is_some() {
        let Some(ca) = &args.ssl_ca else {
            anyhow::bail!("--http-tls true in a cluster needs --ssl-ca: nodes call each other's HTTPS listeners (search fan-out) and check their certificates against it");
        };
        let client = tls::client_trusting(ca)?;
        http_state.set_peer_tls(spate_http::tls::PeerTls(Some(
            tokio_rustls::TlsConnector::from(Arc::new(client)),
        )));
    }
    let serving = http_state.clone();
    let serving_https = https.clone();
    tokio::spawn(async move {
        if let Err(e) = spate_http::serve(http, serving, serving_https).await {
            tracing::error!("HTTP listener failed: {e}");
        }
    });
    let ingest_bound = match &args.ingest_listen {
        Some(addr) => {
            let l = TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen for HTTP ingest on {addr}"))?;
            let bound = l.local_addr().context("reading the ingest address")?;
            let serving = http_state.clone();
            let https = https.clone();
            tokio::spawn(async move {
                if let Err(e) = spate_http::serve_ingest(l, serving, https).await {
                    tracing::error!("HTTP ingest listener failed: {e}");
                }
            });
            Some(bound)
        }
        None => None,
    };
    // Bound before recovery so a taken port fails the start at once; served once the
    // registry has read `_schemas`.
    let registry_listener = match &args.schema_registry_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen for the schema registry on {addr}"))?,
        ),
        None => None,
    };
    let data_dir = config.data_dir.clone();
    let clock = spate_broker::time::SystemClock::shared();
    let (broker, notes) =
        tokio::task::spawn_blocking(move || spate_broker::Broker::open_with_clock(config, clock))
            .await
            .context("recovery task failed")?
            .with_context(|| format!("opening data dir {}", data_dir.display()))?;
    for n in notes {
        tracing::warn!("recovery: {n}");
    }
    broker.spawn_background();
    let cluster = match cluster_args {
        Some(mut c) => {
            c.node.kafka = Some(inter_node_kafka(broker.clone()));
            refuse_taken_node_id(&c.node).await?;
            let node = spate_cluster::node::MetadataNode::start(c.node)
                .await
                .context("starting the metadata quorum node")?;
            Some(broker.join_cluster(node, c.settings)?)
        }
        None => None,
    };
    // The registry starts (reads `_schemas`) before the indexers, so records of schema'd
    // topics found at start decode rather than being indexed as text for want of their ids.
    let registry = match &registry_listener {
        Some(_) => {
            let log = spate_schema_registry::BrokerLog::new(
                broker.clone(),
                std::time::Duration::from_secs(30),
            );
            Some(spate_schema_registry::Registry::start(Arc::new(log), Default::default()).await)
        }
        None => None,
    };
    let mut search_config = spate_search::SearchConfig::new(&broker.config.data_dir);
    search_config.value_decoder = registry
        .as_ref()
        .map(|r| spate_search::SharedDecoder(Arc::new(search_schemas::RegistryDecoder(r.clone()))));
    search_config.writer_memory_bytes = args.search_indexer_memory_bytes.max(15_000_000);
    search_config.indexer.commit_interval =
        std::time::Duration::from_millis(args.search_commit_interval_ms.clamp(10, 500));
    search_config.indexer_nice = args.search_indexer_nice.clamp(0, 19);
    if args.search_indexer_threads > 0 {
        search_config.indexer_threads = args.search_indexer_threads.min(64);
    }
    search_config.max_open_writers = args.search_max_open_writers.clamp(1, 256);
    search_config.indexer_idle = args.search_indexer_idle;
    search_config.query_timeout = std::time::Duration::from_millis(args.search_timeout_ms.max(1));
    let search = spate_search::SearchService::start(broker.clone(), search_config)
        .context("starting the search indexers")?;
    http_state.set_search(search.clone());
    http_state.set_ready(broker.clone());
    let registry_note = match registry_listener.zip(registry) {
        Some((l, registry)) => {
            let bound = l
                .local_addr()
                .context("reading the schema registry address")?;
            let counters = registry.clone();
            http_state.add_metrics(Box::new(move || counters.metrics.render()));
            // Writes off the node leading _schemas go to it through its HTTP listener, from
            // the registry's API and from HTTP ingest alike.
            let forward = cluster.as_ref().map(|_| {
                Arc::new(registry_hooks::ToLeader {
                    http: http_state.clone(),
                    broker: broker.clone(),
                }) as Arc<dyn spate_schema_registry::forward::Forward>
            });
            http_state.set_record_schemas(Arc::new(record_schemas::RegistrySchemas {
                registry: registry.clone(),
                forward: forward.clone(),
            }));
            // The same users, token and ACLs as the HTTP endpoints.
            let hooks = spate_schema_registry::api::Hooks {
                access: args.http_auth()?.basic.then(|| {
                    Arc::new(registry_hooks::HttpUsers {
                        http: http_state.clone(),
                        broker: broker.clone(),
                    }) as Arc<dyn spate_schema_registry::access::Access>
                }),
                forward,
            };
            let shown = registry.clone();
            let listen = bound.to_string();
            http_state.set_schema_registry(spate_http::SchemaRegistry {
                api: spate_schema_registry::api::router_with(registry.clone(), hooks.clone()),
                status: Box::new(move || {
                    let mut v = serde_json::to_value(shown.status()).unwrap_or_default();
                    v["enabled"] = serde_json::Value::Bool(true);
                    v["listen"] = serde_json::Value::String(listen.clone());
                    v
                }),
            });
            // HTTPS with --http-tls, as every HTTP listener of the node.
            let app = spate_schema_registry::api::router_with(registry, hooks);
            tokio::spawn(async move {
                if let Err(e) = spate_http::serve_router(l, app, https).await {
                    tracing::error!("schema registry listener failed: {e}");
                }
            });
            format!(", schema registry on {bound}")
        }
        None => String::new(),
    };
    let ingest_note = ingest_bound
        .map(|a| format!(", ingest on {a}"))
        .unwrap_or_default();
    let listeners_note = if args.listeners.is_some() {
        let list: Vec<String> = bound_listeners.iter().map(|l| l.to_string()).collect();
        format!(", listeners {}", list.join(","))
    } else {
        String::new()
    };
    println!(
        "spate listening on {bound} (advertised as {}:{}), http on {http_bound}, data in {}, fsync {}{ingest_note}{registry_note}{listeners_note}",
        broker.config.advertised_host,
        broker.config.advertised_port,
        data_dir.display(),
        args.fsync
    );
    let accept = async {
        // Bound already, so clients queue in the backlog; answered once this node's view of
        // the cluster is no older than the quorum's (a stale view sends clients to old
        // leaders and shows ISRs that are gone).
        if let Some(c) = &cluster {
            tracing::info!(
                "waiting to catch up with the metadata quorum before answering Kafka requests"
            );
            c.caught_up().await;
            tracing::info!("caught up with the metadata quorum: answering Kafka requests");
        }
        let limits = Arc::new(limits::ConnectionLimits::new(
            broker.config.max_connections,
            broker.config.max_connections_per_ip,
        ));
        let auth_timeout =
            std::time::Duration::from_millis(args.connections_auth_timeout_ms.max(1));
        let loops = listeners.into_iter().map(|(protocol, l)| {
            let acceptor = tls.as_ref().map(|(ssl, sasl_ssl)| match protocol {
                spate_broker::security::SecurityProtocol::SaslSsl => sasl_ssl.clone(),
                _ => ssl.clone(),
            });
            let acceptor = acceptor.filter(|_| protocol.uses_tls());
            accept_loop(
                l,
                Listening {
                    protocol,
                    acceptor,
                    auth_timeout,
                },
                broker.clone(),
                limits.clone(),
            )
        });
        futures::future::try_join_all(loops).await.map(|_| ())
    };
    tokio::select! {
        r = accept => r?,
        _ = shutdown_signal() => tracing::info!("shutting down"),
    }
    // Fire-and-forget records were promised delivery: the queue drains before anything stops.
    if !http_state
        .ingest()
        .shutdown(std::time::Duration::from_secs(30))
        .await
    {
        tracing::warn!(
            "HTTP ingest queue not drained within 30 s; records still queued were not delivered"
        );
    }
    if let Some(c) = cluster {
        // Controlled shutdown: leaderships move away before this node stops answering.
        c.leave(true).await;
        c.node().clone().shutdown().await;
    }
    // Indexers take their last turns on the runtime while this waits for them.
    let _ = tokio::task::spawn_blocking(move || search.shutdown()).await;
    broker.shutdown();
    Ok(())
}

/// Refuses to start when something already answers on this node's address in
/// `--cluster-peers` while this process listens elsewhere: another process runs as this node
/// id, and a second voter with one id would corrupt the quorum.
async fn refuse_taken_node_id(node: &spate_cluster::node::NodeConfig) -> anyhow::Result<()> {
    let Some(own) = node.peers.get(&node.node_id) else {
        return Ok(());
    };
    let same = tokio::net::lookup_host(own.as_str())
        .await
        .map(|mut addrs| addrs.any(|a| a == node.listen))
        .unwrap_or(false);
    if same {
        // Binding will fail with "address in use" if another process holds it.
        return Ok(());
    }
    let probe = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        tokio::net::TcpStream::connect(own.as_str()),
    )
    .await;
    if let Ok(Ok(_)) = probe {
        anyhow::bail!(
            "node id {id} is taken: {own}, its address in --cluster-peers, already answers, so another process runs as node {id}; refusing to start a second voter with the same id",
            id = node.node_id
        );
    }
    Ok(())
}

/// Serves Kafka requests other nodes send on the inter-node port (replica fetches, epoch
/// lookups, forwarded produces, transaction markers) as the cluster's own traffic.
fn inter_node_kafka(broker: Arc<spate_broker::Broker>) -> spate_cluster::transport::KafkaHandoff {
    spate_cluster::transport::KafkaHandoff::new(move |stream, peer| {
        let broker = broker.clone();
        tokio::spawn(async move {
            let session = Arc::new(spate_broker::security::Session::internal(Some(peer.ip())));
            let (rd, wr) = tokio::io::split(stream);
            if let Err(e) = connection::serve(broker, rd, wr, peer, session, None).await {
                tracing::debug!(%peer, "inter-node Kafka connection closed: {e}");
            }
        });
    })
}

/// What a listener does with the connections it accepts.
struct Listening {
    protocol: spate_broker::security::SecurityProtocol,
    /// TLS for SSL and SASL_SSL listeners.
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    /// How long a connection may take to finish TLS and SASL.
    auth_timeout: std::time::Duration,
}

async fn accept_loop(
    listener: TcpListener,
    how: Listening,
    broker: Arc<spate_broker::Broker>,
    limits: Arc<limits::ConnectionLimits>,
) -> anyhow::Result<()> {
    let how = Arc::new(how);
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let Some(slot) = limits.admit(peer.ip()) else {
                    broker.metrics.connections_rejected.inc();
                    limits.log_refusal(peer.ip());
                    drop(stream);
                    continue;
                };
                broker.metrics.connections_accepted.inc();
                broker.metrics.connections_open.add(1);
                let broker = broker.clone();
                let how = how.clone();
                tokio::spawn(async move {
                    match accepted(broker.clone(), stream, peer, &how).await {
                        Ok(()) => {}
                        // A flood of bad handshakes must not flood the log: at most one line
                        // a second per address.
                        Err(
                            e @ (connection::ConnectionError::Tls(_)
                            | connection::ConnectionError::AuthTimeout),
                        ) => broker.credentials.log_failure(
                            Some(peer.ip()),
                            "ANONYMOUS",
                            how.protocol.name(),
                            &e.to_string(),
                        ),
                        Err(e) => tracing::warn!(%peer, "closing connection: {e}"),
                    }
                    broker.metrics.connections_open.add(-1);
                    drop(slot);
                });
            }
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::error!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Serves one accepted connection: TLS first on SSL listeners (bounded by the auth timeout),
/// then the Kafka protocol with the connection's security session.
async fn accepted(
    broker: Arc<spate_broker::Broker>,
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    how: &Listening,
) -> Result<(), connection::ConnectionError> {
    use spate_broker::security::Session;
    stream.set_nodelay(true)?;
    let started = std::time::Instant::now();
    let deadline = (how.protocol != spate_broker::security::SecurityProtocol::Plaintext)
        .then(|| tokio::time::Instant::from_std(started + how.auth_timeout));
    let Some(acceptor) = &how.acceptor else {
        let session = Arc::new(Session::new(how.protocol, Some(peer.ip()), None));
        let (rd, wr) = stream.into_split();
        return connection::serve(broker, rd, wr, peer, session, deadline).await;
    };
    let handshake = tls::accept(acceptor.config().clone(), stream);
    let tls = match tokio::time::timeout(how.auth_timeout, handshake).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(connection::ConnectionError::Tls(e.to_string())),
        Err(_) => {
            return Err(connection::ConnectionError::Tls(
                "the TLS handshake did not finish in time".into(),
            ))
        }
    };
    let principal = tls
        .client_certificate
        .as_ref()
        .and_then(|c| tls::certificate_principal(c))
        .map(spate_auth::Principal::user);
    let session = Arc::new(Session::new(how.protocol, Some(peer.ip()), principal));
    connection::serve(broker, tls.reader, tls.writer, peer, session, deadline).await
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
