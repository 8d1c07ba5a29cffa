//! Encoding responses into frames and decoding request bodies.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
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

/// Decodes a request body. Bytes left in the frame after the body are ignored, as Apache
/// Kafka's broker ignores them: real clients send some (librdkafka 2.12 ends its Metadata v12
/// requests with three zero bytes), so refusing them would refuse clients that work with Kafka.
/// A body that is too short, or whose fields do not parse, is an error.
pub fn decode_body<T: Decodable>(
    api: ApiKey,
    version: i16,
    body: &mut Bytes,
) -> Result<T, CodecError> {
    T::decode(body, version).map_err(|e| CodecError {
        api,
        version,
        reason: e.to_string(),
    })
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
    // Versions newer than the codec's schemas but identical on the wire encode as those.
    let body_version = crate::newer::schema_version(api, version);
    let size = header
        .compute_size(header_version)
        .and_then(|h| Ok(h + body.compute_size(body_version)?))
        .map_err(err)?;
    let mut buf = BytesMut::with_capacity(4 + size);
    buf.put_i32(size as i32);
    header.encode(&mut buf, header_version).map_err(err)?;
    body.encode(&mut buf, body_version).map_err(err)?;
    Ok(buf.freeze())
}

/// Encodes a request as a client sends it: header and body, without the length prefix (the
/// shape `Request::decode` takes). For tests and tools that speak to a broker directly.
pub fn encode_request<T: Encodable>(header: &RequestHeader, body: &T) -> Result<Bytes, CodecError> {
    let version = header.request_api_version;
    let api = ApiKey::try_from(header.request_api_key).map_err(|()| CodecError {
        api: ApiKey::ApiVersions,
        version,
        reason: format!("unknown API key {}", header.request_api_key),
    })?;
    let err = |e: anyhow::Error| CodecError {
        api,
        version,
        reason: e.to_string(),
    };
    let mut buf = BytesMut::new();
    header
        .encode(&mut buf, api.request_header_version(version))
        .map_err(err)?;
    body.encode(&mut buf, crate::newer::schema_version(api, version))
        .map_err(err)?;
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
    fn bytes_after_the_body_are_ignored_as_kafka_ignores_them() {
        use kafka_protocol::messages::MetadataRequest;
        let mut req = MetadataRequest::default();
        req.allow_auto_topic_creation = true;
        let mut buf = BytesMut::new();
        req.encode(&mut buf, 12).unwrap();
        // What librdkafka 2.12 appends to Metadata v12.
        buf.extend_from_slice(&[0, 0, 0]);
        let mut body = buf.freeze();
        let back: MetadataRequest = decode_body(ApiKey::Metadata, 12, &mut body).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn a_short_body_is_an_error() {
        use kafka_protocol::messages::FetchRequest;
        let mut buf = BytesMut::new();
        FetchRequest::default().encode(&mut buf, 12).unwrap();
        let mut body = buf.freeze().slice(..10);
        assert!(decode_body::<FetchRequest>(ApiKey::Fetch, 12, &mut body).is_err());
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
