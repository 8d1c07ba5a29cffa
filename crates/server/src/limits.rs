//! Limits on open connections, in total and per client address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

struct State {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
    last_log: Option<Instant>,
}

/// Counts open connections and refuses new ones past the limits.
pub struct ConnectionLimits {
    max_total: usize,
    max_per_ip: usize,
    state: Mutex<State>,
}

/// A connection's place within the limits, given back when dropped.
pub struct Slot {
    limits: Arc<ConnectionLimits>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.limits.state.lock();
        s.total = s.total.saturating_sub(1);
        if let Some(n) = s.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                s.per_ip.remove(&self.ip);
            }
        }
    }
}

impl ConnectionLimits {
    /// Limits of `max_total` connections, `max_per_ip` from one address.
    pub fn new(max_total: usize, max_per_ip: usize) -> Self {
        Self {
            max_total,
            max_per_ip,
            state: Mutex::new(State {
                total: 0,
                per_ip: HashMap::new(),
                last_log: None,
            }),
        }
    }

    /// Takes a slot for a connection from `ip`, or `None` when a limit is reached.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let mut s = self.state.lock();
        let from_ip = s.per_ip.get(&ip).copied().unwrap_or(0);
        if s.total >= self.max_total || from_ip >= self.max_per_ip {
            return None;
        }
        s.total += 1;
        *s.per_ip.entry(ip).or_insert(0) += 1;
        Some(Slot {
            limits: self.clone(),
            ip,
        })
    }

    /// Logs a refused connection, at most once a second so a flood cannot flood the log.
    pub fn log_refusal(&self, ip: IpAddr) {
        let mut s = self.state.lock();
        if s.last_log
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        s.last_log = Some(Instant::now());
        let from_ip = s.per_ip.get(&ip).copied().unwrap_or(0);
        tracing::warn!(
            %ip,
            open = s.total,
            from_this_ip = from_ip,
            max_connections = self.max_total,
            max_connections_per_ip = self.max_per_ip,
            "connection refused: connection limit reached"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_apply_in_total_and_per_ip_and_free_on_drop() {
        let l = Arc::new(ConnectionLimits::new(3, 2));
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let s1 = l.admit(a).unwrap();
        let _s2 = l.admit(a).unwrap();
        assert!(l.admit(a).is_none(), "per-ip limit");
        let _s3 = l.admit(b).unwrap();
        assert!(l.admit(b).is_none(), "total limit");
        drop(s1);
        assert!(l.admit(a).is_some());
    }
}
