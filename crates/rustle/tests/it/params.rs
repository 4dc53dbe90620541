//! User-name parameters (`[auth.params]`) and sticky sessions as clients see them: the
//! password checked against the user before the parameters (HTTP/1 forward and CONNECT,
//! HTTP/2, the HTTPS port, SOCKS5), the base user in the log and the metrics, refusals
//! naming the parameter (407, SOCKS5 status 1) and a wrong password answered alike with
//! or without them, SOCKS5 names of 255 bytes and names not UTF-8, a route chosen by a
//! parameter, a group of parent proxies that a user, or a user's session, keeps for
//! `sticky_ttl`, a user's bound of sessions, and users named like another user with
//! parameters refused by `rustle check`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use rustle_bench::{Origin, TcpEcho};

use crate::util::socks::*;
use crate::util::*;

/// `[auth.params]` with `country` in {de, us}; users alice (`secret`) and `al-ice`
/// (`other`), a user whose name holds the separator.
const AUTH: &str = "[auth]\nfailures_burst = 1000\n\
    [auth.params]\nseparator = \"-\"\nmax_ttl = \"1h\"\n\
    [[auth.params.choice]]\nname = \"country\"\nvalues = [\"de\", \"us\"]\n\
    [[auth.user]]\nname = \"alice\"\npassword = \"plain:secret\"\n\
    [[auth.user]]\nname = \"al-ice\"\npassword = \"plain:other\"\n";

/// An HTTP listener (`addr_of(0)`) and a SOCKS one (`addr_of(1)`), both with `auth`.
fn proxy(extra: &str) -> Proxy {
    Proxy::from_toml(&format!(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n\
         [[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:0\"\nauth = true\n{AUTH}{extra}"
    ))
}

/// `key=VALUE` of an access-log line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

#[test]
fn the_password_is_checked_against_the_user_before_the_parameters() {
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let proxy = proxy("");
    let http = proxy.addr_of(0);
    let url = origin.url("/bytes/10");
    // curl, parameters in the user name.
    let via = format!("http://alice-session-x7k2-ttl-10m:secret@{http}");
    let Some(out) = curl(&["-x", &via, "-w", "%{http_code}", "-o", "/dev/null", &url]) else {
        return;
    };
    assert_success("curl -x http://alice-session-x7k2-ttl-10m:secret@", &out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    let line = proxy.log_line(|l| l.contains(" GET ") && l.contains(" 200 "));
    assert_eq!(LogLine::parse(&line).user, "alice", "the log names the user: {line}");
    // The password is alice's whatever the parameters; a user holding the separator.
    for (user, password, status) in [
        ("alice-country-de", "secret", 200),
        ("alice-country-de-session-a_1", "secret", 200),
        ("al-ice", "other", 200),
        ("al-ice-country-us", "other", 200),
        ("al-ice-country-us", "secret", 407),
        ("alice-country-de", "other", 407),
        ("mallory-country-de", "secret", 407),
    ] {
        let r = get_as(http, &url, user, password);
        assert_eq!(r.status, status, "{user}:{password}: {}{}", r.head_text(), r.text());
    }
    // Parameters refused with what was wrong, once the password passed; a wrong
    // password hears nothing of them.
    for (user, says) in [
        ("alice-colour-red", "unknown user-name parameter `colour`"),
        ("alice-country-fr", "`fr` is not a value of user-name parameter `country`"),
        ("alice-session-a-session-b", "user-name parameter `session` given twice"),
        ("alice-session-a.b", "a session id is 1 to 64 characters"),
        ("alice-", "an empty user-name parameter"),
    ] {
        let r = get_as(http, &url, user, "secret");
        assert_eq!(r.status, 407, "{user}: {}{}", r.head_text(), r.text());
        assert!(r.has_header("proxy-authenticate"), "{user}: {}", r.head_text());
        assert!(r.text().contains(says) && !r.text().contains("secret"), "{user}: {}", r.text());
        assert_eq!(r.text().lines().count(), 1, "one line: {}", r.text());
        proxy.log_line(|l| l.contains(" 407 ") && l.contains(says));
        let r = get_as(http, &url, user, "wrong");
        assert!(!r.text().contains("parameter"), "{user} with a wrong password: {}", r.text());
    }
    // A wrong password gets the very same answer whatever the name carries, and a name
    // with no user before its parameters is answered as one.
    let plain = get_as(http, &url, "alice", "wrong");
    assert_eq!(plain.status, 407);
    for user in ["alice-colour-red", "alice-country-de", "mallory-country-de", "mallory"] {
        let r = get_as(http, &url, user, "wrong");
        assert_eq!((r.head_text(), r.text()), (plain.head_text(), plain.text()), "{user}");
    }
    assert_eq!(origin.requests(), 1 + 4, "only the accepted requests reached the origin");
    // CONNECT.
    let auth = proxy_auth("alice-session-t1-country-us", "secret");
    let (mut t, r) = connect_with(http, &echo.addr().to_string(), &[&auth]);
    assert_eq!(r.status, 200, "{}", r.head_text());
    assert_echoes(&mut t.s, b"through a tunnel with parameters");
    drop(t);
    let auth = proxy_auth("alice-colour-red", "secret");
    let (_, r) = connect_with(http, &echo.addr().to_string(), &[&auth]);
    assert_eq!(r.status, 407, "{}", r.head_text());
    assert!(r.text().contains("unknown user-name parameter `colour`"), "{}", r.text());
    // The user's traffic is counted under its own name, never the parameterised one.
    let users: Vec<String> = proxy.traffic().into_iter().map(|(u, _, _)| u).collect();
    assert!(users.iter().all(|u| u == "alice" || u == "al-ice"), "{users:?}");
}

#[test]
fn socks5_takes_the_same_parameters() {
    let origin = Origin::start().unwrap();
    let proxy = proxy("");
    let socks = proxy.addr_of(1);
    let url = origin.url("/bytes/100");
    let good = format!("socks5h://alice-session-s5-country-de:secret@{socks}");
    let Some(out) = curl(&["-x", &good, "-w", "%{http_code}", "-o", "/dev/null", &url]) else {
        return;
    };
    assert_success("curl -x socks5h://alice-session-s5-country-de:secret@", &out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    proxy.log_line(|l| l.contains(" CONNECT socks5://") && l.ends_with(" user=alice"));
    // Refused: RFC 1929's failure status, then the close, and a log line naming it.
    for (user, password, says) in [
        ("alice-colour-red", "secret", "unknown user-name parameter `colour`"),
        ("alice-country-fr", "secret", "is not a value of user-name parameter `country`"),
        ("alice-country-de", "wrong", "wrong password"),
    ] {
        let mut s = connect(socks);
        assert_eq!(login5(&mut s, user, password), 1, "{user}:{password}");
        assert!(closed_within(&mut s, Duration::from_secs(3)), "{user}: not closed");
        proxy.log_line(|l| l.contains(says));
    }
    let mut s = connect5_as(socks, "al-ice-country-us", "other", &Dst::Addr(origin.addr()));
    let (n, _) = timed_download(&mut s, origin.addr(), 1000);
    assert_eq!(n, 1000);
    assert_eq!(origin.requests(), 2, "a refused login reached the origin");
}

#[test]
fn the_https_port_takes_the_same_parameters() {
    let dir = TempDir::new("params-https");
    let files = rustle::io::tls::write_self_signed("localhost", &dir.path().join("localhost"))
        .expect("self-signed set");
    let proxy = Proxy::from_toml(&format!(
        "[[listener]]\nkind = \"https\"\nlisten = \"127.0.0.1:0\"\nauth = true\n\
         [listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n{AUTH}",
        files.chain.display(),
        files.key.display()
    ));
    let origin = Origin::start().unwrap();
    let ca = files.ca.to_str().unwrap();
    let port = proxy.addr().port();
    let via = format!("https://localhost:{port}");
    let url = origin.url("/bytes/10");
    let curl_as = |user: &str| {
        let args = ["--proxy", &via, "--proxy-cacert", ca, "--proxy-user", user];
        curl(&[&args[..], &["-s", "-o", "/dev/null", "-w", "%{http_code}", &url]].concat())
    };
    let Some(out) = curl_as("alice-session-tls1:secret") else { return };
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "{out:?}");
    let out = curl_as("alice-colour-red:secret").unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "407", "{out:?}");
    proxy.log_line(|l| l.contains(" 407 ") && l.contains("unknown user-name parameter"));
    let line = proxy.log_line(|l| l.contains(" 200 "));
    assert_eq!(LogLine::parse(&line).user, "alice", "{line}");
}

#[tokio::test]
async fn http2_takes_the_same_parameters() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&format!(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\nh2c = true\n{AUTH}"
    ));
    let tcp = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let url = origin.url("/bytes/10");
    let get = |user: &str| {
        let auth = proxy_auth(user, "secret");
        let value = auth.split_once(": ").unwrap().1.to_string();
        let req = http::Request::get(&url).header("proxy-authorization", value).body(()).unwrap();
        let send = send.clone();
        async move {
            let mut send = send.ready().await.expect("ready");
            let (resp, _) = send.send_request(req, true).expect("send");
            let resp = resp.await.expect("response");
            let status = resp.status().as_u16();
            let mut body = resp.into_body();
            let mut text = Vec::new();
            while let Some(chunk) = body.data().await {
                let chunk: Bytes = chunk.expect("data");
                let _ = body.flow_control().release_capacity(chunk.len());
                text.extend_from_slice(&chunk);
            }
            (status, String::from_utf8_lossy(&text).into_owned())
        }
    };
    // Streams of one connection, each with its own parameters, one user.
    assert_eq!(get("alice-session-h2a").await.0, 200);
    assert_eq!(get("alice-session-h2b-country-de").await.0, 200);
    let (status, body) = get("alice-colour-red").await;
    assert_eq!(status, 407, "{body}");
    assert!(body.contains("unknown user-name parameter `colour`"), "{body}");
    let (status, body) = get("al-ice-country-de").await;
    assert_eq!(status, 407, "a wrong password (al-ice's is `other`): {body}");
    // Each stream's line is written as it ends, perhaps after its last byte reached us.
    let ok = proxy.log_lines_matching(2, |l| l.contains(" 200 "));
    assert_eq!(ok.len(), 2, "{ok:?}");
    assert!(ok.iter().all(|l| LogLine::parse(l).user == "alice"), "{ok:?}");
}

/// `name` as an HTTP parent at `addr`.
fn parent(name: &str, addr: SocketAddr) -> String {
    format!("[[parent]]\nname = \"{name}\"\nkind = \"http\"\naddress = \"{addr}\"\n")
}

#[test]
fn a_parameter_picks_the_route() {
    let origin = Origin::start().unwrap();
    let (de, us) = (Proxy::start(), Proxy::start());
    let proxy = proxy(&format!(
        "{}{}[[group]]\nname = \"de-parents\"\nparents = [\"de1\"]\n\
         [[route]]\nname = \"de\"\nparams = [\"country=de\"]\nvia = \"de-parents\"\n\
         [[route]]\nname = \"us\"\nparams = [\"country=us\"]\nvia = \"us1\"\n",
        parent("de1", de.addr()),
        parent("us1", us.addr())
    ));
    let cases = [("alice-country-de", "de1"), ("alice-country-us", "us1"), ("alice", "")];
    for (i, (user, _)) in cases.iter().enumerate() {
        let r = get_as(proxy.addr_of(0), &origin.url(&format!("/bytes/{}", i + 1)), user, "secret");
        assert_eq!(r.status, 200, "{user}: {}{}", r.head_text(), r.text());
    }
    let lines = proxy.log_lines_matching(3, |l| l.contains(" GET "));
    for (line, (user, parent)) in lines.iter().zip(cases) {
        assert_eq!(field(line, "via").unwrap_or_default(), parent, "{user}: {line}");
    }
    // SOCKS5 as well.
    let mut s =
        connect5_as(proxy.addr_of(1), "alice-country-us", "secret", &Dst::Addr(origin.addr()));
    let (n, _) = timed_download(&mut s, origin.addr(), 10);
    assert_eq!(n, 10);
    drop(s);
    proxy.log_line(|l| l.contains(" CONNECT socks5://") && field(l, "via") == Some("us1"));
    assert_eq!(de.log_lines().len(), 1, "{}", de.log_text());
    wait_until(Duration::from_secs(3), || us.log_lines().len() == 2);
    assert_eq!(us.log_lines().len(), 2, "{}", us.log_text());
}

/// Three parents in group `pool` (weights alike, no `sticky` of its own), a route through
/// it with `sticky_keys`, and users u00..u11 (password `pw`) besides alice.
fn sticky_proxy(parents: &[Proxy], sticky_keys: &str) -> Proxy {
    let mut text = String::new();
    for i in 0..12 {
        text += &format!("[[auth.user]]\nname = \"u{i:02}\"\npassword = \"plain:pw\"\n");
    }
    let names = ["a", "b", "c"];
    for (name, p) in names.iter().zip(parents) {
        text += &parent(name, p.addr());
    }
    text += "[[group]]\nname = \"pool\"\nparents = [\"a\", \"b\", \"c\"]\n";
    text += &format!("[[route]]\nname = \"pool\"\nvia = \"pool\"\n{sticky_keys}\n");
    proxy(&text)
}

/// The parent each key (`(user, password)`) went through, `rounds` GETs each (of
/// `/bytes/N`, N the key's place plus one, so that its log line names it). `before`:
/// the proxy's GET lines before these.
fn parents_of(
    proxy: &Proxy,
    origin: &Origin,
    keys: &[(String, &str)],
    rounds: usize,
    before: usize,
) -> BTreeMap<String, BTreeSet<String>> {
    for _ in 0..rounds {
        for (i, (user, password)) in keys.iter().enumerate() {
            let r =
                get_as(proxy.addr_of(0), &origin.url(&format!("/bytes/{}", i + 1)), user, password);
            assert_eq!(r.status, 200, "{user}: {}{}", r.head_text(), r.text());
        }
    }
    let n = before + rounds * keys.len();
    let lines = proxy.log_lines_matching(n, |l| l.contains(" GET ") && l.contains(" 200 "));
    assert_eq!(lines.len(), n, "{}", proxy.log_text());
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in &lines[before..] {
        let target = LogLine::parse(line).target;
        let i: usize = target.rsplit('/').next().and_then(|n| n.parse().ok()).unwrap();
        let via = field(line, "via").unwrap_or_else(|| panic!("no via: {line}"));
        out.entry(keys[i - 1].0.clone()).or_default().insert(via.to_string());
    }
    out
}

#[test]
fn sticky_by_user_keeps_each_user_on_one_parent() {
    let origin = Origin::start().unwrap();
    let parents = [Proxy::start(), Proxy::start(), Proxy::start()];
    let proxy = sticky_proxy(&parents, "sticky = \"user\"\nsticky_ttl = \"10m\"");
    let keys: Vec<(String, &str)> = (0..12).map(|i| (format!("u{i:02}"), "pw")).collect();
    let of = parents_of(&proxy, &origin, &keys, 4, 0);
    for (user, vias) in &of {
        assert_eq!(vias.len(), 1, "{user} went through {vias:?}");
    }
    let used: BTreeSet<&String> = of.values().flatten().collect();
    assert!(used.len() >= 2, "12 users all on {used:?}");
    // Session ids do not split a user on a `user` route.
    let keys = vec![("u00-session-a".to_string(), "pw"), ("u00-session-b".to_string(), "pw")];
    let with_sessions = parents_of(&proxy, &origin, &keys, 2, 48);
    let vias: BTreeSet<&String> = with_sessions.values().flatten().collect();
    assert_eq!(vias.into_iter().collect::<Vec<_>>(), of["u00"].iter().collect::<Vec<_>>());
    // Without `sticky`, the same group takes turns: one user spreads over the parents.
    let parents2 = [Proxy::start(), Proxy::start(), Proxy::start()];
    let plain = sticky_proxy(&parents2, "");
    let of = parents_of(&plain, &origin, &[("u00".to_string(), "pw")], 6, 0);
    assert!(of["u00"].len() >= 2, "not sticky, yet {of:?}");
}

#[test]
fn sticky_by_session_keeps_each_session_on_one_parent_until_it_expires() {
    let origin = Origin::start().unwrap();
    let parents = [Proxy::start(), Proxy::start(), Proxy::start()];
    let proxy = sticky_proxy(&parents, "sticky = \"session\"\nsticky_ttl = \"2s\"");
    let keys: Vec<(String, &str)> =
        (0..12).map(|i| (format!("alice-session-s{i:02}"), "secret")).collect();
    let started = std::time::Instant::now();
    let first = parents_of(&proxy, &origin, &keys, 3, 0);
    assert!(started.elapsed() < Duration::from_secs(2), "too slow to test within the ttl");
    for (session, vias) in &first {
        assert_eq!(vias.len(), 1, "{session} went through {vias:?}");
    }
    let used: BTreeSet<&String> = first.values().flatten().collect();
    assert!(used.len() >= 2, "12 sessions all on {used:?}");
    // Past the ttl every session starts again with a fresh seed: some land elsewhere
    // (each stays with probability 1/3, all twelve about once in half a million runs).
    std::thread::sleep(Duration::from_millis(2100));
    let second = parents_of(&proxy, &origin, &keys, 1, 36);
    let moved = keys.iter().filter(|(k, _)| first[k] != second[k]).count();
    assert!(moved > 0, "no session moved after its ttl: {first:?} {second:?}");
    // A session's own `ttl`, over `max_ttl`, is cut to it (and accepted).
    let r =
        get_as(proxy.addr_of(0), &origin.url("/bytes/1"), "alice-session-long-ttl-5h", "secret");
    assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
}

/// `rustle check` of a file: whether it passed, and what it said.
fn check(text: &str) -> (bool, String) {
    let dir = TempDir::new("params-check");
    let file = dir.file("rustle.toml");
    std::fs::write(&file, text).unwrap();
    let out = std::process::Command::new(rustle_bin())
        .args(["check", "--config", file.to_str().unwrap()])
        .output()
        .expect("run rustle check");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_user_named_like_another_user_with_parameters_is_refused() {
    // In the users file or inline: the name would always be taken whole, so alice could
    // never give those parameters.
    let dir = TempDir::new("params-users");
    let users = dir.file("users");
    let listener = "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n";
    for (file, inline, bad) in [
        ("alice-session-x:plain:pw\n", "", Some("alice-session-x")),
        ("bob:plain:pw\nalice-session:plain:pw\n", "", Some("alice-session")),
        (
            "",
            "[[auth.user]]\nname = \"al-ice-country-de\"\npassword = \"plain:pw\"\n",
            Some("al-ice-country-de"),
        ),
        // Not parameters, or no user before them: no doubt.
        ("alice-colour-red:plain:pw\nalice-country-fr:plain:pw\n", "", None),
        ("mallory-session-x:plain:pw\nbob-:plain:pw\n", "", None),
    ] {
        std::fs::write(&users, file).unwrap();
        let auth = AUTH.replacen("[auth]\n", &format!("[auth]\nusers_file = {:?}\n", users), 1);
        let text = format!("{listener}{auth}{inline}");
        let (ok, err) = check(&text);
        match bad {
            Some(name) => {
                assert!(!ok, "check passed {name}");
                let says = format!("user `{name}` reads as the user `");
                assert!(err.contains(&says) && err.contains("rename one"), "{name}: {err}");
            }
            None => assert!(ok, "{file}: {err}"),
        }
    }
}

#[test]
fn socks5_names_of_255_bytes_and_names_not_utf8() {
    let origin = Origin::start().unwrap();
    let proxy = proxy("[[auth.user]]\nname = \"bob\\uFFFD\"\npassword = \"plain:pw\"\n");
    let socks = proxy.addr_of(1);
    // The longest name RFC 1929 carries, parameters and all (a ttl padded with zeros).
    let head = format!("alice-session-{}-country-de-ttl-", "s".repeat(64));
    let name = format!("{head}{}1m", "0".repeat(255 - head.len() - 2));
    assert_eq!(name.len(), 255);
    let mut s = connect5_as(socks, &name, "secret", &Dst::Addr(origin.addr()));
    let (n, _) = timed_download(&mut s, origin.addr(), 100);
    assert_eq!(n, 100);
    drop(s);
    proxy.log_line(|l| l.contains(" CONNECT socks5://") && l.ends_with(" user=alice"));
    // Bytes that are not UTF-8 are no user's: `bob\xff` is not `bob\u{fffd}`.
    let mut s = connect(socks);
    assert_eq!(greet(&mut s, &[2]), 2);
    std::io::Write::write_all(&mut s, &credentials(b"bob\xff", b"pw")).unwrap();
    assert_eq!(read_exact_n(&mut s, 2), [1, 1], "bob\\xff passed");
    assert!(closed_within(&mut s, Duration::from_secs(3)), "not closed");
    proxy.log_line(|l| l.contains("unknown user or wrong password"));
    let mut s = connect(socks);
    assert_eq!(login5(&mut s, "bob\u{fffd}", "pw"), 0, "the user bob\\u{{fffd}} itself");
}

#[test]
fn a_user_at_its_bound_of_sessions_gets_unsticky_ones_and_the_others_stick() {
    let origin = Origin::start().unwrap();
    let parents = [Proxy::start(), Proxy::start(), Proxy::start()];
    let keys = "sticky = \"session\"\n[limits]\nmax_sticky_sessions_per_user = 2";
    let proxy = sticky_proxy(&parents, keys);
    let keys: Vec<(String, &str)> = vec![
        ("alice-session-s1".into(), "secret"),
        ("alice-session-s2".into(), "secret"),
        ("u00-session-s1".into(), "pw"),
        ("u00-session-s2".into(), "pw"),
    ];
    let first = parents_of(&proxy, &origin, &keys, 3, 0);
    for (session, vias) in &first {
        assert_eq!(vias.len(), 1, "{session} went through {vias:?}");
    }
    // A third session of alice's is not sticky: it takes the group's turns.
    let third = parents_of(&proxy, &origin, &[("alice-session-s3".into(), "secret")], 6, 12);
    assert!(third["alice-session-s3"].len() >= 2, "sticky beyond the bound: {third:?}");
    // Her first two, and another user's, stick on.
    let again = parents_of(&proxy, &origin, &keys, 1, 18);
    assert_eq!(again, first);
}

#[test]
fn a_reload_with_a_user_named_like_another_with_parameters_warns_and_goes_on() {
    let origin = Origin::start().unwrap();
    let proxy = proxy("");
    let http = proxy.addr_of(0);
    let url = origin.url("/bytes/10");
    let carol = "[[auth.user]]\nname = \"alice-country-de\"\npassword = \"plain:carol\"\n";
    // (The running listeners stay: the text names none.)
    let warnings = proxy.reload_toml(&format!("{AUTH}{carol}"));
    assert!(
        warnings.iter().any(|w| w.contains("user `alice-country-de` reads as the user `alice`")),
        "{warnings:?}"
    );
    // In force: the name is that user's, whole; alice's other parameters go on.
    assert_eq!(get_as(http, &url, "alice-country-de", "carol").status, 200);
    assert_eq!(get_as(http, &url, "alice-country-de", "secret").status, 407);
    assert_eq!(get_as(http, &url, "alice-country-us", "secret").status, 200);
}
