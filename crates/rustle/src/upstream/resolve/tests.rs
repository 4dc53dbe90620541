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
        let addr = socket.local_addr().expect("addr");
        let zone: HashMap<String, Vec<IpAddr>> =
            zone.iter().map(|(n, ips)| (n.to_string(), ips.to_vec())).collect();
        let asked = Arc::new(Mutex::new(HashMap::new()));
        let counts = asked.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else { return };
                let Ok(query) = Message::from_vec(&buf[..n]) else { continue };
                let mut reply = Message::response(query.metadata.id, query.metadata.op_code);
                reply.metadata.recursion_desired = query.metadata.recursion_desired;
                reply.metadata.recursion_available = true;
                for q in &query.queries {
                    let name = q.name().to_ascii().trim_end_matches('.').to_ascii_lowercase();
                    *counts
                        .lock()
                        .expect("counts")
                        .entry((name.clone(), q.query_type()))
                        .or_insert(0) += 1;
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
                if let Ok(bytes) = reply.to_vec() {
                    let _ = socket.send_to(&bytes, from).await;
                }
            }
        });
        Stub { addr, asked }
    }

    pub(crate) fn asked(&self, name: &str, kind: RecordType) -> usize {
        self.asked.lock().expect("counts").get(&(name.to_string(), kind)).copied().unwrap_or(0)
    }
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

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

#[tokio::test]
async fn answers_and_honours_the_ttl() {
    let stub = Stub::start(&[("a.test", &[ip("192.0.2.1")])], 1).await;
    let r = Resolver::new(Dns { prefer: Prefer::Ipv4, ..dns(&[stub.addr]) });
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
    let r = Resolver::new(Dns { prefer: Prefer::Ipv4, ttl_min: floor, ..dns(&[stub.addr]) });
    r.resolve("a.test").await.expect("found");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    r.resolve("a.test").await.expect("cached");
    assert_eq!(stub.asked("a.test", RecordType::A), 1, "kept for the floor, not the TTL");

    let stub = Stub::start(&[("a.test", &[ip("192.0.2.1")])], 3600).await;
    let r = Resolver::new(Dns {
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
    let r = Resolver::new(Dns {
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
    let r = Resolver::new(dns(&[stub.addr]));
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
    let r = Resolver::new(Dns { prefer: Prefer::Ipv4, ..dns(&[stub.addr]) });
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
    let r = Resolver::new(cfg);
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
    let v4 = Resolver::new(Dns { prefer: Prefer::Ipv4, ..dns(&[stub.addr]) });
    assert_eq!(&*v4.resolve("both.test").await.expect("v4"), &[ip("192.0.2.1")]);
    assert_eq!(stub.asked("both.test", RecordType::AAAA), 0, "AAAA not asked: A answered");
    assert_eq!(&*v4.resolve("v6only.test").await.expect("falls back"), &[ip("2001:db8::6")]);

    let stub = Stub::start(zone, 60).await;
    let v6 = Resolver::new(Dns { prefer: Prefer::Ipv6, ..dns(&[stub.addr]) });
    assert_eq!(&*v6.resolve("both.test").await.expect("v6"), &[ip("2001:db8::1")]);
    assert_eq!(stub.asked("both.test", RecordType::A), 0, "A not asked: AAAA answered");

    let auto = Resolver::new(dns(&[stub.addr]));
    assert_eq!(auto.resolve("both.test").await.expect("both").len(), 2, "auto: both families");
}

#[tokio::test]
async fn a_dead_server_then_a_live_one() {
    // A port nothing listens on: the kernel refuses at once (ICMP port unreachable).
    let dead = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let dead_addr = dead.local_addr().expect("addr");
    drop(dead);
    let stub = Stub::start(&[("a.test", &[ip("192.0.2.1")])], 60).await;
    let r = Resolver::new(Dns { prefer: Prefer::Ipv4, ..dns(&[dead_addr, stub.addr]) });
    let started = std::time::Instant::now();
    assert_eq!(&*r.resolve("a.test").await.expect("from the live one"), &[ip("192.0.2.1")]);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
}

#[tokio::test]
async fn no_server_answering_is_a_failure_remembered() {
    let dead = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let dead_addr = dead.local_addr().expect("addr");
    drop(dead);
    let r = Resolver::new(Dns { prefer: Prefer::Ipv4, ..dns(&[dead_addr]) });
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
