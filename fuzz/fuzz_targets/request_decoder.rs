//! Any bytes as a request frame: decoding must return Ok or Err, never panic or abort.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spate_protocol::request::Request;

// The broker's allocator, so hostile length prefixes are judged as the broker meets them.
#[global_allocator]
static ALLOCATOR: spate_protocol::alloc::HostileLengthAllocator =
    spate_protocol::alloc::HostileLengthAllocator;

fuzz_target!(|data: &[u8]| {
    let _ = Request::decode(bytes::Bytes::copy_from_slice(data));
});
