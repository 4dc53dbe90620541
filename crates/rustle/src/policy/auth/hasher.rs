//! The threads that run the slow password hashes (bcrypt, argon2id) for the whole process:
//! a fixed few, fed by a bounded queue, each with one argon2 memory block it keeps from
//! check to check. So a flood of logins holds at most `threads` × the largest argon2id
//! memory cost of the users (plus the queue's passwords), whatever its size, and a client
//! address has at most `per_client` checks queued or running, so one address cannot fill
//! the queue and make everyone else's logins wait behind its own.
//!
//! Checks of the same name and password from one address at once (a browser opening
//! several connections with fresh credentials) share one hash.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use subtle::ConstantTimeEq;
use tokio::sync::oneshot;

use super::User;

/// Why a check was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Busy {
    /// This client address already has its share of checks queued or running.
    Client,
    /// The queue is full (of other clients' checks).
    Queue,
}

/// The pool's sizes (`[auth] hash_threads`, `max_pending_hashes`, `max_hashes_per_client`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HasherLimits {
    /// Hashing threads, fixed for the life of the pool (0 only in tests: nothing is run).
    pub(crate) threads: usize,
    /// Checks waiting for a thread, across clients.
    pub(crate) max_pending: usize,
    /// Checks one client address may have queued or running (at least 1).
    pub(crate) per_client: usize,
}

impl HasherLimits {
    /// The sizes `[auth]` sets.
    pub(crate) fn of(auth: &crate::config::Auth) -> HasherLimits {
        HasherLimits {
            threads: auth.hash_threads,
            max_pending: auth.max_pending_hashes,
            per_client: auth.max_hashes_per_client,
        }
    }
}

/// The process's hashing threads; shared by the workers (`Arc`). Dropping the last handle
/// stops the threads once their current hash is done; checks still queued then fail.
pub(crate) struct Hasher {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a check is queued or the pool stops.
    work: Condvar,
}

struct State {
    /// Checks waiting for a thread, oldest first.
    queue: VecDeque<u64>,
    /// Checks queued or running, by id.
    jobs: HashMap<u64, Job>,
    /// The ids of each client address's checks queued or running (at most `per_client`).
    clients: HashMap<IpAddr, Vec<u64>>,
    next_id: u64,
    max_pending: usize,
    per_client: usize,
    stopping: bool,
    /// Threads not started yet: they start with the first check, so that a proxy whose
    /// users never present a password runs none.
    unstarted: usize,
    /// Threads started.
    started: usize,
}

struct Job {
    /// Under which address the check counts (`limiter::client`).
    client: IpAddr,
    /// What the check is shared on: the users' generation and the name presented (an
    /// unknown name is checked against a decoy, whose name says nothing).
    generation: u64,
    name: String,
    password: Vec<u8>,
    /// Taken by the thread that runs the check.
    user: Option<User>,
    /// Everyone waiting for the answer.
    waiters: Vec<oneshot::Sender<bool>>,
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    // A panic while holding the lock leaves the state consistent (every change is a few
    // plain inserts and removes): carry on with it.
    shared.state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Hasher {
    /// A pool of `limits.threads` hashing threads, started with the first check.
    pub(crate) fn start(limits: HasherLimits) -> std::io::Result<Hasher> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                jobs: HashMap::new(),
                clients: HashMap::new(),
                next_id: 0,
                max_pending: limits.max_pending,
                per_client: limits.per_client.max(1),
                stopping: false,
                unstarted: limits.threads,
                started: 0,
            }),
            work: Condvar::new(),
        });
        Ok(Hasher { shared })
    }

    /// Starts the threads not started yet; false when none runs (the OS refused them).
    fn start_threads(&self, state: &mut State) -> bool {
        while state.unstarted > 0 {
            let shared = self.shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("rustle-hash{}", state.started))
                .spawn(move || run(&shared));
            if let Err(e) = spawned {
                tracing::error!("auth: cannot start a hashing thread: {e}");
                break;
            }
            state.unstarted -= 1;
            state.started += 1;
        }
        state.started > 0
    }

    /// New queue sizes (a reload); the number of threads stays what it was at start.
    pub(crate) fn set_limits(&self, max_pending: usize, per_client: usize) {
        let mut state = lock(&self.shared);
        state.max_pending = max_pending;
        state.per_client = per_client.max(1);
    }

    /// Checks `password` against `user` on a hashing thread, for `client`, who presented
    /// the name `name` to users of `generation`: true when it matches. `Busy` at once when
    /// the client has its share of checks in the pool or the queue is full. A check whose
    /// waiters have all gone by the time a thread takes it is skipped.
    pub(crate) async fn check(
        &self,
        client: IpAddr,
        generation: u64,
        name: &str,
        user: &User,
        password: &[u8],
    ) -> Result<bool, Busy> {
        let answer =
            self.submit(super::limiter::client(client), generation, name, user, password)?;
        // The sender goes only when the pool stops: a failed check.
        Ok(answer.await.unwrap_or(false))
    }

    fn submit(
        &self,
        client: IpAddr,
        generation: u64,
        name: &str,
        user: &User,
        password: &[u8],
    ) -> Result<oneshot::Receiver<bool>, Busy> {
        let (tx, rx) = oneshot::channel();
        let mut guard = lock(&self.shared);
        let state = &mut *guard;
        if state.stopping {
            return Err(Busy::Queue);
        }
        let mine = state.clients.get(&client).map(Vec::as_slice).unwrap_or_default();
        for id in mine {
            let Some(job) = state.jobs.get_mut(id) else { continue };
            let same = job.generation == generation
                && job.name == name
                && bool::from(job.password.as_slice().ct_eq(password));
            if same {
                job.waiters.push(tx);
                return Ok(rx);
            }
        }
        if mine.len() >= state.per_client {
            crate::telemetry::metrics::auth_hash_refused();
            return Err(Busy::Client);
        }
        if state.queue.len() >= state.max_pending {
            crate::telemetry::metrics::auth_hash_refused();
            return Err(Busy::Queue);
        }
        if state.unstarted > 0 && !self.start_threads(state) {
            crate::telemetry::metrics::auth_hash_refused();
            return Err(Busy::Queue);
        }
        let id = state.next_id;
        state.next_id += 1;
        state.jobs.insert(
            id,
            Job {
                client,
                generation,
                name: name.to_owned(),
                password: password.to_vec(),
                user: Some(user.clone()),
                waiters: vec![tx],
            },
        );
        state.queue.push_back(id);
        state.clients.entry(client).or_default().push(id);
        drop(guard);
        self.shared.work.notify_one();
        Ok(rx)
    }

    #[cfg(test)]
    /// Checks queued or running, across clients (for tests and diagnostics).
    pub(crate) fn in_pool(&self) -> usize {
        lock(&self.shared).jobs.len()
    }
}

impl Drop for Hasher {
    fn drop(&mut self) {
        let mut state = lock(&self.shared);
        state.stopping = true;
        // Waiters see their sender dropped: a failed check.
        state.queue.clear();
        state.jobs.retain(|_, job| job.user.is_none());
        drop(state);
        self.shared.work.notify_all();
    }
}

/// One hashing thread: takes the oldest check, runs it in the thread's own memory block,
/// answers everyone waiting for it.
fn run(shared: &Shared) {
    let mut memory: Vec<argon2::Block> = Vec::new();
    loop {
        let (id, user, password) = {
            let mut state = lock(shared);
            let id = loop {
                if state.stopping {
                    return;
                }
                match state.queue.pop_front() {
                    Some(id) => break id,
                    None => state = shared.work.wait(state).unwrap_or_else(PoisonError::into_inner),
                }
            };
            let Some(job) = state.jobs.get_mut(&id) else { continue };
            if job.waiters.iter().all(oneshot::Sender::is_closed) {
                // Everyone left (the clients closed their connections): no hash.
                finish(&mut state, id, false);
                continue;
            }
            let Some(user) = job.user.take() else { continue };
            (id, user, job.password.clone())
        };
        // A panic in a hash library must not leave the check's waiters hanging and its
        // client's share taken for good: it is a failed check, and the thread goes on
        // (with a fresh memory block).
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            user.verify_in(&password, &mut memory)
        }))
        .unwrap_or_else(|_| {
            tracing::error!("a password hash panicked; counted as a failed check");
            memory = Vec::new();
            false
        });
        crate::telemetry::metrics::auth_hashed();
        finish(&mut lock(shared), id, ok);
    }
}

/// Answers check `id`'s waiters and forgets it.
fn finish(state: &mut State, id: u64, ok: bool) {
    let Some(job) = state.jobs.remove(&id) else { return };
    for waiter in job.waiters {
        let _ = waiter.send(ok);
    }
    if let Some(ids) = state.clients.get_mut(&job.client) {
        ids.retain(|&i| i != id);
        if ids.is_empty() {
            state.clients.remove(&job.client);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::auth::Users;

    fn users() -> Users {
        match Users::parse_file(&format!("alice:{}\n", super::super::tests::SECRET_2B)) {
            Ok(u) => u,
            Err(e) => panic!("{e:?}"),
        }
    }

    fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
        match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt.block_on(f),
            Err(e) => panic!("{e}"),
        }
    }

    /// A pool without threads, so that what is queued stays there until the test starts
    /// one (`start_thread`).
    fn idle(max_pending: usize, per_client: usize) -> Hasher {
        match Hasher::start(HasherLimits { threads: 0, max_pending, per_client }) {
            Ok(h) => h,
            Err(e) => panic!("{e}"),
        }
    }

    fn start_thread(h: &Hasher) -> std::thread::JoinHandle<()> {
        let shared = h.shared.clone();
        std::thread::spawn(move || run(&shared))
    }

    fn submit(h: &Hasher, ip: [u8; 4], pw: &[u8]) -> Result<oneshot::Receiver<bool>, Busy> {
        let users = users();
        let alice = users.get("alice").expect("alice");
        h.submit(IpAddr::from(ip), 1, "alice", alice, pw)
    }

    #[test]
    fn answers_right_and_wrong() {
        let users = users();
        let alice = users.get("alice").expect("alice");
        let h = match Hasher::start(HasherLimits { threads: 1, max_pending: 8, per_client: 2 }) {
            Ok(h) => h,
            Err(e) => panic!("{e}"),
        };
        let ip: IpAddr = [192, 0, 2, 1].into();
        block_on(async {
            assert_eq!(h.check(ip, 1, "alice", alice, b"secret").await, Ok(true));
            assert_eq!(h.check(ip, 1, "alice", alice, b"wrong").await, Ok(false));
        });
        assert_eq!(h.in_pool(), 0);
    }

    #[test]
    fn per_client_share_queue_bound_and_shared_checks() {
        let h = idle(3, 2);
        let a = [192, 0, 2, 1];
        let first = submit(&h, a, b"secret").expect("queued");
        let same = submit(&h, a, b"secret").expect("shares the first");
        let second = submit(&h, a, b"wrong").expect("queued");
        assert_eq!(h.in_pool(), 2, "the same credentials share one check");
        assert_eq!(submit(&h, a, b"third").err(), Some(Busy::Client));
        let b = submit(&h, [192, 0, 2, 2], b"wrong").expect("another address");
        assert_eq!(submit(&h, [192, 0, 2, 3], b"wrong").err(), Some(Busy::Queue));
        // Abandoned (its client left): skipped, not hashed.
        drop(b);
        let thread = start_thread(&h);
        let got = block_on(async {
            [first.await, same.await, second.await].map(|r| r.expect("answered"))
        });
        assert_eq!(got, [true, true, false]);
        // Answered checks are forgotten, and their address may queue again.
        assert!(h.in_pool() <= 1, "{} still in the pool", h.in_pool());
        let again = submit(&h, a, b"secret").expect("queued again");
        assert_eq!(block_on(again), Ok(true));
        drop(h);
        assert!(thread.join().is_ok(), "the thread ends with the pool");
    }
}
