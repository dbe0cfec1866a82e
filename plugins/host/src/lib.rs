//! `profcol-plugins`: user-written processors and exporters as WebAssembly
//! components (WIT package `profcol:plugin`, `plugins/wit/plugin.wit`) on
//! wasmtime's component model.
//!
//! - [`runtime`]: the one engine, the epoch ticker, compilation through the cache;
//! - [`cache`]: compiled plugins on disk (mode 0700, keyed by file and engine);
//! - [`inspect`]: a plugin's world, WIT version, imports and exports, without compiling;
//! - [`sandbox`]: what an instance may touch (WASI grants, limits, host imports);
//! - [`plugin`]: the instance pool, calls off the tokio workers, failures and disabling;
//! - [`processor`], [`exporter`]: the `wasm` components; [`sinks`]: exporter delivery.

pub mod bindings;
pub mod cache;
pub mod cli;
pub mod config;
pub mod exporter;
pub mod inspect;
mod metrics;
pub mod plugin;
pub mod processor;
pub mod runtime;
pub mod sandbox;
pub mod sinks;

pub use inspect::World;
pub use plugin::{Plugin, PluginSettings};
pub use runtime::{set_cache_dir, set_perf_map};

use profcol_api::component::{ComponentError, Factory};
use profcol_api::telemetry::Telemetry;
use std::path::Path;
use std::sync::Arc;
use tracing::info;

/// The `wasm` processor and exporter factories.
pub fn factories() -> Vec<Arc<dyn Factory>> {
    vec![Arc::new(processor::ProcessorFactory), Arc::new(exporter::ExporterFactory)]
}

/// Runs blocking work (a compile) without stalling a tokio worker.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Reads, compiles (or loads from the cache) and instantiates a plugin file.
pub fn load_file(
    path: &Path,
    world: World,
    settings: PluginSettings,
    registry: &Telemetry,
) -> Result<Arc<Plugin>, ComponentError> {
    let bytes =
        std::fs::read(path).map_err(|e| ComponentError::io(format!("cannot read plugin {}", path.display()), e))?;
    let component = settings.component.clone();
    let loaded = blocking(|| Plugin::load(&bytes, world, settings, registry.clone()))
        .map_err(|e| ComponentError::msg(format!("plugin {}: {e}", path.display())))?;
    info!(
        component = %component,
        plugin_sha256 = %loaded.plugin.sha256(),
        source = loaded.source.as_str(),
        took = ?loaded.compile_time,
        "plugin loaded"
    );
    Ok(loaded.plugin)
}
