//! Renders the broker's state as Prometheus text at scrape time. Everything here runs off the
//! hot path: counters are read, partition offsets and group lag are computed now.

use spate_broker::Broker;
use spate_metrics::text::Writer;
use spate_metrics::{process, MAX_API_KEY};
use spate_protocol::messages::ApiKey;
use spate_protocol::ResponseError;

fn api_name(key: usize) -> Option<String> {
    ApiKey::try_from(key as i16).ok().map(|k| format!("{k:?}"))
}

fn error_name(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        Some(e) => format!("{e:?}"),
        None => code.to_string(),
    }
}

/// Replication and quorum metrics of a cluster node (nothing when standalone).
pub async fn render_cluster(b: &Broker) -> String {
    let Some(cluster) = b.cluster() else {
        return String::new();
    };
    let mut w = Writer::default();
    let image = cluster.image();
    let me = cluster.broker_id();
    let now = b.clock.monotonic_ms().max(0) as u64;
    let (mut leading, mut under, mut offline) = (0u64, 0u64, 0u64);
    let mut lag = Vec::new();
    for t in image.topics().values() {
        for (index, ps) in t.partitions.iter().enumerate() {
            if ps.leader.is_none() {
                offline += 1;
            }
            if ps.leader != Some(me) {
                continue;
            }
            leading += 1;
            if ps.isr.len() < ps.replicas.len() {
                under += 1;
            }
            let local = b
                .topics
                .get(&t.name)
                .and_then(|lt| lt.partition(index as i32));
            if let Some((p, view)) = local.and_then(|p| p.leader_view().map(|v| (p, v))) {
                let end = p.log_end_offset();
                for (f, progress) in view.followers() {
                    let records = if progress.log_end_offset < 0 {
                        end
                    } else {
                        (end - progress.log_end_offset).max(0)
                    };
                    let seconds = now.saturating_sub(progress.last_caught_up_ms) as f64 / 1000.0;
                    lag.push((
                        t.name.clone(),
                        index.to_string(),
                        f.to_string(),
                        records,
                        seconds,
                    ));
                }
            }
        }
    }
    w.family(
        "spate_cluster_leader_partitions",
        "gauge",
        "Partitions this node leads.",
    );
    w.sample("spate_cluster_leader_partitions", &[], leading as f64);
    w.family(
        "spate_cluster_under_replicated_partitions",
        "gauge",
        "Partitions this node leads whose ISR is smaller than their replica set.",
    );
    w.sample(
        "spate_cluster_under_replicated_partitions",
        &[],
        under as f64,
    );
    w.family(
        "spate_cluster_offline_partitions",
        "gauge",
        "Partitions without a leader, cluster-wide, as this node's metadata has it.",
    );
    w.sample("spate_cluster_offline_partitions", &[], offline as f64);
    w.family(
        "spate_cluster_isr_shrinks_total",
        "counter",
        "ISR shrinks this node committed as leader.",
    );
    w.sample(
        "spate_cluster_isr_shrinks_total",
        &[],
        cluster.metrics.isr_shrinks.get() as f64,
    );
    w.family(
        "spate_cluster_isr_expands_total",
        "counter",
        "ISR expansions this node committed as leader.",
    );
    w.sample(
        "spate_cluster_isr_expands_total",
        &[],
        cluster.metrics.isr_expands.get() as f64,
    );
    w.family(
        "spate_cluster_truncated_records_total",
        "counter",
        "Records this node cut from its logs as divergent after a leader change.",
    );
    w.sample(
        "spate_cluster_truncated_records_total",
        &[],
        cluster.metrics.truncated_records.get() as f64,
    );
    for (name, help, value) in [
        (
            "spate_cluster_throttled_replication_bytes_total",
            "Bytes this node fetched as a follower for replicas under a replication throttle.",
            cluster.metrics.throttled_bytes.get(),
        ),
        (
            "spate_cluster_leader_throttled_replication_bytes_total",
            "Bytes this node served as a leader to followers of replicas under a replication throttle.",
            cluster.metrics.leader_throttled_bytes.get(),
        ),
        (
            "spate_cluster_throttled_fetches_total",
            "Replica fetches that left throttled replicas out because the throttle rate was used up.",
            cluster.metrics.throttled_fetches.get(),
        ),
    ] {
        w.family(name, "counter", help);
        w.sample(name, &[], value as f64);
    }
    let image = cluster.image();
    w.family(
        "spate_cluster_reassigning_partitions",
        "gauge",
        "Partitions with a reassignment in progress.",
    );
    w.sample(
        "spate_cluster_reassigning_partitions",
        &[],
        image.reassignments().count() as f64,
    );
    w.family(
        "spate_cluster_follower_lag_records",
        "gauge",
        "Records a follower lacks behind this leader's log end.",
    );
    for (topic, partition, follower, records, _) in &lag {
        w.sample(
            "spate_cluster_follower_lag_records",
            &[
                ("topic", topic),
                ("partition", partition),
                ("follower", follower),
            ],
            *records as f64,
        );
    }
    w.family(
        "spate_cluster_follower_lag_seconds",
        "gauge",
        "Time since a follower last had everything this leader had.",
    );
    for (topic, partition, follower, _, seconds) in &lag {
        w.sample(
            "spate_cluster_follower_lag_seconds",
            &[
                ("topic", topic),
                ("partition", partition),
                ("follower", follower),
            ],
            *seconds,
        );
    }
    let q = cluster.node().metrics().await;
    let gauge = |w: &mut Writer, name: &str, help: &str, v: f64| {
        w.family(name, "gauge", help);
        w.sample(name, &[], v);
    };
    let idx = |v: Option<u64>| v.map_or(-1.0, |i| i as f64);
    gauge(
        &mut w,
        "spate_raft_term",
        "Current term of the metadata quorum.",
        q.term as f64,
    );
    gauge(
        &mut w,
        "spate_raft_commit_index",
        "Last metadata log index known committed.",
        idx(q.commit_index),
    );
    gauge(
        &mut w,
        "spate_raft_applied_index",
        "Last metadata log index applied here.",
        idx(q.applied_index),
    );
    gauge(
        &mut w,
        "spate_raft_last_log_index",
        "Last metadata log index stored here.",
        idx(q.last_log_index),
    );
    gauge(
        &mut w,
        "spate_cluster_controller_id",
        "The controller (metadata quorum leader) this node knows of; -1 when none.",
        cluster.controller_id().map_or(-1.0, f64::from),
    );
    gauge(
        &mut w,
        "spate_cluster_is_controller",
        "1 when this node is the controller.",
        if cluster.node().is_leader() { 1.0 } else { 0.0 },
    );
    w.finish()
}

/// One pushed metric's family: whether it is a counter, and its (labels, value) samples.
type ClientFamily = (bool, Vec<(Vec<(String, String)>, f64)>);

/// Metrics clients pushed (KIP-714): each OTLP metric becomes `spate_client_<name>` (dots
/// and other characters Prometheus does not allow become `_`), labelled with the client's
/// instance id and the data point's attributes.
fn render_client_telemetry(w: &mut Writer, b: &Broker) {
    let now = b.clock.monotonic_ms().max(0) as u64;
    let mut families: std::collections::BTreeMap<String, ClientFamily> =
        std::collections::BTreeMap::new();
    for (client, points) in b.telemetry.snapshot(now) {
        for p in points {
            let name = format!("spate_client_{}", sanitize(&p.name));
            let mut labels = vec![("client_instance_id".to_owned(), client.to_string())];
            labels.extend(
                p.attributes
                    .iter()
                    .filter(|(k, _)| sanitize(k) != "client_instance_id")
                    .map(|(k, v)| (sanitize(k), v.clone())),
            );
            let family = families.entry(name).or_insert((p.counter, Vec::new()));
            family.1.push((labels, p.value));
        }
    }
    for (name, (counter, samples)) in families {
        let kind = if counter { "counter" } else { "gauge" };
        w.family(
            &name,
            kind,
            "Pushed by Kafka clients (KIP-714 client telemetry).",
        );
        for (labels, value) in samples {
            let pairs: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            w.sample(&name, &pairs, value);
        }
    }
}

/// A metric or label name as Prometheus allows it: `[a-zA-Z0-9_]`, not starting with a digit.
fn sanitize(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// Client quota usage per quota entity: Kafka's per-user / per-client-id byte-rate,
/// throttle-time and request-time metrics.
/// Share groups (KIP-932): each group's records across its share-partitions on this broker.
fn render_share_groups(w: &mut Writer, b: &Broker) {
    let stats = b.share_group_stats();
    type Pick = fn(&spate_broker::ShareGroupStats) -> u64;
    let families: [(&str, &str, &str, Pick); 6] = [
        (
            "spate_share_group_records_in_flight",
            "gauge",
            "Records between the share-partitions' start and end offsets, whatever their state.",
            |s| s.in_flight,
        ),
        (
            "spate_share_group_records_acquired",
            "gauge",
            "Records under an acquisition lock now.",
            |s| s.acquired,
        ),
        (
            "spate_share_group_lock_expiries_total",
            "counter",
            "Acquisition locks that ran out before their record was acknowledged or released.",
            |s| s.lock_expiries,
        ),
        (
            "spate_share_group_redeliveries_total",
            "counter",
            "Records delivered again (released, or their lock ran out).",
            |s| s.redeliveries,
        ),
        (
            "spate_share_group_records_archived_total",
            "counter",
            "Records archived: rejected, at the delivery count limit, or gaps.",
            |s| s.archived,
        ),
        (
            "spate_share_group_records_accepted_total",
            "counter",
            "Records acknowledged with ACCEPT.",
            |s| s.accepted,
        ),
    ];
    for (name, kind, help, pick) in families {
        w.family(name, kind, help);
        for s in &stats {
            w.sample(name, &[("group", s.group.as_str())], pick(s) as f64);
        }
    }
}

fn render_transactions(w: &mut Writer, b: &Broker) {
    let t = &b.txns.metrics;
    w.family(
        "spate_transactions_open",
        "gauge",
        "Transactions open on the transactional ids this node coordinates.",
    );
    w.sample("spate_transactions_open", &[], b.txns.open_count() as f64);
    counters(
        w,
        &[
        (
            "spate_transactions_committed_total",
            "Transactions committed: every marker written.",
            &t.commits,
        ),
        (
            "spate_transactions_aborted_total",
            "Transactions aborted (by their producer, a fencing producer or a timeout): every marker written.",
            &t.aborts,
        ),
        (
            "spate_transactions_timed_out_total",
            "Transactions the coordinator aborted because they outlived transaction.timeout.ms.",
            &t.timed_out,
        ),
        ],
    );
    w.family(
        "spate_transaction_duration_seconds",
        "histogram",
        "From a transaction's first partition to its last marker.",
    )
    .histogram("spate_transaction_duration_seconds", &[], &t.duration, 1e6);
    w.family(
        "spate_transaction_coordinator_load_seconds",
        "histogram",
        "Time to rebuild one __transaction_state partition's transactions when this node takes it over.",
    )
    .histogram("spate_transaction_coordinator_load_seconds", &[], &t.load, 1e6);
}

/// Counters without labels, each its own family.
fn counters(w: &mut Writer, list: &[(&str, &str, &spate_metrics::Counter)]) {
    for (name, help, c) in list {
        w.family(name, "counter", help);
        w.sample(name, &[], c.get() as f64);
    }
}

/// Authentication outcomes and ACL denials per principal.
fn render_security(w: &mut Writer, b: &Broker) {
    let a = &b.auth;
    counters(
        w,
        &[
            (
                "spate_sasl_authentications_total",
                "SASL authentications that succeeded (first and re-authentications).",
                &a.successes,
            ),
            (
                "spate_sasl_authentication_failures_total",
                "SASL authentications that failed (wrong password, unknown user, malformed exchange).",
                &a.failures,
            ),
            (
                "spate_connections_closed_unauthenticated_total",
                "Connections closed for a request before authentication or after the session expired.",
                &a.closed_unauthenticated,
            ),
        ],
    );
    w.family(
        "spate_acl_denials_total",
        "counter",
        "Requests (or parts of them) the ACLs refused, by principal.",
    );
    for (principal, n) in b.authorizer.denials() {
        w.sample(
            "spate_acl_denials_total",
            &[("principal", &principal)],
            n as f64,
        );
    }
}

fn render_cleaner(w: &mut Writer, b: &Broker) {
    let now = b.clock.now_ms();
    let mut lags = Vec::new();
    for t in b.topics.list() {
        if !t.with_config(|c| c.compacted()) {
            continue;
        }
        for p in t.partitions() {
            if let Some(s) = p.cleaner_state(now) {
                let lag = (s.dirty_bytes, s.oldest_dirty_age_ms);
                lags.push((t.name.clone(), p.index.to_string(), lag));
            }
        }
    }
    w.family(
        "spate_partition_cleaner_dirty_bytes",
        "gauge",
        "Bytes of a compacted partition's sealed segments the cleaner has not cleaned yet.",
    );
    for (topic, p, (bytes, _)) in &lags {
        w.sample(
            "spate_partition_cleaner_dirty_bytes",
            &[("topic", topic), ("partition", p)],
            *bytes as f64,
        );
    }
    w.family(
        "spate_partition_cleaner_oldest_dirty_age_seconds",
        "gauge",
        "Age of the oldest uncleaned sealed segment of a compacted partition (by its newest record).",
    );
    for (topic, p, (_, age_ms)) in &lags {
        w.sample(
            "spate_partition_cleaner_oldest_dirty_age_seconds",
            &[("topic", topic), ("partition", p)],
            *age_ms as f64 / 1000.0,
        );
    }
    let c = &b.cleaner;
    counters(
        w,
        &[
            (
                "spate_log_cleaner_passes_total",
                "Cleans of a compacted partition that ran.",
                &c.passes,
            ),
            (
                "spate_log_cleaner_failures_total",
                "Cleans that failed (retried at the next pass).",
                &c.failures,
            ),
            (
                "spate_log_cleaner_read_bytes_total",
                "Bytes of segments the cleaner read.",
                &c.bytes_read,
            ),
            (
                "spate_log_cleaner_removed_bytes_total",
                "Bytes the cleaner removed from compacted partitions.",
                &c.bytes_removed,
            ),
            (
                "spate_log_cleaner_segments_total",
                "Segments the cleaner rewrote.",
                &c.segments,
            ),
        ],
    );
    w.family(
        "spate_log_cleaner_duration_seconds",
        "histogram",
        "Time to clean one compacted partition.",
    )
    .histogram("spate_log_cleaner_duration_seconds", &[], &c.duration, 1e6);
}

/// The data dir's free space and whether produce is refused for it (issue 30).
fn render_disk(w: &mut Writer, b: &Broker) {
    let d = &b.disk;
    let dir = d.dir().display().to_string();
    let labels = [("dir", dir.as_str())];
    if d.total_bytes() > 0 {
        w.family(
            "spate_disk_free_bytes",
            "gauge",
            "Free bytes of the data dir's file system at the last sample (as df shows them).",
        )
        .sample("spate_disk_free_bytes", &labels, d.free_bytes() as f64);
        w.family(
            "spate_disk_total_bytes",
            "gauge",
            "Size of the data dir's file system.",
        )
        .sample("spate_disk_total_bytes", &labels, d.total_bytes() as f64);
    }
    w.family(
        "spate_disk_min_free_bytes",
        "gauge",
        "Free bytes below which produce is refused (the larger of --disk-min-free-bytes and \
         --disk-min-free-percent).",
    )
    .sample(
        "spate_disk_min_free_bytes",
        &labels,
        d.threshold_bytes() as f64,
    );
    w.family(
        "spate_disk_full",
        "gauge",
        "1 while the data dir is below its free-space watermark (or met ENOSPC) and produce is \
         refused with KAFKA_STORAGE_ERROR (HTTP ingest 507).",
    )
    .sample(
        "spate_disk_full",
        &labels,
        if d.is_full() { 1.0 } else { 0.0 },
    );
    w.family(
        "spate_disk_watermark_crossings_total",
        "counter",
        "Times the data dir crossed its free-space watermark, either way.",
    )
    .sample(
        "spate_disk_watermark_crossings_total",
        &labels,
        d.crossings() as f64,
    );
}

fn render_quotas(w: &mut Writer, b: &Broker) {
    let stats = b.quotas.stats();
    let families = [
        (
            "spate_quota_usage_total",
            "counter",
            "Usage counted against client quotas: bytes (produce, fetch) or percent-milliseconds of handler time (request).",
        ),
        (
            "spate_quota_rate",
            "gauge",
            "Measured rate of each quota entity over the quota windows (bytes/s or percent).",
        ),
        ("spate_quota_limit", "gauge", "The quota in force for each entity."),
        (
            "spate_quota_throttle_time_ms_total",
            "counter",
            "Throttle time handed to clients over their quota, in milliseconds.",
        ),
        (
            "spate_quota_throttled_responses_total",
            "counter",
            "Responses that carried a quota throttle time.",
        ),
    ];
    for (i, (name, kind, help)) in families.into_iter().enumerate() {
        w.family(name, kind, help);
        for s in &stats {
            let user = s.key.user.as_deref().unwrap_or("");
            let client = s.key.client_id.as_deref().unwrap_or("");
            let value = match i {
                0 => s.total,
                1 => s.rate,
                2 => s.quota,
                3 => s.throttle_ms_total as f64,
                _ => s.throttled as f64,
            };
            w.sample(
                name,
                &[
                    ("quota", s.key.kind.as_str()),
                    ("user", user),
                    ("client_id", client),
                ],
                value,
            );
        }
    }
}

/// The full scrape.
pub fn render(b: &Broker) -> String {
    let m = &b.metrics;
    let mut w = Writer::default();

    w.family(
        "spate_requests_total",
        "counter",
        "Kafka requests handled, by API.",
    );
    for key in 0..=MAX_API_KEY {
        let n = m.requests[key].get();
        if let (true, Some(api)) = (n > 0, api_name(key)) {
            w.sample("spate_requests_total", &[("api", &api)], n as f64);
        }
    }
    w.family(
        "spate_request_errors_total",
        "counter",
        "Error codes returned, by API and error.",
    );
    for ((api, code), n) in m.errors() {
        let api = api_name(api.max(0) as usize).unwrap_or_else(|| api.to_string());
        w.sample(
            "spate_request_errors_total",
            &[("api", &api), ("error", &error_name(code))],
            n as f64,
        );
    }
    w.family(
        "spate_slow_requests_total",
        "counter",
        "Requests that took 100 ms or more from arrival to response, by API; the exemplar names \
         the last one (peer and correlation id). Fetch counts its long-poll wait.",
    );
    for key in 0..=MAX_API_KEY {
        let slow = &m.slow_requests[key];
        if let (true, Some(api)) = (slow.get().0 > 0, api_name(key)) {
            w.counter_with_exemplar("spate_slow_requests_total", &[("api", &api)], slow);
        }
    }
    w.family(
        "spate_request_duration_seconds",
        "histogram",
        "Time from a request's arrival to its response being ready, by API.",
    );
    for key in 0..=MAX_API_KEY {
        if let (true, Some(api)) = (m.requests[key].get() > 0, api_name(key)) {
            w.histogram(
                "spate_request_duration_seconds",
                &[("api", &api)],
                &m.request_latency[key],
                1e6,
            );
        }
    }

    render_disk(&mut w, b);
    render_quotas(&mut w, b);
    render_client_telemetry(&mut w, b);

    let topics = b.topics.list();
    for (name, help, get) in [
        (
            "spate_topic_bytes_in_total",
            "Record batch bytes appended.",
            0,
        ),
        ("spate_topic_records_in_total", "Records appended.", 1),
        (
            "spate_topic_bytes_out_total",
            "Record batch bytes sent to consumers.",
            2,
        ),
        (
            "spate_topic_records_out_total",
            "Records sent to consumers.",
            3,
        ),
    ] {
        w.family(name, "counter", help);
        for t in &topics {
            let c = match get {
                0 => &t.metrics.bytes_in,
                1 => &t.metrics.records_in,
                2 => &t.metrics.bytes_out,
                _ => &t.metrics.records_out,
            };
            w.sample(name, &[("topic", &t.name)], c.get() as f64);
        }
    }
    let partitions: Vec<_> = topics
        .iter()
        .flat_map(|t| t.partitions().into_iter().map(move |p| (t.name.clone(), p)))
        .collect();
    for (name, help) in [
        (
            "spate_partition_log_end_offset",
            "Offset the next record will get.",
        ),
        (
            "spate_partition_log_start_offset",
            "First offset still stored.",
        ),
        (
            "spate_partition_high_watermark",
            "Offset below which records are visible to consumers.",
        ),
        (
            "spate_partition_size_bytes",
            "Bytes stored by the partition.",
        ),
        (
            "spate_partition_last_stable_offset_lag",
            "High watermark minus last stable offset: records read_committed consumers cannot see yet because a transaction before them is open.",
        ),
    ] {
        w.family(name, "gauge", help);
        for (topic, p) in &partitions {
            let v = match name {
                "spate_partition_log_end_offset" => p.log_end_offset() as f64,
                "spate_partition_log_start_offset" => p.log_start_offset() as f64,
                "spate_partition_high_watermark" => p.high_watermark() as f64,
                "spate_partition_last_stable_offset_lag" => {
                    (p.high_watermark() - p.last_stable_offset()).max(0) as f64
                }
                _ => p.size_bytes() as f64,
            };
            let idx = p.index.to_string();
            w.sample(name, &[("topic", topic), ("partition", &idx)], v);
        }
    }

    render_transactions(&mut w, b);
    render_share_groups(&mut w, b);
    render_cleaner(&mut w, b);
    render_security(&mut w, b);
    w.family(
        "spate_fsync_duration_seconds",
        "histogram",
        "Duration of each fsync.",
    )
    .histogram("spate_fsync_duration_seconds", &[], &m.fsync_latency, 1e6);
    w.family(
        "spate_group_commit_logs",
        "histogram",
        "Partition logs made durable per flusher round (how many writers shared a group commit).",
    )
    .histogram("spate_group_commit_logs", &[], &m.group_commit_batch, 1.0);

    w.family(
        "spate_connections_open",
        "gauge",
        "Client connections open.",
    )
    .sample(
        "spate_connections_open",
        &[],
        m.connections_open.get() as f64,
    )
    .family(
        "spate_connections_accepted_total",
        "counter",
        "Client connections accepted.",
    )
    .sample(
        "spate_connections_accepted_total",
        &[],
        m.connections_accepted.get() as f64,
    )
    .family(
        "spate_connections_rejected_total",
        "counter",
        "Connections refused by a connection limit.",
    )
    .sample(
        "spate_connections_rejected_total",
        &[],
        m.connections_rejected.get() as f64,
    )
    .family(
        "spate_memory_in_use_bytes",
        "gauge",
        "Bytes of requests and responses in flight.",
    )
    .sample(
        "spate_memory_in_use_bytes",
        &[],
        m.memory_in_use.get() as f64,
    )
    .family(
        "spate_memory_in_use_peak_bytes",
        "gauge",
        "Highest spate_memory_in_use_bytes since start.",
    )
    .sample(
        "spate_memory_in_use_peak_bytes",
        &[],
        m.memory_in_use_peak.get() as f64,
    )
    .family(
        "spate_memory_limit_bytes",
        "gauge",
        "Limit on in-flight request and response bytes.",
    )
    .sample("spate_memory_limit_bytes", &[], m.memory_limit.get() as f64)
    .family(
        "spate_throttle_seconds_total",
        "counter",
        "Time requests waited for memory.",
    )
    .sample(
        "spate_throttle_seconds_total",
        &[],
        m.throttle_us.get() as f64 / 1e6,
    )
    .family(
        "spate_throttled_requests_total",
        "counter",
        "Requests that waited for memory.",
    )
    .sample(
        "spate_throttled_requests_total",
        &[],
        m.throttled_requests.get() as f64,
    );

    w.family(
        "spate_consumer_group_lag",
        "gauge",
        "High watermark minus committed offset, by group and partition.",
    );
    let committed: Vec<(String, String, i32, i64)> = b.groups.offsets(|o| {
        o.group_ids()
            .flat_map(|g| {
                o.group(g)
                    .into_iter()
                    .map(move |(t, p, c)| (g.to_string(), t.to_string(), p, c.offset))
            })
            .collect()
    });
    for (group, topic, partition, offset) in committed {
        if let Some(p) = b.topics.get(&topic).and_then(|t| t.partition(partition)) {
            let lag = (p.high_watermark() - offset).max(0);
            let idx = partition.to_string();
            w.sample(
                "spate_consumer_group_lag",
                &[("group", &group), ("topic", &topic), ("partition", &idx)],
                lag as f64,
            );
        }
    }
    process_metrics(&mut w);
    w.finish()
}

/// Before recovery finishes only the process is there to describe.
pub fn render_process_only() -> String {
    let mut w = Writer::default();
    process_metrics(&mut w);
    w.finish()
}

/// The standard Prometheus process metrics.
fn process_metrics(w: &mut Writer) {
    let p = process::read();
    w.family(
        "process_cpu_seconds_total",
        "counter",
        "User and system CPU time spent.",
    )
    .sample("process_cpu_seconds_total", &[], p.cpu_seconds)
    .family("process_resident_memory_bytes", "gauge", "Resident memory.")
    .sample(
        "process_resident_memory_bytes",
        &[],
        p.resident_bytes as f64,
    )
    .family("process_virtual_memory_bytes", "gauge", "Virtual memory.")
    .sample("process_virtual_memory_bytes", &[], p.virtual_bytes as f64)
    .family("process_open_fds", "gauge", "Open file descriptors.")
    .sample("process_open_fds", &[], p.open_fds as f64)
    .family(
        "process_start_time_seconds",
        "gauge",
        "Start time since the Unix epoch.",
    )
    .sample("process_start_time_seconds", &[], p.start_time_seconds);
}

/// A per-partition search metric: name, type, help, and how to read it.
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&spate_search::service::PartitionStats) -> f64,
);

/// Searchable topics: indexed records and indexing lag per partition, index size per topic,
/// commit and query latency.
pub fn render_search(s: &spate_search::SearchService) -> String {
    let mut w = Writer::default();
    let stats = s.stats();
    let families: [Family; 9] = [
        (
            "spate_search_indexed_records_total",
            "counter",
            "Records added to a partition's search index since start.",
            |p| p.indexed_records as f64,
        ),
        (
            "spate_search_lag_records",
            "gauge",
            "Records below the high watermark not yet searchable.",
            |p| p.lag_records as f64,
        ),
        (
            "spate_search_lag_seconds",
            "gauge",
            "Age of a partition's oldest record below the high watermark that is not searchable yet (0 when none; sampled every 100 ms); search.max.lag.ms slows producers past it.",
            |p| p.lag_seconds,
        ),
        (
            "spate_search_undecodable_batches_total",
            "counter",
            "Batches the indexer could not decode; their records are not searchable.",
            |p| p.undecodable_batches as f64,
        ),
        (
            "spate_search_undecodable_values_total",
            "counter",
            "Values in the schema registry's wire format (search.value.format schema or auto) that could not be decoded with their schema (unknown id, malformed payload); they are indexed as text.",
            |p| p.undecodable_values as f64,
        ),
        (
            "spate_search_schema_id_waits_total",
            "counter",
            "Times indexing (search.value.format=schema) stopped at a value whose schema id the registry did not know yet, to wait for it (a node whose copy of _schemas lags); after 30 s such a value is indexed as text.",
            |p| p.schema_id_waits as f64,
        ),
        (
            "spate_search_unmapped_fields_total",
            "counter",
            "JSON values of new fields not indexed because the partition's mapping reached search.max.fields.",
            |p| p.unmapped_fields as f64,
        ),
        (
            "spate_search_mapping_conflicts_total",
            "counter",
            "JSON values not indexed because they did not fit their field's mapped type.",
            |p| p.mapping_conflicts as f64,
        ),
        (
            "spate_search_writer_recoveries_total",
            "counter",
            "Times a partition's index writer failed (a full disk, an I/O error) and indexing went back to its last commit.",
            |p| p.writer_recoveries as f64,
        ),
    ];
    for (name, kind, help, value) in families {
        w.family(name, kind, help);
        for p in &stats {
            let partition = p.partition.to_string();
            w.sample(
                name,
                &[("topic", &p.topic), ("partition", &partition)],
                value(p),
            );
        }
    }
    w.family(
        "spate_search_index_size_bytes",
        "gauge",
        "Bytes a topic's search index takes on this node's disk (one index holds every partition of the topic on the node).",
    );
    for (topic, bytes) in s.index_sizes() {
        w.sample(
            "spate_search_index_size_bytes",
            &[("topic", &topic)],
            bytes as f64,
        );
    }
    w.family(
        "spate_search_commit_latency_seconds",
        "histogram",
        "Time to commit a search index (makes indexed records searchable).",
    );
    w.histogram(
        "spate_search_commit_latency_seconds",
        &[],
        &s.metrics.commit_latency_us,
        1e6,
    );
    w.family(
        "spate_search_query_latency_seconds",
        "histogram",
        "Time to answer _search and _count requests.",
    );
    w.histogram(
        "spate_search_query_latency_seconds",
        &[],
        &s.metrics.query_latency_us,
        1e6,
    );
    w.family(
        "spate_search_query_errors_total",
        "counter",
        "Searches answered with an error.",
    );
    w.sample(
        "spate_search_query_errors_total",
        &[],
        s.metrics.query_errors.get() as f64,
    );
    w.family(
        "spate_search_records_rendered_total",
        "counter",
        "Records read to render search hits (_source, highlights, fields): a page's, not every node's from + size.",
    );
    w.sample(
        "spate_search_records_rendered_total",
        &[],
        s.metrics.records_rendered.get() as f64,
    );
    w.finish()
}
