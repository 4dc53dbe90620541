//! Helpers shared by the integration tests: an in-process proxy with its access log in a
//! temporary file, external clients that skip cleanly when missing, and a raw-socket
//! HTTP/1.1 client with a small response parser.
#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustle::config::{Config, Listener, ListenerKind, LogTarget};
use rustle::server::Running;
use sha2::{Digest, Sha256};

/// How long a raw client waits for bytes before giving up on a read.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A scratch directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rustle-it-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A proxy running in this process: one worker on 127.0.0.1:0, access log in a temp file.
pub struct Proxy {
    running: Option<Running>,
    addr: SocketAddr,
    log: PathBuf,
    _dir: TempDir,
}

impl Proxy {
    pub fn start() -> Proxy {
        Proxy::start_with(|_| {})
    }

    /// Starts with the test defaults, then whatever `tweak` changes.
    pub fn start_with(tweak: impl FnOnce(&mut Config)) -> Proxy {
        let dir = TempDir::new("proxy");
        let log = dir.file("access.log");
        let mut cfg = Config {
            workers: 1,
            listeners: vec![Listener::new(ListenerKind::Http, "127.0.0.1:0".parse().unwrap())],
            ..Config::default()
        };
        cfg.log.access = LogTarget::File(log.clone());
        cfg.timeouts.shutdown = Duration::from_millis(500);
        tweak(&mut cfg);
        let running = rustle::server::start(cfg).expect("proxy starts");
        let addr = running.addrs[0].1;
        Proxy { running: Some(running), addr, log, _dir: dir }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, for `curl -x` and friends.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The access-log lines written so far, waiting up to ~1 s for at least one (the log
    /// is flushed every 100 ms).
    pub fn log_lines(&self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_millis(1200);
        loop {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<String> = text.lines().map(str::to_string).collect();
            if !lines.is_empty() || Instant::now() > deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The first log line satisfying `pred`, waiting up to ~2 s for it; panics with every
    /// line seen when none matches.
    pub fn log_line(&self, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if let Some(l) = text.lines().find(|l| pred(l)) {
                return l.to_string();
            }
            if Instant::now() > deadline {
                panic!("no matching access-log line; the log has:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop();
        }
    }
}

/// Whether an external program can be run.
pub fn have(tool: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        eprintln!("SKIPPED: `{tool}` is not installed; this test needs it");
    }
    ok
}

/// A command with no proxy settings inherited from the environment (NO_PROXY would make
/// curl bypass `-x` for 127.0.0.1).
pub fn clean_command(program: &str) -> Command {
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
pub fn curl(args: &[&str]) -> Option<Output> {
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
pub fn assert_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed with {}: stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    rustle_bench::pattern::hex(&Sha256::digest(bytes))
}

/// Connects to `addr` with the raw-client read timeout.
pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Writes `bytes` to the proxy on a new connection and reads until the proxy closes it
/// (or a read times out).
pub fn raw(proxy: &Proxy, bytes: &[u8]) -> Vec<u8> {
    raw_to(proxy.addr(), bytes)
}

pub fn raw_to(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = connect(addr);
    s.write_all(bytes).expect("write request");
    read_until_close(&mut s).0
}

/// Reads until EOF, a connection reset, or the read timeout. Returns the bytes and whether
/// the connection was seen closed (EOF or reset) rather than timing out.
pub fn read_until_close(s: &mut TcpStream) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
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
pub fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 1024];
    let r = match s.read(&mut buf) {
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
pub struct Resp {
    pub status: u16,
    pub reason: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The raw head, CRLFCRLF included.
    pub head: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn has_header(&self, name: &str) -> bool {
        self.header(name).is_some()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The head as text, for assertion messages.
    pub fn head_text(&self) -> String {
        String::from_utf8_lossy(&self.head).into_owned()
    }
}

/// Parses a head (without body) from its bytes.
pub fn parse_head(head: &[u8]) -> Resp {
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
pub struct Conn {
    pub s: TcpStream,
    pub buf: Vec<u8>,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        Conn { s: connect(addr), buf: Vec::new() }
    }

    pub fn to_proxy(proxy: &Proxy) -> Conn {
        Conn::open(proxy.addr())
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).expect("write to proxy");
    }

    /// Reads more bytes; 0 on EOF.
    fn more(&mut self) -> usize {
        let mut tmp = vec![0u8; 64 * 1024];
        match self.s.read(&mut tmp) {
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                n
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => 0,
            Err(e) => panic!("read failed after {} buffered bytes: {e}", self.buf.len()),
        }
    }

    pub fn take(&mut self, n: usize) -> Vec<u8> {
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
    pub fn read_head(&mut self) -> Resp {
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
    pub fn read_response(&mut self) -> Resp {
        self.read_response_to(false)
    }

    /// Reads one whole response; `head_request` says the request was HEAD (no body).
    pub fn read_response_to(&mut self, head_request: bool) -> Resp {
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
    pub fn assert_closed(&mut self) {
        let (rest, closed) = read_until_close(&mut self.s);
        self.buf.extend_from_slice(&rest);
        assert!(
            self.buf.is_empty(),
            "unexpected bytes after the response: {:?}",
            String::from_utf8_lossy(&self.buf)
        );
        assert!(closed, "the proxy did not close the connection within {READ_TIMEOUT:?}");
    }

    pub fn shutdown_write(&self) {
        self.s.shutdown(Shutdown::Write).expect("shutdown write");
    }
}

/// Parses a complete byte string holding one response (as read until close).
pub fn parse_response(bytes: &[u8]) -> Resp {
    let i = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head in {:?}", String::from_utf8_lossy(bytes)));
    let mut r = parse_head(&bytes[..i + 4]);
    r.body = bytes[i + 4..].to_vec();
    r
}

/// A GET request in absolute form for `url` (`http://host:port/path`).
pub fn get(url: &str) -> Vec<u8> {
    request("GET", url, &[], b"")
}

/// A request in absolute form with a Host header, extra header lines, and a body (a
/// Content-Length is added when the body is not empty).
pub fn request(method: &str, url: &str, headers: &[&str], body: &[u8]) -> Vec<u8> {
    let authority =
        url.strip_prefix("http://").and_then(|r| r.split('/').next()).expect("an http:// URL");
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
pub fn rustle_bin() -> &'static str {
    env!("CARGO_BIN_EXE_rustle")
}

/// An address nothing listens on (bound, then released).
pub fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}
