//! What a request will cost once decoded, known before it is decoded.
//!
//! An OTLP request can expand a lot: an empty `Sample` is 2 bytes on the wire
//! and ~100 bytes as a struct in a vector, so a 30 MiB request of them
//! decodes to gigabytes. [`proto_decoded_size`] walks the protobuf wire
//! format of an `ExportProfilesServiceRequest` once, knowing which field of
//! which message is a sub-message, a string or a packed array, and adds up
//! the heap blocks the receiver's decode will allocate for it: the vectors
//! it sizes from the wire (`model/decode.rs`) at their length, the others
//! (prost's) at the capacity their pushes grow them to, every string at its
//! length, each block rounded as glibc malloc rounds it (as `memsize`
//! counts a decoded batch). Nothing is
//! allocated but a small stack of open messages; the walk stops as soon as
//! the estimate passes the limit, so refusing a hostile request costs less
//! than reading it. [`json_decoded_size`] does the same for OTLP/JSON by
//! counting the document's values, members and string bytes (the decoder
//! builds a `serde_json::Value` tree, then the structs).
//!
//! The estimate is an upper bound of what the decode holds live at its peak
//! (checked against a counting allocator in the receiver's tests), so a
//! budget in these bytes bounds the decode's memory for any input.

use super::memsize::block;
use super::pb;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1 as common;
use std::mem::size_of;

/// prost's nesting limit: deeper input is refused by the decoder anyway.
const MAX_DEPTH: usize = 100;

/// Why the walk stopped without an estimate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetError {
    /// The request would decode to more than the limit: `at_least` bytes
    /// counted before the walk stopped, `messages` messages among them.
    OverBudget { at_least: usize, limit: usize, messages: u64 },
    /// Not valid protobuf for this message (the decoder would refuse it too).
    Malformed(String),
}

impl std::fmt::Display for BudgetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BudgetError::OverBudget { at_least, limit, messages } => write!(
                f,
                "the request would take more than {limit} bytes once decoded (at least {at_least} bytes counted, \
                 {messages} messages)"
            ),
            BudgetError::Malformed(m) => f.write_str(m),
        }
    }
}

/// The messages of an ExportProfilesServiceRequest (profiles v1development, proto v1.10).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Msg {
    Request,
    ResourceProfiles,
    Resource,
    EntityRef,
    ScopeProfiles,
    Scope,
    Profile,
    ValueType,
    Sample,
    Dictionary,
    Mapping,
    Stack,
    Location,
    Line,
    Function,
    Link,
    KeyValueAndUnit,
    KeyValue,
    AnyValue,
    ArrayValue,
    KeyValueList,
}

/// What a field number of a message holds, as far as memory goes.
#[derive(Clone, Copy, Debug)]
enum Field {
    /// A sub-message, inline in its parent (`Option<M>` or a oneof).
    One(Msg),
    /// A repeated message: one element of `size` bytes in a vector each.
    Many(Msg, usize),
    /// A string or bytes field: a block of its length.
    Text,
    /// A repeated string: a `String` in a vector, plus its block.
    Texts,
    /// A repeated scalar of `size` bytes decoded (packed or not).
    Scalars { size: usize, fixed: bool },
    /// A plain scalar, or a field this schema does not know (skipped by the decoder).
    Nothing,
}

fn field(msg: Msg, tag: u32) -> Field {
    use Field::*;
    use Msg::*;
    match (msg, tag) {
        (Request, 1) => Many(ResourceProfiles, size_of::<pb::ResourceProfiles>()),
        (Request, 2) => One(Dictionary),
        (ResourceProfiles, 1) => One(Resource),
        (ResourceProfiles, 2) => Many(ScopeProfiles, size_of::<pb::ScopeProfiles>()),
        (ResourceProfiles | ScopeProfiles, 3) => Text,
        (Resource, 1) | (Scope, 3) | (KeyValueList, 1) => Many(KeyValue, size_of::<common::KeyValue>()),
        (Resource, 3) => Many(EntityRef, size_of::<common::EntityRef>()),
        (EntityRef, 1 | 2) => Text,
        (EntityRef, 3 | 4) => Texts,
        (ScopeProfiles, 1) => One(Scope),
        (ScopeProfiles, 2) => Many(Profile, size_of::<pb::Profile>()),
        (Scope, 1 | 2) => Text,
        (Profile, 1 | 5) => One(ValueType),
        (Profile, 2) => Many(Sample, size_of::<pb::Sample>()),
        (Profile, 7 | 9 | 10) => Text,
        (Profile, 11) | (Sample, 2) | (Mapping, 5) | (Stack, 1) | (Location, 4) => {
            Scalars { size: size_of::<i32>(), fixed: false }
        }
        (Sample, 4) => Scalars { size: size_of::<i64>(), fixed: false },
        (Sample, 5) => Scalars { size: size_of::<u64>(), fixed: true },
        (Dictionary, 1) => Many(Mapping, size_of::<pb::Mapping>()),
        (Dictionary, 2) => Many(Location, size_of::<pb::Location>()),
        (Dictionary, 3) => Many(Function, size_of::<pb::Function>()),
        (Dictionary, 4) => Many(Link, size_of::<pb::Link>()),
        (Dictionary, 5) => Texts,
        (Dictionary, 6) => Many(KeyValueAndUnit, size_of::<pb::KeyValueAndUnit>()),
        (Dictionary, 7) => Many(Stack, size_of::<pb::Stack>()),
        (Location, 3) => Many(Line, size_of::<pb::Line>()),
        (Link, 1 | 2) => Text,
        (KeyValueAndUnit | KeyValue, 2) => One(AnyValue),
        (KeyValue, 1) => Text,
        (AnyValue, 1 | 7) => Text,
        (AnyValue, 5) => One(ArrayValue),
        (AnyValue, 6) => One(KeyValueList),
        (ArrayValue, 1) => Many(AnyValue, size_of::<common::AnyValue>()),
        _ => Nothing,
    }
}

/// Whether the receiver's decode (`model/decode.rs`) reserves this repeated
/// field's vector at exactly its length: the vectors it reads itself. The
/// rest are prost's, grown push by push.
fn sized_exactly(msg: Msg, tag: usize) -> bool {
    use Msg::*;
    matches!(
        (msg, tag),
        (Request, 1)
            | (ResourceProfiles, 2)
            | (ScopeProfiles, 2)
            | (Profile, 2)
            | (Sample, 2 | 4 | 5)
            | (Dictionary, 1..=7)
            | (Location, 3 | 4)
            | (Stack, 1)
    )
}

/// The capacity a vector reaches after `n` pushes (std's growth: 4 at
/// first for elements up to 1 KiB, then doubling).
fn grown(n: u64, elem: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let min = if elem == 1 {
        8
    } else if elem <= 1024 {
        4
    } else {
        1
    };
    usize::try_from(n).unwrap_or(usize::MAX).checked_next_power_of_two().unwrap_or(usize::MAX).max(min)
}

/// Highest field number with a repeated field in any message above (Dictionary's 7, Profile's 11).
const MAX_TAG: usize = 11;

/// An open message: where it ends and how many elements each of its
/// repeated fields received so far (their vectors are sized when it closes).
struct Open {
    msg: Msg,
    end: usize,
    counts: [u64; MAX_TAG + 1],
    /// Bit `tag` set when `counts[tag]` is not 0 (most messages have none).
    used: u16,
    /// Bit `tag` set when a scalar of that field came unpacked: the decode
    /// pushes it, so even a field it sizes grows.
    pushed: u16,
}

impl Open {
    fn new(msg: Msg, end: usize) -> Self {
        Open { msg, end, counts: [0; MAX_TAG + 1], used: 0, pushed: 0 }
    }

    /// The vectors of its repeated fields, at the capacity the decode gives them.
    /// Also the largest of those that grow, whose last growth briefly holds
    /// both the old and the new block.
    fn vectors(&self) -> (usize, usize) {
        let (mut sum, mut largest) = (0usize, 0usize);
        let mut used = self.used;
        while used != 0 {
            let tag = used.trailing_zeros() as usize;
            used &= used - 1;
            let n = self.counts[tag];
            let size = match field(self.msg, tag as u32) {
                Field::Many(_, size) | Field::Scalars { size, .. } => size,
                Field::Texts => size_of::<String>(),
                _ => continue,
            };
            if sized_exactly(self.msg, tag) && self.pushed & (1 << tag) == 0 {
                // Reserved once: no growth, no old block beside the new.
                sum = sum.saturating_add(block(usize::try_from(n).unwrap_or(usize::MAX).saturating_mul(size)));
                continue;
            }
            let b = block(grown(n, size).saturating_mul(size));
            sum = sum.saturating_add(b);
            largest = largest.max(b);
        }
        (sum, largest)
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn malformed(&self, what: &str) -> BudgetError {
        BudgetError::Malformed(format!("{what} at byte {}", self.pos))
    }

    fn varint(&mut self) -> Result<u64, BudgetError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.buf.get(self.pos) else { return Err(self.malformed("truncated varint")) };
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.malformed("varint longer than 10 bytes"))
    }

    fn skip(&mut self, n: usize, end: usize) -> Result<(), BudgetError> {
        match self.pos.checked_add(n) {
            Some(p) if p <= end => {
                self.pos = p;
                Ok(())
            }
            _ => Err(self.malformed("field runs past the end of its message")),
        }
    }

    /// The end of a length-delimited field starting here, within `end`.
    fn delimited(&mut self, end: usize) -> Result<usize, BudgetError> {
        let len = self.varint()?;
        let start = self.pos;
        match usize::try_from(len).ok().and_then(|l| start.checked_add(l)) {
            Some(e) if e <= end => Ok(e),
            _ => Err(self.malformed("length runs past the end of its message")),
        }
    }

    /// Skips a group (wire type 3) up to its end tag, as the decoder skips
    /// an unknown one: nested groups and all.
    fn skip_group(&mut self, end: usize, depth: usize) -> Result<(), BudgetError> {
        if depth > MAX_DEPTH {
            return Err(self.malformed("groups nested too deep"));
        }
        loop {
            if self.pos >= end {
                return Err(self.malformed("group without its end"));
            }
            let key = self.varint()?;
            match key & 7 {
                4 => return Ok(()),
                3 => self.skip_group(end, depth + 1)?,
                w => self.skip_value(w, end)?,
            }
        }
    }

    fn skip_value(&mut self, wire: u64, end: usize) -> Result<(), BudgetError> {
        match wire {
            0 => self.varint().map(|_| ()),
            1 => self.skip(8, end),
            2 => {
                self.pos = self.delimited(end)?;
                Ok(())
            }
            5 => self.skip(4, end),
            _ => Err(self.malformed("invalid wire type")),
        }
    }
}

/// Bytes an `ExportProfilesServiceRequest` (or `ProfilesData`: the same
/// fields) in protobuf will take once decoded; refused as soon as the count
/// passes `limit`. Input prost would refuse is `Malformed`.
pub fn proto_decoded_size(buf: &[u8], limit: usize) -> Result<usize, BudgetError> {
    let mut r = Reader { buf, pos: 0 };
    let mut total = size_of::<ExportProfilesServiceRequest>();
    let mut transient = 0usize;
    let mut messages = 1u64;
    let mut stack = vec![Open::new(Msg::Request, buf.len())];
    let over = |total: usize, messages| BudgetError::OverBudget { at_least: total, limit, messages };
    while let Some(top) = stack.last_mut() {
        if r.pos >= top.end {
            if r.pos > top.end {
                return Err(r.malformed("message runs past its length"));
            }
            let (vectors, largest) = top.vectors();
            total = total.saturating_add(vectors);
            transient = transient.max(largest / 2);
            stack.pop();
            if total.saturating_add(transient) > limit {
                return Err(over(total, messages));
            }
            continue;
        }
        let end = top.end;
        let key = r.varint()?;
        let (tag, wire) = (key >> 3, key & 7);
        if tag == 0 || tag > u64::from(u32::MAX >> 3) {
            return Err(r.malformed("invalid field number"));
        }
        let f = field(top.msg, tag as u32);
        // Counts elements of a repeated field; true when its vector grew past 1024 elements.
        let mut grew = false;
        let mut count = |top: &mut Open, n: u64| {
            top.used |= 1 << tag;
            let c = &mut top.counts[tag as usize];
            let old = *c;
            *c = old.saturating_add(n);
            grew = *c >= 1024 && grown(*c, 1) != grown(old, 1);
        };
        let needs_length = matches!(f, Field::One(_) | Field::Many(..) | Field::Text | Field::Texts);
        if needs_length && wire != 2 {
            return Err(r.malformed("wrong wire type for a message, string or bytes field"));
        }
        match f {
            Field::One(m) | Field::Many(m, _) => {
                if let Field::Many(..) = f {
                    count(top, 1);
                }
                let sub_end = r.delimited(end)?;
                messages += 1;
                if stack.len() >= MAX_DEPTH {
                    return Err(r.malformed("messages nested deeper than 100"));
                }
                stack.push(Open::new(m, sub_end));
            }
            Field::Text | Field::Texts => {
                if let Field::Texts = f {
                    count(top, 1);
                }
                let e = r.delimited(end)?;
                let len = e - r.pos;
                // An empty string or byte field allocates nothing; bytes reserve at least 8.
                total = total.saturating_add(if len == 0 { 0 } else { block(len.max(8)) });
                r.pos = e;
            }
            Field::Scalars { fixed, .. } if wire == 2 => {
                let e = r.delimited(end)?;
                let n = if fixed {
                    ((e - r.pos) / 8) as u64
                } else {
                    // One varint ends at each byte without the continuation bit.
                    r.buf[r.pos..e].iter().filter(|b| **b & 0x80 == 0).count() as u64
                };
                count(top, n);
                r.pos = e;
            }
            Field::Scalars { .. } => {
                count(top, 1);
                top.pushed |= 1 << tag;
                r.skip_value(wire, end)?;
            }
            Field::Nothing => match wire {
                3 => r.skip_group(end, stack.len())?,
                4 => return Err(r.malformed("unexpected end of group")),
                w => r.skip_value(w, end)?,
            },
        }
        // Checked whenever a vector of an open message grows (its count
        // reaches a power of two), so a message of millions of elements is
        // refused long before its end.
        if grew {
            let open = stack.iter().fold(total, |t, o| t.saturating_add(o.vectors().0));
            if open > limit {
                return Err(over(open, messages));
            }
        }
    }
    if r.pos != buf.len() {
        return Err(r.malformed("trailing bytes"));
    }
    Ok(total.saturating_add(transient))
}

/// The largest of `sizes` (a `const fn`: `Iterator::max` is not const).
const fn largest(sizes: &[usize]) -> usize {
    let mut i = 0;
    let mut max = 0;
    while i < sizes.len() {
        if sizes[i] > max {
            max = sizes[i];
        }
        i += 1;
    }
    max
}

/// The largest element of any vector the protobuf decode fills (`Field::Many`).
const LARGEST_PROTO_ELEMENT: usize = {
    largest(&[
        size_of::<pb::ResourceProfiles>(),
        size_of::<pb::ScopeProfiles>(),
        size_of::<pb::Profile>(),
        size_of::<pb::Sample>(),
        size_of::<pb::Mapping>(),
        size_of::<pb::Location>(),
        size_of::<pb::Line>(),
        size_of::<pb::Function>(),
        size_of::<pb::Link>(),
        size_of::<pb::KeyValueAndUnit>(),
        size_of::<pb::Stack>(),
        size_of::<common::KeyValue>(),
        size_of::<common::AnyValue>(),
        size_of::<common::EntityRef>(),
        size_of::<String>(),
    ])
};

/// The most [`proto_decoded_size`] can return for `len` bytes of any
/// input, from the length alone: a request whose bound is within the
/// budget needs no walk (what a busy node sends is far below it).
///
/// Why it holds, with S the largest vector element: every vector element
/// costs at least 2 bytes of its own on the wire (tag and length; a packed
/// scalar at least 1 byte plus its field's 2), and a vector of k elements
/// is counted at `block(max(4, 2k - 1) × S) ≤ max(4, 2k - 1) × S + 23`
/// bytes, so at most 2S + 12 per wire byte (k = 1 is the worst case);
/// strings cost at most `len + 31` for `len + 2` bytes, at most 60 per byte
/// with their vector slot. The estimate adds half of one vector for a
/// growth in progress: at most 2S + 12 for a small vector, and (S + 12) / 2
/// per wire byte for a large one. Checked in the tests against hostile
/// shapes, each at its worst.
pub fn proto_size_bound(len: usize) -> usize {
    let s = LARGEST_PROTO_ELEMENT;
    let per_two_bytes = 5 * s + 36; // (2S + 12) + (S + 12) / 2, doubled
    size_of::<ExportProfilesServiceRequest>()
        .saturating_add(2 * s + 12)
        .saturating_add(len.saturating_mul(per_two_bytes).div_ceil(2))
}

/// The largest struct an OTLP/JSON object can become in a vector.
const LARGEST_ELEMENT: usize = {
    largest(&[
        size_of::<pb::Profile>(),
        size_of::<pb::Sample>(),
        size_of::<pb::ResourceProfiles>(),
        size_of::<pb::ScopeProfiles>(),
        size_of::<pb::Mapping>(),
        size_of::<pb::Location>(),
        size_of::<pb::Function>(),
        size_of::<pb::KeyValueAndUnit>(),
        size_of::<common::KeyValue>(),
        size_of::<common::AnyValue>(),
        size_of::<common::EntityRef>(),
    ])
};

/// A vector's element at its worst: right after a growth the vector holds
/// twice the elements it has, and during the move the old block is live too.
const GROWTH: usize = 3;

/// What an OTLP/JSON object or array costs the decoder at most: its
/// `serde_json::Value` in its parent's vector and the struct it becomes in
/// its own, both at their worst growth. Checked against a counting
/// allocator in the receiver's tests.
pub(crate) const JSON_BYTES_PER_CONTAINER: usize = GROWTH * (size_of::<serde_json::Value>() + LARGEST_ELEMENT);
/// A string, number, `true`, `false` or `null` value (its bytes apart): its
/// `Value` and the 8-byte scalar it becomes, at their worst growth.
pub(crate) const JSON_BYTES_PER_SCALAR: usize = GROWTH * (size_of::<serde_json::Value>() + 8);
/// An object member (its key's bytes apart): its map entry (hash, key,
/// value) and its slot in the map's index, at their worst growth.
pub(crate) const JSON_BYTES_PER_MEMBER: usize =
    GROWTH * (8 + size_of::<String>() + size_of::<serde_json::Value>() + 16);

/// Bytes an OTLP/JSON request will take at most while it is decoded (its
/// parse tree and the structs built from it), counted in one pass over the
/// text: containers, scalar values, object members and string bytes.
/// Refused as soon as the count passes `limit`. Text that is not JSON is
/// left to the decoder (the count up to the first error bounds what it
/// builds before failing).
pub fn json_decoded_size(text: &[u8], limit: usize) -> Result<usize, BudgetError> {
    let base = size_of::<ExportProfilesServiceRequest>();
    let (mut strings, mut containers, mut scalars, mut members) = (0usize, 0usize, 0usize, 0usize);
    let sum = |strings: usize, containers: usize, scalars: usize, members: usize| {
        base.saturating_add(strings)
            .saturating_add(containers.saturating_mul(JSON_BYTES_PER_CONTAINER))
            .saturating_add(scalars.saturating_mul(JSON_BYTES_PER_SCALAR))
            .saturating_add(members.saturating_mul(JSON_BYTES_PER_MEMBER))
    };
    let mut i = 0;
    let mut in_scalar = false;
    // The last token was a string: a ':' next makes it a key, not a value.
    let mut after_string = false;
    let mut checked = 0;
    while i < text.len() {
        let c = text[i];
        if !matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
            after_string = after_string && c == b':';
        }
        match c {
            b'"' => {
                in_scalar = false;
                let start = i + 1;
                i = start;
                while i < text.len() && text[i] != b'"' {
                    i += if text[i] == b'\\' { 2 } else { 1 };
                }
                // Its bytes are a block in the tree, and again in the struct.
                strings = strings.saturating_add(2 * block(i.min(text.len()) - start));
                scalars += 1;
                after_string = true;
            }
            b'{' | b'[' => {
                in_scalar = false;
                containers += 1;
            }
            b':' => {
                in_scalar = false;
                members += 1;
                if after_string {
                    scalars -= 1;
                    after_string = false;
                }
            }
            b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r' => in_scalar = false,
            _ => {
                // A number, true, false or null: one value, however long.
                if !in_scalar {
                    scalars += 1;
                    in_scalar = true;
                }
            }
        }
        i += 1;
        if i - checked >= 4096 {
            checked = i;
            let t = sum(strings, containers, scalars, members);
            if t > limit {
                return Err(BudgetError::OverBudget { at_least: t, limit, messages: (containers + scalars) as u64 });
            }
        }
    }
    let t = sum(strings, containers, scalars, members);
    if t > limit {
        return Err(BudgetError::OverBudget { at_least: t, limit, messages: (containers + scalars) as u64 });
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Profiles;

    fn request_of(samples: usize) -> Vec<u8> {
        // resource_profiles { scope_profiles { profiles { samples {} × n } } }
        let mut profile = Vec::new();
        for _ in 0..samples {
            profile.extend_from_slice(&[0x12, 0x00]);
        }
        let wrap = |tag: u8, inner: &[u8]| {
            let mut v = vec![(tag << 3) | 2];
            let mut n = inner.len();
            while n >= 0x80 {
                v.push((n as u8) | 0x80);
                n >>= 7;
            }
            v.push(n as u8);
            v.extend_from_slice(inner);
            v
        };
        wrap(1, &wrap(2, &wrap(2, &profile)))
    }

    #[test]
    fn the_estimate_covers_what_the_decode_builds() {
        for n in [0, 1, 5, 100, 10_000] {
            let wire = request_of(n);
            let est = proto_decoded_size(&wire, usize::MAX).unwrap();
            let held = Profiles::decode(&wire[..]).unwrap().memory_size();
            assert!(est >= held, "{n} samples: estimate {est} < held {held}");
            assert!(est <= held * 2 + 1024, "{n} samples: estimate {est} far above held {held}");
        }
    }

    /// `tag` as a length-delimited field around `inner`.
    fn wrap(tag: u8, inner: &[u8]) -> Vec<u8> {
        let mut v = vec![(tag << 3) | 2];
        let mut n = inner.len();
        while n >= 0x80 {
            v.push((n as u8) | 0x80);
            n >>= 7;
        }
        v.push(n as u8);
        v.extend_from_slice(inner);
        v
    }

    /// Shapes at the worst of [`proto_size_bound`]'s argument: one element
    /// per vector (a vector's first push takes room for 4), many elements
    /// in one vector (growth in progress), strings, packed scalars.
    fn hostile_shapes(n: usize) -> Vec<(&'static str, Vec<u8>)> {
        let one_profile_each = wrap(1, &wrap(2, &wrap(2, &[]))).repeat(n);
        let one_scope_each = wrap(1, &wrap(2, &[])).repeat(n);
        let one_resource_each = wrap(1, &[]).repeat(n);
        let profiles = wrap(1, &wrap(2, &wrap(2, &[]).repeat(n)));
        let one_sample_each = wrap(1, &wrap(2, &wrap(2, &wrap(2, &[])).repeat(n)));
        // One value in a packed field of its own sample, and one-byte strings in the dictionary.
        let one_value_each = wrap(1, &wrap(2, &wrap(2, &wrap(2, &wrap(4, &[1])).repeat(n))));
        let strings = wrap(2, &wrap(5, b"a").repeat(n));
        let locations_one_line = wrap(2, &wrap(2, &wrap(3, &[])).repeat(n));
        let kv_one_each = wrap(1, &wrap(1, &wrap(1, &[])).repeat(n));
        vec![
            ("one profile per resource", one_profile_each),
            ("one scope per resource", one_scope_each),
            ("empty resources", one_resource_each),
            ("empty profiles", profiles),
            ("one sample per profile", one_sample_each),
            ("one value per sample", one_value_each),
            ("one-byte strings", strings),
            ("one line per location", locations_one_line),
            ("one attribute per resource", kv_one_each),
            ("empty samples", request_of(n)),
        ]
    }

    #[test]
    fn the_bound_from_the_length_covers_every_estimate() {
        for n in [1, 2, 3, 4, 5, 7, 8, 9, 100, 1023, 1024, 1025, 10_000] {
            for (what, wire) in hostile_shapes(n) {
                assert!(Profiles::decode(&wire[..]).is_ok(), "{what}");
                let est = proto_decoded_size(&wire, usize::MAX).unwrap();
                let bound = proto_size_bound(wire.len());
                assert!(est <= bound, "{what} × {n}: estimate {est} > bound {bound} for {} bytes", wire.len());
            }
        }
        // What the bound lets through unwalked under the default 128 MiB: a
        // busy node's report (~240 KB) but not a 1 MiB request.
        assert!(proto_size_bound(256 << 10) <= 128 << 20);
        assert!(proto_size_bound(1 << 20) > 128 << 20);
    }

    #[test]
    fn empty_samples_are_refused_before_the_end() {
        let wire = request_of(1_000_000);
        let e = proto_decoded_size(&wire, 10 << 20).unwrap_err();
        assert!(
            matches!(e, BudgetError::OverBudget { at_least, limit, .. } if at_least > limit && limit == 10 << 20),
            "{e:?}"
        );
    }

    #[test]
    fn malformed_input_is_named() {
        for bad in [&b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"[..], b"\x0a\x05ab", b"\x0b\x0c", b"\x00"] {
            assert!(matches!(proto_decoded_size(bad, usize::MAX), Err(BudgetError::Malformed(_))), "{bad:?}");
            assert!(Profiles::decode(bad).is_err());
        }
        // An unknown group is skipped, as prost skips it, and what follows counts.
        let mut wire = vec![(15 << 3) | 3, 0x08, 0x01, (15 << 3) | 4];
        wire.extend(request_of(3));
        let est = proto_decoded_size(&wire, usize::MAX).unwrap();
        assert!(est >= Profiles::decode(&wire[..]).unwrap().memory_size());
    }

    #[test]
    fn json_counts_values_and_members() {
        let small = json_decoded_size(b"{}", usize::MAX).unwrap();
        let big = json_decoded_size(b"{\"a\":[1,2,3,{},[]]}", usize::MAX).unwrap();
        // [, {}, []: three containers; 1, 2, 3: three scalars; "a" a key: one member of one byte.
        assert_eq!(
            big - small,
            3 * JSON_BYTES_PER_CONTAINER + 3 * JSON_BYTES_PER_SCALAR + JSON_BYTES_PER_MEMBER + 2 * block(1)
        );
        let bomb = format!("{{\"resourceProfiles\":[{}{{}}]}}", "{},".repeat(200_000));
        assert!(matches!(json_decoded_size(bomb.as_bytes(), 1 << 20), Err(BudgetError::OverBudget { .. })));
    }
}
