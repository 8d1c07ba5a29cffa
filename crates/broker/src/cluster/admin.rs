//! Metadata and topic administration in cluster mode: answers come from the metadata image,
//! changes go through the quorum (from any node: followers forward to the controller), and
//! a change is answered once this node's partitions reflect it, so the client's next request
//! to this node sees it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use spate_cluster::controller;
use spate_cluster::metadata::{BrokerId, CommandOutcome, MetadataCommand, MetadataImage};
use spate_cluster::node::ProposeError;
use spate_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use spate_protocol::messages::create_topics_request::CreatableTopic;
use spate_protocol::messages::create_topics_response::CreatableTopicResult;
use spate_protocol::messages::delete_topics_response::DeletableTopicResult;
use spate_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use spate_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    DeleteTopicsRequest, DeleteTopicsResponse, MetadataRequest, MetadataResponse,
};
use spate_protocol::{ResponseError, StrBytes};
use uuid::Uuid;

use super::Cluster;
use crate::handlers::metadata::{fill_cluster_fields, Shape};
use crate::handlers::{msg, OPERATIONS_OMITTED, TOPIC_OPERATIONS};
use crate::registry::{validate_topic_name, Topic, TopicError};
use crate::topic_config::TopicConfig;
use crate::Broker;

/// Longest a topic change waits for this node's partitions to reflect it.
const RECONCILE_WAIT_MAX: Duration = Duration::from_secs(10);

/// A refused change: a Kafka error code and a message.
type Refusal = (i16, String);

fn refusal(e: &ProposeError) -> Refusal {
    (e.kafka_error_code(), e.to_string())
}

/// The Kafka error a refused proposal answers with (UNKNOWN_SERVER_ERROR for a code this
/// broker does not know).
fn response_error(e: &ProposeError) -> ResponseError {
    ResponseError::try_from_code(e.kafka_error_code()).unwrap_or(ResponseError::UnknownServerError)
}

/// Metadata from the image, auto-creating requested topics when allowed.
pub async fn metadata(b: Arc<Broker>, version: i16, req: MetadataRequest) -> MetadataResponse {
    let Some(cluster) = b.cluster().cloned() else {
        return MetadataResponse::default();
    };
    let auto_create = b.config.auto_create_topics && (version < 4 || req.allow_auto_topic_creation);
    if auto_create {
        let image = cluster.image();
        let missing: Vec<String> = req
            .topics
            .iter()
            .flatten()
            .filter_map(|t| t.name.as_ref())
            .filter(|n| image.topic(n).is_none() && validate_topic_name(n).is_ok())
            .map(|n| n.to_string())
            .collect();
        for name in missing {
            let partitions = b.config.default_partitions;
            match propose_create(&b, &cluster, &name, partitions, -1, BTreeMap::new(), None).await {
                Ok(id) => {
                    tracing::info!(topic = %name, partitions, "auto-created topic");
                    wait_for_topic(&cluster, &name, Some(id), RECONCILE_WAIT_MAX).await;
                }
                Err((code, why)) => {
                    tracing::debug!(topic = %name, code, reason = %why, "auto-creation refused")
                }
            }
        }
    }
    describe_metadata(&b, &cluster, version, req)
}

/// Whether answering this Metadata request may create topics (and so must wait on the quorum).
pub fn metadata_may_create(
    b: &Broker,
    cluster: &Cluster,
    version: i16,
    req: &MetadataRequest,
) -> bool {
    let allowed = b.config.auto_create_topics && (version < 4 || req.allow_auto_topic_creation);
    let image = cluster.image();
    allowed
        && req.topics.as_ref().is_some_and(|ts| {
            ts.iter()
                .filter_map(|t| t.name.as_ref())
                .any(|n| image.topic(n).is_none())
        })
}

/// The brokers a Metadata answer lists: the live ones, and always the answering node (`me`).
/// While the image shows every broker fenced (the quorum lost them all during a partition, a
/// window a chaos run hit), a list of live brokers is empty, and librdkafka forgets every broker
/// a Metadata answer leaves out: with none left it never asked anyone again. The node that
/// answers is reachable, so it is always listed.
fn metadata_brokers(
    image: &MetadataImage,
    me: MetadataResponseBroker,
) -> Vec<MetadataResponseBroker> {
    let mut brokers: Vec<MetadataResponseBroker> = image
        .live_brokers()
        .map(|reg| {
            let mut node = MetadataResponseBroker::default();
            node.node_id = reg.id.into();
            node.host = StrBytes::from_string(reg.kafka_host.clone());
            node.port = i32::from(reg.kafka_port);
            node.rack = reg.rack.clone().map(StrBytes::from_string);
            node
        })
        .collect();
    if !brokers.iter().any(|n| n.node_id == me.node_id) {
        let pos = brokers.partition_point(|n| n.node_id.0 < me.node_id.0);
        brokers.insert(pos, me);
    }
    brokers
}

/// Metadata as the image has it: live brokers, the controller, and per partition its leader,
/// epoch, replicas, ISR and offline replicas.
pub fn describe_metadata(
    b: &Broker,
    cluster: &Cluster,
    version: i16,
    req: MetadataRequest,
) -> MetadataResponse {
    let image = cluster.image();
    let mut resp = MetadataResponse::default();
    let me = MetadataResponseBroker::default()
        .with_node_id(cluster.broker_id.into())
        .with_host(StrBytes::from_string(b.config.advertised_host.clone()))
        .with_port(b.config.advertised_port);
    resp.brokers = metadata_brokers(&image, me);
    let Shape { with_ops, all } = fill_cluster_fields(
        &mut resp,
        version,
        &req,
        &cluster.cluster_id(),
        cluster.controller_id().unwrap_or(-1),
    );
    if all {
        resp.topics = image
            .topics()
            .values()
            .map(|t| describe_topic(&image, version, t, with_ops))
            .collect();
        return resp;
    }
    for wanted in req.topics.unwrap_or_default() {
        let topic = match &wanted.name {
            Some(name) => image
                .topic(name)
                .ok_or(if validate_topic_name(name).is_err() {
                    ResponseError::InvalidTopicException
                } else {
                    ResponseError::UnknownTopicOrPartition
                }),
            None => image
                .topic_by_id(wanted.topic_id)
                .ok_or(ResponseError::UnknownTopicId),
        };
        match topic {
            Ok(t) => resp
                .topics
                .push(describe_topic(&image, version, t, with_ops)),
            Err(code) => resp.topics.push(crate::handlers::metadata::missing_topic(
                version, &wanted, code,
            )),
        }
    }
    resp
}

fn describe_topic(
    image: &MetadataImage,
    version: i16,
    t: &spate_cluster::metadata::TopicImage,
    with_ops: bool,
) -> MetadataResponseTopic {
    let mut out = MetadataResponseTopic::default();
    out.name = Some(StrBytes::from_string(t.name.clone()).into());
    out.is_internal = crate::groups::is_internal(&t.name);
    if version >= 10 {
        out.topic_id = t.id;
    }
    if version >= 8 {
        out.topic_authorized_operations = if with_ops {
            TOPIC_OPERATIONS
        } else {
            OPERATIONS_OMITTED
        };
    }
    let ids = |v: &[BrokerId]| v.iter().map(|&id| id.into()).collect::<Vec<_>>();
    out.partitions = t
        .partitions
        .iter()
        .enumerate()
        .map(|(index, ps)| {
            let mut mp = MetadataResponsePartition::default();
            mp.partition_index = index as i32;
            mp.leader_id = ps.leader_or_no_leader().into();
            if version >= 7 {
                mp.leader_epoch = ps.leader_epoch;
            }
            mp.replica_nodes = ids(&ps.replicas);
            mp.isr_nodes = ids(&ps.isr);
            if version >= 5 {
                mp.offline_replicas = ids(&controller::offline_replicas(image, &ps.replicas));
            }
            if ps.leader.is_none() {
                mp.error_code = ResponseError::LeaderNotAvailable.code();
            }
            mp
        })
        .collect();
    out
}

/// Proposes a topic; returns its id. `replication_factor` -1 takes the default, capped at
/// the live brokers.
async fn propose_create(
    b: &Broker,
    cluster: &Cluster,
    name: &str,
    partitions: i32,
    replication_factor: i16,
    configs: BTreeMap<String, String>,
    assignment: Option<Vec<Vec<BrokerId>>>,
) -> Result<Uuid, Refusal> {
    let image = cluster.image();
    let id = Uuid::new_v4();
    let cmd = match assignment {
        Some(assignment) => MetadataCommand::CreateTopic {
            name: name.to_owned(),
            topic_id: id,
            configs,
            assignment,
        },
        None => {
            let rf = if replication_factor == -1 {
                let live = i16::try_from(image.live_brokers().count()).unwrap_or(i16::MAX);
                cluster.settings.default_replication_factor.min(live).max(1)
            } else {
                replication_factor
            };
            let partitions = if partitions == -1 {
                b.config.default_partitions
            } else {
                partitions
            };
            controller::create_topic_command(&image, name, id, partitions, rf, configs)
                .map_err(|e| (e.kafka_error_code(), e.to_string()))?
        }
    };
    match cluster.propose(cmd).await {
        Ok(CommandOutcome::TopicCreated { topic_id }) => Ok(topic_id),
        Ok(other) => Err((
            ResponseError::UnknownServerError.code(),
            format!("unexpected outcome {other:?}"),
        )),
        Err(e) => Err(refusal(&e)),
    }
}

/// Waits until this node's registry has the topic (with `id`, when given).
async fn wait_for_topic(cluster: &Cluster, name: &str, id: Option<Uuid>, timeout: Duration) {
    cluster
        .wait_reconciled(timeout, |image| {
            image
                .topic(name)
                .is_some_and(|t| id.is_none_or(|id| t.id == id))
        })
        .await;
}

/// CreateTopics through the quorum.
pub async fn create_topics(
    b: Arc<Broker>,
    version: i16,
    req: CreateTopicsRequest,
) -> CreateTopicsResponse {
    let mut resp = CreateTopicsResponse::default();
    let Some(cluster) = b.cluster().cloned() else {
        return resp;
    };
    let duplicates = crate::handlers::topics::duplicate_names(&req.topics);
    let wait = Duration::from_millis(req.timeout_ms.max(0) as u64).min(RECONCILE_WAIT_MAX);
    for t in req.topics {
        let mut r = CreatableTopicResult::default();
        r.name = t.name.clone();
        let outcome = if duplicates.contains(&t.name) {
            Err((
                ResponseError::InvalidRequest.code(),
                "topic listed more than once in the request".to_owned(),
            ))
        } else {
            create_one(&b, &cluster, &t, req.validate_only, wait).await
        };
        match outcome {
            Ok((id, partitions, rf, config)) => {
                if version >= 7 {
                    r.topic_id = id;
                }
                if version >= 5 {
                    r.num_partitions = partitions;
                    r.replication_factor = rf;
                    r.configs = Some(crate::handlers::topics::config_entries(&config));
                }
            }
            Err((code, message)) => {
                r.error_code = code;
                r.error_message = msg(message);
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

async fn create_one(
    b: &Broker,
    cluster: &Cluster,
    t: &CreatableTopic,
    validate_only: bool,
    wait: Duration,
) -> Result<(Uuid, i32, i16, TopicConfig), Refusal> {
    let explicit = !t.assignments.is_empty();
    if explicit && (t.num_partitions != -1 || t.replication_factor != -1) {
        return Err((
            ResponseError::InvalidRequest.code(),
            "give either replica assignments or partitions and replication factor, not both".into(),
        ));
    }
    validate_topic_name(&t.name).map_err(|m| (ResponseError::InvalidTopicException.code(), m))?;
    let config = TopicConfig::from_pairs(
        t.configs
            .iter()
            .map(|c| (c.name.as_str(), c.value.as_ref().map(|v| v.as_str()))),
    )
    .map_err(|e| (ResponseError::InvalidConfig.code(), e.to_string()))?;
    let configs: BTreeMap<String, String> = t
        .configs
        .iter()
        .filter_map(|c| Some((c.name.to_string(), c.value.as_ref()?.to_string())))
        .collect();
    let assignment = if explicit {
        let mut sorted: Vec<_> = t.assignments.iter().collect();
        sorted.sort_by_key(|a| a.partition_index);
        let contiguous = sorted
            .iter()
            .enumerate()
            .all(|(i, a)| a.partition_index == i as i32);
        if !contiguous {
            return Err((
                ResponseError::InvalidReplicaAssignment.code(),
                "assignments must cover partitions 0..n".into(),
            ));
        }
        Some(
            sorted
                .iter()
                .map(|a| a.broker_ids.iter().map(|id| id.0).collect())
                .collect::<Vec<Vec<BrokerId>>>(),
        )
    } else {
        None
    };
    let image = cluster.image();
    if image.topic(&t.name).is_some() {
        return Err((
            ResponseError::TopicAlreadyExists.code(),
            format!("topic '{}' already exists", t.name.as_str()),
        ));
    }
    let (partitions, rf) = match &assignment {
        Some(a) => (a.len() as i32, a.first().map_or(0, |r| r.len() as i16)),
        None => {
            let live = i16::try_from(image.live_brokers().count()).unwrap_or(i16::MAX);
            let rf = if t.replication_factor == -1 {
                cluster.settings.default_replication_factor.min(live).max(1)
            } else {
                t.replication_factor
            };
            let partitions = if t.num_partitions == -1 {
                b.config.default_partitions
            } else {
                t.num_partitions
            };
            (partitions, rf)
        }
    };
    if validate_only {
        // Check the placement without proposing it.
        if assignment.is_none() {
            controller::create_topic_command(&image, &t.name, Uuid::nil(), partitions, rf, configs)
                .map_err(|e| (e.kafka_error_code(), e.to_string()))?;
        }
        return Ok((Uuid::nil(), partitions, rf, config));
    }
    let id = propose_create(b, cluster, &t.name, partitions, rf, configs, assignment).await?;
    tracing::info!(topic = %t.name.as_str(), partitions, replication_factor = rf, "created topic");
    wait_for_topic(cluster, &t.name, Some(id), wait).await;
    Ok((id, partitions, rf, config))
}

/// DeleteTopics through the quorum.
pub async fn delete_topics(
    b: Arc<Broker>,
    version: i16,
    req: DeleteTopicsRequest,
) -> DeleteTopicsResponse {
    let mut resp = DeleteTopicsResponse::default();
    let Some(cluster) = b.cluster().cloned() else {
        return resp;
    };
    let timeout_ms = req.timeout_ms;
    let wanted = crate::handlers::topics::deletions(version, req);
    let wait = Duration::from_millis(timeout_ms.max(0) as u64).min(RECONCILE_WAIT_MAX);
    for (name, id) in wanted {
        let mut r = DeletableTopicResult::default();
        let image = cluster.image();
        let name = match name {
            Some(n) => Some(n.to_string()),
            None => image.topic_by_id(id).map(|t| t.name.clone()),
        };
        let result = match name {
            None => Err((
                ResponseError::UnknownTopicId.code(),
                format!("no topic with id {id}"),
            )),
            Some(n) if crate::groups::is_internal(&n) => {
                r.name = Some(StrBytes::from_string(n.clone()).into());
                Err(crate::groups::internal_refusal(&n))
            }
            Some(n) => {
                r.name = Some(StrBytes::from_string(n.clone()).into());
                match cluster
                    .propose(MetadataCommand::DeleteTopic { name: n.clone() })
                    .await
                {
                    Ok(CommandOutcome::TopicDeleted { topic_id }) => {
                        cluster
                            .wait_reconciled(wait, |image| {
                                image.topic(&n).is_none_or(|t| t.id != topic_id)
                            })
                            .await;
                        tracing::info!(topic = %n, "deleted topic");
                        Ok(topic_id)
                    }
                    Ok(other) => Err((
                        ResponseError::UnknownServerError.code(),
                        format!("unexpected outcome {other:?}"),
                    )),
                    Err(e) => Err(refusal(&e)),
                }
            }
        };
        match result {
            Ok(topic_id) => {
                if version >= 6 {
                    r.topic_id = topic_id;
                }
            }
            Err((code, message)) => {
                r.error_code = code;
                if version >= 5 {
                    r.error_message = msg(message);
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

/// CreatePartitions through the quorum.
pub async fn create_partitions(
    b: Arc<Broker>,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut resp = CreatePartitionsResponse::default();
    let Some(cluster) = b.cluster().cloned() else {
        return resp;
    };
    let wait = Duration::from_millis(req.timeout_ms.max(0) as u64).min(RECONCILE_WAIT_MAX);
    for t in req.topics {
        let mut r = CreatePartitionsTopicResult::default();
        r.name = t.name.clone();
        let image = cluster.image();
        let cmd = match &t.assignments {
            _ if crate::groups::is_internal(&t.name) => {
                Err(crate::groups::internal_refusal(&t.name))
            }
            Some(a) => {
                let current = image
                    .topic(&t.name)
                    .map_or(0, |x| x.partitions.len() as i32);
                if a.len() as i32 != t.count - current {
                    Err((
                        ResponseError::InvalidReplicaAssignment.code(),
                        format!(
                            "{} assignments for {} new partitions",
                            a.len(),
                            t.count - current
                        ),
                    ))
                } else {
                    Ok(MetadataCommand::CreatePartitions {
                        name: t.name.to_string(),
                        assignment: a
                            .iter()
                            .map(|x| x.broker_ids.iter().map(|id| id.0).collect())
                            .collect(),
                    })
                }
            }
            None => controller::create_partitions_command(&image, &t.name, t.count)
                .map_err(|e| (e.kafka_error_code(), e.to_string())),
        };
        let result = match cmd {
            Err(e) => Err(e),
            Ok(_) if req.validate_only => Ok(()),
            Ok(cmd) => match cluster.propose(cmd).await {
                Ok(_) => {
                    let name = t.name.to_string();
                    let count = t.count as usize;
                    cluster
                        .wait_reconciled(wait, |image| {
                            image
                                .topic(&name)
                                .is_some_and(|x| x.partitions.len() >= count)
                        })
                        .await;
                    Ok(())
                }
                Err(e) => Err(refusal(&e)),
            },
        };
        if let Err((code, message)) = result {
            r.error_code = code;
            r.error_message = msg(message);
        }
        resp.results.push(r);
    }
    resp
}

impl Cluster {
    /// Sets a topic's config through the quorum and waits until this node applied it. Runs
    /// on the blocking pool (the config handlers do), so it may wait on the runtime.
    pub(crate) fn set_topic_config(
        &self,
        topic: &Topic,
        config: &TopicConfig,
    ) -> Result<(), TopicError> {
        let current = topic.config();
        let set: BTreeMap<String, String> = config.overrides().clone();
        let remove: Vec<String> = current
            .overrides()
            .keys()
            .filter(|k| !set.contains_key(*k))
            .cloned()
            .collect();
        let cmd = MetadataCommand::AlterTopicConfigs {
            name: topic.name.clone(),
            set,
            remove,
        };
        let handle = tokio::runtime::Handle::current();
        let wanted = config.clone();
        let name = topic.name.clone();
        handle.block_on(async {
            self.propose(cmd)
                .await
                .map_err(|e| TopicError::new(response_error(&e), e.to_string()))?;
            self.wait_reconciled(RECONCILE_WAIT_MAX, |image| {
                image
                    .topic(&name)
                    .is_some_and(|t| &t.configs == wanted.overrides())
            })
            .await;
            Ok(())
        })
    }

    /// Sets and removes dynamic broker configs through the quorum (`resource` is `""` for the
    /// cluster default or a broker id). Runs on the blocking pool, like the topic version.
    pub(crate) fn set_broker_configs(
        &self,
        resource: &str,
        set: BTreeMap<String, String>,
        remove: Vec<String>,
    ) -> Result<(), TopicError> {
        let cmd = MetadataCommand::AlterBrokerConfigs {
            resource: resource.to_owned(),
            set,
            remove,
        };
        tokio::runtime::Handle::current().block_on(async {
            self.propose(cmd)
                .await
                .map(|_| ())
                .map_err(|e| TopicError::new(response_error(&e), e.to_string()))
        })
    }

    /// Sets and removes one share group's configs through the quorum, and waits until this
    /// node applied them (a describe right after reads them). Runs on the blocking pool.
    pub(crate) fn set_group_configs(
        &self,
        group: &str,
        set: BTreeMap<String, String>,
        remove: Vec<String>,
    ) -> Result<(), TopicError> {
        let cmd = MetadataCommand::AlterGroupConfigs {
            group: group.to_owned(),
            set: set.clone(),
            remove: remove.clone(),
        };
        tokio::runtime::Handle::current().block_on(async {
            self.propose(cmd)
                .await
                .map_err(|e| TopicError::new(response_error(&e), e.to_string()))?;
            self.wait_reconciled(RECONCILE_WAIT_MAX, |image| {
                let now = image.group_configs().get(group);
                set.iter()
                    .all(|(k, v)| now.and_then(|c| c.get(k)) == Some(v))
                    && remove
                        .iter()
                        .all(|k| now.is_none_or(|c| !c.contains_key(k)))
            })
            .await;
            Ok(())
        })
    }

    /// Sets and removes one entity's client quotas through the quorum; waits for the commit
    /// (runs on the blocking pool). Every node applies them from its metadata image.
    pub(crate) fn alter_client_quotas(
        &self,
        entity: &spate_quotas::QuotaEntity,
        ops: &[(spate_quotas::QuotaKey, Option<spate_quotas::QuotaValue>)],
    ) -> Result<(), (ResponseError, String)> {
        let cmd = MetadataCommand::AlterClientQuotas {
            entity: entity.clone(),
            set: ops.iter().filter_map(|(k, v)| v.map(|v| (*k, v))).collect(),
            remove: ops
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(k, _)| *k)
                .collect(),
        };
        tokio::runtime::Handle::current().block_on(async {
            self.propose(cmd)
                .await
                .map(|_| ())
                .map_err(|e| (response_error(&e), e.to_string()))
        })
    }

    /// The next producer id from this node's block, taking a new block from the quorum when
    /// it runs out: ids are unique across the cluster, so a producer keeps its identity when
    /// it fails over to another node. Runs on the blocking pool.
    pub(crate) fn allocate_producer_id(&self) -> Result<i64, String> {
        {
            let mut block = self.producer_ids.lock();
            if block.0 < block.1 {
                block.0 += 1;
                return Ok(block.0 - 1);
            }
        }
        let epoch = self
            .broker_epoch()
            .ok_or_else(|| "not registered with the controller yet".to_owned())?;
        let cmd = MetadataCommand::AllocateProducerIds {
            broker_id: self.broker_id,
            broker_epoch: epoch,
        };
        let outcome = tokio::runtime::Handle::current()
            .block_on(self.propose(cmd))
            .map_err(|e| e.to_string())?;
        let CommandOutcome::ProducerIdsAllocated(b) = outcome else {
            return Err(format!("unexpected outcome {outcome:?}"));
        };
        let mut block = self.producer_ids.lock();
        *block = (b.first + 1, b.first + b.size);
        Ok(b.first)
    }
}

#[cfg(test)]
mod tests {
    use spate_cluster::metadata::MetadataCommand;

    use super::*;

    use crate::cluster::test_image::register;

    fn me(id: i32) -> MetadataResponseBroker {
        MetadataResponseBroker::default()
            .with_node_id(id.into())
            .with_host(StrBytes::from_static_str("me"))
            .with_port(9999)
    }

    #[test]
    fn a_metadata_answer_lists_the_answering_node_even_when_the_image_shows_every_broker_fenced() {
        let mut image = MetadataImage::new();
        for id in 1..=3 {
            register(&mut image, id);
        }
        let ids = |v: &[MetadataResponseBroker]| v.iter().map(|n| n.node_id.0).collect::<Vec<_>>();
        let live = metadata_brokers(&image, me(2));
        assert_eq!(ids(&live), vec![1, 2, 3]);
        assert_eq!(live[1].port, 9092, "a live node is listed as registered");
        for id in 1..=3 {
            image
                .apply(&MetadataCommand::FenceBroker {
                    broker_id: id,
                    broker_epoch: image.broker(id).unwrap().epoch,
                })
                .unwrap();
        }
        assert_eq!(image.live_brokers().count(), 0);
        let fenced = metadata_brokers(&image, me(2));
        assert_eq!(ids(&fenced), vec![2], "never an empty broker list");
    }
}
