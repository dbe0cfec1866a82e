//! DWARF line tables and inlined-function chains of one ELF file, read
//! with gimli by streaming, so that what stays on the heap between lookups
//! is a small index.
//!
//! Uncompressed debug sections are read in place from the file's mapping,
//! which the result keeps alive (no copy: a 100 MB binary's 79 MB of DWARF
//! cost only file pages a lookup touches, reclaimable page cache);
//! `SHF_COMPRESSED` ones are decompressed into the heap (and a file read
//! into memory, not mapped, is heap too). Both sizes are reported
//! ([`DwarfLines::mapped_bytes`], [`DwarfLines::heap_bytes`]).
//!
//! At load, each compilation unit's address ranges (`DW_AT_ranges`, else
//! `.debug_aranges`, else `low_pc`/`high_pc`, else its line program's
//! sequences, the order addr2line uses) go into a sorted index: 32 bytes
//! per range (a unit's adjacent ranges merged) and 16 per unit, nothing
//! else. A lookup parses the covering
//! unit's header, streams its line program (keeping only the rows of the
//! sequence that holds each address) and its DIEs (the subprogram holding
//! each address, then that subprogram's inlined subroutines), and drops
//! it. The answers are those of addr2line's `find_frames`;
//! [`DwarfLines::frames_many`] streams a unit once for all the addresses
//! of a batch that fall in it.
//!
//! What such a full read learns is kept as a *window* per address: the
//! stretch around it where the unit, the subprogram and the line sequence
//! are the same ones (no other unit, subprogram or sequence begins or ends
//! inside), with that sequence's rows over it. A profile keeps sampling
//! new addresses in functions it sampled before; an address in a window
//! costs the unit's header and the subprogram's own DIEs, not the unit's.
//! Windows take ~50 bytes and 24 per row (a function's rows); at most
//! `WINDOW_BYTES` of them per file, all dropped when full.
//!
//! A unit read a second time is walked whole into a map (`unit_map`): new
//! addresses keep landing in the same few large units, and each one
//! otherwise streams the unit up to it again.

use std::collections::BTreeMap;
use std::ops::{Deref, Range};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use gimli::{EndianSlice, RunTimeEndian};

use crate::Bytes;

mod unit_map;
use unit_map::UnitMap;

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
    /// Owned without the copy into an `Arc` (a clone copies the bytes).
    Boxed(Box<[u8]>),
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

    /// Owned bytes kept in their own allocation (no copy now; a clone
    /// copies them): for a value cloned rarely, if ever.
    pub(crate) fn boxed(bytes: Vec<u8>) -> Self {
        Section(Backing::Boxed(bytes.into_boxed_slice()))
    }

    fn is_in_place(&self) -> bool {
        matches!(self.0, Backing::InPlace(..))
    }

    /// Read in place from a file mapping (page cache), not a file read
    /// into the heap.
    pub(crate) fn is_mapped(&self) -> bool {
        matches!(&self.0, Backing::InPlace(file, _) if matches!(**file, Bytes::Map(_)))
    }
}

impl Deref for Section {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Backing::InPlace(file, range) => &file.get()[range.clone()],
            Backing::Owned(bytes) => bytes,
            Backing::Boxed(bytes) => bytes,
        }
    }
}

impl Default for Section {
    fn default() -> Self {
        Section::boxed(Vec::new())
    }
}

impl PartialEq for Section {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Section {}

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
    /// Of `heap`, section bytes read in place from a file held in memory.
    in_memory_file: usize,
    /// Windows by first address.
    windows: Mutex<BTreeMap<u64, Window>>,
    window_bytes: AtomicUsize,
    /// The units parsed last (most recent last, at most [`UNITS_KEPT`]):
    /// an address in a window, and the next batch's addresses in the same
    /// unit, reuse its abbreviations and line program header.
    kept_units: Mutex<Vec<(u32, Arc<Unit>)>>,
    /// Their estimated heap bytes (see [`kept_bytes`]).
    kept_bytes: AtomicUsize,
    /// Maps of units read more than once (see [`unit_map`]), most recent
    /// last, together at most [`MAP_BYTES`].
    unit_maps: Mutex<Vec<(u32, Arc<UnitMap>)>>,
    unit_map_bytes: AtomicUsize,
    /// Per unit: read before (its next read builds its map), or too
    /// large a map to keep (always streamed).
    read_before: Mutex<Box<[Seen]>>,
    /// Units read in full, and addresses answered from a window.
    unit_reads: AtomicU64,
    window_hits: AtomicU64,
}

/// Most bytes of windows one file keeps.
const WINDOW_BYTES: usize = 1 << 20;
/// Parsed units one file keeps (see `DwarfLines::kept_units`): a Rust
/// unit's abbreviations and file table are a few KiB to a few tens.
const UNITS_KEPT: usize = 2;
/// Most bytes of unit maps one file keeps: a unit's is
/// 1–40 KiB, at most ~200 KiB (a 274 MB Rust binary: median, 99th
/// percentile and largest of its 7,575 units: 1.3, 41 and 191 KiB).
const MAP_BYTES: usize = 512 << 10;

/// What a unit's reads so far say about mapping it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Seen {
    Never,
    Once,
    MapTooLarge,
}

/// The entry of `id` in a most-recent-last list, moved to its end.
fn use_recent<T: Clone>(list: &mut Vec<(u32, T)>, id: u32) -> Option<T> {
    let at = list.iter().position(|e| e.0 == id)?;
    let entry = list.remove(at);
    let value = entry.1.clone();
    list.push(entry);
    Some(value)
}

/// Estimated heap bytes of `kept` units: each one's line program tables,
/// and each abbreviation table once (kept units may share one). gimli
/// does not tell its allocations; these are the vectors that grow with
/// the unit (entries counted, each at its size), which is what
/// `cache.max_bytes` needs to see.
fn kept_bytes(kept: &[(u32, Arc<Unit>)]) -> usize {
    use std::mem::{size_of, size_of_val};
    let mut bytes = 0;
    for (i, (_, unit)) in kept.iter().enumerate() {
        bytes += size_of::<Unit>();
        if let Some(program) = &unit.line_program {
            let header = program.header();
            bytes += size_of_val(header.file_names()) + size_of_val(header.include_directories());
        }
        if kept[..i].iter().any(|(_, k)| Arc::ptr_eq(&k.abbreviations, &unit.abbreviations)) {
            continue;
        }
        // Codes 1, 2, ... up to the first gap (compilers number them so);
        // codes past a gap are not counted.
        let mut code = 1;
        while let Some(abbrev) = unit.abbreviations.get(code) {
            bytes += size_of::<gimli::Abbreviation>() + size_of_val(abbrev.attributes());
            code += 1;
        }
    }
    bytes
}

/// Addresses (from its key in `DwarfLines::windows` to `end`) whose
/// first covering unit, subprogram and line sequence are the same, with
/// that sequence's rows over them.
struct Window {
    end: u64,
    unit: u32,
    func: Option<UnitOffset>,
    /// (first address, row), by address: each row covers up to the next
    /// one's address (the last, to `end`). Empty: no line row.
    rows: Box<[(u64, Row)]>,
}

impl Window {
    fn bytes(&self) -> usize {
        48 + self.rows.len() * std::mem::size_of::<(u64, Row)>()
    }

    fn row(&self, probe: u64) -> Option<Row> {
        let i = self.rows.partition_point(|r| r.0 <= probe);
        i.checked_sub(1).map(|i| self.rows[i].1)
    }
}

/// For each of `probes` (sorted), the nearest edge of any span not
/// holding it: the greatest end at or below it and the least start above.
/// Spans only at one side of a probe bound how far an answer for it
/// reaches.
struct Edges {
    below: Vec<u64>,
    above: Vec<u64>,
}

impl Edges {
    fn new(n: usize) -> Self {
        Edges { below: vec![0; n], above: vec![u64::MAX; n] }
    }

    /// Notes span `[begin, end)`: probes below `begin` and at or past
    /// `end` (the sweeps in `finish` carry it on to the others).
    fn note(&mut self, probes: &[u64], begin: u64, end: u64) {
        let under = probes.partition_point(|&p| p < begin);
        if under > 0 {
            let a = &mut self.above[under - 1];
            *a = (*a).min(begin);
        }
        let past = probes.partition_point(|&p| p < end);
        if let Some(b) = self.below.get_mut(past) {
            *b = (*b).max(end);
        }
    }

    fn finish(mut self) -> Self {
        for i in 1..self.below.len() {
            self.below[i] = self.below[i].max(self.below[i - 1]);
        }
        for i in (0..self.above.len().saturating_sub(1)).rev() {
            self.above[i] = self.above[i].min(self.above[i + 1]);
        }
        self
    }
}

/// What streaming a unit's line program found for each probe.
struct LineFind {
    rows: Vec<Option<Row>>,
    /// The holding sequence's span and its rows (an index into `held`),
    /// when its addresses only grow.
    sequence: Vec<Option<(u64, u64, usize)>>,
    held: Vec<Vec<(u64, Row)>>,
    /// Inside a sequence whose addresses go back and forth: no window.
    tangled: Vec<bool>,
    edges: Edges,
}

/// What walking a unit's DIEs found for each probe: the subprogram and
/// its range holding the probe.
struct SubprogramFind {
    funcs: Vec<Option<(UnitOffset, u64, u64)>>,
    edges: Edges,
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
        let (mut heap, mut mapped, mut in_memory_file) = (0usize, 0usize, 0usize);
        let mut sections = Vec::new();
        let dwarf = load_dwarf(endian, |id| {
            let data = section(id.name()).unwrap_or_else(|| Section::owned(Vec::new()));
            if data.is_mapped() {
                mapped += data.len();
            } else {
                heap += data.len();
                if data.is_in_place() {
                    in_memory_file += data.len();
                }
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
        let seen = vec![Seen::Never; index.units.len()].into_boxed_slice();
        Some(DwarfLines {
            dwarf,
            index,
            sections,
            endian,
            heap,
            mapped,
            in_memory_file,
            windows: Mutex::new(BTreeMap::new()),
            window_bytes: AtomicUsize::new(0),
            kept_units: Mutex::new(Vec::with_capacity(UNITS_KEPT + 1)),
            kept_bytes: AtomicUsize::new(0),
            unit_maps: Mutex::new(Vec::new()),
            unit_map_bytes: AtomicUsize::new(0),
            read_before: Mutex::new(seen),
            unit_reads: AtomicU64::new(0),
            window_hits: AtomicU64::new(0),
        })
    }

    /// Heap bytes held: debug sections decompressed or read from a file
    /// held in memory, the unit index, the windows kept (at most
    /// `WINDOW_BYTES`), the units kept parsed and the unit maps
    /// (estimated).
    pub fn heap_bytes(&self) -> usize {
        self.heap
            + self.index.heap_bytes()
            + self.window_bytes.load(Ordering::Relaxed)
            + self.kept_bytes.load(Ordering::Relaxed)
            + self.unit_map_bytes.load(Ordering::Relaxed)
            + self.index.units.len() * std::mem::size_of::<Seen>()
    }

    /// Makes every unit's next read build its map, and forgets the
    /// windows: the next lookups are answered from unit maps.
    #[cfg(test)]
    pub(crate) fn map_from_next_read(&self) {
        self.read_before.lock().unwrap().iter_mut().for_each(|s| *s = Seen::Once);
        self.windows.lock().unwrap().clear();
        self.window_bytes.store(0, Ordering::Relaxed);
    }

    /// Unit maps kept, and their bytes as [`Self::heap_bytes`] counts them.
    #[cfg(test)]
    pub(crate) fn unit_maps(&self) -> (usize, usize) {
        (self.unit_maps.lock().unwrap().len(), self.unit_map_bytes.load(Ordering::Relaxed))
    }

    /// Units kept parsed, and their bytes as [`Self::heap_bytes`] counts them.
    #[cfg(test)]
    pub(crate) fn kept_units(&self) -> (usize, usize) {
        let kept = self.kept_units.lock().unwrap_or_else(|p| p.into_inner());
        (kept.len(), self.kept_bytes.load(Ordering::Relaxed))
    }

    /// Units read for addresses no window held (streamed, or from their
    /// map), and addresses answered from a window instead.
    pub fn unit_reads(&self) -> (u64, u64) {
        (self.unit_reads.load(Ordering::Relaxed), self.window_hits.load(Ordering::Relaxed))
    }

    /// Bytes of debug sections read in place from the file mapping: file
    /// pages the kernel keeps resident as lookups touch them and may
    /// reclaim under pressure.
    pub fn mapped_bytes(&self) -> usize {
        self.mapped
    }

    /// Of [`Self::heap_bytes`], sections read in place from a file held in
    /// memory (`ElfFile::from_vec`): that file's caller may count it whole.
    pub fn in_memory_file_bytes(&self) -> usize {
        self.in_memory_file
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
        self.answer_from_windows(&probes, &mut answers);
        // (probe index, how many covering units were tried without answer)
        let mut pending: Vec<(usize, usize)> =
            (0..probes.len()).filter(|&i| answers[i].is_none()).map(|i| (i, 0)).collect();
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
                let first_tried: Vec<bool> = group.iter().map(|g| g.2 == 0).collect();
                match self.resolve_in_unit(group[0].0 as usize, &ps, &first_tried) {
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

    fn unit(&self, index: usize) -> gimli::Result<Arc<Unit>> {
        let id = index as u32;
        let shared_abbrevs = {
            let mut kept = self.kept_units.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(unit) = use_recent(&mut kept, id) {
                return Ok(unit);
            }
            let header = self.dwarf.unit_header(gimli::DebugInfoOffset(self.index.units[index].offset))?;
            let abbrevs = kept
                .iter()
                .find(|k| k.1.header.debug_abbrev_offset() == header.debug_abbrev_offset())
                .map(|k| k.1.abbreviations.clone());
            (header, abbrevs)
        };
        // Parsed outside the lock.
        let (header, abbrevs) = shared_abbrevs;
        let abbrevs = match abbrevs {
            Some(a) => a,
            None => self.dwarf.abbreviations(&header)?,
        };
        let unit = Arc::new(Unit::new_with_abbreviations(&self.dwarf, header, abbrevs)?);
        let mut kept = self.kept_units.lock().unwrap_or_else(|p| p.into_inner());
        if !kept.iter().any(|k| k.0 == id) {
            if kept.len() >= UNITS_KEPT {
                kept.remove(0);
            }
            kept.push((id, unit.clone()));
            self.kept_bytes.store(kept_bytes(&kept), Ordering::Relaxed);
        }
        Ok(unit)
    }

    /// Answers `probes` (sorted) that lie in a window, from it.
    fn answer_from_windows(&self, probes: &[u64], answers: &mut [Option<Vec<SourceFrame>>]) {
        // (unit, probe index, row, subprogram)
        let mut hits: Vec<(u32, usize, Option<Row>, Option<UnitOffset>)> = Vec::new();
        {
            let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
            if windows.is_empty() {
                return;
            }
            for (i, &p) in probes.iter().enumerate() {
                let Some((_, w)) = windows.range(..=p).next_back() else { continue };
                // The unit first covering it must be the window's (the
                // index's ranges are not a window's edges).
                if p < w.end && self.index.find(p).next() == Some(w.unit) {
                    hits.push((w.unit, i, w.row(p), w.func));
                }
            }
        }
        hits.sort_unstable_by_key(|h| (h.0, h.1));
        for group in hits.chunk_by(|a, b| a.0 == b.0) {
            let index = group[0].0 as usize;
            let ps: Vec<u64> = group.iter().map(|h| probes[h.1]).collect();
            let rows: Vec<Option<Row>> = group.iter().map(|h| h.2).collect();
            let funcs: Vec<Option<UnitOffset>> = group.iter().map(|h| h.3).collect();
            let found = self.unit(index).and_then(|unit| {
                self.answers(UnitRef::new(&self.dwarf, &unit), self.index.units[index].lang, &ps, &rows, &funcs)
            });
            // A unit that fails now is read in full by the caller.
            if let Ok(found) = found {
                self.window_hits.fetch_add(group.len() as u64, Ordering::Relaxed);
                for (h, f) in group.iter().zip(found) {
                    answers[h.1] = f;
                }
            }
        }
    }

    /// Answers for `probes` (sorted, distinct) from unit `index`, read in
    /// full; keeps a window for each probe that `first` marks (no unit
    /// before this one covers it).
    fn resolve_in_unit(&self, index: usize, probes: &[u64], first: &[bool]) -> gimli::Result<Vec<UnitAnswer>> {
        let unit = self.unit(index)?;
        let u = UnitRef::new(&self.dwarf, &unit);
        self.unit_reads.fetch_add(1, Ordering::Relaxed);
        let (lines, subs) = match self.unit_map(index, u) {
            Some(map) => (map.line_rows(probes)?, map.subprograms(probes)),
            None => (line_rows(u, probes)?, subprograms(u, probes)?),
        };
        let funcs: Vec<Option<UnitOffset>> = subs.funcs.iter().map(|f| f.map(|f| f.0)).collect();
        let out = self.answers(u, self.index.units[index].lang, probes, &lines.rows, &funcs)?;
        self.keep_windows(index as u32, probes, first, &out, &lines, &subs);
        Ok(out)
    }

    /// Unit `index`'s map: kept, or built now when the unit was read
    /// before (`None` on its first read: most units are read once).
    fn unit_map(&self, index: usize, u: UnitRef<'_>) -> Option<Arc<UnitMap>> {
        let id = index as u32;
        {
            let mut maps = self.unit_maps.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(map) = use_recent(&mut maps, id) {
                return Some(map);
            }
        }
        {
            let mut seen = self.read_before.lock().unwrap_or_else(|p| p.into_inner());
            let s = seen.get_mut(index)?;
            match *s {
                Seen::Never => {
                    *s = Seen::Once;
                    return None;
                }
                Seen::MapTooLarge => return None,
                Seen::Once => {}
            }
        }
        // Built outside the locks. A unit broken past some point is
        // streamed instead: that stops at the last address it looks for.
        let map = Arc::new(UnitMap::build(u).ok()?);
        if map.bytes() > MAP_BYTES {
            // Used this once; built again each read, it would cost more
            // than streaming.
            let mut seen = self.read_before.lock().unwrap_or_else(|p| p.into_inner());
            seen[index] = Seen::MapTooLarge;
        } else {
            let mut maps = self.unit_maps.lock().unwrap_or_else(|p| p.into_inner());
            if !maps.iter().any(|m| m.0 == id) {
                let mut bytes = self.unit_map_bytes.load(Ordering::Relaxed) + map.bytes();
                while bytes > MAP_BYTES && !maps.is_empty() {
                    bytes -= maps.remove(0).1.bytes();
                }
                maps.push((id, map.clone()));
                self.unit_map_bytes.store(bytes, Ordering::Relaxed);
            }
        }
        Some(map)
    }

    /// A window around each answered probe marked in `first`.
    fn keep_windows(
        &self,
        unit: u32,
        probes: &[u64],
        first: &[bool],
        out: &[UnitAnswer],
        lines: &LineFind,
        subs: &SubprogramFind,
    ) {
        let mut new: Vec<(u64, Window)> = Vec::new();
        for (i, &p) in probes.iter().enumerate() {
            if !first[i] || out[i].is_none() || lines.tangled[i] {
                continue;
            }
            let mut begin = lines.edges.below[i].max(subs.edges.below[i]);
            let mut end = lines.edges.above[i].min(subs.edges.above[i]);
            let mut rows: &[(u64, Row)] = &[];
            match (lines.rows[i], lines.sequence[i]) {
                (Some(_), Some((b, e, held))) => {
                    (begin, end) = (begin.max(b), end.min(e));
                    rows = &lines.held[held];
                }
                // A row from a sequence whose addresses go back and forth.
                (Some(_), None) => continue,
                (None, _) => {}
            }
            if let Some((_, b, e)) = subs.funcs[i] {
                (begin, end) = (begin.max(b), end.min(e));
            }
            if !(begin <= p && p < end) || end == u64::MAX {
                continue;
            }
            // The rows over [begin, end): the last at or below `begin`
            // (starting there) and those after it.
            let from = rows.partition_point(|r| r.0 <= begin).saturating_sub(1);
            let to = rows.partition_point(|r| r.0 < end);
            let rows: Box<[(u64, Row)]> = rows[from..to.max(from)].iter().map(|&(a, r)| (a.max(begin), r)).collect();
            new.push((begin, Window { end, unit, func: subs.funcs[i].map(|f| f.0), rows }));
        }
        if new.is_empty() {
            return;
        }
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let mut bytes = self.window_bytes.load(Ordering::Relaxed);
        for (begin, w) in new {
            if bytes + w.bytes() > WINDOW_BYTES {
                windows.clear();
                bytes = 0;
            }
            bytes += w.bytes();
            if let Some(old) = windows.insert(begin, w) {
                bytes -= old.bytes();
            }
        }
        self.window_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Frames for `probes` from what the unit says of each: its line row
    /// and the subprogram holding it (whose inlined subroutines are
    /// walked here).
    fn answers(
        &self,
        u: UnitRef<'_>,
        lang: u16,
        probes: &[u64],
        rows: &[Option<Row>],
        funcs: &[Option<UnitOffset>],
    ) -> gimli::Result<Vec<UnitAnswer>> {
        let lang = (lang != 0).then_some(gimli::DwLang(lang));
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
    // Units that share an abbreviation table come one after the other (a
    // Rust binary: 7,582 units, 1,184 tables, 1,184 runs): each table is
    // parsed once per run, and only the run's is held.
    let mut abbrevs: Option<(gimli::DebugAbbrevOffset<usize>, Arc<gimli::Abbreviations>)> = None;
    let mut iter = dwarf.units();
    while let Ok(Some(header)) = iter.next() {
        let Some(offset) = header.debug_info_offset() else { continue };
        let need_ranges = match header.type_() {
            gimli::UnitType::Type { .. } | gimli::UnitType::SplitType { .. } => continue,
            gimli::UnitType::Partial => false,
            _ => true,
        };
        let table = match &abbrevs {
            Some((at, table)) if *at == header.debug_abbrev_offset() => table.clone(),
            _ => {
                let Ok(table) = dwarf.abbreviations(&header) else { continue };
                abbrevs = Some((header.debug_abbrev_offset(), table.clone()));
                table
            }
        };
        let Ok(unit) = Unit::new_with_abbreviations(dwarf, header, table) else { continue };
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
/// Streams the program, holding one sequence's rows at a time, and keeps
/// those of sequences holding a probe. Stops once every probe has its row:
/// later sequences change no answer, nor any window (a window lies in the
/// first sequence holding its probe).
fn line_rows(u: UnitRef<'_>, probes: &[u64]) -> gimli::Result<LineFind> {
    let mut find = LineFind {
        rows: vec![None; probes.len()],
        sequence: vec![None; probes.len()],
        held: Vec::new(),
        tangled: vec![false; probes.len()],
        edges: Edges::new(probes.len()),
    };
    let Some(program) = u.line_program.clone() else {
        find.edges = find.edges.finish();
        return Ok(find);
    };
    let mut rows = program.rows();
    // The current sequence: first address, its rows (one per address, the
    // last of those at it), whether their addresses only grew.
    let mut start: Option<u64> = None;
    let mut seq: Vec<(u64, Row)> = Vec::new();
    let mut growing = true;
    let mut unanswered = probes.len();
    while let Some((_, row)) = rows.next_row()? {
        let address = row.address();
        if row.end_sequence() {
            if let Some(s) = start.take() {
                if s < address {
                    find.edges.note(probes, s, address);
                    let first = probes.partition_point(|&p| p < s);
                    let mut keep = false;
                    for (i, &p) in probes.iter().enumerate().skip(first).take_while(|(_, &p)| p < address) {
                        find.tangled[i] |= !growing;
                        if find.rows[i].is_some() {
                            continue;
                        }
                        let row = if growing {
                            seq.partition_point(|r| r.0 <= p).checked_sub(1).map(|k| seq[k].1)
                        } else {
                            cover_unordered(&seq, address, p)
                        };
                        let Some(row) = row else { continue };
                        find.rows[i] = Some(row);
                        unanswered -= 1;
                        if growing {
                            find.sequence[i] = Some((s, address, find.held.len()));
                            keep = true;
                        }
                    }
                    if keep {
                        find.held.push(std::mem::take(&mut seq));
                    }
                }
            }
            if unanswered == 0 {
                break;
            }
            seq.clear();
            growing = true;
            continue;
        }
        start.get_or_insert(address);
        push_row(&mut seq, &mut growing, row);
    }
    find.edges = find.edges.finish();
    Ok(find)
}

/// Adds `row` to a sequence's rows (one per address, the last of those
/// at it); `growing` turns false when an address goes back.
fn push_row(seq: &mut Vec<(u64, Row)>, growing: &mut bool, row: &gimli::LineRow) {
    let address = row.address();
    let this = (row.file_index(), row.line().map_or(0, |l| l.get() as u32));
    match seq.last_mut() {
        Some(last) if last.0 == address => last.1 = this,
        Some(last) => {
            *growing &= last.0 < address;
            seq.push((address, this));
        }
        None => seq.push((address, this)),
    }
}

/// The row covering `p` in a sequence whose addresses do not only grow
/// (`rows` in order, one per run of equal addresses, ending at `end`):
/// the first pair of consecutive rows around it.
fn cover_unordered(rows: &[(u64, Row)], end: u64, p: u64) -> Option<Row> {
    let next = rows.iter().skip(1).map(|r| r.0).chain(std::iter::once(end));
    rows.iter().zip(next).find(|&(&(a, _), b)| a <= p && p < b).map(|(&(_, r), _)| r)
}

/// The `DW_TAG_subprogram` holding each of `probes` (sorted), by one
/// walk over the unit's DIEs: the first in DIE order, with its range
/// holding the probe. Stops once every probe has one: later DIEs change
/// no answer, nor any window (a window lies in its probe's subprogram).
fn subprograms(u: UnitRef<'_>, probes: &[u64]) -> gimli::Result<SubprogramFind> {
    let mut find = SubprogramFind { funcs: vec![None; probes.len()], edges: Edges::new(probes.len()) };
    let mut unanswered = probes.len();
    subprogram_ranges(u, |die, begin, end| {
        find.edges.note(probes, begin, end);
        let first = probes.partition_point(|&p| p < begin);
        for (i, _) in probes[first..].iter().enumerate().take_while(|(_, &p)| p < end) {
            if find.funcs[first + i].is_none() {
                find.funcs[first + i] = Some((die, begin, end));
                unanswered -= 1;
            }
        }
        unanswered > 0
    })?;
    find.edges = find.edges.finish();
    Ok(find)
}

/// Calls `f` with each `DW_TAG_subprogram` range of the unit, in DIE
/// order, until it returns `false` (checked after each subprogram).
fn subprogram_ranges(u: UnitRef<'_>, mut f: impl FnMut(UnitOffset, u64, u64) -> bool) -> gimli::Result<()> {
    let mut entries = u.entries_raw(None)?;
    let mut go_on = true;
    while !entries.is_empty() && go_on {
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
        r.for_each(u, |begin, end| go_on &= f(die, begin, end))?;
    }
    Ok(())
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
