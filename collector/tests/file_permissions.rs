//! What profcol writes to disk only profcol's user (and, for outputs, its
//! group) can read: the persistent queue 0700 / 0600, exporter outputs
//! 0750 / 0640 by default or as `dir_mode` / `file_mode` say, whatever the
//! umask.

mod common;

use profcol_testkit::config::OTLP_GRPC_RECEIVER;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o777
}

/// The finished files in `dir`: an exporter writes `NAME.tmp` and renames
/// it, so a `.tmp` seen in a listing may be gone by the time it is stat'ed.
fn files_in(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).filter(|p| p.extension().is_none_or(|e| e != "tmp")).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_and_output_files_are_not_world_readable() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let backend = profcol_testkit::net::closed_port();
    let p = common::start_config(
        d,
        "profcol.yaml",
        &format!(
            "{OTLP_GRPC_RECEIVER}exporters:
  file:
    path: {out}/jsonl/profiles.jsonl
  pprof:
    directory: {out}/pprof
    file_mode: \"0600\"
    dir_mode: \"0700\"
  flamegraph:
    directory: {out}/svg/nested
    file_mode: \"0660\"
    dir_mode: \"0770\"
  otlp:
    endpoint: http://127.0.0.1:{backend}
    sending_queue:
      storage: {out}/queue
service:
  telemetry: {{ metrics: {{ address: \"\" }} }}
  pipelines:
    profiles:
      receivers: [otlp]
      exporters: [file, pprof, flamegraph, otlp]
",
            out = d.join("out").display()
        ),
    );
    let g = p.wait_addr("otlp receiver listening", "grpc", Duration::from_secs(30));
    let batch = profcol_testkit::batch::cpu_batch(1, 2, 10);
    profcol_testkit::raw::grpc_send(g, batch.encode_to_vec(), false).await.unwrap();
    let out = d.join("out");
    assert!(
        common::wait_until(Duration::from_secs(10), || {
            !files_in(&out.join("pprof")).is_empty() && !files_in(&out.join("svg/nested")).is_empty()
        }),
        "outputs not written"
    );
    // Defaults: the file exporter.
    assert_eq!(mode(&out.join("jsonl")), 0o750);
    assert_eq!(mode(&out.join("jsonl/profiles.jsonl")), 0o640);
    // Configured: pprof and flamegraph (0660 / 0770 survive a 022 umask only if set explicitly).
    assert_eq!(mode(&out.join("pprof")), 0o700);
    for f in files_in(&out.join("pprof")) {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
    assert_eq!(mode(&out.join("svg")), 0o770);
    assert_eq!(mode(&out.join("svg/nested")), 0o770);
    for f in files_in(&out.join("svg/nested")) {
        assert_eq!(mode(&f), 0o660, "{}", f.display());
    }
    // The persistent queue, whatever the config.
    assert_eq!(mode(&out.join("queue")), 0o700);
    let queues = files_in(&out.join("queue"));
    assert_eq!(queues.len(), 1, "{queues:?}");
    assert_eq!(mode(&queues[0]), 0o700);
    let queued = files_in(&queues[0]);
    assert!(queued.iter().any(|f| f.extension().is_some_and(|e| e == "batch")), "{queued:?}");
    for f in queued {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
}

#[test]
fn a_mode_that_is_not_an_octal_string_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::write(
        &dir.path().join("profcol.yaml"),
        &format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc: {{ endpoint: 127.0.0.1:0 }}\nexporters:\n  file:\n    path: {}\n    file_mode: 640\nservice:\n  pipelines:\n    profiles: {{ receivers: [otlp], exporters: [file] }}\n",
            dir.path().join("p.jsonl").display()
        ),
    );
    let out = std::process::Command::new(common::bin())
        .args(["validate", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("file_mode"), "{text}");
}
