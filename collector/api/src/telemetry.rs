//! Self-telemetry: per-component counters, rendered as Prometheus text.
//!
//! Metrics are registered by (name, component id); registering the same pair
//! again (a component rebuilt by a reload) returns the same cell, so counts
//! survive reloads.

use crate::component::{ComponentId, Kind};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A monotonically increasing count.
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

/// Sum and count of durations (a Prometheus summary without quantiles).
#[derive(Clone, Debug, Default)]
pub struct Timer {
    sum_us: Counter,
    count: Counter,
}

impl Timer {
    pub fn record(&self, d: Duration) {
        self.sum_us.add(d.as_micros() as u64);
        self.count.inc();
    }
    pub fn count(&self) -> u64 {
        self.count.get()
    }
}

/// Durations counted into fixed buckets (a Prometheus histogram, seconds).
#[derive(Clone, Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One count per bound (non-cumulative), then +Inf.
    buckets: Arc<[AtomicU64]>,
    sum_us: Counter,
}

impl Histogram {
    /// Bounds in seconds from 50 µs to 10 s: fits calls from a no-op to a timeout.
    pub const CALL_SECONDS: &'static [f64] =
        &[0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 10.0];

    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: Counter::default(),
        }
    }

    pub fn record(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self.bounds.iter().position(|b| s <= *b).unwrap_or(self.bounds.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.add(d.as_micros() as u64);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }
}

#[derive(Clone)]
enum Cell {
    Counter(Counter),
    Gauge(Gauge),
    Timer(Timer),
    Histogram(Histogram),
}

#[derive(Default)]
struct Family {
    help: String,
    cells: BTreeMap<String, Cell>,
}

/// The process-wide metric registry.
#[derive(Clone, Default)]
pub struct Telemetry {
    families: Arc<Mutex<BTreeMap<String, Family>>>,
}

impl Telemetry {
    pub fn new() -> Self {
        Self::default()
    }

    fn cell(&self, name: &str, help: &str, labels: String, make: impl FnOnce() -> Cell) -> Cell {
        let mut f = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let fam = f.entry(name.to_owned()).or_insert_with(|| Family { help: help.to_owned(), cells: BTreeMap::new() });
        fam.cells.entry(labels).or_insert_with(make).clone()
    }

    pub fn counter(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Counter {
        match self.cell(name, help, render_labels(labels), || Cell::Counter(Counter::default())) {
            Cell::Counter(c) => c,
            _ => Counter::default(),
        }
    }

    pub fn gauge(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Gauge {
        match self.cell(name, help, render_labels(labels), || Cell::Gauge(Gauge::default())) {
            Cell::Gauge(g) => g,
            _ => Gauge::default(),
        }
    }

    pub fn timer(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Timer {
        match self.cell(name, help, render_labels(labels), || Cell::Timer(Timer::default())) {
            Cell::Timer(t) => t,
            _ => Timer::default(),
        }
    }

    /// A histogram of durations with the given bucket bounds (seconds).
    pub fn histogram(&self, name: &str, help: &str, labels: &[(&str, &str)], bounds: &'static [f64]) -> Histogram {
        match self.cell(name, help, render_labels(labels), || Cell::Histogram(Histogram::new(bounds))) {
            Cell::Histogram(h) => h,
            _ => Histogram::new(bounds),
        }
    }

    /// The standard handles of one component.
    pub fn component(&self, kind: Kind, id: &ComponentId) -> ComponentTelemetry {
        let ids = id.to_string();
        let l = [(kind.as_str(), ids.as_str())];
        let k = kind.as_str();
        ComponentTelemetry {
            // Processors count what went in and out, exporters what they sent
            // (the OTel Collector's names).
            accepted: match kind {
                Kind::Processor | Kind::Exporter => Counter::default(),
                _ => self.counter(&format!("profcol_{k}_accepted_samples_total"), "Samples accepted.", &l),
            },
            sent: match kind {
                Kind::Exporter => self.counter(
                    &format!("profcol_{k}_sent_samples_total"),
                    "Samples the backend took (a partial success counts what it did not reject).",
                    &l,
                ),
                _ => Counter::default(),
            },
            incoming: match kind {
                Kind::Processor => {
                    self.counter(&format!("profcol_{k}_incoming_samples_total"), "Samples handed to the processor.", &l)
                }
                _ => Counter::default(),
            },
            outgoing: match kind {
                Kind::Processor => self.counter(
                    &format!("profcol_{k}_outgoing_samples_total"),
                    "Samples the processor passed on (after merging or changing them).",
                    &l,
                ),
                _ => Counter::default(),
            },
            refused: self.counter(&format!("profcol_{k}_refused_samples_total"), "Samples refused downstream.", &l),
            dropped: self.counter(&format!("profcol_{k}_dropped_samples_total"), "Samples dropped.", &l),
            // The sending-queue cells mean something for exporters only; other
            // kinds get unregistered ones, so /metrics shows no always-zero series.
            send_failed: match kind {
                Kind::Exporter => self.counter(
                    &format!("profcol_{k}_send_failed_samples_total"),
                    "Samples whose export failed for good.",
                    &l,
                ),
                _ => Counter::default(),
            },
            queue_size: match kind {
                Kind::Exporter => self.gauge(
                    &format!("profcol_{k}_queue_size"),
                    "What the sending queue holds (waiting or being sent), in the unit of sending_queue.sizer.",
                    &l,
                ),
                _ => Gauge::default(),
            },
            queue_capacity: match kind {
                Kind::Exporter => self.gauge(
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

    /// Prometheus text exposition format.
    pub fn render(&self) -> String {
        let f = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        for (name, fam) in f.iter() {
            let ty = match fam.cells.values().next() {
                Some(Cell::Counter(_)) => "counter",
                Some(Cell::Gauge(_)) => "gauge",
                Some(Cell::Timer(_)) => "summary",
                Some(Cell::Histogram(_)) => "histogram",
                None => continue,
            };
            let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} {ty}", fam.help);
            for (labels, cell) in &fam.cells {
                let _ = match cell {
                    Cell::Counter(c) => writeln!(out, "{name}{labels} {}", c.get()),
                    Cell::Gauge(g) => writeln!(out, "{name}{labels} {}", g.get()),
                    Cell::Timer(t) => writeln!(
                        out,
                        "{name}_sum{labels} {}\n{name}_count{labels} {}",
                        t.sum_us.get() as f64 / 1e6,
                        t.count.get()
                    ),
                    Cell::Histogram(h) => render_histogram(&mut out, name, labels, h),
                };
            }
        }
        out
    }
}

fn render_histogram(out: &mut String, name: &str, labels: &str, h: &Histogram) -> std::fmt::Result {
    // `le` joins the series' own labels inside one pair of braces.
    let with_le = |le: &str| match labels.strip_suffix('}') {
        Some(l) => format!("{l},le=\"{le}\"}}"),
        None => format!("{{le=\"{le}\"}}"),
    };
    let mut cumulative = 0;
    for (i, b) in h.buckets.iter().enumerate() {
        cumulative += b.load(Ordering::Relaxed);
        let le = h.bounds.get(i).map_or("+Inf".to_owned(), |b| b.to_string());
        writeln!(out, "{name}_bucket{} {cumulative}", with_le(&le))?;
    }
    writeln!(out, "{name}_sum{labels} {}\n{name}_count{labels} {cumulative}", h.sum_us.get() as f64 / 1e6)
}

fn render_labels(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let mut s = String::from("{");
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let v = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
        let _ = write!(s, "{k}=\"{v}\"");
    }
    s.push('}');
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
    /// A component-specific counter, labelled with this component's id.
    /// `name` is prefixed with `profcol_<kind>_`.
    pub fn counter(&self, name: &str, help: &str) -> Counter {
        let ids = self.id.to_string();
        self.registry.counter(&format!("profcol_{}_{name}", self.kind.as_str()), help, &[(self.kind.as_str(), &ids)])
    }

    /// A component-specific counter with one more label (e.g. a `reason`).
    pub fn counter_labeled(&self, name: &str, help: &str, label: (&str, &str)) -> Counter {
        let ids = self.id.to_string();
        self.registry.counter(
            &format!("profcol_{}_{name}", self.kind.as_str()),
            help,
            &[(self.kind.as_str(), &ids), label],
        )
    }

    pub fn gauge(&self, name: &str, help: &str) -> Gauge {
        let ids = self.id.to_string();
        self.registry.gauge(&format!("profcol_{}_{name}", self.kind.as_str()), help, &[(self.kind.as_str(), &ids)])
    }

    /// The registry, for series with labels of their own.
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

    #[test]
    fn histograms_render_cumulative_buckets_with_their_labels() {
        let t = Telemetry::new();
        let h = t.histogram("x_seconds", "X.", &[("component", "wasm/a")], &[0.001, 0.1]);
        h.record(Duration::from_micros(500));
        h.record(Duration::from_millis(50));
        h.record(Duration::from_secs(2));
        assert_eq!(h.count(), 3);
        let text = t.render();
        for line in [
            "# TYPE x_seconds histogram",
            "x_seconds_bucket{component=\"wasm/a\",le=\"0.001\"} 1",
            "x_seconds_bucket{component=\"wasm/a\",le=\"0.1\"} 2",
            "x_seconds_bucket{component=\"wasm/a\",le=\"+Inf\"} 3",
            "x_seconds_sum{component=\"wasm/a\"} 2.0505",
            "x_seconds_count{component=\"wasm/a\"} 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
        }
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
    }
}
