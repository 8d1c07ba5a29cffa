//! Prometheus text exposition format (version 0.0.4).

use std::fmt::Write;

use crate::Histogram;

/// Builds one scrape's worth of text.
#[derive(Default)]
pub struct Writer {
    out: String,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn labels(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

impl Writer {
    /// Starts a metric family.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        self
    }

    /// One sample.
    pub fn sample(&mut self, name: &str, labels_: &[(&str, &str)], value: f64) -> &mut Self {
        let _ = writeln!(self.out, "{name}{} {}", labels(labels_), fmt_value(value));
        self
    }

    /// A histogram recorded in `unit_per_second` units (1e6 for µs), exported in seconds or
    /// as plain counts when `unit_per_second` is 1.
    pub fn histogram(
        &mut self,
        name: &str,
        labels_: &[(&str, &str)],
        h: &Histogram,
        unit_per_second: f64,
    ) -> &mut Self {
        let (buckets, sum, count) = h.snapshot();
        for (bound, n) in buckets {
            let le = bound.map_or("+Inf".to_string(), |b| {
                fmt_value(b as f64 / unit_per_second)
            });
            let mut l: Vec<(&str, &str)> = labels_.to_vec();
            l.push(("le", &le));
            let _ = writeln!(self.out, "{name}_bucket{} {n}", labels(&l));
        }
        let _ = writeln!(
            self.out,
            "{name}_sum{} {}",
            labels(labels_),
            fmt_value(sum as f64 / unit_per_second)
        );
        let _ = writeln!(self.out, "{name}_count{} {count}", labels(labels_));
        self
    }

    /// The finished text.
    pub fn finish(self) -> String {
        self.out
    }
}

fn fmt_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_families_samples_and_histograms() {
        let h = Histogram::new(&[1_000]);
        h.observe(500);
        let mut w = Writer::default();
        w.family("spate_x_total", "counter", "Things.")
            .sample("spate_x_total", &[("topic", "a\"b")], 3.0)
            .family("spate_lat_seconds", "histogram", "Latency.")
            .histogram("spate_lat_seconds", &[("api", "Produce")], &h, 1e6);
        let text = w.finish();
        assert!(text.contains("spate_x_total{topic=\"a\\\"b\"} 3\n"));
        assert!(text.contains("spate_lat_seconds_bucket{api=\"Produce\",le=\"0.001\"} 1\n"));
        assert!(text.contains("spate_lat_seconds_bucket{api=\"Produce\",le=\"+Inf\"} 1\n"));
        assert!(text.contains("spate_lat_seconds_sum{api=\"Produce\"} 0.0005\n"));
    }
}
