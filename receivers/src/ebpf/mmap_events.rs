//! The kernel's own account of executable file mappings: the side-band
//! records `perf record` follows processes with, read here for the uprobe
//! side so a new process costs no /proc access.
//!
//! One software dummy perf event per CPU (no samples, no timer) with
//! `mmap2` and `comm_exec` set: the kernel writes into its ring
//!
//! - a `PERF_RECORD_COMM` with `PERF_RECORD_MISC_COMM_EXEC` when a process
//!   starts a new image (in `begin_new_exec`, before the image is mapped);
//! - a `PERF_RECORD_MMAP2` for every executable mapping of a file: the
//!   executable itself (mapped by the exec, before the exec tracepoint
//!   fires), the dynamic loader, and every library it or `dlopen` maps
//!   later, each with the file's device and inode and its path as the
//!   process sees it (in its mount namespace);
//! - a `PERF_RECORD_LOST` when the ring was full.
//!
//! Every record carries its time (`CLOCK_MONOTONIC`, the clock of the BPF
//! process events) so the reader can put them in order with the exec and
//! exit events. Rings are read on the receiver's own wake-ups; a ring half
//! full wakes it (`watermark`), so bursts are read before they are lost.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Bytes of one CPU's ring (a power of two; one more page holds the header).
pub const RING_BYTES: usize = 64 * 1024;

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_DUMMY: u64 = 9;
const PERF_SAMPLE_TID: u64 = 1 << 1;
const PERF_SAMPLE_TIME: u64 = 1 << 2;
/// `perf_event_attr` flag bits.
const ATTR_MMAP: u64 = 1 << 8;
const ATTR_COMM: u64 = 1 << 9;
const ATTR_WATERMARK: u64 = 1 << 14;
const ATTR_SAMPLE_ID_ALL: u64 = 1 << 18;
const ATTR_MMAP2: u64 = 1 << 23;
const ATTR_COMM_EXEC: u64 = 1 << 24;
const ATTR_USE_CLOCKID: u64 = 1 << 25;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

const PERF_RECORD_LOST: u32 = 2;
const PERF_RECORD_COMM: u32 = 3;
const PERF_RECORD_MMAP2: u32 = 10;
const PERF_RECORD_MISC_COMM_EXEC: u16 = 1 << 13;
const PERF_RECORD_MISC_MMAP_BUILD_ID: u16 = 1 << 14;

/// `struct perf_event_attr` up to `sig_data` (PERF_ATTR_SIZE_VER7).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_watermark: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved_2: u16,
    aux_sample_size: u32,
    reserved_3: u32,
    sig_data: u64,
}

/// Offsets in `struct perf_event_mmap_page` (stable ABI).
const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;

/// What one record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MappingEventKind {
    /// The process started a new image (exec).
    Exec,
    /// An executable mapping of a file; its path is `MappingEvents::path`.
    Map(FileMap),
}

/// One executable file mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileMap {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start`.
    pub offset: u64,
    /// Device (major, minor) and inode of the mapped file, as the kernel has them.
    pub major: u32,
    pub minor: u32,
    pub ino: u64,
    /// Where the path (NUL included) lies in the batch's path bytes.
    path_at: u32,
    path_len: u32,
}

impl FileMap {
    /// The device as `st_dev` encodes it.
    pub fn dev(&self) -> u64 {
        libc::makedev(self.major, self.minor)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MappingEvent {
    /// CLOCK_MONOTONIC ns.
    pub time_ns: u64,
    /// Process (thread-group) id.
    pub pid: u32,
    pub kind: MappingEventKind,
}

/// The records of one read, reused from read to read (no allocation once
/// the buffers have grown to a read's size).
#[derive(Default)]
pub struct MappingBatch {
    pub events: Vec<MappingEvent>,
    /// Paths of the `Map` events, NUL-terminated, back to back.
    paths: Vec<u8>,
    /// Records the kernel could not write (full ring) during this batch.
    pub lost: u64,
    /// Records that did not parse.
    pub malformed: u64,
}

impl MappingBatch {
    pub fn clear(&mut self) {
        self.events.clear();
        self.paths.clear();
        self.lost = 0;
        self.malformed = 0;
    }

    /// The path of `m` without its NUL (bytes: any byte may be in a path).
    pub fn path(&self, m: &FileMap) -> &[u8] {
        let at = m.path_at as usize;
        &self.paths[at..at + m.path_len as usize - 1]
    }

    /// The path of `m` with its NUL, for system calls.
    pub fn c_path(&self, m: &FileMap) -> &std::ffi::CStr {
        let at = m.path_at as usize;
        std::ffi::CStr::from_bytes_with_nul(&self.paths[at..at + m.path_len as usize]).unwrap_or_default()
    }

    /// Adds one executable mapping of the file at `path` (no NUL in it).
    pub fn push_map(
        &mut self,
        time_ns: u64,
        pid: u32,
        range: std::ops::Range<u64>,
        offset: u64,
        ((major, minor), ino): ((u32, u32), u64),
        path: &[u8],
    ) {
        let path_at = self.paths.len() as u32;
        self.paths.extend_from_slice(path);
        self.paths.push(0);
        self.events.push(MappingEvent {
            time_ns,
            pid,
            kind: MappingEventKind::Map(FileMap {
                start: range.start,
                end: range.end,
                offset,
                major,
                minor,
                ino,
                path_at,
                path_len: path.len() as u32 + 1,
            }),
        });
    }

    /// Parses one record (`rec`: header included). Public for tests.
    pub fn push_record(&mut self, rec: &[u8]) {
        let u32_at = |o: usize| rec.get(o..o + 4).map(|b| u32::from_ne_bytes(b.try_into().unwrap()));
        let u64_at = |o: usize| rec.get(o..o + 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap()));
        let (Some(kind), Some(misc)) = (u32_at(0), rec.get(4..6).map(|b| u16::from_ne_bytes([b[0], b[1]]))) else {
            self.malformed += 1;
            return;
        };
        // sample_id_all with TID | TIME: the record ends with pid, tid, time.
        let time = rec.len().checked_sub(8).and_then(u64_at);
        match kind {
            PERF_RECORD_LOST => self.lost += u64_at(16).unwrap_or(0),
            PERF_RECORD_COMM if misc & PERF_RECORD_MISC_COMM_EXEC != 0 => match (u32_at(8), time) {
                (Some(pid), Some(time_ns)) => {
                    self.events.push(MappingEvent { time_ns, pid, kind: MappingEventKind::Exec })
                }
                _ => self.malformed += 1,
            },
            PERF_RECORD_MMAP2 => {
                // pid, tid, addr, len, pgoff, maj, min, ino, ino_generation,
                // prot, flags, filename[], sample_id (16 bytes).
                const FILENAME: usize = 8 + 8 + 24 + 8 + 8 + 8 + 8;
                let fields = (u32_at(8), u64_at(16), u64_at(24), u64_at(32), u32_at(40), u32_at(44), u64_at(48), time);
                let (
                    Some(pid),
                    Some(addr),
                    Some(len),
                    Some(offset),
                    Some(major),
                    Some(minor),
                    Some(ino),
                    Some(time_ns),
                ) = fields
                else {
                    self.malformed += 1;
                    return;
                };
                if misc & PERF_RECORD_MISC_MMAP_BUILD_ID != 0 {
                    return; // never asked for: no device and inode in it
                }
                let name = rec.get(FILENAME..rec.len().saturating_sub(16)).unwrap_or_default();
                let Some(nul) = name.iter().position(|&b| b == 0) else {
                    self.malformed += 1;
                    return;
                };
                if name.first() != Some(&b'/') || ino == 0 {
                    return; // anonymous executable memory, [vdso], ...
                }
                self.push_map(
                    time_ns,
                    pid,
                    addr..addr.saturating_add(len),
                    offset,
                    ((major, minor), ino),
                    &name[..nul],
                );
            }
            _ => {} // a COMM that is not an exec (a thread renamed)
        }
    }
}

/// One CPU's event and its mapped ring.
struct CpuRing {
    cpu: u32,
    fd: OwnedFd,
    base: *mut u8,
}

impl CpuRing {
    fn open(cpu: u32) -> std::io::Result<Self> {
        let attr = PerfEventAttr {
            type_: PERF_TYPE_SOFTWARE,
            size: std::mem::size_of::<PerfEventAttr>() as u32,
            config: PERF_COUNT_SW_DUMMY,
            sample_type: PERF_SAMPLE_TID | PERF_SAMPLE_TIME,
            // `mmap` too: the kernel counts mmap listeners by it (with
            // `mmap2` set, the records are MMAP2).
            flags: ATTR_MMAP
                | ATTR_MMAP2
                | ATTR_COMM
                | ATTR_COMM_EXEC
                | ATTR_SAMPLE_ID_ALL
                | ATTR_USE_CLOCKID
                | ATTR_WATERMARK,
            // Wake the reader when half the ring is used.
            wakeup_watermark: (RING_BYTES / 2) as u32,
            clockid: libc::CLOCK_MONOTONIC,
            ..Default::default()
        };
        // SAFETY: attr is a valid perf_event_attr of the size it states.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &attr as *const PerfEventAttr,
                -1 as libc::pid_t,
                cpu as libc::c_int,
                -1 as libc::c_int,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by the kernel and is ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        // SAFETY: mapping a perf event fd; the kernel checks the size
        // (one header page + a power of two of pages).
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page_size() + RING_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(CpuRing { cpu, fd, base: base.cast() })
    }

    /// Appends every record in the ring to `batch` and frees the ring.
    fn read(&mut self, batch: &mut MappingBatch, scratch: &mut Vec<u8>) {
        use std::sync::atomic::{AtomicU64, Ordering};
        // SAFETY: DATA_HEAD and DATA_TAIL are 8-byte aligned u64 fields of
        // the mapped header page, shared with the kernel.
        let (head, tail) = unsafe {
            (&*(self.base.add(DATA_HEAD) as *const AtomicU64), &*(self.base.add(DATA_TAIL) as *const AtomicU64))
        };
        let end = head.load(Ordering::Acquire);
        let mut at = tail.load(Ordering::Relaxed);
        // SAFETY: the data area follows the header page, RING_BYTES long.
        let data = unsafe { std::slice::from_raw_parts(self.base.add(page_size()), RING_BYTES) };
        while at < end {
            let off = (at % RING_BYTES as u64) as usize;
            let mut header = [0u8; 8];
            copy_wrapped(data, off, &mut header);
            let size = u16::from_ne_bytes([header[6], header[7]]) as usize;
            if size < 8 || at + size as u64 > end {
                batch.malformed += 1;
                break; // never expected: the kernel writes whole records
            }
            scratch.clear();
            scratch.resize(size, 0);
            copy_wrapped(data, off, scratch);
            batch.push_record(scratch);
            at += size as u64;
        }
        tail.store(end, Ordering::Release);
    }
}

impl Drop for CpuRing {
    fn drop(&mut self) {
        // SAFETY: base was mapped with this length in `open`.
        unsafe { libc::munmap(self.base.cast(), page_size() + RING_BYTES) };
    }
}

// SAFETY: the mapping is owned by the ring and only used through &mut self.
unsafe impl Send for CpuRing {}

fn copy_wrapped(data: &[u8], off: usize, out: &mut [u8]) {
    let first = out.len().min(data.len() - off);
    out[..first].copy_from_slice(&data[off..off + first]);
    let rest = out.len() - first;
    out[first..].copy_from_slice(&data[..rest]);
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// The per-CPU side-band events of the online CPUs.
pub struct MappingEvents {
    rings: Vec<CpuRing>,
    scratch: Vec<u8>,
}

impl MappingEvents {
    /// Opens one ring per CPU in `cpus`; fails when the first cannot be
    /// opened (the error says why), skips later ones that fail (logged).
    pub fn open(cpus: &[u32]) -> std::io::Result<Self> {
        let mut me = MappingEvents { rings: Vec::new(), scratch: Vec::new() };
        for &cpu in cpus {
            match CpuRing::open(cpu) {
                Ok(r) => me.rings.push(r),
                Err(e) if me.rings.is_empty() => return Err(e),
                Err(e) => tracing::warn!(cpu, "ebpf receiver: no mapping events on this CPU: {e}"),
            }
        }
        Ok(me)
    }

    /// Follows the sampled CPUs: opens rings for `cpus` not covered yet,
    /// closes the others, and reopens `revived` (their events died with an
    /// offline/online cycle). Returns whether a ring was (re)opened: records
    /// may have been missed meanwhile.
    pub fn sync(&mut self, cpus: &[u32], revived: &[u32]) -> bool {
        self.rings.retain(|r| cpus.contains(&r.cpu) && !revived.contains(&r.cpu));
        let mut opened = false;
        for &cpu in cpus {
            if self.rings.iter().all(|r| r.cpu != cpu) {
                match CpuRing::open(cpu) {
                    Ok(r) => {
                        self.rings.push(r);
                        opened = true;
                    }
                    Err(e) => tracing::debug!(cpu, "ebpf receiver: no mapping events on this CPU: {e}"),
                }
            }
        }
        opened
    }

    /// Appends the records of every ring to `batch`, in time order.
    pub fn read(&mut self, batch: &mut MappingBatch) {
        for r in &mut self.rings {
            r.read(batch, &mut self.scratch);
        }
        // Each ring is in time order; across CPUs they interleave. (Unstable:
        // no buffer; two records of one CPU never share a nanosecond.)
        batch.events.sort_unstable_by_key(|e| e.time_ns);
    }

    /// The ring fds, to wait on (readable when half full).
    pub fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.rings.iter().map(|r| r.fd.as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u32, misc: u16, body: &[u8], time: u64) -> Vec<u8> {
        let size = 8 + body.len() + 16;
        let mut r = Vec::new();
        r.extend_from_slice(&kind.to_ne_bytes());
        r.extend_from_slice(&misc.to_ne_bytes());
        r.extend_from_slice(&(size as u16).to_ne_bytes());
        r.extend_from_slice(body);
        r.extend_from_slice(&[0; 8]); // sample_id pid, tid
        r.extend_from_slice(&time.to_ne_bytes());
        r
    }

    fn mmap2(pid: u32, path: &str, ino: u64) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&pid.to_ne_bytes());
        b.extend_from_slice(&pid.to_ne_bytes());
        for v in [0x1000u64, 0x2000, 0x3000] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(&8u32.to_ne_bytes());
        b.extend_from_slice(&1u32.to_ne_bytes());
        b.extend_from_slice(&ino.to_ne_bytes());
        b.extend_from_slice(&0u64.to_ne_bytes());
        b.extend_from_slice(&[0; 8]); // prot, flags
        b.extend_from_slice(path.as_bytes());
        b.push(0);
        while b.len() % 8 != 0 {
            b.push(0);
        }
        b
    }

    #[test]
    fn records_parse_into_events_with_paths() {
        let mut batch = MappingBatch::default();
        let mut comm = 7u32.to_ne_bytes().to_vec();
        comm.extend_from_slice(&7u32.to_ne_bytes());
        comm.extend_from_slice(b"big\0\0\0\0\0");
        batch.push_record(&record(PERF_RECORD_COMM, PERF_RECORD_MISC_COMM_EXEC, &comm, 10));
        batch.push_record(&record(PERF_RECORD_COMM, 0, &comm, 11)); // a rename, not an exec
        batch.push_record(&record(PERF_RECORD_MMAP2, 0, &mmap2(7, "/usr/bin/big", 42), 12));
        batch.push_record(&record(PERF_RECORD_MMAP2, 0, &mmap2(7, "//anon", 0), 13));
        let mut lost = 0u64.to_ne_bytes().to_vec();
        lost.extend_from_slice(&5u64.to_ne_bytes());
        batch.push_record(&record(PERF_RECORD_LOST, 0, &lost, 14));
        batch.push_record(&[1, 2, 3]);
        assert_eq!(batch.events.len(), 2, "{:?}", batch.events);
        assert_eq!(batch.events[0], MappingEvent { time_ns: 10, pid: 7, kind: MappingEventKind::Exec });
        let MappingEventKind::Map(m) = batch.events[1].kind else { panic!("a mapping") };
        assert_eq!((batch.events[1].time_ns, m.start, m.end, m.offset, m.ino), (12, 0x1000, 0x3000, 0x3000, 42));
        assert_eq!(m.dev(), libc::makedev(8, 1));
        assert_eq!(batch.path(&m), b"/usr/bin/big");
        assert_eq!(batch.c_path(&m).to_bytes(), b"/usr/bin/big");
        assert_eq!((batch.lost, batch.malformed), (5, 1));
    }

    #[test]
    fn wrapped_records_are_copied_whole() {
        let data: Vec<u8> = (0..16).collect();
        let mut out = [0u8; 6];
        copy_wrapped(&data, 13, &mut out);
        assert_eq!(out, [13, 14, 15, 0, 1, 2]);
    }
}
