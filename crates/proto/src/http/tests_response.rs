//! Response parser tests: body-length rules (RFC 9112 6.3) and the same
//! framing strictness as requests.
#![allow(clippy::unwrap_used)]

use super::*;
use HeadError as E;

fn parse(buf: &[u8], method: Method) -> Result<Option<ResponseHead>, HeadError> {
    let mut head = ResponseHead::new();
    parse_response(buf, &Limits::default(), method, &mut head).map(|r| r.map(|()| head))
}

fn ok(buf: &[u8], method: Method) -> ResponseHead {
    match parse(buf, method) {
        Ok(Some(h)) => h,
        other => panic!("{:?}: {other:?}", String::from_utf8_lossy(buf)),
    }
}

const REJECT: &[(&str, &[u8], HeadError)] = &[
    (
        "cl and te",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        E::ContentLengthAndTransferEncoding,
    ),
    (
        "cl and te on head response",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
        E::ContentLengthAndTransferEncoding,
    ),
    (
        "cl conflicting fields",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 50\r\n\r\n",
        E::ConflictingContentLength,
    ),
    (
        "cl conflicting list",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5,50\r\n\r\n",
        E::ConflictingContentLength,
    ),
    ("cl letters", b"HTTP/1.1 200 OK\r\nContent-Length: five\r\n\r\n", E::InvalidContentLength),
    ("cl empty", b"HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n", E::InvalidContentLength),
    (
        "cl too large",
        b"HTTP/1.1 200 OK\r\nContent-Length: 9007199254740992\r\n\r\n",
        E::ContentLengthTooLarge,
    ),
    (
        "cl overflow",
        b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
        E::InvalidContentLength,
    ),
    ("te not chunked", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", E::NotChunked),
    (
        "te chunked then gzip",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        E::NotChunked,
    ),
    (
        "te chunked twice",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        E::ChunkedTwice,
    ),
    (
        "te malformed",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: , chunked\r\n\r\n",
        E::InvalidTransferEncoding,
    ),
    (
        "te in http/1.0",
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        E::TransferEncodingHttp10,
    ),
    ("obs-fold", b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", E::ObsFold),
    ("space before first field", b"HTTP/1.1 200 OK\r\n\tX: a\r\n\r\n", E::ObsFold),
    ("bare cr", b"HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n", E::BareCr),
    ("bare cr status line", b"HTTP/1.1 200 OK\r\rX: a\r\n\r\n", E::BareCr),
    ("bare lf status line", b"HTTP/1.1 200 OK\nX: a\r\n\r\n", E::BareLf),
    ("bare lf final", b"HTTP/1.1 200 OK\r\nX: a\r\n\n", E::BareLf),
    ("bare lf everywhere", b"HTTP/1.1 200 OK\nContent-Length: 0\n\n", E::BareLf),
    (
        "space before colon",
        b"HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\n",
        E::WhitespaceBeforeColon,
    ),
    ("bad field name", b"HTTP/1.1 200 OK\r\nX\"Y: 5\r\n\r\n", E::InvalidHeaderName),
    ("nul in value", b"HTTP/1.1 200 OK\r\nX: \0\r\n\r\n", E::InvalidHeaderValue),
    ("status below 100", b"HTTP/1.1 099 Odd\r\n\r\n", E::InvalidStatus),
    ("status zero", b"HTTP/1.1 000 Odd\r\n\r\n", E::InvalidStatus),
    ("status four digits", b"HTTP/1.1 2000 OK\r\n\r\n", E::InvalidStatus),
    ("status two digits", b"HTTP/1.1 20 OK\r\n\r\n", E::InvalidStatus),
    ("status letters", b"HTTP/1.1 2x0 OK\r\n\r\n", E::InvalidStatus),
    ("status no space", b"HTTP/1.1 200OK\r\n\r\n", E::InvalidStatus),
    ("status double space", b"HTTP/1.1  200 OK\r\n\r\n", E::InvalidStatus),
    ("version 2", b"HTTP/2.0 200 OK\r\n\r\n", E::UnsupportedVersion),
    ("version 1.2", b"HTTP/1.2 200 OK\r\n\r\n", E::UnsupportedVersion),
    ("version garbage", b"HTTZ/1.1 200 OK\r\n\r\n", E::InvalidVersion),
    ("not http", b"SSH-2.0-OpenSSH_9.6\r\n\r\n", E::InvalidVersion),
    (
        "connection names te",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: Transfer-Encoding\r\n\r\n",
        E::ConnectionNamesFraming,
    ),
];

#[test]
fn rejections() {
    for (what, buf, want) in REJECT {
        let got = parse(buf, Method::Get);
        assert_eq!(got.as_ref().err(), Some(want), "{what}: {got:?}");
    }
}

#[test]
fn framing_still_checked_for_bodiless_responses() {
    let b = b"HTTP/1.1 304 Not Modified\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
    assert_eq!(parse(b, Method::Get).err(), Some(E::ConflictingContentLength));
    let b = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n";
    assert_eq!(parse(b, Method::Head).err(), Some(E::NotChunked));
}

#[test]
fn body_rules() {
    use BodyKind::*;
    let rows: &[(&[u8], Method, BodyKind)] = &[
        (b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", Method::Get, Length(12)),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 12, 12\r\n\r\n", Method::Get, Length(12)),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", Method::Get, Chunked),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n", Method::Post, Chunked),
        (b"HTTP/1.1 200 OK\r\n\r\n", Method::Get, CloseDelimited),
        (b"HTTP/1.0 200 OK\r\n\r\n", Method::Get, CloseDelimited),
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", Method::Get, Length(0)),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", Method::Head, None),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", Method::Head, None),
        (b"HTTP/1.1 100 Continue\r\n\r\n", Method::Post, None),
        (b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", Method::Get, None),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n", Method::Get, None),
        (b"HTTP/1.1 204 No Content\r\n\r\n", Method::Get, None),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 100\r\n\r\n", Method::Get, None),
        (b"HTTP/1.1 200 Connection established\r\n\r\n", Method::Connect, None),
        // Framing fields of a 2xx to CONNECT are ignored, even broken ones.
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\nTransfer-Encoding: gzip\r\n\r\n", Method::Connect, None),
        (b"HTTP/1.1 407 Proxy Auth\r\nContent-Length: 3\r\n\r\n", Method::Connect, Length(3)),
        (b"HTTP/1.1 502 Bad Gateway\r\n\r\n", Method::Connect, CloseDelimited),
        (b"HTTP/1.1 999 Whatever\r\nContent-Length: 1\r\n\r\n", Method::Get, Length(1)),
    ];
    for (buf, method, want) in rows {
        let h = ok(buf, *method);
        assert_eq!(h.body, *want, "{:?} {method:?}", String::from_utf8_lossy(buf));
        assert_eq!(h.len, buf.len());
    }
}

#[test]
fn keep_alive_rules() {
    let rows: &[(&[u8], bool)] = &[
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", true),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", false),
        (b"HTTP/1.1 200 OK\r\n\r\n", false),
        (b"HTTP/1.1 204 No Content\r\n\r\n", true),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", false),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n", true),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n", false),
    ];
    for (buf, want) in rows {
        let h = ok(buf, Method::Get);
        assert_eq!(h.keep_alive(), *want, "{:?}", String::from_utf8_lossy(buf));
    }
}

#[test]
fn status_line_pieces() {
    let rows: &[(&[u8], u16, u8, &[u8])] = &[
        (b"HTTP/1.1 200 OK\r\n\r\n", 200, 1, b"OK"),
        (b"HTTP/1.0 404 Not Found\r\n\r\n", 404, 0, b"Not Found"),
        (b"HTTP/1.1 200\r\n\r\n", 200, 1, b""),
        (b"HTTP/1.1 200 \r\n\r\n", 200, 1, b""),
        (b"HTTP/1.1 200 caf\xc3\xa9\r\n\r\n", 200, 1, b"caf\xc3\xa9"),
        (b"\r\nHTTP/1.1 201 Created\r\n\r\n", 201, 1, b"Created"),
    ];
    for &(buf, status, minor, reason) in rows {
        let h = ok(buf, Method::Get);
        assert_eq!((h.status, h.minor), (status, minor));
        assert_eq!(h.reason.get(buf), reason, "{:?}", String::from_utf8_lossy(buf));
    }
}

#[test]
fn fields_and_upgrade() {
    let b = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: x\r\n\r\n";
    let h = ok(b, Method::Get);
    assert!(h.conn.upgrade);
    assert_eq!(h.upgrade.map(|s| s.get(b)), Some(&b"websocket"[..]));
    assert_eq!(h.header(b, "sec-websocket-accept"), Some(&b"x"[..]));
    assert_eq!(h.headers.len(), 3);
}

#[test]
fn interim_then_final() {
    let b = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi";
    let mut head = ResponseHead::new();
    let l = Limits::default();
    assert_eq!(parse_response(b, &l, Method::Post, &mut head), Ok(Some(())));
    assert_eq!((head.status, head.body), (100, BodyKind::None));
    let rest = &b[head.len..];
    assert_eq!(parse_response(rest, &l, Method::Post, &mut head), Ok(Some(())));
    assert_eq!((head.status, head.body), (200, BodyKind::Length(2)));
    assert_eq!(&rest[head.len..], b"hi");
}

#[test]
fn partial_and_limits() {
    let b = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX: y\r\n\r\n";
    for n in 0..b.len() {
        assert!(matches!(parse(&b[..n], Method::Get), Ok(None)), "prefix {n}");
    }
    let mut head = ResponseHead::new();
    let small = Limits { max_head: 20, ..Limits::default() };
    assert_eq!(parse_response(b, &small, Method::Get, &mut head), Err(E::HeadTooLarge));
    let few = Limits { max_headers: 1, ..Limits::default() };
    assert_eq!(parse_response(b, &few, Method::Get, &mut head), Err(E::TooManyHeaders));
}

/// RFC 9110 9.3.6: a 2xx to CONNECT has no body, whatever its framing fields say, and
/// the bytes after its head (the tunnel's first) are not part of it; any other status
/// has a body framed as usual.
#[test]
fn connect_reply_leaves_the_tunnel_bytes() {
    let tunnel = b"\x16\x03\x01\x02\x00 tls bytes";
    let rows: &[(&[u8], u16, BodyKind)] = &[
        (b"HTTP/1.1 200 Connection established\r\n\r\n", 200, BodyKind::None),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 10\r\n\r\n", 200, BodyKind::None),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 200, BodyKind::None),
        (b"HTTP/1.1 204 No Content\r\n\r\n", 204, BodyKind::None),
        (
            b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 3\r\n\r\n",
            407,
            BodyKind::Length(3),
        ),
        (b"HTTP/1.1 403 Forbidden\r\n\r\n", 403, BodyKind::CloseDelimited),
    ];
    for (head, status, body) in rows {
        let buf = [*head, tunnel].concat();
        let h = ok(&buf, Method::Connect);
        assert_eq!((h.status, h.body, h.len), (*status, *body, head.len()));
        assert_eq!(&buf[h.len..], tunnel);
        for i in 0..head.len() {
            assert!(parse(&buf[..i], Method::Connect).unwrap().is_none(), "prefix {i}");
        }
    }
}
