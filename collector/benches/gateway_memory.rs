//! A gateway's peak memory under a flood, with and without the otlp
//! receiver's `max_concurrent_requests`.
//!
//! Each run starts a fresh `profcol` process (the real binary) whose pipeline
//! cannot drain: otlp receiver (gRPC, `max_recv_msg_size_mib: 32`,
//! `backpressure_timeout: 5s`) → no processors → `otlp` exporter pointed at a
//! closed loopback port, with a one-batch blocking sending queue, one consumer
//! and retry forever. 64 clients (`OtlpGrpcExporter`, compression none, one
//! connection each) then send one ~8 MiB request each, all at once; when every
//! call has returned (OK or an error) the gateway's peak RSS (VmHWM) is read
//! and the process killed. Cases: `max_concurrent_requests: 16` (the default)
//! and 64, the number of senders (the limit effectively off: the baseline).
//! Every case runs `GATEWAY_MEMORY_REPEATS` times (default 3), alternating.
//!
//! cargo bench -p profcol --bench gateway_memory    # RATIO line at the end
//!
//! `PROFCOL_BIN=path` runs that profcol binary instead of this build's (an
//! older build, side by side).

use profcol_api::component::Kind;
use profcol_api::model::ExportProfilesServiceRequest;
use profcol_api::{ExportError, Profiles};
use profcol_exporters::otlp::{Compression, OtlpGrpcConfig, OtlpGrpcExporter, Shape};
use profcol_testkit::config::{one_pipeline, OTLP_GRPC_RECEIVER};
use profcol_testkit::prelude::{closed_port, cpu_batch, settings};
use prost::bytes::Bytes;
use prost::Message;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Concurrent senders, one request each.
const SENDERS: usize = 64;
/// `max_concurrent_requests` of the cases: the default, and the baseline
/// where every sender gets a slot.
const LIMITS: [usize; 2] = [16, SENDERS];
/// The flood's request: processes × samples per process of `cpu_batch`.
const PROCESSES: usize = 64;
const SAMPLES_PER_PROCESS: usize = 3072;

#[global_allocator]
static A: profcol_testkit::alloc::Counting = profcol_testkit::alloc::Counting;

fn mib(bytes: f64) -> f64 {
    bytes / 1048576.0
}

/// A `kB` field of /proc/<pid>/status, in bytes.
fn proc_status_kb(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/<pid>/status");
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        * 1024
}

/// A running gateway; killed (SIGKILL) and reaped when dropped.
struct Gateway {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Gateway {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts `profcol` with the flood config and waits until its receiver
    /// accepts connections.
    fn start(dir: &Path, limit: usize) -> Gateway {
        let closed = closed_port();
        let service = one_pipeline("otlp", "", "otlp");
        let text = format!(
            "{OTLP_GRPC_RECEIVER}        max_recv_msg_size_mib: 32
    backpressure_timeout: 5s
    max_concurrent_requests: {limit}
exporters:
  otlp:
    endpoint: http://127.0.0.1:{closed}
    compression: none
    sending_queue:
      queue_size: 1
      num_consumers: 1
      block_on_overflow: true
    retry_on_failure:
      enabled: true
      max_elapsed_time: 0s
{service}"
        );
        let config = dir.join(format!("gateway-{limit}.yaml"));
        std::fs::write(&config, text).unwrap();
        let log = dir.join(format!("gateway-{limit}.log"));
        let bin = std::env::var_os("PROFCOL_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_profcol").into());
        let child = Command::new(bin)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start the profcol binary");
        // The receiver binds port 0 and logs the port it got.
        let mut g = Gateway { child, port: 0, log };
        let t = Instant::now();
        while g.port == 0 {
            let text = g.log_text();
            let line = text.lines().find(|l| l.contains("otlp receiver listening"));
            if let Some(a) = line.and_then(|l| profcol_testkit::net::addr_in_log(l, "grpc")) {
                g.port = a.port();
                break;
            }
            if let Some(st) = g.child.try_wait().unwrap() {
                panic!("the gateway exited ({st}) before listening:\n{}", g.log_text());
            }
            assert!(t.elapsed() < Duration::from_secs(20), "the gateway does not listen:\n{}", g.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
        g
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// How the calls of one flood ended.
#[derive(Default, Debug, Clone)]
struct Outcome {
    /// OK: the pipeline took the batch.
    ok: usize,
    /// UNAVAILABLE after a slot was taken (body read and decoded): the
    /// pipeline did not take the batch within `backpressure_timeout`.
    pipeline_timeout: usize,
    /// UNAVAILABLE without a slot (body never read by the receiver).
    no_slot: usize,
    /// Anything else (first message kept).
    other: usize,
    other_example: Option<String>,
    /// When the last call returned.
    all_returned_after: Duration,
}

impl Outcome {
    /// Requests that got a slot: their body was read and decoded.
    fn admitted(&self) -> usize {
        self.ok + self.pipeline_timeout
    }
}

struct Run {
    idle_rss: u64,
    idle_hwm: u64,
    peak: u64,
    outcome: Outcome,
}

async fn flood(port: u16, body: &Bytes) -> Outcome {
    let clients: Vec<Arc<OtlpGrpcExporter>> = (0..SENDERS)
        .map(|k| {
            let cfg = OtlpGrpcConfig {
                endpoint: Some(format!("http://127.0.0.1:{port}")),
                compression: Compression::None,
                ..Default::default()
            };
            Arc::new(OtlpGrpcExporter::new(settings(Kind::Exporter, &format!("otlp/sender{k}")), cfg).unwrap())
        })
        .collect();
    let t = Instant::now();
    let tasks: Vec<_> = clients
        .iter()
        .map(|c| {
            let (c, body) = (Arc::clone(c), body.clone());
            tokio::spawn(async move { c.export_encoded(body, Shape::default()).await })
        })
        .collect();
    let mut out = Outcome::default();
    for task in tasks {
        let r = tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("an export call did not return within 60 s")
            .unwrap();
        match r {
            Ok(()) => out.ok += 1,
            Err(ExportError::Retryable { message, .. }) if message.contains("max_concurrent_requests") => {
                out.no_slot += 1
            }
            Err(ExportError::Retryable { message, .. }) if message.contains("did not take the batch") => {
                out.pipeline_timeout += 1
            }
            Err(e) => {
                out.other += 1;
                out.other_example.get_or_insert_with(|| e.to_string());
            }
        }
    }
    out.all_returned_after = t.elapsed();
    out
}

fn run_once(rt: &tokio::runtime::Runtime, dir: &Path, limit: usize, body: &Bytes) -> Run {
    let mut g = Gateway::start(dir, limit);
    // Let start-up settle (the exporter's first connection attempt fails).
    std::thread::sleep(Duration::from_millis(500));
    let idle_rss = proc_status_kb(g.pid(), "VmRSS");
    let idle_hwm = proc_status_kb(g.pid(), "VmHWM");
    let outcome = rt.block_on(flood(g.port, body));
    if let Some(st) = g.child.try_wait().unwrap() {
        panic!("the gateway exited ({st}) during the flood:\n{}", g.log_text());
    }
    let peak = proc_status_kb(g.pid(), "VmHWM");
    drop(g);
    Run { idle_rss, idle_hwm, peak, outcome }
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

fn main() {
    let t0 = Instant::now();
    let repeats: usize = std::env::var("GATEWAY_MEMORY_REPEATS").ok().and_then(|s| s.parse().ok()).unwrap_or(3).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();

    let batch = cpu_batch(1, PROCESSES, SAMPLES_PER_PROCESS);
    let samples = batch.sample_count();
    let body = Bytes::from(batch.encode_to_vec());
    drop(batch);
    // The receiver's decode (samples packed), prost's (what the receiver
    // did before `model/decode.rs`) and the unpacked one, with this
    // process's live heap counted around each.
    let heap = |decode: &dyn Fn() -> Profiles| {
        let before = profcol_testkit::alloc::live();
        let decoded = decode();
        let bytes = (profcol_testkit::alloc::live() - before).max(0) as f64;
        drop(decoded);
        bytes
    };
    let decoded_bytes = heap(&|| Profiles::decode_packed(&body).unwrap());
    let prost_bytes = heap(&|| Profiles::from_request(ExportProfilesServiceRequest::decode(&body[..]).unwrap()));
    let unpacked_bytes = heap(&|| Profiles::decode(&body).unwrap());
    println!(
        "batch: {PROCESSES} processes × {SAMPLES_PER_PROCESS} samples = {samples} samples; \
         {} bytes encoded ({:.2} MiB); decoded form {:.1} MiB of heap ({:.2}× the wire size; unpacked {:.2}×, \
         prost's decode {:.2}×)",
        body.len(),
        mib(body.len() as f64),
        mib(decoded_bytes),
        decoded_bytes / body.len() as f64,
        unpacked_bytes / body.len() as f64,
        prost_bytes / body.len() as f64
    );
    println!(
        "flood: {SENDERS} concurrent senders × 1 request = {:.0} MiB on the wire; pipeline stalled \
         (exporter → closed port, queue_size 1, block_on_overflow, retry forever)",
        mib((SENDERS * body.len()) as f64)
    );

    let dir = tempfile::tempdir().unwrap();
    {
        let g = Gateway::start(dir.path(), LIMITS[0]);
        std::thread::sleep(Duration::from_millis(500));
        println!(
            "idle: freshly started gateway VmRSS = {:.1} MiB (VmHWM {:.1} MiB)",
            mib(proc_status_kb(g.pid(), "VmRSS") as f64),
            mib(proc_status_kb(g.pid(), "VmHWM") as f64)
        );
    }

    let mut runs: Vec<(usize, Run)> = Vec::new();
    for r in 0..repeats {
        for limit in LIMITS {
            let run = run_once(&rt, dir.path(), limit, &body);
            let o = &run.outcome;
            println!(
                "run {} limit{limit}: idle RSS {:.1} MiB (HWM {:.1}), peak RSS (VmHWM) {:.1} MiB; \
                 admitted {} (ok {}, pipeline timeout {}), refused without a slot {}, other {}; \
                 all {SENDERS} calls returned after {:.1} s",
                r + 1,
                mib(run.idle_rss as f64),
                mib(run.idle_hwm as f64),
                mib(run.peak as f64),
                o.admitted(),
                o.ok,
                o.pipeline_timeout,
                o.no_slot,
                o.other,
                o.all_returned_after.as_secs_f64()
            );
            if let Some(m) = &o.other_example {
                println!("  other error, e.g.: {m}");
            }
            runs.push((limit, run));
        }
    }

    let mut medians = Vec::new();
    for limit in LIMITS {
        let mine: Vec<&Run> = runs.iter().filter(|(l, _)| *l == limit).map(|(_, r)| r).collect();
        let peaks: Vec<u64> = mine.iter().map(|r| r.peak).collect();
        let admitted: Vec<u64> = mine.iter().map(|r| r.outcome.admitted() as u64).collect();
        let idle = median(mine.iter().map(|r| r.idle_rss).collect());
        let (lo, hi) = (*peaks.iter().min().unwrap(), *peaks.iter().max().unwrap());
        let peak = median(peaks);
        let adm = median(admitted.clone());
        println!(
            "CASE limit{limit} (max_concurrent_requests {limit}, {SENDERS} senders): peak RSS median {:.1} MiB \
             over {repeats} fresh gateways (min {:.1}, max {:.1}); admitted per run {admitted:?}; \
             idle RSS median {:.1} MiB",
            mib(peak as f64),
            mib(lo as f64),
            mib(hi as f64),
            mib(idle as f64),
        );
        medians.push((limit, peak, adm, idle));
    }
    let (l16, p16, a16, i16) = medians[0];
    let (l64, p64, a64, i64_) = medians[1];
    println!(
        "RATIO peak RSS limit{l16} = {:.1} MiB vs limit{l64} = {:.1} MiB: {:.3}",
        mib(p16 as f64),
        mib(p64 as f64),
        p16 as f64 / p64 as f64
    );
    if a64 > a16 {
        let per = (p64 as f64 - p16 as f64) / (a64 - a16) as f64;
        println!(
            "PER_REQUEST marginal peak RSS per admitted request (limit{l64} - limit{l16}) / ({a64} - {a16}) = \
             {:.1} MiB; wire {:.1} MiB + decoded {:.1} MiB = {:.1} MiB",
            mib(per),
            mib(body.len() as f64),
            mib(decoded_bytes),
            mib(body.len() as f64 + decoded_bytes)
        );
        println!(
            "ABOVE_IDLE limit{l16}: {:.1} MiB = {:.1} MiB per admitted request; limit{l64}: {:.1} MiB = {:.1} MiB \
             per admitted request",
            mib(p16 as f64 - i16 as f64),
            mib((p16 as f64 - i16 as f64) / a16.max(1) as f64),
            mib(p64 as f64 - i64_ as f64),
            mib((p64 as f64 - i64_ as f64) / a64.max(1) as f64)
        );
    }
    println!("total time {:.0} s", t0.elapsed().as_secs_f64());
}
