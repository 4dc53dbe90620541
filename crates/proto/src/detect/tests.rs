//! Detection table: every first byte, and the TLS two-byte rule.
#![allow(clippy::unwrap_used)]

use super::*;
use Protocol as P;

type Detected = Result<Option<Protocol>, UnknownProtocol>;

const TABLE: &[(&[u8], Detected)] = &[
    (b"", Ok(None)),
    (b"\x16", Ok(None)),
    (b"\x16\x03", Ok(Some(P::Tls))),
    (b"\x16\x03\x01\x02\x00", Ok(Some(P::Tls))),
    (b"\x16\x03\x03", Ok(Some(P::Tls))),
    (b"\x16\x02", Err(UnknownProtocol)),
    (b"\x16\x00", Err(UnknownProtocol)),
    (b"\x16\x16", Err(UnknownProtocol)),
    (b"\x04", Ok(Some(P::Socks4))),
    (b"\x04\x01\x00\x50", Ok(Some(P::Socks4))),
    (b"\x05", Ok(Some(P::Socks5))),
    (b"\x05\x01\x00", Ok(Some(P::Socks5))),
    (b"G", Ok(Some(P::Http))),
    (b"GET / HTTP/1.1\r\n", Ok(Some(P::Http))),
    (b"CONNECT a:443 HTTP/1.1\r\n", Ok(Some(P::Http))),
    (b"POST", Ok(Some(P::Http))),
    (b"A", Ok(Some(P::Http))),
    (b"Z", Ok(Some(P::Http))),
    (b"get / HTTP/1.1", Err(UnknownProtocol)),
    (b"\r\nGET", Err(UnknownProtocol)),
    (b" GET", Err(UnknownProtocol)),
    (b"\x00", Err(UnknownProtocol)),
    (b"\x03", Err(UnknownProtocol)),
    (b"\x06", Err(UnknownProtocol)),
    (b"\x15\x03", Err(UnknownProtocol)),
    (b"\x17\x03", Err(UnknownProtocol)),
    (b"\x80", Err(UnknownProtocol)),
    (b"\xff", Err(UnknownProtocol)),
];

#[test]
fn table() {
    for (input, want) in TABLE {
        assert_eq!(detect(input), *want, "{input:?}");
    }
}

#[test]
fn every_first_byte() {
    for b in 0..=255u8 {
        let got = detect(&[b]);
        let want = match b {
            0x16 => Ok(None),
            4 => Ok(Some(P::Socks4)),
            5 => Ok(Some(P::Socks5)),
            b'A'..=b'Z' => Ok(Some(P::Http)),
            _ => Err(UnknownProtocol),
        };
        assert_eq!(got, want, "{b:#04x}");
        // A decision made on one byte never changes with more bytes.
        if let Ok(Some(p)) = want {
            for next in 0..=255u8 {
                assert_eq!(detect(&[b, next]), Ok(Some(p)));
            }
        }
    }
    for next in 0..=255u8 {
        let want = if next == 3 { Ok(Some(P::Tls)) } else { Err(UnknownProtocol) };
        assert_eq!(detect(&[0x16, next]), want, "0x16 {next:#04x}");
    }
}

#[test]
fn display() {
    assert_eq!(UnknownProtocol.to_string(), "unknown protocol");
}

#[test]
fn h2_preface() {
    assert!(is_h2_preface(H2_PREFACE));
    assert!(is_h2_preface(b"PRI * HTTP/2.0\r\n"));
    assert!(is_h2_preface(&[H2_PREFACE, b"\0\0\0\x04"].concat()));
    assert!(!is_h2_preface(b"PRI"));
    assert!(!is_h2_preface(b"GET / HTTP/1.1\r\n"));
    assert!(!is_h2_preface(b"PRI * HTTP/1.1\r\n"));
}
