//! Any bytes as SASL messages: PLAIN and both steps of a SCRAM exchange (against a real
//! credential, so the proof check runs) never panic, and never authenticate a wrong password.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use spate_auth::{plain, ScramAlgorithm, ScramCredential, ScramServer, Step};

/// PBKDF2 is slow: each credential is derived once per process, with the smallest count
/// Kafka accepts, not once per input.
fn credential(alg: ScramAlgorithm) -> &'static ScramCredential {
    static SHA256: OnceLock<ScramCredential> = OnceLock::new();
    static SHA512: OnceLock<ScramCredential> = OnceLock::new();
    let cell = match alg {
        ScramAlgorithm::Sha256 => &SHA256,
        ScramAlgorithm::Sha512 => &SHA512,
    };
    cell.get_or_init(|| ScramCredential::derive(alg, b"secret", b"salt", 4096))
}

fuzz_target!(|data: &[u8]| {
    let alg = if data.first().is_some_and(|b| b & 1 == 1) {
        ScramAlgorithm::Sha512
    } else {
        ScramAlgorithm::Sha256
    };
    let cred = credential(alg);
    assert!(plain(data, |u, p| u == "u" && p == b"secret").map_or(true, |u| u == "u"));
    let (first, last) = data.split_at(data.len() / 2);
    let mut s = ScramServer::with_nonce(alg, "server-nonce".into(), [1; 32]);
    if let Ok(Step::Continue(_)) = s.step(first, |_| Some(cred.clone())) {
        // Random bytes cannot produce the proof of "secret" for this nonce.
        assert!(!matches!(s.step(last, |_| None), Ok(Step::Done { .. })));
    }
});
