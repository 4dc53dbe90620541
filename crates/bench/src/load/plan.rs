//! Everything a run needs, prepared once before the first connection: the
//! resolved addresses, the hop to dial, and the request bytes every lane
//! sends unchanged (shared read-only across threads, so the hot path never
//! formats or allocates a request).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::time::Instant;
use tokio_rustls::TlsConnector;

use super::{Mode, Options};
use crate::pattern;

/// Fixed `Sec-WebSocket-Key` (RFC 6455's example): the load generator
/// measures echo throughput, not key freshness, and a constant key lets the
/// expected accept value be a constant too.
pub(crate) const WS_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
/// `accept_key(WS_KEY)`, checked by a unit test.
pub(crate) const WS_ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

/// How a lane reaches the place it speaks HTTP to.
pub(crate) enum Hop {
    /// Plain TCP to this address (origin, HTTP proxy or relay).
    Direct(SocketAddr),
    /// TCP to the proxy, then this pre-built CONNECT request.
    Connect { proxy: SocketAddr, request: Box<[u8]> },
    /// TCP to the proxy, the greeting (no-auth, or with `auth` the RFC 1929
    /// user/password message to send once the proxy picks that method), then
    /// this pre-built request.
    Socks5 { proxy: SocketAddr, auth: Option<Box<[u8]>>, request: Box<[u8]> },
    /// TLS to a TLS-terminating relay or an HTTP proxy's TLS port.
    Tls { proxy: SocketAddr, connector: TlsConnector, name: ServerName<'static> },
}

pub(crate) struct Plan {
    pub(crate) hop: Hop,
    /// The HTTP request (or the WebSocket upgrade request), body included.
    pub(crate) request: Box<[u8]>,
    /// HTTP/2 modes: the request each stream sends.
    pub(crate) h2_request: Option<http::Request<()>>,
    /// WebSocket message size, in ws mode.
    pub(crate) ws_size: Option<usize>,
    pub(crate) close: bool,
    pub(crate) timeout: Duration,
    pub(crate) rate: Option<f64>,
    /// Lanes sharing `rate` (for the open-loop schedule).
    pub(crate) connections: usize,
    pub(crate) seed: u64,
    /// Start of the run, end of the warmup, and when sending stops.
    pub(crate) t0: Instant,
    pub(crate) warm_end: Instant,
    pub(crate) end: Instant,
    /// Hold mode: connections set up at once per thread.
    pub(crate) setup: usize,
    /// `--count`: requests still to send, shared by every lane of every thread.
    pub(crate) tickets: Option<AtomicU64>,
}

/// With `--count` the run ends when its requests are answered, not at a time: the
/// deadline is put this far away.
const NO_DEADLINE: Duration = Duration::from_secs(365 * 24 * 3600);

impl Plan {
    pub(crate) fn new(o: &Options, connections: usize) -> Result<Plan> {
        let (host, port) = split_host_port(&o.target)?;
        let proxy = match &o.proxy {
            Some(p) => Some(resolve(p)?),
            None if o.mode == Mode::Ws || o.mode == Mode::Direct => None,
            None => bail!("--mode {} needs --proxy", o.mode.name()),
        };
        let hop = match (o.mode, proxy) {
            (Mode::Direct, _) | (Mode::Ws, None) => Hop::Direct(resolve(&o.target)?),
            (Mode::Connect, Some(proxy)) => {
                let t = &o.target;
                let auth = proxy_authorization(o);
                let request = format!("CONNECT {t} HTTP/1.1\r\nHost: {t}\r\n{auth}\r\n");
                Hop::Connect { proxy, request: request.into_bytes().into() }
            }
            (Mode::Socks5, Some(proxy)) => {
                let auth = match &o.proxy_user {
                    Some(cred) => Some(socks5_auth(cred)?.into()),
                    None => None,
                };
                Hop::Socks5 { proxy, auth, request: socks5_request(&host, port)?.into() }
            }
            (Mode::HttpsRelay | Mode::HttpsProxy | Mode::H2Tls, Some(proxy)) => {
                let connector = tls_connector(o)?;
                let sni = match &o.sni {
                    Some(s) => s.clone(),
                    None => split_host_port(o.proxy.as_deref().unwrap_or_default())?.0,
                };
                let name = ServerName::try_from(sni.clone())
                    .with_context(|| format!("bad TLS server name {sni:?}"))?;
                Hop::Tls { proxy, connector, name }
            }
            (_, Some(proxy)) => Hop::Direct(proxy),
            (_, None) => bail!("--mode {} needs --proxy", o.mode.name()),
        };
        let absolute = matches!(o.mode, Mode::HttpProxy | Mode::HttpsProxy)
            || (o.mode == Mode::Ws && proxy.is_some());
        let request =
            if o.mode == Mode::Ws { ws_upgrade(o, absolute) } else { http_request(o, absolute) };
        let now = Instant::now();
        let warmup = if o.hold.is_some() || o.count.is_some() { Duration::ZERO } else { o.warmup };
        let duration = if o.count.is_some() { NO_DEADLINE } else { o.duration };
        Ok(Plan {
            hop,
            request: request.into(),
            h2_request: if o.mode.is_h2() {
                Some(super::h2::request(&o.target, effective_path(o))?)
            } else {
                None
            },
            ws_size: (o.mode == Mode::Ws).then_some(o.size),
            close: o.close,
            timeout: o.timeout,
            rate: o.rate,
            connections,
            seed: o.seed,
            t0: now,
            warm_end: now + warmup,
            end: now + warmup + duration,
            tickets: o.count.map(AtomicU64::new),
            setup: o.setup,
        })
    }

    /// Whether a lane may send one more request: always before the deadline, except that
    /// with `--count` each request takes one of the run's tickets and none is left after
    /// the last.
    pub(crate) fn take_ticket(&self) -> bool {
        match &self.tickets {
            None => true,
            Some(t) => {
                t.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok()
            }
        }
    }
}

/// The path actually requested: `--path`, else `/sha256` for uploads.
pub(crate) fn effective_path(o: &Options) -> &str {
    match &o.path {
        Some(p) => p,
        None if o.upload > 0 => "/sha256",
        None if o.mode == Mode::Ws => "/ws",
        None => "/bytes/1024",
    }
}

fn request_target(o: &Options, absolute: bool) -> String {
    let path = effective_path(o);
    if absolute {
        format!("http://{}{}", o.target, path)
    } else {
        path.to_string()
    }
}

/// The `Proxy-Authorization` line for `--proxy-user`, or nothing.
fn proxy_authorization(o: &Options) -> String {
    use base64::Engine as _;
    match &o.proxy_user {
        Some(cred) => format!(
            "Proxy-Authorization: Basic {}\r\n",
            base64::engine::general_purpose::STANDARD.encode(cred)
        ),
        None => String::new(),
    }
}

fn http_request(o: &Options, absolute: bool) -> Vec<u8> {
    let method = if o.upload > 0 { "POST" } else { "GET" };
    let mut head =
        format!("{method} {} HTTP/1.1\r\nHost: {}\r\n", request_target(o, absolute), o.target);
    head.push_str("User-Agent: rustle-bench\r\n");
    if absolute {
        head.push_str(&proxy_authorization(o));
    }
    if o.close {
        head.push_str("Connection: close\r\n");
    }
    if o.upload > 0 {
        head.push_str(&format!(
            "Content-Type: application/octet-stream\r\nContent-Length: {}\r\n",
            o.upload
        ));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&pattern::pattern(o.upload));
    bytes
}

fn ws_upgrade(o: &Options, absolute: bool) -> Vec<u8> {
    let auth = if absolute { proxy_authorization(o) } else { String::new() };
    format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: rustle-bench\r\n{auth}Upgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: {WS_KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n",
        request_target(o, absolute),
        o.target
    )
    .into_bytes()
}

/// `VER CMD RSV ATYP ADDR PORT` for the target: an IP literal goes as
/// IPv4/IPv6, anything else as a domain name for the proxy to resolve.
fn socks5_request(host: &str, port: u16) -> Result<Vec<u8>> {
    let mut r = vec![5, 1, 0];
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => {
            r.push(1);
            r.extend_from_slice(&ip.octets());
        }
        Ok(IpAddr::V6(ip)) => {
            r.push(4);
            r.extend_from_slice(&ip.octets());
        }
        Err(_) => {
            let len = u8::try_from(host.len()).context("SOCKS5 domain longer than 255 bytes")?;
            r.push(3);
            r.push(len);
            r.extend_from_slice(host.as_bytes());
        }
    }
    r.extend_from_slice(&port.to_be_bytes());
    Ok(r)
}

/// The RFC 1929 message for `--proxy-user USER:PASS`: `VER ULEN UNAME PLEN PASSWD`.
fn socks5_auth(cred: &str) -> Result<Vec<u8>> {
    let Some((user, pass)) = cred.split_once(':') else {
        bail!("--proxy-user wants USER:PASS");
    };
    let mut m = vec![1];
    for field in [user, pass] {
        let len = u8::try_from(field.len()).context("SOCKS5 user or password over 255 bytes")?;
        m.push(len);
        m.extend_from_slice(field.as_bytes());
    }
    Ok(m)
}

fn tls_connector(o: &Options) -> Result<TlsConnector> {
    let Some(ca) = &o.ca else { bail!("--mode {} needs --ca FILE", o.mode.name()) };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca)
        .with_context(|| format!("reading CA file {}", ca.display()))?
    {
        roots.add(cert.context("bad certificate in CA file")?)?;
    }
    // aws-lc-rs named explicitly: the default-provider lookup panics when
    // more than one provider is compiled in.
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    if o.x25519_only {
        provider.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::X25519];
    }
    let provider = Arc::new(provider);
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let alpn: &[u8] = if o.mode == Mode::H2Tls { b"h2" } else { b"http/1.1" };
    config.alpn_protocols = vec![alpn.to_vec()];
    if o.no_resume {
        config.resumption = rustls::client::Resumption::disabled();
    }
    Ok(TlsConnector::from(Arc::new(config)))
}

/// `HOST:PORT` or `[V6]:PORT` into the bare host and the port.
pub(crate) fn split_host_port(s: &str) -> Result<(String, u16)> {
    let (host, port) = s.rsplit_once(':').with_context(|| format!("{s:?} is not HOST:PORT"))?;
    let port: u16 = port.parse().with_context(|| format!("bad port in {s:?}"))?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if host.is_empty() {
        bail!("empty host in {s:?}");
    }
    Ok((host.to_string(), port))
}

fn resolve(s: &str) -> Result<SocketAddr> {
    s.to_socket_addrs()
        .with_context(|| format!("cannot resolve {s:?}"))?
        .next()
        .with_context(|| format!("{s:?} resolves to nothing"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ws_accept_constant_matches() {
        assert_eq!(crate::ws::accept_key(WS_KEY.as_bytes()), WS_ACCEPT);
    }

    #[test]
    fn socks5_addresses() {
        assert_eq!(socks5_request("127.0.0.1", 80).unwrap(), [5, 1, 0, 1, 127, 0, 0, 1, 0, 80]);
        assert_eq!(socks5_request("::1", 1).unwrap().len(), 4 + 16 + 2);
        assert_eq!(&socks5_request("ab", 2).unwrap()[3..], [3, 2, b'a', b'b', 0, 2]);
        assert_eq!(socks5_auth("ab:c").unwrap(), [1, 2, b'a', b'b', 1, b'c']);
        assert!(socks5_auth("nocolon").is_err());
    }

    #[test]
    fn websocket_upgrades_carry_proxy_credentials() {
        let mut o = Options::new(Mode::Ws, "127.0.0.1:9");
        o.proxy_user = Some("u:p".into());
        let through_proxy = String::from_utf8(ws_upgrade(&o, true)).unwrap();
        assert!(through_proxy.contains("\r\nProxy-Authorization: Basic dTpw\r\nUpgrade:"));
        let direct = String::from_utf8(ws_upgrade(&o, false)).unwrap();
        assert!(!direct.contains("Proxy-Authorization"));
    }

    #[test]
    fn host_port() {
        assert_eq!(split_host_port("[::1]:8080").unwrap(), ("::1".to_string(), 8080));
        assert_eq!(split_host_port("example.com:1").unwrap(), ("example.com".to_string(), 1));
        assert!(split_host_port("nohost").is_err());
    }

    #[test]
    fn requests_are_prebuilt() {
        let mut o = Options::new(Mode::HttpProxy, "127.0.0.1:9");
        o.upload = 3;
        o.close = true;
        let r = http_request(&o, true);
        let want = "POST http://127.0.0.1:9/sha256 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\
            User-Agent: rustle-bench\r\nConnection: close\r\nContent-Type: application/octet-stream\r\n\
            Content-Length: 3\r\n\r\n\x00\x01\x02";
        assert_eq!(r, want.as_bytes());
    }
}
