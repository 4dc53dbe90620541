//! `rustle user ...`: a client of the users API (`/api/v1/users` on the admin listener).
//! It finds the admin address and token in the configuration file (`[admin] listen`,
//! `api_token_file` or `api_token`), unless flags or `RUSTLE_ADMIN_TOKEN` give them, sends one
//! request per command and prints the answer as a table or as JSON.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// How long a request to the admin listener may take (adding a user hashes its
/// password there: a fraction of a second).
const TIMEOUT: Duration = Duration::from_secs(10);

/// Where the API is and the token it wants.
pub struct Target {
    pub addr: SocketAddr,
    token: String,
}

/// The API of the rustle configured by `config` (or the defaults); `admin` and
/// `token_file` replace what the file says, and `RUSTLE_ADMIN_TOKEN` the token of both.
pub fn target(
    config: Option<&Path>,
    admin: Option<SocketAddr>,
    token_file: Option<&Path>,
) -> Result<Target, String> {
    let text = match config {
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| format!("cannot read the configuration {}: {e}", p.display()))?,
        None => String::new(),
    };
    let mut cfg = crate::config::Config::parse_all(&text).config.admin;
    if let Some(file) = token_file {
        (cfg.api_token, cfg.api_token_file) = (None, Some(file.to_path_buf()));
    }
    let addr = admin.or(cfg.listen).ok_or_else(|| {
        "no admin address: set [admin] listen in the configuration (-c FILE) or give --admin"
            .to_string()
    })?;
    let token = match std::env::var("RUSTLE_ADMIN_TOKEN") {
        Ok(t) if !t.is_empty() => t,
        _ => match cfg.read_api_token()? {
            Some(t) => t.expose().to_string(),
            None => {
                return Err("no users API token: set [admin] api_token_file, --token-file or \
                            RUSTLE_ADMIN_TOKEN"
                    .into())
            }
        },
    };
    Ok(Target { addr, token })
}

/// A user name as a path segment: every byte but the unreserved ones percent-encoded.
pub fn segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Sends `method path` with `body` (JSON) and returns the status and the JSON answer.
pub fn call(
    t: &Target,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), String> {
    let what = |e: std::io::Error| format!("admin endpoint {}: {e}", t.addr);
    let mut s = TcpStream::connect_timeout(&t.addr, TIMEOUT).map_err(what)?;
    s.set_read_timeout(Some(TIMEOUT)).map_err(what)?;
    s.set_write_timeout(Some(TIMEOUT)).map_err(what)?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        t.addr,
        t.token,
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(what)?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).map_err(what)?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("admin endpoint {}: not an HTTP answer", t.addr))?;
    let value = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.trim().into()));
    Ok((status, value))
}

/// The users of a list (or one user) as a table: name, state, source, groups, traffic,
/// connections, limits.
pub fn table(value: &Value) -> String {
    let one = [value.clone()];
    let users = match value.get("users").and_then(Value::as_array) {
        Some(list) => list.as_slice(),
        None => &one,
    };
    let mut rows = vec![[
        "NAME".to_string(),
        "STATE".into(),
        "SOURCE".into(),
        "GROUPS".into(),
        "UP".into(),
        "DOWN".into(),
        "CONNS".into(),
        "RATE UP/DOWN".into(),
        "QUOTAS USED/LIMIT".into(),
    ]];
    for u in users {
        let s = |v: &Value| match v {
            Value::String(s) => s.clone(),
            Value::Null => "-".into(),
            v => v.to_string(),
        };
        let groups: Vec<String> =
            u["groups"].as_array().map(|g| g.iter().map(s).collect()).unwrap_or_default();
        let state = match u["disabled"].as_bool() {
            Some(true) => "disabled",
            _ => "enabled",
        };
        rows.push([
            s(&u["name"]),
            state.into(),
            s(&u["source"]),
            if groups.is_empty() { "-".into() } else { groups.join(",") },
            s(&u["traffic"]["up"]),
            s(&u["traffic"]["down"]),
            s(&u["connections"]),
            format!("{}/{}", s(&u["limits"]["rate_up"]), s(&u["limits"]["rate_down"])),
            quotas(&u["quotas"]),
        ]);
    }
    let mut widths = [0usize; 9];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let cells: Vec<String> = r.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// A user's quotas in a cell: `NAME:USED/LIMIT` each (`!` after one used up), or `-`.
fn quotas(list: &Value) -> String {
    let cells: Vec<String> = list
        .as_array()
        .map(|l| {
            l.iter()
                .map(|q| {
                    let mark = if q["exceeded"].as_bool() == Some(true) { "!" } else { "" };
                    let quota = q["quota"].as_str().unwrap_or("?");
                    format!("{quota}:{}/{}{mark}", q["used"], q["limit"])
                })
                .collect()
        })
        .unwrap_or_default();
    if cells.is_empty() {
        return "-".into();
    }
    cells.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_percent_encoded_as_segments() {
        assert_eq!(segment("alice"), "alice");
        assert_eq!(segment("a@b c/d"), "a%40b%20c%2Fd");
    }

    #[test]
    fn a_table_has_a_row_per_user() {
        let v = serde_json::json!({"users": [
            {"name": "alice", "groups": ["staff"], "disabled": false, "source": "file",
             "traffic": {"up": 1, "down": 2}, "connections": 0,
             "limits": {"rate_up": null, "rate_down": "8mbit"},
             "quotas": [{"quota": "daily", "used": 10, "limit": 5, "exceeded": true}]},
        ]});
        let t = table(&v);
        assert_eq!(t.lines().count(), 2, "{t}");
        assert!(t.contains("alice") && t.contains("staff") && t.contains("-/8mbit"), "{t}");
        assert!(t.contains("daily:10/5!"), "{t}");
    }
}
