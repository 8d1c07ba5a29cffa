//! Cluster operations over the admin API: adding and decommissioning nodes, partition moves
//! (in `kafka-reassign-partitions`' JSON format), balancing and leader elections. What
//! `spate cluster` and the Kubernetes operator drive.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use spate_broker::cluster::{Cluster, Move, OperationError};

use crate::{ApiError, HttpState};

type Result<T> = std::result::Result<T, ApiError>;

pub fn routes() -> Router<Arc<HttpState>> {
    Router::new()
        .route("/admin/cluster/nodes", post(add_node))
        .route("/admin/cluster/nodes/{id}/decommission", post(decommission))
        .route(
            "/admin/cluster/reassignments",
            get(list_reassignments).post(reassign),
        )
        .route("/admin/cluster/balance", get(balance_plan).post(balance))
        .route("/admin/cluster/elect-leaders", post(elect_leaders))
}

fn cluster(s: &HttpState) -> Result<Arc<Cluster>> {
    let b = s.broker()?;
    b.cluster().cloned().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "NOT_A_CLUSTER",
            "this broker runs standalone (start it with --node-id and --cluster-peers)",
        )
    })
}

fn body<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_BODY",
            format!("invalid JSON body: {e}"),
        )
    })
}

fn op_error(e: OperationError) -> ApiError {
    let (status, code) = if e.retriable {
        (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE")
    } else {
        (StatusCode::BAD_REQUEST, "REFUSED")
    };
    ApiError::new(status, code, e.message)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddNode {
    node_id: u64,
    addr: String,
}

/// Adds a node to the metadata quorum (its process must be running with that id).
async fn add_node(State(s): State<Arc<HttpState>>, raw: Bytes) -> Result<Json<Value>> {
    let c = cluster(&s)?;
    let req: AddNode = body(&raw)?;
    c.add_node(req.node_id, req.addr.clone())
        .await
        .map_err(op_error)?;
    Ok(Json(json!({"added": req.node_id, "addr": req.addr})))
}

#[derive(Deserialize)]
struct DecommissionQuery {
    #[serde(default)]
    cancel: bool,
}

/// Starts (or cancels) decommissioning a broker.
async fn decommission(
    State(s): State<Arc<HttpState>>,
    Path(id): Path<String>,
    Query(q): Query<DecommissionQuery>,
) -> Result<Json<Value>> {
    let c = cluster(&s)?;
    let id: i32 = id.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_NODE_ID",
            format!("'{id}' is not a node id"),
        )
    })?;
    c.decommission(id, q.cancel).await.map_err(op_error)?;
    Ok(Json(json!({
        "node_id": id,
        "decommissioning": !q.cancel,
    })))
}

/// The partitions being moved, with their replicas, adding and removing sets.
async fn list_reassignments(State(s): State<Arc<HttpState>>) -> Result<Json<Value>> {
    let c = cluster(&s)?;
    let image = c.image();
    let moving: Vec<Value> = image
        .reassignments()
        .map(|(topic, partition, p)| {
            json!({
                "topic": topic,
                "partition": partition,
                "replicas": p.replicas,
                "target": p.target_replicas(),
                "adding": p.adding,
                "removing": p.removing,
                "isr": p.isr,
            })
        })
        .collect();
    Ok(Json(json!({ "reassignments": moving })))
}

/// A plan or a request in the JSON format of `kafka-reassign-partitions`.
#[derive(Deserialize)]
struct Plan {
    #[serde(default)]
    #[allow(dead_code)]
    version: Option<i32>,
    partitions: Vec<Move>,
}

fn plan_json(moves: &[Move]) -> Value {
    json!({ "version": 1, "partitions": moves })
}

/// Starts the moves of a plan; answers each partition's outcome (207 when some failed).
async fn reassign(
    State(s): State<Arc<HttpState>>,
    raw: Bytes,
) -> Result<(StatusCode, Json<Value>)> {
    let c = cluster(&s)?;
    let plan: Plan = body(&raw)?;
    if plan.partitions.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "EMPTY_PLAN",
            "the plan lists no partitions",
        ));
    }
    Ok(results(c.reassign(plan.partitions).await))
}

fn results(
    outcomes: Vec<(Move, std::result::Result<(), OperationError>)>,
) -> (StatusCode, Json<Value>) {
    let failed = outcomes.iter().filter(|(_, r)| r.is_err()).count();
    let list: Vec<Value> = outcomes
        .into_iter()
        .map(|(m, r)| match r {
            Ok(()) => json!({"topic": m.topic, "partition": m.partition, "replicas": m.replicas, "ok": true}),
            Err(e) => json!({"topic": m.topic, "partition": m.partition, "replicas": m.replicas, "ok": false, "error": e.message, "kafka_error_code": e.kafka_code}),
        })
        .collect();
    let status = if failed == 0 {
        StatusCode::OK
    } else {
        StatusCode::MULTI_STATUS
    };
    (status, Json(json!({"failed": failed, "partitions": list})))
}

/// The moves `balance` would make, without making them.
async fn balance_plan(State(s): State<Arc<HttpState>>) -> Result<Json<Value>> {
    let c = cluster(&s)?;
    Ok(Json(plan_json(&c.balance_plan())))
}

/// Spreads replicas and preferred leaderships evenly: starts the plan's moves.
async fn balance(State(s): State<Arc<HttpState>>) -> Result<(StatusCode, Json<Value>)> {
    let c = cluster(&s)?;
    let plan = c.balance_plan();
    if plan.is_empty() {
        return Ok((
            StatusCode::OK,
            Json(json!({"failed": 0, "partitions": [], "note": "already balanced"})),
        ));
    }
    Ok(results(c.reassign(plan).await))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Elect {
    #[serde(rename = "type", default = "preferred")]
    kind: String,
    #[serde(default)]
    partitions: Option<Vec<TopicPartition>>,
}

fn preferred() -> String {
    "preferred".to_owned()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TopicPartition {
    topic: String,
    partition: i32,
}

/// Elects leaders: `{"type": "preferred"|"unclean", "partitions": [...]}` (no list: all).
async fn elect_leaders(
    State(s): State<Arc<HttpState>>,
    raw: Bytes,
) -> Result<(StatusCode, Json<Value>)> {
    let c = cluster(&s)?;
    let req: Elect = if raw.is_empty() {
        Elect {
            kind: preferred(),
            partitions: None,
        }
    } else {
        body(&raw)?
    };
    let unclean = match req.kind.as_str() {
        "preferred" => false,
        "unclean" => true,
        other => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "INVALID_ELECTION_TYPE",
                format!("election type '{other}' is neither preferred nor unclean"),
            ))
        }
    };
    let partitions = req
        .partitions
        .map(|ps| ps.into_iter().map(|p| (p.topic, p.partition)).collect());
    let outcomes = c.elect(unclean, partitions).await;
    let failed = outcomes.iter().filter(|(_, r)| r.is_err()).count();
    let list: Vec<Value> = outcomes
        .into_iter()
        .map(|((topic, partition), r)| match r {
            Ok(leader) => json!({"topic": topic, "partition": partition, "leader": leader, "ok": true}),
            Err(e) => json!({"topic": topic, "partition": partition, "ok": false, "error": e.message, "kafka_error_code": e.kafka_code}),
        })
        .collect();
    let status = if failed == 0 {
        StatusCode::OK
    } else {
        StatusCode::MULTI_STATUS
    };
    Ok((status, Json(json!({"failed": failed, "partitions": list}))))
}
