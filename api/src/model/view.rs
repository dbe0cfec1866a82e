//! Read-only walks over a batch with every index resolved.

use super::{pb, str_at, AnyValue, Profiles, Resource};
use profcol_model_rules::lookup::{self, get};

/// One sample with its resource, profile and dictionary at hand.
#[derive(Clone, Copy)]
pub struct SampleView<'a> {
    pub resource: Option<&'a Resource>,
    pub profile: &'a pb::Profile,
    pub sample: &'a pb::Sample,
    pub dict: &'a pb::ProfilesDictionary,
}

/// One frame (location) of a sample's stack.
#[derive(Clone, Copy)]
pub struct FrameView<'a> {
    pub location: &'a pb::Location,
    pub dict: &'a pb::ProfilesDictionary,
}

impl<'a> SampleView<'a> {
    pub fn str(&self, i: i32) -> &'a str {
        str_at(&self.dict.string_table, i)
    }

    /// Frames, leaf first.
    pub fn frames(&self) -> impl Iterator<Item = FrameView<'a>> + 'a {
        let dict = self.dict;
        lookup::stack_locations(dict, self.sample.stack_index).map(move |location| FrameView { location, dict })
    }

    /// Sample attributes as (key, value).
    pub fn attributes(&self) -> impl Iterator<Item = (&'a str, Option<&'a AnyValue>)> + 'a {
        lookup::attributes(self.dict, &self.sample.attribute_indices)
    }

    /// The sample type as (type, unit).
    pub fn sample_type(&self) -> (&'a str, &'a str) {
        match &self.profile.sample_type {
            Some(vt) => (self.str(vt.type_strindex), self.str(vt.unit_strindex)),
            None => ("", ""),
        }
    }
}

impl<'a> FrameView<'a> {
    pub fn mapping(&self) -> Option<&'a pb::Mapping> {
        get(&self.dict.mapping_table, self.location.mapping_index).filter(|_| self.location.mapping_index != 0)
    }

    pub fn mapping_filename(&self) -> &'a str {
        self.mapping().map(|m| str_at(&self.dict.string_table, m.filename_strindex)).unwrap_or("")
    }

    /// (function name, filename, line) per line entry, innermost inline first.
    pub fn lines(&self) -> impl Iterator<Item = (&'a str, &'a str, i64)> + 'a {
        let dict = self.dict;
        self.location.lines.iter().map(move |ln| match get(&dict.function_table, ln.function_index) {
            Some(f) => {
                (str_at(&dict.string_table, f.name_strindex), str_at(&dict.string_table, f.filename_strindex), ln.line)
            }
            None => ("", "", ln.line),
        })
    }

    /// The innermost function name, if the frame is symbolized.
    pub fn function_name(&self) -> Option<&'a str> {
        self.lines().map(|(n, _, _)| n).find(|n| !n.is_empty())
    }

    /// Location attribute value of `key` as a string, if any.
    pub fn attribute_str(&self, key: &str) -> Option<&'a str> {
        self.location
            .attribute_indices
            .iter()
            .filter_map(|&i| get(&self.dict.attribute_table, i))
            .find(|kv| str_at(&self.dict.string_table, kv.key_strindex) == key)
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                super::any_value::Value::StringValue(s) => Some(s.as_str()),
                _ => None,
            })
    }
}

/// Iterator over every sample of a batch.
pub struct Samples<'a> {
    dict: &'a pb::ProfilesDictionary,
    inner: Box<dyn Iterator<Item = (Option<&'a Resource>, &'a pb::Profile, &'a pb::Sample)> + 'a>,
}

static EMPTY_DICT: std::sync::OnceLock<pb::ProfilesDictionary> = std::sync::OnceLock::new();

impl<'a> Samples<'a> {
    pub(super) fn new(p: &'a Profiles) -> Self {
        let dict = p.0.dictionary.as_ref().unwrap_or_else(|| EMPTY_DICT.get_or_init(Default::default));
        let inner = p.0.resource_profiles.iter().flat_map(|rp| {
            let res = rp.resource.as_ref();
            rp.scope_profiles
                .iter()
                .flat_map(|sp| sp.profiles.iter())
                .flat_map(move |prof| prof.samples.iter().map(move |s| (res, prof, s)))
        });
        Samples { dict, inner: Box::new(inner) }
    }
}

impl<'a> Iterator for Samples<'a> {
    type Item = SampleView<'a>;
    fn next(&mut self) -> Option<Self::Item> {
        let (resource, profile, sample) = self.inner.next()?;
        Some(SampleView { resource, profile, sample, dict: self.dict })
    }
}
