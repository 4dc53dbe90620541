//! Property tests of route choice, through the configuration text, `Routes::build` and
//! `Routes::choose`: the first route whose conditions all hold is chosen, a route without
//! conditions holds for every request (so nothing after it is ever chosen), and no route
//! holding means direct.

use std::net::{IpAddr, Ipv4Addr};

use proptest::prelude::*;

use super::{Choice, Routes};
use crate::acl::{Protocol, Request};
use crate::config::Config;

fn config() -> ProptestConfig {
    ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() }
}

/// One generated route: its conditions (absent: any), and whether it denies or goes direct.
#[derive(Debug, Clone)]
struct Spec {
    /// (network, prefix) of `clients`, inside 10.0.0.0/8 so that clients often match.
    clients: Option<(u32, u8)>,
    /// `ports`: an inclusive range of small ports, so that requests often match.
    ports: Option<(u16, u16)>,
    deny: bool,
}

fn spec() -> impl Strategy<Value = Spec> {
    let clients = proptest::option::of((any::<u32>(), 8u8..=32));
    let ports = proptest::option::of((1u16..40, 0u16..10));
    (clients, ports, any::<bool>()).prop_map(|(clients, ports, deny)| Spec {
        clients: clients.map(|(a, p)| {
            let mask = u32::MAX.checked_shl(32 - u32::from(p)).unwrap_or(0);
            ((0x0a00_0000 | (a & 0x00ff_ffff)) & mask, p)
        }),
        ports: ports.map(|(lo, len)| (lo, lo + len)),
        deny,
    })
}

fn text(specs: &[Spec]) -> String {
    let mut t = String::new();
    for (i, s) in specs.iter().enumerate() {
        t.push_str(&format!("[[route]]\nname = \"r{i}\"\n"));
        if let Some((net, p)) = s.clients {
            t.push_str(&format!("clients = [\"{}/{p}\"]\n", Ipv4Addr::from(net)));
        }
        if let Some((lo, hi)) = s.ports {
            t.push_str(&format!("ports = [\"{lo}-{hi}\"]\n"));
        }
        t.push_str(if s.deny { "via = \"deny\"\n" } else { "via = \"direct\"\n" });
    }
    t
}

fn holds(s: &Spec, client: u32, port: u16) -> bool {
    let client_ok = s.clients.is_none_or(|(net, p)| {
        let mask = u32::MAX.checked_shl(32 - u32::from(p)).unwrap_or(0);
        client & mask == net
    });
    client_ok && s.ports.is_none_or(|(lo, hi)| (lo..=hi).contains(&port))
}

fn request(client: u32, port: u16) -> Request<'static> {
    Request {
        listener: None,
        client: IpAddr::V4(Ipv4Addr::from(client)),
        user: None,
        groups: &[],
        host: "example.com",
        port,
        protocol: Protocol::Connect,
        dest: Some(IpAddr::V4(Ipv4Addr::new(203, 0, 113, 5))),
        params: None,
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_first_route_that_holds_is_chosen(
        specs in proptest::collection::vec(spec(), 0..7),
        client_low in 0u32..0x0100_0000,
        port in 1u16..50,
    ) {
        let text = text(&specs);
        let cfg = Config::parse(&text).unwrap_or_else(|p| panic!("{p:#?}\n{text}"));
        let routes = Routes::build(&cfg, &[]).unwrap_or_else(|p| panic!("{p:#?}\n{text}"));
        let client = 0x0a00_0000 | client_low;
        let names: Vec<String> = (0..specs.len()).map(|i| format!("r{i}")).collect();
        let expected = match specs.iter().position(|s| holds(s, client, port)) {
            None => Choice::Direct { route: None, egress: None },
            Some(i) if specs[i].deny => Choice::Deny { route: &names[i] },
            Some(i) => Choice::Direct { route: Some(&names[i]), egress: None },
        };
        let req = request(client, port);
        prop_assert_eq!(routes.choose(&req), expected, "{}", text);
        // None of these routes names a destination, so the choice needs no address.
        prop_assert_eq!(routes.choose(&Request { dest: None, ..req }), expected);
        // A route without conditions holds for everything: no later route is chosen.
        if let Some(k) = specs.iter().position(|s| s.clients.is_none() && s.ports.is_none()) {
            let chosen = match routes.choose(&req) {
                Choice::Direct { route: Some(r), .. } | Choice::Deny { route: r } => Some(r),
                _ => None,
            };
            let index = chosen.and_then(|r| names.iter().position(|n| n == r));
            prop_assert!(index.is_some_and(|i| i <= k), "{:?} after r{}", chosen, k);
        }
    }
}
