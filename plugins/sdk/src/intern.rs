//! Adds entries to a batch's dictionary, each stored once. Entry 0 of every
//! table is the zero value (string 0 is ""), as the spec requires and the
//! host's validate checks. An interner over an existing dictionary indexes a
//! table only when the first entry is added to it, so an edit that adds only
//! stacks never hashes the string table.

use crate::pb::common::AnyValue;
use crate::pb::profiles as pb;
use crate::value::Value;
use prost::Message;
// Fx, not std's RandomState: that would ask the host for randomness per map.
use rustc_hash::FxHashMap as HashMap;

#[derive(Clone, PartialEq, Eq, Hash, Default)]
struct LocationKey {
    mapping: i32,
    address: u64,
    /// (function, line, column) per line.
    lines: Vec<(i32, i64, i64)>,
    attributes: Vec<i32>,
}

impl LocationKey {
    fn of(l: &pb::Location) -> Self {
        let mut k = LocationKey::default();
        k.set(l);
        k
    }

    fn set(&mut self, l: &pb::Location) {
        self.mapping = l.mapping_index;
        self.address = l.address;
        self.lines.clear();
        self.lines.extend(l.lines.iter().map(|ln| (ln.function_index, ln.line, ln.column)));
        self.attributes.clear();
        self.attributes.extend_from_slice(&l.attribute_indices);
    }
}

/// (key, unit, value's protobuf encoding).
type AttributeKey = (i32, i32, Vec<u8>);
/// (filename, memory start, limit, file offset, attributes).
type MappingKey = (i32, u64, u64, u64, Vec<i32>);

/// A dictionary being added to.
#[derive(Default)]
pub(crate) struct Interner {
    pub(crate) dict: pb::ProfilesDictionary,
    strings: Option<HashMap<String, i32>>,
    attributes: Option<HashMap<AttributeKey, i32>>,
    mappings: Option<HashMap<MappingKey, i32>>,
    functions: Option<HashMap<(i32, i32, i32, i64), i32>>,
    locations: Option<HashMap<LocationKey, i32>>,
    stacks: Option<HashMap<Vec<i32>, i32>>,
    /// Reused key buffers: a lookup that hits allocates nothing.
    scratch_location: LocationKey,
    scratch_value: Vec<u8>,
}

/// Index of `table`'s entries by key, made on first use; entry 0 is put in
/// place when the table is empty.
fn index<'m, T: Default, K: std::hash::Hash + Eq>(
    map: &'m mut Option<HashMap<K, i32>>,
    table: &mut Vec<T>,
    key: impl Fn(&T) -> K,
) -> &'m mut HashMap<K, i32> {
    map.get_or_insert_with(|| {
        if table.is_empty() {
            table.push(T::default());
        }
        let mut m = HashMap::with_capacity_and_hasher(table.len(), Default::default());
        for (i, e) in table.iter().enumerate().rev() {
            // The lowest index wins when a table holds an entry twice.
            m.insert(key(e), i as i32);
        }
        m
    })
}

impl Interner {
    pub(crate) fn new(dict: pb::ProfilesDictionary) -> Self {
        Interner { dict, ..Default::default() }
    }

    pub(crate) fn string(&mut self, s: &str) -> i32 {
        let table = &mut self.dict.string_table;
        let map = index(&mut self.strings, table, String::clone);
        if let Some(&i) = map.get(s) {
            return i;
        }
        let i = table.len() as i32;
        table.push(s.to_owned());
        map.insert(s.to_owned(), i);
        i
    }

    pub(crate) fn attribute(&mut self, key: &str, value: Value<'_>) -> i32 {
        let key_strindex = self.string(key);
        let any = value.to_any();
        self.scratch_value.clear();
        any.encode(&mut self.scratch_value).unwrap_or_default();
        let table = &mut self.dict.attribute_table;
        let map = index(&mut self.attributes, table, |kv: &pb::KeyValueAndUnit| {
            (kv.key_strindex, kv.unit_strindex, kv.value.as_ref().map(AnyValue::encode_to_vec).unwrap_or_default())
        });
        let k = (key_strindex, 0, std::mem::take(&mut self.scratch_value));
        if let Some(&i) = map.get(&k) {
            self.scratch_value = k.2;
            return i;
        }
        let i = table.len() as i32;
        table.push(pb::KeyValueAndUnit { key_strindex, value: Some(any), unit_strindex: 0 });
        map.insert(k, i);
        i
    }

    pub(crate) fn mapping(&mut self, m: pb::Mapping) -> i32 {
        let table = &mut self.dict.mapping_table;
        let key = |m: &pb::Mapping| {
            (m.filename_strindex, m.memory_start, m.memory_limit, m.file_offset, m.attribute_indices.clone())
        };
        let map = index(&mut self.mappings, table, key);
        let k = key(&m);
        if let Some(&i) = map.get(&k) {
            return i;
        }
        let i = table.len() as i32;
        table.push(m);
        map.insert(k, i);
        i
    }

    pub(crate) fn function(&mut self, name: &str, system_name: &str, file: &str, start_line: i64) -> i32 {
        let f = pb::Function {
            name_strindex: self.string(name),
            system_name_strindex: self.string(system_name),
            filename_strindex: self.string(file),
            start_line,
        };
        let table = &mut self.dict.function_table;
        let key = |f: &pb::Function| (f.name_strindex, f.system_name_strindex, f.filename_strindex, f.start_line);
        let map = index(&mut self.functions, table, key);
        let k = key(&f);
        if let Some(&i) = map.get(&k) {
            return i;
        }
        let i = table.len() as i32;
        table.push(f);
        map.insert(k, i);
        i
    }

    pub(crate) fn location(&mut self, l: pb::Location) -> i32 {
        let table = &mut self.dict.location_table;
        let map = index(&mut self.locations, table, LocationKey::of);
        self.scratch_location.set(&l);
        if let Some(&i) = map.get(&self.scratch_location) {
            return i;
        }
        let i = table.len() as i32;
        map.insert(self.scratch_location.clone(), i);
        table.push(l);
        i
    }

    /// The stack of `locations` (leaf first).
    pub(crate) fn stack(&mut self, locations: &[i32]) -> i32 {
        let table = &mut self.dict.stack_table;
        let map = index(&mut self.stacks, table, |s: &pb::Stack| s.location_indices.clone());
        if let Some(&i) = map.get(locations) {
            return i;
        }
        let i = table.len() as i32;
        table.push(pb::Stack { location_indices: locations.to_vec() });
        map.insert(locations.to_vec(), i);
        i
    }
}
