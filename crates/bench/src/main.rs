//! `rustle-bench`: the fixtures in the foreground for manual tests and scripts, the load
//! generator, the benchmark campaign, its report and the cost guard. [`Cli`] is the whole
//! command line; `rustle-bench <cmd> --help` describes each command.
//!
//! The fixtures run until SIGTERM or ctrl-c; `load` runs for its duration and prints its
//! report (one JSON object with `--json`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use rustle_bench::tls::TlsOriginOptions;
use rustle_bench::{auth_servers, cost, load, report};
use rustle_bench::{Origin, TcpEcho, TlsOrigin, UdpEcho};

/// Fixtures, load generator, benchmark campaign, report and cost guard for rustle.
///
/// The fixtures (origin, tcp-echo, udp-echo, floor, auth-servers) run until SIGTERM or
/// ctrl-c. Errors are one line on standard error and exit 1; a mistyped command line
/// exits 2.
#[derive(Parser, Debug)]
#[command(name = "rustle-bench", arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// A command's description is the doc comment of its arguments' struct when it has one
/// (load, report, cost, auth-servers), else the variant's.
#[derive(Subcommand, Debug)]
enum Command {
    /// The HTTP/1.1 origin (routes: /bytes/N, /chunked/N, /echo, /sha256, /status/NNN,
    /// /delay/MS, /ws, ...), on plain TCP or, with --tls, behind rustls.
    Origin(OriginArgs),
    /// A TCP echo (echoes, and half-closes when the client does).
    TcpEcho(ListenArgs),
    /// A UDP echo (every datagram back to its sender).
    UdpEcho(ListenArgs),
    // Boxed: its arguments outweigh every other command's.
    Load(Box<load::cli::Args>),
    /// A TCP forwarder that only copies bytes: what an exchange costs when a proxy does
    /// nothing else (the campaign's floor peer).
    Floor(FloorArgs),
    // Boxed like `Load`; its description is the one of `campaign::Args`.
    Campaign(Box<rustle_bench::campaign::Args>),
    Report(report::Args),
    Cost(cost::Args),
    AuthServers(auth_servers::Args),
}

/// Where a fixture listens.
#[derive(clap::Args, Debug)]
#[command(args_override_self = true)]
struct ListenArgs {
    /// The address to listen on (port 0: one the kernel picks, printed on start).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
}

#[derive(clap::Args, Debug)]
#[command(args_override_self = true)]
struct OriginArgs {
    #[command(flatten)]
    listen: ListenArgs,
    /// HTTPS: the same origin behind rustls, with a throwaway CA.
    #[arg(long)]
    tls: bool,
    /// With --tls: write a copy of the CA (PEM) to FILE.
    #[arg(long, value_name = "FILE")]
    ca_out: Option<PathBuf>,
    /// With --tls: rewrite FILE every 100 ms with the counters (connections, resumed
    /// handshakes, requests).
    #[arg(long, value_name = "FILE")]
    stats: Option<PathBuf>,
    /// With --tls: stateless session tickets.
    #[arg(long)]
    tickets: bool,
    /// With --tls: the key exchange groups: default (rustls's) or x25519 (only).
    #[arg(long, value_name = "GROUP", default_value = "default", value_parser = ["default", "x25519"])]
    kx: String,
}

#[derive(clap::Args, Debug)]
#[command(args_override_self = true)]
struct FloorArgs {
    /// The address to listen on.
    #[arg(value_name = "LISTEN")]
    listen: SocketAddr,
    /// Where every connection goes.
    #[arg(value_name = "TARGET")]
    target: SocketAddr,
    /// Also rewrite every HTTP head with rustle's codec, the least an HTTP proxy does.
    #[arg(long)]
    http: bool,
}

/// Errors are printed as one line of causes (`{:#}`), not with Debug: no backtrace for a
/// failed start. Command-line mistakes are clap's: its message and exit status 2.
fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rustle-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    // The handle must stay alive until the signal: dropping it stops the fixture.
    let _running: Box<dyn std::any::Any> = match cli.command {
        Command::Load(args) => return run_load(*args),
        Command::Campaign(args) => return rustle_bench::campaign::run(*args),
        Command::Report(args) => return report::main(args),
        Command::Cost(args) => return cost::main(args),
        Command::AuthServers(args) => return auth_servers::main(args),
        Command::Floor(FloorArgs { listen, target, http }) => {
            return rustle_bench::floor::Floor::bind(listen)?.http(http).run(target);
        }
        Command::Origin(args) if args.tls => start_tls_origin(args)?,
        Command::Origin(args) => {
            let o = Origin::start_on(args.listen.listen)?;
            println!("listening on http://{}", o.addr());
            Box::new(o)
        }
        Command::TcpEcho(args) => {
            let e = TcpEcho::start_on(args.listen)?;
            println!("tcp echo on {}", e.addr());
            Box::new(e)
        }
        Command::UdpEcho(args) => {
            let e = UdpEcho::start_on(args.listen)?;
            println!("udp echo on {}", e.addr());
            Box::new(e)
        }
    };
    wait_for_signal()
}

fn start_tls_origin(args: OriginArgs) -> Result<Box<dyn std::any::Any>> {
    let options = TlsOriginOptions { tickets: args.tickets, x25519_only: args.kx == "x25519" };
    let o = std::sync::Arc::new(TlsOrigin::start_with_options(args.listen.listen, options)?);
    if let Some(f) = &args.ca_out {
        std::fs::write(f, o.ca_pem()).with_context(|| format!("writing {}", f.display()))?;
    }
    if let Some(f) = args.stats {
        let o = std::sync::Arc::clone(&o);
        std::thread::spawn(move || write_stats(&o, &f));
    }
    println!("listening on https://{} (CA: {})", o.addr(), o.ca_file().display());
    Ok(Box::new(o))
}

/// Rewrites `file` (through a rename, so a reader never sees half of it)
/// with the origin's counters every 100 ms, until the process ends.
fn write_stats(o: &TlsOrigin, file: &Path) {
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(".tmp");
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

fn run_load(args: load::cli::Args) -> Result<()> {
    let opts = args.options();
    let report = load::run(&opts)?;
    if opts.json {
        println!("{}", report.to_json());
    } else {
        println!("{}", report.human());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_command_renders_its_help() {
        let mut cli = Cli::command();
        cli.build();
        let mut names = Vec::new();
        for sub in cli.get_subcommands_mut() {
            let name = sub.get_name().to_string();
            let help = sub.render_long_help().to_string();
            assert!(help.contains("Usage: "), "{name}: {help}");
            // Every argument of a command is described.
            for arg in sub.get_arguments() {
                let id = arg.get_id();
                assert!(arg.get_help().is_some(), "{name}: {id} has no help");
            }
            names.push(name);
        }
        let all = ["origin", "tcp-echo", "udp-echo", "load", "floor", "campaign", "report"];
        for name in all.into_iter().chain(["cost", "auth-servers"]) {
            assert!(names.iter().any(|n| n == name), "no {name} in {names:?}");
        }
    }

    #[test]
    fn parses_the_commands_scripts_and_the_campaign_run() {
        let parse = |s: &str| Cli::try_parse_from(s.split_whitespace()).map(|c| c.command);
        let floor = parse("rustle-bench floor 127.0.0.1:3128 127.0.0.1:8080 --http").unwrap();
        assert!(matches!(floor, Command::Floor(FloorArgs { http: true, .. })));
        let origin = parse(
            "rustle-bench origin --tls --listen 127.0.0.1:0 --tickets --kx x25519 \
             --ca-out ca.pem --stats stats",
        )
        .unwrap();
        let Command::Origin(o) = origin else { panic!("{origin:?}") };
        assert!(o.tls && o.tickets && o.kx == "x25519" && o.stats.is_some());
        let Command::UdpEcho(e) = parse("rustle-bench udp-echo").unwrap() else { panic!() };
        assert_eq!(e.listen.to_string(), "127.0.0.1:0");
        let campaign = parse("rustle-bench campaign --profile quick --family http,ws").unwrap();
        let Command::Campaign(c) = campaign else { panic!("{campaign:?}") };
        assert_eq!(c.family, ["http", "ws"]);
        assert!(parse("rustle-bench campaign --profile quick --scenarios http-ka-1k").is_err());
        let Command::Load(l) = parse("rustle-bench load --target a:1 -c 2 --json").unwrap() else {
            panic!()
        };
        assert_eq!(l.connections, 2);
        // The campaign appends its own --duration to a scenario's arguments: the last wins.
        let twice = "rustle-bench load --target a:1 --duration 1s -c 3 --duration 2s -c 4";
        let Command::Load(l) = parse(twice).unwrap() else { panic!() };
        assert_eq!((l.duration.as_secs(), l.connections), (2, 4));
        let twice = "rustle-bench origin --listen 127.0.0.1:1 --listen 127.0.0.1:2";
        let Command::Origin(o) = parse(twice).unwrap() else { panic!() };
        assert_eq!(o.listen.listen.port(), 2);
        assert!(parse("rustle-bench auth-servers --http 127.0.0.1:0 --ldap").is_ok());
        assert!(parse("rustle-bench floor 127.0.0.1:1").is_err());
        assert!(parse("rustle-bench nope").is_err());
    }
}
