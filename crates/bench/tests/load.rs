//! The load generator against the in-process fixtures, with tiny in-test
//! relays and proxies (std threads) for the proxied modes.
#![allow(clippy::unwrap_used)]

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use rustle_bench::load::{self, ErrorKind, Mode, Options, Report};
use rustle_bench::{Origin, TlsOrigin};

fn opts(mode: Mode, target: SocketAddr) -> Options {
    let mut o = Options::new(mode, target.to_string());
    o.connections = 4;
    o.duration = Duration::from_secs(1);
    o.warmup = Duration::ZERO;
    o.timeout = Duration::from_secs(5);
    o
}

fn assert_clean(r: &Report) {
    assert_eq!(r.errors.total(), 0, "{}", r.human());
    assert!(r.completed > 0, "{}", r.human());
    let l = r.latency_us;
    assert!(l.p50 <= l.p90 && l.p90 <= l.p99 && l.p99 <= l.p99_9 && l.p99_9 <= l.max, "{l:?}");
    assert!(l.p50 > 0);
}

#[test]
fn closed_loop_count_matches_origin() {
    let origin = Origin::start().unwrap();
    let mut o = opts(Mode::Direct, origin.addr());
    o.threads = 2;
    let r = load::run(&o).unwrap();
    assert_clean(&r);
    assert_eq!(r.completed, origin.requests());
    assert_eq!(origin.connections(), 4);
    assert!(r.bytes > r.completed * 1024);
    assert!(r.elapsed >= Duration::from_secs(1) && r.elapsed < Duration::from_secs(2));
    assert_eq!(r.threads, 2);
}

#[test]
fn open_loop_hits_the_rate() {
    let origin = Origin::start().unwrap();
    let mut o = opts(Mode::Direct, origin.addr());
    o.rate = Some(500.0);
    o.connections = 8;
    let r = load::run(&o).unwrap();
    assert_clean(&r);
    assert!((450..=550).contains(&r.completed), "{}", r.human());
    assert_eq!(r.completed, origin.requests());
}

#[test]
fn close_mode_uses_a_connection_per_request() {
    let origin = Origin::start().unwrap();
    let mut o = opts(Mode::Direct, origin.addr());
    o.close = true;
    let r = load::run(&o).unwrap();
    assert_clean(&r);
    assert_eq!(r.completed, origin.requests());
    assert_eq!(r.completed, origin.connections());
}

#[test]
fn upload_posts_to_sha256() {
    let origin = Origin::start().unwrap();
    let mut o = opts(Mode::Direct, origin.addr());
    o.upload = 100_000;
    let r = load::run(&o).unwrap();
    assert_clean(&r);
    assert_eq!(r.completed, origin.requests());
    let head = String::from_utf8_lossy(&origin.last_request_head()).to_string();
    assert!(head.starts_with("POST /sha256 HTTP/1.1\r\n"), "{head}");
    assert!(head.contains("Content-Length: 100000\r\n"), "{head}");
}

#[test]
fn chunked_bodies_are_framed() {
    let origin = Origin::start().unwrap();
    let mut o = opts(Mode::Direct, origin.addr());
    o.path = Some("/chunked/100000?size=777".to_string());
    let r = load::run(&o).unwrap();
    assert_clean(&r);
    assert_eq!(r.completed, origin.requests());
    assert!(r.bytes > r.completed * 100_000);
}

#[test]
fn mix_keeps_all_connections_and_rotates() {
    let origin = Origin::start().unwrap();
    let mut o = opts(Mode::Direct, origin.addr());
    o.connections = 20;
    o.active = Some(3);
    o.threads = 2;
    let r = load::run(&o).unwrap();
    assert_clean(&r);
    assert_eq!(r.completed, origin.requests());
    assert_eq!(origin.connections(), 20);
}

#[test]
fn hold_keeps_200_connections_open() {
    let origin = Origin::start().unwrap();
    let mut o = opts(Mode::Direct, origin.addr());
    o.hold = Some(200);
    o.threads = 2;
    let r = load::run(&o).unwrap();
    let h = r.hold.unwrap();
    assert_eq!((h.requested, h.established, h.open), (200, 200, 200), "{}", r.human());
    assert_eq!(r.completed, 200);
    assert_eq!(origin.connections(), 200);
    assert_eq!(r.to_json()["hold"]["open"], 200);
}

#[test]
fn idle_mix_holds_while_the_open_loop_runs() {
    let origin = Origin::start().unwrap();
    let mut o = opts(Mode::Direct, origin.addr());
    (o.hold, o.hold_path, o.rate, o.connections) =
        (Some(100), Some("/bytes/16".into()), Some(300.0), 8);
    o.settle = Duration::from_millis(100);
    let r = load::run(&o).unwrap();
    assert_clean(&r);
    let h = r.hold.unwrap();
    assert_eq!((h.requested, h.established, h.open), (100, 100, 100), "{}", r.human());
    // The held connections' exchanges are not the open loop's.
    assert!((270..=330).contains(&r.completed), "{}", r.human());
    assert_eq!(origin.requests(), 100 + r.completed);
    assert_eq!((origin.connections(), r.connections), (108, 8));
    let bad = |f: fn(&mut Options)| {
        let mut o = opts(Mode::Direct, origin.addr());
        f(&mut o);
        load::run(&o).is_err()
    };
    assert!(bad(|o| o.settle = Duration::from_secs(1)), "--settle needs --hold");
    assert!(bad(|o| o.streams = 2), "--streams above 1 needs an HTTP/2 mode");
    assert!(bad(|o| (o.hold, o.close) = (Some(2), true)));
}

#[test]
fn ws_direct_counts_echoed_messages() {
    let origin = Origin::start().unwrap();
    let mut o = opts(Mode::Ws, origin.addr());
    o.size = 1000;
    let r = load::run(&o).unwrap();
    assert_clean(&r);
    assert_eq!(r.unit, "messages");
    assert_eq!(r.completed, origin.ws_messages());
    assert_eq!(origin.connections(), 4);

    let origin = Origin::start().unwrap();
    o.target = origin.addr().to_string();
    o.close = true;
    o.size = 70_000;
    let r = load::run(&o).unwrap();
    assert_clean(&r);
    assert_eq!(r.completed, origin.ws_messages());
    assert_eq!(r.completed, origin.connections());
}

#[test]
fn errors_are_counted_by_kind() {
    let origin = Origin::start().unwrap();
    let run = |path: &str| {
        let mut o = opts(Mode::Direct, origin.addr());
        o.path = Some(path.to_string());
        o.duration = Duration::from_millis(200);
        o.connections = 1;
        o.timeout = Duration::from_secs(1);
        load::run(&o).unwrap()
    };
    let r = run("/status/404");
    assert_eq!(r.completed, 0);
    assert!(r.errors.get(ErrorKind::BadStatus) > 0);
    assert_eq!(r.errors.get(ErrorKind::BadStatus), r.errors.total());
    for kind in ["cl-and-te", "two-cl", "bad-chunk", "garbage"] {
        let r = run(&format!("/malformed/{kind}"));
        assert_eq!(r.completed, 0, "{kind}");
        assert!(r.errors.get(ErrorKind::Parse) > 0, "{kind}: {}", r.human());
    }
    let r = run("/malformed/truncated");
    assert_eq!(r.completed, 0);
    assert!(r.errors.total() > 0);

    // Nothing listens on a port held by a bound, never-listening socket (kept for the
    // test, so no other test's listener can get the port): connect errors, bounded rate.
    let holder = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    holder.bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
    let port = holder.local_addr().unwrap().as_socket().unwrap();
    let mut o = opts(Mode::Direct, port);
    o.duration = Duration::from_millis(200);
    let r = load::run(&o).unwrap();
    assert_eq!(r.completed, 0);
    assert!(r.errors.get(ErrorKind::Connect) > 0);
    assert!(r.errors.get(ErrorKind::Connect) < 4 * 200);
}

#[test]
fn https_relay_through_tls() {
    // The TLS origin stands in for a TLS-terminating relay to itself.
    let origin = TlsOrigin::start().unwrap();
    let mut o = opts(Mode::HttpsRelay, origin.addr());
    o.proxy = Some(origin.addr().to_string());
    o.ca = Some(origin.ca_file());
    let r = load::run(&o).unwrap();
    assert_clean(&r);
    assert_eq!(r.completed, origin.requests());
}

/// Copies both ways between two sockets until both sides are done.
fn pipe(a: TcpStream, b: TcpStream) {
    let (mut a2, mut b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
    let (mut a, mut b) = (a, b);
    thread::spawn(move || {
        let _ = io::copy(&mut a2, &mut b2);
        let _ = b2.shutdown(Shutdown::Write);
    });
    let _ = io::copy(&mut b, &mut a);
    let _ = a.shutdown(Shutdown::Write);
}

/// A thread-per-connection test proxy: `handshake` reads the client's
/// request and returns the upstream address (or None to refuse).
fn proxy<F>(handshake: F) -> SocketAddr
where
    F: Fn(&mut TcpStream) -> Option<SocketAddr> + Send + Sync + Copy + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            thread::spawn(move || {
                if let Some(up) = handshake(&mut c) {
                    pipe(c, TcpStream::connect(up).unwrap());
                }
            });
        }
    });
    addr
}

fn relay_to(origin: SocketAddr) -> SocketAddr {
    // A fn pointer cannot capture: smuggle the origin through a static.
    static ORIGIN: std::sync::OnceLock<SocketAddr> = std::sync::OnceLock::new();
    ORIGIN.set(origin).unwrap();
    proxy(|_| ORIGIN.get().copied())
}

#[test]
fn relay_mode() {
    let origin = Origin::start().unwrap();
    let mut o = opts(Mode::Relay, origin.addr());
    o.proxy = Some(relay_to(origin.addr()).to_string());
    let r = load::run(&o).unwrap();
    assert_clean(&r);
    assert_eq!(r.completed, origin.requests());
}

fn connect_handshake(c: &mut TcpStream) -> Option<SocketAddr> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        c.read_exact(&mut b).ok()?;
        head.push(b[0]);
    }
    let line = String::from_utf8(head).ok()?;
    let target = line.strip_prefix("CONNECT ")?.split(' ').next()?.parse().ok()?;
    c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").ok()?;
    Some(target)
}

fn socks5_handshake(c: &mut TcpStream) -> Option<SocketAddr> {
    let mut greet = [0u8; 3];
    c.read_exact(&mut greet).ok()?;
    assert_eq!(greet, [5, 1, 0]);
    c.write_all(&[5, 0]).ok()?;
    let mut req = [0u8; 10];
    c.read_exact(&mut req).ok()?;
    assert_eq!(req[..4], [5, 1, 0, 1]);
    let ip = std::net::Ipv4Addr::new(req[4], req[5], req[6], req[7]);
    let port = u16::from_be_bytes([req[8], req[9]]);
    // Reply with a domain-typed bound address to exercise that parse path.
    c.write_all(&[5, 0, 0, 3, 4, b'h', b'o', b's', b't', 0, 1]).ok()?;
    Some(SocketAddr::from((ip, port)))
}

#[test]
fn connect_and_socks5_tunnels() {
    for (mode, proxy_addr) in
        [(Mode::Connect, proxy(connect_handshake)), (Mode::Socks5, proxy(socks5_handshake))]
    {
        let origin = Origin::start().unwrap();
        let mut o = opts(mode, origin.addr());
        o.proxy = Some(proxy_addr.to_string());
        o.close = true;
        o.duration = Duration::from_millis(500);
        let r = load::run(&o).unwrap();
        assert_clean(&r);
        assert_eq!(r.completed, origin.requests(), "{mode:?}");
        assert_eq!(r.completed, origin.connections(), "{mode:?}");
    }
}

#[test]
fn refused_tunnels_are_counted() {
    let refuse = proxy(|c| {
        let mut b = [0u8; 512];
        let _ = c.read(&mut b);
        let _ = c.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n");
        None
    });
    let mut o = opts(Mode::Connect, "127.0.0.1:9".parse().unwrap());
    o.proxy = Some(refuse.to_string());
    o.duration = Duration::from_millis(200);
    let r = load::run(&o).unwrap();
    assert_eq!(r.completed, 0);
    assert!(r.errors.get(ErrorKind::ProxyRefused) > 0, "{}", r.human());
}

#[test]
fn count_sends_exactly_n_requests_over_all_lanes() {
    let origin = Origin::start().unwrap();
    let mut o = opts(Mode::Direct, origin.addr());
    (o.threads, o.connections, o.count) = (2, 5, Some(1001));
    // Neither applies to a counted run: it ends when the 1001st answer is in.
    (o.duration, o.warmup) = (Duration::from_millis(1), Duration::from_secs(60));
    let r = load::run(&o).unwrap();
    assert_clean(&r);
    assert_eq!((r.completed, origin.requests()), (1001, 1001));
    for bad in [
        |o: &mut Options| o.count = Some(0),
        |o: &mut Options| o.hold = Some(2),
        |o: &mut Options| o.mode = Mode::UdpDirect,
    ] {
        let mut o = opts(Mode::Direct, origin.addr());
        o.count = Some(3);
        bad(&mut o);
        assert!(load::run(&o).is_err(), "{o:?}");
    }
}
