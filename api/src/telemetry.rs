//! Self-telemetry: the instruments components record through, backed by the
//! OpenTelemetry SDK's meter provider.
//!
//! A component gets its handles once (at build time) and records with one
//! relaxed atomic add: the Rust SDK has no stable bound instruments, so a
//! synchronous `Counter::add` would hash its attribute set on every call.
//! Instead each series is an atomic cell, and each metric family is one
//! *observable* OTel instrument whose callback reads the family's cells when a
//! reader collects. Every exit (the Prometheus pull reader rendered by
//! `opentelemetry-prometheus`, the OTLP periodic readers the host adds)
//! collects the same instruments from the same provider: there is no second
//! registry. Durations are synchronous OTel histograms (recorded per export,
//! not per sample).
//!
//! A component whose numbers live elsewhere (a store's own atomics) copies
//! them into its series in a hook run when a reader collects
//! ([`Telemetry::on_collect`]), not on a timer of its own: an idle agent
//! wakes for nothing.
//!
//! Series are registered by (name, labels); registering the same pair again
//! (a component rebuilt by a reload) returns the same cell, so counts survive
//! reloads. The cells exist at every [`Level`]; a series whose level is above
//! the configured one is never registered with the SDK, so no reader sees it.

use crate::component_id::{ComponentId, Kind};
use opentelemetry::metrics::{Histogram, Meter, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::{MeterProviderBuilder, SdkMeterProvider, Stream};
use opentelemetry_sdk::Resource;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How much the collector reports about itself (`service.telemetry.metrics.level`,
/// the OTel Collector's levels).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// No metrics: no reader is built and nothing is served.
    None,
    /// The host's counters only: receiver accepted/refused, processor
    /// incoming/outgoing/dropped/refused, exporter sent/send_failed/refused/dropped,
    /// queue size and capacity.
    Basic,
    /// Basic, plus every component's own series and export latency (sum and count).
    #[default]
    Normal,
    /// Normal, plus latency histograms with buckets.
    Detailed,
}

/// Series one family may hold in the SDK (its cardinality limit); a series
/// beyond it is summed into the SDK's overflow series
/// (`otel_metric_overflow="true"`). A family has one series per component
/// id (times a short list of reasons or outcomes), so a config would need
/// hundreds of components to reach it. Why set it: the SDK sizes each
/// instrument's table for its limit up front, and its default (2,000)
/// made every instrument a 132 KiB table, 0.3–0.7 MiB resident over a
/// node agent's instruments (docs/PERFORMANCE.md).
pub(crate) const SERIES_PER_FAMILY: usize = 256;

/// Bucket bounds (seconds) of duration histograms at [`Level::Detailed`];
/// below it a histogram carries sum and count only.
const DETAILED_SECONDS_BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

/// What kind of cell a declared series is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
    /// A histogram of durations (`_sum`, `_count`, `_bucket`).
    Timer,
}

/// One series of a component, declared once as a `const` beside the
/// component: its name after `profcol_<kind>_` (the unit is part of the name,
/// counters end in `_total`), its unit, the label it adds beside the
/// component's own (`outcome`, `reason`), and its help text. The component
/// registers its cells from these, and its factory lists them
/// ([`crate::Factory::metrics`]) so that docs/CONFIG.md's table is checked
/// against what is registered.
#[derive(Clone, Copy, Debug)]
pub struct MetricDef {
    pub name: &'static str,
    pub kind: MetricKind,
    /// `samples`, `frames`, `bytes`, `seconds`, `microseconds`, `1` (a count of things the name says).
    pub unit: &'static str,
    pub label: Option<&'static str>,
    /// A second label (after [`Self::label`]), its values given at registration.
    pub label2: Option<&'static str>,
    pub help: &'static str,
    /// The name's middle part when it is not the component's kind (the
    /// plugin host's `profcol_plugin_*`, shared by processor and exporter plugins).
    pub scope: Option<&'static str>,
}

impl MetricDef {
    pub const fn counter(name: &'static str, unit: &'static str, help: &'static str) -> Self {
        MetricDef { name, kind: MetricKind::Counter, unit, label: None, label2: None, help, scope: None }
    }

    pub const fn gauge(name: &'static str, unit: &'static str, help: &'static str) -> Self {
        MetricDef { name, kind: MetricKind::Gauge, unit, label: None, label2: None, help, scope: None }
    }

    pub const fn timer(name: &'static str, help: &'static str) -> Self {
        MetricDef { name, kind: MetricKind::Timer, unit: "seconds", label: None, label2: None, help, scope: None }
    }

    /// The same series with one more label (its values are given at registration).
    pub const fn by(self, label: &'static str) -> Self {
        MetricDef { label: Some(label), ..self }
    }

    /// The same series with a second label after [`Self::by`]'s.
    pub const fn and_by(self, label: &'static str) -> Self {
        MetricDef { label2: Some(label), ..self }
    }

    /// The same series named `profcol_<scope>_<name>` whatever the component's kind.
    pub const fn under(self, scope: &'static str) -> Self {
        MetricDef { scope: Some(scope), ..self }
    }

    /// The full series name for a component of `kind`.
    pub fn full_name(&self, kind: Kind) -> String {
        format!("profcol_{}_{}", self.scope.unwrap_or(kind.as_str()), self.name)
    }
}

/// A monotonically increasing count. A series named `*_seconds_total`
/// counts nanoseconds and is shown in seconds.
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn inc(&self) {
        self.add(1)
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Clone, Debug, Default)]
pub struct Gauge(Arc<AtomicI64>);

impl Gauge {
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    pub fn add(&self, v: i64) {
        self.0.fetch_add(v, Ordering::Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Durations: an OTel histogram in seconds (sum and count; buckets at
/// [`Level::Detailed`]), plus the count for callers that read it back.
#[derive(Clone, Default)]
pub struct Timer {
    histogram: Option<(Histogram<f64>, Arc<[KeyValue]>)>,
    count: Counter,
}

impl Timer {
    pub fn record(&self, d: Duration) {
        if let Some((h, attrs)) = &self.histogram {
            h.record(d.as_secs_f64(), attrs);
        }
        self.count.inc();
    }
    pub fn count(&self) -> u64 {
        self.count.get()
    }
}

impl std::fmt::Debug for Timer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timer").field("count", &self.count()).finish()
    }
}

#[derive(Clone)]
enum Cell {
    Counter(Counter),
    Gauge(Gauge),
    Timer(Timer),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum CellKind {
    Counter,
    Gauge,
    Timer,
}

/// The series of one family: what its observable callback reads.
type Series<C> = Arc<Mutex<Vec<(Vec<KeyValue>, C)>>>;

enum FamilyCells {
    Counter(Series<Counter>),
    Gauge(Series<Gauge>),
    /// Timers record into their histogram themselves.
    Timer(Option<Histogram<f64>>),
}

struct Family {
    kind: CellKind,
    cells: FamilyCells,
    /// Rendered label set → cell, for the same-pair-same-cell rule.
    by_labels: BTreeMap<String, Cell>,
}

struct Inner {
    level: Level,
    /// `None` at [`Level::None`]: no provider, no reader, nothing registered.
    sdk: Option<Sdk>,
    families: Mutex<BTreeMap<String, Family>>,
    hooks: Arc<Hooks>,
}

/// What runs before a family's callback reads its cells: (id, hook).
type Hooks = Mutex<Vec<(u64, Arc<dyn Fn() + Send + Sync>)>>;

/// Runs every hook (outside the lock: a hook may take a while, or collect).
fn run_hooks(hooks: &Hooks) {
    let now: Vec<Arc<dyn Fn() + Send + Sync>> =
        hooks.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|h| h.1.clone()).collect();
    for h in now {
        h();
    }
}

/// A hook registered by [`Telemetry::on_collect`]; dropping it removes it.
#[must_use = "the hook is removed when this is dropped"]
pub struct CollectHook {
    hooks: std::sync::Weak<Hooks>,
    id: u64,
}

impl Drop for CollectHook {
    fn drop(&mut self) {
        if let Some(h) = self.hooks.upgrade() {
            h.lock().unwrap_or_else(|p| p.into_inner()).retain(|e| e.0 != self.id);
        }
    }
}

struct Sdk {
    provider: SdkMeterProvider,
    meter: Meter,
    /// The pull exit's registry (`opentelemetry-prometheus` collects into it).
    prometheus: Option<prometheus::Registry>,
}

/// How a [`Telemetry`] is built: level, resource, readers.
pub struct TelemetryBuilder {
    level: Level,
    provider: MeterProviderBuilder,
    pull: bool,
}

impl TelemetryBuilder {
    /// The collector's own resource (service.name, host.name, ...).
    pub fn resource(mut self, resource: Resource) -> Self {
        self.provider = self.provider.with_resource(resource);
        self
    }

    /// Keep a Prometheus pull reader, rendered by [`Telemetry::render`]
    /// (default on).
    pub fn prometheus(mut self, on: bool) -> Self {
        self.pull = on;
        self
    }

    /// Adds a reader (the host's OTLP periodic readers). Ignored at [`Level::None`].
    pub fn reader<R: opentelemetry_sdk::metrics::reader::MetricReader>(mut self, reader: R) -> Self {
        if self.level != Level::None {
            self.provider = self.provider.with_reader(reader);
        }
        self
    }

    pub fn build(self) -> Telemetry {
        let sdk = (self.level != Level::None).then(|| {
            let mut provider = self.provider.with_view(|_: &opentelemetry_sdk::metrics::Instrument| {
                Stream::builder().with_cardinality_limit(SERIES_PER_FAMILY).build().ok()
            });
            let mut prometheus = None;
            if self.pull {
                let registry = prometheus::Registry::new();
                // Today's text names: no unit suffixes, no otel_scope labels,
                // no target_info (docs/CONFIG.md lists the names).
                let exporter = opentelemetry_prometheus::exporter()
                    .with_registry(registry.clone())
                    .without_units()
                    .without_target_info()
                    .scope_info_enabled(false)
                    .build();
                match exporter {
                    Ok(e) => {
                        provider = provider.with_reader(e);
                        prometheus = Some(registry);
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot build the Prometheus reader; /metrics will be empty"),
                }
            }
            let provider = provider.build();
            let meter = provider.meter("profcol");
            Sdk { provider, meter, prometheus }
        });
        Telemetry {
            inner: Arc::new(Inner {
                level: self.level,
                sdk,
                families: Mutex::new(BTreeMap::new()),
                hooks: Arc::default(),
            }),
        }
    }
}

/// The process-wide instruments and the meter provider behind them.
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

impl Telemetry {
    /// Level `normal` with a Prometheus pull reader and an empty resource
    /// (tests and tools; the host builds through [`Telemetry::builder`]).
    pub fn new() -> Self {
        Self::builder(Level::Normal).build()
    }

    pub fn builder(level: Level) -> TelemetryBuilder {
        TelemetryBuilder { level, provider: SdkMeterProvider::builder(), pull: true }
    }

    pub fn level(&self) -> Level {
        self.inner.level
    }

    /// Collects every reader now (periodic readers push their OTLP batch).
    pub fn force_flush(&self) {
        if let Some(sdk) = &self.inner.sdk {
            if let Err(e) = sdk.provider.force_flush() {
                tracing::debug!(error = %e, "metrics flush failed");
            }
        }
    }

    /// Runs `hook` whenever a reader collects, before any series is read
    /// (so series it sets are current in that collection), until the
    /// returned guard is dropped. It runs once per family read, so it must
    /// be cheap and idempotent (copy a few atomics), and must not register
    /// series or hooks.
    pub fn on_collect(&self, hook: impl Fn() + Send + Sync + 'static) -> CollectHook {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        self.inner.hooks.lock().unwrap_or_else(|p| p.into_inner()).push((id, Arc::new(hook)));
        CollectHook { hooks: Arc::downgrade(&self.inner.hooks), id }
    }

    /// Flushes and stops the readers (at process exit).
    pub fn shutdown(&self) {
        if let Some(sdk) = &self.inner.sdk {
            let _ = sdk.provider.shutdown();
        }
    }

    fn cell(&self, name: &str, help: &str, labels: &[(&str, &str)], kind: CellKind, level: Level) -> Cell {
        let mut families = self.inner.families.lock().unwrap_or_else(|p| p.into_inner());
        if !families.contains_key(name) {
            let cells = self.register(name, help, kind, level);
            families.insert(name.to_owned(), Family { kind, cells, by_labels: BTreeMap::new() });
        }
        let Some(fam) = families.get_mut(name) else { return detached(kind) };
        if fam.kind != kind {
            // One name, two kinds: a programming error; the second never exports.
            return detached(kind);
        }
        let key = render_labels(labels);
        if let Some(c) = fam.by_labels.get(&key) {
            return c.clone();
        }
        let attrs: Vec<KeyValue> = labels.iter().map(|(k, v)| KeyValue::new(k.to_string(), v.to_string())).collect();
        let cell = match &fam.cells {
            FamilyCells::Counter(s) => {
                let c = Counter::default();
                s.lock().unwrap_or_else(|p| p.into_inner()).push((attrs, c.clone()));
                Cell::Counter(c)
            }
            FamilyCells::Gauge(s) => {
                let g = Gauge::default();
                s.lock().unwrap_or_else(|p| p.into_inner()).push((attrs, g.clone()));
                Cell::Gauge(g)
            }
            FamilyCells::Timer(h) => {
                Cell::Timer(Timer { histogram: h.clone().map(|h| (h, attrs.into())), count: Counter::default() })
            }
        };
        fam.by_labels.insert(key, cell.clone());
        cell
    }

    /// Registers a family's instrument with the SDK, when its level is on.
    fn register(&self, name: &str, help: &str, kind: CellKind, level: Level) -> FamilyCells {
        let meter = match &self.inner.sdk {
            Some(sdk) if level <= self.inner.level => Some(&sdk.meter),
            _ => None,
        };
        let help = help.to_owned();
        match kind {
            CellKind::Counter => {
                let series: Series<Counter> = Arc::default();
                if let Some(meter) = meter {
                    // OTel counters carry no `_total`; the Prometheus exit adds it back.
                    let otel_name = name.strip_suffix("_total").unwrap_or(name).to_owned();
                    let (s, hooks) = (series.clone(), self.inner.hooks.clone());
                    if name.ends_with("_seconds_total") {
                        // A counter of seconds counts nanoseconds (an
                        // atomic adds whole units) and shows seconds.
                        meter
                            .f64_observable_counter(otel_name)
                            .with_description(help)
                            .with_callback(move |obs| {
                                run_hooks(&hooks);
                                for (attrs, c) in s.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                                    obs.observe(c.get() as f64 / 1e9, attrs);
                                }
                            })
                            .build();
                        return FamilyCells::Counter(series);
                    }
                    meter
                        .u64_observable_counter(otel_name)
                        .with_description(help)
                        .with_callback(move |obs| {
                            run_hooks(&hooks);
                            for (attrs, c) in s.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                                obs.observe(c.get(), attrs);
                            }
                        })
                        .build();
                }
                FamilyCells::Counter(series)
            }
            CellKind::Gauge => {
                let series: Series<Gauge> = Arc::default();
                if let Some(meter) = meter {
                    let (s, hooks) = (series.clone(), self.inner.hooks.clone());
                    meter
                        .i64_observable_gauge(name.to_owned())
                        .with_description(help)
                        .with_callback(move |obs| {
                            run_hooks(&hooks);
                            for (attrs, g) in s.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                                obs.observe(g.get(), attrs);
                            }
                        })
                        .build();
                }
                FamilyCells::Gauge(series)
            }
            CellKind::Timer => FamilyCells::Timer(meter.map(|meter| {
                let buckets =
                    if self.inner.level >= Level::Detailed { DETAILED_SECONDS_BUCKETS.to_vec() } else { Vec::new() };
                meter
                    .f64_histogram(name.to_owned())
                    .with_description(help)
                    .with_unit("s")
                    .with_boundaries(buckets)
                    .build()
            })),
        }
    }

    /// A series of [`Level::Normal`] (a component's own).
    pub fn counter(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Counter {
        self.counter_at(Level::Normal, name, help, labels)
    }

    pub fn gauge(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Gauge {
        self.gauge_at(Level::Normal, name, help, labels)
    }

    pub fn timer(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Timer {
        match self.cell(name, help, labels, CellKind::Timer, Level::Normal) {
            Cell::Timer(t) => t,
            _ => Timer::default(),
        }
    }

    fn counter_at(&self, level: Level, name: &str, help: &str, labels: &[(&str, &str)]) -> Counter {
        match self.cell(name, help, labels, CellKind::Counter, level) {
            Cell::Counter(c) => c,
            _ => Counter::default(),
        }
    }

    fn gauge_at(&self, level: Level, name: &str, help: &str, labels: &[(&str, &str)]) -> Gauge {
        match self.cell(name, help, labels, CellKind::Gauge, level) {
            Cell::Gauge(g) => g,
            _ => Gauge::default(),
        }
    }

    /// The standard handles of one component.
    pub fn component(&self, kind: Kind, id: &ComponentId) -> ComponentTelemetry {
        let ids = id.to_string();
        let l = [(kind.as_str(), ids.as_str())];
        let k = kind.as_str();
        let basic = Level::Basic;
        ComponentTelemetry {
            // Processors count what went in and out, exporters what they sent
            // (the OTel Collector's names).
            accepted: match kind {
                Kind::Processor | Kind::Exporter => Counter::default(),
                _ => self.counter_at(basic, &format!("profcol_{k}_accepted_samples_total"), "Samples accepted.", &l),
            },
            sent: match kind {
                Kind::Exporter => self.counter_at(
                    basic,
                    &format!("profcol_{k}_sent_samples_total"),
                    "Samples the backend took (a partial success counts what it did not reject).",
                    &l,
                ),
                _ => Counter::default(),
            },
            incoming: match kind {
                Kind::Processor => self.counter_at(
                    basic,
                    &format!("profcol_{k}_incoming_samples_total"),
                    "Samples handed to the processor.",
                    &l,
                ),
                _ => Counter::default(),
            },
            outgoing: match kind {
                Kind::Processor => self.counter_at(
                    basic,
                    &format!("profcol_{k}_outgoing_samples_total"),
                    "Samples the processor passed on (after merging or changing them).",
                    &l,
                ),
                _ => Counter::default(),
            },
            refused: self.counter_at(
                basic,
                &format!("profcol_{k}_refused_samples_total"),
                "Samples refused downstream.",
                &l,
            ),
            dropped: self.counter_at(basic, &format!("profcol_{k}_dropped_samples_total"), "Samples dropped.", &l),
            // The sending-queue cells mean something for exporters only; other
            // kinds get unregistered ones, so /metrics shows no always-zero series.
            send_failed: match kind {
                Kind::Exporter => self.counter_at(
                    basic,
                    &format!("profcol_{k}_send_failed_samples_total"),
                    "Samples whose export failed for good.",
                    &l,
                ),
                _ => Counter::default(),
            },
            queue_size: match kind {
                Kind::Exporter => self.gauge_at(
                    basic,
                    &format!("profcol_{k}_queue_size"),
                    "What the sending queue holds (waiting or being sent), in the unit of sending_queue.sizer.",
                    &l,
                ),
                _ => Gauge::default(),
            },
            queue_capacity: match kind {
                Kind::Exporter => self.gauge_at(
                    basic,
                    &format!("profcol_{k}_queue_capacity"),
                    "The sending queue's bound (sending_queue.queue_size), in the unit of sending_queue.sizer.",
                    &l,
                ),
                _ => Gauge::default(),
            },
            export_latency: match kind {
                Kind::Exporter => {
                    self.timer(&format!("profcol_{k}_export_latency"), "Time of successful export calls.", &l)
                }
                _ => Timer::default(),
            },
            registry: self.clone(),
            kind,
            id: id.clone(),
        }
    }

    /// Prometheus text exposition format, as the pull reader collects it now
    /// (empty at [`Level::None`] or without a pull reader).
    pub fn render(&self) -> String {
        let Some(registry) = self.inner.sdk.as_ref().and_then(|s| s.prometheus.as_ref()) else {
            return String::new();
        };
        prometheus::TextEncoder::new().encode_to_string(&registry.gather()).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot encode /metrics");
            String::new()
        })
    }
}

fn detached(kind: CellKind) -> Cell {
    match kind {
        CellKind::Counter => Cell::Counter(Counter::default()),
        CellKind::Gauge => Cell::Gauge(Gauge::default()),
        CellKind::Timer => Cell::Timer(Timer::default()),
    }
}

/// The key of a label set (also the Prometheus form, for readability in tests).
fn render_labels(labels: &[(&str, &str)]) -> String {
    let mut s = String::new();
    for (k, v) in labels {
        s.push_str(k);
        s.push('=');
        s.push_str(&v.replace('\\', "\\\\").replace(',', "\\,"));
        s.push(',');
    }
    s
}

/// The standard counters of one component, plus access to the registry for
/// component-specific ones.
#[derive(Clone)]
pub struct ComponentTelemetry {
    /// Receivers (and extensions): samples taken.
    pub accepted: Counter,
    /// Exporters only: samples the backend took.
    pub sent: Counter,
    /// Processors only: samples in, and samples passed on.
    pub incoming: Counter,
    pub outgoing: Counter,
    pub refused: Counter,
    pub dropped: Counter,
    pub send_failed: Counter,
    pub queue_size: Gauge,
    pub queue_capacity: Gauge,
    pub export_latency: Timer,
    registry: Telemetry,
    kind: Kind,
    id: ComponentId,
}

impl ComponentTelemetry {
    /// The current value of this component's counter `name` (the part after
    /// `profcol_<kind>_`), for tests and tools that read a series back.
    pub fn counter_value(&self, name: &str) -> u64 {
        let ids = self.id.to_string();
        let full = format!("profcol_{}_{name}", self.kind.as_str());
        self.registry.counter(&full, "", &[(self.kind.as_str(), &ids)]).get()
    }

    /// The current value of this component's gauge `name`, as [`Self::counter_value`].
    pub fn gauge_value(&self, name: &str) -> i64 {
        let ids = self.id.to_string();
        let full = format!("profcol_{}_{name}", self.kind.as_str());
        self.registry.gauge(&full, "", &[(self.kind.as_str(), &ids)]).get()
    }

    /// The counter `def` declares, labelled with this component's id.
    pub fn counter_of(&self, def: &MetricDef) -> Counter {
        debug_assert!(def.kind == MetricKind::Counter && def.label.is_none(), "{} is not a plain counter", def.name);
        let ids = self.id.to_string();
        self.registry.counter(&def.full_name(self.kind), def.help, &[(self.kind.as_str(), &ids)])
    }

    /// The counter `def` declares for one value of its label.
    pub fn counter_by(&self, def: &MetricDef, value: &str) -> Counter {
        debug_assert!(def.kind == MetricKind::Counter, "{} is not a counter", def.name);
        let key = def.label.unwrap_or("outcome");
        let ids = self.id.to_string();
        self.registry.counter(&def.full_name(self.kind), def.help, &[(self.kind.as_str(), &ids), (key, value)])
    }

    /// The counter `def` declares for one value of each of its two labels.
    pub fn counter_by2(&self, def: &MetricDef, value: &str, value2: &str) -> Counter {
        debug_assert!(def.kind == MetricKind::Counter && def.label2.is_some(), "{} has no second label", def.name);
        let (key, key2) = (def.label.unwrap_or("outcome"), def.label2.unwrap_or("reason"));
        let ids = self.id.to_string();
        self.registry.counter(
            &def.full_name(self.kind),
            def.help,
            &[(self.kind.as_str(), &ids), (key, value), (key2, value2)],
        )
    }

    /// The gauge `def` declares for one value of its label.
    pub fn gauge_by(&self, def: &MetricDef, value: &str) -> Gauge {
        debug_assert!(def.kind == MetricKind::Gauge && def.label.is_some(), "{} has no label", def.name);
        let key = def.label.unwrap_or("outcome");
        let ids = self.id.to_string();
        self.registry.gauge(&def.full_name(self.kind), def.help, &[(self.kind.as_str(), &ids), (key, value)])
    }

    /// The gauge `def` declares, labelled with this component's id.
    pub fn gauge_of(&self, def: &MetricDef) -> Gauge {
        debug_assert!(def.kind == MetricKind::Gauge && def.label.is_none(), "{} is not a plain gauge", def.name);
        let ids = self.id.to_string();
        self.registry.gauge(&def.full_name(self.kind), def.help, &[(self.kind.as_str(), &ids)])
    }

    /// The registry, for series with labels of their own (a plugin's
    /// `component` plus `outcome`, `kind` or `name`).
    pub fn registry(&self) -> &Telemetry {
        &self.registry
    }

    /// Handles for tests and tools that run a component outside a host.
    pub fn detached(kind: Kind, id: &ComponentId) -> Self {
        Telemetry::new().component(kind, id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hook sets its series as each collection reads them, and stops
    /// when its guard is dropped.
    #[test]
    fn collect_hooks_run_when_a_reader_collects_until_dropped() {
        let t = Telemetry::new();
        let id: ComponentId = "kernel_symbols".parse().unwrap();
        let g = t.component(Kind::Processor, &id).gauge_of(&MetricDef::gauge("hooked", "1", "set at collection"));
        let source = Arc::new(AtomicI64::new(5));
        let hook = t.on_collect({
            let (g, source) = (g.clone(), source.clone());
            move || g.set(source.load(Ordering::Relaxed))
        });
        assert_eq!(g.get(), 0, "nothing ran before a collection");
        assert!(t.render().contains("profcol_processor_hooked{processor=\"kernel_symbols\"} 5"), "{}", t.render());
        source.store(9, Ordering::Relaxed);
        assert!(t.render().contains("profcol_processor_hooked{processor=\"kernel_symbols\"} 9"));
        drop(hook);
        source.store(11, Ordering::Relaxed);
        assert!(t.render().contains("profcol_processor_hooked{processor=\"kernel_symbols\"} 9"), "dropped: not run");
    }

    #[test]
    fn same_component_shares_cells_and_renders() {
        let t = Telemetry::new();
        let id: ComponentId = "file/in".parse().unwrap();
        t.component(Kind::Receiver, &id).accepted.add(3);
        t.component(Kind::Receiver, &id).accepted.add(4);
        let text = t.render();
        assert!(text.contains("profcol_receiver_accepted_samples_total{receiver=\"file/in\"} 7"), "{text}");
        assert!(!text.contains("profcol_receiver_queue_size"), "{text}");
        let x: ComponentId = "otlp".parse().unwrap();
        t.component(Kind::Exporter, &x).queue_size.set(2);
        assert!(t.render().contains("profcol_exporter_queue_size{exporter=\"otlp\"} 2"));
        let b: ComponentId = "batch".parse().unwrap();
        t.component(Kind::Processor, &b).incoming.add(5);
        let text = t.render();
        assert!(text.contains("profcol_processor_incoming_samples_total{processor=\"batch\"} 5"), "{text}");
        assert!(!text.contains("profcol_processor_accepted"), "{text}");
        assert!(text.contains("# TYPE profcol_processor_incoming_samples_total counter"), "{text}");
    }

    #[test]
    fn a_family_keeps_its_series_up_to_the_limit_then_overflows() {
        let t = Telemetry::new();
        for i in 0..SERIES_PER_FAMILY {
            let id: ComponentId = format!("file/in{i}").parse().unwrap();
            t.component(Kind::Receiver, &id).accepted.add(1);
        }
        let text = t.render();
        let series =
            |text: &str| text.lines().filter(|l| l.starts_with("profcol_receiver_accepted_samples_total{")).count();
        assert_eq!(series(&text), SERIES_PER_FAMILY, "every series within the limit is its own");
        assert!(!text.contains("otel_metric_overflow"), "no overflow within the limit");
        let over: ComponentId = "file/over".parse().unwrap();
        t.component(Kind::Receiver, &over).accepted.add(5);
        let text = t.render();
        assert!(
            text.contains("profcol_receiver_accepted_samples_total{otel_metric_overflow=\"true\"} 5"),
            "the series past the limit is summed into the overflow series: {text}"
        );
        // The view sets only the limit: histograms keep their unit and buckets.
        let x: ComponentId = "otlp".parse().unwrap();
        t.component(Kind::Exporter, &x).export_latency.record(Duration::from_millis(3));
        assert!(t.render().contains("profcol_exporter_export_latency_count{exporter=\"otlp\"} 1"));
    }

    #[test]
    fn levels_gate_what_the_readers_see() {
        let id: ComponentId = "otlp".parse().unwrap();
        let none = Telemetry::builder(Level::None).build();
        let c = none.component(Kind::Exporter, &id);
        c.sent.add(2);
        assert_eq!(c.sent.get(), 2, "cells count at every level");
        assert_eq!(none.render(), "");

        let basic = Telemetry::builder(Level::Basic).build();
        let c = basic.component(Kind::Exporter, &id);
        c.sent.add(2);
        c.counter_of(&MetricDef::counter("retryable_errors_total", "1", "x")).add(1);
        c.export_latency.record(Duration::from_millis(3));
        let text = basic.render();
        assert!(text.contains("profcol_exporter_sent_samples_total{exporter=\"otlp\"} 2"), "{text}");
        assert!(!text.contains("retryable_errors"), "{text}");
        assert!(!text.contains("export_latency"), "{text}");

        let normal = Telemetry::new();
        normal.component(Kind::Exporter, &id).export_latency.record(Duration::from_millis(3));
        let text = normal.render();
        assert!(text.contains("profcol_exporter_export_latency_count{exporter=\"otlp\"} 1"), "{text}");
        assert!(!text.contains("le=\"0.005\""), "no buckets below detailed: {text}");

        let detailed = Telemetry::builder(Level::Detailed).build();
        detailed.component(Kind::Exporter, &id).export_latency.record(Duration::from_millis(3));
        let text = detailed.render();
        assert!(text.contains("profcol_exporter_export_latency_bucket{exporter=\"otlp\",le=\"0.005\"} 1"), "{text}");
    }
}
