//! Client telemetry (KIP-714): clients ask which metrics the broker wants
//! (GetTelemetrySubscriptions) and push them every interval as OTLP `MetricsData`
//! (PushTelemetry). This crate decodes the OTLP numbers ([`otlp`]) and keeps the latest value
//! of each client's series for /metrics ([`store`]). Pure: time comes in as milliseconds.

pub mod otlp;
pub mod store;

pub use otlp::{decode_metrics, Point, TelemetryDecodeError};
pub use store::{PushError, Subscription, TelemetryStore};
