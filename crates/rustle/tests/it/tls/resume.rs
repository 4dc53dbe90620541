//! Sessions resume on every TLS port (https, `auto`, terminating relays) for OpenSSL
//! clients, TLS 1.3 and 1.2, and the access log says which handshakes resumed.
//!
//! `openssl s_client -reconnect` cannot show TLS 1.3 resumption against any server (it
//! reconnects as soon as its own Finished is sent, before it reads the server's
//! NewSessionTicket; openssl/openssl#10714): TLS 1.3 is checked with `-sess_out` after an
//! exchange, then `-sess_in`, the way a client that reads an answer holds its tickets.

use std::process::Stdio;
use std::time::Duration;

use super::*;

/// The three kinds of TLS port, each in front of `origin`: (name, config, request sent
/// inside TLS, asking the origin to close after its answer).
fn ports(
    files: &rustle::io::tls::SelfSignedFiles,
    origin: &Origin,
) -> Vec<(&'static str, String, String)> {
    let tls = format!(
        "[listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        files.chain.display(),
        files.key.display()
    );
    let proxied =
        format!("GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", origin.url("/bytes/5"));
    let relayed = "GET /bytes/5 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_string();
    ["https", "auto"]
        .into_iter()
        .map(|kind| {
            let toml = format!("[[listener]]\nkind = \"{kind}\"\nlisten = \"127.0.0.1:0\"\n{tls}");
            (kind, toml, proxied.clone())
        })
        .chain(std::iter::once((
            "relay",
            format!(
                "[[listener]]\nkind = \"relay\"\nlisten = \"127.0.0.1:0\"\ntarget = \"{}\"\n{tls}",
                origin.addr()
            ),
            relayed,
        )))
        .collect()
}

/// Runs `openssl s_client` against `proxy` with `args`, `input` on its stdin; its stdout.
/// Killed after 15 s.
fn s_client(proxy: &Proxy, ca: &Path, args: &[&str], input: &[u8]) -> String {
    let mut child = clean_command("openssl")
        .args(["s_client", "-connect", &proxy.addr().to_string(), "-servername", "localhost"])
        .arg("-CAfile")
        .arg(ca)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run openssl");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    drop(stdin);
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = stdout.read_to_end(&mut out);
        out
    });
    if !wait_until(Duration::from_secs(15), || child.try_wait().unwrap().is_some()) {
        let _ = child.kill();
        let _ = child.wait();
        panic!("openssl s_client {args:?} did not finish within 15 s");
    }
    String::from_utf8_lossy(&reader.join().unwrap()).into_owned()
}

/// Whether an access-log line says its handshake resumed (before any error text).
fn resumed(line: &str) -> bool {
    line.ends_with(" resumed") || line.contains(" resumed \"")
}

/// How many lines of `text` start with `prefix`.
fn count(text: &str, prefix: &str) -> usize {
    text.lines().filter(|l| l.starts_with(prefix)).count()
}

/// The access-log lines containing `needle` (`tls=TLSv1_3/`), once there are `n` (waiting
/// up to 5 s; fewer then).
fn tls_lines(proxy: &Proxy, needle: &str, n: usize) -> Vec<String> {
    proxy.log_lines_matching(n, |l| l.contains(needle))
}

#[test]
fn openssl_clients_resume_on_https_auto_and_relay_ports_and_the_log_says_so() {
    if !have("openssl") {
        return;
    }
    let dir = TempDir::new("resume-openssl");
    let files = certs(&dir, "localhost");
    let origin = Origin::start().unwrap();
    for (kind, toml, request) in ports(&files, &origin) {
        let proxy = Proxy::from_toml(&toml);

        // TLS 1.2: the session resumes on each of the five reconnections.
        let out = s_client(&proxy, &files.ca, &["-tls1_2", "-reconnect"], b"");
        assert_eq!(count(&out, "New,"), 1, "{kind} port, TLS 1.2 -reconnect:\n{out}");
        assert_eq!(count(&out, "Reused,"), 5, "{kind} port, TLS 1.2 -reconnect:\n{out}");

        // TLS 1.3: one exchange saves the session (its tickets came before the answer),
        // then five connections resume it, each saving the session it got.
        let sess = dir.path().join(format!("{kind}.sess"));
        let sess = sess.to_str().unwrap();
        let mut seen = String::new();
        for i in 0..6 {
            let mut args = vec!["-tls1_3", "-ign_eof", "-sess_out", sess];
            if i > 0 {
                args.extend(["-sess_in", sess]);
            }
            let out = s_client(&proxy, &files.ca, &args, request.as_bytes());
            assert!(out.contains("HTTP/1.1 200"), "{kind} port, TLS 1.3 #{i}:\n{out}");
            seen.push_str(&out);
        }
        assert_eq!(count(&seen, "New,"), 1, "{kind} port, TLS 1.3:\n{seen}");
        assert_eq!(count(&seen, "Reused,"), 5, "{kind} port, TLS 1.3:\n{seen}");

        // The server's count: the first TLS 1.3 session full, the five after it resumed.
        let lines = tls_lines(&proxy, "tls=TLSv1_3/", 6);
        let n_resumed = lines.iter().filter(|l| resumed(l)).count();
        assert_eq!((lines.len(), n_resumed), (6, 5), "{kind} port:\n{}", lines.join("\n"));
        assert!(!resumed(&lines[0]), "{kind} port: {}", lines[0]);
        if kind == "relay" {
            // The relay logs every connection, TLS 1.2's reconnections too.
            let lines = tls_lines(&proxy, "tls=TLSv1_2/", 6);
            let n_resumed = lines.iter().filter(|l| resumed(l)).count();
            assert_eq!((lines.len(), n_resumed), (6, 5), "relay:\n{}", lines.join("\n"));
        }
    }
}

#[test]
fn curl_resumes_its_session_for_a_second_transfer() {
    let dir = TempDir::new("resume-curl");
    let files = certs(&dir, "localhost");
    let origin = Origin::start().unwrap();
    let ca = files.ca.to_str().unwrap();
    for (kind, toml, _) in ports(&files, &origin) {
        let proxy = Proxy::from_toml(&toml);
        let port = proxy.addr().port();
        let resolve = format!("localhost:{port}:127.0.0.1");
        // `Connection: close` makes the second transfer open a second connection.
        let out = if kind == "relay" {
            let url = format!("https://localhost:{port}/bytes/7");
            curl(&[
                "-v",
                "--resolve",
                &resolve,
                "--cacert",
                ca,
                "-H",
                "Connection: close",
                &url,
                &url,
            ])
        } else {
            let url = origin.url("/bytes/7");
            curl(&[
                "-v",
                "--resolve",
                &resolve,
                "--proxy",
                &format!("https://localhost:{port}"),
                "--proxy-cacert",
                ca,
                "-H",
                "Connection: close",
                &url,
                &url,
            ])
        };
        let Some(out) = out else { return };
        assert_success(&format!("curl through the {kind} port"), &out);
        assert_eq!(out.stdout.len(), 14, "{kind} port");
        let stderr = String::from_utf8_lossy(&out.stderr).to_lowercase();
        // curl 7 says "SSL re-using session ID", curl 8 "SSL reusing session".
        assert!(
            stderr.contains("re-using session") || stderr.contains("reusing session"),
            "{kind} port: curl did not reuse its session:\n{stderr}"
        );
        let lines = tls_lines(&proxy, "tls=TLSv1_3/", 2);
        assert_eq!(lines.len(), 2, "{kind} port:\n{}", lines.join("\n"));
        assert!(!resumed(&lines[0]), "{kind} port: {}", lines[0]);
        assert!(resumed(&lines[1]), "{kind} port: {}", lines[1]);
    }
}

/// `openssl s_server -www` on a free loopback port (its answer says whether the session
/// was `New` or `Reused`), stopped on drop.
struct SServer {
    child: std::process::Child,
    addr: SocketAddr,
}

impl SServer {
    fn start(files: &rustle::io::tls::SelfSignedFiles, version: &str) -> SServer {
        let mut child = clean_command("openssl")
            .args(["s_server", "-accept", "127.0.0.1:0", "-www", version, "-cert"])
            .arg(&files.chain)
            .arg("-key")
            .arg(&files.key)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run openssl s_server");
        let stdout = child.stdout.take().unwrap();
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
        let addr = loop {
            let line = lines.next().expect("s_server said where it listens").unwrap();
            if let Some(addr) = line.strip_prefix("ACCEPT ") {
                break addr.parse().unwrap();
            }
        };
        // Keep reading so s_server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        SServer { child, addr }
    }
}

impl Drop for SServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_originating_relay_resumes_with_an_openssl_server() {
    if !have("openssl") {
        return;
    }
    let dir = TempDir::new("resume-origin");
    let files = certs(&dir, "localhost");
    for (version, shown) in [("-tls1_3", "TLSv1.3"), ("-tls1_2", "TLSv1.2")] {
        let server = SServer::start(&files, version);
        let toml = format!(
            "[[listener]]\nkind = \"relay\"\nlisten = \"127.0.0.1:0\"\ntarget = \"{}\"\n\
             [listener.target_tls]\nserver_name = \"localhost\"\nca = \"{}\"\n",
            server.addr,
            files.ca.display()
        );
        let proxy = Proxy::from_toml(&toml);
        let mut seen = Vec::new();
        for _ in 0..6 {
            let got = String::from_utf8_lossy(&plain_get(&proxy, "/")).into_owned();
            let line = got.lines().find(|l| l.contains(&format!(", {shown}, ")));
            seen.push(
                line.unwrap_or_else(|| panic!("{shown}: no session line in {got}")).to_string(),
            );
        }
        let new = seen.iter().filter(|l| l.starts_with("New,")).count();
        let reused = seen.iter().filter(|l| l.starts_with("Reused,")).count();
        assert_eq!((new, reused), (1, 5), "{shown}:\n{}", seen.join("\n"));
    }
}

#[test]
fn the_json_log_says_whether_a_handshake_resumed() {
    let dir = TempDir::new("resume-json");
    let files = certs(&dir, "localhost");
    let origin = Origin::start().unwrap();
    let (_, toml, request) = ports(&files, &origin).swap_remove(0);
    let proxy = Proxy::from_toml(&format!("[log]\nformat = \"json\"\n{toml}"));
    let config = client_config(&files.ca, None);
    for _ in 0..2 {
        // The answer comes after the tickets, so the client holds one when it is read.
        let mut tls = tls_connect(proxy.addr(), "localhost", &config).unwrap();
        assert_eq!(exchange(&mut tls, request.as_bytes()).status, 200);
    }
    let lines = tls_lines(&proxy, "\"tls_version\"", 2);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains("\"tls_resumed\":false"), "{}", lines[0]);
    assert!(lines[1].contains("\"tls_resumed\":true"), "{}", lines[1]);
}
