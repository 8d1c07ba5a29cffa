//! Decoding a whole request frame into one of the requests spate serves.

use bytes::Bytes;
use kafka_protocol::messages::*;

use crate::api;
use crate::codec::{decode_body, CodecError};
use crate::header::{decode_header, HeaderError, RawPrefix};

/// A decoded request of a supported API and version.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Request {
    ApiVersions(ApiVersionsRequest),
    Metadata(MetadataRequest),
    Produce(ProduceRequest),
    Fetch(FetchRequest),
    ListOffsets(ListOffsetsRequest),
    CreateTopics(CreateTopicsRequest),
    DeleteTopics(DeleteTopicsRequest),
    CreatePartitions(CreatePartitionsRequest),
    DescribeConfigs(DescribeConfigsRequest),
    AlterConfigs(AlterConfigsRequest),
    IncrementalAlterConfigs(IncrementalAlterConfigsRequest),
    DescribeCluster(DescribeClusterRequest),
    InitProducerId(InitProducerIdRequest),
    FindCoordinator(FindCoordinatorRequest),
    JoinGroup(JoinGroupRequest),
    SyncGroup(SyncGroupRequest),
    Heartbeat(HeartbeatRequest),
    LeaveGroup(LeaveGroupRequest),
    OffsetCommit(OffsetCommitRequest),
    OffsetFetch(OffsetFetchRequest),
    DescribeGroups(DescribeGroupsRequest),
    ListGroups(ListGroupsRequest),
    DeleteGroups(DeleteGroupsRequest),
    OffsetDelete(OffsetDeleteRequest),
    OffsetForLeaderEpoch(OffsetForLeaderEpochRequest),
    ElectLeaders(ElectLeadersRequest),
    AlterPartitionReassignments(AlterPartitionReassignmentsRequest),
    ListPartitionReassignments(ListPartitionReassignmentsRequest),
    DescribeLogDirs(DescribeLogDirsRequest),
    DeleteRecords(DeleteRecordsRequest),
    AlterReplicaLogDirs(AlterReplicaLogDirsRequest),
    DescribeTopicPartitions(DescribeTopicPartitionsRequest),
    ListConfigResources(ListConfigResourcesRequest),
    DescribeClientQuotas(DescribeClientQuotasRequest),
    AlterClientQuotas(AlterClientQuotasRequest),
    DescribeUserScramCredentials(DescribeUserScramCredentialsRequest),
    AlterUserScramCredentials(AlterUserScramCredentialsRequest),
    SaslHandshake(SaslHandshakeRequest),
    DescribeAcls(DescribeAclsRequest),
    CreateAcls(CreateAclsRequest),
    DeleteAcls(DeleteAclsRequest),
    SaslAuthenticate(SaslAuthenticateRequest),
    GetTelemetrySubscriptions(GetTelemetrySubscriptionsRequest),
    PushTelemetry(PushTelemetryRequest),
    ConsumerGroupHeartbeat(ConsumerGroupHeartbeatRequest),
    ConsumerGroupDescribe(ConsumerGroupDescribeRequest),
    ShareGroupHeartbeat(ShareGroupHeartbeatRequest),
    ShareGroupDescribe(ShareGroupDescribeRequest),
    ShareFetch(ShareFetchRequest),
    ShareAcknowledge(ShareAcknowledgeRequest),
    DescribeShareGroupOffsets(DescribeShareGroupOffsetsRequest),
    AlterShareGroupOffsets(AlterShareGroupOffsetsRequest),
    DeleteShareGroupOffsets(DeleteShareGroupOffsetsRequest),
    InitializeShareGroupState(InitializeShareGroupStateRequest),
    ReadShareGroupState(ReadShareGroupStateRequest),
    WriteShareGroupState(WriteShareGroupStateRequest),
    DeleteShareGroupState(DeleteShareGroupStateRequest),
    ReadShareGroupStateSummary(ReadShareGroupStateSummaryRequest),
    DescribeQuorum(DescribeQuorumRequest),
    AddPartitionsToTxn(AddPartitionsToTxnRequest),
    AddOffsetsToTxn(AddOffsetsToTxnRequest),
    EndTxn(EndTxnRequest),
    WriteTxnMarkers(WriteTxnMarkersRequest),
    TxnOffsetCommit(TxnOffsetCommitRequest),
    DescribeProducers(DescribeProducersRequest),
    DescribeTransactions(DescribeTransactionsRequest),
    ListTransactions(ListTransactionsRequest),
}

/// What a frame turned out to be.
// Returned once per request and matched at once; boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Decoded {
    /// A supported request, ready to handle.
    Request {
        /// Its API.
        key: ApiKey,
        /// Its header (version, correlation id, client id).
        header: RequestHeader,
        /// Its body.
        request: Request,
    },
    /// An API key or version spate does not serve; answer UNSUPPORTED_VERSION.
    Unsupported(RawPrefix),
}

/// A frame that cannot be answered in protocol terms: the connection must close.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The header could not be read.
    #[error(transparent)]
    Header(#[from] HeaderError),
    /// The body did not match its API's schema.
    #[error(transparent)]
    Body(#[from] CodecError),
}

impl Request {
    /// Decodes a frame body (without its length prefix).
    pub fn decode(frame: Bytes) -> Result<Decoded, DecodeError> {
        let prefix = RawPrefix::peek(&frame)?;
        let key = match ApiKey::try_from(prefix.api_key) {
            Ok(k) if api::is_supported(prefix.api_key, prefix.api_version) => k,
            _ => return Ok(Decoded::Unsupported(prefix)),
        };
        let version = prefix.api_version;
        let mut body = frame;
        let header = decode_header(key, version, &mut body)?;
        // Versions newer than the codec's schemas but identical on the wire decode as those.
        let schema = crate::newer::schema_version(key, version);
        macro_rules! body {
            ($variant:ident) => {
                Request::$variant(decode_body(key, schema, &mut body)?)
            };
        }
        let req = match key {
            ApiKey::ApiVersions => body!(ApiVersions),
            ApiKey::Metadata => body!(Metadata),
            ApiKey::Produce => body!(Produce),
            ApiKey::Fetch => body!(Fetch),
            ApiKey::ListOffsets => body!(ListOffsets),
            ApiKey::CreateTopics => body!(CreateTopics),
            ApiKey::DeleteTopics => body!(DeleteTopics),
            ApiKey::CreatePartitions => body!(CreatePartitions),
            ApiKey::DescribeConfigs => body!(DescribeConfigs),
            ApiKey::AlterConfigs => body!(AlterConfigs),
            ApiKey::IncrementalAlterConfigs => body!(IncrementalAlterConfigs),
            ApiKey::DescribeCluster => body!(DescribeCluster),
            ApiKey::InitProducerId => body!(InitProducerId),
            ApiKey::FindCoordinator => body!(FindCoordinator),
            ApiKey::JoinGroup => body!(JoinGroup),
            ApiKey::SyncGroup => body!(SyncGroup),
            ApiKey::Heartbeat => body!(Heartbeat),
            ApiKey::LeaveGroup => body!(LeaveGroup),
            ApiKey::OffsetCommit => body!(OffsetCommit),
            ApiKey::OffsetFetch => body!(OffsetFetch),
            ApiKey::DescribeGroups => body!(DescribeGroups),
            ApiKey::ListGroups => body!(ListGroups),
            ApiKey::DeleteGroups => body!(DeleteGroups),
            ApiKey::OffsetDelete => body!(OffsetDelete),
            ApiKey::ElectLeaders => body!(ElectLeaders),
            ApiKey::AlterPartitionReassignments => body!(AlterPartitionReassignments),
            ApiKey::ListPartitionReassignments => body!(ListPartitionReassignments),
            ApiKey::DescribeLogDirs => body!(DescribeLogDirs),
            ApiKey::OffsetForLeaderEpoch => body!(OffsetForLeaderEpoch),
            ApiKey::DeleteRecords => body!(DeleteRecords),
            ApiKey::AlterReplicaLogDirs => body!(AlterReplicaLogDirs),
            ApiKey::DescribeTopicPartitions => body!(DescribeTopicPartitions),
            ApiKey::ListConfigResources => body!(ListConfigResources),
            ApiKey::DescribeClientQuotas => body!(DescribeClientQuotas),
            ApiKey::AlterClientQuotas => body!(AlterClientQuotas),
            ApiKey::DescribeUserScramCredentials => body!(DescribeUserScramCredentials),
            ApiKey::AlterUserScramCredentials => body!(AlterUserScramCredentials),
            ApiKey::SaslHandshake => body!(SaslHandshake),
            ApiKey::DescribeAcls => body!(DescribeAcls),
            ApiKey::CreateAcls => body!(CreateAcls),
            ApiKey::DeleteAcls => body!(DeleteAcls),
            ApiKey::SaslAuthenticate => body!(SaslAuthenticate),
            ApiKey::AddPartitionsToTxn => body!(AddPartitionsToTxn),
            ApiKey::AddOffsetsToTxn => body!(AddOffsetsToTxn),
            ApiKey::EndTxn => body!(EndTxn),
            ApiKey::WriteTxnMarkers => body!(WriteTxnMarkers),
            ApiKey::TxnOffsetCommit => body!(TxnOffsetCommit),
            ApiKey::DescribeProducers => body!(DescribeProducers),
            ApiKey::DescribeTransactions => body!(DescribeTransactions),
            ApiKey::ListTransactions => body!(ListTransactions),
            ApiKey::GetTelemetrySubscriptions => body!(GetTelemetrySubscriptions),
            ApiKey::PushTelemetry => body!(PushTelemetry),
            ApiKey::ConsumerGroupHeartbeat => body!(ConsumerGroupHeartbeat),
            ApiKey::ConsumerGroupDescribe => body!(ConsumerGroupDescribe),
            ApiKey::ShareGroupHeartbeat => body!(ShareGroupHeartbeat),
            ApiKey::ShareGroupDescribe => body!(ShareGroupDescribe),
            ApiKey::ShareFetch => body!(ShareFetch),
            ApiKey::ShareAcknowledge => body!(ShareAcknowledge),
            ApiKey::DescribeShareGroupOffsets => body!(DescribeShareGroupOffsets),
            ApiKey::AlterShareGroupOffsets => body!(AlterShareGroupOffsets),
            ApiKey::DeleteShareGroupOffsets => body!(DeleteShareGroupOffsets),
            ApiKey::InitializeShareGroupState => body!(InitializeShareGroupState),
            ApiKey::ReadShareGroupState => body!(ReadShareGroupState),
            ApiKey::WriteShareGroupState => body!(WriteShareGroupState),
            ApiKey::DeleteShareGroupState => body!(DeleteShareGroupState),
            ApiKey::ReadShareGroupStateSummary => body!(ReadShareGroupStateSummary),
            ApiKey::DescribeQuorum => body!(DescribeQuorum),
            // The supported table lists a key this match does not know: answer, don't panic.
            _ => return Ok(Decoded::Unsupported(prefix)),
        };
        Ok(Decoded::Request {
            key,
            header,
            request: req,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::protocol::Encodable;

    fn frame<T: Encodable>(key: ApiKey, version: i16, body: &T) -> Bytes {
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(5);
        crate::codec::encode_request(&header, body).unwrap()
    }

    #[test]
    fn decodes_every_advertised_version_of_metadata() {
        for v in 0..=12 {
            let f = frame(ApiKey::Metadata, v, &MetadataRequest::default());
            match Request::decode(f).unwrap() {
                Decoded::Request {
                    header,
                    request: Request::Metadata(_),
                    ..
                } => assert_eq!(header.correlation_id, 5),
                other => panic!("v{v}: {other:?}"),
            }
        }
    }

    #[test]
    fn unknown_keys_and_versions_are_unsupported_not_errors() {
        let f = Bytes::from_static(&[0x27, 0x0f, 0, 0, 0, 0, 0, 9]);
        assert!(matches!(Request::decode(f), Ok(Decoded::Unsupported(p)) if p.correlation_id == 9));
        let f = Bytes::from_static(&[0, 0, 0, 2, 0, 0, 0, 9]);
        assert!(matches!(Request::decode(f), Ok(Decoded::Unsupported(_))));
    }

    #[test]
    fn trailing_bytes_after_the_body_are_ignored() {
        let f = frame(ApiKey::Metadata, 12, &MetadataRequest::default());
        let mut padded = BytesMut::from(&f[..]);
        padded.extend_from_slice(&[0, 0, 0]);
        match Request::decode(padded.freeze()).unwrap() {
            Decoded::Request {
                request: Request::Metadata(m),
                ..
            } => assert_eq!(m, MetadataRequest::default()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn truncated_body_is_a_decode_error() {
        let f = frame(ApiKey::Produce, 9, &ProduceRequest::default());
        assert!(Request::decode(f.slice(..f.len() - 1)).is_err());
    }
}
