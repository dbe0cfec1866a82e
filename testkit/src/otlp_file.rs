//! What the `file` exporter wrote (OTLP JSON, one document per line), read
//! as plain JSON: each location's functions and frame type.

use std::path::Path;

use serde_json::Value;

/// One location of a document's dictionary.
#[derive(Clone, Debug)]
pub struct Location {
    /// (function name, file) of each line, innermost first.
    pub lines: Vec<(String, String)>,
    /// Its `profile.frame.type` attribute; empty without one.
    pub frame_type: String,
}

/// Every location of every document in `path` (none if it is missing).
pub fn locations(path: &Path) -> Vec<Location> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let index = |v: &Value| v.as_u64().unwrap_or(0) as usize;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let doc: Value = serde_json::from_str(line).expect("an OTLP JSON document per line");
        let d = &doc["dictionary"];
        let table = |name: &str| d[name].as_array().cloned().unwrap_or_default();
        let (strings, functions, attributes) = (table("stringTable"), table("functionTable"), table("attributeTable"));
        let s = |v: &Value| strings.get(index(v)).and_then(Value::as_str).unwrap_or("").to_owned();
        for loc in table("locationTable") {
            let lines = loc["lines"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|l| functions.get(index(&l["functionIndex"])))
                .map(|f| (s(&f["nameStrindex"]), s(&f["filenameStrindex"])))
                .collect();
            let frame_type = loc["attributeIndices"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| attributes.get(index(i)))
                .find(|kv| s(&kv["keyStrindex"]) == "profile.frame.type")
                .map(|kv| kv["value"]["stringValue"].as_str().unwrap_or("").to_owned())
                .unwrap_or_default();
            out.push(Location { lines, frame_type });
        }
    }
    out
}
