//! The order of `[[auth.backend]]` and what it shares between backends, with two HTTP
//! callbacks (`rustle_bench::AuthCallback`, counting their calls) beside the users file:
//! the file settles its names at its place in the order, a name a backend does not know
//! goes to the next, refusals wait out `refusal_delay` whoever answered, a reload keeps the
//! remembered answers of an unchanged backend and forgets those of a changed one, and
//! `/metrics` tells whether each backend answers.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rustle_bench::{AuthCallback, Origin, Reply};
use serde_json::Value;

use crate::util::*;

/// A callback that accepts `user` with `password` (group `staff`), refuses another
/// password of `user` (after `slow` when given), and does not know anyone else (404).
fn knows(
    user: &'static str,
    password: &'static str,
    slow: Duration,
) -> impl Fn(&Value) -> Reply + Send + Sync + 'static {
    move |body: &Value| match (body["user"].as_str(), body["password"].as_str()) {
        (Some(u), Some(p)) if u == user && p == password => {
            Reply::ok(r#"{"allow": true, "groups": ["staff"]}"#)
        }
        (Some(u), _) if u == user => Reply::ok(r#"{"allow": false}"#).after(slow),
        _ => Reply::status(404),
    }
}

/// `[[auth.backend]]` for a callback at `cb`, named `name`, with `extra` settings.
fn backend(name: &str, cb: &AuthCallback, extra: &str) -> String {
    format!(
        "[[auth.backend]]\nkind = \"http\"\nname = \"{name}\"\nurl = \"{}\"\n{extra}\n",
        cb.url()
    )
}

/// A listener with auth, the admin endpoint, `auth` lines (the `[auth]` table's keys) and
/// the backends.
fn config(auth: &str, backends: &str) -> String {
    format!(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [auth]\nfailures_burst = 1000\n{auth}\n{backends}"
    )
}

fn status_of(proxy: &Proxy, url: &str, user: &str, password: &str) -> u16 {
    get_as(proxy.addr(), url, user, password).status
}

/// The admin endpoint's `/metrics` text.
fn metrics(admin: SocketAddr) -> String {
    let mut s = connect(admin);
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}

#[test]
fn the_users_file_and_the_backends_answer_in_order() {
    let first = AuthCallback::start(knows("alice", "a-pw", Duration::ZERO)).expect("callback");
    // The second would accept `filer` with any password: the file settles that name first.
    let second = AuthCallback::start(|body: &Value| match body["user"].as_str() {
        Some("bob") | Some("filer") => Reply::ok(r#"{"allow": true}"#),
        _ => Reply::status(404),
    })
    .expect("callback");
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/10");
    let file_user = "[[auth.user]]\nname = \"filer\"\npassword = \"plain:f-pw\"\n";
    let backends = backend("first", &first, "") + &backend("second", &second, "");
    let proxy =
        Proxy::from_toml(&config(&format!("refusal_delay = \"10ms\"\n{file_user}"), &backends));

    assert_eq!(status_of(&proxy, &url, "filer", "f-pw"), 200);
    assert_eq!(status_of(&proxy, &url, "filer", "wrong"), 407, "the file refused, never passed on");
    assert_eq!((first.calls(), second.calls()), (0, 0), "the users file's names go nowhere else");
    assert_eq!(status_of(&proxy, &url, "alice", "a-pw"), 200);
    assert_eq!((first.calls(), second.calls()), (1, 0));
    assert_eq!(status_of(&proxy, &url, "bob", "any"), 200, "unknown to the first, the second's");
    assert_eq!((first.calls(), second.calls()), (2, 1));
    assert_eq!(status_of(&proxy, &url, "nobody", "x"), 407, "known to none");
    assert_eq!((first.calls(), second.calls()), (3, 2));
    // A wrong password the first backend refuses ends there.
    assert_eq!(status_of(&proxy, &url, "alice", "wrong"), 407);
    assert_eq!((first.calls(), second.calls()), (4, 2));
    let ok = proxy.log_lines_matching(3, |l| l.contains(" 200 "));
    let users: Vec<String> = ok.iter().map(|l| LogLine::parse(l).user).collect();
    assert_eq!(users, ["filer", "alice", "bob"], "{ok:?}");

    // The file placed after the first backend: `filer` is asked of it first (404), then
    // settled by the file; the second is never asked for it.
    let reordered = backend("first", &first, "")
        + "[[auth.backend]]\nkind = \"file\"\n"
        + &backend("second", &second, "");
    proxy.reload_toml(&config(&format!("refusal_delay = \"10ms\"\n{file_user}"), &reordered));
    assert_eq!(status_of(&proxy, &url, "filer", "wrong"), 407);
    assert_eq!((first.calls(), second.calls()), (5, 2));
    assert_eq!(status_of(&proxy, &url, "filer", "f-pw"), 200);
    assert_eq!((first.calls(), second.calls()), (6, 2));
}

#[test]
fn refusals_wait_out_the_refusal_delay_whoever_answers() {
    // A wrong password is refused after 150 ms; an unknown name at once.
    let cb = AuthCallback::start(knows("alice", "a-pw", Duration::from_millis(150))).expect("cb");
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/10");
    let proxy = Proxy::from_toml(&config("refusal_delay = \"400ms\"", &backend("cb", &cb, "")));
    let timed = |user: &str, password: &str| {
        let t = Instant::now();
        let status = status_of(&proxy, &url, user, password);
        (status, t.elapsed())
    };
    // Each refusal with a password not asked before (remembered ones are refused too,
    // after the same delay: the last one).
    for (user, password) in [("alice", "w1"), ("nobody", "w2"), ("alice", "w1")] {
        let (status, took) = timed(user, password);
        assert_eq!(status, 407, "{user}");
        assert!(took >= Duration::from_millis(400), "{user}/{password} refused after {took:?}");
    }
    // An acceptance does not wait.
    let (status, took) = timed("alice", "a-pw");
    assert_eq!(status, 200);
    assert!(took < Duration::from_millis(400), "accepted after {took:?}");
    assert_eq!(cb.calls(), 3);
}

#[test]
fn a_reload_keeps_the_answers_of_unchanged_backends_only() {
    let first = AuthCallback::start(knows("alice", "a-pw", Duration::ZERO)).expect("callback");
    let second = AuthCallback::start(knows("bob", "b-pw", Duration::ZERO)).expect("callback");
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/10");
    let auth = "refusal_delay = \"10ms\"";
    let both = |second_timeout: &str| {
        backend("first", &first, "") + &backend("second", &second, second_timeout)
    };
    let proxy = Proxy::from_toml(&config(auth, &both("timeout = \"5s\"")));
    assert_eq!(status_of(&proxy, &url, "alice", "a-pw"), 200);
    assert_eq!(status_of(&proxy, &url, "bob", "b-pw"), 200);
    assert_eq!((first.calls(), second.calls()), (2, 1), "bob: the first's 404, the second's yes");
    // Remembered by both.
    assert_eq!(status_of(&proxy, &url, "alice", "a-pw"), 200);
    assert_eq!(status_of(&proxy, &url, "bob", "b-pw"), 200);
    assert_eq!((first.calls(), second.calls()), (2, 1));

    // The same settings: every answer kept.
    proxy.reload_toml(&config(auth, &both("timeout = \"5s\"")));
    assert_eq!(status_of(&proxy, &url, "alice", "a-pw"), 200);
    assert_eq!(status_of(&proxy, &url, "bob", "b-pw"), 200);
    assert_eq!((first.calls(), second.calls()), (2, 1));

    // The second's settings changed: its answers forgotten, the first's kept.
    proxy.reload_toml(&config(auth, &both("timeout = \"4s\"")));
    assert_eq!(status_of(&proxy, &url, "alice", "a-pw"), 200);
    assert_eq!((first.calls(), second.calls()), (2, 1), "alice remembered");
    assert_eq!(status_of(&proxy, &url, "bob", "b-pw"), 200);
    assert_eq!((first.calls(), second.calls()), (3, 2), "bob asked again");
}

#[test]
fn metrics_say_whether_each_backend_answers() {
    let cb = AuthCallback::start(knows("alice", "a-pw", Duration::ZERO)).expect("callback");
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/10");
    let cfg = config("refusal_delay = \"10ms\"", &backend("cb", &cb, "timeout = \"1s\""));
    let proxy = Proxy::from_toml(&cfg);
    assert_eq!(status_of(&proxy, &url, "alice", "a-pw"), 200);
    assert_eq!(status_of(&proxy, &url, "alice", "a-pw"), 200);
    assert_eq!(status_of(&proxy, &url, "alice", "no"), 407);
    let text = metrics(proxy.admin_addr());
    for line in [
        "rustle_auth_backend_up{backend=\"cb\"} 1",
        "rustle_auth_backend_answers_total{backend=\"cb\",answer=\"allowed\"} 1",
        "rustle_auth_backend_answers_total{backend=\"cb\",answer=\"cached\"} 1",
        "rustle_auth_backend_answers_total{backend=\"cb\",answer=\"denied\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
    drop(cb);
    assert_eq!(status_of(&proxy, &url, "carol", "c-pw"), 503);
    let text = metrics(proxy.admin_addr());
    let down = "rustle_auth_backend_up{backend=\"cb\"} 0";
    assert!(text.lines().any(|l| l == down), "no `{down}` in:\n{text}");
    let failed = "rustle_auth_backend_answers_total{backend=\"cb\",answer=\"failed\"} 1";
    assert!(text.lines().any(|l| l == failed), "no `{failed}` in:\n{text}");
}

#[test]
fn the_binary_sends_the_stop_of_a_session_open_when_it_is_told_to_end() {
    let Some(server) =
        rustle_bench::radiusd::Radiusd::start("erin\tCleartext-Password := \"pw-e\"\n")
    else {
        return;
    };
    let dir = TempDir::new("auth-chain-stop");
    let config = dir.file("rustle.toml");
    let text = format!(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n\
         [auth]\nrefusal_delay = \"0s\"\n\
         [[auth.backend]]\nkind = \"radius\"\nservers = [\"127.0.0.1:{}\"]\n\
         accounting_servers = [\"127.0.0.1:{}\"]\nsecret_file = {:?}\ntimeout = \"1s\"\n\
         [timeouts]\nshutdown = \"5s\"\n",
        server.auth_port(),
        server.acct_port(),
        server.secret_file().display().to_string(),
    );
    std::fs::write(&config, text).unwrap();
    let mut bin = RustleProcess::spawn(&["--config", config.to_str().unwrap()]);
    let http = bin.next_listener();
    let origin = Origin::start().unwrap();
    let (mut c, r) = connect_with(http, &origin.addr().to_string(), &[&proxy_auth("erin", "pw-e")]);
    assert_eq!(r.status, 200, "{}", r.head_text());
    c.send(b"GET /bytes/5000 HTTP/1.1\r\nHost: o\r\n\r\n");
    assert_eq!(c.read_response().status, 200);
    wait_for(Duration::from_secs(5), "a Start", || {
        server.detail().contains("Acct-Status-Type = Start").then_some(())
    });
    // Told to end with the tunnel open: the drain ends it, and the Stop goes out before
    // the process does.
    bin.signal("TERM");
    drop(c);
    assert!(bin.wait(Duration::from_secs(10)).is_some(), "{}", bin.stderr());
    let d = server.detail();
    let stop = d.split("\n\n").find(|b| b.contains("Acct-Status-Type = Stop"));
    let stop = stop.unwrap_or_else(|| panic!("no Stop once the process ended:\n{d}"));
    assert!(stop.contains("User-Name = \"erin\""), "{stop}");
}
