//! One loaded plugin: its compiled component, a pool of ready instances,
//! the limits every call runs under, and its health (failures in a window,
//! disabled until when).
//!
//! Calls run on tokio's blocking pool, never on a runtime worker. An
//! instance that trapped (a timeout, a limit hit, a stack overflow, a bug) is
//! discarded and a fresh one is made in its place; instances are otherwise
//! reused across calls.

use crate::bindings::{exporter, processor, Output, PluginError};
use crate::inspect::World;
use crate::metrics::{series, CALLS, CALL_DURATION, COMPILES, DISABLED, FAILURES};
use crate::runtime::{runtime, Compiled, Runtime};
use crate::sandbox::{self, Allow, HostState, Shared};
use profcol_api::telemetry::{Counter, Gauge, Telemetry, Timer};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{info, warn};
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Store, Trap, UpdateDeadline};

/// The settings shared by the wasm processor and exporter.
#[derive(Clone, Debug)]
pub struct PluginSettings {
    /// The component id (`wasm/NAME`), for logs and metrics.
    pub component: String,
    /// The plugin's `config`, as JSON, handed to `init`.
    pub config_json: String,
    pub call_timeout: Duration,
    pub memory_limit: u64,
    /// Instances made at start.
    pub pool_size: usize,
    /// Idle instances kept between calls (more are made when more calls
    /// run at once than are idle: calls never queue on one instance).
    pub keep_idle: usize,
    pub max_failures: u32,
    pub failure_window: Duration,
    pub allow: Allow,
    /// `profcol plugin run`: the plugin's stdout/stderr go to the terminal.
    pub inherit_stdio: bool,
}

/// Why a call did not produce the plugin's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The plugin is disabled after too many failures (until `until`).
    Disabled,
    /// The call failed (trap, timeout, limit, failed init): counted.
    Failed { kind: FailureKind, message: String },
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Disabled => f.write_str("plugin disabled after repeated failures"),
            CallError::Failed { kind, message } => write!(f, "plugin {}: {message}", kind.as_str()),
        }
    }
}

/// What went wrong, as the `kind` label of `profcol_plugin_failures_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    Timeout,
    StackOverflow,
    Memory,
    Trap,
    Init,
    /// Output that does not decode or fails validation.
    InvalidOutput,
    /// The plugin returned a permanent error.
    PluginError,
    /// The plugin answered `retryable` to every retry of a batch.
    RetriesExhausted,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Timeout => "timeout",
            FailureKind::StackOverflow => "stack_overflow",
            FailureKind::Memory => "memory",
            FailureKind::Trap => "trap",
            FailureKind::Init => "init",
            FailureKind::InvalidOutput => "invalid_output",
            FailureKind::PluginError => "plugin_error",
            FailureKind::RetriesExhausted => "retries_exhausted",
        }
    }
}

enum Pre {
    Processor(processor::ProcessorPre<HostState>),
    Exporter(exporter::ExporterPre<HostState>),
}

enum Bindings {
    Processor(processor::Processor),
    Exporter(exporter::Exporter),
}

/// One ready instance.
pub struct Instance {
    store: Store<HostState>,
    bindings: Bindings,
}

struct Health {
    failures: VecDeque<Instant>,
    disabled_until: Option<Instant>,
}

struct Metrics {
    ok: Counter,
    error: Counter,
    retryable: Counter,
    disabled_calls: Counter,
    disabled: Gauge,
    duration: Timer,
    registry: Telemetry,
}

pub struct Plugin {
    settings: PluginSettings,
    compiled: Arc<Compiled>,
    pre: Pre,
    shared: Arc<Shared>,
    idle: Mutex<Vec<Instance>>,
    /// Idle instances kept between calls (grows with [`Plugin::grow_pool`]).
    keep_idle: AtomicUsize,
    health: Mutex<Health>,
    metrics: Metrics,
    runtime: &'static Runtime,
}

/// The output of an exporter plugin's call.
pub type ExportResult = Result<Vec<Output>, PluginError>;
/// The output of a processor plugin's call.
pub type ProcessResult = Result<Option<Vec<u8>>, PluginError>;

/// Compile the plugin, link it, and fill its pool.
pub struct Loaded {
    pub plugin: Arc<Plugin>,
    pub source: crate::runtime::Source,
    pub compile_time: Duration,
}

impl Plugin {
    /// Loads `bytes` (checked to implement `world`) and makes `pool_size`
    /// instances, each initialised with the config. Blocking: compiles on a
    /// cold cache.
    pub fn load(bytes: &[u8], world: World, settings: PluginSettings, registry: Telemetry) -> Result<Loaded, String> {
        crate::inspect::inspect(bytes).and_then(|i| i.check(world)).map_err(|e| e.to_string())?;
        let runtime = runtime()?;
        let (compiled, source, compile_time) = runtime.compile(bytes)?;
        let c = settings.component.as_str();
        registry.counter(&series(&COMPILES), COMPILES.help, &[("component", c), ("source", source.as_str())]).inc();
        let mut linker: Linker<HostState> = Linker::new(runtime.engine());
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(|e| format!("cannot link WASI: {e:#}"))?;
        let link_err = |e: wasmtime::Error| format!("cannot link the plugin: {e:#}");
        let pre = match world {
            World::Processor => {
                processor::Processor::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |s| s).map_err(link_err)?;
                let pre = linker.instantiate_pre(&compiled.component).map_err(link_err)?;
                Pre::Processor(processor::ProcessorPre::new(pre).map_err(link_err)?)
            }
            World::Exporter => {
                exporter::Exporter::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |s| s).map_err(link_err)?;
                let pre = linker.instantiate_pre(&compiled.component).map_err(link_err)?;
                Pre::Exporter(exporter::ExporterPre::new(pre).map_err(link_err)?)
            }
        };
        let l = [("component", c)];
        let calls = series(&CALLS);
        let metrics = Metrics {
            ok: registry.counter(&calls, CALLS.help, &[("component", c), ("outcome", "ok")]),
            error: registry.counter(&calls, CALLS.help, &[("component", c), ("outcome", "error")]),
            retryable: registry.counter(&calls, CALLS.help, &[("component", c), ("outcome", "retryable")]),
            disabled_calls: registry.counter(&calls, CALLS.help, &[("component", c), ("outcome", "disabled")]),
            disabled: registry.gauge(&series(&DISABLED), DISABLED.help, &l),
            duration: registry.timer(&series(&CALL_DURATION), CALL_DURATION.help, &l),
            registry: registry.clone(),
        };
        metrics.disabled.set(0);
        let shared = Shared::new(settings.component.clone(), compiled.sha256.clone(), registry);
        let plugin = Arc::new(Plugin {
            keep_idle: AtomicUsize::new(settings.keep_idle.max(1)),
            settings,
            compiled,
            pre,
            shared,
            idle: Mutex::new(Vec::new()),
            health: Mutex::new(Health { failures: VecDeque::new(), disabled_until: None }),
            metrics,
            runtime,
        });
        let mut ready = Vec::with_capacity(plugin.settings.pool_size);
        for _ in 0..plugin.settings.pool_size.max(1) {
            ready.push(plugin.instantiate().map_err(|e| e.to_string())?);
        }
        *plugin.idle.lock().unwrap_or_else(|p| p.into_inner()) = ready;
        Ok(Loaded { plugin, source, compile_time })
    }

    pub fn sha256(&self) -> &str {
        &self.compiled.sha256
    }

    pub fn settings(&self) -> &PluginSettings {
        &self.settings
    }

    /// Instances ready in the pool.
    pub fn idle_instances(&self) -> usize {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Makes instances until `n` are ready, and keeps `n` from then on
    /// (an exporter sized to the exports its host runs at once). Blocking.
    pub fn grow_pool(&self, n: usize) -> Result<(), String> {
        let n = n.max(1);
        self.keep_idle.fetch_max(n, Ordering::Relaxed);
        while self.idle_instances() < n {
            let i = self.instantiate().map_err(|e| e.to_string())?;
            self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(i);
        }
        Ok(())
    }

    /// Arms the call timeout. The epoch advances every [`crate::runtime::EPOCH_TICK`]; at
    /// each tick wasmtime asks the callback, which compares the clock with
    /// the call's deadline. Counting ticks instead would stretch the timeout
    /// by every late wake-up of the ticker thread on a loaded machine.
    fn arm(&self, store: &mut Store<HostState>) {
        store.data_mut().call_deadline = Instant::now() + self.settings.call_timeout;
        store.set_epoch_deadline(1);
    }

    /// A fresh instance with `init` called.
    fn instantiate(&self) -> Result<Instance, CallError> {
        let stderr = sandbox::StderrTail::default();
        // What fails while an instance is made counts as `init`, unless a
        // limit says more (memory, time, stack); the message ends with what
        // the plugin wrote to stderr (a panic message).
        let failed = |e: wasmtime::Error| {
            let kind = match classify(&e) {
                FailureKind::Trap => FailureKind::Init,
                k => k,
            };
            CallError::Failed { kind, message: with_stderr(format!("{e:#}"), &stderr) }
        };
        let wasi = sandbox::wasi(&self.settings.allow, self.settings.inherit_stdio, &stderr)
            .map_err(|message| CallError::Failed { kind: FailureKind::Init, message })?;
        let limit = usize::try_from(self.settings.memory_limit).unwrap_or(usize::MAX);
        let state = HostState::new(wasi, stderr.clone(), limit, Arc::clone(&self.shared));
        let mut store = Store::new(self.runtime.engine(), state);
        store.limiter(|s| &mut s.limits);
        // What the plugin hands back may be as large as its memory (wasmtime's
        // own default stops at 128 MiB whatever `memory_limit` says).
        store.set_hostcall_fuel(limit);
        store.epoch_deadline_callback(|ctx| {
            if Instant::now() >= ctx.data().call_deadline {
                Ok(UpdateDeadline::Interrupt)
            } else {
                Ok(UpdateDeadline::Continue(1))
            }
        });
        self.arm(&mut store);
        let config = self.settings.config_json.as_str();
        let (bindings, init) = match &self.pre {
            Pre::Processor(p) => {
                let b = p.instantiate(&mut store).map_err(failed)?;
                let r = b.profcol_plugin_process_batch().call_init(&mut store, config);
                (Bindings::Processor(b), r)
            }
            Pre::Exporter(p) => {
                let b = p.instantiate(&mut store).map_err(failed)?;
                let r = b.profcol_plugin_export_batch().call_init(&mut store, config);
                (Bindings::Exporter(b), r)
            }
        };
        match init {
            Ok(Ok(())) => Ok(Instance { store, bindings }),
            Ok(Err(message)) => Err(CallError::Failed {
                kind: FailureKind::Init,
                message: format!("init refused the config: {message}"),
            }),
            Err(e) => Err(failed(e)),
        }
    }

    /// Checks out an instance (a fresh one when none is idle: calls never
    /// queue on one instance).
    fn checkout(&self) -> Result<Instance, CallError> {
        if let Some(i) = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(i);
        }
        self.instantiate()
    }

    fn give_back(&self, i: Instance) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.keep_idle.load(Ordering::Relaxed) {
            idle.push(i);
        }
    }

    /// Is the plugin disabled? Re-enables it once the window has passed.
    fn disabled(&self) -> bool {
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        match h.disabled_until {
            Some(t) if Instant::now() < t => true,
            Some(_) => {
                h.disabled_until = None;
                h.failures.clear();
                self.metrics.disabled.set(0);
                info!(component = %self.settings.component, plugin_sha256 = %self.sha256(), "plugin re-enabled: trying it again");
                false
            }
            None => false,
        }
    }

    /// A call whose answer the component took: `profcol_plugin_calls_total{outcome="ok"}`.
    pub fn call_ok(&self) {
        self.metrics.ok.inc();
    }

    /// A call the plugin answered `retryable`: `outcome="retryable"`.
    pub fn call_retryable(&self) {
        self.metrics.retryable.inc();
    }

    /// A call whose answer the component refused (invalid output, a
    /// permanent error, retries exhausted): `outcome="error"`, and a failure.
    pub fn call_failed(&self, kind: FailureKind, message: &str) {
        self.metrics.error.inc();
        self.record_failure(kind, message);
    }

    /// Counts and logs one failure; disables the plugin after `max_failures`
    /// within `failure_window`.
    fn record_failure(&self, kind: FailureKind, message: &str) {
        let c = self.settings.component.as_str();
        self.metrics
            .registry
            .counter(&series(&FAILURES), FAILURES.help, &[("component", c), ("kind", kind.as_str())])
            .inc();
        warn!(component = %c, plugin_sha256 = %self.sha256(), kind = kind.as_str(), "plugin failed: {message}");
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        h.failures.push_back(now);
        while h.failures.front().is_some_and(|t| now.duration_since(*t) > self.settings.failure_window) {
            h.failures.pop_front();
        }
        if h.disabled_until.is_none() && h.failures.len() >= self.settings.max_failures as usize {
            h.disabled_until = Some(now + self.settings.failure_window);
            self.metrics.disabled.set(1);
            warn!(
                component = %c,
                plugin_sha256 = %self.sha256(),
                "plugin disabled for {:?} after {} failures within {:?}",
                self.settings.failure_window,
                h.failures.len(),
                self.settings.failure_window
            );
        }
    }

    /// Runs `f` on an instance on the blocking pool. A trap discards the
    /// instance (a fresh one is made in its place) and counts as a failure.
    async fn call<R: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Instance) -> wasmtime::Result<R> + Send + 'static,
    ) -> Result<R, CallError> {
        if self.disabled() {
            self.metrics.disabled_calls.inc();
            return Err(CallError::Disabled);
        }
        let me = Arc::clone(self);
        let joined = tokio::task::spawn_blocking(move || me.call_blocking(f)).await;
        match joined {
            Ok(r) => r,
            Err(e) => Err(CallError::Failed { kind: FailureKind::Trap, message: format!("plugin call panicked: {e}") }),
        }
    }

    /// The same as [`Plugin::call`], on the current thread (for the CLI and benches).
    /// A trap is counted here; an answer is counted by the component that
    /// judges it ([`Plugin::call_ok`], [`Plugin::call_failed`], [`Plugin::call_retryable`]).
    pub fn call_blocking<R>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Instance) -> wasmtime::Result<R>,
    ) -> Result<R, CallError> {
        let start = Instant::now();
        let mut instance = match self.checkout() {
            Ok(i) => i,
            Err(e) => {
                if let CallError::Failed { kind, message } = &e {
                    self.record_failure(*kind, message);
                }
                self.metrics.error.inc();
                return Err(e);
            }
        };
        self.arm(&mut instance.store);
        // A failure shows what this call wrote to stderr, not earlier calls.
        instance.store.data().stderr.clear();
        let result = f(&mut instance);
        self.metrics.duration.record(start.elapsed());
        self.shared.report_suppressed();
        match result {
            Ok(r) => {
                self.give_back(instance);
                Ok(r)
            }
            Err(e) => {
                let stderr = instance.store.data().stderr.clone();
                drop(instance);
                self.metrics.error.inc();
                let kind = classify(&e);
                let message = with_stderr(format!("{e:#}"), &stderr);
                self.record_failure(kind, &message);
                self.refill();
                Err(CallError::Failed { kind, message })
            }
        }
    }

    /// Makes a fresh instance in place of a discarded one, off the caller's path.
    fn refill(self: &Arc<Self>) {
        let me = Arc::clone(self);
        let make = move || match me.instantiate() {
            Ok(i) => me.give_back(i),
            Err(CallError::Failed { kind, message }) => me.record_failure(kind, &message),
            Err(CallError::Disabled) => {}
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(make);
            }
            Err(_) => make(),
        }
    }

    /// Calls `process` with a batch's bytes (shared: a retry sends them again).
    pub async fn process(self: &Arc<Self>, batch: Arc<Vec<u8>>) -> Result<ProcessResult, CallError> {
        self.call(move |i| match &i.bindings {
            Bindings::Processor(b) => b.profcol_plugin_process_batch().call_process(&mut i.store, &batch),
            Bindings::Exporter(_) => Err(wasmtime::Error::msg("not a processor plugin")),
        })
        .await
    }

    /// Calls `export` with a batch's bytes.
    pub async fn export(self: &Arc<Self>, batch: Vec<u8>) -> Result<ExportResult, CallError> {
        self.call(move |i| match &i.bindings {
            Bindings::Exporter(b) => b.profcol_plugin_export_batch().call_export(&mut i.store, &batch),
            Bindings::Processor(_) => Err(wasmtime::Error::msg("not an exporter plugin")),
        })
        .await
    }

    /// [`Plugin::process`] on the current thread.
    pub fn process_blocking(self: &Arc<Self>, batch: &[u8]) -> Result<ProcessResult, CallError> {
        self.call_blocking(|i| match &i.bindings {
            Bindings::Processor(b) => b.profcol_plugin_process_batch().call_process(&mut i.store, batch),
            Bindings::Exporter(_) => Err(wasmtime::Error::msg("not a processor plugin")),
        })
    }

    /// [`Plugin::export`] on the current thread.
    pub fn export_blocking(self: &Arc<Self>, batch: &[u8]) -> Result<ExportResult, CallError> {
        self.call_blocking(|i| match &i.bindings {
            Bindings::Exporter(b) => b.profcol_plugin_export_batch().call_export(&mut i.store, batch),
            Bindings::Processor(_) => Err(wasmtime::Error::msg("not an exporter plugin")),
        })
    }
}

/// The failure kind of a wasmtime error.
fn classify(e: &wasmtime::Error) -> FailureKind {
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => FailureKind::Timeout,
        Some(Trap::StackOverflow) => FailureKind::StackOverflow,
        Some(Trap::AllocationTooLarge) => FailureKind::Memory,
        _ => {
            let m = format!("{e:#}");
            if m.contains("forcing trap when growing memory") || m.contains("fuel allocated for hostcalls") {
                FailureKind::Memory
            } else {
                FailureKind::Trap
            }
        }
    }
}

/// A failure's message, with the end of what the instance wrote to stderr.
fn with_stderr(message: String, stderr: &sandbox::StderrTail) -> String {
    match stderr.take() {
        t if t.is_empty() => message,
        t => format!("{message}; the plugin's stderr: {t}"),
    }
}
