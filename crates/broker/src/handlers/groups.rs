//! FindCoordinator and the group membership APIs: JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup, DescribeGroups, ListGroups, DeleteGroups.

use std::sync::Arc;

use spate_groups::{GroupState, JoinRequest, Reply, SyncRequest};
use spate_protocol::messages::delete_groups_response::DeletableGroupResult;
use spate_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use spate_protocol::messages::find_coordinator_response::Coordinator as CoordinatorEntry;
use spate_protocol::messages::join_group_response::JoinGroupResponseMember;
use spate_protocol::messages::leave_group_response::MemberResponse;
use spate_protocol::messages::list_groups_response::ListedGroup;
use spate_protocol::messages::*;
use spate_protocol::{ResponseError, StrBytes};

use super::{group_operations, msg};
use crate::Broker;

const KEY_GROUP: i8 = 0;
const KEY_TRANSACTION: i8 = 1;
const KEY_SHARE: i8 = 2;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn code(e: Option<ResponseError>) -> i16 {
    e.map_or(0, |e| e.code())
}

/// A share coordinator key, `group:topicId:partition` (the topic id in Kafka's base64 text),
/// as the share-partition it names.
fn share_key(key: &str) -> Option<crate::share::SpKey> {
    use base64::Engine;
    let mut parts = key.rsplitn(3, ':');
    let partition: i32 = parts.next()?.parse().ok().filter(|p: &i32| *p >= 0)?;
    let topic = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(parts.next()?)
        .ok()?;
    let group = parts.next().filter(|g| !g.is_empty())?;
    let topic = uuid::Uuid::from_slice(&topic).ok()?;
    Some((group.to_string(), topic, partition))
}

/// Answers FindCoordinator for groups (key type 0), transactional ids (key type 1) and
/// share-partitions (key type 2, `group:topicId:partition`): the node holding the key's
/// partition of `__consumer_offsets`, `__transaction_state` or `__share_group_state`.
pub fn find_coordinator(
    b: &Broker,
    version: i16,
    req: FindCoordinatorRequest,
) -> FindCoordinatorResponse {
    let keys: Vec<StrBytes> = if version >= 4 {
        req.coordinator_keys.clone()
    } else {
        vec![req.key.clone()]
    };
    let entries: Vec<CoordinatorEntry> = keys
        .into_iter()
        .map(|key| {
            let mut c = CoordinatorEntry::default();
            c.key = key;
            let found = match req.key_type {
                KEY_GROUP => Some(b.topology().group_coordinator(b, c.key.as_str())),
                KEY_TRANSACTION => Some(b.topology().txn_coordinator(b, c.key.as_str())),
                KEY_SHARE => {
                    share_key(c.key.as_str()).map(|k| b.topology().share_coordinator(b, &k))
                }
                _ => None,
            };
            if c.key.is_empty() && req.key_type == KEY_TRANSACTION {
                c.node_id = (-1).into();
                c.port = -1;
                c.error_code = ResponseError::InvalidRequest.code();
                c.error_message = msg("an empty transactional id has no coordinator");
            } else if req.key_type == KEY_SHARE && found.is_none() {
                c.node_id = (-1).into();
                c.port = -1;
                c.error_code = ResponseError::InvalidRequest.code();
                c.error_message = msg(
                    "a share coordinator key is group:topicId:partition (the topic id in base64)",
                );
            } else if let Some(found) = found {
                match found {
                    Some((id, host, port)) => {
                        c.node_id = id.into();
                        c.host = s(&host);
                        c.port = port;
                    }
                    None => {
                        c.node_id = (-1).into();
                        c.port = -1;
                        c.error_code = ResponseError::CoordinatorNotAvailable.code();
                    }
                }
            } else {
                c.node_id = (-1).into();
                c.port = -1;
                c.error_code = ResponseError::InvalidRequest.code();
                c.error_message =
                    msg("only group, transaction and share coordinators are available");
            }
            c
        })
        .collect();
    let mut resp = FindCoordinatorResponse::default();
    if version >= 4 {
        resp.coordinators = entries;
    } else if let Some(c) = entries.into_iter().next() {
        resp.error_code = c.error_code;
        resp.node_id = c.node_id;
        resp.host = c.host;
        resp.port = c.port;
        if version >= 1 {
            resp.error_message = c.error_message;
        }
    }
    resp
}

/// Answers JoinGroup once the group lets this member in.
pub fn join(
    b: &Arc<Broker>,
    version: i16,
    client_id: &str,
    client_host: &str,
    req: JoinGroupRequest,
) -> impl std::future::Future<Output = JoinGroupResponse> + Send + 'static {
    let join = JoinRequest {
        group_id: req.group_id.to_string(),
        member_id: req.member_id.to_string(),
        group_instance_id: req.group_instance_id.map(|i| i.to_string()),
        session_timeout_ms: req.session_timeout_ms,
        // v0 has no rebalance timeout: Kafka uses the session timeout.
        rebalance_timeout_ms: if version >= 1 {
            req.rebalance_timeout_ms
        } else {
            req.session_timeout_ms
        },
        protocol_type: req.protocol_type.to_string(),
        protocols: req
            .protocols
            .into_iter()
            .map(|p| (p.name.to_string(), p.metadata))
            .collect(),
        client_id: client_id.to_string(),
        client_host: client_host.to_string(),
        require_known_member_id: version >= 4,
    };
    let answer = if !b.groups.is_coordinator(&join.group_id) {
        Err(ResponseError::NotCoordinator)
    } else {
        // A consumer group with members keeps its id; an empty one gives it up.
        b.groups
            .claim_for_classic(&join.group_id)
            .map(|()| b.groups.call(move |c, now, token| c.join(now, token, join)))
    };
    async move {
        let mut resp = JoinGroupResponse::default();
        let parked = match answer {
            Ok(a) => Ok(a.await),
            Err(e) => Err(e),
        };
        let j = match parked {
            Ok(Some(Reply::Join(_, j))) => j,
            other => {
                resp.error_code = other
                    .err()
                    .unwrap_or(ResponseError::CoordinatorNotAvailable)
                    .code();
                resp.generation_id = -1;
                resp.protocol_name = if version >= 7 {
                    None
                } else {
                    Some(StrBytes::default())
                };
                return resp;
            }
        };
        resp.error_code = code(j.error);
        resp.generation_id = j.generation_id;
        if version >= 7 {
            resp.protocol_type = j.protocol_type.map(|p| s(&p));
            resp.protocol_name = j.protocol_name.map(|p| s(&p));
        } else {
            resp.protocol_name = Some(s(j.protocol_name.as_deref().unwrap_or("")));
        }
        resp.leader = s(&j.leader);
        resp.member_id = s(&j.member_id);
        resp.members = j
            .members
            .into_iter()
            .map(|m| {
                let mut out = JoinGroupResponseMember::default();
                out.member_id = s(&m.member_id);
                if version >= 5 {
                    out.group_instance_id = m.group_instance_id.map(|i| s(&i));
                }
                out.metadata = m.metadata;
                out
            })
            .collect();
        resp
    }
}

/// Answers SyncGroup once the leader has handed out assignments.
pub fn sync(
    b: &Arc<Broker>,
    version: i16,
    req: SyncGroupRequest,
) -> impl std::future::Future<Output = SyncGroupResponse> + Send + 'static {
    let sync = SyncRequest {
        group_id: req.group_id.to_string(),
        generation_id: req.generation_id,
        member_id: req.member_id.to_string(),
        group_instance_id: req.group_instance_id.map(|i| i.to_string()),
        protocol_type: req.protocol_type.map(|p| p.to_string()),
        protocol_name: req.protocol_name.map(|p| p.to_string()),
        assignments: req
            .assignments
            .into_iter()
            .map(|a| (a.member_id.to_string(), a.assignment))
            .collect(),
    };
    let answer = b
        .groups
        .is_coordinator(&sync.group_id)
        .then(|| b.groups.call(move |c, now, token| c.sync(now, token, sync)));
    async move {
        let mut resp = SyncGroupResponse::default();
        let Some(answer) = answer else {
            resp.error_code = ResponseError::NotCoordinator.code();
            return resp;
        };
        match answer.await {
            Some(Reply::Sync(_, r)) => {
                resp.error_code = code(r.error);
                if version >= 5 {
                    resp.protocol_type = r.protocol_type.map(|p| s(&p));
                    resp.protocol_name = r.protocol_name.map(|p| s(&p));
                }
                resp.assignment = r.assignment;
            }
            _ => resp.error_code = ResponseError::CoordinatorNotAvailable.code(),
        }
        resp
    }
}

/// Answers Heartbeat.
pub fn heartbeat(b: &Broker, req: HeartbeatRequest) -> HeartbeatResponse {
    if !b.groups.is_coordinator(&req.group_id) {
        let mut resp = HeartbeatResponse::default();
        resp.error_code = ResponseError::NotCoordinator.code();
        return resp;
    }
    let instance = req.group_instance_id.as_deref();
    let e = b.groups.with(|c, now| {
        (
            c.heartbeat(
                now,
                &req.group_id,
                req.generation_id,
                &req.member_id,
                instance,
            ),
            Vec::new(),
        )
    });
    let mut resp = HeartbeatResponse::default();
    resp.error_code = code(e);
    resp
}

/// Answers LeaveGroup (one member before v3, a batch from v3).
pub fn leave(b: &Broker, version: i16, req: LeaveGroupRequest) -> LeaveGroupResponse {
    if !b.groups.is_coordinator(&req.group_id) {
        let mut resp = LeaveGroupResponse::default();
        resp.error_code = ResponseError::NotCoordinator.code();
        return resp;
    }
    let members: Vec<(String, Option<String>)> = if version >= 3 {
        req.members
            .iter()
            .map(|m| {
                (
                    m.member_id.to_string(),
                    m.group_instance_id.as_ref().map(|i| i.to_string()),
                )
            })
            .collect()
    } else {
        vec![(req.member_id.to_string(), None)]
    };
    let result = b
        .groups
        .with(|c, now| c.leave(now, &req.group_id, &members));
    let mut resp = LeaveGroupResponse::default();
    match result {
        Err(e) => resp.error_code = e.code(),
        Ok(per_member) if version >= 3 => {
            resp.members = members
                .into_iter()
                .zip(per_member)
                .map(|((id, instance), e)| {
                    let mut m = MemberResponse::default();
                    m.member_id = s(&id);
                    m.group_instance_id = instance.map(|i| s(&i));
                    m.error_code = code(e);
                    m
                })
                .collect();
        }
        Ok(per_member) => resp.error_code = code(per_member.into_iter().next().flatten()),
    }
    resp
}

/// Answers DescribeGroups.
pub fn describe(b: &Broker, version: i16, req: DescribeGroupsRequest) -> DescribeGroupsResponse {
    let mut resp = DescribeGroupsResponse::default();
    for id in req.groups {
        let mut g = DescribedGroup::default();
        g.group_id = id.clone();
        if version >= 3 {
            g.authorized_operations = group_operations(req.include_authorized_operations);
        }
        if !b.groups.is_coordinator(&id) {
            g.error_code = ResponseError::NotCoordinator.code();
            resp.groups.push(g);
            continue;
        }
        let described = b.groups.coordinator(|c| c.describe(&id));
        if described.is_none() && b.groups.consumer(|c| c.contains(&id)) {
            // Kafka answers DescribeGroups only for classic groups.
            g.group_state = s("Dead");
            if version >= 6 {
                g.error_code = ResponseError::GroupIdNotFound.code();
                g.error_message = msg(format!("Group {} is not a classic group.", id.as_str()));
            }
            resp.groups.push(g);
            continue;
        }
        match described {
            Some(d) => {
                g.group_state = s(d.state.name());
                g.protocol_type = s(&d.protocol_type);
                g.protocol_data = s(&d.protocol);
                g.members = d
                    .members
                    .into_iter()
                    .map(|m| {
                        let mut out = DescribedGroupMember::default();
                        out.member_id = s(&m.member_id);
                        if version >= 4 {
                            out.group_instance_id = m.group_instance_id.map(|i| s(&i));
                        }
                        out.client_id = s(&m.client_id);
                        out.client_host = s(&m.client_host);
                        out.member_metadata = m.metadata;
                        out.member_assignment = m.assignment;
                        out
                    })
                    .collect();
            }
            None if b.groups.offsets(|o| o.has_group(&id)) => {
                g.group_state = s(GroupState::Empty.name());
            }
            None => {
                g.group_state = s("Dead");
                if version >= 6 {
                    g.error_code = ResponseError::GroupIdNotFound.code();
                    g.error_message = msg(format!("group '{}' does not exist", id.as_str()));
                }
            }
        }
        resp.groups.push(g);
    }
    resp
}

/// Answers ListGroups, with the state and type filters of v4 and v5.
pub fn list(b: &Broker, version: i16, req: ListGroupsRequest) -> ListGroupsResponse {
    // In a cluster each node holds (and lists) only the groups it coordinates: those of the
    // offsets partitions it leads.
    let mut groups: Vec<(String, &'static str, String, &'static str)> = b
        .groups
        .coordinator(|c| c.list())
        .into_iter()
        .map(|(id, state, ptype)| (id, state.name(), ptype, "classic"))
        .collect();
    for (id, state, _) in b.groups.consumer(|c| c.list()) {
        groups.push((id, state.name(), "consumer".to_string(), "consumer"));
    }
    for (id, state) in b.shares.list() {
        groups.push((id, state, "share".to_string(), "share"));
    }
    let with_offsets: Vec<String> = b
        .groups
        .offsets(|o| o.group_ids().map(str::to_string).collect());
    for g in with_offsets {
        if !groups.iter().any(|(id, ..)| *id == g) {
            groups.push((g, GroupState::Empty.name(), String::new(), "classic"));
        }
    }
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    let states: Vec<String> = req.states_filter.iter().map(|f| f.to_lowercase()).collect();
    let types: Vec<String> = req.types_filter.iter().map(|f| f.to_lowercase()).collect();
    let mut resp = ListGroupsResponse::default();
    resp.groups = groups
        .into_iter()
        .filter(|(_, state, ..)| states.is_empty() || states.contains(&state.to_lowercase()))
        .filter(|(.., kind)| types.is_empty() || types.iter().any(|t| t == kind))
        .map(|(id, state, protocol_type, kind)| {
            let mut g = ListedGroup::default();
            g.group_id = s(&id).into();
            g.protocol_type = s(&protocol_type);
            if version >= 4 {
                g.group_state = s(state);
            }
            if version >= 5 {
                g.group_type = s(kind);
            }
            g
        })
        .collect();
    resp
}

/// Deletes the share-group state of every share-partition of `group` from the cluster's
/// share coordinators (after DeleteGroups removed the group).
fn delete_share_state(b: &Broker, group: &str) {
    let Some(route) = b.shares.route() else {
        return;
    };
    let keys = super::share_groups::cluster_keys(b, group, None);
    let group = group.to_string();
    tokio::spawn(async move {
        let found = match route.summaries(group.clone(), keys).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(group, error = ?e, "cannot find the share-group state of a deleted group");
                return;
            }
        };
        for (key, _) in found {
            if let Err(e) = route.delete(key).await {
                tracing::warn!(group, error = ?e, "cannot delete the share-group state of a deleted group");
            }
        }
    });
}

/// Answers DeleteGroups: groups without members lose their offsets too.
pub fn delete(b: &Broker, req: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut resp = DeleteGroupsResponse::default();
    for id in req.groups_names {
        let mut r = DeletableGroupResult::default();
        r.group_id = id.clone();
        if b.shares.has_group(&id) && b.shares.clustered() {
            // The group goes now; its share-partitions' state is deleted from their share
            // coordinators, on other nodes, in the background.
            match b.shares.remove_empty_group(&id) {
                Ok(()) => delete_share_state(b, &id),
                Err(e) => r.error_code = e.code(),
            }
        } else if b.shares.has_group(&id) {
            if let Err(e) = b.shares.delete_group(&b.topics, &id) {
                r.error_code = e.code();
            }
        } else if !b.groups.is_coordinator(&id) {
            r.error_code = ResponseError::NotCoordinator.code();
        } else if let Err(e) = b.groups.delete_group(&id) {
            r.error_code = e.code();
        }
        resp.results.push(r);
    }
    resp
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    #[test]
    fn share_coordinator_keys_are_group_topic_id_and_partition() {
        let id = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        let text = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id.as_bytes());
        assert_eq!(
            super::share_key(&format!("a:b:{text}:7")),
            Some(("a:b".to_string(), id, 7)),
            "a group id may hold colons"
        );
        assert_eq!(super::share_key(&format!("g:{text}:-1")), None);
        assert_eq!(super::share_key(&format!(":{text}:0")), None);
        assert_eq!(super::share_key("g:not-base64!:0"), None);
        assert_eq!(super::share_key("g:0"), None);
    }
}
