//! rustle: a forward proxy. The binary (`main.rs`) is a thin shell over this library.
//!
//! Modules, from the outside in:
//! - `config`: the TOML configuration, its defaults and checks.
//! - `server`: workers (one current-thread runtime per core), listeners, shutdown.
//! - `reload`: what SIGHUP (the configuration again) and SIGUSR1 (the access log) change.
//! - `http1`: a client's HTTP/1.1 connection: request heads, errors, dispatch.
//! - `https`: TLS from clients: the HTTPS proxy port, TLS on `auto` ports and relays.
//! - `idle`: kept-alive connections waiting for a request, ended by the worker's tick.
//! - `forward`: one absolute-form request to its origin and the response back.
//! - `http2`: HTTP/2 clients (h2c, and ALPN h2): requests, CONNECT and WebSocket streams.
//! - `connect`: CONNECT tunnels.
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
pub mod connect;
pub mod error;
pub mod forward;
pub mod http1;
pub mod http2;
pub mod https;
pub mod idle;
pub mod limits;
pub mod park;
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
