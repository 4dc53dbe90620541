//! The properties the codecs keep, as plain checks that panic on a violation: the
//! prefix contract, the fields of a head the proxy forwards, the chunked scanner fed in
//! pieces. One copy, used by the property tests (`props`, generated inputs) and by the
//! cargo-fuzz targets in `fuzz/` (feature `check`, off otherwise).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::IpAddr;

use crate::addr::{Address, Host};
use crate::chunked::{ChunkError, Progress, Scanner};
use crate::http::{HeadError, RequestHead, ResponseHead};

/// The SOCKS prefix contract: every prefix of `buf` parses to `Ok(None)` or to what
/// the whole of `buf` parses to.
pub fn prefix_contract<T, E>(buf: &[u8], parse: impl Fn(&[u8]) -> Result<Option<(T, usize)>, E>)
where
    T: PartialEq + std::fmt::Debug,
    E: PartialEq + std::fmt::Debug,
{
    let whole = parse(buf);
    for i in 0..buf.len() {
        let got = parse(&buf[..i]);
        if got != Ok(None) {
            assert_eq!(got, whole, "prefix {i} of {buf:02x?}");
        }
    }
}

/// The head parsers' prefix contract at the given cuts (or every prefix): a prefix is `Ok(None)`, or
/// refused when the whole is refused (the error named, and its status, may depend on
/// the split), or the same head.
pub fn head_prefix_contract<T: PartialEq + std::fmt::Debug>(
    buf: &[u8],
    cuts: impl IntoIterator<Item = usize>,
    parse: impl Fn(&[u8]) -> Result<Option<T>, HeadError>,
) {
    let whole = parse(buf);
    for i in cuts {
        match (parse(&buf[..i.min(buf.len())]), &whole) {
            (Ok(None), _) | (Err(_), Err(_)) => {}
            (got, _) => assert_eq!(&got, &whole, "prefix {i} of {buf:02x?}"),
        }
    }
}

pub type Fields = Vec<(Vec<u8>, Vec<u8>)>;

pub fn request_fields(buf: &[u8], h: &RequestHead) -> Fields {
    h.headers.iter().map(|f| (f.name.get(buf).to_vec(), f.value.get(buf).to_vec())).collect()
}

pub fn response_fields(buf: &[u8], h: &ResponseHead) -> Fields {
    h.headers.iter().map(|f| (f.name.get(buf).to_vec(), f.value.get(buf).to_vec())).collect()
}

/// Fields the writers add, drop or rewrite; every other field is forwarded as it came.
const MANAGED: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "host",
    "via",
    "x-forwarded-for",
    "forwarded",
    "max-forwards",
    "content-length",
    "transfer-encoding",
    "proxy-authorization",
    "proxy-authenticate",
];

/// The fields of `fields` that must pass unchanged and in order: all but the managed
/// ones and those a Connection field of either head names.
pub fn kept(fields: &Fields, other: &Fields) -> Fields {
    let named: Vec<Vec<u8>> = fields
        .iter()
        .chain(other)
        .filter(|(n, _)| n.eq_ignore_ascii_case(b"connection"))
        .flat_map(|(_, v)| v.split(|&b| b == b',').map(|t| t.trim_ascii().to_ascii_lowercase()))
        .collect();
    fields
        .iter()
        .filter(|(n, _)| {
            let n = n.to_ascii_lowercase();
            !MANAGED.iter().any(|m| m.as_bytes() == n) && !named.contains(&n)
        })
        .cloned()
        .collect()
}

pub fn count(fields: &Fields, name: &[u8]) -> usize {
    fields.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).count()
}

/// Never Content-Length and Transfer-Encoding both, and every length the same number
/// (`0` and `00` are one length: RFC 9110 8.6 lets a recipient take identical decimal
/// values, and the writers send the length once).
pub fn assert_unambiguous(fields: &Fields, what: &str) {
    assert!(
        count(fields, b"content-length") == 0 || count(fields, b"transfer-encoding") == 0,
        "{what}: Content-Length and Transfer-Encoding"
    );
    let mut lengths = fields
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(b"content-length"))
        .flat_map(|(_, v)| v.split(|&b| b == b','))
        .map(|v| {
            let digits = v.trim_ascii();
            let significant = digits.iter().position(|&b| b != b'0').unwrap_or(digits.len());
            digits[significant..].to_vec()
        });
    if let Some(first) = lengths.next() {
        assert!(lengths.all(|l| l == first), "{what}: differing lengths");
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Done,
    More,
    Failed(ChunkError),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub ending: Ending,
    pub consumed: usize,
    pub forwarded: Vec<u8>,
}

/// Feed `body` to a scanner as the proxy reads it: the bytes up to each cut arrive
/// together, and bytes the scanner leaves (a trailer name not whole yet) are given
/// again with the next ones.
pub fn scan_split(body: &[u8], cuts: &[usize], dechunk: bool) -> Outcome {
    let mut s = if dechunk { Scanner::dechunk() } else { Scanner::new() };
    let mut ends: Vec<usize> = cuts.iter().map(|&c| c % (body.len() + 1)).collect();
    ends.sort_unstable();
    ends.push(body.len());
    let mut pos = 0;
    let mut forwarded = Vec::new();
    for end in ends {
        loop {
            let scan = match s.scan(&body[pos..end]) {
                Ok(scan) => scan,
                Err(e) => return Outcome { ending: Ending::Failed(e), consumed: pos, forwarded },
            };
            if scan.forward {
                forwarded.extend_from_slice(&body[pos..pos + scan.len]);
            }
            pos += scan.len;
            if scan.progress == Progress::Done {
                return Outcome { ending: Ending::Done, consumed: pos, forwarded };
            }
            if scan.len == 0 {
                break;
            }
        }
    }
    Outcome { ending: Ending::More, consumed: pos, forwarded }
}

/// Same verdict; same bytes passed on unless the body failed (a failing run is not
/// passed on, so how much went before the error depends on the reads).
pub fn assert_same_outcome(split: &Outcome, whole: &Outcome) {
    if let Ending::Failed(_) = whole.ending {
        assert_eq!(split.ending, whole.ending);
        assert!(whole.consumed <= split.consumed);
    } else {
        assert_eq!(split, whole);
    }
}

/// A client's encoding of a SOCKS5 address (ATYP, address, port).
pub fn encode5_addr(a: &Address, out: &mut Vec<u8>) {
    match &a.host {
        Host::Ip(IpAddr::V4(ip)) => {
            out.push(1);
            out.extend_from_slice(&ip.octets());
        }
        Host::Ip(IpAddr::V6(ip)) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
        }
        Host::Domain(d) => {
            out.push(3);
            out.push(d.len() as u8);
            out.extend_from_slice(d.as_bytes());
        }
    }
    out.extend_from_slice(&a.port.to_be_bytes());
}
