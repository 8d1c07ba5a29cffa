//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics, and for the broker:
//! its static settings read-only, its dynamic ones (the disk watermark; in a cluster also the
//! throttles and leader balancing) changeable.

use spate_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
use spate_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use spate_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse as IncrementalAlterResourceResponse;
use spate_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use spate_protocol::{ResponseError, StrBytes};

use super::msg;
use crate::cluster::Cluster;
use crate::registry::{Topic, TopicError};
use crate::topic_config::{def, ConfigType, TopicConfig, DEFS};
use crate::Broker;

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
const RESOURCE_GROUP: i8 = 32;
/// DescribeConfigs' source of a value a group sets (Kafka's GROUP_CONFIG).
const SOURCE_GROUP: i8 = 8;
const SOURCE_TOPIC: i8 = 1;
/// ConfigSource DYNAMIC_BROKER_CONFIG.
const SOURCE_DYNAMIC_BROKER: i8 = 2;
/// ConfigSource DYNAMIC_DEFAULT_BROKER_CONFIG.
const SOURCE_DYNAMIC_DEFAULT_BROKER: i8 = 3;
const SOURCE_STATIC_BROKER: i8 = 4;
/// ConfigSource DEFAULT_CONFIG.
pub(crate) const SOURCE_DEFAULT: i8 = 5;

const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

pub(crate) struct Entry {
    name: String,
    value: String,
    source: i8,
    read_only: bool,
    kind: ConfigType,
    doc: &'static str,
}

fn topic_entries(config: &TopicConfig) -> Vec<Entry> {
    DEFS.iter()
        .filter_map(|d| {
            let (value, set) = config.get(d.name)?;
            Some(Entry {
                name: d.name.to_string(),
                value: value.to_string(),
                source: if set { SOURCE_TOPIC } else { SOURCE_DEFAULT },
                read_only: false,
                kind: d.kind,
                doc: d.doc,
            })
        })
        .collect()
}

fn broker_entries(b: &Broker) -> Vec<Entry> {
    let c = &b.config;
    let fixed = |name: &str, value: String, kind: ConfigType, doc: &'static str| Entry {
        name: name.to_string(),
        value,
        source: SOURCE_STATIC_BROKER,
        read_only: true,
        kind,
        doc,
    };
    let mut v = vec![
        fixed(
            "node.id",
            c.node_id.to_string(),
            ConfigType::Int,
            "This broker's id.",
        ),
        fixed(
            "broker.id",
            c.node_id.to_string(),
            ConfigType::Int,
            "This broker's id.",
        ),
        fixed(
            "advertised.listeners",
            format!("PLAINTEXT://{}:{}", c.advertised_host, c.advertised_port),
            ConfigType::List,
            "Where clients connect.",
        ),
        fixed(
            "log.dirs",
            c.data_dir.display().to_string(),
            ConfigType::List,
            "Where data is stored.",
        ),
        fixed(
            "num.partitions",
            c.default_partitions.to_string(),
            ConfigType::Int,
            "Partitions of auto-created topics.",
        ),
        fixed(
            "auto.create.topics.enable",
            c.auto_create_topics.to_string(),
            ConfigType::String,
            "Whether Metadata requests create unknown topics.",
        ),
        fixed(
            "socket.request.max.bytes",
            c.max_frame_bytes.to_string(),
            ConfigType::Int,
            "Largest request accepted.",
        ),
        fixed(
            "fetch.max.bytes",
            c.fetch_max_bytes.to_string(),
            ConfigType::Int,
            "Most record bytes in one fetch response (the first partition may exceed it by one batch).",
        ),
        fixed(
            "producer.id.expiration.ms",
            c.producer_id_expiration_ms.to_string(),
            ConfigType::Int,
            "Idempotent producers idle this long are forgotten.",
        ),
    ];
    let share = &c.share;
    for (name, value, kind, doc) in [
        (
            "group.share.record.lock.duration.ms",
            share.lock_duration_ms.to_string(),
            ConfigType::Int,
            "How long a share group member holds the records it acquired.",
        ),
        (
            "group.share.delivery.count.limit",
            share.partition.delivery_count_limit.to_string(),
            ConfigType::Int,
            "Deliveries of a share group record before it is archived.",
        ),
        (
            "group.share.partition.max.record.locks",
            share.partition.max_in_flight.to_string(),
            ConfigType::Int,
            "Most in-flight records per share-partition.",
        ),
        (
            "group.share.session.timeout.ms",
            share.group.session_timeout_ms.to_string(),
            ConfigType::Int,
            "A share group member without a heartbeat for this long leaves its group.",
        ),
        (
            "group.share.heartbeat.interval.ms",
            share.group.heartbeat_interval_ms.to_string(),
            ConfigType::Int,
            "How often share group members heartbeat.",
        ),
        (
            "group.share.max.size",
            share.group.max_size.to_string(),
            ConfigType::Int,
            "Most members of one share group.",
        ),
    ] {
        v.push(fixed(name, value, kind, doc));
    }
    // Topic defaults, under their broker-level names as Kafka reports them.
    for (broker_name, topic_name) in [
        ("log.retention.ms", "retention.ms"),
        ("log.retention.bytes", "retention.bytes"),
        ("log.segment.bytes", "segment.bytes"),
        ("log.roll.ms", "segment.ms"),
        ("message.max.bytes", "max.message.bytes"),
        ("log.cleanup.policy", "cleanup.policy"),
        ("compression.type", "compression.type"),
        ("log.message.timestamp.type", "message.timestamp.type"),
        ("min.insync.replicas", "min.insync.replicas"),
    ] {
        if let (Some(d), Some(value)) = (
            def(topic_name),
            crate::topic_config::broker_default(topic_name),
        ) {
            v.push(fixed(broker_name, value.to_string(), d.kind, d.doc));
        }
    }
    v
}

/// The disk watermark's entries: changeable at run time, dynamic when set so (`dynamic`
/// holds the keys set), else the start-up flags' values. Asked as the broker default (`""`,
/// `--entity-default`), a value set is reported as a dynamic default, as Kafka's tools filter.
fn disk_entries(
    b: &Broker,
    name: &str,
    dynamic: &std::collections::BTreeMap<String, String>,
) -> Vec<Entry> {
    let set_source = if name.is_empty() {
        SOURCE_DYNAMIC_DEFAULT_BROKER
    } else {
        SOURCE_DYNAMIC_BROKER
    };
    use crate::dynamic_configs as dc;
    let w = b.disk.watermark();
    [
        (
            dc::DISK_MIN_FREE_BYTES,
            w.min_free_bytes.to_string(),
            ConfigType::Long,
            dc::DISK_MIN_FREE_BYTES_DOC,
        ),
        (
            dc::DISK_MIN_FREE_PERCENT,
            w.min_free_percent.to_string(),
            ConfigType::Int,
            dc::DISK_MIN_FREE_PERCENT_DOC,
        ),
    ]
    .into_iter()
    .map(|(name, value, kind, doc)| Entry {
        name: name.to_string(),
        value,
        source: if dynamic.contains_key(name) {
            set_source
        } else {
            SOURCE_STATIC_BROKER
        },
        read_only: false,
        kind,
        doc,
    })
    .collect()
}

/// A standalone broker's configs: its own static settings and the disk watermark (`""`
/// names it too).
pub(crate) fn own_broker_entries(
    b: &Broker,
    name: &str,
) -> Result<Vec<Entry>, (ResponseError, String)> {
    if name.is_empty() || name == b.config.node_id.to_string() {
        let mut entries = broker_entries(b);
        entries.extend(disk_entries(b, name, &b.dynamic.values()));
        Ok(entries)
    } else {
        Err((
            ResponseError::InvalidRequest,
            format!("this is broker {}, not '{name}'", b.config.node_id),
        ))
    }
}

/// A cluster broker's configs: its static settings (when it is this node) and the dynamic
/// ones from the metadata image, with where each value comes from. `""` is the cluster-wide
/// default.
pub(crate) fn cluster_broker_entries(
    b: &Broker,
    cluster: &Cluster,
    name: &str,
) -> Result<Vec<Entry>, (ResponseError, String)> {
    let image = cluster.image();
    let broker = if name.is_empty() {
        None
    } else {
        match name.parse::<i32>() {
            Ok(id) if image.broker(id).is_some() => Some(id),
            _ => {
                return Err((
                    ResponseError::InvalidRequest,
                    format!(
                        "'{name}' is not a broker of this cluster (brokers: {:?})",
                        image.brokers().keys().collect::<Vec<_>>()
                    ),
                ))
            }
        }
    };
    let mut entries = if broker == Some(cluster.broker_id()) {
        broker_entries(b)
    } else {
        Vec::new()
    };
    let me = broker == Some(cluster.broker_id());
    for (def, value, source) in crate::cluster::broker_configs::effective(&image, broker) {
        let (value, source) = match source {
            // Nothing set: this node's watermark is its start-up flags, not Kafka-style
            // built-in defaults.
            crate::cluster::broker_configs::Source::BuiltIn
                if me && crate::dynamic_configs::is_dynamic(def.name) =>
            {
                let w = b.config.disk_watermark;
                let v = if def.name == crate::dynamic_configs::DISK_MIN_FREE_BYTES {
                    w.min_free_bytes.to_string()
                } else {
                    w.min_free_percent.to_string()
                };
                (v, SOURCE_STATIC_BROKER)
            }
            s => (value, s.code()),
        };
        entries.push(Entry {
            name: def.name.to_string(),
            value,
            source,
            read_only: false,
            kind: def.kind,
            doc: def.doc,
        });
    }
    Ok(entries)
}

/// A share group's configs: those it sets, and the defaults of the rest. In a cluster they
/// are the metadata's, which every node applies.
fn group_entries(b: &Broker, group: &str) -> Result<Vec<Entry>, (ResponseError, String)> {
    use crate::share::group_configs::DEFINITIONS;
    let set = b.shares.group_configs().get(group);
    let base = b.shares.settings();
    Ok(DEFINITIONS
        .iter()
        .map(|d| {
            let (value, source) = match set.get(d.name) {
                Some(v) => (v.clone(), SOURCE_GROUP),
                None => ((d.default)(base), SOURCE_DEFAULT),
            };
            Entry {
                name: d.name.to_string(),
                value,
                source,
                read_only: false,
                kind: if d.int {
                    ConfigType::Int
                } else {
                    ConfigType::String
                },
                doc: d.doc,
            }
        })
        .collect())
}

/// IncrementalAlterConfigs of a group resource: SET and DELETE of share group configs.
fn alter_group_configs(
    b: &Broker,
    r: &spate_protocol::messages::incremental_alter_configs_request::AlterConfigsResource,
    validate_only: bool,
) -> Result<(), TopicError> {
    use crate::share::group_configs::ChangeError;
    let mut changes = Vec::new();
    for c in &r.configs {
        let key = c.name.to_string();
        match c.config_operation {
            OP_SET => match &c.value {
                Some(v) => changes.push((key, Some(v.to_string()))),
                None => {
                    return Err(TopicError::new(
                        ResponseError::InvalidConfig,
                        format!("{key}: no value given"),
                    ))
                }
            },
            OP_DELETE => changes.push((key, None)),
            OP_APPEND | OP_SUBTRACT => {
                return Err(TopicError::new(
                    ResponseError::InvalidConfig,
                    format!("{key} is not a list; APPEND and SUBTRACT apply only to lists"),
                ))
            }
            op => {
                return Err(TopicError::new(
                    ResponseError::InvalidRequest,
                    format!("unknown config operation {op}"),
                ))
            }
        }
    }
    let refused = |e| match e {
        ChangeError::Invalid(m) => TopicError::new(ResponseError::InvalidConfig, m),
        ChangeError::Storage(m) => TopicError::new(ResponseError::KafkaStorageError, m),
    };
    let group = r.resource_name.as_str();
    let Some(c) = b.cluster.get() else {
        return b
            .shares
            .group_configs()
            .change(group, &changes, validate_only)
            .map_err(refused);
    };
    // A cluster's group configs are in its metadata: checked here, then proposed.
    b.shares
        .group_configs()
        .change(group, &changes, true)
        .map_err(refused)?;
    if validate_only {
        return Ok(());
    }
    let set = changes
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_ref()?.trim().to_string())))
        .collect();
    let remove = changes
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| k.clone())
        .collect();
    c.set_group_configs(group, set, remove)
}

/// Answers DescribeConfigs.
pub fn describe(b: &Broker, version: i16, req: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let mut resp = DescribeConfigsResponse::default();
    for r in req.resources {
        let mut out = DescribeConfigsResult::default();
        out.resource_type = r.resource_type;
        out.resource_name = r.resource_name.clone();
        let entries = match r.resource_type {
            RESOURCE_TOPIC => match b.topics.get(&r.resource_name) {
                Some(t) => Ok(topic_entries(&t.config())),
                None => Err((
                    ResponseError::UnknownTopicOrPartition,
                    format!("topic '{}' does not exist", r.resource_name.as_str()),
                )),
            },
            RESOURCE_BROKER => b.topology().broker_configs(b, r.resource_name.as_str()),
            RESOURCE_GROUP => group_entries(b, r.resource_name.as_str()),
            other => Err((
                ResponseError::InvalidRequest,
                format!("resource type {other} has no configs here"),
            )),
        };
        match entries {
            Ok(entries) => {
                out.configs = entries
                    .into_iter()
                    .filter(|e| {
                        r.configuration_keys
                            .as_ref()
                            .is_none_or(|keys| keys.iter().any(|k| k.as_str() == e.name))
                    })
                    .map(|e| {
                        let mut c = DescribeConfigsResourceResult::default();
                        c.name = StrBytes::from_string(e.name);
                        c.value = Some(StrBytes::from_string(e.value));
                        c.read_only = e.read_only;
                        c.config_source = e.source;
                        if version >= 3 {
                            c.config_type = e.kind as i8;
                            if req.include_documentation {
                                c.documentation = Some(StrBytes::from_static_str(e.doc));
                            }
                        }
                        c
                    })
                    .collect();
            }
            Err((code, message)) => {
                out.error_code = code.code();
                out.error_message = msg(message);
            }
        }
        resp.results.push(out);
    }
    resp
}

/// Fills the fields both alter responses share (they are distinct generated types).
macro_rules! resource_response {
    ($ty:ty, $resource_type:expr, $name:expr, $result:expr) => {{
        let mut r = <$ty>::default();
        r.resource_type = $resource_type;
        r.resource_name = $name;
        if let Err(e) = $result {
            r.error_code = e.code.code();
            r.error_message = msg(e.message);
        }
        r
    }};
}

fn topic_for(
    b: &Broker,
    resource_type: i8,
    name: &str,
) -> Result<std::sync::Arc<Topic>, TopicError> {
    if resource_type != RESOURCE_TOPIC {
        return Err(TopicError::new(
            ResponseError::InvalidRequest,
            "only topic configs can be altered; broker settings are fixed at start-up",
        ));
    }
    b.topics.get(name).ok_or_else(|| {
        TopicError::new(
            ResponseError::UnknownTopicOrPartition,
            format!("topic '{name}' does not exist"),
        )
    })
}

fn invalid(e: crate::TopicConfigError) -> TopicError {
    TopicError::new(ResponseError::InvalidConfig, e.to_string())
}

/// Answers AlterConfigs: the given configs replace all of the topic's overrides.
pub fn alter(b: &Broker, req: AlterConfigsRequest) -> AlterConfigsResponse {
    let mut resp = AlterConfigsResponse::default();
    for r in req.resources {
        let result = topic_for(b, r.resource_type, &r.resource_name).and_then(|t| {
            let config = TopicConfig::from_pairs(
                r.configs
                    .iter()
                    .map(|c| (c.name.as_str(), c.value.as_ref().map(|v| v.as_str()))),
            )
            .map_err(invalid)?;
            if !req.validate_only {
                b.topology().set_topic_config(b, &t, config)?;
            }
            Ok(())
        });
        resp.responses.push(resource_response!(
            AlterConfigsResourceResponse,
            r.resource_type,
            r.resource_name,
            result
        ));
    }
    resp
}

/// Answers IncrementalAlterConfigs: SET and DELETE per key; APPEND and SUBTRACT on lists.
pub fn incremental_alter(
    b: &Broker,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut resp = IncrementalAlterConfigsResponse::default();
    for r in req.resources {
        if r.resource_type == RESOURCE_GROUP {
            let result = alter_group_configs(b, &r, req.validate_only);
            resp.responses.push(resource_response!(
                IncrementalAlterResourceResponse,
                r.resource_type,
                r.resource_name,
                result
            ));
            continue;
        }
        if r.resource_type == RESOURCE_BROKER {
            let result = b.topology().alter_broker_configs(b, &r, req.validate_only);
            resp.responses.push(resource_response!(
                IncrementalAlterResourceResponse,
                r.resource_type,
                r.resource_name,
                result
            ));
            continue;
        }
        let result = topic_for(b, r.resource_type, &r.resource_name).and_then(|t| {
            let mut config = t.config();
            for c in &r.configs {
                let key = c.name.as_str();
                let value = c.value.as_ref().map(|v| v.as_str());
                match c.config_operation {
                    OP_SET => {
                        let v = value
                            .ok_or_else(|| invalid(crate::TopicConfigError::Missing(key.into())))?;
                        config.set(key, v).map_err(invalid)?;
                    }
                    OP_DELETE => config.unset(key).map_err(invalid)?,
                    OP_APPEND | OP_SUBTRACT => {
                        let d = def(key)
                            .ok_or_else(|| invalid(crate::TopicConfigError::Unknown(key.into())))?;
                        if d.kind != ConfigType::List {
                            return Err(TopicError::new(
                                ResponseError::InvalidConfig,
                                format!(
                                    "{key} is not a list; APPEND and SUBTRACT apply only to lists"
                                ),
                            ));
                        }
                        let current = config
                            .get(key)
                            .map(|(v, _)| v.to_string())
                            .unwrap_or_default();
                        let mut items: Vec<String> = current
                            .split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(String::from)
                            .collect();
                        let given: Vec<&str> = value
                            .unwrap_or("")
                            .split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .collect();
                        if c.config_operation == OP_APPEND {
                            for g in given {
                                if !items.iter().any(|i| i == g) {
                                    items.push(g.to_string());
                                }
                            }
                        } else {
                            items.retain(|i| !given.contains(&i.as_str()));
                        }
                        config.set(key, &items.join(",")).map_err(invalid)?;
                    }
                    op => {
                        return Err(TopicError::new(
                            ResponseError::InvalidRequest,
                            format!("unknown config operation {op}"),
                        ))
                    }
                }
            }
            if !req.validate_only {
                b.topology().set_topic_config(b, &t, config)?;
            }
            Ok(())
        });
        resp.responses.push(resource_response!(
            IncrementalAlterResourceResponse,
            r.resource_type,
            r.resource_name,
            result
        ));
    }
    resp
}

/// A broker resource's IncrementalAlterConfigs operations as the values to set and the keys
/// to delete: SET takes a value `validate` accepts, DELETE a key `is_dynamic` knows, and
/// APPEND/SUBTRACT do not apply to broker configs.
fn broker_config_ops(
    r: &spate_protocol::messages::incremental_alter_configs_request::AlterConfigsResource,
    validate: impl Fn(&str, &str) -> Result<(), String>,
    is_dynamic: impl Fn(&str) -> bool,
) -> Result<(std::collections::BTreeMap<String, String>, Vec<String>), TopicError> {
    let mut set = std::collections::BTreeMap::new();
    let mut remove = Vec::new();
    for c in &r.configs {
        let key = c.name.as_str();
        match c.config_operation {
            OP_SET => {
                let value = c.value.as_ref().map(|v| v.as_str()).ok_or_else(|| {
                    TopicError::new(
                        ResponseError::InvalidConfig,
                        format!("{key}: no value given"),
                    )
                })?;
                validate(key, value)
                    .map_err(|m| TopicError::new(ResponseError::InvalidConfig, m))?;
                set.insert(key.to_owned(), value.trim().to_owned());
            }
            OP_DELETE => {
                if !is_dynamic(key) {
                    return Err(TopicError::new(
                        ResponseError::InvalidConfig,
                        format!("'{key}' is not a dynamic broker config"),
                    ));
                }
                remove.push(key.to_owned());
            }
            op => {
                return Err(TopicError::new(
                    ResponseError::InvalidRequest,
                    format!("operation {op} does not apply to broker configs (SET and DELETE do)"),
                ))
            }
        }
    }
    Ok((set, remove))
}

/// A standalone broker's dynamic configs (the disk watermark): SET and DELETE per key, on
/// disk in the data dir, then applied at once (DELETE goes back to the start-up flag).
pub(crate) fn alter_standalone_broker_configs(
    b: &Broker,
    r: &spate_protocol::messages::incremental_alter_configs_request::AlterConfigsResource,
    validate_only: bool,
) -> Result<(), TopicError> {
    let name = r.resource_name.as_str();
    if !name.is_empty() && name != b.config.node_id.to_string() {
        return Err(TopicError::new(
            ResponseError::InvalidRequest,
            format!("this is broker {}, not '{name}'", b.config.node_id),
        ));
    }
    let (set, remove) = broker_config_ops(
        r,
        crate::dynamic_configs::validate,
        crate::dynamic_configs::is_dynamic,
    )?;
    if validate_only {
        return Ok(());
    }
    let values = b.dynamic.change(set, &remove).map_err(|e| {
        TopicError::new(
            ResponseError::KafkaStorageError,
            format!("cannot save the broker configs: {e}"),
        )
    })?;
    let w = crate::dynamic_configs::watermark(b.config.disk_watermark, |k| {
        values.get(k).map(String::as_str)
    });
    tracing::info!(
        min_free_bytes = w.min_free_bytes,
        min_free_percent = w.min_free_percent,
        "disk watermark changed"
    );
    // Samples at once: produce is refused or resumes under the new limits now.
    b.disk.set_watermark(w);
    Ok(())
}

/// Dynamic broker configs of a cluster through the quorum: SET and DELETE per key.
pub(crate) fn alter_cluster_broker_configs(
    cluster: &Cluster,
    r: &spate_protocol::messages::incremental_alter_configs_request::AlterConfigsResource,
    validate_only: bool,
) -> Result<(), TopicError> {
    let name = r.resource_name.as_str();
    let image = cluster.image();
    if !name.is_empty()
        && name
            .parse::<i32>()
            .ok()
            .and_then(|id| image.broker(id))
            .is_none()
    {
        return Err(TopicError::new(
            ResponseError::InvalidRequest,
            format!("'{name}' is not a broker of this cluster"),
        ));
    }
    let (set, remove) = broker_config_ops(r, crate::cluster::broker_configs::validate, |key| {
        crate::cluster::broker_configs::dynamic_def(key).is_some()
    })?;
    if validate_only {
        return Ok(());
    }
    cluster.set_broker_configs(name, set, remove)
}
