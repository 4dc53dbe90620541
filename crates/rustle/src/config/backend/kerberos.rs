//! `[auth.kerberos]`: Negotiate (SPNEGO with a Kerberos ticket) on the HTTP and HTTPS
//! proxy ports, beside Basic.

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kerberos {
    /// The proxy's keys (`ktutil`, `kadmin ktadd`).
    pub keytab: PathBuf,
    /// The service the tickets must be for, `HTTP/proxy.example.org` (`@REALM` optional);
    /// unset: any principal the keytab holds a key of.
    #[serde(default)]
    pub service_principal: Option<String>,
    /// The client realms accepted (`["EXAMPLE.ORG"]`); empty: any realm whose tickets
    /// the keytab's keys open (the KDC's cross-realm trust decides).
    #[serde(default)]
    pub realms: Vec<String>,
    /// `alice@EXAMPLE.ORG` is the user `alice` (true) or `alice@EXAMPLE.ORG` (false).
    #[serde(default = "yes")]
    pub strip_realm: bool,
}

fn yes() -> bool {
    true
}

impl Kerberos {
    /// What is wrong with the settings themselves (the keytab is read by the acceptor).
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(s) = &self.service_principal {
            let name = s.split('@').next().unwrap_or_default();
            if name.is_empty() || s.split('@').count() > 2 || name.split('/').any(str::is_empty) {
                problems.push(format!(
                    "auth.kerberos.service_principal: `{s}` is not a principal such as \
                     HTTP/proxy.example.org"
                ));
            }
        }
        for r in &self.realms {
            if r.is_empty() || r.contains(['@', '/', ' ']) {
                problems.push(format!("auth.kerberos.realms: `{r}` is not a realm"));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::Kerberos;

    fn parse(text: &str) -> Result<Kerberos, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_unknown_keys() {
        let k = parse("keytab = \"/etc/rustle/http.keytab\"").expect("valid");
        assert!(k.strip_realm && k.realms.is_empty() && k.service_principal.is_none());
        assert!(k.problems().is_empty());
        let e = parse("keytab = \"k\"\nrealm = \"X\"").expect_err("unknown key");
        assert!(e.contains("unknown field `realm`"), "{e}");
        assert!(parse("service_principal = \"HTTP/x\"").is_err(), "the keytab is required");
    }

    #[test]
    fn problems_name_the_setting() {
        for (text, why) in [
            ("service_principal = \"HTTP//x\"", "auth.kerberos.service_principal: `HTTP//x`"),
            ("service_principal = \"a@B@C\"", "is not a principal"),
            ("service_principal = \"@REALM\"", "is not a principal"),
            ("realms = [\"\"]", "auth.kerberos.realms: `` is not a realm"),
            ("realms = [\"alice@X\"]", "`alice@X` is not a realm"),
        ] {
            let k = parse(&format!("keytab = \"k\"\n{text}")).expect("parses");
            let problems = k.problems().join("\n");
            assert!(problems.contains(why), "{text}: {problems}");
        }
        let k = parse("keytab = \"k\"\nservice_principal = \"HTTP/proxy.example.org@EXAMPLE.ORG\"");
        assert!(k.expect("parses").problems().is_empty());
    }
}
