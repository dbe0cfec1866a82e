//! A processor whose `process` export has the right name and the wrong
//! type (`func(string) -> u32`): `profcol validate`, `plugin inspect` and
//! the start must refuse it before any call.

use exports::profcol::plugin::process_batch::Guest;

wit_bindgen::generate!({
    inline: "
        package profcol:plugin@0.1.0;
        interface process-batch {
            init: func(config: string) -> result<_, string>;
            process: func(batch: string) -> u32;
        }
        world processor {
            export process-batch;
        }
    ",
    world: "processor",
});

struct Plugin;

impl Guest for Plugin {
    fn init(_config: String) -> Result<(), String> {
        Ok(())
    }
    fn process(batch: String) -> u32 {
        batch.len() as u32
    }
}

export!(Plugin);
