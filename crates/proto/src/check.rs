//! The properties the codecs keep, as plain checks that panic on a violation: the
//! prefix contract, the fields of a head the proxy forwards, the chunked scanner fed in
//! pieces. One copy, used by the property tests (`props`, generated inputs) and by the
//! cargo-fuzz targets in `fuzz/` (feature `check`, off otherwise).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::IpAddr;

use crate::addr::{Address, Host};
use crate::chunked::{ChunkError, Progress, Scanner};
use crate::http::{
    h2_response_fields, parse_request, write_h2_request, BodyKind, H2Request, HeadError, Limits,
    RequestHead, RequestRewrite, ResponseHead, Target,
};

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

/// Whether a field name is a framing name spelt with an underscore.
fn framing_lookalike(name: &[u8]) -> bool {
    let dashed: Vec<u8> =
        name.iter().map(|&b| if b == b'_' { b'-' } else { b.to_ascii_lowercase() }).collect();
    name.contains(&b'_') && (dashed == b"content-length" || dashed == b"transfer-encoding")
}

/// What HTTP/2 delivers (RFC 9113 8.2): names are lowercase tokens, values have no
/// control bytes but HTAB and no whitespace at either end, and there is no Connection
/// field. Bounded so that the head fits the parser's limits.
fn h2_fields_valid(fields: &Fields) -> bool {
    let name_ok = |n: &[u8]| {
        !n.is_empty()
            && n.iter().all(|&b| crate::http::is_tchar(b) && !b.is_ascii_uppercase())
            && n != b"connection"
    };
    let value_ok = |v: &[u8]| {
        v.iter().all(|&b| b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80)
            && !matches!(v.first(), Some(b' ' | b'\t'))
            && !matches!(v.last(), Some(b' ' | b'\t'))
    };
    fields.len() <= 100
        && fields.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>() < 32 * 1024
        && fields.iter().all(|(n, v)| name_ok(n) && value_ok(v))
}

/// An HTTP/2 request written as HTTP/1.1 ([`write_h2_request`]) parses back to the same
/// method, target, Host and framing; every field but the managed ones and the cookies
/// goes on unchanged and in order; the cookies as one field, joined with `; ` (empty
/// ones left out); the
/// proxy's Via and address end their fields when asked; the next proxy's credentials
/// alone; never two lengths, nor a length and a coding. Returns whether the request was
/// checked: one outside what HTTP/2 delivers, or with a method, authority or path an
/// HTTP/1.1 request line cannot carry, is not.
pub fn h2_request_forwarded(
    req: &H2Request<'_>,
    fields: &Fields,
    rw: &RequestRewrite<'_>,
    body: BodyKind,
) -> bool {
    let limits = Limits::default();
    let path = if req.path.is_empty() { &b"/"[..] } else { req.path };
    let target: Vec<u8> =
        if rw.absolute { [&b"http://"[..], req.authority, path].concat() } else { path.to_vec() };
    let line = [req.method, b" ", &target, b" HTTP/1.1\r\nHost: ", req.authority, b"\r\n\r\n"];
    let reference = line.concat();
    let mut head = RequestHead::new();
    let usable = match parse_request(&reference, &limits, &mut head) {
        Ok(Some(())) if rw.absolute => matches!(head.target, Target::Absolute { .. }),
        Ok(Some(())) => matches!(head.target, Target::Origin { .. } | Target::Asterisk),
        _ => false,
    };
    // A URI's authority has no whitespace (the Host field would lose it at its ends).
    let blank = req.authority.iter().any(|&b| b == b' ' || b == b'\t');
    if !usable || blank || !h2_fields_valid(fields) || body == BodyKind::CloseDelimited {
        return false;
    }
    let mut out = Vec::new();
    let iter = || fields.iter().map(|(n, v)| (&n[..], &v[..]));
    write_h2_request(req, iter, rw, body, &mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let wider = Limits { max_head: 64 * 1024, max_headers: 256 };
    assert_eq!(parse_request(&out, &wider, &mut head), Ok(Some(())), "{text:?}");
    assert_eq!(head.len, out.len(), "{text:?}");
    assert_eq!(head.method_span.get(&out), req.method);
    assert_eq!(head.target_span.get(&out), &target[..]);
    assert_eq!(head.host.map(|h| h.get(&out)), Some(req.authority));
    assert_eq!(head.body, body, "{text:?}");
    let after = request_fields(&out, &head);
    let cookie = |f: &Fields| -> Fields {
        f.iter().filter(|(n, _)| n.eq_ignore_ascii_case(b"cookie")).cloned().collect()
    };
    let plain = |f: &Fields| -> Fields {
        let f: Fields = f
            .iter()
            .filter(|(n, _)| !n.eq_ignore_ascii_case(b"cookie") && !framing_lookalike(n))
            .cloned()
            .collect();
        kept(&f, &Vec::new())
    };
    assert_eq!(plain(&after), plain(fields), "{text:?}");
    let cookies: Vec<Vec<u8>> = cookie(fields).into_iter().map(|(_, v)| v).collect();
    let crumbs: Vec<&[u8]> = cookies.iter().map(|v| &v[..]).filter(|v| !v.is_empty()).collect();
    let joined = (!cookies.is_empty()).then(|| (b"cookie".to_vec(), crumbs.join(&b"; "[..])));
    assert_eq!(cookie(&after), joined.into_iter().collect::<Fields>(), "{text:?}");
    assert_unambiguous(&after, "request from HTTP/2");
    assert!(count(&after, b"content-length") <= 1);
    assert!(count(&after, b"max-forwards") <= 1);
    assert_eq!(count(&after, b"host"), 1);
    let last = |name: &[u8]| {
        after.iter().rev().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone())
    };
    if let Some(via) = rw.via {
        let mine = format!("2 {via}");
        assert!(last(b"via").is_some_and(|v| v.ends_with(mine.as_bytes())), "{text:?}");
    }
    if let Some(addr) = rw.forwarded_for {
        assert!(last(b"x-forwarded-for").is_some_and(|v| v.ends_with(addr.as_bytes())));
        assert!(last(b"forwarded").is_some_and(|v| v.starts_with(b"for=") || v.contains(&b',')));
    }
    let credentials = rw.proxy_authorization.map(<[u8]>::to_vec);
    assert_eq!(last(b"proxy-authorization"), credentials, "{text:?}");
    assert_eq!(count(&after, b"proxy-authorization"), usize::from(credentials.is_some()));
    true
}

/// The rewrite options and body framing of an HTTP/2 request, from one byte (as the
/// property test and the fuzz target `h2_request` take them).
pub fn h2_options(flags: u8, length: u64) -> (RequestRewrite<'static>, BodyKind) {
    let parent = flags & 4 != 0;
    let rw = RequestRewrite {
        via: (flags & 1 != 0).then_some("rustle"),
        forwarded_for: (flags & 2 != 0).then_some(if flags & 8 != 0 {
            "2001:db8::7"
        } else {
            "192.0.2.7"
        }),
        upgrade: false,
        absolute: parent,
        proxy_authorization: (parent && flags & 16 != 0).then_some(&b"Basic eDp5"[..]),
    };
    let body = match flags >> 5 & 3 {
        0 => BodyKind::None,
        1 => BodyKind::Chunked,
        _ => BodyKind::Length(length),
    };
    (rw, body)
}

/// The fields an HTTP/2 client gets for a response head ([`h2_response_fields`]): no
/// hop-by-hop or framing field, none a Connection field names, every other field as it
/// came and in order; one Content-Length with one number; with `via`, one Via field,
/// the proxy's element last.
pub fn h2_response_forwarded(buf: &[u8], head: &ResponseHead, via: Option<&str>) {
    let before = response_fields(buf, head);
    let mut scratch = Vec::new();
    let got: Fields = h2_response_fields(head, buf, via, &mut scratch)
        .map(|(n, v)| (n.to_vec(), v.to_vec()))
        .collect();
    for hop in [
        &b"connection"[..],
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"transfer-encoding",
        b"upgrade",
        b"trailer",
        b"proxy-authenticate",
    ] {
        assert_eq!(count(&got, hop), 0, "{}", String::from_utf8_lossy(hop));
    }
    let not_via = |f: &Fields| -> Fields {
        let f: Fields = f
            .iter()
            .filter(|(n, _)| via.is_none() || !n.eq_ignore_ascii_case(b"via"))
            .cloned()
            .collect();
        kept(&f, &before)
    };
    assert_eq!(not_via(&got), not_via(&before));
    assert!(count(&got, b"content-length") <= 1);
    if let BodyKind::Length(n) = head.body {
        let length = got.iter().find(|(name, _)| name.eq_ignore_ascii_case(b"content-length"));
        if let Some((_, v)) = length {
            let number = std::str::from_utf8(v).ok().and_then(|s| s.parse::<u64>().ok());
            assert_eq!(number, Some(n), "{:?}", String::from_utf8_lossy(v));
        }
    }
    if let Some(v) = via {
        assert_eq!(count(&got, b"via"), 1);
        let mine = format!("1.{} {v}", head.minor);
        let (name, value) = got.last().expect("a Via field");
        assert_eq!(name, b"via");
        assert!(value.ends_with(mine.as_bytes()));
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

/// The PROXY protocol parser on any bytes: no panic, the prefix contract for each
/// accepted version set, a header never longer than [`crate::proxy_protocol::MAX_HEADER`],
/// and what carries addresses re-writes to a header that parses back to them.
pub fn proxy_protocol_any(buf: &[u8]) {
    use crate::proxy_protocol::{self as pp, Accept, Addresses};
    for accept in [Accept::V1, Accept::V2, Accept::Any] {
        prefix_contract(buf, |b| pp::parse(b, accept));
    }
    if let Ok(Some((h, n))) = pp::parse(buf, Accept::Any) {
        assert!(n <= pp::MAX_HEADER && n <= buf.len());
        if let Addresses::Inet { src, dst, .. } = h.addresses {
            proxy_protocol_round_trip(src, dst, h.version);
        }
    }
}

/// Writing a header for `src`/`dst` then parsing it gives the same addresses back
/// (when both are of one family; otherwise the IPv4 one comes back IPv4-mapped).
pub fn proxy_protocol_round_trip(
    src: std::net::SocketAddr,
    dst: std::net::SocketAddr,
    version: crate::proxy_protocol::Version,
) {
    use crate::proxy_protocol::{self as pp, Accept, Addresses, Version};
    let mut out = Vec::new();
    match version {
        Version::V1 => pp::write_v1(Some((src, dst)), &mut out),
        Version::V2 => pp::write_v2(Some((src, dst)), &mut out),
    }
    let (h, n) = pp::parse(&out, Accept::Any).unwrap().unwrap();
    assert_eq!(n, out.len());
    assert_eq!(h.version, version);
    let Addresses::Inet { src: s, dst: d, datagram: false } = h.addresses else {
        panic!("{:?} from {out:02x?}", h.addresses)
    };
    if src.is_ipv4() == dst.is_ipv4() {
        assert_eq!((s, d), (src, dst));
    } else {
        assert_eq!((s.port(), d.port()), (src.port(), dst.port()));
        assert_eq!(s.ip().to_canonical(), src.ip().to_canonical());
        assert_eq!(d.ip().to_canonical(), dst.ip().to_canonical());
    }
    for i in 0..out.len() {
        assert_eq!(pp::parse(&out[..i], Accept::Any), Ok(None));
    }
}
