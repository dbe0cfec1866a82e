//! The wasm side: bindings of `plugins/wit/plugin.wit` and the glue the
//! export macros put into a plugin. Only in wasm builds.
//!
//! Both worlds are generated here with `pub_export_macro`: wit-bindgen then
//! puts only the imports in this crate's type section, and a world's exports
//! go into the plugin with the export macro it invokes, so a plugin exports
//! the one world it names.

pub mod processor_world {
    wit_bindgen::generate!({
        path: "../wit",
        world: "processor",
        pub_export_macro: true,
        export_macro_name: "__export_processor_world",
        default_bindings_module: "$crate::guest::processor_world",
    });
}

pub mod exporter_world {
    wit_bindgen::generate!({
        path: "../wit",
        world: "exporter",
        pub_export_macro: true,
        export_macro_name: "__export_exporter_world",
        default_bindings_module: "$crate::guest::exporter_world",
        // One Rust type per WIT type: the glue below serves both worlds.
        with: {
            "profcol:plugin/types@0.1.0": crate::guest::processor_world::profcol::plugin::types,
            "profcol:plugin/host@0.1.0": crate::guest::processor_world::profcol::plugin::host,
        },
    });
}

// Both worlds import the same `host` and `types`; the exporter world's
// bindings reuse these.
pub(crate) use processor_world::profcol::plugin::host;
use processor_world::profcol::plugin::types;

use std::any::Any;
use std::cell::RefCell;

thread_local! {
    /// The plugin's value, made by `init` (a wasm instance has one thread).
    static PLUGIN: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

fn to_wit(e: crate::PluginError) -> types::PluginError {
    let kind = match e.kind {
        crate::ErrorKind::Retryable => types::ErrorKind::Retryable,
        crate::ErrorKind::Permanent => types::ErrorKind::Permanent,
        crate::ErrorKind::Drop => types::ErrorKind::Drop,
    };
    types::PluginError { kind, message: e.message }
}

fn with_plugin<T: 'static, R>(
    f: impl FnOnce(&mut T) -> Result<R, crate::PluginError>,
) -> Result<R, types::PluginError> {
    PLUGIN
        .with(|p| match p.borrow_mut().as_mut().and_then(|b| b.downcast_mut::<T>()) {
            Some(t) => f(t),
            None => Err(crate::PluginError::permanent("called before init succeeded")),
        })
        .map_err(to_wit)
}

#[doc(hidden)]
pub fn init<T: 'static>(make: impl FnOnce() -> Result<T, String>) -> Result<(), String> {
    let t = make()?;
    PLUGIN.with(|p| *p.borrow_mut() = Some(Box::new(t)));
    Ok(())
}

#[doc(hidden)]
pub fn process<T: crate::Processor>(batch: Vec<u8>) -> Result<Option<Vec<u8>>, types::PluginError> {
    with_plugin(|t: &mut T| t.process_bytes(batch))
}

#[doc(hidden)]
pub fn export<T: crate::Exporter>(batch: Vec<u8>) -> Result<Vec<types::Output>, types::PluginError> {
    let outputs = with_plugin(|t: &mut T| t.export_bytes(batch))?;
    Ok(outputs
        .into_iter()
        .map(|o| types::Output { sink: o.sink, content_type: o.content_type, data: o.data })
        .collect())
}
