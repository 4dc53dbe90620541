//! What `tls` needs from an X.509 certificate that rustls does not expose: the validity
//! period, the subjectAltName DNS and e-mail names, and the subject's common name, read
//! with RustCrypto's `x509-cert` (strict DER: a length not in its shortest form, an
//! indefinite length, trailing bytes or a string outside its type's alphabet is an error,
//! never a guess; a SET OF is taken in DER order whatever order it was written in). The client-certificate user name (`CertInfo::user`) is taken only from a
//! string that decodes as text for its type and holds no control character.

use std::fmt;

use x509_cert::der::Decode;
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::Certificate;

use crate::config::CertUser;

/// A certificate time (UTCTime or GeneralizedTime, always UTC, 1970 or later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Time {
    /// Seconds since the Unix epoch.
    pub(crate) unix: i64,
    year: u16,
    month: u8,
    day: u8,
    hour: u8,
    minute: u8,
    second: u8,
}

impl From<x509_cert::time::Time> for Time {
    fn from(t: x509_cert::time::Time) -> Time {
        let d = t.to_date_time();
        Time {
            unix: i64::try_from(d.unix_duration().as_secs()).unwrap_or(i64::MAX),
            year: d.year(),
            month: d.month(),
            day: d.day(),
            hour: d.hour(),
            minute: d.minutes(),
            second: d.seconds(),
        }
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

/// What `parse` reads from a certificate.
#[derive(Debug)]
pub(super) struct CertInfo {
    pub(crate) not_before: Time,
    pub(crate) not_after: Time,
    /// subjectAltName dNSName entries, as written (may start with `*.`).
    pub(crate) dns_names: Vec<String>,
    /// subjectAltName rfc822Name (e-mail) entries.
    pub(crate) emails: Vec<String>,
    /// The subject's first commonName, when it is a DirectoryString (UTF8String,
    /// PrintableString, TeletexString in its ASCII subset, BMPString) that decodes; None
    /// for any other type or a value that does not decode (the certificate itself is
    /// still read: a server certificate's CN is never used).
    pub(crate) common_name: Option<String>,
}

impl CertInfo {
    /// The user a client certificate names: the first commonName, or the first DNS
    /// subjectAltName (else the first e-mail one). None when that name holds a control
    /// character (NUL, CR, LF ...): such a name is refused rather than cut or escaped.
    pub(super) fn user(self, how: CertUser) -> Option<String> {
        let name = match how {
            CertUser::None => None,
            CertUser::Cn => self.common_name,
            CertUser::San => self.dns_names.into_iter().chain(self.emails).next(),
        }?;
        (!name.chars().any(char::is_control)).then_some(name)
    }
}

/// Reads validity, names and the subject's common name from a DER certificate. An error
/// for anything that is not one strict-DER X.509 certificate, or that has more than one
/// subjectAltName extension (RFC 5280 4.2) or one that does not decode.
pub(super) fn parse(der: &[u8]) -> Result<CertInfo, String> {
    let cert = Certificate::from_der(der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let tbs = cert.tbs_certificate();
    let validity = tbs.validity();
    // A common name that is not a DirectoryString is no name (see `CertInfo`).
    let common_name = tbs.subject().common_name().ok().flatten().map(|s| s.value().into_owned());
    let (mut dns_names, mut emails) = (Vec::new(), Vec::new());
    let san = tbs
        .get_extension::<SubjectAltName>()
        .map_err(|e| format!("bad subjectAltName extension: {e}"))?;
    for name in san.map(|(_, san)| san.0).unwrap_or_default() {
        match name {
            GeneralName::DnsName(n) => dns_names.push(n.to_string()),
            GeneralName::Rfc822Name(n) => emails.push(n.to_string()),
            _ => {}
        }
    }
    Ok(CertInfo {
        not_before: validity.not_before.into(),
        not_after: validity.not_after.into(),
        dns_names,
        emails,
        common_name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DER element: `tag`, its length (short or long form), `body`.
    fn tlv(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match body.len() {
            n @ 0..=127 => out.push(n as u8),
            n @ 128..=255 => out.extend([0x81, n as u8]),
            n => out.extend([0x82, (n >> 8) as u8, n as u8]),
        }
        out.extend_from_slice(body);
        out
    }

    fn seq(parts: &[&[u8]]) -> Vec<u8> {
        tlv(0x30, &parts.concat())
    }

    const UTF8: u8 = 0x0c;
    const PRINTABLE: u8 = 0x13;
    const TELETEX: u8 = 0x14;
    const IA5: u8 = 0x16;
    const BMP: u8 = 0x1e;
    const CN: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x03];

    /// One RDN holding one attribute: commonName as `tag` with `value`'s bytes.
    fn cn(tag: u8, value: &[u8]) -> Vec<u8> {
        tlv(0x31, &seq(&[CN, &tlv(tag, value)]))
    }

    fn name(rdns: &[Vec<u8>]) -> Vec<u8> {
        seq(&rdns.iter().map(Vec::as_slice).collect::<Vec<_>>())
    }

    /// A subjectAltName extension with these GeneralNames (tag, bytes).
    fn san(names: &[(u8, &[u8])]) -> Vec<u8> {
        let names: Vec<u8> = names.iter().flat_map(|(t, v)| tlv(*t, v)).collect();
        let oid = [0x06, 0x03, 0x55, 0x1d, 0x11];
        seq(&[&oid, &tlv(0x04, &seq(&[&names]))])
    }

    /// A certificate (signature unchecked: parsing does not verify) with `subject` and
    /// `extensions`.
    fn cert(subject: &[u8], extensions: &[Vec<u8>]) -> Vec<u8> {
        let ecdsa_sha256 = seq(&[&[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02]]);
        let issuer = name(&[cn(UTF8, b"hostile CA")]);
        let validity = seq(&[&tlv(0x17, b"200101000000Z"), &tlv(0x17, b"491231235959Z")]);
        let p256 = seq(&[
            &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01],
            &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07],
        ]);
        let point = [&[0x00, 0x04][..], &[7u8; 64]].concat();
        let spki = seq(&[&p256, &tlv(0x03, &point)]);
        let mut tbs = vec![
            tlv(0xa0, &[0x02, 0x01, 0x02]),
            vec![0x02, 0x01, 0x01],
            ecdsa_sha256.clone(),
            issuer,
            validity,
            subject.to_vec(),
            spki,
        ];
        if !extensions.is_empty() {
            let exts = extensions.concat();
            tbs.push(tlv(0xa3, &seq(&[&exts])));
        }
        let tbs = seq(&tbs.iter().map(Vec::as_slice).collect::<Vec<_>>());
        seq(&[&tbs, &ecdsa_sha256, &tlv(0x03, &[0x00, 0x30, 0x00])])
    }

    fn user(der: &[u8], how: CertUser) -> Result<Option<String>, String> {
        parse(der).map(|info| info.user(how))
    }

    #[test]
    fn tls_der_times() {
        let t = |tag: u8, text: &[u8]| {
            x509_cert::time::Time::from_der(&tlv(tag, text)).map(Time::from).map_err(|_| ())
        };
        assert_eq!(t(0x17, b"700101000000Z").map(|t| t.unix), Ok(0));
        assert_eq!(t(0x17, b"491231235959Z").map(|t| t.unix), Ok(2_524_607_999));
        let leap = t(0x18, b"20000229120000Z").expect("valid time");
        assert_eq!(leap.unix, 951_825_600);
        assert_eq!(leap.to_string(), "2000-02-29 12:00:00 UTC");
        assert!(t(0x17, b"700101000000+").is_err());
        assert!(t(0x17, b"70010100000Z").is_err());
        assert!(t(0x18, b"20001301000000Z").is_err());
        // Before 1970 (a UTCTime's 1950s): refused, not negative.
        assert!(t(0x17, b"600101000000Z").is_err());
    }

    #[test]
    fn tls_der_garbage_is_an_error() {
        assert!(parse(b"").is_err());
        assert!(parse(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(parse(&[0x30, 0x03, 0x30, 0x01, 0x02]).is_err());
    }

    #[test]
    fn tls_der_reads_a_plain_certificate() {
        let der = cert(&name(&[cn(UTF8, b"alice")]), &[san(&[(0x82, b"a.test")])]);
        let info = parse(&der).expect("parses");
        assert_eq!(info.not_before.unix, 1_577_836_800);
        assert_eq!(info.not_after.to_string(), "2049-12-31 23:59:59 UTC");
        assert_eq!(info.dns_names, ["a.test"]);
        assert_eq!(info.common_name.as_deref(), Some("alice"));
    }

    /// What a hostile client certificate makes of the user name.
    #[test]
    fn tls_der_hostile_certificates() {
        let subject = |rdns: &[Vec<u8>]| cert(&name(rdns), &[]);
        let cn_user = |der: &[u8]| user(der, CertUser::Cn);
        let alice = Ok(Some("alice".to_string()));
        // Two commonNames: the first one.
        let two = subject(&[cn(UTF8, b"alice"), cn(UTF8, b"mallory")]);
        assert_eq!(cn_user(&two), alice);
        // Two commonNames in one RDN (a SET OF): the first in DER order (the shorter
        // encoding), whichever order they were written in.
        let pair = |v: &[u8]| seq(&[CN, &tlv(UTF8, v)]);
        for set in [[pair(b"zed"), pair(b"alice")], [pair(b"alice"), pair(b"zed")]] {
            let der = subject(&[tlv(0x31, &set.concat())]);
            assert_eq!(cn_user(&der), Ok(Some("zed".to_string())));
        }
        // Every DirectoryString type is decoded as text: BMPString as UTF-16, not as its
        // bytes (which would be "\0a\0l...").
        let bmp: Vec<u8> = "alice".encode_utf16().flat_map(u16::to_be_bytes).collect();
        assert_eq!(cn_user(&subject(&[cn(BMP, &bmp)])), alice);
        assert_eq!(cn_user(&subject(&[cn(PRINTABLE, b"alice")])), alice);
        assert_eq!(cn_user(&subject(&[cn(TELETEX, b"alice")])), alice);
        // Not a DirectoryString (IA5String), or not text of its type: no user, though the
        // certificate is read.
        assert_eq!(cn_user(&subject(&[cn(IA5, b"alice")])), Ok(None));
        assert_eq!(cn_user(&subject(&[cn(UTF8, b"al\xffice")])), Ok(None));
        assert_eq!(cn_user(&subject(&[cn(PRINTABLE, b"alice@x")])), Ok(None));
        assert_eq!(cn_user(&subject(&[cn(BMP, b"\x00a\x00")])), Ok(None));
        // Control characters (an embedded NUL, a line break) are refused, not cut.
        assert_eq!(cn_user(&subject(&[cn(UTF8, b"alice\0admin")])), Ok(None));
        assert_eq!(cn_user(&subject(&[cn(UTF8, b"alice\nuser=admin")])), Ok(None));
        assert_eq!(cn_user(&subject(&[cn(BMP, &[0, b'a', 0, 0])])), Ok(None));
        // Names that are not the first commonName, or no commonName at all.
        let org = tlv(0x31, &seq(&[&[0x06, 0x03, 0x55, 0x04, 0x0a], &tlv(UTF8, b"root")]));
        assert_eq!(cn_user(&subject(&[org.clone(), cn(UTF8, b"alice")])), alice);
        assert_eq!(cn_user(&subject(&[org])), Ok(None));
        assert_eq!(cn_user(&subject(&[])), Ok(None));

        // subjectAltName: the first DNS name, else the first e-mail.
        let with = |exts: &[Vec<u8>]| cert(&name(&[cn(UTF8, b"cn")]), exts);
        let san_user = |der: &[u8]| user(der, CertUser::San);
        let both = with(&[san(&[(0x81, b"e@x.test"), (0x82, b"alice")])]);
        assert_eq!(san_user(&both), alice);
        assert_eq!(san_user(&with(&[san(&[(0x81, b"e@x.test")])])), Ok(Some("e@x.test".into())));
        assert_eq!(san_user(&with(&[san(&[(0x81, b"al\0ice@x")])])), Ok(None));
        assert_eq!(user(&both, CertUser::None), Ok(None));
        // Refused certificates (no user, and a server certificate does not load): a
        // non-ASCII IA5String, two subjectAltName extensions.
        assert!(parse(&with(&[san(&[(0x82, b"\xc3\xa9.test")])])).is_err());
        let two_sans = with(&[san(&[(0x82, b"alice")]), san(&[(0x82, b"mallory")])]);
        assert!(parse(&two_sans).is_err());
    }

    /// Encodings DER forbids are errors, never read another way.
    #[test]
    fn tls_der_odd_encodings_are_errors() {
        let good = cert(&name(&[cn(UTF8, b"alice")]), &[]);
        assert!(parse(&good).is_ok());
        // Trailing bytes after the certificate.
        assert!(parse(&[&good[..], &[0]].concat()).is_err());
        // The outer SEQUENCE's length with a leading zero octet.
        assert_ne!(good[1] & 0x80, 0, "a certificate this size has a long-form length");
        assert!(parse(&long_form_padded(&good)).is_err());
        // An indefinite length (BER).
        let indefinite = [&[0x30, 0x80][..], &good[header_len(&good)..], &[0, 0]].concat();
        assert!(parse(&indefinite).is_err());
    }

    /// The length of a DER element's tag and length octets.
    fn header_len(der: &[u8]) -> usize {
        match der[1] {
            n if n & 0x80 == 0 => 2,
            n => 2 + usize::from(n & 0x7f),
        }
    }

    /// The same element with its length written in one more octet than it needs.
    fn long_form_padded(der: &[u8]) -> Vec<u8> {
        let n = usize::from(der[1] & 0x7f);
        let mut out = vec![der[0], 0x80 | (n as u8 + 1), 0];
        out.extend_from_slice(&der[2..]);
        out
    }
}
