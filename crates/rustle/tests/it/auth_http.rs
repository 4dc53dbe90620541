//! The HTTP callback backend (`[[auth.backend]] kind = "http"`) through the real proxy:
//! right and wrong passwords over HTTP, CONNECT, SOCKS5 and the HTTPS port, a group the
//! callback grants reaching a rule, a granted connection limit, remembered answers (no
//! second call), an HTTPS callback requiring a client certificate, a slow callback (503
//! after `timeout`) and a callback stopped mid-run (503, then served again once it is
//! back); `rustle check` naming the problems of the settings. The callback is
//! `rustle_bench::AuthCallback`, counting its calls.

use std::time::Duration;

use rustle_bench::{AuthCallback, Origin, Reply};
use serde_json::Value;

use crate::util::*;

/// alice, carol and dave with password `right`: accepted (alice and carol in `staff`,
/// dave in `blocked`); a known user with another password: refused; anyone else: 404.
fn directory(body: &Value) -> Reply {
    let user = body["user"].as_str().unwrap_or_default();
    let right = body["password"].as_str() == Some("right");
    match user {
        "alice" | "carol" if right => Reply::ok(r#"{"allow": true, "groups": ["staff"]}"#),
        "dave" if right => Reply::ok(r#"{"allow": true, "groups": ["blocked"]}"#),
        "erin" if right => Reply::ok(r#"{"allow": true, "max_connections": 1}"#),
        "slow" => Reply::ok(r#"{"allow": true}"#).after(Duration::from_secs(3)),
        "alice" | "carol" | "dave" => Reply::ok(r#"{"allow": false}"#),
        _ => Reply::status(404),
    }
}

struct Setup {
    proxy: Proxy,
    ca: std::path::PathBuf,
    _dir: TempDir,
}

/// An HTTP listener, an HTTPS one and a SOCKS one, all with auth, the callback at `url`,
/// and a rule refusing the group `blocked`.
fn proxy(url: &str) -> Setup {
    proxy_with(url, "")
}

/// `proxy`, with `extra` settings of the backend.
fn proxy_with(url: &str, extra: &str) -> Setup {
    let dir = TempDir::new("auth-http");
    let files = rustle::io::tls::write_self_signed("localhost", &dir.path().join("localhost"))
        .expect("self-signed set");
    let proxy = Proxy::from_toml(&format!(
        r#"
[[listener]]
listen = "127.0.0.1:0"
auth = true
[[listener]]
kind = "https"
listen = "127.0.0.1:0"
auth = true
[listener.tls]
cert = "{}"
key = "{}"
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
auth = true
[auth]
failures_burst = 1000
refusal_delay = "10ms"
[[auth.backend]]
kind = "http"
name = "callback"
url = "{url}"
timeout = "1s"
{extra}
[[rule]]
name = "no-blocked"
action = "deny"
groups = ["blocked"]
"#,
        files.chain.display(),
        files.key.display()
    ));
    Setup { proxy, ca: files.ca, _dir: dir }
}

/// The HTTP status curl saw (000 when it got none), through `proxy_args`.
fn status(proxy_args: &[&str], url: &str) -> Option<String> {
    let args = [proxy_args, &["-s", "-o", "/dev/null", "-w", "%{http_code}", url]].concat();
    curl(&args).map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn right_and_wrong_passwords_on_every_front_end() {
    let cb = AuthCallback::start(directory).expect("callback");
    let s = proxy(&cb.url());
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/10");

    // HTTP.
    let http = |user: &str| status(&["-x", &s.proxy.url(), "--proxy-user", user], &url);
    let Some(code) = http("alice:right") else { return };
    assert_eq!(code, "200");
    assert_eq!(http("alice:xyzzy1").unwrap(), "407");
    assert_eq!(http("nobody:right").unwrap(), "407");
    let (body, _) = cb.last().expect("a call");
    assert_eq!((body["user"].as_str(), body["protocol"].as_str()), (Some("nobody"), Some("http")));
    assert_eq!(body["password"], "right");

    // CONNECT.
    let target = origin.addr().to_string();
    let (_, r) = connect_with(s.proxy.addr(), &target, &[&proxy_auth("carol", "right")]);
    assert_eq!(r.status, 200, "{}", r.head_text());
    let (_, r) = connect_with(s.proxy.addr(), &target, &[&proxy_auth("carol", "xyzzy2")]);
    assert_eq!(r.status, 407, "{}", r.head_text());
    let (body, _) = cb.last().expect("a call");
    assert_eq!(body["protocol"], "connect");

    // SOCKS5.
    let socks = |user: &str| {
        let via = format!("socks5h://{user}@{}", s.proxy.addr_of(2));
        curl(&["-x", &via, "-s", "-o", "/dev/null", "-w", "%{http_code}", &url]).unwrap()
    };
    let out = socks("alice:right");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "{out:?}");
    let out = socks("alice:xyzzy3");
    assert!(!out.status.success(), "a wrong password got through SOCKS5: {out:?}");
    let (body, _) = cb.last().expect("a call");
    assert_eq!(body["protocol"], "socks5");
    // dave is accepted, then refused by the rule on his group (reply 2: not allowed).
    let out = socks("dave:right");
    assert!(String::from_utf8_lossy(&out.stderr).contains("(2)"), "{out:?}");

    // The HTTPS port.
    let via = format!("https://localhost:{}", s.proxy.addr_of(1).port());
    let ca = s.ca.to_str().unwrap();
    let https =
        |user: &str| status(&["--proxy", &via, "--proxy-cacert", ca, "--proxy-user", user], &url);
    assert_eq!(https("carol:right").unwrap(), "200");
    assert_eq!(https("carol:xyzzy4").unwrap(), "407");

    // Every refusal logged (the SOCKS5 one with status 2), no password in the log.
    let refused = s.proxy.log_lines_matching(5, |l| l.contains("wrong password"));
    assert_eq!(refused.len(), 5, "{refused:?}");
    let log = s.proxy.log_text();
    assert!(!log.contains("right") && !log.contains("xyzzy"), "a password in the log:\n{log}");
}

#[test]
fn a_group_the_callback_grants_reaches_a_rule() {
    let cb = AuthCallback::start(directory).expect("callback");
    let s = proxy(&cb.url());
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/10");
    let http = |user: &str| status(&["-x", &s.proxy.url(), "--proxy-user", user], &url);
    let Some(code) = http("dave:right") else { return };
    assert_eq!(code, "403");
    s.proxy.log_line(|l| l.contains(" 403 ") && l.contains("no-blocked"));
    assert_eq!(http("alice:right").unwrap(), "200");
    assert_eq!(origin.requests(), 1, "the blocked group reached the origin");
}

#[test]
fn answers_are_remembered() {
    let cb = AuthCallback::start(directory).expect("callback");
    let s = proxy(&cb.url());
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/10");
    let http = |user: &str| status(&["-x", &s.proxy.url(), "--proxy-user", user], &url);
    let Some(code) = http("alice:right") else { return };
    assert_eq!(code, "200");
    assert_eq!(http("alice:right").unwrap(), "200");
    assert_eq!(cb.calls(), 1, "an accepted password asked twice");
    assert_eq!(http("alice:wrong").unwrap(), "407");
    assert_eq!(http("alice:wrong").unwrap(), "407");
    assert_eq!(cb.calls(), 2, "a refused password asked twice");
    // Another password of the same user is another question.
    assert_eq!(http("alice:other").unwrap(), "407");
    assert_eq!(cb.calls(), 3);
    // The calls went over one kept-alive connection.
    assert_eq!(cb.connections(), 1);
}

#[test]
fn a_stopped_callback_refuses_then_recovers() {
    let cb = AuthCallback::start(directory).expect("callback");
    let addr = cb.addr();
    let s = proxy(&cb.url());
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/10");
    let http = |user: &str| status(&["-x", &s.proxy.url(), "--proxy-user", user], &url);
    let Some(code) = http("alice:right") else { return };
    assert_eq!(code, "200");

    drop(cb);
    // carol was never asked: the backend is, and gives no answer.
    assert_eq!(http("carol:right").unwrap(), "503");
    let line = s.proxy.log_line(|l| l.contains(" 503 "));
    assert!(line.contains("authentication backend is unavailable"), "{line}");
    let (_, r) =
        connect_with(s.proxy.addr(), &origin.addr().to_string(), &[&proxy_auth("carol", "right")]);
    assert_eq!(r.status, 503, "{}", r.head_text());
    assert!(r.text().contains("authentication backend"), "{}", r.text());
    // alice's answer is remembered: she goes on meanwhile.
    assert_eq!(http("alice:right").unwrap(), "200");

    let cb = AuthCallback::start_on(addr, directory).expect("the callback again");
    assert!(
        wait_until(Duration::from_secs(3), || http("carol:right").as_deref() == Some("200")),
        "not served again once the callback is back"
    );
    assert_eq!(cb.calls(), 1);
}

#[test]
fn an_https_callback_with_a_client_certificate() {
    let cb = AuthCallback::start_tls(directory).expect("callback");
    let tls = cb.tls().expect("tls files").clone();
    let s = proxy_with(
        &cb.url(),
        &format!(
            "ca = {:?}\nclient_cert = {:?}\nclient_key = {:?}",
            tls.ca, tls.client_cert, tls.client_key
        ),
    );
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/10");
    let http = |user: &str| status(&["-x", &s.proxy.url(), "--proxy-user", user], &url);
    let Some(code) = http("alice:right") else { return };
    assert_eq!(code, "200");
    assert_eq!(http("alice:xyzzy").unwrap(), "407");
    assert_eq!((cb.calls(), cb.connections()), (2, 1));
}

#[test]
fn a_granted_connection_limit_holds() {
    let cb = AuthCallback::start(directory).expect("callback");
    let s = proxy(&cb.url());
    let echo = rustle_bench::TcpEcho::start().unwrap();
    let target = echo.addr().to_string();
    let auth = proxy_auth("erin", "right");
    let (first, r) = connect_with(s.proxy.addr(), &target, &[&auth]);
    assert_eq!(r.status, 200, "{}", r.head_text());
    let (_, r) = connect_with(s.proxy.addr(), &target, &[&auth]);
    assert_eq!(r.status, 503, "{}", r.head_text());
    first.shutdown_write();
    drop(first);
    assert!(
        wait_until(Duration::from_secs(3), || {
            connect_with(s.proxy.addr(), &target, &[&auth]).1.status == 200
        }),
        "the place was not given back"
    );
}

#[test]
fn a_slow_callback_fails_within_its_timeout() {
    let cb = AuthCallback::start(directory).expect("callback");
    let s = proxy(&cb.url());
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/10");
    let start = std::time::Instant::now();
    let Some(code) = status(&["-x", &s.proxy.url(), "--proxy-user", "slow:x"], &url) else {
        return;
    };
    assert_eq!(code, "503");
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_millis(2500), "{took:?}");
}

#[test]
fn rustle_check_names_every_problem_of_the_http_settings() {
    let dir = TempDir::new("auth-http-check");
    let file = dir.file("rustle.toml");
    let text = "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n[[auth.backend]]\n\
                kind = \"http\"\nurl = \"ftp://auth\"\nclient_cert = \"/c.pem\"\n\
                headers = { Host = \"x\" }\n";
    std::fs::write(&file, text).unwrap();
    let out = clean_command(rustle_bin())
        .args(["-c", file.to_str().unwrap(), "check", "--no-bind"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let said =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    for part in [
        "auth.backend `http`: url \"ftp://auth\" is neither http:// nor https://",
        "client_cert without client_key",
        "headers: \"Host\" is written by the client itself",
    ] {
        assert!(said.contains(part), "{part:?} not in {said}");
    }
}
