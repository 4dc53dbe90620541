//! The settings tables: `[timeouts]`, `[limits]`, `[http]`, `[http2]`, `[upstream]`,
//! `[relay]`, `[auth]`, `[admin]` and `[process]`, each with its defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::duration::{duration, optional_duration};
use super::Secret;

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
    pub(crate) max_headers: usize,
    /// Open connections from one client address; more are refused (503 on HTTP).
    pub max_connections_per_client: Option<usize>,
    /// Open connections of one authenticated user; more are refused.
    pub(crate) max_connections_per_user: Option<usize>,
    /// Bandwidth of each user (all its connections together), each way; a user's own
    /// `rate_up`/`rate_down` overrides it.
    pub(crate) user_rate_up: Option<String>,
    pub(crate) user_rate_down: Option<String>,
    /// Sticky sessions (`sticky` on routes) remembered at once, across workers: when the
    /// table is full and none has expired, new sessions are not sticky.
    pub(crate) max_sticky_sessions: usize,
    /// Of those, the most one user may hold, across routes (0: no bound but the table's):
    /// a user at its bound gets no new sticky session until one of its own expires.
    pub(crate) max_sticky_sessions_per_user: usize,
    /// Distinct client addresses one user may use at once (squid's `max_user_ip`); a
    /// group's or a user's own (`[auth.group_limits.NAME]`, `[[auth.user]]`) overrides it.
    /// An address is in use while a connection from it is open and for
    /// `client_address_ttl` after its last one closed.
    pub(crate) max_client_addresses: Option<usize>,
    #[serde(deserialize_with = "duration")]
    pub(crate) client_address_ttl: Duration,
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
            max_sticky_sessions: 100_000,
            max_sticky_sessions_per_user: 1_000,
            max_client_addresses: None,
            client_address_ttl: Duration::from_secs(60),
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
    pub(crate) initial_stream_window: u32,
    /// Receive window of the whole connection (all streams together).
    pub(crate) initial_connection_window: u32,
    /// Bytes queued for a client per stream beyond which the proxy stops reading the
    /// upstream until they are sent.
    pub(crate) max_send_buffer_size: usize,
    /// Streams the client reset before the proxy accepted them that may wait in the
    /// accept queue; more closes the connection (ENHANCE_YOUR_CALM).
    pub max_pending_accept_reset_streams: usize,
    /// Streams the proxy had to reset for the client's protocol errors; more closes the
    /// connection (ENHANCE_YOUR_CALM).
    pub(crate) max_local_error_reset_streams: usize,
    /// The window the three flood limits below count in.
    #[serde(deserialize_with = "duration")]
    pub(crate) flood_window: Duration,
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
    pub(crate) pool_idle_timeout: Duration,
    /// Not a setting: names are cached by `[dns]` (each answer for its own TTL, between
    /// `ttl_min` and `ttl_max`). Read only so that a file setting it is refused with a
    /// message naming those keys (`load`).
    pub(crate) dns_cache_ttl: Option<toml::Value>,
}

impl Default for Upstream {
    fn default() -> Self {
        Upstream {
            pool_max_idle_per_host: 256,
            pool_max_idle: 4096,
            pool_idle_timeout: Duration::from_secs(30),
            dns_cache_ttl: None,
        }
    }
}

/// `[dns]`: the resolver (hickory's stub resolver, one per worker, behind a per-worker
/// cache; see `upstream/resolve`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Dns {
    /// Name servers, asked in turn (the next when one fails or times out): "IP" (port
    /// 53) or "IP:PORT" over UDP (TCP for a truncated answer), "tls://IP[:PORT]#NAME"
    /// over TLS (port 853), "https://IP[:PORT][/PATH]#NAME" over HTTPS (HTTP/2 POST,
    /// port 443, path /dns-query); NAME is the name the server's certificate must carry.
    /// Empty: the ones /etc/resolv.conf names (and its search domains).
    pub servers: Vec<String>,
    /// The CA (a PEM file) that `tls://` and `https://` servers' certificates must chain
    /// to; the system's roots when absent.
    pub ca: Option<PathBuf>,
    /// How long one query to one server may take.
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    /// Tries per server before the next one.
    pub attempts: usize,
    /// Which family to ask for first.
    pub prefer: Prefer,
    /// Static entries, name → addresses, answered without asking any server.
    pub hosts: std::collections::BTreeMap<String, Vec<std::net::IpAddr>>,
    /// An answer is reused for its TTL, but at least this long...
    #[serde(deserialize_with = "duration")]
    pub ttl_min: Duration,
    /// ...and at most this long.
    #[serde(deserialize_with = "duration")]
    pub ttl_max: Duration,
    /// How long a failure (no such name, no address, no server answering) is remembered.
    #[serde(deserialize_with = "duration")]
    pub negative_ttl: Duration,
}

impl Default for Dns {
    fn default() -> Self {
        Dns {
            servers: Vec::new(),
            ca: None,
            timeout: Duration::from_secs(2),
            attempts: 2,
            prefer: Prefer::Auto,
            hosts: Default::default(),
            ttl_min: Duration::from_secs(5),
            ttl_max: Duration::from_secs(300),
            negative_ttl: Duration::from_secs(5),
        }
    }
}

impl Dns {
    /// `servers` as addresses (those that do not parse are reported by the checks).
    #[cfg(test)]
    pub(crate) fn server_addrs(&self) -> Vec<SocketAddr> {
        self.name_servers().into_iter().map(|s| s.addr).collect()
    }

    /// `servers` parsed (those that do not parse are reported by the checks).
    pub(crate) fn name_servers(&self) -> Vec<NameServer> {
        self.servers.iter().filter_map(|s| parse_server(s).ok()).collect()
    }

    /// Whether a server is asked over TLS or HTTPS (and so needs `ca` or the system roots).
    pub(crate) fn encrypted(&self) -> bool {
        self.name_servers().iter().any(|s| s.transport != Transport::Udp)
    }
}

/// One `[dns] servers` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NameServer {
    pub(crate) addr: SocketAddr,
    pub(crate) transport: Transport,
}

/// How a name server is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Transport {
    /// UDP, and TCP when an answer is truncated.
    Udp,
    /// DNS over TLS (RFC 7858); `name` is verified in the server's certificate.
    Tls { name: String },
    /// DNS over HTTPS (RFC 8484, HTTP/2 POST to `path`).
    Https { name: String, path: String },
}

/// "IP", "IP:PORT", "[IPv6]:PORT", "tls://ADDR#NAME" or "https://ADDR[/PATH]#NAME".
pub(super) fn parse_server(s: &str) -> Result<NameServer, String> {
    let (scheme, rest) = match s.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, s),
    };
    let Some(scheme) = scheme else {
        return Ok(NameServer { addr: parse_addr(s, 53)?, transport: Transport::Udp });
    };
    let (rest, name) = match rest.rsplit_once('#') {
        Some((rest, name)) if !name.is_empty() => (rest, name),
        _ => {
            return Err(format!(
                "`{s}` names no server name: write `{scheme}://IP[:PORT]#NAME`, NAME being \
                 the name in the server's certificate"
            ))
        }
    };
    if rustls::pki_types::ServerName::try_from(name).is_err() {
        return Err(format!("`{s}`: `{name}` is not a server name"));
    }
    let name = name.to_string();
    match scheme {
        "tls" => {
            Ok(NameServer { addr: parse_addr(rest, 853)?, transport: Transport::Tls { name } })
        }
        "https" => {
            let (addr, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, "/dns-query"),
            };
            let path = path.to_string();
            Ok(NameServer {
                addr: parse_addr(addr, 443)?,
                transport: Transport::Https { name, path },
            })
        }
        other => Err(format!(
            "`{s}`: unknown scheme `{other}` (a server is \"IP[:PORT]\", \"tls://IP[:PORT]#NAME\" \
             or \"https://IP[:PORT][/PATH]#NAME\")"
        )),
    }
}

/// "IP", "[IPv6]", "IP:PORT" or "[IPv6]:PORT".
fn parse_addr(s: &str, port: u16) -> Result<SocketAddr, String> {
    let bare = s.strip_prefix('[').and_then(|s| s.strip_suffix(']')).unwrap_or(s);
    if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    s.parse::<SocketAddr>().map_err(|_| {
        format!("`{s}` is not an address (\"IP\" or \"IP:PORT\", a name server is never a name)")
    })
}

/// `[dns] prefer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Prefer {
    /// Both families, Happy Eyeballs between them (IPv6 first).
    #[default]
    Auto,
    /// A records; AAAA only for a name with none.
    Ipv4,
    /// AAAA records; A only for a name with none.
    Ipv6,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Relay {
    /// Grace delay (like 3proxy's -g): after this many small reads in a row, a relay
    /// direction waits `grace_delay` before reading again, so data gathers into larger
    /// reads; while splicing, a direction is woken only once 256 KiB are queued or
    /// `grace_delay` after it began waiting. 0 turns it off (the default).
    pub(crate) grace_reads: u32,
    #[serde(deserialize_with = "duration")]
    pub(crate) grace_delay: Duration,
    /// Plain tunnels forwarded inside the kernel (`io::relay::kernel`).
    pub kernel_forwarding: KernelForwarding,
}

impl Default for Relay {
    fn default() -> Self {
        Relay {
            grace_reads: 0,
            grace_delay: Duration::from_millis(10),
            kernel_forwarding: KernelForwarding::Off,
        }
    }
}

/// Whether established plain tunnels (CONNECT, SOCKS CONNECT, TCP relays, upgrades) are
/// forwarded inside the kernel (a sockhash and a stream verdict program) rather than
/// through the proxy's relay. Off by default: the kernel path spends less of the proxy's
/// own CPU but more of the machine's (BENCHMARKS.md, "Tunnels forwarded in the kernel").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelForwarding {
    /// Where the kernel allows it (said once at start), for tunnels that have moved
    /// 32 KiB; the relay otherwise.
    Auto,
    /// Never: every tunnel goes through the relay.
    #[default]
    Off,
    /// Always where a tunnel qualifies; the proxy refuses to start without it.
    Require,
}

/// A user defined in the configuration itself.
#[derive(Debug, Clone, Deserialize)]
pub struct UserConfig {
    pub(crate) name: String,
    /// A hash as in a users file (`$2y$…` from `htpasswd -B`, `$argon2id$…` from
    /// `rustle passwd`), or `plain:…` (discouraged).
    pub(crate) password: String,
    #[serde(default)]
    pub(crate) groups: Vec<String>,
    #[serde(default)]
    pub(crate) rate_up: Option<String>,
    #[serde(default)]
    pub(crate) rate_down: Option<String>,
    /// This user's `limits.max_client_addresses` and `limits.client_address_ttl`.
    #[serde(default)]
    pub(crate) max_client_addresses: Option<usize>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub(crate) client_address_ttl: Option<Duration>,
}

/// `[auth.group_limits.NAME]`: limits of the members of a group, where a user has none of
/// its own. A user in several groups gets the most generous of them.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct GroupLimits {
    pub(crate) max_client_addresses: Option<usize>,
    #[serde(deserialize_with = "optional_duration")]
    pub(crate) client_address_ttl: Option<Duration>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Auth {
    /// A users file: `name:hash[:group,group]` per line.
    pub(crate) users_file: Option<PathBuf>,
    #[serde(rename = "user")]
    pub(crate) users: Vec<UserConfig>,
    /// Group name to member names.
    pub(crate) groups: std::collections::BTreeMap<String, Vec<String>>,
    /// Group name to the limits of its members (groups from here or the users file).
    pub(crate) group_limits: std::collections::BTreeMap<String, GroupLimits>,
    /// The realm in `Proxy-Authenticate`.
    pub(crate) realm: String,
    /// How long a verified user/password pair is remembered (hashing is slow on purpose).
    #[serde(deserialize_with = "duration")]
    pub(crate) cache_ttl: Duration,
    /// Failed attempts one client address may make at once, and how many more per minute.
    pub(crate) failures_burst: u32,
    pub(crate) failures_per_minute: u32,
    /// Threads that run password hashes for the whole process (read at start only).
    pub(crate) hash_threads: usize,
    /// Password checks that may wait for a hashing thread, across clients.
    pub(crate) max_pending_hashes: usize,
    /// Password checks one client address may have waiting or running.
    pub(crate) max_hashes_per_client: usize,
    /// User-name parameters (`alice-session-x7k2`), off unless `[auth.params]` is given.
    pub(crate) params: Option<UserParams>,
    /// `[[auth.backend]]`: where names and passwords are checked, in order (the users
    /// file first when it is not listed).
    #[serde(rename = "backend")]
    pub(crate) backends: Vec<super::BackendConfig>,
    /// `[auth.kerberos]`: Negotiate beside Basic on the HTTP and HTTPS proxy ports.
    pub(crate) kerberos: Option<super::Kerberos>,
    /// With external backends: no refusal is answered sooner than this after the
    /// credentials arrived, so that its timing does not tell whether the user exists
    /// (a backend answering an unknown name faster than a wrong password).
    #[serde(deserialize_with = "duration")]
    pub(crate) refusal_delay: Duration,
}

/// `[auth.params]`: what a client may add to its user name after a separator
/// (`alice-session-x7k2-ttl-10m`, `alice-country-de`). Built in: `session` (a session id
/// for `sticky = "session"` routes) and `ttl` (how long that session sticks); the others
/// are declared here with every value they may take.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct UserParams {
    /// Between the user name and each parameter name and value: one character or a short
    /// string, none of them in a session id or a declared value.
    pub(crate) separator: String,
    /// The longest `ttl` a client may ask for; a longer one is cut to it.
    #[serde(deserialize_with = "duration")]
    pub(crate) max_ttl: Duration,
    /// Declared parameters: a name and the values it may take (`[[auth.params.choice]]`).
    #[serde(rename = "choice")]
    pub(crate) choices: Vec<ChoiceParam>,
}

impl Default for UserParams {
    fn default() -> Self {
        UserParams {
            separator: "-".into(),
            max_ttl: Duration::from_secs(3600),
            choices: Vec::new(),
        }
    }
}

/// One declared user-name parameter: its name and every value it may take.
#[derive(Debug, Clone, Deserialize)]
pub struct ChoiceParam {
    pub(crate) name: String,
    pub(crate) values: Vec<String>,
}

impl Default for Auth {
    fn default() -> Self {
        Auth {
            users_file: None,
            users: Vec::new(),
            groups: Default::default(),
            group_limits: Default::default(),
            realm: "rustle".into(),
            cache_ttl: Duration::from_secs(300),
            failures_burst: 10,
            failures_per_minute: 10,
            hash_threads: 2,
            max_pending_hashes: 64,
            max_hashes_per_client: 2,
            params: None,
            backends: Vec::new(),
            kerberos: None,
            refusal_delay: Duration::from_millis(500),
        }
    }
}

/// `[admin]`: Prometheus metrics at `/metrics`, `/healthz` and `/readyz`, on a listener of
/// their own (its own thread, not a worker). Read at start only.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Admin {
    /// Where the admin endpoint listens; None: no admin endpoint.
    pub listen: Option<SocketAddr>,
    /// When set, every request but the users API's needs `Authorization: Bearer TOKEN`
    /// (the token a Prometheus scraper holds).
    pub token: Option<Secret>,
    /// A file holding the token (its first line), in place of `token`.
    pub token_file: Option<PathBuf>,
    /// The users API's token (at least 32 bytes), separate from `token`: the users API
    /// (`/api/v1/users`) answers only when it is set, here or in `api_token_file`.
    pub api_token: Option<Secret>,
    /// A file holding the users API's token (its first line), in place of `api_token`.
    pub api_token_file: Option<PathBuf>,
    /// Where the users API keeps its changes (a JSON file, written atomically); None:
    /// they last until the process ends.
    pub users_state: Option<PathBuf>,
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
            token_file: None,
            api_token: None,
            api_token_file: None,
            users_state: None,
            allow: Vec::new(),
            max_user_series: DEFAULT_MAX_USER_SERIES,
        }
    }
}

impl Admin {
    /// Why this admin listener would expose the proxy's metrics to anyone who can reach
    /// it, if it would: a non-loopback address needs a token or client blocks (the spirit
    /// of the proxy listeners' open-proxy check).
    pub(crate) fn open_problem(&self) -> Option<String> {
        let listen = self.listen?;
        let token = self.token.is_some() || self.token_file.is_some();
        if listen.ip().is_loopback() || token || !self.allow.is_empty() {
            return None;
        }
        Some(format!(
            "admin listener on {listen} would serve metrics (users, traffic, parents) to \
             anyone who can reach it: bind it to a loopback address, or set `token` or \
             `allow` in [admin]"
        ))
    }
}

/// The shortest users-API token accepted: 32 bytes, as from `openssl rand -hex 16`.
pub(crate) const MIN_API_TOKEN: usize = 32;

impl Admin {
    /// The metrics token in force: `token`, or the first line of `token_file` (which must
    /// not be readable by others than its owner and group); None when neither is set.
    pub(crate) fn read_token(&self) -> Result<Option<Secret>, String> {
        read_secret(("token", "token_file"), &self.token, self.token_file.as_deref())
    }

    /// The users API's token in force: `api_token`, or the first line of `api_token_file`;
    /// None when neither is set (the API is off). Shorter than [`MIN_API_TOKEN`]: refused.
    pub(crate) fn read_api_token(&self) -> Result<Option<Secret>, String> {
        let keys = ("api_token", "api_token_file");
        let token = read_secret(keys, &self.api_token, self.api_token_file.as_deref())?;
        if let Some(t) = &token {
            if t.expose().len() < MIN_API_TOKEN {
                return Err(format!(
                    "[admin] api_token: {} bytes, shorter than {MIN_API_TOKEN}: use a random \
                     token such as `openssl rand -hex 16`",
                    t.expose().len()
                ));
            }
        }
        Ok(token)
    }

    /// Whether the users API sends its token in cleartext beyond this host: it is on and
    /// `listen` is not a loopback address.
    pub(crate) fn api_cleartext(&self) -> Option<SocketAddr> {
        let on = self.api_token.is_some() || self.api_token_file.is_some();
        self.listen.filter(|l| on && !l.ip().is_loopback())
    }
}

/// `value`, or the first line of `path` (which must not be readable by every user); the
/// keys name them in messages.
fn read_secret(
    (key, file_key): (&str, &str),
    value: &Option<Secret>,
    path: Option<&std::path::Path>,
) -> Result<Option<Secret>, String> {
    let path = match (value, path) {
        (Some(_), Some(_)) => {
            return Err(format!("[admin]: set `{key}` or `{file_key}`, not both"));
        }
        (Some(t), None) => return Ok(Some(t.clone())),
        (None, None) => return Ok(None),
        (None, Some(path)) => path,
    };
    let file = path.display();
    use std::os::unix::fs::PermissionsExt as _;
    let meta = std::fs::metadata(path).map_err(|e| format!("[admin] {file_key} {file}: {e}"))?;
    if meta.permissions().mode() & 0o004 != 0 {
        return Err(format!("[admin] {file_key} {file} is readable by every user: chmod o-r it"));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("[admin] {file_key} {file}: cannot read: {e}"))?;
    let token = text.lines().next().unwrap_or_default().trim();
    if token.is_empty() {
        return Err(format!("[admin] {file_key} {file}: empty"));
    }
    Ok(Some(Secret::new(token)))
}

pub(super) fn cidrs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<crate::acl::Cidr>, D::Error> {
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
    pub(crate) user: Option<String>,
    #[serde(default)]
    pub(crate) group: Option<String>,
    #[serde(default)]
    pub(crate) control_socket: Option<PathBuf>,
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
