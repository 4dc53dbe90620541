//! rustle: a forward proxy. The binary (`main.rs`) is a thin shell over this library.
//!
//! Modules, from the top down (each depends only on those below it; ARCHITECTURE.md
//! draws the layers):
//! - `check`: every problem of a configuration at once (`rustle check`, start-up): the
//!   file's, the files it names, the names its rules use.
//! - `reload`: the signal loop; what SIGHUP (the whole configuration again) and SIGUSR1
//!   (the access log) change.
//! - `takeover`: the control socket a `rustle --takeover` takes the listening sockets
//!   over by, and systemd's socket activation.
//! - `control`: the control socket's other requests: `reload` (`rustle reload`) and the
//!   running listeners' protections, which a takeover compares before it takes over.
//! - `server`: binds listeners (or takes inherited ones), starts workers (one
//!   current-thread runtime per core), hands each accepted connection to `dispatch`,
//!   runs the parents' health probes, and puts a reload's listeners and settings in
//!   force in every worker.
//! - `admin`: the admin endpoint (`/metrics`, `/healthz`, `/readyz`) on a thread of its
//!   own; only `server` starts it.
//! - `dispatch`: from an accepted connection to its front end: HTTP/1.1 or h2c, TLS then
//!   HTTP/1.1 or HTTP/2 by ALPN, and the `auto` port's first-byte detection.
//! - Front ends: `http1` (with `http1/forward`, absolute-form requests, and
//!   `http1/connect`, CONNECT tunnels), `http2` (requests, CONNECT and WebSocket
//!   streams), `socks` (SOCKS4/4a/5 handshakes, CONNECT, BIND, and `socks/udp`, UDP
//!   ASSOCIATE), `portmap` (the TCP port relay), `udp` (the UDP port relay).
//! - `exchange`: what every front end shares about an exchange: the connect step, writes,
//!   the response head, the retry of a dead pooled connection, the watch on a client that
//!   may leave, and its end (traffic, metrics, log line, from one `accesslog::Record`).
//! - `tunnel`: detached relay tasks that take over established tunnels; `tunnel/park`
//!   takes idle ones off the event loop.
//! - `worker`: the per-thread context every connection task shares (policy, pool, log,
//!   buffers, limits); it imports no front end.
//! - `upstream`: the one upstream layer: access check, route, pool, TLS origination,
//!   connections through parents (`upstream/parents`), name cache, Happy Eyeballs.
//! - `hop`: one hop through a parent proxy (HTTP CONNECT, SOCKS5, SOCKS4a), client side.
//! - `route`: parents, groups and routes compiled: which way a request goes, which parent
//!   a hop takes, each parent's health (pure, no I/O).
//! - `policy`, `acl`, `auth`, `limits`: what is allowed, to whom, how much.
//! - `metrics`: per-worker counters (no lock, no read-modify-write atomic), summed and
//!   written as Prometheus text when the admin endpoint is scraped.
//! - `idle`: kept-alive connections waiting for a request, ended by the worker's tick.
//! - `conn`: a connection's stream, plain TCP or TLS, and its halves.
//! - `body`: streaming bodies by their framing (length, chunked, until close).
//! - `relay`: the relay engine: bytes both ways, no buffer while idle, splice when bulk.
//! - `tls`: certificates and keys from PEM files, server configs with SNI, self-signed
//!   sets, the server side of handshakes.
//! - `accesslog`: one record and one line per request or tunnel, and the label it keeps.
//! - `protocol`: the one protocol enum the rules, the log and the metrics share.
//! - `buf`: the read buffer heads are parsed in.
//! - `error`: the error type and what each error tells the client.
//! - `config`: the TOML configuration, its defaults and checks.
//! - `notify`: readiness, reloads and stopping said to systemd (`$NOTIFY_SOCKET`).
//! - `privileges`: running as `user`/`group` once the listeners are bound.
//! - `sys`: the one unsafe module: pipes and splice(2), descriptors passed by other
//!   processes.
//!
//! Protocol parsing lives in the `rustle-proto` crate, which does no I/O.

pub mod config;
pub(crate) mod error;
pub mod front;
pub mod io;
pub(crate) mod limits;
pub mod policy;
pub(crate) mod protocol;
pub mod run;
pub(crate) mod telemetry;
pub mod upstream;
