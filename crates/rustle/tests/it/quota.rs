//! Quotas as clients see them: a user's traffic quota used up on HTTP, CONNECT, SOCKS5 and
//! UDP, open tunnels cut or let finish, usage kept across a `kill -9`, a reload applied
//! at once, and usage in `/metrics`.

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rustle_bench::{Origin, UdpEcho};

use crate::util::socks::*;
use crate::util::*;

/// The keeper looks every second: a quota used up is refused within about that.
const FLAGGED_WITHIN: Duration = Duration::from_secs(3);

/// A 1 MB daily quota for alice (`extra`: more of its keys).
fn quota(extra: &str) -> String {
    format!(
        "[[quota]]\nname = \"daily\"\nusers = [\"alice\"]\nbytes = \"1MB\"\nperiod = \"day\"\n{extra}\n"
    )
}

/// A GET of `url` as `user` on a new connection: (status, body).
fn get_as(proxy: SocketAddr, url: &str, user: &str, password: &str) -> (u16, String) {
    let mut c = Conn::open(proxy);
    c.send(&request("GET", url, &[&proxy_auth(user, password)], b""));
    let r = c.read_response();
    (r.status, r.text())
}

/// A UDP ASSOCIATE as `user`: the reply code.
fn associate_as(proxy: SocketAddr, user: &str, password: &str) -> u8 {
    let mut s = connect(proxy);
    assert_eq!(login5(&mut s, user, password), 0, "login of {user}");
    s.write_all(&request5(UDP_ASSOCIATE, &Dst::Addr("0.0.0.0:0".parse().unwrap())))
        .expect("write request");
    read_reply5(&mut s).0
}

/// A SOCKS5 CONNECT as `user`: the reply code.
fn connect5_reply(proxy: SocketAddr, user: &str, password: &str, dst: SocketAddr) -> u8 {
    let mut s = connect(proxy);
    assert_eq!(login5(&mut s, user, password), 0, "login of {user}");
    s.write_all(&request5(CONNECT, &Dst::Addr(dst))).expect("write request");
    read_reply5(&mut s).0
}

#[test]
fn http_and_connect_are_refused_once_the_quota_is_used_up() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(
        &(auth_http_config("") + &quota("") + "[admin]\nlisten = \"127.0.0.1:0\"\n"),
    );
    let dir = TempDir::new("quota-http");
    let file = dir.file("body");
    let proxy_url = proxy_url_with(proxy.addr(), "alice", "secret");
    let url = origin.url("/bytes/1100000");
    let Some(out) = curl(&["-sS", "-x", &proxy_url, "-o", file.to_str().unwrap(), &url]) else {
        return;
    };
    assert_success("curl through the proxy", &out);
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 1_100_000);
    let small = origin.url("/bytes/10");
    let (status, body) = wait_for(FLAGGED_WITHIN, "alice refused", || {
        let (status, body) = get_as(proxy.addr(), &small, "alice", "secret");
        (status == 403).then_some((status, body))
    });
    assert_eq!(status, 403);
    assert!(body.starts_with("quota \"daily\" used up (1000000 bytes); resets "), "{body}");
    // curl sees the same refusal.
    let out = curl(&["-sS", "-x", &proxy_url, "-w", "%{http_code}", "-o", "/dev/null", &small])
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "403");
    // A tunnel too.
    let (_, r) =
        connect_with(proxy.addr(), &origin.addr().to_string(), &[&proxy_auth("alice", "secret")]);
    assert_eq!(r.status, 403, "{}", r.head_text());
    assert!(r.text().contains("quota \"daily\""), "{}", r.text());
    // Bob has no quota.
    assert_eq!(get_as(proxy.addr(), &small, "bob", "hunter2").0, 200);
    // The refusal is in the access log, and the usage in the metrics.
    let line = proxy.log_line(|l| l.contains(" 403 ") && l.contains("alice"));
    assert!(line.contains("quota"), "{line}");
    let metrics = String::from_utf8_lossy(&raw_to(
        proxy.admin_addr(),
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
    ))
    .to_string();
    assert!(
        metrics.contains("rustle_quota_limit_bytes{quota=\"daily\",user=\"alice\"} 1000000"),
        "{metrics}"
    );
    assert!(metrics.contains("rustle_quota_exceeded{quota=\"daily\",user=\"alice\"} 1"));
    let used = metrics
        .lines()
        .find_map(|l| l.strip_prefix("rustle_quota_used_bytes{quota=\"daily\",user=\"alice\"} "))
        .and_then(|v| v.parse::<u64>().ok())
        .expect("rustle_quota_used_bytes for alice");
    assert!(used >= 1_100_000, "{used}");
}

#[test]
fn socks5_and_udp_are_refused_once_the_quota_is_used_up() {
    let origin = Origin::start().unwrap();
    let echo = UdpEcho::start().unwrap();
    let proxy = Proxy::from_toml(&(socks_config() + &quota("")));
    // UDP counts as it goes: 20 datagrams of 30 KB there and back are 1.2 MB.
    let (_control, relay) =
        associate5(proxy.addr(), Some(("alice", "secret")), "0.0.0.0:0".parse().unwrap());
    let sock = udp_client();
    let payload = vec![7u8; 30_000];
    for _ in 0..20 {
        sock.send_to(&datagram(echo.addr(), &payload), relay).unwrap();
        let (_, got) = recv_via(&sock, relay);
        assert_eq!(got.len(), payload.len());
    }
    wait_for(FLAGGED_WITHIN, "alice refused a UDP association", || {
        (associate_as(proxy.addr(), "alice", "secret") == 2).then_some(())
    });
    assert_eq!(connect5_reply(proxy.addr(), "alice", "secret", origin.addr()), 2);
    assert_eq!(connect5_reply(proxy.addr(), "bob", "hunter2", origin.addr()), 0);
}

/// A SOCKS listener requiring alice/secret or bob/hunter2.
fn socks_config() -> String {
    r#"
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
auth = true
[auth]
[[auth.user]]
name = "alice"
password = "plain:secret"
rate_down = "16mbit"
[[auth.user]]
name = "bob"
password = "plain:hunter2"
"#
    .to_string()
}

#[test]
fn a_socks5_download_is_counted_while_it_runs() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&(socks_config() + &quota("")));
    // 1.5 MB at 2 MB/s: counted before the tunnel ends.
    let mut s = connect5_as(proxy.addr(), "alice", "secret", &Dst::Addr(origin.addr()));
    let (got, _) = timed_download(&mut s, origin.addr(), 1_500_000);
    assert_eq!(got, 1_500_000);
    wait_for(FLAGGED_WITHIN, "alice refused", || {
        (connect5_reply(proxy.addr(), "alice", "secret", origin.addr()) == 2).then_some(())
    });
}

/// A tunnel's download at alice's 16 Mbit/s (2 MB/s) of 6 MB: (bytes, how long).
fn slow_download(proxy: &Proxy, origin: &Origin) -> (usize, Duration) {
    let mut s = connect5_as(proxy.addr(), "alice", "secret", &Dst::Addr(origin.addr()));
    let start = Instant::now();
    let (got, _) = timed_download(&mut s, origin.addr(), 6_000_000);
    (got, start.elapsed())
}

#[test]
fn on_exceeded_close_cuts_an_open_download() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&(socks_config() + &quota("on_exceeded = \"close\"")));
    let (got, took) = slow_download(&proxy, &origin);
    // Used up after 0.5 s; the keeper sees it within a second.
    assert!(got < 5_000_000, "{got} bytes in {took:?}: not cut");
    assert!(took < Duration::from_millis(2500), "cut after {took:?}");
    assert!(got >= 1_000_000, "{got}");
    let line = proxy.log_line(|l| l.contains(" CONNECT ") && l.contains("alice"));
    assert!(line.contains("quota"), "{line}");
}

#[test]
fn on_exceeded_finish_lets_an_open_download_finish() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&(socks_config() + &quota("")));
    let (got, _) = slow_download(&proxy, &origin);
    assert_eq!(got, 6_000_000);
    assert_eq!(connect5_reply(proxy.addr(), "alice", "secret", origin.addr()), 2);
}

#[test]
fn a_reload_changing_the_quota_applies_at_once() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&(auth_http_config("") + &quota("")));
    let (status, _) = get_as(proxy.addr(), &origin.url("/bytes/1100000"), "alice", "secret");
    assert_eq!(status, 200);
    let small = origin.url("/bytes/10");
    wait_for(FLAGGED_WITHIN, "alice refused", || {
        (get_as(proxy.addr(), &small, "alice", "secret").0 == 403).then_some(())
    });
    let warnings =
        proxy.reload_toml(&(auth_http_config("") + &quota("").replace("\"1MB\"", "\"2MB\"")));
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(get_as(proxy.addr(), &small, "alice", "secret").0, 200, "the raised quota");
    // A quota removed drops its usage and its refusals.
    let (status, _) = get_as(proxy.addr(), &origin.url("/bytes/1100000"), "alice", "secret");
    assert_eq!(status, 200);
    wait_for(FLAGGED_WITHIN, "alice refused at 2MB", || {
        (get_as(proxy.addr(), &small, "alice", "secret").0 == 403).then_some(())
    });
    proxy.reload_toml(&auth_http_config(""));
    assert_eq!(get_as(proxy.addr(), &small, "alice", "secret").0, 200, "no quota");
}

#[test]
fn usage_is_kept_across_kill_9() {
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("quota-kill");
    let state = dir.file("usage.json");
    let cfg = dir.file("rustle.toml");
    let text = auth_http_config("")
        + &quota("")
        + &format!("[state]\npath = {:?}\nflush_interval = \"1s\"\n", state.to_str().unwrap());
    std::fs::write(&cfg, &text).unwrap();
    let args = ["--config", cfg.to_str().unwrap(), "--workers", "1"];
    let mut bin = crate::lifecycle::Binary::start_with(&args, "http");
    let (status, _) = get_as(bin.addr, &origin.url("/bytes/1100000"), "alice", "secret");
    assert_eq!(status, 200);
    // Within one flush interval (1 s) of the keeper's look, the usage is in the file.
    wait_for(Duration::from_secs(4), "usage written", || {
        let text = std::fs::read_to_string(&state).ok()?;
        text.contains("1100").then_some(())
    });
    bin.kill_9();
    drop(bin);
    let bin = crate::lifecycle::Binary::start_with(&args, "http");
    let (status, body) = get_as(bin.addr, &origin.url("/bytes/10"), "alice", "secret");
    assert_eq!(status, 403, "{body}\n{}", bin.stderr());
    assert!(body.contains("quota \"daily\""), "{body}");
}

#[test]
fn on_exceeded_close_cuts_an_open_connect_download() {
    let origin = Origin::start().unwrap();
    let users = auth_http_config("").replace(
        "name = \"alice\"\npassword = \"plain:secret\"\n",
        "name = \"alice\"\npassword = \"plain:secret\"\nrate_down = \"16mbit\"\n",
    );
    let proxy = Proxy::from_toml(&(users + &quota("on_exceeded = \"close\"")));
    let alice = proxy_auth("alice", "secret");
    let (mut t, r) = connect_with(proxy.addr(), &origin.addr().to_string(), &[&alice]);
    assert_eq!(r.status, 200, "{}", r.head_text());
    let start = Instant::now();
    let (got, _) = timed_download(&mut t.s, origin.addr(), 6_000_000);
    let took = start.elapsed();
    assert!((1_000_000..5_000_000).contains(&got), "{got} bytes in {took:?}: not cut");
    assert!(took < Duration::from_millis(2500), "cut after {took:?}");
}

#[test]
fn bad_quotas_are_reported_with_their_lines() {
    let text = "[[quota]]\nname = \"q\"\nusers = [\"a\"]\nbytes = \"1mb\"\nperiod = \"day\"\n\
                [[quota]]\nname = \"r\"\nbytes = 5\nperiod = \"fortnight\"\n\
                [state]\ntime_zone = \"Mars/Olympus\"\n";
    let problems: Vec<String> = match rustle::config::Config::parse(text) {
        Ok(_) => panic!("accepted"),
        Err(p) => p.iter().map(|p| p.to_string()).collect(),
    };
    let all = problems.join("\n");
    assert!(all.contains("line 4") && all.contains("unknown unit \"mb\""), "{all}");
    assert!(all.contains("period \"fortnight\""), "{all}");
    assert!(all.contains("Mars/Olympus"), "{all}");
}

/// An HTTP/2 GET of `url` as alice on `c`: (status, body).
async fn h2_get(c: &mut h2::client::SendRequest<bytes::Bytes>, url: &str) -> (u16, Vec<u8>) {
    let req = http::Request::builder()
        .uri(url)
        .header("proxy-authorization", proxy_auth("alice", "secret").split_once(": ").unwrap().1)
        .body(())
        .unwrap();
    let mut c = c.clone().ready().await.expect("ready");
    let (resp, _) = c.send_request(req, true).expect("send request");
    let resp = tokio::time::timeout(Duration::from_secs(10), resp).await.expect("in time");
    let (parts, mut body) = resp.expect("response").into_parts();
    let mut out = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("body");
        let _ = body.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    (parts.status.as_u16(), out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn http2_streams_are_refused_once_the_quota_is_used_up() {
    let origin = Origin::start().unwrap();
    let cfg =
        auth_http_config("").replace("auth = true\n", "auth = true\nh2c = true\n") + &quota("");
    let proxy = Proxy::from_toml(&cfg);
    let tcp = tokio::net::TcpStream::connect(proxy.addr()).await.expect("connect");
    let (mut c, conn) = h2::client::Builder::new()
        .initial_window_size(4 << 20)
        .handshake(tcp)
        .await
        .expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let (status, body) = h2_get(&mut c, &origin.url("/bytes/1100000")).await;
    assert_eq!((status, body.len()), (200, 1_100_000));
    let small = origin.url("/bytes/10");
    let start = Instant::now();
    loop {
        let (status, body) = h2_get(&mut c, &small).await;
        if status == 403 {
            let body = String::from_utf8_lossy(&body);
            assert!(body.starts_with("quota \"daily\" used up"), "{body}");
            break;
        }
        assert!(start.elapsed() < FLAGGED_WITHIN, "alice not refused on HTTP/2");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn on_exceeded_close_ends_a_udp_association() {
    let echo = UdpEcho::start().unwrap();
    let proxy = Proxy::from_toml(&(socks_config() + &quota("on_exceeded = \"close\"")));
    let (mut control, relay) =
        associate5(proxy.addr(), Some(("alice", "secret")), "0.0.0.0:0".parse().unwrap());
    let sock = udp_client();
    let payload = vec![7u8; 30_000];
    for _ in 0..20 {
        sock.send_to(&datagram(echo.addr(), &payload), relay).unwrap();
        recv_via(&sock, relay);
    }
    // Once the keeper has seen it, the next datagram ends the association.
    wait_for(FLAGGED_WITHIN, "the association ended", || {
        sock.send_to(&datagram(echo.addr(), b"more"), relay).unwrap();
        closed_within(&mut control, Duration::from_millis(200)).then_some(())
    });
    let line = proxy.log_line(|l| l.contains(" UDP ") && l.contains("alice"));
    assert!(line.contains("quota"), "{line}");
}

#[test]
fn usage_is_written_at_shutdown_and_read_at_start() {
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("quota-stop");
    let state = dir.file("usage.json");
    // A flush interval longer than the test: only the shutdown writes.
    let text = auth_http_config("")
        + &quota("")
        + &format!("[state]\npath = {:?}\nflush_interval = \"1h\"\n", state.to_str().unwrap());
    let proxy = Proxy::from_toml(&text);
    let (status, _) = get_as(proxy.addr(), &origin.url("/bytes/400000"), "alice", "secret");
    assert_eq!(status, 200);
    drop(proxy);
    let saved = std::fs::read_to_string(&state).expect("usage written at shutdown");
    assert!(saved.contains("\"alice\""), "{saved}");
    // The next process starts from it: 400 kB used, 700 kB more use the quota up.
    let proxy = Proxy::from_toml(&text);
    let (status, _) = get_as(proxy.addr(), &origin.url("/bytes/700000"), "alice", "secret");
    assert_eq!(status, 200);
    let small = origin.url("/bytes/10");
    wait_for(FLAGGED_WITHIN, "alice refused", || {
        (get_as(proxy.addr(), &small, "alice", "secret").0 == 403).then_some(())
    });
}

#[test]
fn socks4_is_refused_with_0x5b_once_the_quota_is_used_up() {
    let origin = Origin::start().unwrap();
    let cfg = socks_config().replace("auth = true\n", "auth = true\nsocks4_users = true\n");
    let proxy = Proxy::from_toml(&(cfg + &quota("")));
    let mut s = connect5_as(proxy.addr(), "alice", "secret", &Dst::Addr(origin.addr()));
    let (got, _) = timed_download(&mut s, origin.addr(), 1_100_000);
    assert_eq!(got, 1_100_000);
    let socks4 = |user: &str| {
        let mut s = connect(proxy.addr());
        s.write_all(&request4(1, v4(origin.addr()), user, None)).expect("write request");
        read_reply4(&mut s).0
    };
    wait_for(FLAGGED_WITHIN, "alice refused on SOCKS4", || (socks4("alice") == 0x5B).then_some(()));
    assert_eq!(socks4("bob"), 0x5A);
}

/// alice at 16 Mbit/s (2 MB/s) down on an HTTP listener, with a 1 MB quota (`extra`).
fn slow_http(extra: &str) -> Proxy {
    let users = auth_http_config("").replace(
        "name = \"alice\"\npassword = \"plain:secret\"\n",
        "name = \"alice\"\npassword = \"plain:secret\"\nrate_down = \"16mbit\"\n",
    );
    Proxy::from_toml(&(users + &quota(extra)))
}

#[test]
fn on_exceeded_close_cuts_a_plain_http_download_in_flight() {
    let origin = Origin::start().unwrap();
    let proxy = slow_http("on_exceeded = \"close\"");
    let mut s = connect(proxy.addr());
    let url = origin.url("/bytes/6000000");
    s.write_all(&request("GET", &url, &[&proxy_auth("alice", "secret")], b"")).unwrap();
    let start = Instant::now();
    let (got, _) = read_until_close(&mut s);
    let took = start.elapsed();
    // Counted per write: used up after 0.5 s, seen within a second, cut at the sweep.
    assert!((1_000_000..5_000_000).contains(&got.len()), "{} bytes in {took:?}", got.len());
    assert!(took < Duration::from_millis(2500), "cut after {took:?}");
    let line = proxy.log_line(|l| l.contains(" GET ") && l.contains("alice"));
    assert!(line.contains("quota"), "{line}");
}

#[test]
fn a_plain_http_download_counts_when_its_client_leaves_at_the_end() {
    let origin = Origin::start().unwrap();
    let proxy = slow_http("");
    // The client leaves as soon as it has the body, while the proxy may still be pacing.
    let mut c = Conn::open(proxy.addr());
    c.send(&request("GET", &origin.url("/bytes/1100000"), &[&proxy_auth("alice", "secret")], b""));
    assert_eq!(c.read_response().body.len(), 1_100_000);
    drop(c);
    let small = origin.url("/bytes/10");
    wait_for(FLAGGED_WITHIN, "alice refused", || {
        (get_as(proxy.addr(), &small, "alice", "secret").0 == 403).then_some(())
    });
    let line = proxy.log_line(|l| l.contains("/bytes/1100000"));
    assert!(line.contains(" 1100000 "), "{line}");
}
