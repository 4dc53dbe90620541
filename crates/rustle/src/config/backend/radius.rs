//! `kind = "radius"`.

use std::time::Duration;

use serde::Deserialize;

use super::super::duration::duration;
use super::{
    default_cache_ttl, default_max_in_flight, default_negative_ttl, default_timeout, Common,
};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RadiusBackend {
    /// For logs and metrics (default: the kind).
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default = "default_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    #[serde(default = "default_cache_ttl", deserialize_with = "duration")]
    pub cache_ttl: Duration,
    #[serde(default = "default_negative_ttl", deserialize_with = "duration")]
    pub negative_ttl: Duration,
    // The radius settings.
}

impl RadiusBackend {
    pub fn common(&self) -> Common {
        Common {
            name: self.name.clone().unwrap_or_else(|| "radius".into()),
            timeout: self.timeout,
            max_in_flight: self.max_in_flight,
            cache_ttl: self.cache_ttl,
            negative_ttl: self.negative_ttl,
        }
    }
}

impl RadiusBackend {
    /// How often an open session's Interim-Update goes out; None: no accounting.
    pub fn accounting_interval(&self) -> Option<Duration> {
        None
    }
}
