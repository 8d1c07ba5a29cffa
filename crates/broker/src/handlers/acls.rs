//! DescribeAcls, CreateAcls and DeleteAcls, as `kafka-acls.sh` uses them. Describing needs
//! Describe on the cluster, changing needs Alter; without `--authorizer acl` they answer
//! SECURITY_DISABLED, as Kafka does without an authorizer.

use spate_auth::acl::{
    AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType, CLUSTER_NAME,
};
use spate_protocol::messages::create_acls_response::AclCreationResult;
use spate_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use spate_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use spate_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use spate_protocol::{ResponseError, StrBytes};

use super::msg;
use crate::security::Session;
use crate::Broker;

/// Why a request about ACLs is refused as a whole.
fn refusal(
    b: &Broker,
    session: Option<&Session>,
    operation: Operation,
) -> Option<(ResponseError, String)> {
    if !b.authorizer.enabled() {
        return Some((
            ResponseError::SecurityDisabled,
            "no authorizer is configured on the broker (start it with --authorizer acl)".into(),
        ));
    }
    if !b
        .authorizer
        .allows(session, operation, ResourceType::Cluster, CLUSTER_NAME)
    {
        return Some((
            ResponseError::ClusterAuthorizationFailed,
            format!("{operation:?} on the cluster is needed to manage ACLs"),
        ));
    }
    None
}

fn filter_of(
    resource_type: i8,
    name: Option<&StrBytes>,
    pattern: i8,
    principal: Option<&StrBytes>,
    host: Option<&StrBytes>,
    operation: i8,
    permission: i8,
) -> Result<AclFilter, String> {
    Ok(AclFilter {
        resource_type: ResourceType::from_code(resource_type)
            .ok_or_else(|| format!("unknown resource type {resource_type}"))?,
        name: name.map(|s| s.to_string()),
        pattern: PatternType::from_code(pattern)
            .ok_or_else(|| format!("unknown pattern type {pattern}"))?,
        principal: principal.map(|s| s.to_string()),
        host: host.map(|s| s.to_string()),
        operation: Operation::from_code(operation)
            .ok_or_else(|| format!("unknown operation {operation}"))?,
        permission: Permission::from_code(permission)
            .ok_or_else(|| format!("unknown permission type {permission}"))?,
    })
}

/// Answers DescribeAcls: the bindings the filter matches, grouped by resource pattern.
pub fn describe(
    b: &Broker,
    session: Option<&Session>,
    req: DescribeAclsRequest,
) -> DescribeAclsResponse {
    let mut resp = DescribeAclsResponse::default();
    if let Some((code, text)) = refusal(b, session, Operation::Describe) {
        resp.error_code = code.code();
        resp.error_message = msg(text);
        return resp;
    }
    let filter = match filter_of(
        req.resource_type_filter,
        req.resource_name_filter.as_ref(),
        req.pattern_type_filter,
        req.principal_filter.as_ref(),
        req.host_filter.as_ref(),
        req.operation,
        req.permission_type,
    ) {
        Ok(f) => f,
        Err(text) => {
            resp.error_code = ResponseError::InvalidRequest.code();
            resp.error_message = msg(text);
            return resp;
        }
    };
    let mut found = b.authorizer.describe(&filter);
    found.sort();
    for binding in found {
        let same = |r: &DescribeAclsResource| {
            r.resource_type == binding.resource_type.code()
                && r.resource_name.as_str() == binding.name
                && r.pattern_type == binding.pattern.code()
        };
        let mut d = AclDescription::default();
        d.principal = StrBytes::from_string(binding.principal.clone());
        d.host = StrBytes::from_string(binding.host.clone());
        d.operation = binding.operation.code();
        d.permission_type = binding.permission.code();
        match resp.resources.iter_mut().find(|r| same(r)) {
            Some(r) => r.acls.push(d),
            None => {
                let mut r = DescribeAclsResource::default();
                r.resource_type = binding.resource_type.code();
                r.resource_name = StrBytes::from_string(binding.name.clone());
                r.pattern_type = binding.pattern.code();
                r.acls.push(d);
                resp.resources.push(r);
            }
        }
    }
    resp
}

/// Answers CreateAcls: each creation valid or refused on its own.
pub fn create(b: &Broker, session: Option<&Session>, req: CreateAclsRequest) -> CreateAclsResponse {
    let mut resp = CreateAclsResponse::default();
    let n = req.creations.len();
    let fail_all = |resp: &mut CreateAclsResponse, code: ResponseError, text: String| {
        resp.results = (0..n)
            .map(|_| {
                let mut r = AclCreationResult::default();
                r.error_code = code.code();
                r.error_message = msg(text.clone());
                r
            })
            .collect();
    };
    if let Some((code, text)) = refusal(b, session, Operation::Alter) {
        fail_all(&mut resp, code, text);
        return resp;
    }
    // Bindings that do not even parse get their error; the others go to the store together.
    let parsed: Vec<Result<AclBinding, String>> = req
        .creations
        .iter()
        .map(|c| {
            Ok(AclBinding {
                resource_type: ResourceType::from_code(c.resource_type)
                    .ok_or_else(|| format!("unknown resource type {}", c.resource_type))?,
                name: c.resource_name.to_string(),
                pattern: PatternType::from_code(c.resource_pattern_type)
                    .ok_or_else(|| format!("unknown pattern type {}", c.resource_pattern_type))?,
                principal: c.principal.to_string(),
                host: c.host.to_string(),
                operation: Operation::from_code(c.operation)
                    .ok_or_else(|| format!("unknown operation {}", c.operation))?,
                permission: Permission::from_code(c.permission_type)
                    .ok_or_else(|| format!("unknown permission type {}", c.permission_type))?,
            })
        })
        .collect();
    let valid: Vec<AclBinding> = parsed
        .iter()
        .filter_map(|p| p.as_ref().ok().cloned())
        .collect();
    // A cluster keeps ACLs in its replicated metadata, a lone broker in a file.
    let created = match b.cluster() {
        Some(c) => c.create_acls(valid),
        None => b.authorizer.create(valid),
    };
    let outcomes = match created {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(error = %e, "saving ACLs failed");
            fail_all(&mut resp, ResponseError::UnknownServerError, e.to_string());
            return resp;
        }
    };
    let mut outcomes = outcomes.into_iter();
    for p in parsed {
        let mut r = AclCreationResult::default();
        let error = match p {
            Err(text) => Some(text),
            Ok(_) => outcomes.next().and_then(|o| o.err()).map(|e| e.to_string()),
        };
        if let Some(text) = error {
            r.error_code = ResponseError::InvalidRequest.code();
            r.error_message = msg(text);
        }
        resp.results.push(r);
    }
    resp
}

/// Answers DeleteAcls: for each filter, the bindings it removed.
pub fn delete(b: &Broker, session: Option<&Session>, req: DeleteAclsRequest) -> DeleteAclsResponse {
    let mut resp = DeleteAclsResponse::default();
    let refused = refusal(b, session, Operation::Alter);
    let filters: Vec<Result<AclFilter, String>> = req
        .filters
        .iter()
        .map(|f| {
            filter_of(
                f.resource_type_filter,
                f.resource_name_filter.as_ref(),
                f.pattern_type_filter,
                f.principal_filter.as_ref(),
                f.host_filter.as_ref(),
                f.operation,
                f.permission_type,
            )
        })
        .collect();
    let valid: Vec<AclFilter> = filters
        .iter()
        .filter_map(|f| f.as_ref().ok().cloned())
        .collect();
    let removed = match &refused {
        Some(_) => Ok(Vec::new()),
        None => match b.cluster() {
            Some(c) => c.delete_acls(&valid),
            None => b.authorizer.delete(&valid),
        },
    };
    let mut removed = match removed {
        Ok(r) => r.into_iter(),
        Err(e) => {
            tracing::error!(error = %e, "saving ACLs failed");
            Vec::new().into_iter()
        }
    };
    for f in filters {
        let mut r = DeleteAclsFilterResult::default();
        match (&refused, f) {
            (Some((code, text)), _) => {
                r.error_code = code.code();
                r.error_message = msg(text.clone());
            }
            (None, Err(text)) => {
                r.error_code = ResponseError::InvalidRequest.code();
                r.error_message = msg(text);
            }
            (None, Ok(_)) => {
                for binding in removed.next().unwrap_or_default() {
                    let mut m = DeleteAclsMatchingAcl::default();
                    m.resource_type = binding.resource_type.code();
                    m.resource_name = StrBytes::from_string(binding.name);
                    m.pattern_type = binding.pattern.code();
                    m.principal = StrBytes::from_string(binding.principal);
                    m.host = StrBytes::from_string(binding.host);
                    m.operation = binding.operation.code();
                    m.permission_type = binding.permission.code();
                    r.matching_acls.push(m);
                }
            }
        }
        resp.filter_results.push(r);
    }
    resp
}
