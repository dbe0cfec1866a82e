//! Shared by the host's integration tests: a corpus on disk and a handle on a
//! running profcol process (what other crates share is in profcol-testkit).
#![allow(dead_code)]

pub mod service;

use profcol_api::Profiles;
pub use profcol_testkit::batch::random_batch;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_profcol")
}

/// Writes `n` batches as `.pb` files into `dir`; returns them.
pub fn write_corpus(dir: &Path, n: usize, samples: usize) -> Vec<Profiles> {
    std::fs::create_dir_all(dir).unwrap();
    (0..n)
        .map(|i| {
            let p = random_batch(i as u64 + 1, 3, samples, 40, 8);
            std::fs::write(dir.join(format!("batch-{i:04}.pb")), p.encode_to_vec()).unwrap();
            p
        })
        .collect()
}

/// Reads what the file exporter wrote (JSON lines).
pub fn read_jsonl(path: &Path) -> Vec<Profiles> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| Profiles::from_json(l.as_bytes()).unwrap()).collect()
}

/// A running profcol with its log lines collected.
pub struct Profcol {
    pub child: Child,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Profcol {
    pub fn start(args: &[&str]) -> Profcol {
        let mut child = Command::new(bin())
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("profcol starts");
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let l2 = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[profcol] {line}");
                l2.lock().unwrap().push(line);
            }
        });
        Profcol { child, log }
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    pub fn log_count(&self, needle: &str) -> usize {
        self.log.lock().unwrap().iter().filter(|l| l.contains(needle)).count()
    }

    /// The address a component logged it bound (configure it with port 0):
    /// `key=ADDR` in the first log line containing `needle`.
    pub fn wait_addr(&self, needle: &str, key: &str, timeout: Duration) -> std::net::SocketAddr {
        let mut found = None;
        wait_until(timeout, || {
            found = self
                .log
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains(needle))
                .find_map(|l| profcol_testkit::net::addr_in_log(l, key));
            found.is_some()
        });
        found.unwrap_or_else(|| panic!("no log line with {needle:?} and {key}=ADDR within {timeout:?}"))
    }

    /// Waits until a log line contains `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, || self.log_count(needle) > 0)
    }

    /// A `kB` line of /proc/PID/status (`VmHWM`: peak RSS, `VmRSS`: now), in bytes.
    pub fn status_kb(&self, key: &str) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("profcol is running");
        let line = text.lines().find(|l| l.starts_with(&format!("{key}:"))).unwrap_or_else(|| panic!("no {key}"));
        line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).expect("a number of kB") * 1024
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Profcol {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An OTLP backend (gRPC) on `127.0.0.1:port`: an otlp receiver feeding a
/// test [`Collector`](profcol_testkit::sink::Collector).
pub async fn backend(port: u16) -> (profcol_receivers::otlp::OtlpReceiver, Arc<profcol_testkit::sink::Collector>) {
    use profcol_api::component::{ComponentId, Consumer, Kind, Next};
    use profcol_api::Receiver;
    use profcol_receivers::otlp::{GrpcConfig, OtlpReceiver, OtlpReceiverConfig, Protocols};
    let cfg = OtlpReceiverConfig {
        protocols: Protocols {
            grpc: Some(GrpcConfig { endpoint: format!("127.0.0.1:{port}"), ..Default::default() }),
            http: None,
        },
        ..Default::default()
    };
    let r = OtlpReceiver::new(profcol_testkit::settings(Kind::Receiver, "otlp/backend"), cfg).unwrap();
    let sink = Arc::new(profcol_testkit::sink::Collector::default());
    let id: ComponentId = "otlp/backend".parse().unwrap();
    r.start(Next::new(
        vec![sink.clone() as Arc<dyn Consumer>],
        profcol_api::telemetry::ComponentTelemetry::detached(Kind::Receiver, &id),
    ))
    .await
    .unwrap();
    (r, sink)
}

/// The value of a series in Prometheus text (`name{labels} value`), if present.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))?.rsplit(' ').next()?.parse().ok()
}

pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

pub fn write(path: &Path, text: &str) -> PathBuf {
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}
