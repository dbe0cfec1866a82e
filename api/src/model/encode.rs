//! Protobuf encoding of a batch with each profile's length computed once.
//!
//! prost writes a nested message's length before its bytes, and finds it by
//! walking the message (`encoded_len`) at every level it nests in: a Sample
//! under request → resource → scope → profile is measured five times before
//! it is written. Here each profile is measured once, the resource and scope
//! lengths are summed from those, and the levels above a profile are
//! written by hand: two walks over the samples instead of five. The bytes
//! are prost's, field for field (checked in the tests). A profile whose
//! samples are packed (`model/packed.rs`) has them copied in, where prost
//! writes them.

use super::packed::PackedSamples;
use super::pb;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, message, string, WireType};
use prost::Message;

/// Field numbers of `ProfilesData`, `ResourceProfiles` and `ScopeProfiles`.
const RESOURCE_PROFILES: u32 = 1;
const DICTIONARY: u32 = 2;
const RESOURCE: u32 = 1;
const SCOPE_PROFILES: u32 = 2;
const SCOPE: u32 = 1;
const PROFILES: u32 = 2;
const SCHEMA_URL: u32 = 3;
/// `Profile.sample_type`, the one field before its samples.
const SAMPLE_TYPE: u32 = 1;

/// A length-delimited field of `len` bytes, key and length prefix included.
fn delimited(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn schema_len(url: &str) -> usize {
    if url.is_empty() {
        0
    } else {
        delimited(SCHEMA_URL, url.len())
    }
}

/// Lengths of every profile, scope and resource, in walk order.
struct Lengths {
    profiles: Vec<usize>,
    scopes: Vec<usize>,
    resources: Vec<usize>,
}

/// `packed`: empty, or one entry per profile in walk order (whose own
/// `samples` are then empty).
fn lengths(data: &pb::ProfilesData, packed: &[PackedSamples]) -> Lengths {
    let mut l = Lengths { profiles: Vec::new(), scopes: Vec::new(), resources: Vec::new() };
    let mut packed = packed.iter();
    for rp in &data.resource_profiles {
        let mut rlen =
            rp.resource.as_ref().map_or(0, |r| message::encoded_len(RESOURCE, r)) + schema_len(&rp.schema_url);
        for sp in &rp.scope_profiles {
            let mut slen = sp.scope.as_ref().map_or(0, |s| message::encoded_len(SCOPE, s)) + schema_len(&sp.schema_url);
            for p in &sp.profiles {
                let plen = p.encoded_len() + packed.next().map_or(0, |s| s.encoded().len());
                l.profiles.push(plen);
                slen += delimited(PROFILES, plen);
            }
            l.scopes.push(slen);
            rlen += delimited(SCOPE_PROFILES, slen);
        }
        l.resources.push(rlen);
    }
    l
}

fn total_len(data: &pb::ProfilesData, l: &Lengths) -> usize {
    let dictionary = data.dictionary.as_ref().map_or(0, |d| message::encoded_len(DICTIONARY, d));
    l.resources.iter().map(|&r| delimited(RESOURCE_PROFILES, r)).sum::<usize>() + dictionary
}

/// Length of what [`encode_to_vec`] writes.
pub(super) fn encoded_len(data: &pb::ProfilesData, packed: &[PackedSamples]) -> usize {
    total_len(data, &lengths(data, packed))
}

/// `ProfilesData` (the same bytes as the export request) as protobuf.
pub(super) fn encode_to_vec(data: &pb::ProfilesData, packed: &[PackedSamples]) -> Vec<u8> {
    let l = lengths(data, packed);
    let total = total_len(data, &l);
    let mut buf = Vec::with_capacity(total);
    let (mut profiles, mut scopes) = (l.profiles.iter(), l.scopes.iter());
    let mut packed = packed.iter();
    for (rp, &rlen) in data.resource_profiles.iter().zip(&l.resources) {
        encode_key(RESOURCE_PROFILES, WireType::LengthDelimited, &mut buf);
        encode_varint(rlen as u64, &mut buf);
        if let Some(r) = &rp.resource {
            message::encode(RESOURCE, r, &mut buf);
        }
        for sp in &rp.scope_profiles {
            let slen = *scopes.next().expect("a length per scope");
            encode_key(SCOPE_PROFILES, WireType::LengthDelimited, &mut buf);
            encode_varint(slen as u64, &mut buf);
            if let Some(s) = &sp.scope {
                message::encode(SCOPE, s, &mut buf);
            }
            for p in &sp.profiles {
                let plen = *profiles.next().expect("a length per profile");
                encode_key(PROFILES, WireType::LengthDelimited, &mut buf);
                encode_varint(plen as u64, &mut buf);
                match packed.next() {
                    None => p.encode_raw(&mut buf),
                    Some(samples) => {
                        if let Some(st) = &p.sample_type {
                            message::encode(SAMPLE_TYPE, st, &mut buf);
                        }
                        buf.extend_from_slice(samples.encoded());
                        pb::Profile { sample_type: None, ..p.clone() }.encode_raw(&mut buf);
                    }
                }
            }
            if !sp.schema_url.is_empty() {
                string::encode(SCHEMA_URL, &sp.schema_url, &mut buf);
            }
        }
        if !rp.schema_url.is_empty() {
            string::encode(SCHEMA_URL, &rp.schema_url, &mut buf);
        }
    }
    if let Some(d) = &data.dictionary {
        message::encode(DICTIONARY, d, &mut buf);
    }
    debug_assert_eq!(buf.len(), total);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AttrValue, InstrumentationScope, KeyValue, ProfileMeta, ProfilesBuilder, Resource};

    fn batch() -> pb::ProfilesData {
        let mut b = ProfilesBuilder::new();
        for r in 0..3 {
            let res = Resource {
                attributes: vec![KeyValue {
                    key: "process.pid".into(),
                    value: Some(AttrValue::Int(r).to_any()),
                    ..Default::default()
                }],
                ..Default::default()
            };
            let ri = b.resource(res);
            if r == 1 {
                b.set_scope(ri, InstrumentationScope { name: "s".into(), ..Default::default() });
            }
            for k in 0..2 {
                let p = b.profile(ri, &ProfileMeta::cpu(10, 1_000 + k, 5));
                for n in 0..(200 * r as usize) {
                    let f = b.function(&format!("f{n}"), "", "", 0);
                    let l = b.line_location(f, n as i64);
                    let st = b.stack(&[l, 1]);
                    let t = b.attribute("thread.id", AttrValue::Int(n as i64 % 7));
                    b.sample(
                        p,
                        pb::Sample {
                            stack_index: st,
                            attribute_indices: vec![t],
                            values: vec![n as i64; n % 3],
                            timestamps_unix_nano: vec![u64::MAX - n as u64; n % 4],
                            ..Default::default()
                        },
                    );
                }
            }
        }
        b.build().0
    }

    #[test]
    fn writes_the_bytes_prost_writes() {
        let mut data = batch();
        assert_eq!(encode_to_vec(&data, &[]), data.encode_to_vec());
        // Schema URLs, a resource without attributes, an empty scope, an
        // empty resource, no dictionary.
        data.resource_profiles[0].schema_url = "https://opentelemetry.io/schemas/1.30.0".into();
        data.resource_profiles[1].scope_profiles[0].schema_url = "x".repeat(300);
        data.resource_profiles[2].resource = Some(Resource::default());
        data.resource_profiles[2].scope_profiles.push(pb::ScopeProfiles::default());
        data.resource_profiles.push(pb::ResourceProfiles::default());
        assert_eq!(encode_to_vec(&data, &[]), data.encode_to_vec());
        data.dictionary = None;
        assert_eq!(encode_to_vec(&data, &[]), data.encode_to_vec());
        assert_eq!(encode_to_vec(&pb::ProfilesData::default(), &[]), Vec::<u8>::new());
    }
}
