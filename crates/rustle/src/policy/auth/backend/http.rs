//! The http backend: each check is a POST of JSON to a callback URL, whose answer says
//! allow (with groups, egress address, limits, a lifetime), deny, or "not mine" (404).
//!
//! The client is reqwest (one per backend, its connections kept alive between calls),
//! on a rustls config of our own: the process's aws-lc-rs provider, `ca` or the system's
//! roots, an optional client certificate. Every call, waiting for a slot included, is
//! bounded by `timeout`; at most `max_in_flight` run at once, the others wait for a slot
//! within that same time and fail as "too many calls in flight" when none frees.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use reqwest::{StatusCode, Url};
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::time::{timeout_at, Instant};

use super::{Ask, Failure, Grant, Verdict};
use crate::config::{parse_rate, HttpBackend};
use crate::io::tls::{load_certified_key, provider, roots_from, system_roots};

/// The largest answer read: a verdict with a few hundred groups fits many times over; a
/// callback that sends more is broken, and the proxy must not buffer it.
const MAX_BODY: usize = 64 * 1024;

/// How long an idle connection to the callback is kept for the next call.
const IDLE: Duration = Duration::from_secs(60);

pub(crate) struct Http {
    client: reqwest::Client,
    url: Url,
    send_target: bool,
    timeout: Duration,
    slots: Semaphore,
    /// Boxed: most backends have none, and `Backend`'s variants stay alike in size.
    token: Option<Box<Token>>,
    /// How long a token read from `token_file` is used before the file is read again.
    token_refresh: Duration,
}

/// `token_file`'s `Authorization` value and when it was read.
struct Token {
    path: PathBuf,
    value: Mutex<(HeaderValue, Instant)>,
}

/// How long a token is used before `token_file` is read again: a token rotated in the
/// file is in use within this time, without a reload (a reload that leaves the backend's
/// settings as they were keeps the backend, and so its token, as it was).
const TOKEN_REFRESH: Duration = Duration::from_secs(60);

/// The request body.
#[derive(Serialize)]
struct Request<'a> {
    user: &'a str,
    password: &'a str,
    client: IpAddr,
    listener: &'a str,
    protocol: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<&'a str>,
}

/// The body of a 200 answer. Fields it does not know are ignored (a callback may say more
/// than rustle reads).
#[derive(Deserialize)]
struct Answer {
    allow: bool,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    egress: Option<IpAddr>,
    #[serde(default)]
    max_connections: Option<u32>,
    #[serde(default)]
    bandwidth: Option<Rate>,
    /// Seconds.
    #[serde(default)]
    ttl: Option<u64>,
}

/// `bandwidth`: bytes a second, or a rate as the configuration writes it (`"10MB"`).
#[derive(Deserialize)]
#[serde(untagged)]
enum Rate {
    Bytes(u64),
    Text(String),
}

impl Http {
    /// Builds the client: reads `ca`, the client certificate and key, and `token_file`.
    pub(crate) fn new(cfg: &HttpBackend) -> Result<Http, String> {
        let problems = cfg.problems();
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        let url = Url::parse(&cfg.url).map_err(|e| format!("url: {e}"))?;
        if url.host_str().is_none() {
            return Err("url: no host".into());
        }
        let mut headers = HeaderMap::new();
        for (name, value) in &cfg.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("headers: {name:?} is not a field name"))?;
            let mut value = HeaderValue::from_str(value)
                .map_err(|_| format!("headers: the value of {name:?} is not a field value"))?;
            // Kept out of reqwest's Debug output and HPACK tables: it may be a key.
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let token = match &cfg.token_file {
            Some(path) => Some(Box::new(Token {
                value: Mutex::new((read_token(path)?, Instant::now())),
                path: path.clone(),
            })),
            None => None,
        };
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(tls(cfg, url.scheme() == "https")?)
            .default_headers(headers)
            .user_agent(concat!("rustle/", env!("CARGO_PKG_VERSION")))
            // The callback is asked directly: never through HTTP_PROXY and the like.
            .no_proxy()
            // A redirect is an answer of its own (a failure), never followed with the
            // password.
            .redirect(reqwest::redirect::Policy::none())
            .http1_only()
            .tcp_nodelay(true)
            .pool_idle_timeout(IDLE)
            .pool_max_idle_per_host(cfg.max_in_flight)
            .build()
            .map_err(|e| format!("http client: {}", chain(&e)))?;
        Ok(Http {
            client,
            url,
            send_target: cfg.send_target,
            timeout: cfg.timeout,
            slots: Semaphore::new(cfg.max_in_flight),
            token,
            token_refresh: TOKEN_REFRESH,
        })
    }

    /// Asks the callback about `ask`.
    pub(crate) async fn check(&self, ask: &Ask) -> Result<Verdict, Failure> {
        // JSON carries text: a password that is not UTF-8 cannot be told to the callback
        // (a lossy conversion would make different passwords equal), so it is refused.
        let Ok(password) = std::str::from_utf8(&ask.password) else {
            return Ok(Verdict::Deny);
        };
        let deadline = Instant::now() + self.timeout;
        let _slot = match timeout_at(deadline, self.slots.acquire()).await {
            Ok(Ok(slot)) => slot,
            // The semaphore is never closed.
            Ok(Err(_)) | Err(_) => return Err(Failure::Overloaded),
        };
        let body = Request {
            user: &ask.user,
            password,
            client: ask.client,
            listener: &ask.listener,
            protocol: ask.protocol,
            target: ask.target.as_deref().filter(|_| self.send_target),
        };
        let mut request = self.client.post(self.url.clone()).json(&body);
        if let Some(token) = &self.token {
            request = request.header(AUTHORIZATION, self.token_value(token));
        }
        let call = async {
            let mut response = request.send().await.map_err(failure)?;
            let status = response.status();
            match status {
                StatusCode::OK => {}
                StatusCode::FORBIDDEN => return Ok(Verdict::Deny),
                StatusCode::NOT_FOUND => return Ok(Verdict::Unknown),
                other => return Err(Failure::Protocol(format!("callback answered {other}"))),
            }
            if response.content_length().is_some_and(|n| n > MAX_BODY as u64) {
                return Err(too_long());
            }
            let mut bytes = Vec::new();
            while let Some(chunk) = response.chunk().await.map_err(failure)? {
                if bytes.len() + chunk.len() > MAX_BODY {
                    return Err(too_long());
                }
                bytes.extend_from_slice(&chunk);
            }
            verdict(&bytes)
        };
        timeout_at(deadline, call).await.unwrap_or(Err(Failure::Timeout))
    }
}

impl Http {
    /// The token's `Authorization` value, read again from its file once it is older than
    /// `token_refresh` (a file that cannot be read then keeps the token in use).
    fn token_value(&self, token: &Token) -> HeaderValue {
        let mut value = token.value.lock().unwrap_or_else(PoisonError::into_inner);
        if value.1.elapsed() >= self.token_refresh {
            match read_token(&token.path) {
                Ok(fresh) => value.0 = fresh,
                // Never the content: only the file and why.
                Err(e) => tracing::warn!("auth backend: {e}; the token read before stays in use"),
            }
            value.1 = Instant::now();
        }
        value.0.clone()
    }
}

/// `Bearer <the file's content, trimmed>`, marked sensitive.
fn read_token(path: &Path) -> Result<HeaderValue, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("token_file {}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("token_file {}: empty", path.display()));
    }
    let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
        format!("token_file {}: not usable in a header (one line of text)", path.display())
    })?;
    // Kept out of reqwest's Debug output: it is a secret.
    value.set_sensitive(true);
    Ok(value)
}

fn too_long() -> Failure {
    Failure::Protocol(format!("callback answer longer than {MAX_BODY} bytes"))
}

/// The verdict of a 200 answer's body.
fn verdict(body: &[u8]) -> Result<Verdict, Failure> {
    let answer: Answer = serde_json::from_slice(body)
        .map_err(|e| Failure::Protocol(format!("callback answer: {e}")))?;
    if !answer.allow {
        return Ok(Verdict::Deny);
    }
    for g in &answer.groups {
        if !super::valid_group(g) {
            return Err(Failure::Protocol(format!(
                "callback answer: group {g:?} is not a group name"
            )));
        }
    }
    let bandwidth = match answer.bandwidth {
        None => None,
        Some(Rate::Bytes(0)) => {
            return Err(Failure::Protocol(
                "callback answer: bandwidth 0 (leave it out for none)".into(),
            ))
        }
        Some(Rate::Bytes(n)) => Some(n),
        Some(Rate::Text(t)) => Some(
            parse_rate(&t)
                .map_err(|e| Failure::Protocol(format!("callback answer: bandwidth: {e}")))?,
        ),
    };
    Ok(Verdict::Allow(Grant {
        groups: answer.groups,
        egress: answer.egress,
        max_connections: answer.max_connections,
        bandwidth,
        ttl: answer.ttl.map(Duration::from_secs),
        class: None,
    }))
}

/// A failed call as a `Failure`, with its causes and without the URL (it may carry
/// credentials).
fn failure(e: reqwest::Error) -> Failure {
    // A connection or TLS handshake that failed: the callback was not reached.
    let unreachable = e.is_connect();
    let text = chain(&e.without_url());
    if unreachable {
        Failure::Unreachable(text)
    } else {
        Failure::Protocol(text)
    }
}

/// An error and its causes, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

/// The TLS config of the client: `ca` or the system's roots, the client certificate.
/// A plain `http://` callback gets an empty one (reqwest wants one; it is never used).
fn tls(cfg: &HttpBackend, https: bool) -> Result<ClientConfig, String> {
    let roots = match (&cfg.ca, https) {
        (_, false) => RootCertStore::empty(),
        (Some(ca), true) => roots_from(ca).map_err(|e| format!("ca: {e}"))?,
        (None, true) => system_roots()
            .map_err(|_| "no system CA certificates found (install ca-certificates, or set ca)")?,
    };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let mut config = match (&cfg.client_cert, &cfg.client_key) {
        (Some(cert), Some(key)) => {
            let key = load_certified_key(cert, key).map_err(|e| format!("client_cert: {e}"))?;
            builder.with_client_cert_resolver(Arc::new(Identity(Arc::new(key))))
        }
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The one client certificate, offered to the callback whatever it asks.
#[derive(Debug)]
struct Identity(Arc<CertifiedKey>);

impl ResolvesClientCert for Identity {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
