//! The registry: answers from the in-memory [`Store`], writes through the log.
//!
//! A write is decided on the state as of the log's end, appended to the log (acks=all), and
//! applied to the state only when read back from the log, like every other record. The state
//! is therefore always exactly what replaying the log gives, on this node after a restart and
//! on every other node reading its replica. Writes on one node are serialized by a lock so
//! each is decided on the state its predecessor left.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use crate::compat::{self, Level};
use crate::decode::RecordDecoder;
use crate::encode::RecordEncoder;
use crate::error::RegistryError;
use crate::forward::Writer;
use crate::log::SchemaLog;
use crate::metrics::RegistryMetrics;
use crate::records::{
    ClearSubjectValue, ConfigValue, DeleteSubjectValue, Key, ModeValue, Record, Reference,
    SchemaValue,
};
use crate::schema::{prepare, Parsed, Prepared, SchemaType};
use crate::store::{Identity, Mode, Store, Version, VersionSpec};

/// Longest a start waits for the `_schemas` topic before going on without it.
const START_PREPARE_WAIT: Duration = Duration::from_secs(5);
/// Parsed schemas kept for compatibility checks, at most; the cache is emptied when full.
const PARSED_CACHE_ENTRIES: usize = 1_024;
/// Record encoders kept for HTTP ingest, at most; the cache is emptied when full.
const ENCODER_CACHE_ENTRIES: usize = 256;
/// Record decoders kept for search, at most; the cache is emptied when full.
const DECODER_CACHE_ENTRIES: usize = 1_024;

/// The registry's state as `/admin` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// Whether this node takes writes (it leads `_schemas`, or runs alone).
    pub leader: bool,
    /// The node writes are forwarded to, when another one leads `_schemas`.
    pub writer: Option<i32>,
    /// Subjects with a live version.
    pub subjects: usize,
    /// Schemas stored (distinct ids).
    pub schemas: usize,
    /// The id the next new schema gets.
    pub next_id: i32,
    /// The global mode.
    pub mode: &'static str,
    /// The global compatibility level.
    pub compatibility: &'static str,
    /// Offset of the next `_schemas` record to apply.
    pub applied_offset: i64,
}

/// The registry's limits.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Largest request body, in bytes (larger ones are answered 413).
    pub max_body_bytes: usize,
    /// Largest schema text, in bytes (larger ones are invalid, 42201).
    pub max_schema_bytes: usize,
    /// Longest a write may wait for the log to take it.
    pub write_timeout: Duration,
    /// Longest a client may take to send a request body (408 after).
    pub body_timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_body_bytes: 16 << 20,
            // Escaped inside the record's JSON value a schema at most doubles (quotes and
            // backslashes); this keeps every record well under the topic's message limit.
            max_schema_bytes: 4 << 20,
            write_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// A schema as clients send it to register, look up or check.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SchemaRequest {
    /// The schema text.
    pub schema: Option<String>,
    /// AVRO (default), JSON or PROTOBUF.
    #[serde(rename = "schemaType")]
    pub schema_type: Option<String>,
    /// Schemas it references.
    pub references: Option<Vec<Reference>>,
    /// The id to register under (IMPORT mode only).
    pub id: Option<i32>,
    /// The version to register as (IMPORT mode only).
    pub version: Option<i32>,
}

/// A subject version as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SchemaAnswer {
    /// Subject.
    pub subject: String,
    /// Version.
    pub version: i32,
    /// Schema id.
    pub id: i32,
    /// Type, left out for AVRO.
    #[serde(rename = "schemaType", skip_serializing_if = "Option::is_none")]
    pub schema_type: Option<String>,
    /// References, left out when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub references: Vec<Reference>,
    /// Schema text.
    pub schema: String,
}

/// A schema by id as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ByIdAnswer {
    /// Type, left out for AVRO.
    #[serde(rename = "schemaType", skip_serializing_if = "Option::is_none")]
    pub schema_type: Option<String>,
    /// References, left out when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub references: Vec<Reference>,
    /// Schema text.
    pub schema: String,
}

/// A config change as clients send it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConfigRequest {
    /// Compatibility level.
    pub compatibility: Option<String>,
    /// The same, as GET answers name it (accepted too).
    #[serde(rename = "compatibilityLevel")]
    pub compatibility_level: Option<String>,
    /// Whether schemas are normalized by default.
    pub normalize: Option<bool>,
}

/// A config as GET (and DELETE) answer it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigAnswer {
    /// Compatibility level.
    #[serde(rename = "compatibilityLevel")]
    pub compatibility_level: String,
    /// Whether schemas are normalized by default, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalize: Option<bool>,
}

/// A config as PUT answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigUpdate {
    /// Compatibility level.
    pub compatibility: String,
    /// Whether schemas are normalized by default, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalize: Option<bool>,
}

/// A subject version using a schema id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SubjectVersion {
    /// Subject.
    pub subject: String,
    /// Version.
    pub version: i32,
}

/// The schema registry of one node.
pub struct Registry {
    log: Arc<dyn SchemaLog>,
    state: RwLock<Store>,
    /// One catch-up at a time, so no record is applied twice.
    reading: Mutex<()>,
    /// One write at a time on this node, each decided on the state the previous one left.
    writer: tokio::sync::Mutex<()>,
    parsed: Mutex<HashMap<i32, Arc<Parsed>>>,
    /// Encoders of schemas HTTP ingest wrote records with, by id.
    encoders: Mutex<HashMap<i32, Arc<RecordEncoder>>>,
    /// Decoders of schemas search read records with, by id (a schema that cannot be read
    /// keeps its reason, so it is not parsed again for every record).
    decoders: Mutex<HashMap<i32, Result<Arc<RecordDecoder>, String>>>,
    /// Ids of schema texts HTTP ingest found or registered, by subject, type and text, so a
    /// request repeating its schema is not parsed again.
    ingest_ids: Mutex<HashMap<(String, SchemaType, String), i32>>,
    settings: Settings,
    /// Counters for `/metrics`.
    pub metrics: RegistryMetrics,
}

impl Registry {
    /// A registry over `log`, with nothing read yet.
    pub fn new(log: Arc<dyn SchemaLog>, settings: Settings) -> Arc<Self> {
        Arc::new(Self {
            log,
            state: RwLock::new(Store::default()),
            reading: Mutex::new(()),
            writer: tokio::sync::Mutex::new(()),
            parsed: Mutex::new(HashMap::new()),
            encoders: Mutex::new(HashMap::new()),
            decoders: Mutex::new(HashMap::new()),
            ingest_ids: Mutex::new(HashMap::new()),
            settings,
            metrics: RegistryMetrics::default(),
        })
    }

    /// A registry over `log` that has read it to its end, and keeps reading it in the
    /// background (what other nodes write, or what reaches the topic otherwise) until it is
    /// dropped.
    pub async fn start(log: Arc<dyn SchemaLog>, settings: Settings) -> Arc<Self> {
        let me = Self::new(log, settings);
        // In a cluster the topic is created through the metadata quorum, which may not answer
        // yet while the node starts: the start does not wait long for it.
        let first = tokio::time::timeout(START_PREPARE_WAIT, me.log.prepare()).await;
        let prepared = match first {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "schema registry: the _schemas topic is not ready yet; retrying in the background");
                false
            }
            Err(_) => {
                tracing::warn!("schema registry: the _schemas topic is not ready yet; retrying in the background");
                false
            }
        };
        // The first replay reads and parses the whole topic: on the blocking pool, not on a
        // runtime worker.
        let replay = me.clone();
        let first = tokio::task::spawn_blocking(move || replay.catch_up()).await;
        match first {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "schema registry: reading _schemas failed; retrying in the background")
            }
            Err(e) => {
                tracing::warn!(error = %e, "schema registry: reading _schemas failed; retrying in the background")
            }
        }
        me.spawn_tailer(prepared);
        me
    }

    /// The limits in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Which node takes writes now.
    pub fn writer(&self) -> Writer {
        self.log.writer()
    }

    /// The id the next new schema would get here (one above the highest known).
    pub fn next_id(&self) -> i32 {
        self.state.read().next_id()
    }

    /// What `/admin` shows of the registry: who takes writes, how much it holds, its global
    /// mode and compatibility level.
    pub fn status(&self) -> Status {
        let writer = self.writer();
        let st = self.state.read();
        Status {
            leader: writer == Writer::Here,
            writer: match writer {
                Writer::Here | Writer::Nobody => None,
                Writer::Node(n) => Some(n),
            },
            subjects: st.live_subjects(),
            schemas: st.schema_count(),
            next_id: st.next_id(),
            mode: st.own_mode(None).unwrap_or_default().name(),
            compatibility: st.level(None).name(),
            applied_offset: st.next_offset,
        }
    }

    fn spawn_tailer(self: &Arc<Self>, mut prepared: bool) {
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut failures = 0u64;
            loop {
                let Some(me) = weak.upgrade() else {
                    return;
                };
                let step = async {
                    if !prepared {
                        me.log.prepare().await?;
                        prepared = true;
                    }
                    me.catch_up()
                };
                match step.await {
                    Ok(()) => failures = 0,
                    Err(e) => {
                        // At most one line a minute while it keeps failing.
                        failures += 1;
                        if failures == 1 || failures.is_multiple_of(60) {
                            tracing::warn!(error = %e, "schema registry: catching up with _schemas failed; retrying");
                        }
                    }
                }
                let wait = me.log.changed(Duration::from_secs(1));
                drop(me);
                wait.await;
            }
        });
    }

    /// Applies every record readable now that is not applied yet.
    pub fn catch_up(&self) -> Result<(), RegistryError> {
        let _one = self.reading.lock();
        loop {
            let from = self.state.read().next_offset;
            let chunk = self.log.read(from)?;
            if chunk.records.is_empty() && chunk.next <= from {
                return Ok(());
            }
            let mut st = self.state.write();
            for r in &chunk.records {
                st.apply(r.key.as_deref(), r.value.as_deref());
            }
            st.next_offset = chunk.next.max(from);
            self.metrics.schemas.set(st.schema_count() as i64);
            self.metrics.subjects.set(st.live_subjects() as i64);
            self.metrics.applied_offset.set(st.next_offset);
            self.metrics.skipped_records.set(st.skipped as i64);
        }
    }

    /// The `_schemas` offset below which every record is applied to the state.
    pub fn applied_offset(&self) -> i64 {
        self.state.read().next_offset
    }

    /// Waits (at most the write timeout) until the records below `offset` are applied here:
    /// a node that forwarded a write reads as far as the leader had applied it.
    pub async fn await_applied(&self, offset: i64) -> Result<(), RegistryError> {
        self.catch_up_to(offset).await
    }

    /// Catches up until the records below `target` are applied.
    async fn catch_up_to(&self, target: i64) -> Result<(), RegistryError> {
        let deadline = Instant::now() + self.settings.write_timeout;
        loop {
            self.catch_up()?;
            if self.state.read().next_offset >= target {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(RegistryError::Timeout(format!(
                    "the registry did not read _schemas up to offset {target} within {:?}",
                    self.settings.write_timeout
                )));
            }
            self.log.changed(Duration::from_millis(50)).await;
        }
    }

    /// Decides a write on the current state with `plan` (records to append and the answer),
    /// appends the records and answers once they are applied.
    async fn write<T>(
        &self,
        plan: impl FnOnce(&Store) -> Result<(Vec<Record>, T), RegistryError>,
    ) -> Result<T, RegistryError> {
        let _writing = self.writer.lock().await;
        self.catch_up_to(self.log.end()).await?;
        let (records, answer) = {
            let st = self.state.read();
            plan(&st)?
        };
        if !records.is_empty() {
            let end = self.log.append(records).await?;
            self.catch_up_to(end).await?;
        }
        Ok(answer)
    }

    /// Reads the store.
    fn read<T>(
        &self,
        f: impl FnOnce(&Store) -> Result<T, RegistryError>,
    ) -> Result<T, RegistryError> {
        f(&self.state.read())
    }

    /// The parsed form of schema `id`, for compatibility checks.
    fn parsed_of(&self, st: &Store, id: i32) -> Result<Arc<Parsed>, RegistryError> {
        if let Some(p) = self.parsed.lock().get(&id) {
            return Ok(p.clone());
        }
        let schema = st
            .schema(id)
            .ok_or_else(|| RegistryError::SchemaNotFound(format!("schema {id} not found")))?;
        let resolved = st.resolve(&schema.references)?;
        let prepared = prepare(
            schema.schema_type,
            &schema.text,
            &resolved,
            false,
            usize::MAX,
        )
        .map_err(|e| RegistryError::InvalidSchema(format!("stored schema {id}: {e}")))?;
        let parsed = Arc::new(prepared.parsed);
        let mut cache = self.parsed.lock();
        if cache.len() >= PARSED_CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(id, parsed.clone());
        Ok(parsed)
    }

    /// Parses a schema sent by a client with its references resolved from `st`.
    fn prepare_request(
        &self,
        st: &Store,
        req: &SchemaRequest,
        normalize: bool,
    ) -> Result<(Prepared, Identity), RegistryError> {
        let text = req
            .schema
            .as_deref()
            .ok_or_else(|| RegistryError::InvalidSchema("the request has no \"schema\"".into()))?;
        let schema_type = SchemaType::parse(req.schema_type.as_deref())?;
        let refs = req.references.clone().unwrap_or_default();
        let resolved = st.resolve(&refs)?;
        let prepared = prepare(
            schema_type,
            text,
            &resolved,
            normalize,
            self.settings.max_schema_bytes,
        )?;
        let identity = Identity {
            schema_type,
            canonical: prepared.canonical.clone(),
            references: refs,
        };
        Ok((prepared, identity))
    }

    /// What keeps `new` from following the subject's live versions at `level`.
    fn incompatibilities(
        &self,
        st: &Store,
        level: Level,
        new: &Parsed,
        earlier: &[(i32, Version)],
        all: bool,
    ) -> Result<Vec<String>, RegistryError> {
        if level == Level::None || earlier.is_empty() {
            return Ok(Vec::new());
        }
        // Only the versions the level looks at are parsed.
        let wanted = if level.transitive() || all {
            earlier
        } else {
            &earlier[earlier.len() - 1..]
        };
        let mut parsed = Vec::with_capacity(wanted.len());
        for (n, v) in wanted {
            parsed.push((*n, self.parsed_of(st, v.id)?));
        }
        let refs: Vec<(i32, &Parsed)> = parsed.iter().map(|(n, p)| (*n, p.as_ref())).collect();
        Ok(compat::check(level, new, &refs, true))
    }

    /// Registers a schema under `subject`; the answer is its id (an existing one when the
    /// subject or any other already has the same schema).
    pub async fn register(
        &self,
        subject: &str,
        req: SchemaRequest,
        normalize: Option<bool>,
    ) -> Result<i32, RegistryError> {
        let (id, written) = self
            .write(|st| {
                let mode = st.mode(subject);
                if mode.read_only() {
                    return Err(RegistryError::OperationNotPermitted(format!(
                        "subject '{subject}' is in {} mode",
                        mode.name()
                    )));
                }
                if (req.id.is_some() || req.version.is_some()) && mode != Mode::Import {
                    return Err(RegistryError::OperationNotPermitted(
                        "a schema id or version can be given only in IMPORT mode".into(),
                    ));
                }
                let normalize = normalize.unwrap_or_else(|| st.normalizes(subject));
                let (prepared, identity) = self.prepare_request(st, &req, normalize)?;
                if let Some((_, id)) = st.find_in_subject(subject, &identity, false) {
                    if req.id.is_none_or(|want| want == id) {
                        return Ok((Vec::new(), (id, false)));
                    }
                }
                if mode != Mode::Import {
                    let level = st.level(Some(subject));
                    let earlier = st.versions(subject, false).unwrap_or_default();
                    let msgs =
                        self.incompatibilities(st, level, &prepared.parsed, &earlier, false)?;
                    if !msgs.is_empty() {
                        self.metrics.incompatible.inc();
                        return Err(RegistryError::Incompatible {
                            subject: subject.to_string(),
                            messages: msgs,
                        });
                    }
                }
                let id = match req.id {
                    Some(id) if id < 1 => {
                        return Err(RegistryError::BadRequest(format!(
                            "schema id {id} is not a positive number"
                        )))
                    }
                    Some(id) => {
                        if st.schema(id).is_some_and(|s| s.identity != identity) {
                            return Err(RegistryError::IdTaken(id));
                        }
                        id
                    }
                    None => st.id_of(&identity).unwrap_or_else(|| st.next_id()),
                };
                let version = match req.version {
                    Some(v) if v < 1 => return Err(RegistryError::InvalidVersion(v.to_string())),
                    Some(v) => {
                        if st.version(subject, VersionSpec::Number(v), true).is_ok() {
                            return Err(RegistryError::OperationNotPermitted(format!(
                                "version {v} of subject '{subject}' exists already"
                            )));
                        }
                        v
                    }
                    None => st.last_version(subject).saturating_add(1),
                };
                let record = Record::new(
                    &Key::Schema {
                        subject: subject.to_string(),
                        version,
                    },
                    &SchemaValue {
                        subject: subject.to_string(),
                        version,
                        id,
                        schema_type: identity.schema_type.wire(),
                        references: identity.references.clone(),
                        schema: prepared.text,
                        deleted: false,
                    },
                );
                Ok((vec![record], (id, true)))
            })
            .await?;
        if written {
            self.metrics.registrations.inc();
        }
        Ok(id)
    }

    /// The version of `subject` holding this schema.
    pub fn lookup(
        &self,
        subject: &str,
        req: &SchemaRequest,
        normalize: Option<bool>,
        deleted: bool,
    ) -> Result<SchemaAnswer, RegistryError> {
        self.read(|st| {
            st.versions(subject, deleted)?;
            let normalize = normalize.unwrap_or_else(|| st.normalizes(subject));
            let (_, identity) = self.prepare_request(st, req, normalize)?;
            let (version, _) =
                st.find_in_subject(subject, &identity, deleted)
                    .ok_or_else(|| {
                        RegistryError::SchemaNotFound(format!(
                            "the schema is not registered under subject '{subject}'"
                        ))
                    })?;
            answer(st, subject, version)
        })
    }

    /// Subjects (with a live version, or any with `deleted`) starting with `prefix`.
    pub fn subjects(&self, deleted: bool, prefix: Option<&str>) -> Vec<String> {
        let mut all = self.state.read().subjects(deleted);
        if let Some(p) = prefix {
            all.retain(|s| s.starts_with(p));
        }
        all
    }

    /// Version numbers of `subject`.
    pub fn versions(&self, subject: &str, deleted: bool) -> Result<Vec<i32>, RegistryError> {
        self.read(|st| {
            Ok(st
                .versions(subject, deleted)?
                .into_iter()
                .map(|(n, _)| n)
                .collect())
        })
    }

    /// One version of `subject` (`version`: a number, `latest` or -1).
    pub fn version(
        &self,
        subject: &str,
        version: &str,
        deleted: bool,
    ) -> Result<SchemaAnswer, RegistryError> {
        let spec = VersionSpec::parse(version)?;
        self.read(|st| {
            let (n, _) = st.version(subject, spec, deleted)?;
            answer(st, subject, n)
        })
    }

    /// Every live version of every subject (or all with `deleted`), the latest only with
    /// `latest_only`.
    pub fn all_versions(
        &self,
        deleted: bool,
        latest_only: bool,
        prefix: Option<&str>,
    ) -> Vec<SchemaAnswer> {
        let st = self.state.read();
        let mut out = Vec::new();
        for subject in st.subjects(deleted) {
            if prefix.is_some_and(|p| !subject.starts_with(p)) {
                continue;
            }
            let versions = st.versions(&subject, deleted).unwrap_or_default();
            let chosen: Vec<&(i32, Version)> = if latest_only {
                versions.last().into_iter().collect()
            } else {
                versions.iter().collect()
            };
            for (n, _) in chosen {
                if let Ok(a) = answer(&st, &subject, *n) {
                    out.push(a);
                }
            }
        }
        out
    }

    /// Ids of the live schemas referencing one version of `subject`.
    pub fn referenced_by(&self, subject: &str, version: &str) -> Result<Vec<i32>, RegistryError> {
        let spec = VersionSpec::parse(version)?;
        self.read(|st| {
            let (n, _) = st.version(subject, spec, true)?;
            Ok(st.referenced_by(subject, n))
        })
    }

    /// The schema with this id.
    pub fn schema_by_id(&self, id: i32) -> Result<ByIdAnswer, RegistryError> {
        self.read(|st| {
            let s = st
                .schema(id)
                .ok_or_else(|| RegistryError::SchemaNotFound(format!("schema {id} not found")))?;
            Ok(ByIdAnswer {
                schema_type: s.schema_type.wire(),
                references: s.references.clone(),
                schema: s.text.clone(),
            })
        })
    }

    /// The encoder HTTP ingest writes records of `subject` with, as Confluent's REST Proxy
    /// does: with `schema`, that schema as registered under `subject` (looked up first, so an
    /// existing schema needs no write; registered otherwise, compatibility checked); else
    /// schema `id`, which must be of `schema_type`.
    pub async fn record_encoder(
        &self,
        subject: &str,
        schema_type: SchemaType,
        schema: Option<String>,
        id: Option<i32>,
    ) -> Result<Arc<RecordEncoder>, RegistryError> {
        let id = match (schema, id) {
            (Some(text), _) => {
                let key = (subject.to_string(), schema_type, text);
                let known = self.ingest_ids.lock().get(&key).copied();
                // Still a live version of the subject (it may have been deleted since).
                let live = known.filter(|id| {
                    self.read(|st| st.versions(subject, false))
                        .is_ok_and(|vs| vs.iter().any(|(_, v)| v.id == *id))
                });
                match live {
                    Some(id) => id,
                    None => {
                        let req = SchemaRequest {
                            schema: Some(key.2.clone()),
                            schema_type: Some(schema_type.name().to_string()),
                            ..SchemaRequest::default()
                        };
                        let id = match self.lookup(subject, &req, None, false) {
                            Ok(found) => found.id,
                            Err(
                                RegistryError::SubjectNotFound(_)
                                | RegistryError::SchemaNotFound(_),
                            ) => self.register(subject, req, None).await?,
                            Err(e) => return Err(e),
                        };
                        let mut ids = self.ingest_ids.lock();
                        if ids.len() >= ENCODER_CACHE_ENTRIES {
                            ids.clear();
                        }
                        ids.insert(key, id);
                        id
                    }
                }
            }
            (None, Some(id)) => id,
            (None, None) => {
                return Err(RegistryError::BadRequest(
                    "neither a schema nor a schema id".into(),
                ))
            }
        };
        if let Some(e) = self.encoders.lock().get(&id) {
            if e.schema_type() == schema_type {
                return Ok(e.clone());
            }
        }
        let (stored_type, text, resolved) = self.read(|st| {
            let s = st
                .schema(id)
                .ok_or_else(|| RegistryError::SchemaNotFound(format!("schema {id} not found")))?;
            Ok((s.schema_type, s.text.clone(), st.resolve(&s.references)?))
        })?;
        if stored_type != schema_type {
            return Err(RegistryError::InvalidSchema(format!(
                "schema {id} is a {} schema, not {}",
                stored_type.name(),
                schema_type.name()
            )));
        }
        let encoder = RecordEncoder::new(id, schema_type, &text, &resolved)
            .map_err(|e| RegistryError::InvalidSchema(format!("schema {id}: {e}")))?;
        let encoder = Arc::new(encoder);
        let mut cache = self.encoders.lock();
        if cache.len() >= ENCODER_CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(id, encoder.clone());
        Ok(encoder)
    }

    /// The decoder of values written with schema `id` (search reads records with it):
    /// `None` when no schema has that id. Ids never change their schema, so decoders are
    /// kept (a bounded number).
    pub fn record_decoder(&self, id: i32) -> Option<Result<Arc<RecordDecoder>, String>> {
        if let Some(d) = self.decoders.lock().get(&id) {
            return Some(d.clone());
        }
        let (schema_type, text, resolved) = match self.read(|st| {
            let s = st
                .schema(id)
                .ok_or_else(|| RegistryError::SchemaNotFound(format!("schema {id} not found")))?;
            Ok((s.schema_type, s.text.clone(), st.resolve(&s.references)?))
        }) {
            Ok(found) => found,
            Err(RegistryError::SchemaNotFound(_)) => return None,
            Err(e) => return Some(Err(format!("schema {id}: {e}"))),
        };
        let decoder = RecordDecoder::new(id, schema_type, &text, &resolved)
            .map(Arc::new)
            .map_err(|e| format!("schema {id} cannot be read: {e}"));
        let mut cache = self.decoders.lock();
        if cache.len() >= DECODER_CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(id, decoder.clone());
        Some(decoder)
    }

    /// A stored schema's text as `format=serialized` asks for it: a Protobuf schema's base64
    /// `FileDescriptorProto`; other types' text unchanged.
    pub fn serialized(
        &self,
        schema_type: Option<&str>,
        text: String,
        references: &[Reference],
    ) -> Result<String, RegistryError> {
        if SchemaType::parse(schema_type)? != SchemaType::Protobuf {
            return Ok(text);
        }
        let resolved = self.read(|st| st.resolve(references))?;
        crate::protobuf::parse(&text, &resolved)
            .map(|p| p.serialized())
            .map_err(|e| RegistryError::InvalidSchema(format!("stored schema: {e}")))
    }

    /// Subject versions using schema `id`.
    pub fn versions_of_id(
        &self,
        id: i32,
        deleted: bool,
    ) -> Result<Vec<SubjectVersion>, RegistryError> {
        self.read(|st| {
            if st.schema(id).is_none() {
                return Err(RegistryError::SchemaNotFound(format!(
                    "schema {id} not found"
                )));
            }
            Ok(st
                .uses_of(id, deleted)
                .into_iter()
                .map(|(subject, version)| SubjectVersion { subject, version })
                .collect())
        })
    }

    /// Soft-deletes (or with `permanent`, removes a soft-deleted) version of `subject`; the
    /// answer is the version number.
    pub async fn delete_version(
        &self,
        subject: &str,
        version: &str,
        permanent: bool,
    ) -> Result<i32, RegistryError> {
        let spec = VersionSpec::parse(version)?;
        self.write(|st| {
            refuse_read_only(st, subject)?;
            let include_deleted = permanent || matches!(spec, VersionSpec::Number(_));
            let (n, v) = st.version(subject, spec, include_deleted)?;
            let referencing = st.referenced_by(subject, n);
            if !referencing.is_empty() {
                return Err(RegistryError::ReferenceExists {
                    subject: subject.to_string(),
                    version: n,
                    ids: referencing,
                });
            }
            let key = Key::Schema {
                subject: subject.to_string(),
                version: n,
            };
            let records = if permanent {
                if !v.deleted {
                    return Err(RegistryError::VersionNotSoftDeleted {
                        subject: subject.to_string(),
                        version: n,
                    });
                }
                // The version's id may be the highest: keep it past compaction.
                vec![Record::tombstone(&key), st.id_high_water()]
            } else {
                if v.deleted {
                    return Err(RegistryError::VersionSoftDeleted {
                        subject: subject.to_string(),
                        version: n,
                    });
                }
                let s = st.schema(v.id).ok_or_else(|| {
                    RegistryError::SchemaNotFound(format!("schema {} not found", v.id))
                })?;
                vec![Record::new(
                    &key,
                    &SchemaValue {
                        subject: subject.to_string(),
                        version: n,
                        id: v.id,
                        schema_type: s.schema_type.wire(),
                        references: s.references.clone(),
                        schema: s.text.clone(),
                        deleted: true,
                    },
                )]
            };
            Ok((records, n))
        })
        .await
    }

    /// Soft-deletes every live version of `subject` (or with `permanent`, removes a
    /// soft-deleted subject); the answer is the versions deleted.
    pub async fn delete_subject(
        &self,
        subject: &str,
        permanent: bool,
    ) -> Result<Vec<i32>, RegistryError> {
        self.write(|st| {
            refuse_read_only(st, subject)?;
            let all = st.versions(subject, true)?;
            let live: Vec<i32> = all
                .iter()
                .filter(|(_, v)| !v.deleted)
                .map(|(n, _)| *n)
                .collect();
            for (n, _) in &all {
                let referencing = st.referenced_by(subject, *n);
                if !referencing.is_empty() {
                    return Err(RegistryError::ReferenceExists {
                        subject: subject.to_string(),
                        version: *n,
                        ids: referencing,
                    });
                }
            }
            if !permanent {
                let Some(last) = live.last().copied() else {
                    return Err(RegistryError::SubjectSoftDeleted(subject.to_string()));
                };
                let record = Record::new(
                    &Key::DeleteSubject {
                        subject: subject.to_string(),
                    },
                    &DeleteSubjectValue {
                        subject: subject.to_string(),
                        version: last,
                    },
                );
                return Ok((vec![record], live));
            }
            if !live.is_empty() {
                return Err(RegistryError::SubjectNotSoftDeleted(subject.to_string()));
            }
            let mut records: Vec<Record> = all
                .iter()
                .map(|(n, _)| {
                    Record::tombstone(&Key::Schema {
                        subject: subject.to_string(),
                        version: *n,
                    })
                })
                .collect();
            records.push(st.id_high_water());
            records.push(Record::new(
                &Key::ClearSubject {
                    subject: subject.to_string(),
                },
                &ClearSubjectValue {
                    subject: subject.to_string(),
                },
            ));
            Ok((records, all.into_iter().map(|(n, _)| n).collect()))
        })
        .await
    }

    /// The compatibility config of `subject` (`None`: global).
    pub fn config(
        &self,
        subject: Option<&str>,
        default_to_global: bool,
    ) -> Result<ConfigAnswer, RegistryError> {
        self.read(|st| {
            let global = st.config(None);
            let own = match subject {
                None => global,
                Some(s) => match st.config(Some(s)) {
                    Some(c) => Some(c),
                    None if default_to_global => global,
                    None => return Err(RegistryError::SubjectConfigNotFound(s.to_string())),
                },
            };
            Ok(ConfigAnswer {
                compatibility_level: own
                    .and_then(|c| c.compatibility.as_deref())
                    .and_then(|l| Level::parse(l).ok())
                    .unwrap_or_else(|| st.level(None))
                    .name()
                    .to_string(),
                normalize: own.and_then(|c| c.normalize),
            })
        })
    }

    /// Sets the compatibility config of `subject` (`None`: global).
    pub async fn set_config(
        &self,
        subject: Option<&str>,
        req: ConfigRequest,
    ) -> Result<ConfigUpdate, RegistryError> {
        let asked = req.compatibility.or(req.compatibility_level);
        let level = asked.as_deref().map(Level::parse).transpose()?;
        if level.is_none() && req.normalize.is_none() {
            return Err(RegistryError::InvalidCompatibility(String::new()));
        }
        self.write(|st| {
            let existing = st.config(subject).cloned().unwrap_or_default();
            let value = ConfigValue {
                compatibility: level
                    .map(|l| l.name().to_string())
                    .or(existing.compatibility),
                normalize: req.normalize.or(existing.normalize),
            };
            let shown = value
                .compatibility
                .as_deref()
                .and_then(|l| Level::parse(l).ok())
                .unwrap_or_else(|| st.level(None));
            let record = Record::new(
                &Key::Config {
                    subject: subject.map(String::from),
                },
                &value,
            );
            Ok((
                vec![record],
                ConfigUpdate {
                    compatibility: shown.name().to_string(),
                    normalize: value.normalize,
                },
            ))
        })
        .await
    }

    /// Removes the compatibility config of `subject` (`None`: resets the global one); the
    /// answer is the config it had.
    pub async fn delete_config(
        &self,
        subject: Option<&str>,
    ) -> Result<ConfigAnswer, RegistryError> {
        self.write(|st| {
            let had = st.config(subject).cloned();
            if let (Some(s), None) = (subject, &had) {
                return Err(RegistryError::SubjectConfigNotFound(s.to_string()));
            }
            let previous = ConfigAnswer {
                compatibility_level: had
                    .as_ref()
                    .and_then(|c| c.compatibility.as_deref())
                    .and_then(|l| Level::parse(l).ok())
                    .unwrap_or_else(|| st.level(None))
                    .name()
                    .to_string(),
                normalize: had.as_ref().and_then(|c| c.normalize),
            };
            let records = if had.is_some() {
                vec![Record::tombstone(&Key::Config {
                    subject: subject.map(String::from),
                })]
            } else {
                Vec::new()
            };
            Ok((records, previous))
        })
        .await
    }

    /// The mode of `subject` (`None`: global).
    pub fn mode(
        &self,
        subject: Option<&str>,
        default_to_global: bool,
    ) -> Result<Mode, RegistryError> {
        self.read(|st| match subject {
            None => Ok(st.own_mode(None).unwrap_or_default()),
            Some(s) => match st.own_mode(Some(s)) {
                Some(m) => Ok(m),
                None if default_to_global => Ok(st.mode(s)),
                None => Err(RegistryError::SubjectModeNotFound(s.to_string())),
            },
        })
    }

    /// Sets the mode of `subject` (`None`: global). IMPORT needs an empty registry (or
    /// subject) unless `force`.
    pub async fn set_mode(
        &self,
        subject: Option<&str>,
        mode: &str,
        force: bool,
    ) -> Result<Mode, RegistryError> {
        let mode = Mode::parse(mode)?;
        self.write(|st| {
            if mode == Mode::Import && !force {
                let busy = match subject {
                    None => !st.is_empty(),
                    Some(s) => st.has_subject(s),
                };
                if busy {
                    return Err(RegistryError::OperationNotPermitted(
                        "IMPORT mode needs no schemas registered yet (force=true overrides)".into(),
                    ));
                }
            }
            let record = Record::new(
                &Key::Mode {
                    subject: subject.map(String::from),
                },
                &ModeValue {
                    mode: mode.name().to_string(),
                },
            );
            Ok((vec![record], mode))
        })
        .await
    }

    /// Removes the mode of `subject`; the answer is the mode it had.
    pub async fn delete_mode(&self, subject: &str) -> Result<Mode, RegistryError> {
        self.write(|st| {
            let had = st
                .own_mode(Some(subject))
                .ok_or_else(|| RegistryError::SubjectModeNotFound(subject.to_string()))?;
            let record = Record::tombstone(&Key::Mode {
                subject: Some(subject.to_string()),
            });
            Ok((vec![record], had))
        })
        .await
    }

    /// Whether a schema may be registered under `subject`: against one version, or (with
    /// `version` `None`) the versions the subject's level looks at. The answer lists what
    /// breaks.
    pub fn check_compatibility(
        &self,
        subject: &str,
        version: Option<&str>,
        req: &SchemaRequest,
        normalize: Option<bool>,
    ) -> Result<(bool, Vec<String>), RegistryError> {
        let spec = version.map(VersionSpec::parse).transpose()?;
        self.read(|st| {
            let earlier = match spec {
                Some(spec) => vec![st.version(subject, spec, false)?],
                None => st.versions(subject, false).unwrap_or_default(),
            };
            let normalize = normalize.unwrap_or_else(|| st.normalizes(subject));
            let (prepared, _) = self.prepare_request(st, req, normalize)?;
            let level = st.level(Some(subject));
            let msgs =
                self.incompatibilities(st, level, &prepared.parsed, &earlier, spec.is_some())?;
            Ok((msgs.is_empty(), msgs))
        })
    }
}

fn refuse_read_only(st: &Store, subject: &str) -> Result<(), RegistryError> {
    let mode = st.mode(subject);
    if mode.read_only() {
        return Err(RegistryError::OperationNotPermitted(format!(
            "subject '{subject}' is in {} mode",
            mode.name()
        )));
    }
    Ok(())
}

fn answer(st: &Store, subject: &str, version: i32) -> Result<SchemaAnswer, RegistryError> {
    let (_, v) = st.version(subject, VersionSpec::Number(version), true)?;
    let s = st
        .schema(v.id)
        .ok_or_else(|| RegistryError::SchemaNotFound(format!("schema {} not found", v.id)))?;
    Ok(SchemaAnswer {
        subject: subject.to_string(),
        version,
        id: v.id,
        schema_type: s.schema_type.wire(),
        references: s.references.clone(),
        schema: s.text.clone(),
    })
}
