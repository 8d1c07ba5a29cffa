//! The APIs spate implements and the versions it advertises.
//!
//! This table is what ApiVersions answers with; a key or version outside it gets
//! UNSUPPORTED_VERSION. Only list what is implemented fully.

use kafka_protocol::messages::ApiKey;

/// One advertised API: key and inclusive version range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Supported {
    /// The API.
    pub key: ApiKey,
    /// Lowest version accepted.
    pub min: i16,
    /// Highest version accepted.
    pub max: i16,
}

const fn api(key: ApiKey, min: i16, max: i16) -> Supported {
    Supported { key, min, max }
}

/// Every API spate serves, in key order.
pub const SUPPORTED: &[Supported] = &[
    // v3 is the first version carrying RecordBatch v2 (magic 2); v13 names topics by id.
    api(ApiKey::Produce, 3, 13),
    // v4 is the first with isolation level and last stable offset; v13+ name topics by id;
    // v18's replica high watermark (KIP-1166) is a hint a leader may ignore.
    api(ApiKey::Fetch, 4, 18),
    // v9's latest-tiered and v11's earliest-pending-upload timestamps answer "nothing
    // tiered" (spate keeps every segment local); v10's remote-read timeout has nothing to wait
    // for. v11 is v10 on the wire (see `newer`).
    api(ApiKey::ListOffsets, 1, 11),
    // v13 adds a top-level error code (REBOOTSTRAP_REQUIRED), never needed here.
    api(ApiKey::Metadata, 0, 13),
    // v0-1 were removed in Kafka 4; v10 names topics by id.
    api(ApiKey::OffsetCommit, 2, 9),
    api(ApiKey::OffsetFetch, 1, 9),
    // v6 adds share-group keys (refused: spate has no share groups yet).
    api(ApiKey::FindCoordinator, 0, 6),
    api(ApiKey::JoinGroup, 0, 9),
    api(ApiKey::Heartbeat, 0, 4),
    api(ApiKey::LeaveGroup, 0, 5),
    api(ApiKey::SyncGroup, 0, 5),
    api(ApiKey::DescribeGroups, 0, 6),
    api(ApiKey::ListGroups, 0, 5),
    api(ApiKey::ApiVersions, 0, 4),
    api(ApiKey::CreateTopics, 2, 7),
    api(ApiKey::DeleteTopics, 1, 6),
    api(ApiKey::DeleteRecords, 0, 2),
    // v6 (KIP-939, two-phase commit with an external coordinator) is not served.
    api(ApiKey::InitProducerId, 0, 5),
    // Transactions. AddPartitionsToTxn v4+ is the batched broker-to-broker form (KIP-890
    // verification); EndTxn v5 returns the epoch the coordinator bumps per transaction under
    // transaction.version 2, which spate does not finalize, so clients use the v1 protocol.
    api(ApiKey::AddPartitionsToTxn, 0, 5),
    api(ApiKey::AddOffsetsToTxn, 0, 4),
    api(ApiKey::EndTxn, 0, 5),
    // v2 adds the transaction version of the marker (Kafka 4.3); the codec knows v1.
    api(ApiKey::WriteTxnMarkers, 1, 1),
    api(ApiKey::TxnOffsetCommit, 0, 5),
    api(ApiKey::DescribeProducers, 0, 0),
    api(ApiKey::DescribeTransactions, 0, 0),
    // v1 filters by duration, v2 by a transactional id pattern (KIP-1152).
    api(ApiKey::ListTransactions, 0, 2),
    api(ApiKey::DescribeConfigs, 1, 4),
    // v0 was removed in Kafka 4; a spate broker has one log dir, so a move is a no-op or
    // refused (see handlers::log_dirs).
    api(ApiKey::AlterReplicaLogDirs, 1, 2),
    // v1 is the oldest Kafka 4 accepts; v4 adds the dir's total and usable bytes, v5 whether
    // it is cordoned (never, here; see `newer`).
    api(ApiKey::DescribeLogDirs, 1, 5),
    api(ApiKey::DeleteGroups, 0, 2),
    api(ApiKey::AlterConfigs, 0, 2),
    api(ApiKey::CreatePartitions, 0, 3),
    api(ApiKey::IncrementalAlterConfigs, 0, 1),
    // v1 adds the election type (preferred or unclean); v2 is the flexible encoding.
    api(ApiKey::ElectLeaders, 0, 2),
    // v1 adds allowReplicationFactorChange.
    api(ApiKey::AlterPartitionReassignments, 0, 1),
    api(ApiKey::ListPartitionReassignments, 0, 0),
    api(ApiKey::OffsetDelete, 0, 0),
    // Byte-rate quotas answer with throttle_time_ms and mute the connection (KIP-219).
    api(ApiKey::DescribeClientQuotas, 0, 1),
    api(ApiKey::AlterClientQuotas, 0, 1),
    // SASL (KIP-152 framing after a v1 handshake, raw tokens after v0); v1 of
    // SaslAuthenticate carries the session lifetime (KIP-368 re-authentication).
    api(ApiKey::SaslHandshake, 0, 1),
    api(ApiKey::SaslAuthenticate, 0, 2),
    // SCRAM credentials, as kafka-configs --entity-type users manages them.
    api(ApiKey::DescribeUserScramCredentials, 0, 0),
    api(ApiKey::AlterUserScramCredentials, 0, 0),
    // ACLs as kafka-acls manages them (v1 added prefixed patterns, v2+ are flexible; Kafka 4
    // dropped v0).
    api(ApiKey::DescribeAcls, 1, 3),
    api(ApiKey::CreateAcls, 1, 3),
    api(ApiKey::DeleteAcls, 1, 3),
    // v2 can include fenced brokers, flagged.
    api(ApiKey::DescribeCluster, 0, 2),
    // v0-1 were removed in Kafka 4; v2 carries the current leader epoch (fencing), v3 the
    // replica id followers send.
    api(ApiKey::OffsetForLeaderEpoch, 2, 4),
    // KIP-714 client telemetry: uncompressed OTLP pushes under a configured subscription.
    api(ApiKey::GetTelemetrySubscriptions, 0, 0),
    api(ApiKey::PushTelemetry, 0, 0),
    // v1 (KIP-1142) lists every config resource type, v0 only client metrics subscriptions.
    api(ApiKey::ListConfigResources, 0, 1),
    // KIP-966: Kafka 4's kafka-topics --describe asks this first.
    api(ApiKey::DescribeTopicPartitions, 0, 0),
    // KIP-848 consumer groups; v1 has the client make up its member id (KIP-1082) and
    // describes each member's type.
    api(ApiKey::ConsumerGroupHeartbeat, 0, 1),
    api(ApiKey::ConsumerGroupDescribe, 0, 1),
    // KIP-932 share groups. v0 was Kafka 4.0's early access (removed in 4.1); ShareFetch and
    // ShareAcknowledge v2 (KIP-1206 acquire modes, KIP-1222 lock renewal) are not served, so
    // Kafka 4.3's client uses v1.
    api(ApiKey::ShareGroupHeartbeat, 1, 1),
    api(ApiKey::ShareGroupDescribe, 1, 1),
    api(ApiKey::ShareFetch, 1, 1),
    api(ApiKey::ShareAcknowledge, 1, 1),
    // v1 adds the lag (KIP-1226), which the codec does not know yet.
    api(ApiKey::DescribeShareGroupOffsets, 0, 0),
    api(ApiKey::AlterShareGroupOffsets, 0, 0),
    api(ApiKey::DeleteShareGroupOffsets, 0, 0),
    // The share coordinator's state APIs, which brokers send one another (ClusterAction).
    // Kafka 4.3 has WriteShareGroupState and ReadShareGroupStateSummary v1 (the delivery
    // complete count of KIP-1226), which the codec does not know yet.
    api(ApiKey::InitializeShareGroupState, 0, 0),
    api(ApiKey::ReadShareGroupState, 0, 0),
    api(ApiKey::WriteShareGroupState, 0, 0),
    api(ApiKey::DeleteShareGroupState, 0, 0),
    api(ApiKey::ReadShareGroupStateSummary, 0, 0),
    // The metadata quorum's voters and observers (kafka-metadata-quorum describe); v2 adds
    // each node's listeners and the replicas' directory ids (none here: one log dir).
    api(ApiKey::DescribeQuorum, 0, 2),
];

/// Looks up the advertised range for a raw API key.
pub fn supported(api_key: i16) -> Option<Supported> {
    SUPPORTED.iter().copied().find(|s| s.key as i16 == api_key)
}

/// True when spate implements this key at this version.
pub fn is_supported(api_key: i16, api_version: i16) -> bool {
    supported(api_key).is_some_and(|s| (s.min..=s.max).contains(&api_version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_versions_are_within_what_the_codec_knows() {
        for s in SUPPORTED {
            let codec = s.key.valid_versions();
            let max = crate::newer::schema_version(s.key, s.max);
            assert!(
                codec.min <= s.min && max <= codec.max,
                "{:?} advertises {}..{} but codec knows {}",
                s.key,
                s.min,
                s.max,
                codec
            );
        }
    }

    #[test]
    fn unknown_keys_and_versions_are_unsupported() {
        assert!(is_supported(18, 3));
        assert!(!is_supported(18, 5));
        assert!(!is_supported(9999, 0));
        assert!(is_supported(ApiKey::ConsumerGroupHeartbeat as i16, 1));
        assert!(!is_supported(ApiKey::ConsumerGroupHeartbeat as i16, 2));
        // Kafka 4.0's early-access v0 of the share group APIs is not served.
        assert!(is_supported(ApiKey::ShareGroupHeartbeat as i16, 1));
        assert!(!is_supported(ApiKey::ShareGroupHeartbeat as i16, 0));
        assert!(!is_supported(ApiKey::ShareFetch as i16, 2));
    }
}
