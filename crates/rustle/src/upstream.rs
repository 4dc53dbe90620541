//! Reaching upstreams: a per-worker name cache in front of the system resolver, Happy
//! Eyeballs (RFC 8305) over every resolved address, and a per-worker pool of idle origin
//! connections. Per worker means no lock: each worker owns its cache and its pool.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::net::TcpStream;

use crate::config::Upstream as UpstreamConfig;
use crate::conn::Stream;
use crate::error::ConnectError;
use crate::policy::Denial;

/// RFC 8305's recommended Connection Attempt Delay: how long one address gets before the
/// next is tried in parallel.
const ATTEMPT_DELAY: Duration = Duration::from_millis(250);

/// A failed lookup is remembered briefly so a burst of requests for a bad name costs one
/// resolver call, not one each.
const NEGATIVE_TTL: Duration = Duration::from_secs(5);

enum Cached {
    Found(Rc<[IpAddr]>),
    Failed(String),
}

struct Idle {
    stream: Stream,
    addr: SocketAddr,
    since: Instant,
}

/// A worker's view of the upstream side.
pub struct Upstreams {
    cfg: UpstreamConfig,
    dns: RefCell<HashMap<Box<str>, (Cached, Instant)>>,
    pool: RefCell<Pool>,
}

struct Pool {
    /// Keyed by the lowercased `host:port` the client named.
    map: HashMap<Box<[u8]>, Vec<Idle>>,
    total: usize,
}

impl Upstreams {
    pub fn new(cfg: UpstreamConfig) -> Self {
        Upstreams {
            cfg,
            dns: RefCell::new(HashMap::new()),
            pool: RefCell::new(Pool { map: HashMap::new(), total: 0 }),
        }
    }

    /// Resolves `host` (an IP literal costs nothing) through the cache.
    pub async fn resolve(&self, host: &str) -> Result<Rc<[IpAddr]>, ConnectError> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(Rc::from([ip]));
        }
        let now = Instant::now();
        if let Some((cached, expires)) = self.dns.borrow().get(host) {
            if *expires > now {
                return match cached {
                    Cached::Found(ips) => Ok(ips.clone()),
                    Cached::Failed(reason) => {
                        Err(ConnectError::Resolve { host: host.into(), reason: reason.clone() })
                    }
                };
            }
        }
        // getaddrinfo runs on tokio's blocking pool, never on the worker; it honours
        // /etc/hosts and nsswitch like every other program on the machine.
        let result = tokio::net::lookup_host((host, 0)).await;
        let (entry, ttl) = match result {
            Ok(addrs) => {
                let mut ips: Vec<IpAddr> = Vec::new();
                for a in addrs {
                    if !ips.contains(&a.ip()) {
                        ips.push(a.ip());
                    }
                }
                if ips.is_empty() {
                    (Cached::Failed("no addresses".into()), NEGATIVE_TTL)
                } else {
                    (Cached::Found(ips.into()), self.cfg.dns_cache_ttl)
                }
            }
            Err(e) => (Cached::Failed(resolve_reason(&e)), NEGATIVE_TTL),
        };
        let out = match &entry {
            Cached::Found(ips) => Ok(ips.clone()),
            Cached::Failed(reason) => {
                Err(ConnectError::Resolve { host: host.into(), reason: reason.clone() })
            }
        };
        let mut dns = self.dns.borrow_mut();
        if dns.len() > 10_000 {
            dns.retain(|_, (_, exp)| *exp > now);
        }
        dns.insert(host.into(), (entry, now + ttl));
        out
    }

    /// Resolves and connects with Happy Eyeballs, all within `timeout`. `check` vets each
    /// resolved address before any connection attempt (access rules on the address really
    /// connected to, so a name cannot smuggle a forbidden address past them).
    pub async fn connect(
        &self,
        host: &str,
        port: u16,
        timeout: Duration,
        check: &dyn Fn(SocketAddr) -> Option<Denial>,
    ) -> Result<(TcpStream, SocketAddr), ConnectError> {
        let fut = async {
            let ips = self.resolve(host).await?;
            let mut allowed: Vec<IpAddr> = Vec::with_capacity(ips.len());
            let mut denied = None;
            for ip in ips.iter() {
                match check(SocketAddr::new(*ip, port)) {
                    None => allowed.push(*ip),
                    Some(d) => denied = denied.or(Some(d)),
                }
            }
            if allowed.is_empty() {
                if let Some(d) = denied {
                    return Err(ConnectError::Denied(d));
                }
            }
            happy_eyeballs(&allowed, port).await
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(ConnectError::Timeout(format!("{host}:{port}"))),
        }
    }

    /// Connects to one known address within `timeout`.
    pub async fn connect_addr(
        &self,
        addr: SocketAddr,
        timeout: Duration,
        check: &dyn Fn(SocketAddr) -> Option<Denial>,
    ) -> Result<(TcpStream, SocketAddr), ConnectError> {
        if let Some(d) = check(addr) {
            return Err(ConnectError::Denied(d));
        }
        match tokio::time::timeout(timeout, connect_one(addr)).await {
            Ok(r) => r,
            Err(_) => Err(ConnectError::Timeout(addr.to_string())),
        }
    }

    /// Takes the most recently used live idle connection for `key`, if any.
    pub fn take(&self, key: &[u8]) -> Option<(Stream, SocketAddr)> {
        let mut pool = self.pool.borrow_mut();
        let Pool { map, total } = &mut *pool;
        let list = map.get_mut(key)?;
        let deadline = Instant::now().checked_sub(self.cfg.pool_idle_timeout);
        while let Some(mut idle) = list.pop() {
            *total -= 1;
            let expired = deadline.is_some_and(|d| idle.since < d);
            if !expired && !is_stale(idle.stream.socket()) {
                return Some((idle.stream, idle.addr));
            }
            idle.stream.close_now();
        }
        None
    }

    /// Parks a connection whose last exchange ended cleanly.
    /// A connection the pool has no room for is closed (a TLS one with close_notify).
    pub fn put(&self, key: &[u8], mut stream: Stream, addr: SocketAddr) {
        let mut pool = self.pool.borrow_mut();
        let max = self.cfg.pool_max_idle_per_host;
        let Pool { map, total } = &mut *pool;
        let list = map.get_mut(key);
        let full = *total >= self.cfg.pool_max_idle
            || list.as_ref().map_or(max == 0, |list| list.len() >= max);
        if full {
            stream.close_now();
            return;
        }
        let idle = Idle { stream, addr, since: Instant::now() };
        match list {
            Some(list) => list.push(idle),
            None => {
                map.insert(key.into(), vec![idle]);
            }
        }
        *total += 1;
    }

    /// Closes idle connections past their timeout or closed by their origin; run from
    /// the worker's housekeeping timer so idle sockets do not linger.
    pub fn sweep(&self) {
        let mut pool = self.pool.borrow_mut();
        let Some(deadline) = Instant::now().checked_sub(self.cfg.pool_idle_timeout) else {
            return;
        };
        let Pool { map, total } = &mut *pool;
        map.retain(|_, list| {
            list.retain_mut(|i| {
                let keep = i.since >= deadline && !is_stale(i.stream.socket());
                if !keep {
                    i.stream.close_now();
                }
                keep
            });
            !list.is_empty()
        });
        *total = map.values().map(Vec::len).sum();
    }

    pub fn idle_count(&self) -> usize {
        self.pool.borrow().total
    }

    /// Drops every idle connection (on shutdown).
    pub fn clear(&self) {
        let mut pool = self.pool.borrow_mut();
        for (_, list) in pool.map.drain() {
            for mut idle in list {
                idle.stream.close_now();
            }
        }
        pool.total = 0;
    }
}

/// An idle origin connection that has become readable has either closed or sent bytes
/// nobody asked for; both make it unusable (for TLS too: the byte looked at is lost, but
/// the connection is dropped anyway). The check reads tokio's cached readiness, so
/// it costs no syscall unless readiness is set.
/// (Origin connections are always registered; one that is not counts as stale.)
pub fn is_stale(stream: Option<&TcpStream>) -> bool {
    let Some(stream) = stream else { return true };
    let mut cx = Context::from_waker(Waker::noop());
    match stream.poll_read_ready(&mut cx) {
        Poll::Pending => false,
        Poll::Ready(Err(_)) => true,
        // Readiness may be left over from a read that exactly filled the buffer: look.
        Poll::Ready(Ok(())) => {
            let mut byte = [0u8; 1];
            !matches!(stream.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
        }
    }
}

fn resolve_reason(e: &io::Error) -> String {
    let s = e.to_string();
    // getaddrinfo's messages come wrapped as "failed to lookup address information: X".
    match s.strip_prefix("failed to lookup address information: ") {
        Some(rest) => rest.to_string(),
        None => s,
    }
}

/// Orders addresses by alternating families, starting with the resolver's first choice.
fn interleave(ips: &[IpAddr]) -> Vec<IpAddr> {
    let first_v6 = ips.first().is_some_and(IpAddr::is_ipv6);
    let (mut a, mut b): (Vec<IpAddr>, Vec<IpAddr>) =
        ips.iter().partition(|ip| ip.is_ipv6() == first_v6);
    a.reverse();
    b.reverse();
    let mut out = Vec::with_capacity(ips.len());
    while !a.is_empty() || !b.is_empty() {
        out.extend(a.pop());
        out.extend(b.pop());
    }
    out
}

async fn connect_one(addr: SocketAddr) -> Result<(TcpStream, SocketAddr), ConnectError> {
    let stream = TcpStream::connect(addr).await.map_err(|e| ConnectError::from_io(addr, e))?;
    // Proxied exchanges are request/response: never let Nagle hold back a small write.
    stream.set_nodelay(true).map_err(|e| ConnectError::from_io(addr, e))?;
    Ok((stream, addr))
}

async fn happy_eyeballs(
    ips: &[IpAddr],
    port: u16,
) -> Result<(TcpStream, SocketAddr), ConnectError> {
    if let [ip] = ips {
        return connect_one(SocketAddr::new(*ip, port)).await;
    }
    let order = interleave(ips);
    let mut next = order.iter().map(|ip| SocketAddr::new(*ip, port));
    let mut attempts = FuturesUnordered::new();
    let mut last_err = None;
    if let Some(addr) = next.next() {
        attempts.push(connect_one(addr));
    }
    loop {
        let delay = tokio::time::sleep(ATTEMPT_DELAY);
        tokio::select! {
            res = attempts.next() => match res {
                Some(Ok(ok)) => return Ok(ok),
                Some(Err(e)) => {
                    last_err = Some(e);
                    if let Some(addr) = next.next() {
                        attempts.push(connect_one(addr));
                    } else if attempts.is_empty() {
                        break;
                    }
                }
                None => break,
            },
            _ = delay => {
                if let Some(addr) = next.next() {
                    attempts.push(connect_one(addr));
                }
            }
        }
    }
    Err(last_err.unwrap_or_else(|| ConnectError::Resolve {
        host: String::new(),
        reason: "no addresses".into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaves_families() {
        let v6a: IpAddr = "::1".parse().expect("ip");
        let v6b: IpAddr = "::2".parse().expect("ip");
        let v4a: IpAddr = "127.0.0.1".parse().expect("ip");
        let v4b: IpAddr = "127.0.0.2".parse().expect("ip");
        assert_eq!(interleave(&[v6a, v6b, v4a, v4b]), vec![v6a, v4a, v6b, v4b]);
        assert_eq!(interleave(&[v4a, v6a, v4b]), vec![v4a, v6a, v4b]);
    }

    #[tokio::test]
    async fn happy_eyeballs_skips_a_dead_address() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // ::1 on that port is (almost certainly) closed: refused fast, then 127.0.0.1 wins.
        let ips: Vec<IpAddr> = vec!["::1".parse().expect("ip"), "127.0.0.1".parse().expect("ip")];
        let (_, addr) = happy_eyeballs(&ips, port).await.expect("connects");
        assert_eq!(addr.ip().to_string(), "127.0.0.1");
    }

    #[tokio::test]
    async fn pool_drops_connections_the_origin_closed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let ups = Upstreams::new(UpstreamConfig::default());
        let a = TcpStream::connect(addr).await.expect("connect");
        let (server_a, _) = listener.accept().await.expect("accept");
        let b = TcpStream::connect(addr).await.expect("connect");
        let (_server_b, _) = listener.accept().await.expect("accept");
        ups.put(b"k:1", a.into(), addr);
        ups.put(b"k:1", b.into(), addr);
        assert_eq!(ups.idle_count(), 2);
        drop(server_a);
        tokio::time::sleep(Duration::from_millis(50)).await;
        // b is newest, so it comes first and is alive.
        assert!(ups.take(b"k:1").is_some());
        // a was closed by its origin: not handed out.
        assert!(ups.take(b"k:1").is_none());
        assert_eq!(ups.idle_count(), 0);
    }
}
