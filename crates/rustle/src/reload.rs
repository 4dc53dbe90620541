//! What signals and the control socket change in a running proxy. SIGHUP derives the
//! configuration again from its source, exactly as start-up does (the file re-read, the
//! command line's options on top), and puts all of it in force: listeners added are
//! bound, listeners dropped stop accepting (their connections go on), the others keep
//! their sockets and take their new settings; users, rules, routes, certificates,
//! timeouts, limits and log settings apply to new connections. A source with problems,
//! a listener that cannot be bound, or a result that would leave a listener less
//! protected than start-up allows changes nothing, and the log says why. SIGUSR1 reopens
//! the access log file (logrotate's `postrotate`). A `rustle --takeover` connecting to
//! the control socket takes the listening sockets over, and this process then drains and
//! exits (`takeover`).

use std::sync::Arc;

use crate::config::{Config, Listener, Source};
use crate::policy::Policy;
use crate::server::Running;

/// What the binary gives the signal loop besides the configuration.
#[derive(Default)]
pub struct Options {
    /// `--takeover`: take the listening sockets over from the rustle answering on the
    /// control socket, which then drains and exits.
    pub takeover: bool,
    /// Puts a new `log.level` in force (the diagnostics filter); None leaves it.
    pub set_log_level: Option<SetLogLevel>,
}

/// Puts a `log.level` filter in force, or says why it cannot.
pub type SetLogLevel = Box<dyn Fn(&str) -> Result<(), String>>;

/// SIGHUP: re-reads the file (and the command line's users file) and puts it in force;
/// a source with problems changes nothing.
/// `listeners_from_file`: the running listeners are the ones the file declared at start.
pub fn hangup(running: &Running, source: &Source, listeners_from_file: bool, opts: &Options) {
    let old_level = running.config().log.level.clone();
    let result = derive(source, listeners_from_file).and_then(|cfg| apply(running, &cfg));
    crate::metrics::reloaded(result.is_ok());
    match result {
        Ok(warnings) => {
            for w in warnings {
                tracing::warn!("SIGHUP: {w}");
            }
            let level = running.config().log.level.clone();
            if level != old_level {
                if let Some(set) = &opts.set_log_level {
                    if let Err(e) = set(&level) {
                        tracing::warn!("SIGHUP: log.level {level:?}: {e}; the filter stays");
                    }
                }
            }
            let listeners: Vec<String> =
                running.addrs().iter().map(|(k, a)| format!("{a} ({k})")).collect();
            tracing::info!("SIGHUP: reloaded {source}; listeners: {}", listeners.join(", "));
        }
        Err(e) => tracing::error!("SIGHUP: {e}; keeping the previous configuration and policy"),
    }
}

/// Puts a whole configuration in force (SIGHUP): listeners bound, kept or closed as it
/// says, then the policy and settings published to every worker; connections already
/// open keep going with what they started with. A listener that cannot be bound, or a
/// configuration that would leave a listener less protected than start-up allows
/// (`vet`), changes nothing; the warnings name protections it drops and settings that
/// only a restart or a takeover puts in force.
pub fn apply(running: &Running, cfg: &Config) -> Result<Vec<String>, String> {
    // New listeners are bound first (the policy refuses the proxy's own addresses as
    // destinations); dropping `plan` on any failure below closes them again.
    let plan = running.prepare(cfg)?;
    let mut policy = Policy::build(cfg, &plan.own()).map_err(|p| p.join("; "))?;
    let old = running.policy();
    let mut warnings = vet(cfg, &plan.listeners(), &old, &policy)?;
    // (A listener requiring authentication left with no user: `vet` names it.)
    warnings.extend(policy.undefined_names.iter().cloned());
    warnings.extend(plan.warnings.iter().cloned());
    policy.routes.keep_health_of(&old.routes);
    running.commit(plan, policy);
    Ok(warnings)
}

/// The configuration a reload would run with, or why the file is not taken.
fn derive(source: &Source, listeners_from_file: bool) -> Result<Config, String> {
    let loaded = source.read().map_err(|p| p.to_string())?;
    if let Some(file) = &source.file {
        // No one means to run a proxy from an empty file; a tool that truncates before it
        // writes leaves one, and it would drop every rule and protection.
        if loaded.blank {
            return Err(format!(
                "{} is empty (nothing but blank lines and comments): not reloaded",
                file.display()
            ));
        }
        if listeners_from_file && !loaded.listeners_from_file {
            return Err(format!(
                "{} declares no listener, but the running listeners came from it: the file \
                 looks cut short, not reloaded",
                file.display()
            ));
        }
    }
    loaded.config.check_listeners()?;
    Ok(loaded.config)
}

/// Checks a new configuration and its policy against the listeners it would run (those
/// kept and those added): the start-up open-proxy check on each. Returns a warning for each protection the new policy drops,
/// and for each listener requiring authentication that is left with no user (it then
/// refuses everyone: stricter, so it goes through).
pub fn vet(
    cfg: &Config,
    listeners: &[Arc<Listener>],
    old: &Policy,
    new: &Policy,
) -> Result<Vec<String>, String> {
    for l in listeners {
        if let Some(problem) = cfg.open_proxy_problem(l) {
            return Err(format!("under the new configuration, {problem}"));
        }
    }
    let mut warnings = Vec::new();
    for l in listeners.iter().filter(|l| l.auth && new.users.is_empty()) {
        warnings.push(format!(
            "the listener {} on {} requires authentication, and the new \
             configuration defines no user: every client of it is refused",
            l.kind, l.listen
        ));
    }
    if old.builtins.deny_private && !new.builtins.deny_private {
        warnings.push(
            "deny_private_destinations is now off: loopback, private and link-local \
             destinations and cloud metadata endpoints are reachable"
                .to_string(),
        );
    }
    if !old.rules.is_empty() && new.rules.is_empty() {
        let action = if new.rules.default_allow() { "allow" } else { "deny" };
        warnings.push(format!(
            "the new configuration has no [[rule]]: the {} access rule(s) in force are \
             dropped, every request gets the default action ({action})",
            old.rules.len()
        ));
    }
    if !old.users.is_empty() && new.users.is_empty() {
        warnings.push(format!(
            "the new configuration defines no user: the {} user(s) in force are dropped",
            old.users.len()
        ));
    }
    Ok(warnings)
}

/// SIGUSR1: opens the access log file again at its path, so that after logrotate renamed
/// it new lines go to a fresh file. Without a file there is nothing to reopen.
pub fn reopen_access_log(running: &Running) {
    use crate::accesslog::Sink;
    let sink = running.access_log();
    match sink.reopen() {
        Ok(Some(path)) => tracing::info!("SIGUSR1: reopened the access log {}", path.display()),
        Ok(None) => {
            let target = match sink {
                Sink::Stdout => "goes to stdout",
                Sink::Stderr => "goes to stderr",
                Sink::Syslog(_) => "goes to syslog",
                Sink::Journald(_) => "goes to the journal",
                Sink::Off | Sink::File(_) => "is off",
            };
            tracing::info!("SIGUSR1: the access log {target}; nothing to reopen");
        }
        Err(e) => tracing::error!("SIGUSR1: {e}; lines go to the file already open"),
    }
}

/// Runs until SIGINT or SIGTERM, or until a new process took the listeners over. SIGHUP
/// derives the configuration from `source` again and puts it in force; SIGUSR1 reopens
/// the access log. `loaded` is what `source` gave at start.
pub fn run_until_signal(
    loaded: crate::config::Loaded,
    source: crate::config::Source,
    opts: Options,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // The handlers are in place before the listeners say where they are, so that a
    // signal sent as soon as they do never meets its default action (which ends the
    // process for SIGHUP and SIGUSR1).
    let (mut term, mut int, mut hup, mut usr1) = {
        let _in = rt.enter();
        (
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
            signal(SignalKind::hangup())?,
            signal(SignalKind::user_defined1())?,
        )
    };
    let process = loaded.config.process.clone();
    let control_path = process.control_socket_path();
    // The listening sockets of the process taken over, or of the service manager.
    let (inherited, handover) = match opts.takeover {
        true => {
            let Some(path) = &control_path else {
                anyhow::bail!(
                    "--takeover: no control socket to find the running rustle by: set \
                     [process] control_socket (or XDG_RUNTIME_DIR)"
                );
            };
            let (inherited, handover) = crate::takeover::take_over(path)?;
            (inherited, Some(handover))
        }
        false => (crate::takeover::activation_sockets()?, None),
    };
    // The control socket, bound before the listeners say where they are (and before root
    // is given up); a process taking over replaces the old one's once it serves.
    let bind_control = |replace: bool| {
        let _in = rt.enter();
        control_path.as_deref().and_then(|p| crate::takeover::Control::bind(p, replace))
    };
    let mut control = match handover {
        Some(_) => None,
        None => bind_control(false),
    };
    let running = crate::server::start_with(loaded.config, inherited)?;
    if handover.is_some() {
        control = bind_control(true);
    }
    if let Err(e) = crate::privileges::drop_to(process.user.as_deref(), process.group.as_deref()) {
        running.stop();
        anyhow::bail!("{e}");
    }
    // No connection is served before root is given up: the workers accept from here.
    running.serve();
    if let Some(handover) = handover {
        // Serving on the same sockets already: the old process may stop accepting.
        if let Err(e) = handover.release() {
            tracing::warn!("--takeover: the old process did not confirm it drains: {e}");
        }
    }
    running.announce();
    let from_file = loaded.listeners_from_file;
    let stop = running.stopper();
    let listening: Vec<String> =
        running.addrs().iter().map(|(k, a)| format!("{a} ({k})")).collect();
    crate::notify::ready(&format!("listening on {}", listening.join(", ")));
    rt.block_on(async {
        loop {
            let next = async {
                match &control {
                    Some(c) => c.accept().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = term.recv() => { tracing::info!("SIGTERM: draining connections"); break }
                _ = int.recv() => { tracing::info!("SIGINT: draining connections"); break }
                _ = hup.recv() => {
                    crate::notify::reloading();
                    hangup(&running, &source, from_file, &opts);
                    crate::notify::ready("serving");
                }
                _ = usr1.recv() => reopen_access_log(&running),
                conn = next => {
                    if crate::takeover::serve(&running, conn) {
                        running.stop_accepting();
                        break;
                    }
                }
            }
        }
    });
    crate::notify::stopping();
    let _ = stop.send(true);
    running.join();
    drop(control);
    tracing::info!("stopped");
    Ok(())
}
