//! The resolver against a DNS stub on loopback (hickory-proto's message types).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_resolver::proto::op::{Message, ResponseCode};
use hickory_resolver::proto::rr::rdata::{A, AAAA};
use hickory_resolver::proto::rr::{RData, Record, RecordType};

use super::Resolver;
use crate::config::{Dns, Prefer};

/// What the stub knows: name (lowercase, no trailing dot) → addresses; a name it does
/// not know is NXDOMAIN. It counts the questions it gets, by name and type.
pub(crate) struct Stub {
    pub(crate) addr: SocketAddr,
    pub(crate) asked: Arc<Mutex<HashMap<(String, RecordType), usize>>>,
}

impl Stub {
    pub(crate) async fn start(zone: &[(&str, &[IpAddr])], ttl: u32) -> Stub {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        Stub::serve(socket, zone, ttl)
    }

    /// Answers on `socket`.
    fn serve(socket: tokio::net::UdpSocket, zone: &[(&str, &[IpAddr])], ttl: u32) -> Stub {
        let addr = socket.local_addr().expect("addr");
        let zone: HashMap<String, Vec<IpAddr>> =
            zone.iter().map(|(n, ips)| (n.to_string(), ips.to_vec())).collect();
        let asked = Arc::new(Mutex::new(HashMap::new()));
        let counts = asked.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else { return };
                if let Some(bytes) = answer(&zone, &counts, &buf[..n], ttl) {
                    let _ = socket.send_to(&bytes, from).await;
                }
            }
        });
        Stub { addr, asked }
    }

    /// The same zone over TLS (RFC 7858: a 2-byte length before each message), with the
    /// certificate `chain`/`key`.
    pub(crate) async fn start_tls(
        zone: &[(&str, &[IpAddr])],
        ttl: u32,
        chain: &std::path::Path,
        key: &std::path::Path,
    ) -> Stub {
        Stub::start_tcp(zone, ttl, chain, key, false).await
    }

    /// The same zone over HTTPS (RFC 8484: HTTP/2, POST /dns-query, application/dns-message).
    pub(crate) async fn start_https(
        zone: &[(&str, &[IpAddr])],
        ttl: u32,
        chain: &std::path::Path,
        key: &std::path::Path,
    ) -> Stub {
        Stub::start_tcp(zone, ttl, chain, key, true).await
    }

    async fn start_tcp(
        zone: &[(&str, &[IpAddr])],
        ttl: u32,
        chain: &std::path::Path,
        key: &std::path::Path,
        https: bool,
    ) -> Stub {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let certified = crate::io::tls::load_certified_key(chain, key).expect("test certificate");
        let alpn: &[&[u8]] = if https { &[b"h2"] } else { &[] };
        let acceptor = tokio_rustls::TlsAcceptor::from(crate::io::tls::server_config(
            vec![(None, certified)],
            alpn,
        ));
        let zone: Arc<HashMap<String, Vec<IpAddr>>> =
            Arc::new(zone.iter().map(|(n, ips)| (n.to_string(), ips.to_vec())).collect());
        let asked = Arc::new(Mutex::new(HashMap::new()));
        let counts = asked.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { return };
                let (acceptor, zone, counts) = (acceptor.clone(), zone.clone(), counts.clone());
                tokio::spawn(async move {
                    // A client refusing the certificate ends the handshake: nothing to do.
                    let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                    if https {
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
                            let reply = ok.then(|| answer(&zone, &counts, &query, ttl)).flatten();
                            let status = if reply.is_some() { 200 } else { 400 };
                            let head = http::Response::builder()
                                .status(status)
                                .header("content-type", "application/dns-message")
                                .body(())
                                .expect("response");
                            let Ok(mut send) = respond.send_response(head, false) else { continue };
                            let _ = send.send_data(reply.unwrap_or_default().into(), true);
                        }
                    } else {
                        loop {
                            let mut len = [0u8; 2];
                            if tls.read_exact(&mut len).await.is_err() {
                                return;
                            }
                            let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
                            if tls.read_exact(&mut query).await.is_err() {
                                return;
                            }
                            let Some(reply) = answer(&zone, &counts, &query, ttl) else { return };
                            let mut out = (reply.len() as u16).to_be_bytes().to_vec();
                            out.extend_from_slice(&reply);
                            if tls.write_all(&out).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        Stub { addr, asked }
    }

    pub(crate) fn asked(&self, name: &str, kind: RecordType) -> usize {
        self.asked.lock().expect("counts").get(&(name.to_string(), kind)).copied().unwrap_or(0)
    }
}

/// The reply to `query` from `zone`, counting the question.
fn answer(
    zone: &HashMap<String, Vec<IpAddr>>,
    counts: &Mutex<HashMap<(String, RecordType), usize>>,
    query: &[u8],
    ttl: u32,
) -> Option<Vec<u8>> {
    let query = Message::from_vec(query).ok()?;
    let mut reply = Message::response(query.metadata.id, query.metadata.op_code);
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    for q in &query.queries {
        let name = q.name().to_ascii().trim_end_matches('.').to_ascii_lowercase();
        *counts.lock().expect("counts").entry((name.clone(), q.query_type())).or_insert(0) += 1;
        reply.add_query(q.clone());
        match zone.get(&name) {
            None => reply.metadata.response_code = ResponseCode::NXDomain,
            Some(ips) => {
                for ip in ips {
                    let rdata = match (ip, q.query_type()) {
                        (IpAddr::V4(v4), RecordType::A) => RData::A(A(*v4)),
                        (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(*v6)),
                        _ => continue,
                    };
                    reply.add_answer(Record::from_rdata(q.name().clone(), ttl, rdata));
                }
            }
        }
    }
    reply.to_vec().ok()
}

fn dns(servers: &[SocketAddr]) -> Dns {
    Dns {
        servers: servers.iter().map(|s| s.to_string()).collect(),
        timeout: Duration::from_millis(500),
        attempts: 1,
        ttl_min: Duration::ZERO,
        ..Dns::default()
    }
}

/// A resolver with the files as `policy::dns::System` reads them.
fn resolver(cfg: Dns) -> Resolver {
    let system = crate::policy::dns::System::read(&cfg).expect("files");
    Resolver::new(cfg, Arc::new(system))
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

#[tokio::test]
async fn answers_and_honours_the_ttl() {
    let stub = Stub::start(&[("a.test", &[ip("192.0.2.1")])], 1).await;
    let r = resolver(Dns { prefer: Prefer::Ipv4, ..dns(&[stub.addr]) });
    assert_eq!(&*r.resolve("a.test").await.expect("found"), &[ip("192.0.2.1")]);
    assert_eq!(&*r.resolve("a.test").await.expect("cached"), &[ip("192.0.2.1")]);
    assert_eq!(stub.asked("a.test", RecordType::A), 1, "the second from the cache");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    r.resolve("a.test").await.expect("found again");
    assert_eq!(stub.asked("a.test", RecordType::A), 2, "asked again once the TTL ran out");
}

#[tokio::test]
async fn the_ttl_floor_and_ceiling() {
    let stub = Stub::start(&[("a.test", &[ip("192.0.2.1")])], 1).await;
    let floor = Duration::from_secs(60);
    let r = resolver(Dns { prefer: Prefer::Ipv4, ttl_min: floor, ..dns(&[stub.addr]) });
    r.resolve("a.test").await.expect("found");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    r.resolve("a.test").await.expect("cached");
    assert_eq!(stub.asked("a.test", RecordType::A), 1, "kept for the floor, not the TTL");

    let stub = Stub::start(&[("a.test", &[ip("192.0.2.1")])], 3600).await;
    let r = resolver(Dns {
        prefer: Prefer::Ipv4,
        ttl_max: Duration::from_secs(1),
        ..dns(&[stub.addr])
    });
    r.resolve("a.test").await.expect("found");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    r.resolve("a.test").await.expect("found");
    assert_eq!(stub.asked("a.test", RecordType::A), 2, "kept for the ceiling, not the TTL");
}

#[tokio::test]
async fn negative_answers_are_cached() {
    let stub = Stub::start(&[], 60).await;
    let r = resolver(Dns {
        prefer: Prefer::Ipv4,
        negative_ttl: Duration::from_secs(1),
        ..dns(&[stub.addr])
    });
    let e = r.resolve("nope.test").await.expect_err("no such name");
    assert_eq!(&*e, "no such name");
    let asked = stub.asked("nope.test", RecordType::A);
    assert!(asked >= 1);
    r.resolve("nope.test").await.expect_err("cached");
    assert_eq!(stub.asked("nope.test", RecordType::A), asked, "from the negative cache");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    r.resolve("nope.test").await.expect_err("again");
    assert!(stub.asked("nope.test", RecordType::A) > asked, "asked again after negative_ttl");
}

#[tokio::test]
async fn one_query_for_a_hundred_concurrent_lookups() {
    let stub = Stub::start(&[("a.test", &[ip("192.0.2.1"), ip("2001:db8::1")])], 60).await;
    let r = resolver(dns(&[stub.addr]));
    let lookups: Vec<_> = (0..100).map(|_| r.resolve("a.test")).collect();
    let answers = futures_util::future::join_all(lookups).await;
    for a in answers {
        assert_eq!(a.expect("found").len(), 2);
    }
    assert_eq!(stub.asked("a.test", RecordType::A), 1);
    assert_eq!(stub.asked("a.test", RecordType::AAAA), 1);
    assert_eq!(r.cached(), 1);
}

#[tokio::test]
async fn a_lookup_outlives_the_request_that_started_it() {
    let stub = Stub::start(&[("a.test", &[ip("192.0.2.1")])], 60).await;
    let r = resolver(Dns { prefer: Prefer::Ipv4, ..dns(&[stub.addr]) });
    // The first request gives up at once; the second, waiting on the same lookup, drives it.
    let mut first = Box::pin(r.resolve("a.test"));
    let second = r.resolve("a.test");
    assert!(futures_util::poll!(first.as_mut()).is_pending());
    drop(first);
    assert_eq!(&*second.await.expect("found"), &[ip("192.0.2.1")]);
    assert_eq!(stub.asked("a.test", RecordType::A), 1);
}

#[tokio::test]
async fn static_hosts_ask_no_server() {
    let stub = Stub::start(&[("a.test", &[ip("192.0.2.1")])], 60).await;
    let mut cfg = dns(&[stub.addr]);
    cfg.hosts.insert("Pinned.Test".into(), vec![ip("192.0.2.9"), ip("2001:db8::9")]);
    let r = resolver(cfg);
    assert_eq!(
        &*r.resolve("pinned.test").await.expect("static"),
        &[ip("192.0.2.9"), ip("2001:db8::9")]
    );
    assert_eq!(r.resolve("PINNED.test.").await.expect("static").len(), 2);
    assert_eq!(stub.asked("pinned.test", RecordType::A), 0);
    assert_eq!(stub.asked("pinned.test", RecordType::AAAA), 0);
}

#[tokio::test]
async fn prefer_asks_one_family_first() {
    let zone: &[(&str, &[IpAddr])] = &[
        ("both.test", &[ip("192.0.2.1"), ip("2001:db8::1")]),
        ("v6only.test", &[ip("2001:db8::6")]),
    ];
    let stub = Stub::start(zone, 60).await;
    let v4 = resolver(Dns { prefer: Prefer::Ipv4, ..dns(&[stub.addr]) });
    assert_eq!(&*v4.resolve("both.test").await.expect("v4"), &[ip("192.0.2.1")]);
    assert_eq!(stub.asked("both.test", RecordType::AAAA), 0, "AAAA not asked: A answered");
    assert_eq!(&*v4.resolve("v6only.test").await.expect("falls back"), &[ip("2001:db8::6")]);

    let stub = Stub::start(zone, 60).await;
    let v6 = resolver(Dns { prefer: Prefer::Ipv6, ..dns(&[stub.addr]) });
    assert_eq!(&*v6.resolve("both.test").await.expect("v6"), &[ip("2001:db8::1")]);
    assert_eq!(stub.asked("both.test", RecordType::A), 0, "A not asked: AAAA answered");

    let auto = resolver(dns(&[stub.addr]));
    assert_eq!(auto.resolve("both.test").await.expect("both").len(), 2, "auto: both families");
}

#[tokio::test]
async fn a_dead_server_then_a_live_one() {
    // A port nothing listens on: the kernel refuses at once (ICMP port unreachable).
    let dead = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let dead_addr = dead.local_addr().expect("addr");
    drop(dead);
    let stub = Stub::start(&[("a.test", &[ip("192.0.2.1")])], 60).await;
    let r = resolver(Dns { prefer: Prefer::Ipv4, ..dns(&[dead_addr, stub.addr]) });
    let started = std::time::Instant::now();
    assert_eq!(&*r.resolve("a.test").await.expect("from the live one"), &[ip("192.0.2.1")]);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
}

#[tokio::test]
async fn no_server_answering_is_a_failure_remembered() {
    let dead = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let dead_addr = dead.local_addr().expect("addr");
    drop(dead);
    let r = resolver(Dns { prefer: Prefer::Ipv4, ..dns(&[dead_addr]) });
    r.resolve("a.test").await.expect_err("nobody answers");
    assert_eq!(r.cached(), 1);
}

#[tokio::test]
async fn the_hosts_file_answers_alone_after_the_configuration() {
    let mut cfg = dns(&[]);
    cfg.hosts.insert("pinned.test".into(), vec![ip("192.0.2.9")]);
    let file = "# comment\n127.0.0.1 localhost vm # trailing\n192.0.2.1 pinned.test\n::1 ip6-localhost\nbad line\n";
    let r = Resolver::with_hosts_file(cfg.clone(), file);
    assert_eq!(&*r.resolve("localhost").await.expect("file"), &[ip("127.0.0.1")], "no ::1 added");
    assert_eq!(&*r.resolve("VM").await.expect("file"), &[ip("127.0.0.1")]);
    assert_eq!(
        &*r.resolve("pinned.test").await.expect("config"),
        &[ip("192.0.2.9")],
        "the configuration first"
    );
    cfg.hosts.insert("both.test".into(), vec![ip("192.0.2.1"), ip("2001:db8::1")]);
    let r = Resolver::with_hosts_file(Dns { prefer: Prefer::Ipv6, ..cfg.clone() }, "");
    assert_eq!(&*r.resolve("both.test").await.expect("v6"), &[ip("2001:db8::1")]);
    let r = Resolver::with_hosts_file(Dns { prefer: Prefer::Ipv4, ..cfg }, "");
    assert_eq!(&*r.resolve("both.test").await.expect("v4"), &[ip("192.0.2.1")]);
}

/// A fresh directory with a self-signed set for `name` (`rustle cert --self-signed`'s):
/// ca.pem, NAME.pem (the chain), NAME.key.
fn certificate(name: &str, label: &str) -> (TempDir, crate::io::tls::SelfSignedFiles) {
    let dir = std::env::temp_dir().join(format!("rustle-dns-{}-{label}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let files = crate::io::tls::write_self_signed(name, &dir).expect("write_self_signed");
    (TempDir(dir), files)
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn dns_over_tls_with_a_private_ca() {
    let (_dir, files) = certificate("dns.test", "dot");
    let zone: &[(&str, &[IpAddr])] = &[("a.test", &[ip("192.0.2.1")])];
    let stub = Stub::start_tls(zone, 60, &files.chain, &files.key).await;
    let cfg = Dns {
        servers: vec![format!("tls://{}#dns.test", stub.addr)],
        ca: Some(files.ca.clone()),
        prefer: Prefer::Ipv4,
        ..dns(&[])
    };
    let r = resolver(cfg);
    assert_eq!(&*r.resolve("a.test").await.expect("over TLS"), &[ip("192.0.2.1")]);
    assert_eq!(stub.asked("a.test", RecordType::A), 1);
    let nx = r.resolve("nope.test").await.expect_err("NXDOMAIN over TLS");
    assert_eq!(&*nx, "no such name");
}

#[tokio::test]
async fn dns_over_https_with_a_private_ca() {
    let (_dir, files) = certificate("doh.test", "doh");
    let zone: &[(&str, &[IpAddr])] = &[("a.test", &[ip("192.0.2.1"), ip("2001:db8::1")])];
    let stub = Stub::start_https(zone, 60, &files.chain, &files.key).await;
    let cfg = Dns {
        servers: vec![format!("https://{}/dns-query#doh.test", stub.addr)],
        ca: Some(files.ca.clone()),
        ..dns(&[])
    };
    let r = resolver(cfg);
    assert_eq!(r.resolve("a.test").await.expect("over HTTPS").len(), 2);
    assert_eq!(stub.asked("a.test", RecordType::A), 1);
    assert_eq!(stub.asked("a.test", RecordType::AAAA), 1);
}

#[tokio::test]
async fn a_server_whose_certificate_the_ca_does_not_sign_is_refused() {
    let (_d1, server) = certificate("dns.test", "wrong-server");
    let (_d2, other) = certificate("dns.test", "wrong-other");
    let zone: &[(&str, &[IpAddr])] = &[("a.test", &[ip("192.0.2.1")])];
    let dot = Stub::start_tls(zone, 60, &server.chain, &server.key).await;
    let doh = Stub::start_https(zone, 60, &server.chain, &server.key).await;
    for server in [format!("tls://{}#dns.test", dot.addr), format!("https://{}#dns.test", doh.addr)]
    {
        let cfg = Dns { servers: vec![server.clone()], ca: Some(other.ca.clone()), ..dns(&[]) };
        let err = resolver(cfg).resolve("a.test").await.expect_err("not trusted");
        assert!(err.contains("the certificate of dns.test is refused"), "{server}: {err}");
    }
    assert_eq!(dot.asked("a.test", RecordType::A), 0);
    assert_eq!(doh.asked("a.test", RecordType::A), 0);
}

/// Port 53 on a loopback address of the test's own (resolv.conf names no port): a stub
/// there, or None when the port cannot be had (not root, or taken).
async fn stub_on_port_53(ip: &str, zone: &[(&str, &[IpAddr])]) -> Option<Stub> {
    let addr: SocketAddr = format!("{ip}:53").parse().expect("addr");
    let socket = tokio::net::UdpSocket::bind(addr).await.ok()?;
    Some(Stub::serve(socket, zone, 60))
}

#[tokio::test]
async fn the_files_as_the_policy_read_them() {
    let dir =
        TempDir(std::env::temp_dir().join(format!("rustle-dns-{}-files", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let hosts = dir.0.join("hosts");
    let resolv = dir.0.join("resolv.conf");
    std::fs::write(&hosts, "192.0.2.5 from-file.test\n").expect("hosts");
    std::fs::write(&resolv, "nameserver 127.0.0.153\noptions timeout:1\n").expect("resolv.conf");
    let paths = crate::policy::dns::Paths {
        hosts: hosts.to_str().expect("path"),
        resolv_conf: resolv.to_str().expect("path"),
    };
    let cfg = Dns { prefer: Prefer::Ipv4, ..dns(&[]) };
    let system = crate::policy::dns::System::read_from(&cfg, &paths).expect("files");
    assert!(matches!(&system.resolv_conf, Some(Ok(text)) if text.starts_with(b"nameserver")));
    let r = Resolver::new(cfg.clone(), Arc::new(system));
    assert_eq!(&*r.resolve("from-file.test").await.expect("hosts file"), &[ip("192.0.2.5")]);
    // The server resolv.conf names (port 53, where the test may bind it).
    let zone: &[(&str, &[IpAddr])] = &[("a.test", &[ip("192.0.2.1")])];
    if let Some(stub) = stub_on_port_53("127.0.0.153", zone).await {
        assert_eq!(&*r.resolve("a.test").await.expect("via resolv.conf"), &[ip("192.0.2.1")]);
        assert_eq!(stub.asked("a.test", RecordType::A), 1);
    } else {
        eprintln!("PART SKIPPED the_files_as_the_policy_read_them: cannot bind 127.0.0.153:53");
    }
    // /etc/resolv.conf missing: a failure to read it, the fallback server, no panic.
    std::fs::remove_file(&resolv).expect("remove");
    let system = crate::policy::dns::System::read_from(&cfg, &paths).expect("files");
    assert!(matches!(&system.resolv_conf, Some(Err(e)) if e.contains("resolv.conf")));
    // With servers configured, resolv.conf is not read at all.
    let system = crate::policy::dns::System::read_from(&dns(&[ip_port()]), &paths).expect("files");
    assert!(system.resolv_conf.is_none());
}

fn ip_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9))
}

#[tokio::test]
async fn names_dns_cannot_carry_are_refused_before_the_cache() {
    let stub = Stub::start(&[], 60).await;
    let r = resolver(dns(&[stub.addr]));
    let long = format!("{}.test", vec!["a".repeat(60); 5].join("."));
    assert!(long.len() > 253);
    let e = r.resolve(&long).await.expect_err("too long");
    assert_eq!(&*e, "name longer than 253 bytes");
    let e = r.resolve(&format!("{}.test", "b".repeat(64))).await.expect_err("label");
    assert_eq!(&*e, "label longer than 63 bytes");
    assert_eq!(&*r.resolve("a..test").await.expect_err("empty"), "empty label");
    assert_eq!(r.cached(), 0);
    assert!(stub.asked.lock().expect("counts").is_empty(), "no question asked");
    // The longest names DNS allows are asked.
    let longest = format!("{}.{}", vec!["c".repeat(63); 3].join("."), "d".repeat(61));
    assert_eq!(longest.len(), 253);
    assert_eq!(&*r.resolve(&format!("{longest}.")).await.expect_err("asked"), "no such name");
}

#[tokio::test]
async fn the_cache_never_holds_more_than_its_bound() {
    let stub = Stub::start(&[], 60).await;
    let cfg =
        Dns { prefer: Prefer::Ipv4, negative_ttl: Duration::from_secs(60), ..dns(&[stub.addr]) };
    let r = resolver(cfg).with_max_names(32);
    for i in 0..100 {
        r.resolve(&format!("n{i}.test")).await.expect_err("no such name");
        assert!(r.cached() <= 32, "{} names after {i}", r.cached());
    }
    // The latest answers are the ones kept.
    r.resolve("n99.test").await.expect_err("cached");
    assert_eq!(stub.asked("n99.test", RecordType::A), 1);
}

#[tokio::test]
async fn lookups_in_flight_count_against_the_bound() {
    // A server that never answers.
    let silent = tokio::net::UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let addr = silent.local_addr().expect("addr");
    let r = resolver(Dns { prefer: Prefer::Ipv4, ..dns(&[addr]) }).with_max_names(4);
    let names: Vec<String> = (0..10).map(|i| format!("p{i}.test")).collect();
    let mut waiting: Vec<_> = names.iter().map(|n| Box::pin(r.resolve(n))).collect();
    for w in &mut waiting {
        assert!(futures_util::poll!(w.as_mut()).is_pending());
    }
    assert_eq!(r.cached(), 4, "four kept; the others run without a place in the cache");
    drop(waiting);
    r.sweep(std::time::Instant::now());
    assert_eq!(r.cached(), 0, "lookups nobody waits on are swept");
}

#[tokio::test]
async fn expired_answers_are_swept_on_the_tick() {
    let stub = Stub::start(&[], 60).await;
    let cfg =
        Dns { prefer: Prefer::Ipv4, negative_ttl: Duration::from_millis(200), ..dns(&[stub.addr]) };
    let r = resolver(cfg);
    for i in 0..5 {
        r.resolve(&format!("n{i}.test")).await.expect_err("no such name");
    }
    assert_eq!(r.cached(), 5);
    r.sweep(std::time::Instant::now());
    assert_eq!(r.cached(), 5, "not expired yet");
    tokio::time::sleep(Duration::from_millis(250)).await;
    r.sweep(std::time::Instant::now());
    assert_eq!(r.cached(), 0);
}

#[tokio::test]
async fn a_huge_answer_keeps_32_distinct_addresses_in_order() {
    let mut ips: Vec<IpAddr> = (1..=24).map(|i| ip(&format!("192.0.2.{i}"))).collect();
    ips.extend((1..=16).map(|i| ip(&format!("2001:db8::{i}"))));
    let mut dups = vec![ip("192.0.2.7"), ip("192.0.2.7"), ip("192.0.2.8"), ip("192.0.2.7")];
    dups.push(ip("192.0.2.8"));
    let stub = Stub::start(&[("many.test", &ips), ("dup.test", &dups)], 60).await;
    let r = resolver(Dns { prefer: Prefer::Ipv4, ..dns(&[stub.addr]) });
    let v4 = r.resolve("many.test").await.expect("found");
    assert_eq!(&*v4, &ips[..24], "fewer than the bound: all, in order");
    let r = resolver(dns(&[stub.addr]));
    let both = r.resolve("many.test").await.expect("found");
    assert_eq!(both.len(), 32);
    let distinct: std::collections::HashSet<_> = both.iter().collect();
    assert_eq!(distinct.len(), 32);
    assert_eq!(&*r.resolve("dup.test").await.expect("found"), &[ip("192.0.2.7"), ip("192.0.2.8")]);
}
