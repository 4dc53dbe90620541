//! The proxy's one error type. Each variant says who failed, which decides what the
//! client is told: a fault of the client is a 4xx, a fault of the upstream a 502, a
//! timeout waiting on the upstream a 504, and a client that went away gets nothing.

use std::fmt;
use std::io;
use std::net::SocketAddr;

use rustle_proto::http::HeadError;
use rustle_proto::{socks4, socks5};

/// Why a destination was refused; named in the 403 body, the SOCKS log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Denial {
    /// The rule's name, or "built-in" for the loop and private-destination checks.
    pub(crate) rule: String,
    pub(crate) reason: &'static str,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "denied by {}: {}", self.rule, self.reason)
    }
}

/// Why a request or connection was refused: the metrics' `cause` label, and how squid's
/// log format shows a refused SOCKS request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// A connection limit (the proxy's, a client's, a user's).
    Limit,
    /// An access rule, a route or a built-in protection.
    Rule,
    /// Missing or failed authentication (rate-limited attempts included).
    Auth,
}

/// The phase a timeout happened in; it decides the status and the log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Waiting for the client's request head.
    ClientHead,
    /// Waiting for the rest of a SOCKS handshake.
    Handshake,
    /// Waiting for request body bytes from the client.
    ClientBody,
    /// Resolving and connecting to the upstream.
    Connect,
    /// A SOCKS BIND waiting for its incoming connection.
    Incoming,
    /// Waiting for the upstream's response head.
    UpstreamHead,
    /// Waiting for response body bytes from the upstream.
    UpstreamBody,
    /// Waiting for the client to take response bytes.
    ClientWrite,
    /// No bytes either way on a tunnel.
    TunnelIdle,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::ClientHead => "waiting for the request head",
            Phase::Handshake => "waiting for the SOCKS handshake",
            Phase::ClientBody => "waiting for the request body",
            Phase::Connect => "connecting to the upstream",
            Phase::Incoming => "waiting for the BIND's incoming connection",
            Phase::UpstreamHead => "waiting for the upstream's response",
            Phase::UpstreamBody => "waiting for the upstream's response body",
            Phase::ClientWrite => "writing to the client",
            Phase::TunnelIdle => "tunnel idle",
        }
    }
}

/// Why a name could not be turned into a connected upstream socket.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    #[error("cannot resolve {host}: {reason}")]
    Resolve { host: String, reason: String },
    #[error("connection refused by {0}")]
    Refused(SocketAddr),
    #[error("connection reset by {0}")]
    Reset(SocketAddr),
    #[error("network unreachable for {0}")]
    NetUnreachable(SocketAddr),
    #[error("host {0} is unreachable")]
    HostUnreachable(SocketAddr),
    #[error("cannot connect to {addr}: {source}")]
    Other { addr: SocketAddr, source: io::Error },
    #[error("timed out connecting to {0}")]
    Timeout(String),
    /// An access rule or a built-in protection refused the destination.
    #[error("{0}")]
    Denied(Denial),
    /// The TLS handshake with the upstream failed (verification names what it found).
    #[error("TLS to {addr} failed: {reason}")]
    Tls { addr: SocketAddr, reason: String },
    /// A parent proxy on the route failed or refused (boxed: rare, and every `Error` would
    /// otherwise grow by it).
    #[error("{0}")]
    Parent(Box<ParentFailure>),
    /// The route has no parent to take (every member of its group is down, and its
    /// fallback refuses).
    #[error("{0}")]
    NoParent(String),
    /// The route's `bind` has no outgoing address of any family the target resolved to:
    /// "route `x` has no IPv4 outgoing address for example.com".
    #[error("{0}")]
    NoEgress(String),
    /// The socket could not be given its outgoing address or interface.
    #[error("cannot send from {local}: {source}")]
    Bind { local: String, source: io::Error },
}

/// A parent proxy that failed or refused: `reason` continues the sentence `parent "NAME"
/// (ADDRESS) ...`; `status` and `reply` are what the client is told.
#[derive(Debug, thiserror::Error)]
#[error("parent \"{name}\" ({addr}) {reason}")]
pub(crate) struct ParentFailure {
    pub(crate) route: Box<str>,
    pub(crate) name: Box<str>,
    pub(crate) addr: Box<str>,
    pub(crate) reason: String,
    pub(crate) status: u16,
    pub(crate) reply: socks5::Reply,
}

impl ConnectError {
    pub(crate) fn from_io(addr: SocketAddr, e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::ConnectionRefused => ConnectError::Refused(addr),
            io::ErrorKind::ConnectionReset => ConnectError::Reset(addr),
            io::ErrorKind::HostUnreachable => ConnectError::HostUnreachable(addr),
            io::ErrorKind::NetworkUnreachable => ConnectError::NetUnreachable(addr),
            io::ErrorKind::TimedOut => ConnectError::Timeout(addr.to_string()),
            _ => ConnectError::Other { addr, source: e },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The client sent a request the parser rejected.
    #[error("{0}")]
    BadRequest(#[from] HeadError),
    /// The client sent something well-formed that a forward proxy cannot serve.
    #[error("{0}")]
    Unsupported(&'static str),
    /// The request body's chunked framing was malformed.
    #[error("malformed chunked request body: {0}")]
    BadRequestBody(rustle_proto::chunked::ChunkError),
    /// The client went away or its socket failed; nobody is left to answer.
    #[error("client connection: {0}")]
    Client(io::Error),
    /// The client ended the request body early.
    #[error("client closed the connection in the middle of the request body")]
    ClientTruncated,
    /// The client closed its connection while the proxy waited on the upstream for it
    /// (an origin's answer, a BIND's incoming connection): what waited is dropped at once.
    #[error("client closed the connection while {}", .0.as_str())]
    ClientLeft(Phase),
    /// The client closed in the middle of a SOCKS handshake.
    #[error("client closed the connection in the middle of the handshake")]
    HandshakeTruncated,
    /// A BIND's incoming connection came from a host the client did not name.
    #[error("BIND: the incoming connection came from another host ({0}) than the one named")]
    BindStranger(SocketAddr),
    /// The upstream could not be reached.
    #[error("{0}")]
    Connect(#[from] ConnectError),
    /// The upstream's socket failed.
    #[error("upstream connection: {0}")]
    Upstream(io::Error),
    /// The upstream closed before or in the middle of its response.
    #[error("upstream closed the connection {0}")]
    UpstreamClosed(&'static str),
    /// The upstream answered with something the parser rejected.
    #[error("upstream sent a malformed response: {0}")]
    BadResponse(HeadError),
    /// The upstream's chunked framing was malformed.
    #[error("upstream sent a malformed chunked body: {0}")]
    BadResponseBody(rustle_proto::chunked::ChunkError),
    /// The upstream switched protocols without being asked to, or before the request
    /// body was complete.
    #[error("upstream answered 101 Switching Protocols to a request that did not ask for it")]
    BadUpgrade,
    /// A timer ran out.
    #[error("timed out {}", .0.as_str())]
    Timeout(Phase),
    /// A SOCKS5 client sent a malformed or unsupported handshake.
    #[error("SOCKS5: {0}")]
    Socks5(#[from] socks5::Error),
    /// A SOCKS4 client sent a malformed or unsupported request.
    #[error("SOCKS4: {0}")]
    Socks4(#[from] socks4::Error),
    /// The listener requires authentication and the client did not pass it.
    #[error("proxy authentication required: {0}")]
    AuthRequired(&'static str),
    /// The password was right, the parameters in the user name (`[auth.params]`) were
    /// not: what was wrong with them.
    #[error("proxy authentication required: {0}")]
    AuthParams(Box<str>),
    /// A `Proxy-Authorization: Negotiate` token was refused: why (never the token).
    #[error("proxy authentication required: Negotiate: {0}")]
    AuthNegotiate(Box<str>),
    /// Too many failed attempts from this client address.
    #[error("too many failed authentication attempts")]
    AuthRateLimited,
    /// The password-hashing threads' queue is full (of other clients' logins).
    #[error("too many logins being checked, try again shortly")]
    AuthBusy,
    /// An external authentication backend gave no answer (down, timed out): the user is
    /// refused, whoever it is.
    #[error("the authentication backend is unavailable, try again later")]
    AuthUnavailable,
    /// The user's traffic quota is used up: which quota, how much, and when it resets.
    #[error("{0}")]
    QuotaExceeded(std::sync::Arc<str>),
    /// The user is disabled, removed or cut by its quota (`limits::cut`): why.
    #[error("{0}")]
    UserCut(Box<str>),
    /// Per-client or per-user connection limit.
    #[error("too many connections {0}")]
    LimitReached(&'static str),
    /// The user is using as many client addresses as it may (`max_client_addresses`):
    /// the one line saying so (`user alice is already using 2 client addresses (limit
    /// 2)`).
    #[error("{0}")]
    ClientAddresses(Box<str>),
    /// The proxy is at its connection limit.
    #[error("too many connections")]
    Overloaded,
    /// A fleet's shared state (Redis) is unreachable and `on_state_loss = "deny"`.
    #[error("shared state unavailable")]
    StateLost,
    /// Still open when the shutdown's grace period ended.
    #[error("closed at the shutdown deadline")]
    ShutdownDeadline,
    /// An upstream-side failure on a connection through parents: `parent` is the one
    /// the bytes came from (the last of the route's), as `"NAME"`.
    #[error("through parent {parent}: {source}")]
    Through { parent: Box<str>, source: Box<Error> },
    /// An HTTP parent refused a request sent to it in absolute form (a 407 is for
    /// rustle, which sent its credentials, not for the client).
    #[error("parent {parent} refused the request: {status}")]
    ParentRefused { parent: Box<str>, status: u16 },
}

impl Error {
    /// The status to answer with, if the client can still be told anything. One
    /// exhaustive match: a new variant must decide here.
    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            Error::BadRequest(e) => Some(e.status()),
            Error::Unsupported(_) => Some(400),
            Error::BadRequestBody(_) => Some(400),
            Error::Client(_) => None,
            Error::ClientTruncated => None,
            Error::ClientLeft(_) => None,
            Error::HandshakeTruncated => None,
            Error::BindStranger(_) => None,
            Error::Connect(ConnectError::Timeout(_)) => Some(504),
            Error::Connect(ConnectError::Denied(_)) => Some(403),
            Error::Connect(ConnectError::Parent(p)) => Some(p.status),
            Error::Connect(_) => Some(502),
            Error::Upstream(_) => Some(502),
            Error::UpstreamClosed(_) => Some(502),
            Error::BadResponse(_) => Some(502),
            Error::BadResponseBody(_) => Some(502),
            Error::BadUpgrade => Some(502),
            Error::Timeout(phase) => match phase {
                Phase::ClientHead | Phase::ClientBody | Phase::Handshake => Some(408),
                Phase::Connect | Phase::Incoming | Phase::UpstreamHead | Phase::UpstreamBody => {
                    Some(504)
                }
                Phase::ClientWrite | Phase::TunnelIdle => None,
            },
            Error::Overloaded => Some(503),
            Error::StateLost => Some(503),
            Error::ShutdownDeadline => None,
            Error::Through { source, .. } => source.status(),
            Error::ParentRefused { .. } => Some(502),
            Error::AuthRequired(_) | Error::AuthParams(_) | Error::AuthNegotiate(_) => Some(407),
            Error::AuthRateLimited => Some(429),
            Error::AuthBusy | Error::AuthUnavailable => Some(503),
            Error::LimitReached(_) => Some(503),
            Error::ClientAddresses(_) => Some(403),
            Error::QuotaExceeded(_) | Error::UserCut(_) => Some(403),
            Error::Socks5(_) | Error::Socks4(_) => Some(400),
        }
    }
}

impl Error {
    /// The SOCKS5 reply for a failure before the tunnel is up. The other of the two
    /// mappings (with `status`); exhaustive for the same reason.
    pub(crate) fn socks5_reply(&self) -> socks5::Reply {
        use socks5::Reply as R;
        match self {
            Error::Connect(c) => match c {
                ConnectError::Resolve { .. } => R::HostUnreachable,
                ConnectError::Refused(_) => R::ConnectionRefused,
                ConnectError::Reset(_) => R::ConnectionRefused,
                ConnectError::NetUnreachable(_) => R::NetworkUnreachable,
                ConnectError::HostUnreachable(_) => R::HostUnreachable,
                ConnectError::Other { .. } => R::GeneralFailure,
                ConnectError::Timeout(_) => R::TtlExpired,
                ConnectError::Denied(_) => R::NotAllowed,
                ConnectError::Tls { .. } => R::GeneralFailure,
                ConnectError::Parent(p) => p.reply,
                ConnectError::NoParent(_) => R::GeneralFailure,
                ConnectError::NoEgress(_) => R::HostUnreachable,
                ConnectError::Bind { .. } => R::GeneralFailure,
            },
            Error::Timeout(Phase::Connect) => R::TtlExpired,
            Error::Through { source, .. } => source.socks5_reply(),
            Error::ParentRefused { .. } => R::ConnectionRefused,
            Error::Socks5(e) => e.reply(),
            Error::Socks4(_) => R::GeneralFailure,
            Error::BindStranger(_) => R::NotAllowed,
            Error::Unsupported(_) => R::CommandNotSupported,
            Error::BadRequest(_)
            | Error::BadRequestBody(_)
            | Error::Client(_)
            | Error::ClientTruncated
            | Error::ClientLeft(_)
            | Error::HandshakeTruncated
            | Error::Upstream(_)
            | Error::UpstreamClosed(_)
            | Error::BadResponse(_)
            | Error::BadResponseBody(_)
            | Error::BadUpgrade
            | Error::Timeout(_)
            | Error::Overloaded
            | Error::StateLost
            | Error::ShutdownDeadline
            | Error::LimitReached(_)
            | Error::AuthBusy
            | Error::AuthUnavailable => R::GeneralFailure,
            Error::AuthRequired(_)
            | Error::AuthParams(_)
            | Error::AuthNegotiate(_)
            | Error::AuthRateLimited
            | Error::ClientAddresses(_)
            | Error::UserCut(_)
            | Error::QuotaExceeded(_) => R::NotAllowed,
        }
    }
}

impl Error {
    /// The refusal this error is, for the metrics' `cause` label; None for failures.
    /// Exhaustive like the two mappings above, so that a new variant decides here too.
    pub(crate) fn refusal(&self) -> Option<Refused> {
        match self {
            Error::Connect(ConnectError::Denied(_)) => Some(Refused::Rule),
            Error::Connect(
                ConnectError::Resolve { .. }
                | ConnectError::Refused(_)
                | ConnectError::Reset(_)
                | ConnectError::NetUnreachable(_)
                | ConnectError::HostUnreachable(_)
                | ConnectError::Other { .. }
                | ConnectError::Timeout(_)
                | ConnectError::Tls { .. }
                | ConnectError::Parent(_)
                | ConnectError::NoParent(_)
                | ConnectError::NoEgress(_)
                | ConnectError::Bind { .. },
            ) => None,
            Error::AuthRequired(_)
            | Error::AuthParams(_)
            | Error::AuthNegotiate(_)
            | Error::AuthRateLimited
            | Error::UserCut(_) => Some(Refused::Auth),
            Error::LimitReached(_)
            | Error::Overloaded
            | Error::StateLost
            | Error::AuthBusy
            | Error::AuthUnavailable
            | Error::ClientAddresses(_)
            | Error::QuotaExceeded(_) => Some(Refused::Limit),
            Error::Through { source, .. } => source.refusal(),
            Error::BadRequest(_)
            | Error::Unsupported(_)
            | Error::BadRequestBody(_)
            | Error::Client(_)
            | Error::ClientTruncated
            | Error::ClientLeft(_)
            | Error::HandshakeTruncated
            | Error::BindStranger(_)
            | Error::Upstream(_)
            | Error::UpstreamClosed(_)
            | Error::BadResponse(_)
            | Error::BadResponseBody(_)
            | Error::BadUpgrade
            | Error::Timeout(_)
            | Error::Socks5(_)
            | Error::Socks4(_)
            | Error::ShutdownDeadline
            | Error::ParentRefused { .. } => None,
        }
    }

    /// Names the parent the bytes came through (`parent`: the last of the route's, for a
    /// connection through parents) in an error of the upstream side (its bytes or its
    /// silence), so that the client and the log know which hop failed.
    pub(crate) fn through(self, parent: Option<&str>) -> Error {
        let Some(parent) = parent else { return self };
        let upstream_side = matches!(
            self,
            Error::Upstream(_)
                | Error::UpstreamClosed(_)
                | Error::BadResponse(_)
                | Error::BadResponseBody(_)
                | Error::BadUpgrade
                | Error::Timeout(Phase::UpstreamHead | Phase::UpstreamBody)
        );
        if !upstream_side {
            return self;
        }
        Error::Through { parent: format!("\"{parent}\"").into(), source: Box::new(self) }
    }
}
