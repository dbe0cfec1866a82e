//! DWARF line tables and inlined-function chains of one ELF file, read
//! with gimli by streaming, so that what stays on the heap between lookups
//! is a small index.
//!
//! Uncompressed debug sections are read in place from the file's mapping,
//! which the result keeps alive (no copy: a 100 MB binary's 79 MB of DWARF
//! cost only file pages a lookup touches, reclaimable page cache);
//! `SHF_COMPRESSED` ones are decompressed into the heap. Both sizes are
//! reported ([`DwarfLines::mapped_bytes`], [`DwarfLines::heap_bytes`]).
//!
//! At load, each compilation unit's address ranges (`DW_AT_ranges`, else
//! `.debug_aranges`, else `low_pc`/`high_pc`, else its line program's
//! sequences, the order addr2line uses) go into a sorted index: 32 bytes
//! per range (a unit's adjacent ranges merged) and 16 per unit, nothing
//! else. A lookup parses the covering
//! unit's header, streams its line program (keeping only the row that
//! covers each address, never a unit's rows) and its DIEs (the subprogram
//! holding each address, then that subprogram's inlined subroutines), and
//! drops it all. The answers are those of addr2line's `find_frames`;
//! [`DwarfLines::frames_many`] streams a unit once for all the addresses
//! of a batch that fall in it.

use std::ops::{Deref, Range};
use std::sync::Arc;

use gimli::{EndianSlice, RunTimeEndian};

use crate::Bytes;

/// Slices of the sections `DwarfLines` keeps alive: a plain slice
/// reader, so parsing does no reference counting per read (an `Arc`-backed reader costs an atomic increment and decrement for
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
    /// Declared before `sections`: dropped first, while its slices are valid.
    dwarf: gimli::Dwarf<Reader>,
    index: UnitIndex,
    /// What the `'static` slices in `dwarf` point into; never mutated.
    sections: Vec<(gimli::SectionId, Section)>,
    endian: RunTimeEndian,
    /// Decompressed section bytes on the heap.
    heap: usize,
    /// Section bytes read in place from the file mapping.
    mapped: usize,
}

type Unit = gimli::Unit<Reader>;
type UnitRef<'a> = gimli::UnitRef<'a, Reader>;
type UnitOffset = gimli::UnitOffset<usize>;

/// Compilation units by address: what a lookup needs to find the unit,
/// kept between lookups.
#[derive(Default)]
struct UnitIndex {
    /// Sorted by (end, unit), as addr2line keeps them: several units may
    /// cover one address and are tried in this order.
    ranges: Box<[UnitRange]>,
    /// Every unit but type units, by `.debug_info` offset (references
    /// into other units land in one of these).
    units: Box<[UnitEntry]>,
}

struct UnitRange {
    begin: u64,
    end: u64,
    /// Least `begin` of this and every later range: ends the search.
    min_begin: u64,
    unit: u32,
}

#[derive(Clone, Copy)]
struct UnitEntry {
    offset: usize,
    /// `DW_AT_language` of the root DIE (0: none), for demangling.
    lang: u16,
}

impl UnitIndex {
    /// Units covering `probe`, in the order addr2line tries them.
    fn find(&self, probe: u64) -> impl Iterator<Item = u32> + '_ {
        let pos = self.ranges.partition_point(|r| r.end <= probe);
        self.ranges[pos..]
            .iter()
            .take_while(move |r| probe >= r.min_begin)
            .filter(move |r| probe >= r.begin && probe < r.end)
            .map(|r| r.unit)
    }

    /// The unit holding `.debug_info` offset `offset` (not its header).
    fn containing(&self, offset: usize) -> Option<usize> {
        match self.units.binary_search_by_key(&offset, |u| u.offset) {
            Ok(_) | Err(0) => None,
            Err(i) => Some(i - 1),
        }
    }

    fn heap_bytes(&self) -> usize {
        self.ranges.len() * std::mem::size_of::<UnitRange>() + self.units.len() * std::mem::size_of::<UnitEntry>()
    }
}

/// `low_pc`/`high_pc`/`DW_AT_ranges` of one DIE.
#[derive(Default)]
struct RangeAttrs {
    low_pc: Option<u64>,
    high_pc: Option<u64>,
    size: Option<u64>,
    ranges_offset: Option<gimli::RangeListsOffset<usize>>,
}

impl RangeAttrs {
    /// Takes `attr` when it is one of the range attributes.
    fn read(&mut self, attr: &gimli::Attribute<Reader>, unit: UnitRef<'_>) -> gimli::Result<bool> {
        match attr.name() {
            gimli::DW_AT_low_pc => match attr.value() {
                gimli::AttributeValue::Addr(v) => self.low_pc = Some(v),
                gimli::AttributeValue::DebugAddrIndex(i) => self.low_pc = Some(unit.address(i)?),
                _ => {}
            },
            gimli::DW_AT_high_pc => match attr.value() {
                gimli::AttributeValue::Addr(v) => self.high_pc = Some(v),
                gimli::AttributeValue::DebugAddrIndex(i) => self.high_pc = Some(unit.address(i)?),
                gimli::AttributeValue::Udata(v) => self.size = Some(v),
                _ => {}
            },
            gimli::DW_AT_ranges => self.ranges_offset = unit.attr_ranges_offset(attr.value())?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Calls `f` with each non-empty range; whether there was one.
    fn for_each(&self, unit: UnitRef<'_>, mut f: impl FnMut(u64, u64)) -> gimli::Result<bool> {
        let mut any = false;
        let mut add = |begin: u64, end: u64| {
            if begin < end {
                f(begin, end);
                any = true;
            }
        };
        if let Some(offset) = self.ranges_offset {
            let mut list = unit.ranges(offset)?;
            while let Some(r) = list.next()? {
                add(r.begin, r.end);
            }
        } else if let (Some(begin), Some(end)) = (self.low_pc, self.high_pc) {
            add(begin, end);
        } else if let (Some(begin), Some(size)) = (self.low_pc, self.size) {
            // A -1 tombstone wraps to an empty range.
            add(begin, begin.wrapping_add(size));
        }
        Ok(any)
    }
}

/// One `DW_TAG_inlined_subroutine` holding an address.
#[derive(Clone, Copy)]
struct InlineHit {
    die: UnitOffset,
    call_file: Option<u64>,
    call_line: u32,
}

/// Where in the source one address is: (file index, line).
type Row = (u64, u32);

/// What one unit says of one address: `None` when it has neither a
/// subprogram nor a line row there (the next unit covering it is tried).
type UnitAnswer = Option<Vec<SourceFrame>>;

impl DwarfLines {
    /// `section(name)` gives a debug section (in place or decompressed),
    /// or `None` when the file lacks it. `None` when there is no
    /// `.debug_info` or it does not parse.
    pub(crate) fn load(big_endian: bool, mut section: impl FnMut(&str) -> Option<Section>) -> Option<Self> {
        let endian = if big_endian { RunTimeEndian::Big } else { RunTimeEndian::Little };
        let (mut heap, mut mapped) = (0usize, 0usize);
        let mut sections = Vec::new();
        let dwarf = load_dwarf(endian, |id| {
            let data = section(id.name()).unwrap_or_else(|| Section::owned(Vec::new()));
            if data.is_in_place() {
                mapped += data.len();
            } else {
                heap += data.len();
            }
            let bytes = static_slice(&data);
            sections.push((id, data));
            bytes
        })?;
        if gimli::Section::reader(&dwarf.debug_info).is_empty() {
            return None;
        }
        let index = build_index(&dwarf);
        if index.units.is_empty() {
            return None;
        }
        Some(DwarfLines { dwarf, index, sections, endian, heap, mapped })
    }

    /// Heap bytes held: decompressed debug sections and the unit index.
    /// Nothing else stays between lookups.
    pub fn heap_bytes(&self) -> usize {
        self.heap + self.index.heap_bytes()
    }

    /// Bytes of debug sections read in place from the file mapping: file
    /// pages the kernel keeps resident as lookups touch them and may
    /// reclaim under pressure.
    pub fn mapped_bytes(&self) -> usize {
        self.mapped
    }

    /// Compilation units indexed (those with code, and those only
    /// referenced).
    pub fn units(&self) -> usize {
        self.index.units.len()
    }

    /// Frames at `vaddr`, innermost first; empty when no unit covers it.
    /// Names are demangled by the unit's language (Rust, C++).
    pub fn frames(&self, vaddr: u64) -> Vec<SourceFrame> {
        let mut q = [(vaddr, Vec::new())];
        self.frames_many(&mut q);
        let [(_, frames)] = q;
        frames
    }

    /// [`Self::frames`] of each `(vaddr, _)`, written into its second
    /// half: each unit's line program and DIEs are streamed once for all
    /// the addresses that fall in it. Any order; repeats are fine.
    pub fn frames_many(&self, queries: &mut [(u64, Vec<SourceFrame>)]) {
        let mut probes: Vec<u64> = queries.iter().map(|q| q.0).collect();
        probes.sort_unstable();
        probes.dedup();
        let mut answers: Vec<Option<Vec<SourceFrame>>> = vec![None; probes.len()];
        // (probe index, how many covering units were tried without answer)
        let mut pending: Vec<(usize, usize)> = (0..probes.len()).map(|i| (i, 0)).collect();
        while !pending.is_empty() {
            let mut by_unit: Vec<(u32, usize, usize)> = Vec::with_capacity(pending.len());
            for &(i, tried) in &pending {
                match self.index.find(probes[i]).nth(tried) {
                    Some(u) => by_unit.push((u, i, tried)),
                    None => answers[i] = Some(Vec::new()),
                }
            }
            by_unit.sort_unstable();
            pending.clear();
            for group in by_unit.chunk_by(|a, b| a.0 == b.0) {
                let ps: Vec<u64> = group.iter().map(|g| probes[g.1]).collect();
                match self.resolve_in_unit(group[0].0 as usize, &ps) {
                    Ok(found) => {
                        for (g, f) in group.iter().zip(found) {
                            match f {
                                Some(frames) => answers[g.1] = Some(frames),
                                None => pending.push((g.1, g.2 + 1)),
                            }
                        }
                    }
                    // A broken unit names nothing it covers.
                    Err(_) => group.iter().for_each(|g| answers[g.1] = Some(Vec::new())),
                }
            }
        }
        for (vaddr, out) in queries.iter_mut() {
            if let Ok(i) = probes.binary_search(vaddr) {
                *out = answers[i].clone().unwrap_or_default();
            }
        }
    }

    fn unit(&self, index: usize) -> gimli::Result<Unit> {
        let offset = gimli::DebugInfoOffset(self.index.units[index].offset);
        self.dwarf.unit(self.dwarf.unit_header(offset)?)
    }

    /// Answers for `probes` (sorted, distinct) from unit `index`.
    fn resolve_in_unit(&self, index: usize, probes: &[u64]) -> gimli::Result<Vec<UnitAnswer>> {
        let unit = self.unit(index)?;
        let u = UnitRef::new(&self.dwarf, &unit);
        let lang = match self.index.units[index].lang {
            0 => None,
            l => Some(gimli::DwLang(l)),
        };
        let rows = line_rows(u, probes)?;
        let funcs = subprograms(u, probes)?;
        let mut files: Vec<(u64, Option<String>)> = Vec::new();
        let mut file = |i: u64| -> gimli::Result<Option<String>> {
            if let Some((_, f)) = files.iter().find(|f| f.0 == i) {
                return Ok(f.clone());
            }
            let f = render_file(u, i)?;
            files.push((i, f.clone()));
            Ok(f)
        };
        let mut out: Vec<UnitAnswer> = vec![None; probes.len()];
        // Probes by the subprogram holding them, each subprogram's DIEs
        // streamed once.
        let mut order: Vec<usize> = (0..probes.len()).collect();
        order.sort_by_key(|&i| funcs[i].map(|o| o.0));
        for group in order.chunk_by(|&a, &b| funcs[a] == funcs[b]) {
            let Some(func) = funcs[group[0]] else {
                for &i in group {
                    if let Some((f, line)) = rows[i] {
                        out[i] = Some(vec![SourceFrame { function: None, mangled: None, file: file(f)?, line }]);
                    }
                }
                continue;
            };
            let ps: Vec<u64> = group.iter().map(|&i| probes[i]).collect();
            let chains = inlined_chains(u, func, &ps)?;
            let name = self.die_name(u, func)?;
            for (&i, chain) in group.iter().zip(chains) {
                let mut frames = Vec::with_capacity(chain.len() + 1);
                let mut loc = match rows[i] {
                    Some((f, line)) => (file(f)?, line),
                    None => (None, 0),
                };
                for hit in chain.iter().rev() {
                    let name = self.die_name(u, hit.die)?;
                    frames.push(frame(name, lang, loc));
                    let call_file = match hit.call_file {
                        Some(f) => file(f)?,
                        None => None,
                    };
                    loc = (call_file, hit.call_line);
                }
                frames.push(frame(name.clone(), lang, loc));
                frames.truncate(MAX_INLINE_DEPTH);
                out[i] = Some(frames);
            }
        }
        Ok(out)
    }

    /// The name of a subprogram or inlined subroutine DIE: its linkage
    /// name, else its name, else its origin's (addr2line's rules).
    fn die_name(&self, u: UnitRef<'_>, die: UnitOffset) -> gimli::Result<Option<String>> {
        let mut entries = u.entries_raw(Some(die))?;
        let Some(abbrev) = entries.read_abbreviation()? else {
            return Ok(None);
        };
        let mut name: Option<Reader> = None;
        for spec in abbrev.attributes() {
            let attr = entries.read_attribute(*spec)?;
            match attr.name() {
                gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                    if let Ok(v) = u.attr_string(attr.value()) {
                        name = Some(v);
                    }
                }
                gimli::DW_AT_name if name.is_none() => name = u.attr_string(attr.value()).ok(),
                gimli::DW_AT_abstract_origin | gimli::DW_AT_specification if name.is_none() => {
                    name = self.name_attr(attr.value(), u, 16)?;
                }
                _ => {}
            }
        }
        Ok(name.map(|n| n.to_string_lossy().into_owned()))
    }

    /// The name `attr` (a reference) leads to; owned, since the unit a
    /// `DW_FORM_ref_addr` leads into is parsed here and dropped.
    fn name_attr(
        &self,
        attr: gimli::AttributeValue<Reader>,
        u: UnitRef<'_>,
        limit: usize,
    ) -> gimli::Result<Option<Reader>> {
        if limit == 0 {
            return Ok(None);
        }
        match attr {
            gimli::AttributeValue::UnitRef(offset) => self.name_entry(u, offset, limit),
            gimli::AttributeValue::DebugInfoRef(dr) => {
                let Some(i) = self.index.containing(dr.0) else {
                    return Err(gimli::Error::NoEntryAtGivenOffset(dr.0 as u64));
                };
                let other = self.unit(i)?;
                let offset = dr.to_unit_offset(&other.header).ok_or(gimli::Error::NoEntryAtGivenOffset(dr.0 as u64))?;
                self.name_entry(UnitRef::new(&self.dwarf, &other), offset, limit)
            }
            _ => Ok(None),
        }
    }

    fn name_entry(&self, u: UnitRef<'_>, offset: UnitOffset, limit: usize) -> gimli::Result<Option<Reader>> {
        let mut entries = u.entries_raw(Some(offset))?;
        let Some(abbrev) = entries.read_abbreviation()? else {
            return Err(gimli::Error::NoEntryAtGivenOffset(offset.0 as u64));
        };
        let mut name = None;
        let mut next = None;
        for spec in abbrev.attributes() {
            let attr = entries.read_attribute(*spec)?;
            match attr.name() {
                gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                    if let Ok(v) = u.attr_string(attr.value()) {
                        return Ok(Some(v));
                    }
                }
                gimli::DW_AT_name => {
                    if let Ok(v) = u.attr_string(attr.value()) {
                        name = Some(v);
                    }
                }
                gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => next = Some(attr.value()),
                _ => {}
            }
        }
        if name.is_some() {
            return Ok(name);
        }
        match next {
            Some(next) => self.name_attr(next, u, limit - 1),
            None => Ok(None),
        }
    }
}

fn frame(name: Option<String>, lang: Option<gimli::DwLang>, (file, line): (Option<String>, u32)) -> SourceFrame {
    let (function, mangled) = match name {
        Some(raw) => {
            let demangled = addr2line::demangle_auto(raw.as_str().into(), lang).into_owned();
            let mangled = (raw != demangled).then_some(raw);
            (Some(demangled), mangled)
        }
        None => (None, None),
    };
    SourceFrame { function, mangled, file, line }
}

/// A `'static` view of a section's bytes.
fn static_slice(data: &Section) -> &'static [u8] {
    // SAFETY: the bytes live behind an `Arc` (a read-only mapping or a
    // boxed slice) that `DwarfLines::sections` holds for as long as the
    // `Dwarf` reading them, which is dropped first; an `Arc`'s target never
    // moves and neither backing is ever written, so the slice stays valid.
    unsafe { std::slice::from_raw_parts(data.as_ptr(), data.len()) }
}

fn load_dwarf(
    endian: RunTimeEndian,
    mut bytes: impl FnMut(gimli::SectionId) -> &'static [u8],
) -> Option<gimli::Dwarf<Reader>> {
    gimli::Dwarf::load(|id| -> Result<Reader, gimli::Error> { Ok(EndianSlice::new(bytes(id), endian)) }).ok()
}

/// Every unit's address ranges, merged where one unit's ranges follow
/// each other with no other unit's in between. A unit that does not parse
/// is left out; a broken unit list ends the walk.
fn build_index(dwarf: &gimli::Dwarf<Reader>) -> UnitIndex {
    let mut aranges = Vec::new();
    let mut headers = dwarf.debug_aranges.headers();
    while let Ok(Some(h)) = headers.next() {
        aranges.push((h.debug_info_offset().0, h.offset()));
    }
    aranges.sort_unstable_by_key(|a| a.0);
    let mut ranges: Vec<(u64, u64, u32)> = Vec::new();
    let mut units = Vec::new();
    let mut iter = dwarf.units();
    while let Ok(Some(header)) = iter.next() {
        let Some(offset) = header.debug_info_offset() else { continue };
        let need_ranges = match header.type_() {
            gimli::UnitType::Type { .. } | gimli::UnitType::SplitType { .. } => continue,
            gimli::UnitType::Partial => false,
            _ => true,
        };
        let Ok(unit) = dwarf.unit(header) else { continue };
        let id = units.len() as u32;
        let mut lang = 0;
        if need_ranges {
            let u = UnitRef::new(dwarf, &unit);
            match unit_ranges(u, offset.0, &aranges, dwarf, |b, e| ranges.push((b, e, id))) {
                Ok(l) => lang = l,
                Err(_) => continue,
            }
        }
        units.push(UnitEntry { offset: offset.0, lang });
    }
    ranges.sort_unstable();
    let mut merged: Vec<UnitRange> = Vec::with_capacity(ranges.len());
    for (begin, end, unit) in ranges {
        match merged.last_mut() {
            Some(last) if last.unit == unit => {
                last.end = last.end.max(end);
            }
            _ => merged.push(UnitRange { begin, end, min_begin: 0, unit }),
        }
    }
    merged.sort_unstable_by_key(|r| (r.end, r.unit));
    let mut min = u64::MAX;
    for r in merged.iter_mut().rev() {
        min = min.min(r.begin);
        r.min_begin = min;
    }
    UnitIndex { ranges: merged.into_boxed_slice(), units: units.into_boxed_slice() }
}

/// Calls `add` with a compile unit's ranges: `DW_AT_ranges`, else its
/// `.debug_aranges` sets, else `low_pc`/`high_pc`, else its line
/// program's sequences. Returns the unit's language.
fn unit_ranges(
    u: UnitRef<'_>,
    offset: usize,
    aranges: &[(usize, gimli::DebugArangesOffset<usize>)],
    dwarf: &gimli::Dwarf<Reader>,
    mut add: impl FnMut(u64, u64),
) -> gimli::Result<u16> {
    let mut entries = u.entries_raw(None)?;
    let Some(abbrev) = entries.read_abbreviation()? else {
        return Err(gimli::Error::NoEntryAtGivenOffset(offset as u64));
    };
    let mut r = RangeAttrs::default();
    let mut lang = 0;
    for spec in abbrev.attributes() {
        let attr = entries.read_attribute(*spec)?;
        if !r.read(&attr, u)? && attr.name() == gimli::DW_AT_language {
            if let gimli::AttributeValue::Language(l) = attr.value() {
                lang = l.0;
            }
        }
    }
    let mut need = true;
    if r.ranges_offset.is_none() {
        let first = aranges.partition_point(|a| a.0 < offset);
        for (_, at) in aranges[first..].iter().take_while(|a| a.0 == offset) {
            let mut list = dwarf.debug_aranges.header(*at)?.entries();
            // Errors (an address overflow) are skipped; the iterator fuses
            // on those it cannot go past.
            while let Some(a) = list.next().transpose() {
                if let Ok(a) = a {
                    if a.length() != 0 {
                        let range = a.range();
                        add(range.begin, range.end);
                        need = false;
                    }
                }
            }
        }
    }
    if need {
        need = !r.for_each(u, &mut add)?;
    }
    if need {
        if let Some(program) = u.line_program.clone() {
            let mut rows = program.rows();
            let mut start = None;
            while let Ok(Some((_, row))) = rows.next_row() {
                if row.end_sequence() {
                    if let Some(s) = start.take() {
                        if s < row.address() {
                            add(s, row.address());
                        }
                    }
                } else if start.is_none() {
                    start = Some(row.address());
                }
            }
        }
    }
    Ok(lang)
}

/// The line row covering each of `probes` (sorted): the row with the
/// greatest address at or below it in the sequence holding it (the first
/// such sequence), rows at one address counting as the last of them.
/// Streams the program; holds one sequence's candidates, not its rows.
fn line_rows(u: UnitRef<'_>, probes: &[u64]) -> gimli::Result<Vec<Option<Row>>> {
    let mut out = vec![None; probes.len()];
    let Some(program) = u.line_program.clone() else {
        return Ok(out);
    };
    let mut rows = program.rows();
    // The current sequence: first address, the last row seen.
    let mut start: Option<u64> = None;
    let mut last: Option<(u64, Row)> = None;
    // (probe index, row) found in the current sequence.
    let mut found: Vec<(usize, Row)> = Vec::new();
    let cover = |from: u64, to: u64, row: Row, found: &mut Vec<(usize, Row)>| {
        if from < to {
            let first = probes.partition_point(|&p| p < from);
            for (i, _) in probes[first..].iter().enumerate().take_while(|(_, &p)| p < to) {
                found.push((first + i, row));
            }
        }
    };
    while let Some((_, row)) = rows.next_row()? {
        let address = row.address();
        if row.end_sequence() {
            if let (Some(s), Some((a, r))) = (start.take(), last.take()) {
                cover(a, address, r, &mut found);
                if s < address {
                    for &(i, r) in &found {
                        out[i].get_or_insert(r);
                    }
                }
            }
            found.clear();
            continue;
        }
        let this = (row.file_index(), row.line().map_or(0, |l| l.get() as u32));
        if let Some((a, r)) = last {
            if a != address {
                cover(a, address, r, &mut found);
            }
        }
        start.get_or_insert(address);
        last = Some((address, this));
    }
    Ok(out)
}

/// The `DW_TAG_subprogram` holding each of `probes` (sorted), by one
/// walk over the unit's DIEs.
fn subprograms(u: UnitRef<'_>, probes: &[u64]) -> gimli::Result<Vec<Option<UnitOffset>>> {
    let mut out = vec![None; probes.len()];
    let mut entries = u.entries_raw(None)?;
    while !entries.is_empty() {
        let die = entries.next_offset();
        let Some(abbrev) = entries.read_abbreviation()? else { continue };
        if abbrev.tag() != gimli::DW_TAG_subprogram {
            entries.skip_attributes(abbrev.attributes())?;
            continue;
        }
        let mut r = RangeAttrs::default();
        for spec in abbrev.attributes() {
            let attr = entries.read_attribute(*spec)?;
            r.read(&attr, u)?;
        }
        r.for_each(u, |begin, end| {
            let first = probes.partition_point(|&p| p < begin);
            for (i, _) in probes[first..].iter().enumerate().take_while(|(_, &p)| p < end) {
                out[first + i].get_or_insert(die);
            }
        })?;
    }
    Ok(out)
}

/// For each of `probes` (sorted), the inlined subroutines of subprogram
/// `func` holding it, outermost first: at each inline depth, the first
/// one whose ranges hold it. Nested subprograms are not looked into.
fn inlined_chains(u: UnitRef<'_>, func: UnitOffset, probes: &[u64]) -> gimli::Result<Vec<Vec<InlineHit>>> {
    let mut hits: Vec<Vec<Option<InlineHit>>> = vec![Vec::new(); probes.len()];
    let mut entries = u.entries_raw(Some(func))?;
    let depth = entries.next_depth();
    if let Some(abbrev) = entries.read_abbreviation()? {
        entries.skip_attributes(abbrev.attributes())?;
    }
    // Depths of the open inlined subroutines around the next entry.
    let mut open: Vec<isize> = Vec::new();
    let version = u.header.version();
    loop {
        let next = entries.next_depth();
        if next <= depth || entries.is_empty() {
            break;
        }
        let die = entries.next_offset();
        let Some(abbrev) = entries.read_abbreviation()? else { continue };
        while open.last().is_some_and(|&d| d >= next) {
            open.pop();
        }
        match abbrev.tag() {
            gimli::DW_TAG_subprogram => {
                entries.skip_attributes(abbrev.attributes())?;
                while entries.next_depth() > next && !entries.is_empty() {
                    if let Some(a) = entries.read_abbreviation()? {
                        entries.skip_attributes(a.attributes())?;
                    }
                }
            }
            gimli::DW_TAG_inlined_subroutine => {
                let mut r = RangeAttrs::default();
                let mut hit = InlineHit { die, call_file: None, call_line: 0 };
                for spec in abbrev.attributes() {
                    let attr = entries.read_attribute(*spec)?;
                    if r.read(&attr, u)? {
                        continue;
                    }
                    match attr.name() {
                        // DWARF 5 numbers files from 0; before, 0 is none.
                        gimli::DW_AT_call_file => {
                            if let gimli::AttributeValue::FileIndex(fi) = attr.value() {
                                if fi > 0 || version >= 5 {
                                    hit.call_file = Some(fi);
                                }
                            }
                        }
                        gimli::DW_AT_call_line => hit.call_line = attr.udata_value().unwrap_or(0) as u32,
                        _ => {}
                    }
                }
                let level = open.len();
                open.push(next);
                if level >= MAX_INLINE_DEPTH {
                    continue;
                }
                r.for_each(u, |begin, end| {
                    let first = probes.partition_point(|&p| p < begin);
                    for (i, _) in probes[first..].iter().enumerate().take_while(|(_, &p)| p < end) {
                        let h = &mut hits[first + i];
                        if h.len() <= level {
                            h.resize(level + 1, None);
                        }
                        h[level].get_or_insert(hit);
                    }
                })?;
            }
            _ => entries.skip_attributes(abbrev.attributes())?,
        }
    }
    Ok(hits.into_iter().map(|h| h.into_iter().map_while(|x| x).collect()).collect())
}

/// The path of file `index` of the unit's line program, as addr2line
/// renders it: comp dir, then the file's directory (unless index 0), then
/// its name, an absolute part replacing what came before.
fn render_file(u: UnitRef<'_>, index: u64) -> gimli::Result<Option<String>> {
    let Some(program) = &u.line_program else {
        return Ok(None);
    };
    let header = program.header();
    let Some(file) = header.file(index) else {
        return Ok((index == 0).then(String::new));
    };
    let mut path = match &u.comp_dir {
        Some(dir) => dir.to_string_lossy().into_owned(),
        None => String::new(),
    };
    if file.directory_index() != 0 {
        if let Some(dir) = file.directory(header) {
            path_push(&mut path, &u.attr_string(dir)?.to_string_lossy());
        }
    }
    path_push(&mut path, &u.attr_string(file.path_name())?.to_string_lossy());
    Ok(Some(path))
}

fn path_push(path: &mut String, p: &str) {
    let forward = |p: &str| p.starts_with('/') || p.get(1..3) == Some(":/");
    let backward = |p: &str| p.starts_with('\\') || p.get(1..3) == Some(":\\");
    if forward(p) || backward(p) {
        *path = p.to_owned();
    } else {
        let sep = if backward(path) { '\\' } else { '/' };
        if !path.is_empty() && !path.ends_with(sep) {
            path.push(sep);
        }
        path.push_str(p);
    }
}

/// Deepest inline chain kept at one address (malformed DWARF can loop).
pub(crate) const MAX_INLINE_DEPTH: usize = 64;

/// addr2line's `Context` over the same sections: the resolver the
/// streaming one replaced, kept to check it against and to measure what
/// a `Context` retains. Not for production use: it keeps every unit it
/// has parsed.
#[doc(hidden)]
pub struct Addr2lineReference<'a> {
    ctx: addr2line::Context<Reader>,
    _lines: std::marker::PhantomData<&'a DwarfLines>,
}

impl DwarfLines {
    #[doc(hidden)]
    pub fn addr2line_reference(&self) -> Option<Addr2lineReference<'_>> {
        let dwarf = load_dwarf(self.endian, |id| {
            self.sections.iter().find(|s| s.0 == id).map_or(&[][..], |s| static_slice(&s.1))
        })?;
        let ctx = addr2line::Context::from_dwarf(dwarf).ok()?;
        Some(Addr2lineReference { ctx, _lines: std::marker::PhantomData })
    }
}

impl Addr2lineReference<'_> {
    pub fn frames(&self, vaddr: u64) -> Vec<SourceFrame> {
        let mut out = Vec::new();
        let Ok(mut frames) = self.ctx.find_frames(vaddr).skip_all_loads() else {
            return out;
        };
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
