//! TLS groundwork: certificates and keys from PEM files, rustls server configs that choose a
//! certificate by SNI, and self-signed sets for `rustle cert --self-signed`.
//!
//! rustls with the aws-lc-rs provider, always named explicitly (never the process default),
//! so that a test binary that also links `ring` cannot make the builders panic.

mod accept;
mod der;
mod setup;

pub(crate) use accept::{accept, Accepted};

pub(crate) use setup::{
    acceptor, cert_user, connect_over, connector, ktls, remembering_connector, roots_from,
    server_name, set_ktls, system_roots, Acceptor, Refusals, Session,
};

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

/// Why a certificate chain and key could not be loaded. Each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CertError {
    #[error("{}: cannot read: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{}: bad PEM: {reason}", path.display())]
    Pem { path: PathBuf, reason: String },
    #[error("{}: no certificate (-----BEGIN CERTIFICATE-----) in the file", path.display())]
    NoCertificate { path: PathBuf },
    #[error(
        "{}: no private key (PKCS#8 `PRIVATE KEY`, PKCS#1 `RSA PRIVATE KEY` or SEC1 \
         `EC PRIVATE KEY`) in the file",
        path.display()
    )]
    NoKey { path: PathBuf },
    #[error("{}: the first certificate cannot be parsed: {reason}", path.display())]
    BadCertificate { path: PathBuf, reason: String },
    #[error("{}: unusable private key: {reason}", path.display())]
    BadKey { path: PathBuf, reason: String },
    #[error(
        "{}: the private key does not match the certificate in {}",
        key.display(),
        cert.display()
    )]
    KeyMismatch { key: PathBuf, cert: PathBuf },
    #[error("{}: the certificate expired at {not_after}", path.display())]
    Expired { path: PathBuf, not_after: String },
    #[error("{}: the certificate is not yet valid (valid from {not_before})", path.display())]
    NotYetValid { path: PathBuf, not_before: String },
}

/// The provider every config here is built with.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Loads a PEM certificate chain (leaf first, RSA or ECDSA) and its PEM private key
/// (PKCS#8, PKCS#1 or SEC1), checking that the key matches the leaf and that the leaf is
/// valid now.
pub(crate) fn load_certified_key(
    chain_pem: &Path,
    key_pem: &Path,
) -> Result<CertifiedKey, CertError> {
    let chain_bytes = read(chain_pem)?;
    let key_bytes = read(key_pem)?;
    let pem_err = |path: &Path| {
        let path = path.to_path_buf();
        move |e: rustls::pki_types::pem::Error| CertError::Pem { path, reason: e.to_string() }
    };
    let chain = CertificateDer::pem_slice_iter(&chain_bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_err(chain_pem))?;
    let Some(leaf) = chain.first() else {
        return Err(CertError::NoCertificate { path: chain_pem.to_path_buf() });
    };
    let info = der::parse(leaf).map_err(|reason| CertError::BadCertificate {
        path: chain_pem.to_path_buf(),
        reason: reason.to_string(),
    })?;
    check_validity(chain_pem, &info, unix_now())?;

    let key = match PrivateKeyDer::from_pem_slice(&key_bytes) {
        Ok(key) => key,
        Err(rustls::pki_types::pem::Error::NoItemsFound) => {
            return Err(CertError::NoKey { path: key_pem.to_path_buf() })
        }
        Err(e) => return Err(pem_err(key_pem)(e)),
    };
    let signing_key = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| CertError::BadKey { path: key_pem.to_path_buf(), reason: e.to_string() })?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        // aws-lc-rs keys always know their public key; `Unknown` would mean they cannot be
        // compared, which is not a mismatch.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(certified)
        }
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(CertError::KeyMismatch {
                key: key_pem.to_path_buf(),
                cert: chain_pem.to_path_buf(),
            })
        }
        Err(e) => {
            Err(CertError::BadCertificate { path: chain_pem.to_path_buf(), reason: e.to_string() })
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, CertError> {
    std::fs::read(path).map_err(|source| CertError::Read { path: path.to_path_buf(), source })
}

fn unix_now() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

fn check_validity(path: &Path, info: &der::CertInfo, now: i64) -> Result<(), CertError> {
    if now > info.not_after.unix {
        return Err(CertError::Expired {
            path: path.to_path_buf(),
            not_after: info.not_after.to_string(),
        });
    }
    if now < info.not_before.unix {
        return Err(CertError::NotYetValid {
            path: path.to_path_buf(),
            not_before: info.not_before.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
/// A server config for TLS 1.2 and 1.3 with session tickets, choosing among `certs` by the
/// client's server name: an exact name, then a `*.suffix` wildcard, then the default.
///
/// Each entry is `(names, key)`: `Some("a.example, *.b.example")` (comma- or space-separated)
/// registers those names first; `None` makes the entry the default (the first `None` wins).
/// Every entry's certificate also contributes its own subjectAltName DNS names, after all
/// explicitly given names (an explicit name always beats a certificate's name; among
/// certificates, the earlier entry wins). A client without SNI (or with an unknown name)
/// gets the default; with no default it is refused.
pub(crate) fn server_config(
    certs: Vec<(Option<String>, CertifiedKey)>,
    alpn: &[&[u8]],
) -> Arc<ServerConfig> {
    server_config_with(certs, alpn, None)
}

/// `server_config`, verifying client certificates with `verifier` when given.
pub(crate) fn server_config_with(
    certs: Vec<(Option<String>, CertifiedKey)>,
    alpn: &[&[u8]],
    verifier: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
) -> Arc<ServerConfig> {
    let resolver = SniResolver::new(certs);
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        // Cannot fail: the aws-lc-rs provider has suites for both versions and rustls's
        // `tls12` feature is on (default features); a failure would be a build mistake.
        .expect("aws-lc-rs supports TLS 1.2 and 1.3");
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config.enable_secret_extraction = ktls();
    match rustls::crypto::aws_lc_rs::Ticketer::new() {
        Ok(ticketer) => config.ticketer = ticketer,
        // Only fails if the system RNG does; resumption then uses the session cache alone.
        Err(e) => tracing::warn!("tls: session tickets off: {e}"),
    }
    Arc::new(config)
}

/// Chooses a certificate by SNI: exact name, then one-label wildcard, then the default.
pub(crate) struct SniResolver {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// `*.example.com` is stored under `example.com`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    default: Option<Arc<CertifiedKey>>,
}

impl SniResolver {
    pub(crate) fn new(certs: Vec<(Option<String>, CertifiedKey)>) -> SniResolver {
        let mut resolver =
            SniResolver { exact: HashMap::new(), wildcard: HashMap::new(), default: None };
        let certs: Vec<(Option<String>, Arc<CertifiedKey>)> =
            certs.into_iter().map(|(names, key)| (names, Arc::new(key))).collect();
        for (names, key) in &certs {
            match names {
                Some(names) => {
                    for name in names.split([',', ' ']).filter(|n| !n.is_empty()) {
                        resolver.add(name, key);
                    }
                }
                None => {
                    resolver.default.get_or_insert_with(|| Arc::clone(key));
                }
            }
        }
        for (_, key) in &certs {
            let names = key.end_entity_cert().ok().and_then(|leaf| der::parse(leaf).ok());
            for name in names.map(|info| info.dns_names).unwrap_or_default() {
                resolver.add(&name, key);
            }
        }
        resolver
    }

    fn add(&mut self, name: &str, key: &Arc<CertifiedKey>) {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let (map, name) = match name.strip_prefix("*.") {
            Some(suffix) => (&mut self.wildcard, suffix.to_string()),
            None => (&mut self.exact, name),
        };
        map.entry(name).or_insert_with(|| Arc::clone(key));
    }

    /// The certificate for `server_name` (`None`: no SNI).
    pub(crate) fn choose(&self, server_name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        if let Some(name) = server_name {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            if let Some(key) = self.exact.get(&name) {
                return Some(Arc::clone(key));
            }
            if let Some((_, suffix)) = name.split_once('.') {
                if let Some(key) = self.wildcard.get(suffix) {
                    return Some(Arc::clone(key));
                }
            }
        }
        self.default.clone()
    }
}

impl fmt::Debug for SniResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SniResolver")
            .field("exact", &self.exact.keys().collect::<Vec<_>>())
            .field("wildcard", &self.wildcard.keys().collect::<Vec<_>>())
            .field("default", &self.default.is_some())
            .finish()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.choose(client_hello.server_name())
    }
}

/// The files `write_self_signed` wrote.
#[derive(Debug, Clone)]
pub struct SelfSignedFiles {
    /// The fresh CA certificate to trust.
    pub ca: PathBuf,
    /// The chain: leaf, then the CA.
    pub chain: PathBuf,
    /// The leaf's private key (PKCS#8), mode 0600 on Unix.
    pub key: PathBuf,
}

/// Writes `dir/ca.pem` (a fresh CA, whose key is not kept), `dir/NAME.pem` (leaf + CA) and
/// `dir/NAME.key` for `name` (a DNS name, a `*.` wildcard, or an IP address), all ECDSA
/// P-256. Creates `dir` if needed; refuses to overwrite any of the three files.
pub fn write_self_signed(name: &str, dir: &Path) -> io::Result<SelfSignedFiles> {
    if name.is_empty() || name.starts_with('.') || name.contains(['/', '\\', '\0']) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{name}` is not a host name"),
        ));
    }
    let (ca_pem, chain_pem, key_pem) = mint(name)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("`{name}`: {e}")))?;
    std::fs::create_dir_all(dir)?;
    let files = SelfSignedFiles {
        ca: dir.join("ca.pem"),
        chain: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}.key")),
    };
    for path in [&files.ca, &files.chain, &files.key] {
        if path.exists() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} already exists; remove it or choose another directory", path.display()),
            ));
        }
    }
    write_new(&files.key, key_pem.as_bytes(), 0o600)?;
    write_new(&files.chain, chain_pem.as_bytes(), 0o644)?;
    write_new(&files.ca, ca_pem.as_bytes(), 0o644)?;
    Ok(files)
}

/// (CA PEM, chain PEM, leaf key PEM) for `name`.
fn mint(name: &str) -> Result<(String, String, String), rcgen::Error> {
    mint_with(name, |_| {})
}

/// As `mint`, letting the caller adjust the leaf's parameters (tests: validity).
fn mint_with(
    name: &str,
    adjust: impl FnOnce(&mut CertificateParams),
) -> Result<(String, String, String), rcgen::Error> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    // A random tag keeps two CAs minted for the same name apart: verifiers find issuers
    // by name, and two CAs with one name make them report bad signatures, not unknown CAs.
    let mut tag = [0u8; 4];
    provider().secure_random.fill(&mut tag).map_err(|_| rcgen::Error::RingUnspecified)?;
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("rustle self-signed CA {tag} for {name}"));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    // From a day ago (clock skew); the CA for ten years, the leaf for 820 days (macOS and
    // iOS refuse server certificates valid for more than 825 days, even from a private CA).
    let since_epoch = |days: i64| {
        let secs = unix_now().saturating_add(days * 86_400).max(0);
        rcgen::date_time_ymd(1970, 1, 1) + std::time::Duration::from_secs(secs.unsigned_abs())
    };
    ca_params.not_before = since_epoch(-1);
    ca_params.not_after = since_epoch(3650);
    let ca_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let ca = ca_params.self_signed(&ca_key)?;

    // `new` makes an IP-address SAN when the name parses as one, a DNS SAN otherwise.
    let mut leaf_params = CertificateParams::new(vec![name.to_string()])?;
    leaf_params.distinguished_name.push(DnType::CommonName, name);
    leaf_params.use_authority_key_identifier_extension = true;
    leaf_params.not_before = since_epoch(-1);
    leaf_params.not_after = since_epoch(820);
    adjust(&mut leaf_params);
    let leaf_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key)?;
    let ca_pem = ca.pem();
    Ok((ca_pem.clone(), format!("{}{ca_pem}", leaf.pem()), leaf_key.serialize_pem()))
}

fn write_new(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    file.write_all(contents)?;
    file.sync_all()
}

#[cfg(test)]
mod tests;
