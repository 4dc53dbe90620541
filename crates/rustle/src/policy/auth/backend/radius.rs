//! The radius backend: Access-Request to the `servers` in order (PAP or CHAP, signed with a
//! Message-Authenticator, and replies required to carry one), Access-Accept read into a
//! `Grant`, and the accounting of the sessions it accepted (Accounting-Request Start,
//! Interim-Update, Stop). Each call has its own UDP socket per server, so responses are
//! matched by the socket, then by identifier and authenticator; a server that gives no
//! answer is passed over for `DEAD_TIME` (asked last, not never).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use argon2::password_hash::rand_core::{OsRng, RngCore};
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;

use super::{valid_group, AcctKind, AcctRecord, Ask, Failure, Grant, Verdict};
use crate::config::{RadiusAttribute, RadiusBackend, RadiusMethod};

mod packet;

use packet::{kind, Builder};

/// How long a server that gave no answer is asked only after the others: long enough
/// that a dead server does not cost every login a timeout, short enough that a restarted
/// one is back within a minute.
const DEAD_TIME: Duration = Duration::from_secs(30);

/// The shortest wait for one answer, however many sends `timeout` is shared among: a
/// loopback or LAN server answers in well under this.
const MIN_WAIT: Duration = Duration::from_millis(100);

/// NAS-Port-Type Virtual (RFC 2865 5.41): a proxy has no physical ports.
const PORT_VIRTUAL: u32 = 5;

/// Boxed: one `Backend` enum holds every kind, and this one is the largest.
pub(crate) struct Radius(Box<Inner>);

pub(crate) struct Inner {
    name: String,
    auth: Box<[Server]>,
    acct: Box<[Server]>,
    /// Never logged.
    secret: Box<[u8]>,
    nas_identifier: String,
    nas_ip: Option<IpAddr>,
    method: RadiusMethod,
    retries: u32,
    timeout: Duration,
    accounting: bool,
    group: RadiusAttribute,
    bandwidth: Option<RadiusAttribute>,
    /// Access-Accept, -Reject and -Challenge without a Message-Authenticator are dropped.
    require_signature: bool,
    /// `max_in_flight` checks: one over it is refused at once.
    slots: Semaphore,
    /// `max_in_flight` accounting records, apart from the checks' so that accounting
    /// servers that do not answer never hold a login back: a record waits its turn.
    acct_slots: Semaphore,
    next_id: AtomicU8,
    /// The origin of the servers' `down_until`.
    epoch: Instant,
}

impl std::ops::Deref for Radius {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.0
    }
}

struct Server {
    addr: String,
    /// Milliseconds after `epoch` until which the server counts as down (0: up).
    down_until: AtomicU64,
}

impl Radius {
    pub(crate) fn new(cfg: &RadiusBackend) -> Result<Radius, String> {
        // The chain names the backend in front of these messages.
        let name = cfg.common().name;
        let problems = cfg.problems();
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        let secret = read_secret(&cfg.secret_file)?;
        let servers = |list: &[String]| -> Box<[Server]> {
            list.iter().map(|a| Server { addr: a.clone(), down_until: AtomicU64::new(0) }).collect()
        };
        // Checked by `problems`.
        let group = RadiusAttribute::parse(&cfg.group_attribute)?;
        let bandwidth =
            cfg.bandwidth_attribute.as_deref().map(RadiusAttribute::parse).transpose()?;
        // A random first identifier, so that a restarted proxy does not repeat its last
        // requests' identifiers to a server that may still hold them; 0 without randomness.
        let mut first_id = [0u8; 1];
        let _ = OsRng.try_fill_bytes(&mut first_id);
        Ok(Radius(Box::new(Inner {
            auth: servers(&cfg.servers),
            acct: servers(&cfg.accounting_servers()),
            secret,
            nas_identifier: cfg.nas_identifier.clone(),
            nas_ip: cfg.nas_ip_address,
            method: cfg.method,
            retries: cfg.retries,
            timeout: cfg.timeout,
            accounting: cfg.accounting,
            group,
            bandwidth,
            require_signature: cfg.require_message_authenticator,
            slots: Semaphore::new(cfg.max_in_flight),
            acct_slots: Semaphore::new(cfg.max_in_flight),
            next_id: AtomicU8::new(first_id[0]),
            epoch: Instant::now(),
            name,
        })))
    }

    /// Asks the servers about `ask`'s name and password: Access-Accept is `Allow`,
    /// Access-Reject `Deny` (RADIUS does not tell an unknown user from a wrong password),
    /// Access-Challenge `Deny` too (a proxy has no way to put the challenge to its client).
    pub(crate) async fn check(&self, ask: &Ask) -> Result<Verdict, Failure> {
        let _permit = self.slots.try_acquire().map_err(|_| Failure::Overloaded)?;
        let pap = self.method == RadiusMethod::Pap;
        if ask.user.is_empty() || ask.user.len() > 253 || (pap && ask.password.len() > 128) {
            tracing::info!(
                "auth: radius `{}`: {:?} refused without a call: a user name of 1 to 253 bytes and a PAP password of at most 128 are all RADIUS carries",
                self.name,
                ask.user
            );
            return Ok(Verdict::Deny);
        }
        match tokio::time::timeout(self.timeout, self.access(ask)).await {
            Ok(v) => v,
            Err(_) => Err(Failure::Timeout),
        }
    }

    async fn access(&self, ask: &Ask) -> Result<Verdict, Failure> {
        let (reply, request) = self.exchange(&self.auth, |id| self.access_request(ask, id)).await?;
        let reply = packet::check_response(&reply, &request, &self.secret)
            .map_err(|e| Failure::Protocol(e.to_string()))?;
        match reply.code {
            packet::ACCESS_ACCEPT => {
                // The account known under another spelling (case, a realm): limits kept
                // per user name would not hold it, so the name as presented is refused.
                let other = reply
                    .attributes()
                    .find(|(k, v)| *k == kind::USER_NAME && *v != ask.user.as_bytes());
                if let Some((_, name)) = other {
                    tracing::info!(
                        "auth: radius `{}`: {:?} refused: the server accepts it as {:?}, and only the name as the server knows it is let in",
                        self.name,
                        ask.user,
                        String::from_utf8_lossy(name)
                    );
                    return Ok(Verdict::Deny);
                }
                Ok(Verdict::Allow(self.grant(&reply)?))
            }
            packet::ACCESS_REJECT => Ok(Verdict::Deny),
            packet::ACCESS_CHALLENGE => {
                tracing::info!(
                    "auth: radius `{}`: {:?} refused: the server asks a challenge, which a proxy cannot put to its client",
                    self.name,
                    ask.user
                );
                Ok(Verdict::Deny)
            }
            code => Err(Failure::Protocol(format!(
                "radius answered an Access-Request with code {code}"
            ))),
        }
    }

    fn access_request(&self, ask: &Ask, id: u8) -> Result<Vec<u8>, Failure> {
        let mut random = [0u8; 33];
        OsRng
            .try_fill_bytes(&mut random)
            .map_err(|e| Failure::Protocol(format!("no randomness from the OS: {e}")))?;
        let mut authenticator = [0u8; 16];
        authenticator.copy_from_slice(&random[..16]);
        let mut b = Builder::new(packet::ACCESS_REQUEST, id, authenticator);
        let built = (|| {
            b.sign()?;
            b.add(kind::USER_NAME, ask.user.as_bytes())?;
            match self.method {
                RadiusMethod::Pap => b.add_password(&ask.password, &self.secret)?,
                RadiusMethod::Chap => {
                    let challenge = &random[16..32];
                    b.add(
                        kind::CHAP_PASSWORD,
                        &packet::chap_password(random[32], &ask.password, challenge),
                    )?;
                    b.add(kind::CHAP_CHALLENGE, challenge)?;
                }
            }
            self.add_nas(&mut b, ask.client)?;
            if let Some(target) = ask.target.as_deref().filter(|t| !t.is_empty() && t.len() <= 253)
            {
                b.add(kind::CALLED_STATION_ID, target.as_bytes())?;
            }
            Ok::<(), packet::Error>(())
        })();
        built.map_err(|e| Failure::Protocol(e.to_string()))?;
        Ok(b.finish_access(&self.secret))
    }

    /// What every request says of the NAS and the client.
    fn add_nas(&self, b: &mut Builder, client: IpAddr) -> Result<(), packet::Error> {
        b.add(kind::NAS_IDENTIFIER, self.nas_identifier.as_bytes())?;
        match self.nas_ip {
            Some(IpAddr::V4(a)) => b.add(kind::NAS_IP_ADDRESS, &a.octets())?,
            Some(IpAddr::V6(a)) => b.add(kind::NAS_IPV6_ADDRESS, &a.octets())?,
            None => {}
        }
        b.add_u32(kind::NAS_PORT_TYPE, PORT_VIRTUAL)?;
        b.add(kind::CALLING_STATION_ID, client.to_string().as_bytes())
    }

    /// An Access-Accept's attributes, as far as rustle has a use for them; a group that is
    /// no group name (see `valid_group`) is a failure, as the callback's.
    fn grant(&self, reply: &packet::Response<'_>) -> Result<Grant, Failure> {
        let mut grant = Grant::default();
        for (k, v) in reply.attributes() {
            match k {
                kind::FRAMED_IP_ADDRESS => {
                    // 255.255.255.254 and .255 mean "the NAS picks": no address of ours.
                    if let Ok(o) = <[u8; 4]>::try_from(v) {
                        let a = Ipv4Addr::from(o);
                        if o[..3] != [255, 255, 255] && !a.is_unspecified() {
                            grant.egress = Some(IpAddr::V4(a));
                        }
                    }
                }
                kind::SESSION_TIMEOUT => {
                    if let Some(s) = be_u32(v).filter(|s| *s > 0) {
                        grant.ttl = Some(Duration::from_secs(s.into()));
                    }
                }
                kind::CLASS if grant.class.is_none() => grant.class = Some(v.to_vec()),
                _ => {}
            }
            for (attribute, value) in flatten(k, v) {
                if attribute == self.group {
                    let g = std::str::from_utf8(value).ok().filter(|g| valid_group(g)).ok_or_else(
                        || {
                            Failure::Protocol(format!(
                                "radius reply: group {:?} is not a group name",
                                String::from_utf8_lossy(value)
                            ))
                        },
                    )?;
                    if !grant.groups.iter().any(|have| have == g) {
                        grant.groups.push(g.to_string());
                    }
                }
                if Some(attribute) == self.bandwidth {
                    if let Some(bits) = number(value).filter(|b| *b > 0) {
                        grant.bandwidth = Some((bits / 8).max(1));
                    }
                }
            }
        }
        Ok(grant)
    }

    /// Sends one accounting record (Accounting-Request) and waits for its response, to the
    /// accounting servers in order. Waits, within `timeout`, for one of its own
    /// `max_in_flight` slots (not the checks').
    pub(crate) async fn account(&self, rec: &AcctRecord) -> Result<(), Failure> {
        if !self.accounting {
            return Ok(());
        }
        let call = async {
            let _permit = self
                .acct_slots
                .acquire()
                .await
                .map_err(|_| Failure::Unreachable("the backend is closed".into()))?;
            let (reply, request) =
                self.exchange(&self.acct, |id| self.accounting_request(rec, id)).await?;
            let reply = packet::check_response(&reply, &request, &self.secret)
                .map_err(|e| Failure::Protocol(e.to_string()))?;
            match reply.code {
                packet::ACCOUNTING_RESPONSE => Ok(()),
                code => Err(Failure::Protocol(format!(
                    "radius answered an Accounting-Request with code {code}"
                ))),
            }
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(Failure::Timeout),
        }
    }

    fn accounting_request(&self, rec: &AcctRecord, id: u8) -> Result<Vec<u8>, Failure> {
        let mut b = Builder::new(packet::ACCOUNTING_REQUEST, id, [0; 16]);
        let status = match rec.kind {
            AcctKind::Start => 1,
            AcctKind::Stop => 2,
            AcctKind::Interim => 3,
        };
        let built = (|| {
            b.add_u32(kind::ACCT_STATUS_TYPE, status)?;
            b.add(kind::ACCT_SESSION_ID, rec.session_id.as_bytes())?;
            b.add(kind::USER_NAME, rec.user.as_bytes())?;
            // Acct-Authentic RADIUS: the user was authenticated by this server.
            b.add_u32(kind::ACCT_AUTHENTIC, 1)?;
            self.add_nas(&mut b, rec.client)?;
            if let Some(class) = rec.class.as_deref().filter(|c| !c.is_empty()) {
                b.add(kind::CLASS, class)?;
            }
            if rec.kind != AcctKind::Start {
                let (in_giga, in_octets) = split_octets(rec.bytes_in);
                let (out_giga, out_octets) = split_octets(rec.bytes_out);
                b.add_u32(kind::ACCT_INPUT_OCTETS, in_octets)?;
                b.add_u32(kind::ACCT_OUTPUT_OCTETS, out_octets)?;
                if in_giga > 0 {
                    b.add_u32(kind::ACCT_INPUT_GIGAWORDS, in_giga)?;
                }
                if out_giga > 0 {
                    b.add_u32(kind::ACCT_OUTPUT_GIGAWORDS, out_giga)?;
                }
                b.add_u32(kind::ACCT_SESSION_TIME, rec.secs)?;
            }
            if rec.kind == AcctKind::Stop {
                // User-Request: the client closed or the proxy ended the connection.
                b.add_u32(kind::ACCT_TERMINATE_CAUSE, 1)?;
            }
            Ok::<(), packet::Error>(())
        })();
        built
            .map_err(|e| Failure::Protocol(format!("accounting record of {:?}: {e}", rec.user)))?;
        Ok(b.finish_accounting(&self.secret))
    }

    /// Sends what `build` writes (with a fresh identifier per server) to each server in
    /// turn, up servers first, each `retries` more times on no answer; the response (checked
    /// by its authenticator) and the request it answers.
    async fn exchange(
        &self,
        servers: &[Server],
        build: impl Fn(u8) -> Result<Vec<u8>, Failure>,
    ) -> Result<(Vec<u8>, Vec<u8>), Failure> {
        let now = self.millis();
        let (up, down): (Vec<&Server>, Vec<&Server>) =
            servers.iter().partition(|s| s.down_until.load(Ordering::Relaxed) <= now);
        let sends = servers.len() as u32 * (self.retries + 1);
        let wait = (self.timeout / sends.max(1)).max(MIN_WAIT);
        let mut last = String::new();
        for server in up.into_iter().chain(down) {
            let request = build(self.next_id.fetch_add(1, Ordering::Relaxed))?;
            match self.ask_one(server, &request, wait).await {
                Ok(reply) => {
                    if server.down_until.swap(0, Ordering::Relaxed) != 0 {
                        tracing::info!(
                            "auth: radius `{}`: server {} answers again",
                            self.name,
                            server.addr
                        );
                    }
                    return Ok((reply, request));
                }
                Err(e) => {
                    // Once when it stops answering, not at every call while it is down.
                    if server.down_until.load(Ordering::Relaxed) == 0 {
                        tracing::warn!(
                            "auth: radius `{}`: server {} gives no answer ({e}); asked last for {}s",
                            self.name,
                            server.addr,
                            DEAD_TIME.as_secs()
                        );
                    }
                    let until = self.millis() + DEAD_TIME.as_millis() as u64;
                    server.down_until.store(until, Ordering::Relaxed);
                    last = format!("{}: {e}", server.addr);
                }
            }
        }
        Err(Failure::Unreachable(format!("no radius server answered (last {last})")))
    }

    /// One server: `request` sent `retries + 1` times, each followed by a wait for an
    /// authentic answer; packets that are not one are dropped.
    async fn ask_one(
        &self,
        server: &Server,
        request: &[u8],
        wait: Duration,
    ) -> Result<Vec<u8>, String> {
        let addr = tokio::net::lookup_host(server.addr.as_str())
            .await
            .map_err(|e| format!("cannot resolve: {e}"))?
            .next()
            .ok_or("resolves to no address")?;
        let local: SocketAddr = match addr {
            SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let socket = UdpSocket::bind(local).await.map_err(|e| e.to_string())?;
        socket.connect(addr).await.map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; packet::MAX_PACKET];
        for _ in 0..=self.retries {
            socket.send(request).await.map_err(|e| e.to_string())?;
            let until = tokio::time::Instant::now() + wait;
            loop {
                match tokio::time::timeout_at(until, socket.recv(&mut buf)).await {
                    Err(_) => break,
                    // Connection refused: nothing listens there.
                    Ok(Err(e)) => return Err(e.to_string()),
                    Ok(Ok(n)) => match packet::check_response(&buf[..n], request, &self.secret) {
                        Ok(r) if self.require_signature && !r.signed && is_access_reply(r.code) => {
                            tracing::warn!(
                                "auth: radius `{}`: a reply from {} dropped: it has no Message-Authenticator (require_message_authenticator; BlastRADIUS)",
                                self.name,
                                server.addr
                            )
                        }
                        Ok(_) => {
                            buf.truncate(n);
                            return Ok(buf);
                        }
                        Err(e) => tracing::warn!(
                            "auth: radius `{}`: a packet from {} dropped: {e}",
                            self.name,
                            server.addr
                        ),
                    },
                }
            }
        }
        Err(format!("no answer to {} sends", self.retries + 1))
    }

    fn millis(&self) -> u64 {
        // Past 0 so that 0 stays "up".
        self.epoch.elapsed().as_millis() as u64 + 1
    }
}

/// The first line of `path`, the shared secret (the error never quotes the file).
fn read_secret(path: &Path) -> Result<Box<[u8]>, String> {
    let text = std::fs::read(path).map_err(|e| format!("secret_file {}: {e}", path.display()))?;
    let line = text.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return Err(format!("secret_file {}: its first line is empty", path.display()));
    }
    Ok(line.into())
}

/// An attribute as the settings name it: itself, or each sub-attribute of a
/// Vendor-Specific one.
fn flatten(k: u8, v: &[u8]) -> Vec<(RadiusAttribute, &[u8])> {
    if k == kind::VENDOR_SPECIFIC {
        packet::vendor_attributes(v)
            .map(|(vendor, kind, value)| (RadiusAttribute::Vendor { vendor, kind }, value))
            .collect()
    } else {
        vec![(RadiusAttribute::Standard(k), v)]
    }
}

/// Access-Accept, -Reject, -Challenge: the replies a forger gains by (BlastRADIUS).
fn is_access_reply(code: u8) -> bool {
    matches!(code, packet::ACCESS_ACCEPT | packet::ACCESS_REJECT | packet::ACCESS_CHALLENGE)
}

fn be_u32(v: &[u8]) -> Option<u32> {
    <[u8; 4]>::try_from(v).ok().map(u32::from_be_bytes)
}

/// A number as RADIUS servers write one: 4 or 8 bytes big-endian, or decimal text.
fn number(v: &[u8]) -> Option<u64> {
    match v.len() {
        4 => be_u32(v).map(u64::from),
        8 => <[u8; 8]>::try_from(v).ok().map(u64::from_be_bytes),
        _ => std::str::from_utf8(v).ok()?.trim().parse().ok(),
    }
}

/// Octets as (Gigawords, the low 32 bits) (RFC 2869 5.1).
fn split_octets(n: u64) -> (u32, u32) {
    ((n >> 32) as u32, n as u32)
}

#[cfg(test)]
mod tests;
