//! Property tests of the byte bucket on simulated time (explicit instants): whatever the
//! sequence of takes, give-backs and pauses, a bucket never grants more than
//! `rate * elapsed + burst`, a caller that waits as `wait` says gets at least that less one
//! read, and `wait` is zero exactly when `take` would grant; a user's and a listener's
//! bucket together never grant more than either alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::{Bucket, Limit};

fn config() -> ProptestConfig {
    ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() }
}

/// One step of a caller.
#[derive(Debug, Clone)]
enum Op {
    /// Let this many nanoseconds pass.
    Pass(u64),
    /// Ask for this many bytes; give back this share (in 256ths) of what was granted.
    Take(usize, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..50_000_000).prop_map(Op::Pass),
        (1usize..100_000, any::<u8>()).prop_map(|(want, back)| Op::Take(want, back)),
    ]
}

/// Rates from 1 B/s to 10 GB/s, bursts of 1 B to 16 MB or the default (0).
fn bucket() -> impl Strategy<Value = (u64, u64)> {
    let rate = prop_oneof![1u64..1_000, 1_000u64..10_000_000, 10_000_000u64..10_000_000_000];
    let burst = prop_oneof![Just(0u64), 1u64..16_000_000];
    (rate, burst)
}

/// `rate * elapsed`, in bytes, rounded up.
fn earned(rate: u64, elapsed: Duration) -> u128 {
    (u128::from(rate) * elapsed.as_nanos()).div_ceil(1_000_000_000)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn never_more_than_the_rate_over_the_time_plus_the_burst(
        (rate, burst) in bucket(), ops in proptest::collection::vec(op(), 1..200)
    ) {
        let b = Bucket::new(rate, burst);
        let t0 = Instant::now();
        let mut now = t0;
        let mut moved: u128 = 0;
        for op in ops {
            match op {
                Op::Pass(ns) => now += Duration::from_nanos(ns),
                Op::Take(want, back) => {
                    let n = b.take(want, now);
                    prop_assert!(n <= want);
                    prop_assert!(n == 0 || n >= want.min(b.chunk() as usize), "{} of {}", n, want);
                    let returned = n * usize::from(back) / 256;
                    b.give_back(returned);
                    moved += (n - returned) as u128;
                    let bound = earned(rate, now - t0) + u128::from(b.burst());
                    prop_assert!(moved <= bound, "moved {} > bound {}", moved, bound);
                }
            }
        }
    }

    #[test]
    fn a_caller_that_waits_as_told_gets_the_rate(
        (rate, burst) in bucket(), want in 1usize..100_000, millis in 1u64..3_000
    ) {
        let b = Bucket::new(rate, burst);
        // At most about 20,000 takes (small reads at a high rate are many).
        let cap = 20_000 * (want as u64).min(b.chunk()) * 1_000 / rate;
        let t0 = Instant::now();
        let end = t0 + Duration::from_millis(millis.min(cap.max(1)));
        let mut now = t0;
        let (mut moved, mut takes): (u128, u128) = (0, 0);
        loop {
            let n = b.take(want, now);
            if n > 0 {
                moved += n as u128;
                takes += 1;
                continue;
            }
            let w = b.wait(want, now);
            prop_assert!(w > Duration::ZERO, "refused, yet no wait");
            if now + w > end {
                break;
            }
            now += w;
        }
        // What the time earned and the burst, less what is still in the bucket (under one
        // read) and a nanosecond of rounding per take.
        let expected = earned(rate, now - t0) + u128::from(b.burst());
        let slack = want as u128 + takes * (u128::from(rate) / 1_000_000_000 + 1);
        prop_assert!(moved + slack >= expected, "moved {} of {} (slack {})", moved, expected, slack);
    }

    #[test]
    fn wait_is_zero_exactly_when_take_grants(
        (rate, burst) in bucket(), ops in proptest::collection::vec(op(), 1..100),
        want in 1usize..100_000
    ) {
        let b = Bucket::new(rate, burst);
        let mut now = Instant::now();
        for op in ops {
            match op {
                Op::Pass(ns) => now += Duration::from_nanos(ns),
                Op::Take(n, _) => {
                    b.take(n, now);
                }
            }
            let w = b.wait(want, now);
            prop_assert_eq!(w.is_zero(), b.available(now) >= (want as u64).min(b.chunk()));
            // After waiting that long, with nobody else taking, the take grants.
            prop_assert!(b.take(want, now + w) > 0);
        }
    }

    #[test]
    fn two_buckets_never_grant_more_than_either_alone(
        (r1, b1) in bucket(), (r2, b2) in bucket(),
        ops in proptest::collection::vec(op(), 1..200)
    ) {
        let user = Arc::new(Bucket::new(r1, b1));
        let listener = Arc::new(Bucket::new(r2, b2));
        let limit = Limit { user: Some(user.clone()), listener: Some(listener.clone()) };
        let t0 = Instant::now();
        let mut now = t0;
        let mut moved: u128 = 0;
        for op in ops {
            match op {
                Op::Pass(ns) => now += Duration::from_nanos(ns),
                Op::Take(want, back) => {
                    let n = limit.take(want, now);
                    prop_assert!(n <= want);
                    let returned = n * usize::from(back) / 256;
                    limit.give_back(returned);
                    moved += (n - returned) as u128;
                    for (rate, b) in [(r1, &user), (r2, &listener)] {
                        let bound = earned(rate, now - t0) + u128::from(b.burst());
                        prop_assert!(moved <= bound, "moved {} > bound {}", moved, bound);
                    }
                    if n == 0 {
                        // Refused: `wait` says so, and after it the take grants.
                        let w = limit.wait(want, now);
                        prop_assert!(w > Duration::ZERO);
                        let later = limit.take(want, now + w);
                        prop_assert!(later > 0);
                        limit.give_back(later);
                    }
                }
            }
        }
    }
}
