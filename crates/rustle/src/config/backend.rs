//! `[[auth.backend]]`: where user names and passwords are checked, in order. `kind =
//! "file"` is the users file and `[[auth.user]]` (first when not listed); `"http"` a
//! callback, `"ldap"` a directory, `"radius"` RADIUS servers. `[auth.kerberos]` (Negotiate)
//! is not a backend of this list: it takes no password.

use std::time::Duration;

use serde::Deserialize;

mod http;
mod kerberos;
mod ldap;
mod radius;

pub use http::HttpBackend;
pub use kerberos::Kerberos;
pub use ldap::LdapBackend;
pub use radius::RadiusBackend;
pub use radius::{Attribute as RadiusAttribute, Method as RadiusMethod};

/// One `[[auth.backend]]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum BackendConfig {
    /// The users file and `[[auth.user]]`.
    File(FileBackend),
    Http(HttpBackend),
    /// Boxed: its settings are many times the size of the others'.
    Ldap(Box<LdapBackend>),
    Radius(RadiusBackend),
}

/// `kind = "file"`: its place in the order only.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileBackend {}

/// What every external backend has: a name for logs and metrics, how long a call may
/// take, how many may be in flight, and how long its answers are remembered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Common {
    pub name: String,
    pub timeout: Duration,
    pub max_in_flight: usize,
    /// How long an accepted user name and password is remembered.
    pub cache_ttl: Duration,
    /// How long a refused one is remembered (answered without a call).
    pub negative_ttl: Duration,
}

impl BackendConfig {
    /// The kind, as written in the file.
    pub fn kind(&self) -> &'static str {
        match self {
            BackendConfig::File(_) => "file",
            BackendConfig::Http(_) => "http",
            BackendConfig::Ldap(_) => "ldap",
            BackendConfig::Radius(_) => "radius",
        }
    }

    /// The common settings of an external backend; none for `file`.
    pub fn common(&self) -> Option<Common> {
        match self {
            BackendConfig::File(_) => None,
            BackendConfig::Http(b) => Some(b.common()),
            BackendConfig::Ldap(b) => Some(b.common()),
            BackendConfig::Radius(b) => Some(b.common()),
        }
    }
}

pub(super) fn default_timeout() -> Duration {
    Duration::from_secs(5)
}
pub(super) fn default_max_in_flight() -> usize {
    32
}
pub(super) fn default_cache_ttl() -> Duration {
    Duration::from_secs(300)
}
pub(super) fn default_negative_ttl() -> Duration {
    Duration::from_secs(30)
}
