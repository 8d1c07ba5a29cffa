//! The SASL mechanisms and the SCRAM hash functions.

use ring::{digest, hmac, pbkdf2};

/// A SASL mechanism spate offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mechanism {
    /// RFC 4616: the password in the clear (use it over TLS).
    Plain,
    /// RFC 5802 / 7677 with SHA-256.
    ScramSha256,
    /// RFC 5802 with SHA-512.
    ScramSha512,
}

impl Mechanism {
    /// Every mechanism, in the order spate lists them.
    pub const ALL: [Mechanism; 3] = [Self::Plain, Self::ScramSha256, Self::ScramSha512];

    /// The mechanism's SASL name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
        }
    }

    /// The mechanism of a SASL name (exact, as Kafka matches them).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The SCRAM hash function, for the SCRAM mechanisms.
    pub fn scram(self) -> Option<ScramAlgorithm> {
        match self {
            Self::Plain => None,
            Self::ScramSha256 => Some(ScramAlgorithm::Sha256),
            Self::ScramSha512 => Some(ScramAlgorithm::Sha512),
        }
    }
}

/// The hash function of a SCRAM mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScramAlgorithm {
    /// SCRAM-SHA-256.
    Sha256,
    /// SCRAM-SHA-512.
    Sha512,
}

impl ScramAlgorithm {
    /// Both, in the order Kafka numbers them (ScramMechanism 1 and 2).
    pub const ALL: [ScramAlgorithm; 2] = [Self::Sha256, Self::Sha512];

    /// Its mechanism.
    pub fn mechanism(self) -> Mechanism {
        match self {
            Self::Sha256 => Mechanism::ScramSha256,
            Self::Sha512 => Mechanism::ScramSha512,
        }
    }

    /// Kafka's ScramMechanism number (AlterUserScramCredentials, DescribeUserScramCredentials).
    pub fn kafka_type(self) -> i8 {
        match self {
            Self::Sha256 => 1,
            Self::Sha512 => 2,
        }
    }

    /// The algorithm of Kafka's ScramMechanism number.
    pub fn from_kafka_type(t: i8) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.kafka_type() == t)
    }

    /// The hash output length in bytes.
    pub fn output_len(self) -> usize {
        match self {
            Self::Sha256 => 32,
            Self::Sha512 => 64,
        }
    }

    pub(crate) fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        let alg = match self {
            Self::Sha256 => hmac::HMAC_SHA256,
            Self::Sha512 => hmac::HMAC_SHA512,
        };
        hmac::sign(&hmac::Key::new(alg, key), data)
            .as_ref()
            .to_vec()
    }

    pub(crate) fn hash(self, data: &[u8]) -> Vec<u8> {
        let alg = match self {
            Self::Sha256 => &digest::SHA256,
            Self::Sha512 => &digest::SHA512,
        };
        digest::digest(alg, data).as_ref().to_vec()
    }

    /// RFC 5802's Hi(): PBKDF2 with this HMAC.
    pub(crate) fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let alg = match self {
            Self::Sha256 => pbkdf2::PBKDF2_HMAC_SHA256,
            Self::Sha512 => pbkdf2::PBKDF2_HMAC_SHA512,
        };
        let mut out = vec![0u8; self.output_len()];
        // Iterations are checked against MIN_ITERATIONS wherever they are accepted.
        let n = std::num::NonZeroU32::new(iterations.max(1)).unwrap_or(std::num::NonZeroU32::MIN);
        pbkdf2::derive(alg, n, salt, password, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_exact() {
        for m in Mechanism::ALL {
            assert_eq!(Mechanism::parse(m.name()), Some(m));
        }
        assert_eq!(Mechanism::parse("scram-sha-256"), None);
        assert_eq!(Mechanism::parse("GSSAPI"), None);
        assert_eq!(
            ScramAlgorithm::from_kafka_type(2),
            Some(ScramAlgorithm::Sha512)
        );
        assert_eq!(ScramAlgorithm::from_kafka_type(0), None);
    }
}
