//! The ldap backend against a real slapd (`rustle_bench::slapd`), loaded with its example
//! people: alice (admins, staff), bob (staff), carol (disabled), a service account.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use rustle_bench::slapd::{Slapd, PEOPLE as LDIF};

use super::super::{Ask, Failure, Grant, Verdict};
use super::{fill, group_name, rdns, under, Ldap};
use crate::config::LdapBackend;

const ALICE: &str = "uid=alice,ou=people,dc=example,dc=org";

fn ask(user: &str, password: &str) -> Ask {
    Ask {
        user: user.into(),
        password: password.as_bytes().to_vec(),
        client: IpAddr::V4(Ipv4Addr::LOCALHOST),
        listener: "test".into(),
        protocol: "http",
        target: None,
    }
}

fn settings(toml_text: &str) -> LdapBackend {
    toml::from_str(toml_text).expect("ldap settings")
}

/// Bind as `uid={user},ou=people,...`, groups from memberOf, carol disabled.
fn template(url: &str, more: &str) -> Ldap {
    let cfg = settings(&format!(
        "url = {url:?}\n\
         bind_dn_template = \"uid={{user}},ou=people,dc=example,dc=org\"\n\
         group_attribute = \"memberOf\"\n\
         disabled_filter = \"employeeType=disabled\"\n\
         {more}"
    ));
    Ldap::new(&cfg).expect("backend")
}

/// Search as the service account, then bind; groups searched.
fn search_bind(slapd: &Slapd, more: &str) -> Ldap {
    let password = slapd.dir().join("svc.password");
    std::fs::write(&password, "svc-secret\n").expect("write the service password");
    let cfg = settings(&format!(
        "url = {:?}\n\
         bind_dn = \"cn=svc,dc=example,dc=org\"\n\
         bind_password_file = {:?}\n\
         base_dn = \"ou=people,dc=example,dc=org\"\n\
         user_filter = \"(&(objectClass=inetOrgPerson)(uid={{user}}))\"\n\
         group_base_dn = \"ou=groups,dc=example,dc=org\"\n\
         group_filter = \"(&(objectClass=groupOfNames)(member={{dn}}))\"\n\
         disabled_filter = \"(employeeType=disabled)\"\n\
         {more}",
        slapd.url(),
        password.display().to_string(),
    ));
    Ldap::new(&cfg).expect("backend")
}

fn allowed(groups: &[&str]) -> Result<Verdict, Failure> {
    let mut groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
    groups.sort();
    Ok(Verdict::Allow(Grant { groups, ..Grant::default() }))
}

fn sorted(v: Result<Verdict, Failure>) -> Result<Verdict, Failure> {
    match v {
        Ok(Verdict::Allow(mut g)) => {
            g.groups.sort();
            Ok(Verdict::Allow(g))
        }
        other => other,
    }
}

#[test]
fn the_backend_is_send_and_sync() {
    fn both<T: Send + Sync>() {}
    both::<Ldap>();
}

#[tokio::test]
async fn a_template_bind_allows_refuses_and_passes_on() {
    let Some(slapd) = Slapd::start(LDIF) else { return };
    let b = template(&slapd.url(), "");
    assert_eq!(sorted(b.check(&ask("alice", "wonderland")).await), allowed(&["admins", "staff"]));
    assert_eq!(sorted(b.check(&ask("bob", "builder")).await), allowed(&["staff"]));
    assert_eq!(b.check(&ask("alice", "wrong")).await, Ok(Verdict::Deny));
    // No entry for the name, and no service account to prove it: an anonymous search
    // cannot tell an absent entry from a hidden one, so the name is refused.
    assert_eq!(b.check(&ask("zed", "whatever")).await, Ok(Verdict::Deny));
    // The disabled account, with its right password.
    assert_eq!(b.check(&ask("carol", "carol-pw")).await, Ok(Verdict::Deny));
}

#[tokio::test]
async fn a_template_with_group_search_as_the_user_or_the_service_account() {
    let Some(slapd) = Slapd::start(LDIF) else { return };
    let groups = "group_base_dn = \"ou=groups,dc=example,dc=org\"\n\
                  group_filter = \"(&(objectClass=groupOfNames)(member={dn}))\"\n";
    // Groups from the search only (no memberOf).
    let only_search = |more: &str| {
        let cfg = settings(&format!(
            "url = {:?}\nbind_dn_template = \"uid={{user}},ou=people,dc=example,dc=org\"\n\
             {groups}{more}",
            slapd.url()
        ));
        Ldap::new(&cfg).expect("backend")
    };
    // No service account: the groups are searched as the user just bound.
    let as_user = only_search("");
    assert_eq!(
        sorted(as_user.check(&ask("alice", "wonderland")).await),
        allowed(&["admins", "staff"])
    );
    // With one: the same, and an unknown name is told apart from a wrong password by it.
    let password = slapd.dir().join("svc.password");
    std::fs::write(&password, "svc-secret").expect("write the service password");
    let b = only_search(&format!(
        "bind_dn = \"cn=svc,dc=example,dc=org\"\nbind_password_file = {:?}\n",
        password.display().to_string()
    ));
    assert_eq!(sorted(b.check(&ask("bob", "builder")).await), allowed(&["staff"]));
    assert_eq!(b.check(&ask("alice", "nope")).await, Ok(Verdict::Deny));
    assert_eq!(b.check(&ask("zed", "nope")).await, Ok(Verdict::Unknown));
}

#[tokio::test]
async fn an_empty_password_is_refused_without_a_bind() {
    let Some(slapd) = Slapd::start(LDIF) else { return };
    for b in [template(&slapd.url(), ""), search_bind(&slapd, "")] {
        assert_eq!(b.check(&ask("alice", "")).await, Ok(Verdict::Deny));
    }
    assert_eq!(slapd.binds(ALICE), 0, "an unauthenticated bind was sent");
}

#[tokio::test]
async fn search_then_bind_finds_the_user_and_its_groups() {
    let Some(slapd) = Slapd::start(LDIF) else { return };
    let b = search_bind(&slapd, "");
    assert_eq!(sorted(b.check(&ask("alice", "wonderland")).await), allowed(&["admins", "staff"]));
    assert_eq!(sorted(b.check(&ask("bob", "builder")).await), allowed(&["staff"]));
    assert_eq!(b.check(&ask("bob", "wonderland")).await, Ok(Verdict::Deny));
    assert_eq!(b.check(&ask("zed", "wonderland")).await, Ok(Verdict::Unknown));
    assert_eq!(b.check(&ask("carol", "carol-pw")).await, Ok(Verdict::Deny));
    // Searches share the pool; the binds as users ran on connections of their own.
    assert_eq!(slapd.binds(ALICE), 1);
}

#[tokio::test]
async fn user_names_cannot_widen_filters_or_dns() {
    let Some(slapd) = Slapd::start(LDIF) else { return };
    let names = ["*", "*)(uid=*", "alice)(|(uid=*", "al*", "alice\0", "alice,ou=people", "{dn}"];
    for b in [search_bind(&slapd, ""), template(&slapd.url(), "")] {
        for name in names {
            let v = b.check(&ask(name, "wonderland")).await;
            assert!(
                matches!(v, Ok(Verdict::Unknown) | Ok(Verdict::Deny)),
                "{name:?} with alice's password: {v:?}"
            );
        }
    }
}

#[tokio::test]
async fn ldaps_and_starttls_verify_the_directory() {
    let Some(slapd) = Slapd::start(LDIF) else { return };
    let ca = format!("ca = {:?}", slapd.ca_file().display().to_string());
    let ldaps = template(&slapd.tls_url(), &ca);
    assert_eq!(
        sorted(ldaps.check(&ask("alice", "wonderland")).await),
        allowed(&["admins", "staff"])
    );
    let starttls = template(&slapd.url(), &format!("starttls = true\n{ca}"));
    assert_eq!(starttls.check(&ask("alice", "wrong")).await, Ok(Verdict::Deny));
    assert_eq!(sorted(starttls.check(&ask("bob", "builder")).await), allowed(&["staff"]));
    // The system roots do not know the test CA: no answer, not a verdict.
    let untrusted = template(&slapd.tls_url(), "");
    let v = untrusted.check(&ask("alice", "wonderland")).await;
    assert!(matches!(v, Err(Failure::Unreachable(_))), "{v:?}");
}

#[tokio::test]
async fn a_stopped_directory_fails_and_a_restarted_one_answers() {
    let Some(mut slapd) = Slapd::start(LDIF) else { return };
    let b = search_bind(&slapd, "pool_size = 1");
    assert_eq!(sorted(b.check(&ask("bob", "builder")).await), allowed(&["staff"]));
    slapd.stop();
    let v = b.check(&ask("bob", "builder")).await;
    assert!(matches!(v, Err(Failure::Unreachable(_))), "{v:?}");
    slapd.restart().expect("restart slapd");
    // The kept connection died with the server: the call opens another.
    assert_eq!(sorted(b.check(&ask("bob", "builder")).await), allowed(&["staff"]));
}

#[tokio::test]
async fn a_silent_directory_times_out_and_calls_beyond_max_in_flight_are_refused() {
    let Some(slapd) = Slapd::start(LDIF) else { return };
    let b = search_bind(&slapd, "timeout = \"300ms\"\nmax_in_flight = 1");
    assert_eq!(sorted(b.check(&ask("bob", "builder")).await), allowed(&["staff"]));
    slapd.pause();
    let began = Instant::now();
    let (bob, alice) = (ask("bob", "builder"), ask("alice", "wonderland"));
    let (first, second) = tokio::join!(b.check(&bob), b.check(&alice));
    slapd.resume();
    assert_eq!(first, Err(Failure::Timeout));
    assert_eq!(second, Err(Failure::Overloaded));
    assert!(began.elapsed() < Duration::from_secs(2), "{:?}", began.elapsed());
    assert_eq!(sorted(b.check(&ask("bob", "builder")).await), allowed(&["staff"]));
}

/// The service account's password file in the server's directory, as settings lines.
fn service(slapd: &Slapd) -> String {
    let password = slapd.dir().join("svc.password");
    std::fs::write(&password, "svc-secret\n").expect("write the service password");
    format!(
        "bind_dn = \"cn=svc,dc=example,dc=org\"\nbind_password_file = {:?}\n",
        password.display().to_string()
    )
}

#[tokio::test]
async fn a_name_that_is_not_the_entrys_own_is_refused() {
    let Some(slapd) = Slapd::start(LDIF) else { return };
    let ad_like = settings(&format!(
        "url = {:?}\nbind_dn_template = \"uid={{user}},ou=people,dc=example,dc=org\"\n\
         user_attribute = \"cn\"",
        slapd.url()
    ));
    let by_cn = Ldap::new(&ad_like).expect("backend");
    for b in [template(&slapd.url(), ""), search_bind(&slapd, "")] {
        // The directory matches these as alice, and the password is hers.
        for name in ["ALICE", "Alice", "alice ", " alice"] {
            assert_eq!(b.check(&ask(name, "wonderland")).await, Ok(Verdict::Deny), "{name:?}");
        }
        assert_eq!(sorted(b.check(&ask("bob", "builder")).await), allowed(&["staff"]));
    }
    // Another attribute holds the name: alice's cn is `Alice`.
    assert_eq!(by_cn.check(&ask("alice", "wonderland")).await, Ok(Verdict::Deny));
}

#[tokio::test]
async fn an_entry_or_attribute_the_reader_cannot_see_never_passes() {
    let Some(slapd) = Slapd::start(LDIF) else { return };
    let as_user = template(&slapd.url(), "");
    let as_service = template(&slapd.url(), &service(&slapd));
    // erin binds, but her entry is the service account's to read.
    let v = as_user.check(&ask("erin", "erin-pw")).await;
    assert!(
        matches!(&v, Err(Failure::Protocol(e)) if e.contains("cannot read the user's entry")),
        "{v:?}"
    );
    assert_eq!(as_service.check(&ask("erin", "erin-pw")).await, allowed(&[]));
    // Her wrong password: hidden from the anonymous search, she is not taken as absent.
    assert_eq!(as_user.check(&ask("erin", "wrong")).await, Ok(Verdict::Deny));
    assert_eq!(as_service.check(&ask("erin", "wrong")).await, Ok(Verdict::Deny));
    // The service account proves an entry absent.
    assert_eq!(as_service.check(&ask("zed", "wrong")).await, Ok(Verdict::Unknown));
    // frank is disabled, in an attribute only the service account reads.
    let v = as_user.check(&ask("frank", "frank-pw")).await;
    assert!(matches!(&v, Err(Failure::Protocol(e)) if e.contains("disabled_filter")), "{v:?}");
    assert_eq!(as_service.check(&ask("frank", "frank-pw")).await, Ok(Verdict::Deny));
    assert_eq!(search_bind(&slapd, "").check(&ask("frank", "frank-pw")).await, Ok(Verdict::Deny));
}

#[tokio::test]
async fn groups_count_only_under_group_base_dn_and_only_valid_names() {
    let Some(slapd) = Slapd::start(LDIF) else { return };
    // dave: `Domain Users` (not a name rules can hold) and an `admins` under ou=elsewhere.
    let anywhere = template(&slapd.url(), "");
    assert_eq!(anywhere.check(&ask("dave", "dave-pw")).await, allowed(&["admins"]));
    let under_groups = template(&slapd.url(), "group_base_dn = \"OU=Groups, dc=example,dc=org\"");
    assert_eq!(under_groups.check(&ask("dave", "dave-pw")).await, allowed(&[]));
    assert_eq!(
        sorted(under_groups.check(&ask("alice", "wonderland")).await),
        allowed(&["admins", "staff"])
    );
}

#[tokio::test]
async fn a_name_with_several_entries_is_refused() {
    let Some(slapd) = Slapd::start(LDIF) else { return };
    let cfg = settings(&format!(
        "url = {:?}\n{}base_dn = \"dc=example,dc=org\"\n\
         user_filter = \"(&(objectClass=inetOrgPerson)(uid={{user}}))\"",
        slapd.url(),
        service(&slapd)
    ));
    let b = Ldap::new(&cfg).expect("backend");
    assert_eq!(b.check(&ask("grace", "grace-pw")).await, Ok(Verdict::Deny));
    assert_eq!(slapd.binds("uid=grace,ou=people,dc=example,dc=org"), 0);
    assert_eq!(b.check(&ask("bob", "builder")).await, allowed(&[]));
}

#[test]
fn dns_under_a_base() {
    let base = rdns("ou=groups, DC=example,dc=org");
    assert!(under("cn=admins,ou=groups,dc=example,dc=org", &base));
    assert!(under("CN=x,OU=Groups,DC=Example,DC=Org", &base));
    assert!(!under("cn=admins,ou=elsewhere,dc=example,dc=org", &base));
    assert!(!under("ou=groups,dc=example,dc=org", &base));
    assert!(!under("cn=a\\,ou=groups,dc=example,dc=org", &rdns("ou=groups\\,dc=example,dc=org")));
    assert!(under("cn=a,dc=org", &rdns("")));
}

#[test]
fn settings_are_checked() {
    let problems = |text: &str| settings(text).problems().join("\n");
    let ok = "url = \"ldap://h\"\nbind_dn_template = \"uid={user},dc=x\"\n";
    assert_eq!(problems(ok), "");
    for (text, says) in [
        ("url = \"http://h\"\nbind_dn_template = \"uid={user}\"", "expected ldap://"),
        ("url = \"ldaps://h\"\nstarttls = true\nbind_dn_template = \"uid={user}\"", "starttls"),
        ("url = \"ldap://h\"", "needs bind_dn_template"),
        ("url = \"ldap://h\"\nbind_dn_template = \"uid=x\"", "must contain {user}"),
        ("url = \"ldap://h\"\nbase_dn = \"dc=x\"", "go together"),
        ("url = \"ldap://h\"\nbase_dn = \"dc=x\"\nuser_filter = \"(uid=x)\"", "{user}"),
        (
            "url = \"ldap://h\"\nbase_dn = \"dc=x\"\nuser_filter = \"(uid={user}\"",
            "not an LDAP filter",
        ),
        (
            "url = \"ldap://h\"\nbind_dn_template = \"uid={user}\"\nbind_dn = \"cn=svc\"",
            "bind_dn and bind_password_file",
        ),
        ("url = \"ldap://h\"\nbind_dn_template = \"uid={user}\"\npool_size = 0", "pool_size"),
        (
            "url = \"ldap://h\"\nbind_dn_template = \"uid={user}\"\nuser_attribute = \"u id\"",
            "user_attribute",
        ),
        (
            "url = \"ldap://h\"\nbind_dn_template = \"uid={user}\"\ngroup_base_dn = \"dc=x\"",
            "group_base_dn needs",
        ),
        (
            "url = \"ldap://h\"\nbind_dn_template = \"uid={user}\"\ngroup_filter = \"(member={dn})\"",
            "group_filter needs group_base_dn",
        ),
    ] {
        let got = problems(text);
        assert!(got.contains(says), "{text:?}: {got:?}");
    }
    // AD's matching rule, written without parentheses.
    let ad = "url = \"ldap://h\"\nbind_dn_template = \"{user}@example.org\"\n\
              disabled_filter = \"userAccountControl:1.2.840.113556.1.4.803:=2\"";
    assert_eq!(problems(ad), "");
    assert!(toml::from_str::<LdapBackend>("url = \"ldap://h\"\nbogus = 1").is_err());
}

#[test]
fn group_names_are_the_first_rdn_values() {
    assert_eq!(group_name("cn=admins,ou=groups,dc=example,dc=org"), "admins");
    assert_eq!(group_name("CN=Domain Users,CN=Users,DC=ad,DC=example"), "Domain Users");
    assert_eq!(group_name("cn=a\\2cb\\,c,ou=groups"), "a,b,c");
    assert_eq!(group_name("cn=x+uid=y,ou=g"), "x");
    assert_eq!(group_name("plain"), "plain");
}

#[test]
fn fill_replaces_keys_once() {
    assert_eq!(
        fill("(member={dn})", &[("{dn}", "uid={user}"), ("{user}", "u")]),
        "(member=uid={user})"
    );
    assert_eq!(fill("(&(a={user})(b={user}))", &[("{user}", "x")]), "(&(a=x)(b=x))");
    assert_eq!(fill("é{user}é", &[("{user}", "x")]), "éxé");
}

/// The `[[auth.backend]]` block of rustle.example.toml, uncommented, names only real keys.
#[test]
fn the_example_block_names_real_keys() {
    let text = include_str!("../../../../../../../rustle.example.toml");
    let start = text.find("# [[auth.backend]]\n# kind = \"ldap\"").expect("an ldap example");
    let block: String = text[start..]
        .lines()
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.strip_prefix("# "))
        .filter(|l| !l.starts_with("[["))
        .map(|l| format!("{l}\n"))
        .collect();
    let parsed: crate::config::BackendConfig =
        toml::from_str(&block).unwrap_or_else(|e| panic!("{e}\n{block}"));
    let crate::config::BackendConfig::Ldap(cfg) = parsed else { panic!("not ldap: {block}") };
    assert_eq!(cfg.group_attribute.as_deref(), Some("memberOf"));
    assert!(cfg.disabled_filter.is_some() && cfg.bind_password_file.is_some());
}
