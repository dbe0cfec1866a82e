//! A dictionary-independent form of every sample, for comparing batches:
//! two batches hold the same samples when their sorted canonical forms are equal,
//! however their dictionaries are laid out.

use super::{str_at, AnyValue, KeyValue, Profiles};

/// One frame: mapping filename, address, (function, file, line) per line, location attributes.
pub(crate) type CanonicalFrame = (String, u64, Vec<(String, String, i64)>, Vec<(String, String)>);

/// Everything that makes a sample what it is, with every index resolved.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CanonicalSample {
    pub resource: Vec<(String, String)>,
    pub sample_type: (String, String),
    pub frames: Vec<CanonicalFrame>,
    pub values: Vec<i64>,
    pub timestamps: Vec<u64>,
    pub attributes: Vec<(String, String)>,
}

/// A value with every string index replaced by its string, so a value named
/// by index and the same value written out compare equal.
fn resolve(v: &AnyValue, t: &[String]) -> AnyValue {
    use super::any_value::Value;
    use opentelemetry_proto::tonic::common::v1::{ArrayValue, KeyValueList};
    let value = match &v.value {
        Some(Value::StringValueStrindex(i)) => Value::StringValue(str_at(t, *i).to_owned()),
        Some(Value::ArrayValue(a)) => {
            Value::ArrayValue(ArrayValue { values: a.values.iter().map(|v| resolve(v, t)).collect() })
        }
        Some(Value::KvlistValue(l)) => Value::KvlistValue(KeyValueList {
            values: l
                .values
                .iter()
                .map(|kv| KeyValue {
                    key: key(kv, t),
                    value: kv.value.as_ref().map(|v| resolve(v, t)),
                    key_strindex: 0,
                })
                .collect(),
        }),
        Some(other) => other.clone(),
        None => return AnyValue::default(),
    };
    AnyValue { value: Some(value) }
}

fn key(kv: &KeyValue, t: &[String]) -> String {
    if kv.key_strindex != 0 {
        str_at(t, kv.key_strindex).to_owned()
    } else {
        kv.key.clone()
    }
}

fn show(v: Option<&AnyValue>, t: &[String]) -> String {
    match v.map(|v| resolve(v, t)).and_then(|v| v.value) {
        None => String::new(),
        Some(v) => format!("{v:?}"),
    }
}

fn kvs(attrs: &[KeyValue], t: &[String]) -> Vec<(String, String)> {
    let mut v: Vec<_> = attrs.iter().map(|kv| (key(kv, t), show(kv.value.as_ref(), t))).collect();
    v.sort();
    v
}

/// The sorted multiset of canonical samples of `p`.
pub fn samples(p: &Profiles) -> Vec<CanonicalSample> {
    let mut out: Vec<CanonicalSample> = p
        .samples()
        .map(|s| {
            let strings = &s.dict.string_table;
            let mut attributes: Vec<_> = s.attributes().map(|(k, v)| (k.to_owned(), show(v, strings))).collect();
            attributes.sort();
            let (t, u) = s.sample_type();
            CanonicalSample {
                resource: s.resource.map(|r| kvs(&r.attributes, strings)).unwrap_or_default(),
                sample_type: (t.to_owned(), u.to_owned()),
                frames: s
                    .frames()
                    .map(|f| {
                        let mut la: Vec<_> = f
                            .location
                            .attribute_indices
                            .iter()
                            .filter_map(|&i| s.dict.attribute_table.get(i as usize))
                            .map(|kv| (s.str(kv.key_strindex).to_owned(), show(kv.value.as_ref(), strings)))
                            .collect();
                        la.sort();
                        (
                            f.mapping_filename().to_owned(),
                            f.location.address,
                            f.lines().map(|(n, file, l)| (n.to_owned(), file.to_owned(), l)).collect(),
                            la,
                        )
                    })
                    .collect(),
                values: s.sample.values.clone(),
                timestamps: s.sample.timestamps_unix_nano.clone(),
                attributes,
            }
        })
        .collect();
    out.sort();
    out
}
