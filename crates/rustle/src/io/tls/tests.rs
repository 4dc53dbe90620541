use super::*;

use std::sync::atomic::{AtomicUsize, Ordering};

use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// A fresh, empty directory under the system temp dir; removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("rustle-tls-{}-{label}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn self_signed(name: &str, label: &str) -> (TempDir, SelfSignedFiles, CertifiedKey) {
    let dir = TempDir::new(label);
    let files = write_self_signed(name, &dir.0).expect("write_self_signed");
    let key = load_certified_key(&files.chain, &files.key).expect("load_certified_key");
    (dir, files, key)
}

fn leaf(key: &CertifiedKey) -> Vec<u8> {
    key.end_entity_cert().expect("leaf").to_vec()
}

fn trusting(ca: &Path, versions: &[&'static rustls::SupportedProtocolVersion]) -> ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("ca.pem") {
        roots.add(cert.expect("ca cert")).expect("add root");
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

fn accept_any() -> ClientConfig {
    let provider = provider();
    ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(setup::NoVerification(provider)))
        .with_no_client_auth()
}

struct Handshake {
    leaf: Vec<u8>,
    alpn: Option<Vec<u8>>,
    version: Option<rustls::ProtocolVersion>,
}

/// One TLS connection over loopback: the server echoes one byte back.
async fn handshake(
    server: Arc<ServerConfig>,
    client: ClientConfig,
    name: &str,
) -> Result<Handshake, io::Error> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let acceptor = tokio_rustls::TlsAcceptor::from(server);
    let server_task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await?;
        let mut tls = acceptor.accept(tcp).await?;
        let mut byte = [0u8; 1];
        tls.read_exact(&mut byte).await?;
        tls.write_all(&byte).await?;
        tls.shutdown().await?;
        Ok::<_, io::Error>(())
    });
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let server_name = ServerName::try_from(name.to_string()).map_err(io::Error::other)?;
    let tcp = TcpStream::connect(addr).await?;
    let result = async {
        let mut tls = connector.connect(server_name, tcp).await?;
        tls.write_all(b"x").await?;
        let mut byte = [0u8; 1];
        tls.read_exact(&mut byte).await?;
        assert_eq!(&byte, b"x");
        let (_, conn) = tls.get_ref();
        Ok(Handshake {
            leaf: conn.peer_certificates().expect("peer certs")[0].to_vec(),
            alpn: conn.alpn_protocol().map(<[u8]>::to_vec),
            version: conn.protocol_version(),
        })
    }
    .await;
    if result.is_ok() {
        server_task.await.expect("server task")?;
    } else {
        server_task.abort();
    }
    result
}

#[tokio::test]
async fn tls_round_trip_self_signed_with_sni_and_default() {
    let (_d1, files, named) = self_signed("rustle.test", "named");
    let (_d2, _, default) = self_signed("default.test", "default");
    assert_eq!(files.ca.file_name().and_then(|n| n.to_str()), Some("ca.pem"));
    assert_eq!(files.chain.file_name().and_then(|n| n.to_str()), Some("rustle.test.pem"));
    assert_eq!(files.key.file_name().and_then(|n| n.to_str()), Some("rustle.test.key"));
    assert_eq!(named.cert.len(), 2, "chain is leaf + CA");
    let info = der::parse(&leaf(&named)).expect("parse leaf");
    let lifetime = info.not_after.unix - info.not_before.unix;
    assert_eq!(lifetime, 821 * 86_400, "a day back, 820 days ahead");
    assert_eq!(info.dns_names, ["rustle.test"]);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&files.key).expect("key metadata").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let (named_leaf, default_leaf) = (leaf(&named), leaf(&default));
    let server = server_config(
        vec![(Some("rustle.test".into()), named), (None, default)],
        &[b"h2", b"http/1.1"],
    );

    // A verifying client trusting ca.pem, TLS 1.3 then TLS 1.2.
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let client = trusting(&files.ca, &[version]);
        let hs = handshake(Arc::clone(&server), client, "rustle.test").await.expect("handshake");
        assert_eq!(hs.leaf, named_leaf);
        assert_eq!(hs.alpn.as_deref(), Some(&b"http/1.1"[..]));
        assert_eq!(hs.version, Some(version.version));
    }

    // Another name gets the default certificate...
    let hs =
        handshake(Arc::clone(&server), accept_any(), "elsewhere.test").await.expect("handshake");
    assert_eq!(hs.leaf, default_leaf);
    // ...which a verifying client rejects for that name.
    let client = trusting(&files.ca, &[&rustls::version::TLS13]);
    assert!(handshake(server, client, "elsewhere.test").await.is_err());
}

#[tokio::test]
async fn tls_self_signed_ip_address() {
    let (_d, files, key) = self_signed("127.0.0.1", "ip");
    let expected = leaf(&key);
    // Clients send no SNI for an IP address: the default certificate answers.
    let server = server_config(vec![(None, key)], &[]);
    let client = trusting(&files.ca, &[&rustls::version::TLS13]);
    let hs = handshake(server, client, "127.0.0.1").await.expect("handshake");
    assert_eq!(hs.leaf, expected);
    assert_eq!(hs.alpn, None);
}

#[tokio::test]
async fn tls_sni_wildcard_exact_default() {
    let (_d1, wild_files, wild) = self_signed("*.wild.test", "wild");
    let (_d2, _, exact) = self_signed("host.wild.test", "exact");
    let (_d3, _, alias) = self_signed("alias-cert.test", "alias");
    let (_d4, _, default) = self_signed("default.test", "default");
    let leaves = [leaf(&wild), leaf(&exact), leaf(&alias), leaf(&default)];
    let certs = vec![
        (Some(String::new()), wild),
        (Some(String::new()), exact),
        (Some("Alias.Test, other-alias.test".into()), alias),
        (None, default),
    ];
    let resolver = SniResolver::new(certs.iter().map(|(n, k)| (n.clone(), k.clone())).collect());
    let chosen = |name: Option<&str>| resolver.choose(name).map(|k| leaf(&k));
    assert_eq!(chosen(Some("a.wild.test")), Some(leaves[0].clone()));
    assert_eq!(chosen(Some("A.Wild.Test.")), Some(leaves[0].clone()));
    assert_eq!(chosen(Some("host.wild.test")), Some(leaves[1].clone()), "exact beats wildcard");
    assert_eq!(chosen(Some("a.b.wild.test")), Some(leaves[3].clone()), "one label only");
    assert_eq!(chosen(Some("wild.test")), Some(leaves[3].clone()));
    assert_eq!(chosen(Some("alias.test")), Some(leaves[2].clone()));
    assert_eq!(chosen(Some("other-alias.test")), Some(leaves[2].clone()));
    assert_eq!(chosen(Some("alias-cert.test")), Some(leaves[2].clone()), "the certificate's name");
    assert_eq!(chosen(Some("default.test")), Some(leaves[3].clone()));
    assert_eq!(chosen(None), Some(leaves[3].clone()));
    assert_eq!(chosen(Some("nowhere.test")), Some(leaves[3].clone()));
    let no_default = SniResolver::new(certs[..1].to_vec());
    assert!(no_default.choose(Some("nowhere.test")).is_none());
    assert!(no_default.choose(None).is_none());

    // Over the wire, a verifying client accepts the wildcard certificate.
    let server = server_config(certs, &[b"http/1.1"]);
    let client = trusting(&wild_files.ca, &[&rustls::version::TLS13]);
    let hs = handshake(server, client, "x.wild.test").await.expect("handshake");
    assert_eq!(hs.leaf, leaves[0]);
}

#[test]
fn tls_mismatched_key() {
    let (_d1, a, _) = self_signed("a.test", "a");
    let (_d2, b, _) = self_signed("b.test", "b");
    let err = load_certified_key(&a.chain, &b.key).expect_err("mismatch");
    assert!(matches!(err, CertError::KeyMismatch { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("does not match"), "{msg}");
    assert!(msg.contains(&*a.chain.to_string_lossy()), "{msg}");
    assert!(msg.contains(&*b.key.to_string_lossy()), "{msg}");
}

#[test]
fn tls_missing_file() {
    let (d, files, _) = self_signed("a.test", "missing");
    let missing = d.0.join("nope.pem");
    let err = load_certified_key(&missing, &files.key).expect_err("missing chain");
    assert!(matches!(err, CertError::Read { .. }), "{err:?}");
    assert!(err.to_string().contains(&*missing.to_string_lossy()), "{err}");
    let err = load_certified_key(&files.chain, &missing).expect_err("missing key");
    assert!(matches!(err, CertError::Read { ref path, .. } if *path == missing), "{err:?}");
}

#[test]
fn tls_no_certificate_no_key() {
    let (_d, files, _) = self_signed("a.test", "swapped");
    let err = load_certified_key(&files.key, &files.key).expect_err("no certificate");
    assert!(matches!(err, CertError::NoCertificate { ref path } if *path == files.key), "{err:?}");
    assert!(err.to_string().contains("no certificate"), "{err}");
    let err = load_certified_key(&files.chain, &files.chain).expect_err("no key");
    assert!(matches!(err, CertError::NoKey { ref path } if *path == files.chain), "{err:?}");
    assert!(err.to_string().contains("no private key"), "{err}");
}

fn write_minted(dir: &TempDir, adjust: impl FnOnce(&mut CertificateParams)) -> (PathBuf, PathBuf) {
    let (_, chain, key) = mint_with("dated.test", adjust).expect("mint");
    std::fs::create_dir_all(&dir.0).expect("mkdir");
    let (chain_path, key_path) = (dir.0.join("dated.pem"), dir.0.join("dated.key"));
    std::fs::write(&chain_path, chain).expect("write chain");
    std::fs::write(&key_path, key).expect("write key");
    (chain_path, key_path)
}

#[test]
fn tls_expired_certificate() {
    let dir = TempDir::new("expired");
    let (chain, key) = write_minted(&dir, |p| {
        p.not_before = rcgen::date_time_ymd(1999, 1, 1);
        p.not_after = rcgen::date_time_ymd(2000, 1, 1);
    });
    let err = load_certified_key(&chain, &key).expect_err("expired");
    assert!(matches!(err, CertError::Expired { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("expired at 2000-01-01 00:00:00 UTC"), "{msg}");
    assert!(msg.contains(&*chain.to_string_lossy()), "{msg}");
}

#[test]
fn tls_not_yet_valid_certificate() {
    let dir = TempDir::new("future");
    let (chain, key) = write_minted(&dir, |p| {
        p.not_before = rcgen::date_time_ymd(2990, 6, 1);
        p.not_after = rcgen::date_time_ymd(2991, 1, 1);
    });
    let err = load_certified_key(&chain, &key).expect_err("not yet valid");
    assert!(matches!(err, CertError::NotYetValid { .. }), "{err:?}");
    assert!(
        err.to_string().contains("not yet valid (valid from 2990-06-01 00:00:00 UTC)"),
        "{err}"
    );
}

#[test]
fn tls_write_self_signed_refuses_overwrite_and_bad_names() {
    let (d, _, _) = self_signed("a.test", "overwrite");
    let err = write_self_signed("a.test", &d.0).expect_err("exists");
    assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
    let err = write_self_signed("b.test", &d.0).expect_err("ca.pem exists");
    assert!(err.to_string().contains("ca.pem"), "{err}");
    for bad in ["", "../x", "a/b", ".hidden"] {
        let err = write_self_signed(bad, &d.0).expect_err(bad);
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad}");
    }
}
