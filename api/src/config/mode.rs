//! Unix permission bits written in config as octal strings (`"0640"`).

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};

/// Permission bits (at most 0o777), read and written as an octal string:
/// `"0640"`, `"640"` or `"0o640"`. A bare YAML number is refused, because
/// `640` would be read as decimal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mode(pub u32);

impl Mode {
    pub fn bits(self) -> u32 {
        self.0
    }

    pub fn parse(text: &str) -> Result<Mode, String> {
        let t = text.trim();
        let digits = t.strip_prefix("0o").unwrap_or(t);
        let bits = u32::from_str_radix(digits, 8)
            .ok()
            .filter(|_| !digits.is_empty() && digits.len() <= 4)
            .ok_or_else(|| format!("{text:?} is not an octal mode; write it as a string such as \"0640\""))?;
        if bits > 0o777 {
            return Err(format!(
                "{text:?} sets bits beyond rwx for user, group and others (setuid, setgid, sticky); use at most \"0777\""
            ));
        }
        Ok(Mode(bits))
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

impl Serialize for Mode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Mode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Mode, D::Error> {
        struct Octal;
        impl serde::de::Visitor<'_> for Octal {
            type Value = Mode;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an octal mode as a string, such as \"0640\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Mode, E> {
                Mode::parse(v).map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Mode, E> {
                Err(E::custom(format!("{v} is a number, read as decimal; quote the octal mode: \"{v:04}\"")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Mode, E> {
                Err(E::custom(format!("{v} is a number; write the mode as an octal string such as \"0640\"")))
            }
        }
        d.deserialize_any(Octal)
    }
}

impl JsonSchema for Mode {
    fn schema_name() -> Cow<'static, str> {
        "Mode".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": "^(0o)?0?[0-7]{3}$",
            "description": "Unix permission bits as an octal string, e.g. \"0640\"."
        })
    }
}

/// Creates `dir` and its missing parents with `mode`.
pub fn create_dirs(dir: &std::path::Path, mode: Mode) -> std::io::Result<()> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dirs(parent, mode)?;
    }
    match std::fs::DirBuilder::new().mode(mode.bits()).create(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode.bits())),
        // Made meanwhile by someone else: theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn octal_strings_only() {
        assert_eq!(Mode::parse("0640").unwrap(), Mode(0o640));
        assert_eq!(Mode::parse("750").unwrap(), Mode(0o750));
        assert_eq!(Mode::parse("0o600").unwrap(), Mode(0o600));
        assert_eq!(Mode(0o750).to_string(), "0750");
        for bad in ["", "0648", "rw-r-----", "04755", "12345"] {
            assert!(Mode::parse(bad).is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<Mode>("640").is_err(), "a bare number would be decimal");
        assert_eq!(serde_json::from_str::<Mode>("\"0640\"").unwrap(), Mode(0o640));
    }
}
