//! External backends: where a name and password not settled by the users file are checked
//! (`[[auth.backend]]`): an HTTP callback, an LDAP directory, RADIUS servers. Their calls
//! run on the process's `rustle-auth` thread (its own current-thread runtime), never on a
//! worker's loop; a worker asks through `Backends::check` and its credential cache fronts
//! every backend.

use std::cell::RefCell;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::config::BackendConfig;

pub(crate) mod http;
pub(crate) mod ldap;
pub(crate) mod radius;

/// What a backend is asked: the credentials and where they came from.
#[derive(Clone)]
pub(crate) struct Ask {
    pub(crate) user: String,
    pub(crate) password: Vec<u8>,
    pub(crate) client: IpAddr,
    /// The listener's name (or its address when it has none).
    pub(crate) listener: String,
    /// The protocol the client speaks (`http`, `https`, `connect`, `socks5`, ...).
    pub(crate) protocol: &'static str,
    /// `host:port` the client wants, when known at authentication.
    pub(crate) target: Option<String>,
}

impl std::fmt::Debug for Ask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Ask")
            .field("user", &self.user)
            .field("client", &self.client)
            .field("listener", &self.listener)
            .field("protocol", &self.protocol)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// What an accepting backend says of the user, beyond yes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Grant {
    /// Groups, as the users file's groups: rules and routes see them.
    pub(crate) groups: Vec<String>,
    /// The outgoing address for this user's connections (RADIUS Framed-IP-Address, the
    /// callback's `egress`).
    pub(crate) egress: Option<IpAddr>,
    /// Connections the user may have open at once.
    pub(crate) max_connections: Option<u32>,
    /// Bytes a second each way.
    pub(crate) bandwidth: Option<u64>,
    /// How long the answer holds (RADIUS Session-Timeout, the callback's `ttl`), when
    /// shorter than the backend's `cache_ttl`.
    pub(crate) ttl: Option<Duration>,
    /// RADIUS Class, echoed in accounting.
    pub(crate) class: Option<Vec<u8>>,
}

/// A backend's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Allow(Grant),
    /// A known user with a wrong password, or one the backend refuses (disabled).
    Deny,
    /// No such user here: the next backend is asked.
    Unknown,
}

/// A call that gave no answer: the user is refused (fail closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Failure {
    #[error("unreachable: {0}")]
    Unreachable(String),
    #[error("no answer within the timeout")]
    Timeout,
    #[error("{0}")]
    Protocol(String),
    /// Too many calls at once here (the backend's `max_in_flight`, the rustle-auth
    /// thread's queue): the backend itself may be fine.
    #[error("too many calls in flight")]
    Overloaded,
}

/// Whether a backend's group name is one rules and routes can name: 1 to 255 bytes, no
/// control character, whitespace or comma.
pub(crate) fn valid_group(g: &str) -> bool {
    !g.is_empty()
        && g.len() <= 255
        && !g.chars().any(|c| c.is_control() || c.is_whitespace() || c == ',')
}

/// One RADIUS accounting record of a session (a client connection of a RADIUS user).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AcctRecord {
    pub(crate) kind: AcctKind,
    /// Acct-Session-Id: unique per session, the same in its Start, Interims and Stop.
    pub(crate) session_id: String,
    pub(crate) user: String,
    pub(crate) client: IpAddr,
    /// Bytes from the client (Acct-Input-Octets) and to it (Acct-Output-Octets) so far.
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    /// Seconds since the session began (Acct-Session-Time).
    pub(crate) secs: u32,
    pub(crate) class: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcctKind {
    Start,
    Interim,
    Stop,
}

/// One external backend, built from its settings.
pub(crate) enum Backend {
    Http(http::Http),
    Ldap(ldap::Ldap),
    Radius(radius::Radius),
}

impl Backend {
    /// The backend `cfg` describes; none for `file`.
    pub(crate) fn build(cfg: &BackendConfig) -> Result<Option<Backend>, String> {
        Ok(Some(match cfg {
            BackendConfig::File(_) => return Ok(None),
            BackendConfig::Http(c) => Backend::Http(http::Http::new(c)?),
            BackendConfig::Ldap(c) => Backend::Ldap(ldap::Ldap::new(c)?),
            BackendConfig::Radius(c) => Backend::Radius(radius::Radius::new(c)?),
        }))
    }

    /// Asks the backend; runs on the `rustle-auth` thread's runtime.
    pub(crate) async fn check(&self, ask: &Ask) -> Result<Verdict, Failure> {
        match self {
            Backend::Http(b) => b.check(ask).await,
            Backend::Ldap(b) => b.check(ask).await,
            Backend::Radius(b) => b.check(ask).await,
        }
    }
}

/// One configured external backend, shared by every policy whose settings for it are the
/// same (`Chain::build` reuses it: its pool, its state, its cached answers' validity).
pub(crate) struct Slot {
    pub(crate) common: crate::config::BackendCommon,
    pub(crate) backend: Backend,
    /// What the workers' cached answers of this backend are valid for: a backend built
    /// again (its settings changed) has another, so that a reload drops only its answers.
    pub(crate) generation: u64,
    /// RADIUS: the Interim-Update cadence; None: no accounting.
    pub(crate) interim: Option<Duration>,
    /// The backend answered its last call (false: failing; logged once per change).
    up: AtomicBool,
    pub(crate) stats: SlotStats,
}

/// A backend's counters (relaxed atomics, for `/metrics`).
#[derive(Debug, Default)]
pub(crate) struct SlotStats {
    pub(crate) allowed: AtomicU64,
    pub(crate) denied: AtomicU64,
    pub(crate) unknown: AtomicU64,
    pub(crate) failed: AtomicU64,
    /// Answers the workers gave from their caches, not calling.
    pub(crate) cached: AtomicU64,
    /// Accounting records sent and those that got no response.
    pub(crate) acct_sent: AtomicU64,
    pub(crate) acct_failed: AtomicU64,
}

impl Slot {
    /// Whether the backend answered its last call.
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Counts `result` and logs a change between answering and failing, once per change.
    fn note(&self, result: &Result<Verdict, Failure>) {
        let counter = match result {
            Ok(Verdict::Allow(_)) => &self.stats.allowed,
            Ok(Verdict::Deny) => &self.stats.denied,
            Ok(Verdict::Unknown) => &self.stats.unknown,
            Err(_) => &self.stats.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        // Overload here says nothing of the backend.
        if matches!(result, Err(Failure::Overloaded)) {
            return;
        }
        let up = result.is_ok();
        if self.up.swap(up, Ordering::Relaxed) != up {
            match result {
                Err(e) => tracing::warn!(
                    backend = %self.common.name,
                    "auth backend failing: {e}; its users are refused until it answers"
                ),
                Ok(_) => tracing::info!(backend = %self.common.name, "auth backend answers again"),
            }
        }
    }
}

/// One place in the order of `[[auth.backend]]`.
#[derive(Clone)]
pub(crate) enum Link {
    /// The users file and `[[auth.user]]`.
    File,
    External(Arc<Slot>),
}

/// The backends in order. Empty when only the users file is used (no `[[auth.backend]]`
/// other than `file`): the path of a users-file user is then what it always was.
#[derive(Clone, Default)]
pub(crate) struct Chain {
    links: Vec<Link>,
    /// `[auth] refusal_delay`.
    pub(crate) refusal_delay: Duration,
}

/// The backends built so far, by their settings: a policy built again (a reload, an API
/// change) reuses those whose settings did not change.
static BUILT: Mutex<Vec<(BackendConfig, Arc<Slot>)>> = Mutex::new(Vec::new());
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

impl Chain {
    /// The chain `[[auth.backend]]` describes (the users file first when not listed).
    /// Backends whose settings match one built before are reused.
    pub(crate) fn build(
        cfgs: &[BackendConfig],
        refusal_delay: Duration,
    ) -> Result<Chain, Vec<String>> {
        if cfgs.iter().all(|c| matches!(c, BackendConfig::File(_))) {
            return Ok(Chain::default());
        }
        let mut problems = Vec::new();
        let mut links = Vec::new();
        if !cfgs.iter().any(|c| matches!(c, BackendConfig::File(_))) {
            links.push(Link::File);
        }
        let mut built = BUILT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut kept = Vec::new();
        let mut names = std::collections::HashSet::new();
        for cfg in cfgs {
            let Some(common) = cfg.common() else {
                links.push(Link::File);
                continue;
            };
            let fine = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
            if common.name.is_empty() || common.name.len() > 64 || !common.name.chars().all(fine) {
                problems.push(format!(
                    "auth.backend `{}`: a name is 1 to 64 letters, digits, `-`, `_` or `.`",
                    common.name
                ));
                continue;
            }
            if !names.insert(common.name.clone()) {
                problems.push(format!(
                    "auth.backend `{}`: two backends have this name (set `name`)",
                    common.name
                ));
                continue;
            }
            let slot = match built.iter().find(|(c, _)| c == cfg) {
                Some((_, slot)) => slot.clone(),
                None => match Backend::build(cfg) {
                    Ok(Some(backend)) => Arc::new(Slot {
                        interim: interim_of(cfg),
                        common,
                        backend,
                        generation: NEXT_GENERATION.fetch_add(1, Ordering::Relaxed),
                        up: AtomicBool::new(true),
                        stats: SlotStats::default(),
                    }),
                    Ok(None) => continue,
                    Err(e) => {
                        problems.push(format!("auth.backend `{}`: {e}", common.name));
                        continue;
                    }
                },
            };
            kept.push((cfg.clone(), slot.clone()));
            links.push(Link::External(slot));
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        // The running policy's backends stay built with their answers until it is
        // replaced; those of older policies go.
        let running: Vec<_> = std::mem::take(&mut *built);
        built.extend(kept);
        for (cfg, slot) in running {
            if !built.iter().any(|(c, _)| *c == cfg) && built.len() < 64 {
                built.push((cfg, slot));
            }
        }
        Ok(Chain { links, refusal_delay })
    }

    /// Whether any external backend is configured.
    pub(crate) fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    pub(crate) fn links(&self) -> &[Link] {
        &self.links
    }

    /// The external backends.
    pub(crate) fn slots(&self) -> impl Iterator<Item = &Arc<Slot>> {
        self.links.iter().filter_map(|l| match l {
            Link::External(s) => Some(s),
            Link::File => None,
        })
    }

    /// The backend whose answers carry `generation`, if it is in this chain.
    pub(crate) fn slot_of(&self, generation: u64) -> Option<&Arc<Slot>> {
        self.slots().find(|s| s.generation == generation)
    }
}

fn interim_of(cfg: &BackendConfig) -> Option<Duration> {
    match cfg {
        BackendConfig::Radius(r) => r.accounting_interval(),
        _ => None,
    }
}

/// A check for the `rustle-auth` thread.
struct Check {
    slot: Arc<Slot>,
    ask: Ask,
    reply: oneshot::Sender<Result<Verdict, Failure>>,
}

/// Accounting work for the `rustle-auth` thread: never refused (a lost Close would leave
/// its session open for ever), bounded by the connections that send it.
enum SessionJob {
    Open(Box<Session>),
    Close {
        generation: u64,
        user: String,
    },
    /// Every open session's Stop, and the answer once all accounting sent is answered
    /// (the process is ending).
    StopAll(std::sync::mpsc::Sender<()>),
}

/// Checks queued or running on the `rustle-auth` thread, across workers: beyond them a
/// call fails at once (each backend bounds its own calls in flight below this).
const QUEUE: usize = 4096;

/// Checks sent and not yet answered.
static LIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

type Senders = (mpsc::Sender<Check>, mpsc::UnboundedSender<SessionJob>);
static THREAD: OnceLock<Result<Senders, String>> = OnceLock::new();

fn thread() -> Result<&'static Senders, Failure> {
    let started = THREAD.get_or_init(|| {
        let (tx, rx) = mpsc::channel(QUEUE);
        let (stx, srx) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("rustle-auth".into())
            .spawn(move || run(rx, srx))
            .map(|_| (tx, stx))
            .map_err(|e| format!("cannot start the rustle-auth thread: {e}"))
    });
    started.as_ref().map_err(|e| Failure::Unreachable(e.clone()))
}

/// Asks `slot`'s backend on the `rustle-auth` thread, within its timeout.
pub(crate) async fn call(slot: &Arc<Slot>, ask: Ask) -> Result<Verdict, Failure> {
    let (reply, answer) = oneshot::channel();
    let tx = &thread()?.0;
    if LIVE.fetch_add(1, Ordering::Relaxed) >= QUEUE
        || tx.try_send(Check { slot: slot.clone(), ask, reply }).is_err()
    {
        LIVE.fetch_sub(1, Ordering::Relaxed);
        slot.note(&Err(Failure::Overloaded));
        return Err(Failure::Overloaded);
    }
    answer.await.unwrap_or_else(|_| Err(Failure::Unreachable("rustle-auth thread gone".into())))
}

fn run(mut rx: mpsc::Receiver<Check>, mut sessions_rx: mpsc::UnboundedReceiver<SessionJob>) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("rustle-auth: no runtime: {e}; external authentication refuses all");
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let sessions = Rc::new(RefCell::new(Sessions::default()));
        tokio::task::spawn_local(interims(sessions.clone()));
        loop {
            tokio::select! {
                check = rx.recv() => {
                    let Some(Check { slot, ask, reply }) = check else { break };
                    tokio::task::spawn_local(async move {
                        let timeout = slot.common.timeout;
                        let result = tokio::time::timeout(timeout, slot.backend.check(&ask))
                            .await
                            .unwrap_or(Err(Failure::Timeout));
                        slot.note(&result);
                        LIVE.fetch_sub(1, Ordering::Relaxed);
                        let _ = reply.send(result);
                    });
                }
                job = sessions_rx.recv() => match job {
                    Some(SessionJob::Open(session)) => sessions.borrow_mut().open(*session),
                    Some(SessionJob::Close { generation, user }) => {
                        if let Some(s) = sessions.borrow_mut().close(generation, user) {
                            tokio::task::spawn_local(account(s, AcctKind::Stop));
                        }
                    }
                    Some(SessionJob::StopAll(done)) => {
                        let open: Vec<Session> =
                            sessions.borrow_mut().by_user.drain().map(|(_, s)| s).collect();
                        for s in open {
                            tokio::task::spawn_local(account(s, AcctKind::Stop));
                        }
                        tokio::task::spawn_local(async move {
                            while PENDING.with(|p| p.get()) > 0 {
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                            let _ = done.send(());
                        });
                    }
                    None => break,
                },
            }
        }
    });
}

/// A RADIUS-accounted user's session: from its first open connection in this process to
/// the end of its last.
pub(crate) struct Session {
    pub(crate) slot: Arc<Slot>,
    pub(crate) user: String,
    pub(crate) client: IpAddr,
    pub(crate) class: Option<Vec<u8>>,
    /// The user's counters: the session's bytes are what they gained since it began.
    pub(crate) traffic: Arc<crate::limits::UserTraffic>,
    id: String,
    began: Instant,
    base: (u64, u64),
    last_interim: Instant,
    /// Connections open in the session.
    open: u32,
}

impl Session {
    pub(crate) fn new(
        slot: Arc<Slot>,
        user: &str,
        client: IpAddr,
        class: Option<Vec<u8>>,
        traffic: Arc<crate::limits::UserTraffic>,
    ) -> Session {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let base = (traffic.up.load(Ordering::Relaxed), traffic.down.load(Ordering::Relaxed));
        let now = Instant::now();
        Session {
            slot,
            user: user.to_string(),
            client,
            class,
            traffic,
            id: format!("{:08x}{:04x}{:06x}", stamp, std::process::id() & 0xffff, n & 0xff_ffff),
            began: now,
            base,
            last_interim: now,
            open: 1,
        }
    }

    fn record(&self, kind: AcctKind) -> AcctRecord {
        let up = self.traffic.up.load(Ordering::Relaxed).saturating_sub(self.base.0);
        let down = self.traffic.down.load(Ordering::Relaxed).saturating_sub(self.base.1);
        AcctRecord {
            kind,
            session_id: self.id.clone(),
            user: self.user.clone(),
            client: self.client,
            bytes_in: up,
            bytes_out: down,
            secs: u32::try_from(self.began.elapsed().as_secs()).unwrap_or(u32::MAX),
            class: self.class.clone(),
        }
    }
}

/// Open sessions by backend (its generation: a backend built again after a reload has
/// sessions of its own) and user.
#[derive(Default)]
struct Sessions {
    by_user: std::collections::HashMap<(u64, String), Session>,
}

impl Sessions {
    fn open(&mut self, s: Session) {
        let key = (s.slot.generation, s.user.clone());
        match self.by_user.get_mut(&key) {
            Some(open) => open.open += 1,
            None => {
                let start = s.record(AcctKind::Start);
                let slot = s.slot.clone();
                tokio::task::spawn_local(async move { send(&slot, &start).await });
                self.by_user.insert(key, s);
            }
        }
    }

    fn close(&mut self, generation: u64, user: String) -> Option<Session> {
        let key = (generation, user);
        let s = self.by_user.get_mut(&key)?;
        s.open = s.open.saturating_sub(1);
        match s.open {
            0 => self.by_user.remove(&key),
            _ => None,
        }
    }
}

async fn account(s: Session, kind: AcctKind) {
    send(&s.slot, &s.record(kind)).await
}

thread_local! {
    /// Accounting records being sent on the rustle-auth thread.
    static PENDING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Sends the Stop of every open accounting session and waits, at most `limit`, for the
/// records sent to be answered. Called at the end of the process, once the workers ended.
pub(crate) fn stop_sessions(limit: Duration) {
    let Some(Ok((_, tx))) = THREAD.get() else { return };
    let (done, wait) = std::sync::mpsc::channel();
    if tx.send(SessionJob::StopAll(done)).is_ok() {
        let _ = wait.recv_timeout(limit);
    }
}

async fn send(slot: &Slot, rec: &AcctRecord) {
    let Backend::Radius(r) = &slot.backend else { return };
    slot.stats.acct_sent.fetch_add(1, Ordering::Relaxed);
    PENDING.with(|p| p.set(p.get() + 1));
    let sent = r.account(rec).await;
    PENDING.with(|p| p.set(p.get() - 1));
    if let Err(e) = sent {
        slot.stats.acct_failed.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(backend = %slot.common.name, user = %rec.user, "accounting record lost: {e}");
    }
}

/// Interim-Update of each session whose interval has passed, checked every second.
async fn interims(sessions: Rc<RefCell<Sessions>>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let now = Instant::now();
        let mut due = Vec::new();
        for s in sessions.borrow_mut().by_user.values_mut() {
            if let Some(every) = s.slot.interim {
                if now.duration_since(s.last_interim) >= every {
                    s.last_interim = now;
                    due.push((s.slot.clone(), s.record(AcctKind::Interim)));
                }
            }
        }
        for (slot, rec) in due {
            tokio::task::spawn_local(async move { send(&slot, &rec).await });
        }
    }
}

/// Held by a connection of a RADIUS-accounted user: the session's Start goes with the
/// first, its Stop with the drop of the last.
pub(crate) struct AcctHold {
    generation: u64,
    user: String,
}

impl AcctHold {
    /// Opens (or joins) `session`'s user's session; None when the thread is not there.
    pub(crate) fn open(session: Session) -> Option<AcctHold> {
        let (generation, user) = (session.slot.generation, session.user.clone());
        thread().ok()?.1.send(SessionJob::Open(Box::new(session))).ok()?;
        Some(AcctHold { generation, user })
    }
}

impl Drop for AcctHold {
    fn drop(&mut self) {
        if let Ok((_, tx)) = thread() {
            let user = std::mem::take(&mut self.user);
            // Fails only with the thread gone (and its sessions with it).
            let _ = tx.send(SessionJob::Close { generation: self.generation, user });
        }
    }
}
