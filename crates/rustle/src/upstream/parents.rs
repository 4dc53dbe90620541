//! Connections through parent proxies: a route's hops, each a parent or a group that
//! picks one of its parents, tunnelled one through the next (HTTP CONNECT, SOCKS5,
//! SOCKS4a, `https` parents over TLS), the last one to the target; an HTTP parent at the
//! end takes a plain HTTP request itself, in absolute form. A parent that cannot be
//! reached or breaks off counts a failure towards being marked down, and the connection
//! is tried again with a fresh pick, so that a group's surviving members take over at
//! once; a parent that answers with a refusal is not at fault, and its answer is the
//! client's.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use rustle_proto::socks5::Reply;

use super::{target_tls, Connected, Tls, Upstreams, Want};
use crate::accesslog::Via;
use crate::acl::Protocol;
use crate::config::{ParentKind, Timeouts};
use crate::conn::Stream;
use crate::error::{ConnectError, Error};
use crate::hop::{self, Credentials, HopKind};
use crate::policy::Policy;
use crate::route::{Hop, Parent, Pick};

/// Attempts at one connection: a failed parent is picked around on the next.
const ATTEMPTS: usize = 4;

/// How a chain failed: the hop, the error, and whether the parent is at fault.
struct Failure {
    hop: usize,
    error: Error,
    broken: bool,
}

fn parent_error(p: &Parent, reason: String, status: u16, reply: Reply) -> Error {
    let addr = if p.host.contains(':') {
        format!("[{}]:{}", p.host, p.port)
    } else {
        format!("{}:{}", p.host, p.port)
    };
    Error::Connect(ConnectError::Parent {
        name: p.name.clone(),
        addr: addr.into(),
        reason,
        status,
        reply,
    })
}

impl Upstreams {
    /// A connection to `want`'s target through the hops of route `route`.
    pub(super) async fn through(
        &self,
        policy: &Policy,
        want: &Want<'_>,
        rules_too: bool,
        route: &str,
        hops: &[Hop],
        timeouts: &Timeouts,
    ) -> Result<Connected, Error> {
        let routes = &policy.routes;
        let mut last: Option<Error> = None;
        for _ in 0..ATTEMPTS {
            let now = Instant::now();
            let mut chain: Vec<&Arc<Parent>> = Vec::with_capacity(hops.len());
            for hop in hops {
                match routes.pick(hop, want.user, want.client, now) {
                    Pick::Parent(p) => chain.push(p),
                    // A group whose fallback is `direct`: this hop is skipped.
                    Pick::Direct => {}
                    Pick::Deny(why) => {
                        return Err(last.unwrap_or(Error::Connect(ConnectError::NoParent(why))))
                    }
                }
            }
            if chain.is_empty() {
                return self.direct(policy, want, rules_too, timeouts).await;
            }
            match self.chain(policy, want, &chain, timeouts).await {
                Ok(mut c) => {
                    for p in &chain {
                        if p.succeeded() {
                            tracing::info!("{p} is up again");
                        }
                    }
                    let parents: Vec<&str> = chain.iter().map(|p| &*p.name).collect();
                    c.via = Some(Rc::new(Via {
                        route: route.into(),
                        parents: parents.join(",").into(),
                    }));
                    return Ok(c);
                }
                Err(Failure { hop, error, broken: true }) => {
                    let p = chain[hop];
                    if p.failed(Instant::now()) {
                        tracing::warn!(
                            "{p} marked down for {:?} after {} failure(s): {error}",
                            p.down_for,
                            p.max_failures.max(1)
                        );
                    }
                    last = Some(error);
                }
                Err(Failure { error, .. }) => return Err(error),
            }
        }
        Err(last.unwrap_or(Error::Connect(ConnectError::NoParent(format!(
            "route `{route}`: no parent answered"
        )))))
    }

    /// One attempt along `chain`.
    async fn chain(
        &self,
        policy: &Policy,
        want: &Want<'_>,
        chain: &[&Arc<Parent>],
        timeouts: &Timeouts,
    ) -> Result<Connected, Failure> {
        let first = chain[0];
        let fail = |hop: usize, reason: String, status: u16, reply: Reply, broken: bool| Failure {
            hop,
            error: parent_error(chain[hop], reason, status, reply),
            broken,
        };
        let (tcp, addr) = self
            .connect_tcp(&first.host, first.port, timeouts.connect, &|_| None)
            .await
            .map_err(|e| {
                let (status, reply) = match e {
                    ConnectError::Timeout(_) => (504, Reply::TtlExpired),
                    _ => (502, Reply::GeneralFailure),
                };
                fail(0, format!("cannot be reached: {e}"), status, reply, true)
            })?;
        let mut stream = Stream::Tcp(tcp);
        if first.kind == ParentKind::Https {
            stream = parent_tls(policy, first, stream, timeouts)
                .await
                .map_err(|why| fail(0, why, 502, Reply::GeneralFailure, true))?;
        }
        let mut absolute = None;
        let mut early = Vec::new();
        for (i, p) in chain.iter().enumerate() {
            let next = chain.get(i + 1);
            let user = p.user_for(want.user);
            let password = p.password.as_ref().map_or("", |s| s.expose());
            let creds = user.map(|user| Credentials { user, password });
            let http = matches!(p.kind, ParentKind::Http | ParentKind::Https);
            if next.is_none()
                && http
                && want.protocol == Protocol::Http
                && matches!(want.tls, Tls::Plain)
            {
                absolute = Some(creds.map(basic));
                break;
            }
            let (host, port): (&str, u16) = match next {
                Some(n) => (&n.host, n.port),
                None => (want.host, want.port),
            };
            let kind = match p.kind {
                ParentKind::Http | ParentKind::Https => HopKind::Http,
                ParentKind::Socks5 => HopKind::Socks5,
                ParentKind::Socks4a => HopKind::Socks4a,
            };
            early =
                hop::tunnel(&mut stream, kind, creds, host, port, timeouts.connect).await.map_err(
                    |e| fail(i, e.to_string(), e.status(), e.socks5_reply(), e.parent_failed()),
                )?;
            if let Some(n) = next.filter(|n| n.kind == ParentKind::Https) {
                if !early.is_empty() {
                    let why = "sent bytes before the TLS handshake with the next parent".into();
                    return Err(fail(i, why, 502, Reply::GeneralFailure, true));
                }
                stream = parent_tls(policy, n, stream, timeouts)
                    .await
                    .map_err(|why| fail(i + 1, why, 502, Reply::GeneralFailure, true))?;
            }
        }
        if !matches!(want.tls, Tls::Plain) && !early.is_empty() {
            let why = "sent bytes before the TLS handshake with the target".into();
            return Err(fail(chain.len() - 1, why, 502, Reply::GeneralFailure, true));
        }
        let stream = target_tls(policy, want, stream, addr, timeouts)
            .await
            .map_err(|error| Failure { hop: chain.len() - 1, error, broken: false })?;
        Ok(Connected { stream, addr, reused: false, via: None, absolute, early })
    }
}

/// TLS to an `https` parent, verified with its `ca` (or the system's roots) for its
/// `server_name`.
async fn parent_tls(
    policy: &Policy,
    p: &Parent,
    stream: Stream,
    timeouts: &Timeouts,
) -> Result<Stream, String> {
    let Some(config) = policy.parent_tls(p.index).cloned() else {
        return Err("has no TLS settings".into());
    };
    let name = rustls::pki_types::ServerName::try_from(p.server_name.to_string())
        .map_err(|_| format!("`{}` is not a server name", p.server_name))?;
    crate::tls::connect_over(config, name, stream, timeouts.handshake)
        .await
        .map_err(|e| format!("TLS failed: {e}"))
}

/// `Basic base64(user:password)`, the value of a `Proxy-Authorization` field.
fn basic(c: Credentials<'_>) -> Box<[u8]> {
    use base64::Engine as _;
    let token =
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", c.user, c.password));
    format!("Basic {token}").into_bytes().into_boxed_slice()
}
