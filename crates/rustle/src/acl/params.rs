//! The parameters a client puts in its user name (`alice-session-x7k2-country-de`), as the
//! rules and routes see them, and the `params` condition that matches them. Parsing the
//! user name is `policy::auth::params`' business: here is only what it yields.

use std::time::Duration;

/// What a user name carried besides the user. Only parameters the configuration declares
/// get here (the parser refuses the others), so no client can grow this beyond them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Params {
    /// `session`: 1 to 64 characters of `[A-Za-z0-9_]`.
    pub(crate) session: Option<Box<str>>,
    /// `ttl`: how long a sticky session lasts, already cut to the configured maximum.
    pub(crate) ttl: Option<Duration>,
    /// The declared parameters given, `(name, value)`, in the order given.
    pub(crate) choices: Vec<Pair>,
}

impl Params {
    /// Whether the client gave `name` with `value`.
    pub(crate) fn has(&self, name: &str, value: &str) -> bool {
        self.choices.iter().any(|(n, v)| **n == *name && **v == *value)
    }

    /// The value given for `name`, if any.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.choices.iter().find(|(n, _)| **n == *name).map(|(_, v)| &**v)
    }
}

/// One element of a `params` condition, `(name, value)`.
pub(super) type Pair = (Box<str>, Box<str>);

/// One element of a `params` condition: `"country=de"`.
pub(super) fn parse_condition(s: &str) -> Result<Pair, String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() && !value.is_empty() && !value.contains('=') => {
            Ok((name.into(), value.into()))
        }
        _ => Err(format!("`{s}`: expected NAME=VALUE, as `country=de`")),
    }
}

/// Whether `params` holds any of `wanted`.
#[inline]
pub(super) fn matches(wanted: &[Pair], params: Option<&Params>) -> bool {
    params.is_some_and(|p| wanted.iter().any(|(n, v)| p.has(n, v)))
}
