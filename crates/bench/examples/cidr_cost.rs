//! CPU per access-rule address check: rustle's `acl::Cidr` (its own source, included as
//! it is) against the `ipnet` crate, over the same blocks and addresses, shaped as the
//! rule check is (`blocks.iter().any(|b| b.contains(client))`, IPv4-mapped addresses
//! taken as IPv4 by both). The two run alternately, several rounds; the figures are the
//! median and spread of nanoseconds per check.
//!
//! Built as rustle ships (the release profile: fat LTO, one codegen unit, so that
//! `ipnet`'s functions can be inlined as rustle's are):
//!
//! ```text
//! cargo run --release -p rustle-bench --example cidr_cost
//! ```
//!
//! or, without building rustle-bench's dependencies in release, the same two crates
//! alone: `rustc --crate-type rlib --crate-name ipnet --edition 2018 -C opt-level=3
//! --cfg 'feature="std"' IPNET/src/lib.rs` then `rustc --edition 2021 -C opt-level=3
//! -C lto=fat -C codegen-units=1 --extern ipnet=libipnet.rlib -L . cidr_cost.rs`.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use ipnet::IpNet;

#[allow(dead_code, unreachable_pub)]
#[path = "../../rustle/src/acl/net.rs"]
mod net;

/// What `net` asks of its sibling `local` (the host's own addresses), not used here.
mod local {
    pub(crate) fn is_local(_: std::net::IpAddr) -> bool {
        false
    }
}

/// A client rule's blocks, as a configuration would list them.
const BLOCKS: &[&str] = &[
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "203.0.113.0/24",
    "198.51.100.7",
    "2001:db8::/32",
    "fc00::/7",
];

/// Addresses checked per round.
const ADDRS: usize = 1024;
/// Passes over the addresses per round.
const PASSES: usize = 4000;
/// Rounds of each.
const ROUNDS: usize = 9;

/// A fixed pseudo-random mix: three in four IPv4 (some mapped into IPv6), about half of
/// them in a block.
fn addresses() -> Vec<IpAddr> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..ADDRS)
        .map(|_| {
            let r = next();
            let v4 = match r % 4 {
                0 => Ipv4Addr::from(0x0a00_0000 | (r >> 8) as u32 & 0x00ff_ffff),
                1 => Ipv4Addr::from(0xc0a8_0000 | (r >> 8) as u32 & 0xffff),
                _ => Ipv4Addr::from((r >> 16) as u32),
            };
            match (r >> 40) % 8 {
                0 => IpAddr::V6(v4.to_ipv6_mapped()),
                1 => IpAddr::V6(Ipv6Addr::from(0x2001_0db8_u128 << 96 | u128::from(r))),
                2 => IpAddr::V6(Ipv6Addr::from(0x2a00_u128 << 112 | u128::from(r))),
                _ => IpAddr::V4(v4),
            }
        })
        .collect()
}

/// Nanoseconds per check of `check` over `addrs`, and how many matched.
fn time(addrs: &[IpAddr], check: impl Fn(IpAddr) -> bool) -> (f64, usize) {
    let start = Instant::now();
    let mut hits = 0;
    for _ in 0..PASSES {
        for &a in addrs {
            hits += usize::from(check(black_box(a)));
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / (PASSES * addrs.len()) as f64;
    (ns, hits / PASSES)
}

fn summary(name: &str, mut v: Vec<f64>) {
    v.sort_by(f64::total_cmp);
    let median = v[v.len() / 2];
    println!(
        "{name:>12}: median {median:.2} ns per check, spread {:.2}-{:.2} ({} rounds)",
        v[0],
        v[v.len() - 1],
        v.len()
    );
}

fn main() {
    let ours: Vec<net::Cidr> = BLOCKS.iter().map(|b| b.parse().expect("block")).collect();
    let theirs: Vec<IpNet> = BLOCKS
        .iter()
        .map(|b| b.parse().or_else(|_| format!("{b}/32").parse()).expect("block"))
        .collect();
    let addrs = addresses();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let blocks = black_box(&ours);
        let (ns, hits_a) = time(&addrs, |ip| blocks.iter().any(|c| c.contains(ip)));
        a.push(ns);
        let nets = black_box(&theirs);
        let (ns, hits_b) = time(&addrs, |ip| nets.iter().any(|n| n.contains(&net::canonical(ip))));
        b.push(ns);
        assert_eq!(hits_a, hits_b, "the two disagree");
    }
    println!("{} addresses, {} blocks, {PASSES} passes a round", addrs.len(), BLOCKS.len());
    summary("acl::Cidr", a);
    summary("ipnet", b);
}
