//! In-kernel forwarding (`[relay] kernel_forwarding`): every plain tunnel kind (CONNECT,
//! SOCKS5, SOCKS4, a TCP relay) with the kernel path required and off, each checked for
//! exact bytes and counts (1 B, 64 KiB, 100 MiB), both half-closes, a reset from each
//! side, the idle timeout, a reload that gives open tunnels a bandwidth limit, and a
//! start without the capability.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustle::config::KernelForwarding;
use rustle_bench::pattern::pattern_byte;

use crate::util::socks::*;
use crate::util::*;

/// The modes every scenario runs in.
const MODES: [&str; 2] = ["require", "off"];

/// The kernel path needs root (CAP_BPF and CAP_NET_ADMIN); CI runs as root, where its
/// absence is a failure.
fn can_forward() -> bool {
    let root = crate::util::peers::is_root();
    if !root {
        assert!(
            std::env::var_os("RUSTLE_REQUIRE_TOOLS").is_none(),
            "in-kernel forwarding tests need root (CAP_BPF, CAP_NET_ADMIN)"
        );
        eprintln!("skipped: in-kernel forwarding needs root");
    }
    root
}

/// A proxy with an HTTP, a SOCKS and a relay listener (to `target`), in `mode`.
fn proxy(mode: &str, target: SocketAddr, extra: &str) -> Proxy {
    Proxy::from_toml(&format!(
        "[relay]\nkernel_forwarding = \"{mode}\"\n{extra}\n\
         [[listener]]\nlisten = \"127.0.0.1:0\"\nkind = \"http\"\n\
         [[listener]]\nlisten = \"127.0.0.1:0\"\nkind = \"socks\"\n\
         [[listener]]\nlisten = \"127.0.0.1:0\"\nkind = \"relay\"\ntarget = \"{target}\"\n"
    ))
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Connect,
    Socks5,
    Socks4,
    Relay,
}

/// A tunnel of `kind` to `target` through `proxy`, ready for payload: in the kernel
/// already when the proxy's mode says so (a tunnel whose target speaks first is taken
/// once the relay has delivered what came before: see `open_tunnel` for those).
fn open(proxy: &Proxy, kind: Kind, target: SocketAddr) -> TcpStream {
    let (taken, _) = proxy.running().kernel_tunnels();
    let s = open_tunnel(proxy, kind, target);
    if proxy.running().config().relay.kernel_forwarding == KernelForwarding::Require {
        let took = || proxy.running().kernel_tunnels().0 > taken;
        assert!(wait_until(Duration::from_secs(5), took), "the kernel did not take the tunnel");
    }
    s
}

fn open_tunnel(proxy: &Proxy, kind: Kind, target: SocketAddr) -> TcpStream {
    match kind {
        Kind::Connect => {
            let mut s = connect(proxy.addr_of(0));
            write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").unwrap();
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                s.read_exact(&mut b).expect("CONNECT answer");
                head.push(b[0]);
            }
            assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
            s
        }
        Kind::Socks5 => connect5(proxy.addr_of(1), &Dst::Addr(target)),
        Kind::Socks4 => {
            let SocketAddr::V4(v4) = target else { panic!("an IPv4 target") };
            let mut s = connect(proxy.addr_of(1));
            s.write_all(&request4(CONNECT, SocketAddrV4::new(*v4.ip(), v4.port()), "", None))
                .unwrap();
            let mut r = [0u8; 8];
            s.read_exact(&mut r).unwrap();
            assert_eq!(r[1], 0x5a, "SOCKS4 CONNECT granted: {r:?}");
            s
        }
        Kind::Relay => connect(proxy.addr_of(2)),
    }
}

/// Writes `n` pattern bytes starting at pattern offset `from`.
fn send_pattern(s: &mut TcpStream, from: u64, n: u64) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut sent = 0u64;
    while sent < n {
        let len = (n - sent).min(buf.len() as u64) as usize;
        for (i, b) in buf[..len].iter_mut().enumerate() {
            *b = pattern_byte(from + sent + i as u64);
        }
        s.write_all(&buf[..len]).expect("write");
        sent += len as u64;
    }
}

/// A third of `n` pattern bytes at once, the rest in 256 KiB pieces 30 ms apart (about
/// 8 MB/s), then the end of stream.
fn send_paced(s: &mut TcpStream, from: u64, n: u64) {
    send_pattern(s, from, n / 3);
    let mut at = n / 3;
    while at < n {
        let piece = (n - at).min(256 * 1024);
        send_pattern(s, from + at, piece);
        at += piece;
        std::thread::sleep(Duration::from_millis(30));
    }
    s.shutdown(Shutdown::Write).unwrap();
}

/// Reads to the end of stream, checking each byte against the pattern from `from`;
/// returns how many came.
fn recv_pattern(s: &mut TcpStream, from: u64) -> u64 {
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0u64;
    loop {
        let n = s.read(&mut buf).expect("read");
        if n == 0 {
            return got;
        }
        for (i, b) in buf[..n].iter().enumerate() {
            let at = got + i as u64;
            assert_eq!(*b, pattern_byte(from + at), "byte {at} differs");
        }
        got += n as u64;
    }
}

/// A target for one tunnel, running `script` on the accepted connection.
fn target(script: impl FnOnce(TcpStream) + Send + 'static) -> (SocketAddr, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let h = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        script(s);
    });
    (addr, h)
}

/// A listener that accepts `n` connections, each running `script` (with its index).
fn targets(
    n: usize,
    script: impl Fn(usize, TcpStream) + Send + Sync + 'static,
) -> (SocketAddr, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let script = std::sync::Arc::new(script);
    let h = std::thread::spawn(move || {
        let mut handles = Vec::new();
        for i in 0..n {
            let (s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let script = script.clone();
            handles.push(std::thread::spawn(move || script(i, s)));
        }
        for h in handles {
            h.join().expect("target script");
        }
    });
    (addr, h)
}

/// An echo for `n` connections, each until its end of stream.
fn echoes(n: usize) -> (SocketAddr, JoinHandle<()>) {
    targets(n, |_, mut s| {
        let mut b = vec![0u8; 64 * 1024];
        while let Ok(n) = s.read(&mut b) {
            if n == 0 || s.write_all(&b[..n]).is_err() {
                break;
            }
        }
    })
}

/// The (up, down) byte counts of the access-log line of the tunnel from `client`.
fn logged(proxy: &Proxy, client: SocketAddr) -> (u64, u64) {
    let peer = client.to_string();
    let line = proxy.log_line(|l| l.split_whitespace().nth(1) == Some(peer.as_str()));
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[5].parse().expect(&line), f[6].parse().expect(&line))
}

/// The client sends `up` bytes and half-closes; the target reads them all, answers with
/// `down` bytes and closes. Then the other way round: the target speaks first and
/// half-closes. Every byte is checked, and the log's counts.
#[test]
fn every_tunnel_kind_moves_exact_bytes_in_the_kernel_and_in_the_relay() {
    if !can_forward() {
        return;
    }
    let cases: &[(Kind, u64)] = &[
        (Kind::Connect, 1),
        (Kind::Connect, 64 * 1024),
        (Kind::Connect, 100 << 20),
        (Kind::Socks5, 1),
        (Kind::Socks5, 64 * 1024),
        (Kind::Socks4, 64 * 1024),
        (Kind::Relay, 1),
        (Kind::Relay, 64 * 1024),
        (Kind::Relay, 100 << 20),
    ];
    for mode in MODES {
        for &(kind, size) in cases {
            let what = format!("{kind:?}, {size} B, kernel_forwarding = {mode}");
            // Client first: up, then down (a different size, so a swap shows).
            let down = size + 7;
            let (addr, server) = target(move |mut s| {
                assert_eq!(recv_pattern(&mut s, 0), size, "the target got all");
                send_pattern(&mut s, 3, down);
            });
            let proxy = proxy(mode, addr, "");
            let before = proxy.running().kernel_tunnels().0;
            let mut c = open(&proxy, kind, addr);
            let me = c.local_addr().unwrap();
            send_pattern(&mut c, 0, size);
            c.shutdown(Shutdown::Write).unwrap();
            assert_eq!(recv_pattern(&mut c, 3), down, "{what}: the client got all");
            server.join().expect(&what);
            drop(c);
            assert_eq!(logged(&proxy, me), (size, down), "{what}: logged counts");
            let taken = proxy.running().kernel_tunnels().0 - before;
            assert_eq!(taken, u64::from(mode == "require"), "{what}: tunnels the kernel took");

            // Target first.
            let up = size + 3;
            let (addr, server) = target(move |mut s| {
                send_pattern(&mut s, 11, size);
                s.shutdown(Shutdown::Write).unwrap();
                assert_eq!(recv_pattern(&mut s, 5), up, "the target got all");
            });
            let proxy = self::proxy(mode, addr, "");
            let mut c = open_tunnel(&proxy, kind, addr);
            let me = c.local_addr().unwrap();
            assert_eq!(recv_pattern(&mut c, 11), size, "{what}: the client got all");
            send_pattern(&mut c, 5, up);
            drop(c);
            server.join().expect(&what);
            assert_eq!(logged(&proxy, me), (up, size), "{what} (target first): logged counts");
        }
    }
}

/// A reset from either side reaches the other as a reset, with the cause logged.
#[test]
fn a_reset_from_either_side_passes_through() {
    if !can_forward() {
        return;
    }
    for mode in MODES {
        // The target resets after it got a first exchange.
        let (addr, server) = target(|mut s| {
            let mut b = [0u8; 5];
            s.read_exact(&mut b).unwrap();
            s.write_all(b"world").unwrap();
            std::thread::sleep(Duration::from_millis(100));
            socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO)).unwrap();
        });
        let proxy = proxy(mode, addr, "");
        let mut c = open(&proxy, Kind::Connect, addr);
        let me = c.local_addr().unwrap();
        c.write_all(b"hello").unwrap();
        let mut b = [0u8; 5];
        c.read_exact(&mut b).unwrap();
        server.join().unwrap();
        let r = c.read(&mut [0u8; 16]);
        let reset = matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset);
        assert!(reset, "{mode}: the client saw {r:?}, not a reset");
        let line = proxy.log_line(|l| l.contains(&me.to_string()));
        assert!(line.contains("reset"), "{mode}: {line}");

        // The client resets.
        let (tx, rx) = std::sync::mpsc::channel();
        let (addr, server) = target(move |mut s| {
            let mut b = [0u8; 5];
            s.read_exact(&mut b).unwrap();
            s.write_all(b"world").unwrap();
            let r = s.read(&mut [0u8; 16]);
            tx.send(matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset))
                .unwrap();
        });
        let proxy = self::proxy(mode, addr, "");
        let mut c = open(&proxy, Kind::Socks5, addr);
        c.write_all(b"hello").unwrap();
        c.read_exact(&mut b).unwrap();
        socket2::SockRef::from(&c).set_linger(Some(Duration::ZERO)).unwrap();
        drop(c);
        assert!(
            rx.recv_timeout(Duration::from_secs(10)).unwrap(),
            "{mode}: no reset at the target"
        );
        server.join().unwrap();
    }
}

/// A tunnel that moves nothing is closed at the idle timeout; one the kernel keeps busy
/// past it is not.
#[test]
fn the_idle_timeout_closes_a_quiet_tunnel_and_not_a_busy_one() {
    if !can_forward() {
        return;
    }
    for mode in MODES {
        let (addr, server) = echoes(2);
        let proxy = proxy(mode, addr, "[timeouts]\ntunnel_idle = \"1s\"");
        let mut busy = open(&proxy, Kind::Relay, addr);
        let mut quiet = open(&proxy, Kind::Relay, addr);
        let start = Instant::now();
        // Busy for 3 s, a message every 200 ms.
        while start.elapsed() < Duration::from_secs(3) {
            busy.write_all(b"ping").unwrap();
            let mut b = [0u8; 4];
            busy.read_exact(&mut b).expect("the busy tunnel echoes");
            assert_eq!(&b, b"ping");
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(closed_within(&mut quiet, Duration::from_millis(100)), "{mode}: quiet tunnel open");
        let quiet_from = Instant::now();
        assert!(
            closed_within(&mut busy, Duration::from_secs(4)),
            "{mode}: busy tunnel never closed"
        );
        let waited = quiet_from.elapsed();
        assert!(
            waited >= Duration::from_millis(700),
            "{mode}: closed {waited:?} after its last byte"
        );
        let line = proxy.log_line(|l| l.contains("timed out"));
        assert!(line.contains("timed out"), "{line}");
        drop((busy, quiet));
        server.join().unwrap();
    }
}

/// Streams both ways through a tunnel the kernel forwards; a reload gives the listener a
/// bandwidth limit halfway: the tunnel leaves the kernel path (the limit then holds it
/// back), and both ends get exactly what the other sent, in order.
#[test]
fn a_reload_that_adds_a_bandwidth_limit_takes_open_tunnels_out_of_the_kernel_whole() {
    if !can_forward() {
        return;
    }
    const EACH: u64 = 24 << 20;
    let (addr, server) = target(|mut s| {
        let mut w = s.try_clone().unwrap();
        let writer = std::thread::spawn(move || send_paced(&mut w, 1000, EACH));
        assert_eq!(recv_pattern(&mut s, 0), EACH, "the target got every byte, in order");
        writer.join().unwrap();
    });
    let config = |extra: &str| {
        format!(
            "[relay]\nkernel_forwarding = \"require\"\n\
             [[listener]]\nlisten = \"127.0.0.1:0\"\nkind = \"relay\"\ntarget = \"{addr}\"\n{extra}"
        )
    };
    let proxy = Proxy::from_toml(&config(""));
    let mut c = connect(proxy.addr());
    let me = c.local_addr().unwrap();
    let mut w = c.try_clone().unwrap();
    // Both ends send a third at full speed, then the rest in pieces while the reload
    // lands.
    let writer = std::thread::spawn(move || send_paced(&mut w, 0, EACH));
    let reader = std::thread::spawn(move || recv_pattern(&mut c, 1000));
    wait_until(Duration::from_secs(10), || proxy.running().kernel_tunnels().0 == 1);
    std::thread::sleep(Duration::from_millis(300));
    let reload_at = Instant::now();
    proxy.reload_toml(&config("rate_up = \"32mbit\"\nrate_down = \"32mbit\""));
    assert_eq!(reader.join().unwrap(), EACH, "the client got every byte, in order");
    writer.join().unwrap();
    server.join().unwrap();
    let took = reload_at.elapsed();
    assert_eq!(logged(&proxy, me), (EACH, EACH), "logged counts");
    // About 13 MiB each way were left at the reload; at 4 MB/s they take over 3 s (sent
    // as paced, under 2 s).
    assert_eq!(proxy.running().kernel_tunnels(), (1, 1), "the tunnel left the kernel path");
    assert!(took >= Duration::from_millis(2500), "the limit held nothing back: {took:?}");
}

/// `require` without the capability refuses to start, naming why; `auto` starts and
/// relays.
#[test]
fn without_the_capability_require_refuses_to_start_and_auto_relays() {
    if !can_forward() || !have("setpriv") {
        assert!(std::env::var_os("RUSTLE_REQUIRE_TOOLS").is_none(), "setpriv is missing");
        return;
    }
    let dir = TempDir::new("kernel-cap");
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .unwrap();
    let unprivileged = |mode: &str, port: u16| {
        let file = dir.file(&format!("{mode}.toml"));
        std::fs::write(
            &file,
            format!(
                "[relay]\nkernel_forwarding = \"{mode}\"\n\
                 [[listener]]\nlisten = \"127.0.0.1:{port}\"\nkind = \"http\"\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let mut cmd = clean_command("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
            .args(["--bounding-set=-all", rustle_bin(), "-c"])
            .arg(&file)
            .env("RUSTLE_CONFIG", "")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        cmd.spawn().expect("setpriv runs")
    };
    let out = unprivileged("require", 0).wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "require without the capability started: {text}");
    assert!(text.contains("kernel_forwarding = \"require\""), "{text}");

    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let child = unprivileged("auto", port);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let (target, server) = target(|mut s| {
        let mut b = [0u8; 5];
        s.read_exact(&mut b).unwrap();
        s.write_all(&b).unwrap();
    });
    wait_until(Duration::from_secs(10), || TcpStream::connect(addr).is_ok());
    let mut c = connect(addr);
    write!(c, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").unwrap();
    let mut head = [0u8; 12];
    c.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let mut rest = Vec::new();
    let mut b = [0u8; 1];
    while !rest.ends_with(b"\r\n\r\n") {
        c.read_exact(&mut b).unwrap();
        rest.push(b[0]);
    }
    c.write_all(b"hello").unwrap();
    let mut echo = [0u8; 5];
    c.read_exact(&mut echo).unwrap();
    assert_eq!(&echo, b"hello");
    server.join().unwrap();
    // The child is ours: stopped by its PID.
    let _ = std::process::Command::new("kill").arg(child.id().to_string()).status();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("kernel forwarding: not available here"), "{text}");
}

/// Both directions at once past the kernel's window (the program passes data up while
/// the peer's queue drains), then a half-close: an echo returns every byte, in order, and
/// nothing the program passed up before the FIN is lost to the end of stream.
#[test]
fn an_echo_past_the_window_with_a_half_close_returns_every_byte() {
    if !can_forward() {
        return;
    }
    const N: u64 = 8 << 20;
    let (addr, server) = echoes(5);
    let proxy = proxy("require", addr, "");
    for round in 0..5 {
        let mut c = open(&proxy, Kind::Relay, addr);
        let mut w = c.try_clone().unwrap();
        let writer = std::thread::spawn(move || {
            send_pattern(&mut w, 0, N);
            w.shutdown(Shutdown::Write).unwrap();
        });
        assert_eq!(recv_pattern(&mut c, 0), N, "round {round}: echoed length");
        writer.join().unwrap();
    }
    server.join().unwrap();
}

/// `auto` leaves a tunnel in the relay until it has moved 32 KiB, then hands it over.
#[test]
fn auto_hands_over_a_busy_tunnel_and_leaves_a_quiet_one() {
    if !can_forward() {
        return;
    }
    let (addr, server) = echoes(1);
    let proxy = proxy("auto", addr, "");
    let mut c = open(&proxy, Kind::Connect, addr);
    let mut echo = |n: usize| {
        let data = vec![7u8; n];
        c.write_all(&data).unwrap();
        let mut back = vec![0u8; n];
        c.read_exact(&mut back).unwrap();
        assert_eq!(back, data);
    };
    echo(1024);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(proxy.running().kernel_tunnels().0, 0, "a quiet tunnel went to the kernel");
    echo(20 * 1024);
    echo(20 * 1024);
    let taken = wait_until(Duration::from_secs(5), || proxy.running().kernel_tunnels().0 == 1);
    assert!(taken, "a busy tunnel stayed in the relay");
    echo(1 << 20);
    drop(c);
    server.join().unwrap();
}
