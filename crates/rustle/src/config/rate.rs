//! Bandwidth rates in the configuration (`rate_up = "10mbit"`): text to bytes per second.

/// Parses a rate and returns bytes per second. A number (decimals allowed, `1.5mbit`),
/// optional spaces, an optional unit, an optional `/s`:
/// - bits: `bit`, `kbit`, `mbit`, `gbit`, `tbit` (any case; decimal prefixes);
/// - bytes, always with an uppercase `B`: `B`, `kB`/`KB`, `MB`, `GB`, `TB` (decimal),
///   `KiB`, `MiB`, `GiB`, `TiB` (binary);
/// - no unit: bytes per second.
///
/// `kb`, `mb`, `Mbps` and the like are refused as ambiguous (bits or bytes?). A rate that
/// comes to less than 1 byte per second is refused; so is 0 (no limit is no rate at all).
pub(crate) fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty rate".into());
    }
    let t = t.strip_suffix("/s").unwrap_or(t).trim_end();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim_start());
    if num.is_empty() {
        return Err(format!("rate {s:?} does not start with a number"));
    }
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(format!("rate {s:?}: {num:?} is not a number"));
    }
    if frac.len() > 9 {
        return Err(format!("rate {s:?}: more than 9 decimals"));
    }
    // The value is mantissa / 10^frac.len() units.
    let mantissa: u128 =
        format!("{int}{frac}").parse().map_err(|_| format!("rate {s:?}: {num:?} is too large"))?;
    let scale = 10u128.pow(frac.len() as u32);
    let (mul, bits) = unit_of(unit).ok_or_else(|| unit_error(s, unit))?;
    let per_sec = mantissa
        .checked_mul(mul)
        .map(|v| v / scale / if bits { 8 } else { 1 })
        .ok_or_else(|| format!("rate {s:?} is too large"))?;
    if mantissa == 0 {
        return Err(format!("rate {s:?} is zero (leave the limit out for no limit)"));
    }
    match u64::try_from(per_sec) {
        Ok(0) => Err(format!("rate {s:?} is less than 1 byte per second")),
        Ok(v) => Ok(v),
        Err(_) => Err(format!("rate {s:?} is too large")),
    }
}

/// (multiplier, in bits?) for a unit.
fn unit_of(unit: &str) -> Option<(u128, bool)> {
    const K: u128 = 1000;
    let bytes = match unit {
        "" | "B" => Some(1),
        "kB" | "KB" => Some(K),
        "MB" => Some(K.pow(2)),
        "GB" => Some(K.pow(3)),
        "TB" => Some(K.pow(4)),
        "KiB" => Some(1 << 10),
        "MiB" => Some(1 << 20),
        "GiB" => Some(1 << 30),
        "TiB" => Some(1 << 40),
        _ => None,
    };
    if let Some(m) = bytes {
        return Some((m, false));
    }
    let bits = match unit.to_ascii_lowercase().as_str() {
        "bit" => 1,
        "kbit" => K,
        "mbit" => K.pow(2),
        "gbit" => K.pow(3),
        "tbit" => K.pow(4),
        _ => return None,
    };
    Some((bits, true))
}

fn unit_error(s: &str, unit: &str) -> String {
    let lower = unit.to_ascii_lowercase();
    let lower = lower.strip_suffix("ps").unwrap_or(&lower);
    let prefix = lower.strip_suffix('b').filter(|p| ["", "k", "m", "g", "t"].contains(p));
    match prefix {
        Some(p) => format!(
            "rate {s:?}: unit {unit:?} is ambiguous; write {p}bit for bits or {}B for bytes \
             per second",
            match p {
                "k" => "k",
                "m" => "M",
                "g" => "G",
                "t" => "T",
                _ => "",
            }
        ),
        None => format!(
            "rate {s:?}: unknown unit {unit:?} (use bit, kbit, mbit, gbit, B, kB, MB, GB, \
             KiB, MiB or GiB)"
        ),
    }
}
