use std::collections::HashSet;
use std::net::IpAddr;

use super::*;

fn egress(bind: &[&str], pick: Option<&str>) -> Egress {
    let cfg = EgressConfig {
        bind: bind.iter().map(|s| s.to_string()).collect(),
        pick: pick.map(Into::into),
        interface: None,
    };
    Egress::build(&cfg, 0, "r").expect("valid").expect("set")
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

/// A small deterministic generator for the draws (splitmix64 over a counter).
struct Bits(u64);

impl Bits {
    fn fresh(&mut self, turn: u64) -> Draw {
        let mut next = || {
            self.0 += 1;
            mix(self.0)
        };
        Draw::Fresh { turn, random: [next(), next(), next()] }
    }
}

fn within(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let m = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            u32::from(a) & m == u32::from(n) & m
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let m = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            u128::from(a) & m == u128::from(n) & m
        }
        _ => false,
    }
}

#[test]
fn prefix_bounds() {
    let mut bits = Bits(7);
    let cases: &[(&str, u8)] = &[
        ("2001:db8:1::", 64),
        ("2001:db8:1::5", 128),
        ("::", 0),
        ("8000::", 1),
        ("2001:db8::", 127),
        ("198.18.0.9", 32),
        ("198.18.0.0", 24),
        ("198.18.0.0", 31),
        ("198.18.0.0", 30),
        ("0.0.0.0", 0),
    ];
    for &(net, len) in cases {
        let net = ip(net);
        let mut seen = HashSet::new();
        for _ in 0..2000 {
            let Draw::Fresh { random: [_, b, c], .. } = bits.fresh(0) else { unreachable!() };
            let got = inside(net, len, (u128::from(b) << 64) | u128::from(c));
            assert!(within(got, net, len), "{got} outside {net}/{len}");
            if let (IpAddr::V4(a), Some(2..=30)) = (got, 32u32.checked_sub(u32::from(len))) {
                let host = u32::from(a) & !u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                let all = (1u64 << (32 - u32::from(len))) - 1;
                assert!(host != 0 && u64::from(host) != all, "{got}: network or broadcast");
            }
            seen.insert(got);
        }
        match (net, len) {
            (_, 32) | (IpAddr::V6(_), 128) => assert_eq!(seen.len(), 1, "{net}/{len}"),
            (IpAddr::V4(_), 31) => assert_eq!(seen.len(), 2),
            (IpAddr::V4(_), 30) => assert_eq!(seen.len(), 2, "the two host addresses of a /30"),
            (IpAddr::V4(_), 24) => assert_eq!(seen.len(), 254, "every host of a /24"),
            (IpAddr::V6(_), 127) => assert_eq!(seen.len(), 2),
            _ => assert!(seen.len() >= 1990, "{net}/{len}: {} distinct", seen.len()),
        }
    }
}

#[test]
fn a_prefix_draws_uniformly() {
    // 16 buckets by the low nibble of a /64's host part, and by the top bits of its host
    // part: each near 1/16 of 32,000 draws.
    let e = egress(&["2001:db8:1::/64"], None);
    let mut bits = Bits(1);
    let (mut low, mut high) = ([0u32; 16], [0u32; 16]);
    for _ in 0..32_000 {
        let p = e.pick(None, bits.fresh(0));
        let local = p.v6.expect("a v6 address");
        assert!(local.freebind);
        let IpAddr::V6(v6) = local.ip else { panic!("v6") };
        let host = u128::from(v6) as u64;
        low[(host & 15) as usize] += 1;
        high[(host >> 60) as usize] += 1;
    }
    for n in low.iter().chain(high.iter()) {
        assert!((1700..2300).contains(n), "{low:?} {high:?}");
    }
}

#[test]
fn a_list_picks_at_random_or_in_turn() {
    let e = egress(&["198.18.0.1", "198.18.0.2", "198.18.0.3"], None);
    let mut bits = Bits(3);
    let mut counts = [0u32; 3];
    for _ in 0..3000 {
        let ip = e.pick(None, bits.fresh(0)).v4.expect("v4").ip;
        let IpAddr::V4(v4) = ip else { panic!() };
        counts[usize::from(v4.octets()[3]) - 1] += 1;
    }
    assert!(counts.iter().all(|n| (850..1150).contains(n)), "{counts:?}");
    let rr = egress(&["198.18.0.1", "198.18.0.2", "198.18.0.3"], Some("round-robin"));
    let order: Vec<String> =
        (0..6).map(|t| rr.pick(None, bits.fresh(t)).v4.expect("v4").ip.to_string()).collect();
    assert_eq!(
        order,
        ["198.18.0.1", "198.18.0.2", "198.18.0.3", "198.18.0.1", "198.18.0.2", "198.18.0.3"]
    );
    assert!(e.varies(None) && rr.varies(None) && !e.varies(Some(1)));
    assert!(!egress(&["198.18.0.1", "2001:db8::1"], None).varies(None), "one per family");
}

#[test]
fn a_seed_picks_the_same_addresses() {
    let e = egress(&["2001:db8:1::/64", "198.18.0.0/24", "198.18.1.1"], None);
    let mut seen = HashSet::new();
    for seed in 0..200u64 {
        let a = e.pick(None, Draw::Seed(seed));
        let b = e.pick(None, Draw::Seed(seed));
        assert_eq!(a, b, "seed {seed}");
        seen.insert(a.v6.expect("v6").ip);
        seen.insert(a.v4.expect("v4").ip);
    }
    // Different seeds spread: 200 distinct /64 addresses, and about 100 of the /24 (half
    // the seeds pick the fixed address).
    assert!(seen.len() > 250, "{}", seen.len());
}

#[test]
fn same_takes_the_client_local_address_in_its_family() {
    let e = egress(&["same", "2001:db8::9"], None);
    let p = e.pick(Some(ip("198.18.0.5")), Draw::Seed(0));
    assert_eq!(p.v4.map(|l| l.ip), Some(ip("198.18.0.5")));
    assert_eq!(p.v6.map(|l| l.ip), Some(ip("2001:db8::9")));
    // A dual-stack listener's mapped address is the IPv4 one.
    let p = e.pick(Some(ip("::ffff:198.18.0.6")), Draw::Seed(0));
    assert_eq!(p.v4.map(|l| l.ip), Some(ip("198.18.0.6")));
    let p = e.pick(Some(ip("2001:db8::1")), Draw::Seed(0));
    assert_eq!((p.v4, p.v6.map(|l| l.ip)), (None, Some(ip("2001:db8::1"))));
    // No IPv4 choice: an IPv4 destination is refused; with none configured at all, any
    // family goes.
    assert_eq!(p.for_ip(ip("192.0.2.1")), Err(()));
    let open =
        Egress::build(&EgressConfig { interface: Some("lo".into()), ..Default::default() }, 0, "r")
            .expect("valid")
            .expect("set");
    assert_eq!(open.pick(None, Draw::Seed(0)).for_ip(ip("192.0.2.1")), Ok(None));
    assert!(!e.varies(None));
}
