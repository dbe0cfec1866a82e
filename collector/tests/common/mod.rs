//! Shared by the host's integration tests: a corpus generator and a handle on
//! a running profcol process.
#![allow(dead_code)]

pub mod service;

use profcol_api::model::{pb, AttrValue, KeyValue, ProfileMeta, Resource};
use profcol_api::{Profiles, ProfilesBuilder};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_profcol")
}

/// A deterministic batch: `procs` processes, `samples` samples over `stacks`
/// distinct stacks of depth `depth`, with thread attributes and timestamps.
pub fn batch(seed: u64, procs: usize, samples: usize, stacks: usize, depth: usize) -> Profiles {
    let mut b = ProfilesBuilder::new();
    let mut rng = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut profiles = Vec::new();
    for p in 0..procs {
        let res = Resource {
            attributes: vec![KeyValue {
                key: "process.pid".into(),
                value: Some(AttrValue::Int(1000 + p as i64 + seed as i64 * 100).to_any()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let r = b.resource(res);
        profiles.push(b.profile(
            r,
            &ProfileMeta {
                sample_type: ("samples", "count"),
                period_type: ("cpu", "nanoseconds"),
                period: 10_000_000,
                time_unix_nano: 1_700_000_000_000_000_000,
                duration_nano: 5_000_000_000,
            },
        ));
    }
    let file = b.string("/usr/bin/app");
    let mapping = b.mapping(pb::Mapping {
        memory_start: 0x400000,
        memory_limit: 0x800000,
        filename_strindex: file,
        ..Default::default()
    });
    let stack_ids: Vec<i32> = (0..stacks)
        .map(|s| {
            let locs: Vec<i32> = (0..depth)
                .map(|d| {
                    let f = b.function(&format!("fn_{}_{}", s % 97, d), "", "app.c", d as i64);
                    b.location(pb::Location {
                        mapping_index: mapping,
                        address: 0x400000 + (s * depth + d) as u64 * 16,
                        lines: vec![pb::Line { function_index: f, line: d as i64 + 1, column: 0 }],
                        attribute_indices: vec![],
                    })
                })
                .collect();
            b.stack(&locs)
        })
        .collect();
    for i in 0..samples {
        let p = profiles[(next() as usize) % procs];
        let st = stack_ids[(next() as usize) % stacks];
        let tid = b.attribute("thread.id", AttrValue::Int((next() % 8) as i64));
        let tname = b.attribute("thread.name", AttrValue::Str(["main", "worker", "io"][(next() % 3) as usize]));
        b.sample(
            p,
            pb::Sample {
                stack_index: st,
                attribute_indices: vec![tid, tname],
                link_index: 0,
                values: vec![1],
                timestamps_unix_nano: vec![1_700_000_000_000_000_000 + seed * 1_000_000 + i as u64],
            },
        );
    }
    b.build()
}

/// Writes `n` batches as `.pb` files into `dir`; returns them.
pub fn write_corpus(dir: &Path, n: usize, samples: usize) -> Vec<Profiles> {
    std::fs::create_dir_all(dir).unwrap();
    (0..n)
        .map(|i| {
            let p = batch(i as u64 + 1, 3, samples, 40, 8);
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

    /// Waits until a log line contains `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, || self.log_count(needle) > 0)
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

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub fn write(path: &Path, text: &str) -> PathBuf {
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}
