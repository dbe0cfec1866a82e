//! The unwinder's maps and program (`ebpf/bpf/unwind.h`), as the receiver
//! fills them: names, capacities and the byte layouts of keys and values.

/// The tail-called `perf_event` program that walks user stacks with tables.
pub const PROGRAM: &str = "profcol_unwind";
/// `BPF_MAP_TYPE_PROG_ARRAY` with [`PROGRAM`] at index 0.
pub const PROGS_MAP: &str = "unwind_progs";
/// `BPF_MAP_TYPE_ARRAY_OF_MAPS` of row chunks: each a `BPF_MAP_TYPE_ARRAY`
/// of [`CHUNK_ELEMS`] `u64`s (`BPF_F_MMAPABLE`), two rows per element
/// (`u32` each, low half first). Global element `e` is element
/// `e % CHUNK_ELEMS` of chunk `e / CHUNK_ELEMS`; a page's rows never
/// straddle two chunks.
pub const ROWS_MAP: &str = "unwind_rows";
/// Elements per row chunk (`UNWIND_CHUNK_ELEMS`): 256 KiB, the rows of one
/// full 64 KiB page of code (65536 rows).
pub const CHUNK_ELEMS: u32 = 1 << 15;
/// `BPF_MAP_TYPE_HASH`: [`page_key`] → [`page_value`].
pub const PAGES_MAP: &str = "unwind_pages";
/// `BPF_MAP_TYPE_ARRAY` of `struct unwind_rule` (8 bytes).
pub const RULES_MAP: &str = "unwind_rules";
/// `BPF_MAP_TYPE_HASH`: pid → the mappings the BPF program found (its own;
/// only the object test names it from here).
#[cfg(test)]
pub(crate) const PROCS_MAP: &str = "unwind_procs";
/// `BPF_MAP_TYPE_HASH`: [`file_key`] → [`file_value`], written by the
/// receiver once a file's table is loaded (or known not to exist).
pub const FILES_MAP: &str = "unwind_files";
/// `BPF_MAP_TYPE_HASH`: [`file_key`] → [`Want`], files the BPF program
/// met without an entry in [`FILES_MAP`].
pub const WANTED_MAP: &str = "unwind_wanted";
/// The tail-called program that looks up a pc's mapping (`bpf_find_vma`),
/// at index [`FILL_INDEX`] of [`PROGS_MAP`].
pub const FILL_PROGRAM: &str = "profcol_unwind_fill";
pub const FILL_INDEX: u32 = 1;

/// Entries of [`RULES_MAP`] (distinct rules over every loaded table).
pub const RULES_CAPACITY: u32 = 16384;
/// Entries of [`FILES_MAP`] (`max_entries` in C).
pub const FILES_CAPACITY: usize = 8192;
/// Executable segments one [`FILES_MAP`] entry holds (`UNWIND_FILE_SEGS`).
pub(crate) const FILE_SEGS: usize = 2;
/// Bytes of `struct unwind_file_key` and `struct unwind_file`.
pub const FILE_KEY_BYTES: usize = 16;
pub const FILE_VALUE_BYTES: usize = 8 + FILE_SEGS * 24;
/// Bytes of `struct unwind_want`.
pub const WANT_BYTES: usize = 40;
/// The table id of "no table" (`UNWIND_NO_TABLE_ID`): frame pointers.
pub const NO_TABLE: u32 = 0;
/// The table id of "being built" (`UNWIND_PENDING_ID`): frame pointers for
/// now, nothing cached, the file not asked for again.
pub const PENDING: u32 = u32::MAX;

/// A file as the kernel names it: `inode->i_sb->s_dev` (`MKDEV`: major
/// << 20 | minor) and `inode->i_ino`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelFile {
    pub dev: u32,
    pub ino: u64,
}

impl KernelFile {
    /// From a device's major and minor numbers.
    pub fn new(major: u32, minor: u32, ino: u64) -> Self {
        KernelFile { dev: (major << 20) | (minor & 0xf_ffff), ino }
    }
    pub fn major(&self) -> u32 {
        self.dev >> 20
    }
    pub fn minor(&self) -> u32 {
        self.dev & 0xf_ffff
    }
}

/// `struct unwind_file_key`.
pub fn file_key(f: KernelFile) -> [u8; FILE_KEY_BYTES] {
    let mut k = [0u8; FILE_KEY_BYTES];
    k[..4].copy_from_slice(&f.dev.to_ne_bytes());
    k[8..].copy_from_slice(&f.ino.to_ne_bytes());
    k
}

/// The file of a [`file_key`].
pub fn parse_file_key(k: &[u8; FILE_KEY_BYTES]) -> KernelFile {
    let word = |r: std::ops::Range<usize>| k[r].iter().rev().fold(0u64, |a, &b| (a << 8) | u64::from(b));
    KernelFile { dev: word(0..4) as u32, ino: word(8..16) }
}

/// An executable segment: file offsets `[off_lo, off_hi)`, table address =
/// file offset + `delta` (wrapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileSegment {
    pub off_lo: u64,
    pub off_hi: u64,
    pub delta: u64,
}

/// `struct unwind_file`: `table` ([`NO_TABLE`] for none) and the first
/// [`FILE_SEGS`] segments.
pub fn file_value(table: u32, segs: &[FileSegment]) -> [u8; FILE_VALUE_BYTES] {
    let mut v = [0u8; FILE_VALUE_BYTES];
    let n = segs.len().min(FILE_SEGS);
    v[..4].copy_from_slice(&table.to_ne_bytes());
    v[4..8].copy_from_slice(&(n as u32).to_ne_bytes());
    for (s, out) in segs[..n].iter().zip(v[8..].chunks_exact_mut(24)) {
        out[..8].copy_from_slice(&s.off_lo.to_ne_bytes());
        out[8..16].copy_from_slice(&s.off_hi.to_ne_bytes());
        out[16..].copy_from_slice(&s.delta.to_ne_bytes());
    }
    v
}

/// `struct unwind_want`: where the BPF program met a file without a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Want {
    pub pid: u32,
    /// Samples that met it.
    pub count: u32,
    /// The mapping: `[start, end)`, file offset `pgoff * 4096`.
    pub start: u64,
    pub end: u64,
    pub pgoff: u64,
    /// `CLOCK_MONOTONIC` ns of the first.
    pub first_ns: u64,
}

impl Want {
    pub fn parse(v: &[u8; WANT_BYTES]) -> Self {
        let u64_at = |o: usize| u64::from_ne_bytes(v[o..o + 8].try_into().unwrap_or_default());
        let u32_at = |o: usize| u32::from_ne_bytes(v[o..o + 4].try_into().unwrap_or_default());
        Want {
            pid: u32_at(0),
            count: u32_at(4),
            start: u64_at(8),
            end: u64_at(16),
            pgoff: u64_at(24),
            first_ns: u64_at(32),
        }
    }
}

/// `cfg_unwind_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Mode {
    FramePointers = 0,
    Auto = 1,
    Tables = 2,
}

/// `struct unwind_page_key`.
pub fn page_key(table: u32, page: u32) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&table.to_ne_bytes());
    k[4..].copy_from_slice(&page.to_ne_bytes());
    k
}

/// `struct unwind_page`.
pub fn page_value(first: u32, count: u32) -> [u8; 8] {
    page_key(first, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chunk_size_is_the_bpf_programs() {
        let header = include_str!("../bpf/unwind.h");
        let shift: u32 = header
            .lines()
            .find_map(|l| l.strip_prefix("#define UNWIND_CHUNK_SHIFT "))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .expect("unwind.h defines UNWIND_CHUNK_SHIFT");
        assert_eq!(CHUNK_ELEMS, 1 << shift);
        // A full page of code (65536 rows, two per element) fits one chunk.
        const { assert!(CHUNK_ELEMS * 2 >= 1 << 16) };
    }

    #[test]
    fn file_layouts() {
        let f = KernelFile::new(259, 3, 0x1122_3344_5566_7788);
        assert_eq!((f.major(), f.minor()), (259, 3));
        let k = file_key(f);
        assert_eq!(&k[..4], &((259u32 << 20) | 3).to_ne_bytes());
        assert_eq!(&k[4..8], &[0; 4], "padding");
        assert_eq!(parse_file_key(&k), f);
        let seg = |i: u64| FileSegment { off_lo: i, off_hi: i + 0x1000, delta: i.wrapping_neg() };
        let v = file_value(7, &[seg(1), seg(2), seg(3)]);
        assert_eq!(&v[..8], &[7, 0, 0, 0, 2, 0, 0, 0], "table, two segments kept");
        assert_eq!(u64::from_ne_bytes(v[32..40].try_into().unwrap()), 2, "second off_lo");
        assert_eq!(u64::from_ne_bytes(v[48..56].try_into().unwrap()), 2u64.wrapping_neg(), "second delta");
        let mut w = [0u8; WANT_BYTES];
        w[..4].copy_from_slice(&42u32.to_ne_bytes());
        w[4..8].copy_from_slice(&2u32.to_ne_bytes());
        w[8..16].copy_from_slice(&0x7f00_0000_0000u64.to_ne_bytes());
        w[24..32].copy_from_slice(&3u64.to_ne_bytes());
        let want = Want::parse(&w);
        assert_eq!((want.pid, want.count, want.start, want.pgoff), (42, 2, 0x7f00_0000_0000, 3));
    }
}
