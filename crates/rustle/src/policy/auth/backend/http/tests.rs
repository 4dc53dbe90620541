//! Tests of the http backend against a callback server started by each test
//! (`rustle_bench::AuthCallback`, counting its calls and connections).

use std::time::{Duration, Instant};

use rustle_bench::{AuthCallback, Reply};
use serde_json::Value;

use super::super::{Ask, Failure, Grant, Verdict};
use super::Http;
use crate::config::HttpBackend;

fn settings(url: &str, extra: &str) -> HttpBackend {
    let text = format!("url = {url:?}\n{extra}");
    match toml::from_str(&text) {
        Ok(cfg) => cfg,
        Err(e) => panic!("settings {text:?}: {e}"),
    }
}

fn backend(url: &str, extra: &str) -> Http {
    match Http::new(&settings(url, extra)) {
        Ok(b) => b,
        Err(e) => panic!("new: {e}"),
    }
}

fn ask(user: &str, password: &str) -> Ask {
    Ask {
        user: user.into(),
        password: password.as_bytes().to_vec(),
        client: "192.0.2.9".parse().expect("an address"),
        listener: "office".into(),
        protocol: "connect",
        target: Some("example.com:443".into()),
    }
}

/// alice/right: allowed with groups, egress, limits and a lifetime; alice/other: refused
/// with `allow: false`; bob: 403; anyone else: 404.
fn directory(body: &Value) -> Reply {
    match (body["user"].as_str(), body["password"].as_str()) {
        (Some("alice"), Some("right")) => Reply::ok(
            r#"{"allow": true, "groups": ["staff", "eu"], "egress": "198.18.0.7",
                "max_connections": 20, "bandwidth": "10MB", "ttl": 60, "note": "ignored"}"#,
        ),
        (Some("alice"), _) => Reply::ok(r#"{"allow": false}"#),
        (Some("bob"), _) => Reply::status(403),
        _ => Reply::status(404),
    }
}

#[tokio::test]
async fn allow_carries_groups_egress_and_limits() {
    let cb = AuthCallback::start(directory).expect("callback");
    let dir = std::env::temp_dir().join(format!("rustle-http-token-{}", std::process::id()));
    std::fs::write(&dir, "s3cret-token\n").expect("token file");
    let http = backend(
        &cb.url(),
        &format!("send_target = true\ntoken_file = {:?}\nheaders = {{ X-Site = \"lab\" }}", dir),
    );
    let verdict = http.check(&ask("alice", "right")).await;
    let _ = std::fs::remove_file(&dir);
    assert_eq!(
        verdict,
        Ok(Verdict::Allow(Grant {
            groups: vec!["staff".into(), "eu".into()],
            egress: Some("198.18.0.7".parse().expect("an address")),
            max_connections: Some(20),
            bandwidth: Some(10_000_000),
            ttl: Some(Duration::from_secs(60)),
            class: None,
        }))
    );
    let (body, auth) = cb.last().expect("a call");
    assert_eq!(
        body,
        serde_json::json!({"user": "alice", "password": "right", "client": "192.0.2.9",
            "listener": "office", "protocol": "connect", "target": "example.com:443"})
    );
    assert_eq!(auth.as_deref(), Some("Bearer s3cret-token"));
}

#[tokio::test]
async fn a_rotated_token_is_read_again() {
    let cb = AuthCallback::start(directory).expect("callback");
    let file = std::env::temp_dir().join(format!("rustle-http-rotate-{}", std::process::id()));
    std::fs::write(&file, "first").expect("token file");
    let mut http = backend(&cb.url(), &format!("token_file = {file:?}"));
    let bearer = || cb.last().and_then(|(_, auth)| auth);
    http.check(&ask("alice", "right")).await.expect("an answer");
    assert_eq!(bearer().as_deref(), Some("Bearer first"));
    // Within the refresh time the file is not read again.
    std::fs::write(&file, "second").expect("token file");
    http.check(&ask("alice", "right")).await.expect("an answer");
    assert_eq!(bearer().as_deref(), Some("Bearer first"));
    http.token_refresh = Duration::ZERO;
    http.check(&ask("alice", "right")).await.expect("an answer");
    assert_eq!(bearer().as_deref(), Some("Bearer second"));
    // A file that cannot be read keeps the token in use.
    std::fs::remove_file(&file).expect("remove");
    http.check(&ask("alice", "right")).await.expect("an answer");
    assert_eq!(bearer().as_deref(), Some("Bearer second"));
}

#[tokio::test]
async fn deny_unknown_and_the_target_left_out() {
    let cb = AuthCallback::start(directory).expect("callback");
    let http = backend(&cb.url(), "");
    assert_eq!(http.check(&ask("alice", "wrong")).await, Ok(Verdict::Deny));
    assert_eq!(http.check(&ask("bob", "any")).await, Ok(Verdict::Deny));
    assert_eq!(http.check(&ask("carol", "any")).await, Ok(Verdict::Unknown));
    assert_eq!(cb.calls(), 3);
    // One connection, kept alive for the three calls.
    assert_eq!(cb.connections(), 1);
    // send_target is off by default.
    let (body, auth) = cb.last().expect("a call");
    assert_eq!(body.get("target"), None);
    assert_eq!(auth, None);
}

#[tokio::test]
async fn a_password_json_cannot_carry_is_refused_without_a_call() {
    let cb = AuthCallback::start(directory).expect("callback");
    let http = backend(&cb.url(), "");
    let mut a = ask("alice", "");
    a.password = vec![b'r', 0xff];
    assert_eq!(http.check(&a).await, Ok(Verdict::Deny));
    assert_eq!(cb.calls(), 0);
}

fn protocol_failure(v: Result<Verdict, Failure>, says: &str) {
    match v {
        Err(Failure::Protocol(text)) if text.contains(says) => {}
        other => panic!("expected a protocol failure saying {says:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_answers_are_failures() {
    let table: &[(Reply, &str)] = &[
        (Reply::status(500), "500"),
        (Reply::status(302), "302"),
        (Reply::ok("<html>not json</html>"), "callback answer"),
        (Reply::ok(r#"{"groups": ["a"]}"#), "allow"),
        (Reply::ok(r#"{"allow": true, "egress": "not-an-address"}"#), "callback answer"),
        (Reply::ok(r#"{"allow": true, "groups": ["two words"]}"#), "group"),
        (Reply::ok(r#"{"allow": true, "bandwidth": "10mb"}"#), "bandwidth"),
        (Reply::ok(r#"{"allow": true, "bandwidth": 0}"#), "bandwidth"),
        (Reply::ok(&format!(r#"{{"allow": true, "pad": "{}"}}"#, "x".repeat(70_000))), "longer"),
    ];
    for (reply, says) in table {
        let reply = reply.clone();
        let cb = AuthCallback::start(move |_| reply.clone()).expect("callback");
        let http = backend(&cb.url(), "");
        protocol_failure(http.check(&ask("alice", "right")).await, says);
        assert_eq!(cb.calls(), 1);
    }
}

#[tokio::test]
async fn a_numeric_bandwidth_is_bytes_a_second() {
    let cb = AuthCallback::start(|_| Reply::ok(r#"{"allow": true, "bandwidth": 125000}"#))
        .expect("callback");
    let http = backend(&cb.url(), "");
    let Ok(Verdict::Allow(grant)) = http.check(&ask("alice", "right")).await else {
        panic!("not allowed");
    };
    assert_eq!(grant.bandwidth, Some(125_000));
    assert_eq!(grant.groups, Vec::<String>::new());
}

#[tokio::test]
async fn a_slow_callback_times_out() {
    let cb = AuthCallback::start(|_| Reply::ok(r#"{"allow": true}"#).after(Duration::from_secs(3)))
        .expect("callback");
    let http = backend(&cb.url(), "timeout = \"200ms\"");
    let start = Instant::now();
    assert_eq!(http.check(&ask("alice", "right")).await, Err(Failure::Timeout));
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(190) && took < Duration::from_secs(2), "{took:?}");
}

#[tokio::test]
async fn a_closed_port_is_unreachable() {
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let http = backend(&format!("http://127.0.0.1:{port}/check"), "");
    match http.check(&ask("alice", "right")).await {
        Err(Failure::Unreachable(text)) => {
            assert!(text.contains("refused") && !text.contains("127.0.0.1:"), "{text}")
        }
        other => panic!("expected unreachable, got {other:?}"),
    }
}

#[tokio::test]
async fn calls_beyond_max_in_flight_wait_for_a_slot() {
    let cb =
        AuthCallback::start(|_| Reply::ok(r#"{"allow": true}"#).after(Duration::from_millis(600)))
            .expect("callback");
    let (one, two) = (ask("alice", "1"), ask("alice", "2"));
    // One slot: a second call waits for the first within its own timeout.
    let http = backend(&cb.url(), "max_in_flight = 1\ntimeout = \"2s\"");
    let start = Instant::now();
    let (a, b) = tokio::join!(http.check(&one), http.check(&two));
    assert!(matches!(a, Ok(Verdict::Allow(_))), "{a:?}");
    assert!(matches!(b, Ok(Verdict::Allow(_))), "{b:?}");
    // One after the other, not together.
    assert!(start.elapsed() >= Duration::from_millis(1150), "{:?}", start.elapsed());
    assert_eq!(cb.calls(), 2);
    // A slot held longer than a call's timeout: that call fails without reaching the
    // callback.
    let http = backend(&cb.url(), "max_in_flight = 1\ntimeout = \"200ms\"");
    let held = http.slots.acquire().await.expect("a slot");
    assert_eq!(http.check(&one).await, Err(Failure::Overloaded));
    drop(held);
    assert_eq!(cb.calls(), 2);
}

#[tokio::test]
async fn https_with_a_client_certificate() {
    let cb = AuthCallback::start_tls(directory).expect("callback");
    let tls = cb.tls().expect("tls files").clone();
    let http = backend(
        &cb.url(),
        &format!(
            "ca = {:?}\nclient_cert = {:?}\nclient_key = {:?}",
            tls.ca, tls.client_cert, tls.client_key
        ),
    );
    assert!(matches!(http.check(&ask("alice", "right")).await, Ok(Verdict::Allow(_))));
    assert_eq!(http.check(&ask("carol", "x")).await, Ok(Verdict::Unknown));
    assert_eq!(cb.connections(), 1);

    // Without the client certificate the server ends the handshake: no answer.
    let http = backend(&cb.url(), &format!("ca = {:?}", tls.ca));
    assert!(http.check(&ask("alice", "right")).await.is_err());
    // Without the CA (the system's roots), the server is not trusted.
    let http = backend(
        &cb.url(),
        &format!("client_cert = {:?}\nclient_key = {:?}", tls.client_cert, tls.client_key),
    );
    match http.check(&ask("alice", "right")).await {
        Err(Failure::Unreachable(text)) | Err(Failure::Protocol(text)) => {
            assert!(text.contains("certificate") || text.contains("Unknown"), "{text}")
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    assert_eq!(cb.calls(), 2);
}

#[test]
fn settings_problems_are_named() {
    let table = [
        ("ftp://x/", "", "neither http:// nor https://"),
        ("https://x/", "client_cert = \"/c.pem\"", "client_cert without client_key"),
        ("http://x/", "ca = \"/ca.pem\"", "need an https:// url"),
        ("http://x/", "headers = { Host = \"a\" }", "written by the client"),
        ("http://x/", "headers = { \"a b\" = \"a\" }", "not a field name"),
        ("http://x/", "headers = { X-A = \"a\\nb\" }", "control character"),
        ("http://x/", "max_in_flight = 0", "max_in_flight"),
        (
            "http://x/",
            "token_file = \"/t\"\nheaders = { authorization = \"k\" }",
            "Authorization and token_file",
        ),
    ];
    for (url, extra, says) in table {
        let problems = settings(url, extra).problems();
        assert!(problems.iter().any(|p| p.contains(says)), "{url} {extra}: {problems:?}");
        match Http::new(&settings(url, extra)) {
            Err(e) => assert!(e.contains(says), "{e}"),
            Ok(_) => panic!("{url} {extra}: accepted"),
        }
    }
    assert_eq!(settings("https://auth.example/check", "").problems(), Vec::<String>::new());
    // Files that cannot be read are named by their key.
    let missing = Http::new(&settings("https://x/", "ca = \"/nonexistent/ca.pem\"")).err();
    assert!(missing.is_some_and(|e| e.starts_with("ca: /nonexistent/ca.pem")));
    let missing = Http::new(&settings("http://x/", "token_file = \"/nonexistent/t\"")).err();
    assert!(missing.is_some_and(|e| e.starts_with("token_file /nonexistent/t")));
    // An unknown key is refused.
    assert!(toml::from_str::<HttpBackend>("url = \"http://x/\"\nurls = 1").is_err());
}

/// The commented-out `kind = "http"` table of rustle.example.toml, uncommented, is valid.
#[test]
fn the_example_documents_every_key() {
    let text = include_str!("../../../../../../../rustle.example.toml");
    let start =
        text.find("# [[auth.backend]]\n# kind = \"http\"").expect("an http backend example");
    let table: String = text[start..]
        .lines()
        .skip(2)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.strip_prefix("# "))
        .map(|l| format!("{l}\n"))
        .collect();
    let cfg: HttpBackend = toml::from_str(&table).unwrap_or_else(|e| panic!("{e}\n{table}"));
    assert_eq!(cfg.problems(), Vec::<String>::new());
    let keys = toml::from_str::<toml::Table>(&table).map(|t| t.len()).unwrap_or(0);
    assert_eq!(keys, 12, "every key but kind:\n{table}");
    assert_eq!(cfg.common().timeout, Duration::from_secs(5));
}
