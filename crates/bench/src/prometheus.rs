//! A minimal Prometheus text-format endpoint for the live counters of a run.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{BenchError, Result};
use crate::progress::Snapshot;

/// The latest snapshot, shared between the runner and the endpoint.
pub type PromState = Arc<Mutex<Snapshot>>;

/// Renders the exposition text for one snapshot.
pub fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: String| {
        out += &format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n");
    };
    metric(
        "spate_bench_delivered_messages_total",
        "counter",
        "Messages with a successful delivery report.",
        s.delivered.to_string(),
    );
    metric(
        "spate_bench_delivered_bytes_total",
        "counter",
        "Key and value bytes delivered.",
        s.delivered_bytes.to_string(),
    );
    metric(
        "spate_bench_consumed_messages_total",
        "counter",
        "Messages consumed.",
        s.consumed.to_string(),
    );
    metric(
        "spate_bench_consumed_bytes_total",
        "counter",
        "Key and value bytes consumed.",
        s.consumed_bytes.to_string(),
    );
    metric(
        "spate_bench_operations_total",
        "counter",
        "Completed metadata/admin operations.",
        s.operations.to_string(),
    );
    metric(
        "spate_bench_errors_total",
        "counter",
        "Failed deliveries, consumer errors and failed operations.",
        s.errors.to_string(),
    );
    metric(
        "spate_bench_elapsed_seconds",
        "gauge",
        "Seconds since the current phase started.",
        format!("{:.3}", s.elapsed.as_secs_f64()),
    );
    if let Some(p) = s.p99_us {
        metric(
            "spate_bench_latency_p99_seconds",
            "gauge",
            "p99 latency of the current phase so far.",
            format!("{:.6}", p as f64 / 1e6),
        );
    }
    out
}

/// Renders the exposition text at each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `state` on `addr` until `stop` is set.
pub fn serve(addr: SocketAddr, state: PromState, stop: Arc<AtomicBool>) -> Result<JoinHandle<()>> {
    let render: Render = Arc::new(move || render(&state.lock().unwrap_or_else(|p| p.into_inner())));
    serve_with(addr, render, stop)
}

/// Serves what `render` writes on `addr` until `stop` is set.
pub fn serve_with(
    addr: SocketAddr,
    render: Render,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>> {
    let listener = TcpListener::bind(addr)
        .map_err(|e| BenchError::io(format!("prometheus bind {addr}"), e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| BenchError::io("prometheus listener", e))?;
    std::thread::Builder::new()
        .name("prometheus".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => answer(conn, &render),
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        })
        .map_err(|e| BenchError::io("prometheus thread", e))
}

/// Answers one scrape; a misbehaving client only loses its own connection.
fn answer(mut conn: TcpStream, render: &Render) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
    let mut buf = [0u8; 4096];
    let mut seen = Vec::new();
    // Read (bounded) until the end of the request head.
    while seen.len() < 16 * 1024 && !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
    let body = render();
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(body.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_and_serves() {
        let snap = Snapshot {
            delivered: 42,
            p99_us: Some(1500),
            ..Snapshot::default()
        };
        let text = render(&snap);
        assert!(text.contains("spate_bench_delivered_messages_total 42\n"));
        assert!(text.contains("spate_bench_latency_p99_seconds 0.001500\n"));

        let state: PromState = Arc::new(Mutex::new(snap));
        let stop = Arc::new(AtomicBool::new(false));
        let probe = TcpListener::bind("127.0.0.1:0").expect("ephemeral port");
        let addr = probe.local_addr().expect("bound");
        drop(probe);
        let handle = serve(addr, state, Arc::clone(&stop)).expect("serve");
        let mut c = TcpStream::connect(addr).expect("connect");
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("write");
        let mut resp = String::new();
        c.read_to_string(&mut resp).expect("read");
        assert!(resp.starts_with("HTTP/1.1 200 OK"));
        assert!(resp.contains("spate_bench_delivered_messages_total 42"));
        stop.store(true, Ordering::Relaxed);
        handle.join().expect("joined");
    }
}
