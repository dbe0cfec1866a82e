//! Secrets are a type: whatever prints them (Debug, Display, logs,
//! print-config, error messages) shows [`REDACTED`]; only an explicit
//! [`Secret::expose`] reads the value.

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::fmt;
use std::sync::RwLock;

/// What a secret prints as.
pub const REDACTED: &str = "[REDACTED]";

fn refuse_redacted<E: serde::de::Error>(s: &str) -> Result<(), E> {
    if s.contains(REDACTED) {
        return Err(E::custom(format!(
            "{REDACTED} is what print-config shows instead of a secret; put the real value here (e.g. ${{env:NAME}})"
        )));
    }
    Ok(())
}

/// Every secret value a config gave this process, for [`scrub`]: the log
/// output takes them out of every line, also the lines of libraries that
/// never saw a [`Secret`] (a transport that logs a URL or a header).
static KNOWN: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Shorter values are not taken out of log lines (they would mangle
/// ordinary words); URL passwords and query secrets are redacted by their
/// place whatever their length.
const MIN_KNOWN_LEN: usize = 6;
/// A bound on [`KNOWN`]: configs hold a handful; reloads add at most theirs.
const MAX_KNOWN: usize = 1024;

fn remember(value: &str) {
    let mut parts = vec![value];
    // `Bearer <token>`, `Basic <base64>`: the credential alone may be logged too.
    if let Some((_, last)) = value.trim().rsplit_once(char::is_whitespace) {
        parts.push(last);
    }
    for v in parts {
        if v.len() < MIN_KNOWN_LEN || v == REDACTED {
            continue;
        }
        let mut known = KNOWN.write().unwrap_or_else(|p| p.into_inner());
        if !known.iter().any(|k| k == v) && known.len() < MAX_KNOWN {
            known.push(v.to_owned());
        }
    }
}

/// Query parameters whose values are credentials (by name, any case).
const SECRET_PARAMS: [&str; 9] =
    ["token", "key", "secret", "password", "passwd", "pwd", "auth", "signature", "credential"];

/// `text` with every credential taken out: the password (or lone token) of
/// every URL's userinfo and the values of query parameters named like
/// credentials, as [`redact_url`] shows them, and every secret value a
/// config gave this process. For log output, which also carries what
/// libraries log.
pub fn scrub(text: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    if text.contains("://") {
        out = Cow::Owned(scrub_urls(text));
    }
    let known = KNOWN.read().unwrap_or_else(|p| p.into_inner());
    for k in known.iter() {
        if out.contains(k.as_str()) {
            out = Cow::Owned(out.replace(k.as_str(), REDACTED));
        }
    }
    out
}

/// Where a URL inside free text ends.
fn url_end(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`' | ')' | ']' | '}' | ',' | ';' | '\\')
}

fn scrub_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (before, after) = rest.split_at(i + 3);
        out.push_str(before);
        let end = after.find(url_end).unwrap_or(after.len());
        let (url, tail) = after.split_at(end);
        let authority_end = url.find(['/', '?', '#']).unwrap_or(url.len());
        let (authority, path) = url.split_at(authority_end);
        match authority.rfind('@') {
            Some(at) => {
                match authority[..at].split_once(':') {
                    Some((user, _)) => out.push_str(&format!("{user}:{REDACTED}")),
                    None => out.push_str(REDACTED),
                }
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        out.push_str(&scrub_query(path));
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// The path, query and fragment of a URL with credential-named query values redacted.
fn scrub_query(path: &str) -> Cow<'_, str> {
    let Some(q) = path.find('?') else { return Cow::Borrowed(path) };
    let (head, query) = path.split_at(q + 1);
    let (query, fragment) = query.split_at(query.find('#').unwrap_or(query.len()));
    let params: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !v.is_empty() && is_secret_param(k) => format!("{k}={REDACTED}"),
            _ => kv.to_owned(),
        })
        .collect();
    Cow::Owned(format!("{head}{}{fragment}", params.join("&")))
}

fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_PARAMS.iter().any(|s| name.contains(s))
}

/// A password, token, header value or inline key.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        let value = value.into();
        remember(&value);
        Secret(value)
    }
    /// The value itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Secret::new(s)
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret::new(s)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(REDACTED)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        refuse_redacted(&s)?;
        Ok(Secret::new(s))
    }
}

impl JsonSchema for Secret {
    fn schema_name() -> Cow<'static, str> {
        "Secret".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "writeOnly": true,
            "description": "A secret: shown as [REDACTED] by print-config and in logs. Put it in an environment variable and write ${env:NAME}."
        })
    }
}

/// A URL that may carry credentials (`scheme://user:password@host/...`):
/// prints with the password (or a lone user token) replaced by [`REDACTED`].
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct SecretUrl(String);

impl SecretUrl {
    pub fn new(value: impl Into<String>) -> Self {
        let value = value.into();
        if let Some(password) = userinfo_secret(&value) {
            remember(password);
        }
        SecretUrl(value)
    }
    /// The URL with its credentials, for the one place that connects.
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The URL as it may be shown.
    pub fn redacted(&self) -> Cow<'_, str> {
        redact_url(&self.0)
    }
}

/// `scheme://user:password@rest` → `scheme://user:[REDACTED]@rest`;
/// `scheme://token@rest` → `scheme://[REDACTED]@rest`; anything else unchanged.
pub(crate) fn redact_url(url: &str) -> Cow<'_, str> {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else { return Cow::Borrowed(url) };
    let after = &url[scheme_end..];
    let authority_end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let Some(at) = after[..authority_end].rfind('@') else { return Cow::Borrowed(url) };
    let userinfo = &after[..at];
    let shown = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:{REDACTED}"),
        None => REDACTED.to_owned(),
    };
    Cow::Owned(format!("{}{shown}{}", &url[..scheme_end], &after[at..]))
}

/// The part of a URL's userinfo that [`redact_url`] hides.
fn userinfo_secret(url: &str) -> Option<&str> {
    let after = &url[url.find("://")? + 3..];
    let authority = &after[..after.find(['/', '?', '#']).unwrap_or(after.len())];
    let userinfo = &authority[..authority.rfind('@')?];
    Some(userinfo.split_once(':').map_or(userinfo, |(_, p)| p))
}

impl From<String> for SecretUrl {
    fn from(s: String) -> Self {
        SecretUrl::new(s)
    }
}

impl From<&str> for SecretUrl {
    fn from(s: &str) -> Self {
        SecretUrl::new(s)
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Serialize for SecretUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.redacted())
    }
}

impl<'de> Deserialize<'de> for SecretUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        refuse_redacted(&s)?;
        Ok(SecretUrl::new(s))
    }
}

impl JsonSchema for SecretUrl {
    fn schema_name() -> Cow<'static, str> {
        "SecretUrl".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "format": "uri-reference",
            "description": "A URL; credentials in it (user:password@) are shown as [REDACTED] by print-config and in logs."
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s} {s:?}"), "[REDACTED] [REDACTED]");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"[REDACTED]\"");
        assert_eq!(s.expose(), "hunter2");
        let back: Result<Secret, _> = serde_json::from_str("\"[REDACTED]\"");
        assert!(back.unwrap_err().to_string().contains("put the real value"));
    }

    #[test]
    fn url_credentials_are_redacted() {
        let u = SecretUrl::new("https://user:pa:ss@host:443/p?q=a@b");
        assert_eq!(u.to_string(), "https://user:[REDACTED]@host:443/p?q=a@b");
        assert_eq!(format!("{u:?}"), "\"https://user:[REDACTED]@host:443/p?q=a@b\"");
        assert_eq!(SecretUrl::new("http://tok@h/").to_string(), "http://[REDACTED]@h/");
        assert_eq!(SecretUrl::new("http://h:80/x@y").to_string(), "http://h:80/x@y");
        assert_eq!(SecretUrl::new("localhost:4317").to_string(), "localhost:4317");
        assert_eq!(u.expose(), "https://user:pa:ss@host:443/p?q=a@b");
    }

    #[test]
    fn log_lines_lose_every_credential() {
        let line =
            r#"starting new connection: http://user:pw@127.0.0.1:4318/v1/logs, "https://tok@h/x?token=t0k&a=1#f" ok"#;
        assert_eq!(
            scrub(line),
            r#"starting new connection: http://user:[REDACTED]@127.0.0.1:4318/v1/logs, "https://[REDACTED]@h/x?token=[REDACTED]&a=1#f" ok"#
        );
        assert!(matches!(scrub("no url here"), Cow::Borrowed(_)));
        // A secret a config gave, wherever it turns up; a bearer token alone too.
        let _ = Secret::new("Bearer s3cr3t-bearer-token");
        let _ = SecretUrl::new("http://u:url-pass-12345@h:1/");
        assert_eq!(
            scrub("authorization: Bearer s3cr3t-bearer-token; token s3cr3t-bearer-token; pw url-pass-12345"),
            "authorization: [REDACTED]; token [REDACTED]; pw [REDACTED]"
        );
    }
}
