//! External backends: where a name and password not settled by the users file are checked
//! (`[[auth.backend]]`): an HTTP callback, an LDAP directory, RADIUS servers. Their calls
//! run on the process's `rustle-auth` thread (its own current-thread runtime), never on a
//! worker's loop; a worker asks through `Backends::check` and its credential cache fronts
//! every backend.

use std::net::IpAddr;
use std::time::Duration;

use crate::config::BackendConfig;

pub(crate) mod http;
pub(crate) mod ldap;
pub(crate) mod radius;

/// What a backend is asked: the credentials and where they came from.
#[derive(Clone)]
pub(crate) struct Ask {
    pub(crate) user: String,
    pub(crate) password: Vec<u8>,
    pub(crate) client: IpAddr,
    /// The listener's name (or its address when it has none).
    pub(crate) listener: String,
    /// The protocol the client speaks (`http`, `https`, `connect`, `socks5`, ...).
    pub(crate) protocol: &'static str,
    /// `host:port` the client wants, when known at authentication.
    pub(crate) target: Option<String>,
}

impl std::fmt::Debug for Ask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Ask")
            .field("user", &self.user)
            .field("client", &self.client)
            .field("listener", &self.listener)
            .field("protocol", &self.protocol)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// What an accepting backend says of the user, beyond yes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Grant {
    /// Groups, as the users file's groups: rules and routes see them.
    pub(crate) groups: Vec<String>,
    /// The outgoing address for this user's connections (RADIUS Framed-IP-Address, the
    /// callback's `egress`).
    pub(crate) egress: Option<IpAddr>,
    /// Connections the user may have open at once.
    pub(crate) max_connections: Option<u32>,
    /// Bytes a second each way.
    pub(crate) bandwidth: Option<u64>,
    /// How long the answer holds (RADIUS Session-Timeout, the callback's `ttl`), when
    /// shorter than the backend's `cache_ttl`.
    pub(crate) ttl: Option<Duration>,
    /// RADIUS Class, echoed in accounting.
    pub(crate) class: Option<Vec<u8>>,
}

/// A backend's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Allow(Grant),
    /// A known user with a wrong password, or one the backend refuses (disabled).
    Deny,
    /// No such user here: the next backend is asked.
    Unknown,
}

/// A call that gave no answer: the user is refused (fail closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Failure {
    #[error("unreachable: {0}")]
    Unreachable(String),
    #[error("no answer within the timeout")]
    Timeout,
    #[error("{0}")]
    Protocol(String),
}

/// One RADIUS accounting record of a session (a client connection of a RADIUS user).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AcctRecord {
    pub(crate) kind: AcctKind,
    /// Acct-Session-Id: unique per session, the same in its Start, Interims and Stop.
    pub(crate) session_id: String,
    pub(crate) user: String,
    pub(crate) client: IpAddr,
    /// Bytes from the client (Acct-Input-Octets) and to it (Acct-Output-Octets) so far.
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    /// Seconds since the session began (Acct-Session-Time).
    pub(crate) secs: u32,
    pub(crate) class: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcctKind {
    Start,
    Interim,
    Stop,
}

/// One external backend, built from its settings.
pub(crate) enum Backend {
    Http(http::Http),
    Ldap(ldap::Ldap),
    Radius(radius::Radius),
}

impl Backend {
    /// The backend `cfg` describes; none for `file`.
    pub(crate) fn build(cfg: &BackendConfig) -> Result<Option<Backend>, String> {
        Ok(Some(match cfg {
            BackendConfig::File(_) => return Ok(None),
            BackendConfig::Http(c) => Backend::Http(http::Http::new(c)?),
            BackendConfig::Ldap(c) => Backend::Ldap(ldap::Ldap::new(c)?),
            BackendConfig::Radius(c) => Backend::Radius(radius::Radius::new(c)?),
        }))
    }

    /// Asks the backend; runs on the `rustle-auth` thread's runtime.
    pub(crate) async fn check(&self, ask: &Ask) -> Result<Verdict, Failure> {
        match self {
            Backend::Http(b) => b.check(ask).await,
            Backend::Ldap(b) => b.check(ask).await,
            Backend::Radius(b) => b.check(ask).await,
        }
    }
}
