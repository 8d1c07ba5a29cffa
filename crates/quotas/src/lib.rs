//! Client quotas as Kafka defines them (KIP-13, KIP-55, KIP-124, KIP-599): who a quota is for
//! (`entity`), what it limits (`QuotaKey`), the table of configured quotas with Kafka's
//! precedence (`QuotaTable`), and the sampled rate that turns usage into a throttle time
//! (`Rate`). Pure: time comes in as milliseconds, nothing here does I/O.

mod entity;
mod rate;
mod table;

pub use entity::{EntityName, EntityType, QuotaEntity};
pub use rate::{Rate, RateConfig};
pub use table::{ComponentFilter, MatchType, QuotaKey, QuotaTable, QuotaValue};

use thiserror::Error;

/// A quota request that Kafka refuses with INVALID_REQUEST; the text says what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuotaError {
    /// The entity or filter names no types, repeats one, or names an unknown one.
    #[error("{0}")]
    InvalidEntity(String),
    /// The key is unknown or does not apply to the entity's types.
    #[error("{0}")]
    InvalidKey(String),
    /// The value is negative, zero, not finite, or not whole for a byte rate.
    #[error("{0}")]
    InvalidValue(String),
}
