//! The conditions that `[[rule]]` and `[[route]]` tables share (`Conditions`, compiled
//! into one matcher for both), and the `[[rule]]` table itself: the rule language's
//! schema, which the configuration embeds.
//!
//! The two tables read their own keys and hand every other key to `Conditions::take`,
//! rather than `#[serde(flatten)]`: a flattened struct hides unknown keys from
//! `serde_ignored` (dtolnay/serde-ignored#10), and a typo in a rule must stay an error.

use std::fmt;

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;

/// What a request must be for a rule or a route to match. Every condition is optional
/// (absent: anything), and all of them must match; a list matches when any element does.
/// Values are checked when compiled (`acl::RuleSet::compile`), not while deserializing, so
/// that every problem of every table is reported at once.
#[derive(Debug, Clone, Default)]
pub(crate) struct Conditions {
    /// Listener names.
    pub(crate) listeners: Option<Vec<String>>,
    /// Client addresses or CIDR blocks.
    pub(crate) clients: Option<Vec<String>>,
    /// Authenticated user names; `*` is any authenticated user.
    pub(crate) users: Option<Vec<String>>,
    /// The line of `users` in the file, for a user found undefined once the users are
    /// loaded (`Policy::build`).
    pub(crate) users_line: Option<usize>,
    /// The user is in any of these groups (`[auth.groups]`, not `[[group]]`s).
    pub(crate) groups: Option<Vec<String>>,
    /// The line of `groups` in the file, for a group found undefined once the users are
    /// loaded.
    pub(crate) groups_line: Option<usize>,
    /// The destination host as the client named it: exact (case-insensitive), `*.suffix`
    /// (subdomains only, not the suffix itself) or `*`.
    pub(crate) hosts: Option<Vec<String>>,
    /// The address actually connected to, after resolution: addresses or CIDR blocks.
    pub(crate) destinations: Option<Vec<String>>,
    /// Destination ports: `443` or `8000-8999`.
    pub(crate) ports: Option<Vec<String>>,
    /// http, connect, socks5, socks4, relay, udp, bind.
    pub(crate) protocols: Option<Vec<String>>,
    /// User-name parameters, `NAME=VALUE` (`[auth.params]` declares them).
    pub(crate) params: Option<Vec<String>>,
}

impl Conditions {
    /// Reads the value of `key` into the conditions if `key` is one of theirs; otherwise
    /// reads nothing and says so.
    pub(crate) fn take<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        let slot = match key {
            "listeners" => &mut self.listeners,
            "clients" => &mut self.clients,
            "users" => &mut self.users,
            "groups" => &mut self.groups,
            "hosts" => &mut self.hosts,
            "destinations" => &mut self.destinations,
            "ports" => &mut self.ports,
            "protocols" => &mut self.protocols,
            "params" => &mut self.params,
            _ => return Ok(false),
        };
        *slot = Some(map.next_value()?);
        Ok(true)
    }
}

/// One `[[rule]]` table as written.
#[derive(Debug, Clone)]
pub struct RuleConfig {
    /// For logs; default "rule N" (1-based).
    pub(crate) name: Option<String>,
    /// `allow` or `deny`, as written (checked with the conditions).
    pub(crate) action: String,
    pub(crate) conditions: Conditions,
}

impl<'de> Deserialize<'de> for RuleConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Rule;
        impl<'de> Visitor<'de> for Rule {
            type Value = RuleConfig;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a [[rule]] table")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RuleConfig, A::Error> {
                let (mut name, mut action, mut conditions) = (None, None, Conditions::default());
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "name" => name = Some(map.next_value()?),
                        "action" => action = Some(map.next_value()?),
                        k if conditions.take(k, &mut map)? => {}
                        // Read as ignored, so that serde_ignored reports it.
                        _ => _ = map.next_value::<IgnoredAny>()?,
                    }
                }
                let action = action.ok_or_else(|| serde::de::Error::missing_field("action"))?;
                Ok(RuleConfig { name, action, conditions })
            }
        }
        d.deserialize_map(Rule)
    }
}
