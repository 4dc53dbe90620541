//! `rustle-bench auth-servers`: the authentication backends' fixtures in the foreground, for
//! benchmarks driven by a script (`bench/auth-cost.sh`). It starts those asked for on
//! loopback, prints one line per backend with what a configuration needs, then `ready`,
//! and keeps them up until SIGTERM, SIGINT or the end of its standard input; the servers
//! (slapd, freeradius) are then killed by their process ids, as their fixtures do on drop.
//!
//! ```text
//! http http://127.0.0.1:PORT/check           (alice/secret: allowed, group staff; else 404)
//! ldap ldap://127.0.0.1:PORT                 (slapd::PEOPLE: alice/wonderland, groups admins, staff)
//! radius 127.0.0.1:PORT SECRET_FILE          (alice/wonderland, Filter-Id staff)
//! ready
//! ```

use std::io::Write as _;
use std::net::SocketAddr;

use anyhow::{bail, Context, Result};

use crate::radiusd::Radiusd;
use crate::slapd::{Slapd, PEOPLE};
use crate::{AuthCallback, Reply};

/// The authentication backends (HTTP callback, LDAP, RADIUS) on loopback, for scripted
/// benchmarks.
///
/// Starts those asked for, prints one line per backend (`http URL`, `ldap URL`, `radius
/// ADDR SECRET_FILE`) then `ready`, and runs until SIGTERM, SIGINT or its standard input
/// closes.
///
/// Users: http alice/secret (group staff; anyone else 404), ldap and radius
/// alice/wonderland (group staff).
#[derive(clap::Parser, Debug)]
#[command(name = "auth-servers", args_override_self = true)]
pub struct Args {
    /// The HTTP callback of rustle's `kind = "http"` backend, on ADDR (127.0.0.1:0 for a
    /// free port).
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// slapd (OpenLDAP) on a free port.
    #[arg(long)]
    pub ldap: bool,
    /// FreeRADIUS on free ports.
    #[arg(long)]
    pub radius: bool,
}

/// The RADIUS users file: alice in the group `staff` (Filter-Id).
const RADIUS_USERS: &str = "alice\tCleartext-Password := \"wonderland\"\n\tFilter-Id = \"staff\"\n";

/// alice with the password `secret` is allowed, in the group `staff`; anything else 404.
fn answer(body: &serde_json::Value) -> Reply {
    let alice = body["user"].as_str() == Some("alice");
    if alice && body["password"].as_str() == Some("secret") {
        Reply::ok(r#"{"allow": true, "groups": ["staff"]}"#)
    } else {
        Reply::status(404)
    }
}

pub fn main(args: Args) -> Result<()> {
    let Args { http, ldap, radius } = args;
    if http.is_none() && !ldap && !radius {
        bail!("no backend asked for (--http ADDR, --ldap, --radius)");
    }
    // Held until the end: dropping them stops the servers.
    let mut running: Vec<Box<dyn std::any::Any>> = Vec::new();
    let mut out = std::io::stdout().lock();
    if let Some(addr) = http {
        let cb = AuthCallback::start_on(addr, answer).context("starting the callback")?;
        writeln!(out, "http {}", cb.url())?;
        running.push(Box::new(cb));
    }
    if ldap {
        let Some(s) = Slapd::start(PEOPLE) else { bail!("slapd or ldapadd is missing") };
        writeln!(out, "ldap {}", s.url())?;
        running.push(Box::new(s));
    }
    if radius {
        let Some(r) = Radiusd::start(RADIUS_USERS) else { bail!("freeradius is missing") };
        writeln!(out, "radius 127.0.0.1:{} {}", r.auth_port(), r.secret_file().display())?;
        running.push(Box::new(r));
    }
    writeln!(out, "ready")?;
    out.flush()?;
    drop(out);
    wait()
}

/// Until SIGTERM, SIGINT or the end of standard input.
fn wait() -> Result<()> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = tx.send(());
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
            _ = rx => {}
        }
        Ok(())
    })
}
