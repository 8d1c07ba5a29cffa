//! Client quotas on this broker: the configured table (a file in the data dir standalone, the
//! metadata image in a cluster) and the usage of each quota entity, turned into
//! throttle_time_ms as Kafka does (KIP-219: the response carries the throttle time and the
//! connection reads nothing more until it has passed).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use spate_quotas::{QuotaEntity, QuotaKey, QuotaTable, QuotaValue, Rate, RateConfig};

use crate::error::{io, BrokerError};
use crate::registry::write_atomically;

/// The file holding a standalone broker's quotas.
const QUOTAS_FILE: &str = "client_quotas.json";

/// The principal of every connection until authentication exists (Kafka's name for it).
pub const ANONYMOUS: &str = "ANONYMOUS";

/// Sensors idle this long are dropped, as Kafka expires quota sensors after an hour.
const SENSOR_IDLE: Duration = Duration::from_secs(3600);

/// Most sensors kept at once; past it idle ones go first, so client ids chosen by clients
/// cannot grow memory without bound.
const MAX_SENSORS: usize = 10_000;

/// The usage a quota is measured on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuotaKind {
    /// Bytes produced.
    Produce,
    /// Bytes fetched by consumers.
    Fetch,
    /// Request handling time, in percent of one thread.
    Request,
    /// Partitions created or deleted.
    ControllerMutation,
}

impl QuotaKind {
    fn key(self) -> QuotaKey {
        match self {
            QuotaKind::Produce => QuotaKey::ProducerByteRate,
            QuotaKind::Fetch => QuotaKey::ConsumerByteRate,
            QuotaKind::Request => QuotaKey::RequestPercentage,
            QuotaKind::ControllerMutation => QuotaKey::ControllerMutationRate,
        }
    }

    /// The label in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaKind::Produce => "produce",
            QuotaKind::Fetch => "fetch",
            QuotaKind::Request => "request",
            QuotaKind::ControllerMutation => "controller_mutation",
        }
    }
}

/// Whose usage a sensor counts: the parts of the matched quota entity (a user quota is
/// shared by all the user's clients, a client-id quota by all users of that client id).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SensorKey {
    /// What is measured.
    pub kind: QuotaKind,
    /// The user, when the quota is per user.
    pub user: Option<String>,
    /// The client id, when the quota is per client id.
    pub client_id: Option<String>,
}

struct Sensor {
    rate: Rate,
    last_used: Instant,
    total: f64,
    throttle_ms_total: u64,
    throttled: u64,
    quota: f64,
}

/// One sensor's numbers, for /metrics.
#[derive(Debug, Clone)]
pub struct SensorStats {
    /// Whose usage.
    pub key: SensorKey,
    /// The quota in force.
    pub quota: f64,
    /// The measured rate now.
    pub rate: f64,
    /// Everything recorded (bytes, or percent-milliseconds for request time).
    pub total: f64,
    /// Throttle time handed out, in milliseconds.
    pub throttle_ms_total: u64,
    /// Responses that carried a throttle time.
    pub throttled: u64,
}

/// The broker's client quotas.
pub struct ClientQuotas {
    table: RwLock<QuotaTable>,
    /// False while no quota is configured: the hot path then does nothing else.
    active: AtomicBool,
    sensors: Mutex<HashMap<SensorKey, Sensor>>,
    rates: RateConfig,
    file: Option<PathBuf>,
    epoch: Instant,
}

impl ClientQuotas {
    /// Loads a standalone broker's quotas from `dir` (none when the file is missing).
    pub fn open(dir: &Path) -> Result<Self, BrokerError> {
        let file = dir.join(QUOTAS_FILE);
        let table = match std::fs::read(&file) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| BrokerError::CorruptMetadata {
                    path: file.clone(),
                    reason: format!("client quotas: {e}"),
                })?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => QuotaTable::default(),
            Err(e) => return Err(io("read", &file)(e)),
        };
        Ok(Self::with_table(table, Some(file)))
    }

    fn with_table(table: QuotaTable, file: Option<PathBuf>) -> Self {
        Self {
            active: AtomicBool::new(!table.is_empty()),
            table: RwLock::new(table),
            sensors: Mutex::new(HashMap::new()),
            rates: RateConfig::default(),
            file,
            epoch: Instant::now(),
        }
    }

    /// Whether any quota is configured (accounting is skipped otherwise).
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// A copy of the configured quotas.
    pub fn table(&self) -> QuotaTable {
        self.table.read().clone()
    }

    /// Replaces the table (a cluster node applying the metadata image).
    pub fn set_table(&self, table: QuotaTable) {
        if *self.table.read() == table {
            return;
        }
        let mut t = self.table.write();
        if *t == table {
            return;
        }
        self.active.store(!table.is_empty(), Ordering::Relaxed);
        *t = table;
        drop(t);
        // Quotas changed: the next record resolves each sensor's quota again.
        self.sensors.lock().clear();
    }

    /// Applies one entity's changes and, standalone, saves the table (on disk when this
    /// returns).
    pub fn alter(
        &self,
        entity: &QuotaEntity,
        ops: &[(QuotaKey, Option<QuotaValue>)],
    ) -> Result<(), BrokerError> {
        let mut t = self.table.read().clone();
        t.apply(entity, ops);
        if let Some(file) = &self.file {
            let text = serde_json::to_vec_pretty(&t).map_err(|e| BrokerError::CorruptMetadata {
                path: file.clone(),
                reason: format!("client quotas: {e}"),
            })?;
            write_atomically(file, &text)?;
        }
        self.set_table(t);
        Ok(())
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The sensor and quota that apply to `client_id` (of `user`) for `kind`; `None` when no
    /// quota limits it (or none is configured at all, the hot path's early exit).
    fn resolve(&self, kind: QuotaKind, user: &str, client_id: &str) -> Option<(SensorKey, f64)> {
        if !self.active.load(Ordering::Relaxed) {
            return None;
        }
        let t = self.table.read();
        t.resolve(user, client_id, kind.key())
            .map(|(entity, quota)| (sensor_key(kind, entity, user, client_id), quota))
    }

    /// Records `amount` of `kind` for `client_id` (of `user`) and returns how long its
    /// connection must be throttled, in milliseconds (0 when within quota or unlimited).
    pub fn record(&self, kind: QuotaKind, user: &str, client_id: &str, amount: f64) -> u64 {
        let Some((key, quota)) = self.resolve(kind, user, client_id) else {
            return 0;
        };
        let now = self.now_ms();
        let mut sensors = self.sensors.lock();
        if sensors.len() >= MAX_SENSORS && !sensors.contains_key(&key) {
            let cutoff = Instant::now().checked_sub(SENSOR_IDLE);
            sensors.retain(|_, s| cutoff.is_none_or(|c| s.last_used > c));
            if sensors.len() >= MAX_SENSORS {
                // Every sensor is in use: this client goes unmeasured (and unthrottled) until
                // one expires, rather than memory growing with client-chosen ids.
                return 0;
            }
        }
        let s = sensors.entry(key).or_insert_with(|| Sensor {
            rate: Rate::new(self.rates, now),
            last_used: Instant::now(),
            total: 0.0,
            throttle_ms_total: 0,
            throttled: 0,
            quota,
        });
        s.quota = quota;
        s.last_used = Instant::now();
        s.total += amount;
        s.rate.record(amount, now);
        let throttle = s.rate.throttle_ms(quota, now);
        if throttle > 0 {
            s.throttle_ms_total += throttle;
            s.throttled += 1;
        }
        throttle
    }

    /// How long `client_id` (of `user`) must still wait before its `kind` usage is back
    /// within quota, without recording anything (0 when within quota or unlimited).
    pub fn throttle_of(&self, kind: QuotaKind, user: &str, client_id: &str) -> u64 {
        let Some((key, quota)) = self.resolve(kind, user, client_id) else {
            return 0;
        };
        let now = self.now_ms();
        self.sensors
            .lock()
            .get(&key)
            .map_or(0, |s| s.rate.throttle_ms(quota, now))
    }

    /// Every sensor's numbers, for /metrics.
    pub fn stats(&self) -> Vec<SensorStats> {
        let now = self.now_ms();
        let mut out: Vec<SensorStats> = self
            .sensors
            .lock()
            .iter()
            .map(|(k, s)| SensorStats {
                key: k.clone(),
                quota: s.quota,
                rate: s.rate.measure(now).0,
                total: s.total,
                throttle_ms_total: s.throttle_ms_total,
                throttled: s.throttled,
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }
}

fn sensor_key(kind: QuotaKind, entity: &QuotaEntity, user: &str, client_id: &str) -> SensorKey {
    SensorKey {
        kind,
        user: entity.user.as_ref().map(|_| user.to_owned()),
        client_id: entity.client_id.as_ref().map(|_| client_id.to_owned()),
    }
}

/// When a throttled connection may be read again: set by a handler, waited for by the
/// connection before it handles the next request.
#[derive(Debug, Default)]
pub struct Mute {
    /// Milliseconds since `base` until which the connection reads nothing; 0 for none.
    until_ms: AtomicU64,
    base: OnceInstant,
}

#[derive(Debug)]
struct OnceInstant(Instant);

impl Default for OnceInstant {
    fn default() -> Self {
        Self(Instant::now())
    }
}

impl Mute {
    /// A fresh, unmuted connection.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Mutes for `ms` from now (never shortening a longer mute).
    pub fn mute_for(&self, ms: u64) {
        if ms == 0 {
            return;
        }
        let until = self.base.0.elapsed().as_millis() as u64 + ms;
        self.until_ms.fetch_max(until, Ordering::Relaxed);
    }

    /// The instant the mute ends, if one is in force.
    pub fn until(&self) -> Option<Instant> {
        let until = self.until_ms.load(Ordering::Relaxed);
        let at = self.base.0 + Duration::from_millis(until);
        (until > 0 && at > Instant::now()).then_some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_quotas::EntityName;

    fn client_default() -> QuotaEntity {
        QuotaEntity {
            user: None,
            client_id: Some(EntityName::Default),
            ip: None,
        }
    }

    #[test]
    fn without_quotas_nothing_is_throttled_or_tracked() {
        let q = ClientQuotas::with_table(QuotaTable::default(), None);
        assert_eq!(q.record(QuotaKind::Produce, ANONYMOUS, "c", 1e12), 0);
        assert!(q.stats().is_empty());
    }

    #[test]
    fn a_default_client_quota_is_measured_per_client_id() {
        let q = ClientQuotas::with_table(QuotaTable::default(), None);
        q.alter(
            &client_default(),
            &[(QuotaKey::ProducerByteRate, Some(QuotaValue(1_000.0)))],
        )
        .unwrap();
        assert!(q.record(QuotaKind::Produce, ANONYMOUS, "fast", 1e9) > 0);
        // Another client id has its own budget; fetches have no quota.
        assert_eq!(q.record(QuotaKind::Produce, ANONYMOUS, "slow", 10.0), 0);
        assert_eq!(q.record(QuotaKind::Fetch, ANONYMOUS, "fast", 1e9), 0);
        let stats = q.stats();
        assert_eq!(stats.len(), 2);
        assert!(stats.iter().all(|s| s.key.user.is_none()));
        assert_eq!(stats.iter().filter(|s| s.throttled > 0).count(), 1);
    }

    #[test]
    fn quotas_persist_in_the_data_dir() {
        let dir = tempfile::tempdir().unwrap();
        let q = ClientQuotas::open(dir.path()).unwrap();
        q.alter(
            &client_default(),
            &[(QuotaKey::ConsumerByteRate, Some(QuotaValue(2048.0)))],
        )
        .unwrap();
        let again = ClientQuotas::open(dir.path()).unwrap();
        assert_eq!(again.table(), q.table());
        assert!(!again.table().is_empty());
    }

    #[test]
    fn a_mute_ends_when_its_time_has_passed() {
        let m = Mute::new();
        assert!(m.until().is_none());
        m.mute_for(50);
        assert!(m.until().is_some());
        std::thread::sleep(Duration::from_millis(60));
        assert!(m.until().is_none());
    }
}
