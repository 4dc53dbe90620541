//! The client side of SOCKS5, for a proxy that goes through a SOCKS5 parent: the
//! greeting, the RFC 1929 username/password request and a request are written; the
//! server's method choice, auth status and reply are parsed.
//!
//! The parsers follow the crate's contract: `Ok(None)` while the message is incomplete,
//! `Ok(Some((value, consumed)))` when it is whole (bytes after `consumed` are not
//! touched: after the reply they belong to the tunnel), an [`Error`] naming the fault as
//! soon as the bytes can no longer be a valid message. A refusal is not an error here: it
//! is a well-formed message the caller acts on ([`Choice::NoneAcceptable`],
//! `parse_auth_status` returning `false`, a [`ServerReply`] whose code is not 0).

#[cfg(test)]
mod tests;

use super::{atyp, method, parse_address, Command, Error, Reply, AUTH_VERSION, VERSION};
use crate::addr::{Address, Host, MAX_DOMAIN};
use std::net::IpAddr;

/// Longest request [`write_request`] writes: VER CMD RSV ATYP LEN, a 255-byte name, PORT.
pub const MAX_REQUEST: usize = 6 + MAX_DOMAIN + 2;

/// The greeting: VER NMETHODS METHODS, offering NO AUTH, and USERNAME/PASSWORD too when
/// the client has credentials (`05 01 00` or `05 02 00 02`).
pub fn greeting(user_pass: bool) -> &'static [u8] {
    if user_pass {
        &[VERSION, 2, method::NO_AUTH, method::USER_PASS]
    } else {
        &[VERSION, 1, method::NO_AUTH]
    }
}

/// What the server chose from the greeting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    NoAuth,
    /// Username/password sub-negotiation next (only when it was offered).
    UserPass,
    /// `FF`: none of the offered methods; the server closes.
    NoneAcceptable,
}

/// The method selection message, VER(5) METHOD, given whether the greeting offered
/// username/password. A method that was not offered (GSSAPI, a private one, or
/// username/password to a greeting without it) is [`Error::UnexpectedMethod`].
pub fn parse_method(buf: &[u8], user_pass_offered: bool) -> Result<Option<(Choice, usize)>, Error> {
    let Some(&ver) = buf.first() else { return Ok(None) };
    if ver != VERSION {
        return Err(Error::UnsupportedVersion(ver));
    }
    let Some(&m) = buf.get(1) else { return Ok(None) };
    let choice = match m {
        method::NO_AUTH => Choice::NoAuth,
        method::USER_PASS if user_pass_offered => Choice::UserPass,
        method::NONE_ACCEPTABLE => Choice::NoneAcceptable,
        other => return Err(Error::UnexpectedMethod(other)),
    };
    Ok(Some((choice, 2)))
}

/// Appends the RFC 1929 request: VER(1) ULEN UNAME PLEN PASSWD. Each of `user` and
/// `password` must hold 1..=255 bytes (any bytes); otherwise nothing is written.
pub fn write_credentials(user: &[u8], password: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
    let ulen = match user.len() {
        0 => return Err(Error::EmptyUser),
        n => u8::try_from(n).map_err(|_| Error::UserTooLong)?,
    };
    let plen = match password.len() {
        0 => return Err(Error::EmptyPassword),
        n => u8::try_from(n).map_err(|_| Error::PasswordTooLong)?,
    };
    out.extend_from_slice(&[AUTH_VERSION, ulen]);
    out.extend_from_slice(user);
    out.push(plen);
    out.extend_from_slice(password);
    Ok(())
}

/// The sub-negotiation status, VER(1) STATUS: `true` for `01 00`, `false` for any other
/// status (the server closes after a failure).
pub fn parse_auth_status(buf: &[u8]) -> Result<Option<(bool, usize)>, Error> {
    let Some(&ver) = buf.first() else { return Ok(None) };
    if ver != AUTH_VERSION {
        return Err(Error::UnsupportedAuthVersion(ver));
    }
    let Some(&status) = buf.get(1) else { return Ok(None) };
    Ok(Some((status == 0, 2)))
}

/// Appends a request: VER(5) CMD RSV(0) ATYP DST.ADDR DST.PORT, the destination as an
/// IPv4 or IPv6 address or a name (resolved by the server). At most [`MAX_REQUEST`] bytes.
/// For UDP ASSOCIATE, `dst` is where the client will send datagrams from (`0.0.0.0:0`
/// when it does not know).
pub fn write_request(command: Command, dst: &Address, out: &mut Vec<u8>) {
    let cmd = match command {
        Command::Connect => 1,
        Command::Bind => 2,
        Command::UdpAssociate => 3,
    };
    out.extend_from_slice(&[VERSION, cmd, 0]);
    match &dst.host {
        Host::Ip(IpAddr::V4(ip)) => {
            out.push(atyp::IPV4);
            out.extend_from_slice(&ip.octets());
        }
        Host::Ip(IpAddr::V6(ip)) => {
            out.push(atyp::IPV6);
            out.extend_from_slice(&ip.octets());
        }
        Host::Domain(d) => {
            out.push(atyp::DOMAIN);
            // A Domain holds 1..=255 bytes, so its length fits the byte.
            out.push(d.len() as u8);
            out.extend_from_slice(d.as_bytes());
        }
    }
    out.extend_from_slice(&dst.port.to_be_bytes());
}

/// The server's reply to a request. `code` is REP as received: 0 is success, 1..=8 are
/// named by [`Reply`], anything else is an unassigned failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerReply {
    pub code: u8,
    /// BND.ADDR BND.PORT: for CONNECT the server's address towards the target, for UDP
    /// ASSOCIATE the relay to send datagrams to (an unspecified IP, `0.0.0.0`, means the
    /// address the client reached the server on).
    pub bound: Address,
}

impl ServerReply {
    pub fn succeeded(&self) -> bool {
        self.code == Reply::Succeeded as u8
    }

    /// The named code, `None` when unassigned.
    pub fn reply(&self) -> Option<Reply> {
        Reply::from_code(self.code)
    }

    /// What the code means, for a log line (RFC 1928 section 6).
    pub fn reason(&self) -> &'static str {
        self.reply().map_or("unassigned reply code", Reply::reason)
    }
}

/// VER(5) REP RSV(0) ATYP BND.ADDR BND.PORT, checked in wire order. A failure reply must
/// be as well-formed as a success: a bad version, a nonzero RSV or a bad address type is
/// an error.
pub fn parse_reply(buf: &[u8]) -> Result<Option<(ServerReply, usize)>, Error> {
    let Some(&ver) = buf.first() else { return Ok(None) };
    if ver != VERSION {
        return Err(Error::UnsupportedVersion(ver));
    }
    let Some(&code) = buf.get(1) else { return Ok(None) };
    let Some(&rsv) = buf.get(2) else { return Ok(None) };
    if rsv != 0 {
        return Err(Error::NonZeroReserved);
    }
    Ok(parse_address(buf, 3)?.map(|(bound, end)| (ServerReply { code, bound }, end)))
}
