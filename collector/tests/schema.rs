//! `profcol schema` is a JSON Schema a registry validator (python
//! `jsonschema`, installed by .ci/schema.sh) accepts: every example config
//! validates against it, and a config with an unknown key does not.

mod common;
use common::bin;
use std::process::Command;

const CHECK: &str = r#"
import json, sys, yaml, jsonschema
schema = json.load(open(sys.argv[1]))
jsonschema.Draft202012Validator.check_schema(schema)
v = jsonschema.Draft202012Validator(schema)
bad = 0
for path in sys.argv[2:]:
    doc = yaml.safe_load(open(path)) or {}
    errs = sorted(v.iter_errors(doc), key=lambda e: list(e.path))
    print(path, "valid" if not errs else "INVALID")
    for e in errs:
        print("  at", "/".join(map(str, e.path)) or "/", ":", e.message)
    bad += bool(errs)
sys.exit(1 if bad else 0)
"#;

fn run_check(files: &[std::path::PathBuf]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("profcol.schema.json");
    let out = Command::new(bin()).arg("schema").output().unwrap();
    assert!(out.status.success());
    std::fs::write(&schema, &out.stdout).unwrap();
    let out = Command::new("python3")
        .arg("-c")
        .arg(CHECK)
        .arg(&schema)
        .args(files)
        .output()
        .expect("python3 runs (install with .ci/schema.sh)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!text.contains("ModuleNotFoundError"), "python jsonschema or PyYAML missing: run .ci/schema.sh\n{text}");
    (out.status.success(), text)
}

#[test]
fn every_example_validates_against_the_schema() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    assert!(files.len() >= 3, "{files:?}");
    let (ok, text) = run_check(&files);
    assert!(ok, "{text}");
    assert_eq!(text.matches(" valid").count(), files.len(), "{text}");
}

#[test]
fn the_schema_rejects_an_unknown_key_and_a_wrong_enum() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("unknown-key.yaml", "exporters:\n  otlp/backend:\n    endpoint: x:1\n    endpiont: y\n", "endpiont"),
        ("unknown-host-key.yaml", "exporters:\n  debug:\n    sending_queue:\n      queue_sise: 3\n", "queue_sise"),
        ("unknown-top.yaml", "recievers: {}\n", "recievers"),
        ("bad-enum.yaml", "exporters:\n  file:\n    path: x\n    format: yaml\n", "format"),
        ("bad-duration.yaml", "processors:\n  batch:\n    timeout: soon\n", "timeout"),
    ];
    for (name, text, word) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        let (ok, out) = run_check(std::slice::from_ref(&p));
        assert!(!ok && out.contains("INVALID"), "{name} passed the schema:\n{out}");
        assert!(out.contains(word), "{name}: the error does not name {word:?}:\n{out}");
    }
}
