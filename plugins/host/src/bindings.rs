//! Host bindings generated from `plugins/wit/plugin.wit`, one module per world.
//! Both worlds import the same `host` interface; the exporter bindings reuse
//! the processor's so one implementation serves both.

pub mod processor {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "processor",
    });
}

pub mod exporter {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "exporter",
        with: {
            "profcol:plugin/host": super::processor::profcol::plugin::host,
            "profcol:plugin/types": super::processor::profcol::plugin::types,
        },
    });
}

pub use processor::profcol::plugin::host::Level;
pub use processor::profcol::plugin::types::{ErrorKind, Output, PluginError};
