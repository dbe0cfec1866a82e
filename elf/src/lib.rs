//! profcol's one ELF reader.
//!
//! A file is memory-mapped read-only and parsed in place with the `object`
//! crate's low-level ELF API: only the pages of the ELF header, the program
//! and section headers, the symbol tables with their string tables and the
//! notes are ever touched, never the whole file (a 50 MB binary costs the
//! pages of its `.symtab`, not 50 MB of reads).
//!
//! What it answers:
//! - GNU build ID and Go build ID ([`ElfFile::gnu_build_id`],
//!   [`ElfFile::go_build_id`]), from `PT_NOTE` segments first (kept by
//!   `strip`), then `SHT_NOTE` sections; bare note blobs from sysfs through
//!   [`notes`];
//! - function symbols by name from `.symtab` and `.dynsym`
//!   ([`ElfFile::find_functions`]); versioned names (`malloc@@GLIBC_2.2.5`)
//!   match their plain name; data objects the same way
//!   ([`ElfFile::find_objects`]), and the file bytes at a virtual address
//!   ([`ElfFile::bytes_at`]) for their initial values;
//! - the file offset of a virtual address through the `PT_LOAD` segment that
//!   holds it ([`ElfFile::file_offset`]), which is what a uprobe needs, for
//!   PIE (`ET_DYN`) and non-PIE (`ET_EXEC`) files alike.
//!
//! - every function symbol, as a compact table for address lookups
//!   ([`ElfFile::function_symbols`]), the virtual address of a file offset
//!   ([`ElfFile::vaddr_of_file_offset`]), DWARF lines and inlined frames
//!   ([`ElfFile::dwarf_lines`], streamed per lookup with gimli over a
//!   small unit index), the `.gnu_debuglink`
//!   of a stripped file ([`ElfFile::debuglink`]), and a file id for files
//!   without a build ID ([`file_id`]).
//!
//! Every length and offset in the file is bounds-checked by `object`; bad
//! input is an [`Error`], never a panic.
//!
//! A mapped file that is truncated while it is being read raises SIGBUS.
//! Most readers keep a mapping only for the duration of one parse;
//! [`DwarfLines`] keeps it for as long as it lives (its uncompressed debug
//! sections are read in place, as blazesym and addr2line's own tool do), so
//! a debug file truncated in place under a loaded table is that risk.
//! Installers replace files by rename, which leaves the mapping intact.

mod dwarf;
mod gopclntab;
mod minidebuginfo;
pub mod notes;
mod symbols;
pub mod unwind;

pub use dwarf::{DwarfLines, SourceFrame};
pub use gopclntab::{GoFrame, GoLineTable};
pub use minidebuginfo::MiniDebugInfoError;
pub use symbols::SymbolTable;

use memmap2::Mmap;
use object::elf::{
    FileHeader32, FileHeader64, PT_LOAD, PT_NOTE, SHF_COMPRESSED, SHN_UNDEF, SHT_DYNSYM, SHT_NOBITS, SHT_NOTE,
    SHT_SYMTAB,
};
use object::read::elf::{CompressionHeader, FileHeader, ProgramHeader, SectionHeader, Sym};
use object::{Endianness, FileKind};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Why a file could not be read as ELF.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot map the file: {0}")]
    Map(#[from] std::io::Error),
    #[error("not an ELF file")]
    NotElf,
    #[error("malformed ELF: {0}")]
    Malformed(&'static str),
}

/// Bytes of a file: a read-only mapping, or owned bytes (tests, fixtures).
pub(crate) enum Bytes {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    pub(crate) fn get(&self) -> &[u8] {
        match self {
            Bytes::Map(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// A whole file mapped read-only, to read tables from in place (their
/// bytes are then page cache, which the kernel can drop and reread, not
/// anonymous memory). Like any mapping, it assumes the file is not
/// truncated underneath; callers map files they alone write, and replace
/// them by rename, never in place.
#[derive(Clone)]
pub struct MappedFile(std::sync::Arc<Bytes>);

impl MappedFile {
    pub fn open(file: &File) -> std::io::Result<Self> {
        // SAFETY: read-only and private; see the type's docs on truncation.
        let map = unsafe { Mmap::map(file)? };
        Ok(MappedFile(std::sync::Arc::new(Bytes::Map(map))))
    }

    pub fn bytes(&self) -> &[u8] {
        self.0.get()
    }
}

/// ELF class of a parsed file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Elf32,
    Elf64,
}

/// A function symbol found by [`ElfFile::find_functions`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundSymbol {
    /// The name as the table spells it (with its version, if any).
    pub name: String,
    /// `st_value`: the virtual address in the file's own address space.
    pub address: u64,
    pub size: u64,
    /// Where the code is in the file (what a uprobe attaches to).
    pub file_offset: u64,
}

/// Counts of what a symbol search looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SymbolTables {
    /// Entries of `.symtab` (0 when stripped).
    pub symtab: usize,
    /// Entries of `.dynsym`.
    pub dynsym: usize,
}

/// One ELF file, mapped and with a checked header.
pub struct ElfFile {
    /// Shared with the [`DwarfLines`] that read sections in place.
    bytes: std::sync::Arc<Bytes>,
    class: Class,
}

impl ElfFile {
    /// Maps `file` read-only and checks its ELF header.
    pub fn open(file: &File) -> Result<Self, Error> {
        // SAFETY: the mapping is read-only and private to this value; the
        // file may change underneath (see the module docs: SIGBUS on
        // truncation), which no safe API can rule out for a mapped file.
        let map = unsafe { Mmap::map(file)? };
        Self::new(Bytes::Map(map))
    }

    /// Parses owned bytes (tests and fixtures).
    pub fn from_vec(bytes: Vec<u8>) -> Result<Self, Error> {
        Self::new(Bytes::Owned(bytes))
    }

    fn new(bytes: Bytes) -> Result<Self, Error> {
        let class = match FileKind::parse(bytes.get()) {
            Ok(FileKind::Elf32) => Class::Elf32,
            Ok(FileKind::Elf64) => Class::Elf64,
            _ => return Err(Error::NotElf),
        };
        let f = ElfFile { bytes: std::sync::Arc::new(bytes), class };
        // Validate the header and both tables once, so later calls only
        // meet errors in the parts they read.
        match f.class {
            Class::Elf32 => f.check::<FileHeader32<Endianness>>()?,
            Class::Elf64 => f.check::<FileHeader64<Endianness>>()?,
        }
        Ok(f)
    }

    fn check<H: FileHeader<Endian = Endianness>>(&self) -> Result<(), Error> {
        let data = self.bytes.get();
        let h = H::parse(data).map_err(|_| Error::Malformed("ELF header"))?;
        let e = h.endian().map_err(|_| Error::Malformed("byte order"))?;
        h.program_headers(e, data).map_err(|_| Error::Malformed("program headers"))?;
        h.sections(e, data).map_err(|_| Error::Malformed("section headers"))?;
        Ok(())
    }

    /// Size of the file in bytes.
    pub fn len(&self) -> usize {
        self.bytes.get().len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.get().is_empty()
    }

    /// The GNU build ID (`NT_GNU_BUILD_ID`), if the file has one.
    pub fn gnu_build_id(&self) -> Option<&[u8]> {
        self.find_note(|n| notes::gnu_build_id(n))
    }

    /// The Go build ID (`NT_GO_BUILD_ID` in `.note.go.buildid`), if any.
    pub fn go_build_id(&self) -> Option<&str> {
        self.find_note(|n| notes::go_build_id(n))
    }

    fn find_note<'a, T: 'a>(&'a self, f: impl Fn(&mut dyn Iterator<Item = notes::Note<'a>>) -> Option<T>) -> Option<T> {
        match self.class {
            Class::Elf32 => find_note::<FileHeader32<Endianness>, T>(self.bytes.get(), f),
            Class::Elf64 => find_note::<FileHeader64<Endianness>, T>(self.bytes.get(), f),
        }
    }

    /// Defined function symbols named in `names`, from `.symtab` then
    /// `.dynsym`; `out[i]` is the first match of `names[i]`. A name in the
    /// file matches when equal, or equal up to its `@` version suffix.
    /// Symbols whose address lies in no `PT_LOAD` segment are skipped.
    pub fn find_functions(&self, names: &[&str]) -> (Vec<Option<FoundSymbol>>, SymbolTables) {
        match self.class {
            Class::Elf32 => find_functions::<FileHeader32<Endianness>>(self.bytes.get(), names, is_function, false),
            Class::Elf64 => find_functions::<FileHeader64<Endianness>>(self.bytes.get(), names, is_function, false),
        }
    }

    /// [`Self::find_functions`] for data objects (`STT_OBJECT`): variables
    /// whose values a profiler reads (an interpreter's runtime state).
    /// Zero-initialized ones (`.bss`) are found too; their `file_offset`
    /// lies past their segment's file bytes (contents: [`Self::bytes_at`]).
    pub fn find_objects(&self, names: &[&str]) -> (Vec<Option<FoundSymbol>>, SymbolTables) {
        let is_object = |kind: object::elf::SymbolType| kind == object::elf::STT_OBJECT;
        match self.class {
            Class::Elf32 => find_functions::<FileHeader32<Endianness>>(self.bytes.get(), names, is_object, true),
            Class::Elf64 => find_functions::<FileHeader64<Endianness>>(self.bytes.get(), names, is_object, true),
        }
    }

    /// The `len` file bytes at virtual address `vaddr`, when a `PT_LOAD`
    /// segment holds all of them in the file.
    pub fn bytes_at(&self, vaddr: u64, len: usize) -> Option<&[u8]> {
        let start = self.file_offset(vaddr)?;
        let last = self.file_offset(vaddr.checked_add(len.checked_sub(1)? as u64)?)?;
        if last.checked_sub(start)? != len as u64 - 1 {
            return None; // split across segments
        }
        let start = usize::try_from(start).ok()?;
        self.bytes.get().get(start..start.checked_add(len)?)
    }

    /// File offset of virtual address `vaddr`, through the `PT_LOAD`
    /// segment that holds it in the file (`p_vaddr <= vaddr < p_vaddr + p_filesz`).
    pub fn file_offset(&self, vaddr: u64) -> Option<u64> {
        offset_in(&self.loads(), vaddr)
    }

    /// The `PT_LOAD` segments, in file order.
    pub fn load_segments(&self) -> Vec<LoadSegment> {
        match self.class {
            Class::Elf32 => load_segment_list::<FileHeader32<Endianness>>(self.bytes.get()),
            Class::Elf64 => load_segment_list::<FileHeader64<Endianness>>(self.bytes.get()),
        }
    }

    /// The `PT_LOAD` segments as (p_vaddr, p_filesz, p_offset).
    fn loads(&self) -> Vec<(u64, u64, u64)> {
        match self.class {
            Class::Elf32 => load_segments::<FileHeader32<Endianness>>(self.bytes.get()),
            Class::Elf64 => load_segments::<FileHeader64<Endianness>>(self.bytes.get()),
        }
        .unwrap_or_default()
    }

    /// Virtual address of file offset `offset` through the `PT_LOAD`
    /// segment that maps it (the inverse of [`Self::file_offset`]).
    pub fn vaddr_of_file_offset(&self, offset: u64) -> Option<u64> {
        vaddr_in(&self.loads(), offset)
    }

    /// Every defined function symbol of `.symtab` and `.dynsym`, compact.
    pub fn function_symbols(&self) -> SymbolTable {
        self.function_symbols_with(None)
    }

    /// [`Self::function_symbols`] together with those of `more` (the ELF
    /// of a MiniDebugInfo section, whose `.symtab` adds what `.dynsym`
    /// lacks), as one table.
    pub fn function_symbols_with(&self, more: Option<&ElfFile>) -> SymbolTable {
        let mut raw = Vec::new();
        for f in std::iter::once(self).chain(more) {
            match f.class {
                Class::Elf32 => collect_function_symbols::<FileHeader32<Endianness>>(f.bytes.get(), &mut raw),
                Class::Elf64 => collect_function_symbols::<FileHeader64<Endianness>>(f.bytes.get(), &mut raw),
            }
        }
        SymbolTable::build(raw)
    }

    /// Whether the file has a non-empty `.symtab` (not stripped).
    pub fn has_symtab(&self) -> bool {
        self.section_size(".symtab").is_some_and(|n| n > 0)
    }

    /// Whether the file has DWARF (`.debug_info` with contents).
    pub fn has_debug_info(&self) -> bool {
        self.section_size(".debug_info").is_some_and(|n| n > 0)
    }

    /// Size in the file of section `name` (0 for `SHT_NOBITS`).
    pub fn section_size(&self, name: &str) -> Option<u64> {
        match self.class {
            Class::Elf32 => section_size::<FileHeader32<Endianness>>(self.bytes.get(), name),
            Class::Elf64 => section_size::<FileHeader64<Endianness>>(self.bytes.get(), name),
        }
    }

    /// Bytes of section `name`, decompressed when `SHF_COMPRESSED` (zlib);
    /// `None` when absent, `SHT_NOBITS`, or compressed in a format not read.
    /// At most `max` bytes after decompression (a bomb is refused).
    pub(crate) fn section_bytes(&self, name: &str, max: usize) -> Option<Vec<u8>> {
        match self.class {
            Class::Elf32 => section_bytes::<FileHeader32<Endianness>>(self.bytes.get(), name, max),
            Class::Elf64 => section_bytes::<FileHeader64<Endianness>>(self.bytes.get(), name, max),
        }
    }

    /// The file name `.gnu_debuglink` names (the separate debug file of a
    /// stripped binary) and its CRC-32.
    pub fn debuglink(&self) -> Option<(String, u32)> {
        let data = self.section_bytes(".gnu_debuglink", 64 << 10)?;
        let nul = data.iter().position(|&b| b == 0)?;
        let name = std::str::from_utf8(&data[..nul]).ok()?;
        if name.is_empty() || name.contains('/') {
            return None;
        }
        let crc_at = (nul + 4) & !3;
        let crc = data.get(crc_at..crc_at + 4)?;
        let crc = u32::from_le_bytes(crc.try_into().ok()?);
        let crc = if self.big_endian() { crc.swap_bytes() } else { crc };
        Some((name.to_owned(), crc))
    }

    /// DWARF lines and inlined frames, when the file has `.debug_info`.
    /// Uncompressed debug sections are read in place from the mapping
    /// (which the result keeps alive); compressed ones are decompressed
    /// into the heap, each at most `max_section` bytes.
    pub fn dwarf_lines(&self, max_section: usize) -> Option<DwarfLines> {
        self.dwarf_lines_spilled(max_section, None)
    }

    /// [`Self::dwarf_lines`], compressed sections decompressed into
    /// unlinked files in directory `spill` and mapped: page cache, which
    /// the kernel writes back and reclaims, not the heap (a distribution's
    /// debug file of libc holds ~10 MB of compressed DWARF). A section
    /// that cannot be written there is decompressed into the heap.
    pub fn dwarf_lines_spilled(&self, max_section: usize, spill: Option<&Path>) -> Option<DwarfLines> {
        if !self.has_debug_info() {
            return None;
        }
        DwarfLines::load(self.big_endian(), |name| {
            let data = self.bytes.get();
            let found = match self.class {
                Class::Elf32 => section_ref::<FileHeader32<Endianness>>(data, name, max_section),
                Class::Elf64 => section_ref::<FileHeader64<Endianness>>(data, name, max_section),
            }?;
            Some(match found {
                SectionRef::InPlace(range) => dwarf::Section::in_place(self.bytes.clone(), range),
                SectionRef::Compressed(range, size) => {
                    match spill.and_then(|dir| decompress_to_file(&data[range.clone()], size, dir)) {
                        Some(map) => dwarf::Section::in_place(std::sync::Arc::new(Bytes::Map(map)), 0..size),
                        None => dwarf::Section::owned(decompress(&data[range], size)?),
                    }
                }
            })
        })
    }

    /// Go's function and line table (`.gopclntab`) of a Go binary: by
    /// section name (`.data.rel.ro.gopclntab` in a PIE), or, without section headers, by its magic in a
    /// read-only `PT_LOAD` segment (only in a file with a Go build ID).
    /// At most `max` bytes are copied.
    pub fn go_pclntab(&self, max: usize) -> Option<GoLineTable> {
        let text = self.section_address(".text");
        // PIE builds put it in relocated read-only data.
        for name in [".gopclntab", ".data.rel.ro.gopclntab"] {
            if let Some(bytes) = self.section_bytes(name, max) {
                return GoLineTable::parse(bytes, self.big_endian(), text).ok();
            }
        }
        if self.go_build_id().is_none() || self.section_size(".text").is_some() {
            return None; // not Go, or sections are there and none is the table
        }
        let data = self.bytes.get();
        for seg in self.load_segments().iter().filter(|s| !s.executable) {
            let start = usize::try_from(seg.offset).ok()?;
            let end = start.checked_add(usize::try_from(seg.filesz).ok()?)?;
            let Some(bytes) = data.get(start..end) else { continue };
            if let Some(at) = gopclntab::find_header(bytes, self.big_endian(), text) {
                let rest = &bytes[at..];
                return GoLineTable::parse(rest[..rest.len().min(max)].to_vec(), self.big_endian(), text).ok();
            }
        }
        None
    }

    /// `sh_addr` of section `name`.
    pub fn section_address(&self, name: &str) -> Option<u64> {
        match self.class {
            Class::Elf32 => section_address::<FileHeader32<Endianness>>(self.bytes.get(), name),
            Class::Elf64 => section_address::<FileHeader64<Endianness>>(self.bytes.get(), name),
        }
    }

    fn big_endian(&self) -> bool {
        let data = self.bytes.get();
        // EI_DATA: 2 = big-endian; the header was checked in `new`.
        data.get(5) == Some(&2)
    }
}

/// Bytes hashed at each end of a file for [`file_id`].
pub(crate) const FILE_ID_EDGE: u64 = 4096;

/// Demangles Rust (v0 and legacy) and C++ names; others unchanged.
pub fn demangle(name: &str) -> String {
    addr2line::demangle_auto(name.into(), None).into_owned()
}

/// An id for a file without a GNU build ID (Go binaries by default): the
/// first 128 bits of SHA-256 over its first and last 4 KiB and its size
/// (big-endian u64), in hex: the OTel profiler's `htlhash`. Reads 8 KiB,
/// whatever the file's size.
pub fn file_id(file: &File) -> std::io::Result<String> {
    let size = file.metadata()?.len();
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; FILE_ID_EDGE as usize];
    let head = size.min(FILE_ID_EDGE) as usize;
    file.read_exact_at(&mut buf[..head], 0)?;
    ctx.update(&buf[..head]);
    let tail_at = size.saturating_sub(FILE_ID_EDGE);
    let tail = (size - tail_at) as usize;
    file.read_exact_at(&mut buf[..tail], tail_at)?;
    ctx.update(&buf[..tail]);
    ctx.update(&size.to_be_bytes());
    Ok(notes::hex(&ctx.finish().as_ref()[..16]))
}

/// CRC-32 (IEEE, as `.gnu_debuglink` uses) of a whole file, read in chunks.
pub fn debuglink_crc(file: &mut File) -> std::io::Result<u32> {
    file.seek(SeekFrom::Start(0))?;
    let mut crc = flate2::Crc::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(crc.sum());
        }
        crc.update(&buf[..n]);
    }
}

fn find_note<'a, H: FileHeader<Endian = Endianness>, T>(
    data: &'a [u8],
    f: impl Fn(&mut dyn Iterator<Item = notes::Note<'a>>) -> Option<T>,
) -> Option<T> {
    let h = H::parse(data).ok()?;
    let e = h.endian().ok()?;
    // Segments first: `strip` keeps them, and they are found without the
    // section headers.
    for ph in h.program_headers(e, data).ok()? {
        if ph.p_type(e) != PT_NOTE {
            continue;
        }
        if let Ok(bytes) = ph.data(e, data) {
            if let Some(v) = f(&mut notes::iter(bytes, e)) {
                return Some(v);
            }
        }
    }
    let sections = h.sections(e, data).ok()?;
    for sh in sections.iter() {
        if sh.sh_type(e) != SHT_NOTE {
            continue;
        }
        if let Ok(bytes) = sh.data(e, data) {
            if let Some(v) = f(&mut notes::iter(bytes, e)) {
                return Some(v);
            }
        }
    }
    None
}

/// The name without its symbol version (`malloc@@GLIBC_2.2.5` → `malloc`).
fn unversioned(name: &[u8]) -> &[u8] {
    match name.iter().position(|&b| b == b'@') {
        Some(i) => &name[..i],
        None => name,
    }
}

fn is_function(kind: object::elf::SymbolType) -> bool {
    kind == object::elf::STT_FUNC || kind == object::elf::STT_GNU_IFUNC
}

fn find_functions<H: FileHeader<Endian = Endianness>>(
    data: &[u8],
    names: &[&str],
    wanted: impl Fn(object::elf::SymbolType) -> bool,
    in_memory: bool,
) -> (Vec<Option<FoundSymbol>>, SymbolTables) {
    let mut out = vec![None; names.len()];
    let mut counts = SymbolTables::default();
    let Ok(h) = H::parse(data) else {
        return (out, counts);
    };
    let Ok(e) = h.endian() else {
        return (out, counts);
    };
    let Ok(sections) = h.sections(e, data) else {
        return (out, counts);
    };
    let loads: Vec<(u64, u64, u64)> = h
        .program_headers(e, data)
        .map(|phs| {
            phs.iter()
                .filter(|p| p.p_type(e) == PT_LOAD)
                .map(|p| {
                    // Data may lie in the zero-filled tail (`.bss`); code never.
                    let size = if in_memory { p.p_memsz(e).into() } else { p.p_filesz(e).into() };
                    (p.p_vaddr(e).into(), size, p.p_offset(e).into())
                })
                .collect()
        })
        .unwrap_or_default();
    for table in [SHT_SYMTAB, SHT_DYNSYM] {
        let Ok(symbols) = sections.symbols(e, data, table) else {
            continue;
        };
        if table == SHT_SYMTAB {
            counts.symtab = symbols.len();
        } else {
            counts.dynsym = symbols.len();
        }
        let strings = symbols.strings();
        for sym in symbols.iter() {
            if sym.st_shndx(e) == SHN_UNDEF || sym.st_value(e).into() == 0 {
                continue;
            }
            if !wanted(sym.st_type()) {
                continue;
            }
            let Ok(raw) = sym.name(e, strings) else {
                continue;
            };
            let plain = unversioned(raw);
            for (i, want) in names.iter().enumerate() {
                if out[i].is_some() || plain != want.as_bytes() {
                    continue;
                }
                let address: u64 = sym.st_value(e).into();
                let Some(file_offset) = offset_in(&loads, address) else {
                    continue;
                };
                out[i] = Some(FoundSymbol {
                    name: String::from_utf8_lossy(raw).into_owned(),
                    address,
                    size: sym.st_size(e).into(),
                    file_offset,
                });
            }
        }
    }
    (out, counts)
}

fn offset_in(loads: &[(u64, u64, u64)], vaddr: u64) -> Option<u64> {
    loads
        .iter()
        .find(|&&(start, filesz, _)| vaddr >= start && vaddr - start < filesz)
        .map(|&(start, _, off)| vaddr - start + off)
}

fn vaddr_in(loads: &[(u64, u64, u64)], offset: u64) -> Option<u64> {
    loads
        .iter()
        .find(|&&(_, filesz, off)| offset >= off && offset - off < filesz)
        .map(|&(start, _, off)| offset - off + start)
}

/// A `PT_LOAD` segment: where file bytes go in the address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub vaddr: u64,
    pub offset: u64,
    pub filesz: u64,
    pub executable: bool,
}

fn load_segment_list<H: FileHeader<Endian = Endianness>>(data: &[u8]) -> Vec<LoadSegment> {
    let Ok(h) = H::parse(data) else { return Vec::new() };
    let Ok(e) = h.endian() else { return Vec::new() };
    let Ok(phs) = h.program_headers(e, data) else { return Vec::new() };
    phs.iter()
        .filter(|p| p.p_type(e) == PT_LOAD)
        .map(|p| LoadSegment {
            vaddr: p.p_vaddr(e).into(),
            offset: p.p_offset(e).into(),
            filesz: p.p_filesz(e).into(),
            executable: (p.p_flags(e) & object::elf::PF_X).0 != 0,
        })
        .collect()
}

fn load_segments<H: FileHeader<Endian = Endianness>>(data: &[u8]) -> Option<Vec<(u64, u64, u64)>> {
    let h = H::parse(data).ok()?;
    let e = h.endian().ok()?;
    Some(
        h.program_headers(e, data)
            .ok()?
            .iter()
            .filter(|p| p.p_type(e) == PT_LOAD)
            .map(|p| (p.p_vaddr(e).into(), p.p_filesz(e).into(), p.p_offset(e).into()))
            .collect(),
    )
}

fn collect_function_symbols<'a, H: FileHeader<Endian = Endianness>>(
    data: &'a [u8],
    raw: &mut Vec<symbols::RawSymbol<'a>>,
) {
    let Ok(h) = H::parse(data) else { return };
    let Ok(e) = h.endian() else { return };
    let Ok(sections) = h.sections(e, data) else { return };
    for table in [SHT_SYMTAB, SHT_DYNSYM] {
        let Ok(symbols) = sections.symbols(e, data, table) else {
            continue;
        };
        let strings = symbols.strings();
        for sym in symbols.iter() {
            let start: u64 = sym.st_value(e).into();
            if sym.st_shndx(e) == SHN_UNDEF || start == 0 {
                continue;
            }
            let kind = sym.st_type();
            if kind != object::elf::STT_FUNC && kind != object::elf::STT_GNU_IFUNC {
                continue;
            }
            let Ok(name) = sym.name(e, strings) else {
                continue;
            };
            if name.is_empty() {
                continue;
            }
            let rank = match sym.st_bind() {
                object::elf::STB_GLOBAL => 0,
                object::elf::STB_WEAK => 1,
                _ => 2,
            };
            raw.push(symbols::RawSymbol { start, size: sym.st_size(e).into(), name: unversioned(name), rank });
        }
    }
}

fn section_size<H: FileHeader<Endian = Endianness>>(data: &[u8], name: &str) -> Option<u64> {
    let h = H::parse(data).ok()?;
    let e = h.endian().ok()?;
    let sections = h.sections(e, data).ok()?;
    let (_, sh) = sections.section_by_name(e, name.as_bytes())?;
    if sh.sh_type(e) == SHT_NOBITS {
        return Some(0);
    }
    Some(sh.sh_size(e).into())
}

fn section_address<H: FileHeader<Endian = Endianness>>(data: &[u8], name: &str) -> Option<u64> {
    let h = H::parse(data).ok()?;
    let e = h.endian().ok()?;
    let sections = h.sections(e, data).ok()?;
    let (_, sh) = sections.section_by_name(e, name.as_bytes())?;
    Some(sh.sh_addr(e).into())
}

fn section_bytes<H: FileHeader<Endian = Endianness>>(data: &[u8], name: &str, max: usize) -> Option<Vec<u8>> {
    match section_ref::<H>(data, name, max)? {
        SectionRef::InPlace(range) => Some(data[range].to_vec()),
        SectionRef::Compressed(range, size) => decompress(&data[range], size),
    }
}

/// Where a section's contents are in the file: as they are, or zlib
/// compressed (the compressed bytes, and their size once decompressed).
enum SectionRef {
    InPlace(std::ops::Range<usize>),
    Compressed(std::ops::Range<usize>, usize),
}

/// `compressed` (zlib) inflated, when it is exactly `size` bytes.
fn decompress(compressed: &[u8], size: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(size);
    let mut z = flate2::read::ZlibDecoder::new(compressed).take(size as u64);
    z.read_to_end(&mut out).ok()?;
    (out.len() == size).then_some(out)
}

/// [`decompress`] into an unlinked file in `dir`, mapped: `None` when it
/// cannot be written there, or does not inflate to exactly `size` bytes.
fn decompress_to_file(compressed: &[u8], size: usize, dir: &Path) -> Option<Mmap> {
    if size == 0 {
        return None;
    }
    let mut file = tempfile::tempfile_in(dir).ok()?;
    let mut z = flate2::read::ZlibDecoder::new(compressed).take(size as u64);
    let written = std::io::copy(&mut z, &mut std::io::BufWriter::with_capacity(64 << 10, &mut file)).ok()?;
    if written != size as u64 {
        return None;
    }
    // SAFETY: the file is unlinked and private to this process: nothing
    // else can change it while mapped.
    unsafe { Mmap::map(&file) }.ok().filter(|m| m.len() == size)
}

fn section_ref<H: FileHeader<Endian = Endianness>>(data: &[u8], name: &str, max: usize) -> Option<SectionRef> {
    let h = H::parse(data).ok()?;
    let e = h.endian().ok()?;
    let sections = h.sections(e, data).ok()?;
    let (_, sh) = sections.section_by_name(e, name.as_bytes())?;
    if sh.sh_type(e) == SHT_NOBITS {
        return None;
    }
    if !sh.sh_flags(e).contains(SHF_COMPRESSED) {
        let (offset, size) = sh.file_range(e)?;
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(size).ok()?)?;
        return (end <= data.len() && end - start <= max).then_some(SectionRef::InPlace(start..end));
    }
    let (header, offset, size) = sh.compression(e, data).ok()??;
    if header.ch_type(e) != object::elf::ELFCOMPRESS_ZLIB {
        return None;
    }
    let want = usize::try_from(header.ch_size(e).into()).ok()?;
    if want > max {
        return None;
    }
    let range = usize::try_from(offset).ok()?..usize::try_from(offset.checked_add(size)?).ok()?;
    data.get(range.clone())?;
    Some(SectionRef::Compressed(range, want))
}

#[cfg(test)]
mod tests;
