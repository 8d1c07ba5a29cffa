//! The configured quotas: set, removed, described with Kafka's filters, and resolved for a
//! (user, client id) with Kafka's precedence.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::entity::{EntityName, EntityType, QuotaEntity};
use crate::QuotaError;

/// What a quota limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum QuotaKey {
    /// Produced bytes per second.
    ProducerByteRate,
    /// Fetched bytes per second.
    ConsumerByteRate,
    /// Share of one request-handling thread's time, in percent.
    RequestPercentage,
    /// Partitions created or deleted per second (KIP-599).
    ControllerMutationRate,
    /// New connections per second from one IP (KIP-612).
    ConnectionCreationRate,
}

impl QuotaKey {
    /// Every key.
    pub const ALL: [QuotaKey; 5] = [
        QuotaKey::ProducerByteRate,
        QuotaKey::ConsumerByteRate,
        QuotaKey::RequestPercentage,
        QuotaKey::ControllerMutationRate,
        QuotaKey::ConnectionCreationRate,
    ];

    /// Kafka's name for the key.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaKey::ProducerByteRate => "producer_byte_rate",
            QuotaKey::ConsumerByteRate => "consumer_byte_rate",
            QuotaKey::RequestPercentage => "request_percentage",
            QuotaKey::ControllerMutationRate => "controller_mutation_rate",
            QuotaKey::ConnectionCreationRate => "connection_creation_rate",
        }
    }

    /// Parses a key and checks it applies to `entity` (IP entities take only the connection
    /// creation rate, user and client-id entities everything else).
    pub fn parse_for(key: &str, entity: &QuotaEntity) -> Result<Self, QuotaError> {
        let k = QuotaKey::ALL
            .into_iter()
            .find(|k| k.as_str() == key)
            .ok_or_else(|| QuotaError::InvalidKey(format!("unknown quota key '{key}'")))?;
        let ip = entity.ip.is_some();
        if ip != (k == QuotaKey::ConnectionCreationRate) {
            return Err(QuotaError::InvalidKey(format!(
                "quota key '{key}' does not apply to {} entities",
                if ip { "ip" } else { "user and client-id" }
            )));
        }
        Ok(k)
    }

    /// Checks a value: positive and finite, and whole for the integer-valued keys.
    pub fn validate(self, value: f64) -> Result<QuotaValue, QuotaError> {
        if !value.is_finite() || value <= 0.0 {
            return Err(QuotaError::InvalidValue(format!(
                "{} must be a positive number, got {value}",
                self.as_str()
            )));
        }
        let integral = matches!(
            self,
            QuotaKey::ProducerByteRate
                | QuotaKey::ConsumerByteRate
                | QuotaKey::ConnectionCreationRate
        );
        if integral && (value.fract() != 0.0 || value > i64::MAX as f64) {
            return Err(QuotaError::InvalidValue(format!(
                "{} must be a whole number of at most {}, got {value}",
                self.as_str(),
                i64::MAX
            )));
        }
        Ok(QuotaValue(value))
    }
}

/// A quota's value; compared by its bits so tables can be compared and replicated.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct QuotaValue(pub f64);

impl PartialEq for QuotaValue {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for QuotaValue {}

/// How a describe filter component matches an entity's part of one type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatchType {
    /// Exactly this name.
    Exact(String),
    /// The default entity of the type.
    Default,
    /// Any name, the default included, as long as the type is present.
    Specified,
}

/// One component of a DescribeClientQuotas filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentFilter {
    /// The type it is about.
    pub entity_type: EntityType,
    /// How it matches.
    pub matches: MatchType,
}

impl ComponentFilter {
    /// From the protocol's (entity_type, match_type, match): 0 exact, 1 default, 2 any.
    pub fn from_wire(ty: &str, match_type: i8, name: Option<&str>) -> Result<Self, QuotaError> {
        let entity_type = EntityType::parse(ty)?;
        let matches = match (match_type, name) {
            (0, Some(n)) => MatchType::Exact(n.to_owned()),
            (0, None) => {
                return Err(QuotaError::InvalidEntity(format!(
                    "an exact match on {ty} needs a name"
                )))
            }
            (1, _) => MatchType::Default,
            (2, _) => MatchType::Specified,
            (other, _) => {
                return Err(QuotaError::InvalidEntity(format!(
                    "unknown match type {other} for {ty}"
                )))
            }
        };
        Ok(Self {
            entity_type,
            matches,
        })
    }

    fn accepts(&self, entity: &QuotaEntity) -> bool {
        match (entity.part(self.entity_type), &self.matches) {
            (None, _) => false,
            (Some(EntityName::Named(n)), MatchType::Exact(want)) => n == want,
            (Some(EntityName::Default), MatchType::Default) => true,
            (Some(_), MatchType::Specified) => true,
            _ => false,
        }
    }
}

/// One entity and its quotas, borrowed from a table.
pub type Entry<'a> = (&'a QuotaEntity, &'a BTreeMap<QuotaKey, QuotaValue>);

/// Every configured quota, by entity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaTable {
    entries: Vec<(QuotaEntity, BTreeMap<QuotaKey, QuotaValue>)>,
}

impl QuotaTable {
    /// True when no quota is configured (the hot path then skips all accounting).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entity with its quotas, in entity order.
    pub fn entries(&self) -> impl Iterator<Item = Entry<'_>> {
        self.entries.iter().map(|(e, v)| (e, v))
    }

    /// Sets (`Some`) or removes (`None`) quotas of one entity, all at once.
    pub fn apply(&mut self, entity: &QuotaEntity, ops: &[(QuotaKey, Option<QuotaValue>)]) {
        let at = match self.entries.binary_search_by(|(e, _)| e.cmp(entity)) {
            Ok(i) => i,
            Err(i) => {
                self.entries.insert(i, (entity.clone(), BTreeMap::new()));
                i
            }
        };
        let values = &mut self.entries[at].1;
        for (key, value) in ops {
            match value {
                Some(v) => {
                    values.insert(*key, *v);
                }
                None => {
                    values.remove(key);
                }
            }
        }
        if values.is_empty() {
            self.entries.remove(at);
        }
    }

    /// DescribeClientQuotas: entities every component accepts; with `strict`, only entities
    /// with no other types.
    pub fn describe(
        &self,
        filter: &[ComponentFilter],
        strict: bool,
    ) -> Result<Vec<Entry<'_>>, QuotaError> {
        for (i, c) in filter.iter().enumerate() {
            if filter[..i].iter().any(|d| d.entity_type == c.entity_type) {
                return Err(QuotaError::InvalidEntity(format!(
                    "entity type '{}' appears twice in the filter",
                    c.entity_type.as_str()
                )));
            }
        }
        Ok(self
            .entries()
            .filter(|(e, _)| filter.iter().all(|c| c.accepts(e)))
            .filter(|(e, _)| !strict || e.parts().len() == filter.len())
            .collect())
    }

    /// The quota on `key` that applies to `user` using `client_id`, and the entity it is set
    /// on, by Kafka's precedence: user and client, user and default client, user, default user
    /// and client, default user and default client, default user, client, default client.
    pub fn resolve(
        &self,
        user: &str,
        client_id: &str,
        key: QuotaKey,
    ) -> Option<(&QuotaEntity, f64)> {
        use EntityName::{Default, Named};
        let named_user = Some(Named(user.to_owned()));
        let named_client = Some(Named(client_id.to_owned()));
        let order = [
            (named_user.clone(), named_client.clone()),
            (named_user.clone(), Some(Default)),
            (named_user, None),
            (Some(Default), named_client.clone()),
            (Some(Default), Some(Default)),
            (Some(Default), None),
            (None, named_client),
            (None, Some(Default)),
        ];
        order.into_iter().find_map(|(u, c)| {
            let wanted = QuotaEntity {
                user: u,
                client_id: c,
                ip: None,
            };
            let i = self
                .entries
                .binary_search_by(|(e, _)| e.cmp(&wanted))
                .ok()?;
            let (entity, values) = &self.entries[i];
            values.get(&key).map(|v| (entity, v.0))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entity(user: Option<Option<&str>>, client: Option<Option<&str>>) -> QuotaEntity {
        QuotaEntity {
            user: user.map(EntityName::from_wire),
            client_id: client.map(EntityName::from_wire),
            ip: None,
        }
    }

    fn set(t: &mut QuotaTable, e: &QuotaEntity, key: QuotaKey, v: f64) {
        t.apply(e, &[(key, Some(QuotaValue(v)))]);
    }

    #[test]
    fn resolution_follows_kafkas_precedence_from_most_to_least_specific() {
        let p = QuotaKey::ProducerByteRate;
        let mut t = QuotaTable::default();
        set(&mut t, &entity(None, Some(None)), p, 8.0);
        assert_eq!(t.resolve("alice", "app", p).map(|r| r.1), Some(8.0));
        set(&mut t, &entity(None, Some(Some("app"))), p, 7.0);
        assert_eq!(t.resolve("alice", "app", p).map(|r| r.1), Some(7.0));
        set(&mut t, &entity(Some(None), None), p, 6.0);
        assert_eq!(t.resolve("alice", "app", p).map(|r| r.1), Some(6.0));
        set(&mut t, &entity(Some(None), Some(None)), p, 5.0);
        assert_eq!(t.resolve("alice", "app", p).map(|r| r.1), Some(5.0));
        set(&mut t, &entity(Some(None), Some(Some("app"))), p, 4.0);
        assert_eq!(t.resolve("alice", "app", p).map(|r| r.1), Some(4.0));
        set(&mut t, &entity(Some(Some("alice")), None), p, 3.0);
        assert_eq!(t.resolve("alice", "app", p).map(|r| r.1), Some(3.0));
        set(&mut t, &entity(Some(Some("alice")), Some(None)), p, 2.0);
        assert_eq!(t.resolve("alice", "app", p).map(|r| r.1), Some(2.0));
        set(
            &mut t,
            &entity(Some(Some("alice")), Some(Some("app"))),
            p,
            1.0,
        );
        assert_eq!(t.resolve("alice", "app", p).map(|r| r.1), Some(1.0));
        // Another user still falls to the defaults; another key has no quota at all.
        assert_eq!(t.resolve("bob", "other", p).map(|r| r.1), Some(5.0));
        assert_eq!(t.resolve("alice", "app", QuotaKey::ConsumerByteRate), None);
    }

    #[test]
    fn removing_the_last_key_removes_the_entity() {
        let e = entity(None, Some(Some("c")));
        let mut t = QuotaTable::default();
        set(&mut t, &e, QuotaKey::ConsumerByteRate, 100.0);
        assert!(!t.is_empty());
        t.apply(&e, &[(QuotaKey::ConsumerByteRate, None)]);
        assert!(t.is_empty());
    }

    #[test]
    fn describe_filters_by_exact_default_and_any_name_and_strictness() {
        let mut t = QuotaTable::default();
        let k = QuotaKey::ProducerByteRate;
        set(&mut t, &entity(Some(Some("alice")), None), k, 1.0);
        set(
            &mut t,
            &entity(Some(Some("alice")), Some(Some("app"))),
            k,
            2.0,
        );
        set(&mut t, &entity(Some(None), None), k, 3.0);
        set(&mut t, &entity(None, Some(Some("app"))), k, 4.0);
        let f = |ty: &str, m: i8, n: Option<&str>| ComponentFilter::from_wire(ty, m, n).unwrap();
        let values = |r: Vec<Entry<'_>>| r.iter().map(|(_, v)| v[&k].0).collect::<Vec<_>>();
        assert_eq!(
            values(t.describe(&[f("user", 0, Some("alice"))], false).unwrap()),
            [1.0, 2.0]
        );
        assert_eq!(
            values(t.describe(&[f("user", 0, Some("alice"))], true).unwrap()),
            [1.0]
        );
        assert_eq!(
            values(t.describe(&[f("user", 1, None)], false).unwrap()),
            [3.0]
        );
        assert_eq!(
            values(t.describe(&[f("user", 2, None)], true).unwrap()),
            [3.0, 1.0]
        );
        assert_eq!(values(t.describe(&[], false).unwrap()).len(), 4);
        assert!(t
            .describe(&[f("user", 2, None), f("user", 1, None)], false)
            .is_err());
        assert!(ComponentFilter::from_wire("user", 0, None).is_err());
        assert!(ComponentFilter::from_wire("user", 7, None).is_err());
    }

    #[test]
    fn keys_must_be_known_fit_the_entity_and_take_positive_values() {
        let user = entity(Some(Some("a")), None);
        let ip = QuotaEntity::from_parts([("ip", Some("10.0.0.1"))]).unwrap();
        assert!(QuotaKey::parse_for("producer_byte_rate", &user).is_ok());
        assert!(QuotaKey::parse_for("no_such_rate", &user).is_err());
        assert!(QuotaKey::parse_for("connection_creation_rate", &user).is_err());
        assert!(QuotaKey::parse_for("producer_byte_rate", &ip).is_err());
        assert!(QuotaKey::ProducerByteRate.validate(-5.0).is_err());
        assert!(QuotaKey::ProducerByteRate.validate(0.0).is_err());
        assert!(QuotaKey::ProducerByteRate.validate(1.5).is_err());
        assert!(QuotaKey::ProducerByteRate.validate(f64::NAN).is_err());
        assert!(QuotaKey::ControllerMutationRate.validate(1.5).is_ok());
        assert_eq!(
            QuotaKey::RequestPercentage.validate(200.0),
            Ok(QuotaValue(200.0))
        );
    }

    #[test]
    fn a_table_round_trips_through_json() {
        let mut t = QuotaTable::default();
        set(
            &mut t,
            &entity(Some(None), Some(Some("x"))),
            QuotaKey::ConsumerByteRate,
            1024.0,
        );
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<QuotaTable>(&text).unwrap(), t);
    }
}
