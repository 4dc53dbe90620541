//! Limits: bandwidth (token buckets per user and per listener), concurrent connections per
//! client address and per user, client addresses per user (`addrs`), and per-user traffic
//! counters.
//!
//! Everything here is shared across workers (a user's limit applies to all of its
//! connections on every worker), so unlike the rest of the per-worker state it is `Sync`.
//! The costs are kept where they are cheap:
//! - `Bucket`: one atomic compare-and-swap per read of a *limited* connection, nothing for
//!   an unlimited one (`Throttle::is_unlimited`).
//! - `ConnLimits`: a mutex once per connection or authentication, never per request; so
//!   is its table of client addresses per user (`addrs::Addrs`, one of a few shards).
//! - `Traffic`: a mutex once per authenticated user to find its entry, then relaxed atomic
//!   adds.
//!
//! # Bucket design
//!
//! The bucket is GCRA (the "virtual scheduling" form of a token bucket): its whole state is
//! one `AtomicU64`, the *theoretical arrival time* `tat` in nanoseconds since the bucket was
//! made. The bucket holds `(now + tau - max(tat, now)) * rate` bytes, where `tau` is the time
//! the burst takes to refill; taking `n` bytes moves `tat` to `max(tat, now) + n / rate`.
//! Because tokens and time are one word, a take is a single compare-and-swap with no torn
//! state, a give-back is a single atomic subtraction, a stale `now` (another thread read the
//! clock a little earlier) only sees fewer tokens, and the bucket can never hold more than
//! its burst. A mutex around (tokens, last refill) would cost about the same uncontended
//! but, under contention between workers, parks threads in the kernel; a failed CAS here
//! only retries a few arithmetic instructions. Reading the real clock costs more than a take
//! either way.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Rates are written in the configuration; the buckets here take them in bytes per second.
pub(crate) use crate::config::parse_rate;

pub(crate) mod addrs;

const NANOS: u64 = 1_000_000_000;

/// The default burst is at least this, and a throttled caller is never made to wait for
/// more than this at once: the relay's scratch buffer size, so a throttled connection
/// still moves full reads.
pub(crate) const CHUNK: u64 = 16 * 1024;

/// A throttled caller waits for at most this much of the rate at once, so slow limits
/// move small reads often rather than 16 KiB in long pauses (64 kbit/s: 160 bytes every
/// 20 ms instead of 16 KiB every 2 s).
const SLICE_PER_SEC: u64 = 50;

/// The clock the limits are meant to be read with: tokio's, which is the monotonic system
/// clock (`std::time::Instant::now`, no more) except where a test pauses it
/// (`tokio::time::pause`), and then moves only as the test's timers fire, so throttled
/// transfers run on simulated time. A bucket starts its own clock with it.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// A token bucket for bytes, shared across workers. See the module documentation for the
/// design.
#[derive(Debug)]
pub(crate) struct Bucket {
    /// Bytes per second, at least 1.
    rate: u64,
    /// Capacity in bytes, at least 1.
    burst: u64,
    /// Time for an empty bucket to fill, in nanoseconds.
    tau: u64,
    /// The least a throttled caller waits for (and `take` grants): see `chunk()`.
    chunk: u64,
    /// Where the clock starts (`now()` when the bucket is made).
    epoch: Instant,
    /// Theoretical arrival time, nanoseconds since `epoch`: the bucket is full when
    /// `tat <= now`, and holds `(now + tau - tat) * rate` bytes otherwise.
    tat: AtomicU64,
}

impl Bucket {
    /// `rate` bytes per second, `burst` bytes of capacity; a `burst` of 0 means the default,
    /// `default_burst(rate)`. A rate of 0 is taken as 1 byte per second (`parse_rate` never
    /// returns 0: "unlimited" is the absence of a bucket). The bucket starts full.
    pub(crate) fn new(rate_bytes_per_sec: u64, burst: u64) -> Bucket {
        let rate = rate_bytes_per_sec.max(1);
        let burst = if burst == 0 { Bucket::default_burst(rate) } else { burst };
        let chunk = (rate / SLICE_PER_SEC).clamp(1, CHUNK).min(burst);
        Bucket {
            rate,
            burst,
            tau: mul_div(burst, NANOS, rate, true),
            chunk,
            epoch: now(),
            tat: AtomicU64::new(0),
        }
    }

    /// A tenth of a second at the rate, at least 16 KiB, so that a 10 Mbit/s limit still
    /// moves whole 16 KiB reads.
    pub(crate) fn default_burst(rate_bytes_per_sec: u64) -> u64 {
        (rate_bytes_per_sec / 10).max(CHUNK)
    }

    #[cfg(test)]
    pub(crate) fn rate(&self) -> u64 {
        self.rate
    }

    #[cfg(test)]
    pub(crate) fn burst(&self) -> u64 {
        self.burst
    }

    #[cfg(test)]
    /// The least `take` grants (unless less is wanted) and what `wait` waits for:
    /// `min(16 KiB, burst, rate / 50)`, at least 1.
    pub(crate) fn chunk(&self) -> u64 {
        self.chunk
    }

    /// Takes up to `want` bytes now and returns how many may be moved: 0, or at least
    /// `min(want, chunk())`, never more than `want`. When it returns 0, `wait` says how long
    /// until it would not (if nobody else takes meanwhile).
    pub(crate) fn take(&self, want: usize, now: Instant) -> usize {
        if want == 0 {
            return 0;
        }
        let want = want as u64;
        let min = want.min(self.chunk);
        let now = self.nanos(now);
        let mut cur = self.tat.load(Ordering::Relaxed);
        loop {
            let avail = self.avail(cur, now);
            if avail < min {
                return 0;
            }
            let n = avail.min(want);
            let next = cur.max(now).saturating_add(self.cost_ceil(n));
            // Relaxed: the one word is the whole state and publishes nothing else; the
            // read-modify-write order on it alone is what makes takes add up.
            match self.tat.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                // `n <= want`, which came from a usize.
                Ok(_) => return n as usize,
                Err(actual) => cur = actual,
            }
        }
    }

    /// How long until `take(want, ..)` would grant something, that is until
    /// `min(want, chunk())` bytes are in the bucket: zero exactly when `take(want, now)`
    /// would not return 0.
    pub(crate) fn wait(&self, want: usize, now: Instant) -> Duration {
        if want == 0 {
            return Duration::ZERO;
        }
        let min = (want as u64).min(self.chunk);
        let now = self.nanos(now);
        let tat = self.tat.load(Ordering::Relaxed);
        // `avail >= min` exactly when `now + tau - max(tat, now) >= ceil(min / rate)`;
        // written so that a bucket in debt (`charge`) waits for the debt too.
        let ready = tat.max(now).saturating_add(self.cost_ceil(min));
        Duration::from_nanos(ready.saturating_sub(now.saturating_add(self.tau)))
    }

    /// Counts `n` bytes that were moved without asking (a datagram, bytes already read):
    /// the bucket may go into debt, and `take` grants nothing until the debt is paid off
    /// at the rate (`wait` includes it).
    pub(crate) fn charge(&self, n: usize, now: Instant) {
        if n == 0 {
            return;
        }
        let now = self.nanos(now);
        let cost = self.cost_ceil(n as u64);
        // Cannot fail: the closure always returns Some.
        let _ = self.tat.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
            Some(t.max(now).saturating_add(cost))
        });
    }

    /// Returns unused tokens: the caller took `n` more than it moved (a read returned
    /// fewer bytes, or another bucket granted less). The bucket still never holds more
    /// than its burst.
    pub(crate) fn give_back(&self, n: usize) {
        if n == 0 {
            return;
        }
        // Rounded down while takes round up, so rounding never creates bytes.
        let ns = mul_div(n as u64, NANOS, self.rate, false);
        // Cannot fail: the closure always returns Some.
        let _ = self
            .tat
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| Some(t.saturating_sub(ns)));
    }

    #[cfg(test)]
    /// Bytes in the bucket now (for diagnostics and tests).
    pub(crate) fn available(&self, now: Instant) -> u64 {
        self.avail(self.tat.load(Ordering::Relaxed), self.nanos(now))
    }

    fn nanos(&self, now: Instant) -> u64 {
        sat64(now.saturating_duration_since(self.epoch).as_nanos())
    }

    /// Nanoseconds' worth of bytes in the bucket.
    fn room(&self, tat: u64, now: u64) -> u64 {
        now.saturating_add(self.tau).saturating_sub(tat.max(now))
    }

    fn avail(&self, tat: u64, now: u64) -> u64 {
        mul_div(self.room(tat, now), self.rate, NANOS, false).min(self.burst)
    }

    /// Nanoseconds `n` bytes take at the rate, rounded up.
    fn cost_ceil(&self, n: u64) -> u64 {
        mul_div(n, NANOS, self.rate, true)
    }
}

/// `a * b / c`, rounded up or down, saturating. In 64 bits when the product fits (the
/// common case: 128-bit division is a slow library call), else in 128.
fn mul_div(a: u64, b: u64, c: u64, up: bool) -> u64 {
    match a.checked_mul(b) {
        Some(p) if up => p.div_ceil(c),
        Some(p) => p / c,
        None => {
            let p = u128::from(a) * u128::from(b);
            sat64(if up { p.div_ceil(u128::from(c)) } else { p / u128::from(c) })
        }
    }
}

fn sat64(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// A direction of a connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Direction {
    /// From the client towards the upstream.
    Up,
    /// From the upstream towards the client.
    Down,
}

/// The buckets that limit one direction of a connection: the user's and the listener's,
/// either may be absent. A byte moves only when every present bucket grants it.
#[derive(Clone, Default, Debug)]
pub(crate) struct Limit {
    pub(crate) user: Option<Arc<Bucket>>,
    pub(crate) listener: Option<Arc<Bucket>>,
}

impl Limit {
    pub(crate) fn is_unlimited(&self) -> bool {
        self.user.is_none() && self.listener.is_none()
    }

    fn buckets(&self) -> impl Iterator<Item = &Bucket> {
        self.user.iter().chain(self.listener.iter()).map(|b| &**b)
    }

    /// The minimum over the buckets of what each grants, taken from all of them: each
    /// bucket is asked for what the previous one granted, then those that granted more
    /// get the excess back. Unlimited grants `want`.
    pub(crate) fn take(&self, want: usize, now: Instant) -> usize {
        match (&self.user, &self.listener) {
            (None, None) => want,
            (Some(b), None) | (None, Some(b)) => b.take(want, now),
            (Some(a), Some(b)) => {
                let first = a.take(want, now);
                if first == 0 {
                    return 0;
                }
                let second = b.take(first, now);
                a.give_back(first - second);
                second
            }
        }
    }

    /// How long until `take(want, ..)` would grant something: the longest wait of the
    /// buckets.
    pub(crate) fn wait(&self, want: usize, now: Instant) -> Duration {
        self.buckets().map(|b| b.wait(want, now)).max().unwrap_or(Duration::ZERO)
    }

    /// Returns `n` unused bytes to every bucket.
    pub(crate) fn give_back(&self, n: usize) {
        for b in self.buckets() {
            b.give_back(n);
        }
    }

    /// Counts `n` bytes moved without asking against every bucket (see `Bucket::charge`).
    pub(crate) fn charge(&self, n: usize, now: Instant) {
        for b in self.buckets() {
            b.charge(n, now);
        }
    }
}

/// The limits that apply to one connection, each direction. Cheap to clone (up to four
/// `Arc`s); the default is unlimited.
#[derive(Clone, Default, Debug)]
pub(crate) struct Throttle {
    pub(crate) up: Limit,
    pub(crate) down: Limit,
}

impl Throttle {
    pub(crate) fn is_unlimited(&self) -> bool {
        self.up.is_unlimited() && self.down.is_unlimited()
    }

    pub(crate) fn dir(&self, dir: Direction) -> &Limit {
        match dir {
            Direction::Up => &self.up,
            Direction::Down => &self.down,
        }
    }

    #[cfg(test)]
    /// Bytes that may move now in `dir`: 0, or at least the smallest chunk wanted of its
    /// buckets, never more than `want`. Unlimited directions grant `want`.
    pub(crate) fn take(&self, dir: Direction, want: usize, now: Instant) -> usize {
        self.dir(dir).take(want, now)
    }

    #[cfg(test)]
    /// How long until `take` in `dir` would grant something (zero exactly when it would).
    pub(crate) fn wait(&self, dir: Direction, want: usize, now: Instant) -> Duration {
        self.dir(dir).wait(want, now)
    }

    #[cfg(test)]
    /// Returns bytes taken in `dir` but not moved.
    pub(crate) fn give_back(&self, dir: Direction, n: usize) {
        self.dir(dir).give_back(n)
    }

    /// Counts bytes moved in `dir` without asking (a datagram; bytes already read).
    pub(crate) fn charge(&self, dir: Direction, n: usize, now: Instant) {
        self.dir(dir).charge(n, now)
    }
}

/// A poisoned mutex here only means a thread panicked between two map updates, each of
/// which leaves the map consistent: go on with it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Concurrent connections per client address and per user, across all workers. The total
/// is counted elsewhere (`server`).
#[derive(Debug)]
pub(crate) struct ConnLimits {
    /// The limits (`NO_LIMIT`: none); a reload sets them (`set_limits`).
    per_client: AtomicUsize,
    per_user: AtomicUsize,
    clients: Mutex<HashMap<IpAddr, usize>>,
    users: Mutex<HashMap<Box<str>, UserConns>>,
    /// True while a fleet's shared state is unreachable and `on_state_loss = "deny"`:
    /// authenticated connections are refused (the fleet thread sets it each tick).
    state_lost: AtomicBool,
    /// Client addresses per user (`max_client_addresses`); each user's limit comes from
    /// the policy in force when it authenticates.
    pub(crate) addrs: Arc<addrs::Addrs>,
}

/// A user's connections: open here, and open on the fleet's other instances (as of the
/// fleet thread's last tick; 0 outside a fleet).
#[derive(Debug, Default, Clone, Copy)]
struct UserConns {
    open: usize,
    others: usize,
}

/// `ConnLimits`' value for no limit.
const NO_LIMIT: usize = usize::MAX;

/// What a `Slot` holds.
#[derive(Debug)]
enum Key {
    /// No limit applies: nothing was counted.
    None,
    Client(IpAddr),
    User(Box<str>),
}

/// One counted connection; dropping it releases the count, and an address or user whose
/// count reaches 0 leaves the map, so memory stays bounded by what is open.
#[must_use = "the slot is released as soon as it is dropped"]
#[derive(Debug)]
pub(crate) struct Slot {
    limits: Arc<ConnLimits>,
    key: Key,
}

impl Slot {
    /// Whether the slot counts against a limit (an unlimited one need not be kept).
    pub(crate) fn counts(&self) -> bool {
        !matches!(self.key, Key::None)
    }
}

impl ConnLimits {
    /// `None` is no limit (and no counting). A limit of 0 refuses everything.
    pub(crate) fn new(per_client: Option<usize>, per_user: Option<usize>) -> Arc<ConnLimits> {
        Arc::new(ConnLimits {
            per_client: AtomicUsize::new(per_client.unwrap_or(NO_LIMIT)),
            per_user: AtomicUsize::new(per_user.unwrap_or(NO_LIMIT)),
            clients: Mutex::new(HashMap::new()),
            users: Mutex::new(HashMap::new()),
            state_lost: AtomicBool::new(false),
            addrs: addrs::Addrs::new(),
        })
    }

    /// New limits (a reload), for connections opened from now on: those open count
    /// against a limit only if one was in force when they opened.
    pub(crate) fn set_limits(&self, per_client: Option<usize>, per_user: Option<usize>) {
        self.per_client.store(per_client.unwrap_or(NO_LIMIT), Ordering::Relaxed);
        self.per_user.store(per_user.unwrap_or(NO_LIMIT), Ordering::Relaxed);
    }

    /// A slot for one more connection from `ip`, or None when it already has the maximum.
    /// IPv4-mapped IPv6 addresses count as their IPv4 address.
    pub(crate) fn acquire_client(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let max = self.per_client.load(Ordering::Relaxed);
        if max == NO_LIMIT {
            return Some(self.unlimited());
        }
        let ip = ip.to_canonical();
        if !acquire(&mut lock(&self.clients), ip, max) {
            return None;
        }
        Some(Slot { limits: self.clone(), key: Key::Client(ip) })
    }

    /// A slot for one more connection of `user`, or None when it already has the maximum.
    pub(crate) fn acquire_user(self: &Arc<Self>, user: &str) -> Option<Slot> {
        let max = self.per_user.load(Ordering::Relaxed);
        if max == NO_LIMIT {
            return Some(self.unlimited());
        }
        let mut users = lock(&self.users);
        let n = users.get(user).copied().unwrap_or_default();
        if n.open + n.others >= max {
            return None;
        }
        match users.get_mut(user) {
            Some(n) => n.open += 1,
            None => {
                users.insert(user.into(), UserConns { open: 1, others: 0 });
            }
        }
        drop(users);
        Some(Slot { limits: self.clone(), key: Key::User(user.into()) })
    }

    #[cfg(test)]
    /// Open connections counted for `ip` (0 when not limited).
    pub(crate) fn client_count(&self, ip: IpAddr) -> usize {
        lock(&self.clients).get(&ip.to_canonical()).copied().unwrap_or(0)
    }

    #[cfg(test)]
    /// Open connections counted for `user` (0 when not limited).
    pub(crate) fn user_count(&self, user: &str) -> usize {
        lock(&self.users).get(user).map_or(0, |n| n.open)
    }

    /// Each user's connections open here (users with a limit only), for the fleet thread
    /// to publish.
    pub(crate) fn user_counts(&self) -> Vec<(Box<str>, usize)> {
        let users = lock(&self.users);
        users.iter().filter(|(_, n)| n.open > 0).map(|(u, n)| (u.clone(), n.open)).collect()
    }

    /// The connections each user has open on the fleet's other instances, in place of the
    /// last tick's (empty: none known, as when the shared state is unreachable).
    pub(crate) fn set_others(&self, others: &HashMap<String, usize>) {
        let mut users = lock(&self.users);
        for n in users.values_mut() {
            n.others = 0;
        }
        for (user, &count) in others {
            if let Some(n) = users.get_mut(user.as_str()) {
                n.others = count;
            } else if users.len() < addrs::MAX_USERS && count > 0 {
                users.insert(user.as_str().into(), UserConns { open: 0, others: count });
            }
        }
        users.retain(|_, n| n.open > 0 || n.others > 0);
    }

    /// Sets whether authenticated connections are refused for want of the shared state.
    pub(crate) fn set_state_lost(&self, lost: bool) {
        self.state_lost.store(lost, Ordering::Relaxed);
    }

    /// Whether authenticated connections are refused for want of the shared state.
    pub(crate) fn state_lost(&self) -> bool {
        self.state_lost.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    /// Entries in the maps (addresses and users with an open connection).
    pub(crate) fn tracked(&self) -> (usize, usize) {
        (lock(&self.clients).len(), lock(&self.users).values().filter(|n| n.open > 0).count())
    }

    fn unlimited(self: &Arc<Self>) -> Slot {
        Slot { limits: self.clone(), key: Key::None }
    }
}

fn acquire(map: &mut HashMap<IpAddr, usize>, key: IpAddr, max: usize) -> bool {
    let n = map.entry(key).or_insert(0);
    if *n >= max {
        if *n == 0 {
            map.remove(&key);
        }
        return false;
    }
    *n += 1;
    true
}

fn release<K, Q>(map: &mut HashMap<K, usize>, key: &Q)
where
    K: std::borrow::Borrow<Q> + std::hash::Hash + Eq,
    Q: std::hash::Hash + Eq + ?Sized,
{
    if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(key);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        match &self.key {
            Key::None => {}
            Key::Client(ip) => release(&mut lock(&self.limits.clients), ip),
            Key::User(user) => {
                let mut users = lock(&self.limits.users);
                if let Some(n) = users.get_mut(&**user) {
                    n.open = n.open.saturating_sub(1);
                    if n.open == 0 && n.others == 0 {
                        users.remove(&**user);
                    }
                }
            }
        }
    }
}

/// Why a user's connections are cut (`cut`): what its tunnels' log lines name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Cut {
    /// The user is disabled (admin API).
    Disabled,
    /// The user is removed (admin API, or a reload whose users no longer have it).
    Removed,
    /// A quota of the user's with `on_exceeded = "close"` ran out (its name): the sweep
    /// ends the user's connections (`UserTraffic::quota_cut`).
    Quota(Box<str>),
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cut::Disabled => f.write_str("user disabled"),
            Cut::Removed => f.write_str("user removed"),
            Cut::Quota(name) => write!(f, "quota `{name}` used up"),
        }
    }
}

/// `UserTraffic::cut`'s value while the user's connections may go on.
const NOT_CUT: u8 = 0;

/// Bytes one user moved, each way, across all its connections, its connections open, and
/// whether they are to be cut. Front ends hold it as an `Arc` while the user's
/// connection is open; the worker's per-second sweep (`front::cut`) closes those of a cut
/// user, so that the check costs a relaxed load per connection a second, nothing per read.
/// Also where the user stands against its quotas (set by the quota keeper, `state`, read
/// by the front ends).
#[derive(Debug, Default)]
pub(crate) struct UserTraffic {
    /// From the client towards the upstream.
    pub(crate) up: AtomicU64,
    /// From the upstream towards the client.
    pub(crate) down: AtomicU64,
    /// Connections of the user open now, across workers.
    pub(crate) open: AtomicU64,
    /// `NOT_CUT`, or the `Cut` in force (1 + its index; the quota's name in `reason`).
    cut: std::sync::atomic::AtomicU8,
    /// How many times the user was cut: a connection records it when held (`front::cut`)
    /// and the sweep ends those that recorded an older one, so that a cut holds for the
    /// connections open before it even when the user is restored before the sweep.
    generation: std::sync::atomic::AtomicU32,
    /// The reason in force, read only once `cut` says there is one.
    reason: Mutex<Option<Cut>>,
    /// `QUOTA_OK`, `QUOTA_EXCEEDED` or `QUOTA_CUT`.
    quota: AtomicU8,
    /// Why the user is refused while a quota is used up (read only when refusing).
    refusal: Mutex<Option<Arc<str>>>,
}

/// Marks `entry`'s user as cut for `reason`: its new connections are for the caller to
/// refuse (its policy no longer has the user, or the quota says so), and the workers'
/// next sweep (within a second) ends those open, their log lines naming `reason`.
pub(crate) fn cut(entry: &UserTraffic, reason: Cut) {
    let code = match &reason {
        Cut::Disabled => 1,
        Cut::Removed => 2,
        Cut::Quota(_) => 3,
    };
    *lock(&entry.reason) = Some(reason);
    // Release: a sweep that sees the code sees the reason stored before it.
    entry.cut.store(code, Ordering::Release);
    // After the flag (AcqRel): a connection held that reads the new generation sees the
    // flag and is refused; one that reads the older one is ended by the sweep.
    entry.generation.fetch_add(1, Ordering::AcqRel);
}

/// Within every quota.
const QUOTA_OK: u8 = 0;
/// A quota is used up: new requests and connections are refused.
const QUOTA_EXCEEDED: u8 = 1;
/// Used up, and the quota says `on_exceeded = "close"`: open tunnels end too.
const QUOTA_CUT: u8 = 2;

impl UserTraffic {
    /// Whether the user's connections are to be cut: one relaxed load (the sweep's).
    pub(crate) fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed) != NOT_CUT
    }

    /// The cut generation (`cut` counts them): what a connection records when held, read
    /// before `is_cut` is checked.
    pub(crate) fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether a cut came after generation `held` (a connection held then is to end).
    pub(crate) fn cut_since(&self, held: u32) -> bool {
        self.generation.load(Ordering::Relaxed) != held
    }

    /// Why the user's connections are cut, if they are.
    pub(crate) fn cut_reason(&self) -> Option<Cut> {
        if self.cut.load(Ordering::Acquire) == NOT_CUT {
            return None;
        }
        lock(&self.reason).clone()
    }

    /// The user may connect again (enabled, added back, quota topped up); its connections
    /// open before the cut still end at the next sweep.
    pub(crate) fn restore(&self) {
        self.cut.store(NOT_CUT, Ordering::Release);
        *lock(&self.reason) = None;
    }

    #[inline]
    pub(crate) fn add(&self, dir: Direction, n: u64) {
        let c = match dir {
            Direction::Up => &self.up,
            Direction::Down => &self.down,
        };
        // Relaxed: independent counters, read only for reporting and by the quota keeper
        // once a second.
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// (up, down) so far.
    pub(crate) fn get(&self) -> (u64, u64) {
        (self.up.load(Ordering::Relaxed), self.down.load(Ordering::Relaxed))
    }

    /// Why a new request or connection of this user is refused, when one of its quotas
    /// is used up: one relaxed load when it is not.
    #[inline]
    pub(crate) fn over_quota(&self) -> Option<crate::error::Error> {
        if self.quota.load(Ordering::Relaxed) == QUOTA_OK {
            return None;
        }
        self.refused()
    }

    #[cold]
    fn refused(&self) -> Option<crate::error::Error> {
        let text = lock(&self.refusal).clone()?;
        // The keeper says it once when the quota is used up; each refusal is in the
        // access log.
        tracing::debug!("refused: {text}");
        Some(crate::error::Error::QuotaExceeded(text))
    }

    /// Why the user's connections end, when a quota with `on_exceeded = "close"` is used
    /// up: its name, from the refusal's text.
    pub(crate) fn quota_cut(&self) -> Option<Cut> {
        if !self.cut() {
            return None;
        }
        let text = lock(&self.refusal).clone()?;
        let name = text.split('"').nth(1).unwrap_or(&text);
        Some(Cut::Quota(name.into()))
    }

    /// Whether the user's open tunnels are to end (a quota with `on_exceeded = "close"`
    /// is used up).
    #[inline]
    pub(crate) fn cut(&self) -> bool {
        self.quota.load(Ordering::Relaxed) == QUOTA_CUT
    }

    /// The keeper's verdict: None within every quota, else (whether open tunnels end,
    /// the refusal's text). Whether it changed.
    pub(crate) fn set_quota(&self, state: Option<(bool, Arc<str>)>) -> bool {
        let flag = match &state {
            None => QUOTA_OK,
            Some((false, _)) => QUOTA_EXCEEDED,
            Some((true, _)) => QUOTA_CUT,
        };
        let current = self.quota.load(Ordering::Relaxed);
        if flag == QUOTA_OK && current == QUOTA_OK {
            return false;
        }
        if flag == current {
            let same = match (&*lock(&self.refusal), &state) {
                (Some(a), Some((_, b))) => a == b,
                (None, None) => true,
                _ => false,
            };
            if same {
                return false;
            }
        }
        *lock(&self.refusal) = state.map(|(_, text)| text);
        self.quota.store(flag, Ordering::Relaxed);
        true
    }
}

/// Per-user traffic counters, shared across workers. An entry is made the first time a
/// user is seen and kept (users come from the configuration, so they are bounded).
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    users: Mutex<HashMap<Box<str>, Arc<UserTraffic>>>,
    /// Users past `MAX_TRAFFIC_USERS`, counted together.
    others: Arc<UserTraffic>,
}

/// Users with counters of their own, at most: names come from the configuration, but a
/// listener that accepts any credentials (`accept_any_credentials`) takes whatever name a
/// client sends, and the map must not grow with them.
pub(crate) const MAX_TRAFFIC_USERS: usize = 10_000;

/// The name `Traffic::snapshot` gives the users counted together.
pub(crate) const OTHER_USERS: &str = "*others*";

impl Traffic {
    pub(crate) fn new() -> Arc<Traffic> {
        Arc::new(Traffic::default())
    }

    /// The user's counters, made on first use: look this up once per authentication and
    /// keep the `Arc` with the connection.
    pub(crate) fn entry(&self, user: &str) -> Arc<UserTraffic> {
        let mut users = lock(&self.users);
        if let Some(t) = users.get(user) {
            return t.clone();
        }
        if users.len() >= MAX_TRAFFIC_USERS {
            return self.others.clone();
        }
        let t = Arc::new(UserTraffic::default());
        users.insert(user.into(), t.clone());
        t
    }

    /// The user's own counters, made if needed; None past `MAX_TRAFFIC_USERS` (where
    /// `entry` gives the shared `others`): what a quota or a cut acts on, never another
    /// user's.
    pub(crate) fn own(&self, user: &str) -> Option<Arc<UserTraffic>> {
        let t = self.entry(user);
        (!Arc::ptr_eq(&t, &self.others)).then_some(t)
    }

    /// The user's counters if it has some already (made by nothing but `entry`).
    pub(crate) fn find(&self, user: &str) -> Option<Arc<UserTraffic>> {
        lock(&self.users).get(user).cloned()
    }

    /// Every user with counters of its own, with them (for the quota keeper).
    pub(crate) fn entries(&self) -> Vec<(Box<str>, Arc<UserTraffic>)> {
        lock(&self.users).iter().map(|(u, t)| (u.clone(), t.clone())).collect()
    }

    /// (user, up, down) for every user seen, sorted by user; those past
    /// `MAX_TRAFFIC_USERS` summed last as `OTHER_USERS`, once there are any.
    pub(crate) fn snapshot(&self) -> Vec<(String, u64, u64)> {
        let mut v: Vec<_> = lock(&self.users)
            .iter()
            .map(|(u, t)| {
                let (up, down) = t.get();
                (u.to_string(), up, down)
            })
            .collect();
        v.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let (up, down) = self.others.get();
        if Arc::strong_count(&self.others) > 1 || up > 0 || down > 0 {
            v.push((OTHER_USERS.to_string(), up, down));
        }
        v
    }
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
