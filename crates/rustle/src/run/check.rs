//! Every problem of a configuration at once, for `rustle check` and for start-up: the
//! file's own (syntax, types, values, listeners, parents and routes), each file it names
//! that cannot be read (users file, certificates, keys, CA files), and what needs the
//! users loaded (groups and users named by rules and routes), each with its line where it
//! has one. A type error hides nothing after it.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use crate::config::{Config, Lines, Loaded, Overrides, Problem, Problems, Source};

/// Derives the configuration from `source` as start-up does (the file, the command line
/// on top) and checks all of it; the problems, in the order of the file, when there are
/// any.
pub fn source(source: &Source) -> Result<Loaded, Problems> {
    checked(source, true)
}

/// `source` for a reload: the same checks but those of the names rules use and of listeners
/// requiring authentication with no user, which refuse a start but not a reload (refusing
/// a reload that revokes a user, the last of a group, or every user would keep their
/// passwords valid); the reload warns of them (`reload::vet`) and builds the policy.
pub(crate) fn reload_source(source: &Source) -> Result<Loaded, Problems> {
    checked(source, false)
}

fn checked(source: &Source, at_start: bool) -> Result<Loaded, Problems> {
    let label = source.file.clone().unwrap_or_else(|| PathBuf::from("rustle"));
    let fail = |list: Vec<Problem>| Problems { file: label.clone(), list };
    let text = match &source.file {
        Some(path) => std::fs::read_to_string(path).map_err(|e| {
            fail(vec![Problem { line: None, message: format!("cannot read: {e}") }])
        })?,
        None => String::new(),
    };
    let blank = text.lines().map(str::trim).all(|l| l.is_empty() || l.starts_with('#'));
    let parsed = Config::parse_all(&text);
    let (mut config, mut problems, lines) = (parsed.config, parsed.problems, parsed.lines);
    problems.extend(user_problems(&config, &lines));
    let listeners_from_file = source.overrides.listeners.is_empty() && !config.listeners.is_empty();
    if source.file.is_some() {
        problems.extend(empty_problem(blank, &config, &lines, &source.overrides));
    }
    source.overrides.apply(&mut config);
    // The listeners as run: the command line's or the default ones are checked here (the
    // file's were, with their lines).
    if let Err(message) = config.check_listeners() {
        if !problems.iter().any(|p| p.message == message) {
            problems.push(Problem { line: None, message });
        }
    }
    let from_file = FromFile {
        lines: &lines,
        listeners: listeners_from_file,
        users_file: source.overrides.users_file.is_none(),
    };
    let (unreadable, paths) = unreadable_files(&config, &from_file);
    problems.extend(unreadable);
    problems.extend(access_log_problem(&config, &from_file, source.overrides.access_log.is_none()));
    let policy = match at_start {
        true => crate::policy::Policy::check(&config),
        false => Vec::new(),
    };
    for message in policy.iter().flat_map(|m| m.lines()) {
        // Said already: by the file's checks, or as a file that cannot be read.
        let known = problems.iter().any(|p| p.message == message)
            || paths.iter().any(|path| message.contains(&*path.to_string_lossy()));
        if !known {
            problems.push(located(message));
        }
    }
    problems.sort_by_key(|p| p.line.unwrap_or(usize::MAX));
    match problems.is_empty() {
        true => Ok(Loaded { config }),
        false => Err(fail(problems)),
    }
}

/// The `[[auth.user]]` entries the users' set refuses (a name, a hash or a group), each at
/// its line; a value that did not deserialize was reported already.
fn user_problems(config: &Config, lines: &Lines) -> Vec<Problem> {
    let mut users = crate::policy::auth::Users::default();
    let mut problems = Vec::new();
    for (i, u) in config.auth.users.iter().enumerate() {
        if lines.damaged(&["auth", "user", &i.to_string()]) {
            continue;
        }
        if let Err(e) = users.add(&u.name, &u.password, &u.groups) {
            let line = lines.of(&["auth", "user", &i.to_string(), "name"]);
            problems.push(Problem { line, message: format!("auth.user `{}`: {e}", u.name) });
        }
    }
    problems
}

/// A file that exists and declares no listener: empty (a tool that truncates before it
/// writes leaves one), or cut short before its first `[[listener]]`. The built-in listeners
/// are for running with no file at all; from a file they would replace every listener it
/// meant to declare, with none of its protections. Listeners given on the command line
/// replace the file's, so a file without any is fine with them.
fn empty_problem(
    blank: bool,
    config: &Config,
    lines: &Lines,
    overrides: &Overrides,
) -> Option<Problem> {
    if !overrides.listeners.is_empty() {
        return None;
    }
    let message = if blank {
        "the file is empty (nothing but blank lines and comments), so it declares no \
         listener; to run the built-in listeners, start rustle without a file"
    } else if config.listeners.is_empty() && lines.of(&["listener"]).is_none() {
        // (A [[listener]] left out for its own problem is reported for that.)
        "the file declares no listener (no [[listener]]: cut short?); the built-in \
         listeners are only for running without a file"
    } else {
        return None;
    };
    Some(Problem { line: None, message: message.to_string() })
}

/// An access log file that cannot be opened for writing: its directory missing, or not
/// writable (and the file itself, when it exists). Checked without creating anything.
fn access_log_problem(cfg: &Config, from_file: &FromFile<'_>, in_file: bool) -> Option<Problem> {
    use nix::unistd::{access, AccessFlags};
    let crate::config::LogTarget::File(path) = &cfg.log.access else { return None };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let why = if path.exists() {
        access(path.as_path(), AccessFlags::W_OK).err().map(|e| format!("cannot write to it: {e}"))
    } else if !dir.is_dir() {
        Some(format!("its directory {} does not exist", dir.display()))
    } else {
        access(dir, AccessFlags::W_OK | AccessFlags::X_OK)
            .err()
            .map(|e| format!("cannot create it in {}: {e}", dir.display()))
    }?;
    let line = in_file.then(|| from_file.lines.of(&["log", "access"])).flatten();
    Some(Problem { line, message: format!("log.access: {}: {why}", path.display()) })
}

/// For `rustle check`: each listener with a fixed address that something already serves,
/// tested as start-up tests it (a socket bound there without SO_REUSEPORT, then closed).
pub fn addresses_in_use(cfg: &Config) -> Vec<String> {
    let listeners = cfg.effective_listeners();
    let fixed = listeners.iter().filter(|l| l.listen.port() != 0);
    fixed
        .filter_map(|l| {
            let udp = l.kind == crate::config::ListenerKind::UdpRelay;
            let e = crate::run::server::ensure_unused(l.listen, udp).err()?;
            Some(format!(
                "listener {} on {}: {e:#} (if the running rustle holds it, test the file \
                 with `rustle check --no-bind`)",
                l.kind, l.listen
            ))
        })
        .collect()
}

/// Which parts of the configuration as run come from the file (and so have lines there).
struct FromFile<'a> {
    lines: &'a Lines,
    listeners: bool,
    users_file: bool,
}

/// A problem for each place the configuration names a file that cannot be read, and the
/// paths of those files.
fn unreadable_files(cfg: &Config, from_file: &FromFile<'_>) -> (Vec<Problem>, Vec<PathBuf>) {
    // (the key's path in the file when it is there, what the file is, its path)
    let mut files: Vec<(Option<Vec<String>>, String, &Path)> = Vec::new();
    let at = |segs: &[&str]| Some(segs.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    if let Some(users) = &cfg.auth.users_file {
        let key = from_file.users_file.then(|| at(&["auth", "users_file"])).flatten();
        files.push((key, "the users file".into(), users));
    }
    for (i, l) in cfg.listeners.iter().enumerate() {
        let index = i.to_string();
        let key = |segs: &[&str]| {
            let segs: Vec<&str> =
                ["listener", index.as_str()].iter().chain(segs).copied().collect();
            from_file.listeners.then(|| at(&segs)).flatten()
        };
        let what = |file: &str| format!("{file} of listener {} ({})", i + 1, l.listen);
        if let Some(t) = &l.tls {
            files.push((key(&["tls", "cert"]), what("the certificate"), &t.cert));
            files.push((key(&["tls", "key"]), what("the key"), &t.key));
            for (k, more) in t.more.iter().enumerate() {
                let k = k.to_string();
                let sni =
                    |file: &str| format!("{file} of [[listener.tls.sni]] {}", more.cert.display());
                files.push((key(&["tls", "sni", &k, "cert"]), sni("the certificate"), &more.cert));
                files.push((key(&["tls", "sni", &k, "key"]), sni("the key"), &more.key));
            }
            if let Some(ca) = &t.client_ca {
                files.push((key(&["tls", "client_ca"]), what("the client CA file"), ca));
            }
        }
        if let Some(ca) = l.target_tls.as_ref().and_then(|t| t.ca.as_ref()) {
            files.push((key(&["target_tls", "ca"]), what("the target CA file"), ca));
        }
    }
    if let Some(ca) = &cfg.tls.origin_ca {
        files.push((at(&["tls", "origin_ca"]), "the origin CA file".into(), ca));
    }
    for (i, p) in cfg.parents.iter().enumerate() {
        if let Some(ca) = &p.ca {
            let what = format!("the CA file of parent `{}`", p.name);
            files.push((at(&["parent", &i.to_string(), "ca"]), what, ca));
        }
    }
    if cfg.state.redis().is_some() {
        if let Some(file) = &cfg.state.redis_password_file {
            let what = "the Redis password file".into();
            files.push((at(&["state", "redis_password_file"]), what, file));
        }
        if let Some(ca) = &cfg.state.redis_ca {
            files.push((at(&["state", "redis_ca"]), "the Redis CA file".into(), ca));
        }
    }
    let (mut problems, mut paths) = (Vec::new(), Vec::new());
    for (key, what, path) in files {
        let Err(e) = readable(path) else { continue };
        let line = key.and_then(|segs| {
            let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
            from_file.lines.of(&segs)
        });
        let message = format!("{what}: {}: cannot read: {e}", path.display());
        problems.push(Problem { line, message });
        paths.push(path.to_path_buf());
    }
    (problems, paths)
}

/// Whether `path` can be opened and read from (a directory cannot).
fn readable(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.read(&mut [0u8; 1]).map(|_| ())
}

/// A message that may start with `line N: `, as a problem with that line.
fn located(message: &str) -> Problem {
    let parsed = message.strip_prefix("line ").and_then(|rest| {
        let (n, text) = rest.split_once(": ")?;
        Some((n.parse().ok()?, text))
    });
    match parsed {
        Some((line, text)) => Problem { line: Some(line), message: text.to_string() },
        None => Problem { line: None, message: message.to_string() },
    }
}
