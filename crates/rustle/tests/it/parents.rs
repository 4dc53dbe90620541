//! The parent proxies the tests start (squid and dante, `util::peers`), proven with real
//! clients (curl, hand-written SOCKS5 UDP) against the rustle-bench origins, with no rustle
//! in between: what the parent-proxy tests rely on them to do.

use std::net::{SocketAddr, TcpStream};
use std::process::Output;
use std::time::{Duration, Instant};

use rustle_bench::pattern::{pattern, pattern_sha256_hex};
use rustle_bench::{Origin, TcpEcho, TlsOrigin, UdpEcho};

use crate::util::peers::{leftovers, shm_segments, Dante, DanteOptions, Squid, SquidOptions};
use crate::util::socks::*;
use crate::util::*;

/// The dante user of these tests (created by the fixture) and its password.
const DANTE_USER: (&str, &str) = ("rustle-test", "rustle-pass");

fn squid_with_auth(user: &str, password: &str) -> Option<Squid> {
    Squid::start(SquidOptions { basic_auth: Some((user.to_string(), password.to_string())) })
}

fn dante_with_user() -> Option<Dante> {
    let (user, password) = DANTE_USER;
    Dante::start(DanteOptions { user: Some((user.to_string(), password.to_string())) })
}

/// curl with `args`, the body to a file: (curl's output, the HTTP status it printed, the
/// body). None when curl is missing.
fn curl_get(args: &[&str]) -> Option<(Output, String, Vec<u8>)> {
    let dir = TempDir::new("parents-curl");
    let body = dir.file("body");
    let body_arg = body.to_string_lossy().into_owned();
    let mut all = vec!["-o", &body_arg, "-w", "%{http_code}"];
    all.extend_from_slice(args);
    let out = curl(&all)?;
    let status = String::from_utf8_lossy(&out.stdout).into_owned();
    let body = std::fs::read(&body).unwrap_or_default();
    Some((out, status, body))
}

/// Asserts that curl got a 200 with `/bytes/n`'s body.
fn assert_bytes(what: &str, got: &(Output, String, Vec<u8>), n: u64) {
    let (out, status, body) = got;
    assert_success(what, out);
    assert_eq!(status, "200", "{what}");
    assert_eq!(body.len() as u64, n, "{what}: length");
    assert_eq!(sha256_hex(body), pattern_sha256_hex(n), "{what}: sha256");
}

#[test]
fn squid_fixture_forwards_http() {
    let origin = Origin::start().unwrap();
    let Some(squid) = Squid::start(SquidOptions::default()) else { return };
    let url = origin.url("/bytes/100000");
    let Some(got) = curl_get(&["-x", &squid.url(), &url]) else { return };
    assert_bytes("curl -x squid", &got, 100_000);
    assert_eq!(origin.requests(), 1);
    let line = squid.access_line(|l| l.contains(&url));
    assert!(line.contains(" TCP_MISS/200 ") && line.contains(" GET "), "{line}");
}

#[test]
fn squid_fixture_forwards_http_with_basic_auth() {
    let origin = Origin::start().unwrap();
    let Some(squid) = squid_with_auth("alice", "secret") else { return };
    let url = origin.url("/bytes/1000");
    let right = proxy_url_with(squid.addr(), "alice", "secret");
    let Some(got) = curl_get(&["-x", &right, &url]) else { return };
    assert_bytes("curl -x alice:secret@squid", &got, 1000);
    let wrong = proxy_url_with(squid.addr(), "alice", "wrong");
    for (what, proxy) in [("a wrong password", wrong.as_str()), ("no credentials", &squid.url())] {
        let (out, status, _) = curl_get(&["-x", proxy, &url]).unwrap();
        assert_success(what, &out);
        assert_eq!(status, "407", "{what}");
    }
    assert_eq!(origin.requests(), 1, "only the authenticated request reached the origin");
    let line = squid.access_line(|l| l.contains(" TCP_MISS/200 "));
    assert!(line.contains(" alice "), "the user is logged: {line}");
    assert_eq!(squid.access_log().matches("/407 ").count(), 2, "{}", squid.access_log());
}

#[test]
fn squid_fixture_tunnels_connect_to_any_port_with_basic_auth() {
    let echo = TcpEcho::start().unwrap();
    let Some(squid) = squid_with_auth("alice", "secret") else { return };
    let target = echo.addr().to_string();
    let (_, refused) = connect_with(squid.addr(), &target, &[]);
    assert_eq!(refused.status, 407, "{}", refused.head_text());
    let (_, refused) = connect_with(squid.addr(), &target, &[&proxy_auth("alice", "nope")]);
    assert_eq!(refused.status, 407, "{}", refused.head_text());
    let (mut tunnel, r) = connect_with(squid.addr(), &target, &[&proxy_auth("alice", "secret")]);
    assert_eq!(r.status, 200, "{}", r.head_text());
    assert!(tunnel.buf.is_empty(), "bytes after the CONNECT reply: {:?}", tunnel.buf);
    assert_echoes(&mut tunnel.s, &pattern(100_000));
    drop(tunnel);
    let connect = format!("CONNECT {target}");
    let line = squid.access_line(|l| l.contains(&connect) && l.contains("/200 "));
    assert!(line.contains(" alice "), "the user is logged: {line}");
    assert_eq!(squid.access_log().matches("/407 ").count(), 2, "{}", squid.access_log());
}

#[test]
fn squid_fixture_tunnels_https_for_curl_proxytunnel() {
    let tls = TlsOrigin::start().unwrap();
    let Some(squid) = Squid::start(SquidOptions::default()) else { return };
    let ca = tls.ca_file().to_string_lossy().into_owned();
    let url = tls.url("/bytes/50000");
    let Some(got) = curl_get(&["--proxytunnel", "-x", &squid.url(), "--cacert", &ca, &url]) else {
        return;
    };
    assert_bytes("curl --proxytunnel -x squid https://", &got, 50_000);
    let line = squid.access_line(|l| l.contains(&format!("CONNECT {}", tls.addr())));
    assert!(line.contains("/200 "), "{line}");
}

#[test]
fn dante_fixture_connects_curl_to_an_http_origin() {
    let origin = Origin::start().unwrap();
    let Some(dante) = Dante::start(DanteOptions::default()) else { return };
    let url = origin.url("/bytes/100000");
    let proxy = dante.addr().to_string();
    for flag in ["--socks5-hostname", "--socks5"] {
        let Some(got) = curl_get(&[flag, &proxy, &url]) else { return };
        assert_bytes(&format!("curl {flag} dante"), &got, 100_000);
    }
    assert_eq!(origin.requests(), 2);
    let line = dante.log_line(|l| l.contains("tcp/connect ]:"));
    assert!(line.contains(&origin.addr().port().to_string()), "{line}");
}

#[test]
fn dante_fixture_checks_username_and_password() {
    let origin = Origin::start().unwrap();
    let Some(dante) = dante_with_user() else { return };
    let (user, password) = DANTE_USER;
    let url = origin.url("/bytes/1000");
    let right = format!("{user}:{password}@{}", dante.addr());
    let Some(got) = curl_get(&["--socks5-hostname", &right, &url]) else { return };
    assert_bytes("curl --socks5-hostname with the user", &got, 1000);
    let wrong = format!("{user}:wrong@{}", dante.addr());
    let none = dante.addr().to_string();
    for (what, proxy) in [("a wrong password", wrong), ("no credentials", none)] {
        let (out, status, _) = curl_get(&["--socks5-hostname", &proxy, &url]).unwrap();
        // curl's exit status 97: the SOCKS proxy refused.
        assert_eq!(out.status.code(), Some(97), "{what}: {out:?}");
        assert_eq!(status, "000", "{what}");
    }
    assert_eq!(origin.requests(), 1, "only the authenticated client reached the origin");
    let line = dante.log_line(|l| l.contains("password authentication failed"));
    assert!(line.contains(user), "{line}");
    // The same with the hand-written client the rustle tests use.
    let mut s = connect(dante.addr());
    assert_ne!(login5(&mut s, user, "wrong"), 0, "a wrong password was accepted");
    let mut s = connect5_as(dante.addr(), user, password, &Dst::Addr(origin.addr()));
    let (n, _) = timed_download(&mut s, origin.addr(), 5000);
    assert_eq!(n, 5000);
}

/// Datagrams of each size go to `echo` through the association and come back whole.
fn udp_round_trips(relay: SocketAddr, sock: &std::net::UdpSocket, echo: &UdpEcho) {
    for n in [1, 100, 1400, 8000] {
        let payload = pattern(n);
        sock.send_to(&datagram(echo.addr(), &payload), relay).unwrap();
        let (from, got) = recv_via(sock, relay);
        assert_eq!(from, echo.addr(), "the header names the echo");
        assert!(got == payload, "a datagram of {n} bytes came back as {} bytes", got.len());
    }
}

#[test]
fn dante_fixture_relays_udp_associate() {
    let echo = UdpEcho::start().unwrap();
    let Some(dante) = Dante::start(DanteOptions::default()) else { return };
    let sock = udp_client();
    let (control, relay) = associate5(dante.addr(), None, sock.local_addr().unwrap());
    assert_eq!(relay.ip().to_string(), "127.0.0.1", "relay address {relay}");
    udp_round_trips(relay, &sock, &echo);
    assert_eq!(echo.datagrams(), 4);
    drop(control);
    let line = dante.log_line(|l| l.contains("udp/udpassociate ]:"));
    assert!(line.contains(&echo.addr().port().to_string()), "{line}");
}

#[test]
fn dante_fixture_relays_udp_associate_for_a_user() {
    let echo = UdpEcho::start().unwrap();
    let Some(dante) = dante_with_user() else { return };
    let sock = udp_client();
    let declared = sock.local_addr().unwrap();
    let (_control, relay) = associate5(dante.addr(), Some(DANTE_USER), declared);
    udp_round_trips(relay, &sock, &echo);
    assert_eq!(echo.datagrams(), 4);
}

/// Whether a connection to `addr` is refused (nothing listens there any more).
fn refused(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err()
}

/// Whether at least `n` processes of a fixture (group `pgid`, or naming `dir`) run within
/// a second.
fn processes_within(pgid: u32, dir: &std::path::Path, n: usize) -> bool {
    wait_until(Duration::from_secs(1), || leftovers(pgid, dir).len() >= n)
}

#[test]
fn parent_fixtures_stop_every_process_they_start() {
    let Some(squid) = squid_with_auth("alice", "secret") else { return };
    let Some(dante) = Dante::start(DanteOptions::default()) else { return };
    let (squid_pid, squid_dir, squid_addr) = (squid.pid(), squid.dir().to_owned(), squid.addr());
    let squid_shm = format!("{}-", squid.service_name());
    assert!(!shm_segments(&squid_shm).is_empty(), "squid's segments are named after it");
    let (dante_pid, dante_dir, dante_addr) = (dante.pid(), dante.dir().to_owned(), dante.addr());
    // squid's auth helper and dante's children (forked once it listens) run in their
    // groups.
    assert!(processes_within(squid_pid, &squid_dir, 2), "squid and its auth helper");
    assert!(processes_within(dante_pid, &dante_dir, 2), "dante and its children");
    let start = Instant::now();
    drop(squid);
    drop(dante);
    let took = start.elapsed();
    assert_eq!(leftovers(squid_pid, &squid_dir), Vec::<String>::new());
    assert_eq!(leftovers(dante_pid, &dante_dir), Vec::<String>::new());
    assert!(!squid_dir.exists() && !dante_dir.exists(), "temporary directories removed");
    assert_eq!(shm_segments(&squid_shm), Vec::<std::path::PathBuf>::new());
    assert!(refused(squid_addr) && refused(dante_addr), "a port still answers");
    assert!(took < Duration::from_secs(5), "stopping took {took:?}");

    // `kill` stops them at once, as parents that die; a new pair starts meanwhile.
    let mut squid = Squid::start(SquidOptions::default()).unwrap();
    let mut dante = Dante::start(DanteOptions::default()).unwrap();
    let (squid_pid, dante_pid) = (squid.pid(), dante.pid());
    squid.kill();
    dante.kill();
    assert!(refused(squid.addr()) && refused(dante.addr()), "a killed parent still answers");
    assert_eq!(leftovers(squid_pid, squid.dir()), Vec::<String>::new());
    assert_eq!(leftovers(dante_pid, dante.dir()), Vec::<String>::new());
    let squid_shm = format!("{}-", squid.service_name());
    assert_eq!(shm_segments(&squid_shm), Vec::<std::path::PathBuf>::new());
}

// rustle routing through parents: `[[parent]]`, `[[group]]` and `[[route]]` against squid,
// dante and rustle itself as parents, each parent's own log showing what it carried.

/// A `[[parent]]` table: `name`, `kind` at `addr`, then `extra` keys (TOML lines).
fn parent(name: &str, kind: &str, addr: SocketAddr, extra: &str) -> String {
    format!("[[parent]]\nname = \"{name}\"\nkind = \"{kind}\"\naddress = \"{addr}\"\n{extra}\n")
}

/// A `[[route]]` table: `name`, `conditions` (TOML lines), then `via` (a TOML value:
/// `"sq"` or `["a", "b"]`).
fn route(name: &str, conditions: &str, via: &str) -> String {
    format!("[[route]]\nname = \"{name}\"\n{conditions}\nvia = {via}\n")
}

/// Three listeners: HTTP (`addr_of(0)`), SOCKS (`addr_of(1)`) and a TCP relay to
/// `target` (`addr_of(2)`).
fn three_listeners(target: SocketAddr) -> String {
    format!(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n\
         [[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:0\"\n\
         [[listener]]\nkind = \"relay\"\nlisten = \"127.0.0.1:0\"\ntarget = \"{target}\"\n"
    )
}

/// rustle with `three_listeners` (the relay to `relay_to`), the `tables` given
/// (parents, groups) and one route `all` sending everything `via`.
fn rustle_via(relay_to: SocketAddr, tables: &str, via: &str) -> Proxy {
    Proxy::from_toml(&format!("{}{tables}{}", three_listeners(relay_to), route("all", "", via)))
}

/// Waits up to 3 s for `text()` to hold at least `n` lines satisfying `pred`; returns how
/// many it holds then.
fn count_lines(text: impl Fn() -> String, pred: impl Fn(&str) -> bool, n: usize) -> usize {
    let count = || text().lines().filter(|l| pred(l)).count();
    wait_until(Duration::from_secs(3), || count() >= n);
    count()
}

/// squid's access log as it is now (no waiting).
fn squid_log(squid: &Squid) -> String {
    std::fs::read_to_string(squid.dir().join("access.log")).unwrap_or_default()
}

/// dante's log as it is now (no waiting).
fn dante_log(dante: &Dante) -> String {
    std::fs::read_to_string(dante.dir().join("danted.log")).unwrap_or_default()
}

/// A squid access-log line for a tunnel to `target` (written when the tunnel closes).
fn squid_connect(line: &str, target: SocketAddr) -> bool {
    line.contains(&format!(" CONNECT {target} "))
}

/// A dante log line for a session to `target` opening (`tcp/connect [: ... -> ... ADDR`,
/// dante writing addresses as `127.0.0.1.PORT`).
fn dante_opened(line: &str, target: SocketAddr) -> bool {
    let addr = format!("{}.{}", target.ip(), target.port());
    line.contains("tcp/connect [") && line.split_whitespace().any(|w| w == addr)
}

/// A rustle access-log line for a tunnel to `target` (CONNECT, SOCKS or relay).
fn rustle_tunnel(line: &str, target: SocketAddr) -> bool {
    (line.contains(" CONNECT ") || line.contains(" RELAY ")) && line.contains(&target.to_string())
}

/// The value of the ` KEY=VALUE` field of a plain access-log line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// A raw CONNECT through `proxy` to the echo, asserting a 200 and an echo of `n` bytes.
fn tunnel_echo(proxy: SocketAddr, echo: SocketAddr, n: usize) {
    let (mut t, r) = connect_with(proxy, &echo.to_string(), &[]);
    assert_eq!(r.status, 200, "CONNECT {echo}: {}{}", r.head_text(), r.text());
    assert_echoes(&mut t.s, &pattern(n));
}

/// A GET of `url` through `proxy` on a new connection, with extra header lines.
fn get_through(proxy: SocketAddr, url: &str, headers: &[&str]) -> Resp {
    let mut c = Conn::open(proxy);
    c.send(&request("GET", url, headers, b""));
    c.read_response()
}

/// Asserts a 502 whose body names `what` (and each of `also`).
#[track_caller]
fn assert_502_naming(r: &Resp, what: &str, also: &[&str]) {
    assert_eq!(r.status, 502, "{}{}", r.head_text(), r.text());
    for text in std::iter::once(&what).chain(also) {
        assert!(r.text().contains(text), "the 502 does not say {text:?}: {}", r.text());
    }
}

/// The fixtures every kind of client reaches through a parent.
struct Targets {
    origin: Origin,
    tls: TlsOrigin,
    echo: TcpEcho,
}

impl Targets {
    fn start() -> Targets {
        Targets {
            origin: Origin::start().unwrap(),
            tls: TlsOrigin::start().unwrap(),
            echo: TcpEcho::start().unwrap(),
        }
    }
}

/// Through `proxy` (made by `rustle_via`, its relay to `t.echo`): a plain GET (curl -x),
/// an HTTP GET through a CONNECT tunnel (curl -p), HTTPS through CONNECT (curl), a raw
/// CONNECT to the echo, curl as a SOCKS5 client, a hand-written SOCKS5 client to the echo,
/// and the relay: 1 plain request, then tunnels: 2 to the origin, 1 to the TLS origin, 3
/// to the echo. Each must arrive whole. None when curl is missing.
fn exercise(proxy: &Proxy, t: &Targets) -> Option<()> {
    let http = proxy.url();
    let socks = proxy.addr_of(1).to_string();
    let got = curl_get(&["-x", &http, &t.origin.url("/bytes/100000")])?;
    assert_bytes("curl -x rustle http://", &got, 100_000);
    let got = curl_get(&["-p", "-x", &http, &t.origin.url("/bytes/20000")])?;
    assert_bytes("curl -p -x rustle http://", &got, 20_000);
    let ca = t.tls.ca_file().to_string_lossy().into_owned();
    let got = curl_get(&["-x", &http, "--cacert", &ca, &t.tls.url("/bytes/30000")])?;
    assert_bytes("curl -x rustle https://", &got, 30_000);
    tunnel_echo(proxy.addr(), t.echo.addr(), 100_000);
    let got = curl_get(&["--socks5-hostname", &socks, &t.origin.url("/bytes/40000")])?;
    assert_bytes("curl --socks5-hostname rustle", &got, 40_000);
    let mut s = connect5(proxy.addr_of(1), &Dst::Addr(t.echo.addr()));
    assert_echoes(&mut s, &pattern(50_000));
    drop(s);
    let mut s = connect(proxy.addr_of(2));
    assert_echoes(&mut s, &pattern(60_000));
    drop(s);
    assert_eq!(t.origin.requests(), 3);
    assert_eq!(t.tls.requests(), 1);
    assert_eq!(t.echo.connections(), 3);
    Some(())
}

/// Asserts that rustle logged the seven exchanges of `exercise`, each through `via` by
/// route `all`.
#[track_caller]
fn assert_logged_via(proxy: &Proxy, via: &str) {
    let n = count_lines(|| proxy.log_text(), |l| field(l, "via") == Some(via), 7);
    assert_eq!(n, 7, "lines through {via}:\n{}", proxy.log_text());
    let line = proxy.log_line(|l| l.contains(" GET http://"));
    assert!(line.contains(&format!(" route=all via={via}")), "{line}");
    assert_eq!(LogLine::parse(&line).status, 200, "{line}");
}

#[test]
fn every_client_goes_through_a_squid_parent() {
    let t = Targets::start();
    let Some(squid) = Squid::start(SquidOptions::default()) else { return };
    let proxy = rustle_via(t.echo.addr(), &parent("sq", "http", squid.addr(), ""), "\"sq\"");
    let Some(()) = exercise(&proxy, &t) else { return };
    assert_logged_via(&proxy, "sq");
    // Stopping rustle closes what it pooled: each parent has logged all it carried.
    drop(proxy);
    // Plain HTTP in absolute form, pooled like an origin; everything else tunnelled.
    let url = t.origin.url("/bytes/100000");
    let line = squid.access_line(|l| l.contains(&format!(" GET {url} ")));
    assert!(line.contains(" TCP_MISS/200 "), "{line}");
    let log = || squid_log(&squid);
    let origin = t.origin.addr();
    assert_eq!(count_lines(log, |l| squid_connect(l, origin), 2), 2, "{}", log());
    assert_eq!(count_lines(log, |l| squid_connect(l, t.tls.addr()), 1), 1, "{}", log());
    assert_eq!(count_lines(log, |l| squid_connect(l, t.echo.addr()), 3), 3, "{}", log());
    assert_eq!(log().lines().count(), 7, "nothing else reached squid:\n{}", log());
}

#[test]
fn every_client_is_tunnelled_through_a_dante_parent() {
    let t = Targets::start();
    let Some(dante) = Dante::start(DanteOptions::default()) else { return };
    let proxy = rustle_via(t.echo.addr(), &parent("dn", "socks5", dante.addr(), ""), "\"dn\"");
    let Some(()) = exercise(&proxy, &t) else { return };
    assert_logged_via(&proxy, "dn");
    // Plain HTTP too goes through a tunnel: one session per connection.
    let log = || dante_log(&dante);
    let origin = t.origin.addr();
    assert_eq!(count_lines(log, |l| dante_opened(l, origin), 3), 3, "{}", log());
    assert_eq!(count_lines(log, |l| dante_opened(l, t.tls.addr()), 1), 1, "{}", log());
    assert_eq!(count_lines(log, |l| dante_opened(l, t.echo.addr()), 3), 3, "{}", log());
}

#[test]
fn parents_without_a_route_are_not_used() {
    let t = Targets::start();
    let Some(squid) = Squid::start(SquidOptions::default()) else { return };
    let Some(dante) = Dante::start(DanteOptions::default()) else { return };
    let tables = format!(
        "{}{}{}[[group]]\nname = \"both\"\nparents = [\"sq\", \"dn\"]\n",
        three_listeners(t.echo.addr()),
        parent("sq", "http", squid.addr(), ""),
        parent("dn", "socks5", dante.addr(), "")
    );
    let proxy = Proxy::from_toml(&tables);
    let Some(()) = exercise(&proxy, &t) else { return };
    let n = count_lines(|| proxy.log_text(), |_| true, 7);
    assert_eq!(n, 7, "{}", proxy.log_text());
    let log = proxy.log_text();
    assert!(!log.contains("via=") && !log.contains("route="), "direct lines name no route:\n{log}");
    // Nothing to wait for: no use of squid or dante can be seen as an event. Their logs
    // are written as exchanges end, and every exchange has ended: a short real wait lets a
    // late line (which would fail the test) show.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(squid_log(&squid), "", "squid was used");
    assert!(!dante_log(&dante).contains("tcp/connect"), "dante was used:\n{}", dante_log(&dante));
}

#[test]
fn squid_parent_credentials_right_and_wrong() {
    let t = Targets::start();
    let Some(squid) = squid_with_auth("alice", "s3cr3t-pw") else { return };
    let with = |password: Option<&str>| {
        let creds = match password {
            Some(p) => format!("user = \"alice\"\npassword = \"{p}\""),
            None => String::new(),
        };
        rustle_via(t.echo.addr(), &parent("sq", "http", squid.addr(), &creds), "\"sq\"")
    };
    let right = with(Some("s3cr3t-pw"));
    let Some(()) = exercise(&right, &t) else { return };
    assert_logged_via(&right, "sq");
    let url = t.origin.url("/bytes/100000");
    let line = squid.access_line(|l| l.contains(&format!(" GET {url} ")));
    assert!(line.contains(" TCP_MISS/200 ") && line.contains(" alice "), "{line}");
    let echo = t.echo.addr();
    let line = squid.access_line(|l| squid_connect(l, echo));
    assert!(line.contains("/200 ") && line.contains(" alice "), "{line}");
    assert!(!right.log_text().contains("s3cr3t-pw"), "the password was logged");
    drop(right);

    for (what, password) in [("a wrong password", Some("b4d-pw")), ("no credentials", None)] {
        let wrong = with(password);
        let (_, r) = connect_with(wrong.addr(), &echo.to_string(), &[]);
        assert_502_naming(&r, "parent \"sq\"", &["407"]);
        let (_, rep, _) = open5(wrong.addr_of(1), CONNECT, &Dst::Addr(echo));
        assert_ne!(rep, 0, "{what}: the SOCKS5 client was told it succeeded");
        let mut s = connect(wrong.addr_of(2));
        let (got, closed) = read_until_close(&mut s);
        assert!(closed && got.is_empty(), "{what}: the relay client got {got:?}");
        // squid's 407 to a plain request is not for rustle's client, who could not answer
        // it: a 502 naming the parent instead.
        let r = get_through(wrong.addr(), &t.origin.url("/bytes/10"), &[]);
        assert_502_naming(&r, "parent \"sq\"", &["407"]);
        assert!(!r.has_header("proxy-authenticate"), "{}", r.head_text());
        let line = wrong.log_line(|l| l.contains(" GET http://"));
        assert!(line.contains("via=sq") && line.contains("407"), "{what}: {line}");
        assert!(!wrong.log_text().contains("b4d-pw"), "the password was logged");
    }
    assert_eq!(t.origin.requests(), 3, "only the right credentials reached the origin");
    assert_eq!(t.echo.connections(), 3, "only the right credentials reached the echo");
}

#[test]
fn dante_parent_credentials_right_and_wrong() {
    let t = Targets::start();
    let Some(dante) = dante_with_user() else { return };
    let (user, password) = DANTE_USER;
    let with = |password: &str| {
        let creds = format!("user = \"{user}\"\npassword = \"{password}\"");
        rustle_via(t.echo.addr(), &parent("dn", "socks5", dante.addr(), &creds), "\"dn\"")
    };
    let right = with(password);
    let Some(()) = exercise(&right, &t) else { return };
    assert_logged_via(&right, "dn");
    let log = || dante_log(&dante);
    assert_eq!(count_lines(log, |l| dante_opened(l, t.echo.addr()), 3), 3, "{}", log());

    let wrong = with("b4d-pw");
    let r = get_through(wrong.addr(), &t.origin.url("/bytes/10"), &[]);
    assert_502_naming(&r, "parent \"dn\"", &[]);
    let (_, r) = connect_with(wrong.addr(), &t.echo.addr().to_string(), &[]);
    assert_502_naming(&r, "parent \"dn\"", &[]);
    let (_, rep, _) = open5(wrong.addr_of(1), CONNECT, &Dst::Addr(t.echo.addr()));
    assert_ne!(rep, 0, "the SOCKS5 client was told it succeeded");
    assert!(!wrong.log_text().contains("b4d-pw"), "the password was logged");
    assert_eq!(t.origin.requests(), 3);
    assert_eq!(t.echo.connections(), 3);
}

/// A certificate set for `name` in `dir`.
fn certs(dir: &TempDir, name: &str) -> rustle::io::tls::SelfSignedFiles {
    rustle::io::tls::write_self_signed(name, &dir.path().join(name)).expect("self-signed set")
}

/// rustle with one HTTPS listener serving `files`.
fn https_rustle(files: &rustle::io::tls::SelfSignedFiles) -> Proxy {
    Proxy::from_toml(&format!(
        "[[listener]]\nkind = \"https\"\nlisten = \"127.0.0.1:0\"\n[listener.tls]\n\
         cert = \"{}\"\nkey = \"{}\"\n",
        files.chain.display(),
        files.key.display()
    ))
}

#[test]
fn every_client_goes_through_a_rustle_https_parent() {
    let t = Targets::start();
    let dir = TempDir::new("https-parent");
    let files = certs(&dir, "localhost");
    let up = https_rustle(&files);
    let tls_keys = format!("ca = \"{}\"\nserver_name = \"localhost\"", files.ca.display());
    let proxy = rustle_via(t.echo.addr(), &parent("tp", "https", up.addr(), &tls_keys), "\"tp\"");
    let Some(()) = exercise(&proxy, &t) else { return };
    assert_logged_via(&proxy, "tp");
    // Stopping rustle closes what it pooled: each parent has logged all it carried.
    drop(proxy);
    let url = t.origin.url("/bytes/100000");
    let line = up.log_line(|l| l.contains(&format!(" GET {url} ")));
    assert!(line.contains(" 200 ") && line.contains("sni=localhost"), "{line}");
    let log = || up.log_text();
    let tunnels = |target: SocketAddr, n: usize| count_lines(log, |l| rustle_tunnel(l, target), n);
    assert_eq!(tunnels(t.origin.addr(), 2), 2, "{}", log());
    assert_eq!(tunnels(t.tls.addr(), 1), 1, "{}", log());
    assert_eq!(tunnels(t.echo.addr(), 3), 3, "{}", log());

    // A parent whose certificate the configured CA does not verify is refused.
    let other = certs(&dir, "other.test");
    let bad_ca = format!("ca = \"{}\"\nserver_name = \"localhost\"", other.ca.display());
    let wrong = rustle_via(t.echo.addr(), &parent("tp", "https", up.addr(), &bad_ca), "\"tp\"");
    let r = get_through(wrong.addr(), &t.origin.url("/bytes/10"), &[]);
    assert_502_naming(&r, "parent \"tp\"", &[]);
    let (_, r) = connect_with(wrong.addr(), &t.echo.addr().to_string(), &[]);
    assert_502_naming(&r, "parent \"tp\"", &[]);
    // So is one whose certificate does not name the configured server name.
    let bad_name = format!("ca = \"{}\"\nserver_name = \"other.test\"", files.ca.display());
    let wrong = rustle_via(t.echo.addr(), &parent("tp", "https", up.addr(), &bad_name), "\"tp\"");
    let (_, r) = connect_with(wrong.addr(), &t.echo.addr().to_string(), &[]);
    assert_502_naming(&r, "parent \"tp\"", &[]);
    assert_eq!(t.echo.connections(), 3);
}

#[test]
fn a_chain_of_rustle_squid_and_dante() {
    let t = Targets::start();
    let first = Proxy::start();
    let Some(squid) = Squid::start(SquidOptions::default()) else { return };
    let Some(dante) = Dante::start(DanteOptions::default()) else { return };
    let tables = format!(
        "{}{}{}",
        parent("p1", "http", first.addr(), ""),
        parent("p2", "http", squid.addr(), ""),
        parent("p3", "socks5", dante.addr(), "")
    );
    let proxy = rustle_via(t.echo.addr(), &tables, "[\"p1\", \"p2\", \"p3\"]");
    let Some(()) = exercise(&proxy, &t) else { return };
    assert_logged_via(&proxy, "p1,p2,p3");
    // Stopping rustle closes what it pooled: each parent has logged all it carried.
    drop(proxy);
    // Each hop tunnels to the next, seven times: p1 to squid, squid to dante, dante to
    // the targets.
    let n = count_lines(|| first.log_text(), |l| rustle_tunnel(l, squid.addr()), 7);
    assert_eq!(n, 7, "p1 tunnels to p2:\n{}", first.log_text());
    let log = || squid_log(&squid);
    assert_eq!(count_lines(log, |l| squid_connect(l, dante.addr()), 7), 7, "{}", log());
    let log = || dante_log(&dante);
    assert_eq!(count_lines(log, |l| dante_opened(l, t.origin.addr()), 3), 3, "{}", log());
    assert_eq!(count_lines(log, |l| dante_opened(l, t.tls.addr()), 1), 1, "{}", log());
    assert_eq!(count_lines(log, |l| dante_opened(l, t.echo.addr()), 3), 3, "{}", log());
}

/// `n` CONNECT tunnels through `proxy` to `echo`, each echoing a few bytes, from four
/// threads at once.
fn many_tunnels(proxy: SocketAddr, echo: SocketAddr, n: usize) {
    let threads: Vec<_> = (0..4)
        .map(|k| {
            std::thread::spawn(move || {
                for _ in (k..n).step_by(4) {
                    tunnel_echo(proxy, echo, 16);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn a_weighted_group_splits_connections_by_weight() {
    let echo = TcpEcho::start().unwrap();
    let (a, b) = (Proxy::start(), Proxy::start());
    let tables = format!(
        "{}{}[[group]]\nname = \"pool\"\nparents = [\"a\", \"b\"]\n",
        parent("a", "http", a.addr(), "weight = 3"),
        parent("b", "http", b.addr(), "weight = 1")
    );
    let proxy = rustle_via(echo.addr(), &tables, "\"pool\"");
    let start = Instant::now();
    many_tunnels(proxy.addr(), echo.addr(), 1000);
    let took = start.elapsed();
    assert_eq!(echo.connections(), 1000);
    // The parents' own logs: waiting for both to reach 1000 together.
    let count = |p: &Proxy| p.log_text().lines().filter(|l| rustle_tunnel(l, echo.addr())).count();
    wait_until(Duration::from_secs(3), || count(&a) + count(&b) >= 1000);
    let (na, nb) = (count(&a), count(&b));
    assert_eq!(na + nb, 1000, "a {na}, b {nb}");
    assert!((720..=780).contains(&na), "weights 3:1 over 1000 connections gave a {na}, b {nb}");
    count_lines(|| proxy.log_text(), |l| field(l, "via").is_some(), 1000);
    let via_a = proxy.log_text().lines().filter(|l| field(l, "via") == Some("a")).count();
    let via_b = proxy.log_text().lines().filter(|l| field(l, "via") == Some("b")).count();
    assert_eq!((via_a, via_b), (na, nb), "rustle's log agrees with the parents'");
    eprintln!("1000 tunnels through the group in {took:?}: a {na}, b {nb}");
}

/// Configuration text: an HTTP listener requiring authentication, users u00..u15 with
/// password `pw`.
fn sixteen_users() -> String {
    let mut text = String::from(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n[auth]\nfailures_burst = 1000\n",
    );
    for i in 0..16 {
        text.push_str(&format!("[[auth.user]]\nname = \"u{i:02}\"\npassword = \"plain:pw\"\n"));
    }
    text
}

#[test]
fn sticky_users_keep_their_parent() {
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let (a, b) = (Proxy::start(), Proxy::start());
    let proxy = Proxy::from_toml(&format!(
        "{}{}{}[[group]]\nname = \"pool\"\nparents = [\"a\", \"b\"]\nsticky = \"user\"\n{}",
        sixteen_users(),
        parent("a", "http", a.addr(), ""),
        parent("b", "http", b.addr(), ""),
        route("all", "", "\"pool\"")
    ));
    let users: Vec<String> = (0..16).map(|i| format!("u{i:02}")).collect();
    // Round after round, every user in turn: a plain GET and a CONNECT each.
    for round in 0..5 {
        for user in &users {
            let auth = proxy_auth(user, "pw");
            let r = get_through(proxy.addr(), &origin.url(&format!("/bytes/{round}")), &[&auth]);
            assert_eq!(r.status, 200, "{user}: {}{}", r.head_text(), r.text());
            let (mut t, r) = connect_with(proxy.addr(), &echo.addr().to_string(), &[&auth]);
            assert_eq!(r.status, 200, "{user}: {}{}", r.head_text(), r.text());
            assert_echoes(&mut t.s, user.as_bytes());
        }
    }
    let n = count_lines(|| proxy.log_text(), |l| field(l, "via").is_some(), 160);
    assert_eq!(n, 160, "{}", proxy.log_text());
    let mut parent_of: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for line in proxy.log_text().lines() {
        let user = field(line, "user").unwrap_or_else(|| panic!("no user in {line}"));
        let via = field(line, "via").unwrap_or_else(|| panic!("no via in {line}"));
        parent_of.entry(user.to_string()).or_default().insert(via.to_string());
    }
    assert_eq!(parent_of.len(), 16, "{parent_of:?}");
    for (user, vias) in &parent_of {
        assert_eq!(vias.len(), 1, "{user} went through {vias:?}");
    }
    let used: std::collections::BTreeSet<&String> = parent_of.values().flatten().collect();
    assert_eq!(used.len(), 2, "16 users all hashed to {used:?}");
    // The parents carried what rustle says, each user's requests to one of them.
    let both = || a.log_text() + &b.log_text();
    assert_eq!(count_lines(both, |_| true, 160), 160, "lines at the parents");
}

#[test]
fn a_killed_parent_fails_over_to_the_survivor() {
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let Some(mut squid) = Squid::start(SquidOptions::default()) else { return };
    let Some(dante) = Dante::start(DanteOptions::default()) else { return };
    let dir = TempDir::new("failover");
    let access = dir.file("access.log");
    let health = "max_failures = 1\ndown_for = \"60s\"";
    let config = format!(
        "workers = 1\n[log]\naccess = \"{}\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\
         {}{}[[group]]\nname = \"pair\"\nparents = [\"sq\", \"dn\"]\n{}",
        access.display(),
        parent("sq", "http", squid.addr(), health),
        parent("dn", "socks5", dante.addr(), health),
        route("all", "", "\"pair\"")
    );
    let file = dir.file("rustle.toml");
    std::fs::write(&file, config).unwrap();
    let (bin, addr) = RustleProcess::start(&["--config", file.to_str().unwrap()]);
    let log = || std::fs::read_to_string(&access).unwrap_or_default();

    // Both parents take their share.
    for i in 0..10 {
        let r = get_through(addr, &origin.url(&format!("/bytes/{i}")), &[]);
        assert_eq!(r.status, 200, "{}{}\n{}", r.head_text(), r.text(), bin.stderr());
    }
    assert!(count_lines(log, |l| field(l, "via") == Some("sq"), 1) >= 1, "{}", log());
    assert!(count_lines(log, |l| field(l, "via") == Some("dn"), 1) >= 1, "{}", log());
    // Four tunnels open, dante's logged as they open.
    let mut tunnels: Vec<Conn> = (0..4)
        .map(|_| {
            let (mut t, r) = connect_with(addr, &echo.addr().to_string(), &[]);
            assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
            assert_echoes(&mut t.s, b"before");
            t
        })
        .collect();

    squid.kill();
    // The tunnels through squid end; those through dante go on.
    let mut alive = 0;
    for t in &mut tunnels {
        use std::io::{Read as _, Write as _};
        // A write to a tunnel already closed may fail: the read tells.
        let _ = t.s.write_all(b"after");
        t.s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut buf = [0u8; 5];
        match t.s.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Ok(n) => {
                assert_eq!(buf[..n], b"after"[..n], "a surviving tunnel echoes");
                alive += 1;
            }
            Err(e) => panic!("a tunnel neither echoed nor closed after the kill: {e}"),
        }
    }
    assert!((1..=3).contains(&alive), "{alive} of 4 tunnels through dante:\n{}", log());
    // Dante logged each of them as it opened (and no other tunnel to the echo server yet).
    let on_dante = || dante_log(&dante).lines().filter(|l| dante_opened(l, echo.addr())).count();
    wait_until(Duration::from_secs(3), || on_dante() >= alive);
    assert_eq!(alive, on_dante(), "the tunnels through dante survive, squid's end");
    // Every later connection succeeds, through dante.
    let before = log().lines().count();
    for i in 0..20 {
        let r = get_through(addr, &origin.url(&format!("/bytes/{}", 100 + i)), &[]);
        assert_eq!(r.status, 200, "request {i} after the kill: {}{}", r.head_text(), r.text());
        let (mut t, r) = connect_with(addr, &echo.addr().to_string(), &[]);
        assert_eq!(r.status, 200, "tunnel {i} after the kill: {}{}", r.head_text(), r.text());
        assert_echoes(&mut t.s, b"survivor");
    }
    assert!(
        bin.wait_for_stderr("parent \"sq\"", Duration::from_secs(3))
            && bin.stderr().lines().any(|l| l.contains("parent \"sq\"") && l.contains("down")),
        "rustle did not say squid was marked down:\n{}",
        bin.stderr()
    );
    let n = count_lines(log, |_| true, before + 40);
    assert!(n >= before + 40, "{}", log());
    let after: Vec<String> = log().lines().skip(before).map(str::to_string).collect();
    let through_squid: Vec<&String> =
        after.iter().filter(|l| field(l, "via") == Some("sq")).collect();
    // The tunnels that died with squid may be logged after the kill: only they name it.
    assert!(
        through_squid.len() <= 4 - alive
            && through_squid.iter().all(|l| LogLine::parse(l).method == "CONNECT"),
        "exchanges after the kill went to squid: {through_squid:#?}"
    );
    let via_dante = after.iter().filter(|l| field(l, "via") == Some("dn")).count();
    assert!(via_dante >= 40, "{via_dante} of the 40 later exchanges via dante:\n{}", log());
}

/// rustle with an HTTP listener (and, with `auth`, alice/secret and bob/hunter2), squid
/// as parent `sq`, and one route `to-squid` with `conditions`.
fn routed(squid: &Squid, auth: bool, listeners: &str, conditions: &str) -> Proxy {
    let head = if auth { auth_http_config("") } else { String::new() };
    Proxy::from_toml(&format!(
        "{head}{listeners}{}{}",
        parent("sq", "http", squid.addr(), ""),
        route("to-squid", conditions, "\"sq\"")
    ))
}

/// Asserts that the GET of `url` through `proxy` went through squid (`via`) or direct.
#[track_caller]
fn assert_routed(proxy: &Proxy, squid: &Squid, url: &str, via: bool) {
    let get = format!(" GET {url} ");
    let line = proxy.log_line(|l| l.contains(&get));
    if via {
        assert!(line.contains(" route=to-squid via=sq"), "{line}");
        squid.access_line(|l| l.contains(&get));
    } else {
        assert!(!line.contains("via="), "{line}");
        assert!(!squid_log(squid).contains(&get), "{url} went to squid:\n{}", squid_log(squid));
    }
}

#[test]
fn routes_on_hosts() {
    let origin = Origin::start().unwrap();
    let Some(squid) = Squid::start(SquidOptions::default()) else { return };
    let proxy = routed(&squid, false, "", "hosts = [\"localhost\"]");
    let by_name = format!("http://localhost:{}/bytes/11", origin.addr().port());
    let by_ip = origin.url("/bytes/12");
    for url in [&by_ip, &by_name] {
        let r = get_through(proxy.addr(), url, &[]);
        assert_eq!(r.status, 200, "{url}: {}{}", r.head_text(), r.text());
    }
    assert_routed(&proxy, &squid, &by_name, true);
    assert_routed(&proxy, &squid, &by_ip, false);
    assert_eq!(origin.requests(), 2);
}

#[test]
fn routes_on_ports() {
    let (near, far) = (TcpEcho::start().unwrap(), TcpEcho::start().unwrap());
    let Some(squid) = Squid::start(SquidOptions::default()) else { return };
    let proxy = routed(&squid, false, "", &format!("ports = [\"{}\"]", far.addr().port()));
    // The direct one first: squid logs a tunnel when it closes, in order.
    tunnel_echo(proxy.addr(), near.addr(), 100);
    tunnel_echo(proxy.addr(), far.addr(), 100);
    squid.access_line(|l| squid_connect(l, far.addr()));
    assert!(!squid_log(&squid).contains(&near.addr().to_string()), "{}", squid_log(&squid));
    let line = proxy.log_line(|l| rustle_tunnel(l, far.addr()));
    assert!(line.contains(" route=to-squid via=sq"), "{line}");
    let line = proxy.log_line(|l| rustle_tunnel(l, near.addr()));
    assert!(!line.contains("via="), "{line}");
}

#[test]
fn routes_on_users() {
    let origin = Origin::start().unwrap();
    let Some(squid) = Squid::start(SquidOptions::default()) else { return };
    let proxy = routed(&squid, true, "", "users = [\"alice\"]");
    let (for_bob, for_alice) = (origin.url("/bytes/22"), origin.url("/bytes/21"));
    let r = get_through(proxy.addr(), &for_bob, &[&proxy_auth("bob", "hunter2")]);
    assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
    let r = get_through(proxy.addr(), &for_alice, &[&proxy_auth("alice", "secret")]);
    assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
    assert_routed(&proxy, &squid, &for_alice, true);
    assert_routed(&proxy, &squid, &for_bob, false);
    // rustle's own credentials stay with rustle.
    let line = squid.access_line(|l| l.contains(&for_alice));
    assert!(!line.contains("alice"), "{line}");
}

#[test]
fn routes_on_clients() {
    let origin = Origin::start().unwrap();
    let Some(squid) = Squid::start(SquidOptions::default()) else { return };
    let proxy = routed(&squid, false, "", "clients = [\"127.0.0.2\"]");
    let (from_one, from_two) = (origin.url("/bytes/32"), origin.url("/bytes/31"));
    for (from, url) in [("127.0.0.1", &from_one), ("127.0.0.2", &from_two)] {
        let mut c = Conn::open_from(from, proxy.addr());
        c.send(&get(url));
        let r = c.read_response();
        assert_eq!(r.status, 200, "{from}: {}{}", r.head_text(), r.text());
    }
    assert_routed(&proxy, &squid, &from_two, true);
    assert_routed(&proxy, &squid, &from_one, false);
}

#[test]
fn routes_on_protocols() {
    let origin = Origin::start().unwrap();
    let (near, far) = (TcpEcho::start().unwrap(), TcpEcho::start().unwrap());
    let Some(squid) = Squid::start(SquidOptions::default()) else { return };
    let listeners = three_listeners(near.addr());
    let proxy = routed(&squid, false, &listeners, "protocols = [\"http\", \"socks5\"]");
    // Direct first (squid logs tunnels as they close, in order): CONNECT and the relay.
    tunnel_echo(proxy.addr(), near.addr(), 100);
    let mut s = connect(proxy.addr_of(2));
    assert_echoes(&mut s, b"relay");
    drop(s);
    let url = origin.url("/bytes/41");
    let r = get_through(proxy.addr(), &url, &[]);
    assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
    let mut s = connect5(proxy.addr_of(1), &Dst::Addr(far.addr()));
    assert_echoes(&mut s, b"socks5");
    drop(s);
    assert_routed(&proxy, &squid, &url, true);
    squid.access_line(|l| squid_connect(l, far.addr()));
    assert!(!squid_log(&squid).contains(&near.addr().to_string()), "{}", squid_log(&squid));
    let n = count_lines(|| proxy.log_text(), |l| rustle_tunnel(l, near.addr()), 2);
    assert_eq!(n, 2, "{}", proxy.log_text());
    for line in proxy.log_text().lines().filter(|l| rustle_tunnel(l, near.addr())) {
        assert!(!line.contains("via="), "{line}");
    }
    let line = proxy.log_line(|l| rustle_tunnel(l, far.addr()));
    assert!(line.contains(" route=to-squid via=sq"), "{line}");
}

#[test]
fn the_first_matching_route_wins_and_routes_can_deny() {
    let origin = Origin::start().unwrap();
    let Some(squid) = Squid::start(SquidOptions::default()) else { return };
    let proxy = Proxy::from_toml(&format!(
        "{}{}{}{}",
        parent("sq", "http", squid.addr(), ""),
        route("stay-home", "hosts = [\"localhost\"]\nports = [\"1\"]", "\"deny\""),
        route("local-direct", "hosts = [\"localhost\"]", "\"direct\""),
        route("rest", "", "\"sq\"")
    ));
    let by_name = format!("http://localhost:{}/bytes/51", origin.addr().port());
    let r = get_through(proxy.addr(), &by_name, &[]);
    assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
    let by_ip = origin.url("/bytes/52");
    let r = get_through(proxy.addr(), &by_ip, &[]);
    assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
    let r = get_through(proxy.addr(), "http://localhost:1/", &[]);
    assert_eq!(r.status, 403, "{}{}", r.head_text(), r.text());
    assert!(r.text().contains("stay-home"), "{}", r.text());
    let line = proxy.log_line(|l| l.contains(&format!(" GET {by_ip} ")));
    assert!(line.contains(" route=rest via=sq"), "{line}");
    squid.access_line(|l| l.contains(&by_ip));
    let line = proxy.log_line(|l| l.contains(&format!(" GET {by_name} ")));
    assert!(!line.contains("via=sq"), "{line}");
    assert!(!squid_log(&squid).contains(&by_name), "{}", squid_log(&squid));
}

#[test]
fn the_json_access_log_names_the_route_and_parent() {
    let origin = Origin::start().unwrap();
    let (a, b) = (Proxy::start(), Proxy::start());
    let proxy = Proxy::from_toml(&format!(
        "[log]\nformat = \"json\"\n{}{}{}",
        parent("a", "http", a.addr(), ""),
        parent("b", "http", b.addr(), ""),
        route("two-hops", "", "[\"a\", \"b\"]")
    ));
    let r = get_through(proxy.addr(), &origin.url("/bytes/7"), &[]);
    assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
    let line = proxy.log_line(|l| l.contains("/bytes/7"));
    assert!(line.contains("\"route\":\"two-hops\",\"via\":\"a,b\""), "{line}");
    // Stopping rustle closes what it pooled: each parent has logged all it carried.
    drop(proxy);
    a.log_line(|l| rustle_tunnel(l, b.addr()));
    b.log_line(|l| l.contains(&format!(" GET {} ", origin.url("/bytes/7"))));
}

#[test]
fn a_parent_that_refuses_connections_is_named_then_marked_down() {
    let echo = TcpEcho::start().unwrap();
    let origin = Origin::start().unwrap();
    let gone = closed_port();
    let proxy = rustle_via(
        echo.addr(),
        &parent("gone", "http", gone, "max_failures = 1\ndown_for = \"60s\""),
        "\"gone\"",
    );
    let r = get_through(proxy.addr(), &origin.url("/bytes/1"), &[]);
    assert_502_naming(&r, "parent \"gone\"", &[&gone.to_string()]);
    // Marked down: refused at once, naming it, without trying it again.
    let refused_down = |r: &Resp| {
        assert!(matches!(r.status, 502 | 503), "{}{}", r.head_text(), r.text());
        let body = r.text();
        assert!(body.contains("parent \"gone\"") && body.contains("down"), "{body}");
    };
    for _ in 0..3 {
        let start = Instant::now();
        refused_down(&get_through(proxy.addr(), &origin.url("/bytes/2"), &[]));
        assert!(start.elapsed() < Duration::from_millis(500), "took {:?}", start.elapsed());
        refused_down(&connect_with(proxy.addr(), &echo.addr().to_string(), &[]).1);
    }
    let (_, rep, _) = open5(proxy.addr_of(1), CONNECT, &Dst::Addr(echo.addr()));
    assert_ne!(rep, 0, "the SOCKS5 client was told it succeeded");
    let mut s = connect(proxy.addr_of(2));
    let (got, closed) = read_until_close(&mut s);
    assert!(closed && got.is_empty(), "the relay client got {got:?}");
    assert_eq!((origin.requests(), echo.connections()), (0, 0));
    let line = proxy.log_line(|l| l.contains(" GET ") && l.contains("/bytes/1"));
    assert!(line.contains(" 502 ") && line.contains("via=gone"), "{line}");
}

#[test]
fn a_parent_that_does_not_answer_times_out_with_504() {
    let origin = Origin::start().unwrap();
    let hole = black_hole();
    let proxy = Proxy::from_toml(&format!(
        "[timeouts]\nconnect = \"1s\"\n{}{}",
        parent("slow", "http", hole.addr, ""),
        route("all", "", "\"slow\"")
    ));
    let start = Instant::now();
    let r = get_through(proxy.addr(), &origin.url("/bytes/1"), &[]);
    let took = start.elapsed();
    assert_eq!(r.status, 504, "{}{}", r.head_text(), r.text());
    assert!(r.text().contains("parent \"slow\""), "{}", r.text());
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(origin.requests(), 0);
}

/// A plain GET of `/bytes/N` through `proxy` on a new connection (`Connection: close`),
/// read to its end: an error describing what went wrong instead of a panic.
fn try_get(proxy: SocketAddr, origin: SocketAddr, n: usize) -> Result<(), String> {
    use std::io::{Read as _, Write as _};
    let mut s = TcpStream::connect(proxy).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!(
        "GET http://{origin}/bytes/{n} HTTP/1.1\r\nHost: {origin}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).map_err(|e| format!("write: {e}"))?;
    let mut got = Vec::new();
    s.read_to_end(&mut got).map_err(|e| format!("read after {} bytes: {e}", got.len()))?;
    let text = String::from_utf8_lossy(&got[..got.len().min(300)]).into_owned();
    match got.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(i) if got.starts_with(b"HTTP/1.1 200 ") && got[i + 4..] == pattern(n)[..] => Ok(()),
        _ => Err(format!("GET: {text:?}")),
    }
}

/// A CONNECT through `proxy` to the echo and 16 bytes echoed: an error describing what
/// went wrong instead of a panic.
fn try_tunnel(proxy: SocketAddr, echo: SocketAddr) -> Result<(), String> {
    use std::io::{Read as _, Write as _};
    let mut s = TcpStream::connect(proxy).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!("CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\n\r\n");
    s.write_all(req.as_bytes()).map_err(|e| format!("write: {e}"))?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            Ok(_) => return Err(format!("EOF in the reply: {:?}", String::from_utf8_lossy(&head))),
            Err(e) => return Err(format!("reading the reply: {e}")),
        }
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        return Err(format!("CONNECT: {:?}", String::from_utf8_lossy(&head)));
    }
    let msg = pattern(16);
    s.write_all(&msg).map_err(|e| format!("write in the tunnel: {e}"))?;
    let mut back = vec![0u8; 16];
    s.read_exact(&mut back).map_err(|e| format!("read in the tunnel: {e}"))?;
    if back == msg {
        Ok(())
    } else {
        Err("the tunnel echoed other bytes".into())
    }
}

#[test]
fn only_exchanges_in_flight_on_a_killed_parent_fail() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let Some(mut doomed) = Squid::start(SquidOptions::default()) else { return };
    let Some(survivor) = Squid::start(SquidOptions::default()) else { return };
    let health = "max_failures = 1\ndown_for = \"60s\"";
    let proxy = Proxy::from_toml(&format!(
        "{}{}[[group]]\nname = \"pair\"\nparents = [\"doomed\", \"survivor\"]\n{}",
        parent("doomed", "http", doomed.addr(), health),
        parent("survivor", "http", survivor.addr(), health),
        route("all", "", "\"pair\"")
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicUsize::new(0));
    // Three clients, each one exchange at a time, plain GETs and tunnels in turn: when
    // the parent dies each has at most one exchange on it, so at most one failure.
    let clients: Vec<_> = (0..3)
        .map(|k| {
            let (addr, origin, echo, stop, finished) =
                (proxy.addr(), origin.addr(), echo.addr(), stop.clone(), finished.clone());
            std::thread::spawn(move || {
                let mut done = Vec::new();
                let mut i = k;
                while !stop.load(Ordering::Relaxed) {
                    let start = Instant::now();
                    let result = match i % 2 {
                        0 => try_get(addr, origin, 1000 + i),
                        _ => try_tunnel(addr, echo),
                    };
                    done.push((start, result));
                    finished.fetch_add(1, Ordering::SeqCst);
                    i += 1;
                }
                done
            })
        })
        .collect();
    // At least ten exchanges before the kill and ten begun after it (three may be in
    // flight when it comes), counted as they finish.
    let done = || finished.load(Ordering::SeqCst);
    assert!(wait_until(Duration::from_secs(20), || done() >= 10), "{} exchanges", done());
    let killing = Instant::now();
    doomed.kill();
    let killed = Instant::now();
    let at_kill = done();
    let enough = wait_until(Duration::from_secs(20), || done() >= at_kill + 13);
    stop.store(true, Ordering::Relaxed);
    assert!(enough, "{} exchanges after the kill", done() - at_kill);
    let per_client: Vec<Vec<(Instant, Result<(), String>)>> =
        clients.into_iter().map(|c| c.join().unwrap()).collect();
    let at = |t: Instant| match t.checked_duration_since(killing) {
        Some(d) => format!("+{}ms", d.as_millis()),
        None => format!("-{}ms", (killing - t).as_millis()),
    };
    let n =
        |f: &dyn Fn(&Instant) -> bool| per_client.iter().flatten().filter(|(s, _)| f(s)).count();
    let (before, after) = (n(&|s| *s < killing), n(&|s| *s >= killed));
    assert!(before >= 10 && after >= 10, "{before} exchanges before the kill, {after} after");
    // The exchanges begun before squid was gone (it takes a moment to die and be reaped)
    // may have been on it; none begun after may fail.
    let failed = |f: &dyn Fn(&Instant) -> bool| -> Vec<String> {
        let (f, at) = (&f, &at);
        per_client
            .iter()
            .enumerate()
            .flat_map(|(k, done)| done.iter().map(move |d| (k, d)))
            .filter(|(_, (s, _))| f(s))
            .filter_map(|(k, (s, r))| Some(format!("client {k} {} {}", at(*s), r.as_ref().err()?)))
            .collect()
    };
    let failed_after = failed(&|s| *s >= killed);
    assert!(
        failed_after.is_empty(),
        "exchanges begun after the kill (which took {:?}) failed: {failed_after:#?}\n\
         and before it: {:#?}",
        killed - killing,
        failed(&|s| *s < killed)
    );
    eprintln!(
        "{before} exchanges before the kill, {after} after; failed while squid died (in \
         {:?}): {:#?}",
        killed - killing,
        failed(&|s| *s < killed)
    );
    // Everything after the kill went through the survivor.
    let line = proxy.log_line(|l| field(l, "via") == Some("survivor"));
    assert!(line.contains(" route=all via=survivor"), "{line}");
}

#[test]
fn every_client_goes_through_rustle_socks5_and_socks4a_parents() {
    let dir = TempDir::new("socks-parents");
    let users = users_file(&dir, &["alice:plain:secret"]);
    let socks5 = Proxy::from_toml(&format!(
        "[[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:0\"\nauth = true\n\
         [auth]\nfailures_burst = 1000\nusers_file = \"{}\"\n",
        users.display()
    ));
    let socks4a = Proxy::socks();
    for (kind, up, creds) in [
        ("socks5", &socks5, "user = \"alice\"\npassword = \"secret\""),
        ("socks4a", &socks4a, "user = \"carol\""),
    ] {
        let t = Targets::start();
        let proxy = rustle_via(t.echo.addr(), &parent("up", kind, up.addr(), creds), "\"up\"");
        let Some(()) = exercise(&proxy, &t) else { return };
        assert_logged_via(&proxy, "up");
        drop(proxy);
        let log = || up.log_text();
        let tunnels =
            |target: SocketAddr, n: usize| count_lines(log, |l| rustle_tunnel(l, target), n);
        assert_eq!(tunnels(t.origin.addr(), 3), 3, "{kind}: {}", log());
        assert_eq!(tunnels(t.tls.addr(), 1), 1, "{kind}: {}", log());
        assert_eq!(tunnels(t.echo.addr(), 3), 3, "{kind}: {}", log());
    }
    let line = socks5.log_line(|l| l.contains(" CONNECT socks5://"));
    assert_eq!(LogLine::parse(&line).user, "alice", "{line}");
}

#[test]
fn a_parent_dying_in_the_middle_of_a_request_is_named() {
    let origin = Origin::start().unwrap();
    let Some(mut squid) = Squid::start(SquidOptions::default()) else { return };
    let proxy = Proxy::from_toml(&format!(
        "{}{}",
        parent("sq", "http", squid.addr(), ""),
        route("all", "", "\"sq\"")
    ));
    let url = origin.url("/delay/2000");
    let mut c = Conn::to_proxy(&proxy);
    c.send(&get(&url));
    // The request is at the origin, squid waiting for its answer, when squid dies.
    wait_until(Duration::from_secs(3), || origin.requests() > 0);
    assert_eq!(origin.requests(), 1, "the request did not reach the origin");
    squid.kill();
    let r = c.read_response();
    assert_502_naming(&r, "parent \"sq\"", &[]);
    let line = proxy.log_line(|l| l.contains(&format!(" GET {url} ")));
    assert!(line.contains(" 502 ") && line.contains("sq"), "{line}");
}

#[test]
fn udp_associate_is_chained_through_a_dante_parent() {
    let echo = UdpEcho::start().unwrap();
    let Some(dante) = Dante::start(DanteOptions::default()) else { return };
    let proxy = Proxy::from_toml(&format!(
        "[[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:0\"\n{}{}",
        parent("dn", "socks5", dante.addr(), ""),
        route("all", "", "\"dn\"")
    ));
    let sock = udp_client();
    let (control, relay) = associate5(proxy.addr(), None, sock.local_addr().unwrap());
    udp_round_trips(relay, &sock, &echo);
    assert_eq!(echo.datagrams(), 4);
    drop(control);
    // dante carried the datagrams: its own association ends with the client's.
    let line = dante.log_line(|l| l.contains("udp/udpassociate ]:"));
    assert!(line.contains(&echo.addr().port().to_string()), "{line}");
    let line = proxy.log_line(|l| l.contains("UDP") || l.contains("udp"));
    assert!(line.contains(" route=all via=dn"), "{line}");
}

#[test]
fn a_pooled_connection_to_a_killed_parent_is_not_reused() {
    let origin = Origin::start().unwrap();
    let Some(mut doomed) = Squid::start(SquidOptions::default()) else { return };
    let Some(survivor) = Squid::start(SquidOptions::default()) else { return };
    let health = "max_failures = 1\ndown_for = \"60s\"";
    let proxy = Proxy::from_toml(&format!(
        "{}{}[[group]]\nname = \"pair\"\nparents = [\"doomed\", \"survivor\"]\n{}",
        parent("doomed", "http", doomed.addr(), health),
        parent("survivor", "http", survivor.addr(), health),
        route("all", "", "\"pair\"")
    ));
    // Kept-alive connections to both parents in rustle's pool.
    for i in 0..4 {
        try_get(proxy.addr(), origin.addr(), i).unwrap();
    }
    proxy.log_line(|l| field(l, "via") == Some("doomed"));
    doomed.kill();
    for i in 0..6 {
        if let Err(e) = try_get(proxy.addr(), origin.addr(), 10 + i) {
            panic!("GET {i} after the kill: {e}\n{}", proxy.log_text());
        }
    }
}

/// SIGHUP's reload puts new parents and routes in force for new connections; a tunnel
/// already open keeps the path it was opened on.
#[test]
fn a_reload_changes_routes_for_new_connections_and_open_tunnels_keep_their_path() {
    let echo = TcpEcho::start().unwrap();
    let origin = Origin::start().unwrap();
    let a = Proxy::from_toml("");
    let b = Proxy::from_toml("");
    let tables = |via: &str| {
        format!(
            "{}{}{}{}",
            three_listeners(echo.addr()),
            parent("a", "http", a.addr(), ""),
            parent("b", "http", b.addr(), ""),
            route("all", "", via)
        )
    };
    let proxy = Proxy::from_toml(&tables("\"a\""));
    let (mut open, r) = connect_with(proxy.addr(), &echo.addr().to_string(), &[]);
    assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
    assert_echoes(&mut open.s, &pattern(10_000));
    assert_eq!(get_through(proxy.addr(), &origin.url("/bytes/5"), &[]).status, 200);
    proxy.reload_toml(&tables("\"b\""));
    assert_eq!(get_through(proxy.addr(), &origin.url("/bytes/6"), &[]).status, 200);
    tunnel_echo(proxy.addr(), echo.addr(), 1_000);
    // The tunnel opened before the reload still goes through `a`.
    assert_echoes(&mut open.s, &pattern(20_000));
    drop(open);
    let through = |p: &Proxy, what: &str| count_lines(|| p.log_text(), |l| l.contains(what), 1);
    assert_eq!(through(&a, "/bytes/5 "), 1, "before the reload, via a:\n{}", a.log_text());
    assert_eq!(through(&b, "/bytes/6 "), 1, "after the reload, via b:\n{}", b.log_text());
    assert_eq!(through(&a, "/bytes/6 "), 0, "after the reload, not via a:\n{}", a.log_text());
    let tunnels = |p: &Proxy| count_lines(|| p.log_text(), |l| rustle_tunnel(l, echo.addr()), 1);
    assert_eq!((tunnels(&a), tunnels(&b)), (1, 1), "a:\n{}\nb:\n{}", a.log_text(), b.log_text());
    let line = proxy.log_line(|l| l.contains("/bytes/6 "));
    assert!(line.contains(" route=all via=b"), "{line}");
}

/// A parent marked down comes back as soon as its health probe succeeds, long before its
/// `down_for` has passed; until then it is refused at once.
#[test]
fn a_health_probe_brings_a_parent_back_before_its_down_time_ends() {
    let origin = Origin::start().unwrap();
    // A free port where the parent will be (nothing listens there yet).
    let spot = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let extra = "max_failures = 1\ndown_for = \"60s\"\nprobe = \"tcp\"\nprobe_every = \"1s\"";
    let proxy = Proxy::from_toml(&format!(
        "{}{}",
        parent("p", "http", spot, extra),
        route("all", "", "\"p\"")
    ));
    let url = origin.url("/bytes/3");
    // Refused at the parent, or already marked down by a probe that ran first (the first
    // probe may beat the first request on a loaded machine).
    let r = get_through(proxy.addr(), &url, &[]);
    assert_eq!(r.status, 502, "{}{}", r.head_text(), r.text());
    let named = r.text().contains("parent \"p\"");
    assert!(named && (r.text().contains("reached") || r.text().contains("down")), "{}", r.text());
    let r = get_through(proxy.addr(), &url, &[]);
    assert!(r.status == 502 && r.text().contains("down"), "{}{}", r.head_text(), r.text());
    // The parent starts; the probe finds it within a second or two.
    let _parent = Proxy::from_toml(&format!("[[listener]]\nlisten = \"{spot}\"\n"));
    let mut last = None;
    let served = wait_until(Duration::from_secs(10), || {
        let r = get_through(proxy.addr(), &url, &[]);
        let ok = r.status == 200;
        last = Some(r);
        ok
    });
    let r = last.expect("one try at least");
    assert!(served, "still refused: {}{}", r.head_text(), r.text());
    assert_eq!(origin.requests(), 1);
}

/// Plain HTTP through a parent reuses pooled connections to it, as to an origin: an
/// HTTP parent takes requests for any origin on one connection, and a SOCKS5 parent's
/// tunnel to an origin is pooled under the parent and the origin.
#[test]
fn plain_http_through_parents_is_pooled() {
    for kind in ["http", "socks5"] {
        let origin = Origin::start().unwrap();
        let other = Origin::start().unwrap();
        let p = match kind {
            "http" => Proxy::from_toml(""),
            _ => Proxy::from_toml("[[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:0\"\n"),
        };
        let proxy = Proxy::from_toml(&format!(
            "{}{}",
            parent("p", kind, p.addr(), ""),
            route("all", "", "\"p\"")
        ));
        for client in 0..3 {
            let mut c = Conn::open(proxy.addr());
            for i in 0..4 {
                let o = if i % 2 == 0 { &origin } else { &other };
                c.send(&request("GET", &o.url(&format!("/bytes/{}", 10 + client)), &[], b""));
                let r = c.read_response();
                assert_eq!(r.status, 200, "{kind}: {}{}", r.head_text(), r.text());
            }
        }
        assert_eq!((origin.requests(), other.requests()), (6, 6), "{kind}");
        // One tunnel to each origin through a SOCKS5 parent, each reused; an HTTP parent
        // pools its own origin connections the same way.
        assert_eq!((origin.connections(), other.connections()), (1, 1), "{kind}");
        if kind == "http" {
            // Every exchange a line at the parent, each naming its client: the first hop,
            // on one connection.
            let lines = count_lines(|| p.log_text(), |l| l.contains(" 200 "), 12);
            assert_eq!(lines, 12, "{kind}:\n{}", p.log_text());
            let log = p.log_text();
            let mut clients: Vec<&str> =
                log.lines().filter_map(|l| l.split_whitespace().nth(1)).collect();
            clients.sort_unstable();
            clients.dedup();
            assert_eq!(clients.len(), 1, "connections to the HTTP parent:\n{log}");
        }
    }
}
