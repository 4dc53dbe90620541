//! `[auth.kerberos]`: Negotiate (SPNEGO with a Kerberos ticket) on the HTTP and HTTPS
//! proxy ports, beside Basic.

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kerberos {
    /// The proxy's keys (`ktutil`, `kadmin ktadd`).
    pub keytab: PathBuf,
    /// The service the tickets must be for, `HTTP/proxy.example.org` (`@REALM` optional);
    /// unset: any principal the keytab holds a key of.
    #[serde(default)]
    pub service_principal: Option<String>,
    /// The client realms accepted (`["EXAMPLE.ORG"]`); empty: any realm whose tickets
    /// the keytab's keys open (the KDC's cross-realm trust decides).
    #[serde(default)]
    pub realms: Vec<String>,
    /// `alice@EXAMPLE.ORG` is the user `alice` (true) or `alice@EXAMPLE.ORG` (false).
    #[serde(default = "yes")]
    pub strip_realm: bool,
}

fn yes() -> bool {
    true
}

impl Kerberos {
    /// What is wrong with the settings themselves (the keytab is read by the acceptor).
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(s) = &self.service_principal {
            let name = s.split('@').next().unwrap_or_default();
            if name.is_empty() || s.split('@').count() > 2 || name.split('/').any(str::is_empty) {
                problems.push(format!(
                    "auth.kerberos.service_principal: `{s}` is not a principal such as \
                     HTTP/proxy.example.org"
                ));
            }
        }
        for r in &self.realms {
            if r.is_empty() || r.contains(['@', '/', ' ']) {
                problems.push(format!("auth.kerberos.realms: `{r}` is not a realm"));
            }
        }
        problems
    }
}
