//! What the campaign reads from /proc and writes to cgroups: process trees,
//! their CPU time and memory, per-CPU busy time, listening ports, and the
//! CPU quota group for the proxy.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Clock ticks per second for /proc/PID/stat. 100 on every Linux
/// architecture we run on (USER_HZ); reading it needs sysconf, i.e. libc.
const TICKS_PER_S: f64 = 100.0;

/// `pid` and all its descendants, found by walking /proc parent links, so
/// that a master's workers and a daemon's forked children are counted.
pub(super) fn tree(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(stat) = stat_fields(p) {
                // Field 4 (index 1 after the comm) is the parent.
                if let Some(pp) = stat.get(1).and_then(|s| s.parse().ok()) {
                    parents.push((p, pp));
                }
            }
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let cur = out[i];
        out.extend(parents.iter().filter(|(_, pp)| *pp == cur).map(|(p, _)| *p));
        i += 1;
    }
    out
}

/// Fields of /proc/PID/stat after the `(comm)`, which may contain spaces.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    Some(rest.split_whitespace().map(String::from).collect())
}

/// CPU seconds of the tree: utime+stime of every live process plus
/// cutime+cstime, which hold the time of children already reaped (dante
/// and squid helpers may come and go during a run).
pub(super) fn cpu_seconds(pid: u32) -> f64 {
    let mut ticks = 0u64;
    for p in tree(pid) {
        if let Some(f) = stat_fields(p) {
            // utime, stime, cutime, cstime are fields 14-17: indexes 11-14 here.
            ticks += (11..=14).filter_map(|i| f.get(i)?.parse::<u64>().ok()).sum::<u64>();
        }
    }
    ticks as f64 / TICKS_PER_S
}

/// Sum over the tree of a `/proc/PID/status` field in KB (VmRSS, VmHWM).
pub(super) fn status_kb(pid: u32, field: &str) -> u64 {
    tree(pid)
        .into_iter()
        .filter_map(|p| {
            let s = std::fs::read_to_string(format!("/proc/{p}/status")).ok()?;
            let line = s.lines().find(|l| l.starts_with(field))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .sum()
}

/// Busy and total jiffies of each CPU from /proc/stat.
pub(super) fn cpu_jiffies() -> Vec<(u64, u64)> {
    let Ok(s) = std::fs::read_to_string("/proc/stat") else { return Vec::new() };
    s.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| {
            let v: Vec<u64> = l.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
            let total: u64 = v.iter().take(8).sum();
            // idle and iowait are the 4th and 5th numbers.
            let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
            (total - idle, total)
        })
        .collect()
}

/// Busy share of `cpu` between two samples of [`cpu_jiffies`].
pub(super) fn busy_share(before: &[(u64, u64)], after: &[(u64, u64)], cpu: usize) -> Option<f64> {
    let (b0, t0) = *before.get(cpu)?;
    let (b1, t1) = *after.get(cpu)?;
    (t1 > t0).then(|| (b1 - b0) as f64 / (t1 - t0) as f64)
}

/// True when the network namespace of `pid` has a TCP socket listening on
/// `port` (read from the process's own view of /proc/net, so this works
/// inside namespaces the runner is not in).
pub(super) fn listening(pid: u32, port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["tcp", "tcp6"].iter().any(|f| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).is_ok_and(|s| {
            s.lines().skip(1).any(|l| {
                let mut it = l.split_whitespace();
                let local = it.nth(1).unwrap_or("");
                let state = it.nth(1).unwrap_or("");
                state == "0A" && local.ends_with(&want)
            })
        })
    })
}

/// True when `pid` has a UDP socket bound to `port` (in its namespace).
pub(super) fn bound_udp(pid: u32, port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["udp", "udp6"].iter().any(|f| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).is_ok_and(|s| {
            s.lines()
                .skip(1)
                .any(|l| l.split_whitespace().nth(1).is_some_and(|a| a.ends_with(&want)))
        })
    })
}

/// Sends `sig` (a name such as TERM or KILL) to a process group and to each
/// listed pid, with the system `kill` so that no unsafe code is needed.
pub(super) fn signal(pgid: u32, pids: &[u32], sig: &str) {
    let mut cmd = Command::new("kill");
    cmd.arg("-s").arg(sig).arg("--").arg(format!("-{pgid}"));
    cmd.args(pids.iter().map(u32::to_string));
    // Some may be gone already; kill then complains, which is fine.
    let _ = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).status();
}

/// A cgroup limiting the proxy to a share of a CPU, removed on drop.
pub(super) struct Quota {
    pub dir: PathBuf,
}

impl Quota {
    /// Makes `rustle-campaign-PID` with `cores` of quota per 100 ms period.
    pub(super) fn create(cores: f64) -> Result<Quota> {
        let name = format!("rustle-campaign-{}", std::process::id());
        let period = 100_000u64;
        let quota = (cores * period as f64).round() as u64;
        let v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let dir = if v2 {
            PathBuf::from("/sys/fs/cgroup").join(&name)
        } else {
            PathBuf::from("/sys/fs/cgroup/cpu").join(&name)
        };
        if !dir.exists() {
            std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let q = Quota { dir };
        let res = if v2 {
            // Needs the cpu controller enabled for children of the root.
            let _ = std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+cpu");
            std::fs::write(q.dir.join("cpu.max"), format!("{quota} {period}"))
        } else {
            std::fs::write(q.dir.join("cpu.cfs_period_us"), period.to_string())
                .and_then(|_| std::fs::write(q.dir.join("cpu.cfs_quota_us"), quota.to_string()))
        };
        res.with_context(|| format!("setting the quota in {}", q.dir.display()))?;
        Ok(q)
    }

    /// The file a process writes its pid to in order to join.
    pub(super) fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    pub(super) fn remove(&self) -> Result<()> {
        if self.dir.exists() {
            // A group can only be removed once empty; callers stop the proxy first.
            if let Err(e) = std::fs::remove_dir(&self.dir) {
                bail!("removing {}: {e}", self.dir.display());
            }
        }
        Ok(())
    }
}

/// MemTotal from /proc/meminfo, in GiB, as text.
pub(super) fn mem_total() -> String {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kb = info
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok());
    kb.map_or("?".to_string(), |k| format!("{:.0} GiB", k as f64 / 1024.0 / 1024.0))
}

/// Version of a Debian package, or "not installed".
pub(super) fn package_version(pkg: &str) -> String {
    Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", pkg])
        .output()
        .ok()
        .filter(|o| o.status.success() && !o.stdout.is_empty())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|| "not installed".to_string())
}

/// Full path of an executable found in PATH (or the path itself if it exists).
pub(super) fn which(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return p.exists().then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(tree(me).contains(&me));
        assert!(status_kb(me, "VmHWM:") > 0);
        assert!(cpu_seconds(me) >= 0.0);
        let a = cpu_jiffies();
        assert!(!a.is_empty());
        assert_eq!(busy_share(&a, &a, 0), None);
        assert_eq!(busy_share(&[(10, 100)], &[(55, 200)], 0), Some(0.45));
    }
}
