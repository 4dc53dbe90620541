//! Durations in the configuration: a number of seconds, or text such as "250ms", "5m"
//! (read by humantime).

use std::fmt;
use std::time::Duration;

use serde::Deserializer;

/// Accepts a number of seconds or what `parse_duration` reads; anything else is refused naming what was expected and what was found (`io = -5`: a negative number).
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

/// `duration` for a setting that may be left out (with `#[serde(default)]`).
pub(super) fn optional_duration<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

/// The longest duration a setting takes: deadlines are instants, and "forever" written as a
/// huge number must be an error, not an overflow.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

fn at_most_a_year(d: Duration, text: &str) -> Result<Duration, String> {
    if d > MAX_DURATION {
        return Err(format!("duration `{text}` is too long: at most 365 days"));
    }
    Ok(d)
}

/// A duration as the configuration writes it: a bare number of seconds (`"30"`), or text
/// that humantime reads (`"250ms"`, `"10s"`, `"10 s"`, `"5m"`, `"1h"`, and its longer
/// spellings and sums such as `"2min"`, `"1h 30m"`, `"1.5s"`), at most a year.
pub(crate) fn parse_duration(t: &str) -> Result<Duration, String> {
    let t = t.trim();
    let d = if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        let n: u64 = t.parse().map_err(|_| too_long(t))?;
        Duration::from_secs(n)
    } else {
        humantime::parse_duration(t).map_err(|e| match e {
            humantime::DurationError::NumberOverflow => too_long(t),
            e @ humantime::DurationError::UnknownUnit { .. } => {
                format!("invalid duration `{t}`: {e}")
            }
            _ => format!(
                "invalid duration `{t}`: expected a number of seconds or text such as \"10s\", \
                 \"250ms\", \"5m\", \"1h 30m\""
            ),
        })?
    };
    at_most_a_year(d, t)
}

fn too_long(t: &str) -> String {
    format!("duration `{t}` is too long: at most 365 days")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_a_duration() {
        let secs = Duration::from_secs;
        let table: &[(&str, Duration)] = &[
            ("250ms", Duration::from_millis(250)),
            ("0ms", Duration::ZERO),
            ("10s", secs(10)),
            ("10 s", secs(10)),
            (" 10s ", secs(10)),
            ("10", secs(10)),
            ("007", secs(7)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("5m", secs(300)),
            ("1h", secs(3600)),
            ("8760h", MAX_DURATION),
            ("2min", secs(120)),
            ("1h 30m", secs(5400)),
            ("1.5s", Duration::from_millis(1500)),
            ("2days", secs(2 * 86_400)),
        ];
        for (text, want) in table {
            assert_eq!(parse_duration(text), Ok(*want), "{text:?}");
        }
    }

    #[test]
    fn what_is_not_a_duration() {
        for text in ["", " ", "ten seconds", "2 fortnights", "-5s", "5x", "s", "1e3s"] {
            let e = parse_duration(text).expect_err(text);
            assert!(e.contains("invalid duration"), "{text:?}: {e}");
        }
        // "Forever" as a huge number is refused, not overflowed.
        for text in ["8761h", "366days", "99999999999999999999", "99999999999999999999h"] {
            let e = parse_duration(text).expect_err(text);
            assert!(e.contains("too long"), "{text:?}: {e}");
        }
        assert!(parse_duration("18446744073709551615m")
            .expect_err("overflow")
            .contains("too long"));
    }
}
