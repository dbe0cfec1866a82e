//! Just enough BTF to name BPF functions and their source lines: the
//! string section and each type's name. The kind-specific data after each
//! type is skipped by the sizes in include/uapi/linux/btf.h.

const MAGIC: u16 = 0xeb9f;
pub const KIND_FUNC: u32 = 12;

/// A parsed BTF blob (borrowed).
pub struct Btf<'a> {
    strings: &'a [u8],
    /// (kind, name_off) per type id; index 0 is the void type.
    types: Vec<(u32, u32)>,
}

impl<'a> Btf<'a> {
    pub fn parse(data: &'a [u8]) -> Result<Self, String> {
        let u16_at = |o: usize| data.get(o..o + 2).map(|b| u16::from_ne_bytes([b[0], b[1]]));
        let u32_at = |o: usize| data.get(o..o + 4).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        if u16_at(0) != Some(MAGIC) {
            return Err("bad magic (not native-endian BTF)".into());
        }
        let hdr_len = u32_at(4).ok_or("short header")? as usize;
        let field = |i: usize| u32_at(8 + 4 * i).map(|v| v as usize).ok_or("short header");
        let (type_off, type_len, str_off, str_len) = (field(0)?, field(1)?, field(2)?, field(3)?);
        let section = |off: usize, len: usize| {
            let start = hdr_len.checked_add(off)?;
            data.get(start..start.checked_add(len)?)
        };
        let types_data = section(type_off, type_len).ok_or("type section out of bounds")?;
        let strings = section(str_off, str_len).ok_or("string section out of bounds")?;
        let mut types = vec![(0, 0)];
        let mut at = 0usize;
        while at < types_data.len() {
            let w = |i: usize| {
                types_data.get(at + 4 * i..at + 4 * i + 4).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            };
            let (name_off, info) = (w(0).ok_or("truncated type")?, w(1).ok_or("truncated type")?);
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let extra = match kind {
                1 | 14 | 17 => 4,     // INT, VAR, DECL_TAG
                3 => 12,              // ARRAY
                4 | 5 => vlen * 12,   // STRUCT, UNION
                6 | 13 => vlen * 8,   // ENUM, FUNC_PROTO
                15 | 19 => vlen * 12, // DATASEC, ENUM64
                2 | 7..=12 | 16 | 18 => 0,
                k => return Err(format!("unknown BTF kind {k} at type {}", types.len())),
            };
            types.push((kind, name_off));
            at += 12 + extra;
        }
        Ok(Btf { strings, types })
    }

    /// The string at `off` in the string section.
    pub fn str_at(&self, off: u32) -> Option<&'a str> {
        let rest = self.strings.get(off as usize..)?;
        let end = memchr::memchr(0, rest)?;
        std::str::from_utf8(&rest[..end]).ok()
    }

    /// Name of a FUNC type.
    pub fn func_name(&self, type_id: u32) -> Option<&'a str> {
        let &(kind, name_off) = self.types.get(type_id as usize)?;
        (kind == KIND_FUNC).then(|| self.str_at(name_off)).flatten().filter(|s| !s.is_empty())
    }
}

/// Builds a tiny BTF blob: `int`, one `int (void)` proto, one static FUNC per
/// name; plus extra strings. Returns the blob and each extra string's offset.
/// Used by tests to load programs with func and line info.
pub fn build_for_test(funcs: &[&str], extra: &[&str]) -> (Vec<u8>, Vec<u32>) {
    let mut strings = vec![0u8];
    let mut add = |s: &str| {
        let off = strings.len() as u32;
        strings.extend_from_slice(s.as_bytes());
        strings.push(0);
        off
    };
    let int_name = add("int");
    let func_names: Vec<u32> = funcs.iter().map(|f| add(f)).collect();
    let extra_offs: Vec<u32> = extra.iter().map(|s| add(s)).collect();
    let mut types: Vec<u32> = Vec::new();
    types.extend([int_name, 1 << 24, 4, (1 << 24) | 32]); // [1] INT int, signed, 32 bits
    types.extend([0, 13 << 24, 1]); // [2] FUNC_PROTO int (void)
    for n in func_names {
        types.extend([n, KIND_FUNC << 24, 2]); // [3..] FUNC static
    }
    let types: Vec<u8> = types.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC.to_ne_bytes());
    out.push(1); // version
    out.push(0); // flags
    for w in [24u32, 0, types.len() as u32, types.len() as u32, strings.len() as u32] {
        out.extend_from_slice(&w.to_ne_bytes());
    }
    out.extend_from_slice(&types);
    out.extend_from_slice(&strings);
    (out, extra_offs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_it_builds() {
        let (blob, offs) = build_for_test(&["main_fn", "helper"], &["a.c"]);
        let btf = Btf::parse(&blob).unwrap();
        assert_eq!(btf.func_name(3), Some("main_fn"));
        assert_eq!(btf.func_name(4), Some("helper"));
        assert_eq!(btf.func_name(1), None);
        assert_eq!(btf.str_at(offs[0]), Some("a.c"));
        for n in 0..blob.len() {
            let _ = Btf::parse(&blob[..n]);
        }
    }
}
