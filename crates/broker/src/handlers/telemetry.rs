//! GetTelemetrySubscriptions and PushTelemetry (KIP-714): clients learn which of their metrics
//! the broker wants and push them; the latest values are exported on /metrics.

use spate_protocol::messages::{
    ApiKey, GetTelemetrySubscriptionsRequest, GetTelemetrySubscriptionsResponse,
    PushTelemetryRequest, PushTelemetryResponse,
};
use spate_protocol::{ResponseError, StrBytes};
use spate_telemetry::PushError;

use crate::Broker;

/// Uncompressed only: the payload is decoded on the request path, and spate does not
/// decompress client data there.
const COMPRESSION_NONE: i8 = 0;

/// Answers GetTelemetrySubscriptions.
pub fn subscriptions(
    b: &Broker,
    req: GetTelemetrySubscriptionsRequest,
) -> GetTelemetrySubscriptionsResponse {
    let sub = b
        .telemetry
        .subscribe(req.client_instance_id, b.clock.monotonic_ms().max(0) as u64);
    let mut resp = GetTelemetrySubscriptionsResponse::default();
    resp.client_instance_id = sub.client_instance_id;
    resp.subscription_id = sub.subscription_id;
    resp.accepted_compression_types = vec![COMPRESSION_NONE];
    resp.push_interval_ms = sub.push_interval_ms;
    resp.telemetry_max_bytes = sub.telemetry_max_bytes;
    // Cumulative values: the broker keeps the latest one of each series.
    resp.delta_temporality = false;
    resp.requested_metrics = sub
        .requested_metrics
        .into_iter()
        .map(StrBytes::from_string)
        .collect();
    resp
}

/// Answers PushTelemetry.
pub fn push(b: &Broker, req: PushTelemetryRequest) -> PushTelemetryResponse {
    let mut resp = PushTelemetryResponse::default();
    let pushed = b.telemetry.push(
        req.client_instance_id,
        req.subscription_id,
        req.terminating,
        req.compression_type,
        &req.metrics,
        b.clock.monotonic_ms().max(0) as u64,
    );
    if let Err(e) = pushed {
        let code = match e {
            PushError::NoInstanceId => ResponseError::InvalidRequest,
            PushError::UnknownSubscription => ResponseError::UnknownSubscriptionId,
            PushError::UnsupportedCompression => ResponseError::UnsupportedCompressionType,
            PushError::TooLarge => ResponseError::TelemetryTooLarge,
            PushError::TooSoon | PushError::TooManyClients => {
                ResponseError::ThrottlingQuotaExceeded
            }
            PushError::Undecodable(why) => {
                tracing::debug!(reason = %why, "client telemetry push does not decode");
                ResponseError::InvalidRecord
            }
        };
        b.metrics.error(ApiKey::PushTelemetry as i16, code.code());
        resp.error_code = code.code();
    }
    resp
}
