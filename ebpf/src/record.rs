//! The records the BPF programs write, as the reader decodes them: the one
//! sample record of CPU samples and probe hits (`struct sample`), and the
//! process events of exec and exit (`struct proc_event`).
//!
//! Mirrors `ebpf/bpf/record.h`; change both together. Decoding is
//! bounds-checked: a short or inconsistent record is `None`, never a panic.

/// Largest stack the program copies (kernel.perf_event_max_stack default).
pub const MAX_STACK_DEPTH: usize = 127;
/// Length of `comm` in the records (TASK_COMM_LEN).
pub const TASK_COMM_LEN: usize = 16;
/// Interpreter frames a record carries at most (`PY_MAX_FRAMES`), two
/// words each after the native frames.
pub const MAX_INTERP_FRAMES: usize = 96;

/// What made a sample (`enum sample_kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SampleKind {
    /// An on-CPU sample of the cpu-clock perf event.
    Cpu,
    /// One call of a probed function; the index of the configured probe.
    Probe(u32),
    /// The first on-CPU sample of a stack counted in the kernel while its
    /// `key` stays in [`crate::COUNTS_MAP`]: later ones only add to the
    /// count in `slot` of [`crate::COUNT_SLOTS_MAP`], which includes this one.
    CpuCounted { key: u64, slot: u32 },
    /// A thread back on CPU after at least the off-CPU threshold: `ns` off
    /// CPU, left in `state`; the stacks are the ones it left with. `wakeup`:
    /// the id of the [`SampleKind::Wakeup`] that ended the wait (0: none
    /// recorded).
    OffCpu { ns: u64, state: OffCpuState, wakeup: u64 },
    /// What woke a thread followed off CPU: the waker's stacks, and the id
    /// its [`SampleKind::OffCpu`] repeats.
    Wakeup { id: u64, from: WakeupContext },
}

/// Where a wakeup came from (`enum wakeup_context`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WakeupContext {
    /// A thread: the record's pid, tid, comm and stacks are its own.
    Task,
    /// An interrupt (a timer, a device): the record holds its kernel frames
    /// up to the interrupt's entry, in the woken thread's process, tid 0.
    Interrupt,
}

impl WakeupContext {
    fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(WakeupContext::Task),
            1 => Some(WakeupContext::Interrupt),
            _ => None,
        }
    }
}

/// How a thread left the CPU (`enum off_cpu_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OffCpuState {
    /// Waiting, interruptibly: locks, sockets, pipes, timers.
    Sleeping,
    /// Waiting uninterruptibly: disk I/O, some kernel locks.
    Uninterruptible,
    /// Preempted: runnable, waiting for a CPU.
    Runnable,
}

impl OffCpuState {
    pub const ALL: [OffCpuState; 3] = [OffCpuState::Sleeping, OffCpuState::Uninterruptible, OffCpuState::Runnable];

    fn from_raw(v: u32) -> Option<Self> {
        OffCpuState::ALL.get(v as usize).copied()
    }

    /// The `state` label and attribute value.
    pub fn name(self) -> &'static str {
        match self {
            OffCpuState::Sleeping => "sleeping",
            OffCpuState::Uninterruptible => "uninterruptible",
            OffCpuState::Runnable => "runnable",
        }
    }
}

/// Fixed head of every sample record (`struct sample` up to `ips`).
///
/// It is followed by `kstack_len` kernel frames then `ustack_len` user frames,
/// each a native-endian `u64` instruction pointer, leaf first, then
/// `interp_len` interpreter frames of two words each, leaf first
/// ([`crate::python`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    pub kind: SampleKind,
    /// How the user stack ended (`user_end`).
    pub user_end: UnwindEnd,
    /// Interpreter frames after the user frames (`py_len`).
    pub interp_len: u16,
    /// How their walk ended (`py_end`, [`crate::python::WalkEnd`]).
    pub interp_end: crate::python::WalkEnd,
}

/// How a user stack ended (`enum unwind_end`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnwindEnd {
    /// The kernel's frame-pointer walk made the stack; it does not say.
    Unknown,
    /// The walk reached the outermost frame.
    Outermost,
    /// Code without unwind info, or whose table is not loaded (yet).
    NoTable,
    /// An unwind rule outside the supported subset.
    Unsupported,
    /// `max_stack_depth` frames.
    DepthLimit,
    /// Reading the user stack failed.
    ReadError,
}

impl UnwindEnd {
    /// Every value, in `enum unwind_end` order.
    pub const ALL: [UnwindEnd; 6] = [
        UnwindEnd::Unknown,
        UnwindEnd::Outermost,
        UnwindEnd::NoTable,
        UnwindEnd::Unsupported,
        UnwindEnd::DepthLimit,
        UnwindEnd::ReadError,
    ];

    fn from_raw(v: u16) -> Option<Self> {
        Self::ALL.get(usize::from(v)).copied()
    }

    /// The name used in metrics and the `profcol.unwind.end` attribute.
    pub fn name(self) -> &'static str {
        match self {
            UnwindEnd::Unknown => "unknown",
            UnwindEnd::Outermost => "outermost",
            UnwindEnd::NoTable => "no_table",
            UnwindEnd::Unsupported => "unsupported_rule",
            UnwindEnd::DepthLimit => "depth_limit",
            UnwindEnd::ReadError => "read_error",
        }
    }
}

/// Size of the sample head in bytes (`offsetof(struct sample, ips)`).
pub const SAMPLE_HEADER_SIZE: usize = 72;

const KIND_CPU: u16 = 0;
const KIND_PROBE: u16 = 1;
const KIND_CPU_COUNTED: u16 = 2;
const KIND_OFF_CPU: u16 = 3;
const KIND_WAKEUP: u16 = 4;

fn u64_at(b: &[u8], o: usize) -> u64 {
    b.get(o..o + 8).and_then(|s| s.try_into().ok()).map_or(0, u64::from_ne_bytes)
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    b.get(o..o + 4).and_then(|s| s.try_into().ok()).map_or(0, u32::from_ne_bytes)
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    b.get(o..o + 2).and_then(|s| s.try_into().ok()).map_or(0, u16::from_ne_bytes)
}

fn comm_at(b: &[u8], o: usize) -> [u8; TASK_COMM_LEN] {
    let mut comm = [0u8; TASK_COMM_LEN];
    if let Some(s) = b.get(o..o + TASK_COMM_LEN) {
        comm.copy_from_slice(s);
    }
    comm
}

/// `comm` up to the first NUL (lossy UTF-8).
pub fn comm_str(c: &[u8; TASK_COMM_LEN]) -> std::borrow::Cow<'_, str> {
    let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
    String::from_utf8_lossy(&c[..end])
}

/// One decoded sample record, borrowing its frames from the ring buffer bytes.
#[derive(Clone, Copy, Debug)]
pub struct Sample<'a> {
    /// The fixed head.
    pub header: SampleHeader,
    frames: &'a [u8],
}

impl<'a> Sample<'a> {
    /// Decodes a record; `None` if it is shorter than its header says or
    /// of an unknown kind.
    pub fn parse(bytes: &'a [u8]) -> Option<Self> {
        let head = bytes.get(..SAMPLE_HEADER_SIZE)?;
        let kind = match u16_at(head, 40) {
            KIND_CPU => SampleKind::Cpu,
            KIND_PROBE => SampleKind::Probe(u32_at(head, 44)),
            KIND_CPU_COUNTED => SampleKind::CpuCounted { key: u64_at(head, 48), slot: u32_at(head, 44) },
            KIND_OFF_CPU => SampleKind::OffCpu {
                ns: u64_at(head, 48),
                state: OffCpuState::from_raw(u32_at(head, 44))?,
                wakeup: u64_at(head, 64),
            },
            KIND_WAKEUP => {
                SampleKind::Wakeup { id: u64_at(head, 64), from: WakeupContext::from_raw(u32_at(head, 44))? }
            }
            _ => return None,
        };
        let header = SampleHeader {
            ktime_ns: u64_at(head, 0),
            pid: u32_at(head, 8),
            tid: u32_at(head, 12),
            cpu: u32_at(head, 16),
            kstack_len: u16_at(head, 20),
            ustack_len: u16_at(head, 22),
            comm: comm_at(head, 24),
            kind,
            user_end: UnwindEnd::from_raw(u16_at(head, 42))?,
            interp_len: u16_at(head, 56),
            interp_end: crate::python::WalkEnd::from_raw(u16_at(head, 58))?,
        };
        if header.kstack_len as usize > MAX_STACK_DEPTH
            || header.ustack_len as usize > MAX_STACK_DEPTH
            || header.interp_len as usize > MAX_INTERP_FRAMES
        {
            return None;
        }
        let n = header.kstack_len as usize + header.ustack_len as usize + 2 * header.interp_len as usize;
        let frames = bytes.get(SAMPLE_HEADER_SIZE..SAMPLE_HEADER_SIZE + n * 8)?;
        Some(Sample { header, frames })
    }

    /// Kernel frames, leaf first.
    pub fn kernel_stack(&self) -> impl ExactSizeIterator<Item = u64> + 'a {
        let k = self.header.kstack_len as usize * 8;
        self.frames[..k].chunks_exact(8).map(|c| u64_at(c, 0))
    }

    /// User frames, leaf first.
    pub fn user_stack(&self) -> impl ExactSizeIterator<Item = u64> + 'a {
        let k = self.header.kstack_len as usize * 8;
        let u = self.header.ustack_len as usize * 8;
        self.frames[k..k + u].chunks_exact(8).map(|c| u64_at(c, 0))
    }

    /// Interpreter frames, leaf first: (frame word, instruction word).
    pub fn interp_stack(&self) -> impl ExactSizeIterator<Item = (u64, u64)> + 'a {
        let n = (self.header.kstack_len as usize + self.header.ustack_len as usize) * 8;
        self.frames[n..].chunks_exact(16).map(|c| (u64_at(c, 0), u64_at(c, 8)))
    }

    /// Thread name up to the first NUL (lossy UTF-8).
    pub fn comm(&self) -> std::borrow::Cow<'_, str> {
        comm_str(&self.header.comm)
    }
}

/// What a process event reports (`enum proc_event_kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcEventKind {
    /// The process now runs a new image (`sched_process_exec`).
    Exec,
    /// The thread-group leader exited (`sched_process_exit`).
    Exit,
}

/// One process event (`struct proc_event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcEvent {
    pub ktime_ns: u64,
    pub pid: u32,
    pub kind: ProcEventKind,
    pub comm: [u8; TASK_COMM_LEN],
    /// The task's cgroup v2 id (`bpf_get_current_cgroup_id`): processes of
    /// one container share it, so its container id is read once.
    pub cgroup_id: u64,
}

/// Size of `struct proc_event`.
pub const PROC_EVENT_SIZE: usize = 40;

impl ProcEvent {
    /// Decodes a record; `None` when short or of an unknown kind.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let b = bytes.get(..PROC_EVENT_SIZE)?;
        let kind = match u32_at(b, 12) {
            1 => ProcEventKind::Exec,
            2 => ProcEventKind::Exit,
            _ => return None,
        };
        Some(ProcEvent {
            ktime_ns: u64_at(b, 0),
            pid: u32_at(b, 8),
            kind,
            comm: comm_at(b, 16),
            cgroup_id: u64_at(b, 32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u16, probe: u32, k: &[u64], u: &[u64]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&123u64.to_ne_bytes());
        v.extend_from_slice(&7u32.to_ne_bytes());
        v.extend_from_slice(&8u32.to_ne_bytes());
        v.extend_from_slice(&1u32.to_ne_bytes());
        v.extend_from_slice(&(k.len() as u16).to_ne_bytes());
        v.extend_from_slice(&(u.len() as u16).to_ne_bytes());
        v.extend_from_slice(b"worker\0\0\0\0\0\0\0\0\0\0");
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend_from_slice(&2u16.to_ne_bytes()); // user_end: no table
        v.extend_from_slice(&probe.to_ne_bytes()); // or a counted stack's slot
        v.extend_from_slice(&0xfeed_beefu64.to_ne_bytes()); // count key
        v.extend_from_slice(&0u16.to_ne_bytes()); // interpreter frames
        v.extend_from_slice(&0u16.to_ne_bytes()); // their end
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(&0x77u64.to_ne_bytes()); // link
        assert_eq!(v.len(), SAMPLE_HEADER_SIZE);
        for f in k.iter().chain(u) {
            v.extend_from_slice(&f.to_ne_bytes());
        }
        v
    }

    #[test]
    fn parses_cpu_and_probe_records() {
        let r = record(KIND_CPU, 9, &[0xffff_ffff_8100_0000, 2], &[0x401000]);
        let s = Sample::parse(&r).expect("parse");
        assert_eq!((s.header.pid, s.header.tid, s.header.cpu), (7, 8, 1));
        assert_eq!(s.header.kind, SampleKind::Cpu);
        assert_eq!(s.header.user_end, UnwindEnd::NoTable);
        assert_eq!(s.comm(), "worker");
        assert_eq!(s.kernel_stack().collect::<Vec<_>>(), vec![0xffff_ffff_8100_0000, 2]);
        assert_eq!(s.user_stack().collect::<Vec<_>>(), vec![0x401000]);
        let r = record(KIND_PROBE, 3, &[], &[0x401000, 0x402000]);
        let s = Sample::parse(&r).expect("parse");
        assert_eq!(s.header.kind, SampleKind::Probe(3));
        assert_eq!(s.user_stack().len(), 2);
        let r = record(KIND_CPU_COUNTED, 42, &[], &[0x401000]);
        let s = Sample::parse(&r).expect("parse");
        assert_eq!(s.header.kind, SampleKind::CpuCounted { key: 0xfeed_beef, slot: 42 });
        assert_eq!(s.interp_stack().len(), 0);
    }

    #[test]
    fn parses_off_cpu_records_and_refuses_unknown_states() {
        let r = record(KIND_OFF_CPU, 1, &[0xffff_ffff_8100_0000], &[0x401000]);
        let s = Sample::parse(&r).expect("parse");
        assert_eq!(
            s.header.kind,
            SampleKind::OffCpu { ns: 0xfeed_beef, state: OffCpuState::Uninterruptible, wakeup: 0x77 }
        );
        assert_eq!(s.user_stack().collect::<Vec<_>>(), vec![0x401000]);
        assert!(Sample::parse(&record(KIND_OFF_CPU, 3, &[], &[])).is_none(), "state 3 is no state");
        let r = record(KIND_WAKEUP, 1, &[0xffff_ffff_8100_0000], &[]);
        let s = Sample::parse(&r).expect("parse");
        assert_eq!(s.header.kind, SampleKind::Wakeup { id: 0x77, from: WakeupContext::Interrupt });
        assert!(Sample::parse(&record(KIND_WAKEUP, 2, &[], &[])).is_none(), "context 2 is no context");
    }

    #[test]
    fn parses_interpreter_frames_after_the_user_stack() {
        let mut r = record(KIND_CPU, 0, &[9], &[0x401000, 0x402000]);
        r[56..58].copy_from_slice(&2u16.to_ne_bytes());
        r[58..60].copy_from_slice(&1u16.to_ne_bytes()); // complete
        for w in [0x11u64, 0x22, 0x33, 0x44] {
            r.extend_from_slice(&w.to_ne_bytes());
        }
        let s = Sample::parse(&r).expect("parse");
        assert_eq!(s.user_stack().collect::<Vec<_>>(), vec![0x401000, 0x402000]);
        assert_eq!(s.interp_stack().collect::<Vec<_>>(), vec![(0x11, 0x22), (0x33, 0x44)]);
        assert_eq!(s.header.interp_end, crate::python::WalkEnd::Complete);
        assert!(Sample::parse(&r[..r.len() - 8]).is_none(), "half an interpreter frame");
        r[58..60].copy_from_slice(&77u16.to_ne_bytes());
        assert!(Sample::parse(&r).is_none(), "unknown walk end");
    }

    #[test]
    fn rejects_truncated_oversized_and_unknown() {
        let r = record(KIND_CPU, 0, &[1, 2], &[3]);
        assert!(Sample::parse(&r[..r.len() - 1]).is_none());
        assert!(Sample::parse(&r[..10]).is_none());
        let mut bad = record(KIND_CPU, 0, &[], &[]);
        bad[20..22].copy_from_slice(&200u16.to_ne_bytes());
        assert!(Sample::parse(&bad).is_none());
        assert!(Sample::parse(&record(7, 0, &[], &[])).is_none());
        let mut bad = record(KIND_CPU, 0, &[], &[]);
        bad[42..44].copy_from_slice(&6u16.to_ne_bytes());
        assert!(Sample::parse(&bad).is_none(), "unknown user_end");
    }

    #[test]
    fn parses_proc_events() {
        let mut v = Vec::new();
        v.extend_from_slice(&5u64.to_ne_bytes());
        v.extend_from_slice(&42u32.to_ne_bytes());
        v.extend_from_slice(&2u32.to_ne_bytes());
        v.extend_from_slice(b"sh\0\0\0\0\0\0\0\0\0\0\0\0\0\0");
        v.extend_from_slice(&77u64.to_ne_bytes());
        let e = ProcEvent::parse(&v).expect("parse");
        assert_eq!((e.pid, e.kind, e.ktime_ns, e.cgroup_id), (42, ProcEventKind::Exit, 5, 77));
        assert_eq!(comm_str(&e.comm), "sh");
        assert!(ProcEvent::parse(&v[..39]).is_none());
        v[12] = 9;
        assert!(ProcEvent::parse(&v).is_none());
    }
}
