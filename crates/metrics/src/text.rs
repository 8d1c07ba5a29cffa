//! Exposition: the values read at scrape time are handed to the `prometheus-client` crate,
//! which writes the OpenMetrics text format. The hot path never sees the library: it adds to
//! this crate's atomics, and a scrape copies them into a [`Writer`].

use std::borrow::Cow;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder};
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::{Histogram, SlowRequests};

/// The content type of [`Writer::finish`]'s text (ended with [`EOF`]).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The line that ends an OpenMetrics exposition: append it once after every part.
pub const EOF: &str = "# EOF\n";

type Labels = Vec<(String, String)>;

#[derive(Debug, Clone)]
enum Sample {
    Value(Labels, f64),
    /// A counter that carries its own exemplar (the library encodes both).
    WithExemplar(Labels, SlowRequests),
    Histogram {
        labels: Labels,
        sum: f64,
        count: u64,
        /// (upper bound, observations in this bucket alone).
        buckets: Vec<(f64, u64)>,
    },
}

#[derive(Debug, Clone)]
struct Family {
    name: String,
    help: String,
    kind: MetricType,
    samples: Vec<Sample>,
}

/// One scrape's families and samples, encoded by `prometheus-client` in [`Writer::finish`].
#[derive(Debug, Default)]
pub struct Writer {
    families: Vec<Family>,
}

fn owned(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

impl Writer {
    /// Starts a metric family; `kind` is "counter", "gauge" or "histogram". A counter's name
    /// ends in `_total`, as OpenMetrics writes its samples.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let kind = match kind {
            "counter" => MetricType::Counter,
            "histogram" => MetricType::Histogram,
            _ => MetricType::Gauge,
        };
        self.families.push(Family {
            name: name.to_owned(),
            help: help.to_owned(),
            kind,
            samples: Vec::new(),
        });
        self
    }

    fn family_of(&mut self, name: &str) -> Option<&mut Family> {
        self.families.iter_mut().rev().find(|f| f.name == name)
    }

    /// One sample of the family `name` (started with [`Writer::family`]).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        if let Some(f) = self.family_of(name) {
            f.samples.push(Sample::Value(owned(labels), value));
        }
        self
    }

    /// A counter with its exemplar, of the family `name`.
    pub fn counter_with_exemplar(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        c: &SlowRequests,
    ) -> &mut Self {
        if let Some(f) = self.family_of(name) {
            f.samples
                .push(Sample::WithExemplar(owned(labels), c.clone()));
        }
        self
    }

    /// A histogram recorded in `unit_per_second` units (1e6 for µs), exported in seconds or
    /// as plain counts when `unit_per_second` is 1.
    pub fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        h: &Histogram,
        unit_per_second: f64,
    ) -> &mut Self {
        let (cumulative, sum, count) = h.snapshot();
        let mut below = 0;
        let buckets = cumulative
            .into_iter()
            .map(|(bound, n)| {
                let own = n.saturating_sub(below);
                below = n;
                let le = bound.map_or(f64::INFINITY, |b| b as f64 / unit_per_second);
                (le, own)
            })
            .collect();
        if let Some(f) = self.family_of(name) {
            f.samples.push(Sample::Histogram {
                labels: owned(labels),
                sum: sum as f64 / unit_per_second,
                count,
                buckets,
            });
        }
        self
    }

    /// The OpenMetrics text of every family, without the final [`EOF`] (a scrape joins
    /// several writers' text, then ends it once).
    pub fn finish(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Families(self.families)));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, &registry);
        out
    }
}

#[derive(Debug)]
struct Families(Vec<Family>);

/// No exemplars are recorded; the type the encoder needs to say so.
type NoExemplar = Exemplar<Labels, f64>;

fn encode_sample(f: &Family, s: &Sample, m: &mut MetricEncoder) -> Result<(), std::fmt::Error> {
    match (s, f.kind) {
        (Sample::Value(_, v), MetricType::Counter) => {
            m.encode_counter::<Labels, f64, f64>(v, None::<&NoExemplar>)
        }
        (Sample::Value(_, v), _) => m.encode_gauge(v),
        // Encoded with its labels by the caller (the library's metric takes the encoder).
        (Sample::WithExemplar(..), _) => Ok(()),
        (
            Sample::Histogram {
                sum,
                count,
                buckets,
                ..
            },
            _,
        ) => m.encode_histogram::<Labels>(*sum, *count, buckets, None),
    }
}

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            // OpenMetrics names a counter without `_total` and adds it to its samples.
            let name = match f.kind {
                MetricType::Counter => f.name.strip_suffix("_total").unwrap_or(&f.name),
                _ => f.name.as_str(),
            };
            let mut m = encoder.encode_descriptor(name, &f.help, None, f.kind)?;
            for s in &f.samples {
                let labels = match s {
                    Sample::Value(l, _) | Sample::WithExemplar(l, _) => l,
                    Sample::Histogram { labels, .. } => labels,
                };
                if labels.is_empty() {
                    encode_sample(f, s, &mut m)?;
                } else {
                    let cow: Vec<(Cow<'_, str>, Cow<'_, str>)> = labels
                        .iter()
                        .map(|(k, v)| (Cow::from(k.as_str()), Cow::from(v.as_str())))
                        .collect();
                    let mut labelled = m.encode_family(&cow)?;
                    match s {
                        Sample::WithExemplar(_, c) => {
                            prometheus_client::encoding::EncodeMetric::encode(c, labelled)?
                        }
                        _ => encode_sample(f, s, &mut labelled)?,
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_families_samples_and_histograms_as_openmetrics() {
        let h = Histogram::new(&[1_000]);
        h.observe(500);
        h.observe(5_000);
        let mut w = Writer::default();
        w.family("spate_x_total", "counter", "Things.")
            .sample("spate_x_total", &[("topic", "a\"b")], 3.0)
            .family("spate_up", "gauge", "Up.")
            .sample("spate_up", &[], 1.0)
            .family("spate_lat_seconds", "histogram", "Latency.")
            .histogram("spate_lat_seconds", &[("api", "Produce")], &h, 1e6);
        let text = w.finish() + EOF;
        assert!(text.contains("# TYPE spate_x counter\n"), "{text}");
        assert!(text.contains("spate_x_total{topic=\"a\\\"b\"} 3"), "{text}");
        assert!(text.contains("spate_up 1"), "{text}");
        assert!(
            text.contains("spate_lat_seconds_bucket{le=\"0.001\",api=\"Produce\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("spate_lat_seconds_bucket{le=\"+Inf\",api=\"Produce\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("spate_lat_seconds_count{api=\"Produce\"} 2\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[cfg(feature = "enabled")]
    #[test]
    fn a_slow_request_is_counted_with_an_exemplar_naming_it() {
        let r = crate::Registry::default();
        r.request_from(0, 5_000, "10.0.0.1:4000", 1);
        r.request_from(0, 250_000, "10.0.0.2:5000", 42);
        let mut w = Writer::default();
        w.family("spate_slow_requests_total", "counter", "Slow.")
            .counter_with_exemplar(
                "spate_slow_requests_total",
                &[("api", "Produce")],
                &r.slow_requests[0],
            );
        let text = w.finish();
        assert!(
            text.contains(
                "spate_slow_requests_total{api=\"Produce\"} 1 # {peer=\"10.0.0.2:5000\",correlation_id=\"42\"} 1"
            ),
            "{text}"
        );
        assert_eq!(r.requests[0].get(), 2, "both are counted as requests");
    }
}
