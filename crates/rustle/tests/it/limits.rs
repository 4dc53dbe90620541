//! Limits as clients see them: concurrent connections per client address and per user,
//! bandwidth per listener and per user, and a SIGHUP reload of users on the real binary.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use rustle_bench::pattern::pattern;
use rustle_bench::{Origin, TcpEcho};

use crate::util::socks::*;
use crate::util::*;

/// A new SOCKS5 connection from `from` that the proxy closes without a word.
fn assert_socks_refused(from: &str, proxy: std::net::SocketAddr) {
    let mut s = connect_from(from, proxy);
    let _ = s.write_all(&[5, 1, 0]);
    let (got, closed) = read_until_close(&mut s);
    assert!(closed, "a connection over the limit was left open");
    assert!(got.is_empty(), "a connection over the limit got {got:?}");
}

/// A closed connection's slot is freed once the proxy has seen the close, a moment after
/// it: new connections are tried (up to 5 s) until one is let in; the refused ones are
/// closed at once and hold nothing.
const SLOT_FREED_WITHIN: Duration = Duration::from_secs(5);

/// One GET of `url` through `proxy` from `from`, on a new connection: its status.
fn status_from(from: &str, proxy: std::net::SocketAddr, url: &str, headers: &[&str]) -> u16 {
    let mut c = Conn::open_from(from, proxy);
    c.send(&request("GET", url, headers, b""));
    c.read_response().status
}

#[test]
fn connections_per_client_address() {
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let proxy = Proxy::from_toml(
        r#"
[[listener]]
listen = "127.0.0.1:0"
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
[limits]
max_connections_per_client = 2
"#,
    );
    let url = origin.url("/bytes/3");
    let mut held: Vec<Conn> = (0..2).map(|_| Conn::open_from("127.0.0.1", proxy.addr())).collect();
    for c in &mut held {
        c.send(&get(&url));
        assert_eq!(c.read_response().status, 200);
    }
    let mut third = Conn::open_from("127.0.0.1", proxy.addr());
    third.send(&get(&url));
    let r = third.read_response();
    assert_eq!(r.status, 503, "{}", r.head_text());
    assert!(r.text().contains("too many connections"), "{}", r.text());
    third.assert_closed();
    // The limit counts every listener of the address: SOCKS is closed too.
    assert_socks_refused("127.0.0.1", proxy.addr_of(1));
    // Another client address is not affected.
    let mut other = Conn::open_from("127.0.0.2", proxy.addr());
    other.send(&get(&url));
    assert_eq!(other.read_response().body, pattern(3));
    // The held ones still work; once one closes, a new one is accepted.
    held[0].send(&get(&url));
    assert_eq!(held[0].read_response().status, 200);
    drop(held.pop());
    wait_for(SLOT_FREED_WITHIN, "a new connection from 127.0.0.1 served", || {
        (status_from("127.0.0.1", proxy.addr(), &url, &[]) == 200).then_some(())
    });
    drop(held);

    // SOCKS tunnels from one address: the third is closed, a freed slot is reusable.
    let dst = Dst::Addr(echo.addr());
    // A tunnel, or `None` when the proxy closes the connection without a word.
    let try_open = |from: &str| {
        let mut s = connect_from(from, proxy.addr_of(1));
        s.write_all(&[5, 1, 0]).ok()?;
        let mut choice = [0u8; 2];
        s.read_exact(&mut choice).ok()?;
        assert_eq!(choice, [5, 0]);
        s.write_all(&request5(CONNECT, &dst)).unwrap();
        assert_eq!(read_reply5(&mut s).0, 0);
        Some(s)
    };
    let open = |from: &str| try_open(from).expect("a SOCKS5 tunnel under the limit");
    let mut t1 = open("127.0.0.3");
    let mut t2 = open("127.0.0.3");
    assert_socks_refused("127.0.0.3", proxy.addr_of(1));
    assert_echoes(&mut t1, b"one");
    assert_echoes(&mut t2, b"two");
    drop(t1);
    let mut t3 = wait_for(SLOT_FREED_WITHIN, "a tunnel from 127.0.0.3", || try_open("127.0.0.3"));
    assert_echoes(&mut t3, b"three");
}

#[test]
fn connections_per_user() {
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let proxy =
        Proxy::from_toml(&(auth_http_config("") + "[limits]\nmax_connections_per_user = 1\n"));
    let url = origin.url("/bytes/3");
    let alice = proxy_auth("alice", "secret");
    let mut first = Conn::to_proxy(&proxy);
    first.send(&request("GET", &url, &[&alice], b""));
    assert_eq!(first.read_response().status, 200);

    let mut second = Conn::to_proxy(&proxy);
    second.send(&request("GET", &url, &[&alice], b""));
    let r = second.read_response();
    assert_eq!(r.status, 503, "second connection of alice: {}", r.head_text());
    assert!(r.text().contains("for this user"), "{}", r.text());
    second.assert_closed();
    let (_, r) = connect_with(proxy.addr(), &echo.addr().to_string(), &[&alice]);
    assert_eq!(r.status, 503, "a tunnel of alice: {}", r.head_text());

    // Another user is not affected, on as many connections as the limit allows.
    let mut bob = Conn::to_proxy(&proxy);
    bob.send(&request("GET", &url, &[&proxy_auth("bob", "hunter2")], b""));
    assert_eq!(bob.read_response().status, 200);
    // alice's first connection keeps working.
    first.send(&request("GET", &url, &[&alice], b""));
    assert_eq!(first.read_response().status, 200);
    drop(first);
    let mut t =
        wait_for(SLOT_FREED_WITHIN, "a tunnel of alice after her first connection closed", || {
            let (t, r) = connect_with(proxy.addr(), &echo.addr().to_string(), &[&alice]);
            (r.status == 200).then_some(t)
        });
    assert_echoes(&mut t.s, b"alice again");
}

/// Mbit/s of `bytes` beyond the bucket's initial `burst`, moved in `took`.
fn mbit_per_s(bytes: usize, burst: u64, took: Duration) -> f64 {
    (bytes as f64 - burst as f64) * 8.0 / took.as_secs_f64() / 1e6
}

#[test]
fn listener_rate_down_limits_a_download() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nrate_down = \"10mbit\"\nrate_up = \"10mbit\"\n",
    );
    let (mut t, r) = connect_with(proxy.addr(), &origin.addr().to_string(), &[]);
    assert_eq!(r.status, 200);
    // 6 MB at 10 Mbit/s (1.25 MB/s) is 4.8 s, less the initial burst (125 kB, 0.1 s).
    let n = 6_000_000;
    let (got, took) = timed_download(&mut t.s, origin.addr(), n);
    assert_eq!(got as u64, n);
    let rate = mbit_per_s(got, 125_000, took);
    eprintln!("listener rate_down 10mbit measured {rate:.3} Mbit/s over {took:?}");
    assert!((9.0..=11.0).contains(&rate), "{rate:.2} Mbit/s in {took:?}, expected 10");
}

#[test]
fn user_rate_down_limits_socks5_tunnels() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(
        r#"
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
auth = true
[auth]
[[auth.user]]
name = "alice"
password = "plain:secret"
[[auth.user]]
name = "bob"
password = "plain:hunter2"
rate_down = "16mbit"
[limits]
user_rate_down = "8mbit"
"#,
    );
    let (p, o) = (proxy.addr(), origin.addr());
    // alice: two tunnels sharing 8 Mbit/s (1 MB/s), 1 MB each; bob alone at his own
    // 16 Mbit/s (2 MB/s), 4 MB. All about 2 s, at the same time.
    let start = Instant::now();
    let download = move |user: &'static str, pw: &'static str, n: u64| {
        std::thread::spawn(move || {
            let mut s = connect5_as(p, user, pw, &Dst::Addr(o));
            let (got, _) = timed_download(&mut s, o, n);
            assert_eq!(got as u64, n, "{user}");
            start.elapsed()
        })
    };
    let a1 = download("alice", "secret", 1_000_000);
    let a2 = download("alice", "secret", 1_000_000);
    let b = download("bob", "hunter2", 4_000_000);
    let alice_took = a1.join().unwrap().max(a2.join().unwrap());
    let bob_took = b.join().unwrap();
    let alice = mbit_per_s(2_000_000, 100_000, alice_took);
    let bob = mbit_per_s(4_000_000, 200_000, bob_took);
    assert!((7.2..=8.8).contains(&alice), "alice: {alice:.2} Mbit/s in {alice_took:?}, expected 8");
    assert!((14.4..=17.6).contains(&bob), "bob: {bob:.2} Mbit/s in {bob_took:?}, expected 16");
}

#[test]
fn sighup_reloads_users_and_keeps_open_tunnels() {
    let echo = TcpEcho::start().unwrap();
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("sighup");
    let users = users_file(&dir, &["alice:plain:secret"]);
    let cfg = dir.file("rustle.toml");
    std::fs::write(
        &cfg,
        format!(
            "workers = 1\n[log]\naccess = \"off\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\
             auth = true\n[auth]\nusers_file = {:?}\n",
            users.to_str().unwrap()
        ),
    )
    .unwrap();
    let (bin, addr) = RustleProcess::start(&["--config", cfg.to_str().unwrap()]);
    let url = origin.url("/bytes/5");
    let status_as = |user: &str, pw: &str| {
        let mut c = Conn::open(addr);
        c.send(&request("GET", &url, &[&proxy_auth(user, pw)], b""));
        c.read_response().status
    };
    assert_eq!(status_as("alice", "secret"), 200, "{}", bin.stderr());
    assert_eq!(status_as("bob", "hunter2"), 407);
    let (mut tunnel, r) =
        connect_with(addr, &echo.addr().to_string(), &[&proxy_auth("alice", "secret")]);
    assert_eq!(r.status, 200, "{}", r.head_text());
    assert_echoes(&mut tunnel.s, b"before the reload");

    // Replace alice with bob, then SIGHUP.
    std::fs::write(&users, "bob:plain:hunter2\n").unwrap();
    bin.signal("HUP");
    assert!(
        bin.wait_for_stderr("SIGHUP: reloaded", Duration::from_secs(5)),
        "no reload message:\n{}",
        bin.stderr()
    );
    assert_echoes(&mut tunnel.s, b"after the reload: the open tunnel goes on");
    assert_eq!(status_as("alice", "secret"), 407, "alice still accepted after her removal");
    assert_eq!(status_as("bob", "hunter2"), 200, "bob not accepted after the reload");

    // A broken users file changes nothing.
    std::fs::write(&users, "carol\n").unwrap();
    bin.signal("HUP");
    assert!(
        bin.wait_for_stderr("keeping the previous configuration", Duration::from_secs(5)),
        "no message about the bad reload:\n{}",
        bin.stderr()
    );
    assert_eq!(status_as("bob", "hunter2"), 200, "a bad reload changed the users");
    assert_echoes(&mut tunnel.s, b"still open");
}

/// After a reload removes a user, that user's next request is refused, also on a
/// connection kept alive from before (the credentials cache is invalidated by a reload;
/// the per-connection shortcut must be too).
#[test]
fn a_removed_user_is_refused_on_a_kept_alive_connection() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&auth_http_config(""));
    let url = origin.url("/bytes/2");
    let alice = proxy_auth("alice", "secret");
    let mut kept = Conn::to_proxy(&proxy);
    kept.send(&request("GET", &url, &[&alice], b""));
    assert_eq!(kept.read_response().status, 200);

    proxy.reload_toml(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n\
         [auth]\n[[auth.user]]\nname = \"bob\"\npassword = \"plain:hunter2\"\n",
    );
    // The reload is in force when `reload_toml` returns: a new connection as alice is
    // refused.
    let r = parse_response(&raw(&proxy, &request("GET", &url, &[&alice], b"")));
    assert_eq!(r.status, 407, "alice still accepted: {}", r.head_text());
    kept.send(&request("GET", &url, &[&alice], b""));
    let r = kept.read_response();
    assert_eq!(
        r.status, 407,
        "a request of the removed user alice was served on her kept-alive connection"
    );
}

/// Over the per-client limit, an `auto` listener cannot know yet whether the client
/// speaks HTTP or SOCKS: a SOCKS client must not get HTTP bytes as its method reply.
#[test]
fn a_socks_client_over_the_limit_on_an_auto_listener_gets_no_http_bytes() {
    let echo = TcpEcho::start().unwrap();
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(
        "[[listener]]\nkind = \"auto\"\nlisten = \"127.0.0.1:0\"\n\
         [limits]\nmax_connections_per_client = 1\n",
    );
    let mut held = connect5(proxy.addr(), &Dst::Addr(echo.addr()));
    assert_echoes(&mut held, b"held");
    // An HTTP client over the limit gets its 503.
    let r = parse_response(&raw(&proxy, &get(&origin.url("/bytes/1"))));
    assert_eq!(r.status, 503, "{}", r.head_text());
    let mut s = connect(proxy.addr());
    let _ = s.write_all(&[5, 1, 0]);
    let (got, closed) = read_until_close(&mut s);
    assert!(closed, "a connection over the limit was left open");
    assert!(
        got.is_empty() || got.first() == Some(&5),
        "a SOCKS5 client over the limit got, as its method selection: {:?}",
        String::from_utf8_lossy(&got)
    );
}
