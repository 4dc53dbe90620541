//! rustls configurations from the configuration file's TLS sections: what a listener
//! accepts (certificates by SNI, optional client certificates) and what a relay
//! originates (roots, server name, resumption). Built with the policy, so a SIGHUP reloads
//! certificates and a `rustle check` reports their problems.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, CommonState, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::{der, load_certified_key, provider, server_config_with};
use crate::config::{CertUser, ClientCerts, ConnectTls, ListenTls, UnknownSni};
use crate::io::conn::Stream;

/// What a TLS listener accepts.
pub(crate) struct Acceptor {
    pub(crate) config: Arc<rustls::ServerConfig>,
    /// How a verified client certificate names its user (`None`: it does not).
    pub(crate) client_user: CertUser,
}

/// Builds a listener's server config. `alpn`: the protocols the listener speaks, in order
/// of preference (the HTTPS port's; a relay's come from the file).
pub(crate) fn acceptor(t: &ListenTls, alpn: &[&[u8]]) -> Result<Acceptor, String> {
    let mut certs = Vec::new();
    let default = load_certified_key(&t.cert, &t.key).map_err(|e| e.to_string())?;
    // A refused unknown name means the first pair is chosen only by its own names.
    let default_names = match t.unknown_sni {
        UnknownSni::Default => None,
        UnknownSni::Refuse => Some(String::new()),
    };
    certs.push((default_names, default));
    for more in &t.more {
        let key = load_certified_key(&more.cert, &more.key).map_err(|e| e.to_string())?;
        certs.push((Some(more.names.clone().unwrap_or_default()), key));
    }
    let verifier = match (&t.client_ca, t.client_certs) {
        (_, ClientCerts::None) => None,
        (None, _) => {
            return Err("tls.client_certs needs tls.client_ca (the CA client certificates \
                        must chain to)"
                .into())
        }
        (Some(ca), how) => {
            let roots = roots_from(ca)?;
            let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
            let builder = match how {
                ClientCerts::Optional => builder.allow_unauthenticated(),
                _ => builder,
            };
            Some(builder.build().map_err(|e| format!("{}: {e}", ca.display()))?)
        }
    };
    let own: Vec<Vec<u8>> = t.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    let own: Vec<&[u8]> = own.iter().map(Vec::as_slice).collect();
    let alpn = if own.is_empty() { alpn } else { &own };
    let client_user =
        if t.client_certs == ClientCerts::None { CertUser::None } else { t.client_user };
    Ok(Acceptor { config: server_config_with(certs, alpn, verifier), client_user })
}

/// Builds the client config of a TLS-originating relay. One per listener, shared by its
/// connections, so its session cache lets later connections resume.
pub(crate) fn connector(t: &ConnectTls) -> Result<Arc<ClientConfig>, String> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?;
    let mut config = if t.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider())))
            .with_no_client_auth()
    } else {
        let roots = match &t.ca {
            Some(ca) => roots_from(ca)?,
            None => system_roots()?,
        };
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    config.alpn_protocols = t.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    config.enable_secret_extraction = ktls();
    config.resumption = rustls::client::Resumption::store(Arc::new(Tickets::default()));
    Ok(Arc::new(config))
}

/// Servers whose sessions the ticket store keeps (the least recently stored go first).
const TICKET_SERVERS: usize = 1024;

/// TLS 1.3 tickets kept per server. rustls's own store keeps 8, and each ticket is used
/// once: 64 connections opening at once then resume 8 times and do 56 full handshakes
/// (far fewer resumed than through nginx, haproxy and stunnel, which reuse one session;
/// BENCHMARKS.md). Servers send a ticket or two per handshake, so a deep store
/// fills during the first burst and stays full.
const TICKETS_PER_SERVER: usize = 256;

/// The client session store of originating connections: rustls's rules (a ticket is used
/// at most once), a deeper store per server.
#[derive(Debug, Default)]
struct Tickets {
    servers: std::sync::Mutex<std::collections::HashMap<ServerName<'static>, Saved>>,
}

#[derive(Debug, Default)]
struct Saved {
    kx_hint: Option<rustls::NamedGroup>,
    tls12: Option<rustls::client::Tls12ClientSessionValue>,
    tls13: std::collections::VecDeque<rustls::client::Tls13ClientSessionValue>,
    /// When this entry last changed, for eviction.
    stamp: u64,
}

impl Tickets {
    fn with<R>(&self, name: ServerName<'static>, f: impl FnOnce(&mut Saved) -> R) -> R {
        let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        if servers.len() >= TICKET_SERVERS && !servers.contains_key(&name) {
            let oldest = servers.iter().min_by_key(|(_, s)| s.stamp).map(|(n, _)| n.clone());
            if let Some(oldest) = oldest {
                servers.remove(&oldest);
            }
        }
        let stamp = servers.values().map(|s| s.stamp).max().unwrap_or(0) + 1;
        let saved = servers.entry(name).or_default();
        saved.stamp = stamp;
        f(saved)
    }

    fn get<R>(&self, name: &ServerName<'_>, f: impl FnOnce(&mut Saved) -> R) -> Option<R> {
        let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        // Owned for the lookup: the map's keys are 'static (a few bytes per handshake).
        servers.get_mut(&name.to_owned()).map(f)
    }
}

impl rustls::client::ClientSessionStore for Tickets {
    fn set_kx_hint(&self, name: ServerName<'static>, group: rustls::NamedGroup) {
        self.with(name, |s| s.kx_hint = Some(group));
    }

    fn kx_hint(&self, name: &ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.get(name, |s| s.kx_hint).flatten()
    }

    fn set_tls12_session(
        &self,
        name: ServerName<'static>,
        value: rustls::client::Tls12ClientSessionValue,
    ) {
        self.with(name, |s| s.tls12 = Some(value));
    }

    fn tls12_session(
        &self,
        name: &ServerName<'_>,
    ) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.get(name, |s| s.tls12.clone()).flatten()
    }

    fn remove_tls12_session(&self, name: &ServerName<'static>) {
        self.get(name, |s| s.tls12 = None);
    }

    fn insert_tls13_ticket(
        &self,
        name: ServerName<'static>,
        value: rustls::client::Tls13ClientSessionValue,
    ) {
        self.with(name, |s| {
            if s.tls13.len() >= TICKETS_PER_SERVER {
                s.tls13.pop_front();
            }
            s.tls13.push_back(value);
        });
    }

    fn take_tls13_ticket(
        &self,
        name: &ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        // The newest first: it has the most lifetime left.
        self.get(name, |s| s.tls13.pop_back()).flatten()
    }
}

/// Kernel TLS is on for this process: asked for (`ktls = "auto"`) and the probe found the
/// kernel's `tls` module. Set once at start, before any TLS config is built.
static KTLS: AtomicBool = AtomicBool::new(false);

pub(crate) fn set_ktls(on: bool) {
    KTLS.store(on, Ordering::Relaxed);
}

/// Whether finished handshakes are handed to the kernel.
pub(crate) fn ktls() -> bool {
    KTLS.load(Ordering::Relaxed)
}

/// The client side of a handshake towards an upstream, within `timeout`; with kernel TLS
/// on, the session then goes to the kernel. The error says what failed (verification
/// errors name what they found).
pub(crate) async fn connect(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    tcp: TcpStream,
    timeout: Duration,
) -> Result<Stream, String> {
    let connector = tokio_rustls::TlsConnector::from(config);
    let handshake = async {
        #[cfg(feature = "ktls")]
        if ktls() {
            let tls = connector.connect(name, ktls::CorkStream::new(tcp)).await?;
            let kernel = ktls::config_ktls_client(tls).await.map_err(io::Error::other)?;
            return Ok::<_, io::Error>(Stream::Kernel(Box::new(kernel)));
        }
        let tls = connector.connect(name, tcp).await?;
        Ok::<_, io::Error>(Stream::Client(Box::new(tls)))
    };
    match tokio::time::timeout(timeout, handshake).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the handshake timed out".into()),
    }
}

/// `connect` over any stream: plain TCP as `connect` does (kernel TLS when on), anything
/// else (a tunnel through a TLS connection to a parent proxy) with TLS nested inside it.
pub(crate) async fn connect_over(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    stream: Stream,
    timeout: Duration,
) -> Result<Stream, String> {
    let stream = match stream {
        Stream::Tcp(tcp) => return connect(config, name, tcp, timeout).await,
        other => other,
    };
    let connector = tokio_rustls::TlsConnector::from(config);
    match tokio::time::timeout(timeout, connector.connect(name, stream)).await {
        Ok(Ok(s)) => Ok(Stream::Nested(Box::new(s))),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the handshake timed out".into()),
    }
}

/// The name to send and verify: the configured one, else the target's host.
pub(crate) fn server_name(t: &ConnectTls, host: &str) -> Result<ServerName<'static>, String> {
    let name = t.server_name.as_deref().unwrap_or(host);
    ServerName::try_from(name.to_string()).map_err(|_| format!("`{name}` is not a server name"))
}

/// The CA certificates of a PEM file, as roots.
pub(crate) fn roots_from(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    for cert in certs {
        roots.add(cert).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("{}: no CA certificate in the file", path.display()));
    }
    Ok(roots)
}

/// What the system trusts (ca-certificates).
pub(crate) fn system_roots() -> Result<RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(
            "no system CA certificates found (install ca-certificates, or set target_tls.ca)"
                .into(),
        );
    }
    Ok(roots)
}

/// `insecure = true`: any certificate is accepted, but handshake signatures are still
/// checked, so the session is at least with the holder of the key presented. (Tests use it
/// to see which certificate a server chose for a name it does not cover.)
#[derive(Debug)]
pub(super) struct NoVerification(pub(super) Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A verifying client config (roots from `ca`, else the system's) whose verifier keeps
/// the reason of its last refusal (`Refusals`), for a caller that only learns that a
/// connection failed (hickory says "no connections available" of a DNS server whose
/// certificate it refused).
pub(crate) fn remembering_connector(
    ca: Option<&Path>,
) -> Result<(Arc<ClientConfig>, Arc<Refusals>), String> {
    let roots = match ca {
        Some(ca) => roots_from(ca)?,
        None => system_roots()?,
    };
    let inner =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| e.to_string())?;
    let refusals = Arc::new(Refusals { inner, last: std::sync::Mutex::new(None) });
    let config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(refusals.clone())
        .with_no_client_auth();
    Ok((Arc::new(config), refusals))
}

/// rustls's verifier, remembering why it last refused a certificate.
#[derive(Debug)]
pub(crate) struct Refusals {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    last: std::sync::Mutex<Option<String>>,
}

impl Refusals {
    /// Why the last certificate seen was refused, if it was (taken: said once).
    pub(crate) fn take(&self) -> Option<String> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl ServerCertVerifier for Refusals {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verdict = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        // (A handshake, not a lookup: connections to a server are kept and reused.)
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        *last = match &verdict {
            Err(e) => Some(format!("the certificate of {} is refused: {e}", server_name.to_str())),
            // A server that verifies again: an older refusal would explain nothing now.
            Ok(_) => None,
        };
        verdict
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// What the access log says about a client's TLS session.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub(crate) version: &'static str,
    pub(crate) cipher: &'static str,
    pub(crate) sni: Option<Box<str>>,
    /// The handshake resumed an earlier session.
    pub(crate) resumed: bool,
}

impl Session {
    pub(crate) fn of(state: &CommonState, sni: Option<&str>) -> Session {
        let version = state.protocol_version().and_then(|v| v.as_str()).unwrap_or("-");
        let cipher =
            state.negotiated_cipher_suite().and_then(|s| s.suite().as_str()).unwrap_or("-");
        let resumed = state.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
        Session { version, cipher, sni: sni.map(Box::from), resumed }
    }
}

/// The user a verified client certificate names, if the listener maps certificates to
/// users.
pub(crate) fn cert_user(state: &CommonState, how: CertUser) -> Option<String> {
    if how == CertUser::None {
        return None;
    }
    let leaf = state.peer_certificates()?.first()?;
    der::parse(leaf).ok()?.user(how)
}
