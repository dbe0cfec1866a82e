//! Function symbols of one ELF file, held compactly for address lookups.
//!
//! Built once from `.symtab` and `.dynsym`: only defined `STT_FUNC` /
//! `STT_GNU_IFUNC` symbols with an address are kept, sorted by address,
//! one per address (a global name wins over a weak or local alias).
//!
//! Compact, as the kallsyms store keeps the kernel's: addresses are 32-bit
//! offsets from the lowest one, and names (as the file spells them,
//! mangled) are front-coded in blocks of [`BLOCK`]: each name but a block's
//! first is the length it shares with the name before plus the rest, with
//! LEB128 lengths (Rust and C++ mangled names run past 255 bytes, which the
//! kallsyms store's one-byte lengths cut). Neighbours by address share long
//! prefixes (`_ZN4core3fmt`, a module's path), so names take about half
//! their bytes: a table costs under 0.5× the file's `.symtab` + `.strtab`.
//! A lookup decodes at most [`BLOCK`] names; names are demangled by the
//! caller, which memoizes results.
//!
//! [`SymbolTable::encode`] / [`SymbolTable::decode`] write and read the
//! table as one flat byte string (the on-disk table cache); `decode`
//! checks every length and name, so a bad input is an error, never a
//! panic or a wrong slice.

use crate::dwarf::Section;
use crate::MappedFile;
use std::ops::Range;

/// Longest name kept; longer ones are cut (at a char boundary).
pub(crate) const MAX_NAME: usize = 4096;

/// Names per front-coding block: a lookup decodes at most this many.
const BLOCK: usize = 16;

/// Immutable function-symbol table in the file's own virtual addresses.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SymbolTable {
    /// Lowest symbol address; `offsets` are relative to it.
    base: u64,
    offsets: Box<[u32]>,
    /// `st_size`, saturated to u32; 0 = unknown (covers up to the next symbol).
    sizes: Box<[u32]>,
    /// Where in `names` block `b` (names `b * BLOCK ..`) starts.
    block_at: Box<[u32]>,
    /// A block's first name as `len, bytes`; every other as `shared, rest
    /// len, rest bytes` (LEB128 lengths), `shared` bytes from the one before.
    /// Most of a table's bytes: read in place when the table comes from a
    /// mapped file ([`Self::decode_mapped`]), so they are page cache, not heap.
    names: Section,
}

/// One symbol being collected, before sorting.
pub(crate) struct RawSymbol<'a> {
    pub start: u64,
    pub size: u64,
    pub name: &'a [u8],
    /// 0 global, 1 weak, 2 local: the lowest wins among aliases.
    pub rank: u8,
}

/// Why [`SymbolTable::decode`] refused its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("symbol table bytes: {0}")]
pub struct DecodeError(&'static str);

impl SymbolTable {
    pub(crate) fn build(mut raw: Vec<RawSymbol<'_>>) -> Self {
        raw.sort_unstable_by(|a, b| a.start.cmp(&b.start).then(a.rank.cmp(&b.rank)).then(b.size.cmp(&a.size)));
        raw.dedup_by_key(|s| s.start);
        let Some(base) = raw.first().map(|s| s.start) else { return Self::default() };
        // Offsets are 32-bit: a symbol 4 GiB above the lowest is not code
        // of a real binary's text (absolute oddities); it is left out.
        raw.retain(|s| s.start - base <= u64::from(u32::MAX));
        raw.shrink_to_fit();
        // Names are front-coded twice: once to size the buffer, once into
        // it. A binary's names run to megabytes; a growing buffer would
        // hold up to twice that at the peak of a table's load.
        let (count, len) = front_code(&raw, None);
        let mut names = Vec::with_capacity(len);
        let mut block_at = Vec::with_capacity(count.div_ceil(BLOCK));
        front_code(&raw[..count], Some((&mut names, &mut block_at)));
        debug_assert_eq!(names.len(), len);
        let kept = &raw[..count];
        SymbolTable {
            base,
            offsets: kept.iter().map(|s| (s.start - base) as u32).collect(),
            sizes: kept.iter().map(|s| u32::try_from(s.size).unwrap_or(u32::MAX)).collect(),
            block_at: block_at.into(),
            names: Section::boxed(names),
        }
    }

    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// Bytes this table holds on the heap (names read in place from a
    /// mapped file are not: see [`Self::mapped_bytes`]).
    pub fn heap_bytes(&self) -> usize {
        let names = if self.names.is_mapped() { 0 } else { self.names.len() };
        self.offsets.len() * 4 + self.sizes.len() * 4 + self.block_at.len() * 4 + names
    }

    /// Bytes of names read in place from a mapped file.
    pub fn mapped_bytes(&self) -> usize {
        if self.names.is_mapped() {
            self.names.len()
        } else {
            0
        }
    }

    /// The function covering `vaddr` (its name as the file spells it) and
    /// its start address. A symbol with a size covers `[start, start+size)`;
    /// one without covers up to the next symbol.
    pub fn lookup(&self, vaddr: u64) -> Option<(String, u64)> {
        let i = self.index_of(vaddr)?;
        Some((self.name(i)?, self.start(i)))
    }

    fn index_of(&self, vaddr: u64) -> Option<usize> {
        let off = vaddr.checked_sub(self.base)?;
        let off = u32::try_from(off).unwrap_or(u32::MAX);
        let i = self.offsets.partition_point(|&s| s <= off).checked_sub(1)?;
        let size = self.sizes[i];
        if size != 0 && vaddr - self.start(i) >= u64::from(size) {
            return None;
        }
        Some(i)
    }

    fn start(&self, i: usize) -> u64 {
        self.base + u64::from(self.offsets[i])
    }

    /// Every symbol as (start, size, name), in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32, String)> + '_ {
        let mut name = Vec::new();
        let mut pos = 0usize;
        (0..self.len()).map_while(move |i| {
            pos = self.next_name(i, pos, &mut name)?;
            Some((self.start(i), self.sizes[i], String::from_utf8_lossy(&name).into_owned()))
        })
    }

    /// Name `i`, decoded from the start of its block.
    fn name(&self, i: usize) -> Option<String> {
        let b = i / BLOCK;
        let mut pos = *self.block_at.get(b)? as usize;
        let mut name = Vec::new();
        for j in b * BLOCK..=i {
            pos = self.next_name(j, pos, &mut name)?;
        }
        Some(String::from_utf8_lossy(&name).into_owned())
    }

    /// Decodes name `i` (stored at `pos`) over `name`, which holds name
    /// `i - 1` unless `i` starts a block; returns where the next one is.
    fn next_name(&self, i: usize, mut pos: usize, name: &mut Vec<u8>) -> Option<usize> {
        if i.is_multiple_of(BLOCK) {
            name.clear();
        } else {
            let shared = get_len(&self.names, &mut pos)?;
            if shared > name.len() {
                return None;
            }
            name.truncate(shared);
        }
        let rest = get_len(&self.names, &mut pos)?;
        let end = pos.checked_add(rest)?;
        name.extend_from_slice(self.names.get(pos..end)?);
        Some(end)
    }

    /// Appends the table as one flat byte string (little-endian): base,
    /// count, block count, names length, then the four arrays.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len());
        self.encode_to(out).expect("writing to a Vec cannot fail");
    }

    /// Length of what [`Self::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        8 + 3 * 4 + (self.offsets.len() + self.sizes.len() + self.block_at.len()) * 4 + self.names.len()
    }

    /// [`Self::encode`] into a writer (a file, without a copy of the table
    /// in memory).
    pub fn encode_to(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        w.write_all(&self.base.to_le_bytes())?;
        for n in [self.offsets.len(), self.block_at.len(), self.names.len()] {
            w.write_all(&(n as u32).to_le_bytes())?;
        }
        let mut buf = [0u8; 4096];
        for a in [&self.offsets, &self.sizes, &self.block_at] {
            for chunk in a.chunks(buf.len() / 4) {
                for (b, v) in buf.chunks_exact_mut(4).zip(chunk) {
                    b.copy_from_slice(&v.to_le_bytes());
                }
                w.write_all(&buf[..chunk.len() * 4])?;
            }
        }
        w.write_all(&self.names)
    }

    /// Reads what [`Self::encode`] wrote, all of `bytes`. Every length,
    /// the address order and every name (lengths in bounds, UTF-8) are
    /// checked.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        Self::decode_with(bytes, |names| Section::boxed(names.to_vec()))
    }

    /// [`Self::decode`] of `file[range]`, the names left in place in the
    /// file's mapping (the arrays, a tenth of the bytes, are copied).
    pub fn decode_mapped(file: &MappedFile, range: Range<usize>) -> Result<Self, DecodeError> {
        let bytes = file.bytes().get(range.clone()).ok_or(DecodeError("range outside the file"))?;
        Self::decode_with(bytes, |names| {
            let at = names.as_ptr() as usize - bytes.as_ptr() as usize + range.start;
            Section::in_place(file.0.clone(), at..at + names.len())
        })
    }

    fn decode_with(bytes: &[u8], names_of: impl FnOnce(&[u8]) -> Section) -> Result<Self, DecodeError> {
        let mut r = Cursor { bytes, pos: 0 };
        let base = r.u64()?;
        let count = r.u32()? as usize;
        let blocks = r.u32()? as usize;
        let names_len = r.u32()? as usize;
        if blocks != count.div_ceil(BLOCK) {
            return Err(DecodeError("block count does not match the symbol count"));
        }
        let offsets = r.u32s(count)?;
        let sizes = r.u32s(count)?;
        let block_at = r.u32s(blocks)?;
        let names = names_of(r.take(names_len)?);
        if r.pos != bytes.len() {
            return Err(DecodeError("bytes after the names"));
        }
        if offsets.windows(2).any(|w| w[0] >= w[1]) {
            return Err(DecodeError("addresses out of order"));
        }
        if base.checked_add(u64::from(offsets.last().copied().unwrap_or(0))).is_none() {
            return Err(DecodeError("address overflows"));
        }
        let t = SymbolTable { base, offsets, sizes, block_at, names };
        // Walk every name once: lengths in bounds, blocks where the index
        // says, UTF-8 (as `build` stores only that).
        let mut name = Vec::new();
        let mut pos = 0;
        for i in 0..count {
            if i.is_multiple_of(BLOCK) && t.block_at[i / BLOCK] as usize != pos {
                return Err(DecodeError("block index does not match the names"));
            }
            pos = t.next_name(i, pos, &mut name).ok_or(DecodeError("a name runs past the end"))?;
            if std::str::from_utf8(&name).is_err() || name.len() > MAX_NAME {
                return Err(DecodeError("a name is not UTF-8 or too long"));
            }
        }
        if pos != t.names.len() {
            return Err(DecodeError("bytes after the last name"));
        }
        Ok(t)
    }
}

/// Front-codes the names of `raw` (in order) into `out`'s names and block
/// starts, or only measures them when `out` is `None`. Returns how many
/// symbols fit (names stop short of 4 GiB, which no real file has) and
/// the names' length in bytes.
fn front_code(raw: &[RawSymbol<'_>], mut out: Option<(&mut Vec<u8>, &mut Vec<u32>)>) -> (usize, usize) {
    let mut len = 0usize;
    let mut prev: Vec<u8> = Vec::new();
    for (i, s) in raw.iter().enumerate() {
        let name = String::from_utf8_lossy(s.name);
        let mut cut = name.len().min(MAX_NAME);
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        let name = &name.as_bytes()[..cut];
        if len + name.len() + 8 > u32::MAX as usize {
            return (i, len);
        }
        let shared = if i.is_multiple_of(BLOCK) {
            if let Some((_, block_at)) = &mut out {
                block_at.push(len as u32);
            }
            0
        } else {
            prev.iter().zip(name).take_while(|(a, b)| a == b).count()
        };
        if !i.is_multiple_of(BLOCK) {
            len += leb_len(shared);
        }
        len += leb_len(name.len() - shared) + name.len() - shared;
        if let Some((names, _)) = &mut out {
            if !i.is_multiple_of(BLOCK) {
                put_len(names, shared);
            }
            put_len(names, name.len() - shared);
            names.extend_from_slice(&name[shared..]);
            debug_assert_eq!(names.len(), len);
        }
        prev.clear();
        prev.extend_from_slice(name);
    }
    (raw.len(), len)
}

/// Bytes [`put_len`] writes for `n`.
fn leb_len(n: usize) -> usize {
    (usize::BITS - (n | 1).leading_zeros()).div_ceil(7) as usize
}

fn put_len(out: &mut Vec<u8>, mut n: usize) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// LEB128 length at `*pos` (at most 3 bytes: names are under 2 MiB).
fn get_len(bytes: &[u8], pos: &mut usize) -> Option<usize> {
    let mut n = 0usize;
    for shift in [0, 7, 14] {
        let b = *bytes.get(*pos)?;
        *pos += 1;
        n |= usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(n);
        }
    }
    None
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or(DecodeError("truncated"))?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn u32s(&mut self, n: usize) -> Result<Box<[u32]>, DecodeError> {
        let bytes = self.take(n.checked_mul(4).ok_or(DecodeError("count overflows"))?)?;
        Ok(bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(start: u64, size: u64, name: &'static str, rank: u8) -> RawSymbol<'static> {
        RawSymbol { start, size, name: name.as_bytes(), rank }
    }

    fn name_at(t: &SymbolTable, vaddr: u64) -> Option<(String, u64)> {
        t.lookup(vaddr)
    }

    #[test]
    fn sized_unsized_and_aliases() {
        let t = SymbolTable::build(vec![
            raw(0x2000, 0, "open_ended", 0),
            raw(0x1000, 0x10, "weak_alias", 1),
            raw(0x1000, 0x10, "strong", 0),
            raw(0x1100, 0x20, "other", 2),
        ]);
        assert_eq!(t.len(), 3);
        assert_eq!(name_at(&t, 0x0fff), None);
        assert_eq!(name_at(&t, 0x1000), Some(("strong".into(), 0x1000)));
        assert_eq!(name_at(&t, 0x100f), Some(("strong".into(), 0x1000)));
        assert_eq!(name_at(&t, 0x1010), None, "past the sized symbol's end");
        assert_eq!(name_at(&t, 0x111f), Some(("other".into(), 0x1100)));
        assert_eq!(name_at(&t, 0x9999), Some(("open_ended".into(), 0x2000)));
        assert!(t.heap_bytes() >= 3 * 8);
        assert_eq!(SymbolTable::build(Vec::new()).lookup(0), None);
    }

    /// Many names over several blocks, long ones (multi-byte lengths) and
    /// shared prefixes: every name reads back, by lookup and by iter, and
    /// the flat encoding round-trips.
    #[test]
    fn front_coded_names_round_trip_and_encode() {
        let long = "_ZN4core3fmt".repeat(30);
        let names: Vec<String> = (0..100)
            .map(|i| match i % 4 {
                0 => format!("{long}{i}"),
                1 => format!("_ZN4core3fmt5write{i}h"),
                2 => format!("été_{i}"),
                _ => format!("f{i}"),
            })
            .collect();
        let t = SymbolTable::build(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| RawSymbol { start: 0x40_0000 + i as u64 * 16, size: 16, name: n.as_bytes(), rank: 0 })
                .collect(),
        );
        assert_eq!(t.len(), 100);
        for (i, n) in names.iter().enumerate() {
            assert_eq!(t.lookup(0x40_0000 + i as u64 * 16 + 3), Some((n.clone(), 0x40_0000 + i as u64 * 16)));
        }
        let listed: Vec<String> = t.iter().map(|s| s.2).collect();
        assert_eq!(listed, names);
        let plain: usize = names.iter().map(|n| n.len()).sum();
        assert!(t.names.len() < plain, "front coding saves bytes: {} of {plain}", t.names.len());
        let mut bytes = Vec::new();
        t.encode(&mut bytes);
        assert_eq!(bytes.len(), t.encoded_len());
        assert_eq!(SymbolTable::decode(&bytes), Ok(t.clone()));
        // Read in place from a mapped file (after other bytes, as in the
        // on-disk cache): the same table, its names off the heap.
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, b"header").unwrap();
        std::io::Write::write_all(&mut f, &bytes).unwrap();
        let file = MappedFile::open(&f).unwrap();
        let mapped = SymbolTable::decode_mapped(&file, 6..6 + bytes.len()).unwrap();
        assert_eq!(mapped, t);
        assert_eq!(mapped.lookup(0x40_0000 + 3), t.lookup(0x40_0000 + 3));
        assert_eq!(mapped.mapped_bytes(), t.names.len());
        assert_eq!(mapped.heap_bytes() + mapped.mapped_bytes(), t.heap_bytes());
        assert_eq!(t.mapped_bytes(), 0);
        assert!(SymbolTable::decode_mapped(&file, 5..6 + bytes.len()).is_err(), "shifted by a byte");
        assert!(SymbolTable::decode_mapped(&file, 6..7 + bytes.len()).is_err(), "past the file's end");
        // Every truncation and every single-byte change is refused or
        // reads as some table, never a panic.
        for cut in 0..bytes.len() {
            assert!(SymbolTable::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0xa5;
            if let Ok(t) = SymbolTable::decode(&bad) {
                let _ = t.iter().count();
                let _ = t.lookup(0x40_0010);
            }
        }
    }
}
