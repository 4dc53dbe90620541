pub mod accesslog;
pub mod metrics;
