//! `rustle-bench`: runs fixtures in the foreground for manual tests/scripts.
//!
//! ```text
//! rustle-bench origin   [--listen ADDR] [--tls]
//! rustle-bench tcp-echo [--listen ADDR]
//! rustle-bench udp-echo [--listen ADDR]
//! rustle-bench load     --target HOST:PORT [--mode M] [...]   (see `load --help`)
//! rustle-bench campaign [...]                      (see `campaign --help`)
//! rustle-bench report   --in DIR [...]             (see `report --help`)
//! ```
//! The fixtures run until SIGTERM or ctrl-c; `load` runs for its duration and
//! prints its report (one JSON object with `--json`).

use std::net::SocketAddr;

use anyhow::{bail, Context, Result};
use rustle_bench::load;
use rustle_bench::{Origin, TcpEcho, TlsOrigin, UdpEcho};

const USAGE: &str = "usage: rustle-bench <origin [--tls] | tcp-echo | udp-echo> [--listen ADDR]\n\
                     \x20      rustle-bench load --target HOST:PORT [options] (load --help)\n\
                     \x20      rustle-bench campaign [options] (campaign --help)\n\
                     \x20      rustle-bench report --in DIR [options] (report --help)";

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let Some(cmd) = args.next() else { bail!(USAGE) };
    match cmd.as_str() {
        "load" => return run_load(args),
        "campaign" => return rustle_bench::campaign::main(args),
        "report" => return rustle_bench::report::main(args),
        _ => {}
    }
    let mut listen: SocketAddr = "127.0.0.1:0".parse().context("default address")?;
    let mut tls = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
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
            let o = TlsOrigin::start_on(listen)?;
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
