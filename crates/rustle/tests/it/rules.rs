//! Access rules as clients see them: each condition (clients, users, groups, hosts,
//! destinations, ports, protocols) allowing and denying, first match wins, the default
//! action, what a denial looks like (403 naming the rule, SOCKS5 reply 0x02, the log),
//! the built-in protections (no loops, no private destinations) and the refusal to start
//! an open proxy.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use rustle_bench::pattern::pattern;
use rustle_bench::{Origin, TcpEcho};

use crate::util::socks::*;
use crate::util::*;

/// GET `url` through `proxy` from the local address `from` with extra header lines.
fn get_from(from: &str, proxy: SocketAddr, url: &str, headers: &[&str]) -> Resp {
    let mut c = Conn::open_from(from, proxy);
    c.send(&request("GET", url, headers, b""));
    c.read_response()
}

fn get_via(proxy: &Proxy, url: &str) -> Resp {
    get_from("127.0.0.1", proxy.addr(), url, &[])
}

/// Asserts a 403 whose body names `rule` (`rule `NAME`` or "the default action").
#[track_caller]
fn assert_denied(r: &Resp, rule: &str) {
    assert_eq!(r.status, 403, "{}{}", r.head_text(), r.text());
    assert!(r.text().contains(rule), "the 403 does not name {rule}: {}", r.text());
}

#[track_caller]
fn assert_ok(r: &Resp) {
    assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
}

/// A SOCKS5 CONNECT on a no-auth listener: the reply code.
fn socks5_reply(proxy: SocketAddr, dst: &Dst<'_>) -> u8 {
    open5(proxy, CONNECT, dst).1
}

#[test]
fn clients_condition() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(
        r#"
default_action = "deny"
[[rule]]
name = "block-one"
action = "deny"
clients = ["127.0.0.1"]
[[rule]]
name = "loopback-net"
action = "allow"
clients = ["10.0.0.0/8", "127.0.0.0/8"]
"#,
    );
    let url = origin.url("/bytes/5");
    assert_denied(&get_from("127.0.0.1", proxy.addr(), &url, &[]), "rule `block-one`");
    assert_ok(&get_from("127.0.0.2", proxy.addr(), &url, &[]));
    // A real client from another source address.
    if let Some(out) = curl(&["--interface", "127.0.0.3", "-x", &proxy.url(), &url]) {
        assert_success("curl --interface 127.0.0.3", &out);
        assert_eq!(out.stdout, pattern(5));
    }
    assert_eq!(origin.requests(), 2);
}

#[test]
fn users_and_groups_conditions() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(
        r#"
default_action = "deny"
[[listener]]
listen = "127.0.0.1:0"
auth = true
[auth]
[[auth.user]]
name = "alice"
password = "plain:a"
groups = ["staff"]
[[auth.user]]
name = "bob"
password = "plain:b"
[[auth.user]]
name = "carol"
password = "plain:c"
groups = ["staff"]
[[auth.user]]
name = "dave"
password = "plain:d"
groups = ["staff"]
[[auth.user]]
name = "eve"
password = "plain:e"
[auth.groups]
ops = ["carol"]
[[rule]]
name = "not-dave"
action = "deny"
users = ["dave"]
[[rule]]
name = "no-ops"
action = "deny"
groups = ["ops"]
[[rule]]
name = "bob-may"
action = "allow"
users = ["bob"]
[[rule]]
name = "staff-may"
action = "allow"
groups = ["staff"]
"#,
    );
    let url = origin.url("/bytes/1");
    let as_user =
        |u: &str, p: &str| get_from("127.0.0.1", proxy.addr(), &url, &[&proxy_auth(u, p)]);
    assert_ok(&as_user("alice", "a")); // staff-may (group from the user entry)
    assert_ok(&as_user("bob", "b")); // bob-may (user)
    assert_denied(&as_user("carol", "c"), "rule `no-ops`"); // group from [auth.groups]
    assert_denied(&as_user("dave", "d"), "rule `not-dave`"); // user
    assert_denied(&as_user("eve", "e"), "the default action"); // no group, no rule
    assert_eq!(origin.requests(), 2);

    // `users = ["*"]`: any authenticated user, and nobody on a listener without auth.
    let proxy = Proxy::from_toml(
        r#"
default_action = "deny"
[[listener]]
listen = "127.0.0.1:0"
auth = true
[[listener]]
listen = "127.0.0.1:0"
[auth]
[[auth.user]]
name = "eve"
password = "plain:e"
[[rule]]
name = "logged-in"
action = "allow"
users = ["*"]
"#,
    );
    assert_ok(&get_from("127.0.0.1", proxy.addr(), &url, &[&proxy_auth("eve", "e")]));
    assert_denied(&get_from("127.0.0.1", proxy.addr_of(1), &url, &[]), "the default action");
}

#[test]
fn hosts_condition_exact_and_suffix() {
    let origin = Origin::start().unwrap();
    let port = origin.addr().port();
    let proxy = Proxy::from_toml(
        r#"
[timeouts]
connect = "3s"
[[rule]]
name = "no-localhost-name"
action = "deny"
hosts = ["LocalHost"]
[[rule]]
name = "no-blocked-subdomains"
action = "deny"
hosts = ["*.blocked.test"]
"#,
    );
    let named = |host: &str| get_via(&proxy, &format!("http://{host}:{port}/bytes/2"));
    assert_denied(&named("localhost"), "rule `no-localhost-name`");
    assert_denied(&named("LOCALHOST"), "rule `no-localhost-name`");
    // The same destination by another name is not this rule's business.
    assert_ok(&named("127.0.0.1"));
    let (_, r) = connect_with(proxy.addr(), &format!("localhost:{port}"), &[]);
    assert_denied(&r, "rule `no-localhost-name`");
    assert_denied(&named("www.blocked.test"), "rule `no-blocked-subdomains`");
    assert_denied(&named("a.b.BLOCKED.test"), "rule `no-blocked-subdomains`");
    // `*.suffix` is subdomains only: the name itself goes on (and fails to resolve).
    let r = named("blocked.test");
    assert_ne!(r.status, 403, "`*.blocked.test` matched blocked.test: {}", r.text());
    assert!(!r.text().contains("denied"), "{}", r.text());
    assert_eq!(origin.requests(), 1);

    // Allowing by host, the rest denied by default.
    let proxy = Proxy::from_toml(
        r#"
default_action = "deny"
[timeouts]
connect = "3s"
[[rule]]
name = "allowed-hosts"
action = "allow"
hosts = ["127.0.0.1", "*.allowed.test"]
"#,
    );
    let named = |host: &str| get_via(&proxy, &format!("http://{host}:{port}/bytes/2"));
    assert_ok(&named("127.0.0.1"));
    assert_denied(&named("localhost"), "the default action");
    assert_denied(&named("allowed.test"), "the default action");
    // Allowed by the rule: the proxy tries to resolve it (there is no such name).
    let r = named("www.allowed.test");
    assert_ne!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("resolve"), "{}", r.text());
}

#[test]
fn destinations_are_checked_on_the_resolved_address() {
    let origin = Origin::start().unwrap();
    let port = origin.addr().port();
    // DNS cannot smuggle: `localhost` is not an IP, but it resolves into the block.
    let proxy = Proxy::from_toml(
        r#"
[[listener]]
listen = "127.0.0.1:0"
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
[[rule]]
name = "no-loopback"
action = "deny"
destinations = ["127.0.0.0/8", "::1"]
"#,
    );
    assert_denied(&get_via(&proxy, &format!("http://localhost:{port}/")), "rule `no-loopback`");
    assert_denied(&get_via(&proxy, &origin.url("/")), "rule `no-loopback`");
    let (_, r) = connect_with(proxy.addr(), &format!("localhost:{port}"), &[]);
    assert_denied(&r, "rule `no-loopback`");
    assert_eq!(socks5_reply(proxy.addr_of(1), &Dst::Name("localhost", port)), 2);
    assert_eq!(origin.connections(), 0, "a denied destination was connected to");
    let line = proxy.log_line(|l| l.contains(&format!("socks5://localhost:{port}")));
    assert!(line.contains("no-loopback"), "{line}");

    // Allowing by destination.
    let proxy = Proxy::from_toml(
        r#"
default_action = "deny"
[[rule]]
name = "only-10"
action = "deny"
destinations = ["10.0.0.0/8"]
[[rule]]
name = "loopback-ok"
action = "allow"
destinations = ["127.0.0.0/8"]
"#,
    );
    let r = get_via(&proxy, &format!("http://localhost:{port}/bytes/9"));
    assert_ok(&r);
    assert_eq!(r.body, pattern(9));
}

#[test]
fn ports_condition_exact_and_ranges() {
    let a = Origin::start().unwrap();
    let p = a.addr().port();
    // An origin whose port is outside p-1..=p+1.
    let mut others = Vec::new();
    let b = loop {
        let o = Origin::start().unwrap();
        if o.addr().port().abs_diff(p) > 1 {
            break o;
        }
        others.push(o);
    };
    let q = b.addr().port();
    let proxy = Proxy::from_toml(&format!(
        "[[rule]]\nname = \"exact\"\naction = \"deny\"\nports = [\"{p}\"]\n"
    ));
    assert_denied(&get_via(&proxy, &a.url("/")), "rule `exact`");
    assert_ok(&get_via(&proxy, &b.url("/bytes/1")));

    let proxy = Proxy::from_toml(&format!(
        "default_action = \"deny\"\n\
         [[rule]]\nname = \"low\"\naction = \"deny\"\nports = [\"1-1023\"]\n\
         [[rule]]\nname = \"around-a\"\naction = \"allow\"\nports = [\"{}-{}\", \"443\"]\n",
        p - 1,
        p + 1
    ));
    assert_ok(&get_via(&proxy, &a.url("/bytes/1")));
    assert_denied(&get_via(&proxy, &b.url("/")), "the default action");
    let (_, r) = connect_with(proxy.addr(), "127.0.0.1:80", &[]);
    assert_denied(&r, "rule `low`");
    let (_, r) = connect_with(proxy.addr(), &format!("127.0.0.1:{q}"), &[]);
    assert_denied(&r, "the default action");
    let (mut t, r) = connect_with(proxy.addr(), &format!("127.0.0.1:{p}"), &[]);
    assert_ok(&r);
    assert_eq!(timed_download(&mut t.s, a.addr(), 3).0, 3);
}

/// Whether a TCP relay connection gets to the origin: a GET through it, or a close.
fn relay_get(relay: SocketAddr, origin: &Origin) -> Option<Vec<u8>> {
    let mut s = connect(relay);
    let req =
        format!("GET /bytes/6 HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", origin.addr());
    let _ = s.write_all(req.as_bytes());
    let (got, closed) = read_until_close(&mut s);
    assert!(closed, "relay connection left open");
    (!got.is_empty()).then_some(got)
}

#[test]
fn protocols_condition() {
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let config = |denied: &str| {
        format!(
            r#"
[[listener]]
kind = "auto"
listen = "127.0.0.1:0"
[[listener]]
kind = "relay"
listen = "127.0.0.1:0"
target = "{}"
[[rule]]
name = "deny-some"
action = "deny"
protocols = [{denied}]
"#,
            origin.addr()
        )
    };
    let url = origin.url("/bytes/6");
    let echo_dst = Dst::Addr(echo.addr());

    let proxy = Proxy::from_toml(&config(r#""connect", "relay""#));
    assert_ok(&get_via(&proxy, &url));
    let (_, r) = connect_with(proxy.addr(), &echo.addr().to_string(), &[]);
    assert_denied(&r, "rule `deny-some`");
    let mut s = connect5(proxy.addr(), &echo_dst);
    assert_echoes(&mut s, b"socks5 allowed");
    assert_eq!(relay_get(proxy.addr_of(1), &origin), None, "the relay was not denied");
    proxy.log_line(|l| l.contains(" RELAY ") && l.contains("deny-some"));

    let proxy = Proxy::from_toml(&config(r#""http", "socks5""#));
    assert_denied(&get_via(&proxy, &url), "rule `deny-some`");
    assert_eq!(socks5_reply(proxy.addr(), &echo_dst), 2);
    let (mut t, r) = connect_with(proxy.addr(), &echo.addr().to_string(), &[]);
    assert_ok(&r);
    assert_echoes(&mut t.s, b"connect allowed");
    let got = relay_get(proxy.addr_of(1), &origin).expect("the relay was denied");
    assert!(got.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&got));
}

#[test]
fn first_match_wins_and_the_default_action() {
    let origin = Origin::start().unwrap();
    let port = origin.addr().port();
    let allow_then_deny = r#"
[[rule]]
name = "numeric-ok"
action = "allow"
hosts = ["127.0.0.1"]
[[rule]]
name = "everything-else"
action = "deny"
"#;
    let proxy = Proxy::from_toml(allow_then_deny);
    assert_ok(&get_via(&proxy, &origin.url("/bytes/1")));
    let r = get_via(&proxy, &format!("http://localhost:{port}/"));
    assert_denied(&r, "rule `everything-else`");

    let deny_then_allow = r#"
[[rule]]
name = "everything"
action = "deny"
[[rule]]
name = "numeric-ok"
action = "allow"
hosts = ["127.0.0.1"]
"#;
    let proxy = Proxy::from_toml(deny_then_allow);
    assert_denied(&get_via(&proxy, &origin.url("/")), "rule `everything`");

    // Unnamed rules are named by position.
    let proxy = Proxy::from_toml(
        "[[rule]]\naction = \"allow\"\nports = [\"1\"]\n[[rule]]\naction = \"deny\"\n",
    );
    assert_denied(&get_via(&proxy, &origin.url("/")), "rule `rule 2`");

    let proxy = Proxy::from_toml("default_action = \"deny\"\n");
    assert_denied(&get_via(&proxy, &origin.url("/")), "the default action");
    let (_, r) = connect_with(proxy.addr(), &origin.addr().to_string(), &[]);
    assert_denied(&r, "the default action");
    assert_eq!(origin.requests(), 1);
}

#[test]
fn a_denial_is_named_in_the_403_the_socks_reply_and_the_log() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(
        r#"
[[listener]]
kind = "auto"
listen = "127.0.0.1:0"
[[rule]]
name = "no-origin"
action = "deny"
hosts = ["127.0.0.1"]
"#,
    );
    let url = origin.url("/denied-path");
    let r = get_via(&proxy, &url);
    assert_denied(&r, "rule `no-origin`");
    assert!(r.text().contains("denied by rule"), "{}", r.text());
    let (_, r) = connect_with(proxy.addr(), &origin.addr().to_string(), &[]);
    assert_denied(&r, "rule `no-origin`");
    let (mut s, rep, _) = open5(proxy.addr(), CONNECT, &Dst::Addr(origin.addr()));
    assert_eq!(rep, 2, "SOCKS5 reply: connection not allowed by ruleset");
    assert!(closed_within(&mut s, Duration::from_secs(3)));
    let mut s = connect(proxy.addr());
    s.write_all(&request4(CONNECT, v4(origin.addr()), "", None)).unwrap();
    assert_eq!(read_reply4(&mut s).0, 91, "SOCKS4 reply: rejected");
    assert_eq!(origin.connections(), 0);

    let http = proxy.log_line(|l| l.contains("/denied-path"));
    assert_eq!(LogLine::parse(&http).status, 403, "{http}");
    assert!(http.contains("no-origin"), "{http}");
    let socks5 = proxy.log_line(|l| l.contains("socks5://"));
    assert_eq!(LogLine::parse(&socks5).status, 2, "{socks5}");
    assert!(socks5.contains("no-origin"), "{socks5}");
    let socks4 = proxy.log_line(|l| l.contains("socks4://"));
    assert!(socks4.contains("no-origin"), "{socks4}");
}

#[test]
fn connecting_to_the_proxy_itself_is_refused() {
    let proxy = Proxy::from_toml(
        r#"
[[listener]]
listen = "127.0.0.1:0"
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
"#,
    );
    let (http, socks) = (proxy.addr(), proxy.addr_of(1));
    for target in [http.to_string(), socks.to_string(), format!("localhost:{}", http.port())] {
        let (_, r) = connect_with(http, &target, &[]);
        assert_denied(&r, "built-in");
        assert!(r.text().contains("own listening address"), "{}", r.text());
    }
    assert_denied(&get_via(&proxy, &format!("http://{http}/")), "own listening address");
    assert_eq!(socks5_reply(socks, &Dst::Addr(socks)), 2);
    assert_eq!(socks5_reply(socks, &Dst::Name("localhost", http.port())), 2);
    assert_eq!(
        socks5_reply(socks, &Dst::Addr(format!("0.0.0.0:{}", http.port()).parse().unwrap())),
        2
    );
    proxy.log_line(|l| l.contains("socks5://") && l.contains("own listening address"));
}

#[test]
fn deny_private_destinations_refuses_loopback() {
    let origin = Origin::start().unwrap();
    let port = origin.addr().port();
    let proxy = Proxy::from_toml(
        r#"
deny_private_destinations = true
[[listener]]
listen = "127.0.0.1:0"
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
"#,
    );
    assert_denied(&get_via(&proxy, &origin.url("/")), "built-in");
    assert_denied(&get_via(&proxy, &format!("http://localhost:{port}/")), "built-in");
    let (_, r) = connect_with(proxy.addr(), &format!("localhost:{port}"), &[]);
    assert_denied(&r, "built-in");
    assert_eq!(socks5_reply(proxy.addr_of(1), &Dst::Addr(origin.addr())), 2);
    assert_eq!(socks5_reply(proxy.addr_of(1), &Dst::Name("localhost", port)), 2);
    assert_eq!(origin.connections(), 0);
    // Off (the default), the same request goes through.
    let open = Proxy::start();
    assert_ok(&get_via(&open, &origin.url("/bytes/1")));
}

/// Writes `text` as a configuration file in `dir`.
fn config_file(dir: &TempDir, text: &str) -> std::path::PathBuf {
    let path = dir.file("rustle.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn an_open_proxy_is_refused_with_advice() {
    let mut bin = RustleProcess::spawn(&["--http", "0.0.0.0:0", "--workers", "1"]);
    let status = bin.wait(Duration::from_secs(10)).expect("rustle --http 0.0.0.0:0 kept running");
    assert!(!status.success(), "exit status {status}");
    let err = bin.stderr();
    assert!(err.contains("open proxy"), "{err}");
    for advice in ["loopback", "auth = true", "clients", "allow_open_proxy = true"] {
        assert!(err.contains(advice), "the message does not mention `{advice}`:\n{err}");
    }
    assert!(!err.contains("listening on"), "{err}");

    // The same in a file: refused, and `rustle check` names the line.
    let dir = TempDir::new("open");
    let file = config_file(&dir, "workers = 1\n[[listener]]\nlisten = \"0.0.0.0:0\"\n");
    let out = std::process::Command::new(rustle_bin())
        .args(["check", "--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 3") && err.contains("open proxy"), "{err}");
    let mut bin = RustleProcess::spawn(&["--config", file.to_str().unwrap()]);
    let status = bin.wait(Duration::from_secs(10)).expect("rustle kept running");
    assert!(!status.success() && bin.stderr().contains("open proxy"), "{}", bin.stderr());
}

/// Starts the binary with `config`, then GETs through it from 127.0.0.1 with `headers`.
fn public_listener_starts(config: &str, headers: &[&str]) -> (RustleProcess, Resp) {
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("open-ok");
    let file = config_file(&dir, config);
    let (bin, addr) = RustleProcess::start(&["--config", file.to_str().unwrap()]);
    let r = get_from("127.0.0.1", addr, &origin.url("/bytes/2"), headers);
    (bin, r)
}

#[test]
fn a_public_listener_starts_when_explicitly_allowed() {
    let (_bin, r) = public_listener_starts(
        "allow_open_proxy = true\nworkers = 1\n[[listener]]\nlisten = \"0.0.0.0:0\"\n",
        &[],
    );
    assert_ok(&r);
}

#[test]
fn a_public_listener_starts_with_auth() {
    let config = "workers = 1\n[[listener]]\nlisten = \"0.0.0.0:0\"\nauth = true\n\
                  [auth]\n[[auth.user]]\nname = \"alice\"\npassword = \"plain:secret\"\n";
    let (_bin, r) = public_listener_starts(config, &[]);
    assert_eq!(r.status, 407, "{}", r.head_text());
    let (_bin, r) = public_listener_starts(config, &[&proxy_auth("alice", "secret")]);
    assert_ok(&r);

    // --users on the command line counts as auth too.
    let dir = TempDir::new("open-users");
    let users = users_file(&dir, &["alice:plain:secret"]);
    let args = ["--http", "0.0.0.0:0", "--workers", "1", "--users", users.to_str().unwrap()];
    let (bin, addr) = RustleProcess::start(&args);
    let origin = Origin::start().unwrap();
    let r = get_from("127.0.0.1", addr, &origin.url("/bytes/2"), &[]);
    assert_eq!(r.status, 407, "{}; stderr:\n{}", r.head_text(), bin.stderr());
}

#[test]
fn a_public_listener_starts_with_a_clients_rule() {
    let config = "workers = 1\ndefault_action = \"deny\"\n[[listener]]\nlisten = \"0.0.0.0:0\"\n\
                  [[rule]]\nname = \"lan\"\naction = \"allow\"\nclients = [\"127.0.0.1/32\"]\n";
    let (bin, r) = public_listener_starts(config, &[]);
    assert_ok(&r);
    drop(bin);
    // The rule restricts: another address is refused.
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("open-rule");
    let file = config_file(&dir, config);
    let (_bin, addr) = RustleProcess::start(&["--config", file.to_str().unwrap()]);
    assert_denied(&get_from("127.0.0.2", addr, &origin.url("/"), &[]), "the default action");
}

/// Connecting to 0.0.0.0 reaches the local host (the built-in loop check knows it), so a
/// rule denying the loopback block must not let `0.0.0.0:PORT` reach a loopback service.
#[test]
fn the_unspecified_address_cannot_smuggle_past_a_loopback_rule() {
    let origin = Origin::start().unwrap();
    let port = origin.addr().port();
    let proxy = Proxy::from_toml(
        "[[rule]]\nname = \"no-loopback\"\naction = \"deny\"\n\
         destinations = [\"127.0.0.0/8\", \"::1\"]\n",
    );
    let r = get_via(&proxy, &format!("http://0.0.0.0:{port}/bytes/1"));
    let (_, c) = connect_with(proxy.addr(), &format!("0.0.0.0:{port}"), &[]);
    assert_eq!(
        (r.status, c.status, origin.connections()),
        (403, 403, 0),
        "GET http://0.0.0.0:{port}/ got {} and CONNECT 0.0.0.0:{port} got {}: the loopback \
         origin was reached {} time(s) past a rule denying 127.0.0.0/8",
        r.status,
        c.status,
        origin.connections()
    );
}

/// `rules` (TOML: top-level keys, then tables) with a SOCKS listener on loopback.
fn socks_with_rules(rules: &str) -> Proxy {
    Proxy::from_toml(&format!("{rules}[[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:0\"\n"))
}

/// A SOCKS5 BIND for connections from 127.0.0.1 (`announced` the address and port the
/// request names): the first reply's code and the connection.
fn bind5(proxy: &Proxy, announced: &str) -> (std::net::TcpStream, u8, SocketAddr) {
    open5(proxy.addr(), BIND, &Dst::Addr(announced.parse().unwrap()))
}

/// A SOCKS4 BIND for `announced`: the first reply's code and the connection.
fn bind4(proxy: &Proxy, announced: &str) -> (std::net::TcpStream, u8, SocketAddr) {
    let mut s = connect(proxy.addr());
    s.write_all(&request4(BIND, announced.parse().unwrap(), "", None)).unwrap();
    let (rep, bound) = read_reply4(&mut s);
    (s, rep, SocketAddr::V4(bound))
}

/// A refused BIND: its first reply is the failure, then the connection closes.
#[track_caller]
fn assert_bind_refused((mut s, rep, _): (std::net::TcpStream, u8, SocketAddr)) {
    assert!(rep == 2 || rep == 0x5B, "BIND reply {rep:#04x}: the BIND was not refused");
    assert!(closed_within(&mut s, Duration::from_secs(3)), "a refused BIND left open");
}

/// A granted BIND: a peer connects to the port the first reply named and is relayed.
#[track_caller]
fn assert_bind_works((mut s, rep, bound): (std::net::TcpStream, u8, SocketAddr), socks4: bool) {
    assert!(rep == 0 || rep == 0x5A, "BIND reply {rep:#04x}: the BIND was refused");
    let mut peer = connect(bound);
    let rep = if socks4 { read_reply4(&mut s).0 } else { read_reply5(&mut s).0 };
    assert!(rep == 0 || rep == 0x5A, "second BIND reply {rep:#04x}");
    s.write_all(b"to the peer").unwrap();
    assert_eq!(read_exact_n(&mut peer, 11), b"to the peer");
}

#[test]
fn bind_is_checked_by_the_rules_and_the_default_action() {
    let echo = TcpEcho::start().unwrap();
    // CONNECT (HTTP) is denied and nothing else allowed: BIND falls to the default.
    let proxy = socks_with_rules(
        "default_action = \"deny\"\n[[rule]]\nname = \"no-connect\"\naction = \"deny\"\nprotocols = [\"connect\"]\n",
    );
    assert_bind_refused(bind5(&proxy, "127.0.0.1:0"));
    assert_bind_refused(bind4(&proxy, "127.0.0.1:0"));
    let line = proxy.log_line(|l| l.contains(" BIND ") && l.contains("socks5://"));
    assert_eq!(LogLine::parse(&line).status, 2, "{line}");
    assert!(line.contains("the default action"), "{line}");
    let line = proxy.log_line(|l| l.contains(" BIND ") && l.contains("socks4://"));
    assert!(line.contains("the default action"), "{line}");

    // A rule allowing `bind` lets it through.
    let proxy = socks_with_rules(
        "default_action = \"deny\"\n[[rule]]\nname = \"binds\"\naction = \"allow\"\nprotocols = [\"bind\"]\n",
    );
    assert_bind_works(bind5(&proxy, "127.0.0.1:0"), false);
    assert_bind_works(bind4(&proxy, "127.0.0.1:0"), true);
    assert_eq!(socks5_reply(proxy.addr(), &Dst::Addr(echo.addr())), 2, "CONNECT allowed");

    // A rule denying `bind` refuses it while CONNECT goes on.
    let proxy = socks_with_rules(
        "[[rule]]\nname = \"no-bind\"\naction = \"deny\"\nprotocols = [\"bind\"]\n",
    );
    assert_bind_refused(bind5(&proxy, "127.0.0.1:0"));
    assert_bind_refused(bind4(&proxy, "127.0.0.1:0"));
    proxy.log_line(|l| l.contains(" BIND ") && l.contains("no-bind"));
    let mut s = connect5(proxy.addr(), &Dst::Addr(echo.addr()));
    assert_echoes(&mut s, b"connect still allowed");
}

#[test]
fn bind_rules_on_destinations_see_the_peer_that_connects() {
    // The announced address is the unspecified one: the rules see who connects.
    let only = |dest: &str| {
        socks_with_rules(&format!(
            "default_action = \"deny\"\n[[rule]]\nname = \"peer\"\naction = \"allow\"\nprotocols = [\"bind\"]\ndestinations = [\"{dest}\"]\n"
        ))
    };
    let proxy = only("127.0.0.1");
    assert_bind_works(bind5(&proxy, "0.0.0.0:0"), false);

    let proxy = only("127.0.0.2");
    let (mut s, rep, bound) = bind5(&proxy, "0.0.0.0:0");
    assert_eq!(rep, 0, "first BIND reply: the peer is not known yet");
    let _peer = connect(bound);
    let (rep, from) = read_reply5(&mut s);
    assert_eq!(rep, 2, "a peer the rules do not allow: second reply");
    assert_eq!(from.ip().to_string(), "127.0.0.1");
    assert!(closed_within(&mut s, Duration::from_secs(3)));
    proxy.log_line(|l| l.contains(" BIND ") && l.contains("the default action"));
    // Announced, the address is checked before listening.
    assert_bind_refused(bind5(&proxy, "127.0.0.1:0"));
}

#[test]
fn the_admin_endpoint_is_refused_as_a_destination() {
    let proxy = Proxy::from_toml(
        r#"
[admin]
listen = "127.0.0.1:0"
[[listener]]
listen = "127.0.0.1:0"
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
"#,
    );
    let (http, socks, admin) = (proxy.addr(), proxy.addr_of(1), proxy.admin_addr());
    let metrics = format!("http://{admin}/metrics");
    let r = get_via(&proxy, &metrics);
    assert_denied(&r, "built-in");
    assert!(r.text().contains("own listening address"), "{}", r.text());
    assert!(!r.text().contains("# TYPE"), "metrics reached a proxy user: {}", r.text());
    let r = get_via(&proxy, &format!("http://localhost:{}/metrics", admin.port()));
    assert_denied(&r, "own listening address");
    let (_, r) = connect_with(http, &admin.to_string(), &[]);
    assert_denied(&r, "own listening address");
    assert_eq!(socks5_reply(socks, &Dst::Addr(admin)), 2);
    assert_eq!(socks5_reply(socks, &Dst::Name("localhost", admin.port())), 2);
    let mut s = connect(socks);
    s.write_all(&request4(CONNECT, v4(admin), "", None)).unwrap();
    assert_eq!(read_reply4(&mut s).0, 0x5B, "SOCKS4 CONNECT to the admin endpoint");
    proxy.log_line(|l| l.contains("socks5://") && l.contains("own listening address"));

    // Real clients: curl through the HTTP port and through SOCKS5 (the name resolved by
    // the proxy).
    let Some(out) = curl(&["-x", &format!("http://{http}"), "-w", "%{http_code}", &metrics]) else {
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.ends_with("403"), "curl -x: {text}");
    assert!(text.contains("own listening address") && !text.contains("# TYPE"), "{text}");
    let socks_url = format!("http://localhost:{}/metrics", admin.port());
    let out = curl(&["--socks5-hostname", &socks.to_string(), &socks_url]).unwrap();
    assert!(!out.status.success(), "curl --socks5-hostname reached the admin endpoint");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("# TYPE"));
}

/// An address of this host's interfaces that is neither loopback nor in a range
/// `deny_private_destinations` names (such as a public address); None, after saying so,
/// when the host has none.
fn public_local_address() -> Option<std::net::IpAddr> {
    let found = nix::ifaddrs::getifaddrs().expect("getifaddrs").find_map(|ifa| {
        let a = ifa.address?;
        let ip = match (a.as_sockaddr_in(), a.as_sockaddr_in6()) {
            (Some(v4), _) => std::net::IpAddr::V4(v4.ip()),
            (None, Some(v6)) => std::net::IpAddr::V6(v6.ip()),
            (None, None) => return None,
        };
        (!rustle::acl::is_private(ip)).then_some(ip)
    });
    if found.is_none() {
        rustle_bench::tools::skip_host("this host has no address outside the private ranges");
    }
    found
}

#[test]
fn a_wildcard_listener_is_refused_on_every_address_of_the_host() {
    let Some(ip) = public_local_address() else { return };
    // Listening on every address, closed to all but loopback clients.
    let any = if ip.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    let proxy = Proxy::from_toml(&format!(
        "default_action = \"deny\"\n[[rule]]\naction = \"allow\"\nclients = [\"127.0.0.1\"]\n\
         [[listener]]\nlisten = \"{any}\"\n"
    ));
    let own = SocketAddr::new(ip, proxy.addr().port());
    let local = SocketAddr::new("127.0.0.1".parse().unwrap(), proxy.addr().port());
    let (_, r) = connect_with(local, &own.to_string(), &[]);
    assert_denied(&r, "own listening address");
    let r = get_from("127.0.0.1", local, &format!("http://{own}/"), &[]);
    assert_denied(&r, "own listening address");
}

#[test]
fn deny_private_destinations_refuses_every_address_of_the_host() {
    let Some(ip) = public_local_address() else { return };
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(
        r#"
deny_private_destinations = true
[[listener]]
listen = "127.0.0.1:0"
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
"#,
    );
    let dest = SocketAddr::new(ip, origin.addr().port());
    let r = get_via(&proxy, &format!("http://{dest}/"));
    assert_denied(&r, "built-in");
    assert!(r.text().contains("own host"), "{}", r.text());
    let (_, r) = connect_with(proxy.addr(), &dest.to_string(), &[]);
    assert_denied(&r, "own host");
    assert_eq!(socks5_reply(proxy.addr_of(1), &Dst::Addr(dest)), 2);
    proxy.log_line(|l| l.contains("socks5://") && l.contains("own host"));
}
