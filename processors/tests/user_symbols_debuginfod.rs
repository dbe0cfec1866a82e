//! user_symbols with Debian's `debuginfod` server, started here on a
//! directory holding one debug file: a stripped binary is named with file
//! and line from the downloaded debug file; a build id the server lacks,
//! a server that is down and one that never answers leave frames unnamed
//! without holding batches, and each build id is asked for once per
//! `debuginfod.negative_ttl`, however many batches ask.
//!
//! At a gateway: a batch sent through a real OTLP receiver names frames of
//! a binary that is not on this host (the path its mapping names does not
//! exist), from the executable and debug file the server holds.
//!
//!     cargo test -p profcol-processors --test user_symbols_debuginfod

mod user_symbols_common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use profcol_api::component::{ComponentId, Kind, Processor};
use profcol_api::services::FilePins;
use profcol_api::telemetry::Telemetry;
use profcol_api::{Profiles, Receiver};
use profcol_processors::user_symbols::config::DebuginfodConfig;
use profcol_processors::user_symbols::{Config, UserSymbols};
use profcol_testkit::tools::tool_available;
use user_symbols_common::*;

/// The server, killed on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts debuginfod on `dir` and waits until it serves `build_id`'s debug file.
async fn start_server(dir: &std::path::Path, db: &std::path::Path, build_id: &str) -> (Server, String) {
    start_server_serving(dir, db, &[&format!("{build_id}/debuginfo")]).await
}

/// Starts debuginfod on `dir` and waits until it serves each of `wanted`
/// (`ID/debuginfo`, `ID/executable`).
async fn start_server_serving(dir: &std::path::Path, db: &std::path::Path, wanted: &[&str]) -> (Server, String) {
    for _ in 0..3 {
        let port = profcol_testkit::net::closed_port();
        let child = Command::new("debuginfod")
            .args(["-F", &dir.to_string_lossy(), "-p", &port.to_string(), "-d", &db.to_string_lossy()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start debuginfod");
        let server = Server(child);
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut served = 0;
        while Instant::now() < deadline {
            let probe = format!("{url}/buildid/{}", wanted[served]);
            if let Ok(r) = reqwest::get(&probe).await {
                if r.status().is_success() {
                    served += 1;
                    if served == wanted.len() {
                        return (server, url);
                    }
                    continue;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Port taken meanwhile, or the scan never found the file: try again.
    }
    panic!("debuginfod never served {wanted:?}");
}

fn processor(registry: &Telemetry, urls: Vec<String>, timeout: Duration) -> UserSymbols {
    let cid: ComponentId = "user_symbols".parse().unwrap();
    UserSymbols::with_telemetry(
        Config {
            max_wait: Duration::from_millis(200),
            debug_dirs: vec![],
            // The table cache retries every batch: only debuginfod's own
            // negative cache stands between batches and the server.
            negative_ttl: Duration::ZERO,
            debuginfod: DebuginfodConfig { urls, timeout, ..Default::default() },
            ..Default::default()
        },
        Arc::new(FilePins::default()),
        &registry.component(Kind::Processor, &cid),
    )
}

/// As examples/gateway.yaml configures it (its default negative_ttl).
fn gateway_processor(registry: &Telemetry, url: String) -> UserSymbols {
    let cid: ComponentId = "user_symbols".parse().unwrap();
    UserSymbols::with_telemetry(
        Config {
            max_wait: Duration::from_secs(2),
            debug_dirs: vec![],
            debuginfod: DebuginfodConfig { urls: vec![url], timeout: Duration::from_secs(10), ..Default::default() },
            ..Default::default()
        },
        Arc::new(FilePins::default()),
        &registry.component(Kind::Processor, &cid),
    )
}

fn counter(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{series} not in\n{metrics}"))
}

/// Runs `input` through `p` `n` times, each within `limit`; the last output.
async fn run(p: &UserSymbols, input: &Profiles, n: usize, limit: Duration) -> Profiles {
    let mut last = None;
    for _ in 0..n {
        let t = Instant::now();
        last = p.process(input.clone()).await.unwrap().forwarded();
        assert!(t.elapsed() < limit, "a batch was held {:?}", t.elapsed());
    }
    last.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripped_binary_is_named_from_debuginfod_and_misses_are_asked_once() {
    if !tools_available() || !tool_available("debuginfod", &["--version"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    // `a`: its debug file is on the server; `b`: not.
    let a = compile(dir.path(), "a", 21);
    debug_file(&a, &served.join("a.debug"));
    stripped(&a, &dir.path().join("a.stripped"));
    let b = compile(dir.path(), "b", 22);
    stripped(&b, &dir.path().join("b.stripped"));
    let (a_id, b_id) = (build_id(&a), build_id(&b));
    let (server, url) = start_server(&served, &dir.path().join("db.sqlite"), &a_id).await;

    let elf_a = profcol_elf::ElfFile::open(&std::fs::File::open(&a).unwrap()).unwrap();
    let (leaf, _) = symbol(&elf_a, "leaf_work");
    let input_a = batch(&dir.path().join("a.stripped"), &a_id, &[leaf], &elf_a);
    let elf_b = profcol_elf::ElfFile::open(&std::fs::File::open(&b).unwrap()).unwrap();
    let input_b = batch(&dir.path().join("b.stripped"), &b_id, &[symbol(&elf_b, "leaf_work").0], &elf_b);

    let registry = Telemetry::new();
    let p = processor(&registry, vec![url.clone()], Duration::from_secs(5));
    // Named with file and line, as addr2line names it on the unstripped binary.
    let deadline = Instant::now() + Duration::from_secs(20);
    let named = loop {
        let out = p.process(input_a.clone()).await.unwrap().forwarded().unwrap();
        let f = frames(&out);
        if !f[1].is_empty() {
            break f;
        }
        assert!(Instant::now() < deadline, "never named from debuginfod\n{}", registry.render());
    };
    let want = addr2line(&a, &[leaf]);
    assert_eq!(
        named[1].iter().map(|x| (x.0.clone(), x.1 as u32)).collect::<Vec<_>>(),
        want[0].iter().map(|x| (x.0.clone(), x.2)).collect::<Vec<_>>()
    );
    assert!(named[1][0].1 > 0, "a line number came from the downloaded DWARF");

    // The server lacks b: 20 batches, one request.
    let out = run(&p, &input_b, 20, Duration::from_secs(1)).await;
    assert!(frames(&out)[1].is_empty());
    let m = registry.render();
    assert_eq!(counter(&m, "profcol_processor_user_symbols_debuginfod_requests_total{outcome=\"ok\""), 1, "{m}");
    assert_eq!(counter(&m, "profcol_processor_user_symbols_debuginfod_requests_total{outcome=\"not_found\""), 1);
    assert!(counter(&m, "profcol_processor_user_symbols_debuginfod_requests_total{outcome=\"negative_cached\"") >= 10);

    // Server down: a fresh processor, 20 batches, none held, one request.
    drop(server);
    let registry = Telemetry::new();
    let p = processor(&registry, vec![url], Duration::from_secs(5));
    let out = run(&p, &input_a, 20, Duration::from_secs(1)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out2 = run(&p, &input_a, 1, Duration::from_secs(1)).await;
    assert!(frames(&out)[1].is_empty() && frames(&out2)[1].is_empty(), "nothing names a stripped binary");
    let m = registry.render();
    assert_eq!(counter(&m, "profcol_processor_user_symbols_debuginfod_requests_total{outcome=\"error\""), 1, "{m}");
    assert_eq!(counter(&m, "profcol_processor_user_symbols_debuginfod_requests_total{outcome=\"ok\""), 0);

    // A server that accepts and never answers: batches still go on within
    // max_wait; the request gives up after `timeout`.
    let (silent, addr) = profcol_testkit::net::listener();
    let registry = Telemetry::new();
    let p = processor(&registry, vec![format!("http://{addr}")], Duration::from_millis(500));
    run(&p, &input_a, 5, Duration::from_secs(1)).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    run(&p, &input_a, 1, Duration::from_secs(1)).await;
    let m = registry.render();
    assert_eq!(counter(&m, "profcol_processor_user_symbols_debuginfod_requests_total{outcome=\"error\""), 1, "{m}");
    assert!(counter(&m, "profcol_processor_user_symbols_frames_total{outcome=\"unnamed_pending\"") >= 2, "{m}");
    drop(silent);
}

/// Sends `batch` to an OTLP/HTTP receiver as an agent's exporter does.
async fn send_otlp(http: std::net::SocketAddr, batch: &Profiles) {
    let r = reqwest::Client::new()
        .post(format!("http://{http}/v1development/profiles"))
        .header("content-type", "application/x-protobuf")
        .body(batch.encode_to_vec())
        .send()
        .await
        .expect("the receiver answers");
    assert!(r.status().is_success(), "the receiver took the batch: {}", r.status());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_a_gateway_frames_of_a_binary_not_on_this_host_are_named_from_its_executable_on_debuginfod() {
    if !tools_available() || !tool_available("debuginfod", &["--version"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    // `g`: stripped executable and debug file on the server; `m`: nothing.
    let g = compile(dir.path(), "g", 23);
    stripped(&g, &served.join("g"));
    debug_file(&g, &served.join("g.debug"));
    let m = compile(dir.path(), "m", 24);
    let (g_id, m_id) = (build_id(&g), build_id(&m));
    let (_server, url) = start_server_serving(
        &served,
        &dir.path().join("db.sqlite"),
        &[&format!("{g_id}/executable"), &format!("{g_id}/debuginfo")],
    )
    .await;

    // The paths the agents' processes mapped: not on this host.
    let g_path = dir.path().join("agent-host/usr/bin/g");
    let m_path = dir.path().join("agent-host/usr/bin/m");
    assert!(!g_path.exists() && !m_path.exists());
    let elf_g = profcol_elf::ElfFile::open(&std::fs::File::open(&g).unwrap()).unwrap();
    let mid = |elf: &profcol_elf::ElfFile, f: &str| {
        let (start, size) = symbol(elf, f);
        start + size / 2
    };
    let stack: Vec<u64> = ["leaf_work", "middle", "outer_loop", "main"].iter().map(|f| mid(&elf_g, f)).collect();
    let elf_m = profcol_elf::ElfFile::open(&std::fs::File::open(&m).unwrap()).unwrap();
    let m_stack = [mid(&elf_m, "leaf_work"), mid(&elf_m, "middle")];

    // Agent → OTLP/HTTP → the gateway's receiver, which hands on what a
    // pipeline's processors get.
    let (receiver, arrived) = profcol_receivers::otlp::testing::collecting_receiver(
        "otlp",
        profcol_receivers::otlp::testing::receiver_config(None, Some(profcol_receivers::otlp::testing::LOOPBACK)),
    )
    .await;
    let http = receiver.http_addr().unwrap();
    send_otlp(http, &batch(&g_path, &g_id, &stack, &elf_g)).await;
    send_otlp(http, &batch(&m_path, &m_id, &m_stack, &elf_m)).await;
    arrived.wait_for(2, Duration::from_secs(10)).await;
    let inputs: Vec<Profiles> = arrived.batches.lock().unwrap().clone();
    assert_eq!(inputs.len(), 2);
    let (input_g, input_m) = (&inputs[0], &inputs[1]);

    let registry = Telemetry::new();
    let p = gateway_processor(&registry, url);
    let deadline = Instant::now() + Duration::from_secs(20);
    let out_g = loop {
        let out = p.process(input_g.clone()).await.unwrap().forwarded().unwrap();
        if frames(&out)[1..=stack.len()].iter().all(|f| !f.is_empty()) {
            break out;
        }
        assert!(Instant::now() < deadline, "never named from debuginfod\n{}", registry.render());
    };
    // As binutils names the unstripped binary at the same offsets (each
    // outer frame at its return address − 1).
    let named = native_frames(std::slice::from_ref(&out_g), &["/g"]);
    assert_eq!(named.len(), stack.len());
    let (agree, total, diffs) = agreement(&g, &named);
    assert_eq!(agree, total, "{diffs:#?}");
    assert!(named.iter().all(|f| f.build_id.as_deref() == Some(&*g_id) && !f.frames.is_empty()));
    assert!(named[0].frames[0].2 > 0, "a line number came from the downloaded debug file");

    // A build id the server lacks: unnamed, build id and offsets intact.
    let out_m = run(&p, input_m, 5, Duration::from_secs(3)).await;
    let before = native_frames(std::slice::from_ref(input_m), &["/m"]);
    let after = native_frames(std::slice::from_ref(&out_m), &["/m"]);
    assert_eq!(after.len(), m_stack.len());
    for (a, b) in after.iter().zip(&before) {
        assert!(a.frames.is_empty(), "nothing names m: {:?}", a.frames);
        assert_eq!((a.build_id.as_deref(), a.lookup_offset), (Some(&*m_id), b.lookup_offset));
    }
    let m = registry.render();
    // g: its executable and its debug file; m: its executable, once.
    assert_eq!(counter(&m, "profcol_processor_user_symbols_debuginfod_requests_total{outcome=\"ok\""), 2, "{m}");
    assert_eq!(counter(&m, "profcol_processor_user_symbols_debuginfod_requests_total{outcome=\"not_found\""), 1);
    assert!(counter(&m, "profcol_processor_user_symbols_frames_total{outcome=\"unnamed_no_file\"") >= 2 * 5, "{m}");
    receiver.shutdown().await.unwrap();
}
