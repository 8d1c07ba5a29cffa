//! Listeners as Kafka names them: `SASL_SSL://host:port`, one per security protocol.

use std::fmt;

/// How a listener secures its connections (Kafka's `security.protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SecurityProtocol {
    /// Neither TLS nor SASL.
    Plaintext,
    /// TLS; the principal comes from the client certificate, if any.
    Ssl,
    /// SASL over plain TCP.
    SaslPlaintext,
    /// SASL over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// All four, in Kafka's order.
    pub const ALL: [SecurityProtocol; 4] = [
        Self::Plaintext,
        Self::Ssl,
        Self::SaslPlaintext,
        Self::SaslSsl,
    ];

    /// Kafka's name (also the listener's name here).
    pub fn name(self) -> &'static str {
        match self {
            Self::Plaintext => "PLAINTEXT",
            Self::Ssl => "SSL",
            Self::SaslPlaintext => "SASL_PLAINTEXT",
            Self::SaslSsl => "SASL_SSL",
        }
    }

    /// The protocol of a Kafka name (case-insensitive, as Kafka parses it).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name))
    }

    /// Whether connections are TLS.
    pub fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    /// Whether clients must authenticate with SASL first.
    pub fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

impl fmt::Display for SecurityProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One listener address: its protocol, host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// Its security protocol (and name).
    pub protocol: SecurityProtocol,
    /// Host (empty: every interface when listening).
    pub host: String,
    /// Port (0 when listening: any free port).
    pub port: u16,
}

impl Listener {
    /// `host:port`, for binding or connecting.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.protocol, self.address())
    }
}

/// Parses Kafka's listener list: `NAME://host:port,...`, each name one of PLAINTEXT, SSL,
/// SASL_PLAINTEXT, SASL_SSL and at most once.
pub fn parse_listeners(text: &str) -> Result<Vec<Listener>, String> {
    let mut out: Vec<Listener> = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, rest) = item
            .split_once("://")
            .ok_or_else(|| format!("'{item}' is not NAME://host:port"))?;
        let protocol = SecurityProtocol::parse(name).ok_or_else(|| {
            format!(
                "'{name}' is not a listener name: one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"
            )
        })?;
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| format!("'{item}' has no port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port: u16 = port
            .parse()
            .map_err(|_| format!("'{item}': '{port}' is not a port"))?;
        if out.iter().any(|l| l.protocol == protocol) {
            return Err(format!("listener {name} is given twice"));
        }
        out.push(Listener {
            protocol,
            host: host.to_string(),
            port,
        });
    }
    if out.is_empty() {
        return Err("no listener given".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_listener_lists_parse_and_bad_ones_say_why() {
        let l =
            parse_listeners("PLAINTEXT://127.0.0.1:9092, sasl_ssl://:9094,SSL://[::1]:0").unwrap();
        assert_eq!(l.len(), 3);
        assert_eq!(l[1].protocol, SecurityProtocol::SaslSsl);
        assert_eq!(l[1].host, "");
        assert_eq!(l[2].address(), "[::1]:0");
        assert_eq!(l[0].to_string(), "PLAINTEXT://127.0.0.1:9092");
        for (bad, why) in [
            ("", "no listener"),
            ("127.0.0.1:9092", "NAME://"),
            ("INTERNAL://h:1", "not a listener name"),
            ("SSL://h", "no port"),
            ("SSL://h:port", "not a port"),
            ("SSL://h:1,SSL://h:2", "twice"),
        ] {
            let e = parse_listeners(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
