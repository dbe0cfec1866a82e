//! The unwinder's maps and program (`ebpf/bpf/unwind.h`), as the receiver
//! fills them: names, capacities and the byte layouts of keys and values.

/// The tail-called `perf_event` program that walks user stacks with tables.
pub const PROGRAM: &str = "profcol_unwind";
/// `BPF_MAP_TYPE_PROG_ARRAY` with [`PROGRAM`] at index 0.
pub const PROGS_MAP: &str = "unwind_progs";
/// `BPF_MAP_TYPE_ARRAY` of `u64`: two rows (`u32` each, low half first).
pub const ROWS_MAP: &str = "unwind_rows";
/// `BPF_MAP_TYPE_HASH`: [`page_key`] → [`page_value`].
pub const PAGES_MAP: &str = "unwind_pages";
/// `BPF_MAP_TYPE_ARRAY` of `struct unwind_rule` (8 bytes).
pub const RULES_MAP: &str = "unwind_rules";
/// `BPF_MAP_TYPE_HASH`: pid → [`proc_value`] (one entry per loaded process).
pub const PROCS_MAP: &str = "unwind_procs";

/// Entries of [`RULES_MAP`] (distinct rules over every loaded table).
pub const RULES_CAPACITY: u32 = 16384;
/// Ranges with a table one process may have in [`PROCS_MAP`]
/// (`UNWIND_PROC_RANGES`); code in the ones past it is walked by frame
/// pointers.
pub const PROC_RANGES: usize = 64;
/// Bytes of `struct unwind_proc`.
pub const PROC_VALUE_BYTES: usize = 8 + PROC_RANGES * 32;

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

/// A mapping of a process with an unwind table (`struct unwind_range`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MappedRange {
    pub start: u64,
    /// Exclusive.
    pub end: u64,
    /// Process address minus file virtual address.
    pub bias: u64,
    pub table: u32,
}

/// The start of an unused slot of `struct unwind_proc`
/// (`UNWIND_RANGE_UNUSED`): above every user address, so the BPF
/// program's search over all slots never stops in one.
pub const RANGE_UNUSED: u64 = i64::MAX as u64;

/// `struct unwind_proc` holding `ranges` (sorted by start, not
/// overlapping), the slots after them unused: at most [`PROC_RANGES`] are
/// written; the result says how many.
pub fn proc_value(ranges: &[MappedRange], out: &mut [u8; PROC_VALUE_BYTES]) -> usize {
    let n = ranges.len().min(PROC_RANGES);
    let unused = MappedRange { start: RANGE_UNUSED, end: 0, bias: 0, table: 0 };
    out[..8].fill(0);
    out[..4].copy_from_slice(&(n as u32).to_ne_bytes());
    let slots = ranges[..n].iter().chain(std::iter::repeat(&unused));
    for (r, chunk) in slots.zip(out[8..].chunks_exact_mut(32)) {
        chunk[..8].copy_from_slice(&r.start.to_ne_bytes());
        chunk[8..16].copy_from_slice(&r.end.to_ne_bytes());
        chunk[16..24].copy_from_slice(&r.bias.to_ne_bytes());
        chunk[24..28].copy_from_slice(&r.table.to_ne_bytes());
        chunk[28..].fill(0);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_value_layout() {
        let r = |i: u64| MappedRange { start: i << 20, end: (i << 20) + 0x1000, bias: i, table: i as u32 + 1 };
        let ranges: Vec<MappedRange> = (0..PROC_RANGES as u64 + 3).map(r).collect();
        let mut v = [0xffu8; PROC_VALUE_BYTES];
        assert_eq!(proc_value(&ranges[..2], &mut v), 2);
        assert_eq!(&v[..8], &[2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(u64::from_ne_bytes(v[40..48].try_into().unwrap()), 1 << 20, "second start");
        assert_eq!(u64::from_ne_bytes(v[56..64].try_into().unwrap()), 1, "second bias");
        assert_eq!(u32::from_ne_bytes(v[64..68].try_into().unwrap()), 2, "second table");
        for slot in v[72..].chunks_exact(32) {
            assert_eq!(u64::from_ne_bytes(slot[..8].try_into().unwrap()), RANGE_UNUSED, "the rest unused");
            assert!(slot[8..].iter().all(|&b| b == 0));
        }
        assert_eq!(proc_value(&ranges, &mut v), PROC_RANGES, "capped");
        let last = 8 + (PROC_RANGES - 1) * 32;
        assert_eq!(u32::from_ne_bytes(v[last + 24..last + 28].try_into().unwrap()), PROC_RANGES as u32);
    }
}
