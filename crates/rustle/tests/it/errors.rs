//! Malformed requests, malformed or failing upstreams: the status, a one-line text body
//! naming the cause, the connection closed, and the origin left alone when the request was
//! at fault.

use std::net::SocketAddr;
use std::time::Duration;

use rustle_bench::pattern::pattern;
use rustle_bench::Origin;

use crate::util::*;

/// Sends `bytes` on a new connection and checks the error response: `status`, a one-line
/// text body containing `cause`, nothing after it, connection closed.
fn expect_error(proxy: &Proxy, bytes: &[u8], status: u16, cause: &str) -> Resp {
    let mut c = Conn::to_proxy(proxy);
    c.send(bytes);
    let r = c.read_response();
    let what = String::from_utf8_lossy(&bytes[..bytes.len().min(120)]).into_owned();
    assert_eq!(r.status, status, "for {what:?}: {} {}", r.head_text(), r.text());
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"), "for {what:?}");
    assert_eq!(r.header("connection"), Some("close"), "for {what:?}");
    let text = r.text();
    assert!(text.ends_with('\n') && text.lines().count() == 1, "body not one line: {text:?}");
    assert!(
        text.to_ascii_lowercase().contains(&cause.to_ascii_lowercase()),
        "for {what:?} the body should name `{cause}`: {text:?}"
    );
    c.assert_closed();
    r
}

fn head_with(origin: &Origin, method: &str, path: &str, lines: &str) -> Vec<u8> {
    head_at(origin.addr(), method, path, lines)
}

/// One malformed request: rejected with `status` naming `cause`, the connection closed,
/// the origin never contacted, and the rejection logged with its status.
fn rejected(build: impl FnOnce(SocketAddr) -> Vec<u8>, status: u16, cause: &str) {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let bytes = build(origin.addr());
    expect_error(&proxy, &bytes, status, cause);
    assert_eq!(origin.connections(), 0, "a rejected request reached the origin");
    let line = proxy.log_line(|l| l.contains(&format!(" {status} ")));
    assert!(line.to_ascii_lowercase().contains(&cause.to_ascii_lowercase()), "{line}");
}

/// A request head in absolute form for the origin at `a`, with extra raw header lines.
fn head_at(a: SocketAddr, method: &str, path: &str, lines: &str) -> Vec<u8> {
    format!("{method} http://{a}{path} HTTP/1.1\r\nHost: {a}\r\n{lines}\r\n").into_bytes()
}

#[test]
fn origin_form_request_is_400() {
    rejected(|a| format!("GET / HTTP/1.1\r\nHost: {a}\r\n\r\n").into_bytes(), 400, "absolute URI");
}

#[test]
fn content_length_and_transfer_encoding_is_400() {
    let lines = "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n";
    rejected(
        |a| head_at(a, "POST", "/echo", lines),
        400,
        "both content-length and transfer-encoding",
    );
}

#[test]
fn differing_content_lengths_is_400() {
    let lines = "Content-Length: 5\r\nContent-Length: 6\r\n";
    rejected(|a| head_at(a, "POST", "/echo", lines), 400, "content-length");
}

#[test]
fn transfer_encoding_gzip_is_400() {
    rejected(|a| head_at(a, "POST", "/echo", "Transfer-Encoding: gzip\r\n"), 400, "chunked");
}

#[test]
fn obs_fold_is_400() {
    let lines = "X-Folded: first\r\n second\r\n";
    rejected(|a| head_at(a, "GET", "/headers", lines), 400, "folding");
}

#[test]
fn bare_cr_in_a_header_is_400() {
    rejected(|a| head_at(a, "GET", "/headers", "X-Cr: a\rb\r\n"), 400, "cr");
}

#[test]
fn space_before_colon_is_400() {
    rejected(|a| head_at(a, "GET", "/headers", "X-Space : a\r\n"), 400, "colon");
}

#[test]
fn invalid_method_token_is_400() {
    rejected(|a| head_at(a, "G(E)T", "/headers", ""), 400, "method");
}

#[test]
fn invalid_characters_in_target_are_400() {
    // A non-ASCII byte (UTF-8 é) and a DEL: only visible ASCII may appear in a target.
    rejected(|a| head_at(a, "GET", "/caf\u{e9}", ""), 400, "target");
    rejected(
        |a| {
            let mut h = head_at(a, "GET", "/aXb", "");
            let i = h.windows(3).position(|w| w == b"aXb").unwrap();
            h[i + 1] = 0x7f;
            h
        },
        400,
        "target",
    );
}

#[test]
fn fragment_in_target_is_400() {
    rejected(|a| head_at(a, "GET", "/page#section", ""), 400, "fragment");
}

#[test]
fn oversized_request_head_is_431() {
    let lines = format!("X-Big: {}\r\n", "a".repeat(70 * 1024));
    rejected(|a| head_at(a, "GET", "/headers", &lines), 431, "too large");
}

#[test]
fn small_max_header_bytes_applies() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start_with(|c| c.limits.max_header_bytes = 2048);
    let big = head_with(&origin, "GET", "/headers", &format!("X-Big: {}\r\n", "b".repeat(3000)));
    expect_error(&proxy, &big, 431, "too large");
    let ok = head_with(&origin, "GET", "/bytes/5", &format!("X-Small: {}\r\n", "b".repeat(1000)));
    let mut c = Conn::to_proxy(&proxy);
    c.send(&ok);
    assert_eq!(c.read_response().body, pattern(5));
    assert_eq!(origin.requests(), 1);
}

#[test]
fn bad_chunk_size_in_request_body() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let mut bytes = head_with(&origin, "POST", "/sha256", "Transfer-Encoding: chunked\r\n");
    bytes.extend_from_slice(b"zz\r\nhello\r\n0\r\n\r\n");
    let mut c = Conn::to_proxy(&proxy);
    c.send(&bytes);
    let (got, closed) = read_until_close(&mut c.s);
    assert!(closed, "connection left open after a bad chunk");
    if !got.is_empty() {
        let r = parse_response(&got);
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&got));
        assert!(r.text().contains("chunk"), "{}", r.text());
    }
    let line = proxy.log_line(|l| l.contains("/sha256"));
    assert!(line.contains("chunk"), "log line does not name the chunk error: {line}");
}

#[test]
fn malformed_origin_responses_become_502() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    for kind in
        ["cl-and-te", "two-cl", "bad-chunk", "obs-fold", "bare-lf", "garbage", "no-response"]
    {
        let mut c = Conn::to_proxy(&proxy);
        c.send(&get(&origin.url(&format!("/malformed/{kind}"))));
        let (got, closed) = read_until_close(&mut c.s);
        assert!(closed, "{kind}: connection left open");
        let r = parse_response(&got);
        assert_eq!(r.status, 502, "{kind}: client got {:?}", String::from_utf8_lossy(&got));
        assert!(r.text().contains("upstream"), "{kind}: {}", r.text());
        assert_eq!(
            r.header("content-length").map(|l| l.parse::<usize>().unwrap()),
            Some(r.body.len()),
            "{kind}: the 502 is not the only thing on the connection: {:?}",
            String::from_utf8_lossy(&got)
        );
    }
}

#[test]
fn truncated_origin_body_cuts_the_client_connection() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let mut c = Conn::to_proxy(&proxy);
    c.send(&get(&origin.url("/malformed/truncated")));
    let r = c.read_head();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("100"));
    let (rest, closed) = read_until_close(&mut c.s);
    c.buf.extend_from_slice(&rest);
    assert!(closed, "connection not closed after the origin cut the body");
    assert_eq!(c.buf, b"0123456789", "the client must get the 10 bytes sent and no more");
    let line = proxy.log_line(|l| l.contains("/malformed/truncated"));
    assert!(line.contains("upstream closed"), "{line}");
}

#[test]
fn refused_upstream_get_is_502() {
    let proxy = Proxy::start();
    let url = format!("http://{}/bytes/10", closed_port());
    let r = expect_error(&proxy, &get(&url), 502, "refused");
    assert!(r.text().contains("connection refused"), "{}", r.text());
}

#[test]
fn slow_upstream_response_is_504() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start_with(|c| c.timeouts.io = Duration::from_millis(300));
    let start = std::time::Instant::now();
    expect_error(&proxy, &get(&origin.url("/delay/2000")), 504, "timed out");
    let took = start.elapsed();
    assert!(took < Duration::from_millis(1500), "504 after {took:?}, expected ~300 ms");
}

#[test]
fn other_clients_keep_working_during_a_rejection() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let mut good = Conn::to_proxy(&proxy);
    good.send(&get(&origin.url("/bytes/100")));
    assert_eq!(good.read_response().body, pattern(100));
    // Another client: a head that is still arriving, then garbage.
    let mut bad = Conn::to_proxy(&proxy);
    bad.send(b"GET http://");
    good.send(&get(&origin.url("/bytes/200")));
    assert_eq!(good.read_response().body, pattern(200));
    bad.send(b"\x00\x01 nonsense\r\n\r\n");
    let (got, closed) = read_until_close(&mut bad.s);
    assert!(closed);
    assert_eq!(parse_response(&got).status, 400);
    good.send(&get(&origin.url("/bytes/300")));
    assert_eq!(good.read_response().body, pattern(300));
    assert_eq!(origin.connections(), 1);
}

/// A Content-Length above 2^53 - 1 is refused (413), never forwarded.
#[test]
fn content_length_beyond_2_53_is_413() {
    rejected(
        |a| head_at(a, "POST", "/sha256", "Content-Length: 9007199254740992\r\n"),
        413,
        "too large",
    );
}

/// A chunk size above 2^53 - 1 in a request body is refused: at once when it comes with
/// the head (the origin is never contacted), and when it comes later (the origin got the
/// head and nothing of the size line).
#[test]
fn chunk_size_beyond_2_53_in_a_request_is_400() {
    let huge = "ffffffffffffffff\r\n";
    rejected(
        |a| [head_at(a, "POST", "/sha256", "Transfer-Encoding: chunked\r\n"), huge.into()].concat(),
        400,
        "chunk size too large",
    );
    // An origin that reads until the proxy gives up on the request.
    let origin = RawOrigin::start(b"", |_| false);
    let proxy = Proxy::start();
    let mut c = Conn::to_proxy(&proxy);
    c.send(&head_at(origin.addr(), "POST", "/", "Transfer-Encoding: chunked\r\n"));
    // The head is at the origin (the request under way) before the bad chunk comes.
    let head_there = || origin.received_so_far().windows(4).any(|w| w == b"\r\n\r\n");
    assert!(wait_until(Duration::from_secs(5), head_there), "the head did not reach the origin");
    c.send(b"5\r\nhello\r\n20000000000000\r\n");
    let r = c.read_response();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("chunk size too large"), "{}", r.text());
    let seen = String::from_utf8(origin.received()).unwrap();
    assert!(seen.starts_with("POST / HTTP/1.1\r\n"), "{seen}");
    assert!(!seen.contains("20000000000000"), "{seen}");
}

/// From the origin, the same sizes are a 502 (to HTTP/1.1 and HTTP/1.0 clients), and
/// nothing of the body reaches the client.
#[test]
fn oversized_lengths_from_the_origin_are_502() {
    let answers: [&[u8]; 3] = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n20000000000000\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\nhello",
    ];
    let proxy = Proxy::start();
    for answer in answers {
        for version in ["1.1", "1.0"] {
            let origin = RawOrigin::answering(answer);
            let a = origin.addr();
            let req = format!("GET http://{a}/ HTTP/{version}\r\nHost: {a}\r\n\r\n");
            let got = raw(&proxy, req.as_bytes());
            let r = parse_response(&got);
            let what = String::from_utf8_lossy(&answer[..answer.len().min(80)]);
            assert_eq!(r.status, 502, "{what}: {}", String::from_utf8_lossy(&got));
            assert!(r.text().contains("too large"), "{what}: {}", r.text());
            assert!(!r.text().contains("hello"), "{what}");
        }
    }
}
