//! `kind = "ldap"`: a directory (OpenLDAP, Active Directory, ...) checks the password by a
//! simple bind as the user. The user's entry is found by a DN template
//! (`bind_dn_template`) or by a search (`base_dn` + `user_filter`, as a service account
//! or anonymously); groups come from an attribute of the entry (`group_attribute`) or a
//! search (`group_base_dn` + `group_filter`).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::super::duration::duration;
use super::{
    default_cache_ttl, default_max_in_flight, default_negative_ttl, default_timeout, Common,
};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LdapBackend {
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
    /// `ldap://host[:port]` or `ldaps://host[:port]`.
    pub url: String,
    /// StartTLS on an `ldap://` URL before anything is sent.
    #[serde(default)]
    pub starttls: bool,
    /// PEM file of the CA that signs the directory's certificate (else the system roots).
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// The user's DN, `{user}` replaced by the name (RFC 4514-escaped):
    /// `uid={user},ou=people,dc=example,dc=org`, or `{user}@example.org` for AD.
    #[serde(default)]
    pub bind_dn_template: Option<String>,
    /// The service account that searches (with `bind_password_file`); anonymous searches
    /// without it.
    #[serde(default)]
    pub bind_dn: Option<String>,
    /// The file holding the service account's password (its first line).
    #[serde(default)]
    pub bind_password_file: Option<PathBuf>,
    /// Where users are searched (subtree).
    #[serde(default)]
    pub base_dn: Option<String>,
    /// The filter that finds the user, `{user}` replaced by the name (RFC 4515-escaped):
    /// `(&(objectClass=inetOrgPerson)(uid={user}))`, `(sAMAccountName={user})` for AD.
    #[serde(default)]
    pub user_filter: Option<String>,
    /// The attribute of the user's entry that holds the name (`uid`; AD: `sAMAccountName`):
    /// after the bind, a name that is not its one value byte for byte (`ALICE`, `alice `,
    /// which the directory matches as `alice`) is refused, so that one account is one
    /// rustle user.
    #[serde(default = "default_user_attribute")]
    pub user_attribute: String,
    /// An attribute of the user's entry naming groups (`memberOf`): the first RDN's value
    /// of each DN (only of DNs under `group_base_dn` when it is set), or the value itself
    /// when it is not a DN (none when `group_base_dn` is set).
    #[serde(default)]
    pub group_attribute: Option<String>,
    /// Where groups are searched (subtree), with `group_filter`; with `group_attribute`,
    /// the only place its DNs count.
    #[serde(default)]
    pub group_base_dn: Option<String>,
    /// The filter of the user's groups, `{dn}` replaced by the user's DN and `{user}` by
    /// the name (escaped): `(&(objectClass=groupOfNames)(member={dn}))`.
    #[serde(default)]
    pub group_filter: Option<String>,
    /// The attribute that names a group found by `group_filter` (default `cn`).
    #[serde(default = "default_group_name_attribute")]
    pub group_name_attribute: String,
    /// An entry matching this filter is a disabled account, refused whatever its password
    /// (`(employeeType=disabled)`; AD: `(userAccountControl:1.2.840.113556.1.4.803:=2)`).
    #[serde(default)]
    pub disabled_filter: Option<String>,
    /// Connections kept open to the directory for searches.
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
}

fn default_user_attribute() -> String {
    "uid".into()
}

fn default_group_name_attribute() -> String {
    "cn".into()
}

fn default_pool_size() -> usize {
    4
}

/// More connections than this per backend only load the directory: calls beyond the pool
/// share its connections (LDAP multiplexes operations on one connection).
const MAX_POOL_SIZE: usize = 64;

impl LdapBackend {
    pub fn common(&self) -> Common {
        Common {
            name: self.name.clone().unwrap_or_else(|| "ldap".into()),
            timeout: self.timeout,
            max_in_flight: self.max_in_flight,
            cache_ttl: self.cache_ttl,
            negative_ttl: self.negative_ttl,
        }
    }

    /// A filter as RFC 4515 writes it: `employeeType=disabled` is read as
    /// `(employeeType=disabled)`.
    pub fn parenthesized(filter: &str) -> String {
        let f = filter.trim();
        if f.starts_with('(') {
            f.to_string()
        } else {
            format!("({f})")
        }
    }

    /// What is wrong with these settings, one line each (empty when nothing); the caller
    /// names the backend.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut say = |s: String| out.push(s);
        let scheme = self.url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("ldap") => {}
            Some("ldaps") if self.starttls => {
                say("starttls is for ldap:// URLs (ldaps:// is TLS from the start)".into())
            }
            Some("ldaps") => {}
            _ => say(format!(
                "url {:?}: expected ldap://host[:port] or ldaps://host[:port]",
                self.url
            )),
        }
        if self.url.split_once("://").is_some_and(|(_, rest)| rest.trim_end_matches('/').is_empty())
        {
            say(format!("url {:?} names no host", self.url));
        }
        let search = self.base_dn.is_some() || self.user_filter.is_some();
        match (&self.bind_dn_template, search) {
            (Some(_), true) => {
                say("give either bind_dn_template or base_dn with user_filter, not both".into())
            }
            (None, false) => {
                say("needs bind_dn_template (bind as the user's DN) or base_dn with user_filter \
                 (search the user, then bind)"
                    .into())
            }
            (Some(t), false) if !t.contains("{user}") => {
                say("bind_dn_template must contain {user}".into())
            }
            (None, true) if self.base_dn.is_none() || self.user_filter.is_none() => {
                say("base_dn and user_filter go together".into())
            }
            _ => {}
        }
        if let Some(f) = &self.user_filter {
            if !f.contains("{user}") {
                say("user_filter must contain {user}".into());
            }
            filter_problem(&mut say, "user_filter", f);
        }
        if self.bind_dn.is_some() != self.bind_password_file.is_some() {
            say("bind_dn and bind_password_file go together".into());
        }
        if self.group_filter.is_some() && self.group_base_dn.is_none() {
            say("group_filter needs group_base_dn (where groups are searched)".into());
        }
        if self.group_base_dn.is_some()
            && self.group_filter.is_none()
            && self.group_attribute.is_none()
        {
            say("group_base_dn needs group_filter or group_attribute".into());
        }
        if let Some(f) = &self.group_filter {
            if !f.contains("{dn}") && !f.contains("{user}") {
                say("group_filter must contain {dn} or {user}".into());
            }
            filter_problem(&mut say, "group_filter", f);
        }
        if let Some(f) = &self.disabled_filter {
            filter_problem(&mut say, "disabled_filter", f);
        }
        if !attribute_ok(&self.user_attribute) {
            say(format!("user_attribute {:?} is not an attribute name", self.user_attribute));
        }
        if self.group_name_attribute.is_empty() {
            say("group_name_attribute is empty".into());
        }
        if self.group_attribute.as_deref().is_some_and(str::is_empty) {
            say("group_attribute is empty".into());
        }
        if self.pool_size == 0 || self.pool_size > MAX_POOL_SIZE {
            say(format!("pool_size must be 1 to {MAX_POOL_SIZE}"));
        }
        if self.max_in_flight == 0 {
            say("max_in_flight must be at least 1".into());
        }
        if self.timeout.is_zero() {
            say("timeout must be more than 0".into());
        }
        out
    }
}

/// A filter that does not parse, with `{user}` and `{dn}` filled in as a name would be.
fn filter_problem(say: &mut impl FnMut(String), key: &str, filter: &str) {
    let filled = LdapBackend::parenthesized(filter).replace("{user}", "u").replace("{dn}", "uid=u");
    if ldap3::parse_filter(&filled).is_err() {
        say(format!("{key} {filter:?} is not an LDAP filter (RFC 4515: parenthesized)"));
    }
}

/// An attribute description as RFC 4512 writes one: a letter, then letters, digits and
/// hyphens (options after `;`), or an OID.
fn attribute_ok(a: &str) -> bool {
    let name = a.split(';').next().unwrap_or_default();
    let descr = name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    let oid = !name.is_empty()
        && name.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    descr || oid
}
