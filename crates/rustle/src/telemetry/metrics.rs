//! Counters for the admin endpoint's `/metrics`: per listener, per user, latency
//! histograms, reloads. Each worker counts into its own [`WorkerStats`], which only that
//! worker's thread writes; the admin thread sums the workers' figures when it is scraped.
//!
//! A counter is an `AtomicU64` written with a relaxed load and a relaxed store, not a
//! read-modify-write: with one writer no update is lost, and on x86-64 both are plain
//! `mov`s (no `lock`-prefixed instruction, no cache line taken from another core), so a
//! count costs what an ordinary `u64` increment costs. The atomics are there only so that
//! the scraping thread may read them. The request path takes no lock and allocates
//! nothing here: a worker finds its stats through a thread-local (`install`), a user's
//! through a worker-local map filled the first time that user is seen.
//!
//! `metrics` imports nothing from the rest of the crate: any layer may count.

use std::cell::{OnceCell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::protocol::{Protocol, Version};

/// A counter written by one thread only (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        // One writer: load + store, no lock-prefixed add (see the module documentation).
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// The `protocol` label's values, in the order of the counters kept by protocol.
const PROTOCOLS: [&str; 8] =
    ["http1", "http2", "connect", "socks4", "socks5", "relay", "udp", "other"];

/// An exchange's place in `PROTOCOLS`: HTTP/2 streams (requests, CONNECT and WebSocket
/// streams) are `http2`, an HTTP/1 CONNECT is `connect`, and a connection that failed
/// before its protocol was known (a TLS handshake, bytes that are no protocol, a refusal
/// at the connection limit) is `other`.
fn slot(protocol: Protocol, version: Version) -> usize {
    match (protocol, version) {
        (Protocol::Http | Protocol::Connect, Version::Http2) => 1,
        (Protocol::Http, _) => 0,
        (Protocol::Connect, _) => 2,
        (Protocol::Socks4, _) => 3,
        (Protocol::Socks5, _) => 4,
        (Protocol::Relay, _) => 5,
        (Protocol::Udp, _) => 6,
        // (A BIND is counted as its SOCKS version's: never here.)
        (Protocol::Unknown | Protocol::Bind, _) => 7,
    }
}

pub(crate) use crate::error::Refused;

const CAUSES: [&str; 3] = ["limit", "rule", "auth"];

/// Status classes, for the `code` label (haproxy's names); `other`: no status (the client
/// left before an answer, or a protocol without one failed before its reply).
const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "other"];

fn class(status: u16) -> usize {
    match status {
        100..=199 => 0,
        200..=299 => 1,
        300..=399 => 2,
        400..=499 => 3,
        500..=599 => 4,
        _ => 5,
    }
}

/// One listener's counters in one worker.
#[derive(Debug, Default)]
pub(crate) struct ListenerStats {
    accepted: Counter,
    closed: Counter,
    refused: [Counter; 3],
    /// By protocol (`PROTOCOLS`), then by status class.
    requests: [[Counter; 6]; 8],
    bytes_in: Counter,
    bytes_out: Counter,
    tls_handshakes: Counter,
    tls_failures: Counter,
    h2_streams: Counter,
}

/// One listener's counters: a slot per worker, each written by its worker only, summed
/// when scraped. A listener carries its own (`policy::Listener::counters`), so a reload
/// that keeps a listener keeps its counts, and one that drops it drops them.
#[derive(Debug, Default)]
pub(crate) struct ListenerCounters {
    slots: Box<[Slot]>,
}

/// A worker's slot, on cache lines of its own: workers never write the same line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Slot(ListenerStats);

impl ListenerCounters {
    pub(crate) fn new(workers: usize) -> std::sync::Arc<ListenerCounters> {
        std::sync::Arc::new(ListenerCounters {
            slots: (0..workers).map(|_| Slot::default()).collect(),
        })
    }

    fn slot(&self, worker: usize) -> Option<&ListenerStats> {
        self.slots.get(worker).map(|s| &s.0)
    }

    /// `f` summed over the workers' slots.
    pub(crate) fn sum(&self, f: impl Fn(&ListenerStats) -> u64) -> u64 {
        self.slots.iter().map(|s| f(&s.0)).sum()
    }
}

/// Upper bounds of the latency histograms' buckets, in seconds: from half a millisecond
/// (a pooled or local origin) to half a minute (the connect timeout's order).
pub(crate) const LATENCY_BUCKETS: [f64; 15] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Upper bounds of the tunnel-duration buckets, in seconds: from a short exchange through
/// a tunnel to a day-long connection.
pub(crate) const DURATION_BUCKETS: [f64; 15] = [
    0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0,
    86400.0,
];

/// The same bounds in nanoseconds, so that an observation compares integers.
const fn nanos(b: [f64; 15]) -> [u64; 15] {
    let mut out = [0u64; 15];
    let mut i = 0;
    while i < 15 {
        out[i] = (b[i] * 1e9) as u64;
        i += 1;
    }
    out
}

const LATENCY_NS: [u64; 15] = nanos(LATENCY_BUCKETS);
const DURATION_NS: [u64; 15] = nanos(DURATION_BUCKETS);

/// Which bucket a duration falls in (15: above the last bound).
fn bucket(bounds: &[u64; 15], d: Duration) -> (usize, u64) {
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    (bounds.iter().position(|&b| ns <= b).unwrap_or(15), ns)
}

/// A histogram written by one thread; bucket counts are not cumulative here (they are
/// made so when written out).
#[derive(Debug, Default)]
pub(crate) struct Histogram {
    counts: [Counter; 16],
    sum_ns: Counter,
}

impl Histogram {
    fn observe(&self, bounds: &[u64; 15], d: Duration) {
        let (i, ns) = bucket(bounds, d);
        self.counts[i].add(1);
        self.sum_ns.add(ns);
    }

    fn add_to(&self, into: &mut Summed) {
        for (sum, c) in into.counts.iter_mut().zip(&self.counts) {
            *sum += c.get();
        }
        into.sum_ns += self.sum_ns.get();
    }
}

/// A histogram several threads write (fetch_add): for a parent's connect latency, shared
/// by the workers and kept across reloads like its health. Observed once per new
/// connection through a parent, not per request.
#[derive(Debug, Default)]
pub(crate) struct SharedHistogram {
    counts: [AtomicU64; 16],
    sum_ns: AtomicU64,
}

impl SharedHistogram {
    pub(crate) fn observe(&self, d: Duration) {
        let (i, ns) = bucket(&LATENCY_NS, d);
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    pub(crate) fn summed(&self) -> Summed {
        let mut s = Summed::default();
        for (sum, c) in s.counts.iter_mut().zip(&self.counts) {
            *sum = c.load(Relaxed);
        }
        s.sum_ns = self.sum_ns.load(Relaxed);
        s
    }
}

/// A histogram's figures summed over workers.
#[derive(Debug, Default, Clone)]
pub(crate) struct Summed {
    counts: [u64; 16],
    sum_ns: u64,
}

/// A parent's counters (in its `route::Health`, shared by the workers).
#[derive(Debug, Default)]
pub(crate) struct ParentStats {
    /// Connections through it (or probes) that failed at it.
    pub(crate) failures: AtomicU64,
    /// Time to a connection through it (the whole chain it was part of).
    pub(crate) connect: SharedHistogram,
    /// Exchanges and tunnels through it: a slot per worker (see [`Through`]).
    pub(crate) traffic: Arc<PeerCounters>,
    /// How long its last health probe took, in nanoseconds plus one (0: none yet).
    /// Written by the one task that probes it (a store, not a read-modify-write).
    probe_ns: AtomicU64,
}

impl ParentStats {
    /// A health probe of the parent took `d`, whatever its answer.
    pub(crate) fn probed(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1);
        self.probe_ns.store(ns.saturating_add(1), Relaxed);
    }

    /// How long the last probe took, if one ran.
    pub(crate) fn last_probe(&self) -> Option<Duration> {
        let ns = self.probe_ns.load(Relaxed);
        (ns > 0).then(|| Duration::from_nanos(ns - 1))
    }
}

/// Worker slots made for parents' and routes' counters: the process's worker count, set
/// once before the first policy is built ([`set_workers`]). A table built before (or
/// in a test) has none, and counts nothing.
static WORKERS: AtomicUsize = AtomicUsize::new(0);

/// The number of workers, for the per-worker slots of parents and routes.
pub(crate) fn set_workers(n: usize) {
    // The largest asked for: tests run several proxies in one process.
    WORKERS.fetch_max(n, Relaxed);
}

/// One worker's counts of exchanges through one parent or route.
#[derive(Debug, Default)]
struct PeerStats {
    /// By status class.
    requests: [Counter; 6],
    up: Counter,
    down: Counter,
    /// [`Through`]s made and dropped: their difference is what is in flight.
    opened: Counter,
    closed: Counter,
}

#[derive(Debug, Default)]
#[repr(align(128))]
struct PeerSlot(PeerStats);

/// A parent's or a route's counters: a slot per worker, like [`ListenerCounters`]. Kept
/// across a reload with the parent's health (and, for a route, by its name).
#[derive(Debug)]
pub(crate) struct PeerCounters {
    slots: Box<[PeerSlot]>,
}

impl Default for PeerCounters {
    fn default() -> Self {
        PeerCounters { slots: (0..WORKERS.load(Relaxed)).map(|_| PeerSlot::default()).collect() }
    }
}

/// A parent's or route's counts summed over the workers.
#[derive(Debug, Default, Clone)]
pub(crate) struct PeerSums {
    /// By status class ([`CLASSES`]).
    pub(crate) requests: [u64; 6],
    pub(crate) up: u64,
    pub(crate) down: u64,
    /// Exchanges and tunnels in flight.
    pub(crate) active: u64,
}

impl PeerCounters {
    pub(crate) fn summed(&self) -> PeerSums {
        let mut s = PeerSums::default();
        let (mut opened, mut closed) = (0u64, 0u64);
        for slot in self.slots.iter() {
            let p = &slot.0;
            for (sum, c) in s.requests.iter_mut().zip(&p.requests) {
                *sum += c.get();
            }
            s.up += p.up.get();
            s.down += p.down.get();
            opened += p.opened.get();
            closed += p.closed.get();
        }
        s.active = opened.saturating_sub(closed);
        s
    }
}

/// What an exchange or tunnel through parents counts on: its route's and its parents'
/// counters. It counts as active on each from when it is made (a connection through
/// them, new or pooled) until it is dropped with the exchange's record, on the worker
/// that made it (the record is not `Send`). [`ended`] counts the exchange itself.
///
/// It holds the counters through the worker's own `Rc` of each (`Local::peers`), so that
/// an exchange takes no reference on the shared `Arc`: no atomic read-modify-write.
#[derive(Debug, Default)]
pub(crate) struct Through {
    peers: Box<[Rc<Held>]>,
}

/// A worker's reference to shared counters: an `Rc` of it is cloned without an atomic.
#[derive(Debug)]
struct Held(Arc<PeerCounters>);

impl Through {
    /// On a thread without stats (not a worker), counts nothing.
    pub(crate) fn new<'a>(peers: impl Iterator<Item = &'a Arc<PeerCounters>>) -> Through {
        let mut held = Vec::new();
        here(|l| {
            let mut known = l.peers.borrow_mut();
            for p in peers {
                let key = Arc::as_ptr(p) as usize;
                let rc = match known.get(&key) {
                    Some(rc) => rc.clone(),
                    None => {
                        // Counters of a parent or route a reload dropped go once nothing
                        // else holds them; this table holds its own, so an address is
                        // never reused while it is a key.
                        known.retain(|_, rc| {
                            Rc::strong_count(rc) > 1 || Arc::strong_count(&rc.0) > 1
                        });
                        let rc = Rc::new(Held(p.clone()));
                        known.insert(key, rc.clone());
                        rc
                    }
                };
                if let Some(s) = rc.0.slots.get(l.id) {
                    s.0.opened.add(1);
                }
                held.push(rc);
            }
        });
        Through { peers: held.into() }
    }
}

impl Drop for Through {
    fn drop(&mut self) {
        here(|l| {
            for p in self.peers.iter() {
                if let Some(s) = p.0.slots.get(l.id) {
                    s.0.closed.add(1);
                }
            }
        });
    }
}

/// One user's counters in one worker.
#[derive(Debug, Default)]
pub(crate) struct UserStats {
    requests: Counter,
    bytes_in: Counter,
    bytes_out: Counter,
    opened: Counter,
    closed: Counter,
    denied: Counter,
}

/// Users a worker keeps counters of, at most: names come from the configuration, but
/// a listener that accepts any credentials (`accept_any_credentials`) takes whatever
/// name a client sends. Users past this count are counted under `other`.
const MAX_USERS_PER_WORKER: usize = 10_000;

/// Everything one worker counts. Written only by its worker thread.
#[derive(Debug)]
pub(crate) struct WorkerStats {
    connect: Histogram,
    /// End-to-end exchange durations, by protocol (`PROTOCOLS`) (only while [`timed`]).
    request: [Histogram; 8],
    head: Histogram,
    tunnel: Histogram,
    /// Users seen by this worker; the lock is taken by the worker only the first time it
    /// sees a user, and by the scrape.
    users: Mutex<Vec<(Box<str>, Arc<UserStats>)>>,
    /// Users past `MAX_USERS_PER_WORKER`.
    overflow: Arc<UserStats>,
}

impl WorkerStats {
    pub(crate) fn new() -> Arc<WorkerStats> {
        Arc::new(WorkerStats {
            connect: Histogram::default(),
            request: Default::default(),
            head: Histogram::default(),
            tunnel: Histogram::default(),
            users: Mutex::new(Vec::new()),
            overflow: Arc::default(),
        })
    }
}

/// A worker thread's way to its stats.
struct Local {
    /// The worker's number: its slot in each listener's counters.
    id: usize,
    stats: Arc<WorkerStats>,
    users: RefCell<HashMap<Box<str>, Arc<UserStats>, foldhash::fast::RandomState>>,
    /// The parents' and routes' counters this worker has counted on, by address (see
    /// [`Through`]).
    peers: RefCell<HashMap<usize, Rc<Held>, foldhash::fast::RandomState>>,
}

impl Local {
    fn listener<'a>(&self, c: &'a ListenerCounters) -> Option<&'a ListenerStats> {
        c.slot(self.id)
    }

    /// The user's counters, made (and registered for the scrape) on first sight.
    fn user(&self, name: &str) -> Arc<UserStats> {
        let mut users = self.users.borrow_mut();
        if let Some(u) = users.get(name) {
            return u.clone();
        }
        if users.len() >= MAX_USERS_PER_WORKER {
            return self.stats.overflow.clone();
        }
        let u = Arc::new(UserStats::default());
        self.stats
            .users
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((name.into(), u.clone()));
        users.insert(name.into(), u.clone());
        u
    }

    /// Runs `f` on the user's counters without touching the `Arc`'s count.
    fn with_user(&self, name: &str, f: impl FnOnce(&UserStats)) {
        if let Some(u) = self.users.borrow().get(name) {
            return f(u);
        }
        f(&self.user(name))
    }
}

thread_local! {
    static HERE: OnceCell<Local> = const { OnceCell::new() };
}

/// Makes `stats` this thread's (a worker's, once at its start). Counting on a thread
/// without stats does nothing.
pub(crate) fn install(id: usize, stats: Arc<WorkerStats>) {
    HERE.with(|h| {
        let _ = h.set(Local { id, stats, users: RefCell::default(), peers: RefCell::default() });
    });
}

#[inline]
fn here(f: impl FnOnce(&Local)) {
    HERE.with(|h| {
        if let Some(l) = h.get() {
            f(l)
        }
    });
}

/// A connection was accepted on `listener`.
pub(crate) fn accepted(listener: &ListenerCounters) {
    here(|l| {
        if let Some(s) = l.listener(listener) {
            s.accepted.add(1)
        }
    })
}

/// A connection accepted on `listener` closed.
pub(crate) fn closed(listener: &ListenerCounters) {
    here(|l| {
        if let Some(s) = l.listener(listener) {
            s.closed.add(1)
        }
    })
}

/// A connection refused with no exchange to log (over the limit on a port that has no
/// way to say so).
pub(crate) fn refused(listener: &ListenerCounters, cause: Refused) {
    here(|l| {
        if let Some(s) = l.listener(listener) {
            s.refused[cause as usize].add(1)
        }
    })
}

/// A TLS handshake with a client of `listener` completed or failed.
pub(crate) fn tls_handshake(listener: &ListenerCounters, ok: bool) {
    here(|l| {
        if let Some(s) = l.listener(listener) {
            s.tls_handshakes.add(1);
            if !ok {
                s.tls_failures.add(1);
            }
        }
    })
}

/// An HTTP/2 stream began on `listener`.
pub(crate) fn h2_stream(listener: &ListenerCounters) {
    here(|l| {
        if let Some(s) = l.listener(listener) {
            s.h2_streams.add(1)
        }
    })
}

/// A new upstream connection (direct or through parents) took `d` to make.
pub(crate) fn upstream_connected(d: Duration) {
    here(|l| l.stats.connect.observe(&LATENCY_NS, d))
}

/// A response head came `d` after its request began to go out.
pub(crate) fn response_head(d: Duration) {
    here(|l| l.stats.head.observe(&LATENCY_NS, d))
}

/// How an exchange or tunnel ended: one per access-log line, counted whether or not the
/// log is on.
pub(crate) struct End<'a> {
    pub(crate) listener: &'a ListenerCounters,
    /// What the client asked for, and its HTTP version (the `protocol` label).
    pub(crate) protocol: Protocol,
    pub(crate) version: Version,
    /// The HTTP status the client got; 0: none. Protocols without statuses give 200 for
    /// a tunnel or session that was set up, and their error's HTTP status otherwise.
    pub(crate) status: u16,
    /// Bytes from the client towards the upstream, and back.
    pub(crate) up: u64,
    pub(crate) down: u64,
    /// The authenticated user.
    pub(crate) user: Option<&'a str>,
    pub(crate) refused: Option<Refused>,
    /// When a tunnel began, for its duration.
    pub(crate) tunnel: Option<Instant>,
    /// When the exchange began (its request head read), for its duration.
    pub(crate) start: Instant,
    /// The route's and parents' counters, when it went through parents.
    pub(crate) through: Option<&'a Through>,
}

#[inline]
pub(crate) fn ended(e: &End<'_>) {
    // Counted only while something can read the counts (`timed`).
    if timed() {
        count_end(e);
    }
}

fn count_end(e: &End<'_>) {
    here(|l| {
        if let Some(s) = l.listener(e.listener) {
            s.requests[slot(e.protocol, e.version)][class(e.status)].add(1);
            s.bytes_in.add(e.up);
            s.bytes_out.add(e.down);
            if let Some(cause) = e.refused {
                s.refused[cause as usize].add(1);
            }
        }
        if let Some(t) = e.through {
            for p in t.peers.iter() {
                if let Some(s) = p.0.slots.get(l.id) {
                    s.0.requests[class(e.status)].add(1);
                    s.0.up.add(e.up);
                    s.0.down.add(e.down);
                }
            }
        }
        match e.tunnel {
            Some(start) => l.stats.tunnel.observe(&DURATION_NS, start.elapsed()),
            // (A start read from the clock, as exchanges are timed: `Worker::stamp`.)
            None => {
                l.stats.request[slot(e.protocol, e.version)].observe(&LATENCY_NS, e.start.elapsed())
            }
        }
        if let Some(name) = e.user {
            l.with_user(name, |u| {
                u.requests.add(1);
                u.bytes_in.add(e.up);
                u.bytes_out.add(e.down);
                if e.refused.is_some() {
                    u.denied.add(1);
                }
            });
        }
    })
}

/// An open connection of an authenticated user; counts it closed when dropped (on the
/// worker thread that opened it, where the connection lives).
#[derive(Debug)]
pub(crate) struct UserConn(Arc<UserStats>);

impl Drop for UserConn {
    fn drop(&mut self) {
        self.0.closed.add(1);
    }
}

/// A connection authenticated as `user` (once per connection).
pub(crate) fn user_connection(user: &str) -> Option<UserConn> {
    let mut conn = None;
    here(|l| {
        let u = l.user(user);
        u.opened.add(1);
        conn = Some(UserConn(u));
    });
    conn
}

static RELOADS: AtomicU64 = AtomicU64::new(0);
static RELOAD_FAILURES: AtomicU64 = AtomicU64::new(0);
/// 1 until a reload is refused, then the outcome of the last one (the configuration that
/// started the process counts as a success).
static LAST_RELOAD_OK: AtomicU64 = AtomicU64::new(1);
/// When the last reload was applied, in milliseconds since the Unix epoch (0: none).
static LAST_RELOAD_MS: AtomicU64 = AtomicU64::new(0);

/// A configuration reload was applied (`ok`) or refused.
pub(crate) fn reloaded(ok: bool) {
    match ok {
        true => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            let ms = now.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            LAST_RELOAD_MS.store(ms, Relaxed);
            RELOADS.fetch_add(1, Relaxed)
        }
        false => RELOAD_FAILURES.fetch_add(1, Relaxed),
    };
    LAST_RELOAD_OK.store(u64::from(ok), Relaxed);
}

static AUTH_HASHES: AtomicU64 = AtomicU64::new(0);
static AUTH_HASHES_REFUSED: AtomicU64 = AtomicU64::new(0);

/// A password hash was computed (on a hashing thread: several writers, so an atomic add;
/// once per hash, which takes milliseconds).
pub(crate) fn auth_hashed() {
    AUTH_HASHES.fetch_add(1, Relaxed);
}

/// A password check was refused a place on the hashing threads (its client's share or the
/// queue was full).
pub(crate) fn auth_hash_refused() {
    AUTH_HASHES_REFUSED.fetch_add(1, Relaxed);
}

/// Whether anything reads the exchanges' counts and durations (an admin endpoint runs).
static TIMED: AtomicBool = AtomicBool::new(false);

/// Exchanges are counted and timed (an admin endpoint serves `/metrics`): the workers
/// read the clock when an exchange starts even with the access log off. Without an admin
/// endpoint nothing can read them, and an exchange's end costs neither.
pub(crate) fn set_timed() {
    TIMED.store(true, Relaxed);
}

/// Whether exchanges are timed (see [`set_timed`]).
#[inline]
pub(crate) fn timed() -> bool {
    TIMED.load(Relaxed)
}

/// Whether the proxy takes new connections, for `/readyz`.
#[derive(Debug)]
pub(crate) struct Readiness(AtomicU8);

impl Default for Readiness {
    fn default() -> Self {
        Readiness(AtomicU8::new(STARTING))
    }
}

const STARTING: u8 = 0;
const READY: u8 = 1;
const DRAINING: u8 = 2;

impl Readiness {
    /// The listeners are bound and the workers accept.
    pub(crate) fn set_ready(&self) {
        self.0.store(READY, Relaxed);
    }

    /// The listeners stop accepting (a shutdown or a takeover began); final.
    pub(crate) fn set_draining(&self) {
        self.0.store(DRAINING, Relaxed);
    }

    /// Ok when ready; otherwise why not.
    pub(crate) fn check(&self) -> Result<(), &'static str> {
        match self.0.load(Relaxed) {
            READY => Ok(()),
            DRAINING => Err("draining: this process is shutting down"),
            _ => Err("starting: the listeners are not bound yet"),
        }
    }
}

mod text;

pub(crate) use text::{render, ListenerLabel, ParentView, Process, RouteView, Scrape};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_classes() {
        assert_eq!(bucket(&LATENCY_NS, Duration::from_micros(500)).0, 0);
        assert_eq!(bucket(&LATENCY_NS, Duration::from_micros(501)).0, 1);
        assert_eq!(bucket(&LATENCY_NS, Duration::from_secs(31)).0, 15);
        assert_eq!(bucket(&DURATION_NS, Duration::from_secs(2)).0, 4);
        assert_eq!([class(101), class(204), class(302), class(407), class(502)], [0, 1, 2, 3, 4]);
        assert_eq!([class(0), class(600)], [5, 5]);
    }

    #[test]
    fn exchanges_through_parents_count_per_worker_without_keeping_dropped_counters() {
        // Exchanges are counted while an admin endpoint can read them.
        set_timed();
        set_workers(1);
        let (route, parent) =
            (Arc::new(PeerCounters::default()), Arc::new(PeerCounters::default()));
        let (r, p) = (route.clone(), parent.clone());
        std::thread::spawn(move || {
            install(0, WorkerStats::new());
            let t = Through::new([&r, &p].into_iter());
            let u = Through::new([&p].into_iter());
            assert_eq!((r.summed().active, p.summed().active), (1, 2));
            ended(&End {
                listener: &ListenerCounters::default(),
                protocol: Protocol::Connect,
                version: Version::Http11,
                status: 200,
                up: 3,
                down: 4,
                user: None,
                refused: None,
                tunnel: None,
                start: Instant::now(),
                through: Some(&t),
            });
            drop((t, u));
            // The worker's table holds one reference each, none per exchange.
            assert_eq!((Arc::strong_count(&r), Arc::strong_count(&p)), (3, 3));
            // Counters a reload dropped: let go by the table once nothing else holds
            // them, when it next meets new ones.
            let gone = Arc::new(PeerCounters::default());
            drop(Through::new([&gone].into_iter()));
            let weak = Arc::downgrade(&gone);
            drop(gone);
            assert!(weak.upgrade().is_some(), "the table holds its own");
            let other = Arc::new(PeerCounters::default());
            drop(Through::new([&other].into_iter()));
            assert!(weak.upgrade().is_none(), "dropped counters kept");
            assert_eq!(Arc::strong_count(&p), 3, "counters in use let go");
        })
        .join()
        .expect("the worker thread");
        let (r, p) = (route.summed(), parent.summed());
        assert_eq!((r.requests[1], r.up, r.down, r.active), (1, 3, 4, 0));
        assert_eq!((p.requests[1], p.active), (1, 0));
    }

    #[test]
    fn readiness() {
        let r = Readiness::default();
        assert!(r.check().expect_err("not ready").starts_with("starting"));
        r.set_ready();
        assert!(r.check().is_ok());
        r.set_draining();
        assert!(r.check().expect_err("not ready").starts_with("draining"));
    }
}
