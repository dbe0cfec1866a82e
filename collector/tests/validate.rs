//! `profcol validate`: every example is valid; each kind of mistake exits 1
//! and says where.

mod common;
use common::bin;
use std::process::Command;

fn validate(files: &[&std::path::Path], envs: &[(&str, &str)]) -> (i32, String) {
    let mut c = Command::new(bin());
    c.arg("validate");
    for f in files {
        c.arg("--config").arg(f);
    }
    for (k, v) in envs {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

const GOOD: &str = "receivers:\n  file:\n    path: /tmp\nexporters:\n  debug:\nservice:\n  pipelines:\n    profiles:\n      receivers: [file]\n      exporters: [debug]\n";

fn bad(text: &str) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.yaml");
    std::fs::write(&p, text).unwrap();
    let (code, err) = validate(&[&p], &[]);
    (code, err, p.display().to_string())
}

#[test]
fn every_example_is_valid() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            let (code, err) =
                validate(&[&p], &[("OTLP_ENDPOINT", "localhost:4317"), ("PYROSCOPE_URL", "http://localhost:4040")]);
            assert_eq!(code, 0, "{} is invalid:\n{err}", p.display());
            n += 1;
        }
    }
    assert!(n >= 1, "no examples found in {dir}");
}

#[test]
fn good_config_exits_zero() {
    let (code, err, _) = bad(GOOD);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn bad_yaml_says_file_line_column() {
    let (code, err, p) = bad("receivers:\n  file:\n    path: [unclosed\n");
    assert_eq!(code, 1);
    assert!(err.contains(&format!("{p}:")) && err.contains("invalid YAML"), "{err}");
    let line = err.lines().find(|l| l.contains("invalid YAML")).unwrap();
    let pos: Vec<&str> = line.trim().split(':').take(3).collect();
    assert!(pos[1].parse::<u32>().is_ok() && pos[2].parse::<u32>().is_ok(), "no line:column in {line}");
}

#[test]
fn unknown_key_is_located() {
    let (code, err, p) = bad(&GOOD.replace("    path: /tmp\n", "    path: /tmp\n    pth: 1\n"));
    assert_eq!(code, 1);
    assert!(err.contains(&format!("{p}:4:5: receivers::file::pth: unknown field `pth`")), "{err}");
}

#[test]
fn unknown_top_level_key_is_located() {
    let (code, err, p) = bad(&format!("{GOOD}recievers: {{}}\n"));
    assert_eq!(code, 1);
    assert!(err.contains(&format!("{p}:11:1: recievers: unknown top-level key")), "{err}");
}

#[test]
fn unknown_component_type() {
    let (code, err, p) = bad(&GOOD.replace("  debug:\n", "  debgu:\n").replace("[debug]", "[debgu]"));
    assert_eq!(code, 1);
    assert!(err.contains(&format!("{p}:5:3: exporters::debgu: unknown exporter type \"debgu\"")), "{err}");
}

#[test]
fn pipeline_references_unconfigured_component() {
    let (code, err, _) = bad(&GOOD.replace("[debug]", "[debug, otlp/backend]"));
    assert_eq!(code, 1);
    assert!(
        err.contains("service::pipelines::profiles: references exporter \"otlp/backend\" which is not configured"),
        "{err}"
    );
}

#[test]
fn env_var_without_value_or_default() {
    let (code, err, p) = bad(&GOOD.replace("path: /tmp", "path: ${env:PROFCOL_TEST_UNSET_VAR}"));
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!(
            "{p}:3:5: receivers::file::path: environment variable PROFCOL_TEST_UNSET_VAR is not set"
        )),
        "{err}"
    );
    // With a default it is fine.
    let (code, err, _) = bad(&GOOD.replace("path: /tmp", "path: ${env:PROFCOL_TEST_UNSET_VAR:-/tmp}"));
    assert_eq!(code, 0, "{err}");
}

#[test]
fn pipeline_without_receiver_or_exporter() {
    let (code, err, _) = bad(&GOOD.replace("receivers: [file]", "receivers: []"));
    assert_eq!(code, 1);
    assert!(err.contains("service::pipelines::profiles: must have at least one receiver"), "{err}");
    let (code, err, _) = bad(&GOOD.replace("exporters: [debug]", "exporters: []"));
    assert_eq!(code, 1);
    assert!(err.contains("service::pipelines::profiles: must have at least one exporter"), "{err}");
}

#[test]
fn all_errors_of_a_file_are_reported_together() {
    let (code, err, _) =
        bad(&GOOD.replace("    path: /tmp\n", "    path: /tmp\n    pth: 1\n").replace("[debug]", "[debug, nope]"));
    assert_eq!(code, 1);
    assert!(err.contains("2 errors"), "{err}");
}

#[test]
fn configs_merge_in_order_and_set_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let a = common::write(&dir.path().join("a.yaml"), GOOD);
    let b = common::write(&dir.path().join("b.yaml"), "exporters:\n  debug:\n    verbosity: detailed\n  file:\n    path: /tmp/x\nservice:\n  pipelines:\n    profiles:\n      exporters: [file]\n");
    let out = Command::new(bin())
        .args(["print-config", "--config"])
        .arg(&a)
        .arg("--config")
        .arg(&b)
        .args(["--set", "receivers.file.replay_rate=2.5", "--set", "exporters.file.format=proto"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_yaml::Value = serde_yaml::from_slice(&out.stdout).unwrap();
    assert_eq!(v["exporters"]["debug"]["verbosity"], serde_yaml::Value::from("detailed"));
    assert_eq!(v["exporters"]["file"]["format"], serde_yaml::Value::from("proto"));
    assert_eq!(v["receivers"]["file"]["replay_rate"], serde_yaml::Value::from(2.5));
    // Lists are replaced, not appended.
    assert_eq!(
        v["service"]["pipelines"]["profiles"]["exporters"],
        serde_yaml::from_str::<serde_yaml::Value>("[file]").unwrap()
    );
    // Defaults are filled in, including the exporter wrapper's.
    assert_eq!(v["exporters"]["file"]["timeout"], serde_yaml::Value::from("5s"));
    assert_eq!(v["service"]["shutdown_timeout"], serde_yaml::Value::from("10s"));
}

#[test]
fn print_config_redacts_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let a = common::write(&dir.path().join("a.yaml"), &GOOD.replace("  debug:\n", "  debug:\n  otlp_http:\n    endpoint: http://localhost:1\n    headers:\n      authorization: Bearer ${env:PROFCOL_TEST_TOKEN}\n"));
    let out = Command::new(bin())
        .args(["print-config", "--config"])
        .arg(&a)
        .env("PROFCOL_TEST_TOKEN", "s3cr3t")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!text.contains("s3cr3t") && text.contains("[REDACTED]"), "{text}");
}

#[test]
fn components_and_version() {
    let out = Command::new(bin()).arg("components").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for t in ["file ", "batch ", "debug ", "health_check "] {
        assert!(text.contains(t), "{t} missing from:\n{text}");
    }
    let out = Command::new(bin()).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("profcol "));
}

/// The guard every binary-starting test runs under (validate, then start)
/// can fail: a valid config whose port another process holds passes
/// `validate` (a port in use is known only at start) and the guard reports
/// that profcol never started.
#[test]
#[should_panic(expected = "passed `profcol validate` but profcol exited without starting")]
fn the_validate_then_start_guard_reports_a_config_that_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let (_taken, busy) = profcol_testkit::net::listener();
    let text = format!(
        "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: {busy}\nexporters:\n  debug:\n{}",
        profcol_testkit::config::one_pipeline("otlp", "", "debug")
    );
    let cfg = common::write(&dir.path().join("c.yaml"), &text);
    let mut p = common::Profcol::start(&["--config", cfg.to_str().unwrap()]);
    assert!(p.wait_exit(std::time::Duration::from_secs(30)).is_some(), "profcol should fail on the taken port");
}
