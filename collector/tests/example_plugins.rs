//! The example plugins against the host's own components. Here natively
//! (the plugin's logic compiled for the host, through the SDK's harness):
//! `folded_exporter`'s text equals the `flamegraph` exporter's folded file
//! for the same batch, on batches with every kind of frame the folding
//! rules name differently.

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
