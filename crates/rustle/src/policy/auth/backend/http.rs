//! The http backend.

use super::{Ask, Failure, Verdict};
use crate::config::HttpBackend;

pub(crate) struct Http {}

impl Http {
    pub(crate) fn new(_cfg: &HttpBackend) -> Result<Http, String> {
        Ok(Http {})
    }

    pub(crate) async fn check(&self, _ask: &Ask) -> Result<Verdict, Failure> {
        Err(Failure::Protocol("not built".into()))
    }
}
