//! The records of the `_schemas` topic in Confluent's format: JSON keys naming what a record is
//! about (`keytype` SCHEMA, CONFIG, MODE, DELETE_SUBJECT, CLEAR_SUBJECT or NOOP) and JSON
//! values, so a registry's data can be moved between spate and other Confluent-compatible
//! registries by copying the topic. One key type is spate's own, SPATE_ID_HIGH_WATER (see
//! [`Key::IdHighWater`]); registries that do not know it skip it.
//!
//! Keys are written with their fields in one fixed order, so the same logical key is always
//! the same bytes and compaction keeps only its latest record.

use serde::{Deserialize, Serialize};

/// The compacted topic the registry keeps its state in.
pub const TOPIC: &str = "_schemas";

/// The key type of [`Key::IdHighWater`], named as spate's so no other registry's type collides.
const ID_HIGH_WATER: &str = "SPATE_ID_HIGH_WATER";

/// What a `_schemas` record is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// One version of a subject; the value is a [`SchemaValue`], a tombstone deletes it for good.
    Schema {
        /// Subject.
        subject: String,
        /// Version in the subject.
        version: i32,
    },
    /// The compatibility level of a subject, or the global one (`None`).
    Config {
        /// Subject, `None` for the global setting.
        subject: Option<String>,
    },
    /// The mode of a subject, or the global one (`None`).
    Mode {
        /// Subject, `None` for the global setting.
        subject: Option<String>,
    },
    /// A soft delete of a subject's versions up to the value's version.
    DeleteSubject {
        /// Subject.
        subject: String,
    },
    /// A permanent delete of a subject's versions.
    ClearSubject {
        /// Subject.
        subject: String,
    },
    /// A record with no effect (other registries write them to find the end of the topic).
    Noop,
    /// The highest schema id handed out so far ([`IdHighWaterValue`]). Written with every
    /// permanent delete: once compaction has removed a deleted version's SCHEMA record and its
    /// tombstone, this record is what keeps a restarted registry from handing that id out
    /// again (a record written with the old schema would then decode with the new one).
    IdHighWater,
}

/// A key as it is written: fields in the order Confluent writes them.
#[derive(Debug, Serialize, Deserialize)]
struct RawKey {
    keytype: String,
    #[serde(default, skip_serializing_if = "Skip::skip")]
    subject: Skip<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<i32>,
    #[serde(default)]
    magic: i32,
}

/// A key field that is left out (`Absent`), written as `null` (`Null`) or present.
#[derive(Debug, Default)]
enum Skip<T> {
    #[default]
    Absent,
    Null,
    Some(T),
}

impl<T> Skip<T> {
    fn skip(&self) -> bool {
        matches!(self, Skip::Absent)
    }

    fn into_option(self) -> Option<T> {
        match self {
            Skip::Some(v) => Some(v),
            _ => None,
        }
    }
}

impl<T: Serialize> Serialize for Skip<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Skip::Some(v) => v.serialize(s),
            _ => s.serialize_none(),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Skip<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Option::<T>::deserialize(d)? {
            Some(v) => Skip::Some(v),
            None => Skip::Null,
        })
    }
}

impl Key {
    /// The key's JSON bytes.
    pub fn encode(&self) -> Vec<u8> {
        let raw = match self {
            Key::Schema { subject, version } => RawKey {
                keytype: "SCHEMA".into(),
                subject: Skip::Some(subject.clone()),
                version: Some(*version),
                magic: 1,
            },
            Key::Config { subject } => RawKey {
                keytype: "CONFIG".into(),
                subject: subject.clone().map_or(Skip::Null, Skip::Some),
                version: None,
                magic: 0,
            },
            Key::Mode { subject } => RawKey {
                keytype: "MODE".into(),
                subject: subject.clone().map_or(Skip::Null, Skip::Some),
                version: None,
                magic: 0,
            },
            Key::DeleteSubject { subject } => RawKey {
                keytype: "DELETE_SUBJECT".into(),
                subject: Skip::Some(subject.clone()),
                version: None,
                magic: 0,
            },
            Key::ClearSubject { subject } => RawKey {
                keytype: "CLEAR_SUBJECT".into(),
                subject: Skip::Some(subject.clone()),
                version: None,
                magic: 0,
            },
            Key::Noop => RawKey {
                keytype: "NOOP".into(),
                subject: Skip::Absent,
                version: None,
                magic: 0,
            },
            Key::IdHighWater => RawKey {
                keytype: ID_HIGH_WATER.into(),
                subject: Skip::Absent,
                version: None,
                magic: 0,
            },
        };
        // A struct of strings and integers always serializes.
        serde_json::to_vec(&raw).unwrap_or_default()
    }

    /// Reads a key; `Ok(None)` for a key type this registry does not know (skipped).
    pub fn decode(bytes: &[u8]) -> Result<Option<Key>, String> {
        let raw: RawKey = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let subject = raw.subject.into_option();
        let need =
            |s: Option<String>| s.ok_or_else(|| format!("{} key without a subject", raw.keytype));
        Ok(Some(match raw.keytype.as_str() {
            "SCHEMA" => Key::Schema {
                subject: need(subject)?,
                version: raw.version.ok_or("SCHEMA key without a version")?,
            },
            "CONFIG" => Key::Config { subject },
            "MODE" => Key::Mode { subject },
            "DELETE_SUBJECT" => Key::DeleteSubject {
                subject: need(subject)?,
            },
            "CLEAR_SUBJECT" => Key::ClearSubject {
                subject: need(subject)?,
            },
            "NOOP" => Key::Noop,
            ID_HIGH_WATER => Key::IdHighWater,
            _ => return Ok(None),
        }))
    }
}

/// A reference from a schema to a version of another subject, by the name the schema uses.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Reference {
    /// The name the referencing schema uses (an Avro full name, a JSON Schema `$ref` target).
    pub name: String,
    /// Subject of the referenced schema.
    pub subject: String,
    /// Version of the referenced schema.
    pub version: i32,
}

/// The value of a SCHEMA record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaValue {
    /// Subject.
    pub subject: String,
    /// Version.
    pub version: i32,
    /// Global schema id.
    pub id: i32,
    /// AVRO (also when absent), JSON or PROTOBUF.
    #[serde(
        rename = "schemaType",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub schema_type: Option<String>,
    /// Schemas this one references.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub references: Vec<Reference>,
    /// The schema text.
    pub schema: String,
    /// Soft-deleted.
    #[serde(default)]
    pub deleted: bool,
}

/// The value of a CONFIG record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigValue {
    /// Compatibility level.
    #[serde(
        rename = "compatibilityLevel",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub compatibility: Option<String>,
    /// Whether schemas are normalized by default when registered or looked up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normalize: Option<bool>,
}

/// The value of a MODE record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModeValue {
    /// READWRITE, READONLY, READONLY_OVERRIDE or IMPORT.
    pub mode: String,
}

/// The value of a DELETE_SUBJECT record: versions up to `version` are soft-deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteSubjectValue {
    /// Subject.
    pub subject: String,
    /// Highest version deleted.
    pub version: i32,
}

/// The value of a SPATE_ID_HIGH_WATER record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdHighWaterValue {
    /// The highest schema id handed out when the record was written.
    pub id: i32,
}

/// The value of a CLEAR_SUBJECT record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClearSubjectValue {
    /// Subject.
    pub subject: String,
}

/// One record to write: key and value bytes (`None`: a tombstone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Key bytes.
    pub key: Vec<u8>,
    /// Value bytes; `None` deletes the key.
    pub value: Option<Vec<u8>>,
}

impl Record {
    /// A record of `key` with `value` serialized as JSON.
    pub fn new<T: Serialize>(key: &Key, value: &T) -> Self {
        Self {
            key: key.encode(),
            // Plain data structs always serialize.
            value: Some(serde_json::to_vec(value).unwrap_or_default()),
        }
    }

    /// A tombstone of `key`.
    pub fn tombstone(key: &Key) -> Self {
        Self {
            key: key.encode(),
            value: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_written_with_fields_in_confluents_order() {
        let k = Key::Schema {
            subject: "orders-value".into(),
            version: 3,
        };
        assert_eq!(
            String::from_utf8(k.encode()).unwrap(),
            r#"{"keytype":"SCHEMA","subject":"orders-value","version":3,"magic":1}"#
        );
        assert_eq!(
            String::from_utf8(Key::Config { subject: None }.encode()).unwrap(),
            r#"{"keytype":"CONFIG","subject":null,"magic":0}"#
        );
        assert_eq!(
            String::from_utf8(Key::Noop.encode()).unwrap(),
            r#"{"keytype":"NOOP","magic":0}"#
        );
        assert_eq!(
            String::from_utf8(Key::IdHighWater.encode()).unwrap(),
            r#"{"keytype":"SPATE_ID_HIGH_WATER","magic":0}"#
        );
    }

    #[test]
    fn every_key_reads_back_as_written() {
        for k in [
            Key::Schema {
                subject: "a".into(),
                version: 1,
            },
            Key::Config { subject: None },
            Key::Config {
                subject: Some("a".into()),
            },
            Key::Mode { subject: None },
            Key::Mode {
                subject: Some("a".into()),
            },
            Key::DeleteSubject {
                subject: "a".into(),
            },
            Key::ClearSubject {
                subject: "a".into(),
            },
            Key::Noop,
            Key::IdHighWater,
        ] {
            assert_eq!(Key::decode(&k.encode()).unwrap(), Some(k));
        }
    }

    #[test]
    fn keys_written_by_other_registries_are_read_and_unknown_kinds_skipped() {
        // Field order and an absent global subject do not matter.
        let k = Key::decode(br#"{"magic":0,"keytype":"CONFIG"}"#).unwrap();
        assert_eq!(k, Some(Key::Config { subject: None }));
        let k = Key::decode(br#"{"subject":"x","magic":1,"keytype":"SCHEMA","version":2}"#);
        assert_eq!(
            k.unwrap(),
            Some(Key::Schema {
                subject: "x".into(),
                version: 2
            })
        );
        assert_eq!(
            Key::decode(br#"{"keytype":"SOMETHING_NEW","magic":0}"#).unwrap(),
            None
        );
        assert!(Key::decode(b"not json").is_err());
        assert!(Key::decode(br#"{"keytype":"SCHEMA","magic":1,"version":1}"#).is_err());
    }

    #[test]
    fn schema_values_leave_out_the_avro_type_and_empty_references() {
        let v = SchemaValue {
            subject: "s".into(),
            version: 1,
            id: 7,
            schema_type: None,
            references: vec![],
            schema: "\"string\"".into(),
            deleted: false,
        };
        let json = String::from_utf8(Record::new(&Key::Noop, &v).value.unwrap()).unwrap();
        assert_eq!(
            json,
            r#"{"subject":"s","version":1,"id":7,"schema":"\"string\"","deleted":false}"#
        );
        let back: SchemaValue = serde_json::from_str(&json).unwrap();
        assert_eq!(back, v);
    }
}
