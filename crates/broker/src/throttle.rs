//! The request quota's throttle in a response (KIP-124): a client over its
//! `request_percentage` sees `throttle_time_ms` in the answer, as Kafka sends it, besides the
//! broker muting its connection for that long.

use std::cell::Cell;
use std::time::Instant;

use spate_protocol::messages::*;

use crate::quotas::{Mute, QuotaKind};
use crate::Broker;

/// A response that may carry a throttle time.
pub(crate) trait Throttled {
    /// Raises the response's throttle time to `ms` (a response without the field ignores it;
    /// versions without it do not encode it).
    fn raise_throttle(&mut self, ms: i32);
}

macro_rules! throttled {
    ($($t:ty),* $(,)?) => {
        $(impl Throttled for $t {
            fn raise_throttle(&mut self, ms: i32) {
                self.throttle_time_ms = self.throttle_time_ms.max(ms);
            }
        })*
    };
}

throttled!(
    AlterClientQuotasResponse,
    AlterConfigsResponse,
    AlterPartitionReassignmentsResponse,
    AlterReplicaLogDirsResponse,
    ApiVersionsResponse,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatResponse,
    CreatePartitionsResponse,
    CreateTopicsResponse,
    DeleteGroupsResponse,
    DeleteRecordsResponse,
    DeleteTopicsResponse,
    DescribeClientQuotasResponse,
    DescribeClusterResponse,
    DescribeConfigsResponse,
    DescribeGroupsResponse,
    DescribeLogDirsResponse,
    DescribeTopicPartitionsResponse,
    DescribeUserScramCredentialsResponse,
    ElectLeadersResponse,
    FetchResponse,
    FindCoordinatorResponse,
    GetTelemetrySubscriptionsResponse,
    HeartbeatResponse,
    IncrementalAlterConfigsResponse,
    InitProducerIdResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    ListConfigResourcesResponse,
    ListGroupsResponse,
    ListOffsetsResponse,
    ListPartitionReassignmentsResponse,
    MetadataResponse,
    OffsetCommitResponse,
    OffsetDeleteResponse,
    OffsetFetchResponse,
    OffsetForLeaderEpochResponse,
    ProduceResponse,
    PushTelemetryResponse,
    SyncGroupResponse,
    DescribeProducersResponse,
    DescribeTransactionsResponse,
    ListTransactionsResponse,
    AlterUserScramCredentialsResponse,
    DescribeAclsResponse,
    CreateAclsResponse,
    DeleteAclsResponse,
    AddPartitionsToTxnResponse,
    AddOffsetsToTxnResponse,
    EndTxnResponse,
    TxnOffsetCommitResponse,
    ShareGroupHeartbeatResponse,
    ShareGroupDescribeResponse,
    ShareFetchResponse,
    ShareAcknowledgeResponse,
    DescribeShareGroupOffsetsResponse,
    AlterShareGroupOffsetsResponse,
    DeleteShareGroupOffsetsResponse,
);

/// DescribeQuorum has no throttle field (it is not throttled in Kafka either).
impl Throttled for DescribeQuorumResponse {
    fn raise_throttle(&mut self, _ms: i32) {}
}

/// SaslHandshake has no throttle field: a connection in its SASL exchange is not throttled.
impl Throttled for SaslHandshakeResponse {
    fn raise_throttle(&mut self, _ms: i32) {}
}

impl Throttled for spate_protocol::newer::DescribeLogDirsV5 {
    fn raise_throttle(&mut self, ms: i32) {
        self.0.raise_throttle(ms);
    }
}

/// What one request costs against its client's `request_percentage` quota: the time it held
/// a handler thread, in percent of one thread. Charged once, when its answer is built (work
/// that continues in a spawned task is not counted).
pub(crate) struct RequestCharge<'a> {
    broker: &'a Broker,
    started: Instant,
    client_id: &'a str,
    /// The quota user: the connection's principal name (`ANONYMOUS` without one).
    user: std::borrow::Cow<'static, str>,
    mute: Option<&'a Mute>,
    charged: Cell<bool>,
}

impl<'a> RequestCharge<'a> {
    /// Starts timing a request of `client_id` on `broker`.
    pub(crate) fn new(
        broker: &'a Broker,
        started: Instant,
        client_id: &'a str,
        user: std::borrow::Cow<'static, str>,
        mute: Option<&'a Mute>,
    ) -> Self {
        Self {
            broker,
            started,
            client_id,
            user,
            mute,
            charged: Cell::new(false),
        }
    }

    /// Records the time so far (once) and mutes the connection for the throttle it earns;
    /// returns that throttle in milliseconds (0 without quotas or once already charged).
    pub(crate) fn charge(&self) -> i32 {
        if self.charged.replace(true) || !self.broker.quotas.is_active() {
            return 0;
        }
        let percent_ms = self.started.elapsed().as_secs_f64() * 1_000.0 / 10.0;
        let ms =
            self.broker
                .quotas
                .record(QuotaKind::Request, &self.user, self.client_id, percent_ms);
        if let Some(m) = self.mute {
            m.mute_for(ms);
        }
        i32::try_from(ms).unwrap_or(i32::MAX)
    }
}

/// A reason outside the broker to slow the producers of some topics (a search index further
/// behind than its topic allows); asked once per produce request, so it must answer fast.
pub trait TopicBackPressure: Send + Sync {
    /// How long producers to `topic` should wait, in milliseconds (0: not at all).
    fn produce_throttle_ms(&self, topic: &str) -> u64;
}
