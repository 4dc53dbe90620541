//! rustle under callgrind: instructions and allocations of a window.
//!
//! rustle runs under `valgrind --tool=callgrind` with collection on from the
//! start and every thread in one profile (`--separate-threads=no`, the
//! default). `vgdb` sends callgrind's monitor commands: `zero` before the
//! window, `dump` after it, which writes `cg.out.1` holding only the window.
//! Callgrind does not replace the allocator, so glibc's `malloc` and its
//! siblings are functions like any other, and the `calls=` lines under each
//! of them (one per caller) count the allocations.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use super::proxy::Proxy;
use super::Isolation;

/// The entry points of glibc's allocator that hand out memory. Rust's global
/// allocator reaches them through `__rdl_alloc` and friends; `free` is not
/// counted.
const ALLOCATORS: [&str; 6] =
    ["malloc", "calloc", "realloc", "aligned_alloc", "posix_memalign", "memalign"];

/// What one dump holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Dump {
    /// Instructions executed (callgrind's `Ir`), every thread.
    pub instructions: u64,
    /// Calls to the allocator's entry points, by name.
    pub allocations: BTreeMap<String, u64>,
}

impl Dump {
    pub(super) fn total_allocations(&self) -> u64 {
        self.allocations.values().sum()
    }
}

/// The `valgrind` command line that runs `rustle` with `args` under callgrind,
/// its profiles written to `out` (`out.1` at the first dump).
pub(super) fn command(iso: Isolation, rustle: &Path, out: &Path) -> Command {
    let mut cmd = iso.command("valgrind");
    cmd.arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg("--collect-atstart=yes")
        .arg(rustle);
    cmd
}

/// Sends a callgrind monitor command (`zero`, `dump`) to the process and
/// waits for it to be done.
pub(super) fn monitor(proxy: &Proxy, what: &str) -> Result<()> {
    let out = Command::new("vgdb")
        .arg(format!("--pid={}", proxy.pid()))
        .arg(what)
        .stdin(Stdio::null())
        .output()
        .context("running vgdb")?;
    if !out.status.success() {
        bail!("vgdb {what}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// The first dump's file: `out.1`.
pub(super) fn first_dump(out: &Path) -> PathBuf {
    let mut p = out.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

/// Reads a callgrind profile: the total of `Ir` and the calls to the
/// allocator. Names are compressed (`fn=(12) malloc` once, `cfn=(12)`
/// after), functions and called functions sharing one table; a recursion
/// suffix (`malloc'2`) is dropped.
pub(super) fn parse(text: &str) -> Result<Dump> {
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut dump = Dump::default();
    let mut total = None;
    let mut callee: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("fn=") {
            name(rest, &mut names);
        } else if let Some(rest) = line.strip_prefix("cfn=") {
            callee = Some(name(rest, &mut names));
        } else if let Some(rest) = line.strip_prefix("calls=") {
            let count: u64 = rest
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .with_context(|| format!("bad calls line {line:?}"))?;
            if let Some(f) = callee.as_deref().filter(|f| ALLOCATORS.contains(f)) {
                *dump.allocations.entry(f.to_string()).or_default() += count;
            }
        } else if let Some(rest) = line.strip_prefix("summary:").or(line.strip_prefix("totals:")) {
            let n = rest.split_whitespace().next().unwrap_or("");
            total = Some(n.parse().with_context(|| format!("bad total line {line:?}"))?);
        }
    }
    dump.instructions = total.context("the profile has no summary or totals line")?;
    Ok(dump)
}

/// `(12) malloc` defines and returns the name, `(12)` looks it up; an
/// uncompressed name is itself.
fn name(spec: &str, names: &mut BTreeMap<String, String>) -> String {
    let full = match spec.strip_prefix('(').and_then(|r| r.split_once(')')) {
        Some((id, rest)) => {
            let rest = rest.trim();
            if rest.is_empty() {
                names.get(id).cloned().unwrap_or_default()
            } else {
                names.insert(id.to_string(), rest.to_string());
                rest.to_string()
            }
        }
        None => spec.to_string(),
    };
    match full.rsplit_once('\'') {
        Some((base, depth)) if depth.bytes().all(|b| b.is_ascii_digit()) => base.to_string(),
        _ => full,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The shape of a real dump (valgrind 3.19), cut down.
    const PROFILE: &str = "\
# callgrind format
version: 1
events: Ir
summary: 233453321

ob=(3) /usr/lib/x86_64-linux-gnu/libc.so.6
fl=(179) ./malloc/./malloc/malloc.c
fn=(934) malloc
16 40
cfn=(946) _int_malloc
calls=10 3846
16 900
fn=(4576) posix_memalign
cfn=(4578) _mid_memalign.constprop.0
calls=2 0
3 77
ob=(5)
fl=(7)
fn=(20) __rdl_alloc
cfn=(934)
calls=7 0
1 70
cfn=(4576)
calls=2 0
1 20
fn=(21) rustle::thing
cfn=(22) realloc'2
calls=3 0
1 30
cfn=(23) callocate
calls=100 0
1 5

totals: 233453321
";

    #[test]
    fn counts_instructions_and_calls_to_the_allocator() {
        let d = parse(PROFILE).unwrap();
        assert_eq!(d.instructions, 233_453_321);
        let want: BTreeMap<String, u64> = [("malloc", 7), ("posix_memalign", 2), ("realloc", 3)]
            .map(|(k, v)| (k.into(), v))
            .into();
        assert_eq!(d.allocations, want);
        assert_eq!(d.total_allocations(), 12);
    }

    #[test]
    fn a_profile_without_totals_is_an_error() {
        assert!(parse("events: Ir\nfn=(1) main\n1 2\n").is_err());
        assert!(parse("summary: x\n").is_err());
    }

    #[test]
    fn the_first_dump_is_numbered_one() {
        assert_eq!(first_dump(Path::new("/t/cg.out")), PathBuf::from("/t/cg.out.1"));
    }
}
