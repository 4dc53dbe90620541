//! Bytes on sockets: a connection's stream (plain, TLS, kernel TLS), read buffers, body
//! framing, the one relay engine, idle deadlines, and `sys`, the one module with `unsafe`.

pub(crate) mod body;
pub(crate) mod buf;
pub(crate) mod conn;
pub(crate) mod egress;
pub(crate) mod idle;
pub(crate) mod relay;
pub(crate) mod sys;
pub mod tls;
