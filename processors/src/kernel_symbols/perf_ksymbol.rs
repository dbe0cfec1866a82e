//! PERF_RECORD_KSYMBOL / PERF_RECORD_BPF_EVENT listener: one dummy software
//! perf event per CPU with `ksymbol` and `bpf_event` set, read from its mmap
//! ring. The kernel emits these records on the CPU where a BPF program is
//! loaded or freed, stamped (with `use_clockid`) in CLOCK_REALTIME, so a
//! generation becomes live exactly when the program did.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use super::bpf_progs::BpfFunc;
use super::error::{Error, Result};
use super::generations::now_ns;
use super::reload::Trigger;

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
const PERF_COUNT_SW_DUMMY: u64 = 9;
const PERF_SAMPLE_TIME: u64 = 1 << 2;
const PERF_RECORD_LOST: u32 = 2;
const PERF_RECORD_KSYMBOL: u32 = 17;
const PERF_RECORD_BPF_EVENT: u32 = 18;
const KSYMBOL_FLAG_UNREGISTER: u16 = 1;
const BPF_EVENT_PROG_LOAD: u16 = 1;
/// Data pages per ring (power of two); records are rare and small.
const DATA_PAGES: usize = 8;

/// perf_event_attr bits used here (offset 40).
mod bits {
    pub const WATERMARK: u64 = 1 << 14;
    pub const SAMPLE_ID_ALL: u64 = 1 << 18;
    pub const USE_CLOCKID: u64 = 1 << 25;
    pub const KSYMBOL: u64 = 1 << 29;
    pub const BPF_EVENT: u64 = 1 << 30;
}

/// One CPU's event and its mapped ring.
pub struct Ring {
    fd: OwnedFd,
    base: *mut u8,
    map_len: usize,
    page: usize,
    /// Whether records carry a CLOCK_REALTIME timestamp.
    timed: bool,
    scratch: Vec<u8>,
}

// SAFETY: the mapping is owned by this value and only touched through &mut self.
unsafe impl Send for Ring {}

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

fn open_event(cpu: u32, realtime: bool) -> io::Result<OwnedFd> {
    let mut attr = [0u8; 128];
    let put32 = |a: &mut [u8; 128], o: usize, v: u32| a[o..o + 4].copy_from_slice(&v.to_ne_bytes());
    let put64 = |a: &mut [u8; 128], o: usize, v: u64| a[o..o + 8].copy_from_slice(&v.to_ne_bytes());
    put32(&mut attr, 0, PERF_TYPE_SOFTWARE);
    put32(&mut attr, 4, 128);
    put64(&mut attr, 8, PERF_COUNT_SW_DUMMY);
    let mut flags = bits::WATERMARK | bits::KSYMBOL | bits::BPF_EVENT;
    if realtime {
        put64(&mut attr, 24, PERF_SAMPLE_TIME);
        flags |= bits::SAMPLE_ID_ALL | bits::USE_CLOCKID;
        put32(&mut attr, 92, libc::CLOCK_REALTIME as u32);
    }
    put64(&mut attr, 40, flags);
    put32(&mut attr, 48, 1); // wakeup_watermark: wake on every record
                             // SAFETY: attr is a valid 128-byte perf_event_attr.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            -1 as libc::c_int,
            cpu as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

impl Ring {
    pub fn open(cpu: u32) -> Result<Ring> {
        // CLOCK_REALTIME timestamps where the kernel allows them.
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

    fn meta_u64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: offsets 1024..1056 of the first page hold aligned u64
        // fields of perf_event_mmap_page shared with the kernel.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    /// Hands every complete record to `f` and frees its ring space.
    pub fn drain(&mut self, mut f: impl FnMut(&[u8], bool)) {
        let head = self.meta_u64(1024).load(Ordering::Acquire);
        let mut tail = self.meta_u64(1032).load(Ordering::Relaxed);
        let size = (self.map_len - self.page) as u64;
        // SAFETY: the data area starts one page in and is `size` bytes.
        let data = unsafe { std::slice::from_raw_parts(self.base.add(self.page), size as usize) };
        while tail + 8 <= head {
            let at = (tail % size) as usize;
            let mut hdr = [0u8; 8];
            for (i, b) in hdr.iter_mut().enumerate() {
                *b = data[(at + i) % size as usize];
            }
            let len = u16::from_ne_bytes([hdr[6], hdr[7]]) as u64;
            if len < 8 || tail + len > head {
                break;
            }
            self.scratch.clear();
            for i in 0..len as usize {
                self.scratch.push(data[(at + i) % size as usize]);
            }
            f(&self.scratch, self.timed);
            tail += len;
        }
        self.meta_u64(1032).store(tail, Ordering::Release);
    }
}

/// Turns one record into a trigger.
pub fn parse_record(rec: &[u8], timed: bool) -> Option<Trigger> {
    let u16_at = |o: usize| rec.get(o..o + 2).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    let u32_at = |o: usize| rec.get(o..o + 4).map(|b| u32::from_ne_bytes(b.try_into().unwrap_or([0; 4])));
    let u64_at = |o: usize| rec.get(o..o + 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])));
    let kind = u32_at(0)?;
    // With sample_id_all and only PERF_SAMPLE_TIME, the time ends the record.
    let ts = if timed { u64_at(rec.len().checked_sub(8)?)? } else { now_ns() };
    match kind {
        PERF_RECORD_KSYMBOL => {
            let addr = u64_at(8)?;
            let len = u32_at(16)?;
            let flags = u16_at(22)?;
            let name_bytes = rec.get(24..)?;
            let end = name_bytes.iter().position(|&b| b == 0)?;
            let name = std::str::from_utf8(&name_bytes[..end]).ok()?;
            if flags & KSYMBOL_FLAG_UNREGISTER != 0 {
                Some(Trigger::KsymbolUnregister { ts_ns: ts, addr })
            } else {
                Some(Trigger::KsymbolRegister {
                    ts_ns: ts,
                    func: BpfFunc { start: addr, len, prog_id: 0, name: name.into(), func: None, lines: Arc::from([]) },
                })
            }
        }
        PERF_RECORD_BPF_EVENT => {
            (u16_at(8)? == BPF_EVENT_PROG_LOAD).then(|| Some(Trigger::BpfProgLoad { ts_ns: ts, id: u32_at(12)? }))?
        }
        PERF_RECORD_LOST => Some(Trigger::Lost),
        _ => None,
    }
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

/// Opens a ring per online CPU and forwards records until `tx` closes.
pub fn spawn(tx: UnboundedSender<Trigger>) -> Result<Vec<JoinHandle<()>>> {
    let mut rings = Vec::new();
    for cpu in online_cpus() {
        rings.push(Ring::open(cpu)?);
    }
    let mut tasks = Vec::new();
    for ring in rings {
        // SAFETY: the Ring owns its fd and returns the same one for its lifetime.
        let afd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| Error::PerfOpen { cpu: 0, source: io::Error::other(e.to_string()) })?;
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move { run_ring(afd, tx).await }));
    }
    Ok(tasks)
}

async fn run_ring(mut afd: AsyncFd<Ring>, tx: UnboundedSender<Trigger>) {
    loop {
        // Poll wakeups, with a slow tick in case one is missed.
        if let Ok(Ok(mut guard)) = tokio::time::timeout(Duration::from_millis(500), afd.readable_mut()).await {
            guard.clear_ready();
        }
        let mut closed = false;
        afd.get_mut().drain(|rec, timed| {
            if let Some(t) = parse_record(rec, timed) {
                closed |= tx.send(t).is_err();
            }
        });
        if closed || tx.is_closed() {
            return;
        }
    }
}
