//! Docs that point somewhere point at something: every relative link in
//! README.md and docs/*.md resolves (file, directory, and `#anchor` to a
//! heading of the target), and every repository path the text names
//! (`exporters/src/otlp/http.rs`, `docs/arch-*.md`) exists or, with a `*`,
//! matches a file. Web links are not fetched (CI has no internet).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("collector/ sits in the repository").to_path_buf()
}

fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs = vec![root.join("README.md")];
    let mut in_docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    in_docs.sort();
    docs.extend(in_docs);
    docs
}

/// GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// `(target)` of every `[text](target)` outside code fences, with its line number.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            if let Some(end) = rest.find(')') {
                out.push((n + 1, rest[..end].to_owned()));
                rest = &rest[end..];
            }
        }
    }
    out
}

/// Words of the text that name a path under one of the repository's top-level directories.
fn repo_paths(text: &str, top: &BTreeSet<String>) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for word in line.split(|c: char| c.is_whitespace() || c == '`' || c == '(' || c == ')' || c == '[' || c == ']')
        {
            let word = word.trim_end_matches([',', '.', ';', ':']);
            let Some((first, _)) = word.split_once('/') else { continue };
            // Placeholders (`<dir>`, `{a,b}`, `…`) and URLs name no one file.
            if !top.contains(first) || word.contains(['<', '{', '…', '$']) || word.contains("://") {
                continue;
            }
            out.push((n + 1, word.to_owned()));
        }
    }
    out
}

/// Whether `pattern` (one `*` at most, within the last component) names a file.
fn exists(root: &Path, pattern: &str) -> bool {
    let path = pattern.trim_end_matches('/');
    match path.split_once('*') {
        None => root.join(path).exists(),
        Some((before, after)) => {
            let (dir, prefix) = before.rsplit_once('/').unwrap_or(("", before));
            std::fs::read_dir(root.join(dir)).is_ok_and(|rd| {
                rd.filter_map(|e| e.ok()).any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with(prefix) && name.ends_with(after) && name.len() >= prefix.len() + after.len()
                })
            })
        }
    }
}

/// A path .gitignore lists as a build output (`examples/plugins/out/`):
/// it exists once its build ran, which a fresh clone has not done.
fn build_output(root: &Path, path: &str) -> bool {
    std::process::Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["check-ignore", "-q", "--no-index", path.trim_end_matches('/')])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn every_link_and_path_in_the_docs_resolves() {
    let root = repo();
    let top: BTreeSet<String> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".git" && n != "target")
        .collect();
    let mut broken = Vec::new();
    for doc in documents(&root) {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.strip_prefix(&root).unwrap().display().to_string();
        for (line, target) in links(&text) {
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let path = if file.is_empty() { doc.clone() } else { doc.parent().unwrap().join(file) };
            if !path.exists() {
                broken.push(format!("{name}:{line}: link to {target}: no such file"));
            } else if !anchor.is_empty() {
                let target_text = std::fs::read_to_string(&path).unwrap_or_default();
                if !anchors(&target_text).contains(anchor) {
                    broken.push(format!("{name}:{line}: link to {target}: no heading with that anchor"));
                }
            }
        }
        for (line, path) in repo_paths(&text, &top) {
            if !exists(&root, &path) && !build_output(&root, &path) {
                broken.push(format!("{name}:{line}: names {path}, which does not exist"));
            }
        }
    }
    assert!(broken.is_empty(), "docs point at nothing:\n{}", broken.join("\n"));
}

#[test]
fn the_checker_finds_what_is_broken() {
    let root = repo();
    let top: BTreeSet<String> = ["docs".to_owned()].into();
    let text = "See [cfg](CONFIG.md#self-telemetry-the-metrics), `docs/CONFIG.md`, docs/arch-*.md and docs/NOPE.md.";
    assert_eq!(links(text), [(1, "CONFIG.md#self-telemetry-the-metrics".to_owned())]);
    let named: Vec<String> = repo_paths(text, &top).into_iter().map(|(_, p)| p).collect();
    assert_eq!(named, ["docs/CONFIG.md", "docs/arch-*.md", "docs/NOPE.md"]);
    assert!(exists(&root, "docs/CONFIG.md") && exists(&root, "docs/*.md"));
    assert!(!exists(&root, "docs/arch-*.md") && !exists(&root, "docs/NOPE.md"));
    let config = std::fs::read_to_string(root.join("docs/CONFIG.md")).unwrap();
    assert!(anchors(&config).contains("self-telemetry-the-metrics"));
}
