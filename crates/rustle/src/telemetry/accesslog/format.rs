//! The ways to write an `Record`: plain, JSON, squid's native format and templates. Each
//! appends one line (without its newline) to the worker's buffer; a template's pieces were
//! parsed once, at load.

use std::fmt::{self, Write as _};

use super::{Now, Protocol, Record};
use crate::config::{Field, LogFormat, Piece};

/// Appends `e` as `format` says.
pub(super) fn write(format: &LogFormat, buf: &mut Vec<u8>, e: &Record<'_>, now: &Now<'_>) {
    let out = &mut Out(buf);
    // Writing to a Vec cannot fail.
    let _ = match format {
        LogFormat::Plain => plain(out, e, now),
        LogFormat::Json => json(out, e, now),
        LogFormat::Squid => squid(out, e, now),
        LogFormat::Template(t) => t.pieces.iter().try_for_each(|p| match p {
            Piece::Text(s) => out.write_str(s),
            Piece::Field(f) => field(out, *f, e, now),
        }),
    };
}

/// `fmt::Write` into the worker's byte buffer.
pub(super) struct Out<'a>(pub &'a mut Vec<u8>);

impl fmt::Write for Out<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

fn millis(e: &Record<'_>) -> f64 {
    e.start.elapsed().as_secs_f64() * 1000.0
}

fn iso<'a, 'b>(now: &'a Now<'b>) -> Iso<'a, 'b> {
    Iso(now)
}

struct Iso<'a, 'b>(&'a Now<'b>);

impl fmt::Display for Iso<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:03}Z", self.0.clock.iso, self.0.millis)
    }
}

fn plain(out: &mut Out<'_>, e: &Record<'_>, now: &Now<'_>) -> fmt::Result {
    write!(
        out,
        "{} {} {} {} {} {} {} {:.3}ms ",
        iso(now),
        e.client,
        Text(e.method(), Esc::None),
        Text(e.target(), Esc::None),
        e.status,
        e.up,
        e.down,
        millis(e),
    )?;
    match e.upstream {
        Some(a) => write!(out, "{a}")?,
        None => out.write_char('-')?,
    }
    if let Some(u) = e.user {
        write!(out, " user={}", Escaped(u))?;
    }
    if let Some(t) = e.tls {
        write!(
            out,
            " tls={}/{} sni={}{}",
            t.version,
            t.cipher,
            Escaped(t.sni.as_deref().unwrap_or("-")),
            if t.resumed { " resumed" } else { "" }
        )?;
    }
    if let Some(v) = e.via {
        write!(out, " route={} via={}", Escaped(&v.route), Escaped(&v.parents))?;
    }
    if let Some(err) = e.error {
        write!(out, " \"{}\"", Escaped(&err.to_string()))?;
    }
    Ok(())
}

fn json(out: &mut Out<'_>, e: &Record<'_>, now: &Now<'_>) -> fmt::Result {
    write!(
        out,
        "{{\"time\":\"{}\",\"client\":\"{}\",\"listener\":\"{}\",\"protocol\":\"{}\",\
         \"method\":\"{}\",\"target\":\"{}\",\"status\":{},\"bytes_up\":{},\"bytes_down\":{},\
         \"ms\":{:.3}",
        iso(now),
        e.client,
        ListenerName(e, Esc::Json),
        e.protocol_name(),
        Text(e.method(), Esc::Json),
        Text(e.target(), Esc::Json),
        e.status,
        e.up,
        e.down,
        millis(e)
    )?;
    if let Some(a) = e.upstream {
        write!(out, ",\"upstream\":\"{a}\"")?;
    }
    if let Some(u) = e.user {
        write!(out, ",\"user\":\"{}\"", Escaped(u))?;
    }
    if let Some(t) = e.tls {
        write!(
            out,
            ",\"tls_version\":\"{}\",\"tls_cipher\":\"{}\",\"sni\":\"{}\",\"tls_resumed\":{}",
            t.version,
            t.cipher,
            Escaped(t.sni.as_deref().unwrap_or("")),
            t.resumed
        )?;
    }
    if let Some(v) = e.via {
        write!(out, ",\"route\":\"{}\",\"via\":\"{}\"", Escaped(&v.route), Escaped(&v.parents))?;
    }
    if let Some(err) = e.error {
        write!(out, ",\"error\":\"{}\"", Escaped(&err.to_string()))?;
    }
    out.write_char('}')
}

/// squid's native format (`logformat squid`, as squid's `Log::Format::SquidNative` writes
/// it): `%9d.%03d %6d CLIENT_IP CODE/%03d BYTES METHOD URL USER HIERARCHY/HOST TYPE`. Bytes
/// are the body bytes sent to the client; the content type is not kept (`-`).
fn squid(out: &mut Out<'_>, e: &Record<'_>, now: &Now<'_>) -> fmt::Result {
    let (code, status) = squid_code(e);
    let elapsed = e.start.elapsed().as_millis();
    let target = match e.protocol {
        // As squid logs a CONNECT: host:port.
        Protocol::Socks4 | Protocol::Socks5 => {
            let t = e.target();
            t.strip_prefix(b"socks5://").or_else(|| t.strip_prefix(b"socks4://")).unwrap_or(t)
        }
        _ => e.target(),
    };
    write!(
        out,
        "{:>9}.{:03} {:>6} {} {}/{:03} {} {} {} ",
        now.unix.as_secs(),
        now.millis,
        elapsed,
        e.client.ip(),
        code,
        status,
        e.down,
        Text(e.method(), Esc::Squid),
        Text(target, Esc::Squid),
    )?;
    match e.user {
        Some(u) if !u.is_empty() => write!(out, "{}", Text(u.as_bytes(), Esc::Squid))?,
        _ => out.write_char('-')?,
    }
    match (e.via, e.upstream) {
        (Some(v), _) => {
            let first = v.parents.split(',').next().unwrap_or("-");
            write!(out, " FIRST_UP_PARENT/{}", Text(first.as_bytes(), Esc::Squid))?;
        }
        (None, Some(a)) => write!(out, " HIER_DIRECT/{}", a.ip())?,
        (None, None) => out.write_str(" HIER_NONE/-")?,
    }
    out.write_str(" -")
}

/// squid's result code and the HTTP status for an entry. Tunnels (CONNECT, SOCKS, port
/// relays) are `TCP_TUNNEL`, refusals by the rules or for credentials `TCP_DENIED`, a
/// request refused before its method was read or as malformed `NONE_NONE`, a client gone before its answer
/// `TCP_MISS_ABORTED`; a SOCKS reply shows as the HTTP status of the same meaning, and a
/// SOCKS refusal for credentials (RFC 1929's failure, a SOCKS4 user id refused) or by the
/// rules as squid shows the same refusal of an HTTP client: `TCP_DENIED/407`, `/403`.
pub(super) fn squid_code(e: &Record<'_>) -> (&'static str, u16) {
    use crate::telemetry::metrics::Refused;
    let socks = matches!(e.protocol, Protocol::Socks4 | Protocol::Socks5);
    let status = match e.protocol {
        _ if socks && e.refused == Some(Refused::Auth) => 407,
        _ if socks && e.refused == Some(Refused::Rule) => 403,
        Protocol::Socks5 => match e.status {
            0 if e.upstream.is_some() => 200,
            0 => 0,
            1 => 500,
            2 => 403,
            3..=5 => 502,
            6 => 504,
            7 | 8 => 501,
            other => other,
        },
        Protocol::Socks4 => match e.status {
            90 => 200,
            91 => 502,
            92 | 93 => 407,
            other => other,
        },
        Protocol::Relay | Protocol::Udp if e.status == 0 && e.error.is_none() => 200,
        _ => e.status,
    };
    let tunnel = e.method() == b"CONNECT"
        || e.method() == b"BIND"
        || matches!(e.protocol, Protocol::Socks4 | Protocol::Socks5 | Protocol::Relay);
    let code = if e.protocol == Protocol::Udp || e.method() == b"UDP" {
        "UDP_MISS"
    } else if e.upstream.is_none() && matches!(status, 403 | 407) {
        // Before its method was read too: a SOCKS5 client refused at authentication.
        "TCP_DENIED"
    } else if e.method() == b"-" {
        "NONE_NONE"
    } else if e.upstream.is_none() && (400..500).contains(&status) {
        // Refused as malformed (400, 414, 431, ...) or too slow (408).
        "NONE_NONE"
    } else if tunnel {
        "TCP_TUNNEL"
    } else if status == 0 {
        "TCP_MISS_ABORTED"
    } else {
        "TCP_MISS"
    };
    (code, status)
}

fn field(out: &mut Out<'_>, f: Field, e: &Record<'_>, now: &Now<'_>) -> fmt::Result {
    let or_dash = |out: &mut Out<'_>, v: Option<&str>| match v {
        Some(s) if !s.is_empty() => write!(out, "{}", Escaped(s)),
        _ => out.write_char('-'),
    };
    let bytes_or_dash = |out: &mut Out<'_>, v: &[u8]| match v {
        b"" => out.write_char('-'),
        v => write!(out, "{}", Text(v, Esc::Json)),
    };
    match f {
        Field::Time => write!(out, "{}", iso(now)),
        Field::TimeUnix => write!(out, "{}.{:03}", now.unix.as_secs(), now.millis),
        Field::Client => write!(out, "{}", e.client),
        Field::ClientIp => write!(out, "{}", e.client.ip()),
        Field::User => or_dash(out, e.user),
        Field::Method => bytes_or_dash(out, e.method()),
        Field::Target => bytes_or_dash(out, e.target()),
        Field::Status => write!(out, "{}", e.status),
        Field::BytesUp => write!(out, "{}", e.up),
        Field::BytesDown => write!(out, "{}", e.down),
        Field::Duration => write!(out, "{:.3}", millis(e)),
        Field::UserAgent => bytes_or_dash(out, e.user_agent()),
        Field::Referer => bytes_or_dash(out, e.referer()),
        Field::Listener => write!(out, "{}", ListenerName(e, Esc::Json)),
        Field::Protocol => out.write_str(e.protocol_name()),
        Field::Route => or_dash(out, e.via.map(|v| &*v.route)),
        Field::Via => or_dash(out, e.via.map(|v| &*v.parents)),
        Field::Tls => match e.tls {
            Some(t) => write!(out, "{}/{}", t.version, t.cipher),
            None => out.write_char('-'),
        },
        Field::TlsVersion => or_dash(out, e.tls.map(|t| t.version)),
        Field::TlsCipher => or_dash(out, e.tls.map(|t| t.cipher)),
        Field::Sni => or_dash(out, e.tls.and_then(|t| t.sni.as_deref())),
        Field::Upstream => match e.upstream {
            Some(a) => write!(out, "{a}"),
            None => out.write_char('-'),
        },
        Field::Error => match e.error {
            Some(err) => write!(out, "{}", Escaped(&err.to_string())),
            None => out.write_char('-'),
        },
    }
}

/// The listener's name, or its address when it has none.
struct ListenerName<'a, 'b>(&'a Record<'b>, Esc);

impl fmt::Display for ListenerName<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.listener.name {
            Some(n) => Text(n.as_bytes(), self.1).fmt(f),
            None => write!(f, "{}", self.0.listener.listen),
        }
    }
}

/// How bytes from the wire are made safe for a line.
#[derive(Clone, Copy)]
pub(super) enum Esc {
    /// As they are (the head parser let no control character through), invalid UTF-8
    /// replaced.
    None,
    /// `"` and `\` escaped, control characters as `\u00XX`: for JSON strings and quoted
    /// fields.
    Json,
    /// squid's fields are split on whitespace: space, control characters and `%` as
    /// `%XX`.
    Squid,
}

pub(super) struct Text<'a>(pub &'a [u8], pub Esc);

impl fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            let valid = chunk.valid();
            match self.1 {
                Esc::None => f.write_str(valid)?,
                Esc::Json => Escaped(valid).fmt(f)?,
                Esc::Squid => {
                    for c in valid.chars() {
                        match c {
                            c if c.is_control() || c.is_whitespace() || c == '%' => {
                                let mut b = [0u8; 4];
                                for byte in c.encode_utf8(&mut b).bytes() {
                                    write!(f, "%{byte:02X}")?;
                                }
                            }
                            c => f.write_char(c)?,
                        }
                    }
                }
            }
            if !chunk.invalid().is_empty() {
                f.write_char(char::REPLACEMENT_CHARACTER)?;
            }
        }
        Ok(())
    }
}

/// Escapes a string for a JSON string or a quoted plain-log field.
pub(super) struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                c if (c as u32) < 0x20 || c == '\u{7f}' => write!(f, "\\u{:04x}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(Escaped("a\"b\\c\n").to_string(), "a\\\"b\\\\c\\u000a");
        assert_eq!(Text(b"a b%\x01\xff", Esc::Squid).to_string(), "a%20b%25%01\u{fffd}");
        assert_eq!(Text(b"x\"\n", Esc::Json).to_string(), "x\\\"\\u000a");
    }
}
