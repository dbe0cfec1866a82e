//! Secrets are a type: print-config and the logs of a run whose exports fail
//! show none of them, whatever their keys are called.

mod common;
use common::{bin, write, write_corpus, Profcol};
use std::process::Command;
use std::time::Duration;

/// Every secret below; none may appear in any output.
const SECRETS: [&str; 8] =
    ["tok-grpc-1", "ck-grpc-2", "pw-http-3", "key-http-4", "pw-pyro-5", "tok-pyro-6", "tenant-sig-7", "tel-key-8"];

fn config(dir: &std::path::Path) -> String {
    format!(
        "receivers:
  file:
    path: {corpus}
    replay_rate: 20
    loop: true
exporters:
  otlp:
    endpoint: 127.0.0.1:1
    tls: {{insecure: true}}
    retry_on_failure: {{enabled: false}}
    headers:
      authorization: Bearer tok-grpc-1
      Cookie: session=ck-grpc-2
  otlp_http:
    endpoint: http://alice:pw-http-3@127.0.0.1:1
    retry_on_failure: {{enabled: false}}
    headers:
      x-api-key: key-http-4
  pprof:
    endpoint: http://bob:pw-pyro-5@127.0.0.1:1
    retry_on_failure: {{enabled: false}}
    headers:
      authorization: Basic tok-pyro-6
      x-scope-orgid: tenant-sig-7
service:
  telemetry:
    metrics:
      address: \"\"
      readers:
        - periodic:
            interval: 200ms
            exporter: {{otlp: {{endpoint: http://127.0.0.1:1, headers: {{api-key: tel-key-8}}}}}}
  pipelines:
    profiles:
      receivers: [file]
      exporters: [otlp, otlp_http, pprof]
",
        corpus = dir.join("corpus").display()
    )
}

fn assert_no_secret(what: &str, text: &str) {
    for s in SECRETS {
        assert!(!text.contains(s), "{what} shows the secret {s:?}:\n{text}");
    }
}

#[test]
fn print_config_shows_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    write_corpus(&dir.path().join("corpus"), 1, 5);
    let cfg = write(&dir.path().join("c.yaml"), &config(dir.path()));
    let out = Command::new(bin()).arg("print-config").arg("--config").arg(&cfg).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_no_secret("print-config", &text);
    // Redacted by type: header names are kept, values replaced; URLs keep
    // everything but the password.
    assert_eq!(text.matches("[REDACTED]").count(), 8, "{text}");
    assert!(text.contains("Cookie: '[REDACTED]'") || text.contains("Cookie: \"[REDACTED]\""), "{text}");
    assert!(text.contains("http://alice:[REDACTED]@127.0.0.1:1"), "{text}");
    assert!(text.contains("http://bob:[REDACTED]@127.0.0.1:1"), "{text}");
}

#[test]
fn logs_of_failing_exports_show_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    write_corpus(&dir.path().join("corpus"), 2, 5);
    let cfg = write(&dir.path().join("c.yaml"), &config(dir.path()));
    let p = Profcol::start(&["--config", cfg.to_str().unwrap()]);
    // Each exporter failed at least once, and said where it sends.
    for needle in ["exporter=otlp ", "exporter=otlp_http", "exporter=pprof"] {
        assert!(
            common::wait_until(Duration::from_secs(30), || p
                .log
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains(needle) && l.contains("export failed"))),
            "no failed export logged for {needle}"
        );
    }
    p.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    let log = p.log.lock().unwrap().join("\n");
    assert!(log.contains("alice:[REDACTED]@") && log.contains("bob:[REDACTED]@"), "{log}");
    assert_no_secret("the log", &log);
}
