//! A processor built against a later WIT version (profcol:plugin@0.2.0,
//! made by build.sh from plugins/wit): the host must refuse it.

use exports::profcol::plugin::process_batch::{Guest, PluginError};

wit_bindgen::generate!({ path: "../out/wit-next", world: "processor" });

struct Plugin;

impl Guest for Plugin {
    fn init(_config: String) -> Result<(), String> {
        Ok(())
    }
    fn process(batch: Vec<u8>) -> Result<Option<Vec<u8>>, PluginError> {
        Ok(Some(batch))
    }
}

export!(Plugin);
