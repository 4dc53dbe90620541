//! `[state]`: where per-user state that outlives a process lives. The Redis part: a fleet
//! of instances sharing quota usage, sticky sessions, per-user connection counts and client
//! addresses through one Redis (or Valkey) server.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::duration::duration;
use super::Secret;

/// `[state]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct State {
    /// The quota usage file (JSON); none: usage lives in memory only and a restart
    /// forgets it.
    pub path: Option<PathBuf>,
    /// How often usage is written: a crash loses at most this much of it.
    #[serde(deserialize_with = "duration")]
    pub flush_interval: Duration,
    /// The zone calendar periods follow (an IANA name, or "UTC").
    #[serde(deserialize_with = "time_zone")]
    pub time_zone: String,
    /// Where the state lives: this machine, or a Redis shared by the fleet.
    pub backend: Backend,
    // The Redis backend's keys (`backend = "redis"`); `StateRedis` is their checked view.
    /// `redis://[user:password@]host[:port][/db]` or `rediss://...` (TLS).
    pub redis_url: Option<Secret>,
    /// A file holding the password (one line), instead of one in the URL.
    pub redis_password_file: Option<PathBuf>,
    /// The CAs (PEM) a `rediss://` server is verified with, instead of the system's.
    pub redis_ca: Option<PathBuf>,
    /// Put before every key, so that several fleets (or other programs) share one Redis.
    pub key_prefix: String,
    /// What the instance does while Redis is unreachable.
    pub on_state_loss: OnStateLoss,
    /// How often the fleet thread publishes this instance's counts and reads the fleet's.
    #[serde(deserialize_with = "duration")]
    pub sync_interval: Duration,
}

/// The default `sync_interval`.
const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_secs(1);

fn time_zone<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let name = String::deserialize(d)?;
    match jiff::tz::TimeZone::get(&name) {
        Ok(_) => Ok(name),
        Err(e) => Err(serde::de::Error::custom(format!("time zone {name:?}: {e}"))),
    }
}

/// The default `key_prefix`.
pub const DEFAULT_KEY_PREFIX: &str = "rustle:";

impl Default for State {
    fn default() -> Self {
        State {
            path: None,
            flush_interval: Duration::from_secs(5),
            time_zone: "UTC".into(),
            backend: Backend::File,
            redis_url: None,
            redis_password_file: None,
            redis_ca: None,
            key_prefix: DEFAULT_KEY_PREFIX.into(),
            on_state_loss: OnStateLoss::Serve,
            sync_interval: DEFAULT_SYNC_INTERVAL,
        }
    }
}

/// `[state] backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// A file on this machine (`[state] path`).
    #[default]
    File,
    /// A Redis shared by every instance pointing at it.
    Redis,
}

/// `[state] on_state_loss`: while Redis is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnStateLoss {
    /// Go on serving on the instance's own counts, and reconcile when Redis returns.
    #[default]
    Serve,
    /// Refuse what the shared state decides (quotas, client addresses) until it returns.
    Deny,
}

/// The Redis backend's settings, checked: what `state::redis::Fleet::connect` takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRedis {
    pub url: Secret,
    pub password_file: Option<PathBuf>,
    pub ca: Option<PathBuf>,
    pub key_prefix: String,
    pub on_state_loss: OnStateLoss,
    pub sync_interval: Duration,
}

impl State {
    /// The Redis settings when the backend is Redis (and its URL is set: the checks
    /// refuse a Redis backend without one).
    pub fn redis(&self) -> Option<StateRedis> {
        if self.backend != Backend::Redis {
            return None;
        }
        Some(StateRedis {
            url: self.redis_url.clone()?,
            password_file: self.redis_password_file.clone(),
            ca: self.redis_ca.clone(),
            key_prefix: self.key_prefix.clone(),
            on_state_loss: self.on_state_loss,
            sync_interval: self.sync_interval,
        })
    }
}

/// The problems of `[state]`'s Redis keys, each with its key.
pub(super) fn redis_problems(s: &State) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if s.backend != Backend::Redis {
        for (key, set) in [
            ("redis_url", s.redis_url.is_some()),
            ("redis_password_file", s.redis_password_file.is_some()),
            ("redis_ca", s.redis_ca.is_some()),
        ] {
            if set {
                out.push((key, "is read only with backend = \"redis\"".into()));
            }
        }
        return out;
    }
    let Some(url) = &s.redis_url else {
        out.push(("backend", "\"redis\" needs redis_url = \"redis://HOST:PORT\"".into()));
        return out;
    };
    let url = url.expose();
    let tls = url.starts_with("rediss://");
    if !tls && !url.starts_with("redis://") {
        out.push(("redis_url", "must start with redis:// or rediss:// (TLS)".into()));
        return out;
    }
    match redis::IntoConnectionInfo::into_connection_info(url) {
        Err(e) => out.push(("redis_url", format!("not a Redis URL: {}", e.category()))),
        Ok(info) => {
            if info.redis_settings().password().is_some() && s.redis_password_file.is_some() {
                out.push((
                    "redis_password_file",
                    "redis_url has a password already: give it in one place".into(),
                ));
            }
        }
    }
    if url.contains('#') {
        // redis-rs reads `#insecure` as "do not check the certificate".
        out.push((
            "redis_url",
            "must not have a #fragment (the server's certificate is always checked: give its \
             CA with redis_ca)"
                .into(),
        ));
    }
    if s.redis_ca.is_some() && !tls {
        out.push(("redis_ca", "needs a rediss:// (TLS) redis_url".into()));
    }
    if s.sync_interval < Duration::from_millis(10) || s.sync_interval > Duration::from_secs(60) {
        out.push(("sync_interval", "must be between 10ms and 60s".into()));
    }
    if s.key_prefix.contains(|c: char| c.is_whitespace() || c.is_control()) {
        out.push(("key_prefix", "must not hold spaces or control characters".into()));
    }
    out
}
