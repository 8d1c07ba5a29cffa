//! The registry's errors, each with the error code Confluent's API answers for it.

/// Why a registry call failed; [`RegistryError::error_code`] is the code clients key on, and
/// its first three digits are the HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The subject has no versions (or only soft-deleted ones, unless those were asked for).
    #[error("subject '{0}' not found")]
    SubjectNotFound(String),
    /// The subject exists but not this version.
    #[error("version {version} of subject '{subject}' not found")]
    VersionNotFound {
        /// Subject asked for.
        subject: String,
        /// Version asked for, as given.
        version: String,
    },
    /// No schema has this id, or the schema given is not registered under the subject.
    #[error("{0}")]
    SchemaNotFound(String),
    /// A soft delete of a subject that is already soft-deleted.
    #[error("subject '{0}' is soft-deleted already; delete it with permanent=true to remove it")]
    SubjectSoftDeleted(String),
    /// A permanent delete of a subject that was not soft-deleted first.
    #[error("subject '{0}' must be soft-deleted before it can be deleted permanently")]
    SubjectNotSoftDeleted(String),
    /// A soft delete of a version that is already soft-deleted.
    #[error("version {version} of subject '{subject}' is soft-deleted already; delete it with permanent=true to remove it")]
    VersionSoftDeleted {
        /// Subject.
        subject: String,
        /// Version.
        version: i32,
    },
    /// A permanent delete of a version that was not soft-deleted first.
    #[error("version {version} of subject '{subject}' must be soft-deleted before it can be deleted permanently")]
    VersionNotSoftDeleted {
        /// Subject.
        subject: String,
        /// Version.
        version: i32,
    },
    /// The subject has no compatibility level of its own.
    #[error("subject '{0}' has no compatibility level of its own (ask with defaultToGlobal=true for the global one)")]
    SubjectConfigNotFound(String),
    /// The subject has no mode of its own.
    #[error(
        "subject '{0}' has no mode of its own (ask with defaultToGlobal=true for the global one)"
    )]
    SubjectModeNotFound(String),
    /// The schema breaks the subject's compatibility level.
    #[error("the schema is incompatible with an earlier version of subject '{subject}': {}", messages.join("; "))]
    Incompatible {
        /// Subject registered to.
        subject: String,
        /// What breaks, one line each.
        messages: Vec<String>,
    },
    /// The schema text does not parse or breaks its type's rules, or a reference is missing.
    #[error("invalid schema: {0}")]
    InvalidSchema(String),
    /// A version that is neither a positive number, -1 nor `latest`.
    #[error("'{0}' is not a valid version: use a number from 1 to 2147483647, -1 or 'latest'")]
    InvalidVersion(String),
    /// An unknown compatibility level.
    #[error("'{0}' is not a compatibility level: use NONE, BACKWARD, BACKWARD_TRANSITIVE, FORWARD, FORWARD_TRANSITIVE, FULL or FULL_TRANSITIVE")]
    InvalidCompatibility(String),
    /// An unknown mode.
    #[error("'{0}' is not a mode: use READWRITE, READONLY, READONLY_OVERRIDE or IMPORT")]
    InvalidMode(String),
    /// The subject's (or the registry's) mode forbids this.
    #[error("{0}")]
    OperationNotPermitted(String),
    /// The version is referenced by other schemas and cannot be deleted.
    #[error("version {version} of subject '{subject}' is referenced by schema ids {ids:?}; delete those first")]
    ReferenceExists {
        /// Subject.
        subject: String,
        /// Version.
        version: i32,
        /// Ids of the schemas that reference it.
        ids: Vec<i32>,
    },
    /// An id given in IMPORT mode belongs to another schema.
    #[error("schema id {0} already belongs to a different schema")]
    IdTaken(i32),
    /// A request that cannot be read (malformed JSON, missing fields).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The request body is over the limit.
    #[error("request body larger than {0} bytes")]
    BodyTooLarge(usize),
    /// The request body did not arrive in time.
    #[error("the request body did not arrive within {0} ms")]
    BodyTimeout(u64),
    /// The request body's content type is not one the API takes.
    #[error("content type '{0}' is not accepted: send application/vnd.schemaregistry.v1+json, application/vnd.schemaregistry+json or application/json")]
    UnsupportedMediaType(String),
    /// Reading or writing the `_schemas` topic failed.
    #[error("schema store: {0}")]
    Store(String),
    /// The write was sent but not confirmed in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// This node cannot take writes (in a cluster, another node leads `_schemas`), or
    /// forwarding the write to the node that does failed.
    #[error("{0}")]
    NotLeader(String),
    /// No credentials, or wrong ones, where security is on.
    #[error("{0}")]
    Unauthorized(String),
    /// The caller may not do this (ACLs).
    #[error("{0}")]
    Forbidden(String),
    /// No resource at this path (a malformed id in it): the plain HTTP 404 Confluent's
    /// registry answers, not one of its 404xx codes.
    #[error("{0}")]
    NoSuchPath(String),
}

impl RegistryError {
    /// Confluent's error code for this error.
    pub fn error_code(&self) -> u32 {
        match self {
            RegistryError::SubjectNotFound(_) => 40401,
            RegistryError::VersionNotFound { .. } => 40402,
            RegistryError::SchemaNotFound(_) => 40403,
            RegistryError::SubjectSoftDeleted(_) => 40404,
            RegistryError::SubjectNotSoftDeleted(_) => 40405,
            RegistryError::VersionSoftDeleted { .. } => 40406,
            RegistryError::VersionNotSoftDeleted { .. } => 40407,
            RegistryError::SubjectConfigNotFound(_) => 40408,
            RegistryError::SubjectModeNotFound(_) => 40409,
            RegistryError::Incompatible { .. } => 409,
            RegistryError::InvalidSchema(_) => 42201,
            RegistryError::InvalidVersion(_) => 42202,
            RegistryError::InvalidCompatibility(_) => 42203,
            RegistryError::InvalidMode(_) => 42204,
            RegistryError::OperationNotPermitted(_) => 42205,
            RegistryError::ReferenceExists { .. } => 42206,
            RegistryError::IdTaken(_) => 42207,
            RegistryError::BadRequest(_) => 400,
            RegistryError::BodyTimeout(_) => 408,
            RegistryError::BodyTooLarge(_) => 413,
            RegistryError::UnsupportedMediaType(_) => 415,
            RegistryError::Store(_) => 50001,
            RegistryError::Timeout(_) => 50002,
            RegistryError::NotLeader(_) => 50003,
            RegistryError::Unauthorized(_) => 40101,
            RegistryError::Forbidden(_) => 40301,
            RegistryError::NoSuchPath(_) => 404,
        }
    }

    /// The HTTP status: the error code's first three digits.
    pub fn http_status(&self) -> u16 {
        let code = self.error_code();
        let status = if code >= 1000 { code / 100 } else { code };
        u16::try_from(status).unwrap_or(500)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_http_status_is_the_error_codes_first_three_digits() {
        assert_eq!(
            RegistryError::SubjectNotFound("s".into()).http_status(),
            404
        );
        assert_eq!(RegistryError::InvalidSchema("x".into()).http_status(), 422);
        assert_eq!(
            RegistryError::Incompatible {
                subject: "s".into(),
                messages: vec![]
            }
            .http_status(),
            409
        );
        assert_eq!(RegistryError::Store("x".into()).http_status(), 500);
        assert_eq!(RegistryError::BodyTooLarge(1).http_status(), 413);
        assert_eq!(RegistryError::Unauthorized("x".into()).http_status(), 401);
        assert_eq!(RegistryError::Forbidden("x".into()).http_status(), 403);
    }
}
