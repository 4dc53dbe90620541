//! The ldap backend.

use super::{Ask, Failure, Verdict};
use crate::config::LdapBackend;

pub(crate) struct Ldap {}

impl Ldap {
    pub(crate) fn new(_cfg: &LdapBackend) -> Result<Ldap, String> {
        Ok(Ldap {})
    }

    pub(crate) async fn check(&self, _ask: &Ask) -> Result<Verdict, Failure> {
        Err(Failure::Protocol("not built".into()))
    }
}
