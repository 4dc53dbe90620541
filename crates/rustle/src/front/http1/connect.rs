//! CONNECT tunnels: connect to `host:port`, answer 200 once the connection is up, then
//! relay bytes both ways until both sides are done. A failure before the 200 is answered
//! with 502 or 504 naming the cause, so no tunnel byte ever follows an error.

use rustle_proto::http::{BodyKind, Target};
use tokio::io::AsyncWriteExt;

use super::{Client, Exchange, Next};
use crate::acl::Protocol;
use crate::error::Error;
use crate::front::tunnel::Handoff;
use crate::upstream::Tls;

const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

pub(super) async fn tunnel(c: &mut Client, ex: &mut Exchange) -> Result<Next, Error> {
    let Target::Authority { host, port, .. } = c.head.target else {
        return Err(Error::Unsupported("CONNECT needs a host:port target"));
    };
    if c.head.body != BodyKind::None {
        return Err(Error::Unsupported("a CONNECT request cannot carry a body"));
    }
    let host = std::str::from_utf8(host.get(c.buf.filled()))
        .map_err(|_| Error::Unsupported("the host name is not ASCII"))?
        .to_ascii_lowercase();
    c.buf.consume(c.head.len);
    let up = c.upstream(None, &host, port, Protocol::Connect, Tls::Plain).await?;
    ex.upstream = Some(up.addr);
    c.stream.write_all(ESTABLISHED).await.map_err(Error::Client)?;
    c.stream.flush().await.map_err(Error::Client)?;
    ex.status = 200;
    ex.responded = true;
    // A client may send its first tunnel bytes (a TLS ClientHello) without waiting for
    // the 200: they were read with the head and go first.
    let early_up = c.buf.filled().to_vec();
    c.buf.clear();
    let throttle = c.throttle();
    ex.via = up.via;
    Ok(Next::Tunnel(Handoff {
        upstream: up.stream,
        early_up,
        early_down: up.early,
        throttle,
        traffic: c.traffic.clone(),
    }))
}
