//! Idle tunnels are parked off the event loop and come back when either side speaks. A
//! test binary of its own, because it reads the process-wide count of parked tunnels and
//! other tests' tunnels would move it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rustle::config::{Config, Listener, ListenerKind, LogTarget};
use rustle_bench::TcpEcho;

/// Waits until `rustle::front::tunnel::park::parked_now()` is `want`.
fn parked_becomes(want: usize, within: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if rustle::front::tunnel::park::parked_now() == want {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn connect_tunnel(proxy: SocketAddr, target: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    s
}

fn socks_tunnel(proxy: SocketAddr, target: SocketAddr) -> TcpStream {
    let SocketAddr::V4(a) = target else { panic!("v4") };
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut req = vec![5, 1, 0, 5, 1, 0, 1];
    req.extend_from_slice(&a.ip().octets());
    req.extend_from_slice(&a.port().to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 12];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[..4], &[5, 0, 5, 0], "method choice and success");
    s
}

fn echo(s: &mut TcpStream, msg: &[u8]) {
    s.write_all(msg).unwrap();
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, msg);
}

#[test]
fn idle_tunnels_are_parked_and_resume_when_either_side_speaks() {
    let echo_server = TcpEcho::start().unwrap();
    let dir = std::env::temp_dir().join(format!("rustle-park-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.log");
    let mut cfg = Config {
        workers: 1,
        listeners: vec![
            Listener::new(ListenerKind::Http, "127.0.0.1:0".parse().unwrap()),
            Listener::new(ListenerKind::Socks, "127.0.0.1:0".parse().unwrap()),
        ],
        ..Config::default()
    };
    cfg.log.access = LogTarget::File(log.clone());
    cfg.timeouts.shutdown = Duration::from_millis(500);
    cfg.timeouts.tunnel_idle = Duration::from_secs(4);
    // The relay's own parking: a tunnel the kernel forwards stays parked while the kernel
    // moves its bytes (tests/it/kernel.rs).
    cfg.relay.kernel_forwarding = rustle::config::KernelForwarding::Off;
    let running = rustle::run::server::start(cfg).expect("proxy starts");
    let (http, socks) = (running.addrs()[0].1, running.addrs()[1].1);
    let target = echo_server.addr();

    let mut a = connect_tunnel(http, target);
    let mut b = connect_tunnel(http, target);
    let mut c = socks_tunnel(socks, target);
    echo(&mut a, b"a first");
    echo(&mut b, b"b first");
    echo(&mut c, b"c first");
    // A second after their last byte (plus a sweep), all three are parked.
    assert!(
        parked_becomes(3, Duration::from_secs(3)),
        "parked: {}",
        rustle::front::tunnel::park::parked_now()
    );

    // A parked tunnel comes back at the client's first byte, whole: a large message both
    // ways arrives intact.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    let writer = {
        let mut w = a.try_clone().unwrap();
        let big = big.clone();
        std::thread::spawn(move || w.write_all(&big).unwrap())
    };
    let mut back = vec![0u8; big.len()];
    a.read_exact(&mut back).unwrap();
    writer.join().unwrap();
    assert!(back == big, "the resumed tunnel's bytes differ");
    assert!(rustle::front::tunnel::park::parked_now() <= 2);

    // A parked SOCKS tunnel too.
    echo(&mut c, b"c again");

    // A half-close while parked: the origin's answer to it (its own FIN) comes back
    // through the resumed tunnel, and the other direction had delivered everything.
    b.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    b.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");

    // Quiet again: parked again; then the idle timeout (4 s after the last byte) closes
    // the parked tunnels with their log lines.
    assert!(
        parked_becomes(2, Duration::from_secs(3)),
        "parked: {}",
        rustle::front::tunnel::park::parked_now()
    );
    let quiet_from = Instant::now();
    let mut buf = [0u8; 1];
    a.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    assert_eq!(a.read(&mut buf).unwrap_or(0), 0, "closed by the idle timeout");
    let waited = quiet_from.elapsed();
    assert!(waited < Duration::from_secs(6), "closed {waited:?} after parking");
    assert!(
        parked_becomes(0, Duration::from_secs(3)),
        "parked: {}",
        rustle::front::tunnel::park::parked_now()
    );

    // A half-closed tunnel parks too, and stays parked: the client's end of stream (read
    // and passed on) does not wake it again and again; the origin's answer still does.
    let origin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let origin_addr = origin.local_addr().unwrap().to_string();
    let mut d = connect_tunnel(http, origin.local_addr().unwrap());
    let (mut o, _) = origin.accept().unwrap();
    d.write_all(b"question").unwrap();
    d.shutdown(Shutdown::Write).unwrap();
    let mut got = Vec::new();
    o.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"question");
    assert!(
        parked_becomes(1, Duration::from_secs(3)),
        "parked: {}",
        rustle::front::tunnel::park::parked_now()
    );
    // That it stays parked is seen only over time: a second of real time, looked at every
    // 20 ms, in which a wrong wake-up (which would fail the test) would show.
    for _ in 0..50 {
        assert_eq!(
            rustle::front::tunnel::park::parked_now(),
            1,
            "a half-closed tunnel woke up by itself"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    o.write_all(b"answer").unwrap();
    drop(o);
    let mut answer = Vec::new();
    d.read_to_end(&mut answer).unwrap();
    assert_eq!(answer, b"answer");
    assert!(
        parked_becomes(0, Duration::from_secs(3)),
        "parked: {}",
        rustle::front::tunnel::park::parked_now()
    );
    running.stop();
    let text = std::fs::read_to_string(&log).unwrap();
    let timed_out = text.lines().filter(|l| l.contains("timed out")).count();
    assert_eq!(timed_out, 2, "{text}");
    let d_line = text.lines().find(|l| l.contains(&origin_addr)).unwrap();
    assert!(d_line.contains(" 8 6 "), "bytes up and down: {d_line}");
    let a_line = text
        .lines()
        .find(|l| l.contains(" CONNECT ") && !l.contains("socks5://") && l.contains("timed out"))
        .unwrap();
    // The log line counts every byte, before and after parking.
    let total = (b"a first".len() + big.len()).to_string();
    assert!(a_line.contains(&total), "{a_line}");
    let _ = std::fs::remove_dir_all(&dir);
}
