//! One transactional id's metadata, as the coordinator keeps it and writes it.

use std::collections::BTreeSet;

/// Where a transactional id's current transaction is, with Kafka's numbering (the
/// TransactionStatus byte of `__transaction_state` and the names DescribeTransactions gives).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxnStatus {
    /// No transaction open.
    Empty = 0,
    /// Partitions were added; records may be written.
    Ongoing = 1,
    /// EndTxn(commit) accepted: commit markers are being written.
    PrepareCommit = 2,
    /// EndTxn(abort), a timeout or a fencing producer: abort markers are being written.
    PrepareAbort = 3,
    /// Every commit marker written.
    CompleteCommit = 4,
    /// Every abort marker written.
    CompleteAbort = 5,
    /// Expired: the id is forgotten.
    Dead = 6,
    /// Kafka's fencing step before an abort; spate goes to PrepareAbort at once, but reads it.
    PrepareEpochFence = 7,
}

impl TxnStatus {
    /// The status from its stored byte.
    pub fn from_i8(v: i8) -> Option<Self> {
        Some(match v {
            0 => Self::Empty,
            1 => Self::Ongoing,
            2 => Self::PrepareCommit,
            3 => Self::PrepareAbort,
            4 => Self::CompleteCommit,
            5 => Self::CompleteAbort,
            6 => Self::Dead,
            7 => Self::PrepareEpochFence,
            _ => return None,
        })
    }

    /// The name Kafka's tools show (DescribeTransactions, ListTransactions filters).
    pub fn name(self) -> &'static str {
        match self {
            Self::Empty => "Empty",
            Self::Ongoing => "Ongoing",
            Self::PrepareCommit => "PrepareCommit",
            Self::PrepareAbort => "PrepareAbort",
            Self::CompleteCommit => "CompleteCommit",
            Self::CompleteAbort => "CompleteAbort",
            Self::Dead => "Dead",
            Self::PrepareEpochFence => "PrepareEpochFence",
        }
    }

    /// Markers are being written: the next request for this id must wait
    /// (CONCURRENT_TRANSACTIONS).
    pub fn is_preparing(self) -> bool {
        matches!(
            self,
            Self::PrepareCommit | Self::PrepareAbort | Self::PrepareEpochFence
        )
    }

    /// No transaction is open and none is ending.
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            Self::Empty | Self::CompleteCommit | Self::CompleteAbort
        )
    }
}

/// A transactional id's state: what `__transaction_state` holds for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnMeta {
    /// The producer id it holds.
    pub producer_id: i64,
    /// The producer epoch; a lower one is a fenced zombie.
    pub producer_epoch: i16,
    /// `transaction.timeout.ms` the producer asked for.
    pub timeout_ms: i32,
    /// Where its transaction is.
    pub status: TxnStatus,
    /// Partitions of the open (or ending) transaction.
    pub partitions: BTreeSet<(String, i32)>,
    /// Wall time of the last change.
    pub last_update_ms: i64,
    /// Wall time the open transaction began (its first partition), or -1.
    pub start_ms: i64,
}

impl TxnMeta {
    /// The transaction's age at `now_ms` if it is open.
    pub fn open_for_ms(&self, now_ms: i64) -> Option<i64> {
        (self.status == TxnStatus::Ongoing && self.start_ms >= 0)
            .then(|| now_ms.saturating_sub(self.start_ms))
    }
}
