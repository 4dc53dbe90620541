//! The floor forwarder (`rustle-bench floor`): bytes arrive whole and in
//! order both ways, half-closes pass through, answers that end with the
//! origin's FIN are not held back, and absolute-form requests reach the
//! origin as they are; with `--http`, every head is rewritten on its way.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{connect, send_all_then_read_to_eof, Reader};
use rustle_bench::floor::Floor;
use rustle_bench::origin::pattern;
use rustle_bench::{Origin, TcpEcho};

/// A floor in front of `target`, on a thread that lives as long as the test binary.
fn floor(target: SocketAddr) -> SocketAddr {
    floor_with(target, false)
}

/// An origin, a `--http` floor in front of it, and a client connection to the floor
/// (its write side and a reader).
fn http_floor() -> (Origin, TcpStream, Reader<TcpStream>) {
    let o = Origin::start().unwrap();
    let w = connect(floor_with(o.addr(), true));
    let s = Reader::new(w.try_clone().unwrap());
    (o, w, s)
}

fn floor_with(target: SocketAddr, http: bool) -> SocketAddr {
    let f = Floor::bind("127.0.0.1:0".parse().unwrap()).unwrap().http(http);
    let addr = f.addr().unwrap();
    std::thread::spawn(move || f.run(target));
    addr
}

#[test]
fn echoes_half_a_megabyte_both_ways_with_half_close() {
    let e = TcpEcho::start().unwrap();
    let f = floor(e.addr());
    let data = pattern(500_000);
    // Returns only if the client's FIN reached the echo and the echo's came back.
    let got = send_all_then_read_to_eof(f, &data);
    assert!(got == data, "{} bytes back of {}", got.len(), data.len());
    assert_eq!(e.bytes_in(), data.len() as u64);
}

#[test]
fn answers_ending_with_the_origins_close_arrive_whole() {
    let o = Origin::start().unwrap();
    let f = floor(o.addr());
    // Many rounds: the origin's FIN often lands with the last bytes, in one
    // edge. The client reads to EOF, so a FIN held back would stall it.
    for _ in 0..200 {
        let mut s = connect(f);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /bytes/1024 HTTP/1.1\r\nHost: o\r\nConnection: close\r\n\r\n").unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        assert!(got.starts_with(b"HTTP/1.1 200 "));
        assert!(got.ends_with(&pattern(1024)));
    }
}

#[test]
fn kept_alive_absolute_form_requests_reach_the_origin() {
    let o = Origin::start().unwrap();
    let f = floor(o.addr());
    let mut w = connect(f);
    let mut s = Reader::new(w.try_clone().unwrap());
    for n in [10usize, 100_000, 1] {
        let req = format!("GET {} HTTP/1.1\r\nHost: o\r\n\r\n", o.url(&format!("/bytes/{n}")));
        w.write_all(req.as_bytes()).unwrap();
        let r = s.response(false);
        assert_eq!(r.status, 200);
        assert!(r.body == pattern(n));
    }
    assert_eq!(o.connections(), 1);
    assert_eq!(o.requests(), 3);
}

#[test]
fn a_slow_reader_holds_the_forwarder_back_without_loss() {
    let o = Origin::start().unwrap();
    let f = floor(o.addr());
    let mut s = connect(f);
    let n = 40_000_000;
    let req = format!("GET /bytes/{n} HTTP/1.1\r\nHost: o\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    // Socket buffers fill while nobody reads: the forwarder must stop reading
    // the origin and resume once the client's side drains. (The scenario: a client that
    // does not read for a while.)
    std::thread::sleep(Duration::from_millis(300));
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    let body_at = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert_eq!(got.len() - body_at, n);
    assert!(got[body_at..] == pattern(n)[..]);
}

#[test]
fn a_refused_target_closes_the_client_each_time() {
    // A port that was just free: nothing listens there.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let f = floor(dead);
    for _ in 0..50 {
        let mut s = connect(f);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: o\r\n\r\n");
        let mut got = Vec::new();
        // EOF or a reset, and soon: never a read that times out.
        match s.read_to_end(&mut got) {
            Ok(_) => assert!(got.is_empty()),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
    }
}

/// `--http`: requests reach the origin in origin-form with the hop-by-hop fields gone,
/// bodies on both sides are counted past (a body that looks like a head is not
/// rewritten), and responses come back whole, over one origin connection.
#[test]
fn with_http_every_head_is_rewritten_and_bodies_pass_whole() {
    let (o, mut w, mut s) = http_floor();
    for n in [10usize, 100_000, 1] {
        let req = format!(
            "GET {} HTTP/1.1\r\nHost: o\r\nProxy-Connection: keep-alive\r\nX-Kept: {n}\r\n\r\n",
            o.url(&format!("/bytes/{n}"))
        );
        w.write_all(req.as_bytes()).unwrap();
        let r = s.response(false);
        assert_eq!(r.status, 200);
        assert!(r.body == pattern(n));
        let head = String::from_utf8(o.last_request_head()).unwrap();
        let want = format!("GET /bytes/{n} HTTP/1.1\r\nHost: {}\r\nX-Kept: {n}\r\n\r\n", o.addr());
        assert_eq!(head, want);
    }
    // A request body that itself reads like a request head goes through untouched,
    // also when it arrives on its own, after the head.
    let body = format!("GET {} HTTP/1.1\r\nHost: o\r\n\r\n", o.url("/x"));
    let req = format!(
        "POST {} HTTP/1.1\r\nHost: o\r\nContent-Length: {}\r\n\r\n",
        o.url("/echo"),
        body.len() * 2
    );
    w.write_all(format!("{req}{body}").as_bytes()).unwrap();
    // The scenario: the second half of the body in a read of its own.
    std::thread::sleep(Duration::from_millis(100));
    w.write_all(body.as_bytes()).unwrap();
    let r = s.response(false);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, format!("{body}{body}").as_bytes());
    assert_eq!(o.connections(), 1);
    assert_eq!(o.requests(), 4);
    // A client that asks to close is answered so, and closed after the answer.
    let req = format!("GET {} HTTP/1.1\r\nHost: o\r\nConnection: close\r\n\r\n", o.url("/bytes/5"));
    w.write_all(req.as_bytes()).unwrap();
    let r = s.response(false);
    assert_eq!((r.status, r.header("connection")), (200, Some("close")));
    assert!(r.body == pattern(5));
    let mut rest = Vec::new();
    s.s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{} bytes after the answer", rest.len());
}

/// `--http` loses track of the framing when a read holds the end of a body and the next
/// message: from then on everything passes as it is, so a later body that reads like a
/// head is not mistaken for one.
#[test]
fn with_http_a_read_past_a_body_turns_the_connection_opaque() {
    let (o, mut w, mut s) = http_floor();
    // The scenario: each write in a read of its own.
    let pause = || std::thread::sleep(Duration::from_millis(100));
    let echo = o.url("/echo");
    w.write_all(
        format!("POST {echo} HTTP/1.1\r\nHost: o\r\nContent-Length: 10\r\n\r\n01234").as_bytes(),
    )
    .unwrap();
    pause();
    let body = format!("GET {} HTTP/1.1\r\nHost: o\r\n\r\n", o.url("/x"));
    let second =
        format!("POST {echo} HTTP/1.1\r\nHost: o\r\nContent-Length: {}\r\n\r\n", body.len());
    w.write_all(format!("56789{second}").as_bytes()).unwrap();
    pause();
    w.write_all(body.as_bytes()).unwrap();
    let r = s.response(false);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"0123456789"[..]));
    let r = s.response(false);
    assert_eq!((r.status, r.body), (200, body.into_bytes()));
}
