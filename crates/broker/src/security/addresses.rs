//! Answers name brokers by the listener the client connected to: a client of the SASL_SSL
//! listener is sent to SASL_SSL addresses. Handlers build answers with each broker's default
//! address; these rewrite them for the connection's listener.

use spate_protocol::messages::{
    DescribeClusterResponse, FindCoordinatorResponse, MetadataResponse,
};
use spate_protocol::StrBytes;

use super::SecurityProtocol;
use crate::Broker;

/// The advertised address of broker `node_id` on `protocol`'s listener, when it is not the
/// broker's default address.
pub fn listener_address(
    b: &Broker,
    node_id: i32,
    protocol: SecurityProtocol,
) -> Option<(String, i32)> {
    if node_id != b.config.node_id {
        // Other nodes' listeners are in their registrations (none for a broker registered by
        // a spate from before they were: its default address stands).
        let cluster = b.cluster()?;
        let image = cluster.image();
        let reg = image.broker(node_id)?;
        return reg
            .listener(protocol.name())
            .map(|(host, port)| (host.to_owned(), i32::from(port)));
    }
    b.config
        .listeners
        .iter()
        .find(|l| l.protocol == protocol)
        .map(|l| (l.host.clone(), i32::from(l.port)))
}

/// Rewrites the brokers of a Metadata answer for `protocol`'s listener.
pub fn metadata(b: &Broker, protocol: SecurityProtocol, resp: &mut MetadataResponse) {
    for n in &mut resp.brokers {
        if let Some((host, port)) = listener_address(b, n.node_id.0, protocol) {
            n.host = StrBytes::from_string(host);
            n.port = port;
        }
    }
}

/// Rewrites the brokers of a DescribeCluster answer for `protocol`'s listener.
pub fn describe_cluster(
    b: &Broker,
    protocol: SecurityProtocol,
    resp: &mut DescribeClusterResponse,
) {
    for n in &mut resp.brokers {
        if let Some((host, port)) = listener_address(b, n.broker_id.0, protocol) {
            n.host = StrBytes::from_string(host);
            n.port = port;
        }
    }
}

/// Rewrites the coordinators of a FindCoordinator answer for `protocol`'s listener.
pub fn find_coordinator(
    b: &Broker,
    protocol: SecurityProtocol,
    resp: &mut FindCoordinatorResponse,
) {
    // v0-3 name one coordinator in top-level fields, v4+ a list (the top-level ones must then
    // stay unset).
    if resp.coordinators.is_empty() {
        if let Some((host, port)) = listener_address(b, resp.node_id.0, protocol) {
            resp.host = StrBytes::from_string(host);
            resp.port = port;
        }
    }
    for c in &mut resp.coordinators {
        if let Some((host, port)) = listener_address(b, c.node_id.0, protocol) {
            c.host = StrBytes::from_string(host);
            c.port = port;
        }
    }
}
