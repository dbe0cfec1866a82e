//! Attribute values, read and written alike.

use crate::pb::common::{any_value, AnyValue};

/// An attribute value. Reading gives borrowed strings and bytes (string
/// table references already resolved); writing takes the same type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value<'a> {
    Str(&'a str),
    Int(i64),
    Bool(bool),
    Double(f64),
    Bytes(&'a [u8]),
    /// Lists and maps, as they are in the batch.
    Other(&'a AnyValue),
}

impl<'a> Value<'a> {
    /// Reads `v`, resolving a string-table reference through `strings`.
    pub(crate) fn read(v: &'a AnyValue, strings: &'a [String]) -> Option<Value<'a>> {
        Some(match v.value.as_ref()? {
            any_value::Value::StringValue(s) => Value::Str(s),
            any_value::Value::StringValueStrindex(i) => Value::Str(crate::view::str_at(strings, *i)),
            any_value::Value::IntValue(i) => Value::Int(*i),
            any_value::Value::BoolValue(b) => Value::Bool(*b),
            any_value::Value::DoubleValue(d) => Value::Double(*d),
            any_value::Value::BytesValue(b) => Value::Bytes(b),
            _ => Value::Other(v),
        })
    }

    /// The value as text when it is a string.
    pub fn as_str(&self) -> Option<&'a str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The protobuf value (strings inline, not by string-table reference).
    pub fn to_any(self) -> AnyValue {
        let v = match self {
            Value::Str(s) => any_value::Value::StringValue(s.to_owned()),
            Value::Int(i) => any_value::Value::IntValue(i),
            Value::Bool(b) => any_value::Value::BoolValue(b),
            Value::Double(d) => any_value::Value::DoubleValue(d),
            Value::Bytes(b) => any_value::Value::BytesValue(b.to_vec()),
            Value::Other(v) => return v.clone(),
        };
        AnyValue { value: Some(v) }
    }
}

impl<'a> From<&'a str> for Value<'a> {
    fn from(s: &'a str) -> Self {
        Value::Str(s)
    }
}

impl<'a> From<&'a String> for Value<'a> {
    fn from(s: &'a String) -> Self {
        Value::Str(s)
    }
}

impl From<i64> for Value<'_> {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}

impl From<bool> for Value<'_> {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<f64> for Value<'_> {
    fn from(d: f64) -> Self {
        Value::Double(d)
    }
}
