//! Zero-downtime upgrade. A running rustle listens on a control socket (a Unix socket,
//! `[process] control_socket`); `rustle --takeover` connects to it and receives the
//! listening sockets themselves (SCM_RIGHTS: the same sockets, with the connections
//! queued in them, not new ones bound to the same ports), starts serving on them, then
//! tells the old process to drain: it stops accepting, finishes its connections within
//! `timeouts.shutdown`, and exits. No connection is refused in between: at every moment
//! some process accepts on every socket. Listeners the new configuration adds are bound
//! fresh; the sockets of those it drops close when the old process stops accepting. The
//! admin endpoint's socket goes over too (the new process serves it when its `[admin]
//! listen` is the same), so that `/metrics` and the probes keep their port.
//! Also here: the sockets systemd passes with socket activation (`LISTEN_FDS`).
//!
//! The exchange, one line each way, descriptors attached to `listener` lines:
//! ```text
//! new: takeover 1
//! old: rustle PID
//! old: listener tcp|udp CONFIGURED-ADDRESS RANK BOUND-ADDRESS COUNT   (COUNT descriptors)
//! old: ...
//! old: admin CONFIGURED-ADDRESS BOUND-ADDRESS                         (one descriptor)
//! old: end
//! new: drain
//! old: draining
//! ```

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;

use crate::config::ListenerKey;
use crate::run::server::{Group, Inherited, Running, Socket};

/// How long either side waits for the other's next line.
const PATIENCE: Duration = Duration::from_secs(10);

/// How long the running process waits for a control connection's first line: the main
/// thread waits meanwhile (signals too), and every client sends it at once.
const FIRST_LINE: Duration = Duration::from_secs(1);

/// The protocol's version, in the first line.
const VERSION: u32 = 1;

/// The running process's end: the control socket, removed when the process ends if it
/// is still the one at its path (a process that took over put its own there).
pub(crate) struct Control {
    listener: tokio::net::UnixListener,
    path: PathBuf,
    /// Device and inode of the socket file bound here.
    id: (u64, u64),
}

fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl Control {
    /// Binds the control socket at `path` (its directory created if missing), readable
    /// and writable by this user only. `replace`: a process taking over puts its socket
    /// in place of the old one's. Otherwise a socket file a live process answers on is
    /// left alone (another rustle: this one then has no control socket, and says so); a
    /// stale one is replaced. Must be called inside the runtime.
    pub(crate) fn bind(path: &Path, replace: bool) -> Option<Control> {
        let bound = (|| -> std::io::Result<Option<Control>> {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            if path.exists() {
                if !replace && UnixStream::connect(path).is_ok() {
                    return Ok(None);
                }
                std::fs::remove_file(path)?;
            }
            let listener = tokio::net::UnixListener::bind(path)?;
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            let id = file_id(path).unwrap_or_default();
            Ok(Some(Control { listener, path: path.to_owned(), id }))
        })();
        match bound {
            Ok(Some(c)) => {
                tracing::info!("control socket {} (for rustle --takeover)", path.display());
                Some(c)
            }
            Ok(None) => {
                tracing::warn!(
                    "control socket {}: another rustle answers there; this one has none \
                     (give each instance its own [process] control_socket to take it over \
                     later)",
                    path.display()
                );
                None
            }
            Err(e) => {
                tracing::warn!(
                    "cannot bind the control socket {}: {e}; rustle --takeover cannot \
                     replace this process",
                    path.display()
                );
                None
            }
        }
    }

    /// The next connection, as a blocking stream with timeouts. Failures (out of
    /// descriptors, say) pause accepting for a second; the first of a run is logged.
    pub(crate) async fn accept(&self) -> UnixStream {
        let mut failing = false;
        loop {
            let accepted = self.listener.accept().await.and_then(|(s, _)| {
                let s = s.into_std()?;
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(FIRST_LINE))?;
                s.set_write_timeout(Some(PATIENCE))?;
                Ok(s)
            });
            match accepted {
                Ok(s) => return s,
                Err(e) => {
                    if !failing {
                        tracing::warn!("control socket {}: {e}; pausing", self.path.display());
                        failing = true;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        if file_id(&self.path) == Some(self.id) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Answers one connection on the control socket (the main thread waits for it: the
/// exchange is short and bounded by `PATIENCE`). Returns true when a new process took
/// the listeners over and asked this one to drain. Any other request (its first line) goes
/// to `other` (`control::answer`).
pub(crate) fn serve(
    running: &Running,
    conn: UnixStream,
    other: &mut dyn FnMut(&str, &UnixStream),
) -> bool {
    match hand_over(running, conn, other) {
        Ok(Some(pid)) => {
            tracing::info!(
                "takeover: the listening sockets are served by the new process{pid}; \
                 this one stops accepting and drains its connections"
            );
            true
        }
        Ok(None) => false,
        Err(e) => {
            tracing::warn!("takeover: {e:#}; this process goes on serving");
            false
        }
    }
}

fn hand_over(
    running: &Running,
    conn: UnixStream,
    other: &mut dyn FnMut(&str, &UnixStream),
) -> anyhow::Result<Option<String>> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        // A probe (another rustle checking whether this socket is alive).
        return Ok(None);
    }
    conn.set_read_timeout(Some(PATIENCE))?;
    if !line.starts_with("takeover") {
        other(line.trim(), &conn);
        return Ok(None);
    }
    let version = line.trim().strip_prefix("takeover ").and_then(|v| v.parse::<u32>().ok());
    if version != Some(VERSION) {
        anyhow::bail!("unknown request {:?} on the control socket", line.trim());
    }
    // The new process's pid, for the log (a Unix socket tells it).
    let pid = peer_pid(&conn).map(|p| format!(" (pid {p})")).unwrap_or_default();
    tracing::info!("takeover: a new process{pid} asks for the listening sockets");
    (&conn).write_all(format!("rustle {}\n", std::process::id()).as_bytes())?;
    // Quota usage written before the new process starts and reads it; from here the new
    // process keeps it.
    running.quotas().hand_over();
    running.with_sockets(|bound| -> anyhow::Result<()> {
        for b in bound {
            let l = &b.listener;
            let transport = if l.key.udp { "udp" } else { "tcp" };
            for chunk in b.sockets.chunks(crate::io::sys::MAX_FDS_PER_MESSAGE) {
                let text = format!(
                    "listener {transport} {} {} {} {}\n",
                    l.key.listen,
                    l.key.rank,
                    l.listen,
                    chunk.len()
                );
                let fds: Vec<_> = chunk.iter().map(Socket::fd).collect();
                crate::io::sys::send_fds(&conn, text.as_bytes(), &fds)?;
            }
        }
        Ok(())
    })?;
    if let Some((configured, fd)) = running.admin_socket() {
        let bound = running.admin_addr().unwrap_or(configured);
        let text = format!("admin {configured} {bound}\n");
        crate::io::sys::send_fds(&conn, text.as_bytes(), &[fd])?;
    }
    (&conn).write_all(b"end\n")?;
    line.clear();
    // The new process binds its other listeners and starts its workers meanwhile.
    reader.get_ref().set_read_timeout(Some(PATIENCE * 3))?;
    let n = reader.read_line(&mut line).context("waiting for the new process to start")?;
    if n == 0 || line.trim() != "drain" {
        anyhow::bail!("the new process did not start (it closed the control connection)");
    }
    (&conn).write_all(b"draining\n")?;
    Ok(Some(pid))
}

fn peer_pid(conn: &UnixStream) -> Option<i32> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    getsockopt(conn, PeerCredentials).ok().map(|c| c.pid())
}

/// The new process's end of a takeover once it has the sockets: `release` tells the old
/// process to drain. Dropping it without that leaves the old one serving.
pub(crate) struct Handover {
    conn: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Handover {
    /// Tells the old process to stop accepting and drain, and waits for it to agree.
    pub(crate) fn release(mut self) -> std::io::Result<()> {
        (&self.conn).write_all(b"drain\n")?;
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        match line.trim() {
            "draining" => {
                tracing::info!("takeover: the old process drains and exits");
                Ok(())
            }
            other => Err(std::io::Error::other(format!("it answered {other:?}"))),
        }
    }
}

/// Connects to the rustle answering on the control socket at `path` and receives its
/// listening sockets, each group under the key and address of its listener there.
pub(crate) fn take_over(path: &Path) -> anyhow::Result<(Inherited, Handover)> {
    let conn = UnixStream::connect(path).with_context(|| {
        format!("--takeover: no rustle answers on the control socket {}", path.display())
    })?;
    conn.set_read_timeout(Some(PATIENCE))?;
    conn.set_write_timeout(Some(PATIENCE))?;
    (&conn).write_all(format!("takeover {VERSION}\n").as_bytes())?;
    let received = receive(&conn).with_context(|| {
        format!("--takeover: receiving the listening sockets on {}", path.display())
    })?;
    let mut inherited = Inherited::default();
    let mut count = 0;
    for (key, addr, fds) in received {
        let Some(key) = key else {
            // The admin endpoint's socket, under its configured address.
            let Some(fd) = fds.into_iter().next() else { continue };
            match Socket::from_fd(fd).with_context(|| format!("the admin socket {addr}"))? {
                Socket::Tcp(s) => inherited.admin = Some((addr, s)),
                Socket::Udp(_) => anyhow::bail!("the admin socket {addr} is a UDP socket"),
            }
            continue;
        };
        let mut sockets = Vec::with_capacity(fds.len());
        for fd in fds {
            sockets.push(Socket::from_fd(fd).with_context(|| format!("a socket of {addr}"))?);
        }
        count += sockets.len();
        match inherited.groups.iter_mut().find(|g| g.key == Some(key)) {
            Some(g) => g.sockets.extend(sockets),
            None => inherited.groups.push(Group { key: Some(key), addr, udp: key.udp, sockets }),
        }
    }
    tracing::info!(
        "--takeover: received {count} socket(s) of {} listener(s) from the running rustle",
        inherited.groups.len()
    );
    let reader = BufReader::new(conn.try_clone()?);
    Ok((inherited, Handover { conn, reader }))
}

/// One listener's part of the exchange: its key there, its bound address, descriptors;
/// or the admin socket's (no key, the configured address, one descriptor).
type Received = (Option<ListenerKey>, SocketAddr, Vec<OwnedFd>);

/// Reads the old process's lines up to `end`, with the descriptors that came with them
/// (in order: each `listener` line takes the next COUNT of them). The reading is by hand
/// rather than through a buffered reader, since descriptors come with the bytes read.
fn receive(conn: &UnixStream) -> anyhow::Result<Vec<Received>> {
    let mut text = Vec::new();
    let mut fds: VecDeque<OwnedFd> = VecDeque::new();
    let mut out = Vec::new();
    let mut greeted = false;
    let mut buf = [0u8; 4096];
    loop {
        let (n, got) = crate::io::sys::recv_fds(conn, &mut buf)?;
        if n == 0 {
            anyhow::bail!("the running rustle closed the connection");
        }
        text.extend_from_slice(&buf[..n]);
        fds.extend(got);
        while let Some(end) = text.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = text.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line).trim().to_string();
            if !greeted {
                let pid = line.strip_prefix("rustle ").ok_or_else(|| {
                    anyhow::anyhow!("the control socket's answer {line:?} is not rustle's")
                })?;
                tracing::info!("--takeover: taking the listeners over from pid {pid}");
                greeted = true;
                continue;
            }
            if line == "end" {
                return Ok(out);
            }
            let bad = || anyhow::anyhow!("unexpected line {line:?}");
            let f: Vec<&str> = line.split(' ').collect();
            if let ["admin", configured, _bound] = f[..] {
                let configured: SocketAddr = configured.parse().map_err(|_| bad())?;
                let Some(fd) = fds.pop_front() else {
                    anyhow::bail!("no descriptor came with the admin socket");
                };
                out.push((None, configured, vec![fd]));
                continue;
            }
            let ["listener", transport, listen, rank, addr, count] = f[..] else {
                return Err(bad());
            };
            let key = ListenerKey {
                listen: listen.parse().map_err(|_| bad())?,
                udp: transport == "udp",
                rank: rank.parse().map_err(|_| bad())?,
            };
            let addr: SocketAddr = addr.parse().map_err(|_| bad())?;
            let count: usize = count.parse().map_err(|_| bad())?;
            if fds.len() < count {
                anyhow::bail!("{count} descriptor(s) announced for {addr}, {} came", fds.len());
            }
            out.push((Some(key), addr, fds.drain(..count).collect()));
        }
    }
}

/// The sockets systemd passed (socket activation), grouped by address; none without it.
pub(crate) fn activation_sockets() -> anyhow::Result<Inherited> {
    let passed = crate::io::sys::listen_fds().context("socket activation (LISTEN_FDS)")?;
    if passed.is_empty() {
        return Ok(Inherited::default());
    }
    let mut sockets = Vec::new();
    for (fd, name) in passed {
        let s = Socket::from_fd(fd).context("socket activation (LISTEN_FDS)")?;
        let what = if s.is_udp() { "udp" } else { "tcp" };
        let addr = s.local_addr()?;
        match name {
            Some(name) => tracing::info!("socket activation: {addr} ({what}), named {name}"),
            None => tracing::info!("socket activation: {addr} ({what})"),
        }
        sockets.push(s);
    }
    Ok(Inherited::from_sockets(sockets)?)
}
