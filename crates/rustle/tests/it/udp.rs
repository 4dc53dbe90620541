//! UDP: SOCKS5 UDP ASSOCIATE (a hand-written client using the SOCKS5 UDP header) and the
//! UDP port relay, both against a `UdpEcho`.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rustle::config::ListenerKind;
use rustle_bench::pattern::pattern;
use rustle_bench::UdpEcho;

use crate::util::socks::*;
use crate::util::*;

/// How long a test waits to conclude that no datagram is coming.
const SILENCE: Duration = Duration::from_millis(300);

/// A UDP association: the TCP control connection and the relay address from the reply.
struct Assoc {
    control: TcpStream,
    relay: SocketAddr,
}

/// UDP ASSOCIATE, declaring `declared` as where datagrams will come from.
fn associate(proxy: &Proxy, declared: SocketAddr) -> Assoc {
    let (control, rep, relay) = open5(proxy.addr(), UDP_ASSOCIATE, &Dst::Addr(declared));
    assert_eq!(rep, 0, "UDP ASSOCIATE reply");
    assert_eq!(relay.ip().to_string(), "127.0.0.1", "relay address {relay}");
    assert_ne!(relay.port(), 0);
    Assoc { control, relay }
}

const SIZES: [usize; 7] = [1, 2, 100, 1400, 9000, 30_000, 60 * 1024];

/// Each size goes out and comes back intact, with a header naming the echo.
fn echo_sizes(proxy: &Proxy, echo: &UdpEcho) -> Assoc {
    let a = associate(proxy, "0.0.0.0:0".parse().unwrap());
    let sock = udp_client();
    for n in SIZES {
        let payload = pattern(n);
        sock.send_to(&datagram(echo.addr(), &payload), a.relay).unwrap();
        let (from, got) = recv_via(&sock, a.relay);
        assert_eq!(from, echo.addr(), "the header names the echo's address");
        assert_eq!(got.len(), n);
        assert!(got == payload, "payload of {n} bytes differs");
    }
    assert_eq!(echo.datagrams(), SIZES.len() as u64);
    a
}

#[test]
fn udp_associate_echoes_every_size_ipv4() {
    let echo = UdpEcho::start().unwrap();
    let proxy = Proxy::socks();
    let a = echo_sizes(&proxy, &echo);
    drop(a);
    let total: usize = SIZES.iter().sum();
    let line = proxy.log_line(|l| l.contains(" UDP "));
    let f = LogLine::parse(&line);
    assert_eq!((f.status, f.up, f.down), (0, total as u64, total as u64), "{line}");
}

#[test]
fn udp_associate_echoes_every_size_ipv6() {
    if !ipv6_available() {
        return;
    }
    let echo = UdpEcho::start_on("[::1]:0".parse().unwrap()).unwrap();
    let proxy = Proxy::socks();
    echo_sizes(&proxy, &echo);
}

#[test]
fn udp_associate_to_a_domain_name() {
    // The echo listens where `localhost` resolves first, as the proxy will pick that.
    use std::net::ToSocketAddrs;
    let first = ("localhost", 0).to_socket_addrs().unwrap().next().expect("localhost resolves");
    let echo = UdpEcho::start_on(first).unwrap();
    let proxy = Proxy::socks();
    let a = associate(&proxy, "0.0.0.0:0".parse().unwrap());
    let sock = udp_client();
    let mut d = vec![0, 0, 0];
    d.extend_from_slice(&addr5(&Dst::Name("localhost", echo.addr().port())));
    d.extend_from_slice(b"by name");
    sock.send_to(&d, a.relay).unwrap();
    let (from, got) = recv_via(&sock, a.relay);
    assert_eq!(got, b"by name");
    assert_eq!(from, echo.addr(), "the reply header names the address that answered");
}

#[test]
fn udp_associate_drops_fragments() {
    let echo = UdpEcho::start().unwrap();
    let proxy = Proxy::socks();
    let a = associate(&proxy, "0.0.0.0:0".parse().unwrap());
    let sock = udp_client();
    let mut d = datagram(echo.addr(), b"fragment");
    d[2] = 1;
    sock.send_to(&d, a.relay).unwrap();
    assert_eq!(recv_raw(&sock, SILENCE), None, "a fragment was relayed");
    assert_eq!(echo.datagrams(), 0);
    sock.send_to(&datagram(echo.addr(), b"whole"), a.relay).unwrap();
    assert_eq!(recv_via(&sock, a.relay).1, b"whole");
    assert_eq!(echo.datagrams(), 1);
}

#[test]
fn udp_associate_drops_datagrams_too_short_for_their_header() {
    let echo = UdpEcho::start().unwrap();
    let proxy = Proxy::socks();
    let a = associate(&proxy, "0.0.0.0:0".parse().unwrap());
    let sock = udp_client();
    let full = datagram(echo.addr(), b"");
    for cut in [full[..2].to_vec(), full[..6].to_vec(), full[..full.len() - 1].to_vec()] {
        sock.send_to(&cut, a.relay).unwrap();
    }
    // A domain header whose name runs past the end.
    sock.send_to(&[0, 0, 0, 3, 20, b'l', b'o'], a.relay).unwrap();
    assert_eq!(recv_raw(&sock, SILENCE), None, "a truncated datagram got an answer");
    assert_eq!(echo.datagrams(), 0);
    sock.send_to(&datagram(echo.addr(), b"fine"), a.relay).unwrap();
    assert_eq!(recv_via(&sock, a.relay), (echo.addr(), b"fine".to_vec()));
}

/// With `declare(port)` as the declared address, a datagram from another local port is
/// dropped and one from the declared port is relayed.
fn only_the_declared_port(declare: impl FnOnce(u16) -> SocketAddr) {
    let echo = UdpEcho::start().unwrap();
    let proxy = Proxy::socks();
    let sock = udp_client();
    let other = udp_client();
    let a = associate(&proxy, declare(sock.local_addr().unwrap().port()));
    other.send_to(&datagram(echo.addr(), b"intruder"), a.relay).unwrap();
    assert_eq!(recv_raw(&other, SILENCE), None, "a datagram from another port was relayed");
    assert_eq!(echo.datagrams(), 0, "a datagram from another port reached the echo");
    sock.send_to(&datagram(echo.addr(), b"owner"), a.relay).unwrap();
    assert_eq!(recv_via(&sock, a.relay), (echo.addr(), b"owner".to_vec()));
    assert_eq!(echo.datagrams(), 1);
}

#[test]
fn udp_associate_drops_datagrams_from_an_undeclared_port() {
    only_the_declared_port(|port| SocketAddr::from(([127, 0, 0, 1], port)));
}

/// RFC 1928: a client that knows its port but not its address sends 0.0.0.0 with the port
/// (a socket bound to INADDR_ANY knows only its port); the port is still a declaration.
#[test]
fn udp_associate_honours_a_declared_port_with_an_unspecified_address() {
    only_the_declared_port(|port| SocketAddr::from(([0, 0, 0, 0], port)));
}

#[test]
fn udp_association_ends_with_its_control_connection() {
    let echo = UdpEcho::start().unwrap();
    let proxy = Proxy::socks();
    let a = associate(&proxy, "0.0.0.0:0".parse().unwrap());
    let sock = udp_client();
    let mut sent = 0u64;
    for i in 0..5 {
        let payload = pattern(100 * (i + 1));
        sock.send_to(&datagram(echo.addr(), &payload), a.relay).unwrap();
        assert_eq!(recv_via(&sock, a.relay).1, payload);
        sent += payload.len() as u64;
    }
    drop(a.control);
    let line = proxy.log_line(|l| l.contains(" UDP "));
    let f = LogLine::parse(&line);
    assert_eq!((f.up, f.down), (sent, sent), "{line}");
    assert!(f.error.is_empty(), "{line}");
    // The relay port no longer answers.
    sock.send_to(&datagram(echo.addr(), b"too late"), a.relay).unwrap();
    assert_eq!(recv_raw(&sock, SILENCE), None, "the relay still answers after the close");
    assert_eq!(echo.datagrams(), 5);
    assert_eq!(echo.bytes(), sent);
}

#[test]
fn udp_relay_keeps_two_clients_apart() {
    let echo = UdpEcho::start().unwrap();
    let proxy = Proxy::with_listener(ListenerKind::UdpRelay, Some(echo.addr()), |c| {
        c.timeouts.udp_idle = Duration::from_millis(300)
    });
    assert_eq!(proxy.addrs()[0].0, ListenerKind::UdpRelay);
    let relay = proxy.addr();
    let a = udp_client();
    let b = udp_client();
    let mut sent = [0u64; 2];
    for i in 0..6usize {
        for (k, sock) in [&a, &b].into_iter().enumerate() {
            let mut payload = vec![b'A' + k as u8; 1 + i * 1000 + k];
            payload[0] = i as u8;
            sock.send_to(&payload, relay).unwrap();
            sent[k] += payload.len() as u64;
        }
        for (k, sock) in [&a, &b].into_iter().enumerate() {
            let (from, got) = recv_raw(sock, Duration::from_secs(3)).expect("an echo");
            assert_eq!(from, relay, "the echo comes back from the relay's address");
            assert_eq!(got.len(), 1 + i * 1000 + k, "client {k}, datagram {i}");
            assert_eq!(got[0], i as u8);
            assert!(got[1..].iter().all(|&c| c == b'A' + k as u8), "client {k} got another's");
        }
    }
    let last = Instant::now();
    assert_eq!(echo.datagrams(), 12);
    for (k, sock) in [&a, &b].into_iter().enumerate() {
        let client = sock.local_addr().unwrap().to_string();
        let line = proxy.log_line(|l| l.contains(" UDP ") && l.contains(&client));
        let waited = last.elapsed();
        let f = LogLine::parse(&line);
        assert_eq!(f.target, format!("udp://{}", echo.addr()), "{line}");
        assert_eq!((f.up, f.down), (sent[k], sent[k]), "{line}");
        assert!(f.error.is_empty(), "{line}");
        if k == 0 {
            assert!(waited >= Duration::from_millis(250), "logged after {waited:?}, idle 300 ms");
        }
    }
}

#[test]
fn silent_udp_association_ends_after_udp_idle() {
    let proxy = Proxy::with_listener(ListenerKind::Socks, None, |c| {
        c.timeouts.udp_idle = Duration::from_millis(300)
    });
    let mut a = associate(&proxy, "0.0.0.0:0".parse().unwrap());
    let start = Instant::now();
    assert!(closed_within(&mut a.control, Duration::from_secs(3)), "association left open");
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(1), "{took:?}");
    let line = proxy.log_line(|l| l.contains(" UDP "));
    let f = LogLine::parse(&line);
    assert_eq!((f.up, f.down), (0, 0), "{line}");
}

#[test]
fn udp_associate_refuses_the_proxys_own_relay_sockets_as_destinations() {
    let echo = UdpEcho::start().unwrap();
    let proxy = Proxy::socks();
    let a = associate(&proxy, "0.0.0.0:0".parse().unwrap());
    let b = associate(&proxy, "0.0.0.0:0".parse().unwrap());
    let sock = udp_client();
    // A datagram for the association's own relay address, nesting one for the echo: sent
    // there, it would come back as if from the client and go on to the echo.
    let nested = datagram(a.relay, &datagram(echo.addr(), b"loop"));
    sock.send_to(&nested, a.relay).unwrap();
    // The same through another association's relay socket.
    let across = datagram(b.relay, &datagram(echo.addr(), b"across"));
    sock.send_to(&across, a.relay).unwrap();
    // And 0.0.0.0 with the relay's port, which reaches the local host too.
    let unspecified = SocketAddr::new("0.0.0.0".parse().unwrap(), a.relay.port());
    sock.send_to(&datagram(unspecified, &datagram(echo.addr(), b"any")), a.relay).unwrap();
    assert_eq!(recv_raw(&sock, SILENCE), None, "a datagram looped through the proxy");
    assert_eq!(echo.datagrams(), 0, "the nested datagram reached the echo");
    // The association still works for a real destination.
    sock.send_to(&datagram(echo.addr(), b"direct"), a.relay).unwrap();
    assert_eq!(recv_via(&sock, a.relay).1, b"direct");
    drop(b);
}

#[test]
fn udp_associate_refuses_a_wildcard_listener_on_every_address_of_the_host() {
    // An address of this host that is not loopback (the machine's own, say).
    let Some(ip) = nix::ifaddrs::getifaddrs().expect("getifaddrs").find_map(|ifa| {
        let v4 = ifa.address?.as_sockaddr_in()?.ip();
        (!v4.is_loopback()).then_some(std::net::IpAddr::V4(v4))
    }) else {
        rustle_bench::tools::skip_host("this host has no IPv4 address but loopback");
        return;
    };
    let echo = UdpEcho::start().unwrap();
    // A UDP relay listening on every address, to the echo.
    let proxy = Proxy::from_toml(&format!(
        "allow_open_proxy = true\n[[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:0\"\n\
         [[listener]]\nkind = \"udp-relay\"\nlisten = \"0.0.0.0:0\"\ntarget = \"{}\"\n",
        echo.addr()
    ));
    let relay = SocketAddr::new(ip, proxy.addr_of(1).port());
    let a = associate(&proxy, "0.0.0.0:0".parse().unwrap());
    let sock = udp_client();
    sock.send_to(&datagram(relay, b"through the relay listener"), a.relay).unwrap();
    assert_eq!(recv_raw(&sock, SILENCE), None, "a datagram came back through the relay");
    assert_eq!(echo.datagrams(), 0, "the datagram reached the relay's target");
    sock.send_to(&datagram(echo.addr(), b"direct"), a.relay).unwrap();
    assert_eq!(recv_via(&sock, a.relay).1, b"direct");
}
