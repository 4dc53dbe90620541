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
    let deadline = Instant::now() + Duration::from_secs(1);
    while leftovers(pgid, dir).len() < n {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
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
