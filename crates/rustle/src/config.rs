//! The configuration: a TOML file, defaults that are safe on their own, and command-line
//! overrides for the common cases. Every problem found is reported with its line, and
//! unknown keys are errors, so a typo never silently falls back to a default. Unknown keys
//! are collected with `serde_ignored` rather than `deny_unknown_fields`, and values that do
//! not deserialize by `config/collect`, so that all of them are reported at once.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

mod collect;
mod log;
mod routing;

pub use log::{
    Diagnostics, Facility, Field, Log, LogFormat, LogTarget, Piece, SyslogAddr, SyslogFormat,
    Template,
};
pub use routing::{
    names_of, GroupConfig, Named, ParentConfig, ParentKind, Probe, RouteConfig, Secret, Sticky,
    DENY, DIRECT,
};

/// What a listener speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ListenerKind {
    /// HTTP/1.1 forward proxy: absolute URIs, CONNECT, upgrades.
    Http,
    /// SOCKS4, SOCKS4a and SOCKS5 (told apart by the first byte).
    Socks,
    /// HTTP, SOCKS4 and SOCKS5 on one port, detected from the first byte.
    Auto,
    /// Every TCP connection is relayed to `target`.
    Relay,
    /// Every UDP datagram is relayed to `target`, with a session per client address.
    UdpRelay,
    /// HTTP forward proxy inside TLS (`curl --proxy https://...`); needs `[listener.tls]`.
    Https,
}

impl ListenerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ListenerKind::Http => "http",
            ListenerKind::Socks => "socks",
            ListenerKind::Auto => "auto",
            ListenerKind::Relay => "relay",
            ListenerKind::UdpRelay => "udp-relay",
            ListenerKind::Https => "https",
        }
    }

    /// Kinds that relay to a fixed target instead of one the client names.
    pub fn needs_target(self) -> bool {
        matches!(self, ListenerKind::Relay | ListenerKind::UdpRelay)
    }
}

impl fmt::Display for ListenerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `host:port`, `1.2.3.4:port` or `[v6]:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    pub host: String,
    pub port: u16,
}

impl std::str::FromStr for HostPort {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not host:port");
        let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let host = match host.strip_prefix('[') {
            Some(v6) => {
                let v6 = v6.strip_suffix(']').ok_or_else(bad)?;
                v6.parse::<std::net::Ipv6Addr>().map_err(|_| bad())?;
                v6
            }
            None if host.is_empty() || host.contains(':') => return Err(bad()),
            None => host,
        };
        if port == 0 {
            return Err(format!("`{s}`: port 0 is not a destination"));
        }
        Ok(HostPort { host: host.to_ascii_lowercase(), port })
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl<'de> Deserialize<'de> for HostPort {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// When a relay direction splices (moves bytes kernel-side through a pipe).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpliceMode {
    /// Splice once reads fill the buffer, copy again after small reads.
    #[default]
    Auto,
    Always,
    Never,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Listener {
    /// A name for access rules (`listeners = [...]`) and logs.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default = "default_kind")]
    pub kind: ListenerKind,
    pub listen: SocketAddr,
    /// Require authentication: HTTP Basic (`Proxy-Authorization`) and SOCKS5
    /// username/password, checked against `[auth]` users.
    #[serde(default)]
    pub auth: bool,
    /// With `auth`, accept SOCKS4 clients whose user id names a configured user (SOCKS4
    /// carries no password: this trusts the client's word).
    #[serde(default)]
    pub socks4_users: bool,
    /// Bandwidth of all this listener's connections together, client to upstream and
    /// upstream to client: "10mbit", "512kbit", "2MB" (bytes), a number of bytes/s.
    #[serde(default)]
    pub rate_up: Option<String>,
    #[serde(default)]
    pub rate_down: Option<String>,
    /// `relay` and `udp-relay`: where everything goes.
    #[serde(default)]
    pub target: Option<HostPort>,
    /// SOCKS5 clients offering username/password are accepted whatever they send. Until
    /// user accounts exist this is the only way to serve clients that insist on that
    /// method; off by default.
    #[serde(default)]
    pub accept_any_credentials: bool,
    /// `auto`, `always` or `never`: splice(2) in tunnels and relays of this listener.
    #[serde(default)]
    pub splice: SpliceMode,
    /// TLS towards clients: required by `https`; on `relay` it terminates TLS; on `auto`
    /// it lets the port recognise a TLS ClientHello (HTTP inside).
    #[serde(default)]
    pub tls: Option<ListenTls>,
    /// `relay` only: TLS towards the target (origination).
    #[serde(default)]
    pub target_tls: Option<ConnectTls>,
    /// `http` and `auto` listeners: a connection that opens with the HTTP/2 preface is
    /// served as HTTP/2 (h2c with prior knowledge). Off by default: a plain port that
    /// only ever spoke HTTP/1.1 keeps answering the preface with an error.
    #[serde(default)]
    pub h2c: bool,
    /// The operator's word that a reload (or a takeover) may leave this listener less
    /// protected than the one running at its address: no longer requiring `auth`, or
    /// client certificates. Without it such a change is refused.
    #[serde(default)]
    pub allow_less_protection: bool,
    /// The buckets of `rate_up`/`rate_down`, made when the listener is bound (kept by a
    /// reload that leaves the rates as they were).
    #[serde(skip)]
    pub throttle: crate::limits::Throttle,
    /// Which listener of the configuration this is (`effective_listeners` sets it): a
    /// reload, a takeover and the policy's TLS settings find a listener by it.
    #[serde(skip)]
    pub key: ListenerKey,
    /// Its counters, a slot per worker, made when the listener is bound (kept by a reload
    /// that keeps the listener).
    #[serde(skip)]
    pub counters: std::sync::Arc<crate::metrics::ListenerCounters>,
}

/// A listener's identity across reloads and upgrades: its address as configured (port 0
/// included), its transport, and its rank among the listeners configured with the same
/// address and transport (only port-0 listeners share an address). Reordering listeners
/// in the file changes no key; editing a listener's other settings changes none either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListenerKey {
    pub listen: SocketAddr,
    pub udp: bool,
    pub rank: usize,
}

impl Default for ListenerKey {
    fn default() -> Self {
        ListenerKey { listen: SocketAddr::from(([0, 0, 0, 0], 0)), udp: false, rank: 0 }
    }
}

impl fmt::Display for ListenerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let transport = if self.udp { "udp" } else { "tcp" };
        match self.rank {
            0 => write!(f, "{} ({transport})", self.listen),
            n => write!(f, "{} ({transport}, #{})", self.listen, n + 1),
        }
    }
}

/// Sets each listener's `key` from its position among those of the same address.
fn assign_keys(listeners: &mut [Listener]) {
    for i in 0..listeners.len() {
        let (before, rest) = listeners.split_at_mut(i);
        let l = &mut rest[0];
        let udp = l.kind == ListenerKind::UdpRelay;
        let rank = before
            .iter()
            .filter(|o| o.listen == l.listen && (o.kind == ListenerKind::UdpRelay) == udp)
            .count();
        l.key = ListenerKey { listen: l.listen, udp, rank };
    }
}

/// A certificate chain and key (PEM files), optionally for some server names only.
#[derive(Debug, Clone, Deserialize)]
pub struct CertFiles {
    /// `a.example, *.b.example`: server names (SNI) this pair is chosen for, besides the
    /// DNS names in the certificate itself.
    #[serde(default)]
    pub names: Option<String>,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What a client without a known server name gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownSni {
    /// The first certificate (`cert`/`key`).
    #[default]
    Default,
    /// A handshake failure.
    Refuse,
}

/// Whether clients must present certificates (mutual TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientCerts {
    #[default]
    None,
    Optional,
    Required,
}

/// Which part of a client certificate names the user for access rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CertUser {
    /// The subject's common name.
    #[default]
    Cn,
    /// The first DNS or e-mail subjectAltName.
    San,
    /// Certificates prove nothing about users (the user still logs in with a password).
    None,
}

/// TLS accepted from clients.
#[derive(Debug, Clone, Deserialize)]
pub struct ListenTls {
    /// The default certificate chain (leaf first) and its key.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// More certificates, chosen by the name the client asks for.
    #[serde(default, rename = "sni")]
    pub more: Vec<CertFiles>,
    #[serde(default)]
    pub unknown_sni: UnknownSni,
    /// CA certificates (PEM) that client certificates must chain to.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    #[serde(default)]
    pub client_certs: ClientCerts,
    #[serde(default)]
    pub client_user: CertUser,
    /// ALPN protocols offered on a relay (the HTTPS port chooses its own).
    #[serde(default)]
    pub alpn: Vec<String>,
}

impl ListenTls {
    /// One certificate, no client certificates.
    pub fn new(cert: PathBuf, key: PathBuf) -> Self {
        ListenTls {
            cert,
            key,
            more: Vec::new(),
            unknown_sni: UnknownSni::Default,
            client_ca: None,
            client_certs: ClientCerts::None,
            client_user: CertUser::Cn,
            alpn: Vec::new(),
        }
    }
}

/// TLS originated towards a relay's target.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ConnectTls {
    /// The name sent (SNI) and verified; the target's host by default.
    pub server_name: Option<String>,
    /// CA certificates (PEM) to verify the target with, instead of the system's.
    pub ca: Option<PathBuf>,
    /// Accept any certificate. For testing only: it gives up all protection.
    pub insecure: bool,
    pub alpn: Vec<String>,
}

/// Kernel TLS: after the handshake, hand the session keys to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ktls {
    /// Where the kernel has the `tls` module; user-space TLS otherwise (said once).
    #[default]
    Auto,
    Off,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Tls {
    pub ktls: Ktls,
    /// CA certificates (PEM) that origins of `https://` URLs requested in absolute form
    /// are verified with; the system's roots when not set.
    pub origin_ca: Option<PathBuf>,
    /// Accept any certificate from those origins. For testing only.
    pub origin_insecure: bool,
}

impl Listener {
    pub fn new(kind: ListenerKind, listen: SocketAddr) -> Self {
        Listener {
            name: None,
            kind,
            listen,
            auth: false,
            socks4_users: false,
            rate_up: None,
            rate_down: None,
            target: None,
            accept_any_credentials: false,
            splice: SpliceMode::Auto,
            tls: None,
            target_tls: None,
            h2c: false,
            allow_less_protection: false,
            throttle: Default::default(),
            counters: Default::default(),
            key: ListenerKey::default(),
        }
    }
}

fn default_kind() -> ListenerKind {
    ListenerKind::Http
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Timeouts {
    /// From the first byte of a request head to its end: cuts off slow-header clients.
    #[serde(deserialize_with = "duration")]
    pub header: Duration,
    /// How long a kept-alive client connection may wait for its next request.
    #[serde(deserialize_with = "duration")]
    pub keepalive: Duration,
    /// Resolving plus connecting to an upstream (all Happy Eyeballs attempts).
    #[serde(deserialize_with = "duration")]
    pub connect: Duration,
    /// Silence from either side while a request or response is in flight.
    #[serde(deserialize_with = "duration")]
    pub io: Duration,
    /// A tunnel (CONNECT, upgrade) with no byte either way for this long is closed.
    #[serde(deserialize_with = "duration")]
    pub tunnel_idle: Duration,
    /// A UDP association or UDP relay session with no datagram either way for this long
    /// is closed.
    #[serde(deserialize_with = "duration")]
    pub udp_idle: Duration,
    /// On SIGTERM, how long requests and tunnels in flight may take to finish.
    #[serde(deserialize_with = "duration")]
    pub shutdown: Duration,
    /// On SIGTERM, SIGINT or a takeover, how long the process goes on accepting with
    /// `/readyz` saying 503 before it stops accepting and drains: the time load balancers
    /// and Kubernetes take to stop sending new connections (haproxy's `grace`).
    #[serde(deserialize_with = "duration")]
    pub drain_delay: Duration,
    /// A TLS handshake (from the first byte to its end, either side) must finish within.
    #[serde(deserialize_with = "duration")]
    pub handshake: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header: Duration::from_secs(10),
            keepalive: Duration::from_secs(60),
            connect: Duration::from_secs(10),
            io: Duration::from_secs(60),
            tunnel_idle: Duration::from_secs(300),
            udp_idle: Duration::from_secs(60),
            shutdown: Duration::from_secs(30),
            drain_delay: Duration::ZERO,
            handshake: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Open client connections across all workers; more are answered 503 and closed.
    pub max_connections: usize,
    /// Largest request or response head; a larger request gets 431.
    pub max_header_bytes: usize,
    /// Most header fields in one head; more gets 431.
    pub max_headers: usize,
    /// Open connections from one client address; more are refused (503 on HTTP).
    pub max_connections_per_client: Option<usize>,
    /// Open connections of one authenticated user; more are refused.
    pub max_connections_per_user: Option<usize>,
    /// Bandwidth of each user (all its connections together), each way; a user's own
    /// `rate_up`/`rate_down` overrides it.
    pub user_rate_up: Option<String>,
    pub user_rate_down: Option<String>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 10_000,
            max_header_bytes: 64 * 1024,
            max_headers: 128,
            max_connections_per_client: None,
            max_connections_per_user: None,
            user_rate_up: None,
            user_rate_down: None,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Http {
    /// Add `Via: 1.1 rustle` to requests and responses.
    pub via: bool,
    /// Add the client's address in `X-Forwarded-For` and `Forwarded`.
    pub forwarded_for: bool,
}

/// HTTP/2 connections from clients (h2c, and ALPN `h2` on TLS ports).
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Http2 {
    /// Streams a client may have open at once on one connection. Every stream can hold
    /// an upstream socket, so a connection costs up to this many descriptors more.
    pub max_concurrent_streams: u32,
    /// Largest decoded header list (HPACK-expanded) of one request; larger gets 431.
    pub max_header_list_size: u32,
    /// Receive window of each stream: how much a client may send on one stream before
    /// the proxy has passed it on.
    pub initial_stream_window: u32,
    /// Receive window of the whole connection (all streams together).
    pub initial_connection_window: u32,
    /// Bytes queued for a client per stream beyond which the proxy stops reading the
    /// upstream until they are sent.
    pub max_send_buffer_size: usize,
    /// Streams the client reset before the proxy accepted them that may wait in the
    /// accept queue; more closes the connection (ENHANCE_YOUR_CALM).
    pub max_pending_accept_reset_streams: usize,
    /// Streams the proxy had to reset for the client's protocol errors; more closes the
    /// connection (ENHANCE_YOUR_CALM).
    pub max_local_error_reset_streams: usize,
    /// The window the three flood limits below count in.
    #[serde(deserialize_with = "duration")]
    pub flood_window: Duration,
    /// RST_STREAM frames a client may send per `flood_window` (rapid reset).
    pub max_resets: u32,
    /// PING frames a client may send per `flood_window`.
    pub max_pings: u32,
    /// SETTINGS frames a client may send per `flood_window`.
    pub max_settings: u32,
}

impl Default for Http2 {
    fn default() -> Self {
        Http2 {
            max_concurrent_streams: 256,
            max_header_list_size: 64 * 1024,
            initial_stream_window: 2 * 1024 * 1024,
            initial_connection_window: 16 * 1024 * 1024,
            max_send_buffer_size: 256 * 1024,
            max_pending_accept_reset_streams: 20,
            max_local_error_reset_streams: 1024,
            flood_window: Duration::from_secs(10),
            max_resets: 1000,
            max_pings: 100,
            max_settings: 100,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Upstream {
    /// Idle origin connections kept per origin and worker.
    pub pool_max_idle_per_host: usize,
    /// Idle origin connections kept per worker in all.
    pub pool_max_idle: usize,
    /// An idle origin connection older than this is closed, not reused.
    #[serde(deserialize_with = "duration")]
    pub pool_idle_timeout: Duration,
    /// How long a resolved name is reused.
    #[serde(deserialize_with = "duration")]
    pub dns_cache_ttl: Duration,
}

impl Default for Upstream {
    fn default() -> Self {
        Upstream {
            pool_max_idle_per_host: 256,
            pool_max_idle: 4096,
            pool_idle_timeout: Duration::from_secs(30),
            dns_cache_ttl: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Relay {
    /// Grace delay (like 3proxy's -g): after this many small reads in a row, a relay
    /// direction waits `grace_delay` before reading again, so data gathers into larger
    /// reads; while splicing, a direction is woken only once 256 KiB are queued or
    /// `grace_delay` after it began waiting. 0 turns it off (the default).
    pub grace_reads: u32,
    #[serde(deserialize_with = "duration")]
    pub grace_delay: Duration,
}

impl Default for Relay {
    fn default() -> Self {
        Relay { grace_reads: 0, grace_delay: Duration::from_millis(10) }
    }
}

/// A user defined in the configuration itself.
#[derive(Debug, Clone, Deserialize)]
pub struct UserConfig {
    pub name: String,
    /// A hash as in a users file (`$2y$…` from `htpasswd -B`, `$argon2id$…` from
    /// `rustle passwd`), or `plain:…` (discouraged).
    pub password: String,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub rate_up: Option<String>,
    #[serde(default)]
    pub rate_down: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Auth {
    /// A users file: `name:hash[:group,group]` per line.
    pub users_file: Option<PathBuf>,
    #[serde(rename = "user")]
    pub users: Vec<UserConfig>,
    /// Group name to member names.
    pub groups: std::collections::BTreeMap<String, Vec<String>>,
    /// The realm in `Proxy-Authenticate`.
    pub realm: String,
    /// How long a verified user/password pair is remembered (hashing is slow on purpose).
    #[serde(deserialize_with = "duration")]
    pub cache_ttl: Duration,
    /// Failed attempts one client address may make at once, and how many more per minute.
    pub failures_burst: u32,
    pub failures_per_minute: u32,
    /// Threads that run password hashes for the whole process (read at start only).
    pub hash_threads: usize,
    /// Password checks that may wait for a hashing thread, across clients.
    pub max_pending_hashes: usize,
    /// Password checks one client address may have waiting or running.
    pub max_hashes_per_client: usize,
}

impl Auth {
    /// The hashing threads' sizes.
    pub fn hasher_limits(&self) -> crate::auth::HasherLimits {
        crate::auth::HasherLimits {
            threads: self.hash_threads,
            max_pending: self.max_pending_hashes,
            per_client: self.max_hashes_per_client,
        }
    }
}

impl Default for Auth {
    fn default() -> Self {
        Auth {
            users_file: None,
            users: Vec::new(),
            groups: Default::default(),
            realm: "rustle".into(),
            cache_ttl: Duration::from_secs(300),
            failures_burst: 10,
            failures_per_minute: 10,
            hash_threads: 2,
            max_pending_hashes: 64,
            max_hashes_per_client: 2,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DefaultAction {
    #[default]
    Allow,
    Deny,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Config {
    /// Worker threads, each with its own runtime and listening sockets; 0 = one per core.
    #[serde(default)]
    pub workers: usize,
    /// Accept listeners on non-loopback addresses without any access control.
    #[serde(default)]
    pub allow_open_proxy: bool,
    /// Who the process runs as once its listeners are bound.
    #[serde(default)]
    pub process: Process,
    #[serde(default, rename = "listener")]
    pub listeners: Vec<Listener>,
    #[serde(default)]
    pub log: Log,
    #[serde(default)]
    pub timeouts: Timeouts,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub http: Http,
    #[serde(default)]
    pub http2: Http2,
    #[serde(default)]
    pub upstream: Upstream,
    #[serde(default)]
    pub relay: Relay,
    #[serde(default)]
    pub tls: Tls,
    #[serde(default)]
    pub auth: Auth,
    /// Access rules, first match wins.
    #[serde(default, rename = "rule")]
    pub rules: Vec<crate::acl::RuleConfig>,
    /// What happens to a request no rule matches.
    #[serde(default)]
    pub default_action: DefaultAction,
    /// Refuse destinations on loopback, link-local, private (RFC 1918, ULA, CGNAT)
    /// addresses and cloud metadata endpoints, checked on the address actually connected
    /// to: for deployments serving untrusted clients.
    #[serde(default)]
    pub deny_private_destinations: bool,
    /// Other proxies to go through (`[[parent]]`).
    #[serde(default, rename = "parent")]
    pub parents: Vec<ParentConfig>,
    /// Parents picked among by weight or by a hash (`[[group]]`).
    #[serde(default, rename = "group")]
    pub groups: Vec<GroupConfig>,
    /// Which requests go through which parents, first match wins; none matching: direct.
    #[serde(default, rename = "route")]
    pub routes: Vec<RouteConfig>,
    /// The metrics and health endpoint (`[admin]`), off unless `listen` is set.
    #[serde(default)]
    pub admin: Admin,
}

/// `[admin]`: Prometheus metrics at `/metrics`, `/healthz` and `/readyz`, on a listener of
/// their own (its own thread, not a worker). Read at start only.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Admin {
    /// Where the admin endpoint listens; None: no admin endpoint.
    pub listen: Option<SocketAddr>,
    /// When set, every request needs `Authorization: Bearer TOKEN`.
    pub token: Option<Secret>,
    /// When not empty, only clients in these address blocks are answered.
    #[serde(deserialize_with = "cidrs")]
    pub allow: Vec<crate::acl::Cidr>,
    /// Users with a series of their own (the most traffic); the rest are summed under
    /// `user="other"`, so that the output stays bounded however many users there are.
    pub max_user_series: usize,
}

/// Users with series of their own by default: enough for a team, few enough that a scrape
/// stays small.
pub const DEFAULT_MAX_USER_SERIES: usize = 100;

impl Default for Admin {
    fn default() -> Self {
        Admin {
            listen: None,
            token: None,
            allow: Vec::new(),
            max_user_series: DEFAULT_MAX_USER_SERIES,
        }
    }
}

impl Admin {
    /// Why this admin listener would expose the proxy's metrics to anyone who can reach
    /// it, if it would: a non-loopback address needs a token or client blocks (the spirit
    /// of the proxy listeners' open-proxy check).
    pub fn open_problem(&self) -> Option<String> {
        let listen = self.listen?;
        if listen.ip().is_loopback() || self.token.is_some() || !self.allow.is_empty() {
            return None;
        }
        Some(format!(
            "admin listener on {listen} would serve metrics (users, traffic, parents) to \
             anyone who can reach it: bind it to a loopback address, or set `token` or \
             `allow` in [admin]"
        ))
    }
}

fn cidrs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<crate::acl::Cidr>, D::Error> {
    let list = Vec::<String>::deserialize(d)?;
    list.iter().map(|s| s.parse().map_err(serde::de::Error::custom)).collect()
}

/// `[process]`: once the listeners are bound (ports below 1024 included), run as `user`
/// (with its primary group, or `group`): for a proxy started as root. `control_socket`:
/// where the running process answers `rustle --takeover` (see `control_socket_path`).
/// Read at start only.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct Process {
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub control_socket: Option<PathBuf>,
}

impl Process {
    /// The control socket: `control_socket` when set; otherwise `rustle.sock` in
    /// `$RUNTIME_DIRECTORY` (systemd's `RuntimeDirectory=`), `/run/rustle/` for root, or
    /// `$XDG_RUNTIME_DIR`; None (no takeover) when none applies.
    pub fn control_socket_path(&self) -> Option<PathBuf> {
        if let Some(path) = &self.control_socket {
            return Some(path.clone());
        }
        if let Some(dir) = std::env::var_os("RUNTIME_DIRECTORY").filter(|d| !d.is_empty()) {
            // systemd may list several, separated by colons: the first is ours.
            let first = dir.to_string_lossy().split(':').next().unwrap_or_default().to_string();
            return Some(PathBuf::from(first).join("rustle.sock"));
        }
        if nix::unistd::geteuid().is_root() {
            return Some(PathBuf::from("/run/rustle/rustle.sock"));
        }
        std::env::var_os("XDG_RUNTIME_DIR")
            .filter(|d| !d.is_empty())
            .map(|d| PathBuf::from(d).join("rustle.sock"))
    }
}

/// With no listener in the file or on the command line: HTTP and SOCKS detected on the
/// usual HTTP proxy port, and SOCKS on the usual SOCKS port.
pub const DEFAULT_AUTO: &str = "127.0.0.1:3128";
pub const DEFAULT_SOCKS: &str = "127.0.0.1:1080";

/// The configuration file read when none is given, if it exists.
pub const DEFAULT_FILE: &str = "/etc/rustle/rustle.toml";

/// The file to read when none is given (if it exists): `$RUSTLE_CONFIG` when that is set
/// (empty: none), `DEFAULT_FILE` otherwise.
pub fn default_file() -> Option<PathBuf> {
    match std::env::var_os("RUSTLE_CONFIG") {
        Some(path) if path.is_empty() => None,
        Some(path) => Some(PathBuf::from(path)),
        None => Some(PathBuf::from(DEFAULT_FILE)),
    }
}

/// One problem in a configuration file, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// All the problems of one file.
#[derive(Debug)]
pub struct Problems {
    pub file: PathBuf,
    pub list: Vec<Problem>,
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.list.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}: {p}", self.file.display())?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

/// Configuration text parsed: what could be read of it, and every problem found.
pub struct Parsed {
    /// The configuration, each value that did not deserialize left at its default (a table
    /// missing a required key left out): complete only when `problems` is empty.
    pub config: Config,
    /// In the order of the file.
    pub problems: Vec<Problem>,
    /// Where the configuration's keys are in the text.
    pub lines: Lines,
}

/// Where keys are in a configuration text, by their path in the configuration as parsed
/// (`["listener", "0", "tls", "cert"]`: the first listener read, which is not the first
/// in the file when one before it was left out).
#[derive(Default)]
pub struct Lines {
    text: String,
    doc: Option<toml_edit::Document<String>>,
    removed: collect::Removed,
}

impl Lines {
    /// The line of the key at `segs` (map keys and array indexes).
    pub fn of(&self, segs: &[&str]) -> Option<usize> {
        let segs: Vec<String> = segs.iter().map(|s| s.to_string()).collect();
        self.at(&segs)
    }

    fn at(&self, segs: &[String]) -> Option<usize> {
        self.at_original(&self.removed.original(segs))
    }

    /// The line of the key at `segs`, a path in the file as written.
    fn at_original(&self, segs: &[String]) -> Option<usize> {
        key_offset(self.doc.as_ref()?, segs).map(|o| self.line_of(o))
    }

    fn line_of(&self, offset: usize) -> usize {
        let text = &self.text;
        text[..offset.min(text.len())].matches('\n').count() + 1
    }

    /// Whether a value at or inside `segs` did not deserialize (and was reported so): the
    /// checks after parsing say nothing more of it.
    pub fn damaged(&self, segs: &[&str]) -> bool {
        let segs: Vec<String> = segs.iter().map(|s| s.to_string()).collect();
        self.damaged_at(&segs)
    }

    fn damaged_at(&self, segs: &[String]) -> bool {
        self.removed.is_damaged(&self.removed.original(segs))
    }
}

impl Config {
    /// Reads and checks a file.
    pub fn load(path: &Path) -> Result<Config, Problems> {
        let text = std::fs::read_to_string(path).map_err(|e| Problems {
            file: path.to_owned(),
            list: vec![Problem { line: None, message: format!("cannot read: {e}") }],
        })?;
        Config::parse(&text).map_err(|list| Problems { file: path.to_owned(), list })
    }

    /// Parses and checks configuration text, returning every problem found.
    pub fn parse(text: &str) -> Result<Config, Vec<Problem>> {
        let parsed = Config::parse_all(text);
        match parsed.problems.is_empty() {
            true => Ok(parsed.config),
            false => Err(parsed.problems),
        }
    }

    /// Parses and checks configuration text: every problem, in the order of the file, and
    /// the configuration with each value that did not deserialize left at its default (a
    /// table missing a required key left out), for the checks that come after (`rustle
    /// check` goes on to the files it names and the users they define).
    pub fn parse_all(text: &str) -> Parsed {
        let mut lines = Lines { text: text.to_string(), ..Default::default() };
        let mut problems = Vec::new();
        // A syntax error leaves nothing to deserialize.
        let table = match toml_edit::Document::parse(text.to_string()) {
            Ok(doc) => {
                lines.doc = Some(doc);
                text.parse::<toml::Table>().map_err(|e| (e.span(), e.message().to_string()))
            }
            Err(e) => Err((e.span(), e.message().to_string())),
        };
        let table = match table {
            Ok(t) => t,
            Err((span, message)) => {
                let line = span.map(|s| lines.line_of(s.start));
                problems.push(Problem { line, message: message.trim().to_string() });
                return Parsed { config: Config::default(), problems, lines };
            }
        };
        let collected = collect::deserialize::<Config>(toml::Value::Table(table));
        lines.removed = collected.removed;
        let mut config = collected.value;
        // (Paths in the file as written.)
        for segs in &collected.unknown {
            let line = lines.at_original(segs);
            problems.push(Problem { line, message: format!("unknown key `{}`", segs.join(".")) });
        }
        for (segs, message) in collected.errors {
            problems.push(Problem { line: lines.at_original(&segs), message });
        }
        let line_in = |segs: &[&str]| lines.of(segs);
        for (i, l) in config.listeners.iter().enumerate() {
            // A listener with a value that did not deserialize is reported for that alone.
            if lines.damaged(&["listener", &i.to_string()]) {
                continue;
            }
            let line_at = |key: &str| line_in(&["listener", &i.to_string(), key]);
            if let Some(message) = open_proxy_problem(&config, l) {
                problems.push(Problem { line: line_at("listen"), message });
            }
            if let Some(message) = target_problem(l) {
                problems.push(Problem { line: line_at("kind"), message });
            }
            if let Some(message) = loop_problem(&config.listeners, l) {
                problems.push(Problem { line: line_at("target"), message });
            }
            if l.h2c && !matches!(l.kind, ListenerKind::Http | ListenerKind::Auto) {
                let message = format!("h2c is for http and auto listeners, not {}", l.kind);
                problems.push(Problem { line: line_at("h2c"), message });
            }
            for (key, value) in [("rate_up", &l.rate_up), ("rate_down", &l.rate_down)] {
                if let Some(Err(e)) = value.as_deref().map(crate::limits::parse_rate) {
                    problems.push(Problem { line: line_at(key), message: format!("{key}: {e}") });
                }
            }
        }
        for (i, rule) in config.rules.iter_mut().enumerate() {
            rule.groups_line = line_in(&["rule", &i.to_string(), "groups"]);
            rule.users_line = line_in(&["rule", &i.to_string(), "users"]);
        }
        for (i, route) in config.routes.iter_mut().enumerate() {
            route.groups_line = line_in(&["route", &i.to_string(), "groups"]);
            route.users_line = line_in(&["route", &i.to_string(), "users"]);
        }
        let routing =
            routing::problems(&config.parents, &config.groups, &config.routes, &config.listeners);
        for (segs, message) in routing {
            if !lines.damaged_at(&segs) {
                problems.push(Problem { line: lines.at(&segs), message });
            }
        }
        let default_allow = config.default_action == DefaultAction::Allow;
        if let Err(errs) = crate::acl::RuleSet::compile(&config.rules, default_allow) {
            for (i, e) in errs {
                if lines.damaged(&["rule", &i.to_string()]) {
                    continue;
                }
                let line = line_in(&["rule", &i.to_string()]);
                problems.push(Problem { line, message: format!("rule {}: {e}", i + 1) });
            }
        }
        let mut users = crate::auth::Users::default();
        for (i, u) in config.auth.users.iter().enumerate() {
            if lines.damaged(&["auth", "user", &i.to_string()]) {
                continue;
            }
            if let Err(e) = users.add(&u.name, &u.password, &u.groups) {
                let line = line_in(&["auth", "user", &i.to_string(), "name"]);
                problems.push(Problem { line, message: format!("auth.user `{}`: {e}", u.name) });
            }
        }
        for (key, value) in [
            ("user_rate_up", &config.limits.user_rate_up),
            ("user_rate_down", &config.limits.user_rate_down),
        ] {
            if let Some(Err(e)) = value.as_deref().map(crate::limits::parse_rate) {
                let line = line_in(&["limits", key]);
                problems.push(Problem { line, message: format!("limits.{key}: {e}") });
            }
        }
        if config.limits.max_header_bytes < 1024 {
            problems.push(Problem {
                line: None,
                message: "limits.max_header_bytes must be at least 1024".into(),
            });
        }
        for (key, value) in [
            ("hash_threads", config.auth.hash_threads),
            ("max_pending_hashes", config.auth.max_pending_hashes),
            ("max_hashes_per_client", config.auth.max_hashes_per_client),
        ] {
            if value == 0 {
                let line = line_in(&["auth", key]);
                problems.push(Problem { line, message: format!("auth.{key} must be at least 1") });
            }
        }
        if let Some(message) = config.admin.open_problem() {
            problems.push(Problem { line: line_in(&["admin", "listen"]), message });
        }
        problems.extend(http2_problems(&config.http2).into_iter().map(|(key, message)| Problem {
            line: line_in(&["http2", key]),
            message: format!("http2.{key}: {message}"),
        }));
        // In the order of the file; problems of no one line last.
        problems.sort_by_key(|p| p.line.unwrap_or(usize::MAX));
        Parsed { config, problems, lines }
    }

    /// Listeners to start: those configured, or the default ones, each with its `key`.
    pub fn effective_listeners(&self) -> Vec<Listener> {
        let mut listeners = if self.listeners.is_empty() {
            // Constants that always parse.
            let auto = DEFAULT_AUTO.parse().unwrap_or_else(|_| unreachable!());
            let socks = DEFAULT_SOCKS.parse().unwrap_or_else(|_| unreachable!());
            vec![Listener::new(ListenerKind::Auto, auto), Listener::new(ListenerKind::Socks, socks)]
        } else {
            self.listeners.clone()
        };
        assign_keys(&mut listeners);
        listeners
    }

    /// Checks that need the final listener list (after command-line overrides).
    pub fn check_listeners(&self) -> Result<(), String> {
        let listeners = self.effective_listeners();
        for l in &listeners {
            if let Some(msg) = open_proxy_problem(self, l)
                .or_else(|| target_problem(l))
                .or_else(|| loop_problem(&listeners, l))
            {
                return Err(msg);
            }
        }
        match self.parents.iter().find_map(|p| routing::loop_problem(p, &listeners)) {
            Some(message) => Err(message),
            None => Ok(()),
        }
    }

    /// The problems of the parents, groups and routes (without lines: `Config::parse`
    /// reports them with theirs), for code that builds a configuration itself.
    pub fn routing_problems(&self) -> Vec<String> {
        routing::problems(&self.parents, &self.groups, &self.routes, &self.listeners)
            .into_iter()
            .map(|(_, message)| message)
            .collect()
    }

    /// Worker count after resolving 0 to the number of cores.
    pub fn worker_count(&self) -> usize {
        if self.workers > 0 {
            self.workers
        } else {
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
        }
    }
}

/// The command line's options that override the file. Start-up applies them on top of the
/// file, and every SIGHUP applies them again on top of the file as re-read, so that they
/// stay in force for the life of the process.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Listeners given on the command line: they replace the file's.
    pub listeners: Vec<Listener>,
    /// `--users`: the users file; the command line's listeners (or the default ones, when
    /// the file has none) then require authentication.
    pub users_file: Option<PathBuf>,
    pub workers: Option<usize>,
    pub log_format: Option<LogFormat>,
    pub access_log: Option<LogTarget>,
}

impl Overrides {
    pub fn apply(&self, cfg: &mut Config) {
        let from_cli = !self.listeners.is_empty();
        if from_cli {
            cfg.listeners.clone_from(&self.listeners);
        }
        if let Some(users) = &self.users_file {
            cfg.auth.users_file = Some(users.clone());
            if from_cli || cfg.listeners.is_empty() {
                cfg.listeners = cfg.effective_listeners();
                for l in &mut cfg.listeners {
                    if l.kind != ListenerKind::Relay && l.kind != ListenerKind::UdpRelay {
                        l.auth = true;
                    }
                }
            }
        }
        if let Some(n) = self.workers {
            cfg.workers = n;
        }
        if let Some(format) = &self.log_format {
            cfg.log.format = format.clone();
        }
        if let Some(access) = &self.access_log {
            cfg.log.access = access.clone();
        }
    }
}

/// Where the configuration comes from: a file (or none: the defaults), and the command
/// line on top. Start-up and SIGHUP derive it the same way.
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub file: Option<PathBuf>,
    pub overrides: Overrides,
}

/// A configuration as derived from its source.
#[derive(Debug)]
pub struct Loaded {
    pub config: Config,
    /// The listeners to run are the file's (neither the command line's nor the defaults).
    pub listeners_from_file: bool,
    /// The file holds nothing but blank lines and comments (or there is no file).
    pub blank: bool,
}

impl Source {
    /// Reads the file and puts the command line's options on top of it.
    pub fn read(&self) -> Result<Loaded, Problems> {
        let (mut config, blank) = match &self.file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| Problems {
                    file: path.to_owned(),
                    list: vec![Problem { line: None, message: format!("cannot read: {e}") }],
                })?;
                let blank = text.lines().map(str::trim).all(|l| l.is_empty() || l.starts_with('#'));
                let cfg = Config::parse(&text)
                    .map_err(|list| Problems { file: path.to_owned(), list })?;
                (cfg, blank)
            }
            None => (Config::default(), true),
        };
        let listeners_from_file =
            self.overrides.listeners.is_empty() && !config.listeners.is_empty();
        self.overrides.apply(&mut config);
        Ok(Loaded { config, listeners_from_file, blank })
    }
}

impl fmt::Display for Source {
    /// Names what a reload reads: the file and the users file of the command line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, &self.overrides.users_file) {
            (Some(file), Some(users)) => {
                write!(f, "{} and the users file {}", file.display(), users.display())
            }
            (Some(file), None) => write!(f, "{}", file.display()),
            (None, Some(users)) => write!(f, "the users file {}", users.display()),
            (None, None) => f.write_str("the command line"),
        }
    }
}

impl Config {
    /// Why listener `l` would be an open proxy under this configuration's rules, if it
    /// would (the start-up check; SIGHUP runs it on the listeners already running).
    pub fn open_proxy_problem(&self, l: &Listener) -> Option<String> {
        open_proxy_problem(self, l)
    }
}

/// A listener reachable from other machines with neither authentication nor a rule
/// restricting client addresses would be an open proxy: refuse it unless the operator
/// says so explicitly.
fn open_proxy_problem(config: &Config, l: &Listener) -> Option<String> {
    if l.listen.ip().is_loopback() || config.allow_open_proxy || l.auth {
        return None;
    }
    let default_allow = config.default_action == DefaultAction::Allow;
    if let Ok(rules) = crate::acl::RuleSet::compile(&config.rules, default_allow) {
        let restricted = match &l.name {
            Some(name) => rules.restricts_clients_on(name),
            None => rules.restricts_clients(),
        };
        if restricted {
            return None;
        }
    }
    Some(format!(
        "listener {} on {} would be an open proxy: anyone who can reach it could use it. \
         Bind it to a loopback address, set `auth = true` on it (with users in [auth]), \
         add a [[rule]] limiting `clients`, or set `allow_open_proxy = true` at the top of \
         the configuration if that is really what you want",
        l.kind, l.listen
    ))
}

/// Values h2 would refuse (it panics on windows above 2^31-1) or that make no sense.
fn http2_problems(h: &Http2) -> Vec<(&'static str, String)> {
    // RFC 9113 6.9.1: a flow-control window is at most 2^31-1.
    const MAX_WINDOW: u32 = (1 << 31) - 1;
    let mut out = Vec::new();
    for (key, v) in [
        ("initial_stream_window", h.initial_stream_window),
        ("initial_connection_window", h.initial_connection_window),
    ] {
        if !(65_535..=MAX_WINDOW).contains(&v) {
            out.push((key, format!("must be between 65535 and {MAX_WINDOW}")));
        }
    }
    if h.max_concurrent_streams == 0 {
        out.push(("max_concurrent_streams", "must be at least 1".into()));
    }
    if h.max_header_list_size < 1024 {
        out.push(("max_header_list_size", "must be at least 1024".into()));
    }
    if h.max_send_buffer_size < 16 * 1024 || h.max_send_buffer_size > MAX_WINDOW as usize {
        out.push(("max_send_buffer_size", "must be between 16384 and 2147483647".into()));
    }
    if h.flood_window.is_zero() {
        out.push(("flood_window", "must not be zero".into()));
    }
    out
}

fn target_problem(l: &Listener) -> Option<String> {
    match (l.kind.needs_target(), &l.target) {
        (true, None) => {
            return Some(format!("a {} listener needs `target = \"host:port\"`", l.kind))
        }
        (false, Some(_)) => return Some(format!("a {} listener takes no `target`", l.kind)),
        _ => {}
    }
    match (l.kind, &l.tls) {
        (ListenerKind::Https, None) => {
            return Some(
                "an https listener needs [listener.tls] with `cert` and `key` \
                 (try `rustle cert --self-signed NAME`)"
                    .into(),
            )
        }
        (ListenerKind::Http, Some(_)) => {
            return Some("an http listener takes no [listener.tls]: use kind = \"https\"".into())
        }
        (ListenerKind::Socks | ListenerKind::UdpRelay, Some(_)) => {
            return Some(format!("a {} listener takes no [listener.tls]", l.kind))
        }
        _ => {}
    }
    if l.target_tls.is_some() && l.kind != ListenerKind::Relay {
        return Some(format!("a {} listener takes no [listener.target_tls]", l.kind));
    }
    if l.auth && l.kind.needs_target() {
        // Accepted and ignored, `auth` would read as protection a relay does not give.
        return Some(format!(
            "a {} listener takes no `auth`: it asks no credentials (limit it with client \
             rules, or client certificates on a TLS relay)",
            l.kind
        ));
    }
    None
}

/// A relay whose target is one of the proxy's own listeners (on the same transport) would
/// connect to itself: every connection or datagram would come back in. Addresses and
/// `localhost` are recognised here, with the built-in check's notion of "the same
/// address" (a wildcard listener is every local address); other names, and listeners on
/// port 0, are known only at run time (where the TCP relay's connect refuses the loop).
fn loop_problem(listeners: &[Listener], l: &Listener) -> Option<String> {
    let target = l.target.as_ref().filter(|_| l.kind.needs_target())?;
    let udp = l.kind == ListenerKind::UdpRelay;
    let o = own_listener(listeners, &target.host, target.port, udp)?;
    Some(format!(
        "target {target} of the {} listener on {} is this proxy's own listener {} \
         ({}): the relay would connect to itself",
        l.kind, l.listen, o.listen, o.kind
    ))
}

/// The listener that connecting to `host:port` (over UDP or TCP) would reach, as far as
/// the configuration tells: addresses and `localhost`, with the built-in check's notion of
/// "the same address" (a wildcard listener is every local address); other names, and
/// listeners on port 0, are known only at run time.
fn own_listener<'a>(
    listeners: &'a [Listener],
    host: &str,
    port: u16,
    udp: bool,
) -> Option<&'a Listener> {
    let ips: Vec<std::net::IpAddr> = match host.parse() {
        Ok(ip) => vec![ip],
        Err(_) if host == "localhost" => {
            vec![std::net::Ipv4Addr::LOCALHOST.into(), std::net::Ipv6Addr::LOCALHOST.into()]
        }
        Err(_) => return None,
    };
    listeners
        .iter()
        .filter(|o| o.listen.port() != 0 && (o.kind == ListenerKind::UdpRelay) == udp)
        .find(|o| ips.iter().any(|&ip| crate::acl::reaches(SocketAddr::new(ip, port), o.listen)))
}

/// Byte offset of the key at `segs` (map keys and array indexes) in the document. Items
/// are cloned as the walk goes: this runs only when reporting errors.
fn key_offset(doc: &toml_edit::Document<String>, segs: &[String]) -> Option<usize> {
    use toml_edit::{Item, Value};
    let mut item = doc.as_item().clone();
    let mut offset = None;
    for seg in segs {
        let next = if let Ok(i) = seg.parse::<usize>() {
            match &item {
                Item::ArrayOfTables(a) => {
                    let t = a.get(i)?;
                    offset = t.span().map(|s| s.start).or(offset);
                    Item::Table(t.clone())
                }
                Item::Value(Value::Array(a)) => {
                    let v = a.get(i)?;
                    offset = v.span().map(|s| s.start).or(offset);
                    Item::Value(v.clone())
                }
                _ => return offset,
            }
        } else {
            let (key, value) = item.as_table_like()?.get_key_value(seg)?;
            offset = key.span().map(|s| s.start).or(offset);
            value.clone()
        };
        item = next;
    }
    offset
}

/// Accepts `"250ms"`, `"10s"`, `"5m"`, `"1h"` or a bare number of seconds; anything else
/// is refused naming what was expected and what was found (`io = -5`: a negative number).
fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    struct Visitor;
    impl serde::de::Visitor<'_> for Visitor {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration: a number of seconds (0 or more) or text such as \"10s\", \"250ms\", \"5m\", \"1h\"")
        }

        fn visit_u64<E: serde::de::Error>(self, s: u64) -> Result<Duration, E> {
            at_most_a_year(Duration::from_secs(s), &s.to_string()).map_err(E::custom)
        }

        fn visit_i64<E: serde::de::Error>(self, s: i64) -> Result<Duration, E> {
            match u64::try_from(s) {
                Ok(s) => self.visit_u64(s),
                Err(_) => Err(E::invalid_value(serde::de::Unexpected::Signed(s), &self)),
            }
        }

        fn visit_str<E: serde::de::Error>(self, t: &str) -> Result<Duration, E> {
            parse_duration(t).map_err(E::custom)
        }
    }
    d.deserialize_any(Visitor)
}

/// The longest duration a setting takes: deadlines are instants, and "forever" written as a
/// huge number must be an error, not an overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

fn at_most_a_year(d: Duration, text: &str) -> Result<Duration, String> {
    if d > MAX_DURATION {
        return Err(format!("duration `{text}` is too long: at most 365 days"));
    }
    Ok(d)
}

pub fn parse_duration(t: &str) -> Result<Duration, String> {
    let t = t.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid duration `{t}`"))?;
    let too_long = || format!("duration `{t}` is too long: at most 365 days");
    let d = match unit.trim() {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(too_long)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(too_long)?),
        _ => return Err(format!("invalid duration `{t}`: use ms, s, m or h")),
    };
    at_most_a_year(d, t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_the_default() {
        let c = Config::parse("").expect("empty config");
        let l = c.effective_listeners();
        assert_eq!(l[0].listen.to_string(), DEFAULT_AUTO);
        assert_eq!(l[0].kind, ListenerKind::Auto);
        assert_eq!(l[1].listen.to_string(), DEFAULT_SOCKS);
        assert_eq!(c.timeouts.header, Duration::from_secs(10));
    }

    #[test]
    fn full_file_parses() {
        let text = "workers = 2\n[[listener]]\nkind = \"http\"\nlisten = \"127.0.0.1:8080\"\n\
                    [[listener]]\nlisten = \"[::1]:8081\"\n[log]\naccess = \"off\"\nformat = \"json\"\n\
                    [timeouts]\nheader = \"500ms\"\nconnect = 3\n[http]\nvia = true\n";
        let c = Config::parse(text).expect("valid config");
        assert_eq!(c.workers, 2);
        assert_eq!(c.listeners.len(), 2);
        assert_eq!(c.log.access, LogTarget::Off);
        assert_eq!(c.log.format, LogFormat::Json);
        assert_eq!(c.timeouts.header, Duration::from_millis(500));
        assert_eq!(c.timeouts.connect, Duration::from_secs(3));
        assert!(c.http.via);
    }

    #[test]
    fn unknown_keys_are_all_reported_with_lines() {
        let text = "workerz = 2\n[log]\nformat = \"plain\"\ncolour = true\n\
                    [[listener]]\nlisten = \"127.0.0.1:1\"\nport = 3\n";
        let p = Config::parse(text).expect_err("unknown keys");
        let shown: Vec<String> = p.iter().map(|p| p.to_string()).collect();
        assert!(shown.contains(&"line 1: unknown key `workerz`".to_string()), "{shown:?}");
        assert!(shown.contains(&"line 4: unknown key `log.colour`".to_string()), "{shown:?}");
        assert!(shown.contains(&"line 7: unknown key `listener.0.port`".to_string()), "{shown:?}");
    }

    #[test]
    fn hashing_thread_and_queue_sizes_of_zero_are_refused_with_lines() {
        let c = Config::parse("[auth]\nhash_threads = 1\n").expect("valid");
        assert_eq!(c.auth.hasher_limits().threads, 1);
        assert_eq!((c.auth.max_pending_hashes, c.auth.max_hashes_per_client), (64, 2));
        let text = "[auth]\nhash_threads = 0\nmax_pending_hashes = 0\nmax_hashes_per_client = 0\n";
        let p = Config::parse(text).expect_err("zeros");
        let shown: Vec<String> = p.iter().map(|p| p.to_string()).collect();
        for (line, key) in
            [(2, "hash_threads"), (3, "max_pending_hashes"), (4, "max_hashes_per_client")]
        {
            let want = format!("line {line}: auth.{key} must be at least 1");
            assert!(shown.contains(&want), "{want} in {shown:?}");
        }
    }

    #[test]
    fn type_errors_have_lines() {
        let p = Config::parse("\n\n[timeouts]\nheader = \"ten seconds\"\n").expect_err("bad");
        assert_eq!(p[0].line, Some(4), "{p:?}");
        assert!(p[0].message.contains("invalid duration"), "{p:?}");
        let p = Config::parse("[[listener]]\nlisten = \"nowhere\"\n").expect_err("bad");
        assert_eq!(p[0].line, Some(2), "{p:?}");
    }

    #[test]
    fn a_type_error_hides_nothing_after_it() {
        let text = "[timeouts]\nheader = \"ten seconds\"\n\
                    [[listener]]\nlisten = \"nowhere\"\n\
                    [[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:1080\"\nh2c = true\n\
                    [[listener]]\nkind = \"relay\"\nlisten = \"127.0.0.1:8000\"\n\
                    target = \"127.0.0.1:1080\"\n\
                    [limits]\nmax_connections = \"many\"\n";
        let p = Config::parse(text).expect_err("five faults");
        let lines: Vec<Option<usize>> = p.iter().map(|p| p.line).collect();
        // One problem each: the listener whose `listen` is no address is not reported again
        // as missing it, and the listeners after it keep their own lines.
        assert_eq!(lines, [Some(2), Some(4), Some(8), Some(12), Some(14)], "{p:?}");
        let wants = ["invalid duration", "nowhere", "h2c", "own listener", "expected usize"];
        for (problem, want) in p.iter().zip(wants) {
            assert!(problem.message.contains(want), "{want}: {p:?}");
        }
        // What could be read is there for the checks after parsing.
        let parsed = Config::parse_all(text);
        assert_eq!(parsed.config.listeners.len(), 2);
        assert_eq!(parsed.lines.of(&["listener", "0", "kind"]), Some(6));
        assert!(parsed.lines.damaged(&["timeouts", "header"]));
        assert!(!parsed.lines.damaged(&["listener", "0"]));
    }

    #[test]
    fn a_syntax_error_is_reported_with_its_line() {
        let p = Config::parse("workers = 1\n[limits\nmax_connections = 3\n").expect_err("bad");
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].line, Some(2), "{p:?}");
    }

    #[test]
    fn public_listener_needs_explicit_consent() {
        let text = "[[listener]]\nlisten = \"0.0.0.0:3128\"\n";
        let p = Config::parse(text).expect_err("open proxy");
        assert_eq!(p[0].line, Some(2));
        assert!(p[0].message.contains("open proxy"));
        let ok = format!("allow_open_proxy = true\n{text}");
        assert!(Config::parse(&ok).is_ok());
    }

    #[test]
    fn admin_section() {
        let text = "[admin]\nlisten = \"127.0.0.1:9090\"\nmax_user_series = 5\n";
        let c = Config::parse(text).expect("valid admin");
        assert_eq!(c.admin.listen, Some("127.0.0.1:9090".parse().expect("address")));
        assert_eq!(c.admin.max_user_series, 5);
        assert!(c.admin.token.is_none() && c.admin.allow.is_empty());
        assert_eq!(
            Config::parse("").expect("empty").admin.max_user_series,
            DEFAULT_MAX_USER_SERIES
        );
        // Reachable from other machines with no token and no client blocks: refused,
        // with the line of `listen`.
        let open = "workers = 1\n[admin]\nlisten = \"0.0.0.0:9090\"\n";
        let p = Config::parse(open).expect_err("open admin");
        assert_eq!(p[0].line, Some(3), "{p:?}");
        assert!(p[0].message.contains("admin listener on 0.0.0.0:9090"), "{p:?}");
        for protect in ["token = \"s3cret\"", "allow = [\"10.0.0.0/8\"]"] {
            assert!(Config::parse(&format!("{open}{protect}\n")).is_ok(), "{protect}");
        }
        // A bad block and an unknown key are reported with their lines.
        let p = Config::parse("[admin]\nport = 1\n").expect_err("unknown key");
        assert_eq!(p[0].to_string(), "line 2: unknown key `admin.port`");
        let p = Config::parse("[admin]\nallow = [\"10.1.0.0/8\"]\n").expect_err("bad block");
        assert_eq!(p[0].line, Some(2), "{p:?}");
        assert!(p[0].message.contains("host bits"), "{p:?}");
    }

    #[test]
    fn the_example_file_is_valid() {
        let text = include_str!("../../../rustle.example.toml");
        let c = Config::parse(text).expect("rustle.example.toml must stay valid");
        assert_eq!(c.listeners.len(), 1);
    }

    #[test]
    fn the_example_documents_http2_with_its_defaults() {
        let text = include_str!("../../../rustle.example.toml");
        let c = Config::parse(text).expect("valid");
        let d = Http2::default();
        let h = &c.http2;
        assert_eq!(
            (h.max_concurrent_streams, h.max_header_list_size, h.initial_stream_window),
            (d.max_concurrent_streams, d.max_header_list_size, d.initial_stream_window)
        );
        assert_eq!(
            (h.initial_connection_window, h.max_send_buffer_size, h.flood_window),
            (d.initial_connection_window, d.max_send_buffer_size, d.flood_window)
        );
        assert_eq!(
            (h.max_pending_accept_reset_streams, h.max_local_error_reset_streams),
            (d.max_pending_accept_reset_streams, d.max_local_error_reset_streams)
        );
        assert_eq!(
            (h.max_resets, h.max_pings, h.max_settings),
            (d.max_resets, d.max_pings, d.max_settings)
        );
        let table: toml::Table = text.parse().expect("toml");
        let keys = table["http2"].as_table().map_or(0, |t| t.len());
        assert_eq!(keys, 11, "every [http2] key is in the example");
        assert!(text.contains("\nh2c = false"));
    }

    #[test]
    fn http2_values_are_checked() {
        let p = Config::parse("[http2]\ninitial_stream_window = 10\n").expect_err("bad");
        assert_eq!(p[0].line, Some(2), "{p:?}");
        assert!(p[0].message.contains("http2.initial_stream_window"), "{p:?}");
        let text = "[[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:1\"\nh2c = true\n";
        let p = Config::parse(text).expect_err("h2c on socks");
        assert_eq!(p[0].line, Some(4), "{p:?}");
    }

    #[test]
    fn relay_listeners_need_a_target() {
        let text = "[[listener]]\nkind = \"relay\"\nlisten = \"127.0.0.1:1\"\n";
        let p = Config::parse(text).expect_err("no target");
        assert_eq!(p[0].line, Some(2), "{p:?}");
        let ok = format!("{text}target = \"[::1]:80\"\n");
        let c = Config::parse(&ok).expect("valid");
        assert_eq!(c.listeners[0].target.as_ref().map(|t| t.to_string()), Some("[::1]:80".into()));
        let text = "[[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:1\"\ntarget = \"a:1\"\n";
        assert!(Config::parse(text).is_err());
        assert!("a:0".parse::<HostPort>().is_err());
        assert!("::1:80".parse::<HostPort>().is_err());
        assert_eq!("Example.COM:443".parse::<HostPort>().map(|h| h.host), Ok("example.com".into()));
    }

    #[test]
    fn a_relay_takes_no_auth() {
        for kind in ["relay", "udp-relay"] {
            let text = format!(
                "[[listener]]\nkind = \"{kind}\"\nlisten = \"127.0.0.1:1\"\n\
                 target = \"127.0.0.1:2\"\nauth = true\n"
            );
            let p = Config::parse(&text).expect_err("auth on a relay");
            assert!(p[0].message.contains("takes no `auth`"), "{p:?}");
        }
    }

    #[test]
    fn a_relay_to_an_own_listener_is_refused() {
        // (listeners before the relay, the relay's kind, its target, a loop?)
        let table: &[(&str, &str, &str, bool)] = &[
            ("", "relay", "127.0.0.1:8000", true),
            ("", "relay", "localhost:8000", true),
            ("", "relay", "[::ffff:127.0.0.1]:8000", true),
            ("", "relay", "0.0.0.0:8000", true),
            ("", "relay", "127.0.0.1:8001", false),
            ("", "relay", "127.0.0.2:8000", false),
            ("", "relay", "example.com:8000", false),
            ("", "udp-relay", "127.0.0.1:8000", true),
            // Another listener of the proxy, on the same transport.
            ("listen = \"0.0.0.0:3128\"", "relay", "127.0.0.5:3128", true),
            ("listen = \"127.0.0.1:3128\"", "relay", "localhost:3128", true),
            ("listen = \"[::1]:3128\"", "relay", "localhost:3128", true),
            ("listen = \"127.0.0.1:3128\"", "udp-relay", "127.0.0.1:3128", false),
            (
                "kind = \"udp-relay\"\nlisten = \"127.0.0.1:53\"\ntarget = \"192.0.2.1:53\"",
                "relay",
                "127.0.0.1:53",
                false,
            ),
            (
                "kind = \"udp-relay\"\nlisten = \"127.0.0.1:53\"\ntarget = \"192.0.2.1:53\"",
                "udp-relay",
                "127.0.0.1:53",
                true,
            ),
            // Port 0 is chosen at start: never a loop here (the built-in check refuses it then).
            ("listen = \"127.0.0.1:0\"", "relay", "127.0.0.1:9", false),
        ];
        for (other, kind, target, want) in table {
            // (Open-proxy consent for the 0.0.0.0 listener.)
            let mut text = "allow_open_proxy = true\n".to_string();
            if !other.is_empty() {
                text.push_str(&format!("[[listener]]\n{other}\n"));
            }
            let target_line = text.lines().count() + 4;
            text.push_str(&format!(
                "[[listener]]\nkind = \"{kind}\"\nlisten = \"127.0.0.1:8000\"\n\
                 target = \"{target}\"\n"
            ));
            match (Config::parse(&text), want) {
                (Ok(_), false) => {}
                (Err(p), true) => {
                    assert_eq!(p.len(), 1, "{text}\n{p:?}");
                    assert_eq!(p[0].line, Some(target_line), "{text}\n{p:?}");
                    assert!(p[0].message.contains("own listener"), "{text}\n{p:?}");
                }
                (got, _) => panic!("{text}\n{got:?}"),
            }
        }
        // Listeners given on the command line are checked at start the same way.
        let mut c = Config::default();
        let mut relay = Listener::new(ListenerKind::Relay, "127.0.0.1:8000".parse().expect("addr"));
        relay.target = Some("127.0.0.1:8000".parse().expect("target"));
        c.listeners.push(relay);
        assert!(c.check_listeners().expect_err("loop").contains("own listener"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("2 fortnights").is_err());
        assert!(parse_duration("").is_err());
        // "Forever" as a huge number is refused, not overflowed.
        assert_eq!(parse_duration("8760h"), Ok(MAX_DURATION));
        assert!(parse_duration("8761h").expect_err("over a year").contains("too long"));
        assert!(parse_duration("99999999999999999999h").is_err());
        assert!(parse_duration("18446744073709551615m")
            .expect_err("overflow")
            .contains("too long"));
        let e = Config::parse("[timeouts]\ntunnel_idle = 9223372036854775807\n").expect_err("huge");
        assert!(format!("{e:?}").contains("too long"), "{e:?}");
    }
}
