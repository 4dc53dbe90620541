//! One hop through a parent proxy, from the client side: asks the proxy at the other end
//! of a stream for a tunnel to a destination (HTTP CONNECT, SOCKS5 CONNECT, SOCKS4a
//! CONNECT) or for a SOCKS5 UDP association, within one timeout.
//!
//! The stream is whatever reaches the parent: TCP, TLS to an `https` parent (made by the
//! caller), or a tunnel through the previous hop of a chain. The messages are the
//! `rustle-proto` codecs (`http::write_connect`, `socks5::client`, `socks4::client`);
//! this module only moves them. It reads nothing after the parent's reply except what
//! came in the same read, and hands those bytes back: they are the tunnel's first.
//!
//! [`HopError`] says why a hop failed in words that follow the caller's name for the
//! parent (`parent "corp" (127.0.0.1:3128) refused CONNECT: 407`), and maps to what
//! rustle's own client is told: an HTTP status and a SOCKS5 reply.
//!
//! Used only on routes through a parent; the direct path does not come here.

#[cfg(test)]
mod tests;

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use base64::Engine as _;
use rustle_proto::addr::{Address, Domain, Host};
use rustle_proto::http::{self, HeadError, Limits, Method, ResponseHead};
use rustle_proto::{socks4, socks5};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest reply head accepted from a parent. An answer to CONNECT is a status line
/// and a few fields (squid's 407 head is under 1 KiB); more than this is a broken or
/// hostile parent, refused before it makes the buffer grow.
pub(crate) const MAX_REPLY_HEAD: usize = 16 * 1024;

/// Room offered to each read: a SOCKS reply or a typical HTTP reply head, and whatever
/// the parent sent right behind it, arrive in one read.
const READ_CHUNK: usize = 4096;

/// How the parent is asked for a tunnel. An `https` parent is [`HopKind::Http`] over a
/// TLS stream the caller made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HopKind {
    /// `CONNECT host:port` (RFC 9110 9.3.6), credentials as `Proxy-Authorization: Basic`.
    Http,
    /// RFC 1928; credentials by RFC 1929 username/password; names resolved by the parent.
    Socks5,
    /// SOCKS4, with the 4a extension for names (resolved by the parent); the user name
    /// is sent as the USERID, the password is not sent.
    Socks4a,
}

impl HopKind {}

/// What rustle presents to a parent. `Debug` does not show the password.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Credentials<'a> {
    pub user: &'a str,
    pub password: &'a str,
}

impl fmt::Debug for Credentials<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Why a hop failed. Display continues a sentence that starts with the parent's name
/// (`parent "corp" (127.0.0.1:3128) ` + this), fit for a log line and a 502 body; it
/// never shows a password.
#[derive(Debug, thiserror::Error)]
pub enum HopError {
    /// An HTTP parent answered CONNECT with a status other than 2xx (407: it wants other
    /// credentials; 403: its rules refuse; 502/504: it could not reach the destination).
    #[error("refused CONNECT: {status}")]
    Refused { status: u16 },
    /// A SOCKS5 parent's reply code was not 0 (`code` as received, `reason` its
    /// meaning per RFC 1928 section 6).
    #[error("refused the SOCKS5 request: {reason} (reply {code})")]
    SocksRefused { code: u8, reason: &'static str },
    /// A SOCKS4a parent's reply code was not 0x5A.
    #[error("refused the SOCKS4a request: {reason} (reply {code:#04x})")]
    Socks4Refused { code: u8, reason: &'static str },
    /// A SOCKS5 parent rejected the username and password.
    #[error("rejected the username/password")]
    AuthFailed,
    /// A SOCKS5 parent accepted none of the offered methods: it wants credentials and
    /// none are configured, or a method rustle does not speak.
    #[error("accepted none of the offered authentication methods")]
    NoAcceptableMethod,
    /// The destination cannot be put in this kind of request (an IPv6 address to a
    /// SOCKS4a parent, a name that is not a host name, port 0). Nothing was sent.
    #[error("cannot be asked for {target}: {reason}")]
    Target { target: String, reason: String },
    /// The configured credentials cannot be sent by this protocol (empty, longer than
    /// 255 bytes, a ':' in an HTTP user name, a NUL in a SOCKS4 user id). Nothing was sent.
    #[error("cannot be sent the configured credentials: {0}")]
    Credentials(&'static str),
    /// The parent's reply broke its protocol.
    #[error("sent a malformed reply: {0}")]
    Malformed(String),
    /// The parent closed the connection before any byte of its reply.
    #[error("closed the connection before its reply")]
    Closed,
    /// The parent closed the connection in the middle of its reply.
    #[error("closed the connection in the middle of its reply (after {0} bytes)")]
    Truncated(usize),
    /// The whole exchange did not finish in time.
    #[error("did not answer in {}", Secs(*.0))]
    Timeout(Duration),
    /// Reading from or writing to the parent failed.
    #[error("connection failed: {0}")]
    Io(#[from] std::io::Error),
}

impl HopError {
    /// The HTTP status for rustle's client: 504 when the hop timed out (or the parent
    /// says it did: its own 504, SOCKS5 "TTL expired"), 502 for everything else. One
    /// exhaustive match: a new variant must decide here.
    pub(crate) fn status(&self) -> u16 {
        match self {
            HopError::Timeout(_) => 504,
            HopError::Refused { status: 504 } => 504,
            HopError::SocksRefused { code, .. } if *code == socks5::Reply::TtlExpired as u8 => 504,
            HopError::Refused { .. }
            | HopError::SocksRefused { .. }
            | HopError::Socks4Refused { .. }
            | HopError::AuthFailed
            | HopError::NoAcceptableMethod
            | HopError::Target { .. }
            | HopError::Credentials(_)
            | HopError::Malformed(_)
            | HopError::Closed
            | HopError::Truncated(_)
            | HopError::Io(_) => 502,
        }
    }

    /// The SOCKS5 reply for rustle's client. A SOCKS5 parent's named code is passed on;
    /// an HTTP parent's 403 is "not allowed", its 504 "TTL expired", other statuses
    /// "connection refused"; a timeout is "TTL expired" (as for a direct connect); a
    /// destination the hop cannot carry is "address type not supported"; credentials
    /// the parent refused, and a broken or vanished parent, are a general failure (the
    /// fault is rustle's configuration or the parent, not the client's request).
    pub fn socks5_reply(&self) -> socks5::Reply {
        use socks5::Reply as R;
        match self {
            HopError::Refused { status: 403 } => R::NotAllowed,
            HopError::Refused { status: 407 } => R::GeneralFailure,
            HopError::Refused { status: 504 } => R::TtlExpired,
            HopError::Refused { .. } => R::ConnectionRefused,
            HopError::SocksRefused { code, .. } => match R::from_code(*code) {
                Some(R::Succeeded) | None => R::GeneralFailure,
                Some(named) => named,
            },
            HopError::Socks4Refused { code, .. } => match socks4::Reply::from_code(*code) {
                Some(socks4::Reply::Rejected) => R::ConnectionRefused,
                _ => R::GeneralFailure,
            },
            HopError::Timeout(_) => R::TtlExpired,
            HopError::Target { .. } => R::AddressTypeNotSupported,
            HopError::AuthFailed
            | HopError::NoAcceptableMethod
            | HopError::Credentials(_)
            | HopError::Malformed(_)
            | HopError::Closed
            | HopError::Truncated(_)
            | HopError::Io(_) => R::GeneralFailure,
        }
    }

    /// Whether the parent itself failed (no answer in time, a broken reply, a broken
    /// connection), as opposed to answering with a refusal or being given something it
    /// cannot carry: the failures that count towards marking a parent down.
    pub(crate) fn parent_failed(&self) -> bool {
        match self {
            HopError::Malformed(_)
            | HopError::Closed
            | HopError::Truncated(_)
            | HopError::Timeout(_)
            | HopError::Io(_) => true,
            HopError::Refused { .. }
            | HopError::SocksRefused { .. }
            | HopError::Socks4Refused { .. }
            | HopError::AuthFailed
            | HopError::NoAcceptableMethod
            | HopError::Target { .. }
            | HopError::Credentials(_) => false,
        }
    }
}

/// A duration as `10s` or `250ms`.
struct Secs(Duration);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.subsec_millis() {
            0 => write!(f, "{}s", self.0.as_secs()),
            _ => write!(f, "{}ms", self.0.as_millis()),
        }
    }
}

/// Asks the proxy at the other end of `stream` for a tunnel to `host:port` (`host` a
/// name, an IPv4 address or an IPv6 address with or without brackets) and returns the
/// bytes the proxy sent after its reply, which belong to the tunnel (empty, without an
/// allocation, when there were none). The whole exchange is bounded by `timeout`.
/// `creds` go to the parent when given: HTTP Basic, SOCKS5 username/password (offered
/// alongside no authentication, the parent chooses), SOCKS4a USERID (the user only).
pub async fn tunnel<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    kind: HopKind,
    creds: Option<Credentials<'_>>,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<Vec<u8>, HopError> {
    let dst = destination(host, port)?;
    bounded(timeout, async {
        let mut hop = Hop { stream, buf: Vec::new() };
        match kind {
            HopKind::Http => hop.http_connect(&dst, creds).await?,
            HopKind::Socks5 => {
                hop.socks5(socks5::Command::Connect, &dst, creds).await?;
            }
            HopKind::Socks4a => hop.socks4a(&dst, creds).await?,
        }
        // The read buffer has room to spare; the tunnel keeps only the bytes.
        Ok(hop.buf.as_slice().to_vec())
    })
    .await
}

/// SOCKS5 UDP ASSOCIATE through a parent: asks the SOCKS5 proxy at the other end of
/// `stream` for a UDP relay, declaring `client_hint` as where datagrams will come from
/// (`0.0.0.0:0` when not known), and returns the relay address the parent gave. An
/// unspecified IP (`0.0.0.0`, `::`) means the address `stream` reached the parent on;
/// substituting it is the caller's. The association lasts as long as `stream` stays open.
pub async fn udp_associate<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    creds: Option<Credentials<'_>>,
    client_hint: SocketAddr,
    timeout: Duration,
) -> Result<SocketAddr, HopError> {
    let hint = Address::from(client_hint);
    bounded(timeout, async {
        let mut hop = Hop { stream, buf: Vec::new() };
        let reply = hop.socks5(socks5::Command::UdpAssociate, &hint, creds).await?;
        let Host::Ip(ip) = reply.bound.host else {
            let name = reply.bound.to_string();
            return Err(HopError::Malformed(format!("UDP relay named {name}, not an address")));
        };
        if reply.bound.port == 0 {
            return Err(HopError::Malformed("UDP relay on port 0".into()));
        }
        Ok(SocketAddr::new(ip, reply.bound.port))
    })
    .await
}

async fn bounded<T>(
    timeout: Duration,
    exchange: impl Future<Output = Result<T, HopError>>,
) -> Result<T, HopError> {
    tokio::time::timeout(timeout, exchange).await.unwrap_or(Err(HopError::Timeout(timeout)))
}

/// `host` (brackets around an IPv6 address optional) and `port` as the codecs take them.
fn destination(host: &str, port: u16) -> Result<Address, HopError> {
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let bad = |reason: &str| HopError::Target {
        target: format!("{host}:{port}"),
        reason: reason.to_string(),
    };
    if port == 0 {
        return Err(bad("port 0"));
    }
    let host = match bare.parse::<IpAddr>() {
        Ok(ip) => Host::Ip(ip),
        Err(_) => Host::Domain(Domain::new(bare.as_bytes()).ok_or_else(|| {
            bad("not a host name (empty, over 255 bytes, or a byte outside printable ASCII)")
        })?),
    };
    Ok(Address { host, port })
}

/// The stream to the parent and the bytes read from it that no message took yet.
struct Hop<'s, S> {
    stream: &'s mut S,
    buf: Vec<u8>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Hop<'_, S> {
    async fn send(&mut self, bytes: &[u8]) -> Result<(), HopError> {
        self.stream.write_all(bytes).await?;
        // A TLS stream holds written bytes until flushed.
        self.stream.flush().await?;
        Ok(())
    }

    /// Reads until `parse` finds a whole message at the start of the buffer; takes it out
    /// and leaves what follows for the next message (or the tunnel).
    async fn receive<T, E: fmt::Display>(
        &mut self,
        mut parse: impl FnMut(&[u8]) -> Result<Option<(T, usize)>, E>,
    ) -> Result<T, HopError> {
        loop {
            match parse(&self.buf) {
                Ok(Some((message, used))) => {
                    self.buf.drain(..used.min(self.buf.len()));
                    return Ok(message);
                }
                Ok(None) => {}
                Err(e) => return Err(HopError::Malformed(e.to_string())),
            }
            // The SOCKS parsers decide within a few hundred bytes and the HTTP parser
            // stops at its own limit; this only guards against a parser that never does.
            if self.buf.len() > MAX_REPLY_HEAD {
                return Err(HopError::Malformed(format!(
                    "reply longer than {MAX_REPLY_HEAD} bytes"
                )));
            }
            self.buf.reserve(READ_CHUNK);
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(match self.buf.len() {
                    0 => HopError::Closed,
                    n => HopError::Truncated(n),
                });
            }
        }
    }

    async fn http_connect(
        &mut self,
        dst: &Address,
        creds: Option<Credentials<'_>>,
    ) -> Result<(), HopError> {
        let basic = creds.map(basic).transpose()?;
        let mut request = Vec::with_capacity(128);
        http::write_connect(dst, basic.as_deref(), &mut request).map_err(|e| {
            let reason = match e {
                HeadError::InvalidHost => "not a host name an HTTP proxy accepts".to_string(),
                other => other.to_string(),
            };
            HopError::Target { target: dst.to_string(), reason }
        })?;
        self.send(&request).await?;
        let limits = Limits { max_head: MAX_REPLY_HEAD, ..Limits::default() };
        let mut head = ResponseHead::new();
        loop {
            let status = self
                .receive(|b| {
                    let parsed = http::parse_response(b, &limits, Method::Connect, &mut head)?;
                    Ok::<_, HeadError>(parsed.map(|()| (head.status, head.len)))
                })
                .await?;
            match status {
                101 => {
                    return Err(HopError::Malformed(
                        "101 Switching Protocols in answer to CONNECT".into(),
                    ))
                }
                // Interim responses (RFC 9110 15.2): the final one follows.
                100..=199 => continue,
                200..=299 => return Ok(()),
                status => return Err(HopError::Refused { status }),
            }
        }
    }

    /// Greeting, optional username/password, the request; the reply when it succeeded.
    async fn socks5(
        &mut self,
        command: socks5::Command,
        dst: &Address,
        creds: Option<Credentials<'_>>,
    ) -> Result<socks5::client::ServerReply, HopError> {
        use socks5::client::{self as c, Choice};
        let mut auth = Vec::new();
        if let Some(cr) = creds {
            c::write_credentials(cr.user.as_bytes(), cr.password.as_bytes(), &mut auth).map_err(
                |e| {
                    HopError::Credentials(match e {
                        socks5::Error::EmptyUser => "empty user name",
                        socks5::Error::EmptyPassword => "empty password",
                        socks5::Error::UserTooLong => "user name longer than 255 bytes",
                        socks5::Error::PasswordTooLong => "password longer than 255 bytes",
                        _ => "credentials RFC 1929 cannot carry",
                    })
                },
            )?;
        }
        self.send(c::greeting(creds.is_some())).await?;
        match self.receive(|b| c::parse_method(b, creds.is_some())).await? {
            Choice::NoAuth => {}
            Choice::UserPass => {
                self.send(&auth).await?;
                if !self.receive(c::parse_auth_status).await? {
                    return Err(HopError::AuthFailed);
                }
            }
            Choice::NoneAcceptable => return Err(HopError::NoAcceptableMethod),
        }
        let mut request = Vec::with_capacity(c::MAX_REQUEST);
        c::write_request(command, dst, &mut request);
        self.send(&request).await?;
        let reply = self.receive(c::parse_reply).await?;
        if !reply.succeeded() {
            return Err(HopError::SocksRefused { code: reply.code, reason: reply.reason() });
        }
        Ok(reply)
    }

    async fn socks4a(
        &mut self,
        dst: &Address,
        creds: Option<Credentials<'_>>,
    ) -> Result<(), HopError> {
        let user = creds.map_or(&b""[..], |c| c.user.as_bytes());
        let mut request = Vec::with_capacity(64);
        socks4::client::write_connect(dst, user, &mut request).map_err(|e| match e {
            socks4::Error::Ipv6Target => HopError::Target {
                target: dst.to_string(),
                reason: "SOCKS4a carries no IPv6 address".into(),
            },
            socks4::Error::NulInUser => HopError::Credentials("a NUL byte in the user name"),
            socks4::Error::UserTooLong => HopError::Credentials("user name longer than 255 bytes"),
            _ => HopError::Credentials("a user id SOCKS4 cannot carry"),
        })?;
        self.send(&request).await?;
        let reply = self.receive(socks4::client::parse_reply).await?;
        if !reply.granted() {
            return Err(HopError::Socks4Refused { code: reply.code, reason: reply.reason() });
        }
        Ok(())
    }
}

/// The RFC 7617 credentials, base64 of `user:password`. A user name with a ':' would
/// be split there by the parent, so it is refused.
fn basic(c: Credentials<'_>) -> Result<String, HopError> {
    if c.user.contains(':') {
        return Err(HopError::Credentials("a ':' in the user name (HTTP Basic ends it there)"));
    }
    let plain = format!("{}:{}", c.user, c.password);
    Ok(base64::engine::general_purpose::STANDARD.encode(plain))
}
