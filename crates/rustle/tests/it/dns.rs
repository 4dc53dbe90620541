//! The resolver (`[dns]`) end to end, against a DNS stub this test runs on loopback
//! (hickory-proto's message types, re-exported by hickory-resolver): rustle is pointed at
//! it with `servers = ["127.0.0.1:PORT"]`, or over TLS (`tls://127.0.0.1:PORT#dns.test`,
//! a stub with a test certificate) with the right CA and a wrong one, or over HTTPS
//! (`https://127.0.0.1:PORT/dns-query#doh.test`, an HTTP/2 stub). A SIGHUP puts
//! edited `[dns] hosts` in force; an unreadable `[dns] ca` is a problem `rustle check`
//! reports.

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_resolver::proto::op::{Message, ResponseCode};
use hickory_resolver::proto::rr::rdata::{A, AAAA};
use hickory_resolver::proto::rr::{RData, Record, RecordType};
use rustle::config::{Config, ListenerKind, Prefer};
use rustle_bench::TcpEcho;

use crate::util::socks::*;
use crate::util::*;

type Asked = Arc<Mutex<HashMap<(String, RecordType), usize>>>;

/// Answers A and AAAA from `zone` (TTL 60), NXDOMAIN for any other name; counts questions.
struct Stub {
    addr: SocketAddr,
    asked: Asked,
}

impl Stub {
    fn start(zone: &[(&str, IpAddr)]) -> Stub {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let names = zone_map(zone);
        let asked: Asked = Arc::default();
        let counts = asked.clone();
        // A daemon thread: it ends with the test process.
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = socket.recv_from(&mut buf) {
                if let Some(reply) = reply(&names, &counts, &buf[..n]) {
                    let _ = socket.send_to(&reply, from);
                }
            }
        });
        Stub { addr, asked }
    }

    /// The same over TLS (RFC 7858: each message after its 2-byte length), with the
    /// certificate `files` (for `dns.test`).
    fn start_tls(zone: &[(&str, IpAddr)], files: &rustle::io::tls::SelfSignedFiles) -> Stub {
        use rustls::pki_types::pem::PemObject as _;
        use std::io::Read;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let names = Arc::new(zone_map(zone));
        let asked: Asked = Arc::default();
        let counts = asked.clone();
        let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(&files.chain)
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&files.key).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let config = Arc::new(config);
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                let Ok(tcp) = tcp else { return };
                let (config, names, counts) = (config.clone(), names.clone(), counts.clone());
                std::thread::spawn(move || {
                    let conn = rustls::ServerConnection::new(config).unwrap();
                    let mut tls = rustls::StreamOwned::new(conn, tcp);
                    loop {
                        // A refused certificate ends the handshake here.
                        let mut len = [0u8; 2];
                        if tls.read_exact(&mut len).is_err() {
                            return;
                        }
                        let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
                        if tls.read_exact(&mut query).is_err() {
                            return;
                        }
                        let Some(reply) = reply(&names, &counts, &query) else { return };
                        let mut out = (reply.len() as u16).to_be_bytes().to_vec();
                        out.extend_from_slice(&reply);
                        if tls.write_all(&out).and_then(|()| tls.flush()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Stub { addr, asked }
    }

    /// The same over HTTPS (RFC 8484: HTTP/2, POST /dns-query, application/dns-message),
    /// on a runtime of its own.
    fn start_https(zone: &[(&str, IpAddr)], files: &rustle::io::tls::SelfSignedFiles) -> Stub {
        use rustls::pki_types::pem::PemObject as _;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let names = Arc::new(zone_map(zone));
        let asked: Asked = Arc::default();
        let counts = asked.clone();
        let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(&files.chain)
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&files.key).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                while let Ok((tcp, _)) = listener.accept().await {
                    let (acceptor, names, counts) =
                        (acceptor.clone(), names.clone(), counts.clone());
                    tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(tcp).await else { return };
                        let Ok(mut h2) = h2::server::handshake(tls).await else { return };
                        while let Some(Ok((request, mut respond))) = h2.accept().await {
                            let ok = request.method() == "POST"
                                && request.uri().path() == "/dns-query"
                                && request.headers().get("content-type").map(|v| v.as_bytes())
                                    == Some(b"application/dns-message");
                            let mut body = request.into_body();
                            let mut query = Vec::new();
                            while let Some(Ok(chunk)) = body.data().await {
                                let _ = body.flow_control().release_capacity(chunk.len());
                                query.extend_from_slice(&chunk);
                            }
                            let answer = ok.then(|| reply(&names, &counts, &query)).flatten();
                            let head = http::Response::builder()
                                .status(if answer.is_some() { 200 } else { 400 })
                                .header("content-type", "application/dns-message")
                                .body(())
                                .unwrap();
                            let Ok(mut send) = respond.send_response(head, false) else {
                                continue;
                            };
                            let _ = send.send_data(answer.unwrap_or_default().into(), true);
                        }
                    });
                }
            });
        });
        Stub { addr, asked }
    }

    fn asked(&self, name: &str) -> usize {
        let asked = self.asked.lock().unwrap();
        asked.iter().filter(|((n, _), _)| n == name).map(|(_, c)| c).sum()
    }
}

fn zone_map(zone: &[(&str, IpAddr)]) -> HashMap<String, Vec<IpAddr>> {
    let mut names: HashMap<String, Vec<IpAddr>> = HashMap::new();
    for (n, ip) in zone {
        names.entry(n.to_string()).or_default().push(*ip);
    }
    names
}

/// The answer to `query` from `names` (TTL 60; NXDOMAIN for a name not there), the
/// question counted.
fn reply(names: &HashMap<String, Vec<IpAddr>>, counts: &Asked, query: &[u8]) -> Option<Vec<u8>> {
    let query = Message::from_vec(query).ok()?;
    let mut reply = Message::response(query.metadata.id, query.metadata.op_code);
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    for q in &query.queries {
        let name = q.name().to_ascii().trim_end_matches('.').to_ascii_lowercase();
        *counts.lock().unwrap().entry((name.clone(), q.query_type())).or_insert(0) += 1;
        reply.add_query(q.clone());
        let Some(ips) = names.get(&name) else {
            reply.metadata.response_code = ResponseCode::NXDomain;
            continue;
        };
        for ip in ips {
            let rdata = match (ip, q.query_type()) {
                (IpAddr::V4(v4), RecordType::A) => RData::A(A(*v4)),
                (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(*v6)),
                _ => continue,
            };
            reply.add_answer(Record::from_rdata(q.name().clone(), 60, rdata));
        }
    }
    reply.to_vec().ok()
}

fn with_stub(cfg: &mut Config, servers: &[SocketAddr], prefer: Prefer) {
    cfg.dns.servers = servers.iter().map(|s| s.to_string()).collect();
    cfg.dns.timeout = Duration::from_millis(500);
    cfg.dns.attempts = 1;
    cfg.dns.prefer = prefer;
}

/// CONNECT to `target`: the status and the body of a failure.
fn connect_status(proxy: &Proxy, target: &str) -> (u16, String) {
    let mut c = Conn::to_proxy(proxy);
    c.send(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes());
    let r = c.read_head();
    if r.status == 200 {
        return (200, String::new());
    }
    let status = r.status;
    let mut c = Conn::to_proxy(proxy);
    c.send(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes());
    (status, c.read_response().text())
}

#[test]
fn names_come_from_the_configured_server_and_are_cached() {
    let echo = TcpEcho::start().unwrap();
    let stub = Stub::start(&[("echo.test", "127.0.0.1".parse().unwrap())]);
    let proxy = Proxy::start_with(|c| with_stub(c, &[stub.addr], Prefer::Ipv4));
    let target = format!("echo.test:{}", echo.addr().port());
    for _ in 0..5 {
        assert_eq!(connect_status(&proxy, &target).0, 200);
    }
    assert_eq!(stub.asked("echo.test"), 1, "four of five from the cache");
}

#[test]
fn an_unknown_name_is_a_502_naming_it_and_socks_04() {
    let stub = Stub::start(&[]);
    let proxy = Proxy::start_with(|c| with_stub(c, &[stub.addr], Prefer::Auto));
    let (status, text) = connect_status(&proxy, "nowhere.test:80");
    assert_eq!(status, 502);
    assert!(text.contains("nowhere.test") && text.contains("no such name"), "{text}");
    let asked = stub.asked("nowhere.test");
    assert!(asked >= 1);
    connect_status(&proxy, "nowhere.test:80");
    assert_eq!(stub.asked("nowhere.test"), asked, "the failure is remembered");

    let socks = Proxy::with_listener(ListenerKind::Socks, None, |c| {
        with_stub(c, &[stub.addr], Prefer::Auto)
    });
    let mut s = connect(socks.addr());
    assert_eq!(greet(&mut s, &[0]), 0);
    s.write_all(&request5(CONNECT, &Dst::Name("nowhere.test", 80))).unwrap();
    assert_eq!(read_reply5(&mut s).0, 0x04, "host unreachable");
}

#[test]
fn static_hosts_and_literals_ask_no_server() {
    let echo = TcpEcho::start().unwrap();
    let stub = Stub::start(&[]);
    let proxy = Proxy::start_with(|c| {
        with_stub(c, &[stub.addr], Prefer::Auto);
        c.dns.hosts.insert("pinned.test".into(), vec!["127.0.0.1".parse().unwrap()]);
    });
    let port = echo.addr().port();
    assert_eq!(connect_status(&proxy, &format!("pinned.test:{port}")).0, 200);
    assert_eq!(connect_status(&proxy, &format!("127.0.0.1:{port}")).0, 200);
    assert_eq!(stub.asked.lock().unwrap().len(), 0, "no question at all");
}

#[test]
fn prefer_picks_the_family() {
    // The origin listens on ::1 only; the name has both families.
    let echo = TcpEcho::start_on("[::1]:0".parse().unwrap()).unwrap();
    let port = echo.addr().port();
    let stub = Stub::start(&[
        ("both.test", "127.0.0.1".parse().unwrap()),
        ("both.test", "::1".parse().unwrap()),
    ]);
    let v6 = Proxy::start_with(|c| with_stub(c, &[stub.addr], Prefer::Ipv6));
    assert_eq!(connect_status(&v6, &format!("both.test:{port}")).0, 200);
    let v4 = Proxy::start_with(|c| with_stub(c, &[stub.addr], Prefer::Ipv4));
    let (status, text) = connect_status(&v4, &format!("both.test:{port}"));
    assert_eq!(status, 502, "IPv4 only: 127.0.0.1:{port} is closed");
    assert!(text.contains("refused"), "{text}");
}

#[test]
fn a_dead_server_then_a_live_one() {
    let echo = TcpEcho::start().unwrap();
    let dead = closed_udp_port();
    let stub = Stub::start(&[("echo.test", "127.0.0.1".parse().unwrap())]);
    let proxy = Proxy::start_with(|c| with_stub(c, &[dead, stub.addr], Prefer::Ipv4));
    let target = format!("echo.test:{}", echo.addr().port());
    assert_eq!(connect_status(&proxy, &target).0, 200);
}

fn closed_udp_port() -> SocketAddr {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap()
}

/// CONNECT through the proxy at `addr`: the status.
fn connect_at(addr: SocketAddr, target: &str) -> u16 {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes()).unwrap();
    let mut head = [0u8; 12];
    std::io::Read::read_exact(&mut c, &mut head).unwrap();
    String::from_utf8_lossy(&head[9..12]).parse().unwrap()
}

#[test]
fn a_sighup_puts_edited_dns_hosts_in_force() {
    // The origin listens on 127.0.0.2 only; the name points elsewhere first.
    let echo = TcpEcho::start_on("127.0.0.2:0".parse().unwrap()).unwrap();
    let port = echo.addr().port();
    let stub = Stub::start(&[]);
    let dir = TempDir::new("dns-reload");
    let file = dir.file("rustle.toml");
    let text = |ip: &str| {
        format!(
            "workers = 1\ndeny_private_destinations = false\n[log]\naccess = \"off\"\n\
             [[listener]]\nlisten = \"127.0.0.1:0\"\n[dns]\nservers = [\"{}\"]\n\
             [dns.hosts]\n\"pinned.test\" = [\"{ip}\"]\n",
            stub.addr
        )
    };
    std::fs::write(&file, text("127.0.0.3")).unwrap();
    let (bin, addr) = RustleProcess::start(&["--config", file.to_str().unwrap()]);
    let target = format!("pinned.test:{port}");
    assert_eq!(connect_at(addr, &target), 502, "127.0.0.3:{port} is closed");
    std::fs::write(&file, text("127.0.0.2")).unwrap();
    bin.signal("HUP");
    assert!(bin.wait_for_stderr("SIGHUP: reloaded", Duration::from_secs(5)), "{}", bin.stderr());
    assert_eq!(connect_at(addr, &target), 200, "the reloaded entry is in force");
    assert_eq!(stub.asked("pinned.test"), 0, "static entries ask no server");
}

#[test]
fn names_over_tls_and_a_refused_certificate_in_the_502() {
    let echo = TcpEcho::start().unwrap();
    let dir = TempDir::new("dns-tls");
    let files = rustle::io::tls::write_self_signed("dns.test", &dir.path().join("dns")).unwrap();
    let other = rustle::io::tls::write_self_signed("dns.test", &dir.path().join("other")).unwrap();
    let stub = Stub::start_tls(&[("echo.test", "127.0.0.1".parse().unwrap())], &files);
    let target = format!("echo.test:{}", echo.addr().port());
    let over_tls = |ca: &std::path::Path| {
        let ca = ca.to_path_buf();
        let addr = stub.addr;
        Proxy::start_with(move |c| {
            with_stub(c, &[], Prefer::Ipv4);
            c.dns.servers = vec![format!("tls://{addr}#dns.test")];
            c.dns.ca = Some(ca);
        })
    };
    let proxy = over_tls(&files.ca);
    assert_eq!(connect_status(&proxy, &target).0, 200);
    assert_eq!(connect_status(&proxy, &target).0, 200);
    assert_eq!(stub.asked("echo.test"), 1, "once over TLS, then from the cache");

    let wrong = over_tls(&other.ca);
    let (status, text) = connect_status(&wrong, &target);
    assert_eq!(status, 502);
    assert!(
        text.contains("echo.test") && text.contains("the certificate of dns.test is refused"),
        "{text}"
    );
    assert_eq!(stub.asked("echo.test"), 1, "nothing asked over a refused session");
}

#[test]
fn a_dns_ca_that_cannot_be_read_is_a_problem_check_reports() {
    let dir = TempDir::new("dns-ca");
    let file = dir.file("rustle.toml");
    std::fs::write(
        &file,
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n[dns]\nservers = [\"tls://127.0.0.1#dns.test\"]\n\
         ca = \"/nonexistent/ca.pem\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(rustle_bin())
        .args(["check", "--no-bind", "--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    let err =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("dns.ca") && err.contains("/nonexistent/ca.pem"), "{err}");
}

#[test]
fn names_over_https() {
    let echo = TcpEcho::start().unwrap();
    let dir = TempDir::new("dns-https");
    let files = rustle::io::tls::write_self_signed("doh.test", &dir.path().join("doh")).unwrap();
    let stub = Stub::start_https(&[("echo.test", "127.0.0.1".parse().unwrap())], &files);
    let (addr, ca) = (stub.addr, files.ca.clone());
    let proxy = Proxy::start_with(move |c| {
        with_stub(c, &[], Prefer::Ipv4);
        c.dns.servers = vec![format!("https://{addr}/dns-query#doh.test")];
        c.dns.ca = Some(ca);
    });
    let target = format!("echo.test:{}", echo.addr().port());
    assert_eq!(connect_status(&proxy, &target).0, 200);
    assert_eq!(connect_status(&proxy, &target).0, 200);
    assert_eq!(stub.asked("echo.test"), 1, "once over HTTPS, then from the cache");
}

/// The descriptors process `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn lookups_every_client_gave_up_on_close_their_sockets() {
    // A server that never answers: each lookup holds its UDP socket until its timeout.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let dir = TempDir::new("dns-abandoned");
    let cfg = dir.file("rustle.toml");
    std::fs::write(
        &cfg,
        format!(
            "workers = 1\n[[listener]]\nkind = \"http\"\nlisten = \"127.0.0.1:0\"\n\
             [dns]\nservers = [\"{}\"]\ntimeout = \"30s\"\nattempts = 1\nprefer = \"ipv4\"\n",
            silent.local_addr().unwrap()
        ),
    )
    .unwrap();
    let (bin, addr) = RustleProcess::start(&["--config", cfg.to_str().unwrap()]);
    let pid = bin.child.id();
    // One lookup given up on first, so that the resolver and its exchange exist.
    let warm = |name: &str| {
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.write_all(format!("CONNECT {name}:80 HTTP/1.1\r\nHost: {name}\r\n\r\n").as_bytes())
            .unwrap();
        c
    };
    drop(warm("first.test"));
    std::thread::sleep(Duration::from_millis(300));
    let start = open_fds(pid);
    let clients: Vec<_> = (0..50).map(|i| warm(&format!("name{i}.test"))).collect();
    assert!(
        wait_until(Duration::from_secs(5), || open_fds(pid) >= start + 50),
        "the lookups did not start: {} fds, {start} at the start",
        open_fds(pid)
    );
    drop(clients);
    // Long before the lookups' own timeout (30 s), their sockets are closed.
    assert!(
        wait_until(Duration::from_secs(3), || open_fds(pid) <= start),
        "{} fds open, {start} at the start",
        open_fds(pid)
    );
}

#[test]
fn a_name_dns_cannot_carry_is_a_502_saying_why_and_socks_04() {
    let stub = Stub::start(&[]);
    let proxy = Proxy::start_with(|c| with_stub(c, &[stub.addr], Prefer::Auto));
    let label = "x".repeat(64);
    let (status, text) = connect_status(&proxy, &format!("{label}.test:80"));
    assert_eq!(status, 502);
    assert!(text.contains("label longer than 63 bytes"), "{text}");
    let socks = Proxy::with_listener(ListenerKind::Socks, None, |c| {
        with_stub(c, &[stub.addr], Prefer::Auto)
    });
    let long = vec!["y".repeat(50); 5].join(".");
    let mut s = connect(socks.addr());
    assert_eq!(greet(&mut s, &[0]), 0);
    s.write_all(&request5(CONNECT, &Dst::Name(&long, 80))).unwrap();
    assert_eq!(read_reply5(&mut s).0, 0x04, "host unreachable");
    assert_eq!(stub.asked.lock().unwrap().len(), 0, "no question asked");
}

#[test]
fn a_udp_datagram_to_a_name_the_rules_refuse_asks_no_server() {
    let echo = rustle_bench::UdpEcho::start().unwrap();
    let stub = Stub::start(&[("allowed.test", "127.0.0.1".parse().unwrap())]);
    let socks = Proxy::with_listener(ListenerKind::Socks, None, |c| {
        with_stub(c, &[stub.addr], Prefer::Ipv4);
        let text =
            "[[rule]]\nname = \"no-blocked\"\naction = \"deny\"\nhosts = [\"blocked.test\"]\n";
        c.rules = Config::parse(text).unwrap().rules;
    });
    let (_control, rep, relay) =
        open5(socks.addr(), UDP_ASSOCIATE, &Dst::Addr("0.0.0.0:0".parse().unwrap()));
    assert_eq!(rep, 0, "UDP ASSOCIATE reply");
    let sock = udp_client();
    let send = |name: &str, payload: &[u8]| {
        let mut d = vec![0, 0, 0];
        d.extend_from_slice(&addr5(&Dst::Name(name, echo.addr().port())));
        d.extend_from_slice(payload);
        sock.send_to(&d, relay).unwrap();
    };
    send("blocked.test", b"refused");
    send("allowed.test", b"allowed");
    let (_, got) = recv_via(&sock, relay);
    assert_eq!(got, b"allowed", "the refused one never reached the echo");
    assert_eq!(stub.asked("allowed.test"), 1);
    assert_eq!(stub.asked("blocked.test"), 0, "a refused name is not looked up");
}

#[test]
fn a_udp_relay_waits_for_its_target_no_longer_than_the_connect_timeout() {
    // A server that never answers; its own timeout is far off.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let proxy = Proxy::from_toml(&format!(
        "[[listener]]\nkind = \"udp-relay\"\nlisten = \"127.0.0.1:0\"\ntarget = \"slow.test:9\"\n\
         [timeouts]\nconnect = \"300ms\"\n\
         [dns]\nservers = [\"{}\"]\ntimeout = \"30s\"\nattempts = 1\n",
        silent.local_addr().unwrap()
    ));
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let started = std::time::Instant::now();
    client.send_to(b"first", proxy.addr()).unwrap();
    let line = proxy.log_line(|l| l.contains("udp://slow.test:9"));
    assert!(line.contains("connect timeout"), "{line}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
}
