//! The RADIUS backend through the proxy, against a real FreeRADIUS (rustle_bench::radiusd):
//! right and wrong passwords over HTTP, CONNECT, SOCKS5 and the HTTPS port, a group from
//! Filter-Id reaching a rule, Framed-IP-Address as the outgoing address, the server
//! stopped and started mid-run, remembered answers (no second call), the accounting of a
//! real download read back from the server's detail file, logins going on while the
//! accounting server gives no answer, and an account accepted under another User-Name
//! refused.

use std::net::TcpListener;
use std::time::Duration;

use rustle::io::tls::write_self_signed;
use rustle_bench::radiusd::Radiusd;
use rustle_bench::Origin;

use crate::util::*;

/// alice: group staff, leaves from 127.0.0.7, Class plan-gold; bob: no group; dora, for
/// the accounting test alone: the `rustle-auth` thread is the process's, and its sessions
/// are by user name, so a user other tests log in at the same time would share them.
const USERS: &str = r#"
alice	Cleartext-Password := "wonderland"
	Filter-Id = "staff",
	Framed-IP-Address = 127.0.0.7,
	Class = "plan-gold"

bob	Cleartext-Password := "builder"

dora	Cleartext-Password := "explorer"
	Class = "plan-gold"

eve	Cleartext-Password := "listener"
	User-Name := "Eve"
"#;

/// Listeners (`listeners`, each with `auth = true`), a RADIUS backend on `server` with
/// `backend` keys added, and `rest` (rules) after.
fn radius_toml(server: &Radiusd, listeners: &str, backend: &str, rest: &str) -> String {
    format!(
        r#"{listeners}
[auth]
failures_burst = 1000
refusal_delay = "0s"
[[auth.backend]]
kind = "radius"
servers = ["127.0.0.1:{auth}"]
accounting_servers = ["127.0.0.1:{acct}"]
secret_file = {secret:?}
timeout = "1s"
{backend}
{rest}
"#,
        auth = server.auth_port(),
        acct = server.acct_port(),
        secret = server.secret_file().display().to_string(),
    )
}

const HTTP_AND_SOCKS: &str = r#"
[[listener]]
listen = "127.0.0.1:0"
auth = true
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
auth = true
"#;

#[test]
fn right_and_wrong_passwords_over_http_connect_and_socks5() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&radius_toml(&server, HTTP_AND_SOCKS, "", ""));
    let (http, socks) = (proxy.addr_of(0), proxy.addr_of(1));
    let url = origin.url("/bytes/100");

    let r = get_as(http, &url, "alice", "wonderland");
    assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
    let r = get_as(http, &url, "bob", "wrong");
    assert_eq!(r.status, 407, "{}{}", r.head_text(), r.text());

    // CONNECT, to a listener of ours: alice's tunnel leaves from her Framed-IP-Address.
    let target = TcpListener::bind("127.0.0.1:0").unwrap();
    let to = target.local_addr().unwrap().to_string();
    let (_c, r) = connect_with(http, &to, &[&proxy_auth("alice", "wonderland")]);
    assert_eq!(r.status, 200, "{}", r.head_text());
    let (_peer, from) = target.accept().unwrap();
    assert_eq!(from.ip().to_string(), "127.0.0.7", "alice's outgoing address");
    let (_c, r) = connect_with(http, &to, &[&proxy_auth("alice", "nope")]);
    assert_eq!(r.status, 407, "{}", r.head_text());

    // SOCKS5 username/password.
    let good = format!("socks5h://bob:builder@{socks}");
    let Some(out) = curl(&["-x", &good, "-s", "-o", "/dev/null", "-w", "%{http_code}", &url])
    else {
        return;
    };
    assert_success("curl -x socks5h://bob:builder@", &out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    let bad = format!("socks5h://bob:wrong@{socks}");
    let out = curl(&["-x", &bad, "-s", "-o", "/dev/null", &url]).unwrap();
    assert!(!out.status.success(), "a wrong password got through SOCKS5: {out:?}");
    proxy.log_line(|l| l.contains(" CONNECT socks5://") && l.ends_with(" user=bob"));
    assert_eq!(origin.requests(), 2, "a refused login reached the origin");
}

#[test]
fn right_and_wrong_passwords_on_the_https_port() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let dir = TempDir::new("radius-https");
    let files = write_self_signed("localhost", &dir.path().join("localhost")).unwrap();
    let listener = format!(
        "[[listener]]\nkind = \"https\"\nlisten = \"127.0.0.1:0\"\nauth = true\n[listener.tls]\n\
         cert = \"{}\"\nkey = \"{}\"\n",
        files.chain.display(),
        files.key.display()
    );
    let proxy = Proxy::from_toml(&radius_toml(&server, &listener, "", ""));
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/1000");
    let ca = files.ca.to_str().unwrap();
    let port = proxy.addr().port();
    let code = |user: &str| -> Option<String> {
        let p = format!("https://{user}@localhost:{port}");
        let out = curl(&[
            "--proxy",
            &p,
            "--proxy-cacert",
            ca,
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &url,
        ])?;
        Some(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let Some(ok) = code("alice:wonderland") else { return };
    assert_eq!(ok, "200");
    assert_eq!(code("alice:wonderlan").unwrap(), "407");
}

#[test]
fn a_group_from_filter_id_reaches_a_rule() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let rules = "default_action = \"deny\"\n";
    let listener = "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n";
    let rest = "[[rule]]\nname = \"staff-may\"\naction = \"allow\"\ngroups = [\"staff\"]\n";
    let proxy = Proxy::from_toml(&format!("{rules}{}", radius_toml(&server, listener, "", rest)));
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/10");
    let r = get_as(proxy.addr(), &url, "alice", "wonderland");
    assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
    let r = get_as(proxy.addr(), &url, "bob", "builder");
    assert_eq!(r.status, 403, "{}{}", r.head_text(), r.text());
    assert!(r.text().contains("the default action"), "{}", r.text());
    assert_eq!(origin.requests(), 1);
}

#[test]
fn a_stopped_server_refuses_logins_until_it_is_back() {
    let Some(mut server) = Radiusd::start(USERS) else { return };
    let listener = "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n";
    let proxy = Proxy::from_toml(&radius_toml(&server, listener, "", ""));
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/10");
    assert_eq!(get_as(proxy.addr(), &url, "alice", "wonderland").status, 200);
    server.kill();
    // bob has no remembered answer: his login needs the server.
    let r = get_as(proxy.addr(), &url, "bob", "builder");
    assert_eq!(r.status, 503, "{}{}", r.head_text(), r.text());
    assert!(r.text().contains("authentication backend is unavailable"), "{}", r.text());
    let line = proxy.log_line(|l| l.contains(" 503 "));
    assert!(line.contains("unavailable"), "{line}");
    server.restart().unwrap();
    let r = get_as(proxy.addr(), &url, "bob", "builder");
    assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
}

#[test]
fn remembered_answers_make_no_second_call() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let listener = "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n";
    let proxy = Proxy::from_toml(&radius_toml(&server, listener, "", ""));
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/10");
    for _ in 0..3 {
        assert_eq!(get_as(proxy.addr(), &url, "alice", "wonderland").status, 200);
    }
    assert_eq!(server.auth_requests(), 1, "{}", server.log());
    for _ in 0..3 {
        assert_eq!(get_as(proxy.addr(), &url, "alice", "bad").status, 407);
    }
    assert_eq!(server.auth_requests(), 2, "{}", server.log());
}

#[test]
fn a_download_is_accounted_start_interim_stop() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let listener = "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n";
    let proxy = Proxy::from_toml(&radius_toml(&server, listener, "interim_interval = \"1s\"", ""));
    let origin = Origin::start().unwrap();
    // A tunnel held open past one interval, then a download through it.
    let (mut c, r) =
        connect_with(proxy.addr(), &origin.addr().to_string(), &[&proxy_auth("dora", "explorer")]);
    assert_eq!(r.status, 200, "{}", r.head_text());
    let detail = |n: usize, what: &str| {
        wait_for(Duration::from_secs(5), what, || {
            let d = server.detail();
            (d.matches("Acct-Status-Type").count() >= n).then_some(d)
        })
    };
    let d = detail(2, "a Start and an Interim-Update");
    assert!(d.contains("Acct-Status-Type = Start"), "{d}");
    assert!(d.contains("Acct-Status-Type = Interim-Update"), "{d}");
    c.send(b"GET /bytes/300000 HTTP/1.1\r\nHost: o\r\nConnection: close\r\n\r\n");
    let r = c.read_response();
    assert_eq!(r.status, 200);
    drop(c);
    let d = wait_for(Duration::from_secs(5), "a Stop", || {
        let d = server.detail();
        d.contains("Acct-Status-Type = Stop").then_some(d)
    });
    let stop = d.split("\n\n").find(|b| b.contains("Acct-Status-Type = Stop")).unwrap();
    let value = |name: &str| -> u64 {
        stop.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{name} = ")).map(str::to_string))
            .unwrap_or_else(|| panic!("no {name} in {stop}"))
            .parse()
            .unwrap()
    };
    assert!(value("Acct-Output-Octets") >= 300_000, "{stop}");
    assert!(value("Acct-Input-Octets") > 0, "{stop}");
    assert!(stop.contains("User-Name = \"dora\""), "{stop}");
    assert!(stop.contains("Class = 0x706c616e2d676f6c64"), "{stop}");
    assert!(stop.contains("Calling-Station-Id = \"127.0.0.1\""), "{stop}");
    // Start, Interims and Stop share one session id.
    let ids: std::collections::BTreeSet<&str> =
        d.lines().filter(|l| l.contains("Acct-Session-Id")).map(str::trim).collect();
    assert_eq!(ids.len(), 1, "{d}");
}

#[test]
fn a_reload_whose_secret_cannot_be_read_is_refused_and_the_backend_kept() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let listener = "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n";
    let text = radius_toml(&server, listener, "", "");
    let proxy = Proxy::from_toml(&text);
    let secret = server.secret_file().display().to_string();
    // Another timeout: other settings, so the backend is built again and reads its secret.
    let bad = text.replace(&secret, "/nonexistent/radius.secret").replace("\"1s\"", "\"2s\"");
    let refused = match rustle::config::Config::parse(&bad) {
        Err(p) => p.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("\n"),
        Ok(mut cfg) => {
            let old = proxy.running().config();
            cfg.listeners.clone_from(&old.listeners);
            cfg.workers = old.workers;
            cfg.log.access = old.log.access.clone();
            rustle::run::reload::apply(proxy.running(), &cfg).expect_err("the reload is refused")
        }
    };
    assert!(refused.contains("/nonexistent/radius.secret"), "{refused}");
    assert!(!refused.contains(server.secret()), "the secret in a message: {refused}");
    let origin = Origin::start().unwrap();
    let r = get_as(proxy.addr(), &origin.url("/bytes/10"), "alice", "wonderland");
    assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
}

#[test]
fn logins_go_on_while_the_accounting_server_gives_no_answer() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let listener = "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n";
    let text = radius_toml(&server, listener, "max_in_flight = 1", "").replace(
        &format!("accounting_servers = [\"127.0.0.1:{}\"]", server.acct_port()),
        &format!("accounting_servers = [\"{}\"]", silent.local_addr().unwrap()),
    );
    let proxy = Proxy::from_toml(&text);
    let origin = Origin::start().unwrap();
    // alice's tunnel held open: her Start waits on the silent server for the whole timeout.
    let (_c, r) = connect_with(
        proxy.addr(),
        &origin.addr().to_string(),
        &[&proxy_auth("alice", "wonderland")],
    );
    assert_eq!(r.status, 200, "{}", r.head_text());
    let mut buf = [0u8; 4096];
    silent.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let n = silent.recv(&mut buf).expect("alice's Accounting-Request Start");
    assert_eq!((buf[0], n > 20), (4, true));
    // Meanwhile bob's login is asked of the server and answered at once.
    let t = std::time::Instant::now();
    let r = get_as(proxy.addr(), &origin.url("/bytes/10"), "bob", "builder");
    assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
    assert!(t.elapsed() < Duration::from_millis(700), "bob waited {:?}", t.elapsed());
    assert_eq!(server.auth_requests(), 2, "{}", server.log());
}

#[test]
fn an_account_accepted_under_another_user_name_is_refused() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let listener = "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n";
    let proxy = Proxy::from_toml(&radius_toml(&server, listener, "", ""));
    let origin = Origin::start().unwrap();
    let r = get_as(proxy.addr(), &origin.url("/bytes/10"), "eve", "listener");
    assert_eq!(r.status, 407, "{}{}", r.head_text(), r.text());
    assert!(server.log().contains("Login OK: [eve]"), "{}", server.log());
    assert_eq!(origin.requests(), 0);
}
