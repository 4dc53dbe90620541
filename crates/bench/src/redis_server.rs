//! `RedisServer`: Debian's `redis-server` on a free loopback port, for the tests of the
//! fleet's shared state. It runs in a scratch directory with nothing persisted (`--save ""
//! --appendonly no`), can be killed and started again on the same port mid-test, paused
//! (SIGSTOP) to play a server that stops answering, and is killed by its process id when
//! dropped. With TLS (`start_tls`) it listens only on its TLS port, with a certificate for
//! 127.0.0.1 and localhost from a throwaway CA (`ca_file`).

use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

/// The program, as Debian installs it.
pub const PROGRAM: &str = "redis-server";

/// A server on a fresh database takes a few milliseconds to start; this only bounds a
/// broken start.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A running `redis-server`, killed on drop.
pub struct RedisServer {
    program: PathBuf,
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    tls: bool,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts one on a free port of 127.0.0.1, with `extra` arguments (`--requirepass`,
    /// ...). None when `redis-server` is missing: the calling test is then counted as
    /// skipped, or fails with `RUSTLE_REQUIRE_TOOLS=1` (see `tools`).
    #[track_caller]
    pub fn start(extra: &[&str]) -> Option<RedisServer> {
        RedisServer::begin(extra, false)
    }

    /// The same, listening with TLS only (`rediss://`), certificates from a throwaway CA.
    #[track_caller]
    pub fn start_tls(extra: &[&str]) -> Option<RedisServer> {
        RedisServer::begin(extra, true)
    }

    #[track_caller]
    fn begin(extra: &[&str], tls: bool) -> Option<RedisServer> {
        let Some(program) = crate::tools::find(PROGRAM, &["/usr/bin/redis-server"]) else {
            crate::tools::missing(PROGRAM);
            return None;
        };
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rustle-redis-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the redis-server directory");
        if tls {
            write_certificates(&dir).expect("write the redis-server certificates");
        }
        let port = free_port().expect("a free port");
        let mut server = RedisServer {
            program,
            child: None,
            port,
            dir,
            tls,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.restart().expect("start redis-server");
        Some(server)
    }

    /// The port it listens on (TLS only, with `start_tls`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT` (`rediss://localhost:PORT` with TLS: the name the
    /// certificate is checked against).
    pub fn url(&self) -> String {
        match self.tls {
            false => format!("redis://127.0.0.1:{}", self.port),
            true => format!("rediss://localhost:{}", self.port),
        }
    }

    /// The CA file that verifies the TLS server's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Its scratch directory (removed on drop), for files a test writes beside it.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Kills it (SIGKILL) and waits for it: its data is gone, its port closed.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (killing it first if it runs), empty, and waits
    /// until it accepts connections.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        let log = self.dir.join("redis.log");
        let _ = std::fs::remove_file(&log);
        let port = self.port.to_string();
        let mut cmd = Command::new(&self.program);
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--loglevel", "notice"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log);
        if self.tls {
            cmd.args(["--port", "0", "--tls-port", &port])
                .arg("--tls-cert-file")
                .arg(self.dir.join("server.pem"))
                .arg("--tls-key-file")
                .arg(self.dir.join("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(self.dir.join("ca.pem"))
                .args(["--tls-auth-clients", "no"]);
        } else {
            cmd.args(["--port", &port]);
        }
        cmd.args(&self.extra).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        let mut child = cmd.spawn()?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("Ready to accept connections") {
                break;
            }
            if let Some(status) = child.try_wait()? {
                return Err(io::Error::other(format!("redis-server exited ({status}): {text}")));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::other(format!("redis-server did not start: {text}")));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.child = Some(child);
        Ok(())
    }

    /// Stops it answering (SIGSTOP): connections stay open, replies never come.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, which: &str) {
        if let Some(child) = &self.child {
            let status = Command::new("kill").arg(which).arg(child.id().to_string()).status();
            assert!(status.is_ok_and(|s| s.success()), "kill {which} redis-server");
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A paused server is killed all the same (SIGKILL needs no SIGCONT).
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// ca.pem, and server.pem and server.key for localhost and 127.0.0.1 signed by it (the
/// slapd fixture's too).
pub(crate) fn write_certificates(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "rustle-bench redis test CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate()?;
    let ca = ca_params.self_signed(&ca_key)?;
    let mut leaf_params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
    leaf_params.distinguished_name.push(DnType::CommonName, "localhost");
    let leaf_key = KeyPair::generate()?;
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key)?;
    std::fs::write(dir.join("ca.pem"), ca.pem())?;
    std::fs::write(dir.join("server.pem"), leaf.pem())?;
    std::fs::write(dir.join("server.key"), leaf_key.serialize_pem())?;
    Ok(())
}
