//! Negotiate (RFC 4559): SPNEGO tokens carrying a Kerberos AP-REQ, accepted with the
//! proxy's keytab (`[auth.kerberos]`), in Rust: the messages and ciphers are picky-krb's,
//! the keytab and the checks of RFC 4120 3.2.3 are here. The ticket is opened with the
//! service's key (aes256/aes128-cts-hmac-sha1-96), the authenticator with the ticket's
//! session key; the authenticator must name the ticket's client, be no more than five
//! minutes from the proxy's clock, and not have been seen before (a replay cache of the
//! process). A client asking for mutual authentication gets an AP-REP in the reply.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use picky_asn1::wrapper::{
    ExplicitContextTag0, ExplicitContextTag1, ExplicitContextTag2, IntegerAsn1, OctetStringAsn1,
    Optional,
};
use picky_asn1_der::Asn1RawDer;
use picky_krb::constants::key_usages::{AP_REP_ENC, AP_REQ_AUTHENTICATOR, TICKET_REP};
use picky_krb::crypto::CipherSuite;
use picky_krb::data_types::{
    Authenticator, EncApRepPart, EncApRepPartInner, EncTicketPart, EncryptedData, KerberosTime,
    PrincipalName,
};
use picky_krb::gss_api::{ApplicationTag0, KrbMessage, NegTokenInit, NegTokenTarg, NegTokenTarg1};
use picky_krb::messages::{ApRep, ApRepInner, ApReq};
use sha2::{Digest, Sha256};

use crate::config::Kerberos;

/// How far a client's clock may be from the proxy's (RFC 4120's customary five minutes).
const MAX_SKEW: i64 = 300;

/// Authenticators remembered against replay: at five minutes each, 100,000 is over 300
/// new Negotiate connections a second; beyond it tokens are refused until some expire
/// (failing closed rather than forgetting).
const MAX_REPLAYS: usize = 100_000;

/// DER of the OIDs a token may name: SPNEGO, Kerberos 5, and Microsoft's Kerberos 5.
const SPNEGO_OID: &[u8] = &[0x06, 0x06, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x02];
const KRB5_OID: &[u8] = &[0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x12, 0x01, 0x02, 0x02];
const MS_KRB5_OID: &[u8] = &[0x06, 0x09, 0x2a, 0x86, 0x48, 0x82, 0xf7, 0x12, 0x01, 0x02, 0x02];

/// GSS-API Kerberos token ids (RFC 4121 4.1).
const AP_REQ_TOKEN: [u8; 2] = [0x01, 0x00];
const AP_REP_TOKEN: [u8; 2] = [0x02, 0x00];

/// RFC 4178's `accept-completed`, as DER.
const ACCEPT_COMPLETED: [u8; 3] = [0x0a, 0x01, 0x00];

/// AP-REQ option bit: the client wants the server to prove itself (an AP-REP).
const MUTUAL_REQUIRED: usize = 2;

/// A token accepted: who the client is, and the token to send back (mutual
/// authentication), if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Accepted {
    /// The client principal, `name@REALM`.
    pub(crate) principal: String,
    /// The user it is: the principal, or its name alone with `strip_realm`.
    pub(crate) user: String,
    pub(crate) reply: Option<Vec<u8>>,
}

/// One key of the keytab.
struct Key {
    /// The principal's name components (`HTTP`, `proxy.example.org`) and realm.
    name: Vec<String>,
    realm: String,
    kvno: u32,
    etype: i32,
    key: Vec<u8>,
}

pub(crate) struct Acceptor {
    keys: Vec<Key>,
    realms: Vec<String>,
    strip_realm: bool,
}

/// Authenticators seen (SHA-256 of their ciphertext) and when each may be forgotten (unix
/// seconds): one per process, so that a reload (a new acceptor) does not forget them.
static REPLAYS: LazyLock<Mutex<HashMap<[u8; 32], i64>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

impl std::fmt::Debug for Acceptor {
    /// Never the keys.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor").field("keys", &self.keys.len()).finish()
    }
}

impl Acceptor {
    /// Reads the keytab, keeping the keys of `service_principal` (all when unset) of the
    /// kinds it can use.
    pub(crate) fn new(cfg: &Kerberos) -> Result<Acceptor, String> {
        let what = format!("auth.kerberos.keytab {}", cfg.keytab.display());
        let bytes = std::fs::read(&cfg.keytab).map_err(|e| format!("{what}: {e}"))?;
        let all = parse_keytab(&bytes).map_err(|e| format!("{what}: {e}"))?;
        let wanted = cfg.service_principal.as_deref().map(|s| {
            let (name, realm) = s.split_once('@').map_or((s, None), |(n, r)| (n, Some(r)));
            (name.split('/').map(str::to_owned).collect::<Vec<_>>(), realm)
        });
        let keys: Vec<Key> = all
            .into_iter()
            .filter(|k| CipherSuite::try_from(k.etype as usize).is_ok())
            .filter(|k| match &wanted {
                None => true,
                Some((name, realm)) => {
                    k.name == *name && realm.is_none_or(|r| r == k.realm.as_str())
                }
            })
            .collect();
        if keys.is_empty() {
            return Err(match &cfg.service_principal {
                Some(s) => format!("{what}: no aes or des3 key of {s}"),
                None => format!("{what}: no aes or des3 key"),
            });
        }
        Ok(Acceptor { keys, realms: cfg.realms.clone(), strip_realm: cfg.strip_realm })
    }

    /// Accepts the token of a `Proxy-Authorization: Negotiate <base64>` field (decoded).
    /// CPU only (the keytab is read by `new`): no network.
    /// A panic inside the DER and cipher code (a malformed token meeting a crate's
    /// `unwrap`) is caught and answered as a refusal: a token is the client's input.
    pub(crate) fn accept(&self, token: &[u8]) -> Result<Accepted, String> {
        let now = unix_now();
        let run = std::panic::AssertUnwindSafe(|| self.accept_at(token, now));
        std::panic::catch_unwind(run).unwrap_or_else(|_| Err("a malformed token".into()))
    }

    fn accept_at(&self, token: &[u8], now: i64) -> Result<Accepted, String> {
        let (ap_req, mech) = ap_req_of(token)?;
        let ap = &ap_req.0;
        let ticket = &ap.ticket.0 .0;
        let sname = names(&ticket.sname.0);
        let enc = &ticket.enc_part.0;
        let etype = int(&enc.etype.0).ok_or("the ticket's cipher is not known")?;
        let kvno = enc.kvno.0.as_ref().and_then(|k| int(&k.0));
        let key = self
            .keys
            .iter()
            .filter(|k| k.name == sname && k.realm == text(&ticket.realm.0))
            .filter(|k| k.etype == etype as i32)
            .filter(|k| kvno.is_none_or(|v| i64::from(k.kvno) == v))
            .max_by_key(|k| k.kvno)
            .ok_or_else(|| {
                format!(
                    "no key for a ticket to {}@{} (etype {etype}, kvno {})",
                    sname.join("/"),
                    text(&ticket.realm.0),
                    kvno.map_or("none".into(), |v| v.to_string())
                )
            })?;
        let part: EncTicketPart = decrypt(etype, &key.key, TICKET_REP, &enc.cipher.0 .0)
            .map_err(|e| format!("the ticket does not open with the keytab's key: {e}"))?;
        let part = &part.0;
        let session = &part.key.0;
        let session_type = int(&session.key_type.0).ok_or("the session key's type is unknown")?;
        let session_key = &session.key_value.0 .0;
        let auth = &ap.authenticator.0;
        let auth_type = int(&auth.etype.0).ok_or("the authenticator's cipher is unknown")?;
        if auth_type != session_type {
            return Err("the authenticator is not sealed with the session key's cipher".into());
        }
        let authenticator: Authenticator =
            decrypt(auth_type, session_key, AP_REQ_AUTHENTICATOR, &auth.cipher.0 .0)
                .map_err(|e| format!("the authenticator does not open: {e}"))?;
        let a = &authenticator.0;
        let cname = names(&part.cname.0);
        let crealm = text(&part.crealm.0);
        if names(&a.cname.0) != cname || text(&a.crealm.0) != crealm {
            return Err("the authenticator names another client than the ticket".into());
        }
        let ctime = time(&a.ctime.0).ok_or("the authenticator's time is invalid")?;
        if (ctime - now).abs() > MAX_SKEW {
            return Err(format!("the client's clock is {}s from the proxy's", ctime - now));
        }
        let start = part.starttime.0.as_ref().map_or(&part.auth_time.0, |s| &s.0);
        let start = time(start).ok_or("the ticket's start time is invalid")?;
        let end = time(&part.endtime.0).ok_or("the ticket's end time is invalid")?;
        if start - MAX_SKEW > now {
            return Err("the ticket is not valid yet".into());
        }
        if end + MAX_SKEW < now {
            return Err("the ticket has expired".into());
        }
        let principal = format!("{}@{crealm}", cname.join("/"));
        if !self.realms.is_empty() && !self.realms.contains(&crealm) {
            return Err(format!("{principal}: realm {crealm} is not accepted"));
        }
        remember(&auth.cipher.0 .0, ctime + MAX_SKEW, now)?;
        let user = match self.strip_realm {
            true => cname.join("/"),
            false => principal.clone(),
        };
        // The name goes into logs, rules and per-user tables as a Basic user's does.
        if user.is_empty() || user.len() > super::MAX_NAME_LEN || user.contains(char::is_control) {
            return Err(format!("{principal}: not a usable user name"));
        }
        let reply = if ap.ap_options.0 .0.is_set(MUTUAL_REQUIRED) {
            let seq = a.seq_number.0.as_ref().map(|s| s.0.clone());
            let ap_rep = ap_rep(session_type, session_key, a.ctime.0.clone(), &a.cusec.0, seq)?;
            Some(match mech {
                None => ap_rep,
                Some(mech) => neg_token_resp(mech, ap_rep)?,
            })
        } else {
            mech.map(|m| neg_token_resp(m, Vec::new())).transpose()?
        };
        Ok(Accepted { principal, user, reply })
    }
}

/// The AP-REQ a token carries, and the SPNEGO mechanism it was offered under (None: a bare
/// Kerberos token). The GSS-API framing (RFC 2743 3.1: `[APPLICATION 0]`, an OID, the
/// mechanism's token) is read here: picky-krb's reader of it panics on some malformed
/// input.
fn ap_req_of(token: &[u8]) -> Result<(ApReq, Option<Asn1RawDer>), String> {
    const NOT: &str = "not a SPNEGO or Kerberos token";
    let (oid, rest) = gss_frame(token).ok_or(NOT)?;
    if oid == SPNEGO_OID {
        let init: ExplicitContextTag0<NegTokenInit> =
            picky_asn1_der::from_bytes(rest).map_err(|_| "a malformed SPNEGO token")?;
        let init = init.0;
        let mech = init
            .mech_types
            .0
            .and_then(|m| m.0 .0.into_iter().next())
            .ok_or("a SPNEGO token offering no mechanism")?;
        let mech = Asn1RawDer(der(&mech)?);
        if mech.0 != KRB5_OID && mech.0 != MS_KRB5_OID {
            return Err("a SPNEGO token whose first mechanism is not Kerberos".into());
        }
        let inner = init.mech_token.0.ok_or("a SPNEGO token without a Kerberos ticket")?;
        return Ok((krb_ap_req(&inner.0 .0)?, Some(mech)));
    }
    if oid == KRB5_OID || oid == MS_KRB5_OID {
        return Ok((krb_ap_req(token)?, None));
    }
    Err("a token of another mechanism than SPNEGO or Kerberos".into())
}

/// A Kerberos GSS-API token (RFC 4121 4.1): the framing, `01 00`, the AP-REQ.
fn krb_ap_req(token: &[u8]) -> Result<ApReq, String> {
    let (oid, rest) = gss_frame(token).ok_or("a malformed Kerberos token")?;
    if oid != KRB5_OID && oid != MS_KRB5_OID {
        return Err("a SPNEGO token carrying another mechanism's token".into());
    }
    match rest.split_first_chunk::<2>() {
        Some((id, ap_req)) if *id == AP_REQ_TOKEN => {
            picky_asn1_der::from_bytes(ap_req).map_err(|_| "a malformed Kerberos AP-REQ".into())
        }
        _ => Err("a Kerberos token that is not an AP-REQ".into()),
    }
}

/// `[APPLICATION 0]` with a definite length covering the whole token: its OID (as DER,
/// tag and length included) and what follows it.
fn gss_frame(token: &[u8]) -> Option<(&[u8], &[u8])> {
    let (&tag, rest) = token.split_first()?;
    if tag != 0x60 {
        return None;
    }
    let (len, body) = der_len(rest)?;
    if body.len() != len {
        return None;
    }
    let (&oid_tag, after) = body.split_first()?;
    if oid_tag != 0x06 {
        return None;
    }
    let (oid_len, oid_body) = der_len(after)?;
    let oid_end = body.len() - oid_body.len() + oid_len;
    Some((body.get(..oid_end)?, body.get(oid_end..)?))
}

/// A DER length and what follows it.
fn der_len(b: &[u8]) -> Option<(usize, &[u8])> {
    let (&first, rest) = b.split_first()?;
    if first < 0x80 {
        return Some((usize::from(first), rest));
    }
    let n = usize::from(first & 0x7f);
    if n == 0 || n > 4 || rest.len() < n {
        return None;
    }
    let len = rest[..n].iter().fold(0usize, |l, &d| (l << 8) | usize::from(d));
    Some((len, &rest[n..]))
}

fn der<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, String> {
    picky_asn1_der::to_vec(v).map_err(|e| format!("DER: {e}"))
}

fn decrypt<T: serde::de::DeserializeOwned>(
    etype: i64,
    key: &[u8],
    usage: i32,
    cipher: &[u8],
) -> Result<T, String> {
    let suite = CipherSuite::try_from(etype as usize).map_err(|e| e.to_string())?;
    let plain = suite.cipher().decrypt(key, usage, cipher).map_err(|e| e.to_string())?;
    picky_asn1_der::from_bytes(&plain).map_err(|e| format!("DER: {e}"))
}

/// The AP-REP of mutual authentication, as a GSS-API Kerberos token (RFC 4121 4.1).
fn ap_rep(
    etype: i64,
    key: &[u8],
    ctime: KerberosTime,
    cusec: &IntegerAsn1,
    seq: Option<IntegerAsn1>,
) -> Result<Vec<u8>, String> {
    let part = EncApRepPart::from(EncApRepPartInner {
        ctime: ExplicitContextTag0::from(ctime),
        cusec: ExplicitContextTag1::from(cusec.clone()),
        subkey: Optional::from(None),
        seq_number: Optional::from(seq.map(picky_asn1::wrapper::ExplicitContextTag3::from)),
    });
    let suite = CipherSuite::try_from(etype as usize).map_err(|e| e.to_string())?;
    let sealed =
        suite.cipher().encrypt(key, AP_REP_ENC, &der(&part)?).map_err(|e| e.to_string())?;
    let rep = ApRep::from(ApRepInner {
        pvno: ExplicitContextTag0::from(IntegerAsn1::from(vec![5])),
        msg_type: ExplicitContextTag1::from(IntegerAsn1::from(vec![15])),
        enc_part: ExplicitContextTag2::from(EncryptedData {
            etype: ExplicitContextTag0::from(IntegerAsn1::from(vec![etype as u8])),
            kvno: Optional::from(None),
            cipher: ExplicitContextTag2::from(OctetStringAsn1::from(sealed)),
        }),
    });
    let oid = picky_asn1_der::from_bytes(KRB5_OID).map_err(|e| format!("DER: {e}"))?;
    der(&ApplicationTag0(KrbMessage { krb5_oid: oid, krb5_token_id: AP_REP_TOKEN, krb_msg: rep }))
}

/// SPNEGO's last word (RFC 4178 4.2.2): accept-completed, the mechanism, its token.
fn neg_token_resp(mech: Asn1RawDer, token: Vec<u8>) -> Result<Vec<u8>, String> {
    let mech: picky_asn1::wrapper::ObjectIdentifierAsn1 =
        picky_asn1_der::from_bytes(&mech.0).map_err(|e| format!("DER: {e}"))?;
    let resp = NegTokenTarg1::from(NegTokenTarg {
        neg_result: Optional::from(Some(ExplicitContextTag0::from(Asn1RawDer(
            ACCEPT_COMPLETED.to_vec(),
        )))),
        supported_mech: Optional::from(Some(ExplicitContextTag1::from(mech))),
        response_token: Optional::from(
            (!token.is_empty()).then(|| ExplicitContextTag2::from(OctetStringAsn1::from(token))),
        ),
        mech_list_mic: Optional::from(None),
    });
    der(&resp)
}

/// Records an authenticator until `until`; an authenticator seen before is a replay.
fn remember(cipher: &[u8], until: i64, now: i64) -> Result<(), String> {
    let digest: [u8; 32] = Sha256::digest(cipher).into();
    // A poisoned lock only means another thread panicked while holding it: the map is
    // still a map.
    let mut seen = REPLAYS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if seen.len() >= MAX_REPLAYS {
        seen.retain(|_, t| *t >= now);
        if seen.len() >= MAX_REPLAYS {
            return Err("too many Negotiate logins in the last minutes (replay cache full)".into());
        }
    }
    match seen.insert(digest, until) {
        Some(t) if t >= now => Err("a replayed Kerberos authenticator".into()),
        _ => Ok(()),
    }
}

fn names(p: &PrincipalName) -> Vec<String> {
    p.name_string.0 .0.iter().map(text).collect()
}

/// A KerberosString (IA5 in practice; anything else shown lossily).
fn text(s: &picky_asn1::wrapper::GeneralStringAsn1) -> String {
    String::from_utf8_lossy(s.0.as_bytes()).into_owned()
}

/// A small INTEGER (etypes, kvnos).
fn int(i: &IntegerAsn1) -> Option<i64> {
    let b = i.as_signed_bytes_be();
    if b.is_empty() || b.len() > 8 {
        return None;
    }
    let fill = if b[0] & 0x80 != 0 { 0xff } else { 0 };
    let mut buf = [fill; 8];
    buf[8 - b.len()..].copy_from_slice(b);
    Some(i64::from_be_bytes(buf))
}

/// A KerberosTime in unix seconds.
fn time(t: &KerberosTime) -> Option<i64> {
    let d = &t.0;
    let (y, m, day) = (i64::from(d.year()), i64::from(d.month()), i64::from(d.day()));
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(
        days * 86_400
            + i64::from(d.hour()) * 3600
            + i64::from(d.minute()) * 60
            + i64::from(d.second()),
    )
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// MIT's keytab format, version 0x502 (and 0x501: host byte order is never met on Linux
/// keytabs written by MIT or Heimdal today, so only big-endian is read).
fn parse_keytab(b: &[u8]) -> Result<Vec<Key>, String> {
    let mut r = Reader(b);
    match r.u16()? {
        0x0502 => {}
        v => return Err(format!("not a keytab of version 0x502 (0x{v:04x})")),
    }
    let mut keys = Vec::new();
    while !r.0.is_empty() {
        let size = r.u32()? as i32;
        if size < 0 {
            r.take(size.unsigned_abs() as usize)?;
            continue;
        }
        let mut e = Reader(r.take(size as usize)?);
        let count = e.u16()?;
        let realm = e.string()?;
        let name = (0..count).map(|_| e.string()).collect::<Result<Vec<_>, _>>()?;
        let _name_type = e.u32()?;
        let _timestamp = e.u32()?;
        let vno8 = e.u8()?;
        let etype = i32::from(e.u16()? as i16);
        let len = e.u16()? as usize;
        let key = e.take(len)?.to_vec();
        let kvno = match e.0.len() >= 4 {
            true => e.u32().ok().filter(|&v| v != 0).unwrap_or(u32::from(vno8)),
            false => u32::from(vno8),
        };
        keys.push(Key { name, realm, kvno, etype, key });
    }
    Ok(keys)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("truncated".into());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn string(&mut self) -> Result<String, String> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "a name that is not UTF-8".into())
    }
}

#[cfg(test)]
mod tests;
