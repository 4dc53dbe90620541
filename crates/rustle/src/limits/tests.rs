//! Limits with simulated time (explicit `Instant`s, so the arithmetic is checked exactly),
//! plus real threads for the shared-state claims.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::AtomicBool;
use std::thread;

use super::*;

const KIB16: usize = 16 * 1024;
/// 10 Mbit/s.
const TEN_MBIT: u64 = 1_250_000;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn parse_rate_accepts() {
    let table: &[(&str, u64)] = &[
        ("10mbit", 1_250_000),
        ("10Mbit", 1_250_000),
        ("10 mbit", 1_250_000),
        ("10mbit/s", 1_250_000),
        ("512kbit", 64_000),
        ("1gbit", 125_000_000),
        ("1.5mbit", 187_500),
        ("8bit", 1),
        ("100kB", 100_000),
        ("100KB", 100_000),
        ("2MB", 2_000_000),
        ("2 MB/s", 2_000_000),
        ("1GB", 1_000_000_000),
        ("64KiB", 65_536),
        ("1MiB", 1_048_576),
        ("0.5MB", 500_000),
        ("123", 123),
        ("123B", 123),
        (" 42 ", 42),
        ("10tbit", 1_250_000_000_000),
    ];
    for &(s, want) in table {
        assert_eq!(parse_rate(s), Ok(want), "{s:?}");
    }
}

#[test]
fn parse_rate_refuses_with_reasons() {
    let table: &[(&str, &str)] = &[
        ("", "empty"),
        ("   ", "empty"),
        ("mbit", "does not start with a number"),
        ("-1mbit", "does not start with a number"),
        ("1.2.3mbit", "not a number"),
        (".mbit", "not a number"),
        ("0", "zero"),
        ("0.0mbit", "zero"),
        ("1bit", "less than 1 byte"),
        ("10mb", "ambiguous; write mbit for bits or MB for bytes"),
        ("10kb", "ambiguous; write kbit for bits or kB for bytes"),
        ("10Mbps", "ambiguous"),
        ("100b", "ambiguous"),
        ("10furlongs", "unknown unit \"furlongs\""),
        ("1e6", "unknown unit"),
        ("99999999999999999999999999999999999999999", "too large"),
        ("99999999999999999999TB", "too large"),
        ("1.0000000001mbit", "decimals"),
    ];
    for &(s, why) in table {
        match parse_rate(s) {
            Ok(v) => panic!("{s:?} parsed as {v}"),
            Err(e) => assert!(e.contains(why), "{s:?}: {e:?} does not say {why:?}"),
        }
    }
}

#[test]
fn defaults() {
    let b = Bucket::new(TEN_MBIT, 0);
    assert_eq!(b.burst(), 125_000);
    assert_eq!(b.chunk(), KIB16 as u64);
    let slow = Bucket::new(1_000, 0);
    assert_eq!(slow.burst(), 16 * 1024, "the burst is at least 16 KiB");
    assert_eq!(slow.chunk(), 20, "a slow limit waits for 20 ms worth, not 16 KiB");
    let tiny = Bucket::new(1_000_000, 100);
    assert_eq!(tiny.chunk(), 100, "the chunk never exceeds the burst");
    assert_eq!(Bucket::new(0, 0).rate(), 1, "rate 0 is taken as 1");
}

#[test]
fn burst_at_once_then_nothing() {
    let b = Bucket::new(TEN_MBIT, 0);
    let t0 = Instant::now();
    assert_eq!(b.available(t0), 125_000);
    assert_eq!(b.take(1 << 30, t0), 125_000, "the whole burst at once");
    assert_eq!(b.take(1, t0), 0);
    assert_eq!(b.available(t0), 0);
    // Time does not run backwards for the bucket: an older `now` sees nothing either.
    assert_eq!(b.take(1, t0 - ms(5)), 0);
}

#[test]
fn rate_holds_over_five_simulated_seconds() {
    let b = Bucket::new(TEN_MBIT, 0);
    let t0 = Instant::now();
    let mut moved = 0u64;
    // Greedy 16 KiB takes, the clock ticking in 1 ms steps.
    for step in 0..=5000 {
        let now = t0 + ms(step);
        loop {
            let n = b.take(KIB16, now);
            assert!(n == 0 || n == KIB16, "whole reads at 10 Mbit/s, got {n}");
            if n == 0 {
                break;
            }
            moved += n as u64;
        }
    }
    let expected = TEN_MBIT * 5 + b.burst();
    let diff = moved.abs_diff(expected);
    assert!(diff <= expected / 20, "moved {moved}, expected {expected}");
    // Exact to within one read: what is left in the bucket is less than a read.
    assert!(diff <= KIB16 as u64, "moved {moved}, expected {expected}");
}

#[test]
fn sleeping_for_wait_paces_at_the_rate() {
    // The relay's loop: take; when refused, sleep for `wait` and take again.
    let b = Bucket::new(TEN_MBIT, 0);
    let t0 = Instant::now();
    let mut now = t0;
    let mut moved = 0u64;
    let mut sleeps = 0;
    while now < t0 + Duration::from_secs(5) {
        let n = b.take(KIB16, now);
        if n > 0 {
            moved += n as u64;
            continue;
        }
        let w = b.wait(KIB16, now);
        assert!(w > Duration::ZERO, "take refused, so there is a wait");
        // 16 KiB at 10 Mbit/s: 13.1 ms at most.
        assert!(w <= Duration::from_micros(13_108), "{w:?}");
        now += w;
        sleeps += 1;
        assert_eq!(b.take(KIB16, now), KIB16, "after the wait the read is there");
        moved += KIB16 as u64;
    }
    let elapsed = now - t0;
    let expected = (TEN_MBIT as f64 * elapsed.as_secs_f64()) as u64 + b.burst();
    assert!(moved.abs_diff(expected) <= KIB16 as u64, "moved {moved}, expected {expected}");
    assert!(sleeps > 300, "{sleeps} sleeps");
}

/// A small deterministic generator for the property tests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn wait_is_consistent_with_take() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for &(rate, burst) in &[(TEN_MBIT, 0), (1_000, 0), (8_000, 500), (3_000_000_000, 0), (7, 1)] {
        let b = Bucket::new(rate, burst);
        let mut now = Instant::now();
        for _ in 0..20_000 {
            let want = match rng.next() % 4 {
                0 => 1 + (rng.next() % 64) as usize,
                1 => KIB16,
                2 => 1 + (rng.next() % 200_000) as usize,
                _ => 0,
            };
            let w = b.wait(want, now);
            let before = b.available(now);
            let n = b.take(want, now);
            assert!(n <= want);
            assert_eq!(n > 0, w.is_zero() && want > 0, "rate {rate}: want {want}, wait {w:?}");
            if n > 0 {
                assert!(n as u64 >= (want as u64).min(b.chunk()), "at least a chunk");
                assert!(n as u64 <= before);
            } else if want > 0 {
                // Asleep for exactly `wait`, the take succeeds; a nanosecond less, not.
                if w > Duration::from_nanos(1) {
                    assert!(!b.wait(want, now + w - Duration::from_nanos(1)).is_zero());
                }
                assert!(b.wait(want, now + w).is_zero(), "rate {rate}: want {want}");
            }
            if rng.next().is_multiple_of(3) {
                let back = (rng.next() % 4096) as usize;
                b.give_back(back.min(n));
            }
            assert!(b.available(now) <= b.burst());
            now += Duration::from_nanos(rng.next() % 20_000_000);
        }
    }
}

#[test]
fn give_back() {
    let b = Bucket::new(TEN_MBIT, 0);
    let t0 = Instant::now();
    assert_eq!(b.take(KIB16, t0), KIB16);
    assert_eq!(b.available(t0), 125_000 - KIB16 as u64);
    // The read returned 1000 bytes: 15384 go back.
    b.give_back(KIB16 - 1000);
    assert_eq!(b.available(t0), 124_000);
    // Giving back never fills the bucket beyond its burst.
    b.give_back(1 << 30);
    assert_eq!(b.available(t0), 125_000);
    assert_eq!(b.take(1 << 30, t0), 125_000);

    // Drained, then everything comes back.
    b.give_back(125_000);
    assert_eq!(b.available(t0), 125_000);
    // Rounding is conservative at awkward rates: a take and a give-back of the same bytes
    // never leave more than there was.
    let odd = Bucket::new(3, 10);
    for _ in 0..1000 {
        let n = odd.take(7, t0);
        odd.give_back(n);
        assert!(odd.available(t0) <= 10);
    }
}

#[test]
fn charge_runs_into_debt() {
    // 8000 B/s, burst 16 KiB, chunk 160.
    let b = Bucket::new(8_000, 0);
    let t0 = Instant::now();
    b.charge(KIB16 + 8_000, t0);
    assert_eq!(b.available(t0), 0);
    assert_eq!(b.take(1, t0), 0);
    // One second to pay off the debt, then 20 ms for a chunk.
    assert_eq!(b.wait(KIB16, t0), ms(1020));
    assert_eq!(b.take(KIB16, t0 + ms(1019)), 0);
    assert_eq!(b.take(KIB16, t0 + ms(1020)), 160);
    // Charging a full bucket uses its tokens first.
    let full = Bucket::new(8_000, 0);
    full.charge(1000, t0);
    assert_eq!(full.available(t0), KIB16 as u64 - 1000);
    // Through a throttle: every bucket of the direction.
    let (u, l) = (Arc::new(Bucket::new(8_000, 0)), Arc::new(Bucket::new(8_000, 0)));
    let t = Throttle {
        up: Limit { user: Some(u.clone()), listener: Some(l.clone()) },
        ..Default::default()
    };
    let now = Instant::now();
    t.charge(Direction::Up, 1000, now);
    t.charge(Direction::Down, 1000, now);
    assert_eq!((u.available(now), l.available(now)), (KIB16 as u64 - 1000, KIB16 as u64 - 1000));
}

#[test]
fn slow_limit_moves_small_reads_often() {
    // 64 kbit/s: 8000 B/s, chunk 160 B, burst 16 KiB.
    let b = Bucket::new(8_000, 0);
    let t0 = Instant::now();
    assert_eq!(b.take(1 << 20, t0), KIB16);
    assert_eq!(b.wait(KIB16, t0), ms(20), "waits for 160 bytes, not 16 KiB");
    assert_eq!(b.wait(10, t0), Duration::from_micros(1250), "or for less if less is wanted");
    assert_eq!(b.take(KIB16, t0 + ms(20)), 160);
    // Over 10 simulated seconds at 20 ms steps, the rate holds.
    let mut moved = 0;
    for step in 2..=500 {
        moved += b.take(KIB16, t0 + ms(20 * step));
    }
    assert_eq!(moved, 499 * 160);
}

#[test]
fn threads_never_exceed_the_burst_at_one_instant() {
    // Simulated time frozen: four threads race for one bucket; exactly the burst goes.
    let b = Arc::new(Bucket::new(TEN_MBIT, 1_000_000));
    let now = Instant::now();
    let total: usize = (0..4)
        .map(|_| {
            let b = b.clone();
            thread::spawn(move || {
                let mut got = 0;
                loop {
                    let n = b.take(1000, now);
                    if n == 0 {
                        return got;
                    }
                    got += n;
                }
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("thread"))
        .sum();
    assert_eq!(total, 1_000_000);
}

#[test]
fn threads_in_real_time_hold_the_rate() {
    let rate = 20_000_000; // 160 Mbit/s
                           // Before the bucket is made, so that the bound below is never too tight.
    let start = Instant::now();
    let b = Arc::new(Bucket::new(rate, 0));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let (b, stop) = (b.clone(), stop.clone());
            thread::spawn(move || {
                let mut got = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Mixed sizes, and some give-backs, as relays do.
                    let want = if i % 2 == 0 { KIB16 } else { 1500 };
                    let n = b.take(want, Instant::now());
                    if n == 0 {
                        thread::yield_now();
                        continue;
                    }
                    let used = if i == 3 { n / 2 } else { n };
                    b.give_back(n - used);
                    got += used as u64;
                }
                got
            })
        })
        .collect();
    // The scenario: the threads take for a while (300 ms of the real clock the bucket
    // reads); the upper bound is measured on the elapsed time, whatever it turns out.
    thread::sleep(ms(300));
    stop.store(true, Ordering::Relaxed);
    let total: u64 = handles.into_iter().map(|h| h.join().expect("thread")).sum();
    let elapsed = start.elapsed().as_secs_f64();
    let bound = (rate as f64 * elapsed) as u64 + b.burst();
    assert!(total <= bound, "moved {total} in {elapsed:.3}s, bound {bound}");
    // Generous: even a loaded machine gets well over half the rate through.
    assert!(total as f64 >= rate as f64 * 0.3 * 0.5, "moved only {total} in {elapsed:.3}s");
}

/// A bucket at 1 GB/s (one byte a nanosecond; chunk 16 KiB), 200 kB of burst.
fn fast() -> Arc<Bucket> {
    Arc::new(Bucket::new(1_000_000_000, 200_000))
}

/// Drains `b` to exactly `available` bytes at `now`.
fn leave(b: &Bucket, available: usize, now: Instant) {
    assert_eq!(b.take(200_000 - available, now), 200_000 - available);
    assert_eq!(b.available(now), available as u64);
}

#[test]
fn throttle_takes_the_minimum_and_gives_back_the_excess() {
    let (user, listener) = (fast(), fast());
    // After both buckets were made, so that it reads on both clocks.
    let now = Instant::now();
    leave(&user, 100_000, now);
    leave(&listener, 20_000, now);
    let t = Throttle {
        up: Limit { user: Some(user.clone()), listener: Some(listener.clone()) },
        down: Limit::default(),
    };
    assert!(!t.is_unlimited());
    assert_eq!(t.take(Direction::Up, 64 * 1024, now), 20_000);
    assert_eq!(user.available(now), 80_000, "the user's bucket kept what was not moved");
    assert_eq!(listener.available(now), 0);
    // Now the listener refuses: nothing is taken from the user either.
    assert_eq!(t.take(Direction::Up, 1000, now), 0);
    assert_eq!(user.available(now), 80_000);
    // The wait is the longer one, and consistent with take.
    let w = t.wait(Direction::Up, KIB16, now);
    assert_eq!(w, listener.wait(KIB16, now));
    assert_eq!(w, Duration::from_nanos(KIB16 as u64));
    assert!(!t.wait(Direction::Up, KIB16, now + w - Duration::from_nanos(1)).is_zero());
    assert!(t.wait(Direction::Up, KIB16, now + w).is_zero());
    assert_eq!(t.take(Direction::Up, KIB16, now + w), KIB16);
    // Both refilled by 16 KiB meanwhile, and both gave 16 KiB.
    assert_eq!(user.available(now + w), 80_000);
    assert_eq!(listener.available(now + w), 0);
    // A read that came back short returns the rest to both.
    t.give_back(Direction::Up, 1000);
    assert_eq!(user.available(now + w), 81_000);
    assert_eq!(listener.available(now + w), 1000);
    // The other direction is unlimited.
    assert_eq!(t.take(Direction::Down, 1 << 30, now), 1 << 30);
    assert!(t.wait(Direction::Down, 1 << 30, now).is_zero());
    t.give_back(Direction::Down, 5);
}

#[test]
fn throttle_min_whichever_bucket_is_smaller() {
    let (user, listener) = (fast(), fast());
    let now = Instant::now();
    leave(&user, 30_000, now);
    leave(&listener, 150_000, now);
    let down = Limit { user: Some(user.clone()), listener: Some(listener.clone()) };
    let t = Throttle { up: Limit::default(), down };
    assert_eq!(t.take(Direction::Down, 1 << 20, now), 30_000);
    assert_eq!(user.available(now), 0);
    assert_eq!(listener.available(now), 120_000);
    // The second bucket below its chunk refuses, and the first gets everything back.
    user.give_back(100_000);
    assert_eq!(listener.take(120_000 - 5_000, now), 115_000);
    assert_eq!(t.take(Direction::Down, KIB16, now), 0);
    assert_eq!(user.available(now), 100_000);
    assert_eq!(listener.available(now), 5_000);
    // One bucket alone.
    let only = Throttle {
        up: Limit { user: None, listener: Some(listener.clone()) },
        down: Limit::default(),
    };
    assert_eq!(only.take(Direction::Up, 1000, now), 1000);
    assert_eq!(listener.available(now), 4_000);
}

#[test]
fn throttle_default_is_unlimited_and_small() {
    let t = Throttle::default();
    assert!(t.is_unlimited());
    assert_eq!(t.take(Direction::Up, 12345, Instant::now()), 12345);
    assert_eq!(std::mem::size_of::<Throttle>(), 4 * std::mem::size_of::<usize>());
    fn shared<T: Send + Sync>() {}
    shared::<Bucket>();
    shared::<Throttle>();
    shared::<ConnLimits>();
    shared::<Slot>();
    shared::<Traffic>();
}

#[test]
fn conn_limits_per_client() {
    let l = ConnLimits::new(Some(2), None);
    let a = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    let b = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));
    let s1 = l.acquire_client(a).expect("first");
    let s2 = l.acquire_client(a).expect("second");
    assert!(l.acquire_client(a).is_none(), "third over the limit");
    // The IPv4-mapped form is the same client.
    let mapped = IpAddr::V6(Ipv4Addr::new(192, 0, 2, 1).to_ipv6_mapped());
    assert!(l.acquire_client(mapped).is_none());
    let other = l.acquire_client(b).expect("another address");
    assert_eq!(l.client_count(a), 2);
    assert_eq!(l.tracked(), (2, 0));
    drop(s1);
    assert_eq!(l.client_count(a), 1);
    let s3 = l.acquire_client(a).expect("freed by the drop");
    assert!(l.acquire_client(a).is_none());
    // Users are not limited here: always a slot, nothing counted.
    let u = l.acquire_user("alice").expect("no user limit");
    assert_eq!(l.tracked(), (2, 0));
    drop((s2, s3, other, u));
    assert_eq!(l.tracked(), (0, 0), "the map shrinks back to empty");
    assert_eq!(l.client_count(a), 0);
}

#[test]
fn conn_limits_per_user() {
    let l = ConnLimits::new(None, Some(1));
    let alice = l.acquire_user("alice").expect("alice");
    assert!(l.acquire_user("alice").is_none());
    let bob = l.acquire_user("bob").expect("bob");
    let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let clients: Vec<_> =
        (0..100).map(|_| l.acquire_client(v6).expect("no client limit")).collect();
    assert_eq!(l.tracked(), (0, 2));
    assert_eq!(l.user_count("alice"), 1);
    drop(alice);
    assert_eq!(l.tracked(), (0, 1));
    let again = l.acquire_user("alice").expect("freed");
    drop((again, bob, clients));
    assert_eq!(l.tracked(), (0, 0));
    // A limit of 0 refuses everything and leaves nothing behind.
    let none = ConnLimits::new(Some(0), Some(0));
    assert!(none.acquire_client(v6).is_none());
    assert!(none.acquire_user("alice").is_none());
    assert_eq!(none.tracked(), (0, 0));
}

#[test]
fn conn_limits_across_threads() {
    let l = ConnLimits::new(Some(3), Some(5));
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let peak = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (l, peak) = (l.clone(), peak.clone());
            thread::spawn(move || {
                for _ in 0..2000 {
                    let c = l.acquire_client(ip);
                    let u = l.acquire_user("carol");
                    peak.fetch_max(l.client_count(ip) as u64, Ordering::Relaxed);
                    assert!(l.client_count(ip) <= 3 && l.user_count("carol") <= 5);
                    // Slots may be dropped on another thread than the one that took them.
                    thread::spawn(move || drop((c, u))).join().expect("drop thread");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    assert!(peak.load(Ordering::Relaxed) <= 3);
    assert_eq!(l.tracked(), (0, 0));
}

#[test]
fn traffic_counters_and_snapshot() {
    let t = Traffic::new();
    let bob = t.entry("bob");
    let alice = t.entry("alice");
    assert!(Arc::ptr_eq(&bob, &t.entry("bob")), "one entry per user");
    bob.add(Direction::Up, 10);
    bob.add(Direction::Down, 2000);
    alice.up.fetch_add(7, Ordering::Relaxed);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let t = t.clone();
            thread::spawn(move || {
                let e = t.entry("alice");
                for _ in 0..10_000 {
                    e.add(Direction::Down, 3);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    assert_eq!(alice.get(), (7, 120_000));
    assert_eq!(
        t.snapshot(),
        vec![("alice".to_string(), 7, 120_000), ("bob".to_string(), 10, 2000)]
    );
}

#[test]
fn traffic_keeps_at_most_max_users_and_counts_the_rest_together() {
    let t = Traffic::new();
    for i in 0..MAX_TRAFFIC_USERS {
        t.entry(&format!("u{i}")).add(Direction::Up, 1);
    }
    let late = t.entry("one-too-many");
    late.add(Direction::Down, 5);
    t.entry("another").add(Direction::Down, 6);
    assert!(Arc::ptr_eq(&late, &t.entry("another")), "the rest share one entry");
    let snap = t.snapshot();
    assert_eq!(snap.len(), MAX_TRAFFIC_USERS + 1);
    assert_eq!(snap.last(), Some(&(OTHER_USERS.to_string(), 0, 11)));
    // A user with counters keeps them.
    assert_eq!(t.entry("u7").get(), (1, 0));
    // Quotas and cuts act on a user's own counters only, never the shared ones.
    assert!(t.own("another").is_none());
    assert!(t.own("u7").is_some_and(|u| u.get() == (1, 0)));
}

/// The relay's loop on tokio's paused clock: five seconds of a 10 Mbit/s limit pass as
/// fast as the machine runs the loop, and the bytes moved, with what is left in the bucket,
/// are what the time earned plus the burst.
#[tokio::test(start_paused = true)]
async fn a_throttled_loop_on_paused_time_paces_at_the_rate() {
    let b = Bucket::new(TEN_MBIT, 0);
    let t0 = now();
    let mut moved = 0u64;
    let mut pauses = 0;
    while now() < t0 + Duration::from_secs(5) {
        let n = b.take(KIB16, now());
        if n > 0 {
            moved += n as u64;
            continue;
        }
        tokio::time::sleep(b.wait(KIB16, now())).await;
        pauses += 1;
    }
    let elapsed = now() - t0;
    // Paused time moves only to the timers' deadlines: no further than the last pause.
    assert!(elapsed < Duration::from_secs(5) + ms(20), "{elapsed:?}");
    let earned = u128::from(TEN_MBIT) * elapsed.as_nanos() / 1_000_000_000;
    let expected = u64::try_from(earned).expect("fits") + b.burst();
    let left = b.available(now());
    // The loop takes whatever is there, except after its last pause, which tokio's timer
    // (millisecond resolution) may have made up to 1 ms longer than asked.
    assert!(left < KIB16 as u64 + TEN_MBIT / 1000, "{left} left");
    // Rounding: each take costs whole nanoseconds, rounded up.
    let total = moved + left;
    assert!(
        total <= expected && expected - total <= 2,
        "moved {moved} + {left}, expected {expected}"
    );
    assert!(pauses > 300, "{pauses} pauses");
}

/// A bucket made on paused time starts its clock there: nothing refills until the test
/// moves the clock, and then exactly what the time earned does.
#[tokio::test(start_paused = true)]
async fn a_bucket_refills_only_as_paused_time_advances() {
    let b = Bucket::new(1_000, 1_000);
    assert_eq!(b.take(5_000, now()), 1_000);
    assert_eq!(b.take(1, now()), 0);
    assert_eq!(b.wait(1, now()), ms(1));
    tokio::task::yield_now().await;
    assert_eq!(b.available(now()), 0, "no time passed");
    tokio::time::advance(ms(250)).await;
    assert_eq!(b.available(now()), 250);
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(b.available(now()), 1_000, "never more than the burst");
}

#[test]
fn the_fleets_other_connections_count_against_a_users_limit() {
    let l = ConnLimits::new(None, Some(2));
    let others = |n: usize| HashMap::from([("alice".to_string(), n)]);
    l.set_others(&others(1));
    let one = l.acquire_user("alice").expect("1 here + 1 elsewhere");
    assert!(l.acquire_user("alice").is_none(), "the fleet is at 2");
    assert!(l.acquire_user("bob").is_some(), "another user");
    assert_eq!(l.user_counts(), vec![("alice".into(), 1)]);
    // The fleet's counts gone (Redis down, serving alone): only the local one counts.
    l.set_others(&HashMap::new());
    let two = l.acquire_user("alice").expect("alone: 2 here");
    drop((one, two));
    assert_eq!(l.tracked(), (0, 0));
    assert!(l.user_counts().is_empty());
    // A user known only from the fleet, at its limit there, is refused here.
    l.set_others(&others(2));
    assert!(l.acquire_user("alice").is_none());
    l.set_others(&HashMap::new());
    assert_eq!(lock(&l.users).len(), 0, "entries of the fleet's users leave with them");
}
