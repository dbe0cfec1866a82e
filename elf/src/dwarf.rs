//! DWARF line tables and inlined-function chains of one ELF file, through
//! `addr2line` (gimli).
//!
//! The debug sections are copied out of the mapping (decompressed when
//! `SHF_COMPRESSED`), so the result outlives the file's mapping and its
//! size is known ([`DwarfLines::heap_bytes`]); addr2line parses units
//! lazily, on the first lookup that lands in them.

use std::sync::Arc;

use gimli::{EndianArcSlice, RunTimeEndian};

type Reader = EndianArcSlice<RunTimeEndian>;

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
    ctx: std::sync::Mutex<addr2line::Context<Reader>>,
    bytes: usize,
}

impl DwarfLines {
    /// `section(name)` gives a debug section's bytes (already decompressed),
    /// or `None` when the file lacks it. `None` when there is no
    /// `.debug_info` or it does not parse.
    pub(crate) fn load(big_endian: bool, mut section: impl FnMut(&str) -> Option<Vec<u8>>) -> Option<Self> {
        let endian = if big_endian { RunTimeEndian::Big } else { RunTimeEndian::Little };
        let mut bytes = 0usize;
        let mut has_info = false;
        let dwarf = gimli::Dwarf::load(|id: gimli::SectionId| -> Result<Reader, gimli::Error> {
            let data = section(id.name()).unwrap_or_default();
            if id == gimli::SectionId::DebugInfo && !data.is_empty() {
                has_info = true;
            }
            bytes += data.len();
            Ok(EndianArcSlice::new(Arc::from(data), endian))
        })
        .ok()?;
        if !has_info {
            return None;
        }
        let ctx = addr2line::Context::from_dwarf(dwarf).ok()?;
        Some(DwarfLines { ctx: std::sync::Mutex::new(ctx), bytes })
    }

    /// Bytes of debug sections held (parsed units add to this as they are
    /// used; addr2line does not report them).
    pub fn heap_bytes(&self) -> usize {
        self.bytes
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
pub const MAX_INLINE_DEPTH: usize = 64;
