//! Memory at rest: the resident memory of an idle rustle with its built-in
//! listeners, and what each idle CONNECT tunnel and each idle kept-alive
//! HTTP client adds to it.
//!
//! Resident memory here is `RssAnon`, the process's own pages (heap,
//! stacks, data). `VmRSS` adds the file-backed pages of the binary and
//! libraries, which the kernel maps by whole runs of pages already in the
//! page cache: between identical starts it moves by far more than the
//! guard's tolerance while `RssAnon` stays within a page or two. It is
//! reported, not guarded.
//!
//! Each sample is a fresh process: started, left idle ([`IDLE_AFTER`]),
//! read; warmed up with a few exchanges on two connections, left to settle
//! and read again ("before"); then [`HELD`] connections, set up one after
//! the other with one exchange each, held idle while it settles ([`SETTLE`]: idle tunnels park after a second
//! and the park hands freed pages back; the buffer pool frees what the last
//! second did not use), and read ("after"). A figure is the median over
//! [`SAMPLES`] processes of (after − before) / HELD.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::proxy::Proxy;
use super::Isolation;
use crate::load::{self, Mode, Options};
use crate::Origin;

/// Connections held idle per sample.
pub(super) const HELD: u64 = 1000;
/// Processes measured per figure (the median is kept).
pub(super) const SAMPLES: usize = 3;
/// From start to the idle reading.
const IDLE_AFTER: Duration = Duration::from_millis(500);
/// From the warm-up's end, and from the last held connection's exchange, to
/// a reading: twice the park delay and the buffer pool's period, and more.
const SETTLE: Duration = Duration::from_millis(2500);
/// Readings per point, 100 ms apart; the median is kept.
const READINGS: usize = 3;

#[derive(Debug, Clone, Default)]
pub(super) struct Memory {
    /// Each process's idle RssAnon, KiB.
    pub idle_anon_kib: Vec<u64>,
    /// Each process's idle VmRSS, KiB.
    pub idle_rss_kib: Vec<u64>,
    /// Bytes per idle tunnel, per sample.
    pub tunnel_bytes: Vec<f64>,
    /// Bytes per idle kept-alive client, per sample.
    pub client_bytes: Vec<f64>,
}

pub(super) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub(super) fn measure(
    rustle: &Path,
    iso: Isolation,
    origin: &Origin,
    dir: &Path,
) -> Result<Memory> {
    let mut m = Memory::default();
    for _ in 0..SAMPLES {
        for mode in [Mode::Connect, Mode::HttpProxy] {
            let s = one(rustle, iso, origin, dir, mode)?;
            m.idle_anon_kib.push(s.idle_anon_kib);
            m.idle_rss_kib.push(s.idle_rss_kib);
            match mode {
                Mode::Connect => m.tunnel_bytes.push(s.per_connection),
                _ => m.client_bytes.push(s.per_connection),
            }
        }
    }
    Ok(m)
}

struct Sample {
    idle_anon_kib: u64,
    idle_rss_kib: u64,
    /// RssAnon bytes each held connection adds.
    per_connection: f64,
}

/// One process: its idle memory and what each held connection of `mode` adds.
fn one(rustle: &Path, iso: Isolation, origin: &Origin, dir: &Path, mode: Mode) -> Result<Sample> {
    // rustle with no configuration file: the listeners it serves then
    // (auto on :3128, socks on :1080), on ports of the kernel's choice.
    let mut cmd = iso.command(rustle);
    cmd.args(["--auto", "127.0.0.1:0", "--socks", "127.0.0.1:0", "--workers", "1"]);
    let mut proxy = Proxy::start(cmd, dir, 2)?;
    let addr = proxy.addr("auto")?;
    std::thread::sleep(IDLE_AFTER);
    let idle_anon_kib = reading(&proxy, "RssAnon")?;
    let idle_rss_kib = reading(&proxy, "VmRSS")?;

    let mut warm = options(mode, addr, origin.addr());
    (warm.connections, warm.count) = (2, Some(100));
    let r = load::run(&warm)?;
    if r.errors.total() > 0 {
        bail!("memory warm-up through rustle: {}", r.human());
    }
    std::thread::sleep(SETTLE);
    let before = reading(&proxy, "RssAnon")?;

    let mut hold = options(mode, addr, origin.addr());
    hold.hold = Some(HELD as usize);
    // One after the other: set up in bursts, what freed task state shares pages with
    // live state varies, and with it the pages a parked tunnel keeps, by several
    // times the spread of one-at-a-time setups between identical runs.
    hold.setup = 1;
    // Long enough for the settling and the readings after the last exchange.
    hold.duration = SETTLE + Duration::from_secs(3);
    let served = origin.requests();
    let holder = std::thread::spawn(move || load::run(&hold));
    let start = Instant::now();
    while origin.requests() < served + HELD {
        if start.elapsed() > Duration::from_secs(60) || holder.is_finished() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(SETTLE);
    let after = reading(&proxy, "RssAnon");
    proxy.check_alive()?;
    let r = holder.join().map_err(|_| anyhow::anyhow!("the holding thread panicked"))??;
    let after = after?;
    let held = r.hold.context("a hold run reports its hold")?;
    if r.errors.total() > 0 || held.established != HELD || held.open != HELD {
        bail!("holding {HELD} {} connections through rustle: {}", mode.name(), r.human());
    }
    let per_connection = (after as f64 - before as f64) * 1024.0 / HELD as f64;
    Ok(Sample { idle_anon_kib, idle_rss_kib, per_connection })
}

fn options(mode: Mode, proxy: SocketAddr, origin: SocketAddr) -> Options {
    let mut o = Options::new(mode, origin.to_string());
    o.proxy = Some(proxy.to_string());
    o.timeout = Duration::from_secs(30);
    o
}

/// The median of a few readings of a /proc/PID/status field, KiB.
fn reading(proxy: &Proxy, field: &str) -> Result<u64> {
    let mut v = Vec::with_capacity(READINGS);
    for i in 0..READINGS {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
        v.push(proxy.status_kib(field)? as f64);
    }
    Ok(median(&v) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }
}
