//! `AuthCallback`: an HTTP (or HTTPS with client certificates required) server that
//! plays the callback of rustle's `kind = "http"` auth backend. Each POSTed JSON body is
//! handed to the test's answer function; the server counts calls and connections and
//! keeps the last body and `Authorization` field. Connections are kept alive.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_rustls::TlsAcceptor;

use crate::fixture::{self, log, Fixture};

/// The answer to one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    /// Waited before answering.
    pub delay: Duration,
}

impl Reply {
    /// 200 with `body`.
    pub fn ok(body: &str) -> Reply {
        Reply { status: 200, body: body.into(), delay: Duration::ZERO }
    }

    /// `status` with an empty body.
    pub fn status(status: u16) -> Reply {
        Reply { status, body: String::new(), delay: Duration::ZERO }
    }

    /// This answer after `delay`.
    pub fn after(self, delay: Duration) -> Reply {
        Reply { delay, ..self }
    }
}

type Answer = dyn Fn(&serde_json::Value) -> Reply + Send + Sync;

#[derive(Default)]
struct Seen {
    calls: AtomicU64,
    connections: AtomicU64,
    last: Mutex<Option<(serde_json::Value, Option<String>)>>,
}

/// Files of the HTTPS variant: the CA that signed the server's certificate (trust it)
/// and a client certificate and key it signed (the server requires one).
#[derive(Debug, Clone)]
pub struct CallbackTls {
    pub ca: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// The callback server on its own thread; stops on drop (its files deleted).
pub struct AuthCallback {
    addr: SocketAddr,
    seen: Arc<Seen>,
    tls: Option<CallbackTls>,
    dir: Option<PathBuf>,
    _fixture: Fixture,
}

/// The largest request body read.
const MAX_BODY: usize = 1 << 20;

impl AuthCallback {
    /// Plain HTTP on 127.0.0.1 with an ephemeral port.
    pub fn start(
        answer: impl Fn(&serde_json::Value) -> Reply + Send + Sync + 'static,
    ) -> io::Result<AuthCallback> {
        AuthCallback::start_on(fixture::LOCALHOST_V4, answer)
    }

    /// Plain HTTP on `addr` (the address of one stopped, to start it again).
    pub fn start_on(
        addr: SocketAddr,
        answer: impl Fn(&serde_json::Value) -> Reply + Send + Sync + 'static,
    ) -> io::Result<AuthCallback> {
        AuthCallback::begin(addr, Arc::new(answer), None)
    }

    /// HTTPS on 127.0.0.1, requiring a client certificate signed by its own CA.
    pub fn start_tls(
        answer: impl Fn(&serde_json::Value) -> Reply + Send + Sync + 'static,
    ) -> io::Result<AuthCallback> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rustle-callback-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        let (files, acceptor) = mint(&dir).map_err(|e| io::Error::other(e.to_string()))?;
        let mut cb = AuthCallback::begin(fixture::LOCALHOST_V4, Arc::new(answer), Some(acceptor))?;
        cb.tls = Some(files);
        cb.dir = Some(dir);
        Ok(cb)
    }

    fn begin(
        addr: SocketAddr,
        answer: Arc<Answer>,
        tls: Option<TlsAcceptor>,
    ) -> io::Result<AuthCallback> {
        let seen = Arc::new(Seen::default());
        let seen2 = seen.clone();
        let (fixture, addr) = Fixture::spawn("auth-callback", move || {
            let listener = fixture::tcp_listener(addr)?;
            let addr = listener.local_addr()?;
            let serve = async move {
                loop {
                    let (sock, _) = match listener.accept().await {
                        Ok(s) => s,
                        Err(e) => {
                            fixture::accept_backoff(e).await;
                            continue;
                        }
                    };
                    seen2.connections.fetch_add(1, Ordering::Relaxed);
                    let (answer, seen, tls) = (answer.clone(), seen2.clone(), tls.clone());
                    tokio::spawn(async move {
                        let done = match tls {
                            Some(tls) => match tls.accept(sock).await {
                                Ok(s) => serve(s, &*answer, &seen).await,
                                Err(e) => Err(e),
                            },
                            None => serve(sock, &*answer, &seen).await,
                        };
                        if let Err(e) = done {
                            log!("auth callback: {e}");
                        }
                    });
                }
            };
            Ok((addr, serve))
        })?;
        Ok(AuthCallback { addr, seen, tls: None, dir: None, _fixture: fixture })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL to configure (`http://` or `https://` 127.0.0.1).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}/check", self.addr)
    }

    /// The HTTPS variant's files.
    pub fn tls(&self) -> Option<&CallbackTls> {
        self.tls.as_ref()
    }

    /// Requests answered (or being answered).
    pub fn calls(&self) -> u64 {
        self.seen.calls.load(Ordering::Relaxed)
    }

    /// Connections accepted.
    pub fn connections(&self) -> u64 {
        self.seen.connections.load(Ordering::Relaxed)
    }

    /// The last request's JSON body and `Authorization` field.
    pub fn last(&self) -> Option<(serde_json::Value, Option<String>)> {
        self.seen.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for AuthCallback {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Serves requests on one connection until the client closes it.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    answer: &Answer,
    seen: &Seen,
) -> io::Result<()> {
    let mut buf = Vec::new();
    loop {
        // The head.
        let (head_len, body_len, auth) = loop {
            let mut fields = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut fields);
            if let httparse::Status::Complete(n) = req.parse(&buf).map_err(io::Error::other)? {
                let field = |name: &str| {
                    req.headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .map(|h| String::from_utf8_lossy(h.value).into_owned())
                };
                let len = field("content-length").and_then(|v| v.trim().parse().ok()).unwrap_or(0);
                if len > MAX_BODY {
                    return Err(io::Error::other("body too long"));
                }
                break (n, len, field("authorization"));
            }
            if !read_more(&mut s, &mut buf).await? {
                return Ok(());
            }
        };
        while buf.len() < head_len + body_len {
            if !read_more(&mut s, &mut buf).await? {
                return Ok(());
            }
        }
        let body: serde_json::Value =
            serde_json::from_slice(&buf[head_len..head_len + body_len]).unwrap_or_default();
        buf.drain(..head_len + body_len);
        seen.calls.fetch_add(1, Ordering::Relaxed);
        let reply = answer(&body);
        *seen.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((body, auth));
        tokio::time::sleep(reply.delay).await;
        let head = format!(
            "HTTP/1.1 {} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            reply.status,
            reply.body.len()
        );
        s.write_all(head.as_bytes()).await?;
        s.write_all(reply.body.as_bytes()).await?;
        s.flush().await?;
    }
}

async fn read_more<S: AsyncRead + Unpin>(s: &mut S, buf: &mut Vec<u8>) -> io::Result<bool> {
    let mut chunk = [0u8; 8192];
    let n = s.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n > 0)
}

/// A CA, a server certificate for 127.0.0.1 and localhost, a client certificate; the
/// acceptor requires a client certificate from that CA.
fn mint(
    dir: &std::path::Path,
) -> Result<(CallbackTls, TlsAcceptor), Box<dyn std::error::Error + Send + Sync>> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "rustle-bench callback CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate()?;
    let ca = ca_params.self_signed(&ca_key)?;

    let server_key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".into()])?;
    params.distinguished_name.push(DnType::CommonName, "127.0.0.1");
    let server = params.signed_by(&server_key, &ca, &ca_key)?;

    let client_key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, "rustle");
    let client = params.signed_by(&client_key, &ca, &ca_key)?;

    let files = CallbackTls {
        ca: dir.join("ca.pem"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client.key"),
    };
    std::fs::write(&files.ca, ca.pem())?;
    std::fs::write(&files.client_cert, client.pem())?;
    std::fs::write(&files.client_key, client_key.serialize_pem())?;

    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone())?;
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()?;
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![server.der().clone(), CertificateDer::from(ca.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
        )?;
    Ok((files, TlsAcceptor::from(Arc::new(config))))
}
