use proptest::prelude::*;

use super::*;

const TTL: Duration = Duration::from_secs(600);

#[tokio::test(start_paused = true)]
async fn same_seed_within_the_ttl_then_a_new_one() {
    let t = Table::new(100, 10);
    let now = crate::limits::now;
    let first = t.seed("r", "alice", "", TTL, now());
    assert!(first.is_some());
    tokio::time::advance(TTL - Duration::from_millis(1)).await;
    assert_eq!(t.seed("r", "alice", "", TTL, now()), first, "within the ttl");
    tokio::time::advance(Duration::from_millis(1)).await;
    let second = t.seed("r", "alice", "", TTL, now());
    assert!(second.is_some() && second != first, "a new session after the ttl");
    // From first use: using it does not prolong it.
    tokio::time::advance(TTL / 2).await;
    assert_eq!(t.seed("r", "alice", "", TTL, now()), second);
    tokio::time::advance(TTL / 2).await;
    assert_ne!(t.seed("r", "alice", "", TTL, now()), second);
    assert_eq!(t.count("alice"), 1, "replaced in its place");
}

#[tokio::test(start_paused = true)]
async fn a_ttl_of_its_own() {
    let t = Table::new(100, 10);
    let now = crate::limits::now;
    let short = Duration::from_secs(5);
    let a = t.seed("r", "alice", "s1", short, now());
    let b = t.seed("r", "alice", "s2", TTL, now());
    tokio::time::advance(short).await;
    assert_ne!(t.seed("r", "alice", "s1", short, now()), a, "s1 expired after 5 s");
    assert_eq!(t.seed("r", "alice", "s2", TTL, now()), b, "s2 lives on");
}

#[tokio::test(start_paused = true)]
async fn users_routes_and_sessions_are_apart() {
    for per_user in [0, 10] {
        let t = Table::new(100, per_user);
        let now = crate::limits::now();
        let keys = [
            ("r", "alice", "x"),
            ("r", "bob", "x"),
            ("r", "alice", "y"),
            ("r2", "alice", "x"),
            ("r", "alice", ""),
            // No concatenation makes two keys one.
            ("r", "alicex", ""),
            ("ra", "lice", "x"),
        ];
        let seeds: Vec<_> = keys.iter().map(|(r, u, s)| t.seed(r, u, s, TTL, now)).collect();
        for (i, a) in seeds.iter().enumerate() {
            assert!(a.is_some());
            for b in &seeds[i + 1..] {
                assert_ne!(a, b, "{keys:?}");
            }
        }
        assert_eq!(t.len(), keys.len());
        assert_eq!(t.seed("r", "bob", "x", TTL, now), seeds[1]);
        let alice = if per_user == 0 { 0 } else { 4 };
        assert_eq!(t.count("alice"), alice, "across routes");
    }
}

#[tokio::test(start_paused = true)]
async fn bounded_expired_first_then_not_sticky() {
    for per_user in [0, 3] {
        let t = Table::with_shards(3, per_user, 1);
        let now = crate::limits::now;
        let short = Duration::from_secs(1);
        let a = t.seed("r", "a", "", short, now());
        let b = t.seed("r", "b", "", TTL, now());
        let c = t.seed("r", "c", "", TTL, now());
        assert!(a.is_some() && b.is_some() && c.is_some());
        // Full of live sessions: a new one is not sticky; the old ones stay.
        assert_eq!(t.seed("r", "d", "", TTL, now()), None);
        assert_eq!(t.seed("r", "b", "", TTL, now()), b);
        assert_eq!(t.len(), 3);
        // Once `a` has expired, it makes room, and `a` is counted no more.
        tokio::time::advance(short).await;
        assert!(t.seed("r", "d", "", TTL, now()).is_some());
        assert_eq!(t.len(), 3);
        assert_eq!(t.count("a"), 0);
        assert_eq!(t.seed("r", "c", "", TTL, now()), c);
    }
    // A limit of 0: nothing is sticky.
    let none = Table::new(0, 1000);
    assert_eq!(none.seed("r", "a", "", TTL, crate::limits::now()), None);
}

#[tokio::test(start_paused = true)]
async fn a_user_holds_at_most_its_bound_across_routes() {
    let t = Table::new(100_000, 3);
    let now = crate::limits::now;
    let s1 = t.seed("r1", "alice", "s1", TTL, now());
    let s2 = t.seed("r1", "alice", "s2", TTL, now());
    let s3 = t.seed("r2", "alice", "s1", TTL, now());
    assert!(s1.is_some() && s2.is_some() && s3.is_some());
    assert_eq!(t.count("alice"), 3);
    // A fourth, on either route: not sticky, and not held.
    assert_eq!(t.seed("r1", "alice", "s3", TTL, now()), None);
    assert_eq!(t.seed("r3", "alice", "", TTL, now()), None);
    assert_eq!((t.count("alice"), t.len()), (3, 3));
    // Its sessions go on as they were.
    assert_eq!(t.seed("r1", "alice", "s1", TTL, now()), s1);
    assert_eq!(t.seed("r1", "alice", "s2", TTL, now()), s2);
    assert_eq!(t.seed("r2", "alice", "s1", TTL, now()), s3);
    // No bound: as many as the table takes.
    let t = Table::with_shards(100, 0, 1);
    for i in 0..100 {
        assert!(t.seed("r", "alice", &i.to_string(), TTL, now()).is_some(), "{i}");
    }
    assert_eq!(t.len(), 100);
}

#[tokio::test(start_paused = true)]
async fn a_user_at_its_bound_leaves_the_others_alone() {
    // One shard: alice and bob meet in it.
    let t = Table::with_shards(10, 2, 1);
    let now = crate::limits::now;
    for s in ["a", "b"] {
        assert!(t.seed("r", "alice", s, TTL, now()).is_some());
    }
    for s in 0..20 {
        assert_eq!(t.seed("r", "alice", &format!("x{s}"), TTL, now()), None);
    }
    let b1 = t.seed("r", "bob", "a", TTL, now());
    let b2 = t.seed("r", "bob", "b", TTL, now());
    assert!(b1.is_some() && b2.is_some());
    assert_eq!(t.seed("r", "bob", "c", TTL, now()), None, "bob has his own bound");
    assert_eq!((t.count("alice"), t.count("bob"), t.len()), (2, 2, 4));
    // Several shards: wherever each user lands.
    let t = Table::new(100_000, 2);
    for user in ["alice", "bob", "carol", "dave"] {
        for s in ["a", "b"] {
            assert!(t.seed("r", user, s, TTL, now()).is_some(), "{user} {s}");
        }
        assert_eq!(t.seed("r", user, "c", TTL, now()), None);
        assert_eq!(t.count(user), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn counts_after_expiry_and_replacement() {
    let t = Table::new(1000, 3);
    let now = crate::limits::now;
    let short = Duration::from_secs(5);
    let s1 = t.seed("r", "alice", "s1", short, now());
    assert!(t.seed("r", "alice", "s2", TTL, now()).is_some());
    assert!(t.seed("r", "alice", "s3", TTL, now()).is_some());
    assert_eq!(t.count("alice"), 3);
    // s1 expires and is used again: replaced in its place, still three.
    tokio::time::advance(short).await;
    let s1b = t.seed("r", "alice", "s1", short, now());
    assert!(s1b.is_some() && s1b != s1);
    assert_eq!(t.count("alice"), 3);
    assert_eq!(t.seed("r", "alice", "s4", TTL, now()), None, "s1 lives again: at the bound");
    // s1 expires again: a new session takes its room (the user's expired sessions go
    // first), and the count stays exact.
    tokio::time::advance(short).await;
    let s4 = t.seed("r", "alice", "s4", TTL, now());
    assert!(s4.is_some());
    assert_eq!((t.count("alice"), t.len()), (3, 3));
    assert_eq!(t.seed("r", "alice", "s1", short, now()), None, "s1 was dropped");
    assert_eq!(t.seed("r", "alice", "s4", TTL, now()), s4);
    // Everything expires: the first new session drops them all.
    tokio::time::advance(TTL).await;
    for (s, n) in [("n1", 1), ("n2", 2), ("n3", 3)] {
        assert!(t.seed("r", "alice", s, TTL, now()).is_some(), "{s}");
        assert_eq!((t.count("alice"), t.len()), (n, n));
    }
    assert_eq!(t.seed("r", "alice", "n4", TTL, now()), None);
}

#[tokio::test(start_paused = true)]
async fn a_full_shard_drops_expired_sessions_and_their_counts() {
    let t = Table::with_shards(4, 3, 1);
    let now = crate::limits::now;
    let short = Duration::from_secs(1);
    for s in ["a", "b"] {
        assert!(t.seed("r", "alice", s, short, now()).is_some());
        assert!(t.seed("r", "bob", s, TTL, now()).is_some());
    }
    assert_eq!(t.seed("r", "carol", "a", TTL, now()), None, "full");
    assert_eq!(t.count("carol"), 0);
    tokio::time::advance(short).await;
    assert!(t.seed("r", "carol", "a", TTL, now()).is_some());
    assert_eq!((t.count("alice"), t.count("bob"), t.count("carol")), (0, 2, 1));
    assert!(t.seed("r", "alice", "c", TTL, now()).is_some());
    assert_eq!((t.count("alice"), t.len()), (1, 4));
}

#[tokio::test(start_paused = true)]
async fn each_user_at_its_bound_is_named_once_a_minute_ten_at_most() {
    let t = Table::new(100_000, 1);
    let now = crate::limits::now;
    let said = |t: &Table| t.user_warnings.load(Ordering::Relaxed);
    let users: Vec<String> = (0..12).map(|i| format!("u{i}")).collect();
    for u in &users {
        assert!(t.seed("r", u, "a", TTL * 10, now()).is_some());
    }
    // Each user at its bound, three times: one warning each, ten in the minute.
    for _ in 0..3 {
        for u in &users {
            assert_eq!(t.seed("r", u, "b", TTL * 10, now()), None);
        }
    }
    assert_eq!(said(&t), 10);
    // The next minute: u0 again, once; u11, never named before, too.
    tokio::time::advance(Duration::from_secs(60)).await;
    for _ in 0..3 {
        assert_eq!(t.seed("r", "u0", "b", TTL * 10, now()), None);
        assert_eq!(t.seed("r", "u11", "b", TTL * 10, now()), None);
    }
    assert_eq!(said(&t), 12);
}

#[test]
fn an_entry_is_as_small_as_documented() {
    assert!(std::mem::size_of::<Entry>() <= 88, "{}", std::mem::size_of::<Entry>());
}

#[test]
fn the_warning_names_the_user_escaped() {
    let t = Table::new(100, 7);
    let m = t.user_full_message("al\u{1b}[31mice");
    assert!(m.contains("user `al\\u{1b}[31mice` has 7 sessions"), "{m}");
    assert!(m.contains("max_sticky_sessions_per_user"), "{m}");
}

/// One step of the property test: a use of (route, user, session) with a ttl, or time
/// passing.
#[derive(Debug, Clone)]
enum Step {
    Use { route: u8, user: u8, session: u8, ttl: u8 },
    Wait(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..2, 0u8..4, 0u8..6, 1u8..8)
            .prop_map(|(route, user, session, ttl)| Step::Use { route, user, session, ttl }),
        1 => (1u8..6).prop_map(Step::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Whatever the uses: the counts are exact, no user holds more than its bound, the
    /// table no more than its limit, a live session keeps its seed, and a new session is
    /// refused only when its user or its shard is full of live sessions.
    #[test]
    fn counts_stay_exact(
        steps in proptest::collection::vec(step(), 1..120),
        max in 1usize..12,
        per_user in 0usize..5,
        shards in 1usize..3,
    ) {
        let t = Table::with_shards(max, per_user, shards);
        let mut now = Instant::now();
        let mut live: std::collections::HashMap<(u8, u8, u8), (u64, Instant)> = Default::default();
        for step in steps {
            match step {
                Step::Wait(s) => now += Duration::from_secs(s.into()),
                Step::Use { route, user, session, ttl } => {
                    let (r, u, s) = (format!("r{route}"), format!("u{user}"), format!("s{session}"));
                    let ttl = Duration::from_secs(ttl.into());
                    let seed = t.seed(&r, &u, &s, ttl, now);
                    let key = (route, user, session);
                    match live.get(&key) {
                        Some(&(kept, until)) if now < until => prop_assert_eq!(seed, Some(kept)),
                        _ => {
                            live.remove(&key);
                            if let Some(seed) = seed {
                                live.insert(key, (seed, now + ttl));
                            } else {
                                let mine = live.iter()
                                    .filter(|((_, u2, _), (_, until))| *u2 == user && now < *until)
                                    .count();
                                let all = live.values().filter(|(_, until)| now < *until).count();
                                let full_user = per_user > 0 && mine >= per_user;
                                prop_assert!(full_user || all >= max.div_ceil(shards).min(max),
                                    "refused with room: {} of user, {} in all", mine, all);
                            }
                        }
                    }
                    for user in 0..4 {
                        let held = t.count(&format!("u{user}"));
                        prop_assert!(per_user == 0 || held <= per_user);
                    }
                    prop_assert!(t.len() <= max.div_ceil(shards) * shards);
                }
            }
        }
    }
}
