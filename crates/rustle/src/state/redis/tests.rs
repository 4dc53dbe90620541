//! Every call against a real `redis-server` (Debian's, started on a free loopback port by
//! `rustle_bench::redis_server`): two `Fleet`s on one server play two instances.

use std::time::{Duration, Instant};

use rustle_bench::redis_server::RedisServer;

use super::*;
use crate::config::{Config, Secret, StateRedis};

fn settings(url: &str) -> StateRedis {
    StateRedis {
        url: Secret::new(url),
        password_file: None,
        ca: None,
        key_prefix: "t:".into(),
        on_state_loss: OnStateLoss::Serve,
        sync_interval: Duration::from_secs(1),
    }
}

fn fleet(server: &RedisServer) -> Fleet {
    Fleet::connect(&settings(&server.url())).expect("fleet")
}

fn key<'a>(quota: &'a str, user: &'a str) -> UsageKey<'a> {
    UsageKey { quota, user, start: 1_700_000_000 }
}

const HOUR: Duration = Duration::from_secs(3600);

/// A plain connection to the server, to look at what the fleet wrote.
async fn raw(server: &RedisServer) -> MultiplexedConnection {
    let client = Client::open(server.url()).expect("client");
    client.get_multiplexed_async_connection().await.expect("raw connection")
}

/// Calls `f` until it succeeds or `within` has passed; the time it took.
async fn until_ok<F, Fut>(within: Duration, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    let start = Instant::now();
    loop {
        match f().await {
            Ok(()) => return start.elapsed(),
            Err(e) => assert!(start.elapsed() < within, "still failing after {within:?}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn usage_is_added_by_both_instances_and_totals_come_back() {
    let Some(server) = RedisServer::start(&[]) else { return };
    let (a, b) = (fleet(&server), fleet(&server));
    let (month, day) = (key("month", "alice"), key("day", "alice"));
    let add = |key: &UsageKey<'static>, amount| Usage { key: key.clone(), amount, ttl: HOUR };
    assert_eq!(a.add_usage(1, &[add(&month, 100), add(&day, 7)]).await.expect("a"), [100, 7]);
    assert_eq!(b.add_usage(1, &[add(&month, 50)]).await.expect("b"), [150]);
    assert_eq!(a.add_usage(2, &[]).await.expect("empty"), Vec::<u64>::new());
    assert_eq!(b.usage(&[day.clone(), key("day", "bob")]).await.expect("usage"), [7, 0]);
    // A batch sent again (its reply lost) is not counted again; its totals come back.
    assert_eq!(a.add_usage(1, &[add(&month, 100), add(&day, 7)]).await.expect("again"), [150, 7]);
    // Every counter expires (the period's end plus a margin).
    let mut raw = raw(&server).await;
    let ttl: i64 = redis::cmd("PTTL")
        .arg("t:usage:month:alice:1700000000")
        .query_async(&mut raw)
        .await
        .expect("pttl");
    assert!(ttl > 3_500_000 && ttl <= 3_600_000, "ttl {ttl}");
    // Reset and top-up.
    a.set_usage(&month, 20, HOUR).await.expect("set");
    assert_eq!(b.usage(std::slice::from_ref(&month)).await.expect("usage"), [20]);
    assert!(b.delete(&month).await.expect("delete"));
    assert!(!b.delete(&month).await.expect("delete again"));
    assert_eq!(a.add_usage(3, &[add(&month, 1)]).await.expect("after reset"), [1]);
    // A Redis that lost the counters gets back what an instance knows, never less.
    assert_eq!(b.raise_usage(&[add(&month, 40), add(&day, 5)]).await.expect("raise"), [40, 7]);
    assert_eq!(b.usage(&[month.clone(), day.clone()]).await.expect("usage"), [40, 7]);
    let counts = a.status().counts();
    assert_eq!(counts.failures, 0);
    // a: the first batch by EVALSHA, refused (NOSCRIPT), then sent whole (EVAL); the
    // same batch again, SET, and the batch after the reset: one command each.
    assert_eq!(counts.commands, 5, "{counts:?}");
    assert!(counts.bytes > 200, "{counts:?}");
    let (commands, bytes) = counts.per_second(&Counts::default(), Duration::from_secs(2));
    assert_eq!((commands, bytes), (counts.commands as f64 / 2.0, counts.bytes as f64 / 2.0));
}

#[test]
fn names_are_escaped_so_that_keys_never_meet() {
    let server_free = Fleet::connect(&settings("redis://127.0.0.1:1")).expect("lazy: no I/O");
    let one = server_free.usage_key(&UsageKey { quota: "q:x", user: "u", start: 1 });
    let two = server_free.usage_key(&UsageKey { quota: "q", user: "x:u", start: 1 });
    assert_eq!(one, "t:usage:q%3Ax:u:1");
    assert_eq!(two, "t:usage:q:x%3Au:1");
    assert_eq!(escape("50%:"), "50%25%3A");
    assert_eq!(server_free.on_state_loss(), OnStateLoss::Serve);
    assert!(server_free.instance().contains(&std::process::id().to_string()));
}

#[tokio::test]
async fn a_sticky_session_gets_the_first_value_set_until_it_expires() {
    let Some(server) = RedisServer::start(&[]) else { return };
    let (a, b) = (fleet(&server), fleet(&server));
    let ttl = Duration::from_millis(500);
    assert_eq!(a.sticky_get_or_set("r1:alice:s1", "17", ttl).await.expect("a"), "17");
    assert_eq!(b.sticky_get_or_set("r1:alice:s1", "42", ttl).await.expect("b"), "17");
    assert_eq!(b.sticky_get_or_set("r1:alice:s2", "42", ttl).await.expect("b2"), "42");
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    assert_eq!(b.sticky_get_or_set("r1:alice:s1", "42", ttl).await.expect("expired"), "42");
}

#[tokio::test]
async fn connection_counts_sum_live_instances_only() {
    let Some(server) = RedisServer::start(&[]) else { return };
    let (a, b) = (fleet(&server), fleet(&server));
    a.publish_conns(&[("alice", 3), ("bob", 1)], HOUR).await.expect("a");
    b.publish_conns(&[("alice", 2)], Duration::from_millis(500)).await.expect("b");
    assert_eq!(a.conn_counts("alice").await.expect("alice"), 5);
    assert_eq!(a.conn_counts_of(&["bob", "carol"]).await.expect("bob"), [1, 0]);
    // A count of 0 takes the instance's field away.
    a.publish_conns(&[("bob", 0)], HOUR).await.expect("bob 0");
    assert_eq!(b.conn_counts("bob").await.expect("bob"), 0);
    // b stops renewing its lease: its connections stop counting when it expires.
    tokio::time::sleep(Duration::from_millis(550)).await;
    assert_eq!(a.conn_counts("alice").await.expect("alice"), 3);
    let fields: u64 = redis::cmd("HLEN")
        .arg("t:conns:alice")
        .query_async(&mut raw(&server).await)
        .await
        .expect("hlen");
    assert_eq!(fields, 1, "the dead instance's field is removed");
    // A clean stop ends the lease at once.
    a.release().await.expect("release");
    assert_eq!(b.conn_counts("alice").await.expect("alice"), 0);
}

#[tokio::test]
async fn client_addresses_are_admitted_up_to_the_maximum_until_one_is_idle() {
    let Some(server) = RedisServer::start(&[]) else { return };
    let (a, b) = (fleet(&server), fleet(&server));
    let ttl = Duration::from_millis(600);
    assert_eq!(
        a.touch_addrs("alice", &["10.0.0.1", "10.0.0.2"], ttl, 2).await.expect("a"),
        [true, true]
    );
    // Another instance sees them: a third address is refused, a known one admitted.
    assert_eq!(
        b.touch_addrs("alice", &["10.0.0.3", "10.0.0.1"], ttl, 2).await.expect("b"),
        [false, true]
    );
    assert_eq!(b.touch_addrs("bob", &["10.0.0.3"], ttl, 1).await.expect("bob"), [true]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    // .1 was seen again later than .2: .2 goes idle first and makes room.
    a.touch_addrs("alice", &["10.0.0.1"], ttl, 2).await.expect("keep .1");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        b.touch_addrs("alice", &["10.0.0.3", "10.0.0.4"], ttl, 2).await.expect("room"),
        [true, false]
    );
}

#[tokio::test]
async fn a_password_from_a_file_is_used_and_a_missing_one_fails() {
    let Some(server) = RedisServer::start(&["--requirepass", "s3cret"]) else { return };
    let file = server.dir().join("password");
    std::fs::write(&file, "s3cret\n").expect("write");
    let mut cfg = settings(&server.url());
    cfg.password_file = Some(file);
    Fleet::connect(&cfg).expect("fleet").ping().await.expect("with the password");
    let in_url = server.url().replace("redis://", "redis://:s3cret@");
    Fleet::connect(&settings(&in_url)).expect("fleet").ping().await.expect("password in URL");
    let without = fleet(&server);
    let e = without.ping().await.expect_err("no password");
    assert!(!e.to_string().contains("s3cret"), "{e}");
    let (up, _) = without.status().health();
    assert!(!up);
    cfg.password_file = Some(server.dir().join("absent"));
    let e = Fleet::connect(&cfg).err().expect("no such file");
    assert!(e.to_string().contains("redis_password_file: cannot read"), "{e}");
}

#[tokio::test]
async fn a_killed_server_fails_calls_fast_and_is_used_again_once_back() {
    let Some(mut server) = RedisServer::start(&[]) else { return };
    let fleet = fleet(&server);
    let status = fleet.status();
    fleet.touch_addrs("alice", &["10.0.0.1"], HOUR, 5).await.expect("up");
    let (up, since_up) = status.health();
    assert!(up);

    server.kill();
    let start = Instant::now();
    let e = fleet.ping().await.expect_err("killed");
    assert!(matches!(e, Error::Down { .. }), "{e}");
    // Further calls during the backoff fail at once.
    for _ in 0..3 {
        assert!(matches!(fleet.conn_counts("alice").await, Err(Error::Down { .. })));
    }
    assert!(start.elapsed() < Duration::from_secs(1), "took {:?}", start.elapsed());
    let (up, since_down) = status.health();
    assert!(!up && since_down >= since_up);

    server.restart().expect("restart");
    // Back within the longest backoff; the scripts Redis forgot are sent again.
    let took = until_ok(BACKOFF_MAX + Duration::from_secs(2), || async {
        fleet.touch_addrs("alice", &["10.0.0.1"], HOUR, 5).await.map(|_| ())
    })
    .await;
    assert!(took <= BACKOFF_MAX + Duration::from_secs(1), "took {took:?}");
    assert!(status.health().0);
    assert_eq!(fleet.conn_counts("alice").await.expect("script after restart"), 0);
    assert!(status.counts().failures >= 4);
}

#[tokio::test]
async fn a_server_that_stops_answering_fails_the_call_within_the_timeout() {
    let Some(server) = RedisServer::start(&[]) else { return };
    let fleet = fleet(&server);
    fleet.ping().await.expect("up");
    server.pause();
    let start = Instant::now();
    let e = fleet.ping().await.expect_err("paused");
    let took = start.elapsed();
    server.resume();
    assert!(matches!(e, Error::Down { .. }), "{e}");
    assert!(took >= RESPONSE_TIMEOUT / 2 && took < RESPONSE_TIMEOUT * 2, "took {took:?}");
    assert!(!fleet.status().health().0);
    until_ok(Duration::from_secs(3), || fleet.ping()).await;
    assert!(fleet.status().health().0);
}

#[tokio::test]
async fn tls_with_the_configured_ca() {
    let Some(server) = RedisServer::start_tls(&[]) else { return };
    let mut cfg = settings(&server.url());
    cfg.ca = Some(server.ca_file());
    let fleet = Fleet::connect(&cfg).expect("fleet");
    let add = Usage { key: key("day", "alice"), amount: 5, ttl: HOUR };
    assert_eq!(fleet.add_usage(1, &[add]).await.expect("over TLS"), [5]);
    // The system's roots do not know the test CA.
    let untrusted = Fleet::connect(&settings(&server.url())).expect("fleet");
    let e = untrusted.ping().await.expect_err("unknown CA");
    assert!(matches!(e, Error::Down { .. }), "{e}");
}

#[test]
fn state_section_is_checked() {
    let ok =
        "[state]\nbackend = \"redis\"\nredis_url = \"rediss://h:6380\"\nredis_ca = \"/ca.pem\"\n\
              key_prefix = \"fleet1:\"\non_state_loss = \"deny\"\n";
    let c = Config::parse(ok).expect("valid");
    let r = c.state.redis().expect("redis settings");
    assert_eq!(r.key_prefix, "fleet1:");
    assert_eq!(r.on_state_loss, OnStateLoss::Deny);
    assert_eq!(Config::parse("").expect("empty").state.redis(), None);
    for (text, expect) in [
        ("[state]\nbackend = \"redis\"\n", "line 2: state.backend: \"redis\" needs redis_url"),
        ("[state]\nbackend = \"redis\"\nredis_url = \"http://h\"\n", "line 3: state.redis_url: must start"),
        ("[state]\nbackend = \"redis\"\nredis_url = \"redis://h\"\nredis_ca = \"/c\"\n", "line 4: state.redis_ca: needs a rediss://"),
        (
            "[state]\nbackend = \"redis\"\nredis_url = \"redis://:pw@h\"\nredis_password_file = \"/p\"\n",
            "line 4: state.redis_password_file: redis_url has a password already",
        ),
        (
            "[state]\nbackend = \"redis\"\nredis_url = \"rediss://h#insecure\"\n",
            "line 3: state.redis_url: must not have a #fragment",
        ),
        ("[state]\nredis_url = \"redis://h\"\n", "line 2: state.redis_url: is read only with backend"),
        ("[state]\nbackend = \"memcached\"\n", "line 2"),
        ("[state]\nredis_host = \"h\"\n", "unknown key `state.redis_host`"),
    ] {
        let problems = Config::parse(text).expect_err(text);
        let all: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        assert!(all.iter().any(|p| p.starts_with(expect) || p.contains(expect)), "{text}: {all:?}");
    }
}

#[tokio::test]
async fn instances_racing_agree_on_one_session_value_and_one_address() {
    let Some(server) = RedisServer::start(&[]) else { return };
    let (a, b) = (fleet(&server), fleet(&server));
    let values: Vec<String> = (0..16).map(|i| i.to_string()).collect();
    let addrs: Vec<String> = (0..16).map(|i| format!("10.0.0.{i}")).collect();
    let addrs: Vec<[&str; 1]> = addrs.iter().map(|a| [a.as_str()]).collect();
    let sticky = futures_util::future::join_all(values.iter().enumerate().map(|(i, v)| {
        let f = if i % 2 == 0 { &a } else { &b };
        f.sticky_get_or_set("race", v, HOUR)
    }));
    let touched = futures_util::future::join_all(addrs.iter().enumerate().map(|(i, addr)| {
        let f = if i % 2 == 0 { &a } else { &b };
        f.touch_addrs("alice", addr, HOUR, 1)
    }));
    let (sticky, touched) = tokio::join!(sticky, touched);
    let sticky: Vec<String> = sticky.into_iter().map(|r| r.expect("sticky")).collect();
    assert!(sticky.iter().all(|v| *v == sticky[0]), "{sticky:?}");
    let admitted = touched.into_iter().filter(|r| r.as_ref().expect("touch")[0]).count();
    assert_eq!(admitted, 1);
}

#[tokio::test]
async fn sync_conns_publishes_and_reads_every_users_total() {
    let Some(server) = RedisServer::start(&[]) else { return };
    let (a, b) = (fleet(&server), fleet(&server));
    let got = a.sync_conns(&[("alice", 2), ("b:o%b", 1)], HOUR).await.expect("a");
    assert_eq!(sorted(got), vec![("alice".to_string(), 2), ("b:o%b".to_string(), 1)]);
    let got = b.sync_conns(&[("alice", 1)], HOUR).await.expect("b");
    assert_eq!(sorted(got), vec![("alice".to_string(), 3), ("b:o%b".to_string(), 1)]);
    // A user no longer given is no longer this instance's.
    let got = a.sync_conns(&[("alice", 2)], HOUR).await.expect("a again");
    assert_eq!(sorted(got), vec![("alice".to_string(), 3)]);
    // A released instance's counts stop counting.
    a.release().await.expect("release");
    let got = b.sync_conns(&[], HOUR).await.expect("b alone");
    assert!(got.is_empty(), "{got:?}");
}

#[tokio::test]
async fn fleet_addrs_reads_every_users_addresses_within_their_ttl() {
    let Some(server) = RedisServer::start(&[]) else { return };
    let (a, b) = (fleet(&server), fleet(&server));
    let ttl = Duration::from_millis(300);
    assert_eq!(a.touch_addrs("alice", &["10.0.0.1"], ttl, 2).await.expect("a"), vec![true]);
    assert_eq!(b.touch_addrs("alice", &["10.0.0.2"], HOUR, 2).await.expect("b"), vec![true]);
    let mut got = b.fleet_addrs().await.expect("read");
    got.iter_mut().for_each(|(_, a)| a.sort());
    assert_eq!(got, vec![("alice".to_string(), vec!["10.0.0.1".to_string(), "10.0.0.2".into()])]);
}

fn sorted(mut v: Vec<(String, u64)>) -> Vec<(String, u64)> {
    v.sort();
    v
}
