//! CONNECT tunnels.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::{Duration, Instant};

use rustle_bench::pattern::{pattern, pattern_sha256_hex};
use rustle_bench::{TcpEcho, TcpServe, TlsOrigin};

use crate::util::*;

/// Opens a tunnel to `target` (host:port) and returns the connection after the 200.
fn tunnel(proxy: &Proxy, target: &str) -> Conn {
    let mut c = Conn::to_proxy(proxy);
    c.send(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes());
    let r = c.read_head();
    assert_eq!(r.status, 200, "CONNECT {target}: {}", r.head_text());
    c
}

#[test]
fn curl_https_through_a_connect_tunnel() {
    let origin = TlsOrigin::start().unwrap();
    let proxy = Proxy::start();
    let ca = origin.ca_file();
    let n = 100_000u64;
    // The certificate names localhost; the proxy resolves the name itself.
    let url = format!("https://localhost:{}/bytes/{n}", origin.addr().port());
    let dir = TempDir::new("tls");
    let file = dir.file("body");
    let Some(out) = curl(&[
        "-x",
        &proxy.url(),
        "--cacert",
        ca.to_str().unwrap(),
        "-o",
        file.to_str().unwrap(),
        "-w",
        "%{http_code}",
        &url,
    ]) else {
        return;
    };
    assert_success("curl https", &out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    let body = std::fs::read(&file).unwrap();
    assert_eq!(sha256_hex(&body), pattern_sha256_hex(n));
    assert_eq!(origin.requests(), 1);
    let line = proxy.log_line(|l| l.contains("CONNECT"));
    assert!(line.contains(&format!("localhost:{}", origin.addr().port())), "{line}");
    assert!(line.contains(" 200 "), "{line}");
}

#[test]
fn ncat_through_the_proxy_reaches_an_echo_server() {
    let echo = TcpEcho::start().unwrap();
    let proxy = Proxy::start();
    if !have("ncat") {
        return;
    }
    let data = pattern(200_000);
    let mut child = clean_command("timeout")
        .args([
            "20",
            "ncat",
            "--proxy",
            &proxy.addr().to_string(),
            "--proxy-type",
            "http",
            "127.0.0.1",
            &echo.addr().port().to_string(),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let to_send = data.clone();
    let writer = std::thread::spawn(move || {
        stdin.write_all(&to_send).unwrap();
        // Dropping stdin: ncat half-closes the tunnel, the echo server closes back.
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert_success("ncat", &out);
    assert_eq!(out.stdout.len(), data.len());
    assert!(out.stdout == data, "echoed bytes differ");
    assert_eq!(echo.connections(), 1);
}

#[test]
fn half_close_client_still_receives_the_whole_answer() {
    let payload = pattern(1024 * 1024);
    let server = TcpServe::start_with(payload.clone()).unwrap();
    let proxy = Proxy::start();
    let mut c = tunnel(&proxy, &server.addr().to_string());
    c.send(b"some request bytes");
    c.s.shutdown(Shutdown::Write).unwrap();
    let (rest, closed) = read_until_close(&mut c.s);
    c.buf.extend_from_slice(&rest);
    assert!(closed, "no EOF after the payload");
    assert_eq!(c.buf.len(), payload.len());
    assert!(c.buf == payload, "payload corrupted");
    assert_eq!(server.bytes_in(), 18);
}

#[test]
fn half_close_echo_returns_exactly_what_was_sent() {
    let echo = TcpEcho::start().unwrap();
    let proxy = Proxy::start();
    let c = tunnel(&proxy, &echo.addr().to_string());
    assert!(c.buf.is_empty());
    let n = 3 * 1024 * 1024;
    let data = pattern(n);
    let mut w = c.s.try_clone().unwrap();
    let to_send = data.clone();
    let writer = std::thread::spawn(move || {
        for piece in to_send.chunks(100_000) {
            w.write_all(piece).unwrap();
        }
        w.shutdown(Shutdown::Write).unwrap();
    });
    let mut s = c.s;
    let mut got = Vec::with_capacity(n);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let k = s.read(&mut buf).expect("read from tunnel");
        if k == 0 {
            break;
        }
        got.extend_from_slice(&buf[..k]);
    }
    writer.join().unwrap();
    assert_eq!(got.len(), n, "echoed length");
    assert!(got == data, "echoed bytes differ");
}

/// Sends a CONNECT to `target` and returns the response (read until close) after checking
/// that the proxy closed the connection with nothing after the error response.
fn failed_connect(proxy: &Proxy, target: &str) -> Resp {
    let mut c = Conn::to_proxy(proxy);
    c.send(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes());
    let r = c.read_response();
    c.assert_closed();
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert!(r.text().ends_with('\n') && r.text().lines().count() == 1, "{:?}", r.text());
    r
}

#[test]
fn connect_to_a_closed_port_is_502_refused() {
    let proxy = Proxy::start();
    let target = closed_port();
    let r = failed_connect(&proxy, &target.to_string());
    assert_eq!(r.status, 502);
    assert!(r.text().contains("refused"), "{}", r.text());
    let line = proxy.log_line(|l| l.contains("CONNECT"));
    assert!(line.contains(" 502 ") && line.contains("refused"), "{line}");
}

#[test]
fn connect_to_an_unresolvable_name_is_502() {
    let proxy = Proxy::start();
    let r = failed_connect(&proxy, "nonexistent.invalid:80");
    assert_eq!(r.status, 502);
    let text = r.text();
    assert!(text.contains("resolve") && text.contains("nonexistent.invalid"), "{text}");
}

#[test]
fn connect_timeout_is_504() {
    let hole = black_hole();
    let addr = hole.addr;
    let proxy = Proxy::start_with(|c| c.timeouts.connect = Duration::from_millis(300));
    let start = Instant::now();
    let r = failed_connect(&proxy, &addr.to_string());
    let took = start.elapsed();
    assert_eq!(r.status, 504, "{}", r.text());
    assert!(r.text().contains("timed out"), "{}", r.text());
    assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(3), "{took:?}");
}

/// The tunnel idle timeout (swept by the worker, up to one 100 ms tick late): a quiet
/// tunnel is closed after it, with a log line naming the cause; a tunnel that keeps
/// talking outlives it.
#[test]
fn idle_tunnels_are_closed_and_busy_ones_are_not() {
    let echo = TcpEcho::start().unwrap();
    let proxy = Proxy::start_with(|c| c.timeouts.tunnel_idle = Duration::from_millis(400));
    let target = echo.addr().to_string();

    let mut busy = tunnel(&proxy, &target);
    let mut quiet = tunnel(&proxy, &target);
    let start = Instant::now();
    // Busy: a message every 100 ms for 1.2 s, three times the idle timeout.
    for i in 0..12u8 {
        busy.send(&[i; 10]);
        assert_eq!(busy.take(10), vec![i; 10], "busy tunnel, message {i}");
        // The scenario: a tunnel that talks every 100 ms, a quarter of the idle timeout.
        std::thread::sleep(Duration::from_millis(100));
    }
    // Quiet: closed long ago (its timeout passed while the busy one talked).
    assert!(closed_within(&mut quiet.s, Duration::from_secs(1)), "quiet tunnel still open");
    let line = proxy.log_line(|l| l.contains("CONNECT") && l.contains("timed out"));
    assert!(line.contains(&target), "{line}");
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(1200), "{took:?}");
    // The busy one still works, then goes quiet and is closed in turn.
    busy.send(b"last");
    assert_eq!(busy.take(4), b"last");
    let quiet_from = Instant::now();
    assert!(closed_within(&mut busy.s, Duration::from_secs(2)), "busy tunnel never closed");
    let waited = quiet_from.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(1000),
        "closed {waited:?} after its last byte, timeout 400 ms"
    );
}
