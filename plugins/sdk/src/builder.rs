//! Writing a batch from nothing: fixtures for tests, and plugins that
//! rewrite a batch whole. Every dictionary entry is stored once.

use crate::intern::Interner;
use crate::pb::common::{InstrumentationScope, KeyValue};
use crate::pb::profiles as pb;
use crate::pb::resource::Resource;
use crate::value::Value;
use crate::Batch;

/// What describes one profile and where it sits (resource, scope).
#[derive(Clone, Debug, Default)]
pub struct ProfileSpec<'a> {
    /// Resource attributes (`service.name`, `host.name`, ...). Profiles with
    /// equal resource attributes share one resource.
    pub resource: &'a [(&'a str, Value<'a>)],
    /// Instrumentation scope (name, version).
    pub scope: (&'a str, &'a str),
    /// (type, unit), e.g. ("samples", "count") or ("cpu", "nanoseconds").
    pub sample_type: (&'a str, &'a str),
    pub period_type: (&'a str, &'a str),
    pub period: i64,
    pub time_unix_nano: u64,
    pub duration_nano: u64,
}

/// One frame to write.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FrameSpec<'a> {
    /// Function name; "" for an unsymbolized frame (no line is written).
    pub function: &'a str,
    pub file: &'a str,
    pub line: i64,
    /// Filename of the binary; "" for none.
    pub mapping: &'a str,
    pub address: u64,
    /// The `profile.frame.type` attribute (`native`, `kernel`, `python`...), if any.
    pub frame_type: Option<&'a str>,
}

impl<'a> crate::view::Frame<'a> {
    /// The frame as a [`FrameSpec`]: its innermost line, its mapping's
    /// filename, its address and frame type (what a rewrite carries over).
    pub fn to_spec(&self) -> FrameSpec<'a> {
        let line = self.lines().next();
        FrameSpec {
            function: line.map_or("", |l| l.function_name),
            file: line.map_or("", |l| l.file),
            line: line.map_or(0, |l| l.line),
            mapping: self.mapping().map_or("", |m| m.filename),
            address: self.address(),
            frame_type: self.attribute(profcol_model_rules::folded::FRAME_TYPE_KEY).and_then(|v| v.as_str()),
        }
    }
}

/// One sample to write.
#[derive(Clone, Copy, Debug, Default)]
pub struct SampleSpec<'a> {
    /// Leaf first.
    pub frames: &'a [FrameSpec<'a>],
    /// One value per observation (e.g. `[1]` for one CPU sample).
    pub values: &'a [i64],
    /// Empty, or one per value.
    pub timestamps_unix_nano: &'a [u64],
    pub attributes: &'a [(&'a str, Value<'a>)],
}

/// A profile of the batch being built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileId {
    resource: usize,
    scope: usize,
    profile: usize,
}

/// Builds a [`Batch`]; the result passes the host's validate.
pub struct BatchBuilder {
    data: pb::ProfilesData,
    dict: Interner,
    /// Reused per sample: location indices of the stack being written.
    scratch: Vec<i32>,
}

impl Default for BatchBuilder {
    fn default() -> Self {
        Self::new()
    }
}

fn key_values(attrs: &[(&str, Value<'_>)]) -> Vec<KeyValue> {
    attrs
        .iter()
        .map(|(k, v)| KeyValue { key: (*k).to_owned(), value: Some(v.to_any()), ..Default::default() })
        .collect()
}

impl BatchBuilder {
    pub fn new() -> Self {
        let mut dict = Interner::new(pb::ProfilesDictionary::default());
        // Entry 0 of every table, even those this batch leaves empty.
        dict.string("");
        let d = &mut dict.dict;
        d.mapping_table.push(Default::default());
        d.location_table.push(Default::default());
        d.function_table.push(Default::default());
        d.link_table.push(Default::default());
        d.attribute_table.push(Default::default());
        d.stack_table.push(Default::default());
        BatchBuilder { data: pb::ProfilesData::default(), dict, scratch: Vec::new() }
    }

    /// The profile described by `spec`, added if it is new.
    pub fn profile(&mut self, spec: &ProfileSpec<'_>) -> ProfileId {
        let resource = Resource { attributes: key_values(spec.resource), ..Default::default() };
        let r = match self.data.resource_profiles.iter().position(|rp| rp.resource.as_ref() == Some(&resource)) {
            Some(r) => r,
            None => {
                self.data
                    .resource_profiles
                    .push(pb::ResourceProfiles { resource: Some(resource), ..Default::default() });
                self.data.resource_profiles.len() - 1
            }
        };
        let scope =
            InstrumentationScope { name: spec.scope.0.into(), version: spec.scope.1.into(), ..Default::default() };
        let rp = &mut self.data.resource_profiles[r];
        let s = match rp.scope_profiles.iter().position(|sp| sp.scope.as_ref() == Some(&scope)) {
            Some(s) => s,
            None => {
                rp.scope_profiles.push(pb::ScopeProfiles { scope: Some(scope), ..Default::default() });
                rp.scope_profiles.len() - 1
            }
        };
        let vt = |d: &mut Interner, (t, u): (&str, &str)| pb::ValueType {
            type_strindex: d.string(t),
            unit_strindex: d.string(u),
        };
        let profile = pb::Profile {
            sample_type: Some(vt(&mut self.dict, spec.sample_type)),
            period_type: Some(vt(&mut self.dict, spec.period_type)),
            period: spec.period,
            time_unix_nano: spec.time_unix_nano,
            duration_nano: spec.duration_nano,
            ..Default::default()
        };
        let profiles = &mut self.data.resource_profiles[r].scope_profiles[s].profiles;
        let p = match profiles.iter().position(|p| {
            p.sample_type == profile.sample_type
                && p.period_type == profile.period_type
                && p.period == profile.period
                && p.time_unix_nano == profile.time_unix_nano
                && p.duration_nano == profile.duration_nano
        }) {
            Some(p) => p,
            None => {
                profiles.push(profile);
                profiles.len() - 1
            }
        };
        ProfileId { resource: r, scope: s, profile: p }
    }

    /// Adds a sample to `profile`.
    pub fn sample(&mut self, profile: ProfileId, spec: &SampleSpec<'_>) {
        let mut stack = std::mem::take(&mut self.scratch);
        stack.clear();
        for f in spec.frames {
            stack.push(self.location(f));
        }
        let stack_index = self.dict.stack(&stack);
        self.scratch = stack;
        let attribute_indices = spec.attributes.iter().map(|(k, v)| self.dict.attribute(k, *v)).collect();
        let sample = pb::Sample {
            stack_index,
            attribute_indices,
            link_index: 0,
            values: spec.values.to_vec(),
            timestamps_unix_nano: spec.timestamps_unix_nano.to_vec(),
        };
        self.data.resource_profiles[profile.resource].scope_profiles[profile.scope].profiles[profile.profile]
            .samples
            .push(sample);
    }

    fn location(&mut self, f: &FrameSpec<'_>) -> i32 {
        let d = &mut self.dict;
        let mapping_index = if f.mapping.is_empty() {
            0
        } else {
            let filename_strindex = d.string(f.mapping);
            d.mapping(pb::Mapping { filename_strindex, ..Default::default() })
        };
        let lines = if f.function.is_empty() {
            Vec::new()
        } else {
            vec![pb::Line { function_index: d.function(f.function, f.function, f.file, 0), line: f.line, column: 0 }]
        };
        let attribute_indices = match f.frame_type {
            Some(t) => vec![d.attribute(profcol_model_rules::folded::FRAME_TYPE_KEY, Value::Str(t))],
            None => Vec::new(),
        };
        d.location(pb::Location { mapping_index, address: f.address, lines, attribute_indices })
    }

    pub fn build(mut self) -> Batch {
        self.data.dictionary = Some(self.dict.dict);
        Batch(self.data)
    }
}

#[cfg(test)]
mod tests {
    use crate::harness::cpu_batch;
    use crate::pb::profiles as pb;

    #[test]
    fn built_batches_pass_the_hosts_validate_and_read_back() {
        let b = cpu_batch();
        assert_eq!(b.validate(), Ok(()));
        let d = b.dictionary();
        // Entry 0 of every table is the zero value, string 0 is "".
        assert_eq!(d.string_table[0], "");
        assert_eq!(d.location_table[0], pb::Location::default());
        assert_eq!(d.stack_table[0], pb::Stack::default());
        assert_eq!(d.attribute_table[0], pb::KeyValueAndUnit::default());
        // Strings, functions and stacks are stored once.
        let mut strings = d.string_table.clone();
        strings.sort();
        strings.dedup();
        assert_eq!(strings.len(), d.string_table.len());
        assert_eq!(b.sample_count(), 7);
        assert_eq!(b.0.resource_profiles.len(), 2, "one resource per distinct attribute set");

        let first = b.samples().next().unwrap();
        let frames: Vec<_> = first.frames().map(|f| (f.function_name(), f.file(), f.line())).collect();
        assert_eq!(frames[0], (Some("__memcpy_avx_unaligned"), "", 0));
        assert_eq!(frames[3], (Some("main"), "/src/app/main.rs", 10));
        assert_eq!(first.frames().next().unwrap().mapping().unwrap().filename, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(first.attribute("thread.name").and_then(|v| v.as_str()), Some("app"));
        assert_eq!(first.attribute("service.name").and_then(|v| v.as_str()), Some("app"), "falls back to the resource");
        assert_eq!(first.sample_type(), ("samples", "count"));
        let unsymbolized = b.samples().nth(4).unwrap().frames().next().unwrap();
        assert_eq!(unsymbolized.function_name(), None);
        assert_eq!(unsymbolized.address(), 0x3f2a0);
    }

    #[test]
    fn a_rewrite_through_specs_keeps_what_a_frame_says() {
        let input = cpu_batch();
        let mut b = super::BatchBuilder::new();
        let p = b.profile(&super::ProfileSpec { sample_type: ("samples", "count"), ..Default::default() });
        for s in input.samples() {
            let frames: Vec<_> = s.frames().map(|f| f.to_spec()).collect();
            let attrs: Vec<_> = s.attributes().collect();
            b.sample(
                p,
                &super::SampleSpec {
                    frames: &frames,
                    values: s.values(),
                    timestamps_unix_nano: s.timestamps_unix_nano(),
                    attributes: &attrs,
                },
            );
        }
        let out = b.build();
        assert_eq!(out.validate(), Ok(()));
        fn specs(b: &crate::Batch) -> Vec<Vec<super::FrameSpec<'_>>> {
            b.samples().map(|s| s.frames().map(|f| f.to_spec()).collect()).collect()
        }
        assert_eq!(specs(&input), specs(&out));
    }
}
