//! The processes, namespaces, cgroups and scratch directories the campaign
//! creates, registered as they are made so that SIGINT/SIGTERM can undo all
//! of them: a background thread waits for the signal, stops every child by
//! its process group and pid, deletes the namespaces, cgroups and scratch
//! directories, then exits.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::sys;

#[derive(Default)]
struct Registry {
    /// Process-group ids (= the leader's pid) of running children.
    groups: Vec<u32>,
    netns: Vec<String>,
    cgroups: Vec<PathBuf>,
    /// Scratch directories (under /tmp), removed with everything in them.
    dirs: Vec<PathBuf>,
    /// Set once cleanup has begun: nothing new is started or created, so
    /// that the main thread, still running, cannot leave anything behind.
    stopping: bool,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    groups: Vec::new(),
    netns: Vec::new(),
    cgroups: Vec::new(),
    dirs: Vec::new(),
    stopping: false,
});

fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    // A poisoned lock only means another thread panicked mid-update; the
    // lists are still the best record of what to clean up.
    let mut g = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut g)
}

pub(super) fn register_netns(name: &str) {
    with(|r| r.netns.push(name.to_string()));
}

pub(super) fn forget_netns(name: &str) {
    with(|r| r.netns.retain(|n| n != name));
}

pub(super) fn register_cgroup(dir: &Path) {
    with(|r| r.cgroups.push(dir.to_path_buf()));
}

pub(super) fn forget_cgroup(dir: &Path) {
    with(|r| r.cgroups.retain(|d| d != dir));
}

/// Creates a directory (and its parents) unless cleanup has begun; with
/// `remove_on_cleanup` it is registered for [`cleanup_all`] to delete.
/// Under the registry lock, so that a directory is either made before
/// cleanup takes the list (and deleted by it) or not made at all.
pub(super) fn make_dir(dir: &Path, remove_on_cleanup: bool) -> Result<()> {
    with(|r| {
        if r.stopping {
            anyhow::bail!("interrupted: not creating {}", dir.display());
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        if remove_on_cleanup {
            r.dirs.push(dir.to_path_buf());
        }
        Ok(())
    })
}

/// Registers a child's process group, or stops the child at once when
/// cleanup has already taken the list.
fn register_child(child: &mut Child) {
    let id = child.id();
    let registered = with(|r| {
        if !r.stopping {
            r.groups.push(id);
        }
        !r.stopping
    });
    if !registered {
        sys::signal(id, &sys::tree(id), "KILL");
        let _ = child.wait();
    }
}

/// Starts the thread that cleans up and exits on SIGINT or SIGTERM.
pub(super) fn install_signal_handler() -> Result<()> {
    std::thread::Builder::new()
        .name("campaign-signals".into())
        .spawn(|| {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            // Each registered on its own: one may fail (a shell that starts
            // a background job with SIGINT ignored) without losing the other.
            let got = rt.block_on(async {
                use tokio::signal::unix::{signal, SignalKind};
                let int = signal(SignalKind::interrupt()).ok();
                let term = signal(SignalKind::terminate()).ok();
                if int.is_none() && term.is_none() {
                    return false;
                }
                async fn recv(s: Option<tokio::signal::unix::Signal>) {
                    match s {
                        Some(mut s) => {
                            s.recv().await;
                        }
                        None => std::future::pending().await,
                    }
                }
                tokio::select! {
                    _ = recv(int) => true,
                    _ = recv(term) => true,
                }
            });
            if got {
                eprintln!(
                    "campaign: interrupted, stopping children, removing namespaces, cgroups \
                     and scratch files"
                );
                cleanup_all();
                std::process::exit(130);
            }
        })
        .context("spawning the signal thread")?;
    Ok(())
}

/// Stops every registered child, then removes namespaces, cgroups and
/// scratch directories. Nothing new can be registered afterwards.
pub(super) fn cleanup_all() {
    let (groups, netns, cgroups, dirs) = with(|r| {
        r.stopping = true;
        (
            std::mem::take(&mut r.groups),
            std::mem::take(&mut r.netns),
            std::mem::take(&mut r.cgroups),
            std::mem::take(&mut r.dirs),
        )
    });
    for g in &groups {
        let pids = sys::tree(*g);
        sys::signal(*g, &pids, "KILL");
    }
    // Give the kernel a moment to reap them before the groups must be empty.
    std::thread::sleep(Duration::from_millis(300));
    for n in netns {
        let _ = Command::new("ip").args(["netns", "del", &n]).stderr(Stdio::null()).status();
    }
    for d in cgroups {
        let _ = std::fs::remove_dir(&d);
    }
    for d in dirs {
        let _ = std::fs::remove_dir_all(&d);
    }
}

/// A child process in its own process group, stopped (group and
/// descendants) when dropped.
pub(super) struct Proc {
    pub child: Child,
    pub name: String,
    stderr_file: Option<PathBuf>,
}

impl Proc {
    /// Spawns `cmd` in a new process group; stdout and stderr go to files
    /// `<dir>/<name>.out|err` when `dir` is given.
    pub(super) fn spawn(name: &str, mut cmd: Command, dir: Option<&Path>) -> Result<Proc> {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0).stdin(Stdio::null());
        let mut stderr_file = None;
        if let Some(d) = dir {
            let out = std::fs::File::create(d.join(format!("{name}.out")))?;
            let err_path = d.join(format!("{name}.err"));
            let err = std::fs::File::create(&err_path)?;
            cmd.stdout(out).stderr(err);
            stderr_file = Some(err_path);
        }
        let mut child = cmd.spawn().with_context(|| format!("starting {name}: {cmd:?}"))?;
        register_child(&mut child);
        Ok(Proc { child, name: name.to_string(), stderr_file })
    }

    /// Like `spawn` with stdout and stderr piped to the caller.
    pub(super) fn spawn_piped(name: &str, mut cmd: Command) -> Result<Proc> {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| format!("starting {name}: {cmd:?}"))?;
        register_child(&mut child);
        Ok(Proc { child, name: name.to_string(), stderr_file: None })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True while the process has not exited.
    pub(super) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The last lines of its stderr file, for a skipped cell's reason.
    pub(super) fn stderr_tail(&self) -> String {
        let Some(p) = &self.stderr_file else { return String::new() };
        let s = std::fs::read_to_string(p).unwrap_or_default();
        let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(2)..].join(" | ")
    }

    /// Waits until the process listens on `port` (in its own namespace).
    pub(super) fn wait_listening(&mut self, port: u16, within: Duration) -> Result<()> {
        self.wait_ready(port, false, within)
    }

    /// Waits until the process listens on TCP `port`, or with `udp` has a
    /// UDP socket bound to it.
    pub(super) fn wait_ready(&mut self, port: u16, udp: bool, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        let ready = |p: &u32| if udp { sys::bound_udp(*p, port) } else { sys::listening(*p, port) };
        loop {
            if sys::tree(self.pid()).iter().any(ready) {
                return Ok(());
            }
            if !self.alive() {
                anyhow::bail!("{} exited: {}", self.name, self.stderr_tail());
            }
            if Instant::now() > deadline {
                anyhow::bail!("{} not listening on port {port}: {}", self.name, self.stderr_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM to the group and the tree, then SIGKILL after a grace period.
    pub(super) fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        let pgid = self.pid();
        if self.alive() {
            let pids = sys::tree(pgid);
            sys::signal(pgid, &pids, "TERM");
            let deadline = Instant::now() + Duration::from_secs(3);
            while self.alive() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            // Workers of a master that died first may linger: kill the rest.
            let rest = sys::tree(pgid);
            sys::signal(pgid, &rest, "KILL");
            let _ = self.child.wait();
        } else {
            // The leader is gone; members of its group may not be.
            sys::signal(pgid, &[], "KILL");
        }
        with(|r| r.groups.retain(|g| *g != pgid));
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if with(|r| r.groups.contains(&self.pid())) {
            self.stop_inner();
        }
    }
}
