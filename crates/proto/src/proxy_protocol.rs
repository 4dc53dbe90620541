//! The PROXY protocol (haproxy's `proxy-protocol.txt`, versions 1 and 2): the header a
//! load balancer puts before a connection's first byte to tell the next hop who the
//! client was, and the writers for sending it to a relay target or a parent.
//!
//! [`parse`] follows the contract of the SOCKS parsers: `Ok(None)` means "need more
//! bytes" (a short buffer is never an error), `Ok(Some((header, consumed)))` a complete
//! header, and an [`Error`] as soon as the bytes seen so far cannot be a header the
//! listener accepts. Bytes after `consumed` are the client's own. A header is at most
//! [`MAX_HEADER`] bytes, so a caller reads into a bounded buffer.
//!
//! Version 1 is one text line, `PROXY TCP4|TCP6|UNKNOWN ...\r\n`, at most 107 bytes.
//! Version 2 is binary: a 12-byte signature, version/command, family/transport, a
//! length, the addresses, then TLVs (skipped, but each must fit the length).
//! A LOCAL command (v2, a health check from the balancer itself), an `UNKNOWN` line (v1)
//! or an unspecified or UNIX family (v2) carries no IP addresses: [`Addresses::Local`]
//! and [`Addresses::Unknown`], for which the connection's own peer stays the client.

#[cfg(test)]
mod tests;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The v2 signature: the first 12 bytes of every v2 header.
pub const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The longest v1 line, CRLF included (`PROXY TCP6` with two full-length addresses).
pub const MAX_V1: usize = 107;

/// The longest v2 header accepted: the 16 fixed bytes and up to 2048 of addresses and
/// TLVs (the addresses take at most 216; haproxy's own TLVs are well below that).
pub const MAX_V2: usize = 16 + 2048;

/// The longest header [`parse`] accepts, of either version.
pub const MAX_HEADER: usize = MAX_V2;

/// The v1 line starts so.
const V1_PREFIX: &[u8] = b"PROXY ";

/// Which versions a listener accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    V1,
    V2,
    Any,
}

/// The version a header came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// What a header says about the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addresses {
    /// v2 LOCAL: the balancer's own connection (a health check); no client to report.
    Local,
    /// v1 `UNKNOWN`, or v2 PROXY over an unspecified or UNIX family: a proxied
    /// connection whose addresses are not IP ones.
    Unknown,
    /// The client (`src`) and the address it connected to (`dst`). In v2 the transport
    /// may be DGRAM (`datagram`); v1 only speaks of TCP.
    Inet { src: SocketAddr, dst: SocketAddr, datagram: bool },
}

impl Addresses {
    /// The client's address, when the header carries one.
    pub fn source(&self) -> Option<SocketAddr> {
        match *self {
            Addresses::Inet { src, .. } => Some(src),
            _ => None,
        }
    }
}

/// A parsed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: Version,
    pub addresses: Addresses,
}

/// Why a header was refused. Display is a short lowercase reason for a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The first bytes are neither `PROXY ` nor the v2 signature.
    #[error("no PROXY protocol header")]
    Missing,
    /// A valid start of a version the listener does not accept.
    #[error("PROXY protocol v{0} not accepted here")]
    VersionNotAccepted(u8),
    /// v1: no CRLF within 107 bytes.
    #[error("PROXY v1 line longer than 107 bytes")]
    V1TooLong,
    /// v1: the protocol is not TCP4, TCP6 or UNKNOWN.
    #[error("PROXY v1 protocol not TCP4, TCP6 or UNKNOWN")]
    V1Protocol,
    /// v1: not `PROXY proto src dst sport dport` with single spaces.
    #[error("malformed PROXY v1 line")]
    V1Syntax,
    /// v1: an address that is not one of the family the protocol names.
    #[error("bad address in PROXY v1 line")]
    V1Address,
    /// v1: a port that is not a decimal 0..=65535 without leading zeros.
    #[error("bad port in PROXY v1 line")]
    V1Port,
    /// v2: the version nibble is not 2.
    #[error("unsupported PROXY v2 version {0}")]
    V2Version(u8),
    /// v2: the command nibble is neither LOCAL (0) nor PROXY (1).
    #[error("unsupported PROXY v2 command {0}")]
    V2Command(u8),
    /// v2 PROXY: a family/transport byte the specification does not define.
    #[error("unsupported PROXY v2 family/transport {0:#04x}")]
    V2Family(u8),
    /// v2: the length would take the header past [`MAX_V2`].
    #[error("PROXY v2 header of {0} bytes, longer than accepted")]
    V2TooLong(usize),
    /// v2: the length is too short for the family's addresses.
    #[error("PROXY v2 length too short for its addresses")]
    V2ShortAddresses,
    /// v2: a TLV runs past the header's length.
    #[error("PROXY v2 TLV overruns the header")]
    V2Tlv,
}

/// A PROXY protocol header at the start of `buf`, of a version `accept` allows.
pub fn parse(buf: &[u8], accept: Accept) -> Result<Option<(Header, usize)>, Error> {
    let Some(&first) = buf.first() else { return Ok(None) };
    if first == V1_PREFIX[0] {
        let n = buf.len().min(V1_PREFIX.len());
        if buf[..n] != V1_PREFIX[..n] {
            return Err(Error::Missing);
        }
        if accept == Accept::V2 {
            // Refused as v1 only once it is surely v1, so the verdict never depends
            // on how the bytes arrived.
            if n < V1_PREFIX.len() {
                return Ok(None);
            }
            return Err(Error::VersionNotAccepted(1));
        }
        parse_v1(buf)
    } else if first == SIGNATURE[0] {
        let n = buf.len().min(SIGNATURE.len());
        if buf[..n] != SIGNATURE[..n] {
            return Err(Error::Missing);
        }
        if accept == Accept::V1 {
            if n < SIGNATURE.len() {
                return Ok(None);
            }
            return Err(Error::VersionNotAccepted(2));
        }
        parse_v2(buf)
    } else {
        Err(Error::Missing)
    }
}

/// A v1 line at the start of `buf` (which must start with `PROXY ` or a prefix of it).
pub fn parse_v1(buf: &[u8]) -> Result<Option<(Header, usize)>, Error> {
    let window = &buf[..buf.len().min(MAX_V1)];
    let Some(cr) = window.windows(2).position(|w| w == b"\r\n") else {
        if buf.len() >= MAX_V1 {
            return Err(Error::V1TooLong);
        }
        let n = buf.len().min(V1_PREFIX.len());
        if buf[..n] != V1_PREFIX[..n] {
            return Err(Error::Missing);
        }
        return Ok(None);
    };
    let line = &buf[..cr];
    let Some(rest) = line.strip_prefix(V1_PREFIX) else { return Err(Error::Missing) };
    let addresses = if rest == b"UNKNOWN" || rest.starts_with(b"UNKNOWN ") {
        Addresses::Unknown
    } else {
        let mut fields = rest.split(|&b| b == b' ');
        let (Some(proto), Some(src), Some(dst), Some(sport), Some(dport), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return Err(match rest.split(|&b| b == b' ').next() {
                Some(b"TCP4" | b"TCP6") => Error::V1Syntax,
                _ => Error::V1Protocol,
            });
        };
        let v6 = match proto {
            b"TCP4" => false,
            b"TCP6" => true,
            _ => return Err(Error::V1Protocol),
        };
        let (src, dst) = (ip(src, v6)?, ip(dst, v6)?);
        let (sport, dport) = (port(sport)?, port(dport)?);
        Addresses::Inet {
            src: SocketAddr::new(src, sport),
            dst: SocketAddr::new(dst, dport),
            datagram: false,
        }
    };
    Ok(Some((Header { version: Version::V1, addresses }, cr + 2)))
}

fn ip(b: &[u8], v6: bool) -> Result<IpAddr, Error> {
    let s = std::str::from_utf8(b).map_err(|_| Error::V1Address)?;
    if v6 {
        s.parse::<Ipv6Addr>().map(IpAddr::V6).map_err(|_| Error::V1Address)
    } else {
        s.parse::<Ipv4Addr>().map(IpAddr::V4).map_err(|_| Error::V1Address)
    }
}

fn port(b: &[u8]) -> Result<u16, Error> {
    if b.is_empty() || b.len() > 5 || (b.len() > 1 && b[0] == b'0') {
        return Err(Error::V1Port);
    }
    let mut n: u32 = 0;
    for &c in b {
        if !c.is_ascii_digit() {
            return Err(Error::V1Port);
        }
        n = n * 10 + u32::from(c - b'0');
    }
    u16::try_from(n).map_err(|_| Error::V1Port)
}

/// A v2 header at the start of `buf` (which must start with the signature or a prefix
/// of it).
pub fn parse_v2(buf: &[u8]) -> Result<Option<(Header, usize)>, Error> {
    let n = buf.len().min(SIGNATURE.len());
    if buf[..n] != SIGNATURE[..n] {
        return Err(Error::Missing);
    }
    let Some(&ver_cmd) = buf.get(12) else { return Ok(None) };
    if ver_cmd >> 4 != 2 {
        return Err(Error::V2Version(ver_cmd >> 4));
    }
    let local = match ver_cmd & 0x0f {
        0 => true,
        1 => false,
        c => return Err(Error::V2Command(c)),
    };
    let Some(&fam) = buf.get(13) else { return Ok(None) };
    // LOCAL: the receiver ignores the family (and whatever the length covers).
    let addr_len = match fam {
        _ if local => 0,
        0x00 => 0,
        0x11 | 0x12 => 12,
        0x21 | 0x22 => 36,
        0x31 | 0x32 => 216,
        f => return Err(Error::V2Family(f)),
    };
    let Some(len) = buf.get(14..16) else { return Ok(None) };
    let total = 16 + usize::from(u16::from_be_bytes([len[0], len[1]]));
    if total > MAX_V2 {
        return Err(Error::V2TooLong(total));
    }
    if total < 16 + addr_len {
        return Err(Error::V2ShortAddresses);
    }
    let Some(body) = buf.get(16..total) else { return Ok(None) };
    let addresses = if local {
        Addresses::Local
    } else {
        let (a, tlvs) = body.split_at(addr_len);
        skip_tlvs(tlvs)?;
        let datagram = fam & 0x0f == 2;
        match fam >> 4 {
            1 => {
                let ip = |i: usize| IpAddr::V4(Ipv4Addr::new(a[i], a[i + 1], a[i + 2], a[i + 3]));
                let src = SocketAddr::new(ip(0), u16::from_be_bytes([a[8], a[9]]));
                let dst = SocketAddr::new(ip(4), u16::from_be_bytes([a[10], a[11]]));
                Addresses::Inet { src, dst, datagram }
            }
            2 => {
                let ip = |i: usize| {
                    let mut o = [0u8; 16];
                    o.copy_from_slice(&a[i..i + 16]);
                    IpAddr::V6(Ipv6Addr::from(o))
                };
                let src = SocketAddr::new(ip(0), u16::from_be_bytes([a[32], a[33]]));
                let dst = SocketAddr::new(ip(16), u16::from_be_bytes([a[34], a[35]]));
                Addresses::Inet { src, dst, datagram }
            }
            _ => Addresses::Unknown,
        }
    };
    Ok(Some((Header { version: Version::V2, addresses }, total)))
}

/// TYPE(1) LENGTH(2, big-endian) VALUE, to the end: each must fit.
fn skip_tlvs(mut tlvs: &[u8]) -> Result<(), Error> {
    while !tlvs.is_empty() {
        let Some(l) = tlvs.get(1..3) else { return Err(Error::V2Tlv) };
        let end = 3 + usize::from(u16::from_be_bytes([l[0], l[1]]));
        tlvs = tlvs.get(end..).ok_or(Error::V2Tlv)?;
    }
    Ok(())
}

/// Appends a v1 line for a TCP connection from `src` to `dst` (`None`: `PROXY UNKNOWN`).
/// When the two differ in family, the IPv4 one is written IPv4-mapped, as `TCP6`.
pub fn write_v1(addrs: Option<(SocketAddr, SocketAddr)>, out: &mut Vec<u8>) {
    use std::io::Write;
    let Some((src, dst)) = addrs else {
        out.extend_from_slice(b"PROXY UNKNOWN\r\n");
        return;
    };
    let (s, d) = (src.ip(), dst.ip());
    // Writing into a Vec cannot fail.
    let _ = match (s, d) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            write!(out, "PROXY TCP4 {s} {d} {} {}\r\n", src.port(), dst.port())
        }
        _ => write!(out, "PROXY TCP6 {} {} {} {}\r\n", v6(s), v6(d), src.port(), dst.port()),
    };
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// Appends a v2 header for a TCP connection from `src` to `dst` (`None`: a LOCAL
/// command, no addresses), without TLVs. Families are made to agree as in [`write_v1`].
pub fn write_v2(addrs: Option<(SocketAddr, SocketAddr)>, out: &mut Vec<u8>) {
    out.extend_from_slice(&SIGNATURE);
    let Some((src, dst)) = addrs else {
        out.extend_from_slice(&[0x20, 0x00, 0, 0]);
        return;
    };
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            out.extend_from_slice(&[0x21, 0x11, 0, 12]);
            out.extend_from_slice(&s.octets());
            out.extend_from_slice(&d.octets());
        }
        (s, d) => {
            out.extend_from_slice(&[0x21, 0x21, 0, 36]);
            out.extend_from_slice(&v6(s).octets());
            out.extend_from_slice(&v6(d).octets());
        }
    }
    out.extend_from_slice(&src.port().to_be_bytes());
    out.extend_from_slice(&dst.port().to_be_bytes());
}
