//! What signals and the control socket change in a running proxy. SIGHUP derives the
//! configuration again from its source, exactly as start-up does (the file re-read, the
//! command line's options on top), and puts all of it in force: listeners added are
//! bound, listeners dropped stop accepting (their connections go on), the others keep
//! their sockets and take their new settings; users, rules, routes, certificates,
//! timeouts, limits and log settings apply to new connections. A source with problems
//! (the start-up checks), a listener that cannot be bound, or a result that would leave a
//! listener less protected than start-up allows or than it runs with (unless confirmed)
//! changes nothing, and the log, the metrics and systemd's status line say why; `rustle
//! reload` asks the same over the control socket and gets the outcome. SIGUSR1 reopens
//! the access log file (logrotate's `postrotate`). A `rustle --takeover` connecting to
//! the control socket takes the listening sockets over, and this process then drains and
//! exits (`takeover`).

use std::sync::Arc;

use crate::config::{Config, Listener, ListenerKey, Source};

use crate::policy::Policy;
use crate::run::control::{less_protected, Protection};
use crate::run::server::Running;

/// What the binary gives the signal loop besides the configuration.
#[derive(Default)]
pub struct Options {
    /// `--takeover`: take the listening sockets over from the rustle answering on the
    /// control socket, which then drains and exits.
    pub takeover: bool,
    /// Puts a new `log.level` in force (the diagnostics filter); None leaves it.
    pub set_log_level: Option<SetLogLevel>,
    /// `--allow-less-protection`: a takeover may leave listeners less protected than the
    /// running process's (`less_protected`).
    pub allow_less_protection: bool,
}

/// Puts a `log.level` filter in force, or says why it cannot.
pub type SetLogLevel = Box<dyn Fn(&str) -> Result<(), String>>;

/// SIGHUP, or `reload` on the control socket: re-reads the file (and the command line's
/// users file) and puts it in force; a source with problems changes nothing. The outcome
/// goes to the log, to the metrics and to the service manager (`STATUS=`); it is also
/// returned, for `rustle reload`. `confirmed`: the operator allows listeners less
/// protected than the running ones (`rustle reload --allow-less-protection`).
pub(crate) fn hangup(
    running: &Running,
    source: &Source,
    opts: &Options,
    confirmed: bool,
) -> Result<Vec<String>, String> {
    let old_level = running.config().log.level.clone();
    let result = derive(source).and_then(|cfg| apply_as(running, &cfg, confirmed));
    crate::telemetry::metrics::reloaded(result.is_ok());
    match &result {
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
            crate::run::notify::ready("serving");
        }
        Err(e) => {
            tracing::error!("SIGHUP: {e}; keeping the previous configuration and policy");
            // Ready again (systemd waits for it), with the refusal in the status line:
            // `systemctl status` shows it, and `systemctl reload` users can look.
            let first = e.lines().next().unwrap_or_default();
            crate::run::notify::ready(&format!("reload refused: {first}"));
        }
    }
    result
}

/// Puts a whole configuration in force (SIGHUP): listeners bound, kept or closed as it
/// says, then the policy and settings published to every worker; connections already
/// open keep going with what they started with. A listener that cannot be bound, or a
/// configuration that would leave a listener less protected than start-up allows or than
/// it runs with (`vet`), changes nothing; the warnings name protections it drops and
/// settings that only a restart or a takeover puts in force.
pub fn apply(running: &Running, cfg: &Config) -> Result<Vec<String>, String> {
    apply_as(running, cfg, false)
}

/// `apply`, where `confirmed` allows listeners less protected than the running ones.
fn apply_as(running: &Running, cfg: &Config, confirmed: bool) -> Result<Vec<String>, String> {
    let running_now: Vec<(ListenerKey, Protection)> =
        running.listeners().iter().map(|l| (l.key, Protection::of(l))).collect();
    let new: Vec<Listener> = cfg.effective_listeners();
    let state_now = running.config().state.redis();
    if cfg.state.redis() != state_now {
        return Err("the [state] settings (backend, Redis, sync_interval) changed: they take \
                    effect at a restart or a takeover; this reload is refused and the running \
                    configuration kept"
            .into());
    }
    let lost = less_protected(&running_now, &new, confirmed);
    if !lost.is_empty() {
        return Err(lost.join("; "));
    }
    // New listeners are bound first (the policy refuses the proxy's own addresses as
    // destinations); dropping `plan` on any failure below closes them again.
    let publishing = running.publishing();
    let plan = running.prepare(cfg)?;
    let overlay = running.overlay().snapshot();
    let mut policy =
        Policy::build_with(cfg, &plan.own(), Some(&overlay)).map_err(|p| p.join("; "))?;
    let old = running.policy();
    let mut warnings = vet(cfg, &plan.listeners(), &old, &policy)?;
    // (A listener requiring authentication left with no user: `vet` names it.)
    warnings.extend(policy.undefined_names.iter().cloned());
    warnings.extend(plan.warnings.iter().cloned());
    policy.routes.keep_health_of(&old.routes);
    let problems = crate::config::quota_problems(&cfg.quotas);
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    let groups = crate::run::server::groups_of(&policy);
    let traffic = running.user_traffic().clone();
    let new_users = policy.users.clone();
    running.commit(plan, policy);
    // The quotas as changed, in force at once (usage of a quota removed is dropped).
    if let Err(e) = running.quotas().configure(cfg, groups) {
        warnings.push(e);
    }
    // Under the publishing lock: a users-API change published after this one is settled
    // after it, never undone by it.
    crate::policy::overlay::settle(&traffic, &old.users, &new_users);
    drop(publishing);
    Ok(warnings)
}

/// The configuration a reload would run with, or why it is not taken: checked as start-up
/// and `rustle check` check it (a file declaring no listener included), the names of users
/// and groups aside (`check::reload_source`).
fn derive(source: &Source) -> Result<Config, String> {
    crate::run::check::reload_source(source).map(|loaded| loaded.config).map_err(|p| p.to_string())
}

/// Checks a new configuration and its policy against the listeners it would run (those
/// kept and those added): the start-up open-proxy check on each. Returns a warning for each protection the new policy drops,
/// and for each listener requiring authentication that is left with no user (it then
/// refuses everyone: stricter, so it goes through).
pub(crate) fn vet(
    cfg: &Config,
    listeners: &[Arc<crate::policy::Listener>],
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
pub(crate) fn reopen_access_log(running: &Running) {
    use crate::telemetry::accesslog::Sink;
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
            // Compared before the sockets are asked for: a refusal leaves the running
            // process untouched.
            match crate::run::control::listeners(path)? {
                Some(running_now) => {
                    let new = loaded.config.effective_listeners();
                    let lost = less_protected(&running_now, &new, opts.allow_less_protection);
                    if !lost.is_empty() {
                        anyhow::bail!(
                            "--takeover refused, the running rustle goes on serving: {}",
                            lost.join("; ")
                        );
                    }
                }
                None => tracing::warn!(
                    "--takeover: the running rustle does not list its listeners' protections \
                     (an older version): not compared"
                ),
            }
            let (inherited, handover) = crate::run::takeover::take_over(path)?;
            (inherited, Some(handover))
        }
        false => (crate::run::takeover::activation_sockets()?, None),
    };
    // The control socket, bound before the listeners say where they are (and before root
    // is given up); a process taking over replaces the old one's once it serves.
    let bind_control = |replace: bool| {
        let _in = rt.enter();
        control_path.as_deref().and_then(|p| crate::run::takeover::Control::bind(p, replace))
    };
    let mut control = match handover {
        Some(_) => None,
        None => bind_control(false),
    };
    let running = crate::run::server::start_with(loaded.config, inherited)?;
    if handover.is_some() {
        control = bind_control(true);
    }
    if let Err(e) =
        crate::run::privileges::drop_to(process.user.as_deref(), process.group.as_deref())
    {
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
    let stop = running.stopper();
    let listening: Vec<String> =
        running.addrs().iter().map(|(k, a)| format!("{a} ({k})")).collect();
    crate::run::notify::ready(&format!("listening on {}", listening.join(", ")));
    rt.block_on(async {
        let taken_over = loop {
            let next = async {
                match &control {
                    Some(c) => c.accept().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = term.recv() => { tracing::info!("SIGTERM: draining connections"); break false }
                _ = int.recv() => { tracing::info!("SIGINT: draining connections"); break false }
                _ = hup.recv() => {
                    crate::run::notify::reloading();
                    let _ = hangup(&running, &source, &opts, false);
                }
                _ = usr1.recv() => reopen_access_log(&running),
                conn = next => {
                    let mut other = |request: &str, conn: &std::os::unix::net::UnixStream| {
                        let reload = |confirmed: bool| {
                            crate::run::notify::reloading();
                            hangup(&running, &source, &opts, confirmed)
                        };
                        crate::run::control::answer(request, conn, &running, reload)
                    };
                    if crate::run::takeover::serve(&running, conn, &mut other) {
                        // The new process answers on the admin socket from here.
                        running.release_admin();
                        break true;
                    }
                }
            }
        };
        // `/readyz` says 503 at once; accepting goes on for `timeouts.drain_delay`, while
        // load balancers and Kubernetes stop sending (a second SIGTERM or SIGINT ends it).
        running.readiness().set_draining();
        crate::run::notify::stopping();
        let delay = running.config().timeouts.drain_delay;
        if !delay.is_zero() {
            tracing::info!("still accepting for {delay:?} (timeouts.drain_delay), then draining");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = term.recv() => tracing::info!("SIGTERM again: draining at once"),
                _ = int.recv() => tracing::info!("SIGINT again: draining at once"),
            }
        }
        if taken_over {
            running.stop_accepting();
        }
    });
    let _ = stop.send(true);
    running.join();
    drop(control);
    tracing::info!("stopped");
    Ok(())
}
