//! Share group settings: Kafka's `group.share.*` defaults.
//!
//! They are not broker flags yet. Two can be changed through the environment, for tests that
//! cannot wait 30 s for a lock to expire and for reading what was produced before a group
//! existed: `SPATE_SHARE_RECORD_LOCK_DURATION_MS` (Kafka's `group.share.record.lock.duration.ms`)
//! and `SPATE_SHARE_AUTO_OFFSET_RESET` (the `share.auto.offset.reset` of every group:
//! `latest`, `earliest`).

use spate_share::{AutoOffsetReset, ShareGroupConfig, SharePartitionConfig};

/// Share group and share-partition settings.
#[derive(Debug, Clone, Copy)]
pub struct ShareSettings {
    /// Membership: session timeout 45 s, heartbeat interval 5 s.
    pub group: ShareGroupConfig,
    /// In-flight records: at most 2000 per share-partition, delivered at most 5 times.
    pub partition: SharePartitionConfig,
    /// How long a member holds acquired records (30 s).
    pub lock_duration_ms: i64,
    /// Where a share-partition without state starts (latest).
    pub auto_offset_reset: AutoOffsetReset,
}

impl Default for ShareSettings {
    fn default() -> Self {
        Self {
            group: ShareGroupConfig::default(),
            partition: SharePartitionConfig::default(),
            lock_duration_ms: spate_share::DEFAULT_LOCK_DURATION_MS,
            auto_offset_reset: AutoOffsetReset::Latest,
        }
    }
}

impl ShareSettings {
    /// Kafka's defaults, with the overrides the environment sets (unparsable values are
    /// ignored with a warning).
    pub fn from_env() -> Self {
        let mut s = Self::default();
        if let Ok(v) = std::env::var("SPATE_SHARE_RECORD_LOCK_DURATION_MS") {
            match v.parse::<i64>() {
                Ok(ms) if ms > 0 => s.lock_duration_ms = ms,
                _ => tracing::warn!(value = %v, "ignoring SPATE_SHARE_RECORD_LOCK_DURATION_MS"),
            }
        }
        if let Ok(v) = std::env::var("SPATE_SHARE_AUTO_OFFSET_RESET") {
            match AutoOffsetReset::parse(&v) {
                Some(r) => s.auto_offset_reset = r,
                None => tracing::warn!(value = %v, "ignoring SPATE_SHARE_AUTO_OFFSET_RESET"),
            }
        }
        s
    }
}
