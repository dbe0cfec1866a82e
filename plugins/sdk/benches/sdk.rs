//! What the SDK adds to a plugin's call, natively, on a 10k-sample batch
//! (2k distinct stacks of depth 30 over 600 functions, 50 processes): the
//! floor is decoding and encoding the batch (what any plugin that changes a
//! batch pays); beside it, the same plus `retain_frames` dropping ~1/6 of
//! the frames (drop_frames' work), plus `set_resource_attribute`
//! (add_attribute's), and `folded` (folded_exporter's, against the decode alone).
//!
//! cargo bench --manifest-path plugins/Cargo.toml -p profcol-plugin-sdk --bench sdk

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use profcol_plugin_sdk::{Batch, BatchBuilder, FrameSpec, ProfileSpec, SampleSpec, Value};

const SAMPLES: usize = 10_000;
const STACKS: usize = 2_000;
const DEPTH: usize = 30;
const PROCS: usize = 50;

fn batch() -> Vec<u8> {
    let mut x = 0x2545F4914F6CDD1Du64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let names: Vec<String> = (0..600)
        .map(|i| if i % 6 == 0 { format!("std::rt::f{i}") } else { format!("app::module{}::f{i}", i % 40) })
        .collect();
    // Stacks share their outer frames, as real ones do.
    let stacks: Vec<Vec<usize>> =
        (0..STACKS).map(|s| (0..DEPTH).map(|d| (s % (50 + d * 20)) * 7 + d * 13).collect()).collect();
    let mut b = BatchBuilder::new();
    let pids: Vec<[(&str, Value); 1]> = (0..PROCS).map(|p| [("process.pid", Value::Int(p as i64))]).collect();
    let profiles: Vec<_> = pids
        .iter()
        .map(|r| {
            b.profile(&ProfileSpec {
                resource: r,
                sample_type: ("samples", "count"),
                period_type: ("cpu", "nanoseconds"),
                period: 10_000_000,
                ..Default::default()
            })
        })
        .collect();
    let mut frames = Vec::with_capacity(DEPTH);
    for k in 0..SAMPLES {
        let (p, tid, s) = ((rnd() as usize) % PROCS, (rnd() % 16) as i64, (rnd() as usize) % STACKS);
        frames.clear();
        frames.extend(stacks[s].iter().map(|&f| FrameSpec {
            function: &names[f % names.len()],
            file: "src/lib.rs",
            line: f as i64,
            mapping: "/usr/bin/app",
            address: 0x400000 + f as u64 * 16,
            frame_type: None,
        }));
        let attrs = [("thread.id", Value::Int(tid))];
        b.sample(
            profiles[p],
            &SampleSpec { frames: &frames, values: &[1], timestamps_unix_nano: &[k as u64], attributes: &attrs },
        );
    }
    b.build().encode()
}

fn bench(c: &mut Criterion) {
    let bytes = batch();
    let mut g = c.benchmark_group("sdk");
    g.throughput(Throughput::Elements(SAMPLES as u64));
    g.bench_function("decode", |b| b.iter(|| Batch::decode(&bytes).unwrap()));
    g.bench_function("decode+encode (floor)", |b| b.iter(|| Batch::decode(&bytes).unwrap().encode()));
    g.bench_function("decode+retain_frames+encode", |b| {
        b.iter(|| {
            let mut batch = Batch::decode(&bytes).unwrap();
            batch.retain_frames(|f| !f.function_name().is_some_and(|n| n.starts_with("std::")));
            batch.encode()
        })
    });
    g.bench_function("decode+set_resource_attribute+encode", |b| {
        b.iter(|| {
            let mut batch = Batch::decode(&bytes).unwrap();
            batch.set_resource_attribute("deployment.environment", Value::Str("prod"));
            batch.encode()
        })
    });
    g.bench_function("decode+folded", |b| b.iter(|| Batch::decode(&bytes).unwrap().folded(true)));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
