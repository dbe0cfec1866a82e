//! Reading a batch's dictionary by index, the same way on both sides: an
//! index out of range reads as absent (or ""), never panics.

use crate::pb;
use opentelemetry_proto::tonic::common::v1::AnyValue;

/// Entry `i` of `table`.
pub fn get<T>(table: &[T], i: i32) -> Option<&T> {
    usize::try_from(i).ok().and_then(|i| table.get(i))
}

/// String `i` of a string table ("" when out of range).
pub fn str_at(table: &[String], i: i32) -> &str {
    get(table, i).map(String::as_str).unwrap_or("")
}

/// The locations of stack `stack_index`, leaf first.
pub fn stack_locations(dict: &pb::ProfilesDictionary, stack_index: i32) -> impl Iterator<Item = &pb::Location> {
    get(&dict.stack_table, stack_index)
        .into_iter()
        .flat_map(|s| s.location_indices.iter())
        .filter_map(|&i| get(&dict.location_table, i))
}

/// The attributes at `indices` as (key, value).
pub fn attributes<'a>(
    dict: &'a pb::ProfilesDictionary,
    indices: &'a [i32],
) -> impl Iterator<Item = (&'a str, Option<&'a AnyValue>)> + 'a {
    indices
        .iter()
        .filter_map(|&i| get(&dict.attribute_table, i))
        .map(|kv| (str_at(&dict.string_table, kv.key_strindex), kv.value.as_ref()))
}
