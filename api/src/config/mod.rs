//! Typed component configs: the opaque section a factory receives
//! ([`ConfigValue`]), the check every factory runs on its decoded struct
//! ([`Validate`]), secrets that never print ([`Secret`], [`SecretUrl`]), and
//! the schema helpers config structs use ([`schema`]).
//!
//! No YAML here: the config crate turns the files into [`ConfigValue`]s, and
//! components only ever see their own structs.

pub mod checks;
mod mode;
pub mod schema;
mod secret;
mod validate;
mod value;

pub use mode::{create_dirs, Mode};
pub use secret::{scrub, Secret, SecretUrl, REDACTED};
pub use validate::{Problems, Validate};
pub use value::ConfigValue;

use serde::{de::DeserializeOwned, Serialize};

/// A component's config section is wrong: where inside it, and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if path.is_empty() || path == "." { String::new() } else { format!("{path}: ") })]
pub struct ConfigError {
    /// Path inside the component's section, e.g. `retry_on_failure.max_interval`.
    pub path: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError { path: path.into(), message: message.into() }
    }
}

/// Deserializes a section into `C`; an absent (null) section means all defaults.
pub fn decode<C: DeserializeOwned>(raw: &ConfigValue) -> Result<C, ConfigError> {
    raw.decode()
}

/// Serializes an effective config back to a value (for print-config); secrets
/// come out as [`REDACTED`].
pub fn encode<C: Serialize>(c: &C) -> Result<ConfigValue, ConfigError> {
    ConfigValue::encode(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, Serialize, Default, Debug, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Inner {
        size: u32,
    }
    #[derive(Deserialize, Serialize, Default, Debug, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Cfg {
        inner: Inner,
        name: String,
    }

    #[test]
    fn null_is_defaults_and_errors_carry_the_path() {
        assert_eq!(decode::<Cfg>(&ConfigValue::null()).unwrap(), Cfg::default());
        let v = ConfigValue::from(serde_json::json!({"inner": {"sise": 3}}));
        let e = decode::<Cfg>(&v).unwrap_err();
        assert_eq!(e.path, "inner.sise");
        assert!(e.message.contains("unknown field `sise`"), "{e}");
    }
}
