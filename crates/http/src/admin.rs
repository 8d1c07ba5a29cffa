//! The JSON admin API: topics (with configs, partitions and offsets), consumer groups (with
//! members and lag) and broker information.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use spate_broker::{Broker, Topic, TopicConfig, TopicError};
use spate_protocol::ResponseError;

use crate::{ApiError, HttpState};

type Result<T> = std::result::Result<T, ApiError>;

pub fn routes() -> Router<Arc<HttpState>> {
    Router::new()
        .route("/admin/broker", get(broker_info))
        .route("/admin/cluster", get(cluster_status))
        .route("/admin/schema-registry", get(schema_registry_info))
        .route("/admin/topics", get(list_topics).post(create_topic))
        .route(
            "/admin/topics/{name}",
            get(describe_topic).delete(delete_topic),
        )
        .route(
            "/admin/topics/{name}/configs",
            axum::routing::patch(alter_configs),
        )
        .route("/admin/topics/{name}/partitions", post(add_partitions))
        .route("/admin/transactions", get(list_transactions))
        .route("/admin/transactions/{id}", get(describe_transaction))
        .route("/admin/groups", get(list_groups))
        .route(
            "/admin/groups/{id}",
            get(describe_group).delete(delete_group),
        )
}

/// Maps a Kafka error to an HTTP status.
fn kafka_error(e: ResponseError, message: impl Into<String>) -> ApiError {
    let status = match e {
        ResponseError::TopicAlreadyExists | ResponseError::NonEmptyGroup => StatusCode::CONFLICT,
        ResponseError::UnknownTopicOrPartition
        | ResponseError::GroupIdNotFound
        | ResponseError::TransactionalIdNotFound
        | ResponseError::UnknownTopicId => StatusCode::NOT_FOUND,
        // Another node answers for it.
        ResponseError::NotCoordinator => StatusCode::MISDIRECTED_REQUEST,
        ResponseError::KafkaStorageError | ResponseError::UnknownServerError => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        _ => StatusCode::BAD_REQUEST,
    };
    let code = format!("{e:?}").chars().fold(String::new(), |mut acc, c| {
        if c.is_uppercase() && !acc.is_empty() {
            acc.push('_');
        }
        acc.push(c.to_ascii_uppercase());
        acc
    });
    ApiError::new(status, code, message)
}

impl From<TopicError> for ApiError {
    fn from(e: TopicError) -> Self {
        kafka_error(e.code, e.message)
    }
}

/// Parses a JSON body, answering malformed ones with a JSON error naming the problem.
fn body<T: DeserializeOwned>(bytes: &Bytes) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_BODY",
            format!("invalid JSON body: {e}"),
        )
    })
}

/// Runs a topic change on the blocking pool: it makes directories, writes files and fsyncs,
/// which must not stall the async workers that serve clients.
async fn on_disk<T: Send + 'static>(
    b: &Arc<Broker>,
    f: impl FnOnce(&Broker) -> std::result::Result<T, TopicError> + Send + 'static,
) -> Result<T> {
    let b = b.clone();
    match tokio::task::spawn_blocking(move || f(&b)).await {
        Ok(r) => r.map_err(Into::into),
        Err(e) => Err(kafka_error(
            ResponseError::UnknownServerError,
            format!("topic operation failed: {e}"),
        )),
    }
}

fn topic(b: &Broker, name: &str) -> Result<Arc<Topic>> {
    b.topics.get(name).ok_or_else(|| {
        kafka_error(
            ResponseError::UnknownTopicOrPartition,
            format!("topic '{name}' does not exist"),
        )
    })
}

fn configs_json(c: &TopicConfig) -> Value {
    let map: BTreeMap<&str, Value> = spate_broker::topic_config_defs()
        .iter()
        .filter_map(|d| {
            let (value, set) = c.get(d.name)?;
            Some((
                d.name,
                json!({"value": value, "source": if set { "topic" } else { "default" }}),
            ))
        })
        .collect();
    json!(map)
}

/// A topic; with `partitions_at` (the broker's clock), each partition's offsets, size and,
/// when compacted, its cleaner state.
fn topic_json(t: &Topic, partitions_at: Option<i64>) -> Value {
    let mut v = json!({
        "name": t.name,
        "id": t.id.to_string(),
        "partitions": t.partition_count(),
        "internal": spate_broker::is_internal(&t.name),
        "configs": configs_json(&t.config()),
    });
    if let Some(now) = partitions_at {
        v["partition_details"] = json!(t
            .partitions()
            .iter()
            .map(|p| {
                let mut d = json!({
                    "partition": p.index,
                    "log_start_offset": p.log_start_offset(),
                    "log_end_offset": p.log_end_offset(),
                    "high_watermark": p.high_watermark(),
                    "size_bytes": p.size_bytes(),
                    "leader_epoch": p.leader_epoch(),
                });
                if let Some(c) = p.cleaner_state(now) {
                    d["cleaner"] = cleaner_json(&c);
                }
                d
            })
            .collect::<Vec<_>>());
    }
    v
}

/// A compacted partition's cleaner state: its clean and dirty sizes, lag and last clean.
fn cleaner_json(c: &spate_broker::partition::CleanerState) -> Value {
    let total = c.clean_bytes + c.dirty_bytes;
    json!({
        "clean_point": c.clean_point,
        "clean_bytes": c.clean_bytes,
        "dirty_bytes": c.dirty_bytes,
        "dirty_ratio": if total == 0 { 0.0 } else { c.dirty_bytes as f64 / total as f64 },
        "oldest_dirty_age_ms": c.oldest_dirty_age_ms,
        "last_clean": c.last_clean.map(|l| json!({
            "at_ms": l.at_ms,
            "took_ms": l.took_ms,
            "segments": l.stats.segments,
            "bytes_read": l.stats.bytes_read,
            "bytes_removed": l.stats.bytes_removed,
        })),
    })
}

async fn broker_info(State(s): State<Arc<HttpState>>) -> Result<Json<Value>> {
    let b = s.broker()?;
    Ok(Json(json!({
        "node_id": b.config.node_id,
        "cluster_id": b.cluster_id,
        "version": env!("CARGO_PKG_VERSION"),
        "advertised": format!("{}:{}", b.config.advertised_host, b.config.advertised_port),
        "data_dir": b.config.data_dir.display().to_string(),
        "topics": b.topics.list().len(),
        "memory": {"limit_bytes": b.budget.limit(), "in_use_bytes": b.budget.used()},
        "effective_config": s.effective_config,
        "schema_registry": s.schema_registry_status(),
    })))
}

/// The schema registry on this node: whether one runs, where, whether this node takes its
/// writes, what it holds, its global mode and compatibility level.
async fn schema_registry_info(State(s): State<Arc<HttpState>>) -> Json<Value> {
    Json(s.schema_registry_status())
}

/// Nodes, the controller, the quorum's state and every partition's leader, epoch, ISR and
/// replication lag as this node sees them.
async fn cluster_status(State(s): State<Arc<HttpState>>) -> Result<Json<Value>> {
    let b = s.broker()?;
    let Some(cluster) = b.cluster() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "NOT_A_CLUSTER",
            "this broker runs standalone (start it with --node-id and --cluster-peers)",
        ));
    };
    let image = cluster.image();
    let quorum = cluster.node().metrics().await;
    let nodes: Vec<Value> = image
        .brokers()
        .values()
        .map(|r| {
            json!({
                "id": r.id,
                "kafka": format!("{}:{}", r.kafka_host, r.kafka_port),
                "inter_node": r.inter_node_addr,
                "http": r.http_addr,
                "broker_epoch": r.epoch,
                "fenced": r.fenced,
                "shutting_down": r.shutting_down,
                "decommissioning": r.decommissioning,
                "disk_full": r.disk_full,
            })
        })
        .collect();
    let followers = cluster.follower_status();
    let mut partitions = Vec::new();
    let mut under_replicated = 0;
    let mut offline = 0;
    let mut reassigning = 0;
    let members = cluster.node().members();
    for t in image.topics().values() {
        for (index, ps) in t.partitions.iter().enumerate() {
            let index = index as i32;
            if ps.isr.len() < ps.replicas.len() {
                under_replicated += 1;
            }
            if ps.leader.is_none() {
                offline += 1;
            }
            let mut p = json!({
                "topic": t.name,
                "partition": index,
                "leader": ps.leader,
                "leader_epoch": ps.leader_epoch,
                "replicas": ps.replicas,
                "isr": ps.isr,
            });
            if ps.is_reassigning() {
                reassigning += 1;
                p["adding"] = json!(ps.adding);
                p["removing"] = json!(ps.removing);
            }
            let local = b.topics.get(&t.name).and_then(|lt| lt.partition(index));
            if let Some(view) = local.as_ref().and_then(|lp| lp.leader_view()) {
                let end = local.as_ref().map_or(0, |lp| lp.log_end_offset());
                p["high_watermark"] = json!(view.high_watermark());
                p["log_end_offset"] = json!(end);
                p["follower_lag"] = view
                    .followers()
                    .iter()
                    .map(|(id, f)| {
                        (
                            id.to_string(),
                            json!({
                                "log_end_offset": f.log_end_offset,
                                "lag_records": if f.log_end_offset < 0 { Value::Null } else { json!(end - f.log_end_offset) },
                                "last_caught_up_ms_ago": (b.clock.monotonic_ms().max(0) as u64).saturating_sub(f.last_caught_up_ms),
                            }),
                        )
                    })
                    .collect::<serde_json::Map<_, _>>()
                    .into();
            }
            if let Some(f) = followers
                .iter()
                .find(|f| f.topic == t.name && f.partition == index)
            {
                p["following"] = json!({
                    "leader": f.leader,
                    "log_end_offset": f.log_end_offset,
                    "leader_high_watermark": f.leader_high_watermark,
                    "truncating": f.truncating,
                });
            }
            partitions.push(p);
        }
    }
    Ok(Json(json!({
        "cluster_id": cluster.cluster_id(),
        "node_id": cluster.broker_id(),
        "controller": cluster.controller_id(),
        "ready": cluster.readiness().is_ok(),
        "quorum": {
            "state": format!("{:?}", quorum.state),
            "leader": quorum.leader,
            "term": quorum.term,
            "last_log_index": quorum.last_log_index,
            "commit_index": quorum.commit_index,
            "applied_index": quorum.applied_index,
        },
        "nodes": nodes,
        "voters": members.voters,
        "quorum_members": members.nodes,
        "reassigning_partitions": reassigning,
        "under_replicated_partitions": under_replicated,
        "offline_partitions": offline,
        "healthy": under_replicated == 0 && offline == 0,
        "partitions": partitions,
    })))
}

async fn list_topics(State(s): State<Arc<HttpState>>) -> Result<Json<Value>> {
    let b = s.broker()?;
    Ok(Json(json!(b
        .topics
        .list()
        .iter()
        .map(|t| topic_json(t, None))
        .collect::<Vec<_>>())))
}

async fn describe_topic(
    State(s): State<Arc<HttpState>>,
    Path(name): Path<String>,
) -> Result<Json<Value>> {
    let b = s.broker()?;
    let t = topic(b, &name)?;
    Ok(Json(topic_json(&t, Some(b.clock.now_ms()))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTopic {
    name: String,
    partitions: Option<i32>,
    /// Cluster mode only; the cluster default when absent.
    replication_factor: Option<i16>,
    #[serde(default)]
    configs: BTreeMap<String, String>,
}

/// How long an admin call waits for the quorum to apply a topic change.
const QUORUM_WAIT_MS: i32 = 30_000;

/// The error of a Kafka-API result, if any.
fn kafka_result(code: i16, message: Option<&spate_protocol::StrBytes>) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    let e = ResponseError::try_from_code(code).unwrap_or(ResponseError::UnknownServerError);
    Err(kafka_error(
        e,
        message
            .map(|m| m.to_string())
            .unwrap_or_else(|| format!("{e:?}")),
    ))
}

/// CreateTopics as a Kafka client would send it, through the broker's topology (on disk
/// standalone; in a cluster a topic exists once the controller placed it).
async fn create_through_topology(b: &Arc<Broker>, req: NewTopic) -> Result<Arc<Topic>> {
    use spate_protocol::messages::create_topics_request::{
        CreatableTopic, CreatableTopicConfig, CreateTopicsRequest,
    };
    let mut t = CreatableTopic::default();
    t.name = spate_protocol::StrBytes::from_string(req.name.clone()).into();
    t.num_partitions = req.partitions.unwrap_or(-1);
    t.replication_factor = req.replication_factor.unwrap_or(-1);
    for (k, v) in &req.configs {
        let mut c = CreatableTopicConfig::default();
        c.name = spate_protocol::StrBytes::from_string(k.clone());
        c.value = Some(spate_protocol::StrBytes::from_string(v.clone()));
        t.configs.push(c);
    }
    let mut r = CreateTopicsRequest::default();
    r.topics.push(t);
    r.timeout_ms = QUORUM_WAIT_MS;
    one_topic_change(b, b.topology().create_topics(b, 7, r), |resp| {
        resp.topics
            .first()
            .map(|t| (t.error_code, t.error_message.as_ref()))
    })
    .await?;
    topic(b, &req.name)
}

async fn create_topic(State(s): State<Arc<HttpState>>, raw: Bytes) -> Result<Response> {
    let b = s.broker()?;
    let req: NewTopic = body(&raw)?;
    let t = create_through_topology(b, req).await?;
    tracing::info!(topic = %t.name, partitions = t.partition_count(), "created topic (admin API)");
    Ok((
        StatusCode::CREATED,
        Json(topic_json(&t, Some(b.clock.now_ms()))),
    )
        .into_response())
}

/// Runs a change of one topic through the broker's topology (on disk standalone, through the
/// quorum in a cluster) and turns the Kafka answer for that topic, (error code, message),
/// into this API's result.
async fn one_topic_change<T: Send + 'static>(
    b: &Arc<Broker>,
    work: spate_broker::topology::Work<T>,
    outcome: impl for<'a> FnOnce(&'a T) -> Option<(i16, Option<&'a spate_protocol::StrBytes>)>,
) -> Result<()> {
    let resp = work.run(b).await.ok_or_else(|| {
        // The blocking step failed (logged where it happened).
        kafka_error(ResponseError::UnknownServerError, "the topic change failed")
    })?;
    let (code, message) = outcome(&resp)
        .ok_or_else(|| kafka_error(ResponseError::UnknownServerError, "no result for the topic"))?;
    kafka_result(code, message)
}

async fn delete_topic(
    State(s): State<Arc<HttpState>>,
    Path(name): Path<String>,
) -> Result<StatusCode> {
    let b = s.broker()?;
    spate_broker::refuse_internal(&name).map_err(|e| kafka_error(e.code, e.message))?;
    use spate_protocol::messages::delete_topics_request::{DeleteTopicState, DeleteTopicsRequest};
    let mut t = DeleteTopicState::default();
    t.name = Some(spate_protocol::StrBytes::from_string(name.clone()).into());
    let mut r = DeleteTopicsRequest::default();
    r.topics.push(t);
    r.timeout_ms = QUORUM_WAIT_MS;
    one_topic_change(b, b.topology().delete_topics(b, 6, r), |resp| {
        resp.responses
            .first()
            .map(|t| (t.error_code, t.error_message.as_ref()))
    })
    .await?;
    tracing::info!(topic = %name, "deleted topic (admin API)");
    Ok(StatusCode::NO_CONTENT)
}

/// `{"key": "value"}` sets a config, `{"key": null}` returns it to its default.
async fn alter_configs(
    State(s): State<Arc<HttpState>>,
    Path(name): Path<String>,
    raw: Bytes,
) -> Result<Json<Value>> {
    let b = s.broker()?;
    let t = topic(b, &name)?;
    let changes: BTreeMap<String, Option<String>> = body(&raw)?;
    let mut config = t.config();
    for (k, v) in &changes {
        let r = match v {
            Some(v) => config.set(k, v),
            None => config.unset(k),
        };
        r.map_err(|e| kafka_error(ResponseError::InvalidConfig, e.to_string()))?;
    }
    let changed = t.clone();
    // In a cluster the change goes through the quorum to every replica.
    on_disk(b, move |b| {
        b.topology().set_topic_config(b, &changed, config)
    })
    .await?;
    Ok(Json(configs_json(&t.config())))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PartitionCount {
    count: i32,
}

async fn add_partitions(
    State(s): State<Arc<HttpState>>,
    Path(name): Path<String>,
    raw: Bytes,
) -> Result<Json<Value>> {
    let b = s.broker()?;
    // An unknown topic is a 404, as for every other topic path.
    topic(b, &name)?;
    let req: PartitionCount = body(&raw)?;
    spate_broker::refuse_internal(&name).map_err(|e| kafka_error(e.code, e.message))?;
    use spate_protocol::messages::create_partitions_request::{
        CreatePartitionsRequest, CreatePartitionsTopic,
    };
    let mut pt = CreatePartitionsTopic::default();
    pt.name = spate_protocol::StrBytes::from_string(name.clone()).into();
    pt.count = req.count;
    pt.assignments = None;
    let mut r = CreatePartitionsRequest::default();
    r.topics.push(pt);
    r.timeout_ms = QUORUM_WAIT_MS;
    one_topic_change(b, b.topology().create_partitions(b, r), |resp| {
        resp.results
            .first()
            .map(|t| (t.error_code, t.error_message.as_ref()))
    })
    .await?;
    let grown = topic(b, &name)?;
    Ok(Json(topic_json(&grown, Some(b.clock.now_ms()))))
}

fn txn_json(id: &str, m: &spate_txn::TxnMeta, now_ms: i64) -> Value {
    let partitions: Vec<Value> = m
        .partitions
        .iter()
        .map(|(t, p)| json!({"topic": t, "partition": p}))
        .collect();
    json!({
        "transactional_id": id,
        "state": m.status.name(),
        "producer_id": m.producer_id,
        "producer_epoch": m.producer_epoch,
        "timeout_ms": m.timeout_ms,
        "started_ms": (m.start_ms >= 0).then_some(m.start_ms),
        "open_for_ms": m.open_for_ms(now_ms),
        "last_update_ms": m.last_update_ms,
        "partitions": partitions,
    })
}

/// The transactional ids this node coordinates, with their state.
async fn list_transactions(State(s): State<Arc<HttpState>>) -> Result<Json<Value>> {
    let b = s.broker()?;
    let now = b.clock.now_ms();
    Ok(Json(json!(b
        .txns
        .list()
        .iter()
        .map(|(id, m)| txn_json(id, m, now))
        .collect::<Vec<_>>())))
}

/// One transactional id's state; 404 when unknown, 421 (NOT_COORDINATOR) when another node
/// coordinates it.
async fn describe_transaction(
    State(s): State<Arc<HttpState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    let b = s.broker()?;
    match b.txns.describe(&id) {
        Ok(Some(m)) => Ok(Json(txn_json(&id, &m, b.clock.now_ms()))),
        Ok(None) => Err(kafka_error(
            ResponseError::TransactionalIdNotFound,
            format!("transactional id '{id}' is not known to its coordinator"),
        )),
        Err(e) => Err(kafka_error(
            e,
            format!("another node coordinates transactional id '{id}': ask the leader of its __transaction_state partition"),
        )),
    }
}

async fn list_groups(State(s): State<Arc<HttpState>>) -> Result<Json<Value>> {
    let b = s.broker()?;
    Ok(Json(json!(b
        .groups
        .summaries()
        .into_iter()
        .map(|(id, state, protocol_type, members)| json!({
            "group_id": id, "state": state, "protocol_type": protocol_type, "members": members,
        }))
        .collect::<Vec<_>>())))
}

async fn describe_group(
    State(s): State<Arc<HttpState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    let b = s.broker()?;
    let description = b.groups.coordinator(|c| c.describe(&id));
    let consumer = b.groups.consumer(|c| c.describe(&id));
    let offsets: Vec<(String, i32, i64, Option<String>)> = b.groups.offsets(|o| {
        o.group(&id)
            .into_iter()
            .map(|(t, p, c)| (t.to_string(), p, c.offset, c.metadata.clone()))
            .collect()
    });
    if description.is_none() && consumer.is_none() && offsets.is_empty() {
        return Err(kafka_error(
            ResponseError::GroupIdNotFound,
            format!("group '{id}' does not exist"),
        ));
    }
    let (state, protocol_type, protocol, members) = match (description, consumer) {
        // A KIP-848 group: the server-side assignor, and each member's epoch and partitions.
        (None, Some(d)) => (
            d.state.name(),
            "consumer".to_string(),
            d.assignor.name().to_string(),
            d.members
                .into_iter()
                .map(|m| {
                    let assigned: Vec<Value> = m
                        .member
                        .assigned
                        .iter()
                        .map(|(t, ps)| {
                            let name = b.topics.get_by_id(t).map(|t| t.name.clone());
                            json!({"topic": name, "partitions": ps})
                        })
                        .collect();
                    json!({
                        "member_id": m.member.member_id, "group_instance_id": m.member.instance_id,
                        "client_id": m.member.client_id, "client_host": m.member.client_host,
                        "member_epoch": m.member.epoch, "assignment": assigned,
                    })
                })
                .collect::<Vec<_>>(),
        ),
        (Some(d), _) => (
            d.state.name(),
            d.protocol_type,
            d.protocol,
            d.members
                .into_iter()
                .map(|m| {
                    json!({
                        "member_id": m.member_id, "group_instance_id": m.group_instance_id,
                        "client_id": m.client_id, "client_host": m.client_host,
                    })
                })
                .collect::<Vec<_>>(),
        ),
        (None, None) => ("Empty", String::new(), String::new(), Vec::new()),
    };
    let offsets: Vec<Value> = offsets
        .into_iter()
        .map(|(topic, partition, committed, metadata)| {
            let hw = b.topics.get(&topic).and_then(|t| t.partition(partition)).map(|p| p.high_watermark());
            json!({
                "topic": topic, "partition": partition, "committed_offset": committed, "metadata": metadata,
                "high_watermark": hw, "lag": hw.map(|h| (h - committed).max(0)),
            })
        })
        .collect();
    let total_lag: i64 = offsets.iter().filter_map(|o| o["lag"].as_i64()).sum();
    Ok(Json(json!({
        "group_id": id, "state": state, "protocol_type": protocol_type, "protocol": protocol,
        "members": members, "offsets": offsets, "total_lag": total_lag,
    })))
}

async fn delete_group(
    State(s): State<Arc<HttpState>>,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    let b = s.broker()?;
    b.groups
        .delete_group(&id)
        .map_err(|e| kafka_error(e, format!("cannot delete group '{id}'")))?;
    Ok(StatusCode::NO_CONTENT)
}
