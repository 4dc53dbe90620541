//! Name resolution (`[dns]`): hickory's stub resolver on the worker's own runtime, behind
//! a per-worker cache.
//!
//! - A hit costs a hash lookup and an `Rc` clone: no allocation, no lock, no syscall (the
//!   clock is the vDSO's). hickory's own cache sits behind ours with the same TTL bounds;
//!   it has a lock, so it is never on the hit path.
//! - A miss starts one lookup per name; requests for the same name while it runs wait for
//!   it (`Slot::Pending`, a shared future: if the request that started it goes away, the
//!   next one waiting drives it on). The cache holds the lookup weakly: when every request
//!   waiting on it has gone, the lookup is dropped with its sockets, and the next request
//!   for the name starts a fresh one.
//! - An answer is kept for its TTL, between `ttl_min` and `ttl_max`; a failure for
//!   `negative_ttl`.
//! - Bounded: a name longer than DNS allows (253 bytes, labels of 63) is refused before
//!   the cache; at most `MAX_NAMES` entries (lookups in flight count), the expired and
//!   abandoned ones swept on the worker's housekeeping tick and, when full, before the
//!   soonest to expire; at most `MAX_ADDRS` addresses kept per name.
//! - Static `hosts` entries, then /etc/hosts's, answer before the cache (a name either
//!   lists is answered from there alone, as getaddrinfo did); IP literals never get here.
//! - Nothing blocks the worker: hickory's sockets are the worker runtime's, and the files
//!   it would read (/etc/hosts, /etc/resolv.conf, `[dns] ca`) are read with the policy, at
//!   start and on reload, off the workers (`policy::dns::System`).
//! - `tls://` and `https://` servers are hickory's DNS over TLS and over HTTPS (HTTP/2),
//!   on rustls with aws-lc-rs, verified with `[dns] ca` or the system's roots.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_util::future::{FutureExt, LocalBoxFuture, Shared, WeakShared};
use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
    ResolverOpts,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::NetError;
use hickory_resolver::TokioResolver;

use crate::config::{Dns, Prefer, Transport};
use crate::policy::dns::System;

/// A lookup's outcome: the addresses, or why there are none.
pub(crate) type Answer = Result<Rc<[IpAddr]>, Rc<str>>;

type Lookup = Shared<LocalBoxFuture<'static, (Answer, Instant)>>;

enum Slot {
    Ready(Answer, Instant),
    /// Alive while a request waits on it.
    Pending(WeakShared<LocalBoxFuture<'static, (Answer, Instant)>>),
}

/// The cache never holds more names than this (answers and lookups in flight).
const MAX_NAMES: usize = 10_000;

/// Addresses kept of one answer, in the order given.
const MAX_ADDRS: usize = 32;

pub(crate) struct Resolver {
    cfg: Dns,
    system: std::sync::Arc<System>,
    hosts: HashMap<Box<str>, Rc<[IpAddr]>>,
    /// Built on first use, on the worker's runtime (hickory spawns its connections there).
    /// A configuration hickory refuses fails every lookup with its reason.
    hickory: RefCell<Option<Result<Rc<TokioResolver>, Rc<str>>>>,
    cache: RefCell<HashMap<Box<str>, Slot>>,
    /// `MAX_NAMES`, smaller in tests.
    max_names: usize,
}

impl Resolver {
    /// `system`: the files as the policy read them.
    pub(crate) fn new(cfg: Dns, system: std::sync::Arc<System>) -> Self {
        // /etc/hosts as getaddrinfo reads it ("files" before "dns"): a name it lists is
        // answered from it alone (hickory would add its own `::1` for `localhost`, which
        // the file may not list). The configuration's entries come first.
        let mut all: HashMap<Box<str>, Vec<IpAddr>> = HashMap::new();
        let file = system.hosts.as_str();
        for (name, ips) in &cfg.hosts {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            all.entry(name.into_boxed_str()).or_default().extend(ips);
        }
        let mut from_file: HashMap<Box<str>, Vec<IpAddr>> = HashMap::new();
        for line in file.lines() {
            let line = line.split('#').next().unwrap_or("");
            let mut words = line.split_whitespace();
            let Some(Ok(ip)) = words.next().map(str::parse::<IpAddr>) else { continue };
            for name in words {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                if !all.contains_key(name.as_str()) {
                    let ips = from_file.entry(name.into_boxed_str()).or_default();
                    if !ips.contains(&ip) {
                        ips.push(ip);
                    }
                }
            }
        }
        all.extend(from_file);
        let prefer = cfg.prefer;
        let hosts = all
            .into_iter()
            .map(|(name, mut ips)| {
                // `prefer` as for an answer: that family alone when the name has it.
                let v6 = match prefer {
                    Prefer::Auto => None,
                    Prefer::Ipv4 => Some(false),
                    Prefer::Ipv6 => Some(true),
                };
                if let Some(v6) = v6 {
                    if ips.iter().any(|ip| ip.is_ipv6() == v6) {
                        ips.retain(|ip| ip.is_ipv6() == v6);
                    }
                }
                (name, Rc::from(ips))
            })
            .collect();
        Resolver {
            cfg,
            system,
            hosts,
            hickory: RefCell::new(None),
            cache: RefCell::new(HashMap::new()),
            max_names: MAX_NAMES,
        }
    }

    #[cfg(test)]
    fn with_hosts_file(cfg: Dns, file: &str) -> Self {
        let system = System { hosts: file.into(), ..System::default() };
        Resolver::new(cfg, std::sync::Arc::new(system))
    }

    /// Whether this resolver answers as one built from `cfg` and `system` would.
    pub(crate) fn same(&self, cfg: &Dns, system: &std::sync::Arc<System>) -> bool {
        self.cfg == *cfg
            && (std::sync::Arc::ptr_eq(&self.system, system) || *self.system == **system)
    }

    /// The addresses of `host` (a name, not an IP literal).
    pub(crate) async fn resolve(&self, host: &str) -> Answer {
        if !self.hosts.is_empty() {
            if let Some(ips) = self.static_entry(host) {
                return Ok(ips);
            }
        }
        let now = Instant::now();
        let lookup = {
            let mut cache = self.cache.borrow_mut();
            let waiting = match cache.get(host) {
                Some(Slot::Ready(answer, expires)) if *expires > now => return answer.clone(),
                Some(Slot::Pending(lookup)) => lookup.upgrade(),
                _ => None,
            };
            match waiting {
                Some(lookup) => lookup,
                None => {
                    // Checked on a miss only: the cache holds no name that fails it.
                    if let Some(problem) = invalid(host) {
                        return Err(Rc::from(problem));
                    }
                    let lookup = self.start(host);
                    if cache.len() >= self.max_names && !cache.contains_key(host) {
                        make_room(&mut cache, now, self.max_names);
                    }
                    // Full of lookups in flight: this one runs without being kept.
                    if cache.len() < self.max_names || cache.contains_key(host) {
                        if let Some(weak) = lookup.downgrade() {
                            cache.insert(host.into(), Slot::Pending(weak));
                        }
                    }
                    lookup
                }
            }
        };
        let (answer, expires) = lookup.clone().await;
        let mut cache = self.cache.borrow_mut();
        if let Some(slot) = cache.get_mut(host) {
            if matches!(slot, Slot::Pending(l) if l.upgrade().is_some_and(|l| l.ptr_eq(&lookup))) {
                *slot = Slot::Ready(answer.clone(), expires);
            }
        }
        answer
    }

    /// Drops the expired answers and the lookups nobody waits on (the worker's tick).
    pub(crate) fn sweep(&self, now: Instant) {
        let mut cache = self.cache.borrow_mut();
        if !cache.is_empty() {
            cache.retain(|_, s| live(s, now));
        }
    }

    fn static_entry(&self, host: &str) -> Option<Rc<[IpAddr]>> {
        let host = host.strip_suffix('.').unwrap_or(host);
        if let Some(ips) = self.hosts.get(host) {
            return Some(ips.clone());
        }
        if host.bytes().any(|b| b.is_ascii_uppercase()) {
            return self.hosts.get(host.to_ascii_lowercase().as_str()).cloned();
        }
        None
    }

    fn start(&self, host: &str) -> Lookup {
        let resolver = self
            .hickory
            .borrow_mut()
            .get_or_insert_with(|| build(&self.cfg, &self.system).map(Rc::new).map_err(Rc::from))
            .clone();
        let host: Box<str> = host.into();
        let (min, max, negative) = (self.cfg.ttl_min, self.cfg.ttl_max, self.cfg.negative_ttl);
        let system = self.system.clone();
        async move {
            let resolver = match resolver {
                Ok(r) => r,
                Err(e) => return (Err(e), Instant::now() + negative),
            };
            let result = resolver.lookup_ip(&*host).await;
            let now = Instant::now();
            match result {
                Ok(found) => {
                    // The first MAX_ADDRS distinct ones, in the answer's order (the
                    // order `prefer` and Happy Eyeballs go by): linear, at most
                    // MAX_ADDRS comparisons per record.
                    let mut ips: Vec<IpAddr> = Vec::with_capacity(MAX_ADDRS);
                    for ip in found.iter() {
                        if ips.len() == MAX_ADDRS {
                            break;
                        }
                        if !ips.contains(&ip) {
                            ips.push(ip);
                        }
                    }
                    if ips.is_empty() {
                        return (Err(Rc::from("no addresses")), now + negative);
                    }
                    let ttl = found.valid_until().saturating_duration_since(now).clamp(min, max);
                    (Ok(ips.into()), now + ttl)
                }
                Err(e) => (Err(reason(&e, &system).into()), now + negative),
            }
        }
        .boxed_local()
        .shared()
    }

    #[cfg(test)]
    fn with_max_names(mut self, max: usize) -> Self {
        self.max_names = max;
        self
    }

    #[cfg(test)]
    pub(crate) fn cached(&self) -> usize {
        self.cache.borrow().len()
    }
}

/// Why `host` cannot be a DNS name: longer than 253 bytes (a trailing dot aside), or
/// with an empty label or one longer than 63.
fn invalid(host: &str) -> Option<&'static str> {
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.len() > 253 {
        Some("name longer than 253 bytes")
    } else if name.split('.').any(|l| l.len() > 63) {
        Some("label longer than 63 bytes")
    } else if name.split('.').any(str::is_empty) {
        Some("empty label")
    } else {
        None
    }
}

/// Whether an entry is worth keeping: an answer not yet expired, a lookup some request
/// waits on.
fn live(slot: &Slot, now: Instant) -> bool {
    match slot {
        Slot::Ready(_, expires) => *expires > now,
        Slot::Pending(lookup) => lookup.upgrade().is_some(),
    }
}

/// Room for one more name in a full cache: the dead entries go, then (still full) the
/// sixteenth of the answers that expire soonest, so that the next inserts find room
/// without scanning again.
fn make_room(cache: &mut HashMap<Box<str>, Slot>, now: Instant, max: usize) {
    cache.retain(|_, s| live(s, now));
    if cache.len() < max {
        return;
    }
    let mut expiries: Vec<Instant> = cache
        .values()
        .filter_map(|s| match s {
            Slot::Ready(_, e) => Some(*e),
            Slot::Pending(_) => None,
        })
        .collect();
    if expiries.is_empty() {
        return;
    }
    let n = (max / 16).clamp(1, expiries.len());
    let (_, cut, _) = expiries.select_nth_unstable(n - 1);
    let cut = *cut;
    let mut left = n;
    cache.retain(|_, s| match s {
        Slot::Ready(_, e) if *e <= cut && left > 0 => {
            left -= 1;
            false
        }
        _ => true,
    });
}

/// A failure as the 502 and the log say it. hickory reports a server whose certificate
/// was refused as "no connections available": the verifier's reason is added.
fn reason(e: &NetError, system: &System) -> String {
    if e.is_nx_domain() {
        "no such name".into()
    } else if e.is_no_records_found() {
        "no addresses".into()
    } else if let Some(refused) = system.tls.as_ref().and_then(|(_, r)| r.take()) {
        let reason = format!("{e} ({refused})");
        tracing::warn!("dns: {reason}");
        reason
    } else {
        e.to_string()
    }
}

/// The servers `[dns]` names, or /etc/resolv.conf's (as `system` read it); glibc's
/// fallback (127.0.0.1:53) when it names none.
fn build(cfg: &Dns, system: &System) -> Result<TokioResolver, String> {
    let servers = cfg.name_servers();
    let fallback = || {
        let local = [crate::config::NameServer {
            addr: SocketAddr::from(([127, 0, 0, 1], 53)),
            transport: Transport::Udp,
        }];
        (servers_config(&local), ResolverOpts::default())
    };
    let (config, mut opts) = match &system.resolv_conf {
        _ if !servers.is_empty() => (servers_config(&servers), ResolverOpts::default()),
        Some(Ok(text)) => match hickory_resolver::system_conf::parse_resolv_conf(text) {
            Ok((config, opts)) if !config.name_servers().is_empty() => (config, opts),
            Ok(_) => fallback(),
            Err(e) => {
                tracing::warn!("dns: /etc/resolv.conf: {e}; asking 127.0.0.1:53");
                fallback()
            }
        },
        Some(Err(e)) => {
            tracing::warn!("dns: {e}; asking 127.0.0.1:53");
            fallback()
        }
        None => fallback(),
    };
    opts.timeout = cfg.timeout;
    opts.attempts = cfg.attempts;
    opts.ip_strategy = match cfg.prefer {
        Prefer::Auto => LookupIpStrategy::Ipv6AndIpv4,
        Prefer::Ipv4 => LookupIpStrategy::Ipv4thenIpv6,
        Prefer::Ipv6 => LookupIpStrategy::Ipv6thenIpv4,
    };
    opts.positive_min_ttl = Some(cfg.ttl_min);
    opts.positive_max_ttl = Some(cfg.ttl_max.max(Duration::from_secs(1)));
    opts.negative_min_ttl = Some(cfg.negative_ttl);
    opts.negative_max_ttl = Some(cfg.negative_ttl.max(Duration::from_secs(1)));
    // Our cache is in front; hickory's only has to bridge the A and AAAA halves.
    opts.cache_size = 256;
    // /etc/hosts is read with the policy and answered by `Resolver::resolve`, in front.
    opts.use_hosts_file = ResolveHosts::Never;
    // The servers in the order given: the first one answering is asked first.
    opts.server_ordering_strategy =
        hickory_resolver::config::ServerOrderingStrategy::UserProvidedOrder;
    let mut builder = TokioResolver::builder_with_config(config, TokioRuntimeProvider::default());
    *builder.options_mut() = opts;
    if let Some((tls, _)) = &system.tls {
        builder = builder.with_tls_config((**tls).clone());
    }
    builder.build().map_err(|e| {
        tracing::warn!("dns: the resolver: {e}");
        format!("the resolver: {e}")
    })
}

fn servers_config(servers: &[crate::config::NameServer]) -> ResolverConfig {
    let name_servers = servers
        .iter()
        .map(|s| {
            let port = s.addr.port();
            let connections = match &s.transport {
                Transport::Udp => vec![ConnectionConfig::udp(), ConnectionConfig::tcp()],
                Transport::Tls { name } => vec![ConnectionConfig::tls(name.as_str().into())],
                Transport::Https { name, path } => {
                    vec![ConnectionConfig::https(name.as_str().into(), Some(path.as_str().into()))]
                }
            };
            let connections = connections
                .into_iter()
                .map(|mut c| {
                    c.port = port;
                    c
                })
                .collect();
            NameServerConfig::new(s.addr.ip(), true, connections)
        })
        .collect();
    ResolverConfig::from_name_servers(name_servers)
}

#[cfg(test)]
mod tests;
