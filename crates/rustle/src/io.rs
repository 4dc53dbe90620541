pub(crate) mod body;
pub(crate) mod buf;
pub(crate) mod conn;
pub(crate) mod idle;
pub(crate) mod relay;
pub(crate) mod sys;
pub mod tls;
