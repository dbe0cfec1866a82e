//! One binary's symbols, loaded once per build id (or file id): the
//! binary's `PT_LOAD` segments (file offset → virtual address), its
//! function symbols and, with `lines`, its DWARF, each from the best file
//! found (a separate debug file wins over the binary). The binary is the
//! local file, or, when it is not on this host, the executable debuginfod
//! serves for the build id. Resolved offsets are memoized, bounded; a
//! batch's new offsets are resolved together
//! ([`BinaryTable::resolve_many`]), each DWARF unit streamed once.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, OnceLock};

use profcol_api::services::PinnedFile;

use super::debuginfod::{Artifact, Debuginfod, DebuginfodCounters};
use super::disk::DiskTable;
use profcol_elf::{DwarfLines, ElfFile, GoLineTable, SymbolTable};
use rustc_hash::FxHashMap;

/// Largest debug section read (after decompression).
const MAX_DEBUG_SECTION: usize = 1 << 30;
/// Largest MiniDebugInfo ELF (after xz decompression): Fedora's are a few
/// hundred KiB; more is refused as a bomb.
const MAX_MINIDEBUGINFO: usize = 256 << 20;
/// Resolved offsets memoized per table; the memo is cleared when full.
const MEMO_ENTRIES: usize = 1 << 16;

/// One named frame: a function, and where in the source when known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedFrame {
    /// Demangled.
    pub name: Box<str>,
    /// As the binary spells it (mangled); equal to `name` for C.
    pub system_name: Box<str>,
    pub file: Box<str>,
    pub line: u32,
}

impl NamedFrame {
    fn heap_bytes(&self) -> usize {
        self.name.len() + self.system_name.len() + self.file.len() + std::mem::size_of::<Self>()
    }
}

/// Frames at one address, innermost inlined function first; empty when
/// nothing names it.
pub type Frames = Arc<[NamedFrame]>;

/// Where a table's parts came from (for `profcol symbols lookup` and logs).
#[derive(Clone, Debug, Default)]
pub struct Sources {
    pub binary: Option<PathBuf>,
    pub debug_file: Option<PathBuf>,
}

pub struct BinaryTable {
    segments: Vec<(u64, u64, u64)>,
    symbols: SymbolTable,
    /// Set at load, or later by [`BinaryTable::attach_dwarf`] for a table
    /// read from disk.
    dwarf: OnceLock<DwarfLines>,
    /// The file the table was made from had DWARF (and `lines` was on).
    had_dwarf: bool,
    /// Go's own table, for a Go binary without DWARF: names and lines.
    /// Such a table is not written to the on-disk cache (it holds
    /// functions from the symbol tables only).
    go: Option<GoLineTable>,
    memo: Mutex<FxHashMap<u64, Frames>>,
    memo_bytes: std::sync::atomic::AtomicUsize,
    /// Bytes of a downloaded file the DWARF keeps alive beyond its debug
    /// sections.
    held: AtomicUsize,
    pub sources: Sources,
}

/// Why no table could be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Missing {
    /// No readable file with this build id / file id.
    NoFile,
    /// The file was found but neither it nor a debug file has symbols.
    NoSymbols,
}

/// What the loader needs to find a binary.
#[derive(Clone, Debug)]
pub struct Want {
    /// Build id or file id (hex).
    pub key: Arc<str>,
    pub is_build_id: bool,
    /// The mapping's path as the process saw it.
    pub path: Arc<str>,
}

/// Where separate debug files are searched, and which sources are read.
#[derive(Clone, Debug)]
pub struct SearchPaths {
    pub debug_dirs: Vec<PathBuf>,
    pub lines: bool,
    /// Read `.gnu_debugdata` (MiniDebugInfo) of a binary without `.symtab`.
    pub minidebuginfo: bool,
    /// Read Go's `.gopclntab` of a Go binary without DWARF.
    pub go_pclntab: bool,
    /// Where compressed debug sections are decompressed to (unlinked
    /// files, mapped) rather than into the heap: `cache.dir`, when usable.
    pub spill_dir: Option<PathBuf>,
}

impl Default for SearchPaths {
    fn default() -> Self {
        SearchPaths { debug_dirs: Vec::new(), lines: true, minidebuginfo: true, go_pclntab: true, spill_dir: None }
    }
}

/// What the on-disk cache stores of a table: load segments (vaddr, file
/// size, offset), the function symbols, and whether the files had DWARF.
pub(crate) type DiskParts<'a> = (&'a [(u64, u64, u64)], &'a SymbolTable, bool);

/// The files a table is read from: the binary, and its best debug file;
/// each with whether it was downloaded (its bytes are on the heap).
struct Opened {
    elf: ElfFile,
    elf_downloaded: bool,
    binary_path: PathBuf,
    debug: Option<(ElfFile, PathBuf, bool)>,
}

impl Opened {
    /// The binary from its pin (`pinned`) or else its path on this host
    /// (checked to have the same id); when neither is, and debuginfod is
    /// configured, the executable by build id (a gateway, where the
    /// binaries are on the agents' hosts). Then the best debug file
    /// (asking debuginfod when no local one is found and the binary lacks
    /// DWARF, with `lines`, or symbols).
    fn open(
        want: &Want,
        pinned: Option<PinnedFile>,
        search: &SearchPaths,
        mut debuginfod: Option<(&mut Debuginfod, &DebuginfodCounters)>,
    ) -> Result<Self, Missing> {
        let local = match pinned {
            Some(p) => {
                p.file.try_clone().ok().map(|f| (f, PathBuf::from(&*p.path), p.root.map(|r| PathBuf::from(&*r))))
            }
            None => open_regular(Path::new(&*want.path)).map(|f| (f, PathBuf::from(&*want.path), None)),
        };
        let local = local.and_then(|(f, path, root)| {
            let elf = ElfFile::open(&f).ok()?;
            same_identity(&elf, &f, want).then_some((elf, path, root))
        });
        let (elf, elf_downloaded, binary_path, root) = match local {
            Some((elf, path, root)) => (elf, false, path, root),
            None => {
                let Some((client, counters)) = debuginfod.as_mut().filter(|_| want.is_build_id) else {
                    return Err(Missing::NoFile);
                };
                // Its load segments map file offsets to addresses: a debug
                // file alone cannot (objcopy zeroes their file sizes).
                let elf = fetch_matching(client, counters, &want.key, Artifact::Executable)
                    .filter(|e| e.load_segments().iter().any(|s| s.filesz > 0))
                    .ok_or(Missing::NoFile)?;
                (elf, true, PathBuf::from(format!("debuginfod:{}/executable", want.key)), None)
            }
        };
        // `.gnu_debuglink` is looked up beside the path the process mapped.
        let link_base = if elf_downloaded { Path::new(&*want.path) } else { binary_path.as_path() };
        let mut debug = find_debug_file(&elf, want, link_base, root.as_deref(), search).map(|(d, p)| (d, p, false));
        let needs = (search.lines && !elf.has_debug_info()) || !elf.has_symtab();
        if let (None, true, true, Some((client, counters))) = (&debug, needs, want.is_build_id, debuginfod) {
            debug = fetch_matching(client, counters, &want.key, Artifact::Debuginfo)
                .map(|d| (d, PathBuf::from(format!("debuginfod:{}", want.key)), true));
        }
        Ok(Opened { elf, elf_downloaded, binary_path, debug })
    }

    /// The DWARF of the debug file, else of the binary; with the bytes of a
    /// downloaded file it keeps alive beyond its debug sections (the rest
    /// of the heap copy, which [`BinaryTable::heap_bytes`] counts too).
    fn dwarf(&self, search: &SearchPaths) -> Option<(DwarfLines, usize)> {
        let read = |f: &ElfFile, downloaded: bool| {
            f.dwarf_lines_spilled(MAX_DEBUG_SECTION, search.spill_dir.as_deref()).map(|d| {
                let rest = if downloaded { f.len().saturating_sub(d.in_memory_file_bytes()) } else { 0 };
                (d, rest)
            })
        };
        self.debug.as_ref().and_then(|(d, _, dl)| read(d, *dl)).or_else(|| read(&self.elf, self.elf_downloaded))
    }
}

/// `what` of `build_id` from debuginfod, when it is an ELF file with that
/// build id.
fn fetch_matching(
    client: &mut Debuginfod,
    counters: &DebuginfodCounters,
    build_id: &str,
    what: Artifact,
) -> Option<ElfFile> {
    client
        .fetch(build_id, what, counters)
        .and_then(|bytes| ElfFile::from_vec(bytes).ok())
        .filter(|e| e.gnu_build_id().map(profcol_elf::notes::hex).as_deref() == Some(build_id))
}

/// `path` when it is a regular file: a mapping's path may come from another
/// host (OTLP), and opening a FIFO or a device there must not block or read
/// it.
fn open_regular(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).ok()?;
    f.metadata().ok()?.is_file().then_some(f)
}

impl BinaryTable {
    /// Loads the table for `want`: the binary from its pin (`pinned`) or
    /// else its path on this host (checked to have the same id), then the
    /// best debug file.
    pub fn load(want: &Want, pinned: Option<PinnedFile>, search: &SearchPaths) -> Result<Self, Missing> {
        Self::load_with(want, pinned, search, None)
    }

    /// [`Self::load`], asking debuginfod for the executable when the binary
    /// is not on this host, and for the debug file when no local one is
    /// found and the binary lacks DWARF (with `lines`) or symbols. A
    /// downloaded file is dropped once the table is built, unless the
    /// table reads its DWARF.
    pub(crate) fn load_with(
        want: &Want,
        pinned: Option<PinnedFile>,
        search: &SearchPaths,
        debuginfod: Option<(&mut Debuginfod, &DebuginfodCounters)>,
    ) -> Result<Self, Missing> {
        let opened = Opened::open(want, pinned, search, debuginfod)?;
        let (elf, debug) = (&opened.elf, &opened.debug);
        let segments = elf.load_segments().iter().map(|s| (s.vaddr, s.filesz, s.offset)).collect();
        let (sym_src, debug_path) = match debug {
            Some((d, p, _)) if d.has_symtab() => (d, Some(p.clone())),
            Some((_, p, _)) => (elf, Some(p.clone())),
            None => (elf, None),
        };
        let mut symbols = sym_src.function_symbols();
        if symbols.is_empty() {
            symbols = elf.function_symbols();
        }
        // MiniDebugInfo: the static functions .dynsym lacks, when no
        // .symtab came from the binary or a debug file.
        if search.minidebuginfo && !sym_src.has_symtab() {
            if let Ok(Some(mini)) = elf.mini_debug_info(MAX_MINIDEBUGINFO) {
                symbols = elf.function_symbols_with(Some(&mini));
            }
        }
        let (dwarf, held) = match search.lines.then(|| opened.dwarf(search)).flatten() {
            Some((d, held)) => (Some(d), held),
            None => (None, 0),
        };
        let go = match (&dwarf, search.go_pclntab) {
            (None, true) => elf.go_pclntab(MAX_DEBUG_SECTION),
            _ => None,
        };
        if symbols.is_empty() && dwarf.is_none() && go.is_none() {
            return Err(Missing::NoSymbols);
        }
        // Whether lines could be had from these files (recorded on disk
        // even when this run does not read them).
        let had_dwarf = elf.has_debug_info() || debug.as_ref().is_some_and(|(d, _, _)| d.has_debug_info());
        Ok(BinaryTable {
            segments,
            symbols,
            dwarf: dwarf.map(OnceLock::from).unwrap_or_default(),
            had_dwarf,
            go,
            memo: Mutex::new(FxHashMap::default()),
            memo_bytes: Default::default(),
            held: AtomicUsize::new(held),
            sources: Sources { binary: Some(opened.binary_path), debug_file: debug_path },
        })
    }

    /// A table read back from the on-disk cache: functions only until
    /// [`Self::attach_dwarf`] adds lines.
    pub fn from_disk(t: DiskTable) -> Self {
        BinaryTable {
            segments: t.segments,
            symbols: t.symbols,
            dwarf: OnceLock::new(),
            had_dwarf: t.had_dwarf,
            go: None,
            memo: Mutex::new(FxHashMap::default()),
            memo_bytes: Default::default(),
            held: AtomicUsize::new(0),
            sources: Sources::default(),
        }
    }

    /// Uses `symbols` (the same table read back from the on-disk cache,
    /// names in place) instead of the heap copy.
    pub(crate) fn use_symbols(&mut self, symbols: SymbolTable) {
        if symbols.len() == self.symbols.len() {
            self.symbols = symbols;
        }
    }

    /// Whether the file this table came from had DWARF that this table
    /// has not (read from disk, lines wanted): the loader attaches it.
    pub(crate) fn wants_dwarf(&self) -> bool {
        self.had_dwarf && self.dwarf.get().is_none()
    }

    /// Opens `want`'s files again and adds their DWARF (lines, inlined
    /// frames) to a table read from disk; resolved offsets are forgotten so
    /// they are resolved again with lines. False when no file or no DWARF
    /// is found (the table keeps naming functions).
    pub(crate) fn attach_dwarf(
        &self,
        want: &Want,
        pinned: Option<PinnedFile>,
        search: &SearchPaths,
        debuginfod: Option<(&mut Debuginfod, &DebuginfodCounters)>,
    ) -> bool {
        let Some((dwarf, held)) = Opened::open(want, pinned, search, debuginfod).ok().and_then(|o| o.dwarf(search))
        else {
            return false;
        };
        // Under the memo's lock: a resolve either ran before (its result is
        // dropped here) or runs after and sees the DWARF.
        let mut memo = self.memo.lock().unwrap_or_else(|p| p.into_inner());
        let attached = self.dwarf.set(dwarf).is_ok();
        if attached {
            self.held.store(held, std::sync::atomic::Ordering::Relaxed);
        }
        memo.clear();
        self.memo_bytes.store(0, std::sync::atomic::Ordering::Relaxed);
        attached
    }

    /// The segments and symbols, as the on-disk cache stores them; `None`
    /// for a table named by Go's pclntab, which the file format does not
    /// hold (a restart reads `.gopclntab` again).
    pub fn disk_parts(&self) -> Option<DiskParts<'_>> {
        if self.go.is_some() {
            return None;
        }
        Some((&self.segments, &self.symbols, self.had_dwarf))
    }

    /// Heap bytes held: symbols, DWARF's index and windows (and debug
    /// sections decompressed), memoized results. Debug sections read in
    /// place from the file's mapping are not: they are page cache, which
    /// the kernel reclaims and a memory cgroup does not charge as the
    /// agent's own, so counting them against `cache.max_bytes` only evicts
    /// tables for nothing (see [`Self::mapped_bytes`]).
    pub fn heap_bytes(&self) -> usize {
        self.symbols.heap_bytes()
            + self.dwarf.get().map_or(0, DwarfLines::heap_bytes)
            + self.go.as_ref().map_or(0, GoLineTable::heap_bytes)
            + self.memo_bytes.load(std::sync::atomic::Ordering::Relaxed)
            + self.held.load(std::sync::atomic::Ordering::Relaxed)
            + self.segments.len() * 24
    }

    /// Debug sections and symbol names read in place from files' mappings
    /// (not in [`Self::heap_bytes`]).
    pub fn mapped_bytes(&self) -> usize {
        self.dwarf.get().map_or(0, DwarfLines::mapped_bytes) + self.symbols.mapped_bytes()
    }

    /// Frames at file offset `offset` (already −1 for return addresses).
    pub fn resolve(&self, offset: u64) -> Frames {
        let mut memo = self.memo.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = memo.get(&offset) {
            return f.clone();
        }
        let frames: Frames = self.resolve_uncached(offset).into();
        self.remember(&mut memo, offset, frames.clone());
        frames
    }

    /// Resolves and memoizes those of `offsets` not memoized yet, DWARF
    /// units streamed once for all of them (see `DwarfLines::frames_many`):
    /// [`Self::resolve`] of any of them then hits the memo.
    pub fn resolve_many(&self, offsets: &[u64]) {
        let mut memo = self.memo.lock().unwrap_or_else(|p| p.into_inner());
        let mut todo: Vec<u64> = offsets.iter().copied().filter(|o| !memo.contains_key(o)).collect();
        todo.sort_unstable();
        todo.dedup();
        // More than the memo holds would be forgotten before it is read.
        todo.truncate(MEMO_ENTRIES);
        if todo.is_empty() {
            return;
        }
        let vaddrs: Vec<Option<u64>> = todo.iter().map(|&o| self.vaddr(o)).collect();
        let mut dwarf_frames: Vec<(u64, Vec<profcol_elf::SourceFrame>)> = Vec::new();
        if let Some(dwarf) = self.dwarf.get() {
            // Go code is named from Go's table, not DWARF (`resolve_vaddr`).
            let go = |v: u64| self.go.as_ref().is_some_and(|g| g.lookup(v).is_some());
            dwarf_frames = vaddrs.iter().flatten().filter(|&&v| !go(v)).map(|&v| (v, Vec::new())).collect();
            dwarf_frames.sort_unstable_by_key(|f| f.0);
            dwarf_frames.dedup_by_key(|f| f.0);
            dwarf.frames_many(&mut dwarf_frames);
        }
        for (&offset, vaddr) in todo.iter().zip(vaddrs) {
            let frames: Frames = match vaddr {
                Some(v) => {
                    let found = dwarf_frames.binary_search_by_key(&v, |f| f.0).ok();
                    self.resolve_with(v, |_| found.map(|i| dwarf_frames[i].1.clone()).unwrap_or_default()).into()
                }
                None => Frames::from(Vec::new()),
            };
            self.remember(&mut memo, offset, frames);
        }
    }

    fn remember(&self, memo: &mut FxHashMap<u64, Frames>, offset: u64, frames: Frames) {
        if memo.len() >= MEMO_ENTRIES {
            memo.clear();
            self.memo_bytes.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        let bytes = frames.iter().map(NamedFrame::heap_bytes).sum::<usize>() + 48;
        self.memo_bytes.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        memo.insert(offset, frames);
    }

    /// The virtual address of file offset `offset` in this binary.
    pub fn vaddr(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|&&(_, filesz, off)| offset >= off && offset - off < filesz)
            .map(|&(start, _, off)| offset - off + start)
    }

    fn resolve_uncached(&self, offset: u64) -> Vec<NamedFrame> {
        match self.vaddr(offset) {
            Some(vaddr) => self.resolve_vaddr(vaddr),
            None => Vec::new(),
        }
    }

    /// Frames at ELF virtual address `vaddr` (not memoized: for tools).
    pub fn resolve_vaddr(&self, vaddr: u64) -> Vec<NamedFrame> {
        self.resolve_with(vaddr, |d| d.frames(vaddr))
    }

    /// [`Self::resolve_vaddr`], DWARF's frames from `dwarf_frames`.
    fn resolve_with(
        &self,
        vaddr: u64,
        dwarf_frames: impl FnOnce(&DwarfLines) -> Vec<profcol_elf::SourceFrame>,
    ) -> Vec<NamedFrame> {
        // Go code: Go names need no demangling; the line is the innermost
        // (inlined callee's) one, as `go tool addr2line` gives it. Code
        // outside Go's table (cgo's C) goes on to the symbol table.
        if let Some(f) = self.go.as_ref().and_then(|go| go.lookup(vaddr)) {
            return vec![NamedFrame {
                name: f.function.into(),
                system_name: f.function.into(),
                file: f.file.into(),
                line: f.line,
            }];
        }
        let mut out = Vec::new();
        if let Some(dwarf) = self.dwarf.get() {
            for f in dwarf_frames(dwarf) {
                let system = f.mangled.or_else(|| f.function.clone());
                out.push(NamedFrame {
                    name: f.function.unwrap_or_default().into(),
                    system_name: system.unwrap_or_default().into(),
                    file: f.file.unwrap_or_default().into(),
                    line: f.line,
                });
            }
        }
        // The outermost frame is the function holding the code: name it
        // from the symbol table when DWARF does not (a lookup decodes names:
        // only then).
        let unnamed = out.last().is_none_or(|f| f.name.is_empty());
        let symbol = if unnamed { self.symbols.lookup(vaddr).map(|(name, _)| name) } else { None };
        match (out.last_mut(), symbol.as_deref()) {
            (Some(last), Some(sym)) if last.name.is_empty() => {
                last.name = profcol_elf::demangle(sym).into();
                last.system_name = sym.into();
            }
            (None, Some(sym)) => out.push(NamedFrame {
                name: profcol_elf::demangle(sym).into(),
                system_name: sym.into(),
                file: "".into(),
                line: 0,
            }),
            _ => {}
        }
        if out.iter().all(|f| f.name.is_empty()) {
            out.clear();
        }
        out
    }
}

/// Whether the opened binary is the one the mapping named.
fn same_identity(elf: &ElfFile, file: &File, want: &Want) -> bool {
    if want.is_build_id {
        elf.gnu_build_id().map(profcol_elf::notes::hex).as_deref() == Some(&*want.key)
    } else {
        profcol_elf::file_id(file).ok().as_deref() == Some(&*want.key)
    }
}

/// The separate debug file: by build id under each debug dir, else by
/// `.gnu_debuglink` next to the binary, in its `.debug/`, and under each
/// debug dir (the GDB search order). A candidate must carry the same
/// build id (or, without one, the CRC the link names).
fn find_debug_file(
    elf: &ElfFile,
    want: &Want,
    binary: &Path,
    root: Option<&Path>,
    search: &SearchPaths,
) -> Option<(ElfFile, PathBuf)> {
    if elf.has_debug_info() {
        return None; // the binary has it all
    }
    let build_id = elf.gnu_build_id().map(profcol_elf::notes::hex);
    if let (Some(id), true) = (&build_id, want.is_build_id) {
        if id.len() > 2 {
            for dir in &search.debug_dirs {
                let p = dir.join(".build-id").join(&id[..2]).join(format!("{}.debug", &id[2..]));
                if let Some(found) = open_matching(&p, build_id.as_deref(), None) {
                    return Some((found, p));
                }
            }
        }
    }
    let (name, crc) = elf.debuglink()?;
    let dir = binary.parent().unwrap_or(Path::new("/"));
    let mut candidates = Vec::new();
    for base in root.into_iter().chain(std::iter::once(Path::new("/"))) {
        let d = base.join(dir.strip_prefix("/").unwrap_or(dir));
        candidates.push(d.join(&name));
        candidates.push(d.join(".debug").join(&name));
    }
    for dd in &search.debug_dirs {
        candidates.push(dd.join(dir.strip_prefix("/").unwrap_or(dir)).join(&name));
    }
    candidates.into_iter().find_map(|p| open_matching(&p, build_id.as_deref(), Some(crc)).map(|e| (e, p)))
}

fn open_matching(path: &Path, build_id: Option<&str>, crc: Option<u32>) -> Option<ElfFile> {
    let mut f = open_regular(path)?;
    let elf = ElfFile::open(&f).ok()?;
    match (build_id, elf.gnu_build_id().map(profcol_elf::notes::hex)) {
        (Some(want), Some(got)) => (want == got).then_some(elf),
        _ => {
            let crc = crc?;
            (profcol_elf::debuglink_crc(&mut f).ok()? == crc).then_some(elf)
        }
    }
}
