//! The UDP modes of the load generator against the in-process `UdpEcho`,
//! directly and through a tiny in-test UDP relay.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rustle_bench::load::{self, ErrorKind, Mode, Options};
use rustle_bench::UdpEcho;

fn opts(mode: Mode, target: SocketAddr) -> Options {
    let mut o = Options::new(mode, target.to_string());
    o.connections = 4;
    o.duration = Duration::from_millis(500);
    o.warmup = Duration::ZERO;
    o.timeout = Duration::from_secs(2);
    o
}

/// A UDP port relay: each client gets its own upstream socket to `target`
/// and a thread copying the answers back. Runs until the test ends.
fn relay(target: SocketAddr) -> SocketAddr {
    let front = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
    let addr = front.local_addr().unwrap();
    thread::spawn(move || {
        let mut ups: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
        let mut buf = vec![0u8; 65536];
        loop {
            let Ok((n, from)) = front.recv_from(&mut buf) else { continue };
            let up = ups.entry(from).or_insert_with(|| {
                let up = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
                up.connect(target).unwrap();
                let (back, front) = (Arc::clone(&up), Arc::clone(&front));
                thread::spawn(move || {
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n) = back.recv(&mut buf) {
                        let _ = front.send_to(&buf[..n], from);
                    }
                });
                up
            });
            let _ = up.send(&buf[..n]);
        }
    });
    addr
}

#[test]
fn udp_direct_count_matches_echo() {
    let echo = UdpEcho::start().unwrap();
    let mut o = opts(Mode::UdpDirect, echo.addr());
    o.threads = 2;
    let r = load::run(&o).unwrap();
    assert_eq!(r.errors.total(), 0, "{}", r.human());
    assert!(r.completed > 0);
    assert_eq!(r.completed, echo.datagrams(), "{}", r.human());
    assert_eq!(r.bytes, echo.bytes());
    assert_eq!(r.bytes, r.completed * 64);
    assert_eq!((r.unit, r.mode, r.threads), ("datagrams", "udp-direct", 2));
    assert!(r.latency_us.p50 > 0 && r.latency_us.p50 <= r.latency_us.max);
    assert_eq!(r.to_json()["unit"], "datagrams");
}

#[test]
fn udp_relay_count_matches_echo() {
    let echo = UdpEcho::start().unwrap();
    let mut o = opts(Mode::UdpRelay, echo.addr());
    o.proxy = Some(relay(echo.addr()).to_string());
    o.size = 1200;
    let r = load::run(&o).unwrap();
    assert_eq!(r.errors.total(), 0, "{}", r.human());
    assert!(r.completed > 0);
    assert_eq!(r.completed, echo.datagrams(), "{}", r.human());
    assert_eq!(r.bytes, r.completed * 1200);
}

#[test]
fn udp_open_loop_hits_the_rate() {
    let echo = UdpEcho::start().unwrap();
    let mut o = opts(Mode::UdpDirect, echo.addr());
    o.rate = Some(400.0);
    o.duration = Duration::from_secs(1);
    let r = load::run(&o).unwrap();
    assert_eq!(r.errors.total(), 0, "{}", r.human());
    assert!((360..=440).contains(&r.completed), "{}", r.human());
    assert_eq!(r.completed, echo.datagrams());
}

#[test]
fn udp_silence_is_a_timeout_and_wrong_payloads_are_errors() {
    // Nobody answers: every datagram times out.
    let quiet = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut o = opts(Mode::UdpDirect, quiet.local_addr().unwrap());
    o.connections = 2;
    o.timeout = Duration::from_millis(100);
    let r = load::run(&o).unwrap();
    assert_eq!(r.completed, 0);
    assert!(r.errors.get(ErrorKind::Timeout) >= 2, "{}", r.human());

    // A server that flips a byte: every answer is a wrong payload.
    let bad = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = bad.local_addr().unwrap();
    thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = bad.recv_from(&mut buf) {
            buf[n - 1] ^= 0xff;
            let _ = bad.send_to(&buf[..n], from);
        }
    });
    let mut o = opts(Mode::UdpDirect, addr);
    o.connections = 1;
    o.duration = Duration::from_millis(200);
    let r = load::run(&o).unwrap();
    assert_eq!(r.completed, 0);
    assert!(r.errors.get(ErrorKind::Parse) > 0, "{}", r.human());
    assert_eq!(r.errors.total(), r.errors.get(ErrorKind::Parse));
}

#[test]
fn udp_options_are_checked() {
    let echo = UdpEcho::start().unwrap();
    let mut o = opts(Mode::UdpRelay, echo.addr());
    assert!(load::run(&o).is_err(), "udp-relay needs --proxy");
    o.mode = Mode::UdpDirect;
    o.size = 4;
    assert!(load::run(&o).is_err(), "too small for the stamp");
    o.size = 64;
    o.hold = Some(3);
    assert!(load::run(&o).is_err());
    for m in ["udp-direct", "udp-relay", "udp-socks5"] {
        assert!(Mode::parse(m).unwrap().is_udp());
    }
    assert!(!Mode::Socks5.is_udp());
}
