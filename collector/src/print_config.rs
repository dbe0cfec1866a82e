//! `profcol print-config`: the effective configuration with defaults filled
//! and env expanded. Secrets are redacted by their type: a
//! [`profcol_api::config::Secret`] or [`profcol_api::config::SecretUrl`]
//! serializes as `[REDACTED]`, whatever its key is called.

use crate::service::check::CheckedComponents;
use profcol_api::component::Kind;
use profcol_api::config::ConfigValue;
use profcol_config::Config;
use serde_yaml::{Mapping, Value};

pub fn render(config: &Config, checked: &CheckedComponents) -> String {
    let mut top = Mapping::new();
    for kind in [Kind::Receiver, Kind::Processor, Kind::Exporter, Kind::Extension] {
        let mut section = Mapping::new();
        for ((k, id), c) in checked {
            if *k != kind {
                continue;
            }
            let mut v = c.effective.clone();
            if let Some(h) = &c.helper {
                if let Ok(hv) = ConfigValue::encode(h) {
                    v.extend(hv);
                }
            }
            section.insert(Value::String(id.to_string()), serde_yaml::to_value(&v).unwrap_or(Value::Null));
        }
        if !section.is_empty() {
            top.insert(Value::String(Config::section_name(kind).into()), Value::Mapping(section));
        }
    }
    top.insert(Value::String("service".into()), serde_yaml::to_value(&config.service).unwrap_or(Value::Null));
    serde_yaml::to_string(&Value::Mapping(top)).unwrap_or_default()
}
