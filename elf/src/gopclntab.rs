//! Go's own symbol table, `.gopclntab` (the runtime's `pcHeader` and what
//! follows it), for Go binaries stripped of `.symtab` and DWARF
//! (`go build -ldflags='-s -w'`): the runtime needs it for tracebacks, so
//! no strip removes it.
//!
//! Read: the Go 1.18/1.19 layout (magic `0xfffffff0`) and the Go 1.20+ one
//! (`0xfffffff1`, `_func.startLine` added); older tables are an error.
//! Per function: its name, and per PC the file and line of the code
//! there (the `pcfile`/`pcln` value tables), which is what `go tool
//! addr2line` prints. Inlined calls are not expanded: their code carries
//! the callee's file and line under the caller's name (the inline tree,
//! `FUNCDATA_InlTree`, sits in `go:func.*`, reached only through
//! `runtime.moduledata`).
//!
//! The table is found by section name, or, with the section headers gone,
//! by its magic in a read-only `PT_LOAD` segment (checked field by field).
//! Its bytes are copied out: the result outlives the file's mapping and
//! every read in it is bounds-checked (bad input is `None`, never a panic).

/// Go 1.18 and 1.19.
const MAGIC_118: u32 = 0xffff_fff0;
/// Go 1.20 and later.
const MAGIC_120: u32 = 0xffff_fff1;

/// Why a `.gopclntab` could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GoTableError {
    #[error("no Go pclntab header (magic {0:#x}; Go 1.18 or later is read)")]
    Magic(u32),
    #[error("malformed Go pclntab: {0}")]
    Malformed(&'static str),
}

/// A Go binary's function table and PC → file:line tables.
pub struct GoLineTable {
    data: Box<[u8]>,
    big_endian: bool,
    go120: bool,
    ptr_size: usize,
    quantum: u64,
    nfunc: usize,
    text_start: u64,
    funcnames: usize,
    cutab: usize,
    filetab: usize,
    pctab: usize,
    /// `functab`: `nfunc` (entryoff, funcoff) pairs and the end offset;
    /// `funcoff` is relative to this too.
    functab: usize,
}

/// What the table says about one PC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoFrame<'a> {
    /// As Go spells it: `main.work`, `main.(*T).Run`, `runtime.main`.
    pub function: &'a str,
    /// Entry address of the function.
    pub entry: u64,
    /// Source file and line of the instruction (of the inlined callee when
    /// the instruction came from one); empty / 0 when the table has none.
    pub file: &'a str,
    pub line: u32,
}

impl GoLineTable {
    /// Parses a table starting at `data[0]` (trailing bytes are ignored).
    /// `text_fallback` is the `.text` address used when the header's
    /// `textStart` is 0 (a PIE binary, where it is relocated at load).
    pub fn parse(data: Vec<u8>, big_endian: bool, text_fallback: Option<u64>) -> Result<Self, GoTableError> {
        let mut t = GoLineTable {
            data: data.into_boxed_slice(),
            big_endian,
            go120: false,
            ptr_size: 8,
            quantum: 1,
            nfunc: 0,
            text_start: 0,
            funcnames: 0,
            cutab: 0,
            filetab: 0,
            pctab: 0,
            functab: 0,
        };
        let magic = t.u32_at(0).ok_or(GoTableError::Malformed("shorter than its header"))?;
        t.go120 = match magic {
            MAGIC_118 => false,
            MAGIC_120 => true,
            m => return Err(GoTableError::Magic(m)),
        };
        let head = t.data.get(4..8).ok_or(GoTableError::Malformed("shorter than its header"))?;
        let (pad, min_lc, ptr_size) = ((head[0], head[1]), head[2], head[3]);
        if pad != (0, 0) || !matches!(min_lc, 1 | 2 | 4) || !matches!(ptr_size, 4 | 8) {
            return Err(GoTableError::Malformed("header fields (padding, instruction size, pointer size)"));
        }
        t.quantum = u64::from(min_lc);
        t.ptr_size = usize::from(ptr_size);
        let word = |i: usize| t.word_at(8 + i * t.ptr_size).ok_or(GoTableError::Malformed("shorter than its header"));
        let nfunc = word(0)?;
        let text_start = word(2)?;
        let offsets = [word(3)?, word(4)?, word(5)?, word(6)?, word(7)?];
        let len = t.data.len() as u64;
        if offsets.iter().any(|&o| o == 0 || o >= len) {
            return Err(GoTableError::Malformed("a table offset lies outside the data"));
        }
        let to_usize = |v: u64| usize::try_from(v).map_err(|_| GoTableError::Malformed("offset"));
        t.funcnames = to_usize(offsets[0])?;
        t.cutab = to_usize(offsets[1])?;
        t.filetab = to_usize(offsets[2])?;
        t.pctab = to_usize(offsets[3])?;
        t.functab = to_usize(offsets[4])?;
        // (nfunc pairs + the end offset) of u32 must fit.
        if nfunc == 0 || nfunc > (len - offsets[4]) / 8 {
            return Err(GoTableError::Malformed("function count does not fit the function table"));
        }
        t.nfunc = to_usize(nfunc)?;
        t.text_start = match (text_start, text_fallback) {
            (0, Some(t)) => t,
            (0, None) => return Err(GoTableError::Malformed("textStart is 0 (PIE) and no .text section")),
            (t, _) => t,
        };
        Ok(t)
    }

    /// Number of functions.
    pub fn len(&self) -> usize {
        self.nfunc
    }

    pub fn is_empty(&self) -> bool {
        self.nfunc == 0
    }

    /// Bytes held (the copied table).
    pub fn heap_bytes(&self) -> usize {
        self.data.len()
    }

    /// Function name, entry, file and line at virtual address `vaddr`;
    /// `None` outside every function or where the table is inconsistent.
    pub fn lookup(&self, vaddr: u64) -> Option<GoFrame<'_>> {
        let rel = u32::try_from(vaddr.checked_sub(self.text_start)?).ok()?;
        let end = self.u32_at(self.functab + self.nfunc * 8)?;
        if rel >= end {
            return None;
        }
        // The last function whose entry offset is <= rel.
        let (mut lo, mut hi) = (0usize, self.nfunc);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.u32_at(self.functab + mid * 8)? <= rel {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let i = lo.checked_sub(1)?;
        let funcoff = self.u32_at(self.functab + i * 8 + 4)? as usize;
        let f = self.functab.checked_add(funcoff)?;
        let entry_off = self.u32_at(f)?;
        let entry = self.text_start.checked_add(u64::from(entry_off))?;
        let name_off = self.u32_at(f + 4)? as usize;
        let function = self.cstr(self.funcnames.checked_add(name_off)?)?;
        let pcfile = self.u32_at(f + 20)?;
        let pcln = self.u32_at(f + 24)?;
        let cu = self.u32_at(f + 32)? as usize;
        let (mut file, mut line) = ("", 0);
        if let Some(l) = self.pc_value(pcln, entry, vaddr) {
            line = u32::try_from(l).unwrap_or(0);
        }
        if let Some(fno) = self.pc_value(pcfile, entry, vaddr).and_then(|v| usize::try_from(v).ok()) {
            let file_off = self.u32_at(self.cutab.checked_add(cu.checked_add(fno)?.checked_mul(4)?)?)?;
            if file_off != u32::MAX {
                file = self.cstr(self.filetab.checked_add(file_off as usize)?).unwrap_or("");
            }
        }
        Some(GoFrame { function, entry, file, line })
    }

    /// Every function as (entry, name), in address order (for tools and
    /// tests).
    pub fn functions(&self) -> impl Iterator<Item = (u64, &str)> + '_ {
        (0..self.nfunc).filter_map(move |i| {
            let funcoff = self.u32_at(self.functab + i * 8 + 4)? as usize;
            let f = self.functab.checked_add(funcoff)?;
            let entry = self.text_start.checked_add(u64::from(self.u32_at(f)?))?;
            let name = self.cstr(self.funcnames.checked_add(self.u32_at(f + 4)? as usize)?)?;
            Some((entry, name))
        })
    }

    /// The value a pc-value table (`pcfile`, `pcln`) gives `target` in the
    /// function entered at `entry`: pairs of (zig-zag value delta, PC
    /// delta in instruction quanta), the value starting at −1.
    fn pc_value(&self, table: u32, entry: u64, target: u64) -> Option<i32> {
        let mut p = self.pctab.checked_add(table as usize)?;
        let (mut pc, mut val) = (entry, -1i32);
        let mut first = true;
        loop {
            let uv = self.uvarint(&mut p)?;
            if uv == 0 && !first {
                return None;
            }
            first = false;
            let delta = (if uv & 1 != 0 { !(uv >> 1) } else { uv >> 1 }) as i32;
            let pc_delta = u64::from(self.uvarint(&mut p)?) * self.quantum;
            pc = pc.checked_add(pc_delta)?;
            val = val.wrapping_add(delta);
            if target < pc {
                return Some(val);
            }
        }
    }

    fn uvarint(&self, p: &mut usize) -> Option<u32> {
        let mut v = 0u32;
        for shift in (0..35).step_by(7) {
            let b = *self.data.get(*p)?;
            *p += 1;
            v |= u32::from(b & 0x7f).checked_shl(shift)?;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn u32_at(&self, at: usize) -> Option<u32> {
        let b: [u8; 4] = self.data.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(if self.big_endian { u32::from_be_bytes(b) } else { u32::from_le_bytes(b) })
    }

    fn word_at(&self, at: usize) -> Option<u64> {
        if self.ptr_size == 4 {
            return self.u32_at(at).map(u64::from);
        }
        let b: [u8; 8] = self.data.get(at..at.checked_add(8)?)?.try_into().ok()?;
        Some(if self.big_endian { u64::from_be_bytes(b) } else { u64::from_le_bytes(b) })
    }

    /// The NUL-terminated UTF-8 string at `at` (at most 64 KiB long).
    fn cstr(&self, at: usize) -> Option<&str> {
        let rest = self.data.get(at..)?;
        let rest = &rest[..rest.len().min(64 << 10)];
        let nul = rest.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&rest[..nul]).ok()
    }
}

/// Candidates whose first 8 bytes look like a header but that are parsed
/// in full before the scan gives up (each parse copies the rest of the
/// segment: a file full of fake headers costs at most this many copies).
const MAX_CANDIDATES: usize = 16;

/// Where, in `segment` (bytes of a read-only `PT_LOAD` segment), a pcHeader
/// starts: the magic at an 8-byte boundary whose header parses. The
/// linker aligns `runtime.pclntab`, so unaligned hits are not looked at.
pub(crate) fn find_header(segment: &[u8], big_endian: bool, text_fallback: Option<u64>) -> Option<usize> {
    let magics = if big_endian {
        [MAGIC_118.to_be_bytes(), MAGIC_120.to_be_bytes()]
    } else {
        [MAGIC_118.to_le_bytes(), MAGIC_120.to_le_bytes()]
    };
    (0..segment.len().saturating_sub(64))
        .step_by(8)
        .filter(|&at| {
            let head = &segment[at..at + 8];
            magics.iter().any(|m| head[..4] == m[..])
                && head[4] == 0
                && head[5] == 0
                && matches!(head[6], 1 | 2 | 4)
                && matches!(head[7], 4 | 8)
        })
        .take(MAX_CANDIDATES)
        .find(|&at| {
            GoLineTable::parse(segment[at..].to_vec(), big_endian, text_fallback)
                .is_ok_and(|t| t.lookup_first().is_some())
        })
}

impl GoLineTable {
    /// The first function, named: a candidate header found by its magic
    /// must lead to a real function table.
    fn lookup_first(&self) -> Option<GoFrame<'_>> {
        let entry = self.text_start.checked_add(u64::from(self.u32_at(self.functab)?))?;
        self.lookup(entry).filter(|f| !f.function.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-made 64-bit little-endian Go 1.20 table of two functions.
    fn table() -> Vec<u8> {
        let mut d = vec![0u8; 8 + 8 * 8];
        d[..4].copy_from_slice(&MAGIC_120.to_le_bytes());
        d[6] = 1;
        d[7] = 8;
        let put = |d: &mut Vec<u8>, i: usize, v: u64| d[8 + i * 8..16 + i * 8].copy_from_slice(&v.to_le_bytes());
        // funcnames
        let funcnames = d.len();
        d.extend_from_slice(b"main.a\0main.b\0");
        // cutab: one CU of one file (offset 0 into filetab)
        let cutab = d.len();
        d.extend_from_slice(&0u32.to_le_bytes());
        let filetab = d.len();
        d.extend_from_slice(b"/src/a.go\0");
        // pctab: offset 0 unused; pcln at 1: line 10 for 4 bytes, 12 for 4;
        // pcfile at 6: file 0 for 8 bytes.
        let pctab = d.len();
        d.push(0);
        d.extend_from_slice(&[22, 4, 4, 4, 0]); // -1+11=10 @4, +2=12 @8, end
        d.extend_from_slice(&[2, 8, 0]); // -1+1=0 @8, end
        while !d.len().is_multiple_of(4) {
            d.push(0);
        }
        let functab = d.len();
        // two functions at text+0x0 and text+0x8, end at 0x10; _func at 24 and 68
        for (entry, funcoff) in [(0u32, 24u32), (8, 68)] {
            d.extend_from_slice(&entry.to_le_bytes());
            d.extend_from_slice(&funcoff.to_le_bytes());
        }
        d.extend_from_slice(&0x10u32.to_le_bytes());
        d.resize(functab + 24, 0);
        for (entry, name) in [(0u32, 0u32), (8, 7)] {
            let f = d.len();
            assert!(f == functab + 24 || f == functab + 68);
            let mut func = [0u32; 11];
            func[0] = entry;
            func[1] = name;
            func[5] = 6; // pcfile
            func[6] = 1; // pcln
            for v in func {
                d.extend_from_slice(&v.to_le_bytes());
            }
        }
        for (i, v) in [2, 0, 0x401000, funcnames, cutab, filetab, pctab, functab].into_iter().enumerate() {
            put(&mut d, i, v as u64);
        }
        d
    }

    #[test]
    fn names_files_and_lines() {
        let t = GoLineTable::parse(table(), false, None).unwrap();
        assert_eq!(t.len(), 2);
        let at = |v| t.lookup(v).map(|f| (f.function, f.entry, f.file, f.line));
        assert_eq!(at(0x400fff), None);
        assert_eq!(at(0x401000), Some(("main.a", 0x401000, "/src/a.go", 10)));
        assert_eq!(at(0x401005), Some(("main.a", 0x401000, "/src/a.go", 12)));
        assert_eq!(at(0x401008), Some(("main.b", 0x401008, "/src/a.go", 10)));
        assert_eq!(at(0x401010), None, "past the end offset");
        assert_eq!(t.functions().collect::<Vec<_>>(), vec![(0x401000, "main.a"), (0x401008, "main.b")]);
        let mut seg = vec![0xffu8; 64];
        seg.extend_from_slice(&table());
        assert_eq!(find_header(&seg, false, None), Some(64));
    }

    #[test]
    fn bad_tables_are_errors_not_panics() {
        assert_eq!(
            GoLineTable::parse(vec![0; 3], false, None).err(),
            Some(GoTableError::Malformed("shorter than its header"))
        );
        assert!(matches!(
            GoLineTable::parse(vec![0xfb, 0xff, 0xff, 0xff, 0, 0, 1, 8], false, None),
            Err(GoTableError::Magic(_))
        ));
        let good = table();
        // Every truncation and every single-byte corruption: no panic.
        for n in 0..good.len() {
            if let Ok(t) = GoLineTable::parse(good[..n].to_vec(), false, None) {
                for a in 0x400ff0..0x401020 {
                    let _ = t.lookup(a);
                }
            }
        }
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0xa5;
            if let Ok(t) = GoLineTable::parse(bad, false, Some(0x401000)) {
                for a in 0x400ff0..0x401020 {
                    let _ = t.lookup(a);
                }
                let _ = t.functions().count();
            }
        }
    }
}
