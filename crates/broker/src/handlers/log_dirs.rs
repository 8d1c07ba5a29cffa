//! DescribeLogDirs: a spate broker keeps all its partitions in one log dir (its data dir);
//! this lists the replicas held there with their sizes, as `kafka-log-dirs.sh` and
//! `kafka-reassign-partitions.sh` expect.

use std::collections::BTreeMap;

use spate_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use spate_protocol::messages::{DescribeLogDirsRequest, DescribeLogDirsResponse, TopicName};
use spate_protocol::StrBytes;

use crate::Broker;

/// Kafka's "unknown" for the v4 capacity fields.
const UNKNOWN_BYTES: i64 = -1;

/// Answers DescribeLogDirs for the one log dir; `topics: None` means every replica here.
pub fn handle(b: &Broker, req: DescribeLogDirsRequest) -> DescribeLogDirsResponse {
    let wanted: Option<BTreeMap<String, Vec<i32>>> = req.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.topic.to_string(), t.partitions))
            .collect()
    });
    let mut topics = Vec::new();
    for t in b.topics.list() {
        let only = match &wanted {
            Some(w) => match w.get(&t.name) {
                Some(ps) => Some(ps),
                None => continue,
            },
            None => None,
        };
        let partitions: Vec<DescribeLogDirsPartition> = t
            .partitions()
            .iter()
            .filter(|p| only.is_none_or(|ps| ps.contains(&p.index)))
            .map(|p| {
                let mut d = DescribeLogDirsPartition::default();
                d.partition_index = p.index;
                d.partition_size = i64::try_from(p.size_bytes()).unwrap_or(i64::MAX);
                // Only a "future" replica moving between dirs lags; one dir has none.
                d.offset_lag = 0;
                d.is_future_key = false;
                d
            })
            .collect();
        if partitions.is_empty() {
            continue;
        }
        let mut dt = DescribeLogDirsTopic::default();
        dt.name = TopicName(StrBytes::from_string(t.name.clone()));
        dt.partitions = partitions;
        topics.push(dt);
    }
    let mut dir = DescribeLogDirsResult::default();
    dir.log_dir = StrBytes::from_string(b.config.data_dir.display().to_string());
    dir.topics = topics;
    dir.total_bytes = UNKNOWN_BYTES;
    dir.usable_bytes = UNKNOWN_BYTES;
    let mut resp = DescribeLogDirsResponse::default();
    resp.results = vec![dir];
    resp
}
