//! profcol's eBPF programs: the built object bytes and the records shared
//! with the C code in `ebpf/bpf/`.
//!
//! The object is built by `ebpf/build.sh` (clang-16, `-target bpf -O2`, no
//! `-g`) and committed as `ebpf/obj/cpu_sample.bpf.o`, so building profcol
//! needs no clang. It has no `.BTF`/`.BTF.ext` sections and therefore no CO-RE
//! relocations: loading it never needs the kernel's BTF.
//!
//! Everything here mirrors `ebpf/bpf/cpu_sample.bpf.c`; change both together.
//! [`sys`] is the kernel ABI (bpf(2), perf_event_open(2) and their structs
//! from generated bindings) for the rest of profcol.

#![deny(unsafe_code)]

#[allow(unsafe_code)] // syscalls and the kernel's structs
pub mod sys;

/// 8-byte aligned wrapper so the ELF parser can read headers in place.
#[repr(C, align(8))]
struct Aligned<B: ?Sized> {
    bytes: B,
}

static CPU_SAMPLE_ALIGNED: &Aligned<[u8]> = &Aligned { bytes: *include_bytes!("../obj/cpu_sample.bpf.o") };

/// The built `cpu_sample.bpf.o` object (8-byte aligned).
pub fn cpu_sample_object() -> &'static [u8] {
    &CPU_SAMPLE_ALIGNED.bytes
}

/// Name of the `perf_event` program in the object.
pub const PROGRAM_NAME: &str = "profcol_cpu_sample";
/// The `BPF_MAP_TYPE_RINGBUF` that carries [`SampleHeader`] records.
pub const EVENTS_MAP: &str = "events";
/// `BPF_MAP_TYPE_PERCPU_ARRAY` of `u64` counters indexed by [`Stat`].
pub const STATS_MAP: &str = "stats";
/// `BPF_MAP_TYPE_HASH` of `u32` tgid -> `u8`, used when `pids` is set.
pub const PID_FILTER_MAP: &str = "pid_filter";
/// Capacity of [`PID_FILTER_MAP`].
pub const PID_FILTER_CAPACITY: usize = 1024;

/// `.rodata` globals set by the loader before the program is loaded.
pub mod globals {
    /// `u32`: frames per stack (kernel and user each), 1..=127.
    pub const MAX_STACK_DEPTH: &str = "cfg_max_stack_depth";
    /// `u32`: nonzero to skip samples of the idle task (tid 0).
    pub const EXCLUDE_IDLE: &str = "cfg_exclude_idle";
    /// `u32`: nonzero to keep only tgids present in the pid filter map.
    pub const FILTER_PIDS: &str = "cfg_filter_pids";
}

/// Largest stack the program copies (kernel.perf_event_max_stack default).
pub const MAX_STACK_DEPTH: usize = 127;
/// Length of `comm` in the record (TASK_COMM_LEN).
pub const TASK_COMM_LEN: usize = 16;

/// Counter slots of [`STATS_MAP`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Stat {
    /// Records written to the ring buffer.
    Samples = 0,
    /// Records dropped because the ring buffer was full.
    LostRingbuf = 1,
    /// `bpf_get_stack` for the kernel stack failed (record still sent).
    KernelStackError = 2,
    /// `bpf_get_stack` for the user stack failed (record still sent).
    UserStackError = 3,
    /// Samples of the idle task, skipped (`exclude_idle`).
    Idle = 4,
    /// Samples of processes not in `pids`, skipped.
    Filtered = 5,
    /// Per-CPU scratch lookup failed (not expected).
    NoScratch = 6,
}

impl Stat {
    /// All slots, in index order.
    pub const ALL: [Stat; 7] = [
        Stat::Samples,
        Stat::LostRingbuf,
        Stat::KernelStackError,
        Stat::UserStackError,
        Stat::Idle,
        Stat::Filtered,
        Stat::NoScratch,
    ];
    /// Number of slots in the map (`STAT_MAX` in C).
    pub const SLOTS: u32 = 8;
}

/// Fixed head of every ring buffer record (`struct sample` up to `ips`).
///
/// It is followed by `kstack_len` kernel frames then `ustack_len` user frames,
/// each a native-endian `u64` instruction pointer, leaf first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct SampleHeader {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds.
    pub ktime_ns: u64,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Logical CPU the sample was taken on.
    pub cpu: u32,
    /// Number of kernel frames.
    pub kstack_len: u16,
    /// Number of user frames.
    pub ustack_len: u16,
    /// Thread name, NUL padded.
    pub comm: [u8; TASK_COMM_LEN],
}

/// Size of [`SampleHeader`] in bytes (`offsetof(struct sample, ips)`).
pub const SAMPLE_HEADER_SIZE: usize = 40;
const _: () = assert!(std::mem::size_of::<SampleHeader>() == SAMPLE_HEADER_SIZE);

/// One decoded record, borrowing its frames from the ring buffer bytes.
#[derive(Clone, Copy, Debug)]
pub struct Sample<'a> {
    /// The fixed head.
    pub header: SampleHeader,
    frames: &'a [u8],
}

impl<'a> Sample<'a> {
    /// Decodes a record; `None` if it is shorter than its header says.
    pub fn parse(bytes: &'a [u8]) -> Option<Self> {
        let head = bytes.get(..SAMPLE_HEADER_SIZE)?;
        let u64_at = |o: usize| u64::from_ne_bytes(head[o..o + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |o: usize| u32::from_ne_bytes(head[o..o + 4].try_into().unwrap_or([0; 4]));
        let u16_at = |o: usize| u16::from_ne_bytes(head[o..o + 2].try_into().unwrap_or([0; 2]));
        let mut comm = [0u8; TASK_COMM_LEN];
        comm.copy_from_slice(&head[24..40]);
        let header = SampleHeader {
            ktime_ns: u64_at(0),
            pid: u32_at(8),
            tid: u32_at(12),
            cpu: u32_at(16),
            kstack_len: u16_at(20),
            ustack_len: u16_at(22),
            comm,
        };
        let n = header.kstack_len as usize + header.ustack_len as usize;
        if header.kstack_len as usize > MAX_STACK_DEPTH || header.ustack_len as usize > MAX_STACK_DEPTH {
            return None;
        }
        let frames = bytes.get(SAMPLE_HEADER_SIZE..SAMPLE_HEADER_SIZE + n * 8)?;
        Some(Sample { header, frames })
    }

    /// Kernel frames, leaf first.
    pub fn kernel_stack(&self) -> impl ExactSizeIterator<Item = u64> + 'a {
        let k = self.header.kstack_len as usize * 8;
        self.frames[..k].chunks_exact(8).map(read_u64)
    }

    /// User frames, leaf first.
    pub fn user_stack(&self) -> impl ExactSizeIterator<Item = u64> + 'a {
        let k = self.header.kstack_len as usize * 8;
        self.frames[k..].chunks_exact(8).map(read_u64)
    }

    /// Thread name up to the first NUL (lossy UTF-8).
    pub fn comm(&self) -> std::borrow::Cow<'_, str> {
        let c = &self.header.comm;
        let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
        String::from_utf8_lossy(&c[..end])
    }
}

fn read_u64(c: &[u8]) -> u64 {
    u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(k: &[u64], u: &[u64]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&123u64.to_ne_bytes());
        v.extend_from_slice(&7u32.to_ne_bytes());
        v.extend_from_slice(&8u32.to_ne_bytes());
        v.extend_from_slice(&1u32.to_ne_bytes());
        v.extend_from_slice(&(k.len() as u16).to_ne_bytes());
        v.extend_from_slice(&(u.len() as u16).to_ne_bytes());
        v.extend_from_slice(b"worker\0\0\0\0\0\0\0\0\0\0");
        for f in k.iter().chain(u) {
            v.extend_from_slice(&f.to_ne_bytes());
        }
        v
    }

    #[test]
    fn parses_record() {
        let r = record(&[0xffff_ffff_8100_0000, 2], &[0x401000]);
        let s = Sample::parse(&r).expect("parse");
        assert_eq!(s.header.pid, 7);
        assert_eq!(s.header.tid, 8);
        assert_eq!(s.header.cpu, 1);
        assert_eq!(s.comm(), "worker");
        assert_eq!(s.kernel_stack().collect::<Vec<_>>(), vec![0xffff_ffff_8100_0000, 2]);
        assert_eq!(s.user_stack().collect::<Vec<_>>(), vec![0x401000]);
    }

    #[test]
    fn rejects_truncated_and_oversized() {
        let r = record(&[1, 2], &[3]);
        assert!(Sample::parse(&r[..r.len() - 1]).is_none());
        assert!(Sample::parse(&r[..10]).is_none());
        let mut bad = record(&[], &[]);
        bad[20..22].copy_from_slice(&200u16.to_ne_bytes());
        assert!(Sample::parse(&bad).is_none());
    }

    #[test]
    fn object_has_no_btf_and_expected_symbols() {
        let obj = cpu_sample_object();
        assert_eq!(&obj[..4], b"\x7fELF");
        assert_eq!(obj.as_ptr() as usize % 8, 0);
        let has = |needle: &[u8]| obj.windows(needle.len()).any(|w| w == needle);
        // No BTF: no CO-RE relocations are possible, so no vmlinux BTF is needed.
        assert!(!has(b".BTF"), "object must not carry .BTF/.BTF.ext");
        for name in [
            PROGRAM_NAME,
            EVENTS_MAP,
            STATS_MAP,
            PID_FILTER_MAP,
            globals::MAX_STACK_DEPTH,
            globals::EXCLUDE_IDLE,
            globals::FILTER_PIDS,
        ] {
            assert!(has(name.as_bytes()), "{name} missing from object");
        }
    }
}
