//! Components see their config as an opaque value decoded into their own
//! struct: no component crate names the YAML library (its sources, tests,
//! benches or manifest). Only profcol-config and the binary do.

use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name();
        if p.is_dir() && name != "target" && name != "vendor" {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") || name == "Cargo.toml" {
            out.push(p);
        }
    }
}

#[test]
fn no_component_crate_names_serde_yaml() {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let mut all = Vec::new();
    for c in ["api", "receivers", "processors", "exporters", "ebpf", "plugins"] {
        files(&root.join(c), &mut all);
    }
    assert!(all.len() > 50, "found only {} files", all.len());
    let naming: Vec<_> = all
        .iter()
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains("serde_yaml") || t.contains("serde-yaml")))
        .collect();
    assert!(naming.is_empty(), "component crates naming the YAML library: {naming:?}");
}
