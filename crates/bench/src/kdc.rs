//! `Kdc`: Debian's MIT `krb5kdc` for the realm `RUSTLE.TEST` on a free loopback port, for
//! the Negotiate tests. Everything lives in a scratch directory: the KDC's profile
//! (`KRB5_KDC_PROFILE`), the clients' `krb5.conf` (`KRB5_CONFIG`: no DNS, `localhost` in
//! the realm), the database (`kdb5_util create`), and the keytab of `HTTP/localhost`
//! (`kadmin.local ktadd`). The KDC runs in the foreground (`krb5kdc -n`) and is killed by
//! its process id when dropped. `kinit` gets a user's ticket into a credential cache of
//! the test's own; `env` gives the variables a client (curl, python3-gssapi) needs.

use std::io::{self, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The realm every test uses.
pub const REALM: &str = "RUSTLE.TEST";

/// The service principal of the proxy's keytab (what curl asks a ticket for when the
/// proxy is `localhost`: `HTTP@localhost`, no canonicalization).
pub const SERVICE: &str = "HTTP/localhost";

/// The KDC starts in milliseconds; this only bounds a broken start.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A running `krb5kdc`, killed on drop.
pub struct Kdc {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

/// Where Debian puts the programs (/usr/sbin is not on every PATH).
fn program(name: &str) -> Option<PathBuf> {
    crate::tools::find(name, &[&format!("/usr/sbin/{name}"), &format!("/usr/bin/{name}")])
}

impl Kdc {
    /// A realm with the users `(name, password)` and `HTTP/localhost` (its keytab at
    /// `keytab()`), its KDC started. None when the MIT tools are missing: the calling test
    /// is then counted as skipped, or fails with `RUSTLE_REQUIRE_TOOLS=1` (see `tools`).
    #[track_caller]
    pub fn start(users: &[(&str, &str)]) -> Option<Kdc> {
        for tool in ["krb5kdc", "kdb5_util", "kadmin.local", "kinit"] {
            if program(tool).is_none() {
                crate::tools::missing(tool);
                return None;
            }
        }
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rustle-kdc-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the KDC's directory");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut kdc = Kdc { child: None, port, dir };
        kdc.write_profiles().expect("write the Kerberos profiles");
        kdc.create(users).expect("create the Kerberos database");
        kdc.restart().expect("start krb5kdc");
        Some(kdc)
    }

    /// The port it listens on (TCP only: the port was found free for TCP, and clients
    /// are told `udp_preference_limit = 1`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its scratch directory (removed on drop).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The keytab holding `HTTP/localhost`'s keys (aes256 and aes128).
    pub fn keytab(&self) -> PathBuf {
        self.dir.join("http.keytab")
    }

    /// The clients' `krb5.conf`.
    pub fn krb5_conf(&self) -> PathBuf {
        self.dir.join("krb5.conf")
    }

    /// A credential cache of its own for `name` (`FILE:` path), empty until `kinit`.
    pub fn ccache(&self, name: &str) -> PathBuf {
        self.dir.join(format!("cc-{name}"))
    }

    /// The variables a Kerberos client needs to get `user`'s tickets from this KDC.
    pub fn env(&self, user: &str) -> Vec<(String, String)> {
        vec![
            ("KRB5_CONFIG".into(), self.krb5_conf().display().to_string()),
            ("KRB5CCNAME".into(), format!("FILE:{}", self.ccache(user).display())),
            ("KRB5_KDC_PROFILE".into(), self.dir.join("kdc.conf").display().to_string()),
        ]
    }

    /// `kinit user` with `password` on its standard input, into `ccache(user)`.
    pub fn kinit(&self, user: &str, password: &str) -> io::Result<()> {
        let kinit = program("kinit").ok_or_else(|| io::Error::other("kinit is missing"))?;
        let mut child = Command::new(kinit)
            .arg(user)
            .envs(self.env(user))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            writeln!(stdin, "{password}")?;
        }
        let out = child.wait_with_output()?;
        match out.status.success() {
            true => Ok(()),
            false => Err(io::Error::other(format!(
                "kinit {user}: {}",
                String::from_utf8_lossy(&out.stderr)
            ))),
        }
    }

    /// Kills it (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (killing it first if it runs) and waits until it
    /// accepts TCP connections.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        let kdc = program("krb5kdc").ok_or_else(|| io::Error::other("krb5kdc is missing"))?;
        let mut child = Command::new(kdc)
            .args(["-n", "-r", REALM])
            .envs(self.env("kdc"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = child.try_wait()? {
                return Err(io::Error::other(format!("krb5kdc exited ({status}): {}", self.log())));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::other(format!("krb5kdc did not start: {}", self.log())));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.child = Some(child);
        Ok(())
    }

    /// The KDC's log (one line per ticket issued or refused).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("kdc.log")).unwrap_or_default()
    }

    fn write_profiles(&self) -> io::Result<()> {
        let (d, p) = (self.dir.display(), self.port);
        std::fs::write(
            self.krb5_conf(),
            format!(
                "[libdefaults]\n  default_realm = {REALM}\n  dns_lookup_kdc = false\n  \
                 dns_lookup_realm = false\n  rdns = false\n  dns_canonicalize_hostname = false\n  \
                 udp_preference_limit = 1\n\
                 [realms]\n  {REALM} = {{\n    kdc = 127.0.0.1:{p}\n  }}\n\
                 [domain_realm]\n  localhost = {REALM}\n"
            ),
        )?;
        std::fs::write(
            self.dir.join("kdc.conf"),
            format!(
                "[kdcdefaults]\n  kdc_listen = \"\"\n  kdc_tcp_listen = 127.0.0.1:{p}\n\
                 [realms]\n  {REALM} = {{\n    database_name = {d}/principal\n    \
                 key_stash_file = {d}/stash\n    acl_file = {d}/kadm5.acl\n    \
                 supported_enctypes = aes256-cts-hmac-sha1-96:normal aes128-cts-hmac-sha1-96:normal\n  }}\n\
                 [logging]\n  kdc = FILE:{d}/kdc.log\n"
            ),
        )
    }

    fn create(&self, users: &[(&str, &str)]) -> io::Result<()> {
        let util = program("kdb5_util").ok_or_else(|| io::Error::other("kdb5_util is missing"))?;
        // The master password only guards this throwaway database (stashed beside it).
        self.run(Command::new(util).args(["create", "-r", REALM, "-s", "-P", "rustle-master"]))?;
        let mut queries = vec![format!("addprinc -randkey {SERVICE}")];
        queries.push(format!("ktadd -k {} {SERVICE}", self.keytab().display()));
        for (name, password) in users {
            queries.push(format!("addprinc -pw {password} {name}"));
        }
        let admin = program("kadmin.local").ok_or_else(|| io::Error::other("kadmin.local"))?;
        for q in queries {
            self.run(Command::new(&admin).args(["-r", REALM, "-q", &q]))?;
        }
        Ok(())
    }

    fn run(&self, cmd: &mut Command) -> io::Result<()> {
        let out = cmd.envs(self.env("admin")).stdin(Stdio::null()).output()?;
        // kadmin.local exits 0 when a query fails: its complaint on stderr says so.
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() || err.contains("while ") {
            return Err(io::Error::other(format!("{cmd:?}: {err}")));
        }
        Ok(())
    }
}

impl Drop for Kdc {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
