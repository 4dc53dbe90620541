//! A route's outgoing addresses, compiled: the `bind` entries sorted by family, and the
//! pick of one address for one connection ([`Egress::pick`]), a pure function of what it
//! is given (the client's local address, and a draw: a sticky seed, a per-worker turn, or
//! random bits), so that it is tested without sockets. The host checks run at start and
//! on reload ([`Egress::host_problems`]).
//!
//! Choices made here:
//! - `same` stands for the local address the client connected to, in that address's
//!   family, ahead of any listed entry of the family; the other family keeps its entries.
//! - A list picks an entry (at random, in turn, or by the seed), then a prefix entry an
//!   address inside it, uniformly. An IPv4 prefix of /30 or wider leaves out its network
//!   and broadcast addresses.
//! - A route with `bind` whose entries have no address of a family sends nothing over
//!   that family: destinations reachable only over it fail with a reply saying so.

use std::net::IpAddr;

use crate::config::{BindEntry, BindPick, EgressConfig};

/// One outgoing address for one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Local {
    pub(crate) ip: IpAddr,
    /// Drawn from a prefix: the socket needs `IP_FREEBIND` (the host has no such address
    /// configured, only a local route to the prefix).
    pub(crate) freebind: bool,
}

/// A compiled entry of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Addr(IpAddr),
    /// The network (host bits clear) and its length.
    Prefix(IpAddr, u8),
}

/// A route's `bind`, `bind_pick` and `interface`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Egress {
    v4: Box<[Source]>,
    v6: Box<[Source]>,
    same: bool,
    round_robin: bool,
    interface: Option<Box<str>>,
    /// The route's position, for the per-worker turn of `round-robin`.
    pub(crate) index: usize,
    /// The route's name, for errors.
    route: Box<str>,
}

/// What [`Egress::pick`] draws with.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Draw {
    /// A sticky seed: the same seed, the same addresses.
    Seed(u64),
    /// Per connection: the worker's turn for this route (round-robin) and random bits.
    Fresh { turn: u64, random: [u64; 3] },
}

/// The addresses one connection may leave from, one per family, and the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Picked<'a> {
    pub(crate) v4: Option<Local>,
    pub(crate) v6: Option<Local>,
    /// `bind` is set: a family without an address is not used.
    pub(crate) only: bool,
    pub(crate) interface: Option<&'a str>,
    /// The route's name.
    pub(crate) route: &'a str,
}

impl Picked<'_> {
    /// What a connection to `ip` leaves from: Err(()) when the route has no address of
    /// its family.
    pub(crate) fn for_ip(&self, ip: IpAddr) -> Result<Option<Local>, ()> {
        let local = match ip {
            IpAddr::V4(_) => self.v4,
            IpAddr::V6(_) => self.v6,
        };
        match local {
            None if self.only => Err(()),
            local => Ok(local),
        }
    }
}

impl Egress {
    /// Compiles a route's keys, checked already (`config::egress::problems`): None when
    /// none is set.
    pub(crate) fn build(
        cfg: &EgressConfig,
        index: usize,
        route: &str,
    ) -> Result<Option<Egress>, String> {
        if !cfg.is_set() {
            return Ok(None);
        }
        let (mut v4, mut v6, mut same) = (Vec::new(), Vec::new(), false);
        for entry in &cfg.bind {
            let source = match entry.parse::<BindEntry>()? {
                BindEntry::Same => {
                    same = true;
                    continue;
                }
                BindEntry::Addr(ip) => Source::Addr(canonical(ip)),
                BindEntry::Prefix(ip, len) => Source::Prefix(ip, len),
            };
            match source {
                Source::Addr(IpAddr::V4(_)) | Source::Prefix(IpAddr::V4(_), _) => v4.push(source),
                _ => v6.push(source),
            }
        }
        let pick = cfg.pick.as_deref().map(str::parse::<BindPick>).transpose()?;
        Ok(Some(Egress {
            v4: v4.into(),
            v6: v6.into(),
            same,
            round_robin: pick == Some(BindPick::RoundRobin),
            interface: cfg.interface.as_deref().map(Into::into),
            index,
            route: route.into(),
        }))
    }

    /// Whether a connection's address may differ from the last one's without a seed: a
    /// prefix, or a list of more than one entry in a family. Such connections are never
    /// pooled, so that every request leaves from an address of its own.
    pub(crate) fn varies(&self, seed: Option<u64>) -> bool {
        let many = |s: &[Source]| s.len() > 1 || s.iter().any(|s| matches!(s, Source::Prefix(..)));
        seed.is_none() && (many(&self.v4) || many(&self.v6))
    }

    /// Whether `same` is among the entries (the caller then needs the client's local
    /// address).
    pub(crate) fn same(&self) -> bool {
        self.same
    }

    /// The addresses for one connection of a client that connected to `local`.
    pub(crate) fn pick(&self, local: Option<IpAddr>, draw: Draw) -> Picked<'_> {
        let same = local.filter(|_| self.same).map(canonical);
        let choose = |sources: &[Source], v6: bool| -> Option<Local> {
            if let Some(ip) = same.filter(|ip| ip.is_ipv6() == v6) {
                return Some(Local { ip, freebind: false });
            }
            let (entry, bits) = match draw {
                Draw::Seed(seed) => {
                    let family = if v6 { 0x6666 } else { 0x4444 };
                    let bits = (u128::from(mix(seed ^ family ^ 1)) << 64)
                        | u128::from(mix(seed ^ family ^ 2));
                    (scaled(mix(seed ^ family), sources.len()), bits)
                }
                Draw::Fresh { turn, random: [a, b, c] } => {
                    let entry = match self.round_robin {
                        true => (turn % sources.len().max(1) as u64) as usize,
                        false => scaled(a, sources.len()),
                    };
                    (entry, (u128::from(b) << 64) | u128::from(c))
                }
            };
            Some(match *sources.get(entry)? {
                Source::Addr(ip) => Local { ip, freebind: false },
                Source::Prefix(net, len) => Local { ip: inside(net, len, bits), freebind: true },
            })
        };
        Picked {
            v4: choose(&self.v4, false),
            v6: choose(&self.v6, true),
            only: self.same || !self.v4.is_empty() || !self.v6.is_empty(),
            interface: self.interface.as_deref(),
            route: &self.route,
        }
    }

    /// What the host lacks for these addresses: an interface that does not exist, an
    /// address it cannot bind, a prefix with no local route (unless `ip_nonlocal_bind`
    /// lets any address be bound). Each message says what to run. `route` is its label.
    pub(crate) fn host_problems(&self, route: &str) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(name) = &self.interface {
            if !crate::io::egress::interface_exists(name) {
                out.push(format!("{route}: interface `{name}` does not exist on this host"));
            }
        }
        for source in self.v4.iter().chain(self.v6.iter()) {
            // A fixed address must be the host's; an address inside a prefix (not the
            // network's own, which may be special) must come back to the host.
            let (ip, prefix, probe) = match *source {
                Source::Addr(ip) => (ip, None, crate::io::egress::try_bind(ip)),
                Source::Prefix(net, len) => {
                    let ip = inside(net, len, 1);
                    (ip, Some(len), crate::io::egress::try_receive(ip))
                }
            };
            let Err(e) = probe else { continue };
            let not_here = e.kind() == std::io::ErrorKind::AddrNotAvailable;
            let (family, dash) = if ip.is_ipv6() { ("ipv6", " -6") } else { ("ipv4", "") };
            let message = match (prefix, not_here) {
                (Some(_), true) if crate::io::egress::nonlocal_bind(ip.is_ipv6()) => continue,
                (Some(len), true) => {
                    let net = match source {
                        Source::Prefix(net, _) => *net,
                        Source::Addr(ip) => *ip,
                    };
                    format!(
                        "{route}: bind prefix {net}/{len} has no local route on this host; run \
                         `ip{dash} route add local {net}/{len} dev lo` (and route the prefix to \
                         this host upstream), or set `sysctl -w net.{family}.ip_nonlocal_bind=1`"
                    )
                }
                (None, true) => format!(
                    "{route}: bind address {ip} is not an address of this host; add it (`ip \
                     addr add {ip}/{} dev DEVICE`) or bind a prefix",
                    if ip.is_ipv6() { 128 } else { 32 }
                ),
                (_, false) => format!("{route}: cannot bind {ip}: {e}"),
            };
            out.push(message);
        }
        out
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is (a dual-stack listener's).
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// `x` scaled into 0..n without the bias of `%`.
fn scaled(x: u64, n: usize) -> usize {
    ((u128::from(x) * n as u128) >> 64) as usize
}

/// splitmix64's finalizer: spreads a seed over all bits.
pub(crate) fn mix(mut h: u64) -> u64 {
    h = h.wrapping_add(0x9E37_79B9_7F4A_7C15);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The address of prefix `net/len` whose host bits are `bits`' low ones. An IPv4 prefix
/// of /30 or wider skips its network and broadcast addresses.
pub(crate) fn inside(net: IpAddr, len: u8, bits: u128) -> IpAddr {
    match net {
        IpAddr::V4(v4) => {
            let host_bits = 32 - u32::from(len.min(32));
            let base = u32::from(v4) & u32::MAX.checked_shl(host_bits).unwrap_or(0);
            let host = match host_bits {
                0 => 0,
                1 => (bits & 1) as u32,
                // 1 ..= 2^h - 2: leaves out the all-zeros and all-ones host parts.
                _ => {
                    let usable = (1u64 << host_bits) - 2;
                    1 + ((u128::from(bits as u64) * u128::from(usable)) >> 64) as u32
                }
            };
            IpAddr::V4((base | host).into())
        }
        IpAddr::V6(v6) => {
            let host_bits = 128 - u32::from(len.min(128));
            let mask = u128::MAX.checked_shl(host_bits).unwrap_or(0);
            IpAddr::V6(((u128::from(v6) & mask) | (bits & !mask)).into())
        }
    }
}

#[cfg(test)]
mod tests;
