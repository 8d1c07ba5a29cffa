//! DescribeCluster.

use spate_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use spate_protocol::messages::{DescribeClusterRequest, DescribeClusterResponse};
use spate_protocol::{ResponseError, StrBytes};

use super::{msg, CLUSTER_OPERATIONS, OPERATIONS_OMITTED};
use crate::Broker;

/// Endpoint type for brokers (v1+); 2 would be controllers, which spate does not expose.
const BROKER_ENDPOINT: i8 = 1;

/// Answers DescribeCluster: this one broker, which is also the controller.
pub fn describe(b: &Broker, version: i16, req: DescribeClusterRequest) -> DescribeClusterResponse {
    let mut resp = DescribeClusterResponse::default();
    if version >= 1 {
        resp.endpoint_type = BROKER_ENDPOINT;
        if req.endpoint_type != BROKER_ENDPOINT {
            resp.error_code = ResponseError::UnsupportedEndpointType.code();
            resp.error_message = msg("spate exposes broker endpoints only");
            return resp;
        }
    }
    if let Some(cluster) = b.cluster() {
        resp.cluster_id = StrBytes::from_string(cluster.cluster_id());
        resp.controller_id = cluster.controller_id().unwrap_or(-1).into();
        // v2 may ask for fenced (registered but not live) brokers too, flagged as such.
        let with_fenced = version >= 2 && req.include_fenced_brokers;
        resp.brokers = cluster
            .image()
            .brokers()
            .values()
            .filter(|reg| with_fenced || !reg.fenced)
            .map(|reg| {
                let mut node = DescribeClusterBroker::default();
                node.broker_id = reg.id.into();
                node.host = StrBytes::from_string(reg.kafka_host.clone());
                node.port = i32::from(reg.kafka_port);
                node.rack = reg.rack.clone().map(StrBytes::from_string);
                node.is_fenced = reg.fenced;
                node
            })
            .collect();
    } else {
        resp.cluster_id = StrBytes::from_string(b.cluster_id.clone());
        resp.controller_id = b.config.node_id.into();
        let mut node = DescribeClusterBroker::default();
        node.broker_id = b.config.node_id.into();
        node.host = StrBytes::from_string(b.config.advertised_host.clone());
        node.port = b.config.advertised_port;
        resp.brokers = vec![node];
    }
    resp.cluster_authorized_operations = if req.include_cluster_authorized_operations {
        CLUSTER_OPERATIONS
    } else {
        OPERATIONS_OMITTED
    };
    resp
}
