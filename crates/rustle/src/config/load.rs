//! Reading a configuration: the file and the command line on top of it, every problem
//! with its line (`collect` for the values that do not deserialize, `checks` for the rest).

use std::fmt;
use std::path::PathBuf;

use super::checks::{
    dns_problems, http2_problems, loop_problem, open_proxy_problem, target_problem,
};
use super::{
    collect, routing, state, Config, DefaultAction, Listener, ListenerKind, LogFormat, LogTarget,
};

/// One problem in a configuration file, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// All the problems of one file.
#[derive(Debug)]
pub struct Problems {
    pub file: PathBuf,
    pub list: Vec<Problem>,
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.list.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}: {p}", self.file.display())?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

/// Configuration text parsed: what could be read of it, and every problem found.
pub struct Parsed {
    /// The configuration, each value that did not deserialize left at its default (a table
    /// missing a required key left out): complete only when `problems` is empty.
    pub config: Config,
    /// In the order of the file.
    pub problems: Vec<Problem>,
    /// Where the configuration's keys are in the text.
    pub lines: Lines,
}

/// Where keys are in a configuration text, by their path in the configuration as parsed
/// (`["listener", "0", "tls", "cert"]`: the first listener read, which is not the first
/// in the file when one before it was left out).
#[derive(Default)]
pub struct Lines {
    text: String,
    doc: Option<toml_edit::Document<String>>,
    removed: collect::Removed,
}

impl Lines {
    /// The line of the key at `segs` (map keys and array indexes).
    pub fn of(&self, segs: &[&str]) -> Option<usize> {
        let segs: Vec<String> = segs.iter().map(|s| s.to_string()).collect();
        self.at(&segs)
    }

    fn at(&self, segs: &[String]) -> Option<usize> {
        self.at_original(&self.removed.original(segs))
    }

    /// The line of the key at `segs`, a path in the file as written.
    fn at_original(&self, segs: &[String]) -> Option<usize> {
        key_offset(self.doc.as_ref()?, segs).map(|o| self.line_of(o))
    }

    fn line_of(&self, offset: usize) -> usize {
        let text = &self.text;
        text[..offset.min(text.len())].matches('\n').count() + 1
    }

    /// Whether a value at or inside `segs` did not deserialize (and was reported so): the
    /// checks after parsing say nothing more of it.
    pub fn damaged(&self, segs: &[&str]) -> bool {
        let segs: Vec<String> = segs.iter().map(|s| s.to_string()).collect();
        self.damaged_at(&segs)
    }

    fn damaged_at(&self, segs: &[String]) -> bool {
        self.removed.is_damaged(&self.removed.original(segs))
    }
}

impl Config {
    /// Parses and checks configuration text, returning every problem found.
    pub fn parse(text: &str) -> Result<Config, Vec<Problem>> {
        let parsed = Config::parse_all(text);
        match parsed.problems.is_empty() {
            true => Ok(parsed.config),
            false => Err(parsed.problems),
        }
    }

    /// Parses and checks configuration text: every problem, in the order of the file, and
    /// the configuration with each value that did not deserialize left at its default (a
    /// table missing a required key left out), for the checks that come after (`rustle
    /// check` goes on to the files it names and the users they define).
    pub fn parse_all(text: &str) -> Parsed {
        let mut lines = Lines { text: text.to_string(), ..Default::default() };
        let mut problems = Vec::new();
        // A syntax error leaves nothing to deserialize.
        let table = match toml_edit::Document::parse(text.to_string()) {
            Ok(doc) => {
                lines.doc = Some(doc);
                text.parse::<toml::Table>().map_err(|e| (e.span(), e.message().to_string()))
            }
            Err(e) => Err((e.span(), e.message().to_string())),
        };
        let table = match table {
            Ok(t) => t,
            Err((span, message)) => {
                let line = span.map(|s| lines.line_of(s.start));
                problems.push(Problem { line, message: message.trim().to_string() });
                return Parsed { config: Config::default(), problems, lines };
            }
        };
        let collected = collect::deserialize::<Config>(toml::Value::Table(table));
        lines.removed = collected.removed;
        let mut config = collected.value;
        // (Paths in the file as written.)
        for segs in &collected.unknown {
            let line = lines.at_original(segs);
            problems.push(Problem { line, message: format!("unknown key `{}`", segs.join(".")) });
        }
        // Each named by its key: `workers: expected a number, found "two"`.
        for (segs, message) in collected.errors {
            let message = match segs.is_empty() {
                true => message,
                false => format!("{}: {message}", segs.join(".")),
            };
            problems.push(Problem { line: lines.at_original(&segs), message });
        }
        let line_in = |segs: &[&str]| lines.of(segs);
        for (i, l) in config.listeners.iter().enumerate() {
            // A listener with a value that did not deserialize is reported for that alone.
            if lines.damaged(&["listener", &i.to_string()]) {
                continue;
            }
            // (line, the problem named by its key as the file writes it: `listener.2.h2c: `)
            let at = |key: &str, message: String| {
                let segs = ["listener".to_string(), i.to_string(), key.to_string()];
                let segs = lines.removed.original(if key.is_empty() { &segs[..2] } else { &segs });
                let line = lines.at_original(&segs);
                Problem { line, message: format!("{}: {message}", segs.join(".")) }
            };
            if let Some(message) = open_proxy_problem(&config, l) {
                problems.push(at("listen", message));
            }
            if let Some(message) = target_problem(l) {
                let mut p = at("", message);
                p.line = line_in(&["listener", &i.to_string(), "kind"]);
                problems.push(p);
            }
            if let Some(message) = loop_problem(&config.listeners, l) {
                problems.push(at("target", message));
            }
            if let Some((key, message)) = super::checks::proxy_protocol_problem(&config, l) {
                problems.push(at(key, message));
            }
            if l.h2c && !matches!(l.kind, ListenerKind::Http | ListenerKind::Auto) {
                let message = format!("h2c is for http and auto listeners, not {}", l.kind);
                problems.push(at("h2c", message));
            }
            for (key, value) in [("rate_up", &l.rate_up), ("rate_down", &l.rate_down)] {
                if let Some(Err(e)) = value.as_deref().map(super::parse_rate) {
                    problems.push(at(key, e));
                }
            }
        }
        for (i, rule) in config.rules.iter_mut().enumerate() {
            rule.conditions.groups_line = line_in(&["rule", &i.to_string(), "groups"]);
            rule.conditions.users_line = line_in(&["rule", &i.to_string(), "users"]);
        }
        for (i, route) in config.routes.iter_mut().enumerate() {
            route.conditions.groups_line = line_in(&["route", &i.to_string(), "groups"]);
            route.conditions.users_line = line_in(&["route", &i.to_string(), "users"]);
        }
        for (segs, message) in super::checks::params_problems(&config) {
            if !lines.damaged_at(&segs) {
                problems.push(Problem { line: lines.at(&segs), message });
            }
        }
        let routing =
            routing::problems(&config.parents, &config.groups, &config.routes, &config.listeners);
        for (segs, message) in routing {
            if !lines.damaged_at(&segs) {
                problems.push(Problem { line: lines.at(&segs), message });
            }
        }
        for (i, message) in super::quota::problems_at(&config.quotas) {
            let segs = ["quota".to_string(), i.to_string()];
            if !lines.damaged_at(&segs) {
                problems.push(Problem { line: lines.at(&segs), message });
            }
        }
        let default_allow = config.default_action == DefaultAction::Allow;
        if let Err(errs) = crate::acl::RuleSet::compile(&config.rules, default_allow) {
            for (i, e) in errs {
                if lines.damaged(&["rule", &i.to_string()]) {
                    continue;
                }
                let line = line_in(&["rule", &i.to_string()]);
                problems.push(Problem { line, message: format!("rule {}: {e}", i + 1) });
            }
        }
        for (key, value) in [
            ("user_rate_up", &config.limits.user_rate_up),
            ("user_rate_down", &config.limits.user_rate_down),
        ] {
            if let Some(Err(e)) = value.as_deref().map(super::parse_rate) {
                let line = line_in(&["limits", key]);
                problems.push(Problem { line, message: format!("limits.{key}: {e}") });
            }
        }
        let addresses = std::iter::once((
            vec!["limits".to_string(), "max_client_addresses".into()],
            "limits.max_client_addresses".to_string(),
            config.limits.max_client_addresses,
        ))
        .chain(config.auth.users.iter().enumerate().map(|(i, u)| {
            let segs =
                vec!["auth".into(), "user".into(), i.to_string(), "max_client_addresses".into()];
            (segs, format!("auth.user `{}`: max_client_addresses", u.name), u.max_client_addresses)
        }))
        .chain(config.auth.group_limits.iter().map(|(g, l)| {
            let segs = vec![
                "auth".into(),
                "group_limits".into(),
                g.clone(),
                "max_client_addresses".into(),
            ];
            (segs, format!("auth.group_limits.{g}.max_client_addresses"), l.max_client_addresses)
        }));
        for (segs, what, value) in addresses {
            if value == Some(0) {
                let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
                let message = format!("{what} must be at least 1 (leave it out for no limit)");
                problems.push(Problem { line: line_in(&segs), message });
            }
        }
        if config.limits.max_header_bytes < 1024 {
            problems.push(Problem {
                line: None,
                message: "limits.max_header_bytes must be at least 1024".into(),
            });
        }
        for (key, value) in [
            ("hash_threads", config.auth.hash_threads),
            ("max_pending_hashes", config.auth.max_pending_hashes),
            ("max_hashes_per_client", config.auth.max_hashes_per_client),
        ] {
            if value == 0 {
                let line = line_in(&["auth", key]);
                problems.push(Problem { line, message: format!("auth.{key} must be at least 1") });
            }
        }
        if let Some(message) = config.admin.open_problem() {
            let message = format!("admin.listen: {message}");
            problems.push(Problem { line: line_in(&["admin", "listen"]), message });
        }
        if config.admin.token.is_some() && config.admin.token_file.is_some() {
            let message = "admin.token_file: set `token` or `token_file`, not both".to_string();
            problems.push(Problem { line: line_in(&["admin", "token_file"]), message });
        }
        if config.admin.api_token.is_some() && config.admin.api_token_file.is_some() {
            let message =
                "admin.api_token_file: set `api_token` or `api_token_file`, not both".to_string();
            problems.push(Problem { line: line_in(&["admin", "api_token_file"]), message });
        }
        if let Some(t) = &config.admin.api_token {
            if t.expose().len() < super::settings::MIN_API_TOKEN {
                let message = format!(
                    "admin.api_token: shorter than {} bytes: use a random token such as \
                     `openssl rand -hex 16`",
                    super::settings::MIN_API_TOKEN
                );
                problems.push(Problem { line: line_in(&["admin", "api_token"]), message });
            }
        }
        problems.extend(http2_problems(&config.http2).into_iter().map(|(key, message)| Problem {
            line: line_in(&["http2", key]),
            message: format!("http2.{key}: {message}"),
        }));
        if config.upstream.dns_cache_ttl.is_some() {
            problems.push(Problem {
                line: line_in(&["upstream", "dns_cache_ttl"]),
                message: "upstream.dns_cache_ttl is not a setting: an answer is kept for its \
                          own TTL, bounded by [dns] ttl_min and ttl_max (a failure for [dns] \
                          negative_ttl); set those instead"
                    .into(),
            });
        }
        problems.extend(dns_problems(&config.dns).into_iter().map(|(key, message)| Problem {
            line: line_in(&["dns", key]),
            message: format!("dns.{key}: {message}"),
        }));
        problems.extend(state::redis_problems(&config.state).into_iter().map(|(key, message)| {
            Problem { line: line_in(&["state", key]), message: format!("state.{key}: {message}") }
        }));
        // In the order of the file; problems of no one line last.
        problems.sort_by_key(|p| p.line.unwrap_or(usize::MAX));
        Parsed { config, problems, lines }
    }
}

/// The command line's options that override the file. Start-up applies them on top of the
/// file, and every SIGHUP applies them again on top of the file as re-read, so that they
/// stay in force for the life of the process.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Listeners given on the command line: they replace the file's.
    pub listeners: Vec<Listener>,
    /// `--users`: the users file; the command line's listeners (or the default ones, when
    /// the file has none) then require authentication.
    pub users_file: Option<PathBuf>,
    pub workers: Option<usize>,
    pub log_format: Option<LogFormat>,
    pub access_log: Option<LogTarget>,
}

impl Overrides {
    pub fn apply(&self, cfg: &mut Config) {
        let from_cli = !self.listeners.is_empty();
        if from_cli {
            cfg.listeners.clone_from(&self.listeners);
        }
        if let Some(users) = &self.users_file {
            cfg.auth.users_file = Some(users.clone());
            if from_cli || cfg.listeners.is_empty() {
                cfg.listeners = cfg.effective_listeners();
                for l in &mut cfg.listeners {
                    if l.kind != ListenerKind::Relay && l.kind != ListenerKind::UdpRelay {
                        l.auth = true;
                    }
                }
            }
        }
        if let Some(n) = self.workers {
            cfg.workers = n;
        }
        if let Some(format) = &self.log_format {
            cfg.log.format = format.clone();
        }
        if let Some(access) = &self.access_log {
            cfg.log.access = access.clone();
        }
    }
}

/// Where the configuration comes from: a file (or none: the defaults), and the command
/// line on top. Start-up and SIGHUP derive it the same way.
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub file: Option<PathBuf>,
    pub overrides: Overrides,
}

/// A configuration as derived from its source.
#[derive(Debug)]
pub struct Loaded {
    pub config: Config,
}

impl fmt::Display for Source {
    /// Names what a reload reads: the file and the users file of the command line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, &self.overrides.users_file) {
            (Some(file), Some(users)) => {
                write!(f, "{} and the users file {}", file.display(), users.display())
            }
            (Some(file), None) => write!(f, "{}", file.display()),
            (None, Some(users)) => write!(f, "the users file {}", users.display()),
            (None, None) => f.write_str("the command line"),
        }
    }
}

/// Byte offset of the key at `segs` (map keys and array indexes) in the document. Items
/// are cloned as the walk goes: this runs only when reporting errors.
fn key_offset(doc: &toml_edit::Document<String>, segs: &[String]) -> Option<usize> {
    use toml_edit::{Item, Value};
    let mut item = doc.as_item().clone();
    let mut offset = None;
    for seg in segs {
        let next = if let Ok(i) = seg.parse::<usize>() {
            match &item {
                Item::ArrayOfTables(a) => {
                    let t = a.get(i)?;
                    offset = t.span().map(|s| s.start).or(offset);
                    Item::Table(t.clone())
                }
                Item::Value(Value::Array(a)) => {
                    let v = a.get(i)?;
                    offset = v.span().map(|s| s.start).or(offset);
                    Item::Value(v.clone())
                }
                _ => return offset,
            }
        } else {
            let (key, value) = item.as_table_like()?.get_key_value(seg)?;
            offset = key.span().map(|s| s.start).or(offset);
            value.clone()
        };
        item = next;
    }
    offset
}
