//! DescribeCluster.

use spate_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use spate_protocol::messages::{DescribeClusterRequest, DescribeClusterResponse};
use spate_protocol::{ResponseError, StrBytes};

use super::{msg, CLUSTER_OPERATIONS, OPERATIONS_OMITTED};
use crate::Broker;

/// Endpoint type for brokers (v1+); 2 would be controllers, which spate does not expose.
const BROKER_ENDPOINT: i8 = 1;

/// Answers DescribeCluster: the brokers (standalone, this one, which is also the controller).
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
    let topology = b.topology();
    resp.cluster_id = StrBytes::from_string(topology.cluster_id(b));
    resp.controller_id = topology.controller_id(b).into();
    // v2 may ask for fenced (registered but not live) brokers too, flagged as such.
    let with_fenced = version >= 2 && req.include_fenced_brokers;
    resp.brokers = topology
        .brokers(b, with_fenced)
        .into_iter()
        .map(|v| {
            let mut node = DescribeClusterBroker::default();
            node.broker_id = v.id.into();
            node.host = StrBytes::from_string(v.host);
            node.port = v.port;
            node.rack = v.rack.map(StrBytes::from_string);
            node.is_fenced = v.fenced;
            node
        })
        .collect();
    resp.cluster_authorized_operations = if req.include_cluster_authorized_operations {
        CLUSTER_OPERATIONS
    } else {
        OPERATIONS_OMITTED
    };
    resp
}
