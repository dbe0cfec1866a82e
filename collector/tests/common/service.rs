//! Shared by the tests that run the service in this process: config from
//! YAML text, a started service, an otlp sender, delivery checks.

use super::*;
use profcol::extensions::HostStatus;
use profcol::registry::Registry;
use profcol::service::{check, Service};
use profcol_api::component::Kind;
use profcol_api::model::canonical;
use profcol_api::telemetry::{ComponentTelemetry, Telemetry};
use profcol_api::Profiles;
use profcol_config::{Config, Source};
use profcol_exporters::otlp::{OtlpGrpcConfig, OtlpGrpcExporter};
use std::path::Path;
use std::time::{Duration, Instant};

pub(crate) fn load(registry: &Registry, yaml: &str) -> (Config, check::CheckedComponents) {
    let src = Source::Text { name: "test.yaml".into(), text: yaml.to_owned() };
    let config = profcol_config::load(&[src], &[], &|_| None).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let checked = check::check(&config, registry).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    (config, checked)
}

pub(crate) struct Host {
    pub service: Service,
    pub registry: Registry,
    pub status: HostStatus,
}

impl Host {
    pub(crate) async fn start(yaml: &str) -> Host {
        let status = HostStatus::default();
        let registry = Registry::builtin(&status);
        let mut service = Service::new(registry.clone(), Telemetry::new(), status.clone());
        // `load` ran the check `profcol validate` runs: the config must start.
        let (c, k) = load(&registry, yaml);
        service
            .start(c, k)
            .await
            .unwrap_or_else(|e| panic!("checks like `profcol validate` but does not start: {e}\n{yaml}"));
        Host { service, registry, status }
    }

    pub(crate) async fn reload(&mut self, yaml: &str) -> Result<(), String> {
        let (c, k) = load(&self.registry, yaml);
        self.service.reload(c, k).await.map_err(|e| e.to_string())
    }
}

/// An otlp receiver `id` listening (gRPC) on `endpoint` into a batch
/// processor (`batch_timeout`) and a file exporter writing JSON lines to `out`.
pub(crate) fn gateway(id: &str, endpoint: &str, batch_timeout: &str, out: &Path) -> String {
    format!(
        "receivers:\n  {id}:\n    protocols:\n      grpc:\n        endpoint: {endpoint}\n\
         processors:\n  batch:\n    timeout: {batch_timeout}\n\
         exporters:\n  file:\n    path: {}\n\
         service:\n  shutdown_timeout: 20s\n  telemetry:\n    metrics:\n      address: \"\"\n\
         \x20 pipelines:\n    profiles:\n      receivers: [{id}]\n      processors: [batch]\n      exporters: [file]\n",
        out.display()
    )
}

/// This process's log (captured once per process; receivers log the address they bound).
pub(crate) fn log() -> &'static profcol_testkit::log::Captured {
    static LOG: std::sync::OnceLock<profcol_testkit::log::Captured> = std::sync::OnceLock::new();
    LOG.get_or_init(profcol_testkit::log::capture)
}

/// The gRPC address otlp receiver `id` logged last (its latest instance).
pub(crate) fn grpc_addr(id: &str) -> std::net::SocketAddr {
    let text = log().text();
    let needle = format!("receiver={id} ");
    text.lines()
        .rev()
        .filter(|l| l.contains("otlp receiver listening") && l.contains(&needle))
        .find_map(|l| profcol_testkit::net::addr_in_log(l, "grpc"))
        .unwrap_or_else(|| panic!("receiver {id} logged no gRPC address"))
}

pub(crate) fn sender(addr: std::net::SocketAddr) -> OtlpGrpcExporter {
    let id = "otlp/sender".parse().unwrap();
    let settings = profcol_api::CreateSettings {
        telemetry: ComponentTelemetry::detached(Kind::Exporter, &id),
        id,
        services: Default::default(),
    };
    let cfg = OtlpGrpcConfig { endpoint: Some(format!("http://{addr}")), ..Default::default() };
    OtlpGrpcExporter::new(settings, cfg).unwrap()
}

pub(crate) fn samples(batches: &[Profiles]) -> Vec<canonical::CanonicalSample> {
    let mut v: Vec<_> = batches.iter().flat_map(canonical::samples).collect();
    v.sort();
    v
}

/// Waits until `out` holds exactly the samples of `sent` (no more: nothing twice).
pub(crate) async fn assert_all_arrive_once(out: &Path, sent: &[Profiles]) {
    let want = samples(sent);
    let t0 = Instant::now();
    loop {
        let got = samples(&read_jsonl(out));
        if got.len() >= want.len() || t0.elapsed() > Duration::from_secs(20) {
            assert_eq!(got.len(), want.len(), "samples written vs sent");
            assert!(got == want, "the samples written are not the samples sent");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    // Idle blocking-pool threads go within 200ms, so a count can settle.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_keep_alive(Duration::from_millis(200))
        .enable_all()
        .build()
        .unwrap()
}
