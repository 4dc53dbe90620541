//! A route's outgoing address (`bind`, `bind_pick`, `interface`): the keys as written and
//! every check on them that needs no I/O. `policy::route::egress` compiles them; whether
//! the host can bind them is checked there, at start and on reload.

use std::fmt;
use std::net::IpAddr;

/// The `bind`, `bind_pick` and `interface` keys of one `[[route]]` (all empty: no bind).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressConfig {
    /// Addresses, prefixes and `same`, as written.
    pub(crate) bind: Vec<String>,
    pub(crate) pick: Option<String>,
    pub(crate) interface: Option<String>,
}

impl EgressConfig {
    /// Whether any of the keys is set.
    pub(crate) fn is_set(&self) -> bool {
        !self.bind.is_empty() || self.pick.is_some() || self.interface.is_some()
    }
}

/// One `bind` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindEntry {
    /// The local address the client connected to.
    Same,
    Addr(IpAddr),
    /// A prefix shorter than the address (its host bits cleared): an address inside it,
    /// drawn per connection.
    Prefix(IpAddr, u8),
}

impl std::str::FromStr for BindEntry {
    type Err = String;

    fn from_str(s: &str) -> Result<BindEntry, String> {
        if s == "same" {
            return Ok(BindEntry::Same);
        }
        let bad =
            || format!("bind `{s}`: use an address, a prefix (\"2001:db8:1::/64\") or \"same\"");
        let Some((addr, len)) = s.split_once('/') else {
            let ip: IpAddr = s.parse().map_err(|_| bad())?;
            if ip.is_unspecified() || ip.is_multicast() {
                return Err(format!("bind `{s}`: not an address to send from"));
            }
            return Ok(BindEntry::Addr(ip));
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len: u8 = match len.parse() {
            Ok(n) if n <= max && !len.starts_with('+') => n,
            _ => return Err(format!("bind `{s}`: the prefix length must be 0 to {max}")),
        };
        if addr.is_multicast() || (addr.is_unspecified() && len == max) {
            return Err(format!("bind `{s}`: not an address to send from"));
        }
        Ok(match len == max {
            true => BindEntry::Addr(addr),
            false => BindEntry::Prefix(network(addr, len), len),
        })
    }
}

impl fmt::Display for BindEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BindEntry::Same => f.write_str("same"),
            BindEntry::Addr(ip) => write!(f, "{ip}"),
            BindEntry::Prefix(ip, len) => write!(f, "{ip}/{len}"),
        }
    }
}

/// `addr` with the bits past `len` cleared.
fn network(addr: IpAddr, len: u8) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            IpAddr::V4((u32::from(v4) & mask).into())
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & mask).into())
        }
    }
}

/// How a `bind` list picks its entry for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BindPick {
    #[default]
    Random,
    /// In turn, per worker thread.
    RoundRobin,
}

impl std::str::FromStr for BindPick {
    type Err = String;

    fn from_str(s: &str) -> Result<BindPick, String> {
        match s {
            "random" => Ok(BindPick::Random),
            "round-robin" => Ok(BindPick::RoundRobin),
            _ => Err(format!("bind_pick `{s}`: use \"random\" or \"round-robin\"")),
        }
    }
}

/// The longest interface name Linux takes (IFNAMSIZ less its NUL).
const MAX_INTERFACE: usize = 15;

/// The problems of one route's egress keys: (key, message). `deny`: the route refuses
/// what it matches, so nothing leaves by it.
pub(super) fn problems(e: &EgressConfig, deny: bool) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if deny && e.is_set() {
        out.push(("bind", "a `deny` route sends nothing out: no `bind` or `interface`".into()));
    }
    if e.bind.is_empty() && e.pick.is_some() {
        out.push(("bind_pick", "`bind_pick` needs `bind`".into()));
    }
    if let Some(p) = &e.pick {
        if let Err(message) = p.parse::<BindPick>() {
            out.push(("bind_pick", message));
        }
    }
    let mut seen = Vec::with_capacity(e.bind.len());
    for entry in &e.bind {
        match entry.parse::<BindEntry>() {
            Ok(b) if seen.contains(&b) => out.push(("bind", format!("bind lists `{b}` twice"))),
            Ok(b) => seen.push(b),
            Err(message) => out.push(("bind", message)),
        }
    }
    if let Some(name) = &e.interface {
        if name.is_empty() || name.len() > MAX_INTERFACE || name.contains(['/', '\0', ' ']) {
            out.push(("interface", format!("interface `{name}` is not an interface name")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_and_prefixes_lose_their_host_bits() {
        let ok = |s: &str| s.parse::<BindEntry>().expect(s).to_string();
        assert_eq!(ok("same"), "same");
        assert_eq!(ok("198.18.0.1"), "198.18.0.1");
        assert_eq!(ok("198.18.0.7/24"), "198.18.0.0/24");
        assert_eq!(ok("198.18.0.7/32"), "198.18.0.7");
        assert_eq!(ok("2001:db8:1::5/64"), "2001:db8:1::/64");
        assert_eq!(ok("2001:db8:1::5/128"), "2001:db8:1::5");
        assert_eq!(ok("2001:db8::/0"), "::/0");
        for bad in [
            "",
            "x",
            "1.2.3.4/33",
            "::/129",
            "1.2.3.4/",
            "1.2.3.4/+8",
            "0.0.0.0",
            "::",
            "224.0.0.1",
            "ff02::1/64",
            "[::1]",
            "same/8",
        ] {
            assert!(bad.parse::<BindEntry>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_route_reports_its_bind_problems_at_their_line() {
        let text = "[[route]]\nname = \"r\"\nvia = \"direct\"\nbind = \"nope\"\n\
                    bind_pick = \"sometimes\"\n";
        let e = format!("{:?}", crate::config::Config::parse(text).expect_err("bad"));
        for want in ["Some(4)", "route `r`: bind `nope`", "Some(5)", "bind_pick `sometimes`"] {
            assert!(e.contains(want), "{want} in {e}");
        }
        let ok = "[[route]]\nvia = \"direct\"\nbind = [\"same\", \"2001:db8::/64\"]\n\
                  interface = \"lo\"\n";
        let c = crate::config::Config::parse(ok).expect("valid");
        assert_eq!(c.routes[0].egress.bind, ["same", "2001:db8::/64"]);
        assert_eq!(c.routes[0].egress.interface.as_deref(), Some("lo"));
    }

    #[test]
    fn problems_name_their_key() {
        let e = |bind: &[&str], pick: Option<&str>, interface: Option<&str>| EgressConfig {
            bind: bind.iter().map(|s| s.to_string()).collect(),
            pick: pick.map(Into::into),
            interface: interface.map(Into::into),
        };
        let keys = |e: &EgressConfig, deny| -> Vec<&str> {
            problems(e, deny).into_iter().map(|(k, _)| k).collect()
        };
        assert!(keys(
            &e(&["same", "2001:db8::/64", "198.18.0.1"], Some("round-robin"), Some("lo")),
            false
        )
        .is_empty());
        assert_eq!(keys(&e(&["x"], None, None), false), ["bind"]);
        assert_eq!(keys(&e(&["198.18.0.1", "198.18.0.1/32"], None, None), false), ["bind"]);
        assert_eq!(keys(&e(&[], Some("random"), None), false), ["bind_pick"]);
        assert_eq!(keys(&e(&["same"], Some("sometimes"), None), false), ["bind_pick"]);
        assert_eq!(keys(&e(&[], None, Some("a-name-much-too-long")), false), ["interface"]);
        assert_eq!(keys(&e(&["same"], None, None), true), ["bind"]);
    }
}
