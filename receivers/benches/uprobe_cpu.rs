//! The whole receiver's CPU while a loop execs the 50 MB benchmark binary
//! 100 times a second (each run lives LIFE_MS, 100 ms by default, longer
//! than the receiver's exec-event period, so every exec is looked at), with uprobes configured (a probe on
//! a symbol the binary lacks: the negative cache answers every exec after
//! the first) against the same receiver with uprobes off.
//! Interleaved rounds; medians. Needs root (BPF), gcc, strip.
//!
//!     cargo bench -p profcol-receivers --bench uprobe_cpu
//!     ROUNDS=5 SECONDS=20 cargo bench -p profcol-receivers --bench uprobe_cpu
//!     BINARY=any cargo bench -p profcol-receivers --bench uprobe_cpu   # probe every binary
//!
//! The receiver runs in this process; the exec loop is another process, so
//! this process's CPU time (getrusage, user + system) is the receiver's.

#[path = "uprobe_fixture.rs"]
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

fn cpu_seconds() -> f64 {
    // SAFETY: ru is a valid out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list`
    }
    let (rounds, seconds, rate, life_ms) =
        (env("ROUNDS", 3), env("SECONDS", 10), env("RATE", 100), env("LIFE_MS", 100));
    // BINARY=any: the probe selects every executable and library (so every
    // exec on the host, not only the loop's, is looked at); default: the
    // benchmark binary by name, as one probes `kubectl`.
    let any_binary = std::env::var("BINARY").is_ok_and(|v| v == "any");
    let dir = tempfile::tempdir().unwrap();
    let (big, _) = uprobe_fixture::build(dir.path());
    let execloop = dir.path().join("execloop");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/workloads/execloop.c");
    assert!(Command::new("cc").args(["-O2", "-o"]).arg(&execloop).arg(src).status().unwrap().success());

    let mut cpu = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (mode, uprobes) in [(0, false), (1, true)] {
            if std::env::var("ONLY").is_ok_and(|o| o != if uprobes { "on" } else { "off" }) {
                continue;
            }
            let config = EbpfConfig {
                report_interval: Duration::from_secs(1),
                uprobes: if uprobes {
                    let binary = (!any_binary).then(|| "big".to_owned());
                    vec![UprobeSpec { symbol: "profcol_not_in_this_binary".into(), binary }]
                } else {
                    Vec::new()
                },
                ..EbpfConfig::default()
            };
            let registry = Telemetry::new();
            let id: ComponentId = "ebpf".parse().unwrap();
            let telemetry = registry.component(Kind::Receiver, &id);
            let receiver = EbpfReceiver::new(CreateSettings { id, telemetry: telemetry.clone() }, config);
            let next = Next::new(vec![Arc::new(Discard) as Arc<dyn Consumer>], telemetry);
            receiver.start(next).await.expect("ebpf receiver starts (root needed)");
            tokio::time::sleep(Duration::from_millis(500)).await;
            let before = cpu_seconds();
            let out = Command::new(&execloop)
                .arg(&big)
                .arg(rate.to_string())
                .arg(seconds.to_string())
                .arg(life_ms.to_string())
                .output()
                .expect("run execloop");
            let used = cpu_seconds() - before;
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
                "round {round} uprobes={:<5} cpu {:>7.1} ms ({:.2}% of one CPU)  {execs}  parsed={} negative_hits={} exec_events={}",
                uprobes,
                used * 1e3,
                used / seconds as f64 * 100.0,
                get("ebpf_uprobe_binaries_parsed_total"),
                get("ebpf_uprobe_negative_hits_total"),
                get("ebpf_process_execs_total"),
            );
            cpu[mode].push(used);
        }
    }
    if cpu.iter().any(|c| c.is_empty()) {
        return;
    }
    let (off, on) = (median(&mut cpu[0]), median(&mut cpu[1]));
    println!(
        "median receiver CPU over {seconds} s at {rate} execs/s: uprobes off {:.1} ms, on {:.1} ms, ratio {:.2}x",
        off * 1e3,
        on * 1e3,
        on / off
    );
}
