//! What is told of the traffic: the access log (one record and one line per exchange) and
//! the per-worker metrics the admin endpoint sums.

pub(crate) mod accesslog;
pub(crate) mod metrics;
