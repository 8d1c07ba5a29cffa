//! ListConfigResources (KIP-1142; v0 was ListClientMetricsResources): the resources that can
//! hold configs, which `kafka-configs.sh --describe` without a name lists before describing
//! each. spate holds topic, broker and share group configs; it has no client-metrics
//! subscriptions or logger configs, so those types list nothing.

use std::sync::Arc;

use spate_protocol::messages::list_config_resources_response::ConfigResource;
use spate_protocol::messages::{ListConfigResourcesRequest, ListConfigResourcesResponse};
use spate_protocol::{ResponseError, StrBytes};

use super::topic_partitions::metadata_view;
use crate::Broker;

const TOPIC: i8 = 2;
const BROKER: i8 = 4;
const BROKER_LOGGER: i8 = 8;
const CLIENT_METRICS: i8 = 16;
const GROUP: i8 = 32;

/// Answers ListConfigResources; v0 asks for client-metrics resources only.
pub fn handle(
    b: &Arc<Broker>,
    version: i16,
    req: ListConfigResourcesRequest,
) -> ListConfigResourcesResponse {
    let mut resp = ListConfigResourcesResponse::default();
    let types = if version == 0 {
        vec![CLIENT_METRICS]
    } else if req.resource_types.is_empty() {
        vec![TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP]
    } else {
        req.resource_types
    };
    if let Some(bad) = types
        .iter()
        .find(|t| ![TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP].contains(t))
    {
        tracing::debug!(
            resource_type = bad,
            "ListConfigResources for an unknown type"
        );
        resp.error_code = ResponseError::InvalidRequest.code();
        return resp;
    }
    let view = (types.contains(&TOPIC) || types.contains(&BROKER)).then(|| metadata_view(b, None));
    let mut out = Vec::new();
    if let (true, Some(v)) = (types.contains(&TOPIC), &view) {
        for t in &v.topics {
            if let Some(name) = &t.name {
                out.push(resource(TOPIC, name.as_str().to_owned()));
            }
        }
    }
    if let (true, Some(v)) = (types.contains(&BROKER), &view) {
        for node in &v.brokers {
            out.push(resource(BROKER, node.node_id.0.to_string()));
        }
    }
    if types.contains(&GROUP) {
        // Groups with configs set; describing a group's configs needs no other listing.
        for g in b.shares.group_configs().groups() {
            out.push(resource(GROUP, g));
        }
    }
    out.sort_by(|x, y| {
        (x.resource_type, x.resource_name.as_str())
            .cmp(&(y.resource_type, y.resource_name.as_str()))
    });
    resp.config_resources = out;
    resp
}

fn resource(resource_type: i8, name: String) -> ConfigResource {
    let mut r = ConfigResource::default();
    r.resource_type = resource_type;
    r.resource_name = StrBytes::from_string(name);
    r
}
