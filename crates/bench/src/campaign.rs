//! `rustle-bench campaign`: every scenario × proxy × repetition, each proxy
//! started fresh, the order of the proxies rotated between repetitions,
//! one CSV row per run plus a conditions file (see bench/README.md).
//!
//! Roles: the client (this binary's `load`) and the origin (`origin`) on
//! CPU 1, the proxy on CPU 0, with an optional CPU quota so that the proxy
//! sets the pace; on loopback or in network namespaces of our own.
//!
//! Submodules: [`profile`] (the report's families, the full and quick
//! profiles), `scenario` (names → load), `peers` (proxies and their
//! configurations), `run` (one cell), `net` (namespaces), `children`
//! (processes and cleanup on signals), `sys` (/proc and cgroups),
//! [`record`] (the CSV row, shared with the report).

mod children;
mod net;
mod peers;
pub mod profile;
pub mod record;
mod run;
mod scenario;
mod sys;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use children::Proc;
use net::{Net, Role};
use peers::Proxy;
use record::{Row, Status};

const ABOUT: &str = "Run benchmark scenarios against rustle and its peers";
const LONG_ABOUT: &str = "Runs scenarios x proxies x repetitions, each proxy started fresh, the \
    order of the proxies rotated between repetitions; writes runs.csv and conditions.txt. With \
    --profile, runs the report's families (bench/README.md) and, for the full profile, \
    regenerates BENCHMARKS.md, the README's performance summary and the charts from the data \
    it wrote.";

/// `rustle-bench campaign`: runs scenarios against proxies and writes one CSV row per run.
#[derive(Debug, Clone, clap::Args)]
#[command(about = ABOUT, long_about = LONG_ABOUT)]
pub struct Args {
    /// Run the report's families: `full` (every family, every peer; under two hours) writes
    /// bench/data/YYYYMMDD/ and regenerates the documents from it; `quick` (minutes) runs a
    /// few cells into a temporary directory and checks that rustle's ran clean. Each family
    /// has its own network, repetitions and duration (--netem, --rate-limit and --sweep do
    /// not apply).
    #[arg(
        long,
        value_enum,
        conflicts_with_all = ["scenarios", "proxies", "sweep", "netem", "rate_limit"]
    )]
    pub profile: Option<profile::ProfileName>,
    /// With --profile: only these families (comma-separated ids, e.g. http,tls), into the
    /// newest data set (or --out): their rows replace the old ones, the other families' rows
    /// are kept; the documents are left for `rustle-bench report --documents`.
    #[arg(long, value_delimiter = ',', requires = "profile")]
    pub family: Vec<String>,
    /// Print what would run and an estimate of the time it takes; run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// With --profile full: leave BENCHMARKS.md, the README and the charts as they are.
    #[arg(long)]
    pub no_documents: bool,
    /// Comma-separated scenario names or groups (quick, mix, mix-3k, stream1-down, stream1-up,
    /// stream16, stream16-up, close, idle, idle-N, h2, udp, tls, mem-tunnels-N, all).
    #[arg(long)]
    pub scenarios: Option<String>,
    /// Comma-separated proxies (see bench/README.md for the list; default: every peer but
    /// the floor and the variants).
    #[arg(long, value_delimiter = ',')]
    pub proxies: Option<Vec<String>>,
    /// `NAME[:http,connect,socks,relay,ws,udp-socks,udp-relay,tls-term,tls-orig]='command
    /// {listen} {target}'` (repeatable; {target} is the UDP echo for udp-relay, the HTTPS
    /// origin for tls-orig; TLS: {cert} {key} {combined} {origin_ca} {origin_name}).
    #[arg(long = "extra-proxy")]
    pub extra: Vec<String>,
    /// Connection counts, e.g. 16,64,256,1024: every closed-loop scenario (not mix-*,
    /// mem-tunnels-*) runs at each, in place of its default.
    #[arg(long, value_parser = sweep_levels)]
    pub sweep: Option<Levels>,
    /// Repetitions of every cell [default: 3; with --profile, each family's own, which
    /// this replaces].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub reps: Option<u32>,
    /// Measured time per run, e.g. 10s, 500ms [default: 10s; with --profile, each family's
    /// own, which this replaces].
    #[arg(long, value_parser = checked_duration)]
    pub duration: Option<String>,
    /// Proxy CPU quota in cores (cgroup cfs quota), e.g. 0.5.
    #[arg(long, value_parser = quota_cores)]
    pub quota: Option<f64>,
    /// Network namespaces joined by veths (auto), or loopback (off).
    #[arg(long, value_enum, default_value = "auto")]
    pub netns: NetnsMode,
    /// tc netem on the client link, e.g. 'delay 1ms loss 0.1%' (netns only).
    #[arg(long)]
    pub netem: Option<String>,
    /// Bandwidth of the client link, e.g. 100mbit (netns only).
    #[arg(long)]
    pub rate_limit: Option<String>,
    /// GSO/TSO/GRO on the veths: auto turns them off only with --netem or --rate-limit (as
    /// the reference campaign did for its emulated link); on leaves the kernel's defaults.
    #[arg(long, value_enum, default_value = "auto")]
    pub offload: Offload,
    /// Results directory (default bench/results/campaign-STAMP; with --profile full
    /// bench/data/YYYYMMDD, with --profile quick a temporary directory).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The rustle binary to measure (copied before the first run).
    #[arg(long, env = "RUSTLE_BIN", default_value = "target/release/rustle")]
    pub rustle_bin: PathBuf,
    /// Load generator seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetnsMode {
    Auto,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Offload {
    Auto,
    On,
    Off,
}

/// `--sweep` levels in the order given, duplicates dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Levels(pub Vec<u32>);

fn checked_duration(v: &str) -> Result<String> {
    crate::load::cli::duration(v)?;
    Ok(v.to_string())
}

fn quota_cores(v: &str) -> Result<f64> {
    let q: f64 = v.parse().context("a number of cores")?;
    if !(q > 0.0 && q <= 64.0) {
        bail!("a positive number of cores, at most 64");
    }
    Ok(q)
}

/// What one stage of a campaign runs: the whole of an ad hoc campaign, or
/// one family of a profile.
struct Stage {
    /// The family id (`stage` column); empty for an ad hoc campaign.
    family: String,
    scenario_list: String,
    scenarios: Vec<scenario::Scenario>,
    proxies: Vec<Proxy>,
    sweep: Vec<u32>,
    reps: u32,
    duration: String,
    quota: Option<f64>,
    netns: bool,
    netem: Option<String>,
    rate_limit: Option<String>,
    /// None: auto (off only with an emulated link).
    offload: Option<bool>,
}

impl Stage {
    /// The runs of this stage in order: repetition, scenario (and sweep
    /// level), proxy rotated by repetition.
    fn runs(&self) -> Vec<(u32, Option<u32>, scenario::Scenario, &Proxy, u32)> {
        let mut v = Vec::new();
        for rep in 1..=self.reps {
            for (connections, sc) in self.scenarios.iter().flat_map(|sc| levels(sc, &self.sweep)) {
                for i in 0..self.proxies.len() {
                    // Rotate: repetition r starts r-1 places further along.
                    let p = &self.proxies[(i + rep as usize - 1) % self.proxies.len()];
                    v.push((rep, connections, sc.clone(), p, i as u32 + 1));
                }
            }
        }
        v
    }

    /// Seconds one run of `sc` by `proxy` should take, 0 when it will be
    /// skipped (a protocol the proxy lacks, a peer not installed).
    fn estimate(&self, sc: &scenario::Scenario, proxy: &Proxy) -> f64 {
        if proxy.supports(sc.path).is_err() || proxy.installed().is_err() {
            return 0.0;
        }
        let d = crate::load::cli::duration(&self.duration).map_or(10.0, |d| d.as_secs_f64());
        scenario_seconds(sc, d)
    }
}

/// Seconds a run of `sc` measured for `d` seconds should take, start and
/// stop of the proxy included.
fn scenario_seconds(sc: &scenario::Scenario, d: f64) -> f64 {
    match sc.kind {
        scenario::Kind::Hold(n) => 10.0 + n.min(run::TUNNEL_CAP) as f64 / 1500.0,
        scenario::Kind::IdleMix(n) => d + 9.0 + n.min(run::TUNNEL_CAP) as f64 / 1500.0,
        scenario::Kind::Stream => d + 4.0,
        scenario::Kind::Rate => d + 2.5,
    }
}

fn build_stages(a: &Args, rustle_bin: &std::path::Path) -> Result<Vec<Stage>> {
    let offload = match a.offload {
        Offload::Auto => None,
        Offload::On => Some(true),
        Offload::Off => Some(false),
    };
    let proxies = |names: &[String]| -> Result<Vec<Proxy>> {
        let mut v = Vec::new();
        for n in names {
            v.push(Proxy::named(n, rustle_bin)?);
        }
        for spec in &a.extra {
            v.push(Proxy::extra(spec)?);
        }
        Ok(v)
    };
    let Some(name) = a.profile else {
        let scenarios = a.scenarios.clone().unwrap_or_else(|| "quick".into());
        let names = a
            .proxies
            .clone()
            .unwrap_or_else(|| peers::default_names().map(String::from).collect::<Vec<_>>());
        return Ok(vec![Stage {
            family: String::new(),
            scenarios: scenario::expand(&scenarios)?,
            scenario_list: scenarios,
            proxies: proxies(&names)?,
            sweep: a.sweep.clone().map(|l| l.0).unwrap_or_default(),
            reps: a.reps.unwrap_or(3),
            duration: a.duration.clone().unwrap_or_else(|| "10s".into()),
            quota: a.quota,
            netns: a.netns == NetnsMode::Auto,
            netem: a.netem.clone(),
            rate_limit: a.rate_limit.clone(),
            offload,
        }]);
    };
    for f in &a.family {
        if profile::family(f).is_none() {
            let ids: Vec<&str> = profile::FAMILIES.iter().map(|f| f.id).collect();
            bail!("--family: no family {f:?} (families: {})", ids.join(", "));
        }
    }
    let mut stages = Vec::new();
    for f in profile::FAMILIES {
        if !a.family.is_empty() && !a.family.iter().any(|x| x == f.id) {
            continue;
        }
        let Some(p) = f.plan(name) else { continue };
        let names: Vec<String> = p.proxies.split(',').map(String::from).collect();
        let slow = p.link == profile::Link::Slow;
        stages.push(Stage {
            family: f.id.to_string(),
            scenarios: scenario::expand(p.scenarios)?,
            scenario_list: p.scenarios.to_string(),
            proxies: proxies(&names)?,
            sweep: Vec::new(),
            reps: a.reps.unwrap_or(p.reps),
            duration: a.duration.clone().unwrap_or_else(|| p.duration.to_string()),
            quota: a.quota,
            netns: p.link != profile::Link::Loopback && a.netns == NetnsMode::Auto,
            netem: slow.then(|| profile::SLOW_NETEM.to_string()),
            rate_limit: slow.then(|| profile::SLOW_RATE.to_string()),
            offload,
        });
    }
    if stages.is_empty() {
        bail!("--family: none of these families is in the {name:?} profile");
    }
    Ok(stages)
}

/// `16,64,256`: positive connection counts, duplicates dropped, order kept.
fn sweep_levels(list: &str) -> Result<Levels> {
    let mut levels = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let n: u32 = item.parse().with_context(|| format!("--sweep: {item:?} is not a count"))?;
        if n == 0 {
            bail!("--sweep: connection counts must be at least 1");
        }
        if !levels.contains(&n) {
            levels.push(n);
        }
    }
    if levels.is_empty() {
        bail!("--sweep needs at least one connection count");
    }
    Ok(Levels(levels))
}

/// The runs of one scenario: one per `--sweep` level when it applies
/// (recorded in the row's `connections`), else the scenario as it is.
fn levels(sc: &scenario::Scenario, sweep: &[u32]) -> Vec<(Option<u32>, scenario::Scenario)> {
    if sweep.is_empty() || !sc.sweepable() {
        return vec![(sc.default_connections(), sc.clone())];
    }
    sweep.iter().map(|n| (Some(*n), sc.with_connections(*n))).collect()
}

/// Entry point for `rustle-bench campaign ARGS`.
/// Parses `args` (what follows `campaign`) and runs the campaign.
pub fn main(args: impl Iterator<Item = String>) -> Result<()> {
    use clap::Parser;
    match Standalone::try_parse_from(std::iter::once("campaign".into()).chain(args)) {
        Ok(s) => run(s.args),
        Err(e) if !e.use_stderr() => {
            print!("{e}");
            Ok(())
        }
        Err(e) => bail!("{}", e.render().to_string().trim_end()),
    }
}

// [`Args`] as a command of its own, for [`main`].
#[derive(clap::Parser)]
#[command(name = "campaign", bin_name = "rustle-bench campaign", about = ABOUT, long_about = LONG_ABOUT)]
struct Standalone {
    #[command(flatten)]
    args: Args,
}

/// Runs the campaign `a` describes.
pub fn run(a: Args) -> Result<()> {
    children::install_signal_handler()?;
    let result = campaign(&a);
    children::cleanup_all();
    result
}

fn campaign(a: &Args) -> Result<()> {
    let stamp = utc_stamp();
    let scratch = std::env::temp_dir().join(format!("rustle-campaign-{}", std::process::id()));
    // The proxy runs from a private copy: a rebuild during the campaign
    // must not change what is measured half-way.
    let rustle_bin = scratch.join("rustle");
    // A dry run plans with the binary as given; a campaign with its copy.
    let stages = build_stages(a, if a.dry_run { &a.rustle_bin } else { &rustle_bin })?;
    let wants_rustle = stages.iter().flat_map(|st| &st.proxies).any(|p| p.is_rustle());
    if wants_rustle && !a.rustle_bin.exists() {
        bail!(
            "no rustle binary at {} (cargo build --release -p rustle, or --rustle-bin)",
            a.rustle_bin.display()
        );
    }
    if !a.dry_run {
        // Registered: removed by the cleanup at the end or on SIGINT/SIGTERM.
        children::make_dir(&scratch, true)?;
        if a.rustle_bin.exists() {
            std::fs::copy(&a.rustle_bin, &rustle_bin).context("copying the rustle binary")?;
        }
    }
    let plan: Vec<(usize, f64)> = stages
        .iter()
        .enumerate()
        .flat_map(|(i, st)| st.runs().into_iter().map(move |r| (i, st.estimate(&r.2, r.3))))
        .collect();
    let total: f64 = plan.iter().map(|(_, s)| s).sum();
    if a.dry_run {
        for st in &stages {
            let secs: f64 = st.runs().iter().map(|r| st.estimate(&r.2, r.3)).sum();
            let names: Vec<&str> = st.proxies.iter().map(|p| p.name.as_str()).collect();
            println!(
                "{:<9} {:>4} runs {:>7}  {} x {}",
                if st.family.is_empty() { "campaign" } else { &st.family },
                st.runs().len(),
                hms(secs),
                st.scenario_list,
                names.join(",")
            );
        }
        println!("total: {} runs, about {}", plan.len(), hms(total));
        return Ok(());
    }
    let quick = a.profile == Some(profile::ProfileName::Quick);
    let full = a.profile == Some(profile::ProfileName::Full);
    let out = match (&a.out, quick, full) {
        (Some(d), _, _) => d.clone(),
        (None, true, _) => std::env::temp_dir().join(format!("rustle-campaign-quick-{stamp}")),
        (None, _, true) => {
            if !std::path::Path::new("bench/data").is_dir() {
                bail!(
                    "run the full profile from the repository's root (bench/data/ is not \
                     here), or give --out"
                );
            }
            // Some families rerun into the newest data set, not a new one
            // that would hold only them.
            let newest = crate::report::document::data_sets(std::path::Path::new("."))?.pop();
            match newest {
                Some(d) if !a.family.is_empty() => d,
                _ => PathBuf::from(format!("bench/data/{}", &stamp[..8])),
            }
        }
        (None, _, _) => PathBuf::from(format!("bench/results/campaign-{stamp}")),
    };
    // A profile's directory gathers its families: rerunning some replaces
    // their rows and keeps the others'.
    let csv = out.join("runs.csv");
    let mut kept = Vec::new();
    // The rows a rerun replaces: a family that fails before any run keeps them.
    let mut replaced = Vec::new();
    if a.profile.is_some() && csv.exists() {
        if a.family.is_empty() {
            bail!(
                "{} exists: give --family to rerun some families into it, or another --out",
                out.display()
            );
        }
        kept = record::read(&csv)?;
        let (again, keep): (Vec<_>, Vec<_>) =
            kept.into_iter().partition(|r| stages.iter().any(|st| st.family == r.stage));
        kept = keep;
        replaced = again;
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    if kept.is_empty() {
        write_conditions(a, &out, &stamp, &stages, &a.rustle_bin)?;
    } else {
        // A rerun of some families keeps the data set's conditions and says
        // when, and with which build, those families ran again.
        let mut f = std::fs::OpenOptions::new().append(true).open(out.join("conditions.txt"))?;
        writeln!(f, "rerun: {} at {stamp} (UTC), rustle {}", a.family.join(","), git_rev())?;
    }
    let mut writer = record::Writer::create(&csv)?;
    for r in &kept {
        writer.write(r)?;
    }
    let mut progress = Progress::new(total, plan.len());
    let mut rustle_ok = false;
    let mut failed = Vec::new();
    for st in &stages {
        // A family that cannot run (a fixture that will not start) is said
        // and the campaign goes on with the next: a long run stays unattended.
        progress.stage_done = 0;
        match run_stage(a, st, &stamp, &scratch, &out, &mut writer, &mut progress) {
            Ok(ok) => rustle_ok |= ok,
            Err(e) => {
                // Its runs will not happen: the time left no longer counts them.
                for r in st.runs().iter().skip(progress.stage_done) {
                    progress.total -= st.estimate(&r.2, r.3);
                    progress.runs -= 1;
                }
                let what = if st.family.is_empty() { "the campaign" } else { &st.family };
                progress.bar.suspend(|| eprintln!("campaign: {what} failed: {e:#}"));
                if progress.stage_done == 0 {
                    for r in replaced.iter().filter(|r| r.stage == st.family) {
                        writer.write(r)?;
                    }
                }
                failed.push(format!("{what}: {e:#}"));
            }
        }
    }
    progress.finish();
    if !failed.is_empty() {
        let mut f = std::fs::OpenOptions::new().append(true).open(out.join("conditions.txt"))?;
        for e in &failed {
            writeln!(f, "failed: {e}")?;
        }
    }
    eprintln!("campaign: results in {}", out.display());
    if quick {
        crate::report::document::write(&out, &out, None)?;
        if !rustle_ok {
            bail!("rustle's cells are missing or show errors (see {})", out.display());
        }
    } else if full && a.family.is_empty() && !a.no_documents {
        // The documents are those of the newest data set under ./bench/data:
        // regenerated only when that is the one just written.
        let newest = crate::report::document::data_sets(std::path::Path::new("."))
            .ok()
            .and_then(|mut v| v.pop());
        let same = |p: &std::path::Path| std::fs::canonicalize(p).ok();
        if newest.as_deref().and_then(same).is_some_and(|n| Some(n) == same(&out)) {
            let written = crate::report::document::write_documents(std::path::Path::new("."))?;
            for f in written {
                eprintln!("campaign: wrote {}", f.display());
            }
        } else {
            eprintln!(
                "campaign: {} is not the newest data set in ./bench/data: documents left as \
                 they are",
                out.display()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    if !failed.is_empty() {
        bail!("{} failed: {}", failed.len(), failed.join("; "));
    }
    Ok(())
}

/// The short commit of the working tree, marked when it has changes.
fn git_rev() -> String {
    let cmd = |a: &[&str]| {
        std::process::Command::new("git")
            .args(a)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    // Only what the binaries and the peers' configurations are made of:
    // data sets and documents in the working tree change no measurement.
    let paths = ["crates", "Cargo.toml", "Cargo.lock", "bench/peers"];
    let mut status = vec!["status", "--porcelain", "--untracked-files=no", "--"];
    status.extend(paths);
    let dirty = !cmd(&status).is_empty();
    let rev = cmd(&["rev-parse", "--short", "HEAD"]);
    if dirty {
        format!("{rev} (with uncommitted changes)")
    } else {
        rev
    }
}

/// `1h02m`, `4m05s`, `12s`.
fn hms(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

/// The bar on standard error (when it is a terminal) and a line per run:
/// runs done, and the time left, the plan's estimate scaled by how long the
/// runs so far took against theirs.
struct Progress {
    bar: indicatif::ProgressBar,
    total: f64,
    done_estimate: f64,
    runs: usize,
    done_runs: usize,
    /// Runs done in the stage under way.
    stage_done: usize,
    start: std::time::Instant,
}

impl Progress {
    fn new(total: f64, runs: usize) -> Progress {
        let bar = indicatif::ProgressBar::new((total.max(1.0) * 1000.0) as u64);
        let style = indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:32}] {percent:>3}% {msg}",
        )
        .map(|s| s.progress_chars("=> "));
        if let Ok(s) = style {
            bar.set_style(s);
        }
        bar.enable_steady_tick(Duration::from_millis(500));
        Progress {
            bar,
            total,
            done_estimate: 0.0,
            runs,
            done_runs: 0,
            stage_done: 0,
            start: std::time::Instant::now(),
        }
    }

    /// The time left, from the estimate of what is left and how the runs
    /// so far compared with their estimate.
    fn left(&self) -> f64 {
        let elapsed = self.start.elapsed().as_secs_f64();
        let scale = if self.done_estimate > 30.0 { elapsed / self.done_estimate } else { 1.0 };
        (self.total - self.done_estimate) * scale
    }

    fn starting(&self, what: &str) {
        self.bar.set_message(format!(
            "run {}/{} · {} left · {what}",
            self.done_runs + 1,
            self.runs,
            hms(self.left())
        ));
    }

    fn done(&mut self, estimate: f64, line: &str) {
        self.done_estimate += estimate;
        self.done_runs += 1;
        self.stage_done += 1;
        self.bar.set_position((self.done_estimate * 1000.0) as u64);
        let line = format!("[{}/{} · {} left] {line}", self.done_runs, self.runs, hms(self.left()));
        self.bar.suspend(|| eprintln!("{line}"));
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Runs one stage into `writer`; true when rustle had a clean cell.
fn run_stage(
    a: &Args,
    st: &Stage,
    stamp: &str,
    scratch: &std::path::Path,
    out: &std::path::Path,
    writer: &mut record::Writer,
    progress: &mut Progress,
) -> Result<bool> {
    let mut notes = Vec::new();
    if !st.sweep.is_empty() {
        let fixed: Vec<&str> =
            st.scenarios.iter().filter(|s| !s.sweepable()).map(|s| s.name.as_str()).collect();
        if !fixed.is_empty() {
            notes.push(format!("not swept (fixed load of their own): {}", fixed.join(", ")));
        }
    }
    let net = if st.netns {
        let shaped = st.netem.is_some() || st.rate_limit.is_some();
        let offload = st.offload.unwrap_or(!shaped);
        match Net::create(st.netem.as_deref(), st.rate_limit.as_deref(), offload) {
            Ok(n) => n,
            Err(e) => {
                notes.push(format!("network namespaces unavailable ({e:#}): loopback used"));
                Net::loopback()
            }
        }
    } else {
        if st.netem.is_some() || st.rate_limit.is_some() {
            notes.push("--netem/--rate-limit ignored on loopback".into());
        }
        Net::loopback()
    };
    notes.extend(net.notes.iter().cloned());
    let quota = match st.quota.map(sys::Quota::create).transpose() {
        Ok(q) => q,
        Err(e) => bail!("cannot make the quota cgroup: {e:#}"),
    };
    if let Some(q) = &quota {
        children::register_cgroup(&q.dir);
    }

    let exe = std::env::current_exe().context("finding this executable")?;
    let origin_port = if net.is_netns() { 8080 } else { run::free_port().unwrap_or(18081) };
    let origin_addr = format!("{}:{origin_port}", net.ip(Role::Origin));
    let mut cmd = net.command(Role::Origin, "1", &exe.display().to_string());
    cmd.args(["origin", "--listen", &origin_addr]);
    let mut origin = Proc::spawn("origin", cmd, Some(scratch))?;
    origin.wait_listening(origin_port, Duration::from_secs(10))?;
    // The UDP scenarios' origin: a datagram echo next to the HTTP origin.
    let udp_port = if net.is_netns() { 8081 } else { run::free_udp_port().unwrap_or(18082) };
    let udp_addr = format!("{}:{udp_port}", net.ip(Role::Origin));
    let mut cmd = net.command(Role::Origin, "1", &exe.display().to_string());
    cmd.args(["udp-echo", "--listen", &udp_addr]);
    let mut udp_origin = Proc::spawn("udp-origin", cmd, Some(scratch))?;
    udp_origin.wait_ready(udp_port, true, Duration::from_secs(10))?;

    // The TLS scenarios: the proxy's certificate and an HTTPS origin next
    // to the plain one, its CA written for the proxies to verify it with.
    let (mut tls_files, mut tls_origin, mut origin_stats, mut https_origin) =
        (None, None, None, None);
    if st.scenarios.iter().any(|s| s.path.is_tls()) {
        let dir = scratch.join(format!("tls-{}", st.family));
        let _ = std::fs::remove_dir_all(&dir);
        let files = make_certificates(&scratch.join("rustle"), &dir)?;
        let port = if net.is_netns() { 8443 } else { run::free_port().unwrap_or(18443) };
        let addr = format!("{}:{port}", net.ip(Role::Origin));
        let stats = scratch.join("origin-tls.stats");
        let mut cmd = net.command(Role::Origin, "1", &exe.display().to_string());
        cmd.args(["origin", "--tls", "--listen", &addr, "--tickets", "--kx", "x25519"]);
        cmd.arg("--ca-out").arg(&files.origin_ca).arg("--stats").arg(&stats);
        let mut p = Proc::spawn("https-origin", cmd, Some(scratch))?;
        p.wait_listening(port, Duration::from_secs(10))?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !(files.origin_ca.exists() && stats.exists()) {
            if std::time::Instant::now() > deadline {
                bail!("the HTTPS origin wrote no CA or stats file: {}", p.stderr_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        notes.push(format!(
            "TLS: TLS 1.3, ECDSA P-256 certificates (rustle cert --self-signed), X25519 key \
             exchange (the client and the HTTPS origin offer nothing else); the client verifies \
             {} against the proxy's CA; the proxies verify the HTTPS origin ({addr}, \
             rustle-bench on rustls, stateless session tickets) as {} against its CA; \
             tls-term-close offers no resumption (a full handshake per request)",
            files.name, files.origin_name
        ));
        (tls_files, tls_origin, origin_stats, https_origin) =
            (Some(files), Some(addr), Some(stats), Some(p));
    }
    write_stage_conditions(st, out, &net, &notes)?;

    let mut bench = run::Bench {
        net,
        quota_cores: quota.as_ref().and(st.quota),
        quota,
        exe: exe.clone(),
        scratch: scratch.to_path_buf(),
        origin: origin_addr,
        udp_origin: udp_addr,
        tls_origin,
        origin_stats,
        tls: tls_files,
        duration: st.duration.clone(),
        seed: a.seed,
        runs: 0,
    };
    let mut rustle_ok = false;
    for (rep, connections, sc, p, order) in st.runs() {
        let estimate = st.estimate(&sc, p);
        progress.starting(&format!("{} {} / {}", st.family, sc.name, p.name));
        let mut row = Row::new(stamp, &sc.name, &p.name, rep, order);
        row.connections = connections;
        row.stage = st.family.clone();
        let row = bench.run(row, &sc, p);
        progress.done(estimate, &describe(&row));
        if p.name == "rustle"
            && row.status == Status::Ok
            && row.errors_total == Some(0)
            && row.completed.unwrap_or(0) > 0
        {
            rustle_ok = true;
        }
        writer.write(&row)?;
        if !origin.alive() {
            bail!("the origin died: {}", origin.stderr_tail());
        }
        if !udp_origin.alive() {
            bail!("the UDP origin died: {}", udp_origin.stderr_tail());
        }
        if let Some(h) = https_origin.as_mut() {
            if !h.alive() {
                bail!("the HTTPS origin died: {}", h.stderr_tail());
            }
        }
    }
    origin.stop();
    udp_origin.stop();
    if let Some(h) = https_origin {
        h.stop();
    }
    if let Some(q) = &bench.quota {
        // Empty now that every proxy is stopped.
        let _ = q.remove();
        children::forget_cgroup(&q.dir);
    }
    Ok(rustle_ok)
}

/// The name in the proxy's certificate, which the client verifies.
const PROXY_NAME: &str = "proxy.rustle-bench.test";

/// `rustle cert --self-signed` into `dir` (ECDSA P-256): the proxy's chain,
/// key and CA, and chain + key in one file for haproxy. The HTTPS origin's
/// CA is written into `dir` by the origin itself; its certificate names
/// `localhost`.
fn make_certificates(rustle: &std::path::Path, dir: &std::path::Path) -> Result<peers::TlsFiles> {
    if !rustle.exists() {
        bail!("the TLS scenarios need the rustle binary (rustle cert --self-signed)");
    }
    let out = std::process::Command::new(rustle)
        .args(["cert", "--self-signed", PROXY_NAME, "--out"])
        .arg(dir)
        .output()
        .context("running rustle cert")?;
    if !out.status.success() {
        bail!("rustle cert failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let files = peers::TlsFiles {
        chain: dir.join(format!("{PROXY_NAME}.pem")),
        key: dir.join(format!("{PROXY_NAME}.key")),
        combined: dir.join("combined.pem"),
        ca: dir.join("ca.pem"),
        name: PROXY_NAME.to_string(),
        origin_ca: dir.join("origin-ca.pem"),
        origin_name: "localhost".to_string(),
    };
    let combined = std::fs::read_to_string(&files.chain)? + &std::fs::read_to_string(&files.key)?;
    std::fs::write(&files.combined, combined).context("writing combined.pem")?;
    Ok(files)
}

fn describe(r: &Row) -> String {
    let what = match r.status {
        Status::Ok => format!(
            "{:.1} {} errors {} pace {:?}",
            r.throughput.unwrap_or(0.0),
            r.unit,
            r.errors_total.unwrap_or(0),
            r.pace
        ),
        _ => format!("{:?}: {}", r.status, r.reason),
    };
    let conns = r.connections.map_or(String::new(), |n| format!(" ({n} conns)"));
    format!("rep {} {}{conns} {}: {what}", r.rep, r.scenario, r.proxy)
}

/// conditions.txt: what every stage shares (machine, build, peers' versions).
fn write_conditions(
    a: &Args,
    out: &std::path::Path,
    stamp: &str,
    stages: &[Stage],
    rustle: &std::path::Path,
) -> Result<()> {
    let cmd = |p: &str, a: &[&str]| {
        std::process::Command::new(p)
            .args(a)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo.lines().find(|l| l.starts_with("model name")).unwrap_or("").to_string();
    let mut text = String::new();
    let mut line = |l: String| {
        text.push_str(&l);
        text.push('\n');
    };
    line(format!("campaign: {stamp} (UTC)"));
    if let Some(p) = a.profile {
        let name = if p == profile::ProfileName::Full { "full" } else { "quick" };
        line(format!("profile: {name}"));
    }
    line(format!("cpu: {} x {}", model.split(':').nth(1).unwrap_or("?").trim(), num_cpus()));
    line(format!("memory: {}", sys::mem_total()));
    line(format!("kernel: {}", cmd("uname", &["-sr"])));
    line(format!("rustle: {}, binary {}", git_rev(), rustle.display()));
    let mut seen: Vec<&str> = Vec::new();
    for p in stages.iter().flat_map(|s| &s.proxies) {
        if p.name == "floor" && !seen.contains(&"floor") {
            seen.push("floor");
            line("floor: rustle-bench floor, this campaign's own binary".to_string());
        }
        if let Some(pkg) = p.package() {
            if !seen.contains(&pkg) {
                seen.push(pkg);
                line(format!("{pkg}: {}", sys::package_version(pkg)));
            }
        }
    }
    if stages.iter().any(|st| st.scenarios.iter().any(|s| s.path.is_tls())) {
        for pkg in ["libnginx-mod-stream", "libssl3", "libssl3t64"] {
            let v = sys::package_version(pkg);
            if !v.is_empty() && v != "?" {
                line(format!("{pkg}: {v}"));
            }
        }
    }
    line(
        "cpus: proxy on CPU 0 (the two-worker variants on CPUs 0 and 1), client, origin and \
         helpers (the callback server) on CPU 1 (taskset)"
            .to_string(),
    );
    line(format!("seed: {}", a.seed));
    std::fs::write(out.join("conditions.txt"), text).context("writing conditions.txt")
}

/// What one stage ran and over which network: appended to conditions.txt
/// for an ad hoc campaign, conditions-FAMILY.txt for a profile's family.
fn write_stage_conditions(
    st: &Stage,
    out: &std::path::Path,
    net: &Net,
    notes: &[String],
) -> Result<()> {
    let mut f = if st.family.is_empty() {
        std::fs::OpenOptions::new().append(true).open(out.join("conditions.txt"))?
    } else {
        std::fs::File::create(out.join(format!("conditions-{}.txt", st.family)))?
    };
    let link = if net.link.is_empty() {
        String::new()
    } else {
        format!(", client link netem {}", net.link)
    };
    writeln!(f, "network: {}{link}", net.kind())?;
    let q = st.quota.map_or("none".to_string(), |q| format!("{q} core (cfs quota) on the proxy"));
    writeln!(f, "quota: {q}")?;
    writeln!(f, "reps: {}, duration: {}", st.reps, st.duration)?;
    writeln!(f, "scenarios: {}", st.scenario_list)?;
    let names: Vec<&str> = st.proxies.iter().map(|p| p.name.as_str()).collect();
    writeln!(f, "proxies: {}", names.join(","))?;
    if !st.sweep.is_empty() {
        let levels: Vec<String> = st.sweep.iter().map(u32::to_string).collect();
        writeln!(f, "sweep: {} connections", levels.join(", "))?;
    }
    for n in notes {
        writeln!(f, "note: {n}")?;
    }
    Ok(())
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map(usize::from).unwrap_or(1)
}

/// `YYYYmmdd-HHMMSS` in UTC from the system clock, without a date crate.
fn utc_stamp() -> String {
    let secs = crate::date::now_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = crate::date::civil(days);
    format!("{y:04}{m:02}{d:02}-{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse(s: &str) -> Result<Args> {
        use clap::Parser;
        let argv = std::iter::once("campaign").chain(s.split_whitespace());
        Ok(Standalone::try_parse_from(argv)?.args)
    }

    #[test]
    fn sweep_option_and_levels() {
        let o = parse("--sweep 16,64,256,1024,64 --scenarios http-close-1k").unwrap();
        assert_eq!(o.sweep.unwrap().0, [16, 64, 256, 1024]);
        assert!(parse("--sweep 16,0").is_err());
        assert!(parse("--sweep x").is_err());
        assert!(parse("--sweep ,").is_err());
        assert!(parse("--reps 0").is_err() && parse("--quota -1").is_err());
        assert!(parse("--profile full --scenarios http-ka-1k").is_err());
        assert!(parse("--family http").is_err(), "--family needs --profile");
        let close = scenario::parse("http-close-1k").unwrap();
        let runs = levels(&close, &[16, 1024]);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[1].0, Some(1024));
        assert_eq!(runs[1].1.default_connections(), Some(1024));
        let mix = scenario::parse("mix-http").unwrap();
        assert_eq!(levels(&mix, &[16, 1024]), vec![(Some(2000), mix.clone())]);
        assert_eq!(levels(&close, &[]), vec![(Some(64), close.clone())]);
    }
}
