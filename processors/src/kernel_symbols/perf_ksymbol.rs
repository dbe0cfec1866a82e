//! PERF_RECORD_KSYMBOL / PERF_RECORD_BPF_EVENT listener: one dummy software
//! perf event per CPU with `ksymbol` and `bpf_event` set, read from its mmap
//! ring. The kernel emits these records on the CPU where a BPF program is
//! loaded or freed, stamped (with `use_clockid`) in CLOCK_MONOTONIC, the
//! clock of `bpf_ktime_get_ns()` that stamps samples, and turned into unix
//! nanoseconds with the same once-measured offset
//! ([`profcol_ebpf::clock::KtimeToUnix::process`]). One task drains every
//! ring and merges the records by timestamp ([`super::ordering`]) before
//! they are applied.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::addr_of_mut;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use profcol_ebpf::clock::KtimeToUnix;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use profcol_ebpf::sys::{
    self, perf_event_attr, perf_event_header, perf_event_mmap_page, perf_event_sample_format, perf_event_type,
    perf_sw_ids, perf_type_id, BpfEventRecord, KsymbolRecord,
};

use super::bpf_progress::BpfProgress;
use super::bpf_progs::BpfFunc;
use super::error::{Error, Result};
use super::ordering::{Reorder, SLACK_NS};
use super::reload::Trigger;
use super::store::{BpfEvent, MAX_BPF_BACKLOG};

const PERF_RECORD_LOST: u32 = perf_event_type::PERF_RECORD_LOST as u32;
const PERF_RECORD_KSYMBOL: u32 = perf_event_type::PERF_RECORD_KSYMBOL as u32;
const PERF_RECORD_BPF_EVENT: u32 = perf_event_type::PERF_RECORD_BPF_EVENT as u32;
/// Least time between two batches sent to the store.
const BATCH_PERIOD: Duration = Duration::from_millis(10);
/// Data pages per ring (power of two); records are rare and small.
const DATA_PAGES: usize = 8;

/// One CPU's event and its mapped ring.
pub struct Ring {
    fd: OwnedFd,
    base: *mut u8,
    map_len: usize,
    page: usize,
    /// Whether records carry a CLOCK_MONOTONIC timestamp.
    timed: bool,
    scratch: Vec<u8>,
}

// SAFETY: the mapping is owned by this value and only touched through &mut self.
unsafe impl Send for Ring {}
// SAFETY: through &self only the fd and the ring's atomic head/tail are read.
unsafe impl Sync for Ring {}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: base/map_len come from a successful mmap owned by self.
        unsafe { libc::munmap(self.base.cast(), self.map_len) };
    }
}

impl AsRawFd for Ring {
    fn as_raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

fn open_event(cpu: u32, timed: bool) -> io::Result<OwnedFd> {
    let mut attr = sys::zeroed::<perf_event_attr>();
    attr.type_ = perf_type_id::PERF_TYPE_SOFTWARE as u32;
    attr.config = perf_sw_ids::PERF_COUNT_SW_DUMMY as u64;
    attr.set_watermark(1);
    attr.__bindgen_anon_2.wakeup_watermark = 1; // wake on every record
    attr.set_ksymbol(1);
    attr.set_bpf_event(1);
    if timed {
        attr.sample_type = perf_event_sample_format::PERF_SAMPLE_TIME as u64;
        attr.set_sample_id_all(1);
        attr.set_use_clockid(1);
        attr.clockid = libc::CLOCK_MONOTONIC;
    }
    sys::perf_event_open(&attr, -1, cpu as i32, None, 0)
}

impl Ring {
    pub fn open(cpu: u32) -> Result<Ring> {
        // CLOCK_MONOTONIC timestamps where the kernel allows them.
        let (fd, timed) = match open_event(cpu, true) {
            Ok(fd) => (fd, true),
            Err(_) => (open_event(cpu, false).map_err(|source| Error::PerfOpen { cpu, source })?, false),
        };
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let map_len = page * (1 + DATA_PAGES);
        // SAFETY: mapping a perf fd read-write as the perf ABI requires.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::PerfOpen { cpu, source: io::Error::last_os_error() });
        }
        let nb = 1i32;
        // SAFETY: FIONBIO with a valid int pointer.
        unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONBIO, &nb) };
        Ok(Ring { fd, base: base.cast(), map_len, page, timed, scratch: Vec::new() })
    }

    /// The ring's `data_head` (written by the kernel) and `data_tail`
    /// (written by us) in the shared `perf_event_mmap_page`.
    fn head_tail(&self) -> (&AtomicU64, &AtomicU64) {
        let page = self.base.cast::<perf_event_mmap_page>();
        // SAFETY: the first mapped page is the kernel's perf_event_mmap_page,
        // alive as long as self; data_head and data_tail are aligned u64s
        // shared with the kernel, so they are only accessed atomically.
        unsafe {
            (AtomicU64::from_ptr(addr_of_mut!((*page).data_head)), AtomicU64::from_ptr(addr_of_mut!((*page).data_tail)))
        }
    }

    /// Hands every complete record to `f` and frees its ring space.
    pub fn drain(&mut self, mut f: impl FnMut(&[u8], bool)) {
        let (head, tail_at) = self.head_tail();
        let head = head.load(Ordering::Acquire);
        let mut tail = tail_at.load(Ordering::Relaxed);
        let size = (self.map_len - self.page) as u64;
        // SAFETY: the data area starts one page in and is `size` bytes.
        let data = unsafe { std::slice::from_raw_parts(self.base.add(self.page), size as usize) };
        const HEADER: u64 = size_of::<perf_event_header>() as u64;
        // Records may wrap around the ring's end: copy byte by byte modulo size.
        let copy = |out: &mut Vec<u8>, at: usize, len: usize| {
            out.clear();
            out.extend((0..len).map(|i| data[(at + i) % size as usize]));
        };
        while tail + HEADER <= head {
            let at = (tail % size) as usize;
            copy(&mut self.scratch, at, HEADER as usize);
            let Some(header) = sys::read::<perf_event_header>(&self.scratch) else { break };
            let len = u64::from(header.size);
            if len < HEADER || tail + len > head {
                break;
            }
            copy(&mut self.scratch, at, len as usize);
            f(&self.scratch, self.timed);
            tail += len;
        }
        self.head_tail().1.store(tail, Ordering::Release);
    }
}

/// What one record says.
#[derive(Debug)]
pub enum Record {
    /// A BPF symbol record and its time: CLOCK_MONOTONIC ns when `timed`.
    Bpf {
        ktime_ns: Option<u64>,
        event: BpfEvent,
    },
    Lost,
}

/// Reads one record; `None` for records of no interest or malformed ones.
pub(crate) fn parse_record(rec: &[u8], timed: bool) -> Option<Record> {
    let header = sys::read::<perf_event_header>(rec)?;
    // With sample_id_all and only PERF_SAMPLE_TIME, the time ends the record.
    let ktime_ns =
        if timed { Some(sys::read::<u64>(rec.get(rec.len().checked_sub(size_of::<u64>())?..)?)?) } else { None };
    let event = match header.type_ {
        PERF_RECORD_KSYMBOL => {
            let k = sys::read::<KsymbolRecord>(rec)?;
            let name_bytes = rec.get(size_of::<KsymbolRecord>()..)?;
            let end = name_bytes.iter().position(|&b| b == 0)?;
            let name = std::str::from_utf8(&name_bytes[..end]).ok()?;
            if k.flags & sys::PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER != 0 {
                BpfEvent::Unregister { start: k.addr, name: name.into() }
            } else {
                BpfEvent::Register(BpfFunc {
                    start: k.addr,
                    len: k.len,
                    prog_id: 0,
                    name: name.into(),
                    func: None,
                    lines: Arc::from([]),
                })
            }
        }
        PERF_RECORD_BPF_EVENT => {
            let e = sys::read::<BpfEventRecord>(rec)?;
            if e.type_ != sys::PERF_BPF_EVENT_PROG_LOAD {
                return None;
            }
            BpfEvent::ProgLoad { id: e.id }
        }
        PERF_RECORD_LOST => return Some(Record::Lost),
        _ => return None,
    };
    Some(Record::Bpf { ktime_ns, event })
}

/// Online CPUs, from /sys/devices/system/cpu/online ("0-3,6").
pub fn online_cpus() -> Vec<u32> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
            out.extend(a..=b);
        }
    }
    if out.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        out.extend(0..n);
    }
    out
}

/// Where the listener reports to: the reload task's channel, and the
/// store's backlog counters that keep that channel bounded.
pub struct Sink {
    pub tx: UnboundedSender<Trigger>,
    pub backlog: Arc<AtomicUsize>,
    pub dropped: Arc<AtomicU64>,
    /// Where the listener says how far its reports are complete.
    pub progress: Arc<BpfProgress>,
}

impl Sink {
    /// Reports to `store`'s reload task through `tx`.
    pub fn new(tx: UnboundedSender<Trigger>, store: &super::store::Store) -> Self {
        Sink {
            tx,
            backlog: store.counters.bpf_backlog.clone(),
            dropped: store.counters.bpf_records_dropped.clone(),
            progress: store.bpf_progress.clone(),
        }
    }
}

/// Opens a ring per online CPU and forwards merged records until the channel closes.
pub fn spawn(sink: Sink) -> Result<Vec<JoinHandle<()>>> {
    let mut rings = Vec::new();
    for cpu in online_cpus() {
        let ring = Ring::open(cpu)?;
        // SAFETY: the Ring owns its fd and returns the same one for its lifetime.
        let afd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| Error::PerfOpen { cpu, source: io::Error::other(e.to_string()) })?;
        rings.push(afd);
    }
    sink.progress.set_listening(true);
    Ok(vec![tokio::spawn(run_rings(rings, sink))])
}

#[derive(Debug, PartialEq, Eq)]
enum Admit {
    Send,
    /// Drop the batch; `rescan`: ask for one (once per overflow).
    Drop {
        rescan: bool,
    },
}

/// Whether `n` more records fit the store's backlog. The store is behind
/// (a starved host) when they do not: the batch is dropped rather than
/// queued without bound, and the live set is enumerated again once the
/// store has caught up with what was queued before.
fn admit(backlog: &AtomicUsize, overflowed: &mut bool, n: usize) -> Admit {
    let queued = backlog.load(Relaxed);
    if queued + n > MAX_BPF_BACKLOG {
        let rescan = !*overflowed;
        *overflowed = true;
        return Admit::Drop { rescan };
    }
    *overflowed &= queued > MAX_BPF_BACKLOG / 2;
    backlog.fetch_add(n, Relaxed);
    Admit::Send
}

/// Waits for any ring, drains them all, and sends on the records the
/// watermark has passed, in time order (see [`super::ordering`]).
async fn run_rings(mut rings: Vec<AsyncFd<Ring>>, sink: Sink) {
    let Sink { tx, backlog, dropped, progress } = sink;
    // Batches waiting on this listener stop waiting once it is gone.
    struct Stopped(Arc<BpfProgress>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            self.0.set_listening(false);
        }
    }
    let _stopped = Stopped(progress.clone());
    // Unix ns up to which the reports sent so far are complete.
    let mut sent_to = 0;
    // A rescan was asked for because records were dropped, and not yet done.
    let mut overflowed = false;
    let clock = KtimeToUnix::process();
    let mut held: Reorder<BpfEvent> = Reorder::default();
    let mut ready = Vec::new();
    loop {
        // Held records, or a batch waiting for a time not reported yet,
        // need the watermark to move: come back soon. Otherwise sleep until
        // a ring has a record, a batch starts waiting, or the store is
        // gone: an idle listener costs no wake-up.
        {
            let behind = progress.wanted_to() > sent_to;
            let any = futures::future::select_all(rings.iter().map(|r| Box::pin(r.readable())));
            let woke = if held.is_empty() && !behind {
                tokio::select! {
                    r = any => Some(r),
                    _ = progress.poked() => None,
                    _ = tx.closed() => return,
                }
            } else {
                tokio::select! {
                    r = tokio::time::timeout(Duration::from_nanos(SLACK_NS), any) => r.ok(),
                    _ = progress.poked() => None,
                }
            };
            if let Some((Ok(mut guard), _, _)) = woke {
                guard.clear_ready();
            }
        }
        // Everything stamped at or before the watermark is in the rings now.
        let now = profcol_ebpf::clock::now_ns(libc::CLOCK_MONOTONIC);
        let watermark = now.saturating_sub(SLACK_NS);
        let mut lost = false;
        for ring in &mut rings {
            // An untimed record (old kernel) is placed when it was drained.
            ring.get_mut().drain(|rec, timed| match parse_record(rec, timed) {
                Some(Record::Bpf { ktime_ns, event }) => held.push(ktime_ns.unwrap_or(now), event),
                Some(Record::Lost) => lost = true,
                None => {}
            });
        }
        held.ready(watermark, &mut ready);
        let mut closed = false;
        let sent = !ready.is_empty();
        let complete_to = clock.to_unix_ns(watermark);
        if sent {
            match admit(&backlog, &mut overflowed, ready.len()) {
                Admit::Drop { rescan } => {
                    dropped.fetch_add(ready.len() as u64, Relaxed);
                    ready.clear();
                    lost |= rescan;
                }
                Admit::Send => {
                    let events = ready.drain(..).map(|(t, e)| (clock.to_unix_ns(t), e)).collect();
                    closed |= tx.send(Trigger::Bpf { events, complete_to }).is_err();
                    sent_to = complete_to;
                }
            }
        } else if progress.wanted_to() > sent_to && complete_to > sent_to {
            // Nothing new, but a batch waits to know that.
            closed |= tx.send(Trigger::Bpf { events: Vec::new(), complete_to }).is_err();
            sent_to = complete_to;
        }
        if lost {
            closed |= tx.send(Trigger::Lost).is_err();
        }
        if closed || tx.is_closed() {
            return;
        }
        if sent {
            // Gather for a moment: under churn one batch per period, not
            // one per record.
            tokio::time::sleep(BATCH_PERIOD).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backlog_is_bounded_and_one_rescan_follows_an_overflow() {
        let backlog = AtomicUsize::new(0);
        let mut overflowed = false;
        assert_eq!(admit(&backlog, &mut overflowed, MAX_BPF_BACKLOG - 10), Admit::Send);
        assert_eq!(admit(&backlog, &mut overflowed, 11), Admit::Drop { rescan: true });
        assert_eq!(admit(&backlog, &mut overflowed, 11), Admit::Drop { rescan: false });
        assert_eq!(backlog.load(Relaxed), MAX_BPF_BACKLOG - 10);
        // The store applied most of it: records flow again, and a later
        // overflow asks for another rescan.
        backlog.store(10, Relaxed);
        assert_eq!(admit(&backlog, &mut overflowed, 5), Admit::Send);
        assert!(!overflowed);
        backlog.store(MAX_BPF_BACKLOG, Relaxed);
        assert_eq!(admit(&backlog, &mut overflowed, 1), Admit::Drop { rescan: true });
    }

    /// `body` as the kernel lays it out, then `tail` (name, sample_id).
    fn record<T: Copy>(body: T, tail: &[u8]) -> Vec<u8> {
        // SAFETY: the record structs are #[repr(C)] integers with no padding
        // (their sizes are checked against the uapi in profcol_ebpf::sys).
        let head = unsafe { std::slice::from_raw_parts((&body as *const T).cast::<u8>(), size_of::<T>()) };
        [head, tail].concat()
    }

    fn header(type_: u32, size: usize) -> perf_event_header {
        perf_event_header { type_, misc: 0, size: size as u16 }
    }

    #[test]
    fn parses_ksymbol_and_bpf_event_records_by_their_structs() {
        let ts = 1_700_000_000_123_456_789u64;
        let mut tail = b"bpf_prog_0123456789abcdef_f\0\0\0\0\0".to_vec();
        tail.extend_from_slice(&ts.to_ne_bytes());
        let size = size_of::<KsymbolRecord>() + tail.len();
        let k = KsymbolRecord {
            header: header(PERF_RECORD_KSYMBOL, size),
            addr: 0xffff_ffff_c000_1000,
            len: 96,
            ksym_type: 1,
            flags: 0,
        };
        match parse_record(&record(k, &tail), true) {
            Some(Record::Bpf { ktime_ns, event: BpfEvent::Register(func) }) => {
                assert_eq!((ktime_ns, func.start, func.len), (Some(ts), 0xffff_ffff_c000_1000, 96));
                assert_eq!(&*func.name, "bpf_prog_0123456789abcdef_f");
            }
            other => panic!("{other:?}"),
        }
        let gone = KsymbolRecord { flags: sys::PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER, ..k };
        match parse_record(&record(gone, &tail), true) {
            Some(Record::Bpf { ktime_ns, event: BpfEvent::Unregister { start, name } }) => {
                assert_eq!((ktime_ns, start, &*name), (Some(ts), 0xffff_ffff_c000_1000, "bpf_prog_0123456789abcdef_f"));
            }
            other => panic!("{other:?}"),
        }

        let e = BpfEventRecord {
            header: header(PERF_RECORD_BPF_EVENT, size_of::<BpfEventRecord>() + 8),
            type_: sys::PERF_BPF_EVENT_PROG_LOAD,
            flags: 0,
            id: 4242,
            tag: [7; 8],
        };
        let load = record(e, &ts.to_ne_bytes());
        assert!(matches!(
            parse_record(&load, true),
            Some(Record::Bpf { ktime_ns: Some(t), event: BpfEvent::ProgLoad { id: 4242 } }) if t == ts
        ));
        let unload = record(BpfEventRecord { type_: 2, ..e }, &ts.to_ne_bytes());
        assert!(parse_record(&unload, true).is_none());

        // Truncated records are refused, never read past their end.
        let full = record(k, &tail);
        for n in 0..size_of::<KsymbolRecord>() {
            assert!(parse_record(&full[..n], false).is_none(), "{n} bytes");
        }
    }
}
