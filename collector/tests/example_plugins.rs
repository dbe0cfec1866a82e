//! The example plugins against the host's own components.
//!
//! Natively (the plugin's logic compiled for the host, through the SDK's
//! harness): `folded_exporter`'s text equals the `flamegraph` exporter's
//! folded file for the same batch, on batches with every kind of frame the
//! folding rules name differently.
//!
//! Through the real binary, as components (examples/plugins/build.sh): file
//! receiver → wasm/drop_frames → wasm/add_attribute → wasm/redact_paths
//! (Python) → file exporter, beside the flamegraph exporter and wasm/folded
//! on the same batch. The samples at the file exporter are exactly the
//! input's with each plugin's change applied (worked out here, independently
//! of the plugins), and the plugin's folded text equals the flamegraph
//! exporter's.

mod common;
use common::*;
use profcol_api::model::canonical::{self, CanonicalSample};
use profcol_testkit::plugins::example_plugin;
use std::path::PathBuf;
use std::time::Duration;

use profcol_api::model::{any_value, keys, pb, AnyValue, AttrValue, KeyValue, ProfileMeta, Resource};
use profcol_api::{Exporter, Profiles, ProfilesBuilder};
use profcol_exporters::flamegraph::{FlamegraphConfig, FlamegraphExporter};
use profcol_plugin_sdk::harness::Harness;
use profcol_plugin_sdk::Batch;

/// Samples the folding rules treat apart: names with `;`, spaces and a line
/// break, unsymbolized frames with a mapping (placed: offset in its file) and
/// without one, a kernel frame
/// known only by its frame type, an empty stack, a thread name that is a
/// number, a sample with no values but timestamps, a negative value.
fn odd_batch() -> Profiles {
    let mut b = ProfilesBuilder::new();
    let r = b.resource(Resource {
        attributes: vec![KeyValue {
            key: keys::PROCESS_EXECUTABLE_NAME.into(),
            value: Some(AttrValue::Str("odd app").to_any()),
            ..Default::default()
        }],
        ..Default::default()
    });
    let p = b.profile(r, &ProfileMeta { sample_type: ("samples", "count"), ..Default::default() });
    let named = |b: &mut ProfilesBuilder, name: &str| {
        let f = b.function(name, name, "", 0);
        b.line_location(f, 1)
    };
    let weird = named(&mut b, "ns::f<a; b>\nnext");
    let main = named(&mut b, "main");
    let lib = b.string("/usr/lib/libz.so.1");
    // Placed in memory: an unnamed frame shows its offset in the file.
    let m = b.mapping(pb::Mapping {
        filename_strindex: lib,
        memory_start: 0x1000,
        memory_limit: 0x3000,
        file_offset: 0x5000,
        ..Default::default()
    });
    let unsym = b.location(pb::Location { mapping_index: m, address: 0x1234, ..Default::default() });
    let bare = b.location(pb::Location { address: 0xabc, ..Default::default() });
    let kattr = b.attribute(keys::FRAME_TYPE, AttrValue::Str("kernel"));
    let kernel = b.location(pb::Location {
        address: 0xffff_ffff_8100_0000,
        attribute_indices: vec![kattr],
        ..Default::default()
    });
    let tname = b.attribute(keys::THREAD_NAME, AttrValue::Int(42));
    let stacks = [vec![weird, main], vec![unsym, main], vec![kernel, bare, main], vec![]];
    for (k, st) in stacks.iter().enumerate() {
        let stack_index = b.stack(st);
        let (values, timestamps_unix_nano) = match k {
            1 => (vec![], vec![1, 2, 3]),
            2 => (vec![-5, 2], vec![]),
            _ => (vec![1], vec![]),
        };
        let attribute_indices = if k == 0 { vec![tname] } else { vec![] };
        b.sample(p, pb::Sample { stack_index, attribute_indices, values, timestamps_unix_nano, ..Default::default() });
    }
    let mut out = b.build();
    // A thread name given by string-table reference reads as no name.
    let d = out.0.dictionary.as_mut().unwrap();
    d.string_table.push("by-reference".into());
    let idx = d.string_table.len() as i32 - 1;
    let key = d.string_table.iter().position(|s| s == keys::THREAD_NAME).unwrap() as i32;
    d.attribute_table.push(pb::KeyValueAndUnit {
        key_strindex: key,
        value: Some(AnyValue { value: Some(any_value::Value::StringValueStrindex(idx)) }),
        unit_strindex: 0,
    });
    let a = d.attribute_table.len() as i32 - 1;
    out.0.resource_profiles[0].scope_profiles[0].profiles[0].samples[1].attribute_indices = vec![a];
    assert_eq!(out.validate(), Ok(()));
    out
}

async fn flamegraph_text(batch: &Profiles) -> String {
    let dir = tempfile::tempdir().unwrap();
    let cfg = FlamegraphConfig { directory: dir.path().into(), folded: true, ..Default::default() };
    let e =
        FlamegraphExporter::new(profcol_testkit::settings(profcol_api::component::Kind::Exporter, "flamegraph"), cfg)
            .unwrap();
    e.export(batch).await.unwrap();
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "folded"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    std::fs::read_to_string(&files[0]).unwrap()
}

fn plugin_text(batch: &Profiles) -> String {
    let mut h = Harness::<folded_exporter::FoldedExporter>::exporter("null").unwrap();
    let out = h.export(&Batch::decode(&batch.encode_to_vec()).unwrap()).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].sink, "out");
    String::from_utf8(out[0].data.clone()).unwrap()
}

#[tokio::test]
async fn folded_exporter_equals_the_flamegraph_exporters_folded_text() {
    let batches = [
        ("cpu", profcol_testkit::batch::cpu_batch(3, 6, 80)),
        ("random", profcol_testkit::batch::random_batch(5, 4, 2_000, 300, 12)),
        ("odd", odd_batch()),
    ];
    for (name, batch) in batches {
        let want = flamegraph_text(&batch).await;
        assert!(want.lines().count() > 3, "{name}: {want}");
        assert_eq!(plugin_text(&batch), want, "{name}");
    }
    // What each rule makes of the odd batch: the numeric thread name roots its
    // stack, the one by reference falls back to the executable's name.
    assert_eq!(
        flamegraph_text(&odd_batch()).await,
        "42;main;ns::f<a:_b>_next 1\n\
         odd_app;[no stack] 1\n\
         odd_app;main;0xabc;0xffffffff81000000_[k] 2\n\
         odd_app;main;libz.so.1+0x5234 3\n"
    );
}

const DROPPED: [&str; 2] = ["compute", "hash_block"];
const REDACT: (&str, &str) = ("src/", "redacted/");

/// The input's samples as the three processors leave them, worked out on
/// the canonical form.
fn expected(input: &Profiles) -> Vec<CanonicalSample> {
    let mut out: Vec<CanonicalSample> = canonical::samples(input)
        .into_iter()
        .filter_map(|mut s| {
            let had = !s.frames.is_empty();
            s.frames.retain(|(_, _, lines, _)| !lines.first().is_some_and(|(f, _, _)| DROPPED.contains(&f.as_str())));
            if had && s.frames.is_empty() {
                return None;
            }
            for (_, _, lines, _) in &mut s.frames {
                for (_, file, _) in lines {
                    if let Some(rest) = file.strip_prefix(REDACT.0) {
                        *file = format!("{}{rest}", REDACT.1);
                    }
                }
            }
            s.resource.push(("deployment.environment".into(), "StringValue(\"e2e\")".into()));
            s.resource.sort();
            Some(s)
        })
        .collect();
    out.sort();
    out
}

fn samples(batches: &[Profiles]) -> Vec<CanonicalSample> {
    let mut v: Vec<_> = batches.iter().flat_map(canonical::samples).collect();
    v.sort();
    v
}

#[test]
fn example_plugins_in_a_pipeline_and_folded_equals_flamegraph() {
    let dir = tempfile::tempdir().unwrap();
    let input = profcol_testkit::batch::cpu_batch(7, 4, 60);
    std::fs::create_dir_all(dir.path().join("in")).unwrap();
    std::fs::write(dir.path().join("in/batch.pb"), input.encode_to_vec()).unwrap();
    let want = expected(&input);
    assert!(want.len() < input.sample_count() || want != canonical::samples(&input), "the plugins change the batch");

    let d = dir.path().display();
    let cfg = format!(
        "receivers:
  file:
    path: {d}/in
processors:
  wasm/drop_frames:
    path: {drop_frames}
    config: {{ pattern: \"^({dropped})$\" }}
  wasm/add_attribute:
    path: {add_attribute}
    config: {{ key: deployment.environment, value: e2e }}
  wasm/redact_paths:
    path: {redact_paths}
    config: {{ pattern: \"^{from}\", replacement: \"{to}\" }}
    call_timeout: 5s
exporters:
  file:
    path: {d}/out.jsonl
  flamegraph:
    directory: {d}/flamegraphs
    folded: true
  wasm/folded:
    path: {folded}
    sinks:
      out: {{ file: {d}/plugin.folded }}
service:
  plugins:
    cache_dir: {d}/cache
  telemetry:
    metrics:
      address: \"\"
  pipelines:
    profiles:
      receivers: [file]
      processors: [wasm/drop_frames, wasm/add_attribute, wasm/redact_paths]
      exporters: [file, flamegraph, wasm/folded]
",
        drop_frames = example_plugin("drop_frames").display(),
        add_attribute = example_plugin("add_attribute").display(),
        redact_paths = example_plugin("redact_paths").display(),
        folded = example_plugin("folded_exporter").display(),
        dropped = DROPPED.join("|"),
        from = REDACT.0,
        to = REDACT.1,
    );
    let cfgp = write(&dir.path().join("c.yaml"), &cfg);
    let mut p = Profcol::start(&["--config", cfgp.to_str().unwrap()]);
    let out = dir.path().join("out.jsonl");
    let plugin_folded = dir.path().join("plugin.folded");
    // The first start compiles the Python plugin (CPython in wasm): allow for
    // it, but stop waiting if profcol is gone.
    let mut exited = None;
    let arrived = wait_until(Duration::from_secs(180), || {
        exited = p.child.try_wait().ok().flatten();
        exited.is_some() || (samples(&read_jsonl(&out)).len() >= want.len() && plugin_folded.exists())
    });
    if let Some(status) = exited {
        panic!("profcol exited early ({status}):\n{}", p.log.lock().unwrap().join("\n"));
    }
    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(30)).is_some_and(|s| s.success()), "profcol exits cleanly");
    assert!(arrived, "the batch went through every plugin in time");
    assert_eq!(samples(&read_jsonl(&out)), want, "each plugin's change applied, nothing else");

    let flamegraph: Vec<PathBuf> = std::fs::read_dir(dir.path().join("flamegraphs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "folded"))
        .collect();
    assert_eq!(flamegraph.len(), 1, "one batch, one folded file: {flamegraph:?}");
    let expected_text = std::fs::read_to_string(&flamegraph[0]).unwrap();
    let plugin_text = std::fs::read_to_string(&plugin_folded).unwrap();
    assert!(expected_text.lines().count() > 10 && expected_text.contains("_[k]"), "{expected_text}");
    assert_eq!(plugin_text, expected_text, "folded_exporter's text is the flamegraph exporter's");
}
