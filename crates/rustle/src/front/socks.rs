//! SOCKS4, SOCKS4a and SOCKS5 (RFC 1928, RFC 1929): the handshake as a chain of states
//! named for what they wait on, then CONNECT (a relay), BIND (one incoming connection)
//! or UDP ASSOCIATE (handed to `udp`). Every failure the protocol can express gets its
//! reply before the connection closes; the access-log line names the cause.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use rustle_proto::addr::{Address, Host};
use rustle_proto::{socks4, socks5};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

mod udp;

use crate::error::{Error, Phase};
use crate::io::buf::Buf;
use crate::io::conn::Stream;
use crate::policy::Listener;
use crate::telemetry::accesslog::{Label, Parts, Protocol};

use crate::front::tunnel::{Handoff, Record};
use crate::front::worker::{ConnGuard, Worker};
use crate::upstream::{Tls, Want};

/// One SOCKS connection and what its log line will say.
pub(crate) struct Session {
    pub(crate) guard: ConnGuard,
    /// The authenticated user, if any.
    pub(crate) user: Option<String>,
    /// Its traffic counters, found once it logged in (`over_quota`).
    pub(crate) traffic: Option<Arc<crate::limits::UserTraffic>>,
    /// The parameters its user name carried (`[auth.params]`).
    pub(crate) params: Option<Box<crate::acl::Params>>,
    pub(crate) worker: Rc<Worker>,
    pub(crate) listener: Arc<Listener>,
    pub(crate) stream: TcpStream,
    pub(crate) peer: SocketAddr,
    pub(crate) buf: Buf,
    pub(crate) start: Instant,
    /// `CONNECT`, `BIND` or `UDP`.
    pub(crate) method: &'static str,
    /// `socks5://host:port` once known.
    pub(crate) target: String,
    /// The last reply code sent.
    pub(crate) status: u16,
    /// A reply went out: an error can no longer be answered.
    pub(crate) replied: bool,
    pub(crate) up: u64,
    pub(crate) down: u64,
    pub(crate) upstream: Option<SocketAddr>,
    /// The route and parents taken, if any.
    pub(crate) via: Option<Rc<crate::telemetry::accesslog::Via>>,
    /// SOCKS4 or SOCKS5, once the first byte said which.
    pub(crate) protocol: Protocol,
    /// `up` and `down` were added to the user's counters as they moved (a UDP
    /// association counts each datagram).
    pub(crate) counted: bool,
    /// The deadline for the whole handshake.
    deadline: tokio::time::Instant,
}

/// Serves one SOCKS connection; `buf` may already hold its first bytes.
pub(crate) async fn serve(
    guard: ConnGuard,
    listener: Arc<Listener>,
    stream: TcpStream,
    peer: SocketAddr,
    buf: Buf,
) {
    let worker = guard.worker().clone();
    let deadline = tokio::time::Instant::now() + worker.cfg().timeouts.header;
    let mut s = Session {
        guard,
        user: None,
        traffic: None,
        params: None,
        worker: worker.clone(),
        listener,
        stream,
        peer,
        buf: if buf.capacity() == 0 { worker.take_buf() } else { buf },
        start: Instant::now(),
        method: "-",
        target: String::new(),
        status: 0,
        replied: false,
        up: 0,
        down: 0,
        upstream: None,
        via: None,
        protocol: Protocol::Unknown,
        counted: false,
        deadline,
    };
    let result = match s.fill_until(|b| !b.is_empty()).await {
        Ok(()) if s.buf.filled()[0] == socks5::VERSION => {
            s.protocol = Protocol::Socks5;
            socks5_session(&mut s).await
        }
        Ok(()) if s.buf.filled()[0] == socks4::VERSION => {
            s.protocol = Protocol::Socks4;
            socks4_session(&mut s).await
        }
        Ok(()) => Err(Error::Unsupported("not a SOCKS4 or SOCKS5 handshake")),
        Err(e) => Err(e),
    };
    worker.give_buf(std::mem::take(&mut s.buf));
    match result {
        Ok(Some(handoff)) => {
            // The tunnel logs itself when it ends; the handshake's state goes now.
            let Session {
                guard,
                stream,
                peer,
                method,
                target,
                status,
                start,
                upstream,
                user,
                via,
                protocol,
                ..
            } = s;
            let record = Record {
                tls: None,
                peer,
                user: user.map(std::rc::Rc::from),
                label: {
                    let mut label = Label::new([method.as_bytes(), target.as_bytes(), b"", b""]);
                    label.protocol = protocol;
                    label
                },
                status,
                start,
                upstream,
                via,
                up: 0,
                down: 0,
            };
            let opts = worker.relay_opts(s.listener.splice);
            crate::front::tunnel::spawn(guard, stream.into(), handoff, opts, record);
        }
        Ok(None) => s.log(None),
        Err(e) => s.log(Some(&e)),
    }
}

/// SOCKS5 username/password (RFC 1929): checked against the users where the listener
/// requires authentication, accepted blindly where `accept_any_credentials` says so.
async fn socks5_credentials(s: &mut Session) -> Result<(), Error> {
    let (user, password) = loop {
        match socks5::parse_credentials(s.buf.filled()) {
            Ok(Some((c, n))) => {
                // A name that is not UTF-8 is no user's: checked as an unknown user (a
                // NUL no user name holds), never as the name with its bytes replaced
                // (`bob\xff` must not pass as a user `bob\u{fffd}`).
                // A control character likewise (as Basic refuses one).
                let user = std::str::from_utf8(c.user)
                    .ok()
                    .filter(|u| !u.chars().any(char::is_control))
                    .unwrap_or("\0")
                    .to_owned();
                let pair = (user, c.password.to_vec());
                s.buf.consume(n);
                break pair;
            }
            Ok(None) => s.read_more().await?,
            Err(e) => {
                // RFC 1929: a failure status, then the close.
                let _ = s.send(&socks5::auth_status(false)).await;
                return Err(Error::Socks5(e));
            }
        }
    };
    if s.listener.auth {
        let worker = s.worker.clone();
        let l = &s.listener;
        let origin = crate::policy::auth::Origin {
            listener: l.name.as_deref(),
            addr: l.listen,
            protocol: "socks5",
        };
        let checked = worker.authenticate(origin, s.peer.ip(), &user, &password).await;
        let peer = s.peer.ip();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&s.stream);
        let checked = checked.and_then(|(user, params)| match s.guard.hold_user(user, peer, fd) {
            Ok(()) => Ok((user.len(), params)),
            // The password passed: a user out of client addresses, or refused for want
            // of the fleet's shared state, is refused in the request's reply (not
            // allowed; general failure: `user_admitted`), which can say why, where
            // RFC 1929's failure status would read as a wrong password.
            Err(Error::ClientAddresses(_) | Error::StateLost) => Ok((user.len(), params)),
            Err(e) => Err(e),
        });
        let (len, params) = match checked {
            Ok(ok) => ok,
            Err(e) => {
                // RFC 1929's failure status has no SOCKS5 reply code: logged as the reply
                // of the same meaning (not allowed), never as 0 (succeeded).
                s.status = e.socks5_reply() as u16;
                let _ = s.send(&socks5::auth_status(false)).await;
                return Err(e);
            }
        };
        // The user is the name's first `len` bytes (`authenticate` cut its parameters).
        let mut user = user;
        user.truncate(len);
        s.user = Some(user);
        s.params = params.map(Box::new);
    }
    s.send(&socks5::auth_status(true)).await
}

/// A finished handshake: a tunnel to start, or nothing more to do.
type Outcome = Result<Option<Handoff>, Error>;

impl Session {
    /// Reads until `done` says the buffer holds enough, within the handshake deadline.
    async fn fill_until(&mut self, done: impl Fn(&[u8]) -> bool) -> Result<(), Error> {
        while !done(self.buf.filled()) {
            self.read_more().await?;
        }
        Ok(())
    }

    async fn read_more(&mut self) -> Result<(), Error> {
        let read = self.buf.read_from(&mut self.stream, crate::io::buf::READ_SIZE);
        match tokio::time::timeout_at(self.deadline, read).await {
            Ok(Ok(0)) => Err(Error::HandshakeTruncated),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(Error::Client(e)),
            Err(_) => Err(Error::Timeout(Phase::Handshake)),
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.stream.write_all(bytes).await.map_err(Error::Client)
    }

    /// The session's end (`exchange::end`): the user's traffic, the metrics, the log line.
    fn log(&self, error: Option<&Error>) {
        let parts = Parts { method: self.method.as_bytes(), target: self.target.as_bytes() };
        let mut record = crate::telemetry::accesslog::Record::new(
            self.peer,
            &self.listener,
            &self.listener.counters,
            self.protocol,
            self.start,
        );
        (record.label, record.user) = (&parts, self.user.as_deref());
        (record.status, record.up, record.down) = (self.status, self.up, self.down);
        (record.upstream, record.via) = (self.upstream, self.via.as_deref());
        if self.counted {
            record.counted = (self.up, self.down);
        }
        crate::front::exchange::end(&self.worker, self.traffic.as_deref(), record, error);
    }

    /// What the upstream layer is asked for a UDP datagram of this association to
    /// `host:port`.
    pub(crate) fn want<'a>(&'a self, host: &'a str, port: u16) -> Want<'a> {
        Want {
            host,
            port,
            protocol: Protocol::Udp,
            client: self.peer.ip(),
            addrs: (&self.peer, &self.listener.listen),
            user: self.user.as_deref(),
            listener: self.listener.name.as_deref(),
            tls: Tls::Plain,
            local: crate::upstream::local_of(&self.worker.policy(), || self.stream.local_addr()),
            params: self.params.as_deref(),
            seed: None,
        }
    }

    /// A connection to a destination the client named, from the upstream layer (given up
    /// as soon as the client leaves).
    pub(crate) async fn connect(
        &mut self,
        dst: &Address,
        protocol: Protocol,
    ) -> Result<(Stream, Vec<u8>), Error> {
        let w = self.worker.clone();
        let policy = w.policy();
        let host = match &dst.host {
            Host::Ip(ip) => ip.to_string(),
            Host::Domain(d) => d.as_str().to_string(),
        };
        let Session { listener, peer, user, params, stream, buf, .. } = self;
        let want = Want {
            host: &host,
            port: dst.port,
            protocol,
            client: peer.ip(),
            addrs: (peer, &listener.listen),
            user: user.as_deref(),
            listener: listener.name.as_deref(),
            tls: Tls::Plain,
            local: crate::upstream::local_of(&policy, || stream.local_addr()),
            params: params.as_deref(),
            seed: None,
        };
        // What the client sends meanwhile (optimistic data) is kept in `buf` and goes
        // first through the tunnel.
        let connected = crate::front::exchange::connect(&w, &policy, &want, None, || {
            crate::front::exchange::client_left(
                stream,
                buf,
                crate::io::buf::READ_SIZE,
                Phase::Connect,
                true,
            )
        })
        .await?;
        self.upstream = Some(connected.addr);
        self.via = connected.via;
        Ok((connected.stream, connected.early))
    }

    /// Why the logged-in user is refused, when one of its quotas is used up (its
    /// counters found once, kept for the tunnel and the log line).
    fn over_quota(&mut self) -> Option<Error> {
        let user = self.user.as_deref()?;
        let t = self.traffic.get_or_insert_with(|| self.worker.traffic.entry(user));
        t.over_quota()
    }

    /// The tunnel to start, with any client bytes read beyond the handshake.
    fn handoff(&mut self, upstream: Stream, early_down: Vec<u8>) -> Handoff {
        let throttle = self.worker.throttle(&self.listener.throttle, self.user.as_deref());
        let early_up = self.buf.filled().to_vec();
        Handoff { upstream, early_up, early_down, throttle, traffic: self.traffic.clone() }
    }

    /// The access rules on a BIND to `dst` (protocol `bind`), with `peer` as the address
    /// when the rules need one: Ok(true) when they need one and none was given (the
    /// peer that connects is checked then).
    fn bind_allowed(&self, dst: &Address, peer: Option<IpAddr>) -> Result<bool, Error> {
        let policy = self.worker.policy();
        let host = match &dst.host {
            Host::Ip(ip) => ip.to_string(),
            Host::Domain(d) => d.as_str().to_string(),
        };
        let user = self.user.as_deref().and_then(|u| crate::policy::UserView::of(&policy, u));
        let access = crate::policy::Access {
            policy: &policy,
            listener: self.listener.name.as_deref(),
            client: self.peer.ip(),
            user,
            host: &host,
            port: dst.port,
            protocol: Protocol::Bind,
            params: self.params.as_deref(),
        };
        let denied = |d| Error::Connect(crate::error::ConnectError::Denied(d));
        let needs_address = access.precheck().map_err(denied)?;
        match (needs_address, peer) {
            (false, _) => Ok(false),
            (true, None) => Ok(true),
            (true, Some(ip)) => access.check_rules(ip).map(denied).map_or(Ok(false), Err),
        }
    }

    /// BIND: listen on the address the client reached us on, tell it where, accept one
    /// connection from the expected host, tell it who came, then relay. `reply(ok, addr)`
    /// encodes the protocol's reply; `codes` are its (granted, refused) status codes.
    async fn bind<F>(
        &mut self,
        dst: &Address,
        codes: (u16, u16),
        reply: F,
    ) -> Result<Handoff, Error>
    where
        F: Fn(bool, SocketAddr) -> Vec<u8>,
    {
        // The rules on the announced host and port; when they need an address, on the
        // announced one, or else on the peer that connects.
        let announced = match &dst.host {
            Host::Ip(ip) if !ip.is_unspecified() => Some(*ip),
            Host::Ip(_) | Host::Domain(_) => None,
        };
        let peer_check = self.bind_allowed(dst, announced)?;
        let local_ip = self.stream.local_addr().map_err(Error::Client)?.ip();
        let listener = TcpListener::bind((local_ip, 0)).await.map_err(Error::Upstream)?;
        let bound = listener.local_addr().map_err(Error::Upstream)?;
        self.replied = true;
        self.status = codes.0;
        self.send(&reply(true, bound)).await?;
        let wait = self.worker.cfg().timeouts.io;
        // A client that leaves meanwhile takes the listening socket with it.
        let accept = tokio::time::timeout(wait, listener.accept());
        let left = crate::front::exchange::client_left(
            &mut self.stream,
            &mut self.buf,
            crate::io::buf::READ_SIZE,
            Phase::Incoming,
            true,
        );
        let (incoming, from) = tokio::select! {
            r = accept => match r {
                Ok(Ok(x)) => x,
                Ok(Err(e)) => return Err(Error::Upstream(e)),
                Err(_) => return Err(Error::Timeout(Phase::Connect)),
            },
            e = left => return Err(e),
        };
        drop(listener);
        let expected = match &dst.host {
            Host::Ip(ip) if !ip.is_unspecified() => vec![*ip],
            Host::Ip(_) => Vec::new(),
            Host::Domain(d) => self.worker.upstreams.resolve(d.as_str()).await?.to_vec(),
        };
        if !expected.is_empty() && !expected.contains(&from.ip()) {
            self.status = codes.1;
            self.send(&reply(false, from)).await?;
            return Err(Error::BindStranger(from));
        }
        if peer_check {
            if let Err(e) = self.bind_allowed(dst, Some(from.ip())) {
                self.status = codes.1;
                self.send(&reply(false, from)).await?;
                return Err(e);
            }
        }
        self.upstream = Some(from);
        self.send(&reply(true, from)).await?;
        let _ = incoming.set_nodelay(true);
        Ok(self.handoff(incoming.into(), Vec::new()))
    }
}

async fn socks5_session(s: &mut Session) -> Outcome {
    // ExpectGreeting
    let greeting = loop {
        match socks5::parse_greeting(s.buf.filled()) {
            Ok(Some((g, n))) => {
                s.buf.consume(n);
                break g;
            }
            Ok(None) => s.read_more().await?,
            Err(e) => {
                // A greeting that offers nothing usable: no acceptable method (RFC 1928).
                let refusal = socks5::method_selection(socks5::method::NONE_ACCEPTABLE);
                let _ = s.send(&refusal).await;
                return Err(Error::Socks5(e));
            }
        }
    };
    let method = if s.listener.auth {
        if greeting.user_pass {
            socks5::method::USER_PASS
        } else {
            socks5::method::NONE_ACCEPTABLE
        }
    } else if greeting.no_auth {
        socks5::method::NO_AUTH
    } else if greeting.user_pass && s.listener.accept_any_credentials {
        socks5::method::USER_PASS
    } else {
        socks5::method::NONE_ACCEPTABLE
    };
    if method == socks5::method::NONE_ACCEPTABLE {
        // Logged as refused (not allowed), the reply of the same meaning.
        s.status = socks5::Reply::NotAllowed as u16;
        let _ = s.send(&socks5::method_selection(method)).await;
        // On a listener that requires auth, a client without credentials is refused
        // for authentication, as an HTTP client without them gets its 407.
        return Err(match s.listener.auth {
            true => Error::AuthRequired("SOCKS5: no acceptable authentication method offered"),
            false => Error::Unsupported("SOCKS5: no acceptable authentication method offered"),
        });
    }
    s.send(&socks5::method_selection(method)).await?;
    // ExpectAuth
    if method == socks5::method::USER_PASS {
        socks5_credentials(s).await?;
    }
    // ExpectRequest
    let request = loop {
        match socks5::parse_request(s.buf.filled()) {
            Ok(Some((r, n))) => {
                s.buf.consume(n);
                break r;
            }
            Ok(None) => s.read_more().await?,
            Err(e) => {
                let e = Error::Socks5(e);
                reply5(s, e.socks5_reply(), None).await;
                return Err(e);
            }
        }
    };
    s.target = format!("socks5://{}", request.dst);
    if let Some(e) = user_admitted(s).err().or_else(|| s.over_quota()) {
        s.method = match request.command {
            socks5::Command::Connect => "CONNECT",
            socks5::Command::Bind => "BIND",
            socks5::Command::UdpAssociate => "UDP",
        };
        reply5(s, e.socks5_reply(), None).await;
        return Err(e);
    }
    match request.command {
        socks5::Command::Connect => {
            s.method = "CONNECT";
            match s.connect(&request.dst, Protocol::Socks5).await {
                Ok(up) => {
                    let bound = up.0.local_addr().ok();
                    reply5(s, socks5::Reply::Succeeded, bound).await;
                    Ok(Some(s.handoff(up.0, up.1)))
                }
                // A client that left is told nothing.
                Err(e @ Error::ClientLeft(_)) => Err(e),
                Err(e) => {
                    reply5(s, e.socks5_reply(), None).await;
                    Err(e)
                }
            }
        }
        socks5::Command::Bind => {
            s.method = "BIND";
            let codes = (socks5::Reply::Succeeded as u16, socks5::Reply::NotAllowed as u16);
            let result = s
                .bind(&request.dst, codes, |ok, addr| {
                    let mut out = Vec::with_capacity(socks5::MAX_REPLY);
                    let rep = if ok { socks5::Reply::Succeeded } else { socks5::Reply::NotAllowed };
                    socks5::write_reply(rep, addr, &mut out);
                    out
                })
                .await;
            if let Err(e) = &result {
                if !s.replied {
                    reply5(s, e.socks5_reply(), None).await;
                }
            }
            result.map(Some)
        }
        socks5::Command::UdpAssociate => {
            s.method = "UDP";
            // Boxed: an association's state would otherwise enlarge every SOCKS5
            // handshake's future.
            Box::pin(udp::associate(s, &request.dst)).await.map(|()| None)
        }
    }
}

/// The authenticated user's connection counted against its limits, if it is not yet (a
/// user out of client addresses, or refused for want of the fleet's shared state, passes
/// the login and is refused here, in the request's reply); for a connection already
/// counted, nothing to do.
fn user_admitted(s: &mut Session) -> Result<(), Error> {
    match s.user.as_deref() {
        Some(user) if s.listener.auth => {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&s.stream);
            s.guard.hold_user(user, s.peer.ip(), fd)
        }
        _ => Ok(()),
    }
}

/// Sends a SOCKS5 reply, best effort: the client may already be gone.
pub(crate) async fn reply5(s: &mut Session, reply: socks5::Reply, bound: Option<SocketAddr>) {
    let mut out = Vec::with_capacity(socks5::MAX_REPLY);
    let unspecified = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
    socks5::write_reply(reply, bound.unwrap_or(unspecified), &mut out);
    s.status = reply as u16;
    s.replied = true;
    let _ = s.send(&out).await;
}

async fn socks4_session(s: &mut Session) -> Outcome {
    // ExpectRequest: SOCKS4 has no greeting.
    let (request, user_id) = loop {
        match socks4::parse_request(s.buf.filled()) {
            Ok(Some((r, n))) => {
                let id = String::from_utf8_lossy(r.user(s.buf.filled())).into_owned();
                s.buf.consume(n);
                break (r, id);
            }
            Ok(None) => s.read_more().await?,
            Err(e) => {
                reply4(s, e.reply(), None).await;
                return Err(Error::Socks4(e));
            }
        }
    };
    s.target = format!("socks4://{}", request.dst);
    match request.command {
        socks4::Command::Connect => {
            s.method = "CONNECT";
            if let Err(e) =
                socks4_user(s, user_id).and_then(|()| s.over_quota().map_or(Ok(()), Err))
            {
                reply4(s, socks4::Reply::Rejected, None).await;
                return Err(e);
            }
            match s.connect(&request.dst, Protocol::Socks4).await {
                Ok(up) => {
                    let bound = match up.0.local_addr() {
                        Ok(SocketAddr::V4(a)) => Some(a),
                        _ => None,
                    };
                    reply4(s, socks4::Reply::Granted, bound).await;
                    Ok(Some(s.handoff(up.0, up.1)))
                }
                Err(e @ Error::ClientLeft(_)) => Err(e),
                Err(e) => {
                    reply4(s, socks4::Reply::Rejected, None).await;
                    Err(e)
                }
            }
        }
        socks4::Command::Bind => {
            s.method = "BIND";
            if let Err(e) =
                socks4_user(s, user_id).and_then(|()| s.over_quota().map_or(Ok(()), Err))
            {
                reply4(s, socks4::Reply::Rejected, None).await;
                return Err(e);
            }
            let codes = (socks4::Reply::Granted as u16, socks4::Reply::Rejected as u16);
            let result = s
                .bind(&request.dst, codes, |ok, addr| {
                    let rep = if ok { socks4::Reply::Granted } else { socks4::Reply::Rejected };
                    let v4 = match addr {
                        SocketAddr::V4(a) => Some(a),
                        SocketAddr::V6(_) => None,
                    };
                    socks4::reply(rep, v4).to_vec()
                })
                .await;
            if result.is_err() && !s.replied {
                reply4(s, socks4::Reply::Rejected, None).await;
            }
            result.map(Some)
        }
    }
}

/// SOCKS4 carries a user id but no password: on a listener requiring authentication it
/// is accepted only with `socks4_users`, and then the id must name a configured user.
fn socks4_user(s: &mut Session, id: String) -> Result<(), Error> {
    if !s.listener.auth {
        return Ok(());
    }
    if !s.listener.socks4_users {
        return Err(Error::AuthRequired("SOCKS4 cannot authenticate on this listener"));
    }
    let policy = s.worker.policy();
    if policy.users.get(&id).is_none() {
        return Err(Error::AuthRequired("unknown SOCKS4 user id"));
    }
    let fd = std::os::fd::AsRawFd::as_raw_fd(&s.stream);
    s.guard.hold_user(&id, s.peer.ip(), fd)?;
    s.user = Some(id);
    Ok(())
}

async fn reply4(s: &mut Session, reply: socks4::Reply, bound: Option<SocketAddrV4>) {
    s.status = reply as u16;
    s.replied = true;
    let _ = s.send(&socks4::reply(reply, bound)).await;
}
