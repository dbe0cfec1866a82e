//! Function symbols of one ELF file, held compactly for address lookups.
//!
//! Built once from `.symtab` and `.dynsym`: only defined `STT_FUNC` /
//! `STT_GNU_IFUNC` symbols with an address are kept, sorted by address,
//! one per address (a global name wins over a weak or local alias). Each
//! symbol costs 16 bytes (address, size, name offset) plus its name bytes
//! as the file spells them (mangled); names are demangled on lookup, by the
//! caller that memoizes results, not here.

/// Longest name kept; longer ones are cut (at a char boundary).
pub const MAX_NAME: usize = 4096;

/// Immutable function-symbol table in the file's own virtual addresses.
#[derive(Debug, Default, Clone)]
pub struct SymbolTable {
    starts: Box<[u64]>,
    /// `st_size`, saturated to u32; 0 = unknown (covers up to the next symbol).
    sizes: Box<[u32]>,
    /// Name `i` is `names[name_at[i]..name_at[i + 1]]`.
    name_at: Box<[u32]>,
    names: Box<[u8]>,
}

/// One symbol being collected, before sorting.
pub(crate) struct RawSymbol<'a> {
    pub start: u64,
    pub size: u64,
    pub name: &'a [u8],
    /// 0 global, 1 weak, 2 local: the lowest wins among aliases.
    pub rank: u8,
}

impl SymbolTable {
    pub(crate) fn build(mut raw: Vec<RawSymbol<'_>>) -> Self {
        raw.sort_unstable_by(|a, b| a.start.cmp(&b.start).then(a.rank.cmp(&b.rank)).then(b.size.cmp(&a.size)));
        raw.dedup_by_key(|s| s.start);
        let bytes: usize = raw.iter().map(|s| s.name.len().min(MAX_NAME)).sum();
        let mut names = Vec::with_capacity(bytes);
        let mut name_at = Vec::with_capacity(raw.len() + 1);
        let mut starts = Vec::with_capacity(raw.len());
        let mut sizes = Vec::with_capacity(raw.len());
        for s in &raw {
            let name = String::from_utf8_lossy(s.name);
            let mut cut = name.len().min(MAX_NAME);
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            if names.len() + cut > u32::MAX as usize {
                break; // 4 GiB of names: not a real file
            }
            name_at.push(names.len() as u32);
            names.extend_from_slice(&name.as_bytes()[..cut]);
            starts.push(s.start);
            sizes.push(u32::try_from(s.size).unwrap_or(u32::MAX));
        }
        name_at.push(names.len() as u32);
        SymbolTable { starts: starts.into(), sizes: sizes.into(), name_at: name_at.into(), names: names.into() }
    }

    pub fn len(&self) -> usize {
        self.starts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// Bytes this table holds on the heap.
    pub fn heap_bytes(&self) -> usize {
        self.starts.len() * 8 + self.sizes.len() * 4 + self.name_at.len() * 4 + self.names.len()
    }

    /// The function covering `vaddr` (its name as the file spells it) and
    /// its start address. A symbol with a size covers `[start, start+size)`;
    /// one without covers up to the next symbol.
    #[inline]
    pub fn lookup(&self, vaddr: u64) -> Option<(&str, u64)> {
        let i = self.starts.partition_point(|&s| s <= vaddr).checked_sub(1)?;
        let start = self.starts[i];
        let size = self.sizes[i];
        if size != 0 && vaddr - start >= u64::from(size) {
            return None;
        }
        Some((self.name(i), start))
    }

    /// Every symbol as (start, size, name), in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32, &str)> + '_ {
        (0..self.len()).map(|i| (self.starts[i], self.sizes[i], self.name(i)))
    }

    fn name(&self, i: usize) -> &str {
        let bytes = &self.names[self.name_at[i] as usize..self.name_at[i + 1] as usize];
        debug_assert!(std::str::from_utf8(bytes).is_ok());
        // SAFETY: `build` stores only valid UTF-8 (lossy-converted, cut at
        // char boundaries) and the blob is immutable afterwards.
        unsafe { std::str::from_utf8_unchecked(bytes) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(start: u64, size: u64, name: &'static str, rank: u8) -> RawSymbol<'static> {
        RawSymbol { start, size, name: name.as_bytes(), rank }
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
        assert_eq!(t.lookup(0x0fff), None);
        assert_eq!(t.lookup(0x1000), Some(("strong", 0x1000)));
        assert_eq!(t.lookup(0x100f), Some(("strong", 0x1000)));
        assert_eq!(t.lookup(0x1010), None, "past the sized symbol's end");
        assert_eq!(t.lookup(0x111f), Some(("other", 0x1100)));
        assert_eq!(t.lookup(0x9999), Some(("open_ended", 0x2000)));
        assert!(t.heap_bytes() >= 3 * 16);
        assert_eq!(SymbolTable::build(Vec::new()).lookup(0), None);
    }
}
