//! SOCKS4/4a client side byte tables: CONNECT requests (IPv4, 4a names, user ids),
//! what cannot be written, replies and every split point of each.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::addr::Domain;
use crate::socks4::{parse_request, reply, Command, Request};
use Error as E;

fn addr(host: &str, port: u16) -> Address {
    let host = match host.parse() {
        Ok(ip) => Host::Ip(ip),
        Err(_) => Host::Domain(Domain::new(host.as_bytes()).unwrap()),
    };
    Address { host, port }
}

#[test]
fn connect_bytes() {
    let name255 = "d".repeat(255);
    let user255 = [b'u'; 255];
    let table: &[(Address, &[u8], Vec<u8>)] = &[
        (addr("1.2.3.4", 80), b"", b"\x04\x01\x00\x50\x01\x02\x03\x04\x00".to_vec()),
        (addr("10.0.0.1", 8080), b"alice", b"\x04\x01\x1f\x90\x0a\x00\x00\x01alice\x00".to_vec()),
        (
            addr("example.com", 443),
            b"",
            b"\x04\x01\x01\xbb\x00\x00\x00\x01\x00example.com\x00".to_vec(),
        ),
        (
            addr("example.com", 443),
            b"bob",
            b"\x04\x01\x01\xbb\x00\x00\x00\x01bob\x00example.com\x00".to_vec(),
        ),
        (
            addr(&name255, 1),
            &user255,
            [
                &b"\x04\x01\x00\x01\x00\x00\x00\x01"[..],
                &user255,
                b"\x00",
                name255.as_bytes(),
                b"\x00",
            ]
            .concat(),
        ),
    ];
    for (dst, user, want) in table {
        let mut out = b"prefix".to_vec();
        write_connect(dst, user, &mut out).unwrap();
        let msg = &out[6..];
        assert_eq!(msg, &want[..], "{dst}");
        assert!(msg.len() <= MAX_REQUEST);
        // The server side of this crate reads the same request back.
        let want = Request { command: Command::Connect, dst: dst.clone(), user_len: user.len() };
        let (got, n) = parse_request(msg).unwrap().unwrap();
        assert_eq!((&got, n), (&want, msg.len()));
        assert_eq!(got.user(msg), *user);
    }
}

#[test]
fn connect_errors() {
    let too_long = [b'u'; 256];
    let table: &[(Address, &[u8], Error)] = &[
        (addr("2001:db8::1", 443), b"", E::Ipv6Target),
        (addr("::ffff:1.2.3.4", 443), b"", E::Ipv6Target),
        (addr("1.2.3.4", 80), b"a\x00b", E::NulInUser),
        (addr("example.com", 80), &too_long, E::UserTooLong),
    ];
    for (dst, user, want) in table {
        let mut out = b"prefix".to_vec();
        assert_eq!(write_connect(dst, user, &mut out), Err(want.clone()), "{dst}");
        assert_eq!(out, b"prefix", "nothing written on error");
        let text = want.to_string();
        assert!(!text.is_empty() && !text.contains('\n'));
    }
}

/// (message, code, bound, granted, named, reason).
type ReplyRow = (&'static [u8], u8, &'static str, bool, Option<Reply>, &'static str);

#[test]
fn replies() {
    let table: &[ReplyRow] = &[
        (
            b"\x00\x5a\x00\x00\x00\x00\x00\x00",
            0x5a,
            "0.0.0.0:0",
            true,
            Some(Reply::Granted),
            "request granted",
        ),
        (
            b"\x00\x5a\x04\x38\x0a\x00\x00\x01",
            0x5a,
            "10.0.0.1:1080",
            true,
            Some(Reply::Granted),
            "request granted",
        ),
        (
            b"\x00\x5b\x00\x00\x00\x00\x00\x00",
            0x5b,
            "0.0.0.0:0",
            false,
            Some(Reply::Rejected),
            "request rejected or failed",
        ),
        (
            b"\x00\x5c\x00\x00\x00\x00\x00\x00",
            0x5c,
            "0.0.0.0:0",
            false,
            Some(Reply::IdentUnreachable),
            "rejected: the server cannot reach the client's identd",
        ),
        (
            b"\x00\x5d\x00\x00\x00\x00\x00\x00",
            0x5d,
            "0.0.0.0:0",
            false,
            Some(Reply::IdentMismatch),
            "rejected: identd reported a different user id",
        ),
        (b"\x00\x00\x00\x00\x00\x00\x00\x00", 0, "0.0.0.0:0", false, None, "unassigned reply code"),
    ];
    for (msg, code, bound, granted, named, reason) in table {
        let want = ServerReply { code: *code, bound: bound.parse().unwrap() };
        assert_eq!(parse_reply(msg), Ok(Some((want, 8))), "{msg:02x?}");
        for i in 0..msg.len() {
            assert_eq!(parse_reply(&msg[..i]), Ok(None), "prefix {i} of {msg:02x?}");
        }
        let more = [*msg, b"tunnel bytes"].concat();
        assert_eq!(parse_reply(&more), Ok(Some((want, 8))));
        assert_eq!(want.granted(), *granted);
        assert_eq!(want.reply(), *named);
        assert_eq!(want.reason(), *reason);
    }
}

#[test]
fn reply_errors() {
    let table: &[(&[u8], Error)] = &[
        (b"\x04\x5a\x00\x00\x00\x00\x00\x00", E::UnsupportedReplyVersion(4)),
        (b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00", E::UnsupportedReplyVersion(5)),
        (b"HTTP/1.1 400 Bad Request\r\n", E::UnsupportedReplyVersion(b'H')),
    ];
    for (msg, want) in table {
        assert_eq!(parse_reply(msg), Err(want.clone()));
        for i in 1..msg.len() {
            assert_eq!(parse_reply(&msg[..i]), Err(want.clone()), "prefix {i}");
        }
    }
}

/// Every reply the server side writes reads back.
#[test]
fn server_replies_read_back() {
    for r in [Reply::Granted, Reply::Rejected, Reply::IdentUnreachable, Reply::IdentMismatch] {
        for bound in [None, Some("10.0.0.1:1080".parse().unwrap())] {
            let msg = reply(r, bound);
            let want = ServerReply {
                code: r as u8,
                bound: bound.unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)),
            };
            assert_eq!(parse_reply(&msg), Ok(Some((want, 8))));
        }
    }
}
