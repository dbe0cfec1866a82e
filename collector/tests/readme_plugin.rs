//! README's "Write a plugin", followed literally from an empty directory as
//! a new user would: every `sh` block runs as written (with `profcol` on
//! PATH and the SDK path filled in), every file block is written where the
//! text says; the plugin is built for wasm32-wasip2, tested, run, and the
//! pipeline that uses it validates. Then it starts without a `config:`.
//! The crate's `target` is a directory under the workspace's target/, so a
//! second run builds only the plugin itself.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The fenced blocks of the README's plugin section: (language, body, the text before it).
fn blocks() -> Vec<(String, String, String)> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let start = readme.find("## Write a plugin").expect("README has the plugin section");
    let section = &readme[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let mut out = Vec::new();
    let mut prose = String::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if let Some(lang) = line.strip_prefix("```") {
            let mut body = String::new();
            for l in lines.by_ref() {
                if l.starts_with("```") {
                    break;
                }
                body.push_str(l);
                body.push('\n');
            }
            out.push((lang.to_owned(), body, std::mem::take(&mut prose)));
        } else {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    out
}

/// The last `path` in backticks the text before a file block names.
fn file_named(prose: &str) -> String {
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| [".toml", ".rs", ".yaml"].iter().any(|e| t.ends_with(e)))
        .last()
        .unwrap_or_else(|| panic!("a file block follows text that names its file: {prose}"))
        .to_owned()
}

fn wasm_target_installed() -> bool {
    Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l == "wasm32-wasip2"))
}

#[test]
fn the_readme_plugin_section_works_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cwd = tmp.path().to_path_buf();
    let bin_dir = Path::new(bin()).parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let warm = repo().join("target").join("readme-plugin");
    std::fs::create_dir_all(&warm).unwrap();
    let checkout = repo().to_str().unwrap().to_owned();
    let mut transcript = String::new();
    for (lang, body, prose) in blocks() {
        match lang.as_str() {
            "sh" => {
                let mut script = String::from("set -e\n");
                for line in body.lines() {
                    // CI installs the target (.ci/plugins-host.sh) before the tests.
                    if line.starts_with("rustup target add wasm32-wasip2") && wasm_target_installed() {
                        continue;
                    }
                    script.push_str(line);
                    script.push('\n');
                }
                let cwd_file = tmp.path().join(".cwd");
                script.push_str(&format!("pwd > '{}'\n", cwd_file.display()));
                let out = Command::new("sh")
                    .arg("-c")
                    .arg(&script)
                    .current_dir(&cwd)
                    .env("PATH", &path)
                    .env_remove("CARGO_TARGET_DIR")
                    .env_remove("RUSTFLAGS")
                    .env_remove("CARGO_ENCODED_RUSTFLAGS")
                    .output()
                    .unwrap();
                let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
                transcript.push_str(&format!("$ {}\n{text}\n", body.trim()));
                assert!(out.status.success(), "README block failed:\n{body}\n---\n{text}");
                cwd = PathBuf::from(std::fs::read_to_string(&cwd_file).unwrap().trim());
                // The crate just made builds into the warm directory.
                if cwd.join("Cargo.toml").is_file() && !cwd.join("target").exists() {
                    std::os::unix::fs::symlink(&warm, cwd.join("target")).unwrap();
                }
            }
            "toml" | "rust" | "yaml" => {
                let file = cwd.join(file_named(&prose));
                let body = body.replace("PROFCOL_CHECKOUT", &checkout);
                if prose.contains("replace the empty `[dependencies]`") {
                    let text = std::fs::read_to_string(&file).unwrap();
                    assert!(text.contains("[dependencies]\n"), "{}: {text}", file.display());
                    std::fs::write(&file, text.replacen("[dependencies]\n", &body, 1)).unwrap();
                } else {
                    std::fs::write(&file, body).unwrap();
                }
            }
            other => panic!("a block of {other:?} in the plugin section: the test does not know what to do with it"),
        }
    }
    eprintln!("{transcript}");
    assert!(transcript.contains("test tests::drops_pid_200 ... ok"), "the crate's test ran");
    assert!(transcript.contains("world:    processor (profcol:plugin@0.1.0; compatible"), "inspect");
    assert!(transcript.contains("input:    2000 samples in 2 profiles"), "gen-batch and run");
    assert!(transcript.contains("output:   1000 samples"), "pid 1000 dropped: {transcript}");
    assert!(transcript.contains("configuration is valid"), "the pipeline validates");

    // Without a config: the plugin gets `null`, its Config::default().
    let wasm = cwd.join("target/wasm32-wasip2/release/my_plugin.wasm");
    let out = Command::new(bin())
        .args(["plugin", "run"])
        .arg(&wasm)
        .args(["--input", cwd.join("in/batch.pb").to_str().unwrap(), "--call-timeout", "10s"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("output:   2000 samples"), "{text}");
    // ...and a pipeline without `config:` starts (paths made absolute: the
    // agent runs elsewhere here).
    let yaml = std::fs::read_to_string(cwd.join("pipeline.yaml")).unwrap();
    let mut no_config: String = yaml
        .lines()
        .filter(|l| !l.trim_start().starts_with("config:"))
        .map(|l| l.to_owned() + "\n")
        .collect::<String>()
        .replace("./in", &cwd.join("in").display().to_string())
        .replace("path: target/", &format!("path: {}/target/", cwd.display()));
    no_config.push_str(&format!(
        "  plugins: {{ cache_dir: {} }}\n  telemetry: {{ metrics: {{ address: 127.0.0.1:0 }} }}\n",
        tmp.path().join("cache").display()
    ));
    let cfg = write(&cwd.join("no_config.yaml"), &no_config);
    let mut pc = Profcol::start(&["--config", cfg.to_str().unwrap()]);
    assert!(pc.wait_log("profcol started", Duration::from_secs(30)), "started without config:");
    pc.signal(libc::SIGTERM);
    assert!(pc.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));

    // `profcol plugin new` makes the same crate in one step; its tests pass.
    let out = Command::new(bin())
        .args(["plugin", "new", "second-plugin", "--sdk"])
        .arg(repo().join("plugins/sdk"))
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("created second-plugin/"), "{text}");
    let made = tmp.path().join("second-plugin");
    std::os::unix::fs::symlink(&warm, made.join("target")).unwrap();
    let out = Command::new("cargo")
        .arg("test")
        .current_dir(&made)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("test result: ok. 2 passed"), "{text}");
}
