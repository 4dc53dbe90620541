pub(crate) mod admin;
pub mod check;
pub mod control;
pub(crate) mod notify;
pub(crate) mod privileges;
pub mod reload;
pub mod server;
pub(crate) mod takeover;
