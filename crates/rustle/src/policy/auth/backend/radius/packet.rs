//! RADIUS packets, I/O-free: Access-Request and Accounting-Request written with their
//! authenticators (RFC 2865 3, RFC 2866 3), User-Password hidden (RFC 2865 5.2), CHAP
//! answers (RFC 1994), Message-Authenticator (RFC 3579 3.2, HMAC-MD5) signed in requests
//! and checked in responses that carry one (the caller decides whether one must), and
//! responses checked against the request they answer before a single attribute is
//! believed.

use hmac::{Hmac, Mac};
use md5::{Digest, Md5};
use subtle::ConstantTimeEq;

pub(crate) const ACCESS_REQUEST: u8 = 1;
pub(crate) const ACCESS_ACCEPT: u8 = 2;
pub(crate) const ACCESS_REJECT: u8 = 3;
pub(crate) const ACCOUNTING_REQUEST: u8 = 4;
pub(crate) const ACCOUNTING_RESPONSE: u8 = 5;
pub(crate) const ACCESS_CHALLENGE: u8 = 11;

/// Attribute types (RFC 2865 5, RFC 2866 5, RFC 2869 5, RFC 3162).
pub(crate) mod kind {
    pub(crate) const USER_NAME: u8 = 1;
    pub(crate) const USER_PASSWORD: u8 = 2;
    pub(crate) const CHAP_PASSWORD: u8 = 3;
    pub(crate) const NAS_IP_ADDRESS: u8 = 4;
    pub(crate) const FRAMED_IP_ADDRESS: u8 = 8;
    pub(crate) const CLASS: u8 = 25;
    pub(crate) const VENDOR_SPECIFIC: u8 = 26;
    pub(crate) const SESSION_TIMEOUT: u8 = 27;
    pub(crate) const CALLED_STATION_ID: u8 = 30;
    pub(crate) const CALLING_STATION_ID: u8 = 31;
    pub(crate) const NAS_IDENTIFIER: u8 = 32;
    pub(crate) const ACCT_STATUS_TYPE: u8 = 40;
    pub(crate) const ACCT_INPUT_OCTETS: u8 = 42;
    pub(crate) const ACCT_OUTPUT_OCTETS: u8 = 43;
    pub(crate) const ACCT_SESSION_ID: u8 = 44;
    pub(crate) const ACCT_AUTHENTIC: u8 = 45;
    pub(crate) const ACCT_SESSION_TIME: u8 = 46;
    pub(crate) const ACCT_TERMINATE_CAUSE: u8 = 49;
    pub(crate) const ACCT_INPUT_GIGAWORDS: u8 = 52;
    pub(crate) const ACCT_OUTPUT_GIGAWORDS: u8 = 53;
    pub(crate) const CHAP_CHALLENGE: u8 = 60;
    pub(crate) const NAS_PORT_TYPE: u8 = 61;
    pub(crate) const MESSAGE_AUTHENTICATOR: u8 = 80;
    pub(crate) const NAS_IPV6_ADDRESS: u8 = 95;
}

/// The largest packet (RFC 2865 3).
pub(crate) const MAX_PACKET: usize = 4096;
const HEADER: usize = 20;
/// The longest password User-Password carries (RFC 2865 5.2).
const MAX_PASSWORD: usize = 128;

type HmacMd5 = Hmac<Md5>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Error {
    #[error("the packet would pass 4096 bytes")]
    TooLong,
    #[error("an attribute value must have 1 to 253 bytes")]
    BadValue,
    #[error("a password of more than 128 bytes cannot be sent")]
    PasswordTooLong,
    #[error("a response of {0} bytes is malformed")]
    Malformed(usize),
    #[error("a response to another request (identifier {0})")]
    OtherIdentifier(u8),
    #[error("a response whose Response Authenticator is wrong (another secret?)")]
    BadAuthenticator,
    #[error("a response whose Message-Authenticator is wrong (another secret?)")]
    BadMessageAuthenticator,
}

/// A request being written.
pub(crate) struct Builder {
    buf: Vec<u8>,
    /// Where the Message-Authenticator's value sits, when the packet has one.
    signature_at: Option<usize>,
}

impl Builder {
    /// A packet of `code` and `id`; `authenticator` is the Request Authenticator of an
    /// Access-Request (16 random bytes), ignored for an Accounting-Request (computed).
    pub(crate) fn new(code: u8, id: u8, authenticator: [u8; 16]) -> Builder {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&[code, id, 0, 0]);
        buf.extend_from_slice(&authenticator);
        Builder { buf, signature_at: None }
    }

    /// The Request Authenticator the packet carries.
    pub(crate) fn authenticator(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.buf[4..HEADER]);
        a
    }

    /// Adds one attribute.
    pub(crate) fn add(&mut self, kind: u8, value: &[u8]) -> Result<(), Error> {
        if value.is_empty() || value.len() > 253 {
            return Err(Error::BadValue);
        }
        if self.buf.len() + 2 + value.len() > MAX_PACKET {
            return Err(Error::TooLong);
        }
        self.buf.push(kind);
        self.buf.push(value.len() as u8 + 2);
        self.buf.extend_from_slice(value);
        Ok(())
    }

    pub(crate) fn add_u32(&mut self, kind: u8, value: u32) -> Result<(), Error> {
        self.add(kind, &value.to_be_bytes())
    }

    /// A Message-Authenticator, signed when the packet is finished (BlastRADIUS: servers
    /// may require it, and RFC 3579 wants it first).
    pub(crate) fn sign(&mut self) -> Result<(), Error> {
        self.add(kind::MESSAGE_AUTHENTICATOR, &[0; 16])?;
        self.signature_at = Some(self.buf.len() - 16);
        Ok(())
    }

    /// User-Password: `password` hidden with the secret and the Request Authenticator.
    pub(crate) fn add_password(&mut self, password: &[u8], secret: &[u8]) -> Result<(), Error> {
        let hidden = hide_password(password, secret, &self.authenticator())?;
        self.add(kind::USER_PASSWORD, &hidden)
    }

    /// The finished Access-Request (its Request Authenticator as given).
    pub(crate) fn finish_access(mut self, secret: &[u8]) -> Vec<u8> {
        self.set_length();
        self.fill_signature(secret);
        self.buf
    }

    /// The finished Accounting-Request: its Request Authenticator is
    /// MD5(Code, Identifier, Length, 16 zero bytes, attributes, secret).
    pub(crate) fn finish_accounting(mut self, secret: &[u8]) -> Vec<u8> {
        self.set_length();
        self.buf[4..HEADER].fill(0);
        self.fill_signature(secret);
        let digest = Md5::new().chain_update(&self.buf).chain_update(secret).finalize();
        self.buf[4..HEADER].copy_from_slice(&digest);
        self.buf
    }

    fn set_length(&mut self) {
        // `add` keeps the packet within 4096 bytes.
        let len = self.buf.len() as u16;
        self.buf[2..4].copy_from_slice(&len.to_be_bytes());
    }

    fn fill_signature(&mut self, secret: &[u8]) {
        if let Some(at) = self.signature_at {
            let mac = hmac_md5(secret, &self.buf);
            self.buf[at..at + 16].copy_from_slice(&mac);
        }
    }
}

/// User-Password (RFC 2865 5.2): the password padded with zeros to a multiple of 16, each
/// block XORed with MD5(secret, previous hidden block), the first with the authenticator.
pub(crate) fn hide_password(
    password: &[u8],
    secret: &[u8],
    authenticator: &[u8; 16],
) -> Result<Vec<u8>, Error> {
    if password.len() > MAX_PASSWORD {
        return Err(Error::PasswordTooLong);
    }
    let blocks = password.len().div_ceil(16).max(1);
    let mut out = vec![0u8; blocks * 16];
    out[..password.len()].copy_from_slice(password);
    let mut prev: [u8; 16] = *authenticator;
    for block in out.chunks_mut(16) {
        let b = Md5::new().chain_update(secret).chain_update(prev).finalize();
        for (c, k) in block.iter_mut().zip(b.iter()) {
            *c ^= k;
        }
        prev.copy_from_slice(block);
    }
    Ok(out)
}

/// CHAP-Password (RFC 2865 5.3): the CHAP identifier and MD5(identifier, password,
/// challenge).
pub(crate) fn chap_password(ident: u8, password: &[u8], challenge: &[u8]) -> [u8; 17] {
    let digest =
        Md5::new().chain_update([ident]).chain_update(password).chain_update(challenge).finalize();
    let mut out = [0u8; 17];
    out[0] = ident;
    out[1..].copy_from_slice(&digest);
    out
}

pub(crate) fn hmac_md5(secret: &[u8], data: &[u8]) -> [u8; 16] {
    // HMAC takes a key of any length.
    let mut mac = HmacMd5::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// A response checked against its request: its code and its attributes.
#[derive(Debug)]
pub(crate) struct Response<'a> {
    pub(crate) code: u8,
    /// Whether it carries a Message-Authenticator (checked).
    pub(crate) signed: bool,
    attributes: &'a [u8],
}

/// Checks `packet` as the answer to `request`: its identifier, its length, its Response
/// Authenticator (MD5(Code, Identifier, Length, Request Authenticator, attributes,
/// secret)), the framing of its attributes and, when it has one, its Message-Authenticator.
pub(crate) fn check_response<'a>(
    packet: &'a [u8],
    request: &[u8],
    secret: &[u8],
) -> Result<Response<'a>, Error> {
    if packet.len() < HEADER || request.len() < HEADER {
        return Err(Error::Malformed(packet.len()));
    }
    let len = u16::from_be_bytes([packet[2], packet[3]]) as usize;
    // Bytes past the Length are padding (RFC 2865 3); fewer than it is a broken packet.
    if !(HEADER..=MAX_PACKET).contains(&len) || len > packet.len() {
        return Err(Error::Malformed(packet.len()));
    }
    let packet = &packet[..len];
    if packet[1] != request[1] {
        return Err(Error::OtherIdentifier(packet[1]));
    }
    let request_auth = &request[4..HEADER];
    let expect = Md5::new()
        .chain_update(&packet[..4])
        .chain_update(request_auth)
        .chain_update(&packet[HEADER..])
        .chain_update(secret)
        .finalize();
    if !bool::from(expect.as_slice().ct_eq(&packet[4..HEADER])) {
        return Err(Error::BadAuthenticator);
    }
    let attributes = &packet[HEADER..];
    let mut signature = None;
    let mut at = 0;
    while at < attributes.len() {
        let rest = &attributes[at..];
        if rest.len() < 2 || rest[1] < 2 || rest[1] as usize > rest.len() {
            return Err(Error::Malformed(len));
        }
        if rest[0] == kind::MESSAGE_AUTHENTICATOR {
            if rest[1] != 18 {
                return Err(Error::BadMessageAuthenticator);
            }
            signature = Some(HEADER + at + 2);
        }
        at += rest[1] as usize;
    }
    if let Some(s) = signature {
        // The HMAC covers the packet with the Request Authenticator in place of the
        // Response Authenticator and the signature zeroed (RFC 3579 3.2).
        let mut copy = packet.to_vec();
        copy[4..HEADER].copy_from_slice(request_auth);
        copy[s..s + 16].fill(0);
        let mac = hmac_md5(secret, &copy);
        if !bool::from(mac.ct_eq(&packet[s..s + 16])) {
            return Err(Error::BadMessageAuthenticator);
        }
    }
    Ok(Response { code: packet[0], signed: signature.is_some(), attributes })
}

impl<'a> Response<'a> {
    /// Its attributes, in order: (type, value).
    pub(crate) fn attributes(&self) -> impl Iterator<Item = (u8, &'a [u8])> {
        let mut rest = self.attributes;
        std::iter::from_fn(move || {
            // Framing checked by `check_response`; stop at anything else all the same.
            let (&kind, &len) = (rest.first()?, rest.get(1)?);
            let len = len as usize;
            let value = rest.get(2..len)?;
            rest = &rest[len..];
            Some((kind, value))
        })
    }
}

/// The sub-attributes of a Vendor-Specific value (RFC 2865 5.26, the recommended format):
/// (vendor, type, value); none when it does not follow that format.
pub(crate) fn vendor_attributes(value: &[u8]) -> impl Iterator<Item = (u32, u8, &[u8])> {
    let (vendor, mut rest) = match value {
        [a, b, c, d, rest @ ..] => (u32::from_be_bytes([*a, *b, *c, *d]), rest),
        _ => (0, &[][..]),
    };
    std::iter::from_fn(move || {
        let (&kind, &len) = (rest.first()?, rest.get(1)?);
        let len = len as usize;
        let value = rest.get(2..len)?;
        rest = &rest[len..];
        Some((vendor, kind, value))
    })
}

#[cfg(test)]
mod tests;
