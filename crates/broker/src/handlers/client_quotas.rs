//! DescribeClientQuotas and AlterClientQuotas: the quotas `kafka-configs.sh --entity-type
//! users|clients` shows and sets. Standalone they live in the data dir; in a cluster they
//! are metadata, replicated through the quorum, so every node enforces the same.

use spate_protocol::messages::alter_client_quotas_request::EntryData as AlterEntry;
use spate_protocol::messages::alter_client_quotas_response::{
    EntityData as AlteredEntity, EntryData as AlteredEntry,
};
use spate_protocol::messages::describe_client_quotas_response::{EntityData, EntryData, ValueData};
use spate_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, ApiKey, DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
};
use spate_protocol::{ResponseError, StrBytes};
use spate_quotas::{ComponentFilter, QuotaEntity, QuotaError, QuotaKey, QuotaValue};

use super::msg;
use crate::Broker;

/// Answers DescribeClientQuotas from this node's table.
pub fn describe(b: &Broker, req: DescribeClientQuotasRequest) -> DescribeClientQuotasResponse {
    let mut resp = DescribeClientQuotasResponse::default();
    let filter: Result<Vec<ComponentFilter>, QuotaError> = req
        .components
        .iter()
        .map(|c| {
            ComponentFilter::from_wire(
                c.entity_type.as_str(),
                c.match_type,
                c._match.as_ref().map(|m| m.as_str()),
            )
        })
        .collect();
    let table = b.quotas.table();
    let matched = match filter.and_then(|f| table.describe(&f, req.strict)) {
        Ok(m) => m,
        Err(e) => {
            b.metrics.error(
                ApiKey::DescribeClientQuotas as i16,
                ResponseError::InvalidRequest.code(),
            );
            resp.error_code = ResponseError::InvalidRequest.code();
            resp.error_message = msg(e.to_string());
            return resp;
        }
    };
    let mut entries = Vec::with_capacity(matched.len());
    for (entity, values) in matched {
        let mut e = EntryData::default();
        e.entity = entity
            .parts()
            .into_iter()
            .map(|(ty, name)| {
                let mut d = EntityData::default();
                d.entity_type = StrBytes::from_static_str(ty.as_str());
                d.entity_name = name.to_wire().map(|n| StrBytes::from_string(n.to_owned()));
                d
            })
            .collect();
        e.values = values
            .iter()
            .map(|(k, v)| {
                let mut d = ValueData::default();
                d.key = StrBytes::from_static_str(k.as_str());
                d.value = v.0;
                d
            })
            .collect();
        entries.push(e);
    }
    resp.entries = Some(entries);
    resp
}

/// One entry's validated change: the entity and its (key, value or removal) operations.
type Change = (QuotaEntity, Vec<(QuotaKey, Option<QuotaValue>)>);

fn validate(entry: &AlterEntry) -> Result<Change, QuotaError> {
    let entity = QuotaEntity::from_parts(entry.entity.iter().map(|e| {
        (
            e.entity_type.as_str(),
            e.entity_name.as_ref().map(|n| n.as_str()),
        )
    }))?;
    let mut ops = Vec::with_capacity(entry.ops.len());
    for op in &entry.ops {
        let key = QuotaKey::parse_for(op.key.as_str(), &entity)?;
        if ops.iter().any(|(k, _)| *k == key) {
            return Err(QuotaError::InvalidKey(format!(
                "quota key '{}' appears twice",
                key.as_str()
            )));
        }
        let value = if op.remove {
            None
        } else {
            Some(key.validate(op.value)?)
        };
        ops.push((key, value));
    }
    Ok((entity, ops))
}

/// Answers AlterClientQuotas; runs on the blocking pool (a file write, or a quorum round).
pub fn alter(b: &Broker, req: AlterClientQuotasRequest) -> AlterClientQuotasResponse {
    let mut resp = AlterClientQuotasResponse::default();
    for entry in &req.entries {
        let mut out = AlteredEntry::default();
        out.entity = entry
            .entity
            .iter()
            .map(|e| {
                let mut d = AlteredEntity::default();
                d.entity_type = e.entity_type.clone();
                d.entity_name = e.entity_name.clone();
                d
            })
            .collect();
        let result = validate(entry)
            .map_err(|e| (ResponseError::InvalidRequest, e.to_string()))
            .and_then(|(entity, ops)| {
                if req.validate_only {
                    return Ok(());
                }
                apply(b, &entity, &ops)
            });
        if let Err((code, text)) = result {
            b.metrics
                .error(ApiKey::AlterClientQuotas as i16, code.code());
            out.error_code = code.code();
            out.error_message = msg(text);
        }
        resp.entries.push(out);
    }
    resp
}

fn apply(
    b: &Broker,
    entity: &QuotaEntity,
    ops: &[(QuotaKey, Option<QuotaValue>)],
) -> Result<(), (ResponseError, String)> {
    b.topology().alter_client_quotas(b, entity, ops)
}
