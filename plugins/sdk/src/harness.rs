//! Runs a plugin natively in `cargo test`, the way the host calls it: the
//! batch goes in as protobuf bytes, the output comes back as bytes and must
//! decode and pass the host's own validate (the harness panics, failing the
//! test, where the host would count a plugin failure).
//!
//! ```
//! use profcol_plugin_sdk::harness::{cpu_batch, Harness};
//! use profcol_plugin_sdk::{Batch, PluginError, Processor};
//!
//! struct DropPrefix(String);
//!
//! impl Processor for DropPrefix {
//!     fn init(config: &str) -> Result<Self, String> {
//!         Ok(DropPrefix(serde_json::from_str(config).map_err(|e| e.to_string())?))
//!     }
//!     fn process(&mut self, mut batch: Batch) -> Result<Option<Batch>, PluginError> {
//!         batch.retain_frames(|f| !f.function_name().unwrap_or("").starts_with(self.0.as_str()));
//!         Ok(Some(batch))
//!     }
//! }
//!
//! let mut h = Harness::<DropPrefix>::processor(r#""alloc::""#).unwrap();
//! let out = h.process(&cpu_batch()).unwrap().expect("not dropped");
//! assert!(out.samples().all(|s| s.frames().all(|f| !f.function_name().unwrap_or("").starts_with("alloc::"))));
//! ```

use crate::{Batch, BatchBuilder, Exporter, FrameSpec, Output, PluginError, Processor, ProfileSpec, SampleSpec, Value};

/// A plugin made from its config, called as the host calls it.
pub struct Harness<T> {
    plugin: T,
}

impl<T: Processor> Harness<T> {
    /// Makes the processor from `config` (JSON), as the host's `init`.
    pub fn processor(config: &str) -> Result<Self, String> {
        Ok(Harness { plugin: T::init(config)? })
    }

    /// One `process` call. Panics when the output would fail in the host:
    /// bytes that do not decode, or a batch that breaks the spec's invariants.
    pub fn process(&mut self, batch: &Batch) -> Result<Option<Batch>, PluginError> {
        let out = self.plugin.process_bytes(batch.encode())?;
        Ok(out.map(|bytes| {
            let b = Batch::decode(&bytes).unwrap_or_else(|e| panic!("the plugin's output does not decode: {e}"));
            if let Err(e) = b.validate() {
                panic!("the host would refuse the plugin's output: {e}");
            }
            b
        }))
    }
}

impl<T: Exporter> Harness<T> {
    /// Makes the exporter from `config` (JSON), as the host's `init`.
    pub fn exporter(config: &str) -> Result<Self, String> {
        Ok(Harness { plugin: T::init(config)? })
    }

    /// One `export` call.
    pub fn export(&mut self, batch: &Batch) -> Result<Vec<Output>, PluginError> {
        self.plugin.export_bytes(batch.encode())
    }
}

impl<T> Harness<T> {
    /// The plugin itself, to look at its state.
    pub fn plugin(&mut self) -> &mut T {
        &mut self.plugin
    }

    /// The log lines and counters the plugin sent to the host so far (on
    /// this thread), taken: the next call starts empty.
    pub fn recorded(&self) -> crate::host::Recorded {
        crate::host::take_recorded()
    }
}

/// Reads a batch saved as `ProfilesData` protobuf (e.g. the input of
/// `profcol plugin run --input`).
pub fn load(path: impl AsRef<std::path::Path>) -> Batch {
    let path = path.as_ref();
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Batch::decode(&bytes).unwrap_or_else(|e| panic!("{}: not a ProfilesData protobuf: {e}", path.display()))
}

/// A small CPU profile like the ebpf receiver's: two processes (one with two
/// threads), user frames with files and lines, kernel frames, an
/// unsymbolized frame, one sample with two observations, and a sample with
/// no frames.
pub fn cpu_batch() -> Batch {
    let f = |function, file, line, mapping| FrameSpec {
        function,
        file,
        line,
        mapping,
        address: 0x1000 + line as u64,
        frame_type: Some("native"),
    };
    let k = |function| FrameSpec {
        function,
        mapping: "[kernel.kallsyms]",
        address: 0xffff_ffff_8100_0000,
        frame_type: Some("kernel"),
        ..Default::default()
    };
    let main = f("main", "/src/app/main.rs", 10, "/usr/bin/app");
    let work = f("app::work", "/src/app/work.rs", 42, "/usr/bin/app");
    let vec_push = f("alloc::vec::Vec<T>::push", "/rustc/library/alloc/src/vec/mod.rs", 1800, "/usr/bin/app");
    let memcpy = f("__memcpy_avx_unaligned", "", 0, "/usr/lib/x86_64-linux-gnu/libc.so.6");
    let unsymbolized = FrameSpec {
        mapping: "/usr/lib/x86_64-linux-gnu/libssl.so.3",
        address: 0x3f2a0,
        frame_type: Some("native"),
        ..Default::default()
    };
    let syscall = k("do_syscall_64");
    let write = k("ksys_write");
    let py_main = f("main", "/usr/bin/python3", 0, "/usr/bin/python3.11");

    let mut b = BatchBuilder::new();
    let spec = |service| ProfileSpec {
        resource: service,
        scope: ("profcol", "0.1.0"),
        sample_type: ("samples", "count"),
        period_type: ("cpu", "nanoseconds"),
        period: 10_101_010,
        time_unix_nano: 1_700_000_000_000_000_000,
        duration_nano: 5_000_000_000,
    };
    let app = b.profile(&spec(&[("host.name", Value::Str("node-1")), ("service.name", Value::Str("app"))]));
    let py = b.profile(&spec(&[("host.name", Value::Str("node-1")), ("service.name", Value::Str("worker"))]));
    let thread = |pid, tid, name| {
        [("process.pid", Value::Int(pid)), ("thread.id", Value::Int(tid)), ("thread.name", Value::Str(name))]
    };
    let t1 = thread(100, 100, "app");
    let t2 = thread(100, 101, "app-worker");
    let t3 = thread(200, 200, "python3");
    let ts = 1_700_000_000_100_000_000;
    let samples: [SampleSpec; 7] = [
        SampleSpec {
            frames: &[memcpy, vec_push, work, main],
            values: &[1],
            timestamps_unix_nano: &[ts],
            attributes: &t1,
        },
        SampleSpec {
            frames: &[vec_push, work, main],
            values: &[1, 1],
            timestamps_unix_nano: &[ts + 10, ts + 20],
            attributes: &t2,
        },
        SampleSpec {
            frames: &[write, syscall, memcpy, work, main],
            values: &[1],
            timestamps_unix_nano: &[ts + 30],
            attributes: &t1,
        },
        SampleSpec { frames: &[work, main], values: &[1], timestamps_unix_nano: &[ts + 40], attributes: &t2 },
        SampleSpec { frames: &[unsymbolized, main], values: &[1], timestamps_unix_nano: &[ts + 50], attributes: &t1 },
        SampleSpec { frames: &[syscall, py_main], values: &[1], timestamps_unix_nano: &[ts + 60], attributes: &t3 },
        SampleSpec { frames: &[], values: &[1], timestamps_unix_nano: &[ts + 70], attributes: &t3 },
    ];
    for s in &samples {
        let p = if s.attributes[0].1 == Value::Int(200) { py } else { app };
        b.sample(p, s);
    }
    b.build()
}
