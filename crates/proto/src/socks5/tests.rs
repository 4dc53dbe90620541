//! SOCKS5 byte tables: accepted and rejected greetings, credentials,
//! requests and UDP headers; reply writers; every split point of every
//! accepted message; and a deterministic mutation loop.
#![allow(clippy::unwrap_used)]

use super::*;
use std::fmt::Debug;
use Error as E;

type Parsed<T> = Result<Option<(T, usize)>, Error>;

/// Trailing bytes appended to messages: never consumed, never change the
/// outcome.
const NEXT: &[u8] = b"\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x50 next message";

/// A complete message parses to `want`, consuming exactly its length; every
/// strict prefix is "need more"; bytes after it are left alone.
fn check_ok<T: PartialEq + Debug + Clone>(
    parse: impl Fn(&[u8]) -> Parsed<T>,
    msg: &[u8],
    want: &T,
) {
    assert_eq!(parse(msg), Ok(Some((want.clone(), msg.len()))), "{msg:?}");
    for i in 0..msg.len() {
        assert_eq!(parse(&msg[..i]), Ok(None), "prefix {i} of {msg:?}");
    }
    let mut more = msg.to_vec();
    more.extend_from_slice(NEXT);
    assert_eq!(parse(&more), Ok(Some((want.clone(), msg.len()))), "{msg:?} + next");
}

/// A malformed message fails with `want`; each prefix is either "need
/// more" or already that same error; more bytes do not change the error.
fn check_err<T: PartialEq + Debug>(parse: impl Fn(&[u8]) -> Parsed<T>, msg: &[u8], want: &Error) {
    assert_eq!(parse(msg), Err(want.clone()), "{msg:?}");
    for i in 0..msg.len() {
        let got = parse(&msg[..i]);
        assert!(got == Ok(None) || got == Err(want.clone()), "prefix {i} of {msg:?}: {got:?}");
    }
    let mut more = msg.to_vec();
    more.extend_from_slice(NEXT);
    assert_eq!(parse(&more), Err(want.clone()), "{msg:?} + next");
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn domain(name: &[u8]) -> Host {
    Host::Domain(Domain::new(name).unwrap())
}

fn ip(s: &str) -> Host {
    Host::Ip(s.parse().unwrap())
}

// ---------------------------------------------------------------- greeting

const G_NONE: Greeting = Greeting { no_auth: false, user_pass: false };
const G_NO_AUTH: Greeting = Greeting { no_auth: true, user_pass: false };
const G_USER_PASS: Greeting = Greeting { no_auth: false, user_pass: true };
const G_BOTH: Greeting = Greeting { no_auth: true, user_pass: true };

const GREETING_OK: &[(&str, &[u8], Greeting)] = &[
    ("no auth", b"\x05\x01\x00", G_NO_AUTH),
    ("user/pass", b"\x05\x01\x02", G_USER_PASS),
    ("both", b"\x05\x02\x00\x02", G_BOTH),
    ("both reversed", b"\x05\x02\x02\x00", G_BOTH),
    ("gssapi only", b"\x05\x01\x01", G_NONE),
    ("gssapi and no auth", b"\x05\x03\x01\x03\x00", G_NO_AUTH),
    ("ff is not a method", b"\x05\x01\xff", G_NONE),
    ("private method", b"\x05\x01\x80", G_NONE),
    ("duplicates", b"\x05\x03\x02\x02\x02", G_USER_PASS),
];

const GREETING_ERR: &[(&str, &[u8], Error)] = &[
    ("socks4", b"\x04\x01\x00\x50\x7f\x00\x00\x01\x00", E::UnsupportedVersion(4)),
    ("version 0", b"\x00\x01\x00", E::UnsupportedVersion(0)),
    ("tls", b"\x16\x03\x01", E::UnsupportedVersion(0x16)),
    ("http", b"GET / HTTP/1.1\r\n", E::UnsupportedVersion(b'G')),
    ("auth version byte", b"\x01\x01\x00", E::UnsupportedVersion(1)),
    ("no methods", b"\x05\x00", E::NoMethods),
    ("no methods, junk", b"\x05\x00\x00", E::NoMethods),
];

#[test]
fn greeting_ok() {
    for (what, msg, want) in GREETING_OK {
        assert_eq!(parse_greeting(msg).unwrap().unwrap().0, *want, "{what}");
        check_ok(parse_greeting, msg, want);
    }
}

#[test]
fn greeting_255_methods() {
    let mut msg = vec![5, 255];
    msg.extend((0..255u8).map(|i| 3 + i % 250)); // 3..=252: no known method
    check_ok(parse_greeting, &msg, &G_NONE);
    msg[256] = method::USER_PASS;
    check_ok(parse_greeting, &msg, &G_USER_PASS);
}

#[test]
fn greeting_err() {
    for (what, msg, want) in GREETING_ERR {
        assert_eq!(parse_greeting(msg), Err(want.clone()), "{what}");
        check_err(parse_greeting, msg, want);
    }
}

#[test]
fn method_selection_bytes() {
    assert_eq!(method_selection(method::NO_AUTH), [5, 0]);
    assert_eq!(method_selection(method::GSSAPI), [5, 1]);
    assert_eq!(method_selection(method::USER_PASS), [5, 2]);
    assert_eq!(method_selection(method::NONE_ACCEPTABLE), [5, 0xff]);
}

// ------------------------------------------------------------- credentials

/// Owned copy of credentials so the generic checks can compare them.
fn creds(buf: &[u8]) -> Parsed<(Vec<u8>, Vec<u8>)> {
    parse_credentials(buf).map(|r| r.map(|(c, n)| ((c.user.to_vec(), c.password.to_vec()), n)))
}

/// (what, message, user, password).
type CredentialsRow = (&'static str, &'static [u8], &'static [u8], &'static [u8]);

const CREDENTIALS_OK: &[CredentialsRow] = &[
    ("one byte each", b"\x01\x01u\x01p", b"u", b"p"),
    ("typical", b"\x01\x04user\x08pa55word", b"user", b"pa55word"),
    ("binary", b"\x01\x02\x00\xff\x03\x00\r\n", b"\x00\xff", b"\x00\r\n"),
    ("utf-8", b"\x01\x02\xc3\xa9\x01 ", b"\xc3\xa9", b" "),
];

const CREDENTIALS_ERR: &[(&str, &[u8], Error)] = &[
    ("socks version", b"\x05\x01u\x01p", E::UnsupportedAuthVersion(5)),
    ("version 0", b"\x00\x01u\x01p", E::UnsupportedAuthVersion(0)),
    ("version 2", b"\x02\x01u\x01p", E::UnsupportedAuthVersion(2)),
    ("empty user", b"\x01\x00\x01p", E::EmptyUser),
    ("empty user and password", b"\x01\x00\x00", E::EmptyUser),
    ("empty password", b"\x01\x01u\x00", E::EmptyPassword),
    ("empty password, long user", b"\x01\x04user\x00next", E::EmptyPassword),
];

#[test]
fn credentials_ok() {
    for (what, msg, user, password) in CREDENTIALS_OK {
        let (c, n) = parse_credentials(msg).unwrap().unwrap();
        assert_eq!((c.user, c.password, n), (*user, *password, msg.len()), "{what}");
        check_ok(creds, msg, &(user.to_vec(), password.to_vec()));
    }
}

#[test]
fn credentials_max_lengths() {
    let user = [b'u'; 255];
    let password = [b'p'; 255];
    let msg = cat(&[b"\x01\xff", &user, b"\xff", &password]);
    check_ok(creds, &msg, &(user.to_vec(), password.to_vec()));
}

#[test]
fn credentials_err() {
    for (what, msg, want) in CREDENTIALS_ERR {
        assert_eq!(parse_credentials(msg).map(|_| ()), Err(want.clone()), "{what}");
        check_err(creds, msg, want);
    }
}

#[test]
fn credentials_debug_hides_password() {
    let msg = b"\x01\x05alice\x0bhunter2-xyz";
    let (c, _) = parse_credentials(msg).unwrap().unwrap();
    let shown = format!("{c:?}");
    assert!(shown.contains("alice"), "{shown}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("11 bytes"), "{shown}");
    let pretty = format!("{c:#?}");
    assert!(!pretty.contains("hunter2"), "{pretty}");
}

#[test]
fn auth_status_bytes() {
    assert_eq!(auth_status(true), [1, 0]);
    assert_eq!(auth_status(false), [1, 1]);
}

// ----------------------------------------------------------------- request

const V6: &[u8] = b"\x20\x01\x0d\xb8\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01";

fn request_ok_table() -> Vec<(&'static str, Vec<u8>, Request)> {
    let req = |command, host, port| Request { command, dst: Address { host, port } };
    let long = [b'a'; 255];
    vec![
        (
            "connect ipv4",
            b"\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x50".to_vec(),
            req(Command::Connect, ip("127.0.0.1"), 80),
        ),
        (
            "bind ipv6",
            cat(&[b"\x05\x02\x00\x04", V6, b"\x01\xbb"]),
            req(Command::Bind, ip("2001:db8::1"), 443),
        ),
        (
            "udp associate unspecified",
            b"\x05\x03\x00\x01\x00\x00\x00\x00\x00\x00".to_vec(),
            req(Command::UdpAssociate, ip("0.0.0.0"), 0),
        ),
        (
            "connect domain",
            b"\x05\x01\x00\x03\x0bexample.com\x01\xbb".to_vec(),
            req(Command::Connect, domain(b"example.com"), 443),
        ),
        (
            "one-byte domain",
            b"\x05\x01\x00\x03\x01x\xff\xff".to_vec(),
            req(Command::Connect, domain(b"x"), 65535),
        ),
        (
            "ip literal as domain",
            b"\x05\x01\x00\x03\x071.2.3.4\x00\x16".to_vec(),
            req(Command::Connect, domain(b"1.2.3.4"), 22),
        ),
        (
            "255-byte domain",
            cat(&[b"\x05\x01\x00\x03\xff", &long, b"\x00\x50"]),
            req(Command::Connect, domain(&long), 80),
        ),
        (
            "ipv4-mapped ipv6 stays ipv6",
            cat(&[
                b"\x05\x01\x00\x04",
                b"\0\0\0\0\0\0\0\0\0\0\xff\xff\x01\x02\x03\x04",
                b"\x00\x50",
            ]),
            req(Command::Connect, ip("::ffff:1.2.3.4"), 80),
        ),
    ]
}

/// (what, message, error, reply the proxy sends).
const REQUEST_ERR: &[(&str, &[u8], Error, Reply)] = &[
    (
        "socks4",
        b"\x04\x01\x00\x50\x7f\x00\x00\x01\x00",
        E::UnsupportedVersion(4),
        Reply::GeneralFailure,
    ),
    (
        "version 0",
        b"\x00\x01\x00\x01\x7f\x00\x00\x01\x00\x50",
        E::UnsupportedVersion(0),
        Reply::GeneralFailure,
    ),
    (
        "cmd 0",
        b"\x05\x00\x00\x01\x7f\x00\x00\x01\x00\x50",
        E::UnsupportedCommand(0),
        Reply::CommandNotSupported,
    ),
    (
        "cmd 4",
        b"\x05\x04\x00\x01\x7f\x00\x00\x01\x00\x50",
        E::UnsupportedCommand(4),
        Reply::CommandNotSupported,
    ),
    (
        "cmd ff",
        b"\x05\xff\x00\x01\x7f\x00\x00\x01\x00\x50",
        E::UnsupportedCommand(0xff),
        Reply::CommandNotSupported,
    ),
    (
        "bad cmd wins over bad rsv",
        b"\x05\x09\x01\x09",
        E::UnsupportedCommand(9),
        Reply::CommandNotSupported,
    ),
    (
        "rsv 1",
        b"\x05\x01\x01\x01\x7f\x00\x00\x01\x00\x50",
        E::NonZeroReserved,
        Reply::GeneralFailure,
    ),
    (
        "rsv ff",
        b"\x05\x01\xff\x01\x7f\x00\x00\x01\x00\x50",
        E::NonZeroReserved,
        Reply::GeneralFailure,
    ),
    (
        "atyp 0",
        b"\x05\x01\x00\x00\x7f\x00\x00\x01\x00\x50",
        E::UnsupportedAddressType(0),
        Reply::AddressTypeNotSupported,
    ),
    (
        "atyp 2",
        b"\x05\x01\x00\x02\x7f\x00\x00\x01\x00\x50",
        E::UnsupportedAddressType(2),
        Reply::AddressTypeNotSupported,
    ),
    (
        "atyp 5",
        b"\x05\x01\x00\x05\x7f\x00\x00\x01\x00\x50",
        E::UnsupportedAddressType(5),
        Reply::AddressTypeNotSupported,
    ),
    (
        "atyp ff",
        b"\x05\x03\x00\xff",
        E::UnsupportedAddressType(0xff),
        Reply::AddressTypeNotSupported,
    ),
    ("empty domain", b"\x05\x01\x00\x03\x00\x00\x50", E::EmptyDomain, Reply::GeneralFailure),
    (
        "domain with space",
        b"\x05\x01\x00\x03\x03a b\x00\x50",
        E::InvalidDomain,
        Reply::GeneralFailure,
    ),
    (
        "domain with nul",
        b"\x05\x01\x00\x03\x02a\x00\x00\x50",
        E::InvalidDomain,
        Reply::GeneralFailure,
    ),
    (
        "domain with del",
        b"\x05\x01\x00\x03\x01\x7f\x00\x50",
        E::InvalidDomain,
        Reply::GeneralFailure,
    ),
    (
        "domain non-ascii",
        b"\x05\x01\x00\x03\x06\xc3\xa9.com\x00\x50",
        E::InvalidDomain,
        Reply::GeneralFailure,
    ),
    ("domain crlf", b"\x05\x01\x00\x03\x03a\r\n\x00\x50", E::InvalidDomain, Reply::GeneralFailure),
    // Seen before the name is complete: no waiting for the other 98 bytes.
    (
        "bad byte in unfinished domain",
        b"\x05\x01\x00\x03\x64ab\ncd",
        E::InvalidDomain,
        Reply::GeneralFailure,
    ),
];

#[test]
fn request_ok() {
    for (what, msg, want) in request_ok_table() {
        assert_eq!(parse_request(&msg).unwrap().unwrap().0, want, "{what}");
        check_ok(parse_request, &msg, &want);
    }
}

#[test]
fn request_err() {
    for (what, msg, want, reply) in REQUEST_ERR {
        assert_eq!(parse_request(msg), Err(want.clone()), "{what}");
        assert_eq!(want.reply(), *reply, "{what}");
        check_err(parse_request, msg, want);
    }
}

/// Every variant, its reply, and a non-empty one-line Display.
#[test]
fn error_replies() {
    let table = [
        (E::UnsupportedVersion(4), Reply::GeneralFailure),
        (E::NoMethods, Reply::GeneralFailure),
        (E::UnsupportedAuthVersion(5), Reply::GeneralFailure),
        (E::EmptyUser, Reply::GeneralFailure),
        (E::EmptyPassword, Reply::GeneralFailure),
        (E::UnsupportedCommand(9), Reply::CommandNotSupported),
        (E::NonZeroReserved, Reply::GeneralFailure),
        (E::UnsupportedAddressType(9), Reply::AddressTypeNotSupported),
        (E::EmptyDomain, Reply::GeneralFailure),
        (E::InvalidDomain, Reply::GeneralFailure),
        (E::Truncated, Reply::GeneralFailure),
    ];
    for (e, reply) in table {
        assert_eq!(e.reply(), reply, "{e:?}");
        let s = e.to_string();
        assert!(!s.is_empty() && !s.contains('\n'), "{e:?}");
    }
    assert_eq!(E::UnsupportedCommand(9).to_string(), "unsupported command 9");
}

// ------------------------------------------------------------------- reply

#[test]
fn reply_codes() {
    let table = [
        (Reply::Succeeded, 0u8),
        (Reply::GeneralFailure, 1),
        (Reply::NotAllowed, 2),
        (Reply::NetworkUnreachable, 3),
        (Reply::HostUnreachable, 4),
        (Reply::ConnectionRefused, 5),
        (Reply::TtlExpired, 6),
        (Reply::CommandNotSupported, 7),
        (Reply::AddressTypeNotSupported, 8),
    ];
    for (r, code) in table {
        assert_eq!(r as u8, code);
    }
}

#[test]
fn write_reply_bytes() {
    let table: &[(Reply, &str, &[u8])] = &[
        (Reply::Succeeded, "10.0.0.1:1080", b"\x05\x00\x00\x01\x0a\x00\x00\x01\x04\x38"),
        (Reply::GeneralFailure, "0.0.0.0:0", b"\x05\x01\x00\x01\x00\x00\x00\x00\x00\x00"),
        (Reply::CommandNotSupported, "0.0.0.0:0", b"\x05\x07\x00\x01\x00\x00\x00\x00\x00\x00"),
        (Reply::HostUnreachable, "[2001:db8::1]:443", b"\x05\x04\x00\x04\x20\x01\x0d\xb8\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x01\xbb"),
        (Reply::Succeeded, "[::ffff:1.2.3.4]:80", b"\x05\x00\x00\x04\0\0\0\0\0\0\0\0\0\0\xff\xff\x01\x02\x03\x04\x00\x50"),
    ];
    for (reply, bound, want) in table {
        let mut out = b"prefix".to_vec();
        write_reply(*reply, bound.parse().unwrap(), &mut out);
        assert_eq!(&out[..6], b"prefix", "appends");
        assert_eq!(&out[6..], *want, "{reply:?} {bound}");
        assert!(out.len() - 6 <= MAX_REPLY);
    }
}

// --------------------------------------------------------------------- udp

fn udp(host: Host, port: u16, frag: u8) -> UdpHeader {
    UdpHeader { frag, dst: Address { host, port } }
}

fn udp_ok_table() -> Vec<(&'static str, Vec<u8>, UdpHeader)> {
    let long = [b'z'; 255];
    vec![
        ("ipv4", b"\x00\x00\x00\x01\x01\x02\x03\x04\x00\x35".to_vec(), udp(ip("1.2.3.4"), 53, 0)),
        ("ipv6", cat(&[b"\x00\x00\x00\x04", V6, b"\x00\x35"]), udp(ip("2001:db8::1"), 53, 0)),
        ("domain", b"\x00\x00\x00\x03\x07dns.com\x00\x35".to_vec(), udp(domain(b"dns.com"), 53, 0)),
        (
            "255-byte domain",
            cat(&[b"\x00\x00\x00\x03\xff", &long, b"\x00\x35"]),
            udp(domain(&long), 53, 0),
        ),
        (
            "frag is reported, not judged",
            b"\x00\x00\x81\x01\x01\x02\x03\x04\x00\x35".to_vec(),
            udp(ip("1.2.3.4"), 53, 0x81),
        ),
    ]
}

const UDP_ERR: &[(&str, &[u8], Error)] = &[
    ("empty", b"", E::Truncated),
    ("rsv only", b"\x00\x00", E::Truncated),
    ("no atyp", b"\x00\x00\x00", E::Truncated),
    ("short ipv4", b"\x00\x00\x00\x01\x01\x02\x03", E::Truncated),
    ("no port", b"\x00\x00\x00\x01\x01\x02\x03\x04", E::Truncated),
    ("half port", b"\x00\x00\x00\x01\x01\x02\x03\x04\x00", E::Truncated),
    ("short ipv6", b"\x00\x00\x00\x04\x20\x01\x0d\xb8", E::Truncated),
    ("no domain length", b"\x00\x00\x00\x03", E::Truncated),
    ("short domain", b"\x00\x00\x00\x03\x05abc", E::Truncated),
    ("rsv first byte", b"\x01\x00\x00\x01\x01\x02\x03\x04\x00\x35data", E::NonZeroReserved),
    ("rsv second byte", b"\x00\x01\x00\x01\x01\x02\x03\x04\x00\x35data", E::NonZeroReserved),
    ("rsv before truncation", b"\x00\x01\x00", E::NonZeroReserved),
    ("socks request", b"\x05\x01\x00\x01\x01\x02\x03\x04\x00\x35", E::NonZeroReserved),
    ("atyp 0", b"\x00\x00\x00\x00\x01\x02\x03\x04\x00\x35", E::UnsupportedAddressType(0)),
    ("atyp 2", b"\x00\x00\x00\x02\x01\x02\x03\x04\x00\x35", E::UnsupportedAddressType(2)),
    ("empty domain", b"\x00\x00\x00\x03\x00\x00\x35data", E::EmptyDomain),
    ("bad domain", b"\x00\x00\x00\x03\x03a b\x00\x35data", E::InvalidDomain),
    ("bad byte in truncated domain", b"\x00\x00\x00\x03\x09a\x00", E::InvalidDomain),
];

#[test]
fn udp_ok() {
    for (what, header, want) in udp_ok_table() {
        for data in [&b""[..], b"payload", b"\x00\x00\x00\x01"] {
            let dgram = cat(&[&header, data]);
            assert_eq!(parse_udp(&dgram), Ok((want.clone(), header.len())), "{what} {data:?}");
        }
        // Every cut inside the header is an error, never a panic or a
        // short header.
        for i in 0..header.len() {
            assert_eq!(parse_udp(&header[..i]), Err(E::Truncated), "{what} cut at {i}");
        }
    }
}

#[test]
fn udp_err() {
    for (what, dgram, want) in UDP_ERR {
        assert_eq!(parse_udp(dgram), Err(want.clone()), "{what}");
    }
}

#[test]
fn udp_header_round_trip() {
    let table: &[(&str, &[u8])] = &[
        ("8.8.8.8:53", b"\x00\x00\x00\x01\x08\x08\x08\x08\x00\x35"),
        ("[2001:db8::1]:443", b"\x00\x00\x00\x04\x20\x01\x0d\xb8\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x01\xbb"),
        ("0.0.0.0:0", b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00"),
    ];
    for (from, want) in table {
        let from: SocketAddr = from.parse().unwrap();
        let mut out = Vec::new();
        write_udp_header(from, &mut out);
        assert_eq!(out, *want, "{from}");
        assert!(out.len() <= MAX_UDP_HEADER);
        let hlen = out.len();
        out.extend_from_slice(b"reply data");
        let (h, off) = parse_udp(&out).unwrap();
        assert_eq!((h, off), (UdpHeader { frag: 0, dst: Address::from(from) }, hlen));
        assert_eq!(&out[off..], b"reply data");
    }
}

// ---------------------------------------------------------------- mutation

/// xorshift64*: deterministic, no dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn byte(&mut self) -> u8 {
        // Favour the values that mean something in these formats.
        const INTERESTING: &[u8] = &[0, 1, 2, 3, 4, 5, 0x7f, 0x80, 0xfe, 0xff];
        if self.below(2) == 0 {
            INTERESTING[self.below(INTERESTING.len())]
        } else {
            self.next() as u8
        }
    }
}

fn mutate(rng: &mut Rng, buf: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        match rng.below(5) {
            0 if !buf.is_empty() => {
                let i = rng.below(buf.len());
                buf[i] = rng.byte();
            }
            1 if !buf.is_empty() => buf.truncate(rng.below(buf.len())),
            2 => {
                let i = rng.below(buf.len() + 1);
                buf.insert(i, rng.byte());
            }
            3 if !buf.is_empty() => {
                buf.remove(rng.below(buf.len()));
            }
            _ => {
                let n = rng.below(300);
                buf.extend((0..n).map(|_| rng.byte()));
            }
        }
    }
}

/// Shared invariants of the handshake parsers: a success consumes at most
/// the buffer, re-parsing exactly the consumed bytes gives the same value,
/// and an error maps to a reply and a Display.
fn check_parser<T: PartialEq + Debug>(parse: impl Fn(&[u8]) -> Parsed<T>, buf: &[u8]) {
    match parse(buf) {
        Ok(Some((v, n))) => {
            assert!(n > 0 && n <= buf.len(), "{buf:?}");
            assert_eq!(parse(&buf[..n]), Ok(Some((v, n))), "{buf:?}");
            assert_eq!(parse(&buf[..n - 1]), Ok(None), "{buf:?}");
        }
        Ok(None) => {}
        Err(e) => {
            let _ = e.reply();
            assert!(!e.to_string().is_empty());
        }
    }
}

#[test]
fn mutations_never_panic() {
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    seeds.extend(GREETING_OK.iter().map(|r| r.1.to_vec()));
    seeds.extend(CREDENTIALS_OK.iter().map(|r| r.1.to_vec()));
    seeds.extend(request_ok_table().into_iter().map(|r| r.1));
    seeds.extend(udp_ok_table().into_iter().map(|r| r.1));
    seeds.push(Vec::new());
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut ok, mut err) = (0, 0);
    for _ in 0..20_000 {
        let mut buf = seeds[rng.below(seeds.len())].clone();
        mutate(&mut rng, &mut buf);
        check_parser(parse_greeting, &buf);
        check_parser(creds, &buf);
        check_parser(parse_request, &buf);
        match parse_udp(&buf) {
            Ok((h, off)) => {
                assert!(off <= buf.len());
                assert_eq!(parse_udp(&buf[..off]), Ok((h, off)));
                ok += 1;
            }
            Err(e) => {
                let _ = e.reply();
                err += 1;
            }
        }
    }
    // The loop reaches both outcomes, so it is not just exercising one
    // early return.
    assert!(ok > 100 && err > 100, "ok {ok} err {err}");
}
