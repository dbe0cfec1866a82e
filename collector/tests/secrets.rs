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

/// Credentials in every URL and header of every component and
/// self-telemetry exporter that takes them (both protocols), at trace level
/// for profcol and every library (the transports log the URLs they connect
/// to): none of them reaches the log.
#[test]
fn trace_logs_show_no_credential_from_any_component_or_library() {
    const CREDENTIALS: [&str; 20] = [
        "grpc-bearer-101",
        "grpc-apikey-102",
        "http-urlpass-103",
        "http-apikey-104",
        "http-query-105",
        "pprof-urlpass-106",
        "pprof-basic-107",
        "pprof-tenant-108",
        "metrics-http-urlpass-109",
        "metrics-http-key-110",
        "metrics-grpc-urlpass-111",
        "metrics-grpc-key-112",
        "logs-http-urlpass-113",
        "logs-http-key-114",
        "logs-grpc-urlpass-115",
        "logs-grpc-key-116",
        "traces-http-urlpass-117",
        "traces-http-key-118",
        "traces-grpc-urlpass-119",
        "traces-grpc-key-120",
    ];
    // Every endpoint answers the connection and then nothing: the clients
    // connect, send, and time out.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().map_while(Result::ok) {
            held.push(s);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    write_corpus(&dir.path().join("corpus"), 2, 5);
    let tel = |signal: &str, proto: &str, pass: &str, key: &str| {
        format!(
            "{{otlp: {{protocol: {proto}, endpoint: \"http://{signal}:{pass}@127.0.0.1:{port}\", timeout: 1s, \
             headers: {{authorization: \"Bearer {key}\"}}}}}}"
        )
    };
    let c = CREDENTIALS;
    let text = format!(
        "receivers:
  file:
    path: {corpus}
    replay_rate: 20
    loop: true
exporters:
  otlp:
    endpoint: 127.0.0.1:{port}
    tls: {{insecure: true}}
    timeout: 1s
    retry_on_failure: {{enabled: false}}
    headers:
      authorization: Bearer {c0}
      x-api-key: {c1}
  otlp_http:
    profiles_endpoint: \"http://alice:{c2}@127.0.0.1:{port}/v1development/profiles?api_key={c4}\"
    timeout: 1s
    retry_on_failure: {{enabled: false}}
    headers:
      x-api-key: {c3}
  pprof:
    endpoint: http://bob:{c5}@127.0.0.1:{port}
    timeout: 1s
    retry_on_failure: {{enabled: false}}
    headers:
      authorization: Basic {c6}
      x-scope-orgid: {c7}
service:
  telemetry:
    logs:
      level: trace
      processors:
        - batch: {{schedule_delay: 200ms, exporter: {lh}}}
        - batch: {{schedule_delay: 200ms, exporter: {lg}}}
    metrics:
      address: \"\"
      readers:
        - periodic: {{interval: 200ms, exporter: {mh}}}
        - periodic: {{interval: 200ms, exporter: {mg}}}
    traces:
      processors:
        - batch: {{schedule_delay: 200ms, exporter: {th}}}
        - batch: {{schedule_delay: 200ms, exporter: {tg}}}
  pipelines:
    profiles:
      receivers: [file]
      exporters: [otlp, otlp_http, pprof]
",
        corpus = dir.path().join("corpus").display(),
        c0 = c[0],
        c1 = c[1],
        c2 = c[2],
        c3 = c[3],
        c4 = c[4],
        c5 = c[5],
        c6 = c[6],
        c7 = c[7],
        mh = tel("metrics", "http/protobuf", c[8], c[9]),
        mg = tel("metrics", "grpc", c[10], c[11]),
        lh = tel("logs", "http/protobuf", c[12], c[13]),
        lg = tel("logs", "grpc", c[14], c[15]),
        th = tel("traces", "http/protobuf", c[16], c[17]),
        tg = tel("traces", "grpc", c[18], c[19]),
    );
    let cfg = write(&dir.path().join("c.yaml"), &text);
    let p = Profcol::start_env(&["--config", cfg.to_str().unwrap()], &[("RUST_LOG", "trace,opentelemetry=trace")]);
    // Every exporter tried, and the transports logged their connections.
    for needle in ["exporter=otlp ", "exporter=otlp_http", "exporter=pprof", "starting new connection"] {
        assert!(
            common::wait_until(Duration::from_secs(30), || p.log_count(needle) > 0),
            "nothing logged with {needle:?}"
        );
    }
    std::thread::sleep(Duration::from_secs(3));
    p.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    let log = p.log.lock().unwrap().join("\n");
    eprintln!("{} log lines, {} bytes", log.lines().count(), log.len());
    for s in CREDENTIALS {
        if let Some(line) = log.lines().find(|l| l.contains(s)) {
            panic!("the log shows the credential {s:?}: {line}");
        }
    }
}
