//! What a plugin's instance may touch: a WASI p2 context with nothing granted
//! but what `allow` names (environment variables, directories read-only), no
//! sockets, a wall clock stuck at the epoch; memory capped by store limits;
//! and the host imports (`log`, `counter-add`) bounded so a plugin cannot
//! flood the log or /metrics.

use crate::bindings::{processor::profcol::plugin as wit, Level};
use crate::metrics::{series, COUNTER};
use profcol_api::telemetry::{Counter, Telemetry};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use wasmtime::component::ResourceTable;
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// What the config grants a plugin beyond computing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Allow {
    /// Environment variables the plugin may read (values taken from
    /// profcol's environment when the instance is made).
    pub env: Vec<String>,
    /// Host directory -> path the plugin sees, read-only.
    pub dirs: BTreeMap<PathBuf, String>,
}

/// A wall clock that always says 1970: plugins get the monotonic clock only.
struct NoWallClock;

impl wasmtime_wasi::HostWallClock for NoWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

/// Bytes of a plugin's stderr kept: the end of what it wrote, for the log
/// line of a failed call (a Rust plugin's panic message goes there).
pub const STDERR_TAIL: usize = 2048;

/// An instance's stderr: keeps the last [`STDERR_TAIL`] bytes; writes never fail.
#[derive(Clone, Default)]
pub struct StderrTail(Arc<Mutex<VecDeque<u8>>>);

impl StderrTail {
    fn push(&self, bytes: &[u8]) {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        q.extend(&bytes[bytes.len().saturating_sub(STDERR_TAIL)..]);
        let excess = q.len().saturating_sub(STDERR_TAIL);
        q.drain(..excess);
    }

    pub fn clear(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// What was written since the last take, trimmed.
    pub fn take(&self) -> String {
        let mut q = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        String::from_utf8_lossy(q.make_contiguous()).trim().to_owned()
    }
}

impl IsTerminal for StderrTail {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for StderrTail {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for StderrTail {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }
    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 << 10)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for StderrTail {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for StderrTail {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Builds the WASI context of one instance; without `inherit_stdio`, its
/// stderr goes to `stderr`.
pub fn wasi(allow: &Allow, inherit_stdio: bool, stderr: &StderrTail) -> Result<WasiCtx, String> {
    let mut b = WasiCtxBuilder::new();
    b.allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false).wall_clock(NoWallClock);
    if inherit_stdio {
        b.inherit_stdout().inherit_stderr();
    } else {
        b.stderr(stderr.clone());
    }
    for name in &allow.env {
        if let Ok(v) = std::env::var(name) {
            b.env(name, v);
        }
    }
    for (host, guest) in &allow.dirs {
        b.preopened_dir(host, guest, FsPerms::ReadOnly)
            .map_err(|e| format!("allow.dirs: cannot open {}: {e:#}", host.display()))?;
    }
    Ok(b.build())
}

/// Host-side state shared by every instance of one plugin.
pub struct Shared {
    pub component: String,
    pub sha256: String,
    log: Mutex<LogBucket>,
    counters: Mutex<HashMap<String, Counter>>,
    registry: Telemetry,
}

/// Distinct counter names one plugin may create (bounds /metrics).
pub const MAX_COUNTERS: usize = 64;
/// Log lines a plugin may write per second, on average.
const LOG_RATE: f64 = 20.0;
/// ...and in one burst.
const LOG_BURST: f64 = 100.0;
/// Longest message kept.
const LOG_MAX_LEN: usize = 2048;

struct LogBucket {
    tokens: f64,
    last: Instant,
    suppressed: u64,
}

impl Shared {
    pub fn new(component: String, sha256: String, registry: Telemetry) -> Arc<Self> {
        Arc::new(Shared {
            component,
            sha256,
            log: Mutex::new(LogBucket { tokens: LOG_BURST, last: Instant::now(), suppressed: 0 }),
            counters: Mutex::new(HashMap::new()),
            registry,
        })
    }

    /// Token bucket: returns how many lines were suppressed before this one,
    /// or None when this one is suppressed too.
    fn admit_log(&self) -> Option<u64> {
        let mut b = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        b.tokens = (b.tokens + now.duration_since(b.last).as_secs_f64() * LOG_RATE).min(LOG_BURST);
        b.last = now;
        if b.tokens < 1.0 {
            b.suppressed += 1;
            return None;
        }
        b.tokens -= 1.0;
        Some(std::mem::take(&mut b.suppressed))
    }

    /// Reports the lines the rate limit dropped since the last line that
    /// went out (after each call: a flood's last lines are not left unsaid).
    pub fn report_suppressed(&self) {
        let suppressed = std::mem::take(&mut self.log.lock().unwrap_or_else(|p| p.into_inner()).suppressed);
        if suppressed > 0 {
            let (c, h) = (&self.component, &self.sha256[..12.min(self.sha256.len())]);
            tracing::warn!(component = %c, plugin_sha256 = %h, "plugin log rate limit: {suppressed} lines dropped");
        }
    }

    pub fn log(&self, level: Level, message: &str) {
        let Some(suppressed) = self.admit_log() else { return };
        let mut end = message.len().min(LOG_MAX_LEN);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let msg = &message[..end];
        let (c, h) = (&self.component, &self.sha256[..12.min(self.sha256.len())]);
        if suppressed > 0 {
            tracing::warn!(component = %c, plugin_sha256 = %h, "plugin log rate limit: {suppressed} lines dropped");
        }
        match level {
            Level::Trace => tracing::trace!(component = %c, plugin_sha256 = %h, "plugin: {msg}"),
            Level::Debug => tracing::debug!(component = %c, plugin_sha256 = %h, "plugin: {msg}"),
            Level::Info => tracing::info!(component = %c, plugin_sha256 = %h, "plugin: {msg}"),
            Level::Warn => tracing::warn!(component = %c, plugin_sha256 = %h, "plugin: {msg}"),
            Level::Error => tracing::error!(component = %c, plugin_sha256 = %h, "plugin: {msg}"),
        }
    }

    pub fn counter_add(&self, name: &str, value: u64) {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        let mut m = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = m.get(name) {
            c.add(value);
            return;
        }
        if !valid || m.len() >= MAX_COUNTERS {
            drop(m);
            self.log(
                Level::Warn,
                &format!(
                    "counter-add({name:?}) ignored: names are [a-z0-9_]{{1,64}}, at most {MAX_COUNTERS} per plugin"
                ),
            );
            return;
        }
        let c =
            self.registry.counter(&series(&COUNTER), COUNTER.help, &[("component", &self.component), ("name", name)]);
        c.add(value);
        m.insert(name.to_owned(), c);
    }
}

/// The data of one instance's store.
pub struct HostState {
    /// When the running call must end (checked at each epoch tick).
    pub call_deadline: Instant,
    wasi: WasiCtx,
    table: ResourceTable,
    pub limits: StoreLimits,
    shared: Arc<Shared>,
    /// The end of what the instance wrote to stderr.
    pub stderr: StderrTail,
}

impl HostState {
    pub fn new(wasi: WasiCtx, stderr: StderrTail, memory_limit: usize, shared: Arc<Shared>) -> Self {
        let limits = StoreLimitsBuilder::new()
            .memory_size(memory_limit)
            .table_elements(1 << 20)
            .trap_on_grow_failure(true)
            .build();
        HostState { call_deadline: Instant::now(), wasi, table: ResourceTable::new(), limits, shared, stderr }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl wit::host::Host for HostState {
    fn log(&mut self, level: Level, message: String) {
        self.shared.log(level, &message);
    }
    fn counter_add(&mut self, name: String, value: u64) {
        self.shared.counter_add(&name, value);
    }
}

impl wit::types::Host for HostState {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_is_rate_limited_and_counters_are_bounded() {
        let t = Telemetry::new();
        let s = Shared::new("wasm/x".into(), "ab".repeat(32), t.clone());
        let admitted = (0..10_000).filter(|_| s.admit_log().is_some()).count();
        // The burst, plus what the rate refills while the loop runs.
        assert!((100..=120).contains(&admitted), "{admitted} of 10000 lines admitted");
        for i in 0..MAX_COUNTERS + 10 {
            s.counter_add(&format!("c{i}"), 1);
        }
        s.counter_add("Bad Name", 1);
        let series = t.render().lines().filter(|l| l.starts_with("profcol_plugin_counter_total{")).count();
        assert_eq!(series, MAX_COUNTERS);
    }

    #[test]
    fn declared_series_keep_their_names() {
        use crate::metrics::{CALLS, CALL_DURATION, COMPILES, DISABLED, FAILURES};
        let names: Vec<String> = [COMPILES, CALLS, FAILURES, DISABLED, CALL_DURATION, COUNTER]
            .iter()
            .chain(crate::metrics::EXPORTER.last())
            .map(series)
            .collect();
        assert_eq!(
            names,
            [
                "profcol_plugin_compiles_total",
                "profcol_plugin_calls_total",
                "profcol_plugin_failures_total",
                "profcol_plugin_disabled",
                "profcol_plugin_call_duration_seconds",
                "profcol_plugin_counter_total",
                "profcol_plugin_pending_output_bytes",
            ]
        );
    }
}
