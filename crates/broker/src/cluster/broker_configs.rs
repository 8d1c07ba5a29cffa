//! Dynamic broker configs of a cluster (Kafka's `kafka-configs --entity-type brokers`): the
//! settings operations change while the cluster runs, kept in the metadata image so every
//! node sees the same values.

use std::collections::BTreeMap;

use spate_cluster::metadata::{BrokerId, MetadataImage};

use crate::topic_config::ConfigType;

/// One dynamic broker config.
pub struct DynamicDef {
    /// The key, as Kafka names it.
    pub name: &'static str,
    /// Value when nothing is set.
    pub default: &'static str,
    /// Type reported to clients.
    pub kind: ConfigType,
    /// One-line documentation.
    pub doc: &'static str,
}

/// Kafka's "no limit" for replication throttles.
const UNLIMITED: &str = "9223372036854775807";

/// Every dynamic broker config spate knows, in name order.
pub const DYNAMIC: &[DynamicDef] = &[
    DynamicDef {
        name: "auto.leader.rebalance.enable",
        default: "true",
        kind: ConfigType::String,
        doc: "Whether the controller moves leaderships back to preferred replicas when leadership is unbalanced (checked every leader.imbalance.check.interval.seconds).",
    },
    DynamicDef {
        name: crate::dynamic_configs::DISK_MIN_FREE_BYTES,
        default: "1073741824",
        kind: ConfigType::Long,
        doc: crate::dynamic_configs::DISK_MIN_FREE_BYTES_DOC,
    },
    DynamicDef {
        name: crate::dynamic_configs::DISK_MIN_FREE_PERCENT,
        default: "5",
        kind: ConfigType::Int,
        doc: crate::dynamic_configs::DISK_MIN_FREE_PERCENT_DOC,
    },
    DynamicDef {
        name: "follower.replication.throttled.rate",
        default: UNLIMITED,
        kind: ConfigType::Long,
        doc: "Bytes per second this broker fetches, as a follower, for replicas listed in a topic's follower.replication.throttled.replicas.",
    },
    DynamicDef {
        name: "leader.imbalance.check.interval.seconds",
        default: "300",
        kind: ConfigType::Long,
        doc: "How often the controller checks whether leadership should move back to preferred replicas.",
    },
    DynamicDef {
        name: "leader.imbalance.per.broker.percentage",
        default: "10",
        kind: ConfigType::Int,
        doc: "Share of a broker's preferred leaderships held elsewhere above which they are moved back.",
    },
    DynamicDef {
        name: "leader.replication.throttled.rate",
        default: UNLIMITED,
        kind: ConfigType::Long,
        doc: "Bytes per second this broker serves, as a leader, to followers of replicas listed in a topic's leader.replication.throttled.replicas.",
    },
    DynamicDef {
        name: "replica.alter.log.dirs.io.max.bytes.per.second",
        default: UNLIMITED,
        kind: ConfigType::Long,
        doc: "Accepted for Kafka's tools (kafka-reassign-partitions clears it); a spate broker has one log dir, so nothing moves between dirs and it has no effect.",
    },
];

/// Looks up a dynamic broker config.
pub fn dynamic_def(name: &str) -> Option<&'static DynamicDef> {
    DYNAMIC.iter().find(|d| d.name == name)
}

/// Checks a value for a dynamic broker config key; the error names what is wrong.
pub fn validate(key: &str, value: &str) -> Result<(), String> {
    let Some(def) = dynamic_def(key) else {
        let known: Vec<&str> = DYNAMIC.iter().map(|d| d.name).collect();
        return Err(format!(
            "'{key}' is not a broker config that can change while the cluster runs (those are: {})",
            known.join(", ")
        ));
    };
    let v = value.trim();
    if crate::dynamic_configs::is_dynamic(def.name) {
        return crate::dynamic_configs::validate(def.name, v);
    }
    match (def.name, def.kind) {
        ("auto.leader.rebalance.enable", _) => match v {
            "true" | "false" => Ok(()),
            _ => Err(format!("{key} must be true or false, not '{v}'")),
        },
        ("leader.imbalance.per.broker.percentage", _) => match v.parse::<u32>() {
            Ok(n) if n <= 100 => Ok(()),
            _ => Err(format!(
                "{key} must be a percentage from 0 to 100, not '{v}'"
            )),
        },
        ("leader.imbalance.check.interval.seconds", _) => match v.parse::<u64>() {
            Ok(n) if n >= 1 => Ok(()),
            _ => Err(format!(
                "{key} must be a whole number of seconds, at least 1, not '{v}'"
            )),
        },
        _ => match v.parse::<i64>() {
            Ok(n) if n >= 0 => Ok(()),
            _ => Err(format!(
                "{key} must be a non-negative number of bytes per second, not '{v}'"
            )),
        },
    }
}

/// The effective values for `broker` (or the cluster default with `None`), each with whether
/// it was set for the broker itself, set as the cluster default, or is the built-in default.
pub fn effective(
    image: &MetadataImage,
    broker: Option<BrokerId>,
) -> Vec<(&'static DynamicDef, String, Source)> {
    let own: BTreeMap<String, String> = broker
        .and_then(|b| image.broker_configs().get(&b.to_string()))
        .cloned()
        .unwrap_or_default();
    let cluster = image.broker_configs().get("").cloned().unwrap_or_default();
    DYNAMIC
        .iter()
        .map(|d| match (own.get(d.name), cluster.get(d.name)) {
            (Some(v), _) => (d, v.clone(), Source::Broker),
            (None, Some(v)) => (d, v.clone(), Source::ClusterDefault),
            (None, None) => (d, d.default.to_owned(), Source::BuiltIn),
        })
        .collect()
}

/// Where an effective value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Set for this broker (Kafka's DYNAMIC_BROKER_CONFIG).
    Broker,
    /// Set as the cluster-wide default (DYNAMIC_DEFAULT_BROKER_CONFIG).
    ClusterDefault,
    /// Nothing set (DEFAULT_CONFIG).
    BuiltIn,
}

impl Source {
    /// Kafka's ConfigSource code.
    pub fn code(self) -> i8 {
        match self {
            Source::Broker => 2,
            Source::ClusterDefault => 3,
            Source::BuiltIn => 5,
        }
    }
}

/// The replication throttle rate (bytes per second) `key` sets for `broker`; `None` when
/// unlimited.
pub fn throttle_rate(image: &MetadataImage, broker: BrokerId, key: &str) -> Option<u64> {
    image
        .broker_config(Some(broker), key)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&r| r < i64::MAX as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_and_bad_values_are_refused_with_the_reason() {
        assert!(validate("leader.replication.throttled.rate", "1000000").is_ok());
        assert!(validate("auto.leader.rebalance.enable", "false").is_ok());
        let unknown = validate("log.dirs", "/tmp").unwrap_err();
        assert!(
            unknown.contains("auto.leader.rebalance.enable"),
            "{unknown}"
        );
        assert!(validate("follower.replication.throttled.rate", "-5").is_err());
        assert!(validate("auto.leader.rebalance.enable", "yes").is_err());
        assert!(validate("leader.imbalance.per.broker.percentage", "101").is_err());
        assert!(validate("leader.imbalance.check.interval.seconds", "0").is_err());
    }
}
