//! The ldap backend: a directory checks the password by a simple bind as the user.
//!
//! The user's DN comes from `bind_dn_template` or from a search (`base_dn`, `user_filter`)
//! on one of `pool_size` connections kept open (bound as the service account, or
//! anonymous). The bind as the user runs on a connection of its own, opened for the call
//! and closed after it, so that no pooled connection ever carries a user's identity. Then
//! the entry is read (`user_attribute`, a lock attribute, `disabled_filter`,
//! `group_attribute`) and the groups searched, as the service account when there is one,
//! else as the user. An entry that this reader cannot see, or whose `disabled_filter`
//! attributes it cannot read, is a `Failure`, never an account taken as enabled.
//!
//! Verdicts: no entry for the name is `Unknown` (the next backend is asked): with a
//! template, only when the service account finds no entry at the DN (without one, a
//! refused bind is `Deny`: an entry hidden from an anonymous search looks absent). A
//! refused bind, a disabled or locked account, a name that is not the entry's
//! `user_attribute` byte for byte, a name that `user_filter` finds several entries for
//! and an empty password are `Deny`; a directory that cannot be reached or answers late
//! is a `Failure`. Group names are the ones rules can name (`valid_group`); others are
//! left out. User names are escaped wherever they
//! go: RFC 4515 in filters, RFC 4514 in DNs. More than `max_in_flight` calls at once are
//! refused at once (`Failure::Unreachable`), not queued: the caller's timeout would pass
//! in the queue anyway.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ldap3::{
    dn_escape, ldap_escape, LdapConnAsync, LdapConnSettings, LdapError, ResultEntry, Scope,
    SearchEntry,
};
use rustls::ClientConfig;
use tokio::sync::Semaphore;

use super::{valid_group, Ask, Failure, Grant, Verdict};
use crate::config::LdapBackend;
use crate::io::tls::{provider, roots_from, system_roots};

/// Result codes of RFC 4511 that the backend tells apart.
mod rc {
    pub(super) const SUCCESS: u32 = 0;
    pub(super) const SIZE_LIMIT_EXCEEDED: u32 = 4;
    pub(super) const CONSTRAINT_VIOLATION: u32 = 19;
    pub(super) const NO_SUCH_OBJECT: u32 = 32;
    pub(super) const INVALID_DN_SYNTAX: u32 = 34;
    pub(super) const INAPPROPRIATE_AUTHENTICATION: u32 = 48;
    pub(super) const INVALID_CREDENTIALS: u32 = 49;
    pub(super) const INSUFFICIENT_ACCESS_RIGHTS: u32 = 50;
    pub(super) const BUSY: u32 = 51;
    pub(super) const UNAVAILABLE: u32 = 52;
    pub(super) const UNWILLING_TO_PERFORM: u32 = 53;
}

/// The operational attribute of a locked account (the password policy overlay's, and
/// other servers' of the same draft): an entry carrying it is refused.
const LOCKED_ATTRIBUTE: &str = "pwdAccountLockedTime";

/// Where the user's entry is.
enum Find {
    /// `bind_dn_template`.
    Template(String),
    /// `base_dn`, `user_filter`.
    Search { base: String, filter: String },
}

/// Boxed: `Backend`'s variants stay small.
pub(crate) struct Ldap(Box<State>);

struct State {
    name: String,
    url: String,
    starttls: bool,
    /// For `ldaps://` and StartTLS.
    tls: Option<Arc<ClientConfig>>,
    timeout: Duration,
    find: Find,
    /// The service account's DN and password.
    service: Option<(String, String)>,
    user_attribute: String,
    group_attribute: Option<String>,
    /// The RDNs of `group_base_dn` (see `rdns`): `group_attribute`'s DNs count only under it.
    group_base: Option<Vec<String>>,
    /// `group_base_dn`, `group_filter`.
    group_search: Option<(String, String)>,
    group_name_attribute: String,
    disabled_filter: Option<String>,
    in_flight: Semaphore,
    /// Search connections; `None` until first used, and again after a failure.
    pool: Mutex<Vec<Option<ldap3::Ldap>>>,
    next: AtomicUsize,
}

impl Ldap {
    pub(crate) fn new(cfg: &LdapBackend) -> Result<Ldap, String> {
        State::new(cfg).map(|s| Ldap(Box::new(s)))
    }

    pub(crate) async fn check(&self, ask: &Ask) -> Result<Verdict, Failure> {
        self.0.check(ask).await
    }
}

impl State {
    fn new(cfg: &LdapBackend) -> Result<State, String> {
        let problems = cfg.problems();
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        let name = cfg.common().name;
        let tls = if cfg.starttls || cfg.url.to_ascii_lowercase().starts_with("ldaps://") {
            Some(client_config(cfg)?)
        } else {
            None
        };
        let service = match (&cfg.bind_dn, &cfg.bind_password_file) {
            (Some(dn), Some(file)) => {
                let text = std::fs::read_to_string(file)
                    .map_err(|e| format!("bind_password_file {}: {e}", file.display()))?;
                let password = text.lines().next().unwrap_or_default().to_string();
                if password.is_empty() {
                    return Err(format!("bind_password_file {} is empty", file.display()));
                }
                Some((dn.clone(), password))
            }
            _ => None,
        };
        let find = match (&cfg.bind_dn_template, &cfg.base_dn, &cfg.user_filter) {
            (Some(t), _, _) => Find::Template(t.clone()),
            (None, Some(base), Some(filter)) => {
                Find::Search { base: base.clone(), filter: LdapBackend::parenthesized(filter) }
            }
            // problems() has refused every other shape.
            _ => return Err("no way to find users".into()),
        };
        Ok(State {
            name,
            url: cfg.url.clone(),
            starttls: cfg.starttls,
            tls,
            timeout: cfg.timeout,
            find,
            service,
            user_attribute: cfg.user_attribute.clone(),
            group_attribute: cfg.group_attribute.clone(),
            group_base: cfg.group_base_dn.as_deref().map(rdns),
            group_search: cfg
                .group_base_dn
                .clone()
                .zip(cfg.group_filter.as_deref().map(LdapBackend::parenthesized)),
            group_name_attribute: cfg.group_name_attribute.clone(),
            disabled_filter: cfg.disabled_filter.as_deref().map(LdapBackend::parenthesized),
            in_flight: Semaphore::new(cfg.max_in_flight),
            pool: Mutex::new(vec![None; cfg.pool_size]),
            next: AtomicUsize::new(0),
        })
    }

    async fn check(&self, ask: &Ask) -> Result<Verdict, Failure> {
        let Ok(_permit) = self.in_flight.try_acquire() else {
            return Err(Failure::Overloaded);
        };
        // An empty password makes a simple bind unauthenticated (RFC 4513 5.1.2), which
        // many directories accept: never sent.
        if ask.password.is_empty() {
            return Ok(Verdict::Deny);
        }
        let Ok(password) = std::str::from_utf8(&ask.password) else {
            return Ok(Verdict::Deny);
        };
        if ask.user.is_empty() {
            return Ok(Verdict::Unknown);
        }
        match tokio::time::timeout(self.timeout, self.decide(&ask.user, password)).await {
            Ok(verdict) => verdict,
            Err(_) => {
                // A connection that answered nothing in time may be wedged: all are
                // opened afresh on the next calls.
                self.drop_pool();
                Err(Failure::Timeout)
            }
        }
    }

    async fn decide(&self, user: &str, password: &str) -> Result<Verdict, Failure> {
        let dn = match &self.find {
            Find::Template(t) => fill(t, &[("{user}", &dn_escape(user))]),
            Find::Search { base, filter } => {
                let filter = fill(filter, &[("{user}", &ldap_escape(user))]);
                let found = self.search_pooled(base, Scope::Subtree, &filter, &["1.1"]).await?;
                match present(found, base)?.as_slice() {
                    [] => return Ok(Verdict::Unknown),
                    [one] => one.dn.clone(),
                    more => {
                        // Which of them the password is for is not the directory's to
                        // choose by bind order: refused.
                        tracing::warn!(
                            backend = %self.name,
                            user,
                            entries = more.len(),
                            "ldap: user_filter finds several entries for the name: refused"
                        );
                        return Ok(Verdict::Deny);
                    }
                }
            }
        };
        let mut own = self.connect().await?;
        let verdict = self.bind_and_read(&mut own, user, &dn, password).await;
        // The connection goes either way; a failed unbind changes nothing.
        let _ = own.unbind().await;
        verdict
    }

    async fn bind_and_read(
        &self,
        own: &mut ldap3::Ldap,
        user: &str,
        dn: &str,
        password: &str,
    ) -> Result<Verdict, Failure> {
        let bound = own.simple_bind(dn, password).await.map_err(failure)?;
        match bound.rc {
            rc::SUCCESS => {}
            rc::INVALID_CREDENTIALS
            | rc::INAPPROPRIATE_AUTHENTICATION
            | rc::INSUFFICIENT_ACCESS_RIGHTS
            | rc::UNWILLING_TO_PERFORM
            | rc::CONSTRAINT_VIOLATION => {
                // A template names DNs that may not exist; a directory answers
                // invalidCredentials for both. An entry the service account finds absent
                // is Unknown; without one nothing proves it absent.
                if matches!(self.find, Find::Template(_)) && !self.exists(dn).await? {
                    return Ok(Verdict::Unknown);
                }
                return Ok(Verdict::Deny);
            }
            // A name that makes no DN (AD's `{user}@domain` template aside) names nobody.
            rc::INVALID_DN_SYNTAX => return Ok(Verdict::Unknown),
            rc::BUSY | rc::UNAVAILABLE => {
                return Err(Failure::Unreachable(format!(
                    "the directory is not answering binds (result {}: {})",
                    bound.rc, bound.text
                )))
            }
            other => {
                return Err(Failure::Protocol(format!(
                    "bind ended with result {other}: {}",
                    bound.text
                )))
            }
        }
        // AD's `{user}@domain` template binds with a name that is not a DN: the entry is
        // then the one of that userPrincipalName.
        let entry_dn;
        let dn = if dn.contains('=') {
            dn
        } else {
            entry_dn = self.principal_entry(own, dn).await?;
            entry_dn.as_str()
        };
        let mut attrs = vec![LOCKED_ATTRIBUTE, self.user_attribute.as_str()];
        if let Some(a) = &self.group_attribute {
            attrs.push(a);
        }
        let entry = self.read(own, dn, Scope::Base, "(objectClass=*)", &attrs).await?;
        let Some(entry) = entry.unwrap_or_default().into_iter().next() else {
            return Err(Failure::Protocol(format!("cannot read the user's entry {dn}")));
        };
        match values(&entry, &self.user_attribute) {
            [name] if name == user => {}
            [] => {
                return Err(Failure::Protocol(format!(
                    "the user's entry {dn} shows no {} (user_attribute)",
                    self.user_attribute
                )))
            }
            other => {
                tracing::debug!(
                    backend = %self.name,
                    user,
                    found = ?other,
                    "ldap: the name is not the entry's {}: refused",
                    self.user_attribute
                );
                return Ok(Verdict::Deny);
            }
        }
        if !values(&entry, LOCKED_ATTRIBUTE).is_empty() {
            tracing::debug!(backend = %self.name, user, "ldap: the account is locked");
            return Ok(Verdict::Deny);
        }
        if let Some(f) = &self.disabled_filter {
            // The entry is read above; one that matches neither the filter nor its negation
            // has attributes this reader cannot see (the filter is Undefined).
            let enabled = format!("(!{f})");
            let found = |r: Option<Vec<SearchEntry>>| r.is_some_and(|e| !e.is_empty());
            if !found(self.read(own, dn, Scope::Base, &enabled, &["1.1"]).await?) {
                if found(self.read(own, dn, Scope::Base, f, &["1.1"]).await?) {
                    tracing::debug!(backend = %self.name, user, "ldap: the account is disabled");
                    return Ok(Verdict::Deny);
                }
                return Err(Failure::Protocol(format!(
                    "cannot read the attributes of disabled_filter in the user's entry {dn}"
                )));
            }
        }
        let mut groups = Vec::new();
        if let Some(a) = &self.group_attribute {
            let counts = |v: &&String| match &self.group_base {
                Some(base) => v.contains('=') && under(v, base),
                None => true,
            };
            groups.extend(values(&entry, a).iter().filter(counts).map(|v| group_name(v)));
        }
        if let Some((base, filter)) = &self.group_search {
            let filter =
                fill(filter, &[("{dn}", &ldap_escape(dn)), ("{user}", &ldap_escape(user))]);
            let name_attr = self.group_name_attribute.as_str();
            let found = self.read(own, base, Scope::Subtree, &filter, &[name_attr]).await?;
            for g in present(found, base)? {
                let name = values(&g, name_attr).first().cloned();
                groups.push(name.unwrap_or_else(|| group_name(&g.dn)));
            }
        }
        groups.retain(|g| {
            let ok = valid_group(g);
            if !ok {
                tracing::debug!(
                    backend = %self.name,
                    user,
                    group = %g,
                    "ldap: a group name rules cannot name is left out"
                );
            }
            ok
        });
        let mut seen = std::collections::HashSet::new();
        groups.retain(|g| seen.insert(g.clone()));
        Ok(Verdict::Allow(Grant { groups, ..Grant::default() }))
    }

    /// The DN of the entry whose userPrincipalName is `principal`, under the directory's
    /// default naming context (Active Directory's root DSE names it).
    async fn principal_entry(
        &self,
        own: &mut ldap3::Ldap,
        principal: &str,
    ) -> Result<String, Failure> {
        let attr = "defaultNamingContext";
        let root = self.read(own, "", Scope::Base, "(objectClass=*)", &[attr]).await?;
        let root = root.unwrap_or_default();
        let Some(base) = root.first().and_then(|e| values(e, attr).first()).cloned() else {
            return Err(Failure::Protocol(
                "the directory names no defaultNamingContext to find a principal's entry".into(),
            ));
        };
        let filter = format!("(userPrincipalName={})", ldap_escape(principal));
        let found = self.read(own, &base, Scope::Subtree, &filter, &["1.1"]).await?;
        match present(found, &base)?.as_slice() {
            [one] => Ok(one.dn.clone()),
            other => Err(Failure::Protocol(format!(
                "{} entries under {base} have userPrincipalName {principal}",
                other.len()
            ))),
        }
    }

    /// A search after the user's bind: as the service account when there is one, else as
    /// the user on `own`.
    async fn read(
        &self,
        own: &mut ldap3::Ldap,
        base: &str,
        scope: Scope,
        filter: &str,
        attrs: &[&str],
    ) -> Result<Option<Vec<SearchEntry>>, Failure> {
        if self.service.is_some() {
            self.search_pooled(base, scope, filter, attrs).await
        } else {
            search(own, base, scope, filter, attrs).await
        }
    }

    /// Whether the entry `dn` exists, after a refused bind. Only the service account's
    /// "no such object" proves it absent (an anonymous search is told the same of an entry
    /// hidden from it); anything else counts as existing: the user is refused.
    async fn exists(&self, dn: &str) -> Result<bool, Failure> {
        if self.service.is_none() {
            return Ok(true);
        }
        match self.search_pooled(dn, Scope::Base, "(objectClass=*)", &["1.1"]).await {
            Ok(None) => Ok(false),
            Ok(Some(_)) | Err(Failure::Protocol(_)) => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// A search on a pooled connection; one more try on a fresh connection when a kept
    /// one turns out dead (the directory restarted since).
    async fn search_pooled(
        &self,
        base: &str,
        scope: Scope,
        filter: &str,
        attrs: &[&str],
    ) -> Result<Option<Vec<SearchEntry>>, Failure> {
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % self.pool_len();
        for attempt in 0..2 {
            let (mut conn, kept) = self.pooled(slot).await?;
            match search(&mut conn, base, scope, filter, attrs).await {
                Err(Failure::Unreachable(e)) => {
                    self.slot(slot, None);
                    if !kept || attempt == 1 {
                        return Err(Failure::Unreachable(e));
                    }
                }
                found => return found,
            }
        }
        // The loop returns on its second pass.
        Err(Failure::Unreachable("no connection".into()))
    }

    /// The connection of `slot`, opened (and bound as the service account) when it has
    /// none or its connection closed; and whether it was kept from an earlier call.
    async fn pooled(&self, slot: usize) -> Result<(ldap3::Ldap, bool), Failure> {
        let kept = self.lock()[slot].clone();
        if let Some(mut conn) = kept {
            if !conn.is_closed() {
                return Ok((conn, true));
            }
        }
        let mut conn = self.connect().await?;
        if let Some((dn, password)) = &self.service {
            let bound = conn.simple_bind(dn, password).await.map_err(failure)?;
            if bound.rc != rc::SUCCESS {
                return Err(Failure::Protocol(format!(
                    "the service account's bind is refused (result {}: {}): check bind_dn and \
                     bind_password_file",
                    bound.rc, bound.text
                )));
            }
        }
        self.slot(slot, Some(conn.clone()));
        Ok((conn, false))
    }

    /// A new connection (TLS set up), its driver running on the current runtime.
    async fn connect(&self) -> Result<ldap3::Ldap, Failure> {
        let mut settings =
            LdapConnSettings::new().set_conn_timeout(self.timeout).set_starttls(self.starttls);
        if let Some(tls) = &self.tls {
            settings = settings.set_config(Arc::clone(tls));
        }
        let (driver, conn) = LdapConnAsync::with_settings(settings, &self.url)
            .await
            .map_err(|e| Failure::Unreachable(format!("{}: {e}", self.url)))?;
        let name = self.name.clone();
        tokio::spawn(async move {
            if let Err(e) = driver.drive().await {
                tracing::debug!(backend = %name, "ldap: connection ended: {e}");
            }
        });
        Ok(conn)
    }

    fn pool_len(&self) -> usize {
        self.lock().len()
    }

    fn slot(&self, slot: usize, conn: Option<ldap3::Ldap>) {
        self.lock()[slot] = conn;
    }

    fn drop_pool(&self) {
        self.lock().iter_mut().for_each(|c| *c = None);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<ldap3::Ldap>>> {
        // The pool holds handles only: one left by a panicking holder is still usable.
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The entries of a search whose base must exist.
fn present(found: Option<Vec<SearchEntry>>, base: &str) -> Result<Vec<SearchEntry>, Failure> {
    found.ok_or_else(|| Failure::Protocol(format!("no such entry: {base}")))
}

/// One search: its entries (references and intermediate messages left out), or none when
/// its base does not exist (noSuchObject).
async fn search(
    conn: &mut ldap3::Ldap,
    base: &str,
    scope: Scope,
    filter: &str,
    attrs: &[&str],
) -> Result<Option<Vec<SearchEntry>>, Failure> {
    let found = conn.search(base, scope, filter, attrs.to_vec()).await.map_err(failure)?;
    let (entries, result) = (found.0, found.1);
    match result.rc {
        rc::SUCCESS | rc::SIZE_LIMIT_EXCEEDED => {}
        rc::NO_SUCH_OBJECT => return Ok(None),
        rc::BUSY | rc::UNAVAILABLE => {
            return Err(Failure::Unreachable(format!(
                "the directory is not answering searches (result {}: {})",
                result.rc, result.text
            )))
        }
        other => {
            return Err(Failure::Protocol(format!(
                "search under {base} ended with result {other}: {}",
                result.text
            )))
        }
    }
    let entries = entries.into_iter().filter(|e| !e.is_ref() && !e.is_intermediate());
    entries.map(entry).collect::<Result<_, _>>().map(Some)
}

/// ldap3 decodes an entry's attributes with panics on malformed ones: a directory's bad
/// message is a protocol failure here, not a dead thread.
fn entry(raw: ResultEntry) -> Result<SearchEntry, Failure> {
    catch_unwind(AssertUnwindSafe(|| SearchEntry::construct(raw)))
        .map_err(|_| Failure::Protocol("a malformed search entry".into()))
}

fn failure(e: LdapError) -> Failure {
    match e {
        LdapError::Timeout { .. } => Failure::Timeout,
        LdapError::FilterParsing => Failure::Protocol(e.to_string()),
        e => Failure::Unreachable(e.to_string()),
    }
}

/// The values of `attr` (named in any case) in `entry`.
fn values<'e>(entry: &'e SearchEntry, attr: &str) -> &'e [String] {
    entry
        .attrs
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(attr))
        .map(|(_, v)| v.as_slice())
        .unwrap_or_default()
}

/// A group's name from a value of `group_attribute`: the first RDN's value of a DN
/// (`admins` of `cn=admins,ou=groups,dc=example,dc=org`), RFC 4514 escapes undone; a value
/// that is not a DN, whole.
fn group_name(value: &str) -> String {
    let bytes = value.as_bytes();
    let Some(eq) = value.find('=') else {
        return value.to_string();
    };
    let mut out = Vec::new();
    let mut i = eq + 1;
    while i < bytes.len() {
        match bytes[i] {
            b',' | b'+' => break,
            b'\\' if i + 1 < bytes.len() => {
                let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(bytes[i + 1]);
                        i += 2;
                    }
                }
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).trim().to_string()
}

/// The RDNs of a DN, each trimmed, spaces around `=` dropped, in ASCII lower case, escapes
/// kept as written: enough to tell whether a DN a directory writes is under a configured
/// one. The empty DN (the root) has none.
fn rdns(dn: &str) -> Vec<String> {
    let norm = |rdn: &str| {
        rdn.split('=').map(str::trim).collect::<Vec<_>>().join("=").to_ascii_lowercase()
    };
    if dn.trim().is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let (mut start, mut escaped) = (0, false);
    for (i, b) in dn.bytes().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b',' => {
                out.push(norm(&dn[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(norm(&dn[start..]));
    out
}

/// Whether `dn` is strictly under the DN of RDNs `base`.
fn under(dn: &str, base: &[String]) -> bool {
    let rdns = rdns(dn);
    rdns.len() > base.len() && rdns[rdns.len() - base.len()..] == *base
}

/// `template` with each key replaced by its value, in one pass: a value is never searched
/// for keys (a user named `{dn}` stays that name).
fn fill(template: &str, with: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    'scan: while !rest.is_empty() {
        for (key, value) in with {
            if let Some(after) = rest.strip_prefix(key) {
                out.push_str(value);
                rest = after;
                continue 'scan;
            }
        }
        let mut chars = rest.chars();
        if let Some(c) = chars.next() {
            out.push(c);
        }
        rest = chars.as_str();
    }
    out
}

/// The client config for `ldaps://` and StartTLS: the `ca` file, else the system roots.
fn client_config(cfg: &LdapBackend) -> Result<Arc<ClientConfig>, String> {
    let roots = match &cfg.ca {
        Some(ca) => roots_from(ca)?,
        None => system_roots()
            .map_err(|_| "no system CA certificates found (install ca-certificates, or set ca)")?,
    };
    let config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests;
