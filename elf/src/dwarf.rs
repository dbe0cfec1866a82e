//! DWARF line tables and inlined-function chains of one ELF file, through
//! `addr2line` (gimli).
//!
//! Uncompressed debug sections are read in place from the file's mapping,
//! which the result keeps alive (no copy: a 100 MB binary's 79 MB of DWARF
//! cost only the pages a lookup touches); `SHF_COMPRESSED` ones are
//! decompressed into the heap. Both sizes are reported
//! ([`DwarfLines::mapped_bytes`], [`DwarfLines::heap_bytes`]); addr2line
//! parses units lazily, on the first lookup that lands in them.

use std::ops::{Deref, Range};
use std::sync::Arc;

use gimli::{EndianSlice, RunTimeEndian};

use crate::Bytes;

/// Slices of the sections `DwarfLines::sections` keeps alive: a plain
/// slice reader, so addr2line's parsing does no reference counting per
/// read (an `Arc`-backed reader costs an atomic increment and decrement for
/// every sub-slice, ~2% of a first use in the profile).
type Reader = EndianSlice<'static, RunTimeEndian>;

/// One debug section's bytes: a range of the shared file mapping, or a
/// decompressed copy.
#[derive(Clone)]
pub(crate) struct Section(Backing);

#[derive(Clone)]
enum Backing {
    InPlace(Arc<Bytes>, Range<usize>),
    Owned(Arc<[u8]>),
}

impl Section {
    /// `range` must lie within `file` (checked by the caller; a bad range
    /// reads as empty rather than panic).
    pub(crate) fn in_place(file: Arc<Bytes>, range: Range<usize>) -> Self {
        let range = if range.end <= file.get().len() && range.start <= range.end { range } else { 0..0 };
        Section(Backing::InPlace(file, range))
    }

    pub(crate) fn owned(bytes: Vec<u8>) -> Self {
        Section(Backing::Owned(Arc::from(bytes)))
    }

    fn is_in_place(&self) -> bool {
        matches!(self.0, Backing::InPlace(..))
    }
}

impl Deref for Section {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Backing::InPlace(file, range) => &file.get()[range.clone()],
            Backing::Owned(bytes) => bytes,
        }
    }
}

impl std::fmt::Debug for Section {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Section({} bytes, in place: {})", self.len(), self.is_in_place())
    }
}

/// One frame at an address: innermost inlined function first, the
/// function that holds the code last.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceFrame {
    /// Demangled function name (`None` when DWARF does not name it).
    pub function: Option<String>,
    /// The name as DWARF spells it (linkage name), when it differs.
    pub mangled: Option<String>,
    pub file: Option<String>,
    pub line: u32,
}

/// Line and inline information of one file.
pub struct DwarfLines {
    /// addr2line fills its lazily parsed units through `&self` (not
    /// `Sync`): one lookup at a time per file.
    /// Declared before `sections`: dropped first, while its slices are valid.
    ctx: std::sync::Mutex<addr2line::Context<Reader>>,
    /// What the `'static` slices in `ctx` point into; never mutated.
    _sections: Vec<Section>,
    /// Decompressed section bytes on the heap.
    heap: usize,
    /// Section bytes read in place from the file mapping.
    mapped: usize,
}

impl DwarfLines {
    /// `section(name)` gives a debug section (in place or decompressed),
    /// or `None` when the file lacks it. `None` when there is no
    /// `.debug_info` or it does not parse.
    pub(crate) fn load(big_endian: bool, mut section: impl FnMut(&str) -> Option<Section>) -> Option<Self> {
        let endian = if big_endian { RunTimeEndian::Big } else { RunTimeEndian::Little };
        let (mut heap, mut mapped) = (0usize, 0usize);
        let mut has_info = false;
        let mut sections = Vec::new();
        let dwarf = gimli::Dwarf::load(|id: gimli::SectionId| -> Result<Reader, gimli::Error> {
            let data = section(id.name()).unwrap_or_else(|| Section::owned(Vec::new()));
            if id == gimli::SectionId::DebugInfo && !data.is_empty() {
                has_info = true;
            }
            if data.is_in_place() {
                mapped += data.len();
            } else {
                heap += data.len();
            }
            // SAFETY: the bytes live behind an `Arc` (a read-only mapping or
            // a boxed slice) that `sections` holds for as long as `ctx`,
            // which is dropped first; an `Arc`'s target never moves and
            // neither backing is ever written, so the slice stays valid.
            let bytes: &'static [u8] = unsafe { std::slice::from_raw_parts(data.as_ptr(), data.len()) };
            sections.push(data);
            Ok(EndianSlice::new(bytes, endian))
        })
        .ok()?;
        if !has_info {
            return None;
        }
        let ctx = addr2line::Context::from_dwarf(dwarf).ok()?;
        Some(DwarfLines { ctx: std::sync::Mutex::new(ctx), _sections: sections, heap, mapped })
    }

    /// Bytes of decompressed debug sections on the heap (parsed units add
    /// to this as they are used; addr2line does not report them).
    pub fn heap_bytes(&self) -> usize {
        self.heap
    }

    /// Bytes of debug sections read in place from the file mapping: file
    /// pages the kernel keeps resident as lookups touch them and may
    /// reclaim under pressure.
    pub fn mapped_bytes(&self) -> usize {
        self.mapped
    }

    /// Frames at `vaddr`, innermost first; empty when no unit covers it.
    /// Names are demangled by the unit's language (Rust, C++).
    pub fn frames(&self, vaddr: u64) -> Vec<SourceFrame> {
        let mut out = Vec::new();
        let ctx = self.ctx.lock().unwrap_or_else(|p| p.into_inner());
        let Ok(mut frames) = ctx.find_frames(vaddr).skip_all_loads() else {
            return out;
        };
        // A broken unit yields an error part-way: keep what came before it.
        while let Ok(Some(f)) = frames.next() {
            let (function, mangled) = match &f.function {
                Some(name) => {
                    let raw = name.raw_name().ok().map(|c| c.into_owned());
                    let demangled = name.demangle().ok().map(|c| c.into_owned());
                    let mangled = raw.filter(|r| Some(r) != demangled.as_ref());
                    (demangled, mangled)
                }
                None => (None, None),
            };
            let (file, line) = match f.location {
                Some(l) => (l.file.map(str::to_owned), l.line.unwrap_or(0)),
                None => (None, 0),
            };
            out.push(SourceFrame { function, mangled, file, line });
            if out.len() >= MAX_INLINE_DEPTH {
                break;
            }
        }
        out
    }
}

/// Deepest inline chain kept at one address (malformed DWARF can loop).
pub(crate) const MAX_INLINE_DEPTH: usize = 64;
