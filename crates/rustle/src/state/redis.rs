//! The Redis backend: what a fleet of instances shares through one Redis (6 or 7) or Valkey
//! server. Quota usage (`add_usage`: counters added to in batches, the fleet's totals
//! back, a batch sent again not counted twice; `raise_usage`: what an instance knows given
//! back to a Redis that lost it), sticky sessions (`sticky_get_or_set`: the first instance
//! to set a session's value wins), per-user connection counts (`publish_conns`,
//! `conn_counts`: each instance's count in a hash field, ignored once the instance's lease
//! has expired) and client addresses (`touch_addrs`: a sorted set per user, checked and
//! updated by one script).
//!
//! A `Fleet` is driven by the state keeper's thread on its own current-thread runtime: a
//! call is a round trip, never made on a worker's request path. It connects lazily, on the
//! first call, and again after a failure, not sooner than a backoff that doubles up to
//! `BACKOFF_MAX`; while it waits, calls fail at once without I/O. A connection or a reply
//! that takes too long fails the call (`CONNECT_TIMEOUT`, `RESPONSE_TIMEOUT`). Its health
//! (up or down, since when) and what it sent (commands, bytes) are kept in `Status`,
//! shared with whoever reports them (`/metrics`, `/readyz`, the benchmark); each change of
//! health is logged once.
//!
//! Keys: `{key_prefix}usage:{quota}:{user}:{period start}`, `sticky:{key}`,
//! `conns:{user}` (a hash: instance → count), `instance:{id}` (an instance's lease),
//! `addrs:{user}` (a sorted set: address → last seen, in ms of the server's clock),
//! `batch:{instance}:{n}` (a batch of additions counted). Quota and user names are escaped
//! (`%` and `:`) so that no two keys meet. Scripts touch keys they are not given (`conns`
//! reads the leases), so Redis Cluster is not supported.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, FromRedisValue, IntoConnectionInfo};

use crate::config::{OnStateLoss, StateRedis};
use scripts::{Script, ADD, ADDRS, CONNS, FLEET_ADDRS, PUBLISH, RAISE, STICKY, SYNC_CONNS};

/// A connection attempt gives up after this: the keeper goes on with its local counts
/// rather than wait, and a server on the same network answers in well under it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// A reply that takes longer fails the call and drops the connection (a stopped or
/// overloaded server): the keeper's next flush tries again on a new one.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a counted batch is remembered (so that sending it again counts nothing): far
/// longer than a keeper retries one.
const BATCH_MEMORY: Duration = Duration::from_secs(600);
/// The first wait before connecting again after a failure.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest wait between connection attempts: a returning server is in use again
/// within it, and an absent one costs one attempt per this.
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The settings cannot be used (a file that cannot be read, a URL Redis refuses).
    #[error("[state] {0}")]
    Config(String),
    /// No connection: connecting failed or is waiting out its backoff, or the connection
    /// broke or timed out during the call.
    #[error("Redis at {addr} is unreachable: {reason}")]
    Down { addr: Arc<str>, reason: String },
    /// Redis answered with an error (the connection is fine).
    #[error("Redis at {addr} refused a command: {reason}")]
    Reply { addr: Arc<str>, reason: String },
}

/// A quota's counter: one user's usage of one quota in the period starting at `start`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct UsageKey<'a> {
    pub(crate) quota: &'a str,
    pub(crate) user: &'a str,
    /// The period's start, in seconds since the Unix epoch.
    pub(crate) start: u64,
}

/// An amount for a counter (added to it, or the least it is raised to), and how long the
/// counter is kept after it (the period's end plus a margin, from now).
#[derive(Debug, Clone)]
pub(crate) struct Usage<'a> {
    pub(crate) key: UsageKey<'a>,
    pub(crate) amount: u64,
    pub(crate) ttl: Duration,
}

/// Health and traffic of a `Fleet`, shared with the threads that report them.
#[derive(Debug, Default)]
pub(crate) struct Status {
    up: AtomicBool,
    /// When `up` last changed (or the fleet was made), in ms since the Unix epoch.
    since_ms: AtomicU64,
    commands: AtomicU64,
    bytes: AtomicU64,
    failures: AtomicU64,
}

/// What a `Fleet` had sent at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Counts {
    /// Commands sent (a script call is one).
    pub(crate) commands: u64,
    /// Bytes of the commands, as encoded on the wire (before TLS).
    pub(crate) bytes: u64,
    /// Calls that failed (no connection, timeout, an error reply).
    pub(crate) failures: u64,
}

impl Counts {
    /// Commands and bytes per second between `earlier` and this, `elapsed` apart.
    pub(crate) fn per_second(&self, earlier: &Counts, elapsed: Duration) -> (f64, f64) {
        let secs = elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
        (
            self.commands.saturating_sub(earlier.commands) as f64 / secs,
            self.bytes.saturating_sub(earlier.bytes) as f64 / secs,
        )
    }
}

impl Status {
    /// Whether the last call reached Redis, and since when that has been so (down since
    /// the fleet was made, until a first call reaches it).
    pub(crate) fn health(&self) -> (bool, SystemTime) {
        let since = UNIX_EPOCH + Duration::from_millis(self.since_ms.load(Relaxed));
        (self.up.load(Relaxed), since)
    }

    pub(crate) fn counts(&self) -> Counts {
        Counts {
            commands: self.commands.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            failures: self.failures.load(Relaxed),
        }
    }

    /// Records a change of health; true when it is one.
    fn set(&self, up: bool) -> bool {
        if self.up.swap(up, Relaxed) == up {
            return false;
        }
        self.since_ms.store(unix_ms(), Relaxed);
        true
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The connection, or when the next attempt may be made.
struct Link {
    conn: Option<MultiplexedConnection>,
    /// Counts the connections made, so that a call that saw one break does not drop a
    /// newer one.
    generation: u64,
    retry_at: Option<Instant>,
    /// Why the last attempt failed, for the calls that fail while waiting.
    reason: String,
}

/// The client of a fleet's shared state.
pub(crate) struct Fleet {
    client: Client,
    /// host:port, for messages (never the URL: it may hold a password).
    addr: Arc<str>,
    prefix: String,
    on_state_loss: OnStateLoss,
    /// This instance's name in `conns` hashes and its lease key.
    instance: String,
    link: tokio::sync::Mutex<Link>,
    /// The wait after the next failure, in ms: doubled by each failure up to
    /// `BACKOFF_MAX`, back to `BACKOFF_MIN` once a call succeeds.
    backoff_ms: AtomicU64,
    status: Arc<Status>,
    add: Script,
    raise: Script,
    sticky: Script,
    publish: Script,
    conns: Script,
    addrs: Script,
    sync_conns: Script,
    fleet_addrs: Script,
}

impl Fleet {
    /// A fleet client for `cfg`: reads the password file and the CA file now (a problem
    /// with them is an error), connects on the first call.
    pub(crate) fn connect(cfg: &StateRedis) -> Result<Fleet, Error> {
        let mut info = cfg
            .url
            .expose()
            .into_connection_info()
            .map_err(|e| Error::Config(format!("redis_url: {}", reason(&e))))?;
        let addr: Arc<str> = info.addr().to_string().into();
        let mut settings = info.redis_settings().clone().set_skip_set_lib_name();
        if let Some(path) = &cfg.password_file {
            settings = settings.set_password(password(path)?);
        }
        info = info.set_redis_settings(settings);
        let client = match &cfg.ca {
            None => Client::open(info),
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| {
                    Error::Config(format!("redis_ca: cannot read {}: {e}", path.display()))
                })?;
                let certs = redis::TlsCertificates { client_tls: None, root_cert: Some(pem) };
                Client::build_with_tls(info, certs)
            }
        }
        .map_err(|e| Error::Config(format!("redis_url: {}", reason(&e))))?;
        let status = Arc::new(Status::default());
        status.since_ms.store(unix_ms(), Relaxed);
        Ok(Fleet {
            client,
            addr,
            prefix: cfg.key_prefix.clone(),
            on_state_loss: cfg.on_state_loss,
            instance: instance_id(),
            link: tokio::sync::Mutex::new(Link {
                conn: None,
                generation: 0,
                retry_at: None,
                reason: "not connected yet".into(),
            }),
            backoff_ms: AtomicU64::new(millis(BACKOFF_MIN)),
            status,
            add: Script::new(ADD),
            raise: Script::new(RAISE),
            sticky: Script::new(STICKY),
            publish: Script::new(PUBLISH),
            conns: Script::new(CONNS),
            addrs: Script::new(ADDRS),
            sync_conns: Script::new(SYNC_CONNS),
            fleet_addrs: Script::new(FLEET_ADDRS),
        })
    }

    /// Health and traffic, for the threads that report them.
    pub(crate) fn status(&self) -> Arc<Status> {
        Arc::clone(&self.status)
    }

    /// host:port of the server (never the URL: it may hold a password).
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    pub(crate) fn on_state_loss(&self) -> OnStateLoss {
        self.on_state_loss
    }

    /// This instance's name in the fleet (host name, process id and a random part).
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    /// A round trip (`PING`): whether Redis answers, connecting if need be.
    pub(crate) async fn ping(&self) -> Result<(), Error> {
        let _: String = self.run(&redis::cmd("PING")).await?;
        Ok(())
    }

    /// Adds each amount to its counter (creating it), sets the counter's expiry, and
    /// returns the counters' totals after, in the batch's order: what the whole fleet has
    /// used. One round trip, one script (atomic). `batch` names the batch among this
    /// instance's: sent again with the same number after a failure whose outcome is
    /// unknown (a reply lost to a timeout), it is not counted twice, for
    /// `BATCH_MEMORY`; its totals come back all the same.
    pub(crate) async fn add_usage(
        &self,
        batch: u64,
        adds: &[Usage<'_>],
    ) -> Result<Vec<u64>, Error> {
        self.usage_script(&self.add, Some(batch), adds).await
    }

    /// Raises each counter to at least its amount (a counter above it is left alone),
    /// with its expiry, and returns the totals after: how an instance gives back what it
    /// knows of the fleet's usage to a Redis that lost it (restarted without
    /// persistence). One round trip, atomic.
    pub(crate) async fn raise_usage(&self, raises: &[Usage<'_>]) -> Result<Vec<u64>, Error> {
        self.usage_script(&self.raise, None, raises).await
    }

    async fn usage_script(
        &self,
        script: &Script,
        batch: Option<u64>,
        usages: &[Usage<'_>],
    ) -> Result<Vec<u64>, Error> {
        if usages.is_empty() {
            return Ok(Vec::new());
        }
        let mut keys = Vec::with_capacity(usages.len() + 1);
        let mut args = Vec::with_capacity(usages.len() * 2 + 1);
        if let Some(batch) = batch {
            keys.push(format!("{}batch:{}:{batch}", self.prefix, self.instance));
            args.push(millis(BATCH_MEMORY).to_string());
        }
        for u in usages {
            keys.push(self.usage_key(&u.key));
            args.push(u.amount.min(i64::MAX as u64).to_string());
            args.push(millis(u.ttl).max(1).to_string());
        }
        let totals: Vec<i64> = self.eval(script, &keys, &args).await?;
        Ok(totals.into_iter().map(|t| t.max(0) as u64).collect())
    }

    /// The counters' values (0 for one that does not exist), in the order given.
    pub(crate) async fn usage(&self, keys: &[UsageKey<'_>]) -> Result<Vec<u64>, Error> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut cmd = redis::cmd("MGET");
        for key in keys {
            cmd.arg(self.usage_key(key));
        }
        let values: Vec<Option<i64>> = self.run(&cmd).await?;
        Ok(values.into_iter().map(|v| v.unwrap_or(0).max(0) as u64).collect())
    }

    /// Sets a counter (a top-up sets a lower value), kept for `ttl`.
    pub(crate) async fn set_usage(
        &self,
        key: &UsageKey<'_>,
        value: u64,
        ttl: Duration,
    ) -> Result<(), Error> {
        let mut cmd = redis::cmd("SET");
        let value = value.min(i64::MAX as u64);
        cmd.arg(self.usage_key(key)).arg(value).arg("PX").arg(millis(ttl).max(1));
        let _: String = self.run(&cmd).await?;
        Ok(())
    }

    /// Removes a counter (a reset); true when it existed.
    pub(crate) async fn delete(&self, key: &UsageKey<'_>) -> Result<bool, Error> {
        let removed: u64 = self.run(redis::cmd("DEL").arg(self.usage_key(key))).await?;
        Ok(removed > 0)
    }

    /// The value of sticky session `key`: the one an instance set first and that has not
    /// expired, else `value`, set now for `ttl` (from first use: a later call does not
    /// extend it). Atomic, so every instance gets the same value for a session.
    pub(crate) async fn sticky_get_or_set(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<String, Error> {
        let key = format!("{}sticky:{key}", self.prefix);
        self.eval(&self.sticky, &[key], &[value.to_string(), millis(ttl).to_string()]).await
    }

    /// Publishes this instance's open connections per user (a count of 0 removes the
    /// user's field) and renews its lease for `lease`: the fleet stops counting this
    /// instance's connections once the lease expires without being renewed. One round
    /// trip; with no user, only the lease.
    pub(crate) async fn publish_conns(
        &self,
        counts: &[(&str, u64)],
        lease: Duration,
    ) -> Result<(), Error> {
        let mut keys = Vec::with_capacity(counts.len() + 1);
        keys.push(self.lease_key());
        let mut args = Vec::with_capacity(counts.len() + 2);
        args.push(self.instance.clone());
        args.push(millis(lease).max(1).to_string());
        for (user, count) in counts {
            keys.push(format!("{}conns:{}", self.prefix, escape(user)));
            args.push(count.to_string());
        }
        let _: u8 = self.eval(&self.publish, &keys, &args).await?;
        Ok(())
    }

    /// Ends this instance's lease at once (a clean stop): its counts stop counting now.
    pub(crate) async fn release(&self) -> Result<(), Error> {
        let _: u64 = self.run(redis::cmd("DEL").arg(self.lease_key())).await?;
        Ok(())
    }

    /// A user's open connections on every live instance of the fleet.
    pub(crate) async fn conn_counts(&self, user: &str) -> Result<u64, Error> {
        Ok(self.conn_counts_of(&[user]).await?.first().copied().unwrap_or(0))
    }

    /// `conn_counts` for several users in one round trip, in their order.
    pub(crate) async fn conn_counts_of(&self, users: &[&str]) -> Result<Vec<u64>, Error> {
        if users.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> =
            users.iter().map(|u| format!("{}conns:{}", self.prefix, escape(u))).collect();
        let leases = format!("{}instance:", self.prefix);
        self.eval(&self.conns, &keys, &[leases]).await
    }

    /// A user's client addresses `addrs` seen now: each one admitted (true) if it is one
    /// of the user's addresses already, or if the user has fewer than `max` (addresses
    /// idle for `ttl` forgotten first); refused (false) otherwise. One script: the check
    /// and the update are one step for the whole fleet.
    pub(crate) async fn touch_addrs(
        &self,
        user: &str,
        addrs: &[&str],
        ttl: Duration,
        max: u32,
    ) -> Result<Vec<bool>, Error> {
        let name = escape(user);
        let keys = [
            format!("{}addrs:{name}", self.prefix),
            format!("{}addrs-users", self.prefix),
            format!("{}addrs-ttl", self.prefix),
        ];
        let mut args = Vec::with_capacity(addrs.len() + 3);
        args.push(millis(ttl).max(1).to_string());
        args.push(max.to_string());
        args.push(name.into_owned());
        args.extend(addrs.iter().map(|a| a.to_string()));
        let admitted: Vec<u8> = self.eval(&self.addrs, &keys, &args).await?;
        Ok(admitted.into_iter().map(|a| a == 1).collect())
    }

    /// A whole tick of connection counts in one round trip: this instance's open
    /// connections per user published (a user not given has none here) with its lease
    /// renewed for `lease`, then every user's total over the fleet's live instances
    /// (users with none left out), this instance's included.
    pub(crate) async fn sync_conns(
        &self,
        counts: &[(&str, u64)],
        lease: Duration,
    ) -> Result<Vec<(String, u64)>, Error> {
        let keys = [self.lease_key(), format!("{}conns-users", self.prefix)];
        let mut args = Vec::with_capacity(counts.len() * 2 + 4);
        args.push(self.instance.clone());
        args.push(millis(lease).max(1).to_string());
        args.push(format!("{}instance:", self.prefix));
        args.push(format!("{}conns:", self.prefix));
        for (user, count) in counts {
            args.push(escape(user).into_owned());
            args.push(count.to_string());
        }
        let flat: Vec<String> = self.eval(&self.sync_conns, &keys, &args).await?;
        let mut out = Vec::with_capacity(flat.len() / 2);
        for pair in flat.chunks_exact(2) {
            out.push((unescape(&pair[0]), pair[1].parse().unwrap_or(0)));
        }
        Ok(out)
    }

    /// Every user's client addresses seen by the fleet (`touch_addrs`) within the user's
    /// TTL, one round trip.
    pub(crate) async fn fleet_addrs(&self) -> Result<Vec<(String, Vec<String>)>, Error> {
        let keys = [format!("{}addrs-users", self.prefix), format!("{}addrs-ttl", self.prefix)];
        let args = [format!("{}addrs:", self.prefix)];
        let flat: Vec<String> = self.eval(&self.fleet_addrs, &keys, &args).await?;
        let mut out = Vec::new();
        let mut it = flat.into_iter();
        while let (Some(user), Some(n)) = (it.next(), it.next()) {
            let n: usize = n.parse().unwrap_or(0);
            out.push((unescape(&user), it.by_ref().take(n).collect()));
        }
        Ok(out)
    }

    fn usage_key(&self, k: &UsageKey<'_>) -> String {
        format!("{}usage:{}:{}:{}", self.prefix, escape(k.quota), escape(k.user), k.start)
    }

    fn lease_key(&self) -> String {
        format!("{}instance:{}", self.prefix, self.instance)
    }

    /// A script by its SHA-1, sent whole when Redis does not have it.
    async fn eval<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
    ) -> Result<T, Error> {
        let call = |verb: &str, body: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(body).arg(keys.len()).arg(keys).arg(args);
            cmd
        };
        match self.query(&call("EVALSHA", &script.sha)).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.run(&call("EVAL", script.body)).await
            }
            other => self.settle(other),
        }
    }

    async fn run<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, Error> {
        let result = self.query(cmd).await;
        self.settle(result)
    }

    /// One round trip: the connection (made if need be), the request within
    /// `RESPONSE_TIMEOUT`, counted. An error that leaves the connection in doubt drops it.
    async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, redis::RedisError> {
        let (mut conn, generation) = match self.conn().await {
            Ok(conn) => conn,
            Err(reason) => return Err(down_error(reason)),
        };
        self.status.commands.fetch_add(1, Relaxed);
        self.status.bytes.fetch_add(cmd.get_packed_command().len() as u64, Relaxed);
        let result = match tokio::time::timeout(RESPONSE_TIMEOUT, cmd.query_async(&mut conn)).await
        {
            Ok(result) => result,
            Err(_) => Err(down_error(format!("no reply within {RESPONSE_TIMEOUT:?}"))),
        };
        if let Err(e) = &result {
            if broken(e) {
                self.lost(generation, reason(e)).await;
            }
        }
        result
    }

    /// A query's outcome as the caller sees it; a connection that answered is up.
    fn settle<T>(&self, result: Result<T, redis::RedisError>) -> Result<T, Error> {
        match result {
            Ok(v) => {
                self.backoff_ms.store(millis(BACKOFF_MIN), Relaxed);
                self.mark(true, "");
                Ok(v)
            }
            Err(e) => {
                self.status.failures.fetch_add(1, Relaxed);
                let reason = reason(&e);
                if broken(&e) {
                    Err(Error::Down { addr: Arc::clone(&self.addr), reason })
                } else {
                    self.mark(true, "");
                    Err(Error::Reply { addr: Arc::clone(&self.addr), reason })
                }
            }
        }
    }

    /// The connection, made now unless the last attempt failed less than the backoff ago.
    async fn conn(&self) -> Result<(MultiplexedConnection, u64), String> {
        let mut link = self.link.lock().await;
        if let Some(conn) = &link.conn {
            return Ok((conn.clone(), link.generation));
        }
        if link.retry_at.is_some_and(|at| Instant::now() < at) {
            return Err(link.reason.clone());
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        let attempt = self.client.get_multiplexed_async_connection_with_config(&config);
        // redis-rs bounds the TCP connect; this bounds the handshake after it too (TLS,
        // AUTH, SELECT).
        let outcome = match tokio::time::timeout(CONNECT_TIMEOUT * 2, attempt).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(reason(&e)),
            Err(_) => Err(format!("no connection within {:?}", CONNECT_TIMEOUT * 2)),
        };
        match outcome {
            Ok(conn) => {
                link.conn = Some(conn.clone());
                link.generation += 1;
                link.retry_at = None;
                Ok((conn, link.generation))
            }
            Err(reason) => {
                self.back_off(&mut link, &reason);
                drop(link);
                self.mark(false, &reason);
                Err(reason)
            }
        }
    }

    /// Connection `generation` broke (or its server refused this instance): drop it,
    /// and connect again after the backoff.
    async fn lost(&self, generation: u64, reason: String) {
        let mut link = self.link.lock().await;
        if link.generation == generation && link.conn.take().is_some() {
            self.back_off(&mut link, &reason);
        }
        drop(link);
        self.mark(false, &reason);
    }

    fn back_off(&self, link: &mut Link, reason: &str) {
        let wait = self.backoff_ms.load(Relaxed);
        link.retry_at = Some(Instant::now() + Duration::from_millis(wait));
        self.backoff_ms.store((wait * 2).min(millis(BACKOFF_MAX)), Relaxed);
        reason.clone_into(&mut link.reason);
    }

    /// Health as the last call found it, logged when it changes.
    fn mark(&self, up: bool, reason: &str) {
        if !self.status.set(up) {
            return;
        }
        if up {
            tracing::info!("state: Redis at {} is reachable: shared state in use", self.addr);
        } else {
            let serving = match self.on_state_loss {
                OnStateLoss::Serve => "serving on local counts",
                OnStateLoss::Deny => {
                    "refusing what needs the shared state (on_state_loss = \"deny\")"
                }
            };
            tracing::warn!("state: Redis at {} is unreachable ({reason}): {serving}", self.addr);
        }
    }
}

/// Whether an error leaves the connection unusable or in doubt (as opposed to an error
/// reply on a sound connection). A refused password or permission is one too: the shared state cannot be used until
/// the server's or the instance's configuration changes.
fn broken(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
        || e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
}

/// A failure without a connection, as redis-rs's error kind for I/O.
fn down_error(reason: String) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::NotConnected, reason))
}

/// A redis-rs error in one line, without the URL (which may hold a password).
fn reason(e: &redis::RedisError) -> String {
    e.to_string()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The first line of a password file.
fn password(path: &Path) -> Result<String, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::Config(format!("redis_password_file: cannot read {}: {e}", path.display()))
    })?;
    let line = text.lines().next().unwrap_or("").trim_end();
    if line.is_empty() {
        return Err(Error::Config(format!("redis_password_file: {} is empty", path.display())));
    }
    Ok(line.to_string())
}

/// A name made key-safe: `%` and `:` escaped, so that the parts of a key never run into
/// each other.
fn escape(name: &str) -> std::borrow::Cow<'_, str> {
    if !name.contains(['%', ':']) {
        return name.into();
    }
    name.replace('%', "%25").replace(':', "%3A").into()
}

/// `escape` undone.
fn unescape(name: &str) -> String {
    if !name.contains('%') {
        return name.into();
    }
    name.replace("%3A", ":").replace("%25", "%")
}

/// This instance's name: the host's name, the process id and a random part (a restarted
/// process is a new instance: its predecessor's counts expire with its lease).
fn instance_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    format!("{}-{}-{:08x}", escape(&host), std::process::id(), h.finish() as u32)
}

mod scripts;
#[cfg(test)]
mod tests;
