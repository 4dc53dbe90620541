//! User-name parameters (`[auth.params]`): `alice-session-x7k2-ttl-10m` is the user
//! `alice` (whose password is checked) with the parameters `session = x7k2` and
//! `ttl = 10m`. Pure: no I/O; the caller says which names are users.
//!
//! Where the user ends: a name that is a user is that user, whatever it holds (a user
//! called `bob-country-de` stays one; start-up refuses such a name beside `bob`:
//! `Declared::shadows`). Otherwise the user is the longest prefix that is a user and is
//! followed by the separator (overlapping places too); the rest is `NAME SEP VALUE`
//! pairs, each name `session`, `ttl` or a declared parameter, each value as that name
//! allows. A name with no such prefix is taken whole (an unknown user: refused as a
//! wrong password). So a user name may hold the separator, and the longest user wins
//! when two could start the same name.

use std::fmt;
use std::time::Duration;

use crate::acl::Params;

/// Longest user name with its parameters, in bytes: what SOCKS5 (RFC 1929) can carry.
pub(crate) const MAX_LEN: usize = 255;

/// Longest session id, in characters (`[A-Za-z0-9_]`).
pub(crate) const MAX_SESSION_LEN: usize = 64;

/// The parameters a configuration declares, compiled (`[auth.params]`, checked by the
/// configuration's loader: `config::params_problems`).
#[derive(Debug, Clone)]
pub(crate) struct Declared {
    separator: Box<str>,
    max_ttl: Duration,
    /// Declared parameters and the values each may take.
    choices: Box<[Choice]>,
}

/// A declared parameter's name and the values it may take.
type Choice = (Box<str>, Box<[Box<str>]>);

/// Why the parameters of a user name were refused. Shown to the client (after its
/// password passed), so it names the parameter, never the password, and quotes what the
/// client sent only shortened and escaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ParamError {
    TooLong,
    /// The separator with nothing after it, or two separators in a row.
    EmptyName,
    Unknown(String),
    NoValue(String),
    Duplicate(String),
    BadSession,
    BadTtl(String),
    BadValue {
        name: String,
        value: String,
    },
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamError::TooLong => {
                write!(f, "user name with parameters longer than {MAX_LEN} bytes")
            }
            ParamError::EmptyName => f.write_str("an empty user-name parameter"),
            ParamError::Unknown(name) => write!(f, "unknown user-name parameter {}", shown(name)),
            ParamError::NoValue(name) => {
                write!(f, "user-name parameter {} without a value", shown(name))
            }
            ParamError::Duplicate(name) => {
                write!(f, "user-name parameter {} given twice", shown(name))
            }
            ParamError::BadSession => write!(
                f,
                "a session id is 1 to {MAX_SESSION_LEN} characters of A-Z, a-z, 0-9 and _"
            ),
            ParamError::BadTtl(value) => {
                write!(f, "ttl {} is not a duration such as 10m (more than 0)", shown(value))
            }
            ParamError::BadValue { name, value } => {
                write!(f, "{} is not a value of user-name parameter {}", shown(value), shown(name))
            }
        }
    }
}

/// What the client sent, quoted for a message: at most 32 characters, escaped.
fn shown(s: &str) -> String {
    let mut out: String = s.chars().take(32).flat_map(char::escape_debug).collect();
    if s.chars().count() > 32 {
        out.push('…');
    }
    format!("`{out}`")
}

impl Declared {
    /// From `[auth.params]` as loaded (its problems already reported by the loader).
    pub(crate) fn new(cfg: &crate::config::UserParams) -> Declared {
        Declared {
            separator: cfg.separator.as_str().into(),
            max_ttl: cfg.max_ttl,
            choices: cfg
                .choices
                .iter()
                .map(|c| {
                    (c.name.as_str().into(), c.values.iter().map(|v| v.as_str().into()).collect())
                })
                .collect(),
        }
    }

    /// The user a name stands for and its parameters (see the module's notes). The user
    /// comes back even when the parameters are refused, so that the caller checks the
    /// password first and tells only a client that knows it what was wrong: the error
    /// says nothing of whether a user exists.
    pub(crate) fn split<'a>(
        &self,
        name: &'a str,
        is_user: impl Fn(&str) -> bool,
    ) -> (&'a str, Result<Option<Params>, ParamError>) {
        if is_user(name) {
            return (name, Ok(None));
        }
        let base = self.ends(name).filter(|&i| is_user(&name[..i])).last();
        match base {
            Some(i) => (&name[..i], self.parse(name, &name[i + self.separator.len()..]).map(Some)),
            None => (name, Ok(None)),
        }
    }

    /// Where a user could end in `name`: every place, overlapping ones too, that the
    /// separator starts at, past the first byte and within a user name's length.
    fn ends<'n>(&'n self, name: &'n str) -> impl Iterator<Item = usize> + 'n {
        let last = name.len().min(super::MAX_NAME_LEN);
        (1..=last).filter(|&i| name.get(i..).is_some_and(|r| r.starts_with(&*self.separator)))
    }

    /// The user whose parameters the user `name` would take: `name` is that user, the
    /// separator and parameters (`alice-country-de`), or parameters and then a
    /// parameter's name (`alice-session`), so that what a client means as `alice` with
    /// those parameters is taken as `name` (whole, or as the longest user). `is_user`:
    /// the other users.
    pub(crate) fn shadows<'a>(
        &self,
        name: &'a str,
        is_user: impl Fn(&str) -> bool,
    ) -> Option<&'a str> {
        let sep = &*self.separator;
        let key =
            |k: &str| k == "session" || k == "ttl" || self.choices.iter().any(|(n, _)| **n == *k);
        self.ends(name).filter(|&i| is_user(&name[..i])).find_map(|i| {
            let rest = &name[i + sep.len()..];
            let whole = self.parse(rest, rest).is_ok();
            let partial = match rest.rsplit_once(sep) {
                Some((head, last)) => key(last) && self.parse(head, head).is_ok(),
                None => key(rest),
            };
            (whole || partial).then_some(&name[..i])
        })
    }

    /// `rest`: what follows the user and its separator in `name`.
    fn parse(&self, name: &str, rest: &str) -> Result<Params, ParamError> {
        if name.len() > MAX_LEN {
            return Err(ParamError::TooLong);
        }
        let mut params = Params::default();
        let mut parts = rest.split(&*self.separator);
        while let Some(key) = parts.next() {
            if key.is_empty() {
                return Err(ParamError::EmptyName);
            }
            let value = match parts.next() {
                Some(v) if !v.is_empty() => v,
                _ => return Err(ParamError::NoValue(key.into())),
            };
            match key {
                "session" => {
                    if params.session.is_some() {
                        return Err(ParamError::Duplicate(key.into()));
                    }
                    if !is_session_id(value) {
                        return Err(ParamError::BadSession);
                    }
                    params.session = Some(value.into());
                }
                "ttl" => {
                    if params.ttl.is_some() {
                        return Err(ParamError::Duplicate(key.into()));
                    }
                    // Longer than the configuration's durations go (a year, or past
                    // what a number holds) is longer than `max_ttl` too: cut to it.
                    let huge = || {
                        let digits = value.bytes().all(|b| b.is_ascii_digit());
                        let long = humantime::parse_duration(value).map_or_else(
                            |e| matches!(e, humantime::DurationError::NumberOverflow),
                            |d| d > crate::config::MAX_DURATION,
                        );
                        (digits || long).then_some(self.max_ttl)
                    };
                    let ttl = crate::config::parse_duration(value)
                        .ok()
                        .or_else(huge)
                        .filter(|t| !t.is_zero())
                        .ok_or_else(|| ParamError::BadTtl(value.into()))?;
                    params.ttl = Some(ttl.min(self.max_ttl));
                }
                _ => {
                    let Some((name, values)) = self.choices.iter().find(|(n, _)| **n == *key)
                    else {
                        return Err(ParamError::Unknown(key.into()));
                    };
                    if params.get(name).is_some() {
                        return Err(ParamError::Duplicate(key.into()));
                    }
                    let Some(value) = values.iter().find(|v| ***v == *value) else {
                        let value = value.into();
                        return Err(ParamError::BadValue { name: key.into(), value });
                    };
                    params.choices.push((name.clone(), value.clone()));
                }
            }
        }
        Ok(params)
    }

    /// `user` with `params` written as a client would: `split` reads it back the same.
    #[cfg(test)]
    pub(crate) fn write(&self, user: &str, params: &Params) -> String {
        let sep = &*self.separator;
        let mut out = user.to_string();
        let mut put = |key: &str, value: &str| {
            for part in [sep, key, sep, value] {
                out.push_str(part);
            }
        };
        if let Some(session) = &params.session {
            put("session", session);
        }
        if let Some(ttl) = params.ttl {
            put("ttl", &humantime::format_duration(ttl).to_string().replace(' ', ""));
        }
        for (name, value) in &params.choices {
            put(name, value);
        }
        out
    }
}

/// 1 to 64 characters of `[A-Za-z0-9_]`.
pub(crate) fn is_session_id(s: &str) -> bool {
    (1..=MAX_SESSION_LEN).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests;
