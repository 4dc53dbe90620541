//! Start-up, signals and reloads, takeovers, the worker threads and their accept loops, the
//! admin endpoint: what runs the proxy. Nothing below imports it.

pub(crate) mod admin;
pub mod check;
pub mod control;
pub(crate) mod notify;
pub(crate) mod privileges;
pub mod reload;
pub mod server;
pub(crate) mod takeover;
pub mod users;
