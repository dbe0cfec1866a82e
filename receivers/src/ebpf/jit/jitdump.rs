//! One process's jitdump (`jit-PID.dump`, the format of perf's
//! `jitdump-specification.txt`: a header, then records), opened safely and
//! read as it grows.
//!
//! The runtime maps the file executable (that is how perf finds it), so its
//! path comes from the process's mappings; it is opened inside the
//! process's root with the checks of a perf map. A code load names its
//! range like a perf map line; where a debug-info record came first for the
//! same code, the range is cut at its entries' addresses, each piece
//! named with the line of its instructions.
//!
//! Records are read whole: one still being written is read next time. The
//! code bytes a load carries are skipped, never read into memory. Either
//! byte order is read (the magic tells). A header that is not a jitdump's
//! (magic, version) or a record whose size cannot be (shorter than its
//! header, beyond [`MAX_RECORD`]) leaves the rest of the file unread: the
//! records have no other framing. A bad record of a sane size is skipped.

use std::fmt::Write as _;
use std::fs::File;
use std::io;
use std::sync::Arc;

pub(crate) use super::files::Refused;
use super::files::{open_checked, Checked, Growing, RangeTable, CHUNK, MAX_READ};
use super::names::{self, JitName, Runtime};
use super::perf_map::LineCounts;

/// The file header's size in version 1.
const HEADER: usize = 40;
/// A header claiming more than this is not a jitdump's.
const MAX_HEADER: u32 = 4096;
/// The writer's magic as read in its own byte order.
const MAGIC: u32 = 0x4A69_5444;
/// A record larger than this (code bytes included) is not a jitdump's.
const MAX_RECORD: u32 = 64 << 20;
/// A debug-info record larger than this is skipped.
const MAX_DEBUG: usize = 1 << 20;
/// A code name longer than this is malformed.
const MAX_NAME: usize = 4096;
/// Record header: id, total_size, timestamp.
const REC: usize = 16;
/// A load's fields before its name: pid, tid, vma, code_addr, code_size,
/// code_index.
const LOAD_FIXED: usize = 40;
/// A move's fields: pid, tid, vma, old_code_addr, new_code_addr,
/// code_size, code_index.
const MOVE_FIXED: usize = 48;
/// A debug entry's fields before its file name: code_addr, line, discrim.
const ENTRY_FIXED: usize = 16;
/// V8 writes debug entries' addresses this far past the instructions (the
/// ELF header `perf inject` puts before the code).
const V8_ENTRY_BIAS: u64 = 0x40;

const CODE_LOAD: u32 = 0;
const CODE_MOVE: u32 = 1;
const CODE_DEBUG_INFO: u32 = 2;

/// The outcome of opening a process's jitdump.
pub(crate) enum Open {
    Dump(Box<JitDump>),
    /// No such file (the process unmapped and deleted it).
    Missing,
    Refused(Refused),
}

/// One debug entry: where its instructions start, their line, their file
/// (`None`: the file of the code's own name).
struct Entry {
    addr: u64,
    line: u32,
    file: Option<Arc<str>>,
}

/// The last debug-info record, waiting for the load of its code.
struct PendingDebug {
    code_addr: u64,
    entries: Vec<Entry>,
}

/// The code ranges of one process's jitdump and their names.
pub(crate) struct JitDump {
    /// Read up to where the next record starts; at 0 until the header was
    /// read.
    file: Growing,
    /// The writer's byte order is not this machine's.
    swap: bool,
    /// A bad header or an unframed record: the rest is not read.
    broken: bool,
    pending: Option<PendingDebug>,
    runtime: Runtime,
    table: RangeTable,
    /// Scratch for intern keys.
    key: String,
}

/// The jitdump at `path_in_process` (a path in process `pid`'s mount
/// namespace, as its mappings show it), resolved inside the process's
/// root; `uids`: the process's real and effective user ids.
pub(crate) fn open(pid: u32, path_in_process: &str, uids: [u32; 2], runtime: Runtime) -> io::Result<Open> {
    let rel = path_in_process.trim_start_matches('/');
    if rel.is_empty() {
        return Ok(Open::Missing);
    }
    Ok(match open_checked(pid, rel, uids)? {
        Checked::File(file) => Open::Dump(Box::new(JitDump::new(file, runtime))),
        Checked::Missing => Open::Missing,
        Checked::Refused(r) => Open::Refused(r),
    })
}

/// Whether `base` (a mapped file's base name) is a jitdump's: `jit-PID.dump`.
pub(crate) fn is_jitdump_name(base: &str) -> bool {
    base.strip_prefix("jit-")
        .and_then(|s| s.strip_suffix(".dump"))
        .is_some_and(|pid| !pid.is_empty() && pid.len() <= 10 && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// Fixed-size reads in the writer's byte order.
#[derive(Clone, Copy)]
struct Order {
    swap: bool,
}

impl Order {
    fn u32(self, b: &[u8], at: usize) -> Option<u32> {
        let v = u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?);
        Some(if self.swap { v.swap_bytes() } else { v })
    }

    fn u64(self, b: &[u8], at: usize) -> Option<u64> {
        let v = u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?);
        Some(if self.swap { v.swap_bytes() } else { v })
    }
}

/// What came of one record.
enum Outcome {
    Read,
    /// Well-formed, left out: the table had no room.
    Dropped,
    Malformed,
}

/// What a record is worth reading of.
enum Need {
    /// Its first bytes (header included).
    Prefix(usize),
    /// Nothing: skipped by its size.
    Skip,
    /// Too large to be what it says: skipped, counted malformed.
    Malformed,
}

impl JitDump {
    fn new(file: File, runtime: Runtime) -> Self {
        JitDump {
            file: Growing::new(file),
            swap: false,
            broken: false,
            pending: None,
            runtime,
            table: RangeTable::default(),
            key: String::new(),
        }
    }

    #[cfg(test)]
    pub(crate) fn from_file(file: File, runtime: Runtime) -> Self {
        JitDump::new(file, runtime)
    }

    /// Bytes the table holds (an estimate of what the allocator charges).
    pub(crate) fn bytes(&self) -> usize {
        self.table.bytes()
    }

    /// The file was read to [`MAX_READ`]: the rest is left unread.
    pub(crate) fn capped(&self) -> bool {
        self.file.capped()
    }

    /// The name of the code at `addr`.
    pub(crate) fn lookup(&self, addr: u64) -> Option<(u32, &JitName)> {
        self.table.lookup(addr)
    }

    /// Reads the records written since the last read, at most [`CHUNK`]
    /// bytes; the table grows by at most `room` bytes (and one record's
    /// ranges). `buf` is scratch. `counts` counts records.
    pub(crate) fn refresh(&mut self, room: usize, buf: &mut Vec<u8>, counts: &mut LineCounts) -> io::Result<()> {
        let (len, rewritten) = self.file.begin()?;
        if rewritten {
            // What it said before no longer holds.
            self.swap = false;
            self.broken = false;
            self.pending = None;
            self.table = RangeTable::default();
        }
        if self.file.offset() == 0 && !self.read_header(len, counts)? {
            return Ok(());
        }
        let limit = self.bytes().saturating_add(room);
        let mut budget = CHUNK;
        while !self.broken && budget >= REC {
            let at = self.file.offset();
            let data = self.file.read(len, budget, buf)?;
            if data.len() < REC {
                break;
            }
            budget -= data.len();
            let used = self.records(data, at, len, limit, counts);
            if used == 0 {
                // A record reaching past the bound is never read.
                if at + data.len() as u64 >= MAX_READ {
                    self.file.cap();
                }
                break;
            }
            self.file.advance(used)?;
        }
        Ok(())
    }

    /// Reads and checks the file header; false if the records cannot be
    /// read (not written yet, or not a jitdump's).
    fn read_header(&mut self, len: u64, counts: &mut LineCounts) -> io::Result<bool> {
        if len < HEADER as u64 {
            // Not written yet.
            return Ok(false);
        }
        let mut head = [0u8; HEADER];
        if self.file.read_at(&mut head, 0)? < HEADER {
            return Ok(false);
        }
        let magic = u32::from_ne_bytes([head[0], head[1], head[2], head[3]]);
        let size = match magic {
            MAGIC | 0x4454_694A => {
                self.swap = magic != MAGIC;
                let o = Order { swap: self.swap };
                let version = o.u32(&head, 4);
                o.u32(&head, 8).filter(|s| version == Some(1) && (HEADER as u32..=MAX_HEADER).contains(s))
            }
            _ => None,
        };
        let Some(size) = size else {
            // Not a jitdump this reader knows: read as nothing, unless it
            // is rewritten (the header read is kept to see that).
            counts.malformed += 1;
            self.broken = true;
            self.file.advance(HEADER as u64)?;
            return Ok(false);
        };
        self.file.advance(u64::from(size))?;
        Ok(true)
    }

    /// Reads the whole records `data` (read at `start` of a file of `len`
    /// bytes) holds; returns the bytes they take in the file (beyond `data`
    /// where a load's code was skipped).
    fn records(&mut self, data: &[u8], start: u64, len: u64, limit: usize, counts: &mut LineCounts) -> u64 {
        let o = Order { swap: self.swap };
        let mut pos = 0usize;
        while pos + REC <= data.len() {
            let (Some(id), Some(size)) = (o.u32(data, pos), o.u32(data, pos + 4)) else { break };
            if (size as usize) < REC || size > MAX_RECORD {
                // Nothing says where the next record starts.
                counts.malformed += 1;
                self.broken = true;
                break;
            }
            if start + pos as u64 + u64::from(size) > len {
                // Still being written.
                break;
            }
            let size = size as usize;
            let need = match id {
                CODE_LOAD => Need::Prefix(size.min(REC + LOAD_FIXED + MAX_NAME + 1)),
                CODE_MOVE => Need::Prefix(size.min(REC + MOVE_FIXED)),
                CODE_DEBUG_INFO if size - REC > MAX_DEBUG => Need::Malformed,
                CODE_DEBUG_INFO => Need::Prefix(size),
                // Close, unwinding info, and ids this reader does not know.
                _ => Need::Skip,
            };
            match need {
                Need::Prefix(n) if pos + n > data.len() => break,
                Need::Prefix(n) => {
                    let body = &data[pos + REC..pos + n];
                    let outcome = match id {
                        CODE_LOAD => self.load(body, size - REC, limit),
                        CODE_MOVE => self.moved(body),
                        _ => self.debug_info(body),
                    };
                    match outcome {
                        Outcome::Read => counts.read += 1,
                        Outcome::Dropped => counts.dropped += 1,
                        Outcome::Malformed => counts.malformed += 1,
                    }
                }
                Need::Skip => {}
                Need::Malformed => counts.malformed += 1,
            }
            pos += size;
        }
        pos as u64
    }

    /// A code load (`body`: the record after its header, `size` bytes in
    /// the file): its range named, cut by its debug entries.
    fn load(&mut self, body: &[u8], size: usize, limit: usize) -> Outcome {
        let o = Order { swap: self.swap };
        let pending = self.pending.take();
        let (Some(addr), Some(code_size)) = (o.u64(body, 16), o.u64(body, 24)) else { return Outcome::Malformed };
        let Some(nul) = body.get(LOAD_FIXED..).and_then(|b| b.iter().position(|&c| c == 0)) else {
            return Outcome::Malformed;
        };
        let Ok(name) = std::str::from_utf8(&body[LOAD_FIXED..LOAD_FIXED + nul]) else { return Outcome::Malformed };
        // The code bytes follow the name in the record.
        let room_for_code = (size - LOAD_FIXED - nul - 1) as u64;
        let Some(end) = addr.checked_add(code_size) else { return Outcome::Malformed };
        if name.is_empty() || code_size == 0 || code_size > room_for_code {
            return Outcome::Malformed;
        }
        if self.bytes() >= limit {
            return Outcome::Dropped;
        }
        let runtime = self.runtime;
        let plain = self.table.intern(name, || names::parse(runtime, name));
        self.table.insert(addr, end, plain);
        let Some(mut debug) = pending.filter(|d| d.code_addr == addr) else { return Outcome::Read };
        let base = self.table.sym(plain).clone();
        debug.entries.retain(|e| e.addr < end);
        debug.entries.sort_by_key(|e| e.addr);
        // Of entries at one address the last says; a run of entries of one
        // line is one range.
        let mut runs: Vec<&Entry> = Vec::with_capacity(debug.entries.len());
        for e in &debug.entries {
            match runs.last_mut() {
                Some(l) if l.addr == e.addr => *l = e,
                Some(l) if l.line == e.line && l.file == e.file => {}
                _ => runs.push(e),
            }
        }
        for (k, e) in runs.iter().enumerate() {
            let stop = runs.get(k + 1).map_or(end, |n| n.addr);
            let file = e.file.clone().unwrap_or_else(|| base.file.clone());
            self.key.clear();
            let _ = write!(self.key, "{name}\0{file}\0{}", e.line);
            let line = e.line;
            let sym = self.table.intern(&self.key, || JitName {
                function: base.function.clone(),
                file,
                line,
                frame_type: base.frame_type,
            });
            self.table.insert(e.addr, stop, sym);
        }
        Outcome::Read
    }

    /// Code moved: its new range named as the old one.
    fn moved(&mut self, body: &[u8]) -> Outcome {
        let o = Order { swap: self.swap };
        let (Some(old), Some(new), Some(size)) = (o.u64(body, 16), o.u64(body, 24), o.u64(body, 32)) else {
            return Outcome::Malformed;
        };
        if size == 0
            || size > u64::from(MAX_RECORD)
            || old.checked_add(size).is_none()
            || new.checked_add(size).is_none()
        {
            return Outcome::Malformed;
        }
        self.table.copy(old, new, size);
        Outcome::Read
    }

    /// Debug info for the code load that follows.
    fn debug_info(&mut self, body: &[u8]) -> Outcome {
        self.pending = None;
        let o = Order { swap: self.swap };
        let (Some(code_addr), Some(nr)) = (o.u64(body, 0), o.u64(body, 8)) else { return Outcome::Malformed };
        let rest = &body[16..];
        if nr > (rest.len() / (ENTRY_FIXED + 1)) as u64 {
            return Outcome::Malformed;
        }
        let bias = if self.runtime == Runtime::V8 { V8_ENTRY_BIAS } else { 0 };
        let entries = parse_entries(o, rest, nr as usize, code_addr, bias)
            // V8 (Node 20) writes some file names as bytes of the right
            // length that are not the name (a NUL among them): entries
            // one size each, read at that stride.
            .or_else(|| parse_entries_strided(o, rest, nr as usize, code_addr, bias));
        match entries {
            Some(entries) => {
                self.pending = Some(PendingDebug { code_addr, entries });
                Outcome::Read
            }
            None => Outcome::Malformed,
        }
    }
}

/// An entry's address, `bias` removed, if it can be within code at
/// `code_addr`.
fn entry_addr(raw: u64, code_addr: u64, bias: u64) -> Option<u64> {
    let a = raw.checked_sub(bias)?;
    (a >= code_addr && a - code_addr < u64::from(MAX_RECORD)).then_some(a)
}

/// A file name as written: `None` where it is not text (the code's own
/// file is used).
fn file_name(raw: &[u8], prev: Option<&Option<Arc<str>>>) -> Option<Arc<str>> {
    if raw == [0xff] {
        // The previous entry's file.
        return prev.cloned().flatten();
    }
    let s = std::str::from_utf8(raw).ok()?;
    (!s.is_empty() && !s.chars().any(char::is_control)).then(|| Arc::from(s))
}

/// `nr` entries as the specification writes them (each file name up to
/// its NUL), all within the code, filling `rest` but for padding.
fn parse_entries(o: Order, rest: &[u8], nr: usize, code_addr: u64, bias: u64) -> Option<Vec<Entry>> {
    let mut entries: Vec<Entry> = Vec::with_capacity(nr);
    let mut pos = 0;
    for _ in 0..nr {
        let addr = entry_addr(o.u64(rest, pos)?, code_addr, bias)?;
        let line = o.u32(rest, pos + 8)?;
        let name = rest.get(pos + ENTRY_FIXED..)?;
        let nul = name.iter().position(|&c| c == 0)?;
        let file = file_name(&name[..nul], entries.last().map(|e| &e.file));
        entries.push(Entry { addr, line, file });
        pos += ENTRY_FIXED + nul + 1;
    }
    (rest.len() - pos < 8).then_some(entries)
}

/// `nr` entries of one size filling `rest` but for padding, each name
/// ending in a NUL where that size puts it.
fn parse_entries_strided(o: Order, rest: &[u8], nr: usize, code_addr: u64, bias: u64) -> Option<Vec<Entry>> {
    if nr == 0 {
        return None;
    }
    let stride = rest.len() / nr;
    if stride <= ENTRY_FIXED || rest.len() - stride * nr >= 8 {
        return None;
    }
    let mut entries: Vec<Entry> = Vec::with_capacity(nr);
    for i in 0..nr {
        let e = &rest[i * stride..(i + 1) * stride];
        if e[stride - 1] != 0 {
            return None;
        }
        let addr = entry_addr(o.u64(e, 0)?, code_addr, bias)?;
        let line = o.u32(e, 8)?;
        let file = file_name(&e[ENTRY_FIXED..stride - 1], entries.last().map(|e| &e.file));
        entries.push(Entry { addr, line, file });
    }
    Some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    /// A jitdump written in either byte order.
    struct W {
        b: Vec<u8>,
        swap: bool,
    }

    impl W {
        fn new(swap: bool) -> W {
            let mut w = W { b: Vec::new(), swap };
            w.u32(MAGIC).u32(1).u32(HEADER as u32).u32(62).u32(0).u32(4242).u64(1).u64(0);
            w
        }

        fn u32(&mut self, v: u32) -> &mut W {
            let v = if self.swap { v.swap_bytes() } else { v };
            self.b.extend_from_slice(&v.to_ne_bytes());
            self
        }

        fn u64(&mut self, v: u64) -> &mut W {
            let v = if self.swap { v.swap_bytes() } else { v };
            self.b.extend_from_slice(&v.to_ne_bytes());
            self
        }

        fn bytes(&mut self, b: &[u8]) -> &mut W {
            self.b.extend_from_slice(b);
            self
        }

        /// A record: `body` writes its fields after the header.
        fn rec(&mut self, id: u32, body: impl FnOnce(&mut W)) -> &mut W {
            let at = self.b.len();
            self.u32(id).u32(0).u64(7);
            body(self);
            let size = (self.b.len() - at) as u32;
            let size = if self.swap { size.swap_bytes() } else { size };
            self.b[at + 4..at + 8].copy_from_slice(&size.to_ne_bytes());
            self
        }

        fn load(&mut self, addr: u64, size: u64, name: &str) -> &mut W {
            self.rec(CODE_LOAD, |w| {
                w.u32(1).u32(1).u64(addr).u64(addr).u64(size).u64(3);
                w.bytes(name.as_bytes()).bytes(&[0]).bytes(&vec![0xcc; size as usize]);
            })
        }

        fn debug(&mut self, addr: u64, entries: &[(u64, u32, &[u8])]) -> &mut W {
            self.rec(CODE_DEBUG_INFO, |w| {
                w.u64(addr).u64(entries.len() as u64);
                for (a, line, file) in entries {
                    w.u64(*a).u32(*line).u32(0).bytes(file).bytes(&[0]);
                }
            })
        }

        fn moved(&mut self, old: u64, new: u64, size: u64) -> &mut W {
            self.rec(CODE_MOVE, |w| {
                w.u32(1).u32(1).u64(new).u64(old).u64(new).u64(size).u64(3);
            })
        }
    }

    fn dump_of(bytes: &[u8], runtime: Runtime) -> (tempfile::NamedTempFile, JitDump) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        let d = JitDump::from_file(f.reopen().unwrap(), runtime);
        (f, d)
    }

    fn refresh(d: &mut JitDump) -> LineCounts {
        let mut c = LineCounts::default();
        d.refresh(usize::MAX / 2, &mut Vec::new(), &mut c).unwrap();
        c
    }

    fn at(d: &JitDump, a: u64) -> Option<(String, String, u32)> {
        d.lookup(a).map(|(_, n)| (n.function.to_string(), n.file.to_string(), n.line))
    }

    fn named(f: &str, file: &str, line: u32) -> Option<(String, String, u32)> {
        Some((f.into(), file.into(), line))
    }

    /// Debug info, two loads, a move, a record of an unknown kind, close.
    fn sample(swap: bool) -> Vec<u8> {
        let mut w = W::new(swap);
        // V8's entries: 0x40 past their instructions.
        w.debug(
            0x1000,
            &[(0x1050, 11, b"/a.js"), (0x1040, 10, b"/a.js"), (0x1060, 12, b"/b.js"), (0x1070, 12, b"\xff")],
        );
        w.load(0x1000, 0x40, "JS:*f /a.js:9:1");
        w.load(0x2000, 0x10, "JS:*g /a.js:20:1");
        w.moved(0x2000, 0x3000, 0x10);
        w.rec(9, |w| {
            w.bytes(b"whatever");
        });
        w.rec(3, |_| {});
        w.b
    }

    fn check_sample(d: &JitDump) {
        assert_eq!(at(d, 0x1005), named("f", "/a.js", 10));
        assert_eq!(at(d, 0x1015), named("f", "/a.js", 11));
        assert_eq!(at(d, 0x1020), named("f", "/b.js", 12));
        assert_eq!(at(d, 0x103f), named("f", "/b.js", 12), "\\xff: the previous entry's file");
        assert_eq!(at(d, 0x1040), None);
        assert_eq!(at(d, 0x2005), named("g", "/a.js", 20), "no debug info: the function's line");
        assert_eq!(at(d, 0x3005), named("g", "/a.js", 20), "moved");
    }

    #[test]
    fn loads_are_cut_by_their_debug_entries_in_either_byte_order() {
        for swap in [false, true] {
            let (_f, mut d) = dump_of(&sample(swap), Runtime::V8);
            let c = refresh(&mut d);
            assert_eq!(c, LineCounts { read: 4, malformed: 0, dropped: 0 }, "swap {swap}");
            check_sample(&d);
        }
        // Other writers' entries are at their instructions.
        let mut w = W::new(false);
        w.debug(0x1000, &[(0x1000, 10, b"m.lua"), (0x1008, 11, b"m.lua")]);
        w.load(0x1000, 0x10, "TRACE_1");
        let (_f, mut d) = dump_of(&w.b, Runtime::Other);
        refresh(&mut d);
        assert_eq!(at(&d, 0x1007), named("TRACE_1", "m.lua", 10));
        assert_eq!(at(&d, 0x1008), named("TRACE_1", "m.lua", 11));
    }

    #[test]
    fn v8_entries_are_biased_and_their_garbled_file_names_read_at_a_stride() {
        let mut w = W::new(false);
        // As Node 20 writes its own scripts' entries: the file name's
        // length right, its bytes not the name (a NUL among them).
        w.debug(
            0x1000,
            &[(0x1040, 2, b"+%\x02\0\0\0\0\0\xc4\x14\xb8\xc4"), (0x1050, 3, b"+%\x02\0\0\0\0\0\xc4\x14\xb8\xc4")],
        );
        w.load(0x1000, 0x30, "JS:*hot /t/x.js:1:13");
        w.debug(0x2000, &[(0x2040, 7, b"node:path"), (0x2048, 8, b"node:path")]);
        w.load(0x2000, 0x10, "JS:^resolve node:path:5:1");
        let (_f, mut d) = dump_of(&w.b, Runtime::V8);
        let c = refresh(&mut d);
        assert_eq!(c.malformed, 0, "{c:?}");
        assert_eq!(at(&d, 0x1000), named("hot", "/t/x.js", 2));
        assert_eq!(at(&d, 0x100f), named("hot", "/t/x.js", 2));
        assert_eq!(at(&d, 0x1010), named("hot", "/t/x.js", 3));
        assert_eq!(at(&d, 0x102f), named("hot", "/t/x.js", 3));
        assert_eq!(at(&d, 0x2007), named("resolve", "node:path", 7));
        assert_eq!(at(&d, 0x2008), named("resolve", "node:path", 8));
    }

    #[test]
    fn a_file_read_in_pieces_names_what_a_whole_read_does() {
        let whole = sample(false);
        for cut in 0..whole.len() {
            let (mut f, mut d) = dump_of(&whole[..cut], Runtime::V8);
            let c1 = refresh(&mut d);
            f.write_all(&whole[cut..]).unwrap();
            f.flush().unwrap();
            let c2 = refresh(&mut d);
            assert_eq!(c1.read + c2.read, 4, "cut at {cut}");
            assert_eq!(c1.malformed + c2.malformed, 0, "cut at {cut}");
            check_sample(&d);
        }
    }

    #[test]
    fn bad_headers_are_read_as_nothing() {
        let good = sample(false);
        let mut bad_magic = good.clone();
        bad_magic[0] ^= 1;
        let mut version_2 = good.clone();
        version_2[4] = 2;
        let mut header_too_small = good.clone();
        header_too_small[8] = 8;
        let mut header_huge = good.clone();
        header_huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        for (what, bytes) in
            [("magic", bad_magic), ("version", version_2), ("small", header_too_small), ("huge", header_huge)]
        {
            let (_f, mut d) = dump_of(&bytes, Runtime::V8);
            assert_eq!(refresh(&mut d), LineCounts { read: 0, malformed: 1, dropped: 0 }, "{what}");
            assert_eq!(refresh(&mut d), LineCounts::default(), "{what}: counted once");
            assert_eq!(d.bytes(), 0, "{what}");
        }
        // A header not written yet is waited for.
        let (mut f, mut d) = dump_of(&good[..20], Runtime::V8);
        assert_eq!(refresh(&mut d), LineCounts::default());
        f.write_all(&good[20..]).unwrap();
        assert_eq!(refresh(&mut d).read, 4);
    }

    #[test]
    fn bad_records_are_counted_and_bounded() {
        // A record shorter than its header, or beyond any sane size: the
        // rest is unframed, not read.
        for size in [0u32, 15, MAX_RECORD + 1, u32::MAX] {
            let mut w = W::new(false);
            w.load(0x1000, 0x10, "JS:*a /x.js:1:1");
            w.u32(CODE_LOAD).u32(size).u64(0);
            w.b.extend_from_slice(&[0u8; 64]);
            let mut tail = W::new(false);
            tail.load(0x5000, 0x10, "JS:*b /x.js:1:1");
            w.b.extend_from_slice(&tail.b[HEADER..]);
            let (_f, mut d) = dump_of(&w.b, Runtime::V8);
            let c = refresh(&mut d);
            assert_eq!((c.read, c.malformed), (1, 1), "size {size}");
            assert!(at(&d, 0x1000).is_some() && at(&d, 0x5000).is_none(), "size {size}");
        }
        // Framed but wrong: skipped, the next record read.
        let mut w = W::new(false);
        // A name without its NUL.
        w.rec(CODE_LOAD, |w| {
            w.u32(1).u32(1).u64(0x1000).u64(0x1000).u64(0).u64(0).bytes(b"JS:*noend");
        });
        // Code larger than its record; code running past the address space.
        w.load(0x1000, 4, "JS:*big /x.js:1:1");
        let n = w.b.len();
        w.b[n - 4 - 18 - 8 - 8..n - 4 - 18 - 8].copy_from_slice(&1000u64.to_le_bytes());
        w.rec(CODE_LOAD, |w| {
            w.u32(1).u32(1).u64(u64::MAX - 1).u64(u64::MAX - 1).u64(16).u64(0).bytes(b"x\0").bytes(&[0; 16]);
        });
        // Debug info with more entries than bytes, and one whose entries
        // are not within its code.
        w.rec(CODE_DEBUG_INFO, |w| {
            w.u64(0x1000).u64(u64::MAX).u64(0x1000).u32(1).u32(0).bytes(b"f\0");
        });
        w.debug(0x1000, &[(0x10, 1, b"f")]);
        // A move running past the address space; a record of its header only.
        w.moved(0x1000, u64::MAX - 4, 16);
        w.rec(CODE_MOVE, |_| {});
        w.load(0x7000, 0x10, "JS:*ok /x.js:1:1");
        let (_f, mut d) = dump_of(&w.b, Runtime::V8);
        let c = refresh(&mut d);
        assert_eq!(c, LineCounts { read: 1, malformed: 7, dropped: 0 });
        assert_eq!(at(&d, 0x7000), named("ok", "/x.js", 1));
        assert_eq!(at(&d, 0x1000), None);
    }

    #[test]
    fn random_bytes_and_mutations_never_panic() {
        let good = sample(false);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..3000 {
            let mut b = good.clone();
            for _ in 0..1 + round % 8 {
                let i = (next() % b.len() as u64) as usize;
                b[i] = next() as u8;
            }
            if round % 5 == 0 {
                b.truncate((next() % b.len() as u64) as usize);
            }
            if round % 7 == 0 {
                b.extend((0..next() % 200).map(|_| next() as u8));
            }
            let (_f, mut d) = dump_of(&b, Runtime::V8);
            refresh(&mut d);
            let _ = d.lookup(0x1000);
            assert!(d.bytes() < 64 << 10);
        }
    }

    #[test]
    fn huge_files_are_read_in_chunks_up_to_the_bound() {
        // Records of 32 MiB (unwinding info, skipped) over a 1 GiB sparse
        // file: read up to MAX_READ, one chunk of buffer.
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&W::new(false).b).unwrap();
        let size = 32u64 << 20;
        let mut w = W::new(false);
        w.b.clear();
        w.u32(4).u32(size as u32).u64(0);
        for i in 0..32 {
            f.as_file().write_all_at(&w.b, HEADER as u64 + i * size).unwrap();
        }
        f.as_file().set_len(1 << 30).unwrap();
        let mut d = JitDump::from_file(f.reopen().unwrap(), Runtime::V8);
        let (mut buf, mut c) = (Vec::new(), LineCounts::default());
        for _ in 0..40 {
            d.refresh(1 << 20, &mut buf, &mut c).unwrap();
        }
        assert!(d.capped(), "read up to its bound");
        assert!(buf.capacity() <= CHUNK, "one chunk of buffer");
        assert_eq!((c.read, d.bytes()), (0, 0));

        // A record claiming 60 MiB in a small file: waited for, not read.
        let mut w = W::new(false);
        w.u32(CODE_LOAD).u32(60 << 20).u64(0);
        w.b.extend_from_slice(&[0; 100]);
        let (_f, mut d) = dump_of(&w.b, Runtime::V8);
        let mut buf = Vec::new();
        d.refresh(1 << 20, &mut buf, &mut c).unwrap();
        assert!(buf.capacity() < 4096 && d.bytes() == 0);
    }

    #[test]
    fn the_table_stops_growing_at_its_room() {
        let mut w = W::new(false);
        for i in 0..5000u64 {
            let a = 0x10000 + i * 0x100;
            w.debug(a, &[(a, 1, b"/x.js"), (a + 8, 2, b"/x.js"), (a + 16, 3, b"/x.js")]);
            w.load(a, 0x20, &format!("JS:*f{i} /x.js:1:1"));
        }
        let (_f, mut d) = dump_of(&w.b, Runtime::Other);
        let mut c = LineCounts::default();
        d.refresh(64 << 10, &mut Vec::new(), &mut c).unwrap();
        assert!(c.dropped > 0 && c.read > 0, "{c:?}");
        assert!(d.bytes() < (64 << 10) + 2048, "{} bytes", d.bytes());
    }

    #[test]
    fn a_rewritten_dump_is_read_again_from_the_start() {
        let (f, mut d) = dump_of(&sample(false), Runtime::V8);
        refresh(&mut d);
        check_sample(&d);
        // Same header, other records, longer.
        let mut w = W::new(false);
        w.load(0x9000, 0x10, "JS:*z /z.js:1:1");
        w.load(0xa000, 0x10, "JS:*y /z.js:1:1");
        w.load(0xb000, 0x10, "JS:*x /z.js:1:1");
        w.load(0xc000, 0x10, "JS:*w /z.js:1:1");
        std::fs::write(f.path(), &w.b).unwrap();
        refresh(&mut d);
        assert_eq!(at(&d, 0x1005), None, "the old dump is gone");
        assert_eq!(at(&d, 0xc000), named("w", "/z.js", 1));
        // Truncated.
        std::fs::write(f.path(), &W::new(false).b).unwrap();
        refresh(&mut d);
        assert_eq!(at(&d, 0xc000), None);
    }

    #[test]
    fn jitdump_names() {
        assert!(is_jitdump_name("jit-1234.dump"));
        for bad in ["jit-.dump", "jit-12a.dump", "perf-1.map", "jit-1.dump.x", "xjit-1.dump"] {
            assert!(!is_jitdump_name(bad), "{bad}");
        }
    }

    /// Node's own jitdump (`--perf-prof`) of a hot function: found with its
    /// file and lines inside its body, per instruction.
    #[test]
    fn node_perf_prof_dump_names_lines_inside_the_function() {
        if !profcol_testkit::tools::tool_available("node", &["--version"]) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("hot.js");
        std::fs::write(
            &script,
            "'use strict';\n\
             function hotLoop(n) {\n\
             \x20 let s = 0;\n\
             \x20 for (let i = 0; i < n; i++) {\n\
             \x20   s += Math.sqrt(i) * (i % 7);\n\
             \x20 }\n\
             \x20 return s;\n\
             }\n\
             const t = Date.now();\n\
             let r = 0;\n\
             while (Date.now() - t < 700) r += hotLoop(100000);\n\
             console.log(r > 0);\n",
        )
        .unwrap();
        let st = std::process::Command::new("node")
            .arg("--perf-prof")
            .arg(&script)
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(st.success());
        let path = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| is_jitdump_name(p.file_name().unwrap().to_str().unwrap()))
            .expect("node wrote a jit-PID.dump");
        let mut d = JitDump::from_file(File::open(&path).unwrap(), Runtime::V8);
        let (mut buf, mut c) = (Vec::new(), LineCounts::default());
        for _ in 0..8 {
            d.refresh(usize::MAX / 2, &mut buf, &mut c).unwrap();
        }
        assert!(c.read > 100 && c.malformed == 0, "{c:?}");
        let script = script.to_str().unwrap();
        // Every range of the hot function's code: its lines.
        let mut lines = std::collections::BTreeSet::new();
        for (_, _, n) in d.table.ranges() {
            if &*n.function == "hotLoop" {
                assert_eq!(&*n.file, script);
                lines.insert(n.line);
            }
        }
        assert!(lines.iter().all(|l| (2..=8).contains(l)), "{lines:?}");
        assert!(lines.iter().any(|l| (3..=7).contains(l)), "a line inside the body: {lines:?}");
        assert!(lines.len() >= 3, "per-instruction lines: {lines:?}");
    }
}
