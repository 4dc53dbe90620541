//! SOCKS4, SOCKS4a and SOCKS5 (RFC 1928, RFC 1929): the handshake as a chain of states
//! named for what they wait on, then CONNECT (a relay), BIND (one incoming connection)
//! or UDP ASSOCIATE (handed to `udp`). Every failure the protocol can express gets its
//! reply before the connection closes; the access-log line names the cause.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use rustle_proto::addr::{Address, Host};
use rustle_proto::detect::{detect, Protocol};
use rustle_proto::{socks4, socks5};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::accesslog::Entry;
use crate::buf::Buf;
use crate::config::Listener;
use crate::error::{Error, Phase};
use crate::server::{ConnGuard, Worker};
use crate::tunnel::{Handoff, Record};

/// One SOCKS connection and what its log line will say.
pub struct Session {
    pub worker: Rc<Worker>,
    pub listener: Arc<Listener>,
    pub stream: TcpStream,
    pub peer: SocketAddr,
    pub buf: Buf,
    pub start: Instant,
    /// `CONNECT`, `BIND` or `UDP`.
    pub method: &'static str,
    /// `socks5://host:port` once known.
    pub target: String,
    /// The last reply code sent.
    pub status: u16,
    /// A reply went out: an error can no longer be answered.
    pub replied: bool,
    pub up: u64,
    pub down: u64,
    pub upstream: Option<SocketAddr>,
    /// The deadline for the whole handshake.
    deadline: tokio::time::Instant,
}

/// A listener detecting the protocol from the first byte: HTTP goes to `http1`, SOCKS
/// stays here. Detection reads into the buffer the chosen protocol then parses, so it
/// costs HTTP nothing beyond one branch.
pub async fn serve_auto(
    guard: ConnGuard,
    listener: Arc<Listener>,
    mut stream: TcpStream,
    peer: SocketAddr,
) {
    let worker = guard.worker().clone();
    let mut buf = worker.take_buf();
    let deadline = tokio::time::Instant::now() + worker.cfg.timeouts.header;
    let protocol = loop {
        match detect(buf.filled()) {
            Ok(Some(p)) => break p,
            Ok(None) => {}
            Err(e) => {
                log_failure(&worker, peer, &format!("{e}"));
                worker.give_buf(buf);
                return;
            }
        }
        match tokio::time::timeout_at(deadline, buf.read_from(&mut stream, crate::buf::READ_SIZE))
            .await
        {
            Ok(Ok(n)) if n > 0 => {}
            // Closed, failed or silent before saying anything: nothing to answer.
            _ => {
                worker.give_buf(buf);
                return;
            }
        }
    };
    match protocol {
        Protocol::Http => crate::http1::serve_buffered(guard, listener, stream, peer, buf).await,
        Protocol::Socks4 | Protocol::Socks5 => serve(guard, listener, stream, peer, buf).await,
        Protocol::Tls => {
            log_failure(&worker, peer, "TLS is not served on this port yet");
            worker.give_buf(buf);
        }
    }
}

fn log_failure(worker: &Worker, peer: SocketAddr, why: &str) {
    worker.log.log(&Entry {
        client: peer,
        method: b"-",
        target: b"-",
        status: 0,
        up: 0,
        down: 0,
        start: Instant::now(),
        upstream: None,
        error: Some(&why),
    });
}

/// Serves one SOCKS connection; `buf` may already hold its first bytes.
pub async fn serve(
    guard: ConnGuard,
    listener: Arc<Listener>,
    stream: TcpStream,
    peer: SocketAddr,
    buf: Buf,
) {
    let worker = guard.worker().clone();
    let deadline = tokio::time::Instant::now() + worker.cfg.timeouts.header;
    let mut s = Session {
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
        deadline,
    };
    let result = match s.fill_until(|b| !b.is_empty()).await {
        Ok(()) if s.buf.filled()[0] == socks5::VERSION => socks5_session(&mut s).await,
        Ok(()) if s.buf.filled()[0] == socks4::VERSION => socks4_session(&mut s).await,
        Ok(()) => Err(Error::Unsupported("not a SOCKS4 or SOCKS5 handshake")),
        Err(e) => Err(e),
    };
    worker.give_buf(std::mem::take(&mut s.buf));
    match result {
        Ok(Some(handoff)) => {
            // The tunnel logs itself when it ends; the handshake's state goes now.
            let Session { stream, peer, method, target, status, start, upstream, .. } = s;
            let record = Record {
                peer,
                method: method.as_bytes().to_vec(),
                target: target.into_bytes(),
                status,
                start,
                upstream,
                up: 0,
                down: 0,
            };
            let opts = worker.relay_opts(s.listener.splice);
            crate::tunnel::spawn(guard, stream, handoff, opts, record);
        }
        Ok(None) => s.log(None),
        Err(e) => s.log(Some(&e)),
    }
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
        let read = self.buf.read_from(&mut self.stream, crate::buf::READ_SIZE);
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

    fn log(&self, error: Option<&Error>) {
        if !self.worker.log.enabled() {
            return;
        }
        self.worker.log.log(&Entry {
            client: self.peer,
            method: self.method.as_bytes(),
            target: if self.target.is_empty() { b"-" } else { self.target.as_bytes() },
            status: self.status,
            up: self.up,
            down: self.down,
            start: self.start,
            upstream: self.upstream,
            error: error.map(|e| e as &dyn std::fmt::Display),
        });
    }

    /// Connects to a destination the client named.
    pub async fn connect(&mut self, dst: &Address) -> Result<TcpStream, Error> {
        let w = self.worker.clone();
        let timeout = w.cfg.timeouts.connect;
        let (up, addr) = match &dst.host {
            Host::Ip(ip) => {
                w.upstreams.connect_addr(SocketAddr::new(*ip, dst.port), timeout).await?
            }
            Host::Domain(d) => w.upstreams.connect(d.as_str(), dst.port, timeout).await?,
        };
        self.upstream = Some(addr);
        Ok(up)
    }

    /// The tunnel to start, with any client bytes read beyond the handshake.
    fn handoff(&mut self, upstream: TcpStream) -> Handoff {
        Handoff { upstream, early_up: self.buf.filled().to_vec(), early_down: Vec::new() }
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
        let local_ip = self.stream.local_addr().map_err(Error::Client)?.ip();
        let listener = TcpListener::bind((local_ip, 0)).await.map_err(Error::Upstream)?;
        let bound = listener.local_addr().map_err(Error::Upstream)?;
        self.replied = true;
        self.status = codes.0;
        self.send(&reply(true, bound)).await?;
        let wait = self.worker.cfg.timeouts.io;
        let (incoming, from) = match tokio::time::timeout(wait, listener.accept()).await {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => return Err(Error::Upstream(e)),
            Err(_) => return Err(Error::Timeout(Phase::Connect)),
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
        self.upstream = Some(from);
        self.send(&reply(true, from)).await?;
        let _ = incoming.set_nodelay(true);
        Ok(self.handoff(incoming))
    }
}

async fn socks5_session(s: &mut Session) -> Outcome {
    // ExpectGreeting
    let greeting = loop {
        if let Some((g, n)) = socks5::parse_greeting(s.buf.filled())? {
            s.buf.consume(n);
            break g;
        }
        s.read_more().await?;
    };
    let method = if greeting.no_auth {
        socks5::method::NO_AUTH
    } else if greeting.user_pass && s.listener.accept_any_credentials {
        socks5::method::USER_PASS
    } else {
        socks5::method::NONE_ACCEPTABLE
    };
    s.send(&socks5::method_selection(method)).await?;
    if method == socks5::method::NONE_ACCEPTABLE {
        return Err(Error::Unsupported("SOCKS5: no acceptable authentication method offered"));
    }
    // ExpectAuth
    if method == socks5::method::USER_PASS {
        loop {
            // Credentials are accepted whatever they are (see accept_any_credentials);
            // they are never logged.
            if let Some((_, n)) = socks5::parse_credentials(s.buf.filled())? {
                s.buf.consume(n);
                break;
            }
            s.read_more().await?;
        }
        s.send(&socks5::auth_status(true)).await?;
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
    match request.command {
        socks5::Command::Connect => {
            s.method = "CONNECT";
            match s.connect(&request.dst).await {
                Ok(up) => {
                    let bound = up.local_addr().ok();
                    reply5(s, socks5::Reply::Succeeded, bound).await;
                    Ok(Some(s.handoff(up)))
                }
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
            crate::udp::associate(s, &request.dst).await.map(|()| None)
        }
    }
}

/// Sends a SOCKS5 reply, best effort: the client may already be gone.
pub async fn reply5(s: &mut Session, reply: socks5::Reply, bound: Option<SocketAddr>) {
    let mut out = Vec::with_capacity(socks5::MAX_REPLY);
    let unspecified = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
    socks5::write_reply(reply, bound.unwrap_or(unspecified), &mut out);
    s.status = reply as u16;
    s.replied = true;
    let _ = s.send(&out).await;
}

async fn socks4_session(s: &mut Session) -> Outcome {
    // ExpectRequest: SOCKS4 has no greeting.
    let request = loop {
        match socks4::parse_request(s.buf.filled()) {
            Ok(Some((r, n))) => {
                s.buf.consume(n);
                break r;
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
            match s.connect(&request.dst).await {
                Ok(up) => {
                    let bound = match up.local_addr() {
                        Ok(SocketAddr::V4(a)) => Some(a),
                        _ => None,
                    };
                    reply4(s, socks4::Reply::Granted, bound).await;
                    Ok(Some(s.handoff(up)))
                }
                Err(e) => {
                    reply4(s, socks4::Reply::Rejected, None).await;
                    Err(e)
                }
            }
        }
        socks4::Command::Bind => {
            s.method = "BIND";
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

async fn reply4(s: &mut Session, reply: socks4::Reply, bound: Option<SocketAddrV4>) {
    s.status = reply as u16;
    s.replied = true;
    let _ = s.send(&socks4::reply(reply, bound)).await;
}
