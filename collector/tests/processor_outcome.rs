//! The processor contract through the real host and the real otlp receiver:
//! a processor that refuses makes the receiver answer an error to its gRPC
//! and HTTP senders (retryable or not, as the processor says), a processor
//! that drops is counted as dropped while the sender hears OK, and the
//! per-processor counters in /metrics equal the samples sent.

mod common;

use async_trait::async_trait;
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use profcol::extensions::HostStatus;
use profcol::registry::Registry;
use profcol::service::{check, Service};
use profcol_api::component::{factory, Component, FactoryMeta, Kind, Stability};
use profcol_api::telemetry::Telemetry;
use profcol_api::{ProcessError, ProcessOutcome, Processor, Profiles};
use profcol_testkit::batch::random_batch;
use prost::Message;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::Arc;

/// What the test processor does with every batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Action {
    #[default]
    Forward,
    Drop,
    Refuse,
    RefuseRetryable,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
struct OutcomeConfig {
    action: Action,
}

impl profcol_api::config::Validate for OutcomeConfig {}

struct Outcome(Action);

#[async_trait]
impl Processor for Outcome {
    async fn process(&self, batch: Profiles) -> Result<ProcessOutcome, ProcessError> {
        match self.0 {
            Action::Forward => Ok(ProcessOutcome::Forward(batch)),
            Action::Drop => Ok(ProcessOutcome::dropped("the test drops everything", &batch)),
            Action::Refuse => Err(ProcessError::Permanent("this batch can never be processed".into())),
            Action::RefuseRetryable => Err(ProcessError::Retryable("not ready yet".into())),
        }
    }
}

fn registry(status: &HostStatus) -> Registry {
    Registry::builtin(status).with(factory::<OutcomeConfig, _>(
        FactoryMeta {
            type_name: "outcome",
            kind: Kind::Processor,
            stability: Stability::Development,
            description: "test: forwards, drops or refuses every batch",
        },
        |_, cfg: OutcomeConfig| Ok(Component::Processor(Arc::new(Outcome(cfg.action)))),
    ))
}

/// The counter `name{processor="id"}` in Prometheus text, or 0 when absent.
fn series(text: &str, name: &str, id: &str) -> u64 {
    let key = format!("{name}{{processor=\"{id}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&key)).map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processor_outcomes_reach_the_sender_and_the_counters() {
    let dir = tempfile::tempdir().unwrap();
    let actions = ["forward", "drop", "refuse", "refuse_retryable"];
    let log = profcol_testkit::log::capture();
    let mut yaml = String::from("receivers:\n");
    for a in actions {
        yaml += &format!(
            "  otlp/{a}:\n    protocols:\n      grpc: {{ endpoint: 127.0.0.1:0 }}\n      http: {{ endpoint: 127.0.0.1:0 }}\n"
        );
    }
    yaml += "processors:\n";
    for a in actions {
        yaml += &format!("  outcome/{a}: {{ action: {a} }}\n");
    }
    yaml +=
        &format!("exporters:\n  file:\n    path: {}\nservice:\n  pipelines:\n", dir.path().join("out.jsonl").display());
    for a in actions {
        yaml +=
            &format!("    profiles/{a}: {{ receivers: [otlp/{a}], processors: [outcome/{a}], exporters: [file] }}\n");
    }
    let config =
        profcol_config::load(&[profcol_config::Source::Text { name: "test".into(), text: yaml }], &[], &|_| None)
            .expect("the test config loads");
    let status = HostStatus::default();
    let registry = registry(&status);
    let checked = check::check(&config, &registry).expect("the test config checks");
    let telemetry = Telemetry::new();
    let mut service = Service::new(registry, telemetry.clone(), status);
    service.start(config, checked).await.expect("the service starts");

    // Each receiver bound port 0 and logged what it got.
    let ports: Vec<(SocketAddr, SocketAddr)> = actions
        .iter()
        .map(|a| {
            let needles = ["otlp receiver listening", &format!("receiver=otlp/{a} ")];
            let addr = |key| log.addr(&needles, key).unwrap_or_else(|| panic!("otlp/{a}: no {key} address logged"));
            (addr("grpc"), addr("http"))
        })
        .collect();
    let batch = random_batch(7, 2, 40, 5, 4);
    let n = batch.sample_count() as u64;
    let request = batch.clone().into_request();
    let body = request.encode_to_vec();
    let http = reqwest::Client::new();
    let mut codes = Vec::new();
    for (a, (g, h)) in actions.iter().zip(&ports) {
        let mut client = ProfilesServiceClient::connect(format!("http://{g}")).await.unwrap();
        let grpc = client.export(request.clone()).await.map(|_| ()).map_err(|s| s.code());
        let r = http
            .post(format!("http://{h}/v1development/profiles"))
            .header("content-type", "application/x-protobuf")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        codes.push((*a, grpc, r.status().as_u16()));
    }
    use tonic::Code;
    assert_eq!(
        codes,
        vec![
            ("forward", Ok(()), 200),
            ("drop", Ok(()), 200),
            ("refuse", Err(Code::InvalidArgument), 400),
            ("refuse_retryable", Err(Code::Unavailable), 503),
        ]
    );

    // Each processor saw the batch twice (gRPC and HTTP).
    let text = telemetry.render();
    for a in actions {
        let id = format!("outcome/{a}");
        let got = |name: &str| series(&text, name, &id);
        let incoming = got("profcol_processor_incoming_samples_total");
        let outgoing = got("profcol_processor_outgoing_samples_total");
        let dropped = got("profcol_processor_dropped_samples_total");
        let refused = got("profcol_processor_refused_samples_total");
        let want = match a {
            "forward" => (2 * n, 2 * n, 0, 0),
            "drop" => (2 * n, 0, 2 * n, 0),
            _ => (2 * n, 0, 0, 2 * n),
        };
        assert_eq!((incoming, outgoing, dropped, refused), want, "{id}:\n{text}");
    }
    // The receivers count what the pipeline refused, too.
    let refused_at = |r: &str| {
        let key = format!("profcol_receiver_refused_samples_total{{receiver=\"otlp/{r}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&key)).map_or(0, |v| v.trim().parse::<u64>().unwrap())
    };
    assert_eq!((refused_at("refuse"), refused_at("refuse_retryable"), refused_at("drop")), (2 * n, 2 * n, 0));
    service.shutdown().await;

    // Only the forwarded batches reached the exporter.
    let out = common::read_jsonl(&dir.path().join("out.jsonl"));
    let exported: usize = out.iter().map(Profiles::sample_count).sum();
    assert_eq!(exported as u64, 2 * n);
}
