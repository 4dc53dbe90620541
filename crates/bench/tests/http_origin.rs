//! Drives every plain-HTTP origin route with a raw std::net client.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::net::Shutdown;
use std::time::{Duration, Instant};

use common::{connect, exchange, get, sha256_hex, Reader};
use rustle_bench::origin::{malformed_response, pattern, pattern_sha256_hex, Origin};

#[test]
fn bytes_route_keep_alive_and_counters() {
    let o = Origin::start().unwrap();
    let mut r = Reader::new(connect(o.addr()));
    for n in [0usize, 1, 100, 100_000] {
        let req = format!("GET /bytes/{n} HTTP/1.1\r\nHost: x\r\n\r\n");
        r.s.write_all(req.as_bytes()).unwrap();
        let resp = r.response(false);
        assert_eq!(resp.status, 200);
        assert_eq!(resp.header("content-length"), Some(n.to_string().as_str()));
        assert_eq!(resp.body, pattern(n));
        assert_eq!(sha256_hex(&resp.body), pattern_sha256_hex(n as u64));
    }
    assert_eq!(o.requests(), 4);
    assert_eq!(o.connections(), 1);
    assert!(o.last_request_head().starts_with(b"GET /bytes/100000 HTTP/1.1\r\n"));
}

#[test]
fn large_bytes_stream() {
    let o = Origin::start().unwrap();
    let n = 20 * 1024 * 1024 + 7;
    let resp = get(o.addr(), &format!("/bytes/{n}"));
    assert_eq!(resp.body.len(), n);
    assert_eq!(sha256_hex(&resp.body), pattern_sha256_hex(n as u64));
}

#[test]
fn pipelined_requests() {
    let o = Origin::start().unwrap();
    let mut r = Reader::new(connect(o.addr()));
    let req = "GET /bytes/10 HTTP/1.1\r\nHost: x\r\n\r\nGET /status/404 HTTP/1.1\r\nHost: x\r\n\r\n\
               POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET /bytes/5 HTTP/1.1\r\n\r\n";
    r.s.write_all(req.as_bytes()).unwrap();
    assert_eq!(r.response(false).body, pattern(10));
    assert_eq!(r.response(false).status, 404);
    assert_eq!(r.response(false).body, b"abc");
    assert_eq!(r.response(false).body, pattern(5));
    assert_eq!(o.requests(), 4);
}

#[test]
fn chunked_route_with_trailer() {
    let o = Origin::start().unwrap();
    let resp = get(o.addr(), "/chunked/10000?size=3000");
    assert_eq!(resp.header("transfer-encoding"), Some("chunked"));
    assert_eq!(resp.header("content-length"), None);
    assert_eq!(resp.chunk_sizes, vec![3000, 3000, 3000, 1000]);
    assert_eq!(resp.body, pattern(10000));
    assert_eq!(resp.trailers, vec!["X-Trailer: done".to_string()]);
    // Default chunk size, and an exact wire check of a tiny one.
    assert!(get(o.addr(), "/chunked/10000").chunk_sizes.iter().all(|&s| s <= 4096));
    let mut s = connect(o.addr());
    s.write_all(b"GET /chunked/3?size=2 HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
    let raw = Reader::new(s).read_to_eof();
    let expected = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Trailer\r\nConnection: close\r\n\r\n\
                     2\r\n\x00\x01\r\n1\r\n\x02\r\n0\r\nX-Trailer: done\r\n\r\n";
    assert_eq!(raw, expected);
}

#[test]
fn close_delimited_route() {
    let o = Origin::start().unwrap();
    let resp = get(o.addr(), "/close/50000");
    assert_eq!(resp.header("connection"), Some("close"));
    assert_eq!(resp.header("content-length"), None);
    assert_eq!(resp.header("transfer-encoding"), None);
    assert_eq!(resp.body, pattern(50000));
}

#[test]
fn echo_with_content_length_and_chunked() {
    let o = Origin::start().unwrap();
    let resp = exchange(
        o.addr(),
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello world",
    );
    assert_eq!(resp.head, b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n".to_vec());
    assert_eq!(resp.body, b"hello world");

    let req = b"PUT /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
                5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-T: 1\r\n\r\n";
    let resp = exchange(o.addr(), req);
    assert_eq!(resp.header("transfer-encoding"), Some("chunked"));
    assert_eq!(resp.body, b"hello world");

    // A large body, written while reading the echo on another thread.
    let body = pattern(3_000_000);
    let mut s = connect(o.addr());
    let mut w = s.try_clone().unwrap();
    let sent = body.clone();
    let writer = std::thread::spawn(move || {
        let head = format!("POST /echo HTTP/1.1\r\nContent-Length: {}\r\n\r\n", sent.len());
        w.write_all(head.as_bytes()).unwrap();
        w.write_all(&sent).unwrap();
    });
    let resp = Reader::new(&mut s).response(false);
    writer.join().unwrap();
    assert_eq!(resp.body.len(), body.len());
    assert!(resp.body == body);
}

#[test]
fn expect_100_continue() {
    let o = Origin::start().unwrap();
    let mut r = Reader::new(connect(o.addr()));
    r.s.write_all(
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n",
    )
    .unwrap();
    // The interim response must arrive before any body byte is sent.
    assert_eq!(r.head(), b"HTTP/1.1 100 Continue\r\n\r\n");
    r.s.write_all(b"ping").unwrap();
    let resp = r.response(false);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, b"ping");
}

#[test]
fn sha256_route() {
    let o = Origin::start().unwrap();
    let body = pattern(100_000);
    let mut req =
        format!("POST /sha256 HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    req.extend_from_slice(&body);
    let resp = exchange(o.addr(), &req);
    assert_eq!(resp.header("content-type"), Some("text/plain"));
    let expected = format!("{} 100000", pattern_sha256_hex(100_000));
    assert_eq!(String::from_utf8(resp.body).unwrap(), expected);
    let resp = exchange(o.addr(), b"GET /sha256 HTTP/1.1\r\n\r\n");
    assert_eq!(resp.status, 405);
}

#[test]
fn head_requests_have_no_body() {
    let o = Origin::start().unwrap();
    let mut r = Reader::new(connect(o.addr()));
    r.s.write_all(b"HEAD /bytes/1000 HTTP/1.1\r\n\r\nGET /bytes/3 HTTP/1.1\r\n\r\n").unwrap();
    let head = r.response(true);
    assert_eq!(head.head, b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n".to_vec());
    // If HEAD had leaked a body, this would read pattern bytes instead.
    assert_eq!(r.response(false).body, pattern(3));
    r.s.write_all(b"HEAD /chunked/100 HTTP/1.1\r\n\r\nHEAD /status/404 HTTP/1.1\r\n\r\nGET /bytes/1 HTTP/1.1\r\n\r\n")
        .unwrap();
    assert_eq!(r.response(true).header("transfer-encoding"), Some("chunked"));
    assert_eq!(r.response(true).header("content-length"), Some("11"));
    assert_eq!(r.response(false).body, pattern(1));
}

#[test]
fn status_route() {
    let o = Origin::start().unwrap();
    let mut r = Reader::new(connect(o.addr()));
    r.s.write_all(b"GET /status/204 HTTP/1.1\r\n\r\nGET /status/304 HTTP/1.1\r\n\r\nGET /status/503 HTTP/1.1\r\n\r\n")
        .unwrap();
    assert_eq!(r.head(), b"HTTP/1.1 204 No Content\r\n\r\n");
    assert_eq!(r.head(), b"HTTP/1.1 304 Not Modified\r\n\r\n");
    let resp = r.response(false);
    assert_eq!(resp.status, 503);
    assert_eq!(resp.body, b"status 503\n");
    assert_eq!(get(o.addr(), "/status/302").header("location"), Some("/"));
    assert_eq!(get(o.addr(), "/status/99").status, 400);
    assert_eq!(get(o.addr(), "/nope").status, 404);
}

#[test]
fn headers_route_returns_raw_head() {
    let o = Origin::start().unwrap();
    let req = b"GET /headers HTTP/1.1\r\nHost: example.test\r\nX-Odd-Case: Value  \r\nVia: 1.1 rustle\r\n\r\n";
    let resp = exchange(o.addr(), req);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, req.to_vec());
    assert_eq!(o.last_request_head(), req.to_vec());
}

#[test]
fn delay_route() {
    let o = Origin::start().unwrap();
    let t = Instant::now();
    let resp = get(o.addr(), "/delay/150");
    assert!(t.elapsed() >= Duration::from_millis(150));
    assert_eq!(resp.body, b"ok");
}

#[test]
fn malformed_kinds_write_exact_bytes() {
    let o = Origin::start().unwrap();
    let kinds = [
        "cl-and-te",
        "two-cl",
        "bad-chunk",
        "obs-fold",
        "bare-lf",
        "garbage",
        "truncated",
        "no-response",
    ];
    for kind in kinds {
        let mut s = connect(o.addr());
        s.write_all(format!("GET /malformed/{kind} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .unwrap();
        let raw = Reader::new(s).read_to_eof();
        assert_eq!(raw, malformed_response(kind).unwrap(), "kind {kind}");
    }
    assert_eq!(
        malformed_response("bad-chunk").unwrap().windows(4).filter(|w| w == b"zz\r\n").count(),
        1
    );
    assert!(!malformed_response("bare-lf").unwrap().contains(&b'\r'));
    assert_eq!(get(o.addr(), "/malformed/unknown").status, 404);
}

#[test]
fn bad_requests_are_rejected() {
    let o = Origin::start().unwrap();
    let resp = exchange(
        o.addr(),
        b"POST /echo HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    );
    assert_eq!(resp.status, 400);
    let resp = exchange(
        o.addr(),
        b"POST /echo HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
    );
    assert_eq!(resp.status, 400);
}

#[test]
fn connection_close_and_http10() {
    let o = Origin::start().unwrap();
    let mut s = connect(o.addr());
    s.write_all(b"GET /bytes/4 HTTP/1.0\r\n\r\n").unwrap();
    let raw = Reader::new(s).read_to_eof();
    assert_eq!(
        raw,
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\n\x00\x01\x02\x03"
    );
}

#[test]
fn ipv6_and_drop_closes() {
    let o = match Origin::start_on("[::1]:0".parse().unwrap()) {
        Ok(o) => o,
        Err(e) => {
            rustle_bench::tools::skip_host(&format!("no IPv6 loopback ({e})"));
            Origin::start().unwrap()
        }
    };
    let addr = o.addr();
    // Use the connection once so it is accepted (an un-accepted one would
    // be reset with the listener rather than closed), then leave it idle.
    let mut r = Reader::new(connect(addr));
    r.s.write_all(b"GET /bytes/2 HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(r.response(false).body, pattern(2));
    drop(o);
    // The idle keep-alive connection is closed and the listener is gone.
    assert!(r.read_to_eof().is_empty());
    assert!(std::net::TcpStream::connect(addr).is_err());
}

#[test]
fn client_half_close_still_gets_response() {
    let o = Origin::start().unwrap();
    let mut s = connect(o.addr());
    s.write_all(b"GET /bytes/100 HTTP/1.1\r\n\r\n").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut r = Reader::new(s);
    assert_eq!(r.response(false).body, pattern(100));
    assert!(r.read_to_eof().is_empty());
}

#[test]
fn curl_against_origin() {
    if !rustle_bench::tools::need("curl") {
        return;
    }
    let out = std::process::Command::new("curl").arg("--version").output().unwrap();
    assert!(out.status.success());
    let o = Origin::start().unwrap();
    let out = std::process::Command::new("curl")
        .args(["-sS", "--fail", &o.url("/bytes/123456")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, pattern(123456));
    let out = std::process::Command::new("curl")
        .args(["-sS", "--fail", "--data-binary", "posted", &o.url("/echo")])
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"posted");
    let out = std::process::Command::new("curl")
        .args(["-sS", "--fail", &o.url("/chunked/5000?size=7")])
        .output()
        .unwrap();
    assert_eq!(out.stdout, pattern(5000));
}
