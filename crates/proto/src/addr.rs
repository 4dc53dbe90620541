//! Destinations as SOCKS clients name them: an IP address or a domain name,
//! plus a port.
//!
//! [`Domain`] stores the name inline (255 bytes, the SOCKS limit) so parsing
//! a request never allocates.

#[cfg(test)]
mod tests;

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// Longest domain name either SOCKS version can carry (one length byte in
/// SOCKS5; the same cap is enforced for SOCKS4a).
pub const MAX_DOMAIN: usize = 255;

/// A destination as a client names it.
// The inline domain makes this 256+ bytes; that is the point (no
// allocation per request), and it lives in one request at a time.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    Ip(IpAddr),
    Domain(Domain),
}

/// A domain name of 1..=255 bytes, stored inline (no allocation).
///
/// Only printable ASCII without spaces (0x21..=0x7e) is accepted. That is
/// all this type promises: the name is *not* checked against DNS syntax, so
/// it may be an IP literal written as text (`"127.0.0.1"`), contain `:` or
/// `/`, or end in a dot. Comparison is byte-wise (case-sensitive).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Domain {
    len: u8,
    /// `bytes[..len]` is the name; the rest is always zero, so the derived
    /// `PartialEq`/`Hash` only see the name.
    bytes: [u8; MAX_DOMAIN],
}

impl Domain {
    /// `None` when `bytes` is empty, longer than 255 bytes, or contains a
    /// byte outside printable ASCII (space, control bytes, DEL, non-ASCII).
    pub fn new(bytes: &[u8]) -> Option<Domain> {
        let len = u8::try_from(bytes.len()).ok()?;
        if len == 0 || !bytes.iter().all(|&b| is_domain_byte(b)) {
            return None;
        }
        let mut buf = [0u8; MAX_DOMAIN];
        buf[..bytes.len()].copy_from_slice(bytes);
        Some(Domain { len, bytes: buf })
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    pub fn as_str(&self) -> &str {
        // `new` admits printable ASCII only, which is always valid UTF-8, so
        // the fallback is unreachable; it avoids an unwrap.
        std::str::from_utf8(self.as_bytes()).unwrap_or("")
    }

    #[allow(clippy::len_without_is_empty)] // never empty by construction
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }
}

/// Printable ASCII, no space.
fn is_domain_byte(b: u8) -> bool {
    b.is_ascii_graphic()
}

impl fmt::Debug for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Domain").field(&self.as_str()).finish()
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A destination host and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    pub host: Host,
    pub port: u16,
}

impl From<SocketAddr> for Address {
    fn from(sa: SocketAddr) -> Self {
        Address { host: Host::Ip(sa.ip()), port: sa.port() }
    }
}

/// `1.2.3.4:80`, `[::1]:80`, `example.com:80`.
impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}:{}", self.port),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            Host::Domain(d) => write!(f, "{d}:{}", self.port),
        }
    }
}
