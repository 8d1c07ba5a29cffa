//! The operator's own metrics: Kubernetes API writes (what idempotency tests count),
//! spate admin calls, reconcile errors and leadership.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    kind: String,
    verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    call: String,
    ok: String,
}

/// Shared handles to the operator's metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    writes: Family<WriteLabels, Counter>,
    calls: Family<CallLabels, Counter>,
    errors: Counter,
    reconciles: Family<KindLabel, Counter>,
    leader: Gauge<i64, std::sync::atomic::AtomicI64>,
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let writes = Family::<WriteLabels, Counter>::default();
        registry.register(
            "spate_operator_api_writes",
            "Kubernetes API writes (applies, status and finalizer patches) by kind",
            writes.clone(),
        );
        let calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "spate_operator_spate_calls",
            "Mutating calls to spate admin APIs",
            calls.clone(),
        );
        let errors = Counter::default();
        registry.register(
            "spate_operator_reconcile_errors",
            "Reconciles that failed and were retried",
            errors.clone(),
        );
        let reconciles = Family::<KindLabel, Counter>::default();
        registry.register(
            "spate_operator_reconciles",
            "Reconcile passes started, by resource kind",
            reconciles.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "spate_operator_leader",
            "1 while this replica holds the leader Lease and reconciles",
            leader.clone(),
        );
        Self {
            registry: Arc::new(registry),
            writes,
            calls,
            errors,
            reconciles,
            leader,
        }
    }

    /// Counts one Kubernetes API write.
    pub fn write(&self, kind: &str, verb: &str) {
        self.writes
            .get_or_create(&WriteLabels {
                kind: kind.into(),
                verb: verb.into(),
            })
            .inc();
    }

    /// Counts one mutating spate admin call.
    pub fn spate_call(&self, call: &str, ok: bool) {
        self.calls
            .get_or_create(&CallLabels {
                call: call.into(),
                ok: ok.to_string(),
            })
            .inc();
    }

    /// Counts one reconcile pass.
    pub fn reconcile(&self, kind: &str) {
        self.reconciles
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc();
    }

    /// Counts one failed reconcile.
    pub fn reconcile_error(&self) {
        self.errors.inc();
    }

    /// Sets whether this replica leads.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_show_up_by_kind_in_the_text() {
        let m = Metrics::new();
        m.write("StatefulSet", "apply");
        m.write("StatefulSet", "apply");
        let text = m.encode();
        assert!(
            text.contains("spate_operator_api_writes_total{kind=\"StatefulSet\",verb=\"apply\"} 2"),
            "{text}"
        );
    }
}
