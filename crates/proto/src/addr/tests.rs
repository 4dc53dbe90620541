//! Domain validation and Address display.
#![allow(clippy::unwrap_used)]

use super::*;
use std::net::{Ipv4Addr, Ipv6Addr};

#[test]
fn domain_accepts() {
    let long = [b'a'; 255];
    let cases: &[&[u8]] = &[b"a", b"example.com", b"EXAMPLE.com.", b"1.2.3.4", b"a-b_c~!:/", &long];
    for &c in cases {
        let d = Domain::new(c).unwrap();
        assert_eq!(d.as_bytes(), c);
        assert_eq!(d.as_str().as_bytes(), c);
        assert_eq!(d.len(), c.len());
    }
}

#[test]
fn domain_rejects() {
    let too_long = [b'a'; 256];
    let cases: &[(&str, &[u8])] = &[
        ("empty", b""),
        ("256 bytes", &too_long),
        ("space", b"a b"),
        ("leading space", b" a"),
        ("nul", b"a\0"),
        ("tab", b"a\tb"),
        ("cr lf", b"a\r\n"),
        ("del", b"a\x7f"),
        ("non-ascii", b"\xc3\xa9.com"),
        ("high byte", b"\xff"),
    ];
    for (what, c) in cases {
        assert_eq!(Domain::new(c), None, "{what}");
    }
}

#[test]
fn domain_eq_and_debug() {
    assert_eq!(Domain::new(b"a.b"), Domain::new(b"a.b"));
    assert_ne!(Domain::new(b"a.b"), Domain::new(b"a.bc"));
    assert_ne!(Domain::new(b"A.b"), Domain::new(b"a.b"));
    assert_eq!(format!("{:?}", Domain::new(b"a.b").unwrap()), "Domain(\"a.b\")");
    assert_eq!(Domain::new(b"a.b").unwrap().to_string(), "a.b");
}

#[test]
fn address_display() {
    let cases: &[(Host, u16, &str)] = &[
        (Host::Ip(Ipv4Addr::new(1, 2, 3, 4).into()), 80, "1.2.3.4:80"),
        (Host::Ip(Ipv6Addr::LOCALHOST.into()), 80, "[::1]:80"),
        (Host::Ip("2001:db8::1".parse::<Ipv6Addr>().unwrap().into()), 443, "[2001:db8::1]:443"),
        (Host::Ip("::ffff:1.2.3.4".parse::<Ipv6Addr>().unwrap().into()), 0, "[::ffff:1.2.3.4]:0"),
        (Host::Domain(Domain::new(b"example.com").unwrap()), 80, "example.com:80"),
        (Host::Domain(Domain::new(b"x").unwrap()), 65535, "x:65535"),
    ];
    for (host, port, want) in cases {
        assert_eq!(Address { host: host.clone(), port: *port }.to_string(), *want);
    }
}

#[test]
fn address_from_socket_addr() {
    let sa: SocketAddr = "[::1]:8080".parse().unwrap();
    assert_eq!(Address::from(sa), Address { host: Host::Ip(sa.ip()), port: 8080 });
}
