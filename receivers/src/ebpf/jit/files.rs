//! What the JIT namers share: a process's file opened safely inside its
//! root, and the table of named code ranges read from it.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::names::JitName;

/// What one range costs (tree node share, key, value).
const RANGE_BYTES: usize = 48;
/// What one distinct name costs beyond its text (the symbol, the intern
/// table's entry).
const NAME_BYTES: usize = 96;

/// Why a map file was not read (the `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not a regular file (a FIFO, a device, a directory) or a path with a
    /// symlink in it.
    NotRegular,
    /// Owned by another user than the process's.
    Owner,
    /// A hard link to a file elsewhere.
    Links,
}

impl Refused {
    pub(crate) const ALL: [Refused; 3] = [Refused::NotRegular, Refused::Owner, Refused::Links];

    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refused::NotRegular => "not_regular",
            Refused::Owner => "owner",
            Refused::Links => "links",
        }
    }
}

/// A process's file, opened and checked.
pub(crate) enum Checked {
    File(File),
    Missing,
    Refused(Refused),
}

/// Opens `rel` (relative to the process's `/`) of process `pid` and keeps
/// it only if it is a regular file with one link owned by one of `uids`.
pub(crate) fn open_checked(pid: u32, rel: &str, uids: [u32; 2]) -> io::Result<Checked> {
    let fd = match open_in_root(pid, rel) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(Checked::Missing),
        // A symlink anywhere in the path (RESOLVE_NO_SYMLINKS, O_NOFOLLOW).
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::EXDEV)) => {
            return Ok(Checked::Refused(Refused::NotRegular))
        }
        Err(e) => return Err(e),
    };
    let file = File::from(fd);
    let md = file.metadata()?;
    if !md.file_type().is_file() {
        return Ok(Checked::Refused(Refused::NotRegular));
    }
    if !uids.contains(&md.uid()) {
        return Ok(Checked::Refused(Refused::Owner));
    }
    if md.nlink() != 1 {
        return Ok(Checked::Refused(Refused::Links));
    }
    Ok(Checked::File(file))
}

/// Opens `rel` under `/proc/PID/root` as if that were `/`, following no
/// symlink (an absolute one in the process's tree would otherwise point
/// into the agent's), not blocking on a FIFO.
fn open_in_root(pid: u32, rel: &str) -> io::Result<OwnedFd> {
    let root = CString::new(format!("/proc/{pid}/root")).map_err(io::Error::other)?;
    // SAFETY: a valid C string; the result is checked.
    let rfd = unsafe { libc::open(root.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if rfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: rfd was just opened and is owned here.
    let rfd = unsafe { OwnedFd::from_raw_fd(rfd) };
    let rel = CString::new(rel).map_err(io::Error::other)?;
    // SAFETY: open_how is plain integers; all zero is its empty value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: valid fd, C string and open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            rfd.as_raw_fd(),
            rel.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor, owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Reads into `buf` from `at` until it is full or the file ends.
pub(crate) fn read_full_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Bytes read per refresh at most: a large file is read over several
/// reports.
pub(crate) const CHUNK: usize = 4 << 20;
/// Bytes of one file read at most: what is beyond is left unread.
pub(crate) const MAX_READ: u64 = 512 << 20;
/// Bytes compared at the file's start and before the read position to tell
/// an append from a rewrite.
const MARK: usize = 64;

/// Bytes of a file as read at one place.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Mark {
    at: u64,
    len: usize,
    bytes: [u8; MARK],
}

impl Mark {
    const NONE: Mark = Mark { at: 0, len: 0, bytes: [0; MARK] };

    fn read(file: &File, at: u64, len: usize) -> io::Result<Mark> {
        let mut m = Mark { at, len, bytes: [0; MARK] };
        m.len = read_full_at(file, &mut m.bytes[..len.min(MARK)], at)?;
        Ok(m)
    }
}

/// A file its runtime appends to, read from where the last read stopped.
/// A file rewritten from the start (shorter than what was read, or other
/// bytes at its start or just before the read position) is read again from
/// the start; a length alone would not tell.
pub(crate) struct Growing {
    file: File,
    /// Bytes consumed.
    offset: u64,
    head: Mark,
    tail: Mark,
    /// Read to [`MAX_READ`]: the rest is left unread.
    capped: bool,
}

impl Growing {
    pub(crate) fn new(file: File) -> Self {
        Growing { file, offset: 0, head: Mark::NONE, tail: Mark::NONE, capped: false }
    }

    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    pub(crate) fn capped(&self) -> bool {
        self.capped
    }

    /// The file's length, and whether it was rewritten since the last read:
    /// then reading starts over from its start, and what was parsed from
    /// it no longer holds.
    pub(crate) fn begin(&mut self) -> io::Result<(u64, bool)> {
        let len = self.file.metadata()?.len();
        let rewritten = self.offset > 0
            && (len < self.offset
                || Mark::read(&self.file, 0, self.head.len)? != self.head
                || Mark::read(&self.file, self.tail.at, self.tail.len)? != self.tail);
        if rewritten {
            self.offset = 0;
            self.head = Mark::NONE;
            self.tail = Mark::NONE;
            self.capped = false;
        }
        Ok((len, rewritten))
    }

    /// Reads up to `max` bytes from the read position into `buf` (none past
    /// `len` or the [`MAX_READ`] bound) and returns them: empty at the end,
    /// or at the bound (then [`Growing::capped`]).
    pub(crate) fn read<'b>(&mut self, len: u64, max: usize, buf: &'b mut Vec<u8>) -> io::Result<&'b [u8]> {
        if self.offset >= MAX_READ {
            self.capped = true;
            return Ok(&[]);
        }
        let want = len.saturating_sub(self.offset).min(max as u64).min(MAX_READ - self.offset) as usize;
        buf.clear();
        buf.resize(want, 0);
        let n = read_full_at(&self.file, buf, self.offset)?;
        Ok(&buf[..n])
    }

    /// Marks the file read to its bound: what is left reaches past it.
    pub(crate) fn cap(&mut self) {
        self.capped = true;
    }

    /// Reads `buf.len()` bytes at `at`, fewer at the end of the file.
    pub(crate) fn read_at(&self, buf: &mut [u8], at: u64) -> io::Result<usize> {
        read_full_at(&self.file, buf, at)
    }

    /// Moves the read position `n` bytes on, past what was parsed or
    /// skipped, and marks the bytes that must not change.
    pub(crate) fn advance(&mut self, n: u64) -> io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.offset += n;
        if self.head.len == 0 {
            self.head = Mark::read(&self.file, 0, self.offset.min(MARK as u64) as usize)?;
        }
        let len = self.offset.min(MARK as u64);
        self.tail = Mark::read(&self.file, self.offset - len, len as usize)?;
        Ok(())
    }
}

/// A named code range.
#[derive(Clone, Copy, Debug)]
struct Range {
    end: u64,
    sym: u32,
}

/// Named code ranges. Ranges never overlap: a later one overrides what it
/// covers of earlier ones, as runtimes reuse freed code memory.
#[derive(Default)]
pub(crate) struct RangeTable {
    /// Start → range.
    ranges: BTreeMap<u64, Range>,
    syms: Vec<JitName>,
    ids: FxHashMap<Arc<str>, u32>,
    /// Bytes the names hold.
    name_bytes: usize,
}

impl RangeTable {
    /// Bytes the table holds (an estimate of what the allocator charges).
    pub(crate) fn bytes(&self) -> usize {
        self.ranges.len() * RANGE_BYTES + self.name_bytes
    }

    /// The name of the code at `addr`, with its id in this table.
    pub(crate) fn lookup(&self, addr: u64) -> Option<(u32, &JitName)> {
        let (_, r) = self.ranges.range(..=addr).next_back()?;
        (addr < r.end).then(|| (r.sym, &self.syms[r.sym as usize]))
    }

    /// Every range and its name.
    #[cfg(test)]
    pub(crate) fn ranges(&self) -> impl Iterator<Item = (u64, u64, &JitName)> {
        self.ranges.iter().map(|(&s, r)| (s, r.end, &self.syms[r.sym as usize]))
    }

    /// The name of id `sym`.
    pub(crate) fn sym(&self, sym: u32) -> &JitName {
        &self.syms[sym as usize]
    }

    /// Names [to, to + size) as [from, from + size) is named: code moved.
    pub(crate) fn copy(&mut self, from: u64, to: u64, size: u64) {
        let (Some(from_end), Some(_)) = (from.checked_add(size), to.checked_add(size)) else { return };
        let over: Vec<(u64, Range)> =
            self.ranges.range(..from_end).rev().take_while(|(_, r)| r.end > from).map(|(&s, &r)| (s, r)).collect();
        for (s, r) in over {
            let (s, e) = (s.max(from), r.end.min(from_end));
            if s < e {
                self.insert(s - from + to, e - from + to, r.sym);
            }
        }
    }

    /// The id of the name written `key`, made by `make` the first time.
    pub(crate) fn intern(&mut self, key: &str, make: impl FnOnce() -> JitName) -> u32 {
        if let Some(&id) = self.ids.get(key) {
            return id;
        }
        let id = self.syms.len() as u32;
        let name = make();
        self.name_bytes += NAME_BYTES + key.len() + name.function.len() + name.file.len();
        self.syms.push(name);
        self.ids.insert(Arc::from(key), id);
        id
    }

    /// Adds [start, end) → `sym`, cutting what it overlaps.
    pub(crate) fn insert(&mut self, start: u64, end: u64, sym: u32) {
        let over: Vec<(u64, Range)> =
            self.ranges.range(..end).rev().take_while(|(_, r)| r.end > start).map(|(&s, &r)| (s, r)).collect();
        for (s, r) in over {
            self.ranges.remove(&s);
            if s < start {
                self.ranges.insert(s, Range { end: start, sym: r.sym });
            }
            if r.end > end {
                self.ranges.insert(end, Range { end: r.end, sym: r.sym });
            }
        }
        self.ranges.insert(start, Range { end, sym });
    }
}
