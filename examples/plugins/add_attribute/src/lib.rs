//! `add_attribute`: sets resource attribute `key` to `value` (a string,
//! number or boolean) on every resource of every batch, replacing a value
//! it had.
//!
//! ```yaml
//! processors:
//!   wasm/add_attribute:
//!     path: examples/plugins/out/add_attribute.wasm
//!     config: { key: deployment.environment, value: production }
//! ```

use profcol_plugin_sdk::{Batch, PluginError, Processor, Value};

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    key: Option<String>,
    value: Option<serde_json::Value>,
}

enum Owned {
    Str(String),
    Int(i64),
    Double(f64),
    Bool(bool),
}

pub struct AddAttribute {
    key: String,
    value: Owned,
}

impl Processor for AddAttribute {
    fn init(config: &str) -> Result<Self, String> {
        let cfg: Config = profcol_plugin_sdk::config(config)?;
        let key =
            cfg.key.filter(|k| !k.is_empty()).ok_or("config: `key` (the resource attribute to set) is required")?;
        let value = match cfg.value {
            Some(serde_json::Value::String(s)) => Owned::Str(s),
            Some(serde_json::Value::Bool(b)) => Owned::Bool(b),
            Some(serde_json::Value::Number(n)) => match n.as_i64() {
                Some(i) => Owned::Int(i),
                None => Owned::Double(n.as_f64().ok_or("config: value: a number out of range")?),
            },
            None => return Err("config: `value` (a string, number or boolean) is required".into()),
            Some(other) => return Err(format!("config: value: {other} is not a string, number or boolean")),
        };
        Ok(AddAttribute { key, value })
    }

    fn process(&mut self, mut batch: Batch) -> Result<Option<Batch>, PluginError> {
        let value = match &self.value {
            Owned::Str(s) => Value::Str(s),
            Owned::Int(i) => Value::Int(*i),
            Owned::Double(d) => Value::Double(*d),
            Owned::Bool(b) => Value::Bool(*b),
        };
        batch.set_resource_attribute(&self.key, value);
        Ok(Some(batch))
    }
}

profcol_plugin_sdk::export_processor!(AddAttribute);

#[cfg(test)]
mod tests {
    use super::*;
    use profcol_plugin_sdk::harness::{cpu_batch, Harness};

    #[test]
    fn sets_the_attribute_on_every_resource_and_keeps_the_samples() {
        let input = cpu_batch();
        let mut h =
            Harness::<AddAttribute>::processor(r#"{"key": "deployment.environment", "value": "prod"}"#).unwrap();
        let out = h.process(&input).unwrap().unwrap();
        assert_eq!(out.0.resource_profiles.len(), 2);
        for s in out.samples() {
            assert_eq!(s.resource_attribute("deployment.environment"), Some(Value::Str("prod")));
        }
        // Only the resources changed.
        let mut expected = input.clone();
        for rp in &mut expected.0.resource_profiles {
            rp.resource
                .as_mut()
                .unwrap()
                .attributes
                .push(out.0.resource_profiles[0].resource.as_ref().unwrap().attributes[2].clone());
        }
        assert_eq!(out, expected);
    }

    #[test]
    fn replaces_a_value_and_takes_numbers_and_booleans() {
        let mut h = Harness::<AddAttribute>::processor(r#"{"key": "service.name", "value": 7}"#).unwrap();
        let out = h.process(&cpu_batch()).unwrap().unwrap();
        assert!(out.samples().all(|s| s.resource_attribute("service.name") == Some(Value::Int(7))));
        let attrs = &out.0.resource_profiles[0].resource.as_ref().unwrap().attributes;
        assert_eq!(attrs.iter().filter(|kv| kv.key == "service.name").count(), 1);
        let mut h = Harness::<AddAttribute>::processor(r#"{"key": "canary", "value": true}"#).unwrap();
        let out = h.process(&cpu_batch()).unwrap().unwrap();
        assert!(out.samples().all(|s| s.resource_attribute("canary") == Some(Value::Bool(true))));
    }

    #[test]
    fn bad_config_says_what_is_wrong() {
        let e = Harness::<AddAttribute>::processor(r#"{"value": "x"}"#).err().unwrap();
        assert!(e.contains("`key`"), "{e}");
        let e = Harness::<AddAttribute>::processor(r#"{"key": "k"}"#).err().unwrap();
        assert!(e.contains("`value`"), "{e}");
        let e = Harness::<AddAttribute>::processor(r#"{"key": "k", "value": [1]}"#).err().unwrap();
        assert!(e.contains("not a string, number or boolean"), "{e}");
    }
}
