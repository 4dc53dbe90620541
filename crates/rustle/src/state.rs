//! Quotas and the usage they keep, across reloads and restarts.
//!
//! The front ends count every byte into the user's shared counters (`limits::UserTraffic`:
//! one relaxed add per read or exchange) and look at its quota flag (one relaxed load per
//! request or connection). Nothing else runs on their path: the `rustle-quota` thread
//! wakes every second, reads each user's cumulative counters, adds what moved since its
//! last look to every quota of the user in the current period, and sets or clears the
//! user's flag. A quota can so be overshot by about a second's traffic of the user.
//!
//! Periods: `day`, `week` (from Monday) and `month` start at local midnight in
//! `[state] time_zone` (jiff, the system's tz database: a day across a DST change is 23
//! or 25 hours); `rolling:DURATION` is the last DURATION, kept as `ROLLING_BUCKETS`
//! buckets of DURATION/24, so usage falls a bucket at a time.
//!
//! Usage is kept behind a small seam (`Backend`: `load`, `flush`), a file (`state/file`)
//! written every `flush_interval`, at shutdown and when a takeover hands over: a crash
//! loses at most one interval.
//!
//! `redis`: the client of the Redis a fleet of instances shares state through, used from
//! the fleet's thread or the quota keeper's, never from a worker's request path. `fleet`:
//! the fleet's thread (`rustle-fleet`), which owns a client and keeps this instance's
//! connection counts, client addresses and sticky sessions in step with the fleet's.
//! `remote`: with `[state] backend = "redis"`, the quota keeper's thread syncs usage with
//! Redis every second through a client of its own: what this instance moved is added to
//! the fleet's counters and the fleet's totals come back as the usage enforced, so a quota
//! is overshot by at most a second's traffic of each instance. While Redis is unreachable
//! the keeper enforces the last totals plus its own traffic since, and sends what it kept
//! back when Redis returns. `[state] path`, when set beside Redis, keeps a copy of the
//! usage as last known (written every `flush_interval`), read at start and given back to a
//! Redis that lost its data.

pub(crate) mod file;
pub(crate) mod fleet;
// The keeper uses the quota part of the Redis client, the fleet thread the rest.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod redis;
mod remote;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use crate::config::{OnExceeded, Period, QuotaConfig, QuotaDirection, ROLLING_BUCKETS};
use crate::limits::{Traffic, UserTraffic};

/// Where usage is kept.
pub(crate) enum Backend {
    File(file::File),
}

/// One user's usage of one quota, as stored: the buckets of its current period (one for
/// a calendar period; up to `ROLLING_BUCKETS` for a rolling window), its top-up, and the
/// bytes added since the last flush (for stores that add rather than replace).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Usage {
    pub(crate) quota: String,
    pub(crate) user: String,
    /// (start, bytes): start in seconds since the epoch.
    pub(crate) buckets: Vec<(i64, u64)>,
    /// Extra bytes allowed (`top_up`), for the period that started at `extra_start`.
    #[serde(default)]
    pub(crate) extra: u64,
    #[serde(default)]
    pub(crate) extra_start: i64,
    #[serde(skip)]
    pub(crate) delta: u64,
}

impl Backend {
    /// The usage kept, per (quota, user, period start).
    pub(crate) fn load(&self) -> std::io::Result<Vec<Usage>> {
        match self {
            Backend::File(f) => f.load(),
        }
    }

    /// Puts the usage in the store; each entry's `delta` is what it gained since the
    /// last flush.
    pub(crate) fn flush(&self, usage: &[Usage]) -> std::io::Result<()> {
        match self {
            Backend::File(f) => f.flush(usage),
        }
    }
}

/// A quota as the keeper applies it.
#[derive(Debug, Clone)]
struct Quota {
    name: Box<str>,
    users: Vec<String>,
    groups: Vec<String>,
    bytes: u64,
    direction: QuotaDirection,
    period: Period,
    close: bool,
}

impl Quota {
    fn of(q: &QuotaConfig) -> Quota {
        Quota {
            name: q.name.as_str().into(),
            users: q.users.clone(),
            groups: q.groups.clone(),
            bytes: q.bytes,
            direction: q.direction,
            period: q.period,
            close: q.on_exceeded == OnExceeded::Close,
        }
    }

    fn applies(&self, user: &str, groups: &[String]) -> bool {
        self.users.iter().any(|u| u == user) || self.groups.iter().any(|g| groups.contains(g))
    }

    fn bytes_of(&self, up: u64, down: u64) -> u64 {
        match self.direction {
            QuotaDirection::Both => up.saturating_add(down),
            QuotaDirection::In => down,
            QuotaDirection::Out => up,
        }
    }
}

/// The bucket `now` falls in for `period`: (its start, when the next one starts), in
/// seconds since the epoch. Calendar periods are whole periods; a rolling window's are
/// its buckets.
pub(crate) fn bucket(period: Period, tz: &TimeZone, now: Timestamp) -> (i64, i64) {
    let secs = now.as_second();
    let calendar = |first: jiff::civil::Date, next: jiff::civil::Date| -> Option<(i64, i64)> {
        let a = first.to_zoned_datetime(tz.clone()).ok()?.timestamp().as_second();
        let b = next.to_zoned_datetime(tz.clone()).ok()?.timestamp().as_second();
        Some((a, b))
    };
    let date = now.to_zoned_datetime(tz.clone()).date();
    let found = match period {
        Period::Day => date.tomorrow().ok().and_then(|next| calendar(date, next)),
        Period::Week => {
            let back = i64::from(date.weekday().to_monday_zero_offset());
            date.checked_sub(back.days())
                .ok()
                .and_then(|monday| Some((monday, monday.checked_add(7.days()).ok()?)))
                .and_then(|(a, b)| calendar(a, b))
        }
        Period::Month => {
            let first = date.first_of_month();
            first.checked_add(1.month()).ok().and_then(|next| calendar(first, next))
        }
        Period::Rolling(window) => {
            let size = bucket_size(window);
            let start = secs.div_euclid(size) * size;
            Some((start, start + size))
        }
    };
    // Only at the ends of jiff's range (years -9999 and 9999): a day from now.
    found.unwrap_or((secs, secs + 86_400))
}

/// A rolling window's bucket, in seconds.
fn bucket_size(window: Duration) -> i64 {
    i64::try_from(window.as_secs() / ROLLING_BUCKETS).unwrap_or(i64::MAX).max(1)
}

/// One user's account with one quota.
#[derive(Debug, Clone, Default)]
struct Account {
    buckets: Vec<(i64, u64)>,
    extra: u64,
    extra_start: i64,
    delta: u64,
    /// Top-up bytes not yet sent to Redis (`remote`).
    extra_delta: u64,
    /// Counts the resets, so that fleet totals asked for before one are not applied after.
    epoch: u32,
    /// Changed since the last flush.
    dirty: bool,
}

impl Account {
    /// Drops what lies before the period (a rolling window: the buckets out of it) for
    /// the current bucket starting at `start`.
    fn roll(&mut self, period: Period, start: i64) {
        let before = self.buckets.len();
        match period {
            Period::Rolling(window) => {
                let size = bucket_size(window);
                let first = start - size * (i64::try_from(ROLLING_BUCKETS).unwrap_or(24) - 1);
                self.buckets.retain(|(s, _)| *s >= first && *s <= start);
                if self.extra > 0 && self.extra_start < first {
                    self.extra = 0;
                    self.dirty = true;
                }
            }
            _ => {
                self.buckets.retain(|(s, _)| *s == start);
                if self.extra > 0 && self.extra_start != start {
                    self.extra = 0;
                    self.dirty = true;
                }
            }
        }
        self.dirty |= before != self.buckets.len();
    }

    fn add(&mut self, start: i64, n: u64) {
        if n == 0 {
            return;
        }
        match self.buckets.iter_mut().find(|(s, _)| *s == start) {
            Some((_, b)) => *b = b.saturating_add(n),
            None => self.buckets.push((start, n)),
        }
        self.delta = self.delta.saturating_add(n);
        self.dirty = true;
    }

    fn used(&self) -> u64 {
        self.buckets.iter().fold(0, |a, (_, b)| a.saturating_add(*b))
    }
}

/// The quotas, the usage of each (quota, user), and what the keeper last read of each
/// user's counters.
pub(crate) struct Table {
    quotas: Vec<Quota>,
    tz: TimeZone,
    accounts: HashMap<(Box<str>, Box<str>), Account>,
    /// Each user's counters as last read: (up, down).
    seen: HashMap<Box<str>, (u64, u64)>,
    /// Each user's groups (from the users in force).
    groups: HashMap<String, Vec<String>>,
    /// The users' shared counters, as found.
    users: HashMap<Box<str>, Arc<UserTraffic>>,
    /// Usage is shared through Redis (`remote`): the deltas are the Redis sync's to take,
    /// and every user of the policy has an account (refused from its first request here
    /// when the fleet used its quota up).
    remote: bool,
    /// Redis is unreachable and `on_state_loss = "deny"`: every user with a quota is
    /// refused with this text until it returns.
    lost: Option<Arc<str>>,
}

impl Table {
    pub(crate) fn new(quotas: &[QuotaConfig], tz: TimeZone) -> Table {
        Table {
            quotas: quotas.iter().map(Quota::of).collect(),
            tz,
            accounts: HashMap::new(),
            seen: HashMap::new(),
            groups: HashMap::new(),
            users: HashMap::new(),
            remote: false,
            lost: None,
        }
    }

    /// A reload: quotas changed apply at the next look (`tick`), usage of a quota that
    /// is gone is dropped.
    pub(crate) fn configure(
        &mut self,
        quotas: &[QuotaConfig],
        tz: TimeZone,
        groups: HashMap<String, Vec<String>>,
    ) {
        self.quotas = quotas.iter().map(Quota::of).collect();
        self.tz = tz;
        self.groups = groups;
        let names: Vec<&str> = self.quotas.iter().map(|q| &*q.name).collect();
        self.accounts.retain(|(q, _), _| names.contains(&&**q));
    }

    /// Takes stored usage in (at start), for the quotas configured.
    pub(crate) fn restore(&mut self, usage: Vec<Usage>) {
        for u in usage {
            if !self.quotas.iter().any(|q| *q.name == u.quota) {
                continue;
            }
            let a = Account {
                buckets: u.buckets,
                extra: u.extra,
                extra_start: u.extra_start,
                ..Account::default()
            };
            self.accounts.insert((u.quota.into(), u.user.into()), a);
        }
    }

    /// Every user the keeper looks at: those with counters, and those with stored usage
    /// (their counters made, so that a user over quota is refused from the first request).
    fn refresh_users(&mut self, traffic: &Traffic) {
        for (user, t) in traffic.entries() {
            self.users.entry(user).or_insert(t);
        }
        if self.remote {
            let wanted: Vec<Box<str>> = self
                .groups
                .iter()
                .filter(|(u, g)| {
                    !self.users.contains_key(u.as_str())
                        && self.quotas.iter().any(|q| q.applies(u, g))
                })
                .map(|(u, _)| u.as_str().into())
                .collect();
            // Past `MAX_TRAFFIC_USERS` a user has no counters of its own: no quota acts
            // on the shared ones.
            for user in wanted {
                let Some(t) = traffic.own(&user) else { continue };
                self.users.insert(user, t);
            }
        }
        let missing: Vec<Box<str>> = self
            .accounts
            .keys()
            .filter(|(_, u)| !self.users.contains_key(u))
            .map(|(_, u)| u.clone())
            .collect();
        for user in missing {
            let Some(t) = traffic.own(&user) else { continue };
            self.users.insert(user, t);
        }
    }

    /// One look: what each user moved since the last one, added to its quotas' current
    /// periods; periods rolled over; each user's flag set.
    pub(crate) fn tick(&mut self, now: Timestamp, traffic: &Traffic) {
        self.refresh_users(traffic);
        let none = Vec::new();
        for (user, t) in &self.users {
            let (up, down) = t.get();
            let (pu, pd) = self.seen.insert(user.clone(), (up, down)).unwrap_or((0, 0));
            let (du, dd) = (up.saturating_sub(pu), down.saturating_sub(pd));
            let groups = self.groups.get(&**user).unwrap_or(&none);
            let mut verdict: Option<(bool, Arc<str>)> = None;
            let mut any = false;
            for q in &self.quotas {
                if !q.applies(user, groups) {
                    continue;
                }
                any = true;
                let (start, next) = bucket(q.period, &self.tz, now);
                let key = (q.name.clone(), user.clone());
                let a = self.accounts.entry(key).or_default();
                a.roll(q.period, start);
                a.add(start, q.bytes_of(du, dd));
                let (used, limit) = (a.used(), q.bytes.saturating_add(a.extra));
                if used >= limit {
                    let resets = resets_at(q, a, next, &self.tz);
                    let close = q.close || verdict.as_ref().is_some_and(|v| v.0);
                    let text = verdict.map(|v| v.1).unwrap_or_else(|| {
                        format!("quota \"{}\" used up ({limit} bytes); resets {resets}", q.name)
                            .into()
                    });
                    verdict = Some((close, text));
                }
            }
            if let (None, true, Some(lost)) = (&verdict, any, &self.lost) {
                verdict = Some((false, lost.clone()));
            }
            let text = verdict.as_ref().map(|v| v.1.clone());
            if t.set_quota(verdict) {
                match text {
                    Some(text) => tracing::info!("user {user}: {text}; refused until then"),
                    None => tracing::info!("user {user}: within its quotas"),
                }
            }
        }
    }

    /// (quota, used, limit, resets at) of each quota of `user`.
    pub(crate) fn usage(&self, user: &str, now: Timestamp) -> Vec<(String, u64, u64, String)> {
        let none = Vec::new();
        let groups = self.groups.get(user).unwrap_or(&none);
        let mut out = Vec::new();
        for q in self.quotas.iter().filter(|q| q.applies(user, groups)) {
            let (start, next) = bucket(q.period, &self.tz, now);
            let mut a =
                self.accounts.get(&(q.name.clone(), user.into())).cloned().unwrap_or_default();
            a.roll(q.period, start);
            let limit = q.bytes.saturating_add(a.extra);
            out.push((q.name.to_string(), a.used(), limit, resets_at(q, &a, next, &self.tz)));
        }
        out
    }

    /// Forgets `user`'s usage of `quota` (of every quota: None) in the current period.
    pub(crate) fn reset(&mut self, user: &str, quota: Option<&str>) -> bool {
        let mut found = false;
        for ((q, u), a) in self.accounts.iter_mut() {
            if &**u == user && quota.is_none_or(|name| name == &**q) {
                a.buckets.clear();
                a.extra = 0;
                a.delta = 0;
                a.extra_delta = 0;
                a.epoch = a.epoch.wrapping_add(1);
                a.dirty = true;
                found = true;
            }
        }
        found
    }

    /// Allows `user` `bytes` more of `quota` in the current period only.
    pub(crate) fn top_up(&mut self, user: &str, quota: &str, bytes: u64, now: Timestamp) -> bool {
        let Some(q) = self.quotas.iter().find(|q| &*q.name == quota) else { return false };
        let (start, _) = bucket(q.period, &self.tz, now);
        let a = self.accounts.entry((q.name.clone(), user.into())).or_default();
        a.roll(q.period, start);
        if a.extra_start != start {
            a.extra = 0;
        }
        a.extra = a.extra.saturating_add(bytes);
        a.extra_delta = a.extra_delta.saturating_add(bytes);
        a.extra_start = start;
        a.dirty = true;
        true
    }

    /// (quota, user, used, limit, exceeded) of every account, for the metrics.
    pub(crate) fn metrics(&self, now: Timestamp) -> Vec<(String, String, u64, u64, bool)> {
        let mut out = Vec::new();
        for ((qname, user), a) in &self.accounts {
            let Some(q) = self.quotas.iter().find(|q| q.name == *qname) else { continue };
            let (start, _) = bucket(q.period, &self.tz, now);
            let mut a = a.clone();
            a.roll(q.period, start);
            let (used, limit) = (a.used(), q.bytes.saturating_add(a.extra));
            out.push((qname.to_string(), user.to_string(), used, limit, used >= limit));
        }
        out.sort();
        out
    }

    /// Every account, with what each gained since the last flush; marked clean.
    fn take_all(&mut self) -> Vec<Usage> {
        let mut out = Vec::with_capacity(self.accounts.len());
        for ((q, u), a) in self.accounts.iter_mut() {
            out.push(Usage {
                quota: q.to_string(),
                user: u.to_string(),
                buckets: a.buckets.clone(),
                extra: a.extra,
                extra_start: a.extra_start,
                delta: a.delta,
            });
            a.dirty = false;
            if !self.remote {
                a.delta = 0;
                a.extra_delta = 0;
            }
        }
        out.sort_by(|a, b| (&a.quota, &a.user).cmp(&(&b.quota, &b.user)));
        out
    }
}

/// When a used-up quota lets the user in again: the next period (calendar), or when its
/// oldest bucket leaves the window (rolling), as RFC 3339 in the configured zone.
fn resets_at(q: &Quota, a: &Account, next: i64, tz: &TimeZone) -> String {
    let at = match q.period {
        Period::Rolling(window) => {
            let oldest = a.buckets.iter().map(|(s, _)| *s).min().unwrap_or(next);
            oldest + bucket_size(window) * i64::try_from(ROLLING_BUCKETS).unwrap_or(24)
        }
        _ => next,
    };
    match Timestamp::from_second(at) {
        Ok(ts) => ts.to_zoned_datetime(tz.clone()).strftime("%Y-%m-%dT%H:%M:%S%:z").to_string(),
        Err(_) => at.to_string(),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The current time, injectable for tests.
pub(crate) type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

struct Shared {
    table: Mutex<Table>,
    traffic: Arc<Traffic>,
    backend: Option<Backend>,
    clock: Clock,
    flush_interval: Mutex<Duration>,
    /// (stop asked, handed over: a takeover's new process writes the store from now,
    /// poked: a reset or top-up for Redis to sync now).
    stop: Mutex<(bool, bool, bool)>,
    /// The Redis client, until the keeper's thread takes it.
    fleet: Mutex<Option<redis::Fleet>>,
    /// Whether usage is shared through Redis.
    remote: bool,
    /// Resets not yet made in Redis: (user, one quota or all).
    resets: Mutex<Vec<(String, Option<String>)>>,
    wake: Condvar,
}

/// The quota keeper: the table, and the `rustle-quota` thread that keeps it.
pub(crate) struct Keeper {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// How often the keeper looks at the counters.
const TICK: Duration = Duration::from_secs(1);

impl Keeper {
    /// The keeper of `cfg`'s quotas, usage loaded from the store; its thread starts once
    /// there are quotas (`configure` may start it later).
    pub(crate) fn start(
        cfg: &crate::config::Config,
        traffic: Arc<Traffic>,
        groups: HashMap<String, Vec<String>>,
    ) -> anyhow::Result<Keeper> {
        Keeper::start_with_clock(cfg, traffic, groups, Arc::new(Timestamp::now))
    }

    pub(crate) fn start_with_clock(
        cfg: &crate::config::Config,
        traffic: Arc<Traffic>,
        groups: HashMap<String, Vec<String>>,
        clock: Clock,
    ) -> anyhow::Result<Keeper> {
        let problems = crate::config::quota_problems(&cfg.quotas);
        if !problems.is_empty() {
            anyhow::bail!("{}", problems.join("\n"));
        }
        let tz = zone(&cfg.state.time_zone)?;
        let mut table = Table::new(&cfg.quotas, tz);
        table.groups = groups;
        let fleet = match cfg.state.redis() {
            Some(r) => Some(redis::Fleet::connect(&r).map_err(|e| anyhow::anyhow!("{e}"))?),
            None => None,
        };
        table.remote = fleet.is_some();
        let backend = cfg.state.path.as_ref().map(|p| Backend::File(file::File::new(p.clone())));
        if let Some(b) = &backend {
            let usage = b.load().map_err(|e| anyhow::anyhow!("[state] path: {e}"))?;
            table.restore(usage);
        }
        table.tick(clock(), &traffic);
        let keeper = Keeper {
            shared: Arc::new(Shared {
                table: Mutex::new(table),
                traffic,
                backend,
                clock,
                flush_interval: Mutex::new(cfg.state.flush_interval),
                stop: Mutex::new((false, false, false)),
                remote: fleet.is_some(),
                fleet: Mutex::new(fleet),
                resets: Mutex::new(Vec::new()),
                wake: Condvar::new(),
            }),
            thread: Mutex::new(None),
        };
        if !cfg.quotas.is_empty() {
            keeper.spawn()?;
        }
        Ok(keeper)
    }

    fn spawn(&self) -> std::io::Result<()> {
        let mut thread = lock(&self.thread);
        if thread.is_some() {
            return Ok(());
        }
        let shared = self.shared.clone();
        *thread = Some(
            std::thread::Builder::new().name("rustle-quota".into()).spawn(move || run(&shared))?,
        );
        Ok(())
    }

    /// A reload: the quotas, zone and flush interval of `cfg`, in force at once.
    pub(crate) fn configure(
        &self,
        cfg: &crate::config::Config,
        groups: HashMap<String, Vec<String>>,
    ) -> Result<(), String> {
        let problems = crate::config::quota_problems(&cfg.quotas);
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        let tz = zone(&cfg.state.time_zone).map_err(|e| e.to_string())?;
        {
            let mut table = lock(&self.shared.table);
            table.configure(&cfg.quotas, tz, groups);
            table.tick((self.shared.clock)(), &self.shared.traffic);
        }
        *lock(&self.shared.flush_interval) = cfg.state.flush_interval;
        if !cfg.quotas.is_empty() {
            if let Err(e) = self.spawn() {
                return Err(format!("cannot start the quota thread: {e}"));
            }
        }
        Ok(())
    }

    /// (quota, used, limit, resets at) of each of `user`'s quotas.
    pub(crate) fn usage(&self, user: &str) -> Vec<(String, u64, u64, String)> {
        lock(&self.shared.table).usage(user, (self.shared.clock)())
    }

    /// Forgets `user`'s usage of `quota` (every quota: None); false when it had none.
    pub(crate) fn reset(&self, user: &str, quota: Option<&str>) -> bool {
        let mut table = lock(&self.shared.table);
        let found = table.reset(user, quota);
        table.tick((self.shared.clock)(), &self.shared.traffic);
        drop(table);
        if self.shared.remote {
            lock(&self.shared.resets).push((user.to_string(), quota.map(str::to_string)));
            self.poke();
        }
        found
    }

    /// Wakes the thread to sync with Redis now.
    fn poke(&self) {
        lock(&self.shared.stop).2 = true;
        self.shared.wake.notify_all();
    }

    /// Whether usage is shared through Redis.
    pub(crate) fn shared(&self) -> bool {
        self.shared.remote
    }

    /// Whether a quota named `name` is configured.
    pub(crate) fn has_quota(&self, name: &str) -> bool {
        lock(&self.shared.table).quotas.iter().any(|q| &*q.name == name)
    }

    /// Allows `user` `bytes` more of `quota` for the current period; false for a quota
    /// that does not exist.
    pub(crate) fn top_up(&self, user: &str, quota: &str, bytes: u64) -> bool {
        let mut table = lock(&self.shared.table);
        let done = table.top_up(user, quota, bytes, (self.shared.clock)());
        table.tick((self.shared.clock)(), &self.shared.traffic);
        drop(table);
        if done && self.shared.remote {
            self.poke();
        }
        done
    }

    /// (quota, user, used, limit, exceeded) of every account, for `/metrics`.
    pub(crate) fn metrics(&self) -> Vec<(String, String, u64, u64, bool)> {
        lock(&self.shared.table).metrics((self.shared.clock)())
    }

    /// A takeover hands over: usage is written now, and from now on by the new process
    /// only (what this one's draining connections move after it is not kept).
    pub(crate) fn hand_over(&self) {
        flush(&self.shared, true);
        lock(&self.shared.stop).1 = true;
    }

    /// Stops the thread, usage written a last time (unless handed over).
    pub(crate) fn stop(&self) {
        lock(&self.shared.stop).0 = true;
        self.shared.wake.notify_all();
        let thread = lock(&self.thread).take();
        match thread {
            Some(t) => {
                let _ = t.join();
            }
            None => flush(&self.shared, true),
        }
    }
}

fn zone(name: &str) -> anyhow::Result<TimeZone> {
    TimeZone::get(name).map_err(|e| anyhow::anyhow!("[state] time_zone {name:?}: {e}"))
}

/// Looks, then writes the usage when something changed (always when `last`); nothing
/// once handed over or without a store.
fn flush(shared: &Shared, last: bool) {
    let usage = {
        let mut table = lock(&shared.table);
        table.tick((shared.clock)(), &shared.traffic);
        if lock(&shared.stop).1 || shared.backend.is_none() {
            return;
        }
        if !last && !table.accounts.values().any(|a| a.dirty) {
            return;
        }
        table.take_all()
    };
    if let Some(backend) = &shared.backend {
        if let Err(e) = backend.flush(&usage) {
            tracing::warn!("quota usage not saved: {e}");
        }
    }
}

/// The keeper thread: a look every second (with Redis, a sync with it), a flush every
/// `flush_interval`, a last one at the stop; a reset or top-up wakes it to sync at once.
fn run(shared: &Shared) {
    let fleet = lock(&shared.fleet).take();
    let mut remote = fleet.and_then(|fleet| match remote::Remote::new(fleet) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::error!("quotas: no runtime for Redis ({e}): usage is this instance's only");
            None
        }
    });
    if let Some(r) = remote.as_mut() {
        r.sync(shared);
    }
    let mut since_flush = Duration::ZERO;
    loop {
        let flags = lock(&shared.stop);
        let (mut flags, _) = shared
            .wake
            .wait_timeout_while(flags, TICK, |s| !s.0 && !s.2)
            .unwrap_or_else(PoisonError::into_inner);
        if flags.0 {
            drop(flags);
            if let Some(r) = remote.as_mut() {
                r.sync(shared);
            }
            flush(shared, true);
            return;
        }
        let poked = std::mem::take(&mut flags.2);
        drop(flags);
        if let Some(r) = remote.as_mut() {
            r.sync(shared);
            if poked {
                continue;
            }
        }
        since_flush += TICK;
        if since_flush >= *lock(&shared.flush_interval) {
            since_flush = Duration::ZERO;
            flush(shared, false);
        } else if remote.is_none() {
            lock(&shared.table).tick((shared.clock)(), &shared.traffic);
        }
    }
}
