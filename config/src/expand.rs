//! `${env:VAR}`, `${VAR}`, `${env:VAR:-default}` and `$$` in string values.

use serde_yaml::Value;

/// Why a reference could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExpandError(pub String);

/// Expands references in `s`. `lookup` returns a variable's value.
pub(crate) fn expand_str(s: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, ExpandError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(body) = after.strip_prefix('{') {
            let Some(end) = body.find('}') else {
                return Err(ExpandError(format!(
                    "unterminated reference \"${{{body}\": close it with '}}', or write $$ for a literal '$'"
                )));
            };
            out.push_str(&resolve(&body[..end], lookup)?);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn resolve(reference: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, ExpandError> {
    let body = match reference.split_once(':') {
        Some(("env", b)) => b,
        Some((scheme, _)) if !scheme.contains('-') => {
            return Err(ExpandError(format!(
                "unsupported reference \"${{{reference}}}\": only the env provider is available (${{env:VAR}})"
            )))
        }
        _ => reference,
    };
    let (name, default) = match body.split_once(":-") {
        Some((n, d)) => (n, Some(d)),
        None => (body, None),
    };
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(ExpandError(format!("invalid environment variable name {name:?} in \"${{{reference}}}\"")));
    }
    match (lookup(name).filter(|v| !v.is_empty() || default.is_none()), default) {
        (Some(v), _) => Ok(v),
        (None, Some(d)) => Ok(d.to_owned()),
        (None, None) => Err(ExpandError(format!(
            "environment variable {name} is not set and has no default; set it, or write ${{env:{name}:-default}}"
        ))),
    }
}

/// Expands every string scalar of `v` in place. Errors are returned with the
/// path of the node. A scalar that is exactly one reference takes the YAML
/// type of its expansion (`port: ${env:PORT}` becomes a number).
pub(crate) fn expand_value(
    v: &mut Value,
    path: &mut Vec<String>,
    lookup: &dyn Fn(&str) -> Option<String>,
    errors: &mut Vec<(Vec<String>, String)>,
) {
    match v {
        Value::String(s) if s.contains('$') => {
            let whole = s.starts_with("${") && s.ends_with('}') && s.matches("${").count() == 1;
            match expand_str(s, lookup) {
                Ok(e) if whole => {
                    *v = match serde_yaml::from_str::<Value>(&e) {
                        Ok(t @ (Value::Bool(_) | Value::Number(_))) => t,
                        _ => Value::String(e),
                    }
                }
                Ok(e) => *s = e,
                Err(ExpandError(m)) => errors.push((path.clone(), m)),
            }
        }
        Value::Mapping(m) => {
            for (k, val) in m.iter_mut() {
                path.push(key_str(k));
                expand_value(val, path, lookup, errors);
                path.pop();
            }
        }
        Value::Sequence(s) => {
            for (i, val) in s.iter_mut().enumerate() {
                path.push(i.to_string());
                expand_value(val, path, lookup, errors);
                path.pop();
            }
        }
        Value::Tagged(t) => expand_value(&mut t.value, path, lookup, errors),
        _ => {}
    }
}

/// A mapping key as a path segment.
pub(crate) fn key_str(k: &Value) -> String {
    match k {
        Value::String(s) => s.clone(),
        other => serde_yaml::to_string(other).unwrap_or_default().trim().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("db".into()),
            "PORT" => Some("4317".into()),
            _ => None,
        }
    }

    #[test]
    fn forms() {
        assert_eq!(expand_str("${env:HOST}:${PORT}", &env).unwrap(), "db:4317");
        assert_eq!(expand_str("${env:NOPE:-x}", &env).unwrap(), "x");
        assert_eq!(expand_str("a$$b $x", &env).unwrap(), "a$b $x");
        assert!(expand_str("${env:NOPE}", &env).unwrap_err().0.contains("NOPE is not set"));
        assert!(expand_str("${env:HOST", &env).is_err());
        assert!(expand_str("${file:/x}", &env).unwrap_err().0.contains("only the env provider"));
    }

    #[test]
    fn whole_reference_takes_yaml_type() {
        let mut v: Value = serde_yaml::from_str("a: ${env:PORT}\nb: x${PORT}\nc: [\"${env:MISSING}\"]").unwrap();
        let mut errs = vec![];
        expand_value(&mut v, &mut vec![], &env, &mut errs);
        assert_eq!(v["a"], Value::Number(4317.into()));
        assert_eq!(v["b"], Value::String("x4317".into()));
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].0, vec!["c".to_string(), "0".to_string()]);
    }
}
