//! Soak: a profcol gateway with a persistent queue, under a steady mix of
//! valid agents (gRPC and HTTP), hostile senders (stalled bodies, headers
//! with no body, expansion bombs, gzip bombs, garbage) and a backend that
//! flaps (down 10 s every minute), for `PROFCOL_SOAK_SECS` seconds (default
//! 50: the CI run). It reports RSS over time, the p50/p99 latency of the
//! valid requests outside backend outages, and the samples the backend got
//! against those the gateway acknowledged (a multiset: duplicates counted,
//! none may be missing). RSS must be flat after warm-up: the first 20% of
//! the run, and at least until the first outage and the replay of what
//! was queued during it are over (the first outage makes the exporter's
//! retry and queue state once: a one-time step, not drift). The CI run
//! (50 s) has that much time after the replay. The recorded 10-minute run:
//!
//! ```sh
//! PROFCOL_SOAK_SECS=600 cargo test -p profcol --test soak -- --nocapture
//! ```

mod common;

use common::{backend, Profcol};
use profcol_api::model::canonical::{self, CanonicalSample};
use profcol_api::Receiver;
use profcol_testkit::batch::cpu_batch;
use profcol_testkit::config::{otlp_exporter_retrying, OTLP_GRPC_RECEIVER};
use profcol_testkit::hostile::{expansion_request, grpc_message_start, gzip_bomb, StalledGrpc, StalledHttp};
use profcol_testkit::raw::{grpc_send, http_send};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const AGENTS: u64 = 6;
const AGENT_INTERVAL: Duration = Duration::from_millis(200);
const OUTAGE: Duration = Duration::from_secs(10);
const OUTAGE_EVERY: Duration = Duration::from_secs(60);
/// The first outage starts this long after the start (in every minute after).
const OUTAGE_AT: Duration = Duration::from_secs(12);

/// glibc's mmap threshold pinned at its initial 128 KiB. By default glibc
/// raises the threshold to the size of each mmapped block freed (up to 32
/// MiB), so after the first multi-MiB request buffer is freed the next ones
/// come from the heap and stay in RSS when freed: a step of ~10 MiB that
/// lands whenever a larger block first comes and goes, which a 22 s window
/// cannot tell from drift (the CI run failed on it, 34 → 42 MiB, where the
/// pinned run stays at 26 → 26). Pinned, RSS follows what the gateway holds,
/// which is what this test judges. The 10-minute runs recorded in
/// docs/PERFORMANCE.md were made with glibc's default, and stayed flat.
const PINNED_MMAP_THRESHOLD: (&str, &str) = ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=131072");

fn gateway(dir: &std::path::Path, backend_port: u16) -> Profcol {
    let exporter = otlp_exporter_retrying(backend_port);
    let config = common::write(
        &dir.join("gateway.yaml"),
        &format!(
            "{OTLP_GRPC_RECEIVER}      http: {{ endpoint: 127.0.0.1:0 }}
    read_timeout: 2s
{exporter}    sending_queue:
      storage: {}
service:
  telemetry: {{ metrics: {{ address: \"\" }} }}
  pipelines:
    profiles: {{ receivers: [otlp], exporters: [otlp] }}
",
            dir.join("queue").display()
        ),
    );
    Profcol::start_env(&["--config", config.to_str().expect("a UTF-8 temp path")], &[PINNED_MMAP_THRESHOLD])
}

/// After an outage, the queued batches are sent within this.
const REPLAY: Duration = Duration::from_secs(6);

/// Whether `t` (since the start) is within an outage, with `margin` around it.
fn in_outage(t: Duration, margin: Duration) -> bool {
    let Some(into) = t.checked_sub(OUTAGE_AT.saturating_sub(margin)) else { return false };
    let phase = Duration::from_nanos((into.as_nanos() % OUTAGE_EVERY.as_nanos()) as u64);
    phase < OUTAGE + 2 * margin
}

#[derive(Default)]
struct Acked {
    samples: BTreeMap<CanonicalSample, u64>,
    batches: u64,
    /// (start since t0, latency) of every successful valid request.
    latencies: Vec<(Duration, Duration)>,
    retries: u64,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak() {
    let secs: u64 = std::env::var("PROFCOL_SOAK_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let run = Duration::from_secs(secs);
    let dir = tempfile::tempdir().unwrap();
    let port = profcol_testkit::net::closed_port();
    let (be, sink) = backend(port).await;
    let p = gateway(dir.path(), port);
    let grpc = p.wait_addr("otlp receiver listening", "grpc", Duration::from_secs(30));
    let http = p.wait_addr("otlp receiver listening", "http", Duration::from_secs(30));
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Acked::default()));
    let mut tasks = Vec::new();

    // Valid agents: a new batch every 200 ms each, resent until acknowledged.
    let seq = Arc::new(AtomicU64::new(1));
    for agent in 0..AGENTS {
        let (stop, acked, seq) = (stop.clone(), acked.clone(), seq.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let batch = cpu_batch(seq.fetch_add(1, Ordering::Relaxed), 2, 25);
                let body = batch.encode_to_vec();
                loop {
                    let started = Instant::now();
                    let ok = if agent % 2 == 0 {
                        grpc_send(grpc, body.clone(), false).await.is_ok()
                    } else {
                        http_send(http, body.clone(), "application/x-protobuf", false).await.0 == 200
                    };
                    let took = started.elapsed();
                    if ok {
                        let mut a = acked.lock().unwrap();
                        for s in canonical::samples(&batch) {
                            *a.samples.entry(s).or_default() += 1;
                        }
                        a.batches += 1;
                        a.latencies.push((started - t0, took));
                        break;
                    }
                    acked.lock().unwrap().retries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                tokio::time::sleep(AGENT_INTERVAL).await;
            }
        }));
    }

    // Hostile senders.
    let hostile = |f: fn(std::net::SocketAddr, std::net::SocketAddr) -> _, every: Duration| {
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let _ = tokio::time::timeout(Duration::from_secs(10), f(grpc, http)).await;
                tokio::time::sleep(every).await;
            }
        })
    };
    type Attack = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
    fn stalls(grpc: std::net::SocketAddr, http: std::net::SocketAddr) -> Attack {
        Box::pin(async move {
            // 4 stalled bodies and 8 header-only connections, held 3 s.
            let mut held_g = Vec::new();
            let mut held_h = Vec::new();
            for k in 0..6 {
                let body = (k < 2).then(|| grpc_message_start(100_000, 100));
                held_g.extend(StalledGrpc::open(grpc, body).await.ok());
                held_h.extend(StalledHttp::open(http, 100_000, if k < 2 { 100 } else { 0 }).await.ok());
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
        })
    }
    fn bombs(grpc: std::net::SocketAddr, http: std::net::SocketAddr) -> Attack {
        Box::pin(async move {
            // ~160 MB decoded: over the default 128 MiB budget.
            let _ = grpc_send(grpc, expansion_request(4_000_000), false).await;
            let _ = http_send(http, expansion_request(4_000_000), "application/x-protobuf", false).await;
            let _ = http_send(http, gzip_bomb(40 << 20), "application/x-protobuf", true).await;
        })
    }
    fn garbage(grpc: std::net::SocketAddr, http: std::net::SocketAddr) -> Attack {
        Box::pin(async move {
            let junk = b"\xff\xff\xff\xff\x0fnot protobuf".to_vec();
            let _ = grpc_send(grpc, junk.clone(), false).await;
            let _ = http_send(http, junk, "application/x-protobuf", false).await;
        })
    }
    tasks.push(hostile(stalls, Duration::from_millis(100)));
    tasks.push(hostile(bombs, Duration::from_secs(2)));
    tasks.push(hostile(garbage, Duration::from_millis(500)));

    // The backend flaps; RSS is sampled every second.
    let mut rss: Vec<(Duration, u64)> = Vec::new();
    let mut backend_up = true;
    let mut outages = 0;
    while t0.elapsed() < run {
        let t = t0.elapsed();
        let want_up = !in_outage(t, Duration::ZERO);
        if want_up != backend_up {
            if want_up {
                be.start(sink.next()).await.unwrap();
            } else {
                be.shutdown().await.unwrap();
                outages += 1;
            }
            backend_up = want_up;
        }
        rss.push((t, p.status_kb("VmRSS")));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
    }
    if !backend_up {
        be.start(sink.next()).await.unwrap();
    }

    // Everything acknowledged must reach the backend.
    let acked = Arc::try_unwrap(acked).ok().unwrap().into_inner().unwrap();
    let want: u64 = acked.samples.values().sum();
    let delivered_multiset = || {
        let mut m: BTreeMap<CanonicalSample, u64> = BTreeMap::new();
        for b in sink.batches.lock().unwrap().iter() {
            for s in canonical::samples(b) {
                *m.entry(s).or_default() += 1;
            }
        }
        m
    };
    let missing_of = |got: &BTreeMap<CanonicalSample, u64>| -> u64 {
        acked.samples.iter().map(|(s, n)| n.saturating_sub(got.get(s).copied().unwrap_or(0))).sum()
    };
    let drain = Instant::now();
    let mut got = delivered_multiset();
    while missing_of(&got) > 0 && drain.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        got = delivered_multiset();
    }
    let missing = missing_of(&got);
    let duplicates: u64 = got.iter().map(|(s, n)| n.saturating_sub(acked.samples.get(s).copied().unwrap_or(0))).sum();

    // Figures.
    let mut steady: Vec<Duration> =
        acked.latencies.iter().filter(|(at, _)| !in_outage(*at, Duration::from_secs(1))).map(|(_, l)| *l).collect();
    steady.sort();
    let mut all: Vec<Duration> = acked.latencies.iter().map(|(_, l)| *l).collect();
    all.sort();
    let warm_until = (run / 5).max(OUTAGE_AT + OUTAGE + REPLAY);
    let warm = rss.iter().position(|(t, _)| *t >= warm_until).unwrap_or(rss.len());
    let after = &rss[warm..];
    assert!(after.len() >= 10, "{secs} s leave {} RSS samples after warm-up: run longer", after.len());
    let half = after.len() / 2;
    // Medians, not means: a bomb being decoded lifts RSS by ~30 MiB for the
    // one second it takes; one such sample moved a half's mean by 2-3 MiB.
    // Transients are the peak's business (VmHWM, below); drift is the level.
    let median = |v: &[(Duration, u64)]| {
        let mut kb: Vec<u64> = v.iter().map(|x| x.1).collect();
        kb.sort_unstable();
        kb.get(kb.len() / 2).copied().unwrap_or(0)
    };
    let (early, late) = (median(&after[..half]), median(&after[half..]));
    let peak = p.status_kb("VmHWM");
    eprintln!("soak: {secs} s, {outages} backend outages of {OUTAGE:?}");
    eprintln!(
        "RSS (MiB) every 10 s: {:?}",
        rss.iter().step_by(10).map(|(t, r)| (t.as_secs(), r >> 20)).collect::<Vec<_>>()
    );
    eprintln!(
        "RSS after warm-up ({warm_until:?}, median): first half {} MiB, second half {} MiB ({:+.1}%); peak {} MiB",
        early >> 20,
        late >> 20,
        (late as f64 - early as f64) * 100.0 / early as f64,
        peak >> 20
    );
    eprintln!(
        "valid requests: {} acknowledged, {} retried; latency outside outages p50 {:?} p99 {:?} (all: p50 {:?} p99 {:?})",
        acked.batches,
        acked.retries,
        percentile(&steady, 0.5),
        percentile(&steady, 0.99),
        percentile(&all, 0.5),
        percentile(&all, 0.99)
    );
    eprintln!("samples: {want} acknowledged, {} delivered, {missing} missing, {duplicates} duplicates", {
        got.values().sum::<u64>()
    });

    if missing > 0 {
        for l in p.log.lock().unwrap().iter().filter(|l| l.contains("WARN") || l.contains("ERROR")) {
            eprintln!("gateway: {l}");
        }
    }
    assert_eq!(missing, 0, "acknowledged samples never delivered");
    assert!(acked.batches > secs, "valid agents got through: {} batches", acked.batches);
    assert!(percentile(&steady, 0.99) < Duration::from_secs(1), "p99 {:?}", percentile(&steady, 0.99));
    // Flat after warm-up: within 10% (or 8 MiB, for short runs' small numbers).
    let drift = late.abs_diff(early);
    assert!(
        drift <= (early / 10).max(8 << 20),
        "RSS moved from {} to {} MiB; each second (s, MiB): {:?}",
        early >> 20,
        late >> 20,
        rss.iter().map(|(t, r)| (t.as_secs(), r >> 20)).collect::<Vec<_>>()
    );
}
