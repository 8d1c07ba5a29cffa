//! Reading records written in the registry's wire format back into JSON, for search: magic
//! byte 0, the schema id (4 bytes, big endian), for Protobuf the message-index list, then the
//! payload. The JSON is what a person searching expects rather than a round-trippable
//! encoding: Avro unions give the branch's value (not `{"type": value}`), enums their symbol,
//! bytes base64, timestamps RFC 3339 text (so dynamic mapping types them as dates) and
//! decimals their digits as a string; Protobuf messages follow the proto3 JSON mapping with
//! the .proto field names, 64-bit integers as numbers and fields at their default value
//! included.
//!
//! Every read is checked against the bytes left, so malformed input is an error, never a
//! panic nor an allocation larger than the input.

use std::collections::HashMap;

use apache_avro::schema::{InnerDecimalSchema, Name, Schema as AvroSchema, UuidSchema};
use base64::Engine as _;
use prost_reflect::{DynamicMessage, MessageDescriptor, SerializeOptions};
use serde_json::{Map, Number, Value};

use crate::schema::{Resolved, SchemaType};

/// Deepest nesting of Avro values read (records in records, arrays of arrays...).
const MAX_DEPTH: usize = 64;
/// Most message indexes a Protobuf value's header may list (one per nesting level).
const MAX_MESSAGE_INDEXES: usize = 32;

/// The 5-byte header of a value in the registry's wire format: the schema id, if `value`
/// starts with magic byte 0 and has room for an id.
pub fn schema_id(value: &[u8]) -> Option<i32> {
    match value {
        [0, a, b, c, d, ..] => Some(i32::from_be_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

/// Decodes values written with one registered schema.
pub struct RecordDecoder {
    id: i32,
    kind: Kind,
}

enum Kind {
    Avro {
        schema: AvroSchema,
        /// Named types of the schema and its references, for `Ref`s.
        names: HashMap<Name, AvroSchema>,
    },
    Json,
    Protobuf(prost_reflect::FileDescriptor),
}

impl std::fmt::Debug for RecordDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordDecoder")
            .field("id", &self.id)
            .field("type", &self.schema_type())
            .finish()
    }
}

impl RecordDecoder {
    /// A decoder for schema `id` of `schema_type` with this text and its (transitively)
    /// referenced schemas, referenced ones first.
    pub fn new(
        id: i32,
        schema_type: SchemaType,
        text: &str,
        references: &[Resolved],
    ) -> Result<Self, String> {
        let kind = match schema_type {
            SchemaType::Avro => {
                let (schema, referenced) = crate::encode::parse_avro(text, references)?;
                let all: Vec<&AvroSchema> = referenced.iter().chain([&schema]).collect();
                let resolved = apache_avro::schema::ResolvedSchema::new_with_schemata(all)
                    .map_err(|e| e.to_string())?;
                let names = resolved
                    .get_names()
                    .iter()
                    .map(|(n, s)| (n.clone(), (*s).clone()))
                    .collect();
                Kind::Avro { schema, names }
            }
            SchemaType::Json => Kind::Json,
            SchemaType::Protobuf => {
                let parsed = crate::protobuf::parse(text, references)?;
                Kind::Protobuf(parsed.file().clone())
            }
        };
        Ok(Self { id, kind })
    }

    /// The schema's id.
    pub fn id(&self) -> i32 {
        self.id
    }

    /// The schema's type.
    pub fn schema_type(&self) -> SchemaType {
        match self.kind {
            Kind::Avro { .. } => SchemaType::Avro,
            Kind::Json => SchemaType::Json,
            Kind::Protobuf(_) => SchemaType::Protobuf,
        }
    }

    /// A whole value (header included) as JSON, or why it cannot be read with this schema.
    pub fn decode(&self, value: &[u8]) -> Result<Value, String> {
        match schema_id(value) {
            Some(id) if id == self.id => {}
            Some(id) => return Err(format!("the value is of schema {id}, not {}", self.id)),
            None => return Err("no wire-format header (magic byte 0, schema id)".into()),
        }
        let payload = &value[5..];
        match &self.kind {
            Kind::Avro { schema, names } => {
                let mut r = Reader(payload);
                let v = avro_value(&mut r, schema, names, 0)?;
                if !r.0.is_empty() {
                    return Err(format!("{} bytes left after the Avro value", r.0.len()));
                }
                Ok(v)
            }
            Kind::Json => serde_json::from_slice(payload).map_err(|e| format!("not JSON: {e}")),
            Kind::Protobuf(file) => {
                let mut r = Reader(payload);
                let message = message_of(file, &mut r)?;
                let m = DynamicMessage::decode(message, r.0)
                    .map_err(|e| format!("not a Protobuf message of the schema: {e}"))?;
                let options = SerializeOptions::new()
                    .stringify_64_bit_integers(false)
                    .use_proto_field_name(true)
                    .skip_default_fields(false);
                m.serialize_with_options(serde_json::value::Serializer, &options)
                    .map_err(|e| format!("the message has no JSON form: {e}"))
            }
        }
    }
}

/// The message a Protobuf value names by its message-index list (zigzag varints: a count,
/// then an index per nesting level; a lone 0 stands for `[0]`, the file's first message).
fn message_of(
    file: &prost_reflect::FileDescriptor,
    r: &mut Reader,
) -> Result<MessageDescriptor, String> {
    let count = r.zigzag()?;
    let indexes: Vec<i64> = if count == 0 {
        vec![0]
    } else {
        if count < 0 || count as usize > MAX_MESSAGE_INDEXES {
            return Err(format!("{count} message indexes"));
        }
        (0..count).map(|_| r.zigzag()).collect::<Result<_, _>>()?
    };
    let pick = |mut it: Box<dyn Iterator<Item = MessageDescriptor> + '_>, i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| it.nth(i))
            .ok_or_else(|| format!("message index {i} names no message of the schema"))
    };
    let mut message = pick(Box::new(file.messages()), indexes[0])?;
    for i in &indexes[1..] {
        message = pick(Box::new(message.child_messages()), *i)?;
    }
    Ok(message)
}

/// Bytes left to read.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err(format!(
                "{n} bytes wanted, {} left: the value is truncated",
                self.0.len()
            ));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    /// A zigzag varint of at most 64 bits (Avro's int and long, Confluent's message indexes).
    fn zigzag(&mut self) -> Result<i64, String> {
        let mut raw: u64 = 0;
        for shift in (0..70).step_by(7) {
            let [b] = self.take(1)? else {
                return Err("truncated varint".into());
            };
            if shift == 63 && *b > 1 {
                return Err("a varint longer than 64 bits".into());
            }
            raw |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok((raw >> 1) as i64 ^ -((raw & 1) as i64));
            }
        }
        Err("a varint longer than 64 bits".into())
    }

    fn int(&mut self) -> Result<i32, String> {
        let v = self.zigzag()?;
        i32::try_from(v).map_err(|_| format!("{v} does not fit an Avro int"))
    }

    /// A length (bytes, string, block size): never negative nor past the bytes left.
    fn len(&mut self) -> Result<usize, String> {
        let n = self.zigzag()?;
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.0.len())
            .ok_or_else(|| format!("a length of {n} with {} bytes left", self.0.len()))
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.len()?;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, String> {
        std::str::from_utf8(self.bytes()?)
            .map(str::to_string)
            .map_err(|_| "a string that is not UTF-8".to_string())
    }

    /// The item count of the next block of an array or map (0 ends it); a negative count is
    /// followed by the block's size in bytes, which is skipped over as a number only.
    fn block(&mut self) -> Result<usize, String> {
        let n = self.zigzag()?;
        if n < 0 {
            self.zigzag()?;
        }
        let n = n.unsigned_abs();
        // Every item takes at least one byte, except nulls and empty records, which a count
        // past the bytes left can only be a way of making a reader loop for long.
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.0.len().max(1) * 8)
            .ok_or_else(|| format!("a block of {n} items with {} bytes left", self.0.len()))
    }
}

fn b64(b: &[u8]) -> Value {
    Value::String(base64::engine::general_purpose::STANDARD.encode(b))
}

fn float(f: f64) -> Value {
    // JSON has no NaN or infinities: they are kept as text.
    Number::from_f64(f)
        .map(Value::Number)
        .unwrap_or_else(|| Value::String(f.to_string()))
}

/// Reads one Avro binary value of `schema`.
fn avro_value(
    r: &mut Reader,
    schema: &AvroSchema,
    names: &HashMap<Name, AvroSchema>,
    depth: usize,
) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH}"));
    }
    let next = depth + 1;
    Ok(match schema {
        AvroSchema::Ref { name } => {
            let target = names
                .get(name)
                .ok_or_else(|| format!("unknown type {}", name.fullname(None)))?;
            return avro_value(r, target, names, next);
        }
        AvroSchema::Null => Value::Null,
        AvroSchema::Boolean => match r.take(1)? {
            [0] => Value::Bool(false),
            [1] => Value::Bool(true),
            _ => return Err("a boolean that is neither 0 nor 1".into()),
        },
        AvroSchema::Int | AvroSchema::TimeMillis => Value::from(r.int()?),
        AvroSchema::Long | AvroSchema::TimeMicros => Value::from(r.zigzag()?),
        AvroSchema::Float => {
            let b = r.take(4)?;
            float(f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
        }
        AvroSchema::Double => {
            let b = r.take(8)?;
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            float(f64::from_le_bytes(a))
        }
        AvroSchema::Bytes | AvroSchema::BigDecimal => b64(r.bytes()?),
        AvroSchema::String | AvroSchema::Uuid(UuidSchema::String) => Value::String(r.string()?),
        AvroSchema::Uuid(UuidSchema::Bytes) => uuid_text(r.bytes()?),
        AvroSchema::Uuid(UuidSchema::Fixed(f)) => uuid_text(r.take(f.size)?),
        AvroSchema::Fixed(f) => b64(r.take(f.size)?),
        AvroSchema::Duration(_) => {
            let b = r.take(12)?;
            let n = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
            serde_json::json!({"months": n(0), "days": n(4), "millis": n(8)})
        }
        AvroSchema::Decimal(d) => {
            let unscaled = match &d.inner {
                InnerDecimalSchema::Bytes => r.bytes()?,
                InnerDecimalSchema::Fixed(f) => r.take(f.size)?,
            };
            decimal_text(unscaled, d.scale)
        }
        AvroSchema::Date => {
            let days = r.int()?;
            Value::String(civil(i64::from(days)).map_or_else(
                || days.to_string(),
                |(y, m, d)| format!("{y:04}-{m:02}-{d:02}"),
            ))
        }
        AvroSchema::TimestampMillis | AvroSchema::LocalTimestampMillis => {
            timestamp(r.zigzag()?, 1_000)
        }
        AvroSchema::TimestampMicros | AvroSchema::LocalTimestampMicros => {
            timestamp(r.zigzag()?, 1_000_000)
        }
        AvroSchema::TimestampNanos | AvroSchema::LocalTimestampNanos => {
            timestamp(r.zigzag()?, 1_000_000_000)
        }
        AvroSchema::Enum(e) => {
            let i = r.int()?;
            let symbol = usize::try_from(i)
                .ok()
                .and_then(|i| e.symbols.get(i))
                .ok_or_else(|| format!("{i} is not a symbol of enum {}", e.name.fullname(None)))?;
            Value::String(symbol.clone())
        }
        AvroSchema::Union(u) => {
            let i = r.zigzag()?;
            let branch = usize::try_from(i)
                .ok()
                .and_then(|i| u.variants().get(i))
                .ok_or_else(|| format!("{i} is not a branch of the union"))?;
            return avro_value(r, branch, names, next);
        }
        AvroSchema::Array(a) => {
            let mut items = Vec::new();
            loop {
                let n = r.block()?;
                if n == 0 {
                    break;
                }
                for _ in 0..n {
                    items.push(avro_value(r, &a.items, names, next)?);
                }
            }
            Value::Array(items)
        }
        AvroSchema::Map(m) => {
            let mut entries = Map::new();
            loop {
                let n = r.block()?;
                if n == 0 {
                    break;
                }
                for _ in 0..n {
                    let k = r.string()?;
                    let v = avro_value(r, &m.types, names, next)?;
                    entries.insert(k, v);
                }
            }
            Value::Object(entries)
        }
        AvroSchema::Record(rec) => {
            let mut fields = Map::new();
            for f in &rec.fields {
                let v = avro_value(r, &f.schema, names, next)?;
                fields.insert(f.name.clone(), v);
            }
            Value::Object(fields)
        }
    })
}

fn uuid_text(b: &[u8]) -> Value {
    match uuid::Uuid::from_slice(b) {
        Ok(u) => Value::String(u.to_string()),
        Err(_) => b64(b),
    }
}

/// A decimal's digits with its scale, e.g. `-12.50`, as text: JSON numbers would lose digits.
fn decimal_text(unscaled: &[u8], scale: usize) -> Value {
    if unscaled.is_empty() || unscaled.len() > 16 {
        // Past 128 bits (38 digits): kept as bytes rather than rounded.
        return b64(unscaled);
    }
    let negative = unscaled[0] & 0x80 != 0;
    let mut buf = [if negative { 0xff } else { 0 }; 16];
    buf[16 - unscaled.len()..].copy_from_slice(unscaled);
    let n = i128::from_be_bytes(buf);
    let digits = n.unsigned_abs().to_string();
    let sign = if negative { "-" } else { "" };
    if scale == 0 {
        return Value::String(format!("{sign}{digits}"));
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    Value::String(format!("{sign}{int}.{frac}"))
}

/// A timestamp of `per_second` units since the epoch as RFC 3339 text in UTC, with
/// milliseconds (or microseconds/nanoseconds when the unit is finer and they are not zero).
fn timestamp(units: i64, per_second: i64) -> Value {
    let secs = units.div_euclid(per_second);
    let frac = units.rem_euclid(per_second);
    let days = secs.div_euclid(86_400);
    let in_day = secs.rem_euclid(86_400);
    let Some((y, m, d)) = civil(days).filter(|(y, _, _)| (0..=9999).contains(y)) else {
        return Value::from(units);
    };
    let fraction = match per_second {
        1_000 => format!("{frac:03}"),
        1_000_000 if frac % 1_000 == 0 => format!("{:03}", frac / 1_000),
        1_000_000 => format!("{frac:06}"),
        _ if frac % 1_000_000 == 0 => format!("{:03}", frac / 1_000_000),
        _ => format!("{frac:09}"),
    };
    Value::String(format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{fraction}Z",
        in_day / 3600,
        in_day % 3600 / 60,
        in_day % 60
    ))
}

/// The proleptic Gregorian (year, month, day) `days` after 1970-01-01, for years that fit.
fn civil(days: i64) -> Option<(i64, u32, u32)> {
    // Counted in 400-year eras from 0000-03-01, so leap days fall at the end of each year.
    let z = days.checked_add(719_468)?;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe.checked_add(era.checked_mul(400)?)? + i64::from(m <= 2);
    Some((y, m, d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn zig(out: &mut Vec<u8>, v: i64) {
        let mut n = ((v << 1) ^ (v >> 63)) as u64;
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn text(out: &mut Vec<u8>, s: &str) {
        zig(out, s.len() as i64);
        out.extend_from_slice(s.as_bytes());
    }

    fn header(id: i32) -> Vec<u8> {
        let mut v = vec![0];
        v.extend_from_slice(&id.to_be_bytes());
        v
    }

    const ORDER: &str = r#"{
        "type": "record", "name": "Order", "namespace": "shop",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
                {"name": "name", "type": "string"},
                {"name": "vip", "type": "boolean"}
            ]}},
            {"name": "note", "type": ["null", "string"], "default": null},
            {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "prices", "type": {"type": "map", "values": "double"}},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
            {"name": "blob", "type": "bytes"},
            {"name": "previous", "type": ["null", "Customer"]}
        ]}"#;

    fn order_bytes() -> Vec<u8> {
        let mut v = header(7);
        zig(&mut v, 42);
        text(&mut v, "ann");
        v.push(1);
        zig(&mut v, 1); // note: the string branch
        text(&mut v, "gift wrap");
        zig(&mut v, 2); // SHIPPED
        zig(&mut v, 2); // tags: one block of two
        text(&mut v, "x");
        text(&mut v, "y");
        zig(&mut v, 0);
        zig(&mut v, -1); // prices: a block of one, with its size in bytes
        zig(&mut v, 11);
        text(&mut v, "eur");
        v.extend_from_slice(&9.5f64.to_le_bytes());
        zig(&mut v, 0);
        zig(&mut v, 1_700_000_000_123); // 2023-11-14T22:13:20.123Z
        zig(&mut v, 2);
        v.extend_from_slice(&(-1250i16).to_be_bytes()); // -12.50
        zig(&mut v, 3);
        v.extend_from_slice(b"\x00\x01\x02");
        zig(&mut v, 0); // previous: null
        v
    }

    fn order() -> RecordDecoder {
        RecordDecoder::new(7, SchemaType::Avro, ORDER, &[]).unwrap()
    }

    #[test]
    fn avro_records_decode_to_objects_with_union_branches_enum_symbols_and_dates() {
        let v = order().decode(&order_bytes()).unwrap();
        assert_eq!(
            v,
            json!({
                "id": 42,
                "customer": {"name": "ann", "vip": true},
                "note": "gift wrap",
                "status": "SHIPPED",
                "tags": ["x", "y"],
                "prices": {"eur": 9.5},
                "at": "2023-11-14T22:13:20.123Z",
                "amount": "-12.50",
                "blob": "AAEC",
                "previous": null,
            })
        );
    }

    #[test]
    fn avro_values_that_are_cut_short_or_garbled_are_errors() {
        let good = order_bytes();
        let d = order();
        // Every truncation is an error, none panics.
        for n in 0..good.len() {
            assert!(d.decode(&good[..n]).is_err(), "cut at {n}");
        }
        // Trailing bytes are not silently ignored.
        let mut long = good.clone();
        long.push(0);
        assert!(d.decode(&long).is_err());
        // Another schema's id, another magic byte.
        let mut other = good.clone();
        other[4] = 8;
        assert!(d.decode(&other).is_err());
        let mut magic = good.clone();
        magic[0] = 1;
        assert!(d.decode(&magic).is_err());
        // Every single byte changed in turn, and pseudo-random garbage: errors or values,
        // never a panic.
        for i in 5..good.len() {
            for b in [0x00, 0x7f, 0x80, 0xff] {
                let mut bad = good.clone();
                bad[i] = b;
                let _ = d.decode(&bad);
            }
        }
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..200 {
            let mut bad = header(7);
            for _ in 0..len {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                bad.push((seed >> 33) as u8);
            }
            let _ = d.decode(&bad);
        }
    }

    #[test]
    fn avro_huge_lengths_and_counts_are_refused_without_allocating() {
        let d = RecordDecoder::new(
            1,
            SchemaType::Avro,
            r#"{"type":"array","items":"null"}"#,
            &[],
        )
        .unwrap();
        let mut v = header(1);
        zig(&mut v, i64::MAX);
        assert!(d.decode(&v).is_err());
        let s = RecordDecoder::new(1, SchemaType::Avro, r#""string""#, &[]).unwrap();
        let mut v = header(1);
        zig(&mut v, 1 << 40);
        assert!(s.decode(&v).is_err());
        // A varint that never ends.
        let mut v = header(1);
        v.extend_from_slice(&[0xff; 20]);
        assert!(s.decode(&v).is_err());
    }

    #[test]
    fn avro_timestamps_micros_and_dates_read_as_dates() {
        let d = RecordDecoder::new(
            2,
            SchemaType::Avro,
            r#"{"type":"record","name":"T","fields":[
                {"name":"us","type":{"type":"long","logicalType":"timestamp-micros"}},
                {"name":"day","type":{"type":"int","logicalType":"date"}},
                {"name":"before","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#,
            &[],
        )
        .unwrap();
        let mut v = header(2);
        zig(&mut v, 1_700_000_000_123_456);
        zig(&mut v, 19_675);
        zig(&mut v, -1);
        assert_eq!(
            d.decode(&v).unwrap(),
            json!({"us": "2023-11-14T22:13:20.123456Z", "day": "2023-11-14", "before": "1969-12-31T23:59:59.999Z"})
        );
    }

    const PROTO: &str = r#"
        syntax = "proto3";
        package shop;
        message Other { string x = 1; }
        message Order {
            int64 id = 1;
            Customer customer = 2;
            repeated string tags = 3;
            Status status = 4;
            double amount = 5;
            message Customer { string name = 1; int32 age = 2; }
            enum Status { NEW = 0; PAID = 1; }
        }
    "#;

    fn proto() -> RecordDecoder {
        RecordDecoder::new(3, SchemaType::Protobuf, PROTO, &[]).unwrap()
    }

    /// Order{id: 5000000000, customer: {name: "bo", age: 7}, tags: ["a","b"], status: PAID,
    /// amount: 2.5}, by hand in Protobuf's wire format.
    fn order_payload() -> Vec<u8> {
        let mut p = vec![0x08];
        let mut n: u64 = 5_000_000_000;
        while n >= 0x80 {
            p.push((n as u8) | 0x80);
            n >>= 7;
        }
        p.push(n as u8);
        p.extend_from_slice(&[0x12, 6, 0x0a, 2, b'b', b'o', 0x10, 7]);
        p.extend_from_slice(&[0x1a, 1, b'a', 0x1a, 1, b'b']);
        p.extend_from_slice(&[0x20, 1]);
        p.push(0x29);
        p.extend_from_slice(&2.5f64.to_le_bytes());
        p
    }

    #[test]
    fn protobuf_messages_decode_by_field_name_with_nested_repeated_and_enum() {
        let mut v = header(3);
        // Message indexes [1]: the file's second message.
        zig(&mut v, 1);
        zig(&mut v, 1);
        v.extend_from_slice(&order_payload());
        assert_eq!(
            proto().decode(&v).unwrap(),
            json!({
                "id": 5_000_000_000i64,
                "customer": {"name": "bo", "age": 7},
                "tags": ["a", "b"],
                "status": "PAID",
                "amount": 2.5,
            })
        );
        // A lone 0 is the first message; [1, 0] the first nested message of the second.
        let mut first = header(3);
        first.extend_from_slice(&[0, 0x0a, 1, b'z']);
        assert_eq!(proto().decode(&first).unwrap(), json!({"x": "z"}));
        let mut nested = header(3);
        zig(&mut nested, 2);
        zig(&mut nested, 1);
        zig(&mut nested, 0);
        nested.extend_from_slice(&[0x0a, 2, b'c', b'y']);
        assert_eq!(
            proto().decode(&nested).unwrap(),
            json!({"name": "cy", "age": 0})
        );
    }

    #[test]
    fn protobuf_values_with_bad_indexes_or_payloads_are_errors() {
        let d = proto();
        for indexes in [vec![1i64, 5], vec![-1], vec![9]] {
            let mut v = header(3);
            zig(&mut v, indexes.len() as i64);
            for i in &indexes {
                zig(&mut v, *i);
            }
            assert!(d.decode(&v).is_err(), "{indexes:?}");
        }
        let mut many = header(3);
        zig(&mut many, 1_000_000);
        assert!(d.decode(&many).is_err());
        let mut good = header(3);
        zig(&mut good, 1);
        zig(&mut good, 1);
        good.extend_from_slice(&order_payload());
        for n in 0..good.len() {
            // Some prefixes are whole messages (Protobuf has no end marker); none panics.
            let _ = d.decode(&good[..n]);
        }
        assert!(d.decode(&good[..6]).is_err(), "cut inside the indexes");
        let mut garbage = header(3);
        garbage.extend_from_slice(&[0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        assert!(d.decode(&garbage).is_err());
    }

    #[test]
    fn json_schema_values_are_the_json_after_the_header() {
        let d = RecordDecoder::new(4, SchemaType::Json, r#"{"type":"object"}"#, &[]).unwrap();
        let mut v = header(4);
        v.extend_from_slice(br#"{"a": {"b": 1}}"#);
        assert_eq!(d.decode(&v).unwrap(), json!({"a": {"b": 1}}));
        let mut bad = header(4);
        bad.extend_from_slice(b"{\"a\":");
        assert!(d.decode(&bad).is_err());
    }

    #[test]
    fn decimals_keep_their_digits() {
        assert_eq!(decimal_text(&[0x04, 0xd2], 2), json!("12.34"));
        assert_eq!(decimal_text(&[0x05], 3), json!("0.005"));
        assert_eq!(decimal_text(&[0xff], 0), json!("-1"));
        assert_eq!(decimal_text(&[0xff, 0xfb], 1), json!("-0.5"));
    }
}
