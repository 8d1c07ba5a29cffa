//! Share sessions (KIP-932): what a member's ShareFetch requests fetch. A ShareFetch with
//! session epoch 0 opens a session (replacing the member's previous one); each later request
//! carries the next epoch and only the partitions added or forgotten since; epoch -1 closes it.

use std::collections::{BTreeSet, HashMap};

use spate_protocol::ResponseError;
use uuid::Uuid;

/// The epoch that opens a session.
pub const INITIAL_EPOCH: i32 = 0;
/// The epoch that closes a session.
pub const FINAL_EPOCH: i32 = -1;

/// A (topic id, partition) a session fetches.
pub type TopicPartition = (Uuid, i32);

/// The share sessions of this broker, by (group, member).
#[derive(Debug, Default)]
pub struct Sessions {
    open: HashMap<(String, String), Session>,
}

#[derive(Debug, Default)]
struct Session {
    /// The epoch the next request must carry.
    next_epoch: i32,
    partitions: BTreeSet<TopicPartition>,
}

/// What a request's session epoch allows.
#[derive(Debug, PartialEq, Eq)]
pub enum Checked {
    /// Serve the request (the session is open, or was just opened).
    Serve,
    /// Acknowledge what the request carries, then close the session.
    Close,
}

fn next(epoch: i32) -> i32 {
    // After i32::MAX the epoch wraps to 1: 0 would reopen, negatives are special.
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

impl Sessions {
    /// Checks and advances the session of `member` for a ShareFetch: 0 opens a new session,
    /// -1 closes, anything else must be the epoch the session expects.
    pub fn fetch(
        &mut self,
        group: &str,
        member: &str,
        epoch: i32,
    ) -> Result<Checked, ResponseError> {
        let key = (group.to_string(), member.to_string());
        match epoch {
            INITIAL_EPOCH => {
                self.open.insert(
                    key,
                    Session {
                        next_epoch: 1,
                        partitions: BTreeSet::new(),
                    },
                );
                Ok(Checked::Serve)
            }
            _ => self.advance(key, epoch),
        }
    }

    /// Checks and advances the session of `member` for a ShareAcknowledge, which cannot open
    /// one.
    pub fn acknowledge(
        &mut self,
        group: &str,
        member: &str,
        epoch: i32,
    ) -> Result<Checked, ResponseError> {
        if epoch == INITIAL_EPOCH {
            return Err(ResponseError::InvalidShareSessionEpoch);
        }
        self.advance((group.to_string(), member.to_string()), epoch)
    }

    fn advance(&mut self, key: (String, String), epoch: i32) -> Result<Checked, ResponseError> {
        let Some(s) = self.open.get_mut(&key) else {
            return Err(ResponseError::ShareSessionNotFound);
        };
        if epoch == FINAL_EPOCH {
            return Ok(Checked::Close);
        }
        if epoch < 0 || epoch != s.next_epoch {
            return Err(ResponseError::InvalidShareSessionEpoch);
        }
        s.next_epoch = next(s.next_epoch);
        Ok(Checked::Serve)
    }

    /// Adds and forgets partitions of an open session; returns every partition it fetches.
    pub fn update(
        &mut self,
        group: &str,
        member: &str,
        added: impl IntoIterator<Item = TopicPartition>,
        forgotten: impl IntoIterator<Item = TopicPartition>,
    ) -> Vec<TopicPartition> {
        let Some(s) = self.open.get_mut(&(group.to_string(), member.to_string())) else {
            return Vec::new();
        };
        for tp in forgotten {
            s.partitions.remove(&tp);
        }
        s.partitions.extend(added);
        s.partitions.iter().copied().collect()
    }

    /// Closes the session of `member`.
    pub fn close(&mut self, group: &str, member: &str) {
        self.open.remove(&(group.to_string(), member.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_must_follow_one_another_after_an_open() {
        let mut s = Sessions::default();
        assert_eq!(
            s.fetch("g", "m", 1),
            Err(ResponseError::ShareSessionNotFound)
        );
        assert_eq!(s.fetch("g", "m", 0), Ok(Checked::Serve));
        assert_eq!(
            s.fetch("g", "m", 2),
            Err(ResponseError::InvalidShareSessionEpoch)
        );
        assert_eq!(s.fetch("g", "m", 1), Ok(Checked::Serve));
        assert_eq!(s.acknowledge("g", "m", 2), Ok(Checked::Serve));
        assert_eq!(
            s.acknowledge("g", "m", 0),
            Err(ResponseError::InvalidShareSessionEpoch)
        );
        assert_eq!(s.fetch("g", "m", -1), Ok(Checked::Close));
        s.close("g", "m");
        assert_eq!(
            s.fetch("g", "m", 3),
            Err(ResponseError::ShareSessionNotFound)
        );
    }

    #[test]
    fn a_session_remembers_added_partitions_until_forgotten() {
        let mut s = Sessions::default();
        let t = Uuid::new_v4();
        s.fetch("g", "m", 0).unwrap();
        assert_eq!(
            s.update("g", "m", [(t, 0), (t, 1)], []),
            vec![(t, 0), (t, 1)]
        );
        assert_eq!(s.update("g", "m", [], [(t, 0)]), vec![(t, 1)]);
        s.fetch("g", "m", 0).unwrap();
        assert!(s.update("g", "m", [], []).is_empty());
    }
}
