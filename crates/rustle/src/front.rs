//! The front ends: from an accepted connection (`dispatch`) to the protocol that serves it
//! (`http1`, `http2`, `socks`, `portmap`, `udp`), a task per connection. Each fills one
//! access-log record per exchange and ends it through `exchange::end`; each connects
//! upstream through `exchange::connect`; established tunnels go to `tunnel`.

pub(crate) mod dispatch;
pub(crate) mod exchange;
pub(crate) mod http1;
pub(crate) mod http2;
pub(crate) mod portmap;
pub(crate) mod socks;
pub mod tunnel;
pub(crate) mod udp;
pub(crate) mod worker;
