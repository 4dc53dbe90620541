//! `[[auth.backend]] kind = "ldap"` through the proxy, against a real slapd
//! (`rustle_bench::slapd`, its example people): the right and a wrong password over HTTP,
//! CONNECT, SOCKS5 and the HTTPS port, a group from the directory reaching a rule, a
//! disabled account, the directory stopped mid-run (503, logged) and started again, and the
//! remembered answer (a second request makes no bind).

use std::time::Duration;

use rustle::io::tls::write_self_signed;
use rustle_bench::slapd::{Slapd, PEOPLE};
use rustle_bench::{Origin, TcpEcho};

use crate::util::*;

const ALICE: &str = "uid=alice,ou=people,dc=example,dc=org";
const BOB: &str = "uid=bob,ou=people,dc=example,dc=org";

/// HTTP, SOCKS5 and HTTPS listeners with auth, users from `slapd` only (no users file);
/// only admins reach `admins_port`.
fn ldap_proxy(slapd: &Slapd, dir: &TempDir, admins_port: u16) -> Proxy {
    let files = write_self_signed("localhost", &dir.path().join("tls")).expect("certificates");
    Proxy::from_toml(&format!(
        r#"
[[listener]]
listen = "127.0.0.1:0"
auth = true
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
auth = true
[[listener]]
kind = "https"
listen = "127.0.0.1:0"
auth = true
[listener.tls]
cert = {cert:?}
key = {key:?}
[auth]
failures_burst = 1000
refusal_delay = "20ms"
[[auth.backend]]
kind = "ldap"
name = "directory"
url = {url:?}
bind_dn_template = "uid={{user}},ou=people,dc=example,dc=org"
group_attribute = "memberOf"
disabled_filter = "(employeeType=disabled)"
timeout = "2s"
[[rule]]
name = "admins-only"
action = "allow"
groups = ["admins"]
ports = ["{admins_port}"]
[[rule]]
name = "nobody-else"
action = "deny"
ports = ["{admins_port}"]
"#,
        cert = files.chain.display().to_string(),
        key = files.key.display().to_string(),
        url = slapd.url(),
    ))
}

/// curl's HTTP status for `url` through the proxy URL `proxy` (`extra` arguments first).
fn status(extra: &[&str], proxy: &str, url: &str) -> Option<String> {
    let mut args = extra.to_vec();
    args.extend(["-x", proxy, "-o", "/dev/null", "-w", "%{http_code}", url]);
    let out = curl(&args)?;
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn directory_users_pass_every_front_end_and_groups_reach_rules() {
    let Some(slapd) = Slapd::start(PEOPLE) else { return };
    let origin = Origin::start().unwrap();
    let admins_only = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let dir = TempDir::new("auth-ldap");
    let proxy = ldap_proxy(&slapd, &dir, admins_only.addr().port());
    let (http, socks, https) = (proxy.addr_of(0), proxy.addr_of(1), proxy.addr_of(2));
    let url = origin.url("/bytes/10");

    // HTTP: right, wrong, unknown, disabled.
    let Some(code) = status(&[], &proxy_url_with(http, "alice", "wonderland"), &url) else {
        return;
    };
    assert_eq!(code, "200");
    assert_eq!(status(&[], &proxy_url_with(http, "alice", "wrong"), &url).unwrap(), "407");
    assert_eq!(status(&[], &proxy_url_with(http, "zed", "wonderland"), &url).unwrap(), "407");
    assert_eq!(status(&[], &proxy_url_with(http, "carol", "carol-pw"), &url).unwrap(), "407");
    // Another spelling of alice's name, with her password: not a second user.
    assert_eq!(status(&[], &proxy_url_with(http, "ALICE", "wonderland"), &url).unwrap(), "407");

    // CONNECT.
    let target = echo.addr().to_string();
    let (_, r) = connect_with(http, &target, &[&proxy_auth("bob", "wrong")]);
    assert_eq!(r.status, 407, "{}", r.head_text());
    let (mut c, r) = connect_with(http, &target, &[&proxy_auth("bob", "builder")]);
    assert_eq!(r.status, 200, "{}", r.head_text());
    assert_echoes(&mut c.s, b"through a tunnel of a directory user");
    drop(c);

    // SOCKS5 username/password.
    let good = format!("socks5h://bob:builder@{socks}");
    let out = curl(&["-s", "-x", &good, &url]).unwrap();
    assert_success("curl -x socks5h://bob:builder@", &out);
    assert_eq!(out.stdout.len(), 10);
    let bad = format!("socks5h://bob:wrong@{socks}");
    let out = curl(&["-s", "-x", &bad, &url]).unwrap();
    assert!(!out.status.success(), "a wrong password passed SOCKS5: {out:?}");

    // The HTTPS port.
    let ca = dir.path().join("tls").join("ca.pem");
    let ca = ca.to_str().unwrap();
    let https = format!("https://localhost:{}", https.port());
    let tls = ["--proxy-cacert", ca, "--proxy-user", "alice:wonderland"];
    assert_eq!(status(&tls, &https, &url).unwrap(), "200");
    let tls = ["--proxy-cacert", ca, "--proxy-user", "alice:wrong"];
    assert_eq!(status(&tls, &https, &url).unwrap(), "407");

    // The directory's groups reach the rules: alice is in admins, bob is not.
    let only = admins_only.url("/bytes/10");
    assert_eq!(status(&[], &proxy_url_with(http, "alice", "wonderland"), &only).unwrap(), "200");
    assert_eq!(status(&[], &proxy_url_with(http, "bob", "builder"), &only).unwrap(), "403");
    proxy.log_line(|l| l.contains(" 403 ") && l.contains("user=bob"));
    assert_eq!(origin.requests() as usize + admins_only.requests() as usize, 4);
}

#[test]
fn a_remembered_answer_makes_no_bind_and_a_stopped_directory_refuses_until_it_returns() {
    let Some(mut slapd) = Slapd::start(PEOPLE) else { return };
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("auth-ldap-down");
    let proxy = ldap_proxy(&slapd, &dir, 1);
    let url = origin.url("/bytes/10");
    let alice = proxy_url_with(proxy.addr(), "alice", "wonderland");
    let Some(code) = status(&[], &alice, &url) else { return };
    assert_eq!(code, "200");
    assert_eq!(slapd.binds(ALICE), 1);
    // Within cache_ttl: answered from what the worker remembers.
    assert_eq!(status(&[], &alice, &url).unwrap(), "200");
    assert_eq!(status(&[], &alice, &url).unwrap(), "200");
    assert_eq!(slapd.binds(ALICE), 1, "a remembered user was checked again");

    slapd.stop();
    let bob = proxy_url_with(proxy.addr(), "bob", "builder");
    let mut c = Conn::to_proxy(&proxy);
    c.send(&request("GET", &url, &[&proxy_auth("bob", "builder")], b""));
    let r = c.read_response();
    assert_eq!(r.status, 503, "{}", r.head_text());
    assert!(r.text().contains("the authentication backend is unavailable"), "{}", r.text());
    proxy.log_line(|l| l.contains(" 503 "));
    // alice is remembered: the directory's absence costs her nothing.
    assert_eq!(status(&[], &alice, &url).unwrap(), "200");

    slapd.restart().expect("restart slapd");
    let ok = wait_until(Duration::from_secs(5), || status(&[], &bob, &url).unwrap() == "200");
    assert!(ok, "bob is still refused after the directory came back");
    assert!(slapd.binds(BOB) >= 1);
}

#[test]
fn rustle_check_names_every_problem_of_the_ldap_settings() {
    let dir = TempDir::new("auth-ldap-check");
    let file = dir.file("rustle.toml");
    let text = "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n[[auth.backend]]\n\
                kind = \"ldap\"\nurl = \"http://dir\"\nbind_dn_template = \"uid=x\"\npool_size = 0\n";
    std::fs::write(&file, text).unwrap();
    let out = clean_command(rustle_bin())
        .args(["-c", file.to_str().unwrap(), "check", "--no-bind"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let said =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    for part in [
        "auth.backend `ldap`: url \"http://dir\": expected ldap://host[:port] or ldaps://host[:port]",
        "bind_dn_template must contain {user}",
        "pool_size must be 1 to 64",
    ] {
        assert!(said.contains(part), "{part:?} not in {said}");
    }
}
