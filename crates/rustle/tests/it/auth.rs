//! Proxy authentication as clients see it: HTTP Basic (407 with the realm, 200 with the
//! right credentials, credentials kept from the origin), SOCKS5 username/password, the
//! password formats of a users file (htpasswd bcrypt, `rustle passwd` argon2id, plain)
//! and inline users, malformed credentials, the limit on failed attempts, the access log,
//! `--users` on the real binary and a users file with a bad line.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use rustle_bench::pattern::pattern;
use rustle_bench::{Origin, TcpEcho};

use crate::util::socks::*;
use crate::util::*;

/// curl through `proxy_args` for `url`: (HTTP status, response headers as text).
fn curl_status(proxy_args: &[&str], url: &str) -> Option<(u16, String)> {
    let mut args: Vec<&str> = proxy_args.to_vec();
    args.extend(["-D", "-", "-o", "/dev/null", "-w", "\n%{http_code}", url]);
    let out = curl(&args)?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = text.lines().last().unwrap_or_default().trim().parse().unwrap_or_else(|_| {
        panic!("curl {args:?}: no status; stdout {text:?}; stderr {:?}", out.stderr)
    });
    Some((code, text))
}

#[test]
fn curl_without_credentials_gets_407_with_the_realm() {
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/10");
    let proxy = Proxy::from_toml(&auth_http_config(""));
    let Some((code, head)) = curl_status(&["-x", &proxy.url()], &url) else { return };
    assert_eq!(code, 407, "{head}");
    assert!(head.contains("Proxy-Authenticate: Basic realm=\"rustle\"\r\n"), "{head}");

    let proxy = Proxy::from_toml(&auth_http_config("realm = \"Corp Proxy\""));
    let (code, head) = curl_status(&["-x", &proxy.url()], &url).unwrap();
    assert_eq!(code, 407, "{head}");
    assert!(head.contains("Proxy-Authenticate: Basic realm=\"Corp Proxy\"\r\n"), "{head}");
    // Raw, with CONNECT too.
    let (_, r) = connect_with(proxy.addr(), &origin.addr().to_string(), &[]);
    assert_eq!(r.status, 407, "{}", r.head_text());
    assert_eq!(r.header("proxy-authenticate"), Some("Basic realm=\"Corp Proxy\""));
    assert_eq!(origin.connections(), 0, "an unauthenticated request reached the origin");
}

#[test]
fn curl_with_credentials_gets_through_and_they_never_reach_the_origin() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&auth_http_config(""));
    let url = origin.url("/headers");
    let Some(out) = curl(&["-x", &proxy_url_with(proxy.addr(), "alice", "secret"), &url]) else {
        return;
    };
    assert_success("curl -x http://alice:secret@", &out);
    let seen = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(seen.starts_with("get /headers"), "not the origin's /headers: {seen}");
    assert!(!seen.contains("proxy-authorization"), "credentials reached the origin: {seen}");
    assert!(!seen.contains(&base64(b"alice:secret").to_ascii_lowercase()), "{seen}");

    // --proxy-user, another user, and a raw request: the origin never sees the field.
    let out =
        curl(&["--proxy-user", "bob:hunter2", "-x", &proxy.url(), "-w", "%{http_code}", &url])
            .unwrap();
    assert_success("curl --proxy-user", &out);
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("200"), "{out:?}");
    let mut c = Conn::to_proxy(&proxy);
    c.send(&request("GET", &url, &[&proxy_auth("alice", "secret")], b""));
    let r = c.read_response();
    assert_eq!(r.status, 200, "{}", r.head_text());
    assert!(!r.text().to_ascii_lowercase().contains("proxy-authorization"), "{}", r.text());
    let head = String::from_utf8_lossy(&origin.last_request_head()).to_ascii_lowercase();
    assert!(!head.contains("proxy-authorization"), "{head}");
    proxy.log_line(|l| l.ends_with(" user=bob"));
}

#[test]
fn connect_with_credentials_reaches_an_echo_server() {
    let echo = TcpEcho::start().unwrap();
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&auth_http_config(""));
    let target = echo.addr().to_string();

    let (_, r) = connect_with(proxy.addr(), &target, &[]);
    assert_eq!(r.status, 407, "{}", r.head_text());
    let (_, r) = connect_with(proxy.addr(), &target, &[&proxy_auth("alice", "wrong")]);
    assert_eq!(r.status, 407, "{}", r.head_text());
    assert_eq!(echo.connections(), 0, "a tunnel opened without valid credentials");

    let (mut c, r) = connect_with(proxy.addr(), &target, &[&proxy_auth("alice", "secret")]);
    assert_eq!(r.status, 200, "{}", r.head_text());
    assert_echoes(&mut c.s, b"ping through an authenticated tunnel");
    drop(c);
    let line = proxy.log_line(|l| l.contains(" CONNECT ") && l.contains(" 200 "));
    assert_eq!(LogLine::parse(&line).user, "alice", "{line}");

    // curl -p: a CONNECT tunnel even for http://.
    let dir = TempDir::new("auth-p");
    let file = dir.file("body");
    let proxy_url = proxy_url_with(proxy.addr(), "bob", "hunter2");
    let url = origin.url("/bytes/5000");
    let Some(out) = curl(&["-p", "-x", &proxy_url, "-o", file.to_str().unwrap(), &url]) else {
        return;
    };
    assert_success("curl -p", &out);
    assert_eq!(std::fs::read(&file).unwrap(), pattern(5000));
    proxy.log_line(|l| l.contains(&format!("CONNECT {}", origin.addr())) && l.contains("user=bob"));
}

#[test]
fn wrong_password_and_unknown_user_get_407() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&auth_http_config(""));
    let url = origin.url("/bytes/10");
    for (user, pw) in [("alice", "Secret"), ("alice", "hunter2"), ("mallory", "secret"), ("", "x")]
    {
        let mut c = Conn::to_proxy(&proxy);
        c.send(&request("GET", &url, &[&proxy_auth(user, pw)], b""));
        let r = c.read_response();
        assert_eq!(r.status, 407, "{user}:{pw}: {}", r.head_text());
        assert!(r.has_header("proxy-authenticate"), "{user}:{pw}: {}", r.head_text());
        c.assert_closed();
    }
    if let Some((code, _)) = curl_status(&["-x", &proxy_url_with(proxy.addr(), "bob", "x")], &url) {
        assert_eq!(code, 407);
    }
    assert_eq!(origin.requests(), 0);
    proxy.log_line(|l| l.contains(" 407 ") && l.contains("unknown user or wrong password"));
}

/// An HTTP listener requiring auth against the users file `users`.
fn users_file_proxy(users: &std::path::Path) -> Proxy {
    Proxy::from_toml(&format!(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n[auth]\nusers_file = {:?}\n",
        users.to_str().unwrap()
    ))
}

/// Asserts that `user:password` gets a 200 through `proxy` and a wrong password a 407.
fn assert_login(proxy: &Proxy, origin: &Origin, user: &str, password: &str) {
    let url = origin.url("/bytes/3");
    let mut c = Conn::to_proxy(proxy);
    c.send(&request("GET", &url, &[&proxy_auth(user, password)], b""));
    let r = c.read_response();
    assert_eq!(r.status, 200, "{user}: {}{}", r.head_text(), r.text());
    let mut c = Conn::to_proxy(proxy);
    c.send(&request("GET", &url, &[&proxy_auth(user, &format!("{password}x"))], b""));
    let r = c.read_response();
    assert_eq!(r.status, 407, "{user} with a wrong password: {}", r.head_text());
}

#[test]
fn bcrypt_line_from_htpasswd_is_accepted() {
    if !have("htpasswd") {
        return;
    }
    let out = clean_command("htpasswd").args(["-nbB", "alice", "open sesame"]).output().unwrap();
    assert_success("htpasswd -nbB", &out);
    let line = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(line.starts_with("alice:$2y$"), "{line}");
    let dir = TempDir::new("bcrypt");
    let proxy = users_file_proxy(&users_file(&dir, &["# from htpasswd", &line]));
    let origin = Origin::start().unwrap();
    assert_login(&proxy, &origin, "alice", "open sesame");
    // curl too, with a space in the password.
    let args = ["--proxy-user", "alice:open sesame", "-x", &proxy.url()];
    let (code, _) = curl_status(&args, &origin.url("/bytes/1")).unwrap();
    assert_eq!(code, 200);
}

#[test]
fn argon2id_line_from_rustle_passwd_is_accepted() {
    let mut child = Command::new(rustle_bin())
        .args(["passwd", "alice"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rustle passwd");
    child.stdin.take().unwrap().write_all(b"correct horse\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_success("rustle passwd alice", &out);
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text.trim();
    assert_eq!(text.lines().count(), 1, "one line: {text:?}");
    assert!(line.starts_with("alice:$argon2id$"), "{line}");
    assert!(!text.contains("correct horse"), "the password was printed: {text}");
    let dir = TempDir::new("argon");
    let proxy = users_file_proxy(&users_file(&dir, &[line]));
    let origin = Origin::start().unwrap();
    assert_login(&proxy, &origin, "alice", "correct horse");
}

#[test]
fn plain_file_lines_and_inline_users_are_accepted() {
    let dir = TempDir::new("plain");
    let users = users_file(&dir, &["", "# comment", "  bob:plain:hunter2:staff  "]);
    let carol = rustle::policy::auth::hash_line("carol", b"carol's pass").unwrap();
    let carol_hash = carol.strip_prefix("carol:").unwrap();
    let proxy = Proxy::from_toml(&format!(
        r#"
[[listener]]
listen = "127.0.0.1:0"
auth = true
[auth]
users_file = {users:?}
[[auth.user]]
name = "carol"
password = "{carol_hash}"
[[auth.user]]
name = "dave"
password = "plain:pass:with:colons"
groups = ["staff"]
"#,
    ));
    let origin = Origin::start().unwrap();
    assert_login(&proxy, &origin, "bob", "hunter2");
    assert_login(&proxy, &origin, "carol", "carol's pass");
    assert_login(&proxy, &origin, "dave", "pass:with:colons");
}

/// A SOCKS listener requiring authentication, with alice/secret.
fn socks_auth_proxy(auth_keys: &str) -> Proxy {
    Proxy::from_toml(&format!(
        r#"
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
auth = true
[auth]
{auth_keys}
[[auth.user]]
name = "alice"
password = "plain:secret"
"#
    ))
}

#[test]
fn socks5_with_username_and_password() {
    let origin = Origin::start().unwrap();
    let proxy = socks_auth_proxy("");
    let url = origin.url("/bytes/100");
    let good = format!("socks5h://alice:secret@{}", proxy.addr());
    let Some(out) = curl(&["-x", &good, "-w", "%{http_code}", "-o", "/dev/null", &url]) else {
        return;
    };
    assert_success("curl -x socks5h://alice:secret@", &out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    proxy.log_line(|l| l.contains(" CONNECT socks5://") && l.ends_with(" user=alice"));

    let bad = format!("socks5h://alice:wrong@{}", proxy.addr());
    let out = curl(&["-x", &bad, "-o", "/dev/null", &url]).unwrap();
    assert!(!out.status.success(), "curl succeeded with a wrong password: {out:?}");
    let line = proxy.log_line(|l| l.contains("wrong password"));
    assert!(line.contains("proxy authentication required"), "{line}");
    assert_eq!(origin.requests(), 1, "the wrong password reached the origin");

    // Raw: the failure status of RFC 1929, then the close.
    let mut s = connect(proxy.addr());
    assert_eq!(login5(&mut s, "alice", "wrong"), 1);
    assert!(closed_within(&mut s, Duration::from_secs(3)), "not closed after a failed login");
    let mut s = connect5_as(proxy.addr(), "alice", "secret", &Dst::Addr(origin.addr()));
    let (n, _) = timed_download(&mut s, origin.addr(), 1000);
    assert_eq!(n, 1000);
}

#[test]
fn socks5_client_offering_only_no_auth_gets_ff() {
    let proxy = socks_auth_proxy("");
    let mut s = connect(proxy.addr());
    assert_eq!(greet(&mut s, &[0]), 0xFF, "a no-auth client was accepted");
    assert!(closed_within(&mut s, Duration::from_secs(3)), "not closed after 0xFF");
    // GSSAPI and no-auth: still nothing acceptable.
    let mut s = connect(proxy.addr());
    assert_eq!(greet(&mut s, &[0, 1]), 0xFF);
    let line = proxy.log_line(|l| l.contains("no acceptable authentication method"));
    assert!(!line.contains("user="), "{line}");
}

#[test]
fn malformed_proxy_authorization_gets_407_and_the_proxy_keeps_serving() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&auth_http_config(""));
    let url = origin.url("/bytes/7");
    let huge = format!("Proxy-Authorization: Basic {}", "QUFB".repeat(2560));
    let cases = [
        "Proxy-Authorization: Basic !!not*base64!!".to_string(),
        format!("Proxy-Authorization: Basic {}", base64(b"alicesecret")),
        format!("Proxy-Authorization: Basic {}", base64(b":secret")),
        format!("Proxy-Authorization: Basic {}", base64(b"al\x01ice:secret")),
        format!("Proxy-Authorization: Basic {}", base64(b"\xff\xfe:secret")),
        huge,
        format!("Proxy-Authorization: Bearer {}", base64(b"alice:secret")),
        "Proxy-Authorization: Digest username=\"alice\", response=\"x\"".to_string(),
        "Proxy-Authorization: Basic".to_string(),
        "Proxy-Authorization: Basic   ".to_string(),
        "Proxy-Authorization:".to_string(),
    ];
    for h in &cases {
        let r = parse_response(&raw(&proxy, &request("GET", &url, &[h], b"")));
        let shown = &h[..h.len().min(60)];
        assert_eq!(r.status, 407, "{shown}: {}", r.head_text());
        assert!(r.has_header("proxy-authenticate"), "{shown}: {}", r.head_text());
        // Over CONNECT as well.
        let (_, r) = connect_with(proxy.addr(), &origin.addr().to_string(), &[h]);
        assert_eq!(r.status, 407, "CONNECT with {shown}: {}", r.head_text());
    }
    assert_eq!(origin.requests(), 0);
    assert!(!proxy.log_text().contains(" 500 "), "{}", proxy.log_text());
    let mut c = Conn::to_proxy(&proxy);
    c.send(&request("GET", &url, &[&proxy_auth("alice", "secret")], b""));
    assert_eq!(c.read_response().body, pattern(7));
}

#[test]
fn malformed_rfc1929_subnegotiation_is_refused() {
    let origin = Origin::start().unwrap();
    let proxy = socks_auth_proxy("");
    let cases: [(&str, Vec<u8>); 3] = [
        ("version 2", {
            let mut c = credentials(b"alice", b"secret");
            c[0] = 2;
            c
        }),
        ("ulen 0", credentials(b"", b"secret")),
        ("plen 0", credentials(b"alice", b"")),
    ];
    for (what, bytes) in cases {
        let mut s = connect(proxy.addr());
        assert_eq!(greet(&mut s, &[2]), 2);
        s.write_all(&bytes).unwrap();
        // Also a request, as a client that does not wait would send.
        let _ = s.write_all(&request5(CONNECT, &Dst::Addr(origin.addr())));
        let (got, closed) = read_until_close(&mut s);
        assert!(closed, "{what}: connection left open");
        assert!(
            got.is_empty() || (got.len() == 2 && got[0] == 1 && got[1] != 0),
            "{what}: expected a failure status or nothing, got {got:?}"
        );
    }
    assert_eq!(origin.connections(), 0);
    let mut s = connect5_as(proxy.addr(), "alice", "secret", &Dst::Addr(origin.addr()));
    assert_eq!(timed_download(&mut s, origin.addr(), 10).0, 10);
}

#[test]
fn failed_attempts_are_rate_limited_per_client_address() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(
        r#"
[[listener]]
listen = "127.0.0.1:0"
auth = true
[auth]
failures_burst = 3
failures_per_minute = 1
[[auth.user]]
name = "alice"
password = "plain:secret"
"#,
    );
    let url = origin.url("/bytes/1");
    let attempt = |from: &str, pw: &str| {
        let mut c = Conn::open_from(from, proxy.addr());
        c.send(&request("GET", &url, &[&proxy_auth("alice", pw)], b""));
        c.read_response()
    };
    for i in 0..3 {
        let r = attempt("127.0.0.1", "guess");
        assert_eq!(r.status, 407, "attempt {}: {}", i + 1, r.head_text());
    }
    let r = attempt("127.0.0.1", "secret");
    assert_eq!(r.status, 429, "4th attempt, right password: {}", r.head_text());
    assert!(r.text().contains("too many failed"), "{}", r.text());
    let r = attempt("127.0.0.1", "guess");
    assert_eq!(r.status, 429, "{}", r.head_text());
    // Another client address is not affected.
    let r = attempt("127.0.0.2", "secret");
    assert_eq!(r.status, 200, "another address was locked out too: {}", r.head_text());
    let r = attempt("127.0.0.2", "guess");
    assert_eq!(r.status, 407, "{}", r.head_text());
    assert_eq!(origin.requests(), 1);
}

#[test]
fn access_log_names_the_user_and_never_the_password() {
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let proxy = Proxy::from_toml(
        r#"
[[listener]]
listen = "127.0.0.1:0"
auth = true
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
auth = true
[auth]
[[auth.user]]
name = "alice"
password = "plain:Zebra-Quartz-42"
"#,
    );
    let mut c = Conn::to_proxy(&proxy);
    let url = origin.url("/bytes/12");
    c.send(&request("GET", &url, &[&proxy_auth("alice", "Zebra-Quartz-42")], b""));
    assert_eq!(c.read_response().status, 200);
    let r = parse_response(&raw(
        &proxy,
        &request("GET", &url, &[&proxy_auth("alice", "Wrong-Horse-17")], b""),
    ));
    assert_eq!(r.status, 407);
    let (mut t, r) = connect_with(
        proxy.addr(),
        &echo.addr().to_string(),
        &[&proxy_auth("alice", "Zebra-Quartz-42")],
    );
    assert_eq!(r.status, 200);
    assert_echoes(&mut t.s, b"x");
    drop(t);
    let mut s = connect5_as(proxy.addr_of(1), "alice", "Zebra-Quartz-42", &Dst::Addr(echo.addr()));
    assert_echoes(&mut s, b"y");
    drop(s);
    let mut s = connect(proxy.addr_of(1));
    assert_eq!(login5(&mut s, "alice", "Wrong-Horse-17"), 1);
    drop(s);

    let line = proxy.log_line(|l| l.contains(&url) && l.contains(" 200 "));
    assert!(line.ends_with(" user=alice"), "{line}");
    assert_eq!(LogLine::parse(&line).user, "alice");
    let line = proxy.log_line(|l| l.contains(" CONNECT ") && l.contains(&echo.addr().to_string()));
    assert!(line.ends_with(" user=alice"), "{line}");
    let line = proxy.log_line(|l| l.contains("socks5://"));
    assert!(line.ends_with(" user=alice"), "{line}");
    // Two failures logged; then no trace of either password, plain or encoded.
    wait_until(Duration::from_secs(5), || proxy.log_text().matches("wrong password").count() >= 2);
    let log = proxy.log_text();
    assert_eq!(log.matches("wrong password").count(), 2, "{log}");
    for secret in ["Zebra", "Quartz", "Wrong-Horse", "Horse-17"] {
        assert!(!log.contains(secret), "`{secret}` is in the log:\n{log}");
    }
    for pw in ["Zebra-Quartz-42", "Wrong-Horse-17"] {
        let encoded = base64(format!("alice:{pw}").as_bytes());
        assert!(!log.contains(&encoded[..12]), "credentials in the log:\n{log}");
    }
}

#[test]
fn users_flag_makes_command_line_listeners_require_auth() {
    let dir = TempDir::new("users-flag");
    let users = users_file(&dir, &["alice:plain:secret"]);
    let origin = Origin::start().unwrap();
    let args = ["--http", "127.0.0.1:0", "--workers", "1", "--users", users.to_str().unwrap()];
    let (bin, addr) = RustleProcess::start(&args);
    let url = origin.url("/bytes/4");
    let r = parse_response(&raw_to(addr, &get(&url)));
    assert_eq!(r.status, 407, "{}", r.head_text());
    assert_eq!(r.header("proxy-authenticate"), Some("Basic realm=\"rustle\""));
    let mut c = Conn::open(addr);
    c.send(&request("GET", &url, &[&proxy_auth("alice", "secret")], b""));
    let r = c.read_response();
    assert_eq!(r.status, 200, "{}; stderr:\n{}", r.head_text(), bin.stderr());
    assert_eq!(r.body, pattern(4));
    assert_eq!(origin.requests(), 1);
}

/// Sends SIGHUP and waits for the `n`th reload message.
#[track_caller]
fn sighup(bin: &RustleProcess, n: usize) {
    bin.signal("HUP");
    assert!(
        bin.wait_for_stderr_n("SIGHUP: reloaded", n, Duration::from_secs(5)),
        "no reload message:\n{}",
        bin.stderr()
    );
}

/// HTTP status of a GET of `url` through `addr` as `user`.
fn status_as(addr: std::net::SocketAddr, url: &str, user: &str, password: &str) -> u16 {
    let mut c = Conn::open(addr);
    c.send(&request("GET", url, &[&proxy_auth(user, password)], b""));
    c.read_response().status
}

#[test]
fn sighup_reloads_the_users_file_of_the_command_line() {
    let dir = TempDir::new("users-flag-reload");
    let users = users_file(&dir, &["alice:plain:secret"]);
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/4");
    let args = ["--http", "127.0.0.1:0", "--workers", "1", "--users", users.to_str().unwrap()];
    let (bin, addr) = RustleProcess::start(&args);
    assert_eq!(status_as(addr, &url, "alice", "secret"), 200, "{}", bin.stderr());
    // alice's password is revoked, bob is added.
    std::fs::write(&users, "bob:plain:hunter2\n").unwrap();
    sighup(&bin, 1);
    assert_eq!(status_as(addr, &url, "alice", "secret"), 407, "a revoked password still works");
    assert_eq!(status_as(addr, &url, "bob", "hunter2"), 200, "{}", bin.stderr());
    // The listener still requires authentication.
    let mut c = Conn::open(addr);
    c.send(&get(&url));
    assert_eq!(c.read_response().status, 407);
}

#[test]
fn sighup_keeps_the_command_line_users_file_with_a_config_file() {
    let dir = TempDir::new("users-flag-config");
    let users = users_file(&dir, &["alice:plain:secret"]);
    let cfg = dir.file("rustle.toml");
    let text = "workers = 1\n[log]\naccess = \"off\"\n\
                [[auth.user]]\nname = \"carol\"\npassword = \"plain:s3cret\"\n";
    std::fs::write(&cfg, text).unwrap();
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/4");
    let args = [
        "--config",
        cfg.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
        "--users",
        users.to_str().unwrap(),
    ];
    let (bin, addr) = RustleProcess::start(&args);
    assert_eq!(status_as(addr, &url, "alice", "secret"), 200, "{}", bin.stderr());
    assert_eq!(status_as(addr, &url, "carol", "s3cret"), 200);
    sighup(&bin, 1);
    assert_eq!(status_as(addr, &url, "alice", "secret"), 200, "the users file was dropped");
    assert_eq!(status_as(addr, &url, "carol", "s3cret"), 200);
    // Both are read again: a change in either takes effect.
    std::fs::write(&users, "dave:plain:pw\n").unwrap();
    sighup(&bin, 2);
    assert_eq!(status_as(addr, &url, "alice", "secret"), 407);
    assert_eq!(status_as(addr, &url, "dave", "pw"), 200, "{}", bin.stderr());
}

#[test]
fn users_file_with_a_bad_line_is_reported_by_check_and_refused_at_start() {
    let dir = TempDir::new("bad-users");
    let users = users_file(
        &dir,
        &["# users", "alice:plain:secret", "bob:$apr1$Q9xX$QpS1bY7eXhb1lRLnEqzYI/", "carol"],
    );
    let cfg = dir.file("rustle.toml");
    std::fs::write(
        &cfg,
        format!(
            "workers = 1\n[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n\
             [auth]\nusers_file = {:?}\n",
            users.to_str().unwrap()
        ),
    )
    .unwrap();
    let users_shown = users.display().to_string();
    let expect = |what: &str, text: &str| {
        let has = |line: &str, problem: &str| {
            text.lines()
                .any(|l| l.contains(&users_shown) && l.contains(line) && l.contains(problem))
        };
        assert!(has("line 3", "MD5"), "{what}: line 3 not reported:\n{text}");
        assert!(has("line 4", "name:hash"), "{what}: line 4 not reported:\n{text}");
        assert!(!text.contains("QpS1bY7eXhb1"), "{what}: the hash was echoed:\n{text}");
        assert!(!text.contains("line 2"), "{what}: a good line was reported:\n{text}");
    };

    let out = Command::new(rustle_bin())
        .args(["check", "--config", cfg.to_str().unwrap()])
        .output()
        .expect("run rustle check");
    assert!(!out.status.success(), "rustle check passed a bad users file: {out:?}");
    expect("rustle check", &String::from_utf8_lossy(&out.stderr));

    let mut bin = RustleProcess::spawn(&["--config", cfg.to_str().unwrap()]);
    let status = bin.wait(Duration::from_secs(10)).expect("rustle started with a bad users file");
    assert!(!status.success(), "exit status {status}");
    let err = bin.stderr();
    assert!(!err.contains("listening on"), "{err}");
    expect("rustle --config", &err);
}

#[test]
fn per_user_traffic_is_counted_across_requests_and_tunnels() {
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let proxy = Proxy::from_toml(&auth_http_config(""));
    let mut c = Conn::to_proxy(&proxy);
    for _ in 0..3 {
        let url = origin.url("/bytes/5000");
        c.send(&request("GET", &url, &[&proxy_auth("alice", "secret")], b""));
        assert_eq!(c.read_response().status, 200);
    }
    let mut t = Conn::to_proxy(&proxy);
    let auth = proxy_auth("alice", "secret");
    t.send(format!("CONNECT {} HTTP/1.1\r\nHost: x\r\n{auth}\r\n\r\n", echo.addr()).as_bytes());
    assert_eq!(t.read_head().status, 200);
    t.send(&[7u8; 1000]);
    assert_eq!(t.take(1000), vec![7u8; 1000]);
    drop(t);
    drop(c);
    let counted = || {
        let traffic = proxy.traffic();
        let alice = traffic.iter().find(|(u, _, _)| u == "alice").cloned();
        alice.is_some_and(|(_, up, down)| up >= 1000 && down >= 3 * 5000 + 1000)
    };
    assert!(wait_until(Duration::from_secs(5), counted), "counters: {:?}", proxy.traffic());
}

#[test]
fn removing_the_last_member_of_a_ruled_group_reloads_with_a_warning() {
    let dir = TempDir::new("group-emptied");
    let users = users_file(&dir, &["alice:plain:secret:staff", "bob:plain:hunter2"]);
    let cfg = dir.file("rustle.toml");
    let text = "workers = 1\n[log]\naccess = \"off\"\n\
                [[rule]]\naction = \"deny\"\ngroups = [\"staff\"]\nports = [\"1\"]\n";
    std::fs::write(&cfg, text).unwrap();
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/4");
    let users_arg = users.to_str().unwrap();
    let args = ["--config", cfg.to_str().unwrap(), "--http", "127.0.0.1:0", "--users", users_arg];
    let (bin, addr) = RustleProcess::start(&args);
    assert_eq!(status_as(addr, &url, "alice", "secret"), 200, "{}", bin.stderr());
    // alice, the group's only member, is revoked: the rule now names an empty group, which
    // must not keep her password valid by refusing the reload.
    std::fs::write(&users, "bob:plain:hunter2\n").unwrap();
    sighup(&bin, 1);
    assert_eq!(status_as(addr, &url, "alice", "secret"), 407, "a revoked password still works");
    assert_eq!(status_as(addr, &url, "bob", "hunter2"), 200);
    assert!(bin.stderr().contains("`staff` is not defined"), "no warning:\n{}", bin.stderr());
}

#[test]
fn a_reload_that_empties_the_users_file_refuses_everyone() {
    let dir = TempDir::new("users-emptied");
    let users = users_file(&dir, &["alice:plain:secret"]);
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/4");
    let args = ["--http", "127.0.0.1:0", "--workers", "1", "--users", users.to_str().unwrap()];
    let (bin, addr) = RustleProcess::start(&args);
    assert_eq!(status_as(addr, &url, "alice", "secret"), 200, "{}", bin.stderr());
    // Every user revoked: the reload goes through (refusing it would keep alice's password
    // valid) with a warning, and the listener refuses everyone.
    std::fs::write(&users, "# nobody for now\n").unwrap();
    sighup(&bin, 1);
    assert_eq!(status_as(addr, &url, "alice", "secret"), 407, "a revoked password still works");
    assert!(bin.stderr().contains("every client of it is refused"), "{}", bin.stderr());
    // Starting that way is still refused: a proxy that can serve nobody is a mistake.
    let mut p = RustleProcess::spawn(&args);
    let status = p.wait(Duration::from_secs(10)).expect("rustle started without users");
    assert!(!status.success() && p.stderr().contains("defines no user"), "{}", p.stderr());
}

/// The real binary with an argon2id user of the default cost (19 MiB, what `rustle passwd`
/// writes) behind an HTTP listener (h2c too), a SOCKS listener and the admin endpoint:
/// for floods of logins, whose memory is that of the process.
struct LoginTarget {
    bin: RustleProcess,
    at: Ends,
    _dir: TempDir,
}

/// Where `LoginTarget` listens.
#[derive(Debug, Clone, Copy)]
struct Ends {
    http: std::net::SocketAddr,
    socks: std::net::SocketAddr,
    admin: std::net::SocketAddr,
    /// Where requests go once authenticated: nothing listens there (502).
    closed: std::net::SocketAddr,
}

/// alice's password in `LoginTarget`.
const ALICE_PASSWORD: &str = "correct horse battery staple";

impl LoginTarget {
    fn start(auth_keys: &str) -> LoginTarget {
        LoginTarget::with_workers(2, auth_keys)
    }

    /// With `workers` workers: the failed-attempt budget is per worker, so a test of one
    /// address's budget runs one.
    fn with_workers(workers: usize, auth_keys: &str) -> LoginTarget {
        let dir = TempDir::new("login-flood");
        let line = rustle::policy::auth::hash_line("alice", ALICE_PASSWORD.as_bytes()).unwrap();
        assert!(line.contains("$argon2id$v=19$m=19456,"), "{line}");
        let users = users_file(&dir, &[&line]);
        let config = dir.file("rustle.toml");
        let text = format!(
            "workers = {workers}\n\
             [[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\nh2c = true\n\
             [[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:0\"\nauth = true\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n\
             [auth]\nusers_file = \"{}\"\n{auth_keys}\n",
            users.display()
        );
        std::fs::write(&config, text).unwrap();
        let mut bin = RustleProcess::spawn(&["--config", config.to_str().unwrap()]);
        let http = bin.next_listener();
        let socks = bin.next_listener();
        let marker = "admin endpoint on http://";
        assert!(bin.wait_for_stderr(marker, Duration::from_secs(10)), "{}", bin.stderr());
        let stderr = bin.stderr();
        let rest = &stderr[stderr.find(marker).unwrap() + marker.len()..];
        let admin = rest.split('/').next().unwrap().parse().expect("admin address");
        LoginTarget { bin, at: Ends { http, socks, admin, closed: closed_port() }, _dir: dir }
    }

    /// A line of `/proc/PID/status`, in KiB (`VmRSS`, `VmHWM`).
    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.bin.child.id()))
            .expect("the proxy's /proc status");
        let line = status.lines().find(|l| l.starts_with(field)).expect(field);
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    fn metric(&self, name: &str) -> u64 {
        self.at.metric(name)
    }
}

impl Ends {
    /// A counter without labels from `/metrics`.
    fn metric(&self, name: &str) -> u64 {
        let r = parse_response(&raw_to(
            self.admin,
            b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n",
        ));
        assert_eq!(r.status, 200, "{}", r.head_text());
        let text = r.text();
        let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| {
            panic!("no {name} in /metrics:\n{text}");
        });
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// A request as alice with `password` from the local address `from`: its status, 0
    /// when no answer came within 30 s (a flood's hashes may take that long).
    fn http_login(&self, from: &str, password: &str) -> u16 {
        use std::io::Read;
        let mut s = connect_from(from, self.http);
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let url = format!("http://{}/", self.closed);
        s.write_all(&request("GET", &url, &[&proxy_auth("alice", password)], b"")).unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && matches!(s.read(&mut byte), Ok(1)) {
            head.push(byte[0]);
        }
        match head.ends_with(b"\r\n\r\n") {
            true => parse_head(&head).status,
            false => 0,
        }
    }
}

/// What a flood of logins did: statuses (or SOCKS replies) counted, hashes computed, the
/// proxy's resident memory before and at its peak (KiB).
#[derive(Debug)]
struct Flood {
    answers: std::collections::BTreeMap<u16, usize>,
    hashes: u64,
    rss_before: u64,
    peak: u64,
}

impl Flood {
    fn of(target: &LoginTarget, answers: Vec<u16>, rss_before: u64) -> Flood {
        let mut counted = std::collections::BTreeMap::new();
        for a in answers {
            *counted.entry(a).or_default() += 1;
        }
        Flood {
            answers: counted,
            hashes: target.metric("rustle_auth_hashes_total"),
            rss_before,
            peak: target.status_kib("VmHWM:"),
        }
    }

    fn count(&self, answer: u16) -> usize {
        self.answers.get(&answer).copied().unwrap_or(0)
    }
}

/// `n` threads that each open a connection, wait for the others, then run `attempt` with
/// their index: every attempt is in flight at once.
fn all_at_once(n: usize, attempt: impl Fn(usize) -> u16 + Sync) -> Vec<u16> {
    let barrier = std::sync::Barrier::new(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (barrier, attempt) = (&barrier, &attempt);
                s.spawn(move || {
                    barrier.wait();
                    attempt(i)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The most a flood may add to the proxy's peak memory: two hashing threads at 19 MiB
/// each, with room for the connections and the allocator's slack.
const FLOOD_PEAK_KIB: u64 = (2 * 19 + 26) * 1024;

/// The most the hashes of a flood from one address may number with two workers: their
/// failure budgets (10 each by default).
const FLOOD_HASHES: u64 = 2 * 10;

#[test]
fn two_hundred_concurrent_wrong_passwords_are_counted_before_they_are_hashed() {
    let target = LoginTarget::start("");
    let before = target.status_kib("VmRSS:");
    // Each a different guess (the same one would share a check).
    let answers = all_at_once(200, |i| target.at.http_login("127.0.0.1", &format!("guess {i}")));
    let flood = Flood::of(&target, answers, before);
    eprintln!(
        "200 concurrent wrong argon2id logins over HTTP/1.1: {:?}, {} hashes, VmRSS {} KiB \
         before, VmHWM {} KiB",
        flood.answers, flood.hashes, flood.rss_before, flood.peak
    );
    assert_eq!(flood.count(407) + flood.count(429), 200, "{flood:?}");
    assert!(flood.count(429) >= 150, "most must be refused unhashed: {flood:?}");
    assert!(flood.hashes <= FLOOD_HASHES, "{flood:?}");
    assert!(flood.peak < flood.rss_before + FLOOD_PEAK_KIB, "{flood:?}");
    // The address is locked out; another one still logs in.
    assert_eq!(target.at.http_login("127.0.0.1", ALICE_PASSWORD), 429);
    assert_eq!(target.at.http_login("127.0.0.2", ALICE_PASSWORD), 502);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_h2_streams_of_wrong_passwords_are_counted_before_they_are_hashed() {
    let target = LoginTarget::start("");
    let before = target.status_kib("VmRSS:");
    let tcp = tokio::net::TcpStream::connect(target.at.http).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut send = send.ready().await.expect("ready");
    let mut streams = Vec::new();
    for i in 0..100 {
        let guess = base64(format!("alice:guess {i}").as_bytes());
        let req = http::Request::builder()
            .uri(format!("http://{}/", target.at.closed))
            .header("proxy-authorization", format!("Basic {guess}"))
            .body(())
            .unwrap();
        send = send.ready().await.expect("ready");
        let (resp, _) = send.send_request(req, true).expect("send a request");
        streams.push(resp);
    }
    let mut answers = Vec::new();
    for resp in streams {
        let resp = tokio::time::timeout(READ_TIMEOUT, resp).await.expect("an answer in time");
        answers.push(resp.expect("a response").status().as_u16());
    }
    let flood = Flood::of(&target, answers, before);
    eprintln!(
        "100 h2 streams of wrong argon2id logins on one connection: {:?}, {} hashes, VmRSS \
         {} KiB before, VmHWM {} KiB",
        flood.answers, flood.hashes, flood.rss_before, flood.peak
    );
    assert_eq!(flood.count(407) + flood.count(429), 100, "{flood:?}");
    // One connection is one worker's: its budget of 10.
    assert!(flood.count(429) >= 85, "{flood:?}");
    assert!(flood.hashes <= 10, "{flood:?}");
    assert!(flood.peak < flood.rss_before + FLOOD_PEAK_KIB, "{flood:?}");
}

#[test]
fn a_socks5_flood_of_wrong_passwords_is_counted_before_it_is_hashed() {
    let target = LoginTarget::start("");
    let before = target.status_kib("VmRSS:");
    let answers = all_at_once(200, |i| {
        let mut s = connect_from("127.0.0.1", target.at.socks);
        u16::from(login5(&mut s, "alice", &format!("guess {i}")))
    });
    let flood = Flood::of(&target, answers, before);
    eprintln!(
        "200 concurrent wrong argon2id SOCKS5 logins: {:?}, {} hashes, VmRSS {} KiB before, \
         VmHWM {} KiB",
        flood.answers, flood.hashes, flood.rss_before, flood.peak
    );
    assert_eq!(flood.count(0), 0, "{flood:?}");
    assert!(flood.hashes <= FLOOD_HASHES, "{flood:?}");
    assert!(flood.peak < flood.rss_before + FLOOD_PEAK_KIB, "{flood:?}");
    assert!(!target.bin.stderr().contains("guess "), "a password in the log");
}

#[test]
fn a_login_from_another_address_is_served_during_a_flood() {
    // No failure budget to speak of: only the hashing queue's fairness protects others.
    let target = LoginTarget::start("failures_burst = 1000000\nfailures_per_minute = 1000000");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let tried = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..50 {
            let (stop, tried, at) = (&stop, &tried, target.at);
            s.spawn(move || {
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    at.http_login("127.0.0.1", &format!("guess {t} {i}"));
                    tried.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
        // The flood is on: the hashing threads have been busy with its checks a while.
        let busy =
            wait_until(Duration::from_secs(20), || target.metric("rustle_auth_hashes_total") >= 6);
        let hashes = target.metric("rustle_auth_hashes_total");
        let start = std::time::Instant::now();
        let status = target.at.http_login("127.0.0.2", ALICE_PASSWORD);
        let took = start.elapsed();
        let flooded = tried.load(std::sync::atomic::Ordering::Relaxed);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        eprintln!(
            "a right login from 127.0.0.2 during a flood ({flooded} attempts, {hashes} hashes \
             before it) took {took:?}"
        );
        assert!(busy && hashes >= 4, "no flood to speak of: {flooded} attempts, {hashes} hashes");
        // 502: past authentication, to a closed port.
        assert_eq!(status, 502);
        assert!(took < Duration::from_secs(2), "the right login waited {took:?}");
    });
}

#[test]
fn sequential_wrong_argon2_passwords_do_not_grow_memory() {
    let target = LoginTarget::start("hash_threads = 1");
    let mut rss = Vec::new();
    for i in 0..4 {
        assert_eq!(target.at.http_login("127.0.0.1", &format!("guess {i}")), 407);
        rss.push(target.status_kib("VmRSS:"));
    }
    eprintln!("VmRSS after each of 4 wrong argon2id logins: {rss:?} KiB");
    for (i, kib) in rss.iter().enumerate().skip(1) {
        assert!(*kib < rss[0] + 4 * 1024, "attempt {}: {rss:?} KiB", i + 1);
    }
}

#[test]
fn a_full_hashing_queue_answers_503_and_counts_only_an_address_that_failed_before() {
    let target = LoginTarget::with_workers(
        1,
        "hash_threads = 1\nmax_pending_hashes = 1\nfailures_burst = 1",
    );
    let from = |i: usize| format!("127.0.0.{}", 10 + i);
    // One wrong guess from each of 30 addresses at once: one hashing, one waiting, the
    // rest refused at once.
    let answers = all_at_once(30, |i| target.at.http_login(&from(i), &format!("guess {i}")));
    let flood = Flood::of(&target, answers.clone(), 0);
    eprintln!("30 addresses at once, a queue of 1: {:?}, {} hashes", flood.answers, flood.hashes);
    assert_eq!(flood.count(407) + flood.count(503), 30, "{flood:?}");
    assert!(flood.count(503) >= 20, "{flood:?}");
    assert_eq!(flood.hashes, flood.count(407) as u64, "{flood:?}");
    assert!(target.metric("rustle_auth_hashes_refused_total") >= 20);
    // With a budget of one failure each: an address refused with no failure behind it
    // still logs in; one whose guess was checked and wrong has used its budget.
    let refused = answers.iter().position(|&a| a == 503).unwrap();
    assert_eq!(target.at.http_login(&from(refused), ALICE_PASSWORD), 502);
    let checked = answers.iter().position(|&a| a == 407).unwrap();
    assert_eq!(target.at.http_login(&from(checked), ALICE_PASSWORD), 429);
}

/// Many addresses, each within its share, keeping the queue full with wrong guesses in a
/// loop: a refusal at the full queue counts once an address has failed, so each runs out
/// after about one hash, not after its whole burst of hashes (3 each here: 120 for the
/// flood), and a user from another address logs in meanwhile.
#[test]
fn addresses_keeping_the_hashing_queue_full_run_out_of_attempts() {
    let target = LoginTarget::with_workers(
        1,
        "hash_threads = 1\nmax_pending_hashes = 4\nfailures_burst = 3\nfailures_per_minute = 1",
    );
    let from = |i: usize| format!("127.0.1.{}", 10 + i);
    let (flood, user) = std::thread::scope(|s| {
        let flooders: Vec<_> = (0..40)
            .map(|i| {
                let (at, from) = (&target.at, &from);
                s.spawn(move || {
                    // Until three 429s in a row (out of attempts), 20 s at most.
                    let deadline = std::time::Instant::now() + Duration::from_secs(20);
                    let mut answers: Vec<u16> = Vec::new();
                    while !answers.ends_with(&[429, 429, 429])
                        && std::time::Instant::now() < deadline
                    {
                        answers.push(at.http_login(&from(i), "guess"));
                    }
                    answers
                })
            })
            .collect();
        // Once the flood has filled the queue, the user tries: within 10 s it logs in.
        assert!(wait_until(Duration::from_secs(10), || {
            target.metric("rustle_auth_hashes_refused_total") >= 40
        }));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut user = Vec::new();
        while std::time::Instant::now() < deadline && user.last() != Some(&502) {
            user.push(target.at.http_login("127.0.2.1", ALICE_PASSWORD));
        }
        let flood: Vec<Vec<u16>> = flooders.into_iter().map(|h| h.join().unwrap()).collect();
        (flood, user)
    });
    eprintln!("the user's answers during the flood: {user:?}");
    assert_eq!(user.last(), Some(&502), "the user never logged in: {user:?}");
    let hashed: usize = flood.iter().map(|a| a.iter().filter(|&&x| x == 407).count()).sum();
    eprintln!("40 flooding addresses: {hashed} of their guesses hashed");
    for answers in &flood {
        assert!(answers.ends_with(&[429, 429, 429]), "never ran out: {answers:?}");
        assert!(answers.iter().filter(|&&x| x == 407).count() <= 4, "{answers:?}");
    }
    assert!(hashed < 100, "{hashed} hashes: the flood spent its bursts in hashes");
}
