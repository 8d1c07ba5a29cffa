//! The broker: Kafka API handlers over the partition logs.
//!
//! Requests come in as frames from the server crate; [`Broker::handle`] decodes them, runs the
//! handler for their API family (one module each under [`handlers`]) and returns the encoded
//! response, or a future for it when the answer must wait (fsync, long-poll fetch).

mod budget;
pub mod cluster;
mod config;
pub mod disk;
mod dispatch;
pub mod dynamic_configs;
mod error;
mod fetch_sessions;
mod groups;
pub mod handlers;
pub mod partition;
mod producer_ids;
mod producer_state;
pub mod quotas;
mod registry;
pub mod replica;
pub mod search_config;
pub mod security;
mod share;
mod throttle;
pub mod time;
mod topic_config;
pub mod topology;
pub mod transactions;

pub use budget::{MemoryBudget, Permit};
pub use config::{BrokerConfig, ProduceProfile, DEFAULT_FETCH_MAX_BYTES};
pub use dispatch::{Broker, CleanerMetrics, HeldFrame, Reply, RequestContext, RequestError};
pub use error::BrokerError;
pub use groups::{is_internal, refuse_internal, GroupService, GroupSettings};
pub use partition::Partition;
pub use producer_state::ProducerLimits;
pub use registry::{validate_topic_name, Topic, TopicError, TopicMetrics, TopicRegistry};
pub use share::{ShareGroupStats, ShareSettings};
pub use throttle::TopicBackPressure;
pub use topic_config::{set_broker_defaults, ConfigDef, TopicConfig, TopicConfigError};

/// Every topic config spate knows, with defaults and documentation.
pub fn topic_config_defs() -> &'static [ConfigDef] {
    topic_config::DEFS
}
