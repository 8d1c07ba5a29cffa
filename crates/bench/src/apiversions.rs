//! A raw-TCP ApiVersions (v0) request: librdkafka does not expose what the broker advertised,
//! and those ranges are the most precise "broker version" a Kafka-compatible server offers.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde::Serialize;

/// Largest response we accept (a real one is well under 2 KiB).
const MAX_RESPONSE: usize = 1 << 20;

/// One API's supported version range.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ApiRange {
    /// Kafka API key.
    pub api_key: i16,
    /// Name, for the keys we know.
    pub name: String,
    /// Lowest supported version.
    pub min: i16,
    /// Highest supported version.
    pub max: i16,
}

/// Names of the API keys benchmark readers care about.
pub fn api_name(key: i16) -> &'static str {
    match key {
        0 => "Produce",
        1 => "Fetch",
        2 => "ListOffsets",
        3 => "Metadata",
        8 => "OffsetCommit",
        9 => "OffsetFetch",
        10 => "FindCoordinator",
        11 => "JoinGroup",
        12 => "Heartbeat",
        13 => "LeaveGroup",
        14 => "SyncGroup",
        15 => "DescribeGroups",
        16 => "ListGroups",
        17 => "SaslHandshake",
        18 => "ApiVersions",
        19 => "CreateTopics",
        20 => "DeleteTopics",
        21 => "DeleteRecords",
        22 => "InitProducerId",
        32 => "DescribeConfigs",
        33 => "AlterConfigs",
        36 => "SaslAuthenticate",
        37 => "CreatePartitions",
        60 => "DescribeCluster",
        _ => "",
    }
}

/// Encodes an ApiVersions v0 request (header v1: key, version, correlation id, client id).
pub fn encode_request(correlation_id: i32) -> Vec<u8> {
    let client_id = b"spate-bench";
    let mut body = Vec::with_capacity(32);
    body.extend_from_slice(&18i16.to_be_bytes());
    body.extend_from_slice(&0i16.to_be_bytes());
    body.extend_from_slice(&correlation_id.to_be_bytes());
    body.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    body.extend_from_slice(client_id);
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

/// Decodes an ApiVersions v0 response body (after the 4-byte size).
pub fn decode_response(correlation_id: i32, buf: &[u8]) -> Result<Vec<ApiRange>, String> {
    let mut r = Reader { buf, pos: 0 };
    let cid = r.i32()?;
    if cid != correlation_id {
        return Err(format!("correlation id {cid}, expected {correlation_id}"));
    }
    let err = r.i16()?;
    if err != 0 {
        return Err(format!("ApiVersions error code {err}"));
    }
    let n = r.i32()?;
    if !(0..=1000).contains(&n) {
        return Err(format!("implausible API count {n}"));
    }
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let (api_key, min, max) = (r.i16()?, r.i16()?, r.i16()?);
        out.push(ApiRange {
            api_key,
            name: api_name(api_key).to_string(),
            min,
            max,
        });
    }
    Ok(out)
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let end = self.pos + N;
        let s = self.buf.get(self.pos..end).ok_or("response truncated")?;
        self.pos = end;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn i16(&mut self) -> Result<i16, String> {
        Ok(i16::from_be_bytes(self.take()?))
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_be_bytes(self.take()?))
    }
}

/// Asks the first reachable bootstrap server for its API version ranges.
pub fn fetch(bootstrap: &str, timeout: Duration) -> Result<Vec<ApiRange>, String> {
    let mut last = String::from("no bootstrap address");
    for server in bootstrap
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        match fetch_one(server, timeout) {
            Ok(v) => return Ok(v),
            Err(e) => last = format!("{server}: {e}"),
        }
    }
    Err(last)
}

fn fetch_one(server: &str, timeout: Duration) -> Result<Vec<ApiRange>, String> {
    let addr = server
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("address did not resolve")?;
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.write_all(&encode_request(1)).map_err(|e| e.to_string())?;
    let mut size = [0u8; 4];
    s.read_exact(&mut size).map_err(|e| e.to_string())?;
    let len = i32::from_be_bytes(size);
    if len < 0 || len as usize > MAX_RESPONSE {
        return Err(format!("implausible response size {len}"));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).map_err(|e| e.to_string())?;
    decode_response(1, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_bytes() {
        let r = encode_request(7);
        assert_eq!(&r[..4], &(r.len() as i32 - 4).to_be_bytes());
        assert_eq!(&r[4..8], &[0, 18, 0, 0]);
        assert_eq!(&r[8..12], &7i32.to_be_bytes());
    }

    #[test]
    fn response_decoding() {
        let mut b = Vec::new();
        b.extend_from_slice(&7i32.to_be_bytes());
        b.extend_from_slice(&0i16.to_be_bytes());
        b.extend_from_slice(&2i32.to_be_bytes());
        for (k, lo, hi) in [(0i16, 3i16, 12i16), (18, 0, 4)] {
            b.extend_from_slice(&k.to_be_bytes());
            b.extend_from_slice(&lo.to_be_bytes());
            b.extend_from_slice(&hi.to_be_bytes());
        }
        let v = decode_response(7, &b).expect("valid");
        assert_eq!(v[0].name, "Produce");
        assert_eq!((v[1].min, v[1].max), (0, 4));
        assert!(decode_response(8, &b).is_err());
        assert!(decode_response(7, &b[..b.len() - 1]).is_err());
    }

    #[test]
    fn unreachable_is_an_error_not_a_hang() {
        assert!(fetch("127.0.0.1:1", Duration::from_millis(500)).is_err());
    }
}
