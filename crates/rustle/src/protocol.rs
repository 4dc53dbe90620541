//! What an exchange is: the one protocol enum that the access rules (`protocols = [...]`),
//! the access log and the metrics' `protocol` label share, and the HTTP version the log
//! shows beside it. At the bottom of the layering: it depends on no other module.

use serde::Deserialize;

/// What a client asked for, as far as it was told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Protocol {
    /// Not told: a connection refused before its protocol was known (a failed TLS
    /// handshake, bytes that are no protocol, a refusal at the connection limit). Never in
    /// an access rule.
    #[default]
    #[serde(skip)]
    Unknown,
    /// A plain HTTP request in absolute form (including upgrades).
    Http,
    /// An HTTP CONNECT tunnel.
    Connect,
    Socks5,
    Socks4,
    /// A TCP port relay (`relay` listener).
    Relay,
    /// SOCKS5 UDP ASSOCIATE datagrams and the UDP port relay.
    Udp,
    /// A SOCKS4 or SOCKS5 BIND (a listening port for one incoming connection), checked on
    /// the host and port the client announced and on the address that connects. The
    /// exchange is logged and counted as its SOCKS version's.
    Bind,
}

impl Protocol {
    /// Every protocol an access rule can name.
    pub(crate) const ALL: [Protocol; 7] = [
        Protocol::Http,
        Protocol::Connect,
        Protocol::Socks5,
        Protocol::Socks4,
        Protocol::Relay,
        Protocol::Udp,
        Protocol::Bind,
    ];

    /// The name an access rule gives it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Protocol::Unknown => "-",
            Protocol::Http => "http",
            Protocol::Connect => "connect",
            Protocol::Socks5 => "socks5",
            Protocol::Socks4 => "socks4",
            Protocol::Relay => "relay",
            Protocol::Udp => "udp",
            Protocol::Bind => "bind",
        }
    }

    /// The access log's name for an exchange of this protocol, the HTTP ones by `version`.
    pub(crate) fn log_name(self, version: Version) -> &'static str {
        match self {
            Protocol::Http | Protocol::Connect => match version {
                Version::Unknown => "-",
                Version::Http10 => "HTTP/1.0",
                Version::Http11 => "HTTP/1.1",
                Version::Http2 => "HTTP/2",
            },
            Protocol::Socks4 => "SOCKS4",
            Protocol::Socks5 => "SOCKS5",
            Protocol::Relay => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Unknown | Protocol::Bind => "-",
        }
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Protocol, String> {
        Protocol::ALL.into_iter().find(|p| p.as_str() == s).ok_or_else(|| {
            format!("unknown protocol `{s}`: use http, connect, socks5, socks4, relay, udp or bind")
        })
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The HTTP version a client spoke (`Unknown` for the other protocols, and for a request
/// refused before its version was read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Version {
    #[default]
    Unknown,
    Http10,
    Http11,
    Http2,
}

impl Version {
    /// HTTP/1.`minor`.
    pub(crate) fn http1(minor: u8) -> Version {
        match minor {
            0 => Version::Http10,
            _ => Version::Http11,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Protocol, Version};

    #[test]
    fn names_for_the_rules_and_the_log() {
        for p in Protocol::ALL {
            assert_eq!(p.as_str().parse::<Protocol>(), Ok(p));
        }
        assert!("-".parse::<Protocol>().is_err());
        for (p, v, name) in [
            (Protocol::Http, Version::Http10, "HTTP/1.0"),
            (Protocol::Connect, Version::Http11, "HTTP/1.1"),
            (Protocol::Connect, Version::Http2, "HTTP/2"),
            (Protocol::Http, Version::Unknown, "-"),
            (Protocol::Socks4, Version::Unknown, "SOCKS4"),
            (Protocol::Socks5, Version::Unknown, "SOCKS5"),
            (Protocol::Relay, Version::Unknown, "TCP"),
            (Protocol::Udp, Version::Unknown, "UDP"),
            (Protocol::Unknown, Version::Unknown, "-"),
        ] {
            assert_eq!(p.log_name(v), name, "{p:?} {v:?}");
        }
    }
}
