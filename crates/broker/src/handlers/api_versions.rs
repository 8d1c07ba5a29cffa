//! ApiVersions: what this broker speaks.

use spate_protocol::api::SUPPORTED;
use spate_protocol::messages::api_versions_response::ApiVersion;
use spate_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use spate_protocol::ResponseError;

fn ranges() -> Vec<ApiVersion> {
    SUPPORTED
        .iter()
        .map(|s| {
            let mut v = ApiVersion::default();
            v.api_key = s.key as i16;
            v.min_version = s.min;
            v.max_version = s.max;
            v
        })
        .collect()
}

/// Kafka's rule for client software names and versions (KIP-511).
fn valid_software_field(s: &str) -> bool {
    let b = s.as_bytes();
    let ok = |c: &u8| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'.';
    b.is_empty()
        || (b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(ok))
}

/// Answers an ApiVersions request.
pub fn handle(req: ApiVersionsRequest) -> ApiVersionsResponse {
    let mut resp = ApiVersionsResponse::default();
    resp.api_keys = ranges();
    if !valid_software_field(&req.client_software_name)
        || !valid_software_field(&req.client_software_version)
    {
        resp.error_code = ResponseError::InvalidRequest.code();
    }
    resp
}

/// The v0 answer to an ApiVersions request of a version we do not know.
pub fn unsupported() -> ApiVersionsResponse {
    let mut resp = ApiVersionsResponse::default();
    resp.error_code = ResponseError::UnsupportedVersion.code();
    resp.api_keys = ranges();
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn software_names_follow_kip_511() {
        assert!(valid_software_field("apache-kafka-java"));
        assert!(valid_software_field("4.1.0"));
        assert!(valid_software_field(""));
        assert!(!valid_software_field("-leading"));
        assert!(!valid_software_field("has space"));
    }
}
