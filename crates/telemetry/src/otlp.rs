//! The subset of OTLP's `MetricsData` protobuf a broker exports: gauges and sums of numbers,
//! with their data points' attributes. Histograms and summaries are skipped. Decoded by hand:
//! a protobuf reader is a few varints, and this keeps the wire format visible.

use thiserror::Error;

/// A payload that is not a protobuf `MetricsData`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("OTLP metrics payload: {0}")]
pub struct TelemetryDecodeError(String);

fn bad(what: &str) -> TelemetryDecodeError {
    TelemetryDecodeError(what.to_owned())
}

/// One numeric data point of a pushed metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// The metric's name as the client sent it (`org.apache.kafka.producer.record.send.rate`).
    pub name: String,
    /// The data point's attributes, as (key, value) strings.
    pub attributes: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
    /// Whether it is a monotonic sum (a counter) rather than a gauge.
    pub counter: bool,
}

enum Field<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    /// Read past: no field exported here has this wire type.
    Fixed32,
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, TelemetryDecodeError> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&b, rest) = self
                .buf
                .split_first()
                .ok_or_else(|| bad("truncated varint"))?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(bad("varint longer than 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], TelemetryDecodeError> {
        if self.buf.len() < n {
            return Err(bad("field runs past the end"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// The next (field number, value), or `None` at the end.
    fn next(&mut self) -> Result<Option<(u64, Field<'a>)>, TelemetryDecodeError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => Field::Fixed64(u64::from_le_bytes(
                self.take(8)?.try_into().map_err(|_| bad("fixed64"))?,
            )),
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| bad("length"))?;
                Field::Bytes(self.take(n)?)
            }
            5 => {
                self.take(4)?;
                Field::Fixed32
            }
            t => return Err(bad(&format!("unsupported wire type {t}"))),
        };
        Ok(Some((key >> 3, field)))
    }
}

/// Calls `f` with every length-delimited field `number` of `msg`.
fn each<'a>(
    msg: &'a [u8],
    number: u64,
    mut f: impl FnMut(&'a [u8]) -> Result<(), TelemetryDecodeError>,
) -> Result<(), TelemetryDecodeError> {
    let mut r = Reader { buf: msg };
    while let Some((n, field)) = r.next()? {
        if let (true, Field::Bytes(b)) = (n == number, field) {
            f(b)?;
        }
    }
    Ok(())
}

fn string(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// An `AnyValue` as text: strings, booleans, integers and doubles; others are empty.
fn any_value(msg: &[u8]) -> Result<String, TelemetryDecodeError> {
    let mut r = Reader { buf: msg };
    let mut out = String::new();
    while let Some((n, field)) = r.next()? {
        out = match (n, field) {
            (1, Field::Bytes(b)) => string(b),
            (2, Field::Varint(v)) => (v != 0).to_string(),
            (3, Field::Varint(v)) => (v as i64).to_string(),
            (4, Field::Fixed64(v)) => f64::from_bits(v).to_string(),
            _ => continue,
        };
    }
    Ok(out)
}

fn key_value(msg: &[u8]) -> Result<(String, String), TelemetryDecodeError> {
    let mut r = Reader { buf: msg };
    let (mut key, mut value) = (String::new(), String::new());
    while let Some((n, field)) = r.next()? {
        match (n, field) {
            (1, Field::Bytes(b)) => key = string(b),
            (2, Field::Bytes(b)) => value = any_value(b)?,
            _ => {}
        }
    }
    Ok((key, value))
}

fn data_point(
    msg: &[u8],
    name: &str,
    counter: bool,
    out: &mut Vec<Point>,
) -> Result<(), TelemetryDecodeError> {
    let mut r = Reader { buf: msg };
    let mut attributes = Vec::new();
    let mut value = None;
    while let Some((n, field)) = r.next()? {
        match (n, field) {
            (4, Field::Fixed64(v)) => value = Some(f64::from_bits(v)),
            (6, Field::Fixed64(v)) => value = Some(v as i64 as f64),
            (7, Field::Bytes(b)) => attributes.push(key_value(b)?),
            _ => {}
        }
    }
    if let Some(value) = value {
        out.push(Point {
            name: name.to_owned(),
            attributes,
            value,
            counter,
        });
    }
    Ok(())
}

fn metric(msg: &[u8], out: &mut Vec<Point>) -> Result<(), TelemetryDecodeError> {
    let mut r = Reader { buf: msg };
    let mut name = String::new();
    let mut gauge = None;
    let mut sum = None;
    while let Some((n, field)) = r.next()? {
        match (n, field) {
            (1, Field::Bytes(b)) => name = string(b),
            (5, Field::Bytes(b)) => gauge = Some(b),
            (7, Field::Bytes(b)) => sum = Some(b),
            _ => {}
        }
    }
    if let Some(g) = gauge {
        each(g, 1, |p| data_point(p, &name, false, out))?;
    }
    if let Some(s) = sum {
        // A Sum is a counter when monotonic (field 3).
        let mut r = Reader { buf: s };
        let mut monotonic = false;
        while let Some((n, field)) = r.next()? {
            if let (3, Field::Varint(v)) = (n, field) {
                monotonic = v != 0;
            }
        }
        each(s, 1, |p| data_point(p, &name, monotonic, out))?;
    }
    Ok(())
}

/// Every numeric data point of a `MetricsData` message.
pub fn decode_metrics(payload: &[u8]) -> Result<Vec<Point>, TelemetryDecodeError> {
    let mut out = Vec::new();
    each(payload, 1, |resource_metrics| {
        each(resource_metrics, 2, |scope_metrics| {
            each(scope_metrics, 2, |m| metric(m, &mut out))
        })
    })?;
    Ok(out)
}

/// Builds OTLP payloads for tests (ours and the broker's).
pub mod testing {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn bytes(out: &mut Vec<u8>, number: u64, b: &[u8]) {
        varint(out, number << 3 | 2);
        varint(out, b.len() as u64);
        out.extend_from_slice(b);
    }

    /// One metric to encode: name, value, whether it is a monotonic sum, attributes.
    pub type Metric<'a> = (&'a str, f64, bool, &'a [(&'a str, &'a str)]);

    /// A `MetricsData` with one gauge (`counter` false) or monotonic sum per metric.
    pub fn metrics_data(metrics: &[Metric]) -> Vec<u8> {
        let mut scope = Vec::new();
        for (name, value, counter, attrs) in metrics {
            let mut point = Vec::new();
            varint(&mut point, 4 << 3 | 1);
            point.extend_from_slice(&value.to_bits().to_le_bytes());
            for (k, v) in attrs.iter() {
                let mut any = Vec::new();
                bytes(&mut any, 1, v.as_bytes());
                let mut kv = Vec::new();
                bytes(&mut kv, 1, k.as_bytes());
                bytes(&mut kv, 2, &any);
                bytes(&mut point, 7, &kv);
            }
            let mut data = Vec::new();
            bytes(&mut data, 1, &point);
            if *counter {
                varint(&mut data, 3 << 3);
                varint(&mut data, 1);
            }
            let mut m = Vec::new();
            bytes(&mut m, 1, name.as_bytes());
            bytes(&mut m, if *counter { 7 } else { 5 }, &data);
            bytes(&mut scope, 2, &m);
        }
        let mut resource = Vec::new();
        bytes(&mut resource, 2, &scope);
        let mut out = Vec::new();
        bytes(&mut out, 1, &resource);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_and_sums_decode_with_their_attributes() {
        let payload = testing::metrics_data(&[
            (
                "org.apache.kafka.producer.record.send.rate",
                12.5,
                false,
                &[("client_id", "p1")],
            ),
            (
                "org.apache.kafka.producer.record.send.total",
                100.0,
                true,
                &[],
            ),
        ]);
        let points = decode_metrics(&payload).unwrap();
        assert_eq!(points.len(), 2);
        assert_eq!(points[0].name, "org.apache.kafka.producer.record.send.rate");
        assert_eq!(points[0].value, 12.5);
        assert!(!points[0].counter);
        assert_eq!(
            points[0].attributes,
            vec![("client_id".into(), "p1".into())]
        );
        assert!(points[1].counter);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(decode_metrics(&[0x0a, 0xff]).is_err());
        assert!(decode_metrics(&[0xff; 11]).is_err());
        assert!(decode_metrics(&[0x0b]).is_err());
        assert_eq!(decode_metrics(&[]).unwrap(), vec![]);
        // Every prefix of a valid payload is refused or decoded, never a panic.
        let payload = testing::metrics_data(&[("m", 1.0, false, &[("k", "v")])]);
        for n in 0..payload.len() {
            let _ = decode_metrics(&payload[..n]);
        }
    }
}
