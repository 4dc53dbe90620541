//! SOCKS4, SOCKS4a and SOCKS5: real clients (curl, ncat) and hand-written handshakes
//! against the `socks` and `auto` listeners: bytes intact, reply codes that name the real
//! cause, bad input closed and logged, BIND, and the default listeners.

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rustle::config::{Config, ListenerKind};
use rustle_bench::pattern::{pattern, pattern_sha256_hex};
use rustle_bench::{Origin, TcpEcho, TcpServe};

use crate::util::socks::*;
use crate::util::*;

/// Downloads `/bytes/n` from `url_host` (`127.0.0.1:PORT` or `localhost:PORT`) with curl
/// through the proxy given by `proxy_args`, and checks status, length and sha256.
fn curl_download(proxy_args: &[&str], url_host: &str, n: u64) {
    let dir = TempDir::new("socks-dl");
    let file = dir.file("body");
    let url = format!("http://{url_host}/bytes/{n}");
    let mut args: Vec<&str> = proxy_args.to_vec();
    args.extend(["-o", file.to_str().unwrap(), "-w", "%{http_code}", &url]);
    let Some(out) = curl(&args) else { return };
    assert_success(&format!("curl {proxy_args:?} {url}"), &out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "curl {proxy_args:?} {url}");
    let body = std::fs::read(&file).unwrap();
    assert_eq!(body.len() as u64, n, "curl {proxy_args:?} {url}: length");
    assert_eq!(sha256_hex(&body), pattern_sha256_hex(n), "curl {proxy_args:?} {url}: sha256");
}

const BIG: u64 = 50 * 1024 * 1024;

#[test]
fn curl_socks5_small_and_50mb() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::socks();
    let p = proxy.addr().to_string();
    let host = origin.addr().to_string();
    curl_download(&["--socks5", &p], &host, 1024);
    curl_download(&["--socks5", &p], &host, BIG);
    let line = proxy.log_line(|l| LogLine::parse(l).down > BIG);
    let f = LogLine::parse(&line);
    assert_eq!((f.method.as_str(), f.status), ("CONNECT", 0), "{line}");
    assert_eq!(f.target, format!("socks5://{host}"), "{line}");
}

#[test]
fn curl_socks5_hostname_resolves_on_the_proxy() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::socks();
    let p = proxy.addr().to_string();
    let host = format!("localhost:{}", origin.addr().port());
    curl_download(&["--socks5-hostname", &p], &host, 1024);
    let line = proxy.log_line(|l| l.contains(" CONNECT "));
    assert!(line.contains(&format!("socks5://{host}")), "the name went to the proxy: {line}");
    assert!(line.contains(&origin.addr().to_string()), "upstream address: {line}");
}

#[test]
fn curl_socks4_small() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::socks();
    let p = proxy.addr().to_string();
    let host = origin.addr().to_string();
    curl_download(&["--socks4", &p], &host, 1024);
    let line = proxy.log_line(|l| l.contains(" CONNECT "));
    assert!(line.contains(&format!("socks4://{host}")) && line.contains(" 90 "), "{line}");
}

#[test]
fn curl_socks4a_small_and_50mb() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::socks();
    let p = proxy.addr().to_string();
    let host = format!("localhost:{}", origin.addr().port());
    curl_download(&["--socks4a", &p], &host, 1024);
    curl_download(&["--socks4a", &p], &host, BIG);
    let line = proxy.log_line(|l| l.contains(" CONNECT "));
    assert!(line.contains(&format!("socks4://{host}")), "the name went to the proxy: {line}");
}

#[test]
fn curl_socks5_to_an_ipv6_origin() {
    if !ipv6_available() {
        return;
    }
    let origin = Origin::start_on("[::1]:0".parse().unwrap()).unwrap();
    let proxy = Proxy::socks();
    let p = proxy.addr().to_string();
    curl_download(&["--socks5", &p], &origin.addr().to_string(), 100_000);
    let line = proxy.log_line(|l| l.contains(" CONNECT "));
    assert!(line.contains(&format!("socks5://{}", origin.addr())), "{line}");
}

/// ncat through the proxy with `proxy_type` to a TcpEcho: what comes back is exactly what
/// was sent.
fn ncat_echo(proxy_type: &str) {
    let echo = TcpEcho::start().unwrap();
    let proxy = Proxy::socks();
    if !have("ncat") {
        return;
    }
    let data = pattern(300_000);
    let mut child = clean_command("timeout")
        .args([
            "20",
            "ncat",
            "--proxy",
            &proxy.addr().to_string(),
            "--proxy-type",
            proxy_type,
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
        // Dropping stdin: ncat half-closes, the echo server closes back.
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert_success(&format!("ncat --proxy-type {proxy_type}"), &out);
    assert_eq!(out.stdout.len(), data.len(), "ncat {proxy_type}: echoed length");
    assert!(out.stdout == data, "ncat {proxy_type}: echoed bytes differ");
    assert_eq!(echo.connections(), 1);
    assert_eq!(echo.bytes_in(), data.len() as u64);
}

#[test]
fn ncat_socks5_echo_is_exact() {
    ncat_echo("socks5");
}

#[test]
fn ncat_socks4_echo_is_exact() {
    ncat_echo("socks4");
}

#[test]
fn socks5_half_close_still_receives_the_whole_answer() {
    let payload = pattern(1024 * 1024);
    let server = TcpServe::start_with(payload.clone()).unwrap();
    let proxy = Proxy::socks();
    let mut s = connect5(proxy.addr(), &Dst::Addr(server.addr()));
    s.write_all(b"the question").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let got = read_to_eof(&mut s);
    assert_eq!(got.len(), payload.len());
    assert!(got == payload, "payload corrupted");
    assert_eq!(server.bytes_in(), 12);
    let line = proxy.log_line(|l| l.contains(" CONNECT "));
    assert!(line.contains(&format!(" 12 {} ", payload.len())), "byte counts: {line}");
}

/// Sends a SOCKS5 request (after a no-auth greeting), expects reply `code`, the
/// connection closed, and a log line with that status naming `cause`.
fn socks5_fails(proxy: &Proxy, request: &[u8], code: u8, cause: &str) {
    let mut s = connect(proxy.addr());
    assert_eq!(greet(&mut s, &[0]), 0);
    s.write_all(request).unwrap();
    let (rep, _) = read_reply5(&mut s);
    assert_eq!(rep, code, "reply code for {request:?}");
    assert!(closed_within(&mut s, Duration::from_secs(3)), "not closed after reply {code}");
    let line = proxy.log_line(|l| l.contains(&format!(" {code} ")) && l.ends_with('"'));
    assert!(line.to_ascii_lowercase().contains(cause), "log line should name `{cause}`: {line}");
}

#[test]
fn socks5_closed_port_is_05_refused() {
    let proxy = Proxy::socks();
    socks5_fails(&proxy, &request5(CONNECT, &Dst::Addr(closed_port())), 0x05, "refused");
}

#[test]
fn socks5_unresolvable_name_is_04() {
    let proxy = Proxy::socks();
    let req = request5(CONNECT, &Dst::Name("nonexistent.invalid", 80));
    socks5_fails(&proxy, &req, 0x04, "resolve");
    let line = proxy.log_line(|l| l.contains(" 4 "));
    assert!(line.contains("nonexistent.invalid"), "{line}");
}

#[test]
fn socks5_unknown_command_is_07() {
    let proxy = Proxy::socks();
    let req = request5(0x09, &Dst::Addr("127.0.0.1:80".parse().unwrap()));
    socks5_fails(&proxy, &req, 0x07, "command");
}

#[test]
fn socks5_unknown_address_type_is_08() {
    let proxy = Proxy::socks();
    socks5_fails(&proxy, &[5, 1, 0, 0x07, 1, 2, 3, 4, 0, 80], 0x08, "address type");
}

#[test]
fn socks5_connect_timeout_is_06() {
    let hole = black_hole();
    let proxy = Proxy::with_listener(ListenerKind::Socks, None, |c| {
        c.timeouts.connect = Duration::from_millis(300)
    });
    let start = Instant::now();
    socks5_fails(&proxy, &request5(CONNECT, &Dst::Addr(hole.addr)), 0x06, "timed out");
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(3), "{took:?}");
}

#[test]
fn socks5_empty_domain_gets_a_failure_reply() {
    let proxy = Proxy::socks();
    socks5_fails(&proxy, &[5, 1, 0, 3, 0, 0, 80], 0x01, "empty domain");
}

#[test]
fn socks4_closed_port_is_5b() {
    let proxy = Proxy::socks();
    let mut s = connect(proxy.addr());
    s.write_all(&request4(CONNECT, v4(closed_port()), "me", None)).unwrap();
    let (rep, _) = read_reply4(&mut s);
    assert_eq!(rep, 0x5B);
    assert!(closed_within(&mut s, Duration::from_secs(3)));
    let line = proxy.log_line(|l| l.contains(" 91 "));
    assert!(line.contains("refused") && line.contains("socks4://"), "{line}");
}

/// Sends `bytes`, expects the connection closed with nothing (or only `expect_reply`)
/// sent back, and a log line naming `cause`.
fn closed_with_log(proxy: &Proxy, bytes: &[u8], expect_reply: &[u8], cause: &str) {
    let mut s = connect(proxy.addr());
    s.write_all(bytes).unwrap();
    let (got, closed) = read_until_close(&mut s);
    assert!(closed, "connection left open after {bytes:?}");
    assert_eq!(got, expect_reply, "after {bytes:?}");
    let line = proxy.log_line(|l| l.to_ascii_lowercase().contains(cause));
    assert!(line.ends_with('"'), "{line}");
}

#[test]
fn unknown_version_byte_is_closed_and_logged() {
    let proxy = Proxy::socks();
    closed_with_log(&proxy, &[6, 1, 0], b"", "not a socks4 or socks5");
}

#[test]
fn greeting_with_no_methods_gets_ff_then_close() {
    let proxy = Proxy::socks();
    // RFC 1928: no acceptable method is answered X'FF', then the connection closes.
    closed_with_log(&proxy, &[5, 0], &[5, 0xFF], "no authentication methods");
}

/// A malformed RFC 1929 sub-negotiation gets its failure status (`01 01`) before the
/// close, on a listener that checks credentials and on one that accepts any.
#[test]
fn malformed_credentials_get_the_failure_status_then_close() {
    let checked = Proxy::from_toml(
        r#"
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
auth = true
[[auth.user]]
name = "alice"
password = "plain:secret"
"#,
    );
    let any = Proxy::start_with(|c| {
        let mut l = listener(ListenerKind::Socks, None);
        l.accept_any_credentials = true;
        c.listeners = vec![l];
    });
    let cases: [(&str, &[u8], &str); 3] = [
        ("auth version 2", b"\x02\x01a\x01b", "username/password auth version 2"),
        ("empty user", b"\x01\x00\x01b", "empty username"),
        ("empty password", b"\x01\x01a\x00", "empty password"),
    ];
    for proxy in [&checked, &any] {
        for (what, bytes, cause) in cases {
            let mut s = connect(proxy.addr());
            assert_eq!(greet(&mut s, &[2]), 2, "{what}");
            s.write_all(bytes).unwrap();
            let (got, closed) = read_until_close(&mut s);
            assert!(closed, "{what}: connection left open");
            assert_eq!(got, [1, 1], "{what}: no failure status");
            proxy.log_line(|l| l.contains(cause));
        }
    }
}

/// Every malformed SOCKS4 request gets the 0x5B reply before the close.
#[test]
fn malformed_socks4_requests_get_5b_then_close() {
    let proxy = Proxy::socks();
    let long_user = [&[4u8, 1, 0, 80, 127, 0, 0, 1][..], &[b'u'; 300]].concat();
    let cases: [(&str, Vec<u8>, &str); 3] = [
        ("command 3", vec![4, 3, 0, 80, 127, 0, 0, 1, 0], "unsupported command 3"),
        ("user id too long", long_user, "user id longer"),
        ("4a empty domain", vec![4, 1, 0, 80, 0, 0, 0, 1, 0, 0], "empty domain"),
    ];
    for (what, bytes, cause) in cases {
        let mut s = connect(proxy.addr());
        s.write_all(&bytes).unwrap();
        let (got, closed) = read_until_close(&mut s);
        assert!(closed, "{what}: connection left open");
        assert_eq!(got.len(), 8, "{what}: {got:?}");
        assert_eq!(got[..2], [0, 0x5B], "{what}: {got:?}");
        proxy.log_line(|l| l.contains(cause));
    }
}

#[test]
fn truncated_handshake_is_logged_and_the_proxy_keeps_serving() {
    let echo = TcpEcho::start().unwrap();
    let proxy = Proxy::socks();
    let mut s = connect(proxy.addr());
    assert_eq!(greet(&mut s, &[0]), 0);
    s.write_all(&[5, 1, 0, 1, 127]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let (got, closed) = read_until_close(&mut s);
    assert!(closed && got.is_empty(), "{got:?}");
    let line = proxy.log_line(|l| l.ends_with('"'));
    assert!(line.contains("closed"), "{line}");
    // A SOCKS4 request cut short, too.
    let mut s = connect(proxy.addr());
    s.write_all(&[4, 1, 0]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert!(read_until_close(&mut s).1);
    // Still serving.
    let mut s = connect5(proxy.addr(), &Dst::Addr(echo.addr()));
    s.write_all(b"ping").unwrap();
    assert_eq!(read_exact_n(&mut s, 4), b"ping");
}

/// The log line of a SOCKS handshake cut short must say what was cut: the handshake.
#[test]
fn truncated_handshake_log_line_names_the_handshake() {
    let proxy = Proxy::socks();
    let mut s = connect(proxy.addr());
    assert_eq!(greet(&mut s, &[0]), 0);
    s.write_all(&[5, 1, 0, 1, 127]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert!(read_until_close(&mut s).1);
    let line = proxy.log_line(|l| l.ends_with('"'));
    assert!(!line.contains("request body"), "a SOCKS handshake has no request body: {line}");
}

#[test]
fn optimistic_socks5_client_data_is_relayed() {
    // Greeting, request and the first tunnel bytes in one write, before any reply.
    let echo = TcpEcho::start().unwrap();
    let proxy = Proxy::socks();
    let mut s = connect(proxy.addr());
    let mut all = vec![5, 1, 0];
    all.extend_from_slice(&request5(CONNECT, &Dst::Addr(echo.addr())));
    all.extend_from_slice(b"early bytes");
    s.write_all(&all).unwrap();
    assert_eq!(read_exact_n(&mut s, 2), [5, 0]);
    assert_eq!(read_reply5(&mut s).0, 0);
    assert_eq!(read_exact_n(&mut s, 11), b"early bytes");
    s.shutdown(Shutdown::Write).unwrap();
    assert!(read_to_eof(&mut s).is_empty());
    // The same for SOCKS4a.
    let mut s = connect(proxy.addr());
    let mut all = request4(CONNECT, v4(echo.addr()), "u", Some("localhost"));
    all.extend_from_slice(b"early4");
    s.write_all(&all).unwrap();
    assert_eq!(read_reply4(&mut s).0, 0x5A);
    assert_eq!(read_exact_n(&mut s, 6), b"early4");
}

#[test]
fn stalled_handshake_is_closed_after_the_header_timeout() {
    let proxy = Proxy::with_listener(ListenerKind::Socks, None, |c| {
        c.timeouts.header = Duration::from_millis(300)
    });
    let mut s = connect(proxy.addr());
    let start = Instant::now();
    s.write_all(&[5, 1]).unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(3)), "stalled handshake left open");
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(1), "{took:?}");
    let line = proxy.log_line(|l| l.contains("timed out"));
    assert!(line.ends_with('"'), "{line}");
}

#[test]
fn username_password_only_is_refused_by_default() {
    let proxy = Proxy::socks();
    let mut s = connect(proxy.addr());
    assert_eq!(greet(&mut s, &[2]), 0xFF);
    assert!(closed_within(&mut s, Duration::from_secs(3)));
    proxy.log_line(|l| l.contains("no acceptable authentication"));
}

#[test]
fn username_password_is_accepted_with_accept_any_credentials() {
    let echo = TcpEcho::start().unwrap();
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start_with(|c| {
        let mut l = listener(ListenerKind::Socks, None);
        l.accept_any_credentials = true;
        c.listeners = vec![l];
    });
    // A client offering only username/password.
    let mut s = connect(proxy.addr());
    assert_eq!(greet(&mut s, &[2]), 2);
    s.write_all(b"\x01\x05alice\x0bsecretpass1").unwrap();
    assert_eq!(read_exact_n(&mut s, 2), [1, 0], "auth status");
    s.write_all(&request5(CONNECT, &Dst::Addr(echo.addr()))).unwrap();
    assert_eq!(read_reply5(&mut s).0, 0);
    s.write_all(b"hello").unwrap();
    assert_eq!(read_exact_n(&mut s, 5), b"hello");
    drop(s);
    // curl with credentials.
    let url = origin.url("/bytes/1000");
    let px = format!("socks5://bob:secretpass2@{}", proxy.addr());
    if let Some(out) = curl(&["-x", &px, &url]) {
        assert_success("curl socks5 with credentials", &out);
        assert_eq!(out.stdout, pattern(1000));
    }
    proxy.log_line(|l| l.contains(&echo.addr().to_string()));
    let log = proxy.log_text();
    assert!(!log.contains("secretpass"), "a password reached the log:\n{log}");
}

#[test]
fn socks5_bind_accepts_one_connection_from_the_named_host() {
    let proxy = Proxy::socks();
    let (mut s, rep, bound) = open5(proxy.addr(), BIND, &Dst::Addr("127.0.0.1:0".parse().unwrap()));
    assert_eq!(rep, 0, "first BIND reply");
    assert_eq!(bound.ip().to_string(), "127.0.0.1");
    assert_ne!(bound.port(), 0);
    let mut peer = connect(bound);
    let (rep, from) = read_reply5(&mut s);
    assert_eq!(rep, 0, "second BIND reply");
    assert_eq!(from, peer.local_addr().unwrap(), "the second reply names who connected");
    bind_data_flows(&mut s, &mut peer);
    let line = proxy.log_line(|l| l.contains(" BIND "));
    assert!(line.contains(&from.to_string()), "{line}");
}

/// Data both ways between the BIND client and the peer that connected, then half-closes.
fn bind_data_flows(client: &mut TcpStream, peer: &mut TcpStream) {
    client.write_all(b"from the client").unwrap();
    assert_eq!(read_exact_n(peer, 15), b"from the client");
    let big = pattern(200_000);
    peer.write_all(&big).unwrap();
    peer.shutdown(Shutdown::Write).unwrap();
    assert!(read_to_eof(client) == big, "peer → client bytes differ");
    client.write_all(b"last words").unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_to_eof(peer), b"last words");
}

/// A TCP connection to `to` from 127.0.0.2 (another loopback host on Linux); None, after
/// saying so, where that address cannot be bound.
fn connect_from_another_host(to: SocketAddr) -> Option<socket2::Socket> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    if sock.bind(&"127.0.0.2:0".parse::<SocketAddr>().unwrap().into()).is_err() {
        rustle_bench::tools::skip_host("cannot bind 127.0.0.2 here");
        return None;
    }
    sock.connect(&to.into()).unwrap();
    Some(sock)
}

/// After its one refusal reply, the BIND connection must carry nothing more and close.
fn nothing_more_then_closed(s: &mut TcpStream, after: &str) {
    let (extra, closed) = read_until_close(s);
    assert!(extra.is_empty(), "bytes after the {after}: {extra:02x?}");
    assert!(closed, "connection left open after the {after}");
}

#[test]
fn socks5_bind_refuses_a_connection_from_another_host() {
    let proxy = Proxy::socks();
    let (mut s, rep, bound) = open5(proxy.addr(), BIND, &Dst::Addr("127.0.0.1:0".parse().unwrap()));
    assert_eq!(rep, 0);
    let Some(_stranger) = connect_from_another_host(bound) else { return };
    let (rep, from) = read_reply5(&mut s);
    assert_eq!(rep, 0x02, "a stranger's connection must be refused (not allowed)");
    assert_eq!(from.ip().to_string(), "127.0.0.2");
    nothing_more_then_closed(&mut s, "second BIND reply (0x02)");
    let line = proxy.log_line(|l| l.contains(" BIND ") && l.contains("another host"));
    assert_eq!(LogLine::parse(&line).status, 2, "the logged reply code: {line}");
}

#[test]
fn socks4_bind_refuses_a_connection_from_another_host() {
    let proxy = Proxy::socks();
    let mut s = connect(proxy.addr());
    s.write_all(&request4(BIND, "127.0.0.1:0".parse().unwrap(), "", None)).unwrap();
    let (rep, bound) = read_reply4(&mut s);
    assert_eq!(rep, 0x5A);
    let Some(_stranger) = connect_from_another_host(SocketAddr::V4(bound)) else { return };
    let (rep, from) = read_reply4(&mut s);
    assert_eq!(rep, 0x5B, "a stranger's connection must be rejected");
    assert_eq!(from.ip().to_string(), "127.0.0.2");
    nothing_more_then_closed(&mut s, "second BIND reply (0x5B)");
    proxy.log_line(|l| l.contains(" BIND ") && l.contains("another host"));
}

#[test]
fn socks4_bind_accepts_one_connection() {
    let proxy = Proxy::socks();
    let mut s = connect(proxy.addr());
    s.write_all(&request4(BIND, "127.0.0.1:0".parse().unwrap(), "", None)).unwrap();
    let (rep, bound) = read_reply4(&mut s);
    assert_eq!(rep, 0x5A, "first BIND reply");
    assert_eq!(bound.ip().to_string(), "127.0.0.1");
    assert_ne!(bound.port(), 0);
    let mut peer = connect(SocketAddr::V4(bound));
    let (rep, from) = read_reply4(&mut s);
    assert_eq!(rep, 0x5A, "second BIND reply");
    assert_eq!(SocketAddr::V4(from), peer.local_addr().unwrap());
    bind_data_flows(&mut s, &mut peer);
    proxy.log_line(|l| l.contains(" BIND ") && l.contains("socks4://"));
}

#[test]
fn auto_listener_serves_http_socks4_and_socks5_on_one_port() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::with_listener(ListenerKind::Auto, None, |_| {});
    let p = proxy.addr().to_string();
    let http = format!("http://{p}");
    let host = origin.addr().to_string();
    for round in 0..3u64 {
        let n = 1000 + round;
        curl_download(&["-x", &http], &host, n);
        curl_download(&["--socks4", &p], &host, n);
        curl_download(&["--socks5", &p], &host, n);
        curl_download(
            &["--socks5-hostname", &p],
            &format!("localhost:{}", origin.addr().port()),
            n,
        );
    }
    assert_eq!(origin.requests(), 12);
    // Garbage and TLS are closed with a log line each.
    closed_with_log(&proxy, b"\x00\x01\x02garbage", b"", "unknown protocol");
    closed_with_log(&proxy, b"\x16\x03\x01\x00\x05hello", b"", "tls");
    // Still serving.
    curl_download(&["--socks5", &p], &host, 10);
}

/// HTTP, auto and SOCKS ports have the kernel hold a connection until its first bytes
/// arrive (TCP_DEFER_ACCEPT; HTTP and auto serve it without registering it first): a
/// client that waits before speaking, past the deferral, is still served, on each protocol.
#[test]
fn clients_that_wait_before_speaking_are_served() {
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let http = Proxy::start();
    let auto = Proxy::with_listener(ListenerKind::Auto, None, |_| {});
    // The scenario: each client waits this long before its first byte, past the
    // deferral (TCP_DEFER_ACCEPT, 1 s), and a while between requests.
    let wait = Duration::from_millis(1500);
    for proxy in [&http, &auto] {
        let mut c = Conn::to_proxy(proxy);
        std::thread::sleep(wait);
        c.send(&get(&origin.url("/bytes/10")));
        assert_eq!(c.read_response().body, pattern(10));
        // Kept alive: a second request after another pause.
        std::thread::sleep(Duration::from_millis(300));
        c.send(&get(&origin.url("/bytes/20")));
        assert_eq!(c.read_response().body, pattern(20));
    }
    // SOCKS5 on the auto port and on a SOCKS port (which defers its accepts too).
    let socks = Proxy::socks();
    for addr in [auto.addr(), socks.addr()] {
        let mut s = connect(addr);
        std::thread::sleep(wait);
        assert_eq!(greet(&mut s, &[0]), 0);
        s.write_all(&request5(CONNECT, &Dst::Addr(echo.addr()))).unwrap();
        assert_eq!(read_reply5(&mut s).0, 0);
        s.write_all(b"late but served").unwrap();
        assert_eq!(read_exact_n(&mut s, 15), b"late but served");
    }
    assert_eq!(origin.requests(), 4);
}

#[test]
fn default_listeners_are_auto_on_3128_and_socks_on_1080() {
    let l = Config::default().effective_listeners();
    let got: Vec<(ListenerKind, String)> =
        l.iter().map(|l| (l.kind, l.listen.to_string())).collect();
    assert_eq!(
        got,
        vec![
            (ListenerKind::Auto, "127.0.0.1:3128".to_string()),
            (ListenerKind::Socks, "127.0.0.1:1080".to_string())
        ]
    );
    assert!(l.iter().all(|l| l.target.is_none() && !l.accept_any_credentials));
    assert!(Config::default().check_listeners().is_ok());
}
