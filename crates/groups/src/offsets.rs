//! Committed offsets per group, topic and partition.

use std::collections::{BTreeMap, HashMap};

/// One committed position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// Next offset the group will read.
    pub offset: i64,
    /// Leader epoch of the last consumed record, or -1.
    pub leader_epoch: i32,
    /// Client-supplied metadata.
    pub metadata: Option<String>,
    /// When it was committed (ms since the epoch).
    pub commit_timestamp_ms: i64,
}

/// All committed offsets.
#[derive(Debug, Default, Clone)]
pub struct OffsetStore {
    groups: HashMap<String, BTreeMap<(String, i32), Committed>>,
}

impl OffsetStore {
    /// Sets (or with `None`, removes) one offset.
    pub fn apply(&mut self, group: &str, topic: &str, partition: i32, value: Option<Committed>) {
        match value {
            Some(c) => {
                self.groups
                    .entry(group.to_string())
                    .or_default()
                    .insert((topic.to_string(), partition), c);
            }
            None => {
                if let Some(g) = self.groups.get_mut(group) {
                    g.remove(&(topic.to_string(), partition));
                    if g.is_empty() {
                        self.groups.remove(group);
                    }
                }
            }
        }
    }

    /// The committed offset of one partition.
    pub fn get(&self, group: &str, topic: &str, partition: i32) -> Option<&Committed> {
        self.groups.get(group)?.get(&(topic.to_string(), partition))
    }

    /// Every committed offset of a group, in topic and partition order.
    pub fn group(&self, group: &str) -> Vec<(&str, i32, &Committed)> {
        self.groups
            .get(group)
            .map(|g| g.iter().map(|((t, p), c)| (t.as_str(), *p, c)).collect())
            .unwrap_or_default()
    }

    /// Groups that have offsets.
    pub fn group_ids(&self) -> impl Iterator<Item = &str> {
        self.groups.keys().map(String::as_str)
    }

    /// True when the group has any offset.
    pub fn has_group(&self, group: &str) -> bool {
        self.groups.contains_key(group)
    }

    /// Offsets committed before `cutoff_ms` in the groups `eligible` accepts: what offset
    /// retention removes.
    pub fn expired(
        &self,
        cutoff_ms: i64,
        eligible: impl Fn(&str) -> bool,
    ) -> Vec<(String, String, i32)> {
        self.groups
            .iter()
            .filter(|(g, _)| eligible(g))
            .flat_map(|(g, offsets)| {
                offsets
                    .iter()
                    .filter(|(_, c)| c.commit_timestamp_ms < cutoff_ms)
                    .map(move |((t, p), _)| (g.clone(), t.clone(), *p))
            })
            .collect()
    }

    /// Drops every group `which` names (another coordinator has them now).
    pub fn forget(&mut self, which: impl Fn(&str) -> bool) {
        self.groups.retain(|g, _| !which(g));
    }

    /// Takes in the offsets of `other`, replacing those of the same groups.
    pub fn absorb(&mut self, other: OffsetStore) {
        self.groups.extend(other.groups);
    }

    /// Number of stored offsets.
    pub fn len(&self) -> usize {
        self.groups.values().map(BTreeMap::len).sum()
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(offset: i64, ts: i64) -> Option<Committed> {
        Some(Committed {
            offset,
            leader_epoch: -1,
            metadata: None,
            commit_timestamp_ms: ts,
        })
    }

    #[test]
    fn latest_commit_wins_and_tombstones_remove() {
        let mut s = OffsetStore::default();
        s.apply("g", "t", 0, c(5, 1));
        s.apply("g", "t", 0, c(9, 2));
        assert_eq!(s.get("g", "t", 0).unwrap().offset, 9);
        s.apply("g", "t", 0, None);
        assert!(s.get("g", "t", 0).is_none());
        assert!(!s.has_group("g"));
    }

    #[test]
    fn expiry_only_touches_eligible_groups() {
        let mut s = OffsetStore::default();
        s.apply("idle", "t", 0, c(1, 100));
        s.apply("idle", "t", 1, c(1, 900));
        s.apply("busy", "t", 0, c(1, 100));
        let gone = s.expired(500, |g| g == "idle");
        assert_eq!(gone, vec![("idle".to_string(), "t".to_string(), 0)]);
    }
}
