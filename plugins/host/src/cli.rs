//! `profcol plugin inspect` and `profcol plugin run`: a plugin author's
//! first tools. They print to a String; the binary writes it out.

use crate::bindings::{ErrorKind, PluginError};
use crate::inspect::{inspect, World, WIT_PACKAGE, WIT_VERSION};
use crate::plugin::{Plugin, PluginSettings};
use crate::sandbox::Allow;
use profcol_api::telemetry::Telemetry;
use profcol_api::Profiles;
use std::fmt::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// World, WIT version, imports, exports and size of a plugin file.
pub fn inspect_file(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let i = inspect(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = String::new();
    let _ = writeln!(out, "file:     {}", path.display());
    let _ = writeln!(out, "size:     {} bytes", i.size);
    let _ = writeln!(out, "sha256:   {}", crate::cache::sha256_hex(&bytes));
    match i.world() {
        Ok((w, v)) if v != WIT_VERSION => {
            let _ = writeln!(
                out,
                "world:    {w} ({WIT_PACKAGE}@{v}; NOT compatible: this profcol implements {WIT_PACKAGE}@{WIT_VERSION})"
            );
        }
        Ok((w, v)) => match i.check(w) {
            Ok(()) => {
                let _ = writeln!(out, "world:    {w} ({WIT_PACKAGE}@{v}; compatible with {WIT_PACKAGE}@{WIT_VERSION})");
            }
            Err(e) => {
                let _ = writeln!(out, "world:    {w} ({WIT_PACKAGE}@{v}; NOT compatible: {e})");
            }
        },
        Err(e) => {
            let _ = writeln!(out, "world:    none ({e})");
        }
    }
    let _ = writeln!(out, "imports:");
    for n in &i.imports {
        let _ = writeln!(out, "  {n}");
    }
    let _ = writeln!(out, "exports:");
    for n in &i.exports {
        let _ = writeln!(out, "  {n}");
    }
    Ok(out)
}

/// One batch file: OTLP protobuf (`ProfilesData`), or OTLP/JSON when it ends in `.json`.
fn read_batch(path: &Path) -> Result<Profiles, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let p = if path.extension().is_some_and(|e| e == "json") {
        Profiles::from_json(&bytes)
    } else {
        Profiles::decode(&bytes)
    };
    p.map_err(|e| format!("{}: not an OTLP ProfilesData batch: {e}", path.display()))
}

fn summary(p: &Profiles) -> String {
    format!("{} samples in {} profiles", p.sample_count(), p.profiles().count())
}

/// What `profcol plugin run` runs a plugin with: the keys of `wasm/NAME`
/// that shape a call.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The plugin's `config` as JSON; None: absent (`null`).
    pub config_json: Option<String>,
    pub call_timeout: Duration,
    pub memory_limit: u64,
    pub allow: Allow,
}

impl Default for RunOptions {
    /// The defaults of `wasm/NAME`.
    fn default() -> Self {
        RunOptions {
            config_json: None,
            call_timeout: Duration::from_millis(100),
            memory_limit: 64 << 20,
            allow: Allow::default(),
        }
    }
}

/// `--allow-dir HOST:GUEST` (`HOST` alone: seen at the same path).
pub fn parse_allow_dir(s: &str) -> Result<(std::path::PathBuf, String), String> {
    let (host, guest) = s.split_once(':').unwrap_or((s, s));
    if host.is_empty() || !guest.starts_with('/') {
        return Err(format!("{s:?}: expected HOST_DIR:/PATH_THE_PLUGIN_SEES (e.g. /etc/rules:/rules)"));
    }
    if !Path::new(host).is_dir() {
        return Err(format!("{host}: no such directory"));
    }
    Ok((host.into(), guest.to_owned()))
}

/// Runs a plugin once on a batch (its stdout and stderr go to the terminal)
/// and describes what it did.
pub fn run_file(path: &Path, input: &Path, options: &RunOptions) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let (world, _) = inspect(&bytes).and_then(|i| i.world()).map_err(|e| format!("{}: {e}", path.display()))?;
    let batch = read_batch(input)?;
    let config_json = options.config_json.clone().unwrap_or_else(|| "null".into());
    serde_json::from_str::<serde_json::Value>(&config_json).map_err(|e| format!("--plugin-config is not JSON: {e}"))?;
    let call_timeout = options.call_timeout;
    let settings = PluginSettings {
        component: format!("wasm/{}", path.file_stem().and_then(|s| s.to_str()).unwrap_or("plugin")),
        config_json,
        call_timeout,
        memory_limit: options.memory_limit,
        pool_size: 1,
        keep_idle: 1,
        max_failures: u32::MAX,
        failure_window: Duration::from_secs(60),
        allow: options.allow.clone(),
        inherit_stdio: true,
    };
    let start = Instant::now();
    let loaded = Plugin::load(&bytes, world, settings, Telemetry::new())?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "plugin:   {} (world {world}), loaded in {:?} ({})",
        path.display(),
        start.elapsed(),
        loaded.source.as_str()
    );
    let _ = writeln!(out, "input:    {}", summary(&batch));
    let encoded = batch.encode_to_vec();
    let start = Instant::now();
    // A call near its limit here times out in a pipeline on a larger batch,
    // and the batch then follows on_error (pass: on unprocessed).
    let near_limit = |took: Duration| {
        if took * 2 > call_timeout {
            format!(
                "warning: the call took {took:?} of its call_timeout {call_timeout:?}: a larger batch would time out \
                 and follow on_error (pass: it goes on unprocessed); raise call_timeout or send smaller batches\n"
            )
        } else {
            String::new()
        }
    };
    let plugin_error = |e: PluginError| {
        let kind = match e.kind {
            ErrorKind::Retryable => "retryable",
            ErrorKind::Permanent => "permanent",
            ErrorKind::Drop => "drop",
        };
        format!("plugin error ({kind}): {}", e.message)
    };
    match world {
        World::Processor => {
            let r = loaded.plugin.process_blocking(&encoded).map_err(|e| e.to_string())?;
            let took = start.elapsed();
            match r {
                Ok(Some(b)) => {
                    let p = Profiles::decode(&b).map_err(|e| format!("output does not decode as ProfilesData: {e}"))?;
                    let valid = match p.validate() {
                        Ok(()) => "valid".to_owned(),
                        Err(e) => format!("INVALID: {e}"),
                    };
                    let _ = writeln!(out, "output:   {} ({} bytes, {valid}) in {took:?}", summary(&p), b.len());
                }
                Ok(None) => {
                    let _ = writeln!(out, "output:   none: the batch is dropped (in {took:?})");
                }
                Err(e) => return Err(plugin_error(e)),
            }
            out.push_str(&near_limit(took));
        }
        World::Exporter => {
            let outputs = loaded.plugin.export_blocking(&encoded).map_err(|e| e.to_string())?.map_err(plugin_error)?;
            let took = start.elapsed();
            let _ = writeln!(out, "outputs:  {} in {took:?}", outputs.len());
            out.push_str(&near_limit(took));
            for o in outputs {
                let _ = writeln!(out, "--- sink {:?}, {}, {} bytes", o.sink, o.content_type, o.data.len());
                match std::str::from_utf8(&o.data) {
                    Ok(t) => out.push_str(t),
                    Err(_) => {
                        let _ = writeln!(out, "(binary)");
                    }
                }
                if !out.ends_with('\n') {
                    out.push('\n');
                }
            }
        }
    }
    Ok(out)
}

/// A CPU-profile batch as the eBPF receiver makes one, of `samples` samples:
/// up to 16 processes, each with an executable mapping and a pool of
/// functions, stacks 4 to 40 frames deep (some with kernel frames), thread
/// attributes and a timestamp per sample. Deterministic.
pub fn gen_batch(samples: usize) -> Profiles {
    use profcol_api::model::{keys, pb, AttrValue, KeyValue, ProfileMeta, Resource};
    use profcol_api::ProfilesBuilder;
    let kv = |k: &str, v: AttrValue<'_>| KeyValue { key: k.into(), value: Some(v.to_any()), ..Default::default() };
    let mut b = ProfilesBuilder::new();
    let t0 = 1_700_000_000_000_000_000u64;
    let kmap_name = b.string(keys::KERNEL_MAPPING);
    let kattr = b.attribute(keys::FRAME_TYPE, AttrValue::Str("kernel"));
    let uattr = b.attribute(keys::FRAME_TYPE, AttrValue::Str("native"));
    let kmap = b.mapping(pb::Mapping {
        memory_start: 0xffff_ffff_8100_0000,
        memory_limit: 0xffff_ffff_8300_0000,
        file_offset: 0,
        filename_strindex: kmap_name,
        attribute_indices: vec![],
    });
    let kernel_fn = ["do_syscall_64", "entry_SYSCALL_64", "vfs_read", "ksys_read", "schedule", "tcp_sendmsg"];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let processes = samples.div_ceil(1000).clamp(1, 16);
    for p in 0..processes {
        let n = samples / processes + usize::from(p < samples % processes);
        let pid = 1000 + p as i64;
        let exe = format!("/usr/bin/app{p}");
        let r = b.resource(Resource {
            attributes: vec![
                kv(keys::PROCESS_PID, AttrValue::Int(pid)),
                kv(keys::PROCESS_EXECUTABLE_NAME, AttrValue::Str(&format!("app{p}"))),
                kv(keys::PROCESS_EXECUTABLE_PATH, AttrValue::Str(&exe)),
                kv(keys::HOST_NAME, AttrValue::Str("node-1")),
                kv("service.name", AttrValue::Str(&format!("service{p}"))),
            ],
            ..Default::default()
        });
        let prof = b.profile(r, &ProfileMeta::cpu(10_000_000, t0, 60_000_000_000));
        let fname = b.string(&exe);
        let umap = b.mapping(pb::Mapping {
            memory_start: 0x40_0000,
            memory_limit: 0x400_0000,
            file_offset: 0,
            filename_strindex: fname,
            attribute_indices: vec![],
        });
        for k in 0..n {
            let r = next();
            let mut locs = Vec::new();
            if r % 4 == 0 {
                for d in 0..2 + (r >> 8) as usize % 4 {
                    let name = kernel_fn[(r as usize >> 4).wrapping_add(d) % kernel_fn.len()];
                    let f = b.function(name, name, "", 0);
                    locs.push(b.location(pb::Location {
                        mapping_index: kmap,
                        address: 0xffff_ffff_8100_1000
                            + 0x40 * ((r as usize >> 4).wrapping_add(d) % kernel_fn.len()) as u64,
                        lines: vec![pb::Line { function_index: f, line: 0, column: 0 }],
                        attribute_indices: vec![kattr],
                    }));
                }
            }
            // Leaf first, down to main; 200 functions per process.
            let depth = 4 + (r >> 16) as usize % 37;
            for d in (0..depth).rev() {
                let id = if d == 0 { 0 } else { 1 + ((r >> 24) as usize + d * 7) % 199 };
                let name = if id == 0 { "main".to_owned() } else { format!("app{p}::module{}::fn{id}", id % 13) };
                let f = b.function(&name, &name, &format!("src/module{}.rs", id % 13), 10 * id as i64);
                locs.push(b.location(pb::Location {
                    mapping_index: umap,
                    address: 0x40_1000 + 0x100 * id as u64 + (r % 7) * 4,
                    lines: vec![pb::Line { function_index: f, line: 10 * id as i64 + 3, column: 0 }],
                    attribute_indices: vec![uattr],
                }));
            }
            let stack = b.stack(&locs);
            let tid = b.attribute(keys::THREAD_ID, AttrValue::Int(pid + (k % 4) as i64));
            let tname = b.attribute(keys::THREAD_NAME, AttrValue::Str(if k % 4 == 0 { "main" } else { "worker" }));
            b.sample(
                prof,
                pb::Sample {
                    stack_index: stack,
                    attribute_indices: vec![tid, tname],
                    link_index: 0,
                    values: vec![1],
                    timestamps_unix_nano: vec![t0 + k as u64 * 10_000_000],
                },
            );
        }
    }
    b.build()
}

/// `profcol plugin gen-batch`: writes [`gen_batch`] to `output` (OTLP
/// protobuf, or OTLP/JSON when it ends in `.json`).
pub fn gen_batch_file(samples: usize, output: &Path) -> Result<String, String> {
    if samples == 0 {
        return Err("--samples must be at least 1".into());
    }
    let batch = gen_batch(samples);
    let bytes = if output.extension().is_some_and(|e| e == "json") {
        batch.to_json().into_bytes()
    } else {
        batch.encode_to_vec()
    };
    std::fs::write(output, &bytes).map_err(|e| format!("cannot write {}: {e}", output.display()))?;
    Ok(format!("{}: {} ({} bytes)\n", output.display(), summary(&batch), bytes.len()))
}

/// `profcol plugin new NAME`: a processor plugin crate in directory `name`
/// (the README's example: drop every sample of one process, with its test),
/// its SDK at `sdk`.
pub fn new_plugin(name: &str, sdk: &Path) -> Result<String, String> {
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid {
        return Err(format!("{name:?} is not a crate name: letters, digits, _ and -, starting with a letter"));
    }
    let dir = Path::new(name);
    if dir.exists() {
        return Err(format!("{name} already exists"));
    }
    let sdk = std::fs::canonicalize(sdk).map_err(|e| format!("SDK {}: {e}", sdk.display()))?;
    if !sdk.join("Cargo.toml").is_file() {
        return Err(format!("{} is not the SDK (plugins/sdk of a profcol checkout)", sdk.display()));
    }
    let sdk_path = sdk.to_str().ok_or_else(|| format!("{}: not UTF-8", sdk.display()))?;
    let cargo = NEW_CARGO_TOML.replace("NAME", name).replace("SDK_PATH", &sdk_path.replace('\\', "\\\\"));
    let lib = name.replace('-', "_");
    std::fs::create_dir_all(dir.join("src")).map_err(|e| format!("cannot create {name}/src: {e}"))?;
    for (file, text) in [("Cargo.toml", cargo.as_str()), ("src/lib.rs", NEW_LIB_RS), (".gitignore", "/target\n")] {
        std::fs::write(dir.join(file), text).map_err(|e| format!("cannot write {name}/{file}: {e}"))?;
    }
    Ok(format!(
        "created {name}/ (a processor: drops every sample of the process `pid` in its config)\n\
         \x20 cd {name}\n\
         \x20 cargo test                                     # natively, through the SDK's harness\n\
         \x20 cargo build --release --target wasm32-wasip2   # target/wasm32-wasip2/release/{lib}.wasm\n\
         \x20 profcol plugin gen-batch --samples 1000 -o batch.pb\n\
         \x20 profcol plugin run target/wasm32-wasip2/release/{lib}.wasm --input batch.pb --plugin-config '{{\"pid\": 1000}}'\n"
    ))
}

const NEW_CARGO_TOML: &str = r#"[package]
name = "NAME"
version = "0.1.0"
edition = "2021"

[lib]
crate-type = ["cdylib", "rlib"]

[dependencies]
profcol-plugin-sdk = { path = "SDK_PATH" }
serde = { version = "1", features = ["derive"] }

[profile.release]
opt-level = "s"
lto = true

# A crate of its own, even inside another workspace's directory.
[workspace]
"#;

const NEW_LIB_RS: &str = r##"//! A profcol processor plugin: drops every sample of one process.

use profcol_plugin_sdk::{host, Batch, PluginError, Processor, Value};

#[derive(serde::Deserialize, Default)]
struct Config {
    pid: i64,
}

pub struct DropPid {
    pid: i64,
}

impl Processor for DropPid {
    fn init(config: &str) -> Result<Self, String> {
        let c: Config = profcol_plugin_sdk::config(config)?; // the YAML `config`, as JSON
        Ok(DropPid { pid: c.pid })
    }

    fn process(&mut self, mut batch: Batch) -> Result<Option<Batch>, PluginError> {
        let dropped = batch.retain_samples(|s| s.attribute("process.pid") != Some(Value::Int(self.pid)));
        host::counter_add("samples_dropped", dropped); // profcol_plugin_counter_total in /metrics
        Ok(Some(batch)) // None drops the whole batch
    }
}

profcol_plugin_sdk::export_processor!(DropPid);

#[cfg(test)]
mod tests {
    use super::*;
    use profcol_plugin_sdk::harness::{cpu_batch, Harness};

    #[test]
    fn drops_pid_200() {
        let mut h = Harness::<DropPid>::processor(r#"{"pid": 200}"#).unwrap();
        let out = h.process(&cpu_batch()).unwrap().unwrap(); // checked as the host checks it
        assert!(out.samples().all(|s| s.attribute("process.pid") != Some(Value::Int(200))));
    }

    #[test]
    fn without_config_nothing_is_dropped() {
        let mut h = Harness::<DropPid>::processor("null").unwrap();
        let input = cpu_batch();
        let out = h.process(&input).unwrap().unwrap();
        assert_eq!(out.sample_count(), input.sample_count());
    }
}
"##;
