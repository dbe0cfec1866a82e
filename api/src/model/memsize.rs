//! How many bytes a batch occupies in memory as a queue holds it: the
//! `ProfilesData` value itself plus every heap block it owns, each counted at
//! its capacity (what was asked of the allocator), not at its length and not
//! at its encoded (wire) size, plus the allocator's cost per block as glibc
//! malloc has it on 64-bit (an 8-byte header, rounded up to 16, at least 32):
//! a batch is mostly small vectors (three per sample), where that cost is
//! as large as the data. docs/PERFORMANCE.md compares the estimate with RSS.
//!
//! One walk over the batch: proportional to its tables and samples, no
//! allocation.

use super::pb;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, EntityRef, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use std::mem::size_of;

/// Heap bytes a value owns (not counting its own inline size).
trait Heap {
    fn heap(&self) -> usize;
}

/// What the allocator takes for a request of `bytes` (glibc malloc, 64-bit).
pub(crate) fn block(bytes: usize) -> usize {
    if bytes == 0 {
        return 0;
    }
    (bytes.saturating_add(8 + 15) & !15).max(32)
}

/// A vector's block (capacity × element size) plus what its elements own.
fn vec_of<T: Heap>(v: &[T], capacity: usize) -> usize {
    block(capacity * size_of::<T>()) + v.iter().map(Heap::heap).sum::<usize>()
}

/// A vector of plain values: only its block.
fn flat<T>(v: &Vec<T>) -> usize {
    block(v.capacity() * size_of::<T>())
}

macro_rules! heap_vec {
    ($v:expr) => {
        vec_of(&$v, $v.capacity())
    };
}

impl Heap for String {
    fn heap(&self) -> usize {
        block(self.capacity())
    }
}

impl<T: Heap> Heap for Option<T> {
    fn heap(&self) -> usize {
        self.as_ref().map_or(0, Heap::heap)
    }
}

impl Heap for AnyValue {
    fn heap(&self) -> usize {
        match &self.value {
            Some(Value::StringValue(s)) => s.heap(),
            Some(Value::BytesValue(b)) => flat(b),
            Some(Value::ArrayValue(a)) => heap_vec!(a.values),
            Some(Value::KvlistValue(l)) => heap_vec!(l.values),
            _ => 0,
        }
    }
}

impl Heap for KeyValue {
    fn heap(&self) -> usize {
        self.key.heap() + self.value.heap()
    }
}

impl Heap for EntityRef {
    fn heap(&self) -> usize {
        self.schema_url.heap() + self.r#type.heap() + heap_vec!(self.id_keys) + heap_vec!(self.description_keys)
    }
}

impl Heap for Resource {
    fn heap(&self) -> usize {
        heap_vec!(self.attributes) + heap_vec!(self.entity_refs)
    }
}

impl Heap for InstrumentationScope {
    fn heap(&self) -> usize {
        self.name.heap() + self.version.heap() + heap_vec!(self.attributes)
    }
}

impl Heap for pb::Sample {
    fn heap(&self) -> usize {
        flat(&self.attribute_indices) + flat(&self.values) + flat(&self.timestamps_unix_nano)
    }
}

impl Heap for pb::Profile {
    fn heap(&self) -> usize {
        heap_vec!(self.samples)
            + flat(&self.profile_id)
            + self.original_payload_format.heap()
            + flat(&self.original_payload)
            + flat(&self.attribute_indices)
    }
}

impl Heap for pb::ScopeProfiles {
    fn heap(&self) -> usize {
        self.scope.heap() + heap_vec!(self.profiles) + self.schema_url.heap()
    }
}

impl Heap for pb::ResourceProfiles {
    fn heap(&self) -> usize {
        self.resource.heap() + heap_vec!(self.scope_profiles) + self.schema_url.heap()
    }
}

impl Heap for pb::Mapping {
    fn heap(&self) -> usize {
        flat(&self.attribute_indices)
    }
}

impl Heap for pb::Location {
    fn heap(&self) -> usize {
        flat(&self.lines) + flat(&self.attribute_indices)
    }
}

impl Heap for pb::Function {
    fn heap(&self) -> usize {
        0
    }
}

impl Heap for pb::Link {
    fn heap(&self) -> usize {
        flat(&self.trace_id) + flat(&self.span_id)
    }
}

impl Heap for pb::KeyValueAndUnit {
    fn heap(&self) -> usize {
        self.value.heap()
    }
}

impl Heap for pb::Stack {
    fn heap(&self) -> usize {
        flat(&self.location_indices)
    }
}

impl Heap for pb::ProfilesDictionary {
    fn heap(&self) -> usize {
        heap_vec!(self.mapping_table)
            + heap_vec!(self.location_table)
            + heap_vec!(self.function_table)
            + heap_vec!(self.link_table)
            + heap_vec!(self.string_table)
            + heap_vec!(self.attribute_table)
            + heap_vec!(self.stack_table)
    }
}

/// The bytes `data` occupies in memory: its inline size plus its heap blocks.
pub(super) fn memory_size(data: &pb::ProfilesData) -> usize {
    size_of::<pb::ProfilesData>() + heap_vec!(data.resource_profiles) + data.dictionary.heap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_capacity_not_length() {
        let mut d = pb::ProfilesData::default();
        let empty = memory_size(&d);
        assert_eq!(empty, size_of::<pb::ProfilesData>());
        let mut dict = pb::ProfilesDictionary { string_table: Vec::with_capacity(10), ..Default::default() };
        dict.string_table.push(String::with_capacity(100));
        d.dictionary = Some(dict);
        assert_eq!(memory_size(&d), empty + block(10 * size_of::<String>()) + block(100));
        assert_eq!((block(0), block(1), block(24), block(25), block(100)), (0, 32, 32, 48, 112));
    }
}
