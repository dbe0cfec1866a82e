//! `service.plugins.perf_map`: a plugin compiled by an engine without the
//! perf map (another process, filling the disk cache) and loaded from that
//! cache by an engine with it still gets its functions into
//! `/tmp/perf-<pid>.map`, at addresses of executable memory of this process.
//! Its own test binary: the setting is fixed when the process-wide engine
//! is made, so it must not leak into other tests.

mod common;
use common::*;
use profcol_api::component::Processor;
use profcol_api::telemetry::Telemetry;
use profcol_testkit::prelude::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// Set in the child process that fills the cache with perf_map off.
const CHILD_CACHE: &str = "PROFCOL_TEST_PERF_MAP_CHILD_CACHE";

fn perf_map_file(pid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/perf-{pid}.map"))
}

fn compiles(t: &Telemetry, source: &str) -> u64 {
    metric(t, &format!("profcol_plugin_compiles_total{{component=\"wasm/test\",source=\"{source}\"}}"))
}

/// Loads the `misbehave` plugin through the real factory and runs it once;
/// the plugin's code stays mapped while the returned processor lives.
fn load_and_run(cache: &Path, perf_map: bool) -> (Telemetry, Arc<dyn Processor>, tokio::runtime::Runtime) {
    profcol_plugins::set_cache_dir(Some(cache.to_owned()));
    profcol_plugins::set_perf_map(perf_map);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let t = Telemetry::new();
    let p = rt.block_on(async {
        let p = processor("path: PLUGIN\nconfig: {mode: pass}", &t);
        let input = batch();
        assert_passed(p.process(input.clone()).await.unwrap(), &input);
        p
    });
    (t, p, rt)
}

/// The child's part (a no-op unless the parent test runs it): compile with
/// perf_map off into the cache directory the parent names.
#[test]
fn child_fills_the_cache_without_perf_map() {
    let Some(cache) = std::env::var_os(CHILD_CACHE) else { return };
    let (t, _p, _rt) = load_and_run(Path::new(&cache), false);
    assert_eq!(compiles(&t, "compile"), 1, "the child compiled the plugin");
    assert!(!perf_map_file(std::process::id()).exists(), "perf_map off wrote a perf map");
}

/// `START SIZE NAME` with hex START (wasmtime writes it with `0x`) and SIZE.
fn parse(line: &str) -> Option<(u64, u64, &str)> {
    let mut f = line.splitn(3, ' ');
    let start = f.next()?;
    let start = u64::from_str_radix(start.strip_prefix("0x").unwrap_or(start), 16).ok()?;
    let size = u64::from_str_radix(f.next()?, 16).ok()?;
    Some((start, size, f.next()?))
}

fn head(text: &str) -> String {
    text.lines().take(20).collect::<Vec<_>>().join("\n")
}

/// Whether `start..end` lies inside one executable mapping of this process.
fn executable(start: u64, end: u64) -> bool {
    std::fs::read_to_string("/proc/self/maps").unwrap().lines().any(|l| {
        let mut f = l.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else { return false };
        let Some((lo, hi)) = range.split_once('-') else { return false };
        let (lo, hi) = (u64::from_str_radix(lo, 16).unwrap(), u64::from_str_radix(hi, 16).unwrap());
        perms.contains('x') && lo <= start && end <= hi
    })
}

#[test]
fn plugin_functions_loaded_from_a_cache_compiled_without_perf_map_are_in_the_perf_map() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    // Build the plugin here, not inside the child (whose output is only shown on failure).
    test_plugin("misbehave");

    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_fills_the_cache_without_perf_map", "--nocapture", "--test-threads=1"])
        .env(CHILD_CACHE, &cache)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&child.stdout);
    assert!(child.status.success() && out.contains("1 passed"), "child failed:\n{out}{}", child.stderr.escape_ascii());
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1, "the child left one compiled plugin in the cache");

    let map = perf_map_file(std::process::id());
    // A file left by an earlier process with this pid would prove nothing.
    let _ = std::fs::remove_file(&map);
    let (t, _p, _rt) = load_and_run(&cache, true);
    assert_eq!((compiles(&t, "cache"), compiles(&t, "compile")), (1, 0), "loaded from the child's cache");

    let text = std::fs::read_to_string(&map).unwrap_or_else(|e| panic!("{}: {e}", map.display()));
    let _ = std::fs::remove_file(&map);
    // The plugin's own code, under its name-section names: the export the
    // host just called, and a function of the plugin crate (mangled Rust).
    for wanted in ["profcol:plugin/process-batch@0.1.0#process", "_ZN9misbehave7recurse"] {
        let line =
            text.lines().find(|l| l.split(' ').nth(2).is_some_and(|n| n.starts_with(wanted))).unwrap_or_else(|| {
                panic!("no line of {} names {wanted}; the first:\n{}", text.lines().count(), head(&text))
            });
        let (start, size, _) = parse(line).unwrap_or_else(|| panic!("not `START SIZE NAME`: {line}"));
        assert!(size > 0, "{line}");
        assert!(executable(start, start + size), "{line} is not inside an executable mapping of this process");
    }
    // Every line parses and points into executable memory.
    for l in text.lines() {
        let (s, n, _) = parse(l).unwrap_or_else(|| panic!("not `START SIZE NAME`: {l}"));
        assert!(executable(s, s + n), "{l} is not inside an executable mapping");
    }
}
