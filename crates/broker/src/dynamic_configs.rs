//! A standalone broker's dynamic configs (`kafka-configs --entity-type brokers --alter`): the
//! disk watermark, changed at run time and kept in the data dir across restarts. In a cluster
//! the same keys live in the metadata image (see `cluster::broker_configs`), so every node
//! sees them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::disk::DiskWatermark;
use crate::error::BrokerError;

/// The file in the data dir holding the values set (a JSON object of strings).
pub const FILE: &str = "dynamic-broker-configs.json";

/// Free bytes below which produce is refused (`--disk-min-free-bytes`; 0: no byte limit).
pub const DISK_MIN_FREE_BYTES: &str = "disk.min.free.bytes";

/// Percentage of the file system below which produce is refused (`--disk-min-free-percent`;
/// 0: no percentage limit).
pub const DISK_MIN_FREE_PERCENT: &str = "disk.min.free.percent";

/// Documentation of the byte limit, for DescribeConfigs.
pub const DISK_MIN_FREE_BYTES_DOC: &str = "Free bytes of the data dir below which produce is refused with KAFKA_STORAGE_ERROR (0: no byte limit); with disk.min.free.percent the smaller limit set applies.";

/// Documentation of the percentage limit, for DescribeConfigs.
pub const DISK_MIN_FREE_PERCENT_DOC: &str = "Percentage of the data dir's file system below which produce is refused with KAFKA_STORAGE_ERROR (0: no percentage limit); with disk.min.free.bytes the smaller limit set applies.";

/// Whether `key` is a broker config a standalone broker changes at run time.
pub fn is_dynamic(key: &str) -> bool {
    key == DISK_MIN_FREE_BYTES || key == DISK_MIN_FREE_PERCENT
}

/// Checks a value for one of the watermark keys; the error names what is wrong.
pub fn validate(key: &str, value: &str) -> Result<(), String> {
    let v = value.trim();
    match key {
        DISK_MIN_FREE_BYTES => v
            .parse::<u64>()
            .map(|_| ())
            .map_err(|_| format!("{key} must be a whole number of bytes, not '{v}'")),
        DISK_MIN_FREE_PERCENT => match v.parse::<u8>() {
            Ok(n) if n <= 100 => Ok(()),
            _ => Err(format!(
                "{key} must be a percentage from 0 to 100, not '{v}'"
            )),
        },
        _ => Err(format!(
            "'{key}' is not a broker config that can change at run time (those are: {DISK_MIN_FREE_BYTES}, {DISK_MIN_FREE_PERCENT})"
        )),
    }
}

/// `base` (the start-up flags) with the limits `lookup` gives; values that do not parse are
/// ignored (they were validated when set).
pub fn watermark<'a>(
    base: DiskWatermark,
    lookup: impl Fn(&str) -> Option<&'a str>,
) -> DiskWatermark {
    DiskWatermark {
        min_free_bytes: lookup(DISK_MIN_FREE_BYTES)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(base.min_free_bytes),
        min_free_percent: lookup(DISK_MIN_FREE_PERCENT)
            .and_then(|v| v.trim().parse::<u8>().ok())
            .filter(|&p| p <= 100)
            .unwrap_or(base.min_free_percent),
    }
}

/// The dynamic configs a standalone broker has set, as in its data dir.
pub struct DynamicConfigs {
    path: PathBuf,
    values: Mutex<BTreeMap<String, String>>,
}

impl DynamicConfigs {
    /// Loads the values set in `data_dir` (none when the file is missing).
    pub fn open(data_dir: &Path) -> Result<Self, BrokerError> {
        let path = data_dir.join(FILE);
        let values = crate::registry::read_json_or_default(&path)?;
        Ok(Self {
            path,
            values: Mutex::new(values),
        })
    }

    /// The values set.
    pub fn values(&self) -> BTreeMap<String, String> {
        self.values.lock().clone()
    }

    /// Sets and removes keys, on disk before the new values are returned (and used).
    pub fn change(
        &self,
        set: BTreeMap<String, String>,
        remove: &[String],
    ) -> Result<BTreeMap<String, String>, BrokerError> {
        let mut values = self.values.lock();
        let mut next = values.clone();
        for k in remove {
            next.remove(k);
        }
        next.extend(set);
        let json = serde_json::to_vec_pretty(&next).map_err(|e| BrokerError::CorruptMetadata {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        crate::registry::write_atomically(&self.path, &json)?;
        *values = next.clone();
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_set_survive_a_reopen_and_removed_ones_fall_back_to_the_flags() {
        let dir = tempfile::tempdir().unwrap();
        let flags = DiskWatermark {
            min_free_bytes: 1 << 30,
            min_free_percent: 5,
        };
        let c = DynamicConfigs::open(dir.path()).unwrap();
        let set = BTreeMap::from([
            (DISK_MIN_FREE_BYTES.to_string(), "1000".to_string()),
            (DISK_MIN_FREE_PERCENT.to_string(), "0".to_string()),
        ]);
        c.change(set, &[]).unwrap();
        let c = DynamicConfigs::open(dir.path()).unwrap();
        let v = c.values();
        let w = watermark(flags, |k| v.get(k).map(String::as_str));
        assert_eq!((w.min_free_bytes, w.min_free_percent), (1000, 0));
        let v = c
            .change(BTreeMap::new(), &[DISK_MIN_FREE_BYTES.to_string()])
            .unwrap();
        let w = watermark(flags, |k| v.get(k).map(String::as_str));
        assert_eq!((w.min_free_bytes, w.min_free_percent), (1 << 30, 0));
    }

    #[test]
    fn bad_values_and_other_keys_are_refused_with_the_reason() {
        assert!(validate(DISK_MIN_FREE_BYTES, "1073741824").is_ok());
        assert!(validate(DISK_MIN_FREE_PERCENT, "100").is_ok());
        assert!(validate(DISK_MIN_FREE_PERCENT, "101").is_err());
        assert!(validate(DISK_MIN_FREE_BYTES, "-1").is_err());
        let other = validate("log.dirs", "/tmp").unwrap_err();
        assert!(other.contains(DISK_MIN_FREE_BYTES), "{other}");
    }
}
