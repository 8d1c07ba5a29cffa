//! Per-topic configuration: the Kafka topic configs spate honours, their defaults, validation
//! and how they map onto the log.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use spate_log::compaction::CleanPolicy;
use spate_log::{CompactConfig, LogConfig};
use spate_protocol::records::Compression;
use thiserror::Error;

use crate::search_config::{self, SearchSettings};

/// Kafka's config type codes (DescribeConfigs v3+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    /// A free string from a fixed set.
    String = 2,
    /// 32-bit integer.
    Int = 3,
    /// 64-bit integer.
    Long = 5,
    /// true or false.
    Boolean = 1,
    /// Comma-separated list.
    List = 7,
    /// A floating-point number.
    Double = 6,
}

/// One supported topic config key.
pub struct ConfigDef {
    /// The key.
    pub name: &'static str,
    /// Value when not set on the topic.
    pub default: &'static str,
    /// Type reported to clients.
    pub kind: ConfigType,
    /// One-line documentation.
    pub doc: &'static str,
    validate: fn(&str) -> Result<(), String>,
}

fn long_at_least(min: i64) -> impl Fn(&str) -> Result<(), String> {
    move |v| match v.trim().parse::<i64>() {
        Ok(n) if n >= min => Ok(()),
        Ok(n) => Err(format!("{n} is below the minimum {min}")),
        Err(_) => Err(format!("'{v}' is not an integer")),
    }
}

fn int_at_least(min: i64) -> impl Fn(&str) -> Result<(), String> {
    move |v| match v.trim().parse::<i32>() {
        Ok(n) if n as i64 >= min => Ok(()),
        Ok(n) => Err(format!("{n} is below the minimum {min}")),
        Err(_) => Err(format!("'{v}' is not a 32-bit integer")),
    }
}

/// `*`, empty, or a comma-separated list of `partition:broker`.
fn validate_throttled_replicas(v: &str) -> Result<(), String> {
    let v = v.trim();
    if v.is_empty() || v == "*" {
        return Ok(());
    }
    for entry in v.split(',') {
        let ok = entry.trim().split_once(':').is_some_and(|(p, b)| {
            p.trim().parse::<u32>().is_ok() && b.trim().parse::<u32>().is_ok()
        });
        if !ok {
            return Err(format!(
                "'{}' is not partition:broker (for example 0:101), and the list is not *",
                entry.trim()
            ));
        }
    }
    Ok(())
}

/// Whether the throttled-replicas list `value` names `partition` on `broker`.
pub(crate) fn throttles(value: &str, partition: i32, broker: i32) -> bool {
    let value = value.trim();
    value == "*"
        || value.split(',').any(|e| {
            e.trim().split_once(':').is_some_and(|(p, b)| {
                p.trim().parse() == Ok(partition) && b.trim().parse() == Ok(broker)
            })
        })
}

/// Every topic config spate knows, in name order.
pub const DEFS: &[ConfigDef] = &[
    ConfigDef {
        name: "cleanup.policy",
        default: "delete",
        kind: ConfigType::List,
        doc: "How old records are discarded: delete (whole segments, by retention.ms / retention.bytes), compact (the cleaner keeps the latest record per key), or compact,delete (both).",
        validate: |v| parse_cleanup_policy(v).map(|_| ()),
    },
    ConfigDef {
        name: "compression.type",
        default: "producer",
        kind: ConfigType::String,
        doc: "The codec batches are stored in: producer (as the producer sent them), uncompressed, gzip, snappy, lz4 or zstd; a batch in another codec is recompressed on append, and the cleaner writes this codec.",
        validate: |v| parse_compression(v).map(|_| ()),
    },
    ConfigDef {
        name: "delete.retention.ms",
        default: "86400000",
        kind: ConfigType::Long,
        doc: "How long a compacted topic keeps a tombstone (and a finished transaction's marker) after compaction could remove it, so consumers that read the key before see the delete.",
        validate: |v| long_at_least(0)(v),
    },
    ConfigDef {
        name: "follower.replication.throttled.replicas",
        default: "",
        kind: ConfigType::List,
        doc: "Replicas (partition:broker, or *) whose fetching from the leader is limited to the follower broker's follower.replication.throttled.rate; set by kafka-reassign-partitions --throttle.",
        validate: validate_throttled_replicas,
    },
    ConfigDef {
        name: "leader.replication.throttled.replicas",
        default: "",
        kind: ConfigType::List,
        doc: "Replicas (partition:broker, or *) whose leaders limit what they serve to followers to the leader broker's leader.replication.throttled.rate; set by kafka-reassign-partitions --throttle.",
        validate: validate_throttled_replicas,
    },
    ConfigDef {
        name: "max.message.bytes",
        default: "1048588",
        kind: ConfigType::Int,
        doc: "Largest record batch accepted, in bytes.",
        validate: |v| int_at_least(0)(v),
    },
    ConfigDef {
        name: "message.timestamp.type",
        default: "CreateTime",
        kind: ConfigType::String,
        doc: "CreateTime keeps the producer's timestamps; LogAppendTime stamps batches with the broker's clock.",
        validate: |v| match v.trim() {
            "CreateTime" | "LogAppendTime" => Ok(()),
            other => Err(format!("'{other}' is not CreateTime or LogAppendTime")),
        },
    },
    ConfigDef {
        name: "max.compaction.lag.ms",
        default: "9223372036854775807",
        kind: ConfigType::Long,
        doc: "Longest a record stays uncompacted: a log whose oldest dirty segment is older is cleaned whatever its dirty ratio.",
        validate: |v| long_at_least(1)(v),
    },
    ConfigDef {
        name: "min.cleanable.dirty.ratio",
        default: "0.5",
        kind: ConfigType::Double,
        doc: "Share of a compacted log not yet cleaned at which the cleaner cleans it.",
        validate: |v| match v.trim().parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(()),
            Ok(r) => Err(format!("{r} is not between 0 and 1")),
            Err(_) => Err(format!("'{v}' is not a number")),
        },
    },
    ConfigDef {
        name: "min.compaction.lag.ms",
        default: "0",
        kind: ConfigType::Long,
        doc: "Shortest time a record stays uncompacted.",
        validate: |v| long_at_least(0)(v),
    },
    ConfigDef {
        name: "min.insync.replicas",
        default: "1",
        kind: ConfigType::Int,
        doc: "Replicas that must hold a write before acks=all succeeds. Accepted and stored on a standalone broker, where it has no effect (the leader is the only replica); it takes effect in cluster mode.",
        validate: |v| int_at_least(1)(v),
    },
    ConfigDef {
        name: "retention.bytes",
        default: "-1",
        kind: ConfigType::Long,
        doc: "Delete the oldest segments while a partition is larger than this; -1 for no limit.",
        validate: |v| long_at_least(-1)(v),
    },
    ConfigDef {
        name: "retention.ms",
        default: "604800000",
        kind: ConfigType::Long,
        doc: "Delete segments whose newest record is older than this; -1 keeps data forever.",
        validate: |v| long_at_least(-1)(v),
    },
    ConfigDef {
        name: "search.enabled",
        default: "false",
        kind: ConfigType::Boolean,
        doc: "Index the topic's records for full-text search over HTTP (/{topic}/_search). Turning it on later indexes the existing log.",
        validate: |v| search_config::parse_bool(v).map(|_| ()),
    },
    ConfigDef {
        name: "search.fields",
        default: "",
        kind: ConfigType::List,
        doc: "JSON fields to index by path and type: path:type,... with type text, keyword, number or date (e.g. user.name:keyword,amount:number).",
        validate: |v| search_config::parse_fields(v).map(|_| ()),
    },
    ConfigDef {
        name: "search.max.fields",
        default: "1000",
        kind: ConfigType::Int,
        doc: "Most distinct JSON fields a searchable topic's partitions map on their own (dynamic mapping, as Elasticsearch's index.mapping.total_fields.limit); fields past it are not indexed and counted in spate_search_unmapped_fields_total.",
        validate: |v| int_at_least(1)(v),
    },
    ConfigDef {
        name: "search.max.lag.ms",
        default: "-1",
        kind: ConfigType::Long,
        doc: "Back-pressure: while the oldest record of a partition not yet searchable is older than this, produce requests to the topic are answered with throttle_time_ms (and the connection paused for it), so producers slow to what indexing keeps up with; -1 never slows them.",
        validate: |v| long_at_least(-1)(v),
    },
    ConfigDef {
        name: "search.store.value",
        default: "false",
        kind: ConfigType::Boolean,
        doc: "Keep key, value and headers in the search index; by default _source is read back from the log, so the index stays small.",
        validate: |v| search_config::parse_bool(v).map(|_| ()),
    },
    ConfigDef {
        name: "search.time.field",
        default: "@timestamp",
        kind: ConfigType::String,
        doc: "The document field (dotted path; RFC 3339 or epoch milliseconds) that is a record's time for search: range queries on it (Grafana's time filter) skip partitions whose records all lie outside the range; records without it use their Kafka timestamp.",
        validate: |v| {
            let v = v.trim();
            if v.is_empty() || v.len() > 255 || v.chars().any(|c| c.is_whitespace() || c == ',') {
                Err(format!("'{v}' is not a field path"))
            } else {
                Ok(())
            }
        },
    },
    ConfigDef {
        name: "search.value.format",
        default: "auto",
        kind: ConfigType::String,
        doc: "How values are read for search: text, json (a value that does not parse is indexed as text), auto (JSON objects and arrays as JSON, values in the schema registry's wire format with a known schema id decoded with their schema, the rest as text) or schema (the schema registry's wire format decoded with the registered Avro, Protobuf or JSON schema; a value that cannot be is indexed as text).",
        validate: |v| search_config::ValueFormat::parse(v).map(|_| ()),
    },
    ConfigDef {
        name: "segment.bytes",
        default: "1073741824",
        kind: ConfigType::Int,
        doc: "Size at which a partition starts a new segment file.",
        validate: |v| int_at_least(14)(v),
    },
    ConfigDef {
        name: "segment.ms",
        default: "604800000",
        kind: ConfigType::Long,
        doc: "Age at which a partition starts a new segment file.",
        validate: |v| long_at_least(1)(v),
    },
];

/// A `cleanup.policy` value: (delete, compact).
pub fn parse_cleanup_policy(v: &str) -> Result<(bool, bool), String> {
    let (mut delete, mut compact) = (false, false);
    for p in v.split(',').map(str::trim) {
        match p {
            "delete" => delete = true,
            "compact" => compact = true,
            other => {
                return Err(format!(
                    "'{other}' is not a cleanup policy (delete, compact, or compact,delete)"
                ))
            }
        }
    }
    Ok((delete, compact))
}

/// Looks up a config definition by key.
pub fn def(name: &str) -> Option<&'static ConfigDef> {
    DEFS.iter().find(|d| d.name == name)
}

/// Topic config defaults the broker was started with (Kafka's `log.cleanup.policy` and the
/// like): they replace the built-in default of every topic that does not set the key.
static BROKER_DEFAULTS: std::sync::OnceLock<BTreeMap<String, String>> = std::sync::OnceLock::new();

/// Sets the broker's defaults for topic configs, once, at start; each is validated as a
/// topic value would be.
pub fn set_broker_defaults(defaults: BTreeMap<String, String>) -> Result<(), TopicConfigError> {
    let mut probe = TopicConfig::default();
    for (k, v) in &defaults {
        probe.set(k, v)?;
    }
    // A second call (tests starting brokers in one process) keeps the first defaults.
    let _ = BROKER_DEFAULTS.set(defaults);
    Ok(())
}

/// The value a topic without an override of `key` has: the broker's default, else the
/// built-in one.
pub fn broker_default(key: &str) -> Option<&'static str> {
    BROKER_DEFAULTS
        .get()
        .and_then(|m| m.get(key))
        .map(String::as_str)
        .or_else(|| def(key).map(|d| d.default))
}

/// A rejected config.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TopicConfigError {
    /// The key is not a topic config spate knows.
    #[error("unknown topic config '{0}'")]
    Unknown(String),
    /// The value does not fit the key.
    #[error("invalid value for {key}: {reason}")]
    Invalid {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// A config with no value where one is needed.
    #[error("no value given for {0}")]
    Missing(String),
}

/// A topic's explicitly set configs; everything else takes its default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicConfig {
    overrides: BTreeMap<String, String>,
}

impl TopicConfig {
    /// Validates and sets one key.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), TopicConfigError> {
        let d = def(key).ok_or_else(|| TopicConfigError::Unknown(key.to_string()))?;
        (d.validate)(value).map_err(|reason| TopicConfigError::Invalid {
            key: key.to_string(),
            reason,
        })?;
        self.overrides
            .insert(key.to_string(), value.trim().to_string());
        Ok(())
    }

    /// The keys set on the topic, with their values.
    pub fn overrides(&self) -> &BTreeMap<String, String> {
        &self.overrides
    }

    /// Removes an override, returning the key to its default.
    pub fn unset(&mut self, key: &str) -> Result<(), TopicConfigError> {
        def(key).ok_or_else(|| TopicConfigError::Unknown(key.to_string()))?;
        self.overrides.remove(key);
        Ok(())
    }

    /// Builds a config from key/value pairs, failing on the first bad one.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    ) -> Result<Self, TopicConfigError> {
        let mut c = Self::default();
        for (k, v) in pairs {
            let v = v.ok_or_else(|| TopicConfigError::Missing(k.to_string()))?;
            c.set(k, v)?;
        }
        Ok(c)
    }

    /// The effective value of a key and whether it was set on the topic.
    pub fn get(&self, key: &str) -> Option<(&str, bool)> {
        if let Some(v) = self.overrides.get(key) {
            return Some((v, true));
        }
        broker_default(key).map(|d| (d, false))
    }

    fn num(&self, key: &str) -> i64 {
        self.get(key)
            .and_then(|(v, _)| v.parse().ok())
            .or_else(|| broker_default(key).and_then(|d| d.parse().ok()))
            .unwrap_or(-1)
    }

    /// Largest batch accepted.
    pub fn max_message_bytes(&self) -> usize {
        self.num("max.message.bytes").max(0) as usize
    }

    /// Replicas that must be in sync for acks=all (at least 1).
    pub fn min_insync_replicas(&self) -> usize {
        self.num("min.insync.replicas").max(1) as usize
    }

    /// Whether batches get the broker's timestamp.
    pub fn log_append_time(&self) -> bool {
        self.get("message.timestamp.type").map(|(v, _)| v) == Some("LogAppendTime")
    }

    /// The `search.*` settings; values were validated when they were set.
    pub fn search(&self) -> SearchSettings {
        let value = |k: &str| self.get(k).map(|(v, _)| v).unwrap_or("");
        SearchSettings {
            enabled: search_config::parse_bool(value("search.enabled")).unwrap_or(false),
            format: search_config::ValueFormat::parse(value("search.value.format"))
                .unwrap_or(search_config::ValueFormat::Auto),
            fields: search_config::parse_fields(value("search.fields")).unwrap_or_default(),
            store_value: search_config::parse_bool(value("search.store.value")).unwrap_or(false),
            max_fields: value("search.max.fields")
                .trim()
                .parse::<usize>()
                .unwrap_or(search_config::DEFAULT_MAX_FIELDS),
            time_field: match value("search.time.field").trim() {
                "" => search_config::DEFAULT_TIME_FIELD.to_string(),
                f => f.to_string(),
            },
        }
    }

    /// `search.max.lag.ms` when it slows producers (a positive value).
    pub fn search_max_lag_ms(&self) -> Option<u64> {
        self.get("search.max.lag.ms")
            .and_then(|(v, _)| v.trim().parse::<i64>().ok())
            .filter(|ms| *ms > 0)
            .map(|ms| ms as u64)
    }

    /// The codec batches are stored in (`compression.type`); `None` keeps the producer's.
    pub fn compression(&self) -> Option<Compression> {
        self.get("compression.type")
            .and_then(|(v, _)| parse_compression(v).ok())
            .flatten()
    }

    /// Whether the topic is compacted (`cleanup.policy` includes compact).
    pub fn compacted(&self) -> bool {
        self.cleanup().1
    }

    /// (delete, compact) of `cleanup.policy`.
    fn cleanup(&self) -> (bool, bool) {
        self.get("cleanup.policy")
            .and_then(|(v, _)| parse_cleanup_policy(v).ok())
            .unwrap_or((true, false))
    }

    /// The settings the log needs.
    pub fn log_config(&self) -> LogConfig {
        let (delete, compact) = self.cleanup();
        let ratio = self
            .get("min.cleanable.dirty.ratio")
            .and_then(|(v, _)| v.parse::<f64>().ok())
            .unwrap_or(0.5);
        LogConfig {
            segment_bytes: self.num("segment.bytes").max(14) as u64,
            segment_ms: self.num("segment.ms"),
            retention_ms: self.num("retention.ms"),
            retention_bytes: self.num("retention.bytes"),
            delete,
            compact: compact.then(|| CompactConfig {
                policy: CleanPolicy {
                    min_dirty_ratio: ratio,
                    min_lag_ms: self.num("min.compaction.lag.ms").max(0),
                    max_lag_ms: self.num("max.compaction.lag.ms").max(1),
                },
                delete_retention_ms: self.num("delete.retention.ms").max(0),
                codec: self.compression(),
            }),
            ..LogConfig::default()
        }
    }
}

/// `compression.type`: `None` for producer, else the codec batches are stored in.
fn parse_compression(v: &str) -> Result<Option<Compression>, String> {
    Ok(Some(match v.trim() {
        "producer" => return Ok(None),
        "uncompressed" => Compression::None,
        "gzip" => Compression::Gzip,
        "snappy" => Compression::Snappy,
        "lz4" => Compression::Lz4,
        "zstd" => Compression::Zstd,
        other => {
            return Err(format!(
                "'{other}' is not a compression type; one of producer, uncompressed, gzip, snappy, lz4, zstd"
            ))
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_apply_until_overridden() {
        let mut c = TopicConfig::default();
        assert_eq!(c.get("retention.ms"), Some(("604800000", false)));
        c.set("retention.ms", "1000").unwrap();
        assert_eq!(c.get("retention.ms"), Some(("1000", true)));
        assert_eq!(c.log_config().retention_ms, 1000);
        c.unset("retention.ms").unwrap();
        assert_eq!(c.log_config().retention_ms, 604800000);
    }

    #[test]
    fn compression_type_names_kafkas_codecs_and_refuses_others() {
        let mut c = TopicConfig::default();
        assert_eq!(c.compression(), None, "producer by default");
        for (name, codec) in [
            ("uncompressed", Compression::None),
            ("gzip", Compression::Gzip),
            ("snappy", Compression::Snappy),
            ("lz4", Compression::Lz4),
            ("zstd", Compression::Zstd),
        ] {
            c.set("compression.type", name).unwrap();
            assert_eq!(c.compression(), Some(codec), "{name}");
        }
        c.set("compression.type", "producer").unwrap();
        assert_eq!(c.compression(), None);
        for bad in ["brotli", "", "LZ4 "] {
            assert!(c.set("compression.type", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cleanup_policies_set_what_the_log_does() {
        let mut c = TopicConfig::default();
        let l = c.log_config();
        assert!(l.delete && l.compact.is_none() && !c.compacted());
        c.set("cleanup.policy", "compact").unwrap();
        c.set("min.cleanable.dirty.ratio", "0.1").unwrap();
        c.set("delete.retention.ms", "100").unwrap();
        let l = c.log_config();
        assert!(!l.delete && c.compacted());
        let compact = l.compact.unwrap();
        assert_eq!(compact.policy.min_dirty_ratio, 0.1);
        assert_eq!(compact.delete_retention_ms, 100);
        assert_eq!(compact.policy.max_lag_ms, i64::MAX);
        c.set("cleanup.policy", "compact, delete").unwrap();
        let l = c.log_config();
        assert!(l.delete && l.compact.is_some());
    }

    #[test]
    fn rejects_unknown_keys_and_bad_values() {
        let mut c = TopicConfig::default();
        assert_eq!(
            c.set("retention.mss", "1"),
            Err(TopicConfigError::Unknown("retention.mss".into()))
        );
        assert!(matches!(
            c.set("retention.ms", "soon"),
            Err(TopicConfigError::Invalid { .. })
        ));
        assert!(matches!(
            c.set("retention.bytes", "-2"),
            Err(TopicConfigError::Invalid { .. })
        ));
        assert!(matches!(
            c.set("segment.bytes", "99999999999"),
            Err(TopicConfigError::Invalid { .. })
        ));
        for bad in ["bogus", "compact,shred", ""] {
            assert!(
                matches!(
                    c.set("cleanup.policy", bad),
                    Err(TopicConfigError::Invalid { .. })
                ),
                "{bad}"
            );
        }
        for bad in ["1.5", "-0.1", "half"] {
            assert!(matches!(
                c.set("min.cleanable.dirty.ratio", bad),
                Err(TopicConfigError::Invalid { .. })
            ));
        }
        assert!(matches!(
            c.set("message.timestamp.type", "Wallclock"),
            Err(TopicConfigError::Invalid { .. })
        ));
        assert!(c.set("message.timestamp.type", "LogAppendTime").is_ok());
        assert!(c.log_append_time());
    }
}
