//! `profcol print-config`: the effective configuration with defaults filled,
//! env expanded and secrets redacted.

use crate::service::check::CheckedComponents;
use profcol_api::component::Kind;
use profcol_config::Config;
use serde_yaml::{Mapping, Value};

const SECRET_WORDS: [&str; 5] = ["password", "token", "authorization", "api_key", "secret"];

fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase().replace('-', "_");
    SECRET_WORDS.iter().any(|w| k.contains(w))
}

/// Replaces the values of secret-looking keys with `[REDACTED]`.
pub fn redact(v: &mut Value) {
    match v {
        Value::Mapping(m) => {
            for (k, val) in m.iter_mut() {
                if k.as_str().is_some_and(is_secret) && !matches!(val, Value::Mapping(_) | Value::Null) {
                    *val = Value::String("[REDACTED]".into());
                } else {
                    redact(val);
                }
            }
        }
        Value::Sequence(s) => s.iter_mut().for_each(redact),
        _ => {}
    }
}

pub fn render(config: &Config, checked: &CheckedComponents) -> String {
    let mut top = Mapping::new();
    for kind in [Kind::Receiver, Kind::Processor, Kind::Exporter, Kind::Extension] {
        let mut section = Mapping::new();
        for ((k, id), c) in checked {
            if *k != kind {
                continue;
            }
            let mut v = c.config.clone();
            if let (Some(h), Value::Mapping(m)) = (&c.helper, &mut v) {
                if let Ok(Value::Mapping(hm)) = serde_yaml::to_value(h) {
                    m.extend(hm);
                }
            }
            section.insert(Value::String(id.to_string()), v);
        }
        if !section.is_empty() {
            top.insert(Value::String(Config::section_name(kind).into()), Value::Mapping(section));
        }
    }
    top.insert(Value::String("service".into()), serde_yaml::to_value(&config.service).unwrap_or(Value::Null));
    let mut v = Value::Mapping(top);
    redact(&mut v);
    serde_yaml::to_string(&v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_anywhere() {
        let mut v: Value = serde_yaml::from_str(
            "exporters: {otlp: {headers: {Authorization: Bearer x, x-tenant: a}, api_key: k, endpoint: e}}\nx: {db_password: p, my_token: t}",
        )
        .unwrap();
        redact(&mut v);
        let o = &v["exporters"]["otlp"];
        assert_eq!(o["headers"]["Authorization"], Value::String("[REDACTED]".into()));
        assert_eq!(o["headers"]["x-tenant"], Value::String("a".into()));
        assert_eq!(o["api_key"], Value::String("[REDACTED]".into()));
        assert_eq!(o["endpoint"], Value::String("e".into()));
        assert_eq!(v["x"]["db_password"], Value::String("[REDACTED]".into()));
        assert_eq!(v["x"]["my_token"], Value::String("[REDACTED]".into()));
    }
}
