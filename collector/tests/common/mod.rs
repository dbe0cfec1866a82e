//! Shared by the host's integration tests: a corpus on disk and a handle on a
//! running profcol process (what other crates share is in profcol-testkit).
#![allow(dead_code)]

pub(crate) mod service;

use profcol_api::Profiles;
pub(crate) use profcol_testkit::batch::random_batch;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_profcol")
}

/// Writes `n` batches as `.pb` files into `dir`; returns them.
pub(crate) fn write_corpus(dir: &Path, n: usize, samples: usize) -> Vec<Profiles> {
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
pub(crate) fn read_jsonl(path: &Path) -> Vec<Profiles> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| Profiles::from_json(l.as_bytes()).unwrap()).collect()
}

/// `profcol validate --config PATH`, which every config a test starts must
/// pass: the host's contract is that a config which validates also starts
/// (failures only `start` can know, like a port in use, aside). Panics with
/// validate's output otherwise.
pub(crate) fn assert_validates(config: &Path) {
    let out = Command::new(bin()).arg("validate").arg("--config").arg(config).output().expect("profcol validate runs");
    assert!(
        out.status.success(),
        "the test's config {} does not validate:\n{}",
        config.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running profcol with its log lines collected.
pub(crate) struct Profcol {
    pub child: Child,
    pub log: Arc<Mutex<Vec<String>>>,
    /// The `--config` it was started with (it passed `profcol validate`).
    config: Option<PathBuf>,
}

impl Profcol {
    /// Starts profcol with `args`; a `--config` among them is validated
    /// first, and dropping the handle checks that profcol did start with it.
    pub(crate) fn start(args: &[&str]) -> Profcol {
        Profcol::start_env(args, &[])
    }

    /// [`Profcol::start`] with `env` added to its environment.
    pub(crate) fn start_env(args: &[&str], env: &[(&str, &str)]) -> Profcol {
        let config = args.windows(2).find(|w| w[0] == "--config").map(|w| PathBuf::from(w[1]));
        if let Some(c) = &config {
            assert_validates(c);
        }
        let mut child = Command::new(bin())
            .args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
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
        Profcol { child, log, config }
    }

    pub(crate) fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    pub(crate) fn log_count(&self, needle: &str) -> usize {
        self.log.lock().unwrap().iter().filter(|l| l.contains(needle)).count()
    }

    /// The address a component logged it bound (configure it with port 0):
    /// `key=ADDR` in the first log line containing `needle`.
    pub(crate) fn wait_addr(&self, needle: &str, key: &str, timeout: Duration) -> std::net::SocketAddr {
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
    pub(crate) fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, || self.log_count(needle) > 0)
    }

    /// A `kB` line of /proc/PID/status (`VmHWM`: peak RSS, `VmRSS`: now), in bytes.
    pub(crate) fn status_kb(&self, key: &str) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("profcol is running");
        let line = text.lines().find(|l| l.starts_with(&format!("{key}:"))).unwrap_or_else(|| panic!("no {key}"));
        line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).expect("a number of kB") * 1024
    }

    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
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
        // Validate passed; a profcol that exited by itself without ever
        // starting broke the contract (checked here so every test holds it).
        let exited = matches!(self.child.try_wait(), Ok(Some(_)));
        if let Some(c) = self.config.as_ref().filter(|_| exited && !std::thread::panicking()) {
            if self.log_count("profcol started") == 0 {
                let log = self.log.lock().unwrap().join("\n");
                panic!("{} passed `profcol validate` but profcol exited without starting:\n{log}", c.display());
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An OTLP backend (gRPC) on `127.0.0.1:port`: an otlp receiver feeding a
/// test [`Collector`](profcol_testkit::sink::Collector).
pub(crate) async fn backend(
    port: u16,
) -> (Arc<profcol_receivers::otlp::OtlpReceiver>, Arc<profcol_testkit::sink::Collector>) {
    use profcol_receivers::otlp::testing::{collecting_receiver, receiver_config};
    collecting_receiver("otlp/backend", receiver_config(Some(&format!("127.0.0.1:{port}")), None)).await
}

/// The value of a series in Prometheus text (`name{labels} value`), if present.
pub(crate) fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))?.rsplit(' ').next()?.parse().ok()
}

pub(crate) fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// A plain HTTP/1.1 GET: the status code and the whole answer (headers and body).
pub(crate) fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, text)
}

/// Writes `text` as `dir/name` and starts profcol on it (validated first).
pub(crate) fn start_config(dir: &Path, name: &str, text: &str) -> Profcol {
    let cfg = write(&dir.join(name), text);
    Profcol::start(&["--config", cfg.to_str().expect("a UTF-8 temp path")])
}

pub(crate) fn write(path: &Path, text: &str) -> PathBuf {
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}
