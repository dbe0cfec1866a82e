//! The `ebpf` receiver: whole-host on-CPU profiling.
//!
//! A `perf_event` BPF program (ebpf/bpf/cpu_sample.bpf.c) runs on a software
//! cpu-clock event on every online CPU at `sample_frequency` Hz and writes
//! one record per sample (pid, tid, cpu, time, comm, kernel and user stack)
//! into a BPF ring buffer. A sampler thread drains the ring, attaches
//! process knowledge from /proc (mappings, build IDs, executable, container)
//! and aggregates samples; every `report_interval` it hands a batch to an
//! async task that pushes it downstream (awaiting = backpressure: while the
//! pipeline is full the ring fills and the kernel counts what it drops).
//!
//! Modules, by what they hold:
//!
//! - [`config`]: the `receivers: ebpf:` config and its validation.
//! - [`metrics`]: the receiver's own series, declared once.
//! - [`sampler`]: the sampler thread's loop (wait, drain, report) and the receiver's counters.
//! - [`bpf`]: loading the BPF object, attaching its perf events, and the privileges that needs.
//! - [`process`]: what is known of each sampled process (table, /proc, kernel records, build IDs, service names).
//! - [`stacks`]: samples to batches: stack ends, stacks counted in the kernel, aggregation.
//! - [`unwind`]: `.eh_frame` unwind tables for the BPF program's user-stack walk.
//! - [`uprobes`]: counting calls of configured user-space functions.
//!
//! The kernel interface itself (bpf(2), perf events, perf rings, online
//! CPUs) is `profcol_ebpf::sys`.

pub mod bpf;
pub mod budget;
pub mod config;
pub mod interp;
pub(crate) mod jit;
pub(crate) mod metrics;
pub mod off_cpu;
pub mod process;
pub(crate) mod sampler;
pub mod stacks;
pub mod targets;
pub(crate) mod unwind;
pub mod uprobes;

pub use config::EbpfConfig;

use async_trait::async_trait;
use profcol_api::component::{
    factory_with_metrics, Component, ComponentError, CreateSettings, Factory, FactoryMeta, Kind, Next, Receiver,
    Stability,
};
use sampler::{Counters, SamplerHandle};
use std::sync::{Arc, Mutex};

/// The receiver's type name in configs.
pub(crate) const TYPE_NAME: &str = "ebpf";

/// Factory for `receivers: ebpf:`.
pub fn factory() -> Arc<dyn Factory> {
    factory_with_metrics::<EbpfConfig, _>(
        FactoryMeta {
            type_name: TYPE_NAME,
            kind: Kind::Receiver,
            stability: Stability::Development,
            description: "whole-host on-CPU profiling with eBPF: kernel and user stacks, mappings, build IDs",
        },
        metrics::METRICS,
        |settings: CreateSettings, config: EbpfConfig| {
            Ok(Component::Receiver(Arc::new(EbpfReceiver::new(settings, config))))
        },
    )
}

/// The running receiver.
pub struct EbpfReceiver {
    settings: CreateSettings,
    config: EbpfConfig,
    counters: Counters,
    running: Mutex<Option<SamplerHandle>>,
}

impl EbpfReceiver {
    pub fn new(settings: CreateSettings, config: EbpfConfig) -> Self {
        let counters = Counters::new(&settings.telemetry);
        EbpfReceiver { settings, config, counters, running: Mutex::new(None) }
    }

    /// Self-telemetry counters (also registered in the host's registry).
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
}

#[async_trait]
impl Receiver for EbpfReceiver {
    async fn start(&self, next: Next) -> Result<(), ComponentError> {
        let id = self.settings.id.to_string();
        let handle = SamplerHandle::start(
            self.config.clone(),
            next,
            self.counters.clone(),
            self.settings.telemetry.clone(),
            self.settings.services.file_pins.clone(),
        )
        .await
        .map_err(|e| ComponentError::msg(format!("receivers::{id}: {e}")))?;
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = running.replace(handle) {
            // start twice: keep the new one, stop the old in the background.
            tokio::spawn(old.stop());
        }
        Ok(())
    }

    /// Two samplers side by side would count the overlap twice: on reload the
    /// old one stops before the new one starts (and starts again if it fails).
    fn exclusive_resources(&self) -> Vec<String> {
        vec!["ebpf cpu-clock sampler".to_owned()]
    }

    async fn shutdown(&self) -> Result<(), ComponentError> {
        let handle = self.running.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            h.stop().await;
        }
        Ok(())
    }
}
