//! Typed component configs from raw YAML sections.

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
pub fn decode<C: DeserializeOwned>(raw: &serde_yaml::Value) -> Result<C, ConfigError> {
    let value = match raw {
        serde_yaml::Value::Null => serde_yaml::Value::Mapping(Default::default()),
        v => v.clone(),
    };
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        ConfigError { path, message: e.into_inner().to_string() }
    })
}

/// Serializes an effective config back to YAML (for print-config).
pub fn encode<C: Serialize>(c: &C) -> Result<serde_yaml::Value, ConfigError> {
    serde_yaml::to_value(c).map_err(|e| ConfigError::new("", e.to_string()))
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
        assert_eq!(decode::<Cfg>(&serde_yaml::Value::Null).unwrap(), Cfg::default());
        let v: serde_yaml::Value = serde_yaml::from_str("inner: {sise: 3}").unwrap();
        let e = decode::<Cfg>(&v).unwrap_err();
        assert_eq!(e.path, "inner.sise");
        assert!(e.message.contains("unknown field `sise`"), "{e}");
    }
}
