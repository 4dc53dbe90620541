//! The control socket's requests besides the takeover (`takeover` answers that one and
//! hands the others here), both ends: `reload`, which does what SIGHUP does and answers
//! its outcome (`rustle reload`), and `listeners`, each running listener's key and
//! protection, which a `rustle --takeover` compares its configuration against before it
//! asks for the sockets. One line asks; the answer is lines up to the end of the
//! connection:
//! ```text
//! new: reload [allow-less-protection]
//! old: reloaded | refused
//! old: MESSAGE                                 (each warning, or each reason)
//!
//! new: listeners
//! old: listener tcp|udp CONFIGURED-ADDRESS RANK auth,client-cert|auth|client-cert|none
//! old: end
//! ```

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

use crate::config::{Listener, ListenerKey};
use crate::run::server::Running;

/// How long `rustle reload` waits for the answer: a reload binds listeners and reads
/// certificates and users files (argon2 hashes are checked lazily), seconds at most.
const PATIENCE: Duration = Duration::from_secs(30);

/// The flag of `reload` that allows listeners less protected than the running ones.
const CONFIRM: &str = "allow-less-protection";

/// Answers `request` (its first line, trimmed) on `conn`, in the running process; `reload`
/// does what SIGHUP does (`reload::hangup`), its argument the operator's confirmation.
pub(crate) fn answer(
    request: &str,
    conn: &UnixStream,
    running: &Running,
    reload: impl FnOnce(bool) -> Result<Vec<String>, String>,
) {
    let mut words = request.split(' ');
    let text = match (words.next(), words.next(), words.next()) {
        (Some("reload"), confirm, None) if confirm.is_none_or(|w| w == CONFIRM) => {
            tracing::info!("control socket: reload requested");
            let (head, lines) = match reload(confirm.is_some()) {
                Ok(warnings) => ("reloaded", warnings),
                Err(e) => ("refused", e.lines().map(String::from).collect()),
            };
            let mut text = format!("{head}\n");
            for l in lines {
                text.push_str(&l.replace('\n', " "));
                text.push('\n');
            }
            text
        }
        (Some("listeners"), None, None) => {
            let mut text = String::new();
            for l in running.listeners() {
                let k = l.key;
                let transport = if k.udp { "udp" } else { "tcp" };
                let words = Protection::of(&l).to_words();
                text.push_str(&format!("listener {transport} {} {} {words}\n", k.listen, k.rank));
            }
            text.push_str("end\n");
            text
        }
        _ => {
            tracing::warn!("control socket: unknown request {request:?}");
            format!("refused\nunknown request {request:?}\n")
        }
    };
    if let Err(e) = (&*conn).write_all(text.as_bytes()) {
        tracing::warn!("control socket: cannot answer {request:?}: {e}");
    }
}

/// `rustle reload`: asks the rustle answering on the control socket at `path` to reload.
/// Ok(messages) when it did (its warnings), Err(reasons) when it refused.
pub fn reload(path: &Path, confirm: bool) -> anyhow::Result<Result<Vec<String>, Vec<String>>> {
    let request = match confirm {
        true => format!("reload {CONFIRM}\n"),
        false => "reload\n".to_string(),
    };
    let mut lines = ask(path, &request)?.into_iter();
    match lines.next().as_deref() {
        Some("reloaded") => Ok(Ok(lines.collect())),
        Some("refused") => Ok(Err(lines.collect())),
        Some(other) => anyhow::bail!("unexpected answer {other:?} on {}", path.display()),
        None => anyhow::bail!(
            "the rustle on {} closed the connection without an answer (a version without \
             `rustle reload`? send it SIGHUP)",
            path.display()
        ),
    }
}

/// Each listener of the rustle answering at `path`, with its protection; None from a
/// version that does not answer `listeners`.
pub(crate) fn listeners(path: &Path) -> anyhow::Result<Option<Vec<(ListenerKey, Protection)>>> {
    let lines = ask(path, "listeners\n")?;
    if lines.first().is_none_or(|l| l.starts_with("refused")) {
        return Ok(None);
    }
    let mut out = Vec::new();
    for line in lines.iter().take_while(|l| *l != "end") {
        let bad = || anyhow::anyhow!("unexpected line {line:?} on {}", path.display());
        let ["listener", transport, listen, rank, words] = line.split(' ').collect::<Vec<_>>()[..]
        else {
            return Err(bad());
        };
        let key = ListenerKey {
            listen: listen.parse().map_err(|_| bad())?,
            udp: transport == "udp",
            rank: rank.parse().map_err(|_| bad())?,
        };
        out.push((key, Protection::from_words(words)));
    }
    Ok(Some(out))
}

/// What protects a listener's clients, compared across a reload or a takeover.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Protection {
    /// `auth = true`.
    pub(crate) auth: bool,
    /// `client_certs = "required"` in its `[listener.tls]`.
    pub(crate) client_cert: bool,
    /// With `proxy_protocol`: its `proxy_protocol_from`, the only sources that may name
    /// a client.
    pub(crate) proxy_from: Option<Vec<crate::acl::Cidr>>,
}

impl Protection {
    pub(crate) fn of(l: &Listener) -> Protection {
        let required = crate::config::ClientCerts::Required;
        Protection {
            // A relay asks no credentials whatever `auth` says (the checks refuse it).
            auth: l.auth && !l.kind.needs_target(),
            client_cert: l.tls.as_ref().is_some_and(|t| t.client_certs == required),
            proxy_from: l.proxy_protocol.map(|_| l.proxy_protocol_from.clone()),
        }
    }

    /// As the control socket carries it: `auth`, `client-cert` and
    /// `proxy-from=BLOCK+BLOCK...` joined by commas, or `none`.
    pub(crate) fn to_words(&self) -> String {
        let mut words = Vec::new();
        if self.auth {
            words.push("auth".to_string());
        }
        if self.client_cert {
            words.push("client-cert".to_string());
        }
        if let Some(from) = &self.proxy_from {
            let blocks: Vec<String> = from.iter().map(|c| c.to_string()).collect();
            words.push(format!("proxy-from={}", blocks.join("+")));
        }
        if words.is_empty() {
            return "none".into();
        }
        words.join(",")
    }

    pub(crate) fn from_words(words: &str) -> Protection {
        let has = |w: &str| words.split(',').any(|x| x == w);
        let proxy_from = words.split(',').find_map(|w| w.strip_prefix("proxy-from=")).map(|b| {
            b.split('+').filter(|b| !b.is_empty()).filter_map(|b| b.parse().ok()).collect()
        });
        Protection { auth: has("auth"), client_cert: has("client-cert"), proxy_from }
    }
}

/// Whether every address of `inner` is in `outer`.
fn covers(outer: &crate::acl::Cidr, inner: &crate::acl::Cidr) -> bool {
    use crate::acl::Cidr;
    let first = match *inner {
        Cidr::V4 { net, .. } => std::net::IpAddr::from(std::net::Ipv4Addr::from(net)),
        Cidr::V6 { net, .. } => std::net::IpAddr::from(std::net::Ipv6Addr::from(net)),
    };
    let same_family = matches!(
        (outer, inner),
        (Cidr::V4 { .. }, Cidr::V4 { .. }) | (Cidr::V6 { .. }, Cidr::V6 { .. })
    );
    same_family && outer.prefix() <= inner.prefix() && outer.contains(first)
}

/// A refusal for each listener of `new` less protected than the one running under the same
/// key (`running`), unless the operator confirmed it: `confirmed` (a command-line flag) or
/// `allow_less_protection = true` on the listener.
pub(crate) fn less_protected(
    running: &[(ListenerKey, Protection)],
    new: &[Listener],
    confirmed: bool,
) -> Vec<String> {
    let mut out = Vec::new();
    for l in new.iter().filter(|l| !confirmed && !l.allow_less_protection) {
        let Some((_, was)) = running.iter().find(|(k, _)| *k == l.key) else { continue };
        let now = Protection::of(l);
        let mut dropped = Vec::new();
        if was.auth && !now.auth {
            dropped.push("require authentication (`auth = true`)".to_string());
        }
        if was.client_cert && !now.client_cert {
            dropped.push("require client certificates (`client_certs = \"required\"`)".into());
        }
        match (&was.proxy_from, &now.proxy_from) {
            (Some(_), None) => dropped.push(
                "take the client from a PROXY protocol header (`proxy_protocol`): every \
                 client behind the balancer would be the balancer"
                    .into(),
            ),
            (Some(old), Some(new)) => {
                let wider: Vec<String> = new
                    .iter()
                    .filter(|n| !old.iter().any(|o| covers(o, n)))
                    .map(|n| n.to_string())
                    .collect();
                if !wider.is_empty() {
                    dropped.push(format!(
                        "take PROXY protocol headers only from the sources it does \
                         (`proxy_protocol_from` adds {})",
                        wider.join(", ")
                    ));
                }
            }
            _ => {}
        }
        if dropped.is_empty() {
            continue;
        }
        let name = l.name.as_deref().map(|n| format!(" `{n}`")).unwrap_or_default();
        out.push(format!(
            "listener{name} {} on {} would no longer {}: refused; to confirm, set \
             `allow_less_protection = true` on that [[listener]] (or run `rustle reload \
             --allow-less-protection`, `rustle --takeover --allow-less-protection`)",
            l.kind,
            l.key.listen,
            dropped.join(" nor ")
        ));
    }
    out
}

/// Sends `request` and reads the answer's lines to the end of the connection.
fn ask(path: &Path, request: &str) -> anyhow::Result<Vec<String>> {
    let conn = UnixStream::connect(path)
        .with_context(|| format!("no rustle answers on the control socket {}", path.display()))?;
    conn.set_read_timeout(Some(PATIENCE))?;
    conn.set_write_timeout(Some(PATIENCE))?;
    (&conn).write_all(request.as_bytes())?;
    let mut lines = Vec::new();
    for line in BufReader::new(&conn).lines() {
        let line = line.with_context(|| format!("reading the answer on {}", path.display()))?;
        lines.push(line);
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ClientCerts, ListenTls, ListenerKind};

    fn listener(auth: bool, certs: ClientCerts, confirmed: bool) -> Listener {
        let mut l = Listener::new(ListenerKind::Https, "127.0.0.1:3129".parse().expect("addr"));
        let mut tls = ListenTls::new("c.pem".into(), "k.pem".into());
        tls.client_certs = certs;
        l.tls = Some(tls);
        l.auth = auth;
        l.allow_less_protection = confirmed;
        l.key = ListenerKey { listen: l.listen, udp: false, rank: 0 };
        l
    }

    #[test]
    fn a_protection_dropped_is_refused_unless_confirmed() {
        use ClientCerts::{None as NoCerts, Optional, Required};
        // (running: auth, certs required; new: auth, certs, confirmed in the file; refused)
        let table = [
            (true, false, false, NoCerts, false, true),
            (true, false, true, NoCerts, false, false),
            (false, true, false, Optional, false, true),
            (false, true, false, Required, false, false),
            (true, true, true, Optional, false, true),
            (true, true, false, NoCerts, true, false),
            (false, false, false, NoCerts, false, false),
            (true, false, false, NoCerts, true, false),
        ];
        for (auth, required, new_auth, new_certs, confirmed, refused) in table {
            let was = Protection { auth, client_cert: required, proxy_from: None };
            let running = [(listener(auth, NoCerts, false).key, was)];
            let new = [listener(new_auth, new_certs, confirmed)];
            let lost = less_protected(&running, &new, false);
            assert_eq!(
                !lost.is_empty(),
                refused,
                "{auth} {required} -> {new_auth} {new_certs:?}: {lost:?}"
            );
            // The command line's confirmation allows all of it.
            assert!(less_protected(&running, &new, true).is_empty());
        }
        // An authenticating listener that becomes a relay loses its auth, whatever the
        // new file says of `auth` (a relay asks no credentials).
        let was = Protection { auth: true, ..Protection::default() };
        let running = [(listener(true, NoCerts, false).key, was)];
        let mut relay = listener(true, NoCerts, false);
        relay.kind = ListenerKind::Relay;
        relay.tls = None;
        assert_eq!(less_protected(&running, &[relay], false).len(), 1);
        // Another address: nothing to compare with.
        let was = Protection { auth: true, client_cert: true, proxy_from: None };
        let running = [(ListenerKey::default(), was)];
        assert!(less_protected(&running, &[listener(false, NoCerts, false)], false).is_empty());
    }

    #[test]
    fn protections_cross_the_control_socket_unchanged() {
        let blocks = vec!["10.0.0.0/8".parse().expect("cidr"), "::1".parse().expect("cidr")];
        for auth in [false, true] {
            for client_cert in [false, true] {
                for proxy_from in [None, Some(vec![]), Some(blocks.clone())] {
                    let p = Protection { auth, client_cert, proxy_from };
                    assert_eq!(Protection::from_words(&p.to_words()), p);
                }
            }
        }
    }

    #[test]
    fn proxy_protocol_removed_or_its_sources_widened_is_refused_unless_confirmed() {
        let cidrs = |list: &[&str]| -> Vec<crate::acl::Cidr> {
            list.iter().map(|c| c.parse().expect("cidr")).collect()
        };
        let with = |from: Option<&[&str]>, confirmed: bool| {
            let mut l = listener(false, ClientCerts::None, confirmed);
            l.proxy_protocol = from.map(|_| crate::config::ProxyProtocol::Any);
            l.proxy_protocol_from = from.map(cidrs).unwrap_or_default();
            l
        };
        let was =
            Protection { proxy_from: Some(cidrs(&["10.0.0.0/8", "::1"])), ..Default::default() };
        let running = [(with(None, false).key, was)];
        // (new sources, refused)
        let table: [(Option<&[&str]>, bool); 6] = [
            (Some(&["10.0.0.0/8", "::1"]), false),
            (Some(&["10.1.0.0/16"]), false),
            (Some(&["10.0.0.0/8", "192.0.2.1"]), true),
            (Some(&["10.0.0.0/7"]), true),
            (Some(&["::/0"]), true),
            (None, true),
        ];
        for (from, refused) in table {
            let lost = less_protected(&running, &[with(from, false)], false);
            assert_eq!(!lost.is_empty(), refused, "{from:?}: {lost:?}");
            assert!(less_protected(&running, &[with(from, true)], false).is_empty());
        }
        let lost =
            less_protected(&running, &[with(Some(&["10.0.0.0/8", "192.0.2.1"]), false)], false);
        assert!(lost[0].contains("adds 192.0.2.1/32"), "{lost:?}");
        // A listener taking no header before may take one now.
        let running = [(with(None, false).key, Protection::default())];
        assert!(less_protected(&running, &[with(Some(&["10.0.0.1"]), false)], false).is_empty());
    }
}
