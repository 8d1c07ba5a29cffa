//! Quota entities: a user, a client id, both, or an IP address, each named or the default.

use serde::{Deserialize, Serialize};

use crate::QuotaError;

/// The kinds of entity a quota can be set for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EntityType {
    /// An authenticated principal's name (`ANONYMOUS` without authentication).
    User,
    /// The client.id a client sends.
    ClientId,
    /// The client's IP address (connection creation rate only).
    Ip,
}

impl EntityType {
    /// Kafka's name for the type.
    pub fn as_str(self) -> &'static str {
        match self {
            EntityType::User => "user",
            EntityType::ClientId => "client-id",
            EntityType::Ip => "ip",
        }
    }

    /// Parses Kafka's name.
    pub fn parse(s: &str) -> Result<Self, QuotaError> {
        match s {
            "user" => Ok(EntityType::User),
            "client-id" => Ok(EntityType::ClientId),
            "ip" => Ok(EntityType::Ip),
            other => Err(QuotaError::InvalidEntity(format!(
                "unknown entity type '{other}' (user, client-id or ip)"
            ))),
        }
    }
}

/// A named entity, or the default that applies to every name without its own quota.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EntityName {
    /// `<default>`: the protocol's null name.
    Default,
    /// A specific name.
    Named(String),
}

impl EntityName {
    /// From the protocol's nullable name.
    pub fn from_wire(name: Option<&str>) -> Self {
        match name {
            None => EntityName::Default,
            Some(n) => EntityName::Named(n.to_owned()),
        }
    }

    /// The protocol's nullable name.
    pub fn to_wire(&self) -> Option<&str> {
        match self {
            EntityName::Default => None,
            EntityName::Named(n) => Some(n),
        }
    }
}

/// Who a quota is for: a user, a client id, a user and client id, or an IP.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct QuotaEntity {
    /// The user part, if any.
    pub user: Option<EntityName>,
    /// The client-id part, if any.
    pub client_id: Option<EntityName>,
    /// The IP part, if any (never combined with the others).
    pub ip: Option<EntityName>,
}

impl QuotaEntity {
    /// Builds an entity from (type, name) parts as a request carries them: at least one
    /// part, no type twice, and IP alone.
    pub fn from_parts<'a>(
        parts: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    ) -> Result<Self, QuotaError> {
        let mut e = QuotaEntity {
            user: None,
            client_id: None,
            ip: None,
        };
        let mut any = false;
        for (ty, name) in parts {
            let slot = match EntityType::parse(ty)? {
                EntityType::User => &mut e.user,
                EntityType::ClientId => &mut e.client_id,
                EntityType::Ip => &mut e.ip,
            };
            if slot.is_some() {
                return Err(QuotaError::InvalidEntity(format!(
                    "entity type '{ty}' appears twice"
                )));
            }
            if name == Some("") {
                return Err(QuotaError::InvalidEntity(format!(
                    "an empty {ty} name (use the default entity instead)"
                )));
            }
            *slot = Some(EntityName::from_wire(name));
            any = true;
        }
        if !any {
            return Err(QuotaError::InvalidEntity(
                "an entity needs at least one type".into(),
            ));
        }
        if e.ip.is_some() && (e.user.is_some() || e.client_id.is_some()) {
            return Err(QuotaError::InvalidEntity(
                "an ip entity cannot be combined with user or client-id".into(),
            ));
        }
        Ok(e)
    }

    /// The (type, name) parts, in Kafka's order.
    pub fn parts(&self) -> Vec<(EntityType, &EntityName)> {
        let mut out = Vec::with_capacity(2);
        if let Some(u) = &self.user {
            out.push((EntityType::User, u));
        }
        if let Some(c) = &self.client_id {
            out.push((EntityType::ClientId, c));
        }
        if let Some(i) = &self.ip {
            out.push((EntityType::Ip, i));
        }
        out
    }

    /// The part of `ty`, if the entity has one.
    pub fn part(&self, ty: EntityType) -> Option<&EntityName> {
        match ty {
            EntityType::User => self.user.as_ref(),
            EntityType::ClientId => self.client_id.as_ref(),
            EntityType::Ip => self.ip.as_ref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entities_need_a_type_no_repeats_and_ip_alone() {
        assert!(QuotaEntity::from_parts([]).is_err());
        assert!(QuotaEntity::from_parts([("user", Some("a")), ("user", Some("b"))]).is_err());
        assert!(QuotaEntity::from_parts([("ip", Some("1.2.3.4")), ("user", Some("a"))]).is_err());
        assert!(QuotaEntity::from_parts([("group", Some("g"))]).is_err());
        assert!(QuotaEntity::from_parts([("user", Some(""))]).is_err());
        let e = QuotaEntity::from_parts([("client-id", None), ("user", Some("alice"))]).unwrap();
        assert_eq!(e.user, Some(EntityName::Named("alice".into())));
        assert_eq!(e.client_id, Some(EntityName::Default));
    }
}
