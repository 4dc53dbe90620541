//! `rustle-bench campaign`: every scenario × proxy × repetition, each proxy
//! started fresh, the order of the proxies rotated between repetitions,
//! one CSV row per run plus a conditions file (see bench/README.md).
//!
//! Roles: the client (this binary's `load`) and the origin (`origin`) on
//! CPU 1, the proxy on CPU 0, with an optional CPU quota so that the proxy
//! sets the pace; on loopback or in network namespaces of our own.
//!
//! Submodules: `scenario` (names → load), `peers` (proxies and their
//! configurations), `run` (one cell), `net` (namespaces), `children`
//! (processes and cleanup on signals), `sys` (/proc and cgroups),
//! [`record`] (the CSV row, shared with the report).

mod children;
mod net;
mod peers;
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

pub const USAGE: &str = "\
usage: rustle-bench campaign [options]
  --scenarios LIST     comma-separated names or groups (quick, mix, mix-3k, stream1-down,
                       stream16, stream16-up, udp, tls, mem-tunnels-N, all); default quick
  --proxies LIST       rustle,nginx,haproxy,haproxy-splice,squid,tinyproxy,dante,microsocks,
                       stunnel, floor (default: all but floor, the bare forwarder)
  --extra-proxy SPEC   NAME[:http,connect,socks,relay,ws,udp-socks,udp-relay,tls-term,tls-orig]=
                       'command {listen} {target}' (repeatable; {target} is the UDP echo for
                       udp-relay, the HTTPS origin for tls-orig; TLS: {cert} {key} {combined}
                       {origin_ca} {origin_name})
  --sweep LIST         connection counts, e.g. 16,64,256,1024: every closed-loop scenario
                       (not mix-*, mem-tunnels-*) runs at each, in place of its default
  --reps N             repetitions (default 3)
  --duration D         measured time per run (default 10s)
  --quota F            proxy CPU quota in cores (cgroup cfs quota), e.g. 0.5
  --netns auto|off     namespaces joined by veths, or loopback (default auto)
  --netem 'ARGS'       tc netem on the client link, e.g. 'delay 1ms loss 0.1%' (netns only)
  --rate-limit RATE    bandwidth of the client link, e.g. 100mbit (netns only)
  --offload auto|on|off  GSO/TSO/GRO on the veths: auto (default) turns them off only with
                       --netem or --rate-limit, as the reference campaign did for its
                       emulated link; on leaves the kernel's defaults; off always
  --out DIR            results directory (default bench/results/campaign-STAMP)
  --rustle-bin PATH    default $RUSTLE_BIN, else target/release/rustle
  --seed N             load generator seed (default 0)
  --smoke              http-ka-1k, 2 s, 1 rep, rustle, nginx and floor, loopback, into a temp dir;
                       fails unless rustle's cell ran without errors";

struct Options {
    scenarios: String,
    proxies: Vec<String>,
    extra: Vec<String>,
    /// `--sweep` levels in the order given; empty: each scenario's default.
    sweep: Vec<u32>,
    reps: u32,
    duration: String,
    quota: Option<f64>,
    netns: bool,
    netem: Option<String>,
    rate_limit: Option<String>,
    /// None: auto (off only with an emulated link).
    offload: Option<bool>,
    out: Option<PathBuf>,
    rustle_bin: Option<PathBuf>,
    seed: u64,
    smoke: bool,
}

fn parse(args: impl Iterator<Item = String>) -> Result<Option<Options>> {
    let mut o = Options {
        scenarios: "quick".into(),
        proxies: peers::KNOWN.iter().filter(|s| **s != "floor").map(|s| s.to_string()).collect(),
        extra: Vec::new(),
        sweep: Vec::new(),
        reps: 3,
        duration: "10s".into(),
        quota: None,
        netns: true,
        netem: None,
        rate_limit: None,
        offload: None,
        out: None,
        rustle_bin: std::env::var_os("RUSTLE_BIN").map(PathBuf::from),
        seed: 0,
        smoke: false,
    };
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--scenarios" => o.scenarios = value()?,
            "--proxies" => o.proxies = value()?.split(',').map(String::from).collect(),
            "--extra-proxy" => o.extra.push(value()?),
            "--sweep" => o.sweep = sweep_levels(&value()?)?,
            "--reps" => o.reps = value()?.parse().context("--reps")?,
            "--duration" => {
                let v = value()?;
                crate::load::cli::duration(&v)?;
                o.duration = v;
            }
            "--quota" => o.quota = Some(value()?.parse().context("--quota")?),
            "--netns" => {
                o.netns = match value()?.as_str() {
                    "auto" => true,
                    "off" => false,
                    v => bail!("--netns auto|off, not {v:?}"),
                }
            }
            "--netem" => o.netem = Some(value()?),
            "--rate-limit" => o.rate_limit = Some(value()?),
            "--offload" => {
                o.offload = match value()?.as_str() {
                    "auto" => None,
                    "on" => Some(true),
                    "off" => Some(false),
                    v => bail!("--offload auto|on|off, not {v:?}"),
                }
            }
            "--out" => o.out = Some(value()?.into()),
            "--rustle-bin" => o.rustle_bin = Some(value()?.into()),
            "--seed" => o.seed = value()?.parse().context("--seed")?,
            "--smoke" => o.smoke = true,
            "-h" | "--help" => return Ok(None),
            other => bail!("unknown argument {other:?}"),
        }
    }
    if o.smoke {
        o.scenarios = "http-ka-1k".into();
        o.proxies = vec!["rustle".into(), "nginx".into(), "floor".into()];
        (o.reps, o.duration, o.quota, o.netns) = (1, "2s".into(), None, false);
    }
    if o.reps == 0 || o.quota.is_some_and(|q| !(q > 0.0 && q <= 64.0)) {
        bail!("--reps must be at least 1 and --quota a positive number of cores");
    }
    Ok(Some(o))
}

/// `16,64,256`: positive connection counts, duplicates dropped, order kept.
fn sweep_levels(list: &str) -> Result<Vec<u32>> {
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
    Ok(levels)
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
pub fn main(args: impl Iterator<Item = String>) -> Result<()> {
    let Some(o) = parse(args).map_err(|e| anyhow::anyhow!("{e:#}\n{USAGE}"))? else {
        println!("{USAGE}");
        return Ok(());
    };
    children::install_signal_handler()?;
    let result = campaign(&o);
    children::cleanup_all();
    result
}

fn campaign(o: &Options) -> Result<()> {
    let stamp = utc_stamp();
    let scenarios = scenario::expand(&o.scenarios)?;
    let scratch = std::env::temp_dir().join(format!("rustle-campaign-{}", std::process::id()));
    // Registered: removed by the cleanup at the end or on SIGINT/SIGTERM.
    children::make_dir(&scratch, true)?;
    let out = match (&o.out, o.smoke) {
        (Some(d), _) => d.clone(),
        (None, true) => std::env::temp_dir().join(format!("rustle-campaign-smoke-{stamp}")),
        (None, false) => PathBuf::from(format!("bench/results/campaign-{stamp}")),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;

    // The proxy runs from a private copy: a rebuild during the campaign
    // must not change what is measured half-way.
    let rustle_src = o.rustle_bin.clone().unwrap_or_else(|| "target/release/rustle".into());
    let rustle_bin = scratch.join("rustle");
    if rustle_src.exists() {
        std::fs::copy(&rustle_src, &rustle_bin).context("copying the rustle binary")?;
    }
    let mut proxies = Vec::new();
    for name in &o.proxies {
        proxies.push(Proxy::named(name, &rustle_bin)?);
    }
    for spec in &o.extra {
        proxies.push(Proxy::extra(spec)?);
    }

    let mut notes = Vec::new();
    if !o.sweep.is_empty() {
        let fixed: Vec<&str> =
            scenarios.iter().filter(|s| !s.sweepable()).map(|s| s.name.as_str()).collect();
        if !fixed.is_empty() {
            notes.push(format!("not swept (fixed load of their own): {}", fixed.join(", ")));
        }
    }
    let net = if o.netns {
        let shaped = o.netem.is_some() || o.rate_limit.is_some();
        let offload = o.offload.unwrap_or(!shaped);
        match Net::create(o.netem.as_deref(), o.rate_limit.as_deref(), offload) {
            Ok(n) => n,
            Err(e) => {
                notes.push(format!("network namespaces unavailable ({e:#}): loopback used"));
                Net::loopback()
            }
        }
    } else {
        if o.netem.is_some() || o.rate_limit.is_some() {
            notes.push("--netem/--rate-limit ignored on loopback".into());
        }
        Net::loopback()
    };
    notes.extend(net.notes.iter().cloned());
    let quota = match o.quota.map(sys::Quota::create).transpose() {
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
    let mut origin = Proc::spawn("origin", cmd, Some(&scratch))?;
    origin.wait_listening(origin_port, Duration::from_secs(10))?;
    // The UDP scenarios' origin: a datagram echo next to the HTTP origin.
    let udp_port = if net.is_netns() { 8081 } else { run::free_udp_port().unwrap_or(18082) };
    let udp_addr = format!("{}:{udp_port}", net.ip(Role::Origin));
    let mut cmd = net.command(Role::Origin, "1", &exe.display().to_string());
    cmd.args(["udp-echo", "--listen", &udp_addr]);
    let mut udp_origin = Proc::spawn("udp-origin", cmd, Some(&scratch))?;
    udp_origin.wait_ready(udp_port, true, Duration::from_secs(10))?;

    // The TLS scenarios: the proxy's certificate and an HTTPS origin next
    // to the plain one, its CA written for the proxies to verify it with.
    let (mut tls_files, mut tls_origin, mut origin_stats, mut https_origin) =
        (None, None, None, None);
    if scenarios.iter().any(|s| s.path.is_tls()) {
        let files = make_certificates(&rustle_bin, &scratch.join("tls"))?;
        let port = if net.is_netns() { 8443 } else { run::free_port().unwrap_or(18443) };
        let addr = format!("{}:{port}", net.ip(Role::Origin));
        let stats = scratch.join("origin-tls.stats");
        let mut cmd = net.command(Role::Origin, "1", &exe.display().to_string());
        cmd.args(["origin", "--tls", "--listen", &addr, "--tickets", "--kx", "x25519"]);
        cmd.arg("--ca-out").arg(&files.origin_ca).arg("--stats").arg(&stats);
        let mut p = Proc::spawn("https-origin", cmd, Some(&scratch))?;
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

    write_conditions(o, &out, &stamp, &net, &proxies, &rustle_src, &notes)?;
    let mut writer = record::Writer::create(&out.join("runs.csv"))?;
    let mut bench = run::Bench {
        net,
        quota_cores: quota.as_ref().and(o.quota),
        quota,
        exe: exe.clone(),
        scratch: scratch.clone(),
        origin: origin_addr,
        udp_origin: udp_addr,
        tls_origin,
        origin_stats,
        tls: tls_files,
        duration: o.duration.clone(),
        seed: o.seed,
        runs: 0,
    };
    let mut rustle_ok = false;
    for rep in 1..=o.reps {
        for (connections, sc) in scenarios.iter().flat_map(|sc| levels(sc, &o.sweep)) {
            for i in 0..proxies.len() {
                // Rotate: repetition r starts r-1 places further along.
                let p = &proxies[(i + rep as usize - 1) % proxies.len()];
                let mut row = Row::new(&stamp, &sc.name, &p.name, rep, i as u32 + 1);
                row.connections = connections;
                let row = bench.run(row, &sc, p);
                eprintln!("{}", progress(&row));
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
    drop(bench);
    eprintln!("campaign: results in {}", out.display());
    if o.smoke {
        crate::report::write(&out, &out.join("BENCHMARKS.md"), Some(&out.join("svg")))?;
        if !rustle_ok {
            bail!("smoke: rustle's cell is missing or shows errors (see {})", out.display());
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
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

fn progress(r: &Row) -> String {
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
    format!("campaign: rep {} {}{conns} {}: {what}", r.rep, r.scenario, r.proxy)
}

fn write_conditions(
    o: &Options,
    out: &std::path::Path,
    stamp: &str,
    net: &Net,
    proxies: &[Proxy],
    rustle: &std::path::Path,
    notes: &[String],
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
    let mut f = std::fs::File::create(out.join("conditions.txt"))?;
    let rev = cmd("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = if cmd("git", &["status", "--porcelain", "--untracked-files=no"]).is_empty() {
        ""
    } else {
        " (with uncommitted changes)"
    };
    writeln!(f, "campaign: {stamp} (UTC)")?;
    writeln!(f, "cpu: {} x {}", model.split(':').nth(1).unwrap_or("?").trim(), num_cpus())?;
    writeln!(f, "kernel: {}", cmd("uname", &["-sr"]))?;
    writeln!(f, "rustle: {rev}{dirty}, binary {}", rustle.display())?;
    if proxies.iter().any(|p| p.name == "floor") {
        let exe = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default();
        writeln!(f, "floor: rustle-bench floor, this campaign's own binary {exe}")?;
    }
    for p in proxies {
        if let Some(pkg) = p.package() {
            writeln!(f, "{}: {} {}", p.name, pkg, sys::package_version(pkg))?;
        }
    }
    if scenario::expand(&o.scenarios).is_ok_and(|v| v.iter().any(|s| s.path.is_tls())) {
        for pkg in ["libnginx-mod-stream", "libssl3"] {
            writeln!(f, "{pkg}: {}", sys::package_version(pkg))?;
        }
    }
    writeln!(
        f,
        "network: {}{}",
        net.kind(),
        if net.link.is_empty() {
            String::new()
        } else {
            format!(", client link netem {}", net.link)
        }
    )?;
    let q = o.quota.map_or("none".to_string(), |q| format!("{q} core (cfs quota) on the proxy"));
    writeln!(f, "quota: {q}")?;
    writeln!(f, "cpus: proxy on CPU 0, client and origin on CPU 1 (taskset)")?;
    writeln!(f, "reps: {}, duration: {}, seed: {}", o.reps, o.duration, o.seed)?;
    writeln!(f, "scenarios: {}", o.scenarios)?;
    if !o.sweep.is_empty() {
        let levels: Vec<String> = o.sweep.iter().map(u32::to_string).collect();
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

    fn args(s: &str) -> impl Iterator<Item = String> {
        s.split_whitespace().map(String::from).collect::<Vec<_>>().into_iter()
    }

    #[test]
    fn sweep_option_and_levels() {
        let o = parse(args("--sweep 16,64,256,1024,64 --scenarios http-close-1k")).unwrap();
        assert_eq!(o.unwrap().sweep, [16, 64, 256, 1024]);
        assert!(parse(args("--sweep 16,0")).is_err());
        assert!(parse(args("--sweep x")).is_err());
        assert!(parse(args("--sweep ,")).is_err());
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
