//! A profcol gateway under hostile senders, as a process: expansion
//! requests (a few MB on the wire, gigabytes decoded) are refused with
//! RESOURCE_EXHAUSTED / 413 and the process's peak RSS (VmHWM) stays under
//! the bound docs/CONFIG.md states: idle + max_concurrent_requests ×
//! (2 × max_recv_msg_size_mib + max_decoded_size_mib).

mod common;

use common::Profcol;
use profcol_testkit::config::OTLP_GRPC_RECEIVER;
use profcol_testkit::hostile::{expansion_request, json_expansion_request};
use profcol_testkit::raw::{grpc_send, http_send};
use std::time::Duration;

const SLOTS: u64 = 4;
const MAX_RECV_MIB: u64 = 32;
const MAX_DECODED_MIB: u64 = 128;

fn gateway(dir: &std::path::Path) -> Profcol {
    common::start_config(
        dir,
        "gateway.yaml",
        &format!(
            "{OTLP_GRPC_RECEIVER}        max_recv_msg_size_mib: {MAX_RECV_MIB}
      http: {{ endpoint: 127.0.0.1:0, max_recv_msg_size_mib: {MAX_RECV_MIB} }}
    max_concurrent_requests: {SLOTS}
    max_decoded_size_mib: {MAX_DECODED_MIB}
exporters:
  debug: {{}}
service:
  telemetry: {{ metrics: {{ address: \"\" }} }}
  pipelines:
    profiles: {{ receivers: [otlp], exporters: [debug] }}
"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expansion_requests_are_refused_and_peak_rss_stays_under_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let p = gateway(dir.path());
    let g = p.wait_addr("otlp receiver listening", "grpc", Duration::from_secs(30));
    let h = p.wait_addr("otlp receiver listening", "http", Duration::from_secs(30));
    let idle = p.status_kb("VmHWM");
    let big = expansion_request(30 << 20);
    // ~160 MB decoded, over the 128 MiB budget (3 MB of empty samples,
    // ~120 MB since the decode sizes vectors exactly, would fit).
    let small = expansion_request(4_000_000);
    assert!(big.len() < (MAX_RECV_MIB << 20) as usize, "under the size cap: only the budget can refuse it");
    // Rounds of SLOTS concurrent requests, every kind on both protocols.
    for round in 0..4 {
        let mut calls = Vec::new();
        for k in 0..SLOTS as usize {
            let body = if (round + k) % 2 == 0 { big.clone() } else { small.clone() };
            calls.push(tokio::spawn(async move {
                if k % 2 == 0 {
                    let e = grpc_send(g, body, false).await.expect_err("refused");
                    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
                    assert!(e.message().contains("max_decoded_size_mib"), "{}", e.message());
                } else {
                    let (code, _, text) = http_send(h, body, "application/x-protobuf", false).await;
                    assert_eq!(code, 413, "{text}");
                    assert!(text.contains("max_decoded_size_mib"), "{text}");
                }
            }));
        }
        for c in calls {
            c.await.unwrap();
        }
    }
    let (code, _, text) = http_send(h, json_expansion_request(30 << 20), "application/json", false).await;
    assert_eq!(code, 413, "{text}");
    let peak = p.status_kb("VmHWM");
    let bound = idle + SLOTS * (2 * MAX_RECV_MIB + MAX_DECODED_MIB) * (1 << 20);
    let decoded = profcol_api::model::decode_budget::proto_decoded_size(&big, usize::MAX).unwrap();
    eprintln!(
        "VmHWM idle {} MiB, after {} MiB; bound {} MiB (a 30 MiB request would decode to {} MiB)",
        idle >> 20,
        peak >> 20,
        bound >> 20,
        decoded >> 20
    );
    assert!(peak < bound, "peak RSS {} MiB over the bound {} MiB", peak >> 20, bound >> 20);
    // The process still serves real requests.
    let real = profcol_testkit::batch::random_batch(3, 2, 1000, 100, 12);
    grpc_send(g, prost::Message::encode_to_vec(&real.0), false).await.unwrap();
}
