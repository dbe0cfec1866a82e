//! Deterministic batches for tests and benches.

use profcol_api::model::{keys, pb, AnyValue, AttrValue, KeyValue, ProfileMeta, Resource};
use profcol_api::{Profiles, ProfilesBuilder};

pub fn kv(k: &str, v: AnyValue) -> KeyValue {
    KeyValue { key: k.into(), value: Some(v), ..Default::default() }
}

pub fn s(v: &str) -> AnyValue {
    AttrValue::Str(v).to_any()
}

pub fn i(v: i64) -> AnyValue {
    AttrValue::Int(v).to_any()
}

/// A CPU-profile batch the way the eBPF receiver makes one: per process a
/// resource (pid, executable, optionally container), samples/count with
/// period cpu/nanoseconds, user frames in the executable's mapping, kernel
/// frames in `[kernel.kallsyms]` marked `profile.frame.type=kernel`, thread
/// attributes, timestamps. `seed` varies the counts and functions.
pub fn cpu_batch(seed: u64, processes: usize, samples_per_process: usize) -> Profiles {
    let mut b = ProfilesBuilder::new();
    let kernel_fn = ["do_syscall_64", "entry_SYSCALL_64", "vfs_read", "ksys_read", "schedule"];
    let user_fn = ["main", "run", "compute", "hash_block", "parse_line", "write_out", "sort_items"];
    let t0 = 1_700_000_000_000_000_000u64 + seed * 10_000_000_000;
    let kmap_name = b.string(keys::KERNEL_MAPPING);
    let kattr = b.attribute(keys::FRAME_TYPE, AttrValue::Str("kernel"));
    let uattr = b.attribute(keys::FRAME_TYPE, AttrValue::Str("native"));
    let kmap = b.mapping(pb::Mapping {
        memory_start: 0xffff_ffff_8100_0000,
        memory_limit: 0xffff_ffff_8300_0000,
        file_offset: 0,
        filename_strindex: kmap_name,
        attribute_indices: vec![],
    });
    for p in 0..processes {
        let pid = 1000 + p as i64;
        let exe = format!("/usr/bin/app{p}");
        let mut attrs = vec![
            kv(keys::PROCESS_PID, i(pid)),
            kv(keys::PROCESS_EXECUTABLE_NAME, s(&format!("app{p}"))),
            kv(keys::PROCESS_EXECUTABLE_PATH, s(&exe)),
            kv(keys::HOST_NAME, s("node-1")),
            kv("service.name", s("demo")),
        ];
        if !p.is_multiple_of(2) {
            attrs.push(kv(keys::CONTAINER_ID, s(&format!("c0ffee{p:02}"))));
        }
        let r = b.resource(Resource { attributes: attrs, ..Default::default() });
        let prof = b.profile(r, &ProfileMeta::cpu(10_000_000, t0, 10_000_000_000));
        let fname = b.string(&exe);
        let bid = b.attribute(keys::BUILD_ID_GNU, AttrValue::Str("0123456789abcdef"));
        let umap = b.mapping(pb::Mapping {
            memory_start: 0x40_0000,
            memory_limit: 0x80_0000,
            file_offset: 0,
            filename_strindex: fname,
            attribute_indices: vec![bid],
        });
        for k in 0..samples_per_process {
            let x = seed.wrapping_mul(31).wrapping_add((p * 131 + k * 17) as u64);
            let depth = 2 + (x % 4) as usize;
            let mut locs = Vec::new();
            // Leaf first: kernel frames (some samples), then user frames up to main.
            if x.is_multiple_of(3) {
                for d in 0..2 {
                    let name = kernel_fn[(x as usize + d) % kernel_fn.len()];
                    let f = b.function(name, name, "", 0);
                    locs.push(b.location(pb::Location {
                        mapping_index: kmap,
                        address: 0xffff_ffff_8100_1000 + 0x40 * ((x as usize + d) % kernel_fn.len()) as u64,
                        lines: vec![pb::Line { function_index: f, line: 0, column: 0 }],
                        attribute_indices: vec![kattr],
                    }));
                }
            }
            for d in (0..depth).rev() {
                let name = if d == 0 { "main" } else { user_fn[1 + (x as usize + d) % (user_fn.len() - 1)] };
                let f = b.function(name, name, "src/app.c", 10 * d as i64);
                locs.push(b.location(pb::Location {
                    mapping_index: umap,
                    address: 0x40_1000 + 0x100 * d as u64 + (x % 7) * 4,
                    lines: vec![pb::Line { function_index: f, line: 10 * d as i64 + 3, column: 0 }],
                    attribute_indices: vec![uattr],
                }));
            }
            let stack = b.stack(&locs);
            let tid = b.attribute(keys::THREAD_ID, AttrValue::Int(pid + (k % 3) as i64));
            let tname =
                b.attribute(keys::THREAD_NAME, AttrValue::Str(if k.is_multiple_of(3) { "main" } else { "worker" }));
            let n = 1 + (x % 5) as usize;
            b.sample(
                prof,
                pb::Sample {
                    stack_index: stack,
                    attribute_indices: vec![tid, tname],
                    link_index: 0,
                    values: vec![1; n],
                    timestamps_unix_nano: (0..n).map(|j| t0 + (k * 10 + j) as u64 * 1_000_000).collect(),
                },
            );
        }
    }
    b.build()
}

/// A deterministic batch: `procs` processes, `samples` samples over `stacks`
/// distinct stacks of depth `depth`, with thread attributes and timestamps.
pub fn random_batch(seed: u64, procs: usize, samples: usize, stacks: usize, depth: usize) -> Profiles {
    let mut b = ProfilesBuilder::new();
    let mut rng = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut profiles = Vec::new();
    for p in 0..procs {
        let res = Resource {
            attributes: vec![KeyValue {
                key: "process.pid".into(),
                value: Some(AttrValue::Int(1000 + p as i64 + seed as i64 * 100).to_any()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let r = b.resource(res);
        profiles.push(b.profile(r, &ProfileMeta::cpu(10_000_000, 1_700_000_000_000_000_000, 5_000_000_000)));
    }
    let file = b.string("/usr/bin/app");
    let mapping = b.mapping(pb::Mapping {
        memory_start: 0x400000,
        memory_limit: 0x800000,
        filename_strindex: file,
        ..Default::default()
    });
    let stack_ids: Vec<i32> = (0..stacks)
        .map(|s| {
            let locs: Vec<i32> = (0..depth)
                .map(|d| {
                    let f = b.function(&format!("fn_{}_{}", s % 97, d), "", "app.c", d as i64);
                    b.location(pb::Location {
                        mapping_index: mapping,
                        address: 0x400000 + (s * depth + d) as u64 * 16,
                        lines: vec![pb::Line { function_index: f, line: d as i64 + 1, column: 0 }],
                        attribute_indices: vec![],
                    })
                })
                .collect();
            b.stack(&locs)
        })
        .collect();
    for i in 0..samples {
        let p = profiles[(next() as usize) % procs];
        let st = stack_ids[(next() as usize) % stacks];
        let tid = b.attribute("thread.id", AttrValue::Int((next() % 8) as i64));
        let tname = b.attribute("thread.name", AttrValue::Str(["main", "worker", "io"][(next() % 3) as usize]));
        b.sample(
            p,
            pb::Sample {
                stack_index: st,
                attribute_indices: vec![tid, tname],
                link_index: 0,
                values: vec![1],
                timestamps_unix_nano: vec![1_700_000_000_000_000_000 + seed * 1_000_000 + i as u64],
            },
        );
    }
    b.build()
}

pub fn merge(batches: &[Profiles]) -> Profiles {
    let mut b = ProfilesBuilder::new();
    for p in batches {
        b.append(p.clone());
    }
    b.build()
}

/// [`cpu_batch`] with every field of the schema set at least once, at the
/// edges of its range where it has one: links (trace and span ids), profile
/// ids, an original payload, a filled instrumentation scope, attribute values
/// of every kind (double, bool, bytes, array, kvlist, negative int), a
/// `u64::MAX` address and negative values. For codec tests (OTLP/JSON).
pub fn every_field_batch(seed: u64) -> Profiles {
    use profcol_api::model::any_value::Value as Av;
    use profcol_api::model::{ArrayValue, InstrumentationScope, KeyValueList};
    let mut p = cpu_batch(seed, 2, 6);
    let dict = p.0.dictionary.get_or_insert_with(Default::default);
    dict.link_table.push(pb::Link {
        trace_id: (1..=16).map(|k| k * 15).collect(),
        span_id: vec![0xff, 0, 0x7f, 0x80, 1, 2, 3, 0xfe],
    });
    let link = (dict.link_table.len() - 1) as i32;
    dict.mapping_table.push(pb::Mapping {
        memory_start: u64::MAX - 0xfff,
        memory_limit: u64::MAX,
        file_offset: u64::MAX / 3,
        filename_strindex: 0,
        attribute_indices: vec![],
    });
    let odd = [
        ("double", Av::DoubleValue(-0.1)),
        ("bool", Av::BoolValue(false)),
        ("bytes", Av::BytesValue(vec![0, 0xfb, 0xff, 0x3e, 0x3f])),
        ("int", Av::IntValue(i64::MIN)),
        ("string", Av::StringValue("tab\tquote\"slash\\é\u{1}".into())),
        ("array", Av::ArrayValue(ArrayValue { values: vec![i(-1), s(""), AnyValue { value: Some(Av::IntValue(0)) }] })),
        ("kvlist", Av::KvlistValue(KeyValueList { values: vec![kv("nested", s("x")), kv("zero", i(0))] })),
    ];
    let mut odd_attrs = Vec::new();
    for (k, v) in odd {
        dict.string_table.push(format!("odd.{k}"));
        let key = (dict.string_table.len() - 1) as i32;
        dict.attribute_table.push(pb::KeyValueAndUnit {
            key_strindex: key,
            value: Some(AnyValue { value: Some(v) }),
            unit_strindex: key,
        });
        odd_attrs.push((dict.attribute_table.len() - 1) as i32);
    }
    let high = (dict.mapping_table.len() - 1) as i32;
    dict.location_table.push(pb::Location {
        mapping_index: high,
        address: u64::MAX,
        lines: vec![pb::Line { function_index: 1, line: i64::MAX, column: -1 }],
        attribute_indices: vec![],
    });
    let loc = (dict.location_table.len() - 1) as i32;
    dict.stack_table.push(pb::Stack { location_indices: vec![loc] });
    let stack = (dict.stack_table.len() - 1) as i32;
    let rp = &mut p.0.resource_profiles[0];
    rp.schema_url = "https://opentelemetry.io/schemas/1.30.0".into();
    rp.resource.get_or_insert_with(Default::default).dropped_attributes_count = 2;
    let sp = &mut rp.scope_profiles[0];
    sp.scope = Some(InstrumentationScope {
        name: "profcol".into(),
        version: "0.1.0".into(),
        attributes: vec![kv("scope.attr", i(7))],
        dropped_attributes_count: 1,
    });
    let prof = &mut sp.profiles[0];
    prof.profile_id = (0..16).map(|k| 0xf0 | k).collect();
    prof.dropped_attributes_count = 3;
    prof.original_payload_format = "pprof".into();
    prof.original_payload = (0..=255).collect();
    prof.attribute_indices = odd_attrs.clone();
    prof.samples.push(pb::Sample {
        stack_index: stack,
        attribute_indices: odd_attrs,
        link_index: link,
        values: vec![-5, 3],
        timestamps_unix_nano: vec![u64::MAX, 0],
    });
    p
}

/// A batch with one sample at `ts`: `addrs` leaf first, all kernel frames
/// in `[kernel.kallsyms]`, as the eBPF receiver sends them to kernel_symbols.
pub fn kernel_batch(addrs: &[u64], ts: u64) -> Profiles {
    let mut b = ProfilesBuilder::new();
    let file = b.string(keys::KERNEL_MAPPING);
    let m = b.mapping(pb::Mapping {
        memory_start: 0,
        memory_limit: u64::MAX,
        file_offset: 0,
        filename_strindex: file,
        attribute_indices: vec![],
    });
    let kind = b.attribute(keys::FRAME_TYPE, AttrValue::Str("kernel"));
    let locs: Vec<i32> = addrs
        .iter()
        .map(|&a| {
            b.location(pb::Location { mapping_index: m, address: a, lines: vec![], attribute_indices: vec![kind] })
        })
        .collect();
    let stack = b.stack(&locs);
    let r = b.resource(Default::default());
    let p = b.profile(r, &ProfileMeta::cpu(1, ts, 1));
    b.sample(
        p,
        pb::Sample { stack_index: stack, values: vec![1], timestamps_unix_nano: vec![ts], ..Default::default() },
    );
    b.build()
}
