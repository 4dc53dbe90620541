//! `[auth.kerberos]`: Negotiate (SPNEGO with a Kerberos ticket) on the HTTP and HTTPS
//! proxy ports, beside Basic.

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kerberos {
    /// The proxy's keys (`ktutil`, `kadmin ktadd`).
    pub keytab: PathBuf,
}
