//! Plugin host costs, each beside its baseline in the same run (medians):
//! - a no-op processor plugin (returns its input bytes without decoding) on
//!   a 10k-sample batch, against a native decode + encode_to_vec (the floor);
//! - a pass-through through the guest SDK (decodes and re-encodes in wasm:
//!   `examples/plugins/pass_through`) beside it;
//! - `drop_frames` in wasm against the same code compiled natively (its
//!   `process_bytes`: decode, drop, encode), on the same batch;
//! - per-call overhead on a 1-sample batch;
//! - start-up of each plugin (compile or cache load, link, one instance with
//!   init) with a warm on-disk cache against a cold one, and one more
//!   instance of a loaded plugin (the Python one's is the large cost).
//!
//! Run: `cargo bench -p profcol-plugins --bench plugin_calls`
//! (builds plugins/testdata and examples/plugins first).

use profcol_api::component::{Component, ComponentId, CreateSettings, Factory, Kind, Processor};
use profcol_api::telemetry::Telemetry;
use profcol_api::Profiles;
use profcol_plugin_sdk::Processor as _;
use profcol_plugins::processor::ProcessorFactory;
use profcol_plugins::{Plugin, PluginSettings, World};
use profcol_testkit::prelude::*;
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Median time of `f` over `runs` runs (after `runs / 10` warm-up runs).
fn time(runs: usize, mut f: impl FnMut()) -> Duration {
    time_with(runs, || (), |()| f())
}

/// The same, with an input made by `make` before each run, outside the
/// timed part (an owned batch for `process`).
fn time_with<I>(runs: usize, mut make: impl FnMut() -> I, mut f: impl FnMut(I)) -> Duration {
    for _ in 0..runs / 10 {
        f(make());
    }
    median(
        (0..runs)
            .map(|_| {
                let input = make();
                let t = Instant::now();
                f(input);
                t.elapsed()
            })
            .collect(),
    )
}

/// Medians of `a` and `b` run alternately (`runs` each): on a loaded
/// machine both see the same drift, so their ratio holds better.
fn interleaved(runs: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> (Duration, Duration) {
    let (mut ta, mut tb) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for i in 0..runs + runs / 10 {
        let t = Instant::now();
        a();
        let da = t.elapsed();
        let t = Instant::now();
        b();
        let db = t.elapsed();
        if i >= runs / 10 {
            ta.push(da);
            tb.push(db);
        }
    }
    (median(ta), median(tb))
}

/// A `wasm/bench` processor made by the real factory.
fn processor(plugin: &Path, config: &str) -> Arc<dyn Processor> {
    let yaml = format!("path: {}\nconfig: {config}\ncall_timeout: 10s", plugin.display());
    let raw = profcol_config::parse_section(&yaml).unwrap();
    ProcessorFactory.check(&raw).unwrap();
    let id: ComponentId = "wasm/bench".parse().unwrap();
    let settings = CreateSettings {
        telemetry: Telemetry::new().component(Kind::Processor, &id),
        id,
        services: Default::default(),
    };
    match ProcessorFactory.create(settings, &raw).unwrap() {
        Component::Processor(p) => p,
        _ => unreachable!(),
    }
}

fn settings(config_json: &str) -> PluginSettings {
    PluginSettings {
        component: "wasm/bench".into(),
        config_json: config_json.into(),
        call_timeout: Duration::from_secs(10),
        memory_limit: 256 << 20,
        pool_size: 1,
        keep_idle: 1,
        max_failures: 5,
        failure_window: Duration::from_secs(60),
        allow: Default::default(),
        inherit_stdio: false,
    }
}

/// A plugin loaded directly, to call with bytes on this thread.
fn direct(path: &Path, config_json: &str) -> Arc<Plugin> {
    Plugin::load(&std::fs::read(path).unwrap(), World::Processor, settings(config_json), Telemetry::new())
        .unwrap()
        .plugin
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

const DROP_PATTERN: &str = "^(compute|hash_block)$";

fn main() {
    let noop_path = test_plugin("misbehave");
    let pass_path = example_plugin("pass_through");
    // PLUGIN_BENCH_DROP_FRAMES: another build of drop_frames.wasm (another
    // opt-level, say) to compare with the same native code.
    let drop_path = std::env::var_os("PLUGIN_BENCH_DROP_FRAMES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| example_plugin("drop_frames"));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let _guard = rt.enter();
    let runs = 200;

    // 1. A 10k-sample batch: the floor, the no-op, the SDK pass-through.
    let big = cpu_batch(1, 10, 1000);
    let bytes = big.encode_to_vec();
    let messages: usize = big.profiles().map(|p| p.samples.len()).sum();
    println!("batch: {messages} Sample messages ({} observations), {} bytes encoded", big.sample_count(), bytes.len());
    let floor = time(runs, || {
        let p = Profiles::decode(black_box(&bytes)).unwrap();
        black_box(p.encode_to_vec());
    });
    println!("10k: native decode + encode_to_vec (the floor): {:.0} us", us(floor));
    let report = |what: &str, d: Duration, goal: &str| {
        println!("10k: {what}: {:.0} us = {:.2}x floor{goal}", us(d), ratio(d, floor));
    };

    let noop = processor(&noop_path, "{mode: pass}");
    let noop_direct = direct(&noop_path, "{\"mode\": \"pass\"}");
    let d = time(runs, || {
        black_box(noop_direct.process_blocking(black_box(&bytes)).unwrap().unwrap());
    });
    report("no-op plugin call alone (bytes in, bytes out)", d, "");
    let d = time_with(
        runs,
        || big.clone(),
        |b| {
            black_box(rt.block_on(noop.process(b)).unwrap());
        },
    );
    report("no-op processor, whole process() (encode, call, decode, validate)", d, " (goal <= 1.5x)");

    let pass = processor(&pass_path, "null");
    let pass_direct = direct(&pass_path, "null");
    let (floor_again, d) = interleaved(
        runs,
        || {
            let p = Profiles::decode(black_box(&bytes)).unwrap();
            black_box(p.encode_to_vec());
        },
        || {
            black_box(pass_direct.process_blocking(black_box(&bytes)).unwrap().unwrap());
        },
    );
    println!("10k: the floor again, alternating with the next: {:.0} us", us(floor_again));
    println!(
        "10k: SDK pass-through call alone (decode + encode in wasm): {:.0} us = {:.2}x that floor (goal <= 4x)",
        us(d),
        ratio(d, floor_again)
    );
    let d = time_with(
        runs,
        || big.clone(),
        |b| {
            black_box(rt.block_on(pass.process(b)).unwrap());
        },
    );
    report("SDK pass-through processor, whole process()", d, "");

    // 2. drop_frames: the same code natively and in wasm, bytes in and out.
    let config = format!("{{\"pattern\": \"{DROP_PATTERN}\"}}");
    let mut native = drop_frames::DropFrames::init(&config).unwrap();
    let out_native = native.process_bytes(bytes.clone()).unwrap().unwrap();
    let drop_direct = direct(&drop_path, &config);
    let out_wasm = drop_direct.process_blocking(&bytes).unwrap().unwrap().unwrap();
    assert_eq!(out_native, out_wasm, "native and wasm drop_frames give the same bytes");
    let (native_t, wasm_t) = interleaved(
        runs,
        || {
            black_box(native.process_bytes(black_box(bytes.clone())).unwrap());
        },
        || {
            black_box(drop_direct.process_blocking(black_box(&bytes)).unwrap().unwrap());
        },
    );
    let drop = processor(&drop_path, &format!("{{pattern: '{DROP_PATTERN}'}}"));
    let whole = time_with(
        runs,
        || big.clone(),
        |b| {
            black_box(rt.block_on(drop.process(b)).unwrap());
        },
    );
    println!(
        "10k: drop_frames native process_bytes (decode, drop, encode): {:.0} us; in wasm, call alone: {:.0} us = {:.2}x native (goal <= 2x); whole process(): {:.0} us",
        us(native_t),
        us(wasm_t),
        ratio(wasm_t, native_t),
        us(whole)
    );

    // 3. Per-call overhead on a 1-sample batch.
    let one = cpu_batch(2, 1, 1);
    let one_bytes = one.encode_to_vec();
    let one_native = time(5000, || {
        let p = Profiles::decode(black_box(&one_bytes)).unwrap();
        black_box(p.encode_to_vec());
    });
    let one_call = time(5000, || {
        black_box(noop_direct.process_blocking(black_box(&one_bytes)).unwrap().unwrap());
    });
    let one_process = time_with(
        5000,
        || one.clone(),
        |b| {
            black_box(rt.block_on(noop.process(b)).unwrap());
        },
    );
    println!("1 sample: native decode + encode {:.1} us", us(one_native));
    println!("1 sample: no-op plugin call on the calling thread {:.1} us", us(one_call));
    // What handing any work to tokio's blocking pool and back costs here
    // (two thread wake-ups): the part of process() that is not the plugin's.
    let handoff = time(5000, || {
        rt.block_on(tokio::task::spawn_blocking(|| black_box(()))).unwrap();
    });
    println!("1 sample: whole process() through the blocking pool {:.1} us (goal <= 20 us)", us(one_process));
    println!("1 sample: an empty spawn_blocking round trip (baseline of the hand-off) {:.1} us", us(handoff));

    // 4. Start-up: cold (empty cache directory) vs warm (artifact on disk),
    //    per plugin; then one more instance of the loaded plugin.
    let runtime = profcol_plugins::runtime::runtime().unwrap();
    let plugins = [
        ("misbehave (test plugin)", noop_path.clone(), "{\"mode\": \"pass\"}".to_owned(), 5),
        ("drop_frames", drop_path.clone(), config.clone(), 5),
        ("pass_through", pass_path.clone(), "null".to_owned(), 5),
        (
            "redact_paths (Python)",
            example_plugin("redact_paths"),
            "{\"pattern\": \"^src/\", \"replacement\": \"r/\"}".to_owned(),
            3,
        ),
    ];
    for (name, path, config, rounds) in plugins {
        let wasm = std::fs::read(&path).unwrap();
        let (mut cold, mut warm, mut instance) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let dir = tempfile::tempdir().unwrap();
            profcol_plugins::set_cache_dir(Some(dir.path().to_owned()));
            for (samples, source) in [(&mut cold, "compile"), (&mut warm, "cache")] {
                runtime.forget_in_memory();
                let t = Instant::now();
                let loaded = Plugin::load(&wasm, World::Processor, settings(&config), Telemetry::new()).unwrap();
                samples.push(t.elapsed());
                assert_eq!(loaded.source.as_str(), source);
                let t = Instant::now();
                loaded.plugin.grow_pool(2).unwrap();
                instance.push(t.elapsed());
            }
        }
        let (cold, warm, instance) = (median(cold), median(warm), median(instance));
        println!(
            "start-up of {name} ({} KiB): cold cache {:.1} ms, warm cache {:.1} ms ({:.0}x); one more instance (instantiate + init) {:.2} ms",
            wasm.len() / 1024,
            ms(cold),
            ms(warm),
            ratio(cold, warm),
            ms(instance)
        );
    }
}
