//! `[[quota]]`: traffic quotas per user or group (where their usage is kept: `[state]`).

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// `[[quota]]`: bytes a user may move in a period, alone (each member counts on its own).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct QuotaConfig {
    pub name: String,
    /// Users it applies to, by name.
    #[serde(default)]
    pub users: Vec<String>,
    /// Groups (the users file's and `[auth.groups]`) whose members it applies to.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Bytes per period (`"1MB"`, `"10GiB"`, or a number).
    #[serde(deserialize_with = "size")]
    pub bytes: u64,
    #[serde(default)]
    pub direction: QuotaDirection,
    #[serde(deserialize_with = "period")]
    pub period: Period,
    #[serde(default)]
    pub on_exceeded: OnExceeded,
}

/// Which bytes a quota counts. `in` is towards the client (downloads), `out` from the
/// client (uploads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuotaDirection {
    #[default]
    Both,
    In,
    Out,
}

/// What happens to a user's open tunnels once its quota is used up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnExceeded {
    /// They go on until they end; new requests and connections are refused.
    #[default]
    Finish,
    /// They are ended within a second.
    Close,
}

/// A quota's period: calendar periods in `[state] time_zone`, or a sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// From local midnight.
    Day,
    /// From Monday, local midnight.
    Week,
    /// From the 1st of the month, local midnight.
    Month,
    /// The last `Duration`, kept as `ROLLING_BUCKETS` buckets.
    Rolling(Duration),
}

/// A rolling window is kept as this many buckets: its usage falls a bucket at a time
/// (a 24h window, an hour at a time).
pub const ROLLING_BUCKETS: u64 = 24;

fn period<'de, D: Deserializer<'de>>(d: D) -> Result<Period, D::Error> {
    let text = String::deserialize(d)?;
    parse_period(&text).map_err(serde::de::Error::custom)
}

pub(crate) fn parse_period(text: &str) -> Result<Period, String> {
    match text {
        "day" => Ok(Period::Day),
        "week" => Ok(Period::Week),
        "month" => Ok(Period::Month),
        _ => match text.strip_prefix("rolling:") {
            Some(d) => {
                let d = super::parse_duration(d)?;
                if d.as_secs() < ROLLING_BUCKETS {
                    return Err(format!(
                        "period {text:?}: a rolling window is at least {ROLLING_BUCKETS}s"
                    ));
                }
                Ok(Period::Rolling(d))
            }
            None => Err(format!(
                "period {text:?}: expected \"day\", \"week\", \"month\" or \"rolling:DURATION\""
            )),
        },
    }
}

fn size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Number(u64),
        Text(String),
    }
    match Size::deserialize(d)? {
        Size::Number(n) => Ok(n),
        Size::Text(t) => parse_size(&t).map_err(serde::de::Error::custom),
    }
}

/// A size: a number, optional spaces, an optional unit: `B`, `kB`/`KB`, `MB`, `GB`, `TB`
/// (decimal), `KiB`, `MiB`, `GiB`, `TiB` (binary).
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim_start());
    let n: u64 = num.parse().map_err(|_| format!("size {s:?} does not start with a number"))?;
    let mul: u64 = match unit {
        "" | "B" => 1,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => {
            return Err(format!(
                "size {s:?}: unknown unit {unit:?} (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)"
            ))
        }
    };
    n.checked_mul(mul).ok_or_else(|| format!("size {s:?} is too large"))
}

/// Problems of the quotas beyond their types: names missing or given twice, and quotas
/// naming nobody.
pub(crate) fn problems(quotas: &[QuotaConfig]) -> Vec<String> {
    problems_at(quotas).into_iter().map(|(_, m)| m).collect()
}

/// `problems`, each with the index of its `[[quota]]` table.
pub(super) fn problems_at(quotas: &[QuotaConfig]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, q) in quotas.iter().enumerate() {
        if q.name.is_empty() {
            out.push((i, format!("quota #{}: empty name", i + 1)));
        } else if quotas[..i].iter().any(|p| p.name == q.name) {
            out.push((i, format!("quota {:?}: declared twice", q.name)));
        }
        if q.users.is_empty() && q.groups.is_empty() {
            out.push((i, format!("quota {:?}: names no user and no group", q.name)));
        }
        if q.bytes == 0 {
            out.push((i, format!("quota {:?}: bytes is 0", q.name)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_periods() {
        let table: &[(&str, Option<u64>)] = &[
            ("1MB", Some(1_000_000)),
            ("10GiB", Some(10 << 30)),
            ("1048576", Some(1 << 20)),
            ("5 KiB", Some(5120)),
            ("1mb", None),
            ("MB", None),
        ];
        for (text, want) in table {
            assert_eq!(parse_size(text).ok(), *want, "{text}");
        }
        assert_eq!(parse_period("day"), Ok(Period::Day));
        assert_eq!(parse_period("rolling:24h"), Ok(Period::Rolling(Duration::from_secs(86400))));
        assert!(parse_period("rolling:1s").is_err());
        assert!(parse_period("year").is_err());
    }
}
