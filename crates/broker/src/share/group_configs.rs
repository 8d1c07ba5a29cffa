//! Share group configs per group (`kafka-configs --entity-type groups --entity-name G`, config
//! resource type GROUP): `share.auto.offset.reset`, `share.record.lock.duration.ms` and
//! `share.isolation.level`, as Kafka 4.x has them. A group's configs may be set before the
//! group exists (so its first share-partitions start where they should) and are kept in the
//! data dir across restarts, fsynced before the answer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use spate_share::AutoOffsetReset;

use super::ShareSettings;
use crate::error::BrokerError;

/// The file in the data dir: a JSON object of group id to its configs set.
pub const FILE: &str = "share-group-configs.json";

/// Where a share-partition without state starts: `latest`, `earliest` or `by_duration:<ISO 8601>`.
pub const AUTO_OFFSET_RESET: &str = "share.auto.offset.reset";
/// How long a member holds acquired records.
pub const LOCK_DURATION_MS: &str = "share.record.lock.duration.ms";
/// `read_uncommitted` or `read_committed`.
pub const ISOLATION_LEVEL: &str = "share.isolation.level";

/// Kafka's bounds of `share.record.lock.duration.ms` (`group.share.min/max.record.lock.duration.ms`).
const LOCK_DURATION_RANGE: std::ops::RangeInclusive<i64> = 15_000..=60_000;

/// A group config key, its default and its documentation (for DescribeConfigs).
pub struct Definition {
    /// The key.
    pub name: &'static str,
    /// The value when the group sets none.
    pub default: fn(&ShareSettings) -> String,
    /// One line for DescribeConfigs' documentation field.
    pub doc: &'static str,
    /// True for an integer (DescribeConfigs' type INT), false for a string.
    pub int: bool,
}

/// Every share group config, in the order DescribeConfigs lists them.
pub const DEFINITIONS: [Definition; 3] = [
    Definition {
        name: AUTO_OFFSET_RESET,
        default: |s| match s.auto_offset_reset {
            AutoOffsetReset::Earliest => "earliest".into(),
            AutoOffsetReset::Latest => "latest".into(),
            AutoOffsetReset::ByDuration(_) => "by_duration".into(),
        },
        doc: "Where a share-partition of the group without state starts: latest, earliest or by_duration:<ISO 8601 duration>.",
        int: false,
    },
    Definition {
        name: LOCK_DURATION_MS,
        default: |s| s.lock_duration_ms.to_string(),
        doc: "How long a member of the group holds the records it acquired before they are available again (15000 to 60000).",
        int: true,
    },
    Definition {
        name: ISOLATION_LEVEL,
        default: |s| {
            if s.read_committed {
                "read_committed".into()
            } else {
                "read_uncommitted".into()
            }
        },
        doc: "read_committed hands out records up to the last stable offset and never those of aborted transactions; read_uncommitted up to the high watermark.",
        int: false,
    },
];

/// Checks one value; the error says what is wrong.
pub fn validate(key: &str, value: &str) -> Result<(), String> {
    let v = value.trim();
    match key {
        AUTO_OFFSET_RESET => AutoOffsetReset::parse(v).map(|_| ()).ok_or_else(|| {
            format!("{key} must be latest, earliest or by_duration:<duration>, not '{v}'")
        }),
        LOCK_DURATION_MS => match v.parse::<i64>() {
            Ok(ms) if LOCK_DURATION_RANGE.contains(&ms) => Ok(()),
            _ => Err(format!(
                "{key} must be an integer from {} to {}, not '{v}'",
                LOCK_DURATION_RANGE.start(),
                LOCK_DURATION_RANGE.end()
            )),
        },
        ISOLATION_LEVEL => match v {
            "read_committed" | "read_uncommitted" => Ok(()),
            _ => Err(format!(
                "{key} must be read_committed or read_uncommitted, not '{v}'"
            )),
        },
        _ => Err(format!("'{key}' is not a share group config")),
    }
}

/// The configs set per group.
pub struct GroupConfigs {
    path: Option<PathBuf>,
    values: Mutex<BTreeMap<String, BTreeMap<String, String>>>,
}

impl GroupConfigs {
    /// Loads the configs kept in `data_dir`.
    pub fn open(data_dir: &Path) -> Result<Self, BrokerError> {
        let path = data_dir.join(FILE);
        let values = crate::registry::read_json_or_default(&path)?;
        Ok(Self {
            path: Some(path),
            values: Mutex::new(values),
        })
    }

    /// Configs held in memory only (tests).
    #[cfg(test)]
    pub fn in_memory() -> Self {
        Self {
            path: None,
            values: Mutex::new(BTreeMap::new()),
        }
    }

    /// The groups that set configs.
    pub fn groups(&self) -> Vec<String> {
        self.values.lock().keys().cloned().collect()
    }

    /// The configs `group` sets.
    pub fn get(&self, group: &str) -> BTreeMap<String, String> {
        self.values.lock().get(group).cloned().unwrap_or_default()
    }

    /// Applies `changes` (key, `Some(value)` to set, `None` to delete) to `group`'s configs,
    /// all or nothing, and keeps them on disk; `validate_only` checks without changing.
    pub fn change(
        &self,
        group: &str,
        changes: &[(String, Option<String>)],
        validate_only: bool,
    ) -> Result<(), ChangeError> {
        if group.is_empty() {
            return Err(ChangeError::Invalid("the group id is empty".into()));
        }
        for (key, value) in changes {
            match value {
                Some(v) => validate(key, v).map_err(ChangeError::Invalid)?,
                None if DEFINITIONS.iter().any(|d| d.name == key) => {}
                None => {
                    return Err(ChangeError::Invalid(format!(
                        "'{key}' is not a share group config"
                    )))
                }
            }
        }
        if validate_only {
            return Ok(());
        }
        let mut values = self.values.lock();
        let mut next = values.clone();
        let entry = next.entry(group.to_string()).or_default();
        for (key, value) in changes {
            match value {
                Some(v) => entry.insert(key.clone(), v.trim().to_string()),
                None => entry.remove(key),
            };
        }
        if entry.is_empty() {
            next.remove(group);
        }
        if let Some(path) = &self.path {
            let json = serde_json::to_vec_pretty(&next)
                .map_err(|e| ChangeError::Storage(e.to_string()))?;
            crate::registry::write_atomically(path, &json)
                .map_err(|e| ChangeError::Storage(e.to_string()))?;
        }
        *values = next;
        Ok(())
    }

    /// Cluster mode: the configs are those of the cluster's metadata (`values`), which
    /// every node applies; nothing is kept in the data dir.
    pub fn replace_all(&self, values: &BTreeMap<String, BTreeMap<String, String>>) {
        let mut held = self.values.lock();
        if *held != *values {
            *held = values.clone();
        }
    }

    /// `base` with `group`'s configs applied.
    pub fn settings_for(&self, group: &str, base: &ShareSettings) -> ShareSettings {
        let mut s = *base;
        if let Some(set) = self.values.lock().get(group) {
            if let Some(r) = set
                .get(AUTO_OFFSET_RESET)
                .and_then(|v| AutoOffsetReset::parse(v))
            {
                s.auto_offset_reset = r;
            }
            if let Some(ms) = set.get(LOCK_DURATION_MS).and_then(|v| v.parse().ok()) {
                s.lock_duration_ms = ms;
            }
            if let Some(level) = set.get(ISOLATION_LEVEL) {
                s.read_committed = level == "read_committed";
            }
        }
        s
    }
}

/// Why a change of group configs was refused.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// A key or value is not valid (INVALID_CONFIG).
    #[error("{0}")]
    Invalid(String),
    /// The configs could not be kept on disk (KAFKA_STORAGE_ERROR).
    #[error("cannot keep the group configs: {0}")]
    Storage(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_against_kafkas_rules() {
        assert!(validate(AUTO_OFFSET_RESET, "earliest").is_ok());
        assert!(validate(AUTO_OFFSET_RESET, "sometimes").is_err());
        assert!(validate(LOCK_DURATION_MS, "15000").is_ok());
        assert!(validate(LOCK_DURATION_MS, "1000").is_err());
        assert!(validate(LOCK_DURATION_MS, "60001").is_err());
        assert!(validate(ISOLATION_LEVEL, "read_committed").is_ok());
        assert!(validate(ISOLATION_LEVEL, "serializable").is_err());
        assert!(validate("consumer.session.timeout.ms", "45000").is_err());
    }

    #[test]
    fn configs_survive_a_reopen_and_a_bad_change_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let c = GroupConfigs::open(dir.path()).unwrap();
        let set = |k: &str, v: &str| (k.to_string(), Some(v.to_string()));
        c.change(
            "g",
            &[
                set(AUTO_OFFSET_RESET, "earliest"),
                set(LOCK_DURATION_MS, "20000"),
            ],
            false,
        )
        .unwrap();
        // One bad value refuses the whole change.
        assert!(matches!(
            c.change(
                "g",
                &[
                    set(ISOLATION_LEVEL, "read_committed"),
                    set(LOCK_DURATION_MS, "5")
                ],
                false
            ),
            Err(ChangeError::Invalid(_))
        ));
        // Validation only changes nothing.
        c.change("g", &[set(ISOLATION_LEVEL, "read_committed")], true)
            .unwrap();
        let c = GroupConfigs::open(dir.path()).unwrap();
        assert_eq!(
            c.get("g"),
            BTreeMap::from([
                (AUTO_OFFSET_RESET.to_string(), "earliest".to_string()),
                (LOCK_DURATION_MS.to_string(), "20000".to_string()),
            ])
        );
        let s = c.settings_for("g", &ShareSettings::default());
        assert_eq!(s.lock_duration_ms, 20_000);
        assert!(matches!(s.auto_offset_reset, AutoOffsetReset::Earliest));
        assert!(!s.read_committed);
        // Other groups keep the defaults; deleting every key forgets the group.
        assert_eq!(
            c.settings_for("other", &ShareSettings::default())
                .lock_duration_ms,
            30_000
        );
        c.change(
            "g",
            &[
                (AUTO_OFFSET_RESET.to_string(), None),
                (LOCK_DURATION_MS.to_string(), None),
            ],
            false,
        )
        .unwrap();
        assert!(GroupConfigs::open(dir.path()).unwrap().get("g").is_empty());
    }
}
