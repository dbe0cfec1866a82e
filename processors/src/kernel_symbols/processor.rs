//! The processor: opens the store at start, runs the listeners and the
//! reload task, and symbolizes each batch against lock-free generations.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use profcol_api::component::{ComponentError, ProcessError, ProcessOutcome, Processor};
use profcol_api::telemetry::{CollectHook, ComponentTelemetry, Counter, Gauge, MetricDef, Telemetry};
use profcol_api::Profiles;
use tokio::task::JoinHandle;

use super::bpf::progress::CATCH_UP_LIMIT;
use super::config::Config;
use super::store::Store;
use super::{perf_ksymbol, reload, symbolize, uevent};

pub struct KernelSymbols {
    cfg: Config,
    store: OnceLock<Arc<Store>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    metrics: Option<Arc<Metrics>>,
    /// Mirrors the store into `metrics` when a reader collects.
    mirror: Mutex<Option<CollectHook>>,
}

/// The processor's series in /metrics: frames by outcome (added per batch),
/// and the store's own counters and sizes, copied in whenever a reader
/// collects, so they move with no batch passing and no timer wakes the
/// agent for them (the store counts with plain atomics, read by tests and
/// `profcol kernel-symbols stats` too).
struct Metrics {
    registry: Telemetry,
    resolved: Counter,
    module_only: Counter,
    unresolved: Counter,
    generations: Gauge,
    bpf_live: Gauge,
    bpf_retired: Gauge,
    mirrored: [Mirrored; 7],
}

/// A store counter, its series, and the value mirrored last.
type Mirrored = (fn(&Store) -> &AtomicU64, Counter, AtomicU64);

pub(crate) const FRAMES_RESOLVED: MetricDef =
    MetricDef::counter("kernel_symbols_frames_resolved_total", "frames", "Kernel frames named");
pub(crate) const FRAMES_MODULE_ONLY: MetricDef = MetricDef::counter(
    "kernel_symbols_frames_module_only_total",
    "frames",
    "Kernel frames placed in a module whose names are not read yet",
);
pub(crate) const FRAMES_UNRESOLVED: MetricDef =
    MetricDef::counter("kernel_symbols_frames_unresolved_total", "frames", "Kernel frames no live symbol covered");
pub(crate) const GENERATIONS: MetricDef =
    MetricDef::gauge("kernel_symbols_generations", "1", "Symbol generations kept");
pub(crate) const BPF_FUNCTIONS_LIVE: MetricDef =
    MetricDef::gauge("kernel_symbols_bpf_functions_live", "1", "BPF functions loaded now");
pub(crate) const BPF_FUNCTIONS_RETIRED: MetricDef = MetricDef::gauge(
    "kernel_symbols_bpf_functions_retired",
    "1",
    "Unloaded BPF functions kept for late samples (within retain)",
);
pub(crate) const KALLSYMS_READS: MetricDef =
    MetricDef::counter("kernel_symbols_kallsyms_reads_total", "1", "Full reads of kallsyms");
pub(crate) const KALLSYMS_READ_FAILURES: MetricDef = MetricDef::counter(
    "kernel_symbols_kallsyms_read_failures_total",
    "1",
    "kallsyms reads that failed (retried with backoff)",
);
pub(crate) const MODULE_REFRESHES: MetricDef =
    MetricDef::counter("kernel_symbols_module_refreshes_total", "1", "Module metadata refreshes after uevents");
pub(crate) const BPF_SYMBOL_EVENTS: MetricDef =
    MetricDef::counter("kernel_symbols_bpf_symbol_events_total", "1", "BPF program load/unload events applied");
pub(crate) const BPF_RECORDS_DROPPED: MetricDef = MetricDef::counter(
    "kernel_symbols_bpf_records_dropped_total",
    "1",
    "BPF symbol records dropped because the store fell behind (a rescan follows)",
);
pub(crate) const BPF_RESCANS: MetricDef = MetricDef::counter(
    "kernel_symbols_bpf_rescans_total",
    "1",
    "Full BPF program enumerations after the kernel lost records",
);
pub(crate) const BPF_CATCH_UP_TIMEOUTS: MetricDef = MetricDef::counter(
    "kernel_symbols_bpf_catch_up_timeouts_total",
    "1",
    "Batches named before the BPF symbol records of their time arrived (waited 250ms in vain)",
);

/// Every series of the processor, for its factory.
pub(crate) const METRICS: &[MetricDef] = &[
    FRAMES_RESOLVED,
    FRAMES_MODULE_ONLY,
    FRAMES_UNRESOLVED,
    GENERATIONS,
    BPF_FUNCTIONS_LIVE,
    BPF_FUNCTIONS_RETIRED,
    KALLSYMS_READS,
    KALLSYMS_READ_FAILURES,
    MODULE_REFRESHES,
    BPF_SYMBOL_EVENTS,
    BPF_RECORDS_DROPPED,
    BPF_RESCANS,
    BPF_CATCH_UP_TIMEOUTS,
];

impl Metrics {
    fn new(t: &ComponentTelemetry) -> Self {
        let mirrored = |of: fn(&Store) -> &AtomicU64, def: &MetricDef| (of, t.counter_of(def), AtomicU64::new(0));
        Metrics {
            registry: t.registry().clone(),
            resolved: t.counter_of(&FRAMES_RESOLVED),
            module_only: t.counter_of(&FRAMES_MODULE_ONLY),
            unresolved: t.counter_of(&FRAMES_UNRESOLVED),
            generations: t.gauge_of(&GENERATIONS),
            bpf_live: t.gauge_of(&BPF_FUNCTIONS_LIVE),
            bpf_retired: t.gauge_of(&BPF_FUNCTIONS_RETIRED),
            mirrored: [
                mirrored(|s| &s.counters.full_reads, &KALLSYMS_READS),
                mirrored(|s| &s.counters.read_failures, &KALLSYMS_READ_FAILURES),
                mirrored(|s| &s.counters.metadata_refreshes, &MODULE_REFRESHES),
                mirrored(|s| &s.counters.ksymbol_events, &BPF_SYMBOL_EVENTS),
                mirrored(|s| &*s.counters.bpf_records_dropped, &BPF_RECORDS_DROPPED),
                mirrored(|s| &s.counters.bpf_rescans, &BPF_RESCANS),
                mirrored(|s| &s.bpf_progress.timeouts, &BPF_CATCH_UP_TIMEOUTS),
            ],
        }
    }

    fn record(&self, outcome: &symbolize::Outcome) {
        self.resolved.add(outcome.resolved);
        self.module_only.add(outcome.module_only);
        self.unresolved.add(outcome.unresolved);
    }

    fn mirror(&self, store: &Store) {
        self.generations.set(store.generations().len() as i64);
        let bpf = store.generations().current().snapshot.bpf.clone();
        self.bpf_live.set(bpf.live_len() as i64);
        self.bpf_retired.set(bpf.retired_len() as i64);
        for (of, series, seen) in &self.mirrored {
            let now = of(store).load(Relaxed);
            series.add(now.saturating_sub(seen.swap(now, Relaxed)));
        }
    }
}

impl KernelSymbols {
    /// Without series in /metrics (tests, tools).
    pub fn new(cfg: Config) -> Self {
        KernelSymbols {
            cfg,
            store: OnceLock::new(),
            tasks: Mutex::new(Vec::new()),
            metrics: None,
            mirror: Mutex::new(None),
        }
    }

    /// With its series in the host's /metrics.
    pub fn with_telemetry(cfg: Config, telemetry: &ComponentTelemetry) -> Self {
        KernelSymbols { metrics: Some(Arc::new(Metrics::new(telemetry))), ..Self::new(cfg) }
    }

    /// The store, once started.
    pub fn store(&self) -> Option<&Arc<Store>> {
        self.store.get()
    }
}

#[async_trait]
impl Processor for KernelSymbols {
    async fn start(&self) -> Result<(), ComponentError> {
        let sc = self.cfg.store();
        let store = tokio::task::spawn_blocking(move || Store::open(sc))
            .await
            .map_err(|e| ComponentError::msg(format!("kernel_symbols: loading symbols panicked: {e}")))?
            .map_err(|e| ComponentError::msg(format!("kernel_symbols: {e}")))?;
        let store = Arc::new(store);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        if self.cfg.uevents {
            match uevent::spawn(tx.clone()) {
                Ok(t) => tasks.push(t),
                Err(e) => tracing::warn!(error = %e, "kernel_symbols: no module uevents"),
            }
        }
        if self.cfg.bpf {
            match perf_ksymbol::spawn(perf_ksymbol::Sink::new(tx.clone(), &store)) {
                Ok(t) => tasks.extend(t),
                Err(e) => tracing::warn!(error = %e, "kernel_symbols: no PERF_RECORD_KSYMBOL"),
            }
        }
        drop(tx);
        tasks.push(reload::spawn(store.clone(), self.cfg.reload.clone(), rx));
        if let Some(m) = &self.metrics {
            let (hooked, store) = (m.clone(), store.clone());
            let hook = m.registry.on_collect(move || hooked.mirror(&store));
            *self.mirror.lock().unwrap_or_else(|p| p.into_inner()) = Some(hook);
        }
        let _ = self.store.set(store);
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).extend(tasks);
        Ok(())
    }

    async fn process(&self, batch: Profiles) -> Result<ProcessOutcome, ProcessError> {
        let Some(store) = self.store.get() else {
            return Ok(ProcessOutcome::Forward(batch)); // not started: pass through untouched
        };
        // The BPF records of the batch's time may still be on the way.
        if let Some(newest) = newest_sample_ns(&batch) {
            let now = profcol_ebpf::clock::KtimeToUnix::process().now_unix_ns();
            store.bpf_progress.wait_for(newest.min(now), CATCH_UP_LIMIT).await;
        }
        let gens = store.generations().load();
        let (batch, outcome) = symbolize::symbolize(batch, &gens);
        if outcome.unresolved > 0 {
            tracing::debug!(?outcome, "kernel frames left unresolved");
        }
        if let Some(m) = &self.metrics {
            m.record(&outcome);
        }
        Ok(ProcessOutcome::Forward(batch))
    }

    async fn shutdown(&self) -> Result<(), ComponentError> {
        for t in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            t.abort();
        }
        // The hook holds the store: it goes with the processor.
        self.mirror.lock().unwrap_or_else(|p| p.into_inner()).take();
        Ok(())
    }
}

/// The newest sample time of `batch` (a sample's own times, else its
/// profile's end).
fn newest_sample_ns(batch: &Profiles) -> Option<u64> {
    let profiles = batch.0.resource_profiles.iter().flat_map(|r| &r.scope_profiles).flat_map(|s| &s.profiles);
    profiles
        .flat_map(|p| {
            let end = p.time_unix_nano.saturating_add(p.duration_nano);
            p.samples.iter().map(move |s| s.timestamps_unix_nano.iter().copied().max().unwrap_or(end))
        })
        .max()
}
