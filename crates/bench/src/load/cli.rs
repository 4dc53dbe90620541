//! The command line of `rustle-bench load` ([`Args`], whose doc comments are its `--help`),
//! and the duration parser the campaign shares.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::{Mode, Options};

/// Drives load at an origin, directly or through a proxy, and prints a report: throughput,
/// latency percentiles, errors (one JSON object with --json).
///
/// Durations are a number with a unit: 10s, 500ms, 2m, 1h (a bare number is seconds).
/// Sizes are in bytes.
#[derive(clap::Parser, Debug)]
#[command(name = "load", args_override_self = true)]
pub struct Args {
    /// The origin, or the UDP echo in the udp modes (also the Host header).
    #[arg(long, value_name = "HOST:PORT")]
    pub target: String,
    /// direct | http-proxy | connect | socks5 | relay | ws | https-relay | https-proxy (TLS
    /// to the proxy, ALPN http/1.1, absolute-form requests) | h2c (HTTP/2 with prior
    /// knowledge to the proxy, a stream per request) | h2-tls (HTTP/2 over TLS to the
    /// proxy, ALPN h2, a stream per request) | udp-direct | udp-relay | udp-socks5
    /// (datagrams to a UDP echo, --size bytes each).
    #[arg(long, value_name = "M", default_value = "direct", value_parser = mode)]
    pub mode: Mode,
    /// The proxy or relay (required except for direct and udp-direct; ws without it goes
    /// direct; udp-relay: a UDP relay; udp-socks5: the SOCKS5 TCP port).
    #[arg(long, value_name = "HOST:PORT")]
    pub proxy: Option<String>,
    /// Proxy credentials: Proxy-Authorization: Basic (http-proxy, connect, https-proxy, ws
    /// through a proxy), RFC 1929 user/password (socks5).
    #[arg(long, value_name = "U:P")]
    pub proxy_user: Option<String>,
    /// Request path [default: /bytes/1024; /sha256 with --upload; /ws in ws mode].
    #[arg(long, value_name = "P", value_parser = path)]
    pub path: Option<String>,
    /// Concurrent connections.
    #[arg(long, short = 'c', value_name = "C", default_value = "64", value_parser = number::<usize>)]
    pub connections: usize,
    /// HTTP/2 modes: streams in flight per connection.
    #[arg(long, value_name = "M", default_value = "1", value_parser = number::<usize>)]
    pub streams: usize,
    /// Worker threads, one current-thread runtime each.
    #[arg(long, short = 't', value_name = "N", default_value = "1", value_parser = number::<usize>)]
    pub threads: usize,
    /// Measured time (hold mode: how long the connections stay open).
    #[arg(long, short = 'd', value_name = "D", default_value = "10s", value_parser = duration)]
    pub duration: Duration,
    /// Time before the measured time, excluded from the numbers.
    #[arg(long, value_name = "D", default_value = "1s", value_parser = duration)]
    pub warmup: Duration,
    /// Bound on one exchange, setup included (UDP: on one datagram).
    #[arg(long, value_name = "D", default_value = "10s", value_parser = duration)]
    pub timeout: Duration,
    /// A new connection per request (Connection: close), or per ws message.
    #[arg(long)]
    pub close: bool,
    /// POST a body of this many bytes (0: GET).
    #[arg(long, value_name = "BYTES", default_value = "0", value_parser = number::<usize>)]
    pub upload: usize,
    /// Open loop: R requests/s in total, latency measured from the scheduled time [default:
    /// closed loop].
    #[arg(long, value_name = "R", value_parser = number::<f64>)]
    pub rate: Option<f64>,
    /// Mix: only M of the C connections active at once, rotating.
    #[arg(long, value_name = "M", value_parser = number::<usize>)]
    pub active: Option<usize>,
    /// Hold mode: open N connections, one request each, and keep them idle for --duration;
    /// with --rate, keep them idle while the open loop runs on C more.
    #[arg(long, value_name = "N", value_parser = number::<usize>)]
    pub hold: Option<usize>,
    /// Hold mode: the held connections' request path [default: --path].
    #[arg(long, value_name = "P", value_parser = path)]
    pub hold_path: Option<String>,
    /// --hold with --rate: pause between the hold and the open loop.
    #[arg(long, value_name = "D", default_value = "0s", value_parser = duration)]
    pub settle: Duration,
    /// Hold mode: connections set up at once per thread.
    #[arg(long, value_name = "N", default_value = "64", value_parser = number::<usize>)]
    pub setup: usize,
    /// Send exactly N requests in all (every connection together), then stop when each is
    /// answered; --duration and --warmup do not apply.
    #[arg(long, value_name = "N", value_parser = number::<u64>)]
    pub count: Option<u64>,
    /// WebSocket message or UDP datagram payload size, in bytes (UDP: 12 or more).
    #[arg(long, value_name = "BYTES", default_value = "64", value_parser = number::<usize>)]
    pub size: usize,
    /// PEM CA to trust (https-relay, https-proxy, h2-tls).
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// TLS server name [default: the proxy's host].
    #[arg(long, value_name = "NAME")]
    pub sni: Option<String>,
    /// TLS to the proxy (https-relay, https-proxy, h2-tls): no session resumption, a full
    /// handshake per connection.
    #[arg(long)]
    pub no_resume: bool,
    /// TLS to the proxy: the key exchange groups offered: default (rustls's) or x25519 (only).
    #[arg(long, value_name = "GROUP", default_value = "default", value_parser = ["default", "x25519"])]
    pub kx: String,
    /// Seed for the WebSocket masks.
    #[arg(long, value_name = "N", default_value = "0", value_parser = number::<u64>)]
    pub seed: u64,
    /// Print one JSON object on stdout instead of a human line.
    #[arg(long)]
    pub json: bool,
}

impl Args {
    /// The load run these arguments ask for.
    pub fn options(self) -> Options {
        let mut o = Options::new(self.mode, self.target);
        o.proxy = self.proxy;
        o.proxy_user = self.proxy_user;
        o.path = self.path;
        o.connections = self.connections;
        o.streams = self.streams;
        o.threads = self.threads;
        o.duration = self.duration;
        o.warmup = self.warmup;
        o.timeout = self.timeout;
        o.close = self.close;
        o.upload = self.upload;
        o.rate = self.rate;
        o.active = self.active;
        o.hold = self.hold;
        o.hold_path = self.hold_path;
        o.settle = self.settle;
        o.setup = self.setup;
        o.count = self.count;
        o.size = self.size;
        o.ca = self.ca;
        o.sni = self.sni;
        o.no_resume = self.no_resume;
        o.x25519_only = self.kx == "x25519";
        o.seed = self.seed;
        o.json = self.json;
        o
    }
}

fn mode(v: &str) -> Result<Mode> {
    Mode::parse(v).with_context(|| format!("unknown mode {v:?}"))
}

fn path(v: &str) -> Result<String> {
    if !v.starts_with('/') {
        bail!("a path must start with '/', not {v:?}");
    }
    Ok(v.to_string())
}

fn number<T: std::str::FromStr>(v: &str) -> Result<T> {
    v.parse().ok().with_context(|| format!("bad number {v:?}"))
}

/// `1.5s`, `200ms`, `2m`, `1h`, or plain seconds.
pub fn duration(v: &str) -> Result<Duration> {
    let (num, scale) = if let Some(n) = v.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = v.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (v, 1.0)
    };
    let secs: f64 = num.parse().ok().with_context(|| format!("bad duration {v:?}"))?;
    Duration::try_from_secs_f64(secs * scale).with_context(|| format!("bad duration {v:?}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use clap::Parser;

    use super::*;

    fn parse(s: &str) -> Result<Options, clap::Error> {
        let args = std::iter::once("load").chain(s.split_whitespace());
        Args::try_parse_from(args).map(Args::options)
    }

    #[test]
    fn parses_every_flag() {
        let o = parse(
            "--mode socks5 --target [::1]:80 --proxy 127.0.0.1:1080 --path /x -c 8 -t 2 \
             --duration 2s --warmup 100ms --timeout 1m --close --upload 10 --rate 99.5 \
             --active 3 --hold 5 --hold-path /y --settle 2s --streams 4 --count 9 --setup 2 \
             --size 7 --ca ca.pem --sni localhost --no-resume --kx x25519 --seed 42 --json \
             --proxy-user u:p",
        )
        .unwrap();
        assert_eq!(o.mode, Mode::Socks5);
        assert_eq!((o.connections, o.threads, o.upload, o.size, o.seed), (8, 2, 10, 7, 42));
        assert_eq!(o.duration, Duration::from_secs(2));
        assert_eq!(o.warmup, Duration::from_millis(100));
        assert_eq!(o.timeout, Duration::from_secs(60));
        assert_eq!((o.rate, o.active, o.hold), (Some(99.5), Some(3), Some(5)));
        assert_eq!((o.count, o.setup, o.streams), (Some(9), 2, 4));
        assert_eq!((o.hold_path.as_deref(), o.settle), (Some("/y"), Duration::from_secs(2)));
        assert!(o.close && o.json && o.no_resume && o.x25519_only);
        assert_eq!(o.path.as_deref(), Some("/x"));
        assert_eq!(o.sni.as_deref(), Some("localhost"));
        assert_eq!(o.proxy_user.as_deref(), Some("u:p"));
        assert_eq!(o.ca, Some(PathBuf::from("ca.pem")));
    }

    #[test]
    fn defaults_are_those_of_options_new() {
        let o = parse("--target a:1").unwrap();
        let d = Options::new(Mode::Direct, "a:1");
        assert_eq!(o.mode, d.mode);
        assert_eq!((o.connections, o.threads, o.setup, o.size), (64, 1, 64, 64));
        assert_eq!(
            (o.connections, o.threads, o.setup, o.size),
            (d.connections, d.threads, d.setup, d.size)
        );
        assert_eq!((o.duration, o.warmup, o.timeout), (d.duration, d.warmup, d.timeout));
        assert_eq!((o.upload, o.seed, o.rate, o.count), (d.upload, d.seed, d.rate, d.count));
        assert!(!o.close && !o.json && !o.no_resume && !o.x25519_only);
        assert!(o.proxy.is_none() && o.path.is_none() && o.hold.is_none());
    }

    #[test]
    fn a_flag_given_twice_takes_the_last_value() {
        // The campaign appends its own --duration and --timeout to a scenario's arguments.
        let o =
            parse("--target a:1 --timeout 5s --duration 1s --timeout 60s --duration 3s").unwrap();
        assert_eq!((o.timeout, o.duration), (Duration::from_secs(60), Duration::from_secs(3)));
    }

    #[test]
    fn rejects_bad_input() {
        assert!(parse("--mode nope --target a:1").is_err());
        assert!(parse("--target a:1 --connections").is_err());
        assert!(parse("--duration 1x --target a:1").is_err());
        assert!(parse("--target a:1 --path x").is_err());
        assert!(parse("--mode direct").is_err());
        assert!(parse("--kx mlkem --target a:1").is_err());
        assert!(parse("--hold-path x --target a:1").is_err());
        for m in ["https-proxy", "h2-tls"] {
            let o = parse(&format!("--mode {m} --target a:1")).unwrap();
            assert_eq!(o.mode.name(), m);
            assert!(o.mode.is_tls());
        }
        let help = parse("--help").unwrap_err();
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
    }
}
