//! The process's one wasmtime engine: its settings, the epoch ticker that
//! enforces call timeouts, and compilation through the on-disk cache (plus an
//! in-memory map, so a plugin used by several components or pipelines, or
//! rebuilt by a reload, is compiled once).

use crate::cache::{self, DiskCache};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};
use tracing::warn;
use wasmtime::component::Component;
use wasmtime::{Config, Engine, OptLevel, ProfilingStrategy};

/// How often the epoch advances: a call's timeout is enforced to within one tick.
pub const EPOCH_TICK: Duration = Duration::from_millis(2);

/// Where a compiled plugin came from (`profcol_plugin_compiles_total{source}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Loaded from the on-disk cache or reused from memory: no compile.
    Cache,
    /// Compiled now.
    Compile,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Cache => "cache",
            Source::Compile => "compile",
        }
    }
}

/// A compiled plugin file.
pub struct Compiled {
    pub component: Component,
    pub sha256: String,
    pub size: usize,
}

pub struct Runtime {
    engine: Engine,
    /// Whether `engine` writes the perf map (fixed when it was made).
    perf_map: bool,
    cache: Mutex<Option<Arc<DiskCache>>>,
    compiled: Mutex<HashMap<String, Weak<Compiled>>>,
    /// Held while compiling: components that load the same new file at
    /// once (several pipelines, parallel starts) compile it once.
    compiling: Mutex<()>,
}

static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();

/// `service.plugins.cache_dir`, kept apart from the runtime: setting it must
/// not start the engine and its epoch ticker (a wake-up every
/// [`EPOCH_TICK`]) in a process that runs no plugin.
static CACHE_DIR: Mutex<Option<PathBuf>> = Mutex::new(None);

/// `service.plugins.perf_map`, read when the engine is made (like
/// [`CACHE_DIR`], setting it starts nothing).
static PERF_MAP: AtomicBool = AtomicBool::new(false);

/// The process-wide runtime (one engine, one epoch ticker).
pub fn runtime() -> Result<&'static Runtime, String> {
    RUNTIME.get_or_init(Runtime::new).as_ref().map_err(Clone::clone)
}

/// Sets the compile cache directory (`service.plugins.cache_dir`; None: the
/// default). Takes effect for the next compile.
pub fn set_cache_dir(dir: Option<PathBuf>) {
    let mut cur = CACHE_DIR.lock().unwrap_or_else(|p| p.into_inner());
    if *cur != dir {
        *cur = dir;
        // A runtime already running opens the new directory at its next compile.
        if let Some(Ok(r)) = RUNTIME.get() {
            *r.cache.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

/// Turns wasmtime's perf map on or off (`service.plugins.perf_map`): each
/// compiled or cached plugin function gets a `/tmp/perf-<pid>.map` line.
/// The profiler is part of the engine, so this takes effect when the engine
/// is made (the first plugin load); once it runs, a different value waits
/// for the next start of the process, which is logged.
pub fn set_perf_map(on: bool) {
    PERF_MAP.store(on, Ordering::Relaxed);
    if let Some(Ok(r)) = RUNTIME.get() {
        if r.perf_map != on {
            warn!(
                perf_map = on,
                running = r.perf_map,
                "service.plugins.perf_map takes effect at the next start of profcol; the running plugin engine keeps perf_map: {}",
                r.perf_map
            );
        }
    }
}

/// The engine settings every plugin is compiled with (part of the cache key
/// through wasmtime's compatibility hash). The profiler is not part of that
/// hash and needs no recompile: wasmtime registers a plugin's functions with
/// it whenever it loads code, from the cache too.
fn config(perf_map: bool) -> Config {
    let mut c = Config::new();
    if perf_map {
        c.profiler(ProfilingStrategy::PerfMap);
    }
    c.wasm_component_model(true);
    c.epoch_interruption(true);
    c.cranelift_opt_level(OptLevel::Speed);
    // Deep recursion traps cleanly (a stack overflow trap) long before the
    // host thread's own stack is at risk.
    c.max_wasm_stack(1 << 20);
    c
}

impl Runtime {
    fn new() -> Result<Runtime, String> {
        let perf_map = PERF_MAP.load(Ordering::Relaxed);
        let engine = Engine::new(&config(perf_map)).map_err(|e| format!("cannot create the wasmtime engine: {e:#}"))?;
        let ticker = engine.weak();
        std::thread::Builder::new()
            .name("plugin-epoch".into())
            .spawn(move || loop {
                std::thread::sleep(EPOCH_TICK);
                match ticker.upgrade() {
                    Some(e) => e.increment_epoch(),
                    None => return,
                }
            })
            .map_err(|e| format!("cannot start the plugin epoch thread: {e}"))?;
        Ok(Runtime {
            engine,
            perf_map,
            cache: Mutex::new(None),
            compiled: Mutex::new(HashMap::new()),
            compiling: Mutex::new(()),
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    fn disk(&self) -> Arc<DiskCache> {
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        c.get_or_insert_with(|| {
            let dir = CACHE_DIR.lock().unwrap_or_else(|p| p.into_inner()).clone();
            Arc::new(DiskCache::open(dir))
        })
        .clone()
    }

    /// The compiled form of `bytes`: from memory, from the disk cache, or
    /// compiled now (and stored in the cache).
    pub fn compile(&self, bytes: &[u8]) -> Result<(Arc<Compiled>, Source, Duration), String> {
        let start = Instant::now();
        let sha256 = cache::sha256_hex(bytes);
        let in_memory = || self.compiled.lock().unwrap_or_else(|p| p.into_inner()).get(&sha256).and_then(Weak::upgrade);
        if let Some(c) = in_memory() {
            return Ok((c, Source::Cache, start.elapsed()));
        }
        let _compiling = self.compiling.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = in_memory() {
            return Ok((c, Source::Cache, start.elapsed()));
        }
        let disk = self.disk();
        let key = cache::key(&sha256, &self.engine);
        let mut source = Source::Compile;
        let mut component = None;
        if let Some(artifact) = disk.load(&key) {
            // SAFETY: the artifact comes from a directory only this user can
            // write (checked by DiskCache), written by `serialize` below; a
            // stale or foreign-version artifact is refused by wasmtime's own
            // header check and then recompiled.
            if let Ok(c) = unsafe { Component::deserialize(&self.engine, &artifact) } {
                component = Some(c);
                source = Source::Cache;
            }
        }
        let component = match component {
            Some(c) => c,
            None => {
                let c = Component::new(&self.engine, bytes).map_err(|e| format!("cannot compile the plugin: {e:#}"))?;
                if let Ok(artifact) = c.serialize() {
                    disk.store(&key, &artifact);
                }
                c
            }
        };
        let compiled = Arc::new(Compiled { component, sha256: sha256.clone(), size: bytes.len() });
        let mut map = self.compiled.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        map.insert(sha256, Arc::downgrade(&compiled));
        Ok((compiled, source, start.elapsed()))
    }

    /// Forgets compiled plugins held only in memory (tests and benches that
    /// measure the disk cache).
    pub fn forget_in_memory(&self) {
        self.compiled.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}
