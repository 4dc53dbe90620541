//! The `rustle` command: parses the command line, loads the configuration, and runs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use rustle::config::{Config, Listener, ListenerKind, LogFormat, LogTarget};

#[derive(Parser)]
#[command(name = "rustle", version, about = "A fast, lean forward proxy")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Configuration file (TOML); see rustle.example.toml.
    #[arg(long, short, global = true)]
    config: Option<PathBuf>,
    /// HTTP proxy listener (repeatable); replaces the file's listeners.
    #[arg(long, value_name = "ADDR")]
    http: Vec<SocketAddr>,
    /// Worker threads, each with its own runtime (0: one per core).
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Access-log format, or `off`.
    #[arg(long, value_name = "FORMAT")]
    log: Option<LogArg>,
    /// Where access-log lines go: stdout, stderr or a file.
    #[arg(long, value_name = "PATH")]
    access_log: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Check a configuration file and print every problem with its line.
    Check,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogArg {
    Plain,
    Json,
    Off,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut cfg = match &cli.config {
        Some(path) => match Config::load(path) {
            Ok(c) => c,
            Err(problems) => {
                eprintln!("{problems}");
                return ExitCode::from(2);
            }
        },
        None => Config::default(),
    };
    if let Some(Command::Check) = cli.command {
        return match &cli.config {
            Some(path) => {
                println!("{}: ok", path.display());
                ExitCode::SUCCESS
            }
            None => {
                eprintln!("rustle check: give the file with --config FILE");
                ExitCode::from(2)
            }
        };
    }
    if !cli.http.is_empty() {
        cfg.listeners =
            cli.http.iter().map(|&listen| Listener { kind: ListenerKind::Http, listen }).collect();
    }
    if let Some(n) = cli.workers {
        cfg.workers = n;
    }
    match cli.log {
        Some(LogArg::Plain) => cfg.log.format = LogFormat::Plain,
        Some(LogArg::Json) => cfg.log.format = LogFormat::Json,
        Some(LogArg::Off) => cfg.log.access = LogTarget::Off,
        None => {}
    }
    if let Some(path) = &cli.access_log {
        cfg.log.access = LogTarget::parse(path);
    }
    init_tracing(&cfg.log.level);
    if let Err(msg) = cfg.check_listeners() {
        tracing::error!("{msg}");
        return ExitCode::from(2);
    }
    match rustle::server::run_until_signal(cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}
