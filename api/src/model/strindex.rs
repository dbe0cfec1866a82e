//! String-table indices hidden in attribute values: an `AnyValue` may name
//! its string by index (`string_value_strindex`, nested in arrays and
//! kvlists too) and a `KeyValue` its key (`key_strindex`). Every rewrite of
//! the string table (merge, compaction) must reach these as well.

use super::any_value::Value;
use super::{AnyValue, KeyValue};

/// Calls `f` on every string index inside `v`.
pub(super) fn any_mut(v: &mut AnyValue, f: &mut impl FnMut(&mut i32)) {
    match &mut v.value {
        Some(Value::StringValueStrindex(i)) => f(i),
        Some(Value::ArrayValue(a)) => a.values.iter_mut().for_each(|v| any_mut(v, f)),
        Some(Value::KvlistValue(l)) => kvs_mut(&mut l.values, f),
        _ => {}
    }
}

/// Calls `f` on every string index inside `kvs`: keys and values.
pub(super) fn kvs_mut(kvs: &mut [KeyValue], f: &mut impl FnMut(&mut i32)) {
    for kv in kvs {
        f(&mut kv.key_strindex);
        if let Some(v) = &mut kv.value {
            any_mut(v, f);
        }
    }
}
