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

/// The repository's top-level directories (build output and .git aside).
fn top_dirs(root: &Path) -> BTreeSet<String> {
    std::fs::read_dir(root)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".git" && n != "target")
        .collect()
}

/// Endings that make a backticked word a file name.
const FILE_ENDINGS: &[&str] =
    &["rs", "c", "h", "sh", "toml", "md", "yaml", "yml", "wit", "go", "cpp", "py", "json", "lock", "order", "o"];

/// Whether a backticked span names a repository path: one word, no
/// placeholder or Rust path, not absolute, and either under a top-level
/// directory or ending in a file ending (`main.rs`, `src/file.rs`).
fn names_a_path(span: &str, top: &BTreeSet<String>) -> bool {
    if span.is_empty()
        || span.contains(char::is_whitespace)
        || span.contains(['<', '{', '…', '$', '(', ':', '=', ','])
        || span.starts_with('/')
    {
        return false;
    }
    let under_top = span.split_once('/').is_some_and(|(first, _)| top.contains(first));
    let file = span.rsplit_once('.').is_some_and(|(stem, ext)| !stem.is_empty() && FILE_ENDINGS.contains(&ext));
    under_top || file
}

/// Backticked spans outside code fences, each with the line it starts on
/// and whether a blank line or heading came since the span before.
fn spans(text: &str) -> Vec<(usize, String, bool)> {
    let mut out = Vec::new();
    let (mut fenced, mut open, mut fresh) = (false, None::<(usize, String)>, true);
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            fresh = true;
            continue;
        }
        if fenced {
            continue;
        }
        if open.is_none() && (line.trim().is_empty() || line.starts_with('#')) {
            fresh = true;
        }
        let mut parts = line.split('`');
        if let Some((start, mut span)) = open.take() {
            // A span that wrapped: it goes on up to this line's first backtick.
            let first = parts.next().unwrap_or("");
            span.push(' ');
            span.push_str(first.trim_start());
            if !line.contains('`') {
                open = Some((start, span));
                continue;
            }
            out.push((start, span.trim().to_owned(), std::mem::take(&mut fresh)));
        }
        // What comes before the next backtick is text, not a span.
        parts.next();
        let rest: Vec<&str> = parts.collect();
        for (i, part) in rest.iter().enumerate() {
            if i % 2 == 0 {
                if i + 1 == rest.len() {
                    open = Some((n + 1, part.trim_end().to_owned()));
                } else {
                    out.push((n + 1, (*part).to_owned(), std::mem::take(&mut fresh)));
                }
            }
        }
    }
    out
}

/// Every file in the repository by name, for a bare name no directory was
/// named for.
fn file_names(dir: &Path, out: &mut BTreeSet<String>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        if path.is_dir() {
            if name != ".git" && name != "target" {
                file_names(&path, out);
            }
        } else {
            out.insert(name);
        }
    }
}

/// The paths a document names that do not exist: backticked paths from the
/// repository root (`api/src/component.rs`), bare file names (`queue.rs`)
/// against the directory last named in the same paragraph (or anywhere in
/// the repository when none was), and every entry of the tree in the fenced
/// block under "## Layout", each under the entry above it with less indent.
fn missing_paths(root: &Path, text: &str, top: &BTreeSet<String>) -> Vec<String> {
    let mut files = BTreeSet::new();
    file_names(root, &mut files);
    let mut broken = Vec::new();
    let mut base: Option<String> = None;
    for (line, span, fresh) in spans(text) {
        if fresh {
            base = None;
        }
        if !names_a_path(&span, top) {
            continue;
        }
        let from_root = span.split_once('/').is_some_and(|(first, _)| top.contains(first));
        let path = match (&base, from_root) {
            (_, true) => span.clone(),
            (Some(dir), false) => format!("{dir}{span}"),
            (None, false) if !span.contains('/') => {
                if !files.contains(&span) {
                    broken.push(format!("{line}: `{span}`: no file of that name in the repository"));
                }
                continue;
            }
            (None, false) => {
                broken.push(format!("{line}: `{span}`: name it from the repository root"));
                continue;
            }
        };
        if !exists(root, &path) && !build_output(root, &path) {
            broken.push(format!("{line}: `{span}`: {path} does not exist"));
        } else if from_root {
            base = Some(if path.ends_with('/') || root.join(&path).is_dir() {
                format!("{}/", path.trim_end_matches('/'))
            } else {
                path.rsplit_once('/').map(|(d, _)| format!("{d}/")).unwrap_or_default()
            });
        }
    }
    let mut in_layout = false;
    let mut fenced = false;
    let mut parents: Vec<(usize, String)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.starts_with("## ") {
            in_layout = line.trim() == "## Layout";
        } else if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if in_layout && fenced && !line.trim().is_empty() {
            let indent = line.len() - line.trim_start().len();
            let word = line.split_whitespace().next().unwrap_or("").trim_end_matches(',');
            while parents.last().is_some_and(|(i, _)| *i >= indent) {
                parents.pop();
            }
            let path = format!("{}{word}", parents.last().map(|(_, p)| p.as_str()).unwrap_or(""));
            if !exists(root, &path) && !build_output(root, &path) {
                broken.push(format!("{}: layout entry {word}: {path} does not exist", n + 1));
            }
            if word.ends_with('/') {
                parents.push((indent, path));
            }
        }
    }
    broken
}

#[test]
fn every_path_the_architecture_names_exists() {
    let root = repo();
    let text = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap();
    let broken = missing_paths(&root, &text, &top_dirs(&root));
    assert!(broken.is_empty(), "docs/ARCHITECTURE.md names paths that do not exist:\n{}", broken.join("\n"));
}

#[test]
fn the_architecture_checker_finds_wrong_paths() {
    let root = repo();
    let top = top_dirs(&root);
    let text = "\
Good: `collector/src/registry.rs`, `collector/src/exporter_helper/` with `queue.rs`,
a wrapped `collector/tests/docs_links.rs
` and `Profiles::compact`, `samples/count`, `/proc/PID/maps`, `.eh_frame`.

Bad: `collector/src/nope.rs`, then `registry.rs` (still under collector/src/? no: a new paragraph
names no directory, and registry.rs exists somewhere), `nope_at_all.rs`, `src/relative.rs`.
The exporter helper `collector/src/exporter_helper/` has no `registry.rs`.

## Layout

```
api/              ok
  src/model/      ok
    packed.rs     ok
  src/nope/       wrong
collector/
  Cargo.toml      ok
  main.rs         wrong: it is under src/
```

## After
";
    let broken = missing_paths(&root, text, &top);
    let expected = [
        "5: `collector/src/nope.rs`: collector/src/nope.rs does not exist",
        "6: `nope_at_all.rs`: no file of that name in the repository",
        "6: `src/relative.rs`: name it from the repository root",
        "7: `registry.rs`: collector/src/exporter_helper/registry.rs does not exist",
        "15: layout entry src/nope/: api/src/nope/ does not exist",
        "18: layout entry main.rs: collector/main.rs does not exist",
    ];
    assert_eq!(broken, expected);
}

#[test]
fn every_link_and_path_in_the_docs_resolves() {
    let root = repo();
    let top = top_dirs(&root);
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
