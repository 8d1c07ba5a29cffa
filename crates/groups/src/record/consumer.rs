//! The records of KIP-848 consumer groups in the offsets log.
//!
//! Group key:  u8 version (1) | u8 kind (2) | u16 len + group
//! Group value: u8 version (1) | i32 group epoch
//! Member key: u8 version (1) | u8 kind (3) | u16 len + group | u16 len + member id
//! Member value: u8 version (1) | opt instance id | opt rack | client id | client host |
//!   i32 rebalance timeout | u32 n + n topic names | opt regex | opt assignor | u8 state |
//!   i32 epoch | i32 previous epoch | partitions assigned | partitions revoking
//! (strings are u16 len + bytes; an optional string has a u8 presence flag first; partitions
//! are u32 topics, each a 16-byte topic id, u32 n and n i32 partitions). An empty value
//! deletes the group or member.

use std::collections::BTreeSet;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use uuid::Uuid;

use super::{
    get_str16, put_str16, RecordError, KIND_CONSUMER_GROUP, KIND_CONSUMER_MEMBER, VERSION,
};
use crate::consumer_group::{MemberRecord, MemberState, StateRecord, TopicPartitions};

/// A key of the offsets log, of any kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnyKey {
    /// A committed offset.
    Offset(super::OffsetKey),
    /// A consumer group's epoch.
    Group(String),
    /// A consumer group member.
    Member(String, String),
}

/// Decodes any key of the offsets log.
pub fn decode_key(buf: Bytes) -> Result<AnyKey, RecordError> {
    match buf.get(..2) {
        Some([0, 0 | 1]) | Some([VERSION, super::KIND_OFFSET]) => {
            super::OffsetKey::decode(buf).map(AnyKey::Offset)
        }
        Some([VERSION, KIND_CONSUMER_GROUP]) => {
            let mut b = buf.slice(2..);
            let group = get_str16(&mut b)?;
            end(&b)?;
            Ok(AnyKey::Group(group))
        }
        Some([VERSION, KIND_CONSUMER_MEMBER]) => {
            let mut b = buf.slice(2..);
            let group = get_str16(&mut b)?;
            let member = get_str16(&mut b)?;
            end(&b)?;
            Ok(AnyKey::Member(group, member))
        }
        _ => Err(RecordError("unknown key version or kind")),
    }
}

fn end(b: &Bytes) -> Result<(), RecordError> {
    if b.has_remaining() {
        Err(RecordError("trailing bytes"))
    } else {
        Ok(())
    }
}

/// The key and value (`None` deletes) of a consumer group change.
pub fn encode(record: &StateRecord) -> Result<(Bytes, Option<Bytes>), RecordError> {
    let mut key = BytesMut::new();
    key.put_u8(VERSION);
    let value = match record {
        StateRecord::Group { group, epoch } => {
            key.put_u8(KIND_CONSUMER_GROUP);
            put_str16(&mut key, group)?;
            let mut v = BytesMut::with_capacity(5);
            v.put_u8(VERSION);
            v.put_i32(*epoch);
            Some(v.freeze())
        }
        StateRecord::GroupDeleted { group } => {
            key.put_u8(KIND_CONSUMER_GROUP);
            put_str16(&mut key, group)?;
            None
        }
        StateRecord::Member { group, member } => {
            key.put_u8(KIND_CONSUMER_MEMBER);
            put_str16(&mut key, group)?;
            put_str16(&mut key, &member.member_id)?;
            Some(encode_member(member)?)
        }
        StateRecord::MemberRemoved { group, member_id } => {
            key.put_u8(KIND_CONSUMER_MEMBER);
            put_str16(&mut key, group)?;
            put_str16(&mut key, member_id)?;
            None
        }
    };
    Ok((key.freeze(), value))
}

/// The change a consumer group key and value (`None`: a tombstone) stand for.
pub fn decode(key: &AnyKey, value: Option<Bytes>) -> Result<Option<StateRecord>, RecordError> {
    Ok(match (key, value) {
        (AnyKey::Offset(_), _) => None,
        (AnyKey::Group(group), None) => Some(StateRecord::GroupDeleted {
            group: group.clone(),
        }),
        (AnyKey::Group(group), Some(mut v)) => {
            if v.remaining() != 5 || v.get_u8() != VERSION {
                return Err(RecordError("bad consumer group value"));
            }
            Some(StateRecord::Group {
                group: group.clone(),
                epoch: v.get_i32(),
            })
        }
        (AnyKey::Member(group, id), None) => Some(StateRecord::MemberRemoved {
            group: group.clone(),
            member_id: id.clone(),
        }),
        (AnyKey::Member(group, id), Some(v)) => Some(StateRecord::Member {
            group: group.clone(),
            member: Box::new(decode_member(id, v)?),
        }),
    })
}

fn put_opt(buf: &mut BytesMut, s: Option<&str>) -> Result<(), RecordError> {
    match s {
        Some(s) => {
            buf.put_u8(1);
            put_str16(buf, s)
        }
        None => {
            buf.put_u8(0);
            Ok(())
        }
    }
}

fn put_partitions(buf: &mut BytesMut, tp: &TopicPartitions) {
    buf.put_u32(tp.len() as u32);
    for (t, ps) in tp {
        buf.put_slice(t.as_bytes());
        buf.put_u32(ps.len() as u32);
        for p in ps {
            buf.put_i32(*p);
        }
    }
}

fn encode_member(m: &MemberRecord) -> Result<Bytes, RecordError> {
    let mut b = BytesMut::with_capacity(128);
    b.put_u8(VERSION);
    put_opt(&mut b, m.instance_id.as_deref())?;
    put_opt(&mut b, m.rack_id.as_deref())?;
    put_str16(&mut b, &m.client_id)?;
    put_str16(&mut b, &m.client_host)?;
    b.put_i32(m.rebalance_timeout_ms);
    b.put_u32(m.topic_names.len() as u32);
    for n in &m.topic_names {
        put_str16(&mut b, n)?;
    }
    put_opt(&mut b, m.topic_regex.as_deref())?;
    put_opt(&mut b, m.server_assignor.as_deref())?;
    b.put_u8(match m.state {
        MemberState::Stable => 0,
        MemberState::UnrevokedPartitions => 1,
        MemberState::UnreleasedPartitions => 2,
    });
    b.put_i32(m.epoch);
    b.put_i32(m.previous_epoch);
    put_partitions(&mut b, &m.assigned);
    put_partitions(&mut b, &m.revoking);
    Ok(b.freeze())
}

fn need(b: &Bytes, n: usize) -> Result<(), RecordError> {
    if b.remaining() < n {
        Err(RecordError("truncated consumer member value"))
    } else {
        Ok(())
    }
}

fn get_opt(b: &mut Bytes) -> Result<Option<String>, RecordError> {
    need(b, 1)?;
    match b.get_u8() {
        0 => Ok(None),
        1 => get_str16(b).map(Some),
        _ => Err(RecordError("bad optional string flag")),
    }
}

fn get_partitions(b: &mut Bytes) -> Result<TopicPartitions, RecordError> {
    need(b, 4)?;
    let topics = b.get_u32() as usize;
    let mut out = TopicPartitions::new();
    for _ in 0..topics {
        need(b, 20)?;
        let mut id = [0u8; 16];
        b.copy_to_slice(&mut id);
        let n = b.get_u32() as usize;
        // Checked before reading so a hostile count cannot make a huge set.
        need(b, n.saturating_mul(4))?;
        let ps: BTreeSet<i32> = (0..n).map(|_| b.get_i32()).collect();
        out.insert(Uuid::from_bytes(id), ps);
    }
    Ok(out)
}

fn decode_member(id: &str, mut b: Bytes) -> Result<MemberRecord, RecordError> {
    need(&b, 1)?;
    if b.get_u8() != VERSION {
        return Err(RecordError("unknown consumer member value version"));
    }
    let instance_id = get_opt(&mut b)?;
    let rack_id = get_opt(&mut b)?;
    let client_id = get_str16(&mut b)?;
    let client_host = get_str16(&mut b)?;
    need(&b, 8)?;
    let rebalance_timeout_ms = b.get_i32();
    let n = b.get_u32() as usize;
    need(&b, n.saturating_mul(2))?;
    let topic_names = (0..n)
        .map(|_| get_str16(&mut b))
        .collect::<Result<Vec<_>, _>>()?;
    let topic_regex = get_opt(&mut b)?;
    let server_assignor = get_opt(&mut b)?;
    need(&b, 9)?;
    let state = match b.get_u8() {
        0 => MemberState::Stable,
        1 => MemberState::UnrevokedPartitions,
        2 => MemberState::UnreleasedPartitions,
        _ => return Err(RecordError("unknown member state")),
    };
    let epoch = b.get_i32();
    let previous_epoch = b.get_i32();
    let assigned = get_partitions(&mut b)?;
    let revoking = get_partitions(&mut b)?;
    end(&b)?;
    Ok(MemberRecord {
        member_id: id.to_string(),
        instance_id,
        rack_id,
        client_id,
        client_host,
        rebalance_timeout_ms,
        topic_names,
        topic_regex,
        server_assignor,
        state,
        epoch,
        previous_epoch,
        assigned,
        revoking,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member() -> MemberRecord {
        MemberRecord {
            member_id: "m-1".into(),
            instance_id: Some("host-a".into()),
            rack_id: None,
            client_id: "consumer-g-1".into(),
            client_host: "/127.0.0.1".into(),
            rebalance_timeout_ms: 300_000,
            topic_names: vec!["a".into(), "b".into()],
            topic_regex: Some("x.*".into()),
            server_assignor: Some("uniform".into()),
            state: MemberState::UnrevokedPartitions,
            epoch: 7,
            previous_epoch: 6,
            assigned: TopicPartitions::from([(Uuid::from_bytes([3; 16]), BTreeSet::from([0, 2]))]),
            revoking: TopicPartitions::from([(Uuid::from_bytes([4; 16]), BTreeSet::from([1]))]),
        }
    }

    #[test]
    fn every_consumer_group_record_round_trips() {
        let records = [
            StateRecord::Group {
                group: "g".into(),
                epoch: 12,
            },
            StateRecord::GroupDeleted { group: "g".into() },
            StateRecord::Member {
                group: "g".into(),
                member: Box::new(member()),
            },
            StateRecord::MemberRemoved {
                group: "g".into(),
                member_id: "m-1".into(),
            },
        ];
        for r in records {
            let (k, v) = encode(&r).unwrap();
            let key = decode_key(k).unwrap();
            assert_eq!(decode(&key, v).unwrap(), Some(r));
        }
    }

    #[test]
    fn truncated_or_hostile_member_values_are_errors_not_panics() {
        let (k, v) = encode(&StateRecord::Member {
            group: "g".into(),
            member: Box::new(member()),
        })
        .unwrap();
        let key = decode_key(k).unwrap();
        let v = v.unwrap();
        for cut in 0..v.len() {
            assert!(decode(&key, Some(v.slice(..cut))).is_err(), "cut at {cut}");
        }
        let mut huge = BytesMut::from(&v[..]);
        let at = huge.len() - 8;
        huge[at..at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode(&key, Some(huge.freeze())).is_err());
    }

    #[test]
    fn offset_keys_still_decode_through_the_common_decoder() {
        let k = super::super::OffsetKey {
            group: "g".into(),
            topic: "t".into(),
            partition: 1,
        };
        assert_eq!(decode_key(k.encode().unwrap()).unwrap(), AnyKey::Offset(k));
    }
}
