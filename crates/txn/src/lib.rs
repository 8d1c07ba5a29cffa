//! Kafka transactions for spate, free of I/O.
//!
//! * [`state`]: one transactional id's metadata (producer id and epoch, status, partitions,
//!   timeout) and the status transitions Kafka allows.
//! * [`record`]: how that metadata is written to `__transaction_state`, in Kafka's format
//!   (TransactionLogKey v0, TransactionLogValue v0), so Kafka's tools read it.
//! * [`coordinator`]: the transaction coordinator: requests and time in, answers plus the
//!   records to write and the markers to send out. The broker's shell writes the records,
//!   waits for them to be durable, writes the markers and feeds completions back.

pub mod coordinator;
pub mod record;
pub mod state;

pub use coordinator::{Ended, InitAnswer, Markers, TxnConfig, TxnCoordinator, TxnError, Write};
pub use state::{TxnMeta, TxnStatus};

/// The internal topic holding transaction state.
pub const TXN_LOG: &str = "__transaction_state";
/// Kafka's default `transaction.state.log.num.partitions`.
pub const DEFAULT_TXN_PARTITIONS: i32 = 50;

/// The `__transaction_state` partition of a transactional id: `abs(javaHashCode(id)) % n`,
/// as in Kafka, so a client's FindCoordinator answer matches Kafka's placement.
pub fn txn_partition_for(txn_id: &str, partitions: usize) -> usize {
    spate_protocol::java_hash_partition(txn_id, partitions)
}
