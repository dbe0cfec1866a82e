//! Runs the `ebpf` receiver alone and prints one summary line per batch.
//! Used by receivers/benches/ebpf_overhead.sh and for manual checks.
//!
//!     sudo target/release/examples/ebpf_profile [--frequency HZ] [--seconds S]
//!         [--interval S] [--pid PID]... [--quiet]
//!
//! Stops after `--seconds` (default: run until SIGINT/SIGTERM), flushing
//! the last batch, then prints the receiver's counters.

use async_trait::async_trait;
use profcol_api::component::{ComponentId, ConsumeError, Consumer, Kind, Next, Receiver};
use profcol_api::telemetry::Telemetry;
use profcol_api::{CreateSettings, Profiles};
use profcol_receivers::ebpf::{EbpfConfig, EbpfReceiver};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

struct Summary {
    quiet: bool,
    observations: AtomicU64,
}

#[async_trait]
impl Consumer for Summary {
    async fn consume(&self, batch: Profiles) -> Result<(), ConsumeError> {
        // Observations: a time each, or a count (samples counted in the kernel).
        let obs = batch.sample_count();
        self.observations.fetch_add(obs as u64, Ordering::Relaxed);
        if !self.quiet {
            let procs = batch.0.resource_profiles.len();
            let d = batch.dictionary();
            println!(
                "batch: {obs} samples, {} sample rows, {procs} processes, {} locations, {} bytes encoded",
                batch.sample_messages(),
                d.map_or(0, |d| d.location_table.len()),
                batch.encoded_len()
            );
        }
        Ok(())
    }
}

fn arg_values(name: &str) -> Vec<String> {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).filter(|w| w[0] == name).map(|w| w[1].clone()).collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let mut config = EbpfConfig::default();
    if let Some(f) = arg_values("--frequency").first() {
        config.sample_frequency = f.parse().expect("--frequency HZ");
    }
    if let Some(s) = arg_values("--interval").first() {
        config.report_interval = Duration::from_secs_f64(s.parse().expect("--interval SECONDS"));
    }
    config.pids = arg_values("--pid").iter().map(|p| p.parse().expect("--pid PID")).collect();
    let seconds: Option<f64> = arg_values("--seconds").first().map(|s| s.parse().expect("--seconds S"));
    let quiet = std::env::args().any(|a| a == "--quiet");

    let registry = Telemetry::new();
    let id: ComponentId = "ebpf".parse().expect("id");
    let telemetry = registry.component(Kind::Receiver, &id);
    let receiver =
        EbpfReceiver::new(CreateSettings { id, telemetry: telemetry.clone(), services: Default::default() }, config);
    let sink = Arc::new(Summary { quiet, observations: AtomicU64::new(0) });
    let next = Next::new(vec![sink.clone() as Arc<dyn Consumer>], telemetry);
    if let Err(e) = receiver.start(next).await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    let wait = async {
        match seconds {
            Some(s) => tokio::time::sleep(Duration::from_secs_f64(s)).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = wait => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    receiver.shutdown().await.expect("shutdown");
    println!("total: {} samples delivered", sink.observations.load(Ordering::Relaxed));
    for line in registry.render().lines() {
        if line.contains("ebpf") && !line.starts_with('#') {
            println!("{line}");
        }
    }
}
