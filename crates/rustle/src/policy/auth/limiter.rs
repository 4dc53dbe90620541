//! A limit on failed authentication attempts per client, so that guessing passwords is
//! slow and cannot keep the hashing threads busy.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::time::Instant;

/// Tokens are counted in units of 1/60e9, so that refilling `per_minute` tokens a minute
/// adds exactly `per_minute` units a nanosecond: integer arithmetic, no rounding.
const UNITS_PER_TOKEN: u128 = 60_000_000_000;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// In units, as of `at`.
    units: u128,
    at: Instant,
}

/// Failed-attempt rate limit per client address: a token bucket of `burst` failures,
/// refilled at `per_minute` a minute. Once a client's bucket is empty, `allowed` is false
/// and the proxy answers 407 without checking the password. IPv6 clients are counted per
/// /64, the block one subscriber usually holds; IPv4-mapped IPv6 addresses as IPv4.
///
/// At most `max` clients are tracked: a client whose bucket is full again is forgotten
/// (it is the same as untracked), and when the table is full of clients still limited the
/// one that failed longest ago goes. One per worker, no locks.
#[derive(Debug)]
pub(crate) struct FailureLimiter {
    capacity: u128,
    per_minute: u128,
    max: usize,
    buckets: HashMap<IpAddr, Bucket>,
}

impl FailureLimiter {
    /// `burst` is at least 1 (0 would lock out every client after its first failure).
    /// `per_minute` 0 means no refill: a client that used up its burst stays blocked until
    /// pushed out of the table.
    pub(crate) fn new(burst: u32, per_minute: u32, max: usize) -> Self {
        FailureLimiter {
            capacity: u128::from(burst.max(1)) * UNITS_PER_TOKEN,
            per_minute: u128::from(per_minute),
            max,
            buckets: HashMap::new(),
        }
    }

    /// Whether a failure from `ip` may still be checked: false once its burst is used up
    /// and not yet refilled.
    pub(crate) fn allowed(&mut self, ip: IpAddr, now: Instant) -> bool {
        match self.buckets.get(&client(ip)) {
            Some(bucket) => self.level(bucket, now) >= UNITS_PER_TOKEN,
            None => true,
        }
    }

    /// Whether `ip` has failed recently: its bucket is not full (a full one is forgotten).
    pub(crate) fn has_failed(&self, ip: IpAddr) -> bool {
        self.buckets.contains_key(&client(ip))
    }

    /// Counts an attempt from `ip` as failed before it is checked, if its bucket has a
    /// token left: false (and nothing taken) when it has none. Attempts made at once thus
    /// see each other: no more than the bucket holds are checked, however many arrive
    /// together. A success then gives the token back (`give_back`).
    pub(crate) fn reserve(&mut self, ip: IpAddr, now: Instant) -> bool {
        if !self.allowed(ip, now) {
            return false;
        }
        self.record_failure(ip, now);
        true
    }

    /// Returns the token a `reserve` took, for an attempt that succeeded; a bucket full
    /// again is forgotten.
    pub(crate) fn give_back(&mut self, ip: IpAddr, now: Instant) {
        let key = client(ip);
        let Some(bucket) = self.buckets.get(&key) else { return };
        let units = self.level(bucket, now).saturating_add(UNITS_PER_TOKEN);
        if units >= self.capacity {
            self.buckets.remove(&key);
        } else {
            self.buckets.insert(key, Bucket { units, at: now });
        }
    }

    /// Takes one token from `ip`'s bucket.
    pub(crate) fn record_failure(&mut self, ip: IpAddr, now: Instant) {
        if self.max == 0 {
            return;
        }
        let key = client(ip);
        if let Some(bucket) = self.buckets.get(&key) {
            let level = self.level(bucket, now);
            self.buckets
                .insert(key, Bucket { units: level.saturating_sub(UNITS_PER_TOKEN), at: now });
            return;
        }
        if self.buckets.len() >= self.max {
            self.make_room(now);
        }
        self.buckets.insert(key, Bucket { units: self.capacity - UNITS_PER_TOKEN, at: now });
    }

    #[cfg(test)]
    /// How many clients are tracked.
    pub(crate) fn len(&self) -> usize {
        self.buckets.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    fn level(&self, bucket: &Bucket, now: Instant) -> u128 {
        let elapsed = now.saturating_duration_since(bucket.at).as_nanos();
        bucket.units.saturating_add(elapsed.saturating_mul(self.per_minute)).min(self.capacity)
    }

    /// Forgets clients whose bucket has refilled, then, if still full, the one whose last
    /// failure is oldest. Linear, but only when the table is full.
    fn make_room(&mut self, now: Instant) {
        let (capacity, per_minute) = (self.capacity, self.per_minute);
        self.buckets.retain(|_, b| {
            let elapsed = now.saturating_duration_since(b.at).as_nanos();
            b.units.saturating_add(elapsed.saturating_mul(per_minute)) < capacity
        });
        if self.buckets.len() >= self.max {
            let oldest = self.buckets.iter().min_by_key(|(_, b)| b.at).map(|(ip, _)| *ip);
            if let Some(oldest) = oldest {
                self.buckets.remove(&oldest);
            }
        }
    }
}

/// The address a client is counted under.
pub(super) fn client(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & (!0u128 << 64))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ip(s: &str) -> IpAddr {
        match s.parse() {
            Ok(ip) => ip,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    #[test]
    fn burst_then_blocked() {
        let t0 = Instant::now();
        let mut limiter = FailureLimiter::new(3, 6, 100);
        let a = ip("192.0.2.1");
        for _ in 0..3 {
            assert!(limiter.allowed(a, t0));
            limiter.record_failure(a, t0);
        }
        assert!(!limiter.allowed(a, t0));
        // Others are not affected.
        assert!(limiter.allowed(ip("192.0.2.2"), t0));
    }

    #[test]
    fn refill() {
        let t0 = Instant::now();
        // 6 a minute: one token every 10 s.
        let mut limiter = FailureLimiter::new(2, 6, 100);
        let a = ip("192.0.2.1");
        limiter.record_failure(a, t0);
        limiter.record_failure(a, t0);
        assert!(!limiter.allowed(a, t0 + Duration::from_millis(9_999)));
        assert!(limiter.allowed(a, t0 + Duration::from_secs(10)));
        limiter.record_failure(a, t0 + Duration::from_secs(10));
        assert!(!limiter.allowed(a, t0 + Duration::from_secs(10)));
        // A long pause refills to the burst, no more.
        let later = t0 + Duration::from_secs(3600);
        limiter.record_failure(a, later);
        limiter.record_failure(a, later);
        assert!(!limiter.allowed(a, later));
        // Failures while blocked do not dig deeper than empty.
        limiter.record_failure(a, later);
        assert!(limiter.allowed(a, later + Duration::from_secs(10)));
    }

    #[test]
    fn reserve_before_the_check_and_give_back_on_success() {
        let t0 = Instant::now();
        let mut limiter = FailureLimiter::new(3, 0, 100);
        let a = ip("192.0.2.1");
        // Three attempts at once take the three tokens; the fourth is refused before any
        // of them is answered.
        assert!(limiter.reserve(a, t0) && limiter.reserve(a, t0) && limiter.reserve(a, t0));
        assert!(!limiter.reserve(a, t0));
        // One succeeds: its token comes back, and one more attempt may be made.
        limiter.give_back(a, t0);
        assert!(limiter.reserve(a, t0));
        assert!(!limiter.reserve(a, t0));
        // Successes give back no more than was taken: a full bucket is forgotten.
        for _ in 0..5 {
            limiter.give_back(a, t0);
        }
        assert!(limiter.is_empty());
        limiter.give_back(ip("192.0.2.2"), t0);
        assert!(limiter.is_empty());
    }

    #[test]
    fn no_refill_and_minimum_burst() {
        let t0 = Instant::now();
        let a = ip("192.0.2.1");
        let mut limiter = FailureLimiter::new(0, 0, 100);
        assert!(limiter.allowed(a, t0));
        limiter.record_failure(a, t0);
        assert!(!limiter.allowed(a, t0 + Duration::from_secs(86_400)));
    }

    #[test]
    fn ipv6_per_64_and_mapped_v4() {
        let t0 = Instant::now();
        let mut limiter = FailureLimiter::new(1, 1, 100);
        limiter.record_failure(ip("2001:db8:1:2::1"), t0);
        assert!(!limiter.allowed(ip("2001:db8:1:2:ffff::7"), t0));
        assert!(limiter.allowed(ip("2001:db8:1:3::1"), t0));
        limiter.record_failure(ip("::ffff:192.0.2.9"), t0);
        assert!(!limiter.allowed(ip("192.0.2.9"), t0));
    }

    #[test]
    fn bounded() {
        let t0 = Instant::now();
        let mut limiter = FailureLimiter::new(1, 1, 3);
        for i in 0..10u8 {
            let at = t0 + Duration::from_millis(u64::from(i));
            limiter.record_failure(IpAddr::from([192, 0, 2, i]), at);
            assert!(limiter.len() <= 3);
        }
        let now = t0 + Duration::from_millis(10);
        // The three most recent are still limited; the oldest were forgotten.
        assert!(!limiter.allowed(ip("192.0.2.9"), now));
        assert!(!limiter.allowed(ip("192.0.2.7"), now));
        assert!(limiter.allowed(ip("192.0.2.0"), now));

        // Refilled clients are forgotten before limited ones, however recent.
        let mut limiter = FailureLimiter::new(1, 60, 2);
        limiter.record_failure(ip("192.0.2.1"), t0);
        limiter.record_failure(ip("192.0.2.2"), t0 + Duration::from_secs(5));
        // At 5.5 s, .1 (failed at 0 s, one token a second) has refilled; .2 (5 s) has not.
        let now = t0 + Duration::from_millis(5_500);
        limiter.record_failure(ip("192.0.2.3"), now);
        assert_eq!(limiter.len(), 2);
        assert!(!limiter.allowed(ip("192.0.2.2"), now));
        assert!(!limiter.allowed(ip("192.0.2.3"), now));

        let mut none = FailureLimiter::new(1, 1, 0);
        none.record_failure(ip("192.0.2.1"), t0);
        assert!(none.is_empty());
    }
}
