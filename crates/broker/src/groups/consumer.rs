//! The KIP-848 consumer groups' side of [`GroupService`]: heartbeats with their durable
//! records, and the one namespace classic and consumer groups share.

use spate_groups::consumer_group::{
    ConsumerGroups, HeartbeatError, HeartbeatRequest, HeartbeatResponse, TopicsView,
};
use spate_protocol::ResponseError;

use super::{GroupService, Written};

impl GroupService {
    /// Handles a ConsumerGroupHeartbeat. Returns the answer and, when the heartbeat changed
    /// the group, the offset the answer must wait to be durable up to.
    pub fn consumer_heartbeat(
        &self,
        topics: &TopicsView,
        req: HeartbeatRequest,
    ) -> (Result<HeartbeatResponse, HeartbeatError>, Option<Written>) {
        let now = self.clock.monotonic_ms();
        // The partitions lock orders the records exactly as the changes were made.
        let parts = self.partitions.lock();
        let mut classic = self.coordinator.lock();
        if classic.has_members(&req.group_id) {
            let message = format!("Group {} is not a consumer group.", req.group_id);
            return (
                Err(HeartbeatError {
                    error: ResponseError::GroupIdNotFound,
                    message,
                }),
                None,
            );
        }
        let mut consumer = self.consumer.lock();
        if req.member_epoch == 0 && !consumer.contains(&req.group_id) {
            // An empty classic group (offsets only) becomes a consumer group, as in Kafka.
            let _ = classic.delete(&req.group_id);
        }
        drop(classic);
        let (answer, records) = consumer.heartbeat(now, topics, req);
        drop(consumer);
        match self.append_consumer(&parts, &records) {
            Ok(end) => (answer, end),
            Err(error) => (
                Err(HeartbeatError {
                    error,
                    message: "the group's new state could not be written".into(),
                }),
                None,
            ),
        }
    }

    /// Reads the consumer groups.
    pub fn consumer<T>(&self, f: impl FnOnce(&ConsumerGroups) -> T) -> T {
        f(&self.consumer.lock())
    }

    /// Lets a classic JoinGroup have `group`: refused (INCONSISTENT_GROUP_PROTOCOL) while a
    /// consumer group of that id has members; an empty consumer group is deleted.
    pub fn claim_for_classic(&self, group: &str) -> Result<(), ResponseError> {
        let parts = self.partitions.lock();
        let mut consumer = self.consumer.lock();
        if !consumer.contains(group) {
            return Ok(());
        }
        if consumer.has_members(group) {
            return Err(ResponseError::InconsistentGroupProtocol);
        }
        let records = consumer.delete(group)?;
        drop(consumer);
        self.append_consumer(&parts, &records).map(|_| ())
    }

    /// Deletes an empty consumer group's state (its offsets are the caller's); `Ok(false)`
    /// when no consumer group has this id.
    pub(super) fn delete_consumer_group(&self, group: &str) -> Result<bool, ResponseError> {
        let parts = self.partitions.lock();
        let mut consumer = self.consumer.lock();
        if !consumer.contains(group) {
            return Ok(false);
        }
        let records = consumer.delete(group)?;
        drop(consumer);
        self.append_consumer(&parts, &records).map(|_| true)
    }

    /// True when either kind of group `group` has live members.
    pub fn has_members(&self, group: &str) -> bool {
        self.coordinator.lock().has_members(group) || self.consumer.lock().has_members(group)
    }

    /// Deletes consumer groups with neither members nor committed offsets (as Kafka's
    /// group metadata expiry does), so ids of groups long gone do not pile up.
    pub(super) fn forget_empty_consumer_groups(&self) {
        let idle: Vec<String> = {
            let consumer = self.consumer.lock();
            let offsets = self.offsets.lock();
            consumer
                .list()
                .into_iter()
                .filter(|(id, _, members)| *members == 0 && !offsets.has_group(id))
                .map(|(id, ..)| id)
                .collect()
        };
        for id in idle {
            if let Err(e) = self.delete_consumer_group(&id) {
                tracing::warn!(group = %id, error = ?e, "forgetting an empty consumer group failed");
            }
        }
    }
}
