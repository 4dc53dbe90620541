//! The UDP modes: `udp-direct` (to a UDP echo), `udp-relay` (`--proxy` is
//! a UDP port relay to the echo) and `udp-socks5` (a SOCKS5 UDP ASSOCIATE
//! per lane, then datagrams with the SOCKS5 UDP header to the relay address
//! the proxy answered with).
//!
//! Each lane owns one connected UDP socket (plus, for SOCKS5, the TCP
//! control connection, kept open for the lane's life) and has one datagram
//! in flight: it sends `--size` bytes and waits for the echo, bounded by
//! `--timeout` (a timeout is one error). With `--rate` the sends follow the
//! same open-loop schedule as the TCP modes, latency from the scheduled time.
//!
//! Every datagram is stamped with its lane (4 bytes) and sequence number
//! (8 bytes), so that the late echo of a datagram that already timed out is
//! recognised and skipped rather than taken for the current one's answer.
//! Any other datagram that is not exactly what was sent counts as a
//! `parse` error ("wrong payload"), as does a bad SOCKS5 UDP header.

use std::cell::RefCell;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rustle_proto::addr::{Address, Host};
use rustle_proto::socks5;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::task::LocalSet;
use tokio::time::{sleep, sleep_until, timeout, Instant};

use super::stats::{ErrorKind, ThreadStats};
use super::{Mode, Options};
use crate::pattern;

/// Bytes of the stamp at the start of every payload: lane, then sequence.
pub(crate) const STAMP: usize = 12;
/// Largest payload accepted: a UDP datagram's 65507 bytes minus the
/// largest SOCKS5 UDP header.
pub(crate) const MAX_SIZE: usize = 65_507 - socks5::MAX_UDP_HEADER;
/// After a failed setup or a refused send, wait before trying again, so
/// that a dead peer costs errors at a bounded rate, not a spin.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// Where a lane sends its datagrams.
enum Hop {
    /// A connected socket to this address (the echo, or a UDP relay).
    Direct(SocketAddr),
    /// UDP ASSOCIATE on the proxy's TCP port, then datagrams for `target`.
    Socks5 { proxy: SocketAddr, target: SocketAddr },
}

struct Plan {
    hop: Hop,
    size: usize,
    timeout: Duration,
    rate: Option<f64>,
    connections: usize,
    t0: Instant,
    warm_end: Instant,
    end: Instant,
}

/// What [`run`] hands back to the report.
pub(crate) struct Outcome {
    pub(crate) threads: usize,
    pub(crate) stats: ThreadStats,
    /// The measured window: end of warmup to the last answer.
    pub(crate) elapsed: Duration,
}

/// Checks the options that matter to the UDP modes.
pub(crate) fn validate(o: &Options) -> Result<()> {
    if o.hold.is_some() || o.active.is_some() || o.close || o.upload > 0 {
        bail!("--hold, --active, --close and --upload do not apply to the UDP modes");
    }
    if !(STAMP..=MAX_SIZE).contains(&o.size) {
        bail!("--size must be between {STAMP} and {MAX_SIZE} in the UDP modes");
    }
    Ok(())
}

fn resolve(s: &str) -> Result<SocketAddr> {
    s.to_socket_addrs()
        .with_context(|| format!("cannot resolve {s:?}"))?
        .next()
        .with_context(|| format!("{s:?} resolves to nothing"))
}

/// Runs a UDP load on `o.threads` threads.
pub(crate) fn run(o: &Options) -> Result<Outcome> {
    let proxy =
        || o.proxy.as_deref().with_context(|| format!("--mode {} needs --proxy", o.mode.name()));
    let hop = match o.mode {
        Mode::UdpDirect => Hop::Direct(resolve(&o.target)?),
        Mode::UdpRelay => Hop::Direct(resolve(proxy()?)?),
        Mode::UdpSocks5 => Hop::Socks5 { proxy: resolve(proxy()?)?, target: resolve(&o.target)? },
        m => bail!("--mode {} is not a UDP mode", m.name()),
    };
    let lanes = o.connections;
    let threads = o.threads.min(lanes);
    let now = Instant::now();
    let plan = Arc::new(Plan {
        hop,
        size: o.size,
        timeout: o.timeout,
        rate: o.rate,
        connections: lanes,
        t0: now,
        warm_end: now + o.warmup,
        end: now + o.warmup + o.duration,
    });
    let mut handles = Vec::with_capacity(threads);
    for t in 0..threads {
        let plan = Arc::clone(&plan);
        let mine: Vec<usize> = (t..lanes).step_by(threads).collect();
        let h = std::thread::Builder::new()
            .name(format!("rustle-load-udp-{t}"))
            .spawn(move || run_thread(plan, mine))
            .context("spawning a worker thread")?;
        handles.push(h);
    }
    let mut total = ThreadStats::default();
    let mut finished = plan.warm_end;
    for h in handles {
        let Ok(result) = h.join() else { bail!("a worker thread panicked") };
        let (s, end) = result.context("starting a worker runtime")?;
        total.merge(&s);
        finished = finished.max(end);
    }
    Ok(Outcome { threads, stats: total, elapsed: finished - plan.warm_end })
}

fn run_thread(plan: Arc<Plan>, lanes: Vec<usize>) -> io::Result<(ThreadStats, Instant)> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let stats = Rc::new(RefCell::new(ThreadStats::default()));
    let local = LocalSet::new();
    local.block_on(&rt, async {
        let mut tasks = Vec::with_capacity(lanes.len());
        for index in lanes {
            let plan = Arc::clone(&plan);
            let stats = Rc::clone(&stats);
            tasks.push(tokio::task::spawn_local(async move { lane(&plan, index, &stats).await }));
        }
        for t in tasks {
            // A panicking lane loses only its own numbers; the run goes on.
            let _ = t.await;
        }
    });
    let finished = Instant::now();
    let stats = std::mem::take(&mut *stats.borrow_mut());
    Ok((stats, finished))
}

/// A lane's datagram path.
struct Session {
    udp: UdpSocket,
    /// SOCKS5 only: the association lives as long as this connection.
    _control: Option<TcpStream>,
    /// SOCKS5 only: the UDP header for the target (empty otherwise).
    header: Vec<u8>,
    /// SOCKS5 only: the source every answer's header must name.
    target: Option<SocketAddr>,
}

async fn lane(plan: &Plan, index: usize, stats: &RefCell<ThreadStats>) {
    let mut session = loop {
        if Instant::now() >= plan.end {
            return;
        }
        match timeout(plan.timeout, open(plan)).await {
            Ok(Ok(s)) => break s,
            Ok(Err(kind)) => stats.borrow_mut().errors.add(kind),
            Err(_) => stats.borrow_mut().errors.add(ErrorKind::Timeout),
        }
        sleep(ERROR_BACKOFF).await;
    };
    let head = session.header.len();
    let mut out = std::mem::take(&mut session.header);
    out.extend_from_slice(&pattern::pattern(plan.size));
    // Lane numbers are far below 2^32; truncation would only weaken the
    // stale-echo check, never miscount.
    out[head..head + 4].copy_from_slice(&(index as u32).to_le_bytes());
    let mut buf = vec![0u8; 65_536];
    let mut k: u64 = 0;
    let mut seq: u64 = 0;
    loop {
        let start = match plan.rate {
            // Datagram k of lane j is due at (j + k * C) / R.
            Some(rate) => {
                let at = (index as f64 + k as f64 * plan.connections as f64) / rate;
                k += 1;
                plan.t0 + Duration::from_secs_f64(at)
            }
            None => Instant::now(),
        };
        if start >= plan.end {
            return;
        }
        if plan.rate.is_some() {
            sleep_until(start).await;
        }
        seq += 1;
        out[head + 4..head + STAMP].copy_from_slice(&seq.to_le_bytes());
        let result = timeout(plan.timeout, exchange(&session, &out, head, &mut buf)).await;
        let done = Instant::now();
        let kind = match result {
            Ok(Ok(bytes)) => {
                if start >= plan.warm_end {
                    stats.borrow_mut().record(done - start, bytes);
                }
                continue;
            }
            Ok(Err(kind)) => kind,
            Err(_) => ErrorKind::Timeout,
        };
        stats.borrow_mut().errors.add(kind);
        if matches!(kind, ErrorKind::Read | ErrorKind::Write) {
            sleep(ERROR_BACKOFF).await;
        }
    }
}

/// Sends `out` (header + payload) and waits for the payload's echo;
/// returns the payload bytes received.
async fn exchange(s: &Session, out: &[u8], head: usize, buf: &mut [u8]) -> Result<u64, ErrorKind> {
    s.udp.send(out).await.map_err(|_| ErrorKind::Write)?;
    let want = &out[head..];
    let seq = seq_of(want);
    loop {
        let n = s.udp.recv(buf).await.map_err(|_| ErrorKind::Read)?;
        let got = match &s.target {
            Some(target) => {
                let Ok((h, data)) = socks5::parse_udp(&buf[..n]) else {
                    return Err(ErrorKind::Parse);
                };
                if h.frag != 0 || !same_source(&h.dst, target) {
                    return Err(ErrorKind::Parse);
                }
                &buf[data..n]
            }
            None => &buf[..n],
        };
        if got == want {
            return Ok(got.len() as u64);
        }
        // The late echo of an earlier datagram of this lane: skip it.
        if got.len() == want.len() && got[..4] == want[..4] && seq_of(got) < seq {
            continue;
        }
        return Err(ErrorKind::Parse);
    }
}

/// Whether a SOCKS5 header's address is `target` (an IPv4-mapped IPv6
/// address, as a dual-stack relay may write it, counts as the IPv4 one).
fn same_source(a: &Address, target: &SocketAddr) -> bool {
    match &a.host {
        Host::Ip(ip) => a.port == target.port() && ip.to_canonical() == target.ip().to_canonical(),
        Host::Domain(_) => false,
    }
}

fn seq_of(payload: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&payload[4..STAMP]);
    u64::from_le_bytes(b)
}

async fn open(plan: &Plan) -> Result<Session, ErrorKind> {
    match plan.hop {
        Hop::Direct(addr) => {
            let udp = bind_for(addr).await?;
            udp.connect(addr).await.map_err(|_| ErrorKind::Connect)?;
            Ok(Session { udp, _control: None, header: Vec::new(), target: None })
        }
        Hop::Socks5 { proxy, target } => associate(proxy, target).await,
    }
}

async fn bind_for(peer: SocketAddr) -> Result<UdpSocket, ErrorKind> {
    let any = match peer {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    UdpSocket::bind((any, 0)).await.map_err(|_| ErrorKind::Connect)
}

/// RFC 1928 no-auth greeting, then UDP ASSOCIATE naming the lane's UDP
/// socket (bound to the address the control connection uses), then a
/// socket connected to the relay address of the reply.
async fn associate(proxy: SocketAddr, target: SocketAddr) -> Result<Session, ErrorKind> {
    let mut tcp = TcpStream::connect(proxy).await.map_err(|_| ErrorKind::Connect)?;
    tcp.set_nodelay(true).map_err(|_| ErrorKind::Connect)?;
    let local = tcp.local_addr().map_err(|_| ErrorKind::Connect)?;
    let udp = UdpSocket::bind((local.ip(), 0)).await.map_err(|_| ErrorKind::Connect)?;
    let udp_local = udp.local_addr().map_err(|_| ErrorKind::Connect)?;

    tcp.write_all(&[socks5::VERSION, 1, socks5::method::NO_AUTH])
        .await
        .map_err(|_| ErrorKind::Write)?;
    let mut sel = [0u8; 2];
    read(&mut tcp, &mut sel).await?;
    match sel {
        [5, 0] => {}
        [5, _] => return Err(ErrorKind::ProxyRefused),
        _ => return Err(ErrorKind::Parse),
    }
    // VER CMD RSV, then ATYP ADDR PORT: the tail of a UDP header has the
    // same layout, so the proto crate writes it.
    let mut req = vec![socks5::VERSION, 3, 0];
    let mut addr = Vec::with_capacity(socks5::MAX_UDP_HEADER);
    socks5::write_udp_header(udp_local, &mut addr);
    req.extend_from_slice(&addr[3..]);
    tcp.write_all(&req).await.map_err(|_| ErrorKind::Write)?;

    let mut rep = [0u8; 4];
    read(&mut tcp, &mut rep).await?;
    if rep[0] != 5 {
        return Err(ErrorKind::Parse);
    }
    if rep[1] != 0 {
        return Err(ErrorKind::ProxyRefused);
    }
    let ip = match rep[3] {
        1 => {
            let mut a = [0u8; 4];
            read(&mut tcp, &mut a).await?;
            IpAddr::from(a)
        }
        4 => {
            let mut a = [0u8; 16];
            read(&mut tcp, &mut a).await?;
            IpAddr::from(a)
        }
        // A relay named by domain: not something a benchmark peer does.
        _ => return Err(ErrorKind::Parse),
    };
    let mut port = [0u8; 2];
    read(&mut tcp, &mut port).await?;
    // An unspecified relay address means "the address you reached me at".
    let ip = if ip.is_unspecified() { proxy.ip() } else { ip };
    let relay = SocketAddr::new(ip, u16::from_be_bytes(port));
    udp.connect(relay).await.map_err(|_| ErrorKind::Connect)?;

    let mut header = Vec::with_capacity(socks5::MAX_UDP_HEADER);
    socks5::write_udp_header(target, &mut header);
    Ok(Session { udp, _control: Some(tcp), header, target: Some(target) })
}

async fn read(s: &mut TcpStream, buf: &mut [u8]) -> Result<(), ErrorKind> {
    match s.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(ErrorKind::ClosedEarly),
        Err(_) => Err(ErrorKind::Read),
    }
}
