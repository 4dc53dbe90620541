//! Request parser tests: byte tables of rejections (each smuggling or
//! ambiguity case on its own row) and of accepted heads.
#![allow(clippy::unwrap_used)]

use super::*;
use HeadError as E;

fn parse(buf: &[u8]) -> Result<Option<RequestHead>, HeadError> {
    let mut head = RequestHead::new();
    parse_request(buf, &Limits::default(), &mut head).map(|r| r.map(|()| head))
}

fn ok(buf: &[u8]) -> RequestHead {
    match parse(buf) {
        Ok(Some(h)) => h,
        other => panic!("{:?}: {other:?}", String::from_utf8_lossy(buf)),
    }
}

/// (what, head, expected error). Every row is a complete head (ends in
/// CRLFCRLF) unless the error can be seen earlier.
const REJECT: &[(&str, &[u8], HeadError)] = &[
    ("cl and te", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", E::ContentLengthAndTransferEncoding),
    ("te and cl", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", E::ContentLengthAndTransferEncoding),
    ("cl differing fields", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", E::ConflictingContentLength),
    ("cl differing list", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 6\r\n\r\n", E::ConflictingContentLength),
    ("cl empty", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", E::InvalidContentLength),
    ("cl empty element", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 5,,5\r\n\r\n", E::InvalidContentLength),
    ("cl trailing comma", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 5,\r\n\r\n", E::InvalidContentLength),
    ("cl letters", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 5a\r\n\r\n", E::InvalidContentLength),
    ("cl plus sign", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n", E::InvalidContentLength),
    ("cl negative", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", E::InvalidContentLength),
    ("cl hex", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\n", E::InvalidContentLength),
    ("cl inner space", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 5 5\r\n\r\n", E::InvalidContentLength),
    ("cl overflow", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551616\r\n\r\n", E::InvalidContentLength),
    ("cl above 2^53 - 1", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 9007199254740992\r\n\r\n", E::ContentLengthTooLarge),
    ("cl u64 max", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551615\r\n\r\n", E::ContentLengthTooLarge),
    ("cl too large listed", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 18446744073709551615\r\n\r\n", E::ContentLengthTooLarge),
    ("te gzip only", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", E::NotChunked),
    ("te chunked not last", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", E::NotChunked),
    ("te chunked not last across fields", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n", E::NotChunked),
    ("te identity", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n", E::NotChunked),
    ("te lookalike", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n", E::NotChunked),
    ("te chunked twice", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", E::ChunkedTwice),
    ("te chunked twice fields", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", E::ChunkedTwice),
    ("te empty", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n", E::InvalidTransferEncoding),
    ("te empty element", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked,\r\n\r\n", E::InvalidTransferEncoding),
    ("te parameter", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked;q=1\r\n\r\n", E::InvalidTransferEncoding),
    ("te quoted", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \"chunked\"\r\n\r\n", E::InvalidTransferEncoding),
    ("te gzip then chunked", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip ,\tchunked\r\n\r\n", E::TransferCodingNotImplemented),
    ("te gzip then chunked fields", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n", E::TransferCodingNotImplemented),
    ("te identity then chunked", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity, chunked\r\n\r\n", E::TransferCodingNotImplemented),
    ("te identity then chunked fields", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\nTransfer-Encoding: CHUNKED\r\n\r\n", E::TransferCodingNotImplemented),
    ("te spelled with an underscore", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer_Encoding: chunked\r\n\r\n", E::FramingFieldUnderscore),
    ("cl spelled with an underscore", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nCONTENT_length: 5\r\n\r\nhello", E::FramingFieldUnderscore),
    ("te tabbed list", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\tdeflate\t,\tCHUNKED\t\r\n\r\n", E::TransferCodingNotImplemented),
    ("te in http/1.0", b"POST http://a/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", E::TransferEncodingHttp10),
    ("te vertical tab", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \x0bchunked\r\n\r\n", E::InvalidHeaderValue),
    ("obs-fold sp", b"GET http://a/ HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n", E::ObsFold),
    ("obs-fold htab", b"GET http://a/ HTTP/1.1\r\nHost: a\r\nX-A: b\r\n\tc\r\n\r\n", E::ObsFold),
    ("obs-fold te", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n", E::ObsFold),
    ("space before first field", b"GET http://a/ HTTP/1.1\r\n Host: a\r\n\r\n", E::ObsFold),
    ("bare cr in value", b"GET http://a/ HTTP/1.1\r\nHost: a\r\nX-A: b\rc\r\n\r\n", E::BareCr),
    ("bare cr before crlf", b"GET http://a/ HTTP/1.1\r\nHost: a\r\nX-A: b\r\r\n\r\n", E::BareCr),
    ("bare cr in request line", b"GET http://a/\r HTTP/1.1\r\nHost: a\r\n\r\n", E::BareCr),
    ("bare cr after version", b"GET http://a/ HTTP/1.1\rHost: a\r\n\r\n", E::BareCr),
    ("bare cr as final line", b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\rX\r\n\r\n", E::BareCr),
    ("bare lf after request line", b"GET http://a/ HTTP/1.1\nHost: a\r\n\r\n", E::BareLf),
    ("bare lf after field", b"GET http://a/ HTTP/1.1\r\nHost: a\n\r\n", E::BareLf),
    ("bare lf final", b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\n", E::BareLf),
    ("bare lf everywhere", b"GET http://a/ HTTP/1.1\nHost: a\n\n", E::BareLf),
    ("bare lf leading line", b"\nGET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", E::BareLf),
    ("space before colon", b"GET http://a/ HTTP/1.1\r\nHost : a\r\n\r\n", E::WhitespaceBeforeColon),
    ("tab before colon", b"GET http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length\t: 5\r\n\r\n", E::WhitespaceBeforeColon),
    ("empty field name", b"GET http://a/ HTTP/1.1\r\nHost: a\r\n: b\r\n\r\n", E::InvalidHeaderName),
    ("bad field name", b"GET http://a/ HTTP/1.1\r\nHost: a\r\nX(A): b\r\n\r\n", E::InvalidHeaderName),
    ("no colon", b"GET http://a/ HTTP/1.1\r\nHost: a\r\nXA\r\n\r\n", E::InvalidHeaderName),
    ("nul in value", b"GET http://a/ HTTP/1.1\r\nHost: a\r\nX-A: b\0c\r\n\r\n", E::InvalidHeaderValue),
    ("del in value", b"GET http://a/ HTTP/1.1\r\nHost: a\r\nX-A: b\x7fc\r\n\r\n", E::InvalidHeaderValue),
    ("bad method char", b"G(T http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidMethod),
    ("empty method", b" http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidMethod),
    ("double space", b"GET  http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidTarget),
    ("no version", b"GET http://a/\r\nHost: a\r\n\r\n", E::InvalidTarget),
    ("del in target", b"GET http://a/\x7f HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidTarget),
    ("non-ascii target", b"GET http://a/\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidTargetChar),
    ("space in target", b"GET http://a/b c HTTP/1.1\r\nHost: a\r\n\r\n", E::MalformedStartLine),
    ("fragment", b"GET http://a/b#c HTTP/1.1\r\nHost: a\r\n\r\n", E::Fragment),
    ("fragment origin-form", b"GET /b#c HTTP/1.1\r\nHost: a\r\n\r\n", E::Fragment),
    ("scheme ftp", b"GET ftp://a/ HTTP/1.1\r\nHost: a\r\n\r\n", E::UnsupportedScheme),
    ("scheme ws", b"GET ws://a/ HTTP/1.1\r\nHost: a\r\n\r\n", E::WebSocketWithoutUpgrade),
    ("scheme wss", b"GET wss://a/ HTTP/1.1\r\nHost: a\r\n\r\n", E::WebSocketWithoutUpgrade),
    (
        "scheme ws, upgrade over http/1.0",
        b"GET ws://a/ HTTP/1.0\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
        E::WebSocketWithoutUpgrade,
    ),
    (
        "scheme ws, upgrade not in connection",
        b"GET ws://a/ HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n",
        E::WebSocketWithoutUpgrade,
    ),
    ("scheme wsx", b"GET wsx://a/ HTTP/1.1\r\nHost: a\r\n\r\n", E::UnsupportedScheme),
    ("scheme empty", b"GET ://a/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidTarget),
    ("scheme one slash", b"GET http:/a/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidTarget),
    ("relative path", b"GET a/b HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidTarget),
    ("empty host", b"GET http:///p HTTP/1.1\r\nHost: a\r\n\r\n", E::EmptyHost),
    ("empty host no path", b"GET http:// HTTP/1.1\r\nHost: a\r\n\r\n", E::EmptyHost),
    ("empty host with port", b"GET http://:80/ HTTP/1.1\r\nHost: a\r\n\r\n", E::EmptyHost),
    ("userinfo", b"GET http://u@a/ HTTP/1.1\r\nHost: a\r\n\r\n", E::Userinfo),
    ("userinfo password", b"GET http://u:p@a/ HTTP/1.1\r\nHost: a\r\n\r\n", E::Userinfo),
    ("port zero", b"GET http://a:0/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidPort),
    ("port too big", b"GET http://a:65536/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidPort),
    ("port six digits", b"GET http://a:000080/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidPort),
    ("port empty", b"GET http://a:/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidPort),
    ("port letters", b"GET http://a:8o/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidPort),
    ("port negative", b"GET http://a:-1/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidPort),
    ("two ports", b"GET http://a:80:81/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidPort),
    ("host percent", b"GET http://a%2eb/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidHost),
    ("host comma", b"GET http://a,b/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidHost),
    ("ipv6 unclosed", b"GET http://[::1/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidHost),
    ("ipv6 garbage", b"GET http://[zz]/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidHost),
    ("ipv6 empty", b"GET http://[]/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidHost),
    ("ipv6 trailing junk", b"GET http://[::1]x/ HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidHost),
    ("ipv6 unbracketed", b"GET http://::1/ HTTP/1.1\r\nHost: a\r\n\r\n", E::EmptyHost),
    ("authority-form with get", b"GET a:80 HTTP/1.1\r\nHost: a\r\n\r\n", E::AuthorityFormNotConnect),
    ("connect absolute", b"CONNECT http://a:80/ HTTP/1.1\r\nHost: a\r\n\r\n", E::ConnectNeedsAuthority),
    ("connect origin", b"CONNECT / HTTP/1.1\r\nHost: a\r\n\r\n", E::ConnectNeedsAuthority),
    ("connect asterisk", b"CONNECT * HTTP/1.1\r\nHost: a\r\n\r\n", E::ConnectNeedsAuthority),
    ("connect no port", b"CONNECT a HTTP/1.1\r\nHost: a\r\n\r\n", E::MissingPort),
    ("connect ipv6 no port", b"CONNECT [::1] HTTP/1.1\r\nHost: a\r\n\r\n", E::MissingPort),
    ("connect empty port", b"CONNECT a: HTTP/1.1\r\nHost: a\r\n\r\n", E::InvalidPort),
    ("connect userinfo", b"CONNECT u@a:443 HTTP/1.1\r\nHost: a\r\n\r\n", E::Userinfo),
    ("asterisk with get", b"GET * HTTP/1.1\r\nHost: a\r\n\r\n", E::AsteriskNotOptions),
    ("version 1.2", b"GET http://a/ HTTP/1.2\r\nHost: a\r\n\r\n", E::UnsupportedVersion),
    ("version 2.0", b"GET http://a/ HTTP/2.0\r\nHost: a\r\n\r\n", E::UnsupportedVersion),
    ("h2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", E::UnsupportedVersion),
    ("version lowercase", b"GET http://a/ http/1.1\r\nHost: a\r\n\r\n", E::InvalidVersion),
    ("version garbage", b"GET http://a/ HTTX/1.1\r\nHost: a\r\n\r\n", E::InvalidVersion),
    ("version trailing junk", b"GET http://a/ HTTP/1.10\r\nHost: a\r\n\r\n", E::MalformedStartLine),
    ("trailing space", b"GET http://a/ HTTP/1.1 \r\nHost: a\r\n\r\n", E::MalformedStartLine),
    ("two hosts", b"GET http://a/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", E::MultipleHost),
    ("two identical hosts", b"GET http://a/ HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", E::MultipleHost),
    ("no host 1.1", b"GET http://a/ HTTP/1.1\r\nAccept: */*\r\n\r\n", E::MissingHost),
    ("host with space", b"GET http://a/ HTTP/1.1\r\nHost: a b\r\n\r\n", E::InvalidHostHeader),
    ("host list", b"GET http://a/ HTTP/1.1\r\nHost: a, b\r\n\r\n", E::InvalidHostHeader),
    ("host userinfo", b"GET http://a/ HTTP/1.1\r\nHost: u@a\r\n\r\n", E::InvalidHostHeader),
    ("host bad port", b"GET http://a/ HTTP/1.1\r\nHost: a:x\r\n\r\n", E::InvalidHostHeader),
    ("max-forwards letters", b"OPTIONS * HTTP/1.1\r\nHost: a\r\nMax-Forwards: ten\r\n\r\n", E::InvalidMaxForwards),
    ("max-forwards empty", b"OPTIONS * HTTP/1.1\r\nHost: a\r\nMax-Forwards:\r\n\r\n", E::InvalidMaxForwards),
    ("max-forwards list", b"OPTIONS * HTTP/1.1\r\nHost: a\r\nMax-Forwards: 1, 2\r\n\r\n", E::InvalidMaxForwards),
    ("max-forwards negative", b"OPTIONS * HTTP/1.1\r\nHost: a\r\nMax-Forwards: -1\r\n\r\n", E::InvalidMaxForwards),
    ("max-forwards twice", b"OPTIONS * HTTP/1.1\r\nHost: a\r\nMax-Forwards: 1\r\nMax-Forwards: 1\r\n\r\n", E::MultipleMaxForwards),
    ("connection names cl", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: close, Content-Length\r\n\r\n", E::ConnectionNamesFraming),
    ("connection names te", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nConnection: transfer-encoding\r\n\r\n", E::ConnectionNamesFraming),
    ("proxy-connection names cl", b"POST http://a/ HTTP/1.1\r\nHost: a\r\nProxy-Connection: content-length\r\n\r\n", E::ConnectionNamesFraming),
];

#[test]
fn rejections() {
    for (what, buf, want) in REJECT {
        let got = parse(buf);
        assert_eq!(got.as_ref().err(), Some(want), "{what}: {got:?}");
        let status = want.status();
        let expect_status = match want {
            E::UnsupportedVersion => 505,
            E::HeadTooLarge | E::TooManyHeaders => 431,
            E::ContentLengthTooLarge => 413,
            E::TransferCodingNotImplemented => 501,
            _ => 400,
        };
        assert_eq!(status, expect_status, "{what}");
        // Display is a one-line lowercase reason.
        let msg = want.to_string();
        assert!(!msg.is_empty() && !msg.contains('\n'), "{what}");
        assert_eq!(msg, msg.to_lowercase(), "{what}");
    }
}

#[test]
fn head_too_large_431() {
    let limits = Limits { max_head: 64, ..Limits::default() };
    let mut head = RequestHead::new();
    // Incomplete and already at the limit.
    let buf = [b'a'; 64];
    let mut long = b"GET http://a/ HTTP/1.1\r\nHost: a\r\nX: ".to_vec();
    long.resize(64, b'x');
    for b in [&buf[..], &long[..]] {
        let e = parse_request(b, &limits, &mut head).unwrap_err();
        assert_eq!(e, E::HeadTooLarge);
        assert_eq!(e.status(), 431);
    }
    // A complete head longer than the limit is too large as well, even if
    // its end is in the buffer.
    let mut full = long.clone();
    full.extend_from_slice(b"\r\n\r\n");
    assert_eq!(parse_request(&full, &limits, &mut head), Err(E::HeadTooLarge));
    // One byte below the limit: still waiting.
    assert_eq!(parse_request(&long[..63], &limits, &mut head), Ok(None));
    // A head that fits exactly.
    let exact = b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n";
    let limits = Limits { max_head: exact.len(), ..Limits::default() };
    assert_eq!(parse_request(exact, &limits, &mut head), Ok(Some(())));
}

#[test]
fn too_many_headers_431() {
    let limits = Limits { max_headers: 2, ..Limits::default() };
    let mut head = RequestHead::new();
    let two = b"GET http://a/ HTTP/1.1\r\nHost: a\r\nX: 1\r\n\r\n";
    assert_eq!(parse_request(two, &limits, &mut head), Ok(Some(())));
    let three = b"GET http://a/ HTTP/1.1\r\nHost: a\r\nX: 1\r\nY: 2\r\n\r\n";
    let e = parse_request(three, &limits, &mut head).unwrap_err();
    assert_eq!(e, E::TooManyHeaders);
    assert_eq!(e.status(), 431);
    // Limits above the stack scratch size are clamped, not a panic.
    let huge = Limits { max_headers: usize::MAX, max_head: usize::MAX };
    assert_eq!(parse_request(three, &huge, &mut head), Ok(Some(())));
}

#[test]
fn absolute_form_variants() {
    // (target, scheme, host, port, authority, path)
    let rows: &[(&str, Scheme, &str, u16, &str, &str)] = &[
        ("http://example.com", Scheme::Http, "example.com", 80, "example.com", ""),
        ("http://example.com/", Scheme::Http, "example.com", 80, "example.com", "/"),
        (
            "http://example.com:8080/a/b?c=d&e",
            Scheme::Http,
            "example.com",
            8080,
            "example.com:8080",
            "/a/b?c=d&e",
        ),
        ("http://example.com?q=1", Scheme::Http, "example.com", 80, "example.com", "?q=1"),
        ("HTTP://Example.COM:80/x", Scheme::Http, "Example.COM", 80, "Example.COM:80", "/x"),
        ("https://a.b/", Scheme::Https, "a.b", 443, "a.b", "/"),
        ("HttpS://a.b:8443", Scheme::Https, "a.b", 8443, "a.b:8443", ""),
        ("http://[::1]:8080/x", Scheme::Http, "::1", 8080, "[::1]:8080", "/x"),
        ("http://[2001:db8::1]/", Scheme::Http, "2001:db8::1", 80, "[2001:db8::1]", "/"),
        ("http://127.0.0.1:65535/p@q", Scheme::Http, "127.0.0.1", 65535, "127.0.0.1:65535", "/p@q"),
        ("http://a/%20x;y=z", Scheme::Http, "a", 80, "a", "/%20x;y=z"),
        ("ws://a.b/chat?x=1", Scheme::Ws, "a.b", 80, "a.b", "/chat?x=1"),
        ("WS://a.b:8080", Scheme::Ws, "a.b", 8080, "a.b:8080", ""),
        ("wss://a.b/", Scheme::Wss, "a.b", 443, "a.b", "/"),
        ("WsS://[::1]:9443/s", Scheme::Wss, "::1", 9443, "[::1]:9443", "/s"),
    ];
    for &(target, scheme, host, port, authority, path) in rows {
        // ws:// and wss:// come with an upgrade, the only requests that may name them.
        let upgrade = match scheme {
            Scheme::Ws | Scheme::Wss => "Connection: Upgrade\r\nUpgrade: websocket\r\n",
            Scheme::Http | Scheme::Https => "",
        };
        let buf = format!("GET {target} HTTP/1.1\r\nHost: h\r\n{upgrade}\r\n");
        let b = buf.as_bytes();
        let h = ok(b);
        assert_eq!(h.target_span.get(b), target.as_bytes());
        match h.target {
            Target::Absolute { scheme: s, host: hs, port: p, authority: a, path: ps } => {
                assert_eq!(s, scheme, "{target}");
                assert_eq!(hs.get(b), host.as_bytes(), "{target}");
                assert_eq!(p, port, "{target}");
                assert_eq!(a.get(b), authority.as_bytes(), "{target}");
                assert_eq!(ps.get(b), path.as_bytes(), "{target}");
            }
            other => panic!("{target}: {other:?}"),
        }
    }
}

#[test]
fn connect_authority_form() {
    for (target, host, port) in [
        ("example.com:443", "example.com", 443u16),
        ("[::1]:443", "::1", 443),
        ("10.0.0.1:22", "10.0.0.1", 22),
    ] {
        let buf = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
        let b = buf.as_bytes();
        let h = ok(b);
        assert_eq!(h.method, Method::Connect);
        assert_eq!(h.body, BodyKind::None);
        match h.target {
            Target::Authority { host: hs, port: p, authority } => {
                assert_eq!(hs.get(b), host.as_bytes());
                assert_eq!(p, port);
                assert_eq!(authority.get(b), target.as_bytes());
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn other_target_forms() {
    let h = ok(b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(h.target, Target::Asterisk);
    let b = b"GET /x?y HTTP/1.1\r\nHost: a\r\n\r\n";
    let h = ok(b);
    match h.target {
        Target::Origin { path } => assert_eq!(path.get(b), b"/x?y"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn fields_and_flags() {
    let b = b"POST http://a/ HTTP/1.1\r\nhost: a:8080\r\nContent-Length: 5, 5\r\ncontent-length: 5\r\n\
Expect: 100-Continue\r\nMax-Forwards: 7\r\nUpgrade: websocket\r\nConnection: Upgrade, foo\r\nX-Empty:\r\n\r\nhello";
    let h = ok(b);
    assert_eq!(h.len, b.len() - 5);
    assert_eq!(h.method, Method::Post);
    assert_eq!(h.method_span.get(b), b"POST");
    assert_eq!(h.minor, 1);
    assert_eq!(h.body, BodyKind::Length(5));
    assert!(h.expect_continue);
    assert_eq!(h.max_forwards, Some(7));
    assert_eq!(h.host.map(|s| s.get(b)), Some(&b"a:8080"[..]));
    assert_eq!(h.upgrade.map(|s| s.get(b)), Some(&b"websocket"[..]));
    assert!(h.conn.upgrade && !h.conn.close && !h.conn.keep_alive);
    assert!(h.is_upgrade());
    assert!(h.keep_alive());
    assert_eq!(h.headers.len(), 8);
    assert_eq!(h.header(b, "CONTENT-LENGTH"), Some(&b"5, 5"[..]));
    assert_eq!(h.header(b, "x-empty"), Some(&b""[..]));
    assert_eq!(h.header(b, "missing"), None);
    assert_eq!(h.headers[1].name.get(b), b"Content-Length");
}

#[test]
fn body_kinds() {
    let rows: &[(&[u8], BodyKind)] = &[
        (b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", BodyKind::None),
        (b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", BodyKind::Length(0)),
        (
            b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 9007199254740991\r\n\r\n",
            BodyKind::Length(crate::MAX_LENGTH),
        ),
        (b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 007\r\n\r\n", BodyKind::Length(7)),
        (
            b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            BodyKind::Chunked,
        ),
        (
            b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: CHUNKED\r\n\r\n",
            BodyKind::Chunked,
        ),
        (
            b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\tCHUNKED\t\r\n\r\n",
            BodyKind::Chunked,
        ),
    ];
    for (buf, want) in rows {
        assert_eq!(ok(buf).body, *want, "{:?}", String::from_utf8_lossy(buf));
    }
}

#[test]
fn keep_alive_rules() {
    let rows: &[(&[u8], bool)] = &[
        (b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", true),
        (b"GET http://a/ HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", false),
        (b"GET http://a/ HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, CLOSE\r\n\r\n", false),
        (b"GET http://a/ HTTP/1.0\r\n\r\n", false),
        (b"GET http://a/ HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", true),
        (b"GET http://a/ HTTP/1.0\r\nProxy-Connection: keep-alive\r\n\r\n", true),
        (
            b"GET http://a/ HTTP/1.0\r\nProxy-Connection: close\r\nConnection: keep-alive\r\n\r\n",
            false,
        ),
    ];
    for (buf, want) in rows {
        assert_eq!(ok(buf).keep_alive(), *want, "{:?}", String::from_utf8_lossy(buf));
    }
    // Upgrade needs both the header and the Connection token, and HTTP/1.1.
    assert!(!ok(b"GET http://a/ HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n").is_upgrade());
    assert!(!ok(b"GET http://a/ HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\n\r\n").is_upgrade());
    assert!(
        !ok(b"GET http://a/ HTTP/1.0\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n").is_upgrade()
    );
}

#[test]
fn accepted_edge_cases() {
    // HTTP/1.0 without Host, empty Host, IPv6 Host, huge Max-Forwards.
    assert_eq!(ok(b"GET http://a/ HTTP/1.0\r\n\r\n").host, None);
    assert!(ok(b"GET http://a/ HTTP/1.1\r\nHost:\r\n\r\n").host.is_some());
    ok(b"GET http://a/ HTTP/1.1\r\nHost: [::1]:80\r\n\r\n");
    let h = ok(b"TRACE http://a/ HTTP/1.1\r\nHost: a\r\nMax-Forwards: 99999999999\r\n\r\n");
    assert_eq!(h.max_forwards, Some(u32::MAX));
    // Extension and lowercase methods are tokens, kept as Other.
    let b = b"PURGE http://a/ HTTP/1.1\r\nHost: a\r\n\r\n";
    let h = ok(b);
    assert_eq!((h.method, h.method_span.get(b)), (Method::Other, &b"PURGE"[..]));
    assert_eq!(ok(b"get http://a/ HTTP/1.1\r\nHost: a\r\n\r\n").method, Method::Other);
    // obs-text in a value is allowed (RFC 9110 5.5).
    ok(b"GET http://a/ HTTP/1.1\r\nHost: a\r\nX: caf\xc3\xa9\r\n\r\n");
    // Expect values other than 100-continue are not flagged.
    assert!(!ok(b"GET http://a/ HTTP/1.1\r\nHost: a\r\nExpect: foo\r\n\r\n").expect_continue);
}

#[test]
fn leading_empty_lines_are_skipped() {
    let b = b"\r\n\r\nGET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n";
    let h = ok(b);
    assert_eq!(h.len, b.len());
    assert_eq!(h.method_span.get(b), b"GET");
    assert_eq!(h.method_span.start, 4);
    assert_eq!(h.target_span.get(b), b"http://a/");
    assert_eq!(h.headers[0].name.get(b), b"Host");
}

#[test]
fn pipelined_requests() {
    let b = b"GET http://a/1 HTTP/1.1\r\nHost: a\r\n\r\nPOST http://b/2 HTTP/1.1\r\nHost: b\r\nContent-Length: 2\r\n\r\nhiGET";
    let mut head = RequestHead::new();
    assert_eq!(parse_request(b, &Limits::default(), &mut head), Ok(Some(())));
    let first = head.len;
    assert_eq!(&b[..first], b"GET http://a/1 HTTP/1.1\r\nHost: a\r\n\r\n");
    let rest = &b[first..];
    assert_eq!(parse_request(rest, &Limits::default(), &mut head), Ok(Some(())));
    assert_eq!(head.method, Method::Post);
    assert_eq!(head.body, BodyKind::Length(2));
    assert_eq!(head.host.map(|s| s.get(rest)), Some(&b"b"[..]));
    assert_eq!(&rest[head.len..], b"hiGET");
    // The tail is an incomplete third request.
    let tail = &rest[head.len + 2..];
    assert_eq!(parse_request(tail, &Limits::default(), &mut head), Ok(None));
}

#[test]
fn every_strict_prefix_is_partial() {
    let b = b"\r\nPOST http://[::1]:8080/a?b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nX: y\r\n\r\n";
    for n in 0..b.len() {
        assert!(matches!(parse(&b[..n]), Ok(None)), "prefix {n}");
    }
    assert_eq!(ok(b).len, b.len());
}

#[test]
fn head_is_reset_and_vec_reused() {
    let mut head = RequestHead::new();
    let a = b"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nExpect: 100-continue\r\nConnection: close\r\nMax-Forwards: 1\r\n\r\n";
    assert_eq!(parse_request(a, &Limits::default(), &mut head), Ok(Some(())));
    let cap = head.headers.capacity();
    let b = b"GET http://b/ HTTP/1.1\r\nHost: b\r\n\r\n";
    assert_eq!(parse_request(b, &Limits::default(), &mut head), Ok(Some(())));
    assert_eq!(head.headers.len(), 1);
    assert_eq!(head.headers.capacity(), cap);
    assert_eq!(head.body, BodyKind::None);
    assert!(!head.expect_continue && head.max_forwards.is_none());
    assert_eq!(head.conn, ConnFlags::default());
}

#[test]
fn span_get_never_panics() {
    let s = Span { start: 5, end: 10 };
    assert_eq!(s.get(b"abc"), b"");
    let s = Span { start: 3, end: 1 };
    assert_eq!(s.get(b"abcdef"), b"");
    assert!(s.is_empty());
    assert_eq!(s.len(), 0);
    assert_eq!(Span { start: 1, end: 3 }.len(), 2);
}

#[test]
fn limits_default() {
    let l = Limits::default();
    assert_eq!((l.max_head, l.max_headers), (64 * 1024, 128));
}

/// Arbitrary bytes never panic; a cheap deterministic fuzz over mutations
/// of a valid head.
#[test]
fn mutations_never_panic() {
    let base = b"POST http://[::1]:8080/a?b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: a, b\r\n\r\n";
    let mut head = RequestHead::new();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..20_000 {
        let mut m = base.to_vec();
        for _ in 0..3 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let i = (seed % m.len() as u64) as usize;
            m[i] = (seed >> 32) as u8;
        }
        let _ = parse_request(&m, &Limits::default(), &mut head);
        let mut out = Vec::new();
        write_request(&head, &m, &RequestRewrite::default(), &mut out);
    }
}
