//! DescribeLogDirs: a spate broker keeps all its partitions in one log dir (its data dir);
//! this lists the replicas held there with their sizes, as `kafka-log-dirs.sh` and
//! `kafka-reassign-partitions.sh` expect.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use spate_protocol::messages::alter_replica_log_dirs_response::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult,
};
use spate_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use spate_protocol::messages::{
    AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse, DescribeLogDirsRequest,
    DescribeLogDirsResponse, TopicName,
};
use spate_protocol::{ResponseError, StrBytes};

use crate::Broker;

/// Kafka's "unknown" for the v4 capacity fields.
const UNKNOWN_BYTES: i64 = -1;

/// The file system's total and usable bytes under `dir` (v4), unknown where it cannot say.
fn capacity(dir: &Path) -> (i64, i64) {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
            return (UNKNOWN_BYTES, UNKNOWN_BYTES);
        };
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
        // SAFETY: `path` is a valid C string and `st` is written by the call before it is read.
        if unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) } != 0 {
            return (UNKNOWN_BYTES, UNKNOWN_BYTES);
        }
        // SAFETY: statvfs returned 0, so it filled `st`.
        let st = unsafe { st.assume_init() };
        let frag = st.f_frsize as i64;
        let total = (st.f_blocks as i64).saturating_mul(frag);
        let usable = (st.f_bavail as i64).saturating_mul(frag);
        (total, usable)
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        (UNKNOWN_BYTES, UNKNOWN_BYTES)
    }
}

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
    (dir.total_bytes, dir.usable_bytes) = capacity(&b.config.data_dir);
    let mut resp = DescribeLogDirsResponse::default();
    resp.results = vec![dir];
    resp
}

/// Answers AlterReplicaLogDirs as Kafka does for a broker with one log dir: a move into the
/// data dir, where every replica already is, succeeds without moving anything; any other
/// dir is LOG_DIR_NOT_FOUND.
pub fn alter(b: &Broker, req: AlterReplicaLogDirsRequest) -> AlterReplicaLogDirsResponse {
    let here = canonical(&b.config.data_dir);
    let mut resp = AlterReplicaLogDirsResponse::default();
    for dir in req.dirs {
        let same_dir = canonical(Path::new(dir.path.as_str())) == here;
        for t in dir.topics {
            let topic = b.topics.get(&t.name);
            let mut tr = AlterReplicaLogDirTopicResult::default();
            tr.topic_name = t.name.clone();
            for index in t.partitions {
                let code = match &topic {
                    _ if !same_dir => ResponseError::LogDirNotFound.code(),
                    None => ResponseError::UnknownTopicOrPartition.code(),
                    Some(topic) => match topic.lookup(index) {
                        Ok(_) => 0,
                        Err(ResponseError::NotLeaderOrFollower) => {
                            ResponseError::ReplicaNotAvailable.code()
                        }
                        Err(e) => e.code(),
                    },
                };
                let mut pr = AlterReplicaLogDirPartitionResult::default();
                pr.partition_index = index;
                pr.error_code = code;
                tr.partitions.push(pr);
            }
            resp.results.push(tr);
        }
    }
    resp
}

/// The path with symlinks and `..` resolved, so `/data/./x` names the same dir as `/data/x`.
fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}
