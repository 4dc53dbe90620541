//! Two fleet threads on one real `redis-server` play two instances.

use std::time::{Duration, Instant};

use rustle_bench::redis_server::RedisServer;

use super::*;
use crate::config::Secret;
use crate::limits::addrs::Limit;

fn settings(url: &str, on_state_loss: OnStateLoss) -> StateRedis {
    StateRedis {
        url: Secret::new(url),
        password_file: None,
        ca: None,
        key_prefix: "f:".into(),
        on_state_loss,
        sync_interval: Duration::from_millis(50),
    }
}

/// Waits until `f` holds, for at most two seconds.
fn until(what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(2), "not within 2 s: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn connections_per_user_are_shared_within_a_tick_and_released_at_stop() {
    let Some(server) = RedisServer::start(&[]) else { return };
    let (la, lb) = (ConnLimits::new(None, Some(2)), ConnLimits::new(None, Some(2)));
    let a = start(&settings(&server.url(), OnStateLoss::Serve), la.clone()).expect("a");
    let b = start(&settings(&server.url(), OnStateLoss::Serve), lb.clone()).expect("b");
    let held = [la.acquire_user("alice").expect("1st"), la.acquire_user("alice").expect("2nd")];
    until("b sees a's two connections", || lb.acquire_user("alice").is_none());
    assert!(lb.acquire_user("bob").is_some(), "another user is not limited");
    drop(held);
    until("b sees them closed", || lb.acquire_user("alice").is_some());
    let held = la.acquire_user("alice").expect("again");
    let _other = la.acquire_user("alice").expect("again 2");
    until("b sees them again", || lb.acquire_user("alice").is_none());
    a.stop();
    until("a's lease released at its stop", || lb.acquire_user("alice").is_some());
    drop(held);
    b.stop();
}

#[test]
fn client_addresses_are_shared_within_a_tick() {
    let Some(server) = RedisServer::start(&[]) else { return };
    let (la, lb) = (ConnLimits::new(None, None), ConnLimits::new(None, None));
    let _a = start(&settings(&server.url(), OnStateLoss::Serve), la.clone()).expect("a");
    let _b = start(&settings(&server.url(), OnStateLoss::Serve), lb.clone()).expect("b");
    let limit = Limit { max: 1, ttl: Duration::from_secs(60) };
    let one: IpAddr = "10.0.0.1".parse().expect("ip");
    let two: IpAddr = "10.0.0.2".parse().expect("ip");
    let _hold = la.addrs.admit("alice", one, limit, crate::limits::now()).expect("a admits");
    // Admitting on b before it learnt of a's address would hold the second one for the
    // TTL (the overshoot): a few ticks first.
    std::thread::sleep(Duration::from_millis(250));
    let refused = lb.addrs.admit("alice", two, limit, crate::limits::now());
    assert!(refused.is_err(), "{refused:?}");
    // The fleet's address itself is admitted on b.
    let again = lb.addrs.admit("alice", one, limit, crate::limits::now());
    assert!(again.is_ok(), "{again:?}");
}

#[test]
fn deny_mode_refuses_while_redis_is_down_and_recovers() {
    let Some(mut server) = RedisServer::start(&[]) else { return };
    let limits = ConnLimits::new(None, None);
    let fleet = start(&settings(&server.url(), OnStateLoss::Deny), limits.clone()).expect("fleet");
    until("up", || fleet.handle().status().health().0);
    assert!(!limits.state_lost());
    server.kill();
    until("down and denying", || limits.state_lost() && !fleet.handle().status().health().0);
    server.restart().expect("restart");
    until("up again", || !limits.state_lost() && fleet.handle().status().health().0);
}

#[test]
fn a_job_runs_on_the_fleet_thread_and_its_result_comes_back() {
    let Some(server) = RedisServer::start(&[]) else { return };
    let fleet = start(&settings(&server.url(), OnStateLoss::Serve), ConnLimits::new(None, None))
        .expect("f");
    let handle = fleet.handle().clone();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    let got = rt.block_on(handle.submit(|f| async move {
        let name = std::thread::current().name().map(str::to_string);
        (f.sticky_get_or_set("s", "7", Duration::from_secs(5)).await.ok(), name)
    }));
    assert_eq!(got, Ok((Some("7".to_string()), Some("rustle-fleet".to_string()))));
    fleet.stop();
    assert_eq!(rt.block_on(handle.submit(|_| async {})), Err(Gone));
}
