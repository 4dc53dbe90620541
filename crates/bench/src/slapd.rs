//! `Slapd`: Debian's OpenLDAP server on a free loopback port, for the tests of the LDAP
//! backend. It runs from a `slapd.conf` in a scratch directory (mdb database, suffix
//! `dc=example,dc=org`, root `cn=admin,dc=example,dc=org` with password [`ROOT_PASSWORD`],
//! the memberof overlay so that users carry `memberOf`, ACLs that hide parts of two
//! entries as [`PEOPLE`] says, all else readable by all), is loaded with the test's LDIF
//! through `ldapadd` once it listens, and also listens with LDAPS on a second port, with a
//! certificate for 127.0.0.1 and localhost from a throwaway CA (`ca_file`). It logs its
//! operations (`loglevel stats`), so that a test counts the binds it served (`binds`). It
//! can be stopped and started again on the same ports (its database kept), paused
//! (SIGSTOP) to play a directory that stops answering, and is killed by its process id
//! when dropped.

use std::io;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The program, as Debian installs it.
pub const PROGRAM: &str = "slapd";

/// The client that loads the test's entries (package ldap-utils).
pub const LDAPADD: &str = "ldapadd";

/// The directory's suffix.
pub const SUFFIX: &str = "dc=example,dc=org";

/// The directory's root account and its password.
pub const ROOT_DN: &str = "cn=admin,dc=example,dc=org";
pub const ROOT_PASSWORD: &str = "rootsecret";

/// Example people for the tests: alice (password `wonderland`; groups admins and staff),
/// bob (`builder`; staff), carol (`carol-pw`; `employeeType: disabled`) under
/// `ou=people`, groups (groupOfNames) under `ou=groups`, and a service account
/// `cn=svc,dc=example,dc=org` (`svc-secret`). Entries for the hardening tests, under the
/// ACLs of the server's configuration: dave (`dave-pw`; groups `Domain Users` under
/// `ou=groups` and `admins` under `ou=elsewhere`); erin (`erin-pw`), whose entry
/// only the service account reads (she binds, and reads nothing of it); frank
/// (`frank-pw`; disabled), whose `employeeType` only the service account reads; grace
/// (`grace-pw`), a name with two entries, one under `ou=people` and one under
/// `ou=elsewhere`.
pub const PEOPLE: &str = "\
dn: dc=example,dc=org
objectClass: dcObject
objectClass: organization
o: Example
dc: example

dn: ou=people,dc=example,dc=org
objectClass: organizationalUnit
ou: people

dn: ou=groups,dc=example,dc=org
objectClass: organizationalUnit
ou: groups

dn: cn=svc,dc=example,dc=org
objectClass: organizationalRole
objectClass: simpleSecurityObject
cn: svc
userPassword: svc-secret

dn: uid=alice,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: alice
cn: Alice
sn: A
userPassword: wonderland

dn: uid=bob,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: bob
cn: Bob
sn: B
userPassword: builder

dn: uid=carol,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: carol
cn: Carol
sn: C
employeeType: disabled
userPassword: carol-pw

dn: cn=admins,ou=groups,dc=example,dc=org
objectClass: groupOfNames
cn: admins
member: uid=alice,ou=people,dc=example,dc=org

dn: cn=staff,ou=groups,dc=example,dc=org
objectClass: groupOfNames
cn: staff
member: uid=alice,ou=people,dc=example,dc=org
member: uid=bob,ou=people,dc=example,dc=org

dn: ou=elsewhere,dc=example,dc=org
objectClass: organizationalUnit
ou: elsewhere

dn: uid=dave,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: dave
cn: Dave
sn: D
userPassword: dave-pw

dn: uid=erin,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: erin
cn: Erin
sn: E
userPassword: erin-pw

dn: uid=frank,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: frank
cn: Frank
sn: F
employeeType: disabled
userPassword: frank-pw

dn: uid=grace,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: grace
cn: Grace
sn: G
userPassword: grace-pw

dn: uid=grace,ou=elsewhere,dc=example,dc=org
objectClass: inetOrgPerson
uid: grace
cn: Grace
sn: G
userPassword: grace-pw

dn: cn=admins,ou=elsewhere,dc=example,dc=org
objectClass: groupOfNames
cn: admins
member: uid=dave,ou=people,dc=example,dc=org

dn: cn=Domain Users,ou=groups,dc=example,dc=org
objectClass: groupOfNames
cn: Domain Users
member: uid=dave,ou=people,dc=example,dc=org
";

/// slapd on a small database starts in some tens of milliseconds; this only bounds a
/// broken start.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A running `slapd`, killed on drop.
pub struct Slapd {
    program: PathBuf,
    child: Option<Child>,
    port: u16,
    tls_port: u16,
    dir: PathBuf,
}

impl Slapd {
    /// Starts one on free ports of 127.0.0.1 and adds `ldif` (the suffix entry
    /// `dc=example,dc=org` included) as the root account. None when slapd or ldapadd is
    /// missing: the calling test is then counted as skipped, or fails with
    /// `RUSTLE_REQUIRE_TOOLS=1` (see `tools`).
    #[track_caller]
    pub fn start(ldif: &str) -> Option<Slapd> {
        let Some(program) = crate::tools::find(PROGRAM, &["/usr/sbin/slapd"]) else {
            crate::tools::missing(PROGRAM);
            return None;
        };
        let Some(ldapadd) = crate::tools::find(LDAPADD, &["/usr/bin/ldapadd"]) else {
            crate::tools::missing(LDAPADD);
            return None;
        };
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rustle-slapd-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(dir.join("db")).expect("create the slapd directory");
        crate::redis_server::write_certificates(&dir).expect("write the slapd certificates");
        std::fs::write(dir.join("slapd.conf"), conf(&dir)).expect("write slapd.conf");
        std::fs::write(dir.join("data.ldif"), ldif).expect("write the LDIF");
        let mut server = Slapd {
            program,
            child: None,
            port: free_port().expect("a free port"),
            tls_port: free_port().expect("a free port"),
            dir,
        };
        server.restart().expect("start slapd");
        let out = Command::new(ldapadd)
            .args(["-x", "-H", &server.url(), "-D", ROOT_DN, "-w", ROOT_PASSWORD, "-f"])
            .arg(server.dir.join("data.ldif"))
            .stdin(Stdio::null())
            .output()
            .expect("run ldapadd");
        assert!(
            out.status.success(),
            "ldapadd failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(server)
    }

    /// `ldap://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("ldap://127.0.0.1:{}", self.port)
    }

    /// `ldaps://localhost:PORT`: the name the certificate is checked against.
    pub fn tls_url(&self) -> String {
        format!("ldaps://localhost:{}", self.tls_port)
    }

    /// The plain port (StartTLS is offered on it too).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The CA file that verifies the server's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Its scratch directory (removed on drop), for files a test writes beside it.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many simple binds as `dn` it has served since it last started, whatever their
    /// outcome (read from its log).
    pub fn binds(&self, dn: &str) -> usize {
        let needle = format!(" BIND dn=\"{dn}\" method=128");
        std::fs::read_to_string(self.dir.join("slapd.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.ends_with(&needle))
            .count()
    }

    /// Kills it (SIGKILL) and waits for it: its ports closed, its database kept.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same ports (stopping it first if it runs) and waits until
    /// both accept connections.
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop();
        let log = self.dir.join("slapd.log");
        let urls = format!("ldap://127.0.0.1:{}/ ldaps://127.0.0.1:{}/", self.port, self.tls_port);
        // `-d 256` keeps it in the foreground (a child to kill by its id) and writes the
        // `stats` lines to stderr, into the log.
        let mut child = Command::new(&self.program)
            .arg("-f")
            .arg(self.dir.join("slapd.conf"))
            .args(["-h", &urls, "-d", "256"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        let deadline = Instant::now() + START_TIMEOUT;
        while !(listens(self.port) && listens(self.tls_port)) {
            if let Some(status) = child.try_wait()? {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(io::Error::other(format!("slapd exited ({status}): {text}")));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(io::Error::other(format!("slapd did not start: {text}")));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.child = Some(child);
        Ok(())
    }
}

impl Slapd {
    /// Stops it answering (SIGSTOP): connections stay open, replies never come.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, which: &str) {
        if let Some(child) = &self.child {
            let status = Command::new("kill").arg(which).arg(child.id().to_string()).status();
            assert!(status.is_ok_and(|s| s.success()), "kill {which} slapd");
        }
    }
}

impl Drop for Slapd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn conf(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
include /etc/ldap/schema/nis.schema
pidfile {d}/slapd.pid
modulepath /usr/lib/ldap
moduleload back_mdb
moduleload memberof
loglevel stats
TLSCACertificateFile {d}/ca.pem
TLSCertificateFile {d}/server.pem
TLSCertificateKeyFile {d}/server.key
database mdb
maxsize 16777216
suffix \"{SUFFIX}\"
rootdn \"{ROOT_DN}\"
rootpw {ROOT_PASSWORD}
directory {d}/db
overlay memberof
access to dn.exact=\"uid=erin,ou=people,{SUFFIX}\"
  by anonymous auth
  by dn.exact=\"cn=svc,{SUFFIX}\" read
  by * none
access to dn.exact=\"uid=frank,ou=people,{SUFFIX}\" attrs=employeeType
  by dn.exact=\"cn=svc,{SUFFIX}\" read
  by * none
access to * by * read
"
    )
}

fn listens(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
