//! The users API (`/api/v1/users` on the admin listener) and cutting a user's connections:
//! no token configured, a wrong token, a blocked address; a user added, used with curl,
//! disabled (407 for new requests, its CONNECT tunnel closed within about a second),
//! removed by the API and by a reload; a plain-HTTP download in flight cut; the overlay
//! kept across a restart; `rustle user` end to end.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rustle_bench::{Origin, TcpEcho};

use crate::util::*;

const TOKEN: &str = "s3cret-admin-token-0123456789abcdef";

/// A request to the admin listener from `from`, with `token` and a JSON `body`.
fn api_from(
    from: &str,
    admin: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Resp {
    let mut s = connect_from(from, admin);
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: admin\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let (bytes, _) = read_until_close(&mut s);
    parse_response(&bytes)
}

fn api(admin: SocketAddr, method: &str, path: &str, body: &str) -> Resp {
    api_from("127.0.0.1", admin, method, path, Some(TOKEN), body)
}

/// A proxy requiring authentication, alice in its users file, an admin listener with
/// the token; `extra` is appended to the configuration.
fn proxy_with(dir: &TempDir, extra: &str) -> Proxy {
    let users = users_file(dir, &["alice:plain:secret"]);
    Proxy::from_toml(&config_text(&users, extra))
}

fn config_text(users: &std::path::Path, extra: &str) -> String {
    format!(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n\
         [auth]\nusers_file = {:?}\n\
         [admin]\nlisten = \"127.0.0.1:0\"\napi_token = \"{TOKEN}\"\n{extra}",
        users.to_str().unwrap()
    )
}

/// A CONNECT tunnel to `target` through `proxy` as `user`, established.
fn tunnel(proxy: &Proxy, target: SocketAddr, user: &str, password: &str) -> std::net::TcpStream {
    tunnel_via(proxy.addr(), target, user, password)
}

/// A CONNECT tunnel to `target` through the proxy at `addr` as `user`, established.
fn tunnel_via(
    addr: SocketAddr,
    target: SocketAddr,
    user: &str,
    password: &str,
) -> std::net::TcpStream {
    let mut c = Conn::open(addr);
    c.send(
        format!(
            "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{}\r\n\r\n",
            proxy_auth(user, password)
        )
        .as_bytes(),
    );
    let r = c.read_head();
    assert_eq!(r.status, 200, "CONNECT as {user}: {}", r.head_text());
    assert!(c.buf.is_empty(), "nothing after the CONNECT answer");
    let mut s = c.s;
    s.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    s
}

/// The status of a GET of `url` through `proxy` as `user`.
fn status_as(proxy: &Proxy, url: &str, user: &str, password: &str) -> u16 {
    let mut c = Conn::to_proxy(proxy);
    c.send(&request("GET", url, &[&proxy_auth(user, password)], b""));
    c.read_response().status
}

/// Asserts that `s` closes within `within` (reading and dropping whatever is still
/// queued first).
fn assert_ends_within(s: &mut std::net::TcpStream, within: Duration, what: &str) {
    let start = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Ok(_) | Err(_) => {}
        }
        assert!(start.elapsed() < within, "{what}: still open after {within:?}");
    }
}

#[test]
fn without_a_token_the_api_is_forbidden_even_on_loopback() {
    let proxy = Proxy::from_toml("[admin]\nlisten = \"127.0.0.1:0\"\n");
    let admin = proxy.admin_addr();
    let r = api_from("127.0.0.1", admin, "GET", "/api/v1/users", None, "");
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("\"error\"") && r.text().contains("token"), "{}", r.text());
    let r = api_from("127.0.0.1", admin, "GET", "/api/v1/users", Some("anything"), "");
    assert_eq!(r.status, 403, "{}", r.text());
    // The scrapes go on as before.
    assert_eq!(api_from("127.0.0.1", admin, "GET", "/healthz", None, "").status, 200);
}

#[test]
fn the_metrics_token_does_not_open_the_api_and_a_short_api_token_is_refused() {
    let metrics = "scrape-token";
    let proxy =
        Proxy::from_toml(&format!("[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{metrics}\"\n"));
    let admin = proxy.admin_addr();
    let r = api_from("127.0.0.1", admin, "GET", "/api/v1/users", Some(metrics), "");
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("api_token_file"), "{}", r.text());
    assert_eq!(api_from("127.0.0.1", admin, "GET", "/metrics", Some(metrics), "").status, 200);
    // Both set: each opens only its own part.
    let both = Proxy::from_toml(&format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{metrics}\"\napi_token = \"{TOKEN}\"\n"
    ));
    let admin = both.admin_addr();
    assert_eq!(api_from("127.0.0.1", admin, "GET", "/api/v1/users", Some(metrics), "").status, 401);
    assert_eq!(api_from("127.0.0.1", admin, "GET", "/api/v1/users", Some(TOKEN), "").status, 200);
    assert_eq!(api_from("127.0.0.1", admin, "GET", "/metrics", Some(TOKEN), "").status, 401);
    let problems = rustle::config::Config::parse_all(
        "[admin]\nlisten = \"127.0.0.1:0\"\napi_token = \"short\"\n",
    )
    .problems;
    assert!(problems.iter().any(|p| p.to_string().contains("api_token")), "{problems:?}");
}

#[test]
fn the_api_on_a_non_loopback_listener_is_warned_about() {
    let dir = TempDir::new("users-cleartext");
    let cfg = dir.file("rustle.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[listener]]\nlisten = \"127.0.0.1:0\"\n\
             [admin]\nlisten = \"0.0.0.0:0\"\nallow = [\"127.0.0.1/32\"]\napi_token = \"{TOKEN}\"\n"
        ),
    )
    .unwrap();
    let (bin, _) = RustleProcess::start(&["-c", cfg.to_str().unwrap()]);
    assert!(bin.wait_for_stderr("cleartext", Duration::from_secs(5)), "{}", bin.stderr());
    assert!(bin.stderr().contains("users API listens on 0.0.0.0"), "{}", bin.stderr());
}

#[test]
fn failed_tokens_never_lock_out_the_right_one_nor_the_probes() {
    let metrics = "scrape-token";
    let proxy = Proxy::from_toml(&format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{metrics}\"\napi_token = \"{TOKEN}\"\n"
    ));
    let admin = proxy.admin_addr();
    for _ in 0..12 {
        api_from("127.0.0.1", admin, "GET", "/api/v1/users", Some("guess"), "");
    }
    let r = api_from("127.0.0.1", admin, "GET", "/api/v1/users", Some("guess"), "");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(api_from("127.0.0.1", admin, "GET", "/api/v1/users", Some(TOKEN), "").status, 200);
    assert_eq!(api_from("127.0.0.1", admin, "GET", "/metrics", Some(metrics), "").status, 200);
    // The probes answer 401 to a wrong token, never 429.
    assert_eq!(api_from("127.0.0.1", admin, "GET", "/healthz", Some("guess"), "").status, 401);
    assert_eq!(api_from("127.0.0.1", admin, "GET", "/readyz", Some(metrics), "").status, 200);
}

/// Guesses spread over many addresses share one budget (100 a minute): past it a wrong
/// token from a fresh address is 429, the right token and the probes still answer.
#[test]
fn failed_tokens_from_many_addresses_share_a_global_budget() {
    let metrics = "scrape-token";
    let proxy = Proxy::from_toml(&format!(
        "[admin]\nlisten = \"0.0.0.0:0\"\nallow = [\"127.0.0.0/8\"]\ntoken = \"{metrics}\"\n\
         api_token = \"{TOKEN}\"\n"
    ));
    let admin = SocketAddr::from(([127, 0, 0, 1], proxy.admin_addr().port()));
    // 10 addresses, 10 guesses each: none over its own budget, all of them at the global one.
    for host in 2..12 {
        let from = format!("127.0.0.{host}");
        for _ in 0..10 {
            let r = api_from(&from, admin, "GET", "/api/v1/users", Some("guess"), "");
            assert_eq!(r.status, 401, "{from}: {}", r.text());
        }
    }
    let r = api_from("127.0.0.20", admin, "GET", "/api/v1/users", Some("guess"), "");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(api_from("127.0.0.20", admin, "GET", "/api/v1/users", Some(TOKEN), "").status, 200);
    assert_eq!(api_from("127.0.0.20", admin, "GET", "/metrics", Some(metrics), "").status, 200);
    assert_eq!(api_from("127.0.0.20", admin, "GET", "/healthz", Some("guess"), "").status, 401);
    assert_eq!(api_from("127.0.0.20", admin, "GET", "/readyz", Some(metrics), "").status, 200);
}

#[test]
fn a_wrong_token_is_401_and_an_address_outside_allow_is_closed() {
    let dir = TempDir::new("users-token");
    let proxy = proxy_with(&dir, "allow = [\"127.0.0.1/32\"]\n");
    let admin = proxy.admin_addr();
    let r = api_from("127.0.0.1", admin, "GET", "/api/v1/users", Some("wrong"), "");
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(r.header("www-authenticate").is_some_and(|v| v.starts_with("Bearer")));
    assert!(r.text().contains("\"error\""), "{}", r.text());
    let r = api_from("127.0.0.1", admin, "GET", "/api/v1/users", None, "");
    assert_eq!(r.status, 401);
    let r = api(admin, "GET", "/api/v1/users", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("\"alice\""), "{}", r.text());
    assert_eq!(api(admin, "PATCH", "/api/v1/users", "").status, 405);
    assert_eq!(api(admin, "GET", "/api/v1/users/nobody", "").status, 404);
    assert_eq!(api(admin, "GET", "/api/v1/users/a%2Fb", "").status, 400);
    // A name the per-user routes could not manage is not added either.
    let r = api(admin, "POST", "/api/v1/users", r#"{"name": "a/b", "password": "pw"}"#);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("'/'"), "{}", r.text());
    let big = "x".repeat(17 * 1024);
    assert_eq!(api(admin, "POST", "/api/v1/users", &big).status, 413);
    assert_eq!(api(admin, "POST", "/api/v1/users", "{not json").status, 400);
    // Blocked: closed without an answer.
    let mut s = connect_from("127.0.0.2", admin);
    let _ = s.write_all(b"GET /api/v1/users HTTP/1.1\r\n\r\n");
    let (bytes, _) = read_until_close(&mut s);
    assert!(bytes.is_empty(), "{}", String::from_utf8_lossy(&bytes));
    // The token never reaches the log.
    std::thread::sleep(Duration::from_millis(200));
    assert!(!proxy.log_text().contains(TOKEN));
}

#[test]
fn a_user_added_goes_through_and_disabling_it_cuts_its_tunnel() {
    let dir = TempDir::new("users-add");
    let proxy = proxy_with(&dir, "");
    let admin = proxy.admin_addr();
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let url = origin.url("/bytes/5");
    assert_eq!(status_as(&proxy, &url, "bob", "hunter2"), 407);
    let body = r#"{"name": "bob", "password": "hunter2", "groups": ["staff"]}"#;
    let r = api(admin, "POST", "/api/v1/users", body);
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(api(admin, "POST", "/api/v1/users", body).status, 409);
    if let Some(out) = curl(&[
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-x",
        &proxy_url_with(proxy.addr(), "bob", "hunter2"),
        &url,
    ]) {
        assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "curl as bob");
    } else {
        assert_eq!(status_as(&proxy, &url, "bob", "hunter2"), 200);
    }
    let mut t = tunnel(&proxy, echo.addr(), "bob", "hunter2");
    let r = api(admin, "GET", "/api/v1/users/bob", "");
    assert!(
        r.text().contains("\"source\":\"api\"") && r.text().contains("\"connections\":1"),
        "{}",
        r.text()
    );
    assert!(r.text().contains("\"staff\""), "{}", r.text());
    let r = api(admin, "POST", "/api/v1/users/bob/disable", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_ends_within(&mut t, Duration::from_millis(1500), "bob's tunnel once disabled");
    assert_eq!(status_as(&proxy, &url, "bob", "hunter2"), 407);
    let r = api(admin, "GET", "/api/v1/users/bob", "");
    assert!(r.text().contains("\"disabled\":true"), "{}", r.text());
    proxy.log_line(|l| l.contains("connection cut: user disabled"));
    // Enabled again: it goes through.
    assert_eq!(api(admin, "POST", "/api/v1/users/bob/enable", "").status, 200);
    assert_eq!(status_as(&proxy, &url, "bob", "hunter2"), 200);
    let r = api(admin, "PUT", "/api/v1/users/bob/limits", r#"{"rate_down": "8mbit"}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = api(admin, "GET", "/api/v1/users/bob", "");
    assert!(r.text().contains("\"rate_down_bytes\":1000000"), "{}", r.text());
    assert_eq!(
        api(admin, "PUT", "/api/v1/users/bob/limits", r#"{"rate_down": "fast"}"#).status,
        400
    );
}

#[test]
fn removing_a_user_by_the_api_or_by_a_reload_cuts_its_tunnel() {
    let dir = TempDir::new("users-remove");
    let proxy = proxy_with(&dir, "");
    let admin = proxy.admin_addr();
    let echo = TcpEcho::start().unwrap();
    let body = r#"{"name": "bob", "password": "hunter2"}"#;
    assert_eq!(api(admin, "POST", "/api/v1/users", body).status, 201);
    // By the API.
    let mut t = tunnel(&proxy, echo.addr(), "bob", "hunter2");
    assert_eq!(api(admin, "DELETE", "/api/v1/users/bob", "").status, 200);
    assert_ends_within(&mut t, Duration::from_millis(1500), "bob's tunnel once removed");
    assert_eq!(api(admin, "GET", "/api/v1/users/bob", "").status, 404);
    // By a reload whose users file no longer has alice (carol instead).
    let mut t = tunnel(&proxy, echo.addr(), "alice", "secret");
    let users = users_file(&dir, &["carol:plain:pw"]);
    proxy.reload_toml(&config_text(&users, ""));
    assert_ends_within(&mut t, Duration::from_millis(1500), "alice's tunnel once reloaded away");
    proxy.log_line(|l| l.contains("connection cut: user removed"));
}

#[test]
fn removing_and_adding_a_user_back_at_once_still_ends_its_old_tunnel() {
    let dir = TempDir::new("users-readd");
    let proxy = proxy_with(&dir, "");
    let admin = proxy.admin_addr();
    let echo = TcpEcho::start().unwrap();
    let body = r#"{"name": "bob", "password": "hunter2"}"#;
    assert_eq!(api(admin, "POST", "/api/v1/users", body).status, 201);
    let mut old = tunnel(&proxy, echo.addr(), "bob", "hunter2");
    // A password rotation: removed and added again well within a sweep period.
    assert_eq!(api(admin, "DELETE", "/api/v1/users/bob", "").status, 200);
    let body = r#"{"name": "bob", "password": "rotated"}"#;
    assert_eq!(api(admin, "POST", "/api/v1/users", body).status, 201);
    let mut new = tunnel(&proxy, echo.addr(), "bob", "rotated");
    assert_ends_within(&mut old, Duration::from_millis(1500), "the tunnel of the old password");
    new.write_all(b"pong").unwrap();
    let mut buf = [0u8; 4];
    new.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"pong", "the tunnel opened after the re-add goes on");
}

#[test]
fn a_change_that_cannot_be_saved_cuts_nothing() {
    let dir = TempDir::new("users-unsaved");
    // Its directory does not exist: every save fails.
    let state = dir.file("missing/users.json");
    let proxy = proxy_with(&dir, &format!("users_state = {:?}\n", state.to_str().unwrap()));
    let admin = proxy.admin_addr();
    let echo = TcpEcho::start().unwrap();
    let mut t = tunnel(&proxy, echo.addr(), "alice", "secret");
    let r = api(admin, "POST", "/api/v1/users/alice/disable", "");
    assert_eq!(r.status, 500, "{}", r.text());
    std::thread::sleep(Duration::from_millis(1200));
    t.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    t.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping", "alice's tunnel goes on: she is not disabled");
    let origin = Origin::start().unwrap();
    assert_eq!(status_as(&proxy, &origin.url("/bytes/3"), "alice", "secret"), 200);
}

#[test]
fn a_rate_set_one_way_keeps_the_default_of_the_other() {
    let dir = TempDir::new("users-rates");
    let proxy =
        proxy_with(&dir, "[limits]\nuser_rate_up = \"8mbit\"\nuser_rate_down = \"16mbit\"\n");
    let admin = proxy.admin_addr();
    let r = api(admin, "PUT", "/api/v1/users/alice/limits", r#"{"rate_up": "1mbit"}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = api(admin, "GET", "/api/v1/users/alice", "");
    let v: serde_json::Value = serde_json::from_str(&r.text()).expect("JSON");
    assert_eq!(v["limits"]["rate_up_bytes"], 125_000, "{v}");
    assert_eq!(v["limits"]["rate_down_bytes"], 2_000_000, "the default down: {v}");
}

#[test]
fn a_plain_http_download_in_flight_and_a_kept_alive_connection_are_cut() {
    let dir = TempDir::new("users-download");
    let proxy = proxy_with(&dir, "");
    let admin = proxy.admin_addr();
    let origin = Origin::start().unwrap();
    // A kept-alive connection between two requests, and a download in flight.
    let mut idle = Conn::to_proxy(&proxy);
    idle.send(&request("GET", &origin.url("/bytes/3"), &[&proxy_auth("alice", "secret")], b""));
    assert_eq!(idle.read_response().status, 200);
    let mut c = Conn::to_proxy(&proxy);
    c.send(&request(
        "GET",
        &origin.url("/bytes/1073741824"),
        &[&proxy_auth("alice", "secret")],
        b"",
    ));
    let r = c.read_head();
    assert_eq!(r.status, 200);
    c.take(64 * 1024);
    let mut s = c.s;
    assert_eq!(api(admin, "POST", "/api/v1/users/alice/disable", "").status, 200);
    assert_ends_within(&mut s, Duration::from_secs(3), "the download once alice is disabled");
    assert_ends_within(&mut idle.s, Duration::from_millis(1500), "the kept-alive connection");
}

#[test]
fn the_overlay_survives_a_restart() {
    let dir = TempDir::new("users-state");
    let state = dir.file("users.json");
    let extra = format!("users_state = {:?}\n", state.to_str().unwrap());
    let users = users_file(&dir, &["alice:plain:secret"]);
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/3");
    {
        let proxy = Proxy::from_toml(&config_text(&users, &extra));
        let admin = proxy.admin_addr();
        let body = r#"{"name": "bob", "password": "hunter2"}"#;
        assert_eq!(api(admin, "POST", "/api/v1/users", body).status, 201);
        assert_eq!(api(admin, "POST", "/api/v1/users/alice/disable", "").status, 200);
    }
    let text = std::fs::read_to_string(&state).unwrap();
    assert!(text.contains("$argon2id$") && !text.contains("hunter2"), "{text}");
    let proxy = Proxy::from_toml(&config_text(&users, &extra));
    assert_eq!(status_as(&proxy, &url, "bob", "hunter2"), 200);
    assert_eq!(status_as(&proxy, &url, "alice", "secret"), 407);
}

/// Runs `rustle user ARGS` (with `stdin`), returns its exit status and standard output.
fn rustle_user(args: &[&str], env_token: Option<&str>, stdin: &str) -> (bool, String, String) {
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(rustle_bin());
    cmd.arg("user").args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.env_remove("RUSTLE_ADMIN_TOKEN");
    if let Some(t) = env_token {
        cmd.env("RUSTLE_ADMIN_TOKEN", t);
    }
    let mut child = cmd.spawn().expect("run rustle user");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn the_user_command_drives_the_api() {
    let dir = TempDir::new("users-cli");
    let proxy = proxy_with(&dir, "");
    let admin = proxy.admin_addr();
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/3");
    let token_file = dir.file("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let cfg = dir.file("admin.toml");
    std::fs::write(
        &cfg,
        format!(
            "[admin]\nlisten = \"{admin}\"\napi_token_file = {:?}\n",
            token_file.to_str().unwrap()
        ),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let (ok, _, err) = rustle_user(
        &["-c", c, "add", "bob", "--password-stdin", "--group", "staff"],
        None,
        "hunter2\n",
    );
    assert!(ok, "add: {err}");
    assert_eq!(status_as(&proxy, &url, "bob", "hunter2"), 200);
    let (ok, out, err) = rustle_user(&["-c", c, "list"], None, "");
    assert!(ok, "list: {err}");
    assert!(out.starts_with("NAME") && out.contains("alice") && out.contains("staff"), "{out}");
    // The address and the token from the flag and the environment instead.
    let addr = admin.to_string();
    let (ok, out, err) = rustle_user(&["--admin", &addr, "--json", "get", "bob"], Some(TOKEN), "");
    assert!(ok, "get: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["source"], "api", "{out}");
    let (ok, _, err) = rustle_user(&["--admin", &addr, "get", "bob"], Some("wrong"), "");
    assert!(!ok && err.contains("401"), "{err}");
    let (ok, _, err) = rustle_user(&["-c", c, "set", "bob", "--limit", "rate_up=1mbit"], None, "");
    assert!(ok, "set: {err}");
    let (ok, _, err) = rustle_user(&["-c", c, "disable", "bob"], None, "");
    assert!(ok, "disable: {err}");
    assert_eq!(status_as(&proxy, &url, "bob", "hunter2"), 407);
    let (ok, _, err) = rustle_user(&["-c", c, "enable", "bob"], None, "");
    assert!(ok, "enable: {err}");
    assert_eq!(status_as(&proxy, &url, "bob", "hunter2"), 200);
    let (ok, _, err) = rustle_user(&["-c", c, "remove", "bob"], None, "");
    assert!(ok, "remove: {err}");
    let (ok, _, err) = rustle_user(&["-c", c, "get", "bob"], None, "");
    assert!(!ok && err.contains("404"), "{err}");
}

#[test]
fn disabling_a_user_cuts_its_socks5_tunnel() {
    use crate::util::socks::*;
    let dir = TempDir::new("users-socks");
    let users = users_file(&dir, &["alice:plain:secret"]);
    let proxy = Proxy::from_toml(&format!(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nkind = \"socks\"\nauth = true\n\
         [auth]\nusers_file = {:?}\n\
         [admin]\nlisten = \"127.0.0.1:0\"\napi_token = \"{TOKEN}\"\n",
        users.to_str().unwrap()
    ));
    let echo = TcpEcho::start().unwrap();
    let mut s = connect(proxy.addr());
    assert_eq!(greet(&mut s, &[2]), 2, "user/password chosen");
    s.write_all(b"\x01\x05alice\x06secret").unwrap();
    let mut sub = [0u8; 2];
    s.read_exact(&mut sub).unwrap();
    assert_eq!(sub, [1, 0], "authenticated");
    s.write_all(&request5(1, &Dst::Addr(echo.addr()))).unwrap();
    let (rep, _) = read_reply5(&mut s);
    assert_eq!(rep, 0);
    s.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).unwrap();
    let r = api(proxy.admin_addr(), "POST", "/api/v1/users/alice/disable", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_ends_within(&mut s, Duration::from_millis(1500), "alice's SOCKS5 tunnel");
    proxy.log_line(|l| l.contains("connection cut: user disabled"));
}

#[tokio::test]
async fn disabling_a_user_cuts_its_http2_connection() {
    let dir = TempDir::new("users-h2");
    let users = users_file(&dir, &["alice:plain:secret"]);
    let text = config_text(&users, "").replace("auth = true\n", "auth = true\nh2c = true\n");
    let proxy = Proxy::from_toml(&text);
    let origin = Origin::start().unwrap();
    let tcp = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let (mut send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let auth = format!("Basic {}", base64(b"alice:secret"));
    let req = http::Request::builder()
        .method(http::Method::GET)
        .uri(origin.url("/bytes/1073741824"))
        .header("proxy-authorization", &auth)
        .body(())
        .unwrap();
    let (resp, _) = send.send_request(req, true).expect("send");
    let resp = resp.await.expect("response");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = body.data().await.expect("some body").expect("data");
    let _ = body.flow_control().release_capacity(first.len());
    let admin = proxy.admin_addr();
    let r = tokio::task::spawn_blocking(move || {
        api(admin, "POST", "/api/v1/users/alice/disable", "").status
    })
    .await
    .unwrap();
    assert_eq!(r, 200);
    let ended = tokio::time::timeout(Duration::from_millis(1500), async {
        while let Some(Ok(chunk)) = body.data().await {
            let _ = body.flow_control().release_capacity(chunk.len());
        }
    })
    .await;
    assert!(ended.is_ok(), "alice's HTTP/2 stream still open 1.5 s after she was disabled");
}

/// The real binary and a real SIGHUP: a users file rewritten without bob ends bob's
/// tunnel within the sweep, refuses bob's next request (407), keeps alice, and bob's
/// tunnel's access-log line names the cut.
#[test]
fn a_sighup_whose_users_file_drops_a_user_cuts_its_tunnel() {
    let dir = TempDir::new("users-sighup");
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let users = users_file(&dir, &["alice:plain:secret", "bob:plain:hunter2"]);
    let file = dir.file("rustle.toml");
    let text = format!(
        "workers = 1\n[log]\naccess = \"stderr\"\n\
         [[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n\
         [auth]\nusers_file = {:?}\n",
        users.to_str().unwrap()
    );
    std::fs::write(&file, text).unwrap();
    let mut bin = RustleProcess::spawn(&["--config", file.to_str().unwrap()]);
    let addr = bin.next_listener();
    let mut t = tunnel_via(addr, echo.addr(), "bob", "hunter2");
    users_file(&dir, &["alice:plain:secret"]);
    bin.signal("HUP");
    assert!(bin.wait_for_stderr("SIGHUP: reloaded", Duration::from_secs(5)), "{}", bin.stderr());
    assert_ends_within(&mut t, Duration::from_millis(1500), "bob's tunnel once reloaded away");
    let url = origin.url("/bytes/3");
    let status = |user: &str, password: &str| {
        let mut c = Conn::open(addr);
        c.send(&request("GET", &url, &[&proxy_auth(user, password)], b""));
        c.read_response().status
    };
    assert_eq!(status("bob", "hunter2"), 407, "{}", bin.stderr());
    assert_eq!(status("alice", "secret"), 200, "{}", bin.stderr());
    assert!(
        bin.wait_for_stderr("connection cut: user removed", Duration::from_secs(2)),
        "{}",
        bin.stderr()
    );
    let err = bin.stderr();
    let line = err.lines().find(|l| l.contains("connection cut: user removed")).unwrap();
    assert!(line.contains("bob"), "{line}");
}
