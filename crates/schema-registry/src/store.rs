//! The registry's state as the `_schemas` records build it: subjects and their versions,
//! schemas by id, compatibility levels and modes. A plain struct: records go in through
//! [`Store::apply`] in log order, questions are answered from memory, and nothing here does
//! I/O, so replaying the topic from the start rebuilds exactly the state that was served.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::compat::Level;
use crate::error::RegistryError;
use crate::records::{
    ConfigValue, DeleteSubjectValue, IdHighWaterValue, Key, ModeValue, Record, Reference,
    SchemaValue,
};
use crate::schema::{canonical_of_text, Resolved, SchemaType};

/// Most schemas one schema may reference, transitively.
pub const MAX_REFERENCES: usize = 1_000;
/// Deepest chain of references followed.
pub const MAX_REFERENCE_DEPTH: usize = 32;

/// What makes two registrations the same schema (and so the same id).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    /// Type.
    pub schema_type: SchemaType,
    /// Canonical text (JSON with sorted keys).
    pub canonical: String,
    /// References, as given.
    pub references: Vec<Reference>,
}

/// A schema as stored under its id.
#[derive(Debug, Clone)]
pub struct StoredSchema {
    /// Global id.
    pub id: i32,
    /// Type.
    pub schema_type: SchemaType,
    /// Text as served.
    pub text: String,
    /// References.
    pub references: Vec<Reference>,
    /// Identity.
    pub identity: Identity,
}

/// One version of a subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    /// Schema id.
    pub id: i32,
    /// Soft-deleted.
    pub deleted: bool,
}

/// A registry mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Reads and writes.
    #[default]
    ReadWrite,
    /// Reads only.
    ReadOnly,
    /// Reads only, and so for subjects below it whatever they say.
    ReadOnlyOverride,
    /// Writes with given ids and versions, without compatibility checks.
    Import,
}

impl Mode {
    /// Reads a mode (any case).
    pub fn parse(name: &str) -> Result<Self, RegistryError> {
        Ok(match name.to_ascii_uppercase().as_str() {
            "READWRITE" => Mode::ReadWrite,
            "READONLY" => Mode::ReadOnly,
            "READONLY_OVERRIDE" => Mode::ReadOnlyOverride,
            "IMPORT" => Mode::Import,
            _ => return Err(RegistryError::InvalidMode(name.to_string())),
        })
    }

    /// Its name in the API.
    pub fn name(self) -> &'static str {
        match self {
            Mode::ReadWrite => "READWRITE",
            Mode::ReadOnly => "READONLY",
            Mode::ReadOnlyOverride => "READONLY_OVERRIDE",
            Mode::Import => "IMPORT",
        }
    }

    /// Whether writes are refused.
    pub fn read_only(self) -> bool {
        matches!(self, Mode::ReadOnly | Mode::ReadOnlyOverride)
    }
}

/// A version asked for: a number or the latest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionSpec {
    /// The highest version.
    Latest,
    /// This version.
    Number(i32),
}

impl VersionSpec {
    /// Reads `latest`, `-1` or a number from 1 to 2^31-1.
    pub fn parse(s: &str) -> Result<Self, RegistryError> {
        if s == "latest" || s == "-1" {
            return Ok(VersionSpec::Latest);
        }
        match s.parse::<i32>() {
            Ok(v) if v >= 1 => Ok(VersionSpec::Number(v)),
            _ => Err(RegistryError::InvalidVersion(s.to_string())),
        }
    }
}

/// The registry's state.
#[derive(Debug, Default)]
pub struct Store {
    subjects: BTreeMap<String, BTreeMap<i32, Version>>,
    schemas: BTreeMap<i32, Arc<StoredSchema>>,
    by_identity: HashMap<Identity, i32>,
    /// How many subject versions use each id.
    uses: HashMap<i32, usize>,
    configs: BTreeMap<Option<String>, ConfigValue>,
    modes: BTreeMap<Option<String>, Mode>,
    /// Highest id ever seen, in a SCHEMA record or a SPATE_ID_HIGH_WATER record (so ids are
    /// not reused, across restarts and compaction too).
    max_id: i32,
    /// Offset of the next record to apply.
    pub next_offset: i64,
    /// Records that could not be read (skipped).
    pub skipped: u64,
}

impl Store {
    /// Applies one `_schemas` record.
    pub fn apply(&mut self, key: Option<&[u8]>, value: Option<&[u8]>) {
        let Some(key) = key else {
            self.skipped += 1;
            return;
        };
        let key = match Key::decode(key) {
            Ok(Some(k)) => k,
            Ok(None) => return,
            Err(_) => {
                self.skipped += 1;
                return;
            }
        };
        let ok = match key {
            Key::Schema { subject, version } => match value {
                None => {
                    self.remove_version(&subject, version);
                    true
                }
                Some(v) => match serde_json::from_slice::<SchemaValue>(v) {
                    Ok(v) => self.put_version(subject, version, v),
                    Err(_) => false,
                },
            },
            Key::Config { subject } => match value {
                None => {
                    self.configs.remove(&subject);
                    true
                }
                Some(v) => match serde_json::from_slice::<ConfigValue>(v) {
                    Ok(c) => {
                        self.configs.insert(subject, c);
                        true
                    }
                    Err(_) => false,
                },
            },
            Key::Mode { subject } => match value {
                None => {
                    self.modes.remove(&subject);
                    true
                }
                Some(v) => match serde_json::from_slice::<ModeValue>(v)
                    .ok()
                    .and_then(|m| Mode::parse(&m.mode).ok())
                {
                    Some(m) => {
                        self.modes.insert(subject, m);
                        true
                    }
                    None => false,
                },
            },
            Key::DeleteSubject { subject } => match value {
                None => true,
                Some(v) => match serde_json::from_slice::<DeleteSubjectValue>(v) {
                    Ok(d) => {
                        if let Some(versions) = self.subjects.get_mut(&subject) {
                            for (_, ver) in versions.range_mut(..=d.version) {
                                ver.deleted = true;
                            }
                        }
                        true
                    }
                    Err(_) => false,
                },
            },
            Key::ClearSubject { subject } => {
                // Removes what was soft-deleted; live versions stay.
                let gone: Vec<i32> = self
                    .subjects
                    .get(&subject)
                    .map(|vs| {
                        vs.iter()
                            .filter(|(_, v)| v.deleted)
                            .map(|(n, _)| *n)
                            .collect()
                    })
                    .unwrap_or_default();
                for v in gone {
                    self.remove_version(&subject, v);
                }
                true
            }
            Key::Noop => true,
            Key::IdHighWater => match value {
                None => true,
                Some(v) => match serde_json::from_slice::<IdHighWaterValue>(v) {
                    Ok(h) => {
                        self.max_id = self.max_id.max(h.id);
                        true
                    }
                    Err(_) => false,
                },
            },
        };
        if !ok {
            self.skipped += 1;
        }
    }

    fn put_version(&mut self, subject: String, version: i32, v: SchemaValue) -> bool {
        let Ok(schema_type) = SchemaType::parse(v.schema_type.as_deref()) else {
            return false;
        };
        let entry = Version {
            id: v.id,
            deleted: v.deleted,
        };
        let previous = self
            .subjects
            .entry(subject)
            .or_default()
            .insert(version, entry);
        if let Some(p) = previous {
            self.release(p.id);
        }
        *self.uses.entry(v.id).or_default() += 1;
        self.max_id = self.max_id.max(v.id);
        if !self.schemas.contains_key(&v.id) {
            let identity = Identity {
                schema_type,
                canonical: self.stored_canonical(schema_type, &v.schema, &v.references),
                references: v.references.clone(),
            };
            self.by_identity.entry(identity.clone()).or_insert(v.id);
            self.schemas.insert(
                v.id,
                Arc::new(StoredSchema {
                    id: v.id,
                    schema_type,
                    text: v.schema,
                    references: v.references,
                    identity,
                }),
            );
        }
        true
    }

    /// The canonical form a stored schema is known by. A Protobuf schema this registry wrote
    /// is stored in its canonical text already, but one moved in from another registry keeps
    /// that registry's text (layout, comments, relative names), so it is parsed to find the
    /// form a registration here computes; text that does not parse keeps itself.
    fn stored_canonical(&self, schema_type: SchemaType, text: &str, refs: &[Reference]) -> String {
        if schema_type == SchemaType::Protobuf {
            let parsed = self
                .resolve(refs)
                .ok()
                .and_then(|resolved| crate::protobuf::parse(text, &resolved).ok());
            if let Some(model) = parsed {
                return model.canonical();
            }
        }
        canonical_of_text(text)
    }

    fn remove_version(&mut self, subject: &str, version: i32) {
        let Some(versions) = self.subjects.get_mut(subject) else {
            return;
        };
        let removed = versions.remove(&version);
        if versions.is_empty() {
            self.subjects.remove(subject);
        }
        if let Some(v) = removed {
            self.release(v.id);
        }
    }

    /// One fewer version uses `id`; the schema goes when none does.
    fn release(&mut self, id: i32) {
        let left = match self.uses.get_mut(&id) {
            Some(n) => {
                *n = n.saturating_sub(1);
                *n
            }
            None => 0,
        };
        if left == 0 {
            self.uses.remove(&id);
            if let Some(s) = self.schemas.remove(&id) {
                if self.by_identity.get(&s.identity) == Some(&id) {
                    self.by_identity.remove(&s.identity);
                }
            }
        }
    }

    /// Subjects with a live version (or any version, with `deleted`), sorted.
    pub fn subjects(&self, deleted: bool) -> Vec<String> {
        self.subjects
            .iter()
            .filter(|(_, vs)| deleted || vs.values().any(|v| !v.deleted))
            .map(|(s, _)| s.clone())
            .collect()
    }

    /// How many subjects have a live version.
    pub fn live_subjects(&self) -> usize {
        self.subjects
            .values()
            .filter(|vs| vs.values().any(|v| !v.deleted))
            .count()
    }

    /// How many schemas (ids) are stored.
    pub fn schema_count(&self) -> usize {
        self.schemas.len()
    }

    /// Whether no subject has any version.
    pub fn is_empty(&self) -> bool {
        self.subjects.is_empty()
    }

    /// A subject's versions (live ones, or all with `deleted`).
    pub fn versions(
        &self,
        subject: &str,
        deleted: bool,
    ) -> Result<Vec<(i32, Version)>, RegistryError> {
        let list: Vec<(i32, Version)> = self
            .subjects
            .get(subject)
            .map(|vs| {
                vs.iter()
                    .filter(|(_, v)| deleted || !v.deleted)
                    .map(|(n, v)| (*n, *v))
                    .collect()
            })
            .unwrap_or_default();
        if list.is_empty() {
            return Err(RegistryError::SubjectNotFound(subject.to_string()));
        }
        Ok(list)
    }

    /// Whether the subject has any version, live or soft-deleted.
    pub fn has_subject(&self, subject: &str) -> bool {
        self.subjects.contains_key(subject)
    }

    /// One version of a subject (soft-deleted ones too with `deleted`).
    pub fn version(
        &self,
        subject: &str,
        spec: VersionSpec,
        deleted: bool,
    ) -> Result<(i32, Version), RegistryError> {
        let versions = self.versions(subject, deleted)?;
        let found = match spec {
            VersionSpec::Latest => versions.last().copied(),
            VersionSpec::Number(n) => versions.iter().find(|(v, _)| *v == n).copied(),
        };
        found.ok_or_else(|| RegistryError::VersionNotFound {
            subject: subject.to_string(),
            version: match spec {
                VersionSpec::Latest => "latest".into(),
                VersionSpec::Number(n) => n.to_string(),
            },
        })
    }

    /// The highest version the subject ever had (soft-deleted included), 0 for none.
    pub fn last_version(&self, subject: &str) -> i32 {
        self.subjects
            .get(subject)
            .and_then(|vs| vs.keys().next_back().copied())
            .unwrap_or(0)
    }

    /// The schema with this id.
    pub fn schema(&self, id: i32) -> Option<&Arc<StoredSchema>> {
        self.schemas.get(&id)
    }

    /// Schemas by id, from `after` on.
    pub fn schemas(&self) -> impl Iterator<Item = &Arc<StoredSchema>> {
        self.schemas.values()
    }

    /// The id of a schema with this identity, if one is stored.
    pub fn id_of(&self, identity: &Identity) -> Option<i32> {
        self.by_identity.get(identity).copied()
    }

    /// A record of the highest id handed out, for a permanent delete to write: it outlives
    /// the deleted versions' records once compaction removes them.
    pub fn id_high_water(&self) -> Record {
        Record::new(&Key::IdHighWater, &IdHighWaterValue { id: self.max_id })
    }

    /// The id the next new schema gets.
    pub fn next_id(&self) -> i32 {
        self.max_id.saturating_add(1)
    }

    /// The version of `subject` holding a schema with this identity (live only unless
    /// `deleted`), newest first.
    pub fn find_in_subject(
        &self,
        subject: &str,
        identity: &Identity,
        deleted: bool,
    ) -> Option<(i32, i32)> {
        let versions = self.subjects.get(subject)?;
        versions
            .iter()
            .rev()
            .filter(|(_, v)| deleted || !v.deleted)
            .find(|(_, v)| {
                self.schemas
                    .get(&v.id)
                    .is_some_and(|s| s.identity == *identity)
            })
            .map(|(n, v)| (*n, v.id))
    }

    /// (subject, version) pairs using `id` (live ones, or all with `deleted`).
    pub fn uses_of(&self, id: i32, deleted: bool) -> Vec<(String, i32)> {
        let mut out = Vec::new();
        for (subject, versions) in &self.subjects {
            for (n, v) in versions {
                if v.id == id && (deleted || !v.deleted) {
                    out.push((subject.clone(), *n));
                }
            }
        }
        out
    }

    /// Ids of the schemas with a live version that reference `subject` `version`.
    pub fn referenced_by(&self, subject: &str, version: i32) -> Vec<i32> {
        self.schemas
            .values()
            .filter(|s| {
                s.references
                    .iter()
                    .any(|r| r.subject == subject && r.version == version)
            })
            .filter(|s| !self.uses_of(s.id, false).is_empty())
            .map(|s| s.id)
            .collect()
    }

    /// The compatibility level that applies to `subject` (its own, else the global one, else
    /// BACKWARD).
    pub fn level(&self, subject: Option<&str>) -> Level {
        let own = subject.and_then(|s| self.configs.get(&Some(s.to_string())));
        own.and_then(|c| c.compatibility.as_deref())
            .or_else(|| {
                self.configs
                    .get(&None)
                    .and_then(|c| c.compatibility.as_deref())
            })
            .and_then(|l| Level::parse(l).ok())
            .unwrap_or_default()
    }

    /// Whether schemas of `subject` are normalized by default.
    pub fn normalizes(&self, subject: &str) -> bool {
        self.configs
            .get(&Some(subject.to_string()))
            .and_then(|c| c.normalize)
            .or_else(|| self.configs.get(&None).and_then(|c| c.normalize))
            .unwrap_or(false)
    }

    /// The config set at this level (`None`: global), if any.
    pub fn config(&self, subject: Option<&str>) -> Option<&ConfigValue> {
        self.configs.get(&subject.map(String::from))
    }

    /// The mode set at this level (`None`: global), if any.
    pub fn own_mode(&self, subject: Option<&str>) -> Option<Mode> {
        self.modes.get(&subject.map(String::from)).copied()
    }

    /// The mode that applies to `subject`: a global READONLY_OVERRIDE, else its own, else the
    /// global one, else READWRITE.
    pub fn mode(&self, subject: &str) -> Mode {
        let global = self.own_mode(None);
        if global == Some(Mode::ReadOnlyOverride) {
            return Mode::ReadOnlyOverride;
        }
        self.own_mode(Some(subject)).or(global).unwrap_or_default()
    }

    /// The schemas `refs` point at, transitively, each once, referenced ones before those
    /// referencing them; a missing one or a cycle makes the schema invalid.
    pub fn resolve(&self, refs: &[Reference]) -> Result<Vec<Resolved>, RegistryError> {
        let mut out = Vec::new();
        let mut done = std::collections::HashSet::new();
        let mut path = Vec::new();
        for r in refs {
            self.resolve_one(r, &mut out, &mut done, &mut path)?;
        }
        Ok(out)
    }

    fn resolve_one(
        &self,
        r: &Reference,
        out: &mut Vec<Resolved>,
        done: &mut std::collections::HashSet<(String, i32)>,
        path: &mut Vec<(String, i32)>,
    ) -> Result<(), RegistryError> {
        let at = (r.subject.clone(), r.version);
        if path.contains(&at) {
            return Err(RegistryError::InvalidSchema(format!(
                "cyclic reference through subject '{}' version {}",
                r.subject, r.version
            )));
        }
        if done.contains(&at) {
            return Ok(());
        }
        if path.len() >= MAX_REFERENCE_DEPTH || out.len() >= MAX_REFERENCES {
            return Err(RegistryError::InvalidSchema(format!(
                "references nest deeper than {MAX_REFERENCE_DEPTH} or number more than {MAX_REFERENCES}"
            )));
        }
        let missing = || {
            RegistryError::InvalidSchema(format!(
                "reference '{}' names subject '{}' version {}, which does not exist",
                r.name, r.subject, r.version
            ))
        };
        let spec = if r.version == -1 {
            VersionSpec::Latest
        } else {
            VersionSpec::Number(r.version)
        };
        let (_, v) = self
            .version(&r.subject, spec, true)
            .map_err(|_| missing())?;
        let schema = self.schema(v.id).ok_or_else(missing)?;
        path.push(at.clone());
        for inner in &schema.references {
            self.resolve_one(inner, out, done, path)?;
        }
        path.pop();
        done.insert(at);
        out.push(Resolved {
            name: r.name.clone(),
            schema_type: schema.schema_type,
            text: schema.text.clone(),
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::ClearSubjectValue;

    fn schema_record(subject: &str, version: i32, id: i32, text: &str, deleted: bool) -> Record {
        Record::new(
            &Key::Schema {
                subject: subject.into(),
                version,
            },
            &SchemaValue {
                subject: subject.into(),
                version,
                id,
                schema_type: None,
                references: vec![],
                schema: text.into(),
                deleted,
            },
        )
    }

    fn apply(store: &mut Store, r: &Record) {
        store.apply(Some(&r.key), r.value.as_deref());
    }

    #[test]
    fn the_same_schema_in_two_subjects_shares_its_id_and_each_subject_counts_versions() {
        let mut s = Store::default();
        apply(&mut s, &schema_record("a", 1, 1, r#""string""#, false));
        apply(&mut s, &schema_record("b", 1, 1, r#""string""#, false));
        apply(&mut s, &schema_record("a", 2, 2, r#""long""#, false));
        assert_eq!(s.subjects(false), vec!["a", "b"]);
        assert_eq!(s.uses_of(1, false), vec![("a".into(), 1), ("b".into(), 1)]);
        assert_eq!(s.next_id(), 3);
        assert_eq!(s.last_version("a"), 2);
        assert_eq!(s.version("a", VersionSpec::Latest, false).unwrap().1.id, 2);
    }

    #[test]
    fn soft_deletes_hide_versions_and_permanent_deletes_remove_them() {
        let mut s = Store::default();
        apply(&mut s, &schema_record("a", 1, 1, r#""string""#, false));
        apply(&mut s, &schema_record("a", 2, 2, r#""long""#, false));
        apply(
            &mut s,
            &Record::new(
                &Key::DeleteSubject {
                    subject: "a".into(),
                },
                &DeleteSubjectValue {
                    subject: "a".into(),
                    version: 2,
                },
            ),
        );
        assert!(s.subjects(false).is_empty());
        assert_eq!(s.subjects(true), vec!["a"]);
        assert_eq!(
            s.versions("a", false).unwrap_err(),
            RegistryError::SubjectNotFound("a".into())
        );
        assert!(s.schema(2).is_some(), "soft-deleted schemas keep their ids");
        // Permanent: tombstones, then CLEAR_SUBJECT.
        apply(
            &mut s,
            &Record::tombstone(&Key::Schema {
                subject: "a".into(),
                version: 1,
            }),
        );
        apply(
            &mut s,
            &Record::new(
                &Key::ClearSubject {
                    subject: "a".into(),
                },
                &ClearSubjectValue {
                    subject: "a".into(),
                },
            ),
        );
        assert!(s.subjects(true).is_empty());
        assert!(s.schema(1).is_none() && s.schema(2).is_none());
        assert_eq!(s.next_id(), 3, "ids are not reused");
        // A new registration starts the subject at version 1 again.
        assert_eq!(s.last_version("a"), 0);
    }

    #[test]
    fn configs_and_modes_fall_back_from_subject_to_global_to_default() {
        let mut s = Store::default();
        assert_eq!(s.level(Some("a")), Level::Backward);
        apply(
            &mut s,
            &Record::new(
                &Key::Config { subject: None },
                &ConfigValue {
                    compatibility: Some("FULL".into()),
                    normalize: None,
                },
            ),
        );
        apply(
            &mut s,
            &Record::new(
                &Key::Config {
                    subject: Some("a".into()),
                },
                &ConfigValue {
                    compatibility: Some("NONE".into()),
                    normalize: Some(true),
                },
            ),
        );
        assert_eq!(s.level(Some("a")), Level::None);
        assert_eq!(s.level(Some("b")), Level::Full);
        assert!(s.normalizes("a") && !s.normalizes("b"));
        apply(
            &mut s,
            &Record::tombstone(&Key::Config {
                subject: Some("a".into()),
            }),
        );
        assert_eq!(s.level(Some("a")), Level::Full);
        apply(
            &mut s,
            &Record::new(
                &Key::Mode {
                    subject: Some("a".into()),
                },
                &ModeValue {
                    mode: "READONLY".into(),
                },
            ),
        );
        assert_eq!(s.mode("a"), Mode::ReadOnly);
        assert_eq!(s.mode("b"), Mode::ReadWrite);
        apply(
            &mut s,
            &Record::new(
                &Key::Mode { subject: None },
                &ModeValue {
                    mode: "READONLY_OVERRIDE".into(),
                },
            ),
        );
        assert_eq!(s.mode("b"), Mode::ReadOnlyOverride);
    }

    #[test]
    fn unreadable_records_are_skipped_and_counted() {
        let mut s = Store::default();
        s.apply(Some(b"garbage"), Some(b"x"));
        s.apply(None, Some(b"x"));
        s.apply(
            Some(
                &Key::Schema {
                    subject: "a".into(),
                    version: 1,
                }
                .encode(),
            ),
            Some(b"{not json"),
        );
        s.apply(Some(br#"{"keytype":"FUTURE","magic":0}"#), Some(b"{}"));
        assert_eq!(s.skipped, 3);
        assert!(s.is_empty());
    }

    #[test]
    fn references_resolve_transitively_once_each_and_missing_ones_are_invalid() {
        let mut s = Store::default();
        apply(
            &mut s,
            &schema_record(
                "leaf",
                1,
                1,
                r#"{"type":"fixed","name":"L","size":1}"#,
                false,
            ),
        );
        let mid = SchemaValue {
            subject: "mid".into(),
            version: 1,
            id: 2,
            schema_type: None,
            references: vec![Reference {
                name: "L".into(),
                subject: "leaf".into(),
                version: 1,
            }],
            schema: r#"{"type":"record","name":"M","fields":[{"name":"l","type":"L"}]}"#.into(),
            deleted: false,
        };
        apply(
            &mut s,
            &Record::new(
                &Key::Schema {
                    subject: "mid".into(),
                    version: 1,
                },
                &mid,
            ),
        );
        let refs = vec![
            Reference {
                name: "M".into(),
                subject: "mid".into(),
                version: 1,
            },
            Reference {
                name: "L".into(),
                subject: "leaf".into(),
                version: 1,
            },
        ];
        let resolved = s.resolve(&refs).unwrap();
        let names: Vec<&str> = resolved.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, vec!["L", "M"], "leaf first, each once");
        assert_eq!(s.referenced_by("leaf", 1), vec![2]);
        let missing = s
            .resolve(&[Reference {
                name: "X".into(),
                subject: "nope".into(),
                version: 1,
            }])
            .unwrap_err();
        assert_eq!(missing.error_code(), 42201);
    }

    #[test]
    fn a_cycle_of_references_read_from_the_log_makes_a_schema_invalid() {
        // The API cannot build a cycle (references must exist first), but records moved in
        // from elsewhere can hold one.
        let mut s = Store::default();
        for (subject, other, id) in [("a", "b", 1), ("b", "a", 2)] {
            let v = SchemaValue {
                subject: subject.into(),
                version: 1,
                id,
                schema_type: None,
                references: vec![Reference {
                    name: other.into(),
                    subject: other.into(),
                    version: 1,
                }],
                schema: format!(r#"{{"type":"fixed","name":"{subject}","size":1}}"#),
                deleted: false,
            };
            let key = Key::Schema {
                subject: subject.into(),
                version: 1,
            };
            apply(&mut s, &Record::new(&key, &v));
        }
        let e = s
            .resolve(&[Reference {
                name: "a".into(),
                subject: "a".into(),
                version: 1,
            }])
            .unwrap_err();
        assert_eq!(e.error_code(), 42201);
        assert!(e.to_string().contains("cyclic"), "{e}");
    }

    #[test]
    fn versions_are_parsed_as_latest_or_positive_numbers() {
        assert_eq!(VersionSpec::parse("latest").unwrap(), VersionSpec::Latest);
        assert_eq!(VersionSpec::parse("-1").unwrap(), VersionSpec::Latest);
        assert_eq!(VersionSpec::parse("3").unwrap(), VersionSpec::Number(3));
        for bad in ["0", "-2", "x", "2147483648"] {
            assert_eq!(VersionSpec::parse(bad).unwrap_err().error_code(), 42202);
        }
    }
}
