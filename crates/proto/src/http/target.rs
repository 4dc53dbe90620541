//! Request-target parsing (RFC 9112 3.2).
//!
//! The proxy connects to whatever host this returns, so the rules are
//! deliberately narrower than RFC 3986: hosts are either an IPv6 literal
//! (validated by the standard library) or a reg-name made of unreserved
//! characters (no percent-encoding, no sub-delims), and anything odd is
//! rejected rather than guessed at.

use super::{HeadError, Method, Scheme, Span, Target};
use std::net::Ipv6Addr;

/// Host and port found in an authority, as offsets into the authority bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Authority {
    pub host_start: usize,
    pub host_end: usize,
    pub port: Option<u16>,
}

/// Parse the target found at `span` of `buf` for `method`.
pub(crate) fn parse_target(buf: &[u8], span: Span, method: Method) -> Result<Target, HeadError> {
    let t = span.get(buf);
    check_chars(t)?;
    if method == Method::Connect {
        // authority-form only: no path, no scheme, no `*`.
        if t.first() == Some(&b'/') || t == b"*" || t.contains(&b'/') {
            return Err(HeadError::ConnectNeedsAuthority);
        }
        let a = parse_authority(t, true)?;
        return Ok(Target::Authority {
            host: sub(span, a.host_start, a.host_end),
            // parse_authority with port_required never returns None
            port: a.port.unwrap_or(0),
            authority: span,
        });
    }
    if t == b"*" {
        return if method == Method::Options {
            Ok(Target::Asterisk)
        } else {
            Err(HeadError::AsteriskNotOptions)
        };
    }
    if t.first() == Some(&b'/') {
        return Ok(Target::Origin { path: span });
    }
    parse_absolute(t, span)
}

/// Target bytes must be visible ASCII (httparse also lets obs-text through)
/// and must not carry a fragment, which is never sent on the wire.
fn check_chars(t: &[u8]) -> Result<(), HeadError> {
    // Branch-free over the whole target (it vectorizes); the loop below only
    // names the fault.
    let clean = t.iter().fold(true, |ok, &b| ok & (b.wrapping_sub(0x21) < 0x5e) & (b != b'#'));
    if clean {
        return Ok(());
    }
    for &b in t {
        if b == b'#' {
            return Err(HeadError::Fragment);
        }
        if !(0x21..=0x7e).contains(&b) {
            return Err(HeadError::InvalidTargetChar);
        }
    }
    Ok(())
}

fn parse_absolute(t: &[u8], span: Span) -> Result<Target, HeadError> {
    let Some(sep) = find(t, b"://") else {
        // `host:port` sent with another method than CONNECT: say so instead
        // of a generic error, it is a common client mistake.
        return if parse_authority(t, true).is_ok() {
            Err(HeadError::AuthorityFormNotConnect)
        } else {
            Err(HeadError::InvalidTarget)
        };
    };
    let scheme_bytes = &t[..sep];
    let scheme = if scheme_bytes.eq_ignore_ascii_case(b"http") {
        Scheme::Http
    } else if scheme_bytes.eq_ignore_ascii_case(b"https") {
        Scheme::Https
    } else if scheme_bytes.eq_ignore_ascii_case(b"ws") {
        Scheme::Ws
    } else if scheme_bytes.eq_ignore_ascii_case(b"wss") {
        Scheme::Wss
    } else if is_scheme(scheme_bytes) {
        return Err(HeadError::UnsupportedScheme);
    } else {
        return Err(HeadError::InvalidTarget);
    };
    let auth_start = sep + 3;
    let rest = t.get(auth_start..).unwrap_or(&[]);
    let auth_len = rest.iter().position(|&b| b == b'/' || b == b'?').unwrap_or(rest.len());
    let a = parse_authority(&rest[..auth_len], false)?;
    let default_port = match scheme {
        Scheme::Http | Scheme::Ws => 80,
        Scheme::Https | Scheme::Wss => 443,
    };
    Ok(Target::Absolute {
        scheme,
        host: sub(span, auth_start + a.host_start, auth_start + a.host_end),
        port: a.port.unwrap_or(default_port),
        authority: sub(span, auth_start, auth_start + auth_len),
        path: sub(span, auth_start + auth_len, t.len()),
    })
}

/// Parse `host[:port]` with an IPv6 literal allowed in brackets. Used for
/// targets and for validating the Host header.
pub(crate) fn parse_authority(a: &[u8], port_required: bool) -> Result<Authority, HeadError> {
    if a.contains(&b'@') {
        return Err(HeadError::Userinfo);
    }
    if a.is_empty() {
        return Err(HeadError::EmptyHost);
    }
    let (host_start, host_end, rest) = if a[0] == b'[' {
        let close = a.iter().position(|&b| b == b']').ok_or(HeadError::InvalidHost)?;
        let inner = &a[1..close];
        let valid =
            std::str::from_utf8(inner).ok().and_then(|s| s.parse::<Ipv6Addr>().ok()).is_some();
        if !valid {
            return Err(HeadError::InvalidHost);
        }
        (1, close, &a[close + 1..])
    } else {
        // reg-name / IPv4 contain no ':', so the first one starts the port.
        let end = a.iter().position(|&b| b == b':').unwrap_or(a.len());
        let host = &a[..end];
        if host.is_empty() {
            return Err(HeadError::EmptyHost);
        }
        if !host.iter().fold(true, |ok, &b| ok & is_host_char(b)) {
            return Err(HeadError::InvalidHost);
        }
        (0, end, &a[end..])
    };
    let port = match rest {
        [] => None,
        [b':', digits @ ..] => Some(parse_port(digits)?),
        _ => return Err(HeadError::InvalidHost),
    };
    if port_required && port.is_none() {
        return Err(HeadError::MissingPort);
    }
    Ok(Authority { host_start, host_end, port })
}

/// 1 to 5 digits, value 1..=65535. An empty port (`host:`) is legal in RFC
/// 3986 but pointless for a proxy and a classic parser-differential, so it
/// is rejected.
fn parse_port(d: &[u8]) -> Result<u16, HeadError> {
    if d.is_empty() || d.len() > 5 {
        return Err(HeadError::InvalidPort);
    }
    let mut v: u32 = 0;
    for &b in d {
        if !b.is_ascii_digit() {
            return Err(HeadError::InvalidPort);
        }
        v = v * 10 + u32::from(b - b'0');
    }
    match u16::try_from(v) {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(HeadError::InvalidPort),
    }
}

/// RFC 3986 unreserved characters: enough for DNS names and IPv4.
pub(crate) fn is_host_char(b: u8) -> bool {
    // Without short-circuits, so that a loop over a host vectorizes.
    let lower = b | 0x20;
    (lower.wrapping_sub(b'a') < 26)
        | b.is_ascii_digit()
        | (b == b'-')
        | (b == b'.')
        | (b == b'_')
        | (b == b'~')
}

fn is_scheme(s: &[u8]) -> bool {
    match s.split_first() {
        Some((first, rest)) => {
            first.is_ascii_alphabetic()
                && rest
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
        }
        None => false,
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Sub-span `[from, to)` relative to `span.start`. Offsets come from a
/// slice of at most `span.len()` bytes, so they fit in u32.
fn sub(span: Span, from: usize, to: usize) -> Span {
    Span { start: span.start + from as u32, end: span.start + to as u32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The branch-free forms accept exactly the bytes the plain definitions do.
    #[test]
    fn branch_free_checks_match_their_definitions() {
        for b in 0..=255u8 {
            let host = b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~');
            assert_eq!(is_host_char(b), host, "host byte {b:#04x}");
            let target = match b {
                b'#' => Err(HeadError::Fragment),
                0x21..=0x7e => Ok(()),
                _ => Err(HeadError::InvalidTargetChar),
            };
            assert_eq!(check_chars(&[b'/', b, b'x']), target, "target byte {b:#04x}");
        }
    }
}
