//! One partition's log: an ordered list of segment files holding RecordBatch v2 bytes exactly as
//! produced, with sparse offset and time indexes, group-committed fsyncs, crash recovery and
//! retention. Nothing here knows about Kafka requests; callers hand in validated batches.

pub mod compaction;
mod config;
mod durability;
mod epochs;
mod error;
mod index;
mod log;
mod segment;
pub mod sim;
mod start_offset;
pub mod storage;

pub use config::{CompactConfig, FsyncPolicy, LogConfig};
pub use durability::{wait_durable, Durability, DurabilityError, Flusher};
pub use epochs::{EpochEntry, CHECKPOINT_FILE};
pub use error::{is_enospc, LogError};
pub use log::{AppendInfo, CleanedSegment, Log, ReadResult, TimestampLookup};
pub use storage::{FsStorage, Storage};
