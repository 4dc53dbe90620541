//! The HTTP/2 modes: h2c (prior knowledge to a proxy's HTTP port) and h2-tls
//! (ALPN `h2` on its TLS port). A connection is shared by `--streams` lanes,
//! each with one stream in flight at a time, each stream a proxied GET
//! (`:scheme http`, `:authority` the origin), as a browser sends one to an
//! HTTP/2 proxy. The `h2` crate is the client; its connection task runs
//! beside the lanes on the thread's `LocalSet`.

use bytes::Bytes;
use h2::client::SendRequest;
use http::Request;

use super::dial::{dial, Stream};
use super::plan::Plan;
use super::response::Reader;
use super::stats::ErrorKind;

/// Receive windows large enough that a response body never waits for a
/// WINDOW_UPDATE of ours (as the tests' h2 clients set them).
const STREAM_WINDOW: u32 = 4 << 20;
const CONNECTION_WINDOW: u32 = 16 << 20;

/// The request every stream sends: `GET http://TARGET/PATH`.
pub(crate) fn request(target: &str, path: &str) -> anyhow::Result<Request<()>> {
    Ok(Request::get(format!("http://{target}{path}"))
        .header("user-agent", "rustle-bench")
        .body(())?)
}

/// Opens an HTTP/2 connection to the proxy (over TLS, it must have chosen
/// `h2`) and spawns its connection task.
pub(crate) async fn connect(
    plan: &Plan,
    reader: &mut Reader,
) -> Result<SendRequest<Bytes>, ErrorKind> {
    let s = dial(plan, reader).await?;
    if let Stream::Tls(tls) = &s {
        if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err(ErrorKind::Connect);
        }
    }
    let (send, conn) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .handshake(s)
        .await
        .map_err(|_| ErrorKind::Connect)?;
    tokio::task::spawn_local(async move {
        // Its end shows up on the lane's next stream as an error.
        let _ = conn.await;
    });
    Ok(send)
}

/// One stream: sends `req` with END_STREAM and reads the whole response.
/// Returns the body's bytes.
pub(crate) async fn exchange(
    send: &mut SendRequest<Bytes>,
    req: &Request<()>,
) -> Result<u64, ErrorKind> {
    let ready = std::future::poll_fn(|cx| send.poll_ready(cx));
    ready.await.map_err(|_| ErrorKind::Write)?;
    let (resp, _) = send.send_request(req.clone(), true).map_err(|_| ErrorKind::Write)?;
    let resp = resp.await.map_err(|e| kind_of(&e))?;
    let status = resp.status().as_u16();
    let length = resp
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut body = resp.into_body();
    let mut bytes = 0u64;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| kind_of(&e))?;
        bytes += chunk.len() as u64;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    if length.is_some_and(|n| n != bytes) {
        return Err(ErrorKind::Parse);
    }
    if !(200..300).contains(&status) {
        return Err(ErrorKind::BadStatus);
    }
    Ok(bytes)
}

/// A stream reset or a GOAWAY is the peer closing early; anything else is a
/// read failure (the connection broke) or malformed framing.
fn kind_of(e: &h2::Error) -> ErrorKind {
    if e.is_reset() || e.is_go_away() {
        ErrorKind::ClosedEarly
    } else if e.is_io() {
        ErrorKind::Read
    } else {
        ErrorKind::Parse
    }
}
