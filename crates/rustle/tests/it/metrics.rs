//! The admin endpoint: `/metrics` after traffic of each protocol (HTTP/1 forwarding,
//! CONNECT, HTTP/2, SOCKS5, a TCP relay, the HTTPS port's handshakes, a denied request, a
//! failed login) checked against what was sent, the output read by Prometheus' own Python
//! parser; `/healthz` and `/readyz` through a drain; the token and client blocks; the
//! refusal of an admin listener open to anyone.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustle_bench::{Origin, TcpEcho};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::util::socks::{connect5, Dst};
use crate::util::*;

/// A python3 that has the `prometheus_client` module. `.ci/run` installs it
/// (python3-prometheus-client), so a missing parser fails the test rather than skip it.
fn python() -> &'static str {
    for p in ["python3", "/usr/bin/python3"] {
        let ok = Command::new(p)
            .args(["-c", "import prometheus_client"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return p;
        }
    }
    panic!(
        "no python3 with the prometheus_client module: apt-get install python3-prometheus-client"
    );
}

/// Reads the text with prometheus_client's parser and prints every sample as JSON.
const PARSE: &str = r#"
import sys, json
from prometheus_client.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        out.append([fam.name, fam.type, s.name, s.labels, s.value])
print(json.dumps(out))
"#;

/// One sample as the parser gave it.
#[derive(Debug)]
struct Sample {
    family: String,
    kind: String,
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

struct Samples(Vec<Sample>);

/// A sample as the parser script prints it: family, type, name, labels, value.
type Row = (String, String, String, BTreeMap<String, String>, f64);

impl Samples {
    /// The sum of the samples named `name` whose labels include `labels` (0 if none).
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |s| {
            s.name == name
                && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(v))
        })
    }

    /// The one sample named `name` with exactly these labels.
    fn one(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<_> = self.matching(name, labels).collect();
        assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
        found[0].value
    }
}

/// Sends one request to the admin endpoint from `from` (a loopback address) and reads the
/// answer to its close.
fn admin_request_from(from: &str, addr: SocketAddr, request: &str) -> Resp {
    let mut s = connect_from(from, addr);
    s.write_all(request.as_bytes()).unwrap();
    let (bytes, _) = read_until_close(&mut s);
    parse_response(&bytes)
}

fn admin_get(addr: SocketAddr, path: &str, headers: &str) -> Resp {
    let req = format!("GET {path} HTTP/1.1\r\nHost: admin\r\n{headers}\r\n");
    admin_request_from("127.0.0.1", addr, &req)
}

/// One request on a new connection, and its answer.
fn one_request(addr: SocketAddr, request: &[u8]) -> Resp {
    let mut c = Conn::open(addr);
    c.send(request);
    c.read_response()
}

/// `/metrics`, parsed by the Prometheus client library's parser.
fn scrape(addr: SocketAddr) -> Samples {
    let r = admin_get(addr, "/metrics", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/plain; version=0.0.4; charset=utf-8"));
    let mut child = Command::new(python())
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    child.stdin.take().unwrap().write_all(&r.body).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused the output: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        r.text()
    );
    let rows: Vec<Row> = serde_json::from_slice(&out.stdout).expect("parser output");
    Samples(
        rows.into_iter()
            .map(|(family, kind, name, labels, value)| Sample { family, kind, name, labels, value })
            .collect(),
    )
}

/// Scrapes until `done` holds (counters of tunnels arrive when the tunnels end).
fn scrape_until(addr: SocketAddr, what: &str, done: impl Fn(&Samples) -> bool) -> Samples {
    wait_for(Duration::from_secs(10), what, || Some(scrape(addr)).filter(&done))
}

/// A TLS client of the HTTPS port trusting `ca`.
fn tls_client(ca: &std::path::Path) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// One GET through the HTTPS port; the body's length.
fn https_get(addr: SocketAddr, config: &Arc<rustls::ClientConfig>, url: &str) -> usize {
    let name = ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, connect(addr));
    let req = format!("GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).unwrap();
    let mut got = Vec::new();
    let _ = tls.read_to_end(&mut got);
    let r = parse_response(&got);
    assert_eq!(r.status, 200, "{}", r.text());
    r.body.len()
}

/// An h2c GET (prior knowledge) of `url`; the body's length.
fn h2_get(proxy: SocketAddr, url: &str) -> usize {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(proxy).await.unwrap();
        let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut send = send.ready().await.unwrap();
        let req = http::Request::get(url).body(()).unwrap();
        let (resp, _) = send.send_request(req, true).unwrap();
        let resp = resp.await.expect("h2 response");
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let mut n = 0;
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            n += chunk.len();
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        n
    })
}

#[test]
fn counters_match_the_traffic_of_each_protocol_and_parse_as_prometheus_text() {
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let dir = TempDir::new("metrics");
    let certs = rustle::io::tls::write_self_signed("localhost", &dir.path().join("tls")).unwrap();
    let proxy = Proxy::from_toml(&format!(
        r#"
[admin]
listen = "127.0.0.1:0"
[[listener]]
listen = "127.0.0.1:0"
kind = "http"
h2c = true
[[listener]]
listen = "127.0.0.1:0"
kind = "socks"
[[listener]]
listen = "127.0.0.1:0"
kind = "relay"
target = "{echo}"
[[listener]]
listen = "127.0.0.1:0"
kind = "https"
[listener.tls]
cert = "{cert}"
key = "{key}"
[[listener]]
name = "authed"
listen = "127.0.0.1:0"
auth = true
[[listener]]
name = "socks-authed"
listen = "127.0.0.1:0"
kind = "socks"
auth = true
[auth]
failures_burst = 1000
[[auth.user]]
name = "alice"
password = "plain:secret"
[[rule]]
action = "deny"
ports = ["9"]
"#,
        echo = echo.addr(),
        cert = certs.chain.display(),
        key = certs.key.display(),
    ));
    let admin = proxy.admin_addr();
    let [http, socks, relay, https, authed, socks_authed] =
        [0, 1, 2, 3, 4, 5].map(|i| proxy.addr_of(i));
    // A listener is labelled by its name, as the access log names it; by its address
    // when it has none.
    let label = |a: SocketAddr| match a {
        _ if a == authed => "authed".to_string(),
        _ if a == socks_authed => "socks-authed".to_string(),
        a => a.to_string(),
    };

    // HTTP/1 forwarding: three GETs and a POST on one kept-alive connection.
    let mut c = Conn::open(http);
    let mut down = 0;
    for _ in 0..3 {
        c.send(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/bytes/1000")).as_bytes());
        let r = c.read_response();
        assert_eq!((r.status, r.body.len()), (200, 1000));
        down += r.body.len();
    }
    let post = vec![b'p'; 500];
    c.send(
        format!(
            "POST {} HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n",
            origin.url("/sha256")
        )
        .as_bytes(),
    );
    c.send(&post);
    let r = c.read_response();
    assert_eq!(r.status, 200);
    down += r.body.len();
    drop(c);
    // A request an access rule denies.
    let r = one_request(http, b"GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.status, 403, "{}", r.text());
    // CONNECT: 100 bytes each way.
    let (mut tunnel, r) = connect_with(http, &echo.addr().to_string(), &[]);
    assert_eq!(r.status, 200);
    assert_echoes(&mut tunnel.s, &[b'c'; 100]);
    drop(tunnel);
    // HTTP/2 (h2c with prior knowledge).
    down += h2_get(http, &origin.url("/bytes/1000"));
    // SOCKS5 CONNECT: 50 bytes each way.
    let mut s = connect5(socks, &Dst::Addr(echo.addr()));
    assert_echoes(&mut s, &[b's'; 50]);
    drop(s);
    // The TCP relay: 70 bytes each way.
    let mut s = connect(relay);
    assert_echoes(&mut s, &[b'r'; 70]);
    drop(s);
    // The HTTPS port: a request over TLS, and a handshake that fails.
    let https_down = https_get(https, &tls_client(&certs.ca), &origin.url("/bytes/1000"));
    let mut bad = connect(https);
    bad.write_all(b"\x16\x03\x01\x00\x08notahello").unwrap();
    bad.shutdown(std::net::Shutdown::Write).unwrap();
    let _ = read_until_close(&mut bad);
    // A failed login, then alice's request.
    let r = one_request(
        authed,
        format!(
            "GET {} HTTP/1.1\r\nHost: x\r\n{}\r\n\r\n",
            origin.url("/bytes/1000"),
            proxy_auth("alice", "wrong")
        )
        .as_bytes(),
    );
    assert_eq!(r.status, 407);
    let r = one_request(
        authed,
        format!(
            "GET {} HTTP/1.1\r\nHost: x\r\n{}\r\n\r\n",
            origin.url("/bytes/1000"),
            proxy_auth("alice", "secret")
        )
        .as_bytes(),
    );
    assert_eq!((r.status, r.body.len()), (200, 1000));
    let r = one_request(
        authed,
        format!(
            "GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: x\r\n{}\r\n\r\n",
            proxy_auth("alice", "secret")
        )
        .as_bytes(),
    );
    assert_eq!(r.status, 403);
    // A SOCKS5 client offering no method the auth listener accepts (no username and
    // password): refused for authentication.
    let mut s = connect(socks_authed);
    s.write_all(&[5, 1, 0]).unwrap();
    let (reply, _) = read_until_close(&mut s);
    assert_eq!(reply, [5, 0xff]);

    // Counted when the tunnels and connections have ended.
    let m = scrape_until(admin, "every tunnel ended and every connection closed", |m| {
        m.sum("rustle_tunnel_duration_seconds_count", &[]) == 3.0
            && m.sum("rustle_listener_connections_open", &[]) == 0.0
    });
    let requests = |a: SocketAddr, proto: &str, code: &str| {
        m.sum(
            "rustle_listener_requests_total",
            &[("listener", &label(a)), ("protocol", proto), ("code", code)],
        )
    };
    let get = |name: &str, a: SocketAddr, kind: &str| {
        m.one(name, &[("listener", &label(a)), ("kind", kind)])
    };
    // Listener 0: four HTTP/1 requests answered 200, one 403, a CONNECT, an h2 stream.
    assert_eq!(requests(http, "http1", "2xx"), 4.0);
    assert_eq!(requests(http, "http1", "4xx"), 1.0);
    assert_eq!(requests(http, "connect", "2xx"), 1.0);
    assert_eq!(requests(http, "http2", "2xx"), 1.0);
    assert_eq!(get("rustle_listener_http2_streams_total", http, "http"), 1.0);
    assert_eq!(get("rustle_listener_connections_accepted_total", http, "http"), 4.0);
    assert_eq!(get("rustle_listener_bytes_in_total", http, "http"), 600.0);
    assert_eq!(get("rustle_listener_bytes_out_total", http, "http"), (down + 100) as f64);
    let refused = |a: SocketAddr, cause: &str| {
        m.one("rustle_listener_refused_total", &[("listener", &label(a)), ("cause", cause)])
    };
    assert_eq!(refused(http, "rule"), 1.0);
    assert_eq!(refused(http, "auth"), 0.0);
    // SOCKS5 and the relay: one tunnel each, their bytes.
    assert_eq!(requests(socks, "socks5", "2xx"), 1.0);
    assert_eq!(get("rustle_listener_bytes_in_total", socks, "socks"), 50.0);
    assert_eq!(get("rustle_listener_bytes_out_total", socks, "socks"), 50.0);
    assert_eq!(requests(relay, "relay", "2xx"), 1.0);
    assert_eq!(get("rustle_listener_bytes_out_total", relay, "relay"), 70.0);
    // The HTTPS port: two handshakes, one failed (its line: protocol other, no status).
    assert_eq!(get("rustle_listener_tls_handshakes_total", https, "https"), 2.0);
    assert_eq!(get("rustle_listener_tls_handshake_failures_total", https, "https"), 1.0);
    assert_eq!(requests(https, "http1", "2xx"), 1.0);
    assert_eq!(requests(https, "other", "other"), 1.0);
    assert_eq!(get("rustle_listener_bytes_out_total", https, "https"), https_down as f64);
    // The failed login, alice's request and her denied one.
    assert_eq!(requests(authed, "http1", "4xx"), 2.0);
    assert_eq!(refused(authed, "auth"), 1.0);
    assert_eq!(refused(authed, "rule"), 1.0);
    assert_eq!(m.one("rustle_user_requests_total", &[("user", "alice")]), 2.0);
    assert_eq!(m.one("rustle_user_bytes_out_total", &[("user", "alice")]), 1000.0);
    assert_eq!(m.one("rustle_user_denied_total", &[("user", "alice")]), 1.0);
    assert_eq!(m.one("rustle_user_connections_open", &[("user", "alice")]), 0.0);
    assert_eq!(refused(socks_authed, "auth"), 1.0);
    assert_eq!(requests(socks_authed, "socks5", "4xx"), 1.0);
    // End-to-end durations of the exchanges that are not tunnels, by protocol: the five
    // HTTP/1 requests of listener 0, the HTTPS one and the authed listener's three; the
    // h2 stream; the SOCKS5 refusal; the failed handshake.
    let duration =
        |proto: &str| m.one("rustle_request_duration_seconds_count", &[("protocol", proto)]);
    assert_eq!(duration("http1"), 9.0);
    assert_eq!(duration("other"), 1.0);
    assert_eq!(duration("http2"), 1.0);
    assert_eq!(duration("socks5"), 1.0);
    assert!(m.one("rustle_request_duration_seconds_sum", &[("protocol", "http1")]) > 0.0);
    let le = |proto: &str, le: &str| {
        m.one("rustle_request_duration_seconds_bucket", &[("protocol", proto), ("le", le)])
    };
    assert_eq!(le("http1", "+Inf"), 9.0);
    assert!(le("http1", "0.0005") <= le("http1", "0.25"));
    // Histograms: every forwarded request's response head (4 + h2 + HTTPS + alice), at
    // least one new upstream connection, the three tunnels; buckets are cumulative.
    assert_eq!(m.sum("rustle_upstream_response_head_seconds_count", &[]), 7.0);
    assert!(m.sum("rustle_upstream_connect_seconds_count", &[]) >= 1.0);
    let inf = m.one("rustle_tunnel_duration_seconds_bucket", &[("le", "+Inf")]);
    assert_eq!(inf, 3.0);
    // The parser saw the families with their types (it drops a counter's `_total`).
    let kind_of = |family: &str| {
        m.0.iter().find(|s| s.family == family).map(|s| s.kind.clone()).unwrap_or_default()
    };
    assert_eq!(kind_of("rustle_listener_connections_accepted"), "counter");
    assert_eq!(kind_of("rustle_listener_connections_open"), "gauge");
    assert_eq!(kind_of("rustle_upstream_connect_seconds"), "histogram");
    // Process figures.
    assert_eq!(m.one("rustle_workers", &[]), 1.0);
    assert!(m.one("process_open_fds", &[]) > 0.0);
    assert!(m.one("process_max_fds", &[]) >= m.one("process_open_fds", &[]));
    assert!(m.one("process_resident_memory_bytes", &[]) > 1e6);
    let cpu = m.one("process_cpu_seconds_total", &[]);
    assert!(cpu > 0.0 && cpu < 1e6, "{cpu}");
    let started = m.one("process_start_time_seconds", &[]);
    let unix_now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    assert!(started > 1.6e9 && started <= unix_now.as_secs_f64(), "{started}");
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(m.one("rustle_build_info", &[("version", version)]), 1.0);
    // When the configuration in force was loaded (the binary's test checks a reload).
    let loaded = m.one("rustle_config_last_reload_success_timestamp_seconds", &[]);
    assert!(loaded > 1.6e9 && loaded <= unix_now.as_secs_f64(), "{loaded}");
}

/// A proxy with an admin listener on 127.0.0.1:0, `tweak` applied after.
fn with_admin(tweak: impl FnOnce(&mut rustle::config::Config)) -> Proxy {
    Proxy::start_with(|cfg| {
        cfg.admin.listen = Some("127.0.0.1:0".parse().unwrap());
        tweak(cfg);
    })
}

#[test]
fn readyz_turns_503_while_draining_and_healthz_stays_200() {
    let echo = TcpEcho::start().unwrap();
    // A long shutdown: the drain lasts as long as the tunnel stays open.
    let proxy = with_admin(|cfg| cfg.timeouts.shutdown = Duration::from_secs(30));
    let admin = proxy.admin_addr();
    let r = admin_get(admin, "/healthz", "");
    assert_eq!((r.status, r.text().as_str()), (200, "ok\n"));
    let r = admin_get(admin, "/readyz", "");
    assert_eq!((r.status, r.text().as_str()), (200, "ready\n"));
    let (mut tunnel, r) = connect_with(proxy.addr(), &echo.addr().to_string(), &[]);
    assert_eq!(r.status, 200);
    let _ = proxy.running().stopper().send(true);
    let r = wait_for(Duration::from_secs(10), "/readyz to stop saying ready", || {
        Some(admin_get(admin, "/readyz", "")).filter(|r| r.status != 200)
    });
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().starts_with("draining: "), "{}", r.text());
    assert_eq!(r.text().lines().count(), 1, "{}", r.text());
    // Still draining: the open tunnel works, the process answers, metrics are served.
    assert_echoes(&mut tunnel.s, b"still open");
    assert_eq!(admin_get(admin, "/healthz", "").status, 200);
    let m = scrape(admin);
    assert_eq!(m.one("rustle_listener_connections_open", &[("kind", "http")]), 1.0);
    assert_eq!(admin_get(admin, "/readyz", "").status, 503);
}

#[test]
fn the_token_and_client_blocks_are_enforced_and_bad_requests_answered() {
    let proxy = with_admin(|cfg| {
        cfg.admin.token = Some(rustle::config::Secret::new("s3cret"));
        cfg.admin.allow = vec!["127.0.0.2/32".parse().unwrap()];
    });
    let admin = proxy.admin_addr();
    let get = |from: &str, path: &str, headers: &str| {
        admin_request_from(from, admin, &format!("GET {path} HTTP/1.1\r\nHost: a\r\n{headers}\r\n"))
    };
    let good = "Authorization: Bearer s3cret\r\n";
    // From an address outside `allow`, even with the token: closed unanswered.
    let mut s = connect_from("127.0.0.1", admin);
    let _ = s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: a\r\n{good}\r\n").as_bytes());
    let (bytes, closed) = read_until_close(&mut s);
    assert!(closed && bytes.is_empty(), "{}", String::from_utf8_lossy(&bytes));
    // Inside `allow`: no token or a wrong one is 401, the right one 200.
    let r = get("127.0.0.2", "/metrics", "");
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"rustle admin\""));
    assert_eq!(get("127.0.0.2", "/metrics", "Authorization: Bearer s3cre\r\n").status, 401);
    assert_eq!(get("127.0.0.2", "/metrics", "Authorization: Basic s3cret\r\n").status, 401);
    let r = get("127.0.0.2", "/metrics", good);
    assert_eq!(r.status, 200);
    assert!(r.text().contains("# TYPE rustle_listener_connections_accepted_total counter"));
    assert_eq!(get("127.0.0.2", "/healthz", good).status, 200);
    // Anything else: one line saying why.
    let r = get("127.0.0.2", "/nope", good);
    assert_eq!(r.status, 404);
    assert_eq!(r.text().lines().count(), 1, "{}", r.text());
    let r = admin_request_from(
        "127.0.0.2",
        admin,
        &format!("POST /metrics HTTP/1.1\r\nHost: a\r\n{good}Content-Length: 0\r\n\r\n"),
    );
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")));
    let r = admin_request_from("127.0.0.2", admin, "GET /metrics HTTP/1.1\r\nHo st: a\r\n\r\n");
    assert_eq!(r.status, 400, "{}", r.text());
    let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(10_000));
    let r = admin_request_from("127.0.0.2", admin, &huge);
    assert_eq!(r.status, 431, "{}", r.text());
}

/// Whether the server closed `s` (end of stream or reset) within `limit`, with nothing
/// sent on it.
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut byte = [0u8; 1];
    match s.read(&mut byte) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => panic!("the admin endpoint sent bytes to a silent connection"),
    }
}

/// `/healthz` from 127.0.0.1, answered within `limit`, with `silent` connections that
/// never send a byte open from 127.0.0.1 and 127.0.0.3 (a probe shares its address with
/// others: kubelet, every test here).
fn healthz_beside_silent_connections(silent: usize, limit: Duration) {
    let proxy = with_admin(|_| {});
    let admin = proxy.admin_addr();
    let mut held: Vec<TcpStream> = (0..silent)
        .map(|i| connect_from(if i % 2 == 0 { "127.0.0.1" } else { "127.0.0.3" }, admin))
        .collect();
    for round in 0..3 {
        let start = Instant::now();
        let mut s = connect_from("127.0.0.1", admin);
        s.set_read_timeout(Some(limit)).unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n").unwrap();
        let (bytes, closed) = read_until_close(&mut s);
        let took = start.elapsed();
        assert!(closed, "round {round}: /healthz not answered within {limit:?} ({silent} silent)");
        let r = parse_response(&bytes);
        assert_eq!((r.status, r.text().as_str()), (200, "ok\n"), "round {round}");
        assert!(took < limit, "round {round}: {took:?}");
    }
    // Silent connections get no longer than the head deadline (2 s) either way.
    let last = held.last_mut().unwrap();
    assert!(closed_within(last, Duration::from_secs(5)), "a silent connection stays open");
}

#[test]
fn healthz_answers_beside_64_silent_connections() {
    healthz_beside_silent_connections(64, Duration::from_millis(1500));
}

#[test]
fn healthz_answers_beside_200_silent_connections() {
    healthz_beside_silent_connections(200, Duration::from_millis(1500));
}

#[test]
fn a_client_outside_admin_allow_is_closed_at_accept_and_takes_no_slot() {
    let proxy = with_admin(|cfg| cfg.admin.allow = vec!["127.0.0.1/32".parse().unwrap()]);
    let admin = proxy.admin_addr();
    // Closed before it sends anything, and a hundred of them hold nothing.
    let mut outside: Vec<TcpStream> = (0..100).map(|_| connect_from("127.0.0.2", admin)).collect();
    for s in &mut outside {
        assert!(closed_within(s, Duration::from_secs(1)), "a refused client stays open");
    }
    let r = admin_get(admin, "/healthz", "");
    assert_eq!(r.status, 200);
}

#[test]
fn an_admin_listener_open_to_anyone_is_refused_at_start_and_by_check() {
    // In-process start: a non-loopback admin address with neither token nor allow.
    let cfg = rustle::config::Config {
        workers: 1,
        listeners: vec![listener(rustle::config::ListenerKind::Http, None)],
        admin: rustle::config::Admin {
            listen: Some("0.0.0.0:0".parse().unwrap()),
            ..Default::default()
        },
        ..Default::default()
    };
    let err = rustle::run::server::start(cfg).err().expect("refused").to_string();
    assert!(err.contains("admin listener on 0.0.0.0:0 would serve metrics"), "{err}");
    // `rustle check`, with the line of `listen`.
    let dir = TempDir::new("admin-check");
    let file = dir.file("rustle.toml");
    let text = "[[listener]]\nlisten = \"127.0.0.1:3128\"\n[admin]\nlisten = \"0.0.0.0:9090\"\n";
    std::fs::write(&file, text).unwrap();
    let out = Command::new(rustle_bin())
        .args(["check", "--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("line 4: admin.listen: admin listener on 0.0.0.0:9090"), "{err}");
    // With a token it passes.
    std::fs::write(&file, format!("{text}token = \"s3cret\"\n")).unwrap();
    let out = Command::new(rustle_bin())
        .args(["check", "--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn the_binary_serves_metrics_and_counts_reloads() {
    let dir = TempDir::new("admin-bin");
    let file = dir.file("rustle.toml");
    let text = "[[listener]]\nlisten = \"127.0.0.1:0\"\nkind = \"http\"\n\
                [admin]\nlisten = \"127.0.0.1:0\"\n";
    std::fs::write(&file, text).unwrap();
    let p = RustleProcess::spawn(&["--config", file.to_str().unwrap()]);
    assert!(
        p.wait_for_stderr("admin endpoint on http://", Duration::from_secs(10)),
        "{}",
        p.stderr()
    );
    let err = p.stderr();
    let addr: SocketAddr = err
        .split("admin endpoint on http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no admin address in {err}"));
    let m = scrape(addr);
    assert_eq!(m.one("rustle_config_reloads_total", &[]), 0.0);
    // Before any reload, the configuration in force is the one loaded at the start.
    let last = |m: &Samples| m.one("rustle_config_last_reload_success_timestamp_seconds", &[]);
    assert_eq!(last(&m), m.one("process_start_time_seconds", &[]));
    let unix_now = || {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        now.as_secs_f64()
    };
    let before = unix_now();
    p.signal("HUP");
    let m = scrape_until(addr, "the reload counted", |m| {
        m.one("rustle_config_reloads_total", &[]) == 1.0
    });
    let reloaded = last(&m);
    assert!(reloaded >= before - 0.001 && reloaded <= unix_now(), "{before} {reloaded}");
    std::fs::write(&file, format!("{text}bogus = 1\n")).unwrap();
    p.signal("HUP");
    let m = scrape_until(addr, "the refused reload counted", |m| {
        m.one("rustle_config_reload_failures_total", &[]) == 1.0
    });
    // A refused reload leaves the time of the last one applied.
    assert_eq!(last(&m), reloaded);
}

#[test]
fn parents_report_their_state_failures_and_connect_time() {
    let origin = Origin::start().unwrap();
    // A rustle parent that works, and a parent address nothing listens on.
    let parent = Proxy::start();
    let dead = closed_port();
    let proxy = Proxy::from_toml(&format!(
        r#"
[admin]
listen = "127.0.0.1:0"
[[parent]]
name = "up"
kind = "http"
address = "{parent}"
probe = "tcp"
probe_every = "1s"
[[parent]]
name = "gone"
kind = "http"
address = "{dead}"
max_failures = 1
down_for = "1h"
[[route]]
name = "via-up"
ports = ["{port}"]
via = "up"
[[route]]
name = "via-gone"
via = "gone"
"#,
        parent = parent.addr(),
        port = origin.addr().port(),
    ));
    let r = one_request(
        proxy.addr(),
        format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/bytes/10")).as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = one_request(proxy.addr(), b"GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.status, 502, "{}", r.text());
    let m = scrape(proxy.admin_addr());
    assert_eq!(m.one("rustle_parent_up", &[("parent", "up")]), 1.0);
    assert_eq!(m.one("rustle_parent_up", &[("parent", "gone")]), 0.0);
    assert_eq!(m.one("rustle_parent_connect_failures_total", &[("parent", "gone")]), 1.0);
    assert_eq!(m.one("rustle_parent_connect_failures_total", &[("parent", "up")]), 0.0);
    let count = |p: &str| m.one("rustle_parent_connect_seconds_count", &[("parent", p)]);
    assert_eq!((count("up"), count("gone")), (1.0, 0.0));

    // Per parent and per route: what went through them, by status class and direction.
    let requests = |key: &str, name: &str, code: &str, m: &Samples| {
        m.one(&format!("rustle_{key}_requests_total"), &[(key, name), ("code", code)])
    };
    let bytes = |key: &str, name: &str, dir: &str, m: &Samples| {
        m.one(&format!("rustle_{key}_bytes_total"), &[(key, name), ("direction", dir)])
    };
    let active = |key: &str, name: &str, m: &Samples| {
        m.one(&format!("rustle_{key}_active_connections"), &[(key, name)])
    };
    assert_eq!(requests("parent", "up", "2xx", &m), 1.0);
    assert_eq!(requests("parent", "up", "5xx", &m), 0.0);
    assert_eq!(requests("route", "via-up", "2xx", &m), 1.0);
    assert_eq!(bytes("parent", "up", "down", &m), 10.0);
    assert_eq!(bytes("route", "via-up", "down", &m), 10.0);
    // The failed one never got through a parent: the route and parent count nothing.
    assert_eq!(requests("route", "via-gone", "5xx", &m), 0.0);
    assert_eq!(requests("parent", "gone", "5xx", &m), 0.0);
    assert_eq!((active("parent", "up", &m), active("route", "via-up", &m)), (0.0, 0.0));
    // A tunnel through "up" is active while it lasts, then counted with its bytes.
    let (mut tunnel, r) = connect_with(proxy.addr(), &origin.addr().to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    let m = scrape(proxy.admin_addr());
    assert_eq!((active("parent", "up", &m), active("route", "via-up", &m)), (1.0, 1.0));
    tunnel.send(b"GET /bytes/20 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let r = tunnel.read_response();
    assert_eq!((r.status, r.body.len()), (200, 20));
    drop(tunnel);
    let m = scrape_until(proxy.admin_addr(), "the tunnel ended", |m| {
        active("parent", "up", m) == 0.0 && requests("parent", "up", "2xx", m) == 2.0
    });
    assert_eq!(requests("route", "via-up", "2xx", &m), 2.0);
    assert!(bytes("parent", "up", "down", &m) > 30.0);
    assert!(bytes("parent", "up", "up", &m) > 40.0);
    // The probe's time: a TCP connection to the parent, a loopback one.
    let m = scrape_until(proxy.admin_addr(), "a probe of \"up\" ran", |m| {
        m.matching("rustle_parent_probe_duration_seconds", &[("parent", "up")]).count() == 1
    });
    let probe = m.one("rustle_parent_probe_duration_seconds", &[("parent", "up")]);
    assert!(probe > 0.0 && probe < 1.0, "{probe}");
    // "gone" has no probe.
    assert_eq!(
        m.matching("rustle_parent_probe_duration_seconds", &[("parent", "gone")]).count(),
        0
    );
}
