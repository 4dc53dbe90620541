//! The client side of SOCKS4 and SOCKS4a, for a proxy that goes through a SOCKS4a
//! parent: a CONNECT request is written, the 8-byte reply parsed (`Ok(None)` until all
//! 8 bytes are there; bytes after them belong to the tunnel).

#[cfg(test)]
mod tests;

use super::{Error, Reply, MAX_USER, REPLY_LEN, VERSION};
use crate::addr::{Address, Host, MAX_DOMAIN};
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};

/// Longest request [`write_connect`] writes: the fixed 8 bytes, a 255-byte user id and
/// a 255-byte name, each with its NUL.
pub const MAX_REQUEST: usize = 8 + MAX_USER + 1 + MAX_DOMAIN + 1;

/// Appends a CONNECT request: `04 01 PORT IP USERID 00` for an IPv4 target, and the 4a
/// form `04 01 PORT 0.0.0.1 USERID 00 NAME 00` for a name (resolved by the server). An
/// IPv6 target cannot be carried ([`Error::Ipv6Target`]); the user id may not hold a NUL
/// ([`Error::NulInUser`]) nor exceed [`MAX_USER`] bytes. Nothing is written on error.
pub fn write_connect(dst: &Address, user: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
    if user.len() > MAX_USER {
        return Err(Error::UserTooLong);
    }
    if user.contains(&0) {
        return Err(Error::NulInUser);
    }
    let (ip, name) = match &dst.host {
        Host::Ip(IpAddr::V4(ip)) => (*ip, None),
        Host::Ip(IpAddr::V6(_)) => return Err(Error::Ipv6Target),
        Host::Domain(d) => (Ipv4Addr::new(0, 0, 0, 1), Some(d.as_bytes())),
    };
    out.extend_from_slice(&[VERSION, 1]);
    out.extend_from_slice(&dst.port.to_be_bytes());
    out.extend_from_slice(&ip.octets());
    out.extend_from_slice(user);
    out.push(0);
    if let Some(name) = name {
        out.extend_from_slice(name);
        out.push(0);
    }
    Ok(())
}

/// The server's reply. `code` is CD as received: [`Reply::Granted`] (`5A`) is success,
/// `5B`..`5D` are named refusals, anything else an unassigned one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerReply {
    pub code: u8,
    /// DSTPORT DSTIP as the server filled them in (often zeros).
    pub bound: SocketAddrV4,
}

impl ServerReply {
    pub fn granted(&self) -> bool {
        self.code == Reply::Granted as u8
    }

    /// The named code, `None` when unassigned.
    pub fn reply(&self) -> Option<Reply> {
        Reply::from_code(self.code)
    }

    /// What the code means, for a log line.
    pub fn reason(&self) -> &'static str {
        self.reply().map_or("unassigned reply code", Reply::reason)
    }
}

/// VN(0) CD DSTPORT DSTIP: exactly 8 bytes. A VN other than 0 is
/// [`Error::UnsupportedReplyVersion`] (a SOCKS5 server, or an HTTP one, answering).
pub fn parse_reply(buf: &[u8]) -> Result<Option<(ServerReply, usize)>, Error> {
    let Some(&vn) = buf.first() else { return Ok(None) };
    if vn != 0 {
        return Err(Error::UnsupportedReplyVersion(vn));
    }
    let Some(b) = buf.get(..REPLY_LEN) else { return Ok(None) };
    // `b` has exactly REPLY_LEN (8) bytes, so the indexing cannot fail.
    let port = u16::from_be_bytes([b[2], b[3]]);
    let bound = SocketAddrV4::new(Ipv4Addr::new(b[4], b[5], b[6], b[7]), port);
    Ok(Some((ServerReply { code: b[1], bound }, REPLY_LEN)))
}
