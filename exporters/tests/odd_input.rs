//! Odd-but-valid input (anything that passes `Profiles::validate`) must not
//! panic the pprof / flamegraph exporters, must not grow their memory past a
//! bound, and must not lose samples silently.

use profcol_api::component::Kind;
use profcol_api::model::{keys, pb, AnyValue, KeyValue, ProfileMeta, Resource};
use profcol_api::{ExportError, Exporter, Profiles, ProfilesBuilder};
use profcol_exporters::flamegraph::{folded, FlamegraphConfig, FlamegraphExporter};
use profcol_exporters::group::GroupBy;
use profcol_exporters::pprof::{convert, proto, PprofConfig, PprofExporter};
use profcol_testkit::prelude::*;
use prost::Message;

fn kv(k: &str, v: AnyValue) -> KeyValue {
    KeyValue { key: k.into(), value: Some(v), ..Default::default() }
}

const CPU: ProfileMeta<'static> = ProfileMeta::cpu(10_000_000, 1_700_000_000_000_000_000, 10_000_000_000);

/// One resource per entry of `resources`, each with one CPU sample of `values`
/// on a one-frame stack running `func`.
fn batch_of(resources: &[Vec<KeyValue>], func: &str, values: Vec<i64>) -> Profiles {
    let mut b = ProfilesBuilder::new();
    let f = b.function(func, func, "", 0);
    let loc = b.line_location(f, 0);
    let stack = b.stack(&[loc]);
    for attrs in resources {
        let r = b.resource(Resource { attributes: attrs.clone(), ..Default::default() });
        let p = b.profile(r, &CPU);
        b.sample(p, pb::Sample { stack_index: stack, values: values.clone(), ..Default::default() });
    }
    let p = b.build();
    p.validate().unwrap();
    p
}

fn pprof_to(dir: &std::path::Path, by: GroupBy) -> PprofExporter {
    let cfg = PprofConfig { directory: Some(dir.into()), group_by: by, ..Default::default() };
    PprofExporter::new(settings(Kind::Exporter, "pprof"), cfg).unwrap()
}

fn flamegraph_to(dir: &std::path::Path, by: GroupBy) -> FlamegraphExporter {
    let cfg = FlamegraphConfig { directory: dir.into(), group_by: by, folded: true, ..Default::default() };
    FlamegraphExporter::new(settings(Kind::Exporter, "flamegraph"), cfg).unwrap()
}

fn names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

/// A group's report as prost decodes it, checked valid before and after
/// (and its bytes prost's own for the profile they decode to).
fn decoded(g: &convert::GroupProfile) -> proto::Profile {
    g.report.check_valid().unwrap();
    let p = g.report.to_profile().unwrap();
    convert::check_valid(&p).unwrap();
    assert_eq!(p.encode_to_vec(), g.report.encode_to_vec(), "group {}", g.group);
    assert_eq!(p.sample.len(), g.report.samples());
    p
}

/// Sum of the first value column over every group.
fn pprof_total(groups: &[convert::GroupProfile]) -> i64 {
    groups.iter().flat_map(|g| decoded(g).sample).map(|s| s.value[0]).sum()
}

#[tokio::test]
async fn a_container_id_with_multibyte_characters_is_a_group_not_a_panic() {
    // Byte 24 falls inside the 8th '€' (3 bytes each, after one 'a').
    let id = format!("a{}", "€".repeat(10));
    let batch = batch_of(&[vec![kv(keys::CONTAINER_ID, s(&id))]], "main", vec![3]);
    let groups = convert::to_pprof(&batch, GroupBy::Container);
    assert_eq!(groups.len(), 1);
    assert!(groups[0].group.starts_with("container-a"), "{}", groups[0].group);
    let folded = folded(&batch, GroupBy::Container, true);
    assert_eq!(folded.len(), 1);
    let dir = tempfile::tempdir().unwrap();
    pprof_to(dir.path(), GroupBy::Container).export(&batch).await.unwrap();
    assert_eq!(names(dir.path()).len(), 1);
}

#[tokio::test]
async fn a_long_pid_string_still_makes_a_file_name_the_file_system_takes() {
    let batch = batch_of(&[vec![kv(keys::PROCESS_PID, s(&"7".repeat(5000)))]], "main", vec![1]);
    let dir = tempfile::tempdir().unwrap();
    pprof_to(dir.path(), GroupBy::Process).export(&batch).await.unwrap();
    flamegraph_to(dir.path(), GroupBy::Process).export(&batch).await.unwrap();
    let n = names(dir.path());
    assert_eq!(n.len(), 3, "{n:?}");
    assert!(n.iter().all(|n| n.len() < 200), "{n:?}");
}

#[tokio::test]
async fn the_number_of_groups_is_bounded_and_no_sample_is_lost() {
    let n = 3000;
    let res: Vec<Vec<KeyValue>> = (0..n).map(|p| vec![kv(keys::PROCESS_PID, i(10_000 + p))]).collect();
    let batch = batch_of(&res, "main", vec![1]);
    let groups = convert::to_pprof(&batch, GroupBy::Process);
    assert!(groups.len() <= 1025, "{} groups", groups.len());
    assert_eq!(pprof_total(&groups), n);
    // The overflow group keeps each process apart by its pid label.
    let other = groups.iter().find(|g| g.group == "other").expect("an overflow group");
    assert!(decoded(other).sample.len() > 1);
    let f = folded(&batch, GroupBy::Process, true);
    assert!(f.len() <= 1025, "{} groups", f.len());
    assert_eq!(f.values().flat_map(|m| m.values()).sum::<u64>(), n as u64);
}

#[tokio::test]
async fn many_sample_types_do_not_make_every_sample_carry_every_column() {
    // Each profile has its own sample type: a dense pprof value matrix would
    // be profiles × types (quadratic in the request's size).
    let n = 200usize;
    let mut b = ProfilesBuilder::new();
    let f = b.function("main", "main", "", 0);
    let loc = b.line_location(f, 0);
    let stack = b.stack(&[loc]);
    let r = b.resource(Resource::default());
    let types: Vec<String> = (0..n).map(|k| format!("type{k}")).collect();
    for t in &types {
        let p = b.profile(r, &ProfileMeta { sample_type: (t, "count"), ..CPU });
        b.sample(p, pb::Sample { stack_index: stack, values: vec![1], ..Default::default() });
    }
    let batch = b.build();
    batch.validate().unwrap();
    let groups = convert::to_pprof(&batch, GroupBy::None);
    let mut kept = 0i64;
    let mut skipped = 0u64;
    for g in &groups {
        let p = decoded(g);
        assert!(p.sample_type.len() <= 32, "{} sample types", p.sample_type.len());
        // Each input sample counts 1 in its own column.
        kept += p.sample.iter().flat_map(|s| s.value.iter()).sum::<i64>();
        skipped += g.skipped_samples;
    }
    assert_eq!(kept as u64 + skipped, n as u64);
    // What could not be written is a clear, permanent error, after the rest was written.
    let dir = tempfile::tempdir().unwrap();
    match pprof_to(dir.path(), GroupBy::None).export(&batch).await {
        Ok(()) => assert_eq!(skipped, 0),
        Err(ExportError::Permanent { message }) => {
            assert!(skipped > 0);
            assert!(message.contains("sample types"), "{message}");
        }
        Err(e) => panic!("{e:?}"),
    }
    assert_eq!(names(dir.path()).len(), 1);
}

#[test]
fn huge_values_saturate_in_the_flame_graph() {
    let batch = batch_of(&[vec![], vec![]], "main", vec![i64::MAX, i64::MAX, i64::MAX]);
    let f = folded(&batch, GroupBy::None, false);
    assert_eq!(f["all"]["main"], u64::MAX);
}

#[tokio::test]
async fn a_group_with_only_zero_values_does_not_fail_the_others() {
    let mut b = ProfilesBuilder::new();
    let f = b.function("main", "main", "", 0);
    let loc = b.line_location(f, 0);
    let stack = b.stack(&[loc]);
    // pid 1 sorts first and has only zeros (or negative deltas); pid 2 has counts.
    for (pid, v) in [(1, vec![0, -4]), (2, vec![5])] {
        let r = b.resource(Resource { attributes: vec![kv(keys::PROCESS_PID, i(pid))], ..Default::default() });
        let p = b.profile(r, &CPU);
        b.sample(p, pb::Sample { stack_index: stack, values: v, ..Default::default() });
    }
    let batch = b.build();
    let dir = tempfile::tempdir().unwrap();
    flamegraph_to(dir.path(), GroupBy::Process).export(&batch).await.unwrap();
    let n = names(dir.path());
    assert!(n.iter().any(|n| n.ends_with("pid-2.svg")), "{n:?}");
}

#[tokio::test]
async fn frame_names_with_line_breaks_and_tabs_keep_the_folded_format() {
    let batch = batch_of(&[vec![kv(keys::THREAD_NAME, s("my\nthread"))]], "fn\r\nwith\tbreaks;and spaces", vec![2]);
    let f = folded(&batch, GroupBy::None, true);
    let (line, count) = f["all"].iter().next().unwrap();
    assert_eq!(*count, 2);
    assert!(!line.contains(char::is_whitespace), "{line:?}");
    assert_eq!(line.split(';').count(), 2, "{line:?}");
    let dir = tempfile::tempdir().unwrap();
    flamegraph_to(dir.path(), GroupBy::None).export(&batch).await.unwrap();
    let folded_file = names(dir.path()).into_iter().find(|n| n.ends_with(".folded")).unwrap();
    let text = std::fs::read_to_string(dir.path().join(folded_file)).unwrap();
    assert_eq!(text.lines().count(), 1, "{text:?}");
    assert!(text.lines().all(|l| l.rsplit_once(' ').is_some_and(|(_, c)| c.parse::<u64>().is_ok())), "{text:?}");
}

#[test]
fn times_past_i64_do_not_wrap_negative_in_pprof() {
    let mut b = ProfilesBuilder::new();
    let r = b.resource(Resource::default());
    let p = b.profile(r, &ProfileMeta { time_unix_nano: u64::MAX - 10, duration_nano: 5, ..CPU });
    b.sample(p, pb::Sample { values: vec![1], ..Default::default() });
    let p2 = b.profile(r, &ProfileMeta { time_unix_nano: 1, duration_nano: 5, ..CPU });
    b.sample(p2, pb::Sample { values: vec![1], ..Default::default() });
    let batch = b.build();
    let g = convert::to_pprof(&batch, GroupBy::None);
    let p = decoded(&g[0]);
    assert!(p.time_nanos >= 0, "{}", p.time_nanos);
    assert!(p.duration_nanos >= 0, "{}", p.duration_nanos);
}

#[test]
fn samples_on_a_deep_stack_are_bounded_in_pprof_and_equal_ones_merge() {
    let mut b = ProfilesBuilder::new();
    let f = b.function("recurse", "recurse", "", 0);
    let loc = b.line_location(f, 0);
    // 1 Mi frames: a few bytes per sample on the wire, 8 MiB of ids per pprof sample.
    let deep = b.stack(&vec![loc; 1 << 20]);
    let shallow = b.stack(&[loc]);
    let r = b.resource(Resource { attributes: vec![kv(keys::PROCESS_PID, i(1))], ..Default::default() });
    let p = b.profile(r, &CPU);
    // Equal samples (same stack and labels) become one pprof sample.
    for _ in 0..1000 {
        b.sample(p, pb::Sample { stack_index: shallow, values: vec![2], ..Default::default() });
    }
    let n_deep = 40usize;
    for t in 0..n_deep {
        let tid = b.attribute(keys::THREAD_ID, profcol_api::model::AttrValue::Int(t as i64));
        b.sample(
            p,
            pb::Sample { stack_index: deep, attribute_indices: vec![tid], values: vec![1], ..Default::default() },
        );
    }
    let batch = b.build();
    batch.validate().unwrap();
    let groups = convert::to_pprof(&batch, GroupBy::None);
    let g = &groups[0];
    let p = decoded(g);
    let ids: usize = p.sample.iter().map(|s| s.location_id.len()).sum();
    assert!(ids <= convert::MAX_FRAMES, "{ids} location ids");
    let shallow_samples: Vec<_> = p.sample.iter().filter(|s| s.location_id.len() == 1).collect();
    assert_eq!(shallow_samples.len(), 1);
    assert_eq!(shallow_samples[0].value[0], 2000);
    let deep_kept = p.sample.iter().filter(|s| s.location_id.len() == 1 << 20).count();
    assert!(g.skipped_samples > 0);
    assert_eq!(deep_kept as u64 + g.skipped_samples, n_deep as u64);
}

#[test]
fn a_deep_stack_of_long_names_folds_within_the_budget_and_keeps_its_count() {
    // One 4 MiB name repeated 20 deep is a ~4 MB batch but an 80 MiB folded line.
    let mut b = ProfilesBuilder::new();
    let long = "x".repeat(4 << 20);
    let f = b.function(&long, "", "", 0);
    let loc = b.line_location(f, 0);
    let deep = b.stack(&[loc; 20]);
    let g = b.function("shallow", "", "", 0);
    let loc2 = b.line_location(g, 0);
    let shallow = b.stack(&[loc2]);
    let r = b.resource(Resource::default());
    let p = b.profile(r, &CPU);
    for _ in 0..50 {
        b.sample(p, pb::Sample { stack_index: deep, values: vec![1], ..Default::default() });
    }
    b.sample(p, pb::Sample { stack_index: shallow, values: vec![7], ..Default::default() });
    let f = folded(&b.build(), GroupBy::None, false);
    let lines = &f["all"];
    assert_eq!(
        lines.get(profcol_exporters::flamegraph::OVER_BUDGET),
        Some(&50),
        "{:?}",
        lines.keys().map(|k| k.len()).collect::<Vec<_>>()
    );
    assert_eq!(lines.get("shallow"), Some(&7));
    let bytes: usize = lines.keys().map(String::len).sum();
    assert!(bytes <= profcol_exporters::flamegraph::MAX_FOLDED_BYTES);
}
