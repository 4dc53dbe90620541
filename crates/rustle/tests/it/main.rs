//! Integration tests of the rustle proxy (HTTP, SOCKS4/4a/5, TCP and UDP relays): real
//! clients (curl, wget, ncat, reqwest and raw sockets) against in-process origin fixtures
//! from `rustle-bench`, through a proxy started in-process (or, for signals and flags, the
//! real binary); squid and dante, started as child processes, serve as parent proxies.
//!
//! Everything binds 127.0.0.1 port 0; every test starts its own proxy and origins, so tests
//! run in parallel without sharing state.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

mod accesslog;
mod addrs;
mod auth;
mod auth_chain;
mod auth_http;
mod auth_kerberos;
mod auth_ldap;
mod auth_radius;
mod connect;
mod dns;
mod egress;
mod engine;
mod errors;
mod faults;
mod faulty;
mod fleet;
mod forwarding;
mod hop;
mod http;
mod http2;
mod kernel;
mod layers;
mod lifecycle;
mod limits;
mod loadgen;
mod metrics;
mod packaging;
mod params;
mod parents;
mod pool;
mod proxy_protocol;
mod quota;
mod quota_fleet;
mod relay;
mod rules;
mod socks;
mod startup;
mod tls;
mod udp;
mod upgrade;
mod users;
mod vetting;
mod websocket;
