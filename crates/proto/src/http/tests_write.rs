//! Head writer tests: exact output for each rewrite rule.
#![allow(clippy::unwrap_used)]

use super::*;

fn req(buf: &[u8], rw: &RequestRewrite) -> String {
    let mut head = RequestHead::new();
    assert_eq!(
        parse_request(buf, &Limits::default(), &mut head),
        Ok(Some(())),
        "{:?}",
        String::from_utf8_lossy(buf)
    );
    let mut out = Vec::new();
    write_request(&head, buf, rw, &mut out);
    String::from_utf8(out).unwrap()
}

fn res(buf: &[u8], method: Method, rw: &ResponseRewrite) -> String {
    let mut head = ResponseHead::new();
    assert_eq!(parse_response(buf, &Limits::default(), method, &mut head), Ok(Some(())));
    let mut out = Vec::new();
    write_response(&head, buf, rw, &mut out);
    String::from_utf8(out).unwrap()
}

const NONE: RequestRewrite = RequestRewrite {
    via: None,
    forwarded_for: None,
    upgrade: false,
    absolute: false,
    proxy_authorization: None,
};

#[test]
fn request_hop_by_hop_and_host() {
    let b = b"GET http://example.com:8080/p?q HTTP/1.1\r\nHost: wrong\r\nAccept: */*\r\n\
Connection: keep-alive, X-Secret, x-other\r\nKeep-Alive: timeout=5\r\nX-Secret: 1\r\nX-OTHER: 2\r\n\
Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nProxy-Authenticate: x\r\nTE: trailers\r\n\
Trailer: X\r\nUpgrade: h2c\r\nUser-Agent: t\r\nX-Secret-Not: kept\r\n\r\n";
    assert_eq!(
        req(b, &NONE),
        "GET /p?q HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\nUser-Agent: t\r\nX-Secret-Not: kept\r\n\r\n"
    );
}

#[test]
fn request_line_paths() {
    let rows: &[(&[u8], &str)] = &[
        (b"GET http://a HTTP/1.1\r\nHost: a\r\n\r\n", "GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
        (b"GET http://a?x=1 HTTP/1.1\r\nHost: a\r\n\r\n", "GET /?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"),
        (b"GET http://[::1]:81//x HTTP/1.0\r\n\r\n", "GET //x HTTP/1.1\r\nHost: [::1]:81\r\n\r\n"),
        (b"OPTIONS http://a HTTP/1.1\r\nHost: a\r\n\r\n", "OPTIONS / HTTP/1.1\r\nHost: a\r\n\r\n"),
        (
            b"PURGE https://A.b/x HTTP/1.1\r\nHost: z\r\n\r\n",
            "PURGE /x HTTP/1.1\r\nHost: A.b\r\n\r\n",
        ),
        // Non-absolute forms are written as received.
        (
            b"CONNECT a:443 HTTP/1.1\r\nHost: b:443\r\n\r\n",
            "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
        ),
        (b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n", "GET /x HTTP/1.1\r\nHost: h\r\n\r\n"),
        (b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n", "OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n"),
    ];
    for (b, want) in rows {
        assert_eq!(req(b, &NONE), *want);
    }
}

#[test]
fn request_framing_kept_verbatim() {
    let b = b"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nX: y\r\n\r\n";
    assert_eq!(
        req(b, &NONE),
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nX: y\r\n\r\n"
    );
    let b = b"POST http://a/ HTTP/1.1\r\nHost: a\r\ncontent-length: 5\r\nX: y\r\n\r\n";
    assert_eq!(req(b, &NONE), "POST / HTTP/1.1\r\nHost: a\r\ncontent-length: 5\r\nX: y\r\n\r\n");
}

/// Identical Content-Length values, as a list or repeated fields, are accepted (RFC 9110
/// 8.6) and go out as one field with one value, where the first field was.
const ONE_LENGTH: &[(&str, &str)] = &[
    ("Content-Length: 5, 5\r\nX: y\r\n", "Content-Length: 5\r\nX: y\r\n"),
    ("content-length: 5,5,5\r\n", "content-length: 5\r\n"),
    ("Content-Length:  5 ,\t5 \r\n", "Content-Length: 5\r\n"),
    ("Content-Length: 5\r\nX: y\r\nContent-Length: 5\r\n", "Content-Length: 5\r\nX: y\r\n"),
    (
        "A: 1\r\nContent-Length: 5\r\nContent-Length: 5, 5\r\nB: 2\r\n",
        "A: 1\r\nContent-Length: 5\r\nB: 2\r\n",
    ),
    ("Content-Length: 5, 5\r\nCONTENT-LENGTH: 5\r\n", "Content-Length: 5\r\n"),
    ("Content-Length: 0005\r\n", "Content-Length: 0005\r\n"),
];

#[test]
fn request_content_length_goes_out_once() {
    for (fields, want) in ONE_LENGTH {
        let b = format!("POST http://a/ HTTP/1.1\r\nHost: a\r\n{fields}\r\nhello");
        let want = format!("POST / HTTP/1.1\r\nHost: a\r\n{want}\r\n");
        assert_eq!(req(b.as_bytes(), &NONE), want, "{fields:?}");
    }
}

#[test]
fn response_content_length_goes_out_once() {
    for (fields, want) in ONE_LENGTH {
        let b = format!("HTTP/1.1 200 OK\r\n{fields}\r\nhello");
        let want = format!("HTTP/1.1 200 OK\r\n{want}\r\n");
        let rw = ResponseRewrite::default();
        assert_eq!(res(b.as_bytes(), Method::Get, &rw), want, "{fields:?}");
        // A HEAD response's Content-Length describes a body not sent: one value too.
        assert_eq!(res(b.as_bytes(), Method::Head, &rw), want, "HEAD {fields:?}");
    }
    let b = b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\nVia: 1.1 o\r\n\r\n";
    let rw = ResponseRewrite { via: Some("r"), close: true, ..ResponseRewrite::default() };
    assert_eq!(
        res(b, Method::Get, &rw),
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nVia: 1.1 o, 1.1 r\r\nConnection: close\r\n\r\n"
    );
}

#[test]
fn max_forwards() {
    let rows: &[(&[u8], &str)] = &[
        (
            b"OPTIONS http://a/ HTTP/1.1\r\nHost: a\r\nMax-Forwards: 10\r\n\r\n",
            "Max-Forwards: 9\r\n",
        ),
        (b"TRACE http://a/ HTTP/1.1\r\nHost: a\r\nmax-forwards: 1\r\n\r\n", "max-forwards: 0\r\n"),
        (b"TRACE http://a/ HTTP/1.1\r\nHost: a\r\nMax-Forwards: 0\r\n\r\n", "Max-Forwards: 0\r\n"),
        (
            b"TRACE http://a/ HTTP/1.1\r\nHost: a\r\nMax-Forwards: 0010\r\n\r\n",
            "Max-Forwards: 9\r\n",
        ),
        (b"GET http://a/ HTTP/1.1\r\nHost: a\r\nMax-Forwards: 10\r\n\r\n", "Max-Forwards: 10\r\n"),
    ];
    for (b, want) in rows {
        let out = req(b, &NONE);
        assert!(out.contains(want), "{out:?} lacks {want:?}");
    }
}

#[test]
fn via_and_forwarded_added() {
    let rw = RequestRewrite {
        via: Some("rustle"),
        forwarded_for: Some("192.0.2.7"),
        upgrade: false,
        absolute: false,
        proxy_authorization: None,
    };
    assert_eq!(
        req(b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", &rw),
        "GET / HTTP/1.1\r\nHost: a\r\nVia: 1.1 rustle\r\nX-Forwarded-For: 192.0.2.7\r\nForwarded: for=192.0.2.7\r\n\r\n"
    );
    // HTTP/1.0 client: Via records the version received.
    assert_eq!(
        req(b"GET http://a/ HTTP/1.0\r\n\r\n", &rw),
        "GET / HTTP/1.1\r\nHost: a\r\nVia: 1.0 rustle\r\nX-Forwarded-For: 192.0.2.7\r\nForwarded: for=192.0.2.7\r\n\r\n"
    );
}

#[test]
fn via_and_forwarded_appended_to_last() {
    let rw = RequestRewrite {
        via: Some("rustle"),
        forwarded_for: Some("2001:db8::1"),
        upgrade: false,
        absolute: false,
        proxy_authorization: None,
    };
    let b = b"GET http://a/ HTTP/1.1\r\nHost: a\r\nVia: 1.0 fred\r\nX-Forwarded-For: 10.0.0.1\r\n\
Via: 1.1 p2\r\nForwarded: for=10.0.0.1\r\nX-Forwarded-For: 10.0.0.2, 10.0.0.3\r\nX: y\r\n\r\n";
    assert_eq!(
        req(b, &rw),
        "GET / HTTP/1.1\r\nHost: a\r\nVia: 1.0 fred\r\nX-Forwarded-For: 10.0.0.1\r\nVia: 1.1 p2, 1.1 rustle\r\n\
Forwarded: for=10.0.0.1, for=\"[2001:db8::1]\"\r\nX-Forwarded-For: 10.0.0.2, 10.0.0.3, 2001:db8::1\r\nX: y\r\n\r\n"
    );
    // An empty existing value gets no leading comma.
    let b = b"GET http://a/ HTTP/1.1\r\nHost: a\r\nX-Forwarded-For:\r\n\r\n";
    let rw = RequestRewrite { forwarded_for: Some("10.1.1.1"), ..NONE };
    assert_eq!(
        req(b, &rw),
        "GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 10.1.1.1\r\nForwarded: for=10.1.1.1\r\n\r\n"
    );
}

#[test]
fn forwarded_node_forms() {
    let rows = [
        ("192.0.2.1", "for=192.0.2.1"),
        ("::1", "for=\"[::1]\""),
        ("[::1]", "for=\"[::1]\""),
        ("[::1]:4711", "for=\"[::1]:4711\""),
        ("192.0.2.1:4711", "for=\"192.0.2.1:4711\""),
        ("unknown", "for=unknown"),
    ];
    for (addr, want) in rows {
        let rw = RequestRewrite { forwarded_for: Some(addr), ..NONE };
        let out = req(b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", &rw);
        assert!(out.contains(&format!("Forwarded: {want}\r\n")), "{out:?}");
    }
}

#[test]
fn injected_line_breaks_are_dropped() {
    let rw = RequestRewrite {
        via: Some("rus\r\nX-Evil: 1\r\ntle"),
        forwarded_for: Some("1.2.3.4\"\r\n"),
        upgrade: false,
        absolute: false,
        proxy_authorization: None,
    };
    let out = req(b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", &rw);
    assert_eq!(
        out,
        "GET / HTTP/1.1\r\nHost: a\r\nVia: 1.1 rusX-Evil: 1tle\r\nX-Forwarded-For: 1.2.3.4\"\r\nForwarded: for=\"1.2.3.4\"\r\n\r\n"
    );
    assert_eq!(out.matches("\r\n").count(), 6);
}

#[test]
fn upgrade_kept_only_when_asked() {
    let b =
        b"GET http://a/chat HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
Sec-WebSocket-Key: k\r\n\r\n";
    assert_eq!(req(b, &NONE), "GET /chat HTTP/1.1\r\nHost: a\r\nSec-WebSocket-Key: k\r\n\r\n");
    let rw = RequestRewrite { upgrade: true, ..NONE };
    assert_eq!(
        req(b, &rw),
        "GET /chat HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\nConnection: upgrade\r\n\r\n"
    );
}

#[test]
fn writers_append() {
    let b = b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n";
    let mut head = RequestHead::new();
    parse_request(b, &Limits::default(), &mut head).unwrap();
    let mut out = b"prefix|".to_vec();
    write_request(&head, b, &NONE, &mut out);
    assert_eq!(out, b"prefix|GET / HTTP/1.1\r\nHost: a\r\n\r\n");
}

#[test]
fn response_hop_by_hop() {
    let b = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: keep-alive, X-Hop\r\n\
Keep-Alive: timeout=5\r\nX-Hop: 1\r\nProxy-Authenticate: Basic\r\nTrailer: Expires\r\nUpgrade: h2\r\n\
Transfer-Encoding: chunked\r\nX-End: 2\r\n\r\n";
    assert_eq!(
        res(b, Method::Get, &ResponseRewrite::default()),
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nX-End: 2\r\n\r\n"
    );
}

#[test]
fn response_rewrites() {
    let b = b"HTTP/1.0 404 Not Found\r\nContent-Length: 3\r\n\r\n";
    let rw = ResponseRewrite { via: Some("rustle"), close: true, ..ResponseRewrite::default() };
    assert_eq!(
        res(b, Method::Get, &rw),
        "HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\nVia: 1.0 rustle\r\nConnection: close\r\n\r\n"
    );
    let rw = ResponseRewrite { keep_alive_10: true, ..ResponseRewrite::default() };
    assert_eq!(
        res(b, Method::Get, &rw),
        "HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\n"
    );
    // close wins over keep-alive.
    let rw = ResponseRewrite { keep_alive_10: true, close: true, ..ResponseRewrite::default() };
    assert!(res(b, Method::Get, &rw).ends_with("\r\nConnection: close\r\n\r\n"));
    // Existing Via is extended; empty reason keeps its SP.
    let b = b"HTTP/1.1 204\r\nVia: 1.1 origin-cache\r\n\r\n";
    let rw = ResponseRewrite { via: Some("rustle"), ..ResponseRewrite::default() };
    assert_eq!(
        res(b, Method::Get, &rw),
        "HTTP/1.1 204 \r\nVia: 1.1 origin-cache, 1.1 rustle\r\n\r\n"
    );
}

#[test]
fn response_upgrade() {
    let b = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
Sec-WebSocket-Accept: s\r\n\r\n";
    let rw = ResponseRewrite { upgrade: true, ..ResponseRewrite::default() };
    assert_eq!(
        res(b, Method::Get, &rw),
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: s\r\nConnection: upgrade\r\n\r\n"
    );
    assert_eq!(
        res(b, Method::Get, &ResponseRewrite::default()),
        "HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Accept: s\r\n\r\n"
    );
}

#[test]
fn response_dechunk_drops_transfer_encoding() {
    let b = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n";
    let rw = ResponseRewrite { dechunk: true, close: true, ..ResponseRewrite::default() };
    assert_eq!(res(b, Method::Get, &rw), "HTTP/1.1 200 OK\r\nX-A: 1\r\nConnection: close\r\n\r\n");
}

/// Unchanged fields go out as the peer wrote them (spacing and case too), in runs
/// broken by every field that is dropped or rewritten.
#[test]
fn kept_lines_go_out_as_received() {
    let b = b"HTTP/1.1 200 OK\r\nA:1\r\nB: \t two  \r\nKeep-Alive: timeout=5\r\nVIA: 1.0 x\r\n\
              c-D:  3\r\nConnection: keep-alive, X-Hop\r\nX-Hop: h\r\nE: 5\r\n\r\nbody";
    let rw = ResponseRewrite { via: Some("rustle"), ..ResponseRewrite::default() };
    assert_eq!(
        res(b, Method::Get, &rw),
        "HTTP/1.1 200 OK\r\nA:1\r\nB: \t two  \r\nVIA: 1.0 x, 1.1 rustle\r\nc-D:  3\r\nE: 5\r\n\r\n"
    );
    // The same without Via: one run before the dropped Keep-Alive, one after it up to
    // the dropped Connection, one for the last field.
    assert_eq!(
        res(b, Method::Get, &ResponseRewrite::default()),
        "HTTP/1.1 200 OK\r\nA:1\r\nB: \t two  \r\nVIA: 1.0 x\r\nc-D:  3\r\nE: 5\r\n\r\n"
    );
    let b = b"OPTIONS http://a/ HTTP/1.1\r\nx-a:1\r\nHost: a\r\nMax-Forwards:  7\r\nY:\t2\r\n\
              X-Forwarded-For: 10.0.0.1\r\nZ: 3 \r\n\r\n";
    let rw = RequestRewrite {
        via: None,
        forwarded_for: Some("192.0.2.1"),
        upgrade: false,
        absolute: false,
        proxy_authorization: None,
    };
    assert_eq!(
        req(b, &rw),
        "OPTIONS / HTTP/1.1\r\nHost: a\r\nx-a:1\r\nMax-Forwards: 6\r\nY:\t2\r\n\
         X-Forwarded-For: 10.0.0.1, 192.0.2.1\r\nZ: 3 \r\nForwarded: for=192.0.2.1\r\n\r\n"
    );
}

/// Runs at the edges of a head: after leading empty lines, with no field at all, in an
/// HTTP/1.0 head, and when the last field is dropped.
#[test]
fn runs_at_the_edges_of_a_head() {
    let none = ResponseRewrite::default();
    let b = b"\r\n\r\nHTTP/1.1 204 No Content\r\nA: 1\r\n\r\n";
    assert_eq!(res(b, Method::Get, &none), "HTTP/1.1 204 No Content\r\nA: 1\r\n\r\n");
    assert_eq!(
        res(b"HTTP/1.1 204 No Content\r\n\r\n", Method::Get, &none),
        "HTTP/1.1 204 No Content\r\n\r\n"
    );
    let b = b"HTTP/1.0 200 OK\r\nA: 1\r\nB: 2\r\nKeep-Alive: timeout=5\r\n\r\n";
    let keep = ResponseRewrite { keep_alive_10: true, ..ResponseRewrite::default() };
    assert_eq!(
        res(b, Method::Get, &keep),
        "HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nConnection: keep-alive\r\n\r\n"
    );
    let b = b"\r\nGET http://a/ HTTP/1.0\r\nHost: a\r\nX: 1\r\nConnection: close\r\n\r\n";
    assert_eq!(req(b, &NONE), "GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n\r\n");
}

/// RFC 9110 7.6.1: every field a connection option names goes, `close` included (alone or
/// with other options); a Close field without Connection: close is an end-to-end field.
#[test]
fn a_field_named_by_connection_close_is_dropped() {
    let rows: [(&[u8], bool); 4] = [
        (
            b"GET http://a/ HTTP/1.1\r\nHost: a\r\nClose: x\r\nConnection: close\r\nY: 1\r\n\r\n",
            false,
        ),
        (b"GET http://a/ HTTP/1.1\r\nHost: a\r\nConnection: close, foo\r\nCLOSE: x\r\n\r\n", false),
        (b"GET http://a/ HTTP/1.1\r\nHost: a\r\nClose: x\r\n\r\n", true),
        (b"GET http://a/ HTTP/1.1\r\nHost: a\r\nCloser: x\r\nConnection: close\r\n\r\n", false),
    ];
    for (b, kept) in rows {
        let out = req(b, &NONE).to_ascii_lowercase();
        assert_eq!(out.contains("\r\nclose: x\r\n"), kept, "{out}");
    }
    let out = req(rows[3].0, &NONE);
    assert!(out.contains("\r\nCloser: x\r\n"), "another name is kept: {out}");
    let r = b"HTTP/1.1 200 OK\r\nClose: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
    let out = res(r, Method::Get, &ResponseRewrite::default());
    assert!(!out.to_ascii_lowercase().contains("\r\nclose:"), "{out}");
}

fn dst(host: &str, port: u16) -> crate::addr::Address {
    use crate::addr::{Domain, Host};
    let host = match host.parse() {
        Ok(ip) => Host::Ip(ip),
        Err(_) => Host::Domain(Domain::new(host.as_bytes()).unwrap()),
    };
    crate::addr::Address { host, port }
}

/// A CONNECT for a parent: exact bytes, read back by this crate's own request parser.
#[test]
fn connect_requests() {
    let rows: &[(&str, u16, Option<&str>, &str)] = &[
        ("example.com", 443, None, "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"),
        ("10.0.0.1", 8080, None, "CONNECT 10.0.0.1:8080 HTTP/1.1\r\nHost: 10.0.0.1:8080\r\n\r\n"),
        (
            "2001:db8::1",
            443,
            None,
            "CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: [2001:db8::1]:443\r\n\r\n",
        ),
        (
            "h.test",
            1,
            Some("YWxpY2U6c2VjcmV0"),
            "CONNECT h.test:1 HTTP/1.1\r\nHost: h.test:1\r\nProxy-Authorization: Basic YWxpY2U6c2VjcmV0\r\n\r\n",
        ),
        (
            "a-b_c~d.example",
            65535,
            Some("dTpw=="),
            "CONNECT a-b_c~d.example:65535 HTTP/1.1\r\nHost: a-b_c~d.example:65535\r\nProxy-Authorization: Basic dTpw==\r\n\r\n",
        ),
    ];
    for (host, port, basic, want) in rows {
        let mut out = b"prefix".to_vec();
        write_connect(&dst(host, *port), *basic, &mut out).unwrap();
        assert_eq!(String::from_utf8_lossy(&out[6..]), *want);

        let mut head = RequestHead::new();
        let msg = &out[6..];
        assert_eq!(parse_request(msg, &Limits::default(), &mut head), Ok(Some(())));
        assert_eq!(head.method, Method::Connect);
        assert_eq!(head.len, msg.len());
        let Target::Authority { host: h, port: p, .. } = head.target else {
            panic!("{:?}", head.target)
        };
        assert_eq!((h.get(msg), p), (host.as_bytes(), *port));
        let auth = basic.map(|b| format!("Basic {b}"));
        assert_eq!(head.header(msg, "proxy-authorization"), auth.as_deref().map(str::as_bytes));
    }
}

#[test]
fn connect_request_errors() {
    let rows: &[(&str, u16, Option<&str>, HeadError)] = &[
        ("a@b", 443, None, HeadError::InvalidHost),
        ("a:b", 443, None, HeadError::InvalidHost),
        ("a/b", 443, None, HeadError::InvalidHost),
        ("a%20b", 443, None, HeadError::InvalidHost),
        ("example.com", 0, None, HeadError::InvalidPort),
        ("example.com", 443, Some(""), HeadError::InvalidHeaderValue),
        ("example.com", 443, Some("=="), HeadError::InvalidHeaderValue),
        ("example.com", 443, Some("a b"), HeadError::InvalidHeaderValue),
        ("example.com", 443, Some("dTpw\r\nX-Evil: 1"), HeadError::InvalidHeaderValue),
        ("example.com", 443, Some("a=b"), HeadError::InvalidHeaderValue),
    ];
    for (host, port, basic, want) in rows {
        let mut out = b"prefix".to_vec();
        assert_eq!(write_connect(&dst(host, *port), *basic, &mut out), Err(want.clone()), "{host}");
        assert_eq!(out, b"prefix", "nothing written on error");
    }
}

/// What forwarding may add to a head (Host, Via, X-Forwarded-For, Forwarded on a
/// request; Via and Connection on a response): at most four fields. A head at the field
/// limit therefore goes out with up to four more, which a next hop with the same limit
/// refuses (431); the fuzz targets re-parse forwarded heads with this allowance.
#[test]
fn forwarding_adds_at_most_four_fields() {
    let lines = |s: &[u8]| s.windows(2).filter(|w| w == b"\r\n").count();
    let mut buf = b"POST http://a/ HTTP/1.0\r\n".to_vec();
    for i in 0..127 {
        buf.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    buf.extend_from_slice(b"Content-Length: 0\r\n\r\n");
    let rw = RequestRewrite {
        via: Some("rustle"),
        forwarded_for: Some("192.0.2.7"),
        upgrade: false,
        absolute: false,
        proxy_authorization: None,
    };
    let out = req(&buf, &rw);
    assert!(lines(out.as_bytes()) <= lines(&buf) + 4, "{out}");
    let mut again = RequestHead::new();
    let limits = Limits { max_headers: 128 + 4, ..Limits::default() };
    assert_eq!(parse_request(out.as_bytes(), &limits, &mut again), Ok(Some(())));
    assert_eq!(
        parse_request(out.as_bytes(), &Limits::default(), &mut RequestHead::new()),
        Err(HeadError::TooManyHeaders)
    );

    let mut buf = b"HTTP/1.1 200 OK\r\n".to_vec();
    for i in 0..127 {
        buf.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    buf.extend_from_slice(b"Content-Length: 0\r\n\r\n");
    let rw = ResponseRewrite { via: Some("rustle"), close: true, ..ResponseRewrite::default() };
    let out = res(&buf, Method::Get, &rw);
    assert!(lines(out.as_bytes()) <= lines(&buf) + 4, "{out}");
}

/// Content-Length given twice as the same number in different digits (`0`, `00`) is one
/// length: accepted, sent on once, and not ambiguous (a fuzzing find: the property check
/// compared the digits as text).
#[test]
fn equal_lengths_in_other_digits_are_one_length() {
    let buf = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nContent-Length:00\r\n\r\n";
    let mut head = ResponseHead::new();
    assert_eq!(parse_response(buf, &Limits::default(), Method::Get, &mut head), Ok(Some(())));
    assert_eq!(head.body, BodyKind::Length(0));
    crate::check::assert_unambiguous(&crate::check::response_fields(buf, &head), "accepted");
    let out = res(buf, Method::Get, &ResponseRewrite::default());
    assert_eq!(out.to_ascii_lowercase().matches("content-length").count(), 1, "{out}");
}

/// The one transfer coding a request may carry goes on in its plain spelling, whatever
/// case and whitespace it came in (a next hop never reads a spelling of its own).
#[test]
fn request_chunked_goes_out_plain() {
    for field in [
        "Transfer-Encoding:\tCHUNKED\t",
        "TRANSFER-ENCODING: Chunked",
        "transfer-encoding:chunked  ",
    ] {
        let b = format!("POST http://a/ HTTP/1.1\r\nHost: a\r\n{field}\r\nX: y\r\n\r\n");
        let out = req(b.as_bytes(), &NONE);
        assert_eq!(
            out, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nX: y\r\n\r\n",
            "{field:?}"
        );
    }
}
