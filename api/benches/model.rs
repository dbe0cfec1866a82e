//! The data model on a realistic batch: 10k samples, 2k distinct stacks of
//! depth 30, 50 processes. Building with interning is compared side by side
//! with building the same data as plain prost structs without interning (the
//! baseline), and encode / decode / merge are measured on the result. The
//! `compact` group times dictionary compaction of the batch as a frame
//! rewriter leaves it, next to encoding the same batch (the baseline).
//!
//! cargo bench -p profcol-api --bench model
//! cargo bench -p profcol-api --bench model -- compact

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use profcol_api::model::{pb, AttrValue, KeyValue, ProfileMeta, Resource};
use profcol_api::{Profiles, ProfilesBuilder};

const SAMPLES: usize = 10_000;
const STACKS: usize = 2_000;
const DEPTH: usize = 30;
const PROCS: usize = 50;

/// The raw input as an agent holds it: per sample a pid, tid and addresses.
struct Raw {
    samples: Vec<(usize, i64, usize)>,
    stacks: Vec<Vec<u64>>,
}

fn raw() -> Raw {
    let mut x = 0x2545F4914F6CDD1Du64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    // Stacks share their outer frames, as real ones do.
    let stacks = (0..STACKS)
        .map(|s| (0..DEPTH).map(|d| 0x400000 + ((s % (50 + d * 20)) * DEPTH + d) as u64 * 16).collect())
        .collect();
    let samples =
        (0..SAMPLES).map(|_| ((rnd() as usize) % PROCS, (rnd() % 16) as i64, (rnd() as usize) % STACKS)).collect();
    Raw { samples, stacks }
}

fn meta() -> ProfileMeta<'static> {
    ProfileMeta::cpu(10_000_000, 0, 0)
}

fn build_interned(r: &Raw) -> Profiles {
    let mut b = ProfilesBuilder::new();
    let profiles: Vec<_> = (0..PROCS)
        .map(|p| {
            let res = Resource {
                attributes: vec![KeyValue {
                    key: "process.pid".into(),
                    value: Some(AttrValue::Int(p as i64).to_any()),
                    ..Default::default()
                }],
                ..Default::default()
            };
            let ri = b.resource(res);
            b.profile(ri, &meta())
        })
        .collect();
    let file = b.string("/usr/bin/app");
    let m = b.mapping(pb::Mapping {
        memory_start: 0x400000,
        memory_limit: 0x900000,
        filename_strindex: file,
        ..Default::default()
    });
    let mut locs = Vec::with_capacity(DEPTH);
    for (i, &(p, tid, s)) in r.samples.iter().enumerate() {
        locs.clear();
        for &addr in &r.stacks[s] {
            locs.push(b.location(pb::Location { mapping_index: m, address: addr, ..Default::default() }));
        }
        let st = b.stack(&locs);
        let a = b.attribute("thread.id", AttrValue::Int(tid));
        b.sample(
            profiles[p],
            pb::Sample {
                stack_index: st,
                attribute_indices: vec![a],
                values: vec![1],
                timestamps_unix_nano: vec![i as u64],
                link_index: 0,
            },
        );
    }
    b.build()
}

/// Baseline: the same data with every table entry pushed as it comes.
fn build_plain(r: &Raw) -> pb::ProfilesData {
    let mut d = pb::ProfilesDictionary {
        string_table: vec![
            String::new(),
            "samples".into(),
            "count".into(),
            "cpu".into(),
            "nanoseconds".into(),
            "/usr/bin/app".into(),
            "thread.id".into(),
        ],
        mapping_table: vec![
            Default::default(),
            pb::Mapping { memory_start: 0x400000, memory_limit: 0x900000, filename_strindex: 5, ..Default::default() },
        ],
        location_table: vec![Default::default()],
        stack_table: vec![Default::default()],
        attribute_table: vec![Default::default()],
        ..Default::default()
    };
    let mut rps: Vec<pb::ResourceProfiles> = (0..PROCS)
        .map(|p| pb::ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "process.pid".into(),
                    value: Some(AttrValue::Int(p as i64).to_any()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_profiles: vec![pb::ScopeProfiles {
                profiles: vec![pb::Profile {
                    sample_type: Some(pb::ValueType { type_strindex: 1, unit_strindex: 2 }),
                    period_type: Some(pb::ValueType { type_strindex: 3, unit_strindex: 4 }),
                    period: 10_000_000,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    for (i, &(p, tid, s)) in r.samples.iter().enumerate() {
        let mut locs = Vec::with_capacity(DEPTH);
        for &addr in &r.stacks[s] {
            d.location_table.push(pb::Location { mapping_index: 1, address: addr, ..Default::default() });
            locs.push((d.location_table.len() - 1) as i32);
        }
        d.stack_table.push(pb::Stack { location_indices: locs });
        d.attribute_table.push(pb::KeyValueAndUnit {
            key_strindex: 6,
            value: Some(AttrValue::Int(tid).to_any()),
            unit_strindex: 0,
        });
        rps[p].scope_profiles[0].profiles[0].samples.push(pb::Sample {
            stack_index: (d.stack_table.len() - 1) as i32,
            attribute_indices: vec![(d.attribute_table.len() - 1) as i32],
            values: vec![1],
            timestamps_unix_nano: vec![i as u64],
            link_index: 0,
        });
    }
    pb::ProfilesData { resource_profiles: rps, dictionary: Some(d) }
}

/// `built` as a frame-rewriting processor (kernel_symbols) leaves it: 30% of
/// the locations get a rewritten copy appended, every stack using one is
/// re-interned and samples moved to it; the originals stay behind, dead.
fn with_dead(built: &Profiles) -> Profiles {
    let mut b = ProfilesBuilder::from_profiles(built.clone());
    let file = b.string("[kernel.kallsyms]");
    let m = b.mapping(pb::Mapping { memory_limit: u64::MAX, filename_strindex: file, ..Default::default() });
    let n = b.dictionary().location_table.len();
    let mut locs: Vec<i32> = (0..n as i32).collect();
    for (i, new) in locs.iter_mut().enumerate().skip(1).filter(|(i, _)| i % 10 < 3) {
        let l = &b.dictionary().location_table[i];
        *new = b.location(pb::Location { mapping_index: m, address: l.address | 1 << 63, ..Default::default() });
    }
    let mut buf = Vec::new();
    let stacks: Vec<i32> = (0..b.dictionary().stack_table.len())
        .map(|i| {
            buf.clear();
            buf.extend(b.dictionary().stack_table[i].location_indices.iter().map(|&l| locs[l as usize]));
            b.stack(&buf)
        })
        .collect();
    let mut p = b.build();
    for rp in &mut p.0.resource_profiles {
        for prof in rp.scope_profiles.iter_mut().flat_map(|s| &mut s.profiles) {
            for s in &mut prof.samples {
                s.stack_index = stacks[s.stack_index as usize];
            }
        }
    }
    p
}

fn entries(p: &Profiles) -> usize {
    p.table_sizes().iter().sum()
}

fn bench_compact(c: &mut Criterion, built: &Profiles) {
    let dead = with_dead(built);
    let mut compacted = dead.clone();
    let removed = compacted.compact();
    eprintln!(
        "compact: {} of {} dictionary entries dead ({:.0}%: {removed:?}); encoded {} -> {} bytes",
        removed.total(),
        entries(&dead),
        100.0 * removed.total() as f64 / entries(&dead) as f64,
        dead.encoded_len(),
        compacted.encoded_len()
    );
    let mut g = c.benchmark_group("compact");
    g.throughput(Throughput::Elements(SAMPLES as u64));
    g.sample_size(20);
    g.bench_function("with_dead", |b| b.iter_batched(|| dead.clone(), |mut p| (p.compact(), p), BatchSize::LargeInput));
    g.bench_function("encode_with_dead (baseline)", |b| b.iter(|| dead.encode_to_vec()));
    // Nothing dead: a no-op, so the same batch can be reused.
    let mut clean = built.clone();
    g.bench_function("nothing_dead", |b| b.iter(|| clean.compact()));
    g.bench_function("encode_compacted", |b| b.iter(|| compacted.encode_to_vec()));
    g.finish();
}

fn bench(c: &mut Criterion) {
    let r = raw();
    let built = build_interned(&r);
    let plain = build_plain(&r);
    eprintln!(
        "encoded size: interned {} bytes, plain {} bytes ({:.2}x)",
        built.encoded_len(),
        prost::Message::encoded_len(&plain),
        built.encoded_len() as f64 / prost::Message::encoded_len(&plain) as f64
    );
    let mut g = c.benchmark_group("model");
    g.throughput(Throughput::Elements(SAMPLES as u64));
    g.sample_size(20);
    g.bench_function("build/interned", |b| b.iter(|| build_interned(&r)));
    g.bench_function("build/plain_prost (baseline)", |b| b.iter(|| build_plain(&r)));
    g.bench_function("encode/interned", |b| b.iter(|| built.encode_to_vec()));
    g.bench_function("encode/plain_prost (baseline)", |b| b.iter(|| prost::Message::encode_to_vec(&plain)));
    let bytes = built.encode_to_vec();
    let plain_bytes = prost::Message::encode_to_vec(&plain);
    g.bench_function("decode/interned", |b| b.iter(|| Profiles::decode(&bytes).unwrap()));
    g.bench_function("decode/plain_prost (baseline)", |b| {
        b.iter(|| <pb::ProfilesData as prost::Message>::decode(&plain_bytes[..]).unwrap())
    });
    g.bench_function("merge/interned", |b| {
        b.iter_batched(|| (built.clone(), built.clone()), |(mut a, other)| a.merge(other), BatchSize::LargeInput)
    });
    g.bench_function("validate", |b| b.iter(|| built.validate().unwrap()));
    g.finish();
    bench_compact(c, &built);
    bench_decode_budget(c, &built);
}

/// The receiver's decode-budget pre-pass next to the decode it guards, on
/// the interned batch (both wire forms) and on JSON.
fn bench_decode_budget(c: &mut Criterion, built: &Profiles) {
    use profcol_api::model::decode_budget::{json_decoded_size, proto_decoded_size};
    let bytes = built.encode_to_vec();
    let json = built.to_json().into_bytes();
    eprintln!(
        "decode budget: proto {} bytes -> estimate {} bytes (memory_size {}), json {} bytes -> estimate {} bytes",
        bytes.len(),
        proto_decoded_size(&bytes, usize::MAX).unwrap(),
        built.memory_size(),
        json.len(),
        json_decoded_size(&json, usize::MAX).unwrap()
    );
    let mut g = c.benchmark_group("decode_budget");
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.sample_size(20);
    g.bench_function("proto/pre-pass", |b| b.iter(|| proto_decoded_size(&bytes, usize::MAX).unwrap()));
    g.bench_function("proto/decode (baseline)", |b| b.iter(|| Profiles::decode(&bytes).unwrap()));
    g.throughput(Throughput::Bytes(json.len() as u64));
    g.bench_function("json/pre-pass", |b| b.iter(|| json_decoded_size(&json, usize::MAX).unwrap()));
    g.bench_function("json/decode (baseline)", |b| b.iter(|| Profiles::from_json(&json).unwrap()));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
