//! Samples with every dictionary index resolved: a plugin reads frames and
//! attributes by name, never by table index.

use crate::pb::profiles as pb;
use crate::pb::resource::Resource;
use crate::value::Value;
use crate::Batch;

use profcol_model_rules::lookup;
pub(crate) use profcol_model_rules::lookup::{get, str_at};

/// One sample, with its profile, resource and the batch's dictionary.
#[derive(Clone, Copy)]
pub struct Sample<'a> {
    pub resource: Option<&'a Resource>,
    pub profile: &'a pb::Profile,
    /// The sample as it is on the wire (indices unresolved).
    pub raw: &'a pb::Sample,
    pub(crate) dict: &'a pb::ProfilesDictionary,
}

impl<'a> Sample<'a> {
    /// The frames of the sample's stack, leaf first.
    pub fn frames(&self) -> impl Iterator<Item = Frame<'a>> + 'a {
        let dict = self.dict;
        lookup::stack_locations(dict, self.raw.stack_index).map(move |location| Frame { location, dict })
    }

    /// The sample's attributes as (key, value).
    pub fn attributes(&self) -> impl Iterator<Item = (&'a str, Value<'a>)> + 'a {
        self.raw_attributes().filter_map(|(k, v)| Some((k, Value::read(v?, &self.dict.string_table)?)))
    }

    /// The sample's attribute `key`, else its resource's.
    pub fn attribute(&self, key: &str) -> Option<Value<'a>> {
        self.attributes().find(|(k, _)| *k == key).map(|(_, v)| v).or_else(|| self.resource_attribute(key))
    }

    /// The resource attribute `key` (`service.name`, `host.name`, ...).
    pub fn resource_attribute(&self, key: &str) -> Option<Value<'a>> {
        let kv = self.resource?.attributes.iter().find(|kv| kv.key == key)?;
        Value::read(kv.value.as_ref()?, &self.dict.string_table)
    }

    /// Attributes with their protobuf values, as the folding rules read them.
    pub(crate) fn raw_attributes(
        &self,
    ) -> impl Iterator<Item = (&'a str, Option<&'a crate::pb::common::AnyValue>)> + 'a {
        lookup::attributes(self.dict, &self.raw.attribute_indices)
    }

    /// The profile's sample type as (type, unit), e.g. ("samples", "count").
    pub fn sample_type(&self) -> (&'a str, &'a str) {
        match &self.profile.sample_type {
            Some(vt) => {
                (str_at(&self.dict.string_table, vt.type_strindex), str_at(&self.dict.string_table, vt.unit_strindex))
            }
            None => ("", ""),
        }
    }

    pub fn values(&self) -> &'a [i64] {
        &self.raw.values
    }

    pub fn timestamps_unix_nano(&self) -> &'a [u64] {
        &self.raw.timestamps_unix_nano
    }
}

/// One frame (location) of a stack.
#[derive(Clone, Copy)]
pub struct Frame<'a> {
    pub(crate) location: &'a pb::Location,
    pub(crate) dict: &'a pb::ProfilesDictionary,
}

/// One line of a frame: a function, and the file and line in it. A frame
/// with inlined calls has several, innermost first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Line<'a> {
    pub function_name: &'a str,
    pub system_name: &'a str,
    pub file: &'a str,
    pub line: i64,
    pub column: i64,
}

/// The binary a frame's address belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping<'a> {
    pub filename: &'a str,
    pub memory_start: u64,
    pub memory_limit: u64,
    pub file_offset: u64,
}

impl<'a> Frame<'a> {
    fn strs(&self) -> &'a [String] {
        &self.dict.string_table
    }

    /// Every line, innermost (inlined) first; empty for an unsymbolized frame.
    pub fn lines(&self) -> impl Iterator<Item = Line<'a>> + 'a {
        let dict = self.dict;
        self.location.lines.iter().map(move |ln| {
            let s = |i| str_at(&dict.string_table, i);
            match get(&dict.function_table, ln.function_index) {
                Some(f) => Line {
                    function_name: s(f.name_strindex),
                    system_name: s(f.system_name_strindex),
                    file: s(f.filename_strindex),
                    line: ln.line,
                    column: ln.column,
                },
                None => Line { function_name: "", system_name: "", file: "", line: ln.line, column: ln.column },
            }
        })
    }

    /// The innermost function name, if the frame is symbolized.
    pub fn function_name(&self) -> Option<&'a str> {
        self.lines().map(|l| l.function_name).find(|n| !n.is_empty())
    }

    /// The source file of the innermost line ("" when unknown).
    pub fn file(&self) -> &'a str {
        self.lines().next().map_or("", |l| l.file)
    }

    /// The line number of the innermost line (0 when unknown).
    pub fn line(&self) -> i64 {
        self.lines().next().map_or(0, |l| l.line)
    }

    /// The instruction address (in the mapping's address space).
    pub fn address(&self) -> u64 {
        self.location.address
    }

    pub fn mapping(&self) -> Option<Mapping<'a>> {
        if self.location.mapping_index == 0 {
            return None;
        }
        let m = get(&self.dict.mapping_table, self.location.mapping_index)?;
        Some(Mapping {
            filename: str_at(self.strs(), m.filename_strindex),
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
        })
    }

    /// The frame's attribute `key` (e.g. `profile.frame.type`).
    pub fn attribute(&self, key: &str) -> Option<Value<'a>> {
        let kv = self
            .location
            .attribute_indices
            .iter()
            .filter_map(|&i| get(&self.dict.attribute_table, i))
            .find(|kv| str_at(self.strs(), kv.key_strindex) == key)?;
        Value::read(kv.value.as_ref()?, self.strs())
    }
}

/// The folding rules (shared with the `flamegraph` exporter) read frames through this.
impl profcol_model_rules::folded::Frame for Frame<'_> {
    fn function_name(&self) -> Option<&str> {
        Frame::function_name(self)
    }
    fn mapping_filename(&self) -> &str {
        self.mapping().map_or("", |m| m.filename)
    }
    fn address(&self) -> u64 {
        self.location.address
    }
    fn file_offset(&self) -> Option<u64> {
        let m = self.mapping()?;
        profcol_model_rules::folded::offset_in_file(
            self.location.address,
            m.memory_start,
            m.memory_limit,
            m.file_offset,
        )
    }
    fn frame_type(&self) -> Option<&str> {
        self.attribute(profcol_model_rules::folded::FRAME_TYPE_KEY).and_then(|v| v.as_str())
    }
}

impl Batch {
    /// Every sample of the batch, in order.
    pub fn samples(&self) -> impl Iterator<Item = Sample<'_>> + '_ {
        let dict = self.dictionary();
        self.0.resource_profiles.iter().flat_map(move |rp| {
            let resource = rp.resource.as_ref();
            rp.scope_profiles
                .iter()
                .flat_map(|sp| sp.profiles.iter())
                .flat_map(move |profile| profile.samples.iter().map(move |raw| Sample { resource, profile, raw, dict }))
        })
    }
}
