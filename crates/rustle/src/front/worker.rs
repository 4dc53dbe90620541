//! The worker context: what every connection task of one worker thread shares (its
//! policy snapshot, pool of origin connections, caches, buffers, access log and limits).
//! It imports no front end: front ends and the shared layers below them take it as
//! `Rc<Worker>`; `server` builds one per worker thread.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::Config;
use crate::io::buf::Buf;
use crate::limits::{ConnLimits, Slot, Traffic};
use crate::policy::auth::{Gate, Refusal};
use crate::policy::Policy;
use crate::telemetry::accesslog::{AccessLog, Sink};
use crate::upstream::Upstreams;

mod cut;

/// What every connection task of one worker shares.
pub(crate) struct Worker {
    pub(crate) id: usize,
    /// The configuration in force (timeouts, limits, log settings...), from the policy
    /// snapshot: replaced with it on SIGHUP; `Rc` so that taking it costs no atomic.
    // Rc over the shared Arc on purpose, as for `policy`.
    #[allow(clippy::redundant_allocation)]
    cfg: RefCell<Rc<Arc<Config>>>,
    pub(crate) upstreams: Upstreams,
    pub(crate) log: AccessLog,
    limits: Cell<rustle_proto::http::Limits>,
    pub(crate) shutdown: watch::Receiver<bool>,
    /// Set once shutdown begins, read without touching the watch channel's lock.
    pub(crate) stopping: Cell<bool>,
    active: Cell<usize>,
    /// Users, rules and limits in force; replaced on SIGHUP. `Rc` so that a connection
    /// takes its snapshot without an atomic operation.
    // Rc over the shared Arc on purpose: cloning the Rc costs no atomic operation.
    #[allow(clippy::redundant_allocation)]
    policy: RefCell<Rc<Arc<Policy>>>,
    /// Credentials checks (this worker's cache and failure limiter; no lock).
    auth: Gate,
    pub(crate) conn_limits: Arc<ConnLimits>,
    /// Bytes each way per authenticated user, across workers (for logs and metrics).
    pub(crate) traffic: Arc<Traffic>,
    /// Read buffers not in use, so a request does not allocate one.
    bufs: RefCell<Vec<Buf>>,
    /// Response field lists not in use (see `take_fields`).
    fields: RefCell<Vec<Vec<rustle_proto::http::Header>>>,
    /// Outgoing-head buffers not in use (see `take_out`).
    outs: RefCell<Vec<Vec<u8>>>,
    /// The fewest spare buffers since the last trim: that many were not needed.
    bufs_low: Cell<usize>,
    /// When the allocator was last asked to give free pages back.
    released: Cell<Instant>,
    /// Tunnels parked since then.
    parked_untrimmed: Cell<usize>,
    /// The listeners in force, for tunnels that outlive a reload (`throttle_now`).
    listeners_now: RefCell<Vec<Arc<crate::policy::Listener>>>,
    /// Kept-alive connections waiting for their next request.
    pub(crate) waiters: crate::io::idle::Waiters,
    /// Connections of authenticated users, for cutting those of a user cut (`cut`).
    pub(crate) cuts: cut::Cuts,
    /// Open client connections across all workers, and HTTP/2 streams with an upstream
    /// (`StreamSlot`), for `limits.max_connections`.
    open: Arc<AtomicUsize>,
    /// When the connection about to start its TLS handshake was accepted, when a PROXY
    /// protocol header came first: the header and the handshake share one deadline.
    /// Set just before the front end's first poll, taken by `handshake_deadline`.
    handshake_since: Cell<Option<tokio::time::Instant>>,
    /// When this worker last warned of a user refused for its client addresses, and the
    /// refusals since then that it did not warn of (one warning a second at most: a
    /// shared account's clients retry; each refusal has its access-log line anyway).
    addresses_warned: Cell<(Option<Instant>, u64)>,
}

/// An HTTP/2 stream's share of the connection limits while it may hold an upstream
/// connection: a place under `limits.max_connections` and slots under the per-client and
/// per-user limits, as a connection of its own would take (one h2 connection carries
/// many upstream sockets). Released when dropped.
pub(crate) struct StreamSlot {
    open: Arc<AtomicUsize>,
    /// The client's and the user's slots, boxed and only when a limit counts them (an
    /// open tunnel keeps its stream's slot).
    _slots: Option<Box<(Option<Slot>, Option<Slot>)>>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Held by a connection task; releases its slot when the task ends however it ends.
pub(crate) struct ConnGuard {
    worker: Rc<Worker>,
    /// The listener it was accepted on.
    listener: Arc<crate::policy::Listener>,
    /// The connection's slots under the per-client and per-user limits; boxed, and only
    /// when a limit holds one or a user authenticated, because every open connection and
    /// tunnel keeps its guard.
    slots: Option<Box<Slots>>,
}

#[derive(Default)]
struct Slots {
    /// This client address's slot under `limits.max_connections_per_client`.
    _client: Option<Slot>,
    /// The authenticated user's slot under `limits.max_connections_per_user`.
    user: Option<Slot>,
    /// The user's open connections in the metrics.
    user_conn: Option<crate::telemetry::metrics::UserConn>,
    /// The client address in use by the user (`limits.max_client_addresses`).
    address: Option<crate::limits::addrs::Hold>,
    /// The connection's slot in the worker's `cuts`.
    cut: Option<usize>,
    /// The user's RADIUS accounting session, joined (a user of a backend that accounts).
    _acct: Option<crate::policy::auth::backend::AcctHold>,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        if let Some(slot) = self.slots.as_ref().and_then(|s| s.cut) {
            self.worker.cuts.release(slot);
        }
        self.worker.active.set(self.worker.active.get() - 1);
        self.worker.open.fetch_sub(1, Ordering::Relaxed);
        crate::telemetry::metrics::closed(&self.listener.counters);
    }
}

/// Spare buffers a worker may keep; beyond this, returned buffers are freed. Idle
/// kept-alive connections give their buffer back between requests, so a busy worker
/// needs about one per active connection: a small cap made them allocate (and zero
/// 16 KiB) on most requests. What the last second did not use is freed by `trim_bufs`.
const MAX_SPARE_BUFS: usize = 4096;

/// Least time between two hand-backs of free memory to the kernel (`trim_bufs`).
const RELEASE_EVERY: Duration = Duration::from_secs(10);

/// Spare outgoing-head buffers a worker keeps, the size a new one starts with, and the
/// largest it keeps (a head with up to 64 KiB of body coalesced, and some room).
const MAX_SPARE_OUTS: usize = 256;
const OUT_SIZE: usize = 1024;
const MAX_KEPT_OUT: usize = 80 * 1024;

/// Spare response field lists a worker keeps, and the largest it keeps (in fields).
const MAX_SPARE_FIELDS: usize = 256;
const MAX_KEPT_FIELDS: usize = 64;

/// Tunnels parked since the allocator last gave pages back that make it worth doing again.
const PARKED_TO_RELEASE: usize = 256;

impl Worker {
    /// The context of worker `id`: `policy` is the policy in force (its `config` the
    /// configuration), `open` counts client connections across workers, `hasher` runs the
    /// password hashes of every worker.
    // Each argument is a part handed over once per worker thread, at start.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: usize,
        policy: Arc<Policy>,
        shutdown: watch::Receiver<bool>,
        conn_limits: Arc<ConnLimits>,
        traffic: Arc<Traffic>,
        sink: Sink,
        open: Arc<AtomicUsize>,
        hasher: Arc<crate::policy::auth::Hasher>,
    ) -> Worker {
        let cfg = policy.config.clone();
        let log = AccessLog::new(sink, cfg.log.format.clone());
        let a = &cfg.auth;
        let auth = Gate::new(a.cache_ttl, a.failures_burst, a.failures_per_minute, hasher);
        Worker {
            id,
            upstreams: Upstreams::new(cfg.upstream.clone(), cfg.dns.clone(), policy.dns.clone()),
            log,
            limits: Cell::new(head_limits(&cfg)),
            shutdown,
            stopping: Cell::new(false),
            active: Cell::new(0),
            bufs: RefCell::new(Vec::new()),
            fields: RefCell::new(Vec::new()),
            outs: RefCell::new(Vec::new()),
            bufs_low: Cell::new(0),
            parked_untrimmed: Cell::new(0),
            listeners_now: RefCell::new(Vec::new()),
            released: Cell::new(
                Instant::now().checked_sub(RELEASE_EVERY).unwrap_or_else(Instant::now),
            ),
            waiters: Default::default(),
            cuts: Default::default(),
            policy: RefCell::new(Rc::new(policy)),
            auth,
            conn_limits,
            traffic,
            open,
            handshake_since: Cell::new(None),
            addresses_warned: Cell::new((None, 0)),
            cfg: RefCell::new(Rc::new(cfg)),
        }
    }

    /// The configuration in force, for one connection or request. An `Rc` of the shared
    /// `Arc`: a connection's clone is a plain increment on this thread, not an atomic one.
    #[allow(clippy::redundant_allocation)]
    pub(crate) fn cfg(&self) -> Rc<Arc<Config>> {
        self.cfg.borrow().clone()
    }

    /// The request-head limits in force.
    pub(crate) fn limits(&self) -> rustle_proto::http::Limits {
        self.limits.get()
    }

    /// Counts a connection just accepted from `client` on `listener`: its guard, the
    /// connections now open across workers, and whether the client is over its own limit.
    #[inline(always)]
    pub(crate) fn admit(
        self: &Rc<Self>,
        client: std::net::IpAddr,
        listener: &Arc<crate::policy::Listener>,
    ) -> (ConnGuard, usize, bool) {
        crate::telemetry::metrics::accepted(&listener.counters);
        let open = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        self.active.set(self.active.get() + 1);
        let client_slot = self.conn_limits.acquire_client(client);
        let over_client = client_slot.is_none();
        let guard = ConnGuard {
            worker: self.clone(),
            listener: listener.clone(),
            slots: client_slot
                .filter(Slot::counts)
                .map(|c| Box::new(Slots { _client: Some(c), ..Slots::default() })),
        };
        (guard, open, over_client)
    }

    /// The deadline of a TLS handshake starting now: `timeouts.handshake` from now, or
    /// from the accept of a connection whose PROXY protocol header came first.
    pub(crate) fn handshake_deadline(&self) -> tokio::time::Instant {
        let since = self.handshake_since.take().unwrap_or_else(tokio::time::Instant::now);
        since + self.cfg().timeouts.handshake
    }

    /// The next `handshake_deadline` counts from `since` (the front end about to be
    /// polled takes it before its first wait).
    pub(crate) fn handshake_from(&self, since: tokio::time::Instant) {
        self.handshake_since.set(Some(since));
    }

    /// Moves `guard`'s per-client slot to `client` (the client a PROXY protocol header
    /// carried): the balancer's slot is given back first. False when `client` is over its
    /// own limit.
    pub(crate) fn move_client(&self, guard: &mut ConnGuard, client: std::net::IpAddr) -> bool {
        if let Some(slots) = guard.slots.as_mut() {
            slots._client = None;
        }
        let Some(slot) = self.conn_limits.acquire_client(client) else { return false };
        if slot.counts() {
            guard.slots.get_or_insert_with(Box::default)._client = Some(slot);
        }
        true
    }

    /// A stream's share of the connection limits (`StreamSlot`), or the error it is
    /// refused with: `Overloaded` past `limits.max_connections`, `LimitReached` past the
    /// client's or the user's own limit. Costs an atomic add and, with a per-client or
    /// per-user limit, the limits' lock, as accepting a connection does.
    pub(crate) fn admit_stream(
        &self,
        client: std::net::IpAddr,
        user: Option<&str>,
    ) -> Result<StreamSlot, crate::error::Error> {
        use crate::error::Error;
        let open = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        let mut slot = StreamSlot { open: self.open.clone(), _slots: None };
        if open > self.cfg().limits.max_connections {
            return Err(Error::Overloaded);
        }
        let client = self.conn_limits.acquire_client(client);
        let client = client.ok_or(Error::LimitReached("for this client address"))?;
        let user = match user {
            Some(user) => {
                let user = self.conn_limits.acquire_user(user);
                Some(user.ok_or(Error::LimitReached("for this user"))?)
            }
            None => None,
        };
        let (client, user) = (client.counts().then_some(client), user.filter(Slot::counts));
        if client.is_some() || user.is_some() {
            slot._slots = Some(Box::new((client, user)));
        }
        Ok(slot)
    }

    /// `user`'s use of the client address `client` under `limit`
    /// (`limits.max_client_addresses`), or the refusal, logged.
    fn admit_address(
        &self,
        user: &str,
        client: std::net::IpAddr,
        limit: crate::limits::addrs::Limit,
    ) -> Result<crate::limits::addrs::Hold, crate::error::Error> {
        use crate::limits::addrs::Refused;
        let now = crate::limits::now();
        let refused = match self.conn_limits.addrs.admit(user, client, limit, now) {
            Ok(hold) => return Ok(hold),
            Err(refused) => refused,
        };
        let user = user.escape_debug();
        let why = match refused {
            Refused::InUse { in_use, max } => {
                format!("user {user} is already using {in_use} client addresses (limit {max})")
            }
            Refused::Full => format!(
                "user {user} refused: the table of client addresses is full ({} users)",
                crate::limits::addrs::MAX_USERS
            ),
        };
        let (last, held_back) = self.addresses_warned.get();
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            self.addresses_warned.set((last, held_back + 1));
        } else {
            self.addresses_warned.set((Some(now), 0));
            match held_back {
                0 => tracing::warn!("{client}: {why}"),
                n => tracing::warn!(
                    "{client}: {why} ({n} more such refusals since the last warning)"
                ),
            }
        }
        Err(crate::error::Error::ClientAddresses(why.into()))
    }

    /// Connections of this worker still open.
    pub(crate) fn active(&self) -> usize {
        self.active.get()
    }

    /// Puts a new policy and its configuration in force for connections and requests
    /// that start from now on (SIGHUP): timeouts, head limits, the origin pool's and the
    /// credential checks' settings, the access log's format and where it goes (`sink`).
    /// Connections already open keep the snapshot they took.
    pub(crate) fn reconfigure(&self, policy: Arc<Policy>, sink: Sink) {
        let cfg = policy.config.clone();
        self.log.reconfigure(sink, cfg.log.format.clone());
        self.limits.set(head_limits(&cfg));
        self.upstreams.set_config(cfg.upstream.clone(), &cfg.dns, &policy.dns);
        let a = &cfg.auth;
        self.auth.set_limits(a.cache_ttl, a.failures_burst, a.failures_per_minute);
        self.auth.hasher().set_limits(a.max_pending_hashes, a.max_hashes_per_client);
        *self.cfg.borrow_mut() = Rc::new(cfg);
        *self.policy.borrow_mut() = Rc::new(policy);
        crate::io::relay::kernel::reloaded();
    }

    /// The listeners in force from now on (with `reconfigure`).
    pub(crate) fn set_listeners(&self, listeners: Vec<Arc<crate::policy::Listener>>) {
        *self.listeners_now.borrow_mut() = listeners;
    }

    /// The throttle a connection accepted on `listener` would get now, under the
    /// listener's settings in force (a reload may have changed its rates) and the policy
    /// in force.
    pub(crate) fn throttle_now(
        &self,
        listener: &crate::policy::Listener,
        user: Option<&str>,
    ) -> crate::limits::Throttle {
        let now = self.listeners_now.borrow();
        let current = now.iter().find(|l| l.key == listener.key).map_or(listener, |l| &**l);
        self.throttle(&current.throttle, user)
    }

    /// When an exchange starts, for its log line and its duration: the clock when lines
    /// are written or durations measured (`metrics::timed`), the last sweep's time when
    /// neither (nothing reads it then).
    pub(crate) fn stamp(&self) -> Instant {
        match self.log.enabled() || crate::telemetry::metrics::timed() {
            true => Instant::now(),
            false => self.waiters.coarse_now(),
        }
    }

    /// The generation of the users in force (changes with every reload).
    pub(crate) fn users_generation(&self) -> u64 {
        self.policy.borrow().users.generation()
    }

    /// The bandwidth limits of a connection on a listener limited by `listener`, of
    /// `user` (the policy in force decides the user's).
    pub(crate) fn throttle(
        &self,
        listener: &crate::limits::Throttle,
        user: Option<&str>,
    ) -> crate::limits::Throttle {
        self.policy.borrow().throttle(listener, user)
    }

    /// The policy in force, for one request or handshake (an `Rc` of the shared `Arc`,
    /// as `cfg`).
    #[allow(clippy::redundant_allocation)]
    pub(crate) fn policy(&self) -> Rc<Arc<Policy>> {
        self.policy.borrow().clone()
    }

    /// Checks a user name and password against the users in force (`auth::Gate`): the
    /// one place a name is taken apart. With `[auth.params]`, `alice-session-x7k2` is
    /// the user `alice` (its password checked, its cached check shared by every
    /// parameter) with parameters; they are refused only once the password has passed,
    /// so that the answer tells nobody else which users exist (`Gate::authenticate`).
    /// Gives the user (a prefix of `name`) and its parameters.
    pub(crate) async fn authenticate<'u>(
        &self,
        origin: crate::policy::auth::Origin<'_>,
        client: std::net::IpAddr,
        name: &'u str,
        password: &[u8],
    ) -> Result<(&'u str, Option<crate::acl::Params>), crate::error::Error> {
        use crate::error::Error;
        let policy = self.policy();
        crate::policy::auth::identity::clear_login();
        let by = crate::policy::auth::Sources {
            users: &policy.users,
            declared: policy.params.as_ref(),
            chain: &policy.backends,
        };
        let checked = self.auth.authenticate(by, origin, client, name, password);
        match checked.await {
            Ok((user, Ok(params))) => Ok((user, params)),
            Ok((_, Err(e))) => Err(Error::AuthParams(e.to_string().into())),
            Err(Refusal::RateLimited) => Err(Error::AuthRateLimited),
            Err(Refusal::Wrong) => Err(Error::AuthRequired("unknown user or wrong password")),
            Err(Refusal::Busy) => Err(Error::AuthBusy),
            Err(Refusal::Unavailable) => Err(Error::AuthUnavailable),
        }
    }

    /// Checks a `Proxy-Authorization: Negotiate <base64>` value with `[auth.kerberos]`'s
    /// acceptor: gives the user the ticket names (realm stripped if so configured). A
    /// refusal is logged with its reason (never the token), answered 407 naming it, and
    /// counted against the client's failed attempts (429 beyond them, as for passwords).
    /// CPU only (two AES decryptions): no thread, no network.
    pub(crate) fn negotiate(
        &self,
        client: std::net::IpAddr,
        value: &[u8],
    ) -> Result<String, crate::error::Error> {
        use crate::error::Error;
        let policy = self.policy();
        let value = value.trim_ascii();
        let (scheme, token) =
            value.split_at(value.iter().position(|&b| b == b' ').unwrap_or(value.len()));
        let acceptor = match &policy.negotiate {
            Some(a) if scheme.eq_ignore_ascii_case(b"Negotiate") => a,
            _ => return Err(Error::AuthRequired("malformed Proxy-Authorization")),
        };
        if !self.auth.may_try(client) {
            return Err(Error::AuthRateLimited);
        }
        use base64::Engine;
        let accepted = base64::engine::general_purpose::STANDARD
            .decode(token.trim_ascii())
            .map_err(|_| "the token is not base64".to_string())
            .and_then(|token| acceptor.accept(&token));
        match accepted {
            Ok(a) => Ok(a.user),
            Err(why) => {
                self.auth.failed(client);
                tracing::info!(%client, "Negotiate refused: {why}");
                Err(Error::AuthNegotiate(why.into()))
            }
        }
    }

    /// Completes the TLS handshake of a client of `listener` whose first bytes are in
    /// `buf` (`tls::accept`, with the listener's certificates in force).
    pub(crate) async fn accept_tls(
        &self,
        listener: &crate::policy::Listener,
        stream: tokio::net::TcpStream,
        buf: Buf,
        deadline: tokio::time::Instant,
    ) -> Result<crate::io::tls::Accepted, String> {
        let policy = self.policy();
        let Some(acceptor) = policy.tls_acceptor(&listener.key).cloned() else {
            self.give_buf(buf);
            return Err("a TLS ClientHello on a port without [listener.tls]".into());
        };
        drop(policy);
        let accepted =
            crate::io::tls::accept(&acceptor, stream, buf, |b| self.give_buf(b), deadline).await;
        crate::telemetry::metrics::tls_handshake(&listener.counters, accepted.is_ok());
        accepted
    }

    /// Relay settings for a tunnel accepted on a listener with this splice mode.
    pub(crate) fn relay_opts(&self, splice: crate::config::SpliceMode) -> crate::io::relay::Opts {
        let cfg = self.cfg();
        let r = &cfg.relay;
        crate::io::relay::Opts {
            idle: cfg.timeouts.tunnel_idle,
            splice,
            grace: (r.grace_reads > 0)
                .then_some(crate::io::relay::Grace { reads: r.grace_reads, delay: r.grace_delay }),
        }
    }

    /// A response head's field list from the worker's spares (a fresh one when there is
    /// none): parsing a response then allocates nothing, and an idle connection keeps none.
    pub(crate) fn take_fields(&self) -> Vec<rustle_proto::http::Header> {
        self.fields.borrow_mut().pop().unwrap_or_default()
    }

    pub(crate) fn give_fields(&self, mut fields: Vec<rustle_proto::http::Header>) {
        let mut spare = self.fields.borrow_mut();
        if spare.len() < MAX_SPARE_FIELDS && fields.capacity() <= MAX_KEPT_FIELDS {
            fields.clear();
            spare.push(fields);
        }
    }

    /// A buffer for outgoing heads (and the body bytes that go with them) from the
    /// worker's spares: a kept-alive connection gives its own back while it waits for its
    /// next request, so that an idle client holds none (otherwise each idle connection would
    /// keep a buffer as large as its last answer made it).
    pub(crate) fn take_out(&self) -> Vec<u8> {
        self.outs.borrow_mut().pop().unwrap_or_else(|| Vec::with_capacity(OUT_SIZE))
    }

    pub(crate) fn give_out(&self, mut out: Vec<u8>) {
        let mut spare = self.outs.borrow_mut();
        if out.capacity() > 0 && spare.len() < MAX_SPARE_OUTS && out.capacity() <= MAX_KEPT_OUT {
            out.clear();
            spare.push(out);
        }
    }

    pub(crate) fn take_buf(&self) -> Buf {
        let mut bufs = self.bufs.borrow_mut();
        let buf = bufs.pop().unwrap_or_else(Buf::with_storage);
        self.bufs_low.set(self.bufs_low.get().min(bufs.len()));
        buf
    }

    /// Frees the spare buffers that went unused since the last trim (run every second),
    /// so the pool follows the load down; when that freed a burst's worth (256 KiB or
    /// more), or when `parked` (since the last call) adds up to many parked tunnels, whose
    /// tasks were freed, the allocator is asked to give its free pages back, so that RSS
    /// follows too.
    pub(crate) fn trim_bufs(&self, parked: usize) {
        let mut bufs = self.bufs.borrow_mut();
        let unused = self.bufs_low.get().min(bufs.len());
        let keep = bufs.len() - unused;
        bufs.truncate(keep);
        bufs.shrink_to(keep.max(16));
        self.bufs_low.set(bufs.len());
        drop(bufs);
        // At most every 10 s: a load that swings would otherwise give pages back and fault
        // them in again every second, and glibc's trim walks every arena. Parked tunnels
        // count once there are many (each freed about a kilobyte): a burst of them is
        // given back within a second or two, a trickle of parking waits.
        let now = Instant::now();
        let since = now.duration_since(self.released.get());
        let parked = self.parked_untrimmed.get() + parked;
        if (unused >= 16 && since >= RELEASE_EVERY)
            || (parked >= PARKED_TO_RELEASE && since >= Duration::from_secs(1))
        {
            self.released.set(now);
            self.parked_untrimmed.set(0);
            crate::io::sys::release_free_memory();
        } else {
            self.parked_untrimmed.set(parked);
        }
    }

    pub(crate) fn give_buf(&self, mut buf: Buf) {
        let mut bufs = self.bufs.borrow_mut();
        if bufs.len() < MAX_SPARE_BUFS && buf.capacity() == crate::io::buf::READ_SIZE {
            buf.clear();
            bufs.push(buf);
        }
    }
}

fn head_limits(cfg: &Config) -> rustle_proto::http::Limits {
    rustle_proto::http::Limits {
        max_head: cfg.limits.max_header_bytes,
        max_headers: cfg.limits.max_headers,
    }
}

impl ConnGuard {
    pub(crate) fn worker(&self) -> &Rc<Worker> {
        &self.worker
    }

    /// The listener the connection came from.
    pub(crate) fn listener(&self) -> &Arc<crate::policy::Listener> {
        &self.listener
    }

    /// The shared entry of the user `hold_user` held the connection for (no lock: the
    /// worker's own table).
    pub(crate) fn user_entry(&self) -> Option<Arc<crate::limits::UserTraffic>> {
        let slot = self.slots.as_ref()?.cut?;
        self.worker.cuts.entry(slot)
    }

    /// The connection's socket is about to close while parts of it may live on (HTTP/2
    /// streams): its slot in the worker's `cuts` is released, so that no sweep shuts
    /// down the descriptor number once the kernel gives it to another connection.
    pub(crate) fn release_cut(&mut self) {
        if let Some(slot) = self.slots.as_mut().and_then(|s| s.cut.take()) {
            self.worker.cuts.release(slot);
        }
    }

    /// Counts this connection from `client` against `user`'s limits (once per
    /// connection): its client addresses and its connections. The first call also counts
    /// the connection as the user's in the metrics (the one allocation an authenticated
    /// connection adds: its slots), and holds its client socket `fd` for cutting (`cut`;
    /// -1: none). The descriptor is given here rather than kept in the guard, which every
    /// tunnel task holds.
    pub(crate) fn hold_user(
        &mut self,
        user: &str,
        client: std::net::IpAddr,
        fd: std::os::fd::RawFd,
    ) -> Result<(), crate::error::Error> {
        use crate::error::Error;
        let held = |s: &Slots| {
            s.user.is_some() || s.user_conn.is_some() || s.address.is_some() || s.cut.is_some()
        };
        if self.slots.as_deref().is_some_and(held) {
            return Ok(());
        }
        // The fleet thread logs the loss once; each refusal has its access-log line.
        if self.worker.conn_limits.state_lost() {
            return Err(Error::StateLost);
        }
        // Read before the flag (see `limits::cut`): a cut after this read ends it.
        let entry = self.worker.traffic.entry(user);
        let generation = entry.generation();
        if entry.is_cut() {
            return Err(refused_cut(&entry));
        }
        if let Some(why) = self.worker.policy().refused_as(user) {
            return Err(Error::UserCut(why.to_string().into()));
        }
        let address = match self.worker.policy().client_addresses(user) {
            Some(limit) => Some(self.worker.admit_address(user, client, limit)?),
            None => None,
        };
        // A user an external backend accepted: the limit it granted, and its accounting.
        // This connection's own login (taken right after it, no await between).
        let backend = match self.worker.policy().backends.is_empty() {
            true => None,
            false => crate::policy::auth::identity::take_login(user),
        };
        if let Some(max) = backend.as_ref().and_then(|i| i.grant.max_connections) {
            // Relaxed: the count across workers, as the metrics read it.
            if entry.open.load(Ordering::Relaxed) >= u64::from(max) {
                return Err(Error::LimitReached("for this user"));
            }
        }
        let slot = self.worker.conn_limits.acquire_user(user);
        let slot = slot.ok_or(Error::LimitReached("for this user"))?;
        let slots = self.slots.get_or_insert_with(Box::default);
        if let Some(i) = backend.filter(|i| i.slot.interim.is_some()) {
            use crate::policy::auth::backend::{AcctHold, Session};
            let class = i.grant.class.clone();
            slots._acct = AcctHold::open(Session::new(i.slot, user, client, class, entry.clone()));
        }
        if slot.counts() {
            slots.user = Some(slot);
        }
        slots.address = address;
        slots.user_conn = crate::telemetry::metrics::user_connection(user);
        if fd >= 0 {
            slots.cut = Some(self.worker.cuts.hold(entry, fd, generation));
        }
        Ok(())
    }
}

/// The refusal of a new connection of a cut user: why it is cut.
#[cold]
fn refused_cut(entry: &crate::limits::UserTraffic) -> crate::error::Error {
    let why = entry.cut_reason().map_or_else(|| "user disabled".into(), |c| c.to_string());
    crate::error::Error::UserCut(why.into())
}
