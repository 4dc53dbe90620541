//! Helpers shared by the integration tests: an in-process proxy with its access log in a
//! temporary file, external clients that skip cleanly when missing, a raw-socket
//! HTTP/1.1 client with a small response parser, raw SOCKS clients, and (`peers`) squid
//! and dante started as parent proxies.
#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustle::config::{Config, Listener, ListenerKind, LogTarget};
use rustle::run::server::Running;
use sha2::{Digest, Sha256};

pub(crate) mod peers;

/// How long a raw client waits for bytes before giving up on a read.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How often `wait_until` looks again: often enough that a test waits a few ms past its
/// event, rarely enough that a poll (reading a log file, /proc) costs nothing to measure.
const POLL_EVERY: Duration = Duration::from_millis(10);

/// Waits for an event: looks at `cond` until it holds or `limit` has passed, and says
/// whether it held. The tests' one way to wait for something to have happened (a log
/// line, a counter, a listener up or gone, a process exit) instead of sleeping for it;
/// `limit` is a failure bound, generous so that a loaded machine does not fail the test.
pub(crate) fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL_EVERY);
    }
}

/// `wait_until` for a value: looks at `get` until it gives one, for up to `limit`; panics
/// naming `what` was awaited when it gives none.
#[track_caller]
pub(crate) fn wait_for<T>(limit: Duration, what: &str, mut get: impl FnMut() -> Option<T>) -> T {
    let mut got = None;
    wait_until(limit, || {
        got = get();
        got.is_some()
    });
    got.unwrap_or_else(|| panic!("waited {limit:?} for {what}, in vain"))
}

/// `wait_until` for async tests, whose own tasks (an h2 connection's driver, say) must go
/// on while they wait.
pub(crate) async fn wait_until_async(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// A scratch directory removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rustle-it-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    pub(crate) fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The in-kernel forwarding of the proxies tests start in this process: every plain tunnel
/// handed to the kernel where it can be (root), so that every tunnel test runs on the
/// kernel path too; the binary's default (off, the relay) is what the tests that spawn
/// `rustle` run, and `kernel.rs` runs its scenarios both ways.
pub(crate) fn kernel_forwarding() -> rustle::config::KernelForwarding {
    match crate::util::peers::is_root() {
        true => rustle::config::KernelForwarding::Require,
        false => rustle::config::KernelForwarding::Off,
    }
}

/// A proxy running in this process: one worker on 127.0.0.1:0, access log in a temp file.
pub(crate) struct Proxy {
    running: Option<Running>,
    addr: SocketAddr,
    addrs: Vec<(ListenerKind, SocketAddr)>,
    log: PathBuf,
    _dir: TempDir,
}

impl Proxy {
    pub(crate) fn start() -> Proxy {
        Proxy::start_with(|_| {})
    }

    /// Starts with the test defaults, then whatever `tweak` changes.
    pub(crate) fn start_with(tweak: impl FnOnce(&mut Config)) -> Proxy {
        let dir = TempDir::new("proxy");
        let log = dir.file("access.log");
        let mut cfg = Config {
            workers: 1,
            listeners: vec![Listener::new(ListenerKind::Http, "127.0.0.1:0".parse().unwrap())],
            ..Config::default()
        };
        cfg.log.access = LogTarget::File(log.clone());
        cfg.timeouts.shutdown = Duration::from_millis(500);
        cfg.relay.kernel_forwarding = kernel_forwarding();
        tweak(&mut cfg);
        let running = rustle::run::server::start(cfg).expect("proxy starts");
        let addrs = running.addrs();
        let addr = addrs[0].1;
        Proxy { running: Some(running), addr, addrs, log, _dir: dir }
    }

    /// A proxy with one listener of `kind` on 127.0.0.1:0 (with `target` for the relay
    /// kinds), then whatever `tweak` changes.
    pub(crate) fn with_listener(
        kind: ListenerKind,
        target: Option<SocketAddr>,
        tweak: impl FnOnce(&mut Config),
    ) -> Proxy {
        Proxy::start_with(|cfg| {
            cfg.listeners = vec![listener(kind, target)];
            tweak(cfg);
        })
    }

    /// A proxy with one SOCKS listener.
    pub(crate) fn socks() -> Proxy {
        Proxy::with_listener(ListenerKind::Socks, None, |_| {})
    }

    /// Bytes each way per authenticated user so far.
    pub(crate) fn traffic(&self) -> Vec<(String, u64, u64)> {
        self.running.as_ref().map(|r| r.traffic()).unwrap_or_default()
    }

    /// The running proxy.
    pub(crate) fn running(&self) -> &Running {
        self.running.as_ref().expect("the proxy runs")
    }

    /// The admin endpoint's address (`[admin] listen`).
    pub(crate) fn admin_addr(&self) -> SocketAddr {
        self.running().admin_addr().expect("an admin listener")
    }

    /// Every listener's kind and bound address, in configuration order.
    pub(crate) fn addrs(&self) -> &[(ListenerKind, SocketAddr)] {
        &self.addrs
    }

    /// The whole access log as written so far (no waiting).
    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, for `curl -x` and friends.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The access-log lines written so far, waiting up to ~1 s for at least one (the log
    /// is flushed every 100 ms).
    pub(crate) fn log_lines(&self) -> Vec<String> {
        wait_until(Duration::from_millis(1200), || !self.log_text().is_empty());
        self.log_text().lines().map(str::to_string).collect()
    }

    /// The first log line satisfying `pred`, waiting up to 5 s for it; panics with every
    /// line seen when none matches.
    pub(crate) fn log_line(&self, pred: impl Fn(&str) -> bool) -> String {
        let mut found = None;
        wait_until(Duration::from_secs(5), || {
            found = self.log_text().lines().find(|l| pred(l)).map(str::to_string);
            found.is_some()
        });
        found.unwrap_or_else(|| {
            panic!("no matching access-log line; the log has:\n{}", self.log_text())
        })
    }

    /// The access-log lines satisfying `pred`, once there are at least `n` (waiting up to
    /// 5 s; fewer then).
    pub(crate) fn log_lines_matching(&self, n: usize, pred: impl Fn(&str) -> bool) -> Vec<String> {
        let lines = || -> Vec<String> {
            self.log_text().lines().filter(|l| pred(l)).map(str::to_string).collect()
        };
        wait_until(Duration::from_secs(5), || lines().len() >= n);
        lines()
    }

    /// Mode switches (to splice, back to copy) of this proxy's relays so far.
    pub(crate) fn mode_switches(&self) -> (u64, u64) {
        self.running.as_ref().map(|r| r.mode_switches()).unwrap_or_default()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop();
        }
    }
}

/// The calling test needs `tool`: whether it runs. A missing one fails the test with
/// `RUSTLE_REQUIRE_TOOLS=1` (`.ci/run`), and otherwise skips it: the caller returns, and the
/// test binary ends with the count of skipped tests (`rustle_bench::tools`).
#[track_caller]
pub(crate) fn have(tool: &str) -> bool {
    rustle_bench::tools::need(tool)
}

/// Part of the calling test needs `tool`, which `.ci/run` installs: whether it runs; a
/// missing one fails with `RUSTLE_REQUIRE_TOOLS=1`, else that part is left out (counted).
#[track_caller]
pub(crate) fn have_for_part(tool: &str) -> bool {
    rustle_bench::tools::part(tool)
}

/// A command with no proxy settings inherited from the environment (NO_PROXY would make
/// curl bypass `-x` for 127.0.0.1).
pub(crate) fn clean_command(program: &str) -> Command {
    let mut cmd = Command::new(program);
    for var in [
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
        "no_proxy",
        "NO_PROXY",
    ] {
        cmd.env_remove(var);
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// Runs curl with `args` (silent, with a global time limit); None when curl is missing,
/// after saying so.
pub(crate) fn curl(args: &[&str]) -> Option<Output> {
    if !have("curl") {
        return None;
    }
    let out = clean_command("curl")
        .args(["--silent", "--show-error", "--max-time", "30"])
        .args(args)
        .output()
        .expect("run curl");
    Some(out)
}

/// Asserts that a process succeeded, showing its stderr when not.
pub(crate) fn assert_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed with {}: stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    rustle_bench::pattern::hex(&Sha256::digest(bytes))
}

/// Connects to `addr` with the raw-client read timeout.
pub(crate) fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Writes `bytes` to the proxy on a new connection and reads until the proxy closes it
/// (or a read times out).
pub(crate) fn raw(proxy: &Proxy, bytes: &[u8]) -> Vec<u8> {
    raw_to(proxy.addr(), bytes)
}

pub(crate) fn raw_to(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = connect(addr);
    s.write_all(bytes).expect("write request");
    read_until_close(&mut s).0
}

/// Reads until EOF, a connection reset, or the read timeout. Returns the bytes and whether
/// the connection was seen closed (EOF or reset) rather than timing out.
pub(crate) fn read_until_close(s: &mut TcpStream) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return (out, true),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut =>
            {
                return (out, false)
            }
            Err(e) => panic!("read failed: {e}"),
        }
    }
}

/// Whether the peer closes `s` within `within` without sending anything more.
pub(crate) fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 1024];
    let read = loop {
        match s.read(&mut buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => break r,
        }
    };
    let r = match read {
        Ok(0) => true,
        Ok(n) => {
            panic!("expected the connection to close, got {:?}", String::from_utf8_lossy(&buf[..n]))
        }
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => true,
        Err(_) => false,
    };
    s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    r
}

/// A parsed HTTP/1.1 response.
#[derive(Debug, Clone)]
pub(crate) struct Resp {
    pub status: u16,
    pub reason: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The raw head, CRLFCRLF included.
    pub head: Vec<u8>,
}

impl Resp {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub(crate) fn has_header(&self, name: &str) -> bool {
        self.header(name).is_some()
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The head as text, for assertion messages.
    pub(crate) fn head_text(&self) -> String {
        String::from_utf8_lossy(&self.head).into_owned()
    }
}

/// Parses a head (without body) from its bytes.
pub(crate) fn parse_head(head: &[u8]) -> Resp {
    let text = std::str::from_utf8(head).expect("response head is UTF-8");
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    assert!(version.starts_with("HTTP/1."), "not an HTTP/1 status line: {status_line:?}");
    let status = parts.next().unwrap_or_default().parse().expect("status code");
    let reason = parts.next().unwrap_or_default().to_string();
    let headers = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, v) = l.split_once(':').expect("header line has a colon");
            (n.to_string(), v.trim().to_string())
        })
        .collect();
    Resp { status, reason, headers, body: Vec::new(), head: head.to_vec() }
}

/// A buffered reader of responses on one connection, keeping leftovers between them.
pub(crate) struct Conn {
    pub s: TcpStream,
    pub buf: Vec<u8>,
}

impl Conn {
    pub(crate) fn open(addr: SocketAddr) -> Conn {
        Conn { s: connect(addr), buf: Vec::new() }
    }

    pub(crate) fn to_proxy(proxy: &Proxy) -> Conn {
        Conn::open(proxy.addr())
    }

    pub(crate) fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).expect("write to proxy");
    }

    /// Reads more bytes; 0 on EOF.
    fn more(&mut self) -> usize {
        let mut tmp = vec![0u8; 64 * 1024];
        // A signal to the test process (a child exiting) may interrupt the read: retry.
        let read = loop {
            match self.s.read(&mut tmp) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        match read {
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                n
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => 0,
            Err(e) => panic!("read failed after {} buffered bytes: {e}", self.buf.len()),
        }
    }

    pub(crate) fn take(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            assert!(
                self.more() > 0,
                "EOF after {} of {n} bytes: {:?}",
                self.buf.len(),
                String::from_utf8_lossy(&self.buf[..self.buf.len().min(200)])
            );
        }
        self.buf.drain(..n).collect()
    }

    fn line(&mut self) -> Vec<u8> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                return self.buf.drain(..=i).collect();
            }
            assert!(self.more() > 0, "EOF while reading a line");
        }
    }

    /// Reads one response head (CRLFCRLF included).
    pub(crate) fn read_head(&mut self) -> Resp {
        loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head: Vec<u8> = self.buf.drain(..i + 4).collect();
                return parse_head(&head);
            }
            assert!(
                self.more() > 0,
                "EOF while reading a response head; got {:?}",
                String::from_utf8_lossy(&self.buf)
            );
        }
    }

    /// Reads one whole response to a request with a body (not HEAD).
    pub(crate) fn read_response(&mut self) -> Resp {
        self.read_response_to(false)
    }

    /// Reads one whole response; `head_request` says the request was HEAD (no body).
    pub(crate) fn read_response_to(&mut self, head_request: bool) -> Resp {
        let mut r = self.read_head();
        let no_body =
            head_request || r.status == 204 || r.status == 304 || (100..200).contains(&r.status);
        if no_body {
            return r;
        }
        let chunked = r
            .header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        if chunked {
            loop {
                let line = self.line();
                let text = String::from_utf8_lossy(&line);
                let size = text.trim().split(';').next().unwrap_or_default();
                let n = usize::from_str_radix(size, 16).expect("chunk size");
                if n == 0 {
                    // Trailers up to the empty line.
                    while self.line() != b"\r\n" {}
                    break;
                }
                let data = self.take(n);
                r.body.extend_from_slice(&data);
                assert_eq!(self.take(2), b"\r\n", "chunk data ends with CRLF");
            }
        } else if let Some(len) = r.header("content-length") {
            let n: usize = len.parse().expect("content-length");
            r.body = self.take(n);
        } else {
            while self.more() > 0 {}
            r.body = std::mem::take(&mut self.buf);
        }
        r
    }

    /// Asserts that nothing more comes and the proxy closes the connection.
    pub(crate) fn assert_closed(&mut self) {
        let (rest, closed) = read_until_close(&mut self.s);
        self.buf.extend_from_slice(&rest);
        assert!(
            self.buf.is_empty(),
            "unexpected bytes after the response: {:?}",
            String::from_utf8_lossy(&self.buf)
        );
        assert!(closed, "the proxy did not close the connection within {READ_TIMEOUT:?}");
    }

    pub(crate) fn shutdown_write(&self) {
        self.s.shutdown(Shutdown::Write).expect("shutdown write");
    }
}

/// Parses a complete byte string holding one response (as read until close).
pub(crate) fn parse_response(bytes: &[u8]) -> Resp {
    let i = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head in {:?}", String::from_utf8_lossy(bytes)));
    let mut r = parse_head(&bytes[..i + 4]);
    r.body = bytes[i + 4..].to_vec();
    r
}

/// A GET request in absolute form for `url` (`http://host:port/path`).
pub(crate) fn get(url: &str) -> Vec<u8> {
    request("GET", url, &[], b"")
}

/// A request in absolute form with a Host header, extra header lines, and a body (a
/// Content-Length is added when the body is not empty).
pub(crate) fn request(method: &str, url: &str, headers: &[&str], body: &[u8]) -> Vec<u8> {
    let authority =
        url.split_once("://").and_then(|(_, r)| r.split('/').next()).expect("an absolute URL");
    let mut out = format!("{method} {url} HTTP/1.1\r\nHost: {authority}\r\n");
    for h in headers {
        out.push_str(h);
        out.push_str("\r\n");
    }
    if !body.is_empty() {
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// The path of the `rustle` binary built for these tests.
pub(crate) fn rustle_bin() -> &'static str {
    env!("CARGO_BIN_EXE_rustle")
}

/// An address nothing listens on: a socket bound but never listening, kept open for the
/// rest of the test process so that the kernel cannot hand the port to a proxy started
/// afterwards (connections to it are refused).
pub(crate) fn closed_port() -> SocketAddr {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into()).unwrap();
    let a = s.local_addr().unwrap().as_socket().unwrap();
    std::mem::forget(s);
    a
}

/// The fields of a plain access-log line:
/// `TIME CLIENT METHOD TARGET STATUS UP DOWN MSms UPSTREAM ["ERROR"]`.
#[derive(Debug, Clone)]
pub(crate) struct LogLine {
    pub client: String,
    pub method: String,
    pub target: String,
    pub status: u16,
    pub up: u64,
    pub down: u64,
    pub upstream: String,
    /// The quoted cause, unquoted; empty when there is none.
    pub error: String,
    /// The authenticated user (` user=NAME`), empty when there is none.
    pub user: String,
}

impl LogLine {
    pub(crate) fn parse(line: &str) -> LogLine {
        let f: Vec<&str> = line.splitn(10, ' ').collect();
        assert!(f.len() >= 9, "not an access-log line: {line:?}");
        // ` user=NAME` comes between the upstream and the quoted cause.
        let (user, error) = match f.get(9) {
            Some(rest) => match rest.strip_prefix("user=") {
                Some(rest) => match rest.split_once(' ') {
                    Some((u, e)) => (u, e),
                    None => (rest, ""),
                },
                None => ("", *rest),
            },
            None => ("", ""),
        };
        LogLine {
            client: f[1].to_string(),
            method: f[2].to_string(),
            target: f[3].to_string(),
            status: f[4].parse().unwrap_or_else(|_| panic!("status in {line:?}")),
            up: f[5].parse().unwrap_or_else(|_| panic!("up in {line:?}")),
            down: f[6].parse().unwrap_or_else(|_| panic!("down in {line:?}")),
            upstream: f[8].to_string(),
            error: error.trim_matches('"').to_string(),
            user: user.to_string(),
        }
    }
}

/// A listener of `kind` on 127.0.0.1:0, relaying to `target` when given.
pub(crate) fn listener(kind: ListenerKind, target: Option<SocketAddr>) -> Listener {
    let mut l = Listener::new(kind, "127.0.0.1:0".parse().unwrap());
    l.target = target.map(|t| t.to_string().parse().expect("target is host:port"));
    l
}

/// Whether [::1] can be bound here; says so when not, for tests that then skip.
pub(crate) fn ipv6_available() -> bool {
    let ok = std::net::TcpListener::bind("[::1]:0").is_ok();
    if !ok {
        rustle_bench::tools::skip_host("cannot bind [::1] here; the IPv6 part does not run");
    }
    ok
}

/// A listener whose accept queue is full, so new SYNs are dropped and connects hang;
/// everything stays loopback. Keep it alive while using the address.
pub(crate) struct BlackHole {
    pub addr: SocketAddr,
    pub listener: socket2::Socket,
    /// The connections that fill the queue.
    pub held: Vec<TcpStream>,
}

pub(crate) fn black_hole() -> BlackHole {
    use socket2::{Domain, Socket, Type};
    let listener = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    listener.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into()).unwrap();
    listener.listen(0).unwrap();
    let addr = listener.local_addr().unwrap().as_socket().unwrap();
    let mut held = Vec::new();
    for _ in 0..8 {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(s) => held.push(s),
            // The queue is full: this SYN was dropped.
            Err(_) => return BlackHole { addr, listener, held },
        }
    }
    panic!("could not fill the accept queue of a backlog-0 listener");
}

/// Reads exactly `n` bytes, panicking with what was seen on EOF or timeout.
pub(crate) fn read_exact_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    let mut got = 0;
    while got < n {
        match s.read(&mut out[got..]) {
            Ok(0) => panic!("EOF after {got} of {n} bytes: {:?}", &out[..got]),
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => panic!("read failed after {got} of {n} bytes ({:?}): {e}", &out[..got]),
        }
    }
    out
}

/// Reads until EOF (panicking on a timeout), for payloads that end with the connection.
pub(crate) fn read_to_eof(s: &mut TcpStream) -> Vec<u8> {
    let (got, closed) = read_until_close(s);
    assert!(closed, "no EOF after {} bytes", got.len());
    got
}

/// Standard padded base64, for `Proxy-Authorization` values written by hand.
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A `Proxy-Authorization: Basic ...` header line for `user:password`.
pub(crate) fn proxy_auth(user: &str, password: &str) -> String {
    format!("Proxy-Authorization: Basic {}", base64(format!("{user}:{password}").as_bytes()))
}

/// `http://user:password@127.0.0.1:PORT`, for `curl -x`.
/// A GET of `url` through `proxy` with Basic credentials, on a connection of its own.
pub(crate) fn get_as(proxy: SocketAddr, url: &str, user: &str, password: &str) -> Resp {
    let mut c = Conn::open(proxy);
    c.send(&request("GET", url, &[&proxy_auth(user, password)], b""));
    c.read_response()
}

pub(crate) fn proxy_url_with(proxy: SocketAddr, user: &str, password: &str) -> String {
    format!("http://{user}:{password}@{proxy}")
}

impl Proxy {
    /// Starts from configuration text (TOML, checked like a file), with the test defaults
    /// forced: one worker, the access log in a temporary file, a short shutdown, and an
    /// HTTP listener on 127.0.0.1:0 when the text has none.
    pub(crate) fn from_toml(text: &str) -> Proxy {
        let parsed = Config::parse(text).unwrap_or_else(|p| {
            let p: Vec<String> = p.iter().map(|p| p.to_string()).collect();
            panic!("test configuration has problems: {p:?}\n{text}")
        });
        Proxy::start_with(move |cfg| {
            let listeners = std::mem::take(&mut cfg.listeners);
            let access = cfg.log.access.clone();
            *cfg = parsed;
            if cfg.listeners.is_empty() {
                cfg.listeners = listeners;
            }
            cfg.workers = 1;
            cfg.log.access = access;
            cfg.timeouts.shutdown = Duration::from_millis(500);
            if !text.contains("kernel_forwarding") {
                cfg.relay.kernel_forwarding = kernel_forwarding();
            }
        })
    }

    /// Puts configuration text in force, as SIGHUP does, with the test defaults forced
    /// as `from_toml` forces them (the listeners running when the text has none). Gives
    /// the reload's warnings.
    pub(crate) fn reload_toml(&self, text: &str) -> Vec<String> {
        let mut cfg = Config::parse(text).unwrap_or_else(|p| {
            let p: Vec<String> = p.iter().map(|p| p.to_string()).collect();
            panic!("reload configuration has problems: {p:?}\n{text}")
        });
        let running = self.running.as_ref().expect("the proxy runs");
        let old = running.config();
        if cfg.listeners.is_empty() {
            cfg.listeners.clone_from(&old.listeners);
        }
        cfg.workers = old.workers;
        cfg.log.access = old.log.access.clone();
        cfg.timeouts.shutdown = old.timeouts.shutdown;
        rustle::run::reload::apply(running, &cfg).expect("reload")
    }

    /// The bound address of the `index`th listener (configuration order).
    pub(crate) fn addr_of(&self, index: usize) -> SocketAddr {
        self.addrs[index].1
    }
}

/// Writes a users file (`lines` joined by newlines) into `dir` and returns its path.
pub(crate) fn users_file(dir: &TempDir, lines: &[&str]) -> PathBuf {
    let path = dir.file("users");
    std::fs::write(&path, lines.join("\n") + "\n").expect("write users file");
    path
}

/// A TCP connection to `addr` from the local address `from` (another loopback address
/// such as 127.0.0.2, to look like another client).
pub(crate) fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    let local: SocketAddr = format!("{from}:0").parse().expect("a local IPv4 address");
    s.bind(&local.into()).expect("bind the client's source address");
    s.connect(&addr.into()).expect("connect");
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

impl Conn {
    /// A connection to `addr` from the local address `from` (see `connect_from`).
    pub(crate) fn open_from(from: &str, addr: SocketAddr) -> Conn {
        Conn { s: connect_from(from, addr), buf: Vec::new() }
    }
}

/// The real `rustle` binary, started with arguments; killed on drop if still running.
/// Its stderr (diagnostics) is collected as it comes.
pub(crate) struct RustleProcess {
    pub child: std::process::Child,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    listening: std::sync::mpsc::Receiver<(String, String)>,
    /// The thread reading stderr, joined once the process has exited so that its last
    /// lines are in `stderr`.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl RustleProcess {
    /// Starts `rustle ARGS` (RUST_LOG=info) without waiting for anything.
    pub(crate) fn spawn(args: &[&str]) -> RustleProcess {
        RustleProcess::spawn_bin(rustle_bin(), args)
    }

    /// `spawn` with another build of the binary (a release build, for measurements).
    pub(crate) fn spawn_bin(bin: &str, args: &[&str]) -> RustleProcess {
        RustleProcess::spawn_with(bin, args, &[])
    }

    /// `spawn` with these environment variables set for the process.
    pub(crate) fn spawn_env(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> RustleProcess {
        RustleProcess::spawn_with(rustle_bin(), args, env)
    }

    /// Starts another program that runs rustle (`systemd-socket-activate`, say), read
    /// the same way.
    pub(crate) fn spawn_program(program: &str, args: &[&str]) -> RustleProcess {
        RustleProcess::spawn_with(program, args, &[])
    }

    /// Starts `rustle ARGS` with `listener` passed as systemd passes sockets (descriptor
    /// 3, LISTEN_FDS=1, LISTEN_PID the process's own: a shell sets it and execs rustle).
    #[allow(unsafe_code)]
    pub(crate) fn spawn_with_listen_fd(
        args: &[&str],
        listener: std::net::TcpListener,
    ) -> RustleProcess {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let mut all = vec!["-c", "LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" \"$@\"", rustle_bin()];
        all.extend_from_slice(args);
        let mut cmd = Command::new("sh");
        cmd.args(all);
        let fd = listener.as_raw_fd();
        // SAFETY: between fork and exec only dup2 and fcntl run, both async-signal-safe;
        // `fd` stays open in the parent (the listener lives until after spawn).
        unsafe {
            cmd.pre_exec(move || {
                let rc = match fd {
                    3 => libc::fcntl(3, libc::F_SETFD, 0),
                    _ => libc::dup2(fd, 3),
                };
                match rc < 0 {
                    true => Err(std::io::Error::last_os_error()),
                    false => Ok(()),
                }
            });
        }
        let p = RustleProcess::spawn_command(cmd);
        drop(listener);
        p
    }

    fn spawn_with(bin: &str, args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> RustleProcess {
        let mut cmd = Command::new(bin);
        cmd.args(args).envs(env.iter().copied());
        RustleProcess::spawn_command(cmd)
    }

    fn spawn_command(mut cmd: Command) -> RustleProcess {
        use std::io::{BufRead, BufReader};
        // No default configuration file (/etc/rustle/rustle.toml) unless a test names one.
        if !cmd.get_envs().any(|(k, _)| k == "RUSTLE_CONFIG") {
            cmd.env("RUSTLE_CONFIG", "");
        }
        let mut child = cmd
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rustle");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, listening) = std::sync::mpsc::channel();
        let mut lines = BufReader::new(child.stderr.take().unwrap());
        let seen = stderr.clone();
        let reader = std::thread::spawn(move || {
            let mut line = String::new();
            while lines.read_line(&mut line).is_ok_and(|n| n > 0) {
                // `listening on ADDR (KIND), N worker(s)`
                if let Some(rest) = line.split("listening on ").nth(1) {
                    if let Some((addr, kind)) = rest.split_once(" (") {
                        let kind = kind.split(')').next().unwrap_or_default();
                        let _ = tx.send((addr.trim().to_string(), kind.to_string()));
                    }
                }
                seen.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        RustleProcess { child, stderr, listening, reader: Some(reader) }
    }

    /// Starts `rustle ARGS` and waits until it says where its first listener is; returns
    /// the process and that address (an unspecified one turned into 127.0.0.1).
    pub(crate) fn start(args: &[&str]) -> (RustleProcess, SocketAddr) {
        RustleProcess::start_bin(rustle_bin(), args)
    }

    /// `start` with another build of the binary.
    pub(crate) fn start_bin(bin: &str, args: &[&str]) -> (RustleProcess, SocketAddr) {
        let mut p = RustleProcess::spawn_bin(bin, args);
        let addr = p.next_listener();
        (p, addr)
    }

    /// The next `listening on` address, as a loopback address one can connect to.
    pub(crate) fn next_listener(&mut self) -> SocketAddr {
        let (addr, _kind) =
            self.listening.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| {
                let _ = self.child.kill();
                panic!("rustle did not say where it listens; stderr:\n{}", self.stderr())
            });
        let mut addr: SocketAddr = addr.parse().expect("listening address");
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        addr
    }

    /// Waits up to `limit` for the process to exit.
    pub(crate) fn wait(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let mut status = None;
        wait_until(limit, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        if status.is_some() {
            // The reader thread ends with the pipe, after the last lines.
            if let Some(reader) = self.reader.take() {
                let _ = reader.join();
            }
        }
        status
    }

    pub(crate) fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits up to `limit` for stderr to contain `text`.
    pub(crate) fn wait_for_stderr(&self, text: &str, limit: Duration) -> bool {
        self.wait_for_stderr_n(text, 1, limit)
    }

    /// Waits up to `limit` for stderr to contain `text` at least `n` times.
    pub(crate) fn wait_for_stderr_n(&self, text: &str, n: usize, limit: Duration) -> bool {
        wait_until(limit, || self.stderr().matches(text).count() >= n)
    }

    /// Sends a signal (`HUP`, `TERM`) with kill(1).
    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }
}

impl Drop for RustleProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends `CONNECT target` with `headers` on a new connection to `addr`; returns the
/// connection (a tunnel after a 200) and the response (with its body when not 200).
pub(crate) fn connect_with(addr: SocketAddr, target: &str, headers: &[&str]) -> (Conn, Resp) {
    let mut c = Conn::open(addr);
    let mut req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    c.send(req.as_bytes());
    let mut r = c.read_head();
    if r.status != 200 {
        if let Some(n) = r.header("content-length").and_then(|n| n.parse().ok()) {
            r.body = c.take(n);
        }
    }
    (c, r)
}

/// Writes `msg` on a tunnel and asserts it comes back (an echo server at the far end).
pub(crate) fn assert_echoes(s: &mut TcpStream, msg: &[u8]) {
    s.write_all(msg).expect("write to the tunnel");
    assert_eq!(read_exact_n(s, msg.len()), msg, "the tunnel did not echo");
}

/// Configuration text: an HTTP listener on 127.0.0.1:0 requiring authentication, the
/// users alice/secret and bob/hunter2 (plain passwords: fast to check), and `auth_keys`
/// added to the `[auth]` table; more tables may follow.
pub(crate) fn auth_http_config(auth_keys: &str) -> String {
    format!(
        r#"
[[listener]]
listen = "127.0.0.1:0"
auth = true
[auth]
failures_burst = 1000
{auth_keys}
[[auth.user]]
name = "alice"
password = "plain:secret"
[[auth.user]]
name = "bob"
password = "plain:hunter2"
"#
    )
}

/// Downloads `n` bytes of `/bytes/N` from `origin` over an established tunnel or SOCKS
/// connection `s` (origin-form request, `Connection: close`), reading to EOF. Returns
/// the body length and how long it took from the request on.
pub(crate) fn timed_download(s: &mut TcpStream, origin: SocketAddr, n: u64) -> (usize, Duration) {
    let start = Instant::now();
    let req = format!("GET /bytes/{n} HTTP/1.1\r\nHost: {origin}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).expect("write request");
    let got = read_to_eof(s);
    let took = start.elapsed();
    let head_end = got.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head") + 4;
    let head = parse_head(&got[..head_end]);
    assert_eq!(head.status, 200, "{}", head.head_text());
    (got.len() - head_end, took)
}

/// Raw SOCKS clients, written by hand so that tests control every byte.
pub(crate) mod socks {
    use super::*;
    use rustle_proto::addr::Host;
    use rustle_proto::socks5;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4, UdpSocket};

    pub(crate) const CONNECT: u8 = 1;
    pub(crate) const BIND: u8 = 2;
    pub(crate) const UDP_ASSOCIATE: u8 = 3;

    /// A SOCKS5 destination: an address or a domain name.
    pub(crate) enum Dst<'a> {
        Addr(SocketAddr),
        Name(&'a str, u16),
    }

    /// SOCKS5 address bytes (ATYP, address, port).
    pub(crate) fn addr5(dst: &Dst<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        match dst {
            Dst::Addr(a) => {
                match a.ip() {
                    IpAddr::V4(ip) => {
                        out.push(1);
                        out.extend_from_slice(&ip.octets());
                    }
                    IpAddr::V6(ip) => {
                        out.push(4);
                        out.extend_from_slice(&ip.octets());
                    }
                }
                out.extend_from_slice(&a.port().to_be_bytes());
            }
            Dst::Name(name, port) => {
                out.push(3);
                out.push(name.len() as u8);
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(&port.to_be_bytes());
            }
        }
        out
    }

    /// A SOCKS5 request: VER CMD RSV then the address.
    pub(crate) fn request5(cmd: u8, dst: &Dst<'_>) -> Vec<u8> {
        let mut out = vec![5, cmd, 0];
        out.extend_from_slice(&addr5(dst));
        out
    }

    /// Sends a greeting offering `methods` and returns the method the proxy chose.
    pub(crate) fn greet(s: &mut TcpStream, methods: &[u8]) -> u8 {
        let mut g = vec![5, methods.len() as u8];
        g.extend_from_slice(methods);
        s.write_all(&g).expect("write greeting");
        let r = read_exact_n(s, 2);
        assert_eq!(r[0], 5, "method selection version: {r:?}");
        r[1]
    }

    /// Reads one SOCKS5 reply: the reply code and the address it names.
    pub(crate) fn read_reply5(s: &mut TcpStream) -> (u8, SocketAddr) {
        let head = read_exact_n(s, 4);
        assert_eq!(head[0], 5, "reply version: {head:?}");
        assert_eq!(head[2], 0, "reply RSV: {head:?}");
        let ip = match head[3] {
            1 => {
                let b = read_exact_n(s, 4);
                IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
            }
            4 => {
                let b: [u8; 16] = read_exact_n(s, 16).try_into().unwrap();
                IpAddr::V6(Ipv6Addr::from(b))
            }
            other => panic!("reply address type {other}: {head:?}"),
        };
        let p = read_exact_n(s, 2);
        (head[1], SocketAddr::new(ip, u16::from_be_bytes([p[0], p[1]])))
    }

    /// Connects to a SOCKS5 proxy, offers no authentication, sends `cmd` for `dst`, and
    /// returns the connection with the first reply.
    pub(crate) fn open5(proxy: SocketAddr, cmd: u8, dst: &Dst<'_>) -> (TcpStream, u8, SocketAddr) {
        let mut s = connect(proxy);
        assert_eq!(greet(&mut s, &[0]), 0, "the proxy refused no-auth");
        s.write_all(&request5(cmd, dst)).expect("write request");
        let (rep, bound) = read_reply5(&mut s);
        (s, rep, bound)
    }

    /// A SOCKS5 CONNECT tunnel to `dst`, asserting success.
    pub(crate) fn connect5(proxy: SocketAddr, dst: &Dst<'_>) -> TcpStream {
        let (s, rep, _) = open5(proxy, CONNECT, dst);
        assert_eq!(rep, 0, "SOCKS5 CONNECT reply");
        s
    }

    /// A SOCKS4 request (or SOCKS4a when `name` is given: the IP is then 0.0.0.1).
    pub(crate) fn request4(cmd: u8, dst: SocketAddrV4, user: &str, name: Option<&str>) -> Vec<u8> {
        let mut out = vec![4, cmd];
        out.extend_from_slice(&dst.port().to_be_bytes());
        match name {
            Some(_) => out.extend_from_slice(&[0, 0, 0, 1]),
            None => out.extend_from_slice(&dst.ip().octets()),
        }
        out.extend_from_slice(user.as_bytes());
        out.push(0);
        if let Some(n) = name {
            out.extend_from_slice(n.as_bytes());
            out.push(0);
        }
        out
    }

    /// Reads one SOCKS4 reply: the code and the address it names.
    pub(crate) fn read_reply4(s: &mut TcpStream) -> (u8, SocketAddrV4) {
        let r = read_exact_n(s, 8);
        assert_eq!(r[0], 0, "SOCKS4 reply VN: {r:?}");
        let port = u16::from_be_bytes([r[2], r[3]]);
        (r[1], SocketAddrV4::new(Ipv4Addr::new(r[4], r[5], r[6], r[7]), port))
    }

    /// RFC 1929 sub-negotiation bytes for `user` and `password`.
    pub(crate) fn credentials(user: &[u8], password: &[u8]) -> Vec<u8> {
        let mut out = vec![1, user.len() as u8];
        out.extend_from_slice(user);
        out.push(password.len() as u8);
        out.extend_from_slice(password);
        out
    }

    /// Greets offering username/password only, sends the credentials and returns the
    /// sub-negotiation status (0 is success).
    pub(crate) fn login5(s: &mut TcpStream, user: &str, password: &str) -> u8 {
        assert_eq!(greet(s, &[2]), 2, "the proxy did not pick username/password");
        s.write_all(&credentials(user.as_bytes(), password.as_bytes())).expect("write creds");
        let r = read_exact_n(s, 2);
        assert_eq!(r[0], 1, "sub-negotiation version: {r:?}");
        r[1]
    }

    /// A SOCKS5 CONNECT to `dst` as `user`, asserting that the login and the CONNECT
    /// succeed.
    pub(crate) fn connect5_as(
        proxy: SocketAddr,
        user: &str,
        password: &str,
        dst: &Dst<'_>,
    ) -> TcpStream {
        let mut s = connect(proxy);
        assert_eq!(login5(&mut s, user, password), 0, "login of {user} refused");
        s.write_all(&request5(CONNECT, dst)).expect("write request");
        let (rep, _) = read_reply5(&mut s);
        assert_eq!(rep, 0, "SOCKS5 CONNECT reply for {user}");
        s
    }

    pub(crate) fn v4(a: SocketAddr) -> SocketAddrV4 {
        match a {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => panic!("{a} is not IPv4"),
        }
    }

    /// A UDP socket on 127.0.0.1, for the client side of an association.
    pub(crate) fn udp_client() -> UdpSocket {
        UdpSocket::bind("127.0.0.1:0").unwrap()
    }

    /// A datagram for the relay: the SOCKS5 UDP header for `dst`, then `payload`.
    pub(crate) fn datagram(dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
        let mut d = Vec::with_capacity(payload.len() + socks5::MAX_UDP_HEADER);
        socks5::write_udp_header(dst, &mut d);
        d.extend_from_slice(payload);
        d
    }

    /// The next datagram on `sock` within `within`, as (source, bytes); None on silence.
    pub(crate) fn recv_raw(sock: &UdpSocket, within: Duration) -> Option<(SocketAddr, Vec<u8>)> {
        sock.set_read_timeout(Some(within)).unwrap();
        let mut buf = vec![0u8; 70_000];
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => Some((from, buf[..n].to_vec())),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                None
            }
            Err(e) => panic!("recv failed: {e}"),
        }
    }

    /// The next datagram from the relay, unwrapped: (the address its header names, payload).
    pub(crate) fn recv_via(sock: &UdpSocket, relay: SocketAddr) -> (SocketAddr, Vec<u8>) {
        let (from, d) = recv_raw(sock, Duration::from_secs(3)).expect("an echo through the relay");
        assert_eq!(from, relay, "the reply comes from the relay address");
        let (header, offset) = socks5::parse_udp(&d).expect("a SOCKS5 UDP header");
        assert_eq!(header.frag, 0);
        let Host::Ip(ip) = header.dst.host else { panic!("header names a domain: {header:?}") };
        (SocketAddr::new(ip, header.dst.port), d[offset..].to_vec())
    }

    /// UDP ASSOCIATE on a new connection to a SOCKS5 proxy, declaring `declared` as where
    /// datagrams will come from; logs in as `login` (user, password) when given, with no
    /// authentication otherwise. Asserts success; returns the control connection (the
    /// association lives as long as it) and the relay address of the reply.
    pub(crate) fn associate5(
        proxy: SocketAddr,
        login: Option<(&str, &str)>,
        declared: SocketAddr,
    ) -> (TcpStream, SocketAddr) {
        let mut s = connect(proxy);
        match login {
            Some((user, password)) => {
                assert_eq!(login5(&mut s, user, password), 0, "login of {user} refused")
            }
            None => assert_eq!(greet(&mut s, &[0]), 0, "the proxy refused no-auth"),
        }
        s.write_all(&request5(UDP_ASSOCIATE, &Dst::Addr(declared))).expect("write request");
        let (rep, relay) = read_reply5(&mut s);
        assert_eq!(rep, 0, "UDP ASSOCIATE reply");
        assert_ne!(relay.port(), 0, "relay address {relay}");
        (s, relay)
    }
}

/// An origin that serves one connection with fixed bytes and keeps what it received:
/// for answers no well-behaved fixture sends, and to see exactly what a proxy forwarded.
pub(crate) struct RawOrigin {
    addr: SocketAddr,
    received: std::sync::mpsc::Receiver<Vec<u8>>,
    so_far: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl RawOrigin {
    /// Accepts one connection, reads until `complete(received so far)` holds (or the
    /// proxy stops sending), writes `answer`, then closes.
    pub(crate) fn start(
        answer: &[u8],
        complete: impl Fn(&[u8]) -> bool + Send + 'static,
    ) -> RawOrigin {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind raw origin");
        let addr = listener.local_addr().unwrap();
        let answer = answer.to_vec();
        let (tx, received) = std::sync::mpsc::channel();
        let so_far = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = so_far.clone();
        std::thread::spawn(move || {
            let Ok((mut s, _)) = listener.accept() else { return };
            s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 16 * 1024];
            while !complete(&got) {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        got.extend_from_slice(&buf[..n]);
                        seen.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                }
            }
            let _ = s.write_all(&answer);
            let _ = s.shutdown(Shutdown::Write);
            let _ = tx.send(got);
            // Read what else comes until the proxy closes, so that closing here sends
            // no reset that could cut the answer short.
            while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
        });
        RawOrigin { addr, received, so_far }
    }

    /// Serves `answer` as soon as a request head is in.
    pub(crate) fn answering(answer: &[u8]) -> RawOrigin {
        RawOrigin::start(answer, |b| b.windows(4).any(|w| w == b"\r\n\r\n"))
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bytes received so far, while the origin still reads (no waiting).
    pub(crate) fn received_so_far(&self) -> Vec<u8> {
        self.so_far.lock().unwrap().clone()
    }

    /// The bytes the origin received before it answered (waiting for it to answer).
    pub(crate) fn received(&self) -> Vec<u8> {
        self.received.recv_timeout(READ_TIMEOUT * 2).expect("the raw origin was reached")
    }
}

/// The lines of a head (up to its empty line) whose field name is `name`.
pub(crate) fn field_lines<'a>(head: &'a str, name: &str) -> Vec<&'a str> {
    head.split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .split("\r\n")
        .filter(|l| l.split(':').next().is_some_and(|n| n.eq_ignore_ascii_case(name)))
        .collect()
}
