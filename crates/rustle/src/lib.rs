//! rustle: a forward proxy. The binary (`main.rs`) is a thin shell over this library.
//!
//! Modules, from the outside in:
//! - `config`: the TOML configuration, its defaults and checks.
//! - `server`: binds listeners, starts workers (one current-thread runtime per core),
//!   hands each accepted connection to its front end, shutdown.
//! - `worker`: the per-thread context every connection task shares (policy, pool, log,
//!   buffers, limits); it imports no front end.
//! - `reload`: what SIGHUP (the configuration again) and SIGUSR1 (the access log) change.
//! - `http1`: a client's HTTP/1.1 connection: request heads, errors, dispatch.
//! - `dispatch`: from an accepted connection to its front end: HTTP/1.1 or h2c, TLS then
//!   HTTP/1.1 or HTTP/2 by ALPN, and the `auto` port's first-byte detection.
//! - `idle`: kept-alive connections waiting for a request, ended by the worker's tick.
//! - `http1/forward`: one absolute-form request to its origin and the response back.
//! - `exchange`: the upstream side of an exchange every front end shares: writes, the
//!   response head, the watch on a client that may leave.
//! - `http2`: HTTP/2 clients (h2c, and ALPN h2): requests, CONNECT and WebSocket streams.
//! - `http1/connect`: CONNECT tunnels.
//! - `socks`: SOCKS4/4a/5 handshakes, CONNECT and BIND; protocol detection for `auto`.
//! - `udp`: SOCKS5 UDP ASSOCIATE and the UDP port relay.
//! - `portmap`: the TCP port relay.
//! - `conn`: a connection's stream, plain TCP or TLS, and its halves.
//! - `body`: streaming bodies by their framing (length, chunked, until close).
//! - `relay`: the relay engine: bytes both ways, no buffer while idle, splice when bulk.
//! - `tunnel`: detached relay tasks that take over established tunnels.
//! - `tls`: certificates and keys from PEM files, server configs with SNI, self-signed sets.
//! - `sys`: the one unsafe module: pipes and splice(2).
//! - `upstream`: name cache, Happy Eyeballs, the pool of idle origin connections.
//! - `hop`: one hop through a parent proxy (HTTP CONNECT, SOCKS5, SOCKS4a), client side.
//! - `route`: parents, groups and routes compiled: which way a request goes, which parent
//!   a hop takes, each parent's health (pure, no I/O).
//! - `buf`: the read buffer heads are parsed in.
//! - `accesslog`: one line per request or tunnel.
//! - `error`: the error type and what each error tells the client.
//!
//! Protocol parsing lives in the `rustle-proto` crate, which does no I/O.

pub mod accesslog;
pub mod acl;
pub mod auth;
pub mod body;
pub mod buf;
pub mod config;
pub mod conn;
pub mod dispatch;
pub mod error;
pub mod exchange;
pub mod hop;
pub mod http1;
pub mod http2;
pub mod idle;
pub mod limits;
pub mod policy;
pub mod portmap;
pub mod relay;
pub mod reload;
pub mod route;
pub mod server;
pub mod socks;
pub mod sys;
pub mod tls;
pub mod tunnel;
pub mod udp;
pub mod upstream;
pub mod worker;
