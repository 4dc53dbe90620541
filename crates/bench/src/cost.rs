//! `rustle-bench cost`: the cost guard. Deterministic figures per exchange
//! of each family ([`family::FAMILIES`]) through a running rustle, and its
//! memory at rest, compared with the committed baseline
//! (`bench/cost-baseline.toml`) or written to it.
//!
//! Per family, through a rustle with one worker and one listener, driven by
//! the load generator on one connection (`load --count`):
//! - instructions and allocations: rustle under callgrind ([`callgrind`]),
//!   counters zeroed after the warm-up and dumped after the window;
//! - system calls: rustle natively, `strace -f -c` attached for the window
//!   only ([`strace`]).
//!
//! Then [`memory`]: VmRSS of an idle rustle with its built-in listeners, and
//! per idle tunnel and idle kept-alive client. [`baseline`] holds the file
//! format and the verdict; [`machine`] says what the machine-dependent
//! figures depend on. The origin (`Origin`) runs in this process.

mod baseline;
mod callgrind;
mod family;
mod machine;
mod memory;
mod proxy;
mod strace;

pub use baseline::{compare, Baseline, Machine, Outcome, Tolerance, Verdict};

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use family::{Family, Listener};
use proxy::Proxy;

use crate::Origin;

/// The cost guard: a rustle's instructions, allocations and system calls per exchange, and
/// its memory at rest, against the baseline.
///
/// Needs valgrind (callgrind, vgdb) and strace. Exits non-zero when a figure is above its
/// baseline by more than its tolerance (2 % unless the baseline says otherwise).
#[derive(clap::Parser, Debug)]
#[command(name = "cost", args_override_self = true)]
pub struct Args {
    /// The rustle to measure [default: `rustle` beside this program, as cargo builds them
    /// into target/release/, else target/release/rustle].
    #[arg(long, value_name = "PATH")]
    pub rustle: Option<PathBuf>,
    /// The baseline file.
    #[arg(long, value_name = "FILE", default_value = "bench/cost-baseline.toml")]
    pub baseline: PathBuf,
    /// Write the figures measured as the baseline (the tolerances already in it are kept)
    /// instead of comparing with it.
    #[arg(long)]
    pub write: bool,
    /// Measure only these groups, comma-separated: the families (http-keepalive,
    /// http-close, connect, socks5, h2-stream, tls-resumed) and memory; not with --write.
    /// Also connect-bind (`connect` with every tunnel from a random 127.0.0.0/8 address),
    /// measured only when named here and printed without a baseline: --only
    /// connect,connect-bind.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = group)]
    pub only: Option<Vec<String>>,
}

/// A group `--only` may name: a family or `memory`.
fn group(name: &str) -> Result<String> {
    if name != "memory" {
        family::named(name)?;
    }
    Ok(name.to_string())
}

struct Options {
    rustle: PathBuf,
    baseline: PathBuf,
    write: bool,
    only: Option<Vec<String>>,
}

fn options(args: Args) -> Result<Options> {
    if args.write && args.only.is_some() {
        bail!("--write measures everything: it cannot be combined with --only");
    }
    Ok(Options {
        rustle: args.rustle.unwrap_or_else(default_rustle),
        baseline: args.baseline,
        write: args.write,
        only: args.only,
    })
}

/// `rustle` beside this executable (target/release/rustle-bench →
/// target/release/rustle), else `target/release/rustle`.
fn default_rustle() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.join("rustle")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("target/release/rustle"))
}

pub fn main(args: Args) -> Result<()> {
    let o = options(args)?;
    for tool in ["valgrind", "vgdb", "strace"] {
        if Command::new(tool).arg("--help").output().is_err() {
            bail!("cost: `{tool}` is not installed (valgrind and strace are needed)");
        }
    }
    if !o.rustle.is_file() {
        bail!("cost: no rustle at {} (cargo build --release -p rustle)", o.rustle.display());
    }
    // Read first, so that a missing or broken baseline fails before a minute of measuring.
    let path = o.baseline.display().to_string();
    let old = std::fs::read_to_string(&o.baseline).ok().map(|t| Baseline::parse(&t)).transpose();
    if !o.write {
        if let Err(e) = &old {
            bail!("reading {path}: {e:#}");
        }
        if matches!(old, Ok(None)) {
            bail!("no baseline at {path}: `rustle-bench cost --write` makes one");
        }
    }
    let started = Instant::now();
    let iso = isolate()?;
    if iso.realtime {
        eprintln!(
            "cost: on CPU {}, real-time scheduling (rustle priority 2, its peers 1)",
            iso.cpu
        );
    } else {
        eprintln!(
            "cost: on CPU {}; real-time scheduling is not permitted here (root or \
             CAP_SYS_NICE): instructions, waits and memory compare only with a baseline written \
             the same way",
            iso.cpu
        );
    }
    let scratch = Scratch::new()?;
    let origin = Origin::start().context("starting the origin")?;
    let wanted = |g: &str| o.only.as_ref().is_none_or(|l| l.iter().any(|x| x == g));

    let mut figures: Vec<(String, f64)> = Vec::new();
    let mut report = String::new();
    let mut groups = Vec::new();
    // The extra families only when named: `wanted` takes every family without --only.
    let named = |g: &str| o.only.as_ref().is_some_and(|l| l.iter().any(|x| x == g));
    let extra = family::EXTRA.iter().filter(|f| named(f.name));
    for f in family::FAMILIES.iter().filter(|f| wanted(f.name)).chain(extra) {
        let dir = scratch.dir(f.name)?;
        let m = measure(f, &o.rustle, iso, origin.addr(), &dir)
            .with_context(|| format!("measuring {}", f.name))?;
        report.push_str(&m.render(f));
        if family::is_extra(f.name) {
            // Printed, never compared nor written: it has no baseline.
            eprintln!("cost: {} measured ({:.0?} so far)", f.name, started.elapsed());
            continue;
        }
        figures.extend(m.figures().into_iter().map(|(k, v)| (format!("{}.{k}", f.name), v)));
        groups.push(baseline::Group {
            name: f.name,
            comment: format!("{} (W = {}, N = {})", f.what, f.warmup, f.count),
            figures: m.figures(),
        });
        eprintln!("cost: {} measured ({:.0?} so far)", f.name, started.elapsed());
    }
    if wanted("memory") {
        let dir = scratch.dir("memory")?;
        let m = memory::measure(&o.rustle, iso, &origin, &dir).context("measuring memory")?;
        let anon: Vec<f64> = m.idle_anon_kib.iter().map(|&k| k as f64).collect();
        let rss: Vec<f64> = m.idle_rss_kib.iter().map(|&k| k as f64).collect();
        let mem = [
            ("idle_anon_kib", memory::median(&anon).round()),
            ("per_idle_tunnel_bytes", memory::median(&m.tunnel_bytes).round()),
            ("per_idle_client_bytes", memory::median(&m.client_bytes).round()),
        ];
        let round = |v: &[f64]| v.iter().map(|b| b.round()).collect::<Vec<_>>();
        let _ = writeln!(
            report,
            "memory (built-in listeners, 1 worker; {held} connections held)\n  idle RssAnon {} \
             KiB (median of {:?}); VmRSS {} KiB, not guarded (median of {:?})\n  per idle \
             CONNECT tunnel {} bytes (median of {:?})\n  per idle kept-alive client {} bytes \
             (median of {:?})",
            mem[0].1,
            m.idle_anon_kib,
            memory::median(&rss).round(),
            m.idle_rss_kib,
            mem[1].1,
            round(&m.tunnel_bytes),
            mem[2].1,
            round(&m.client_bytes),
            held = memory::HELD,
        );
        figures.extend(mem.iter().map(|(k, v)| (format!("memory.{k}"), *v)));
        groups.push(baseline::Group {
            name: "memory",
            comment: format!(
                "RssAnon of an idle rustle (no configuration file: auto and socks listeners, \
                 1 worker), KiB; its growth in bytes per idle CONNECT tunnel and per idle \
                 kept-alive HTTP client ({} held, set up one after the other, one GET each, \
                 read after tunnels park)",
                memory::HELD
            ),
            figures: mem.to_vec(),
        });
    }
    println!("{report}");
    eprintln!("cost: measured in {:.0?}", started.elapsed());

    let here = machine::here(iso.realtime);
    if o.write {
        let tolerances = match old {
            Ok(Some(b)) if !b.tolerances.is_empty() => b.tolerances,
            _ => default_tolerances(),
        };
        let text =
            baseline::write(HEADER, &here, &machine::record(&o.rustle), &groups, &tolerances);
        std::fs::write(&o.baseline, text).with_context(|| format!("writing {path}"))?;
        println!("wrote {path}: commit it with a commit message line `Cost: <why>`.");
        return Ok(());
    }
    let base = old?.with_context(|| format!("no baseline at {path}"))?;
    let verdict = compare(&base, &figures, &here, o.only.as_deref());
    print!("{}", verdict.render(&path));
    if verdict.failed() {
        bail!("a figure is above its baseline (see the table above)");
    }
    Ok(())
}

/// The baseline file's opening comment.
const HEADER: &str = "\
# The cost guard's baseline: `rustle-bench cost` measures these figures and fails when one is
# above its value here by more than its tolerance (2 % unless [tolerance] says otherwise).
# crates/rustle/tests/cost.rs runs it in `cargo test`; bench/README.md, \"The cost guard\", says
# more.
#
# Each family's figures are per exchange, through target/release/rustle with one worker and
# one listener on 127.0.0.1 (access log and kernel TLS off), driven by `rustle-bench load`
# on one connection, all of them on one CPU: W exchanges of warm-up, then a window of
# exactly N (`load --count N`), each a GET of a 1 KiB body from `rustle-bench origin`.
#   instructions  instructions executed by every thread of rustle (callgrind's Ir) / N,
#                 rustle under valgrind --tool=callgrind, counters zeroed after the warm-up
#   allocations   calls to malloc, calloc, realloc, aligned_alloc, posix_memalign and
#                 memalign (callgrind's call counts) / N
#   syscalls      system calls of every thread but epoll_wait (strace -f -c, attached for
#                 the window) / N
#   waits         calls to epoll_wait / N: how often the worker waited for the peers. With
#                 rustle at a higher real-time priority than its peers on one CPU, every
#                 event the peers cause is a turn of its own; otherwise whether their
#                 bytes are there yet when the worker looks is chance (up to 50 % apart
#                 between identical runs).
# [memory] is RssAnon, the process's own resident pages (VmRSS adds file-backed pages, which
# vary with the page cache): of rustle started with no configuration file (its built-in
# listeners, one worker) and left idle, and its growth per idle CONNECT tunnel and per idle
# kept-alive HTTP client (1000 held, set up one after the other, one GET each, read after
# tunnels park); medians over 3 processes each.
#
# To accept a change in cost, on the machine [machine] describes (or on the CI machine,
# writing the figures for it):
#   cargo build --release -p rustle && cargo build --release -p rustle-bench &&
#     target/release/rustle-bench cost --write
# then commit this file with a commit message line `Cost: <why>`. The tolerances below
# are kept by --write; edit them by hand, each with its reason.
";

/// The tolerances a first baseline gets.
fn default_tolerances() -> BTreeMap<String, Tolerance> {
    let mut t = BTreeMap::new();
    t.insert(
        "memory.per_idle_tunnel_bytes".to_string(),
        Tolerance {
            relative: 0.05,
            absolute: 0.0,
            why: "what a parked tunnel keeps depends on which pages the park's trim can hand \
                  back, which varies with when each tunnel parked: single processes ranged \
                  483-504 bytes between identical runs, medians of three 492-496"
                .into(),
        },
    );
    t.insert(
        "allocations".to_string(),
        Tolerance {
            relative: baseline::DEFAULT_RELATIVE,
            absolute: 0.05,
            why: "near zero on the kept-alive paths, where a pool growing once in a window \
                  moves the figure by more than 2 %; one allocation in 20 exchanges is \
                  allowed, one per exchange is +1.0"
                .into(),
        },
    );
    t
}

/// One family's figures.
struct Measured {
    dump: callgrind::Dump,
    syscalls: strace::Summary,
    count: u64,
}

impl Measured {
    /// System calls without the waits (`epoll_wait`), which depend on timing.
    fn syscalls_guarded(&self) -> u64 {
        self.syscalls.total - self.syscalls.calls_of("epoll_wait")
    }

    fn per(&self, n: u64) -> f64 {
        n as f64 / self.count as f64
    }

    fn figures(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("instructions", self.per(self.dump.instructions).round()),
            ("allocations", round3(self.per(self.dump.total_allocations()))),
            ("syscalls", round3(self.per(self.syscalls_guarded()))),
            ("waits", round3(self.per(self.syscalls.calls_of("epoll_wait")))),
        ]
    }

    fn render(&self, f: &Family) -> String {
        let mut s = format!("{} ({}; W = {}, N = {})\n", f.name, f.what, f.warmup, f.count);
        // "name count-per-exchange" for each entry of a breakdown.
        let per_exchange = |entries: &mut dyn Iterator<Item = (&String, &u64)>| -> Vec<String> {
            entries.map(|(k, v)| format!("{k} {}", round3(self.per(*v)))).collect()
        };
        let allocs = per_exchange(&mut self.dump.allocations.iter());
        let calls = per_exchange(&mut self.syscalls.calls.iter().map(|(k, v)| (k, v)));
        let _ = writeln!(s, "  instructions {:.0}", self.per(self.dump.instructions));
        let _ = writeln!(
            s,
            "  allocations  {} ({})",
            round3(self.per(self.dump.total_allocations())),
            if allocs.is_empty() { "none".to_string() } else { allocs.join(", ") }
        );
        let _ = writeln!(
            s,
            "  syscalls     {}, and epoll_wait {} ({})",
            round3(self.per(self.syscalls_guarded())),
            round3(self.per(self.syscalls.calls_of("epoll_wait"))),
            calls.join(", ")
        );
        s
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Measures one family: under callgrind, then natively under strace.
fn measure(
    f: &Family,
    rustle: &Path,
    iso: Isolation,
    origin: SocketAddr,
    dir: &Path,
) -> Result<Measured> {
    let conf = dir.join("rustle.toml");
    std::fs::write(&conf, family::config(f.listener, origin, dir))
        .context("writing rustle.toml")?;
    if f.listener == Listener::TlsRelay {
        let out = Command::new(rustle)
            .args(["cert", "--self-signed", "localhost", "--out"])
            .arg(dir.join("certs"))
            .output()
            .context("running rustle cert")?;
        if !out.status.success() {
            bail!("rustle cert: {}", String::from_utf8_lossy(&out.stderr));
        }
    }

    let profile = dir.join("callgrind.out");
    let mut cmd = callgrind::command(iso, rustle, &profile);
    cmd.arg("--config").arg(&conf);
    let mut proxy = Proxy::start(cmd, dir, 1)?;
    let addr = proxy.addr(f.listener.kind())?;
    family::run(f, &family::load(f, addr, origin, f.warmup, dir))?;
    callgrind::monitor(&proxy, "zero")?;
    family::run(f, &family::load(f, addr, origin, f.count, dir))?;
    callgrind::monitor(&proxy, "dump")?;
    proxy.check_alive()?;
    drop(proxy);
    let dump = std::fs::read_to_string(callgrind::first_dump(&profile))
        .context("reading callgrind's dump")?;
    let dump = callgrind::parse(&dump)?;

    let mut cmd = iso.command(rustle);
    cmd.arg("--config").arg(&conf);
    let mut proxy = Proxy::start(cmd, dir, 1)?;
    let addr = proxy.addr(f.listener.kind())?;
    family::run(f, &family::load(f, addr, origin, f.warmup, dir))?;
    let traced = strace::attach(&proxy, dir)?;
    family::run(f, &family::load(f, addr, origin, f.count, dir))?;
    let syscalls = traced.detach()?;
    proxy.check_alive()?;
    Ok(Measured { dump, syscalls, count: f.count })
}

/// How the measured processes are scheduled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Isolation {
    /// The one CPU this process, its threads and its children run on.
    cpu: u32,
    /// This process runs under SCHED_FIFO priority 1 and rustle under 2.
    realtime: bool,
}

impl Isolation {
    /// `program` started as the measured rustle: real-time priority 2 when this
    /// process has priority 1, so that it runs whenever it has work.
    pub(crate) fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        if self.realtime {
            let mut c = Command::new("chrt");
            c.args(["-f", "2"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    }
}

/// Puts this process on one CPU (every thread, and so every thread and process it
/// starts later: the origin, the load generator, rustle) under real-time scheduling
/// when it may (root, or CAP_SYS_NICE), with rustle above the rest.
///
/// An exchange's instructions depend on how often the worker's event loop runs dry
/// and parks, each turn a few thousand instructions: whether a peer's bytes arrive
/// while rustle, slowed many times by callgrind, is still busy decides whether they
/// join the turn in progress. Two CPUs, or a build running beside it on one, let that
/// interleaving vary between identical runs by more than the guard's tolerance. With
/// rustle at a higher real-time priority than its peers on one CPU, rustle handles
/// every event the moment it happens and nothing else on the machine can interleave,
/// so identical runs agree well within the tolerance, a build running or not.
fn isolate() -> Result<Isolation> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .context("no Cpus_allowed_list in /proc/self/status")?;
    let cpu = cpu_list_last(list.trim()).with_context(|| format!("bad CPU list {list:?}"))?;
    let me = std::process::id().to_string();
    let out = Command::new("taskset")
        .args(["-a", "-p", "-c", &cpu.to_string(), &me])
        .output()
        .context("running taskset (util-linux)")?;
    if !out.status.success() {
        bail!("taskset: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let realtime = Command::new("chrt")
        .args(["-f", "-a", "-p", "1", &me])
        .output()
        .is_ok_and(|o| o.status.success());
    Ok(Isolation { cpu, realtime })
}

/// The highest CPU of a list such as `0-3,6,8-9`.
fn cpu_list_last(list: &str) -> Option<u32> {
    list.split(',').filter_map(|r| r.rsplit('-').next()?.trim().parse().ok()).max()
}

/// The scratch directory (configurations, certificates, profiles), removed
/// at the end unless `RUSTLE_COST_KEEP` is set (then its path is printed, and
/// each family's callgrind profile of the window is its `cg.out.1`).
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch> {
        let d = std::env::temp_dir().join(format!("rustle-cost-{}", std::process::id()));
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        Ok(Scratch(d))
    }

    fn dir(&self, name: &str) -> Result<PathBuf> {
        let d = self.0.join(name);
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        Ok(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os("RUSTLE_COST_KEEP").is_some() {
            eprintln!("cost: profiles kept in {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse(s: &str) -> Result<Options> {
        use clap::Parser;
        super::options(Args::try_parse_from(std::iter::once("cost").chain(s.split_whitespace()))?)
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(cpu_list_last("0-3,6,8-9"), Some(9));
        assert_eq!(cpu_list_last("1"), Some(1));
        assert_eq!(cpu_list_last(""), None);
    }

    #[test]
    fn options() {
        let o = parse("--rustle /r --baseline b.toml --only connect,memory").unwrap();
        assert_eq!(o.rustle, PathBuf::from("/r"));
        assert_eq!(o.baseline, PathBuf::from("b.toml"));
        assert_eq!(o.only.unwrap(), ["connect", "memory"]);
        let o = parse("--write").unwrap();
        assert!(o.write && o.only.is_none());
        assert_eq!(o.baseline, PathBuf::from("bench/cost-baseline.toml"));
        assert!(parse("--only nope").is_err());
        assert!(parse("--only connect,").is_err());
        assert!(parse("--write --only memory").is_err());
        assert!(parse("--help").is_err());
    }

    #[test]
    fn the_first_baseline_gets_reasoned_tolerances_that_parse() {
        let groups = [baseline::Group {
            name: "connect",
            comment: "x".into(),
            figures: vec![("allocations", 10.0)],
        }];
        let text =
            baseline::write(HEADER, &Machine::default(), &[], &groups, &default_tolerances());
        let b = Baseline::parse(&text).unwrap();
        assert_eq!(b.tolerance("connect.allocations").absolute, 0.05);
        assert_eq!(b.get("connect.allocations"), Some(10.0));
    }
}
