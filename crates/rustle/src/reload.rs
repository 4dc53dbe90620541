//! What signals change in a running proxy. SIGHUP derives the configuration again from its
//! source, exactly as start-up does (the file re-read, the command line's options on top),
//! and puts the new users, rules and limits in force, unless the result would leave a
//! running listener less protected than start-up allows, or the file looks emptied or cut
//! short: then nothing changes and the log says why. SIGUSR1 reopens the access log file
//! (logrotate's `postrotate`).

use std::sync::Arc;

use crate::config::{Config, Listener, Source};
use crate::policy::Policy;
use crate::server::Running;

/// SIGHUP: re-reads the file (and the command line's users file) and puts the policy in
/// force; a source with problems changes nothing. `listeners_from_file`: the running
/// listeners are the ones the file declared at start.
pub fn hangup(running: &Running, source: &Source, listeners_from_file: bool) {
    let result = derive(source, listeners_from_file).and_then(|cfg| apply(running, &cfg));
    crate::metrics::reloaded(result.is_ok());
    match result {
        Ok(warnings) => {
            for w in warnings {
                tracing::warn!("SIGHUP: {w}");
            }
            tracing::info!(
                "SIGHUP: reloaded users, rules and per-user limits from {source} \
                 (listeners and connection limits stay as started)"
            );
        }
        Err(e) => tracing::error!("SIGHUP: {e}; keeping the previous policy"),
    }
}

/// Puts new users, rules, limits, routes and certificates in force (SIGHUP). Listeners
/// and everything else stay as they started; connections already open keep going. A
/// configuration that would leave a running listener less protected than start-up
/// allows changes nothing (`vet`); the warnings name protections it drops.
pub fn apply(running: &Running, cfg: &Config) -> Result<Vec<String>, String> {
    let mut policy = Policy::build(cfg, running.own()).map_err(|p| p.join("; "))?;
    let old = running.policy();
    let mut warnings = vet(cfg, running.listeners(), &old, &policy)?;
    // (A listener requiring authentication left with no user: `vet` names it.)
    warnings.extend(policy.unknown_groups.iter().cloned());
    policy.keep_tls_of(&old);
    policy.routes.keep_health_of(&old.routes);
    running.publish(policy);
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

/// Checks a new configuration and its policy against the listeners running: the start-up
/// open-proxy check on each. Returns a warning for each protection the new policy drops,
/// and for each listener requiring authentication that is left with no user (it then
/// refuses everyone: stricter, so it goes through).
pub fn vet(
    cfg: &Config,
    running: &[Arc<Listener>],
    old: &Policy,
    new: &Policy,
) -> Result<Vec<String>, String> {
    for l in running {
        if let Some(problem) = cfg.open_proxy_problem(l) {
            return Err(format!("under the new configuration, the running {problem}"));
        }
    }
    let mut warnings = Vec::new();
    for l in running.iter().filter(|l| l.auth && new.users.is_empty()) {
        warnings.push(format!(
            "the running listener {} on {} requires authentication, and the new \
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
    match running.access_log().reopen() {
        Ok(Some(path)) => tracing::info!("SIGUSR1: reopened the access log {}", path.display()),
        Ok(None) => {
            let target = match running.access_log() {
                Sink::Stdout => "goes to stdout",
                Sink::Stderr => "goes to stderr",
                Sink::Off | Sink::File(_) => "is off",
            };
            tracing::info!("SIGUSR1: the access log {target}; nothing to reopen");
        }
        Err(e) => tracing::error!(
            "SIGUSR1: cannot reopen the access log: {e}; lines go to the file already open"
        ),
    }
}

/// Runs until SIGINT or SIGTERM. SIGHUP derives the configuration from `source` again
/// and puts its policy in force; SIGUSR1 reopens the access log. `loaded` is what
/// `source` gave at start.
pub fn run_until_signal(
    loaded: crate::config::Loaded,
    source: crate::config::Source,
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
    let running = crate::server::start(loaded.config)?;
    if let Err(e) = crate::privileges::drop_to(process.user.as_deref(), process.group.as_deref()) {
        running.stop();
        anyhow::bail!("{e}");
    }
    let from_file = loaded.listeners_from_file;
    let stop = running.stopper();
    let listening: Vec<String> = running.addrs.iter().map(|(k, a)| format!("{a} ({k})")).collect();
    crate::notify::ready(&format!("listening on {}", listening.join(", ")));
    rt.block_on(async {
        loop {
            tokio::select! {
                _ = term.recv() => { tracing::info!("SIGTERM: draining connections"); break }
                _ = int.recv() => { tracing::info!("SIGINT: draining connections"); break }
                _ = hup.recv() => {
                    crate::notify::reloading();
                    hangup(&running, &source, from_file);
                    crate::notify::ready("serving");
                }
                _ = usr1.recv() => reopen_access_log(&running),
            }
        }
    });
    crate::notify::stopping();
    let _ = stop.send(true);
    running.join();
    tracing::info!("stopped");
    Ok(())
}
