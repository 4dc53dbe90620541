//! The configuration: a TOML file, defaults that are safe on their own, and command-line
//! overrides for the common cases. Every problem found is reported with its line, and
//! unknown keys are errors, so a typo never silently falls back to a default. Unknown keys
//! are collected with `serde_ignored` rather than `deny_unknown_fields`, and values that do
//! not deserialize by `config/collect`, so that all of them are reported at once.

use std::path::PathBuf;

use serde::Deserialize;

mod backend;
mod checks;
mod collect;
mod duration;
mod egress;
mod listener;
mod load;
mod log;
mod quota;
mod rate;
mod routing;
mod settings;
mod state;
#[cfg(test)]
mod tests;

pub(crate) use crate::acl::{Conditions, RuleConfig};
pub use backend::{
    BackendConfig, Common as BackendCommon, FileBackend, HttpBackend, Kerberos, LdapBackend,
    RadiusBackend,
};
pub use backend::{RadiusAttribute, RadiusMethod};
pub(crate) use duration::{parse_duration, MAX_DURATION};
pub use egress::{BindEntry, BindPick, EgressConfig};
pub use listener::{
    CertFiles, CertUser, ClientCerts, ConnectTls, HostPort, Ktls, ListenTls, Listener, ListenerKey,
    ListenerKind, ProxyProtocol, SpliceMode, Tls, UnknownSni,
};
pub use load::{Lines, Loaded, Overrides, Parsed, Problem, Problems, Source};
pub use log::{
    Diagnostics, Facility, Field, Log, LogFormat, LogTarget, Piece, SyslogAddr, SyslogFormat,
    Template,
};
pub(crate) use quota::parse_size;
pub(crate) use quota::problems as quota_problems;
pub use quota::{OnExceeded, Period, QuotaConfig, QuotaDirection, ROLLING_BUCKETS};
pub(crate) use rate::parse_rate;
pub(crate) use routing::DEFAULT_STICKY_TTL;
pub use routing::{
    names_of, GroupConfig, Named, ParentConfig, ParentKind, Probe, RouteConfig, Secret, Sticky,
    StickyBy, DENY, DIRECT,
};

pub use settings::{
    Admin, Auth, ChoiceParam, Dns, Http, Http2, KernelForwarding, Limits, Prefer, Process, Relay,
    Timeouts, Upstream, UserConfig, UserParams, DEFAULT_MAX_USER_SERIES,
};
pub(crate) use settings::{NameServer, Transport};
pub use state::{Backend as StateBackend, OnStateLoss, State, StateRedis, DEFAULT_KEY_PREFIX};

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
    /// The resolver (`[dns]`).
    #[serde(default)]
    pub dns: Dns,
    #[serde(default)]
    pub tls: Tls,
    #[serde(default)]
    pub auth: Auth,
    /// Access rules, first match wins.
    #[serde(default, rename = "rule")]
    pub rules: Vec<RuleConfig>,
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
    /// Traffic quotas per user or group (`[[quota]]`).
    #[serde(default, rename = "quota")]
    pub quotas: Vec<QuotaConfig>,
    /// Where per-user state lives (`[state]`): quota usage, and what a fleet shares.
    #[serde(default)]
    pub state: State,
}

/// With no listener in the file or on the command line: HTTP and SOCKS detected on the
/// usual HTTP proxy port, and SOCKS on the usual SOCKS port.
pub(crate) const DEFAULT_AUTO: &str = "127.0.0.1:3128";
pub(crate) const DEFAULT_SOCKS: &str = "127.0.0.1:1080";

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

impl Config {
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
        listener::assign_keys(&mut listeners);
        listeners
    }

    /// Worker count after resolving 0 to the number of cores.
    pub(crate) fn worker_count(&self) -> usize {
        if self.workers > 0 {
            self.workers
        } else {
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
        }
    }
}
