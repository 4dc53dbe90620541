//! Command-line parsing for `rustle-bench load` (hand-rolled, like the
//! other subcommands, to keep the bench binary's dependencies small).

use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::{Mode, Options};

pub const USAGE: &str = "\
usage: rustle-bench load --target HOST:PORT [options]
  --mode M          direct (default) | http-proxy | connect | socks5 | relay | ws | https-relay
                    | https-proxy (TLS to the proxy, ALPN http/1.1, absolute-form requests)
                    | h2c (HTTP/2 with prior knowledge to the proxy, a stream per request)
                    | h2-tls (HTTP/2 over TLS to the proxy, ALPN h2, a stream per request)
                    | udp-direct | udp-relay | udp-socks5 (datagrams to a UDP echo, --size each)
  --proxy HOST:PORT proxy or relay (required except for direct and udp-direct; ws without it
                    goes direct; udp-relay: a UDP relay; udp-socks5: the SOCKS5 TCP port)
  --proxy-user U:P  send Proxy-Authorization: Basic (http-proxy and connect modes)
  --path P          request path (default /bytes/1024; /sha256 with --upload; /ws in ws mode)
  --connections C   concurrent connections (default 64)
  --streams M       HTTP/2 modes: streams in flight per connection (default 1)
  --threads N       worker threads, one current-thread runtime each (default 1)
  --duration D      measured time, e.g. 10s, 500ms, 2m (default 10s)
  --warmup D        excluded from the numbers (default 1s)
  --timeout D       bound on one exchange, setup included (default 10s; UDP: per datagram)
  --close           new connection per request (Connection: close) / per ws message
  --upload BYTES    POST a body of this size
  --rate R          open loop: R requests/s in total (latency from scheduled time)
  --active M        mix: only M of the C connections active at once, rotating
  --hold N          open N connections, one request each, keep idle for --duration;
                    with --rate, keep them idle while the open loop runs on C more
  --hold-path P     hold mode: the held connections' request path (default --path)
  --settle D        --hold with --rate: pause between the hold and the open loop (default 0)
  --setup N         hold mode: connections set up at once per thread (default 64)
  --count N         send exactly N requests in all (every connection together), then stop
                    when each is answered; --duration and --warmup do not apply
  --size BYTES      ws message / UDP datagram payload size (default 64; UDP: 12 or more)
  --ca FILE         PEM CA to trust (https-relay, https-proxy, h2-tls)
  --sni NAME        TLS server name (default: the proxy host)
  --no-resume       https-relay: no session resumption, a full handshake per connection
  --kx GROUP        https-relay: key exchange groups offered: default (rustls's) or x25519
  --seed N          seed for the WebSocket masks (default 0)
  --json            print one JSON object on stdout";

/// Parses the arguments after `load`. `Ok(None)` means help was asked for.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Options>> {
    let mut o = Options::new(Mode::Direct, String::new());
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--mode" => {
                let v = value()?;
                o.mode = Mode::parse(&v).with_context(|| format!("unknown mode {v:?}"))?;
            }
            "--target" => o.target = value()?,
            "--proxy" => o.proxy = Some(value()?),
            "--proxy-user" => o.proxy_user = Some(value()?),
            "--path" => o.path = Some(path(value()?)?),
            "--connections" | "-c" => o.connections = number(&value()?)?,
            "--streams" => o.streams = number(&value()?)?,
            "--threads" | "-t" => o.threads = number(&value()?)?,
            "--duration" | "-d" => o.duration = duration(&value()?)?,
            "--warmup" => o.warmup = duration(&value()?)?,
            "--timeout" => o.timeout = duration(&value()?)?,
            "--close" => o.close = true,
            "--upload" => o.upload = number(&value()?)?,
            "--rate" => {
                let v = value()?;
                o.rate = Some(v.parse().with_context(|| format!("bad rate {v:?}"))?);
            }
            "--active" => o.active = Some(number(&value()?)?),
            "--hold" => o.hold = Some(number(&value()?)?),
            "--hold-path" => o.hold_path = Some(path(value()?)?),
            "--settle" => o.settle = duration(&value()?)?,
            "--count" => o.count = Some(number(&value()?)?),
            "--setup" => o.setup = number(&value()?)?,
            "--size" => o.size = number(&value()?)?,
            "--ca" => o.ca = Some(value()?.into()),
            "--sni" => o.sni = Some(value()?),
            "--no-resume" => o.no_resume = true,
            "--kx" => {
                o.x25519_only = match value()?.as_str() {
                    "x25519" => true,
                    "default" => false,
                    v => bail!("--kx default|x25519, not {v:?}"),
                }
            }
            "--seed" => o.seed = number(&value()?)?,
            "--json" => o.json = true,
            "-h" | "--help" => return Ok(None),
            other => bail!("unknown argument {other:?}"),
        }
    }
    if o.target.is_empty() {
        bail!("--target HOST:PORT is required");
    }
    Ok(Some(o))
}

fn path(v: String) -> Result<String> {
    if !v.starts_with('/') {
        bail!("a path must start with '/', not {v:?}");
    }
    Ok(v)
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
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_every_flag() {
        let o = parse(args(
            "--mode socks5 --target [::1]:80 --proxy 127.0.0.1:1080 --path /x -c 8 -t 2 \
             --duration 2s --warmup 100ms --timeout 1m --close --upload 10 --rate 99.5 \
             --active 3 --hold 5 --hold-path /y --settle 2s --streams 4 --count 9 --setup 2 --size 7 --ca ca.pem --sni localhost --no-resume --kx x25519 --seed 42 --json",
        ))
        .unwrap()
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
    }

    #[test]
    fn rejects_bad_input() {
        assert!(parse(args("--mode nope --target a:1")).is_err());
        assert!(parse(args("--connections")).is_err());
        assert!(parse(args("--duration 1x --target a:1")).is_err());
        assert!(parse(args("--mode direct")).is_err());
        assert!(parse(args("--kx mlkem --target a:1")).is_err());
        assert!(parse(args("--hold-path x --target a:1")).is_err());
        for m in ["https-proxy", "h2-tls"] {
            let o = parse(args(&format!("--mode {m} --target a:1"))).unwrap().unwrap();
            assert_eq!(o.mode.name(), m);
            assert!(o.mode.is_tls());
        }
        assert!(parse(args("--help")).unwrap().is_none());
    }
}
