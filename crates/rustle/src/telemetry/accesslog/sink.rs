//! Where the lines of all workers go: a standard stream, a file (reopened on SIGUSR1),
//! syslog (RFC 3164 or RFC 5424 over the local datagram socket or UDP) or the journal
//! (its native protocol). A line is framed for its sink as it is formatted, into the
//! worker's buffer; the buffer goes out on the housekeeping tick or when it fills: one
//! write for a stream or file (which takes the file's lock), one datagram per line for
//! syslog and the journal (datagram sends need no lock).

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Write};
use std::net::UdpSocket;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::format::{Esc, Escaped, Text};
use super::{Now, Record};
use crate::config::{Log, LogTarget, SyslogAddr, SyslogFormat};

/// A flush waits at most this long for a full syslog or journal socket, then drops what
/// is left of its buffer (with a warning), so that a stalled log daemon cannot stall a
/// worker for long.
const SEND_TIMEOUT: Duration = Duration::from_millis(500);

/// Severity of access-log messages: informational.
const SEVERITY: u8 = 6;

#[derive(Clone)]
pub(crate) enum Sink {
    Stdout,
    Stderr,
    File(Arc<LogFile>),
    Syslog(Arc<Syslog>),
    Journald(Arc<Journal>),
    Off,
}

/// An access-log file shared by the workers, and the path it was opened at.
pub(crate) struct LogFile {
    path: PathBuf,
    file: Mutex<File>,
}

/// A syslog destination and what each message's header says.
pub(crate) struct Syslog {
    socket: Datagram,
    format: SyslogFormat,
    /// `<PRI>`, the facility and severity.
    pri: String,
    /// Messages over the network name this host (the local daemon knows it).
    host: Option<String>,
    tag: String,
    pid: u32,
}

/// The journal's socket, and the SYSLOG_IDENTIFIER of every entry.
pub(crate) struct Journal {
    socket: Datagram,
    tag: String,
}

/// A connected datagram socket; a local one is connected again after a failed send (the
/// daemon restarted and made its socket anew).
enum Datagram {
    Unix { socket: UnixDatagram, path: PathBuf },
    Udp(UdpSocket),
}

impl Datagram {
    fn unix(path: &Path) -> io::Result<Datagram> {
        let socket = UnixDatagram::unbound()?;
        socket.connect(path).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot connect to {}: {e}", path.display()))
        })?;
        socket.set_write_timeout(Some(SEND_TIMEOUT))?;
        Ok(Datagram::Unix { socket, path: path.to_owned() })
    }

    fn udp(addr: std::net::SocketAddr) -> io::Result<Datagram> {
        let any: std::net::SocketAddr = match addr {
            std::net::SocketAddr::V4(_) => ([0, 0, 0, 0], 0).into(),
            std::net::SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let socket = UdpSocket::bind(any)?;
        socket
            .connect(addr)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot send to {addr}: {e}")))?;
        socket.set_write_timeout(Some(SEND_TIMEOUT))?;
        Ok(Datagram::Udp(socket))
    }

    /// Sends each message of `bytes` (ending at `ends`).
    fn send_all(&self, bytes: &[u8], ends: &[usize]) -> io::Result<()> {
        let mut from = 0;
        for &end in ends {
            let msg = &bytes[from..end];
            from = end;
            let sent = match self {
                Datagram::Unix { socket, path } => socket.send(msg).or_else(|e| {
                    // Timed out: the daemon is not reading; anything else: try its socket
                    // again, once.
                    if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut
                    {
                        return Err(e);
                    }
                    socket.connect(path)?;
                    socket.send(msg)
                }),
                Datagram::Udp(socket) => match socket.send(msg) {
                    // An ICMP unreachable from an earlier datagram: nobody listened then.
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => socket.send(msg),
                    r => r,
                },
            };
            sent?;
        }
        Ok(())
    }
}

/// Permissions of an access-log file rustle creates: the owner writes, its group (the
/// log readers' group, `adm` on Debian) reads, others nothing: client addresses, user
/// names and targets are personal data. The process's umask can only take more away.
const LOG_MODE: u32 = 0o640;

/// Opens (or creates, mode [`LOG_MODE`]) the file for appending; the error names it:
/// `cannot open the access log /x/y.log: No such file or directory`.
fn open_append(path: &Path, what: &str) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let opened = std::fs::OpenOptions::new().create(true).append(true).mode(LOG_MODE).open(path);
    opened.map_err(|e| {
        io::Error::new(e.kind(), format!("cannot {what} the access log {}: {e}", path.display()))
    })
}

/// A syslog or journal socket's error (it names the socket) as the access log's.
fn socket_error(e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("cannot open the access log: {e}"))
}

/// The host name for syslog headers (RFC 5424 and network RFC 3164 messages).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic()))
        .unwrap_or_else(|| "-".into())
}

/// A syslog tag or journal identifier: printable ASCII without spaces (RFC 5424's
/// APP-NAME), at most 48 characters.
fn clean_tag(tag: &str) -> String {
    let t: String = tag.chars().filter(|c| c.is_ascii_graphic()).take(48).collect();
    if t.is_empty() {
        "rustle".into()
    } else {
        t
    }
}

impl Sink {
    pub(crate) fn open(log: &Log) -> io::Result<Sink> {
        Ok(match &log.access {
            LogTarget::Stdout => Sink::Stdout,
            LogTarget::Stderr => Sink::Stderr,
            LogTarget::Off => Sink::Off,
            LogTarget::File(path) => {
                let file = Mutex::new(open_append(path, "open")?);
                Sink::File(Arc::new(LogFile { path: path.clone(), file }))
            }
            LogTarget::Syslog(addr) => {
                let (socket, remote) = match addr {
                    SyslogAddr::Unix(path) => (Datagram::unix(path).map_err(socket_error)?, false),
                    SyslogAddr::Udp(a) => (Datagram::udp(*a).map_err(socket_error)?, true),
                };
                let format = log.syslog_format;
                let host = (remote || format == SyslogFormat::Rfc5424).then(host_name);
                Sink::Syslog(Arc::new(Syslog {
                    socket,
                    format,
                    pri: format!(
                        "<{}>",
                        u32::from(log.syslog_facility.0) * 8 + u32::from(SEVERITY)
                    ),
                    host,
                    tag: clean_tag(&log.tag),
                    pid: std::process::id(),
                }))
            }
            LogTarget::Journald(path) => Sink::Journald(Arc::new(Journal {
                socket: Datagram::unix(path).map_err(socket_error)?,
                tag: clean_tag(&log.tag),
            })),
        })
    }

    /// Opens the file again at its path (SIGUSR1, once logrotate has renamed it): every
    /// worker's next flush, which takes the lock anyway, goes to the new file, lines it
    /// buffered before included. The path reopened, or None when lines go to no file.
    pub(crate) fn reopen(&self) -> io::Result<Option<&Path>> {
        let Sink::File(log) = self else {
            return Ok(None);
        };
        // Opened before taking the lock: a slow file system does not stall the flushes.
        let fresh = open_append(&log.path, "reopen")?;
        let mut file = log.file.lock().unwrap_or_else(|p| p.into_inner());
        *file = fresh;
        Ok(Some(&log.path))
    }

    /// Whether each line is a message of its own (`ends` says where each ends).
    pub(super) fn is_datagram(&self) -> bool {
        matches!(self, Sink::Syslog(_) | Sink::Journald(_))
    }

    /// What goes before a line: a syslog header, the journal's MESSAGE field.
    pub(super) fn open_message(&self, buf: &mut Vec<u8>, now: &Now<'_>) {
        let out = &mut super::format::Out(buf);
        // Writing to a Vec cannot fail.
        let _ = match self {
            Sink::Syslog(s) => match s.format {
                // <PRI>Mmm dd HH:MM:SS [HOST ]TAG[PID]: (as glibc's syslog() writes it)
                SyslogFormat::Rfc3164 => {
                    let host = s.host.as_deref().unwrap_or("");
                    let sep = if host.is_empty() { "" } else { " " };
                    write!(out, "{}{} {host}{sep}{}[{}]: ", s.pri, now.clock.bsd, s.tag, s.pid)
                }
                // <PRI>1 TIMESTAMP HOST APP-NAME PROCID MSGID STRUCTURED-DATA MSG
                SyslogFormat::Rfc5424 => write!(
                    out,
                    "{}1 {}.{:03}Z {} {} {} access - ",
                    s.pri,
                    now.clock.iso,
                    now.millis,
                    s.host.as_deref().unwrap_or("-"),
                    s.tag,
                    s.pid
                ),
            },
            Sink::Journald(_) => out.write_str("MESSAGE="),
            Sink::Stdout | Sink::Stderr | Sink::File(_) | Sink::Off => Ok(()),
        };
    }

    /// What goes after a line: its newline, or the journal's other fields.
    pub(super) fn close_message(&self, buf: &mut Vec<u8>, e: &Record<'_>) {
        match self {
            Sink::Syslog(_) => {}
            Sink::Journald(j) => {
                let out = &mut super::format::Out(buf);
                let _ = journal_fields(out, &j.tag, e);
            }
            Sink::Stdout | Sink::Stderr | Sink::File(_) | Sink::Off => buf.push(b'\n'),
        }
    }

    pub(super) fn write(&self, bytes: &[u8], ends: &[usize]) {
        let res = match self {
            Sink::Stdout => io::stdout().lock().write_all(bytes),
            Sink::Stderr => io::stderr().lock().write_all(bytes),
            Sink::File(log) => match log.file.lock() {
                Ok(mut f) => f.write_all(bytes),
                Err(poisoned) => poisoned.into_inner().write_all(bytes),
            },
            Sink::Syslog(s) => s.socket.send_all(bytes, ends),
            Sink::Journald(j) => j.socket.send_all(bytes, ends),
            Sink::Off => Ok(()),
        };
        if let Err(e) = res {
            tracing::warn!("access log write failed: {e}");
        }
    }
}

/// The journal entry's fields after MESSAGE (the native protocol: `KEY=value` lines; no
/// value here holds a newline, so none needs the binary form).
fn journal_fields(out: &mut super::format::Out<'_>, tag: &str, e: &Record<'_>) -> std::fmt::Result {
    write!(
        out,
        "\nPRIORITY={SEVERITY}\nSYSLOG_IDENTIFIER={tag}\nRUSTLE_CLIENT={}\nRUSTLE_PROTOCOL={}\n\
         RUSTLE_METHOD={}\nRUSTLE_TARGET={}\nRUSTLE_STATUS={}\nRUSTLE_BYTES_UP={}\n\
         RUSTLE_BYTES_DOWN={}\n",
        e.client,
        e.protocol_name(),
        Text(e.method(), Esc::Json),
        Text(e.target(), Esc::Json),
        e.status,
        e.up,
        e.down,
    )?;
    match &e.listener.name {
        Some(n) => writeln!(out, "RUSTLE_LISTENER={}", Escaped(n))?,
        None => writeln!(out, "RUSTLE_LISTENER={}", e.listener.listen)?,
    }
    if let Some(u) = e.user {
        writeln!(out, "RUSTLE_USER={}", Escaped(u))?;
    }
    if let Some(a) = e.upstream {
        writeln!(out, "RUSTLE_UPSTREAM={a}")?;
    }
    if let Some(err) = e.error {
        writeln!(out, "RUSTLE_ERROR={}", Escaped(&err.to_string()))?;
    }
    Ok(())
}
