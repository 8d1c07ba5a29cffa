//! The broker's side of KIP-714: the subscription it hands out and the latest pushed value of
//! each client's series, bounded in clients and series and forgotten when a client stops
//! pushing.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;
use uuid::Uuid;

use crate::otlp::{decode_metrics, Point};

/// Most clients tracked at once; a push from one more is refused until others expire.
const MAX_CLIENTS: usize = 1_000;
/// Most series kept per client.
const MAX_SERIES: usize = 1_000;

/// What the broker asks clients to push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    /// The client's instance id (assigned here when it had none).
    pub client_instance_id: Uuid,
    /// Identifies this subscription's settings; a push naming another one is refused.
    pub subscription_id: i32,
    /// Metric name prefixes wanted (`""` for every metric; none for no pushes).
    pub requested_metrics: Vec<String>,
    /// How often to push.
    pub push_interval_ms: i32,
    /// Largest payload accepted.
    pub telemetry_max_bytes: i32,
}

/// Why a push was refused, as KIP-714's error codes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushError {
    /// No client instance id (INVALID_REQUEST).
    NoInstanceId,
    /// The subscription changed or was never handed out (UNKNOWN_SUBSCRIPTION_ID).
    UnknownSubscription,
    /// A compression type not offered (UNSUPPORTED_COMPRESSION_TYPE).
    UnsupportedCompression,
    /// Larger than the subscription allows (TELEMETRY_TOO_LARGE).
    TooLarge,
    /// Pushed again before the interval passed (THROTTLING_QUOTA_EXCEEDED).
    TooSoon,
    /// Not an OTLP metrics payload (INVALID_RECORD).
    Undecodable(String),
    /// Too many clients tracked already (THROTTLING_QUOTA_EXCEEDED).
    TooManyClients,
}

#[derive(Debug)]
struct Client {
    last_push_ms: Option<u64>,
    last_seen_ms: u64,
    series: BTreeMap<(String, Vec<(String, String)>), Point>,
}

/// Subscriptions handed out and the metrics pushed under them.
#[derive(Debug)]
pub struct TelemetryStore {
    requested: Vec<String>,
    push_interval_ms: u32,
    max_bytes: u32,
    subscription_id: i32,
    clients: Mutex<HashMap<Uuid, Client>>,
}

impl TelemetryStore {
    /// A store asking for metrics whose names start with one of `requested` (an empty list
    /// asks for nothing; `""` for everything), pushed every `push_interval_ms`.
    pub fn new(requested: Vec<String>, push_interval_ms: u32, max_bytes: u32) -> Self {
        // The id changes whenever the settings do, so clients fetch the new subscription.
        let mut h: u32 = 0x811c_9dc5;
        for b in requested
            .join(",")
            .bytes()
            .chain(push_interval_ms.to_le_bytes())
            .chain(max_bytes.to_le_bytes())
        {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
        Self {
            requested,
            push_interval_ms: push_interval_ms.max(100),
            max_bytes,
            subscription_id: (h & 0x7fff_ffff) as i32,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// GetTelemetrySubscriptions: the subscription for `client` (a new instance id for a
    /// client that has none).
    pub fn subscribe(&self, client: Uuid, now_ms: u64) -> Subscription {
        let id = if client.is_nil() {
            Uuid::new_v4()
        } else {
            client
        };
        self.expire(now_ms);
        Subscription {
            client_instance_id: id,
            subscription_id: self.subscription_id,
            requested_metrics: self.requested.clone(),
            push_interval_ms: i32::try_from(self.push_interval_ms).unwrap_or(i32::MAX),
            telemetry_max_bytes: i32::try_from(self.max_bytes).unwrap_or(i32::MAX),
        }
    }

    fn wanted(&self, name: &str) -> bool {
        self.requested.iter().any(|p| name.starts_with(p.as_str()))
    }

    /// PushTelemetry: stores the latest value of each requested series of `client`.
    pub fn push(
        &self,
        client: Uuid,
        subscription_id: i32,
        terminating: bool,
        compression_type: i8,
        payload: &[u8],
        now_ms: u64,
    ) -> Result<usize, PushError> {
        if client.is_nil() {
            return Err(PushError::NoInstanceId);
        }
        if subscription_id != self.subscription_id {
            return Err(PushError::UnknownSubscription);
        }
        if compression_type != 0 {
            return Err(PushError::UnsupportedCompression);
        }
        if payload.len() > self.max_bytes as usize {
            return Err(PushError::TooLarge);
        }
        let points = decode_metrics(payload).map_err(|e| PushError::Undecodable(e.to_string()))?;
        self.expire(now_ms);
        let mut clients = self.clients.lock();
        if !clients.contains_key(&client) && clients.len() >= MAX_CLIENTS {
            return Err(PushError::TooManyClients);
        }
        let c = clients.entry(client).or_insert_with(|| Client {
            last_push_ms: None,
            last_seen_ms: now_ms,
            series: BTreeMap::new(),
        });
        // Clients jitter their pushes; half an interval early is still on time.
        let early = c
            .last_push_ms
            .is_some_and(|t| now_ms < t + u64::from(self.push_interval_ms / 2));
        if early && !terminating {
            return Err(PushError::TooSoon);
        }
        c.last_push_ms = Some(now_ms);
        c.last_seen_ms = now_ms;
        let mut kept = 0;
        for p in points.into_iter().filter(|p| self.wanted(&p.name)) {
            let key = (p.name.clone(), p.attributes.clone());
            if c.series.len() >= MAX_SERIES && !c.series.contains_key(&key) {
                continue;
            }
            c.series.insert(key, p);
            kept += 1;
        }
        Ok(kept)
    }

    /// Forgets clients silent for three push intervals.
    fn expire(&self, now_ms: u64) {
        let horizon = 3 * u64::from(self.push_interval_ms);
        self.clients
            .lock()
            .retain(|_, c| now_ms.saturating_sub(c.last_seen_ms) <= horizon);
    }

    /// Every client's latest series, for /metrics.
    pub fn snapshot(&self, now_ms: u64) -> Vec<(Uuid, Vec<Point>)> {
        self.expire(now_ms);
        let mut out: Vec<(Uuid, Vec<Point>)> = self
            .clients
            .lock()
            .iter()
            .map(|(id, c)| (*id, c.series.values().cloned().collect()))
            .collect();
        out.sort_by_key(|(id, _)| *id);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::testing::metrics_data;

    fn store() -> TelemetryStore {
        TelemetryStore::new(vec!["org.apache.kafka.producer.".into()], 1_000, 1 << 20)
    }

    #[test]
    fn a_client_gets_an_id_and_pushes_the_requested_metrics_only() {
        let s = store();
        let sub = s.subscribe(Uuid::nil(), 0);
        assert!(!sub.client_instance_id.is_nil());
        let payload = metrics_data(&[
            (
                "org.apache.kafka.producer.record.send.rate",
                3.0,
                false,
                &[],
            ),
            ("org.apache.kafka.consumer.fetch.rate", 9.0, false, &[]),
        ]);
        let kept = s
            .push(
                sub.client_instance_id,
                sub.subscription_id,
                false,
                0,
                &payload,
                10,
            )
            .unwrap();
        assert_eq!(kept, 1);
        let snap = s.snapshot(10);
        assert_eq!(snap.len(), 1);
        assert_eq!(snap[0].1[0].value, 3.0);
    }

    #[test]
    fn pushes_are_refused_with_kip_714s_reasons() {
        let s = store();
        let sub = s.subscribe(Uuid::nil(), 0);
        let id = sub.client_instance_id;
        let ok = metrics_data(&[("org.apache.kafka.producer.x", 1.0, false, &[])]);
        assert_eq!(
            s.push(Uuid::nil(), sub.subscription_id, false, 0, &ok, 0),
            Err(PushError::NoInstanceId)
        );
        assert_eq!(
            s.push(id, sub.subscription_id + 1, false, 0, &ok, 0),
            Err(PushError::UnknownSubscription)
        );
        assert_eq!(
            s.push(id, sub.subscription_id, false, 3, &ok, 0),
            Err(PushError::UnsupportedCompression)
        );
        assert!(matches!(
            s.push(id, sub.subscription_id, false, 0, &[0xff; 3], 0),
            Err(PushError::Undecodable(_))
        ));
        let small = TelemetryStore::new(vec![String::new()], 1_000, 4);
        let sub_small = small.subscribe(id, 0);
        assert_eq!(
            small.push(id, sub_small.subscription_id, false, 0, &ok, 0),
            Err(PushError::TooLarge)
        );
        assert!(s.push(id, sub.subscription_id, false, 0, &ok, 0).is_ok());
        assert_eq!(
            s.push(id, sub.subscription_id, false, 0, &ok, 100),
            Err(PushError::TooSoon)
        );
        // A terminating push is taken whenever it comes.
        assert!(s.push(id, sub.subscription_id, true, 0, &ok, 200).is_ok());
    }

    #[test]
    fn silent_clients_are_forgotten() {
        let s = store();
        let sub = s.subscribe(Uuid::nil(), 0);
        let ok = metrics_data(&[("org.apache.kafka.producer.x", 1.0, false, &[])]);
        s.push(
            sub.client_instance_id,
            sub.subscription_id,
            false,
            0,
            &ok,
            0,
        )
        .unwrap();
        assert_eq!(s.snapshot(2_000).len(), 1);
        assert!(s.snapshot(10_000).is_empty());
    }
}
