//! Protocol detection from the first bytes a client sends, for listeners
//! that accept SOCKS4, SOCKS5, HTTP and TLS on one port.
//!
//! Only the first byte (two for TLS) is looked at: this picks a parser, it
//! does not validate anything. The chosen parser rejects what is malformed.

#[cfg(test)]
mod tests;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Socks4,
    Socks5,
    Http,
    Tls,
}

/// The first bytes match none of the protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown protocol")]
pub struct UnknownProtocol;

/// TLS record content type: handshake.
const TLS_HANDSHAKE: u8 = 0x16;
/// Major version byte of every TLS (and SSL 3.0) record version.
const TLS_MAJOR: u8 = 0x03;

/// From the first bytes a client sent: 0x04 → Socks4, 0x05 → Socks5, 0x16
/// followed by 0x03 → Tls (a TLS handshake record; two bytes are needed to
/// decide), an ASCII uppercase letter (start of an HTTP method token, e.g.
/// G, P, C, H, O, D, T) → Http. `Ok(None)` when more bytes are needed (an
/// empty buffer, or 0x16 alone); `Err(UnknownProtocol)` otherwise.
pub fn detect(first: &[u8]) -> Result<Option<Protocol>, UnknownProtocol> {
    match first {
        [] | [TLS_HANDSHAKE] => Ok(None),
        [TLS_HANDSHAKE, TLS_MAJOR, ..] => Ok(Some(Protocol::Tls)),
        [4, ..] => Ok(Some(Protocol::Socks4)),
        [5, ..] => Ok(Some(Protocol::Socks5)),
        [b'A'..=b'Z', ..] => Ok(Some(Protocol::Http)),
        _ => Err(UnknownProtocol),
    }
}

/// The connection preface of HTTP/2 with prior knowledge (RFC 9113 3.4).
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether bytes read from a new connection are (the start of) the HTTP/2 preface. Four
/// bytes are enough: no HTTP/1 method is `PRI`.
pub fn is_h2_preface(bytes: &[u8]) -> bool {
    let n = bytes.len().min(H2_PREFACE.len());
    bytes.len() >= 4 && bytes[..n] == H2_PREFACE[..n]
}
