//! Human-readable summaries for the terminal.

use std::fmt::Write;

use crate::config::Mode;
use crate::histogram::LatencySummary;
use crate::report::{fmt_us, pct, thousands, CompareReport, RunReport};
use crate::validate::ValidationReport;

fn latency_row(out: &mut String, label: &str, l: &LatencySummary) {
    let _ = writeln!(
        out,
        "  {:<22} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        label,
        fmt_us(l.p50_us),
        fmt_us(l.p90_us),
        fmt_us(l.p95_us),
        fmt_us(l.p99_us),
        fmt_us(l.p999_us),
        fmt_us(l.max_us)
    );
}

fn latency_header(out: &mut String) {
    let _ = writeln!(
        out,
        "  {:<22} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "latency", "p50", "p90", "p95", "p99", "p99.9", "max"
    );
}

/// One-paragraph verdict of a validation.
pub fn validation_line(v: &ValidationReport) -> String {
    format!(
        "{}: acknowledged {}, consumed {}, lost {}, duplicates {}, reordered {}, corrupted {}",
        if v.passed { "PASSED" } else { "FAILED" },
        thousands(v.acknowledged),
        thousands(v.consumed_unique),
        thousands(v.lost),
        thousands(v.duplicates),
        thousands(v.reordered),
        thousands(v.corrupted)
    )
}

/// The final summary table of a single run.
pub fn render_run(r: &RunReport) -> String {
    let c = &r.config;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "spate-bench {} | {} | {} | topic {} | concurrency {} | {} B | acks={} | compression {}{}",
        r.version,
        r.mode.as_str(),
        c.bootstrap,
        c.topic,
        c.concurrency,
        c.message_size,
        c.acks.as_str(),
        c.compression.as_str(),
        if r.interrupted { " | INTERRUPTED" } else { "" }
    );
    if let Some(p) = &r.produce {
        let _ = writeln!(out, "  produce");
        let _ = writeln!(out, "    attempted   {:>14}", thousands(p.attempted));
        let _ = writeln!(
            out,
            "    delivered   {:>14}   ({} of settled; only broker-acknowledged messages count)",
            thousands(p.delivered),
            pct(p.success_rate)
        );
        let _ = writeln!(out, "    failed      {:>14}", thousands(p.failed));
        let _ = writeln!(
            out,
            "    throughput  {:>14} msg/s  {:.2} MiB/s  over {:.2} s",
            thousands(p.msgs_per_sec.round() as u64),
            p.mib_per_sec,
            p.elapsed_s
        );
        for (code, n) in &p.errors.0 {
            let _ = writeln!(out, "    error       {:>14}  {}", thousands(*n), code);
        }
    }
    if let Some(co) = &r.consume {
        let _ = writeln!(out, "  consume");
        let _ = writeln!(out, "    consumed    {:>14}", thousands(co.consumed));
        let _ = writeln!(
            out,
            "    throughput  {:>14} msg/s  {:.2} MiB/s  over {:.2} s",
            thousands(co.msgs_per_sec.round() as u64),
            co.mib_per_sec,
            co.elapsed_s
        );
        for (code, n) in &co.errors.0 {
            let _ = writeln!(out, "    error       {:>14}  {}", thousands(*n), code);
        }
    }
    for o in &r.operations {
        let _ = writeln!(
            out,
            "  {:<14} ok {:>8}  errors {:>6}  {:>10.1} op/s",
            o.op,
            thousands(o.ok),
            thousands(o.errors.total()),
            o.ops_per_sec
        );
    }
    let p_lat = r.produce.as_ref().and_then(|p| p.latency_us.as_ref());
    let c_lat = r.consume.as_ref().and_then(|c| c.latency_us.as_ref());
    let has_ops = r.operations.iter().any(|o| o.latency_us.is_some());
    if p_lat.is_some() || c_lat.is_some() || has_ops {
        latency_header(&mut out);
        if let Some(l) = p_lat {
            latency_row(&mut out, "enqueue -> ack", l);
        }
        if let Some(l) = c_lat {
            latency_row(&mut out, "produce -> consume", l);
        }
        for o in &r.operations {
            if let Some(l) = &o.latency_us {
                latency_row(&mut out, &o.op, l);
            }
        }
    }
    if let Some(v) = &r.validation {
        let _ = writeln!(out, "  validation {}", validation_line(v));
        for viol in v.violations.iter().filter(|v| v.is_violation).take(10) {
            let _ = writeln!(
                out,
                "    {:?} producer {} seq {} partition {} offset {}: {}",
                viol.kind,
                viol.producer.map_or("-".into(), |p| p.to_string()),
                viol.seq.map_or("-".into(), |s| s.to_string()),
                viol.partition.map_or("-".into(), |p| p.to_string()),
                viol.offset.map_or("-".into(), |o| o.to_string()),
                viol.detail
            );
        }
    }
    let _ = writeln!(
        out,
        "  client      {:.2} CPU s, peak RSS {:.1} MiB, librdkafka {}",
        r.client.cpu_seconds, r.client.rss_peak_mib, r.client.librdkafka
    );
    for n in &r.notes {
        let _ = writeln!(out, "  note: {n}");
    }
    out
}

/// The comparison table: one line per case and target, ratios against the first target.
pub fn render_compare(c: &CompareReport) -> String {
    let mut out = String::new();
    let names: Vec<&str> = c.targets.iter().map(|t| t.name.as_str()).collect();
    let _ = writeln!(
        out,
        "spate-bench {} compare | suite {} | targets {} | {} x {} | librdkafka {}{}",
        c.version,
        c.suite,
        names.join(", "),
        c.system.cpu_count,
        c.system.cpu_model,
        c.system.librdkafka,
        if c.interrupted { " | INTERRUPTED" } else { "" }
    );
    let _ = writeln!(
        out,
        "{:<26} {:<10} {:>12} {:>9} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9} {:>9}",
        "case",
        "target",
        "msg/s",
        "MiB/s",
        "p50",
        "p99",
        "p99.9",
        "ok %",
        "valid",
        "brk cpu",
        "vs first"
    );
    for case in &c.cases {
        let base = case
            .results
            .first()
            .and_then(|r| r.run.as_ref())
            .map(|r| r.headline_rate());
        for res in &case.results {
            let Some(run) = &res.run else {
                let _ = writeln!(
                    out,
                    "{:<26} {:<10} error: {}",
                    case.name,
                    res.target,
                    res.error.as_deref().unwrap_or("no result")
                );
                continue;
            };
            let lat = run.headline_latency();
            let ok = run
                .produce
                .as_ref()
                .map_or("-".to_string(), |p| pct(p.success_rate));
            let valid = run
                .validation
                .as_ref()
                .map_or("-", |v| if v.passed { "ok" } else { "FAILED" });
            let ratio = match base {
                Some(b) if b > 0.0 => format!("{:.2}x", run.headline_rate() / b),
                _ => "-".into(),
            };
            let _ = writeln!(
                out,
                "{:<26} {:<10} {:>12} {:>9.1} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9} {:>9}",
                case.name,
                res.target,
                thousands(run.headline_rate().round() as u64),
                run.headline_mib(),
                lat.map_or("-".into(), |l| fmt_us(l.p50_us)),
                lat.map_or("-".into(), |l| fmt_us(l.p99_us)),
                lat.map_or("-".into(), |l| fmt_us(l.p999_us)),
                ok,
                valid,
                res.broker_resources
                    .as_ref()
                    .map_or("-".into(), |b| format!("{:.1}s", b.cpu_seconds)),
                ratio
            );
        }
    }
    let rt = c.cases.iter().any(|k| {
        k.results
            .iter()
            .any(|r| r.run.as_ref().is_some_and(|x| x.mode == Mode::RoundTrip))
    });
    let _ =
        writeln!(
        out,
        "latency: produce cases enqueue -> ack{}; msg/s counts broker-acknowledged messages only",
        if rt { ", round-trip cases produce -> consume" } else { "" }
    );
    out
}
