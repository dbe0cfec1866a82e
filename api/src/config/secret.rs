//! Secrets are a type: whatever prints them (Debug, Display, logs,
//! print-config, error messages) shows [`REDACTED`]; only an explicit
//! [`Secret::expose`] reads the value.

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::fmt;

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

/// A password, token, header value or inline key.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
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
        Secret(s.to_owned())
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret(s)
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
        Ok(Secret(s))
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
        SecretUrl(value.into())
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
pub fn redact_url(url: &str) -> Cow<'_, str> {
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

impl From<String> for SecretUrl {
    fn from(s: String) -> Self {
        SecretUrl(s)
    }
}

impl From<&str> for SecretUrl {
    fn from(s: &str) -> Self {
        SecretUrl(s.to_owned())
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
        Ok(SecretUrl(s))
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
}
