//! `Radiusd`: Debian's FreeRADIUS 3 (`freeradius`) on free loopback ports, for the tests of
//! the RADIUS backend. It runs in the foreground from a configuration of its own in a
//! scratch directory: one client (127.0.0.1, a random secret, Message-Authenticator
//! required, and every reply signed with one), the `users` file the test gives
//! (Cleartext-Password and reply attributes), PAP and CHAP, and accounting written by the
//! `detail` module to a file the test reads back. It can be killed and started again on the same ports mid-test, and is killed by
//! its process id when dropped.

use std::fs::File;
use std::io;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The program, as Debian installs it.
pub const PROGRAM: &str = "freeradius";

/// FreeRADIUS with this configuration starts in about 50 ms; this only bounds a broken
/// start.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A running `freeradius`, killed on drop.
pub struct Radiusd {
    program: PathBuf,
    child: Option<Child>,
    dir: PathBuf,
    auth_port: u16,
    acct_port: u16,
    secret: String,
}

impl Radiusd {
    /// Starts one on free ports of 127.0.0.1 with `users` as its users file (FreeRADIUS's
    /// `files` syntax). None when `freeradius` is missing: the calling test is then counted
    /// as skipped, or fails with `RUSTLE_REQUIRE_TOOLS=1` (see `tools`).
    #[track_caller]
    pub fn start(users: &str) -> Option<Radiusd> {
        let Some(program) = crate::tools::find(PROGRAM, &["/usr/sbin/freeradius"]) else {
            crate::tools::missing(PROGRAM);
            return None;
        };
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("rustle-radiusd-{}-{seq}", std::process::id()));
        std::fs::create_dir_all(dir.join("run")).expect("create the freeradius directory");
        let (auth_port, acct_port) = free_udp_ports().expect("two free UDP ports");
        let secret = format!("rustle-test-{}-{seq}", std::process::id());
        std::fs::write(dir.join("users"), users).expect("write the users file");
        std::fs::write(dir.join("secret"), format!("{secret}\n")).expect("write the secret file");
        let conf = CONF
            .replace("@DIR@", &dir.display().to_string())
            .replace("@SECRET@", &secret)
            .replace("@AUTH@", &auth_port.to_string())
            .replace("@ACCT@", &acct_port.to_string());
        std::fs::write(dir.join("radiusd.conf"), conf).expect("write radiusd.conf");
        let mut server = Radiusd { program, child: None, dir, auth_port, acct_port, secret };
        server.restart().expect("start freeradius");
        Some(server)
    }

    /// Its authentication port.
    pub fn auth_port(&self) -> u16 {
        self.auth_port
    }

    /// Its accounting port.
    pub fn acct_port(&self) -> u16 {
        self.acct_port
    }

    /// The shared secret of its one client, 127.0.0.1.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// A file holding the secret on its first line (`secret_file`).
    pub fn secret_file(&self) -> PathBuf {
        self.dir.join("secret")
    }

    /// Its scratch directory (removed on drop).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The accounting records received so far, as the `detail` module writes them (one
    /// block per record, `Name = value` lines).
    pub fn detail(&self) -> String {
        std::fs::read_to_string(self.dir.join("detail")).unwrap_or_default()
    }

    /// Its log so far (`Auth:` lines name every Access-Request's outcome).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("radiusd.log")).unwrap_or_default()
    }

    /// Access-Requests answered so far (accepted or rejected).
    pub fn auth_requests(&self) -> usize {
        self.log()
            .lines()
            .filter(|l| l.contains("Login OK") || l.contains("Login incorrect"))
            .count()
    }

    /// Kills it (SIGKILL) and waits for it: its ports are closed.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same ports (killing it first if it runs) and waits until it
    /// processes requests. Its detail file and log are kept.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        let log_path = self.dir.join("radiusd.log");
        let start_at = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0) as usize;
        let log = File::options().create(true).append(true).open(&log_path)?;
        let mut child = Command::new(&self.program)
            .args(["-f", "-l", "stdout", "-n", "radiusd", "-d"])
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let text = text.get(start_at..).unwrap_or_default();
            if text.contains("Ready to process requests") {
                break;
            }
            if let Some(status) = child.try_wait()? {
                return Err(io::Error::other(format!("freeradius exited ({status}): {text}")));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::other(format!("freeradius did not start: {text}")));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.child = Some(child);
        Ok(())
    }
}

impl Drop for Radiusd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Two UDP ports free on 127.0.0.1 (held together while both are picked).
fn free_udp_ports() -> io::Result<(u16, u16)> {
    let a = UdpSocket::bind("127.0.0.1:0")?;
    let b = UdpSocket::bind("127.0.0.1:0")?;
    Ok((a.local_addr()?.port(), b.local_addr()?.port()))
}

/// The whole configuration: no file of /etc/freeradius is read but the dictionaries
/// (from /usr/share/freeradius). It runs as the user that starts it.
const CONF: &str = r#"
prefix = /usr
exec_prefix = /usr
sysconfdir = /etc
localstatedir = @DIR@
sbindir = /usr/sbin
logdir = @DIR@
raddbdir = @DIR@
confdir = @DIR@
run_dir = @DIR@/run
libdir = /usr/lib/freeradius
pidfile = @DIR@/run/radiusd.pid
name = freeradius
max_request_time = 5
cleanup_delay = 0
max_requests = 1024
hostname_lookups = no
log {
	destination = stdout
	auth = yes
	auth_badpass = no
	auth_goodpass = no
}
security {
	allow_core_dumps = no
	max_attributes = 200
	reject_delay = 0
	status_server = yes
}
proxy_requests = no
client localhost {
	ipaddr = 127.0.0.1
	secret = @SECRET@
	require_message_authenticator = yes
	nas_type = other
}
thread pool {
	start_servers = 2
	max_servers = 4
	min_spare_servers = 1
	max_spare_servers = 4
	max_requests_per_server = 0
}
modules {
	pap {
	}
	chap {
	}
	files {
		filename = @DIR@/users
	}
	detail {
		filename = @DIR@/detail
		escape_filenames = no
		permissions = 0600
		header = "%t"
	}
}
server default {
	listen {
		type = auth
		ipaddr = 127.0.0.1
		port = @AUTH@
	}
	listen {
		type = acct
		ipaddr = 127.0.0.1
		port = @ACCT@
	}
	authorize {
		chap
		files
		pap
	}
	authenticate {
		Auth-Type PAP {
			pap
		}
		Auth-Type CHAP {
			chap
		}
	}
	preacct {
	}
	accounting {
		detail
	}
	# Every Access-Accept and Access-Reject signed, as FreeRADIUS 3.2.5 and later sign them
	# (BlastRADIUS): 3.2.1 signs a reply only when it lists a Message-Authenticator.
	post-auth {
		update reply {
			Message-Authenticator := 0x00
		}
		Post-Auth-Type REJECT {
			update reply {
				Message-Authenticator := 0x00
			}
		}
	}
}
"#;
