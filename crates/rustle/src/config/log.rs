//! `[log]`: where access-log lines go (a stream, a file, syslog or the journal), how they
//! are written (plain, JSON, squid's native format or a template), and where diagnostics
//! go. A template is parsed here, once, into pieces; an unknown field is a problem of the
//! file with its line, like any bad value.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Deserializer};

/// How an access-log line is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogFormat {
    /// `TIME CLIENT METHOD TARGET STATUS UP DOWN MSms UPSTREAM [user=..] ["ERROR"]`.
    Plain,
    /// One JSON object per line.
    Json,
    /// squid's native `access.log` format, for the tools that read it.
    Squid,
    /// `{field}`s and text, as configured.
    Template(Arc<Template>),
}

impl LogFormat {
    /// `plain`, `json`, `squid`, or a template (any text with a `{field}` in it).
    pub(crate) fn parse(s: &str) -> Result<LogFormat, String> {
        match s {
            "plain" => Ok(LogFormat::Plain),
            "json" => Ok(LogFormat::Json),
            "squid" => Ok(LogFormat::Squid),
            t if t.contains('{') => Ok(LogFormat::Template(Arc::new(Template::parse(t)?))),
            other => Err(format!(
                "unknown log format `{other}`: expected plain, json, squid or a template \
                 such as \"{{time}} {{client}} {{method}} {{target}} {{status}}\""
            )),
        }
    }

    /// Whether lines show the client's User-Agent or Referer (front ends then keep them).
    pub(crate) fn wants_headers(&self) -> bool {
        match self {
            LogFormat::Template(t) => t
                .pieces
                .iter()
                .any(|p| matches!(p, Piece::Field(Field::UserAgent | Field::Referer))),
            LogFormat::Plain | LogFormat::Json | LogFormat::Squid => false,
        }
    }
}

impl<'de> Deserialize<'de> for LogFormat {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        LogFormat::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A parsed template: text and fields in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub(crate) pieces: Vec<Piece>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(Box<str>),
    Field(Field),
}

/// What a template can show. A missing value is written `-`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// When the line was written, ISO 8601 in UTC with milliseconds.
    Time,
    /// The same as seconds since the epoch with milliseconds (squid's `%ts.%03tu`).
    TimeUnix,
    /// The client's address and port.
    Client,
    /// The client's address alone.
    ClientIp,
    User,
    Method,
    Target,
    Status,
    BytesUp,
    BytesDown,
    /// From the start of the exchange to the line, in milliseconds (three decimals).
    Duration,
    UserAgent,
    Referer,
    /// The listener's name, or its address when it has none.
    Listener,
    /// HTTP/1.0, HTTP/1.1, HTTP/2, SOCKS4, SOCKS5, TCP (port relay), UDP.
    Protocol,
    Route,
    Via,
    /// `VERSION/CIPHER` of the client's TLS session.
    Tls,
    TlsVersion,
    TlsCipher,
    Sni,
    Upstream,
    Error,
}

impl Field {
    const ALL: [(&'static str, Field); 23] = [
        ("time", Field::Time),
        ("time_unix", Field::TimeUnix),
        ("client", Field::Client),
        ("client_ip", Field::ClientIp),
        ("user", Field::User),
        ("method", Field::Method),
        ("target", Field::Target),
        ("status", Field::Status),
        ("bytes_up", Field::BytesUp),
        ("bytes_down", Field::BytesDown),
        ("duration", Field::Duration),
        ("user_agent", Field::UserAgent),
        ("referer", Field::Referer),
        ("listener", Field::Listener),
        ("protocol", Field::Protocol),
        ("route", Field::Route),
        ("via", Field::Via),
        ("tls", Field::Tls),
        ("tls_version", Field::TlsVersion),
        ("tls_cipher", Field::TlsCipher),
        ("sni", Field::Sni),
        ("upstream", Field::Upstream),
        ("error", Field::Error),
    ];

    fn named(name: &str) -> Option<Field> {
        Field::ALL.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }
}

impl Template {
    /// `{name}` is a field, `{{` and `}}` are braces; control characters are refused (a
    /// line must stay one line).
    pub(crate) fn parse(text: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut lit = String::new();
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            if let Some(r) = rest.strip_prefix("{{") {
                lit.push('{');
                rest = r;
            } else if let Some(r) = rest.strip_prefix("}}") {
                lit.push('}');
                rest = r;
            } else if c == '{' {
                let end = rest.find('}').ok_or("log template: `{` without its `}`")?;
                let name = &rest[1..end];
                let field = Field::named(name).ok_or_else(|| {
                    let known: Vec<&str> = Field::ALL.iter().map(|(n, _)| *n).collect();
                    format!("log template: unknown field `{{{name}}}`; known: {}", known.join(", "))
                })?;
                if !lit.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut lit).into()));
                }
                pieces.push(Piece::Field(field));
                rest = &rest[end + 1..];
            } else if c == '}' {
                return Err("log template: `}` without its `{` (write `}}` for a brace)".into());
            } else if c.is_control() {
                return Err("log template: control characters (a newline, a tab) are not \
                            allowed; a line must stay one line"
                    .into());
            } else {
                lit.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        if !lit.is_empty() {
            pieces.push(Piece::Text(lit.into()));
        }
        if !pieces.iter().any(|p| matches!(p, Piece::Field(_))) {
            return Err("log template: no `{field}` in it".into());
        }
        Ok(Template { pieces })
    }
}

/// Where a syslog sink sends its datagrams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyslogAddr {
    /// A local datagram socket (`/dev/log`).
    Unix(PathBuf),
    Udp(SocketAddr),
}

/// The local syslog socket.
pub(super) const DEV_LOG: &str = "/dev/log";
/// The journal's native-protocol socket.
pub(super) const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// Where access-log lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    Stdout,
    Stderr,
    Off,
    File(PathBuf),
    /// `syslog` (`/dev/log`), `syslog:/path/to/socket` or `syslog:udp://HOST:PORT`.
    Syslog(SyslogAddr),
    /// `journald` or `journald:/path/to/socket`: the journal's native protocol.
    Journald(PathBuf),
}

impl<'de> Deserialize<'de> for LogTarget {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        LogTarget::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl LogTarget {
    pub fn parse(s: &str) -> Result<Self, String> {
        Ok(match s {
            "stdout" | "-" => LogTarget::Stdout,
            "stderr" => LogTarget::Stderr,
            "off" | "none" => LogTarget::Off,
            "syslog" => LogTarget::Syslog(SyslogAddr::Unix(DEV_LOG.into())),
            "journald" => LogTarget::Journald(JOURNAL_SOCKET.into()),
            s if s.starts_with("syslog:") => {
                let rest = &s["syslog:".len()..];
                match rest.strip_prefix("udp://") {
                    Some(addr) => {
                        LogTarget::Syslog(SyslogAddr::Udp(addr.parse().map_err(|_| {
                            format!("`{s}`: expected syslog:udp://ADDRESS:PORT (an IP address)")
                        })?))
                    }
                    None if rest.starts_with('/') => {
                        LogTarget::Syslog(SyslogAddr::Unix(rest.into()))
                    }
                    None => {
                        return Err(format!(
                            "`{s}`: expected syslog, syslog:/path/to/socket or \
                             syslog:udp://ADDRESS:PORT"
                        ))
                    }
                }
            }
            s if s.starts_with("journald:") => {
                let path = &s["journald:".len()..];
                if !path.starts_with('/') {
                    return Err(format!("`{s}`: expected journald or journald:/path/to/socket"));
                }
                LogTarget::Journald(path.into())
            }
            path => LogTarget::File(PathBuf::from(path)),
        })
    }
}

impl fmt::Display for LogTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogTarget::Stdout => f.write_str("stdout"),
            LogTarget::Stderr => f.write_str("stderr"),
            LogTarget::Off => f.write_str("off"),
            LogTarget::File(p) => write!(f, "{}", p.display()),
            LogTarget::Syslog(SyslogAddr::Unix(p)) => write!(f, "syslog:{}", p.display()),
            LogTarget::Syslog(SyslogAddr::Udp(a)) => write!(f, "syslog:udp://{a}"),
            LogTarget::Journald(p) => write!(f, "journald:{}", p.display()),
        }
    }
}

/// The syslog header: RFC 3164 (what glibc's syslog() sends, read by every daemon) or
/// RFC 5424.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyslogFormat {
    #[default]
    Rfc3164,
    Rfc5424,
}

/// A syslog facility, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facility(pub u8);

impl Default for Facility {
    fn default() -> Self {
        Facility(3) // daemon
    }
}

impl<'de> Deserialize<'de> for Facility {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const NAMES: [&str; 24] = [
            "kern",
            "user",
            "mail",
            "daemon",
            "auth",
            "syslog",
            "lpr",
            "news",
            "uucp",
            "cron",
            "authpriv",
            "ftp",
            "ntp",
            "security",
            "console",
            "solaris-cron",
            "local0",
            "local1",
            "local2",
            "local3",
            "local4",
            "local5",
            "local6",
            "local7",
        ];
        let s = String::deserialize(d)?;
        match NAMES.iter().position(|n| *n == s) {
            Some(i) => Ok(Facility(i as u8)),
            None => Err(serde::de::Error::custom(format!(
                "unknown syslog facility `{s}`: expected one of {}",
                NAMES.join(", ")
            ))),
        }
    }
}

/// Where the process's own diagnostics (`tracing`) go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Diagnostics {
    #[default]
    Stderr,
    Journald,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Log {
    /// `stdout`, `stderr`, `off`, a file path (appended to), `syslog[:...]` or
    /// `journald[:...]`.
    pub access: LogTarget,
    pub format: LogFormat,
    /// Diagnostics filter for `tracing` (overridden by RUST_LOG).
    pub level: String,
    /// Where diagnostics go (read at start).
    pub diagnostics: Diagnostics,
    /// The syslog facility of access-log messages.
    pub(crate) syslog_facility: Facility,
    pub(crate) syslog_format: SyslogFormat,
    /// The program name in syslog messages and the journal's SYSLOG_IDENTIFIER.
    pub tag: String,
}

impl Default for Log {
    fn default() -> Self {
        Log {
            access: LogTarget::Stdout,
            format: LogFormat::Plain,
            level: "info".into(),
            diagnostics: Diagnostics::Stderr,
            syslog_facility: Facility::default(),
            syslog_format: SyslogFormat::default(),
            tag: "rustle".into(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_into_pieces() {
        let t = Template::parse("{time} [{user}] {{x}} {status}").unwrap();
        assert_eq!(
            t.pieces,
            vec![
                Piece::Field(Field::Time),
                Piece::Text(" [".into()),
                Piece::Field(Field::User),
                Piece::Text("] {x} ".into()),
                Piece::Field(Field::Status),
            ]
        );
        let e = Template::parse("{time} {nope}").unwrap_err();
        assert!(e.contains("unknown field `{nope}`"), "{e}");
        assert!(Template::parse("{time").is_err());
        assert!(Template::parse("a } b {time}").is_err());
        assert!(Template::parse("{time}\n").is_err());
        assert!(Template::parse("no fields").is_err());
    }

    #[test]
    fn targets_parse() {
        assert_eq!(
            LogTarget::parse("syslog").unwrap(),
            LogTarget::Syslog(SyslogAddr::Unix(DEV_LOG.into()))
        );
        assert_eq!(
            LogTarget::parse("syslog:udp://127.0.0.1:514").unwrap(),
            LogTarget::Syslog(SyslogAddr::Udp("127.0.0.1:514".parse().unwrap()))
        );
        assert_eq!(
            LogTarget::parse("journald:/tmp/j").unwrap(),
            LogTarget::Journald("/tmp/j".into())
        );
        assert!(LogTarget::parse("syslog:udp://nowhere").is_err());
        assert!(LogTarget::parse("syslog:tcp").is_err());
        assert_eq!(LogTarget::parse("/var/log/a").unwrap(), LogTarget::File("/var/log/a".into()));
    }
}
