//! The whole receiver's CPU while a loop execs the 50 MB benchmark binary
//! 100 times a second (each run lives LIFE_MS, 100 ms by default, longer
//! than the receiver's exec-event period, so every exec is looked at),
//! with uprobes configured (a probe on a symbol the binary lacks: the
//! negative cache answers every exec after the first) against the same
//! receiver with uprobes off. Three settings, interleaved round by round
//! (the host's load moves): uprobes off; a probe on the binary by name
//! (`binary: big`); a probe with no `binary:` (every executable and
//! library). Reports each setting's median, min and max, and the load
//! average. Needs root (BPF), gcc, strip.
//!
//!     cargo bench -p profcol-receivers --bench uprobe_cpu
//!     ROUNDS=7 SECONDS=20 cargo bench -p profcol-receivers --bench uprobe_cpu
//!     ONLY=named cargo bench -p profcol-receivers --bench uprobe_cpu   # off, named
//!     ONLY=any cargo bench -p profcol-receivers --bench uprobe_cpu     # off, any
//!     WARMUP_MS=10000 cargo bench ...   # each receiver runs 10 s before its window
//!
//! The receiver runs in this process; the exec loop is another process, so
//! this process's CPU time (getrusage, user + system) is the receiver's.

#[path = "common/uprobe_fixture.rs"]
mod uprobe_fixture;

use profcol_api::component::{ComponentId, ConsumeError, Consumer, Kind, Next, Receiver};
use profcol_api::telemetry::Telemetry;
use profcol_api::{CreateSettings, Profiles};
use profcol_receivers::ebpf::config::UprobeSpec;
use profcol_receivers::ebpf::{EbpfConfig, EbpfReceiver};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

struct Discard;

#[async_trait::async_trait]
impl Consumer for Discard {
    async fn consume(&self, _batch: Profiles) -> Result<(), ConsumeError> {
        Ok(())
    }
}

/// CPU time (user + system) of this process (`RUSAGE_SELF`) or of its
/// waited-for children (`RUSAGE_CHILDREN`: the exec loop and what it ran).
fn cpu_seconds(who: libc::c_int) -> f64 {
    // SAFETY: ru is a valid out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: ru is a valid rusage the call fills.
    unsafe { libc::getrusage(who, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The receiver settings compared: name, and the probe's `binary:` (outer
/// `None`: uprobes off).
const SETTINGS: [(&str, Option<Option<&str>>); 3] = [("off", None), ("named", Some(Some("big"))), ("any", Some(None))];

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list`
    }
    let (rounds, seconds, rate, life_ms) =
        (env("ROUNDS", 5), env("SECONDS", 10), env("RATE", 100), env("LIFE_MS", 100));
    // How long each receiver runs before its window: longer lets it learn
    // the host's own binaries first (a receiver that has been running).
    let warmup = Duration::from_millis(env("WARMUP_MS", 500));
    let only = std::env::var("ONLY").ok();
    let settings: Vec<_> =
        SETTINGS.iter().filter(|(n, _)| *n == "off" || only.as_deref().is_none_or(|o| o == *n)).collect();
    let dir = tempfile::tempdir().unwrap();
    let (big, _) = uprobe_fixture::build(dir.path());
    let execloop = dir.path().join("execloop");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/workloads/execloop.c");
    assert!(Command::new("cc").args(["-O2", "-o"]).arg(&execloop).arg(src).status().unwrap().success());

    let load_before = load_average();
    let mut cpu = vec![Vec::new(); settings.len()];
    // The exec loop's own CPU: the kernel writes its mapping records in the
    // exec'ing process's time.
    let mut loop_cpu = vec![Vec::new(); settings.len()];
    for round in 0..rounds {
        for (i, (name, probe)) in settings.iter().enumerate() {
            let config = EbpfConfig {
                report_interval: Duration::from_secs(1),
                uprobes: match probe {
                    None => Vec::new(),
                    Some(binary) => vec![UprobeSpec {
                        symbol: "profcol_not_in_this_binary".into(),
                        binary: binary.map(str::to_owned),
                    }],
                },
                ..EbpfConfig::default()
            };
            let registry = Telemetry::new();
            let id: ComponentId = "ebpf".parse().unwrap();
            let telemetry = registry.component(Kind::Receiver, &id);
            let receiver = EbpfReceiver::new(
                CreateSettings { id, telemetry: telemetry.clone(), services: Default::default() },
                config,
            );
            let next = Next::new(vec![Arc::new(Discard) as Arc<dyn Consumer>], telemetry);
            receiver.start(next).await.expect("ebpf receiver starts (root needed)");
            tokio::time::sleep(warmup).await;
            let (before, loop_before) = (cpu_seconds(libc::RUSAGE_SELF), cpu_seconds(libc::RUSAGE_CHILDREN));
            let out = Command::new(&execloop)
                .arg(&big)
                .arg(rate.to_string())
                .arg(seconds.to_string())
                .arg(life_ms.to_string())
                .output()
                .expect("run execloop");
            let used = cpu_seconds(libc::RUSAGE_SELF) - before;
            let loop_used = cpu_seconds(libc::RUSAGE_CHILDREN) - loop_before;
            receiver.shutdown().await.unwrap();
            let execs = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            let metrics = registry.render();
            let get = |name: &str| {
                metrics
                    .lines()
                    .find(|l| l.starts_with(&format!("profcol_receiver_{name}{{")))
                    .and_then(|l| l.rsplit(' ').next())
                    .unwrap_or("-")
                    .to_owned()
            };
            println!(
                "round {round} {name:<5} cpu {:>7.1} ms ({:.2}% of one CPU)  exec loop {:.0} ms  {execs}  parsed={} negative_hits={} exec_events={}  load {}",
                used * 1e3,
                used / seconds as f64 * 100.0,
                loop_used * 1e3,
                get("ebpf_uprobe_binaries_parsed_total"),
                get("ebpf_uprobe_negative_hits_total"),
                get("ebpf_process_execs_total"),
                load_average(),
            );
            cpu[i].push(used);
            loop_cpu[i].push(loop_used);
        }
    }
    println!("receiver CPU over {seconds} s at {rate} execs/s, {rounds} interleaved rounds; load average {load_before} before, {} after", load_average());
    let off = median(&mut cpu[0]);
    for (i, (name, _)) in settings.iter().enumerate() {
        let m = median(&mut cpu[i]);
        let (lo, hi) = (cpu[i][0], cpu[i][cpu[i].len() - 1]);
        println!(
            "  {name:<5} median {:>6.1} ms (min {:.1}, max {:.1})  ratio to off {:.2}x  extra per exec {:.1} us  (exec loop median {:.0} ms)",
            m * 1e3,
            lo * 1e3,
            hi * 1e3,
            m / off,
            (m - off) / (rate * seconds) as f64 * 1e6,
            median(&mut loop_cpu[i]) * 1e3,
        );
    }
}
