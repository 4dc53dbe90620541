//! What `tls` needs from an X.509 certificate that rustls does not expose: the validity
//! period, the subjectAltName DNS and e-mail names, and the subject's common name. A minimal DER walk, no allocation
//! beyond the returned names; anything unexpected is an error, never a panic.

use std::fmt;

/// A certificate time (UTCTime or GeneralizedTime, always UTC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Time {
    /// Seconds since the Unix epoch (negative before 1970).
    pub unix: i64,
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
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
pub struct CertInfo {
    pub not_before: Time,
    pub not_after: Time,
    /// subjectAltName dNSName entries, as written (may start with `*.`).
    pub dns_names: Vec<String>,
    /// subjectAltName rfc822Name (e-mail) entries.
    pub emails: Vec<String>,
    /// The subject's first commonName.
    pub common_name: Option<String>,
}

const SEQUENCE: u8 = 0x30;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;
const OID: u8 = 0x06;
const BOOLEAN: u8 = 0x01;
const OCTET_STRING: u8 = 0x04;
const VERSION: u8 = 0xa0; // [0] EXPLICIT
const EXTENSIONS: u8 = 0xa3; // [3] EXPLICIT
const DNS_NAME: u8 = 0x82; // GeneralName [2] IA5String, implicit
const EMAIL: u8 = 0x81; // GeneralName [1] IA5String, implicit
const SET: u8 = 0x31;
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03]; // 2.5.4.3
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11]; // 2.5.29.17

/// A cursor over DER bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn peek(&self) -> Option<u8> {
        self.0.first().copied()
    }

    /// The next TLV: (tag, contents).
    fn any(&mut self) -> Result<(u8, &'a [u8]), &'static str> {
        let [tag, first, rest @ ..] = self.0 else {
            return Err("truncated");
        };
        let (len, rest) = if first & 0x80 == 0 {
            (usize::from(*first), rest)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return Err("bad length");
            }
            let len = rest[..n].iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
            (len, &rest[n..])
        };
        if rest.len() < len {
            return Err("truncated");
        }
        let (contents, after) = rest.split_at(len);
        self.0 = after;
        Ok((*tag, contents))
    }

    fn expect(&mut self, tag: u8) -> Result<&'a [u8], &'static str> {
        match self.any()? {
            (t, contents) if t == tag => Ok(contents),
            _ => Err("unexpected element"),
        }
    }
}

/// Reads validity and DNS names from a DER certificate.
pub fn parse(der: &[u8]) -> Result<CertInfo, &'static str> {
    let cert = Reader(der).expect(SEQUENCE)?;
    let mut tbs = Reader(Reader(cert).expect(SEQUENCE)?);
    if tbs.peek() == Some(VERSION) {
        tbs.any()?;
    }
    tbs.any()?; // serialNumber
    tbs.expect(SEQUENCE)?; // signature algorithm
    tbs.expect(SEQUENCE)?; // issuer
    let mut validity = Reader(tbs.expect(SEQUENCE)?);
    let not_before = time(validity.any()?)?;
    let not_after = time(validity.any()?)?;
    let common_name = common_name(tbs.expect(SEQUENCE)?)?;
    tbs.expect(SEQUENCE)?; // subjectPublicKeyInfo
    let (mut dns_names, mut emails) = (Vec::new(), Vec::new());
    while !tbs.is_empty() {
        let (tag, contents) = tbs.any()?;
        if tag == EXTENSIONS {
            (dns_names, emails) = san_names(Reader(contents).expect(SEQUENCE)?)?;
        }
    }
    Ok(CertInfo { not_before, not_after, dns_names, emails, common_name })
}

/// The first commonName in a Name (a sequence of sets of type-value pairs).
fn common_name(name: &[u8]) -> Result<Option<String>, &'static str> {
    let mut rdns = Reader(name);
    while !rdns.is_empty() {
        let mut set = Reader(rdns.expect(SET)?);
        while !set.is_empty() {
            let mut pair = Reader(set.expect(SEQUENCE)?);
            let oid = pair.expect(OID)?;
            let (_, value) = pair.any()?;
            if oid == COMMON_NAME {
                let text = std::str::from_utf8(value).map_err(|_| "common name not UTF-8")?;
                return Ok(Some(text.to_string()));
            }
        }
    }
    Ok(None)
}

/// (DNS names, e-mail names) of the subjectAltName extension.
fn san_names(extensions: &[u8]) -> Result<(Vec<String>, Vec<String>), &'static str> {
    let mut names = Vec::new();
    let mut emails = Vec::new();
    let mut exts = Reader(extensions);
    while !exts.is_empty() {
        let mut ext = Reader(exts.expect(SEQUENCE)?);
        let oid = ext.expect(OID)?;
        if ext.peek() == Some(BOOLEAN) {
            ext.any()?;
        }
        let value = ext.expect(OCTET_STRING)?;
        if oid != SUBJECT_ALT_NAME {
            continue;
        }
        let mut general_names = Reader(Reader(value).expect(SEQUENCE)?);
        while !general_names.is_empty() {
            let (tag, contents) = general_names.any()?;
            if tag == DNS_NAME || tag == EMAIL {
                let name = std::str::from_utf8(contents).map_err(|_| "non-ASCII name")?;
                match tag {
                    DNS_NAME => names.push(name.to_string()),
                    _ => emails.push(name.to_string()),
                }
            }
        }
    }
    Ok((names, emails))
}

fn time((tag, text): (u8, &[u8])) -> Result<Time, &'static str> {
    let (year, rest) = match tag {
        UTC_TIME if text.len() == 13 => {
            let yy = digits(&text[..2])?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &text[2..])
        }
        GENERALIZED_TIME if text.len() == 15 => (digits(&text[..4])?, &text[4..]),
        _ => return Err("bad time"),
    };
    if rest[10] != b'Z' {
        return Err("time not in UTC");
    }
    let field = |i: usize| digits(&rest[i..i + 2]).map(|v| v as u32);
    let (month, day, hour, minute, second) =
        (field(0)?, field(2)?, field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err("bad time");
    }
    let days = days_from_civil(year, month, day);
    let unix = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second);
    Ok(Time { unix, year, month, day, hour, minute, second })
}

fn digits(text: &[u8]) -> Result<i64, &'static str> {
    text.iter().try_fold(0i64, |acc, &b| match b {
        b'0'..=b'9' => Ok(acc * 10 + i64::from(b - b'0')),
        _ => Err("bad time"),
    })
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_der_times() {
        let t = time((UTC_TIME, b"700101000000Z")).expect("valid time");
        assert_eq!(t.unix, 0);
        let t = time((UTC_TIME, b"491231235959Z")).expect("valid time");
        assert_eq!(t.unix, 2_524_607_999);
        let t = time((GENERALIZED_TIME, b"20000229120000Z")).expect("valid time");
        assert_eq!(t.unix, 951_825_600);
        assert_eq!(t.to_string(), "2000-02-29 12:00:00 UTC");
        assert!(time((UTC_TIME, b"700101000000+")).is_err());
        assert!(time((UTC_TIME, b"70010100000Z")).is_err());
        assert!(time((GENERALIZED_TIME, b"20001301000000Z")).is_err());
    }

    #[test]
    fn tls_der_garbage_is_an_error() {
        assert!(parse(b"").is_err());
        assert!(parse(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(parse(&[0x30, 0x03, 0x30, 0x01, 0x02]).is_err());
    }
}
