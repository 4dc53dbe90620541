//! `rustle-bench`: runs fixtures in the foreground for manual tests/scripts.
//!
//! ```text
//! rustle-bench origin   [--listen ADDR] [--tls [--ca-out FILE] [--stats FILE] [--tickets] [--kx x25519]]
//! rustle-bench tcp-echo [--listen ADDR]
//! rustle-bench udp-echo [--listen ADDR]
//! rustle-bench load     --target HOST:PORT [--mode M] [...]   (see `load --help`)
//! rustle-bench campaign [...]                      (see `campaign --help`)
//! rustle-bench report   --in DIR [...]             (see `report --help`)
//! rustle-bench cost     [--write] [...]            (see `cost --help`)
//! rustle-bench auth-servers [--http ADDR] [--ldap] [--radius]   (auth backends, for scripts)
//! ```
//! The fixtures run until SIGTERM or ctrl-c; `load` runs for its duration and
//! prints its report (one JSON object with `--json`).

use std::net::SocketAddr;

use anyhow::{bail, Context, Result};
use rustle_bench::load;
use rustle_bench::tls::TlsOriginOptions;
use rustle_bench::{Origin, TcpEcho, TlsOrigin, UdpEcho};

const USAGE: &str = "usage: rustle-bench <origin [--tls] | tcp-echo | udp-echo> [--listen ADDR]\n\
                     \x20      origin --tls also takes: --ca-out FILE (copy of the CA), --stats FILE\n\
                     \x20        (connections, resumed handshakes, requests; rewritten every 100 ms),\n\
                     \x20        --tickets (stateless session tickets), --kx x25519 (X25519 only)\n\
                     \x20      rustle-bench load --target HOST:PORT [options] (load --help)\n\
                     \x20      rustle-bench floor LISTEN TARGET [--http] (a forwarder that only copies;\n\
                     \x20        --http: and rewrites every HTTP head with rustle's codec)\n\
                     \x20      rustle-bench campaign [options] (campaign --help)\n\
                     \x20      rustle-bench report --in DIR [options] (report --help)\n\
                     \x20      rustle-bench cost [--write] [options] (cost --help: the cost guard)\n\
                     \x20      rustle-bench auth-servers [--http ADDR] [--ldap] [--radius]\n\
                     \x20        (authentication backends for benchmarks: auth-servers --help)";

/// Errors are printed as one line of causes (`{:#}`), not with Debug: no backtrace for a
/// mistyped argument.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rustle-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let Some(cmd) = args.next() else { bail!(USAGE) };
    match cmd.as_str() {
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            return Ok(());
        }
        "load" => return run_load(args),
        "campaign" => return rustle_bench::campaign::main(args),
        "report" => return rustle_bench::report::main(args),
        "cost" => return rustle_bench::cost::main(args),
        "auth-servers" => return rustle_bench::auth_servers::main(args),
        "floor" => {
            let rest: Vec<String> = args.collect();
            if rest.iter().any(|a| a == "-h" || a == "--help") {
                println!("{USAGE}");
                return Ok(());
            }
            let mut args = rest.into_iter();
            let (Some(listen), Some(target)) = (args.next(), args.next()) else { bail!(USAGE) };
            let http = match args.next().as_deref() {
                None => false,
                Some("--http") => true,
                Some(other) => bail!("floor: unknown option {other:?}\n{USAGE}"),
            };
            let listen = listen.parse().with_context(|| format!("bad address {listen:?}"))?;
            let target = target.parse().with_context(|| format!("bad address {target:?}"))?;
            return rustle_bench::floor::Floor::bind(listen)?.http(http).run(target);
        }
        _ => {}
    }
    let mut listen: SocketAddr = "127.0.0.1:0".parse().context("default address")?;
    let mut tls = false;
    let (mut ca_out, mut stats, mut options) = (None, None, TlsOriginOptions::default());
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--ca-out" => ca_out = Some(args.next().context("--ca-out needs a file")?),
            "--stats" => stats = Some(args.next().context("--stats needs a file")?),
            "--tickets" => options.tickets = true,
            "--kx" => match args.next().as_deref() {
                Some("x25519") => options.x25519_only = true,
                Some("default") => options.x25519_only = false,
                v => bail!("--kx default|x25519, not {v:?}"),
            },
            "--listen" => {
                let v = args.next().context("--listen needs an address")?;
                listen = v.parse().with_context(|| format!("bad address {v:?}"))?;
            }
            "--tls" => tls = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    // The handle must stay alive until the signal: dropping it stops the fixture.
    let _running: Box<dyn std::any::Any> = match (cmd.as_str(), tls) {
        ("origin", false) => {
            let o = Origin::start_on(listen)?;
            println!("listening on http://{}", o.addr());
            Box::new(o)
        }
        ("origin", true) => {
            let o = std::sync::Arc::new(TlsOrigin::start_with_options(listen, options)?);
            if let Some(f) = &ca_out {
                std::fs::write(f, o.ca_pem()).with_context(|| format!("writing {f}"))?;
            }
            if let Some(f) = stats {
                let o = std::sync::Arc::clone(&o);
                std::thread::spawn(move || write_stats(&o, &f));
            }
            println!("listening on https://{} (CA: {})", o.addr(), o.ca_file().display());
            Box::new(o)
        }
        ("tcp-echo", _) => {
            let e = TcpEcho::start_on(listen)?;
            println!("tcp echo on {}", e.addr());
            Box::new(e)
        }
        ("udp-echo", _) => {
            let e = UdpEcho::start_on(listen)?;
            println!("udp echo on {}", e.addr());
            Box::new(e)
        }
        _ => bail!(USAGE),
    };
    wait_for_signal()
}

/// Rewrites `file` (through a rename, so a reader never sees half of it)
/// with the origin's counters every 100 ms, until the process ends.
fn write_stats(o: &TlsOrigin, file: &str) {
    let tmp = format!("{file}.tmp");
    loop {
        let text = format!(
            "connections {}\nresumed {}\nrequests {}\n",
            o.connections(),
            o.resumed(),
            o.requests()
        );
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, file);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

fn wait_for_signal() -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r?,
            _ = term.recv() => {}
        }
        Ok(())
    })
}

fn run_load(args: impl Iterator<Item = String>) -> Result<()> {
    let Some(opts) =
        load::cli::parse(args).map_err(|e| anyhow::anyhow!("{e:#}\n{}", load::cli::USAGE))?
    else {
        println!("{}", load::cli::USAGE);
        return Ok(());
    };
    let report = load::run(&opts)?;
    if opts.json {
        println!("{}", report.to_json());
    } else {
        println!("{}", report.human());
    }
    Ok(())
}
