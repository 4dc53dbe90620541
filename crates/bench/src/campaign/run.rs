//! One cell of the campaign: start the proxy fresh, drive the load through
//! it, read what it cost, stop it, and fill in a [`Row`].

use std::io::{BufRead, BufReader, Read};
use std::path::{Path as FsPath, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::children::Proc;
use super::net::{Net, Role};
use super::peers::{Proxy, Site, TlsFiles};
use super::record::{Row, Status};
use super::scenario::{Kind, Path, Scenario};
use super::sys::{self, Quota};
use crate::report::stats::pace_setter;

mod scrape;

/// The file limit is 20,000 per process here and a proxy holds two sockets
/// per tunnel (plus a few of its own), so this many tunnels fit.
pub(super) const TUNNEL_CAP: u64 = 9_900;

/// The load generator's default warmup; the measuring window starts after it.
const WARMUP: Duration = Duration::from_secs(1);

/// How long `--hold` keeps the tunnels open; memory is read in it, `SETTLE` after the
/// last tunnel opened.
const HOLD_FOR: &str = "6s";

/// Idle time before the memory of held tunnels is read: long enough for a proxy that
/// frees idle buffers on a timer (rustle trims its pool every second, of what the last
/// second did not use) to have done so, so that the figure is what idle tunnels keep,
/// not what their setup burst left spare.
const SETTLE: Duration = Duration::from_millis(2500);

/// The idle mixes' pause between the tunnels being held and the open loop
/// (`load --settle`): `SETTLE`, then half a second to read the memory in
/// before any exchange of the open loop.
const IDLE_SETTLE: Duration = Duration::from_millis(3000);

/// The client's CPU on this 2-CPU machine; the proxy's is CPU 0
/// ([`Proxy::cpus`]).
const CLIENT_CPU: &str = "1";

/// What every run shares.
pub(super) struct Bench {
    pub net: Net,
    pub quota: Option<Quota>,
    pub quota_cores: Option<f64>,
    /// This executable, run as the client (`load`).
    pub exe: PathBuf,
    pub scratch: PathBuf,
    pub origin: String,
    /// The UDP echo (`udp-echo`), for the UDP scenarios.
    pub udp_origin: String,
    /// The HTTPS origin (`IP:PORT`) and the file its counters are written
    /// to, and the certificates: only when TLS scenarios are run.
    pub tls_origin: Option<String>,
    pub origin_stats: Option<PathBuf>,
    pub tls: Option<TlsFiles>,
    pub duration: String,
    pub seed: u64,
    pub runs: u32,
}

impl Bench {
    /// Runs one scenario × proxy × repetition.
    pub(super) fn run(&mut self, mut row: Row, sc: &Scenario, proxy: &Proxy) -> Row {
        row.unit = sc.unit().to_string();
        row.net = self.net.kind().to_string();
        row.link = self.net.link.clone();
        row.quota = self.quota_cores;
        if let Err(r) = proxy.supports(sc.path).and_then(|_| proxy.installed()) {
            return row.skipped(r);
        }
        self.runs += 1;
        let dir = self.scratch.join(format!("run-{}", self.runs));
        // World-writable: tinyproxy, squid and nginx workers drop to
        // unprivileged users and still write their pid or log files here.
        use std::os::unix::fs::PermissionsExt;
        // Through the registry: once an interrupt's cleanup has removed the
        // scratch directory, it is not made again.
        let made = super::children::make_dir(&dir, false).and_then(|_| {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
                .context("scratch dir permissions")
        });
        if let Err(e) = made {
            return row.skipped(format!("scratch dir: {e:#}"));
        }
        let mut p = match self.start_proxy(sc, proxy, &dir) {
            Ok(p) => p,
            Err(e) => return row.skipped(short(&format!("start failed: {e:#}"))),
        };
        let res = self.measure(&mut row, sc, proxy, &mut p);
        row.rss_peak_kb = Some(sys::status_kb(p.proc.pid(), "VmHWM:"));
        p.proc.stop();
        p.helpers.into_iter().for_each(Proc::stop);
        let _ = std::fs::remove_dir_all(&dir);
        if let Err(e) = res {
            row.status = Status::Failed;
            row.reason = short(&format!("{e:#}"));
        }
        row
    }

    fn proxy_port(&self) -> u16 {
        if self.net.is_netns() {
            // Alone in its namespace: any fixed port is free.
            3128
        } else {
            free_port().unwrap_or(3128)
        }
    }

    /// The origin a scenario's proxy relays to: the HTTPS one for tls-orig.
    fn origin_for(&self, sc: &Scenario) -> &str {
        match (&self.tls_origin, sc.path) {
            (Some(o), Path::TlsOrig) => o,
            _ => &self.origin,
        }
    }

    fn start_proxy(&self, sc: &Scenario, proxy: &Proxy, dir: &FsPath) -> Result<Started> {
        let port = self.proxy_port();
        let ip = self.net.ip(Role::Proxy);
        if sc.path == Path::TlsOrig && self.tls_origin.is_none() {
            bail!("no HTTPS origin");
        }
        let egress_ips = self.net.egress_ips(proxy.egress_addresses())?;
        let site = Site {
            dir,
            listen_ip: ip,
            listen_port: port,
            origin: self.origin_for(sc),
            udp_origin: &self.udp_origin,
            external_ip: self.net.proxy_external_ip(),
            tls: self.tls.as_ref(),
            spare_ports: self.spare_ports(port),
            egress_ips: &egress_ips,
        };
        let argv = proxy.argv(sc.path, &site)?;
        let scrape = proxy.scrape_url(&site);
        let mut helpers = Vec::new();
        for (name, argv, ready) in proxy.helpers(&site) {
            let mut cmd = self.net.command(Role::Proxy, CLIENT_CPU, &argv[0]);
            cmd.args(&argv[1..]).current_dir(dir);
            let mut h = Proc::spawn(&name, cmd, Some(dir))?;
            h.wait_listening(ready, Duration::from_secs(10))?;
            helpers.push(h);
        }
        let mut full: Vec<String> = Vec::new();
        if let Some(q) = &self.quota {
            // Join the cgroup before exec, so that every process the proxy
            // forks (nginx's worker, dante's children) is inside it too; and
            // before `ip netns exec`, which mounts a /sys without cgroups.
            let script = format!("echo $$ > {} && exec \"$@\"", q.procs_file().display());
            full.extend(["sh".into(), "-c".into(), script, "sh".into()]);
        }
        full.extend(self.net.prefix(Role::Proxy, proxy.cpus()));
        full.extend(argv);
        let mut cmd = Command::new(&full[0]);
        cmd.args(&full[1..]).current_dir(dir);
        let mut p = Proc::spawn(&proxy.name, cmd, Some(dir))?;
        // A UDP relay has no TCP listener; everything else (SOCKS5 UDP
        // ASSOCIATE included) starts on TCP.
        let udp = sc.path == Path::UdpRelay;
        p.wait_ready(port, udp, Duration::from_secs(10))?;
        Ok(Started { proc: p, addr: format!("{ip}:{port}"), scrape, helpers })
    }

    /// Two ports besides the proxy's `port` (see [`Site::spare_ports`]).
    fn spare_ports(&self, port: u16) -> [u16; 2] {
        if self.net.is_netns() {
            return [port + 1, port + 2];
        }
        let mut v: Vec<u16> = vec![port];
        while v.len() < 3 {
            match free_port() {
                Some(p) if !v.contains(&p) => v.push(p),
                Some(_) => {}
                None => v.push(port + v.len() as u16),
            }
        }
        [v[1], v[2]]
    }

    fn load_command(&self, sc: &Scenario, proxy: &Proxy, proxy_addr: &str) -> Command {
        let mut cmd = self.net.command(Role::Client, CLIENT_CPU, &self.exe.display().to_string());
        let target = if sc.path.is_udp() { &self.udp_origin } else { self.origin_for(sc) };
        cmd.args(["load", "--json", "--mode", sc.mode, "--target", target]);
        cmd.args(["--proxy", proxy_addr, "--seed", &self.seed.to_string()]);
        if let (true, Some(tls)) = (sc.path.client_tls(), &self.tls) {
            cmd.arg("--ca").arg(&tls.ca).args(["--sni", &tls.name]);
        }
        cmd.args(&sc.load_args);
        cmd.args(proxy.load_args());
        match sc.kind {
            Kind::Hold(n) => {
                let n = n.min(TUNNEL_CAP).to_string();
                cmd.args(["--hold", &n, "--duration", HOLD_FOR, "--timeout", "60s"]);
            }
            Kind::IdleMix(n) => {
                let n = n.min(idle_cap(sc)).to_string();
                let settle = format!("{}ms", IDLE_SETTLE.as_millis());
                cmd.args(["--hold", &n, "--settle", &settle, "--duration", &self.duration]);
            }
            // A 1 GiB answer takes seconds: one sent in the warmup would not
            // be counted at all, so streams are measured from the start.
            Kind::Stream => {
                cmd.args(["--duration", &self.duration, "--warmup", "0s"]);
            }
            Kind::Rate => {
                cmd.args(["--duration", &self.duration]);
            }
        }
        cmd
    }

    fn measure(&self, row: &mut Row, sc: &Scenario, proxy: &Proxy, p: &mut Started) -> Result<()> {
        let pid = p.proc.pid();
        let rss_before = sys::status_kb(pid, "VmRSS:");
        let mut load = Proc::spawn_piped("load", self.load_command(sc, proxy, &p.addr))?;
        let stdout = load.child.stdout.take().context("load stdout")?;
        let stderr = load.child.stderr.take().context("load stderr")?;
        let out_thread = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = BufReader::new(stdout).read_to_string(&mut s);
            s
        });
        let (held_tx, held_rx) = mpsc::channel::<u64>();
        let (over_tx, over_rx) = mpsc::channel::<()>();
        let err_thread = std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                if let Some(n) = line.strip_prefix("holding ").and_then(|r| r.split(' ').next()) {
                    let _ = held_tx.send(n.parse().unwrap_or(0));
                }
                if line == "open loop over" {
                    let _ = over_tx.send(());
                }
                all.push_str(&line);
                all.push('\n');
            }
            all
        });

        let start = Instant::now();
        let mut before = None;
        if let Kind::Hold(n) | Kind::IdleMix(n) = sc.kind {
            let idle = matches!(sc.kind, Kind::IdleMix(_));
            row.tunnels_requested = Some(n);
            row.tunnel_cap = Some(if idle { idle_cap(sc) } else { TUNNEL_CAP });
            row.rss_before_kb = Some(rss_before);
            if let Ok(held) = held_rx.recv_timeout(Duration::from_secs(120)) {
                // Let the last tunnels' buffers settle before reading.
                std::thread::sleep(SETTLE);
                let now = sys::status_kb(pid, "VmRSS:");
                row.tunnels_held = Some(held);
                row.rss_held_kb = Some(now);
                if held > 0 {
                    let kb = now.saturating_sub(rss_before) as f64 / held as f64;
                    row.kb_per_tunnel = Some(kb);
                    if !idle {
                        row.throughput = Some(kb);
                    }
                }
                if idle {
                    // The open loop starts `IDLE_SETTLE` after the tunnels
                    // are held, and is measured after its warmup.
                    std::thread::sleep(IDLE_SETTLE.saturating_sub(SETTLE) + WARMUP);
                    before = Some((Instant::now(), sys::cpu_seconds(pid), sys::cpu_jiffies()));
                }
            }
        } else {
            if sc.kind == Kind::Rate {
                std::thread::sleep(WARMUP);
            }
            before = Some((Instant::now(), sys::cpu_seconds(pid), sys::cpu_jiffies()));
        }
        let stats = self.origin_stats.as_deref().filter(|_| sc.path == Path::TlsOrig);
        let origin_before = stats.and_then(origin_counters);
        let limit = duration_s(&self.duration) + 120.0;
        let sample = || (Instant::now(), sys::cpu_seconds(pid), sys::cpu_jiffies());
        // The idle mixes' window ends with their open loop, before the
        // proxy closes the held tunnels; the others' when the load exits.
        let mut after = None;
        let scraper = p.scrape.clone().map(|url| {
            let via = self.net.is_netns().then(|| self.net.prefix(Role::Client, CLIENT_CPU));
            scrape::Scraper::start(url, via)
        });
        while load.alive() {
            if start.elapsed().as_secs_f64() > limit {
                load.stop();
                bail!("load generator did not finish in {limit:.0}s");
            }
            if after.is_none() && over_rx.try_recv().is_ok() {
                after = Some(sample());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let after = after.unwrap_or_else(sample);
        if let Some((done, failed)) = scraper.map(scrape::Scraper::finish) {
            if failed > 0 {
                row.reason = format!("metrics: {failed} of {done} scrapes failed");
                eprintln!("campaign: {}: {}", row.reason, p.scrape.as_deref().unwrap_or(""));
            }
        }
        if let (Some(file), Some(b)) = (stats, origin_before) {
            // The origin rewrites its counters every 100 ms.
            std::thread::sleep(Duration::from_millis(250));
            if let Some(a) = origin_counters(file) {
                row.origin_tls_handshakes = Some(a.0.saturating_sub(b.0));
                row.origin_tls_resumed = Some(a.1.saturating_sub(b.1));
            }
        }
        let code = load.child.wait().ok().and_then(|s| s.code());
        load.stop();
        let out = out_thread.join().unwrap_or_default();
        let err = err_thread.join().unwrap_or_default();
        let report: Value = serde_json::from_str(out.trim()).map_err(|_| {
            anyhow::anyhow!("load exited {code:?}: {}", err.lines().last().unwrap_or(""))
        })?;
        fill_from_report(row, sc, &report);
        if let Some((t0, cpu0, j0)) = before {
            let window = (after.0 - t0).as_secs_f64();
            let cpu = (after.1 - cpu0).max(0.0);
            row.proxy_cpu_s = Some(cpu);
            if let Some(n) = row.completed.filter(|n| *n > 0) {
                row.cpu_us_per_req = Some(cpu * 1e6 / n as f64);
            }
            if let Some(b) = row.bytes.filter(|b| *b > 0) {
                row.cpu_s_per_gb = Some(cpu / (b as f64 / 1e9));
            }
            let cores = self.quota_cores.unwrap_or(1.0);
            let busy_proxy = (window > 0.0).then(|| cpu / (window * cores));
            row.busy_proxy = busy_proxy;
            row.busy_client = sys::busy_share(&j0, &after.2, 1);
            // Every CPU's busy time: the proxy, the client, the origin and the
            // kernel's work wherever it ran (softirq, kworkers).
            let shares = (0..after.2.len()).filter_map(|c| sys::busy_share(&j0, &after.2, c));
            row.machine_cpu_s = Some(shares.sum::<f64>() * window);
            row.pace = Some(pace_setter(busy_proxy, row.busy_client));
        }
        Ok(())
    }
}

/// A started proxy: its process, its address, the URL to scrape while it is
/// measured ([`Proxy::scrape_url`]), and the processes it relies on
/// ([`Proxy::helpers`]), stopped after it.
struct Started {
    proc: Proc,
    addr: String,
    scrape: Option<String>,
    helpers: Vec<Proc>,
}

fn fill_from_report(row: &mut Row, sc: &Scenario, r: &Value) {
    let u = |v: &Value| v.as_u64();
    row.completed = u(&r["completed"]);
    row.bytes = u(&r["bytes"]);
    row.duration_s = r["duration_s"].as_f64();
    let l = &r["latency_us"];
    row.lat_p50_us = u(&l["p50"]);
    row.lat_p90_us = u(&l["p90"]);
    row.lat_p99_us = u(&l["p99"]);
    row.lat_p99_9_us = u(&l["p99_9"]);
    row.errors_total = u(&r["errors"]["total"]);
    if let Some(m) = r["errors"].as_object() {
        let parts: Vec<String> = m
            .iter()
            .filter(|(k, v)| *k != "total" && v.as_u64().unwrap_or(0) > 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        row.errors = parts.join(";");
    }
    match sc.kind {
        Kind::Rate | Kind::IdleMix(_) => row.throughput = r["rate_per_s"].as_f64(),
        // Upload streams: the request bodies are the payload, and the
        // proxy's CPU per GB is per GB uploaded.
        Kind::Stream if sc.is_upload() => {
            row.throughput = r["upload_gbit_per_s"].as_f64();
            row.bytes = u(&r["upload_bytes"]);
        }
        Kind::Stream => row.throughput = r["gbit_per_s"].as_f64(),
        Kind::Hold(_) => {}
    }
}

/// The most tunnels an idle mix holds: its open loop's connections take
/// two of the proxy's descriptors each as well.
fn idle_cap(sc: &Scenario) -> u64 {
    TUNNEL_CAP.saturating_sub(sc.default_connections().map_or(0, u64::from))
}

/// (connections, resumed) from the HTTPS origin's `--stats` file.
fn origin_counters(file: &FsPath) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(file).ok()?;
    let get =
        |key: &str| text.lines().find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok());
    Some((get("connections ")?, get("resumed ")?))
}

/// First line, at most 100 characters: the report shows reasons in cells.
fn short(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    line.chars().take(100).collect()
}

fn duration_s(d: &str) -> f64 {
    crate::load::cli::duration(d).map(|d| d.as_secs_f64()).unwrap_or(10.0)
}

/// A port free on loopback now (the proxy binds it a moment later).
pub(super) fn free_port() -> Option<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
    Some(l.local_addr().ok()?.port())
}

/// A UDP port free on loopback now (the UDP echo binds it a moment later).
pub(super) fn free_udp_port() -> Option<u16> {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").ok()?;
    Some(s.local_addr().ok()?.port())
}
