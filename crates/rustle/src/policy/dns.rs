//! What the resolver reads besides `[dns]`: /etc/hosts, /etc/resolv.conf (when `[dns]
//! servers` names none) and the TLS client configuration of `tls://` and `https://`
//! servers (`[dns] ca`, or the system's roots). Read with the policy, at start and on each
//! reload, on the thread building it: a worker never opens a file for a lookup, and a
//! reload puts edits of those files in force.

use std::sync::Arc;

use crate::config::Dns;

/// The files as read, shared by every worker's resolver.
#[derive(Default)]
pub(crate) struct System {
    /// /etc/hosts (empty when it cannot be read).
    pub(crate) hosts: String,
    /// /etc/resolv.conf when `[dns] servers` is empty, or why it could not be read.
    pub(crate) resolv_conf: Option<Result<Vec<u8>, String>>,
    /// For `tls://` and `https://` servers, and why its verifier last refused one.
    pub(crate) tls: Option<(Arc<rustls::ClientConfig>, Arc<crate::io::tls::Refusals>)>,
    /// `[dns] ca` as read, so that a reload sees a changed CA file (`PartialEq`).
    pub(crate) ca: Vec<u8>,
}

/// Where the files are (tests read others).
pub(crate) struct Paths<'a> {
    pub(crate) hosts: &'a str,
    pub(crate) resolv_conf: &'a str,
}

const SYSTEM_PATHS: Paths<'static> = Paths { hosts: "/etc/hosts", resolv_conf: "/etc/resolv.conf" };

impl System {
    /// Reads what `cfg` needs; a CA that cannot be used is a problem of the configuration.
    pub(crate) fn read(cfg: &Dns) -> Result<System, String> {
        System::read_from(cfg, &SYSTEM_PATHS)
    }

    pub(crate) fn read_from(cfg: &Dns, paths: &Paths<'_>) -> Result<System, String> {
        let hosts = std::fs::read_to_string(paths.hosts).unwrap_or_default();
        let resolv_conf = cfg.servers.is_empty().then(|| {
            std::fs::read(paths.resolv_conf).map_err(|e| format!("{}: {e}", paths.resolv_conf))
        });
        let (tls, ca) = match cfg.encrypted() {
            false => (None, Vec::new()),
            true => {
                let ca = match &cfg.ca {
                    Some(path) => std::fs::read(path)
                        .map_err(|e| format!("dns.ca: {}: {e}", path.display()))?,
                    None => Vec::new(),
                };
                let tls = crate::io::tls::remembering_connector(cfg.ca.as_deref()).map_err(
                    |e| match &cfg.ca {
                        Some(_) => format!("dns.ca: {e}"),
                        None => "dns.servers: no system CA certificates found to verify tls:// \
                             and https:// servers with; install ca-certificates or set dns.ca"
                            .to_string(),
                    },
                )?;
                (Some(tls), ca)
            }
        };
        Ok(System { hosts, resolv_conf, tls, ca })
    }
}

impl PartialEq for System {
    fn eq(&self, other: &System) -> bool {
        self.hosts == other.hosts
            && self.resolv_conf == other.resolv_conf
            && self.ca == other.ca
            && self.tls.is_some() == other.tls.is_some()
    }
}
