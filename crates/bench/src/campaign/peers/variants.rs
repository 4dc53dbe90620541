//! rustle's named variants (`rustle-2w`, `rustle-kernel`, `rustle-parent1`,
//! ...): the campaign's rustle with one feature turned on, so that a row
//! beside plain `rustle` says what that feature costs. Each variant adds a
//! fragment to the campaign's rustle.toml and arguments to its command line,
//! and may ask the load generator for credentials, the campaign for a
//! metrics scrape or for outgoing addresses.

use anyhow::{Context, Result};

use super::super::scenario::Path;
use super::Site;

/// The user the auth and quota variants know, and its password, in the
/// users file as `plain:` (kept as its SHA-256). What the variants measure is
/// the check of every request's credentials once they are remembered
/// (`[auth] cache_ttl`); an argon2id hash would add its one-time cost, paid
/// for each of the load's first connections, which arrive together, and
/// rustle's default `max_hashes_per_client` would refuse most of those.
const USER: &str = "bench";
const PASSWORD: &str = "campaign-secret";

/// The user `rustle-bench auth-servers --http` allows (`auth_servers::answer`).
const CALLBACK_CREDENTIALS: &str = "alice:secret";

/// Outgoing addresses `rustle-egress` rotates over.
const EGRESS_ADDRESSES: usize = 4;

/// The grace delay of `rustle-grace`: as 3proxy's `-g8000,3,2`, a relay
/// direction waits 2 ms after 3 small reads in a row.
const GRACE_READS: u32 = 3;
const GRACE_DELAY: &str = "2ms";

/// Tries of 50 ms each for a parent to listen before the chain gives up.
const PARENT_WAIT_TRIES: u32 = 200;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Variant {
    /// The campaign's rustle: one worker, nothing turned on.
    Plain,
    /// `--workers N`.
    Workers(u32),
    /// `[relay] kernel_forwarding = "auto"`: busy plain tunnels move inside
    /// the kernel.
    Kernel,
    /// The relay's grace delay ([`GRACE_READS`], [`GRACE_DELAY`]).
    Grace,
    /// The admin endpoint on, its `/metrics` scraped once a second.
    Metrics,
    /// A chain of this many further rustle processes, each an HTTP parent
    /// proxy of the one before, between the proxy and the origin.
    Parents(usize),
    /// A users file: clients authenticate (Basic; RFC 1929 on SOCKS5).
    Auth,
    /// Users checked by an HTTP callback (`[[auth.backend]] kind = "http"`,
    /// answers remembered for `cache_ttl`, 5 minutes by default), the
    /// campaign's `rustle-bench auth-servers --http` beside the proxy.
    AuthHttp,
    /// As `Auth`, with a traffic quota per user (far above what a run moves)
    /// whose usage is written to the run's scratch directory.
    Quota,
    /// The outgoing address rotated over [`EGRESS_ADDRESSES`] addresses.
    Egress,
    /// Kernel TLS on the TLS relays (`[tls] ktls = "auto"`).
    Ktls,
}

/// Every variant by its `--proxies` name.
pub(super) const NAMES: &[(&str, Variant)] = &[
    ("rustle", Variant::Plain),
    ("rustle-2w", Variant::Workers(2)),
    ("rustle-kernel", Variant::Kernel),
    ("rustle-grace", Variant::Grace),
    ("rustle-metrics", Variant::Metrics),
    ("rustle-parent1", Variant::Parents(1)),
    ("rustle-parent2", Variant::Parents(2)),
    ("rustle-auth", Variant::Auth),
    ("rustle-auth-http", Variant::AuthHttp),
    ("rustle-quota", Variant::Quota),
    ("rustle-egress", Variant::Egress),
    ("rustle-ktls", Variant::Ktls),
];

impl Variant {
    pub(super) fn named(name: &str) -> Option<Variant> {
        NAMES.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    /// The paths the variant is measured on (its feature acts there).
    pub(super) fn serves(self, path: Path) -> bool {
        match self {
            Variant::Plain | Variant::Workers(_) | Variant::Metrics => true,
            // Socket relays: the kernel takes over plain tunnels, and the
            // grace delay acts in the relay loop.
            Variant::Kernel | Variant::Grace => {
                matches!(path, Path::Connect | Path::Socks | Path::Relay)
            }
            Variant::Parents(_)
            | Variant::Auth
            | Variant::AuthHttp
            | Variant::Quota
            | Variant::Egress => {
                matches!(path, Path::Http | Path::Connect | Path::Socks)
            }
            Variant::Ktls => matches!(path, Path::TlsTerm | Path::TlsOrig),
        }
    }

    /// The paths of [`Variant::serves`] in words, for a skipped cell.
    pub(super) fn paths(self) -> &'static str {
        match self {
            Variant::Plain | Variant::Workers(_) | Variant::Metrics => "every path",
            Variant::Kernel | Variant::Grace => "CONNECT, SOCKS and relay only",
            Variant::Parents(_)
            | Variant::Auth
            | Variant::AuthHttp
            | Variant::Quota
            | Variant::Egress => "HTTP, CONNECT and SOCKS only",
            Variant::Ktls => "the TLS paths only",
        }
    }

    pub(super) fn workers(self) -> u32 {
        match self {
            Variant::Workers(n) => n,
            _ => 1,
        }
    }

    /// `[tls] ktls` of the TLS relay templates.
    pub(super) fn ktls(self) -> &'static str {
        if self == Variant::Ktls {
            "auto"
        } else {
            "off"
        }
    }

    /// What the variant appends to the campaign's rustle.toml.
    pub(super) fn config(self, site: &Site) -> String {
        match self {
            Variant::Plain | Variant::Workers(_) | Variant::Auth | Variant::Ktls => String::new(),
            Variant::Kernel => "[relay]\nkernel_forwarding = \"auto\"\n".into(),
            Variant::Grace => {
                format!("[relay]\ngrace_reads = {GRACE_READS}\ngrace_delay = \"{GRACE_DELAY}\"\n")
            }
            // On the client-side address, answered to the campaign's own
            // addresses only (rustle wants `allow` or a token off loopback).
            Variant::Metrics => format!(
                "[admin]\nlisten = \"{}:{}\"\nallow = [\"127.0.0.0/8\", \"198.18.0.0/15\"]\n",
                site.listen_ip, site.spare_ports[0]
            ),
            Variant::Parents(_) => parent_of(site.spare_ports[0]),
            // The load's first connections arrive together from one address,
            // each calling before the first answer is remembered: every call
            // at once, and none counted against the address's failure budget
            // (a check counts as failed until it succeeds), as
            // bench/auth-cost.sh runs it.
            Variant::AuthHttp => format!(
                "[auth]\nfailures_burst = 1000000\nfailures_per_minute = 1000000\n\n\
                 [[auth.backend]]\nkind = \"http\"\nurl = \"http://127.0.0.1:{}/check\"\n\
                 max_in_flight = 4096\n",
                site.spare_ports[0]
            ),
            Variant::Quota => format!(
                "[state]\npath = \"{}/usage.json\"\n\n[[quota]]\nname = \"campaign\"\n\
                 users = [\"{USER}\"]\nbytes = \"100TiB\"\nperiod = \"day\"\n",
                site.dir.display()
            ),
            Variant::Egress => {
                let list: Vec<String> =
                    site.egress_ips.iter().map(|a| format!("\"{a}\"")).collect();
                format!(
                    "[[route]]\nname = \"egress\"\nvia = \"direct\"\nbind = [{}]\n\
                     bind_pick = \"round-robin\"\n",
                    list.join(", ")
                )
            }
        }
    }

    /// Arguments after the campaign's own (`--workers`, `--log off`); writes
    /// the files they name into the scratch directory.
    pub(super) fn args(self, site: &Site) -> Result<Vec<String>> {
        match self {
            Variant::Auth | Variant::Quota | Variant::AuthHttp => {
                // Empty for the callback: `--users` makes the listeners ask
                // for credentials, which the file lacks and the callback has.
                let text = match self {
                    Variant::AuthHttp => String::new(),
                    _ => format!("{USER}:plain:{PASSWORD}\n"),
                };
                let p = site.dir.join("users");
                std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
                Ok(vec!["--users".into(), p.display().to_string()])
            }
            _ => Ok(Vec::new()),
        }
    }

    /// The argv that starts the proxy, `front` being rustle's own: for the
    /// parent chains, a shell script that starts the parents, waits until
    /// each listens, then becomes the front rustle, so that all of them are
    /// one process tree (measured together) and the front listens, which is
    /// what the campaign waits for, only once the chain is up.
    pub(super) fn wrap(self, bin: &str, front: Vec<String>, site: &Site) -> Result<Vec<String>> {
        let Variant::Parents(n) = self else { return Ok(front) };
        let ports = &site.spare_ports[..n.min(site.spare_ports.len())];
        let base = super::RUSTLE;
        let mut script = String::from(
            "# The parent proxies, then (once they listen) the front rustle in their place.\n",
        );
        script.push_str(&format!(
            "wait_port() {{\n  i=0\n  until grep -q \":$1 00000000:0000 0A\" /proc/net/tcp; do\n    \
             i=$((i + 1))\n    if [ \"$i\" -gt {PARENT_WAIT_TRIES} ]; then\n      \
             echo \"parent on port $2 not listening\" >&2\n      exit 1\n    fi\n    \
             sleep 0.05\n  done\n}}\n"
        ));
        for (i, port) in ports.iter().enumerate() {
            let next = ports.get(i + 1).map(|p| parent_of(*p)).unwrap_or_default();
            let conf = site.dir.join(format!("parent-{}.toml", i + 1));
            std::fs::write(&conf, format!("{base}\n{next}"))
                .with_context(|| format!("writing {}", conf.display()))?;
            let argv = [
                bin.to_string(),
                "--config".into(),
                conf.display().to_string(),
                format!("--http=127.0.0.1:{port}"),
                "--workers".into(),
                "1".into(),
                "--log".into(),
                "off".into(),
            ];
            script.push_str(&shell_line(&argv));
            script.push_str(" &\n");
        }
        for port in ports {
            script.push_str(&format!("wait_port {port:04X} {port}\n"));
        }
        script.push_str("exec ");
        script.push_str(&shell_line(&front));
        script.push('\n');
        let p = site.dir.join("chain.sh");
        std::fs::write(&p, script).with_context(|| format!("writing {}", p.display()))?;
        Ok(vec!["sh".into(), p.display().to_string()])
    }

    /// Arguments the load generator needs against this variant.
    pub(super) fn load_args(self) -> Vec<String> {
        match self {
            Variant::Auth | Variant::Quota => {
                vec!["--proxy-user".into(), format!("{USER}:{PASSWORD}")]
            }
            Variant::AuthHttp => vec!["--proxy-user".into(), CALLBACK_CREDENTIALS.into()],
            _ => Vec::new(),
        }
    }

    /// Processes the proxy relies on, started before it (in its namespace,
    /// on the client's CPU: not measured as the proxy) and stopped after it:
    /// (name, argv, the TCP port that says it is ready).
    pub(super) fn helpers(self, site: &Site, exe: &str) -> Vec<(String, Vec<String>, u16)> {
        if self != Variant::AuthHttp {
            return Vec::new();
        }
        let port = site.spare_ports[0];
        // auth-servers runs until its standard input ends: a pipe from a
        // sleep that ends with it.
        let script = format!("sleep infinity | exec \"$0\" auth-servers --http 127.0.0.1:{port}");
        let argv = vec!["sh".into(), "-c".into(), script, exe.into()];
        vec![("auth-callback".into(), argv, port)]
    }

    /// The URL the campaign scrapes once a second while measuring.
    pub(super) fn scrape_url(self, site: &Site) -> Option<String> {
        (self == Variant::Metrics)
            .then(|| format!("http://{}:{}/metrics", site.listen_ip, site.spare_ports[0]))
    }

    /// How many outgoing addresses the variant wants in [`Site::egress_ips`].
    pub(super) fn egress_addresses(self) -> usize {
        if self == Variant::Egress {
            EGRESS_ADDRESSES
        } else {
            0
        }
    }
}

/// Everything through the HTTP parent proxy on loopback `port`.
fn parent_of(port: u16) -> String {
    format!(
        "[[parent]]\nname = \"next\"\nkind = \"http\"\naddress = \"127.0.0.1:{port}\"\n\n\
         [[route]]\nname = \"all\"\nvia = \"next\"\n"
    )
}

/// `argv` as one line of sh, every word single-quoted.
fn shell_line(argv: &[String]) -> String {
    let words: Vec<String> =
        argv.iter().map(|a| format!("'{}'", a.replace('\'', "'\\''"))).collect();
    words.join(" ")
}

/// True when the kernel can take TLS sessions: its `tls` module is loaded
/// (loaded here with modprobe where that is installed, once per campaign).
pub(super) fn kernel_tls() -> bool {
    static ANSWER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ANSWER.get_or_init(|| {
        let stat = std::path::Path::new("/proc/net/tls_stat");
        if stat.exists() {
            return true;
        }
        if let Some(modprobe) = super::sys::which("modprobe") {
            let _ = std::process::Command::new(modprobe)
                .args(["-q", "tls"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
        stat.exists()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::{Proxy, Site, TlsFiles, KNOWN};
    use super::*;
    use std::path::PathBuf;

    fn site<'a>(
        dir: &'a std::path::Path,
        tls: Option<&'a TlsFiles>,
        egress: &'a [String],
    ) -> Site<'a> {
        Site {
            dir,
            listen_ip: "127.0.0.1",
            listen_port: 3128,
            origin: "127.0.0.1:8080",
            udp_origin: "127.0.0.1:8081",
            external_ip: "127.0.0.1",
            tls,
            spare_ports: [3129, 3130],
            egress_ips: egress,
        }
    }

    /// Renders `name` on `path` and returns its argv and rustle.toml (or the
    /// peer's file `file`), checked to be TOML when it is rustle's.
    fn render(name: &str, path: Path, site: &Site, file: &str) -> (Vec<String>, String) {
        let p = Proxy::named(name, &PathBuf::from("/bin/rustle")).unwrap();
        assert!(p.supports(path).is_ok(), "{name} on {path:?}");
        let argv = p.argv(path, site).unwrap();
        let text = std::fs::read_to_string(site.dir.join(file)).unwrap();
        let code = text.lines().filter(|l| !l.trim_start().starts_with('#'));
        assert!(!code.clone().any(|l| l.contains('@')), "{name}: a placeholder left:\n{text}");
        if file.ends_with(".toml") {
            text.parse::<toml::Table>().unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        }
        (argv, text)
    }

    #[test]
    fn every_name_is_known_and_paths_follow_the_feature() {
        let bin = PathBuf::from("/bin/rustle");
        for name in KNOWN {
            assert!(Proxy::named(name, &bin).is_ok(), "{name}");
        }
        for (name, _) in NAMES {
            assert!(KNOWN.contains(name), "{name} missing from KNOWN");
        }
        let named = |n: &str| Proxy::named(n, &bin).unwrap();
        let skipped = named("rustle-kernel").supports(Path::Http);
        assert_eq!(skipped, Err("rustle-kernel: CONNECT, SOCKS and relay only".to_string()));
        assert!(named("rustle-kernel").supports(Path::Relay).is_ok());
        assert!(named("rustle-grace").supports(Path::Socks).is_ok());
        assert!(named("rustle-parent1").supports(Path::Relay).is_err());
        assert!(named("rustle-auth").supports(Path::Socks).is_ok());
        assert!(named("rustle-egress").supports(Path::Ws).is_err());
        assert!(named("rustle-ktls").supports(Path::TlsTerm).is_ok());
        assert!(named("rustle-ktls").supports(Path::Connect).is_err());
        assert!(named("nginx-ktls").supports(Path::Http).is_err());
        assert!(named("nginx-2w").supports(Path::Relay).is_ok());
        assert!(named("haproxy-2t").supports(Path::Socks).is_err());
        assert_eq!(named("nginx-2w").package(), Some("nginx-light"));
        assert_eq!(named("haproxy-2t").package(), Some("haproxy"));
        assert_eq!(named("rustle-quota").load_args(), ["--proxy-user", "bench:campaign-secret"]);
        assert!(named("rustle").load_args().is_empty());
        assert_eq!(named("rustle-egress").egress_addresses(), EGRESS_ADDRESSES);
        assert_eq!(named("rustle-metrics").egress_addresses(), 0);
    }

    #[test]
    fn variants_render_their_settings() {
        let dir = std::env::temp_dir().join(format!("rb-variants-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = site(&dir, None, &[]);

        let (argv, conf) = render("rustle", Path::Http, &s, "rustle.toml");
        assert!(argv.windows(2).any(|w| w == ["--workers", "1"]));
        assert!(!conf.contains("[relay]") && !conf.contains("[admin]"));
        let (argv, _) = render("rustle-2w", Path::Http, &s, "rustle.toml");
        assert!(argv.windows(2).any(|w| w == ["--workers", "2"]));
        let (_, conf) = render("nginx-2w", Path::Http, &s, "nginx.conf");
        assert!(conf.contains("worker_processes 2;"));
        let (_, conf) = render("nginx", Path::Relay, &s, "nginx.conf");
        assert!(conf.contains("worker_processes 1;"));
        let (_, conf) = render("haproxy-2t", Path::Relay, &s, "haproxy.cfg");
        assert!(conf.contains("nbthread 2"));

        let (_, conf) = render("rustle-kernel", Path::Relay, &s, "rustle.toml");
        assert!(conf.contains("[relay]\nkernel_forwarding = \"auto\""));
        let (_, conf) = render("rustle-grace", Path::Connect, &s, "rustle.toml");
        assert!(conf.contains("grace_reads = 3\ngrace_delay = \"2ms\""));

        let p = Proxy::named("rustle-metrics", &PathBuf::from("/bin/rustle")).unwrap();
        let (_, conf) = render("rustle-metrics", Path::Http, &s, "rustle.toml");
        assert!(conf.contains("[admin]\nlisten = \"127.0.0.1:3129\""));
        assert_eq!(p.scrape_url(&s).unwrap(), "http://127.0.0.1:3129/metrics");
        assert_eq!(Proxy::named("rustle", &PathBuf::from("/x")).unwrap().scrape_url(&s), None);

        // The chain: front -> parent 1 (3129) -> parent 2 (3130) -> origin.
        let (argv, conf) = render("rustle-parent2", Path::Connect, &s, "rustle.toml");
        assert_eq!(argv, ["sh".to_string(), dir.join("chain.sh").display().to_string()]);
        assert!(conf.contains("address = \"127.0.0.1:3129\"") && conf.contains("via = \"next\""));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
        let p1 = read("parent-1.toml");
        p1.parse::<toml::Table>().unwrap();
        assert!(p1.contains("address = \"127.0.0.1:3130\""));
        assert!(!read("parent-2.toml").contains("[[parent]]"));
        let script = read("chain.sh");
        assert!(script.contains("'--http=127.0.0.1:3129' '--workers' '1' '--log' 'off' &"));
        assert!(script.contains("'--http=127.0.0.1:3130'"));
        assert!(script.contains("wait_port 0C39 3129\nwait_port 0C3A 3130\nexec '/bin/rustle'"));
        assert!(script.contains("'--http=127.0.0.1:3128'"));
        render("rustle-parent1", Path::Socks, &s, "rustle.toml");
        let script = read("chain.sh");
        assert!(script.contains("wait_port 0C39 3129\nexec") && !script.contains("3130"));
        assert!(!read("parent-1.toml").contains("[[parent]]"));

        let (argv, _) = render("rustle-auth", Path::Socks, &s, "rustle.toml");
        let users = dir.join("users").display().to_string();
        assert!(argv.windows(2).any(|w| w == ["--users".to_string(), users.clone()]));
        assert_eq!(read("users"), "bench:plain:campaign-secret\n");
        let (argv, conf) = render("rustle-quota", Path::Http, &s, "rustle.toml");
        assert!(argv.contains(&users));
        assert!(conf.contains(&format!("path = \"{}/usage.json\"", dir.display())));
        assert!(conf.contains("[[quota]]") && conf.contains("users = [\"bench\"]"));

        let (argv, conf) = render("rustle-auth-http", Path::Connect, &s, "rustle.toml");
        assert!(argv.contains(&users) && read("users").is_empty());
        assert!(conf.contains("kind = \"http\"\nurl = \"http://127.0.0.1:3129/check\""));
        let p = Proxy::named("rustle-auth-http", &PathBuf::from("/bin/rustle")).unwrap();
        assert_eq!(p.load_args(), ["--proxy-user", "alice:secret"]);
        let helpers = p.helpers(&s);
        assert_eq!(helpers.len(), 1);
        let (_, argv, ready) = &helpers[0];
        assert_eq!(*ready, 3129);
        assert!(argv[2].ends_with("auth-servers --http 127.0.0.1:3129"), "{argv:?}");
        assert!(Proxy::named("rustle-auth", &PathBuf::from("/x")).unwrap().helpers(&s).is_empty());

        let ips: Vec<String> = (2..6).map(|i| format!("127.0.0.{i}")).collect();
        let e = site(&dir, None, &ips);
        let (_, conf) = render("rustle-egress", Path::Http, &e, "rustle.toml");
        assert!(conf.contains(
            "bind = [\"127.0.0.2\", \"127.0.0.3\", \"127.0.0.4\", \"127.0.0.5\"]\n\
             bind_pick = \"round-robin\""
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn kernel_tls_variants() {
        let dir = std::env::temp_dir().join(format!("rb-variants-tls-{}", std::process::id()));
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
        let s = site(&dir, Some(&files), &[]);
        for path in [Path::TlsTerm, Path::TlsOrig] {
            let (_, conf) = render("rustle", path, &s, "rustle.toml");
            assert!(conf.contains("[tls]\nktls = \"off\""), "{conf}");
            let (_, conf) = render("rustle-ktls", path, &s, "rustle.toml");
            assert!(conf.contains("[tls]\nktls = \"auto\""), "{conf}");
            let (_, conf) = render("nginx", path, &s, "nginx.conf");
            assert!(!conf.contains("KTLS"));
        }
        let (_, conf) = render("nginx-ktls", Path::TlsTerm, &s, "nginx.conf");
        assert!(conf.contains("\n        ssl_conf_command Options KTLS;\n"));
        let (_, conf) = render("nginx-ktls", Path::TlsOrig, &s, "nginx.conf");
        assert!(conf.contains("\n        proxy_ssl_conf_command Options KTLS;\n"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
