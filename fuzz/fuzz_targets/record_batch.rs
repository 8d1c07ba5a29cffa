//! Any bytes as a produced batch or a stretch of log: validation and iteration never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spate_protocol::batch::{validate, Batches};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = validate(data) {
        assert_eq!(h.total_len(), data.len());
    }
    let mut it = Batches::new(data);
    for (at, h) in it.by_ref() {
        assert!(at + h.total_len() <= data.len());
    }
    assert!(it.position() <= data.len());
});
