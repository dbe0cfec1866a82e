//! The service: builds the pipeline graph from a checked config, starts it
//! (exporters, processors, receivers), rebuilds it on reload keeping the
//! instances whose config did not change, and drains it on shutdown.

pub mod batch_trace;
pub mod check;
mod pipeline;
mod switch;

use crate::exporter_helper::ExporterHandle;
use crate::extensions::HostStatus;
use crate::registry::Registry;
use check::{Checked, CheckedComponents};
use profcol_api::component::{Component, ComponentId, Consumer, CreateSettings, Extension, Kind, Next};
use profcol_api::services::HostServices;
use profcol_api::telemetry::{MetricDef, Telemetry};
use profcol_api::{Processor, Receiver};
use profcol_config::Config;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
use switch::{Live, Part};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{info, warn};

struct RunningReceiver {
    instance: Arc<dyn Receiver>,
    next: Next,
    checked: Checked,
}

struct RunningProcessor {
    instance: Arc<dyn Processor>,
    checked: Checked,
}

struct RunningExporter {
    handle: Arc<ExporterHandle>,
    checked: Checked,
}

struct RunningExtension {
    instance: Arc<dyn Extension>,
    checked: Checked,
}

struct RunningPipeline {
    input: Arc<dyn Consumer>,
    task: JoinHandle<()>,
}

/// A started graph.
pub struct Graph {
    config: Config,
    receivers: BTreeMap<ComponentId, RunningReceiver>,
    /// Processors belong to one pipeline each: keyed by (pipeline, id).
    processors: BTreeMap<(String, ComponentId), RunningProcessor>,
    exporters: BTreeMap<ComponentId, RunningExporter>,
    extensions: BTreeMap<ComponentId, RunningExtension>,
    pipelines: BTreeMap<String, RunningPipeline>,
}

/// The extensions and receivers of a new graph that are new instances: they
/// start when the graph goes live ([`switch`]).
#[derive(Default)]
struct Fresh {
    extensions: Vec<ComponentId>,
    receivers: Vec<ComponentId>,
}

impl Fresh {
    /// In start order: extensions, then receivers.
    fn parts(&self, g: &Graph) -> Vec<Part> {
        let x = self.extensions.iter().map(|id| (id.clone(), Live::Extension(Arc::clone(&g.extensions[id].instance))));
        let r = self.receivers.iter().map(|id| {
            let r = &g.receivers[id];
            (id.clone(), Live::Receiver(Arc::clone(&r.instance), r.next.clone()))
        });
        x.chain(r).collect()
    }
}

/// What a build failure leaves: the error, after what it started is stopped.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.render())]
pub struct BuildError {
    pub component: String,
    pub error: profcol_api::ComponentError,
}

impl BuildError {
    /// The component's prefix once: a component whose message already
    /// names itself (`receiver x: ...` or `receivers::x: ...`) is not prefixed again.
    fn render(&self) -> String {
        let e = self.error.to_string();
        let path = self.component.split_once(' ').map(|(kind, id)| format!("{kind}s::{id}"));
        if e.starts_with(&self.component) || path.is_some_and(|p| e.starts_with(&p)) {
            e
        } else {
            format!("{}: {e}", self.component)
        }
    }
}

pub struct Service {
    registry: Registry,
    telemetry: Telemetry,
    /// Shared by every component of every graph (pins survive a reload).
    services: HostServices,
    status: HostStatus,
    graph: Option<Graph>,
}

fn settings(telemetry: &Telemetry, services: &HostServices, kind: Kind, id: &ComponentId) -> CreateSettings {
    CreateSettings { id: id.clone(), telemetry: telemetry.component(kind, id), services: services.clone() }
}

fn berr(kind: Kind, id: &ComponentId, error: profcol_api::ComponentError) -> BuildError {
    BuildError { component: format!("{kind} {id}"), error }
}

impl Service {
    pub fn new(registry: Registry, telemetry: Telemetry, status: HostStatus) -> Self {
        Service { registry, telemetry, services: HostServices::default(), status, graph: None }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn config(&self) -> Option<&Config> {
        self.graph.as_ref().map(|g| &g.config)
    }

    /// Builds and starts a graph for `config`, reusing the instances of `old`
    /// whose config is unchanged. On failure the new parts are stopped and
    /// `old` is returned untouched for the caller to keep running.
    async fn build(
        &self,
        config: Config,
        checked: CheckedComponents,
        old: Option<&Graph>,
    ) -> Result<(Graph, Fresh), BuildError> {
        let mut g = Graph {
            config,
            receivers: BTreeMap::new(),
            processors: BTreeMap::new(),
            exporters: BTreeMap::new(),
            extensions: BTreeMap::new(),
            pipelines: BTreeMap::new(),
        };
        match self.build_into(&mut g, &checked, old).await {
            Ok(fresh) => Ok((g, fresh)),
            Err(e) => {
                self.release_new(g, old).await;
                Err(e)
            }
        }
    }

    /// Stops and frees what `g` holds that `old` does not: the parts of a new
    /// graph that will not go live. Its new receivers and extensions must not
    /// be running ([`switch::start_in_place_of`] stops those it started);
    /// kept ones belong to `old`.
    async fn release_new(&self, g: Graph, old: Option<&Graph>) {
        let deadline = Instant::now() + g.config.service.shutdown_timeout;
        let Graph { receivers, processors, exporters, extensions, pipelines, .. } = g;
        // The receivers' `Next`s and the graph hold the pipelines' inputs;
        // once both are gone the pipeline tasks see their input close and end.
        drop(receivers);
        for (name, p) in pipelines {
            let RunningPipeline { input, mut task } = p;
            drop(input);
            if tokio::time::timeout_at(deadline.into(), &mut task).await.is_err() {
                warn!(pipeline = %name, "a pipeline of the abandoned graph did not end; stopping it");
                task.abort();
            }
        }
        for (key, p) in processors {
            if !old.is_some_and(|o| o.processors.get(&key).is_some_and(|x| Arc::ptr_eq(&x.instance, &p.instance))) {
                if let Err(e) = p.instance.shutdown().await {
                    warn!(processor = %key.1, pipeline = %key.0, error = %e, "shutdown failed");
                }
            }
        }
        for (id, e) in exporters {
            if !old.is_some_and(|o| o.exporters.get(&id).is_some_and(|x| Arc::ptr_eq(&x.handle, &e.handle))) {
                e.handle.shutdown(deadline).await;
            }
        }
        drop(extensions);
    }

    /// Fills `g`, starting its new exporters, processors and pipelines;
    /// returns the new extensions and receivers, which start when the graph
    /// goes live.
    async fn build_into(
        &self,
        g: &mut Graph,
        checked: &CheckedComponents,
        old: Option<&Graph>,
    ) -> Result<Fresh, BuildError> {
        let mut fresh = Fresh::default();
        let get = |kind: Kind, id: &ComponentId| checked.get(&(kind, id.clone())).cloned();
        // Extensions.
        for id in g.config.service.extensions.iter().filter_map(|s| s.parse::<ComponentId>().ok()) {
            let Some(c) = get(Kind::Extension, &id) else { continue };
            if let Some(o) = old.and_then(|o| o.extensions.get(&id)).filter(|o| o.checked == c) {
                g.extensions.insert(id, RunningExtension { instance: Arc::clone(&o.instance), checked: c });
                continue;
            }
            let Component::Extension(x) = self.create(Kind::Extension, &id, &c)? else {
                return Err(wrong_kind(Kind::Extension, &id));
            };
            fresh.extensions.push(id.clone());
            g.extensions.insert(id, RunningExtension { instance: x, checked: c });
        }
        // Exporters, shared by the pipelines that list them.
        let used_exporters: Vec<ComponentId> =
            g.config.pipelines.values().flat_map(|p| p.exporters.iter().cloned()).collect();
        for id in used_exporters {
            if g.exporters.contains_key(&id) {
                continue;
            }
            let Some(c) = get(Kind::Exporter, &id) else { continue };
            if let Some(o) = old.and_then(|o| o.exporters.get(&id)).filter(|o| o.checked == c) {
                g.exporters.insert(id, RunningExporter { handle: Arc::clone(&o.handle), checked: c });
                continue;
            }
            let Component::Exporter(x) = self.create(Kind::Exporter, &id, &c)? else {
                return Err(wrong_kind(Kind::Exporter, &id));
            };
            let helper = c.helper.clone().unwrap_or_default();
            let t = self.telemetry.component(Kind::Exporter, &id);
            let handle =
                ExporterHandle::start(id.clone(), x, helper, t).await.map_err(|e| berr(Kind::Exporter, &id, e))?;
            g.exporters.insert(id, RunningExporter { handle, checked: c });
        }
        // Processors, one instance per pipeline.
        let pipelines: Vec<(String, profcol_config::Pipeline)> =
            g.config.pipelines.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (name, p) in &pipelines {
            for id in &p.processors {
                let key = (name.clone(), id.clone());
                let Some(c) = get(Kind::Processor, id) else { continue };
                if let Some(o) = old.and_then(|o| o.processors.get(&key)).filter(|o| o.checked == c) {
                    g.processors.insert(key, RunningProcessor { instance: Arc::clone(&o.instance), checked: c });
                    continue;
                }
                let Component::Processor(x) = self.create(Kind::Processor, id, &c)? else {
                    return Err(wrong_kind(Kind::Processor, id));
                };
                x.start().await.map_err(|e| berr(Kind::Processor, id, e))?;
                g.processors.insert(key, RunningProcessor { instance: x, checked: c });
            }
        }
        // Pipelines.
        for (name, p) in &pipelines {
            let (tx, rx) = mpsc::channel(pipeline::INPUT_CAPACITY);
            let parts = pipeline::PipelineParts {
                name: name.clone(),
                processors: p
                    .processors
                    .iter()
                    .filter_map(|id| {
                        g.processors.get(&(name.clone(), id.clone())).map(|r| {
                            let telemetry = self.telemetry.component(Kind::Processor, id);
                            pipeline::PipelineProcessor {
                                id: id.clone(),
                                instance: Arc::clone(&r.instance),
                                dropped_batches: processor_dropped_batches(&telemetry),
                                telemetry,
                            }
                        })
                    })
                    .collect(),
                exporters: p
                    .exporters
                    .iter()
                    .filter_map(|id| g.exporters.get(id).map(|e| Arc::clone(&e.handle)))
                    .collect(),
            };
            let span = tracing::info_span!("pipeline", name = %name);
            let task = tokio::spawn(tracing::Instrument::instrument(pipeline::run(parts, rx), span));
            g.pipelines.insert(name.clone(), RunningPipeline { input: Arc::new(pipeline::PipelineInput { tx }), task });
        }
        // Receivers: created once, feeding every pipeline that lists them.
        let mut receiver_ids: Vec<ComponentId> =
            pipelines.iter().flat_map(|(_, p)| p.receivers.iter().cloned()).collect();
        receiver_ids.sort();
        receiver_ids.dedup();
        for id in receiver_ids {
            let Some(c) = get(Kind::Receiver, &id) else { continue };
            let targets: Vec<Arc<dyn Consumer>> = pipelines
                .iter()
                .filter(|(_, p)| p.receivers.contains(&id))
                .filter_map(|(n, _)| g.pipelines.get(n).map(|r| Arc::clone(&r.input)))
                .collect();
            if let Some(o) = old.and_then(|o| o.receivers.get(&id)).filter(|o| o.checked == c) {
                // Kept: rewired when the new graph goes live.
                let next = o.next.clone();
                g.receivers.insert(id, RunningReceiver { instance: Arc::clone(&o.instance), next, checked: c });
                continue;
            }
            let Component::Receiver(x) = self.create(Kind::Receiver, &id, &c)? else {
                return Err(wrong_kind(Kind::Receiver, &id));
            };
            // Delivers once the graph goes live (switch::start_in_place_of opens it).
            let next = Next::pending(targets, self.telemetry.component(Kind::Receiver, &id));
            g.receivers.insert(id.clone(), RunningReceiver { instance: x, next, checked: c });
            fresh.receivers.push(id);
        }
        Ok(fresh)
    }

    fn create(&self, kind: Kind, id: &ComponentId, c: &Checked) -> Result<Component, BuildError> {
        let f = self.registry.get(kind, id.type_name()).ok_or_else(|| {
            berr(kind, id, profcol_api::ComponentError::msg(format!("unknown {kind} type {:?}", id.type_name())))
        })?;
        f.create(settings(&self.telemetry, &self.services, kind, id), &c.config).map_err(|e| berr(kind, id, e))
    }

    /// The Next targets of receiver `id` in graph `g`.
    fn targets(g: &Graph, id: &ComponentId) -> Vec<Arc<dyn Consumer>> {
        g.config
            .pipelines
            .iter()
            .filter(|(_, p)| p.receivers.contains(id))
            .filter_map(|(n, _)| g.pipelines.get(n).map(|r| Arc::clone(&r.input)))
            .collect()
    }

    /// Builds and starts the first graph.
    pub async fn start(&mut self, config: Config, checked: CheckedComponents) -> Result<(), BuildError> {
        let (g, fresh) = self.build(config, checked, None).await?;
        let parts = fresh.parts(&g);
        let started = switch::start_in_place_of(&parts, &[]).await;
        // The parts hold the receivers' `Next`s, which keep the pipelines open.
        drop(parts);
        if let Err((e, _)) = started {
            self.release_new(g, None).await;
            return Err(e);
        }
        self.graph = Some(g);
        self.status.set_running(true);
        Ok(())
    }

    /// Replaces the running graph with one for `config`. If any step of the
    /// new graph fails (a component that cannot be created or started), what
    /// the new graph had started is stopped and freed, the old graph runs on
    /// as it was, and the error is returned.
    ///
    /// A changed receiver's new instance starts while the old one still runs
    /// (make before break), unless the two hold a common exclusive resource
    /// ([`Receiver::exclusive_resources`], e.g. the same port): then the old
    /// one stops first and, if the new one fails, starts again.
    pub async fn reload(&mut self, config: Config, checked: CheckedComponents) -> Result<(), BuildError> {
        let Some(old) = self.graph.take() else {
            return self.start(config, checked).await;
        };
        let (new, fresh) = match self.build(config, checked, Some(&old)).await {
            Ok(x) => x,
            Err(e) => {
                self.graph = Some(old);
                return Err(e);
            }
        };
        // Old receivers and extensions the new graph does not keep (changed or removed).
        let replaced: Vec<Part> = old
            .extensions
            .iter()
            .filter(|(id, x)| !new.extensions.get(*id).is_some_and(|n| Arc::ptr_eq(&n.instance, &x.instance)))
            .map(|(id, x)| (id.clone(), Live::Extension(Arc::clone(&x.instance))))
            .chain(
                old.receivers
                    .iter()
                    .filter(|(id, r)| !new.receivers.get(*id).is_some_and(|n| Arc::ptr_eq(&n.instance, &r.instance)))
                    .map(|(id, r)| (id.clone(), Live::Receiver(Arc::clone(&r.instance), r.next.clone()))),
            )
            .collect();
        let parts = fresh.parts(&new);
        let started = switch::start_in_place_of(&parts, &replaced).await;
        drop((parts, replaced));
        let stopped_early = match started {
            Ok(stopped) => stopped,
            Err((e, restored)) => {
                if !restored {
                    self.status.set_running(false);
                }
                self.release_new(new, Some(&old)).await;
                self.graph = Some(old);
                return Err(e);
            }
        };
        let deadline = Instant::now() + new.config.service.shutdown_timeout;
        // The new graph is live: kept receivers switch to the new pipelines,
        // and replaced ones stop, flushing into the old pipelines.
        for (id, r) in &new.receivers {
            if !fresh.receivers.contains(id) {
                r.next.set_targets(Self::targets(&new, id));
            }
        }
        for (id, r) in &old.receivers {
            if new.receivers.get(id).is_some_and(|n| Arc::ptr_eq(&n.instance, &r.instance)) {
                continue;
            }
            if !stopped_early.contains(id) {
                if let Err(e) = r.instance.shutdown().await {
                    warn!(receiver = %id, error = %e, "shutdown failed");
                }
            }
            r.next.set_targets(vec![]);
        }
        // The old pipelines drain into their exporters, then unused parts stop.
        let Graph { receivers: _, processors, exporters, extensions, pipelines, .. } = old;
        let tasks: Vec<JoinHandle<()>> = pipelines.into_values().map(|p| p.task).collect();
        for t in tasks {
            let _ = tokio::time::timeout_at(deadline.into(), t).await;
        }
        for (id, e) in exporters {
            if !new.exporters.get(&id).is_some_and(|n| Arc::ptr_eq(&n.handle, &e.handle)) {
                e.handle.shutdown(deadline).await;
            }
        }
        for (key, p) in processors {
            if !new.processors.get(&key).is_some_and(|n| Arc::ptr_eq(&n.instance, &p.instance)) {
                let _ = p.instance.shutdown().await;
            }
        }
        for (id, x) in extensions {
            if !new.extensions.get(&id).is_some_and(|n| Arc::ptr_eq(&n.instance, &x.instance))
                && !stopped_early.contains(&id)
            {
                let _ = x.instance.shutdown().await;
            }
        }
        self.graph = Some(new);
        self.status.set_running(true);
        Ok(())
    }

    /// Stops receivers, drains pipelines and exporters within `shutdown_timeout`.
    pub async fn shutdown(&mut self) {
        self.status.set_running(false);
        let Some(g) = self.graph.take() else { return };
        let deadline = Instant::now() + g.config.service.shutdown_timeout;
        let Graph { receivers, processors, exporters, extensions, pipelines, .. } = g;
        let stops = receivers.iter().map(|(id, r)| async move {
            if let Err(e) = r.instance.shutdown().await {
                warn!(receiver = %id, error = %e, "shutdown failed");
            }
            r.next.set_targets(vec![]);
        });
        futures::future::join_all(stops).await;
        drop(receivers);
        let tasks: Vec<JoinHandle<()>> = pipelines.into_values().map(|p| p.task).collect();
        for t in tasks {
            if tokio::time::timeout_at(deadline.into(), t).await.is_err() {
                warn!("shutdown_timeout passed while a pipeline was still draining");
            }
        }
        let stops = exporters.values().map(|e| e.handle.shutdown(deadline));
        futures::future::join_all(stops).await;
        // One line for the whole run, what /metrics counted: each exporter
        // (a batch sent to two exporters is in both), then what processors dropped.
        let mut total = crate::exporter_helper::Accounting::default();
        let mut line = Vec::new();
        for (id, e) in &exporters {
            let a = e.handle.accounting();
            total += a;
            line.push(format!("exporter {id}: {a}"));
        }
        let (mut dropped_batches, mut dropped_samples) = (0, 0);
        let ids: std::collections::BTreeSet<&ComponentId> = processors.keys().map(|(_, id)| id).collect();
        for id in ids {
            let t = self.telemetry.component(Kind::Processor, id);
            dropped_batches += processor_dropped_batches(&t).get();
            dropped_samples += t.dropped.get();
        }
        if !processors.is_empty() {
            line.push(format!("processors dropped {dropped_batches} batches ({dropped_samples} samples)"));
        }
        for p in processors.values() {
            let _ = p.instance.shutdown().await;
        }
        for x in extensions.values() {
            let _ = x.instance.shutdown().await;
        }
        info!(
            delivered_batches = total.delivered_batches,
            delivered_samples = total.delivered_samples,
            kept_batches = total.kept_batches,
            kept_samples = total.kept_samples,
            dropped_batches = total.dropped_batches,
            dropped_samples = total.dropped_samples,
            processor_dropped_batches = dropped_batches,
            processor_dropped_samples = dropped_samples,
            "shut down: {}",
            line.join("; ")
        );
    }
}

/// Series the host keeps for every processor.
pub const PROCESSOR_METRICS: &[MetricDef] = &[PROCESSOR_DROPPED_BATCHES];

const PROCESSOR_DROPPED_BATCHES: MetricDef = MetricDef::counter(
    "dropped_batches_total",
    "1",
    "Batches the processor dropped (their samples are in dropped_samples_total).",
);

fn processor_dropped_batches(t: &profcol_api::telemetry::ComponentTelemetry) -> profcol_api::telemetry::Counter {
    t.counter_of(&PROCESSOR_DROPPED_BATCHES)
}

fn wrong_kind(kind: Kind, id: &ComponentId) -> BuildError {
    berr(kind, id, profcol_api::ComponentError::msg(format!("factory did not make a {kind}")))
}
