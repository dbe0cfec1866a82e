//! A profile's samples kept as their protobuf encoding.
//!
//! Decoded, a Sample is an 80-byte struct with three vectors of its own:
//! ~140 bytes for the ~41 it takes on the wire (docs/PERFORMANCE.md,
//! "Decoded size against the wire size"). A gateway that forwards what it
//! receives (otlp receiver → otlp exporter) never reads a sample's fields,
//! so the otlp receiver keeps each profile's samples as they go on the
//! wire: the `Profile.samples` entries back to back, each its key, length
//! and prost's encoding of the Sample, checked and re-encoded as they are
//! decoded. Encoding a profile copies them; anything that reads the samples
//! of a batch gets it unpacked first (`Profiles::unpack`, done by the host
//! before a processor or exporter that has not said it reads packed batches).

use super::decode::{payload, sample_into};
use super::pb;
use profcol_model_rules::observations::observations;
use prost::encoding::{decode_key, encode_key, encode_varint, WireType};
use prost::Message;

/// `Profile.samples`.
const SAMPLES: u32 = 2;

/// One profile's samples as encoded `samples` fields.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PackedSamples {
    bytes: Vec<u8>,
    count: usize,
    summary: Summary,
}

/// What counting and checking a batch ask of every sample, gathered as each
/// is packed: neither reads the samples again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Summary {
    /// Observations if the profile counts events, and if it does not
    /// (`model::observations`), summed; saturating.
    counted: u64,
    points: u64,
    /// The largest index into each table, a negative one as `u32` (huge).
    stack: u32,
    link: u32,
    attribute: u32,
    /// Some sample has values and timestamps of different lengths.
    uneven: bool,
}

impl Summary {
    fn add(&mut self, s: &pb::Sample) {
        self.counted = self.counted.saturating_add(observations(s, true));
        self.points = self.points.saturating_add(observations(s, false));
        self.stack = self.stack.max(s.stack_index as u32);
        self.link = self.link.max(s.link_index as u32);
        self.attribute = s.attribute_indices.iter().fold(self.attribute, |m, &a| m.max(a as u32));
        let (v, t) = (s.values.len(), s.timestamps_unix_nano.len());
        self.uneven |= v != 0 && t != 0 && v != t;
    }
}

impl PackedSamples {
    pub(super) fn with_capacity(bytes: usize) -> Self {
        PackedSamples { bytes: Vec::with_capacity(bytes), count: 0, summary: Summary::default() }
    }

    /// Appends `s` as prost encodes it.
    pub(super) fn push(&mut self, s: &pb::Sample) {
        encode_key(SAMPLES, WireType::LengthDelimited, &mut self.bytes);
        encode_varint(s.encoded_len() as u64, &mut self.bytes);
        s.encode_raw(&mut self.bytes);
        self.count += 1;
        self.summary.add(s);
    }

    /// The samples' observations (`model::observations`), for a profile
    /// that counts events or not.
    pub(super) fn observations(&self, counts_events: bool) -> u64 {
        if counts_events {
            self.summary.counted
        } else {
            self.summary.points
        }
    }

    /// Whether every sample passes `validate`'s checks against `d`: each
    /// index within its table (an absent table has its zero entry), values
    /// and timestamps of one length when both are set.
    pub(super) fn valid_against(&self, d: &pb::ProfilesDictionary) -> bool {
        let within = |i: u32, len: usize| (i as usize) < len.max(1);
        let s = &self.summary;
        !s.uneven
            && within(s.stack, d.stack_table.len())
            && within(s.link, d.link_table.len())
            && within(s.attribute, d.attribute_table.len())
    }

    pub(super) fn shrink_to_fit(&mut self) {
        self.bytes.shrink_to_fit();
    }

    /// Number of Sample messages.
    pub(super) fn len(&self) -> usize {
        self.count
    }

    pub(super) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The `samples` fields as a profile's encoding holds them.
    pub(super) fn encoded(&self) -> &[u8] {
        &self.bytes
    }

    /// Bytes asked of the allocator, at capacity.
    pub(super) fn capacity(&self) -> usize {
        self.bytes.capacity()
    }

    /// Calls `f` with each sample in order, all read into one reused Sample.
    pub(super) fn for_each(&self, mut f: impl FnMut(&pb::Sample)) {
        self.walk(|s| f(s));
    }

    /// The samples as `f` changes them (an index remap), packed again.
    pub(super) fn map(&self, mut f: impl FnMut(&mut pb::Sample)) -> PackedSamples {
        let mut out = PackedSamples::with_capacity(self.bytes.len());
        self.walk(|s| {
            f(s);
            out.push(s);
        });
        out.shrink_to_fit();
        out
    }

    fn walk(&self, mut f: impl FnMut(&mut pb::Sample)) {
        let mut s = pb::Sample::default();
        let mut buf = &self.bytes[..];
        while !buf.is_empty() {
            // Written by `push` from a decoded Sample: it reads back.
            let read = decode_key(&mut buf).and_then(|_| payload(&mut buf)).and_then(|p| sample_into(p, &mut s));
            debug_assert!(read.is_ok(), "packed samples did not read back: {read:?}");
            if read.is_err() {
                return;
            }
            f(&mut s);
        }
    }

    /// The samples as a vector, each vector sized exactly (a clone
    /// allocates its length, not the reused Sample's capacity).
    pub(super) fn unpack(&self) -> Vec<pb::Sample> {
        let mut out = Vec::with_capacity(self.count);
        self.for_each(|s| out.push(s.clone()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: i64) -> pb::Sample {
        pb::Sample {
            stack_index: n as i32,
            attribute_indices: vec![1, n as i32],
            link_index: (n % 2) as i32,
            values: vec![n; (n % 3) as usize],
            timestamps_unix_nano: vec![u64::MAX - n as u64; (n % 3) as usize],
        }
    }

    #[test]
    fn samples_read_back_as_pushed_and_encode_as_prost_does() {
        let samples: Vec<pb::Sample> = (0..50).map(sample).chain([pb::Sample::default()]).collect();
        let mut packed = PackedSamples::default();
        samples.iter().for_each(|s| packed.push(s));
        assert_eq!(packed.len(), 51);
        assert_eq!(packed.unpack(), samples);
        let unpacked = packed.unpack();
        assert!(unpacked.iter().all(|s| s.values.capacity() == s.values.len()));
        // The bytes are those of a profile with only these samples.
        let profile = pb::Profile { samples, ..Default::default() };
        assert_eq!(packed.encoded(), &profile.encode_to_vec()[..]);
        assert!(PackedSamples::default().unpack().is_empty());
    }
}

#[cfg(test)]
mod batch_tests {
    use crate::model::{pb, AttrValue, ProfileMeta, Profiles, ProfilesBuilder};

    /// Two resources of two profiles each, one of them without samples.
    fn batch() -> Profiles {
        let mut b = ProfilesBuilder::new();
        for r in 0..2i64 {
            let ri = b.resource(crate::model::Resource::default());
            for k in 0..2usize {
                let p = b.profile(ri, &ProfileMeta::cpu(10, 1_000, 5));
                for n in 0..(k * 40) {
                    let f = b.function(&format!("f{n}"), "", "", 0);
                    let l = b.line_location(f, n as i64);
                    let st = b.stack(&[l, 1]);
                    let t = b.attribute("thread.id", AttrValue::Int(n as i64 % 5 + r));
                    let values = vec![n as i64 + 1; n % 3 + 1];
                    let timestamps_unix_nano = vec![1_000 + n as u64; n % 3 + 1];
                    b.sample(
                        p,
                        pb::Sample {
                            stack_index: st,
                            attribute_indices: vec![t],
                            values,
                            timestamps_unix_nano,
                            ..Default::default()
                        },
                    );
                }
            }
        }
        b.build()
    }

    fn packed(p: &Profiles) -> Profiles {
        let packed = Profiles::decode_packed(&p.encode_to_vec()).unwrap();
        assert!(packed.is_packed());
        packed
    }

    #[test]
    fn a_packed_batch_counts_sizes_and_equals_as_the_batch_it_packs() {
        let b = batch();
        let p = packed(&b);
        assert_eq!(p, b);
        assert_eq!(p.sample_count(), b.sample_count());
        // Counted as events (values summed) and as data points.
        for unit in ["count", "nanoseconds"] {
            let mut c = b.clone();
            c.0.dictionary.as_mut().unwrap().string_table.push(unit.into());
            let unit_strindex = c.dictionary().unwrap().string_table.len() as i32 - 1;
            for p in c.0.resource_profiles.iter_mut().flat_map(|r| &mut r.scope_profiles).flat_map(|s| &mut s.profiles)
            {
                p.sample_type.as_mut().unwrap().unit_strindex = unit_strindex;
            }
            assert_eq!(packed(&c).sample_count(), c.sample_count(), "{unit}");
        }
        assert_ne!(b.sample_count(), b.sample_messages());
        assert_eq!(p.sample_messages(), b.sample_messages());
        assert_eq!(p.1.len(), 4);
        assert!(p.profiles().all(|p| p.samples.is_empty()));
        assert!(!p.is_empty());
        assert!(packed(&Profiles::decode(&b.encode_to_vec()).unwrap()).memory_size() < b.memory_size() / 2);
        assert_eq!(p.to_json(), b.to_json());
        assert_eq!(p.clone().into_request(), b.clone().into_request());
        let mut merged = p.clone();
        merged.merge(p.clone());
        let mut expected = b.clone();
        expected.merge(b.clone());
        assert!(merged.is_packed());
        assert_eq!(merged, expected);
        // Merged with an unpacked batch, in either order: unpacked.
        for (first, second) in [(p.clone(), b.clone()), (b.clone(), p.clone())] {
            let mut m = first;
            m.merge(second);
            assert!(!m.is_packed());
            assert_eq!(m, expected);
        }
        // A profile added to a merge of packed batches unpacks it.
        let mut builder = ProfilesBuilder::from_profiles(p.clone());
        builder.append(p.clone());
        let r = builder.resource(crate::model::Resource::default());
        builder.profile(r, &ProfileMeta::cpu(10, 1, 1));
        let built = builder.build();
        assert!(!built.is_packed());
        assert_eq!(built.sample_messages(), 2 * b.sample_messages());
        // A batch of empty profiles is packed and empty.
        let mut none = b.clone();
        none.0
            .resource_profiles
            .iter_mut()
            .flat_map(|r| &mut r.scope_profiles)
            .flat_map(|s| &mut s.profiles)
            .for_each(|p| p.samples.clear());
        assert!(packed(&none).is_empty());
    }

    #[test]
    fn a_packed_batch_is_refused_and_trimmed_as_the_batch_it_packs() {
        type Break = (&'static str, fn(&mut pb::Sample));
        let breaks: [Break; 6] = [
            ("stack_index", |s| s.stack_index = 9_999),
            ("stack_index", |s| s.stack_index = -1),
            ("link_index", |s| s.link_index = 1),
            ("attribute_indices[1]", |s| s.attribute_indices.push(-7)),
            ("attribute_indices[0]", |s| s.attribute_indices[0] = 500),
            ("", |s| s.timestamps_unix_nano.push(1)),
        ];
        for (field, make_bad) in breaks {
            let mut bad = batch();
            make_bad(&mut bad.0.resource_profiles[1].scope_profiles[0].profiles[1].samples[4]);
            let p = packed(&bad);
            assert_eq!(p.validate(), bad.validate());
            let e = p.validate().unwrap_err();
            assert!(
                e.path.ends_with(&format!("profiles[1].samples[4]{}{field}", if field.is_empty() { "" } else { "." })),
                "{e}"
            );
            let (mut p, mut bad) = (p, bad);
            assert_eq!(p.drop_invalid_profiles(), bad.drop_invalid_profiles());
            assert_eq!(p, bad);
        }
        // A sample's error comes before a later profile's own, as unpacked.
        let mut bad = batch();
        bad.0.resource_profiles[0].scope_profiles[0].profiles[1].samples[2].link_index = 3;
        bad.0.resource_profiles[1].scope_profiles[0].profiles[1].attribute_indices.push(99);
        assert_eq!(packed(&bad).validate(), bad.validate());
        assert!(bad.validate().unwrap_err().path.ends_with("profiles[1].samples[2].link_index"));
        // Valid: nothing dropped, still packed.
        let mut p = packed(&batch());
        assert_eq!(p.drop_invalid_profiles(), Ok(None));
        assert!(p.is_packed() && p.validate().is_ok());
    }
}
