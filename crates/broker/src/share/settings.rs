//! Share group settings: Kafka's `group.share.*` configs.
//!
//! The broker-wide ones come from the `--group-share-*` flags. Two defaults for groups that
//! set no config of their own can be changed through the environment, for reading what was
//! produced before a group existed and for transactional data: `SPATE_SHARE_AUTO_OFFSET_RESET`
//! (`latest`, `earliest`) and `SPATE_SHARE_ISOLATION_LEVEL` (`read_uncommitted`,
//! `read_committed`).

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
    /// `share.isolation.level=read_committed`: records are handed out only up to the last
    /// stable offset, and those of aborted transactions are archived, never delivered (Kafka's
    /// default is read_uncommitted).
    pub read_committed: bool,
}

impl Default for ShareSettings {
    fn default() -> Self {
        Self {
            group: ShareGroupConfig::default(),
            partition: SharePartitionConfig::default(),
            lock_duration_ms: spate_share::DEFAULT_LOCK_DURATION_MS,
            auto_offset_reset: AutoOffsetReset::Latest,
            read_committed: false,
        }
    }
}

impl ShareSettings {
    /// Kafka's defaults, with the group defaults the environment sets (unparsable values are
    /// ignored with a warning).
    pub fn from_env() -> Self {
        let mut s = Self::default();
        if let Ok(v) = std::env::var("SPATE_SHARE_AUTO_OFFSET_RESET") {
            match AutoOffsetReset::parse(&v) {
                Some(r) => s.auto_offset_reset = r,
                None => tracing::warn!(value = %v, "ignoring SPATE_SHARE_AUTO_OFFSET_RESET"),
            }
        }
        if let Ok(v) = std::env::var("SPATE_SHARE_ISOLATION_LEVEL") {
            match v.trim().to_ascii_lowercase().as_str() {
                "read_committed" => s.read_committed = true,
                "read_uncommitted" => s.read_committed = false,
                _ => tracing::warn!(value = %v, "ignoring SPATE_SHARE_ISOLATION_LEVEL"),
            }
        }
        s
    }
}
