//! Property tests of address matching, through `Cidr`'s parser and `contains` only (the
//! representation behind them is free to change): an address is in a block exactly when
//! its first `prefix` bits are the block's, and an IPv4-mapped IPv6 address is its IPv4
//! address (module notes of `net`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::Cidr;

fn config() -> ProptestConfig {
    ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() }
}

fn mask4(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask6(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

fn block(s: &str) -> Cidr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// An IPv6 address that is not IPv4-mapped.
fn v6_unmapped() -> impl Strategy<Value = u128> {
    any::<u128>().prop_filter("not IPv4-mapped", |a| Ipv6Addr::from(*a).to_ipv4_mapped().is_none())
}

/// An address that shares its first `k` bits with `near` (so that matches are common, not
/// one in 2^prefix), then random.
fn near4(near: u32, k: u8, rest: u32) -> u32 {
    (near & mask4(k)) | (rest & !mask4(k))
}

fn near6(near: u128, k: u8, rest: u128) -> u128 {
    (near & mask6(k)) | (rest & !mask6(k))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn v4_block_holds_exactly_the_addresses_with_its_prefix(
        a in any::<u32>(), prefix in 0u8..=32, k in 0u8..=32, rest in any::<u32>()
    ) {
        let net = a & mask4(prefix);
        let c = block(&format!("{}/{prefix}", Ipv4Addr::from(net)));
        let x = near4(a, k, rest);
        let same_prefix = (x ^ net) & mask4(prefix) == 0;
        prop_assert_eq!(c.contains(IpAddr::V4(Ipv4Addr::from(x))), same_prefix);
        // The mapped form of the address is the address.
        let mapped = IpAddr::V6(Ipv4Addr::from(x).to_ipv6_mapped());
        prop_assert_eq!(c.contains(mapped), same_prefix);
        // A v4 block holds no real IPv6 address.
        prop_assert!(!c.contains(IpAddr::V6(Ipv6Addr::from(u128::from(x) << 32 | 1 << 127))));
    }

    #[test]
    fn v6_block_holds_exactly_the_unmapped_addresses_with_its_prefix(
        a in v6_unmapped(), prefix in 0u8..=128, k in 0u8..=128, rest in any::<u128>()
    ) {
        let net = a & mask6(prefix);
        // A block inside ::ffff:0:0/96 is written (and parsed) as the IPv4 one.
        prop_assume!(Ipv6Addr::from(net).to_ipv4_mapped().is_none() || prefix < 96);
        let c = block(&format!("{}/{prefix}", Ipv6Addr::from(net)));
        let x = Ipv6Addr::from(near6(a, k, rest));
        let same_prefix = (u128::from(x) ^ net) & mask6(prefix) == 0;
        let expected = same_prefix && x.to_ipv4_mapped().is_none();
        prop_assert_eq!(c.contains(IpAddr::V6(x)), expected, "{} in {}", x, c);
        // An IPv6 block, even ::/0, holds no IPv4 address.
        prop_assert!(!c.contains(IpAddr::V4(Ipv4Addr::from(rest as u32))));
    }

    #[test]
    fn a_mapped_block_is_its_ipv4_block(
        a in any::<u32>(), prefix in 0u8..=32, x in any::<u32>(), k in 0u8..=32
    ) {
        let net = Ipv4Addr::from(a & mask4(prefix));
        let v4 = block(&format!("{net}/{prefix}"));
        let mapped = block(&format!("{}/{}", net.to_ipv6_mapped(), u16::from(prefix) + 96));
        for ip in [Ipv4Addr::from(near4(a, k, x)), Ipv4Addr::from(x)] {
            prop_assert_eq!(mapped.contains(IpAddr::V4(ip)), v4.contains(IpAddr::V4(ip)));
            let ip6 = IpAddr::V6(ip.to_ipv6_mapped());
            prop_assert_eq!(mapped.contains(ip6), v4.contains(ip6));
        }
    }

    #[test]
    fn host_bits_after_the_prefix_are_refused_and_one_address_is_a_full_prefix(
        a in any::<u32>(), prefix in 0u8..32, b in v6_unmapped(), prefix6 in 0u8..128
    ) {
        let v4 = Ipv4Addr::from(a);
        prop_assert_eq!(format!("{v4}/{prefix}").parse::<Cidr>().is_ok(), a & !mask4(prefix) == 0);
        let one = block(&v4.to_string());
        prop_assert!(one.contains(IpAddr::V4(v4)));
        prop_assert!(!one.contains(IpAddr::V4(Ipv4Addr::from(a ^ 1))));
        let v6 = Ipv6Addr::from(b);
        prop_assert_eq!(format!("{v6}/{prefix6}").parse::<Cidr>().is_ok(), b & !mask6(prefix6) == 0);
        let one = block(&v6.to_string());
        prop_assert!(one.contains(IpAddr::V6(v6)));
        prop_assert!(!one.contains(IpAddr::V6(Ipv6Addr::from(b ^ 1))));
    }

    #[test]
    fn a_block_written_out_parses_back_to_the_same_addresses(
        a in any::<u32>(), prefix in 0u8..=32, x in any::<u32>()
    ) {
        let c = block(&format!("{}/{prefix}", Ipv4Addr::from(a & mask4(prefix))));
        let again = block(&c.to_string());
        for ip in [a, x, a & mask4(prefix), a | !mask4(prefix)] {
            let ip = IpAddr::V4(Ipv4Addr::from(ip));
            prop_assert_eq!(again.contains(ip), c.contains(ip));
        }
    }
}
