//! `rustle-bench load`: a cheap, accurate HTTP/1.1 load generator.
//!
//! It must outrun the proxies it drives on the same number of cores, so it
//! runs one current-thread tokio runtime per thread (`threads`), spreads the
//! connections ("lanes") over them, sends requests pre-built once per run,
//! parses responses in place with httparse and skips bodies by framing
//! without copying. See [`Options`] for what each mode and option does and
//! [`Report`] for what comes back.
//!
//! Counting rules (correctness before features):
//! - a request counts only when its whole, strictly framed, 2xx response
//!   arrived; everything else is one error of one [`ErrorKind`];
//! - no request is sent at or after the deadline (with `--count`, after the
//!   N-th), and every request sent before it is awaited, so the count matches
//!   what the server saw;
//! - requests *sent* during the warmup are left out of the numbers, but
//!   errors are counted over the whole run so that none is hidden.
//!
//! Submodules: `plan` (addresses, hop, pre-built bytes), `dial` (TCP,
//! CONNECT, SOCKS5, TLS), `response` (strict response reader), `ws`
//! (WebSocket frames), `h2` (the h2c mode's connection and streams), `worker` (threads and lanes), [`stats`]
//! (histogram, report, JSON), [`cli`] (argument parsing) and `udp` (the
//! UDP modes: datagram echo, direct, through a UDP relay or SOCKS5 UDP
//! ASSOCIATE; they count datagrams).

pub mod cli;
mod dial;
mod h2;
mod plan;
mod response;
pub mod stats;
mod udp;
mod worker;
mod ws;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::sync::watch;
use tokio::time::Instant;

pub use stats::{ErrorCounts, ErrorKind, HoldReport, Percentiles, Report};

use plan::Plan;
use worker::{HoldSync, Job};

/// How the generator reaches the origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// HTTP/1.1 to the origin itself (baseline).
    Direct,
    /// Through an HTTP forward proxy, absolute-form requests.
    HttpProxy,
    /// A CONNECT tunnel through the proxy per connection, HTTP inside.
    Connect,
    /// A SOCKS5 tunnel (no auth) through the proxy per connection.
    Socks5,
    /// `--proxy` is a plain TCP relay to the origin.
    Relay,
    /// WebSocket echo on `/ws`: through the HTTP proxy, or directly to the
    /// origin when no `--proxy` is given. Counts messages.
    Ws,
    /// TLS to a TLS-terminating relay (`--ca`, `--sni`), HTTP inside.
    HttpsRelay,
    /// TLS to an HTTP proxy's TLS port (`--ca`, `--sni`), ALPN `http/1.1`,
    /// absolute-form requests inside.
    HttpsProxy,
    /// HTTP/2 with prior knowledge (h2c) to the proxy's HTTP port: a stream
    /// per request, proxied (`:authority` the origin), `--streams` at a time
    /// per connection.
    H2c,
    /// HTTP/2 over TLS with ALPN `h2` to an HTTP proxy's TLS port (`--ca`,
    /// `--sni`), streams as in h2c.
    H2Tls,
    /// UDP datagrams of `--size` bytes to a UDP echo (`--target`). Counts
    /// datagrams.
    UdpDirect,
    /// `--proxy` is a UDP port relay to the echo.
    UdpRelay,
    /// SOCKS5 UDP ASSOCIATE on `--proxy` per lane, datagrams for `--target`.
    UdpSocks5,
}

impl Mode {
    pub const ALL: [Mode; 13] = [
        Mode::Direct,
        Mode::HttpProxy,
        Mode::Connect,
        Mode::Socks5,
        Mode::Relay,
        Mode::Ws,
        Mode::HttpsRelay,
        Mode::HttpsProxy,
        Mode::H2c,
        Mode::H2Tls,
        Mode::UdpDirect,
        Mode::UdpRelay,
        Mode::UdpSocks5,
    ];

    /// The `--mode` spelling.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::HttpProxy => "http-proxy",
            Mode::Connect => "connect",
            Mode::Socks5 => "socks5",
            Mode::Relay => "relay",
            Mode::Ws => "ws",
            Mode::HttpsRelay => "https-relay",
            Mode::HttpsProxy => "https-proxy",
            Mode::H2c => "h2c",
            Mode::H2Tls => "h2-tls",
            Mode::UdpDirect => "udp-direct",
            Mode::UdpRelay => "udp-relay",
            Mode::UdpSocks5 => "udp-socks5",
        }
    }

    /// One of the datagram modes.
    pub fn is_udp(self) -> bool {
        matches!(self, Mode::UdpDirect | Mode::UdpRelay | Mode::UdpSocks5)
    }

    /// HTTP/2: a stream per request.
    pub fn is_h2(self) -> bool {
        matches!(self, Mode::H2c | Mode::H2Tls)
    }

    /// TLS to the proxy (`--ca`, `--sni`).
    pub fn is_tls(self) -> bool {
        matches!(self, Mode::HttpsRelay | Mode::HttpsProxy | Mode::H2Tls)
    }

    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// A load run. Build with [`Options::new`] and adjust fields.
#[derive(Debug, Clone)]
pub struct Options {
    pub mode: Mode,
    /// The origin, `HOST:PORT` (also the `Host` header).
    pub target: String,
    /// The proxy or relay, `HOST:PORT`.
    pub proxy: Option<String>,
    /// Request path; default `/bytes/1024`, `/sha256` with `upload`, `/ws`
    /// in ws mode.
    pub path: Option<String>,
    /// Concurrent connections (lanes).
    pub connections: usize,
    /// Worker threads, each with its own current-thread runtime.
    pub threads: usize,
    /// Measured time after the warmup (hold mode: how long to hold).
    pub duration: Duration,
    /// Excluded from the numbers (not in hold mode).
    pub warmup: Duration,
    /// Bound on one exchange (connect and tunnel setup included).
    pub timeout: Duration,
    /// A new connection per request (`Connection: close`), or per ws message.
    pub close: bool,
    /// POST a body of this many bytes (0: GET).
    pub upload: usize,
    /// Open loop: this many requests/s in total; `None`: closed loop.
    pub rate: Option<f64>,
    /// Mix: only this many of the connections active at once, rotating.
    pub active: Option<usize>,
    /// Hold mode: open this many connections, one request each, then idle.
    /// With `rate`, the idle mix: the connections stay open while the open
    /// loop runs on `connections` further ones.
    pub hold: Option<usize>,
    /// Hold mode: the path of the one request each held connection makes;
    /// default `path`.
    pub hold_path: Option<String>,
    /// Idle mix: the pause between the held connections being set up and
    /// the open loop's start (a window to read the proxy's memory in).
    pub settle: Duration,
    /// HTTP/2 modes: streams in flight per connection, each its own lane.
    pub streams: usize,
    /// Hold mode: connections set up at once per thread (64 by default, so
    /// that thousands of simultaneous SYNs do not overflow the listener's
    /// backlog; 1 sets them up one after the other).
    pub setup: usize,
    /// Send exactly this many requests (messages) in all, over every connection, and stop
    /// once each is answered or failed; `duration` and `warmup` then do not apply.
    pub count: Option<u64>,
    /// WebSocket message size, or UDP datagram payload size, in bytes.
    pub size: usize,
    /// PEM file of the CA to trust (https-relay).
    pub ca: Option<PathBuf>,
    /// TLS server name; default the proxy's host.
    pub sni: Option<String>,
    /// https-relay: offer no session resumption, so that every connection
    /// is a full handshake.
    pub no_resume: bool,
    /// https-relay: offer only X25519 (rustls would also offer, and a
    /// rustls server pick, the X25519MLKEM768 hybrid); `false`: rustls's defaults.
    pub x25519_only: bool,
    /// Seed for the only randomness (WebSocket masks).
    pub seed: u64,
    /// Print JSON instead of a human line (used by the CLI only).
    pub json: bool,
    /// `user:password` sent as `Proxy-Authorization: Basic` (http-proxy and connect).
    pub proxy_user: Option<String>,
}

impl Options {
    pub fn new(mode: Mode, target: impl Into<String>) -> Options {
        Options {
            mode,
            target: target.into(),
            proxy: None,
            path: None,
            connections: 64,
            threads: 1,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
            close: false,
            upload: 0,
            rate: None,
            active: None,
            hold: None,
            hold_path: None,
            settle: Duration::ZERO,
            streams: 1,
            count: None,
            setup: 64,
            size: 64,
            ca: None,
            sni: None,
            no_resume: false,
            x25519_only: false,
            seed: 0,
            json: false,
            proxy_user: None,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.connections == 0 || self.threads == 0 {
            bail!("--connections and --threads must be at least 1");
        }
        if let Some(r) = self.rate {
            if !(r.is_finite() && r > 0.0) {
                bail!("--rate must be a positive number");
            }
        }
        if let Some(m) = self.active {
            if m == 0 || m > self.connections {
                bail!("--active must be between 1 and --connections");
            }
            if self.rate.is_some() || self.close {
                bail!("--active cannot be combined with --rate or --close");
            }
        }
        if let Some(n) = self.hold {
            if n == 0 || self.mode == Mode::Ws || self.close {
                bail!("--hold needs N >= 1, not ws mode, and no --close");
            }
            if self.active.is_some() {
                bail!("--hold cannot be combined with --active");
            }
        } else if self.hold_path.is_some() || !self.settle.is_zero() {
            bail!("--hold-path and --settle need --hold");
        }
        if self.streams == 0 || self.streams > 1 && (!self.mode.is_h2() || self.close) {
            bail!("--streams needs N >= 1; above 1, an HTTP/2 mode and no --close");
        }
        if self.setup == 0 {
            bail!("--setup must be at least 1");
        }
        if let Some(n) = self.count {
            if n == 0 || self.hold.is_some() || self.mode.is_udp() {
                bail!("--count needs N >= 1, no --hold, and not a UDP mode");
            }
        }
        if self.mode.is_h2() && (self.upload > 0 || self.hold.is_some()) {
            bail!("the HTTP/2 modes take no --upload or --hold");
        }
        if self.mode == Mode::Ws && self.upload > 0 {
            bail!("--upload does not apply to ws mode");
        }
        if self.mode.is_udp() {
            udp::validate(self)?;
        }
        Ok(())
    }
}

/// Runs the load described by `o` on `o.threads` threads and reports.
pub fn run(o: &Options) -> Result<Report> {
    o.validate()?;
    raise_nofile_limit();
    if o.mode.is_udp() {
        let u = udp::run(o)?;
        return Ok(Report {
            mode: o.mode.name(),
            unit: "datagrams",
            threads: u.threads,
            connections: o.connections,
            completed: u.stats.completed,
            bytes: u.stats.bytes,
            upload_bytes: 0,
            elapsed: u.elapsed,
            latency_us: Percentiles::of(&u.stats.latency),
            errors: u.stats.errors,
            hold: None,
        });
    }
    match (o.hold, o.rate) {
        (Some(n), Some(_)) => idle_mix(o, n),
        (Some(n), None) => {
            let held = Held::start(o, n)?;
            held.wait_settled();
            let start = Instant::now();
            std::thread::sleep(o.duration);
            let elapsed = start.elapsed();
            let threads = held.workers.threads;
            let (total, hold) = held.finish()?;
            Ok(report(o, threads, n, total, elapsed, Some(hold)))
        }
        (None, _) => {
            let workers = Workers::start(o, o.connections * o.streams, None)?;
            let threads = workers.threads;
            let (total, elapsed) = workers.join()?;
            Ok(report(o, threads, o.connections, total, elapsed, None))
        }
    }
}

/// The idle mix: `n` connections set up as in hold mode stay open while the
/// open loop (`--rate`) runs on `o.connections` further ones. The numbers
/// are the open loop's; the held connections' failures count as errors too.
fn idle_mix(o: &Options, n: usize) -> Result<Report> {
    let held = Held::start(o, n)?;
    held.wait_settled();
    std::thread::sleep(o.settle);
    let mut active = o.clone();
    active.hold = None;
    let result = Workers::start(&active, o.connections * o.streams, None)
        .and_then(|w| Ok((w.threads, w.join()?)));
    // On stderr, as "holding": the measured window ends here, before the
    // held connections close.
    eprintln!("open loop over");
    // The hold ends whatever became of the open loop.
    let (held_stats, hold) = held.finish()?;
    let (threads, (total, elapsed)) = result?;
    let mut r = report(o, threads, o.connections, total, elapsed, Some(hold));
    r.errors.merge(&held_stats.errors);
    Ok(r)
}

fn report(
    o: &Options,
    threads: usize,
    connections: usize,
    total: stats::ThreadStats,
    elapsed: Duration,
    hold: Option<HoldReport>,
) -> Report {
    Report {
        mode: o.mode.name(),
        unit: if o.mode == Mode::Ws { "messages" } else { "requests" },
        threads,
        connections,
        completed: total.completed,
        bytes: total.bytes,
        // Only whole, answered requests count, so each sent its whole body.
        upload_bytes: total.completed * o.upload as u64,
        elapsed,
        latency_us: Percentiles::of(&total.latency),
        errors: total.errors,
        hold,
    }
}

/// Worker threads running the lanes of one plan.
struct Workers {
    plan: Arc<Plan>,
    threads: usize,
    handles: Vec<std::thread::JoinHandle<std::io::Result<(stats::ThreadStats, Instant)>>>,
}

impl Workers {
    /// Spreads `lanes` lanes over the threads and starts them.
    fn start(o: &Options, lanes: usize, hold: Option<Arc<HoldSync>>) -> Result<Workers> {
        // Every thread gets at least one lane (and one active slot in the mix).
        let threads = o.threads.min(lanes).min(o.active.unwrap_or(lanes));
        let plan = Arc::new(Plan::new(o, lanes)?);
        let mut handles = Vec::with_capacity(threads);
        for t in 0..threads {
            let job = Job {
                plan: Arc::clone(&plan),
                lanes: (t..lanes).step_by(threads).collect(),
                active: o.active.map(|m| m / threads + usize::from(t < m % threads)),
                hold: hold.clone(),
                streams: o.streams,
            };
            let h = std::thread::Builder::new()
                .name(format!("rustle-load-{t}"))
                .spawn(move || worker::run_thread(job))
                .context("spawning a worker thread")?;
            handles.push(h);
        }
        Ok(Workers { plan, threads, handles })
    }

    /// Waits for every thread: their statistics merged, and the measured
    /// time (from the end of the warmup until the last thread finished).
    fn join(self) -> Result<(stats::ThreadStats, Duration)> {
        let mut total = stats::ThreadStats::default();
        let mut finished = self.plan.warm_end;
        for h in self.handles {
            let Ok(result) = h.join() else { bail!("a worker thread panicked") };
            let (s, end) = result.context("starting a worker runtime")?;
            total.merge(&s);
            finished = finished.max(end);
        }
        Ok((total, finished - self.plan.warm_end))
    }
}

/// Hold mode's connections: each makes one exchange, then idles until
/// [`Held::finish`].
struct Held {
    workers: Workers,
    sync: Arc<HoldSync>,
    over: watch::Sender<bool>,
    requested: usize,
}

impl Held {
    fn start(o: &Options, n: usize) -> Result<Held> {
        let (over, over_rx) = watch::channel(false);
        let sync = Arc::new(HoldSync {
            settled: Default::default(),
            established: Default::default(),
            open: Default::default(),
            over: over_rx,
        });
        let mut o = o.clone();
        o.rate = None;
        if let Some(p) = &o.hold_path {
            o.path = Some(p.clone());
        }
        let workers = Workers::start(&o, n, Some(Arc::clone(&sync)))?;
        Ok(Held { workers, sync, over, requested: n })
    }

    /// Waits until every connection made its exchange, then says how many
    /// are held, on stderr, so that a script can start measuring memory now
    /// while stdout stays one JSON object.
    fn wait_settled(&self) {
        while self.sync.settled.load(Ordering::Acquire) < self.requested as u64 {
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("holding {} connections", self.sync.established.load(Ordering::Relaxed));
    }

    /// Ends the hold: the setup exchanges' statistics, and what was held.
    fn finish(self) -> Result<(stats::ThreadStats, HoldReport)> {
        // Receivers may all be gone if every lane failed; nothing to tell then.
        let _ = self.over.send(true);
        let (total, _) = self.workers.join()?;
        let hold = HoldReport {
            requested: self.requested as u64,
            established: self.sync.established.load(Ordering::Relaxed),
            open: self.sync.open.load(Ordering::Relaxed),
        };
        Ok((total, hold))
    }
}

/// Hold mode needs thousands of descriptors: lift the soft limit to the
/// hard one. Best effort; running out shows up as connect errors.
fn raise_nofile_limit() {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
}
