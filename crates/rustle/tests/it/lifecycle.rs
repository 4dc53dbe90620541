//! Timeouts, connection limits, the access log, graceful shutdown of the real binary,
//! what a SIGHUP reload refuses, SIGUSR1 reopening the access log, and `rustle check`.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustle::config::LogFormat;
use rustle_bench::pattern::pattern;
use rustle_bench::Origin;

use crate::util::*;

#[test]
fn slow_header_client_gets_408() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start_with(|c| c.timeouts.header = Duration::from_millis(500));
    let mut s = connect(proxy.addr());
    let mut w = s.try_clone().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop_w = stop.clone();
    let head = get(&origin.url("/bytes/1"));
    let start = Instant::now();
    let writer = std::thread::spawn(move || {
        for b in head {
            if stop_w.load(Ordering::Relaxed) || w.write_all(&[b]).is_err() {
                return;
            }
            // The scenario: a client that drips its head, a byte every 100 ms.
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let (got, closed) = read_until_close(&mut s);
    let took = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert!(closed, "connection still open after {took:?}");
    let r = parse_response(&got);
    assert_eq!(r.status, 408, "{}", String::from_utf8_lossy(&got));
    assert!(r.text().contains("timed out"), "{}", r.text());
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_millis(1500),
        "closed after {took:?}, expected about 500 ms"
    );
    assert_eq!(origin.connections(), 0);
}

#[test]
fn idle_keepalive_connection_is_closed() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start_with(|c| c.timeouts.keepalive = Duration::from_millis(300));
    let mut c = Conn::to_proxy(&proxy);
    c.send(&get(&origin.url("/bytes/10")));
    assert_eq!(c.read_response().body, pattern(10));
    let start = Instant::now();
    assert!(closed_within(&mut c.s, Duration::from_secs(3)), "idle connection not closed");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(1500),
        "closed after {took:?}, expected about 300 ms"
    );
}

#[test]
fn connection_limit_answers_503() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start_with(|c| c.limits.max_connections = 2);
    let mut held: Vec<Conn> = (0..2).map(|_| Conn::to_proxy(&proxy)).collect();
    for c in &mut held {
        c.send(&get(&origin.url("/bytes/1")));
        assert_eq!(c.read_response().status, 200);
    }
    let mut third = Conn::to_proxy(&proxy);
    let r = third.read_response();
    assert_eq!(r.status, 503, "{}", r.head_text());
    assert!(r.text().contains("too many connections"), "{}", r.text());
    third.assert_closed();
    // The held connections still work, and a freed slot is usable again.
    held[0].send(&get(&origin.url("/bytes/2")));
    assert_eq!(held[0].read_response().body, pattern(2));
    drop(held.pop());
    // The slot is freed once the proxy has seen the close: new connections are tried
    // until one is served (the refused ones hold nothing).
    let body = wait_for(Duration::from_secs(5), "a connection served after one closed", || {
        let mut fourth = Conn::to_proxy(&proxy);
        fourth.send(&get(&origin.url("/bytes/3")));
        let r = fourth.read_response();
        (r.status == 200).then_some(r.body)
    });
    assert_eq!(body, pattern(3));
}

#[test]
fn access_log_plain_line() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let mut c = Conn::to_proxy(&proxy);
    let client = c.s.local_addr().unwrap();
    let url = origin.url("/bytes/1234");
    c.send(&request("POST", &url, &[], b"12345"));
    assert_eq!(c.read_response().status, 200);
    let line = proxy.log_line(|l| l.contains("/bytes/1234"));
    let f: Vec<&str> = line.split(' ').collect();
    assert_eq!(f.len(), 9, "unexpected plain line: {line}");
    assert!(f[0].ends_with('Z') && f[0].contains('T'), "time: {line}");
    assert_eq!(f[1], client.to_string(), "client address: {line}");
    assert_eq!(f[2], "POST");
    assert_eq!(f[3], url);
    assert_eq!(f[4], "200");
    assert_eq!(f[5], "5", "bytes up: {line}");
    assert_eq!(f[6], "1234", "bytes down: {line}");
    let ms = f[7].strip_suffix("ms").unwrap_or_else(|| panic!("duration: {line}"));
    assert!(ms.parse::<f64>().is_ok_and(|v| (0.0..5000.0).contains(&v)), "duration: {line}");
    assert_eq!(f[8], origin.addr().to_string(), "upstream: {line}");
}

#[test]
fn access_log_json_lines() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start_with(|c| c.log.format = LogFormat::Json);
    let mut c = Conn::to_proxy(&proxy);
    let client = c.s.local_addr().unwrap();
    let url = origin.url("/bytes/777");
    c.send(&get(&url));
    assert_eq!(c.read_response().body, pattern(777));
    let line = proxy.log_line(|l| l.contains("/bytes/777"));
    let v: serde_json::Value = serde_json::from_str(&line).expect("log line is JSON");
    assert_eq!(v["client"], client.to_string());
    assert_eq!(v["method"], "GET");
    assert_eq!(v["target"], url);
    assert_eq!(v["status"], 200);
    assert_eq!(v["bytes_up"], 0);
    assert_eq!(v["bytes_down"], 777);
    assert!(v["ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{line}");
    assert_eq!(v["upstream"], origin.addr().to_string());
    assert!(v["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{line}");
    assert!(v.get("error").is_none(), "{line}");

    // An error exchange: the cause is in the line.
    let dead = format!("http://{}/x", closed_port());
    let r = parse_response(&raw(&proxy, &get(&dead)));
    assert_eq!(r.status, 502);
    let line = proxy.log_line(|l| l.contains(&dead));
    let v: serde_json::Value = serde_json::from_str(&line).expect("error line is JSON");
    assert_eq!(v["status"], 502);
    assert!(v["error"].as_str().is_some_and(|e| e.contains("refused")), "{line}");
}

#[test]
fn access_log_names_the_cause_of_an_error() {
    let proxy = Proxy::start();
    let r = parse_response(&raw(&proxy, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"));
    assert_eq!(r.status, 400);
    let line = proxy.log_line(|l| l.contains(" 400 "));
    assert!(line.contains("absolute URI"), "{line}");
    assert!(line.ends_with('"'), "cause should be the quoted last field: {line}");
}

/// The real binary, started on an ephemeral port; killed on drop if still running.
pub(crate) struct Binary {
    child: Child,
    pub(crate) addr: SocketAddr,
    stderr: Arc<Mutex<String>>,
}

impl Binary {
    fn start() -> Binary {
        Binary::start_with(&["--http", "127.0.0.1:0", "--workers", "1"], "http")
    }

    /// Starts with `args`; `kind` is the listener kind whose address to wait for.
    pub(crate) fn start_with(args: &[&str], kind: &str) -> Binary {
        let marker = format!(" ({kind})");
        let mut child = Command::new(rustle_bin())
            .args(args)
            .env("RUSTLE_CONFIG", "")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rustle");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let mut lines = BufReader::new(child.stderr.take().unwrap());
        let seen = stderr.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            while lines.read_line(&mut line).is_ok_and(|n| n > 0) {
                if let Some(rest) = line.split("listening on ").nth(1) {
                    if let Some(addr) = rest.split(marker.as_str()).next() {
                        let _ = tx.send(addr.trim().to_string());
                    }
                }
                seen.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("rustle did not say where it listens: {}", stderr.lock().unwrap())
        });
        let addr = addr.parse().expect("listening address");
        Binary { child, addr, stderr }
    }

    fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }

    /// Waits up to `limit` for the process to exit.
    fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        let mut status = None;
        wait_until(limit, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        status
    }

    /// Kills the process with SIGKILL (no shutdown path runs) and reaps it.
    pub(crate) fn kill_9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub(crate) fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn sigterm_lets_the_request_in_flight_finish() {
    let origin = Origin::start().unwrap();
    let mut bin = Binary::start();
    let addr = bin.addr;
    let url = origin.url("/delay/1000");
    let in_flight = std::thread::spawn(move || {
        let mut c = Conn::open(addr);
        c.send(&get(&url));
        let r = c.read_response();
        let (rest, closed) = read_until_close(&mut c.s);
        (r, rest, closed)
    });
    // Let the request reach the origin, then signal.
    wait_until(Duration::from_secs(5), || origin.requests() > 0);
    assert_eq!(origin.requests(), 1, "the request did not reach the origin");
    bin.sigterm();
    // The listener closes as the drain begins: new connections are refused from then on.
    let refused = || matches!(TcpStream::connect(addr), Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused);
    assert!(wait_until(Duration::from_secs(5), refused), "new connections still accepted");
    let (r, rest, closed) = in_flight.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.head_text());
    assert_eq!(r.body, b"ok");
    assert!(rest.is_empty() && closed, "connection not closed cleanly after the last response");
    let status = bin.wait(Duration::from_secs(5)).expect("rustle did not exit after SIGTERM");
    assert!(status.success(), "exit status {status}; stderr:\n{}", bin.stderr());
}

#[test]
fn sigterm_with_an_idle_keepalive_client_exits_promptly() {
    let origin = Origin::start().unwrap();
    let mut bin = Binary::start();
    let mut c = Conn::open(bin.addr);
    c.send(&get(&origin.url("/bytes/10")));
    assert_eq!(c.read_response().body, pattern(10));
    let start = Instant::now();
    bin.sigterm();
    let status = bin.wait(Duration::from_secs(5)).expect("rustle did not exit after SIGTERM");
    let took = start.elapsed();
    assert!(status.success(), "exit status {status}; stderr:\n{}", bin.stderr());
    assert!(took < Duration::from_millis(1000), "exit took {took:?} with an idle client");
    assert!(closed_within(&mut c.s, Duration::from_secs(1)), "idle client not closed");
}

/// `rustle check --no-bind`: the file alone (its fixed ports may be in use on this machine).
fn check(file: &std::path::Path) -> std::process::Output {
    Command::new(rustle_bin())
        .args(["check", "--no-bind", "--config", file.to_str().unwrap()])
        .output()
        .expect("run rustle check")
}

#[test]
fn check_accepts_a_valid_file() {
    let dir = TempDir::new("check");
    let file = dir.file("ok.toml");
    std::fs::write(
        &file,
        "workers = 1\n[[listener]]\nlisten = \"127.0.0.1:3129\"\n[timeouts]\nheader = \"500ms\"\n",
    )
    .unwrap();
    let out = check(&file);
    assert_success("rustle check", &out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"), "{out:?}");
}

#[test]
fn check_reports_every_problem_with_its_line() {
    let dir = TempDir::new("check");
    let file = dir.file("bad.toml");
    std::fs::write(
        &file,
        "workers = 1\n\
         [log]\n\
         format = \"plain\"\n\
         colour = true\n\
         [timeouts]\n\
         header = \"ten seconds\"\n",
    )
    .unwrap();
    let out = check(&file);
    assert!(!out.status.success(), "a bad file passed: {out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let has = |line: &str, what: &str| err.lines().any(|l| l.contains(line) && l.contains(what));
    assert!(has("line 4", "unknown key `log.colour`"), "{err}");
    assert!(has("line 6", "invalid duration"), "{err}");
}

#[test]
fn check_names_the_key_of_every_type_error() {
    let dir = TempDir::new("check");
    let file = dir.file("typed.toml");
    std::fs::write(
        &file,
        "workers = \"two\"\n\
         [[listener]]\n\
         listen = \"127.0.0.1:3129\"\n\
         h2c = \"yes\"\n\
         [limits]\n\
         max_headers = -5\n",
    )
    .unwrap();
    let out = check(&file);
    assert!(!out.status.success(), "a bad file passed: {out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let has = |want: &str| err.lines().any(|l| l.ends_with(want));
    assert!(has("line 1: workers: expected a number, found \"two\""), "{err}");
    assert!(has("line 4: listener.0.h2c: expected true or false, found \"yes\""), "{err}");
    assert!(has("line 6: limits.max_headers: expected a number, 0 or more, found -5"), "{err}");
}

#[test]
fn check_names_the_line_of_a_users_bad_hash_and_of_a_bad_rule() {
    let dir = TempDir::new("check");
    let file = dir.file("users.toml");
    std::fs::write(
        &file,
        "[[listener]]\n\
         listen = \"127.0.0.1:3129\"\n\
         [[rule]]\n\
         action = \"maybe\"\n\
         [[auth.user]]\n\
         name = \"alice\"\n\
         password = \"$2y$not-a-bcrypt-hash\"\n",
    )
    .unwrap();
    let out = check(&file);
    assert!(!out.status.success(), "a bad file passed: {out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let line = |n: usize, what: &str| err.lines().any(|l| l.contains(&format!("line {n}: {what}")));
    assert!(line(3, "rule 1: `action`"), "{err}");
    assert!(line(6, "auth.user `alice`"), "{err}");
    assert_eq!(err.matches("auth.user `alice`").count(), 1, "said once: {err}");
}

#[test]
fn check_accepts_the_example_file() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../rustle.example.toml");
    let out = check(&file);
    assert_success("rustle check rustle.example.toml", &out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"), "{out:?}");
}

/// The status of a GET of `url` through `addr`, on a new connection.
fn get_status(addr: SocketAddr, url: &str) -> u16 {
    let mut c = Conn::open(addr);
    c.send(&get(url));
    c.read_response().status
}

/// A configuration file in `dir` (written again by each call) and the real binary started
/// with it; the access log is off.
fn start_with_file(dir: &TempDir, text: &str) -> (RustleProcess, SocketAddr, std::path::PathBuf) {
    let file = dir.file("rustle.toml");
    std::fs::write(&file, text).unwrap();
    let (bin, addr) = RustleProcess::start(&["--config", file.to_str().unwrap()]);
    (bin, addr, file)
}

/// Rewrites `file` with `text`, sends SIGHUP and waits for the `n`th reload refusal.
#[track_caller]
fn reload_refused(bin: &RustleProcess, file: &std::path::Path, text: &str, n: usize) {
    std::fs::write(file, text).unwrap();
    bin.signal("HUP");
    assert!(
        bin.wait_for_stderr_n("keeping the previous configuration", n, Duration::from_secs(5)),
        "reload {n} of {text:?} was not refused:\n{}",
        bin.stderr()
    );
}

const GUARDED: &str = "workers = 1\ndeny_private_destinations = true\n[log]\naccess = \"off\"\n\
                       [[listener]]\nlisten = \"127.0.0.1:0\"\n\
                       [[rule]]\nname = \"no-blocked\"\naction = \"deny\"\n\
                       hosts = [\"blocked.test\"]\n";

#[test]
fn an_empty_or_truncated_file_is_not_reloaded() {
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("reload-empty");
    let (bin, addr, file) = start_with_file(&dir, GUARDED);
    let status = || get_status(addr, &origin.url("/bytes/1"));
    assert_eq!(status(), 403, "loopback not denied at start:\n{}", bin.stderr());
    // Emptied (as a tool that truncates before writing leaves it), comments only, cut
    // short before its listener: each refused, and loopback destinations stay denied.
    let texts = ["", "# rustle\n\n   \n", "workers = 1\n"];
    for (i, text) in texts.into_iter().enumerate() {
        reload_refused(&bin, &file, text, i + 1);
        assert_eq!(status(), 403, "loopback reachable after reloading {text:?}");
    }
    let err = bin.stderr();
    assert!(err.contains("is empty"), "the refusal does not say why:\n{err}");
    assert!(err.contains("declares no listener"), "the refusal does not say why:\n{err}");
    assert_eq!(origin.connections(), 0);
}

#[test]
fn a_reload_dropping_protections_is_warned_about() {
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("reload-warn");
    let (bin, addr, file) = start_with_file(&dir, GUARDED);
    std::fs::write(
        &file,
        "workers = 1\n[log]\naccess = \"off\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    bin.signal("HUP");
    assert!(
        bin.wait_for_stderr("SIGHUP: reloaded", Duration::from_secs(5)),
        "a valid file was not reloaded:\n{}",
        bin.stderr()
    );
    let err = bin.stderr();
    let warned = |what: &str| err.lines().any(|l| l.contains("WARN") && l.contains(what));
    assert!(warned("deny_private_destinations"), "no warning about it:\n{err}");
    assert!(warned("1 access rule"), "no warning about the dropped rule:\n{err}");
    // The reload is in force: loopback destinations are reachable, as the file says.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut status = 0;
    while status != 200 && Instant::now() < deadline {
        status = get_status(addr, &origin.url("/bytes/1"));
    }
    assert_eq!(status, 200);
}

/// A reload keeping a public listener must not turn it into an open proxy, and a reload
/// adding one must protect it as start-up does: either is refused, and the rules in force
/// stay.
#[test]
fn a_reload_that_would_open_a_public_listener_is_refused() {
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("reload-open");
    let (bin, addr, file) = start_with_file(
        &dir,
        "workers = 1\ndefault_action = \"deny\"\n[log]\naccess = \"off\"\n\
         [[listener]]\nlisten = \"0.0.0.0:0\"\n\
         [[rule]]\nname = \"local\"\naction = \"allow\"\nclients = [\"127.0.0.1/32\"]\n",
    );
    let url = origin.url("/bytes/1");
    let status_from = |from: &str| {
        let mut c = Conn::open_from(from, addr);
        c.send(&get(&url));
        c.read_response().status
    };
    assert_eq!(status_from("127.0.0.1"), 200, "{}", bin.stderr());
    assert_eq!(status_from("127.0.0.2"), 403);
    // The running 0.0.0.0 listener kept, the rules restricting its clients gone.
    reload_refused(
        &bin,
        &file,
        "workers = 1\n[log]\naccess = \"off\"\n[[listener]]\nlisten = \"0.0.0.0:0\"\n",
        1,
    );
    // A loopback listener kept, a public one added without protection.
    reload_refused(
        &bin,
        &file,
        "workers = 1\n[log]\naccess = \"off\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\
         [[listener]]\nlisten = \"0.0.0.0:0\"\n",
        2,
    );
    let err = bin.stderr();
    assert!(err.matches("open proxy").count() >= 2, "the refusals do not say why:\n{err}");
    assert_eq!(status_from("127.0.0.2"), 403, "the running listener became an open proxy");
    assert_eq!(status_from("127.0.0.1"), 200);
}

/// Waits until the file at `path` holds `n` lines containing `what`.
fn wait_for_lines(path: &std::path::Path, what: &str, n: usize) -> String {
    let text = || std::fs::read_to_string(path).unwrap_or_default();
    wait_until(Duration::from_secs(5), || text().lines().filter(|l| l.contains(what)).count() >= n);
    text()
}

#[test]
fn sigusr1_reopens_the_access_log_after_it_was_renamed() {
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("usr1");
    let log = dir.file("access.log");
    let rotated = dir.file("access.log.1");
    let args = ["--http", "127.0.0.1:0", "--workers", "2", "--access-log", log.to_str().unwrap()];
    let (mut bin, addr) = RustleProcess::start(&args);
    let fetch = |path: &str| {
        // New connections, so that both workers serve some.
        for _ in 0..8 {
            assert_eq!(get_status(addr, &origin.url(path)), 200);
        }
    };
    fetch("/bytes/1");
    let before = wait_for_lines(&log, "/bytes/1", 8);
    assert_eq!(before.lines().count(), 8, "{before}");
    std::fs::rename(&log, &rotated).unwrap();
    bin.signal("USR1");
    assert!(
        bin.wait_for_stderr("SIGUSR1: reopened", Duration::from_secs(5)),
        "no reopen message:\n{}",
        bin.stderr()
    );
    assert!(bin.child.try_wait().unwrap().is_none(), "SIGUSR1 ended the process");
    fetch("/bytes/2");
    let after = wait_for_lines(&log, "/bytes/2", 8);
    assert_eq!(after.lines().filter(|l| l.contains("/bytes/2")).count(), 8, "{after}");
    assert!(!after.contains("/bytes/1"), "{after}");
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert!(!old.contains("/bytes/2"), "a line went to the renamed file:\n{old}");
    assert!(bin.child.try_wait().unwrap().is_none(), "rustle exited:\n{}", bin.stderr());
}

#[test]
fn sigusr1_with_the_access_log_on_stdout_changes_nothing() {
    let origin = Origin::start().unwrap();
    let (bin, addr) = RustleProcess::start(&["--http", "127.0.0.1:0", "--workers", "1"]);
    bin.signal("USR1");
    assert!(
        bin.wait_for_stderr("SIGUSR1: the access log goes to stdout", Duration::from_secs(5)),
        "no message:\n{}",
        bin.stderr()
    );
    assert_eq!(get_status(addr, &origin.url("/bytes/3")), 200, "{}", bin.stderr());
}

/// Under systemd (`Type=notify`), rustle says on `$NOTIFY_SOCKET` when it is ready (with
/// where it listens), when a SIGHUP reload begins (with the monotonic time systemd asks
/// for) and ends, and when it stops.
#[test]
fn the_service_manager_hears_ready_reloading_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let dir = TempDir::new("notify");
    let socket_path = dir.file("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("bind the notify socket");
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let next = || {
        let mut buf = [0u8; 512];
        let n = socket.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let config = dir.file("rustle.toml");
    std::fs::write(&config, "[[listener]]\nlisten = \"127.0.0.1:0\"\n").unwrap();
    let env = [("NOTIFY_SOCKET", socket_path.as_os_str())];
    let mut bin =
        RustleProcess::spawn_env(&["--config", config.to_str().unwrap(), "--workers", "1"], &env);
    let addr = bin.next_listener();
    let ready = next();
    assert!(ready.starts_with("READY=1\nSTATUS=listening on 127.0.0.1:"), "{ready:?}");
    assert!(ready.contains(&format!("{} (http)", addr)), "{ready:?}");
    bin.signal("HUP");
    let reloading = next();
    let usec = reloading.strip_prefix("RELOADING=1\nMONOTONIC_USEC=").expect(&reloading);
    assert!(usec.parse::<u64>().is_ok_and(|n| n > 0), "{reloading:?}");
    assert_eq!(next(), "READY=1\nSTATUS=serving");
    assert!(bin.wait_for_stderr("SIGHUP: reloaded", Duration::from_secs(5)), "{}", bin.stderr());
    bin.signal("TERM");
    assert_eq!(next(), "STOPPING=1");
    assert!(bin.wait(Duration::from_secs(10)).is_some_and(|s| s.success()), "{}", bin.stderr());
}

/// Started as root with `[process] user`, rustle binds its listeners, then runs as that
/// user and its group (every thread: the workers serve as that user); an unknown user is
/// refused at start, naming it.
#[test]
fn root_drops_to_the_configured_user_after_binding() {
    if !crate::util::peers::is_root() {
        rustle_bench::tools::skip_host("dropping to another user needs root");
        return;
    }
    let Ok(nobody) = Command::new("id").args(["-u", "nobody"]).output() else { return };
    let uid = String::from_utf8_lossy(&nobody.stdout).trim().to_string();
    let dir = TempDir::new("process-user");
    let config = dir.file("rustle.toml");
    std::fs::write(
        &config,
        "[process]\nuser = \"nobody\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let (mut bin, addr) =
        RustleProcess::start(&["--config", config.to_str().unwrap(), "--workers", "2"]);
    let origin = Origin::start().unwrap();
    let mut c = Conn::open(addr);
    c.send(&request("GET", &origin.url("/bytes/3"), &[], b""));
    assert_eq!(c.read_response().status, 200, "{}", bin.stderr());
    let pid = bin.child.id();
    // Every thread, not only the main one, and already when the first answer came: the
    // workers accept nothing before root is given up.
    let threads = || -> Vec<(String, String)> {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        tasks
            .map(|task| {
                let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
                let line =
                    |key: &str| status.lines().find(|l| l.starts_with(key)).unwrap().to_string();
                (line("Uid:"), line("Groups:"))
            })
            .collect()
    };
    let dropped = |(ids, groups): &(String, String)| {
        ids.split_whitespace().skip(1).all(|id| id == uid)
            && !groups.split_whitespace().skip(1).any(|g| g == "0")
    };
    for t in threads() {
        assert!(dropped(&t), "{} {} (nobody is {uid})", t.0, t.1);
    }
    bin.signal("TERM");
    assert!(bin.wait(Duration::from_secs(10)).is_some());

    std::fs::write(
        &config,
        "[process]\nuser = \"no-such-user-here\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let mut bad = RustleProcess::spawn(&["--config", config.to_str().unwrap()]);
    let status = bad.wait(Duration::from_secs(10)).expect("exits");
    assert!(!status.success());
    assert!(bad.stderr().contains("user `no-such-user-here` does not exist"), "{}", bad.stderr());
}
