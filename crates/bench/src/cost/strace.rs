//! System calls of a window: `strace -f -c` attached to every thread of a
//! running rustle for the window only, detached with SIGINT, its summary
//! read.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::proxy::{signal, Proxy};

/// How long strace may take to attach to every thread.
const ATTACH_WITHIN: Duration = Duration::from_secs(20);

/// strace's table: calls by system call, most first, and their total.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Summary {
    pub total: u64,
    pub calls: Vec<(String, u64)>,
}

/// strace attached to a process.
pub(super) struct Attached {
    child: Child,
    out: PathBuf,
}

/// Attaches to every thread of `proxy` and returns once strace says it is
/// attached, so that the window that follows is counted whole.
pub(super) fn attach(proxy: &Proxy, dir: &Path) -> Result<Attached> {
    let out = dir.join("strace.out");
    let err_path = dir.join("strace.err");
    let err = std::fs::File::create(&err_path).context("creating strace.err")?;
    let child = Command::new("strace")
        .args(["-f", "-c", "-p"])
        .arg(proxy.pid().to_string())
        .arg("-o")
        .arg(&out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .context("starting strace")?;
    let mut attached = Attached { child, out };
    let start = Instant::now();
    loop {
        // "strace: Process N attached with T threads" once all are.
        let text = std::fs::read_to_string(&err_path).unwrap_or_default();
        if text.contains(" attached") {
            return Ok(attached);
        }
        if let Some(status) = attached.child.try_wait()? {
            bail!("strace ended ({status}) before attaching: {}", text.trim());
        }
        if start.elapsed() > ATTACH_WITHIN {
            bail!("strace did not attach within {ATTACH_WITHIN:?}: {}", text.trim());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Summary {
    /// Calls of system calls whose name starts with `prefix`.
    pub(super) fn calls_of(&self, prefix: &str) -> u64 {
        self.calls.iter().filter(|(n, _)| n.starts_with(prefix)).map(|(_, c)| c).sum()
    }
}

impl Attached {
    /// Detaches (SIGINT) and reads the summary strace writes on its way out.
    pub(super) fn detach(mut self) -> Result<Summary> {
        signal(self.child.id(), "INT");
        let status = self.child.wait().context("waiting for strace")?;
        let text = std::fs::read_to_string(&self.out)
            .with_context(|| format!("strace ({status}) left no summary"))?;
        parse(&text)
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            signal(self.child.id(), "KILL");
            let _ = self.child.wait();
        }
    }
}

/// Reads `strace -c` output: rows of `% time, seconds, usecs/call, calls,
/// [errors,] syscall` between dashed rules, then the `total` row.
pub(super) fn parse(text: &str) -> Result<Summary> {
    let mut s = Summary::default();
    let mut total = None;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 5 || f[0].parse::<f64>().is_err() {
            continue;
        }
        let Some(name) = f.last() else { continue };
        let calls: u64 = f[3].parse().with_context(|| format!("bad strace row {line:?}"))?;
        if *name == "total" {
            total = Some(calls);
        } else {
            s.calls.push((name.to_string(), calls));
        }
    }
    s.total = total.context("strace's summary has no total row")?;
    s.calls.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(s)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_the_table_with_and_without_errors() {
        let text = "\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 39.88    0.142819          23      6000           sendto
 34.39    0.123155          20      6155           epoll_wait
 25.33    0.090720          15      6002         1 recvfrom
  0.33    0.001176          16        73           write
  0.01    0.000037          18         2         1 accept4
------ ----------- ----------- --------- --------- ----------------
100.00    0.358119          19     18232         2 total
";
        let s = parse(text).unwrap();
        assert_eq!(s.total, 18232);
        assert_eq!(s.calls[0], ("epoll_wait".to_string(), 6155));
        assert_eq!(s.calls.iter().map(|c| c.1).sum::<u64>(), 18232);
        assert_eq!(s.calls.len(), 5);
        assert_eq!(s.calls_of("epoll_"), 6155);
        assert!(parse("% time seconds\n").is_err());
    }
}
