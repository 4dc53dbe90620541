//! The checks a configuration passes before it runs, the same for start-up, `rustle check`,
//! a reload and a takeover: a file declaring no listener refused everywhere, a listener
//! left less protected refused unless confirmed, `rustle check`'s own tests (addresses in
//! use, the access log's directory), and what a refused reload tells the operator
//! (`rustle reload`, the metrics, the service manager).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use rustle_bench::Origin;

use crate::util::*;

/// A loopback TCP port free right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn check(args: &[&str]) -> Output {
    Command::new(rustle_bin()).arg("check").args(args).output().expect("run rustle check")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The status of a GET of `url` through `addr` with `headers`, on a new connection.
fn status_with(addr: SocketAddr, url: &str, headers: &[&str]) -> u16 {
    let mut c = Conn::open(addr);
    c.send(&request("GET", url, headers, b""));
    c.read_response().status
}

/// A configuration with a control socket in `dir`, an authenticated HTTP listener on
/// `port` (auth on or off) and the user alice.
fn authed(dir: &TempDir, port: u16, auth: bool, extra: &str) -> String {
    format!(
        "workers = 1\n[log]\naccess = \"off\"\n[process]\ncontrol_socket = \"{}\"\n\
         [auth]\n[[auth.user]]\nname = \"alice\"\npassword = \"plain:secret\"\n\
         [[listener]]\nlisten = \"127.0.0.1:{port}\"\nauth = {auth}\n{extra}",
        dir.file("control.sock").display()
    )
}

/// Starts the binary with `text` as its file; waits until it serves and answers on its
/// control socket.
fn start(dir: &TempDir, text: &str) -> (RustleProcess, SocketAddr, std::path::PathBuf) {
    let file = dir.file("rustle.toml");
    std::fs::write(&file, text).unwrap();
    let mut bin = RustleProcess::spawn(&["--config", file.to_str().unwrap()]);
    let addr = bin.next_listener();
    assert!(bin.wait_for_stderr("control socket", Duration::from_secs(5)), "{}", bin.stderr());
    (bin, addr, file)
}

#[test]
fn check_refuses_an_empty_file_and_a_file_without_listener() {
    let dir = TempDir::new("check-empty");
    for (name, text, says) in [
        ("empty.toml", "", "is empty"),
        ("comments.toml", "# rustle\n\n", "is empty"),
        ("cut.toml", "workers = 1\n[timeouts]\nheader = \"5s\"\n", "declares no listener"),
    ] {
        let file = dir.file(name);
        std::fs::write(&file, text).unwrap();
        let out = check(&["--config", file.to_str().unwrap()]);
        assert!(!out.status.success(), "{name} passed: {out:?}");
        assert!(stderr(&out).contains(says), "{name}: {}", stderr(&out));
        // Start-up refuses it too, and serves nothing.
        let mut bin = RustleProcess::spawn(&["--config", file.to_str().unwrap()]);
        let status = bin.wait(Duration::from_secs(10)).expect("start-up exits");
        assert!(!status.success(), "{name} started");
        assert!(bin.stderr().contains(says), "{name}: {}", bin.stderr());
    }
}

#[test]
fn check_refuses_an_address_in_use_unless_told_not_to_bind() {
    let dir = TempDir::new("check-bind");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let file = dir.file("rustle.toml");
    let text = format!("[[listener]]\nlisten = \"{}\"\n", taken.local_addr().unwrap());
    std::fs::write(&file, text).unwrap();
    let path = file.to_str().unwrap();
    let out = check(&["--config", path]);
    assert!(!out.status.success(), "an address in use passed: {out:?}");
    let err = stderr(&out);
    assert!(err.contains("already in use") && err.contains("--no-bind"), "{err}");
    let out = check(&["--config", path, "--no-bind"]);
    assert_success("rustle check --no-bind", &out);
    drop(taken);
}

#[test]
fn check_refuses_an_access_log_in_a_missing_directory() {
    let dir = TempDir::new("check-log");
    let file = dir.file("rustle.toml");
    let log = dir.path().join("no-such-dir").join("access.log");
    let text =
        format!("[log]\naccess = \"{}\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n", log.display());
    std::fs::write(&file, text).unwrap();
    let out = check(&["--config", file.to_str().unwrap()]);
    assert!(!out.status.success(), "a missing log directory passed: {out:?}");
    let err = stderr(&out);
    assert!(err.contains("line 2: log.access") && err.contains("does not exist"), "{err}");
}

#[test]
fn check_reports_every_problem_of_a_rule_and_says_what_a_duration_is() {
    let dir = TempDir::new("check-rule");
    let file = dir.file("rustle.toml");
    std::fs::write(
        &file,
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n\
         [[rule]]\naction = \"permit\"\nclients = [\"10.0.0.0/33\"]\n\
         [timeouts]\nio = -5\n",
    )
    .unwrap();
    let out = check(&["--config", file.to_str().unwrap(), "--no-bind"]);
    assert!(!out.status.success(), "{out:?}");
    let err = stderr(&out);
    let has = |line: &str, what: &str| err.lines().any(|l| l.contains(line) && l.contains(what));
    assert!(has("line 3", "`action` must be \"allow\" or \"deny\", not \"permit\""), "{err}");
    assert!(has("line 3", "10.0.0.0/33"), "the bad CIDR is hidden:\n{err}");
    assert!(has("line 7", "expected a duration"), "{err}");
    assert!(!err.contains("untagged"), "{err}");
}

/// A truncated file (the control socket still named, the listeners gone) given to
/// `--takeover` is refused before the running process is asked for anything: it keeps
/// its socket and its authentication.
#[test]
fn a_takeover_with_a_truncated_file_is_refused_and_the_old_process_keeps_serving() {
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("takeover-cut");
    let port = free_port();
    let (mut old, addr, file) = start(&dir, &authed(&dir, port, true, ""));
    let url = origin.url("/bytes/1");
    let alice = proxy_auth("alice", "secret");
    assert_eq!(status_with(addr, &url, &[]), 407, "{}", old.stderr());
    let cut = format!(
        "workers = 1\n[process]\ncontrol_socket = \"{}\"\n",
        dir.file("control.sock").display()
    );
    std::fs::write(&file, cut).unwrap();
    let mut new = RustleProcess::spawn(&["--config", file.to_str().unwrap(), "--takeover"]);
    let status = new.wait(Duration::from_secs(10)).expect("the takeover exits");
    assert!(!status.success(), "{}", new.stderr());
    assert!(new.stderr().contains("declares no listener"), "{}", new.stderr());
    let asked = old.stderr().contains("asks for the listening sockets");
    assert!(!asked, "the old process was asked:\n{}", old.stderr());
    assert!(old.wait(Duration::from_millis(100)).is_none(), "the old process exited");
    assert_eq!(status_with(addr, &url, &[]), 407);
    assert_eq!(status_with(addr, &url, &[&alice]), 200);
    // Nothing listens on the built-in addresses on the new process's behalf.
    assert!(!new.stderr().contains("3128"), "{}", new.stderr());
}

/// A takeover whose configuration drops `auth` from a running listener is refused unless
/// the operator confirms it with --allow-less-protection.
#[test]
fn a_takeover_dropping_auth_needs_confirming() {
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("takeover-auth");
    let port = free_port();
    let (mut old, addr, file) = start(&dir, &authed(&dir, port, true, ""));
    let url = origin.url("/bytes/1");
    std::fs::write(&file, authed(&dir, port, false, "")).unwrap();
    let config = file.to_str().unwrap();
    let mut new = RustleProcess::spawn(&["--config", config, "--takeover"]);
    let status = new.wait(Duration::from_secs(10)).expect("the takeover exits");
    assert!(!status.success(), "{}", new.stderr());
    let err = new.stderr();
    assert!(err.contains("would no longer require authentication"), "{err}");
    assert!(err.contains("--allow-less-protection"), "{err}");
    assert!(old.wait(Duration::from_millis(100)).is_none(), "the old process exited");
    assert_eq!(status_with(addr, &url, &[]), 407);
    // Confirmed: taken over, and the listener serves without authentication.
    let mut new =
        RustleProcess::spawn(&["--config", config, "--takeover", "--allow-less-protection"]);
    assert_eq!(new.next_listener(), addr);
    let status = old.wait(Duration::from_secs(10)).expect("the old process drains and exits");
    assert!(status.success(), "{}", old.stderr());
    assert_eq!(status_with(addr, &url, &[]), 200, "{}", new.stderr());
}

/// `GET /metrics` on `admin`, as text.
fn metrics(admin: SocketAddr) -> String {
    let mut c = Conn::open(admin);
    c.send(b"GET /metrics HTTP/1.1\r\nHost: admin\r\n\r\n");
    c.read_response().text()
}

/// The value of the sample `name` (no labels) in `text`.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn rustle_reload(file: &Path, extra: &[&str]) -> Output {
    Command::new(rustle_bin())
        .args(["reload", "--config", file.to_str().unwrap()])
        .args(extra)
        .env("RUSTLE_CONFIG", "")
        .output()
        .expect("run rustle reload")
}

/// A SIGHUP (or `rustle reload`) dropping `auth = true` from a running listener is
/// refused, saying how to confirm it; the refusal is counted, shown by the gauge of the
/// last reload, and `rustle reload` prints it and fails. Confirmed (the flag, or
/// `allow_less_protection` on the listener), the reload goes through.
#[test]
fn a_reload_dropping_auth_is_refused_until_confirmed() {
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("reload-auth");
    let port = free_port();
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let admin_toml = format!("[admin]\nlisten = \"{admin}\"\n");
    let (bin, addr, file) = start(&dir, &authed(&dir, port, true, &admin_toml));
    let url = origin.url("/bytes/1");
    assert_eq!(status_with(addr, &url, &[]), 407, "{}", bin.stderr());
    assert_eq!(sample(&metrics(admin), "rustle_config_last_reload_successful"), Some(1.0));

    std::fs::write(&file, authed(&dir, port, false, &admin_toml)).unwrap();
    bin.signal("HUP");
    assert!(
        bin.wait_for_stderr("keeping the previous configuration", Duration::from_secs(5)),
        "{}",
        bin.stderr()
    );
    let err = bin.stderr();
    assert!(err.contains("would no longer require authentication"), "{err}");
    assert!(err.contains("allow_less_protection = true"), "{err}");
    assert_eq!(status_with(addr, &url, &[]), 407, "auth was dropped");

    let out = rustle_reload(&file, &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr(&out).contains("would no longer require authentication"), "{out:?}");
    let text = metrics(admin);
    assert_eq!(sample(&text, "rustle_config_reload_failures_total"), Some(2.0), "{text}");
    assert_eq!(sample(&text, "rustle_config_last_reload_successful"), Some(0.0), "{text}");
    assert_eq!(status_with(addr, &url, &[]), 407, "auth was dropped");

    let out = rustle_reload(&file, &["--allow-less-protection"]);
    assert_success("rustle reload --allow-less-protection", &out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("reloaded"), "{out:?}");
    assert_eq!(status_with(addr, &url, &[]), 200);
    let text = metrics(admin);
    assert_eq!(sample(&text, "rustle_config_last_reload_successful"), Some(1.0), "{text}");

    // Back to auth, then dropped again with the confirmation in the file: SIGHUP takes it.
    std::fs::write(&file, authed(&dir, port, true, &admin_toml)).unwrap();
    assert_success("rustle reload", &rustle_reload(&file, &[]));
    assert_eq!(status_with(addr, &url, &[]), 407);
    let confirmed = format!("allow_less_protection = true\n{admin_toml}");
    std::fs::write(&file, authed(&dir, port, false, &confirmed)).unwrap();
    bin.signal("HUP");
    assert!(
        bin.wait_for_stderr_n("SIGHUP: reloaded", 3, Duration::from_secs(5)),
        "{}",
        bin.stderr()
    );
    assert_eq!(status_with(addr, &url, &[]), 200);
}

/// A refused reload still ends the reload for systemd (`READY=1`), with the refusal in
/// `STATUS=`, so that `systemctl status` shows it.
#[test]
fn the_service_manager_hears_a_refused_reload() {
    use std::os::unix::net::UnixDatagram;
    let dir = TempDir::new("notify-refused");
    let socket_path = dir.file("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("bind the notify socket");
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let next = || {
        let mut buf = [0u8; 1024];
        let n = socket.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let file = dir.file("rustle.toml");
    std::fs::write(&file, "workers = 1\n[[listener]]\nlisten = \"127.0.0.1:0\"\n").unwrap();
    let env = [("NOTIFY_SOCKET", socket_path.as_os_str())];
    let mut bin = RustleProcess::spawn_env(&["--config", file.to_str().unwrap()], &env);
    let _ = bin.next_listener();
    assert!(next().starts_with("READY=1\nSTATUS=listening on"));
    std::fs::write(&file, "").unwrap();
    bin.signal("HUP");
    assert!(next().starts_with("RELOADING=1"));
    let status = next();
    assert!(status.starts_with("READY=1\nSTATUS=reload refused: "), "{status:?}");
    assert!(status.contains("is empty"), "{status:?}");
}

/// A control connection that sends nothing holds the main thread (and so signals) for at
/// most a second: a SIGHUP behind it is applied well within the 10 s a takeover's later
/// lines may take.
#[test]
fn a_silent_control_connection_does_not_hold_up_a_reload() {
    let dir = TempDir::new("control-silent");
    let (bin, _, _) = start(&dir, &authed(&dir, free_port(), true, ""));
    let silent = std::os::unix::net::UnixStream::connect(dir.file("control.sock")).unwrap();
    let begun = std::time::Instant::now();
    bin.signal("HUP");
    assert!(bin.wait_for_stderr("SIGHUP: reloaded", Duration::from_secs(5)), "{}", bin.stderr());
    let took = begun.elapsed();
    assert!(took < Duration::from_secs(3), "the reload waited {took:?}");
    drop(silent);
}
