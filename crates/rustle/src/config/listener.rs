//! `[[listener]]`: what each listener speaks, where, and with which TLS; and the key that
//! names a listener across reloads.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer};

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
    pub(crate) fn as_str(self) -> &'static str {
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
    pub(crate) fn needs_target(self) -> bool {
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
    pub(crate) host: String,
    pub(crate) port: u16,
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
/// The PROXY protocol versions a listener accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyProtocol {
    V1,
    V2,
    Any,
}

impl ProxyProtocol {
    pub(crate) fn accept(self) -> rustle_proto::proxy_protocol::Accept {
        use rustle_proto::proxy_protocol::Accept;
        match self {
            ProxyProtocol::V1 => Accept::V1,
            ProxyProtocol::V2 => Accept::V2,
            ProxyProtocol::Any => Accept::Any,
        }
    }
}

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
    pub(crate) name: Option<String>,
    #[serde(default = "default_kind")]
    pub kind: ListenerKind,
    pub listen: SocketAddr,
    /// Require authentication: HTTP Basic (`Proxy-Authorization`) and SOCKS5
    /// username/password, checked against `[auth]` users.
    #[serde(default)]
    pub(crate) auth: bool,
    /// With `auth`, accept SOCKS4 clients whose user id names a configured user (SOCKS4
    /// carries no password: this trusts the client's word).
    #[serde(default)]
    pub(crate) socks4_users: bool,
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
    pub(crate) splice: SpliceMode,
    /// TLS towards clients: required by `https`; on `relay` it terminates TLS; on `auto`
    /// it lets the port recognise a TLS ClientHello (HTTP inside).
    #[serde(default)]
    pub tls: Option<ListenTls>,
    /// `relay` only: TLS towards the target (origination).
    #[serde(default)]
    pub(crate) target_tls: Option<ConnectTls>,
    /// `http` and `auto` listeners: a connection that opens with the HTTP/2 preface is
    /// served as HTTP/2 (h2c with prior knowledge). Off by default: a plain port that
    /// only ever spoke HTTP/1.1 keeps answering the preface with an error.
    #[serde(default)]
    pub h2c: bool,
    /// The operator's word that a reload (or a takeover) may leave this listener less
    /// protected than the one running at its address: no longer requiring `auth`, or
    /// client certificates. Without it such a change is refused.
    #[serde(default)]
    pub(crate) allow_less_protection: bool,
    /// `"v1"`, `"v2"` or `"any"`: every connection opens with a PROXY protocol header (a
    /// load balancer's, haproxy `send-proxy`/`send-proxy-v2`), read before anything else,
    /// whose client address is the connection's client for rules, limits, logs and
    /// metrics. Needs `proxy_protocol_from`.
    #[serde(default)]
    pub(crate) proxy_protocol: Option<ProxyProtocol>,
    /// The balancers: only connections from these address blocks may (and must) send the
    /// header; any other connection is refused and logged.
    #[serde(default, deserialize_with = "super::settings::cidrs")]
    pub(crate) proxy_protocol_from: Vec<crate::acl::Cidr>,
    /// `relay` only: `"v1"` or `"v2"`, a PROXY protocol header sent to the target before
    /// the client's bytes, naming the client (the one a `proxy_protocol` header carried,
    /// if any) and the address it connected to.
    #[serde(default)]
    pub(crate) target_proxy_protocol: Option<ProxyProtocol>,
    /// Which listener of the configuration this is (`effective_listeners` sets it): a
    /// reload, a takeover and the policy's TLS settings find a listener by it.
    #[serde(skip)]
    pub(crate) key: ListenerKey,
}

/// A listener's identity across reloads and upgrades: its address as configured (port 0
/// included), its transport, and its rank among the listeners configured with the same
/// address and transport (only port-0 listeners share an address). Reordering listeners
/// in the file changes no key; editing a listener's other settings changes none either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListenerKey {
    pub(crate) listen: SocketAddr,
    pub(crate) udp: bool,
    pub(crate) rank: usize,
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
pub(super) fn assign_keys(listeners: &mut [Listener]) {
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
    pub(crate) names: Option<String>,
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
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
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
    /// More certificates, chosen by the name the client asks for.
    #[serde(default, rename = "sni")]
    pub(crate) more: Vec<CertFiles>,
    #[serde(default)]
    pub(crate) unknown_sni: UnknownSni,
    /// CA certificates (PEM) that client certificates must chain to.
    #[serde(default)]
    pub(crate) client_ca: Option<PathBuf>,
    #[serde(default)]
    pub(crate) client_certs: ClientCerts,
    #[serde(default)]
    pub(crate) client_user: CertUser,
    /// ALPN protocols offered on a relay (the HTTPS port chooses its own).
    #[serde(default)]
    pub(crate) alpn: Vec<String>,
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
    pub(crate) server_name: Option<String>,
    /// CA certificates (PEM) to verify the target with, instead of the system's.
    pub(crate) ca: Option<PathBuf>,
    /// Accept any certificate. For testing only: it gives up all protection.
    pub(crate) insecure: bool,
    pub(crate) alpn: Vec<String>,
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
    pub(crate) ktls: Ktls,
    /// CA certificates (PEM) that origins of `https://` URLs requested in absolute form
    /// are verified with; the system's roots when not set.
    pub origin_ca: Option<PathBuf>,
    /// Accept any certificate from those origins. For testing only.
    pub(crate) origin_insecure: bool,
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
            proxy_protocol: None,
            proxy_protocol_from: Vec::new(),
            target_proxy_protocol: None,
            key: ListenerKey::default(),
        }
    }
}

fn default_kind() -> ListenerKind {
    ListenerKind::Http
}
