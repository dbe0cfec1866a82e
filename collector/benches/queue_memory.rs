//! Peak memory of an exporter whose backend is down while a burst four
//! times its queue's byte bound arrives: `sending_queue.sizer: bytes` against
//! the baseline `sizer: requests` (the default 1000 batches).
//!
//! Each case runs in a fresh child process (this binary, re-run with
//! `QUEUE_MEMORY_CHILD` set): an `otlp` exporter pointed at a closed
//! loopback port, retrying forever, behind the host's sending queue
//! (`ExporterHandle`, 10 consumers, `block_on_overflow: false`). After a
//! warm-up, peak RSS is reset (`/proc/self/clear_refs` 5), then batches of
//! about 1.8 MiB (each a fresh deep copy, as a receiver decodes a new one) are
//! enqueued until 4 × `BOUND` bytes (by `Profiles::memory_size`) have been
//! offered; the peak RSS (VmHWM) growth is what the burst cost.
//!
//! cargo bench -p profcol --bench queue_memory    # table and CHECK line at the end

use profcol::exporter_helper::settings::{ExporterHelperConfig, Sizer};
use profcol::exporter_helper::ExporterHandle;
use profcol_api::component::{ComponentId, CreateSettings, Kind};
use profcol_api::model::{pb, AttrValue, KeyValue, ProfileMeta, Resource};
use profcol_api::telemetry::Telemetry;
use profcol_api::{Profiles, ProfilesBuilder};
use profcol_exporters::otlp::{OtlpGrpcConfig, OtlpGrpcExporter};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// Counts the bytes asked of the allocator (to compare the estimate with).
#[global_allocator]
static ALLOC: profcol_testkit::alloc::Counting = profcol_testkit::alloc::Counting;

/// The byte bound of the bytes case.
const BOUND: u64 = 64 << 20;
/// What the burst may cost beyond `BOUND` (stated in docs/PERFORMANCE.md):
/// the batch being copied, the allocator's free lists and the runtime.
const OVERHEAD: u64 = 8 << 20;

/// About 1.8 MiB in memory: 8 processes × 800 samples over 256 stacks of depth 16.
fn template() -> Profiles {
    let mut b = ProfilesBuilder::new();
    let mut profiles = Vec::new();
    for p in 0..8i64 {
        let attributes = vec![KeyValue {
            key: "process.pid".into(),
            value: Some(AttrValue::Int(1000 + p).to_any()),
            ..Default::default()
        }];
        let r = b.resource(Resource { attributes, ..Default::default() });
        let meta = ProfileMeta::cpu(10_000_000, 1_700_000_000_000_000_000, 5_000_000_000);
        profiles.push(b.profile(r, &meta));
    }
    let stacks: Vec<i32> = (0..256usize)
        .map(|s| {
            let locs: Vec<i32> = (0..16usize)
                .map(|d| {
                    let f = b.function(&format!("fn_{s}_{d}"), "", "app.c", d as i64);
                    let lines = vec![pb::Line { function_index: f, line: d as i64 + 1, column: 0 }];
                    let address = 0x40_0000 + (s * 16 + d) as u64 * 16;
                    b.location(pb::Location { mapping_index: 0, address, lines, attribute_indices: vec![] })
                })
                .collect();
            b.stack(&locs)
        })
        .collect();
    for i in 0..6400usize {
        let tid = b.attribute("thread.id", AttrValue::Int((i % 8) as i64));
        b.sample(
            profiles[i % 8],
            pb::Sample {
                stack_index: stacks[(i * 7) % stacks.len()],
                attribute_indices: vec![tid],
                link_index: 0,
                values: vec![1],
                timestamps_unix_nano: vec![1_700_000_000_000_000_000 + i as u64],
            },
        );
    }
    b.build()
}

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// One case, in this process: prints `RESULT sizer queue_size offered held peak_growth` (bytes).
fn child(sizer: Sizer, queue_size: u64) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let id: ComponentId = "otlp/down".parse().unwrap();
        let telemetry = Telemetry::new().component(Kind::Exporter, &id);
        let cfg = OtlpGrpcConfig { endpoint: Some(format!("http://127.0.0.1:{closed}")), ..Default::default() };
        let settings = CreateSettings { id: id.clone(), telemetry: telemetry.clone(), services: Default::default() };
        let exporter = Arc::new(OtlpGrpcExporter::new(settings, cfg).unwrap());
        let mut helper = ExporterHelperConfig::default();
        helper.retry_on_failure.max_elapsed_time = Duration::ZERO; // retry for ever: the backend is down
        helper.sending_queue.sizer = sizer;
        helper.sending_queue.queue_size = queue_size;
        let handle = ExporterHandle::start(id, exporter, helper, telemetry.clone()).await.unwrap();
        let template = template();
        let before = profcol_testkit::alloc::live();
        let copy = template.clone();
        let asked = (profcol_testkit::alloc::live() - before) as u64;
        // What the queue weighs: a copy (vectors at their length), not the
        // builder's output (vectors with the room they grew into).
        let size = copy.memory_size() as u64;
        drop(copy);
        // Warm-up: the runtime, the connection attempts, one batch through the queue.
        handle.enqueue(Arc::new(template.clone())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::write("/proc/self/clear_refs", "5").unwrap();
        let base = status_kib("VmRSS:") * 1024;
        let mut offered = 0u64;
        while offered < 4 * BOUND {
            handle.enqueue(Arc::new(template.clone())).await.unwrap();
            offered += size;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let peak = status_kib("VmHWM:") * 1024;
        let held = telemetry.queue_size.get();
        let held_bytes = if sizer == Sizer::Bytes { held as u64 } else { held as u64 * size };
        println!(
            "RESULT {} {queue_size} {offered} {held_bytes} {} {size} {asked}",
            sizer.as_str(),
            peak.saturating_sub(base)
        );
    });
    std::process::exit(0);
}

fn run(sizer: &str, queue_size: u64) -> (u64, u64, u64, u64, u64) {
    let out = Command::new(std::env::current_exe().unwrap())
        .env("QUEUE_MEMORY_CHILD", format!("{sizer} {queue_size}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("RESULT ")).unwrap_or_else(|| {
        panic!("the {sizer} case printed no result: {text}\n{}", String::from_utf8_lossy(&out.stderr))
    });
    let f: Vec<u64> = line.split_whitespace().skip(3).map(|x| x.parse().unwrap()).collect();
    (f[0], f[1], f[2], f[3], f[4])
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn main() {
    if let Ok(spec) = std::env::var("QUEUE_MEMORY_CHILD") {
        let (sizer, size) = spec.split_once(' ').unwrap();
        let sizer = match sizer {
            "bytes" => Sizer::Bytes,
            "items" => Sizer::Items,
            _ => Sizer::Requests,
        };
        return child(sizer, size.parse().unwrap());
    }
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench` asks for a list of tests; there are none
    }
    let repeats: usize = std::env::var("QUEUE_MEMORY_REPEATS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    println!("burst: 4 × {:.0} MiB offered to an exporter whose backend is down (~1.8 MiB batches)", mib(BOUND));
    println!("{:<28} {:>10} {:>12} {:>14}", "case", "offered", "queue holds", "peak RSS growth");
    let mut worst_bytes = 0u64;
    let (mut batch, mut asked) = (0, 0);
    for r in 0..repeats {
        for (name, sizer, size) in [("requests, 1000 (baseline)", "requests", 1000), ("bytes, 64 MiB", "bytes", BOUND)]
        {
            let (offered, held, growth, one, heap) = run(sizer, size);
            (batch, asked) = (one, heap);
            println!(
                "{:<28} {:>6.0} MiB {:>8.1} MiB {:>10.1} MiB   (run {})",
                name,
                mib(offered),
                mib(held),
                mib(growth),
                r + 1
            );
            if sizer == "bytes" {
                worst_bytes = worst_bytes.max(growth);
            }
        }
    }
    println!(
        "one batch: {:.2} MiB by Profiles::memory_size; {:.2} MiB asked of the allocator by a deep copy",
        mib(batch),
        mib(asked)
    );
    let ok = worst_bytes <= BOUND + OVERHEAD;
    println!(
        "CHECK sizer bytes: worst peak RSS growth {:.1} MiB {} bound {:.0} MiB + overhead {:.0} MiB: {}",
        mib(worst_bytes),
        if ok { "<=" } else { ">" },
        mib(BOUND),
        mib(OVERHEAD),
        if ok { "ok" } else { "FAILED" }
    );
    if !ok {
        std::process::exit(1);
    }
}
