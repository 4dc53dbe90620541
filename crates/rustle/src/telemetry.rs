pub(crate) mod accesslog;
pub(crate) mod metrics;
