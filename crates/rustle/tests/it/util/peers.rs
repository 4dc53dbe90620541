//! Real parent proxies for the tests, started and stopped by them on loopback: squid (an
//! HTTP parent) and dante (a SOCKS5 parent), both from Debian (`.ci/run` installs them); and
//! haproxy, a load balancer sending the PROXY protocol.
//!
//! Each runs as a child process in its own process group, with its configuration, logs and
//! pid file in a temporary directory, on a free 127.0.0.1 port. `start` returns `None`,
//! after saying why, when the program is missing (or, for what needs it, when the tests do
//! not run as root). Dropping a fixture stops it (SIGTERM, then SIGKILL to its whole group
//! after a second) and asserts that no process of its group, nor any naming its directory,
//! is left; `kill` stops it at once, as a parent that dies.
//!
//! Both fixtures only connect out on IPv4 loopback: targets are IP literals or names that
//! `/etc/hosts` maps to 127.0.0.1.

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::{have, wait_until, TempDir};

/// How long a daemon may take to listen before `start` gives up (squid needs ~0.1-1 s).
const START_DEADLINE: Duration = Duration::from_secs(20);

/// How long a daemon has to exit on SIGTERM before its group gets SIGKILL. dante exits in
/// milliseconds; squid takes ~1.7 s even with `shutdown_lifetime 0` (it stops its event
/// loop a second after the signal), so it gets SIGKILL, which loses nothing: its access
/// log is unbuffered and its directory is removed anyway.
const TERM_GRACE: Duration = Duration::from_secs(1);

/// Attempts with a fresh port when the picked one was taken before the daemon bound it.
const PORT_ATTEMPTS: usize = 5;

/// Options of the squid fixture.
#[derive(Debug, Clone, Default)]
pub(crate) struct SquidOptions {
    /// Require these Basic credentials (user, password), checked by `basic_ncsa_auth`
    /// against an htpasswd file the fixture writes; `None`: every local client is served.
    pub basic_auth: Option<(String, String)>,
}

/// squid as an HTTP parent on 127.0.0.1: forwards absolute-form requests, tunnels CONNECT
/// to any port, caches nothing, logs each transaction to `access_log()`.
pub(crate) struct Squid {
    daemon: Daemon,
    addr: SocketAddr,
    service: String,
    // Last: removed after the daemon has stopped.
    dir: TempDir,
}

impl Squid {
    /// Starts squid (`squid -N -n NAME -f squid.conf`) and waits until it listens; `None` when
    /// squid (or, with `basic_auth`, openssl or the helper) is not installed.
    pub(crate) fn start(opts: SquidOptions) -> Option<Squid> {
        let program = find_program("squid", "/usr/sbin/squid")?;
        let dir = TempDir::new("squid");
        // squid drops to `cache_effective_user` (proxy) before it opens its logs.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("open the squid dir to its user");
        let auth = match &opts.basic_auth {
            None => None,
            Some((user, password)) => Some(write_htpasswd(&dir, user, password)?),
        };
        // A service name of its own: squid names its shared memory segments after it
        // (/dev/shm/NAME-cf__*.shm), and squids sharing one would share the segments.
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let service =
            format!("rustle{}x{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        let mut last_failure = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port();
            let conf = dir.file("squid.conf");
            std::fs::write(&conf, squid_conf(dir.path(), port, auth.as_deref()))
                .expect("write squid.conf");
            let mut cmd = Command::new(&program);
            cmd.args(["-N", "-n", &service, "-f"]).arg(&conf);
            // A failed attempt's log would be read as this one's.
            let _ = std::fs::remove_file(dir.file("cache.log"));
            let mut daemon = Daemon::spawn("squid", cmd, dir.path());
            // squid killed (as it is on stop, see TERM_GRACE) leaves its segments.
            daemon.shm_prefix = Some(format!("{service}-"));
            match daemon.wait_listening(port, &["cache.log"]) {
                Ok(()) => {
                    let addr = SocketAddr::from(([127, 0, 0, 1], port));
                    return Some(Squid { daemon, addr, service, dir });
                }
                Err(Failure::Exited(report)) if report.contains("Address already in use") => {
                    last_failure = report;
                }
                Err(Failure::Exited(report) | Failure::Timeout(report)) => {
                    panic!("squid did not start:\n{report}")
                }
            }
        }
        panic!("squid found no free port in {PORT_ATTEMPTS} attempts:\n{last_failure}")
    }

    /// Where it listens (127.0.0.1).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, for `curl -x`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The main squid process.
    pub(crate) fn pid(&self) -> u32 {
        self.daemon.pid
    }

    /// Its temporary directory (configuration, logs, pid file).
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its service name (`squid -n`), which prefixes its shared memory segments in
    /// /dev/shm (removed when it stops).
    pub(crate) fn service_name(&self) -> &str {
        &self.service
    }

    /// The access log so far (squid's native format, one line per transaction, written
    /// when it ends: a CONNECT's when the tunnel closes), waiting up to ~1 s for a first
    /// line.
    pub(crate) fn access_log(&self) -> String {
        wait_for_text(&self.dir.file("access.log"), Duration::from_secs(1), |t| !t.is_empty())
    }

    /// The first access-log line satisfying `pred`, waiting up to ~3 s for it; panics with
    /// the whole log when none comes.
    pub(crate) fn access_line(&self, pred: impl Fn(&str) -> bool) -> String {
        wait_for_line(&self.dir.file("access.log"), "squid access log", pred)
    }

    /// squid's own diagnostics (`cache.log`).
    pub(crate) fn cache_log(&self) -> String {
        std::fs::read_to_string(self.dir.file("cache.log")).unwrap_or_default()
    }

    /// SIGKILL to squid and its helpers now, as a parent that dies; returns once they
    /// are gone.
    pub(crate) fn kill(&mut self) {
        let left = self.daemon.kill();
        assert!(left.is_empty(), "squid left processes behind: {left:?}");
    }
}

impl Drop for Squid {
    fn drop(&mut self) {
        self.daemon.stop();
    }
}

/// Writes `htpasswd` with an APR1 hash of `password` (openssl), and returns the line for
/// squid.conf's `auth_param basic program`; `None` when a tool is missing.
fn write_htpasswd(dir: &TempDir, user: &str, password: &str) -> Option<String> {
    const HELPER: &str = "/usr/lib/squid/basic_ncsa_auth";
    if !Path::new(HELPER).exists() {
        rustle_bench::tools::missing(HELPER);
        return None;
    }
    if !have("openssl") {
        return None;
    }
    let out = Command::new("openssl")
        .args(["passwd", "-apr1", password])
        .stdin(Stdio::null())
        .output()
        .expect("run openssl passwd");
    assert!(out.status.success(), "openssl passwd: {}", String::from_utf8_lossy(&out.stderr));
    let hash = String::from_utf8(out.stdout).expect("openssl prints ASCII");
    let file = dir.file("htpasswd");
    std::fs::write(&file, format!("{user}:{}\n", hash.trim())).expect("write htpasswd");
    Some(format!("{HELPER} {}", file.display()))
}

fn squid_conf(dir: &Path, port: u16, auth_program: Option<&str>) -> String {
    let d = dir.display();
    let mut conf = format!(
        "http_port 127.0.0.1:{port}
visible_hostname rustle-test-squid
# No cache at all: every request goes to the origin.
cache deny all
cache_mem 1 MB
cache_store_log none
netdb_filename none
access_log stdio:{d}/access.log
buffered_logs off
strip_query_terms off
cache_log {d}/cache.log
pid_filename {d}/squid.pid
coredump_dir {d}
icp_port 0
htcp_port 0
pinger_enable off
shutdown_lifetime 0 seconds
# Targets are IP literals or names in /etc/hosts; any other name fails here at once
# instead of leaving the host.
dns_nameservers 127.0.0.1
"
    );
    if is_root() {
        conf.push_str("cache_effective_user proxy\n");
    }
    if let Some(program) = auth_program {
        conf.push_str(&format!(
            "auth_param basic program {program}
auth_param basic children 2 startup=1 idle=1
auth_param basic realm rustle-test
acl authenticated proxy_auth REQUIRED
http_access deny !authenticated
"
        ));
    }
    // No SSL_ports/Safe_ports lists: CONNECT goes to any port.
    conf.push_str("http_access allow localhost\nhttp_access deny all\n");
    conf
}

/// Options of the dante fixture.
#[derive(Debug, Clone, Default)]
pub(crate) struct DanteOptions {
    /// Require RFC 1929 username/password (`socksmethod: username`): dante checks them
    /// against the system's users, so the fixture creates this user (a system account
    /// without a home or shell, named `rustle-...`) and sets its password, which needs
    /// root. `None`: no authentication.
    pub user: Option<(String, String)>,
}

/// dante as a SOCKS5 parent on 127.0.0.1: CONNECT, UDP ASSOCIATE and BIND from loopback
/// clients, going out from 127.0.0.1 only.
pub(crate) struct Dante {
    daemon: Daemon,
    addr: SocketAddr,
    // Last: removed after the daemon has stopped.
    dir: TempDir,
}

impl Dante {
    /// Starts `danted -f danted.conf -N 1` and waits until it listens; `None` when dante
    /// is not installed, or `user` is asked for and the tests do not run as root.
    pub(crate) fn start(opts: DanteOptions) -> Option<Dante> {
        let program = find_program("danted", "/usr/sbin/danted")?;
        if let Some((name, password)) = &opts.user {
            if !is_root() {
                rustle_bench::tools::skip_host(
                    "dante checks system users and creating one needs root",
                );
                return None;
            }
            ensure_system_user(name, password);
        }
        let dir = TempDir::new("dante");
        let mut last_failure = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port();
            let conf = dir.file("danted.conf");
            std::fs::write(&conf, dante_conf(dir.path(), port, opts.user.is_some()))
                .expect("write danted.conf");
            let mut cmd = Command::new(&program);
            cmd.arg("-f").arg(&conf).args(["-N", "1", "-p"]).arg(dir.file("danted.pid"));
            // A failed attempt's log would be read as this one's.
            let _ = std::fs::remove_file(dir.file("danted.log"));
            let daemon = Daemon::spawn("danted", cmd, dir.path());
            match daemon.wait_listening(port, &["danted.log"]) {
                Ok(()) => {
                    let addr = SocketAddr::from(([127, 0, 0, 1], port));
                    return Some(Dante { daemon, addr, dir });
                }
                Err(Failure::Exited(report)) if report.contains("Address already in use") => {
                    last_failure = report;
                }
                Err(Failure::Exited(report) | Failure::Timeout(report)) => {
                    panic!("dante did not start:\n{report}")
                }
            }
        }
        panic!("dante found no free port in {PORT_ATTEMPTS} attempts:\n{last_failure}")
    }

    /// Where it listens (127.0.0.1).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The main danted process (its children are in its process group).
    pub(crate) fn pid(&self) -> u32 {
        self.daemon.pid
    }

    /// Its temporary directory (configuration, log, pid file).
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// dante's log so far (`pass(1): tcp/connect [: ...` when a session opens, `]: ...`
    /// when it ends, `block(1): ...` for a refusal), waiting up to ~1 s for a first line.
    pub(crate) fn log(&self) -> String {
        wait_for_text(&self.dir.file("danted.log"), Duration::from_secs(1), |t| !t.is_empty())
    }

    /// The first log line satisfying `pred`, waiting up to ~3 s for it; panics with the
    /// whole log when none comes.
    pub(crate) fn log_line(&self, pred: impl Fn(&str) -> bool) -> String {
        wait_for_line(&self.dir.file("danted.log"), "dante log", pred)
    }

    /// SIGKILL to every dante process now, as a parent that dies; returns once they are
    /// gone.
    pub(crate) fn kill(&mut self) {
        let left = self.daemon.kill();
        assert!(left.is_empty(), "dante left processes behind: {left:?}");
    }
}

impl Drop for Dante {
    fn drop(&mut self) {
        self.daemon.stop();
    }
}

fn dante_conf(dir: &Path, port: u16, username: bool) -> String {
    let d = dir.display();
    let method = if username { "username" } else { "none" };
    let mut conf = format!(
        "logoutput: {d}/danted.log
internal: 127.0.0.1 port = {port}
external: 127.0.0.1
clientmethod: none
socksmethod: {method}
"
    );
    if is_root() {
        // root to read /etc/shadow for `username`; the rest runs as nobody.
        conf.push_str("user.privileged: root\nuser.unprivileged: nobody\n");
    }
    conf.push_str(
        "client pass {
    from: 127.0.0.0/8 to: 0.0.0.0/0
    log: error connect disconnect
}
socks pass {
    from: 127.0.0.0/8 to: 0.0.0.0/0
    command: connect udpassociate bindreply udpreply
    log: error connect disconnect
}
",
    );
    conf
}

/// Creates the system user `name` if it does not exist and sets its password (once per
/// test process for each pair). Only names starting with `rustle-` are touched, so that
/// no test can change a real account.
fn ensure_system_user(name: &str, password: &str) {
    static DONE: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
    assert!(
        name.starts_with("rustle-") && name.len() <= 32 && !name.contains(':'),
        "a dante test user is named rustle-...: {name:?}"
    );
    assert!(!password.contains(['\n', ':']), "a password chpasswd can take: {password:?}");
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    let pair = (name.to_string(), password.to_string());
    if done.contains(&pair) {
        return;
    }
    let exists = Command::new("getent")
        .args(["passwd", name])
        .stdout(Stdio::null())
        .status()
        .expect("run getent")
        .success();
    if !exists {
        let out = Command::new("useradd")
            .args(["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name])
            .output()
            .expect("run useradd");
        // Exit status 9: created meanwhile by another test process.
        assert!(
            out.status.success() || out.status.code() == Some(9),
            "useradd {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut chpasswd = Command::new("chpasswd")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run chpasswd");
    {
        use std::io::Write;
        let mut stdin = chpasswd.stdin.take().expect("chpasswd's stdin is piped");
        stdin.write_all(format!("{name}:{password}\n").as_bytes()).expect("write to chpasswd");
    }
    let out = chpasswd.wait_with_output().expect("wait for chpasswd");
    assert!(out.status.success(), "chpasswd {name}: {}", String::from_utf8_lossy(&out.stderr));
    done.push(pair);
}

/// Where `program` is installed (on PATH, or at `path`: /usr/sbin is not on every user's
/// PATH); a missing one is `rustle_bench::tools::missing` (a failure in CI). Neither squid
/// nor danted takes `--version`, so `have` cannot tell.
#[track_caller]
fn find_program(program: &str, path: &str) -> Option<PathBuf> {
    let found = rustle_bench::tools::find(program, &[path]);
    if found.is_none() {
        rustle_bench::tools::missing(program);
    }
    found
}

/// Whether the tests run as root (the owner of /proc/self is the effective user).
pub(crate) fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A 127.0.0.1 port that was free a moment ago (bound to port 0, then closed); the
/// daemon may still lose it to another test, hence the retries in `start`.
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("bound address").port()
}

/// haproxy (Debian's) in TCP mode in front of a backend, sending it a PROXY protocol
/// header (`send-proxy` or `send-proxy-v2`) on every connection.
pub(crate) struct Haproxy {
    daemon: Daemon,
    addr: SocketAddr,
    // Last: removed after the daemon has stopped.
    _dir: TempDir,
}

impl Haproxy {
    /// Starts `haproxy -db -f haproxy.cfg` and waits until it listens; `None` when haproxy
    /// is not installed.
    pub(crate) fn start(backend: SocketAddr, send: &str) -> Option<Haproxy> {
        Haproxy::start_lines(&format!("    server r1 {backend} {send}\n"))
    }

    /// haproxy balancing connections over `backends` in turn (`balance roundrobin`), as
    /// an L4 balancer in front of a fleet.
    pub(crate) fn balance(backends: &[SocketAddr]) -> Option<Haproxy> {
        let mut lines = String::from("    balance roundrobin\n");
        for (i, b) in backends.iter().enumerate() {
            lines += &format!("    server r{i} {b}\n");
        }
        Haproxy::start_lines(&lines)
    }

    fn start_lines(backend: &str) -> Option<Haproxy> {
        let program = find_program("haproxy", "/usr/sbin/haproxy")?;
        let dir = TempDir::new("haproxy");
        let mut last_failure = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port();
            let conf = dir.file("haproxy.cfg");
            let text = format!(
                "defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 30s\n    \
                 timeout server 30s\nfrontend front\n    bind 127.0.0.1:{port}\n    \
                 default_backend rustle\nbackend rustle\n{backend}"
            );
            std::fs::write(&conf, text).expect("write haproxy.cfg");
            let mut cmd = Command::new(&program);
            cmd.args(["-db", "-f"]).arg(&conf);
            let daemon = Daemon::spawn("haproxy", cmd, dir.path());
            match daemon.wait_listening(port, &[]) {
                Ok(()) => {
                    let addr = SocketAddr::from(([127, 0, 0, 1], port));
                    return Some(Haproxy { daemon, addr, _dir: dir });
                }
                Err(Failure::Exited(report)) if report.contains("ddress already in use") => {
                    last_failure = report;
                }
                Err(Failure::Exited(report) | Failure::Timeout(report)) => {
                    panic!("haproxy did not start:\n{report}")
                }
            }
        }
        panic!("haproxy found no free port in {PORT_ATTEMPTS} attempts:\n{last_failure}")
    }

    /// Where it listens (127.0.0.1).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        self.daemon.stop();
    }
}

/// Waits up to `limit` for the file's text to satisfy `ready`; returns it as it is then.
fn wait_for_text(path: &Path, limit: Duration, ready: impl Fn(&str) -> bool) -> String {
    let text = || std::fs::read_to_string(path).unwrap_or_default();
    wait_until(limit, || ready(&text()));
    text()
}

fn wait_for_line(path: &Path, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let text = wait_for_text(path, Duration::from_secs(3), |t| t.lines().any(&pred));
    match text.lines().find(|l| pred(l)) {
        Some(l) => l.to_string(),
        None => panic!("no matching line in the {what}; it has:\n{text}"),
    }
}

/// Why a daemon is not ready.
enum Failure {
    /// It exited; the report holds its status, stderr and logs.
    Exited(String),
    /// It did not listen in time.
    Timeout(String),
}

/// A daemon started in its own process group, stopped by PID.
struct Daemon {
    name: &'static str,
    child: Child,
    /// Its PID, which is also its process group's id.
    pid: u32,
    /// Its temporary directory: configuration, logs, output.
    dir: PathBuf,
    /// The prefix of the shared memory segments (in /dev/shm) it creates, removed once it
    /// has stopped.
    shm_prefix: Option<String>,
    stopped: bool,
}

impl Daemon {
    /// Spawns `cmd` in a new process group, stdout and stderr to `NAME.out` in `dir`.
    fn spawn(name: &'static str, mut cmd: Command, dir: &Path) -> Daemon {
        let out = File::create(dir.join(format!("{name}.out"))).expect("create the output file");
        let err = out.try_clone().expect("clone the output file");
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let pid = child.id();
        Daemon { name, child, pid, dir: dir.to_path_buf(), shm_prefix: None, stopped: false }
    }

    /// Waits until the daemon itself holds a socket listening on 127.0.0.1:`port` (read
    /// from /proc, so that no probe connection shows up in its logs).
    fn wait_listening(&self, port: u16, logs: &[&str]) -> Result<(), Failure> {
        let listening = || listening_inode(port).is_some_and(|inode| holds_socket(self.pid, inode));
        // Over when it listens, or when it has exited (it never will then).
        wait_until(START_DEADLINE, || listening() || !is_alive(self.pid));
        if listening() {
            Ok(())
        } else if !is_alive(self.pid) {
            Err(Failure::Exited(self.report(logs)))
        } else {
            Err(Failure::Timeout(format!(
                "not listening on 127.0.0.1:{port} after {START_DEADLINE:?}\n{}",
                self.report(logs)
            )))
        }
    }

    /// The daemon's output and `logs` (files in its directory), for a failure message.
    fn report(&self, logs: &[&str]) -> String {
        let mut out = format!("{} (pid {})", self.name, self.pid);
        let output = format!("{}.out", self.name);
        for name in std::iter::once(output.as_str()).chain(logs.iter().copied()) {
            let path = self.dir.join(name);
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            out.push_str(&format!("\n--- {}:\n{text}", path.display()));
        }
        out
    }

    /// SIGKILL to the whole group, reaps the daemon, and waits up to 2 s for the rest of
    /// the group to go; returns what is left.
    fn kill(&mut self) -> Vec<String> {
        signal("KILL", &format!("-{}", self.pid));
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stopped = true;
        wait_until(Duration::from_secs(2), || leftovers(self.pid, &self.dir).is_empty());
        let left = leftovers(self.pid, &self.dir);
        if let Some(prefix) = &self.shm_prefix {
            for segment in shm_segments(prefix) {
                let _ = std::fs::remove_file(segment);
            }
        }
        left
    }

    /// SIGTERM to the daemon, SIGKILL to its group after `TERM_GRACE`, then asserts that
    /// nothing of it is left (unless the test is already failing).
    fn stop(&mut self) {
        if self.stopped {
            return;
        }
        signal("TERM", &self.pid.to_string());
        wait_until(TERM_GRACE, || !matches!(self.child.try_wait(), Ok(None)));
        // The daemon if it is still there, and whatever helpers outlive it.
        let left = self.kill();
        if !left.is_empty() && !std::thread::panicking() {
            panic!("{} left processes behind: {left:?}", self.name);
        }
    }
}

impl Drop for Daemon {
    /// A daemon that failed to start, or whose fixture panicked while starting, goes too.
    fn drop(&mut self) {
        if !self.stopped {
            self.kill();
        }
    }
}

/// Sends signal `name` to `target` (a PID, or `-PGID` for a group) with kill(1).
fn signal(name: &str, target: &str) {
    // A group already gone makes kill(1) fail: nothing to do then.
    let _ = Command::new("kill")
        .args([&format!("-{name}"), "--", target])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The running (not zombie) processes in process group `pgid` or whose command line names
/// `dir`, as "PID COMMAND".
pub(crate) fn leftovers(pgid: u32, dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy();
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return out };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Some((state, pgrp)) = stat_fields(pid) else { continue };
        if state == 'Z' {
            continue;
        }
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if pgrp == pgid || cmdline.contains(dir.as_ref()) {
            out.push(format!("{pid} {}", cmdline.trim()));
        }
    }
    out
}

/// The shared memory segments (files in /dev/shm) whose names start with `prefix`.
pub(crate) fn shm_segments(prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else { return Vec::new() };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect()
}

/// The state and process group of `pid`, from /proc/PID/stat.
fn stat_fields(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `PID (COMM) STATE PPID PGRP ...`; COMM may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let _ppid = f.next()?;
    let pgrp = f.next()?.parse().ok()?;
    Some((state, pgrp))
}

/// Whether `pid` runs (exists and is not a zombie).
fn is_alive(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|(state, _)| state != 'Z')
}

/// The inode of the socket listening on 127.0.0.1:`port`, from /proc/net/tcp.
fn listening_inode(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    // `sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode`; the
    // address is the IPv4 address in host byte order, then the port; state 0A is LISTEN.
    let local = [format!("0100007F:{port:04X}"), format!("7F000001:{port:04X}")];
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let listening = f.len() > 9 && local.iter().any(|a| a == f[1]) && f[3] == "0A";
        listening.then(|| f[9].parse().ok()).flatten()
    })
}

/// Whether process `pid` has the socket `inode` open.
fn holds_socket(pid: u32, inode: u64) -> bool {
    let want = format!("socket:[{inode}]");
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == want))
}
