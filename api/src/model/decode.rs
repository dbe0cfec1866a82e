//! Protobuf decoding of a batch with every vector sized before it is filled.
//!
//! prost decodes a repeated field by pushing element after element: a
//! Sample's one-element `values` takes room for four, a profile's samples
//! are copied at every doubling of their vector, and each copy and spare
//! slot is allocator work and held memory. Here the vectors of the messages
//! a batch is made of (samples, locations, stacks, strings and the other
//! tables) are counted before they are filled — a packed field's elements
//! from its bytes, a message's repeated fields by one walk over its keys —
//! and reserved exactly. The fields of those hot messages are read here;
//! every other field (resources, scopes, attributes, mappings, functions,
//! links, a profile's scalars) goes to prost's own `merge_field`, so what is
//! accepted and what each field holds are prost's (checked against prost in
//! the tests, also on corrupted bytes).
//!
//! One difference: prost's nesting limit (100 levels) restarts below the
//! levels read here, so a message nested 95–100 deep inside an attribute
//! value, which prost refuses, is accepted (at most 5 levels more).

use super::packed::PackedSamples;
use super::pb;
use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};
use prost::{DecodeError, Message};

/// Decodes `ProfilesData` bytes, which are also `ExportProfilesServiceRequest` bytes.
pub(super) fn decode(buf: &[u8]) -> Result<pb::ProfilesData, DecodeError> {
    decode_into(buf, &mut None)
}

/// As [`decode`], with each profile's samples checked and kept packed
/// (`model/packed.rs`), one entry per profile in walk order; the profiles'
/// own `samples` stay empty.
pub(super) fn decode_packed(buf: &[u8]) -> Result<(pb::ProfilesData, Vec<PackedSamples>), DecodeError> {
    let mut packed = Some(Vec::new());
    let data = decode_into(buf, &mut packed)?;
    Ok((data, packed.unwrap_or_default()))
}

/// Where a profile's samples go: its own vector (`None`) or packed.
type Packing = Option<Vec<PackedSamples>>;

fn decode_into(mut buf: &[u8], packing: &mut Packing) -> Result<pb::ProfilesData, DecodeError> {
    let mut data = pb::ProfilesData::default();
    data.resource_profiles.reserve_exact(counts(buf)?[1] as usize);
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf)?;
        match (tag, wt) {
            (1, WireType::LengthDelimited) => {
                data.resource_profiles.push(resource_profiles(payload(&mut buf)?, packing)?)
            }
            // An optional message given twice is merged, as prost does.
            (2, WireType::LengthDelimited) => {
                dictionary(data.dictionary.get_or_insert_with(Default::default), payload(&mut buf)?)?
            }
            _ => data.merge_field(tag, wt, &mut buf, DecodeContext::default())?,
        }
    }
    Ok(data)
}

/// The next length-delimited field's bytes, split off `buf`.
pub(super) fn payload<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], DecodeError> {
    let len = decode_varint(buf)?;
    if len > buf.len() as u64 {
        return Err(underflow());
    }
    let (p, rest) = buf.split_at(len as usize);
    *buf = rest;
    Ok(p)
}

/// How many length-delimited fields of each tag 1..=15 one message's bytes
/// hold (every repeated message or string field of the messages read here):
/// a walk over the keys that skips each value.
fn counts(mut buf: &[u8]) -> Result<[u32; 16], DecodeError> {
    let mut n = [0u32; 16];
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf)?;
        if wt == WireType::LengthDelimited && tag < 16 {
            n[tag as usize] += 1;
        }
        skip_field(wt, tag, &mut buf, DecodeContext::default())?;
    }
    Ok(n)
}

/// Appends a packed field of varints, converted by `f` (prost's `as` casts).
fn packed_varints<T>(mut p: &[u8], out: &mut Vec<T>, f: impl Fn(u64) -> T) -> Result<(), DecodeError> {
    // Each varint ends in the one byte of it below 0x80.
    out.reserve_exact(p.iter().filter(|&&b| b < 0x80).count());
    while !p.is_empty() {
        out.push(f(decode_varint(&mut p)?));
    }
    Ok(())
}

fn packed_fixed64(p: &[u8], out: &mut Vec<u64>) -> Result<(), DecodeError> {
    if !p.len().is_multiple_of(8) {
        return Err(underflow());
    }
    out.reserve_exact(p.len() / 8);
    out.extend(p.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("chunks of 8"))));
    Ok(())
}

fn varint_i32(buf: &mut &[u8]) -> Result<i32, DecodeError> {
    Ok(decode_varint(buf)? as i32)
}

fn resource_profiles(mut buf: &[u8], packing: &mut Packing) -> Result<pb::ResourceProfiles, DecodeError> {
    let mut r = pb::ResourceProfiles::default();
    r.scope_profiles.reserve_exact(counts(buf)?[2] as usize);
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf)?;
        match (tag, wt) {
            (2, WireType::LengthDelimited) => r.scope_profiles.push(scope_profiles(payload(&mut buf)?, packing)?),
            _ => r.merge_field(tag, wt, &mut buf, DecodeContext::default())?,
        }
    }
    Ok(r)
}

fn scope_profiles(mut buf: &[u8], packing: &mut Packing) -> Result<pb::ScopeProfiles, DecodeError> {
    let mut s = pb::ScopeProfiles::default();
    s.profiles.reserve_exact(counts(buf)?[2] as usize);
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf)?;
        match (tag, wt) {
            (2, WireType::LengthDelimited) => s.profiles.push(profile(payload(&mut buf)?, packing)?),
            _ => s.merge_field(tag, wt, &mut buf, DecodeContext::default())?,
        }
    }
    Ok(s)
}

fn profile(mut buf: &[u8], packing: &mut Packing) -> Result<pb::Profile, DecodeError> {
    let mut p = pb::Profile::default();
    let Some(packed) = packing else {
        p.samples.reserve_exact(counts(buf)?[2] as usize);
        while !buf.is_empty() {
            let (tag, wt) = decode_key(&mut buf)?;
            match (tag, wt) {
                (2, WireType::LengthDelimited) => p.samples.push(sample(payload(&mut buf)?)?),
                _ => p.merge_field(tag, wt, &mut buf, DecodeContext::default())?,
            }
        }
        return Ok(p);
    };
    // The samples take about the profile's bytes; one Sample is reused.
    let mut samples = PackedSamples::with_capacity(buf.len());
    let mut scratch = pb::Sample::default();
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf)?;
        match (tag, wt) {
            (2, WireType::LengthDelimited) => {
                sample_into(payload(&mut buf)?, &mut scratch)?;
                samples.push(&scratch);
            }
            _ => p.merge_field(tag, wt, &mut buf, DecodeContext::default())?,
        }
    }
    samples.shrink_to_fit();
    packed.push(samples);
    Ok(p)
}

fn sample(buf: &[u8]) -> Result<pb::Sample, DecodeError> {
    let mut s = pb::Sample::default();
    sample_into(buf, &mut s)?;
    Ok(s)
}

/// Reads one Sample into `s`, whose vectors are emptied first and reused.
pub(super) fn sample_into(mut buf: &[u8], s: &mut pb::Sample) -> Result<(), DecodeError> {
    s.clear();
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf)?;
        match (tag, wt) {
            (1, WireType::Varint) => s.stack_index = varint_i32(&mut buf)?,
            (2, WireType::LengthDelimited) => {
                packed_varints(payload(&mut buf)?, &mut s.attribute_indices, |v| v as i32)?
            }
            (3, WireType::Varint) => s.link_index = varint_i32(&mut buf)?,
            (4, WireType::LengthDelimited) => packed_varints(payload(&mut buf)?, &mut s.values, |v| v as i64)?,
            (5, WireType::LengthDelimited) => packed_fixed64(payload(&mut buf)?, &mut s.timestamps_unix_nano)?,
            // Unpacked elements, wrong wire types and unknown fields: prost's rules.
            _ => s.merge_field(tag, wt, &mut buf, DecodeContext::default())?,
        }
    }
    Ok(())
}

fn dictionary(d: &mut pb::ProfilesDictionary, mut buf: &[u8]) -> Result<(), DecodeError> {
    let n = counts(buf)?;
    d.mapping_table.reserve_exact(n[1] as usize);
    d.location_table.reserve_exact(n[2] as usize);
    d.function_table.reserve_exact(n[3] as usize);
    d.link_table.reserve_exact(n[4] as usize);
    d.string_table.reserve_exact(n[5] as usize);
    d.attribute_table.reserve_exact(n[6] as usize);
    d.stack_table.reserve_exact(n[7] as usize);
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf)?;
        match (tag, wt) {
            (2, WireType::LengthDelimited) => d.location_table.push(location(payload(&mut buf)?)?),
            (5, WireType::LengthDelimited) => d.string_table.push(string(payload(&mut buf)?)?),
            (7, WireType::LengthDelimited) => d.stack_table.push(stack(payload(&mut buf)?)?),
            _ => d.merge_field(tag, wt, &mut buf, DecodeContext::default())?,
        }
    }
    Ok(())
}

fn string(p: &[u8]) -> Result<String, DecodeError> {
    std::str::from_utf8(p).map(str::to_owned).map_err(|_| not_utf8(p))
}

// prost's own errors, made by prost (its constructor is not public API);
// only on the error path.

/// "buffer underflow": a length past the end of its message.
fn underflow() -> DecodeError {
    match skip_field(WireType::SixtyFourBit, 1, &mut &[][..], DecodeContext::default()) {
        Err(e) => e,
        Ok(()) => unreachable!("skipping 8 bytes of none fails"),
    }
}

/// prost's error for a string field that is not UTF-8.
fn not_utf8(p: &[u8]) -> DecodeError {
    let mut field = Vec::with_capacity(p.len() + 10);
    prost::encoding::encode_varint(p.len() as u64, &mut field);
    field.extend_from_slice(p);
    let mut s = String::new();
    match prost::encoding::string::merge(WireType::LengthDelimited, &mut s, &mut &field[..], DecodeContext::default()) {
        Err(e) => e,
        Ok(()) => underflow(),
    }
}

fn stack(mut buf: &[u8]) -> Result<pb::Stack, DecodeError> {
    let mut s = pb::Stack::default();
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf)?;
        match (tag, wt) {
            (1, WireType::LengthDelimited) => {
                packed_varints(payload(&mut buf)?, &mut s.location_indices, |v| v as i32)?
            }
            _ => s.merge_field(tag, wt, &mut buf, DecodeContext::default())?,
        }
    }
    Ok(s)
}

fn location(mut buf: &[u8]) -> Result<pb::Location, DecodeError> {
    let mut l = pb::Location::default();
    l.lines.reserve_exact(counts(buf)?[3] as usize);
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf)?;
        match (tag, wt) {
            (1, WireType::Varint) => l.mapping_index = varint_i32(&mut buf)?,
            (2, WireType::Varint) => l.address = decode_varint(&mut buf)?,
            (3, WireType::LengthDelimited) => l.lines.push(line(payload(&mut buf)?)?),
            (4, WireType::LengthDelimited) => {
                packed_varints(payload(&mut buf)?, &mut l.attribute_indices, |v| v as i32)?
            }
            _ => l.merge_field(tag, wt, &mut buf, DecodeContext::default())?,
        }
    }
    Ok(l)
}

fn line(mut buf: &[u8]) -> Result<pb::Line, DecodeError> {
    let mut l = pb::Line::default();
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf)?;
        match (tag, wt) {
            (1, WireType::Varint) => l.function_index = varint_i32(&mut buf)?,
            (2, WireType::Varint) => l.line = decode_varint(&mut buf)? as i64,
            (3, WireType::Varint) => l.column = decode_varint(&mut buf)? as i64,
            _ => l.merge_field(tag, wt, &mut buf, DecodeContext::default())?,
        }
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AttrValue, ProfileMeta, ProfilesBuilder};

    /// A batch with every hot field set, some twice over; `scale` samples
    /// more per resource.
    fn batch(scale: usize) -> pb::ProfilesData {
        let mut b = ProfilesBuilder::new();
        for r in 0..3i64 {
            let ri = b.resource(crate::model::Resource {
                attributes: vec![crate::model::KeyValue {
                    key: "process.pid".into(),
                    value: Some(AttrValue::Int(r).to_any()),
                    ..Default::default()
                }],
                ..Default::default()
            });
            let p = b.profile(ri, &ProfileMeta::cpu(10, 1_000, 5));
            for n in 0..(scale * r as usize + 3) {
                let f = b.function(&format!("f{n}"), "", "src/ü.c", 7);
                let l = b.line_location(f, n as i64 - 20);
                let st = b.stack(&[l, 1]);
                let t = b.attribute("thread.id", AttrValue::Int(n as i64 % 7 - 3));
                b.sample(
                    p,
                    pb::Sample {
                        stack_index: st,
                        attribute_indices: vec![t],
                        link_index: (n % 2) as i32,
                        values: vec![-(n as i64); n % 3],
                        timestamps_unix_nano: vec![u64::MAX - n as u64; n % 4],
                    },
                );
            }
        }
        let mut data = b.build().0;
        let d = data.dictionary.as_mut().unwrap();
        d.location_table[1].lines.push(pb::Line { function_index: 1, line: 2, column: -3 });
        d.link_table.push(pb::Link { trace_id: vec![1; 16], span_id: vec![2; 8] });
        data
    }

    fn same_as_prost(bytes: &[u8]) {
        let ours = decode(bytes);
        let theirs = pb::ProfilesData::decode(bytes);
        match (&ours, &theirs) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(_), Err(_)) => {}
            _ => panic!("prost: {theirs:?}\nours: {ours:?}\nbytes: {bytes:02x?}"),
        }
        packed_same(bytes, theirs.ok());
    }

    /// The packed decode accepts what prost accepts, unpacks to what prost
    /// reads and encodes to the bytes prost writes for that.
    fn packed_same(bytes: &[u8], theirs: Option<pb::ProfilesData>) {
        use crate::model::Profiles;
        match (decode_packed(bytes), theirs) {
            (Ok((data, packed)), Some(b)) => {
                assert_eq!(
                    data.resource_profiles
                        .iter()
                        .flat_map(|r| &r.scope_profiles)
                        .map(|s| s.profiles.len())
                        .sum::<usize>(),
                    packed.len()
                );
                let p = Profiles(data, packed);
                assert_eq!(p.encode_to_vec(), b.encode_to_vec());
                assert_eq!(p.encoded_len(), b.encoded_len());
                assert_eq!(p.into_unpacked().0, b);
            }
            (Err(_), None) => {}
            (ours, theirs) => panic!("prost: {theirs:?}\npacked: {ours:?}\nbytes: {bytes:02x?}"),
        }
    }

    #[test]
    fn decodes_what_prost_decodes() {
        let bytes = batch(50).encode_to_vec();
        same_as_prost(&bytes);
        let ours = decode(&bytes).unwrap();
        assert_eq!(ours, pb::ProfilesData::decode(&bytes[..]).unwrap());
        // Sized exactly: no spare room in the vectors read here.
        let p = &ours.resource_profiles[2].scope_profiles[0].profiles[0];
        assert_eq!(p.samples.capacity(), p.samples.len());
        assert!(p.samples.iter().all(|s| s.values.capacity() == s.values.len()
            && s.timestamps_unix_nano.capacity() == s.timestamps_unix_nano.len()));
        let d = ours.dictionary.as_ref().unwrap();
        assert_eq!(d.location_table.capacity(), d.location_table.len());
        assert!(d.location_table.iter().all(|l| l.lines.capacity() == l.lines.len()));
        assert_eq!(decode(&[]).unwrap(), pb::ProfilesData::default());
    }

    #[test]
    fn unpacked_repeated_fields_duplicates_and_unknown_fields_read_as_prost_reads_them() {
        use prost::encoding::{encode_key, encode_varint};
        // Sample: stack 3, values 5 and 6 unpacked then 7 packed, an unknown
        // varint field 9, then a second stack_index (last wins).
        let mut s = Vec::new();
        encode_key(1, WireType::Varint, &mut s);
        encode_varint(3, &mut s);
        for v in [5u64, 6] {
            encode_key(4, WireType::Varint, &mut s);
            encode_varint(v, &mut s);
        }
        encode_key(4, WireType::LengthDelimited, &mut s);
        encode_varint(1, &mut s);
        encode_varint(7, &mut s);
        encode_key(9, WireType::Varint, &mut s);
        encode_varint(300, &mut s);
        encode_key(1, WireType::Varint, &mut s);
        encode_varint(u64::MAX, &mut s); // -1 as int32
        let mut p = Vec::new();
        encode_key(2, WireType::LengthDelimited, &mut p);
        encode_varint(s.len() as u64, &mut p);
        p.extend_from_slice(&s);
        let nest = |tag: u32, inner: &[u8]| {
            let mut o = Vec::new();
            encode_key(tag, WireType::LengthDelimited, &mut o);
            encode_varint(inner.len() as u64, &mut o);
            o.extend_from_slice(inner);
            o
        };
        let mut bytes = nest(1, &nest(2, &nest(2, &p)));
        // Two dictionaries: merged.
        let d1 = pb::ProfilesDictionary { string_table: vec!["".into(), "a".into()], ..Default::default() };
        let d2 = pb::ProfilesDictionary { string_table: vec!["b".into()], ..Default::default() };
        bytes.extend(nest(2, &d1.encode_to_vec()));
        bytes.extend(nest(2, &d2.encode_to_vec()));
        same_as_prost(&bytes);
        let data = decode(&bytes).unwrap();
        let sample = &data.resource_profiles[0].scope_profiles[0].profiles[0].samples[0];
        assert_eq!((sample.stack_index, &sample.values[..]), (-1, &[5, 6, 7][..]));
        assert_eq!(data.dictionary.unwrap().string_table, ["", "a", "b"]);
    }

    #[test]
    fn refuses_what_prost_refuses_byte_by_byte() {
        let bytes = batch(1).encode_to_vec();
        // Every truncation, and every byte replaced by values that break
        // lengths, keys, varints, wire types and UTF-8.
        for cut in 0..bytes.len() {
            same_as_prost(&bytes[..cut]);
        }
        let mut b = bytes.clone();
        for i in 0..bytes.len() {
            for v in [0x00, 0x07, 0x80, 0xff, 0x0b, 0x0c, 0xc3] {
                b[i] = v;
                same_as_prost(&b);
            }
            b[i] = bytes[i];
        }
    }
}
