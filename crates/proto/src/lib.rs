//! I/O-free HTTP/1.1 and SOCKS codecs for the rustle forward proxy.
//!
//! Nothing in this crate reads or writes sockets: callers hand in the bytes
//! they have buffered and get back byte spans, framing decisions and
//! rewritten heads. This keeps the parsing rules testable in isolation and
//! lets the proxy choose its own I/O strategy (plain copies, splice, ...).
//!
//! Modules:
//! - [`http`]: request/response head parsing on top of `httparse`, with the
//!   extra RFC 9112 strictness checks that defend against request smuggling
//!   (`http::parse_request`, `http::parse_response`), and the writers that
//!   produce the heads forwarded upstream/downstream (`http::write_request`,
//!   `http::write_response`) and the CONNECT sent to a parent proxy
//!   (`http::write_connect`).
//!   - `http/target.rs`: request-target forms (absolute, authority, origin, `*`).
//!   - `http/fields.rs`: per-field checks (Content-Length, Transfer-Encoding,
//!     Connection, Host, Max-Forwards).
//!   - `http/parse.rs`: the head parsers and error diagnosis.
//!   - `http/write.rs`: the head writers (hop-by-hop stripping, Via, XFF, ...).
//!   - `http/h2.rs`: the same rules for HTTP/2 clients: a request's fields written as
//!     the HTTP/1.1 head (`http::write_h2_request`), a response head read as HTTP/2
//!     fields (`http::h2_response_fields`), trailers between the two.
//!   - `http/error.rs`: [`http::HeadError`].
//! - [`chunked`]: a validating pass-through scanner for chunked bodies that
//!   finds where a body ends without copying or decoding it, and which bytes
//!   not to forward (trailer fields that must not be trailers; all framing
//!   when de-chunking).
//! - [`addr`]: destinations as SOCKS clients name them ([`addr::Address`]:
//!   an IP or an inline, validated [`addr::Domain`], plus a port).
//! - [`socks4`]: SOCKS4/4a request parser and reply writer; `socks4::client`,
//!   the other side (CONNECT writer, reply parser) for a SOCKS4a parent.
//! - [`socks5`]: SOCKS5 (RFC 1928) greeting, request and reply codecs, the
//!   RFC 1929 username/password sub-negotiation, and the UDP ASSOCIATE
//!   datagram header; `socks5::client`, the other side for a SOCKS5 parent.
//! - [`proxy_protocol`]: the PROXY protocol v1/v2 header a load balancer puts
//!   before a connection (parser, and writers for relay targets).
//! - [`detect`]: picks SOCKS4, SOCKS5, HTTP or TLS from a client's first
//!   bytes, for mixed listeners.
//!
//! The SOCKS handshake parsers share one contract: `Ok(None)` means "need
//! more bytes" (never an error for a merely short buffer),
//! `Ok(Some((value, consumed)))` a complete message, and an error (which
//! knows the protocol reply to send) as soon as the input cannot be valid.
//!
//! Hot-path rules: no per-request heap allocation except caller-owned `Vec`s
//! that are cleared and reused; everything refers back to the caller's buffer
//! through [`http::Span`]s.

/// The largest body length (Content-Length) or chunk size accepted: 2^53 - 1, 8 PiB,
/// far beyond any body a proxy passes on. It is where the numbers stop being exact in
/// an IEEE double, which is what HTTP implementations in JavaScript and Lua keep them
/// in: past it, a next hop may round a length and end the message elsewhere than the
/// proxy did, which is how requests get smuggled.
pub const MAX_LENGTH: u64 = (1 << 53) - 1;

pub mod addr;
#[cfg(any(test, feature = "check"))]
#[doc(hidden)]
pub mod check;
pub mod chunked;
pub mod detect;
pub mod http;
pub mod proxy_protocol;
pub mod socks4;
pub mod socks5;

#[cfg(test)]
mod props;
