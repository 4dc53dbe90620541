pub mod body;
pub mod buf;
pub mod conn;
pub mod idle;
pub mod relay;
pub mod sys;
pub mod tls;
