//! The scenarios, named as in the reference campaign, and the load each
//! one puts through the proxy.

use anyhow::{bail, Result};

/// How the client reaches the origin through the proxy, which is also
/// which listener the proxy needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    /// Absolute-form HTTP requests to an HTTP proxy.
    Http,
    /// A CONNECT tunnel per connection.
    Connect,
    /// A SOCKS5 tunnel per connection.
    Socks,
    /// A plain TCP relay to the origin.
    Relay,
    /// WebSocket upgrades through the HTTP proxy.
    Ws,
    /// SOCKS5 UDP ASSOCIATE, datagrams to the campaign's UDP echo.
    UdpSocks,
    /// A UDP port relay to the campaign's UDP echo.
    UdpRelay,
    /// A relay that terminates TLS from the client (TLS 1.3, the campaign's
    /// certificate) and speaks plain TCP to the HTTP origin.
    TlsTerm,
    /// A relay that takes plain TCP from the client and originates TLS to
    /// the campaign's HTTPS origin, verifying it against the origin's CA.
    TlsOrig,
    /// The HTTP proxy inside TLS (the campaign's certificate), HTTP/1.1 or
    /// HTTP/2 as ALPN chooses, to the HTTP origin.
    HttpsProxy,
}

impl Path {
    /// The load generator's `--mode`.
    pub(super) fn load_mode(self) -> &'static str {
        match self {
            Path::Http => "http-proxy",
            Path::Connect => "connect",
            Path::Socks => "socks5",
            Path::Relay => "relay",
            Path::Ws => "ws",
            Path::UdpSocks => "udp-socks5",
            Path::UdpRelay => "udp-relay",
            Path::TlsTerm => "https-relay",
            Path::TlsOrig => "relay",
            Path::HttpsProxy => "https-proxy",
        }
    }

    /// Needs the campaign's certificates or its HTTPS origin.
    pub(super) fn is_tls(self) -> bool {
        matches!(self, Path::TlsTerm | Path::TlsOrig | Path::HttpsProxy)
    }

    /// The client speaks TLS to the proxy, verifying it with the campaign's CA.
    pub(super) fn client_tls(self) -> bool {
        matches!(self, Path::TlsTerm | Path::HttpsProxy)
    }

    /// Datagrams to the UDP origin rather than HTTP to the HTTP origin.
    pub(super) fn is_udp(self) -> bool {
        matches!(self, Path::UdpSocks | Path::UdpRelay)
    }
}

/// What is measured: a rate, or memory with connections held idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Requests (or messages) per second.
    Rate,
    /// Bulk download in Gbit/s (or upload, with `--upload`; see
    /// [`Scenario::is_upload`]).
    Stream,
    /// `--hold N`: the proxy's memory per open tunnel.
    Hold(u64),
    /// `--hold N` with `--rate`: N idle tunnels held open while an open loop
    /// runs beside them; its requests per second and latency, and the
    /// proxy's memory with the tunnels held.
    IdleMix(u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Scenario {
    pub name: String,
    pub path: Path,
    /// The load generator's `--mode`: the path's, or HTTP/2 on a TLS port.
    pub mode: &'static str,
    pub kind: Kind,
    /// Arguments for `rustle-bench load` besides mode, target, proxy, duration.
    pub load_args: Vec<String>,
}

impl Scenario {
    pub(super) fn unit(&self) -> &'static str {
        match (self.kind, self.path) {
            (Kind::Stream, _) => "Gbit/s",
            (Kind::Hold(_), _) => "KB/tunnel",
            (Kind::IdleMix(_), _) => "req/s",
            (Kind::Rate, Path::Ws) => "msg/s",
            (Kind::Rate, Path::UdpSocks | Path::UdpRelay) => "dgram/s",
            (Kind::Rate, _) => "req/s",
        }
    }

    /// True for the upload streams: their throughput is the request bodies.
    pub(super) fn is_upload(&self) -> bool {
        self.load_args.iter().any(|a| a == "--upload")
    }

    /// The value of its `--connections`: 64 for `http-ka-1k`, 2000 for the
    /// mixes, 200 for the idle mixes (besides the tunnels they hold); `None`
    /// for the tunnel holds, which open `--hold N` instead.
    pub(super) fn default_connections(&self) -> Option<u32> {
        let i = self.load_args.iter().position(|a| a == "--connections")?;
        self.load_args.get(i + 1)?.parse().ok()
    }

    /// True when `--sweep` applies: a closed loop in which every connection
    /// is busy all the time, so that the connection count is the
    /// concurrency. Not the mixes (2000 open, 64 of them active or an open
    /// loop at a fixed rate), the tunnel holds, nor HTTP/2 with many streams
    /// per connection.
    pub(super) fn sweepable(&self) -> bool {
        let fixed = self.load_args.iter().any(|a| a == "--active" || a == "--rate");
        let streams = self.load_args.iter().any(|a| a == "--streams");
        let hold = matches!(self.kind, Kind::Hold(_) | Kind::IdleMix(_));
        !hold && !fixed && !streams && self.default_connections().is_some()
    }

    /// The same load with `n` connections instead of the default.
    pub(super) fn with_connections(&self, n: u32) -> Scenario {
        let mut s = self.clone();
        match s.load_args.iter().position(|a| a == "--connections") {
            Some(i) if i + 1 < s.load_args.len() => s.load_args[i + 1] = n.to_string(),
            _ => s.load_args.extend(["--connections".to_string(), n.to_string()]),
        }
        s
    }
}

/// The connection count of a scenario by name, for CSV rows that predate
/// the `connections` column; `None` for unknown names and tunnel holds.
pub(super) fn default_connections(name: &str) -> Option<u32> {
    parse(name).ok()?.default_connections()
}

/// Bodies: 1 GiB for one stream (reported in Gbit/s); 64 MiB for each of 16,
/// so that the requests in flight at the deadline, which the generator
/// waits for, do not stretch a run by more than a few seconds.
const STREAM1_BODY: &str = "/bytes/1073741824";
const STREAM16_BODY: &str = "/bytes/67108864";
/// Upload streams: 16 connections each POSTing 64 MiB to `/sha256`
/// (the load generator's default path for uploads), again and again, or one
/// POSTing 1 GiB, as the download streams.
const STREAM16_UP_BODY: &str = "67108864";
const STREAM1_UP_BODY: &str = "1073741824";

/// The idle mixes' open loop: 2000 exchanges a second with 10 KB answers
/// on 200 kept-alive connections beside the held tunnels, whose one
/// request each is a small one.
const IDLE_MIX_LOAD: &str =
    "--connections 200 --rate 2000 --path /bytes/10240 --hold-path /bytes/16";

/// Every name `--scenarios` accepts, groups expanded (see [`expand`]).
pub(super) const GROUPS: &[(&str, &[&str])] = &[
    ("quick", &["http-ka-1k", "http-close-1k", "connect-ka-1k", "socks-ka-1k", "relay-ka-1k"]),
    ("mix", &["mix-http", "mix-connect", "mix-socks", "mix-relay"]),
    ("mix-3k", &["mix-http-3k", "mix-connect-3k", "mix-socks-3k", "mix-relay-3k"]),
    ("stream1-down", &["relay-stream1-down", "connect-stream1-down", "socks-stream1-down"]),
    ("stream16", &["relay-stream16", "connect-stream16", "socks-stream16"]),
    ("stream16-up", &["relay-stream16-up", "connect-stream16-up", "socks-stream16-up"]),
    ("stream1-up", &["relay-stream1-up", "connect-stream1-up", "socks-stream1-up"]),
    ("close", &["http-close-1k", "http-close-10k", "http-close-1m"]),
    ("idle", &["idle-connect-9900", "idle-socks-9900", "idle-relay-9900"]),
    ("h2", &["h2-tls-1k", "h1-tls-1k"]),
    ("udp", &["udp-socks-64b", "udp-relay-64b"]),
    (
        "tls",
        &[
            "tls-term-1k",
            "tls-term-1m",
            "tls-term-close",
            "tls-orig-1k",
            "tls-orig-1m",
            "tls-orig-close",
        ],
    ),
];

/// Expands group names (`mix`, `stream16`, `mem-tunnels-N` = the CONNECT
/// and SOCKS variants, `idle-N` = the CONNECT, SOCKS and relay ones) and
/// `all`, keeping the order given.
pub(super) fn expand(list: &str) -> Result<Vec<Scenario>> {
    let mut names: Vec<String> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if item == "all" {
            names.extend(all_names());
        } else if let Some((_, members)) = GROUPS.iter().find(|(g, _)| *g == item) {
            names.extend(members.iter().map(|s| s.to_string()));
        } else if let Some(n) =
            item.strip_prefix("mem-tunnels-").filter(|n| n.parse::<u64>().is_ok())
        {
            names.push(format!("mem-tunnels-connect-{n}"));
            names.push(format!("mem-tunnels-socks-{n}"));
        } else if let Some(n) = item.strip_prefix("idle-").filter(|n| n.parse::<u64>().is_ok()) {
            names.extend(["connect", "socks", "relay"].map(|p| format!("idle-{p}-{n}")));
        } else {
            names.push(item.to_string());
        }
    }
    let mut out: Vec<Scenario> = Vec::new();
    for n in names {
        if !out.iter().any(|s| s.name == n) {
            out.push(parse(&n)?);
        }
    }
    Ok(out)
}

fn all_names() -> Vec<String> {
    let mut v = Vec::new();
    for p in ["http", "connect", "socks", "relay"] {
        for s in ["ka-1k", "ka-10k", "ka-1m", "close-1k", "close-10k", "close-1m", "ka-50k-2000"] {
            if p == "http" || !s.ends_with("-10k") && !s.ends_with("-1m") {
                v.push(format!("{p}-{s}"));
            }
        }
    }
    for p in ["relay", "connect", "socks"] {
        v.push(format!("{p}-stream1-down"));
        v.push(format!("{p}-stream16"));
        v.push(format!("{p}-stream16-up"));
        v.push(format!("{p}-stream1-up"));
    }
    v.extend(["udp-socks-64b", "udp-relay-64b"].map(String::from));
    for p in ["term", "orig"] {
        v.extend(["1k", "1m", "close"].map(|s| format!("tls-{p}-{s}")));
    }
    v.extend(["ws-64b", "ws-64k", "ws-close"].map(String::from));
    for n in [1000, 5000, 10000, 25000] {
        v.push(format!("mem-tunnels-connect-{n}"));
        v.push(format!("mem-tunnels-socks-{n}"));
    }
    v.extend(["connect", "socks", "relay"].map(|p| format!("idle-{p}-9900")));
    v.extend(["h2-tls-1k", "h1-tls-1k"].map(String::from));
    for p in ["http", "connect", "socks", "relay"] {
        v.push(format!("mix-{p}"));
        v.push(format!("mix-{p}-3k"));
    }
    v
}

fn path_of(p: &str) -> Option<Path> {
    Some(match p {
        "http" => Path::Http,
        "connect" => Path::Connect,
        "socks" => Path::Socks,
        "relay" => Path::Relay,
        _ => return None,
    })
}

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// One scenario by its full name.
pub(super) fn parse(name: &str) -> Result<Scenario> {
    let make = |path: Path, kind, a: &str| Scenario {
        name: name.to_string(),
        path,
        mode: path.load_mode(),
        kind,
        load_args: args(a),
    };
    // HTTP/2 against HTTP/1.1 on one TLS port of the HTTP proxy, 1 KB
    // answers: 4 connections of 32 streams, or 64 kept-alive connections
    // with absolute-form requests.
    match name {
        "h2-tls-1k" => {
            let a = "--connections 4 --streams 32 --path /bytes/1024";
            return Ok(Scenario { mode: "h2-tls", ..make(Path::HttpsProxy, Kind::Rate, a) });
        }
        "h1-tls-1k" => {
            return Ok(make(Path::HttpsProxy, Kind::Rate, "--connections 64 --path /bytes/1024"))
        }
        _ => {}
    }
    if let Some(rest) = name.strip_prefix("ws-") {
        let a = match rest {
            "64b" => "--connections 64 --size 64",
            "64k" => "--connections 16 --size 65536",
            "close" => "--connections 64 --size 64 --close",
            _ => bail!("unknown scenario {name:?}"),
        };
        return Ok(make(Path::Ws, Kind::Rate, a));
    }
    if let Some(rest) = name.strip_prefix("tls-") {
        // TLS 1.3 relays: 64 kept-alive connections with 1 KB answers, 16
        // with 1 MB ones, or a new connection per 1 KB request. The client
        // offers X25519 only (what OpenSSL 3.0 peers would pick anyway) and,
        // for tls-term-close, no resumption: a full handshake per request
        // (tls-term-resume-close: the client resumes).
        let (path, size) = match rest.split_once('-') {
            Some(("term", s)) => (Path::TlsTerm, s),
            Some(("orig", s)) => (Path::TlsOrig, s),
            _ => bail!("unknown scenario {name:?} (tls-term-* or tls-orig-*)"),
        };
        let mut a = match size {
            "1k" => "--connections 64 --path /bytes/1024".to_string(),
            "1m" => "--connections 16 --path /bytes/1048576".to_string(),
            "close" => "--connections 64 --close --path /bytes/1024".to_string(),
            // tls-term only: as close, with a client that resumes its sessions.
            "resume-close" if path == Path::TlsTerm => {
                "--connections 64 --close --path /bytes/1024".to_string()
            }
            _ => bail!("unknown scenario {name:?} (1k, 1m, close or term-resume-close)"),
        };
        if path == Path::TlsTerm {
            a.push_str(" --kx x25519");
            if size == "close" {
                a.push_str(" --no-resume");
            }
        }
        return Ok(make(path, Kind::Rate, &a));
    }
    if let Some(rest) = name.strip_prefix("udp-") {
        // Closed loop, one 64-byte datagram in flight per socket; a lost
        // datagram costs a one-second timeout (counted as an error).
        let path = match rest {
            "socks-64b" => Path::UdpSocks,
            "relay-64b" => Path::UdpRelay,
            _ => bail!("unknown scenario {name:?} (udp-socks-64b or udp-relay-64b)"),
        };
        return Ok(make(path, Kind::Rate, "--connections 64 --size 64 --timeout 1s"));
    }
    if let Some(rest) = name.strip_prefix("mem-tunnels-") {
        let (p, n) = rest.split_once('-').unwrap_or((rest, ""));
        let path = match p {
            "connect" => Path::Connect,
            "socks" => Path::Socks,
            _ => bail!("unknown scenario {name:?} (mem-tunnels-connect-N or -socks-N)"),
        };
        let Ok(n) = n.parse::<u64>() else { bail!("unknown scenario {name:?}") };
        // The request each tunnel makes before idling is a small one.
        return Ok(make(path, Kind::Hold(n), "--path /bytes/16"));
    }
    if let Some(rest) = name.strip_prefix("idle-") {
        let (p, n) = rest.split_once('-').unwrap_or((rest, ""));
        let path = match p {
            "connect" => Path::Connect,
            "socks" => Path::Socks,
            "relay" => Path::Relay,
            _ => bail!("unknown scenario {name:?} (idle-connect-N, -socks-N or -relay-N)"),
        };
        let Ok(n) = n.parse::<u64>() else { bail!("unknown scenario {name:?}") };
        return Ok(make(path, Kind::IdleMix(n), IDLE_MIX_LOAD));
    }
    if let Some(rest) = name.strip_prefix("mix-") {
        let (p, fixed) = match rest.strip_suffix("-3k") {
            Some(p) => (p, true),
            None => (rest, false),
        };
        let Some(path) = path_of(p) else { bail!("unknown scenario {name:?}") };
        // Web-like: many connections open, 10 KB answers; the closed loop
        // keeps 64 busy at a time, the open loop asks for 3000 a second.
        let a = if fixed {
            "--connections 2000 --rate 3000 --path /bytes/10240"
        } else {
            "--connections 2000 --active 64 --path /bytes/10240"
        };
        return Ok(make(path, Kind::Rate, a));
    }
    let Some((p, rest)) = name.split_once('-') else { bail!("unknown scenario {name:?}") };
    let Some(path) = path_of(p) else { bail!("unknown scenario {name:?}") };
    let (kind, a) = match rest {
        "ka-1k" => (Kind::Rate, "--connections 64 --path /bytes/1024"),
        "ka-10k" => (Kind::Rate, "--connections 64 --path /bytes/10240"),
        "ka-1m" => (Kind::Rate, "--connections 16 --path /bytes/1048576"),
        "close-1k" => (Kind::Rate, "--connections 64 --close --path /bytes/1024"),
        "close-10k" if path == Path::Http => {
            (Kind::Rate, "--connections 64 --close --path /bytes/10240")
        }
        "close-1m" if path == Path::Http => {
            (Kind::Rate, "--connections 16 --close --path /bytes/1048576")
        }
        "ka-50k-2000" => (Kind::Rate, "--connections 2000 --path /bytes/51200"),
        "stream1-down" if path != Path::Http => (Kind::Stream, "--connections 1"),
        "stream16" if path != Path::Http => (Kind::Stream, "--connections 16"),
        "stream16-up" if path != Path::Http => (Kind::Stream, "--connections 16"),
        "stream1-up" if path != Path::Http => (Kind::Stream, "--connections 1"),
        _ => bail!("unknown scenario {name:?}"),
    };
    let mut s = make(path, kind, a);
    if let Some(body) = match rest {
        "stream16-up" => Some(STREAM16_UP_BODY),
        "stream1-up" => Some(STREAM1_UP_BODY),
        _ => None,
    } {
        s.load_args.extend(["--upload".to_string(), body.to_string()]);
    } else if kind == Kind::Stream {
        let body = if rest == "stream16" { STREAM16_BODY } else { STREAM1_BODY };
        s.load_args.extend(["--path".to_string(), body.to_string()]);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_name_in_all_parses_and_groups_expand() {
        let all = expand("all").unwrap();
        assert_eq!(all.len(), 60);
        let names: Vec<String> = expand("quick,mem-tunnels-1000,stream1-down,http-ka-1k")
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names[0], "http-ka-1k");
        assert!(names.contains(&"mem-tunnels-socks-1000".to_string()));
        assert!(names.contains(&"relay-stream1-down".to_string()));
        assert_eq!(names.iter().filter(|n| *n == "http-ka-1k").count(), 1);
        assert!(expand("http-stream16").is_err());
        assert!(expand("nope").is_err());
    }

    #[test]
    fn udp_and_upload_scenarios() {
        let u = parse("udp-socks-64b").unwrap();
        assert_eq!((u.path, u.kind, u.unit()), (Path::UdpSocks, Kind::Rate, "dgram/s"));
        assert_eq!(u.path.load_mode(), "udp-socks5");
        assert!(u.path.is_udp() && u.sweepable());
        assert!(u.load_args.windows(2).any(|w| w == ["--size", "64"]));
        let r = parse("udp-relay-64b").unwrap();
        assert_eq!((r.path, r.path.load_mode()), (Path::UdpRelay, "udp-relay"));
        assert_eq!(r.default_connections(), Some(64));
        assert!(parse("udp-http-64b").is_err() && parse("udp-socks").is_err());
        for p in ["relay", "connect", "socks"] {
            let s = parse(&format!("{p}-stream16-up")).unwrap();
            assert_eq!((s.kind, s.unit()), (Kind::Stream, "Gbit/s"));
            assert!(s.is_upload() && !s.path.is_udp());
            assert!(s.load_args.windows(2).any(|w| w == ["--upload", "67108864"]));
            assert!(!s.load_args.contains(&"--path".to_string()), "POSTs go to /sha256");
            assert_eq!(s.default_connections(), Some(16));
        }
        assert!(!parse("relay-stream16").unwrap().is_upload());
        assert!(parse("http-stream16-up").is_err());
        let names: Vec<String> =
            expand("udp,stream16-up").unwrap().into_iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "udp-socks-64b",
                "udp-relay-64b",
                "relay-stream16-up",
                "connect-stream16-up",
                "socks-stream16-up"
            ]
        );
        let all: Vec<String> = expand("all").unwrap().into_iter().map(|s| s.name).collect();
        assert!(all.contains(&"udp-relay-64b".to_string()));
        assert!(all.contains(&"socks-stream16-up".to_string()));
    }

    #[test]
    fn tls_scenarios() {
        let names: Vec<String> = expand("tls").unwrap().into_iter().map(|s| s.name).collect();
        assert_eq!(names.len(), 6);
        let t = parse("tls-term-close").unwrap();
        assert_eq!((t.path, t.path.load_mode(), t.unit()), (Path::TlsTerm, "https-relay", "req/s"));
        assert!(t.path.is_tls() && t.sweepable());
        assert!(t.load_args.contains(&"--no-resume".to_string()));
        assert!(t.load_args.windows(2).any(|w| w == ["--kx", "x25519"]));
        assert!(t.load_args.contains(&"--close".to_string()));
        let k = parse("tls-term-1k").unwrap();
        assert!(!k.load_args.contains(&"--no-resume".to_string()));
        assert_eq!(k.default_connections(), Some(64));
        let o = parse("tls-orig-1m").unwrap();
        assert_eq!((o.path, o.path.load_mode()), (Path::TlsOrig, "relay"));
        assert_eq!(o.default_connections(), Some(16));
        assert!(o.load_args.windows(2).any(|w| w == ["--path", "/bytes/1048576"]));
        assert!(!o.load_args.contains(&"--kx".to_string()), "plain TCP from the client");
        assert!(parse("tls-orig-close").unwrap().load_args.contains(&"--close".to_string()));
        assert!(!Path::Relay.is_tls());
        let r = parse("tls-term-resume-close").unwrap();
        assert!(r.load_args.contains(&"--close".to_string()));
        assert!(!r.load_args.contains(&"--no-resume".to_string()));
        assert!(parse("tls-orig-resume-close").is_err());
        assert!(parse("tls-term-10k").is_err() && parse("tls-mitm-1k").is_err());
        assert!(expand("all").unwrap().iter().any(|s| s.name == "tls-orig-close"));
    }

    #[test]
    fn single_upload_streams_and_close_sizes() {
        for p in ["relay", "connect", "socks"] {
            let s = parse(&format!("{p}-stream1-up")).unwrap();
            assert_eq!(
                (s.kind, s.unit(), s.default_connections()),
                (Kind::Stream, "Gbit/s", Some(1))
            );
            assert!(
                s.is_upload() && s.load_args.windows(2).any(|w| w == ["--upload", "1073741824"])
            );
            assert!(!s.load_args.contains(&"--path".to_string()), "POSTs go to /sha256");
        }
        assert!(parse("http-stream1-up").is_err());
        let names: Vec<String> =
            expand("stream1-up,close").unwrap().into_iter().map(|s| s.name).collect();
        assert_eq!(names.len(), 6);
        let c = parse("http-close-10k").unwrap();
        assert_eq!((c.path, c.kind, c.default_connections()), (Path::Http, Kind::Rate, Some(64)));
        assert!(c.load_args.contains(&"--close".to_string()) && c.sweepable());
        assert!(c.load_args.windows(2).any(|w| w == ["--path", "/bytes/10240"]));
        let m = parse("http-close-1m").unwrap();
        assert_eq!(m.default_connections(), Some(16));
        assert!(m.load_args.windows(2).any(|w| w == ["--path", "/bytes/1048576"]));
        assert!(parse("connect-close-10k").is_err() && parse("relay-close-1m").is_err());
        for p in ["connect", "socks", "relay"] {
            assert!(parse(&format!("{p}-close-1k"))
                .unwrap()
                .load_args
                .contains(&"--close".to_string()));
        }
    }

    #[test]
    fn idle_mixes_hold_n_beside_an_open_loop() {
        let s = parse("idle-connect-9900").unwrap();
        assert_eq!(
            (s.path, s.kind, s.unit(), s.mode),
            (Path::Connect, Kind::IdleMix(9900), "req/s", "connect")
        );
        assert_eq!(s.default_connections(), Some(200));
        assert!(!s.sweepable());
        for w in [["--rate", "2000"], ["--path", "/bytes/10240"], ["--hold-path", "/bytes/16"]] {
            assert!(s.load_args.windows(2).any(|a| a == w), "{w:?}");
        }
        assert_eq!(parse("idle-relay-1000").unwrap().kind, Kind::IdleMix(1000));
        assert_eq!(parse("idle-socks-7").unwrap().path, Path::Socks);
        assert!(parse("idle-http-100").is_err() && parse("idle-connect-x").is_err());
        let names: Vec<String> = expand("idle-1000").unwrap().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["idle-connect-1000", "idle-socks-1000", "idle-relay-1000"]);
        assert_eq!(expand("idle").unwrap()[2].name, "idle-relay-9900");
        assert_eq!(default_connections("idle-socks-9900"), Some(200));
    }

    #[test]
    fn h2_against_h1_on_the_tls_port() {
        let h2 = parse("h2-tls-1k").unwrap();
        assert_eq!((h2.path, h2.mode, h2.unit()), (Path::HttpsProxy, "h2-tls", "req/s"));
        assert!(h2.load_args.windows(2).any(|w| w == ["--streams", "32"]));
        assert_eq!(h2.default_connections(), Some(4));
        assert!(!h2.sweepable(), "4 connections are 128 streams");
        let h1 = parse("h1-tls-1k").unwrap();
        assert_eq!((h1.path, h1.mode), (Path::HttpsProxy, "https-proxy"));
        assert_eq!(h1.default_connections(), Some(64));
        assert!(h1.sweepable());
        assert!(Path::HttpsProxy.is_tls() && Path::HttpsProxy.client_tls());
        assert!(!Path::TlsOrig.client_tls() && Path::TlsTerm.client_tls());
        assert_eq!(parse("tls-term-1k").unwrap().mode, "https-relay");
        assert!(parse("h2-tls-1m").is_err() && parse("h3-tls-1k").is_err());
        let names: Vec<String> = expand("h2").unwrap().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["h2-tls-1k", "h1-tls-1k"]);
    }

    #[test]
    fn units_follow_the_kind() {
        assert_eq!(parse("relay-stream16").unwrap().unit(), "Gbit/s");
        assert_eq!(parse("ws-64k").unwrap().unit(), "msg/s");
        assert_eq!(parse("mem-tunnels-socks-5000").unwrap().kind, Kind::Hold(5000));
        assert_eq!(parse("http-close-1k").unwrap().unit(), "req/s");
    }

    #[test]
    fn connections_default_and_override() {
        let close = parse("http-close-1k").unwrap();
        assert_eq!(close.default_connections(), Some(64));
        assert!(close.sweepable());
        let swept = close.with_connections(1024);
        assert_eq!(swept.default_connections(), Some(1024));
        assert!(swept.load_args.contains(&"--close".to_string()));
        assert_eq!(swept.load_args.iter().filter(|a| *a == "--connections").count(), 1);
        assert_eq!(default_connections("http-ka-1m"), Some(16));
        assert_eq!(default_connections("mix-http"), Some(2000));
        assert!(!parse("mix-http").unwrap().sweepable());
        assert!(!parse("mix-relay-3k").unwrap().sweepable());
        assert_eq!(default_connections("mem-tunnels-socks-1000"), None);
        assert!(!parse("mem-tunnels-socks-1000").unwrap().sweepable());
        assert!(parse("ws-close").unwrap().sweepable());
        assert_eq!(default_connections("nope"), None);
    }
}
