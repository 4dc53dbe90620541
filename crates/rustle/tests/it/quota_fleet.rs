//! Quotas shared by two instances through one Redis (`[state] backend = "redis"`): usage
//! on one refuses on the other, the overshoot within a second's traffic per instance,
//! Redis killed (both keep serving on their own counts) and restarted empty (usage given
//! back), `on_state_loss = "deny"` refusing meanwhile, reset and top-up through the users
//! API lifting a refusal on both, and `rustle user reset` / `top-up`.

use std::io::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rustle_bench::redis_server::RedisServer;
use rustle_bench::Origin;

use crate::util::*;

const TOKEN: &str = "fleet-admin-token-0123456789abcdef";

/// A sync with Redis every second, then a request: refused or let in within this.
const WITHIN: Duration = Duration::from_secs(4);

/// An instance: alice and bob, a 1 MB daily quota for alice (`extra`: more of its keys),
/// usage in `redis` (none: in memory), the users API with a token.
fn config(redis: Option<&RedisServer>, extra: &str) -> String {
    let users = auth_http_config("");
    let state = match redis {
        Some(r) => format!("[state]\nbackend = \"redis\"\nredis_url = \"{}\"\n", r.url()),
        None => String::new(),
    };
    format!(
        "{users}[[quota]]\nname = \"daily\"\nusers = [\"alice\"]\nbytes = \"1MB\"\nperiod = \"day\"\n\
         {extra}\n[admin]\nlisten = \"127.0.0.1:0\"\napi_token = \"{TOKEN}\"\n{state}"
    )
}

/// A GET of `url` as alice on a new connection: the status.
fn get(proxy: SocketAddr, url: &str) -> u16 {
    let mut c = Conn::open(proxy);
    c.send(&request("GET", url, &[&proxy_auth("alice", "secret")], b""));
    c.read_response().status
}

/// A users API request with the token: (status, JSON body).
fn api(admin: SocketAddr, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let mut s = connect(admin);
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let (bytes, _) = read_until_close(&mut s);
    let r = parse_response(&bytes);
    let v = serde_json::from_str(&r.text()).unwrap_or(serde_json::Value::Null);
    (r.status, v)
}

/// alice's usage of "daily" as `proxy`'s users API shows it: (used, limit, exceeded).
fn usage(proxy: &Proxy) -> (u64, u64, bool) {
    let (status, v) = api(proxy.admin_addr(), "GET", "/api/v1/users/alice", "");
    assert_eq!(status, 200, "{v}");
    let q = &v["quotas"][0];
    assert_eq!(q["quota"], "daily", "{v}");
    (q["used"].as_u64().unwrap(), q["limit"].as_u64().unwrap(), q["exceeded"] == true)
}

fn refused_within(proxy: &Proxy, url: &str, what: &str) {
    wait_for(WITHIN, what, || (get(proxy.addr(), url) == 403).then_some(()));
}

fn admitted_within(proxy: &Proxy, url: &str, what: &str) {
    wait_for(WITHIN, what, || (get(proxy.addr(), url) == 200).then_some(()));
}

#[test]
fn two_instances_share_a_quota() {
    let Some(redis) = RedisServer::start(&[]) else { return };
    let origin = Origin::start().unwrap();
    let a = Proxy::from_toml(&config(Some(&redis), ""));
    let b = Proxy::from_toml(&config(Some(&redis), ""));
    let small = origin.url("/bytes/10");
    // 600 kB on each: neither is over 1 MB alone, the fleet is.
    assert_eq!(get(a.addr(), &origin.url("/bytes/600000")), 200);
    assert_eq!(get(b.addr(), &origin.url("/bytes/600000")), 200);
    refused_within(&a, &small, "alice refused on A");
    refused_within(&b, &small, "alice refused on B");
    let (used, limit, exceeded) = usage(&a);
    assert!(used >= 1_200_000 && limit == 1_000_000 && exceeded, "{used} {limit}");
    // bob has no quota.
    let mut c = Conn::open(b.addr());
    c.send(&request("GET", &small, &[&proxy_auth("bob", "hunter2")], b""));
    assert_eq!(c.read_response().status, 200);
}

#[test]
fn two_instances_overshoot_a_shared_quota_by_a_second_of_traffic_each_at_most() {
    let Some(redis) = RedisServer::start(&[]) else { return };
    let origin = Origin::start().unwrap();
    // alice at 16 Mbit/s (2 MB/s) down on each instance; open tunnels cut.
    let text = config(Some(&redis), "on_exceeded = \"close\"").replace(
        "name = \"alice\"\npassword = \"plain:secret\"\n",
        "name = \"alice\"\npassword = \"plain:secret\"\nrate_down = \"16mbit\"\n",
    );
    let a = Proxy::from_toml(&text);
    let b = Proxy::from_toml(&text);
    // Both download at 2 MB/s, cut once their instance sees the fleet's total over the
    // quota: each moves at most a second's traffic (a sync) past it, plus up to a second
    // before its workers' sweep cuts the tunnel.
    let start = Instant::now();
    let got: Vec<usize> = std::thread::scope(|s| {
        let runs: Vec<_> = [a.addr(), b.addr()]
            .into_iter()
            .map(|p| {
                let origin = origin.addr();
                s.spawn(move || {
                    let (mut t, r) =
                        connect_with(p, &origin.to_string(), &[&proxy_auth("alice", "secret")]);
                    assert_eq!(r.status, 200, "{}", r.head_text());
                    timed_download(&mut t.s, origin, 8_000_000).0
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let took = start.elapsed();
    let total: usize = got.iter().sum();
    eprintln!("fleet overshoot: {got:?} bytes in {took:?}: {} over 1 MB", total - 1_000_000);
    assert!(got.iter().all(|g| *g < 8_000_000), "{got:?}: not cut");
    // Bound: per instance, 2 MB/s for the sync (1 s) and the sweep (1 s), with slack.
    assert!(total <= 1_000_000 + 2 * 5_000_000, "{got:?} in {took:?}");
}

#[test]
fn redis_killed_and_restarted_empty_usage_is_kept_and_given_back() {
    let Some(mut redis) = RedisServer::start(&[]) else { return };
    let origin = Origin::start().unwrap();
    let a = Proxy::from_toml(&config(Some(&redis), ""));
    let b = Proxy::from_toml(&config(Some(&redis), ""));
    assert_eq!(get(a.addr(), &origin.url("/bytes/500000")), 200);
    wait_for(WITHIN, "B sees A's usage", || (usage(&b).0 >= 500_000).then_some(()));
    redis.kill();
    // Both serve on their own counts, without waiting on Redis.
    for p in [&a, &b] {
        let start = Instant::now();
        assert_eq!(get(p.addr(), &origin.url("/bytes/200000")), 200);
        assert!(start.elapsed() < Duration::from_secs(1), "{:?}", start.elapsed());
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(get(a.addr(), &origin.url("/bytes/10")), 200, "A: 700 kB of its own count");
    redis.restart().expect("restart redis-server");
    // The first to sync gives its usage back (700 kB), the other adds its batch kept.
    for p in [&a, &b] {
        wait_for(WITHIN, "usage reconciled", || (usage(p).0 >= 900_000).then_some(()));
    }
    assert_eq!(get(b.addr(), &origin.url("/bytes/200000")), 200);
    refused_within(&a, &origin.url("/bytes/10"), "alice refused on A after the restart");
    refused_within(&b, &origin.url("/bytes/10"), "alice refused on B after the restart");
}

#[test]
fn reset_and_top_up_through_the_api_lift_a_refusal_on_both_instances() {
    let Some(redis) = RedisServer::start(&[]) else { return };
    let origin = Origin::start().unwrap();
    let a = Proxy::from_toml(&config(Some(&redis), ""));
    let b = Proxy::from_toml(&config(Some(&redis), ""));
    let small = origin.url("/bytes/10");
    assert_eq!(get(a.addr(), &origin.url("/bytes/1100000")), 200);
    refused_within(&b, &small, "alice refused on B");
    refused_within(&a, &small, "alice refused on A");
    // A reset on A: A lets alice in at once, B at its next sync.
    let (status, v) =
        api(a.admin_addr(), "POST", "/api/v1/users/alice/reset", r#"{"quota": "daily"}"#);
    assert_eq!(status, 200, "{v}");
    assert_eq!((v["quotas"][0]["used"].as_u64(), v["fleet"].as_bool()), (Some(0), Some(true)));
    assert_eq!(get(a.addr(), &small), 200, "A at once");
    admitted_within(&b, &small, "alice let in on B after the reset on A");
    // Used up again, then topped up by 1 MB on B: B at once, A at its next sync.
    assert_eq!(get(b.addr(), &origin.url("/bytes/1100000")), 200);
    refused_within(&a, &small, "alice refused on A again");
    refused_within(&b, &small, "alice refused on B again");
    let body = r#"{"quota": "daily", "bytes": "1MB"}"#;
    let (status, v) = api(b.admin_addr(), "POST", "/api/v1/users/alice/top-up", body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["quotas"][0]["limit"].as_u64(), Some(2_000_000), "{v}");
    assert_eq!(get(b.addr(), &small), 200, "B at once");
    admitted_within(&a, &small, "alice let in on A after the top-up on B");
    wait_for(WITHIN, "A sees the top-up", || (usage(&a).1 == 2_000_000).then_some(()));
    // Mistakes are refused with their cause.
    let (status, v) = api(a.admin_addr(), "POST", "/api/v1/users/alice/reset", r#"{"quota": "x"}"#);
    assert_eq!(status, 404, "{v}");
    let body = r#"{"quota": "daily", "bytes": "lots"}"#;
    assert_eq!(api(a.admin_addr(), "POST", "/api/v1/users/alice/top-up", body).0, 400);
    assert_eq!(api(a.admin_addr(), "POST", "/api/v1/users/nobody/reset", "").0, 404);
    let body = r#"{"quota": "daily", "bytes": 5}"#;
    let (status, v) = api(a.admin_addr(), "POST", "/api/v1/users/bob/top-up", body);
    assert_eq!(status, 404, "bob has no quota: {v}");
}

#[test]
fn the_user_command_resets_and_tops_up() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&config(None, ""));
    let small = origin.url("/bytes/10");
    let addr = proxy.admin_addr().to_string();
    let user = |args: &[&str]| {
        let out = std::process::Command::new(rustle_bin())
            .args(["user", "--admin", &addr])
            .args(args)
            .env("RUSTLE_ADMIN_TOKEN", TOKEN)
            .output()
            .expect("run rustle user");
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    assert_eq!(get(proxy.addr(), &origin.url("/bytes/1100000")), 200);
    refused_within(&proxy, &small, "alice refused");
    let list = user(&["list"]);
    assert!(list.contains("daily:") && list.contains("/1000000!"), "{list}");
    user(&["reset", "alice", "--quota", "daily"]);
    assert_eq!(get(proxy.addr(), &small), 200, "let in at once after the reset");
    assert_eq!(get(proxy.addr(), &origin.url("/bytes/1100000")), 200);
    refused_within(&proxy, &small, "alice refused again");
    user(&["top-up", "alice", "--quota", "daily", "--bytes", "1MB"]);
    assert_eq!(get(proxy.addr(), &small), 200, "let in at once after the top-up");
    assert_eq!(usage(&proxy).1, 2_000_000);
    user(&["top-up", "alice", "--quota", "daily", "--bytes", "500000"]);
    assert_eq!(usage(&proxy).1, 2_500_000);
}

#[test]
fn on_state_loss_deny_refuses_users_with_a_quota_while_redis_is_away() {
    let Some(mut redis) = RedisServer::start(&[]) else { return };
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&(config(Some(&redis), "") + "on_state_loss = \"deny\"\n"));
    let small = origin.url("/bytes/10");
    admitted_within(&proxy, &small, "alice let in with Redis up");
    redis.kill();
    // Refused by the quota keeper (403 naming Redis) or, first, by the fleet thread,
    // which refuses every authenticated connection (503 `shared state unavailable`).
    let body = wait_for(WITHIN, "alice refused without Redis", || {
        let mut c = Conn::open(proxy.addr());
        c.send(&request("GET", &small, &[&proxy_auth("alice", "secret")], b""));
        let r = c.read_response();
        matches!(r.status, 403 | 503).then(|| r.text())
    });
    assert!(body.contains("Redis") || body.contains("shared state"), "{body}");
    redis.restart().expect("restart redis-server");
    admitted_within(&proxy, &small, "alice let in once Redis is back");
}
