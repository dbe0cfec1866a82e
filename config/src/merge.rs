//! Merging config files in order and applying `--set`.

use serde_yaml::{Mapping, Value};

/// Merges `over` into `base`: maps deep-merged, everything else (lists too) replaced.
pub(crate) fn deep_merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Mapping(b), Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => deep_merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// Turns `a.b.c=v` into `{a: {b: {c: v}}}` (the value parsed as YAML).
/// `::` may separate keys too, for ids that contain dots.
pub(crate) fn set_to_value(arg: &str) -> Result<Value, String> {
    let Some((key, val)) = arg.split_once('=') else {
        return Err(format!("--set {arg:?}: expected key.path=value"));
    };
    let parts: Vec<&str> = if key.contains("::") { key.split("::").collect() } else { key.split('.').collect() };
    if parts.iter().any(|p| p.is_empty()) {
        return Err(format!("--set {arg:?}: empty key in {key:?}"));
    }
    let mut v: Value = serde_yaml::from_str(val).unwrap_or_else(|_| Value::String(val.to_owned()));
    if val.is_empty() {
        v = Value::String(String::new());
    }
    for p in parts.iter().rev() {
        let mut m = Mapping::new();
        m.insert(Value::String((*p).to_owned()), v);
        v = Value::Mapping(m);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_merge_lists_replace() {
        let mut a: Value = serde_yaml::from_str("x: {a: 1, l: [1, 2]}\ny: 1").unwrap();
        let b: Value = serde_yaml::from_str("x: {b: 2, l: [3]}").unwrap();
        deep_merge(&mut a, b);
        assert_eq!(a, serde_yaml::from_str::<Value>("x: {a: 1, l: [3], b: 2}\ny: 1").unwrap());
    }

    #[test]
    fn set_paths() {
        let v = set_to_value("processors.batch.timeout=2s").unwrap();
        assert_eq!(v, serde_yaml::from_str::<Value>("processors: {batch: {timeout: 2s}}").unwrap());
        let v = set_to_value("exporters::otlp/a.b::endpoint=h:1").unwrap();
        assert_eq!(v["exporters"]["otlp/a.b"]["endpoint"], Value::String("h:1".into()));
        assert!(set_to_value("nokey").is_err());
    }
}
