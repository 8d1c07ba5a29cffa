//! Encoding responses into frames and decoding request bodies.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};
use thiserror::Error;

/// A message that could not be encoded or decoded.
#[derive(Debug, Error)]
#[error("{api:?} v{version}: {reason}")]
pub struct CodecError {
    /// The API involved.
    pub api: ApiKey,
    /// The version involved.
    pub version: i16,
    /// What went wrong, from the codec.
    pub reason: String,
}

/// Decodes a request body, requiring that it consumes the whole frame: bytes left over mean
/// the client encoded another schema than the version it named, so the fields we did read
/// cannot be trusted either.
pub fn decode_body<T: Decodable>(
    api: ApiKey,
    version: i16,
    body: &mut Bytes,
) -> Result<T, CodecError> {
    let msg = T::decode(body, version).map_err(|e| CodecError {
        api,
        version,
        reason: e.to_string(),
    })?;
    if !body.is_empty() {
        return Err(CodecError {
            api,
            version,
            reason: format!("{} bytes left over after the request body", body.len()),
        });
    }
    Ok(msg)
}

/// Encodes a complete response frame: length prefix, header and body.
pub fn encode_response<T: Encodable>(
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &T,
) -> Result<Bytes, CodecError> {
    let err = |e: anyhow::Error| CodecError {
        api,
        version,
        reason: e.to_string(),
    };
    let header_version = api.response_header_version(version);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let size = header
        .compute_size(header_version)
        .and_then(|h| Ok(h + body.compute_size(version)?))
        .map_err(err)?;
    let mut buf = BytesMut::with_capacity(4 + size);
    buf.put_i32(size as i32);
    header.encode(&mut buf, header_version).map_err(err)?;
    body.encode(&mut buf, version).map_err(err)?;
    Ok(buf.freeze())
}

/// The smallest answer possible to a request we cannot serve: the correlation id and an error
/// code. Used for unknown API keys, where no response schema exists to follow.
pub fn encode_bare_error(correlation_id: i32, error_code: i16) -> Bytes {
    let mut buf = BytesMut::with_capacity(10);
    buf.put_i32(6);
    buf.put_i32(correlation_id);
    buf.put_i16(error_code);
    buf.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::ApiVersionsResponse;

    #[test]
    fn a_body_must_fill_its_frame_exactly() {
        use kafka_protocol::messages::ApiVersionsRequest;
        let mut whole = BytesMut::new();
        ApiVersionsRequest::default().encode(&mut whole, 3).unwrap();
        let mut exact = whole.clone().freeze();
        assert!(decode_body::<ApiVersionsRequest>(ApiKey::ApiVersions, 3, &mut exact).is_ok());
        whole.extend_from_slice(&[0, 0, 0]);
        let mut padded = whole.freeze();
        let e = decode_body::<ApiVersionsRequest>(ApiKey::ApiVersions, 3, &mut padded).unwrap_err();
        assert!(e.reason.contains("3 bytes left over"), "{e}");
    }

    #[test]
    fn encode_response_prefixes_length_and_correlation_id() {
        let body = ApiVersionsResponse::default();
        let frame = encode_response(ApiKey::ApiVersions, 0, 77, &body).unwrap();
        let len = i32::from_be_bytes(frame[0..4].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 4);
        assert_eq!(i32::from_be_bytes(frame[4..8].try_into().unwrap()), 77);
    }
}
