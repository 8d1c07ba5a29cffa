//! CreateTopics, DeleteTopics and CreatePartitions.

use std::collections::HashSet;

use spate_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use spate_protocol::messages::create_topics_request::CreatableTopic;
use spate_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use spate_protocol::messages::delete_topics_response::DeletableTopicResult;
use spate_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    DeleteTopicsRequest, DeleteTopicsResponse, TopicName,
};
use spate_protocol::{ResponseError, StrBytes};

use super::configs::SOURCE_DEFAULT;
use super::msg;
use crate::registry::TopicError;
use crate::topic_config::{TopicConfig, DEFS};
use crate::Broker;

const SOURCE_TOPIC: i8 = 1;

/// Answers CreateTopics.
pub fn create(b: &Broker, version: i16, req: CreateTopicsRequest) -> CreateTopicsResponse {
    let mut resp = CreateTopicsResponse::default();
    let duplicates = duplicate_names(&req.topics);
    for t in req.topics {
        let mut r = CreatableTopicResult::default();
        r.name = t.name.clone();
        let outcome = if duplicates.contains(&t.name) {
            Err(TopicError::new(
                ResponseError::InvalidRequest,
                "topic listed more than once in the request",
            ))
        } else {
            create_one(b, &t, req.validate_only)
        };
        match outcome {
            Ok((id, partitions, config)) => {
                if version >= 7 {
                    r.topic_id = id;
                }
                if version >= 5 {
                    r.num_partitions = partitions;
                    r.replication_factor = 1;
                    r.configs = Some(config_entries(&config));
                }
            }
            Err(e) => {
                r.error_code = e.code.code();
                r.error_message = msg(e.message);
                if version >= 5 {
                    r.num_partitions = -1;
                    r.replication_factor = -1;
                }
            }
        }
        resp.topics.push(r);
    }
    resp
}

/// Names a CreateTopics request lists more than once (each is refused).
pub(crate) fn duplicate_names(topics: &[CreatableTopic]) -> HashSet<TopicName> {
    let mut seen = HashSet::new();
    topics
        .iter()
        .filter(|t| !seen.insert(t.name.clone()))
        .map(|t| t.name.clone())
        .collect()
}

fn create_one(
    b: &Broker,
    t: &CreatableTopic,
    validate_only: bool,
) -> Result<(uuid::Uuid, i32, TopicConfig), TopicError> {
    let explicit = !t.assignments.is_empty();
    if explicit && (t.num_partitions != -1 || t.replication_factor != -1) {
        return Err(TopicError::new(
            ResponseError::InvalidRequest,
            "give either replica assignments or partitions and replication factor, not both",
        ));
    }
    let node = b.config.node_id;
    if explicit {
        let mut indexes: Vec<i32> = t.assignments.iter().map(|a| a.partition_index).collect();
        indexes.sort_unstable();
        let contiguous = indexes.iter().enumerate().all(|(i, &p)| p == i as i32);
        let on_us = t
            .assignments
            .iter()
            .all(|a| a.broker_ids.len() == 1 && a.broker_ids[0].0 == node);
        if !contiguous || !on_us {
            return Err(TopicError::new(
                ResponseError::InvalidReplicaAssignment,
                format!(
                    "assignments must cover partitions 0..n, each with the single replica {node}"
                ),
            ));
        }
    }
    match t.replication_factor {
        -1 | 1 => {}
        rf => {
            return Err(TopicError::new(
                ResponseError::InvalidReplicationFactor,
                format!("replication factor {rf} is larger than the 1 available broker"),
            ))
        }
    }
    let partitions = if explicit {
        t.assignments.len() as i32
    } else if t.num_partitions == -1 {
        b.config.default_partitions
    } else {
        t.num_partitions
    };
    let config = TopicConfig::from_pairs(
        t.configs
            .iter()
            .map(|c| (c.name.as_str(), c.value.as_ref().map(|v| v.as_str()))),
    )
    .map_err(|e| TopicError::new(ResponseError::InvalidConfig, e.to_string()))?;
    let created = b
        .topics
        .create(&t.name, partitions, config.clone(), validate_only)?;
    if let Some(topic) = &created {
        tracing::info!(topic = %topic.name, partitions, "created topic");
    }
    Ok((
        created.map(|t| t.id).unwrap_or_default(),
        partitions,
        config,
    ))
}

pub(crate) fn config_entries(config: &TopicConfig) -> Vec<CreatableTopicConfigs> {
    DEFS.iter()
        .filter_map(|d| {
            let (value, set) = config.get(d.name)?;
            let mut c = CreatableTopicConfigs::default();
            c.name = StrBytes::from_static_str(d.name);
            c.value = Some(StrBytes::from_string(value.to_string()));
            c.config_source = if set { SOURCE_TOPIC } else { SOURCE_DEFAULT };
            Some(c)
        })
        .collect()
}

/// The topics a DeleteTopics request names: by name, or from v6 by name or id (nil when
/// absent).
pub(crate) fn deletions(
    version: i16,
    req: DeleteTopicsRequest,
) -> Vec<(Option<TopicName>, uuid::Uuid)> {
    if version >= 6 {
        req.topics
            .into_iter()
            .map(|t| (t.name, t.topic_id))
            .collect()
    } else {
        req.topic_names
            .into_iter()
            .map(|n| (Some(n), uuid::Uuid::nil()))
            .collect()
    }
}

/// Answers DeleteTopics (by name, or by id from v6).
pub fn delete(b: &Broker, version: i16, req: DeleteTopicsRequest) -> DeleteTopicsResponse {
    let mut resp = DeleteTopicsResponse::default();
    let wanted = deletions(version, req);
    for (name, id) in wanted {
        let mut r = DeletableTopicResult::default();
        let name = match name {
            Some(n) => Ok(n),
            None => b
                .topics
                .get_by_id(&id)
                .map(|t| StrBytes::from_string(t.name.clone()).into())
                .ok_or_else(|| {
                    TopicError::new(
                        ResponseError::UnknownTopicId,
                        format!("no topic with id {id}"),
                    )
                }),
        };
        let result = name.and_then(|n| {
            r.name = Some(n.clone());
            crate::groups::refuse_internal(&n)?;
            b.topics.delete(&n)
        });
        match result {
            Ok(t) => {
                tracing::info!(topic = %t.name, "deleted topic");
                if version >= 6 {
                    r.topic_id = t.id;
                }
            }
            Err(e) => {
                r.error_code = e.code.code();
                if version >= 5 {
                    r.error_message = msg(e.message);
                }
                if version >= 6 {
                    r.topic_id = id;
                }
            }
        }
        resp.responses.push(r);
    }
    resp
}

/// Answers CreatePartitions.
pub fn create_partitions(b: &Broker, req: CreatePartitionsRequest) -> CreatePartitionsResponse {
    let mut resp = CreatePartitionsResponse::default();
    let node = b.config.node_id;
    for t in req.topics {
        let mut r = CreatePartitionsTopicResult::default();
        r.name = t.name.clone();
        let result = match b.topics.get(&t.name) {
            None => Err(TopicError::new(
                ResponseError::UnknownTopicOrPartition,
                format!("topic '{}' does not exist", t.name.as_str()),
            )),
            Some(_) if crate::groups::is_internal(&t.name) => {
                crate::groups::refuse_internal(&t.name)
            }
            Some(topic) => {
                let bad_assignment = t.assignments.as_ref().is_some_and(|a| {
                    a.len() as i32 != t.count - topic.partition_count()
                        || a.iter()
                            .any(|x| x.broker_ids.len() != 1 || x.broker_ids[0].0 != node)
                });
                if bad_assignment {
                    Err(TopicError::new(
                        ResponseError::InvalidReplicaAssignment,
                        format!("each new partition needs exactly the replica {node}"),
                    ))
                } else {
                    b.topics.add_partitions(&topic, t.count, req.validate_only)
                }
            }
        };
        if let Err(e) = result {
            r.error_code = e.code.code();
            r.error_message = msg(e.message);
        }
        resp.results.push(r);
    }
    resp
}
