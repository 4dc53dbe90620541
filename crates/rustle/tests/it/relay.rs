//! The TCP port relay: every connection to the listener goes to its fixed target.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::process::{Command, Stdio};
use std::time::Duration;

use rustle::config::ListenerKind;
use rustle_bench::pattern::{pattern, pattern_sha256_hex};
use rustle_bench::{Origin, TcpEcho, TcpServe};

use crate::util::*;

fn relay_to(target: SocketAddr) -> Proxy {
    Proxy::with_listener(ListenerKind::Relay, Some(target), |_| {})
}

#[test]
fn curl_through_a_relay_gets_the_bytes_intact() {
    let origin = Origin::start().unwrap();
    let proxy = relay_to(origin.addr());
    let n = 5 * 1024 * 1024u64;
    let dir = TempDir::new("relay");
    let file = dir.file("body");
    let url = format!("http://{}/bytes/{n}", proxy.addr());
    let Some(out) = curl(&["-o", file.to_str().unwrap(), "-w", "%{http_code}", &url]) else {
        return;
    };
    assert_success("curl via relay", &out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    let body = std::fs::read(&file).unwrap();
    assert_eq!(sha256_hex(&body), pattern_sha256_hex(n));
    let line = proxy.log_line(|l| l.contains(" RELAY "));
    let f = LogLine::parse(&line);
    assert_eq!(f.target, format!("relay://{}", origin.addr()), "{line}");
    assert_eq!(f.upstream, origin.addr().to_string(), "{line}");
    assert!(f.down > n && f.up > 0, "{line}");
}

#[test]
fn keep_alive_through_a_relay_uses_one_origin_connection() {
    let origin = Origin::start().unwrap();
    let proxy = relay_to(origin.addr());
    let a = format!("http://{}/bytes/10", proxy.addr());
    let b = format!("http://{}/bytes/20", proxy.addr());
    let Some(out) = curl(&[&a, &b]) else { return };
    assert_success("curl keep-alive via relay", &out);
    let mut want = pattern(10);
    want.extend_from_slice(&pattern(20));
    assert_eq!(out.stdout, want);
    assert_eq!(origin.requests(), 2);
    assert_eq!(origin.connections(), 1, "curl's second request reused the connection");
    // A raw client: three requests on one connection.
    let mut c = Conn::open(proxy.addr());
    for n in [1usize, 1000, 70_000] {
        c.send(format!("GET /bytes/{n} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
        let r = c.read_response();
        assert_eq!(r.status, 200);
        assert!(r.body == pattern(n), "body of /bytes/{n}");
    }
    assert_eq!(origin.connections(), 2);
}

#[test]
fn half_close_through_a_relay_still_receives_the_whole_answer() {
    let payload = pattern(1024 * 1024);
    let server = TcpServe::start_with(payload.clone()).unwrap();
    let proxy = relay_to(server.addr());
    let mut s = connect(proxy.addr());
    s.write_all(b"request bytes").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let got = read_to_eof(&mut s);
    assert_eq!(got.len(), payload.len());
    assert!(got == payload, "payload corrupted");
    assert_eq!(server.bytes_in(), 13);
}

#[test]
fn echo_3mb_through_a_relay_is_exact() {
    let echo = TcpEcho::start().unwrap();
    let proxy = relay_to(echo.addr());
    let s = connect(proxy.addr());
    let n = 3 * 1024 * 1024;
    let data = pattern(n);
    let mut w = s.try_clone().unwrap();
    let to_send = data.clone();
    let writer = std::thread::spawn(move || {
        for piece in to_send.chunks(100_000) {
            w.write_all(piece).unwrap();
        }
        w.shutdown(Shutdown::Write).unwrap();
    });
    let mut s = s;
    let mut got = Vec::with_capacity(n);
    s.read_to_end(&mut got).expect("read from relay");
    writer.join().unwrap();
    assert_eq!(got.len(), n, "echoed length");
    assert!(got == data, "echoed bytes differ");
    let line = proxy.log_line(|l| l.contains(" RELAY "));
    let f = LogLine::parse(&line);
    assert_eq!((f.up, f.down), (n as u64, n as u64), "{line}");
}

#[test]
fn relay_to_a_closed_port_closes_the_client_and_logs_refused() {
    let target = closed_port();
    let proxy = relay_to(target);
    let mut s = connect(proxy.addr());
    let _ = s.write_all(b"hello?");
    let (got, closed) = read_until_close(&mut s);
    assert!(closed, "client connection left open");
    assert!(got.is_empty(), "{got:?}");
    let line = proxy.log_line(|l| l.contains(" RELAY "));
    assert!(line.contains("refused"), "{line}");
    assert!(line.contains(&format!("relay://{target}")), "{line}");
}

#[test]
fn the_binary_serves_a_relay_flag() {
    let origin = Origin::start().unwrap();
    let mut child = Command::new(rustle_bin())
        .args(["--relay", &format!("127.0.0.1:0={}", origin.addr()), "--workers", "1"])
        .args(["--log", "off"])
        .env("RUSTLE_CONFIG", "")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rustle");
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.split("listening on ").nth(1) {
                if let Some((addr, _)) = rest.split_once(" (relay)") {
                    let _ = tx.send(addr.trim().to_string());
                }
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(10));
    let result = std::panic::catch_unwind(|| {
        let addr: SocketAddr = addr.expect("rustle said where the relay listens").parse().unwrap();
        let mut c = Conn::open(addr);
        c.send(b"GET /bytes/4096 HTTP/1.1\r\nHost: x\r\n\r\n");
        let r = c.read_response();
        assert_eq!(r.status, 200);
        assert!(r.body == pattern(4096));
    });
    let _ = child.kill();
    let _ = child.wait();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    assert_eq!(origin.requests(), 1);
}
