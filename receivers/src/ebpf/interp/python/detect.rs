//! Which processes run CPython, and where its runtime is in each.
//!
//! A process runs CPython when it maps an interpreter file: a `python3.X`
//! executable (static builds: Debian's /usr/bin/python3.X, stripped but
//! with `_PyRuntime` in `.dynsym`) or a `libpython3.X.so*` (shared builds,
//! embedders). The file must define `_PyRuntime`; a shared build's small
//! `python3.X` launcher does not, its libpython does.
//!
//! The version comes from the binary where it says it (3.11+: the
//! `Py_Version` constant in `.rodata`), else from the file name (3.9 and
//! 3.10: `python3.9`, `libpython3.10.so.1.0`), which is how those are
//! installed everywhere; the name is also the only place a free-threaded
//! 3.13 (`python3.13t`) says so before its `_Py_DebugOffsets` does.

use super::offsets::{self, LayoutError, PyOffsets, DEBUG_OFFSETS_MAX};
use crate::ebpf::process::procfs::{self, MapsEntry, ProcPath};
use profcol_elf::{ElfFile, LoadSegment};
use rustc_hash::FxHashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;

/// A CPython process, as the BPF walker and the namer need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PythonProcess {
    pub version: (u8, u8),
    /// Process address of `_PyRuntime`.
    pub runtime_addr: u64,
    /// Process addresses `[start, end)` of `_PyEval_EvalFrameDefault`
    /// (from its symbol size; empty when the symbol is absent).
    pub eval_ranges: Vec<(u64, u64)>,
    pub offsets: PyOffsets,
    /// Process address of `PyCode_Type` (0 when not found): the namer
    /// checks a code object's type against it.
    pub code_type_addr: u64,
    /// The mapped interpreter file (for logs).
    pub binary: PathBuf,
}

/// What [`detect`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Detection {
    Python(PythonProcess),
    /// No interpreter file is mapped.
    NotPython,
    /// An interpreter is mapped that this reader does not walk.
    Unsupported {
        binary: PathBuf,
        reason: Unsupported,
    },
}

/// Why a CPython process is not walked (one counter per kind).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unsupported {
    #[error("Python {0}.{1} is older than 3.9")]
    TooOld(u8, u8),
    #[error("Python {0}.{1} has no offsets table here")]
    NoTable(u8, u8),
    #[error("free-threaded CPython (Py_GIL_DISABLED): its objects and frames differ")]
    FreeThreaded,
    #[error("the interpreter file defines no _PyRuntime")]
    NoRuntime,
    #[error("{0}")]
    Layout(LayoutError),
    #[error("_Py_DebugOffsets says Python {0:#x}, the binary {1}.{2}")]
    VersionMismatch(u32, u8, u8),
    #[error("_Py_DebugOffsets says sizeof(_PyRuntimeState) = {0}, the symbol {1}")]
    RuntimeSize(u64, u64),
}

/// /proc or the interpreter file could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DetectError {
    #[error("reading /proc/{pid}/maps: {source}")]
    Maps { pid: u32, source: std::io::Error },
    #[error("opening {path}: {source}")]
    Open { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Elf { path: PathBuf, source: profcol_elf::Error },
    #[error("{path}: mapping at file offset {offset:#x} is in no PT_LOAD segment")]
    NoSegment { path: PathBuf, offset: u64 },
}

/// Detects CPython in process `pid` from its /proc/PID/maps (no file cache:
/// tests and one-off use).
#[cfg(test)]
pub(crate) fn detect(pid: u32) -> Result<Detection, DetectError> {
    Detector::default().detect(pid)
}

/// What an interpreter file says, whatever process maps it: all but the
/// load bias.
#[derive(Clone, Debug)]
struct FileFacts {
    version: (u8, u8),
    runtime: u64,
    code_type: Option<u64>,
    /// `_PyEval_EvalFrameDefault`, file virtual addresses.
    eval: Vec<(u64, u64)>,
    offsets: PyOffsets,
    segments: Vec<LoadSegment>,
}

/// What a file said: its facts, or why it is not walked.
type Inspected = Result<Arc<FileFacts>, Unsupported>;

/// Interpreter files read at most before the cache starts over.
const MAX_FILES: usize = 64;

/// Detection with what each interpreter file said kept by device and inode
/// (checked against size and mtime): a host starting many Python
/// processes reads each interpreter's symbols once.
#[derive(Default)]
pub(crate) struct Detector {
    /// (device, inode) → (size, mtime in ns, what it said).
    files: FxHashMap<(u64, u64), (u64, i64, Inspected)>,
}

impl Detector {
    /// Detects CPython in process `pid` from its /proc/PID/maps.
    pub(crate) fn detect(&mut self, pid: u32) -> Result<Detection, DetectError> {
        let maps = procfs::read_maps(pid).map_err(|source| DetectError::Maps { pid, source })?;
        self.detect_in(pid, &maps)
    }

    /// [`Self::detect`] over already parsed executable mappings of `pid`.
    pub(crate) fn detect_in(&mut self, pid: u32, maps: &[MapsEntry]) -> Result<Detection, DetectError> {
        // One candidate per file: its first executable mapping. libpython
        // first: with a shared build the executable is only its launcher.
        let mut candidates: Vec<(&MapsEntry, Named)> = Vec::new();
        for m in maps.iter().filter(|m| m.is_file()) {
            let Some(named) = interpreter_name(procfs::base_name(&m.path)) else { continue };
            if !candidates.iter().any(|(c, _)| c.path == m.path) {
                candidates.push((m, named));
            }
        }
        candidates.sort_by_key(|(_, n)| !n.library);
        let mut unsupported = None;
        for (m, named) in candidates {
            let binary = PathBuf::from(&m.path);
            let refuse = |reason| Ok(Detection::Unsupported { binary: PathBuf::from(&m.path), reason });
            if named.free_threaded {
                return refuse(Unsupported::FreeThreaded);
            }
            if named.version < (3, 9) {
                return refuse(Unsupported::TooOld(named.version.0, named.version.1));
            }
            match self.facts(pid, m, named)? {
                Ok(facts) => {
                    let bias = load_bias(&facts.segments, m, page_size())
                        .ok_or_else(|| DetectError::NoSegment { path: binary.clone(), offset: m.offset })?;
                    return Ok(Detection::Python(facts.in_process(bias, binary)));
                }
                Err(Unsupported::NoRuntime) => unsupported = Some((binary, Unsupported::NoRuntime)),
                Err(reason) => return refuse(reason),
            }
        }
        Ok(match unsupported {
            Some((binary, reason)) => Detection::Unsupported { binary, reason },
            None => Detection::NotPython,
        })
    }

    /// Interpreter files whose facts are kept.
    #[cfg(test)]
    pub(crate) fn cached_files(&self) -> usize {
        self.files.len()
    }

    /// What the file of mapping `m` says: from the cache while its size
    /// and mtime are the same, else read.
    fn facts(&mut self, pid: u32, m: &MapsEntry, named: Named) -> Result<Inspected, DetectError> {
        let file = open_mapped(pid, m)?;
        let md = file.metadata().map_err(|source| DetectError::Open { path: PathBuf::from(&m.path), source })?;
        let key = (md.dev(), md.ino());
        let (size, mtime) = (md.size(), md.mtime() * 1_000_000_000 + md.mtime_nsec());
        if let Some((s, t, facts)) = self.files.get(&key) {
            if *s == size && *t == mtime {
                return Ok(facts.clone());
            }
        }
        let elf = ElfFile::open(&file).map_err(|source| DetectError::Elf { path: PathBuf::from(&m.path), source })?;
        let facts = inspect(&elf, named).map(Arc::new);
        if self.files.len() >= MAX_FILES {
            self.files.clear();
        }
        self.files.insert(key, (size, mtime, facts.clone()));
        Ok(facts)
    }
}

impl FileFacts {
    /// The process that maps this file with load bias `bias`.
    fn in_process(&self, bias: u64, binary: PathBuf) -> PythonProcess {
        PythonProcess {
            version: self.version,
            runtime_addr: self.runtime.wrapping_add(bias),
            eval_ranges: self.eval.iter().map(|&(s, e)| (s.wrapping_add(bias), e.wrapping_add(bias))).collect(),
            offsets: self.offsets,
            code_type_addr: self.code_type.map_or(0, |a| a.wrapping_add(bias)),
            binary,
        }
    }
}

/// What an interpreter file's name says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Named {
    version: (u8, u8),
    free_threaded: bool,
    library: bool,
}

/// `python3.11`, `python3.13t`, `libpython3.11.so.1.0`, `libpython3.9d.so`.
fn interpreter_name(base: &str) -> Option<Named> {
    let (library, rest) = match base.strip_prefix("lib") {
        Some(r) => (true, r),
        None => (false, base),
    };
    let rest = rest.strip_prefix("python")?;
    let (major, rest) = rest.split_once('.')?;
    let minor_len = rest.bytes().take_while(u8::is_ascii_digit).count();
    let (minor, rest) = rest.split_at(minor_len);
    let version = (major.parse().ok()?, minor.parse().ok()?);
    // ABI flags: d (debug), m (pymalloc, before 3.8), t (free-threaded).
    let flags_len = rest.bytes().take_while(|b| matches!(b, b'd' | b'm' | b't' | b'u')).count();
    let (flags, rest) = rest.split_at(flags_len);
    let ok = if library { rest.starts_with(".so") } else { rest.is_empty() };
    ok.then_some(Named { version, free_threaded: flags.contains('t'), library })
}

/// The mapped file as the process sees it: through map_files (any mount
/// namespace, deleted files), else through its root.
fn open_mapped(pid: u32, m: &MapsEntry) -> Result<File, DetectError> {
    File::open(ProcPath::map_file(pid, m.start, m.end).as_path())
        .or_else(|_| File::open(format!("/proc/{pid}/root{}", m.path)))
        .map_err(|source| DetectError::Open { path: PathBuf::from(&m.path), source })
}

/// Reads the interpreter's symbols and version: what it says, or why it
/// is not walked.
fn inspect(elf: &ElfFile, named: Named) -> Result<FileFacts, Unsupported> {
    let (objects, _) = elf.find_objects(&["_PyRuntime", "Py_Version", "PyCode_Type"]);
    let Some(runtime) = objects[0].clone() else { return Err(Unsupported::NoRuntime) };
    // Py_Version: `const unsigned long`, PY_VERSION_HEX.
    let hex = objects[1]
        .as_ref()
        .and_then(|s| elf.bytes_at(s.address, 4))
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let version = match hex {
        Some(h) => ((h >> 24) as u8, (h >> 16) as u8),
        None => named.version,
    };
    if version < (3, 9) {
        return Err(Unsupported::TooOld(version.0, version.1));
    }
    let offsets = if version >= (3, 13) {
        let len = if runtime.size == 0 { DEBUG_OFFSETS_MAX } else { DEBUG_OFFSETS_MAX.min(runtime.size as usize) };
        let blob = elf.bytes_at(runtime.address, len).unwrap_or_default();
        let table = match offsets::from_debug_offsets(blob) {
            Ok(t) => t,
            Err(LayoutError::FreeThreaded) => return Err(Unsupported::FreeThreaded),
            Err(e) => return Err(Unsupported::Layout(e)),
        };
        if ((table.version_hex >> 24) as u8, (table.version_hex >> 16) as u8) != version {
            return Err(Unsupported::VersionMismatch(table.version_hex, version.0, version.1));
        }
        if runtime.size != 0 && table.runtime_size != runtime.size {
            return Err(Unsupported::RuntimeSize(table.runtime_size, runtime.size));
        }
        table.offsets
    } else {
        match offsets::for_version(version) {
            Some(o) => o,
            None => return Err(Unsupported::NoTable(version.0, version.1)),
        }
    };
    let (eval, _) = elf.find_functions(&["_PyEval_EvalFrameDefault"]);
    let eval =
        eval.iter().flatten().filter(|s| s.size > 0).map(|s| (s.address, s.address.wrapping_add(s.size))).collect();
    Ok(FileFacts {
        version,
        runtime: runtime.address,
        code_type: objects[2].as_ref().map(|s| s.address),
        eval,
        offsets,
        segments: elf.load_segments(),
    })
}

/// Process address minus file vaddr, from an executable mapping: the
/// mapping starts at the page holding its segment's first byte, which the
/// kernel maps at the page holding the segment's `p_vaddr` (a segment's
/// offset need not be page-aligned, lld puts `.text` mid-page).
fn load_bias(segments: &[LoadSegment], m: &MapsEntry, page: u64) -> Option<u64> {
    let seg = segments
        .iter()
        .filter(|s| s.executable)
        .find(|s| s.offset >= m.offset && s.offset - m.offset < page)
        .or_else(|| segments.iter().find(|s| m.offset >= s.offset && m.offset - s.offset < s.filesz))?;
    // The vaddr of file offset m.offset, by the segment's offset → vaddr delta.
    let vaddr = m.offset.wrapping_add(seg.vaddr.wrapping_sub(seg.offset));
    Some(m.start.wrapping_sub(vaddr))
}

fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

#[cfg(test)]
impl PythonProcess {
    /// A process description for namer tests that need no real process.
    pub(crate) fn for_tests(version: (u8, u8), offsets: PyOffsets) -> Self {
        PythonProcess {
            version,
            runtime_addr: 0,
            eval_ranges: Vec::new(),
            offsets,
            code_type_addr: 0,
            binary: PathBuf::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpreter_file_names() {
        let n = |s| interpreter_name(s).map(|n| (n.version, n.free_threaded, n.library));
        assert_eq!(n("python3.11"), Some(((3, 11), false, false)));
        assert_eq!(n("python3.13t"), Some(((3, 13), true, false)));
        assert_eq!(n("libpython3.9.so.1.0"), Some(((3, 9), false, true)));
        assert_eq!(n("libpython3.13t.so.1.0"), Some(((3, 13), true, true)));
        assert_eq!(n("libpython3.7m.so.1.0"), Some(((3, 7), false, true)));
        assert_eq!(n("libpython2.7.so"), Some(((2, 7), false, true)));
        for not in
            ["python3", "python", "libpython3.so", "python3.11-config", "python3.11.py", "libpython3.11.a", "pythonx.y"]
        {
            assert_eq!(n(not), None, "{not}");
        }
    }

    #[test]
    fn load_bias_of_aligned_and_mid_page_segments() {
        let seg = |vaddr, offset, filesz, executable| LoadSegment { vaddr, offset, filesz, executable };
        let map = |start, offset| MapsEntry {
            start,
            end: start + 0x10000,
            offset,
            dev: (8, 1),
            inode: 1,
            path: "/x/libpython3.12.so".into(),
            deleted: false,
        };
        // GNU ld: page-aligned segments.
        let gnu = [seg(0, 0, 0x1000, false), seg(0x1000, 0x1000, 0x5000, true)];
        assert_eq!(load_bias(&gnu, &map(0x7f00_0000_1000, 0x1000), 4096), Some(0x7f00_0000_0000));
        // lld: .text at file offset 0x1a2b0, vaddr 0x1b2b0, mapped from its
        // page (offset 0x1a000) at the page of its vaddr (0x1b000).
        let lld = [seg(0, 0, 0x1a2b0, false), seg(0x1b2b0, 0x1a2b0, 0x9000, true)];
        assert_eq!(load_bias(&lld, &map(0x5555_0001_b000, 0x1a000), 4096), Some(0x5555_0000_0000));
        // Non-PIE: vaddr is the address, no bias.
        let exec = [seg(0x400000, 0, 0x1000, false), seg(0x401000, 0x1000, 0x5000, true)];
        assert_eq!(load_bias(&exec, &map(0x401000, 0x1000), 4096), Some(0));
        assert_eq!(load_bias(&[], &map(0x401000, 0x1000), 4096), None);
    }

    #[test]
    fn a_process_without_python_is_not_python() {
        // The test binary itself maps no interpreter.
        assert_eq!(detect(std::process::id()).unwrap(), Detection::NotPython);
    }

    #[test]
    fn a_missing_process_is_an_error() {
        assert!(matches!(detect(u32::MAX), Err(DetectError::Maps { .. })));
    }

    #[test]
    fn old_and_free_threaded_interpreters_are_refused_by_name() {
        let entry = |path: &str| MapsEntry {
            start: 0x1000,
            end: 0x2000,
            offset: 0,
            dev: (8, 1),
            inode: 42,
            path: path.to_owned(),
            deleted: false,
        };
        let d = Detector::default().detect_in(u32::MAX, &[entry("/usr/lib/libpython2.7.so.1.0")]).unwrap();
        assert!(matches!(d, Detection::Unsupported { reason: Unsupported::TooOld(2, 7), .. }), "{d:?}");
        let d = Detector::default().detect_in(u32::MAX, &[entry("/usr/bin/python3.13t")]).unwrap();
        assert!(matches!(d, Detection::Unsupported { reason: Unsupported::FreeThreaded, .. }), "{d:?}");
        // A file that cannot be opened is an error, not a panic.
        assert!(matches!(
            Detector::default().detect_in(u32::MAX, &[entry("/nonexistent/python3.12")]),
            Err(DetectError::Open { .. })
        ));
    }
}
