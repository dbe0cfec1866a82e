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
use crate::group::{attr, attr_int, bounded_group, group_of, GroupBy, ALL_GROUP};
use profcol_api::model::view::{FrameView, SampleView};
use profcol_api::model::{hash_str, keys, HashIndex};
use profcol_api::Profiles;
use rustc_hash::FxHashMap;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// A sample before every value column is known: locations, values by
/// column (as long as the columns known when it last changed; padded with
/// zeros at the end), labels. Each becomes the `pp::Sample`'s own vector.
type PendingSample = (Vec<u64>, Vec<i64>, Vec<pp::Label>);

/// Most sample types (value columns) of one pprof profile. Every pprof
/// sample carries a value per column, so without a bound a batch of many
/// profiles, each of its own sample type, would need profiles × types values.
pub const MAX_SAMPLE_TYPES: usize = 32;

/// Most stack frames (location ids) the reports of one batch hold. pprof
/// repeats the whole stack in every sample, so a batch of many samples on a
/// deep stack (a few bytes each on the wire) would otherwise need samples ×
/// depth ids. Samples with the same stack and labels are merged first.
pub const MAX_FRAMES: usize = 32 << 20;

/// Samples that are merged: stack index and labels (pid, tid, comm's string index).
type SampleKey = (i32, Option<i64>, Option<i64>, Option<i64>);

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
    /// Samples with their values as (column, value).
    samples: Vec<PendingSample>,
    kernel_mapping: u64,
    period: Option<(i64, String, String)>,
    t0: u64,
    t1: u64,
    /// Index in `samples` of the sample with this stack and these labels.
    merged: FxHashMap<SampleKey, usize>,
    /// The sample in `samples` holding each stack's location ids (by
    /// dictionary stack index; `usize::MAX` none yet), for samples of the
    /// same stack with other labels (no second copy kept).
    stacks: Vec<usize>,
    /// pprof location id of each dictionary location converted so far (by
    /// dictionary index; 0 not yet): stacks share most of their frames,
    /// and a location's mapping, build id and lines are looked up once per
    /// batch, not once per stack. Indexed, not hashed: a stack's every
    /// frame is looked up here.
    location_ids: Vec<u64>,
    /// The value columns of the profile whose samples came last, by its
    /// address in the batch: consecutive samples share their profile, and
    /// its sample and period types are compared as strings once, not per
    /// sample. `None` in the columns: they do not fit.
    last_profile: Option<(*const profcol_api::model::pb::Profile, Option<ProfileColumns>)>,
    /// String indices of the label keys "pid", "tid" and "comm" (0: not
    /// interned yet; interned when a sample first needs one).
    label_keys: [i64; 3],
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
            b.merged.reserve(samples);
            b.samples.reserve(samples);
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

    /// pprof location ids of the sample's stack, leaf first.
    fn stack(&mut self, s: &SampleView<'_>) -> Vec<u64> {
        let at = |i: i32| usize::try_from(i).ok();
        let indices = at(s.sample.stack_index)
            .and_then(|i| s.dict.stack_table.get(i))
            .map_or(&[][..], |st| st.location_indices.as_slice());
        if self.location_ids.len() < s.dict.location_table.len() {
            self.location_ids.resize(s.dict.location_table.len(), 0);
        }
        let mut locs = Vec::with_capacity(indices.len());
        for &i in indices {
            // An index outside the table has no location (and no slot).
            let Some(i) = at(i).filter(|&i| i < s.dict.location_table.len()) else { continue };
            let id = match self.location_ids[i] {
                0 => {
                    let location = &s.dict.location_table[i];
                    let id = self.location(s, FrameView { location, dict: s.dict });
                    self.location_ids[i] = id;
                    id
                }
                id => id,
            };
            locs.push(id);
        }
        locs
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

    /// The string index of label key `k` (0 "pid", 1 "tid", 2 "comm").
    fn label_key(&mut self, k: usize) -> i64 {
        if self.label_keys[k] == 0 {
            self.label_keys[k] = self.s(["pid", "tid", "comm"][k]);
        }
        self.label_keys[k]
    }

    /// The pprof location of dictionary location `f`.
    fn location(&mut self, s: &SampleView<'_>, f: FrameView<'_>) -> u64 {
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
            Some(i) => i as u64 + 1,
            None => {
                let i = table.len();
                self.p.location.push(pp::Location {
                    id: i as u64 + 1,
                    mapping_id,
                    address,
                    line: lines.iter().map(|&(function_id, line)| pp::Line { function_id, line, column: 0 }).collect(),
                    is_folded: false,
                });
                self.locations.insert(h, index(i));
                i as u64 + 1
            }
        };
        self.lines = lines;
        id
    }

    fn finish(mut self) -> pp::Profile {
        let ncols = self.columns.len();
        for (t, u) in std::mem::take(&mut self.columns) {
            let vt = pp::ValueType { r#type: self.s(&t), unit: self.s(&u) };
            self.p.sample_type.push(vt);
        }
        // Moved, not copied: the pending samples' vectors become the pprof ones.
        self.p.sample.reserve_exact(self.samples.len());
        for (locs, mut value, labels) in std::mem::take(&mut self.samples) {
            value.resize(ncols, 0);
            self.p.sample.push(pp::Sample { location_id: locs, value, label: labels });
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
        self.p
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
    pub profile: pp::Profile,
    pub start: u64,
    pub end: u64,
    /// Samples of the group that are not in `profile`: they would have
    /// passed [`MAX_SAMPLE_TYPES`] or [`MAX_FRAMES`].
    pub skipped_samples: u64,
}

/// Converts a batch into one pprof profile per group (`group_by`), its
/// samples labelled `pid`, `tid` and `comm`.
pub fn to_pprof(batch: &Profiles, by: GroupBy) -> Vec<GroupProfile> {
    match by {
        // One group: no name made per sample.
        GroupBy::None => to_pprof_with(batch, &|_| Cow::Borrowed(ALL_GROUP), true),
        by => to_pprof_with(batch, &|s| Cow::Owned(group_of(s, by)), true),
    }
}

/// Converts a batch into one pprof profile per group that `group` names;
/// with `sample_labels` false the samples carry no `pid`/`tid`/`comm`
/// labels, so those of one stack in a group merge whatever their process.
pub fn to_pprof_with(
    batch: &Profiles,
    group: &dyn Fn(&SampleView<'_>) -> Cow<'static, str>,
    sample_labels: bool,
) -> Vec<GroupProfile> {
    let mut groups: BTreeMap<String, Builder> = BTreeMap::new();
    let mut frames = 0usize;
    for s in batch.samples() {
        let g = group(&s);
        // A group's name is made (owned) only for its first sample.
        let b = if groups.contains_key(g.as_ref()) {
            groups.get_mut(g.as_ref())
        } else {
            // Past MAX_GROUPS, the overflow group.
            let g = bounded_group(&groups, g.into_owned());
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
        let key: SampleKey = if sample_labels {
            let pid = attr_int(&s, keys::PROCESS_PID);
            let tid = attr_int(&s, keys::THREAD_ID);
            let comm = attr(&s, keys::THREAD_NAME).or_else(|| attr(&s, keys::PROCESS_EXECUTABLE_NAME)).map(|c| b.s(&c));
            (s.sample.stack_index, pid, tid, comm)
        } else {
            (s.sample.stack_index, None, None, None)
        };
        let same = b.merged.get(&key).copied();
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
        let cpu = cols.cpu_ns.map(|(c, period)| (c, count.saturating_mul(period)));
        let add = |value: &mut Vec<i64>| {
            for (c, v) in std::iter::once((cols.count, count)).chain(cpu) {
                if value.len() <= c {
                    value.resize(c + 1, 0);
                }
                value[c] = value[c].saturating_add(v);
            }
        };
        if let Some(k) = same {
            add(&mut b.samples[k].1);
            continue;
        }
        let mut value = Vec::with_capacity(b.columns.len());
        add(&mut value);
        // Stack, leaf first.
        let stack = usize::try_from(s.sample.stack_index).ok().filter(|&i| i < s.dict.stack_table.len());
        if let Some(i) = stack {
            if b.stacks.len() < s.dict.stack_table.len() {
                b.stacks.resize(s.dict.stack_table.len(), usize::MAX);
            }
            if b.stacks[i] == usize::MAX {
                // Pushed into `samples` at that index below.
                b.stacks[i] = b.samples.len();
            }
        }
        let locs = match stack.map(|i| b.stacks[i]) {
            Some(k) if k != b.samples.len() => b.samples[k].0.clone(),
            _ => b.stack(&s),
        };
        // Labels.
        let mut labels = Vec::with_capacity(3);
        if let Some(pid) = key.1 {
            labels.push(pp::Label { key: b.label_key(0), num: pid, ..Default::default() });
        }
        if let Some(tid) = key.2 {
            labels.push(pp::Label { key: b.label_key(1), num: tid, ..Default::default() });
        }
        if let Some(comm) = key.3 {
            labels.push(pp::Label { key: b.label_key(2), str: comm, ..Default::default() });
        }
        b.merged.insert(key, b.samples.len());
        b.samples.push((locs, value, labels));
    }
    groups
        .into_iter()
        .map(|(group, b)| {
            let (start, end, skipped_samples) = (b.t0, b.t1, b.skipped);
            let profile = b.finish();
            let (start, end) = if start == u64::MAX { (0, 0) } else { (start, end) };
            GroupProfile { group, profile, start, end, skipped_samples }
        })
        .collect()
}

/// pprof's own validity rules (what `profile.CheckValid` enforces in Go).
pub fn check_valid(p: &pp::Profile) -> Result<(), String> {
    if p.string_table.first().map(String::as_str) != Some("") {
        return Err("string_table[0] must be \"\"".into());
    }
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
        || p.sample_type.iter().any(|v| bad(v.r#type) || bad(v.unit))
    {
        return Err("a string index is out of range".into());
    }
    Ok(())
}
