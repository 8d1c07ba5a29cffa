//! A self-contained HTML comparison report: inline CSS and SVG charts, no scripts, no network.

use std::fmt::Write;
use std::path::Path;

use crate::error::{BenchError, Result};
use crate::histogram::LatencySummary;
use crate::report::{fmt_us, pct, thousands, CompareReport};

/// Series colours, one per target (colour-blind-friendly ordering).
const PALETTE: [&str; 6] = [
    "#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626", "#0891b2",
];

/// Escapes text for HTML element content and attribute values.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// "2026-11-04 13:05 UTC" from Unix milliseconds (civil-from-days, no date library needed).
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let (h, m) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{m:02} UTC")
}

/// Grouped horizontal bars: one row per case, one bar per target, scaled per case.
fn throughput_chart(c: &CompareReport) -> String {
    let n_t = c.targets.len().max(1);
    let bar_h = 14.0;
    let row_h = bar_h * n_t as f64 + 14.0;
    let (left, width) = (190.0, 560.0);
    let height = 30.0 + row_h * c.cases.len() as f64;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" viewBox="0 0 {w} {height}" role="img" aria-label="Throughput per case">"#,
        w = left + width + 150.0
    );
    for (i, t) in c.targets.iter().enumerate() {
        let x = left + i as f64 * 140.0;
        let _ = write!(
            s,
            r#"<rect x="{x}" y="4" width="12" height="12" fill="{}"/><text x="{}" y="14" class="lbl">{}</text>"#,
            color(i),
            x + 16.0,
            esc(&t.name)
        );
    }
    for (ci, case) in c.cases.iter().enumerate() {
        let y0 = 30.0 + ci as f64 * row_h;
        let max = case
            .results
            .iter()
            .filter_map(|r| r.run.as_ref().map(|x| x.headline_rate()))
            .fold(0.0f64, f64::max);
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" class="lbl" text-anchor="end">{}</text>"#,
            left - 8.0,
            y0 + row_h / 2.0,
            esc(&case.name)
        );
        for res in &case.results {
            let ti = c
                .targets
                .iter()
                .position(|t| t.name == res.target)
                .unwrap_or(0);
            let y = y0 + ti as f64 * bar_h;
            match &res.run {
                Some(run) => {
                    let v = run.headline_rate();
                    let w = if max > 0.0 {
                        (v / max * width).max(1.0)
                    } else {
                        1.0
                    };
                    let _ = write!(
                        s,
                        r#"<rect x="{left}" y="{y}" width="{w:.1}" height="{}" fill="{}"><title>{}: {} msg/s</title></rect><text x="{:.1}" y="{}" class="val">{} msg/s</text>"#,
                        bar_h - 2.0,
                        color(ti),
                        esc(&res.target),
                        thousands(v.round() as u64),
                        left + w + 4.0,
                        y + bar_h - 4.0,
                        thousands(v.round() as u64)
                    );
                }
                None => {
                    let _ = write!(
                        s,
                        r#"<text x="{}" y="{}" class="err">{}: failed</text>"#,
                        left + 4.0,
                        y + bar_h - 4.0,
                        esc(&res.target)
                    );
                }
            }
        }
    }
    s.push_str("</svg>");
    s
}

/// Horizontal position of a percentile on a "number of nines" axis (max drawn at 4.5).
fn nines(p: f64) -> f64 {
    if p >= 100.0 {
        4.5
    } else {
        (-(1.0 - p / 100.0).log10()).clamp(0.0, 4.0)
    }
}

/// One small chart of latency percentile curves (log-scale latency) for one case.
fn latency_chart(title: &str, series: &[(usize, &str, &LatencySummary)]) -> String {
    let (w, h, l, r, t, b) = (360.0, 220.0, 62.0, 12.0, 26.0, 34.0);
    let (pw, ph) = (w - l - r, h - t - b);
    let lo = series
        .iter()
        .flat_map(|(_, _, s)| s.curve.iter().map(|p| p.latency_us))
        .min()
        .unwrap_or(1)
        .max(1);
    let hi = series
        .iter()
        .flat_map(|(_, _, s)| s.curve.iter().map(|p| p.latency_us))
        .max()
        .unwrap_or(10)
        .max(lo * 10);
    let (ylo, yhi) = ((lo as f64).log10().floor(), (hi as f64).log10().ceil());
    let x = |p: f64| l + nines(p) / 4.5 * pw;
    let y = |v: u64| t + ph - ((v.max(1) as f64).log10() - ylo) / (yhi - ylo).max(1e-9) * ph;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="Latency percentiles {0}"><text x="{l}" y="16" class="ttl">{0}</text>"#,
        esc(title)
    );
    let mut decade = ylo;
    while decade <= yhi {
        let v = 10f64.powf(decade) as u64;
        let yy = y(v);
        let _ = write!(
            s,
            r##"<line x1="{l}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#e5e7eb"/><text x="{}" y="{:.1}" class="tick" text-anchor="end">{}</text>"##,
            l + pw,
            l - 4.0,
            yy + 4.0,
            fmt_us(v)
        );
        decade += 1.0;
    }
    for (p, label) in [
        (0.0, "p0"),
        (90.0, "p90"),
        (99.0, "p99"),
        (99.9, "p99.9"),
        (99.99, "p99.99"),
        (100.0, "max"),
    ] {
        let xx = x(p);
        let _ = write!(
            s,
            r##"<line x1="{xx:.1}" x2="{xx:.1}" y1="{t}" y2="{}" stroke="#e5e7eb"/><text x="{xx:.1}" y="{}" class="tick" text-anchor="middle">{label}</text>"##,
            t + ph,
            t + ph + 14.0
        );
    }
    for (ci, name, sum) in series {
        let pts: Vec<String> = sum
            .curve
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.percentile), y(p.latency_us)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"><title>{}: p50 {} p99 {} max {}</title></polyline>"#,
            color(*ci),
            pts.join(" "),
            esc(name),
            fmt_us(sum.p50_us),
            fmt_us(sum.p99_us),
            fmt_us(sum.max_us)
        );
    }
    s.push_str("</svg>");
    s
}

const STYLE: &str = "body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px 32px;color:#111827;background:#fff}\
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #e5e7eb;padding-bottom:4px}\
.sub{color:#6b7280;margin:0 0 16px}table{border-collapse:collapse;font-size:12px}\
th,td{padding:3px 7px;border-bottom:1px solid #f3f4f6;text-align:right;white-space:nowrap}\
th{background:#f9fafb;font-weight:600}td.l,th.l{text-align:left}.ok{color:#15803d;font-weight:600}\
.bad{color:#b91c1c;font-weight:600}.grid{display:flex;flex-wrap:wrap;gap:12px}\
.lbl{font-size:12px;fill:#374151}.val{font-size:11px;fill:#374151}.tick{font-size:10px;fill:#6b7280}\
.ttl{font-size:13px;font-weight:600;fill:#111827}.err{font-size:11px;fill:#b91c1c}\
.sw{display:inline-block;width:10px;height:10px;margin-right:6px;border-radius:2px}";

/// Renders the whole report.
pub fn render_compare(c: &CompareReport) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>spate-bench: {}</title><style>{STYLE}</style></head><body>\n",
        esc(&c.targets.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(" vs "))
    );
    let _ = writeln!(
        h,
        "<h1>spate-bench comparison: {}</h1><p class=\"sub\">suite <b>{}</b> &middot; {} &middot; spate-bench {} &middot; librdkafka {}{} &middot; throughput counts broker-acknowledged messages only</p>",
        esc(&c.targets.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(" vs ")),
        esc(&c.suite),
        utc(c.started_unix_ms),
        esc(&c.version),
        esc(&c.system.librdkafka),
        if c.interrupted { " &middot; <span class=\"bad\">INTERRUPTED</span>" } else { "" }
    );

    h.push_str("<h2>Throughput per case</h2><p class=\"sub\">bars are scaled within each case; labels are delivered (or consumed) messages per second</p>\n");
    h.push_str(&throughput_chart(c));

    h.push_str("\n<h2>Latency percentiles</h2><p class=\"sub\">produce cases: enqueue to delivery report; round-trip: produce timestamp to consumption; log scale</p>\n<div class=\"grid\">");
    for case in &c.cases {
        let series: Vec<(usize, &str, &LatencySummary)> = case
            .results
            .iter()
            .filter_map(|r| {
                let ti = c.targets.iter().position(|t| t.name == r.target)?;
                Some((ti, r.target.as_str(), r.run.as_ref()?.headline_latency()?))
            })
            .collect();
        if !series.is_empty() {
            h.push_str(&latency_chart(&case.name, &series));
        }
    }
    h.push_str("</div>\n<p>");
    for (i, t) in c.targets.iter().enumerate() {
        let _ = write!(
            h,
            "<span class=\"sw\" style=\"background:{}\"></span>{} &nbsp; ",
            color(i),
            esc(&t.name)
        );
    }
    h.push_str("</p>\n");

    h.push_str("<h2>Results</h2><table><tr><th class=\"l\">case</th><th class=\"l\">target</th><th>msg/s</th><th>MiB/s</th><th>vs first</th><th>p50</th><th>p99</th><th>p99.9</th><th>max</th><th>success</th><th>errors</th><th>integrity</th><th>broker CPU s</th><th>broker RSS peak</th><th>client CPU s</th></tr>\n");
    for case in &c.cases {
        let base = case
            .results
            .first()
            .and_then(|r| r.run.as_ref())
            .map(|r| r.headline_rate());
        for res in &case.results {
            let _ = write!(
                h,
                "<tr><td class=\"l\" title=\"{}\">{}</td><td class=\"l\">{}</td>",
                esc(&case.description),
                esc(&case.name),
                esc(&res.target)
            );
            let Some(run) = &res.run else {
                let _ = writeln!(
                    h,
                    "<td class=\"l bad\" colspan=\"13\">{}</td></tr>",
                    esc(res.error.as_deref().unwrap_or("no result"))
                );
                continue;
            };
            let lat = run.headline_latency();
            let cell = |f: fn(&LatencySummary) -> u64| lat.map_or("-".into(), |l| fmt_us(f(l)));
            let ratio = match base {
                Some(b) if b > 0.0 => format!("{:.2}x", run.headline_rate() / b),
                _ => "-".into(),
            };
            let success = run
                .produce
                .as_ref()
                .map_or("-".into(), |p| pct(p.success_rate));
            let integrity = match &run.validation {
                Some(v) if v.passed => "<span class=\"ok\">ok</span>".to_string(),
                Some(v) => format!(
                    "<span class=\"bad\">lost {} dup {} reord {} corrupt {}</span>",
                    v.lost, v.duplicates, v.reordered, v.corrupted
                ),
                None => "-".into(),
            };
            let b = res.broker_resources.as_ref();
            let _ = writeln!(
                h,
                "<td>{}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td></tr>",
                thousands(run.headline_rate().round() as u64),
                run.headline_mib(),
                ratio,
                cell(|l| l.p50_us),
                cell(|l| l.p99_us),
                cell(|l| l.p999_us),
                cell(|l| l.max_us),
                success,
                thousands(run.error_total()),
                integrity,
                b.map_or("-".into(), |b| format!("{:.2}", b.cpu_seconds)),
                b.map_or("-".into(), |b| format!("{:.0} MiB", b.rss_peak_mib)),
                run.client.cpu_seconds
            );
        }
    }
    h.push_str("</table>\n");

    h.push_str("<h2>Targets</h2><table><tr><th class=\"l\">name</th><th class=\"l\">bootstrap</th><th class=\"l\">cluster id</th><th class=\"l\">brokers</th><th class=\"l\">API versions (max)</th></tr>\n");
    for t in &c.targets {
        let b = t.broker.as_ref();
        let apis = b.map_or(String::new(), |b| {
            if let Some(e) = &b.api_versions_error {
                return format!("unavailable: {}", esc(e));
            }
            let named: Vec<String> = b
                .api_versions
                .iter()
                .filter(|a| !a.name.is_empty())
                .map(|a| format!("{} {}", a.name, a.max))
                .collect();
            format!("{} APIs; {}", b.api_versions.len(), esc(&named.join(", ")))
        });
        let _ = writeln!(
            h,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\" style=\"white-space:normal;max-width:700px\">{}</td></tr>",
            esc(&t.name),
            esc(&t.bootstrap),
            esc(b.and_then(|b| b.cluster_id.as_deref()).unwrap_or("-")),
            esc(&b.map_or(String::new(), |b| b.brokers.join(" "))),
            apis
        );
    }
    h.push_str("</table>\n");

    let s = &c.system;
    let _ = writeln!(
        h,
        "<h2>System</h2><table><tr><th class=\"l\">OS</th><td class=\"l\">{}</td></tr><tr><th class=\"l\">kernel</th><td class=\"l\">{}</td></tr><tr><th class=\"l\">CPU</th><td class=\"l\">{} x {} ({})</td></tr><tr><th class=\"l\">memory</th><td class=\"l\">{} MiB</td></tr><tr><th class=\"l\">client</th><td class=\"l\">spate-bench {}, librdkafka {}</td></tr></table>",
        esc(&s.os),
        esc(&s.kernel),
        s.cpu_count,
        esc(&s.cpu_model),
        esc(&s.arch),
        s.memory_mib,
        esc(&s.spate_bench),
        esc(&s.librdkafka)
    );
    h.push_str("<h2>Cases</h2><table>");
    for case in &c.cases {
        let _ = write!(
            h,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
            esc(&case.name),
            esc(&case.description)
        );
    }
    h.push_str("</table>\n</body></html>\n");
    h
}

/// Writes the report to `path`.
pub fn write(c: &CompareReport, path: &Path) -> Result<()> {
    std::fs::write(path, render_compare(c))
        .map_err(|e| BenchError::io(format!("writing {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_and_dates() {
        assert_eq!(
            esc("<a href=\"x\">&</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;"
        );
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc(1_700_000_000_000), "2023-11-14 22:13 UTC");
    }

    #[test]
    fn nines_axis() {
        assert_eq!(nines(0.0), 0.0);
        assert!((nines(99.0) - 2.0).abs() < 1e-9);
        assert_eq!(nines(100.0), 4.5);
    }
}
