//! A fleet (`[state] backend = "redis"`) as clients see it: two rustle processes pointing
//! at one real `redis-server` (Debian's, on a free loopback port) share connections per
//! user, client addresses per user and sticky sessions, one of them with haproxy in front
//! of both as the L4 balancer; Redis killed and started again under load.

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rustle_bench::redis_server::RedisServer;
use rustle_bench::{Origin, TcpEcho};

use crate::util::peers::Haproxy;
use crate::util::socks::*;
use crate::util::*;

/// The sync interval of the instances: a tick is short so that tests wait little.
const TICK: Duration = Duration::from_millis(100);

/// Longest wait for the fleet to agree: many ticks.
const AGREE: Duration = Duration::from_secs(3);

/// One instance: a rustle process with an HTTP and a SOCKS listener and the admin
/// endpoint.
struct Instance {
    process: RustleProcess,
    http: SocketAddr,
    socks: SocketAddr,
    admin: SocketAddr,
    _dir: TempDir,
}

/// Starts an instance on `redis` with `on_state_loss` and `extra` configuration (limits,
/// parents, routes).
fn instance(redis: &RedisServer, on_state_loss: &str, extra: &str) -> Instance {
    let dir = TempDir::new("fleet");
    let text = format!(
        r#"[[listener]]
listen = "127.0.0.1:0"
auth = true
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
auth = true
[admin]
listen = "127.0.0.1:0"
[state]
backend = "redis"
redis_url = "{url}"
sync_interval = "{tick}ms"
on_state_loss = "{on_state_loss}"
[auth]
failures_burst = 1000
[[auth.user]]
name = "alice"
password = "plain:secret"
[[auth.user]]
name = "bob"
password = "plain:secret"
{extra}
"#,
        url = redis.url(),
        tick = TICK.as_millis(),
    );
    let file = dir.file("rustle.toml");
    std::fs::write(&file, text).expect("write the configuration");
    let (process, http) = RustleProcess::start(&["--config", file.to_str().expect("utf-8")]);
    let mut process = process;
    let socks = process.next_listener();
    let admin = wait_for(Duration::from_secs(5), "the admin endpoint's address", || {
        let err = process.stderr();
        let rest = err.split("admin endpoint on http://").nth(1)?;
        rest.split('/').next()?.parse().ok()
    });
    Instance { process, http, socks, admin, _dir: dir }
}

impl Instance {
    /// `/readyz` or `/metrics`: status and body.
    fn admin_get(&self, path: &str) -> (u16, String) {
        let raw = raw_to(self.admin, format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes());
        let r = parse_response(&raw);
        (r.status, r.text())
    }
}

/// A GET as `user` from `from` on a new connection, kept open (its connection holds one
/// of the user's connections until dropped).
fn held_get(from: &str, proxy: SocketAddr, url: &str, user: &str) -> (Conn, Resp) {
    let mut c = Conn::open_from(from, proxy);
    c.send(&request("GET", url, &[&proxy_auth(user, "secret")], b""));
    let r = c.read_response();
    (c, r)
}

fn get(proxy: SocketAddr, url: &str, user: &str) -> Resp {
    held_get("127.0.0.1", proxy, url, user).1
}

/// A SOCKS5 CONNECT to `dst` as `user`: the login's status and the reply.
fn socks5(proxy: SocketAddr, user: &str, dst: SocketAddr) -> (u8, u8) {
    let mut s = connect(proxy);
    let login = login5(&mut s, user, "secret");
    if login != 0 {
        return (login, 0xff);
    }
    s.write_all(&request5(CONNECT, &Dst::Addr(dst))).expect("write request");
    (login, read_reply5(&mut s).0)
}

#[test]
fn max_connections_per_user_is_shared_by_two_instances() {
    let Some(redis) = RedisServer::start(&[]) else { return };
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/3");
    let limits = "[limits]\nmax_connections_per_user = 2\n";
    let (a, b) = (instance(&redis, "serve", limits), instance(&redis, "serve", limits));

    // Two of alice's on a: a third is refused on b within a few ticks, and on a at once.
    let (one, r) = held_get("127.0.0.1", a.http, &url, "alice");
    assert_eq!(r.status, 200, "{}", r.head_text());
    let (two, r) = held_get("127.0.0.1", a.http, &url, "alice");
    assert_eq!(r.status, 200, "{}", r.head_text());
    let r = get(a.http, &url, "alice");
    assert_eq!(r.status, 503, "{}", r.head_text());
    let started = Instant::now();
    let refused = wait_until(AGREE, || get(b.http, &url, "alice").status == 503);
    assert!(refused, "b still admits a third connection of alice's");
    let r = get(b.http, &url, "alice");
    assert_eq!(r.text().trim(), "too many connections for this user");
    eprintln!("b refused the third connection {:?} after it opened", started.elapsed());
    // Other users are not limited by alice's.
    assert_eq!(get(b.http, &url, "bob").status, 200);

    // One closed on a: b takes one again within a few ticks, and then no more.
    drop(one);
    let (_three, _) = wait_for(AGREE, "b admits alice again", || {
        let (c, r) = held_get("127.0.0.1", b.http, &url, "alice");
        (r.status == 200).then_some((c, r))
    });
    assert_eq!(get(b.http, &url, "alice").status, 503, "b: the third of the fleet refused");
    // And a, after a tick, refuses too (one here, one on b).
    assert!(wait_until(AGREE, || get(a.http, &url, "alice").status == 503));
    drop(two);
}

#[test]
fn max_client_addresses_is_shared_by_two_instances() {
    let Some(redis) = RedisServer::start(&[]) else { return };
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let url = origin.url("/bytes/3");
    let limits = "[limits]\nmax_client_addresses = 1\nclient_address_ttl = \"30s\"\n";
    let (a, b) = (instance(&redis, "serve", limits), instance(&redis, "serve", limits));

    let (_held, r) = held_get("127.0.0.1", a.http, &url, "alice");
    assert_eq!(r.status, 200, "{}", r.head_text());
    // b learns of alice's address within a few ticks (before that it would admit a
    // second address and hold it for the TTL: the overshoot): then refuses another.
    std::thread::sleep(TICK * 4);
    let (_, r) = held_get("127.0.0.2", b.http, &url, "alice");
    assert_eq!(r.status, 403, "{}", r.head_text());
    assert_eq!(r.text().trim(), "user alice is already using 1 client addresses (limit 1)");
    // The fleet's address is served on b, on HTTP and SOCKS5; bob is not limited.
    assert_eq!(get(b.http, &url, "alice").status, 200);
    assert_eq!(socks5(b.socks, "alice", echo.addr()), (0, 0));
    assert_eq!(held_get("127.0.0.2", b.http, &url, "bob").1.status, 200);
}

#[test]
fn a_sticky_session_takes_the_same_parent_on_both_instances() {
    let Some(redis) = RedisServer::start(&[]) else { return };
    let origin = Origin::start().unwrap();
    let parents = [Proxy::start(), Proxy::start(), Proxy::start()];
    let mut extra = String::new();
    for (name, p) in ["p1", "p2", "p3"].iter().zip(&parents) {
        extra += &format!(
            "[[parent]]\nname = \"{name}\"\nkind = \"http\"\naddress = \"{}\"\n",
            p.addr()
        );
    }
    extra += "[[group]]\nname = \"pool\"\nparents = [\"p1\", \"p2\", \"p3\"]\n\
              [[route]]\nname = \"pool\"\nvia = \"pool\"\nsticky = \"user\"\nsticky_ttl = \"10m\"\n";
    for i in 0..12 {
        extra += &format!("[[auth.user]]\nname = \"u{i:02}\"\npassword = \"plain:secret\"\n");
    }
    let (a, b) = (instance(&redis, "serve", &extra), instance(&redis, "serve", &extra));
    // Each user's session starts on a (/bytes/N), then is used on b: its first request
    // there may take b's own pick (the fleet's seed comes back within a round trip),
    // every later one takes a's (/bytes/100+N).
    for i in 1..=12 {
        assert_eq!(
            get(a.http, &origin.url(&format!("/bytes/{i}")), &format!("u{:02}", i - 1)).status,
            200
        );
    }
    std::thread::sleep(TICK * 2);
    for i in 1..=12 {
        let user = format!("u{:02}", i - 1);
        assert_eq!(get(b.http, &origin.url(&format!("/bytes/{}", 50 + i)), &user).status, 200);
    }
    std::thread::sleep(TICK * 2);
    for i in 1..=12 {
        let user = format!("u{:02}", i - 1);
        assert_eq!(get(b.http, &origin.url(&format!("/bytes/{}", 100 + i)), &user).status, 200);
    }
    // Which parent served a target.
    let served_by = |target: &str| {
        let found = wait_for(Duration::from_secs(3), target, || {
            let on: Vec<usize> = (0..3)
                .filter(|&p| parents[p].log_lines().iter().any(|l| l.contains(target)))
                .collect();
            (!on.is_empty()).then_some(on)
        });
        assert_eq!(found.len(), 1, "{target} went through several parents");
        found[0]
    };
    let mut used = std::collections::BTreeSet::new();
    for i in 1..=12 {
        let first = served_by(&format!("/bytes/{i} "));
        let later = served_by(&format!("/bytes/{} ", 100 + i));
        assert_eq!(first, later, "u{:02}: a's parent and b's differ", i - 1);
        used.insert(first);
    }
    assert!(used.len() >= 2, "12 sessions all on one parent: {used:?}");
}

#[test]
fn redis_killed_deny_refuses_serve_serves_and_both_recover() {
    let Some(mut redis) = RedisServer::start(&[]) else { return };
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let url = origin.url("/bytes/3");
    let limits = "[limits]\nmax_connections_per_user = 100\n";
    let (deny, serve) = (instance(&redis, "deny", limits), instance(&redis, "serve", limits));
    for i in [&deny, &serve] {
        assert!(wait_until(AGREE, || ready(i)));
        assert_eq!(get(i.http, &url, "alice").status, 200);
    }
    // Requests going on while Redis dies: none hangs (each has the read timeout).
    let load = std::thread::spawn({
        let (d, s, url) = (deny.http, serve.http, url.clone());
        move || {
            let start = Instant::now();
            let mut slowest = Duration::ZERO;
            while start.elapsed() < Duration::from_secs(2) {
                for p in [d, s] {
                    let t = Instant::now();
                    let auth = proxy_auth("alice", "secret");
                    let raw = raw_to(p, &request("GET", &url, &[&auth, "Connection: close"], b""));
                    let head = String::from_utf8_lossy(&raw[..raw.len().min(12)]).to_string();
                    let ok = head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.1 503");
                    assert!(ok, "{p}: {:?} {:?}", String::from_utf8_lossy(&raw), start.elapsed());
                    slowest = slowest.max(t.elapsed());
                }
            }
            slowest
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    redis.kill();

    // deny: refuses authenticated connections, says so on /readyz and /metrics.
    assert!(wait_until(AGREE, || get(deny.http, &url, "alice").status == 503));
    let r = get(deny.http, &url, "alice");
    assert_eq!(r.text().trim(), "shared state unavailable");
    assert_eq!(socks5(deny.socks, "alice", echo.addr()), (0, 1), "SOCKS5: 0x01 after login");
    let (status, body) = deny.admin_get("/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("state store unavailable") && body.contains("Redis"), "{body}");
    let (_, metrics) = deny.admin_get("/metrics");
    assert!(metrics.contains("\nrustle_state_up 0\n"), "{metrics}");
    let failures = metric(&metrics, "rustle_state_failures_total");
    assert!(failures > 0, "{metrics}");
    assert!(deny.process.wait_for_stderr("is unreachable", Duration::from_secs(2)));

    // serve: serves on its own counts, ready but degraded.
    assert_eq!(get(serve.http, &url, "alice").status, 200);
    assert_eq!(socks5(serve.socks, "alice", echo.addr()), (0, 0));
    let degraded = wait_until(AGREE, || {
        let (status, body) = serve.admin_get("/readyz");
        status == 200 && body.contains("degraded")
    });
    assert!(degraded, "{:?}", serve.admin_get("/readyz"));

    let slowest = load.join().unwrap_or_else(|_| {
        panic!(
            "the load failed; deny:\n{}\nserve:\n{}",
            deny.process.stderr(),
            serve.process.stderr()
        )
    });
    assert!(slowest < Duration::from_secs(2), "a request took {slowest:?}");
    // Logged once per change, not per tick or per request.
    std::thread::sleep(TICK * 5);
    assert_eq!(
        deny.process.stderr().matches("is unreachable").count(),
        1,
        "{}",
        deny.process.stderr()
    );

    // Redis back: both reconcile, ready again, deny serves.
    redis.restart().expect("redis-server again");
    for i in [&deny, &serve] {
        let ok = wait_until(AGREE, || ready(i));
        assert!(ok, "{:?}", i.admin_get("/readyz"));
        assert_eq!(get(i.http, &url, "alice").status, 200);
    }
    let (_, metrics) = deny.admin_get("/metrics");
    assert!(metrics.contains("\nrustle_state_up 1\n"), "{metrics}");
    assert!(metric(&metrics, "rustle_state_commands_total") > 0);
    assert!(metric(&metrics, "rustle_state_bytes_sent_total") > 0);
    assert!(deny.process.wait_for_stderr("is reachable", Duration::from_secs(2)));
}

#[test]
fn behind_haproxy_the_fleet_holds_a_user_to_its_connections() {
    let Some(redis) = RedisServer::start(&[]) else { return };
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/3");
    let limits = "[limits]\nmax_connections_per_user = 2\n";
    let (a, b) = (instance(&redis, "serve", limits), instance(&redis, "serve", limits));
    let Some(lb) = Haproxy::balance(&[a.http, b.http]) else { return };
    // Round robin: one on each instance.
    let (_one, r) = held_get("127.0.0.1", lb.addr(), &url, "alice");
    assert_eq!(r.status, 200, "{}", r.head_text());
    let (_two, r) = held_get("127.0.0.1", lb.addr(), &url, "alice");
    assert_eq!(r.status, 200, "{}", r.head_text());
    // After a tick, the third is refused whichever instance haproxy picks.
    std::thread::sleep(TICK * 3);
    for _ in 0..4 {
        let r = get(lb.addr(), &url, "alice");
        assert_eq!(r.status, 503, "{}", r.head_text());
    }
    assert_eq!(get(lb.addr(), &url, "bob").status, 200);
    let _ = (&a.process, &b.process);
}

/// Whether `/readyz` says ready, not degraded.
fn ready(i: &Instance) -> bool {
    let (status, body) = i.admin_get("/readyz");
    status == 200 && body.trim() == "ready"
}

/// A metric's value (a line `NAME VALUE`).
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[test]
fn a_reload_changing_the_state_settings_is_refused_and_keeps_the_running_ones() {
    let Some(redis) = RedisServer::start(&[]) else { return };
    let text = format!("[state]\nbackend = \"redis\"\nredis_url = \"{}\"\n", redis.url());
    let proxy = Proxy::from_toml(&text);
    let mut cfg = (*proxy.running().config()).clone();
    cfg.state.sync_interval = Duration::from_secs(2);
    let err = rustle::run::reload::apply(proxy.running(), &cfg).expect_err("refused");
    assert!(err.contains("[state]") && err.contains("restart"), "{err}");
    assert_eq!(proxy.running().config().state.sync_interval, Duration::from_secs(1));
    // The same settings: the reload goes through.
    cfg.state.sync_interval = Duration::from_secs(1);
    rustle::run::reload::apply(proxy.running(), &cfg).expect("reload");
}

#[test]
fn sync_interval_is_checked() {
    let text = |interval: &str| {
        format!(
            "[state]\nbackend = \"redis\"\nredis_url = \"redis://127.0.0.1:6379\"\n\
             sync_interval = \"{interval}\"\n"
        )
    };
    let problems = rustle::config::Config::parse(&text("5ms")).expect_err("too short");
    let problems: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
    assert!(
        problems.iter().any(|p| p.contains("state.sync_interval: must be between 10ms and 60s")),
        "{problems:?}"
    );
    let cfg = rustle::config::Config::parse(&text("250ms")).expect("a good one");
    assert_eq!(cfg.state.sync_interval, Duration::from_millis(250));
    let cfg = rustle::config::Config::parse("").expect("empty");
    assert_eq!(cfg.state.sync_interval, Duration::from_secs(1), "the default");
}
