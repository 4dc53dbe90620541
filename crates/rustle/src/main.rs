//! The `rustle` command: parses the command line, loads the configuration, and runs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use rustle::config::{
    HostPort, ListenTls, Listener, ListenerKind, LogFormat, LogTarget, Overrides, Source,
};

/// The end of `--help` and of the manual page: (heading, [(item, what it is)]).
const MORE: &[(&str, &[(&str, &str)])] = &[
    (
        "Files",
        &[(
            "/etc/rustle/rustle.toml",
            "the configuration read when --config is not given, if it exists",
        )],
    ),
    (
        "Environment",
        &[
            (
                "RUSTLE_CONFIG",
                "the file read in its place when --config is not given (empty: none)",
            ),
            ("RUST_LOG", "the diagnostics filter, over [log] level"),
            ("RUSTLE_ADMIN_TOKEN", "the admin token rustle user sends, over the configuration's"),
        ],
    ),
    (
        "Signals",
        &[
            ("SIGHUP", "read the configuration again (rustle reload: and print the outcome)"),
            ("SIGUSR1", "reopen the access log file"),
            ("SIGTERM, SIGINT", "stop accepting, let connections finish, exit"),
        ],
    ),
];

/// `MORE` as the end of `--help`.
fn more_help() -> String {
    let mut out = String::new();
    for (heading, items) in MORE {
        out.push_str(&format!("{heading}:\n"));
        for (item, what) in *items {
            out.push_str(&format!("  {item:<24} {what}\n"));
        }
        out.push('\n');
    }
    out.trim_end().to_string()
}

/// `MORE` as sections of the manual page (roff).
fn more_roff() -> String {
    let esc = |s: &str| s.replace('\\', "\\e").replace('-', "\\-");
    let mut out = String::new();
    for (heading, items) in MORE {
        out.push_str(&format!(".SH {}\n", heading.to_uppercase()));
        for (item, what) in *items {
            out.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", esc(item), esc(what)));
        }
    }
    out
}

#[derive(Parser)]
#[command(name = "rustle", version, about = "A fast, lean forward proxy", after_long_help = more_help())]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Configuration file (TOML); see rustle.example.toml. Without it, /etc/rustle/rustle.toml
    /// is read if it exists ($RUSTLE_CONFIG names another default file; empty: none).
    #[arg(long, short, value_name = "FILE")]
    config: Option<PathBuf>,
    /// HTTP proxy listener (repeatable). Any listener flag replaces the file's listeners.
    #[arg(long, value_name = "ADDR")]
    http: Vec<SocketAddr>,
    /// SOCKS4/4a/5 listener (repeatable).
    #[arg(long, value_name = "ADDR")]
    socks: Vec<SocketAddr>,
    /// Listener detecting HTTP, SOCKS4 and SOCKS5 from the first byte (repeatable).
    #[arg(long, value_name = "ADDR")]
    auto: Vec<SocketAddr>,
    /// HTTPS proxy listener: the HTTP proxy inside TLS (repeatable; needs --tls-cert and
    /// --tls-key).
    #[arg(long, value_name = "ADDR", requires_all = ["tls_cert", "tls_key"])]
    https: Vec<SocketAddr>,
    /// Certificate chain (PEM, leaf first) for --https listeners.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// TCP port relay: every connection to LISTEN goes to TARGET (repeatable).
    #[arg(long, value_name = "LISTEN=TARGET", value_parser = relay_arg)]
    relay: Vec<(SocketAddr, HostPort)>,
    /// UDP port relay: every datagram to LISTEN goes to TARGET (repeatable).
    #[arg(long, value_name = "LISTEN=TARGET", value_parser = relay_arg)]
    udp_relay: Vec<(SocketAddr, HostPort)>,
    /// Worker threads, each with its own runtime (0: one per core).
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Access-log format, or `off`.
    #[arg(long, value_name = "FORMAT")]
    log: Option<LogArg>,
    /// Users file (`name:hash` lines): every listener started from the command line (or
    /// the default ones) then requires authentication.
    #[arg(long, value_name = "FILE")]
    users: Option<PathBuf>,
    /// Where access-log lines go: stdout, stderr, a file, syslog[:/path or :udp://ADDR]
    /// or journald.
    #[arg(long, value_name = "PATH", value_parser = LogTarget::parse)]
    access_log: Option<LogTarget>,
    /// Take the listening sockets over from the rustle running with the same control
    /// socket ([process] control_socket), which then drains and exits: an upgrade or a
    /// restart that refuses no connection.
    #[arg(long)]
    takeover: bool,
    /// With --takeover: the new configuration may leave a listener less protected than the
    /// running process's (no longer requiring `auth` or client certificates).
    #[arg(long, requires = "takeover")]
    allow_less_protection: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Check a configuration file and print every problem with its line.
    Check {
        /// The file to check (`rustle --config FILE check` works too).
        #[arg(long, short, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Skip the test that each listener's address is free (on a build machine, or with
        /// the rustle to reload holding them).
        #[arg(long)]
        no_bind: bool,
    },
    /// Ask the running rustle (found by the control socket, as --takeover finds it) to read
    /// its configuration again, and print the outcome: `reloaded`, or why it refused.
    Reload {
        /// The configuration file naming the control socket (`rustle --config FILE reload`
        /// works too).
        #[arg(long, short, value_name = "FILE")]
        config: Option<PathBuf>,
        /// The new configuration may leave a listener less protected than the running one
        /// (no longer requiring `auth` or client certificates).
        #[arg(long)]
        allow_less_protection: bool,
    },
    /// Print a users-file line (`NAME:$argon2id$...`) for a password read from the
    /// terminal (without echo) or from standard input.
    Passwd {
        /// The user name.
        name: String,
    },
    /// Write certificates for a TLS listener.
    Cert {
        /// Write DIR/ca.pem (a fresh CA), DIR/NAME.pem (leaf + CA) and DIR/NAME.key for
        /// NAME (a host name or IP address), ECDSA P-256.
        #[arg(long, value_name = "NAME")]
        self_signed: String,
        /// Directory for the files (created if needed; existing files are not overwritten).
        #[arg(long, value_name = "DIR", default_value = ".")]
        out: PathBuf,
    },
    /// Manage the users of the running rustle through its admin API (`[admin] listen`
    /// and `api_token_file` from the configuration, or the flags and `RUSTLE_ADMIN_TOKEN`).
    User {
        /// The configuration naming the admin listener and its token.
        #[arg(long, short, value_name = "FILE")]
        config: Option<PathBuf>,
        /// The admin listener's address, in place of the configuration's.
        #[arg(long, value_name = "ADDR")]
        admin: Option<std::net::SocketAddr>,
        /// A file holding the users API token, in place of the configuration's.
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// Print the API's JSON rather than a table.
        #[arg(long)]
        json: bool,
        #[command(subcommand)]
        action: UserAction,
    },
    /// Print the manual page (roff): `rustle man | man -l -`.
    Man {
        /// Write rustle.1 and a page per subcommand (rustle-check.1, ...) into DIR instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Print the completion script for SHELL: `source <(rustle completions bash)`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand)]
enum UserAction {
    /// Every user: state, source, groups, traffic, open connections, bandwidth.
    List,
    /// One user.
    Get { name: String },
    /// Add a user; its password is asked for (or read from standard input).
    Add {
        name: String,
        /// Read the password from standard input (its first line).
        #[arg(long)]
        password_stdin: bool,
        /// A group of the user (repeat for more).
        #[arg(long = "group", value_name = "G")]
        groups: Vec<String>,
    },
    /// Refuse the user's new requests and end its open connections.
    Disable { name: String },
    /// Let a disabled user in again.
    Enable { name: String },
    /// Remove the user (a user of the users file too) and end its open connections.
    Remove { name: String },
    /// Set the user's bandwidth: `--limit rate_up=10mbit --limit rate_down=50mbit`.
    Set {
        name: String,
        #[arg(long = "limit", value_name = "K=V", required = true)]
        limits: Vec<String>,
    },
    /// Forget the user's usage of a quota (of every quota without `--quota`) in the
    /// current period; a user refused for it is let in at once.
    Reset {
        name: String,
        /// The quota (its `[[quota]] name`).
        #[arg(long, value_name = "Q")]
        quota: Option<String>,
    },
    /// Allow the user more bytes of a quota in the current period.
    TopUp {
        name: String,
        /// The quota (its `[[quota]] name`).
        #[arg(long, value_name = "Q")]
        quota: String,
        /// Bytes: a number or a size (`1MB`, `5GiB`).
        #[arg(long, value_name = "N")]
        bytes: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum LogArg {
    Plain,
    Json,
    Squid,
    Off,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Passwd { name }) = &cli.command {
        return passwd(name);
    }
    if let Some(Command::Cert { self_signed, out }) = &cli.command {
        return cert(self_signed, out);
    }
    if let Some(Command::User { config, admin, token_file, json, action }) = &cli.command {
        let file = config.clone().or_else(|| cli.config.clone());
        return user(file.as_deref(), *admin, token_file.as_deref(), *json, action);
    }
    if let Some(Command::Man { dir }) = &cli.command {
        return man(dir.as_deref());
    }
    if let Some(Command::Completions { shell }) = &cli.command {
        clap_complete::generate(*shell, &mut Cli::command(), "rustle", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    // Without --config, the default file if it exists.
    let default = rustle::config::default_file();
    let file = cli.config.clone().or_else(|| default.clone().filter(|f| f.exists()));
    // `rustle check --config FILE` or `rustle --config FILE check`.
    if let Some(Command::Check { config, no_bind }) = &cli.command {
        return check(config.as_deref().or(file.as_deref()), !*no_bind);
    }
    if let Some(Command::Reload { config, allow_less_protection }) = &cli.command {
        return reload(config.as_deref().or(file.as_deref()), *allow_less_protection);
    }
    let source = Source { file, overrides: overrides(&cli) };
    let loaded = match rustle::run::check::source(&source) {
        Ok(loaded) => loaded,
        Err(problems) => {
            eprintln!("{problems}");
            return ExitCode::from(2);
        }
    };
    let set_log_level = init_tracing(&loaded.config.log);
    match (&source.file, &default) {
        (Some(file), _) => tracing::info!("configuration: {}", file.display()),
        (None, Some(default)) => tracing::info!(
            "no configuration file ({} does not exist): the command line and the defaults",
            default.display()
        ),
        (None, None) => tracing::info!("no configuration file: the command line and the defaults"),
    }
    if let Err(msg) = loaded.config.check_listeners() {
        tracing::error!("{msg}");
        return ExitCode::from(2);
    }
    rustle::run::server::raise_file_limit(&loaded.config);
    let opts = rustle::run::reload::Options {
        takeover: cli.takeover,
        set_log_level,
        allow_less_protection: cli.allow_less_protection,
    };
    match rustle::run::reload::run_until_signal(loaded, source, opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// What the command line sets on top of the file, at start and at every reload.
fn overrides(cli: &Cli) -> Overrides {
    let mut listeners: Vec<Listener> = Vec::new();
    let simple = [(&cli.http, ListenerKind::Http), (&cli.socks, ListenerKind::Socks)];
    for (addrs, kind) in simple.into_iter().chain([(&cli.auto, ListenerKind::Auto)]) {
        listeners.extend(addrs.iter().map(|&a| Listener::new(kind, a)));
    }
    if let (Some(cert), Some(key)) = (&cli.tls_cert, &cli.tls_key) {
        for &a in &cli.https {
            let mut l = Listener::new(ListenerKind::Https, a);
            l.tls = Some(ListenTls::new(cert.clone(), key.clone()));
            listeners.push(l);
        }
    }
    for (list, kind) in
        [(&cli.relay, ListenerKind::Relay), (&cli.udp_relay, ListenerKind::UdpRelay)]
    {
        for (listen, target) in list {
            let mut l = Listener::new(kind, *listen);
            l.target = Some(target.clone());
            listeners.push(l);
        }
    }
    let log_format = match cli.log {
        Some(LogArg::Plain) => Some(LogFormat::Plain),
        Some(LogArg::Json) => Some(LogFormat::Json),
        Some(LogArg::Squid) => Some(LogFormat::Squid),
        Some(LogArg::Off) | None => None,
    };
    // `--access-log PATH` wins over `--log off`.
    let access_log = match (&cli.access_log, cli.log) {
        (Some(target), _) => Some(target.clone()),
        (None, Some(LogArg::Off)) => Some(LogTarget::Off),
        (None, _) => None,
    };
    Overrides {
        listeners,
        users_file: cli.users.clone(),
        workers: cli.workers,
        log_format,
        access_log,
    }
}

/// `rustle check`: the file alone, checked as at start-up: every problem, each with its
/// line; with `bind`, also whether each listener's address is free.
fn check(file: Option<&std::path::Path>, bind: bool) -> ExitCode {
    let Some(path) = file else {
        eprintln!(
            "rustle check: no file: give it with --config FILE (without it, {} is read when \
             it exists)",
            rustle::config::DEFAULT_FILE
        );
        return ExitCode::from(2);
    };
    let source = Source { file: Some(path.to_owned()), overrides: Overrides::default() };
    let loaded = match rustle::run::check::source(&source) {
        Ok(loaded) => loaded,
        Err(problems) => {
            eprintln!("{problems}");
            return ExitCode::from(2);
        }
    };
    if bind {
        let in_use = rustle::run::check::addresses_in_use(&loaded.config);
        if !in_use.is_empty() {
            for problem in in_use {
                eprintln!("{}: {problem}", path.display());
            }
            return ExitCode::from(2);
        }
    }
    // (Checked above: the policy builds.)
    if let Ok(policy) = rustle::policy::Policy::build(&loaded.config, &[]) {
        if policy.users.plain_count() > 0 {
            eprintln!(
                "{}: warning: {} user(s) have plaintext passwords",
                path.display(),
                policy.users.plain_count()
            );
        }
    }
    println!("{}: ok", path.display());
    ExitCode::SUCCESS
}

/// `rustle reload`: the running rustle reads its configuration again (as on SIGHUP) and
/// says how it went; exit status 1 when it refused.
fn reload(file: Option<&std::path::Path>, confirm: bool) -> ExitCode {
    // The control socket as the running process resolved it: from the file (read leniently:
    // a file the reload refuses still names its socket) or the defaults.
    let text = file.map(std::fs::read_to_string).transpose();
    let text = match text {
        Ok(text) => text.unwrap_or_default(),
        Err(e) => {
            eprintln!("rustle reload: cannot read the configuration: {e}");
            return ExitCode::from(2);
        }
    };
    let config = rustle::config::Config::parse_all(&text).config;
    let Some(path) = config.process.control_socket_path() else {
        eprintln!(
            "rustle reload: no control socket to find the running rustle by: set [process] \
             control_socket (or XDG_RUNTIME_DIR), or send it SIGHUP"
        );
        return ExitCode::from(2);
    };
    match rustle::run::control::reload(&path, confirm) {
        Ok(Ok(warnings)) => {
            for w in warnings {
                eprintln!("warning: {w}");
            }
            println!("reloaded");
            ExitCode::SUCCESS
        }
        Ok(Err(reasons)) => {
            eprintln!("reload refused; the running configuration stays:");
            for r in reasons {
                eprintln!("{r}");
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("rustle reload: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `rustle man`: the manual page made from the command line's definition, or with `--dir`
/// that page and one per subcommand as files.
fn man(dir: Option<&std::path::Path>) -> ExitCode {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let page = |cmd: clap::Command| {
        let title = cmd.get_display_name().unwrap_or(cmd.get_name()).to_uppercase();
        let source = format!("rustle {}", env!("CARGO_PKG_VERSION"));
        clap_mangen::Man::new(cmd).title(title).source(source)
    };
    let written = match dir {
        None => main_page(page(cmd), &mut std::io::stdout()),
        Some(dir) => {
            let subcommands: Vec<clap::Command> =
                cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned().collect();
            let main = dir.join("rustle.1");
            // Each error names the path it failed on.
            fn named(
                path: &std::path::Path,
                what: &'static str,
            ) -> impl FnOnce(std::io::Error) -> std::io::Error {
                let path = path.display().to_string();
                move |e| std::io::Error::new(e.kind(), format!("{what} {path}: {e}"))
            }
            std::fs::create_dir_all(dir)
                .map_err(named(dir, "cannot create the directory"))
                .and_then(|()| {
                    let mut f =
                        std::fs::File::create(&main).map_err(named(&main, "cannot create"))?;
                    main_page(page(cmd), &mut f).map_err(named(&main, "cannot write"))
                })
                .and_then(|()| {
                    println!("{}", main.display());
                    subcommands.into_iter().try_for_each(|c| {
                        let name =
                            dir.join(format!("{}.1", c.get_display_name().unwrap_or(c.get_name())));
                        let written =
                            page(c).generate_to(dir).map_err(named(&name, "cannot write"))?;
                        println!("{}", written.display());
                        Ok(())
                    })
                })
        }
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rustle man: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The page of `rustle` itself: clap_mangen's sections, then `MORE`'s.
fn main_page(page: clap_mangen::Man, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    page.render_title(out)?;
    page.render_name_section(out)?;
    page.render_synopsis_section(out)?;
    page.render_description_section(out)?;
    page.render_options_section(out)?;
    page.render_subcommands_section(out)?;
    out.write_all(more_roff().as_bytes())?;
    page.render_version_section(out)
}

/// `rustle user ACTION`: one request to the users API, its answer printed.
fn user(
    config: Option<&std::path::Path>,
    admin: Option<std::net::SocketAddr>,
    token_file: Option<&std::path::Path>,
    json: bool,
    action: &UserAction,
) -> ExitCode {
    use rustle::run::users::{call, segment, table, target};
    use serde_json::json;
    let fail = |e: &str| {
        eprintln!("rustle user: {e}");
        ExitCode::from(2)
    };
    let t = match target(config, admin, token_file) {
        Ok(t) => t,
        Err(e) => return fail(&e),
    };
    let at = |name: &str, tail: &str| format!("/api/v1/users/{}{tail}", segment(name));
    let (method, path, body) = match action {
        UserAction::List => ("GET", "/api/v1/users".to_string(), None),
        UserAction::Get { name } => ("GET", at(name, ""), None),
        UserAction::Add { name, password_stdin, groups } => {
            let password = match read_password(name, *password_stdin) {
                Ok(p) => p,
                Err(e) => return fail(&e),
            };
            let body = json!({ "name": name, "password": password, "groups": groups });
            ("POST", "/api/v1/users".to_string(), Some(body))
        }
        UserAction::Disable { name } => ("POST", at(name, "/disable"), None),
        UserAction::Enable { name } => ("POST", at(name, "/enable"), None),
        UserAction::Remove { name } => ("DELETE", at(name, ""), None),
        UserAction::Set { name, limits } => {
            let mut body = serde_json::Map::new();
            for l in limits {
                let Some((k, v)) = l.split_once('=') else {
                    return fail(&format!("--limit {l}: expected KEY=VALUE"));
                };
                body.insert(k.trim().to_string(), json!(v.trim()));
            }
            ("PUT", at(name, "/limits"), Some(serde_json::Value::Object(body)))
        }
        UserAction::Reset { name, quota } => {
            let body = quota.as_ref().map(|q| json!({ "quota": q }));
            ("POST", at(name, "/reset"), body)
        }
        UserAction::TopUp { name, quota, bytes } => {
            let bytes = match bytes.parse::<u64>() {
                Ok(n) => json!(n),
                Err(_) => json!(bytes),
            };
            ("POST", at(name, "/top-up"), Some(json!({ "quota": quota, "bytes": bytes })))
        }
    };
    match call(&t, method, &path, body.as_ref()) {
        Ok((status, value)) if status < 300 => {
            match (json, action) {
                (true, _) => println!("{value}"),
                (false, UserAction::List | UserAction::Get { .. }) => print!("{}", table(&value)),
                (false, _) => println!("ok"),
            }
            ExitCode::SUCCESS
        }
        Ok((status, value)) => {
            let why = value.get("error").and_then(|e| e.as_str()).map(str::to_string);
            fail(&format!("{status}: {}", why.unwrap_or_else(|| value.to_string())))
        }
        Err(e) => fail(&e),
    }
}

/// A password from the terminal (without echo) or the first line of standard input.
fn read_password(name: &str, from_stdin: bool) -> Result<String, String> {
    use std::io::IsTerminal as _;
    let password = if !from_stdin && std::io::stdin().is_terminal() {
        rpassword::prompt_password(format!("password for {name}: ")).map_err(|e| e.to_string())?
    } else {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map_err(|e| e.to_string())?;
        line.trim_end_matches(['\r', '\n']).to_string()
    };
    match password.is_empty() {
        true => Err("empty password".into()),
        false => Ok(password),
    }
}

fn passwd(name: &str) -> ExitCode {
    use std::io::IsTerminal as _;
    let password = if std::io::stdin().is_terminal() {
        match rpassword::prompt_password(format!("password for {name}: ")) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("rustle passwd: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        let mut line = String::new();
        if let Err(e) = std::io::stdin().read_line(&mut line) {
            eprintln!("rustle passwd: {e}");
            return ExitCode::FAILURE;
        }
        line.trim_end_matches(['\r', '\n']).to_string()
    };
    if password.is_empty() {
        eprintln!("rustle passwd: empty password");
        return ExitCode::from(2);
    }
    match rustle::policy::auth::hash_line(name, password.as_bytes()) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rustle passwd: {e}");
            ExitCode::from(2)
        }
    }
}

fn cert(name: &str, out: &std::path::Path) -> ExitCode {
    match rustle::io::tls::write_self_signed(name, out) {
        Ok(files) => {
            println!("CA certificate:    {}", files.ca.display());
            println!("certificate chain: {}", files.chain.display());
            println!("private key:       {}", files.key.display());
            println!();
            let (chain, key, ca) = (files.chain.display(), files.key.display(), files.ca.display());
            // A URL's host: an IPv6 address goes in brackets.
            let host = match name.parse::<std::net::Ipv6Addr>() {
                Ok(_) => format!("[{name}]"),
                Err(_) => name.to_string(),
            };
            println!("Use {chain} and {key} as the listener's certificate and key");
            println!("(--tls-cert and --tls-key, or `cert` and `key` in [listener.tls]).");
            println!("Clients must trust {ca}. The CA's key is not kept.");
            println!(
                "  HTTPS proxy port: curl --proxy https://{host}:PORT --proxy-cacert {ca} URL"
            );
            println!("  TLS relay:        curl --cacert {ca} https://{host}:PORT/");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rustle cert: {e}");
            ExitCode::from(2)
        }
    }
}

fn relay_arg(s: &str) -> Result<(SocketAddr, HostPort), String> {
    let (listen, target) = s.split_once('=').ok_or("expected LISTEN=TARGET")?;
    let listen = listen.parse().map_err(|_| format!("`{listen}` is not an address:port"))?;
    Ok((listen, target.parse()?))
}

/// Sets up diagnostics on stderr (or the journal, `log.diagnostics`), filtered by RUST_LOG
/// or else `log.level`. Returns what puts a reloaded `log.level` in force (None when
/// RUST_LOG decides).
fn init_tracing(log: &rustle::config::Log) -> Option<rustle::run::reload::SetLogLevel> {
    use tracing_subscriber::prelude::*;
    use tracing_subscriber::{reload, EnvFilter};
    let from_env = EnvFilter::try_from_default_env().ok();
    let by_env = from_env.is_some();
    let filter = from_env
        .or_else(|| EnvFilter::try_new(&log.level).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let (filter, handle) = reload::Layer::new(filter);
    let set: Option<rustle::run::reload::SetLogLevel> = match by_env {
        true => None,
        false => Some(Box::new(move |level: &str| {
            let filter = EnvFilter::try_new(level).map_err(|e| e.to_string())?;
            handle.reload(filter).map_err(|e| e.to_string())
        })),
    };
    if log.diagnostics == rustle::config::Diagnostics::Journald {
        match tracing_journald::layer() {
            Ok(journal) => {
                let journal = journal.with_syslog_identifier(log.tag.clone());
                tracing_subscriber::registry().with(filter).with(journal).init();
                return set;
            }
            Err(e) => eprintln!("cannot log diagnostics to the journal ({e}); using stderr"),
        }
    }
    use std::io::IsTerminal as _;
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    tracing_subscriber::registry().with(filter).with(fmt).init();
    set
}
