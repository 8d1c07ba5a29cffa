//! ApiVersions: what this broker speaks.

use spate_protocol::api::SUPPORTED;
use spate_protocol::messages::api_versions_response::{
    ApiVersion, FinalizedFeatureKey, SupportedFeatureKey,
};
use spate_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use spate_protocol::{ResponseError, StrBytes};

/// `metadata.version` levels: 3.3-IV3, the oldest Kafka 4 accepts, up to 4.3-IV0, the Kafka
/// release whose behaviour spate follows. Finalized at the latest.
const METADATA_VERSION_MIN: i16 = 7;
const METADATA_VERSION_MAX: i16 = 30;

/// The epoch of the finalized features: they never change while a broker runs.
const FEATURES_EPOCH: i64 = 1;

/// The features this broker supports (min, max) and the level each is finalized at. Only
/// what spate implements: `group.version` 1 is the KIP-848 consumer protocol,
/// `transaction.version` 2 KIP-890's; `share.version` is [`SHARE_VERSION`].
const FEATURES: &[(&str, i16, i16, i16)] = &[
    (
        "metadata.version",
        METADATA_VERSION_MIN,
        METADATA_VERSION_MAX,
        METADATA_VERSION_MAX,
    ),
    ("group.version", 0, 1, 1),
    // KIP-890 part 2: Produce v12+ enrols its partitions in the transaction, TxnOffsetCommit
    // v5 its group's offsets partition, and EndTxn v5 moves the producer to a new epoch.
    ("transaction.version", 0, 2, 2),
];

/// `share.version` 1: KIP-932 share groups, finalized at 1 as Kafka 4.2+ finalizes it once
/// share groups are on (standalone and in a cluster).
const SHARE_VERSION: (&str, i16, i16, i16) = ("share.version", 0, 1, 1);

/// Fills the v3+ feature fields (KIP-584), as `kafka-features.sh describe` reads them.
fn features(resp: &mut ApiVersionsResponse) {
    for &(name, min, max, finalized) in FEATURES.iter().chain([&SHARE_VERSION]) {
        let mut s = SupportedFeatureKey::default();
        s.name = StrBytes::from_static_str(name);
        s.min_version = min;
        s.max_version = max;
        resp.supported_features.push(s);
        let mut f = FinalizedFeatureKey::default();
        f.name = StrBytes::from_static_str(name);
        f.min_version_level = finalized;
        f.max_version_level = finalized;
        resp.finalized_features.push(f);
    }
    resp.finalized_features_epoch = FEATURES_EPOCH;
}

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

/// Answers an ApiVersions request; the feature fields exist from v3 on.
pub fn handle(version: i16, req: ApiVersionsRequest) -> ApiVersionsResponse {
    let mut resp = ApiVersionsResponse::default();
    resp.api_keys = ranges();
    if version >= 3 {
        features(&mut resp);
    }
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
    fn features_are_advertised_from_v3_with_metadata_version_finalized_at_kafka_4_3() {
        let old = handle(2, ApiVersionsRequest::default());
        assert!(old.supported_features.is_empty() && old.finalized_features.is_empty());
        let new = handle(3, ApiVersionsRequest::default());
        let mv = new
            .supported_features
            .iter()
            .find(|f| f.name.as_str() == "metadata.version")
            .expect("metadata.version supported");
        assert_eq!((mv.min_version, mv.max_version), (7, 30));
        let fin = &new.finalized_features[0];
        assert_eq!((fin.min_version_level, fin.max_version_level), (30, 30));
        assert_eq!(new.finalized_features_epoch, 1);
        // KIP-848 consumer groups are finalized at group.version 1.
        let gv = new
            .finalized_features
            .iter()
            .find(|f| f.name.as_str() == "group.version")
            .expect("group.version finalized");
        assert_eq!((gv.min_version_level, gv.max_version_level), (1, 1));
        // KIP-890 part 2 transactions are finalized at transaction.version 2.
        let tv = new
            .finalized_features
            .iter()
            .find(|f| f.name.as_str() == "transaction.version")
            .expect("transaction.version finalized");
        assert_eq!((tv.min_version_level, tv.max_version_level), (2, 2));
        // Share groups are finalized at share.version 1.
        let sv = new
            .finalized_features
            .iter()
            .find(|f| f.name.as_str() == "share.version")
            .expect("share.version finalized");
        assert_eq!((sv.min_version_level, sv.max_version_level), (1, 1));
    }

    #[test]
    fn software_names_follow_kip_511() {
        assert!(valid_software_field("apache-kafka-java"));
        assert!(valid_software_field("4.1.0"));
        assert!(valid_software_field(""));
        assert!(!valid_software_field("-leading"));
        assert!(!valid_software_field("has space"));
    }
}
