//! user_symbols with Debian's `debuginfod` server, started here on a
//! directory holding one debug file: a stripped binary is named with file
//! and line from the downloaded debug file; a build id the server lacks,
//! a server that is down and one that never answers leave frames unnamed
//! without holding batches, and each build id is asked for once per
//! `debuginfod.negative_ttl`, however many batches ask.
//!
//!     cargo test -p profcol-processors --test user_symbols_debuginfod

mod user_symbols_common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use profcol_api::component::{ComponentId, Kind, Processor};
use profcol_api::services::FilePins;
use profcol_api::telemetry::Telemetry;
use profcol_api::Profiles;
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

/// Starts debuginfod on `dir` and waits until it serves `build_id`.
async fn start_server(dir: &std::path::Path, db: &std::path::Path, build_id: &str) -> (Server, String) {
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
        let probe = format!("{url}/buildid/{build_id}/debuginfo");
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(r) = reqwest::get(&probe).await {
                if r.status().is_success() {
                    return (server, url);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Port taken meanwhile, or the scan never found the file: try again.
    }
    panic!("debuginfod never served {build_id}");
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
