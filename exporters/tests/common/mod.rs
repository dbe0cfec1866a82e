//! Shared helpers of the exporter integration tests: realistic batches, a
//! collecting consumer, free loopback ports, and external tools that must be
//! there when CI=true.
#![allow(dead_code)]

use profcol_api::component::{ComponentId, ConsumeError, Consumer, CreateSettings, Kind, Next};
use profcol_api::model::{keys, pb, AnyValue, AttrValue, KeyValue, ProfileMeta, Resource};
use profcol_api::telemetry::ComponentTelemetry;
use profcol_api::{Profiles, ProfilesBuilder};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub fn settings(kind: Kind, id: &str) -> CreateSettings {
    let id: ComponentId = id.parse().unwrap();
    CreateSettings { telemetry: ComponentTelemetry::detached(kind, &id), id }
}

fn kv(k: &str, v: AnyValue) -> KeyValue {
    KeyValue { key: k.into(), value: Some(v), ..Default::default() }
}

pub fn s(v: &str) -> AnyValue {
    AttrValue::Str(v).to_any()
}

pub fn i(v: i64) -> AnyValue {
    AttrValue::Int(v).to_any()
}

/// A CPU-profile batch the way the eBPF receiver makes one: per process a
/// resource (pid, executable, optionally container), samples/count with
/// period cpu/nanoseconds, user frames in the executable's mapping, kernel
/// frames in `[kernel.kallsyms]` marked `profile.frame.type=kernel`, thread
/// attributes, timestamps. `seed` varies the counts and functions.
pub fn cpu_batch(seed: u64, processes: usize, samples_per_process: usize) -> Profiles {
    let mut b = ProfilesBuilder::new();
    let kernel_fn = ["do_syscall_64", "entry_SYSCALL_64", "vfs_read", "ksys_read", "schedule"];
    let user_fn = ["main", "run", "compute", "hash_block", "parse_line", "write_out", "sort_items"];
    let t0 = 1_700_000_000_000_000_000u64 + seed * 10_000_000_000;
    let kmap_name = b.string(keys::KERNEL_MAPPING);
    let kattr = b.attribute(keys::FRAME_TYPE, AttrValue::Str("kernel"));
    let uattr = b.attribute(keys::FRAME_TYPE, AttrValue::Str("native"));
    let kmap = b.mapping(pb::Mapping {
        memory_start: 0xffff_ffff_8100_0000,
        memory_limit: 0xffff_ffff_8300_0000,
        file_offset: 0,
        filename_strindex: kmap_name,
        attribute_indices: vec![],
    });
    for p in 0..processes {
        let pid = 1000 + p as i64;
        let exe = format!("/usr/bin/app{p}");
        let mut attrs = vec![
            kv(keys::PROCESS_PID, i(pid)),
            kv(keys::PROCESS_EXECUTABLE_NAME, s(&format!("app{p}"))),
            kv(keys::PROCESS_EXECUTABLE_PATH, s(&exe)),
            kv(keys::HOST_NAME, s("node-1")),
            kv("service.name", s("demo")),
        ];
        if !p.is_multiple_of(2) {
            attrs.push(kv(keys::CONTAINER_ID, s(&format!("c0ffee{p:02}"))));
        }
        let r = b.resource(Resource { attributes: attrs, ..Default::default() });
        let prof = b.profile(
            r,
            &ProfileMeta {
                sample_type: ("samples", "count"),
                period_type: ("cpu", "nanoseconds"),
                period: 10_000_000,
                time_unix_nano: t0,
                duration_nano: 10_000_000_000,
            },
        );
        let fname = b.string(&exe);
        let bid = b.attribute(keys::BUILD_ID_GNU, AttrValue::Str("0123456789abcdef"));
        let umap = b.mapping(pb::Mapping {
            memory_start: 0x40_0000,
            memory_limit: 0x80_0000,
            file_offset: 0,
            filename_strindex: fname,
            attribute_indices: vec![bid],
        });
        for k in 0..samples_per_process {
            let x = seed.wrapping_mul(31).wrapping_add((p * 131 + k * 17) as u64);
            let depth = 2 + (x % 4) as usize;
            let mut locs = Vec::new();
            // Leaf first: kernel frames (some samples), then user frames up to main.
            if x.is_multiple_of(3) {
                for d in 0..2 {
                    let name = kernel_fn[(x as usize + d) % kernel_fn.len()];
                    let f = b.function(name, name, "", 0);
                    locs.push(b.location(pb::Location {
                        mapping_index: kmap,
                        address: 0xffff_ffff_8100_1000 + 0x40 * ((x as usize + d) % kernel_fn.len()) as u64,
                        lines: vec![pb::Line { function_index: f, line: 0, column: 0 }],
                        attribute_indices: vec![kattr],
                    }));
                }
            }
            for d in (0..depth).rev() {
                let name = if d == 0 { "main" } else { user_fn[1 + (x as usize + d) % (user_fn.len() - 1)] };
                let f = b.function(name, name, "src/app.c", 10 * d as i64);
                locs.push(b.location(pb::Location {
                    mapping_index: umap,
                    address: 0x40_1000 + 0x100 * d as u64 + (x % 7) * 4,
                    lines: vec![pb::Line { function_index: f, line: 10 * d as i64 + 3, column: 0 }],
                    attribute_indices: vec![uattr],
                }));
            }
            let stack = b.stack(&locs);
            let tid = b.attribute(keys::THREAD_ID, AttrValue::Int(pid + (k % 3) as i64));
            let tname =
                b.attribute(keys::THREAD_NAME, AttrValue::Str(if k.is_multiple_of(3) { "main" } else { "worker" }));
            let n = 1 + (x % 5) as usize;
            b.sample(
                prof,
                pb::Sample {
                    stack_index: stack,
                    attribute_indices: vec![tid, tname],
                    link_index: 0,
                    values: vec![1; n],
                    timestamps_unix_nano: (0..n).map(|j| t0 + (k * 10 + j) as u64 * 1_000_000).collect(),
                },
            );
        }
    }
    b.build()
}

/// Collects every batch it is given.
#[derive(Default)]
pub struct Collector {
    pub batches: Mutex<Vec<Profiles>>,
    /// While set, consume() waits (simulates a full pipeline).
    pub stall: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Consumer for Collector {
    async fn consume(&self, batch: Profiles) -> Result<(), ConsumeError> {
        while self.stall.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.batches.lock().unwrap().push(batch);
        Ok(())
    }
}

impl Collector {
    pub fn next(self: &Arc<Self>) -> Next {
        let id: ComponentId = "otlp/test".parse().unwrap();
        Next::new(vec![self.clone() as Arc<dyn Consumer>], ComponentTelemetry::detached(Kind::Receiver, &id))
    }

    pub fn sample_count(&self) -> usize {
        self.batches.lock().unwrap().iter().map(|b| b.sample_count()).sum()
    }

    /// Waits until `n` samples arrived (or panics after `timeout`).
    pub async fn wait_for(&self, n: usize, timeout: Duration) {
        let t = std::time::Instant::now();
        while self.sample_count() < n {
            assert!(t.elapsed() < timeout, "only {} of {n} samples arrived within {timeout:?}", self.sample_count());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every collected batch merged into one.
    pub fn merged(&self) -> Profiles {
        let mut b = ProfilesBuilder::new();
        for p in self.batches.lock().unwrap().iter() {
            b.append(p.clone());
        }
        b.build()
    }
}

pub fn merge(batches: &[Profiles]) -> Profiles {
    let mut b = ProfilesBuilder::new();
    for p in batches {
        b.append(p.clone());
    }
    b.build()
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Whether an external tool runs; under CI=true a missing tool fails the test.
pub fn tool_available(cmd: &str, args: &[&str]) -> bool {
    let ok = std::process::Command::new(cmd)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("`{cmd}` is required under CI=true; run .ci/exporters.sh to install it");
        }
        eprintln!("SKIPPED: `{cmd}` is not installed (run .ci/exporters.sh); CI=true turns this into a failure");
    }
    ok
}
