//! The proxies under test: what each supports, and the command line (and
//! configuration file, from the templates in bench/peers/) that starts it
//! with one worker or thread and no logging; and their named variants
//! (`nginx-2w`, `haproxy-2t`, `nginx-ktls`, and rustle's in [`variants`]).

mod variants;

use std::path::{Path as FsPath, PathBuf};

use anyhow::{bail, Context, Result};

use super::scenario::Path;
use super::sys;
use variants::Variant;

/// A proxy the campaign knows how to start.
#[derive(Debug, Clone)]
pub(super) struct Proxy {
    pub name: String,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Rustle {
        bin: PathBuf,
        variant: Variant,
    },
    /// `workers`: worker processes; `ktls`: kernel TLS on the TLS relays.
    Nginx {
        workers: u32,
        ktls: bool,
    },
    Haproxy {
        splice: bool,
        threads: u32,
    },
    Squid,
    Tinyproxy,
    Dante,
    Microsocks,
    /// stunnel (Debian's stunnel4): TLS relays only.
    Stunnel,
    /// `rustle-bench floor`: copies bytes and does nothing else (relay and
    /// HTTP paths), the cost of the kernel's share alone.
    Floor,
    /// `--extra-proxy NAME[:paths]=command`, with {listen} {listen_ip}
    /// {listen_port} {target} {dir} filled in.
    Extra {
        paths: Vec<Path>,
        command: String,
    },
}

/// The files of the TLS scenarios, made once per campaign.
#[derive(Debug, Clone)]
pub(super) struct TlsFiles {
    /// The proxy's chain (leaf, then CA), its key, and both in one file (haproxy).
    pub chain: PathBuf,
    pub key: PathBuf,
    pub combined: PathBuf,
    /// The CA the client verifies the proxy with, and the name it verifies.
    pub ca: PathBuf,
    pub name: String,
    /// The HTTPS origin's CA, and the name its certificate carries.
    pub origin_ca: PathBuf,
    pub origin_name: String,
}

/// Where a run puts things: scratch directory and the addresses.
pub(super) struct Site<'a> {
    pub dir: &'a FsPath,
    pub listen_ip: &'a str,
    pub listen_port: u16,
    /// The origin, `IP:PORT`, as the proxy reaches it.
    pub origin: &'a str,
    /// The UDP echo origin, `IP:PORT` (the UDP relay's target).
    pub udp_origin: &'a str,
    /// The proxy's own address towards the origin.
    pub external_ip: &'a str,
    /// Certificates, for the TLS paths.
    pub tls: Option<&'a TlsFiles>,
    /// Two more ports free on the proxy's side: a variant's admin listener
    /// or its parent proxies.
    pub spare_ports: [u16; 2],
    /// The addresses the proxy sends from towards the origin, for a variant
    /// that rotates them ([`Proxy::egress_addresses`]); empty otherwise.
    pub egress_ips: &'a [String],
}

const RUSTLE: &str = include_str!("../../../../bench/peers/rustle.toml");
const NGINX_HTTP: &str = include_str!("../../../../bench/peers/nginx-http.conf");
const NGINX_STREAM: &str = include_str!("../../../../bench/peers/nginx-stream.conf");
const HAPROXY_HTTP: &str = include_str!("../../../../bench/peers/haproxy-http.cfg");
const HAPROXY_TCP: &str = include_str!("../../../../bench/peers/haproxy-tcp.cfg");
const SQUID: &str = include_str!("../../../../bench/peers/squid.conf");
const TINYPROXY: &str = include_str!("../../../../bench/peers/tinyproxy.conf");
const DANTE: &str = include_str!("../../../../bench/peers/danted.conf");
const RUSTLE_TLS_TERM: &str = include_str!("../../../../bench/peers/rustle-tls-term.toml");
const RUSTLE_TLS_ORIG: &str = include_str!("../../../../bench/peers/rustle-tls-orig.toml");
const RUSTLE_HTTPS_PROXY: &str = include_str!("../../../../bench/peers/rustle-https-proxy.toml");
const NGINX_TLS_TERM: &str = include_str!("../../../../bench/peers/nginx-tls-term.conf");
const NGINX_TLS_ORIG: &str = include_str!("../../../../bench/peers/nginx-tls-orig.conf");
const HAPROXY_TLS_TERM: &str = include_str!("../../../../bench/peers/haproxy-tls-term.cfg");
const HAPROXY_TLS_ORIG: &str = include_str!("../../../../bench/peers/haproxy-tls-orig.cfg");
const STUNNEL_TLS_TERM: &str = include_str!("../../../../bench/peers/stunnel-tls-term.conf");
const STUNNEL_TLS_ORIG: &str = include_str!("../../../../bench/peers/stunnel-tls-orig.conf");

/// This executable (`rustle-bench`), which also serves as the floor peer.
fn floor_exe() -> String {
    std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "rustle-bench".into())
}

/// The names `--proxies` accepts: the peers, then the variants (one
/// setting changed from the peer of the same stem).
pub(super) const KNOWN: &[&str] = &[
    "rustle",
    "nginx",
    "haproxy",
    "haproxy-splice",
    "squid",
    "tinyproxy",
    "dante",
    "microsocks",
    "stunnel",
    "floor",
    "rustle-2w",
    "nginx-2w",
    "haproxy-2t",
    "rustle-kernel",
    "rustle-grace",
    "rustle-metrics",
    "rustle-parent1",
    "rustle-parent2",
    "rustle-auth",
    "rustle-auth-http",
    "rustle-quota",
    "rustle-egress",
    "rustle-ktls",
    "nginx-ktls",
];

/// The proxies of a campaign without `--proxies`: the peers, those before
/// the floor in [`KNOWN`] (not the floor nor the variants).
pub(super) fn default_names() -> impl Iterator<Item = &'static str> {
    KNOWN.iter().copied().take_while(|n| *n != "floor")
}

impl Proxy {
    pub(super) fn named(name: &str, rustle_bin: &FsPath) -> Result<Proxy> {
        let rustle = |variant| Kind::Rustle { bin: rustle_bin.to_path_buf(), variant };
        let kind = match name {
            "nginx" => Kind::Nginx { workers: 1, ktls: false },
            "nginx-2w" => Kind::Nginx { workers: 2, ktls: false },
            "nginx-ktls" => Kind::Nginx { workers: 1, ktls: true },
            "haproxy" => Kind::Haproxy { splice: false, threads: 1 },
            "haproxy-2t" => Kind::Haproxy { splice: false, threads: 2 },
            "haproxy-splice" => Kind::Haproxy { splice: true, threads: 1 },
            "squid" => Kind::Squid,
            "tinyproxy" => Kind::Tinyproxy,
            "dante" => Kind::Dante,
            "microsocks" => Kind::Microsocks,
            "stunnel" => Kind::Stunnel,
            "floor" => Kind::Floor,
            _ => match Variant::named(name) {
                Some(v) => rustle(v),
                None => {
                    bail!("unknown proxy {name:?} (known: {}; or --extra-proxy)", KNOWN.join(", "))
                }
            },
        };
        Ok(Proxy { name: name.to_string(), kind })
    }

    /// Parses `NAME[:http,connect,socks,relay,ws,udp-socks,udp-relay,tls-term,tls-orig]=command`
    /// (`{target}` is the UDP echo for `udp-relay`, the HTTPS origin for
    /// `tls-orig`; `{cert}`, `{key}`, `{combined}`, `{origin_ca}` and
    /// `{origin_name}` are the TLS files).
    pub(super) fn extra(spec: &str) -> Result<Proxy> {
        let Some((head, command)) = spec.split_once('=') else {
            bail!("--extra-proxy wants NAME[:paths]='command {{listen}} {{target}}'");
        };
        let (name, paths) = match head.split_once(':') {
            Some((n, list)) => {
                let mut v = Vec::new();
                for p in list.split(',') {
                    v.push(match p {
                        "http" => Path::Http,
                        "connect" => Path::Connect,
                        "socks" => Path::Socks,
                        "relay" => Path::Relay,
                        "ws" => Path::Ws,
                        "udp-socks" => Path::UdpSocks,
                        "udp-relay" => Path::UdpRelay,
                        "tls-term" => Path::TlsTerm,
                        "tls-orig" => Path::TlsOrig,
                        _ => bail!("--extra-proxy: unknown path {p:?}"),
                    });
                }
                (n, v)
            }
            None => (head, vec![Path::Http, Path::Connect, Path::Socks, Path::Relay, Path::Ws]),
        };
        Ok(Proxy {
            name: name.to_string(),
            kind: Kind::Extra { paths, command: command.to_string() },
        })
    }

    /// The executable, for the "is it installed" check.
    fn program(&self) -> String {
        match &self.kind {
            Kind::Rustle { bin, .. } => bin.display().to_string(),
            Kind::Nginx { .. } => "nginx".into(),
            Kind::Haproxy { .. } => "haproxy".into(),
            Kind::Squid => "squid".into(),
            Kind::Tinyproxy => "tinyproxy".into(),
            Kind::Dante => "danted".into(),
            Kind::Microsocks => "microsocks".into(),
            Kind::Stunnel => "stunnel4".into(),
            Kind::Floor => floor_exe(),
            Kind::Extra { command, .. } => command.split_whitespace().next().unwrap_or("").into(),
        }
    }

    /// The Debian package, for the versions in the conditions file.
    pub(super) fn package(&self) -> Option<&'static str> {
        Some(match self.kind {
            Kind::Nginx { .. } => "nginx-light",
            Kind::Haproxy { .. } => "haproxy",
            Kind::Squid => "squid",
            Kind::Tinyproxy => "tinyproxy",
            Kind::Dante => "dante-server",
            Kind::Microsocks => "microsocks",
            Kind::Stunnel => "stunnel4",
            Kind::Rustle { .. } | Kind::Floor | Kind::Extra { .. } => return None,
        })
    }

    /// `Err(reason)` when this proxy cannot be measured on `path`.
    pub(super) fn supports(&self, path: Path) -> std::result::Result<(), String> {
        let ok = match &self.kind {
            Kind::Rustle { variant, .. } => {
                if !variant.serves(path) {
                    return Err(format!("{}: {}", self.name, variant.paths()));
                }
                true
            }
            Kind::Nginx { ktls: true, .. } => {
                if !matches!(path, Path::TlsTerm | Path::TlsOrig) {
                    return Err(format!("{}: the TLS paths only", self.name));
                }
                true
            }
            Kind::Nginx { .. } | Kind::Haproxy { splice: false, .. } => {
                matches!(path, Path::Http | Path::Relay | Path::Ws | Path::TlsTerm | Path::TlsOrig)
            }
            // splice() cannot move TLS records: the TLS paths are haproxy's.
            Kind::Haproxy { splice: true, .. } => {
                matches!(path, Path::Http | Path::Relay | Path::Ws)
            }
            Kind::Stunnel => matches!(path, Path::TlsTerm | Path::TlsOrig),
            // Neither upgrades absolute-form requests to WebSocket.
            Kind::Squid | Kind::Tinyproxy => matches!(path, Path::Http | Path::Connect),
            // dante's UDP ASSOCIATE is enabled by the rules added in `argv`.
            Kind::Dante => matches!(path, Path::Socks | Path::UdpSocks),
            Kind::Microsocks => path == Path::Socks,
            // Forwarded as they are, absolute-form requests reach the origin,
            // which takes them; there is no pooling, so a new client
            // connection is a new origin connection, as on the relay.
            Kind::Floor => matches!(path, Path::Relay | Path::Http),
            Kind::Extra { paths, .. } => paths.contains(&path),
        };
        if ok {
            return Ok(());
        }
        Err(match path {
            Path::Http => "no HTTP proxy",
            Path::Connect => "no CONNECT",
            Path::Socks => "no SOCKS",
            Path::Relay => "no TCP relay",
            Path::Ws => "no WebSocket",
            Path::UdpSocks => "no SOCKS5 UDP ASSOCIATE",
            Path::UdpRelay => "no UDP relay measured",
            Path::TlsTerm => "no TLS termination measured",
            Path::TlsOrig => "no TLS origination measured",
            Path::HttpsProxy => "no HTTPS proxy port measured",
        }
        .to_string())
    }

    /// `Err(reason)` when the program is not installed, or the kernel lacks
    /// what the variant measures.
    pub(super) fn installed(&self) -> std::result::Result<(), String> {
        if sys::which(&self.program()).is_none() {
            return Err("not installed".to_string());
        }
        let ktls = matches!(
            self.kind,
            Kind::Nginx { ktls: true, .. } | Kind::Rustle { variant: Variant::Ktls, .. }
        );
        if ktls && !variants::kernel_tls() {
            return Err("no kernel TLS: the kernel has no tls module".to_string());
        }
        Ok(())
    }

    /// rustle or one of its variants: started from the campaign's rustle binary.
    pub(super) fn is_rustle(&self) -> bool {
        matches!(self.kind, Kind::Rustle { .. })
    }

    fn variant(&self) -> Variant {
        match self.kind {
            Kind::Rustle { variant, .. } => variant,
            _ => Variant::Plain,
        }
    }

    /// Arguments the load generator needs against this proxy (credentials).
    pub(super) fn load_args(&self) -> Vec<String> {
        self.variant().load_args()
    }

    /// A URL the campaign fetches once a second while it measures (the
    /// metrics endpoint of `rustle-metrics`).
    pub(super) fn scrape_url(&self, site: &Site) -> Option<String> {
        self.variant().scrape_url(site)
    }

    /// Processes to start before the proxy and stop after it (an auth
    /// backend): (name, argv, the port each listens on once ready).
    pub(super) fn helpers(&self, site: &Site) -> Vec<(String, Vec<String>, u16)> {
        self.variant().helpers(site, &floor_exe())
    }

    /// How many addresses the proxy sends from towards the origin, to be
    /// given in [`Site::egress_ips`] (0: its own one).
    pub(super) fn egress_addresses(&self) -> usize {
        self.variant().egress_addresses()
    }

    /// The CPUs the proxy runs on: CPU 0 for one worker; both for two, so
    /// that the second worker has a CPU of its own to run on (shared with
    /// the client and the origin).
    pub(super) fn cpus(&self) -> &'static str {
        if self.workers() > 1 {
            "0,1"
        } else {
            "0"
        }
    }

    /// Worker processes or threads.
    fn workers(&self) -> u32 {
        match self.kind {
            Kind::Rustle { variant, .. } => variant.workers(),
            Kind::Nginx { workers, .. } => workers,
            Kind::Haproxy { threads, .. } => threads,
            _ => 1,
        }
    }

    /// Writes the configuration into `site.dir` and returns the argv.
    pub(super) fn argv(&self, path: Path, site: &Site) -> Result<Vec<String>> {
        let listen = format!("{}:{}", site.listen_ip, site.listen_port);
        if path.is_tls() && site.tls.is_none() {
            bail!("the TLS paths need the campaign's certificates");
        }
        let tls = |t: String| match site.tls {
            Some(f) => t
                .replace("@cert@", &f.chain.display().to_string())
                .replace("@key@", &f.key.display().to_string())
                .replace("@combined@", &f.combined.display().to_string())
                .replace("@origin_ca@", &f.origin_ca.display().to_string())
                .replace("@origin_name@", &f.origin_name),
            None => t,
        };
        let render = |t: &str| {
            tls(t.to_string())
                .replace("@dir@", &site.dir.display().to_string())
                .replace("@listen@", &listen)
                .replace("@ip@", site.listen_ip)
                .replace("@port@", &site.listen_port.to_string())
                .replace("@origin@", site.origin)
                .replace("@external@", site.external_ip)
                .replace("@workers@", &self.workers().to_string())
        };
        let write = |name: &str, text: String| -> Result<String> {
            let p = site.dir.join(name);
            std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
            Ok(p.display().to_string())
        };
        let dir = site.dir.display().to_string();
        let v: Vec<String> = match &self.kind {
            Kind::Rustle { bin, variant } => {
                // The TLS relays are listeners of the configuration file.
                let (flag, listener) = match path {
                    Path::Http | Path::Connect | Path::Ws => (Some(format!("--http={listen}")), ""),
                    Path::Socks | Path::UdpSocks => (Some(format!("--socks={listen}")), ""),
                    Path::Relay => (Some(format!("--relay={listen}={}", site.origin)), ""),
                    Path::UdpRelay => {
                        (Some(format!("--udp-relay={listen}={}", site.udp_origin)), "")
                    }
                    Path::TlsTerm => (None, RUSTLE_TLS_TERM),
                    Path::TlsOrig => (None, RUSTLE_TLS_ORIG),
                    Path::HttpsProxy => (None, RUSTLE_HTTPS_PROXY),
                };
                let listener = render(listener).replace("@ktls@", variant.ktls());
                let text = format!("{RUSTLE}\n{listener}\n{}", variant.config(site));
                let conf = write("rustle.toml", text)?;
                let bin = bin.display().to_string();
                let mut v = vec![bin.clone(), "--config".into(), conf];
                v.extend(flag);
                let workers = variant.workers().to_string();
                v.extend(["--workers".into(), workers, "--log".into(), "off".into()]);
                v.extend(variant.args(site)?);
                variant.wrap(&bin, v, site)?
            }
            Kind::Nginx { ktls, .. } => {
                let t = match path {
                    Path::Relay => NGINX_STREAM,
                    Path::TlsTerm => NGINX_TLS_TERM,
                    Path::TlsOrig => NGINX_TLS_ORIG,
                    _ => NGINX_HTTP,
                };
                // OpenSSL hands the sessions to the kernel (nginx 1.21.4+).
                let line = match (ktls, path) {
                    (true, Path::TlsTerm) => "ssl_conf_command Options KTLS;",
                    (true, Path::TlsOrig) => "proxy_ssl_conf_command Options KTLS;",
                    _ => "",
                };
                let conf = write("nginx.conf", render(t).replace("@ktls@", line))?;
                let log = format!("{dir}/error.log");
                vec!["nginx".into(), "-p".into(), dir, "-c".into(), conf, "-e".into(), log]
            }
            Kind::Haproxy { splice, .. } => {
                let t = match path {
                    Path::Relay => HAPROXY_TCP,
                    Path::TlsTerm => HAPROXY_TLS_TERM,
                    Path::TlsOrig => HAPROXY_TLS_ORIG,
                    _ => HAPROXY_HTTP,
                };
                // splice-auto: splice a direction once reads fill the buffer.
                let line = if *splice { "    option splice-auto" } else { "" };
                let conf = write("haproxy.cfg", render(t).replace("@splice@", line))?;
                vec!["haproxy".into(), "-db".into(), "-f".into(), conf]
            }
            Kind::Squid => {
                let conf = write("squid.conf", render(SQUID))?;
                vec!["squid".into(), "-N".into(), "-f".into(), conf]
            }
            Kind::Tinyproxy => {
                let conf = write("tinyproxy.conf", render(TINYPROXY))?;
                vec!["tinyproxy".into(), "-d".into(), "-c".into(), conf]
            }
            Kind::Dante => {
                let mut text = render(DANTE);
                if path == Path::UdpSocks {
                    // UDP ASSOCIATE and the datagrams coming back need their
                    // own commands; the shared template allows CONNECT only.
                    text =
                        text.replace("command: connect", "command: connect udpassociate udpreply");
                }
                let conf = write("danted.conf", text)?;
                let pid = format!("{dir}/danted.pid");
                vec!["danted".into(), "-f".into(), conf, "-N".into(), "1".into(), "-p".into(), pid]
            }
            Kind::Microsocks => {
                let port = site.listen_port.to_string();
                vec!["microsocks".into(), "-i".into(), site.listen_ip.into(), "-p".into(), port]
            }
            Kind::Stunnel => {
                let t = if path == Path::TlsTerm { STUNNEL_TLS_TERM } else { STUNNEL_TLS_ORIG };
                let conf = write("stunnel.conf", render(t))?;
                vec!["stunnel4".into(), conf]
            }
            Kind::Floor => vec![floor_exe(), "floor".into(), listen, site.origin.into()],
            Kind::Extra { command, .. } => tls(command
                .replace("{cert}", "@cert@")
                .replace("{key}", "@key@")
                .replace("{combined}", "@combined@")
                .replace("{origin_ca}", "@origin_ca@")
                .replace("{origin_name}", "@origin_name@"))
            .replace("{listen}", &listen)
            .replace("{listen_ip}", site.listen_ip)
            .replace("{listen_port}", &site.listen_port.to_string())
            .replace("{target}", if path.is_udp() { site.udp_origin } else { site.origin })
            .replace("{dir}", &dir)
            .split_whitespace()
            .map(String::from)
            .collect(),
        };
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn support_matrix_and_rendering() {
        let bin = PathBuf::from("/bin/true");
        let nginx = Proxy::named("nginx", &bin).unwrap();
        assert_eq!(nginx.supports(Path::Socks), Err("no SOCKS".to_string()));
        assert!(nginx.supports(Path::Relay).is_ok());
        assert!(Proxy::named("dante", &bin).unwrap().supports(Path::Http).is_err());
        assert!(Proxy::named("envoy", &bin).is_err());
        let dir = std::env::temp_dir().join(format!("rb-peers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let site = Site {
            dir: &dir,
            listen_ip: "127.0.0.1",
            listen_port: 3128,
            origin: "127.0.0.1:8080",
            udp_origin: "127.0.0.1:8081",
            external_ip: "127.0.0.1",
            tls: None,
            spare_ports: [3129, 3130],
            egress_ips: &[],
        };
        let hs = Proxy::named("haproxy-splice", &bin).unwrap();
        hs.argv(Path::Relay, &site).unwrap();
        let cfg = std::fs::read_to_string(dir.join("haproxy.cfg")).unwrap();
        assert!(cfg.contains("option splice-auto") && cfg.contains("bind 127.0.0.1:3128"));
        assert!(!cfg.contains('@'));
        let x = Proxy::extra("3proxy:http,connect=/opt/3proxy -p{listen_port} {target}").unwrap();
        assert!(x.supports(Path::Socks).is_err());
        assert_eq!(x.argv(Path::Http, &site).unwrap()[1], "-p3128");
        let micro = Proxy::named("microsocks", &bin).unwrap();
        assert!(micro.supports(Path::UdpSocks).is_err());
        let dante = Proxy::named("dante", &bin).unwrap();
        assert!(dante.supports(Path::UdpSocks).is_ok());
        assert!(dante.supports(Path::UdpRelay).is_err());
        dante.argv(Path::UdpSocks, &site).unwrap();
        let conf = std::fs::read_to_string(dir.join("danted.conf")).unwrap();
        assert!(conf.contains("command: connect udpassociate udpreply"), "{conf}");
        let rustle = Proxy::named("rustle", &bin).unwrap();
        let argv = rustle.argv(Path::UdpRelay, &site).unwrap();
        assert!(argv.contains(&"--udp-relay=127.0.0.1:3128=127.0.0.1:8081".to_string()));
        let argv = rustle.argv(Path::UdpSocks, &site).unwrap();
        assert!(argv.contains(&"--socks=127.0.0.1:3128".to_string()));
        let u = Proxy::extra("u:udp-relay=/opt/u {listen} {target}").unwrap();
        assert!(u.supports(Path::UdpRelay).is_ok() && u.supports(Path::UdpSocks).is_err());
        assert_eq!(u.argv(Path::UdpRelay, &site).unwrap()[2], "127.0.0.1:8081");
        let floor = Proxy::named("floor", &bin).unwrap();
        assert!(floor.supports(Path::Relay).is_ok() && floor.supports(Path::Http).is_ok());
        assert!(floor.supports(Path::Socks).is_err() && floor.supports(Path::Connect).is_err());
        let argv = floor.argv(Path::Relay, &site).unwrap();
        assert_eq!(argv[1..], ["floor", "127.0.0.1:3128", "127.0.0.1:8080"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tls_peers_render_their_files() {
        let bin = PathBuf::from("/bin/true");
        let dir = std::env::temp_dir().join(format!("rb-peers-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = TlsFiles {
            chain: "/t/p.pem".into(),
            key: "/t/p.key".into(),
            combined: "/t/p.combined.pem".into(),
            ca: "/t/ca.pem".into(),
            name: "proxy.test".into(),
            origin_ca: "/t/origin-ca.pem".into(),
            origin_name: "localhost".into(),
        };
        let mut site = Site {
            dir: &dir,
            listen_ip: "198.18.1.1",
            listen_port: 3128,
            origin: "198.18.2.2:8443",
            udp_origin: "198.18.2.2:8081",
            external_ip: "198.18.2.1",
            tls: Some(&files),
            spare_ports: [3129, 3130],
            egress_ips: &[],
        };
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
        let rustle = Proxy::named("rustle", &bin).unwrap();
        let argv = rustle.argv(Path::TlsOrig, &site).unwrap();
        assert!(!argv.iter().any(|a| a.starts_with("--relay")), "{argv:?}");
        let conf = read("rustle.toml");
        assert!(conf.contains("allow_open_proxy = true") && conf.contains("[listener.target_tls]"));
        assert!(
            conf.contains("ca = \"/t/origin-ca.pem\"")
                && conf.contains("target = \"198.18.2.2:8443\"")
        );
        rustle.argv(Path::TlsTerm, &site).unwrap();
        assert!(read("rustle.toml").contains("cert = \"/t/p.pem\""));
        let nginx = Proxy::named("nginx", &bin).unwrap();
        nginx.argv(Path::TlsTerm, &site).unwrap();
        let conf = read("nginx.conf");
        assert!(
            conf.contains("listen 198.18.1.1:3128 ssl")
                && conf.contains("ssl_certificate_key /t/p.key;")
        );
        nginx.argv(Path::TlsOrig, &site).unwrap();
        let conf = read("nginx.conf");
        assert!(conf.contains("proxy_ssl_trusted_certificate /t/origin-ca.pem;"));
        assert!(
            conf.contains("proxy_ssl_name localhost;")
                && conf.contains("proxy_ssl_session_reuse on;")
        );
        let haproxy = Proxy::named("haproxy", &bin).unwrap();
        haproxy.argv(Path::TlsTerm, &site).unwrap();
        assert!(read("haproxy.cfg").contains("ssl crt /t/p.combined.pem ssl-min-ver TLSv1.3"));
        haproxy.argv(Path::TlsOrig, &site).unwrap();
        assert!(read("haproxy.cfg")
            .contains("verify required ca-file /t/origin-ca.pem verifyhost localhost"));
        assert!(Proxy::named("haproxy-splice", &bin).unwrap().supports(Path::TlsTerm).is_err());
        let stunnel = Proxy::named("stunnel", &bin).unwrap();
        assert!(stunnel.supports(Path::Relay).is_err() && stunnel.supports(Path::TlsOrig).is_ok());
        assert_eq!(stunnel.package(), Some("stunnel4"));
        let argv = stunnel.argv(Path::TlsOrig, &site).unwrap();
        assert_eq!(argv[0], "stunnel4");
        let conf = read("stunnel.conf");
        assert!(conf.contains("client = yes") && conf.contains("checkHost = localhost"));
        assert!(
            conf.contains("accept = 198.18.1.1:3128") && conf.contains("connect = 198.18.2.2:8443")
        );
        stunnel.argv(Path::TlsTerm, &site).unwrap();
        let conf = read("stunnel.conf");
        assert!(!conf.contains("client = yes") && conf.contains("cert = /t/p.pem"));
        for f in ["rustle.toml", "nginx.conf", "haproxy.cfg", "stunnel.conf"] {
            assert!(!read(f).contains('@'), "{f} has a placeholder left");
        }
        let x = Proxy::extra("x:tls-term=/opt/x {listen} {cert} {key} {target}").unwrap();
        let argv = x.argv(Path::TlsTerm, &site).unwrap();
        assert_eq!(argv[2..], ["/t/p.pem", "/t/p.key", "198.18.2.2:8443"]);
        site.tls = None;
        assert!(nginx.argv(Path::TlsTerm, &site).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
