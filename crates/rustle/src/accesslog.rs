//! The access log: one line per request or tunnel, plain or JSON. Each worker formats into
//! its own buffer and writes it out in one call when it fills or on a short timer, so a
//! request costs no syscall and no lock for logging.

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::fs::File;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::config::{LogFormat, LogTarget};

/// A worker writes its buffer out once it holds this much, so a busy worker makes one
/// write call per few hundred lines.
const FLUSH_AT: usize = 32 * 1024;

/// Where the lines of all workers go. Flushes take the lock; lines never do.
#[derive(Clone)]
pub enum Sink {
    Stdout,
    Stderr,
    File(Arc<LogFile>),
    Off,
}

/// An access-log file shared by the workers, and the path it was opened at.
pub struct LogFile {
    path: PathBuf,
    file: Mutex<File>,
}

fn open_append(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new().create(true).append(true).open(path)
}

impl Sink {
    pub fn open(target: &LogTarget) -> io::Result<Sink> {
        Ok(match target {
            LogTarget::Stdout => Sink::Stdout,
            LogTarget::Stderr => Sink::Stderr,
            LogTarget::Off => Sink::Off,
            LogTarget::File(path) => {
                let file = Mutex::new(open_append(path)?);
                Sink::File(Arc::new(LogFile { path: path.clone(), file }))
            }
        })
    }

    /// Opens the file again at its path (SIGUSR1, once logrotate has renamed it): every
    /// worker's next flush, which takes the lock anyway, goes to the new file, lines it
    /// buffered before included. The path reopened, or None when lines go to no file.
    pub fn reopen(&self) -> io::Result<Option<&Path>> {
        let Sink::File(log) = self else {
            return Ok(None);
        };
        // Opened before taking the lock: a slow file system does not stall the flushes.
        let fresh = open_append(&log.path)?;
        let mut file = log.file.lock().unwrap_or_else(|p| p.into_inner());
        *file = fresh;
        Ok(Some(&log.path))
    }

    fn write(&self, bytes: &[u8]) {
        let res = match self {
            Sink::Stdout => io::stdout().lock().write_all(bytes),
            Sink::Stderr => io::stderr().lock().write_all(bytes),
            Sink::File(log) => match log.file.lock() {
                Ok(mut f) => f.write_all(bytes),
                Err(poisoned) => poisoned.into_inner().write_all(bytes),
            },
            Sink::Off => Ok(()),
        };
        if let Err(e) = res {
            tracing::warn!("access log write failed: {e}");
        }
    }
}

/// What one line says.
pub struct Entry<'a> {
    pub client: SocketAddr,
    pub method: &'a [u8],
    pub target: &'a [u8],
    /// The status the client got; 0 when it got none (it went away first).
    pub status: u16,
    /// Bytes from the client to the upstream (request body or tunnel).
    pub up: u64,
    /// Bytes from the upstream to the client (response body or tunnel).
    pub down: u64,
    pub start: Instant,
    pub upstream: Option<SocketAddr>,
    /// Why the exchange failed, when it did.
    pub error: Option<&'a dyn fmt::Display>,
    /// The authenticated user (never a password).
    pub user: Option<&'a str>,
    /// The client's TLS session, on TLS ports.
    pub tls: Option<&'a crate::tls::Session>,
    /// The route and the parent proxies taken, when a route sent the request through
    /// parents.
    pub via: Option<&'a Via>,
}

/// A route through parent proxies, as the log names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Via {
    pub route: Box<str>,
    /// The parents taken, in order, comma-separated.
    pub parents: Box<str>,
}

pub struct AccessLog {
    sink: RefCell<Sink>,
    format: std::cell::Cell<LogFormat>,
    /// The sink is not `Off` (read per exchange without touching the `RefCell`).
    on: std::cell::Cell<bool>,
    buf: RefCell<Vec<u8>>,
    /// The formatted current second, recomputed only when the second changes.
    clock: RefCell<(u64, String)>,
}

impl AccessLog {
    pub fn new(sink: Sink, format: LogFormat) -> Self {
        AccessLog {
            on: std::cell::Cell::new(!matches!(sink, Sink::Off)),
            sink: RefCell::new(sink),
            format: std::cell::Cell::new(format),
            buf: RefCell::new(Vec::with_capacity(FLUSH_AT + 1024)),
            clock: RefCell::new((0, String::new())),
        }
    }

    pub fn enabled(&self) -> bool {
        self.on.get()
    }

    /// Where lines go and how they look from now on (a reload): what is buffered is
    /// written out first, where it was meant to go.
    pub fn reconfigure(&self, sink: Sink, format: LogFormat) {
        self.flush();
        self.on.set(!matches!(sink, Sink::Off));
        *self.sink.borrow_mut() = sink;
        self.format.set(format);
    }

    pub fn log(&self, e: &Entry<'_>) {
        if !self.enabled() {
            return;
        }
        let mut line = String::with_capacity(160);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        {
            let mut clock = self.clock.borrow_mut();
            if clock.0 != now.as_secs() || clock.1.is_empty() {
                *clock = (now.as_secs(), civil_time(now.as_secs()));
            }
            let _ = write!(line, "{}.{:03}Z", clock.1, now.subsec_millis());
        }
        let ms = e.start.elapsed().as_secs_f64() * 1000.0;
        let method = String::from_utf8_lossy(e.method);
        let target = String::from_utf8_lossy(e.target);
        // Writing to a String cannot fail.
        let _ = match self.format.get() {
            LogFormat::Plain => {
                let up = e.upstream.map(|a| a.to_string());
                write!(
                    line,
                    " {} {} {} {} {} {} {:.3}ms {}",
                    e.client,
                    method,
                    target,
                    e.status,
                    e.up,
                    e.down,
                    ms,
                    up.as_deref().unwrap_or("-"),
                )
                .and_then(|_| match e.user {
                    Some(u) => write!(line, " user={}", Escaped(u)),
                    None => Ok(()),
                })
                .and_then(|_| match e.tls {
                    Some(t) => write!(
                        line,
                        " tls={}/{} sni={}{}",
                        t.version,
                        t.cipher,
                        Escaped(t.sni.as_deref().unwrap_or("-")),
                        if t.resumed { " resumed" } else { "" }
                    ),
                    None => Ok(()),
                })
                .and_then(|_| match e.via {
                    Some(v) => {
                        write!(line, " route={} via={}", Escaped(&v.route), Escaped(&v.parents))
                    }
                    None => Ok(()),
                })
                .and_then(|_| match e.error {
                    Some(err) => write!(line, " \"{}\"", Escaped(&err.to_string())),
                    None => Ok(()),
                })
            }
            LogFormat::Json => {
                let time = std::mem::take(&mut line);
                write!(
                    line,
                    "{{\"time\":\"{}\",\"client\":\"{}\",\"method\":\"{}\",\"target\":\"{}\",\
                     \"status\":{},\"bytes_up\":{},\"bytes_down\":{},\"ms\":{:.3}",
                    time,
                    e.client,
                    Escaped(&method),
                    Escaped(&target),
                    e.status,
                    e.up,
                    e.down,
                    ms
                )
                .and_then(|_| match e.upstream {
                    Some(a) => write!(line, ",\"upstream\":\"{a}\""),
                    None => Ok(()),
                })
                .and_then(|_| match e.user {
                    Some(u) => write!(line, ",\"user\":\"{}\"", Escaped(u)),
                    None => Ok(()),
                })
                .and_then(|_| match e.tls {
                    Some(t) => write!(
                        line,
                        ",\"tls_version\":\"{}\",\"tls_cipher\":\"{}\",\"sni\":\"{}\",\
                         \"tls_resumed\":{}",
                        t.version,
                        t.cipher,
                        Escaped(t.sni.as_deref().unwrap_or("")),
                        t.resumed
                    ),
                    None => Ok(()),
                })
                .and_then(|_| match e.via {
                    Some(v) => write!(
                        line,
                        ",\"route\":\"{}\",\"via\":\"{}\"",
                        Escaped(&v.route),
                        Escaped(&v.parents)
                    ),
                    None => Ok(()),
                })
                .and_then(|_| match e.error {
                    Some(err) => write!(line, ",\"error\":\"{}\"", Escaped(&err.to_string())),
                    None => Ok(()),
                })
                .and_then(|_| line.write_char('}'))
            }
        };
        line.push('\n');
        let mut buf = self.buf.borrow_mut();
        buf.extend_from_slice(line.as_bytes());
        if buf.len() >= FLUSH_AT {
            self.sink.borrow().write(&buf);
            buf.clear();
        }
    }

    pub fn flush(&self) {
        let mut buf = self.buf.borrow_mut();
        if !buf.is_empty() {
            self.sink.borrow().write(&buf);
            buf.clear();
        }
    }
}

/// Escapes a string for a JSON string or a quoted plain-log field.
struct Escaped<'a>(&'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                c if (c as u32) < 0x20 => write!(f, "\\u{:04x}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// `YYYY-MM-DDTHH:MM:SS` in UTC for a Unix time (the days-to-civil algorithm of
/// Howard Hinnant's date library), so logging needs no date crate.
fn civil_time(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}", rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_time_matches_known_dates() {
        assert_eq!(civil_time(0), "1970-01-01T00:00:00");
        assert_eq!(civil_time(951_782_400), "2000-02-29T00:00:00");
        assert_eq!(civil_time(1_795_934_498), "2026-11-29T06:41:38");
    }

    #[test]
    fn escaping() {
        assert_eq!(Escaped("a\"b\\c\n").to_string(), "a\\\"b\\\\c\\u000a");
    }
}
