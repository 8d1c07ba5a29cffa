use std::time::Duration;

/// When appended bytes are forced to disk, and whether acknowledgements wait for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Acknowledge only after fsync; concurrent appends share one fsync.
    Always,
    /// Acknowledge only after fsync, waiting up to `window` to gather more appends per fsync
    /// (the WAL profiles low/medium/high/ultra).
    GroupCommit {
        /// How long the first waiting append may wait for company.
        window: Duration,
    },
    /// Acknowledge after the write; fsync in the background every `every`.
    Interval {
        /// Background fsync period.
        every: Duration,
    },
    /// Acknowledge after the write; the OS decides when pages reach disk.
    Never,
}

impl FsyncPolicy {
    /// True when acknowledgements wait for the data to be on disk.
    pub fn acks_wait_for_fsync(&self) -> bool {
        matches!(self, Self::Always | Self::GroupCommit { .. })
    }
}

/// Per-log settings, taken from topic configs.
#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// Roll to a new segment once the active one holds this many bytes.
    pub segment_bytes: u64,
    /// Roll to a new segment once the active one is this old (ms), if non-empty.
    pub segment_ms: i64,
    /// Delete segments whose newest record is older than this (ms); -1 keeps forever.
    pub retention_ms: i64,
    /// Delete oldest segments while the log exceeds this many bytes; -1 means no limit.
    pub retention_bytes: i64,
    /// Bytes between sparse index entries.
    pub index_interval_bytes: u32,
    /// `cleanup.policy` includes delete: retention by time and size applies.
    pub delete: bool,
    /// `cleanup.policy` includes compact: the cleaner keeps the latest record per key.
    pub compact: Option<CompactConfig>,
}

/// A compacted topic's cleaner settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompactConfig {
    /// When the log is due and how far a clean may go.
    pub policy: crate::compaction::CleanPolicy,
    /// `delete.retention.ms`: tombstones and finished transaction markers stay this long.
    pub delete_retention_ms: i64,
    /// `compression.type`: the codec of the batches the cleaner rewrites (`None`: each keeps
    /// its own).
    pub codec: Option<spate_protocol::records::Compression>,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 1 << 30,
            segment_ms: 7 * 24 * 3600 * 1000,
            retention_ms: 7 * 24 * 3600 * 1000,
            retention_bytes: -1,
            index_interval_bytes: 4096,
            delete: true,
            compact: None,
        }
    }
}
