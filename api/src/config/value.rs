//! The opaque config section handed to factories.

use super::ConfigError;
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// One component's config section, as loaded (env expanded, files merged).
///
/// Components do not look inside: they [`decode`](ConfigValue::decode) it into
/// their own struct. The representation is a JSON-like tree so that no
/// component depends on the YAML library.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ConfigValue(serde_json::Value);

impl ConfigValue {
    /// An absent section: decodes to the struct's defaults.
    pub fn null() -> Self {
        ConfigValue(serde_json::Value::Null)
    }

    pub fn is_null(&self) -> bool {
        self.0.is_null()
    }

    /// Deserializes the section into `C`; an absent (null) section means all
    /// defaults. The error's path is the dotted path inside the section.
    pub fn decode<C: DeserializeOwned>(&self) -> Result<C, ConfigError> {
        let value = match &self.0 {
            serde_json::Value::Null => serde_json::Value::Object(Default::default()),
            v => v.clone(),
        };
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let mut message = e.into_inner().to_string();
            if message.ends_with("expected a duration") {
                message.push_str("; write numbers with units, e.g. 200ms, 5s or 1m30s");
            }
            ConfigError { path, message }
        })
    }

    /// Serializes a config struct (secrets come out redacted: see [`super::Secret`]).
    pub fn encode<C: Serialize>(c: &C) -> Result<Self, ConfigError> {
        serde_json::to_value(c).map(ConfigValue).map_err(|e| ConfigError::new("", e.to_string()))
    }

    /// The keys of a mapping section (empty for anything else).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.as_object().into_iter().flat_map(|m| m.keys().map(String::as_str))
    }

    /// Splits a mapping into (the entries whose key is in `keys`, the rest).
    /// A section that is not a mapping goes whole into the rest.
    pub fn split_keys(&self, keys: &[&str]) -> (ConfigValue, ConfigValue) {
        let Some(m) = self.0.as_object() else {
            return (ConfigValue::null(), self.clone());
        };
        let (mut picked, mut rest) = (serde_json::Map::new(), serde_json::Map::new());
        for (k, v) in m {
            if keys.contains(&k.as_str()) {
                picked.insert(k.clone(), v.clone());
            } else {
                rest.insert(k.clone(), v.clone());
            }
        }
        (ConfigValue(picked.into()), ConfigValue(rest.into()))
    }

    /// Adds the entries of `other` (a mapping) to this mapping.
    pub fn extend(&mut self, other: ConfigValue) {
        if let serde_json::Value::Object(add) = other.0 {
            match &mut self.0 {
                serde_json::Value::Object(m) => m.extend(add),
                v => *v = serde_json::Value::Object(add),
            }
        }
    }
}

/// Builds sections in tests and in the config loader.
impl From<serde_json::Value> for ConfigValue {
    fn from(v: serde_json::Value) -> Self {
        ConfigValue(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn split_keys_separates_and_extend_joins() {
        let v = ConfigValue::from(json!({"endpoint": "x", "timeout": "2s"}));
        let (picked, mut rest) = v.split_keys(&["timeout"]);
        assert_eq!(picked, ConfigValue::from(json!({"timeout": "2s"})));
        assert_eq!(rest, ConfigValue::from(json!({"endpoint": "x"})));
        rest.extend(picked);
        assert_eq!(rest, v);
        assert_eq!(v.keys().collect::<Vec<_>>(), ["endpoint", "timeout"]);
    }
}
