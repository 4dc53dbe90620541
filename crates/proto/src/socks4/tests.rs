//! SOCKS4/4a byte tables: accepted and rejected requests, the size caps,
//! every split point of every accepted request, replies, and a
//! deterministic mutation loop.
#![allow(clippy::unwrap_used)]

use super::*;
use Error as E;

type Parsed = Result<Option<(Request, usize)>, Error>;

/// Appended to messages: never consumed, never changes the outcome.
const NEXT: &[u8] = b"\x04\x01\x00\x50\x01\x02\x03\x04\x00 next";

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn req(command: Command, host: Host, port: u16, user_len: usize) -> Request {
    Request { command, dst: Address { host, port }, user_len }
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> Host {
    Host::Ip(IpAddr::V4(Ipv4Addr::new(a, b, c, d)))
}

fn domain(name: &[u8]) -> Host {
    Host::Domain(Domain::new(name).unwrap())
}

/// (what, message, request, user id).
fn ok_table() -> Vec<(&'static str, Vec<u8>, Request, Vec<u8>)> {
    let user255 = [b'u'; 255];
    let name255 = [b'd'; 255];
    vec![
        (
            "connect, no user",
            b"\x04\x01\x00\x50\x01\x02\x03\x04\x00".to_vec(),
            req(Command::Connect, v4(1, 2, 3, 4), 80, 0),
            vec![],
        ),
        (
            "bind with user",
            b"\x04\x02\x1f\x90\x0a\x00\x00\x01alice\x00".to_vec(),
            req(Command::Bind, v4(10, 0, 0, 1), 8080, 5),
            b"alice".to_vec(),
        ),
        (
            "binary user id",
            b"\x04\x01\xff\xff\x7f\x00\x00\x01 \xff\x01\n\x00".to_vec(),
            req(Command::Connect, v4(127, 0, 0, 1), 65535, 4),
            b" \xff\x01\n".to_vec(),
        ),
        (
            "255-byte user",
            cat(&[b"\x04\x01\x00\x50\x01\x02\x03\x04", &user255, b"\x00"]),
            req(Command::Connect, v4(1, 2, 3, 4), 80, 255),
            user255.to_vec(),
        ),
        (
            "0.0.0.0 is not 4a",
            b"\x04\x01\x00\x50\x00\x00\x00\x00\x00".to_vec(),
            req(Command::Connect, v4(0, 0, 0, 0), 80, 0),
            vec![],
        ),
        (
            "0.0.1.1 is not 4a",
            b"\x04\x01\x00\x50\x00\x00\x01\x01\x00".to_vec(),
            req(Command::Connect, v4(0, 0, 1, 1), 80, 0),
            vec![],
        ),
        (
            "4a",
            b"\x04\x01\x01\xbb\x00\x00\x00\x01bob\x00example.com\x00".to_vec(),
            req(Command::Connect, domain(b"example.com"), 443, 3),
            b"bob".to_vec(),
        ),
        (
            "4a, no user",
            b"\x04\x01\x00\x50\x00\x00\x00\xff\x00x\x00".to_vec(),
            req(Command::Connect, domain(b"x"), 80, 0),
            vec![],
        ),
        (
            "4a bind",
            b"\x04\x02\x00\x15\x00\x00\x00\x07\x00ftp.example\x00".to_vec(),
            req(Command::Bind, domain(b"ftp.example"), 21, 0),
            vec![],
        ),
        (
            "4a, both at max",
            cat(&[b"\x04\x01\x00\x50\x00\x00\x00\x01", &user255, b"\x00", &name255, b"\x00"]),
            req(Command::Connect, domain(&name255), 80, 255),
            user255.to_vec(),
        ),
    ]
}

fn err_table() -> Vec<(&'static str, Vec<u8>, Error)> {
    let long = [b'a'; 256];
    vec![
        ("socks5", b"\x05\x01\x00".to_vec(), E::UnsupportedVersion(5)),
        ("version 0", b"\x00\x01\x00\x50\x01\x02\x03\x04\x00".to_vec(), E::UnsupportedVersion(0)),
        ("http", b"GET / HTTP/1.0\r\n\r\n".to_vec(), E::UnsupportedVersion(b'G')),
        ("cd 0", b"\x04\x00\x00\x50\x01\x02\x03\x04\x00".to_vec(), E::UnsupportedCommand(0)),
        (
            "cd 3 (no udp in socks4)",
            b"\x04\x03\x00\x50\x01\x02\x03\x04\x00".to_vec(),
            E::UnsupportedCommand(3),
        ),
        (
            "cd is a reply code",
            b"\x04\x5a\x00\x50\x01\x02\x03\x04\x00".to_vec(),
            E::UnsupportedCommand(0x5a),
        ),
        (
            "user 256 bytes",
            cat(&[b"\x04\x01\x00\x50\x01\x02\x03\x04", &long, b"\x00"]),
            E::UserTooLong,
        ),
        (
            "4a user 256 bytes",
            cat(&[b"\x04\x01\x00\x50\x00\x00\x00\x01", &long, b"\x00x\x00"]),
            E::UserTooLong,
        ),
        (
            "4a domain 256 bytes",
            cat(&[b"\x04\x01\x00\x50\x00\x00\x00\x01u\x00", &long, b"\x00"]),
            E::DomainTooLong,
        ),
        (
            // A bad byte early in a domain too long to end: the bad byte is the verdict,
            // as it is for every prefix that holds it.
            "4a long domain with a space",
            cat(&[b"\x04\x01\x00\x50\x00\x00\x00\x01\x00a b", &long]),
            E::InvalidDomain,
        ),
        ("4a empty domain", b"\x04\x01\x00\x50\x00\x00\x00\x01u\x00\x00".to_vec(), E::EmptyDomain),
        (
            "4a no user, empty domain",
            b"\x04\x01\x00\x50\x00\x00\x00\x01\x00\x00".to_vec(),
            E::EmptyDomain,
        ),
        (
            "4a domain with space",
            b"\x04\x01\x00\x50\x00\x00\x00\x01\x00a b\x00".to_vec(),
            E::InvalidDomain,
        ),
        (
            "4a domain non-ascii",
            b"\x04\x01\x00\x50\x00\x00\x00\x01\x00\xc3\xa9\x00".to_vec(),
            E::InvalidDomain,
        ),
        (
            "4a domain with del",
            b"\x04\x01\x00\x50\x00\x00\x00\x01\x00a\x7f\x00".to_vec(),
            E::InvalidDomain,
        ),
        // Seen before the NUL arrives.
        (
            "4a bad byte in unfinished domain",
            b"\x04\x01\x00\x50\x00\x00\x00\x01\x00ab\r\n".to_vec(),
            E::InvalidDomain,
        ),
    ]
}

#[test]
fn request_ok() {
    for (what, msg, want, user) in ok_table() {
        assert_eq!(parse_request(&msg), Ok(Some((want.clone(), msg.len()))), "{what}");
        assert_eq!(want.user(&msg), &user[..], "{what}");
        assert_eq!(&msg[8..8 + want.user_len], &user[..], "{what}");
        for i in 0..msg.len() {
            assert_eq!(parse_request(&msg[..i]), Ok(None), "{what}: prefix {i}");
        }
        let more = cat(&[&msg, NEXT]);
        assert_eq!(parse_request(&more), Ok(Some((want, msg.len()))), "{what} + next");
    }
}

#[test]
fn request_err() {
    for (what, msg, want) in err_table() {
        assert_eq!(parse_request(&msg), Err(want.clone()), "{what}");
        assert_eq!(want.reply(), Reply::Rejected, "{what}");
        for i in 0..msg.len() {
            let got = parse_request(&msg[..i]);
            assert!(got == Ok(None) || got == Err(want.clone()), "{what}: prefix {i}: {got:?}");
        }
        let more = cat(&[&msg, NEXT]);
        assert_eq!(parse_request(&more), Err(want), "{what} + next");
    }
}

/// The caps are errors, not "need more", exactly when 256 bytes hold no NUL.
#[test]
fn caps() {
    let head = b"\x04\x01\x00\x50\x01\x02\x03\x04";
    let user = cat(&[head, &[b'u'; 255]]);
    assert_eq!(parse_request(&user), Ok(None));
    assert_eq!(parse_request(&cat(&[&user, b"u"])), Err(E::UserTooLong));

    let head4a = b"\x04\x01\x00\x50\x00\x00\x00\x01\x00";
    let name = cat(&[head4a, &[b'd'; 255]]);
    assert_eq!(parse_request(&name), Ok(None));
    assert_eq!(parse_request(&cat(&[&name, b"d"])), Err(E::DomainTooLong));
}

#[test]
fn user_with_wrong_buffer_is_empty() {
    let r = req(Command::Connect, v4(1, 2, 3, 4), 80, 5);
    assert_eq!(r.user(b"short"), b"");
}

#[test]
fn error_display() {
    let all = [
        E::UnsupportedVersion(5),
        E::UnsupportedCommand(3),
        E::UserTooLong,
        E::DomainTooLong,
        E::EmptyDomain,
        E::InvalidDomain,
    ];
    for e in all {
        assert_eq!(e.reply(), Reply::Rejected);
        let s = e.to_string();
        assert!(!s.is_empty() && !s.contains('\n'), "{e:?}");
    }
}

#[test]
fn reply_bytes() {
    let bound = |s: &str| Some(s.parse::<SocketAddrV4>().unwrap());
    let table: &[(Reply, Option<SocketAddrV4>, [u8; 8])] = &[
        (Reply::Granted, None, [0, 0x5a, 0, 0, 0, 0, 0, 0]),
        (Reply::Rejected, None, [0, 0x5b, 0, 0, 0, 0, 0, 0]),
        (Reply::IdentUnreachable, None, [0, 0x5c, 0, 0, 0, 0, 0, 0]),
        (Reply::IdentMismatch, None, [0, 0x5d, 0, 0, 0, 0, 0, 0]),
        (Reply::Granted, bound("10.0.0.1:1080"), [0, 0x5a, 0x04, 0x38, 10, 0, 0, 1]),
        (Reply::Granted, bound("255.254.253.252:65535"), [0, 0x5a, 0xff, 0xff, 255, 254, 253, 252]),
    ];
    for (r, b, want) in table {
        assert_eq!(reply(*r, *b), *want, "{r:?} {b:?}");
    }
}

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
        // NUL and the 4a marker bytes matter most here.
        const INTERESTING: &[u8] = &[0, 0, 0, 1, 2, 4, b'a', b' ', 0x7f, 0xff];
        if self.below(2) == 0 {
            INTERESTING[self.below(INTERESTING.len())]
        } else {
            self.next() as u8
        }
    }
}

#[test]
fn mutations_never_panic() {
    let mut seeds: Vec<Vec<u8>> = ok_table().into_iter().map(|r| r.1).collect();
    seeds.push(Vec::new());
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let (mut ok, mut need, mut err) = (0, 0, 0);
    for _ in 0..20_000 {
        let mut buf = seeds[rng.below(seeds.len())].clone();
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
                    let n = rng.below(600);
                    buf.extend((0..n).map(|_| rng.byte()));
                }
            }
        }
        let got: Parsed = parse_request(&buf);
        match got {
            Ok(Some((r, n))) => {
                assert!(n <= buf.len() && n <= 8 + 256 + 256, "{buf:?}");
                assert!(8 + r.user_len < n);
                assert_eq!(parse_request(&buf[..n]), Ok(Some((r, n))));
                assert_eq!(parse_request(&buf[..n - 1]), Ok(None));
                ok += 1;
            }
            Ok(None) => {
                // "Need more" is only ever said below the size cap.
                assert!(buf.len() < 8 + 256 + 256, "{buf:?}");
                need += 1;
            }
            Err(e) => {
                assert_eq!(e.reply(), Reply::Rejected);
                err += 1;
            }
        }
    }
    assert!(ok > 100 && need > 100 && err > 100, "ok {ok} need {need} err {err}");
}
