//! Statistics of a load run: per-thread counters and latency histogram, the
//! merged [`Report`], and its JSON and one-line human renderings.
//!
//! Each worker thread owns one [`ThreadStats`] (shared by its connection
//! tasks through an `Rc<RefCell<_>>`, never across threads), so recording a
//! request is a few integer adds and one histogram increment with no atomics;
//! threads are merged once at the end.

use std::fmt;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{json, Value};

/// Why an exchange failed. Every failure is counted under exactly one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// TCP connect (or the TLS handshake on top of it) failed.
    Connect,
    /// The proxy refused the tunnel: non-2xx to CONNECT, SOCKS5 failure
    /// reply or method refusal.
    ProxyRefused,
    /// A read from the socket failed.
    Read,
    /// A write to the socket failed.
    Write,
    /// No complete answer within `--timeout`.
    Timeout,
    /// A complete, well-framed response whose status is not 2xx (101 for the
    /// WebSocket upgrade).
    BadStatus,
    /// Malformed response: bad head, bad or ambiguous framing, bytes the
    /// server sent that belong to no response, unexpected WebSocket frame.
    Parse,
    /// The peer closed the connection before the answer was complete.
    ClosedEarly,
}

impl ErrorKind {
    /// All kinds, in report order.
    pub const ALL: [ErrorKind; 8] = [
        ErrorKind::Connect,
        ErrorKind::ProxyRefused,
        ErrorKind::Read,
        ErrorKind::Write,
        ErrorKind::Timeout,
        ErrorKind::BadStatus,
        ErrorKind::Parse,
        ErrorKind::ClosedEarly,
    ];

    /// The snake_case name used as JSON key.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Connect => "connect",
            ErrorKind::ProxyRefused => "proxy_refused",
            ErrorKind::Read => "read",
            ErrorKind::Write => "write",
            ErrorKind::Timeout => "timeout",
            ErrorKind::BadStatus => "bad_status",
            ErrorKind::Parse => "parse",
            ErrorKind::ClosedEarly => "closed_early",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error counts by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ErrorCounts([u64; 8]);

impl ErrorCounts {
    /// Counts one error of `kind`.
    pub fn add(&mut self, kind: ErrorKind) {
        self.0[kind.index()] += 1;
    }

    /// The count for `kind`.
    pub fn get(&self, kind: ErrorKind) -> u64 {
        self.0[kind.index()]
    }

    /// All errors.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    pub(crate) fn merge(&mut self, other: &ErrorCounts) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a += b;
        }
    }
}

/// Latencies are recorded in microseconds up to this bound (an hour);
/// longer ones saturate, which `--timeout` makes impossible in practice.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// A new latency histogram: 1 µs .. 1 h at 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    // Constant, valid bounds (low >= 1, high >= 2 * low, sigfig <= 5): cannot fail.
    #[allow(clippy::unwrap_used)]
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).unwrap()
}

/// What one worker thread observed.
pub struct ThreadStats {
    /// Completed requests (or WebSocket messages) after the warmup.
    pub completed: u64,
    /// Response bytes (head + body as framed on the wire) of those.
    pub bytes: u64,
    /// Latency of those, in µs.
    pub latency: Histogram<u64>,
    /// Failures, warmup included, so that no failure is hidden.
    pub errors: ErrorCounts,
}

impl Default for ThreadStats {
    fn default() -> Self {
        ThreadStats {
            completed: 0,
            bytes: 0,
            latency: new_histogram(),
            errors: ErrorCounts::default(),
        }
    }
}

impl ThreadStats {
    /// Records one complete, successful exchange.
    #[inline]
    pub fn record(&mut self, latency: Duration, bytes: u64) {
        self.completed += 1;
        self.bytes += bytes;
        // Sub-microsecond answers still count as 1 µs (the histogram floor).
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX).max(1);
        self.latency.saturating_record(us);
    }

    /// Merges another thread's numbers into this one.
    pub fn merge(&mut self, other: &ThreadStats) {
        self.completed += other.completed;
        self.bytes += other.bytes;
        // Same bounds on both sides, and saturation is handled: cannot fail.
        let _ = self.latency.add(&other.latency);
        self.errors.merge(&other.errors);
    }
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Percentiles {
    pub min: u64,
    pub mean: f64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p99_9: u64,
    pub max: u64,
}

impl Percentiles {
    /// Extracts the report percentiles; all zero for an empty histogram.
    pub fn of(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            min: h.min(),
            mean: h.mean(),
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p99_9: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// Hold-mode outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HoldReport {
    /// Connections asked for (`--hold N`).
    pub requested: u64,
    /// Connections that completed their one exchange and went idle.
    pub established: u64,
    /// Of those, still open at the end of the hold.
    pub open: u64,
}

/// The result of [`crate::load::run`].
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// `--mode` name.
    pub mode: &'static str,
    /// `"requests"`, `"messages"` in ws mode, `"datagrams"` in the UDP modes.
    pub unit: &'static str,
    pub threads: usize,
    pub connections: usize,
    /// Completed requests (messages) after the warmup.
    pub completed: u64,
    /// Response bytes received for them (echoed payload bytes in the UDP
    /// modes).
    pub bytes: u64,
    /// Request body bytes (`--upload`) of the completed requests.
    pub upload_bytes: u64,
    /// Measured time: from the end of the warmup until the last outstanding
    /// answer arrived (or the hold ended).
    pub elapsed: Duration,
    pub latency_us: Percentiles,
    pub errors: ErrorCounts,
    pub hold: Option<HoldReport>,
}

impl Report {
    /// Completed per second.
    pub fn rate(&self) -> f64 {
        per_second(self.completed as f64, self.elapsed)
    }

    /// Received payload throughput in Gbit/s.
    pub fn gbit_per_s(&self) -> f64 {
        per_second(self.bytes as f64 * 8.0, self.elapsed) / 1e9
    }

    /// Upload (request body) throughput in Gbit/s.
    pub fn upload_gbit_per_s(&self) -> f64 {
        per_second(self.upload_bytes as f64 * 8.0, self.elapsed) / 1e9
    }

    /// The JSON object printed by `--json`.
    pub fn to_json(&self) -> Value {
        let mut errors = serde_json::Map::new();
        for k in ErrorKind::ALL {
            errors.insert(k.name().to_string(), json!(self.errors.get(k)));
        }
        errors.insert("total".to_string(), json!(self.errors.total()));
        let l = &self.latency_us;
        json!({
            "mode": self.mode,
            "unit": self.unit,
            "threads": self.threads,
            "connections": self.connections,
            "completed": self.completed,
            "bytes": self.bytes,
            "duration_s": self.elapsed.as_secs_f64(),
            "rate_per_s": self.rate(),
            "gbit_per_s": self.gbit_per_s(),
            "upload_bytes": self.upload_bytes,
            "upload_gbit_per_s": self.upload_gbit_per_s(),
            "latency_us": {
                "min": l.min, "mean": l.mean, "p50": l.p50, "p90": l.p90,
                "p99": l.p99, "p99_9": l.p99_9, "max": l.max,
            },
            "errors": Value::Object(errors),
            "hold": self.hold.map(|h| json!({
                "requested": h.requested, "established": h.established, "open": h.open,
            })),
        })
    }

    /// One line of human text.
    pub fn human(&self) -> String {
        let l = &self.latency_us;
        let mut s = format!(
            "{}: {} {} in {:.2}s = {:.0}/s, {:.3} Gbit/s; latency µs p50 {} p90 {} p99 {} \
             p99.9 {} max {}; errors {}",
            self.mode,
            self.completed,
            self.unit,
            self.elapsed.as_secs_f64(),
            self.rate(),
            self.gbit_per_s(),
            l.p50,
            l.p90,
            l.p99,
            l.p99_9,
            l.max,
            self.errors.total(),
        );
        let kinds: Vec<String> = ErrorKind::ALL
            .iter()
            .filter(|k| self.errors.get(**k) > 0)
            .map(|k| format!("{k}={}", self.errors.get(*k)))
            .collect();
        if !kinds.is_empty() {
            s.push_str(&format!(" ({})", kinds.join(" ")));
        }
        if let Some(h) = self.hold {
            s.push_str(&format!(
                "; hold: {} requested, {} established, {} open",
                h.requested, h.established, h.open
            ));
        }
        s
    }
}

fn per_second(x: f64, d: Duration) -> f64 {
    let secs = d.as_secs_f64();
    if secs > 0.0 {
        x / secs
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn percentiles_are_ordered_and_close() {
        let mut t = ThreadStats::default();
        for us in 1..=10_000u64 {
            t.record(Duration::from_micros(us), 10);
        }
        let p = Percentiles::of(&t.latency);
        assert!(p.min <= p.p50 && p.p50 <= p.p90 && p.p90 <= p.p99);
        assert!(p.p99 <= p.p99_9 && p.p99_9 <= p.max);
        // 3 significant digits: within 0.1 %.
        let near = |v: u64, want: u64| v.abs_diff(want) * 1000 <= want;
        assert!(near(p.p50, 5_000), "{p:?}");
        assert!(near(p.p90, 9_000), "{p:?}");
        assert!(near(p.p99, 9_900), "{p:?}");
        assert!(near(p.max, 10_000), "{p:?}");
        assert_eq!(t.completed, 10_000);
        assert_eq!(t.bytes, 100_000);
    }

    #[test]
    fn empty_histogram_gives_zeros() {
        assert_eq!(Percentiles::of(&new_histogram()), Percentiles::default());
    }

    #[test]
    fn sub_microsecond_and_huge_latencies_are_kept() {
        let mut t = ThreadStats::default();
        t.record(Duration::from_nanos(10), 0);
        t.record(Duration::from_secs(100_000), 0);
        assert_eq!(t.latency.len(), 2);
        assert_eq!(t.latency.min(), 1);
    }

    #[test]
    fn errors_count_and_merge() {
        let mut a = ThreadStats::default();
        a.errors.add(ErrorKind::Timeout);
        a.errors.add(ErrorKind::Timeout);
        a.record(Duration::from_micros(5), 1);
        let mut b = ThreadStats::default();
        b.errors.add(ErrorKind::ProxyRefused);
        b.record(Duration::from_micros(7), 2);
        a.merge(&b);
        assert_eq!(a.errors.get(ErrorKind::Timeout), 2);
        assert_eq!(a.errors.get(ErrorKind::ProxyRefused), 1);
        assert_eq!(a.errors.get(ErrorKind::Connect), 0);
        assert_eq!(a.errors.total(), 3);
        assert_eq!((a.completed, a.bytes, a.latency.len()), (2, 3, 2));
        assert_eq!(a.latency.max(), 7);
    }

    fn sample() -> Report {
        let mut errors = ErrorCounts::default();
        errors.add(ErrorKind::Parse);
        Report {
            mode: "direct",
            unit: "requests",
            threads: 1,
            connections: 2,
            completed: 1000,
            bytes: 125_000_000,
            upload_bytes: 250_000_000,
            elapsed: Duration::from_secs(2),
            latency_us: Percentiles { min: 1, mean: 2.0, p50: 2, p90: 3, p99: 4, p99_9: 5, max: 6 },
            errors,
            hold: None,
        }
    }

    #[test]
    fn json_shape() {
        let v = sample().to_json();
        assert_eq!(v["mode"], "direct");
        assert_eq!(v["completed"], 1000);
        assert_eq!(v["rate_per_s"], 500.0);
        assert_eq!(v["gbit_per_s"], 0.5);
        assert_eq!(v["upload_gbit_per_s"], 1.0);
        assert_eq!(v["duration_s"], 2.0);
        for k in ["min", "mean", "p50", "p90", "p99", "p99_9", "max"] {
            assert!(v["latency_us"][k].is_number(), "{k}");
        }
        for k in ErrorKind::ALL {
            assert!(v["errors"][k.name()].is_u64(), "{k}");
        }
        assert_eq!(v["errors"]["parse"], 1);
        assert_eq!(v["errors"]["total"], 1);
        assert!(v["hold"].is_null());
        let mut r = sample();
        r.hold = Some(HoldReport { requested: 3, established: 2, open: 1 });
        assert_eq!(r.to_json()["hold"]["open"], 1);
        assert!(r.human().contains("1 open"));
        assert!(r.human().contains("parse=1"));
    }
}
