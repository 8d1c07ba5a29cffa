use std::path::PathBuf;
use std::time::Duration;

use spate_log::FsyncPolicy;

use crate::groups::GroupSettings;

/// Everything the broker needs to know about how it was started.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// This broker's id in Metadata responses.
    pub node_id: i32,
    /// Host clients are told to connect to.
    pub advertised_host: String,
    /// Port clients are told to connect to.
    pub advertised_port: i32,
    /// Root of all stored data.
    pub data_dir: PathBuf,
    /// When data reaches disk and whether acks wait for it.
    pub fsync: FsyncPolicy,
    /// Partitions for auto-created topics and CreateTopics with -1.
    pub default_partitions: i32,
    /// Whether Metadata requests may create unknown topics.
    pub auto_create_topics: bool,
    /// How often retention runs.
    pub retention_check_interval: Duration,
    /// Largest request frame accepted.
    pub max_frame_bytes: usize,
    /// Consumer group timeouts and offset retention.
    pub groups: GroupSettings,
}

impl BrokerConfig {
    /// Defaults for a broker storing in `data_dir` and reachable at `host:port`.
    pub fn new(data_dir: PathBuf, host: impl Into<String>, port: i32) -> Self {
        Self {
            node_id: 0,
            advertised_host: host.into(),
            advertised_port: port,
            data_dir,
            fsync: FsyncPolicy::Never,
            default_partitions: 1,
            auto_create_topics: true,
            retention_check_interval: Duration::from_secs(30),
            max_frame_bytes: spate_protocol::frame::DEFAULT_MAX_FRAME_BYTES,
            groups: GroupSettings::default(),
        }
    }
}
