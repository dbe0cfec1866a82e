//! Names of Python frames: (code object address, raw instruction word), as
//! the BPF walker records them, → function, file and line.
//!
//! A code object is read from the process once (`process_vm_readv`: its
//! header in one read, then its qualname, filename and line table in one
//! more when they are small) and cached by address; each frame after that
//! is a hash lookup and a line table walk. Bounded: [`MAX_CODES`] code
//! objects per process (then the cache starts over), strings cut at
//! [`MAX_STRING`] bytes, line tables at [`MAX_LINETABLE`] bytes.
//!
//! A cached code object whose memory is freed and reused for another code
//! object keeps its old name until the cache starts over.

use super::detect::PythonProcess;
use super::linetable::{line_at, TableKind};
use super::offsets::{PyOffsets, NONE};
use rustc_hash::FxHashMap;
use std::cell::Cell;
use std::io;
use std::sync::Arc;

/// Code objects cached per process.
pub(crate) const MAX_CODES: usize = 16 * 1024;
/// Bytes cached per process by default (names, files, line tables), then
/// the cache starts over; the receiver lowers it when it walks many
/// processes ([`PyNamer::budget`]).
pub(crate) const DEFAULT_BUDGET: usize = 2 << 20;
/// What a cached code object costs besides its strings and line table.
const ENTRY_OVERHEAD: usize = 96;
/// Bytes of a string's characters read (longer names are cut).
pub(crate) const MAX_STRING: usize = 1024;
/// Bytes of a line table read (lines past the cut are unknown).
pub(crate) const MAX_LINETABLE: usize = 64 * 1024;
/// Bytes read of each of a code object's three objects in the first
/// read: their header and, most of the time, all their data.
const SPECULATIVE: usize = 256;

/// What is kept of one code object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PyCodeInfo {
    /// `co_qualname` (3.11+) or `co_name`.
    pub qualname: Arc<str>,
    pub filename: Arc<str>,
    pub first_line: u32,
    pub linetable: Box<[u8]>,
    /// Process address of `co_code_adaptive` (3.11+; 0 before).
    pub code_adaptive_addr: u64,
}

/// One named Python frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PyFrame {
    pub name: Arc<str>,
    pub file: Arc<str>,
    /// 0 when the line table gives none.
    pub line: u32,
}

/// Why a frame was not named.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NameError {
    #[error("reading process memory: {0}")]
    Read(#[from] io::Error),
    #[error("process memory read cut short")]
    Short,
    #[error("not a code object")]
    NotCode,
    #[error("bad {0} object")]
    BadObject(&'static str),
}

/// Outcomes, as plain counters the receiver exports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct NamerCounts {
    /// Frames named from the cache.
    pub hits: u64,
    /// Code objects read from the process.
    pub reads: u64,
    /// Reads that failed (unmapped address, process gone).
    pub read_errors: u64,
    /// Objects read but not valid (not a code object, bad string or table).
    pub invalid: u64,
    /// Times the cache was full and started over.
    pub resets: u64,
    /// `process_vm_readv` calls.
    pub vm_reads: u64,
}

/// The namer of one Python process.
pub(crate) struct PyNamer {
    pid: i32,
    version: (u8, u8),
    offsets: PyOffsets,
    table: TableKind,
    code_type: u64,
    codes: FxHashMap<u64, PyCodeInfo>,
    /// Bytes the cache holds (as [`cost`] counts them).
    bytes: usize,
    /// Bytes the cache may hold before it starts over.
    pub(crate) budget: usize,
    pub(crate) counts: NamerCounts,
    /// `process_vm_readv` calls of the read under way.
    vm_reads: Cell<u64>,
}

/// What caching `info` costs, in bytes.
fn cost(info: &PyCodeInfo) -> usize {
    ENTRY_OVERHEAD + info.qualname.len() + info.filename.len() + info.linetable.len()
}

impl PyNamer {
    pub(crate) fn new(pid: u32, process: &PythonProcess) -> Self {
        PyNamer {
            pid: pid as i32,
            version: process.version,
            offsets: process.offsets,
            table: TableKind::of(process.version),
            code_type: process.code_type_addr,
            codes: FxHashMap::default(),
            bytes: 0,
            budget: DEFAULT_BUDGET,
            counts: NamerCounts::default(),
            vm_reads: Cell::new(0),
        }
    }

    /// Names a frame: `code` is the frame's code object (as read at
    /// `frame_code`), `instr` the raw 8 bytes read at `frame_instr`.
    pub(crate) fn frame(&mut self, code: u64, instr: u64) -> Result<PyFrame, NameError> {
        // 3.14+: `f_executable` is a `_PyStackRef`, its low bits tags.
        let code = if self.version >= (3, 14) { code & !3 } else { code };
        let info = match self.codes.get(&code) {
            Some(info) => {
                self.counts.hits += 1;
                info
            }
            None => {
                let read = self.read_code(code);
                self.counts.vm_reads += self.vm_reads.take();
                let info = match read {
                    Ok(info) => info,
                    Err(e) => {
                        match e {
                            NameError::Read(_) | NameError::Short => self.counts.read_errors += 1,
                            _ => self.counts.invalid += 1,
                        }
                        return Err(e);
                    }
                };
                self.counts.reads += 1;
                let c = cost(&info);
                if self.codes.len() >= MAX_CODES || self.bytes + c > self.budget {
                    self.codes.clear();
                    self.bytes = 0;
                    self.counts.resets += 1;
                }
                self.bytes += c;
                self.codes.entry(code).or_insert(info)
            }
        };
        let line = match byte_offset(self.version, info.code_adaptive_addr, instr) {
            Some(offset) => line_at(self.table, &info.linetable, info.first_line, offset).unwrap_or(0),
            None => info.first_line, // not started yet
        };
        Ok(PyFrame { name: info.qualname.clone(), file: info.filename.clone(), line })
    }

    /// Bytes the cache holds.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Cached code objects.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.codes.len()
    }

    /// The cached code object at `code`, if any.
    #[cfg(test)]
    pub(crate) fn cached(&self, code: u64) -> Option<&PyCodeInfo> {
        self.codes.get(&code)
    }

    fn read_code(&self, code: u64) -> Result<PyCodeInfo, NameError> {
        let o = &self.offsets;
        let name_at = if o.code_qualname != NONE { o.code_qualname } else { o.code_name };
        let fields = [o.code_filename, name_at, o.code_firstlineno, o.code_linetable];
        let header_len = fields.iter().map(|&f| usize::from(f) + 8).max().unwrap_or(0).max(16);
        let mut header = [0u8; 256];
        let header = header.get_mut(..header_len).ok_or(NameError::BadObject("offsets"))?;
        self.read_exact(code, header)?;
        let ptr =
            |at: u16| u64::from_le_bytes(header[usize::from(at)..usize::from(at) + 8].try_into().unwrap_or_default());
        if self.code_type != 0 && ptr(8) != self.code_type {
            return Err(NameError::NotCode);
        }
        let first_line = i32::from_le_bytes(
            header[usize::from(o.code_firstlineno)..usize::from(o.code_firstlineno) + 4].try_into().unwrap_or_default(),
        );
        let first_line = u32::try_from(first_line).map_err(|_| NameError::BadObject("code"))?;
        let addrs = [ptr(name_at), ptr(o.code_filename), ptr(o.code_linetable)];
        if addrs.contains(&0) {
            return Err(NameError::BadObject("code"));
        }

        // One read for the three objects' first bytes; a failure (one
        // ends near unmapped memory) leaves the rest to exact reads.
        let mut spec = [0u8; 3 * SPECULATIVE];
        let got = {
            let (a, rest) = spec.split_at_mut(SPECULATIVE);
            let (b, c) = rest.split_at_mut(SPECULATIVE);
            self.read_vm(&mut [(addrs[0], a), (addrs[1], b), (addrs[2], c)]).unwrap_or(0)
        };
        let head = |i: usize| -> &[u8] {
            let end = SPECULATIVE * (i + 1);
            if got >= end {
                &spec[SPECULATIVE * i..end]
            } else {
                &[]
            }
        };
        let qualname = self.read_str(addrs[0], head(0))?;
        let filename = self.read_str(addrs[1], head(1))?;
        let linetable = self.read_bytes(addrs[2], head(2))?;
        let code_adaptive_addr =
            if o.code_adaptive == NONE { 0 } else { code.wrapping_add(u64::from(o.code_adaptive)) };
        Ok(PyCodeInfo {
            qualname: qualname.into(),
            filename: filename.into(),
            first_line,
            linetable,
            code_adaptive_addr,
        })
    }

    /// An object's `len` bytes at `start`: from `head` when it holds them,
    /// else read.
    fn slice<'a>(
        &self,
        addr: u64,
        head: &'a [u8],
        start: usize,
        len: usize,
        own: &'a mut Vec<u8>,
    ) -> Result<&'a [u8], NameError> {
        if let Some(b) = head.get(start..start + len) {
            return Ok(b);
        }
        own.resize(len, 0);
        self.read_exact(addr.wrapping_add(start as u64), own)?;
        Ok(own)
    }

    /// A compact `str` (every name and file name a code object holds) as UTF-8.
    fn read_str(&self, addr: u64, head: &[u8]) -> Result<String, NameError> {
        let o = &self.offsets;
        // Only what the state and length need: a short ASCII string ends
        // before sizeof(PyCompactUnicodeObject).
        let header_len = (usize::from(o.unicode_state) + 4).max(usize::from(o.unicode_length) + 8);
        let mut own = Vec::new();
        let header = self.slice(addr, head, 0, header_len, &mut own)?;
        let state = u32::from_le_bytes(
            header[usize::from(o.unicode_state)..usize::from(o.unicode_state) + 4].try_into().unwrap_or_default(),
        );
        let length = i64::from_le_bytes(
            header[usize::from(o.unicode_length)..usize::from(o.unicode_length) + 8].try_into().unwrap_or_default(),
        );
        // state: interned:2, kind:3, compact:1, ascii:1, ...
        let kind = ((state >> 2) & 7) as usize;
        let compact = state & (1 << 5) != 0;
        let ascii = state & (1 << 6) != 0;
        let length = usize::try_from(length).map_err(|_| NameError::BadObject("str"))?;
        if !compact || !matches!(kind, 1 | 2 | 4) || (ascii && kind != 1) {
            return Err(NameError::BadObject("str"));
        }
        let data_at = usize::from(if ascii { o.ascii_data } else { o.compact_data });
        let chars = length.min(MAX_STRING / kind);
        let mut own = Vec::new();
        let data = self.slice(addr, head, data_at, chars * kind, &mut own)?;
        Ok(match kind {
            1 if ascii => String::from_utf8_lossy(data).into_owned(),
            1 => data.iter().map(|&b| char::from(b)).collect(),
            2 => char::decode_utf16(data.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])))
                .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
                .collect(),
            _ => data
                .chunks_exact(4)
                .map(|c| {
                    char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).unwrap_or(char::REPLACEMENT_CHARACTER)
                })
                .collect(),
        })
    }

    /// A `bytes` object's data, cut at [`MAX_LINETABLE`].
    fn read_bytes(&self, addr: u64, head: &[u8]) -> Result<Box<[u8]>, NameError> {
        let o = &self.offsets;
        let mut own = Vec::new();
        let header_len = usize::from(o.bytes_data).max(usize::from(o.bytes_size) + 8);
        let header = self.slice(addr, head, 0, header_len, &mut own)?;
        let size = i64::from_le_bytes(
            header[usize::from(o.bytes_size)..usize::from(o.bytes_size) + 8].try_into().unwrap_or_default(),
        );
        let size = usize::try_from(size).map_err(|_| NameError::BadObject("bytes"))?.min(MAX_LINETABLE);
        let mut own = Vec::new();
        Ok(self.slice(addr, head, usize::from(o.bytes_data), size, &mut own)?.into())
    }
}

/// Byte offset within the code of the instruction a frame is at, from the
/// raw word at `frame_instr`; `None` when the frame has not started.
fn byte_offset(version: (u8, u8), code_adaptive_addr: u64, instr: u64) -> Option<u32> {
    match version {
        // f_lasti (int): a byte offset in 3.9, a code unit index in 3.10;
        // -1 before the first instruction.
        (3, 9) | (3, 10) => {
            let lasti = u32::try_from(instr as u32 as i32).ok()?;
            Some(if version == (3, 9) { lasti } else { lasti.saturating_mul(2) })
        }
        // 3.11/3.12 prev_instr (the last executed instruction; one unit
        // before the code when not started), 3.13+ instr_ptr (the current
        // one): CPython takes the line of the instruction pointed at.
        _ => {
            let offset = instr.checked_sub(code_adaptive_addr)?;
            Some(u32::try_from(offset).unwrap_or(u32::MAX))
        }
    }
}

impl PyNamer {
    fn read_exact(&self, addr: u64, buf: &mut [u8]) -> Result<(), NameError> {
        let want = buf.len();
        if self.read_vm(&mut [(addr, buf)])? == want {
            Ok(())
        } else {
            Err(NameError::Short)
        }
    }

    fn read_vm(&self, parts: &mut [(u64, &mut [u8])]) -> io::Result<usize> {
        self.vm_reads.set(self.vm_reads.get() + 1);
        read_vm(self.pid, parts)
    }
}

/// One `process_vm_readv` of several remote ranges into local buffers;
/// returns the bytes read (a short count: a range hit unmapped memory,
/// it and the ones after it are unread).
pub(crate) fn read_vm(pid: i32, parts: &mut [(u64, &mut [u8])]) -> io::Result<usize> {
    let mut local = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 4];
    let mut remote = local;
    if parts.len() > local.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many ranges"));
    }
    for (i, (addr, buf)) in parts.iter_mut().enumerate() {
        local[i] = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        remote[i] = libc::iovec { iov_base: *addr as usize as *mut libc::c_void, iov_len: buf.len() };
    }
    let n = parts.len() as libc::c_ulong;
    // SAFETY: each local iovec covers a live, exclusively borrowed buffer
    // of its length; remote addresses are only read by the kernel, which
    // checks them against the other process's mappings.
    let r = unsafe { libc::process_vm_readv(pid, local.as_ptr(), n, remote.as_ptr(), n, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instruction_words_to_offsets() {
        assert_eq!(byte_offset((3, 9), 0, 0xdead_beef_0000_0010), Some(16));
        assert_eq!(byte_offset((3, 10), 0, 8), Some(16));
        assert_eq!(byte_offset((3, 10), 0, u64::from(u32::MAX)), None); // f_lasti -1
        assert_eq!(byte_offset((3, 11), 0x1000, 0x1000 - 2), None);
        assert_eq!(byte_offset((3, 12), 0x1000, 0x1010), Some(16));
        assert_eq!(byte_offset((3, 13), 0x1000, 0x1000), Some(0));
    }

    #[test]
    fn unreadable_memory_is_an_error_not_a_panic() {
        let process = PythonProcess::for_tests((3, 12), super::super::offsets::for_version((3, 12)).unwrap());
        let mut namer = PyNamer::new(std::process::id(), &process);
        assert!(matches!(namer.frame(0, 0), Err(NameError::Read(_) | NameError::Short)));
        assert!(matches!(namer.frame(8, 0), Err(NameError::Read(_) | NameError::Short)));
        assert_eq!(namer.counts.read_errors, 2);
        assert_eq!(namer.len(), 0);
    }
}
