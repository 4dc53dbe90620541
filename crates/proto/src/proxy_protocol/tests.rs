//! PROXY protocol byte tables: the examples of haproxy's proxy-protocol.txt and the
//! refusals, every split point of every accepted header, and the writers.
#![allow(clippy::unwrap_used)]

use super::*;
use Error as E;

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn inet(src: &str, dst: &str, datagram: bool) -> Addresses {
    Addresses::Inet { src: sa(src), dst: sa(dst), datagram }
}

/// A complete header parses to `want`, consuming exactly its length; every strict
/// prefix is "need more"; the client's bytes after it are left alone.
fn check_ok(msg: &[u8], version: Version, want: Addresses) {
    let header = Header { version, addresses: want };
    for accept in [Accept::Any, if version == Version::V1 { Accept::V1 } else { Accept::V2 }] {
        assert_eq!(parse(msg, accept), Ok(Some((header, msg.len()))), "{msg:02x?}");
        for i in 0..msg.len() {
            assert_eq!(parse(&msg[..i], accept), Ok(None), "prefix {i} of {msg:02x?}");
        }
        let mut more = msg.to_vec();
        more.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(parse(&more, accept), Ok(Some((header, msg.len()))));
    }
}

fn check_err(msg: &[u8], accept: Accept, want: Error) {
    assert_eq!(parse(msg, accept), Err(want), "{:?}", String::from_utf8_lossy(msg));
}

#[test]
fn v1_accepted() {
    check_ok(
        b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n",
        Version::V1,
        inet("192.168.0.1:56324", "192.168.0.11:443", false),
    );
    check_ok(
        b"PROXY TCP6 2001:db8::1 ::1 0 65535\r\n",
        Version::V1,
        inet("[2001:db8::1]:0", "[::1]:65535", false),
    );
    check_ok(b"PROXY UNKNOWN\r\n", Version::V1, Addresses::Unknown);
    check_ok(
        b"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n",
        Version::V1,
        Addresses::Unknown,
    );
    // The longest line the specification allows: 107 bytes.
    let longest = b"PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n";
    assert_eq!(longest.len(), MAX_V1);
    check_ok(longest, Version::V1, Addresses::Unknown);
}

#[test]
fn v1_refused() {
    let a = Accept::Any;
    check_err(b"GET / HTTP/1.1\r\n", a, E::Missing);
    assert_eq!(parse(b"PROXY", Accept::V2), Ok(None));
    check_err(b"PROXY ", Accept::V2, E::VersionNotAccepted(1));
    check_err(b"PROXX ", a, E::Missing);
    check_err(b"PROXY TCP5 1.2.3.4 1.2.3.4 1 2\r\n", a, E::V1Protocol);
    check_err(b"PROXY tcp4 1.2.3.4 1.2.3.4 1 2\r\n", a, E::V1Protocol);
    check_err(b"PROXY \r\n", a, E::V1Protocol);
    check_err(b"PROXY TCP4 1.2.3.4 1.2.3.4 1\r\n", a, E::V1Syntax);
    check_err(b"PROXY TCP4 1.2.3.4 1.2.3.4 1 2 3\r\n", a, E::V1Syntax);
    check_err(b"PROXY TCP4  1.2.3.4 1.2.3.4 1 2\r\n", a, E::V1Syntax);
    check_err(b"PROXY TCP4 1.2.3.4 1.2.3.4 1 2 \r\n", a, E::V1Syntax);
    check_err(b"PROXY TCP4 ::1 1.2.3.4 1 2\r\n", a, E::V1Address);
    check_err(b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n", a, E::V1Address);
    check_err(b"PROXY TCP4 1.2.3.256 1.2.3.4 1 2\r\n", a, E::V1Address);
    check_err(b"PROXY TCP4 01.2.3.4 1.2.3.4 1 2\r\n", a, E::V1Address);
    check_err(b"PROXY TCP4 1.2.3.4 1.2.3.4 65536 2\r\n", a, E::V1Port);
    check_err(b"PROXY TCP4 1.2.3.4 1.2.3.4 01 2\r\n", a, E::V1Port);
    check_err(b"PROXY TCP4 1.2.3.4 1.2.3.4 +1 2\r\n", a, E::V1Port);
    check_err(b"PROXY TCP4 1.2.3.4 1.2.3.4 1 \r\n", a, E::V1Port);
    // A bare LF ends nothing: the line goes on until CRLF or 107 bytes.
    assert_eq!(parse(b"PROXY TCP4 1.2.3.4 1.2.3.4 1 2\n", a), Ok(None));
    let mut long = b"PROXY UNKNOWN ".to_vec();
    long.resize(MAX_V1, b'x');
    check_err(&long, a, E::V1TooLong);
    long.truncate(MAX_V1 - 1);
    assert_eq!(parse(&long, a), Ok(None));
}

fn v2(ver_cmd: u8, fam: u8, body: &[u8]) -> Vec<u8> {
    let mut v = SIGNATURE.to_vec();
    v.extend_from_slice(&[ver_cmd, fam]);
    v.extend_from_slice(&(body.len() as u16).to_be_bytes());
    v.extend_from_slice(body);
    v
}

const INET4: [u8; 12] = [192, 168, 0, 1, 192, 168, 0, 11, 0xdc, 0x04, 0x01, 0xbb];

#[test]
fn v2_accepted() {
    let want4 = inet("192.168.0.1:56324", "192.168.0.11:443", false);
    check_ok(&v2(0x21, 0x11, &INET4), Version::V2, want4);
    check_ok(
        &v2(0x21, 0x12, &INET4),
        Version::V2,
        inet("192.168.0.1:56324", "192.168.0.11:443", true),
    );
    let mut a6 = [0u8; 36];
    a6[0] = 0x20;
    a6[1] = 0x01;
    a6[15] = 1;
    a6[31] = 2;
    a6[32..36].copy_from_slice(&[0, 80, 0x1f, 0x90]);
    check_ok(&v2(0x21, 0x21, &a6), Version::V2, inet("[2001::1]:80", "[::2]:8080", false));
    // TLVs (NOOP padding, an ALPN, an empty one) are skipped.
    let mut with_tlvs = INET4.to_vec();
    with_tlvs.extend_from_slice(&[0x04, 0, 3, 0, 0, 0, 0x01, 0, 2, b'h', b'2', 0xe0, 0, 0]);
    check_ok(&v2(0x21, 0x11, &with_tlvs), Version::V2, want4);
    // LOCAL: whatever the family and the body, no addresses.
    check_ok(&v2(0x20, 0x00, &[]), Version::V2, Addresses::Local);
    check_ok(&v2(0x20, 0x11, &INET4), Version::V2, Addresses::Local);
    check_ok(&v2(0x20, 0xff, &[1, 2, 3]), Version::V2, Addresses::Local);
    // Unspecified and UNIX families: a proxied connection without IP addresses.
    check_ok(&v2(0x21, 0x00, &[]), Version::V2, Addresses::Unknown);
    check_ok(&v2(0x21, 0x31, &[0; 216]), Version::V2, Addresses::Unknown);
    // The largest accepted.
    let mut big = INET4.to_vec();
    big.extend_from_slice(&[0x04, 0x07, 0xf1]);
    big.resize(MAX_V2 - 16, 0);
    check_ok(&v2(0x21, 0x11, &big), Version::V2, want4);
}

#[test]
fn v2_refused() {
    let a = Accept::Any;
    check_err(&v2(0x21, 0x11, &INET4), Accept::V1, E::VersionNotAccepted(2));
    check_err(b"\r\n\r\n\0\r\nQUIT\r", a, E::Missing);
    check_err(&v2(0x11, 0x11, &INET4), a, E::V2Version(1));
    check_err(&v2(0x31, 0x11, &INET4), a, E::V2Version(3));
    check_err(&v2(0x22, 0x11, &INET4), a, E::V2Command(2));
    check_err(&v2(0x21, 0x13, &INET4), a, E::V2Family(0x13));
    check_err(&v2(0x21, 0x41, &INET4), a, E::V2Family(0x41));
    check_err(&v2(0x21, 0x10, &INET4), a, E::V2Family(0x10));
    check_err(&v2(0x21, 0x11, &INET4[..11]), a, E::V2ShortAddresses);
    check_err(&v2(0x21, 0x21, &INET4), a, E::V2ShortAddresses);
    check_err(&v2(0x21, 0x11, &[0; MAX_V2 - 15]), a, E::V2TooLong(MAX_V2 + 1));
    // The length alone is enough to refuse: no need to wait for the bytes.
    let mut head = v2(0x21, 0x11, &[]);
    head[14..16].copy_from_slice(&0xffffu16.to_be_bytes());
    check_err(&head, a, E::V2TooLong(16 + 0xffff));
    let mut tlv = INET4.to_vec();
    tlv.extend_from_slice(&[0x04, 0, 3, 0, 0]);
    check_err(&v2(0x21, 0x11, &tlv), a, E::V2Tlv);
    let mut tlv = INET4.to_vec();
    tlv.extend_from_slice(&[0x04, 0]);
    check_err(&v2(0x21, 0x11, &tlv), a, E::V2Tlv);
}

#[test]
fn writers() {
    let (s4, d4) = (sa("10.0.0.1:1234"), sa("10.0.0.2:80"));
    let (s6, d6) = (sa("[2001:db8::1]:1234"), sa("[::1]:80"));
    let mut out = Vec::new();
    write_v1(Some((s4, d4)), &mut out);
    assert_eq!(out, b"PROXY TCP4 10.0.0.1 10.0.0.2 1234 80\r\n");
    out.clear();
    write_v1(Some((s6, d6)), &mut out);
    assert_eq!(out, b"PROXY TCP6 2001:db8::1 ::1 1234 80\r\n");
    out.clear();
    write_v1(Some((s4, d6)), &mut out);
    assert_eq!(out, b"PROXY TCP6 ::ffff:10.0.0.1 ::1 1234 80\r\n");
    out.clear();
    write_v1(None, &mut out);
    assert_eq!(out, b"PROXY UNKNOWN\r\n");
    out.clear();
    write_v2(Some((s4, d4)), &mut out);
    assert_eq!(out, v2(0x21, 0x11, &[10, 0, 0, 1, 10, 0, 0, 2, 0x04, 0xd2, 0, 80]));
    out.clear();
    write_v2(None, &mut out);
    assert_eq!(out, v2(0x20, 0x00, &[]));
    out.clear();
    write_v2(Some((s6, d4)), &mut out);
    assert_eq!(
        parse(&out, Accept::V2).unwrap().unwrap().0.addresses,
        inet("[2001:db8::1]:1234", "[::ffff:10.0.0.2]:80", false)
    );
}
