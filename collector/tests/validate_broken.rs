//! One check, two callers: each broken config below fails `profcol validate`
//! with the file:line:column of the offending key, its config path, and a
//! message that says what to do; and every example that validates also
//! starts (in a temporary directory, in its own network namespace so fixed
//! ports cannot collide).

mod common;
use common::bin;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A valid pipeline; each case adds its broken component next to it in a
/// second file, so every error is located in that file.
const BASE: &str = "receivers:\n  file/base:\n    path: {dir}\nexporters:\n  debug/base:\nservice:\n  pipelines:\n    profiles/base:\n      receivers: [file/base]\n      exporters: [debug/base]\n";

struct Case {
    /// The second config file (`{dir}`: a writable directory, `{file}`: a
    /// regular file, `{garbage}`: a file that is not PEM).
    yaml: &'static str,
    /// The config path the error must name.
    path: &'static str,
    /// Text of the line the error must point at (its first occurrence).
    line: &'static str,
    /// Words of the message that tell the user what to do.
    says: &'static str,
}

const fn case(yaml: &'static str, path: &'static str, line: &'static str, says: &'static str) -> Case {
    Case { yaml, path, line, says }
}

const CASES: &[Case] = &[
    // processors
    case("processors:\n  batch:\n    timeout: 0s\n", "processors::batch::timeout", "timeout:", "must be greater than 0"),
    case("processors:\n  batch:\n    send_batch_size: 0\n", "processors::batch::send_batch_size", "send_batch_size:", "must be at least 1"),
    case("processors:\n  batch:\n    timeout: 5 parsecs\n", "processors::batch::timeout", "timeout:", "expected a duration; write numbers with units, e.g. 200ms"),
    case("processors:\n  kernel_symbols:\n    reload:\n      min_interval: 0s\n", "processors::kernel_symbols::reload::min_interval", "min_interval:", "must be greater than 0"),
    case("processors:\n  kernel_symbols:\n    reload:\n      max_backoff: 1s\n", "processors::kernel_symbols::reload::max_backoff", "max_backoff:", "raise it or lower min_interval"),
    case("processors:\n  kernel_symbols:\n    kallsyms: {dir}/nope\n", "processors::kernel_symbols::kallsyms", "kallsyms:", "give the path of an existing file"),
    // pprof exporter
    case("exporters:\n  pprof:\n    directory: {dir}/p\n    endpoint: http://localhost:4040\n", "exporters::pprof::endpoint", "endpoint:", "not both (use two pprof exporters"),
    case("exporters:\n  pprof:\n    file_prefix: x\n", "exporters::pprof", "pprof:", "set `directory` (files) or `endpoint`"),
    case("exporters:\n  pprof:\n    endpoint: ftp://localhost:4040\n", "exporters::pprof::endpoint", "endpoint:", "not http or https"),
    case("exporters:\n  pprof:\n    endpoint: http://u:pw@localhost:99999\n", "exporters::pprof::endpoint", "endpoint:", "is not within 1-65535"),
    case("exporters:\n  pprof:\n    directory: {file}/sub\n", "exporters::pprof::directory", "directory:", "is not a directory"),
    case("exporters:\n  pprof:\n    endpoint: https://localhost:4040\n    ca_file: {dir}/ca.pem\n", "exporters::pprof::ca_file", "ca_file:", "give the path of an existing file"),
    case("exporters:\n  pprof:\n    directory: {dir}/p\n    headers:\n      x-a: b\n", "exporters::pprof::headers", "headers:", "remove them or set `endpoint`"),
    case("exporters:\n  pprof:\n    directory: {dir}/p\n    file_prefix: a/b\n", "exporters::pprof::file_prefix", "file_prefix:", "without '/'"),
    // otlp (gRPC) exporter
    case("exporters:\n  otlp:\n    endpoint: localhost:70000\n", "exporters::otlp::endpoint", "endpoint:", "is not within 1-65535"),
    case("exporters:\n  otlp:\n    endpoint: localhost\n", "exporters::otlp::endpoint", "endpoint:", "write host:port"),
    case("exporters:\n  otlp:\n    endpoint: localhost:4317\n    tls:\n      ca_file: {dir}/ca.pem\n", "exporters::otlp::tls::ca_file", "ca_file:", "give the path of an existing file"),
    case("exporters:\n  otlp:\n    endpoint: localhost:4317\n    tls:\n      cert_file: {garbage}\n", "exporters::otlp::tls::key_file", "tls:", "must be given together"),
    case("exporters:\n  otlp:\n    endpoint: localhost:4317\n    tls:\n      cert_file: {garbage}\n      key_file: {garbage}\n", "exporters::otlp::tls::cert_file", "cert_file:", "holds no PEM certificate"),
    case("exporters:\n  otlp:\n    endpoint: localhost:4317\n    tls:\n      insecure: true\n      ca_file: {garbage}\n", "exporters::otlp", "otlp:", "use https:// or remove the tls settings"),
    case("exporters:\n  otlp:\n    endpoint: localhost:4317\n    headers:\n      x-token: \"a\\nb\"\n", "exporters::otlp::headers::x-token", "x-token:", "visible ASCII only"),
    case("exporters:\n  otlp:\n    endpoint: localhost:4317\n    max_recv_msg_size_mib: 0\n", "exporters::otlp::max_recv_msg_size_mib", "max_recv_msg_size_mib:", "use 1 to 4096 MiB"),
    case("exporters:\n  otlp:\n    endpoint: localhost:4317\n    headers:\n      authorization: \"[REDACTED]\"\n", "exporters::otlp::headers::authorization", "authorization:", "put the real value here"),
    case("exporters:\n  otlp:\n    endpoint: localhost:4317\n    balancer:\n      resolver:\n        static:\n          endpoints: [a:4317]\n", "exporters::otlp::balancer", "balancer:", "remove endpoint (or balancer)"),
    case("exporters:\n  otlp_http:\n    balancer:\n      resolver:\n        dns:\n          hostname: gw.svc\n          interval: 10ms\n", "exporters::otlp_http::balancer::resolver::dns::interval", "interval:", "use 100ms to 1h"),
    case("processors:\n  resource:\n    attributes:\n      - key: ''\n        action: upsert\n        value: x\n", "processors::resource::attributes::0::key", "key:", "name the resource attribute"),
    // exporter helper keys (every exporter)
    case("exporters:\n  otlp:\n    endpoint: localhost:4317\n    timeout: 0s\n", "exporters::otlp::timeout", "timeout:", "must be greater than 0"),
    case("exporters:\n  debug:\n    sending_queue:\n      queue_size: 0\n", "exporters::debug::sending_queue::queue_size", "queue_size:", "set enabled: false"),
    case("exporters:\n  debug:\n    retry_on_failure:\n      multiplier: 0.5\n", "exporters::debug::retry_on_failure::multiplier", "multiplier:", "at least 1"),
    case("exporters:\n  debug:\n    retry_on_failure:\n      initial_interval: 10s\n      max_interval: 1s\n", "exporters::debug::retry_on_failure::max_interval", "max_interval:", "raise it or lower initial_interval"),
    case("exporters:\n  debug:\n    sending_queue:\n      storage: {file}/q\n", "exporters::debug::sending_queue::storage", "storage:", "is not a directory"),
    // otlp_http exporter
    case("exporters:\n  otlp_http:\n    endpoint: localhost:4318\n", "exporters::otlp_http::endpoint", "endpoint:", "write e.g. https://host:4318"),
    case("exporters:\n  otlp_http:\n    endpoint: https://localhost:4318\n    tls:\n      server_name_override: x\n", "exporters::otlp_http::tls::server_name_override", "server_name_override:", "write the name the server's certificate is valid for"),
    case("exporters:\n  otlp_http:\n    profiles_endpoint: http://localhost:0/x\n", "exporters::otlp_http::profiles_endpoint", "profiles_endpoint:", "is not within 1-65535"),
    // file and flamegraph exporters
    case("exporters:\n  file:\n    path: {file}/out.jsonl\n", "exporters::file::path", "path:", "is not a directory"),
    case("exporters:\n  file:\n    format: proto\n", "exporters::file::path", "file:", "is required: the file to write"),
    case("exporters:\n  flamegraph:\n    directory: {file}/fg\n", "exporters::flamegraph::directory", "directory:", "is not a directory"),
    // otlp receiver
    case("receivers:\n  otlp:\n    protocols: {}\n", "receivers::otlp::protocols", "protocols:", "add `protocols: {grpc: {}}`"),
    case("receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:70000\n", "receivers::otlp::protocols::grpc::endpoint", "endpoint:", "is not within 1-65535"),
    case("receivers:\n  otlp:\n    protocols:\n      http:\n        max_recv_msg_size_mib: 0\n", "receivers::otlp::protocols::http::max_recv_msg_size_mib", "max_recv_msg_size_mib:", "must be a positive number of MiB"),
    case("receivers:\n  otlp:\n    protocols:\n      grpc:\n    max_concurrent_requests: 0\n", "receivers::otlp::max_concurrent_requests", "max_concurrent_requests:", "must be between 1 and"),
    case("receivers:\n  otlp:\n    protocols:\n      grpc:\n        tls:\n          cert_file: {dir}/c.pem\n          key_file: {dir}/k.pem\n", "receivers::otlp::protocols::grpc::tls::cert_file", "cert_file:", "give the path of an existing file"),
    case("receivers:\n  otlp:\n    protocols:\n      http:\n        profiles_url_path: v1/profiles\n", "receivers::otlp::protocols::http::profiles_url_path", "profiles_url_path:", "must start with '/'"),
    case("receivers:\n  otlp:\n    protocols:\n      grpc:\n    backpressure_timeout: 0s\n", "receivers::otlp::backpressure_timeout", "backpressure_timeout:", "must be greater than 0"),
    // file and ebpf receivers
    case("receivers:\n  file:\n    path: {dir}/missing\n", "receivers::file::path", "path:", "give an existing file or directory"),
    case("receivers:\n  file:\n    path: {dir}\n    replay_rate: -1\n", "receivers::file::replay_rate", "replay_rate:", "must be a finite number >= 0"),
    case("receivers:\n  ebpf:\n    sample_frequency: 0\n", "receivers::ebpf::sample_frequency", "sample_frequency:", "use 1..=100000 Hz"),
    case("receivers:\n  ebpf:\n    ring_buffer_size: 1000\n", "receivers::ebpf::ring_buffer_size", "ring_buffer_size:", "must be a power of two"),
    case("receivers:\n  ebpf:\n    pids: [0]\n", "receivers::ebpf::pids", "pids:", "remove it"),
    // extensions
    case("extensions:\n  health_check:\n    endpoint: localhost\n", "extensions::health_check::endpoint", "endpoint:", "write host:port"),
    case("extensions:\n  health_check:\n    path: healthz\n", "extensions::health_check::path", "path:", "must start with '/'"),
    // service
    case("service:\n  telemetry:\n    metrics:\n      address: localhost:88888\n", "service::telemetry::metrics::address", "address:", "or \"\" to turn /metrics off"),
    case("service:\n  shutdown_timeout: 0s\n", "service::shutdown_timeout", "shutdown_timeout:", "must be greater than 0"),
    case("service:\n  runtime:\n    worker_threads: 0\n", "service::runtime::worker_threads", "worker_threads:", "use 1 to 1024"),
    case("service:\n  runtime:\n    malloc_arenas: 0\n", "service::runtime::malloc_arenas", "malloc_arenas:", "use 1 to 1024"),
    // service.telemetry
    case("service:\n  telemetry:\n    metrics:\n      readers:\n        - periodic:\n            exporter:\n              otlp:\n                endpoint: localhost:4317\n", "service::telemetry::metrics::readers::0::periodic::exporter::otlp::endpoint", "endpoint:", "write http://host:port or https://host:port"),
    case("service:\n  telemetry:\n    metrics:\n      readers:\n        - periodic:\n            interval: 10ms\n            exporter:\n              otlp:\n                endpoint: http://localhost:4317\n", "service::telemetry::metrics::readers::0::periodic::interval", "interval:", "at least 100ms"),
    case("service:\n  telemetry:\n    metrics:\n      readers:\n        - pull:\n            exporter:\n              prometheus:\n                port: 8888\n", "service::telemetry::metrics::readers::0::pull::exporter::prometheus::port", "port:", "is metrics.address already"),
    case("service:\n  telemetry:\n    logs:\n      processors:\n        - batch:\n            schedule_delay: 0s\n            exporter:\n              otlp:\n                endpoint: https://localhost:4317\n                tls:\n                  ca_file: {dir}/missing.pem\n", "service::telemetry::logs::processors::0::batch::exporter::otlp::tls::ca_file", "ca_file:", "cannot read"),
    case("service:\n  telemetry:\n    traces:\n      sampling_ratio: 2\n", "service::telemetry::traces::sampling_ratio", "sampling_ratio:", "use a number from 0.0 to 1.0"),
];

fn fill(text: &str, dir: &Path) -> String {
    text.replace("{dir}", &dir.display().to_string())
        .replace("{file}", &dir.join("a-file").display().to_string())
        .replace("{garbage}", &dir.join("garbage.pem").display().to_string())
}

#[test]
fn broken_configs_fail_validate_at_the_offending_key() {
    assert!(CASES.len() >= 30, "{} cases", CASES.len());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a-file"), "x").unwrap();
    std::fs::write(dir.path().join("garbage.pem"), "not a certificate\n").unwrap();
    let base = dir.path().join("base.yaml");
    std::fs::write(&base, fill(BASE, dir.path())).unwrap();
    let mut failures = Vec::new();
    for (i, c) in CASES.iter().enumerate() {
        let text = fill(c.yaml, dir.path());
        let file = dir.path().join(format!("case-{i:02}.yaml"));
        std::fs::write(&file, &text).unwrap();
        let out =
            Command::new(bin()).arg("validate").arg("--config").arg(&base).arg("--config").arg(&file).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let (line, col) = text
            .lines()
            .enumerate()
            .find_map(|(n, l)| l.find(c.line).map(|i| (n + 1, i + 1)))
            .unwrap_or_else(|| panic!("case {i}: {:?} not in its yaml", c.line));
        let want = format!("{}:{line}:{col}: {}: ", file.display(), c.path);
        let found = err.lines().map(str::trim).find(|l| l.starts_with(&want));
        match found {
            Some(l) if out.status.code() == Some(1) && l.contains(c.says) => {}
            _ => failures.push(format!(
                "case {i} ({}):\n  want {want}...{}\n  got (exit {:?}):\n{err}",
                c.path,
                c.says,
                out.status.code()
            )),
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), CASES.len(), failures.join("\n"));
}

#[test]
fn secrets_are_not_echoed_by_validate() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.yaml");
    std::fs::write(&base, fill(BASE, dir.path())).unwrap();
    let file = dir.path().join("c.yaml");
    std::fs::write(&file, "exporters:\n  pprof:\n    endpoint: http://user:hunter2@localhost:99999\n  otlp:\n    endpoint: localhost:1\n    headers:\n      cookie: \"s3cr3t\\n\"\n").unwrap();
    let out =
        Command::new(bin()).arg("validate").arg("--config").arg(&base).arg("--config").arg(&file).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("user:[REDACTED]@localhost:99999") && err.contains("headers::cookie"), "{err}");
    assert!(!err.contains("hunter2") && !err.contains("s3cr3t"), "{err}");
}

/// Runs `profcol --config <example>` in `cwd` inside a fresh network
/// namespace (loopback only); returns None once it logged "profcol started"
/// (then it is stopped), or its log when it exited first.
fn starts(example: &Path, cwd: &Path) -> Option<String> {
    let script = format!("ip link set lo up && exec {} --config {}", bin(), example.display());
    let mut child = Command::new("unshare")
        .args(["--net", "sh", "-c", &script])
        .current_dir(cwd)
        .env("RUST_LOG", "info")
        .env("OTLP_ENDPOINT", "localhost:4317")
        .env("PYROSCOPE_URL", "http://localhost:4040")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare runs (root, util-linux)");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut log = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(l) => {
                let started = l.contains("profcol started");
                log.push_str(&l);
                log.push('\n');
                if started {
                    // SAFETY: signalling our own child by its pid.
                    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                    let _ = child.wait();
                    return None;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(_) => {}
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    Some(log)
}

#[test]
fn every_example_that_validates_starts() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if !p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            continue;
        }
        let out = Command::new(bin())
            .arg("validate")
            .arg("--config")
            .arg(&p)
            .env("OTLP_ENDPOINT", "localhost:4317")
            .env("PYROSCOPE_URL", "http://localhost:4040")
            .output()
            .unwrap();
        if !out.status.success() {
            continue;
        }
        let cwd = tempfile::tempdir().unwrap();
        if let Some(log) = starts(&p.canonicalize().unwrap(), cwd.path()) {
            panic!("{} validates but does not start:\n{log}", p.display());
        }
        n += 1;
    }
    assert!(n >= 3, "only {n} examples validated");
}
