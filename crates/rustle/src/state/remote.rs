//! The quota keeper's side of the Redis backend: the sync its thread runs every second.
//!
//! A sync makes the resets asked for (their counters deleted), then sends what each
//! (quota, user) moved since the last sync as one batch (`Fleet::add_usage`: numbered,
//! so that a batch sent again is not counted twice) and takes the fleet's totals back as
//! the usage enforced, plus what moved locally meanwhile. A batch that fails keeps its
//! number and amounts and is sent again first at the next sync (never lost, never counted
//! twice); traffic after it goes into the next batch. While Redis is unreachable the
//! local accounts go on counting (the last totals plus local traffic), so the keeper
//! enforces on them.
//!
//! Keys besides the usage counters (`Fleet`'s `usage:{quota}:{user}:{start}`), in the
//! namespace of the empty quota name, which no quota has: a top-up's extra bytes,
//! `usage::{quota}:{user}:{start}` (per bucket, like usage), and a marker,
//! `usage:::0`, that every sync reads and that is 0 only in a Redis that lost its data
//! (restarted without persistence, or never used): the instance then raises every
//! counter to what it knows (`Fleet::raise_usage`) and sets the marker.

use std::time::Duration;

use jiff::Timestamp;

use super::redis::{Fleet, Usage, UsageKey};
use super::{bucket, bucket_size, lock, Shared, Table};
use crate::config::{OnStateLoss, Period, ROLLING_BUCKETS};

/// How long the marker lasts without a sync setting it again.
const MARKER_TTL: Duration = Duration::from_secs(400 * 86_400);

/// What a counter is kept past its period's end: another instance's clock may be a
/// little behind.
const MARGIN: i64 = 60;

/// One counter of a batch: a bucket of usage or of top-up bytes.
#[derive(Debug, Clone)]
struct Item {
    quota: Box<str>,
    user: Box<str>,
    start: i64,
    extra: bool,
    amount: u64,
    ttl: Duration,
    /// The account's reset count when the item was made: totals of an account reset
    /// since are not applied.
    epoch: u32,
}

impl Item {
    /// The key's user part: `user`, or for top-up bytes `{quota}:{user}` (both escaped,
    /// under the empty quota name).
    fn key_user(&self) -> String {
        match self.extra {
            false => self.user.to_string(),
            true => format!("{}:{}", escape(&self.quota), escape(&self.user)),
        }
    }
}

fn escape(name: &str) -> String {
    name.replace('%', "%25").replace(':', "%3A")
}

/// The usage entries of `items` (with their key parts in `parts`).
fn usages<'a>(items: &[Item], parts: &'a [(String, &'a str)]) -> Vec<Usage<'a>> {
    items
        .iter()
        .zip(parts)
        .map(|(i, (user, quota))| Usage {
            key: UsageKey { quota, user, start: u64::try_from(i.start).unwrap_or(0) },
            amount: i.amount,
            ttl: i.ttl,
        })
        .collect()
}

fn parts(items: &[Item]) -> Vec<(String, &str)> {
    items.iter().map(|i| (i.key_user(), if i.extra { "" } else { &*i.quota })).collect()
}

/// The marker's usage entry, with `amount`.
fn marker(amount: u64, ttl: Duration) -> Usage<'static> {
    Usage { key: UsageKey { quota: "", user: "", start: 0 }, amount, ttl }
}

/// The keeper thread's Redis client, its runtime and what it has not yet sent.
pub(super) struct Remote {
    rt: tokio::runtime::Runtime,
    fleet: Fleet,
    /// The next batch's number.
    batch: u64,
    /// A batch whose outcome is unknown, to send again with its number.
    pending: Option<(u64, Vec<Item>)>,
    /// Resets not yet made in Redis.
    resets: Vec<(String, Option<String>)>,
}

impl Remote {
    pub(super) fn new(fleet: Fleet) -> std::io::Result<Remote> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        Ok(Remote { rt, fleet, batch: 1, pending: None, resets: Vec::new() })
    }

    /// One sync: resets, the pending batch, this batch; the users' flags set from the
    /// result. Nothing waits for more than the client's timeouts; a failure leaves the
    /// local counts in force.
    pub(super) fn sync(&mut self, shared: &Shared) {
        self.resets.append(&mut lock(&shared.resets));
        if let Some((n, items)) = &self.pending {
            let parts = parts(items);
            if self.rt.block_on(self.fleet.add_usage(*n, &usages(items, &parts))).is_err() {
                self.failed(shared);
                return;
            }
            self.pending = None;
        }
        if !self.resets.is_empty() {
            let items = reset_items(&lock(&shared.table), &self.resets, (shared.clock)());
            for item in &items {
                let user = item.key_user();
                let quota = if item.extra { "" } else { &*item.quota };
                let key =
                    UsageKey { quota, user: &user, start: u64::try_from(item.start).unwrap_or(0) };
                if self.rt.block_on(self.fleet.delete(&key)).is_err() {
                    self.failed(shared);
                    return;
                }
            }
            self.resets.clear();
        }
        let items = {
            let mut table = lock(&shared.table);
            table.tick((shared.clock)(), &shared.traffic);
            batch(&mut table, (shared.clock)())
        };
        let n = self.batch;
        self.batch += 1;
        let parts = parts(&items);
        let mut adds = usages(&items, &parts);
        adds.push(marker(0, MARKER_TTL));
        let totals = match self.rt.block_on(self.fleet.add_usage(n, &adds)) {
            Ok(t) => t,
            Err(_) => {
                self.pending = Some((n, items));
                self.failed(shared);
                return;
            }
        };
        // A Redis without the marker lost what it had: what this instance knows (the
        // last totals plus its own traffic since, this batch's included) goes back first.
        lock(&shared.table).lost = None;
        match totals.last().copied().unwrap_or(0) {
            0 => self.raise(shared),
            _ => apply(&mut lock(&shared.table), &items, &totals),
        }
        self.tick(shared);
    }

    /// A sync that did not reach Redis: the local counts stay in force, or with
    /// `on_state_loss = "deny"` the users with a quota are refused until it returns.
    fn failed(&self, shared: &Shared) {
        if self.fleet.on_state_loss() == OnStateLoss::Deny {
            lock(&shared.table).lost.get_or_insert_with(|| {
                "quota usage unavailable: the shared state (Redis) is unreachable".into()
            });
        }
        self.tick(shared);
    }

    /// Gives a Redis that lost its data what this instance knows of the fleet's usage.
    fn raise(&mut self, shared: &Shared) {
        let items = raise_items(&lock(&shared.table), (shared.clock)());
        let parts = parts(&items);
        let mut raises = usages(&items, &parts);
        raises.push(marker(1, MARKER_TTL));
        if let Ok(totals) = self.rt.block_on(self.fleet.raise_usage(&raises)) {
            if !items.is_empty() {
                tracing::info!("quotas: Redis had no usage: {} counters given back", items.len());
            }
            apply(&mut lock(&shared.table), &items, &totals);
        }
    }

    fn tick(&self, shared: &Shared) {
        lock(&shared.table).tick((shared.clock)(), &shared.traffic);
    }
}

/// The starts of the buckets `period`'s usage counts at `now`'s bucket `start`.
fn starts(period: Period, start: i64) -> Vec<i64> {
    match period {
        Period::Rolling(window) => {
            let size = bucket_size(window);
            let n = i64::try_from(ROLLING_BUCKETS).unwrap_or(24);
            (0..n).map(|k| start - size * (n - 1 - k)).collect()
        }
        _ => vec![start],
    }
}

/// How long a counter of the bucket at `s` is kept from `now`.
fn ttl(period: Period, s: i64, next: i64, now: i64) -> Duration {
    let end = match period {
        Period::Rolling(window) => {
            s + bucket_size(window) * i64::try_from(ROLLING_BUCKETS).unwrap_or(24)
        }
        _ => next,
    };
    Duration::from_secs(u64::try_from(end - now + MARGIN).unwrap_or(1).max(1))
}

/// Every account's buckets, this sync's amounts in the current one (taken: the
/// accounts' deltas start again from 0).
fn batch(table: &mut Table, now: Timestamp) -> Vec<Item> {
    let mut out = Vec::new();
    for ((qname, user), a) in table.accounts.iter_mut() {
        let Some(q) = table.quotas.iter().find(|q| q.name == *qname) else { continue };
        let (start, next) = bucket(q.period, &table.tz, now);
        a.roll(q.period, start);
        for s in starts(q.period, start) {
            let ttl = ttl(q.period, s, next, now.as_second());
            for extra in [false, true] {
                let amount = match (s == start, extra) {
                    (true, false) => a.delta,
                    (true, true) => a.extra_delta,
                    _ => 0,
                };
                let (quota, user) = (qname.clone(), user.clone());
                out.push(Item { quota, user, start: s, extra, amount, ttl, epoch: a.epoch });
            }
        }
        a.delta = 0;
        a.extra_delta = 0;
    }
    out
}

/// What this instance knows of each counter (usage and top-ups as enforced), for a
/// Redis that lost its data.
fn raise_items(table: &Table, now: Timestamp) -> Vec<Item> {
    let mut out = Vec::new();
    for ((qname, user), a) in &table.accounts {
        let Some(q) = table.quotas.iter().find(|q| q.name == *qname) else { continue };
        let (start, next) = bucket(q.period, &table.tz, now);
        let mut item = |s: i64, extra: bool, amount: u64| {
            let ttl = ttl(q.period, s, next, now.as_second());
            let (quota, user) = (qname.clone(), user.clone());
            out.push(Item { quota, user, start: s, extra, amount, ttl, epoch: a.epoch });
        };
        for (s, v) in &a.buckets {
            item(*s, false, *v);
        }
        if a.extra > 0 {
            item(start, true, a.extra);
        }
    }
    out
}

/// The counters of the resets asked for: every bucket of the quota (or of every quota)
/// of the user, usage and top-ups.
fn reset_items(table: &Table, resets: &[(String, Option<String>)], now: Timestamp) -> Vec<Item> {
    let mut out = Vec::new();
    for (user, quota) in resets {
        for q in &table.quotas {
            if quota.as_deref().is_some_and(|name| name != &*q.name) {
                continue;
            }
            let (start, _) = bucket(q.period, &table.tz, now);
            for s in starts(q.period, start) {
                for extra in [false, true] {
                    out.push(Item {
                        quota: q.name.clone(),
                        user: user.as_str().into(),
                        start: s,
                        extra,
                        amount: 0,
                        ttl: Duration::ZERO,
                        epoch: 0,
                    });
                }
            }
        }
    }
    out
}

/// The fleet's totals of `items` (in order) made the accounts' usage, plus what moved
/// locally since the items were taken; accounts reset since are left alone.
fn apply(table: &mut Table, items: &[Item], totals: &[u64]) {
    let mut extras: std::collections::HashMap<(Box<str>, Box<str>), (u64, i64)> =
        std::collections::HashMap::new();
    for (item, &total) in items.iter().zip(totals) {
        let key = (item.quota.clone(), item.user.clone());
        let Some(a) = table.accounts.get_mut(&key) else { continue };
        if a.epoch != item.epoch {
            continue;
        }
        if item.extra {
            let e = extras.entry(key).or_insert((0, item.start));
            e.0 = e.0.saturating_add(total);
            e.1 = e.1.max(item.start);
            continue;
        }
        let current = a.buckets.iter().map(|(s, _)| *s).max().unwrap_or(item.start);
        // What moved since the batch was taken is in the account's delta, all in its
        // current bucket.
        let local = if item.start >= current { a.delta } else { 0 };
        let value = total.saturating_add(local);
        match a.buckets.iter_mut().find(|(s, _)| *s == item.start) {
            Some((_, b)) => *b = value,
            None if value > 0 => a.buckets.push((item.start, value)),
            None => {}
        }
        a.dirty = true;
    }
    for (key, (total, start)) in extras {
        if let Some(a) = table.accounts.get_mut(&key) {
            a.extra = total.saturating_add(a.extra_delta);
            a.extra_start = start;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{OnExceeded, QuotaConfig, QuotaDirection};
    use crate::limits::Traffic;
    use jiff::tz::TimeZone;

    fn table(period: Period) -> Table {
        let q = QuotaConfig {
            name: "daily".into(),
            users: vec!["ann".into()],
            groups: Vec::new(),
            bytes: 1000,
            direction: QuotaDirection::Both,
            period,
            on_exceeded: OnExceeded::Finish,
        };
        let mut t = Table::new(&[q], TimeZone::UTC);
        t.remote = true;
        t
    }

    fn now() -> Timestamp {
        "2026-12-03T12:00:00Z".parse().expect("timestamp")
    }

    #[test]
    fn a_batch_takes_the_deltas_and_the_totals_come_back_with_what_moved_since() {
        let traffic = Traffic::new();
        let mut t = table(Period::Day);
        traffic.entry("ann").add(crate::limits::Direction::Down, 300);
        t.tick(now(), &traffic);
        let items = batch(&mut t, now());
        // The day's usage and top-up counters, this instance's 300 bytes in the first.
        assert_eq!(items.len(), 2);
        assert_eq!((items[0].amount, items[0].extra, items[1].extra), (300, false, true));
        assert_eq!(items[1].key_user(), "daily:ann");
        // 200 more move during the round trip; the fleet's total is 900 (another
        // instance's 600): usage is 1100, over the quota.
        traffic.entry("ann").add(crate::limits::Direction::Down, 200);
        t.tick(now(), &traffic);
        apply(&mut t, &items, &[900, 0]);
        assert_eq!(t.usage("ann", now())[0].1, 1100);
        assert!(traffic.entry("ann").over_quota().is_none(), "flags are set at the tick");
        t.tick(now(), &traffic);
        assert!(traffic.entry("ann").over_quota().is_some());
        // The next batch sends the 200.
        assert_eq!(batch(&mut t, now())[0].amount, 200);
    }

    #[test]
    fn totals_asked_for_before_a_reset_are_not_applied_after_it() {
        let traffic = Traffic::new();
        let mut t = table(Period::Day);
        traffic.entry("ann").add(crate::limits::Direction::Up, 5000);
        t.tick(now(), &traffic);
        let items = batch(&mut t, now());
        assert!(t.reset("ann", None));
        apply(&mut t, &items, &[5000, 0]);
        assert_eq!(t.usage("ann", now())[0].1, 0);
    }

    #[test]
    fn a_rolling_window_sends_every_bucket_and_top_ups_add_up() {
        let mut t = table(Period::Rolling(Duration::from_secs(24 * 3600)));
        assert!(t.top_up("ann", "daily", 500, now()));
        let items = batch(&mut t, now());
        assert_eq!(items.len(), 48, "24 buckets, usage and top-up each");
        let hour = now().as_second() / 3600 * 3600;
        let last = items.iter().filter(|i| i.extra).max_by_key(|i| i.start).expect("items");
        assert_eq!((last.start, last.amount), (hour, 500));
        // Another instance topped up 300 in an earlier hour: the limit is 1000 + 800.
        let totals: Vec<u64> = items
            .iter()
            .map(|i| match (i.extra, i.start == hour, i.start == hour - 7200) {
                (true, true, _) => 500,
                (true, _, true) => 300,
                _ => 0,
            })
            .collect();
        apply(&mut t, &items, &totals);
        assert_eq!(t.usage("ann", now())[0].2, 1800);
    }
}
