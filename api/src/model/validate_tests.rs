//! The spec's invariants (`profcol_model_rules::validate`) on batches made by the builder.

use super::{pb, AttrValue, ProfileMeta, Profiles, ProfilesBuilder};
use profcol_model_rules::validate::drop_invalid_profiles;

fn one() -> Profiles {
    let mut b = ProfilesBuilder::new();
    let r = b.resource(Default::default());
    let p = b.profile(r, &ProfileMeta { sample_type: ("samples", "count"), ..Default::default() });
    let f = b.function("main", "main", "a.c", 1);
    let l = b.line_location(f, 3);
    let st = b.stack(&[l]);
    let a = b.attribute("thread.id", AttrValue::Int(1));
    b.sample(
        p,
        pb::Sample {
            stack_index: st,
            attribute_indices: vec![a],
            values: vec![1],
            timestamps_unix_nano: vec![5],
            ..Default::default()
        },
    );
    b.build()
}

#[test]
fn built_batches_are_valid() {
    assert_eq!(one().validate(), Ok(()));
    assert_eq!(Profiles::default().validate(), Ok(()));
}

#[test]
fn out_of_range_stack_is_reported_with_path() {
    let mut p = one();
    p.0.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index = 99;
    let e = p.validate().unwrap_err();
    assert_eq!(e.path, "resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index");
    assert!(e.message.contains("out of range"), "{e}");
}

#[test]
fn invalid_profiles_are_dropped_and_the_rest_kept() {
    let mut p = one();
    let good = p.0.resource_profiles[0].scope_profiles[0].profiles[0].clone();
    let mut bad = good.clone();
    bad.samples[0].stack_index = 99;
    let sp = &mut p.0.resource_profiles[0].scope_profiles[0];
    sp.profiles = vec![bad, good.clone()];
    let n_bad = sp.profiles[0].samples.len() as u64;
    let dropped = drop_invalid_profiles(&mut p.0).unwrap().expect("one profile dropped");
    assert_eq!((dropped.profiles, dropped.samples), (1, n_bad));
    assert!(dropped.first.path.ends_with("profiles[0].samples[0].stack_index"), "{}", dropped.first);
    assert_eq!(p.0.resource_profiles[0].scope_profiles[0].profiles, vec![good]);
    assert!(p.validate().is_ok());
    assert_eq!(drop_invalid_profiles(&mut p.0).unwrap(), None);
    // A broken dictionary spoils everything: refused whole.
    p.0.dictionary.as_mut().unwrap().string_table[0] = "x".into();
    assert!(drop_invalid_profiles(&mut p.0).is_err());
}

#[test]
fn unequal_values_and_timestamps() {
    let mut p = one();
    p.0.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].timestamps_unix_nano = vec![1, 2];
    assert!(p.validate().unwrap_err().message.contains("equal length"));
}

#[test]
fn negative_and_dangling_dictionary_indices() {
    let mut p = one();
    p.0.dictionary.as_mut().unwrap().location_table[1].lines[0].function_index = -1;
    assert!(p.validate().is_err());
    let mut p = one();
    p.0.dictionary.as_mut().unwrap().string_table[0] = "x".into();
    assert!(p.validate().is_err());
}
