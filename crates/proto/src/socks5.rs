//! SOCKS5 (RFC 1928) handshake codecs and the RFC 1929 username/password
//! sub-negotiation, plus the UDP ASSOCIATE datagram header.
//!
//! The handshake parsers take whatever the caller has buffered and return
//! `Ok(None)` when the message is not complete yet (a short buffer is never
//! an error), `Ok(Some((value, consumed)))` when it is, and an [`Error`] as
//! soon as the bytes seen so far can no longer be a valid message. Bytes
//! after `consumed` belong to the next message (clients may pipeline).
//!
//! What to send on an error depends on the phase:
//! - greeting ([`parse_greeting`]): [`method_selection`]`(`[`method::NONE_ACCEPTABLE`]`)`,
//!   then close;
//! - sub-negotiation ([`parse_credentials`]): [`auth_status`]`(false)`, then close;
//! - request ([`parse_request`]): [`write_reply`] with [`Error::reply`], then close.
//!
//! [`Error::reply`] is defined for every variant so the caller never has to
//! special-case, but it only goes on the wire in the request phase.
//!
//! [`client`] holds the other side, for a proxy going through a SOCKS5 parent.

pub mod client;
#[cfg(test)]
mod tests;

use crate::addr::{Address, Domain, Host};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

pub const VERSION: u8 = 5;

/// Version byte of the RFC 1929 username/password sub-negotiation.
pub const AUTH_VERSION: u8 = 1;

/// Maximum length of a reply, so callers can use a stack buffer: 22
/// (IPv6 bound address).
pub const MAX_REPLY: usize = 22;

/// Maximum length of a UDP datagram header written by [`write_udp_header`]
/// (IPv6 source address).
pub const MAX_UDP_HEADER: usize = 22;

/// REP field of a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Reply {
    Succeeded = 0,
    GeneralFailure = 1,
    NotAllowed = 2,
    NetworkUnreachable = 3,
    HostUnreachable = 4,
    ConnectionRefused = 5,
    TtlExpired = 6,
    CommandNotSupported = 7,
    AddressTypeNotSupported = 8,
}

impl Reply {
    /// The named code for REP, `None` for the unassigned ones (9..=255).
    pub fn from_code(code: u8) -> Option<Reply> {
        Some(match code {
            0 => Reply::Succeeded,
            1 => Reply::GeneralFailure,
            2 => Reply::NotAllowed,
            3 => Reply::NetworkUnreachable,
            4 => Reply::HostUnreachable,
            5 => Reply::ConnectionRefused,
            6 => Reply::TtlExpired,
            7 => Reply::CommandNotSupported,
            8 => Reply::AddressTypeNotSupported,
            _ => return None,
        })
    }

    /// What the code means, as RFC 1928 section 6 words it (lowercase, for a log line).
    pub fn reason(self) -> &'static str {
        match self {
            Reply::Succeeded => "succeeded",
            Reply::GeneralFailure => "general SOCKS server failure",
            Reply::NotAllowed => "connection not allowed by ruleset",
            Reply::NetworkUnreachable => "network unreachable",
            Reply::HostUnreachable => "host unreachable",
            Reply::ConnectionRefused => "connection refused",
            Reply::TtlExpired => "TTL expired",
            Reply::CommandNotSupported => "command not supported",
            Reply::AddressTypeNotSupported => "address type not supported",
        }
    }
}

/// METHOD codes for the greeting and the method selection message.
pub mod method {
    pub const NO_AUTH: u8 = 0;
    pub const GSSAPI: u8 = 1;
    pub const USER_PASS: u8 = 2;
    pub const NONE_ACCEPTABLE: u8 = 0xff;
}

/// ATYP codes.
mod atyp {
    pub(super) const IPV4: u8 = 1;
    pub(super) const DOMAIN: u8 = 3;
    pub(super) const IPV6: u8 = 4;
}

/// Why a SOCKS5 message was rejected (from a client, or, by [`client`], from a
/// server), or could not be written. Display is a short lowercase reason for a log line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// VER of a greeting or request (or, to a client, of a method choice or reply) is not 5.
    #[error("unsupported socks version {0}")]
    UnsupportedVersion(u8),
    /// NMETHODS = 0 in the greeting.
    #[error("no authentication methods offered")]
    NoMethods,
    /// VER of the username/password sub-negotiation is not 1.
    #[error("unsupported username/password auth version {0}")]
    UnsupportedAuthVersion(u8),
    /// ULEN = 0.
    #[error("empty username")]
    EmptyUser,
    /// PLEN = 0.
    #[error("empty password")]
    EmptyPassword,
    /// CMD is not CONNECT, BIND or UDP ASSOCIATE.
    #[error("unsupported command {0}")]
    UnsupportedCommand(u8),
    /// RSV of a request, or the 2-byte RSV of a UDP datagram, is not zero.
    #[error("nonzero reserved field")]
    NonZeroReserved,
    /// ATYP is not 1 (IPv4), 3 (domain) or 4 (IPv6).
    #[error("unsupported address type {0}")]
    UnsupportedAddressType(u8),
    /// Domain name with length 0.
    #[error("empty domain name")]
    EmptyDomain,
    /// Domain name with a byte outside printable ASCII (see [`Domain`]).
    #[error("invalid domain name")]
    InvalidDomain,
    /// UDP datagram ends inside its header ([`parse_udp`] only; the
    /// handshake parsers return `Ok(None)` instead).
    #[error("truncated udp datagram header")]
    Truncated,
    /// Client side: the server chose a method the greeting did not offer.
    #[error("server chose authentication method {0:#04x}, which was not offered")]
    UnexpectedMethod(u8),
    /// Client side: a user name longer than 255 bytes cannot be sent.
    #[error("username longer than 255 bytes")]
    UserTooLong,
    /// Client side: a password longer than 255 bytes cannot be sent.
    #[error("password longer than 255 bytes")]
    PasswordTooLong,
}

impl Error {
    /// The reply to send when a request fails to parse.
    pub fn reply(&self) -> Reply {
        match self {
            Error::UnsupportedCommand(_) => Reply::CommandNotSupported,
            Error::UnsupportedAddressType(_) => Reply::AddressTypeNotSupported,
            _ => Reply::GeneralFailure,
        }
    }
}

/// The client's method offer. Methods other than NO AUTH and
/// USERNAME/PASSWORD (e.g. GSSAPI) are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Greeting {
    pub no_auth: bool,
    pub user_pass: bool,
}

/// VER(5) NMETHODS(>=1) METHODS. Duplicate methods are accepted.
pub fn parse_greeting(buf: &[u8]) -> Result<Option<(Greeting, usize)>, Error> {
    let Some(&ver) = buf.first() else { return Ok(None) };
    if ver != VERSION {
        return Err(Error::UnsupportedVersion(ver));
    }
    let Some(&n) = buf.get(1) else { return Ok(None) };
    if n == 0 {
        return Err(Error::NoMethods);
    }
    let end = 2 + usize::from(n);
    let Some(methods) = buf.get(2..end) else { return Ok(None) };
    let greeting = Greeting {
        no_auth: methods.contains(&method::NO_AUTH),
        user_pass: methods.contains(&method::USER_PASS),
    };
    Ok(Some((greeting, end)))
}

/// The server's method selection message: VER METHOD.
pub fn method_selection(method: u8) -> [u8; 2] {
    [VERSION, method]
}

/// RFC 1929 username/password; both slices borrow from the parsed buffer
/// and hold arbitrary bytes (1..=255 of them). `Debug` shows the user but
/// only the length of the password.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Credentials<'a> {
    pub user: &'a [u8],
    pub password: &'a [u8],
}

impl std::fmt::Debug for Credentials<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &String::from_utf8_lossy(self.user))
            .field("password", &format_args!("<{} bytes redacted>", self.password.len()))
            .finish()
    }
}

/// VER(1) ULEN(>=1) UNAME PLEN(>=1) PASSWD.
pub fn parse_credentials(buf: &[u8]) -> Result<Option<(Credentials<'_>, usize)>, Error> {
    let Some(&ver) = buf.first() else { return Ok(None) };
    if ver != AUTH_VERSION {
        return Err(Error::UnsupportedAuthVersion(ver));
    }
    let Some(&ulen) = buf.get(1) else { return Ok(None) };
    if ulen == 0 {
        return Err(Error::EmptyUser);
    }
    let user_end = 2 + usize::from(ulen);
    let Some(&plen) = buf.get(user_end) else { return Ok(None) };
    if plen == 0 {
        return Err(Error::EmptyPassword);
    }
    let end = user_end + 1 + usize::from(plen);
    let (Some(user), Some(password)) = (buf.get(2..user_end), buf.get(user_end + 1..end)) else {
        return Ok(None);
    };
    Ok(Some((Credentials { user, password }, end)))
}

/// Sub-negotiation status: `[1, 0]` on success, `[1, 1]` on failure (the
/// server must close the connection after a failure).
pub fn auth_status(ok: bool) -> [u8; 2] {
    [AUTH_VERSION, if ok { 0 } else { 1 }]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Connect,
    Bind,
    UdpAssociate,
}

/// A client request. For UDP ASSOCIATE, `dst` is the address the client
/// expects to send from (often `0.0.0.0:0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub command: Command,
    pub dst: Address,
}

/// VER(5) CMD RSV(0) ATYP DST.ADDR DST.PORT. Checks run in wire order, so
/// the first bad field decides the error (and thus the reply).
pub fn parse_request(buf: &[u8]) -> Result<Option<(Request, usize)>, Error> {
    let Some(&ver) = buf.first() else { return Ok(None) };
    if ver != VERSION {
        return Err(Error::UnsupportedVersion(ver));
    }
    let Some(&cmd) = buf.get(1) else { return Ok(None) };
    let command = match cmd {
        1 => Command::Connect,
        2 => Command::Bind,
        3 => Command::UdpAssociate,
        other => return Err(Error::UnsupportedCommand(other)),
    };
    let Some(&rsv) = buf.get(2) else { return Ok(None) };
    if rsv != 0 {
        return Err(Error::NonZeroReserved);
    }
    Ok(parse_address(buf, 3)?.map(|(dst, end)| (Request { command, dst }, end)))
}

/// ATYP DST.ADDR DST.PORT starting at `buf[at]`; `Ok(None)` when `buf`
/// ends before the address does. Returns the end offset.
fn parse_address(buf: &[u8], at: usize) -> Result<Option<(Address, usize)>, Error> {
    let Some(&ty) = buf.get(at) else { return Ok(None) };
    let at = at + 1;
    let (host, port_at) = match ty {
        atyp::IPV4 => {
            let Some(b) = buf.get(at..at + 4) else { return Ok(None) };
            let mut ip = [0u8; 4];
            ip.copy_from_slice(b);
            (Host::Ip(IpAddr::V4(Ipv4Addr::from(ip))), at + 4)
        }
        atyp::IPV6 => {
            let Some(b) = buf.get(at..at + 16) else { return Ok(None) };
            let mut ip = [0u8; 16];
            ip.copy_from_slice(b);
            (Host::Ip(IpAddr::V6(Ipv6Addr::from(ip))), at + 16)
        }
        atyp::DOMAIN => {
            let Some(&len) = buf.get(at) else { return Ok(None) };
            if len == 0 {
                return Err(Error::EmptyDomain);
            }
            let start = at + 1;
            let end = start + usize::from(len);
            let Some(name) = buf.get(start..end) else {
                // Reject a bad byte as soon as it arrives.
                if buf.get(start..).is_some_and(|seen| !is_domain(seen)) {
                    return Err(Error::InvalidDomain);
                }
                return Ok(None);
            };
            let domain = Domain::new(name).ok_or(Error::InvalidDomain)?;
            (Host::Domain(domain), end)
        }
        other => return Err(Error::UnsupportedAddressType(other)),
    };
    let Some(p) = buf.get(port_at..port_at + 2) else { return Ok(None) };
    // `get` returned exactly two bytes, so the indexing cannot fail.
    let port = u16::from_be_bytes([p[0], p[1]]);
    Ok(Some((Address { host, port }, port_at + 2)))
}

/// Whether every byte could be part of a [`Domain`].
fn is_domain(bytes: &[u8]) -> bool {
    bytes.iter().all(u8::is_ascii_graphic)
}

/// Appends ATYP BND.ADDR BND.PORT.
fn write_address(addr: SocketAddr, out: &mut Vec<u8>) {
    match addr.ip() {
        IpAddr::V4(ip) => {
            out.push(atyp::IPV4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(atyp::IPV6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&addr.port().to_be_bytes());
}

/// Appends a reply: VER REP RSV ATYP BND.ADDR BND.PORT (IPv4 or IPv6 per
/// the address, as given: an IPv4-mapped IPv6 address is written as IPv6;
/// use 0.0.0.0:0 when the caller has none). At most [`MAX_REPLY`] bytes.
pub fn write_reply(reply: Reply, bound: SocketAddr, out: &mut Vec<u8>) {
    out.extend_from_slice(&[VERSION, reply as u8, 0]);
    write_address(bound, out);
}

/// UDP ASSOCIATE datagram header: RSV(2 zero bytes) FRAG ATYP DST.ADDR
/// DST.PORT DATA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpHeader {
    /// 0 for a standalone datagram. Any value is accepted here; a relay
    /// that does not implement fragmentation must drop datagrams with
    /// `frag != 0` (RFC 1928 section 7).
    pub frag: u8,
    pub dst: Address,
}

/// Returns the header and the offset where DATA starts (may equal
/// `datagram.len()`: empty payload). A datagram too short, with RSV != 0,
/// a bad ATYP, or a bad or zero-length domain is an error (UDP has no
/// reply; the error is for counting and logging).
pub fn parse_udp(datagram: &[u8]) -> Result<(UdpHeader, usize), Error> {
    let (Some(&r0), Some(&r1), Some(&frag)) = (datagram.first(), datagram.get(1), datagram.get(2))
    else {
        return Err(Error::Truncated);
    };
    if r0 != 0 || r1 != 0 {
        return Err(Error::NonZeroReserved);
    }
    match parse_address(datagram, 3)? {
        Some((dst, data)) => Ok((UdpHeader { frag, dst }, data)),
        None => Err(Error::Truncated),
    }
}

/// Appends a header for a datagram coming back from `from` (frag 0). At
/// most [`MAX_UDP_HEADER`] bytes.
pub fn write_udp_header(from: SocketAddr, out: &mut Vec<u8>) {
    out.extend_from_slice(&[0, 0, 0]);
    write_address(from, out);
}
