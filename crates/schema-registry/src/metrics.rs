//! The registry's counters, read by `/metrics` at scrape time.

use spate_metrics::text::Writer;
use spate_metrics::{Counter, Gauge, Histogram};

/// Error codes counted one by one; others count under "other".
const CODES: [u32; 28] = [
    400, 404, 405, 408, 409, 413, 415, 40101, 40301, 40401, 40402, 40403, 40404, 40405, 40406,
    40407, 40408, 40409, 42201, 42202, 42203, 42204, 42205, 42206, 42207, 50001, 50002, 50003,
];

/// Registry-wide counters.
#[derive(Debug)]
pub struct RegistryMetrics {
    /// Requests answered.
    pub requests: Counter,
    /// Request latency in microseconds.
    pub latency_us: Histogram,
    /// Errors answered, by error code (the last slot counts the others).
    errors: Vec<Counter>,
    /// Schemas registered as a new version of a subject.
    pub registrations: Counter,
    /// Registrations refused as incompatible.
    pub incompatible: Counter,
    /// Schemas stored (distinct ids).
    pub schemas: Gauge,
    /// Subjects with a live version.
    pub subjects: Gauge,
    /// Offset of the next `_schemas` record to apply.
    pub applied_offset: Gauge,
    /// `_schemas` records that could not be read.
    pub skipped_records: Gauge,
    /// Writes sent on to the node leading `_schemas`.
    pub forwarded: Counter,
    /// Writes whose forwarding failed (no answer from the leader in time).
    pub forward_failures: Counter,
}

impl Default for RegistryMetrics {
    fn default() -> Self {
        Self {
            requests: Counter::default(),
            latency_us: Histogram::latency(),
            errors: (0..=CODES.len()).map(|_| Counter::default()).collect(),
            registrations: Counter::default(),
            incompatible: Counter::default(),
            schemas: Gauge::default(),
            subjects: Gauge::default(),
            applied_offset: Gauge::default(),
            skipped_records: Gauge::default(),
            forwarded: Counter::default(),
            forward_failures: Counter::default(),
        }
    }
}

impl RegistryMetrics {
    /// Counts an error answered with `code`.
    pub fn error(&self, code: u32) {
        let i = CODES.iter().position(|c| *c == code).unwrap_or(CODES.len());
        if let Some(c) = self.errors.get(i) {
            c.inc();
        }
    }

    /// The OpenMetrics text of these counters (without the final `# EOF`).
    pub fn render(&self) -> String {
        let mut w = Writer::default();
        w.family(
            "spate_schema_registry_requests_total",
            "counter",
            "Schema registry API requests answered.",
        )
        .sample(
            "spate_schema_registry_requests_total",
            &[],
            self.requests.get() as f64,
        );
        w.family(
            "spate_schema_registry_errors_total",
            "counter",
            "Schema registry API requests answered with an error, by Confluent error code.",
        );
        for (i, c) in self.errors.iter().enumerate() {
            let code = CODES
                .get(i)
                .map_or_else(|| "other".to_string(), |c| c.to_string());
            if c.get() > 0 {
                w.sample(
                    "spate_schema_registry_errors_total",
                    &[("error_code", &code)],
                    c.get() as f64,
                );
            }
        }
        w.family(
            "spate_schema_registry_request_latency_seconds",
            "histogram",
            "Time to answer a schema registry API request.",
        );
        w.histogram(
            "spate_schema_registry_request_latency_seconds",
            &[],
            &self.latency_us,
            1e6,
        );
        for (name, kind, help, v) in [
            (
                "spate_schema_registry_registrations_total",
                "counter",
                "Schemas registered as a new version of a subject.",
                self.registrations.get() as f64,
            ),
            (
                "spate_schema_registry_incompatible_total",
                "counter",
                "Registrations refused as incompatible with earlier versions.",
                self.incompatible.get() as f64,
            ),
            (
                "spate_schema_registry_schemas",
                "gauge",
                "Schemas stored (distinct ids).",
                self.schemas.get() as f64,
            ),
            (
                "spate_schema_registry_subjects",
                "gauge",
                "Subjects with at least one version that is not deleted.",
                self.subjects.get() as f64,
            ),
            (
                "spate_schema_registry_applied_offset",
                "gauge",
                "Offset of the next _schemas record the registry applies.",
                self.applied_offset.get() as f64,
            ),
            (
                "spate_schema_registry_skipped_records",
                "gauge",
                "_schemas records the registry could not read and skipped.",
                self.skipped_records.get() as f64,
            ),
            (
                "spate_schema_registry_forwarded_total",
                "counter",
                "Writes sent on to the node leading _schemas.",
                self.forwarded.get() as f64,
            ),
            (
                "spate_schema_registry_forward_failures_total",
                "counter",
                "Forwarded writes the leading node did not answer.",
                self.forward_failures.get() as f64,
            ),
        ] {
            w.family(name, kind, help).sample(name, &[], v);
        }
        w.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_counted_by_code_and_rendered() {
        let m = RegistryMetrics::default();
        m.error(40401);
        m.error(40401);
        m.error(12345);
        m.requests.add(3);
        let text = m.render();
        assert!(
            text.contains("spate_schema_registry_requests_total 3"),
            "{text}"
        );
        assert!(
            text.contains(r#"spate_schema_registry_errors_total{error_code="40401"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"spate_schema_registry_errors_total{error_code="other"} 1"#),
            "{text}"
        );
    }
}
