use std::net::IpAddr;
use std::time::Duration;

use tokio::time::advance;

use super::{Addrs, Limit, Refused};
use crate::limits::now;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

const TWO: Limit = Limit { max: 2, ttl: Duration::from_secs(60) };

#[tokio::test(start_paused = true)]
async fn a_further_address_waits_for_one_to_be_idle_for_the_ttl() {
    let t = Addrs::new();
    let a = t.admit("alice", ip("10.0.0.1"), TWO, now()).expect("first address");
    let b = t.admit("alice", ip("10.0.0.2"), TWO, now()).expect("second address");
    assert_eq!(
        t.admit("alice", ip("10.0.0.3"), TWO, now()).expect_err("refused"),
        Refused::InUse { in_use: 2, max: 2 }
    );
    // Another user, and more connections from an address in use, are not limited by it.
    let _bob = t.admit("bob", ip("10.0.0.3"), TWO, now()).expect("bob's own");
    let a2 = t.admit("alice", ip("10.0.0.1"), TWO, now()).expect("same address again");
    drop(a);
    drop(b);
    // Closed, but in use for the TTL: the address with a connection left, and the other.
    advance(Duration::from_secs(59)).await;
    assert_eq!(t.in_use("alice", now()), 2);
    assert!(t.admit("alice", ip("10.0.0.3"), TWO, now()).is_err());
    advance(Duration::from_secs(1)).await;
    assert_eq!(t.in_use("alice", now()), 1, "10.0.0.2 idle for the TTL");
    let c = t.admit("alice", ip("10.0.0.3"), TWO, now()).expect("a freed place");
    assert!(t.admit("alice", ip("10.0.0.2"), TWO, now()).is_err());
    drop((a2, c));
    advance(Duration::from_secs(60)).await;
    assert_eq!(t.in_use("alice", now()), 0);
}

#[tokio::test(start_paused = true)]
async fn an_open_connection_keeps_its_address_however_long() {
    let t = Addrs::new();
    let one = Limit { max: 1, ttl: Duration::from_secs(5) };
    let held = t.admit("alice", ip("10.0.0.1"), one, now()).expect("first");
    advance(Duration::from_secs(3600)).await;
    assert_eq!(
        t.admit("alice", ip("10.0.0.2"), one, now()).expect_err("refused"),
        Refused::InUse { in_use: 1, max: 1 }
    );
    drop(held);
    advance(Duration::from_secs(5)).await;
    let _ = t.admit("alice", ip("10.0.0.2"), one, now()).expect("after the TTL");
}

#[tokio::test(start_paused = true)]
async fn a_ttl_of_zero_frees_an_address_when_its_last_connection_closes() {
    let t = Addrs::new();
    let one = Limit { max: 1, ttl: Duration::ZERO };
    drop(t.admit("alice", ip("10.0.0.1"), one, now()).expect("first"));
    assert_eq!(t.tracked(), 0, "nothing kept");
    let _b = t.admit("alice", ip("10.0.0.2"), one, now()).expect("second");
}

#[tokio::test(start_paused = true)]
async fn ipv4_mapped_addresses_are_their_ipv4_address() {
    let t = Addrs::new();
    let one = Limit { max: 1, ttl: Duration::from_secs(60) };
    let _a = t.admit("alice", ip("10.0.0.1"), one, now()).expect("v4");
    let _b = t.admit("alice", ip("::ffff:10.0.0.1"), one, now()).expect("the same, mapped");
    assert_eq!(t.in_use("alice", now()), 1);
}

#[tokio::test(start_paused = true)]
async fn a_limit_of_zero_refuses_and_keeps_nothing() {
    let t = Addrs::new();
    let zero = Limit { max: 0, ttl: Duration::from_secs(60) };
    assert_eq!(
        t.admit("alice", ip("10.0.0.1"), zero, now()).expect_err("refused"),
        Refused::InUse { in_use: 0, max: 0 }
    );
    assert_eq!(t.tracked(), 0);
}

#[tokio::test(start_paused = true)]
async fn memory_is_bounded_and_idle_users_make_room() {
    let t = Addrs::with_capacity(64);
    let limit = Limit { max: 1, ttl: Duration::from_secs(10) };
    let mut held = Vec::new();
    let mut full = 0;
    for i in 0..1000 {
        match t.admit(&format!("u{i}"), ip("10.0.0.1"), limit, now()) {
            Ok(h) => held.push(h),
            Err(Refused::Full) => full += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    // 1,000 names fill every shard (8 users each).
    assert_eq!((held.len(), t.tracked(), full), (64, 64, 1000 - 64));
    // Users already tracked are still served when the table is full.
    drop(t.admit("u0", ip("10.0.0.1"), limit, now()).expect("u0 is tracked"));
    // Closed, they leave room for others once idle for the TTL, not before.
    held.clear();
    assert_eq!(t.admit("late", ip("10.0.0.1"), limit, now()).expect_err("refused"), Refused::Full);
    advance(Duration::from_secs(10)).await;
    let _late = t.admit("late", ip("10.0.0.1"), limit, now()).expect("room after the TTL");
    assert!(t.tracked() <= 64);
}

#[tokio::test(start_paused = true)]
async fn a_shorter_ttl_on_reload_applies_to_addresses_already_idle() {
    let t = Addrs::new();
    let long = Limit { max: 1, ttl: Duration::from_secs(600) };
    let short = Limit { max: 1, ttl: Duration::from_secs(5) };
    drop(t.admit("alice", ip("10.0.0.1"), long, now()).expect("first"));
    advance(Duration::from_secs(5)).await;
    let _b = t.admit("alice", ip("10.0.0.2"), short, now()).expect("idle for the new TTL");
}

#[test]
fn workers_admitting_at_once_never_pass_the_limit() {
    let t = Addrs::new();
    let limit = Limit { max: 2, ttl: Duration::ZERO };
    let threads: Vec<_> = (0..4u8)
        .map(|w| {
            let t = t.clone();
            std::thread::spawn(move || {
                let mut held = Vec::new();
                for i in 0..2000u32 {
                    let ip = IpAddr::from([10, 0, 0, ((i + u32::from(w)) % 5) as u8]);
                    if let Ok(h) = t.admit("alice", ip, limit, now()) {
                        held.push(h);
                    }
                    assert!(t.in_use("alice", now()) <= 2, "past the limit");
                    if held.len() > 3 || i % 3 == 0 {
                        held.clear();
                    }
                }
            })
        })
        .collect();
    for th in threads {
        th.join().expect("no panic");
    }
    assert_eq!(t.tracked(), 0, "every hold released, nothing kept with a TTL of 0");
}

#[tokio::test(start_paused = true)]
async fn the_fleets_addresses_count_against_a_users_limit() {
    let t = Addrs::new();
    let fleet = |ips: &[&str]| {
        std::collections::HashMap::from([(
            "alice".to_string(),
            ips.iter().map(|s| ip(s)).collect(),
        )])
    };
    t.set_fleet(&fleet(&["10.0.0.1"]));
    let _b = t.admit("alice", ip("10.0.0.2"), TWO, now()).expect("1 elsewhere + 1 here");
    assert_eq!(
        t.admit("alice", ip("10.0.0.3"), TWO, now()).map(|_| ()),
        Err(Refused::InUse { in_use: 2, max: 2 })
    );
    // The fleet's address itself is admitted here.
    let _a = t.admit("alice", ip("10.0.0.1"), TWO, now()).expect("the fleet's address");
    // What is in use here, for the fleet.
    let local = t.local(now());
    assert_eq!(local.len(), 1);
    assert_eq!(local[0].2.len(), 2);
    assert_eq!(local[0].1, TWO);
    // Redis down: the fleet's addresses forgotten, only those here count.
    t.set_fleet(&std::collections::HashMap::new());
    assert_eq!(t.in_use("alice", now()), 2);
}
