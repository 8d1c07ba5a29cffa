//! Incremental fetch sessions (KIP-227): a client that fetches the same partitions over and
//! over (a follower, a consumer) names them once; later fetches carry only the partitions whose
//! fetch position changed, and answers carry only partitions with records, errors or a moved
//! high watermark or log start. An idle follower of thousands of partitions then sends and
//! receives a few bytes per fetch instead of every partition each time.
//!
//! The cache is bounded (`max.incremental.fetch.session.cache.slots`, 1,000 as in Kafka): when
//! it is full the session used least recently makes room. A client whose session is gone gets
//! FETCH_SESSION_ID_NOT_FOUND and starts over with a full fetch, as the protocol expects.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;
use spate_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use spate_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use spate_protocol::ResponseError;
use uuid::Uuid;

/// Sessions came with Fetch v7.
const FIRST_SESSION_VERSION: i16 = 7;
/// The epoch that asks for a new session.
const INITIAL_EPOCH: i32 = 0;
/// The epoch that closes a session (or asks for none).
const FINAL_EPOCH: i32 = -1;
/// Kafka's `max.incremental.fetch.session.cache.slots`.
pub const DEFAULT_MAX_SESSIONS: usize = 1_000;

/// How a request names a topic: by name up to Fetch v12, by id from v13.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum TopicRef {
    Name(String),
    Id(Uuid),
}

impl TopicRef {
    fn of(version: i16, name: &TopicName, id: Uuid) -> Self {
        if version >= 13 {
            TopicRef::Id(id)
        } else {
            TopicRef::Name(name.to_string())
        }
    }
}

/// What the client was last told about a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Told {
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
}

#[derive(Debug, Clone)]
struct Entry {
    name: TopicName,
    id: Uuid,
    fetch: FetchPartition,
    told: Option<Told>,
}

#[derive(Debug)]
struct Session {
    next_epoch: i32,
    /// Order of last use (a counter), for eviction.
    used: u64,
    partitions: BTreeMap<(TopicRef, i32), Entry>,
}

#[derive(Default)]
struct Inner {
    next_id: i32,
    uses: u64,
    sessions: HashMap<i32, Session>,
}

/// The fetch sessions of one broker.
pub struct FetchSessions {
    inner: Mutex<Inner>,
    max_sessions: usize,
}

/// What [`FetchSessions::begin`] made of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begun {
    /// No session: the request is served as sent.
    Sessionless,
    /// Within session `id`. `incremental`: the request was expanded to every partition of
    /// the session and the answer must be cut down with [`FetchSessions::finish`]; otherwise
    /// a new session whose full answer tells the client its id.
    Session {
        /// The session id to answer with.
        id: i32,
        /// Only changed partitions are answered.
        incremental: bool,
    },
}

impl Default for FetchSessions {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_SESSIONS)
    }
}

fn next_epoch(epoch: i32) -> i32 {
    // Epochs wrap from i32::MAX to 1 (0 asks for a new session).
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

impl FetchSessions {
    /// A cache of at most `max_sessions` sessions (0 declines every session).
    pub fn new(max_sessions: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                next_id: 1,
                ..Inner::default()
            }),
            max_sessions,
        }
    }

    /// Sessions held now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inner.lock().sessions.len()
    }

    /// Whether no session is held.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies the request's session fields: creates, continues or closes a session. An
    /// incremental request is rewritten in place to name every partition of its session,
    /// with the positions the client last sent. The error is the top-level answer.
    pub fn begin(&self, req: &mut FetchRequest, version: i16) -> Result<Begun, ResponseError> {
        if version < FIRST_SESSION_VERSION {
            return Ok(Begun::Sessionless);
        }
        let (id, epoch) = (req.session_id, req.session_epoch);
        let mut inner = self.inner.lock();
        inner.uses += 1;
        let used = inner.uses;
        match epoch {
            FINAL_EPOCH => {
                if id != 0 {
                    inner.sessions.remove(&id);
                }
                Ok(Begun::Sessionless)
            }
            INITIAL_EPOCH => {
                if id != 0 {
                    inner.sessions.remove(&id);
                }
                if self.max_sessions == 0 {
                    return Ok(Begun::Sessionless);
                }
                if inner.sessions.len() >= self.max_sessions {
                    let oldest = inner
                        .sessions
                        .iter()
                        .min_by_key(|(_, s)| s.used)
                        .map(|(id, _)| *id);
                    if let Some(oldest) = oldest {
                        inner.sessions.remove(&oldest);
                    }
                }
                let mut partitions = BTreeMap::new();
                upsert(&mut partitions, version, &req.topics);
                let new_id = loop {
                    let candidate = inner.next_id;
                    inner.next_id = if candidate == i32::MAX {
                        1
                    } else {
                        candidate + 1
                    };
                    if !inner.sessions.contains_key(&candidate) {
                        break candidate;
                    }
                };
                inner.sessions.insert(
                    new_id,
                    Session {
                        next_epoch: 1,
                        used,
                        partitions,
                    },
                );
                Ok(Begun::Session {
                    id: new_id,
                    incremental: false,
                })
            }
            _ if epoch < FINAL_EPOCH => Err(ResponseError::InvalidFetchSessionEpoch),
            _ => {
                let session = inner
                    .sessions
                    .get_mut(&id)
                    .ok_or(ResponseError::FetchSessionIdNotFound)?;
                if epoch != session.next_epoch {
                    return Err(ResponseError::InvalidFetchSessionEpoch);
                }
                session.next_epoch = next_epoch(epoch);
                session.used = used;
                upsert(&mut session.partitions, version, &req.topics);
                for f in &req.forgotten_topics_data {
                    let topic = TopicRef::of(version, &f.topic, f.topic_id);
                    for p in &f.partitions {
                        session.partitions.remove(&(topic.clone(), *p));
                    }
                }
                req.forgotten_topics_data.clear();
                req.topics = expand(&session.partitions);
                Ok(Begun::Session {
                    id,
                    incremental: true,
                })
            }
        }
    }

    /// Sets the answer's session id and, for an incremental fetch, keeps only partitions with
    /// records or an error, or whose high watermark, last stable offset or log start moved
    /// since the client was last told.
    pub fn finish(&self, begun: Begun, version: i16, resp: &mut FetchResponse) {
        let Begun::Session { id, incremental } = begun else {
            return;
        };
        resp.session_id = id;
        let mut inner = self.inner.lock();
        let Some(session) = inner.sessions.get_mut(&id) else {
            // Evicted meanwhile: this answer is complete, the next fetch starts over.
            return;
        };
        for t in &mut resp.responses {
            let topic = TopicRef::of(version, &t.topic, t.topic_id);
            t.partitions.retain(|p| {
                let now = Told {
                    high_watermark: p.high_watermark,
                    last_stable_offset: p.last_stable_offset,
                    log_start_offset: p.log_start_offset,
                };
                let entry = session
                    .partitions
                    .get_mut(&(topic.clone(), p.partition_index));
                let told_before = entry.as_ref().and_then(|e| e.told);
                if let Some(e) = entry {
                    e.told = Some(now);
                }
                !incremental
                    || p.error_code != 0
                    || p.records.as_ref().is_some_and(|r| !r.is_empty())
                    || told_before != Some(now)
            });
        }
        if incremental {
            resp.responses.retain(|t| !t.partitions.is_empty());
        }
    }
}

/// Adds or replaces the partitions a request names.
fn upsert(partitions: &mut BTreeMap<(TopicRef, i32), Entry>, version: i16, topics: &[FetchTopic]) {
    for t in topics {
        let topic = TopicRef::of(version, &t.topic, t.topic_id);
        for p in &t.partitions {
            let told = partitions
                .get(&(topic.clone(), p.partition))
                .and_then(|e| e.told);
            partitions.insert(
                (topic.clone(), p.partition),
                Entry {
                    name: t.topic.clone(),
                    id: t.topic_id,
                    fetch: p.clone(),
                    told,
                },
            );
        }
    }
}

/// Every partition of a session, as the topics of a full request.
fn expand(partitions: &BTreeMap<(TopicRef, i32), Entry>) -> Vec<FetchTopic> {
    let mut topics: Vec<FetchTopic> = Vec::new();
    let mut last: Option<&TopicRef> = None;
    for ((topic, _), e) in partitions {
        if last != Some(topic) {
            let mut t = FetchTopic::default();
            t.topic = e.name.clone();
            t.topic_id = e.id;
            topics.push(t);
            last = Some(topic);
        }
        if let Some(t) = topics.last_mut() {
            t.partitions.push(e.fetch.clone());
        }
    }
    topics
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use spate_protocol::messages::fetch_request::ForgottenTopic;
    use spate_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use spate_protocol::StrBytes;

    use super::*;

    const V: i16 = 12;

    fn name(s: &'static str) -> TopicName {
        TopicName(StrBytes::from_static_str(s))
    }

    fn request(id: i32, epoch: i32, parts: &[(&'static str, i32, i64)]) -> FetchRequest {
        let mut r = FetchRequest::default();
        r.session_id = id;
        r.session_epoch = epoch;
        for &(t, p, offset) in parts {
            let mut fp = FetchPartition::default();
            fp.partition = p;
            fp.fetch_offset = offset;
            match r.topics.iter_mut().find(|ft| ft.topic == name(t)) {
                Some(ft) => ft.partitions.push(fp),
                None => {
                    let mut ft = FetchTopic::default();
                    ft.topic = name(t);
                    ft.partitions.push(fp);
                    r.topics.push(ft);
                }
            }
        }
        r
    }

    fn named(r: &FetchRequest) -> Vec<(String, i32, i64)> {
        r.topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(|p| (t.topic.to_string(), p.partition, p.fetch_offset))
            })
            .collect()
    }

    fn answer(parts: &[(&'static str, i32, i64, usize)]) -> FetchResponse {
        let mut resp = FetchResponse::default();
        for &(t, p, hw, records) in parts {
            let mut pd = PartitionData::default();
            pd.partition_index = p;
            pd.high_watermark = hw;
            pd.records = Some(Bytes::from(vec![0u8; records]));
            match resp.responses.iter_mut().find(|ft| ft.topic == name(t)) {
                Some(ft) => ft.partitions.push(pd),
                None => {
                    let mut ft = FetchableTopicResponse::default();
                    ft.topic = name(t);
                    ft.partitions.push(pd);
                    resp.responses.push(ft);
                }
            }
        }
        resp
    }

    fn answered(resp: &FetchResponse) -> Vec<(String, i32)> {
        resp.responses
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(|p| (t.topic.to_string(), p.partition_index))
            })
            .collect()
    }

    #[test]
    fn an_incremental_fetch_names_the_whole_session_and_answers_only_what_changed() {
        let s = FetchSessions::default();
        let mut first = request(0, 0, &[("a", 0, 5), ("a", 1, 7), ("b", 0, 0)]);
        let begun = s.begin(&mut first, V).unwrap();
        let Begun::Session { id, incremental } = begun else {
            panic!("a session should be created: {begun:?}")
        };
        assert!(!incremental);
        let mut resp = answer(&[("a", 0, 5, 0), ("a", 1, 9, 100), ("b", 0, 0, 0)]);
        s.finish(begun, V, &mut resp);
        assert_eq!(resp.session_id, id);
        assert_eq!(answered(&resp).len(), 3, "a new session's answer is full");

        // Only a-1 moved (it got records): the next request names just it.
        let mut next = request(id, 1, &[("a", 1, 9)]);
        let begun = s.begin(&mut next, V).unwrap();
        assert_eq!(
            begun,
            Begun::Session {
                id,
                incremental: true
            }
        );
        assert_eq!(
            named(&next),
            vec![("a".into(), 0, 5), ("a".into(), 1, 9), ("b".into(), 0, 0)],
            "the request is served for every partition of the session"
        );
        // Nothing new anywhere but b-0's high watermark.
        let mut resp = answer(&[("a", 0, 5, 0), ("a", 1, 9, 0), ("b", 0, 3, 0)]);
        s.finish(begun, V, &mut resp);
        assert_eq!(answered(&resp), vec![("b".into(), 0)]);
        // An idle round answers nothing at all.
        let mut idle = request(id, 2, &[]);
        let begun = s.begin(&mut idle, V).unwrap();
        let mut resp = answer(&[("a", 0, 5, 0), ("a", 1, 9, 0), ("b", 0, 3, 0)]);
        s.finish(begun, V, &mut resp);
        assert!(resp.responses.is_empty());
        assert_eq!(resp.session_id, id);
    }

    #[test]
    fn forgotten_partitions_leave_the_session() {
        let s = FetchSessions::default();
        let mut first = request(0, 0, &[("a", 0, 0), ("a", 1, 0)]);
        let Begun::Session { id, .. } = s.begin(&mut first, V).unwrap() else {
            panic!("no session")
        };
        let mut next = request(id, 1, &[]);
        let mut f = ForgottenTopic::default();
        f.topic = name("a");
        f.partitions = vec![0];
        next.forgotten_topics_data.push(f);
        s.begin(&mut next, V).unwrap();
        assert_eq!(named(&next), vec![("a".into(), 1, 0)]);
        assert!(next.forgotten_topics_data.is_empty());
    }

    #[test]
    fn a_wrong_epoch_or_unknown_session_is_refused_and_a_final_epoch_closes_the_session() {
        let s = FetchSessions::default();
        let mut first = request(0, 0, &[("a", 0, 0)]);
        let Begun::Session { id, .. } = s.begin(&mut first, V).unwrap() else {
            panic!("no session")
        };
        assert_eq!(
            s.begin(&mut request(id, 5, &[]), V),
            Err(ResponseError::InvalidFetchSessionEpoch)
        );
        assert_eq!(
            s.begin(&mut request(id + 1, 1, &[]), V),
            Err(ResponseError::FetchSessionIdNotFound)
        );
        assert_eq!(
            s.begin(&mut request(id, -7, &[]), V),
            Err(ResponseError::InvalidFetchSessionEpoch)
        );
        // The refused requests did not move the epoch.
        assert!(s.begin(&mut request(id, 1, &[]), V).is_ok());
        assert_eq!(
            s.begin(&mut request(id, -1, &[("a", 0, 0)]), V),
            Ok(Begun::Sessionless)
        );
        assert!(s.is_empty(), "a final epoch closes the session");
        assert_eq!(
            s.begin(&mut request(id, 2, &[]), V),
            Err(ResponseError::FetchSessionIdNotFound)
        );
    }

    #[test]
    fn old_versions_and_sessionless_requests_get_no_session() {
        let s = FetchSessions::default();
        assert_eq!(
            s.begin(&mut request(0, 0, &[("a", 0, 0)]), 6),
            Ok(Begun::Sessionless)
        );
        assert_eq!(
            s.begin(&mut request(0, -1, &[("a", 0, 0)]), V),
            Ok(Begun::Sessionless)
        );
        assert!(s.is_empty());
        let none = FetchSessions::new(0);
        assert_eq!(
            none.begin(&mut request(0, 0, &[("a", 0, 0)]), V),
            Ok(Begun::Sessionless)
        );
    }

    #[test]
    fn a_full_cache_evicts_the_session_used_least_recently() {
        let s = FetchSessions::new(2);
        let mut ids = Vec::new();
        for _ in 0..2 {
            let Begun::Session { id, .. } = s.begin(&mut request(0, 0, &[("a", 0, 0)]), V).unwrap()
            else {
                panic!("no session")
            };
            ids.push(id);
        }
        // The first session is used again: the second is now the oldest.
        assert!(s.begin(&mut request(ids[0], 1, &[]), V).is_ok());
        let Begun::Session { id: third, .. } =
            s.begin(&mut request(0, 0, &[("b", 0, 0)]), V).unwrap()
        else {
            panic!("no session")
        };
        assert_eq!(s.len(), 2);
        assert!(s.begin(&mut request(ids[0], 2, &[]), V).is_ok());
        assert_eq!(
            s.begin(&mut request(ids[1], 1, &[]), V),
            Err(ResponseError::FetchSessionIdNotFound)
        );
        assert!(s.begin(&mut request(third, 1, &[]), V).is_ok());
    }

    #[test]
    fn topics_are_keyed_by_id_from_version_13() {
        let s = FetchSessions::default();
        let id_a = Uuid::from_u128(7);
        let mut first = FetchRequest::default();
        first.session_epoch = 0;
        let mut t = FetchTopic::default();
        t.topic_id = id_a;
        t.partitions = vec![FetchPartition::default()];
        first.topics.push(t);
        let Begun::Session { id, .. } = s.begin(&mut first, 13).unwrap() else {
            panic!("no session")
        };
        let mut next = FetchRequest::default();
        next.session_id = id;
        next.session_epoch = 1;
        s.begin(&mut next, 13).unwrap();
        assert_eq!(next.topics.len(), 1);
        assert_eq!(next.topics[0].topic_id, id_a);
    }
}
