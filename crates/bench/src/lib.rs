//! Test and benchmark fixtures for rustle, and its load generator.
//!
//! Every fixture runs on its own OS thread with its own current-thread tokio
//! runtime, binds 127.0.0.1 port 0 unless given an address, exposes
//! `addr()`, counts what it served with atomics, and stops (closing its
//! listener and all connections) when dropped. Nothing is logged unless
//! `RUSTLE_BENCH_LOG=1` is set.
//!
//! Module map:
//! - [`origin`]  — `Origin`, the HTTP/1.1 origin on plain TCP (routes below).
//! - [`tls`]     — `TlsOrigin`, the same origin behind rustls with a throwaway CA.
//! - [`echo`]    — `TcpEcho` (echo + half-close) and `TcpServe` (answer after EOF).
//! - [`faulty`]  — `FaultyOrigin` (HTTP or raw: resets mid-body, closes before
//!   answering, splits its head byte by byte, drips, never reads, sends more than it
//!   announced) and `FaultyClient`/`Trickle`, the same faults from the client's side.
//! - [`udp`]     — `UdpEcho`, datagram echo.
//! - [`pattern`] — the deterministic body pattern and its checksums.
//! - [`ws`]      — WebSocket helpers (`accept_key`); the `/ws` echo itself.
//! - [`load`]    — the load generator (`rustle-bench load`): `load::run(&Options)
//!   -> Report`; submodules `cli`, `stats` (public), `plan`, `dial`,
//!   `response`, `ws`, `worker` (private).
//! - [`campaign`] — `rustle-bench campaign`: scenarios × proxies ×
//!   repetitions with CPU pinning, quota and namespaces, one CSV row a run;
//!   [`campaign::record`] is the row.
//! - [`floor`]   — `rustle-bench floor`: a bare TCP forwarder, the campaign's
//!   floor peer (what an exchange costs when a proxy does nothing but copy).
//! - [`cost`]    — `rustle-bench cost`: the cost guard, instructions,
//!   allocations and system calls per exchange of each family through a
//!   running rustle, and its memory at rest, against `bench/cost-baseline.toml`.
//! - [`radiusd`] — `Radiusd`: Debian's FreeRADIUS on free loopback ports, its own configuration,
//!   users and accounting detail file (the RADIUS backend's tests)
//! - [`kdc`] — `Kdc`: Debian's MIT krb5kdc for a throwaway realm, its keytab and `kinit`
//! - [`redis_server`] — `RedisServer`: Debian's redis-server on a free loopback port
//!   (plain or TLS), killed, restarted on its port or paused by the tests.
//! - [`callback`] — `AuthCallback`: the callback of rustle's `kind = "http"` auth backend
//!   (HTTP, or HTTPS requiring a client certificate), answering as the test says, counting
//!   calls and connections.
//! - [`slapd`]   — `Slapd`: Debian's OpenLDAP server on free loopback ports (LDAP and
//!   LDAPS), loaded with a test's LDIF, stopped and started again by the tests.
//! - [`tools`]   — the external programs the tests drive: a missing one fails the test
//!   with `RUSTLE_REQUIRE_TOOLS=1`, else skips it and the test binary ends with the count.
//! - [`report`]  — `rustle-bench report`: medians, markdown tables, SVG
//!   charts; [`report::stats`] holds the tested statistics.
//! - `fixture`   — thread/runtime harness shared by all fixtures (private).
//! - `conn`, `http`, `routes` — the transport-generic HTTP server (private),
//!   shared by `Origin` and `TlsOrigin`.
//!
//! Origin routes (any method unless noted; HEAD returns GET's head, no body):
//! - `/bytes/N` — N pattern bytes with Content-Length, streamed.
//! - `/chunked/N?size=K` — the same, chunked in K-byte chunks (default
//!   4096), with trailer `X-Trailer: done`.
//! - `/close/N` — the same, close-delimited (`Connection: close`).
//! - `POST|PUT /echo` — body echoed (Content-Length mirrored, else chunked);
//!   honours `Expect: 100-continue`. The echo streams while reading, so a
//!   client sending a body larger than the socket buffers must read
//!   concurrently (use `/sha256` for big uploads).
//! - `POST|PUT /sha256` — `text/plain` body `<hex sha256> <length>`.
//! - `/status/NNN` — that status (200..=599); 204/304 have no body.
//! - `/headers` — the raw request head as the body.
//! - `/delay/MS` — sleeps, then 200 `ok`.
//! - `/malformed/KIND` — see [`origin::malformed_response`].
//! - `/ws` — WebSocket echo with `Upgrade: websocket`, else 426.
//! - anything else — 404.

pub mod auth_servers;
pub mod callback;
pub mod campaign;
pub mod cost;
pub mod echo;
pub mod faulty;
pub mod floor;
pub mod kdc;
pub mod load;
pub mod origin;
pub mod pattern;
pub mod radiusd;
pub mod redis_server;
pub mod report;
pub mod slapd;
pub mod tls;
pub mod tools;
pub mod udp;
pub mod ws;

mod conn;
mod date;
mod fixture;
mod http;
mod routes;

pub use callback::{AuthCallback, CallbackTls, Reply};
pub use echo::{TcpEcho, TcpServe};
pub use faulty::{Fault, FaultyClient, FaultyOrigin, Speak};
pub use origin::Origin;
pub use tls::TlsOrigin;
pub use udp::UdpEcho;
