//! Durations in the configuration: a number of seconds, or text such as "250ms", "5m".

use std::fmt;
use std::time::Duration;

use serde::Deserializer;

/// Accepts `"250ms"`, `"10s"`, `"5m"`, `"1h"` or a bare number of seconds; anything else
/// is refused naming what was expected and what was found (`io = -5`: a negative number).
pub(super) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    struct Visitor;
    impl serde::de::Visitor<'_> for Visitor {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration: a number of seconds (0 or more) or text such as \"10s\", \"250ms\", \"5m\", \"1h\"")
        }

        fn visit_u64<E: serde::de::Error>(self, s: u64) -> Result<Duration, E> {
            at_most_a_year(Duration::from_secs(s), &s.to_string()).map_err(E::custom)
        }

        fn visit_i64<E: serde::de::Error>(self, s: i64) -> Result<Duration, E> {
            match u64::try_from(s) {
                Ok(s) => self.visit_u64(s),
                Err(_) => Err(E::invalid_value(serde::de::Unexpected::Signed(s), &self)),
            }
        }

        fn visit_str<E: serde::de::Error>(self, t: &str) -> Result<Duration, E> {
            parse_duration(t).map_err(E::custom)
        }
    }
    d.deserialize_any(Visitor)
}

/// The longest duration a setting takes: deadlines are instants, and "forever" written as a
/// huge number must be an error, not an overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

fn at_most_a_year(d: Duration, text: &str) -> Result<Duration, String> {
    if d > MAX_DURATION {
        return Err(format!("duration `{text}` is too long: at most 365 days"));
    }
    Ok(d)
}

pub fn parse_duration(t: &str) -> Result<Duration, String> {
    let t = t.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid duration `{t}`"))?;
    let too_long = || format!("duration `{t}` is too long: at most 365 days");
    let d = match unit.trim() {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(too_long)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(too_long)?),
        _ => return Err(format!("invalid duration `{t}`: use ms, s, m or h")),
    };
    at_most_a_year(d, t)
}
