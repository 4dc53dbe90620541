//! No descriptor leaks: thousands of tunnels opened and closed through the proxy leave the
//! process with the descriptors it had. A test binary of its own, because it counts the
//! whole process's descriptors and other tests would move the count.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use rustle::config::{Config, Listener, ListenerKind, LogTarget};
use rustle_bench::TcpEcho;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// Waits until the count comes back to `want` (tasks close their sockets asynchronously).
fn settles_to(want: usize, within: Duration) -> usize {
    let start = Instant::now();
    loop {
        let n = open_fds();
        if n <= want || start.elapsed() > within {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn descriptors_return_to_baseline_after_5000_tunnels() {
    let echo = TcpEcho::start().unwrap();
    let mut cfg = Config {
        workers: 1,
        listeners: vec![
            Listener::new(ListenerKind::Http, "127.0.0.1:0".parse().unwrap()),
            Listener::new(ListenerKind::Socks, "127.0.0.1:0".parse().unwrap()),
        ],
        ..Config::default()
    };
    cfg.log.access = LogTarget::Off;
    cfg.timeouts.shutdown = Duration::from_millis(500);
    let running = rustle::run::server::start(cfg).expect("proxy starts");
    let (http, socks) = (running.addrs()[0].1, running.addrs()[1].1);
    // A first round warms up what the proxy keeps for good (pools, the runtime's threads).
    let mut total = 0;
    let mut baseline = 0;
    for round in 0..11 {
        // 500 at once: 4 descriptors each in this process, well under the 20,000 limit.
        let mut open = Vec::new();
        for i in 0..500 {
            let mut s = TcpStream::connect(if i % 2 == 0 { http } else { socks }).unwrap();
            if i % 2 == 0 {
                write!(s, "CONNECT {} HTTP/1.1\r\nHost: x\r\n\r\n", echo.addr()).unwrap();
                let mut head = [0u8; 39];
                s.read_exact(&mut head).unwrap();
                assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
            } else {
                let std::net::SocketAddr::V4(a) = echo.addr() else { panic!("v4") };
                let mut req = vec![5, 1, 0, 5, 1, 0, 1];
                req.extend_from_slice(&a.ip().octets());
                req.extend_from_slice(&a.port().to_be_bytes());
                s.write_all(&req).unwrap();
                let mut reply = [0u8; 12];
                s.read_exact(&mut reply).unwrap();
                assert_eq!(&reply[..4], &[5, 0, 5, 0]);
            }
            s.write_all(b"ping").unwrap();
            let mut back = [0u8; 4];
            s.read_exact(&mut back).unwrap();
            assert_eq!(&back, b"ping");
            open.push(s);
        }
        // Half of them end with a half-close, half with an abrupt close.
        for (i, s) in open.into_iter().enumerate() {
            if i % 2 == 0 {
                s.shutdown(Shutdown::Write).unwrap();
                let mut rest = Vec::new();
                let _ = (&s).read_to_end(&mut rest);
            }
        }
        if round == 0 {
            baseline = settles_to(0, Duration::from_secs(2));
        } else {
            total += 500;
        }
    }
    let after = settles_to(baseline, Duration::from_secs(10));
    assert!(total >= 5000);
    assert!(
        after <= baseline,
        "{after} descriptors open after {total} tunnels, {baseline} after the first round"
    );
    running.stop();
}
