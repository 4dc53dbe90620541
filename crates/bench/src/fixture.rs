//! The thread + runtime harness every fixture runs on.
//!
//! Each fixture owns one OS thread with a current-thread tokio runtime, so a
//! test can use any runtime flavour (or none) without the fixture competing
//! for its worker threads, and dropping the fixture tears everything down:
//! the stop signal ends the serving future, and dropping the runtime cancels
//! every spawned connection task, which closes their sockets.

use std::future::Future;
use std::io;
use std::thread::JoinHandle;

use tokio::runtime::Runtime;
use tokio::sync::oneshot;

/// A running fixture thread; stops and joins on drop.
pub(crate) struct Fixture {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Fixture {
    /// Builds a runtime, lets `setup` create its sockets inside that runtime's
    /// context (so bind/register errors reach the caller as `io::Result`),
    /// then drives the returned future on a dedicated thread until stopped.
    pub(crate) fn spawn<T, S, F>(name: &str, setup: S) -> io::Result<(Fixture, T)>
    where
        S: FnOnce() -> io::Result<(T, F)>,
        F: Future<Output = ()> + Send + 'static,
    {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        // Entering (not blocking on) the runtime is allowed even when the
        // caller is itself inside another runtime.
        let (value, serve) = {
            let _guard = rt.enter();
            setup()?
        };
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || run(rt, serve, stop_rx))?;
        Ok((Fixture { stop: Some(stop_tx), thread: Some(thread) }, value))
    }
}

fn run<F: Future<Output = ()>>(rt: Runtime, serve: F, stop: oneshot::Receiver<()>) {
    rt.block_on(async {
        tokio::select! {
            () = serve => {}
            // Either an explicit stop or the Fixture being dropped (sender gone).
            _ = stop => {}
        }
    });
    // Dropping the runtime here cancels all connection tasks, closing sockets.
    drop(rt);
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            // The thread may already have exited; nothing to signal then.
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // A panicking fixture thread must not turn a test's drop into a
            // double panic; the test will notice missing responses instead.
            let _ = thread.join();
        }
    }
}

/// Logging is off by default (fixtures run inside noisy test output); set
/// `RUSTLE_BENCH_LOG=1` to see per-connection errors on stderr.
pub(crate) fn log_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var_os("RUSTLE_BENCH_LOG").is_some_and(|v| v != "0"))
}

macro_rules! log {
    ($($arg:tt)*) => {
        if $crate::fixture::log_enabled() {
            eprintln!("[rustle-bench] {}", format_args!($($arg)*));
        }
    };
}
pub(crate) use log;

/// Binds a std TCP listener and hands it to the current tokio runtime.
/// Must be called inside `Fixture::spawn`'s setup closure.
pub(crate) fn tcp_listener(addr: std::net::SocketAddr) -> io::Result<tokio::net::TcpListener> {
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(std_listener)
}

/// Accept errors such as EMFILE are transient for a test origin: back off
/// briefly instead of spinning or giving up.
pub(crate) async fn accept_backoff(err: io::Error) {
    log!("accept failed: {err}");
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
}

pub(crate) const LOCALHOST_V4: std::net::SocketAddr =
    std::net::SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 0));
