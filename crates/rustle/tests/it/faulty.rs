//! Faulty peers (`rustle_bench::faulty`) on either side of every front end, as one table:
//! each (side, fault, protocol) pair runs against a spawned `rustle` with short timeouts,
//! and must end the affected exchange with its documented error while a healthy exchange
//! on other connections of the same worker completes byte for byte, no thread panics,
//! and the proxy's open files come back to where they were.
//!
//! Every fault's pairs run one after another on a proxy of their own (the descriptor
//! count is then the pair's alone); the faults run side by side. A failure names its
//! pair; all pairs run before the test fails, and the table of what each one saw is
//! printed (`--nocapture`).

use std::any::Any;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use http::Request;
use rustle_bench::faulty::{self, Fault, FaultyClient, FaultyOrigin, Speak, Trickle};
use rustle_bench::pattern::pattern;
use rustle_bench::{Origin, TcpEcho};

use crate::util::socks::*;
use crate::util::*;

/// The proxy's I/O timeout in these tests: a silent origin is given up after it.
const IO_TIMEOUT: Duration = Duration::from_millis(1500);
/// A tunnel with no byte either way for this long is closed.
const TUNNEL_IDLE: Duration = Duration::from_secs(2);
/// How long anything the proxy should end by itself may take (the longest timeout, the
/// 100 ms housekeeping tick, a loaded machine).
const SETTLE: Duration = Duration::from_secs(6);
/// A head split byte by byte: the pause between bytes (a 60-byte head takes 0.3 s of
/// the 2 s header timeout).
const SPLIT: Duration = Duration::from_millis(5);
/// A body dripped: one byte every 200 ms, well within the I/O timeout.
const DRIP: Duration = Duration::from_millis(200);
const DRIP_LEN: usize = 5;
/// A download larger than every socket buffer on the way, for a client that never reads.
const HUGE: usize = 64 << 20;

const FAULTS: [Fault; 7] = [
    Fault::ResetMidBody,
    Fault::ResetUnframed,
    Fault::CloseBeforeAnswer,
    Fault::SplitHead { pause: SPLIT },
    Fault::Drip { every: DRIP, len: DRIP_LEN },
    Fault::NeverRead,
    Fault::Overrun,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proto {
    Http1,
    Http2,
    Connect,
    Socks5,
    Relay,
}

const PROTOS: [Proto; 5] =
    [Proto::Http1, Proto::Http2, Proto::Connect, Proto::Socks5, Proto::Relay];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Origin,
    Client,
}

/// What one pair saw, for the table; `Err` is a failed expectation.
type Outcome = Result<String, String>;

/// A pair whose fault does not apply to the protocol.
const NA: &str = "n/a";

/// A spawned proxy (one worker) with HTTP (h2c too), SOCKS and relay listeners, a healthy
/// origin and an echo server beside whatever faulty peer the pair brings.
struct Rig {
    bin: RustleProcess,
    http: SocketAddr,
    socks: SocketAddr,
    relay: SocketAddr,
    origin: Origin,
    echo: TcpEcho,
    log: std::path::PathBuf,
    baseline: usize,
    _dir: TempDir,
}

impl Rig {
    /// Starts the proxy, its relay listener sending to `relay_to` (the healthy origin
    /// when `None`), runs a first healthy exchange and takes the descriptor baseline.
    fn start(relay_to: Option<SocketAddr>) -> Rig {
        let origin = Origin::start().unwrap();
        let echo = TcpEcho::start().unwrap();
        let dir = TempDir::new("faulty");
        let log = dir.file("access.log");
        let config = dir.file("rustle.toml");
        let target = relay_to.unwrap_or(origin.addr());
        // No idle origin connection is kept, so that every exchange's sockets are gone
        // when it is.
        let text = format!(
            r#"workers = 1
[[listener]]
kind = "http"
listen = "127.0.0.1:0"
h2c = true
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
[[listener]]
kind = "relay"
listen = "127.0.0.1:0"
target = "{target}"
[log]
access = "{log}"
[timeouts]
header = "2s"
io = "{io}ms"
tunnel_idle = "{idle}ms"
connect = "2s"
shutdown = "1s"
[upstream]
pool_max_idle_per_host = 0
"#,
            log = log.display(),
            io = IO_TIMEOUT.as_millis(),
            idle = TUNNEL_IDLE.as_millis(),
        );
        std::fs::write(&config, text).unwrap();
        let mut bin = RustleProcess::spawn(&["--config", config.to_str().unwrap()]);
        let (http, socks, relay) = (bin.next_listener(), bin.next_listener(), bin.next_listener());
        let mut rig = Rig { bin, http, socks, relay, origin, echo, log, baseline: 0, _dir: dir };
        rig.healthy().expect("a first healthy exchange");
        rig.baseline = rig.wait_for_fds(|_| true, Duration::ZERO).expect("descriptors");
        rig
    }

    /// The proxy's open descriptors other than pipes (a worker keeps up to 64 spare
    /// pipes for splice(2) once it has used them: a pool, not a leak).
    fn fds(&self) -> usize {
        let dir = format!("/proc/{}/fd", self.bin.child.id());
        std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| {
                        std::fs::read_link(e.path())
                            .is_ok_and(|t| !t.to_string_lossy().starts_with("pipe:"))
                    })
                    .count()
            })
            .unwrap_or(0)
    }

    /// Waits (up to `within`) for the count to satisfy `ok`; the last count seen.
    fn wait_for_fds(&self, ok: impl Fn(usize) -> bool, within: Duration) -> Result<usize, usize> {
        let mut n = 0;
        if wait_until(within, || {
            n = self.fds();
            ok(n)
        }) {
            Ok(n)
        } else {
            Err(n)
        }
    }

    /// The descriptors back at the baseline, and no panic on the proxy's stderr.
    fn clean(&self) -> Result<(), String> {
        let base = self.baseline;
        if let Err(n) = self.wait_for_fds(|n| n <= base, SETTLE) {
            return Err(format!("{n} descriptors open {SETTLE:?} after, {base} before"));
        }
        self.no_panic()
    }

    fn no_panic(&self) -> Result<(), String> {
        let err = self.bin.stderr();
        match err.contains("panicked") {
            true => Err(format!("the proxy panicked: {err}")),
            false => Ok(()),
        }
    }

    /// Other connections on the same worker see nothing: an HTTP/1 download and a SOCKS5
    /// echo, both byte for byte.
    fn healthy(&self) -> Result<(), String> {
        let n = 256 * 1024;
        let mut c = Conn::open(self.http);
        c.send(&get(&self.origin.url(&format!("/bytes/{n}"))));
        let r = c.read_response();
        if r.status != 200 || r.body != pattern(n) {
            return Err(format!("healthy download: {} with {} bytes", r.status, r.body.len()));
        }
        let mut s = connect5(self.socks, &Dst::Addr(self.echo.addr()));
        let msg = pattern(64 * 1024);
        s.write_all(&msg).map_err(|e| format!("healthy echo: {e}"))?;
        if read_exact_n(&mut s, msg.len()) != msg {
            return Err("healthy echo: other bytes came back".into());
        }
        Ok(())
    }

    /// The cause on the access-log line that contains every one of `needles` (waiting
    /// up to 2 s for it); `-` for a line without one.
    fn log_cause(&self, needles: &[&str]) -> Result<String, String> {
        let mut text = String::new();
        let mut cause = None;
        wait_until(Duration::from_secs(2), || {
            text = std::fs::read_to_string(&self.log).unwrap_or_default();
            cause = text
                .lines()
                .find(|l| needles.iter().all(|n| l.contains(n)))
                .map(|l| LogLine::parse(l).error);
            cause.is_some()
        });
        match cause {
            Some(cause) => Ok(if cause.is_empty() { "-".into() } else { cause }),
            None => Err(format!("no access-log line with {needles:?}:\n{text}")),
        }
    }

    /// Waits for the healthy origin to have no connection open (the proxy closed its
    /// side of every one).
    fn origin_idle(&self) -> Result<(), String> {
        if wait_until(SETTLE, || self.origin.open_connections() == 0) {
            return Ok(());
        }
        Err(format!(
            "{} origin connections still open {SETTLE:?} after",
            self.origin.open_connections()
        ))
    }
}

/// Runs `f`, turning a panic into an `Err` with its message.
fn caught(f: impl FnOnce() -> Outcome) -> Outcome {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p: Box<dyn Any + Send>| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".into());
        Err(msg)
    })
}

/// Runs every pair of `side`: one thread per fault, with its own proxy. Prints the table
/// and fails naming every pair that failed.
fn run_table(side: Side, case: fn(&Rig, &Peer, Fault, Proto) -> Option<Outcome>) {
    let threads: Vec<_> = FAULTS
        .into_iter()
        .map(|fault| {
            std::thread::spawn(move || {
                let peer = Peer::start(side, fault);
                let rig = Rig::start(peer.raw.as_ref().map(FaultyOrigin::addr));
                let mut rows = Vec::new();
                for proto in PROTOS {
                    let started = Instant::now();
                    let seen = caught(|| case(&rig, &peer, fault, proto).unwrap_or(Ok(NA.into())));
                    let seen = seen.and_then(|s| {
                        if s == NA {
                            return Ok(s);
                        }
                        rig.clean()?;
                        rig.healthy()?;
                        Ok(format!("{s} [{} ms]", started.elapsed().as_millis()))
                    });
                    rows.push((fault, proto, seen));
                }
                rows
            })
        })
        .collect();
    let rows: Vec<_> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let mut failed = Vec::new();
    for (fault, proto, seen) in &rows {
        match seen {
            Ok(s) => println!("| {side:?} | {} | {proto:?} | {s} |", fault.name()),
            Err(e) => {
                println!("| {side:?} | {} | {proto:?} | FAILED: {e} |", fault.name());
                failed.push(format!("({side:?} {}, {proto:?}): {e}", fault.name()));
            }
        }
    }
    assert!(failed.is_empty(), "{} pairs failed:\n{}", failed.len(), failed.join("\n"));
}

/// The faulty origins of one fault (HTTP and raw), or none for client faults.
struct Peer {
    http: Option<FaultyOrigin>,
    raw: Option<FaultyOrigin>,
}

impl Peer {
    fn start(side: Side, fault: Fault) -> Peer {
        match side {
            Side::Client => Peer { http: None, raw: None },
            Side::Origin => Peer {
                http: Some(FaultyOrigin::start(fault, Speak::Http).unwrap()),
                raw: Some(FaultyOrigin::start(fault, Speak::Raw).unwrap()),
            },
        }
    }
}

/// How a response ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// Whole, as framed.
    Complete,
    /// The connection ended (EOF or reset) or the stream was reset before the end.
    Cut(String),
}

/// A response as a client saw it: the status (none when none came), the body bytes, how
/// it ended.
#[derive(Debug)]
struct Seen {
    status: Option<u16>,
    body: Vec<u8>,
    end: End,
}

impl Seen {
    fn summary(&self) -> String {
        let status = self.status.map_or("no status".into(), |s| s.to_string());
        match &self.end {
            End::Complete => format!("{status}, {} bytes, complete", self.body.len()),
            End::Cut(how) => format!("{status}, {} bytes, then {how}", self.body.len()),
        }
    }
}

/// Reads one HTTP/1 response from `s` as far as it goes; bytes after it stay in `buf`.
fn read_h1_buf(s: &mut TcpStream, buf: &mut Vec<u8>) -> Seen {
    let mut tmp = vec![0u8; 64 * 1024];
    let mut head: Option<(Resp, usize)> = None;
    loop {
        if head.is_none() {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let r = parse_head(&buf[..i + 4]);
                let len = r.header("content-length").map_or(usize::MAX, |n| n.parse().unwrap());
                buf.drain(..i + 4);
                head = Some((r, len));
            }
        }
        if let Some((r, len)) = &head {
            if buf.len() >= *len {
                let body = buf.drain(..*len).collect();
                return Seen { status: Some(r.status), body, end: End::Complete };
            }
        }
        let how = match s.read(&mut tmp) {
            Ok(0) => "EOF".to_string(),
            Ok(n) => {
                buf.extend_from_slice(&tmp[..n]);
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => "reset".to_string(),
            Err(e) => format!("read error {e}"),
        };
        let body = std::mem::take(buf);
        return Seen { status: head.map(|(r, _)| r.status), body, end: End::Cut(how) };
    }
}

/// `read_h1_buf` for a connection with one response at a time.
fn read_h1(s: &mut TcpStream) -> Seen {
    read_h1_buf(s, &mut Vec::new())
}

/// Reads a tunnel until it closes: the bytes, and how it closed.
fn read_tunnel(s: &mut TcpStream) -> (Vec<u8>, String) {
    let mut got = Vec::new();
    let mut tmp = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut tmp) {
            Ok(0) => return (got, "EOF".into()),
            Ok(n) => got.extend_from_slice(&tmp[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return (got, "reset".into()),
            Err(e) => return (got, format!("no end ({e})")),
        }
    }
}

/// Opens a tunnel to `target` through `proto` (CONNECT, SOCKS5; the relay goes to its
/// configured target), the handshake's bytes sent with `send` (at once, or split).
fn tunnel(
    rig: &Rig,
    proto: Proto,
    target: SocketAddr,
    send: &dyn Fn(&mut TcpStream, &[u8]),
) -> TcpStream {
    match proto {
        Proto::Connect => {
            let mut s = connect(rig.http);
            send(&mut s, format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes());
            let head = read_head_raw(&mut s);
            assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
            s
        }
        Proto::Socks5 => {
            let mut s = connect(rig.socks);
            let mut hello = vec![5, 1, 0];
            hello.extend_from_slice(&request5(CONNECT, &Dst::Addr(target)));
            send(&mut s, &hello);
            assert_eq!(read_exact_n(&mut s, 2), [5, 0], "method selection");
            let (rep, _) = read_reply5(&mut s);
            assert_eq!(rep, 0, "SOCKS5 reply");
            s
        }
        Proto::Relay => connect(rig.relay),
        Proto::Http1 | Proto::Http2 => unreachable!("not a tunnel"),
    }
}

/// Reads up to the end of a head, one byte at a time (nothing after it is taken).
fn read_head_raw(s: &mut TcpStream) -> Vec<u8> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.extend_from_slice(&read_exact_n(s, 1));
    }
    head
}

fn at_once(s: &mut TcpStream, b: &[u8]) {
    s.write_all(b).unwrap();
}

fn split(s: &mut TcpStream, b: &[u8]) {
    FaultyClient::from_stream(s.try_clone().unwrap()).trickle(b, SPLIT).unwrap();
}

/// A current-thread runtime for the HTTP/2 pairs.
fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// An h2c client connection to `addr` over `io`; the connection task is returned so
/// that a pair can drop the connection.
async fn h2_over<T>(io: T) -> (SendRequest<Bytes>, tokio::task::JoinHandle<()>)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = h2::client::handshake(io).await.expect("h2 handshake");
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (send.ready().await.expect("ready"), task)
}

async fn h2_tcp(addr: SocketAddr) -> tokio::net::TcpStream {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    tcp
}

/// Sends `req` (with `body` and END_STREAM after it) and reads the response as far as it
/// goes.
async fn h2_fetch(send: &SendRequest<Bytes>, req: Request<()>, body: Option<Vec<u8>>) -> Seen {
    let mut send = send.clone().ready().await.expect("ready");
    let (resp, mut stream) = send.send_request(req, body.is_none()).expect("send request");
    if let Some(body) = body {
        stream.send_data(Bytes::from(body), true).expect("send body");
    }
    h2_read(resp).await
}

async fn h2_read(resp: h2::client::ResponseFuture) -> Seen {
    let resp = match tokio::time::timeout(READ_TIMEOUT, resp).await {
        Err(_) => return Seen { status: None, body: vec![], end: End::Cut("no answer".into()) },
        Ok(Err(e)) => return Seen { status: None, body: vec![], end: End::Cut(e.to_string()) },
        Ok(Ok(r)) => r,
    };
    let status = Some(resp.status().as_u16());
    let mut body = resp.into_body();
    let mut got = Vec::new();
    loop {
        match tokio::time::timeout(READ_TIMEOUT, body.data()).await {
            Err(_) => return Seen { status, body: got, end: End::Cut("stalled".into()) },
            Ok(None) => return Seen { status, body: got, end: End::Complete },
            Ok(Some(Err(e))) => return Seen { status, body: got, end: End::Cut(e.to_string()) },
            Ok(Some(Ok(d))) => {
                let _ = body.flow_control().release_capacity(d.len());
                got.extend_from_slice(&d);
            }
        }
    }
}

fn h2_get(url: &str) -> Request<()> {
    Request::get(url).body(()).unwrap()
}

/// Runs `fetch` on its own thread while the healthy exchanges run on this one.
fn beside<T: Send + 'static>(
    rig: &Rig,
    fetch: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let t = std::thread::spawn(fetch);
    let healthy = rig.healthy();
    let got = t.join().map_err(|p| {
        p.downcast_ref::<String>().cloned().unwrap_or_else(|| "the exchange panicked".into())
    })?;
    healthy?;
    Ok(got)
}

fn expect(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

// ---- Origin side ----

/// One origin-side pair; `None` when the fault does not apply to the protocol.
fn origin_case(rig: &Rig, peer: &Peer, fault: Fault, proto: Proto) -> Option<Outcome> {
    let path = format!("/{}/{proto:?}", fault.name().replace(' ', "-"));
    let (Some(http), Some(raw)) = (&peer.http, &peer.raw) else { unreachable!() };
    Some(match proto {
        Proto::Http1 | Proto::Http2 => {
            let url = http.url(&path);
            let next = rig.origin.url("/bytes/7");
            let started = Instant::now();
            let addr = rig.http;
            let fetched = match proto {
                Proto::Http1 => beside(rig, move || {
                    let mut s = connect(addr);
                    s.write_all(&get(&url)).unwrap();
                    let seen = read_h1(&mut s);
                    let after = match seen.end {
                        End::Complete => h1_next(&mut s, &next),
                        End::Cut(_) => Ok("connection closed".into()),
                    };
                    (seen, started.elapsed(), after)
                }),
                _ => beside(rig, move || {
                    rt().block_on(async {
                        let (send, _task) = h2_over(h2_tcp(addr).await).await;
                        let seen = h2_fetch(&send, h2_get(&url), None).await;
                        let took = started.elapsed();
                        // Other streams of the connection see nothing.
                        let n = h2_fetch(&send, h2_get(&next), None).await;
                        let after = match (n.status, n.body == pattern(7)) {
                            (Some(200), true) => Ok("next stream served".to_string()),
                            _ => Err(format!("the next stream got {}", n.summary())),
                        };
                        (seen, took, after)
                    })
                }),
            };
            match fetched {
                Ok((seen, took, after)) => {
                    origin_http_verdict(rig, fault, &path, seen, took, after)
                }
                Err(e) => Err(e),
            }
        }
        Proto::Connect | Proto::Socks5 | Proto::Relay => {
            if matches!(fault, Fault::Overrun | Fault::ResetUnframed) {
                // No framing in a tunnel: nothing was announced, and a reset is a reset.
                return None;
            }
            origin_tunnel(rig, raw, fault, proto)
        }
    })
}

/// The next request on an HTTP/1 connection after a complete answer: served whole, or
/// the connection closed; never the rest of a previous answer.
fn h1_next(s: &mut TcpStream, url: &str) -> Result<String, String> {
    if s.write_all(&get(url)).is_err() {
        return Ok("connection closed".into());
    }
    let next = read_h1(s);
    match (next.status, &next.end) {
        (Some(200), End::Complete) if next.body == pattern(7) => Ok("next request served".into()),
        (None, End::Cut(_)) if next.body.is_empty() => Ok("connection closed".into()),
        _ => Err(format!("the next request got {}", next.summary())),
    }
}

fn origin_http_verdict(
    rig: &Rig,
    fault: Fault,
    path: &str,
    seen: Seen,
    took: Duration,
    after: Result<String, String>,
) -> Outcome {
    let summary = seen.summary();
    let text = String::from_utf8_lossy(&seen.body).into_owned();
    let one_line = |needle: &str| {
        expect(
            seen.end == End::Complete
                && text.ends_with('\n')
                && text.trim_end().lines().count() == 1
                && text.contains(needle),
            || format!("expected a one-line body naming {needle:?}: {summary}: {text:?}"),
        )
    };
    match fault {
        Fault::ResetMidBody => {
            expect(seen.status == Some(200), || format!("status: {summary}"))?;
            expect(seen.body == pattern(faulty::RESET_AFTER), || {
                format!(
                    "expected the {} bytes sent before the reset: {summary}",
                    faulty::RESET_AFTER
                )
            })?;
            expect(matches!(seen.end, End::Cut(_)), || format!("not cut: {summary}"))?;
        }
        Fault::ResetUnframed => {
            expect(seen.status == Some(200), || format!("status: {summary}"))?;
            expect(seen.body == pattern(faulty::RESET_AFTER), || {
                format!(
                    "expected the {} bytes sent before the reset: {summary}",
                    faulty::RESET_AFTER
                )
            })?;
            // Only a reset (HTTP/2: the stream's) tells the client the body was cut.
            expect(matches!(&seen.end, End::Cut(how) if how != "EOF"), || {
                format!("the cut looks like the body's end: {summary}")
            })?;
        }
        Fault::CloseBeforeAnswer => {
            expect(seen.status == Some(502), || format!("status: {summary}"))?;
            one_line("upstream closed the connection")?;
        }
        Fault::NeverRead => {
            expect(seen.status == Some(504), || format!("status: {summary}"))?;
            one_line("timed out")?;
            expect(took >= IO_TIMEOUT.mul_f32(0.9), || format!("answered after {took:?}"))?;
        }
        Fault::SplitHead { .. } | Fault::Drip { .. } | Fault::Overrun => {
            let want = fault.intact_body().unwrap();
            expect(
                seen.status == Some(200) && seen.body == want && seen.end == End::Complete,
                || format!("expected 200 with {} bytes, whole: {summary}", want.len()),
            )?;
        }
    }
    // What follows on the client's connection is clean: the next exchange is served (the
    // extra bytes of an overrun never reach it), or the connection is closed.
    let after = after?;
    let cause = rig.log_cause(&[path])?;
    Ok(format!("{summary}; {after}; log: {cause}"))
}

fn origin_tunnel(rig: &Rig, raw: &FaultyOrigin, fault: Fault, proto: Proto) -> Outcome {
    let mut s = tunnel(rig, proto, raw.addr(), &at_once);
    let started = Instant::now();
    let seen = match fault {
        Fault::NeverRead => {
            // Bytes go until every buffer on the way is full, then nothing moves.
            let mut c = FaultyClient::from_stream(s.try_clone().unwrap());
            let sent = c.fill().map_err(|e| format!("filling: {e}"))?;
            rig.healthy()?;
            let (got, how) = read_tunnel(&mut s);
            let took = started.elapsed();
            expect(got.is_empty() && !how.starts_with("no end"), || {
                format!("after {sent} bytes sent: {} bytes back, then {how}", got.len())
            })?;
            expect(took >= TUNNEL_IDLE.mul_f32(0.9), || format!("closed after {took:?}"))?;
            format!("{sent} bytes taken, closed ({how}) after {took:?}")
        }
        _ => {
            let (got, how) = beside(rig, move || read_tunnel(&mut s))?;
            let want = match fault {
                Fault::ResetMidBody => pattern(faulty::RESET_AFTER),
                Fault::CloseBeforeAnswer => Vec::new(),
                _ => fault.intact_body().unwrap(),
            };
            expect(got == want && !how.starts_with("no end"), || {
                format!(
                    "expected {} bytes then the end: {} bytes, then {how}",
                    want.len(),
                    got.len()
                )
            })?;
            // The origin's reset is passed on: a plain close would say the stream ended
            // whole.
            if fault == Fault::ResetMidBody {
                expect(how == "reset", || format!("the origin's reset came as {how}"))?;
            }
            format!("{} bytes, then {how}", got.len())
        }
    };
    let needle = match proto {
        Proto::Connect => "CONNECT",
        Proto::Socks5 => "socks5://",
        _ => "RELAY",
    };
    let cause = rig.log_cause(&[needle, &raw.addr().to_string()])?;
    Ok(format!("{seen}; log: {cause}"))
}

#[test]
fn faulty_origins_through_every_front_end() {
    run_table(Side::Origin, origin_case);
}

// ---- Client side ----

fn client_case(rig: &Rig, _peer: &Peer, fault: Fault, proto: Proto) -> Option<Outcome> {
    if fault == Fault::ResetUnframed {
        // A client's body has no such framing: one reset is enough.
        return None;
    }
    if proto == Proto::Http2 {
        return Some(client_h2(rig, fault));
    }
    let tunnel_proto = proto != Proto::Http1;
    // Requests in absolute form to the proxy, or in origin form inside a tunnel.
    let url = |path: &str| match tunnel_proto {
        false => rig.origin.url(path),
        true => path.to_string(),
    };
    let open = |send: &dyn Fn(&mut TcpStream, &[u8])| match tunnel_proto {
        false => connect(rig.http),
        true => tunnel(rig, proto, rig.origin.addr(), send),
    };
    let host = format!("Host: {}", rig.origin.addr());
    let req = |method: &str, path: &str, headers: &[&str], body: &[u8]| {
        if tunnel_proto {
            let mut h = vec![host.as_str()];
            h.extend_from_slice(headers);
            let mut out = format!("{method} {path} HTTP/1.1\r\n");
            for l in h {
                out.push_str(l);
                out.push_str("\r\n");
            }
            if !body.is_empty() {
                out.push_str(&format!("Content-Length: {}\r\n", body.len()));
            }
            out.push_str("\r\n");
            let mut b = out.into_bytes();
            b.extend_from_slice(body);
            b
        } else {
            request(method, &url(path), headers, body)
        }
    };
    let out = (|| -> Outcome {
        match fault {
            Fault::ResetUnframed => unreachable!("not a client fault"),
            Fault::SplitHead { .. } => {
                let mut s = open(&split);
                let mut c = FaultyClient::from_stream(s.try_clone().unwrap());
                c.trickle(&req("GET", "/bytes/1000", &[], b""), SPLIT).unwrap();
                rig.healthy()?;
                let seen = read_h1(&mut s);
                expect(seen.status == Some(200) && seen.body == pattern(1000), || seen.summary())?;
                Ok(format!(
                    "{}{}",
                    seen.summary(),
                    if tunnel_proto { " (handshake split too)" } else { "" }
                ))
            }
            Fault::Drip { .. } => {
                let mut s = open(&at_once);
                let body = pattern(DRIP_LEN);
                let full = req("POST", "/echo", &[], &body);
                let head_len = full.len() - body.len();
                s.write_all(&full[..head_len]).unwrap();
                let t = {
                    let mut s = s.try_clone().unwrap();
                    std::thread::spawn(move || {
                        for b in body {
                            std::thread::sleep(DRIP);
                            s.write_all(&[b]).unwrap();
                        }
                    })
                };
                rig.healthy()?;
                t.join().unwrap();
                let seen = read_h1(&mut s);
                expect(seen.status == Some(200) && seen.body == pattern(DRIP_LEN), || {
                    seen.summary()
                })?;
                Ok(seen.summary())
            }
            Fault::ResetMidBody => {
                let before = rig.origin.connections();
                let mut s = open(&at_once);
                let head = req(
                    "POST",
                    "/sha256",
                    &[&format!("Content-Length: {}", faulty::ANNOUNCED)],
                    b"",
                );
                s.write_all(&head).unwrap();
                s.write_all(&pattern(faulty::RESET_AFTER)).unwrap();
                // The proxy has its origin connection: the reset comes mid-body.
                assert!(
                    wait_until(SETTLE, || rig.origin.connections() != before),
                    "the proxy never reached the origin"
                );
                FaultyClient::from_stream(s).reset().unwrap();
                rig.origin_idle()?;
                let cause = client_log(rig, proto, "/sha256")?;
                Ok(format!("origin connection closed; log: {cause}"))
            }
            Fault::NeverRead => {
                let mut s = open(&at_once);
                s.write_all(&req("GET", &format!("/bytes/{HUGE}"), &[], b"")).unwrap();
                let started = Instant::now();
                rig.healthy()?;
                // The proxy gives up on its own (an HTTP/1 write timeout, a tunnel's idle one).
                rig.origin_idle()?;
                let took = started.elapsed();
                let limit = if tunnel_proto { TUNNEL_IDLE } else { IO_TIMEOUT };
                expect(took >= limit.mul_f32(0.9), || format!("ended after {took:?}"))?;
                let mut sink = vec![0u8; 1 << 20];
                let mut got = 0usize;
                let how = loop {
                    match s.read(&mut sink) {
                        Ok(0) => break "EOF".to_string(),
                        Ok(n) => got += n,
                        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                            break "reset".into()
                        }
                        Err(e) => break format!("no end ({e})"),
                    }
                };
                expect(!how.starts_with("no end") && got < HUGE, || format!("{got} bytes, {how}"))?;
                let cause = client_log(rig, proto, &format!("/bytes/{HUGE}"))?;
                // The client is the side that stalled, and the log says so.
                let want = if tunnel_proto {
                    "timed out tunnel idle"
                } else {
                    "timed out writing to the client"
                };
                expect(cause == want, || format!("log: {cause}, expected {want}"))?;
                Ok(format!("proxy gave up after {took:?}; client read {got} bytes then {how}; log: {cause}"))
            }
            Fault::Overrun => {
                if tunnel_proto {
                    return Ok(String::new());
                }
                let mut s = open(&at_once);
                let mut bytes = req("POST", "/echo", &[], &pattern(faulty::OVERRUN_ANNOUNCED));
                bytes.extend_from_slice(faulty::OVERRUN_EXTRA);
                s.write_all(&bytes).unwrap();
                let mut buf = Vec::new();
                let first = read_h1_buf(&mut s, &mut buf);
                expect(
                    first.status == Some(200) && first.body == pattern(faulty::OVERRUN_ANNOUNCED),
                    || format!("the announced part: {}", first.summary()),
                )?;
                let second = read_h1_buf(&mut s, &mut buf);
                let text = String::from_utf8_lossy(&second.body).into_owned();
                expect(second.status == Some(400) && text.trim_end().lines().count() == 1, || {
                    format!("the extra bytes: {}: {text:?}", second.summary())
                })?;
                let (rest, how) = read_tunnel(&mut s);
                expect(rest.is_empty() && !how.starts_with("no end"), || format!("then {how}"))?;
                Ok(format!(
                    "200 with the announced {} bytes; the extra as a request: 400 {:?}; closed",
                    faulty::OVERRUN_ANNOUNCED,
                    text.trim_end()
                ))
            }
            Fault::CloseBeforeAnswer => {
                if proto == Proto::Relay {
                    return Ok(String::new());
                }
                let mut s = connect(match proto {
                    Proto::Socks5 => rig.socks,
                    _ => rig.http,
                });
                let partial: Vec<u8> = match proto {
                    Proto::Http1 => req("GET", "/never", &[], b"")[..30].to_vec(),
                    Proto::Connect => b"CONNECT 127.0.0.1:9 HTTP/1.1\r\nHo".to_vec(),
                    _ => vec![5, 2, 0],
                };
                s.write_all(&partial).unwrap();
                s.shutdown(Shutdown::Write).unwrap();
                let (got, how) = read_tunnel(&mut s);
                let text = String::from_utf8_lossy(&got).into_owned();
                expect(!how.starts_with("no end"), || format!("{text:?} then {how}"))?;
                Ok(format!("{:?} then {how}", text.lines().next().unwrap_or("nothing")))
            }
        }
    })();
    match &out {
        Ok(s) if s.is_empty() => None,
        _ => Some(out),
    }
}

/// The cause on the log line of a client-side pair (by protocol and what it asked).
fn client_log(rig: &Rig, proto: Proto, path: &str) -> Result<String, String> {
    let origin = rig.origin.addr().to_string();
    match proto {
        Proto::Http1 | Proto::Http2 => rig.log_cause(&[path]),
        Proto::Connect => rig.log_cause(&["CONNECT", &origin]),
        Proto::Socks5 => rig.log_cause(&["socks5://", &origin]),
        Proto::Relay => rig.log_cause(&["RELAY"]),
    }
}

fn client_h2(rig: &Rig, fault: Fault) -> Outcome {
    let addr = rig.http;
    let origin = rig.origin.url("");
    match fault {
        Fault::ResetUnframed => unreachable!("not a client fault"),
        Fault::SplitHead { .. } => {
            let seen = beside(rig, move || {
                rt().block_on(async move {
                    let io = Trickle::new(h2_tcp(addr).await, SPLIT);
                    let (send, _task) = h2_over(io).await;
                    h2_fetch(&send, h2_get(&format!("{origin}/bytes/1000")), None).await
                })
            })?;
            expect(
                seen.status == Some(200) && seen.body == pattern(1000) && seen.end == End::Complete,
                || seen.summary(),
            )?;
            Ok(format!("{} (every frame split)", seen.summary()))
        }
        Fault::Drip { .. } => {
            let seen = beside(rig, move || {
                rt().block_on(async move {
                    let (send, _task) = h2_over(h2_tcp(addr).await).await;
                    let mut send = send.ready().await.unwrap();
                    let req = Request::post(format!("{origin}/echo"))
                        .header("content-length", DRIP_LEN)
                        .body(())
                        .unwrap();
                    let (resp, mut body) = send.send_request(req, false).unwrap();
                    for (i, b) in pattern(DRIP_LEN).into_iter().enumerate() {
                        tokio::time::sleep(DRIP).await;
                        body.send_data(Bytes::from(vec![b]), i + 1 == DRIP_LEN).unwrap();
                    }
                    h2_read(resp).await
                })
            })?;
            expect(
                seen.status == Some(200)
                    && seen.body == pattern(DRIP_LEN)
                    && seen.end == End::Complete,
                || seen.summary(),
            )?;
            Ok(seen.summary())
        }
        Fault::ResetMidBody => {
            let connections = || rig.origin.connections();
            let before = connections();
            rt().block_on(async {
                let tcp = h2_tcp(addr).await;
                socket2::SockRef::from(&tcp).set_linger(Some(Duration::ZERO)).unwrap();
                let (send, task) = h2_over(tcp).await;
                let mut send = send.ready().await.unwrap();
                let req = Request::post(format!("{origin}/sha256"))
                    .header("content-length", faulty::ANNOUNCED)
                    .body(())
                    .unwrap();
                let (resp, mut body) = send.send_request(req, false).unwrap();
                body.send_data(Bytes::from(pattern(faulty::RESET_AFTER)), false).unwrap();
                assert!(
                    wait_until_async(SETTLE, || connections() != before).await,
                    "the proxy never reached the origin"
                );
                // The connection's task owns the socket: ending it resets the connection.
                task.abort();
                let _ = task.await;
                drop((send, resp, body));
            });
            rig.origin_idle()?;
            let cause = rig.log_cause(&["/sha256"])?;
            Ok(format!("origin connection closed; log: {cause}"))
        }
        Fault::NeverRead => {
            // The response's stream is never read: flow control stops the proxy, and
            // what ends the exchange is the client leaving.
            let before = rig.origin.connections();
            let open_while_stalled = rt().block_on(async {
                let (send, task) = h2_over(h2_tcp(addr).await).await;
                let mut send = send.ready().await.unwrap();
                let req = h2_get(&format!("{origin}/bytes/{HUGE}"));
                let (resp, _) = send.send_request(req, true).unwrap();
                let resp = resp.await.unwrap();
                tokio::time::sleep(IO_TIMEOUT * 2).await;
                let open = rig.origin.open_connections();
                task.abort();
                let _ = task.await;
                drop((send, resp));
                open
            });
            expect(rig.origin.connections() > before, || "no origin connection".into())?;
            rig.origin_idle()?;
            let cause = rig.log_cause(&[&format!("/bytes/{HUGE}")])?;
            expect(open_while_stalled == 0 && cause == "timed out writing to the client", || {
                format!("{open_while_stalled} origin connections open while stalled; log: {cause}")
            })?;
            Ok(format!("proxy gave up within {:?}; log: {cause}", IO_TIMEOUT * 2))
        }
        Fault::Overrun => {
            let seen = rt().block_on(async move {
                let (send, _task) = h2_over(h2_tcp(addr).await).await;
                let mut send = send.ready().await.unwrap();
                let req = Request::post(format!("{origin}/echo"))
                    .header("content-length", faulty::OVERRUN_ANNOUNCED)
                    .body(())
                    .unwrap();
                let (resp, mut body) = send.send_request(req, false).unwrap();
                let mut all = pattern(faulty::OVERRUN_ANNOUNCED);
                all.extend_from_slice(faulty::OVERRUN_EXTRA);
                body.send_data(Bytes::from(all), true).unwrap();
                let seen = h2_read(resp).await;
                let next = h2_fetch(&send, h2_get(&format!("{origin}/bytes/7")), None).await;
                (seen, next)
            });
            let (seen, next) = seen;
            expect(next.status == Some(200) && next.body == pattern(7), || {
                format!("next stream: {}", next.summary())
            })?;
            // h2 resets the stream (RFC 9113 8.1.1: PROTOCOL_ERROR) before handing it over
            // when the excess comes with the head: then there is no exchange to log.
            expect(matches!(&seen.end, End::Cut(how) if how.contains("protocol error")), || {
                format!("expected the stream reset: {}", seen.summary())
            })?;
            let cause = rig.log_cause(&["/echo"]).unwrap_or_else(|_| "no line".into());
            Ok(format!("{}; next stream served; log: {cause}", seen.summary()))
        }
        Fault::CloseBeforeAnswer => {
            let mut s = connect(addr);
            s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\x12\x04").unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            let (got, how) = read_tunnel(&mut s);
            expect(!how.starts_with("no end"), || format!("{} bytes then {how}", got.len()))?;
            Ok(format!("{} bytes (SETTINGS, GOAWAY) then {how}", got.len()))
        }
    }
}

#[test]
fn faulty_clients_through_every_front_end() {
    run_table(Side::Client, client_case);
}
