//! Profiles → pprof `Profile`, one per group.
//!
//! CPU convention (what `perf_to_profile` and Go's runtime write): a source
//! profile of `samples/count` with period type `cpu/nanoseconds` gives the
//! sample types `samples/count` and `cpu/nanoseconds` (count × period), the
//! period type `cpu/nanoseconds` and the period. Other sample types are kept
//! as they are, each in its own column (0 in the others). Labels `pid`,
//! `tid` (numeric) and `comm`; kernel frames sit in a `[kernel.kallsyms]`
//! mapping; stacks are leaf first. Ids are 1-based and unique, string 0 is "".

use super::proto as pp;
use crate::group::{bounded_group, own_report_type, GroupBy, GroupNames};
use crate::sample_attrs::{AttrReader, SampleAttrs};
use profcol_api::model::view::{FrameView, SampleView};
use profcol_api::model::{hash_str, keys, HashIndex, Resource};
use profcol_api::Profiles;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, message, WireType};
use prost::Message;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// Most sample types (value columns) of one pprof profile. Every pprof
/// sample carries a value per column, so without a bound a batch of many
/// profiles, each of its own sample type, would need profiles × types values.
pub(crate) const MAX_SAMPLE_TYPES: usize = 32;

/// Most stack frames (location ids) the reports of one batch hold. pprof
/// repeats the whole stack in every sample, so a batch of many samples on a
/// deep stack (a few bytes each on the wire) would otherwise need samples ×
/// depth ids. Samples with the same stack and labels are merged first.
pub const MAX_FRAMES: usize = 32 << 20;

/// Samples that are merged: stack index and labels (pid, tid, comm's
/// string index; an off-CPU sample's state's string index and the number
/// of its waker, which its waker's `wakeup` sample repeats).
type SampleKey = (i32, Option<i64>, Option<i64>, Option<i64>, Option<i64>, Option<i64>);

/// The label keys, in [`SampleKey`] order after the stack.
const LABEL_KEYS: [&str; 5] = ["pid", "tid", "comm", "state", "wakeup"];

/// The samples of a report, by column: what each pprof `Sample` message is
/// made of at encoding, without a `Sample` and its three vectors per row,
/// each with its own copy of its stack's location ids (which took the
/// conversion of a 1000-stack report 0.23 MB higher: docs/PERFORMANCE.md).
#[derive(Default)]
struct SampleTable {
    /// Each sample's stack (dictionary stack index) and labels: its merge key.
    keys: Vec<SampleKey>,
    /// `stride` values per sample, one per value column.
    values: Vec<i64>,
    stride: usize,
    /// `keys`' entries by content (the table holds the keys).
    index: HashIndex,
}

impl SampleTable {
    fn find(&self, key: &SampleKey) -> Option<usize> {
        let keys = &self.keys;
        self.index.find(hash_key(key), |i| keys.get(i as usize) == Some(key)).map(|i| i as usize)
    }

    /// Adds a sample of no value; returns its row.
    fn push(&mut self, key: SampleKey) -> usize {
        let row = self.keys.len();
        self.index.insert(hash_key(&key), index(row));
        self.keys.push(key);
        self.values.resize(self.values.len() + self.stride, 0);
        row
    }

    fn add(&mut self, row: usize, column: usize, v: i64) {
        let x = &mut self.values[row * self.stride + column];
        *x = x.saturating_add(v);
    }

    /// Makes room for `columns` values per sample (the new ones 0): a
    /// column appears at most [`MAX_SAMPLE_TYPES`] times per report.
    fn widen(&mut self, columns: usize) {
        if columns <= self.stride {
            return;
        }
        let mut values = Vec::with_capacity(self.keys.len() * columns);
        for row in 0..self.keys.len() {
            values.extend_from_slice(&self.values[row * self.stride..][..self.stride]);
            values.resize(values.len() + columns - self.stride, 0);
        }
        self.values = values;
        self.stride = columns;
    }

    fn row(&self, row: usize) -> (&SampleKey, &[i64]) {
        (&self.keys[row], &self.values[row * self.stride..(row + 1) * self.stride])
    }
}

/// The [`HashIndex`] hash of a sample's key.
fn hash_key(k: &SampleKey) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    k.hash(&mut h);
    h.finish()
}

#[derive(Default)]
struct Builder {
    p: pp::Profile,
    /// `p.string_table`'s entries by content (the table holds the strings).
    strings: HashIndex,
    functions: FxHashMap<(i64, i64, i64, i64), u64>,
    mappings: FxHashMap<(u64, u64, u64, i64, i64), u64>,
    /// `p.location`'s entries by content: mapping, address and lines (the
    /// table holds the keys).
    locations: HashIndex,
    /// The (function id, line) pairs of the location being converted,
    /// reused from one to the next.
    lines: Vec<(u64, i64)>,
    columns: Vec<(String, String)>,
    samples: SampleTable,
    /// The pprof location ids of the dictionary's stacks converted so far,
    /// leaf first, each stack once however many samples share it; `spans`
    /// says where (by dictionary stack index; `NO_SPAN`: not yet).
    stack_locations: Vec<u32>,
    spans: Vec<(u32, u32)>,
    kernel_mapping: u64,
    period: Option<(i64, String, String)>,
    t0: u64,
    t1: u64,
    /// pprof location id of each dictionary location converted so far (by
    /// dictionary index; 0 not yet): stacks share most of their frames,
    /// and a location's mapping, build id and lines are looked up once per
    /// batch, not once per stack. Indexed, not hashed: a stack's every
    /// frame is looked up here.
    location_ids: Vec<u32>,
    /// The value columns of the profile whose samples came last, by its
    /// address in the batch: consecutive samples share their profile, and
    /// its sample and period types are compared as strings once, not per
    /// sample. `None` in the columns: they do not fit.
    last_profile: Option<(*const profcol_api::model::pb::Profile, Option<ProfileColumns>)>,
    /// String indices of the label keys "pid", "tid" and "comm" (0: not
    /// interned yet; interned when a sample first needs one).
    label_keys: [i64; 5],
    /// pprof mapping id of each dictionary mapping converted so far, and
    /// whether its frames are the kernel's (an unnamed mapping is named
    /// for them): its file name and build id are read once, not at each
    /// location.
    mapping_ids: FxHashMap<(i32, bool), u64>,
    /// Samples left out: they would pass [`MAX_SAMPLE_TYPES`] or [`MAX_FRAMES`].
    skipped: u64,
}

/// Where a profile's samples put their values.
#[derive(Clone, Copy)]
struct ProfileColumns {
    /// The column of its sample type.
    count: usize,
    /// The `cpu/nanoseconds` column and the period to multiply by, for a
    /// `samples/count` profile with a `cpu/nanoseconds` period.
    cpu_ns: Option<(usize, i64)>,
    /// Its sample type's unit is `count` (its values are observations).
    counts_events: bool,
}

impl Builder {
    fn new() -> Self {
        let mut b = Builder { t0: u64::MAX, ..Default::default() };
        b.s("");
        b
    }

    /// Room for a whole batch's entries at once: the maps of a report
    /// otherwise grow (and rehash) a dozen times on the way.
    fn sized_for(batch: &Profiles) -> Self {
        let mut b = Self::new();
        if let Some(d) = batch.dictionary() {
            let samples = batch.sample_messages();
            b.strings.reserve(d.string_table.len());
            b.p.string_table.reserve(d.string_table.len());
            b.functions.reserve(d.function_table.len());
            b.p.function.reserve(d.function_table.len());
            b.locations.reserve(d.location_table.len());
            b.p.location.reserve(d.location_table.len());
            b.samples.index.reserve(samples);
            b.samples.keys.reserve(samples);
        }
        b
    }

    fn s(&mut self, v: &str) -> i64 {
        let h = hash_str(v);
        let table = &self.p.string_table;
        if let Some(i) = self.strings.find(h, |i| table.get(i as usize).is_some_and(|t| t == v)) {
            return i64::from(i);
        }
        let i = table.len();
        self.p.string_table.push(v.to_owned());
        self.strings.insert(h, index(i));
        i as i64
    }

    fn column(&mut self, t: &str, u: &str) -> usize {
        match self.columns.iter().position(|(a, b)| a == t && b == u) {
            Some(i) => i,
            None => {
                self.columns.push((t.to_owned(), u.to_owned()));
                self.samples.widen(self.columns.len());
                self.columns.len() - 1
            }
        }
    }

    /// Whether the columns `want` fit within [`MAX_SAMPLE_TYPES`].
    fn columns_fit(&self, want: &[(&str, &str)]) -> bool {
        let new = want.iter().filter(|(t, u)| !self.columns.iter().any(|(a, b)| a == t && b == u)).count();
        self.columns.len() + new <= MAX_SAMPLE_TYPES
    }

    fn mapping(&mut self, start: u64, limit: u64, offset: u64, filename: &str, build_id: &str) -> u64 {
        let (f, b) = (self.s(filename), self.s(build_id));
        let next = self.p.mapping.len() as u64 + 1;
        let id = *self.mappings.entry((start, limit, offset, f, b)).or_insert(next);
        if id == next {
            self.p.mapping.push(pp::Mapping {
                id,
                memory_start: start,
                memory_limit: limit,
                file_offset: offset,
                filename: f,
                build_id: b,
                ..Default::default()
            });
        }
        id
    }

    fn function(&mut self, name: &str, system_name: &str, filename: &str, start_line: i64) -> u64 {
        let key = (self.s(name), self.s(system_name), self.s(filename), start_line);
        let next = self.p.function.len() as u64 + 1;
        let id = *self.functions.entry(key).or_insert(next);
        if id == next {
            self.p.function.push(pp::Function { id, name: key.0, system_name: key.1, filename: key.2, start_line });
        }
        id
    }

    /// Converts dictionary stack `i` (in range) into `stack_locations`
    /// once: pprof location ids, leaf first.
    fn stack(&mut self, s: &SampleView<'_>, i: usize) {
        if self.spans.len() < s.dict.stack_table.len() {
            self.spans.resize(s.dict.stack_table.len(), NO_SPAN);
        }
        if self.spans[i] != NO_SPAN {
            return;
        }
        if self.location_ids.len() < s.dict.location_table.len() {
            self.location_ids.resize(s.dict.location_table.len(), 0);
        }
        let start = self.stack_locations.len();
        for &l in &s.dict.stack_table[i].location_indices {
            // An index outside the table has no location (and no slot).
            let Some(l) = usize::try_from(l).ok().filter(|&l| l < s.dict.location_table.len()) else { continue };
            let id = match self.location_ids[l] {
                0 => {
                    let location = &s.dict.location_table[l];
                    let id = self.location(s, FrameView { location, dict: s.dict });
                    self.location_ids[l] = id;
                    id
                }
                id => id,
            };
            self.stack_locations.push(id);
        }
        // Within u32: MAX_FRAMES bounds the frames of a report's stacks.
        self.spans[i] = (start as u32, (self.stack_locations.len() - start) as u32);
    }

    /// The columns of `s`'s profile (made on its first sample), `None` when
    /// they would pass [`MAX_SAMPLE_TYPES`].
    fn columns_of(&mut self, s: &SampleView<'_>) -> Option<ProfileColumns> {
        let prof = s.profile;
        if let Some((p, cols)) = self.last_profile {
            if std::ptr::eq(p, prof) {
                return cols;
            }
        }
        let (t, u) = s.sample_type();
        let counts_events = u == "count";
        let (t, u) = if t.is_empty() { ("samples", "count") } else { (t, u) };
        let (pt, pu) =
            prof.period_type.as_ref().map(|vt| (s.str(vt.type_strindex), s.str(vt.unit_strindex))).unwrap_or(("", ""));
        let has_period = prof.period > 0 && !pt.is_empty();
        let cpu_ns = has_period && (t, u) == ("samples", "count") && (pt, pu) == ("cpu", "nanoseconds");
        let fits =
            if cpu_ns { self.columns_fit(&[(t, u), ("cpu", "nanoseconds")]) } else { self.columns_fit(&[(t, u)]) };
        let cols = fits.then(|| {
            if has_period && self.period.is_none() {
                self.period = Some((prof.period, pt.to_owned(), pu.to_owned()));
            }
            ProfileColumns {
                count: self.column(t, u),
                cpu_ns: cpu_ns.then(|| (self.column("cpu", "nanoseconds"), prof.period)),
                counts_events,
            }
        });
        self.last_profile = Some((prof, cols));
        cols
    }

    /// The string index of label key `k` (of [`LABEL_KEYS`]).
    fn label_key(&mut self, k: usize) -> i64 {
        if self.label_keys[k] == 0 {
            self.label_keys[k] = self.s(LABEL_KEYS[k]);
        }
        self.label_keys[k]
    }

    /// The pprof location of dictionary location `f`.
    fn location(&mut self, s: &SampleView<'_>, f: FrameView<'_>) -> u32 {
        let kernel = f.attribute_str(keys::FRAME_TYPE) == Some("kernel");
        let mapping_id = match f.mapping() {
            Some(_) if self.mapping_ids.contains_key(&(f.location.mapping_index, kernel)) => {
                self.mapping_ids[&(f.location.mapping_index, kernel)]
            }
            Some(m) => {
                let name = f.mapping_filename();
                let name = if name.is_empty() && kernel { keys::KERNEL_MAPPING } else { name };
                let build_id = m
                    .attribute_indices
                    .iter()
                    .filter_map(|&i| s.dict.attribute_table.get(i as usize))
                    .find(|kv| s.str(kv.key_strindex) == keys::BUILD_ID_GNU)
                    .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                        profcol_api::model::any_value::Value::StringValue(x) => Some(x.clone()),
                        profcol_api::model::any_value::Value::BytesValue(x) => {
                            Some(x.iter().map(|b| format!("{b:02x}")).collect())
                        }
                        _ => None,
                    })
                    .unwrap_or_default();
                let id = self.mapping(m.memory_start, m.memory_limit, m.file_offset, name, &build_id);
                self.mapping_ids.insert((f.location.mapping_index, kernel), id);
                id
            }
            None if kernel => {
                if self.kernel_mapping == 0 {
                    self.kernel_mapping = self.mapping(0, 0, 0, keys::KERNEL_MAPPING, "");
                }
                self.kernel_mapping
            }
            None => 0,
        };
        let mut lines = std::mem::take(&mut self.lines);
        lines.clear();
        for ln in &f.location.lines {
            let Some(func) = s.dict.function_table.get(ln.function_index.max(0) as usize) else { continue };
            let (n, sn, file) =
                (s.str(func.name_strindex), s.str(func.system_name_strindex), s.str(func.filename_strindex));
            if n.is_empty() && sn.is_empty() {
                continue;
            }
            let fid = self.function(n, sn, file, func.start_line);
            lines.push((fid, ln.line));
        }
        if !lines.is_empty() && mapping_id != 0 {
            if let Some(m) = self.p.mapping.get_mut(mapping_id as usize - 1) {
                m.has_functions = true;
            }
        }
        let address = f.location.address;
        let h = hash_location(mapping_id, address, &lines);
        let table = &self.p.location;
        let same = |i: i32| {
            let Some(l) = table.get(i as usize) else { return false };
            l.mapping_id == mapping_id
                && l.address == address
                && l.line.len() == lines.len()
                && l.line
                    .iter()
                    .zip(&lines)
                    .all(|(a, &(function_id, line))| a.function_id == function_id && a.line == line)
        };
        let id = match self.locations.find(h, same) {
            Some(i) => i.unsigned_abs() + 1,
            None => {
                let i = index(table.len());
                self.p.location.push(pp::Location {
                    id: u64::from(i.unsigned_abs() + 1),
                    mapping_id,
                    address,
                    line: lines.iter().map(|&(function_id, line)| pp::Line { function_id, line, column: 0 }).collect(),
                    is_folded: false,
                });
                self.locations.insert(h, i);
                i.unsigned_abs() + 1
            }
        };
        self.lines = lines;
        id
    }

    fn finish(mut self) -> PprofReport {
        let mut sample_type = Vec::with_capacity(self.columns.len());
        for (t, u) in std::mem::take(&mut self.columns) {
            sample_type.push(pp::ValueType { r#type: self.s(&t), unit: self.s(&u) });
        }
        if let Some((period, t, u)) = self.period.take() {
            self.p.period_type = Some(pp::ValueType { r#type: self.s(&t), unit: self.s(&u) });
            self.p.period = period;
        }
        if self.t0 != u64::MAX {
            // Times past i64 (year 2262) saturate instead of wrapping negative.
            self.p.time_nanos = i64::try_from(self.t0).unwrap_or(i64::MAX);
            self.p.duration_nanos = i64::try_from(self.t1.saturating_sub(self.t0)).unwrap_or(i64::MAX);
        }
        // The merge index is done with; the rows stay for the encoding.
        let mut samples = self.samples;
        samples.index = HashIndex::default();
        PprofReport {
            sample_type,
            rest: self.p,
            samples,
            stack_locations: self.stack_locations,
            spans: self.spans,
            label_keys: self.label_keys,
        }
    }
}

/// No stack converted yet at this dictionary stack index.
const NO_SPAN: (u32, u32) = (u32::MAX, 0);

/// One pprof profile, ready to encode: its tables as pprof messages and its
/// samples by column, each `Sample` message written from its row at
/// encoding (the bytes are prost's for the same profile, field for field).
pub struct PprofReport {
    sample_type: Vec<pp::ValueType>,
    /// The fields after `sample` (no sample types, no samples).
    rest: pp::Profile,
    samples: SampleTable,
    stack_locations: Vec<u32>,
    spans: Vec<(u32, u32)>,
    label_keys: [i64; 5],
}

/// `Profile` field numbers written here (the rest are prost's).
const SAMPLE_TYPE: u32 = 1;
const SAMPLE: u32 = 2;
/// `Sample` field numbers.
const LOCATION_ID: u32 = 1;
const VALUE: u32 = 2;
const LABEL: u32 = 3;

impl PprofReport {
    /// Sample messages.
    pub fn samples(&self) -> usize {
        self.samples.keys.len()
    }

    /// Location ids of dictionary stack `stack`, leaf first.
    fn locations_of(&self, stack: i32) -> &[u32] {
        usize::try_from(stack)
            .ok()
            .and_then(|i| self.spans.get(i))
            .filter(|&&span| span != NO_SPAN)
            .map_or(&[][..], |&(start, n)| &self.stack_locations[start as usize..][..n as usize])
    }

    fn labels(&self, key: &SampleKey) -> impl Iterator<Item = pp::Label> {
        let [pid, tid, comm, state, wakeup] = self.label_keys;
        let num = |key, num| pp::Label { key, num, ..Default::default() };
        let str = |key, str| pp::Label { key, str, ..Default::default() };
        key.1
            .map(|n| num(pid, n))
            .into_iter()
            .chain(key.2.map(|n| num(tid, n)))
            .chain(key.3.map(|s| str(comm, s)))
            .chain(key.4.map(|s| str(state, s)))
            .chain(key.5.map(|n| num(wakeup, n)))
    }

    /// The encoded length of sample `row`'s message body.
    fn sample_len(&self, row: usize) -> usize {
        let (key, values) = self.samples.row(row);
        let locations: usize = self.locations_of(key.0).iter().map(|&l| encoded_len_varint(u64::from(l))).sum();
        let values: usize = values.iter().map(|&v| encoded_len_varint(v as u64)).sum();
        packed_len(LOCATION_ID, locations)
            + packed_len(VALUE, values)
            + self.labels(key).map(|l| message::encoded_len(LABEL, &l)).sum::<usize>()
    }

    pub(crate) fn encoded_len(&self) -> usize {
        let types: usize = self.sample_type.iter().map(|t| message::encoded_len(SAMPLE_TYPE, t)).sum();
        let samples: usize = (0..self.samples())
            .map(|row| {
                let n = self.sample_len(row);
                key_len(SAMPLE) + encoded_len_varint(n as u64) + n
            })
            .sum();
        types + samples + self.rest.encoded_len()
    }

    /// The `Profile` message's bytes.
    pub fn encode_to_vec(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(self.encoded_len());
        for t in &self.sample_type {
            message::encode(SAMPLE_TYPE, t, &mut buf);
        }
        for row in 0..self.samples() {
            let (key, values) = self.samples.row(row);
            encode_key(SAMPLE, WireType::LengthDelimited, &mut buf);
            encode_varint(self.sample_len(row) as u64, &mut buf);
            let locations = self.locations_of(key.0);
            packed(LOCATION_ID, locations.iter().map(|&l| u64::from(l)), &mut buf);
            packed(VALUE, values.iter().map(|&v| v as u64), &mut buf);
            for l in self.labels(key) {
                message::encode(LABEL, &l, &mut buf);
            }
        }
        // Every field of `rest` comes after `sample`: prost writes them in order.
        self.rest.encode_raw(&mut buf);
        buf
    }

    /// The whole profile as prost decodes the encoding (for tests and tools:
    /// the exporter writes [`PprofReport::encode_to_vec`]'s bytes).
    pub fn to_profile(&self) -> Result<pp::Profile, prost::DecodeError> {
        pp::Profile::decode(self.encode_to_vec().as_slice())
    }

    /// pprof's validity rules ([`check_valid`]) on the report as encoded.
    pub fn check_valid(&self) -> Result<(), String> {
        if self.samples() > 0 && self.samples.stride != self.sample_type.len() {
            return Err(format!(
                "samples have {} values for {} sample types",
                self.samples.stride,
                self.sample_type.len()
            ));
        }
        if self.label_keys.iter().any(|&k| k < 0 || k as usize >= self.rest.string_table.len()) {
            return Err("a label key is out of range".into());
        }
        let locations = self.rest.location.len();
        if let Some(l) = self.stack_locations.iter().find(|&&l| l == 0 || l as usize > locations) {
            return Err(format!("a sample refers to location {l}"));
        }
        check_tables(&self.rest, &self.sample_type)
    }
}

/// A packed repeated field whose values take `len` bytes (none if empty).
fn packed_len(tag: u32, len: usize) -> usize {
    if len == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(len as u64) + len
    }
}

/// Writes a packed repeated varint field (nothing if empty), as prost does.
fn packed(tag: u32, values: impl Iterator<Item = u64> + Clone, buf: &mut Vec<u8>) {
    let len: usize = values.clone().map(encoded_len_varint).sum();
    if len == 0 {
        return;
    }
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
    for v in values {
        encode_varint(v, buf);
    }
}

/// A table position as [`HashIndex`] holds it: the tables of one report stay
/// far below 2^31 entries ([`MAX_FRAMES`] bounds its stacks' frames).
fn index(i: usize) -> i32 {
    i32::try_from(i).unwrap_or(i32::MAX)
}

/// The [`HashIndex`] hash of a pprof location's content.
fn hash_location(mapping_id: u64, address: u64, lines: &[(u64, i64)]) -> u64 {
    use std::hash::Hasher;
    let mut h = rustc_hash::FxHasher::default();
    h.write_u64(mapping_id);
    h.write_u64(address);
    for &(f, l) in lines {
        h.write_u64(f);
        h.write_i64(l);
    }
    h.write_usize(lines.len());
    h.finish()
}

/// One pprof profile per group, with the group's time range (unix ns).
pub struct GroupProfile {
    pub group: String,
    pub report: PprofReport,
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// Samples of the group that are not in `report`: they would have
    /// passed [`MAX_SAMPLE_TYPES`] or [`MAX_FRAMES`].
    pub skipped_samples: u64,
}

/// Converts a batch into one pprof profile per group (`group_by`), its
/// samples labelled `pid`, `tid` and `comm`.
pub fn to_pprof(batch: &Profiles, by: GroupBy) -> Vec<GroupProfile> {
    convert(batch, Grouping::By(by), true)
}

/// Converts a batch into one pprof profile per group that `group` names
/// of each sample's resource (called once per resource); with
/// `sample_labels` false the samples carry no `pid`/`tid`/`comm` labels, so
/// those of one stack in a group merge whatever their process.
pub(crate) fn to_pprof_with(
    batch: &Profiles,
    group: &dyn Fn(Option<&Resource>) -> String,
    sample_labels: bool,
) -> Vec<GroupProfile> {
    convert(batch, Grouping::Resource(group), sample_labels)
}

/// What names a sample's group.
enum Grouping<'f> {
    By(GroupBy),
    Resource(&'f dyn Fn(Option<&Resource>) -> String),
}

fn convert(batch: &Profiles, grouping: Grouping<'_>, sample_labels: bool) -> Vec<GroupProfile> {
    // A sample's attributes are read once, for its group and its labels alike.
    let read_attrs = sample_labels || matches!(grouping, Grouping::By(GroupBy::Process | GroupBy::Container));
    let mut reader = AttrReader::default();
    let mut names = GroupNames::new(match grouping {
        Grouping::By(by) => by,
        Grouping::Resource(_) => GroupBy::None,
    });
    // The samples of a resource come one after another: named once.
    let mut resource_group: Option<(*const Resource, String)> = None;
    let mut groups: BTreeMap<String, Builder> = BTreeMap::new();
    let mut frames = 0usize;
    let mut own_type = String::new();
    for s in batch.samples() {
        // Off-CPU and wakeup samples keep their state and waker labels.
        let own = own_report_type(s.sample_type().0);
        let attrs = if read_attrs || own.is_some() { reader.read(&s) } else { SampleAttrs::default() };
        let mut g: &str = match grouping {
            Grouping::By(_) => names.of(&attrs),
            Grouping::Resource(group) => {
                let key = s.resource.map_or(std::ptr::null(), |r| r as *const Resource);
                if resource_group.as_ref().is_none_or(|(k, _)| *k != key) {
                    resource_group = Some((key, group(s.resource)));
                }
                resource_group.as_ref().map_or("", |(_, name)| name)
            }
        };
        if let Some(own) = own {
            own_type.clear();
            own_type.push_str(g);
            own_type.push('-');
            own_type.push_str(own);
            g = &own_type;
        }
        // A group's name is owned by the map, copied for its first sample only.
        let b = if groups.contains_key(g) {
            groups.get_mut(g)
        } else {
            // Past MAX_GROUPS, the overflow group.
            let g = bounded_group(&groups, g.to_owned());
            // The first group gets room for the whole batch (with one group,
            // the usual case, it needs that); others grow as they fill.
            let first = groups.is_empty();
            Some(groups.entry(g).or_insert_with(|| if first { Builder::sized_for(batch) } else { Builder::new() }))
        };
        let Some(b) = b else { continue };
        let prof = s.profile;
        // Value columns first: a sample whose columns do not fit is left out
        // (and counted, in observations, as every count of samples).
        let Some(cols) = b.columns_of(&s) else {
            let counts_events = s.sample_type().1 == "count";
            b.skipped = b.skipped.saturating_add(profcol_api::model::observations(s.sample, counts_events));
            continue;
        };
        let state = attrs.off_cpu_state().map(|c| b.s(&c));
        let key: SampleKey = if sample_labels {
            let comm = attrs.comm().map(|c| b.s(&c));
            (s.sample.stack_index, attrs.pid(), attrs.tid(), comm, state, attrs.wakeup())
        } else {
            (s.sample.stack_index, None, None, None, state, attrs.wakeup())
        };
        let same = b.samples.find(&key);
        if same.is_none() {
            let depth = usize::try_from(s.sample.stack_index)
                .ok()
                .and_then(|i| s.dict.stack_table.get(i))
                .map_or(0, |st| st.location_indices.len());
            if frames.saturating_add(depth) > MAX_FRAMES {
                b.skipped = b.skipped.saturating_add(profcol_api::model::observations(s.sample, cols.counts_events));
                continue;
            }
            frames += depth;
        }
        if prof.time_unix_nano > 0 {
            b.t0 = b.t0.min(prof.time_unix_nano);
            b.t1 = b.t1.max(prof.time_unix_nano.saturating_add(prof.duration_nano));
        }
        // Values.
        let count: i64 = if !s.sample.values.is_empty() {
            s.sample.values.iter().fold(0i64, |a, &v| a.saturating_add(v))
        } else {
            i64::try_from(s.sample.timestamps_unix_nano.len().max(1)).unwrap_or(i64::MAX)
        };
        let row = match same {
            Some(row) => row,
            None => {
                // Stack, converted once; label keys interned before the
                // report's string table is final.
                if let Some(i) = usize::try_from(key.0).ok().filter(|&i| i < s.dict.stack_table.len()) {
                    b.stack(&s, i);
                }
                let present = [key.1.is_some(), key.2.is_some(), key.3.is_some(), key.4.is_some(), key.5.is_some()];
                for (k, present) in present.into_iter().enumerate() {
                    if present {
                        b.label_key(k);
                    }
                }
                b.samples.push(key)
            }
        };
        b.samples.add(row, cols.count, count);
        if let Some((c, period)) = cols.cpu_ns {
            b.samples.add(row, c, count.saturating_mul(period));
        }
    }
    groups
        .into_iter()
        .map(|(group, b)| {
            let (start, end, skipped_samples) = (b.t0, b.t1, b.skipped);
            let report = b.finish();
            let (start, end) = if start == u64::MAX { (0, 0) } else { (start, end) };
            GroupProfile { group, report, start, end, skipped_samples }
        })
        .collect()
}

/// pprof's own validity rules (what `profile.CheckValid` enforces in Go).
pub fn check_valid(p: &pp::Profile) -> Result<(), String> {
    let n = p.sample_type.len();
    for (i, s) in p.sample.iter().enumerate() {
        if s.value.len() != n {
            return Err(format!("sample {i} has {} values for {n} sample types", s.value.len()));
        }
        for l in &s.location_id {
            if *l == 0 || *l as usize > p.location.len() {
                return Err(format!("sample {i} refers to location {l}"));
            }
        }
    }
    check_tables(p, &p.sample_type)
}

/// The rules on everything but the samples; the sample types are passed
/// apart (a [`PprofReport`] holds them outside its `Profile`).
fn check_tables(p: &pp::Profile, sample_type: &[pp::ValueType]) -> Result<(), String> {
    if p.string_table.first().map(String::as_str) != Some("") {
        return Err("string_table[0] must be \"\"".into());
    }
    for (i, m) in p.mapping.iter().enumerate() {
        if m.id != i as u64 + 1 {
            return Err(format!("mapping {i} has id {}", m.id));
        }
    }
    for (i, f) in p.function.iter().enumerate() {
        if f.id != i as u64 + 1 {
            return Err(format!("function {i} has id {}", f.id));
        }
    }
    for (i, l) in p.location.iter().enumerate() {
        if l.id != i as u64 + 1 {
            return Err(format!("location {i} has id {}", l.id));
        }
        if l.mapping_id as usize > p.mapping.len() {
            return Err(format!("location {} refers to mapping {}", l.id, l.mapping_id));
        }
        for ln in &l.line {
            if ln.function_id == 0 || ln.function_id as usize > p.function.len() {
                return Err(format!("location {} refers to function {}", l.id, ln.function_id));
            }
        }
    }
    let ns = p.string_table.len() as i64;
    let bad = |x: i64| x < 0 || x >= ns;
    if p.function.iter().any(|f| bad(f.name) || bad(f.system_name) || bad(f.filename))
        || p.mapping.iter().any(|m| bad(m.filename) || bad(m.build_id))
        || sample_type.iter().any(|v| bad(v.r#type) || bad(v.unit))
    {
        return Err("a string index is out of range".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use profcol_api::model::{keys, pb, AttrValue, KeyValue, ProfileMeta, Resource};
    use profcol_api::ProfilesBuilder;

    /// Samples of one stack in two threads, first in a CPU profile (two
    /// columns), then in a profile of another type whose column appears
    /// once rows exist: rows merge by thread, the new column is added to
    /// every row, and the bytes are prost's for what they decode to.
    #[test]
    fn rows_merge_by_labels_and_gain_columns_that_come_later() {
        let mut b = ProfilesBuilder::new();
        let f = b.function("work", "work", "w.c", 0);
        let g = b.function("main", "main", "w.c", 0);
        let (leaf, root) = (b.line_location(f, 3), b.line_location(g, 9));
        let stack = b.stack(&[leaf, root]);
        let pid = KeyValue {
            key: keys::PROCESS_PID.into(),
            value: Some(profcol_api::model::AnyValue {
                value: Some(profcol_api::model::any_value::Value::IntValue(42)),
            }),
            ..Default::default()
        };
        let r = b.resource(Resource { attributes: vec![pid], ..Default::default() });
        let threads: Vec<[i32; 2]> = [(1, "one"), (2, "two")]
            .iter()
            .map(|&(tid, name)| {
                [
                    b.attribute(keys::THREAD_ID, AttrValue::Int(tid)),
                    b.attribute(keys::THREAD_NAME, AttrValue::Str(name)),
                ]
            })
            .collect();
        let cpu = b.profile(r, &ProfileMeta::cpu(10, 1_000, 5));
        let alloc = b.profile(r, &ProfileMeta { sample_type: ("alloc", "count"), ..Default::default() });
        for (p, counts) in [(cpu, [3, 4]), (alloc, [5, 6]), (cpu, [1, 1])] {
            for (attrs, count) in threads.iter().zip(counts) {
                let attribute_indices = attrs.to_vec();
                b.sample(
                    p,
                    pb::Sample { stack_index: stack, attribute_indices, values: vec![count], ..Default::default() },
                );
            }
        }
        let batch = b.build();
        batch.validate().unwrap();
        let groups = to_pprof(&batch, GroupBy::None);
        let report = &groups[0].report;
        report.check_valid().unwrap();
        let p = report.to_profile().unwrap();
        check_valid(&p).unwrap();
        assert_eq!(p.encode_to_vec(), report.encode_to_vec());
        assert_eq!(report.encoded_len(), report.encode_to_vec().len());

        let s = |i: i64| p.string_table[i as usize].as_str();
        let types: Vec<(&str, &str)> = p.sample_type.iter().map(|t| (s(t.r#type), s(t.unit))).collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds"), ("alloc", "count")]);
        assert_eq!(p.sample.len(), 2, "one row per thread");
        for (sample, (tid, name, values)) in p.sample.iter().zip([(1, "one", [4, 40, 5]), (2, "two", [5, 50, 6])]) {
            assert_eq!(sample.value, values);
            let names: Vec<&str> = sample
                .location_id
                .iter()
                .map(|&id| {
                    let line = &p.location[id as usize - 1].line[0];
                    s(p.function[line.function_id as usize - 1].name)
                })
                .collect();
            assert_eq!(names, ["work", "main"], "leaf first");
            let label = |k: &str| sample.label.iter().find(|l| s(l.key) == k).unwrap();
            assert_eq!((label("pid").num, label("tid").num, s(label("comm").str)), (42, tid, name));
        }
    }

    /// Off-CPU and wakeup profiles (off_cpu/nanoseconds, wakeup/nanoseconds)
    /// go to reports of their own, `<group>-off_cpu` and `<group>-wakeup`,
    /// whose first column and period are their own; the CPU report keeps
    /// its columns.
    #[test]
    fn off_cpu_and_wakeup_profiles_get_reports_of_their_own() {
        let (mut b, stack, cpu, off) = crate::test_batches::cpu_and_off_cpu();
        let wake = crate::test_batches::wakeup_profile(&mut b);
        let state = b.attribute(keys::OFF_CPU_STATE, AttrValue::Str("sleeping"));
        let link = b.attribute(keys::OFF_CPU_WAKEUP, AttrValue::Int(4));
        for (p, v, attribute_indices) in
            [(off, 7_000_000, vec![state, link]), (cpu, 3, vec![]), (wake, 5_000_000, vec![link])]
        {
            b.sample(p, pb::Sample { stack_index: stack, values: vec![v], attribute_indices, ..Default::default() });
        }
        let batch = b.build();
        batch.validate().unwrap();
        let groups = to_pprof(&batch, GroupBy::None);
        let names: Vec<&str> = groups.iter().map(|g| g.group.as_str()).collect();
        assert_eq!(names, ["all", "all-off_cpu", "all-wakeup"]);
        for (g, want, value) in [
            (&groups[0], ("samples", "count"), 3),
            (&groups[1], ("off_cpu", "nanoseconds"), 7_000_000),
            (&groups[2], ("wakeup", "nanoseconds"), 5_000_000),
        ] {
            let p = g.report.to_profile().unwrap();
            check_valid(&p).unwrap();
            let s = |i: i64| p.string_table[i as usize].as_str();
            assert_eq!((s(p.sample_type[0].r#type), s(p.sample_type[0].unit)), want, "{}", g.group);
            let others = ["samples", "off_cpu", "wakeup"].into_iter().filter(|&t| t != want.0);
            for other in others {
                assert!(p.sample_type.iter().all(|t| s(t.r#type) != other), "{}: no {other} column", g.group);
            }
            assert_eq!(p.sample[0].value[0], value);
            // The wait and its waker carry one `wakeup` number; the wait its state.
            let labels: Vec<(&str, &str, i64)> =
                p.sample[0].label.iter().map(|l| (s(l.key), s(l.str), l.num)).filter(|l| l.0 != "comm").collect();
            let want_labels = match want.0 {
                "off_cpu" => vec![("state", "sleeping", 0), ("wakeup", "", 4)],
                "wakeup" => vec![("wakeup", "", 4)],
                _ => vec![],
            };
            assert_eq!(labels, want_labels, "{}", g.group);
        }
    }
}
