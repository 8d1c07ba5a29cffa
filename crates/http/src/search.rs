//! Elasticsearch-compatible search endpoints over searchable topics: `/{topics}/_search`
//! and `/{topics}/_count` (GET with `?q=` or a body, POST with a body), where `{topics}` is a
//! name, a comma-separated list or a wildcard pattern; `/_search` searches every searchable
//! topic. Answers and errors have Elasticsearch's shape.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::Value;
use spate_search::dsl::{Operator, Query as DslQuery};
use spate_search::request::{check_window, parse_sort, SearchRequest};
use spate_search::{SearchError, SearchService};

use crate::HttpState;

pub fn routes() -> Router<Arc<HttpState>> {
    Router::new()
        .route("/_search", get(search_all).post(search_all))
        .route("/_count", get(count_all).post(count_all))
        .route("/{topics}/_search", get(search).post(search))
        .route("/{topics}/_count", get(count).post(count))
}

/// True for paths a search client may POST to without the admin token.
pub fn is_search_path(path: &str) -> bool {
    path.ends_with("/_search") || path.ends_with("/_count")
}

fn error(e: SearchError) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
    (status, Json(e.to_json())).into_response()
}

fn service(s: &HttpState) -> Result<Arc<SearchService>, Box<Response>> {
    s.search().ok_or_else(|| {
        Box::new(
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({"error": {"type": "unavailable", "reason": "search is not running yet"}, "status": 503})),
            )
                .into_response(),
        )
    })
}

/// The request from the body, with URL parameters (`q`, `from`, `size`, `sort`, `df`,
/// `default_operator`) applied on top, as Elasticsearch does.
fn request(params: &HashMap<String, String>, body: &Bytes) -> Result<SearchRequest, SearchError> {
    let mut req = SearchService::parse_body(body)?;
    let usize_param = |k: &str| -> Result<Option<usize>, SearchError> {
        params
            .get(k)
            .map(|v| {
                v.trim().parse().map_err(|_| {
                    SearchError::illegal(format!("[{k}] must be a non-negative integer, got [{v}]"))
                })
            })
            .transpose()
    };
    if let Some(q) = params.get("q") {
        let operator = match params
            .get("default_operator")
            .map(|s| s.to_ascii_lowercase())
        {
            Some(op) if op == "and" => Operator::And,
            _ => Operator::Or,
        };
        req.query = DslQuery::QueryString {
            query: q.clone(),
            fields: params
                .get("df")
                .map(|f| vec![f.clone()])
                .unwrap_or_default(),
            operator,
        };
    }
    if let Some(n) = usize_param("from")? {
        req.from = n;
    }
    if let Some(n) = usize_param("size")? {
        req.size = n;
    }
    if let Some(s) = params.get("sort") {
        req.sort = parse_sort(&Value::from(s.as_str()))?;
    }
    check_window(&req)?;
    Ok(req)
}

/// What a search endpoint answers.
#[derive(Clone, Copy)]
enum Answer {
    Hits,
    Count,
}

async fn run(
    s: Arc<HttpState>,
    topics: &str,
    params: HashMap<String, String>,
    body: Bytes,
    answer: Answer,
) -> Response {
    let service = match service(&s) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let req = match request(&params, &body) {
        Ok(r) => r,
        Err(e) => return error(e),
    };
    let result = match answer {
        Answer::Hits => service.search(topics, req).await,
        Answer::Count => service.count(topics, req).await,
    };
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => error(e),
    }
}

async fn search(
    State(s): State<Arc<HttpState>>,
    Path(topics): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    run(s, &topics, params, body, Answer::Hits).await
}

async fn search_all(
    State(s): State<Arc<HttpState>>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    run(s, "_all", params, body, Answer::Hits).await
}

async fn count(
    State(s): State<Arc<HttpState>>,
    Path(topics): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    run(s, &topics, params, body, Answer::Count).await
}

async fn count_all(
    State(s): State<Arc<HttpState>>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    run(s, "_all", params, body, Answer::Count).await
}
