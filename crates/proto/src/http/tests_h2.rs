//! Byte tables for the heads across HTTP versions (`h2.rs`).
#![allow(clippy::unwrap_used)]

use super::*;

/// A request's method, authority, path and fields, the rewrite, the framing, and the
/// head expected.
type RequestRow<'a> = (
    &'a str,
    &'a str,
    &'a str,
    &'a [(&'a str, &'a str)],
    &'a RequestRewrite<'a>,
    BodyKind,
    &'a str,
);
/// A response head, the Via pseudonym, and the HTTP/2 fields expected.
type ResponseRow<'a> = (&'a str, Option<&'a str>, &'a [(&'a str, &'a str)]);

fn request(
    method: &str,
    authority: &str,
    path: &str,
    fields: &[(&str, &str)],
    rw: &RequestRewrite<'_>,
    body: BodyKind,
) -> String {
    let req = H2Request {
        method: method.as_bytes(),
        authority: authority.as_bytes(),
        path: path.as_bytes(),
    };
    let fields = || fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes()));
    let mut out = b"kept".to_vec();
    write_h2_request(&req, fields, rw, body, &mut out);
    assert!(out.starts_with(b"kept"));
    String::from_utf8(out[4..].to_vec()).unwrap()
}

#[test]
fn an_h2_request_goes_out_as_an_http1_head() {
    let none = RequestRewrite::default();
    let via = RequestRewrite {
        via: Some("rustle"),
        forwarded_for: Some("2001:db8::7"),
        ..RequestRewrite::default()
    };
    let parent = RequestRewrite {
        absolute: true,
        proxy_authorization: Some(b"Basic eDp5"),
        ..RequestRewrite::default()
    };
    #[rustfmt::skip]
    let table: &[RequestRow<'_>] = &[
        ("GET", "o.test", "/p?q", &[("accept", "*/*")], &none, BodyKind::None,
         "GET /p?q HTTP/1.1\r\nHost: o.test\r\naccept: */*\r\n\r\n"),
        ("GET", "o.test:81", "", &[], &none, BodyKind::None,
         "GET / HTTP/1.1\r\nHost: o.test:81\r\n\r\n"),
        // The proxy's and HTTP/2's own fields, and framing, are not the client's to pass.
        ("POST", "o.test", "/", &[
            ("host", "o.test"), ("proxy-authorization", "Basic eA=="), ("te", "trailers"),
            ("keep-alive", "1"), ("proxy-connection", "close"), ("connection", "x"),
            ("upgrade", "h2c"), ("trailer", "x-sum"), ("content-length", "5"),
            ("transfer-encoding", "chunked"), ("transfer_encoding", "gzip"),
            ("content_length", "1"), ("x-a", "1"),
         ], &none, BodyKind::Length(5),
         "POST / HTTP/1.1\r\nHost: o.test\r\nx-a: 1\r\nContent-Length: 5\r\n\r\n"),
        ("POST", "o.test", "/", &[], &none, BodyKind::Chunked,
         "POST / HTTP/1.1\r\nHost: o.test\r\nTransfer-Encoding: chunked\r\n\r\n"),
        // Cookies as one field (RFC 9113 8.2.3), after the others.
        ("GET", "o.test", "/", &[("cookie", "a=1"), ("x", "1"), ("cookie", "b=2")], &none,
         BodyKind::None, "GET / HTTP/1.1\r\nHost: o.test\r\nx: 1\r\ncookie: a=1; b=2\r\n\r\n"),
        ("GET", "o.test", "/", &[("cookie", ""), ("cookie", "a=1"), ("cookie", "")], &none,
         BodyKind::None, "GET / HTTP/1.1\r\nHost: o.test\r\ncookie: a=1\r\n\r\n"),
        // The proxy's Via and addresses: appended to the client's last field, else added.
        ("GET", "o.test", "/", &[], &via, BodyKind::None,
         "GET / HTTP/1.1\r\nHost: o.test\r\nVia: 2 rustle\r\nX-Forwarded-For: 2001:db8::7\r\n\
          Forwarded: for=\"[2001:db8::7]\"\r\n\r\n"),
        ("GET", "o.test", "/", &[
            ("via", "1.1 a"), ("forwarded", "for=192.0.2.1"), ("via", "1.1 b"),
            ("x-forwarded-for", ""), ("x", "1"),
         ], &via, BodyKind::Length(0),
         "GET / HTTP/1.1\r\nHost: o.test\r\nvia: 1.1 a\r\n\
          forwarded: for=192.0.2.1, for=\"[2001:db8::7]\"\r\nvia: 1.1 b, 2 rustle\r\n\
          x-forwarded-for: 2001:db8::7\r\nx: 1\r\nContent-Length: 0\r\n\r\n"),
        // Without `[http] via`, the client's fields go on as they are.
        ("GET", "o.test", "/", &[("via", "1.1 a"), ("x-forwarded-for", "192.0.2.1")], &none,
         BodyKind::None,
         "GET / HTTP/1.1\r\nHost: o.test\r\nvia: 1.1 a\r\nx-forwarded-for: 192.0.2.1\r\n\r\n"),
        // To a parent proxy: the absolute form and the parent's credentials.
        ("GET", "o.test", "/p", &[("proxy-authorization", "Basic eA==")], &parent,
         BodyKind::None,
         "GET http://o.test/p HTTP/1.1\r\nHost: o.test\r\nProxy-Authorization: Basic eDp5\r\n\r\n"),
        // Max-Forwards: one number, decremented for OPTIONS and TRACE.
        ("OPTIONS", "o.test", "/", &[("max-forwards", "x"), ("max-forwards", "3"),
                                     ("max-forwards", "7")], &none, BodyKind::None,
         "OPTIONS / HTTP/1.1\r\nHost: o.test\r\nmax-forwards: 2\r\n\r\n"),
        ("TRACE", "o.test", "/", &[("max-forwards", "0")], &none, BodyKind::None,
         "TRACE / HTTP/1.1\r\nHost: o.test\r\nmax-forwards: 0\r\n\r\n"),
        ("GET", "o.test", "/", &[("max-forwards", "3")], &none, BodyKind::None,
         "GET / HTTP/1.1\r\nHost: o.test\r\nmax-forwards: 3\r\n\r\n"),
    ];
    for (m, a, p, fields, rw, body, expected) in table {
        assert_eq!(request(m, a, p, fields, rw, *body), *expected, "{m} {a} {p} {fields:?}");
    }
}

fn response(head: &str, via: Option<&str>) -> Vec<(String, String)> {
    let mut h = ResponseHead::new();
    assert_eq!(
        parse_response(head.as_bytes(), &Limits::default(), Method::Get, &mut h),
        Ok(Some(()))
    );
    let mut scratch = Vec::new();
    h2_response_fields(&h, head.as_bytes(), via, &mut scratch)
        .map(|(n, v)| {
            (String::from_utf8(n.to_vec()).unwrap(), String::from_utf8(v.to_vec()).unwrap())
        })
        .collect()
}

#[test]
fn an_http1_response_head_becomes_h2_fields() {
    #[rustfmt::skip]
    let table: &[ResponseRow<'_>] = &[
        ("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX: 1\r\n\r\n", None,
         &[("Content-Type", "text/plain"), ("X", "1")]),
        // Hop-by-hop fields, those Connection names, and the framing go.
        ("HTTP/1.1 200 OK\r\nConnection: keep-alive, x-hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n\
          Transfer-Encoding: chunked\r\nUpgrade: h2c\r\nTrailer: x-sum\r\nTE: trailers\r\n\
          Proxy-Connection: close\r\nProxy-Authenticate: Basic\r\nX: 2\r\n\r\n", None,
         &[("X", "2")]),
        ("HTTP/1.1 200 OK\r\nConnection: close\r\nClose: 1\r\nX: 3\r\n\r\n", None, &[("X", "3")]),
        // One Content-Length, one number.
        ("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\nContent-Length: 5\r\n\r\n", None,
         &[("Content-Length", "5")]),
        // Via: the origin's, then the proxy's, as one field.
        ("HTTP/1.0 200 OK\r\nVia: 1.0 a\r\nX: 4\r\nVia: 1.1 b\r\n\r\n", Some("rustle"),
         &[("X", "4"), ("via", "1.0 a, 1.1 b, 1.0 rustle")]),
        ("HTTP/1.1 204 No Content\r\n\r\n", Some("rustle"), &[("via", "1.1 rustle")]),
        ("HTTP/1.1 204 No Content\r\nVia: 1.1 b\r\n\r\n", None, &[("Via", "1.1 b")]),
    ];
    for (head, via, expected) in table {
        let want: Vec<(String, String)> =
            expected.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        assert_eq!(response(head, *via), want, "{head:?}");
    }
}

#[test]
fn trailers_between_versions_leave_out_the_proxys_and_the_heads_fields() {
    for name in ["x-sum", "X-Sum", "server-timing", "etag"] {
        assert!(is_h2_trailer_kept(name.as_bytes()), "{name}");
    }
    for name in [
        "content-length",
        "transfer-encoding",
        "host",
        "cookie",
        "authorization",
        "proxy-authorization",
        "te",
        "connection",
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "proxy-authenticate",
        "via",
        "Forwarded",
        "x-forwarded-for",
        "transfer_encoding",
        "Content_Length",
        "trailer",
    ] {
        assert!(!is_h2_trailer_kept(name.as_bytes()), "{name}");
    }
}
