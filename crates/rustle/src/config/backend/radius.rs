//! `kind = "radius"`: RADIUS servers (RFC 2865) for names and passwords, and their
//! accounting (RFC 2866) of the sessions they accepted.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::super::duration::duration;
use super::{
    default_cache_ttl, default_max_in_flight, default_negative_ttl, default_timeout, Common,
};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RadiusBackend {
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
    /// Authentication servers, `host:port`, asked in order: one that gives no answer is
    /// passed over for a while (`DEAD_TIME` in the runtime backend).
    pub servers: Vec<String>,
    /// Accounting servers, `host:port` (default: the hosts of `servers`, port 1813).
    #[serde(default)]
    pub accounting_servers: Option<Vec<String>>,
    /// A file whose first line is the shared secret.
    pub secret_file: PathBuf,
    /// NAS-Identifier of every request.
    #[serde(default = "default_nas_identifier")]
    pub nas_identifier: String,
    /// NAS-IP-Address (or NAS-IPv6-Address) of every request, when set.
    #[serde(default)]
    pub nas_ip_address: Option<IpAddr>,
    #[serde(default)]
    pub method: Method,
    /// Sends to one server beyond the first before the next server is asked.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Whether accepted sessions are accounted (Accounting-Request Start, Interim, Stop).
    #[serde(default = "default_accounting")]
    pub accounting: bool,
    /// How often a session's Interim-Update goes out.
    #[serde(default = "default_interim_interval", deserialize_with = "duration")]
    pub interim_interval: Duration,
    /// The reply attribute whose values are the user's groups: `Filter-Id`, `Class`, a
    /// standard attribute by number, or a Vendor-Specific one as `vendor:type`.
    #[serde(default = "default_group_attribute")]
    pub group_attribute: String,
    /// A reply attribute (same forms) holding the user's bandwidth in bits a second.
    #[serde(default)]
    pub bandwidth_attribute: Option<String>,
    /// Whether an Access-Accept, -Reject or -Challenge without a Message-Authenticator is
    /// dropped (BlastRADIUS, CVE-2024-3596); false only for a legacy server that signs none.
    #[serde(default = "default_require_message_authenticator")]
    pub require_message_authenticator: bool,
}

/// How the password travels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// User-Password, hidden with the shared secret (RFC 2865 5.2).
    #[default]
    Pap,
    /// CHAP-Password over a fresh CHAP-Challenge: the password never travels.
    Chap,
}

/// A reply attribute as `group_attribute` or `bandwidth_attribute` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attribute {
    /// A standard attribute, by its type number.
    Standard(u8),
    /// A Vendor-Specific attribute (26) of a vendor (its SMI number), by its type.
    Vendor { vendor: u32, kind: u8 },
}

/// Filter-Id.
const FILTER_ID: u8 = 11;
/// Class.
const CLASS: u8 = 25;
/// Vendor-Specific: never a value of its own.
const VENDOR_SPECIFIC: u8 = 26;
/// The accounting port of RFC 2866.
const ACCOUNTING_PORT: u16 = 1813;

impl Attribute {
    /// Reads `Filter-Id`, `Class`, a type number, or `vendor:type`.
    pub fn parse(text: &str) -> Result<Attribute, String> {
        let t = text.trim();
        if t.eq_ignore_ascii_case("filter-id") {
            return Ok(Attribute::Standard(FILTER_ID));
        }
        if t.eq_ignore_ascii_case("class") {
            return Ok(Attribute::Standard(CLASS));
        }
        let bad = || {
            format!("`{text}` is not an attribute: Filter-Id, Class, a type number (1-255, not 26) or `vendor:type`")
        };
        match t.split_once(':') {
            Some((v, k)) => {
                let vendor = v.trim().parse::<u32>().map_err(|_| bad())?;
                let kind = k.trim().parse::<u8>().map_err(|_| bad())?;
                if vendor == 0 || vendor > 0x00ff_ffff || kind == 0 {
                    return Err(bad());
                }
                Ok(Attribute::Vendor { vendor, kind })
            }
            None => match t.parse::<u8>() {
                Ok(n) if n != 0 && n != VENDOR_SPECIFIC => Ok(Attribute::Standard(n)),
                _ => Err(bad()),
            },
        }
    }
}

impl RadiusBackend {
    pub fn common(&self) -> Common {
        Common {
            name: self.name.clone().unwrap_or_else(|| "radius".into()),
            timeout: self.timeout,
            max_in_flight: self.max_in_flight,
            cache_ttl: self.cache_ttl,
            negative_ttl: self.negative_ttl,
        }
    }

    /// How often an open session's Interim-Update goes out; None: no accounting.
    pub fn accounting_interval(&self) -> Option<Duration> {
        self.accounting.then_some(self.interim_interval)
    }

    /// The accounting servers: as given, or each authentication host on port 1813.
    pub fn accounting_servers(&self) -> Vec<String> {
        match &self.accounting_servers {
            Some(list) => list.clone(),
            None => self
                .servers
                .iter()
                .map(|s| match split_host_port(s) {
                    Ok((host, _)) if host.contains(':') => format!("[{host}]:{ACCOUNTING_PORT}"),
                    Ok((host, _)) => format!("{host}:{ACCOUNTING_PORT}"),
                    Err(_) => s.clone(),
                })
                .collect(),
        }
    }

    /// What is wrong with these settings (nothing read from disk but the names).
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.servers.is_empty() {
            out.push("`servers` lists no server".to_string());
        }
        for s in self.servers.iter().chain(self.accounting_servers.iter().flatten()) {
            if let Err(e) = split_host_port(s) {
                out.push(e);
            }
        }
        if self.accounting_servers.as_ref().is_some_and(|l| l.is_empty()) && self.accounting {
            out.push("`accounting_servers` is empty while `accounting` is on".to_string());
        }
        if self.nas_identifier.is_empty() || self.nas_identifier.len() > 253 {
            out.push("`nas_identifier` must have 1 to 253 bytes".to_string());
        }
        if self.max_in_flight == 0 {
            out.push("`max_in_flight` must be at least 1".to_string());
        }
        if self.timeout.is_zero() {
            out.push("`timeout` must be more than 0".to_string());
        }
        if self.retries > 10 {
            out.push("`retries` is at most 10".to_string());
        }
        if self.accounting && self.interim_interval < Duration::from_secs(1) {
            out.push("`interim_interval` must be at least 1s".to_string());
        }
        if let Err(e) = Attribute::parse(&self.group_attribute) {
            out.push(format!("`group_attribute`: {e}"));
        }
        if let Some(Err(e)) = self.bandwidth_attribute.as_deref().map(Attribute::parse) {
            out.push(format!("`bandwidth_attribute`: {e}"));
        }
        out
    }
}

/// `host:port` or `[v6]:port` into the host and the port.
fn split_host_port(s: &str) -> Result<(&str, u16), String> {
    let bad = || format!("server `{s}` is not `host:port`");
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let host = match host.strip_prefix('[') {
        Some(h) => h.strip_suffix(']').ok_or_else(bad)?,
        None if host.contains(':') => return Err(bad()),
        None => host,
    };
    let port = port.parse::<u16>().map_err(|_| bad())?;
    if host.is_empty() || port == 0 {
        return Err(bad());
    }
    Ok((host, port))
}

fn default_nas_identifier() -> String {
    "rustle".into()
}
fn default_retries() -> u32 {
    1
}
fn default_accounting() -> bool {
    true
}
fn default_interim_interval() -> Duration {
    Duration::from_secs(300)
}
fn default_require_message_authenticator() -> bool {
    true
}
fn default_group_attribute() -> String {
    "Filter-Id".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_read_as_written() {
        assert_eq!(Attribute::parse("Filter-Id"), Ok(Attribute::Standard(11)));
        assert_eq!(Attribute::parse("class"), Ok(Attribute::Standard(25)));
        assert_eq!(Attribute::parse("18"), Ok(Attribute::Standard(18)));
        assert_eq!(Attribute::parse("14122:8"), Ok(Attribute::Vendor { vendor: 14122, kind: 8 }));
        for bad in ["26", "0", "300", "x", "0:1", "9:0", "9:", "Reply-Message"] {
            assert!(Attribute::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_example_block_reads_without_problems() {
        let text = include_str!("../../../../../rustle.example.toml");
        let block = text.split("# kind = \"radius\"").nth(1).expect("the radius example");
        let keys: Vec<&str> = block
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with('#'))
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| l.split_once(" = ").is_some_and(|(k, _)| !k.contains(' ')))
            .map(|l| l.split(" #").next().unwrap_or(l))
            .collect();
        assert!(keys.len() >= 15, "{keys:?}");
        let cfg: RadiusBackend = toml::from_str(&keys.join("\n")).expect("the example parses");
        assert!(cfg.problems().is_empty(), "{:?}", cfg.problems());
        assert_eq!(cfg.bandwidth_attribute.as_deref(), Some("14122:8"));
    }

    #[test]
    fn settings_read_with_defaults_and_problems_named() {
        let cfg: RadiusBackend = toml::from_str(
            r#"servers = ["127.0.0.1:1812", "[::1]:1812", "radius.example:11812"]
               secret_file = "/etc/rustle/radius.secret""#,
        )
        .expect("parse");
        assert!(cfg.problems().is_empty(), "{:?}", cfg.problems());
        assert_eq!(cfg.method, Method::Pap);
        assert_eq!(cfg.nas_identifier, "rustle");
        assert_eq!(cfg.interim_interval, Duration::from_secs(300));
        assert_eq!(
            cfg.accounting_servers(),
            ["127.0.0.1:1813", "[::1]:1813", "radius.example:1813"]
        );
        let bad: RadiusBackend = toml::from_str(
            r#"servers = ["127.0.0.1"]
               secret_file = "s"
               method = "chap"
               group_attribute = "26"
               interim_interval = "500ms""#,
        )
        .expect("parse");
        let p = bad.problems();
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].contains("`127.0.0.1` is not `host:port`"), "{p:?}");
        assert!(toml::from_str::<RadiusBackend>(
            "servers = []\nsecret_file = \"s\"\nsecret = \"x\""
        )
        .is_err());
    }
}
