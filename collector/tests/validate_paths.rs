//! Every path that start creates or opens for writing is checked by
//! `profcol validate`, at its file:line:column, and start refuses it with
//! the same positioned error. The keys come from `profcol schema` (those
//! marked `x-profcol-creates`), so a new component's path is covered once
//! its schema says what it is.

mod common;
use common::bin;
use serde_json::{json, Map, Value};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SECTIONS: [&str; 4] = ["receivers", "processors", "exporters", "extensions"];

/// Types whose sections cannot be written without a file of their own.
const SKIPPED: [(&str, &str, &str); 1] = [("exporters", "wasm", "needs a built plugin module")];

/// Paths start cannot create, each for its own reason: no such directory
/// under /proc (ENOENT even for root), none can be made in sysfs (EPERM).
const UNCREATABLE: [&str; 2] = ["/proc/profcol-x/y", "/sys/kernel/profcol-x"];

fn resolve<'a>(schema: &'a Value, s: &'a Value) -> &'a Value {
    match s.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/$defs/")) {
        Some(name) => resolve(schema, &schema["$defs"][name]),
        None => s,
    }
}

/// Every key under `s` (by dotted path from the component's section) marked
/// `x-profcol-creates`, with what it creates.
fn marked(schema: &Value, s: &Value, at: &[String], out: &mut Vec<(Vec<String>, String)>) {
    let s = resolve(schema, s);
    if let Some(kind) = s.get("x-profcol-creates").and_then(Value::as_str) {
        out.push((at.to_vec(), kind.to_owned()));
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        for sub in s.get(key).and_then(Value::as_array).into_iter().flatten() {
            marked(schema, sub, at, out);
        }
    }
    for (k, v) in s.get("properties").and_then(Value::as_object).into_iter().flatten() {
        let mut at = at.to_vec();
        at.push(k.clone());
        marked(schema, v, &at, out);
    }
}

/// A section of type `ty` that validates by itself (`{dir}`: a writable directory).
fn base(section: &str, ty: &str, dir: &Path) -> Value {
    let d = dir.display();
    match (section, ty) {
        ("exporters", "otlp") => json!({"endpoint": "127.0.0.1:4317"}),
        ("exporters", "otlp_http") => json!({"endpoint": "http://127.0.0.1:4318"}),
        ("exporters", "file") => json!({"path": format!("{d}/ok.jsonl")}),
        ("exporters", "pprof") => json!({"directory": format!("{d}/pprof")}),
        ("exporters", "flamegraph") => json!({"directory": format!("{d}/flamegraphs")}),
        _ => json!({}),
    }
}

fn set(v: &mut Value, at: &[String], to: Value) {
    let (last, parents) = at.split_last().unwrap();
    let mut cur = v;
    for k in parents {
        cur = cur.as_object_mut().unwrap().entry(k.clone()).or_insert_with(|| json!({}));
    }
    cur.as_object_mut().unwrap().insert(last.clone(), to);
}

/// Block YAML of a JSON value of maps, lists of scalars and scalars.
fn yaml(v: &Value, indent: usize, out: &mut String) {
    for (k, v) in v.as_object().unwrap() {
        out.push_str(&" ".repeat(indent));
        match v {
            Value::Object(m) if !m.is_empty() => {
                out.push_str(&format!("{k}:\n"));
                yaml(v, indent + 2, out);
            }
            Value::Object(_) => out.push_str(&format!("{k}: {{}}\n")),
            _ => out.push_str(&format!("{k}: {v}\n")),
        }
    }
}

/// A whole config with `section.ty` wired into a pipeline next to an otlp receiver.
fn config(section: &str, ty: &str, component: Value) -> String {
    let mut c = json!({"receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}}});
    let mut pipeline = Map::new();
    pipeline.insert("receivers".into(), json!(["otlp"]));
    let mut service = Map::new();
    service.insert("telemetry".into(), json!({"metrics": {"address": ""}}));
    match section {
        "exporters" => {
            pipeline.insert("exporters".into(), json!([ty]));
        }
        "processors" => {
            c["exporters"] = json!({"debug": {}});
            pipeline.insert("processors".into(), json!([ty]));
            pipeline.insert("exporters".into(), json!(["debug"]));
        }
        "receivers" => {
            c["exporters"] = json!({"debug": {}});
            pipeline.insert("receivers".into(), json!(["otlp", ty]));
            pipeline.insert("exporters".into(), json!(["debug"]));
        }
        _ => {
            c["exporters"] = json!({"debug": {}});
            pipeline.insert("exporters".into(), json!(["debug"]));
            service.insert("extensions".into(), json!([ty]));
        }
    }
    set(&mut c, &[section.to_owned(), ty.to_owned()], component);
    service.insert("pipelines".into(), json!({ "profiles": pipeline }));
    c["service"] = Value::Object(service);
    let mut out = String::new();
    yaml(&c, 0, &mut out);
    out
}

/// `profcol validate`'s exit code and stderr.
fn validate(file: &Path) -> (i32, String) {
    let out = Command::new(bin()).arg("validate").arg("--config").arg(file).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `profcol --config`'s exit code and stderr, or None if it is still running after 20 s.
fn start(file: &Path, dir: &Path) -> Option<(i32, String)> {
    let mut child = Command::new(bin())
        .arg("--config")
        .arg(file)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            return Some((out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// The 1-based line of the `n`th (0-based) line of `text` that is `key:` at `indent`.
fn line_of(text: &str, at: &[String]) -> usize {
    // Keys are unique along the path: find each in turn, deeper and later.
    let mut from = 0;
    let lines: Vec<&str> = text.lines().collect();
    for (depth, k) in at.iter().enumerate() {
        let want = format!("{}{k}:", " ".repeat(2 * depth));
        from += lines[from..].iter().position(|l| l.starts_with(&want)).unwrap_or_else(|| panic!("{want} in\n{text}"));
    }
    from + 1
}

#[test]
fn every_path_start_creates_is_checked_by_validate_at_its_position() {
    let schema_out = Command::new(bin()).arg("schema").output().unwrap();
    assert!(schema_out.status.success());
    let schema: Value = serde_json::from_slice(&schema_out.stdout).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cases = 0;
    let mut seen_types = Vec::new();
    for section in SECTIONS {
        let by_type = schema["properties"][section]["patternProperties"].as_object().unwrap();
        for (pattern, s) in by_type {
            let ty = pattern.trim_start_matches('^').trim_end_matches("(/.+)?$");
            let mut keys = Vec::new();
            marked(&schema, s, &[], &mut keys);
            if keys.is_empty() {
                continue;
            }
            if let Some((.., why)) = SKIPPED.iter().find(|(s, t, _)| *s == section && *t == ty) {
                eprintln!("{section}::{ty}: skipped ({why})");
                continue;
            }
            seen_types.push(format!("{section}::{ty}"));
            // The section validates as it is: only the path below can fail it.
            let good = config(section, ty, base(section, ty, dir.path()));
            let f = common::write(&dir.path().join(format!("{section}-{ty}-ok.yaml")), &good);
            let (code, err) = validate(&f);
            assert_eq!(code, 0, "{section}::{ty}: give it a base section that validates\n{good}\n{err}");
            for (at, kind) in keys {
                for (k, bad) in UNCREATABLE.iter().enumerate() {
                    let bad = format!("{bad}/{kind}");
                    let mut component = base(section, ty, dir.path());
                    set(&mut component, &at, json!(bad));
                    let text = config(section, ty, component);
                    let f = common::write(&dir.path().join(format!("{section}-{ty}-{}-{k}.yaml", at.join("."))), &text);
                    let key = format!("{section}::{ty}::{}", at.join("::"));
                    let mut full = vec![section.to_owned(), ty.to_owned()];
                    full.extend(at.iter().cloned());
                    let pos = format!("{}:{}:", f.display(), line_of(&text, &full));
                    let (code, err) = validate(&f);
                    assert_eq!(code, 1, "validate passed {key}: {bad}\n{text}\n{err}");
                    let line =
                        err.lines().find(|l| l.contains(&key)).unwrap_or_else(|| panic!("{key} not named:\n{err}"));
                    assert!(line.contains(&pos) && line.contains(&bad), "{key}: not at {pos}:\n{err}");
                    let (code, serr) = start(&f, dir.path()).unwrap_or_else(|| panic!("start took {key}: {bad}"));
                    assert_eq!(code, 1, "{key}: {bad}\n{serr}");
                    assert!(serr.contains(line.trim()), "start says otherwise about {key}:\n{serr}\nvalidate:\n{err}");
                    cases += 1;
                }
            }
        }
    }
    eprintln!("{cases} cases over {seen_types:?}");
    // The exporters that write files, and the sending queue of each exporter.
    for t in ["exporters::file", "exporters::pprof", "exporters::flamegraph", "exporters::otlp"] {
        assert!(seen_types.contains(&t.to_owned()), "{t} has no marked path: {seen_types:?}");
    }
}
