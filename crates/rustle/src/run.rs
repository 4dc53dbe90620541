pub mod admin;
pub mod check;
pub mod control;
pub mod notify;
pub mod privileges;
pub mod reload;
pub mod server;
pub mod takeover;
