//! Negotiate (`[auth.kerberos]`) as clients see it: curl's GSS-API (`--proxy-negotiate`)
//! with a ticket from a real MIT KDC (`rustle_bench::kdc::Kdc`) on the HTTP and HTTPS
//! proxy ports, forward and CONNECT, and HTTP/2 streams (a python3-gssapi token); the 407
//! offering Negotiate beside Basic; Basic still accepted; a bad token refused with its
//! reason; a group from the users file reaching a rule; the proxy needing no KDC to check
//! a ticket; reloads of the keytab and realms.

use rustle_bench::kdc::{Kdc, REALM};
use rustle_bench::Origin;

use crate::util::*;

/// The proxy's configuration: `listeners` (TOML), Negotiate with `kdc`'s keytab, bob a
/// Basic user, alice in the users file with the group `staff` (no password of use here),
/// and `rules`.
fn config(kdc: &Kdc, listeners: &str, rules: &str) -> String {
    format!(
        r#"
{rules}
{listeners}
[auth]
failures_burst = 1000
[auth.kerberos]
keytab = "{}"
service_principal = "HTTP/localhost"
realms = ["{REALM}"]
[[auth.user]]
name = "bob"
password = "plain:hunter2"
[[auth.user]]
name = "alice"
password = "plain:not-used-by-negotiate"
groups = ["staff"]
"#,
        kdc.keytab().display()
    )
}

const HTTP_LISTENER: &str = "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n";

/// curl as `user` (with `user`'s credential cache from `kdc`): `args`, then `-w` the status.
fn curl_as(kdc: &Kdc, user: &str, args: &[&str]) -> Option<(u16, String)> {
    if !have("curl") {
        return None;
    }
    let out = clean_command("curl")
        .args(["--silent", "--show-error", "--max-time", "10", "-o", "/dev/null"])
        .args(["-D", "-", "-w", "\n%{http_code}"])
        .args(args)
        .envs(kdc.env(user))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = text.lines().last().unwrap_or_default().trim().parse().unwrap_or(0);
    Some((code, format!("{text}\nstderr: {}", String::from_utf8_lossy(&out.stderr))))
}

fn start(users: &[(&str, &str)]) -> Option<Kdc> {
    let kdc = Kdc::start(users)?;
    for (name, password) in users {
        kdc.kinit(name, password).expect("kinit");
    }
    Some(kdc)
}

#[test]
fn curl_with_a_ticket_gets_through_forward_and_connect_and_the_log_names_the_user() {
    let Some(kdc) = start(&[("alice", "alice-pw")]) else { return };
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&config(&kdc, HTTP_LISTENER, ""));
    let via = format!("http://localhost:{}", proxy.addr().port());
    let url = origin.url("/bytes/10");
    let negotiate = ["--proxy-negotiate", "-U", ":", "-x", &via];
    let Some((code, out)) = curl_as(&kdc, "alice", &[&negotiate[..], &[&url]].concat()) else {
        return;
    };
    assert_eq!(code, 200, "{out}");
    proxy.log_line(|l| l.contains(&url) && l.ends_with(" user=alice"));
    // CONNECT (curl -p), on a connection of its own.
    let url = origin.url("/bytes/11");
    let (code, out) = curl_as(&kdc, "alice", &[&negotiate[..], &["-p", &url]].concat()).unwrap();
    assert_eq!(code, 200, "{out}");
    proxy.log_line(|l| l.contains("CONNECT") && l.ends_with(" user=alice"));
    // The origin never sees the token.
    let head = String::from_utf8_lossy(&origin.last_request_head()).to_ascii_lowercase();
    assert!(!head.contains("proxy-authorization") && !head.contains("negotiate"), "{head}");
}

#[test]
fn without_a_ticket_the_407_offers_negotiate_and_basic_and_basic_still_works() {
    let Some(kdc) = start(&[]) else { return };
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&config(&kdc, HTTP_LISTENER, ""));
    let url = origin.url("/bytes/10");
    let mut c = Conn::to_proxy(&proxy);
    c.send(&request("GET", &url, &[], b""));
    let r = c.read_response();
    assert_eq!(r.status, 407, "{}", r.head_text());
    let offers = r.head_text().to_string();
    assert!(offers.contains("Proxy-Authenticate: Negotiate\r\n"), "{offers}");
    assert!(offers.contains("Proxy-Authenticate: Basic realm=\"rustle\"\r\n"), "{offers}");
    // curl offering Negotiate with no ticket in its cache: still 407.
    let via = format!("http://localhost:{}", proxy.addr().port());
    let Some((code, out)) =
        curl_as(&kdc, "nobody", &["--proxy-negotiate", "-U", ":", "-x", &via, &url])
    else {
        return;
    };
    assert_eq!(code, 407, "{out}");
    // Basic beside it.
    let (code, out) = curl_as(&kdc, "nobody", &["-x", &via, "-U", "bob:hunter2", &url]).unwrap();
    assert_eq!(code, 200, "{out}");
    proxy.log_line(|l| l.ends_with(" user=bob"));
    assert_eq!(origin.connections(), 1, "only bob reached the origin");
}

#[test]
fn a_bad_token_gets_a_407_naming_why_and_a_log_line() {
    let Some(kdc) = start(&[]) else { return };
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&config(&kdc, HTTP_LISTENER, ""));
    let url = origin.url("/bytes/10");
    for (value, why) in [
        ("Negotiate YWJjZGVm", "not a SPNEGO or Kerberos token"),
        ("Negotiate !!!", "the token is not base64"),
    ] {
        let mut c = Conn::to_proxy(&proxy);
        c.send(&request("GET", &url, &[&format!("Proxy-Authorization: {value}")], b""));
        let r = c.read_response();
        assert_eq!(r.status, 407, "{}", r.head_text());
        let body = r.text();
        assert_eq!(body, format!("proxy authentication required: Negotiate: {why}\n"));
        assert!(r.head_text().contains("Proxy-Authenticate: Negotiate\r\n"));
        let line = proxy.log_line(|l| l.contains(why));
        assert!(line.contains(" 407 "), "{line}");
        assert!(!line.contains("YWJj"), "the token is never logged: {line}");
    }
    assert_eq!(origin.connections(), 0);
}

#[test]
fn the_https_port_takes_negotiate_too() {
    let Some(kdc) = start(&[("alice", "alice-pw")]) else { return };
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("krb-https");
    let files = rustle::io::tls::write_self_signed("localhost", &dir.path().join("c")).unwrap();
    let listener = format!(
        "[[listener]]\nkind = \"https\"\nlisten = \"127.0.0.1:0\"\nauth = true\n\
         [listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        files.chain.display(),
        files.key.display()
    );
    let proxy = Proxy::from_toml(&config(&kdc, &listener, ""));
    let via = format!("https://localhost:{}", proxy.addr().port());
    let ca = files.ca.to_str().unwrap();
    let url = origin.url("/bytes/12");
    let base = ["--proxy-cacert", ca, "-x", &via];
    let Some((code, out)) = curl_as(&kdc, "alice", &[&base[..], &[&url]].concat()) else {
        return;
    };
    assert_eq!(code, 407, "{out}");
    assert!(out.contains("Proxy-Authenticate: Negotiate\r\n"), "{out}");
    let negotiate = [&base[..], &["--proxy-negotiate", "-U", ":", &url]].concat();
    let (code, out) = curl_as(&kdc, "alice", &negotiate).unwrap();
    assert_eq!(code, 200, "{out}");
    proxy.log_line(|l| l.contains(&url) && l.contains(" 200 ") && l.contains(" user=alice "));
}

#[test]
fn a_group_from_the_users_file_reaches_a_rule_and_no_kdc_is_needed_to_check_a_ticket() {
    let Some(mut kdc) = start(&[("alice", "alice-pw"), ("dave", "dave-pw")]) else { return };
    let origin = Origin::start().unwrap();
    let rules = "default_action = \"deny\"\n[[rule]]\nname = \"staff\"\naction = \"allow\"\n\
                 groups = [\"staff\"]\n";
    let proxy = Proxy::from_toml(&config(&kdc, HTTP_LISTENER, rules));
    let via = format!("http://localhost:{}", proxy.addr().port());
    let url = origin.url("/bytes/10");
    let negotiate = ["--proxy-negotiate", "-U", ":", "-x", &via, &url];
    // curl gets its service ticket from the KDC; the proxy checks it with its keytab.
    let Some((code, out)) = curl_as(&kdc, "alice", &negotiate) else { return };
    assert_eq!(code, 200, "{out}");
    // dave is a Kerberos user outside the users file: authenticated, in no group, denied.
    let (code, out) = curl_as(&kdc, "dave", &negotiate).unwrap();
    assert_eq!(code, 403, "{out}");
    proxy.log_line(|l| l.contains(" 403 ") && l.contains(" user=dave "));
    // With the KDC gone, alice's cached service ticket still gets her through.
    kdc.kill();
    let (code, out) = curl_as(&kdc, "alice", &negotiate).unwrap();
    assert_eq!(code, 200, "{out}");
}

/// `text` as a reload of `proxy` (its listeners and test settings kept, as `reload_toml`
/// does), refused or not.
fn reload(proxy: &Proxy, text: &str) -> Result<Vec<String>, String> {
    let mut cfg = rustle::config::Config::parse(text).expect("parses");
    let old = proxy.running().config();
    cfg.listeners.clone_from(&old.listeners);
    cfg.workers = old.workers;
    cfg.log.access = old.log.access.clone();
    cfg.timeouts.shutdown = old.timeouts.shutdown;
    rustle::run::reload::apply(proxy.running(), &cfg)
}

#[test]
fn a_reload_with_an_unreadable_keytab_is_refused_and_another_realm_list_is_put_in_force() {
    let Some(kdc) = start(&[("alice", "alice-pw")]) else { return };
    let origin = Origin::start().unwrap();
    let text = config(&kdc, HTTP_LISTENER, "");
    let proxy = Proxy::from_toml(&text);
    let via = format!("http://localhost:{}", proxy.addr().port());
    let url = origin.url("/bytes/10");
    let negotiate = ["--proxy-negotiate", "-U", ":", "-x", &via, &url];
    let keytab = kdc.keytab().display().to_string();
    let missing = text.replace(&keytab, "/nonexistent/http.keytab");
    let err = reload(&proxy, &missing).expect_err("refused");
    assert!(err.contains("auth.kerberos.keytab /nonexistent/http.keytab"), "{err}");
    let Some((code, out)) = curl_as(&kdc, "alice", &negotiate) else { return };
    assert_eq!(code, 200, "the running keytab is kept: {out}");
    // Another realm list goes through and is in force for the next login.
    reload(&proxy, &text.replace("realms = [\"RUSTLE.TEST\"]", "realms = [\"OTHER.TEST\"]"))
        .expect("reload");
    let (code, out) = curl_as(&kdc, "alice", &negotiate).unwrap();
    assert_eq!(code, 407, "{out}");
    proxy.log_line(|l| l.contains("realm RUSTLE.TEST is not accepted"));
}

/// A SPNEGO token for `HTTP@localhost` from `user`'s credential cache, made by MIT's
/// GSS-API through Debian's python3-gssapi (base64, as `Negotiate` carries it).
fn gss_token(kdc: &Kdc, user: &str) -> Option<String> {
    const MAKE: &str = "import base64, gssapi\n\
        n = gssapi.Name('HTTP@localhost', gssapi.NameType.hostbased_service)\n\
        m = gssapi.OID.from_int_seq('1.3.6.1.5.5.2')\n\
        c = gssapi.SecurityContext(name=n, mech=m, usage='initiate')\n\
        print(base64.b64encode(c.step()).decode())\n";
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", MAKE])
        .envs(kdc.env(user))
        .output();
    match out {
        Ok(o) if o.status.success() => Some(String::from_utf8_lossy(&o.stdout).trim().into()),
        _ => {
            rustle_bench::tools::missing("python3-gssapi");
            None
        }
    }
}

#[tokio::test]
async fn http2_streams_take_negotiate_too() {
    let Some(kdc) = start(&[("alice", "alice-pw")]) else { return };
    let Some(token) = gss_token(&kdc, "alice") else { return };
    let origin = Origin::start().unwrap();
    let listener = HTTP_LISTENER.replace("auth = true\n", "auth = true\nh2c = true\n");
    let proxy = Proxy::from_toml(&config(&kdc, &listener, ""));
    let tcp = tokio::net::TcpStream::connect(proxy.addr()).await.expect("connect");
    let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let url = origin.url("/bytes/10");
    let get = |auth: Option<&str>| {
        let mut r = http::Request::builder().method(http::Method::GET).uri(&url);
        if let Some(a) = auth {
            r = r.header("proxy-authorization", a);
        }
        r.body(()).unwrap()
    };
    let mut c = send.ready().await.expect("ready");
    let (resp, _) = c.send_request(get(None), true).expect("send");
    let resp = resp.await.expect("response");
    assert_eq!(resp.status(), 407);
    let offers: Vec<_> = resp.headers().get_all("proxy-authenticate").iter().collect();
    assert_eq!(offers, ["Negotiate", "Basic realm=\"rustle\""]);
    let mut c = c.ready().await.expect("ready");
    let auth = format!("Negotiate {token}");
    let (resp, _) = c.send_request(get(Some(&auth)), true).expect("send");
    let resp = resp.await.expect("response");
    assert_eq!(resp.status(), 200);
    proxy.log_line(|l| l.contains(" 200 ") && l.contains(" user=alice"));
}

#[test]
fn bad_tokens_count_against_the_clients_failed_attempts() {
    let Some(kdc) = start(&[]) else { return };
    let origin = Origin::start().unwrap();
    let text =
        config(&kdc, HTTP_LISTENER, "").replace("failures_burst = 1000", "failures_burst = 2");
    let proxy = Proxy::from_toml(&text);
    let url = origin.url("/bytes/10");
    let statuses: Vec<u16> = (0..3)
        .map(|_| {
            let mut c = Conn::to_proxy(&proxy);
            c.send(&request("GET", &url, &["Proxy-Authorization: Negotiate YWJjZGVm"], b""));
            c.read_response().status
        })
        .collect();
    assert_eq!(statuses, [407, 407, 429]);
}
