//! I/O-free HTTP/1.1 codecs for the rustle forward proxy.
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
//!   `http::write_response`).
//!   - `http/target.rs`: request-target forms (absolute, authority, origin, `*`).
//!   - `http/fields.rs`: per-field checks (Content-Length, Transfer-Encoding,
//!     Connection, Host, Max-Forwards).
//!   - `http/parse.rs`: the head parsers and error diagnosis.
//!   - `http/write.rs`: the head writers (hop-by-hop stripping, Via, XFF, ...).
//!   - `http/error.rs`: [`http::HeadError`].
//! - [`chunked`]: a validating pass-through scanner for chunked bodies that
//!   finds where a body ends without copying or decoding it.
//!
//! Hot-path rules: no per-request heap allocation except caller-owned `Vec`s
//! that are cleared and reused; everything refers back to the caller's buffer
//! through [`http::Span`]s.

pub mod chunked;
pub mod http;
