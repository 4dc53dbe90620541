//! rustle: a forward proxy. The binary (`main.rs`) is a thin shell over this library.
//!
//! The modules sit in folders named for their layers, from the top down; each imports only
//! from those below it (ARCHITECTURE.md draws them module by module):
//! - `run`: start-up, signals, reloads, takeovers, the worker threads, the admin endpoint
//!   and its users API, `rustle user`.
//! - `front`: the front ends (HTTP/1.1, HTTP/2, SOCKS, TCP and UDP relays), the exchange
//!   record's end and the connect step they share, tunnels, the per-worker context.
//! - `upstream`: the one way upstream: access check, route, pool, connections directly or
//!   through parent proxies.
//! - `policy`: users, routes, the compiled rules and the running listeners: what is
//!   allowed, which way.
//! - `telemetry`: the access log and the metrics.
//! - `io`: streams, buffers, body framing, the relay engine, TLS, the one `unsafe` module.
//! - `state`: quotas and their usage, kept across restarts (the `rustle-quota` thread),
//!   and the Redis client a fleet shares state through.
//! - `limits`, `error`: bandwidth and connection limits, the error type; shared by every
//!   layer above.
//! - `config`: the TOML configuration, its loading and checks.
//! - `acl`, `protocol`: the rule language (conditions, CIDR blocks, rule sets; pure) and
//!   the protocol names, below the configuration that embeds them.
//!
//! Protocol parsing lives in the `rustle-proto` crate, which does no I/O.

pub mod acl;
pub mod config;
pub(crate) mod error;
pub mod front;
pub mod io;
pub(crate) mod limits;
pub mod policy;
pub(crate) mod protocol;
pub mod run;
pub(crate) mod state;
pub(crate) mod telemetry;
pub mod upstream;
