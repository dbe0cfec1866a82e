//! Interning builder for [`Profiles`]: every dictionary entry is stored once.

use super::{any_value, pb, AnyValue, PackedSamples, Profiles, Resource};
use rustc_hash::FxHashMap;
use std::hash::Hash;

/// An attribute value to intern, borrowed so a hit allocates nothing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AttrValue<'a> {
    Str(&'a str),
    Int(i64),
    Bool(bool),
    Double(f64),
    Bytes(&'a [u8]),
}

impl AttrValue<'_> {
    pub fn to_any(self) -> AnyValue {
        let v = match self {
            AttrValue::Str(s) => any_value::Value::StringValue(s.to_owned()),
            AttrValue::Int(i) => any_value::Value::IntValue(i),
            AttrValue::Bool(b) => any_value::Value::BoolValue(b),
            AttrValue::Double(d) => any_value::Value::DoubleValue(d),
            AttrValue::Bytes(b) => any_value::Value::BytesValue(b.to_vec()),
        };
        AnyValue { value: Some(v) }
    }
}

/// Where a profile sits in the batch: resource, scope and profile index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileRef {
    pub resource: usize,
    pub scope: usize,
    pub profile: usize,
}

/// What describes one profile: its sample and period types and time range.
#[derive(Clone, Debug, Default)]
pub struct ProfileMeta<'a> {
    /// (type, unit), e.g. ("samples", "count").
    pub sample_type: (&'a str, &'a str),
    /// (type, unit), e.g. ("cpu", "nanoseconds").
    pub period_type: (&'a str, &'a str),
    pub period: i64,
    pub time_unix_nano: u64,
    pub duration_nano: u64,
}

impl ProfileMeta<'static> {
    /// A CPU profile as the eBPF receiver writes one: `samples/count`, each
    /// sample standing for `period` nanoseconds of CPU time.
    pub const fn cpu(period: i64, time_unix_nano: u64, duration_nano: u64) -> Self {
        ProfileMeta {
            sample_type: ("samples", "count"),
            period_type: ("cpu", "nanoseconds"),
            period,
            time_unix_nano,
            duration_nano,
        }
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
enum ValKey {
    Empty,
    Str(u32),
    Int(i64),
    Bool(bool),
    Double(u64),
    /// Anything else (bytes, arrays, maps): its protobuf encoding.
    Encoded(Box<[u8]>),
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct AttrKey {
    key: i32,
    unit: i32,
    value: ValKey,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct MappingKey {
    start: u64,
    limit: u64,
    offset: u64,
    filename: i32,
    attrs: Box<[i32]>,
}

/// Entries of a table found by the hash of their content: the table itself is
/// the key store, so a lookup hashes the borrowed value and compares against
/// the table, allocating nothing, and the index holds no copy of a key.
#[derive(Default)]
pub struct HashIndex {
    first: FxHashMap<u64, i32>,
    /// Further entries whose hash collides with `first`'s (rare).
    more: FxHashMap<u64, Vec<i32>>,
}

impl HashIndex {
    /// The entry of hash `h` that `eq` accepts.
    pub fn find(&self, h: u64, eq: impl Fn(i32) -> bool) -> Option<i32> {
        let &f = self.first.get(&h)?;
        if eq(f) {
            return Some(f);
        }
        self.more.get(&h)?.iter().copied().find(|&i| eq(i))
    }

    /// Indexes entry `i` under hash `h`.
    pub fn insert(&mut self, h: u64, i: i32) {
        match self.first.entry(h) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(i);
            }
            std::collections::hash_map::Entry::Occupied(_) => self.more.entry(h).or_default().push(i),
        }
    }

    /// Room for `n` more entries.
    pub fn reserve(&mut self, n: usize) {
        self.first.reserve(n);
    }
}

/// The [`HashIndex`] hash of a string.
pub fn hash_str(s: &str) -> u64 {
    use std::hash::Hasher;
    let mut h = rustc_hash::FxHasher::default();
    h.write(s.as_bytes());
    h.write_usize(s.len());
    h.finish()
}

fn hash_location(l: &pb::Location) -> u64 {
    use std::hash::Hasher;
    let mut h = rustc_hash::FxHasher::default();
    h.write_i32(l.mapping_index);
    h.write_u64(l.address);
    for ln in &l.lines {
        h.write_i32(ln.function_index);
        h.write_i64(ln.line);
        h.write_i64(ln.column);
    }
    h.write_usize(l.lines.len());
    for &a in &l.attribute_indices {
        h.write_i32(a);
    }
    h.finish()
}

fn hash_stack(locations: &[i32]) -> u64 {
    use std::hash::Hasher;
    let mut h = rustc_hash::FxHasher::default();
    for &l in locations {
        h.write_i32(l);
    }
    h.write_usize(locations.len());
    h.finish()
}

/// Builds a [`Profiles`] batch, interning strings, attributes, mappings,
/// functions, locations, stacks and links. Entry 0 of every table is the
/// zero value; string 0 is "".
pub struct ProfilesBuilder {
    dict: pb::ProfilesDictionary,
    resources: Vec<pb::ResourceProfiles>,
    /// Packed samples (`model/packed.rs`), one entry per profile of
    /// `resources` in walk order, when the batches merged came packed
    /// (`batch` merging what the otlp receiver decoded); empty otherwise.
    /// Unpacked before a profile is added or handed out.
    packed: Vec<PackedSamples>,
    /// The string table's entries by content (the table holds the strings).
    strings: HashIndex,
    value_strings: FxHashMap<String, u32>,
    attrs: FxHashMap<AttrKey, i32>,
    mappings: FxHashMap<MappingKey, i32>,
    functions: FxHashMap<(i32, i32, i32, i64), i32>,
    locations: HashIndex,
    /// Stacks by the hash of their location indices (the table holds the keys).
    stacks: HashIndex,
    /// Locations and stacks are indexed on first use: a processor that only
    /// adds names and rewrites locations in place (kernel_symbols) never
    /// pays for hashing the batch's thousands of them.
    locations_indexed: bool,
    stacks_indexed: bool,
    links: FxHashMap<(Vec<u8>, Vec<u8>), i32>,
}

impl Default for ProfilesBuilder {
    fn default() -> Self {
        Self::new()
    }
}

fn idx(len: usize) -> i32 {
    // Tables are indexed by i32 on the wire; a batch never comes near 2^31 entries
    // because receivers cut batches long before.
    i32::try_from(len).unwrap_or(i32::MAX)
}

fn intern<K: Hash + Eq, T>(map: &mut FxHashMap<K, i32>, table: &mut Vec<T>, key: K, make: impl FnOnce() -> T) -> i32 {
    *map.entry(key).or_insert_with(|| {
        table.push(make());
        idx(table.len() - 1)
    })
}

impl ProfilesBuilder {
    pub fn new() -> Self {
        let mut b = Self::empty();
        b.index_zero_entries();
        b.reindex();
        b
    }

    fn empty() -> Self {
        ProfilesBuilder {
            dict: pb::ProfilesDictionary::default(),
            resources: Vec::new(),
            packed: Vec::new(),
            strings: HashIndex::default(),
            value_strings: FxHashMap::default(),
            attrs: FxHashMap::default(),
            mappings: FxHashMap::default(),
            functions: FxHashMap::default(),
            locations: HashIndex::default(),
            stacks: HashIndex::default(),
            locations_indexed: false,
            stacks_indexed: false,
            links: FxHashMap::default(),
        }
    }

    /// Zero entries: string "" and the default value of every other table.
    fn index_zero_entries(&mut self) {
        let d = &mut self.dict;
        if d.string_table.is_empty() {
            d.string_table.push(String::new());
        }
        macro_rules! zero {
            ($t:ident) => {
                if d.$t.is_empty() {
                    d.$t.push(Default::default());
                }
            };
        }
        zero!(mapping_table);
        zero!(location_table);
        zero!(function_table);
        zero!(link_table);
        zero!(attribute_table);
        zero!(stack_table);
    }

    /// Starts from an existing batch, indexing its dictionary so new entries
    /// are interned against it (used to merge into it).
    pub fn from_profiles(p: Profiles) -> Self {
        let Profiles(pb::ProfilesData { resource_profiles, dictionary }, packed) = p;
        let Some(d) = dictionary else {
            let mut b = ProfilesBuilder::new();
            b.resources = resource_profiles;
            b.packed = packed;
            return b;
        };
        let mut b = ProfilesBuilder::empty();
        b.dict = d;
        b.index_zero_entries();
        b.reindex();
        b.resources = resource_profiles;
        b.packed = packed;
        b
    }

    fn reindex(&mut self) {
        let table = &self.dict.string_table;
        for (i, s) in table.iter().enumerate() {
            let h = hash_str(s);
            // The first of equal strings keeps the index.
            if self.strings.find(h, |j| table[j as usize] == *s).is_none() {
                self.strings.insert(h, idx(i));
            }
        }
        for i in 0..self.dict.attribute_table.len() {
            let kv = &self.dict.attribute_table[i];
            let (key, unit, value) = (kv.key_strindex, kv.unit_strindex, kv.value.clone());
            let k = self.attr_key(key, unit, value.as_ref());
            self.attrs.entry(k).or_insert(idx(i));
        }
        for (i, m) in self.dict.mapping_table.iter().enumerate() {
            self.mappings.entry(mapping_key(m)).or_insert(idx(i));
        }
        for (i, f) in self.dict.function_table.iter().enumerate() {
            self.functions.entry(function_key(f)).or_insert(idx(i));
        }
        for (i, l) in self.dict.link_table.iter().enumerate() {
            self.links.entry((l.trace_id.clone(), l.span_id.clone())).or_insert(idx(i));
        }
    }

    fn index_locations(&mut self) {
        if self.locations_indexed {
            return;
        }
        self.locations = HashIndex::default();
        for (i, l) in self.dict.location_table.iter().enumerate() {
            let h = hash_location(l);
            if self.locations.find(h, |j| self.dict.location_table[j as usize] == *l).is_none() {
                self.locations.insert(h, idx(i));
            }
        }
        self.locations_indexed = true;
    }

    fn index_stacks(&mut self) {
        if self.stacks_indexed {
            return;
        }
        self.stacks = HashIndex::default();
        for (i, s) in self.dict.stack_table.iter().enumerate() {
            let h = hash_stack(&s.location_indices);
            let table = &self.dict.stack_table;
            if self.stacks.find(h, |j| table[j as usize].location_indices == s.location_indices).is_none() {
                self.stacks.insert(h, idx(i));
            }
        }
        self.stacks_indexed = true;
    }

    /// The dictionary built so far (read-only: use the interning methods to add).
    pub fn dictionary(&self) -> &pb::ProfilesDictionary {
        &self.dict
    }

    pub fn string(&mut self, s: &str) -> i32 {
        let h = hash_str(s);
        let table = &self.dict.string_table;
        if let Some(i) = self.strings.find(h, |i| table.get(i as usize).is_some_and(|t| t == s)) {
            return i;
        }
        let i = idx(table.len());
        self.dict.string_table.push(s.to_owned());
        self.strings.insert(h, i);
        i
    }

    fn value_string(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.value_strings.get(s) {
            return i;
        }
        let i = self.value_strings.len() as u32;
        self.value_strings.insert(s.to_owned(), i);
        i
    }

    fn attr_key(&mut self, key: i32, unit: i32, value: Option<&AnyValue>) -> AttrKey {
        use any_value::Value as V;
        let value = match value.and_then(|v| v.value.as_ref()) {
            None => ValKey::Empty,
            Some(V::StringValue(s)) => ValKey::Str(self.value_string(s)),
            Some(V::IntValue(i)) => ValKey::Int(*i),
            Some(V::BoolValue(b)) => ValKey::Bool(*b),
            Some(V::DoubleValue(d)) => ValKey::Double(d.to_bits()),
            Some(other) => ValKey::Encoded(
                prost::Message::encode_to_vec(&AnyValue { value: Some(other.clone()) }).into_boxed_slice(),
            ),
        };
        AttrKey { key, unit, value }
    }

    /// Interns attribute `key=value` (no unit).
    pub fn attribute(&mut self, key: &str, value: AttrValue<'_>) -> i32 {
        let key = self.string(key);
        let vk = match value {
            AttrValue::Str(s) => ValKey::Str(self.value_string(s)),
            AttrValue::Int(i) => ValKey::Int(i),
            AttrValue::Bool(b) => ValKey::Bool(b),
            AttrValue::Double(d) => ValKey::Double(d.to_bits()),
            AttrValue::Bytes(_) => ValKey::Encoded(prost::Message::encode_to_vec(&value.to_any()).into_boxed_slice()),
        };
        let k = AttrKey { key, unit: 0, value: vk };
        intern(&mut self.attrs, &mut self.dict.attribute_table, k, || pb::KeyValueAndUnit {
            key_strindex: key,
            value: Some(value.to_any()),
            unit_strindex: 0,
        })
    }

    /// Interns an attribute whose key and unit are already string indices of this builder.
    pub(crate) fn attribute_raw(&mut self, key: i32, value: Option<AnyValue>, unit: i32) -> i32 {
        let k = self.attr_key(key, unit, value.as_ref());
        intern(&mut self.attrs, &mut self.dict.attribute_table, k, || pb::KeyValueAndUnit {
            key_strindex: key,
            value,
            unit_strindex: unit,
        })
    }

    /// Interns a mapping whose indices refer to this builder's tables.
    pub fn mapping(&mut self, m: pb::Mapping) -> i32 {
        intern(&mut self.mappings, &mut self.dict.mapping_table, mapping_key(&m), || m)
    }

    pub fn function(&mut self, name: &str, system_name: &str, filename: &str, start_line: i64) -> i32 {
        let f = pb::Function {
            name_strindex: self.string(name),
            system_name_strindex: self.string(system_name),
            filename_strindex: self.string(filename),
            start_line,
        };
        self.function_raw(f)
    }

    pub(crate) fn function_raw(&mut self, f: pb::Function) -> i32 {
        intern(&mut self.functions, &mut self.dict.function_table, function_key(&f), || f)
    }

    /// Interns a location whose indices refer to this builder's tables.
    pub fn location(&mut self, l: pb::Location) -> i32 {
        self.index_locations();
        let h = hash_location(&l);
        let table = &self.dict.location_table;
        if let Some(i) = self.locations.find(h, |j| table[j as usize] == l) {
            return i;
        }
        let i = idx(table.len());
        self.dict.location_table.push(l);
        self.locations.insert(h, i);
        i
    }

    /// Room for `locations` more locations and `stacks` more stacks, so a
    /// batch whose size is known is not rehashed step by step as it grows.
    pub fn reserve(&mut self, locations: usize, stacks: usize) {
        self.dict.location_table.reserve(locations);
        self.dict.stack_table.reserve(stacks);
        self.index_stacks();
        self.stacks.first.reserve(stacks);
    }

    /// Replaces location `i` in place (its indices refer to this builder's
    /// tables): every stack holding it now holds the new one. Two locations
    /// may end up equal; both stay (valid, if not minimal).
    pub fn set_location(&mut self, i: i32, l: pb::Location) {
        if let Some(slot) = usize::try_from(i).ok().and_then(|i| self.dict.location_table.get_mut(i)) {
            *slot = l;
            self.locations_indexed = false;
        }
    }

    /// Appends location `l` without interning it (the caller knows it is
    /// new) and returns its index.
    pub fn push_location(&mut self, l: pb::Location) -> i32 {
        self.dict.location_table.push(l);
        self.locations_indexed = false;
        idx(self.dict.location_table.len() - 1)
    }

    /// Replaces stack `i`'s locations in place: every sample of it now has
    /// these frames. The caller keeps stacks distinct.
    pub fn set_stack(&mut self, i: i32, locations: Vec<i32>) {
        if let Some(slot) = usize::try_from(i).ok().and_then(|i| self.dict.stack_table.get_mut(i)) {
            slot.location_indices = locations;
            self.stacks_indexed = false;
        }
    }

    /// Interns a location with one line in `function` and nothing else (no
    /// mapping, no address): a frame known only by its function.
    pub fn line_location(&mut self, function: i32, line: i64) -> i32 {
        self.location(pb::Location {
            lines: vec![pb::Line { function_index: function, line, column: 0 }],
            ..Default::default()
        })
    }

    /// Interns a stack (location indices, leaf first).
    pub fn stack(&mut self, locations: &[i32]) -> i32 {
        self.index_stacks();
        let h = hash_stack(locations);
        let table = &self.dict.stack_table;
        if let Some(i) = self.stacks.find(h, |j| table[j as usize].location_indices == locations) {
            return i;
        }
        let i = idx(table.len());
        self.dict.stack_table.push(pb::Stack { location_indices: locations.to_vec() });
        self.stacks.insert(h, i);
        i
    }

    pub fn link(&mut self, trace_id: &[u8], span_id: &[u8]) -> i32 {
        let key = (trace_id.to_vec(), span_id.to_vec());
        intern(&mut self.links, &mut self.dict.link_table, key, || pb::Link {
            trace_id: trace_id.to_vec(),
            span_id: span_id.to_vec(),
        })
    }

    /// Adds a resource with one (empty) scope; returns its index.
    pub fn resource(&mut self, resource: Resource) -> usize {
        self.resources.push(pb::ResourceProfiles {
            resource: Some(resource),
            scope_profiles: vec![pb::ScopeProfiles::default()],
            schema_url: String::new(),
        });
        self.resources.len() - 1
    }

    /// Sets the instrumentation scope of `resource`'s first scope.
    pub fn set_scope(&mut self, resource: usize, scope: super::InstrumentationScope) {
        let rp = &mut self.resources[resource];
        if rp.scope_profiles.is_empty() {
            rp.scope_profiles.push(pb::ScopeProfiles::default());
        }
        rp.scope_profiles[0].scope = Some(scope);
    }

    /// Adds a profile under `resource`'s first scope.
    pub fn profile(&mut self, resource: usize, meta: &ProfileMeta<'_>) -> ProfileRef {
        self.unpack();
        let sample_type = Some(pb::ValueType {
            type_strindex: self.string(meta.sample_type.0),
            unit_strindex: self.string(meta.sample_type.1),
        });
        let period_type = Some(pb::ValueType {
            type_strindex: self.string(meta.period_type.0),
            unit_strindex: self.string(meta.period_type.1),
        });
        let rp = &mut self.resources[resource];
        if rp.scope_profiles.is_empty() {
            rp.scope_profiles.push(pb::ScopeProfiles::default());
        }
        let scope = &mut rp.scope_profiles[0];
        scope.profiles.push(pb::Profile {
            sample_type,
            period_type,
            period: meta.period,
            time_unix_nano: meta.time_unix_nano,
            duration_nano: meta.duration_nano,
            ..Default::default()
        });
        ProfileRef { resource, scope: 0, profile: scope.profiles.len() - 1 }
    }

    /// The resources added so far (or taken over by [`Self::from_profiles`]),
    /// samples in their profiles.
    pub fn resources(&mut self) -> &[pb::ResourceProfiles] {
        self.unpack();
        &self.resources
    }

    /// Mutable access to a profile added with [`Self::profile`].
    pub fn profile_mut(&mut self, r: ProfileRef) -> &mut pb::Profile {
        self.unpack();
        &mut self.resources[r.resource].scope_profiles[r.scope].profiles[r.profile]
    }

    /// Puts packed samples back into their profiles.
    fn unpack(&mut self) {
        if self.packed.is_empty() {
            return;
        }
        let mut held = Profiles(
            pb::ProfilesData { resource_profiles: std::mem::take(&mut self.resources), dictionary: None },
            std::mem::take(&mut self.packed),
        );
        held.unpack();
        self.resources = held.0.resource_profiles;
    }

    /// Appends a sample (its indices refer to this builder's tables).
    pub fn sample(&mut self, r: ProfileRef, sample: pb::Sample) {
        self.profile_mut(r).samples.push(sample);
    }

    /// Appends every profile of `other`, remapping its dictionary into ours.
    ///
    /// Packed samples stay packed (remapped one by one) while every batch
    /// merged so far came packed; else they are unpacked.
    pub fn append(&mut self, other: Profiles) {
        let keep_packed = other.is_packed() && (self.packed.len() == self.profile_count());
        let Profiles(pb::ProfilesData { resource_profiles, dictionary }, packed) = match keep_packed {
            true => other,
            false => {
                self.unpack();
                other.into_unpacked()
            }
        };
        let src = dictionary.unwrap_or_default();
        let remap = self.remap_dictionary(&src);
        self.packed.extend(packed.iter().map(|samples| remap.packed(samples)));
        for mut rp in resource_profiles {
            if let Some(r) = &mut rp.resource {
                remap.attributes(&mut r.attributes);
            }
            for sp in &mut rp.scope_profiles {
                if let Some(sc) = &mut sp.scope {
                    remap.attributes(&mut sc.attributes);
                }
                for p in &mut sp.profiles {
                    remap.profile(p);
                }
            }
            self.resources.push(rp);
        }
    }

    /// Interns every entry of `src` and returns old index → new index tables.
    fn remap_dictionary(&mut self, src: &pb::ProfilesDictionary) -> Remap {
        let strings: Vec<i32> = src.string_table.iter().map(|s| self.string(s)).collect();
        let s = |i: i32| lookup(&strings, i);
        let attrs: Vec<i32> = src
            .attribute_table
            .iter()
            .map(|kv| {
                let mut value = kv.value.clone();
                if let Some(v) = &mut value {
                    super::strindex::any_mut(v, &mut |i| *i = s(*i));
                }
                self.attribute_raw(s(kv.key_strindex), value, s(kv.unit_strindex))
            })
            .collect();
        let a = |v: &[i32]| v.iter().map(|&i| lookup(&attrs, i)).collect::<Vec<i32>>();
        let mappings: Vec<i32> = src
            .mapping_table
            .iter()
            .map(|m| {
                self.mapping(pb::Mapping {
                    memory_start: m.memory_start,
                    memory_limit: m.memory_limit,
                    file_offset: m.file_offset,
                    filename_strindex: s(m.filename_strindex),
                    attribute_indices: a(&m.attribute_indices),
                })
            })
            .collect();
        let functions: Vec<i32> = src
            .function_table
            .iter()
            .map(|f| {
                self.function_raw(pb::Function {
                    name_strindex: s(f.name_strindex),
                    system_name_strindex: s(f.system_name_strindex),
                    filename_strindex: s(f.filename_strindex),
                    start_line: f.start_line,
                })
            })
            .collect();
        let locations: Vec<i32> = src
            .location_table
            .iter()
            .map(|l| {
                self.location(pb::Location {
                    mapping_index: lookup(&mappings, l.mapping_index),
                    address: l.address,
                    lines: l
                        .lines
                        .iter()
                        .map(|ln| pb::Line {
                            function_index: lookup(&functions, ln.function_index),
                            line: ln.line,
                            column: ln.column,
                        })
                        .collect(),
                    attribute_indices: a(&l.attribute_indices),
                })
            })
            .collect();
        let mut buf = Vec::new();
        let stacks: Vec<i32> = src
            .stack_table
            .iter()
            .map(|st| {
                buf.clear();
                buf.extend(st.location_indices.iter().map(|&i| lookup(&locations, i)));
                self.stack(&buf)
            })
            .collect();
        let links: Vec<i32> = src.link_table.iter().map(|l| self.link(&l.trace_id, &l.span_id)).collect();
        Remap { strings, attrs, stacks, links }
    }

    /// Finishes the batch.
    pub fn build(self) -> Profiles {
        Profiles(pb::ProfilesData { resource_profiles: self.resources, dictionary: Some(self.dict) }, self.packed)
    }

    fn profile_count(&self) -> usize {
        self.resources.iter().flat_map(|r| &r.scope_profiles).map(|s| s.profiles.len()).sum()
    }

    /// Number of Sample messages added so far (not observations: see
    /// `Profiles::sample_count`).
    pub fn sample_messages(&self) -> usize {
        self.resources
            .iter()
            .flat_map(|r| &r.scope_profiles)
            .map(|s| s.profiles.iter().map(|p| p.samples.len()).sum::<usize>())
            .sum::<usize>()
            + self.packed.iter().map(PackedSamples::len).sum::<usize>()
    }
}

/// Old → new index tables for one appended dictionary.
struct Remap {
    strings: Vec<i32>,
    attrs: Vec<i32>,
    stacks: Vec<i32>,
    links: Vec<i32>,
}

impl Remap {
    /// Resource and scope attributes may name strings by index too.
    fn attributes(&self, kvs: &mut [super::KeyValue]) {
        super::strindex::kvs_mut(kvs, &mut |i| *i = lookup(&self.strings, *i));
    }

    fn profile(&self, p: &mut pb::Profile) {
        for vt in p.sample_type.iter_mut().chain(p.period_type.iter_mut()) {
            vt.type_strindex = lookup(&self.strings, vt.type_strindex);
            vt.unit_strindex = lookup(&self.strings, vt.unit_strindex);
        }
        remap_all(&mut p.attribute_indices, &self.attrs);
        p.samples.iter_mut().for_each(|s| self.sample(s));
    }

    fn sample(&self, s: &mut pb::Sample) {
        s.stack_index = lookup(&self.stacks, s.stack_index);
        s.link_index = lookup(&self.links, s.link_index);
        remap_all(&mut s.attribute_indices, &self.attrs);
    }

    fn packed(&self, samples: &PackedSamples) -> PackedSamples {
        samples.map(|s| self.sample(s))
    }
}

fn remap_all(v: &mut [i32], table: &[i32]) {
    for i in v {
        *i = lookup(table, *i);
    }
}

/// New index of old index `i`; out-of-range indices map to the zero entry
/// (inputs from outside are validated before they reach a builder).
fn lookup(table: &[i32], i: i32) -> i32 {
    usize::try_from(i).ok().and_then(|i| table.get(i)).copied().unwrap_or(0)
}

fn mapping_key(m: &pb::Mapping) -> MappingKey {
    MappingKey {
        start: m.memory_start,
        limit: m.memory_limit,
        offset: m.file_offset,
        filename: m.filename_strindex,
        attrs: m.attribute_indices.clone().into_boxed_slice(),
    }
}

fn function_key(f: &pb::Function) -> (i32, i32, i32, i64) {
    (f.name_strindex, f.system_name_strindex, f.filename_strindex, f.start_line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_entries_and_interning() {
        let mut b = ProfilesBuilder::new();
        assert_eq!(b.string(""), 0);
        let a = b.string("a");
        assert_eq!(b.string("a"), a);
        let t1 = b.attribute("thread.id", AttrValue::Int(7));
        assert_eq!(b.attribute("thread.id", AttrValue::Int(7)), t1);
        assert_ne!(b.attribute("thread.id", AttrValue::Int(8)), t1);
        let s1 = b.stack(&[1, 2]);
        assert_eq!(b.stack(&[1, 2]), s1);
        assert_ne!(s1, 0);
        let p = b.build();
        let d = p.dictionary().unwrap();
        assert_eq!(d.string_table[0], "");
        assert_eq!(d.stack_table[0], pb::Stack::default());
        assert_eq!(d.mapping_table[0], pb::Mapping::default());
    }

    /// A batch whose attributes name strings by index (values, nested values,
    /// keys of resource and scope attributes).
    fn by_index(words: &[&str]) -> Profiles {
        use super::super::{any_value::Value, KeyValue};
        use opentelemetry_proto::tonic::common::v1::ArrayValue;
        let mut b = ProfilesBuilder::new();
        let ix: Vec<i32> = words.iter().map(|w| b.string(w)).collect();
        let sv = |i: i32| AnyValue { value: Some(Value::StringValueStrindex(i)) };
        let nested = AnyValue { value: Some(Value::ArrayValue(ArrayValue { values: vec![sv(ix[2])] })) };
        let a1 = b.attribute_raw(ix[0], Some(sv(ix[1])), 0);
        let a2 = b.attribute_raw(ix[0], Some(nested), 0);
        let kv = |k: i32, v: i32| KeyValue { key: String::new(), value: Some(sv(v)), key_strindex: k };
        let r = b.resource(Resource { attributes: vec![kv(ix[3], ix[4])], ..Default::default() });
        let p = b.profile(r, &ProfileMeta { sample_type: ("samples", "count"), ..Default::default() });
        let l = b.location(pb::Location { address: 1, ..Default::default() });
        let st = b.stack(&[l]);
        b.sample(
            p,
            pb::Sample { stack_index: st, values: vec![1], attribute_indices: vec![a1, a2], ..Default::default() },
        );
        let mut out = b.build();
        out.0.resource_profiles[0].scope_profiles[0].scope =
            Some(super::super::InstrumentationScope { attributes: vec![kv(ix[5], ix[1])], ..Default::default() });
        out
    }

    #[test]
    fn append_remaps_string_indices_inside_attribute_values_and_keys() {
        let words = ["key", "value", "nested", "res.key", "res.value", "scope.key"];
        let mut merged = by_index(&["other", "strings", "first", "x", "y", "z"]);
        // The appended batch's string indices all move.
        merged.merge(by_index(&words));
        assert!(merged.validate().is_ok());
        let d = merged.dictionary().unwrap();
        let t = &d.string_table;
        let text = |v: &AnyValue| match &v.value {
            Some(any_value::Value::StringValueStrindex(i)) => t[*i as usize].clone(),
            Some(any_value::Value::ArrayValue(a)) => format!(
                "[{}]",
                t[match a.values[0].value {
                    Some(any_value::Value::StringValueStrindex(i)) => i as usize,
                    _ => 0,
                }]
            ),
            other => panic!("{other:?}"),
        };
        let rp = &merged.0.resource_profiles[1];
        let sample = &rp.scope_profiles[0].profiles[0].samples[0];
        let attrs: Vec<String> = sample
            .attribute_indices
            .iter()
            .map(|&a| {
                let kv = &d.attribute_table[a as usize];
                format!("{}={}", t[kv.key_strindex as usize], text(kv.value.as_ref().unwrap()))
            })
            .collect();
        assert_eq!(attrs, ["key=value", "key=[nested]"]);
        let res = &rp.resource.as_ref().unwrap().attributes[0];
        assert_eq!(
            (t[res.key_strindex as usize].as_str(), text(res.value.as_ref().unwrap())),
            ("res.key", "res.value".into())
        );
        let sc = &rp.scope_profiles[0].scope.as_ref().unwrap().attributes[0];
        assert_eq!(
            (t[sc.key_strindex as usize].as_str(), text(sc.value.as_ref().unwrap())),
            ("scope.key", "value".into())
        );
    }
}
