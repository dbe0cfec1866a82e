//! Packed samples through the real host and the real otlp receiver: the
//! receiver decodes a request with each profile's samples packed, `batch`
//! (which reads packed batches) merges them packed, `resource` (which only
//! touches resources) keeps them packed, and a processor or
//! exporter that has not said it reads packed batches gets them unpacked —
//! every sample in its profile — from the host. What leaves is what was sent.

mod common;

use async_trait::async_trait;
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use profcol::extensions::HostStatus;
use profcol::registry::Registry;
use profcol::service::{check, Service};
use profcol_api::component::{factory, Component, FactoryMeta, Kind, Stability};
use profcol_api::model::canonical;
use profcol_api::telemetry::Telemetry;
use profcol_api::{ProcessError, ProcessOutcome, Processor, Profiles};
use profcol_testkit::batch::random_batch;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
struct LookConfig {
    /// What the processor says `reads_packed` is.
    reads_packed: bool,
}

impl profcol_api::config::Validate for LookConfig {}

/// What a `look` processor saw of one batch.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    reads_packed: bool,
    packed: bool,
    /// Sample messages found in the profiles themselves (`.0`).
    in_profiles: usize,
    sample_messages: usize,
}

/// Records what it saw, forwards the batch.
struct Look {
    reads_packed: bool,
    seen: Arc<Mutex<Vec<Seen>>>,
}

#[async_trait]
impl Processor for Look {
    fn reads_packed(&self) -> bool {
        self.reads_packed
    }

    async fn process(&self, batch: Profiles) -> Result<ProcessOutcome, ProcessError> {
        let in_profiles = batch.profiles().map(|p| p.samples.len()).sum();
        self.seen.lock().unwrap().push(Seen {
            reads_packed: self.reads_packed,
            packed: batch.is_packed(),
            in_profiles,
            sample_messages: batch.sample_messages(),
        });
        Ok(ProcessOutcome::Forward(batch))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packed_batches_reach_only_what_reads_them_and_leave_as_they_came() {
    let dir = tempfile::tempdir().unwrap();
    let log = profcol_testkit::log::capture();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let yaml = format!(
        "receivers:
  otlp/packed: {{ protocols: {{ grpc: {{ endpoint: 127.0.0.1:0 }} }} }}
  otlp/unpacked: {{ protocols: {{ grpc: {{ endpoint: 127.0.0.1:0 }} }} }}
processors:
  batch: {{ send_batch_size: 1000000, timeout: 300ms }}
  resource: {{ attributes: [ {{ key: gateway.name, value: gw-1, action: upsert }} ] }}
  look/packed: {{ reads_packed: true }}
  look/unpacked: {{ reads_packed: false }}
exporters:
  file/packed: {{ path: {packed} }}
  file/unpacked: {{ path: {unpacked} }}
service:
  pipelines:
    profiles/packed: {{ receivers: [otlp/packed], processors: [batch, resource, look/packed], exporters: [file/packed] }}
    profiles/unpacked: {{ receivers: [otlp/unpacked], processors: [batch, resource, look/unpacked], exporters: [file/unpacked] }}
",
        packed = dir.path().join("packed.jsonl").display(),
        unpacked = dir.path().join("unpacked.jsonl").display(),
    );
    let config =
        profcol_config::load(&[profcol_config::Source::Text { name: "test".into(), text: yaml }], &[], &|_| None)
            .expect("the test config loads");
    let status = HostStatus::default();
    let recorded = Arc::clone(&seen);
    let registry = Registry::builtin(&status).with(factory::<LookConfig, _>(
        FactoryMeta {
            type_name: "look",
            kind: Kind::Processor,
            stability: Stability::Development,
            description: "test: records whether batches came packed",
        },
        move |_, cfg: LookConfig| {
            Ok(Component::Processor(Arc::new(Look { reads_packed: cfg.reads_packed, seen: Arc::clone(&recorded) })))
        },
    ));
    let checked = check::check(&config, &registry).expect("the test config checks");
    let mut service = Service::new(registry, Telemetry::new(), status);
    service.start(config, checked).await.expect("the service starts");

    let addr = |r: &str| -> SocketAddr {
        log.addr(&["otlp receiver listening", &format!("receiver=otlp/{r} ")], "grpc")
            .unwrap_or_else(|| panic!("otlp/{r}: no grpc address logged"))
    };
    // Two requests per pipeline, merged by `batch` before `look`.
    let sent = [random_batch(3, 4, 300, 40, 6), random_batch(4, 3, 200, 30, 5)];
    for r in ["packed", "unpacked"] {
        let mut client = ProfilesServiceClient::connect(format!("http://{}", addr(r))).await.unwrap();
        for b in &sent {
            client.export(b.clone().into_request()).await.expect("the request is accepted");
        }
    }
    tokio::time::sleep(std::time::Duration::from_millis(900)).await;
    service.shutdown().await;

    let messages: usize = sent.iter().map(Profiles::sample_messages).sum();
    let seen = seen.lock().unwrap().clone();
    let by = |reads: bool| seen.iter().filter(|s| s.reads_packed == reads).cloned().collect::<Vec<_>>();
    let (packed, unpacked) = (by(true), by(false));
    assert!(!packed.is_empty() && !unpacked.is_empty(), "{seen:?}");
    // Merged packed by `batch`: the profiles themselves hold no sample.
    assert!(packed.iter().all(|s| s.packed && s.in_profiles == 0), "{packed:?}");
    assert!(unpacked.iter().all(|s| !s.packed && s.in_profiles == s.sample_messages), "{unpacked:?}");
    for s in [&packed, &unpacked] {
        assert_eq!(s.iter().map(|s| s.sample_messages).sum::<usize>(), messages);
    }
    // Both files hold what was sent, with the resource attribute added.
    let mut want: Vec<_> = sent
        .iter()
        .map(|b| {
            let mut b = b.clone();
            for rp in &mut b.0.resource_profiles {
                let attrs = &mut rp.resource.get_or_insert_with(Default::default).attributes;
                attrs.push(profcol_testkit::prelude::kv("gateway.name", profcol_testkit::prelude::s("gw-1")));
            }
            b
        })
        .flat_map(|b| canonical::samples(&b))
        .collect();
    want.sort();
    for name in ["packed.jsonl", "unpacked.jsonl"] {
        let out = common::read_jsonl(&dir.path().join(name));
        let mut got: Vec<_> = out.iter().flat_map(canonical::samples).collect();
        got.sort();
        assert_eq!(got.len(), want.len(), "{name}");
        assert!(got == want, "{name}: the samples differ from those sent");
    }
}
