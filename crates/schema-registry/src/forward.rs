//! Writes sent to a node that does not lead `_schemas` go on to the node that does (the one
//! that assigns ids), once: the receiver of a forwarded write never forwards it again.

use std::time::Duration;

use axum::http::{HeaderValue, Method};
use bytes::Bytes;
use futures::future::BoxFuture;

/// Marks a write one node forwarded to another (its value: the forwarding node's id).
pub const FORWARDED_HEADER: &str = "x-spate-schema-registry-forwarded";
/// On the leader's answer to a forwarded write: the `_schemas` offset its registry had applied
/// up to once the write was done, so the forwarding node can read that far before it answers
/// (its client's next read there then sees the write).
pub const APPLIED_HEADER: &str = "x-spate-schema-registry-applied";
/// Longest a forwarded write waits for the leader's answer.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// Which node takes registry writes now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// This node (it leads `_schemas`, or runs alone).
    Here,
    /// Another node, by id.
    Node(i32),
    /// Nobody: `_schemas` has no leader now.
    Nobody,
}

/// What to do with a write request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Serve it here.
    Local,
    /// Send it to this node's registry and relay its answer.
    Forward(i32),
    /// Answer 50003 with this message.
    Refuse(String),
}

/// Where a write goes, given who takes writes, whether it was forwarded here already and
/// whether this node can forward at all. One hop only: a forwarded write that did not land
/// on the writer is refused, so two nodes with different views never bounce it between them.
pub fn route(writer: Writer, forwarded: bool, can_forward: bool) -> Route {
    match writer {
        Writer::Here => Route::Local,
        Writer::Nobody => {
            Route::Refuse("the _schemas topic has no leader now; retry".to_string())
        }
        Writer::Node(n) if forwarded => Route::Refuse(format!(
            "a write forwarded here, but node {n} leads the _schemas topic now; retry"
        )),
        Writer::Node(n) if can_forward => Route::Forward(n),
        Writer::Node(n) => Route::Refuse(format!(
            "this node does not lead the _schemas topic (node {n} does): send schema writes to the registry of node {n}"
        )),
    }
}

/// Whether a request changes the registry (lookups and compatibility tests are POSTs that
/// only read).
pub fn is_write(method: &Method, path: &str) -> bool {
    match *method {
        Method::GET | Method::HEAD | Method::OPTIONS => false,
        Method::POST => {
            let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
            matches!(parts.as_slice(), ["subjects", _, "versions"])
        }
        _ => true,
    }
}

/// A write to send to the leader.
#[derive(Debug, Clone)]
pub struct ForwardRequest {
    /// Method.
    pub method: Method,
    /// Path and query, as the client sent them.
    pub path_and_query: String,
    /// The client's content type.
    pub content_type: Option<HeaderValue>,
    /// The client's credentials, checked again by the leader.
    pub authorization: Option<HeaderValue>,
    /// The body, read within the registry's size limit.
    pub body: Bytes,
}

/// The leader's answer, relayed as it is.
#[derive(Debug, Clone)]
pub struct ForwardAnswer {
    /// HTTP status.
    pub status: u16,
    /// Content type.
    pub content_type: Option<HeaderValue>,
    /// The leader's [`APPLIED_HEADER`], when it sent one.
    pub applied: Option<i64>,
    /// Body.
    pub body: Bytes,
}

/// Sends a write to another node's registry; supplied by the binary, which knows the
/// nodes' addresses and how to reach them.
pub trait Forward: Send + Sync + 'static {
    /// Sends `request` to node `node` (with [`FORWARDED_HEADER`]) and waits at most `limit`
    /// for its answer; `Err` says why there is none.
    fn forward(
        &self,
        node: i32,
        request: ForwardRequest,
        limit: Duration,
    ) -> BoxFuture<'static, Result<ForwardAnswer, String>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_off_the_leader_is_forwarded_once() {
        assert_eq!(route(Writer::Node(2), false, true), Route::Forward(2));
    }

    #[test]
    fn a_forwarded_write_that_reaches_a_node_that_does_not_lead_is_refused_not_forwarded_again() {
        assert!(matches!(
            route(Writer::Node(3), true, true),
            Route::Refuse(m) if m.contains("node 3")
        ));
    }

    #[test]
    fn a_forwarded_write_that_reaches_the_leader_is_served_there() {
        assert_eq!(route(Writer::Here, true, true), Route::Local);
        assert_eq!(route(Writer::Here, false, false), Route::Local);
    }

    #[test]
    fn without_a_leader_or_a_way_to_forward_writes_are_refused() {
        assert!(matches!(
            route(Writer::Nobody, false, true),
            Route::Refuse(_)
        ));
        assert!(matches!(
            route(Writer::Node(2), false, false),
            Route::Refuse(m) if m.contains("node 2")
        ));
    }

    #[test]
    fn lookups_and_compatibility_tests_are_reads_registrations_and_changes_are_writes() {
        assert!(is_write(&Method::POST, "/subjects/s/versions"));
        assert!(is_write(&Method::DELETE, "/subjects/s"));
        assert!(is_write(&Method::PUT, "/config"));
        assert!(is_write(&Method::PUT, "/mode/s"));
        assert!(!is_write(&Method::POST, "/subjects/s"));
        assert!(!is_write(
            &Method::POST,
            "/compatibility/subjects/s/versions/1"
        ));
        assert!(!is_write(&Method::GET, "/subjects/s/versions"));
    }
}
