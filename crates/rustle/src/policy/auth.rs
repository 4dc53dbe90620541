//! Proxy authentication: user accounts and their password verifiers, `Basic` credentials,
//! a cache of verified credentials and a limit on failed attempts per client.
//!
//! - `Users`: accounts from a users file (`name:hash[:group,...]`, the format `htpasswd -B`
//!   writes) and/or inline configuration, with their groups.
//! - `basic`: decoding a `Proxy-Authorization: Basic ...` value without allocating.
//! - `cache`: `CredentialCache`, so the deliberately slow hash runs once per `ttl`.
//! - `limiter`: `FailureLimiter`, a token bucket of failed attempts per client address.
//! - `gate`: `Gate`, one worker's check of credentials: the cache, then the hash off the
//!   event loop, failures limited (counted before the hash).
//! - `params`: user-name parameters (`alice-session-x7k2`): where the user ends, and what
//!   the rest says.
//! - `hasher`: `Hasher`, the process's few hashing threads, their bounded queue and the
//!   share of it one client address may take; each thread reuses one argon2 memory block.
//!
//! Password material is never logged: the `Debug` impls here show names, groups and the kind
//! of verifier, never a password or a hash, and no error message repeats a hash field (a
//! plaintext password pasted without its `plain:` prefix would otherwise end up in a log).

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use argon2::password_hash::rand_core::{OsRng, RngCore};
use argon2::password_hash::{PasswordHash, PasswordHasher, SaltString};
use argon2::{Argon2, Params};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub(crate) mod backend;
mod basic;
mod cache;
mod gate;
mod hasher;
pub(crate) mod identity;
mod limiter;
pub(crate) mod negotiate;
pub(crate) mod params;

pub(crate) use basic::parse_basic;
pub(crate) use cache::CredentialCache;
pub(crate) use gate::{Gate, Origin, Refusal};
pub(crate) use hasher::{Busy, Hasher, HasherLimits};
pub(crate) use limiter::FailureLimiter;

/// Longest user or group name, in bytes: long enough for e-mail-like names, short enough
/// that a name is cheap to log and compare.
pub(crate) const MAX_NAME_LEN: usize = 64;

/// Highest bcrypt cost accepted: `htpasswd -C` allows 4..=17, and each step doubles the
/// work (cost 17 is several seconds per check), so a higher one is a typo or a trap.
pub(crate) const MAX_BCRYPT_COST: u32 = 17;

/// Highest argon2id memory cost accepted, in KiB (256 MiB). Each hashing thread keeps a
/// block of the largest cost it has checked; the crate's default is 19 MiB, and RFC 9106's
/// second recommendation 64 MiB. A bigger one in a proxy's users file is a typo or a trap.
pub(crate) const MAX_ARGON2_MEMORY_KIB: u32 = 256 * 1024;

/// How a user's password is checked. The hash strings are kept as written (bcrypt and PHC
/// strings carry their own salt and parameters); a `plain:` password only as its SHA-256,
/// so that the comparison is constant-time whatever the lengths.
#[derive(Clone)]
enum Verifier {
    Bcrypt(String),
    Argon2(String),
    Plain([u8; 32]),
}

impl Verifier {
    fn kind(&self) -> &'static str {
        match self {
            Verifier::Bcrypt(_) => "bcrypt",
            Verifier::Argon2(_) => "argon2id",
            Verifier::Plain(_) => "plain",
        }
    }

    /// Checks a hash field. Messages never quote the field: it may be a bare password.
    fn parse(field: &str) -> Result<Verifier, String> {
        if let Some(password) = field.strip_prefix("plain:") {
            if password.is_empty() {
                return Err("empty plain: password".into());
            }
            return Ok(Verifier::Plain(Sha256::digest(password.as_bytes()).into()));
        }
        if ["$2a$", "$2b$", "$2y$"].iter().any(|p| field.starts_with(p)) {
            let parts = bcrypt::HashParts::from_str(field)
                .map_err(|_| "malformed bcrypt hash (expected 60 characters)".to_string())?;
            let cost = parts.get_cost();
            if !(4..=MAX_BCRYPT_COST).contains(&cost) {
                return Err(format!("bcrypt cost {cost} is outside 4..={MAX_BCRYPT_COST}"));
            }
            return Ok(Verifier::Bcrypt(field.to_owned()));
        }
        if field.starts_with("$argon2id$") {
            let hash =
                PasswordHash::new(field).map_err(|_| "malformed argon2id hash".to_string())?;
            let params = Params::try_from(&hash)
                .map_err(|e| format!("argon2id hash with bad parameters: {e}"))?;
            if hash.salt.is_none() || hash.hash.is_none() {
                return Err("argon2id hash without its salt or output".into());
            }
            if params.m_cost() > MAX_ARGON2_MEMORY_KIB {
                return Err(format!(
                    "argon2id memory cost {} KiB is over the limit of {MAX_ARGON2_MEMORY_KIB} KiB",
                    params.m_cost()
                ));
            }
            return Ok(Verifier::Argon2(field.to_owned()));
        }
        let hint = "re-create it with `htpasswd -B` or `rustle passwd`";
        if field.starts_with("$argon2i$") || field.starts_with("$argon2d$") {
            return Err(format!("only argon2id hashes are supported: {hint}"));
        }
        if field.starts_with("$2x$") {
            return Err(format!(
                "bcrypt $2x$ hashes (from a buggy crypt) are not supported: {hint}"
            ));
        }
        if ["$apr1$", "{SHA}", "$1$", "$5$", "$6$"].iter().any(|p| field.starts_with(p)) {
            return Err(format!("MD5, SHA and crypt hashes are not supported: {hint}"));
        }
        if field.is_empty() {
            return Err("no password hash".into());
        }
        Err("unrecognised password hash: expected bcrypt ($2y$, $2b$, $2a$), \
             argon2id ($argon2id$) or plain:PASSWORD"
            .into())
    }

    /// The algorithm and its cost parameters, without salt and digest: two verifiers of
    /// one class take the same time to check a password.
    fn cost_class(&self) -> (&'static str, &str) {
        match self {
            // `$2y$05$` then salt and digest without a separator; $2a$, $2b$ and $2y$ cost
            // the same.
            Verifier::Bcrypt(hash) => ("bcrypt", hash.get(4..6).unwrap_or_default()),
            // `$argon2id$v=19$m=19456,t=2,p=1$` then `salt$digest`.
            Verifier::Argon2(hash) => {
                let mut cut = hash.len();
                for _ in 0..2 {
                    cut = hash[..cut].rfind('$').unwrap_or(0);
                }
                ("argon2id", &hash[..cut])
            }
            Verifier::Plain(_) => ("plain", ""),
        }
    }

    /// The argon2id memory cost in KiB (what one check of this verifier holds); 0 for the
    /// others (bcrypt holds 4 KiB whatever its cost).
    fn memory_kib(&self) -> u32 {
        match self {
            Verifier::Argon2(hash) => PasswordHash::new(hash)
                .ok()
                .and_then(|h| Params::try_from(&h).ok())
                .map_or(0, |p| p.m_cost()),
            Verifier::Bcrypt(_) | Verifier::Plain(_) => 0,
        }
    }

    /// Whether the check is a deliberately slow hash (to run on the hashing threads).
    fn is_slow(&self) -> bool {
        !matches!(self, Verifier::Plain(_))
    }

    /// `verify_in` with memory of its own (allocated and freed here).
    fn verify(&self, password: &[u8]) -> bool {
        self.verify_in(password, &mut Vec::new())
    }

    /// Checks `password`; an argon2id check works in `memory`, grown to the hash's memory
    /// cost when it is smaller and kept by the caller for the next check, so that a hashing
    /// thread allocates its memory once rather than on every check.
    fn verify_in(&self, password: &[u8], memory: &mut Vec<argon2::Block>) -> bool {
        match self {
            // `verify` errs only on a malformed hash, which `parse` has ruled out. Like every
            // bcrypt, it looks at the first 72 bytes of the password only.
            Verifier::Bcrypt(hash) => bcrypt::verify(password, hash).unwrap_or(false),
            Verifier::Argon2(hash) => argon2id_matches(hash, password, memory).unwrap_or(false),
            Verifier::Plain(digest) => {
                let presented: [u8; 32] = Sha256::digest(password).into();
                presented.ct_eq(digest).into()
            }
        }
    }
}

/// Whether `password` hashes to the PHC string `hash` (argon2id, its parameters, salt and
/// output from the string), computed in `memory`; None for a hash that does not parse
/// (`Verifier::parse` has ruled that out) or parameters argon2 refuses.
fn argon2id_matches(hash: &str, password: &[u8], memory: &mut Vec<argon2::Block>) -> Option<bool> {
    let hash = PasswordHash::new(hash).ok()?;
    let params = Params::try_from(&hash).ok()?;
    let version = match hash.version {
        Some(v) => argon2::Version::try_from(v).ok()?,
        None => argon2::Version::default(),
    };
    let mut salt = [0u8; 64];
    let salt = hash.salt?.decode_b64(&mut salt).ok()?;
    let expected = hash.hash?;
    let blocks = params.block_count();
    if memory.len() < blocks {
        // Grown in place to the largest cost seen: at most `MAX_ARGON2_MEMORY_KIB`.
        memory.resize(blocks, argon2::Block::default());
    }
    let mut out = [0u8; 64];
    let out = out.get_mut(..expected.len())?;
    Argon2::new(argon2::Algorithm::Argon2id, version, params)
        .hash_password_into_with_memory(password, salt, out, &mut memory[..])
        .ok()?;
    Some(out.ct_eq(expected.as_bytes()).into())
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind())
    }
}

/// One user: name, password verifier, groups.
#[derive(Clone)]
pub(crate) struct User {
    pub(crate) name: String,
    pub(crate) groups: Vec<String>,
    verifier: Verifier,
    /// A digest of the name and the verifier (set by `Users::insert`): what a cached
    /// check of this user is valid for, so that a change to one user (or a reload)
    /// keeps the other users' cached checks.
    version: u64,
}

impl User {
    /// See the `version` field.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    fn digest(&self) -> u64 {
        use sha2::Digest as _;
        let mut h = sha2::Sha256::new();
        h.update(self.name.as_bytes());
        h.update([0]);
        h.update(self.verifier.kind().as_bytes());
        h.update([0]);
        match &self.verifier {
            Verifier::Bcrypt(t) | Verifier::Argon2(t) => h.update(t.as_bytes()),
            Verifier::Plain(d) => h.update(d),
        }
        let d = h.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&d[..8]);
        // Never 0: the version of no user.
        u64::from_le_bytes(first) | 1
    }

    pub(crate) fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    /// Whether `password` is this user's. Slow on purpose for bcrypt and argon2id
    /// (milliseconds to hundreds of them, by the hash's cost): call it off the event loop,
    /// on a `Hasher`, and put a `CredentialCache` in front. Constant-time for plain.
    pub(crate) fn verify(&self, password: &[u8]) -> bool {
        self.verifier.verify(password)
    }

    /// `verify` working in `memory` (see `hasher`: each hashing thread keeps its own).
    fn verify_in(&self, password: &[u8], memory: &mut Vec<argon2::Block>) -> bool {
        self.verifier.verify_in(password, memory)
    }

    /// Whether checking this user's password is a deliberately slow hash (bcrypt,
    /// argon2id) rather than a constant-time comparison (`plain:`).
    pub(crate) fn is_slow(&self) -> bool {
        self.verifier.is_slow()
    }

    #[cfg(test)]
    /// `bcrypt`, `argon2id` or `plain`, for start-up messages.
    pub(crate) fn verifier_kind(&self) -> &'static str {
        self.verifier.kind()
    }
}

impl fmt::Debug for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("groups", &self.groups)
            .field("verifier", &self.verifier)
            .finish()
    }
}

/// Hands out generation numbers, so that no two `Users` values with different contents
/// share one (see `Users::generation`).
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

fn next_generation() -> u64 {
    NEXT_GENERATION.fetch_add(1, Ordering::Relaxed)
}

/// A set of users (from a users file and/or inline config) and groups.
#[derive(Clone)]
pub struct Users {
    by_name: HashMap<String, User>,
    plain: usize,
    generation: u64,
    /// Group memberships given before the member was added: member → groups.
    pending: HashMap<String, Vec<String>>,
    /// Users per hash algorithm and cost (`Verifier::cost_class`), with the first one's
    /// name: what `decoy` imitates.
    costs: HashMap<String, (usize, Option<String>)>,
}

impl Default for Users {
    fn default() -> Self {
        Users {
            by_name: HashMap::new(),
            plain: 0,
            generation: next_generation(),
            pending: HashMap::new(),
            costs: HashMap::new(),
        }
    }
}

impl fmt::Debug for Users {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&str> = self.by_name.keys().map(String::as_str).collect();
        names.sort_unstable();
        f.debug_struct("Users")
            .field("names", &names)
            .field("plain", &self.plain)
            .field("generation", &self.generation)
            .finish()
    }
}

impl Users {
    /// Parses a users file: one `name:hash` per line, `#` comments and blank lines ignored,
    /// an optional third field `:group1,group2`. Lines are trimmed at both ends, so a
    /// `plain:` password can neither start nor end with whitespace nor contain ':' here
    /// (the next ':' starts the groups field); inline users have no such limit.
    /// Every problem is returned with its 1-based line number.
    pub(crate) fn parse_file(text: &str) -> Result<Users, Vec<(usize, String)>> {
        let mut users = Users::default();
        let mut first_line: HashMap<&str, usize> = HashMap::new();
        let mut problems = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match parse_line(line) {
                Err(message) => problems.push((number, message)),
                Ok((name, verifier, groups)) => {
                    if let Some(first) = first_line.get(name) {
                        let message = format!("duplicate user `{name}` (first on line {first})");
                        problems.push((number, message));
                        continue;
                    }
                    first_line.insert(name, number);
                    users.insert(User { name: name.to_owned(), groups, verifier, version: 0 });
                }
            }
        }
        if problems.is_empty() {
            Ok(users)
        } else {
            Err(problems)
        }
    }

    /// Reads and parses a users file; the error is one `FILE: line N: problem` per line.
    pub(crate) fn load(path: &Path) -> Result<Users, String> {
        let file = path.display();
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("{file}: cannot read: {e}"))?;
        Users::parse_file(&text).map_err(|problems| {
            let lines: Vec<String> =
                problems.iter().map(|(n, m)| format!("{file}: line {n}: {m}")).collect();
            lines.join("\n")
        })
    }

    /// Adds one user given inline, with the same hash syntax as the file (a `plain:`
    /// password may contain anything here).
    pub(crate) fn add(&mut self, name: &str, hash: &str, groups: &[String]) -> Result<(), String> {
        check_name("user", name)?;
        if self.by_name.contains_key(name) {
            return Err(format!("duplicate user `{name}`"));
        }
        let verifier = Verifier::parse(hash)?;
        let mut list = Vec::with_capacity(groups.len());
        for group in groups {
            check_name("group", group)?;
            if !list.contains(group) {
                list.push(group.clone());
            }
        }
        self.insert(User { name: name.to_owned(), groups: list, verifier, version: 0 });
        Ok(())
    }

    /// Takes `name` away, if it is a user (the admin API's overlay), and returns it.
    pub(crate) fn take(&mut self, name: &str) -> Option<User> {
        let user = self.by_name.remove(name)?;
        if matches!(user.verifier, Verifier::Plain(_)) {
            self.plain -= 1;
        }
        let (kind, cost) = user.verifier.cost_class();
        let key = format!("{kind} {cost}");
        if let Some(class) = self.costs.get_mut(&key) {
            class.0 -= 1;
            if class.0 == 0 {
                self.costs.remove(&key);
            } else if class.1.as_deref() == Some(name) {
                class.1 = self
                    .by_name
                    .values()
                    .find(|u| u.verifier.cost_class() == (kind, cost))
                    .map(|u| u.name.clone());
            }
        }
        self.generation = next_generation();
        Some(user)
    }

    /// Puts a user taken from another set in (replacing one of the same name).
    pub(crate) fn put(&mut self, user: User) {
        self.take(&user.name);
        self.insert(user);
    }

    /// Puts `members` in `group` (`[auth.groups] name = [members]`). A member not added yet
    /// gets the group when it is; `undefined_members` lists those still missing.
    pub(crate) fn add_group_members(&mut self, group: &str, members: &[String]) {
        for member in members {
            let groups = match self.by_name.get_mut(member) {
                Some(user) => &mut user.groups,
                None => self.pending.entry(member.clone()).or_default(),
            };
            if !groups.iter().any(|g| g == group) {
                groups.push(group.to_owned());
            }
        }
        self.generation = next_generation();
    }

    /// `(group, member)` for each group member that is no user, sorted: a configuration
    /// mistake the caller should report.
    pub(crate) fn undefined_members(&self) -> Vec<(String, String)> {
        let mut missing: Vec<(String, String)> = self
            .pending
            .iter()
            .flat_map(|(member, groups)| groups.iter().map(|g| (g.clone(), member.clone())))
            .collect();
        missing.sort();
        missing
    }

    pub(crate) fn get(&self, name: &str) -> Option<&User> {
        self.by_name.get(name)
    }

    /// Every user's name, in no order.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// Whether some user is in `group` (a walk over every user: for checks at load time).
    pub(crate) fn has_group(&self, group: &str) -> bool {
        self.by_name.values().any(|u| u.in_group(group))
    }

    pub(crate) fn len(&self) -> usize {
        self.by_name.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The largest argon2id memory cost of these users, in KiB (0 without argon2id): what
    /// each hashing thread comes to hold.
    pub(crate) fn max_memory_kib(&self) -> u32 {
        self.by_name.values().map(|u| u.verifier.memory_kib()).max().unwrap_or(0)
    }

    /// How many users have a `plain:` password, for a warning at start-up.
    pub fn plain_count(&self) -> usize {
        self.plain
    }

    /// A number that changes whenever this set changes and differs between sets built
    /// separately (it comes from a process-wide counter): what a connection compares to
    /// skip checking the same credentials again. Clones share it. The credential cache
    /// goes by each user's `User::version` instead.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    fn insert(&mut self, mut user: User) {
        user.version = user.digest();
        if let Some(groups) = self.pending.remove(&user.name) {
            for group in groups {
                if !user.in_group(&group) {
                    user.groups.push(group);
                }
            }
        }
        if matches!(user.verifier, Verifier::Plain(_)) {
            self.plain += 1;
        }
        let (kind, cost) = user.verifier.cost_class();
        let class = self.costs.entry(format!("{kind} {cost}")).or_default();
        class.0 += 1;
        class.1.get_or_insert_with(|| user.name.clone());
        self.by_name.insert(user.name.clone(), user);
        self.generation = next_generation();
    }

    /// The password check an unknown name is put through: that of a user whose hash has
    /// the most common algorithm and cost in this set (the result is ignored), so that a
    /// failure for a name that does not exist takes as long as a wrong password for most
    /// names that do. `None` for an empty set (the caller has its own decoy).
    pub(crate) fn decoy(&self) -> Option<User> {
        let (_, (_, name)) = self
            .costs
            .iter()
            .max_by(|(ka, (na, _)), (kb, (nb, _))| na.cmp(nb).then_with(|| kb.cmp(ka)))?;
        let user = self.by_name.get(name.as_deref()?)?;
        Some(User {
            name: "decoy".into(),
            groups: Vec::new(),
            verifier: user.verifier.clone(),
            version: 0,
        })
    }
}

/// Splits `name:hash[:groups]`; the hash of a `plain:` line is `plain:` and what follows
/// up to the next ':'.
fn parse_line(line: &str) -> Result<(&str, Verifier, Vec<String>), String> {
    let (name, rest) =
        line.split_once(':').ok_or_else(|| "expected name:hash[:group,...]".to_string())?;
    check_name("user", name)?;
    let skip = if rest.starts_with("plain:") { "plain:".len() } else { 0 };
    let (hash, groups) = match rest[skip..].find(':') {
        Some(i) => (&rest[..skip + i], Some(&rest[skip + i + 1..])),
        None => (rest, None),
    };
    let verifier = Verifier::parse(hash)?;
    let groups = match groups {
        Some(field) => parse_groups(field)?,
        None => Vec::new(),
    };
    Ok((name, verifier, groups))
}

/// The third field: `group1,group2`, spaces around commas allowed, empty for none.
fn parse_groups(field: &str) -> Result<Vec<String>, String> {
    if field.contains(':') {
        return Err("too many ':'-separated fields: expected name:hash[:group,...]".into());
    }
    let mut groups: Vec<String> = Vec::new();
    if field.trim().is_empty() {
        return Ok(groups);
    }
    for group in field.split(',').map(str::trim) {
        check_name("group", group)?;
        if !groups.iter().any(|g| g == group) {
            groups.push(group.to_owned());
        }
    }
    Ok(groups)
}

/// A user or group name: 1..=64 bytes, no ':' or ',' (the file's separators), no
/// whitespace or control characters, not starting with '#' (it would be a comment).
pub(crate) fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("empty {what} name"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!("{what} name longer than {MAX_NAME_LEN} bytes"));
    }
    if name.contains(':') || name.contains(',') {
        return Err(format!("{what} name contains ':' or ','"));
    }
    if name.chars().any(char::is_whitespace) {
        return Err(format!("{what} name contains whitespace"));
    }
    if name.chars().any(char::is_control) {
        return Err(format!("{what} name contains a control character"));
    }
    if name.starts_with('#') {
        return Err(format!("{what} name starts with '#'"));
    }
    Ok(())
}

/// Hashes a password for the users file: argon2id with the argon2 crate's default
/// parameters (19 MiB, 2 passes, 1 lane) and a random 16-byte salt from the OS. Returns
/// the PHC string (`$argon2id$v=19$...`); see `hash_line` for a whole line.
pub(crate) fn hash_password(password: &[u8]) -> Result<String, String> {
    let mut salt = [0u8; 16];
    OsRng.try_fill_bytes(&mut salt).map_err(|e| format!("no randomness from the OS: {e}"))?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| format!("cannot encode the salt: {e}"))?;
    let hash = Argon2::default()
        .hash_password(password, &salt)
        .map_err(|e| format!("cannot hash the password: {e}"))?;
    Ok(hash.to_string())
}

/// A user whose password nobody knows, hashed like the default for new users: checking an
/// unknown name against it makes a failure take as long as a wrong password.
pub(crate) fn decoy_user() -> Option<User> {
    static DECOY: std::sync::OnceLock<Option<User>> = std::sync::OnceLock::new();
    DECOY
        .get_or_init(|| {
            let mut secret = [0u8; 32];
            OsRng.try_fill_bytes(&mut secret).ok()?;
            let hash = hash_password(&secret).ok()?;
            let mut users = Users::default();
            users.add("decoy", &hash, &[]).ok()?;
            users.get("decoy").cloned()
        })
        .clone()
}

/// A users-file line `name:$argon2id$...` for `rustle passwd NAME`, after checking the name.
pub fn hash_line(name: &str, password: &[u8]) -> Result<String, String> {
    check_name("user", name)?;
    Ok(format!("{name}:{}", hash_password(password)?))
}

#[cfg(test)]
mod tests;
