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
//!   match their plain name;
//! - the file offset of a virtual address through the `PT_LOAD` segment that
//!   holds it ([`ElfFile::file_offset`]), which is what a uprobe needs, for
//!   PIE (`ET_DYN`) and non-PIE (`ET_EXEC`) files alike.
//!
//! Every length and offset in the file is bounds-checked by `object`; bad
//! input is an [`Error`], never a panic.
//!
//! A mapped file that is truncated while it is being read raises SIGBUS; the
//! readers here keep a mapping only for the duration of one parse.

pub mod notes;
pub mod unwind;

use memmap2::Mmap;
use object::elf::{FileHeader32, FileHeader64, PT_LOAD, PT_NOTE, SHN_UNDEF, SHT_DYNSYM, SHT_NOTE, SHT_SYMTAB};
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader, Sym};
use object::{Endianness, FileKind};
use std::fs::File;

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
enum Bytes {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn get(&self) -> &[u8] {
        match self {
            Bytes::Map(m) => m,
            Bytes::Owned(v) => v,
        }
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
    bytes: Bytes,
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
        let f = ElfFile { bytes, class };
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
            Class::Elf32 => find_functions::<FileHeader32<Endianness>>(self.bytes.get(), names),
            Class::Elf64 => find_functions::<FileHeader64<Endianness>>(self.bytes.get(), names),
        }
    }

    /// The `PT_LOAD` segments, in file order.
    pub fn load_segments(&self) -> Vec<LoadSegment> {
        match self.class {
            Class::Elf32 => load_segments::<FileHeader32<Endianness>>(self.bytes.get()),
            Class::Elf64 => load_segments::<FileHeader64<Endianness>>(self.bytes.get()),
        }
    }

    /// File offset of virtual address `vaddr`, through the `PT_LOAD`
    /// segment that holds it in the file (`p_vaddr <= vaddr < p_vaddr + p_filesz`).
    pub fn file_offset(&self, vaddr: u64) -> Option<u64> {
        match self.class {
            Class::Elf32 => file_offset::<FileHeader32<Endianness>>(self.bytes.get(), vaddr),
            Class::Elf64 => file_offset::<FileHeader64<Endianness>>(self.bytes.get(), vaddr),
        }
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

fn find_functions<H: FileHeader<Endian = Endianness>>(
    data: &[u8],
    names: &[&str],
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
                .map(|p| (p.p_vaddr(e).into(), p.p_filesz(e).into(), p.p_offset(e).into()))
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
            let kind = sym.st_type();
            if kind != object::elf::STT_FUNC && kind != object::elf::STT_GNU_IFUNC {
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

/// A `PT_LOAD` segment: where file bytes go in the address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub vaddr: u64,
    pub offset: u64,
    pub filesz: u64,
    pub executable: bool,
}

impl LoadSegment {
    /// The virtual address of file offset `offset` when this segment maps
    /// it (a mapping starts at the page holding `p_offset`, so offsets down
    /// to that page count).
    pub fn vaddr_of(&self, offset: u64, page_size: u64) -> Option<u64> {
        let first = self.offset - self.offset % page_size.max(1);
        (offset >= first && offset < self.offset.saturating_add(self.filesz))
            .then(|| self.vaddr.wrapping_sub(self.offset).wrapping_add(offset))
    }
}

fn load_segments<H: FileHeader<Endian = Endianness>>(data: &[u8]) -> Vec<LoadSegment> {
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

fn file_offset<H: FileHeader<Endian = Endianness>>(data: &[u8], vaddr: u64) -> Option<u64> {
    let h = H::parse(data).ok()?;
    let e = h.endian().ok()?;
    let loads: Vec<(u64, u64, u64)> = h
        .program_headers(e, data)
        .ok()?
        .iter()
        .filter(|p| p.p_type(e) == PT_LOAD)
        .map(|p| (p.p_vaddr(e).into(), p.p_filesz(e).into(), p.p_offset(e).into()))
        .collect();
    offset_in(&loads, vaddr)
}

#[cfg(test)]
mod tests;
