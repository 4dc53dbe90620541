//! SOCKS4 and the SOCKS4a extension: request parser and reply writer.
//!
//! Request: VN(4) CD DSTPORT(2) DSTIP(4) USERID NUL, and for 4a (DSTIP is
//! 0.0.0.x with x != 0) DOMAIN NUL after that. [`parse_request`] returns
//! `Ok(None)` while a NUL is still missing within the size caps, and an
//! [`Error`] as soon as the bytes seen can no longer be a valid request.
//! Every error is answered with [`Reply::Rejected`] (see [`reply()`]), then
//! the connection is closed.
//!
//! [`client`] holds the other side, for a proxy going through a SOCKS4a parent.

pub mod client;
#[cfg(test)]
mod tests;

use crate::addr::{Address, Domain, Host, MAX_DOMAIN};
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};

pub const VERSION: u8 = 4;

/// Longest accepted USERID, without its NUL.
pub const MAX_USER: usize = 255;

/// Length of a reply.
pub const REPLY_LEN: usize = 8;

/// CD field of a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Reply {
    Granted = 0x5a,
    Rejected = 0x5b,
    /// Rejected because the client's identd could not be reached.
    IdentUnreachable = 0x5c,
    /// Rejected because identd reported a different user id.
    IdentMismatch = 0x5d,
}

impl Reply {
    /// The named code for CD, `None` for any other byte.
    pub fn from_code(code: u8) -> Option<Reply> {
        Some(match code {
            0x5a => Reply::Granted,
            0x5b => Reply::Rejected,
            0x5c => Reply::IdentUnreachable,
            0x5d => Reply::IdentMismatch,
            _ => return None,
        })
    }

    /// What the code means (lowercase, for a log line).
    pub fn reason(self) -> &'static str {
        match self {
            Reply::Granted => "request granted",
            Reply::Rejected => "request rejected or failed",
            Reply::IdentUnreachable => "rejected: the server cannot reach the client's identd",
            Reply::IdentMismatch => "rejected: identd reported a different user id",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Connect,
    Bind,
}

/// A parsed request. `dst.host` is [`Host::Domain`] for 4a requests and
/// [`Host::Ip`] (always IPv4) otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub command: Command,
    pub dst: Address,
    /// The user id (arbitrary non-NUL bytes, possibly empty) is
    /// `buf[8..8 + user_len]` of the parsed buffer; see [`Request::user`].
    pub user_len: usize,
}

impl Request {
    /// Offset of the user id in the parsed buffer.
    pub const USER_START: usize = 8;

    /// The user id, given the buffer this request was parsed from (empty if
    /// a different, shorter buffer is passed, rather than panicking).
    pub fn user<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        buf.get(Self::USER_START..Self::USER_START + self.user_len).unwrap_or(&[])
    }
}

/// Why a SOCKS4 request was rejected (or, by [`client`], a reply, or why a request
/// could not be written). Display is a short lowercase reason for a log line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// VN is not 4.
    #[error("unsupported socks version {0}")]
    UnsupportedVersion(u8),
    /// CD is not 1 (CONNECT) or 2 (BIND).
    #[error("unsupported command {0}")]
    UnsupportedCommand(u8),
    /// No NUL within the first 256 bytes of USERID (client side: a user id over 255 bytes).
    #[error("user id longer than 255 bytes")]
    UserTooLong,
    /// 4a: no NUL within the first 256 bytes of DOMAIN.
    #[error("domain name longer than 255 bytes")]
    DomainTooLong,
    /// 4a: DOMAIN is empty.
    #[error("empty domain name")]
    EmptyDomain,
    /// 4a: DOMAIN has a byte outside printable ASCII (see [`Domain`]).
    #[error("invalid domain name")]
    InvalidDomain,
    /// Client side: SOCKS4 and 4a carry no IPv6 destination.
    #[error("socks4a cannot carry an ipv6 destination")]
    Ipv6Target,
    /// Client side: a user id is NUL-terminated, so it cannot hold a NUL.
    #[error("user id contains a nul byte")]
    NulInUser,
    /// Client side: VN of a reply is not 0.
    #[error("unsupported socks4 reply version {0}")]
    UnsupportedReplyVersion(u8),
}

impl Error {
    /// SOCKS4 has a single failure code for malformed requests.
    pub fn reply(&self) -> Reply {
        Reply::Rejected
    }
}

/// Finds a NUL-terminated field of at most `max` bytes at `buf[start..]`.
/// `Ok(Some(len))` without the NUL; `Ok(None)` when the buffer ends first
/// while still under the cap; `Err(())` when `max + 1` bytes hold no NUL.
fn find_nul(buf: &[u8], start: usize, max: usize) -> Result<Option<usize>, ()> {
    let rest = buf.get(start..).unwrap_or(&[]);
    let window = &rest[..rest.len().min(max + 1)];
    match window.iter().position(|&b| b == 0) {
        Some(len) => Ok(Some(len)),
        None if window.len() > max => Err(()),
        None => Ok(None),
    }
}

/// VN(4) CD DSTPORT DSTIP USERID NUL [DOMAIN NUL when DSTIP is 0.0.0.x
/// with x != 0 (4a)]. A request is at most 8 + 256 + 256 bytes.
pub fn parse_request(buf: &[u8]) -> Result<Option<(Request, usize)>, Error> {
    let Some(&vn) = buf.first() else { return Ok(None) };
    if vn != VERSION {
        return Err(Error::UnsupportedVersion(vn));
    }
    let Some(&cd) = buf.get(1) else { return Ok(None) };
    let command = match cd {
        1 => Command::Connect,
        2 => Command::Bind,
        other => return Err(Error::UnsupportedCommand(other)),
    };
    let Some(fixed) = buf.get(2..8) else { return Ok(None) };
    let port = u16::from_be_bytes([fixed[0], fixed[1]]); // `fixed` has exactly 6 bytes
    let ip = Ipv4Addr::new(fixed[2], fixed[3], fixed[4], fixed[5]);

    let user_len = match find_nul(buf, Request::USER_START, MAX_USER) {
        Ok(Some(len)) => len,
        Ok(None) => return Ok(None),
        Err(()) => return Err(Error::UserTooLong),
    };
    let user_end = Request::USER_START + user_len + 1;

    // 0.0.0.0 is a plain (if useless) IPv4 destination, not 4a.
    let is_4a = matches!(ip.octets(), [0, 0, 0, x] if x != 0);
    if !is_4a {
        let dst = Address { host: Host::Ip(IpAddr::V4(ip)), port };
        return Ok(Some((Request { command, dst, user_len }, user_end)));
    }

    // 4a: the domain follows the user id's NUL.
    if buf.get(user_end) == Some(&0) {
        return Err(Error::EmptyDomain);
    }
    let name_len = match find_nul(buf, user_end, MAX_DOMAIN) {
        Ok(Some(len)) => len,
        unfinished => {
            // A bad byte is rejected as soon as it arrives, and before the length is: the
            // same verdict however the request is split.
            let rest = buf.get(user_end..).unwrap_or(&[]);
            if !rest[..rest.len().min(MAX_DOMAIN + 1)].iter().all(u8::is_ascii_graphic) {
                return Err(Error::InvalidDomain);
            }
            return match unfinished {
                Err(()) => Err(Error::DomainTooLong),
                Ok(_) => Ok(None),
            };
        }
    };
    let name = buf.get(user_end..user_end + name_len).unwrap_or(&[]);
    let domain = Domain::new(name).ok_or(Error::InvalidDomain)?;
    let dst = Address { host: Host::Domain(domain), port };
    Ok(Some((Request { command, dst, user_len }, user_end + name_len + 1)))
}

/// 8 bytes: VN=0, CD, DSTPORT, DSTIP (from `bound`, zeros when None).
pub fn reply(reply: Reply, bound: Option<SocketAddrV4>) -> [u8; REPLY_LEN] {
    let (ip, port) = bound.map_or(([0; 4], 0), |sa| (sa.ip().octets(), sa.port()));
    let [p0, p1] = port.to_be_bytes();
    [0, reply as u8, p0, p1, ip[0], ip[1], ip[2], ip[3]]
}
