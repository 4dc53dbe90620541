//! The acceptor against tokens a real Kerberos client makes: MIT's GSS-API through
//! python3-gssapi (Debian's), with a ticket from a real KDC (`rustle_bench::kdc::Kdc`).
//! The client also checks the acceptor's reply (mutual authentication) and says whether
//! its context completed.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use base64::Engine;
use rustle_bench::kdc::{Kdc, REALM};

use super::*;

/// The initiator: prints its first token (base64), reads the acceptor's reply (base64 or
/// `-`), steps with it and prints whether the context completed.
const CLIENT: &str = r#"
import base64, sys, gssapi
mech = gssapi.OID.from_int_seq(sys.argv[1])
flags = gssapi.RequirementFlag.mutual_authentication if sys.argv[2] == "mutual" else 0
name = gssapi.Name("HTTP@localhost", gssapi.NameType.hostbased_service)
ctx = gssapi.SecurityContext(name=name, mech=mech, usage="initiate", flags=flags)
print(base64.b64encode(ctx.step()).decode(), flush=True)
reply = sys.stdin.readline().strip()
if reply != "-":
    ctx.step(base64.b64decode(reply))
print("complete" if ctx.complete else "incomplete", flush=True)
"#;

const SPNEGO: &str = "1.3.6.1.5.5.2";
const KRB5: &str = "1.2.840.113554.1.2.2";

/// Debian's python3 (with python3-gssapi), even where another python3 is first on PATH.
fn python() -> Option<&'static str> {
    let ok = Command::new("/usr/bin/python3")
        .args(["-c", "import gssapi"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        rustle_bench::tools::missing("python3-gssapi");
        return None;
    }
    Some("/usr/bin/python3")
}

fn kerberos(kdc: &Kdc) -> Kerberos {
    Kerberos {
        keytab: kdc.keytab(),
        service_principal: Some("HTTP/localhost".into()),
        realms: vec![REALM.into()],
        strip_realm: true,
    }
}

/// Runs the client as `user` under `mech`; `answer` gets its token and gives the reply
/// (None: none). Gives the client's last word.
fn exchange(
    kdc: &Kdc,
    python: &str,
    user: &str,
    mech: &str,
    mutual: bool,
    answer: impl FnOnce(&[u8]) -> Option<Vec<u8>>,
) -> String {
    let mut child = Command::new(python)
        .args(["-c", CLIENT, mech, if mutual { "mutual" } else { "none" }])
        .envs(kdc.env(user))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python3");
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    out.read_line(&mut line).expect("the client's token");
    let b64 = base64::engine::general_purpose::STANDARD;
    let token = b64.decode(line.trim()).expect("base64 token");
    let reply = answer(&token).map_or("-".to_string(), |r| b64.encode(r));
    let mut stdin = child.stdin.take().expect("piped");
    let _ = writeln!(stdin, "{reply}");
    drop(stdin);
    line.clear();
    let _ = out.read_line(&mut line);
    let _ = child.wait();
    line.trim().to_string()
}

#[test]
fn a_spnego_token_with_mutual_authentication_names_the_user_and_the_client_completes() {
    let Some(python) = python() else { return };
    let Some(kdc) = Kdc::start(&[("alice", "alice-pw")]) else { return };
    kdc.kinit("alice", "alice-pw").expect("kinit");
    let acceptor = Acceptor::new(&kerberos(&kdc)).expect("acceptor");
    let mut seen = None;
    let last = exchange(&kdc, python, "alice", SPNEGO, true, |token| {
        let accepted = acceptor.accept(token).expect("accepted");
        seen = Some(accepted.clone());
        accepted.reply
    });
    let accepted = seen.expect("a token");
    assert_eq!(accepted.principal, format!("alice@{REALM}"));
    assert_eq!(accepted.user, "alice");
    assert_eq!(last, "complete", "the client accepted the AP-REP");
}

#[test]
fn a_bare_kerberos_token_is_accepted_and_a_replay_refused() {
    let Some(python) = python() else { return };
    let Some(kdc) = Kdc::start(&[("bob", "bob-pw")]) else { return };
    kdc.kinit("bob", "bob-pw").expect("kinit");
    let mut cfg = kerberos(&kdc);
    cfg.strip_realm = false;
    let acceptor = Acceptor::new(&cfg).expect("acceptor");
    let mut token = Vec::new();
    let last = exchange(&kdc, python, "bob", KRB5, false, |t| {
        token = t.to_vec();
        let accepted = acceptor.accept(t).expect("accepted");
        assert_eq!(accepted.user, format!("bob@{REALM}"));
        accepted.reply
    });
    assert_eq!(last, "complete");
    let replay = acceptor.accept(&token).expect_err("a replay");
    assert!(replay.contains("replayed"), "{replay}");
}

#[test]
fn refusals_say_why() {
    let Some(python) = python() else { return };
    let long = "l".repeat(65);
    let Some(kdc) = Kdc::start(&[("carol", "carol-pw"), (&long, "long-pw")]) else { return };
    kdc.kinit("carol", "carol-pw").expect("kinit");
    kdc.kinit(&long, "long-pw").expect("kinit");
    let acceptor = Acceptor::new(&kerberos(&kdc)).expect("acceptor");
    let garbage = acceptor.accept(b"\x60\x03\x06\x01\x00").expect_err("garbage");
    assert!(garbage.contains("token"), "{garbage}");
    let mut other = kerberos(&kdc);
    other.realms = vec!["ELSEWHERE.TEST".into()];
    let elsewhere = Acceptor::new(&other).expect("acceptor");
    let mut token = Vec::new();
    exchange(&kdc, python, "carol", SPNEGO, false, |t| {
        token = t.to_vec();
        None
    });
    let e = elsewhere.accept(&token).expect_err("another realm");
    assert!(e.contains("realm RUSTLE.TEST is not accepted"), "{e}");
    // Every truncation of a real token is refused, by the framing and DER readers
    // themselves (no panic caught).
    for n in 0..token.len() {
        assert!(acceptor.accept_at(&token[..n], unix_now()).is_err(), "prefix {n}");
    }
    // An hour later, the authenticator is too old.
    let e = acceptor.accept_at(&token, unix_now() + 3600).expect_err("too old");
    assert!(e.contains("clock"), "{e}");
    // A name longer than any user name may be.
    let mut long_token = Vec::new();
    exchange(&kdc, python, &long, SPNEGO, false, |t| {
        long_token = t.to_vec();
        None
    });
    let e = acceptor.accept(&long_token).expect_err("too long");
    assert!(e.contains("not a usable user name"), "{e}");
    // With the key of another service, the ticket cannot be opened.
    let mut wrong = kerberos(&kdc);
    wrong.service_principal = Some("HTTP/elsewhere".into());
    let e = Acceptor::new(&wrong).expect_err("no key");
    assert!(e.contains("no aes or des3 key of HTTP/elsewhere"), "{e}");
    let e = Acceptor::new(&Kerberos { keytab: kdc.dir().join("none"), ..kerberos(&kdc) })
        .expect_err("no keytab");
    assert!(e.contains("auth.kerberos.keytab"), "{e}");
}
