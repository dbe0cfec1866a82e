//! A dictionary-independent form of every sample, for comparing batches:
//! two batches hold the same samples when their sorted canonical forms are equal,
//! however their dictionaries are laid out.

use super::{AnyValue, KeyValue, Profiles};

/// One frame: mapping filename, address, (function, file, line) per line, location attributes.
pub type CanonicalFrame = (String, u64, Vec<(String, String, i64)>, Vec<(String, String)>);

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

fn show(v: Option<&AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        None => String::new(),
        Some(v) => format!("{v:?}"),
    }
}

fn kvs(attrs: &[KeyValue]) -> Vec<(String, String)> {
    let mut v: Vec<_> = attrs.iter().map(|kv| (kv.key.clone(), show(kv.value.as_ref()))).collect();
    v.sort();
    v
}

/// The sorted multiset of canonical samples of `p`.
pub fn samples(p: &Profiles) -> Vec<CanonicalSample> {
    let mut out: Vec<CanonicalSample> = p
        .samples()
        .map(|s| {
            let mut attributes: Vec<_> = s.attributes().map(|(k, v)| (k.to_owned(), show(v))).collect();
            attributes.sort();
            let (t, u) = s.sample_type();
            CanonicalSample {
                resource: s.resource.map(|r| kvs(&r.attributes)).unwrap_or_default(),
                sample_type: (t.to_owned(), u.to_owned()),
                frames: s
                    .frames()
                    .map(|f| {
                        let mut la: Vec<_> = f
                            .location
                            .attribute_indices
                            .iter()
                            .filter_map(|&i| s.dict.attribute_table.get(i as usize))
                            .map(|kv| (s.str(kv.key_strindex).to_owned(), show(kv.value.as_ref())))
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
