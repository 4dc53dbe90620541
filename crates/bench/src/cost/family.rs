//! The families of exchange the guard measures, the rustle configuration
//! each runs against, and the load that drives it.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::load::{self, Mode, Options};

/// The listener a family goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Listener {
    /// `kind = "http"`.
    Http,
    /// `kind = "http"`, `h2c = true`.
    H2c,
    Socks,
    /// `kind = "relay"` to the origin with `[listener.tls]`: TLS from the
    /// client terminated, plain TCP on.
    TlsRelay,
    /// `kind = "http"` with a route that sends every connection from a
    /// random address of 127.0.0.0/8 (`bind`): every loopback address is
    /// local, so rotation needs no set-up.
    HttpBind,
}

impl Listener {
    /// The kind rustle's "listening on" line names.
    pub(super) fn kind(self) -> &'static str {
        match self {
            Listener::Http | Listener::H2c | Listener::HttpBind => "http",
            Listener::Socks => "socks",
            Listener::TlsRelay => "relay",
        }
    }
}

/// One family: what an exchange is, and how many are measured.
#[derive(Debug, Clone, Copy)]
pub(super) struct Family {
    pub name: &'static str,
    /// One line for the report and the baseline file.
    pub what: &'static str,
    pub listener: Listener,
    pub mode: Mode,
    /// A new connection (tunnel, TLS session) per exchange.
    pub close: bool,
    /// Exchanges before the window: pools, caches and buffers reach their
    /// steady state, the TLS client holds tickets.
    pub warmup: u64,
    /// Exchanges in the window. Enough that what the window pays once (a
    /// 100 ms housekeeping tick, the 10 s address refresh if it falls in)
    /// is well under 1 % per exchange, few enough that a TLS window under
    /// callgrind takes a couple of seconds.
    pub count: u64,
}

pub(super) const FAMILIES: [Family; 6] = [
    Family {
        name: "http-keepalive",
        what: "HTTP/1.1 proxy: GET http://origin/bytes/1024 on one kept-alive connection",
        listener: Listener::Http,
        mode: Mode::HttpProxy,
        close: false,
        warmup: 200,
        count: 2000,
    },
    Family {
        name: "http-close",
        what: "HTTP/1.1 proxy: the same GET on a new connection each (Connection: close)",
        listener: Listener::Http,
        mode: Mode::HttpProxy,
        close: true,
        warmup: 100,
        count: 1000,
    },
    Family {
        name: "connect",
        what: "a CONNECT tunnel each, the GET inside it, closed by the origin",
        listener: Listener::Http,
        mode: Mode::Connect,
        close: true,
        warmup: 100,
        count: 1000,
    },
    Family {
        name: "socks5",
        what:
            "a SOCKS5 tunnel each (no auth, IPv4 target), the GET inside it, closed by the origin",
        listener: Listener::Socks,
        mode: Mode::Socks5,
        close: true,
        warmup: 100,
        count: 1000,
    },
    Family {
        name: "h2-stream",
        what: "HTTP/2 (h2c, prior knowledge): a stream each, the GET proxied, on one connection",
        listener: Listener::H2c,
        mode: Mode::H2c,
        close: false,
        warmup: 100,
        count: 1000,
    },
    Family {
        name: "tls-resumed",
        what: "TLS relay: a connection each, a TLS 1.3 handshake resuming a session \
               (rustls client, its default groups), the GET inside, closed by the origin",
        listener: Listener::TlsRelay,
        mode: Mode::HttpsRelay,
        close: true,
        warmup: 20,
        count: 200,
    },
];

/// Families measured only when `--only` names them, with no baseline: their
/// figures are printed to set beside a baseline family's of the same run.
pub(super) const EXTRA: [Family; 1] = [Family {
    name: "connect-bind",
    what: "`connect` through a route with bind = \"127.0.0.0/8\": each tunnel from a \
           random loopback address (IP_FREEBIND), never pooled; compare with `connect`",
    listener: Listener::HttpBind,
    mode: Mode::Connect,
    close: true,
    warmup: 100,
    count: 1000,
}];

/// Whether `name` is one of the [`EXTRA`] families.
pub(super) fn is_extra(name: &str) -> bool {
    EXTRA.iter().any(|f| f.name == name)
}

/// The family named `name`.
pub(super) fn named(name: &str) -> Result<&'static Family> {
    match FAMILIES.iter().chain(EXTRA.iter()).find(|f| f.name == name) {
        Some(f) => Ok(f),
        None => bail!("no family {name:?}; the families: {}", names()),
    }
}

pub(super) fn names() -> String {
    FAMILIES.map(|f| f.name).join(", ")
}

/// The configuration file of the rustle a family runs against: one worker,
/// one listener on a port of the kernel's choice, access log and kernel TLS
/// off (the figures are rustle's own work, the same on every kernel), its
/// control socket in `dir`.
pub(super) fn config(listener: Listener, origin: SocketAddr, dir: &Path) -> String {
    let mut c = String::from("workers = 1\n\n[[listener]]\n");
    c.push_str(&format!("kind = \"{}\"\nlisten = \"127.0.0.1:0\"\n", listener.kind()));
    match listener {
        Listener::H2c => c.push_str("h2c = true\n"),
        Listener::TlsRelay => c.push_str(&format!(
            "target = \"{origin}\"\n[listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            dir.join("certs/localhost.pem").display(),
            dir.join("certs/localhost.key").display()
        )),
        Listener::HttpBind => {
            c.push_str("\n[[route]]\nname = \"rotate\"\nvia = \"direct\"\nbind = \"127.0.0.0/8\"\n")
        }
        Listener::Http | Listener::Socks => {}
    }
    c.push_str(&format!(
        "\n[log]\naccess = \"off\"\n\n[tls]\nktls = \"off\"\n\n[process]\ncontrol_socket = \"{}\"\n",
        dir.join("control.sock").display()
    ));
    c
}

/// The load of `count` exchanges of `f` through `proxy`: one connection, one
/// thread, so that every exchange goes the same way.
pub(super) fn load(
    f: &Family,
    proxy: SocketAddr,
    origin: SocketAddr,
    count: u64,
    dir: &Path,
) -> Options {
    let mut o = Options::new(f.mode, origin.to_string());
    o.proxy = Some(proxy.to_string());
    o.connections = 1;
    o.threads = 1;
    o.count = Some(count);
    o.close = f.close;
    // Under callgrind an exchange takes about 50 times as long.
    o.timeout = Duration::from_secs(60);
    if f.listener == Listener::TlsRelay {
        o.ca = Some(dir.join("certs/ca.pem"));
        o.sni = Some("localhost".into());
    }
    o
}

/// Runs `o` and checks that every exchange completed.
pub(super) fn run(f: &Family, o: &Options) -> Result<()> {
    let r = load::run(o)?;
    let want = o.count.unwrap_or_default();
    if r.errors.total() > 0 || r.completed != want {
        bail!("{}: {} of {want} exchanges completed: {}", f.name, r.completed, r.human());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn configurations_parse_as_toml_with_one_listener() {
        let origin: SocketAddr = "127.0.0.1:9".parse().unwrap();
        for f in FAMILIES.iter().chain(EXTRA.iter()) {
            let text = config(f.listener, origin, Path::new("/t"));
            let t: toml::Table = text.parse().unwrap();
            let l = t["listener"].as_array().unwrap();
            assert_eq!(l.len(), 1, "{text}");
            assert_eq!(l[0]["kind"].as_str(), Some(f.listener.kind()));
            assert_eq!(t["log"]["access"].as_str(), Some("off"));
        }
        assert!(named("socks5").is_ok() && named("connect-bind").is_ok());
        assert!(is_extra("connect-bind") && !is_extra("connect"));
        assert!(named("nope").unwrap_err().to_string().contains("http-keepalive"));
    }
}
