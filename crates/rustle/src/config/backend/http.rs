//! `kind = "http"`: a callback that answers, for a user name and password, whether the
//! user is accepted and with which groups, egress address and limits.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::super::duration::duration;
use super::{
    default_cache_ttl, default_max_in_flight, default_negative_ttl, default_timeout, Common,
};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpBackend {
    /// For logs and metrics (default: the kind).
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default = "default_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    #[serde(default = "default_cache_ttl", deserialize_with = "duration")]
    pub cache_ttl: Duration,
    #[serde(default = "default_negative_ttl", deserialize_with = "duration")]
    pub negative_ttl: Duration,
    /// Where each check is POSTed: `http://` or `https://`.
    pub url: String,
    /// PEM CA certificates that verify an `https` callback (default: the system's roots).
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// PEM certificate chain and key presented to the callback (mutual TLS).
    #[serde(default)]
    pub client_cert: Option<PathBuf>,
    #[serde(default)]
    pub client_key: Option<PathBuf>,
    /// Include `target` (`host:port`) in the request when it is known.
    #[serde(default)]
    pub send_target: bool,
    /// A file whose content (trimmed) is sent as `Authorization: Bearer <content>`, read
    /// when the backend is built and again by a call that finds it read over a minute ago.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Extra request fields, name to value.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// Request fields the client writes itself: configuring them would break the call.
const OWN_FIELDS: &[&str] =
    &["host", "content-type", "content-length", "transfer-encoding", "connection"];

impl HttpBackend {
    pub fn common(&self) -> Common {
        Common {
            name: self.name.clone().unwrap_or_else(|| "http".into()),
            timeout: self.timeout,
            max_in_flight: self.max_in_flight,
            cache_ttl: self.cache_ttl,
            negative_ttl: self.negative_ttl,
        }
    }

    /// What is wrong with these settings, without reading any file (each message names
    /// the key).
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let https = self.url.starts_with("https://");
        if !https && !self.url.starts_with("http://") {
            out.push(format!("url {:?} is neither http:// nor https://", self.url));
        }
        if self.timeout.is_zero() {
            out.push("timeout must be more than 0".into());
        }
        if self.max_in_flight == 0 {
            out.push("max_in_flight must be at least 1".into());
        }
        match (&self.client_cert, &self.client_key) {
            (Some(_), None) => out.push("client_cert without client_key".into()),
            (None, Some(_)) => out.push("client_key without client_cert".into()),
            _ => {}
        }
        if !https && (self.ca.is_some() || self.client_cert.is_some()) {
            out.push("ca, client_cert and client_key need an https:// url".into());
        }
        for (name, value) in &self.headers {
            let token = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !token {
                out.push(format!("headers: {name:?} is not a field name"));
            } else if OWN_FIELDS.contains(&name.to_ascii_lowercase().as_str()) {
                out.push(format!("headers: {name:?} is written by the client itself"));
            } else if self.token_file.is_some() && name.eq_ignore_ascii_case("authorization") {
                out.push("headers: Authorization and token_file both given".into());
            }
            // Never the value in the message: it may be a secret.
            if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
                out.push(format!("headers: the value of {name:?} has a control character"));
            }
        }
        out
    }
}
