//! The radius backend.

use super::{Ask, Failure, Verdict};
use crate::config::RadiusBackend;

pub(crate) struct Radius {}

impl Radius {
    pub(crate) fn new(_cfg: &RadiusBackend) -> Result<Radius, String> {
        Ok(Radius {})
    }

    pub(crate) async fn check(&self, _ask: &Ask) -> Result<Verdict, Failure> {
        Err(Failure::Protocol("not built".into()))
    }
}

impl Radius {
    /// Sends one accounting record (Accounting-Request) and waits for its response.
    pub(crate) async fn account(&self, _rec: &super::AcctRecord) -> Result<(), Failure> {
        Err(Failure::Protocol("not built".into()))
    }
}
