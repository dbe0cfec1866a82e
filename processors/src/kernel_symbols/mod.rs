//! `kernel_symbols` processor: names the kernel frames of every batch.
//!
//! kallsyms is held compactly per module ([`table`]), module ranges and
//! build IDs come first from sysfs ([`sysfs`]), BPF programs from the bpf
//! syscall ([`bpf`], which also keeps their history and how far it is
//! known). A background task ([`reload`]) applies module uevents
//! ([`uevent`]) and PERF_RECORD_KSYMBOL records ([`perf_ksymbol`]) and
//! publishes immutable snapshots as time-stamped [`generations`], so each
//! sample is named with what was loaded when it was taken.

pub mod bpf;
pub mod config;
pub mod error;
pub mod generations;
pub mod kallsyms;
pub mod ordering;
pub mod perf_ksymbol;
pub mod processor;
pub mod reload;
pub mod snapshot;
pub mod store;
pub mod symbolize;
pub mod sysfs;
pub mod table;
pub mod uevent;

pub use config::Config;
pub use error::Error;
pub use processor::KernelSymbols;
pub use store::{Store, StoreConfig};

use std::sync::Arc;

use profcol_api::component::{self, Component, Factory, FactoryMeta, Kind, Stability};

/// Factory of the `kernel_symbols` processor.
pub fn factory() -> Arc<dyn Factory> {
    component::factory_with_metrics::<Config, _>(
        FactoryMeta {
            type_name: "kernel_symbols",
            kind: Kind::Processor,
            stability: Stability::Alpha,
            description:
                "names kernel frames (vmlinux, modules, BPF programs) with the symbols live at each sample's time",
        },
        processor::METRICS,
        |settings, cfg: Config| {
            Ok(Component::Processor(Arc::new(KernelSymbols::with_telemetry(cfg, &settings.telemetry))))
        },
    )
}
