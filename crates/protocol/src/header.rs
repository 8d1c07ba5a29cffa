//! Request headers.

use bytes::{Buf, Bytes};
use kafka_protocol::messages::{ApiKey, RequestHeader};
use kafka_protocol::protocol::Decodable;
use thiserror::Error;

/// The fixed prefix every request header version shares: enough to answer a request whose key,
/// version or body we cannot parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawPrefix {
    /// The API key as sent, known to us or not.
    pub api_key: i16,
    /// The API version as sent.
    pub api_version: i16,
    /// Echoed in the response so the client can match it.
    pub correlation_id: i32,
}

/// Why a request header could not be read.
#[derive(Debug, Error)]
pub enum HeaderError {
    /// Fewer than the 8 bytes of the fixed prefix.
    #[error("request of {0} bytes is too short for a header")]
    TooShort(usize),
    /// The prefix was fine but the rest of the header was not.
    #[error("malformed request header: {0}")]
    Malformed(String),
}

impl RawPrefix {
    /// Reads the prefix without consuming the frame.
    pub fn peek(frame: &[u8]) -> Result<Self, HeaderError> {
        if frame.len() < 8 {
            return Err(HeaderError::TooShort(frame.len()));
        }
        Ok(Self {
            api_key: i16::from_be_bytes([frame[0], frame[1]]),
            api_version: i16::from_be_bytes([frame[2], frame[3]]),
            correlation_id: i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]),
        })
    }
}

/// Decodes the full header of a request for a known API key and version, leaving `frame`
/// positioned at the body.
pub fn decode_header(
    api_key: ApiKey,
    api_version: i16,
    frame: &mut Bytes,
) -> Result<RequestHeader, HeaderError> {
    let header_version = api_key.request_header_version(api_version);
    let before = frame.remaining();
    RequestHeader::decode(frame, header_version).map_err(|e| {
        HeaderError::Malformed(format!(
            "{e} (after {} of {before} bytes)",
            before - frame.remaining()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_reads_key_version_and_correlation_id() {
        let frame = [0, 18, 0, 3, 0, 0, 1, 2, 0xff];
        let p = RawPrefix::peek(&frame).unwrap();
        assert_eq!((p.api_key, p.api_version, p.correlation_id), (18, 3, 258));
    }

    #[test]
    fn peek_rejects_short_frames() {
        assert!(matches!(
            RawPrefix::peek(&[0, 1, 2]),
            Err(HeaderError::TooShort(3))
        ));
    }

    #[test]
    fn decode_header_rejects_truncated_client_id() {
        // Metadata v1 (header v1): key, version, correlation id, then a client id claiming 10 bytes.
        let mut frame = Bytes::from_static(&[0, 3, 0, 1, 0, 0, 0, 7, 0, 10, b'a']);
        assert!(decode_header(ApiKey::Metadata, 1, &mut frame).is_err());
    }
}
