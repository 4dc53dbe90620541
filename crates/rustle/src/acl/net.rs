//! Addresses: CIDR blocks, private and local ranges, and the built-in destination checks.
//!
//! IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) are IPv4 addresses here: they are turned
//! into IPv4 before any comparison, so `10.0.0.0/8` matches `::ffff:10.1.2.3`, and a mapped
//! CIDR in the configuration (`::ffff:10.0.0.0/104`) is stored as the IPv4 one. An IPv6
//! block therefore only ever matches real IPv6 addresses: `::/0` is "any IPv6 address".

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The IPv4 address inside an IPv4-mapped IPv6 address, anything else unchanged.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

/// An address block: `10.0.0.0/8`, `2001:db8::/32`, or one address (`192.0.2.7`, `::1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cidr {
    V4 { net: u32, prefix: u8 },
    V6 { net: u128, prefix: u8 },
}

fn mask4(prefix: u8) -> u32 {
    // prefix is at most 32; checked_shl keeps /0 from overflowing the shift.
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask6(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

impl Cidr {
    /// Whether `ip` (mapped IPv6 taken as IPv4) is in the block.
    #[inline]
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        match (*self, canonical(ip)) {
            (Cidr::V4 { net, prefix }, IpAddr::V4(a)) => u32::from(a) & mask4(prefix) == net,
            (Cidr::V6 { net, prefix }, IpAddr::V6(a)) => u128::from(a) & mask6(prefix) == net,
            _ => false,
        }
    }

    /// The prefix length: 0 for every address of its family.
    pub(crate) fn prefix(&self) -> u8 {
        match *self {
            Cidr::V4 { prefix, .. } | Cidr::V6 { prefix, .. } => prefix,
        }
    }

    fn v4(a: Ipv4Addr, prefix: u8) -> Result<Cidr, String> {
        let bits = u32::from(a);
        let net = bits & mask4(prefix);
        if net != bits {
            return Err(format!(
                "host bits are set (the block is {}/{prefix})",
                Ipv4Addr::from(net)
            ));
        }
        Ok(Cidr::V4 { net, prefix })
    }
}

impl std::str::FromStr for Cidr {
    type Err = String;

    /// Strict: no spaces, no zone, a decimal prefix within the family's length, and no
    /// bits set after the prefix (`10.1.0.0/8` is refused as a likely mistake).
    fn from_str(s: &str) -> Result<Cidr, String> {
        let bad = |why: &str| format!("`{s}` is not an address or address/prefix: {why}");
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let ip: IpAddr = addr.parse().map_err(|_| bad("bad address"))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) if !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()) => {
                match p.parse::<u8>() {
                    Ok(n) if n <= max => n,
                    _ => return Err(bad(&format!("the prefix must be 0 to {max}"))),
                }
            }
            Some(_) => return Err(bad(&format!("the prefix must be 0 to {max}"))),
        };
        match ip {
            IpAddr::V4(a) => Cidr::v4(a, prefix).map_err(|why| bad(&why)),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) if prefix >= 96 => Cidr::v4(v4, prefix - 96).map_err(|why| bad(&why)),
                Some(_) => Err(bad("an IPv4-mapped block needs a prefix of at least 96")),
                None => {
                    let bits = u128::from(a);
                    let net = bits & mask6(prefix);
                    if net != bits {
                        let why = format!(
                            "host bits are set (the block is {}/{prefix})",
                            Ipv6Addr::from(net)
                        );
                        return Err(bad(&why));
                    }
                    Ok(Cidr::V6 { net, prefix })
                }
            },
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Cidr::V4 { net, prefix } => write!(f, "{}/{prefix}", Ipv4Addr::from(net)),
            Cidr::V6 { net, prefix } => write!(f, "{}/{prefix}", Ipv6Addr::from(net)),
        }
    }
}

/// Why `ip` is not a public destination, or None for a public one. The reasons are short
/// and fixed, for logs.
///
/// IPv4: 0.0.0.0/8 ("this network", the unspecified address among it), 127/8, 10/8,
/// 172.16/12, 192.168/16, 100.64/10 (carrier-grade NAT), 169.254/16 and the cloud metadata
/// address 169.254.169.254 in it. IPv6: `::`, `::1`, fe80::/10, fc00::/7 and the metadata
/// address fd00:ec2::254 in it; the IPv4-mapped (`::ffff:0:0/96`) and NAT64 well-known
/// prefix (`64:ff9b::/96`) forms of every IPv4 range above.
pub fn private_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(a) => private_reason_v4(a),
        IpAddr::V6(a) => {
            if let Some(v4) = a.to_ipv4_mapped() {
                return private_reason_v4(v4);
            }
            let bits = u128::from(a);
            // 64:ff9b::/96: a NAT64 gateway would carry it to the embedded IPv4 address.
            if bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000 {
                return private_reason_v4(Ipv4Addr::from(bits as u32));
            }
            if a.is_unspecified() {
                Some("unspecified destination address")
            } else if a.is_loopback() {
                Some("loopback destination")
            } else if bits >> 118 == 0xfe80 >> 6 {
                Some("link-local destination")
            } else if a == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
                Some("cloud metadata address")
            } else if bits >> 121 == 0xfc00 >> 9 {
                Some("private destination (unique local)")
            } else {
                None
            }
        }
    }
}

fn private_reason_v4(a: Ipv4Addr) -> Option<&'static str> {
    let [o1, o2, _, _] = a.octets();
    match (o1, o2) {
        (0, _) => Some("unspecified destination address"),
        (127, _) => Some("loopback destination"),
        (10, _) | (192, 168) => Some("private destination (RFC 1918)"),
        (172, 16..=31) => Some("private destination (RFC 1918)"),
        (100, 64..=127) => Some("private destination (carrier-grade NAT)"),
        (169, 254) if a == Ipv4Addr::new(169, 254, 169, 254) => Some("cloud metadata address"),
        (169, 254) => Some("link-local destination"),
        _ => None,
    }
}

/// Whether `ip` is loopback, link-local, private, unique-local, carrier-grade NAT,
/// unspecified or a cloud metadata address, in any of its forms: see [`private_reason`].
pub fn is_private(ip: IpAddr) -> bool {
    private_reason(ip).is_some()
}

/// Built-in protections, checked on each resolved destination before the rule list.
#[derive(Debug, Clone, Default)]
pub struct Builtins {
    /// Every address the proxy listens on (listeners, TCP and UDP, and the admin
    /// endpoint): connecting to one is refused (no loops, and the admin endpoint is not
    /// reachable through the proxy). An unspecified listen address (0.0.0.0 or ::) stands
    /// for every local address on that port (`local::is_local`).
    pub(crate) own_addresses: Vec<SocketAddr>,
    /// Refuse the destinations [`is_private`] names and every address of the host's own
    /// interfaces.
    pub(crate) deny_private: bool,
}

/// The reason [`Builtins::check`] gives for a loop.
pub const LOOP_REASON: &str = "the proxy's own listening address";

/// The reason [`Builtins::check`] gives for an address of the host's own interfaces that
/// no private range names (with `deny_private`).
pub const LOCAL_REASON: &str = "an address of the proxy's own host";

impl Builtins {
    /// Why connecting to `dest` is refused, or None. No allocation.
    pub(crate) fn check(&self, dest: SocketAddr) -> Option<&'static str> {
        if self.own_addresses.iter().any(|own| reaches(dest, *own)) {
            return Some(LOOP_REASON);
        }
        if self.deny_private {
            let ip = canonical(dest.ip());
            return private_reason(ip)
                .or_else(|| super::local::is_local(ip).then_some(LOCAL_REASON));
        }
        None
    }
}

/// Whether sending to `dest` reaches the local socket bound to `own`. An unspecified
/// `own` address stands for every local address on its port: loopback, unspecified, and
/// the addresses of the host's interfaces (looked up only when the ports are equal).
pub fn reaches(dest: SocketAddr, own: SocketAddr) -> bool {
    if own.port() != dest.port() {
        return false;
    }
    let ip = canonical(dest.ip());
    // Connecting to an unspecified address reaches the local host.
    let local = ip.is_loopback() || ip.is_unspecified();
    let own_ip = canonical(own.ip());
    own_ip == ip
        || (own_ip.is_unspecified() && (local || super::local::is_local(ip)))
        || (ip.is_unspecified() && own_ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn cidr_parsing() {
        let good: &[(&str, &str)] = &[
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("0.0.0.0/0", "0.0.0.0/0"),
            ("192.0.2.7/32", "192.0.2.7/32"),
            ("192.0.2.7", "192.0.2.7/32"),
            ("2001:db8::/32", "2001:db8::/32"),
            ("::/0", "::/0"),
            ("::1", "::1/128"),
            ("::1/128", "::1/128"),
            ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
            ("::ffff:192.0.2.7", "192.0.2.7/32"),
            ("::ffff:0.0.0.0/96", "0.0.0.0/0"),
        ];
        for (text, shown) in good {
            assert_eq!(cidr(text).to_string(), *shown, "{text}");
        }
        let bad = [
            "",
            "/8",
            "10.0.0.0/",
            "10.0.0.0/33",
            "10.0.0.0/-1",
            "10.0.0.0/+8",
            "10.0.0.0/08x",
            "10.0.0.0/0008",
            "::/129",
            "10.0.0/8",
            "10.0.0.256",
            "example.com",
            " 10.0.0.0/8",
            "10.0.0.0/8 ",
            "10.1.0.0/8",
            "2001:db8::1/32",
            "::ffff:10.0.0.0/64",
            "fe80::1%eth0",
            "10.0.0.0/8/8",
        ];
        for text in bad {
            assert!(text.parse::<Cidr>().is_err(), "`{text}` should be refused");
        }
    }

    #[test]
    fn host_bits_message_names_the_block() {
        let e = "10.1.2.3/8".parse::<Cidr>().expect_err("host bits");
        assert!(e.contains("10.0.0.0/8"), "{e}");
    }

    #[test]
    fn cidr_matching() {
        let table: &[(&str, &str, bool)] = &[
            ("10.0.0.0/8", "10.0.0.0", true),
            ("10.0.0.0/8", "10.255.255.255", true),
            ("10.0.0.0/8", "11.0.0.0", false),
            ("10.0.0.0/8", "9.255.255.255", false),
            ("172.16.0.0/12", "172.31.255.255", true),
            ("172.16.0.0/12", "172.32.0.0", false),
            ("0.0.0.0/0", "1.2.3.4", true),
            ("0.0.0.0/0", "255.255.255.255", true),
            ("0.0.0.0/0", "::1", false),
            ("192.0.2.7/32", "192.0.2.7", true),
            ("192.0.2.7/32", "192.0.2.8", false),
            ("192.0.2.7", "192.0.2.7", true),
            ("192.0.2.7", "192.0.2.6", false),
            // Mapped clients are IPv4 clients.
            ("10.0.0.0/8", "::ffff:10.1.2.3", true),
            ("10.0.0.0/8", "::ffff:11.1.2.3", false),
            ("192.0.2.7", "::ffff:192.0.2.7", true),
            ("0.0.0.0/0", "::ffff:1.2.3.4", true),
            ("::ffff:10.0.0.0/104", "10.9.9.9", true),
            ("::/0", "::ffff:1.2.3.4", false),
            ("::/0", "1.2.3.4", false),
            ("::/0", "2001:db8::1", true),
            ("::1/128", "::1", true),
            ("::1/128", "::2", false),
            ("::1/128", "127.0.0.1", false),
            ("2001:db8::/32", "2001:db8:ffff::1", true),
            ("2001:db8::/32", "2001:db9::", false),
            ("fe80::/10", "febf::1", true),
            ("fe80::/10", "fec0::1", false),
            ("2001:db8::/127", "2001:db8::1", true),
            ("2001:db8::/127", "2001:db8::2", false),
        ];
        for (block, addr, want) in table {
            assert_eq!(cidr(block).contains(ip(addr)), *want, "{block} contains {addr}");
        }
    }

    #[test]
    fn private_table() {
        let table: &[(&str, bool)] = &[
            ("0.0.0.0", true),
            ("0.255.255.255", true),
            ("1.0.0.0", false),
            ("127.0.0.1", true),
            ("127.255.255.255", true),
            ("126.255.255.255", false),
            ("128.0.0.0", false),
            ("10.0.0.0", true),
            ("10.255.255.255", true),
            ("9.255.255.255", false),
            ("11.0.0.0", false),
            ("172.16.0.0", true),
            ("172.31.255.255", true),
            ("172.15.255.255", false),
            ("172.32.0.0", false),
            ("192.168.0.0", true),
            ("192.168.255.255", true),
            ("192.167.255.255", false),
            ("192.169.0.0", false),
            ("100.64.0.0", true),
            ("100.127.255.255", true),
            ("100.63.255.255", false),
            ("100.128.0.0", false),
            ("169.254.0.0", true),
            ("169.254.255.255", true),
            ("169.254.169.254", true),
            ("169.253.255.255", false),
            ("169.255.0.0", false),
            ("8.8.8.8", false),
            ("203.0.113.9", false),
            ("::", true),
            ("::1", true),
            ("::2", false),
            ("fe80::", true),
            ("febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true),
            ("fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false),
            ("fec0::", false),
            ("fc00::", true),
            ("fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true),
            ("fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false),
            ("fe00::", false),
            ("fd00:ec2::254", true),
            ("2001:4860:4860::8888", false),
            ("2606:4700::1111", false),
            // Mapped forms.
            ("::ffff:0.0.0.0", true),
            ("::ffff:127.0.0.1", true),
            ("::ffff:10.1.2.3", true),
            ("::ffff:172.16.0.1", true),
            ("::ffff:192.168.1.1", true),
            ("::ffff:100.64.0.1", true),
            ("::ffff:169.254.169.254", true),
            ("::ffff:169.254.1.1", true),
            ("::ffff:8.8.8.8", false),
            // NAT64 well-known prefix.
            ("64:ff9b::10.0.0.1", true),
            ("64:ff9b::127.0.0.1", true),
            ("64:ff9b::169.254.169.254", true),
            ("64:ff9b::8.8.8.8", false),
            ("64:ff9b:1::10.0.0.1", false),
        ];
        for (addr, want) in table {
            assert_eq!(is_private(ip(addr)), *want, "{addr}");
        }
    }

    #[test]
    fn private_reasons() {
        assert_eq!(private_reason(ip("169.254.169.254")), Some("cloud metadata address"));
        assert_eq!(private_reason(ip("fd00:ec2::254")), Some("cloud metadata address"));
        assert_eq!(private_reason(ip("::ffff:127.0.0.1")), Some("loopback destination"));
        assert_eq!(private_reason(ip("fe80::1")), Some("link-local destination"));
        assert_eq!(private_reason(ip("1.1.1.1")), None);
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().expect("test socket address")
    }

    #[test]
    fn builtins_refuse_loops() {
        let b = Builtins {
            own_addresses: vec![sa("0.0.0.0:3128"), sa("127.0.0.1:1080"), sa("[::]:8080")],
            deny_private: false,
        };
        let table: &[(&str, bool)] = &[
            // 0.0.0.0:3128: any local address on 3128.
            ("127.0.0.1:3128", true),
            ("127.9.9.9:3128", true),
            ("0.0.0.0:3128", true),
            ("[::1]:3128", true),
            ("[::ffff:127.0.0.1]:3128", true),
            ("[::]:3128", true),
            ("127.0.0.1:3129", false),
            ("10.0.0.1:3128", false),
            ("203.0.113.1:3128", false),
            // 127.0.0.1:1080: that address, and the unspecified one that reaches it.
            ("127.0.0.1:1080", true),
            ("[::ffff:127.0.0.1]:1080", true),
            ("0.0.0.0:1080", true),
            ("127.0.0.2:1080", false),
            ("127.0.0.1:1081", false),
            // [::]:8080
            ("[::1]:8080", true),
            ("127.0.0.1:8080", true),
            ("[2001:db8::1]:8080", false),
        ];
        for (dest, want) in table {
            let got = b.check(sa(dest));
            assert_eq!(got.is_some(), *want, "{dest}: {got:?}");
            if *want {
                assert_eq!(got, Some(LOOP_REASON));
            }
        }
    }

    #[test]
    fn builtins_specific_own_address() {
        let b = Builtins { own_addresses: vec![sa("192.0.2.10:3128")], deny_private: false };
        assert_eq!(b.check(sa("192.0.2.10:3128")), Some(LOOP_REASON));
        assert_eq!(b.check(sa("[::ffff:192.0.2.10]:3128")), Some(LOOP_REASON));
        assert_eq!(b.check(sa("192.0.2.11:3128")), None);
        assert_eq!(b.check(sa("127.0.0.1:3128")), None);
    }

    #[test]
    fn builtins_deny_private() {
        let off = Builtins { own_addresses: vec![], deny_private: false };
        let on = Builtins { own_addresses: vec![], deny_private: true };
        for dest in ["10.0.0.1:80", "[::1]:443", "169.254.169.254:80", "[::ffff:192.168.0.1]:22"] {
            assert_eq!(off.check(sa(dest)), None, "{dest}");
            assert!(on.check(sa(dest)).is_some(), "{dest}");
        }
        assert_eq!(on.check(sa("93.184.216.34:443")), None);
        assert_eq!(on.check(sa("[2001:db8::1]:443")), None);
        // The loop reason wins over the private one.
        let both = Builtins { own_addresses: vec![sa("127.0.0.1:3128")], deny_private: true };
        assert_eq!(both.check(sa("127.0.0.1:3128")), Some(LOOP_REASON));
        assert_eq!(both.check(sa("127.0.0.1:80")), Some("loopback destination"));
    }
}
