//! What the schema registry's API needs from the rest of the node: the HTTP endpoints' users,
//! admin token and ACLs, and a way to send writes to the node leading `_schemas` (through
//! that node's HTTP listener, whose address the cluster metadata carries).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use futures::future::BoxFuture;
use spate_auth::acl::{Operation, ResourceType};
use spate_broker::Broker;
use spate_http::peer::{self, PeerRequest};
use spate_http::HttpState;
use spate_schema_registry::access::{Access, Caller};
use spate_schema_registry::forward::{
    Forward, ForwardAnswer, ForwardRequest, APPLIED_HEADER, FORWARDED_HEADER,
};

/// The HTTP endpoints' users (HTTP Basic against the SASL credential store, or the admin
/// token) and the broker's ACLs, for the registry.
pub struct HttpUsers {
    /// The HTTP side (admin token).
    pub http: Arc<HttpState>,
    /// Credentials and ACLs.
    pub broker: Arc<Broker>,
}

impl Access for HttpUsers {
    fn authenticate(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Result<Caller, String> {
        // The admin token is a super user, as on the HTTP listener.
        if self.http.is_admin_token(headers) {
            return Ok(Caller(None));
        }
        let session = spate_http::authenticate_basic(&self.broker, headers, peer)
            .map_err(|e| e.to_string())?;
        Ok(Caller(
            self.broker.authorizer.enabled().then(|| Arc::new(session)),
        ))
    }

    fn allows(
        &self,
        caller: &Caller,
        operation: Operation,
        resource_type: ResourceType,
        name: &str,
    ) -> bool {
        self.broker
            .authorizer
            .allows(caller.0.as_deref(), operation, resource_type, name)
    }
}

/// Sends registry writes to another node's HTTP listener, under
/// [`spate_http::SCHEMA_REGISTRY_PATH`], where its registry answers them.
pub struct ToLeader {
    /// How to reach other nodes' HTTP listeners.
    pub http: Arc<HttpState>,
    /// The cluster's view of the nodes.
    pub broker: Arc<Broker>,
}

impl Forward for ToLeader {
    fn forward(
        &self,
        node: i32,
        request: ForwardRequest,
        limit: Duration,
    ) -> BoxFuture<'static, Result<ForwardAnswer, String>> {
        let cluster = self.broker.cluster();
        let addr = cluster.and_then(|c| c.image().broker(node).and_then(|r| r.http_addr.clone()));
        let me = cluster.map_or(self.broker.config.node_id, |c| c.broker_id());
        let http = self.http.clone();
        Box::pin(async move {
            let addr = addr.ok_or_else(|| format!("node {node} has no known HTTP address"))?;
            let mut headers = vec![(
                HeaderName::from_static(FORWARDED_HEADER),
                HeaderValue::from(me),
            )];
            if let Some(ct) = request.content_type {
                headers.push((axum::http::header::CONTENT_TYPE, ct));
            }
            if let Some(auth) = request.authorization {
                headers.push((axum::http::header::AUTHORIZATION, auth));
            }
            let call = PeerRequest {
                method: request.method,
                path: format!(
                    "{}{}",
                    spate_http::SCHEMA_REGISTRY_PATH,
                    request.path_and_query
                ),
                headers,
                body: request.body,
            };
            let answer = peer::call(http.peer_tls(), &addr, call, limit)
                .await
                .map_err(|e| e.to_string())?;
            let applied = answer
                .headers
                .get(APPLIED_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok());
            Ok(ForwardAnswer {
                status: answer.status,
                content_type: answer.content_type,
                applied,
                body: answer.body,
            })
        })
    }
}
