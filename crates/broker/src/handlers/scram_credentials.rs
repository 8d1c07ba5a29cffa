//! DescribeUserScramCredentials and AlterUserScramCredentials, as `kafka-configs
//! --entity-type users` uses them: SCRAM credentials in the broker's credential store.

use std::collections::{BTreeMap, BTreeSet};

use spate_auth::{ScramAlgorithm, ScramCredential};
use spate_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use spate_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use spate_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, ApiKey,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
};
use spate_protocol::{ResponseError, StrBytes};

use super::msg;
use crate::security::Change;
use crate::Broker;

/// Answers DescribeUserScramCredentials: every user with credentials when no users are
/// named, else each named user (RESOURCE_NOT_FOUND without credentials, DUPLICATE_RESOURCE
/// when named twice). Only mechanisms and iterations are shown, never salts or keys.
pub fn describe(
    b: &Broker,
    req: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let mut resp = DescribeUserScramCredentialsResponse::default();
    let all: BTreeMap<String, Vec<(ScramAlgorithm, u32)>> =
        b.credentials.snapshot().describe().into_iter().collect();
    let info = |creds: &[(ScramAlgorithm, u32)]| -> Vec<CredentialInfo> {
        creds
            .iter()
            .map(|(alg, iterations)| {
                let mut i = CredentialInfo::default();
                i.mechanism = alg.kafka_type();
                i.iterations = *iterations as i32;
                i
            })
            .collect()
    };
    let Some(users) = req.users.filter(|u| !u.is_empty()) else {
        for (user, creds) in &all {
            let mut r = DescribeUserScramCredentialsResult::default();
            r.user = StrBytes::from_string(user.clone());
            r.credential_infos = info(creds);
            resp.results.push(r);
        }
        return resp;
    };
    let names: Vec<String> = users.into_iter().map(|u| u.name.to_string()).collect();
    for (i, name) in names.iter().enumerate() {
        if names[..i].contains(name) {
            continue;
        }
        let mut r = DescribeUserScramCredentialsResult::default();
        r.user = StrBytes::from_string(name.clone());
        if names[i + 1..].contains(name) {
            r.error_code = ResponseError::DuplicateResource.code();
            r.error_message = msg(format!("user '{name}' is named more than once"));
        } else if let Some(creds) = all.get(name) {
            r.credential_infos = info(creds);
        } else {
            r.error_code = ResponseError::ResourceNotFound.code();
            r.error_message = msg(format!(
                "attempt to describe a user credential that does not exist: {name}"
            ));
        }
        resp.results.push(r);
    }
    resp
}

/// Answers AlterUserScramCredentials: per user, every deletion and upsertion is checked
/// first, and a user with any bad one changes nothing (Kafka's rule); the others are applied
/// and saved together.
pub fn alter(
    b: &Broker,
    req: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    let mut errors: BTreeMap<String, (ResponseError, String)> = BTreeMap::new();
    let mut changes: BTreeMap<String, Vec<Change>> = BTreeMap::new();
    let mut seen: BTreeSet<(String, i8)> = BTreeSet::new();
    let mut order: Vec<String> = Vec::new();
    let mut note = |user: &str, e: (ResponseError, String)| {
        errors.entry(user.to_string()).or_insert(e);
    };
    let ops = req
        .deletions
        .iter()
        .map(|d| (d.name.to_string(), d.mechanism, None))
        .chain(req.upsertions.iter().map(|u| {
            (
                u.name.to_string(),
                u.mechanism,
                Some((u.iterations, u.salt.clone(), u.salted_password.clone())),
            )
        }));
    for (user, mechanism, upsert) in ops {
        if !order.contains(&user) {
            order.push(user.clone());
        }
        if user.is_empty() {
            note(
                &user,
                (
                    ResponseError::UnacceptableCredential,
                    "username must not be empty".into(),
                ),
            );
            continue;
        }
        let Some(alg) = ScramAlgorithm::from_kafka_type(mechanism) else {
            note(
                &user,
                (
                    ResponseError::UnsupportedSaslMechanism,
                    format!("unknown SCRAM mechanism {mechanism}"),
                ),
            );
            continue;
        };
        if !seen.insert((user.clone(), mechanism)) {
            note(
                &user,
                (
                    ResponseError::DuplicateResource,
                    format!(
                        "a user credential cannot be altered twice in one request: {user} {}",
                        alg.mechanism().name()
                    ),
                ),
            );
            continue;
        }
        match upsert {
            None => {
                if b.credentials.get(&user, alg).is_none() {
                    note(
                        &user,
                        (
                            ResponseError::ResourceNotFound,
                            format!("attempt to delete a user credential that does not exist: {user} {}", alg.mechanism().name()),
                        ),
                    );
                    continue;
                }
                changes
                    .entry(user.clone())
                    .or_default()
                    .push(Change::Delete { user, alg });
            }
            Some((iterations, salt, salted)) => {
                match ScramCredential::from_salted_password(
                    alg,
                    &salt,
                    &salted,
                    i64::from(iterations),
                ) {
                    Ok(credential) => {
                        changes
                            .entry(user.clone())
                            .or_default()
                            .push(Change::Upsert {
                                user,
                                alg,
                                credential,
                            })
                    }
                    Err(e) => note(
                        &user,
                        (ResponseError::UnacceptableCredential, e.to_string()),
                    ),
                }
            }
        }
    }
    let apply: Vec<Change> = changes
        .into_iter()
        .filter(|(user, _)| !errors.contains_key(user))
        .flat_map(|(_, c)| c)
        .collect();
    // A cluster keeps credentials in its replicated metadata, a lone broker in a file.
    let saved = match b.cluster() {
        Some(c) => c
            .alter_scram_credentials(apply)
            .map_err(|e| (ResponseError::RequestTimedOut, e)),
        None => b
            .credentials
            .alter(apply)
            .map(|_| ())
            .map_err(|e| (ResponseError::KafkaStorageError, e)),
    };
    if let Err((code, e)) = saved {
        tracing::error!(error = %e, "saving SCRAM credentials failed");
        for user in &order {
            errors.entry(user.clone()).or_insert((code, e.to_string()));
        }
    }
    let mut resp = AlterUserScramCredentialsResponse::default();
    for user in order {
        let mut r = AlterUserScramCredentialsResult::default();
        r.user = StrBytes::from_string(user.clone());
        if let Some((code, message)) = errors.remove(&user) {
            b.metrics
                .error(ApiKey::AlterUserScramCredentials as i16, code.code());
            r.error_code = code.code();
            r.error_message = msg(message);
        }
        resp.results.push(r);
    }
    resp
}
