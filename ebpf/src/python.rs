//! The CPython frame walker (`ebpf/bpf/python.h`), as the receiver fills
//! and reads it: its program, maps, the per-process entry of offsets, and
//! the frame words it appends to a sample record.

/// The tail-called `perf_event` program that walks Python frames, at index
/// [`PROGRAM_INDEX`] of [`crate::unwind::PROGS_MAP`].
pub const PROGRAM: &str = "profcol_python";
pub const PROGRAM_INDEX: u32 = 2;
/// `BPF_MAP_TYPE_HASH`: pid → [`ProcEntry`] bytes.
pub const PROCS_MAP: &str = "py_procs";
/// Entries of [`PROCS_MAP`] (`max_entries` in C).
pub const PROCS_CAPACITY: usize = 4096;
/// `BPF_MAP_TYPE_LRU_HASH`: tid → its thread state's address (a cache).
pub const THREADS_MAP: &str = "py_threads";
/// Entries of [`THREADS_MAP`] when Python frames are walked: threads
/// sampled recently. An LRU map is allocated whole (~80 bytes an entry,
/// charged to the agent's memory cgroup); an evicted thread costs one
/// lookup of its thread state again.
pub const THREADS_CAPACITY: u32 = 4096;
/// `BPF_MAP_TYPE_HASH`: [`crate::unwind::file_key`] → `u8`: interpreter
/// files, so a new process mapping one wakes the reader.
pub const FILES_MAP: &str = "py_files";
/// Entries of [`FILES_MAP`].
pub const FILES_CAPACITY: usize = 256;
/// `u32` global: `task_struct.thread.fsbase`'s byte offset (0: no walk).
pub const FSBASE_OFFSET_GLOBAL: &str = "cfg_off_task_fsbase";
/// Bytes of a frame the walker reads at once (`PY_FRAME_READ`): every
/// frame member offset must be at most this minus 8.
pub const FRAME_READ: u16 = 128;
/// An absent member (`PY_NO_OFFSET`).
pub const NO_OFFSET: u16 = 0xffff;

/// Frame word flag: the outermost Python frame of one eval call.
pub const FRAME_ENTRY: u64 = 1 << 63;
/// Frame word: the interpreter kind in bits 56..63.
const KIND_SHIFT: u32 = 56;
/// [`FrameWord::kind`] of a CPython frame.
pub const KIND_CPYTHON: u8 = 1;

/// One interpreter frame's first word, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameWord {
    /// The code object's address.
    pub code: u64,
    /// Which interpreter wrote it ([`KIND_CPYTHON`]).
    pub kind: u8,
    /// The outermost frame of its eval call.
    pub entry: bool,
}

impl FrameWord {
    pub fn decode(w: u64) -> Self {
        FrameWord {
            code: w & ((1 << KIND_SHIFT) - 1),
            kind: ((w >> KIND_SHIFT) & 0x7f) as u8,
            entry: w & FRAME_ENTRY != 0,
        }
    }
}

/// How the Python walk of a sample ended (`enum py_end`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WalkEnd {
    /// Not a Python process, or not walked.
    None,
    /// The thread's outermost frame reached.
    Complete,
    /// `PY_MAX_FRAMES` frames.
    DepthLimit,
    /// Reading the process's memory failed.
    ReadError,
    /// No thread state is the sampled thread's.
    NoThreadState,
    /// The thread runs no Python code now.
    NoFrame,
}

impl WalkEnd {
    pub const ALL: [WalkEnd; 6] = [
        WalkEnd::None,
        WalkEnd::Complete,
        WalkEnd::DepthLimit,
        WalkEnd::ReadError,
        WalkEnd::NoThreadState,
        WalkEnd::NoFrame,
    ];

    pub(crate) fn from_raw(v: u16) -> Option<Self> {
        Self::ALL.get(usize::from(v)).copied()
    }

    /// The `reason` label of a walk cut short; `None` for one that was not.
    pub fn cut_reason(self) -> Option<&'static str> {
        match self {
            WalkEnd::None | WalkEnd::Complete | WalkEnd::NoFrame => None,
            WalkEnd::DepthLimit => Some("depth_limit"),
            WalkEnd::ReadError => Some("read_error"),
            WalkEnd::NoThreadState => Some("no_thread_state"),
        }
    }
}

/// `struct py_proc`: what the walker needs of one Python process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ProcEntry {
    /// Process address of `_PyRuntime`.
    pub runtime: u64,
    /// `major << 8 | minor`.
    pub version: u16,
    pub runtime_interpreters_head: u16,
    pub interp_next: u16,
    pub interp_threads_head: u16,
    pub tstate_next: u16,
    pub tstate_thread_id: u16,
    pub tstate_frame: u16,
    /// [`NO_OFFSET`]: `tstate_frame` is the frame itself.
    pub cframe_current_frame: u16,
    pub frame_previous: u16,
    pub frame_code: u16,
    pub frame_instr: u16,
    /// [`NO_OFFSET`] before 3.11.
    pub frame_owner: u16,
    /// [`NO_OFFSET`] but in 3.11.
    pub frame_is_entry: u16,
    /// 3.12+: the `owner` value of C-stack shim frames (skipped);
    /// [`NO_OFFSET`] before.
    pub cstack_owner: u16,
    /// `bpf_ktime_get_ns() >> 20` when found (see [`born_now`]).
    pub born: u32,
}

/// [`ProcEntry::born`] for an entry written now.
pub fn born_now() -> u32 {
    (crate::clock::now_ns(libc::CLOCK_MONOTONIC) >> 20) as u32
}

/// Bytes of `struct py_proc`.
pub const PROC_ENTRY_BYTES: usize = 40;

impl ProcEntry {
    /// Whether the walker can read every frame member in one read of
    /// [`FRAME_READ`] bytes.
    pub fn frame_members_fit(&self) -> bool {
        let fits = |o: u16| o == NO_OFFSET || o <= FRAME_READ - 8;
        [self.frame_previous, self.frame_code, self.frame_instr].iter().all(|&o| o <= FRAME_READ - 8)
            && fits(self.frame_owner)
            && fits(self.frame_is_entry)
    }

    pub fn to_bytes(&self) -> [u8; PROC_ENTRY_BYTES] {
        let mut b = [0u8; PROC_ENTRY_BYTES];
        b[..8].copy_from_slice(&self.runtime.to_ne_bytes());
        let halves = [
            self.version,
            self.runtime_interpreters_head,
            self.interp_next,
            self.interp_threads_head,
            self.tstate_next,
            self.tstate_thread_id,
            self.tstate_frame,
            self.cframe_current_frame,
            self.frame_previous,
            self.frame_code,
            self.frame_instr,
            self.frame_owner,
            self.frame_is_entry,
            self.cstack_owner,
        ];
        for (i, h) in halves.iter().enumerate() {
            b[8 + 2 * i..10 + 2 * i].copy_from_slice(&h.to_ne_bytes());
        }
        b[36..40].copy_from_slice(&self.born.to_ne_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_words_and_entries() {
        let w = 0x7f00_1234_5678 | (u64::from(KIND_CPYTHON) << 56) | FRAME_ENTRY;
        assert_eq!(FrameWord::decode(w), FrameWord { code: 0x7f00_1234_5678, kind: KIND_CPYTHON, entry: true });
        let e = ProcEntry { runtime: 1, version: 0x030c, frame_is_entry: 7, ..Default::default() };
        let b = e.to_bytes();
        assert_eq!(u16::from_ne_bytes([b[8], b[9]]), 0x030c);
        assert_eq!(u16::from_ne_bytes([b[32], b[33]]), 7, "frame_is_entry is the 13th half-word");
        let b = ProcEntry { born: 0xdead_beef, ..e }.to_bytes();
        assert_eq!(u32::from_ne_bytes([b[36], b[37], b[38], b[39]]), 0xdead_beef);
        assert!(!ProcEntry { frame_instr: 121, ..Default::default() }.frame_members_fit());
        assert!(ProcEntry { frame_instr: 120, frame_owner: NO_OFFSET, ..Default::default() }.frame_members_fit());
    }
}
