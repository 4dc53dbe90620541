//! SOCKS5 client side byte tables: the greeting, method choices, credentials, auth
//! statuses, requests and replies; every split point of every accepted reply.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::addr::Domain;
use Error as E;

type Parsed<T> = Result<Option<(T, usize)>, Error>;

/// Bytes after a message (the tunnel's first bytes): never consumed.
const NEXT: &[u8] = b"\x16\x03\x01 tunnel bytes";

/// `msg` parses to `want` consuming all of it; every strict prefix is "need more"; bytes
/// after it are left alone.
fn check_ok<T: PartialEq + std::fmt::Debug + Clone>(
    parse: impl Fn(&[u8]) -> Parsed<T>,
    msg: &[u8],
    want: &T,
) {
    assert_eq!(parse(msg), Ok(Some((want.clone(), msg.len()))), "{msg:02x?}");
    for i in 0..msg.len() {
        assert_eq!(parse(&msg[..i]), Ok(None), "prefix {i} of {msg:02x?}");
    }
    let more = [msg, NEXT].concat();
    assert_eq!(parse(&more), Ok(Some((want.clone(), msg.len()))), "{msg:02x?} + next");
}

/// `msg` fails with `want`; each prefix is "need more" or that error already.
fn check_err<T: PartialEq + std::fmt::Debug>(
    parse: impl Fn(&[u8]) -> Parsed<T>,
    msg: &[u8],
    want: &Error,
) {
    assert_eq!(parse(msg), Err(want.clone()), "{msg:02x?}");
    for i in 0..msg.len() {
        let got = parse(&msg[..i]);
        assert!(got == Ok(None) || got == Err(want.clone()), "prefix {i} of {msg:02x?}: {got:?}");
    }
    assert_eq!(parse(&[msg, NEXT].concat()), Err(want.clone()), "{msg:02x?} + next");
}

fn addr(host: &str, port: u16) -> Address {
    let host = match host.parse() {
        Ok(ip) => Host::Ip(ip),
        Err(_) => Host::Domain(Domain::new(host.as_bytes()).unwrap()),
    };
    Address { host, port }
}

#[test]
fn greeting_bytes() {
    assert_eq!(greeting(false), b"\x05\x01\x00");
    assert_eq!(greeting(true), b"\x05\x02\x00\x02");
}

#[test]
fn method_choices() {
    let ok: &[(&[u8], bool, Choice)] = &[
        (b"\x05\x00", false, Choice::NoAuth),
        (b"\x05\x00", true, Choice::NoAuth),
        (b"\x05\x02", true, Choice::UserPass),
        (b"\x05\xff", false, Choice::NoneAcceptable),
        (b"\x05\xff", true, Choice::NoneAcceptable),
    ];
    for (msg, offered, want) in ok {
        check_ok(|b| parse_method(b, *offered), msg, want);
    }
    let err: &[(&[u8], bool, Error)] = &[
        (b"\x05\x02", false, E::UnexpectedMethod(2)),
        (b"\x05\x01", true, E::UnexpectedMethod(1)),
        (b"\x05\x80", true, E::UnexpectedMethod(0x80)),
        (b"\x04\x00", true, E::UnsupportedVersion(4)),
        (b"\x00\x5a", false, E::UnsupportedVersion(0)),
        (b"HTTP/1.1 400 Bad Request\r\n", false, E::UnsupportedVersion(b'H')),
    ];
    for (msg, offered, want) in err {
        check_err(|b| parse_method(b, *offered), msg, want);
    }
}

#[test]
fn credentials_bytes() {
    let mut out = b"prefix".to_vec();
    write_credentials(b"alice", b"secret", &mut out).unwrap();
    assert_eq!(out, b"prefix\x01\x05alice\x06secret");

    let long = [b'x'; 255];
    let mut out = Vec::new();
    write_credentials(&long, b"\x00\xff", &mut out).unwrap();
    assert_eq!(out, [&[1u8, 255][..], &long, b"\x02\x00\xff"].concat());
    // What the server side reads back.
    let (c, n) = crate::socks5::parse_credentials(&out).unwrap().unwrap();
    assert_eq!((c.user, c.password, n), (&long[..], &b"\x00\xff"[..], out.len()));

    let too_long = [b'x'; 256];
    let bad: &[(&[u8], &[u8], Error)] = &[
        (b"", b"p", E::EmptyUser),
        (b"u", b"", E::EmptyPassword),
        (&too_long, b"p", E::UserTooLong),
        (b"u", &too_long, E::PasswordTooLong),
    ];
    for (user, password, want) in bad {
        let mut out = b"prefix".to_vec();
        assert_eq!(write_credentials(user, password, &mut out), Err(want.clone()));
        assert_eq!(out, b"prefix", "nothing written on error");
    }
}

#[test]
fn auth_statuses() {
    check_ok(parse_auth_status, b"\x01\x00", &true);
    for status in [1u8, 2, 0x7f, 0xff] {
        check_ok(parse_auth_status, &[1, status], &false);
    }
    check_err(parse_auth_status, b"\x05\x00", &E::UnsupportedAuthVersion(5));
    check_err(parse_auth_status, b"\x00\x00", &E::UnsupportedAuthVersion(0));
}

#[test]
fn request_bytes() {
    let name255 = "n".repeat(255);
    let table: &[(Command, Address, Vec<u8>)] = &[
        (
            Command::Connect,
            addr("example.com", 443),
            b"\x05\x01\x00\x03\x0bexample.com\x01\xbb".to_vec(),
        ),
        (
            Command::Connect,
            addr("10.1.2.3", 80),
            b"\x05\x01\x00\x01\x0a\x01\x02\x03\x00\x50".to_vec(),
        ),
        (
            Command::Connect,
            addr("2001:db8::1", 8080),
            b"\x05\x01\x00\x04\x20\x01\x0d\xb8\0\0\0\0\0\0\0\0\0\0\0\x01\x1f\x90".to_vec(),
        ),
        (Command::UdpAssociate, addr("0.0.0.0", 0), b"\x05\x03\x00\x01\0\0\0\0\0\0".to_vec()),
        (
            Command::Bind,
            addr("1.2.3.4", 65535),
            b"\x05\x02\x00\x01\x01\x02\x03\x04\xff\xff".to_vec(),
        ),
        (
            Command::Connect,
            addr(&name255, 1),
            [&b"\x05\x01\x00\x03\xff"[..], name255.as_bytes(), b"\x00\x01"].concat(),
        ),
    ];
    for (command, dst, want) in table {
        let mut out = b"prefix".to_vec();
        write_request(*command, dst, &mut out);
        assert_eq!(&out[6..], &want[..], "{command:?} {dst}");
        assert!(out.len() - 6 <= MAX_REQUEST);
        // The server side of this crate reads the same request back.
        let back = crate::socks5::parse_request(&out[6..]).unwrap();
        let want = crate::socks5::Request { command: *command, dst: dst.clone() };
        assert_eq!(back, Some((want, out.len() - 6)));
    }
}

fn reply(code: u8, host: &str, port: u16) -> ServerReply {
    ServerReply { code, bound: addr(host, port) }
}

#[test]
fn replies() {
    let ok: &[(&str, &[u8], ServerReply)] = &[
        ("success ipv4", b"\x05\x00\x00\x01\x0a\x00\x00\x01\x04\x38", reply(0, "10.0.0.1", 1080)),
        ("unspecified", b"\x05\x00\x00\x01\0\0\0\0\0\0", reply(0, "0.0.0.0", 0)),
        (
            "success ipv6",
            b"\x05\x00\x00\x04\x20\x01\x0d\xb8\0\0\0\0\0\0\0\0\0\0\0\x01\x01\xbb",
            reply(0, "2001:db8::1", 443),
        ),
        ("success domain", b"\x05\x00\x00\x03\x05relay\x13\x88", reply(0, "relay", 5000)),
        ("general failure", b"\x05\x01\x00\x01\0\0\0\0\0\0", reply(1, "0.0.0.0", 0)),
        ("not allowed", b"\x05\x02\x00\x01\0\0\0\0\0\0", reply(2, "0.0.0.0", 0)),
        ("refused", b"\x05\x05\x00\x01\x7f\0\0\x01\0\x50", reply(5, "127.0.0.1", 80)),
        ("unassigned", b"\x05\x42\x00\x01\0\0\0\0\0\0", reply(0x42, "0.0.0.0", 0)),
    ];
    for (what, msg, want) in ok {
        check_ok(parse_reply, msg, want);
        assert_eq!(want.succeeded(), want.code == 0, "{what}");
    }
    let err: &[(&str, &[u8], Error)] = &[
        ("socks4 reply", b"\x00\x5a\x00\x50\x7f\x00\x00\x01", E::UnsupportedVersion(0)),
        ("version 4", b"\x04\x00\x00\x01\0\0\0\0\0\0", E::UnsupportedVersion(4)),
        ("http", b"HTTP/1.1 200 OK\r\n\r\n", E::UnsupportedVersion(b'H')),
        ("reserved", b"\x05\x00\x01\x01\0\0\0\0\0\0", E::NonZeroReserved),
        ("atyp 0", b"\x05\x00\x00\x00\0\0\0\0\0\0", E::UnsupportedAddressType(0)),
        ("atyp 2", b"\x05\x00\x00\x02\0\0\0\0\0\0", E::UnsupportedAddressType(2)),
        ("empty name", b"\x05\x00\x00\x03\x00\x00\x50", E::EmptyDomain),
        ("name with a space", b"\x05\x00\x00\x03\x03a b\x00\x50", E::InvalidDomain),
    ];
    for (what, msg, want) in err {
        check_err(parse_reply, msg, want);
        let text = want.to_string();
        assert!(!text.is_empty() && !text.contains('\n'), "{what}: {text}");
    }
}

#[test]
fn reply_reasons() {
    let table: &[(u8, Option<Reply>, &str)] = &[
        (0, Some(Reply::Succeeded), "succeeded"),
        (1, Some(Reply::GeneralFailure), "general SOCKS server failure"),
        (2, Some(Reply::NotAllowed), "connection not allowed by ruleset"),
        (3, Some(Reply::NetworkUnreachable), "network unreachable"),
        (4, Some(Reply::HostUnreachable), "host unreachable"),
        (5, Some(Reply::ConnectionRefused), "connection refused"),
        (6, Some(Reply::TtlExpired), "TTL expired"),
        (7, Some(Reply::CommandNotSupported), "command not supported"),
        (8, Some(Reply::AddressTypeNotSupported), "address type not supported"),
        (9, None, "unassigned reply code"),
        (0xff, None, "unassigned reply code"),
    ];
    for (code, named, reason) in table {
        let r = reply(*code, "0.0.0.0", 0);
        assert_eq!(r.reply(), *named, "{code}");
        assert_eq!(r.reason(), *reason, "{code}");
        if let Some(n) = named {
            assert_eq!(*n as u8, *code);
        }
    }
}

/// Every reply the server side writes reads back, however it is split.
#[test]
fn server_replies_read_back() {
    let codes = [Reply::Succeeded, Reply::ConnectionRefused, Reply::AddressTypeNotSupported];
    for code in codes {
        for bound in ["10.0.0.1:1080", "0.0.0.0:0", "[2001:db8::1]:443", "[::ffff:1.2.3.4]:80"] {
            let bound: std::net::SocketAddr = bound.parse().unwrap();
            let mut msg = Vec::new();
            crate::socks5::write_reply(code, bound, &mut msg);
            check_ok(parse_reply, &msg, &ServerReply { code: code as u8, bound: bound.into() });
        }
    }
}
