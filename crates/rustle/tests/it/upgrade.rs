//! Reloading everything and replacing the process: SIGHUP binding, closing and keeping
//! listeners while tunnels go on, limits and timeouts taking effect, a reload that fails
//! changing nothing; `rustle --takeover` under load with no failed request; systemd's
//! socket activation.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustle_bench::pattern::pattern;
use rustle_bench::{Origin, TcpEcho};

use crate::util::*;

/// A loopback TCP port free right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn refused(addr: SocketAddr) -> bool {
    matches!(TcpStream::connect(addr), Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
}

fn listener_toml(kind: &str, port: u16) -> String {
    format!("[[listener]]\nkind = \"{kind}\"\nlisten = \"127.0.0.1:{port}\"\n")
}

const HEAD: &str = "workers = 2\n[log]\naccess = \"off\"\n";

/// Rewrites `file`, sends SIGHUP and waits for the `n`th successful reload.
#[track_caller]
fn reload(bin: &RustleProcess, file: &Path, text: &str, n: usize) {
    std::fs::write(file, text).unwrap();
    bin.signal("HUP");
    assert!(
        bin.wait_for_stderr_n("SIGHUP: reloaded", n, Duration::from_secs(5)),
        "reload {n} not done:\n{}",
        bin.stderr()
    );
}

/// Rewrites `file`, sends SIGHUP and waits for the `n`th refused reload.
#[track_caller]
fn reload_refused(bin: &RustleProcess, file: &Path, text: &str, n: usize) {
    std::fs::write(file, text).unwrap();
    bin.signal("HUP");
    assert!(
        bin.wait_for_stderr_n("keeping the previous configuration", n, Duration::from_secs(5)),
        "reload {n} not refused:\n{}",
        bin.stderr()
    );
}

fn get_body(addr: SocketAddr, url: &str) -> Vec<u8> {
    let mut c = Conn::open(addr);
    c.send(&get(url));
    let r = c.read_response();
    assert_eq!(r.status, 200, "{}", r.head_text());
    r.body
}

#[test]
fn sighup_adds_and_removes_listeners_while_a_tunnel_stays_open() {
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let dir = TempDir::new("reload-listeners");
    let file = dir.file("rustle.toml");
    let (a, b, c) = (free_port(), free_port(), free_port());
    let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    let first = format!("{HEAD}{}{}", listener_toml("http", a), listener_toml("socks", b));
    std::fs::write(&file, &first).unwrap();
    let mut bin = RustleProcess::spawn(&["--config", file.to_str().unwrap()]);
    assert_eq!(bin.next_listener(), at(a));
    assert_eq!(bin.next_listener(), at(b));
    // A tunnel through the listener that stays.
    let (mut tunnel, r) = connect_with(at(a), &echo.addr().to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.head_text());
    assert_echoes(&mut tunnel.s, b"before the reload");

    // b goes, c comes (an auto listener); a stays (listed second now).
    let second = format!("{HEAD}{}{}", listener_toml("auto", c), listener_toml("http", a));
    reload(&bin, &file, &second, 1);
    assert_eq!(bin.next_listener(), at(c), "the new listener is not announced");
    assert!(bin.stderr().contains(&format!("closed the listener on 127.0.0.1:{b} (socks)")));
    assert_eq!(get_body(at(c), &origin.url("/bytes/10")), pattern(10));
    assert!(wait_until(Duration::from_secs(5), || refused(at(b))), "b still accepts");
    // The open tunnel goes on, and a still takes new connections.
    assert_echoes(&mut tunnel.s, b"after the reload: the tunnel goes on");
    assert_eq!(get_body(at(a), &origin.url("/bytes/11")), pattern(11));

    // a changes kind (http to socks) and keeps its socket: SOCKS5 is served there now.
    let third = format!("{HEAD}{}{}", listener_toml("auto", c), listener_toml("socks", a));
    reload(&bin, &file, &third, 2);
    let mut s = connect(at(a));
    s.write_all(&[5, 1, 0]).unwrap();
    assert_eq!(read_exact_n(&mut s, 2), [5, 0], "a does not speak SOCKS5 after the reload");
    assert_echoes(&mut tunnel.s, b"after the second reload");
}

#[test]
fn a_reload_that_cannot_bind_or_read_its_file_changes_nothing() {
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("reload-fail");
    let file = dir.file("rustle.toml");
    let (a, b, c) = (free_port(), free_port(), free_port());
    let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    let first = format!("{HEAD}{}{}", listener_toml("http", a), listener_toml("http", b));
    std::fs::write(&file, &first).unwrap();
    let mut bin = RustleProcess::spawn(&["--config", file.to_str().unwrap()]);
    bin.next_listener();
    bin.next_listener();
    // Another program holds c: the reload that adds c (and drops b) fails as a whole.
    let squatter = std::net::TcpListener::bind(at(c)).unwrap();
    let text = format!("{HEAD}{}{}", listener_toml("http", a), listener_toml("http", c));
    reload_refused(&bin, &file, &text, 1);
    assert!(bin.stderr().contains("already in use"), "the reason is not said:\n{}", bin.stderr());
    assert_eq!(get_body(at(b), &origin.url("/bytes/3")), pattern(3), "b was closed");
    drop(squatter);
    // A file with a type error, which also adds c: nothing changes, c is not bound.
    let broken = format!(
        "{HEAD}{}{}[limits]\nmax_connections = \"many\"\n",
        listener_toml("http", a),
        listener_toml("http", c)
    );
    reload_refused(&bin, &file, &broken, 2);
    assert!(refused(at(c)), "a broken file's listener was bound");
    assert_eq!(get_body(at(b), &origin.url("/bytes/4")), pattern(4));
    assert_eq!(get_body(at(a), &origin.url("/bytes/5")), pattern(5));
    // The same reload once c is free goes through.
    reload(&bin, &file, &text, 1);
    assert_eq!(get_body(at(c), &origin.url("/bytes/6")), pattern(6));
    assert!(wait_until(Duration::from_secs(5), || refused(at(b))));
}

#[test]
fn a_reload_changes_connection_limits_and_timeouts_for_new_connections() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml("[limits]\nmax_connections = 100\n");
    let mut held = Conn::to_proxy(&proxy);
    held.send(&get(&origin.url("/bytes/1")));
    assert_eq!(held.read_response().status, 200);
    // One connection allowed: `held` has it, a new one gets the 503.
    proxy.reload_toml("[limits]\nmax_connections = 1\n[timeouts]\nkeepalive = \"300ms\"\n");
    let mut over = Conn::to_proxy(&proxy);
    let r = over.read_response();
    assert_eq!(r.status, 503, "{}", r.head_text());
    // `held` goes on.
    held.send(&get(&origin.url("/bytes/2")));
    assert_eq!(held.read_response().body, pattern(2));
    drop(held);
    drop(over);
    // Once its slot is free, a new connection is served, and closed after 300 ms idle.
    let mut fresh = None;
    let served = wait_until(Duration::from_secs(3), || {
        let mut c = Conn::to_proxy(&proxy);
        c.send(&get(&origin.url("/bytes/3")));
        let ok = c.read_response().status == 200;
        fresh = Some(c);
        ok
    });
    assert!(served, "the slot of the closed connection is not free");
    let mut fresh = fresh.unwrap();
    let start = Instant::now();
    assert!(closed_within(&mut fresh.s, Duration::from_secs(3)), "idle connection not closed");
    assert!(start.elapsed() < Duration::from_millis(1500), "closed after {:?}", start.elapsed());
}

/// One request on `s`, reading the whole response; None when the connection failed
/// before any byte of the response came. Returns whether the response closes it.
fn one_request(s: &mut TcpStream, req: &[u8], len: usize) -> Option<bool> {
    s.write_all(req).ok()?;
    let mut got = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = match s.read(&mut chunk) {
            Ok(0) | Err(_) if got.is_empty() => return None,
            Ok(0) => {
                panic!("closed in the middle of a response: {:?}", String::from_utf8_lossy(&got))
            }
            Err(e) => panic!("{e} in the middle of a response"),
            Ok(n) => n,
        };
        got.extend_from_slice(&chunk[..n]);
        let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
        if got.len() < end + 4 + len {
            continue;
        }
        let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        return Some(head.contains("connection: close"));
    }
}

/// Requests through `proxy` until `stop`: kept-alive connections of 20 requests, a new
/// one after each. A request on a reused connection that closes before any byte of the
/// response is sent again on a new connection, as HTTP clients do; a request on a new
/// connection that fails is a failure.
/// `n` client threads running `each(proxy, url, stop, done, failed)` until `stop` is set;
/// returns the stop flag, the counts of requests done and failed, and the threads.
// The four parts are taken apart at once by the callers: a struct would add only names.
#[allow(clippy::type_complexity)]
fn clients(
    n: usize,
    proxy: SocketAddr,
    url: &str,
    each: fn(SocketAddr, String, Arc<AtomicBool>, Arc<AtomicU64>, Arc<AtomicU64>),
) -> (Arc<AtomicBool>, Arc<AtomicU64>, Arc<AtomicU64>, Vec<std::thread::JoinHandle<()>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let threads = (0..n)
        .map(|_| {
            let (url, stop, done, failed) =
                (url.to_string(), stop.clone(), done.clone(), failed.clone());
            std::thread::spawn(move || each(proxy, url, stop, done, failed))
        })
        .collect();
    (stop, done, failed, threads)
}

fn load(
    proxy: SocketAddr,
    url: String,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
) {
    let req = get(&url);
    while !stop.load(Ordering::Relaxed) {
        let mut s = match TcpStream::connect(proxy) {
            Ok(s) => s,
            Err(_) => {
                failed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        for i in 0..20 {
            match one_request(&mut s, &req, 100) {
                Some(closes) => {
                    done.fetch_add(1, Ordering::Relaxed);
                    if closes {
                        break;
                    }
                }
                None if i == 0 => {
                    failed.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                None => break,
            }
        }
    }
}

#[test]
fn takeover_under_load_refuses_nothing_and_the_old_process_drains() {
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let dir = TempDir::new("takeover");
    let file = dir.file("rustle.toml");
    let ctl = dir.file("control.sock");
    let port = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let text = format!(
        "{HEAD}[process]\ncontrol_socket = \"{}\"\n[timeouts]\nshutdown = \"20s\"\n{}",
        ctl.display(),
        listener_toml("http", port)
    );
    std::fs::write(&file, &text).unwrap();
    let config = file.to_str().unwrap();
    let mut old = RustleProcess::spawn(&["--config", config]);
    assert_eq!(old.next_listener(), addr);
    assert!(old.wait_for_stderr("control socket", Duration::from_secs(5)), "{}", old.stderr());

    // Without --takeover a second instance is refused, and says how to take over.
    let mut second = RustleProcess::spawn(&["--config", config]);
    assert!(second.wait(Duration::from_secs(10)).is_some_and(|s| !s.success()));
    let err = second.stderr();
    assert!(err.contains("already in use") && err.contains("--takeover"), "{err}");

    let (stop, done, failed, clients) = clients(3, addr, &origin.url("/bytes/100"), load);
    let count = || done.load(Ordering::Relaxed);
    assert!(wait_until(Duration::from_secs(10), || count() > 200), "no load");
    let (mut tunnel, r) = connect_with(addr, &echo.addr().to_string(), &[]);
    assert_eq!(r.status, 200);
    assert_echoes(&mut tunnel.s, b"on the old process");

    let mut new = RustleProcess::spawn(&["--config", config, "--takeover"]);
    assert_eq!(new.next_listener(), addr);
    assert!(
        old.wait_for_stderr("stops accepting", Duration::from_secs(10)),
        "the old process does not drain:\n{}",
        old.stderr()
    );
    let at_takeover = count();
    assert!(wait_until(Duration::from_secs(10), || count() > at_takeover + 300));
    // The old process waits for the tunnel it serves, which still works.
    assert_eq!(old.wait(Duration::from_millis(200)), None, "the old process left its tunnel");
    assert_echoes(&mut tunnel.s, b"still on the old process, draining");
    drop(tunnel);
    let status = old.wait(Duration::from_secs(10)).expect("the old process exits after its drain");
    assert!(status.success(), "{status}\n{}", old.stderr());
    let after_exit = count();
    assert!(wait_until(Duration::from_secs(10), || count() > after_exit + 200));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    eprintln!(
        "takeover under load: {} requests, {} failed",
        count(),
        failed.load(Ordering::Relaxed)
    );
    assert_eq!(failed.load(Ordering::Relaxed), 0, "requests failed; {} done", count());
    // The new process answers on the control socket now: a SIGHUP and a second takeover
    // work as with the first.
    new.signal("HUP");
    assert!(new.wait_for_stderr("SIGHUP: reloaded", Duration::from_secs(5)), "{}", new.stderr());
    let mut third = RustleProcess::spawn(&["--config", config, "--takeover"]);
    assert_eq!(third.next_listener(), addr);
    let status = new.wait(Duration::from_secs(10)).expect("the second process exits");
    assert!(status.success());
    assert_eq!(get_body(addr, &origin.url("/bytes/7")), pattern(7));
}

#[test]
fn takeover_without_a_running_rustle_says_so() {
    let dir = TempDir::new("takeover-none");
    let ctl = dir.file("control.sock");
    let file = dir.file("rustle.toml");
    let text = format!(
        "{HEAD}[process]\ncontrol_socket = \"{}\"\n{}",
        ctl.display(),
        listener_toml("http", 0)
    );
    std::fs::write(&file, text).unwrap();
    let mut bin = RustleProcess::spawn(&["--config", file.to_str().unwrap(), "--takeover"]);
    let status = bin.wait(Duration::from_secs(10)).expect("exits");
    assert!(!status.success());
    assert!(bin.stderr().contains("no rustle answers on the control socket"), "{}", bin.stderr());
}

/// Starts rustle with a listening socket on 127.0.0.1:`port` passed as systemd passes it
/// (LISTEN_FDS=1, LISTEN_PID, descriptor 3): through `systemd-socket-activate` (which
/// binds the port itself) when `tool` and it is installed (`.ci/run` installs it), else
/// with a pre-exec step.
fn socket_activated(port: u16, args: &[&str], tool: bool) -> RustleProcess {
    let addr = format!("127.0.0.1:{port}");
    if tool && rustle_bench::tools::part("systemd-socket-activate") {
        let mut all = vec!["-l", &addr, "-E", "RUST_LOG", "--fdname=proxy", rustle_bin()];
        all.extend_from_slice(args);
        return RustleProcess::spawn_program("systemd-socket-activate", &all);
    }
    let listener = std::net::TcpListener::bind(&addr).unwrap();
    RustleProcess::spawn_with_listen_fd(args, listener)
}

#[test]
fn socket_activation_serves_the_passed_socket() {
    socket_activation(true);
}

#[test]
fn socket_activation_by_hand_serves_the_passed_socket() {
    socket_activation(false);
}

fn socket_activation(tool: bool) {
    let origin = Origin::start().unwrap();
    let port = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let dir = TempDir::new("activation");
    let ctl = dir.file("control.sock");
    let file = dir.file("rustle.toml");
    let text = format!(
        "{HEAD}[process]\ncontrol_socket = \"{}\"\n{}{}",
        ctl.display(),
        listener_toml("http", port),
        listener_toml("socks", 0)
    );
    std::fs::write(&file, text).unwrap();
    let mut bin = socket_activated(port, &["--config", file.to_str().unwrap()], tool);
    // The socket listens before rustle runs: this request waits in its queue until
    // rustle serves it.
    assert!(wait_until(Duration::from_secs(5), || !refused(addr)), "nothing listens");
    let mut c = Conn::open(addr);
    c.send(&get(&origin.url("/bytes/12")));
    assert_eq!(c.read_response().body, pattern(12));
    assert_eq!(bin.next_listener(), addr);
    let err = bin.stderr();
    assert!(err.contains(&format!("socket activation: {addr} (tcp)")), "{err}");
    // The other listener is bound as usual.
    let socks = bin.next_listener();
    let mut s = connect(socks);
    s.write_all(&[5, 1, 0]).unwrap();
    assert_eq!(read_exact_n(&mut s, 2), [5, 0]);
    for _ in 0..10 {
        assert_eq!(get_body(addr, &origin.url("/bytes/13")), pattern(13));
    }
}

/// The admin endpoint's address, from the line that says where it is.
fn admin_addr_of(p: &RustleProcess) -> SocketAddr {
    assert!(
        p.wait_for_stderr("admin endpoint on http://", Duration::from_secs(10)),
        "no admin endpoint:\n{}",
        p.stderr()
    );
    let err = p.stderr();
    let rest = err.rsplit("admin endpoint on http://").next().unwrap();
    rest.split('/').next().unwrap().parse().expect("the admin address")
}

/// One admin request on a new connection: its status and body.
fn admin_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = connect(addr);
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: admin\r\n\r\n").as_bytes()).unwrap();
    let (bytes, _) = read_until_close(&mut s);
    let r = parse_response(&bytes);
    (r.status, r.text())
}

/// Requests through `proxy` until `stop`, as a client that keeps connections alive and
/// never resends: each request on a connection must get its whole answer; a new
/// connection is opened when an answer says `Connection: close`. A request that gets no
/// whole answer (a reset, an empty reply, a connection refused) is counted in `lost`.
fn kept_alive_load(
    proxy: SocketAddr,
    url: String,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    lost: Arc<AtomicU64>,
) {
    let req = get(&url);
    let mut conn: Option<TcpStream> = None;
    while !stop.load(Ordering::Relaxed) {
        let s = match &mut conn {
            Some(s) => s,
            None => match TcpStream::connect(proxy) {
                Ok(s) => {
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    conn.insert(s)
                }
                Err(e) => {
                    eprintln!("connect: {e}");
                    lost.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            },
        };
        match whole_answer(s, &req, 100) {
            Ok(closes) => {
                done.fetch_add(1, Ordering::Relaxed);
                if closes {
                    conn = None;
                }
            }
            Err(what) => {
                eprintln!("a request lost: {what}");
                lost.fetch_add(1, Ordering::Relaxed);
                conn = None;
            }
        }
    }
}

/// One request on `s` and its whole 200 answer with a `len`-byte body; whether the answer
/// closes the connection, or what went wrong.
fn whole_answer(s: &mut TcpStream, req: &[u8], len: usize) -> Result<bool, String> {
    s.write_all(req).map_err(|e| format!("write: {e}"))?;
    let mut got = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = s.read(&mut chunk).map_err(|e| format!("read after {} bytes: {e}", got.len()))?;
        if n == 0 {
            return Err(format!("closed after {} bytes of the answer", got.len()));
        }
        got.extend_from_slice(&chunk[..n]);
        let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
        if got.len() < end + 4 + len {
            continue;
        }
        let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
        if !head.starts_with("http/1.1 200") {
            return Err(head);
        }
        return Ok(head.contains("connection: close"));
    }
}

#[test]
fn takeover_with_admin_hands_its_port_over_and_loses_no_kept_alive_request() {
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("takeover-admin");
    let file = dir.file("rustle.toml");
    let ctl = dir.file("control.sock");
    let port = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let text = format!(
        "{HEAD}[process]\ncontrol_socket = \"{}\"\n[timeouts]\nshutdown = \"20s\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n{}",
        ctl.display(),
        listener_toml("http", port)
    );
    std::fs::write(&file, &text).unwrap();
    let config = file.to_str().unwrap();
    let mut old = RustleProcess::spawn(&["--config", config]);
    assert_eq!(old.next_listener(), addr);
    let admin = admin_addr_of(&old);
    assert!(old.wait_for_stderr("control socket", Duration::from_secs(5)), "{}", old.stderr());
    assert_eq!(admin_get(admin, "/readyz").0, 200);

    let (stop, done, lost, clients) = clients(4, addr, &origin.url("/bytes/100"), kept_alive_load);
    let count = || done.load(Ordering::Relaxed);
    assert!(wait_until(Duration::from_secs(10), || count() > 300), "no load");

    let mut new = RustleProcess::spawn(&["--config", config, "--takeover"]);
    assert_eq!(new.next_listener(), addr);
    assert_eq!(admin_addr_of(&new), admin, "the new process serves the same admin port");
    assert!(
        old.wait_for_stderr("stops accepting", Duration::from_secs(10)),
        "the old process does not drain:\n{}",
        old.stderr()
    );
    let at_takeover = count();
    let status = old.wait(Duration::from_secs(15)).expect("the old process exits after its drain");
    assert!(status.success(), "{status}\n{}", old.stderr());
    assert!(wait_until(Duration::from_secs(10), || count() > at_takeover + 500));
    // The admin port is the new process's now: ready, and counting its requests.
    assert_eq!(admin_get(admin, "/readyz"), (200, "ready\n".to_string()));
    let (status, metrics) = admin_get(admin, "/metrics");
    assert_eq!(status, 200);
    assert!(metrics.contains("rustle_listener_requests_total{"), "{metrics}");
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    eprintln!(
        "takeover under kept-alive load: {} requests, {} lost",
        count(),
        lost.load(Ordering::Relaxed)
    );
    assert_eq!(lost.load(Ordering::Relaxed), 0, "requests lost; {} done", count());
    new.signal("TERM");
    assert!(new.wait(Duration::from_secs(25)).is_some_and(|s| s.success()), "{}", new.stderr());
}

#[test]
fn drain_delay_keeps_accepting_with_readyz_503_after_sigterm() {
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("drain-delay");
    let file = dir.file("rustle.toml");
    let text = format!(
        "{HEAD}[timeouts]\ndrain_delay = \"3s\"\n[admin]\nlisten = \"127.0.0.1:0\"\n{}",
        listener_toml("http", 0)
    );
    std::fs::write(&file, &text).unwrap();
    let mut p = RustleProcess::spawn(&["--config", file.to_str().unwrap()]);
    let addr = p.next_listener();
    let admin = admin_addr_of(&p);
    assert_eq!(admin_get(admin, "/readyz").0, 200);
    p.signal("TERM");
    assert!(
        wait_until(Duration::from_secs(5), || admin_get(admin, "/readyz").0 == 503),
        "/readyz stays 200 after SIGTERM:\n{}",
        p.stderr()
    );
    // Within the delay: new connections are still accepted and served.
    assert_eq!(get_body(addr, &origin.url("/bytes/7")), pattern(7));
    assert_eq!(admin_get(admin, "/healthz").0, 200);
    assert_eq!(p.wait(Duration::ZERO), None, "exited within its drain delay");
    let status = p.wait(Duration::from_secs(15)).expect("exits after the delay");
    assert!(status.success(), "{status}\n{}", p.stderr());
    assert!(p.stderr().contains("timeouts.drain_delay"), "{}", p.stderr());
}
