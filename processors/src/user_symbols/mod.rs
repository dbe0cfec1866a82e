//! `user_symbols` processor: names native user frames on the host, by
//! (build id or file id, file offset), so samples of processes gone long
//! before their batch are named too.
//!
//! The one ELF reader (`profcol-elf`) reads symbol tables, DWARF lines and
//! inlined frames (streamed per lookup: between batches a binary's DWARF
//! costs a small unit index, not parsed units); [`table`] holds one binary's,
//! [`cache`] keeps them by build id within a byte budget and loads them on
//! a thread of its own, [`symbolize`] rewrites a batch's frames.

pub mod cache;
pub mod config;
pub mod debuginfod;
pub mod disk;
pub mod processor;
pub mod symbolize;
pub mod table;

pub use config::Config;
pub use processor::UserSymbols;

use std::sync::Arc;

use profcol_api::component::{self, Component, Factory, FactoryMeta, Kind, Stability};

/// Factory of the `user_symbols` processor.
pub fn factory() -> Arc<dyn Factory> {
    component::factory_with_metrics::<Config, _>(
        FactoryMeta {
            type_name: "user_symbols",
            kind: Kind::Processor,
            stability: Stability::Alpha,
            description: "names native user frames (function, file, line, inlined frames) by build id and file offset",
        },
        processor::METRICS,
        |settings, cfg: Config| {
            Ok(Component::Processor(Arc::new(UserSymbols::with_telemetry(
                cfg,
                settings.services.file_pins.clone(),
                &settings.telemetry,
            ))))
        },
    )
}
