//! A rustle process for one measurement: started with its stderr in a file,
//! awaited until it says where each listener listens (they bind port 0, so
//! no port is guessed), stopped by its pid when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Start-up under valgrind takes about a second here; a loaded machine may
/// take many more.
const START_WITHIN: Duration = Duration::from_secs(60);
/// A stopped rustle drains; its connections are gone by then, so this is
/// only a bound.
const STOP_WITHIN: Duration = Duration::from_secs(10);

pub(super) struct Proxy {
    child: Child,
    stderr: PathBuf,
    /// Each listener's kind (`http`, `socks`, ...) and address, in the order
    /// rustle reported them.
    pub listeners: Vec<(String, SocketAddr)>,
}

impl Proxy {
    /// Starts `cmd` (rustle, or valgrind running it) with no configuration
    /// file or log filter inherited, its control socket in `dir`, and waits
    /// for `listeners` "listening on" lines.
    pub(super) fn start(mut cmd: Command, dir: &Path, listeners: usize) -> Result<Proxy> {
        let stderr = dir.join("rustle.err");
        let err = std::fs::File::create(&stderr).context("creating rustle.err")?;
        cmd.env("RUSTLE_CONFIG", "")
            .env("RUNTIME_DIRECTORY", dir)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err);
        let child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let mut p = Proxy { child, stderr, listeners: Vec::new() };
        let start = Instant::now();
        loop {
            p.listeners = listening(&std::fs::read_to_string(&p.stderr).unwrap_or_default());
            if p.listeners.len() >= listeners {
                return Ok(p);
            }
            if let Some(status) = p.child.try_wait()? {
                bail!("rustle ended ({status}) before listening:\n{}", p.stderr_tail());
            }
            if start.elapsed() > START_WITHIN {
                bail!("rustle did not listen within {START_WITHIN:?}:\n{}", p.stderr_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The address of the first listener of `kind`.
    pub(super) fn addr(&self, kind: &str) -> Result<SocketAddr> {
        self.listeners
            .iter()
            .find(|(k, _)| k == kind)
            .map(|(_, a)| *a)
            .with_context(|| format!("rustle has no {kind} listener: {:?}", self.listeners))
    }

    /// A field of /proc/PID/status in KiB (`VmRSS`, `RssAnon`).
    pub(super) fn status_kib(&self, field: &str) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .context("reading /proc/PID/status")?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .with_context(|| format!("no {field} in /proc/PID/status"))
    }

    /// The last lines of its stderr, for errors.
    pub(super) fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// Fails when the process is gone (it crashed during a measurement).
    pub(super) fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("rustle ended ({status}) during the measurement:\n{}", self.stderr_tail());
        }
        Ok(())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        signal(self.child.id(), "TERM");
        let start = Instant::now();
        while start.elapsed() < STOP_WITHIN {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        signal(self.child.id(), "KILL");
        let _ = self.child.wait();
    }
}

/// Sends `sig` (TERM, INT, KILL) to one process with the system `kill`, so
/// that no unsafe code is needed.
pub(super) fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args(["-s", sig, "--", &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The listeners rustle announced on stderr, one line each:
/// `... listening on 127.0.0.1:41234 (http), 1 worker(s)`.
fn listening(stderr: &str) -> Vec<(String, SocketAddr)> {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = &l[l.find("listening on ")? + "listening on ".len()..];
            let (addr, rest) = rest.split_once(" (")?;
            let (kind, _) = rest.split_once(')')?;
            Some((kind.to_string(), addr.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn finds_the_listening_lines() {
        let err = "\
==1== Callgrind, a call-graph generating cache profiler
2026-12-02T11:26:50.917288Z  INFO rustle::run::server: listening on 127.0.0.1:46205 (http), 1 worker(s)
2026-12-02T11:26:50.960533Z  INFO rustle::run::server: listening on 127.0.0.1:39323 (socks), 1 worker(s)
";
        let l = listening(err);
        assert_eq!(l.len(), 2);
        assert_eq!(l[1], ("socks".to_string(), "127.0.0.1:39323".parse().unwrap()));
    }
}
