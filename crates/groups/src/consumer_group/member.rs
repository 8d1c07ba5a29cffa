//! One member of a consumer group: who it is, what it subscribes to, and what it owns.

use std::collections::BTreeMap;

use regex::Regex;
use uuid::Uuid;

use super::reconcile::Current;

/// Longest `subscribed_topic_regex` accepted (its compiled form is bounded too).
pub const MAX_REGEX_LEN: usize = 4096;
/// Compiled size limit of one regex.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// A topic subscription: names, or a regular expression (RE2/J syntax) topic names must match
/// whole.
#[derive(Debug, Clone, Default)]
pub struct Subscription {
    /// Topic names.
    pub names: Vec<String>,
    /// The regular expression as the client sent it.
    pub regex: Option<String>,
    compiled: Option<Regex>,
}

impl PartialEq for Subscription {
    fn eq(&self, other: &Self) -> bool {
        self.names == other.names && self.regex == other.regex
    }
}

impl Subscription {
    /// A subscription to topic names.
    pub fn names(mut names: Vec<String>) -> Self {
        names.sort();
        names.dedup();
        Self {
            names,
            regex: None,
            compiled: None,
        }
    }

    /// A subscription by regular expression; `Err` carries why it is invalid.
    pub fn regex(pattern: &str) -> Result<Self, String> {
        Ok(Self {
            names: Vec::new(),
            regex: Some(pattern.to_string()),
            compiled: Some(compile(pattern)?),
        })
    }

    /// Whether the subscription includes `topic`.
    pub fn matches(&self, topic: &str) -> bool {
        self.names
            .binary_search_by(|n| n.as_str().cmp(topic))
            .is_ok()
            || self.compiled.as_ref().is_some_and(|r| r.is_match(topic))
    }

    /// The subscribed topics among `topics` (name -> id and partition count).
    pub fn resolve<'a>(
        &'a self,
        topics: &'a BTreeMap<String, (Uuid, i32)>,
    ) -> impl Iterator<Item = (&'a String, &'a (Uuid, i32))> + 'a {
        let by_name = self.names.iter().filter_map(|n| topics.get_key_value(n));
        let by_regex = self
            .compiled
            .iter()
            .flat_map(move |r| topics.iter().filter(move |(n, _)| r.is_match(n)));
        by_name.chain(by_regex)
    }
}

/// Compiles a client's regex so it must match a whole topic name, as Java's `matches()`.
fn compile(pattern: &str) -> Result<Regex, String> {
    if pattern.len() > MAX_REGEX_LEN {
        return Err(format!("longer than {MAX_REGEX_LEN} bytes"));
    }
    regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| e.to_string())
}

/// One member.
#[derive(Debug, Clone)]
pub struct Member {
    /// Member id.
    pub id: String,
    /// Static membership id (KIP-345).
    pub instance_id: Option<String>,
    /// Rack, reported only.
    pub rack_id: Option<String>,
    /// Client id, reported by describe.
    pub client_id: String,
    /// Client address, reported by describe.
    pub client_host: String,
    /// How long it may take to revoke partitions.
    pub rebalance_timeout_ms: i32,
    /// What it subscribes to.
    pub subscription: Subscription,
    /// The assignor it asked for, if any.
    pub server_assignor: Option<String>,
    /// Its assignment and epoch.
    pub current: Current,
    /// Monotonic time of its last heartbeat.
    pub last_heartbeat_ms: i64,
    /// When a pending revocation times out (the member is fenced then).
    pub revocation_deadline_ms: Option<i64>,
}

impl Member {
    /// A new member that owns nothing.
    pub fn new(id: String, now_ms: i64) -> Self {
        Self {
            id,
            instance_id: None,
            rack_id: None,
            client_id: String::new(),
            client_host: String::new(),
            rebalance_timeout_ms: 300_000,
            subscription: Subscription::default(),
            server_assignor: None,
            current: Current::joining(),
            last_heartbeat_ms: now_ms,
            revocation_deadline_ms: None,
        }
    }

    /// True for a static member that left for now and may come back (epoch -2).
    pub fn is_away(&self) -> bool {
        self.current.epoch == super::LEAVE_STATIC_EPOCH
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regex_must_match_the_whole_topic_name() {
        let s = Subscription::regex("orders-.*").unwrap();
        assert!(s.matches("orders-eu"));
        assert!(
            !s.matches("old-orders-eu"),
            "an unanchored pattern still matches whole names"
        );
        let alt = Subscription::regex("a|b").unwrap();
        assert!(alt.matches("a") && alt.matches("b") && !alt.matches("ab"));
    }

    #[test]
    fn an_invalid_regex_is_refused_with_a_reason() {
        assert!(Subscription::regex("orders-(").is_err());
        assert!(Subscription::regex(&"a".repeat(MAX_REGEX_LEN + 1)).is_err());
    }

    #[test]
    fn name_subscriptions_compare_without_order_or_duplicates() {
        let a = Subscription::names(vec!["b".into(), "a".into(), "a".into()]);
        assert_eq!(a, Subscription::names(vec!["a".into(), "b".into()]));
        assert!(a.matches("a") && !a.matches("c"));
    }

    #[test]
    fn resolve_lists_existing_subscribed_topics() {
        let id = Uuid::from_bytes([1; 16]);
        let topics = BTreeMap::from([
            ("t1".to_string(), (id, 3)),
            ("u1".to_string(), (Uuid::nil(), 1)),
        ]);
        let s = Subscription::names(vec!["t1".into(), "missing".into()]);
        let found: Vec<_> = s.resolve(&topics).map(|(n, _)| n.clone()).collect();
        assert_eq!(found, vec!["t1".to_string()]);
        let r = Subscription::regex("t.*").unwrap();
        assert_eq!(r.resolve(&topics).count(), 1);
    }
}
