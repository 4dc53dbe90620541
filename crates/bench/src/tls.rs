//! `TlsOrigin`: the same HTTP origin behind TLS (rustls, aws-lc-rs provider).
//!
//! At start it mints a throwaway CA and a leaf for `localhost`, `127.0.0.1`
//! and `::1` signed by it. Clients trust the CA (`ca_pem`, `ca_file`,
//! `client_config`), which works with both rustls and OpenSSL/curl; a bare
//! self-signed leaf is rejected by some verifiers.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::fixture::{self, log, Fixture};
use crate::http::{self, HttpStats};

/// A client that stalls mid-handshake must not pin a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// HTTPS origin on its own thread; stops (and deletes its CA file) on drop.
pub struct TlsOrigin {
    addr: SocketAddr,
    stats: Arc<HttpStats>,
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    ca_file: PathBuf,
    resumed: Arc<AtomicU64>,
    _fixture: Fixture,
}

/// Settings of the campaign's HTTPS origin that differ from the test fixture's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TlsOriginOptions {
    /// Accept X25519 only, as OpenSSL 3.0 clients offer: a rustls client
    /// (which also offers the X25519MLKEM768 hybrid) then does the same work.
    pub x25519_only: bool,
    /// Stateless session tickets (as most HTTPS servers issue), reusable
    /// by clients that keep one session for many connections; without them
    /// resumption uses the session cache, whose TLS 1.3 tickets work once.
    pub tickets: bool,
}

/// The aws-lc-rs provider, named explicitly: `ServerConfig::builder()` would
/// panic if another crate in the test binary also enabled `ring`.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

struct Identity {
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

fn mint() -> Result<Identity, rcgen::Error> {
    mint_for(&["localhost", "127.0.0.1", "::1"], false)
}

/// A CA and a leaf for `names`; `expired`: the leaf's validity ended yesterday.
fn mint_for(names: &[&str], expired: bool) -> Result<Identity, rcgen::Error> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // A name of its own per CA: verifiers find issuers by name.
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let ca_name = format!(
        "rustle-bench test CA {}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    ca_params.distinguished_name.push(DnType::CommonName, ca_name);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate()?;
    let ca = ca_params.self_signed(&ca_key)?;

    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut leaf_params = CertificateParams::new(names.clone())?;
    leaf_params.distinguished_name.push(DnType::CommonName, names[0].as_str());
    if expired {
        leaf_params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        leaf_params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    }
    let leaf_key = KeyPair::generate()?;
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key)?;

    Ok(Identity {
        ca_pem: ca.pem(),
        ca_der: ca.der().clone(),
        chain: vec![leaf.der().clone(), ca.der().clone()],
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
    })
}

impl TlsOrigin {
    /// Starts on 127.0.0.1 with an ephemeral port.
    pub fn start() -> io::Result<TlsOrigin> {
        TlsOrigin::start_on(fixture::LOCALHOST_V4)
    }

    /// Starts on `addr`.
    pub fn start_on(addr: SocketAddr) -> io::Result<TlsOrigin> {
        TlsOrigin::start_identity(addr, mint().map_err(other)?, TlsOriginOptions::default())
    }

    /// Starts on `addr` with `options` (the benchmark campaign's origin).
    pub fn start_with_options(
        addr: SocketAddr,
        options: TlsOriginOptions,
    ) -> io::Result<TlsOrigin> {
        TlsOrigin::start_identity(addr, mint().map_err(other)?, options)
    }

    /// Starts on 127.0.0.1 with a certificate for `names` only (the first is also its
    /// common name), expired if asked: for testing verification failures.
    pub fn start_with(names: &[&str], expired: bool) -> io::Result<TlsOrigin> {
        let id = mint_for(names, expired).map_err(other)?;
        TlsOrigin::start_identity(fixture::LOCALHOST_V4, id, TlsOriginOptions::default())
    }

    fn start_identity(
        addr: SocketAddr,
        id: Identity,
        options: TlsOriginOptions,
    ) -> io::Result<TlsOrigin> {
        let mut provider = rustls::crypto::aws_lc_rs::default_provider();
        if options.x25519_only {
            provider.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::X25519];
        }
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
            .with_safe_default_protocol_versions()
            .map_err(other)?
            .with_no_client_auth()
            .with_single_cert(id.chain, id.key)
            .map_err(other)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        if options.tickets {
            config.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new().map_err(other)?;
            config.session_storage = rustls::server::ServerSessionMemoryCache::new(4096);
        }
        let acceptor = TlsAcceptor::from(Arc::new(config));

        let stats = Arc::new(HttpStats::default());
        let served = Arc::clone(&stats);
        let resumed = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&resumed);
        let (fixture, addr) = Fixture::spawn("rustle-tls-origin", move || {
            let listener = fixture::tcp_listener(addr)?;
            let addr = listener.local_addr()?;
            Ok((addr, accept_loop(listener, acceptor, served, counted)))
        })?;
        let ca_file = write_ca_file(&id.ca_pem, addr)?;
        Ok(TlsOrigin {
            addr,
            stats,
            ca_pem: id.ca_pem,
            ca_der: id.ca_der,
            ca_file,
            resumed,
            _fixture: fixture,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://ADDR{path}` (the certificate covers 127.0.0.1 and ::1).
    pub fn url(&self, path: &str) -> String {
        format!("https://{}{}", self.addr, path)
    }

    /// PEM of the CA certificate to trust (e.g. curl `--cacert`).
    pub fn ca_pem(&self) -> String {
        self.ca_pem.clone()
    }

    /// DER of the CA certificate.
    pub fn ca_der(&self) -> CertificateDer<'static> {
        self.ca_der.clone()
    }

    /// Path of a file holding `ca_pem()`; removed when the origin is dropped.
    pub fn ca_file(&self) -> PathBuf {
        self.ca_file.clone()
    }

    /// A rustls client config (aws-lc-rs) trusting only this origin's CA.
    pub fn client_config(&self) -> io::Result<Arc<rustls::ClientConfig>> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone()).map_err(other)?;
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(other)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Arc::new(config))
    }

    /// Requests answered.
    pub fn requests(&self) -> u64 {
        self.stats.requests.load(Ordering::Relaxed)
    }

    /// TCP connections accepted (including ones whose handshake failed).
    pub fn connections(&self) -> u64 {
        self.stats.connections.load(Ordering::Relaxed)
    }

    /// Handshakes that resumed an earlier session (tickets or the session cache).
    pub fn resumed(&self) -> u64 {
        self.resumed.load(Ordering::Relaxed)
    }

    /// Complete WebSocket data messages echoed on `/ws`.
    pub fn ws_messages(&self) -> u64 {
        self.stats.ws_messages.load(Ordering::Relaxed)
    }

    /// Raw bytes of the most recent (decrypted) request head.
    pub fn last_request_head(&self) -> Vec<u8> {
        self.stats.last_head()
    }
}

impl Drop for TlsOrigin {
    fn drop(&mut self) {
        // Best effort: a leftover file in the temp dir is harmless.
        let _ = std::fs::remove_file(&self.ca_file);
    }
}

fn write_ca_file(pem: &str, addr: SocketAddr) -> io::Result<PathBuf> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "rustle-bench-ca-{}-{}-{}.pem",
        std::process::id(),
        addr.port(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let path = std::env::temp_dir().join(name);
    std::fs::write(&path, pem)?;
    Ok(path)
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    stats: Arc<HttpStats>,
    resumed: Arc<AtomicU64>,
) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                stats.connections.fetch_add(1, Ordering::Relaxed);
                let _ = stream.set_nodelay(true);
                let acceptor = acceptor.clone();
                let stats = Arc::clone(&stats);
                let resumed = Arc::clone(&resumed);
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            if tls.get_ref().1.handshake_kind()
                                == Some(rustls::HandshakeKind::Resumed)
                            {
                                resumed.fetch_add(1, Ordering::Relaxed);
                            }
                            http::serve(tls, stats).await
                        }
                        Ok(Err(e)) => log!("TLS handshake with {peer} failed: {e}"),
                        Err(_) => log!("TLS handshake with {peer} timed out"),
                    }
                });
            }
            Err(e) => fixture::accept_backoff(e).await,
        }
    }
}
