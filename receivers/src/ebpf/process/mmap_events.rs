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

use profcol_ebpf::sys::{
    self, perf_event_attr, perf_event_sample_format, perf_event_type, perf_sw_ids, perf_type_id, CommRecord,
    LostRecord, Mmap2Record, PerfRing, SampleIdTidTime, PERF_RECORD_MISC_COMM_EXEC, PERF_RECORD_MISC_MMAP_BUILD_ID,
};
use std::mem::size_of;
use std::os::fd::{AsRawFd, RawFd};

/// Bytes of one CPU's ring (a power of two; one more page holds the header).
pub(crate) const RING_BYTES: usize = 64 * 1024;

const PERF_RECORD_LOST: u32 = perf_event_type::PERF_RECORD_LOST as u32;
const PERF_RECORD_COMM: u32 = perf_event_type::PERF_RECORD_COMM as u32;
const PERF_RECORD_MMAP2: u32 = perf_event_type::PERF_RECORD_MMAP2 as u32;

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
    pub(crate) fn c_path(&self, m: &FileMap) -> &std::ffi::CStr {
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
    pub(crate) fn push_record(&mut self, rec: &[u8]) {
        let Some(header) = sys::read::<sys::perf_event_header>(rec) else {
            self.malformed += 1;
            return;
        };
        // sample_id_all with TID | TIME: the record ends with pid, tid, time.
        let time = sys::read_tail::<SampleIdTidTime>(rec).map(|id| id.time);
        match header.type_ {
            PERF_RECORD_LOST => self.lost += sys::read::<LostRecord>(rec).map_or(0, |l| l.lost),
            PERF_RECORD_COMM if header.misc & PERF_RECORD_MISC_COMM_EXEC != 0 => {
                match (sys::read::<CommRecord>(rec), time) {
                    (Some(c), Some(time_ns)) => {
                        self.events.push(MappingEvent { time_ns, pid: c.pid, kind: MappingEventKind::Exec })
                    }
                    _ => self.malformed += 1,
                }
            }
            PERF_RECORD_MMAP2 => self.push_mmap2(rec, header.misc, time),
            _ => {} // a COMM that is not an exec (a thread renamed)
        }
    }

    /// A `PERF_RECORD_MMAP2` of a file (`time`: its sample_id's).
    fn push_mmap2(&mut self, rec: &[u8], misc: u16, time: Option<u64>) {
        let (Some(m), Some(time_ns)) = (sys::read::<Mmap2Record>(rec), time) else {
            self.malformed += 1;
            return;
        };
        if misc & PERF_RECORD_MISC_MMAP_BUILD_ID != 0 {
            return; // never asked for: no device and inode in it
        }
        let name = rec.get(size_of::<Mmap2Record>()..rec.len().saturating_sub(size_of::<SampleIdTidTime>()));
        let name = name.unwrap_or_default();
        let Some(nul) = name.iter().position(|&b| b == 0) else {
            self.malformed += 1;
            return;
        };
        if name.first() != Some(&b'/') || m.ino == 0 {
            return; // anonymous executable memory, [vdso], ...
        }
        let range = m.addr..m.addr.saturating_add(m.len);
        self.push_map(time_ns, m.pid, range, m.pgoff, ((m.maj, m.min), m.ino), &name[..nul]);
    }
}

/// One CPU's event and its mapped ring.
struct CpuEvent {
    cpu: u32,
    ring: PerfRing,
}

impl CpuEvent {
    fn open(cpu: u32) -> std::io::Result<Self> {
        let mut attr = sys::zeroed::<perf_event_attr>();
        attr.type_ = perf_type_id::PERF_TYPE_SOFTWARE as u32;
        attr.config = perf_sw_ids::PERF_COUNT_SW_DUMMY as u64;
        attr.sample_type =
            (perf_event_sample_format::PERF_SAMPLE_TID as u64) | (perf_event_sample_format::PERF_SAMPLE_TIME as u64);
        // `mmap` too: the kernel counts mmap listeners by it (with `mmap2`
        // set, the records are MMAP2).
        attr.set_mmap(1);
        attr.set_mmap2(1);
        attr.set_comm(1);
        attr.set_comm_exec(1);
        attr.set_sample_id_all(1);
        attr.set_use_clockid(1);
        attr.clockid = libc::CLOCK_MONOTONIC;
        // Wake the reader when half the ring is used.
        attr.set_watermark(1);
        attr.__bindgen_anon_2.wakeup_watermark = (RING_BYTES / 2) as u32;
        Ok(CpuEvent { cpu, ring: PerfRing::open(&attr, cpu, RING_BYTES)? })
    }

    /// Appends every record in the ring to `batch` and frees the ring.
    fn read(&mut self, batch: &mut MappingBatch) {
        if !self.ring.drain(|rec| batch.push_record(rec)) {
            batch.malformed += 1;
        }
    }
}

/// The per-CPU side-band events of the online CPUs.
pub struct MappingEvents {
    rings: Vec<CpuEvent>,
}

impl MappingEvents {
    /// Opens one ring per CPU in `cpus`; fails when the first cannot be
    /// opened (the error says why), skips later ones that fail (logged).
    pub fn open(cpus: &[u32]) -> std::io::Result<Self> {
        let mut me = MappingEvents { rings: Vec::new() };
        for &cpu in cpus {
            match CpuEvent::open(cpu) {
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
                match CpuEvent::open(cpu) {
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
            r.read(batch);
        }
        // Each ring is in time order; across CPUs they interleave. (Unstable:
        // no buffer; two records of one CPU never share a nanosecond.)
        batch.events.sort_unstable_by_key(|e| e.time_ns);
    }

    /// The ring fds, to wait on (readable when half full).
    pub fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.rings.iter().map(|r| r.ring.as_raw_fd())
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
}
