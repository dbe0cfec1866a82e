//! YAML values into the opaque [`ConfigValue`] components decode.

use profcol_api::config::ConfigValue;
use serde_yaml::Value;

/// Converts a loaded YAML node: keys become strings, tags are dropped,
/// numbers keep their integer or float form.
pub(crate) fn to_config_value(v: Value) -> ConfigValue {
    ConfigValue::from(to_json(v))
}

fn to_json(v: Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        Value::Null => J::Null,
        Value::Bool(b) => J::Bool(b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                J::from(i)
            } else if let Some(u) = n.as_u64() {
                J::from(u)
            } else {
                // NaN and infinities have no JSON form; keep their text so
                // the decode error names them.
                n.as_f64().and_then(serde_json::Number::from_f64).map_or_else(|| J::String(n.to_string()), J::Number)
            }
        }
        Value::String(s) => J::String(s),
        Value::Sequence(items) => J::Array(items.into_iter().map(to_json).collect()),
        Value::Mapping(m) => J::Object(m.into_iter().map(|(k, v)| (crate::expand::key_str(&k), to_json(v))).collect()),
        Value::Tagged(t) => to_json(t.value),
    }
}

/// One component section from YAML text (for tests and tools).
pub fn parse_section(yaml: &str) -> Result<ConfigValue, String> {
    serde_yaml::from_str::<Value>(yaml).map(to_config_value).map_err(|e| format!("invalid YAML: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_becomes_a_config_value() {
        let v = parse_section("a: 1\nb: [x, 2.5]\n3: true\nc: !tag -4\nd:\n").unwrap();
        let want = serde_json::json!({"a": 1, "b": ["x", 2.5], "3": true, "c": -4, "d": null});
        assert_eq!(v, ConfigValue::from(want));
    }
}
