//! Agents spread over gateways (`balancer:` on the OTLP exporters), against
//! real profcol gateways on loopback: 127.0.0.1, .2, .3 (and .4 when one is
//! added), one port, each gateway forwarding to its own backend so the test
//! sees which gateway took what. The agent is the real exporter; a DNS name
//! is resolved by a resolver the test controls.
//!
//! - a static list of three and a DNS name resolving to them: 300 batches
//!   land on all three (each ≥ 20%), every sample exactly once;
//! - a gateway stopped with SIGTERM mid-run loses nothing and its share
//!   moves to the others;
//! - a gateway added to what the name resolves to is used within one interval;
//! - with `routing_key: service.name` each service's samples land on one
//!   gateway (batches holding several services are split);
//! - `otlp_http` balances the same way.

mod common;

use common::service::samples;
use common::{start_config, Profcol};
use profcol_api::component::Kind;
use profcol_api::model::{pb, ProfileMeta, Resource};
use profcol_api::{Exporter, Profiles, ProfilesBuilder};
use profcol_exporters::otlp::{OtlpGrpcConfig, OtlpGrpcExporter, OtlpHttpConfig, OtlpHttpExporter, Resolver};
use profcol_receivers::otlp::testing::{collecting_receiver, receiver_config};
use profcol_receivers::otlp::OtlpReceiver;
use profcol_testkit::config::{one_pipeline, otlp_exporter_retrying};
use profcol_testkit::prelude::{kv, s, settings, Collector};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SERVICES: u64 = 12;

/// One batch of 8 samples with timestamps no other batch has, from
/// `services` resources (service.name `svc-N`).
fn batch(seed: u64, services: &[u64]) -> Profiles {
    let mut b = ProfilesBuilder::new();
    for (n, svc) in services.iter().enumerate() {
        let r = b.resource(Resource {
            attributes: vec![kv("service.name", s(&format!("svc-{svc}")))],
            ..Default::default()
        });
        let p = b.profile(r, &ProfileMeta::cpu(1, 0, 0));
        for k in 0..8u64 {
            let f = b.function(&format!("fn_{}", k % 5), "", "a.c", 0);
            let l = b.line_location(f, k as i64);
            let st = b.stack(&[l]);
            let ts = (seed * 100 + n as u64 * 10 + k) * 1000;
            b.sample(
                p,
                pb::Sample { stack_index: st, values: vec![1], timestamps_unix_nano: vec![ts], ..Default::default() },
            );
        }
    }
    b.build()
}

/// A gateway: profcol on 127.0.0.`host`, forwarding to its own backend.
struct Gateway {
    proc: Profcol,
    backend: Arc<Collector>,
    _receiver: Arc<OtlpReceiver>,
    grpc: std::net::SocketAddr,
    http: std::net::SocketAddr,
}

/// Starts gateway `host` (1..); `ports`: (gRPC, HTTP) every gateway shares, or
/// None for the first, which takes free ones and names them in its log.
async fn gateway(dir: &std::path::Path, host: u8, ports: Option<(u16, u16)>) -> Gateway {
    let (receiver, backend) =
        collecting_receiver(&format!("otlp/backend{host}"), receiver_config(Some("127.0.0.1:0"), None)).await;
    let backend_port = receiver.grpc_addr().expect("backend listens").port();
    let (g, h) = ports.unwrap_or((0, 0));
    let config = format!(
        "receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.{host}:{g}
      http:
        endpoint: 127.0.0.{host}:{h}
{}{}",
        otlp_exporter_retrying(backend_port),
        one_pipeline("otlp", "", "otlp")
    );
    let proc = start_config(dir, &format!("gateway{host}.yaml"), &config);
    let grpc = proc.wait_addr("otlp receiver listening", "grpc", Duration::from_secs(30));
    let http = proc.wait_addr("otlp receiver listening", "http", Duration::from_secs(30));
    Gateway { proc, backend, _receiver: receiver, grpc, http }
}

/// Three gateways on 127.0.0.1-3, one gRPC port and one HTTP port.
async fn three_gateways(dir: &std::path::Path) -> Vec<Gateway> {
    let first = gateway(dir, 1, None).await;
    let ports = (first.grpc.port(), first.http.port());
    let mut all = vec![first];
    for host in 2..=3 {
        all.push(gateway(dir, host, Some(ports)).await);
    }
    all
}

/// What a test's name resolves to, changed while the agent runs.
struct TestResolver(Mutex<Vec<String>>);

#[async_trait::async_trait]
impl Resolver for TestResolver {
    async fn resolve(&self) -> Result<Vec<String>, String> {
        Ok(self.0.lock().unwrap().clone())
    }
    fn describe(&self) -> String {
        "dns gateways.test (test resolver)".into()
    }
}

fn grpc_agent(yaml: &str, resolver: Option<Arc<dyn Resolver>>) -> OtlpGrpcExporter {
    let cfg: OtlpGrpcConfig = profcol_config::parse_section(yaml).unwrap().decode().unwrap();
    let set = settings(Kind::Exporter, "otlp/agent");
    match resolver {
        Some(r) => OtlpGrpcExporter::with_resolver(set, cfg, r).unwrap(),
        None => OtlpGrpcExporter::new(set, cfg).unwrap(),
    }
}

fn static_list(gws: &[Gateway], http: bool) -> String {
    let list: Vec<String> = gws.iter().map(|g| if http { g.http } else { g.grpc }.to_string()).collect();
    format!("[{}]", list.join(", "))
}

/// Samples that reached each gateway's backend.
fn arrived(gws: &[Gateway]) -> Vec<usize> {
    gws.iter().map(|g| g.backend.sample_count()).collect()
}

async fn wait_total(gws: &[Gateway], want: usize) {
    let t0 = Instant::now();
    while arrived(gws).iter().sum::<usize>() < want && t0.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let a late duplicate show itself before counting.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// Every sample sent arrived exactly once, over all gateways together.
fn assert_exactly_once(gws: &[Gateway], sent: &[Profiles]) {
    let got: Vec<Profiles> = gws.iter().flat_map(|g| g.backend.batches.lock().unwrap().clone()).collect();
    let (got, want) = (samples(&got), samples(sent));
    assert_eq!(got.len(), want.len(), "samples arrived vs sent (per gateway: {:?})", arrived(gws));
    assert!(got == want, "the samples that arrived are not the samples sent");
}

fn assert_spread(per: &[usize], total: usize) {
    for (i, n) in per.iter().enumerate() {
        assert!(*n * 5 >= total, "gateway {} took {n} of {total} samples (< 20%): {per:?}", i + 1);
    }
}

async fn send_all(agent: &dyn Exporter, batches: &[Profiles]) {
    for (i, b) in batches.iter().enumerate() {
        agent.export(b).await.unwrap_or_else(|e| panic!("batch {i} failed: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_list_of_three_spreads_300_batches_and_survives_a_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut gws = three_gateways(dir.path()).await;
    let agent = grpc_agent(
        &format!(
            "balancer: {{resolver: {{static: {{endpoints: {}}}}}}}\ntls: {{insecure: true}}",
            static_list(&gws, false)
        ),
        None,
    );
    agent.start().await.unwrap();
    assert_eq!(agent.balanced_addresses().len(), 3);

    let batches: Vec<Profiles> = (0..300).map(|i| batch(i, &[i % SERVICES])).collect();
    let per_batch = batches[0].sample_count();
    send_all(&agent, &batches[..150]).await;
    wait_total(&gws, 150 * per_batch).await;
    assert_spread(&arrived(&gws), 150 * per_batch);

    // Gateway 2 goes away mid-run (batches keep going while it shuts down):
    // what it acknowledged reaches its backend (graceful drain), no batch
    // fails, and once it is gone everything goes to the other two.
    gws[1].proc.signal(libc::SIGTERM);
    let sending = async { send_all(&agent, &batches[150..225]).await };
    let (_, exit) =
        tokio::join!(sending, async { tokio::task::block_in_place(|| gws[1].proc.wait_exit(Duration::from_secs(20))) });
    assert!(exit.is_some_and(|s| s.success()), "gateway 2 did not exit cleanly after SIGTERM: {exit:?}");
    wait_total(&gws, 225 * per_batch).await;
    let at_exit = arrived(&gws);
    send_all(&agent, &batches[225..]).await;
    wait_total(&gws, 300 * per_batch).await;
    assert_exactly_once(&gws, &batches);
    let after = arrived(&gws);
    assert_eq!(after[1], at_exit[1], "gateway 2 took samples after it exited");
    let moved = (after[0] - at_exit[0], after[2] - at_exit[2]);
    assert!(
        moved.0 > 0 && moved.1 > 0 && moved.0 + moved.1 == 75 * per_batch,
        "after the exit the other two took the last 75 batches: {moved:?} (× {per_batch} samples)"
    );
    agent.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_name_spreads_300_batches_and_a_gateway_added_is_used_within_one_interval() {
    let dir = tempfile::tempdir().unwrap();
    let mut gws = three_gateways(dir.path()).await;
    let port = gws[0].grpc.port();
    let resolver = Arc::new(TestResolver(Mutex::new(gws.iter().map(|g| g.grpc.to_string()).collect())));
    let interval = Duration::from_millis(1000);
    let agent = grpc_agent(
        &format!("balancer: {{resolver: {{dns: {{hostname: gateways.test, port: {port}, interval: 1s}}}}}}\ntls: {{insecure: true}}"),
        Some(resolver.clone()),
    );
    agent.start().await.unwrap();

    let batches: Vec<Profiles> = (0..300).map(|i| batch(1000 + i, &[i % SERVICES])).collect();
    let per_batch = batches[0].sample_count();
    send_all(&agent, &batches).await;
    wait_total(&gws, 300 * per_batch).await;
    assert_exactly_once(&gws, &batches);
    assert_spread(&arrived(&gws), 300 * per_batch);

    // A fourth gateway appears in DNS: the agent sends to it within one
    // interval of the change (plus the time a batch takes to pass through).
    let ports = (port, gws[0].http.port());
    gws.push(gateway(dir.path(), 4, Some(ports)).await);
    resolver.0.lock().unwrap().push(gws[3].grpc.to_string());
    let changed = Instant::now();
    let mut seed = 5000;
    while gws[3].backend.sample_count() == 0 {
        assert!(
            changed.elapsed() < interval + Duration::from_millis(1500),
            "the added gateway got nothing {:?} after it was added (interval {interval:?})",
            changed.elapsed()
        );
        agent.export(&batch(seed, &[0])).await.unwrap();
        seed += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let used_after = changed.elapsed();
    assert_eq!(agent.balanced_addresses().len(), 4);
    eprintln!("the added gateway was used {used_after:?} after the change (interval {interval:?})");
    agent.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_by_service_name_keeps_each_service_on_one_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let gws = three_gateways(dir.path()).await;
    let agent = grpc_agent(
        &format!(
            "balancer:\n  resolver: {{static: {{endpoints: {}}}}}\n  routing_key: service.name\ntls: {{insecure: true}}",
            static_list(&gws, false)
        ),
        None,
    );
    agent.start().await.unwrap();
    // Most batches carry three services, so they are split on the way.
    let batches: Vec<Profiles> =
        (0..300).map(|i| batch(2000 + i, &[i % SERVICES, (i + 5) % SERVICES, (i + 7) % SERVICES])).collect();
    let total: usize = batches.iter().map(Profiles::sample_count).sum();
    send_all(&agent, &batches).await;
    wait_total(&gws, total).await;
    assert_exactly_once(&gws, &batches);

    let mut home: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    for (i, g) in gws.iter().enumerate() {
        for b in g.backend.batches.lock().unwrap().iter() {
            for rp in &b.0.resource_profiles {
                let svc = rp.resource.as_ref().and_then(|r| r.attributes.first()).map(|kv| format!("{:?}", kv.value));
                home.entry(svc.unwrap_or_default()).or_default().insert(i);
            }
        }
    }
    assert_eq!(home.len(), SERVICES as usize);
    for (svc, on) in &home {
        assert_eq!(on.len(), 1, "{svc} landed on gateways {on:?}");
    }
    let used: BTreeSet<usize> = home.values().flatten().copied().collect();
    assert!(used.len() >= 2, "{SERVICES} services all on one gateway: {home:?}");
    agent.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_http_balances_over_a_static_list() {
    let dir = tempfile::tempdir().unwrap();
    let gws = three_gateways(dir.path()).await;
    let yaml = format!(
        "balancer: {{resolver: {{static: {{endpoints: {}}}}}}}\ntls: {{insecure: true}}",
        static_list(&gws, true)
    );
    let cfg: OtlpHttpConfig = profcol_config::parse_section(&yaml).unwrap().decode().unwrap();
    let agent = OtlpHttpExporter::new(settings(Kind::Exporter, "otlp_http/agent"), cfg).unwrap();
    agent.start().await.unwrap();
    let batches: Vec<Profiles> = (0..90).map(|i| batch(3000 + i, &[i % SERVICES])).collect();
    let total: usize = batches.iter().map(Profiles::sample_count).sum();
    send_all(&agent, &batches).await;
    wait_total(&gws, total).await;
    assert_exactly_once(&gws, &batches);
    assert_spread(&arrived(&gws), total);
    agent.shutdown().await.unwrap();
}
