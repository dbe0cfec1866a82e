//! Plugin host costs, each beside its baseline in the same run:
//! - a no-op processor plugin (returns its input bytes without decoding) on
//!   a 10k-sample batch, against a native decode + encode_to_vec (the floor);
//! - per-call overhead on a 1-sample batch;
//! - start-up (compile or cache load, link, one instance with init) with a
//!   warm on-disk cache against a cold one.
//!
//! Run: `cargo bench -p profcol-plugins --bench plugin_calls`
//! (builds plugins/testdata first; medians of many runs).

use profcol_api::component::{Component, ComponentId, CreateSettings, Factory, Kind, Processor};
use profcol_api::telemetry::Telemetry;
use profcol_api::Profiles;
use profcol_plugins::processor::ProcessorFactory;
use profcol_plugins::{Plugin, PluginSettings, World};
use profcol_testkit::prelude::*;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Median time of `f` over `runs` runs (after `runs / 10` warm-up runs).
fn time(runs: usize, mut f: impl FnMut()) -> Duration {
    for _ in 0..runs / 10 {
        f();
    }
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

fn processor(plugin: &str, mode: &str) -> Arc<dyn Processor> {
    let raw =
        profcol_config::parse_section(&format!("path: {plugin}\nconfig: {{mode: {mode}}}\ncall_timeout: 10s")).unwrap();
    ProcessorFactory.check(&raw).unwrap();
    let id: ComponentId = "wasm/bench".parse().unwrap();
    let settings = CreateSettings { telemetry: Telemetry::new().component(Kind::Processor, &id), id };
    match ProcessorFactory.create(settings, &raw).unwrap() {
        Component::Processor(p) => p,
        _ => unreachable!(),
    }
}

fn settings() -> PluginSettings {
    PluginSettings {
        component: "wasm/bench".into(),
        config_json: "{\"mode\": \"pass\"}".into(),
        call_timeout: Duration::from_secs(10),
        memory_limit: 64 << 20,
        pool_size: 1,
        keep_idle: 1,
        max_failures: 5,
        failure_window: Duration::from_secs(60),
        allow: Default::default(),
        inherit_stdio: false,
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let path = test_plugin("misbehave");
    let plugin = path.to_str().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let _guard = rt.enter();

    // 1. No-op processor on a 10k-sample batch vs the native floor.
    let big = cpu_batch(1, 10, 1000);
    let bytes = big.encode_to_vec();
    println!("batch: {} samples, {} bytes encoded", big.sample_count(), bytes.len());
    let floor = time(200, || {
        let p = Profiles::decode(black_box(&bytes)).unwrap();
        black_box(p.encode_to_vec());
    });
    let noop = processor(plugin, "pass");
    let through_processor = time(200, || {
        black_box(rt.block_on(noop.process(big.clone())).unwrap());
    });
    let clone = time(200, || {
        black_box(big.clone());
    });
    let direct =
        Plugin::load(&std::fs::read(&path).unwrap(), World::Processor, settings(), Telemetry::new()).unwrap().plugin;
    let call_only = time(200, || {
        black_box(direct.process_blocking(black_box(&bytes)).unwrap().unwrap());
    });
    println!("10k samples: native decode+encode (floor) {:.0} us", us(floor));
    println!(
        "10k samples: wasm no-op processor, whole process() (encode, call, decode, validate) {:.0} us = {:.2}x floor (batch clone in the loop: {:.0} us)",
        us(through_processor),
        through_processor.as_secs_f64() / floor.as_secs_f64(),
        us(clone)
    );
    println!(
        "10k samples: plugin call alone (bytes in, bytes out) {:.0} us = {:.2}x floor",
        us(call_only),
        call_only.as_secs_f64() / floor.as_secs_f64()
    );

    // 2. Per-call overhead on a 1-sample batch.
    let one = cpu_batch(2, 1, 1);
    let one_bytes = one.encode_to_vec();
    let one_native = time(5000, || {
        let p = Profiles::decode(black_box(&one_bytes)).unwrap();
        black_box(p.encode_to_vec());
    });
    let one_call = time(5000, || {
        black_box(direct.process_blocking(black_box(&one_bytes)).unwrap().unwrap());
    });
    let one_process = time(5000, || {
        black_box(rt.block_on(noop.process(one.clone())).unwrap());
    });
    println!("1 sample: native decode+encode {:.1} us", us(one_native));
    println!("1 sample: plugin call on the calling thread {:.1} us", us(one_call));
    println!("1 sample: whole process() through the blocking pool {:.1} us", us(one_process));

    // 3. Start-up: cold (empty cache directory) vs warm (artifact on disk).
    let wasm = std::fs::read(&path).unwrap();
    let runtime = profcol_plugins::runtime::runtime().unwrap();
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        profcol_plugins::set_cache_dir(Some(dir.path().to_owned()));
        for (samples, source) in [(&mut cold, "compile"), (&mut warm, "cache")] {
            runtime.forget_in_memory();
            let t = Instant::now();
            let loaded = Plugin::load(&wasm, World::Processor, settings(), Telemetry::new()).unwrap();
            samples.push(t.elapsed());
            assert_eq!(loaded.source.as_str(), source);
        }
    }
    let (cold, warm) = (median(cold), median(warm));
    println!(
        "start-up of one plugin ({} KiB): cold cache {:.1} ms, warm cache {:.1} ms ({:.0}x)",
        wasm.len() / 1024,
        cold.as_secs_f64() * 1e3,
        warm.as_secs_f64() * 1e3,
        cold.as_secs_f64() / warm.as_secs_f64()
    );
}
