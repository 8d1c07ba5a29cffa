//! Size-prefixed frames: every Kafka request and response is an int32 length followed by that
//! many bytes.

use bytes::{Buf, Bytes, BytesMut};
use thiserror::Error;

/// Kafka's default `socket.request.max.bytes`: 100 MiB.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 100 * 1024 * 1024;

/// Why a frame could not be taken from the stream.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    /// The length prefix was negative or zero.
    #[error("invalid frame length {0}")]
    InvalidLength(i32),
    /// The length prefix exceeds the configured maximum.
    #[error("frame of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The announced size.
        size: usize,
        /// The configured maximum.
        limit: usize,
    },
}

/// Takes one whole frame body off the front of `buf`, if one is complete.
///
/// Returns `Ok(None)` when more bytes are needed. The length prefix is checked before any body
/// bytes are awaited, so an oversized frame is refused without buffering it.
pub fn take_frame(buf: &mut BytesMut, max_bytes: usize) -> Result<Option<Bytes>, FrameError> {
    let Some(size) = peek_frame_len(buf, max_bytes)? else {
        return Ok(None);
    };
    if buf.len() < 4 + size {
        return Ok(None);
    }
    buf.advance(4);
    Ok(Some(buf.split_to(size).freeze()))
}

/// Reads and validates the length prefix without consuming anything.
pub fn peek_frame_len(buf: &[u8], max_bytes: usize) -> Result<Option<usize>, FrameError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let raw = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if raw <= 0 {
        return Err(FrameError::InvalidLength(raw));
    }
    let size = raw as usize;
    if size > max_bytes {
        return Err(FrameError::TooLarge {
            size,
            limit: max_bytes,
        });
    }
    Ok(Some(size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_frame_waits_for_whole_body() {
        let mut buf = BytesMut::from(&[0, 0, 0, 3, 1, 2][..]);
        assert_eq!(take_frame(&mut buf, 10), Ok(None));
        buf.extend_from_slice(&[3, 9]);
        assert_eq!(
            take_frame(&mut buf, 10).unwrap().unwrap().as_ref(),
            &[1, 2, 3]
        );
        assert_eq!(buf.as_ref(), &[9]);
    }

    #[test]
    fn take_frame_refuses_oversized_before_body_arrives() {
        let mut buf = BytesMut::from(&[0, 0, 1, 0][..]);
        assert_eq!(
            take_frame(&mut buf, 255),
            Err(FrameError::TooLarge {
                size: 256,
                limit: 255
            })
        );
    }

    #[test]
    fn take_frame_refuses_negative_and_zero_lengths() {
        let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xff][..]);
        assert_eq!(take_frame(&mut buf, 10), Err(FrameError::InvalidLength(-1)));
        let mut buf = BytesMut::from(&[0, 0, 0, 0][..]);
        assert_eq!(take_frame(&mut buf, 10), Err(FrameError::InvalidLength(0)));
    }
}
