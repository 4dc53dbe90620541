//! A request head that rustle wrote, written again for another next hop: a request sent
//! again on a new connection after its pooled one died may go by a new pick of parents,
//! and the hop-specific parts (the target's form and the `Proxy-Authorization` of the
//! parent) are the new hop's, never the old one's.

/// Where a request goes on the connection it is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextHop<'a> {
    /// Its origin, or a tunnel to it: the target in origin form, no `Proxy-Authorization`.
    Origin,
    /// An HTTP proxy that takes the request itself: the target in absolute form
    /// (`http://` and the Host field's authority before an origin-form path), with this
    /// `Proxy-Authorization` value when the proxy has credentials.
    Proxy(Option<&'a [u8]>),
}

/// Appends to `out` the request `written` (a head that rustle's writers made, as
/// `write_request` or the HTTP/2 front end write them, then any body bytes) written for
/// `hop`: the request line's target in the hop's form, every `Proxy-Authorization` field
/// dropped and the hop's own added after the other fields; the other fields, and the
/// bytes after the head, unchanged. None (and `out` as it was) when `written` does not
/// hold such a head: no end of head, a request line without three parts, an origin-form
/// target with no Host field to make the absolute form from.
pub fn rewrite_for_hop(written: &[u8], hop: NextHop<'_>, out: &mut Vec<u8>) -> Option<()> {
    let end = written.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = &written[..end - 2];
    let mut lines = head.split(|&b| b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let line = lines.next()?;
    let mut parts = line.splitn(3, |&b| b == b' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    let fields: Vec<&[u8]> = lines.filter(|l| !l.is_empty()).collect();
    let absolute = target.len() > 7 && target[..7].eq_ignore_ascii_case(b"http://");
    let start = out.len();
    out.extend_from_slice(method);
    out.push(b' ');
    match (hop, absolute) {
        (NextHop::Origin, true) => {
            let rest = &target[7..];
            let path =
                rest.iter().position(|&b| b == b'/' || b == b'?').map_or(&[][..], |i| &rest[i..]);
            if path.first() != Some(&b'/') {
                out.push(b'/');
            }
            out.extend_from_slice(path);
        }
        (NextHop::Proxy(_), false) => {
            let Some(host) = fields.iter().find_map(|f| value_of(f, b"host")) else {
                out.truncate(start);
                return None;
            };
            out.extend_from_slice(b"http://");
            out.extend_from_slice(host);
            out.extend_from_slice(target);
        }
        (NextHop::Origin, false) | (NextHop::Proxy(_), true) => out.extend_from_slice(target),
    }
    out.push(b' ');
    out.extend_from_slice(version);
    out.extend_from_slice(b"\r\n");
    for f in &fields {
        if value_of(f, b"proxy-authorization").is_none() {
            out.extend_from_slice(f);
            out.extend_from_slice(b"\r\n");
        }
    }
    if let NextHop::Proxy(Some(value)) = hop {
        out.extend_from_slice(b"Proxy-Authorization: ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&written[end..]);
    Some(())
}

/// The value of field line `line` when its name is `name` (ASCII case-insensitive).
fn value_of<'a>(line: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let colon = line.iter().position(|&b| b == b':')?;
    if !line[..colon].eq_ignore_ascii_case(name) {
        return None;
    }
    Some(line[colon + 1..].trim_ascii())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn again(written: &str, hop: NextHop<'_>) -> Option<String> {
        let mut out = b"kept".to_vec();
        let r = rewrite_for_hop(written.as_bytes(), hop, &mut out);
        assert!(out.starts_with(b"kept"));
        r.map(|()| String::from_utf8(out[4..].to_vec()).unwrap())
    }

    #[test]
    fn a_retried_request_carries_the_new_hops_credentials_only() {
        let a = Some(&b"Basic YTph"[..]);
        let b = Some(&b"Basic Yjpi"[..]);
        // (written, hop, expected)
        let table: &[(&str, NextHop<'_>, Option<&str>)] = &[
            // Parent A's head, to parent B: B's credentials, A's gone.
            (
                "GET http://o.test/p HTTP/1.1\r\nHost: o.test\r\nX: 1\r\nProxy-Authorization: Basic YTph\r\nVia: 1.1 rustle\r\n\r\n",
                NextHop::Proxy(b),
                Some("GET http://o.test/p HTTP/1.1\r\nHost: o.test\r\nX: 1\r\nVia: 1.1 rustle\r\nProxy-Authorization: Basic Yjpi\r\n\r\n"),
            ),
            // To a parent without credentials: none at all.
            (
                "GET http://o.test/p HTTP/1.1\r\nHost: o.test\r\nproxy-authorization: Basic YTph\r\n\r\n",
                NextHop::Proxy(None),
                Some("GET http://o.test/p HTTP/1.1\r\nHost: o.test\r\n\r\n"),
            ),
            // To the origin (a group's direct fallback, a tunnelling parent): origin form.
            (
                "GET HTTP://o.test:8080/p?q HTTP/1.1\r\nHost: o.test:8080\r\nProxy-Authorization: Basic YTph\r\n\r\n",
                NextHop::Origin,
                Some("GET /p?q HTTP/1.1\r\nHost: o.test:8080\r\n\r\n"),
            ),
            ("GET http://o.test?q HTTP/1.1\r\nHost: o.test\r\n\r\n", NextHop::Origin, Some("GET /?q HTTP/1.1\r\nHost: o.test\r\n\r\n")),
            ("GET http://o.test HTTP/1.1\r\nHost: o.test\r\n\r\n", NextHop::Origin, Some("GET / HTTP/1.1\r\nHost: o.test\r\n\r\n")),
            // From the origin's form to a parent: absolute form from the Host field.
            (
                "GET /p HTTP/1.1\r\nhost: o.test:81\r\nAccept: */*\r\n\r\n",
                NextHop::Proxy(a),
                Some("GET http://o.test:81/p HTTP/1.1\r\nhost: o.test:81\r\nAccept: */*\r\nProxy-Authorization: Basic YTph\r\n\r\n"),
            ),
            // Body bytes after the head go as they were.
            (
                "POST http://o.test/ HTTP/1.1\r\nHost: o.test\r\nContent-Length: 5\r\n\r\nhello",
                NextHop::Proxy(b),
                Some("POST http://o.test/ HTTP/1.1\r\nHost: o.test\r\nContent-Length: 5\r\nProxy-Authorization: Basic Yjpi\r\n\r\nhello"),
            ),
            // Not a head rustle wrote.
            ("GET /p HTTP/1.1\r\nAccept: */*\r\n\r\n", NextHop::Proxy(None), None),
            ("GET /p HTTP/1.1\r\nHost: o.test\r\n", NextHop::Origin, None),
            ("GET\r\n\r\n", NextHop::Origin, None),
        ];
        for (written, hop, expected) in table {
            assert_eq!(again(written, *hop).as_deref(), *expected, "{written:?} for {hop:?}");
        }
    }
}
