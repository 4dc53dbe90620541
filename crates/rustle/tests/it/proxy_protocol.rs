//! PROXY protocol on listeners: v1 and v2 headers sent by hand through a raw socket to an
//! HTTP listener (and a SOCKS one); the access log and the rules see the client the header
//! carries; a source outside `proxy_protocol_from`, a missing header, a garbled one and an
//! incomplete one are refused; a header arriving in pieces is read as they come; https and
//! auto listeners take it before the TLS handshake or the protocol detection; a reload
//! puts new sources in force; haproxy (Debian) with
//! `send-proxy-v2` and `send-proxy` in front; a relay sending v1/v2 to a target that
//! decodes it (`target_proxy_protocol`), in clear before `target_tls`; parents (http,
//! https, socks5: rustle listeners decoding it) told each client, never one on a
//! connection pooled for another.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use rustle_bench::Origin;
use rustle_proto::proxy_protocol::{write_v1, write_v2};

use crate::util::*;

fn config(from: &str) -> String {
    format!(
        r#"
[[listener]]
listen = "127.0.0.1:0"
proxy_protocol = "any"
proxy_protocol_from = ["{from}"]
[[rule]]
name = "no-203"
action = "deny"
clients = ["203.0.113.0/24", "127.0.0.3"]
"#
    )
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// The header, then a GET of the origin, in one write; the whole answer.
fn exchange(proxy: &Proxy, header: &[u8], origin: &Origin) -> Vec<u8> {
    let mut bytes = header.to_vec();
    let req =
        format!("GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", origin.url("/bytes/5"));
    bytes.extend_from_slice(req.as_bytes());
    raw(proxy, &bytes)
}

#[test]
fn the_header_names_the_client() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&config("127.0.0.0/8"));
    let dst = proxy.addr();

    let mut v1 = Vec::new();
    write_v1(Some((sa("198.51.100.7:40001"), dst)), &mut v1);
    let answer = exchange(&proxy, &v1, &origin);
    assert_eq!(parse_response(&answer).status, 200, "{}", String::from_utf8_lossy(&answer));
    let line = LogLine::parse(&proxy.log_line(|l| l.contains("198.51.100.7")));
    assert!(line.client.starts_with("198.51.100.7"), "{line:?}");
    assert_eq!(line.status, 200);

    let mut v2 = Vec::new();
    write_v2(Some((sa("[2001:db8::42]:40002"), sa("[::1]:3128"))), &mut v2);
    let answer = exchange(&proxy, &v2, &origin);
    assert_eq!(parse_response(&answer).status, 200, "{}", String::from_utf8_lossy(&answer));
    let line = LogLine::parse(&proxy.log_line(|l| l.contains("2001:db8::42")));
    assert_eq!(line.status, 200, "{line:?}");

    // A rule on client addresses sees the carried one.
    let mut denied = Vec::new();
    write_v2(Some((sa("203.0.113.9:5000"), dst)), &mut denied);
    let answer = exchange(&proxy, &denied, &origin);
    assert_eq!(parse_response(&answer).status, 403, "{}", String::from_utf8_lossy(&answer));
    let line = LogLine::parse(&proxy.log_line(|l| l.contains("203.0.113.9")));
    assert_eq!(line.status, 403, "{line:?}");

    // LOCAL (a balancer's health check) and UNKNOWN: the balancer stays the client.
    let mut local = Vec::new();
    write_v2(None, &mut local);
    assert_eq!(parse_response(&exchange(&proxy, &local, &origin)).status, 200);
    let answer = exchange(&proxy, b"PROXY UNKNOWN\r\n", &origin);
    assert_eq!(parse_response(&answer).status, 200);
    let from_lo =
        proxy.log_lines_matching(2, |l| LogLine::parse(l).client.starts_with("127.0.0.1"));
    assert_eq!(from_lo.len(), 2, "{}", proxy.log_text());
}

/// The connection is closed without an answer, and the log says why.
fn refused(proxy: &Proxy, bytes: &[u8], why: &str) {
    let mut s = connect(proxy.addr());
    s.write_all(bytes).unwrap();
    let (answer, _) = read_until_close(&mut s);
    assert!(answer.is_empty(), "{why}: {}", String::from_utf8_lossy(&answer));
    proxy.log_line(|l| l.contains(why));
}

#[test]
fn no_header_a_bad_one_or_an_untrusted_source_is_refused() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&config("127.0.0.1"));
    let get = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/bytes/5"));
    refused(&proxy, get.as_bytes(), "no PROXY protocol header");
    refused(&proxy, b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", "malformed PROXY v1 line");
    refused(&proxy, b"PROXY TCP4 1.2.3.4 ::1 1 2\r\n", "bad address in PROXY v1 line");
    let mut v2 = Vec::new();
    write_v2(Some((sa("10.1.1.1:1"), sa("10.1.1.2:2"))), &mut v2);
    v2[12] = 0x22;
    refused(&proxy, &v2, "unsupported PROXY v2 command 2");
    assert!(proxy.log_text().lines().all(|l| !l.contains(" 200 ")), "{}", proxy.log_text());

    // Listening where only 10.9.9.9 may send the header: 127.0.0.1 is refused with its
    // header, and with none.
    let strict = Proxy::from_toml(&config("10.9.9.9"));
    let mut v1 = Vec::new();
    write_v1(Some((sa("198.51.100.7:1"), strict.addr())), &mut v1);
    v1.extend_from_slice(get.as_bytes());
    refused(&strict, &v1, "proxy_protocol_from");
    refused(&strict, get.as_bytes(), "proxy_protocol_from");
    assert!(!strict.log_text().contains("198.51.100.7"), "{}", strict.log_text());
}

#[test]
fn an_incomplete_header_times_out() {
    let proxy =
        Proxy::from_toml(&format!("[timeouts]\nhandshake = \"300ms\"\n{}", config("127.0.0.1")));
    let mut s = connect(proxy.addr());
    s.write_all(b"PROXY TCP4 1.2.3.4").unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(3)));
    proxy.log_line(|l| l.contains("within the handshake timeout"));
}

#[test]
fn a_header_in_pieces_is_read_as_its_bytes_arrive() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&config("127.0.0.1"));
    let mut v2 = Vec::new();
    write_v2(Some((sa("198.51.100.11:40001"), proxy.addr())), &mut v2);
    let mut s = connect(proxy.addr());
    // The signature alone, then the rest: the accept task sleeps between the pieces
    // (waiting on readability) and takes exactly the header.
    let started = std::time::Instant::now();
    for piece in [&v2[..5], &v2[5..14], &v2[14..]] {
        s.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    let req =
        format!("GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", origin.url("/bytes/5"));
    s.write_all(req.as_bytes()).unwrap();
    let (answer, _) = read_until_close(&mut s);
    assert_eq!(parse_response(&answer).status, 200, "{}", String::from_utf8_lossy(&answer));
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    proxy.log_line(|l| LogLine::parse(l).client.starts_with("198.51.100.11"));
}

#[test]
fn a_client_closing_after_part_of_a_header_is_refused_at_once() {
    let proxy =
        Proxy::from_toml(&format!("[timeouts]\nhandshake = \"5s\"\n{}", config("127.0.0.1")));
    let mut s = connect(proxy.addr());
    s.write_all(b"PROXY TCP4 1.2.3.4").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let started = std::time::Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(3)));
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    proxy.log_line(|l| l.contains("closed before a complete PROXY protocol header"));
}

/// A GET through `via` from the local address `from` (a 127.0.0.0/8 address of its own,
/// so that the client and haproxy differ); the status, None when closed without one.
fn get_from(from: &str, via: SocketAddr, origin: &Origin) -> Option<u16> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&sa(&format!("{from}:0")).into()).unwrap();
    sock.connect(&via.into()).unwrap();
    let mut s: std::net::TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req =
        format!("GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", origin.url("/bytes/5"));
    s.write_all(req.as_bytes()).unwrap();
    let (answer, _) = read_until_close(&mut s);
    (!answer.is_empty()).then(|| parse_response(&answer).status)
}

#[test]
fn behind_haproxy_send_proxy_v2() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&config("127.0.0.1"));
    for (i, send) in ["send-proxy-v2", "send-proxy"].into_iter().enumerate() {
        let Some(haproxy) = crate::util::peers::Haproxy::start(proxy.addr(), send) else {
            return;
        };
        assert_eq!(get_from("127.0.0.2", haproxy.addr(), &origin), Some(200), "{send}");
        let lines = proxy.log_lines_matching(i + 1, |l| l.contains("127.0.0.2"));
        let line = LogLine::parse(&lines[i]);
        assert!(line.client.starts_with("127.0.0.2"), "{send}: {line:?}");
        assert_eq!(line.status, 200);
        // A client rule sees the client haproxy names.
        assert_eq!(get_from("127.0.0.3", haproxy.addr(), &origin), Some(403), "{send}");
    }
    // The client connecting directly, from an address that is not the balancer's: refused.
    assert_eq!(get_from("127.0.0.2", proxy.addr(), &origin), None);
    proxy.log_line(|l| l.contains("127.0.0.2") && l.contains("proxy_protocol_from"));
}

/// A target that reads a PROXY protocol header then `n` bytes from its first connection,
/// and answers "ok".
fn decoding_target(
    n: usize,
) -> (SocketAddr, std::thread::JoinHandle<(rustle_proto::proxy_protocol::Header, Vec<u8>)>) {
    use std::io::Read;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 512];
        loop {
            let parsed = rustle_proto::proxy_protocol::parse(
                &got,
                rustle_proto::proxy_protocol::Accept::Any,
            )
            .expect("a valid PROXY header");
            if let Some((header, len)) = parsed {
                if got.len() >= len + n {
                    s.write_all(b"ok").unwrap();
                    return (header, got[len..].to_vec());
                }
            }
            let k = s.read(&mut chunk).unwrap();
            assert!(k > 0, "closed after {got:?}");
            got.extend_from_slice(&chunk[..k]);
        }
    });
    (addr, t)
}

#[test]
fn a_relay_sends_the_header_to_its_target() {
    use rustle_proto::proxy_protocol::{Addresses, Version};
    for (version, want) in [("v1", Version::V1), ("v2", Version::V2)] {
        let (target, decoded) = decoding_target(5);
        let proxy = Proxy::from_toml(&format!(
            "[[listener]]\nkind = \"relay\"\nlisten = \"127.0.0.1:0\"\ntarget = \"{target}\"\n\
             target_proxy_protocol = \"{version}\"\n"
        ));
        let mut s = connect(proxy.addr());
        let me = s.local_addr().unwrap();
        s.write_all(b"hello").unwrap();
        let (header, rest) = decoded.join().unwrap();
        assert_eq!(header.version, want);
        let Addresses::Inet { src, dst, .. } = header.addresses else { panic!("{header:?}") };
        assert_eq!((src, dst), (me, proxy.addr()));
        assert_eq!(rest, b"hello");
        assert_eq!(read_exact_n(&mut s, 2), b"ok");
    }
    // Behind a balancer too: the client its header named goes on to the target.
    let (target, decoded) = decoding_target(3);
    let proxy = Proxy::from_toml(&format!(
        "[[listener]]\nkind = \"relay\"\nlisten = \"127.0.0.1:0\"\ntarget = \"{target}\"\n\
         proxy_protocol = \"v1\"\nproxy_protocol_from = [\"127.0.0.1\"]\n\
         target_proxy_protocol = \"v2\"\n"
    ));
    let mut s = connect(proxy.addr());
    s.write_all(b"PROXY TCP4 198.51.100.7 10.0.0.1 4242 443\r\nabc").unwrap();
    let (header, rest) = decoded.join().unwrap();
    assert_eq!(header.addresses.source(), Some(sa("198.51.100.7:4242")));
    assert_eq!(rest, b"abc");
    assert_eq!(read_exact_n(&mut s, 2), b"ok");
}

#[test]
fn target_proxy_protocol_is_for_relays_and_one_version() {
    for (extra, want) in [
        ("kind = \"http\"\n", "is for relay listeners"),
        (
            "kind = \"relay\"\ntarget = \"127.0.0.1:9\"\ntarget_proxy_protocol = \"any\"\n",
            "one version",
        ),
    ] {
        let mut text = format!("[[listener]]\nlisten = \"127.0.0.1:0\"\n{extra}");
        if !text.contains("target_proxy_protocol") {
            text.push_str("target_proxy_protocol = \"v2\"\n");
        }
        let p = rustle::config::Config::parse(&text).expect_err(&text);
        assert!(p.iter().any(|p| p.to_string().contains(want)), "{want}: {p:?}");
    }
}

#[test]
fn a_reload_puts_new_sources_in_force() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&config("127.0.0.0/8"));
    let mut v1 = Vec::new();
    write_v1(Some((sa("198.51.100.8:1"), proxy.addr())), &mut v1);
    assert_eq!(parse_response(&exchange(&proxy, &v1, &origin)).status, 200);
    // Sources the running ones do not cover, or no header at all: less protected,
    // refused as start-up would refuse a listener without auth.
    for (text, why) in [
        (config("10.9.9.9"), "adds 10.9.9.9/32"),
        ("[[listener]]\nlisten = \"127.0.0.1:0\"\n".into(), "PROXY protocol header"),
    ] {
        let mut cfg = rustle::config::Config::parse(&text).unwrap();
        let old = proxy.running().config();
        cfg.workers = old.workers;
        cfg.log.access = old.log.access.clone();
        let refused = rustle::run::reload::apply(proxy.running(), &cfg).expect_err(why);
        assert!(refused.contains(why) && refused.contains("allow_less_protection"), "{refused}");
    }
    assert_eq!(parse_response(&exchange(&proxy, &v1, &origin)).status, 200);
    // Fewer sources: in force.
    proxy.reload_toml(&config("127.0.0.2"));
    let mut bytes = v1.clone();
    bytes.extend_from_slice(
        format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/bytes/5")).as_bytes(),
    );
    refused(&proxy, &bytes, "proxy_protocol_from");
}

#[test]
fn a_socks_listener_takes_the_header_too() {
    let echo = rustle_bench::TcpEcho::start().unwrap();
    let proxy = Proxy::from_toml(
        "[[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:0\"\nproxy_protocol = \"v2\"\n\
         proxy_protocol_from = [\"127.0.0.1\"]\n",
    );
    let mut bytes = Vec::new();
    write_v2(Some((sa("198.51.100.9:7"), proxy.addr())), &mut bytes);
    let SocketAddr::V4(to) = echo.addr() else { panic!("an IPv4 echo") };
    // Greeting (no auth) and CONNECT pipelined after the header.
    bytes.extend_from_slice(&[5, 1, 0, 5, 1, 0, 1]);
    bytes.extend_from_slice(&to.ip().octets());
    bytes.extend_from_slice(&to.port().to_be_bytes());
    bytes.extend_from_slice(b"ping");
    let mut s = connect(proxy.addr());
    s.write_all(&bytes).unwrap();
    let answer = read_exact_n(&mut s, 2 + 10 + 4);
    assert_eq!(&answer[..2], &[5, 0]);
    assert_eq!(answer[3], 0, "REP: {answer:?}");
    assert_eq!(&answer[12..], b"ping");
    drop(s);
    proxy.log_line(|l| LogLine::parse(l).client.starts_with("198.51.100.9"));
}

/// A rustls client trusting `ca`.
fn trusting(ca: &std::path::Path) -> std::sync::Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    std::sync::Arc::new(config)
}

#[test]
fn an_https_listener_takes_the_header_before_the_handshake() {
    use std::io::Read;
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("pp-https");
    let files = rustle::io::tls::write_self_signed("localhost", &dir.path().join("localhost"))
        .expect("self-signed set");
    let proxy = Proxy::from_toml(&format!(
        "[[listener]]\nkind = \"https\"\nlisten = \"127.0.0.1:0\"\nproxy_protocol = \"v2\"\n\
         proxy_protocol_from = [\"127.0.0.1\"]\n[listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        files.chain.display(),
        files.key.display()
    ));
    let mut sock = connect(proxy.addr());
    let mut header = Vec::new();
    write_v2(Some((sa("198.51.100.12:40001"), proxy.addr())), &mut header);
    sock.write_all(&header).unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(trusting(&files.ca), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    let req =
        format!("GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", origin.url("/bytes/5"));
    tls.write_all(req.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer);
    assert_eq!(parse_response(&answer).status, 200, "{}", String::from_utf8_lossy(&answer));
    let raw = proxy.log_line(|l| l.contains("198.51.100.12"));
    assert_eq!(LogLine::parse(&raw).status, 200, "{raw}");
    assert!(raw.contains("tls=TLSv1_3/"), "{raw}");
}

#[test]
fn an_auto_listener_takes_the_header_then_detects_the_protocol() {
    let origin = Origin::start().unwrap();
    let echo = rustle_bench::TcpEcho::start().unwrap();
    let proxy = Proxy::from_toml(
        "[[listener]]\nkind = \"auto\"\nlisten = \"127.0.0.1:0\"\nproxy_protocol = \"any\"\n\
         proxy_protocol_from = [\"127.0.0.1\"]\n",
    );
    // HTTP after a v1 line.
    let mut v1 = Vec::new();
    write_v1(Some((sa("198.51.100.13:1"), proxy.addr())), &mut v1);
    let answer = exchange(&proxy, &v1, &origin);
    assert_eq!(parse_response(&answer).status, 200, "{}", String::from_utf8_lossy(&answer));
    proxy.log_line(|l| LogLine::parse(l).client.starts_with("198.51.100.13"));
    // SOCKS5 after a v2 header.
    let mut bytes = Vec::new();
    write_v2(Some((sa("198.51.100.14:7"), proxy.addr())), &mut bytes);
    let SocketAddr::V4(to) = echo.addr() else { panic!("an IPv4 echo") };
    bytes.extend_from_slice(&[5, 1, 0, 5, 1, 0, 1]);
    bytes.extend_from_slice(&to.ip().octets());
    bytes.extend_from_slice(&to.port().to_be_bytes());
    bytes.extend_from_slice(b"ping");
    let mut s = connect(proxy.addr());
    s.write_all(&bytes).unwrap();
    let answer = read_exact_n(&mut s, 2 + 10 + 4);
    assert_eq!(answer[3], 0, "REP: {answer:?}");
    assert_eq!(&answer[12..], b"ping");
    drop(s);
    proxy.log_line(|l| LogLine::parse(l).client.starts_with("198.51.100.14"));
}

/// GETs of `url` through `via` on one kept-alive connection from `from`: the statuses.
fn gets_from(from: &str, via: SocketAddr, url: &str, n: usize) -> Vec<u16> {
    let mut c = Conn { s: connect_from(from, via), buf: Vec::new() };
    (0..n)
        .map(|_| {
            c.send(format!("GET {url} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
            c.read_response().status
        })
        .collect()
}

/// TCP connections in this network namespace established to `port` (the client sides),
/// from /proc/net/tcp and tcp6.
pub(crate) fn established_to(port: u16) -> usize {
    let mut n = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state)) = (fields.get(2), fields.get(3)) else { continue };
            let remote_port =
                remote.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
            if remote_port == Some(port) && *state == "01" {
                n += 1;
            }
        }
    }
    n
}

/// A proxy routing everything through the parent at `parent` (`kind`, sending a
/// `version` PROXY protocol header).
fn through(parent: SocketAddr, kind: &str, version: &str) -> Proxy {
    Proxy::from_toml(&format!(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n\
         [[parent]]\nname = \"p\"\nkind = \"{kind}\"\naddress = \"{parent}\"\n\
         proxy_protocol = \"{version}\"\n[[route]]\nname = \"all\"\nvia = \"p\"\n"
    ))
}

#[test]
fn a_parent_with_proxy_protocol_is_told_the_client() {
    let origin = Origin::start().unwrap();
    // The parent: a rustle taking v2 headers from the first one (on loopback).
    let parent = Proxy::from_toml(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nproxy_protocol = \"v2\"\n\
         proxy_protocol_from = [\"127.0.0.1\"]\n",
    );
    let front = through(parent.addr(), "http", "v2");
    let url = origin.url("/bytes/5");
    // Two clients, two requests each on a kept-alive connection: the parent sees each
    // client every time, never one on a connection pooled for the other.
    assert_eq!(gets_from("127.0.0.2", front.addr(), &url, 2), [200, 200]);
    assert_eq!(gets_from("127.0.0.3", front.addr(), &url, 2), [200, 200]);
    let seen = |who: &str| {
        parent.log_lines_matching(2, |l| LogLine::parse(l).client.starts_with(who)).len()
    };
    assert_eq!((seen("127.0.0.2"), seen("127.0.0.3")), (2, 2), "{}", parent.log_text());
    let text = parent.log_text();
    assert!(text.lines().all(|l| !LogLine::parse(l).client.starts_with("127.0.0.1")), "{text}");
    // Pinned to its client connection, not pooled: gone once the clients are.
    let port = parent.addr().port();
    wait_for(Duration::from_secs(5), "the front's connections to the parent closed", || {
        (established_to(port) == 0).then_some(())
    });

    // A SOCKS5 parent (a rustle socks listener), a CONNECT tunnel through it: logged there
    // when it ends, with the client.
    let echo = rustle_bench::TcpEcho::start().unwrap();
    let socks = Proxy::from_toml(
        "[[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:0\"\nproxy_protocol = \"v1\"\n\
         proxy_protocol_from = [\"127.0.0.1\"]\n",
    );
    let front = through(socks.addr(), "socks5", "v1");
    let mut c = Conn { s: connect_from("127.0.0.4", front.addr()), buf: Vec::new() };
    let to = echo.addr();
    c.send(format!("CONNECT {to} HTTP/1.1\r\nHost: {to}\r\n\r\n").as_bytes());
    assert_eq!(c.read_head().status, 200);
    c.send(b"ping");
    assert_eq!(c.take(4), b"ping");
    drop(c);
    socks.log_line(|l| LogLine::parse(l).client.starts_with("127.0.0.4"));

    // An https parent: the header in clear, then TLS, then the request.
    let dir = TempDir::new("pp-https-parent");
    let files = rustle::io::tls::write_self_signed("localhost", &dir.path().join("localhost"))
        .expect("self-signed set");
    let tls_parent = Proxy::from_toml(&format!(
        "[[listener]]\nkind = \"https\"\nlisten = \"127.0.0.1:0\"\nproxy_protocol = \"v2\"\n\
         proxy_protocol_from = [\"127.0.0.1\"]\n[listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        files.chain.display(),
        files.key.display()
    ));
    let front = Proxy::from_toml(&format!(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n\
         [[parent]]\nname = \"p\"\nkind = \"https\"\naddress = \"{}\"\n\
         server_name = \"localhost\"\nca = \"{}\"\nproxy_protocol = \"v2\"\n\
         [[route]]\nname = \"all\"\nvia = \"p\"\n",
        tls_parent.addr(),
        files.ca.display()
    ));
    assert_eq!(gets_from("127.0.0.7", front.addr(), &url, 1), [200]);
    let raw = tls_parent.log_line(|l| LogLine::parse(l).client.starts_with("127.0.0.7"));
    assert!(raw.contains("tls=TLSv1_3/"), "{raw}");

    // Behind a balancer: the parent is told the client the balancer's header carried.
    let balanced = Proxy::from_toml(&format!(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nproxy_protocol = \"v1\"\n\
         proxy_protocol_from = [\"127.0.0.1\"]\n\
         [[parent]]\nname = \"p\"\nkind = \"http\"\naddress = \"{}\"\nproxy_protocol = \"v2\"\n\
         [[route]]\nname = \"all\"\nvia = \"p\"\n",
        parent.addr()
    ));
    let mut v1 = Vec::new();
    write_v1(Some((sa("198.51.100.20:40020"), balanced.addr())), &mut v1);
    assert_eq!(parse_response(&exchange(&balanced, &v1, &origin)).status, 200);
    parent.log_line(|l| LogLine::parse(l).client == "198.51.100.20:40020");

    // A parent expecting v2 refuses a v1 header: the client gets the parent's failure.
    let wrong = through(parent.addr(), "http", "v1");
    assert_eq!(gets_from("127.0.0.5", wrong.addr(), &url, 1), [502]);
}

#[test]
fn a_relay_sends_the_header_in_clear_before_target_tls() {
    use rustle_proto::proxy_protocol::Addresses;
    use std::io::Read;
    let dir = TempDir::new("pp-target-tls");
    let files = rustle::io::tls::write_self_signed("target.test", &dir.path().join("t"))
        .expect("self-signed set");
    // The target: reads the header in clear, then does TLS and answers "ok" to "hello".
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let target = l.local_addr().unwrap();
    let chain = files.chain.clone();
    let key = files.key.clone();
    let decoded = std::thread::spawn(move || {
        use rustls::pki_types::pem::PemObject as _;
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        let (header, len) = loop {
            let mut byte = [0u8; 1];
            assert_eq!(s.read(&mut byte).unwrap(), 1, "closed after {got:?}");
            got.push(byte[0]);
            let parsed = rustle_proto::proxy_protocol::parse(
                &got,
                rustle_proto::proxy_protocol::Accept::Any,
            )
            .expect("a valid PROXY header");
            if let Some(found) = parsed {
                break found;
            }
        };
        assert_eq!(len, got.len());
        let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(&chain)
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&key).unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let conn = rustls::ServerConnection::new(std::sync::Arc::new(config)).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, s);
        let mut hello = [0u8; 5];
        tls.read_exact(&mut hello).unwrap();
        tls.write_all(b"ok").unwrap();
        tls.flush().unwrap();
        (header, hello)
    });
    let proxy = Proxy::from_toml(&format!(
        "[[listener]]\nkind = \"relay\"\nlisten = \"127.0.0.1:0\"\ntarget = \"{target}\"\n\
         target_proxy_protocol = \"v2\"\n[listener.target_tls]\nca = \"{}\"\n\
         server_name = \"target.test\"\n",
        files.ca.display()
    ));
    let mut s = connect_from("127.0.0.6", proxy.addr());
    let me = s.local_addr().unwrap();
    s.write_all(b"hello").unwrap();
    assert_eq!(read_exact_n(&mut s, 2), b"ok");
    let (header, hello) = decoded.join().unwrap();
    assert_eq!(&hello, b"hello");
    let Addresses::Inet { src, dst, .. } = header.addresses else { panic!("{header:?}") };
    assert_eq!((src, dst), (me, proxy.addr()));
}

#[test]
fn connections_waiting_for_their_header_count_against_the_limits() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&format!(
        "[limits]\nmax_connections_per_client = 3\n{}",
        config("127.0.0.1")
    ));
    // Four from the balancer's address, none sending its header: one is refused at once
    // (whichever the kernel hands over last), three wait.
    let mut conns: Vec<_> = (0..4).map(|_| connect(proxy.addr())).collect();
    proxy.log_line(|l| l.contains("waiting for their PROXY protocol header"));
    conns.retain_mut(|c| !closed_within(c, Duration::from_millis(200)));
    assert_eq!(conns.len(), 3, "{}", proxy.log_text());
    // Once a header names its client, the connection counts for that client: the
    // balancer's address has room for one more, and no more.
    let mut v1 = Vec::new();
    write_v1(Some((sa("198.51.100.30:40001"), proxy.addr())), &mut v1);
    let get = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/bytes/5"));
    v1.extend_from_slice(get.as_bytes());
    conns[0].write_all(&v1).unwrap();
    let mut head = [0u8; 12];
    std::io::Read::read_exact(&mut conns[0], &mut head).unwrap();
    assert_eq!(&head[9..12], b"200");
    let mut another = connect(proxy.addr());
    assert!(!closed_within(&mut another, Duration::from_millis(500)), "refused");
    let mut over = connect(proxy.addr());
    assert!(closed_within(&mut over, Duration::from_secs(2)), "over the limit again");
}

#[test]
fn refusals_of_untrusted_sources_are_logged_once_a_second() {
    let dir = TempDir::new("pp-untrusted");
    let cfg = dir.file("rustle.toml");
    std::fs::write(
        &cfg,
        "workers = 1\n[[listener]]\nlisten = \"127.0.0.1:0\"\nproxy_protocol = \"any\"\n\
         proxy_protocol_from = [\"10.9.9.9\"]\n",
    )
    .unwrap();
    let (bin, addr) = RustleProcess::start(&["--config", cfg.to_str().unwrap()]);
    for _ in 0..20 {
        // A byte, so that the kernel hands the connection over at once (TCP_DEFER_ACCEPT).
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"G").unwrap();
        assert!(closed_within(&mut s, Duration::from_secs(2)), "left open");
    }
    let text = "(proxy_protocol_from)";
    assert!(bin.wait_for_stderr(text, Duration::from_secs(2)), "{}", bin.stderr());
    std::thread::sleep(Duration::from_millis(200));
    let lines = bin.stderr().lines().filter(|l| l.contains(text)).count();
    assert!(lines <= 2, "{lines} lines for 20 refusals within a second or so:\n{}", bin.stderr());
}

#[test]
fn the_header_and_the_tls_handshake_share_one_deadline() {
    let dir = TempDir::new("pp-deadline");
    let files = rustle::io::tls::write_self_signed("localhost", &dir.path().join("localhost"))
        .expect("self-signed set");
    let proxy = Proxy::from_toml(&format!(
        "[timeouts]\nhandshake = \"1s\"\n\
         [[listener]]\nkind = \"https\"\nlisten = \"127.0.0.1:0\"\nproxy_protocol = \"v1\"\n\
         proxy_protocol_from = [\"127.0.0.1\"]\n[listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        files.chain.display(),
        files.key.display()
    ));
    let mut header = Vec::new();
    write_v1(Some((sa("198.51.100.13:40001"), proxy.addr())), &mut header);
    let mut sock = connect(proxy.addr());
    let started = std::time::Instant::now();
    // Most of the second on the header, then no handshake at all.
    sock.write_all(&header[..10]).unwrap();
    std::thread::sleep(Duration::from_millis(700));
    sock.write_all(&header[10..]).unwrap();
    assert!(closed_within(&mut sock, Duration::from_secs(3)));
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1500), "closed after {took:?}: 1 s in all");
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");
}
